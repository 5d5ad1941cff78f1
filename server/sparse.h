/*
 * sparse.h - the sparse tier of a shard: embedding tables of rows of `dim`
 * values (float32, float16 or bfloat16: the spec's row_dtype) keyed by
 * int64 id, created on first push, stored in LMDB, updated by any optimizer
 * of optim.h one row at a time, in float32; its optimizer slots are stored
 * in float32, float16 or bfloat16 (the spec's slot_dtype) (doc/sparse.md).
 *
 * The tier is one struct psd_sparse, owned by the shard (psd_shard.sparse)
 * and holding everything the rows need: the RAM tier, the row log and its
 * applier thread, the segment files of the rows, and the counters
 * Stats and /metrics read. Nothing of it is process-wide: two shards in one
 * process have two tiers. A sparse table is a variable of the shard
 * (psd_var, spec.sparse set, shape [dim]) with a psd_sparse_table beside
 * it; the shard attaches a table to its tier when the variable enters its
 * table of variables and detaches it when it leaves.
 *
 * The shard calls the tier only through the functions below:
 *   open/close        psd_sparse_open (replays the row log), _start (the
 *                     applier), _stop (drains the log), _close
 *   tables            psd_sparse_table_new/_free, _attach/_detach
 *   pull, push        psd_sparse_pull, psd_sparse_push
 *   commit            psd_sparse_flush, _committed, _logged: the flusher's
 *                     batch of changed rows, appended to the row log
 *   room              psd_sparse_needs_commit, _over_budget, _make_room,
 *                     _drain: the RAM tier's budget and the kill -9 bound
 *   maintain          psd_sparse_maintain: the TTL and max_rows sweeps
 *   checkpoints       psd_sparse_ckpt_begin/_end, psd_sparse_ckpt_complete
 *   stats, metrics    psd_sparse_stats, psd_sparse_metrics
 * Its files, by subject (each includes sparse_internal.h, never the
 * shard's private header):
 *   sparse.c          the tier and its tables, pull, push, stats, metrics
 *   sparse_ram.c      the RAM tier: a hash of rows and its clock
 *   sparse_rows.c     stored rows: finding them, lookups, sweeps
 *   sparse_index.c    each table's index in memory: id -> its record
 *   sparse_log.c      the row log: commits, the applier, replay, drains
 *   sparse_cold.c     cold reads: a call's misses read in one batch
 *   sparse_seg.c      the segment files and the catalog in LMDB
 * and the RPC edge, sparse_rpc.c, is the shard's: it decodes SparsePull
 * and SparsePush, finds the tables, and answers.
 *
 * Threads and lifetime: psd_sparse_open before the variables load,
 * psd_sparse_close after they are freed. Each table has one mutex, taken
 * after the shard's table_lock and after the tier's tables_mu (the list of
 * tables), before a variable's lock; a push takes the mutexes of all its
 * tables in address order. psd_sparse_flush, _committed and _maintain run
 * on the flusher with flush_mu held.
 */
#ifndef PSD_SPARSE_H
#define PSD_SPARSE_H

#include "common/metrics.h"
#include "proto/ps.pb-c.h"
#include "server/optim.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct psd_sparse psd_sparse;             /* a shard's tier */
typedef struct psd_sparse_table psd_sparse_table; /* one table's rows */
struct psd_store;
struct psd_assist;

/* Largest dim a sparse table may have. */
#define PSD_SPARSE_MAX_DIM 65536

struct psd_sparse_conf {
    struct psd_store *store;  /* the shard's, open; outlives the tier */
    const char *data_dir;     /* where the row log lives */
    uint64_t memory_limit;    /* the RAM tier gets it less 88 MiB (sparse.c); 0: 256 MiB */
    uint64_t map_size;        /* a checkpoint copy's map (0: default) */
    uint64_t max_rows;        /* rows a table may hold (--max-rows-per-table);
                                 0: no cap */
    uint64_t segment_size;    /* a segment file is sealed past it (0: 256 MiB) */
    uint64_t compact_rate;    /* compaction's bytes of I/O a second (0: 32 MiB) */
    char *why;                /* an open refused for a damaged segment names it
                                 here, one line (NULL: in the log) */
    size_t whylen;
};

/* Opens the row log in data_dir and writes what it holds beyond the
 * store's applied mark into the store (a crash left it acknowledged but
 * not applied). Returns 0, -ENOMEM, -errno or the store's error, logged. */
int psd_sparse_open(const struct psd_sparse_conf *c, psd_sparse **out);
/* Starts the applier thread: 0 or -EAGAIN. */
int psd_sparse_start(psd_sparse *sp);
/* Lends the tier the shard's helper thread (assist.h; NULL: none), which a
 * pull that reads ahead borrows, when it is idle, to look up the next
 * pull's ids while it looks up its own. a outlives every call of the
 * tier. Before the first call. */
void psd_sparse_set_assist(psd_sparse *sp, struct psd_assist *a);
/* Stops the applier and applies the whole log: every row is in the
 * segments and LMDB's "segs_end" after it. The catalog is written for a
 * second at most (the next open replays what is left). Returns 0 or the
 * store's error. */
int psd_sparse_stop(psd_sparse *sp);
/* Frees the tier, after every table was freed. NULL is a no-op. */
void psd_sparse_close(psd_sparse *sp);

/* Checks the sparse part of a normalized spec (shape [dim], initializer,
 * consistency). Returns 0 or PS_EINVAL_ARG/PS_ESHAPE with a sentence. */
int psd_sparse_validate(const Ps__V1__VariableSpec *spec, char *why, size_t whylen);
/* Checks a slot dtype (ps.v1.DType) for a table of optimizer o (NULL: any):
 * FLOAT32, FLOAT16 or BFLOAT16 (or unset), and not FLOAT16 with ADAM.
 * Returns 0, PS_EDTYPE (another dtype) or PS_EINVAL_ARG (FLOAT16 with
 * ADAM) with a sentence naming the table. */
int psd_sparse_validate_slots(const char *name, int slot_dtype, const Ps__V1__Optimizer *o,
                              char *why, size_t whylen);
/* A table's state for a validated spec and its optimizer (the variable's,
 * so that every kind works on rows); NULL when out of memory. */
psd_sparse_table *psd_sparse_table_new(const Ps__V1__VariableSpec *spec, const psd_opt *opt);
void psd_sparse_table_free(psd_sparse_table *t);
/* The table joins (leaves) the tier's list, with clock the highest step
 * pushed so far (its variable's). The shard's table_lock held for writing. */
void psd_sparse_attach(psd_sparse *sp, psd_sparse_table *t, uint64_t clock);
void psd_sparse_detach(psd_sparse *sp, psd_sparse_table *t);
size_t psd_sparse_table_dim(const psd_sparse_table *t);
/* The half type (common/half.h) of the table's rows, or 0 for float32. */
int psd_sparse_row_type(const psd_sparse_table *t);
/* The same for its optimizer slots. */
int psd_sparse_slot_type(const psd_sparse_table *t);
/* The bytes of one row's value in an answer: dim elements of the row dtype,
 * or with f32 of float32. */
size_t psd_sparse_value_bytes(const psd_sparse_table *t, bool f32);

/* Writes the values of rows ids[0..n) into out (n values of
 * psd_sparse_value_bytes(t, f32) each, any alignment), in order: the
 * stored bits, or with f32 widened to float32. A row not stored gets its
 * initial value (rounded to the row dtype unless f32), and with
 * insert_on_pull is stored (*inserted counts those). Returns 0, -ENOMEM or
 * the store's error. */
int psd_sparse_pull(psd_sparse *sp, psd_sparse_table *t, const int64_t *ids, size_t n,
                    void *out, bool f32, uint64_t *inserted);
/* The same, told the ids of the table's next pull, next[0..nnext) (a
 * client's hint, SparsePullItem.next_ids): the reads of those on disk and
 * not in the RAM tier are handed to a thread before this pull is served,
 * and the table's next pull takes the rows it asks for from them (their
 * buffer counts in the RAM budget). It changes what the next pull waits
 * for, never what any pull answers. */
int psd_sparse_pull_next(psd_sparse *sp, psd_sparse_table *t, const int64_t *ids, size_t n,
                         const int64_t *next, size_t nnext, void *out, bool f32,
                         uint64_t *inserted);

/* One table's part of a push. grad: n * dim float32 (a half gradient is
 * widened before, by the RPC edge), as they arrived (any alignment), read
 * once into the rows' summed gradients. values: NULL, or n values of
 * psd_sparse_value_bytes(t, false) that receive the rows' values after the
 * update, in the row dtype. next: the ids of the client's next push of the
 * table, read ahead as a pull's next_ids are (psd_sparse_pull_next) once
 * the push's own rows are read, while it is applied and answered; it
 * changes what the next push waits for, never what a push applies. */
struct psd_sparse_grad {
    psd_sparse_table *t;
    const int64_t *ids;  /* (n) */
    size_t n;
    const void *grad;    /* (n, dim) float32 */
    void *values;        /* (n, dim) of the row dtype, or NULL */
    const int64_t *next; /* (nnext) the ids of the table's next push, a hint
                            (SparseGradient.next_ids), or NULL */
    size_t nnext;
};
/* Applies a push to its tables at step, all or nothing: every row's update
 * is proven finite, and the new rows within the caps, first: a table's
 * rows within --max-rows-per-table, and the bytes of the new rows (value,
 * slots and head) within bytes_room beside the tier's rows. Returns 0;
 * PS_EINVAL_ARG (an update would be non-finite) or PS_EFULL (past a cap)
 * with a sentence in why naming the table and the limit; -ENOMEM or the
 * store's error with *bad the index of the part. Nothing is applied on
 * failure. */
int psd_sparse_push(psd_sparse *sp, struct psd_sparse_grad *g, size_t n, uint64_t step,
                    uint64_t bytes_room, size_t *bad, char *why, size_t whylen);
/* The bytes of every stored row of the tables read so far: what the rows
 * hold against --max-bytes. */
uint64_t psd_sparse_row_bytes(psd_sparse *sp);
/* The bytes one row of a spec holds: head, value and slots. */
uint64_t psd_sparse_spec_row_bytes(const Ps__V1__VariableSpec *spec, const psd_opt *opt);

/* The flusher's commit: appends the rows of every table changed since the
 * last commit to the row log as the next batch (one write, one fdatasync;
 * nothing when no row changed), then psd_sparse_committed says whether the
 * rest of the commit went through. flush_mu held. Returns 0, PS_EFULL or
 * -errno. */
int psd_sparse_flush(psd_sparse *sp, bool *wrote);
void psd_sparse_committed(psd_sparse *sp, bool ok);
/* The last batch appended to the row log: a commit's transaction marks it. */
uint64_t psd_sparse_logged(psd_sparse *sp);

/* Whether a push should wait for a commit first: more rows wait for it
 * than the flusher writes in ~40 ms (the kill -9 bound), or the RAM tier
 * is past its budget. */
bool psd_sparse_needs_commit(psd_sparse *sp);
bool psd_sparse_over_budget(psd_sparse *sp);
/* Applies the row log until the RAM tier fits its budget (_make_room), or
 * whole (_drain). Returns 0 or the store's error, logged. */
int psd_sparse_make_room(psd_sparse *sp);
int psd_sparse_drain(psd_sparse *sp);

/* Why the last apply found no room, when a segment append failed for want
 * of it (a full disk, or RLIMIT_FSIZE); NULL otherwise (the store's own
 * reason then applies: psd_store_full_reason). */
const char *psd_sparse_full_reason(psd_sparse *sp);

/* The flusher's periodic work: the eviction sweeps. flush_mu held. */
void psd_sparse_maintain(psd_sparse *sp);

/* A restore into another row or slot dtype: each row staged is converted from a
 * row of table from (the checkpoint's) into one of table to
 * (psd_sparse_convert_row); rows and clamped count what it did. */
struct psd_sparse_conv {
    const psd_sparse_table *from, *to;
    uint64_t rows, clamped;
};
/* A Restore's staging of the rows of table name of the checkpoint store
 * src: appended to the segments and pointed at in the catalog under var_id
 * to (reserved, named by no record yet), in transactions of at most 8192
 * rows or 16 MiB, each converted by conv unless it is NULL. flush_mu held.
 * Returns 0 or the error, logged; a crash leaves orphan rows that
 * psd_store_rows_gc deletes. */
int psd_sparse_stage(psd_sparse *sp, struct psd_store *src, const char *name, uint32_t to,
                     struct psd_sparse_conv *conv);
/* After a Restore staged rows in LMDB: moves them into the segments and
 * counts the segments' live bytes again. flush_mu held. Returns 0 or the
 * error, logged (the rows not moved are read from LMDB, and moved at the
 * next start). */
int psd_sparse_restored(psd_sparse *sp);

/* A checkpoint: _begin (flush_mu held, after a commit) applies the log
 * and holds the applier off, 0 or an error, logged; _complete, the
 * psd_ckpt_write_with callback (ctx the tier), adds to the copy in dir the
 * batches logged after the drain; _end lets the applier go. */
int psd_sparse_ckpt_begin(psd_sparse *sp);
int psd_sparse_ckpt_complete(void *ctx, const char *dir);
void psd_sparse_ckpt_end(psd_sparse *sp);

/* Adds the tier's counters to a Stats answer. */
void psd_sparse_stats(psd_sparse *sp, Ps__V1__StatsResponse *r);
/* Writes the psd_sparse_* families of /metrics. Any thread. */
void psd_sparse_metrics(psd_sparse *sp, ps_metrics *m);

/* A restore into another row or slot dtype (RestoreRequest.sparse_row_dtype,
 * sparse_slot_dtype): psd_sparse_convert_row makes a stored row of table
 * from (in: in_len bytes, head and body) a row of table to, of the same dim
 * and optimizer and another row or slot dtype (out:
 * psd_sparse_stored_bytes(to) bytes), its value and slots rounded to
 * nearest even; scratch holds psd_sparse_state_floats floats. Adds the
 * float16 values and slots clamped to +-65504 to *clamped. Returns
 * 0, or PS_ECORRUPT (logged) when in_len is not a row of from. */
uint64_t psd_sparse_stored_bytes(const psd_sparse_table *t);
size_t psd_sparse_state_floats(const psd_sparse_table *t);
int psd_sparse_convert_row(const psd_sparse_table *from, const psd_sparse_table *to,
                           const void *in, size_t in_len, void *out, float *scratch,
                           uint64_t *clamped);

/* A table as ListVariables and psctl show it. */
struct psd_sparse_brief {
    uint64_t rows;       /* stored, in LMDB or waiting to be */
    uint64_t row_bytes;  /* one row as stored: head, value and slots */
    uint64_t ram_bytes;  /* its rows in the RAM tier, with the hash's buckets */
    uint64_t ram_rows;   /* how many rows the RAM tier holds */
};
void psd_sparse_table_brief(psd_sparse *sp, psd_sparse_table *t, struct psd_sparse_brief *b);

#endif
