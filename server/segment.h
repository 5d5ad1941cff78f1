/*
 * segment.h - append-only segment files of sparse rows, beside data.mdb,
 * read with O_DIRECT through io_uring so that a cold row costs one read and
 * never a page fault on a map.
 *
 * A directory holds seg-<n>.psg files, n from 1 up. Each starts with a
 * 16-byte header {8 bytes "PSDSEG1\0", u32 n, u32 0} and then records:
 *
 *   +-------+-------+--------+-------+---------+---------+--------------+
 *   | magic |  len  | var_id |  crc  |   id    | version | len bytes    |
 *   | u32   |  u32  |  u32   |  u32  |  i64    |  u64    | of the row   |
 *   +-------+-------+--------+-------+---------+---------+--------------+
 *    'PSSR'                  CRC32C (ISA-L's crc32_iscsi) of the header
 *                            with crc = 0, then the row's bytes
 *
 * The writer buffers records in memory (psd_segs_append) and writes them
 * with one sequential write and an fdatasync (psd_segs_sync), which must
 * return before the LMDB transaction holding the records' locations (the
 * catalog) commits: LMDB stays the commit point, and a record the catalog
 * does not point at is dead bytes. A segment past seg_max bytes is sealed
 * and the next record starts a new one. A sync that fails (no space on the
 * disk: PS_EFULL) truncates the segment back to where the batch began, so
 * nothing of it is half-written; the batch's locations must not be used.
 *
 * psd_segs_open checks every record of every segment (magic, length, CRC,
 * a whole record before the end of the file) and refuses a directory with
 * a bad one, naming the file and the offset in *why: psd does not start on
 * it rather than serve garbage.
 *
 * psd_segs_read submits a batch of reads at once through an io_uring of the
 * calling thread, each opened with O_DIRECT and widened to the device's
 * direct-I/O alignment (statx's dio alignment, else 4096), then checks each
 * record's CRC, var_id and id before copying the row out. Where io_uring or
 * O_DIRECT is not available (a seccomp filter, tmpfs) it falls back to
 * pread, and says so once in the log.
 *
 * Compaction (DeepRec's SSDHASH shape): the module keeps, per segment, its
 * record bytes and how many of them are live. A sync counts its records
 * live; the owner says when the catalog stops pointing at one
 * (psd_segs_dead), and may rebuild the counts from a walk of its catalog
 * (psd_segs_recount, psd_segs_live), since after a restart every record
 * is counted live. psd_segs_pick names a sealed segment about a third
 * dead; psd_segs_compact_step copies that segment's live records (the
 * owner's callback decides per record) into the active segment a small
 * batch at a time, bounded in I/O rate by a token bucket, syncs them, and
 * only then hands the owner the relocations to commit in its catalog,
 * with psd_segs_end, in one transaction. The old segment is removed only
 * when the owner calls psd_segs_remove after that commit. A kill at any
 * point leaves every row readable: before the commit the catalog points at
 * the old records, still there, and the copies past the committed end are
 * cut at the next open; after it, at the copies, synced before it.
 *
 * Checkpoint: psd_segs_checkpoint hard-links the sealed segments into a
 * directory (they are never written again) and copies the active one up to
 * the committed end, streamed by the kernel or through one small buffer;
 * psd_segs_restore does the same from a checkpoint into a data directory,
 * which psd_segs_open then opens with that end.
 *
 * Threads and lifetime: appends, syncs, compaction steps, psd_segs_remove
 * and psd_segs_checkpoint from one thread at a time (the flusher); reads
 * from any thread, concurrently with appends (a read only reaches records
 * a finished sync wrote); the counts from any thread. A reader that took a
 * location from the catalog before a relocation committed still reads it
 * for PSD_SEG_GRACE_S seconds after psd_segs_remove (the file is unlinked,
 * its descriptor kept). psd_segs_close after every other call has
 * returned.
 */
#ifndef PSD_SEGMENT_H
#define PSD_SEGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct psd_segs psd_segs;

#define PSD_SEG_REC_HEAD 32
#define PSD_SEG_FILE_HEAD 16
#define PSD_SEG_MAX_DEFAULT ((uint64_t)256 << 20)

/* Where a record is: its segment, its offset in the file, and its length
 * with the record header. */
typedef struct {
    uint32_t seg;
    uint32_t len;
    uint64_t off;
} psd_seg_loc;

/* Opens (creating it) the directory dir of segments, checks every record,
 * and appends after the last one of the newest segment. seg_max: bytes
 * after which a segment is sealed, at the next batch (0:
 * PSD_SEG_MAX_DEFAULT). committed: the end of the last batch the catalog
 * holds (psd_segs_end when its transaction committed), or NULL when every
 * record must be whole. Bytes past it are a batch a kill cut short, never
 * acknowledged: they are cut off, and newer segments removed; a segment
 * shorter than it lost committed rows and is refused. Returns 0,
 * PS_ECORRUPT with *why naming the file and offset, or -errno. */
int psd_segs_open(const char *dir, uint64_t seg_max, const psd_seg_loc *committed,
                  psd_segs **out, char *why, size_t whylen);
/* Where the synced records end (len 0): what the catalog's transaction
 * records as committed. */
psd_seg_loc psd_segs_end(const psd_segs *s);
void psd_segs_close(psd_segs *s);

/* Buffers one record (the row is head then body) and gives its location,
 * valid once psd_segs_sync returns 0. Returns 0 or -ENOMEM (the batch is
 * as it was). */
int psd_segs_append(psd_segs *s, uint32_t var_id, int64_t id, uint64_t version,
                    const void *head, size_t head_len, const void *body, size_t body_len,
                    psd_seg_loc *loc);
/* Writes the buffered records and fdatasyncs them. Returns 0, PS_EFULL (no
 * space, or past the file size limit) or -errno; on failure the segment
 * ends where it did before the batch and the batch is dropped. */
int psd_segs_sync(psd_segs *s);
/* Drops the buffered records without writing them. */
void psd_segs_discard(psd_segs *s);

/* One row to read: its location, the var_id and id it must carry, and room
 * for its row bytes; psd_segs_read sets rc (0 or PS_ECORRUPT) and version
 * and copies len - PSD_SEG_REC_HEAD bytes to dst. */
typedef struct {
    psd_seg_loc loc;
    uint32_t var_id;
    int64_t id;
    void *dst;
    size_t cap;
    uint64_t version;
    int rc;
} psd_seg_read;

/* Reads n rows, all submitted at once (in rounds of the ring's depth).
 * Returns 0 when every read completed (each rq[i].rc says whether its row
 * was sound), PS_ECORRUPT when one was not, or -errno of an I/O failure. */
int psd_segs_read(psd_segs *s, psd_seg_read *rq, size_t n);

/* ---- reads in the background --------------------------------------------- */

/* A batch of reads left in flight (a prefetch): handed to a thread of its
 * own, which submits them on its own ring, up to 128 in flight as the
 * device takes them, and checks each as it completes; collected later by
 * psd_seg_aread_wait. One batch at a time; the ring, the thread and the
 * buffer are kept from batch to batch. Threads: the calls one at a time
 * (the owner's lock), from any thread. */
typedef struct psd_seg_aread psd_seg_aread;

/* Returns 0, -ENOTSUP where io_uring is not available (read nothing ahead)
 * or -ENOMEM. */
int psd_seg_aread_create(psd_seg_aread **out);
/* Waits for a batch still in flight, then frees it all. NULL: nothing. */
void psd_seg_aread_destroy(psd_seg_aread *a);
/* The most reads a batch takes. */
#define PSD_SEG_AREAD_MAX 4096
/* Hands the reads rq[0..n) (n <= PSD_SEG_AREAD_MAX, rq[i].dst NULL) to
 * the thread and returns without waiting for them. rq stays the caller's,
 * untouched until psd_seg_aread_wait returns. Returns 0, -EBUSY (a batch
 * is in flight), -EINVAL (too many, or a dst) or -ENOMEM (nothing in
 * flight then). */
int psd_seg_aread_submit(psd_seg_aread *a, psd_segs *s, psd_seg_read *rq, size_t n);
/* Whether a batch is in flight (submitted and not yet waited for). */
bool psd_seg_aread_busy(const psd_seg_aread *a);
/* Waits for the batch in flight, each read finished as psd_segs_read
 * does, but each row left in the batch's buffer: rq[i].dst points at its
 * bytes when rq[i].rc is 0, valid until the next submit. A read the device
 * refused (or its O_DIRECT alignment) has its error in rq[i].rc. Returns
 * 0, or the error of io_uring_enter that stopped the thread's submissions
 * (reads not submitted keep rc PS_ECORRUPT); nothing is in flight after. */
int psd_seg_aread_wait(psd_seg_aread *a);
/* The bytes of its buffer, as allocated now. */
uint64_t psd_seg_aread_bytes(const psd_seg_aread *a);

/* Called by psd_segs_scan for each record: its table, id, version,
 * location and row bytes (valid during the call). 0 goes on; a negative
 * value stops the scan (returned). */
typedef int (*psd_seg_scan_fn)(void *ctx, uint32_t var_id, int64_t id, uint64_t version,
                               psd_seg_loc loc, const void *row, size_t len);
/* Reads every record from *from (a committed end an owner recorded) to
 * the synced end, in order, segment by segment. Between appends (the
 * appender's thread). Returns 0, PS_ECORRUPT, fn's error or -errno. */
int psd_segs_scan(psd_segs *s, const psd_seg_loc *from, psd_seg_scan_fn fn, void *ctx);

/* The newest segment's number, the bytes of all segments, reads done
 * through io_uring with O_DIRECT (false: the pread fallback), and the
 * alignment reads are widened to. */
uint32_t psd_segs_current(const psd_segs *s);
uint64_t psd_segs_bytes(const psd_segs *s);
bool psd_segs_direct(const psd_segs *s);
uint32_t psd_segs_align(const psd_segs *s);

/* ---- compaction --------------------------------------------------------- */

#define PSD_SEG_DEAD_FRAC 0.33                /* a segment this dead is compacted */
#define PSD_SEG_RATE_DEFAULT ((uint64_t)32 << 20) /* bytes of I/O a second */
#define PSD_SEG_BATCH_DEFAULT ((uint32_t)256 << 10) /* bytes read a step */
#define PSD_SEG_GRACE_S 30

/* The record at loc is no longer one the catalog points at (superseded by
 * a newer version, or deleted), once that is committed. */
void psd_segs_dead(psd_segs *s, psd_seg_loc loc);
/* Forgets every live count, for the owner to give them again with
 * psd_segs_live for each record its catalog points at (a walk at start,
 * before appends: after a restart every record is counted live). */
void psd_segs_recount(psd_segs *s);
void psd_segs_live(psd_segs *s, psd_seg_loc loc);
/* The record bytes of segment seg (headers included, the file header not)
 * and how many are live. Returns 0, or PS_ENOTFOUND for no such segment. */
int psd_segs_usage(const psd_segs *s, uint32_t seg, uint64_t *bytes, uint64_t *live);
/* The sealed segment with the most dead bytes among those at least
 * dead_frac dead (0: PSD_SEG_DEAD_FRAC); an empty sealed one counts as all
 * dead. Returns 0 with *seg, or PS_ENOTFOUND when none is. */
int psd_segs_pick(psd_segs *s, double dead_frac, uint32_t *seg);
/* The same by the owner's live bytes: live[n] for segment n (0 from nlive
 * on) instead of the module's own count, for an owner that counts live
 * bytes by its catalog. */
int psd_segs_pick_by(psd_segs *s, double dead_frac, const uint64_t *live, uint32_t nlive,
                     uint32_t *seg);

/* One relocation: the record of (var_id, id) at version moved from -> to.
 * The owner commits it only where its catalog still points at from, and
 * sets stale where it does not (a newer version landed meanwhile). */
typedef struct {
    uint32_t var_id;
    int64_t id;
    uint64_t version;
    psd_seg_loc from, to;
    bool stale;
} psd_seg_move;

/* The owner's liveness test: 1 if its catalog points at loc for (var_id,
 * id), 0 if not, or a negative error, which stops the step. */
typedef int (*psd_seg_live_fn)(void *arg, uint32_t var_id, int64_t id, uint64_t version,
                               psd_seg_loc loc);
/* Commits n relocations (synced already) in the owner's catalog, with
 * psd_segs_end, in one transaction. Returns 0 or a negative error: the
 * copies are then dead bytes and the step is done again at the next call. */
typedef int (*psd_seg_moved_fn)(void *arg, psd_seg_move *mv, size_t n);

typedef struct {
    uint64_t rate;   /* bytes of I/O a second, read and written (0: default) */
    uint32_t batch;  /* bytes read a step, one record more if it is larger (0: default) */
    psd_seg_live_fn live;
    psd_seg_moved_fn moved;
    void *arg;
} psd_seg_compact_opts;

typedef struct psd_segs_compact psd_segs_compact;

/* Starts compacting sealed segment seg. Returns 0, PS_EINVAL_ARG (seg is
 * the active one, missing or removed, or no callbacks), or -errno with
 * *why naming the file. */
int psd_segs_compact_begin(psd_segs *s, uint32_t seg, const psd_seg_compact_opts *o,
                           psd_segs_compact **out, char *why, size_t whylen);
/* One small batch: reads up to batch bytes of the segment, appends its
 * live records, syncs them and hands them to moved. Does nothing while the
 * token bucket is in debt. Sets *wait_ns to the time the bucket asks
 * before the next step (0: at once). Returns 0 (more to do), 1 (every
 * record went through: the owner commits psd_segs_end and then calls
 * psd_segs_remove), -EBUSY (records of the owner are buffered: call
 * between batches), PS_ECORRUPT with *why naming the file and offset, or
 * an error of the sync or of a callback; after an error the same batch is
 * tried again at the next step. */
int psd_segs_compact_step(psd_segs_compact *c, uint64_t *wait_ns, char *why, size_t whylen);
void psd_segs_compact_end(psd_segs_compact *c);

/* Removes sealed segment seg, which the owner's catalog no longer points
 * at; committed: the end its catalog holds, which must lie in a later
 * segment (so that the next open finds it). Returns 0, PS_EINVAL_ARG
 * (seg is active, or holds the committed end), or -errno. */
int psd_segs_remove(psd_segs *s, uint32_t seg, const psd_seg_loc *committed);

/* Record bytes compaction copied, and segments it removed, since open. */
uint64_t psd_segs_copied(const psd_segs *s);
uint64_t psd_segs_removed(const psd_segs *s);

/* ---- checkpoints -------------------------------------------------------- */

/* Makes directory dst (emptied of segments) hold s's segments up to end,
 * the committed end of the catalog the checkpoint holds: sealed ones
 * hard-linked (copied across file systems), the one holding end copied up
 * to it, all synced. No psd_segs_remove may run meanwhile. Returns 0,
 * PS_EINVAL_ARG (end past what is synced), PS_EFULL, PS_ECORRUPT (a
 * segment shorter than end) or -errno, with *why naming the file. */
int psd_segs_checkpoint(psd_segs *s, const char *dst, const psd_seg_loc *end, char *why,
                        size_t whylen);
/* The same from checkpoint directory src into data directory dst, whose
 * segments it replaces; open dst with psd_segs_open(dst, .., end, ..). */
int psd_segs_restore(const char *src, const char *dst, const psd_seg_loc *end, char *why,
                     size_t whylen);

#endif
