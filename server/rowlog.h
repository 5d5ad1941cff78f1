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
 * A file is written again from its start once its rows are applied (it
 * keeps its blocks: an fdatasync of a write in place needs no journal
 * commit, which on ext4 would wait for LMDB's own writes). A walk ends at
 * the first batch that is not whole (crc, length) or whose seq does not
 * grow: an older batch, the rest of one, or one a crash cut short, none
 * of them acknowledged after what precedes. A write that fails leaves the
 * end where it was, and the next batch is written over it.
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
 * space left on the disk), or -errno; on failure the file ends where it
 * did. */
int psd_rowlog_append(psd_rowlog *l, uint64_t seq, const void *payload, size_t len,
                      uint32_t nrecs);

/* Makes the active file the sealed one and the other (empty) active.
 * Returns the sealed file's index, or -1 when the active file is empty or
 * the other is not (its rows not applied yet). */
int psd_rowlog_seal(psd_rowlog *l);

/* Empties file `which`: the next append to it writes at its start (its
 * batches must be applied, their seqs at most the store's applied mark).
 * Returns 0. */
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

/* Walks the whole batches of file `which` (up to its end, or at open up
 * to the first that is not whole or does not grow), calling fn (unless
 * NULL) for the records of those with seq > after, then calls end (unless
 * NULL); *last (unless NULL) gets the highest seq seen (0: none). Returns
 * 0, fn's or end's code, or -errno. */
int psd_rowlog_walk(psd_rowlog *l, int which, uint64_t after, psd_rowlog_fn fn,
                    psd_rowlog_end_fn end, void *ctx, uint64_t *last);

#endif
