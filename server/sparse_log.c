/*
 * sparse_log.c - the row log's second half (rowlog.h has the files): the
 * commit that appends a batch of changed rows to it, its replay when psd
 * opens its store, the applier thread that writes a sealed
 * file's rows into LMDB behind the pushes, the drain a checkpoint and a
 * full RAM tier wait for, and the batches a checkpoint's copy adds.
 *
 * The applier appends each row's last state to the segments (segment.h),
 * syncs them, and then commits the LMDB transaction that points the
 * catalog at them (sparse_seg.c), and then the table's index of rows
 * (sparse_index.c): a row is in LMDB, as the applied mark says, only once
 * its bytes are on the disk, and it leaves the RAM tier only once the
 * index points at them.
 *
 * Why a log: a commit used to put every changed row into LMDB, whose
 * copy-on-write B+tree rewrites the 4 KiB leaf page of each scattered row
 * (a ~530-byte row of dim 64 with Adagrad), and fsynced it: the disk's
 * bandwidth bounded pushes at 8 times the bytes that changed. The log
 * takes a commit's rows as one sequential write and one fdatasync (the
 * same kill -9 and power-loss bounds), and the applier writes each row
 * once per file, however often it changed in between: hot rows of a Zipf
 * stream change many times a second.
 *
 * An entry of the RAM tier stays in memory until the batch that last held
 * it is applied (sparse_pinned), so reads never see LMDB behind the log.
 * Records of tables deleted or replaced by a Restore are skipped (their
 * var_ids are never reused); at open they are written and deleted by the
 * store's collection of orphan rows.
 */
#include "server/sparse_internal.h"

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The applier starts when the active file reaches APPLY_MAX_BYTES (or a
 * quarter of the RAM tier's budget, whichever is less), when it holds
 * anything APPLY_EVERY_MS after the last apply, or at once when an
 * eviction sweep is due (sp->apply_asap: a sweep sees only LMDB's rows).
 * A Zipf stream touches most of a table's leaf pages within a few
 * seconds, so an apply rewrites nearly the whole file whatever the log
 * holds, and fewer applies write less: an apply every 10 s took
 * bench/sparse's sustained pushes (1000 calls) from 542k to 662k rows/sp,
 * but its 4x-over pushes had a p99 of 1.2-1.3 s (77 ms every 2 sp), not
 * understood yet: 2 s it is. */
#define APPLY_EVERY_MS 2000
#define APPLY_MAX_BYTES ((uint64_t)1 << 30)
/* Rows per LMDB transaction: its dirty pages (a page per scattered row)
 * are malloc'd by LMDB. */
#define APPLY_CHUNK_MAX 8192
#define APPLY_CHUNK_MIN 256

struct rec {
    uint32_t var_id, len;
    int64_t id;
    uint64_t ord, seq;
    const uint8_t *data;
};

struct apply {
    psd_store *st;
    const uint32_t *live; /* sorted; NULL: every table */
    size_t nlive;
    uint64_t upto;        /* batches above it are left out */
    struct rec *r;
    size_t n, cap;
    uint64_t last;        /* the last batch seen */
    size_t chunk;         /* rows a chunk holds at most */
    uint64_t seg_bytes;   /* and, to the segments, bytes of records */
    uint64_t mark;        /* the applied mark to set: last, or more */
    psd_sparse *sp;       /* the tier: its counts of pages */
    psd_segs *segs;       /* rows go to the segments, and st holds the
                             catalog; NULL: the rows' bytes go into st (a
                             checkpoint's copy) */
};

int sparse_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int collect(void *ctx, uint64_t seq, uint32_t var_id, int64_t id, const uint8_t *data,
                   uint32_t len)
{
    struct apply *a = ctx;
    if (seq > a->upto)
        return 0;
    if (seq > a->last)
        a->last = seq;
    if (a->live && !bsearch(&var_id, a->live, a->nlive, sizeof *a->live, sparse_cmp_u32))
        return 0;
    size_t cap = a->cap;
    struct rec *nr = ps_grow(a->r, &a->cap, a->n, sizeof *nr, 65536);
    if (nr == NULL)
        return -ENOMEM;
    a->r = nr;
    if (a->cap != cap)
        atomic_fetch_add(&a->sp->apply_bytes, (a->cap - cap) * sizeof *nr);
    a->r[a->n] = (struct rec){var_id, len, id, a->n, seq, data};
    a->n++;
    return 0;
}

int sparse_cmp_row(uint32_t va, int64_t ia, uint64_t oa, uint32_t vb, int64_t ib, uint64_t ob)
{
    if (va != vb)
        return va < vb ? -1 : 1;
    if (ia != ib)
        return ia < ib ? -1 : 1;
    return oa < ob ? -1 : oa > ob;
}

static int cmp_rec(const void *pa, const void *pb)
{
    const struct rec *x = pa, *y = pb;
    return sparse_cmp_row(x->var_id, x->id, x->ord, y->var_id, y->id, y->ord);
}

static int cmp_ord(const void *pa, const void *pb)
{
    const struct rec *x = pa, *y = pb;
    return x->ord < y->ord ? -1 : x->ord > y->ord;
}

static bool same_row(const struct rec *x, const struct rec *y)
{
    return x->var_id == y->var_id && x->id == y->id;
}

/* Appends a->r[i..end) to the segments and syncs them: loc[k - i] is
 * where row k went. On failure the segments are as they were. */
static int append_chunk(struct apply *a, size_t i, size_t end, psd_seg_loc *loc)
{
    int rc = 0;
    for (size_t k = i; k < end && rc == 0; k++) {
        const struct rec *r = &a->r[k];
        rc = psd_segs_append(a->segs, r->var_id, r->id, r->seq, r->data, r->len, NULL, 0,
                             &loc[k - i]);
    }
    if (rc != 0) {
        psd_segs_discard(a->segs);
        return rc;
    }
    rc = psd_segs_sync(a->segs);
    atomic_store(&a->sp->seg_full, rc == PS_EFULL);
    return rc;
}

/* Writes row r's bytes into a checkpoint's copy. */
static int put_row(struct sp_catw *w, const struct rec *r)
{
    uint32_t head = r->len < SPARSE_ROW_HEAD ? r->len : SPARSE_ROW_HEAD;
    return psd_store_row_put(w->t, r->var_id, r->id, r->data, head, r->data + head,
                             r->len - head);
}

/* After chunk r[0..n) committed (at loc): the catalog queue gets their
 * entries, and the indexes their locations. Room for both was made. */
static void chunk_committed(struct apply *a, const struct rec *r, size_t n,
                            const psd_seg_loc *loc, struct sp_ixset *ix)
{
    for (size_t k = 0; k < n; k++) {
        struct sp_catq e = {.var_id = r[k].var_id, .id = r[k].id, .loc = loc[k],
                            .version = r[k].seq};
        if (r[k].len >= SPARSE_ROW_HEAD)
            memcpy(&e.last_step, r[k].data + 8, sizeof e.last_step);
        sparse_catq_add(a->sp, &e);
    }
    sparse_index_apply(a->sp, ix, n, false);
}

/* Puts the last record of each row, in the log's order (a checkpoint's
 * copy: in key order), in chunks of a->chunk
 * rows (and a->seg_bytes of records): into the segments, each chunk
 * appended and synced before the transaction that moves "segs_end" over
 * it (the commit point) commits,
 * its entries then queued for the catalog (sparse_cat_flush writes them
 * later, many applies' worth in one pass) and pointed at by the indexes;
 * or, into a checkpoint's copy, the rows' bytes. The last transaction also
 * sets the applied mark. A full map is grown and the transaction done
 * again (the records stay: the same ones are pointed at). */
static int put_all(void *ctx)
{
    struct apply *a = ctx;
    if (a->last > a->mark)
        a->mark = a->last;
    if (a->n > 1) /* an empty log file has no records: a->r may be NULL */
        qsort(a->r, a->n, sizeof *a->r, cmp_rec);
    size_t u = 0; /* the last record of each row, in key order */
    for (size_t j = 0; j < a->n; j++)
        if (j + 1 == a->n || !same_row(&a->r[j], &a->r[j + 1]))
            a->r[u++] = a->r[j];
    a->n = u;
    /* To the segments in the log's order: their bytes are read from the
     * log's mapping, and in key order each record was a fault at a random
     * place of a file larger than the page cache a memory group leaves
     * (bench/sparse at 4M rows in a 627 MiB group: the applier spent 99% of
     * its time in those faults, the RAM tier filled with rows pinned until
     * applied, and a push waited for room for more than 6 s). The catalog
     * sorts its entries itself; a checkpoint's copy into LMDB keeps key
     * order, LMDB's own. */
    if (a->segs != NULL && a->n > 1)
        qsort(a->r, a->n, sizeof *a->r, cmp_ord);
    psd_seg_loc *loc = a->segs ? malloc(a->chunk * sizeof *loc) : NULL;
    struct sp_ixset *ix = a->segs ? malloc(a->chunk * sizeof *ix) : NULL;
    int rc = a->segs != NULL && (loc == NULL || ix == NULL) ? -ENOMEM : 0;
    /* What an open replays, and what the catalog needs of the store's
     * file, are bounded: past twice what has the applier write the
     * catalog (it fell behind) it is written first, and while it cannot be
     * (a full map or disk) nothing more is applied, so that pushes are
     * refused as before, naming why. */
    if (rc == 0 && a->segs != NULL && sparse_cat_due(a->sp, true))
        rc = sparse_cat_flush(a->sp, a->live == NULL);
    size_t i = 0, end = 0;
    bool appended = false;
    while (rc == 0) {
        if (!appended) /* else the same chunk again: its records are appended */
            end = i + a->chunk < a->n ? i + a->chunk : a->n;
        if (a->segs != NULL && !appended) /* and at most seg_bytes of records */
            for (size_t k = i, b = 0; k < end; k++)
                if ((b += a->r[k].len + PSD_SEG_REC_HEAD) >= a->seg_bytes) {
                    end = k + 1;
                    break;
                }
        if (a->segs != NULL && !appended) {
            if ((rc = append_chunk(a, i, end, loc)) != 0)
                break;
            appended = true;
            for (size_t k = i; k < end; k++)
                ix[k - i] = (struct sp_ixset){.var_id = a->r[k].var_id, .id = a->r[k].id,
                                              .loc = loc[k - i]};
        }
        /* Room first: once the transaction commits, queueing the entries
         * and pointing the indexes at the records cannot fail. */
        if (a->segs != NULL && ((rc = sparse_catq_reserve(a->sp, end - i)) != 0 ||
                                (rc = sparse_index_apply(a->sp, ix, end - i, true)) != 0))
            break;
        struct sp_catw w = {0};
        rc = a->segs ? sparse_catw_begin(a->sp, &w, true) : psd_store_begin(a->st, &w.t);
        for (size_t k = i; a->segs != NULL && rc == 0 && k < end; k++)
            sparse_catw_live(&w, ix[k - i].was, loc[k - i]); /* the index's change */
        size_t j = a->segs ? end : i;
        for (; rc == 0 && j < end; j++) {
            rc = put_row(&w, &a->r[j]);
            if (((j - i + 1) & 255) == 0)
                atomic_store(&a->sp->apply_pages, j - i + 1);
        }
        if (rc == 0 && j >= a->n && a->mark > 0)
            rc = psd_store_set_log_mark(w.t, PSD_STORE_LOG_APPLIED, a->mark);
        if (a->segs != NULL)
            rc = sparse_catw_end(&w, rc);
        else if (rc == 0)
            rc = psd_store_commit(w.t);
        else
            psd_store_abort(w.t);
        atomic_store(&a->sp->apply_pages, 0);
        if (rc == PS_EFULL && psd_store_grow(a->st) == 0)
            continue; /* the same rows again in a bigger map */
        if (rc != 0)
            break;
        if (a->segs != NULL && j > i) /* a->r is NULL with no record */
            chunk_committed(a, a->r + i, j - i, loc, ix);
        appended = false;
        i = j;
        if (i >= a->n)
            break;
    }
    free(loc);
    free(ix);
    return rc;
}

/* A chunk of the segments' path at most: its transaction only moves
 * "segs_end" (the entries go to the catalog's queue), so it is bounded by
 * the records the segments buffer before their sync, a 16th of the RAM
 * budget. Each chunk costs an fdatasync of the segments and an LMDB
 * commit (two more): bounded at a page per row as the catalog's writes
 * were, bench/sparse's 4x-over applies (~20k rows, a quarter of the
 * budget in the log) committed 14 times each, and a push waiting for
 * room waited for all of them. */
#define APPLY_SEG_ROWS 16384

static uint64_t seg_chunk_bytes(psd_sparse *sp)
{
    uint64_t b = sparse_budget(sp) / 16;
    return b < ((uint64_t)1 << 20) ? (uint64_t)1 << 20 : b > ((uint64_t)16 << 20)
                                                         ? (uint64_t)16 << 20 : b;
}

static size_t chunk_rows(psd_sparse *sp)
{
    uint64_t c = sparse_budget(sp) / 8 / SPARSE_DIRTY_PAGE;
    return c > APPLY_CHUNK_MAX ? APPLY_CHUNK_MAX : c < APPLY_CHUNK_MIN ? APPLY_CHUNK_MIN : c;
}

/* Writes the rows of file which's batches in (after, upto] into st and
 * sets its applied mark (to at least mark). *last: the last batch. */
static int apply_file(psd_sparse *sp, psd_store *st, int which, uint64_t after,
                      uint64_t upto, const uint32_t *live, size_t nlive, uint64_t mark,
                      uint64_t *last)
{
    bool segs = st == sp->store;
    struct apply a = {.st = st, .live = live, .nlive = nlive, .upto = upto,
                      .chunk = segs ? APPLY_SEG_ROWS : chunk_rows(sp), .mark = mark,
                      .sp = sp, .segs = segs ? sp->segs : NULL,
                      .seg_bytes = seg_chunk_bytes(sp)};
    int rc = psd_rowlog_walk(sp->rowlog, which, after, collect, put_all, &a, NULL);
    free(a.r);
    atomic_fetch_sub(&sp->apply_bytes, a.cap * sizeof *a.r);
    if (last)
        *last = a.last;
    return rc;
}

/* ---- commits ------------------------------------------------------------ */

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int entry_by_id(const void *a, const void *b)
{
    int64_t x = (*(struct sp_entry *const *)a)->id, y = (*(struct sp_entry *const *)b)->id;
    return x < y ? -1 : x > y;
}

/* sp->logbuf, the batch being built, is kept from one commit to the next
 * so that a commit every 20 ms costs no allocation; let go after a burst
 * made it big. */
#define LOGBUF_KEEP ((size_t)16 << 20)

/* Copies the changed rows of t into the batch, under t->mu all at once
 * (each marked as being saved at its current change, and as held by batch
 * seq), so that a batch holds the table as of one moment: a push is in it
 * whole or not at all. The buffer grows before the copy, under the mutex
 * only the copy runs. */
static int flush_table(psd_sparse_table *t, uint64_t seq, ps_buf *b, uint32_t *nrecs)
{
    size_t recb = sparse_row_bytes(t);
    sparse_flusher_lock(t);
    size_t n0 = t->ready ? t->dn : 0;
    if (n0 == 0) {
        pthread_mutex_unlock(&t->mu);
        return 0;
    }
    if (ps_buf_reserve(b, b->len + n0 * (PSD_ROWLOG_REC_HEAD + recb)) != 0) {
        pthread_mutex_unlock(&t->mu);
        return -ENOMEM;
    }
    /* In id order, the order of the keys: the applier's sort has less to
     * do. */
    qsort(t->dlist, t->dn, sizeof *t->dlist, entry_by_id);
    uint32_t rl = (uint32_t)recb;
    for (size_t j = 0; j < n0; j++) {
        struct sp_entry *e = t->dlist[j];
        if (!sparse_dirty(e))
            continue;
        uint8_t *r = b->data + b->len;
        memcpy(r, &t->var_id, 4);
        memcpy(r + 4, &rl, 4);
        memcpy(r + 8, &e->id, 8);
        r += PSD_ROWLOG_REC_HEAD;
        memcpy(r, &e->updates, 8);
        memcpy(r + 8, &e->last_step, 8);
        memcpy(r + SPARSE_ROW_HEAD, e->row, recb - SPARSE_ROW_HEAD);
        b->len += PSD_ROWLOG_REC_HEAD + recb;
        (*nrecs)++;
        e->saving = e->mod;
        e->logged = seq;
    }
    pthread_mutex_unlock(&t->mu);
    return 0;
}

int psd_sparse_flush(psd_sparse *sp, bool *wrote)
{
    int rc = 0;
    uint64_t seq = atomic_load(&sp->log_seq) + 1;
    *wrote = false;
    sp->flush_t0_us = now_us();
    sp->flush_rows = atomic_load(&sp->dirty);
    ps_buf *b = &sp->logbuf;
    uint32_t nrecs = 0;
    b->len = 0;
    pthread_mutex_lock(&sp->tables_mu);
    for (psd_sparse_table *t = sp->tables; t != NULL && rc == 0; t = t->next)
        rc = flush_table(t, seq, b, &nrecs);
    pthread_mutex_unlock(&sp->tables_mu);
    if (rc == 0 && nrecs > 0) {
        rc = psd_rowlog_append(sp->rowlog, seq, b->data, b->len, nrecs);
        *wrote = rc == 0;
    }
    if (*wrote) {
        atomic_store(&sp->log_seq, seq);
        atomic_fetch_add(&sp->log_batches, 1);
    }
    if (b->cap > LOGBUF_KEEP)
        ps_buf_free(b);
    return rc;
}

uint64_t psd_sparse_logged(psd_sparse *sp)
{
    return atomic_load(&sp->log_seq);
}

/* Rows written are clean (ok), or stay dirty; either way the tier is
 * trimmed to its budget. */
static void committed_table(psd_sparse *sp, psd_sparse_table *t, bool ok)
{
    sparse_flusher_lock(t);
    size_t keep = 0;
    for (size_t k = 0; k < t->dn; k++) {
        struct sp_entry *e = t->dlist[k];
        bool was = sparse_dirty(e);
        if (ok)
            e->saved = e->saving;
        e->saving = e->saved;
        if (was && !sparse_dirty(e)) {
            t->ndirty--;
            atomic_fetch_sub(&sp->dirty, 1);
        }
        if (sparse_dirty(e))
            t->dlist[keep++] = e; /* changed again, or the commit failed */
        else
            e->listed = false;
    }
    t->dn = keep;
    sparse_trim(sp, t);
    pthread_mutex_unlock(&t->mu);
}

void psd_sparse_committed(psd_sparse *sp, bool ok)
{
    int64_t took = now_us() - sp->flush_t0_us;
    if (ok && sp->flush_rows >= 1024 && took > 0) {
        double r = (double)sp->flush_rows * 1000.0 / (double)took;
        double old = atomic_load(&sp->rows_per_ms);
        atomic_store(&sp->rows_per_ms, old > 0 ? 0.7 * old + 0.3 * r : r);
    }
    pthread_mutex_lock(&sp->tables_mu);
    for (psd_sparse_table *t = sp->tables; t != NULL; t = t->next)
        committed_table(sp, t, ok);
    pthread_mutex_unlock(&sp->tables_mu);
}

/* After an apply of the row log: drops clean, applied rows from every
 * table while the RAM tier is above its budget, and makes each table's
 * eviction sweep due again (the rows it could not see in LMDB are there
 * now). */
static void after_apply(psd_sparse *sp)
{
    pthread_mutex_lock(&sp->tables_mu);
    for (psd_sparse_table *t = sp->tables; t != NULL; t = t->next) {
        sparse_flusher_lock(t);
        sparse_trim(sp, t);
        t->sweep_clock = UINT64_MAX;
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&sp->tables_mu);
}

/* ---- replay, applier, drains -------------------------------------------- */

/* Opens the row log (the segments open) and writes what it holds beyond
 * the store's applied mark into the store, older file first: a crash left
 * those batches acknowledged but not applied. Then empties both. */
static int log_open(psd_sparse *sp)
{
    int rc = psd_rowlog_open(sp->data_dir, &sp->rowlog);
    uint64_t applied = 0, last[2] = {0, 0};
    if (rc == 0)
        rc = psd_store_log_mark(sp->store, PSD_STORE_LOG_APPLIED, &applied);
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = psd_rowlog_walk(sp->rowlog, i, UINT64_MAX, NULL, NULL, NULL, &last[i]);
    int first = last[0] <= last[1] ? 0 : 1;
    uint64_t top = applied;
    for (int k = 0; k < 2 && rc == 0; k++) {
        int i = k == 0 ? first : !first;
        if (last[i] <= applied)
            continue;
        uint64_t got = 0;
        rc = apply_file(sp, sp->store, i, applied, UINT64_MAX, NULL, 0, 0, &got);
        if (rc == 0) {
            ps_log_info("row log: replayed batches %llu-%llu of %s (acknowledged "
                        "before psd stopped, not yet in LMDB)",
                        (unsigned long long)applied + 1, (unsigned long long)got,
                        i ? "rows.log.1" : "rows.log.0");
            applied = top = got;
            atomic_store(&sp->seg_recount, true); /* counted from the catalog below */
        }
    }
    /* What the replay applied, into the catalog before any table reads it. */
    if (rc == 0)
        rc = sparse_cat_flush(sp, true);
    if (rc == 0 && atomic_load(&sp->seg_recount))
        rc = sparse_seg_recount(sp);
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = psd_rowlog_reset(sp->rowlog, i);
    if (rc != 0) {
        ps_log_err(rc, "cannot write the row log of %s into LMDB (its rows were "
                   "acknowledged and stay in the log: free the disk and start psd again)",
                   sp->data_dir);
        return rc;
    }
    if (last[0] > top)
        top = last[0];
    if (last[1] > top)
        top = last[1];
    atomic_store(&sp->log_seq, top);
    atomic_store(&sp->log_applied, top);
    return 0;
}

/* Opens the segments (sparse_seg.c) and the row log, and applies the
 * log. Called by psd_sparse_open, before the shard loads its
 * variables. */
int sparse_log_open(psd_sparse *sp, char *why, size_t whylen)
{
    sp->cat_roomy = true; /* no table is ready yet: no RAM tier */
    int rc = sparse_segs_open(sp, why, whylen);
    if (rc == 0)
        rc = log_open(sp);
    sp->cat_roomy = false;
    return rc;
}

uint32_t *sparse_live_ids(psd_sparse *sp, size_t *n)
{
    pthread_mutex_lock(&sp->tables_mu);
    size_t cap = 1;
    for (psd_sparse_table *t = sp->tables; t != NULL; t = t->next)
        cap++;
    uint32_t *ids = malloc(cap * sizeof *ids);
    *n = 0;
    for (psd_sparse_table *t = sp->tables; ids && t != NULL; t = t->next) {
        sparse_lock(t);
        if (t->ready)
            ids[(*n)++] = t->var_id;
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&sp->tables_mu);
    if (ids)
        qsort(ids, *n, sizeof *ids, sparse_cmp_u32);
    return ids;
}

/* Applies the sealed file, sealing the active one first when the sealed
 * one is empty; *did: something was applied. apply_run_mu held. */
static int apply_sealed(psd_sparse *sp, bool *did)
{
    psd_rowlog *l = sp->rowlog;
    *did = false;
    int which = !psd_rowlog_active(l);
    if (psd_rowlog_bytes(l, which) == 0 && (which = psd_rowlog_seal(l)) < 0)
        return 0;
    size_t nlive;
    uint32_t *live = sparse_live_ids(sp, &nlive);
    if (live == NULL)
        return -ENOMEM;
    uint64_t last = 0;
    int rc = apply_file(sp, sp->store, which, atomic_load(&sp->log_applied), UINT64_MAX,
                        live, nlive, 0, &last);
    free(live);
    if (rc == 0)
        rc = psd_rowlog_reset(l, which);
    if (rc != 0)
        return rc;
    if (last > atomic_load(&sp->log_applied))
        atomic_store(&sp->log_applied, last);
    *did = true;
    after_apply(sp);
    return 0;
}

/* Applies the sealed file, then the active one: both, or (room) only
 * until the RAM tier is back within its budget, each apply letting the
 * tier drop the rows it unpins. apply_run_mu held. */
static int drain_locked(psd_sparse *sp, bool room)
{
    bool did = true;
    int rc = 0;
    for (int k = 0; k < 3 && did && rc == 0 &&
                    (!room || sparse_ram_cost(sp) > sparse_budget(sp)); k++)
        rc = apply_sealed(sp, &did);
    /* The catalog queue counts against the budget too: dropped when it is
     * what is left over it (a small budget), its entries read from the
     * records by the next write. */
    if (rc == 0 && room && sp->catq_n > 0 && !sp->catw_scan &&
        sparse_ram_cost(sp) > sparse_budget(sp))
        sparse_cat_drop(sp);
    return rc;
}

/* Applies the log (drain_locked) and, unless only room is wanted, writes
 * the catalog queue too. */
static int drain(psd_sparse *sp, bool room)
{
    if (sp->rowlog == NULL)
        return 0;
    pthread_mutex_lock(&sp->apply_run_mu);
    int rc = drain_locked(sp, room);
    if (rc == 0 && !room)
        rc = sparse_cat_flush(sp, false);
    pthread_mutex_unlock(&sp->apply_run_mu);
    if (rc != 0)
        ps_log_err(rc, "applying the row log to the segments and LMDB failed");
    return rc;
}

int psd_sparse_drain(psd_sparse *sp)
{
    return drain(sp, false);
}

/* The catalog's write at a clean stop: at most this long. The write adds
 * nothing to what survives (the next open replays the records past
 * "cat_upto" into the catalog, as after a kill), and written whole after
 * a burst of new rows (dim 64, --memory-limit 512M: the queue dropped, the
 * records read back) it took 2.7-3.1 s of the stop after 1M rows and
 * 5.4-11.2 s after 3M, where the next open replays them in 1.3 s and
 * 3.5 s: docker compose's 10 s stop timeout is shared with
 * --shutdown-grace's drain of the calls and the row log's apply. A queue
 * held is a 32nd of the RAM budget at most, and 614k entries of it were
 * written in 0.36 s: a second writes it whole unless the budget is
 * gigabytes. */
#define SPARSE_STOP_CAT_MS 1000

/* Writes the catalog's queue at a clean stop for SPARSE_STOP_CAT_MS at
 * most. A queue that was dropped is not written at all: the write would
 * first read the records past "cat_upto" from the segments, a chunk of up
 * to half the budget at once, which is the next open's replay itself (the
 * same reads, the same entries), and which a stop cut short would do
 * twice. The RAM tier stays (freed with the tables): the write takes no
 * memory beyond the queue's, and letting the tier go entry by entry took
 * 0.4-0.5 s of the stop after 1M new rows and up to 3.2 s after 3M.
 * apply_run_mu held. */
static int stop_catalog(psd_sparse *sp)
{
    if (!sparse_cat_behind(sp))
        return 0;
    int64_t t0 = ps_now_ms();
    int rc = 0;
    if (atomic_load(&sp->tables_gone) != sp->cat_gone_done) {
        /* A table went since the last write: its records would come back
         * at the open as rows of no variable. Rare (a deletion or a
         * restore in the last span): written whole, as before. */
        rc = sparse_cat_flush(sp, false);
        if (rc == 0)
            ps_log_info("catalog: written whole at the stop in %lld ms (a sparse table "
                        "went since its last write)", (long long)(ps_now_ms() - t0));
        return rc;
    }
    if (!sparse_cat_reads(sp))
        rc = sparse_cat_flush_until(sp, false, t0 + SPARSE_STOP_CAT_MS);
    if (rc == 0 && sparse_cat_behind(sp))
        ps_log_info("catalog: %zu applied entries (%llu MiB of records) left to the next "
                    "open's replay, after %lld ms of writing at the stop",
                    atomic_load(&sp->catq_len),
                    (unsigned long long)(sparse_cat_span(sp) >> 20),
                    (long long)(ps_now_ms() - t0));
    else if (rc == 0)
        ps_log_info("catalog: written at the stop in %lld ms", (long long)(ps_now_ms() - t0));
    return rc;
}

int sparse_stop_drain(psd_sparse *sp)
{
    if (sp->rowlog == NULL)
        return 0;
    pthread_mutex_lock(&sp->apply_run_mu);
    int64_t t0 = ps_now_ms();
    int rc = drain_locked(sp, false);
    if (rc == 0) {
        ps_log_info("row log: applied at the stop in %lld ms", (long long)(ps_now_ms() - t0));
        rc = stop_catalog(sp);
    }
    pthread_mutex_unlock(&sp->apply_run_mu);
    if (rc != 0)
        ps_log_err(rc, "applying the row log to the segments and LMDB failed");
    return rc;
}

/* A push past the budget used to wait for the whole log, which took
 * bench/sparse's 4x-over push p99 to 1.4-1.5 s; until the tier fits,
 * 0.35-0.8 s (the same throughput: the applier bounds it). The applier
 * does it (no rpc thread writes to LMDB) and the caller waits for that
 * round; without an applier (stopped, or never started) the caller does
 * it. */
int psd_sparse_make_room(psd_sparse *sp)
{
    pthread_mutex_lock(&sp->apply_mu);
    if (!sp->applier_started || sp->apply_quit) {
        pthread_mutex_unlock(&sp->apply_mu);
        return drain(sp, true);
    }
    uint64_t mine = ++sp->room_req;
    pthread_cond_signal(&sp->apply_cond);
    while (sp->room_done < mine && !sp->apply_quit)
        pthread_cond_wait(&sp->room_cond, &sp->apply_mu);
    int rc = sp->room_done >= mine ? sp->room_rc : 0;
    pthread_mutex_unlock(&sp->apply_mu);
    return rc;
}

/* The applier's side of psd_sparse_make_room: one round for every push
 * that asked until now. apply_mu held on entry and exit. */
static void room_round(psd_sparse *sp)
{
    uint64_t want = sp->room_req;
    if (want == sp->room_done)
        return;
    pthread_mutex_unlock(&sp->apply_mu);
    int rc = drain(sp, true);
    pthread_mutex_lock(&sp->apply_mu);
    sp->room_done = want;
    sp->room_rc = rc;
    pthread_cond_broadcast(&sp->room_cond);
}

static void *applier_main(void *arg)
{
    psd_sparse *sp = arg;
    pthread_setname_np(pthread_self(), "psd-apply");
    int64_t logged_ms = 0;
    bool cat_busy = false; /* a write of the catalog queue under way: no wait */
    pthread_mutex_lock(&sp->apply_mu);
    while (!sp->apply_quit) {
        struct timespec until = ps_time_after_ms(CLOCK_REALTIME, 50);
        if (sp->room_req == sp->room_done && !cat_busy)
            pthread_cond_timedwait(&sp->apply_cond, &sp->apply_mu, &until);
        if (sp->apply_quit)
            break;
        room_round(sp);
        pthread_mutex_unlock(&sp->apply_mu);
        psd_rowlog *l = sp->rowlog;
        int a = psd_rowlog_active(l);
        uint64_t act = psd_rowlog_bytes(l, a), trig = sparse_budget(sp) / 4;
        if (trig > APPLY_MAX_BYTES)
            trig = APPLY_MAX_BYTES;
        int64_t now = ps_now_ms();
        bool asap = atomic_exchange(&sp->apply_asap, false);
        if (act >= trig || psd_rowlog_bytes(l, !a) > 0 || (act > 0 && asap) ||
            (act > 0 && now - sp->last_apply_ms >= APPLY_EVERY_MS)) {
            pthread_mutex_lock(&sp->apply_run_mu);
            bool did;
            int rc = apply_sealed(sp, &did);
            pthread_mutex_unlock(&sp->apply_run_mu);
            sp->last_apply_ms = ps_now_ms();
            if (rc != 0 && sp->last_apply_ms - logged_ms > 10000) {
                ps_log_err(rc, "applying the row log to the segments and LMDB failed "
                           "(tried again; its rows stay in memory and in the log)");
                logged_ms = sp->last_apply_ms;
            }
        }
        /* The catalog is written lazily: while pushes run only once what
         * an open would replay passes SPARSE_CAT_SPAN (or its entries near
         * the room left in the store's file), and when a sweep
         * or a compaction asks, and once the log has been quiet for an
         * apply's interval: the catalog whole while nothing changes. A
         * transaction per turn of the loop, so that a round of room waits
         * for one, not for the whole write. */
        pthread_mutex_lock(&sp->apply_run_mu);
        bool quiet = psd_rowlog_total(l) == 0 &&
                     ps_now_ms() - sp->last_apply_ms >= APPLY_EVERY_MS;
        bool step = sp->catw_upto != 0 || atomic_exchange(&sp->cat_asap, false) ||
                    quiet || sparse_cat_due(sp, false);
        /* What fails is logged, and tried again after the loop's wait. */
        if (!step || sparse_cat_step(sp, &cat_busy) != 0)
            cat_busy = false;
        pthread_mutex_unlock(&sp->apply_run_mu);
        if (atomic_load(&sp->seg_recount)) {
            pthread_mutex_lock(&sp->apply_run_mu);
            int rc = sparse_seg_recount(sp);
            pthread_mutex_unlock(&sp->apply_run_mu);
            if (rc != 0)
                ps_log_err(rc, "counting the segments' live bytes");
        }
        pthread_mutex_lock(&sp->apply_run_mu);
        sparse_compact_tick(sp);
        pthread_mutex_unlock(&sp->apply_run_mu);
        pthread_mutex_lock(&sp->apply_mu);
    }
    pthread_mutex_unlock(&sp->apply_mu);
    return NULL;
}

int psd_sparse_start(psd_sparse *sp)
{
    sp->last_apply_ms = ps_now_ms();
    sp->apply_quit = false; /* started again after a stop (tests) */
    if (pthread_create(&sp->applier, NULL, applier_main, sp) != 0)
        return -EAGAIN;
    sp->applier_started = true;
    return 0;
}

void sparse_applier_stop(psd_sparse *sp)
{
    if (!sp->applier_started)
        return;
    pthread_mutex_lock(&sp->apply_mu);
    sp->apply_quit = true;
    pthread_cond_signal(&sp->apply_cond);
    pthread_cond_broadcast(&sp->room_cond);
    pthread_mutex_unlock(&sp->apply_mu);
    pthread_join(sp->applier, NULL);
    sp->applier_started = false;
}

/* ---- checkpoints ------------------------------------------------------- */

/* The copy of the store holds the dense variables of one commit, whose
 * "logged" mark names the last batch written before it, and the rows
 * applied up to the drain: the batches in between, still in the active
 * file (nothing is applied while the checkpoint holds apply_run_mu),
 * complete it to that one moment. */
int psd_sparse_ckpt_complete(void *ctx, const char *dir)
{
    psd_sparse *sp = ctx;
    psd_store *ck = NULL;
    int rc = psd_store_open(dir, sp->map_size, 0, &ck);
    uint64_t logged = 0, applied = atomic_load(&sp->log_applied);
    if (rc == 0)
        rc = psd_store_log_mark(ck, PSD_STORE_LOG_LOGGED, &logged);
    if (rc == 0 && logged > applied) {
        size_t nlive;
        uint32_t *live = sparse_live_ids(sp, &nlive);
        rc = live == NULL ? -ENOMEM
                          : apply_file(sp, ck, psd_rowlog_active(sp->rowlog), applied,
                                       logged, live, nlive, logged, NULL);
        free(live);
    }
    /* The copy's catalog points into this psd's segments: the rows' bytes
     * go into it instead, so that it stands alone. */
    if (rc == 0)
        rc = sparse_ckpt_materialize(sp, ck);
    if (rc == 0)
        rc = psd_store_sync(ck);
    psd_store_close(ck);
    if (rc != 0)
        ps_log_err(rc, "checkpoint: adding the row log's batches to the copy");
    return rc;
}

int psd_sparse_restored(psd_sparse *sp)
{
    pthread_mutex_lock(&sp->apply_run_mu);
    int rc = sparse_convert(sp);
    int rc2 = sparse_seg_recount(sp);
    pthread_mutex_unlock(&sp->apply_run_mu);
    return rc ? rc : rc2;
}

int psd_sparse_ckpt_begin(psd_sparse *sp)
{
    pthread_mutex_lock(&sp->apply_run_mu);
    int rc = sp->rowlog ? drain_locked(sp, false) : 0;
    if (rc == 0 && sp->segs != NULL)
        rc = sparse_cat_flush(sp, false); /* the copy takes the catalog whole */
    if (rc != 0) {
        pthread_mutex_unlock(&sp->apply_run_mu);
        ps_log_err(rc, "checkpoint: applying the row log to LMDB failed");
    }
    return rc;
}

void psd_sparse_ckpt_end(psd_sparse *sp)
{
    pthread_mutex_unlock(&sp->apply_run_mu);
}
