/*
 * rowlog.h - the log of changed sparse rows: two append-only files in the
 * shard's directory that take a commit's rows as one sequential write and
 * an fdatasync, so that the write-behind costs the bytes that changed, not
 * the 4 KiB B-tree page each scattered row sits on in LMDB.
 *
 * A commit appends one batch: {u32 magic 'PSRL', u32 crc32 of everything
 * after this field, u64 seq, u32 records, u32 payload bytes} and then the
 * records, each {u32 var_id, u32 len, i64 id, len bytes of the stored row
 * (sparse.h: head and floats)}. Sequence numbers only grow. Later, the
 * rows of a whole file are applied to LMDB behind the pushes (sparse_log.c)
 * and the file emptied: appends go to one file (the active one) while the
 * other (sealed) is applied.
 *
 * A batch whose crc does not match, or is cut short, ends its file: it can
 * only be the last one written before a crash, never acknowledged. A write
 * that fails is cut off again (ftruncate to where it began), so a later
 * batch never follows a torn one.
 *
 * Threads and lifetime: one mutex inside guards which file is active;
 * psd_rowlog_append, _seal and _reset may be called from different threads,
 * but a file is walked only while nothing appends to it (it is sealed, or
 * psd is starting). The records a walk hands out point into a map of the
 * file, valid until its end callback returns.
 */
#ifndef PSD_ROWLOG_H
#define PSD_ROWLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct psd_rowlog psd_rowlog;

#define PSD_ROWLOG_REC_HEAD 16 /* u32 var_id, u32 len, i64 id */

/* Opens (creating them) <dir>/rows.log.0 and rows.log.1. Returns 0,
 * -errno, or -ENOMEM. */
int psd_rowlog_open(const char *dir, psd_rowlog **out);
void psd_rowlog_destroy(psd_rowlog *l);

/* Appends one batch of nrecs records (payload: len bytes laid out as
 * above) to the active file and fdatasyncs it. Returns 0, PS_EFULL (no
 * space left on the disk), or -errno; on failure the file is as before. */
int psd_rowlog_append(psd_rowlog *l, uint64_t seq, const void *payload, size_t len,
                      uint32_t nrecs);

/* Makes the active file the sealed one and the other (empty) active.
 * Returns the sealed file's index, or -1 when the active file is empty or
 * the other is not (its rows not applied yet). */
int psd_rowlog_seal(psd_rowlog *l);

/* Empties file `which` (ftruncate and fsync). 0 or -errno. */
int psd_rowlog_reset(psd_rowlog *l, int which);

/* Bytes in file `which`, and in both. */
uint64_t psd_rowlog_bytes(psd_rowlog *l, int which);
uint64_t psd_rowlog_total(psd_rowlog *l);
/* Which file is active. */
int psd_rowlog_active(psd_rowlog *l);

/* Called for each record of a batch with seq > after, in file order. A
 * non-zero return stops the walk and is returned. */
typedef int (*psd_rowlog_fn)(void *ctx, uint64_t seq, uint32_t var_id, int64_t id,
                             const uint8_t *data, uint32_t len);

/* Called once the walk has handed out every record, while they are still
 * mapped; its return is the walk's. */
typedef int (*psd_rowlog_end_fn)(void *ctx);

/* Walks the whole batches of file `which`, then calls end (when not NULL);
 * *last (when not NULL) gets the highest seq seen (0: none). A torn or
 * corrupt batch ends the walk (logged). Returns 0, fn's or end's code, or
 * -errno. */
int psd_rowlog_walk(psd_rowlog *l, int which, uint64_t after, psd_rowlog_fn fn,
                    psd_rowlog_end_fn end, void *ctx, uint64_t *last);

#endif
