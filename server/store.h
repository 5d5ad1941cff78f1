/*
 * store.h - psd's variable records persisted in one LMDB environment.
 *
 * psd keeps its dense variables in memory for speed and writes them behind
 * to this store in group commits: the caller opens a write transaction,
 * puts every variable that changed since the last commit, and commits. The
 * store knows nothing of protobuf: a variable's spec is an opaque blob (psd
 * packs a ps.v1.VariableSpec into it) stored verbatim and handed back as is.
 *
 * Durability: a successful psd_store_commit has been fsync'ed (LMDB's
 * default durability), so a kill -9 or a power cut loses exactly the work
 * not yet committed. How much that is is the caller's commit interval.
 *
 * Layout on disk: <dir>/data.mdb and <dir>/lock.mdb, with four named
 * sub-databases (LMDB sorts keys bytewise):
 *
 *   "meta"   "format"      -> {u32 magic 'PSDS', u32 format 1, u32 0x01020304}
 *            "next_var_id" -> u32, the next variable id to hand out; ids are
 *                             never reused, not even after a delete or clear
 *            "rowlog_applied", "rowlog_logged" -> u64, marks of the row log
 *   "vars"   name (1..255 bytes, no NUL) -> 48-byte header + spec blob:
 *            {u32 magic 'PSVR', u16 format 1, u16 header size 48, u32 var_id,
 *             u32 nslots, u64 version, u64 step, u64 n, u64 spec_len}
 *   "dense"  var_id (u32 big-endian) + kind (u8: 0 value, 1+k slot k)
 *                             -> n float32, exactly n*4 bytes
 *   "rows"   var_id (u32 big-endian) + row id (u64 big-endian, its sign
 *            bit flipped) -> one row of a sparse table: {u64 updates,
 *            u64 last step} then the row's value and its optimizer slots,
 *            (1 + nslots) * dim float32 (server/sparse.h). Big-endian keys
 *            with the sign bit flipped make a table's rows one contiguous
 *            range, scanned in signed id order (-5 before 3). Written by
 *            store_rows.c; emptied by delete and clear.
 *
 * Integers in values and the floats are in the host's byte order, and only
 * little-endian hosts are supported: store.c refuses to compile elsewhere,
 * and the byte-order mark in "meta"/"format" and the record magics turn an
 * environment carried to a big-endian reader into PS_ECORRUPT, not garbage.
 *
 * Threads and lifetime: a psd_store may be used from any thread (the
 * environment is opened with MDB_NOTLS). psd_store_load, psd_store_get and
 * psd_store_copy each run in their own read transaction and may run
 * concurrently with each other and with one write transaction. Write
 * transactions are serialized: psd_store_begin blocks while another is
 * open. A psd_store_txn is used by one thread at a time and must be ended
 * (commit or abort) by the thread that began it. The records passed to a
 * visitor, and every pointer in them, are valid only during that call: copy
 * what you keep. psd_store_grow waits until no transaction is open: a
 * thread holding one must not wait for the thread that grows. Never open the same directory twice in one process, and
 * never use a store across fork(): open it in the process that uses it.
 */
#ifndef PSD_STORE_H
#define PSD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct psd_store psd_store;
typedef struct psd_store_txn psd_store_txn;

/* One variable as stored. */
typedef struct psd_var_rec {
    const char *name;          /* NUL-terminated, 1..255 bytes */
    const void *spec;          /* opaque blob, stored verbatim */
    size_t spec_len;
    uint64_t version;          /* updates applied */
    uint64_t step;             /* last applied step (sync mode's clock) */
    const float *value;        /* (n) */
    size_t n;
    const float *slots;        /* (nslots, n) optimizer state; NULL if nslots == 0 */
    int nslots;                /* 0..PSD_STORE_MAX_SLOTS */
    uint32_t var_id;           /* psd_store_put of a new record: this id, from
                                  psd_store_reserve_ids (0: the next one) */
} psd_var_rec;

enum {
    PSD_STORE_RDONLY = 1,      /* psd_store_open: read only, create nothing */
    PSD_STORE_MAX_SLOTS = 254, /* the kind byte of a "dense" key */
};

/* Opens (and unless PSD_STORE_RDONLY, creates) the store in dir, creating
 * dir and its parents if needed. map_size is the most the environment may
 * hold; 0 picks 64 GiB, a sparse mapping that costs only address space,
 * halved (with a warning) down to 256 MiB where address space is capped
 * (ulimit -v); 1 GiB under valgrind. A full map gives PS_EFULL from put and
 * commit; psd_store_grow then makes it bigger. Returns 0, -errno (-ENOENT: a read-only open of a directory with no
 * store), PS_ECORRUPT (not a psd store, a newer format, or written on a
 * big-endian host), PS_EINVAL_ARG or PS_ESTORE; LMDB's reason is logged. */
int psd_store_open(const char *dir, uint64_t map_size, unsigned flags, psd_store **out);
/* Closes the environment. Every transaction must have ended. NULL is ok. */
void psd_store_close(psd_store *s);

/* Growth of the map. A transaction that fills the map fails with PS_EFULL
 * (spoiled, as any failure); after ending it, the caller calls
 * psd_store_grow and, on 0, does the transaction again. psd_store_grow
 * doubles the map (mdb_env_set_mapsize), up to the cap: max if
 * psd_store_set_map_max gave one (0, the default: the data file plus the
 * free space of its disk). It waits until no transaction is open in the
 * process (every transaction holds the store's gate; see store_internal.h),
 * so the caller must hold none, nor anything a reader waits for. Returns 0
 * (grown), or PS_EFULL: the last failure was not a full map (the disk is
 * full), or the map is at its cap (logged, naming the cap). */
void psd_store_set_map_max(psd_store *s, uint64_t max);
int psd_store_grow(psd_store *s);
/* Why the last psd_store_grow returned PS_EFULL, for a client's message:
 * "the LMDB map is at --map-size-max" or "the disk is full". */
const char *psd_store_full_reason(psd_store *s);
/* The bytes the store's file may still grow by: its cap (--map-size-max,
 * else the disk's free space plus the file) less the file's last page in
 * use (pages LMDB freed inside it not counted); UINT64_MAX when the disk
 * cannot be asked. */
uint64_t psd_store_room(psd_store *s);
/* The map's size now, in bytes. */
uint64_t psd_store_map_size(psd_store *s);

/* Called once per record; a nonzero return stops the walk and is returned
 * by the function that called it. rec is valid only during the call. */
typedef int (*psd_store_visit_fn)(void *ctx, const psd_var_rec *rec);

/* Visits every variable, sorted bytewise by name, all from one read
 * transaction (one consistent snapshot). Returns 0, fn's nonzero return,
 * PS_ECORRUPT naming the variable in the log (bad magic, sizes that do not
 * match the header, a missing value or slot), -ENOMEM or PS_ESTORE. */
int psd_store_load(psd_store *s, psd_store_visit_fn fn, void *ctx);
/* Visits one variable. Returns 0, fn's return, PS_ENOTFOUND, PS_EINVAL_ARG
 * (a name that is empty or longer than 255 bytes), or as psd_store_load. */
int psd_store_get(psd_store *s, const char *name, psd_store_visit_fn fn, void *ctx);

/* Begins the write transaction; blocks while another one is open. Returns
 * 0, PS_EINVAL_ARG on a read-only store, -ENOMEM or PS_ESTORE. */
int psd_store_begin(psd_store *s, psd_store_txn **out);
/* Inserts or replaces a variable: header, spec, value and every slot, each
 * copied straight into the map (MDB_RESERVE). Replacing keeps the var_id and
 * drops slots the new record no longer has; an unreadable old record is
 * replaced as if it were new (with a warning). Returns 0, PS_EINVAL_ARG (bad
 * name, too many slots, NULL arrays with nonzero sizes: the transaction
 * stays usable), PS_EFULL (the map or the transaction is full), PS_ECORRUPT
 * (the id counter is unreadable) or PS_ESTORE. After any of the last three
 * the transaction is spoiled: every later call returns that error and
 * commit aborts. */
int psd_store_put(psd_store_txn *t, const psd_var_rec *rec);
/* Deletes a variable with its value, slots and rows (only the record, if
 * its header is unreadable). Returns 0, PS_ENOTFOUND (the transaction stays
 * usable), PS_EINVAL_ARG, or as put. */
int psd_store_del(psd_store_txn *t, const char *name);
/* Deletes every variable (restore empties the store before loading a
 * checkpoint into it); with keep_rows the rows of sparse tables stay, as
 * orphans of no variable for psd_store_rows_gc, since dropping them in
 * one transaction would dirty every page of a table that may be larger
 * than memory. Returns 0 or as put. */
int psd_store_clear(psd_store_txn *t, bool keep_rows);
/* Sets n variable ids aside (the counter moves past them): *first..+n-1. */
int psd_store_reserve_ids(psd_store_txn *t, uint32_t n, uint32_t *first);
/* Copies the rows of table name in the store src into this store's rows
 * under var_id to, in transactions of at most chunk rows each, committed
 * one after another (growing the map when full): memory stays bounded
 * whatever the table's size. Not atomic: a restore copies under ids
 * reserved for it and switches the records to them in one transaction at
 * the end; rows of ids no record names are psd_store_rows_gc's. Returns 0
 * or the store's error. */
int psd_store_rows_stage(psd_store *s, psd_store *src, const char *name, uint32_t to,
                         size_t chunk);
/* Deletes the rows of var_ids that no variable record names (a restore's
 * old rows, or its copy cut short by a crash), at most chunk rows a
 * transaction. Returns 0 or the store's error. */
int psd_store_rows_gc(psd_store *s, size_t chunk, uint64_t *deleted);
/* Commits and frees t, fsync'ed before it returns. Returns 0, PS_EFULL (the
 * map is full, or the disk: ENOSPC, EDQUOT, EFBIG), PS_ESTORE, or the error
 * that spoiled the transaction; on any failure nothing of it is visible. */
int psd_store_commit(psd_store_txn *t);
/* Discards and frees t. NULL is ok. */
void psd_store_abort(psd_store_txn *t);

/* Writes a compacted copy of the store, taken from one read transaction (so
 * commits go on meanwhile), to dst_dir/data.mdb; dst_dir must exist and hold
 * no data.mdb. The copy is not fsync'ed: the caller does that (checkpoint.c
 * does). Called by the checkpoint writer, possibly in its own thread while
 * the writer thread keeps committing. Returns 0,
 * -EEXIST, -ENOENT, other -errno, PS_EFULL when a write fails for space
 * (ENOSPC, EDQUOT, EFBIG) or PS_ESTORE; on failure the partial file is
 * removed. */
int psd_store_copy(psd_store *s, const char *dst_dir);
/* Forces everything committed to disk (mdb_env_sync). A read-only store has
 * nothing to flush and returns 0. Returns 0, PS_EFULL or PS_ESTORE. */
int psd_store_sync(psd_store *s);
/* The number of successful commits since open. */
uint64_t psd_store_commits(const psd_store *s);

/* ---- rows of sparse tables (store_rows.c) ------------------------------
 * A row is an opaque value to the store; the table's var_id is the one its
 * "vars" record got at its first put. A read transaction (psd_store_rtxn)
 * is one consistent snapshot, used by one thread; the bytes it hands out
 * point into LMDB's map (no copy) and are valid until psd_store_rend. */
typedef struct psd_store_rtxn psd_store_rtxn;

/* The var_id of variable name. Returns 0, PS_ENOTFOUND, PS_ECORRUPT or
 * PS_ESTORE. */
int psd_store_var_id(psd_store *s, const char *name, uint32_t *id);
/* Begins and ends a read transaction. */
int psd_store_rbegin(psd_store *s, psd_store_rtxn **out);
void psd_store_rend(psd_store_rtxn *r);
/* Row id of table var_id: *data points into the map (any alignment).
 * Returns 0, PS_ENOTFOUND or PS_ESTORE. */
int psd_store_row_get(psd_store_rtxn *r, uint32_t var_id, int64_t id,
                      const void **data, size_t *len);
/* Row id of table var_id as the write transaction t sees it: *data points
 * into the map, valid until t's next write. Returns 0, PS_ENOTFOUND or as
 * psd_store_put. */
int psd_store_row_peek(psd_store_txn *t, uint32_t var_id, int64_t id,
                       const void **data, size_t *len);
/* Inserts or replaces row id: head (head_len bytes) then body, written
 * straight into the map; body may be NULL when body_len is 0. Returns 0
 * or as psd_store_put (PS_EFULL...). */
int psd_store_row_put(psd_store_txn *t, uint32_t var_id, int64_t id,
                      const void *head, size_t head_len, const void *body,
                      size_t body_len);
/* Called for a row by psd_store_rows_walk: returns 1 to delete the row, 0 to
 * keep it, a negative value to stop the walk (returned). */
typedef int (*psd_store_row_fn)(void *ctx, int64_t id, const void *data, size_t len);
/* Walks at most max rows of table var_id in id order in a write
 * transaction, from id *from on (inclusive); *from is set to the id after
 * the last one visited, and *done to true when the table's end was reached.
 * Returns 0, fn's negative return, or as psd_store_put. */
int psd_store_rows_walk(psd_store_txn *t, uint32_t var_id, int64_t *from, size_t max,
                        psd_store_row_fn fn, void *ctx, int *done);
/* Called for a row of any table by psd_store_rows_scan: 0 to go on, 1 to
 * end the scan after this row, a negative value to stop it (returned).
 * data is valid during the call only. */
typedef int (*psd_store_scan_fn)(void *ctx, uint32_t var_id, int64_t id, const void *data,
                                 size_t len);
/* Reads at most max rows of every table in key order (var_id, then id) in
 * one read transaction, from (*var_id, *id) on (inclusive); both are set
 * to the key after the last one read, and *done to true at the end of the
 * rows. Returns 0, fn's negative return, or PS_ESTORE. */
int psd_store_rows_scan(psd_store *s, uint32_t *var_id, int64_t *id, size_t max,
                        psd_store_scan_fn fn, void *ctx, bool *done);
/* Counts the rows of table var_id (a walk of its keys); _ids also calls
 * each(ctx, id) for every row, in id order. */
int psd_store_rows_count(psd_store *s, uint32_t var_id, uint64_t *n);
int psd_store_rows_ids(psd_store *s, uint32_t var_id, uint64_t *n,
                       void (*each)(void *ctx, int64_t id), void *ctx);
/* Copies every row of variable name from the store src (its var_id there)
 * into t's store (the var_id name has in t: put the record first), one
 * row at a time: a table larger than memory is streamed. Returns 0,
 * PS_ENOTFOUND (name is in neither), or as psd_store_put. */
int psd_store_rows_copy(psd_store_txn *t, psd_store *src, const char *name);
/* Bytes of the store's file in use (its last page). */
uint64_t psd_store_disk_bytes(psd_store *s);
/* Marks of the row log (rowlog.h), u64s in "meta", 0 when never set:
 * "rowlog_applied", the last batch whose rows are in the store (set in
 * the transaction that writes them); "rowlog_logged", the last batch
 * written before a commit of the dense variables (set in that commit: a
 * copy of the store plus the batches up to it is one moment). Return 0 or
 * as psd_store_put / psd_store_row_get. */
/* "segs_end" is where the segment records the rows db points at end
 * (sparse_seg.c packs it: segment << 40 | offset), set in each
 * transaction that points rows at new records. */
/* "cat_upto" is where the segment records end that the rows db's entries
 * hold (sparse_seg.c): records past it, up to "segs_end", are replayed
 * into it at open. */
enum psd_store_log_mark {
    PSD_STORE_LOG_APPLIED,
    PSD_STORE_LOG_LOGGED,
    PSD_STORE_SEGS_END,
    PSD_STORE_CAT_UPTO
};
int psd_store_log_mark(psd_store *s, enum psd_store_log_mark m, uint64_t *seq);
int psd_store_set_log_mark(psd_store_txn *t, enum psd_store_log_mark m, uint64_t seq);

#endif
