/*
 * sparse_internal.h - the sparse tier's state, shared by its files
 * (sparse.h lists them). Nothing else includes it; it does not see the
 * shard's state either: what the tier needs of the shard comes in
 * psd_sparse_conf and the calls of sparse.h.
 *
 * Rows live in the store's "rows" database (store.h) as {u64 updates, u64
 * last step} followed by the row's body: its value in the table's row
 * dtype (float32, float16 or bfloat16: VariableSpec.row_dtype), padded to
 * a multiple of 4 bytes, then its float32 optimizer slots [slot 0 dim |
 * slot 1 dim]. sparse_row_bytes gives a stored row's size; nothing else
 * computes it. An update widens a body into a float32 state [value dim |
 * slot 0 dim | ...] (sparse_row_unpack), optim.h's layout for a variable
 * of dim elements, and rounds it back to nearest even (sparse_row_pack).
 * Each row keeps its own update count, the t that ADAM's bias correction
 * takes (lazy Adam, as TensorFlow's LazyAdam).
 *
 * Tiers: rows changed and not yet in LMDB, and within the RAM budget the
 * rows read most (a clock), are held in a hash in memory, the RAM tier;
 * every other row is read from LMDB's map, without a copy, when a call
 * needs it. At each commit the flusher appends the changed rows to the row
 * log (rowlog.h; the same kill -9 bound), and the applier (sparse_log.c)
 * writes them into LMDB behind. The RAM tier is kept under a quarter of
 * --memory-limit: past it a push first waits for a commit and, if need
 * be, an apply, after which rows the clock passes over are dropped from
 * memory (they stay in LMDB, whose pages are the kernel's page cache).
 *
 * A row's initial value is psd_init_fill of the table's initializer with
 * the seed replaced by splitmix64(seed ^ splitmix64(id)): a function of
 * (seed, id) alone, the same bits on every shard, after a restart and after
 * a restore.
 *
 * Admission: with admit_after > 1, a push of an id with no row is counted in
 * a count-min sketch (4 x 65536 saturating 8-bit counters, 256 KiB per
 * table, in memory only: a restart forgets the counts) and applied only at
 * its admit_after-th push. Eviction: the flusher sweeps each table at most
 * once a second: rows whose last step is more than ttl_steps below the
 * table's clock (the highest step pushed) are deleted, 64Ki rows per sweep
 * in id order, wrapping; and a table above max_rows loses its least
 * recently updated rows (lowest last step, then lowest id) down to
 * max_rows (one walk of the table). A row changed since the last commit is
 * never evicted.
 */
#ifndef PSD_SPARSE_INTERNAL_H
#define PSD_SPARSE_INTERNAL_H

#include "server/sparse.h"

#include "common/buf.h"
#include "server/init.h"
#include "server/rowlog.h"
#include "server/store.h"

#include <pthread.h>
#include <stdatomic.h>

#define SPARSE_ROW_HEAD 16 /* u64 updates, u64 last step, before the floats */
#define SPARSE_DIRTY_PAGE 4096
#define SPARSE_CMS_DEPTH 4
#define SPARSE_CMS_WIDTH 65536
#define SPARSE_PREFETCH_THREADS 48

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
    /* The row's body as stored: value in the row dtype, then the slots. */
    uint8_t row[] __attribute__((aligned(8)));
};

/* A sparse table's state; every field below mu is guarded by it. */
struct psd_sparse_table {
    char *name;
    psd_sparse *sp;               /* attached to it, or NULL */
    psd_sparse_table *next;       /* in sp->tables (sp->tables_mu) */
    atomic_uint_fast64_t clock;   /* the highest step pushed */
    pthread_mutex_t mu;
    atomic_int flusher_waits; /* the flusher wants mu: others wait (sparse_lock) */
    size_t dim, rowf; /* rowf = (1 + nslots) * dim: a row's float32 state */
    int row_dtype;      /* 0 (float32) or PS_HALF_F16 / PS_HALF_BF16 */
    size_t vbytes;      /* the value's bytes in the body, padded to 4 */
    uint64_t row_bytes; /* sparse_row_bytes: head and body, one stored row */
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
    /* Entries a push reserved before it applies anything (sparse_reserve),
     * so that installing its rows cannot fail half-way. */
    struct sp_entry *spare;
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

/* A job of the prefetch pool (sparse_prefetch.c). */
struct sp_pf_job;

struct psd_sparse {
    psd_store *store;
    char *data_dir;
    uint64_t memory_limit, map_size;

    /* The attached tables; taken after the shard's table_lock, before a
     * table's mu. */
    pthread_mutex_t tables_mu;
    psd_sparse_table *tables;

    /* Counters: bytes of the RAM tier, rows changed and not committed,
     * rows admitted, evicted, not admitted, pulled, pushed, read from
     * LMDB; the LMDB pages the applier's transaction holds now. */
    atomic_uint_fast64_t ram, dirty, admitted, evicted, not_admitted, pulled, pushed,
        read_lmdb, ram_hits, ram_misses, apply_pages, log_batches, refused_rows;
    /* float16 row values clamped to +-65504 by an update or an initial
     * row (Stats.wire_clamped adds them). */
    atomic_uint_fast64_t clamped;
    /* The bytes of the stored rows of the ready tables (rows * row_bytes):
     * what they hold against --max-bytes. */
    atomic_uint_fast64_t row_bytes;
    uint64_t max_rows;      /* per table, 0: none */
    /* The kill -9 bound needs each commit to end soon after it starts: the
     * rows a commit may carry follow what the last commits wrote per ms
     * (an average the flusher keeps). */
    _Atomic double rows_per_ms;
    int64_t flush_t0_us;  /* the flusher's */
    uint64_t flush_rows;

    /* The row log (rowlog.h): the flusher appends a batch per commit; the
     * applier thread writes a sealed file's rows into LMDB behind.
     * apply_run_mu is held through each apply (one at a time; taken after
     * the shard's flush_mu, before its table_lock); apply_mu guards the
     * applier's wake-up. */
    psd_rowlog *rowlog;
    ps_buf logbuf;                    /* the batch a flush builds (flush_mu) */
    atomic_uint_fast64_t log_seq;     /* the last batch appended */
    atomic_uint_fast64_t log_applied; /* the last batch whose rows are in LMDB */
    pthread_mutex_t apply_run_mu;
    pthread_mutex_t apply_mu;
    pthread_cond_t apply_cond;
    /* Rounds of room asked of the applier by pushes past the budget, and
     * done (psd_sparse_make_room); apply_mu. */
    pthread_cond_t room_cond;
    uint64_t room_req, room_done;
    int room_rc;
    bool apply_quit, applier_started;
    atomic_bool apply_asap; /* a sweep wants the log in LMDB */
    pthread_t applier;
    int64_t last_apply_ms;

    /* The prefetch pool (sparse_prefetch.c), started on first need. */
    struct {
        pthread_mutex_t mu;
        pthread_cond_t work, idle;
        struct sp_pf_job *jobs; /* queued, ids may be left */
        int threads;            /* started; -1 when starting failed */
        bool quit;
        pthread_t tid[SPARSE_PREFETCH_THREADS];
    } pool;
};

/* sparse.c */
uint64_t sparse_budget(const psd_sparse *sp);
/* The RAM tier's rows plus a page per row of the applier's transaction:
 * what the budget bounds. */
uint64_t sparse_ram_cost(const psd_sparse *sp);
uint64_t sparse_mix64(uint64_t z);
/* Takes t->mu, after the flusher if it waits for it; sparse_flusher_lock
 * is the flusher's. */
void sparse_lock(psd_sparse_table *t);
void sparse_flusher_lock(psd_sparse_table *t);

/* sparse.c: a row's bytes. A stored row is SPARSE_ROW_HEAD then
 * sparse_row_bytes(t) - SPARSE_ROW_HEAD bytes of body. */
uint64_t sparse_row_bytes(const psd_sparse_table *t);
/* body (any alignment) into state, rowf float32 (exact). */
void sparse_row_unpack(const psd_sparse_table *t, const uint8_t *body, float *state);
/* state into body (8-aligned): the value rounded to the row dtype. Returns
 * the float16 values clamped to +-65504. */
size_t sparse_row_pack(const psd_sparse_table *t, const float *state, uint8_t *body);

/* sparse_ram.c: with t->mu held. */
struct sp_entry *sparse_find(psd_sparse_table *t, int64_t id);
struct sp_entry **sparse_link(psd_sparse_table *t, int64_t id);
void sparse_entry_drop(psd_sparse *sp, psd_sparse_table *t, struct sp_entry **link);
size_t sparse_entry_bytes(const psd_sparse_table *t);
bool sparse_dirty(const struct sp_entry *e);
bool sparse_pinned(const psd_sparse *sp, const struct sp_entry *e);
struct sp_entry *sparse_install(psd_sparse *sp, psd_sparse_table *t, int64_t id,
                                const float *state, uint64_t updates, uint64_t last_step);
void sparse_cache(psd_sparse *sp, psd_sparse_table *t, int64_t id, const uint8_t *data);
void sparse_trim(psd_sparse *sp, psd_sparse_table *t);
/* Room for rows more rows on the dirty list and entries new entries, so
 * that the next rows sparse_install calls, entries of them for ids not in
 * the RAM tier, cannot fail: 0 or -ENOMEM (nothing to undo).
 * sparse_unreserve frees the entries left. */
int sparse_reserve(psd_sparse_table *t, size_t rows, size_t entries);
void sparse_unreserve(psd_sparse_table *t);
void sparse_free_entries(psd_sparse_table *t);
/* Fetches what the ids a few ahead of i will need into the cache. */
void sparse_ahead(const psd_sparse_table *t, const int64_t *ids, size_t i, size_t n);

/* sparse_rows.c: with t->mu held. */
int sparse_ready(psd_sparse *sp, psd_sparse_table *t);
bool sparse_maybe_stored(const psd_sparse_table *t, int64_t id);
void sparse_bloom_add(psd_sparse_table *t, int64_t id);
void sparse_bloom_prefetch(const psd_sparse_table *t, int64_t id);
/* The state of id's row: 1 with *e its RAM entry; 2 with its stored bytes
 * at *data (value at data + SPARSE_ROW_HEAD); 0 when it has none. rt is
 * begun on first need. Returns a negative error too. */
int sparse_lookup(psd_sparse *sp, psd_sparse_table *t, psd_store_rtxn **rt, int64_t id,
                  struct sp_entry **e, const uint8_t **data);
int sparse_sweep(psd_sparse *sp, psd_sparse_table *t, uint64_t clock);

/* sparse_prefetch.c: without t->mu; before the call takes it. */
void sparse_prefetch(psd_sparse *sp, psd_sparse_table *t, const int64_t *ids, size_t n);
void sparse_prefetch_rows(psd_sparse *sp, uint32_t var_id, const int64_t *ids, size_t n);
void sparse_pool_stop(psd_sparse *sp);

/* sparse_log.c */
int sparse_log_open(psd_sparse *sp);
void sparse_applier_stop(psd_sparse *sp);

#endif
