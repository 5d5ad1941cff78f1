/*
 * sparse_rows.c - the stored rows of sparse tables (sparse_internal.h):
 * finding a table's rows in the store and building its index of them, the
 * RAM tier's hits and misses, and the eviction sweeps (TTL and max_rows)
 * the flusher runs over the catalog.
 */
#include "server/sparse_internal.h"

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SWEEP_EVERY_MS 1000
#define SWEEP_WAIT_MS 10000
#define TTL_SWEEP_ROWS 65536

/* Learns the table's var_id, its row count and its index of rows, once
 * (the first call after it was created, loaded or restored). With t->mu
 * held: an apply, a relocation or a sweep of the table waits for it, and
 * then finds the index holding what LMDB held. */
int sparse_ready(psd_sparse *sp, psd_sparse_table *t)
{
    if (t->ready)
        return 0;
    uint64_t rows = 0;
    int rc = psd_store_var_id(sp->store, t->name, &t->var_id);
    if (rc == 0)
        rc = psd_store_rows_count(sp->store, t->var_id, &rows);
    if (rc == 0)
        rc = sparse_index_build(sp, t, rows, &t->rows);
    if (rc != 0) {
        ps_log_err(rc, "sparse table '%s': cannot find its rows in the store", t->name);
        return rc;
    }
    t->ready = true;
    if (t->sp != NULL)
        atomic_fetch_add(&sp->row_bytes, t->rows * t->row_bytes);
    return 0;
}

struct sp_entry *sparse_hit(psd_sparse *sp, struct sp_entry *e)
{
    if (!e->ref)
        e->ref = true; /* no store when set: the line stays clean */
    atomic_fetch_add_explicit(&sp->ram_hits, 1, memory_order_relaxed);
    return e;
}

struct sp_entry *sparse_get(psd_sparse *sp, psd_sparse_table *t, int64_t id)
{
    struct sp_entry *e = sparse_find(t, id);
    if (e != NULL)
        return sparse_hit(sp, e);
    atomic_fetch_add_explicit(&sp->ram_misses, 1, memory_order_relaxed);
    return NULL;
}

/* ---- sweeps ------------------------------------------------------------ */

struct sweep {
    psd_sparse *sp;
    struct sp_catw *w;
    psd_sparse_table *t;
    uint64_t clock;
    /* max_rows: pass 1 collects (last step, id); pass 2 deletes below cut */
    uint64_t *keys;
    size_t n, cap;
    uint64_t cut_step;
    int64_t cut_id;
    enum { SWEEP_TTL, SWEEP_COLLECT, SWEEP_CUT } mode;
    uint64_t deleted;
    uint64_t stale;         /* rows kept: their catalog entry is queued */
    uint64_t copying;       /* rows kept: a compaction step copies them */
    int64_t *gone;          /* (deleted) ids, out of the index once committed */
    size_t gone_cap;
};

static int collect_key(struct sweep *w, int64_t id, uint64_t last)
{
    if (w->n == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 4096;
        uint64_t *k = realloc(w->keys, nc * 2 * sizeof *k);
        if (k == NULL)
            return -ENOMEM;
        w->keys = k;
        w->cap = nc;
    }
    w->keys[2 * w->n] = last;
    w->keys[2 * w->n + 1] = (uint64_t)id;
    w->n++;
    return 0;
}

static int sweep_visit(void *ctx, int64_t id, const void *data, size_t len)
{
    struct sweep *w = ctx;
    psd_sparse_table *t = w->t;
    if (len < SPARSE_ROW_HEAD)
        return 0;
    uint64_t last = sparse_stored_last_step(data, len);
    struct sp_cat c;
    bool rec = sparse_cat_decode(data, len, &c);
    uint64_t at = rec ? sparse_loc_pack(c.loc, sparse_row_bytes(t) + PSD_SEG_REC_HEAD)
                      : SPARSE_LOC_LMDB;
    if (sparse_index_get(t, id) != at || (rec && !sparse_cat_covers(w->sp, c.loc))) {
        /* The catalog is behind (its entry queued), or the record would
         * be replayed at open, bringing the row back: kept this time. */
        w->stale++;
        return 0;
    }
    if (rec && c.loc.seg == atomic_load(&w->sp->compact_seg)) {
        /* A compaction step may have copied the record and not yet
         * pointed the index at the copy (or failed to), which lies past
         * "cat_upto": deleted now, the row would be replayed from it at
         * open. */
        w->copying++;
        return 0;
    }
    struct sp_entry **l = sparse_link(t, id);
    if (*l != NULL) {
        if (sparse_pinned(w->sp, *l))
            return 0; /* changed since the commit or not in LMDB yet: kept */
        last = (*l)->last_step;
    }
    if (w->mode == SWEEP_COLLECT)
        return collect_key(w, id, last);
    bool del = w->mode == SWEEP_CUT
                   ? last < w->cut_step || (last == w->cut_step && id < w->cut_id)
                   : w->clock > last && w->clock - last > t->ttl;
    if (!del)
        return 0;
    int64_t *g = ps_grow(w->gone, &w->gone_cap, w->deleted, sizeof *g, 4096);
    if (g == NULL)
        return -ENOMEM;
    w->gone = g;
    g[w->deleted] = id;
    if (*l != NULL)
        sparse_entry_drop(w->sp, t, l);
    sparse_cat_gone(w->w, data, len);
    w->deleted++;
    return 1;
}

static int cmp_pair(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    int64_t i = (int64_t)x[1], j = (int64_t)y[1];
    return i < j ? -1 : i > j;
}

/* The max_rows cut: one walk collects every row's (last step, id), a
 * second deletes the oldest down to max_rows. */
static int sweep_cut(psd_store_txn *txn, struct sweep *w)
{
    psd_sparse_table *t = w->t;
    int64_t from = INT64_MIN;
    int done = 0;
    w->mode = SWEEP_COLLECT;
    int rc = psd_store_rows_walk(txn, t->var_id, &from, SIZE_MAX, sweep_visit, w, &done);
    if (rc == 0 && w->n > t->max_rows) {
        qsort(w->keys, w->n, 2 * sizeof *w->keys, cmp_pair);
        size_t k = w->n - t->max_rows; /* the first k pairs go */
        w->cut_step = w->keys[2 * k];
        w->cut_id = (int64_t)w->keys[2 * k + 1];
        w->mode = SWEEP_CUT;
        from = INT64_MIN;
        rc = psd_store_rows_walk(txn, t->var_id, &from, SIZE_MAX, sweep_visit, w, &done);
    }
    free(w->keys);
    return rc;
}

/* One sweep of table t (mu held) in a transaction of its own. */
int sparse_sweep(psd_sparse *sp, psd_sparse_table *t, uint64_t clock)
{
    struct sp_catw cw;
    int rc = sparse_catw_begin(sp, &cw, false);
    if (rc != 0)
        return rc;
    psd_store_txn *txn = cw.t;
    struct sweep w = {.sp = sp, .w = &cw, .t = t, .clock = clock, .mode = SWEEP_TTL};
    int done = 0;
    if (t->ttl > 0) {
        rc = psd_store_rows_walk(txn, t->var_id, &t->sweep_from, TTL_SWEEP_ROWS,
                                 sweep_visit, &w, &done);
        if (done)
            t->sweep_from = INT64_MIN;
    }
    if (rc == 0 && t->max_rows > 0 && t->rows - w.deleted > t->max_rows)
        rc = sweep_cut(txn, &w);
    if (rc == 0 && w.deleted > 0)
        rc = sparse_catw_commit(&cw);
    else
        sparse_catw_abort(&cw);
    if (rc == 0) {
        for (uint64_t k = 0; k < w.deleted; k++)
            sparse_index_del(t, w.gone[k]);
        t->evicts += w.deleted;
        if (w.stale > 0) { /* due again once the queue is written */
            t->sweep_clock = UINT64_MAX;
            atomic_store(&sp->cat_asap, true);
        }
        if (w.copying > 0) /* due again after the step, or the catalog's write */
            t->sweep_clock = UINT64_MAX;
        t->rows -= w.deleted;
        atomic_fetch_add(&sp->evicted, w.deleted);
        atomic_fetch_sub(&sp->row_bytes, w.deleted * t->row_bytes);
    }
    free(w.gone);
    return rc;
}

void psd_sparse_maintain(psd_sparse *sp)
{
    int64_t now = ps_now_ms();
    pthread_mutex_lock(&sp->tables_mu);
    for (psd_sparse_table *t = sp->tables; t != NULL; t = t->next) {
        if (t->ttl == 0 && t->max_rows == 0)
            continue;
        uint64_t clock = atomic_load(&t->clock);
        sparse_flusher_lock(t);
        bool due = t->ready && now - t->last_sweep_ms >= SWEEP_EVERY_MS &&
                   (t->sweep_from != INT64_MIN || t->sweep_clock != clock ||
                    (t->max_rows && t->rows > t->max_rows));
        if (due && atomic_load(&sp->catq_len) > 0) {
            /* Rows whose catalog entry is behind the index are kept by the
             * sweep, and rows not in it yet unseen: the applier writes the
             * queue now (which makes the sweep due again), and the sweep
             * waits for it, unless the queue kept it waiting too long. */
            atomic_store(&sp->cat_asap, true);
            pthread_cond_signal(&sp->apply_cond);
            due = now - t->last_sweep_ms >= SWEEP_WAIT_MS;
        }
        if (due && sp->rowlog != NULL && psd_rowlog_total(sp->rowlog) > 0) {
            /* Rows still in the log are not in LMDB, where the sweep looks:
             * apply now (the apply makes the sweep due again). */
            atomic_store(&sp->apply_asap, true);
            pthread_cond_signal(&sp->apply_cond);
        }
        if (due) {
            t->last_sweep_ms = now;
            t->sweep_clock = clock;
            int rc = sparse_sweep(sp, t, clock);
            if (rc != 0)
                ps_log_err(rc, "sparse table '%s': eviction sweep failed", t->name);
        }
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&sp->tables_mu);
}
