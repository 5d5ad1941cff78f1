/* check_sparse - the sparse tier (server/sparse.h) through its entry
 * points, against a real LMDB store in a temporary directory, without
 * gRPC or a shard: rows inserted by a push and read back by a pull,
 * admission, TTL and max_rows eviction, the caps, the RAM tier's budget,
 * and commits that survive closing the tier, with and without the row log
 * applied (its replay); the segment files: cold reads from them, their
 * live and dead bytes, a corrupt or truncated one refused, and rows a
 * directory of an older psd held in LMDB moved into them; rows read ahead
 * for a call's hint of the next call's ids that a sweep deleted or a push
 * changed before the next call took them. The flusher's part is played
 * by the test: flush, committed, drain, maintain, as persist.c calls
 * them. */
#include "common/clock.h"
#include "common/errors.h"
#include "common/half.h"
#include "proto/ps.pb-c.h"
#include "server/assist.h"
#include "server/sparse.h"
#include "server/sparse_internal.h" /* the catalog's write, a transaction at a time */
#include "server/store.h"

#include "tests/unit/pscheck.h"

#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM 4

/* A store and its tier with one table, as a shard holds them. */
struct fx {
    psd_store *store;
    psd_sparse *sp;
    psd_sparse_table *t;
    Ps__V1__VariableSpec spec;
    Ps__V1__Initializer init;
    Ps__V1__Optimizer opt;
    int64_t shape[1];
    psd_opt o;
    psd_assist *assist; /* lent to the tier, as the shard lends its own */
};

static void spec_make(struct fx *f, const char *name, uint32_t admit_after, uint64_t ttl,
                      uint64_t max_rows)
{
    ps__v1__variable_spec__init(&f->spec);
    ps__v1__initializer__init(&f->init);
    ps__v1__optimizer__init(&f->opt);
    f->shape[0] = DIM;
    f->spec.name = (char *)name;
    f->spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    f->spec.n_shape = 1;
    f->spec.shape = f->shape;
    f->spec.sparse = true;
    f->spec.consistency = PS__V1__CONSISTENCY__ASYNC;
    f->spec.admit_after = admit_after;
    f->spec.ttl_steps = ttl;
    f->spec.max_rows = max_rows;
    f->init.kind = PS__V1__INITIALIZER__KIND__ZEROS;
    f->opt.kind = PS__V1__OPTIMIZER__KIND__SGD;
    f->opt.learning_rate = 1.0f;
    f->spec.initializer = &f->init;
    f->spec.optimizer = &f->opt;
    f->o = (psd_opt){.kind = PSD_OPT_SGD, .lr = 1.0f};
    psd_opt_defaults(&f->o);
    f->o.lr = 1.0f;
}

/* The tier's --segment-size (0: its default); a test that sets it sets it
 * back to 0 (under valgrind the tests share one process). */
static uint64_t fx_segment_size;

/* Opens the store and the tier (memory_limit and max_rows as given) and
 * the table, its record written to the store as CreateVariable does. */
static void fx_open(struct fx *f, uint64_t memory_limit, uint64_t max_rows, bool record)
{
    ck_assert_int_eq(psd_store_open(tmpdir, 0, 0, &f->store), 0);
    struct psd_sparse_conf c = {.store = f->store, .data_dir = tmpdir,
                                .memory_limit = memory_limit, .max_rows = max_rows,
                                .segment_size = fx_segment_size};
    ck_assert_int_eq(psd_sparse_open(&c, &f->sp), 0);
    ck_assert_int_eq(psd_assist_start(&f->assist), 0);
    psd_sparse_set_assist(f->sp, f->assist);
    char why[256];
    ck_assert_int_eq(psd_sparse_validate(&f->spec, why, sizeof why), 0);
    if (record) {
        size_t len = ps__v1__variable_spec__get_packed_size(&f->spec);
        uint8_t *blob = malloc(len);
        ps__v1__variable_spec__pack(&f->spec, blob);
        float value[DIM] = {0};
        psd_var_rec r = {.name = f->spec.name, .spec = blob, .spec_len = len,
                         .value = value, .n = DIM};
        psd_store_txn *txn;
        ck_assert_int_eq(psd_store_begin(f->store, &txn), 0);
        ck_assert_int_eq(psd_store_put(txn, &r), 0);
        ck_assert_int_eq(psd_store_commit(txn), 0);
        free(blob);
    }
    f->t = psd_sparse_table_new(&f->spec, &f->o);
    ck_assert_ptr_nonnull(f->t);
    psd_sparse_attach(f->sp, f->t, 0);
}

static void commit(struct fx *f);

/* Table "emb" with admit_after, ttl_steps and max_rows, in a new tier. */
static void fx_start(struct fx *f, uint32_t admit_after, uint64_t ttl, uint64_t max_rows,
                     uint64_t memory_limit, uint64_t rows_cap)
{
    spec_make(f, "emb", admit_after, ttl, max_rows);
    fx_open(f, memory_limit, rows_cap, true);
}

/* Closes as a clean stop does (drain: a last commit, the log applied) or
 * as a kill leaves it. */
static void fx_close(struct fx *f, bool drain)
{
    if (drain) {
        commit(f);
        ck_assert_int_eq(psd_sparse_stop(f->sp), 0);
    }
    psd_sparse_detach(f->sp, f->t);
    psd_sparse_table_free(f->t);
    psd_sparse_close(f->sp);
    psd_assist_stop(f->assist);
    psd_store_close(f->store);
    f->assist = NULL;
    f->t = NULL;
    f->sp = NULL;
    f->store = NULL;
}

/* Pushes gradient g (each element) to ids at step, naming next[0..nnext)
 * as the table's next call's ids (none: nnext 0): the push's result. */
static int push_next(struct fx *f, const int64_t *ids, size_t n, const int64_t *next,
                     size_t nnext, float g, uint64_t step, uint64_t room, char *why)
{
    float *grad = malloc((n ? n : 1) * DIM * sizeof *grad);
    for (size_t i = 0; i < n * DIM; i++)
        grad[i] = g;
    struct psd_sparse_grad part = {.t = f->t, .ids = ids, .n = n, .grad = grad,
                                   .next = next, .nnext = nnext};
    size_t bad;
    char buf[512];
    int rc = psd_sparse_push(f->sp, &part, 1, step, room, &bad, why ? why : buf, 512);
    free(grad);
    return rc;
}

static int push(struct fx *f, const int64_t *ids, size_t n, float g, uint64_t step,
                uint64_t room, char *why)
{
    return push_next(f, ids, n, NULL, 0, g, step, room, why);
}

static float pull_one(struct fx *f, int64_t id)
{
    float out[DIM];
    uint64_t ins;
    ck_assert_int_eq(psd_sparse_pull(f->sp, f->t, &id, 1, out, true, &ins), 0);
    for (int k = 1; k < DIM; k++)
        ck_assert(out[k] == out[0]);
    return out[0];
}

static Ps__V1__StatsResponse stats(struct fx *f)
{
    Ps__V1__StatsResponse r = PS__V1__STATS_RESPONSE__INIT;
    psd_sparse_stats(f->sp, &r);
    return r;
}

/* The flusher's commit: the batch, then what the rest of it did. */
static void commit(struct fx *f)
{
    bool wrote;
    ck_assert_int_eq(psd_sparse_flush(f->sp, &wrote), 0);
    psd_sparse_committed(f->sp, true);
}

/* The flusher's round after pushes: a commit, the row log applied (the
 * sweeps look in LMDB), the sweeps; then the tier's counts. */
static Ps__V1__StatsResponse settle(struct fx *f)
{
    commit(f);
    ck_assert_int_eq(psd_sparse_drain(f->sp), 0);
    psd_sparse_maintain(f->sp);
    return stats(f);
}

static int64_t *range(int64_t from, size_t n)
{
    int64_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = from + (int64_t)i;
    return ids;
}

/* ---- insert, pull ------------------------------------------------------- */

START_TEST(test_insert)
{
    struct fx f;
    fx_start(&f, 0, 0, 0, 0, 0);
    int64_t ids[] = {5, INT64_MIN, 5, INT64_MAX};
    ck_assert_int_eq(push(&f, ids, 4, 1.0f, 1, UINT64_MAX, NULL), 0);
    ck_assert(pull_one(&f, 5) == -2.0f); /* a repeated id summed */
    ck_assert(pull_one(&f, INT64_MIN) == -1.0f);
    ck_assert(pull_one(&f, INT64_MAX) == -1.0f);
    ck_assert(pull_one(&f, 6) == 0.0f); /* no row: its initial value */
    Ps__V1__StatsResponse r = stats(&f);
    ck_assert_uint_eq(r.sparse_rows, 3);
    ck_assert_uint_eq(r.sparse_admitted, 3);
    ck_assert_uint_eq(r.sparse_rows_unsaved, 3);
    ck_assert_uint_eq(psd_sparse_row_bytes(f.sp), 3 * (16 + DIM * 4));
    commit(&f);
    ck_assert_uint_eq(stats(&f).sparse_rows_unsaved, 0);
    ck_assert_uint_eq(psd_sparse_logged(f.sp), 1);
    fx_close(&f, true);
}
END_TEST

/* An update that would be non-finite refuses the whole push. */
START_TEST(test_nonfinite)
{
    struct fx f;
    fx_start(&f, 0, 0, 0, 0, 0);
    int64_t ids[] = {1, 2, 2};
    char why[512];
    ck_assert_int_eq(push(&f, ids, 3, 3e38f, 1, UINT64_MAX, why), PS_EINVAL_ARG);
    ck_assert_msg(strstr(why, "row 2") && strstr(why, "'emb'"), "%s", why);
    ck_assert(pull_one(&f, 1) == 0.0f);
    ck_assert_uint_eq(stats(&f).sparse_rows, 0);
    fx_close(&f, true);
}
END_TEST

/* ---- admission ---------------------------------------------------------- */

START_TEST(test_admission)
{
    struct fx f;
    fx_start(&f, 3, 0, 0, 0, 0);
    int64_t id = 77;
    ck_assert_int_eq(push(&f, &id, 1, 1.0f, 1, UINT64_MAX, NULL), 0);
    ck_assert_int_eq(push(&f, &id, 1, 1.0f, 2, UINT64_MAX, NULL), 0);
    Ps__V1__StatsResponse r = stats(&f);
    ck_assert_uint_eq(r.sparse_rows, 0);
    ck_assert_uint_eq(r.sparse_not_admitted, 2);
    ck_assert(pull_one(&f, id) == 0.0f);
    ck_assert_int_eq(push(&f, &id, 1, 1.0f, 3, UINT64_MAX, NULL), 0);
    ck_assert_uint_eq(stats(&f).sparse_rows, 1);
    ck_assert(pull_one(&f, id) == -1.0f); /* the third push, once */
    fx_close(&f, true);
}
END_TEST

/* ---- eviction ------------------------------------------------------------ */

START_TEST(test_ttl)
{
    struct fx f;
    fx_start(&f, 0, 5, 0, 0, 0);
    int64_t *old = range(1, 10), fresh[] = {100, 101};
    ck_assert_int_eq(push(&f, old, 10, 1.0f, 1, UINT64_MAX, NULL), 0);
    ck_assert_int_eq(push(&f, fresh, 2, 1.0f, 10, UINT64_MAX, NULL), 0);
    Ps__V1__StatsResponse r = settle(&f);
    ck_assert_uint_eq(r.sparse_rows, 2);
    ck_assert_uint_eq(r.sparse_evicted, 10);
    ck_assert_uint_eq(psd_sparse_row_bytes(f.sp), 2 * (16 + DIM * 4));
    ck_assert(pull_one(&f, 1) == 0.0f);
    ck_assert(pull_one(&f, 100) == -1.0f);
    free(old);
    fx_close(&f, true);
}
END_TEST

START_TEST(test_max_rows)
{
    struct fx f;
    fx_start(&f, 0, 0, 5, 0, 0);
    for (int64_t id = 1; id <= 10; id++) /* id i last updated at step i */
        ck_assert_int_eq(push(&f, &id, 1, 1.0f, (uint64_t)id, UINT64_MAX, NULL), 0);
    Ps__V1__StatsResponse r = settle(&f);
    ck_assert_uint_eq(r.sparse_rows, 5);
    ck_assert_uint_eq(r.sparse_evicted, 5);
    for (int64_t id = 1; id <= 10; id++) /* the least recently updated went */
        ck_assert(pull_one(&f, id) == (id <= 5 ? 0.0f : -1.0f));
    fx_close(&f, true);
}
END_TEST

/* ---- caps and budget ----------------------------------------------------- */

START_TEST(test_caps)
{
    struct fx f;
    fx_start(&f, 0, 0, 0, 0, 100);
    int64_t *ids = range(0, 150);
    char why[512];
    ck_assert_int_eq(push(&f, ids, 150, 1.0f, 1, UINT64_MAX, why), PS_EFULL);
    ck_assert_msg(strstr(why, "'emb'") && strstr(why, "--max-rows-per-table 100"), "%s", why);
    ck_assert_uint_eq(stats(&f).sparse_rows, 0);
    ck_assert_int_eq(push(&f, ids, 100, 1.0f, 1, UINT64_MAX, NULL), 0);
    /* 100 rows of 32 bytes: 3200 bytes; 10 more need 320 of the room. */
    ck_assert_int_eq(push(&f, ids + 50, 60, 1.0f, 2, 3200 + 319, why), PS_EFULL);
    ck_assert_uint_eq(stats(&f).sparse_rows, 100); /* the cap on rows too */
    ck_assert(pull_one(&f, 50) == -1.0f);          /* nothing of it applied */
    free(ids);
    fx_close(&f, true);
}
END_TEST

/* The budget: the limit less 88 MiB or a fifth of it, whichever is more,
 * at least a quarter of it; 256 MiB with no limit. */
START_TEST(test_budget_share)
{
    const uint64_t mib = 1 << 20;
    const struct {
        uint64_t limit, budget;
    } cases[] = {{0, 256 * mib},
                 {96 * mib, 24 * mib},          /* a quarter */
                 {147 * mib, 59 * mib},         /* less 88 MiB */
                 {440 * mib, 352 * mib},        /* both the same */
                 {634 * mib, 634 * mib - 634 * mib / 5},
                 {4096 * mib, 4096 * mib - 4096 * mib / 5}};
    struct fx f;
    fx_start(&f, 0, 0, 0, 0, 0);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        f.sp->memory_limit = cases[i].limit;
        ck_assert_msg(sparse_budget(f.sp) == cases[i].budget, "limit %llu MiB: %llu MiB",
                      (unsigned long long)(cases[i].limit / mib),
                      (unsigned long long)(sparse_budget(f.sp) / mib));
    }
    f.sp->memory_limit = 0;
    fx_close(&f, true);
}
END_TEST

/* Past the RAM tier's budget a push must commit and make room first; then
 * the tier is back under it (rows stay in LMDB and read back). */
START_TEST(test_budget)
{
    struct fx f;
    fx_start(&f, 0, 0, 0, 1 << 20, 0); /* a budget of 256 KiB */
    int64_t *ids = range(0, 8000);
    for (int k = 0; k < 4; k++) {
        ck_assert_int_eq(push(&f, ids + k * 2000, 2000, 1.0f, 1, UINT64_MAX, NULL), 0);
        if (psd_sparse_needs_commit(f.sp)) {
            commit(&f);
            if (psd_sparse_over_budget(f.sp))
                ck_assert_int_eq(psd_sparse_make_room(f.sp), 0);
        }
    }
    commit(&f);
    ck_assert_int_eq(psd_sparse_make_room(f.sp), 0);
    ck_assert(!psd_sparse_over_budget(f.sp));
    Ps__V1__StatsResponse r = stats(&f);
    ck_assert_uint_le(r.sparse_ram_bytes, 256 << 10);
    ck_assert_uint_eq(r.sparse_rows, 8000);
    for (int64_t id = 0; id < 8000; id += 997)
        ck_assert(pull_one(&f, id) == -1.0f);
    /* The rows the tier dropped were read back from the segments. */
    ck_assert_uint_gt(stats(&f).sparse_rows_read_lmdb, 0);
    ck_assert_uint_gt(stats(&f).sparse_segment_reads, 0);
    /* A whole call of cold rows is one batch, and right. */
    float *out = malloc(8000 * DIM * sizeof *out);
    uint64_t ins;
    ck_assert_int_eq(psd_sparse_pull(f.sp, f.t, ids, 8000, out, true, &ins), 0);
    for (size_t i = 0; i < 8000 * DIM; i++)
        ck_assert(out[i] == -1.0f);
    free(out);
    free(ids);
    fx_close(&f, true);
}
END_TEST

/* The index of stored rows (id -> record) with the RAM tier too small for
 * the table: 3000 rows evicted by TTL out of 6000 (deletions from the
 * index in the middle of its probe runs), then every row read cold and
 * right, the evicted ones created again, and the index's bytes counted in
 * Stats and against the budget. */
START_TEST(test_index)
{
    struct fx f;
    fx_start(&f, 0, 50, 0, 1 << 20, 0); /* ttl 50 steps, a budget of 256 KiB */
    enum { N = 6000 };
    int64_t ids[N];
    for (size_t i = 0; i < N; i++) /* scattered: odd and even interleave */
        ids[i] = (int64_t)((i * 2654435761u) % 1000003) * (i % 2 ? 1 : -1);
    for (int k = 0; k < 2; k++) /* old rows at odd i (step 1), fresh at even */
        for (size_t i = 0; i < N; i += 500) {
            int64_t part[250];
            for (size_t j = 0; j < 250; j++)
                part[j] = ids[i + 2 * j + (k == 0)];
            ck_assert_int_eq(push(&f, part, 250, 1.0f, k == 0 ? 1 : 100, UINT64_MAX, NULL),
                             0);
            commit(&f);
            ck_assert_int_eq(psd_sparse_make_room(f.sp), 0);
        }
    Ps__V1__StatsResponse r = settle(&f);
    ck_assert_uint_eq(r.sparse_evicted, N / 2);
    ck_assert_uint_eq(r.sparse_rows, N / 2);
    ck_assert_uint_gt(r.sparse_index_bytes, N / 2 * 16);
    ck_assert_uint_le(r.sparse_index_bytes + r.sparse_ram_bytes, 256 << 10);
    float *out = malloc(N * DIM * sizeof *out);
    uint64_t ins;
    ck_assert_int_eq(psd_sparse_pull(f.sp, f.t, ids, N, out, true, &ins), 0);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(out[i * DIM] == (i % 2 ? 0.0f : -1.0f), "row %lld: %g",
                      (long long)ids[i], out[i * DIM]);
    ck_assert_uint_gt(stats(&f).sparse_segment_reads, N / 4);
    /* The evicted rows again: new rows, stored and read back cold. */
    for (size_t i = 1; i < N; i += 500) {
        int64_t part[250];
        for (size_t j = 0; j < 250; j++)
            part[j] = ids[i + 2 * j];
        ck_assert_int_eq(push(&f, part, 250, 2.0f, 120, UINT64_MAX, NULL), 0);
        commit(&f);
        ck_assert_int_eq(psd_sparse_make_room(f.sp), 0);
    }
    ck_assert_uint_eq(settle(&f).sparse_rows, N);
    ck_assert_int_eq(psd_sparse_pull(f.sp, f.t, ids, N, out, true, &ins), 0);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(out[i * DIM] == (i % 2 ? -2.0f : -1.0f), "row %lld: %g",
                      (long long)ids[i], out[i * DIM]);
    free(out);
    fx_close(&f, true);
    /* Built again from the catalog at the next open. */
    fx_open(&f, 1 << 20, 0, false);
    float one[DIM];
    ck_assert_int_eq(psd_sparse_pull(f.sp, f.t, &ids[7], 1, one, true, &ins), 0);
    ck_assert(one[0] == -2.0f);
    ck_assert_uint_eq(stats(&f).sparse_rows, N);
    fx_close(&f, true);
}
END_TEST

/* ---- commit and reopen ---------------------------------------------------- */

static void reopen_case(bool drain)
{
    struct fx f;
    fx_start(&f, 0, 0, 0, 0, 0);
    int64_t ids[] = {3, 4, 4};
    ck_assert_int_eq(push(&f, ids, 3, 1.0f, 1, UINT64_MAX, NULL), 0);
    commit(&f);
    ck_assert_int_eq(push(&f, ids, 1, 1.0f, 2, UINT64_MAX, NULL), 0); /* not committed */
    fx_close(&f, drain);
    fx_open(&f, 0, 0, false);
    ck_assert(pull_one(&f, 4) == -2.0f);
    /* A clean stop applied the last change too; after a kill only the
     * committed batch is back (the row log's replay). */
    ck_assert(pull_one(&f, 3) == (drain ? -2.0f : -1.0f));
    ck_assert_uint_eq(stats(&f).sparse_rows, 2);
    fx_close(&f, true);
}

START_TEST(test_reopen_clean)
{
    reopen_case(true);
}
END_TEST

START_TEST(test_reopen_replay)
{
    reopen_case(false);
}
END_TEST

/* The catalog is written behind the applies (a queue, sparse_seg.c): a
 * kill after an apply whose entries were not written yet leaves records
 * past "cat_upto", which the next open replays into the catalog. Rows a
 * sweep deleted before stay deleted; rows pushed again after it, and every
 * row of the apply, read back with their last values. The applier thread
 * applies the log 2 s after a commit and writes the queue 2 s after that:
 * the kill falls between. */
START_TEST(test_catalog_replay)
{
    struct fx f;
    fx_start(&f, 0, 50, 0, 0, 0); /* ttl 50 steps */
    int64_t *old = range(0, 100), *kept = range(100, 100);
    ck_assert_int_eq(push(&f, old, 100, 1.0f, 1, UINT64_MAX, NULL), 0);
    ck_assert_int_eq(push(&f, kept, 100, 1.0f, 100, UINT64_MAX, NULL), 0);
    ck_assert_uint_eq(settle(&f).sparse_evicted, 100); /* 0..99, the catalog written */
    ck_assert_int_eq(psd_sparse_start(f.sp), 0);
    /* 0..9 again (new rows), 150..159 a second time. */
    ck_assert_int_eq(push(&f, old, 10, 1.0f, 120, UINT64_MAX, NULL), 0);
    ck_assert_int_eq(push(&f, kept + 50, 10, 1.0f, 120, UINT64_MAX, NULL), 0);
    commit(&f);
    Ps__V1__StatsResponse r = stats(&f);
    for (int i = 0; i < 1000 && r.sparse_log_bytes > 0; i++) {
        usleep(10000);
        r = stats(&f);
    }
    ck_assert_uint_eq(r.sparse_log_bytes, 0);      /* applied */
    ck_assert_uint_eq(r.sparse_catalog_queued, 20); /* not in the catalog yet */
    fx_close(&f, false); /* a kill: no drain, no catalog write */
    ck_assert_int_eq(psd_store_open(tmpdir, 0, 0, &f.store), 0);
    uint32_t var_id;
    uint64_t upto, end;
    ck_assert_int_eq(psd_store_var_id(f.store, "emb", &var_id), 0);
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_CAT_UPTO, &upto), 0);
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_SEGS_END, &end), 0);
    ck_assert_uint_lt(upto, end); /* applied records the catalog does not hold */
    psd_store_rtxn *rt;
    const void *d;
    size_t len;
    ck_assert_int_eq(psd_store_rbegin(f.store, &rt), 0);
    ck_assert_int_eq(psd_store_row_get(rt, var_id, 3, &d, &len), PS_ENOTFOUND);
    psd_store_rend(rt);
    psd_store_close(f.store);
    fx_open(&f, 0, 0, false);
    ck_assert_uint_eq(stats(&f).sparse_rows, 100 + 10);
    int64_t *all = range(0, 200);
    float out[200 * DIM];
    uint64_t ins;
    ck_assert_int_eq(psd_sparse_pull(f.sp, f.t, all, 200, out, true, &ins), 0);
    for (int64_t id = 0; id < 200; id++) {
        float want = id < 10 ? -1.0f : id < 100 ? 0.0f : id >= 150 && id < 160 ? -2.0f : -1.0f;
        ck_assert_msg(out[id * DIM] == want, "row %lld: %g, expected %g", (long long)id,
                      out[id * DIM], want);
    }
    ck_assert_uint_eq(ins, 0);
    ck_assert_int_eq(psd_store_rbegin(f.store, &rt), 0); /* replayed into the catalog */
    ck_assert_int_eq(psd_store_row_get(rt, var_id, 3, &d, &len), 0);
    ck_assert_int_eq(psd_store_row_get(rt, var_id, 50, &d, &len), PS_ENOTFOUND);
    psd_store_rend(rt);
    free(all);
    free(old);
    free(kept);
    fx_close(&f, true);
}
END_TEST

/* The applier writes the catalog's queue a transaction per turn
 * (sparse_cat_step): a kill part-way leaves "cat_upto" where it was and
 * some of the rows' entries written, and the next open replays the rest.
 * Then a step's write and entries queued after it began: each row ends at
 * its last record. */
START_TEST(test_catalog_step)
{
    struct fx f;
    fx_start(&f, 0, 0, 0, (uint64_t)64 << 20, 0);
    f.sp->cat_txn_pages = 8; /* a few hundred rows a transaction */
    int64_t *ids = range(0, 2000);
    ck_assert_int_eq(push(&f, ids, 2000, 1.0f, 1, UINT64_MAX, NULL), 0);
    commit(&f);
    ck_assert_int_eq(psd_sparse_start(f.sp), 0);
    Ps__V1__StatsResponse r = stats(&f);
    for (int i = 0; i < 1000 && r.sparse_log_bytes > 0; i++) {
        usleep(10000);
        r = stats(&f);
    }
    sparse_applier_stop(f.sp); /* before it writes the queue, 2 s after the apply */
    ck_assert_uint_eq(stats(&f).sparse_catalog_queued, 2000);
    uint64_t upto0, upto, end;
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_CAT_UPTO, &upto0), 0);
    bool busy = false;
    pthread_mutex_lock(&f.sp->apply_run_mu);
    ck_assert_int_eq(sparse_cat_step(f.sp, &busy), 0);
    pthread_mutex_unlock(&f.sp->apply_run_mu);
    ck_assert(busy);
    ck_assert_uint_eq(stats(&f).sparse_catalog_queued, 2000); /* until all are in */
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_CAT_UPTO, &upto), 0);
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_SEGS_END, &end), 0);
    ck_assert_uint_eq(upto, upto0);
    ck_assert_uint_lt(upto, end);
    uint32_t var_id;
    psd_store_rtxn *rt;
    const void *d;
    size_t len;
    ck_assert_int_eq(psd_store_var_id(f.store, "emb", &var_id), 0);
    ck_assert_int_eq(psd_store_rbegin(f.store, &rt), 0);
    ck_assert_int_eq(psd_store_row_get(rt, var_id, 0, &d, &len), 0); /* the first few */
    ck_assert_int_eq(psd_store_row_get(rt, var_id, 1999, &d, &len), PS_ENOTFOUND);
    psd_store_rend(rt);
    fx_close(&f, false); /* a kill */

    fx_open(&f, (uint64_t)64 << 20, 0, false);
    f.sp->cat_txn_pages = 8;
    ck_assert_uint_eq(stats(&f).sparse_rows, 2000);
    ck_assert_uint_eq(stats(&f).sparse_catalog_queued, 0); /* replayed and written */
    /* A write under way, then the rows 0..9 and 1990..1999 changed again,
     * applied and queued behind it. */
    ck_assert_int_eq(push(&f, ids, 2000, 1.0f, 2, UINT64_MAX, NULL), 0);
    commit(&f);
    ck_assert_int_eq(psd_sparse_drain(f.sp), 0);
    ck_assert_int_eq(push(&f, ids, 2000, 1.0f, 3, UINT64_MAX, NULL), 0);
    commit(&f);
    ck_assert_int_eq(psd_sparse_start(f.sp), 0);
    r = stats(&f);
    for (int i = 0; i < 1000 && r.sparse_log_bytes > 0; i++) {
        usleep(10000);
        r = stats(&f);
    }
    sparse_applier_stop(f.sp);
    pthread_mutex_lock(&f.sp->apply_run_mu);
    ck_assert_int_eq(sparse_cat_step(f.sp, &busy), 0);
    pthread_mutex_unlock(&f.sp->apply_run_mu);
    ck_assert(busy);
    ck_assert_int_eq(push(&f, ids, 10, 1.0f, 4, UINT64_MAX, NULL), 0);
    ck_assert_int_eq(push(&f, ids + 1990, 10, 1.0f, 4, UINT64_MAX, NULL), 0);
    commit(&f);
    ck_assert_int_eq(psd_sparse_drain(f.sp), 0); /* the write under way, then the rest */
    ck_assert_uint_eq(stats(&f).sparse_catalog_queued, 0);
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_CAT_UPTO, &upto), 0);
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_SEGS_END, &end), 0);
    ck_assert_uint_eq(upto, end);
    fx_close(&f, false); /* nothing to replay: the catalog holds every row */
    fx_open(&f, (uint64_t)64 << 20, 0, false);
    float out[2000 * DIM];
    uint64_t ins;
    ck_assert_int_eq(psd_sparse_pull(f.sp, f.t, ids, 2000, out, true, &ins), 0);
    for (int64_t id = 0; id < 2000; id++) {
        float want = id < 10 || id >= 1990 ? -4.0f : -3.0f;
        ck_assert_msg(out[id * DIM] == want, "row %lld: %g, expected %g", (long long)id,
                      out[id * DIM], want);
    }
    ck_assert_uint_eq(ins, 0);
    free(ids);
    fx_close(&f, true);
}
END_TEST

/* Commits, has the applier thread apply the log, and stops it before it
 * writes the catalog (2 s after the apply, the log quiet). */
static void apply_only(struct fx *f)
{
    commit(f);
    ck_assert_int_eq(psd_sparse_start(f->sp), 0);
    Ps__V1__StatsResponse r = stats(f);
    for (int i = 0; i < 1000 && r.sparse_log_bytes > 0; i++) {
        usleep(10000);
        r = stats(f);
    }
    sparse_applier_stop(f->sp);
    ck_assert_uint_eq(r.sparse_log_bytes, 0);
}

/* Whether the catalog in LMDB holds row id of table "emb". */
static bool in_catalog(struct fx *f, int64_t id)
{
    uint32_t var_id;
    psd_store_rtxn *rt;
    const void *d;
    size_t len;
    ck_assert_int_eq(psd_store_var_id(f->store, "emb", &var_id), 0);
    ck_assert_int_eq(psd_store_rbegin(f->store, &rt), 0);
    int rc = psd_store_row_get(rt, var_id, id, &d, &len);
    psd_store_rend(rt);
    ck_assert(rc == 0 || rc == PS_ENOTFOUND);
    return rc == 0;
}

/* Rows [0, n) of "emb" read back value want(id). */
static void expect_rows(struct fx *f, int64_t n, float (*want)(int64_t))
{
    int64_t *ids = range(0, (size_t)n);
    float *out = malloc((size_t)n * DIM * sizeof *out);
    uint64_t ins;
    ck_assert_int_eq(psd_sparse_pull(f->sp, f->t, ids, (size_t)n, out, true, &ins), 0);
    for (int64_t id = 0; id < n; id++)
        ck_assert_msg(out[id * DIM] == want(id), "row %lld: %g, expected %g", (long long)id,
                      out[id * DIM], want(id));
    free(out);
    free(ids);
}

/* Pushes of 1.0 (SGD, rate 1) every row had; 0..99 and 5000..5099 one more. */
static int dropped_pushes;

static float dropped_want(int64_t id)
{
    bool hot = id < 100 || (id >= 5000 && id < 5100);
    return -(float)dropped_pushes - (hot ? 1.0f : 0.0f);
}

/* Opens the tier again (memory_limit lim): the records past "cat_upto"
 * replayed into the catalog, and rows 0..11999 read back after pushes
 * pushes of every row (dropped_want). */
static void reopened(struct fx *f, uint64_t lim, int pushes)
{
    fx_open(f, lim, 0, false);
    ck_assert_uint_eq(stats(f).sparse_rows, 12000);
    ck_assert_uint_eq(stats(f).sparse_catalog_queued, 0); /* replayed and written */
    ck_assert(in_catalog(f, 0) && in_catalog(f, 11999));
    dropped_pushes = pushes;
    expect_rows(f, 12000, dropped_want);
}

/* Past sparse_catq_max entries the queue is dropped and nothing more is
 * queued; the catalog's next write reads the records past "cat_upto"
 * from the segments, in chunks of that many. A kill with the queue
 * dropped, and a kill part-way through such a write: the next open
 * replays the records, and every row reads back its last applied value;
 * a write done whole leaves nothing to replay. */
START_TEST(test_catalog_dropped)
{
    struct fx f;
    uint64_t lim = (uint64_t)32 << 20; /* a budget of 8 MiB: 4681 entries queued */
    fx_start(&f, 0, 0, 0, lim, 0);
    size_t cap = sparse_catq_max(f.sp);
    ck_assert_uint_lt(cap, 6000);
    int64_t *ids = range(0, 12000);
    ck_assert_int_eq(push(&f, ids, 12000, 1.0f, 1, UINT64_MAX, NULL), 0);
    apply_only(&f);
    ck_assert(f.sp->catq_lost);
    ck_assert_uint_eq(f.sp->catq_n, 0);
    ck_assert_uint_eq(f.sp->catq_cap, 0); /* its memory given back */
    ck_assert_uint_eq(stats(&f).sparse_catalog_queued, 12000);
    /* Changed again: later records of 0..99 and 5000..5099, not queued. */
    ck_assert_int_eq(push(&f, ids, 100, 1.0f, 2, UINT64_MAX, NULL), 0);
    ck_assert_int_eq(push(&f, ids + 5000, 100, 1.0f, 2, UINT64_MAX, NULL), 0);
    apply_only(&f);
    ck_assert_uint_eq(stats(&f).sparse_catalog_queued, 12200);
    ck_assert(!in_catalog(&f, 0));
    fx_close(&f, false); /* a kill */

    reopened(&f, lim, 1);

    /* Dropped again, then a write that reads the records, a transaction
     * at a time, killed part-way: "cat_upto" stays, the rest is replayed. */
    f.sp->cat_txn_pages = 8;
    ck_assert_int_eq(push(&f, ids, 12000, 1.0f, 3, UINT64_MAX, NULL), 0);
    apply_only(&f);
    ck_assert(f.sp->catq_lost);
    uint64_t upto0, upto, end;
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_CAT_UPTO, &upto0), 0);
    bool busy = false;
    pthread_mutex_lock(&f.sp->apply_run_mu);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(sparse_cat_step(f.sp, &busy), 0);
    pthread_mutex_unlock(&f.sp->apply_run_mu);
    ck_assert(busy && f.sp->catw_scan);
    ck_assert_uint_gt(f.sp->catw_scanned, 0);
    ck_assert_uint_le(f.sp->catq_cap, cap); /* a chunk at a time */
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_CAT_UPTO, &upto), 0);
    ck_assert_uint_eq(upto, upto0);
    fx_close(&f, false); /* a kill */

    fx_open(&f, lim, 0, false);
    dropped_pushes = 2;
    expect_rows(&f, 12000, dropped_want);
    ck_assert_uint_eq(stats(&f).sparse_rows, 12000);
    /* Dropped once more, and written whole from the records (a drain). */
    ck_assert_int_eq(push(&f, ids, 12000, 1.0f, 4, UINT64_MAX, NULL), 0);
    apply_only(&f);
    ck_assert(f.sp->catq_lost);
    ck_assert_int_eq(psd_sparse_drain(f.sp), 0);
    ck_assert(!f.sp->catq_lost); /* nothing applied since the write began */
    ck_assert_uint_eq(stats(&f).sparse_catalog_queued, 0);
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_CAT_UPTO, &upto), 0);
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_SEGS_END, &end), 0);
    ck_assert_uint_eq(upto, end);
    fx_close(&f, false); /* nothing to replay: the catalog holds every row */
    fx_open(&f, lim, 0, false);
    dropped_pushes = 3;
    expect_rows(&f, 12000, dropped_want);
    free(ids);
    fx_close(&f, true);
}
END_TEST

/* The committed end of the segments and the catalog's mark, read from
 * the store alone (the tier closed). */
static void marks(uint64_t *upto, uint64_t *end)
{
    psd_store *st;
    ck_assert_int_eq(psd_store_open(tmpdir, 0, 0, &st), 0);
    ck_assert_int_eq(psd_store_log_mark(st, PSD_STORE_CAT_UPTO, upto), 0);
    ck_assert_int_eq(psd_store_log_mark(st, PSD_STORE_SEGS_END, end), 0);
    psd_store_close(st);
}

/* Pushes 1.0 to ids[0..n) at step, has them applied (the queue dropped
 * or not, as lost says), stops cleanly, and checks that the stop wrote
 * the catalog whole. */
static void stop_whole(struct fx *f, const int64_t *ids, size_t n, uint64_t step, bool lost)
{
    uint64_t upto, end;
    ck_assert_int_eq(push(f, ids, n, 1.0f, step, UINT64_MAX, NULL), 0);
    apply_only(f);
    ck_assert(f->sp->catq_lost == lost);
    fx_close(f, true);
    marks(&upto, &end);
    ck_assert_uint_eq(upto, end);
}

/* A clean stop writes the catalog for a second at most, and not at all
 * when the queue was dropped (the write would read the records, which is
 * the next open's replay): "cat_upto" stays, and the next open replays
 * the records past it, every row reading back its last value. A write
 * bounded in time begins no transaction past its bound and keeps those
 * it committed; a queue held is written whole at the stop. */
START_TEST(test_catalog_stop)
{
    struct fx f;
    uint64_t lim = (uint64_t)32 << 20, roomy = (uint64_t)128 << 20, upto0, upto, end;
    fx_start(&f, 0, 0, 0, lim, 0);
    int64_t *ids = range(0, 12000);
    ck_assert_int_eq(push(&f, ids, 12000, 1.0f, 1, UINT64_MAX, NULL), 0);
    apply_only(&f);
    ck_assert(f.sp->catq_lost);
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_CAT_UPTO, &upto0), 0);
    ck_assert_int_eq(push(&f, ids, 100, 1.0f, 2, UINT64_MAX, NULL), 0);
    ck_assert_int_eq(push(&f, ids + 5000, 100, 1.0f, 2, UINT64_MAX, NULL), 0);
    fx_close(&f, true); /* a clean stop: the last pushes applied, the catalog left */
    marks(&upto, &end);
    ck_assert_uint_eq(upto, upto0);
    ck_assert_uint_lt(upto, end);
    reopened(&f, roomy, 1);

    /* A queue held (a larger budget), its write bounded: a bound already
     * passed writes nothing, not even after a transaction of it. */
    f.sp->cat_txn_pages = 8;
    ck_assert_int_eq(push(&f, ids, 12000, 1.0f, 3, UINT64_MAX, NULL), 0);
    apply_only(&f);
    ck_assert(!f.sp->catq_lost);
    ck_assert_uint_eq(stats(&f).sparse_catalog_queued, 12000);
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_CAT_UPTO, &upto0), 0);
    bool busy = false;
    pthread_mutex_lock(&f.sp->apply_run_mu);
    ck_assert_int_eq(sparse_cat_flush_until(f.sp, false, ps_now_ms()), 0);
    ck_assert(sparse_cat_behind(f.sp));
    ck_assert_uint_eq(f.sp->catw_k, 0);
    ck_assert_int_eq(sparse_cat_step(f.sp, &busy), 0);
    size_t k = f.sp->catw_k;
    ck_assert(busy && k > 0 && k < 12000);
    ck_assert_int_eq(sparse_cat_flush_until(f.sp, false, ps_now_ms()), 0);
    ck_assert_uint_eq(f.sp->catw_k, k);
    pthread_mutex_unlock(&f.sp->apply_run_mu);
    ck_assert_int_eq(psd_store_log_mark(f.store, PSD_STORE_CAT_UPTO, &upto), 0);
    ck_assert_uint_eq(upto, upto0);
    fx_close(&f, false); /* a kill */
    reopened(&f, roomy, 2);

    /* Held, and written whole by a clean stop: nothing left to replay. */
    stop_whole(&f, ids, 12000, 4, false);

    /* Dropped, and a table went since the catalog's last write (deleted,
     * or replaced by a restore): the open, no table ready yet, would
     * replay its records as rows of no variable, so the stop writes the
     * catalog whole. */
    reopened(&f, lim, 3);
    psd_sparse_table *gone = psd_sparse_table_new(&f.spec, &f.o);
    uint64_t went = atomic_load(&f.sp->tables_gone);
    psd_sparse_attach(f.sp, gone, 0);
    psd_sparse_detach(f.sp, gone);
    psd_sparse_table_free(gone);
    ck_assert_uint_eq(atomic_load(&f.sp->tables_gone), went + 1);
    stop_whole(&f, ids, 12000, 5, true);
    reopened(&f, lim, 4);
    free(ids);
    fx_close(&f, true);
}
END_TEST

/* A sweep with the queue dropped: rows whose catalog entry is behind
 * their index (their later record past "cat_upto") are kept, however
 * old the entry says they are, and rows not in the catalog yet unseen;
 * the others go, and stay gone after a kill: the write that reads the
 * records skips those of rows the index no longer holds. */
static float swept_want(int64_t id)
{
    return id < 100 ? -2.0f : -1.0f;
}

START_TEST(test_catalog_dropped_sweep)
{
    struct fx f;
    uint64_t lim = (uint64_t)32 << 20;
    fx_start(&f, 0, 50, 0, lim, 0); /* ttl 50 steps */
    int64_t *ids = range(0, 12000);
    ck_assert_int_eq(push(&f, ids, 6000, 1.0f, 1, UINT64_MAX, NULL), 0);
    commit(&f);
    ck_assert_int_eq(psd_sparse_drain(f.sp), 0); /* 0..5999 in the catalog, step 1 */
    ck_assert(in_catalog(&f, 5999));
    /* 0..99 again and 6000..11999 new, at step 120: the queue dropped. */
    ck_assert_int_eq(push(&f, ids, 100, 1.0f, 120, UINT64_MAX, NULL), 0);
    ck_assert_int_eq(push(&f, ids + 6000, 6000, 1.0f, 120, UINT64_MAX, NULL), 0);
    apply_only(&f);
    ck_assert(f.sp->catq_lost);
    sparse_lock(f.t);
    ck_assert_int_eq(sparse_sweep(f.sp, f.t, 120), 0);
    pthread_mutex_unlock(&f.t->mu);
    Ps__V1__StatsResponse r = stats(&f);
    ck_assert_uint_eq(r.sparse_evicted, 5900); /* 100..5999 */
    ck_assert_uint_eq(r.sparse_rows, 100 + 6000);
    ck_assert(in_catalog(&f, 0) && !in_catalog(&f, 100) && !in_catalog(&f, 6000));
    fx_close(&f, false); /* a kill: the records of 0..99 and 6000.. replayed */

    fx_open(&f, lim, 0, false);
    ck_assert_uint_eq(stats(&f).sparse_rows, 100 + 6000);
    ck_assert(in_catalog(&f, 0) && !in_catalog(&f, 100) && in_catalog(&f, 6000));
    float out[DIM];
    uint64_t ins;
    for (int64_t id = 0; id < 12000; id += 50) {
        ck_assert_int_eq(psd_sparse_pull(f.sp, f.t, &id, 1, out, true, &ins), 0);
        float want = id >= 100 && id < 6000 ? 0.0f : swept_want(id); /* gone: zeros */
        ck_assert_msg(out[0] == want, "row %lld: %g, expected %g", (long long)id, out[0],
                      want);
    }
    ck_assert_uint_eq(stats(&f).sparse_rows, 100 + 6000);
    free(ids);
    fx_close(&f, true);
}
END_TEST

/* A write that reads the records skips those of rows the table's index no
 * longer holds (a sweep deleted the row after compaction copied its
 * record: replayed, the catalog would bring it back), and of tables that
 * are not ready. */
START_TEST(test_catalog_dropped_skip)
{
    struct fx f;
    fx_start(&f, 0, 0, 0, (uint64_t)32 << 20, 0);
    int64_t *ids = range(0, 6000);
    ck_assert_int_eq(push(&f, ids, 6000, 1.0f, 1, UINT64_MAX, NULL), 0);
    apply_only(&f);
    ck_assert(f.sp->catq_lost);
    sparse_lock(f.t);
    sparse_index_del(f.t, 5); /* as a sweep deletes it */
    pthread_mutex_unlock(&f.t->mu);
    ck_assert_int_eq(psd_sparse_drain(f.sp), 0);
    ck_assert(!f.sp->catq_lost);
    ck_assert(in_catalog(&f, 4) && !in_catalog(&f, 5) && in_catalog(&f, 5999));
    free(ids);
    fx_close(&f, true);
}
END_TEST

/* ---- compaction and sweeps ------------------------------------------------- */

/* The segment row id's record is in (0: none outside the LMDB). */
static uint32_t row_seg(struct fx *f, int64_t id)
{
    sparse_lock(f->t);
    uint64_t p = sparse_index_get(f->t, id);
    pthread_mutex_unlock(&f->t->mu);
    if (p == 0 || p == SPARSE_LOC_LMDB)
        return 0;
    return sparse_loc_unpack(p, sparse_row_bytes(f->t) + PSD_SEG_REC_HEAD).seg;
}

static struct fx *step_fx; /* the table compact_sweep sweeps */
static int step_sweeps;

/* The flusher's sweep of f's table at clock 120. */
static void sweep_at_120(struct fx *f)
{
    sparse_lock(f->t);
    ck_assert_int_eq(sparse_sweep(f->sp, f->t, 120), 0);
    pthread_mutex_unlock(&f->t->mu);
}

/* compaction's compact_copied: the flusher's sweep (clock 120) between a
 * step's sync of its copies and the commit of their relocation. */
static int compact_sweep(psd_sparse *sp)
{
    ck_assert_ptr_eq(sp, step_fx->sp);
    sweep_at_120(step_fx);
    step_sweeps++;
    return 0;
}

/* compaction's compact_copied: the step's relocation fails after its
 * copies were synced, as when the store's map is full and cannot grow. */
static int compact_full(psd_sparse *sp)
{
    (void)sp;
    step_sweeps++;
    return PS_EFULL;
}

/* A tier of rows 0..499 of table "emb" (ttl 50 steps), each apply its own
 * segment: the first (returned) holds 0..399, 0..99 at step 1 (due for
 * eviction at clock 120), 100..399 at step 100; the next 200..399 again
 * at step 120 (half of the first dead) and 400..499 at step 1; the
 * catalog whole. Then ticks of compaction, the hook copied given, until
 * it was called once. */
static uint32_t compact_case(struct fx *f, int (*copied)(psd_sparse *sp))
{
    fx_segment_size = 1; /* each apply its own segment */
    fx_start(f, 0, 50, 0, 0, 0); /* ttl 50 steps */
    int64_t *ids = range(0, 500);
    ck_assert_int_eq(push(f, ids, 100, 1.0f, 1, UINT64_MAX, NULL), 0);
    ck_assert_int_eq(push(f, ids + 100, 300, 1.0f, 100, UINT64_MAX, NULL), 0);
    commit(f);
    ck_assert_int_eq(psd_sparse_drain(f->sp), 0);
    uint32_t seg = row_seg(f, 0); /* the first apply's */
    ck_assert_uint_gt(seg, 0);
    ck_assert_uint_eq(row_seg(f, 399), seg);
    ck_assert_int_eq(push(f, ids + 200, 200, 1.0f, 120, UINT64_MAX, NULL), 0);
    ck_assert_int_eq(push(f, ids + 400, 100, 1.0f, 1, UINT64_MAX, NULL), 0);
    commit(f);
    ck_assert_int_eq(psd_sparse_drain(f->sp), 0); /* the catalog whole */
    ck_assert_uint_eq(row_seg(f, 200), seg + 1);
    ck_assert_uint_eq(row_seg(f, 499), seg + 1);
    free(ids);

    step_fx = f;
    step_sweeps = 0;
    f->sp->compact_copied = copied;
    pthread_mutex_lock(&f->sp->apply_run_mu); /* as the applier holds it */
    for (int i = 0; i < 5000 && step_sweeps == 0; i++) {
        sparse_compact_tick(f->sp);
        usleep(1000);
    }
    pthread_mutex_unlock(&f->sp->apply_run_mu);
    f->sp->compact_copied = NULL;
    ck_assert_int_eq(step_sweeps, 1); /* one step: the segment is 25 KiB */
    return seg;
}

/* Rows 0..499 after compact_case: rows 0..99 and 400..499 were pushed
 * once, 100..199 once, 200..399 twice (a row the sweeps deleted is
 * absent, not read; 400..499 pushed again once evicted start over). */
static float compacted_want(int64_t id)
{
    return id >= 200 && id < 400 ? -2.0f : -1.0f;
}

/* Whether, after a kill, every row of 0..499 the index held before it
 * (had) reads back its value, and no other is stored. */
static void expect_held(struct fx *f, const bool *had)
{
    uint64_t n = 0;
    float out[DIM];
    uint64_t ins;
    for (int64_t id = 0; id < 500; id++) {
        bool in = in_catalog(f, id);
        ck_assert_msg(in == had[id], "row %lld: %s before the kill, %s after", (long long)id,
                      had[id] ? "stored" : "evicted", in ? "stored" : "absent");
        if (!in)
            continue;
        n++;
        ck_assert_int_eq(psd_sparse_pull(f->sp, f->t, &id, 1, out, true, &ins), 0);
        ck_assert_msg(out[0] == compacted_want(id), "row %lld: %g, expected %g",
                      (long long)id, out[0], compacted_want(id));
    }
    ck_assert_uint_eq(stats(f).sparse_rows, n);
}

/* An eviction sweep that runs while a compaction step has copied a row's
 * record and not yet committed its relocation must not delete the row:
 * the copy lies past "cat_upto" and the next open would replay it,
 * bringing back the evicted row after a kill. A segment holds rows 0..399
 * (0..99 at step 1, due for eviction at clock 120 with ttl 50), half of
 * it dead once 200..399 are written again (the next segment, with
 * 400..499 at step 1); a sweep falls inside the step that copies 0..199 out of it,
 * then psd is killed before the catalog's next write. Every row the
 * index held before the kill reads back its value after, and no other
 * row is back; a sweep after the reopen evicts 0..99, and they stay
 * gone after a second kill. */
START_TEST(test_compact_sweep)
{
    struct fx f;
    uint32_t seg = compact_case(&f, compact_sweep);
    ck_assert_uint_gt(row_seg(&f, 199), seg + 1);
    bool had[500];
    for (int64_t id = 0; id < 500; id++)
        had[id] = row_seg(&f, id) != 0;
    ck_assert(had[100] && had[399] && !had[400] && !had[499]); /* 400.. swept */
    fx_close(&f, false); /* a kill: the step's copies replayed */

    fx_open(&f, 0, 0, false);
    expect_held(&f, had);
    sweep_at_120(&f);
    for (int64_t id = 0; id < 500; id++)
        had[id] = id >= 100 && id < 400;
    for (int64_t id = 0; id < 500; id++)
        ck_assert_msg((row_seg(&f, id) != 0) == had[id], "row %lld", (long long)id);
    fx_close(&f, false); /* a kill */
    fx_open(&f, 0, 0, false);
    expect_held(&f, had);
    fx_close(&f, true);
    fx_segment_size = 0;
}
END_TEST

/* A compaction step whose relocation fails once its copies were synced
 * (compact_full) leaves them past the committed end, which the next apply
 * moves past them: until the catalog's write passes them too, an open
 * replays them, so a sweep must not delete the rows they copy. After the
 * failed step of compact_case, the catalog written past the copies or
 * not (written), a sweep at clock 120 (evicting 400..499, and 0..99 only
 * when written), then 400..499 pushed again (their first value: they were
 * evicted) and applied, and psd killed before the catalog's next write:
 * every row the index held reads back its value and no evicted row is
 * back. A sweep after the reopen evicts 0..99, gone after a second kill. */
static void compact_fail_case(bool written)
{
    struct fx f;
    uint32_t seg = compact_case(&f, compact_full);
    ck_assert_uint_eq(row_seg(&f, 0), seg); /* not relocated */
    ck_assert_uint_eq(row_seg(&f, 199), seg);
    if (written) {
        ck_assert_int_eq(psd_sparse_drain(f.sp), 0); /* the catalog past the copies */
        pthread_mutex_lock(&f.sp->apply_run_mu);
        sparse_compact_tick(f.sp); /* sees it (no step: the retry waits) */
        pthread_mutex_unlock(&f.sp->apply_run_mu);
    }
    sweep_at_120(&f);
    int64_t *ids = range(400, 100);
    ck_assert_int_eq(push(&f, ids, 100, 1.0f, 120, UINT64_MAX, NULL), 0);
    free(ids);
    apply_only(&f); /* the committed end past the copies */
    bool had[500];
    for (int64_t id = 0; id < 500; id++)
        had[id] = row_seg(&f, id) != 0;
    fx_close(&f, false); /* a kill */

    fx_open(&f, 0, 0, false);
    expect_held(&f, had);
    for (int64_t id = 0; id < 500; id++)
        ck_assert_msg(had[id] == (id >= 100 || !written), "row %lld", (long long)id);
    sweep_at_120(&f);
    for (int64_t id = 0; id < 100; id++)
        had[id] = false;
    fx_close(&f, false); /* a kill */
    fx_open(&f, 0, 0, false);
    expect_held(&f, had);
    fx_close(&f, true);
    fx_segment_size = 0;
}

START_TEST(test_compact_fail_sweep)
{
    compact_fail_case(false);
}
END_TEST

START_TEST(test_compact_fail_written)
{
    compact_fail_case(true);
}
END_TEST

/* ---- reads ahead ----------------------------------------------------------- */

/* A pull of ids naming next[0..nnext) as the table's next call's ids
 * (psd_sparse_pull_next): their values into out (n * DIM). */
static void pull_next(struct fx *f, const int64_t *ids, size_t n, const int64_t *next,
                      size_t nnext, float *out)
{
    uint64_t ins;
    ck_assert_int_eq(psd_sparse_pull_next(f->sp, f->t, ids, n, next, nnext, out, true, &ins),
                     0);
}

/* Whether the table read ahead what its last call named (io_uring); where
 * it cannot, psd ignores hints and these tests have nothing to test. */
static bool reads_ahead(struct fx *f)
{
    if (!atomic_load(&f->t->pf.off))
        return true;
    fprintf(stderr, "no io_uring here: psd reads nothing ahead, nothing to test\n");
    return false;
}

/* Whether row id has an entry in the RAM tier. */
static bool in_ram(struct fx *f, int64_t id)
{
    sparse_lock(f->t);
    bool in = sparse_find(f->t, id) != NULL;
    pthread_mutex_unlock(&f->t->mu);
    return in;
}

/* Rows 1 and 2 pushed at step 1 (due at clock 120 with a ttl of 50 steps),
 * row 3 at step 100 when with3, stored, and the tier opened again: every
 * row on disk. */
static void ttl_rows_cold(struct fx *f, bool with3)
{
    fx_start(f, 0, 50, 0, 0, 0);
    int64_t old[] = {1, 2}, kept = 3;
    ck_assert_int_eq(push(f, old, 2, 1.0f, 1, UINT64_MAX, NULL), 0);
    if (with3)
        ck_assert_int_eq(push(f, &kept, 1, 1.0f, 100, UINT64_MAX, NULL), 0);
    fx_close(f, true);
    fx_open(f, 0, 0, false);
}

/* A row a pull's first pass reads from disk (without the table's mutex)
 * that a sweep deletes before the pull checks its reads under the mutex:
 * the pull answers the row's initial value (it has no row now), not the
 * value read. The walk that reads stale rows again looks only at rows the
 * index holds, so the check must drop the deleted one itself. Rows 1 and
 * 2 at step 1 (due at clock 120, ttl 50), row 3 at step 100, stored and
 * the tier opened again (every row cold); a pull of 1 and 3 whose first
 * pass is followed by the sweep (the cold_read hook). */
static struct fx *read_fx;
static int read_sweeps;

static void read_then_sweep(psd_sparse *sp)
{
    ck_assert_ptr_eq(sp, read_fx->sp);
    if (read_sweeps++ == 0)
        sweep_at_120(read_fx);
}

/* A row read ahead that a sweep deletes before a pull takes it from its
 * batch: the pull answers the row's initial value (it has no row now),
 * not the value read ahead. Rows 1 and 2 at step 1 (due at clock 120, ttl
 * 50), and with keep row 3 at step 100, stored and the tier opened again
 * (every row cold); a pull of 2 names 1 as the next; the sweep; the pull
 * of 1 (and 3), whose first pass finds 1 gone from the index and leaves
 * nothing to the batch (the pass's own index lookup is then all that
 * stands between the pull and the row read ahead). With mid the sweep comes after
 * that pull's first pass instead (the cold_read hook), when the batch's
 * rows are taken: the index changed since the batch was looked up. A
 * sweep is no push, so nothing takes the batch first: sparse_cold_settle's
 * check of the record read against the index is all that stands between
 * the pull and the deleted row. Without keep no row is left, so every row
 * left is in the RAM tier when that pull settles. */
static void evicted_case(bool keep, bool mid)
{
    struct fx f;
    int64_t old[] = {1, 2}, ids[] = {1, 3};
    ttl_rows_cold(&f, keep);
    float out[2 * DIM];
    pull_next(&f, &old[1], 1, &old[0], 1, out);
    ck_assert(out[0] == -1.0f);
    if (reads_ahead(&f)) {
        read_fx = &f;
        read_sweeps = 0;
        if (mid)
            f.sp->cold_read = read_then_sweep;
        else
            sweep_at_120(&f);
        pull_next(&f, ids, keep ? 2 : 1, &old[1], 1, out);
        f.sp->cold_read = NULL;
        ck_assert_int_eq(read_sweeps, mid ? 1 : 0);
        ck_assert_uint_eq(stats(&f).sparse_evicted, 2);
        ck_assert_msg(out[0] == 0.0f, "row 1, evicted: %g (read ahead), expected 0 (none)",
                      out[0]);
        ck_assert(!keep || out[DIM] == -1.0f);
        /* Swept before the first pass: the index no longer holds row 1,
         * and the pass leaves nothing to the batch. Swept after it: taken
         * from the batch and dropped. */
        ck_assert_uint_eq(atomic_load(&f.sp->pf_rows), mid ? 1 : 0);
        ck_assert_uint_eq(atomic_load(&f.sp->pf_stale), mid ? 1 : 0);
        ck_assert_uint_eq(stats(&f).sparse_rows, keep ? 1 : 0);
    }
    fx_close(&f, true);
}

START_TEST(test_ahead_evicted)
{
    evicted_case(true, false);
}
END_TEST

START_TEST(test_ahead_evicted_all)
{
    evicted_case(false, false);
}
END_TEST

START_TEST(test_ahead_evicted_mid)
{
    evicted_case(true, true);
}
END_TEST

START_TEST(test_ahead_evicted_mid_all)
{
    evicted_case(false, true);
}
END_TEST

/* The same order for a push: the row swept after the push read it is a
 * new row to the push (its initial value, 0, updated: -1, and counted in
 * the table's rows), not the row read (-1, updated: -2, not counted). */
static void read_evicted_case(bool by_push)
{
    struct fx f;
    int64_t ids[] = {1, 3};
    ttl_rows_cold(&f, true);
    read_fx = &f;
    read_sweeps = 0;
    f.sp->cold_read = read_then_sweep;
    float out[2 * DIM];
    if (by_push)
        ck_assert_int_eq(push(&f, ids, 2, 1.0f, 121, UINT64_MAX, NULL), 0);
    else
        pull_next(&f, ids, 2, NULL, 0, out);
    f.sp->cold_read = NULL;
    ck_assert_int_eq(read_sweeps, 1);
    ck_assert_uint_eq(stats(&f).sparse_evicted, 2);
    if (by_push) {
        pull_next(&f, ids, 2, NULL, 0, out);
        ck_assert_msg(out[0] == -1.0f, "row 1, evicted after the push read it: %g, expected -1 "
                      "(a new row, updated once)", out[0]);
        ck_assert_msg(out[DIM] == -2.0f, "row 3: %g, expected -2", out[DIM]);
    } else {
        ck_assert_msg(out[0] == 0.0f, "row 1, evicted after it was read: %g, expected 0 (none)",
                      out[0]);
        ck_assert_msg(out[DIM] == -1.0f, "row 3: %g, expected -1", out[DIM]);
    }
    ck_assert_uint_eq(stats(&f).sparse_rows, by_push ? 2 : 1);
    fx_close(&f, true);
}

/* A RAM entry the first pass found that leaves the tier (a sweep) before
 * the pull serves it: the serve loop takes the first pass's entries only
 * while no entry left the tier since, and here looks row 1 up again, finds
 * none and answers its initial value, not the freed entry's. Rows 1 and 2
 * at step 1 (due at clock 120), row 3 at step 100, the tier opened again;
 * a pull of row 1 brings it into the tier (row 2 stays out, so that the
 * first pass looks the ids up), then a pull of 1 and 3 with the sweep
 * between its passes. */
START_TEST(test_read_entry_dropped)
{
    struct fx f;
    int64_t ids[] = {1, 3};
    ttl_rows_cold(&f, true);
    float out[2 * DIM];
    pull_next(&f, ids, 1, NULL, 0, out);
    ck_assert(out[0] == -1.0f);
    sparse_lock(f.t);
    bool in_ram = sparse_find(f.t, 1) != NULL, some_out = f.t->nentries < f.t->rows;
    pthread_mutex_unlock(&f.t->mu);
    ck_assert_msg(in_ram && some_out, "row 1 in the tier, row 2 not: %d %d", in_ram, some_out);
    read_fx = &f;
    read_sweeps = 0;
    f.sp->cold_read = read_then_sweep;
    pull_next(&f, ids, 2, NULL, 0, out);
    f.sp->cold_read = NULL;
    ck_assert_int_eq(read_sweeps, 1);
    ck_assert_uint_eq(stats(&f).sparse_evicted, 2);
    ck_assert_msg(out[0] == 0.0f, "row 1, its entry dropped after the first pass found it: %g, "
                  "expected 0 (none)", out[0]);
    ck_assert_msg(out[DIM] == -1.0f, "row 3: %g, expected -1", out[DIM]);
    fx_close(&f, true);
}
END_TEST

START_TEST(test_read_evicted)
{
    read_evicted_case(false);
}
END_TEST

START_TEST(test_read_evicted_push)
{
    read_evicted_case(true);
}
END_TEST

/* A push that names its own rows as the next call's: their reads ahead
 * are looked up before it changes them, and no batch claims them yet, so
 * none is taken first; its batch holds their old records. Once the
 * changes are applied and the rows left the RAM tier (its clock, past
 * the budget), the next call takes them from that batch: the check of
 * the records read against the index (now at the new records) is all
 * that keeps a pull from answering the values before the push, or a push
 * from updating them (losing the first push). Rows 0..7 pushed once and
 * the tier opened again (every row cold), pushed again naming 0..7 next,
 * then new rows pushed and applied until 0..7 left the RAM tier; the
 * next call, a pull (again) or a push (again), of 0..7 naming 1000 next:
 * the pull answers the second push's values, and after the push a pull
 * answers the third's. */
static void pushed_case(bool again)
{
    struct fx f;
    fx_start(&f, 0, 0, 0, 1 << 20, 0); /* a budget of 256 KiB */
    enum { N = 8, MORE = 1000, ROUNDS = 16 };
    int64_t *x = range(0, N), *more = range(1000, MORE * ROUNDS), next = 1000;
    ck_assert_int_eq(push(&f, x, N, 1.0f, 1, UINT64_MAX, NULL), 0);
    fx_close(&f, true);
    fx_open(&f, 1 << 20, 0, false);
    ck_assert_int_eq(push_next(&f, x, N, x, N, 1.0f, 2, UINT64_MAX, NULL), 0);
    if (reads_ahead(&f)) {
        int held = N, round = 0;
        for (; round < ROUNDS && held > 0; round++) {
            ck_assert_int_eq(push(&f, more + round * MORE, MORE, 1.0f, 3, UINT64_MAX, NULL),
                             0);
            commit(&f);
            ck_assert_int_eq(psd_sparse_make_room(f.sp), 0);
            held = 0;
            for (int64_t id = 0; id < N; id++)
                held += in_ram(&f, id);
        }
        ck_assert_msg(held == 0, "%d of rows 0..%d still in the RAM tier after %d rounds",
                      held, N - 1, round);
        float out[N * DIM], want = again ? -3.0f : -2.0f;
        if (again)
            ck_assert_int_eq(push_next(&f, x, N, &next, 1, 1.0f, 4, UINT64_MAX, NULL), 0);
        else
            pull_next(&f, x, N, &next, 1, out);
        uint64_t taken = atomic_load(&f.sp->pf_rows);
        if (again)
            pull_next(&f, x, N, NULL, 0, out);
        for (int64_t id = 0; id < N; id++)
            ck_assert_msg(out[id * DIM] == want, "row %lld: %g, expected %g (the rows read "
                          "ahead before the second push: -1)", (long long)id, out[id * DIM],
                          want);
        ck_assert_uint_gt(taken, 0);
        ck_assert_uint_eq(atomic_load(&f.sp->pf_stale), taken);
    }
    free(more);
    free(x);
    fx_close(&f, true);
}

START_TEST(test_ahead_pushed)
{
    pushed_case(false);
}
END_TEST

START_TEST(test_ahead_pushed_twice)
{
    pushed_case(true);
}
END_TEST

/* A job that holds the helper thread until its gate opens. */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
};

static void hold(void *arg)
{
    struct gate *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* A pull's hint looked up on the helper thread while the pull looks up
 * its own ids, or, with busy (the helper held by another job), by the pull
 * itself first: either way the batch holds the next pull's rows, and that
 * pull takes every one of them from it, with the values pushed. Rows
 * 0..N-1 pushed once (-1) and the tier opened again (every row cold); a
 * pull of the first half naming the second, then a pull of the second.
 * N 64, and 2048: a pull of 1024 rows and its hint of 1024. */
static void helper_case(bool busy, int N)
{
    struct fx f;
    const int H = N / 2;
    fx_start(&f, 0, 0, 0, 0, 0);
    int64_t *x = range(0, N);
    ck_assert_int_eq(push(&f, x, N, 1.0f, 1, UINT64_MAX, NULL), 0);
    fx_close(&f, true);
    fx_open(&f, 0, 0, false);
    if (reads_ahead(&f)) {
        struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
        if (busy)
            ck_assert(psd_assist_try(f.assist, hold, &g));
        float *out = malloc((size_t)H * DIM * sizeof *out);
        pull_next(&f, x, H, x + H, H, out);
        for (int i = 0; i < H; i++)
            ck_assert_msg(out[i * DIM] == -1.0f, "row %d: %g, expected -1", i, out[i * DIM]);
        if (busy) {
            pthread_mutex_lock(&g.mu);
            g.open = true;
            pthread_cond_signal(&g.cv);
            pthread_mutex_unlock(&g.mu);
            psd_assist_join(f.assist);
        }
        ck_assert_uint_eq(atomic_load(&f.sp->pf_reads), H); /* the hint's rows, once */
        pull_next(&f, x + H, H, NULL, 0, out);
        for (int i = 0; i < H; i++)
            ck_assert_msg(out[i * DIM] == -1.0f, "row %d: %g, expected -1", H + i,
                          out[i * DIM]);
        ck_assert_uint_eq(atomic_load(&f.sp->pf_rows), H);
        ck_assert_uint_eq(atomic_load(&f.sp->pf_stale), 0);
        free(out);
    }
    free(x);
    fx_close(&f, true);
}

START_TEST(test_ahead_helper)
{
    helper_case(false, 64);
}
END_TEST

START_TEST(test_ahead_helper_many)
{
    helper_case(false, 2048);
}
END_TEST

START_TEST(test_ahead_helper_busy)
{
    helper_case(true, 64);
}
END_TEST

/* ---- rows in float16 and bfloat16 ------------------------------------------ */

/* A table of rows of type (half.h) and slots of slot_type (0: float32),
 * optimizer kind (ADAM, two slots, or ADAGRAD or FTRL), rows starting at
 * 0.1 (not a float16 or bfloat16 value: the start is rounded too). */
static void half_start(struct fx *f, int type, int slot_type, enum psd_opt_kind kind)
{
    spec_make(f, "emb16", 0, 0, 0);
    f->spec.row_dtype = (Ps__V1__DType)type;
    f->spec.slot_dtype = (Ps__V1__DType)slot_type;
    f->init.kind = PS__V1__INITIALIZER__KIND__CONSTANT;
    f->init.value = 0.1f;
    f->opt.kind = (Ps__V1__Optimizer__Kind)kind;
    f->o = (psd_opt){.kind = kind};
    psd_opt_defaults(&f->o);
    f->o.lr = 0.01f;
    fx_open(f, 0, 0, true);
}

/* x as stored in type (0: float32, x itself). */
static float round_to(int type, float x)
{
    bool c;
    return type ? ps_half_to_f32_one(type, ps_half_from_f32_one(type, x, &c)) : x;
}

/* Five pushes of varied gradients to two ids (one repeated), each row
 * checked bit for bit against a float32 reference that applies the same
 * update (kind, two slots) to the widened row and rounds the value back to
 * nearest even, and the slots too with half slots (slot_type): pulls in
 * float32 and in the row dtype, and push's values. */
static void half_case(int type, int slot_type, enum psd_opt_kind kind)
{
    struct fx f;
    half_start(&f, type, slot_type, kind);
    ck_assert_int_eq(psd_sparse_row_type(f.t), type);
    ck_assert_int_eq(psd_sparse_slot_type(f.t), slot_type);
    /* head 16, value 4 x 2 bytes, two slots 4 x 4 (or 2) bytes each. */
    ck_assert_uint_eq(psd_sparse_stored_bytes(f.t),
                      16 + DIM * 2 + 2 * DIM * (slot_type ? 2 : 4));
    ck_assert_uint_eq(psd_sparse_value_bytes(f.t, false), DIM * 2);
    ck_assert_uint_eq(psd_sparse_value_bytes(f.t, true), DIM * 4);
    float ref[2][3 * DIM];
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < DIM; k++)
            ref[r][k] = round_to(type, 0.1f);
        psd_opt_init_slots(&f.o, ref[r] + DIM, DIM);
        for (int k = DIM; k < 3 * DIM; k++)
            ref[r][k] = round_to(slot_type, ref[r][k]);
    }
    int64_t ids[] = {7, -3, 7};
    for (int step = 1; step <= 5; step++) {
        float grad[3 * DIM], sum[2][DIM];
        for (int i = 0; i < 3 * DIM; i++)
            grad[i] = 0.37f * (float)(step * (i + 1)) * (i % 2 ? -1.0f : 1.0f);
        for (int k = 0; k < DIM; k++) {
            sum[0][k] = 0.0f + grad[k] + grad[2 * DIM + k];
            sum[1][k] = 0.0f + grad[DIM + k];
        }
        uint16_t values[3 * DIM];
        struct psd_sparse_grad part = {.t = f.t, .ids = ids, .n = 3, .grad = grad,
                                       .values = values};
        size_t bad;
        char why[512];
        ck_assert_int_eq(psd_sparse_push(f.sp, &part, 1, (uint64_t)step, UINT64_MAX, &bad,
                                         why, sizeof why), 0);
        for (int r = 0; r < 2; r++) {
            psd_opt_apply(&f.o, ref[r], ref[r] + DIM, sum[r], DIM, 1.0f, (uint64_t)step);
            for (int k = 0; k < 3 * DIM; k++)
                ref[r][k] = round_to(k < DIM ? type : slot_type, ref[r][k]);
        }
        float w32[2 * DIM];
        uint16_t w16[2 * DIM];
        uint64_t ins;
        int64_t two[] = {7, -3};
        ck_assert_int_eq(psd_sparse_pull(f.sp, f.t, two, 2, w32, true, &ins), 0);
        ck_assert_int_eq(psd_sparse_pull(f.sp, f.t, two, 2, w16, false, &ins), 0);
        for (int r = 0; r < 2; r++)
            for (int k = 0; k < DIM; k++) {
                bool c;
                ck_assert_msg(w32[r * DIM + k] == ref[r][k], "step %d row %d [%d]: %.9g, "
                              "reference %.9g", step, r, k, w32[r * DIM + k], ref[r][k]);
                ck_assert_uint_eq(w16[r * DIM + k], ps_half_from_f32_one(type, ref[r][k], &c));
            }
        for (int k = 0; k < DIM; k++) {
            ck_assert_uint_eq(values[k], w16[k]);
            ck_assert_uint_eq(values[DIM + k], w16[DIM + k]);
            ck_assert_uint_eq(values[2 * DIM + k], w16[k]);
        }
        if (step == 2)
            settle(&f); /* from then on the rows are read back from LMDB */
    }
    /* A row never pushed answers its start, rounded. */
    float w;
    uint64_t ins;
    int64_t none = 99;
    float fresh[DIM];
    ck_assert_int_eq(psd_sparse_pull(f.sp, f.t, &none, 1, fresh, true, &ins), 0);
    w = fresh[0];
    ck_assert(w == round_to(type, 0.1f));
    ck_assert_uint_eq(psd_sparse_row_bytes(f.sp), 2 * psd_sparse_stored_bytes(f.t));
    fx_close(&f, true);
}

START_TEST(test_f16_rows)
{
    half_case(PS_HALF_F16, 0, PSD_OPT_ADAM);
}
END_TEST

START_TEST(test_bf16_rows)
{
    half_case(PS_HALF_BF16, 0, PSD_OPT_ADAM);
}
END_TEST

/* Slots in half precision too (VariableSpec.slot_dtype): FTRL's n and z in
 * float16, ADAM's moments in bfloat16, FTRL's in bfloat16 under float16
 * rows. */
START_TEST(test_f16_slots)
{
    half_case(PS_HALF_F16, PS_HALF_F16, PSD_OPT_FTRL);
}
END_TEST

START_TEST(test_bf16_slots)
{
    half_case(PS_HALF_BF16, PS_HALF_BF16, PSD_OPT_ADAM);
}
END_TEST

START_TEST(test_mixed_slots)
{
    half_case(PS_HALF_F16, PS_HALF_BF16, PSD_OPT_FTRL);
}
END_TEST

/* An update beyond float16's range is stored as +-65504 and counted. */
START_TEST(test_f16_clamp)
{
    struct fx f;
    spec_make(&f, "emb16", 0, 0, 0);
    f.spec.row_dtype = PS__V1__DTYPE__DTYPE_FLOAT16;
    fx_open(&f, 0, 0, true);
    int64_t id = 1;
    ck_assert_int_eq(push(&f, &id, 1, 1e6f, 1, UINT64_MAX, NULL), 0); /* SGD lr 1 */
    ck_assert(pull_one(&f, 1) == -65504.0f);
    ck_assert_uint_eq(stats(&f).sparse_values_clamped, DIM);
    fx_close(&f, true);
}
END_TEST

/* A stored row converted between row dtypes (a restore's): the head kept,
 * the value rounded, the slots as they were; a row of the wrong size is
 * refused. */
START_TEST(test_convert_row)
{
    struct fx f;
    half_start(&f, PS_HALF_BF16, 0, PSD_OPT_ADAM);
    Ps__V1__VariableSpec s32 = f.spec;
    s32.row_dtype = PS__V1__DTYPE__DTYPE_UNSPECIFIED;
    psd_sparse_table *t32 = psd_sparse_table_new(&s32, &f.o);
    uint8_t in[16 + 3 * DIM * 4], out[16 + DIM * 2 + 2 * DIM * 4], back[sizeof in];
    ck_assert_uint_eq(psd_sparse_stored_bytes(t32), sizeof in);
    ck_assert_uint_eq(psd_sparse_stored_bytes(f.t), sizeof out);
    float row[3 * DIM];
    for (int i = 0; i < 3 * DIM; i++)
        row[i] = 1.0f / (float)(i + 3);
    uint64_t head[2] = {12, 34};
    memcpy(in, head, 16);
    memcpy(in + 16, row, sizeof row);
    float *scratch = malloc(psd_sparse_state_floats(f.t) * sizeof(float));
    uint64_t clamped = 0;
    ck_assert_int_eq(psd_sparse_convert_row(t32, f.t, in, sizeof in, out, scratch, &clamped),
                     0);
    ck_assert_int_eq(memcmp(out, head, 16), 0);
    for (int k = 0; k < DIM; k++) {
        uint16_t h;
        bool c;
        memcpy(&h, out + 16 + 2 * k, 2);
        ck_assert_uint_eq(h, ps_half_from_f32_one(PS_HALF_BF16, row[k], &c));
    }
    ck_assert_int_eq(memcmp(out + 16 + DIM * 2, row + DIM, 2 * DIM * 4), 0);
    ck_assert_int_eq(psd_sparse_convert_row(f.t, t32, out, sizeof out, back, scratch,
                                            &clamped), 0);
    float wide[DIM];
    memcpy(wide, back + 16, sizeof wide);
    for (int k = 0; k < DIM; k++)
        ck_assert(wide[k] == round_to(PS_HALF_BF16, row[k]));
    ck_assert_int_eq(memcmp(back + 16 + DIM * 4, row + DIM, 2 * DIM * 4), 0);
    ck_assert_int_eq(psd_sparse_convert_row(t32, f.t, in, sizeof in - 4, out, scratch,
                                            &clamped), PS_ECORRUPT);
    ck_assert_uint_eq(clamped, 0);
    /* Into bfloat16 slots: the value as it was, the slots rounded. */
    Ps__V1__VariableSpec s16 = s32;
    s16.slot_dtype = PS__V1__DTYPE__DTYPE_BFLOAT16;
    psd_sparse_table *ts = psd_sparse_table_new(&s16, &f.o);
    uint8_t half_slots[16 + DIM * 4 + 2 * DIM * 2];
    ck_assert_uint_eq(psd_sparse_stored_bytes(ts), sizeof half_slots);
    ck_assert_int_eq(psd_sparse_convert_row(t32, ts, in, sizeof in, half_slots, scratch,
                                            &clamped), 0);
    ck_assert_int_eq(memcmp(half_slots, in, 16 + DIM * 4), 0);
    for (int k = 0; k < 2 * DIM; k++) {
        uint16_t h;
        bool c;
        memcpy(&h, half_slots + 16 + DIM * 4 + 2 * k, 2);
        ck_assert_uint_eq(h, ps_half_from_f32_one(PS_HALF_BF16, row[DIM + k], &c));
    }
    free(scratch);
    psd_sparse_table_free(ts);
    psd_sparse_table_free(t32);
    fx_close(&f, true);
}
END_TEST

/* A float16 slot past +-65504 is stored as +-65504 and counted: ADAGRAD's
 * accumulator after a gradient of 300 (90000.1). */
START_TEST(test_f16_slot_clamp)
{
    struct fx f;
    spec_make(&f, "emb16", 0, 0, 0);
    f.spec.slot_dtype = PS__V1__DTYPE__DTYPE_FLOAT16;
    f.opt.kind = PS__V1__OPTIMIZER__KIND__ADAGRAD;
    f.o = (psd_opt){.kind = PSD_OPT_ADAGRAD};
    psd_opt_defaults(&f.o);
    fx_open(&f, 0, 0, true);
    ck_assert_uint_eq(psd_sparse_stored_bytes(f.t), 16 + DIM * 4 + DIM * 2);
    int64_t id = 1;
    ck_assert_int_eq(push(&f, &id, 1, 300.0f, 1, UINT64_MAX, NULL), 0);
    ck_assert_uint_eq(stats(&f).sparse_values_clamped, DIM);
    /* The next update divides by sqrt(65504 + g^2), not sqrt(90000.1 + g^2). */
    float before = pull_one(&f, 1);
    ck_assert_int_eq(push(&f, &id, 1, 1.0f, 2, UINT64_MAX, NULL), 0);
    float want = before - 0.01f * 1.0f / (sqrtf(65504.0f + 1.0f) + 1e-7f);
    ck_assert_msg(fabsf(pull_one(&f, 1) - want) < 1e-7f, "%.9g, want %.9g",
                  pull_one(&f, 1), want);
    fx_close(&f, true);
}
END_TEST

/* Half slots are for sparse tables' validated optimizers: FLOAT16 with
 * ADAM is refused naming the table, BFLOAT16 taken; another dtype
 * refused. */
START_TEST(test_slot_dtype_refused)
{
    char why[256] = "";
    Ps__V1__Optimizer adam = PS__V1__OPTIMIZER__INIT;
    adam.kind = PS__V1__OPTIMIZER__KIND__ADAM;
    ck_assert_int_eq(psd_sparse_validate_slots("e", PS__V1__DTYPE__DTYPE_FLOAT16, &adam, why,
                                               sizeof why), PS_EINVAL_ARG);
    ck_assert_ptr_nonnull(strstr(why, "'e'"));
    ck_assert_ptr_nonnull(strstr(why, "ADAM"));
    ck_assert_int_eq(psd_sparse_validate_slots("e", PS__V1__DTYPE__DTYPE_BFLOAT16, &adam, why,
                                               sizeof why), 0);
    ck_assert_int_eq(psd_sparse_validate_slots("e", 7, &adam, why, sizeof why), PS_EDTYPE);
    ck_assert_ptr_nonnull(strstr(why, "slot_dtype 7"));
}
END_TEST

/* ---- segments ------------------------------------------------------------ */

/* One stored record is 32 bytes of record head and the row: 16 bytes of
 * row head and DIM floats (SGD has no slots). */
#define REC_BYTES (32 + 16 + DIM * 4)

/* Every overwrite leaves a dead record; the live bytes are the rows'. */
START_TEST(test_dead_bytes)
{
    struct fx f;
    fx_start(&f, 0, 0, 0, 0, 0);
    int64_t *ids = range(100, 50);
    ck_assert_int_eq(push(&f, ids, 50, 1.0f, 1, UINT64_MAX, NULL), 0);
    Ps__V1__StatsResponse r = settle(&f);
    ck_assert_uint_eq(r.sparse_segment_live_bytes, 50 * REC_BYTES);
    ck_assert_uint_le(r.sparse_segment_dead_bytes, 16); /* the file's header */
    ck_assert_int_eq(push(&f, ids, 20, 1.0f, 2, UINT64_MAX, NULL), 0);
    r = settle(&f);
    ck_assert_uint_eq(r.sparse_segment_live_bytes, 50 * REC_BYTES);
    ck_assert_uint_ge(r.sparse_segment_dead_bytes, 20 * REC_BYTES);
    fx_close(&f, true);
    /* Counted again from the catalog at open. */
    fx_open(&f, 0, 0, false);
    r = stats(&f);
    ck_assert_uint_eq(r.sparse_segment_live_bytes, 50 * REC_BYTES);
    ck_assert_uint_ge(r.sparse_segment_dead_bytes, 20 * REC_BYTES);
    ck_assert(pull_one(&f, 100) == -2.0f);
    ck_assert(pull_one(&f, 149) == -1.0f);
    free(ids);
    fx_close(&f, true);
}
END_TEST

static char *seg_file(void)
{
    char *p;
    ck_assert_int_ge(asprintf(&p, "%s/seg-00000001.psg", tmpdir), 0);
    return p;
}

/* Rows 0..39 pushed once (-1) and stored in the first segment, the tier
 * closed: that segment's path. */
static char *stored_segment(struct fx *f)
{
    fx_start(f, 0, 0, 0, 0, 0);
    int64_t *ids = range(0, 40);
    ck_assert_int_eq(push(f, ids, 40, 1.0f, 1, UINT64_MAX, NULL), 0);
    fx_close(f, true);
    free(ids);
    return seg_file();
}

/* A segment with a flipped byte in a committed record, or cut short of
 * the committed end: the tier does not open (psd does not start). */
static void damaged_case(bool truncate)
{
    struct fx f;
    char *p = stored_segment(&f);
    int fd = open(p, O_RDWR);
    ck_assert_int_ge(fd, 0);
    if (truncate) {
        ck_assert_int_eq(ftruncate(fd, 16 + 10 * REC_BYTES + 7), 0);
    } else {
        uint8_t b;
        off_t at = 16 + 5 * REC_BYTES + 40;
        ck_assert_int_eq(pread(fd, &b, 1, at), 1);
        b ^= 0x5a;
        ck_assert_int_eq(pwrite(fd, &b, 1, at), 1);
    }
    close(fd);
    ck_assert_int_eq(psd_store_open(tmpdir, 0, 0, &f.store), 0);
    struct psd_sparse_conf c = {.store = f.store, .data_dir = tmpdir};
    ck_assert_int_eq(psd_sparse_open(&c, &f.sp), PS_ECORRUPT);
    psd_store_close(f.store);
    free(p);
}

START_TEST(test_corrupt_segment)
{
    damaged_case(false);
}
END_TEST

START_TEST(test_truncated_segment)
{
    damaged_case(true);
}
END_TEST

/* Bytes past the end the catalog's last transaction recorded: a batch a
 * kill cut short before its transaction committed (its rows are still in
 * the row log). The tier cuts them off and opens; rows read back. */
START_TEST(test_uncommitted_tail)
{
    struct fx f;
    char *p = stored_segment(&f);
    int fd = open(p, O_WRONLY | O_APPEND);
    ck_assert_int_ge(fd, 0);
    uint8_t junk[3 * REC_BYTES / 2];
    memset(junk, 0xab, sizeof junk);
    ck_assert_int_eq(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    fx_open(&f, 0, 0, false);
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(st.st_size, 16 + 40 * REC_BYTES);
    for (int64_t id = 0; id < 40; id += 7)
        ck_assert(pull_one(&f, id) == -1.0f);
    fx_close(&f, true);
    free(p);
}
END_TEST

/* A directory of an older psd held each row's bytes in LMDB's rows db:
 * the tier moves them into the segments at open, and they read back. */
START_TEST(test_old_format)
{
    struct fx f;
    fx_start(&f, 0, 0, 0, 0, 0);
    fx_close(&f, true);
    ck_assert_int_eq(psd_store_open(tmpdir, 0, 0, &f.store), 0);
    uint32_t var_id;
    ck_assert_int_eq(psd_store_var_id(f.store, "emb", &var_id), 0);
    psd_store_txn *txn;
    ck_assert_int_eq(psd_store_begin(f.store, &txn), 0);
    for (int64_t id = -500; id < 500; id++) {
        uint64_t head[2] = {3, 7}; /* updates, last step */
        float row[DIM];
        for (int k = 0; k < DIM; k++)
            row[k] = (float)id / 4.0f;
        ck_assert_int_eq(psd_store_row_put(txn, var_id, id, head, sizeof head, row,
                                           sizeof row), 0);
    }
    ck_assert_int_eq(psd_store_commit(txn), 0);
    psd_store_close(f.store);
    fx_open(&f, 0, 0, false);
    /* Moved: the catalog's entries (33 bytes) in place of the rows. */
    psd_store_rtxn *rt;
    const void *d;
    size_t len;
    ck_assert_int_eq(psd_store_rbegin(f.store, &rt), 0);
    ck_assert_int_eq(psd_store_row_get(rt, var_id, -500, &d, &len), 0);
    ck_assert_uint_eq(len, 33);
    ck_assert_int_eq(psd_store_row_get(rt, var_id, 499, &d, &len), 0);
    ck_assert_uint_eq(len, 33);
    psd_store_rend(rt);
    ck_assert_uint_eq(stats(&f).sparse_segment_live_bytes, 1000 * REC_BYTES);
    ck_assert_uint_eq(stats(&f).sparse_rows, 1000);
    for (int64_t id = -500; id < 500; id += 37)
        ck_assert(pull_one(&f, id) == (float)id / 4.0f);
    ck_assert_uint_gt(stats(&f).sparse_segment_reads, 0);
    /* The row came along whole: a push updates what was stored. */
    int64_t one = 8;
    ck_assert_int_eq(push(&f, &one, 1, 1.0f, 9, UINT64_MAX, NULL), 0);
    ck_assert(pull_one(&f, 8) == 2.0f - 1.0f);
    fx_close(&f, true);
}
END_TEST

/* The index's part of id, as sparse_index.c hashes it. */
static unsigned ix_part(int64_t id)
{
    return (unsigned)(sparse_mix64((uint64_t)id ^ 0x5851f42d4c957f2dULL) >>
                      (64 - SPARSE_IX_PART_BITS));
}

static int64_t ix_id(size_t i)
{
    return (int64_t)(i * 0x9e3779b97f4a7c15ULL) >> 1; /* scattered, either sign */
}

/* The index of rows alone (sparse_index.c): 200,000 ids grow its parts,
 * each at most 7/8 full and the whole at least 3/4 (grown to 4/5); every
 * id found, absent ones not; every other one deleted (backward shift
 * through the probe runs) and the rest still found; set again. Then a
 * part filled to its limit exactly (the array not grown, every lookup,
 * of ids there or not, ending; a third deleted and set again) and one
 * more id, which grows it. */
START_TEST(test_index_table)
{
    static psd_sparse_table t; /* no tier: its counts stay the table's */
    memset(&t, 0, sizeof t);
    enum { N = 200000 };
    for (size_t i = 0; i < N; i++)
        ck_assert_int_eq(sparse_index_set(&t, ix_id(i), (uint64_t)i << 8 | 2), 0);
    ck_assert_uint_eq(t.ix.n, N);
    for (size_t p = 0; p < SPARSE_IX_PARTS; p++)
        ck_assert_uint_le(t.ix.part[p].n * 8, t.ix.part[p].cap * 7);
    ck_assert_uint_le(sparse_index_bytes(&t), (uint64_t)N * 16 * 4 / 3);
    for (size_t i = 0; i < N; i++)
        ck_assert_uint_eq(sparse_index_get(&t, ix_id(i)), (uint64_t)i << 8 | 2);
    for (size_t i = N; i < N + 1000; i++)
        ck_assert_uint_eq(sparse_index_get(&t, ix_id(i)), 0);
    for (size_t i = 0; i < N; i += 2)
        sparse_index_del(&t, ix_id(i));
    ck_assert_uint_eq(t.ix.n, N / 2);
    for (size_t i = 0; i < N; i++)
        ck_assert_uint_eq(sparse_index_get(&t, ix_id(i)), i % 2 ? (uint64_t)i << 8 | 2 : 0);
    for (size_t i = 0; i < N; i += 2)
        ck_assert_int_eq(sparse_index_set(&t, ix_id(i), (uint64_t)i << 9 | 3), 0);
    for (size_t i = 0; i < N; i++)
        ck_assert_uint_eq(sparse_index_get(&t, ix_id(i)),
                          i % 2 ? (uint64_t)i << 8 | 2 : (uint64_t)i << 9 | 3);
    sparse_index_free(&t);

    /* Part 0 filled to 7/8 of its array, no more. */
    struct sp_ixpart *x = &t.ix.part[0];
    int64_t in[1024];
    size_t n = 0, i = 0;
    for (; n == 0 || (x->n + 1) * 8 <= x->cap * 7; i++)
        if (ix_part(ix_id(i)) == 0) {
            ck_assert_uint_lt(n, 1024);
            in[n] = ix_id(i);
            ck_assert_int_eq(sparse_index_set(&t, in[n], (uint64_t)n + 2), 0);
            n++;
        }
    size_t cap = x->cap;
    ck_assert_uint_eq(x->n, n);
    ck_assert_uint_ge(n * 8 + 8, cap * 7); /* full: one more passes 7/8 */
    for (size_t k = 0; k < n; k++)
        ck_assert_uint_eq(sparse_index_get(&t, in[k]), (uint64_t)k + 2);
    for (size_t k = 0, j = i; k < 100; j++)
        if (ix_part(ix_id(j)) == 0) {
            ck_assert_uint_eq(sparse_index_get(&t, ix_id(j)), 0);
            k++;
        }
    for (size_t k = 0; k < n; k += 3) /* deletions in the full array */
        sparse_index_del(&t, in[k]);
    for (size_t k = 0; k < n; k++)
        ck_assert_uint_eq(sparse_index_get(&t, in[k]), k % 3 ? (uint64_t)k + 2 : 0);
    for (size_t k = 0; k < n; k += 3)
        ck_assert_int_eq(sparse_index_set(&t, in[k], (uint64_t)k + 2), 0);
    ck_assert_uint_eq(x->cap, cap);
    for (; ix_part(ix_id(i)) != 0; i++)
        ;
    ck_assert_int_eq(sparse_index_set(&t, ix_id(i), 7), 0);
    ck_assert_uint_gt(x->cap, cap);
    for (size_t k = 0; k < n; k++)
        ck_assert_uint_eq(sparse_index_get(&t, in[k]), (uint64_t)k + 2);
    ck_assert_uint_eq(sparse_index_get(&t, ix_id(i)), 7);
    sparse_index_free(&t);
}
END_TEST

PSCHECK_MAIN("sparse",
    {"half rows", {test_f16_rows, test_bf16_rows, test_f16_clamp, test_convert_row},
     &pscheck_tmp},
    {"half slots", {test_f16_slots, test_bf16_slots, test_mixed_slots, test_f16_slot_clamp,
                    test_slot_dtype_refused}, &pscheck_tmp},
    {"psd_sparse_push", {test_insert, test_nonfinite, test_admission}, &pscheck_tmp},
    {"psd_sparse_maintain", {test_ttl, test_max_rows}, &pscheck_tmp},
    {"caps", {test_caps, test_budget, test_budget_share, test_index}, &pscheck_tmp},
    {"sparse_index", {test_index_table}, &pscheck_tmp},
    {"psd_sparse_stop", {test_reopen_clean, test_reopen_replay, test_catalog_replay,
                         test_catalog_step, test_catalog_dropped, test_catalog_stop,
                         test_catalog_dropped_sweep, test_catalog_dropped_skip},
     &pscheck_tmp},
    {"psd_sparse_pull_next", {test_ahead_evicted, test_ahead_evicted_all,
                              test_ahead_evicted_mid, test_ahead_evicted_mid_all,
                              test_ahead_pushed, test_ahead_pushed_twice, test_ahead_helper,
                              test_ahead_helper_many, test_ahead_helper_busy,
                              test_read_evicted,
                              test_read_evicted_push, test_read_entry_dropped},
     &pscheck_tmp},
    {"sparse_compact_tick", {test_compact_sweep, test_compact_fail_sweep,
                             test_compact_fail_written}, &pscheck_tmp},
    {"segments", {test_dead_bytes, test_corrupt_segment, test_truncated_segment,
                  test_uncommitted_tail, test_old_format}, &pscheck_tmp})
