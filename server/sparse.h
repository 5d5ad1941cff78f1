/*
 * sparse.h - sparse embedding tables: rows of `dim` float32 keyed by int64
 * id, created on first push, stored in LMDB, updated by any optimizer of
 * optim.h one row at a time (doc/sparse.md).
 *
 * A sparse table is a variable of the shard (psd_var, spec.sparse set, shape
 * [dim]) with a struct psd_sparse beside it. Its rows live in the store's
 * "rows" database (store.h) as {u64 updates, u64 last step} followed by the
 * row's value and its optimizer slots: [value dim | slot 0 dim | slot 1 dim],
 * so slot k of a row is row + (1 + k) * dim, optim.h's layout for a variable
 * of dim elements. Each row keeps its own update count, the t that ADAM's
 * bias correction takes (lazy Adam, as TensorFlow's LazyAdam).
 *
 * Tiers: rows changed and not yet in LMDB, and within the RAM budget the
 * rows read most (a clock), are held in a hash in memory, the RAM tier;
 * every other row is read from LMDB's map, without a copy, when a call
 * needs it. At each commit the flusher appends the changed rows to the row
 * log (rowlog.h; the same kill -9 bound; --durable: a SparsePush is
 * answered once logged), and the applier (sparse_log.c) writes them into
 * LMDB behind. The RAM tier of the whole process is kept under a quarter
 * of --memory-limit: past it a push first forces a commit and, if need be,
 * an apply, after which rows the clock passes over are dropped from memory
 * (they stay in LMDB, whose pages are the kernel's page cache, not psd's
 * anonymous memory).
 *
 * A row's initial value is psd_init_fill of the table's initializer with
 * the seed replaced by splitmix64(seed ^ splitmix64(id)): a function of
 * (seed, id) alone, the same bits on every shard, after a restart and after
 * a restore.
 *
 * Admission: with admit_after > 1, a push of an id with no row is counted in
 * a count-min sketch (4 x 65536 saturating 8-bit counters, 256 KiB per
 * table, in memory only: a restart forgets the counts) and applied only at
 * its admit_after-th push. Eviction: the flusher thread sweeps each table
 * at most once a second: rows whose last step is more than ttl_steps below
 * the table's clock (the highest step pushed) are deleted, 64Ki rows per
 * sweep in id order, wrapping; and a table above max_rows loses its least
 * recently updated rows (lowest last step, then lowest id) down to max_rows
 * (one walk of the table). A row changed since the last commit is never
 * evicted.
 *
 * Threads and lifetime: a psd_sparse belongs to its psd_var and is freed
 * with it. Each table has one mutex (sp->mu), taken after s->table_lock and
 * before v->lock (shard_internal.h's order). The handlers run on the rpc
 * threads with table_lock held for reading; psd_sparse_flush,
 * psd_sparse_committed and psd_sparse_maintain run on the flusher with
 * flush_mu held.
 */
#ifndef PSD_SPARSE_H
#define PSD_SPARSE_H

#include "server/shard_internal.h"

#include "server/init.h"

struct psd_store_txn;
struct psd_store_rtxn;

/* A row in the RAM tier: dirty while mod != saved (a change not yet
 * committed); saving is the mod a commit under way holds. */
struct sp_entry {
    struct sp_entry *next; /* hash chain */
    int64_t id;
    uint64_t updates, last_step;
    uint32_t mod, saved, saving;
    uint64_t logged;       /* the last row-log batch holding it: kept in
                              memory until that batch is in LMDB */
    bool listed;           /* on the table's dirty list (dirty, or being saved) */
    bool ref;              /* read or written since the clock hand last passed */
    float row[];           /* (1 + nslots) * dim: value, then each slot */
};

/* A sparse table's state; every field below mu is guarded by it. */
struct psd_sparse {
    pthread_mutex_t mu;
    atomic_int flusher_waits; /* the flusher wants mu: others wait (sparse_lock) */
    size_t dim, rowf; /* rowf = (1 + nslots) * dim */
    int nslots;
    psd_opt opt;
    psd_init init;
    uint32_t admit_after;
    uint64_t ttl, max_rows;
    bool insert_on_pull;

    bool ready;       /* var_id and rows known (sparse_ready) */
    uint32_t var_id;  /* its rows' key prefix in the store */
    uint64_t rows;    /* rows stored, in LMDB or waiting to be */
    struct sp_entry **buckets;
    size_t nbuckets, nentries, ndirty;
    /* The entries changed since the last commit, so that a commit costs
     * what changed, not the table: flush and committed walk this list. */
    struct sp_entry **dlist;
    size_t dn, dcap;
    size_t trim_from;       /* the bucket where the next trim starts */
    /* A Bloom filter of the ids with a row (in LMDB or the RAM tier), built
     * by sparse_ready's walk and added to by sparse_install: an id it does
     * not hold has no row, and a lookup skips LMDB. NULL: not used (out of
     * memory, or past the rows it was sized for). */
    uint64_t *bloom;
    uint64_t bloom_mask;    /* bits - 1 (a power of two) */
    uint64_t bloom_cap;     /* rows it is sized for */
    uint8_t *cms;     /* admission counts, CMS_DEPTH x CMS_WIDTH */
    int64_t sweep_from;     /* where the next TTL sweep starts */
    int64_t last_sweep_ms;
    uint64_t sweep_clock;   /* the table's clock at the last sweep */
};

/* Largest dim a sparse table may have. */
#define PSD_SPARSE_MAX_DIM 65536

/* Checks the sparse part of a normalized spec (shape [dim], initializer,
 * consistency). Returns 0 or PS_EINVAL_ARG/PS_ESHAPE with a sentence. */
int psd_sparse_validate(const Ps__V1__VariableSpec *sp, char *why, size_t whylen);

/* A table's state for a validated spec and its optimizer (psd_var.opt, so
 * that every kind vartable.c reads works on rows); NULL when out of
 * memory. */
struct psd_sparse *psd_sparse_new(const Ps__V1__VariableSpec *sp, const psd_opt *opt);
void psd_sparse_free(struct psd_sparse *t);

/* The handlers (sparse_rpc.c). */
void shard_sparse_pull(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx);
void shard_sparse_push(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx);

/* Appends the rows of every sparse table changed since the last commit to
 * the row log as batch seq (one write and an fdatasync; nothing when no
 * row changed). With table_lock held for reading and flush_mu. Returns 0,
 * PS_EFULL or -errno. */
int psd_sparse_flush(psd_shard *s, uint64_t seq, bool *wrote);
/* The batch holding them was written (ok) or not: rows written are clean,
 * or stay dirty. */
void psd_sparse_committed(psd_shard *s, bool ok);
/* Whether the entry must stay in memory: changed, or its last batch in the
 * row log not yet applied to LMDB. */
bool sparse_pinned(psd_shard *s, const struct sp_entry *e);
/* After an apply of the row log: drops clean, applied rows from every
 * table while the RAM tier is above half its budget, and makes each
 * table's eviction sweep due again (the rows it could not see in LMDB
 * are there now). No lock held. */
void psd_sparse_applied(psd_shard *s);
/* The LMDB pages the applier's transaction holds now (sparse_log.c):
 * counted in psd_sparse_ram_cost. */
void psd_sparse_apply_pages(uint64_t pages);
/* Whether more rows wait for the next commit than the flusher writes in
 * about 40 ms (as measured on the last commits): then a push commits first,
 * so that the kill -9 bound holds whatever the push rate. */
bool psd_sparse_backlogged(void);
/* The flusher's periodic work: the eviction sweeps. flush_mu held, nothing
 * else. */
void psd_sparse_maintain(psd_shard *s);
/* Adds the sparse counters to a Stats answer. table_lock held. */
void psd_sparse_stats(psd_shard *s, Ps__V1__StatsResponse *r);

/* Takes t->mu, after the flusher if it waits for it. */
void sparse_lock(struct psd_sparse *t);
/* Between sparse.c and sparse_rpc.c. With t->mu held. */
int sparse_ready(psd_shard *s, struct psd_sparse *t, const char *name);
struct sp_entry *sparse_find(struct psd_sparse *t, int64_t id);
/* False only when id certainly has no row in LMDB (the table's filter). */
bool sparse_maybe_stored(const struct psd_sparse *t, int64_t id);
/* Called at each i of a walk over ids (t->mu held): fetches what the ids
 * a few ahead will need into the cache. */
void sparse_ahead(const struct psd_sparse *t, const int64_t *ids, size_t i, size_t n);
int sparse_lookup(psd_shard *s, struct psd_sparse *t, struct psd_store_rtxn **rt,
                  int64_t id, struct sp_entry **e, const uint8_t **data);
void sparse_init_row(const struct psd_sparse *t, int64_t id, float *row, bool slots);
bool sparse_admits(struct psd_sparse *t, int64_t id);
void sparse_count_push(struct psd_sparse *t, int64_t id);
struct sp_entry *sparse_install(struct psd_sparse *t, int64_t id, const float *row,
                                uint64_t updates, uint64_t last_step);
void sparse_count_new(struct psd_sparse *t);
/* Keeps a copy of a row read from LMDB (data: its stored bytes) in the RAM
 * tier, entering without its clock bit; past the tier's budget the clock
 * first makes room, and the row is not kept if it cannot: hot rows are
 * then read from memory at ~600 bytes each instead of a 4 KiB page each. */
void sparse_cache(psd_shard *s, struct psd_sparse *t, int64_t id, const uint8_t *data);
/* When the shard's file is larger than half of --memory-limit: reads the
 * rows of ids that are not in the RAM tier from several threads at once,
 * so that their pages' faults overlap (sparse_prefetch.c). Without t->mu;
 * before the call takes it. */
void sparse_prefetch(psd_shard *s, struct psd_sparse *t, const int64_t *ids, size_t n);
/* The same for rows of table var_id, in the tier or not: the applier's
 * next transaction rewrites their leaf pages (sparse_log.c). */
void sparse_prefetch_rows(psd_shard *s, uint32_t var_id, const int64_t *ids, size_t n);
/* Process-wide: rows pulled, rows pushed, pushed rows not admitted. */
void psd_sparse_count(uint64_t pulled, uint64_t pushed, uint64_t not_admitted);
/* Bytes of the RAM tier now, and its budget (a quarter of --memory-limit,
 * 256 MiB without one). */
uint64_t psd_sparse_ram_bytes(void);
/* The bytes above plus a page per changed row (what the next commit's
 * transaction will hold): what the budget bounds. */
uint64_t psd_sparse_ram_cost(void);
#define SPARSE_DIRTY_PAGE 4096
uint64_t psd_sparse_budget(psd_shard *s);
#define SPARSE_ROW_HEAD 16 /* u64 updates, u64 last step, before the floats */

#endif
