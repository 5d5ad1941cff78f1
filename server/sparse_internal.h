/*
 * sparse_internal.h - the sparse tier's state, shared by its files
 * (sparse.h lists them). Nothing else includes it; it does not see the
 * shard's state either: what the tier needs of the shard comes in
 * psd_sparse_conf and the calls of sparse.h.
 *
 * A row is {u64 updates, u64 last step} followed by the row's body: its
 * value in the table's row dtype (float32, float16 or bfloat16:
 * VariableSpec.row_dtype), padded to a multiple of 4 bytes, then its
 * optimizer slots [slot 0 dim | slot 1 dim] in the slot dtype (float32,
 * float16 or bfloat16: VariableSpec.slot_dtype), padded the same way.
 * sparse_row_bytes gives a stored row's size; nothing else computes it.
 * An update widens a body into a float32 state [value dim | slot 0 dim |
 * ...] (sparse_row_unpack), optim.h's layout for a variable of dim
 * elements, and rounds value and slots back to nearest even
 * (sparse_row_pack). Each row keeps its own update count, the
 * t that ADAM's bias correction takes (lazy Adam, as TensorFlow's LazyAdam).
 *
 * Where rows are: the bytes of stored rows are records of the segment
 * files beside data.mdb (segment.h: append-only, a CRC32C each); LMDB, the
 * store of record and the commit point, holds the catalog, in its "rows"
 * database: (var_id, id) -> a SPARSE_CAT_LEN-byte entry {segment, offset,
 * length, version, last step} (sparse_seg.c). A directory written before
 * the segments held the row's bytes there instead; psd_sparse_open
 * converts them, and a restore's staged rows, in bounded transactions, and
 * until then they are read as they are.
 *
 *     data.mdb (LMDB)                       seg-00000001.psg ...
 *     rows: (var, id) -> {seg, off, len} ---> | hdr | rec | rec | rec ... |
 *     meta: rowlog_applied, segs_end, cat_upto   (O_DIRECT, io_uring)
 *     rows.log.0/1: batches of changed rows, applied behind
 *     memory, per table: index id -> {seg, off} (sparse_index.c) --^
 *
 * The index holds every stored row, updated by each writer once its
 * transaction committed; cold reads take locations from it and never
 * touch LMDB's pages (which, in a small memory cgroup, did not stay
 * cached beside the RAM tier: a 4 KiB fault per cold row). The catalog is
 * only the durable copy of the index, written behind it and lazily: the
 * applier's and compaction's transactions commit "segs_end" alone (the
 * commit point), and the catalog holds every record before "cat_upto";
 * an open replays the records between "cat_upto" and "segs_end" into it
 * (a later record of a row wins). Their entries wait in a bounded queue
 * (sparse_seg.c), dropped past sparse_catq_max entries: the next write
 * then reads the records past "cat_upto" from the segments, a chunk at a
 * time. A write goes in key order, in bounded transactions whose last
 * moves "cat_upto", one per turn of the applier (a push waiting for room
 * waits for one, the pages of the next read ahead by threads meanwhile):
 * while pushes run only once the span an open would replay passes
 * SPARSE_CAT_SPAN, and when the log is quiet, when a sweep or a
 * compaction asks; whole before a checkpoint or a conversion; at a clean
 * stop for a second at most, and not at all when it would read the
 * records (the next open's replay does that). A sweep deletes only rows
 * whose catalog entry is the index's and whose record lies before
 * "cat_upto" (sparse_cat_covers), so no record of a deleted row is
 * replayed: no tombstones. A compaction step's copies lie past "cat_upto"
 * before the index points at them, so a sweep also leaves to its next
 * pass the rows whose record is in the segment a step is copying from
 * (compact_seg, set from before the step asks the index which records
 * are live until after it moved the index, or, when the relocation
 * failed and the copies stayed, until "cat_upto" is past them, no step
 * running meanwhile): a row deleted in between
 * would be replayed from its copy. A compaction removes a segment once
 * "cat_upto" is past its copies.
 *
 * Tiers: rows changed and not yet applied, and within the RAM budget the
 * rows read most (a clock), are held in a hash in memory, the RAM tier. At
 * each commit the flusher appends the changed rows to the row log
 * (rowlog.h; the same kill -9 bound), and the applier (sparse_log.c)
 * appends them to the segments behind, fdatasyncs them, and only then
 * commits the LMDB transaction that moves "segs_end" (psd_segs_open cuts
 * anything past it) and points the index at them. A row outside the RAM
 * tier is a cold read (sparse_cold.c): a call's whole miss set is looked
 * up in the index and read in one batch through io_uring with O_DIRECT,
 * never a page fault, and the rows enter the RAM tier. The RAM tier, with
 * the indexes, the catalog's queue and the dirty pages LMDB keeps, is kept
 * under --memory-limit less 88 MiB (the page cache no longer holds rows,
 * but psd's code and the catalog's pages need it; sparse_budget), the
 * tier giving an index room
 * as soon as it grows (sparse_index_apply): past it a push first waits
 * for a commit and, if need be,
 * an apply, after which rows the clock passes over are dropped from
 * memory. Every overwrite or deletion leaves the old record dead; the
 * live bytes per segment are counted (rebuilt at open) for compaction.
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
#include "server/segment.h"
#include "server/store.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

#define SPARSE_ROW_HEAD 16 /* u64 updates, u64 last step, before the floats */
#define SPARSE_DIRTY_PAGE 4096
#define SPARSE_CMS_DEPTH 4
#define SPARSE_CMS_WIDTH 65536

/* A table's index of its stored rows (sparse_index.c): SPARSE_IX_PARTS
 * arrays of cap slots {id, packed location}, n of them used. */
#define SPARSE_IX_PART_BITS 6
#define SPARSE_IX_PARTS (1u << SPARSE_IX_PART_BITS)
struct sp_ixpart {
    struct sp_slot *slot;
    size_t cap, n;
};
struct sp_index {
    struct sp_ixpart part[SPARSE_IX_PARTS];
    size_t n;        /* ids held */
    uint64_t bytes;  /* of the parts' arrays */
    /* Counts the changes to what an id maps to (set, replace, delete,
     * the whole freed): while it stands still, every location looked up
     * since is what the index still holds. Never goes back. */
    uint64_t gen;
};

/* A row in the RAM tier: dirty while mod != saved (a change not yet
 * committed); saving is the mod a commit under way holds. */
struct sp_entry {
    struct sp_entry *next; /* hash chain */
    int64_t id;
    uint64_t updates, last_step;
    uint64_t logged;       /* the last row-log batch holding it: kept in
                              memory until that batch is in LMDB */
    uint32_t mod, saved, saving;
    bool listed;           /* on the table's dirty list (dirty, or being saved) */
    bool ref;              /* read or written since the clock hand last passed */
    /* (56 bytes to here: the flags in the counters' padding. With them
     * after logged the header was 72, and an entry of fp16 rows and
     * slots 336 bytes with malloc's word, not 320: 5% fewer rows in the
     * same RAM tier.) */
    /* The row's body as stored: value in the row dtype, then the slots. */
    uint8_t row[] __attribute__((aligned(8)));
};

/* A batch of reads ahead (sparse_cold.c): the reads a pull's hint of the
 * next pull's ids started, whose rows the table's next call takes as its
 * own cold rows. */
struct sp_batch {
    psd_seg_aread *ar;     /* NULL until its first use */
    psd_seg_read *rq;      /* (n) the batch: rq[k].id's record */
    uint64_t *loc;         /* (n) where the index put it when looked up */
    size_t n, cap;
    uint64_t bytes;        /* counted in sp->pf_bytes */
    bool busy;             /* submitted, not yet collected */
    /* The batch's ids, sorted, in rq's order; while nclaim (guarded by
     * the table's mu too) says so, a first pass leaves them to it. */
    int64_t *claim;
    size_t nclaim;
    uint64_t ixgen;        /* the index's gen when the batch was looked up */
};

/* A table's prefetch: two batches, each with its own thread and ring, so
 * that a pull submits the next pull's batch before it waits for its own
 * and the device never waits between them. b[cur] is the older: the one
 * the next pull takes. mu is held by whoever fills, submits or takes from
 * a batch; it is taken before the table's mu, never while holding it. */
struct sp_prefetch {
    pthread_mutex_t mu;
    atomic_bool off;       /* no io_uring: hints are ignored */
    struct sp_batch b[2];
    unsigned cur;
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
    int slot_dtype;     /* the slots': 0 (float32) or PS_HALF_F16 / PS_HALF_BF16 */
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
    /* Every row outside the RAM tier's pending changes: id -> where its
     * record is (sparse_index.c), built by sparse_ready from the catalog. */
    struct sp_index ix;
    uint8_t *cms;     /* admission counts, CMS_DEPTH x CMS_WIDTH */
    uint64_t evicts;        /* rows the sweeps deleted: a cold read begun
                               before one is done again (sparse_cold.c) */
    uint64_t drops;         /* entries that left the RAM tier: while it and
                               the applied mark stand still, a second pass
                               has nothing to read (sparse_cold_settle) */
    int64_t sweep_from;     /* where the next TTL sweep starts */
    int64_t last_sweep_ms;
    uint64_t sweep_clock;   /* the table's clock at the last sweep */
    struct sp_prefetch pf;  /* its own mutex (sparse_cold.c) */
};

struct psd_sparse {
    psd_store *store;
    char *data_dir;
    uint64_t memory_limit, map_size;
    struct psd_assist *assist; /* the shard's, lent (NULL: none) */

    /* The attached tables; taken after the shard's table_lock, before a
     * table's mu. */
    pthread_mutex_t tables_mu;
    psd_sparse_table *tables;

    /* Counters: bytes of the RAM tier, rows changed and not committed,
     * rows admitted, evicted, not admitted, pulled, pushed, read cold (from
     * the segments, or an unconverted row from LMDB), read from the
     * segments; the LMDB pages the applier's transaction holds now. */
    atomic_uint_fast64_t ram, dirty, admitted, evicted, not_admitted, pulled, pushed,
        read_cold, seg_reads, ram_hits, ram_misses, apply_pages, log_batches, refused_rows;
    /* Prefetches (sparse_cold.c): the bytes of the tables' batch buffers
     * (in sparse_ram_cost), rows read ahead, of them those a call took,
     * and of those the ones read again: the row changed meanwhile. */
    atomic_uint_fast64_t pf_bytes, pf_reads, pf_rows, pf_stale;
    /* The applier's array of the records of the log file it applies (in
     * sparse_ram_cost): 40 bytes a record, up to 35 MiB for a 627 MiB
     * budget's file of fp16 rows. */
    atomic_uint_fast64_t apply_bytes;
    /* float16 row values clamped to +-65504 by an update
     * (Stats.sparse_values_clamped). */
    atomic_uint_fast64_t clamped;
    /* The bytes of the stored rows of the ready tables (rows * row_bytes):
     * what they hold against --max-bytes. */
    atomic_uint_fast64_t row_bytes;
    /* The bytes of the ready tables' indexes of rows (sparse_index.c),
     * part of what the RAM budget bounds (sparse_ram_cost). */
    atomic_uint_fast64_t index_bytes;
    /* The most pages a catalog transaction of the store dirtied: LMDB
     * mallocs a write transaction's dirty pages and, when it ends, keeps
     * them on its environment's list for the next ones (mdb_dpage_free),
     * never freed before the store closes (sparse_txn_pages). */
    atomic_uint_fast64_t dpages_kept;
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

    /* The segment files (segment.h): appended to by one thread at a time,
     * the applier's (apply_run_mu held), read by any. seg_mu guards the
     * live bytes of each segment (indexed by its number): those of the
     * records the catalog points at. seg_recount asks the applier to count
     * them again (a table's rows were deleted with it). */
    psd_segs *segs;
    pthread_mutex_t seg_mu;
    uint64_t *seg_live;
    uint32_t seg_cap;
    atomic_uint_fast64_t live_bytes, converted;
    atomic_bool seg_recount;
    atomic_bool seg_full;   /* the last append found no room (PS_EFULL) */
    uint64_t segment_size, compact_rate;
    struct sp_compact *compact; /* the applier's (sparse_compact.c) */
    atomic_uint_fast64_t compacted, segs_removed;
    /* The segment a compaction step is copying records from (0: none),
     * set from before the step asks the indexes which records are live
     * until after it pointed them at the copies, or, when it could not,
     * until "cat_upto" is past the copies: a sweep leaves the rows whose
     * record is there to its next pass (sparse_rows.c). */
    atomic_uint_fast32_t compact_seg;
    /* Tests only (check_sparse): called by a compaction step with its
     * copies synced, before their relocation commits, so that a test can
     * put a sweep there; not 0: the relocation fails with it, as with a
     * full map that cannot grow. NULL in psd. */
    int (*compact_copied)(psd_sparse *sp);
    /* Tests only (check_sparse): called by a pull or a push between its
     * first pass of cold reads, made without the tables' mutexes, and
     * their check under them (sparse_cold_settle), so that a test can put
     * a sweep there. NULL in psd. */
    void (*cold_read)(psd_sparse *sp);

    /* The catalog queue (sparse_seg.c): locations the applier and
     * compaction committed (with segs_end, the commit point) and pointed
     * the indexes at, not yet written into the rows db; apply_run_mu.
     * A write takes the whole queue, its first catw_n entries, sorted,
     * with the end they cover (catw_upto, 0: no write under way), and
     * writes them a transaction per sparse_cat_step (the applier's,
     * between its rounds of room) or all at once (sparse_cat_flush), from
     * catw_k on; its last transaction moves "cat_upto" to catw_upto.
     * Entries queued meanwhile follow them in the array. The queue holds
     * at most sparse_catq_max entries: past that it is dropped (catq_lost)
     * and nothing more is queued, and the next write reads the records
     * between "cat_upto" and its end from the segments instead (catw_scan:
     * from catw_from, a chunk of at most sparse_catq_max entries at a
     * time in the same array, catw_scanned records so far). */
    struct sp_catq *catq;
    size_t catq_n, catq_cap, catw_n, catw_k;
    uint64_t catw_upto;
    bool catw_all;
    bool catq_lost, catw_scan;
    psd_seg_loc catw_from;
    uint64_t catw_recs, catw_scanned;
    bool cat_roomy; /* no RAM tier to keep (open): a chunk may take half
                       the budget */
    size_t cat_txn_pages; /* a write's transaction's leaf pages at most (0:
                             from the budget; tests set a few) */
    struct sp_cat_ahead *cat_ahead; /* threads reading the write's next pages ahead */
    /* Applied entries not in the catalog yet (Stats): those queued, or,
     * the queue dropped, the records committed since "cat_upto". */
    atomic_size_t catq_len;
    atomic_uint_fast64_t catq_bytes; /* catq_cap's, in sparse_ram_cost */
    atomic_uint_fast64_t cat_upto; /* "cat_upto" as last committed (packed) */
    int64_t cat_logged_ms;   /* the last failure said (once a minute) */
    atomic_bool cat_asap;    /* a sweep wants the catalog written */
    /* Tables detached (deleted, or replaced by a restore), counted; and
     * the count when the last write of the ready tables' entries began
     * (catw_gone), once it is done. While they differ, records past
     * "cat_upto" may be of a table that went, which an open (no table
     * ready yet) would replay as rows of no variable: a clean stop writes
     * the catalog whole then. */
    atomic_uint_fast64_t tables_gone;
    uint64_t catw_gone, cat_gone_done;
};

/* sparse.c */
uint64_t sparse_budget(const psd_sparse *sp);
/* The RAM tier's rows, the indexes of rows, the catalog's queue and the
 * dirty pages LMDB holds (a page per row of the open transaction, or what
 * it keeps of the largest one): what the budget bounds. */
uint64_t sparse_ram_cost(const psd_sparse *sp);
/* A catalog transaction of the store has dirtied about pages pages so
 * far: counted now, and kept counted (LMDB keeps them) when it is the
 * largest yet. */
void sparse_txn_pages(psd_sparse *sp, uint64_t pages);
/* Dirty pages per catalog transaction (a page a row at worst): what
 * LMDB keeps after it. */
size_t sparse_txn_rows(const psd_sparse *sp);
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
/* The table's part of sp->ram: its entries and its hash's buckets. */
uint64_t sparse_table_ram(const psd_sparse_table *t);
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
/* Fetches an entry and the first lines of its row into the cache. */
void sparse_prefetch_entry(const struct sp_entry *e);

/* sparse_rows.c: with t->mu held. */
int sparse_ready(psd_sparse *sp, psd_sparse_table *t);
/* id's RAM entry (its clock bit set), or NULL; counts a hit or a miss. */
struct sp_entry *sparse_get(psd_sparse *sp, psd_sparse_table *t, int64_t id);
/* e, found: its clock bit set and a hit counted, as sparse_get does. */
struct sp_entry *sparse_hit(psd_sparse *sp, struct sp_entry *e);
int sparse_sweep(psd_sparse *sp, psd_sparse_table *t, uint64_t clock);

/* sparse_cold.c: the rows of a call that are not in the RAM tier, read
 * from the store in one batch. sparse_cold_read_next without t->mu, before
 * the call takes it: slot[i] says where ids[i]'s row was read to (-1: not
 * read). sparse_cold_remap moves the slots to the distinct ids of a push
 * (which[i] the distinct index of ids[i]). sparse_cold_settle, with t->mu
 * held, reads what the first pass could not know: rows that left the RAM
 * tier since (none while no entry left it: then it reads nothing), and
 * all of them again when an apply or a sweep may have changed what it
 * read. sparse_cold_row: ids[i]'s stored bytes (value at
 * + SPARSE_ROW_HEAD) or NULL when it has no row outside the RAM tier. */
struct sp_cold {
    int32_t *slot;       /* (n) */
    size_t n;
    uint8_t *rows;       /* (nslots * row_bytes) */
    uint8_t *have;       /* (nslots) */
    uint64_t *vloc;      /* (nslots) a row read ahead: the packed location it
                            was read from, checked by settle (0: read here) */
    size_t nslots, cap;
    uint64_t applied, evicts, drops; /* when the first pass began */
    size_t left;         /* ids it left to a batch of another call */
    /* The lowest index gen among the batches its rows read ahead came
     * from (UINT64_MAX: none): while the index's gen is still that, each
     * such row's location is the index's, and settle need not ask. */
    uint64_t ixgen;
    /* (n) the RAM entry the first pass found for ids[i], or NULL (none
     * then); NULL when the pass looked up nothing or was not asked to
     * keep them. An entry leaves the
     * tier only through sparse_entry_drop, which counts t->drops: while
     * t->drops is still c->drops, each pointer is live and still ids[i]'s,
     * and the serve loop takes it rather than look the id up again
     * (sparse_cold_entry). */
    struct sp_entry **ent;
};
/* sparse_cold_read_next: the first pass; a pull or a push that knows the
 * ids of its table's next call passes them, next[0..nnext) (none: nnext
 * 0): the reads of those not in the RAM tier and not among ids are
 * submitted first, before the call waits for the batch the last call
 * submitted, and left in flight (two batches a table, each at
 * most PSD_SEG_AREAD_MAX reads and a sixteenth of the RAM budget); the
 * table's next call takes the rows it wants from the batch as its own
 * cold rows. A call without a hint takes from the batches in flight the
 * rows it needs (and drops them). entries: keep the RAM entries found in
 * c->ent (a pull; a push, whose rows go by distinct id, does not). */
int sparse_cold_read_next(psd_sparse *sp, psd_sparse_table *t, const int64_t *ids, size_t n,
                          const int64_t *next, size_t nnext, bool entries, struct sp_cold *c);
/* A table's prefetch: made with it; ended (its batch waited for, its
 * buffer uncounted from sp) when it leaves its tier; freed with it. */
void sparse_prefetch_init(psd_sparse_table *t);
void sparse_prefetch_end(psd_sparse *sp, psd_sparse_table *t);
void sparse_prefetch_free(psd_sparse_table *t);
int sparse_cold_remap(struct sp_cold *c, const size_t *which, size_t nu);
int sparse_cold_settle(psd_sparse *sp, psd_sparse_table *t, const int64_t *ids,
                       struct sp_cold *c);
const uint8_t *sparse_cold_row(const psd_sparse_table *t, const struct sp_cold *c, size_t i);
/* ids[i]'s RAM entry as sparse_get finds it (and counts it), from what the
 * first pass found while no entry left the tier since; the next ids'
 * entries fetched into the cache as sparse_ahead does. t->mu held. */
struct sp_entry *sparse_cold_entry(psd_sparse *sp, psd_sparse_table *t, const struct sp_cold *c,
                                   const int64_t *ids, size_t i, size_t n);
void sparse_cold_free(struct sp_cold *c);

/* sparse_seg.c: the segments and the catalog. An entry of the store's
 * "rows" db is a catalog entry of SPARSE_CAT_LEN bytes (never the length
 * of a row, a multiple of 4) or, not converted yet, the row's bytes. */
#define SPARSE_CAT_LEN 33
struct sp_cat {
    psd_seg_loc loc;
    uint64_t version;   /* the row log batch that wrote it (0: converted) */
    uint64_t last_step;
};
bool sparse_cat_decode(const void *data, size_t len, struct sp_cat *c);
/* The last step of a stored entry (catalog entry or row). */
uint64_t sparse_stored_last_step(const void *data, size_t len);
/* A write transaction of the catalog: what it changes in the segments'
 * live bytes is counted once it commits. set_end: it points rows at
 * records just synced, and moves "segs_end" to the segments' end (only
 * the appender's transactions: apply_run_mu held). */
struct sp_catw {
    psd_sparse *sp;
    psd_store_txn *t;
    int64_t *delta;     /* (ndelta) per segment number */
    uint32_t ndelta;
    bool set_end;
    bool no_live;       /* its entries were counted when queued */
};
int sparse_catw_begin(psd_sparse *sp, struct sp_catw *w, bool set_end);
/* Points row id at c. Returns 0 or the store's error. */
int sparse_cat_set(struct sp_catw *w, uint32_t var_id, int64_t id, const struct sp_cat *c);
/* One queued catalog entry; moved: a relocation, whose version and last
 * step are those of the row's entry before it. */
struct sp_catq {
    uint32_t var_id;
    bool moved;
    int64_t id;
    psd_seg_loc loc;
    uint64_t version, last_step, ord;
};
/* Room for n more entries in the queue, so that adding them after a
 * commit cannot fail: 0 or -ENOMEM. Past sparse_catq_max entries the
 * queue is dropped instead (the next write reads the records), and while
 * it is, sparse_catq_add only counts. apply_run_mu held. */
int sparse_catq_reserve(psd_sparse *sp, size_t n);
void sparse_catq_add(psd_sparse *sp, const struct sp_catq *e);
/* Drops the queue (and a write of it under way): the next write reads
 * the records past "cat_upto" instead. apply_run_mu held. */
void sparse_cat_drop(psd_sparse *sp);
/* While pushes run, the catalog is written only once the records past
 * "cat_upto" (the span an open replays) pass this many bytes. */
#define SPARSE_CAT_SPAN ((uint64_t)1 << 30)
/* The bytes of records between "cat_upto" and the segments' end: what
 * an open would replay. The appender's thread (apply_run_mu held). */
uint64_t sparse_cat_span(psd_sparse *sp);
/* Whether the catalog is to be written while pushes run: its span past
 * SPARSE_CAT_SPAN, or its entries not written yet near the room left in
 * the store's file (a capped map or a small disk: found full while
 * pushes can still be refused, not at the next open). must: past twice
 * that, when nothing more is applied before the catalog is written.
 * apply_run_mu held. */
bool sparse_cat_due(psd_sparse *sp, bool must);
/* Writes the queue into the rows db in key order, in bounded
 * transactions (the last moves "cat_upto" to the segments' end), the
 * entries of the ready tables only, or of every table when all (at open,
 * before any): a write under way first, then the rest. apply_run_mu held.
 * Returns 0 or the store's error (the queue kept: written again next
 * time). */
int sparse_cat_flush(psd_sparse *sp, bool all);
/* sparse_cat_flush, but beginning no transaction at or after until
 * (ps_now_ms; 0: no bound): a write cut short keeps the transactions it
 * committed and "cat_upto" where it was (the next open replays the
 * records past it; a later record of a row wins), and is taken up again
 * from where it stands by the next write. */
int sparse_cat_flush_until(psd_sparse *sp, bool all, int64_t until);
/* Whether anything is left to write: queued entries, or a committed end
 * the catalog's mark has not reached. apply_run_mu held. */
bool sparse_cat_behind(psd_sparse *sp);
/* Whether the write under way, or else the next one, reads the records
 * past "cat_upto" from the segments (the queue was dropped). apply_run_mu
 * held. */
bool sparse_cat_reads(const psd_sparse *sp);
/* One transaction of the queue's write (begun, when none is under way,
 * with the whole queue): the applier's, so that a round of room waits
 * for one transaction, not a whole write. *busy: more of the write is
 * left. apply_run_mu held. Returns 0 or the store's error (kept, tried
 * again next step). */
int sparse_cat_step(psd_sparse *sp, bool *busy);
/* Waits for the threads reading the write's next pages ahead, if any
 * (before the write's entries are freed). apply_run_mu held. */
void sparse_cat_ahead_end(psd_sparse *sp);
/* Whether record loc lies before "cat_upto": never replayed at open. Any
 * thread. */
bool sparse_cat_covers(psd_sparse *sp, psd_seg_loc loc);
/* Whether "cat_upto" is at or past end: the catalog holds every record
 * before it. Any thread. */
bool sparse_cat_reaches(psd_sparse *sp, psd_seg_loc end);
/* The queue's entries at most, and a chunk of a write that reads the
 * records. */
size_t sparse_catq_max(const psd_sparse *sp);
/* Counts record now live and record gone (len 0: none) dead once the
 * transaction commits: a change the catalog gets later, from the queue. */
void sparse_catw_live(struct sp_catw *w, psd_seg_loc gone, psd_seg_loc now);
/* Counts a stored entry the transaction deletes as dead. */
void sparse_cat_gone(struct sp_catw *w, const void *data, size_t len);
int sparse_catw_commit(struct sp_catw *w);
void sparse_catw_abort(struct sp_catw *w);
/* Commits when rc is 0, else aborts: the commit's result, or rc. */
int sparse_catw_end(struct sp_catw *w, int rc);
/* Compaction's relocation of n rows, in one transaction, each only when
 * the catalog still points at old (apply_run_mu held: the caller is the
 * appender, and synced the new records), keeping the entry's version and
 * last step; then the indexes, where they still point at old. *moved: the
 * rows moved. A cold read that took a location before the relocation
 * still reads the old record (sparse_cold.c reads outside the table's
 * mutex): a segment may go only once no read begun before that is in
 * flight. */
struct sp_move {
    uint32_t var_id;
    int64_t id;
    psd_seg_loc old_loc, new_loc;
};
int sparse_relocate(psd_sparse *sp, const struct sp_move *mv, size_t n, size_t *moved);
/* Opens the segments at the committed end the store records, counts the
 * live bytes and converts rows still held in LMDB (psd_sparse_open). A
 * segment that is corrupt or truncated: PS_ECORRUPT, named (file and
 * offset) in why when given, else in the log. */
int sparse_segs_open(psd_sparse *sp, char *why, size_t whylen);
/* Counts the live bytes of each segment again from the catalog. */
int sparse_seg_recount(psd_sparse *sp);
/* Moves rows held in LMDB into the segments (apply_run_mu held). */
int sparse_convert(psd_sparse *sp);
/* Replaces the catalog entries of the store copy ck by the rows' bytes
 * read from the segments: a checkpoint holds its rows. */
int sparse_ckpt_materialize(psd_sparse *sp, psd_store *ck);
/* Dead bytes: of the segments, those of no row. */
uint64_t sparse_dead_bytes(psd_sparse *sp);

/* sparse_index.c: each table's index of its stored rows, with t->mu held
 * (but sparse_index_apply, which takes it). A packed location (0: none)
 * is a record of the table's fixed length rec_len, or SPARSE_LOC_LMDB:
 * read the catalog in LMDB (a row not converted yet, or a record the
 * packing does not fit). */
#define SPARSE_LOC_LMDB ((uint64_t)1)
/* What a scan's callback returns past the rows it wants. */
#define SPARSE_SCAN_END (-ECANCELED)
uint64_t sparse_loc_pack(psd_seg_loc l, uint64_t rec_len);
psd_seg_loc sparse_loc_unpack(uint64_t p, uint64_t rec_len);
/* id's packed location, or 0 when the table has no stored row of id. */
uint64_t sparse_index_get(const psd_sparse_table *t, int64_t id);
void sparse_index_prefetch(const psd_sparse_table *t, int64_t id);
/* Inserts or replaces: 0, or -ENOMEM (full, and it could not grow). */
int sparse_index_set(psd_sparse_table *t, int64_t id, uint64_t loc);
/* Replaces id's location only while it is old: whether it did. */
bool sparse_index_replace(psd_sparse_table *t, int64_t id, uint64_t old, uint64_t loc);
void sparse_index_del(psd_sparse_table *t, int64_t id);
/* Room for more new ids without growing: 0 or -ENOMEM. */
int sparse_index_reserve(psd_sparse_table *t, size_t more);
uint64_t sparse_index_bytes(const psd_sparse_table *t);
void sparse_index_free(psd_sparse_table *t);
/* Builds t's index from the catalog (rows: its size, to reserve; *found:
 * the rows it holds). Returns 0, -ENOMEM or the store's error. */
int sparse_index_build(psd_sparse *sp, psd_sparse_table *t, uint64_t rows, uint64_t *found);
/* A change a writer committed, for the index of the ready table of var_id:
 * loc (only while it holds *only_if, when given), or gone. */
struct sp_ixset {
    uint32_t var_id;
    bool gone;
    int64_t id;
    psd_seg_loc loc;
    const psd_seg_loc *only_if;
    psd_seg_loc was; /* set by a reserve: the record it replaces (len 0: none) */
};
/* Applies n changes (those of a table next to each other) once their
 * transaction committed; reserve: before it, makes room for them instead,
 * so that applying cannot fail. Takes tables_mu and each table's mutex (no
 * transaction may be open in the calling thread). Returns 0 or -ENOMEM. */
int sparse_index_apply(psd_sparse *sp, struct sp_ixset *s, size_t n, bool reserve);
/* Whether the index of the ready table of var_id points row id at loc: 1
 * or 0, or -1 when it cannot say (no such table ready, or a row to ask the
 * catalog for). Takes the locks as sparse_index_apply. */
int sparse_index_holds(psd_sparse *sp, uint32_t var_id, int64_t id, psd_seg_loc loc);

/* sparse_compact.c: the applier, apply_run_mu held, between its applies:
 * a few steps of the compaction of a segment a third dead (the catalog
 * points the moved rows at their copies, and the file goes once the
 * catalog's end is past it), each step under its token bucket. */
void sparse_compact_tick(psd_sparse *sp);
void sparse_compact_free(psd_sparse *sp);

/* sparse_log.c */
int sparse_log_open(psd_sparse *sp, char *why, size_t whylen);
/* The var_ids of the ready tables, sorted (NULL: out of memory). Takes
 * tables_mu; no transaction may be open in this thread. */
uint32_t *sparse_live_ids(psd_sparse *sp, size_t *n);
/* qsort's and bsearch's order of uint32_t. */
int sparse_cmp_u32(const void *a, const void *b);
/* The order of rows in the store: var_id, then id, then the order they
 * came in (ord), for the sorts of the applier and the catalog queue. */
int sparse_cmp_row(uint32_t va, int64_t ia, uint64_t oa, uint32_t vb, int64_t ib, uint64_t ob);
void sparse_applier_stop(psd_sparse *sp);
/* A clean stop's last drain, the applier stopped and no call left: the
 * log applied, then the catalog's queue written for SPARSE_STOP_CAT_MS at
 * most, the rest left to the next open's replay. */
int sparse_stop_drain(psd_sparse *sp);

#endif
