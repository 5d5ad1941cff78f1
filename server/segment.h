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
 * Threads and lifetime: appends and syncs from one thread at a time (the
 * flusher); reads from any thread, concurrently with appends (a read only
 * reaches records a finished sync wrote). psd_segs_close after every other
 * call has returned.
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

/* The newest segment's number, the bytes of all segments, reads done
 * through io_uring with O_DIRECT (false: the pread fallback), and the
 * alignment reads are widened to. */
uint32_t psd_segs_current(const psd_segs *s);
uint64_t psd_segs_bytes(const psd_segs *s);
bool psd_segs_direct(const psd_segs *s);
uint32_t psd_segs_align(const psd_segs *s);

#endif
