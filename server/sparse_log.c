/*
 * sparse_log.c - the row log's second half (rowlog.h has the files): its
 * replay when psd opens its store, the applier thread that writes a sealed
 * file's rows into LMDB behind the pushes, the drain a checkpoint and a
 * full RAM tier wait for, and the batches a checkpoint's copy adds.
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
#include "server/shard_internal.h"

#include "server/checkpoint.h"
#include "server/rowlog.h"
#include "server/sparse.h"
#include "server/store.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The applier starts when the active file reaches APPLY_MAX_BYTES (or a
 * quarter of the RAM tier's budget, whichever is less), when it holds
 * anything APPLY_EVERY_MS after the last apply, or at once when an
 * eviction sweep is due (s->apply_asap: a sweep sees only LMDB's rows).
 * A Zipf stream touches most of a table's leaf pages within a few
 * seconds, so an apply rewrites nearly the whole file whatever the log
 * holds, and fewer applies write less: an apply every 10 s took
 * bench/sparse's sustained pushes (1000 calls) from 542k to 662k rows/s,
 * but its 4x-over pushes had a p99 of 1.2-1.3 s (77 ms every 2 s), not
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
    uint64_t ord;
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
    size_t chunk;
    uint64_t mark;        /* the applied mark to set: last, or more */
    psd_shard *pf;        /* faults the rows' pages in first; NULL: not */
    int64_t *ids;         /* (chunk) for the prefetch */
};

static int cmp_u32(const void *a, const void *b)
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
    if (a->live && !bsearch(&var_id, a->live, a->nlive, sizeof *a->live, cmp_u32))
        return 0;
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 65536;
        struct rec *nr = realloc(a->r, nc * sizeof *nr);
        if (nr == NULL)
            return -ENOMEM;
        a->r = nr;
        a->cap = nc;
    }
    a->r[a->n] = (struct rec){var_id, len, id, a->n, data};
    a->n++;
    return 0;
}

static int cmp_rec(const void *pa, const void *pb)
{
    const struct rec *x = pa, *y = pb;
    if (x->var_id != y->var_id)
        return x->var_id < y->var_id ? -1 : 1;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->ord < y->ord ? -1 : x->ord > y->ord;
}

static bool same_row(const struct rec *x, const struct rec *y)
{
    return x->var_id == y->var_id && x->id == y->id;
}

/* Puts the last record of each row, in key order (LMDB walks its leaves
 * forward), in transactions of a->chunk rows; the last one also sets the
 * applied mark. A full map is grown and the transaction done again. */
static int put_all(void *ctx)
{
    struct apply *a = ctx;
    if (a->last > a->mark)
        a->mark = a->last;
    qsort(a->r, a->n, sizeof *a->r, cmp_rec);
    size_t u = 0; /* the last record of each row, in key order */
    for (size_t j = 0; j < a->n; j++)
        if (j + 1 == a->n || !same_row(&a->r[j], &a->r[j + 1]))
            a->r[u++] = a->r[j];
    a->n = u;
    size_t i = 0;
    for (;;) {
        size_t end = i + a->chunk < a->n ? i + a->chunk : a->n;
        /* The chunk's leaf pages from many threads at once: the puts
         * below would otherwise fault them in one by one. */
        for (size_t j = i; a->pf != NULL && a->ids != NULL && j < end;) {
            size_t k = 0;
            uint32_t var = a->r[j].var_id;
            for (; j < end && a->r[j].var_id == var; j++)
                a->ids[k++] = a->r[j].id;
            sparse_prefetch_rows(a->pf, var, a->ids, k);
        }
        psd_store_txn *t = NULL;
        int rc = psd_store_begin(a->st, &t);
        size_t j = i;
        for (; rc == 0 && j < end; j++) {
            const struct rec *r = &a->r[j];
            uint32_t head = r->len < SPARSE_ROW_HEAD ? r->len : SPARSE_ROW_HEAD;
            rc = psd_store_row_put(t, r->var_id, r->id, r->data, head, r->data + head,
                                   r->len - head);
            if (((j - i + 1) & 255) == 0)
                psd_sparse_apply_pages(j - i + 1);
        }
        if (rc == 0 && j >= a->n && a->mark > 0)
            rc = psd_store_set_log_mark(t, PSD_STORE_LOG_APPLIED, a->mark);
        if (rc == 0)
            rc = psd_store_commit(t);
        else if (t != NULL)
            psd_store_abort(t);
        psd_sparse_apply_pages(0);
        if (rc == PS_EFULL && psd_store_grow(a->st) == 0)
            continue; /* the same rows again in a bigger map */
        if (rc != 0)
            return rc;
        i = j;
        if (i >= a->n)
            return 0;
    }
}

/* Writes the rows of file which's batches in (after, upto] into st and
 * sets its applied mark (to at least mark). *last: the last batch. */
static int apply_file(psd_store *st, psd_rowlog *l, int which, uint64_t after, uint64_t upto,
                      const uint32_t *live, size_t nlive, size_t chunk, uint64_t mark,
                      psd_shard *pf, uint64_t *last)
{
    struct apply a = {.st = st, .live = live, .nlive = nlive, .upto = upto,
                      .chunk = chunk, .mark = mark, .pf = pf};
    if (pf != NULL)
        a.ids = malloc(chunk * sizeof *a.ids);
    int rc = psd_rowlog_walk(l, which, after, collect, put_all, &a, NULL);
    free(a.r);
    free(a.ids);
    if (last)
        *last = a.last;
    return rc;
}

static size_t chunk_rows(psd_shard *s)
{
    uint64_t c = psd_sparse_budget(s) / 8 / SPARSE_DIRTY_PAGE;
    return c > APPLY_CHUNK_MAX ? APPLY_CHUNK_MAX : c < APPLY_CHUNK_MIN ? APPLY_CHUNK_MIN : c;
}

/* Opens the row log and writes what it holds beyond the store's applied
 * mark into the store, older file first: a crash left those batches
 * acknowledged but not applied. Then empties both. Called by
 * shard_store_open before the variables are loaded. */
int shard_rowlog_open(psd_shard *s)
{
    int rc = psd_rowlog_open(s->data_dir, &s->rowlog);
    uint64_t applied = 0, last[2] = {0, 0};
    if (rc == 0)
        rc = psd_store_log_mark(s->store, PSD_STORE_LOG_APPLIED, &applied);
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = psd_rowlog_walk(s->rowlog, i, UINT64_MAX, NULL, NULL, NULL, &last[i]);
    int first = last[0] <= last[1] ? 0 : 1;
    uint64_t top = applied;
    for (int k = 0; k < 2 && rc == 0; k++) {
        int i = k == 0 ? first : !first;
        if (last[i] <= applied)
            continue;
        uint64_t got = 0;
        rc = apply_file(s->store, s->rowlog, i, applied, UINT64_MAX, NULL, 0, chunk_rows(s),
                        0, s, &got);
        if (rc == 0) {
            ps_log_info("row log: replayed batches %llu-%llu of %s (acknowledged "
                        "before psd stopped, not yet in LMDB)",
                        (unsigned long long)applied + 1, (unsigned long long)got,
                        i ? "rows.log.1" : "rows.log.0");
            applied = top = got;
        }
    }
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = psd_rowlog_reset(s->rowlog, i);
    if (rc != 0) {
        ps_log_err(rc, "cannot write the row log of %s into LMDB (its rows were "
                   "acknowledged and stay in the log: free the disk and start psd again)",
                   s->data_dir);
        return rc;
    }
    if (last[0] > top)
        top = last[0];
    if (last[1] > top)
        top = last[1];
    atomic_store(&s->log_seq, top);
    atomic_store(&s->log_applied, top);
    return 0;
}

/* The var_ids of the tables that have them, sorted. table_lock is taken;
 * no transaction may be open in this thread. */
static uint32_t *live_ids(psd_shard *s, size_t *n)
{
    pthread_rwlock_rdlock(&s->table_lock);
    uint32_t *ids = malloc((s->nvars ? s->nvars : 1) * sizeof *ids);
    *n = 0;
    for (size_t i = 0; ids && i < s->nvars; i++) {
        struct psd_sparse *t = s->vars[i]->sparse;
        if (t == NULL)
            continue;
        sparse_lock(t);
        if (t->ready)
            ids[(*n)++] = t->var_id;
        pthread_mutex_unlock(&t->mu);
    }
    pthread_rwlock_unlock(&s->table_lock);
    if (ids)
        qsort(ids, *n, sizeof *ids, cmp_u32);
    return ids;
}

/* Applies the sealed file, sealing the active one first when the sealed
 * one is empty; *did: something was applied. apply_run_mu held. */
static int apply_sealed(psd_shard *s, bool *did)
{
    psd_rowlog *l = s->rowlog;
    *did = false;
    int which = !psd_rowlog_active(l);
    if (psd_rowlog_bytes(l, which) == 0 && (which = psd_rowlog_seal(l)) < 0)
        return 0;
    size_t nlive;
    uint32_t *live = live_ids(s, &nlive);
    if (live == NULL)
        return -ENOMEM;
    uint64_t last = 0;
    int rc = apply_file(s->store, l, which, atomic_load(&s->log_applied), UINT64_MAX, live,
                        nlive, chunk_rows(s), 0, s, &last);
    free(live);
    if (rc == 0)
        rc = psd_rowlog_reset(l, which);
    if (rc != 0)
        return rc;
    if (last > atomic_load(&s->log_applied))
        atomic_store(&s->log_applied, last);
    *did = true;
    psd_sparse_applied(s);
    return 0;
}

/* Applies the sealed file, then the active one: both, or (room) only
 * until the RAM tier is back within its budget, each apply letting the
 * tier drop the rows it unpins. apply_run_mu held. */
static int drain_locked(psd_shard *s, bool room)
{
    bool did = true;
    int rc = 0;
    for (int k = 0; k < 3 && did && rc == 0 &&
                    (!room || psd_sparse_ram_cost() > psd_sparse_budget(s)); k++)
        rc = apply_sealed(s, &did);
    return rc;
}

static int drain(psd_shard *s, bool room)
{
    if (s->rowlog == NULL)
        return 0;
    pthread_mutex_lock(&s->apply_run_mu);
    int rc = drain_locked(s, room);
    pthread_mutex_unlock(&s->apply_run_mu);
    if (rc != 0)
        ps_log_err(rc, "applying the row log to LMDB failed");
    return rc;
}

int psd_sparse_drain(psd_shard *s)
{
    return drain(s, false);
}

/* A push past the budget used to wait for the whole log, which took
 * bench/sparse's 4x-over push p99 to 1.4-1.5 s; until the tier fits,
 * 0.35-0.8 s (the same throughput: the applier bounds it). */
int psd_sparse_make_room(psd_shard *s)
{
    return drain(s, true);
}

static void *applier_main(void *arg)
{
    psd_shard *s = arg;
    pthread_setname_np(pthread_self(), "psd-apply");
    int64_t logged_ms = 0;
    pthread_mutex_lock(&s->apply_mu);
    while (!s->apply_quit) {
        struct timespec until = ps_time_after_ms(CLOCK_REALTIME, 50);
        pthread_cond_timedwait(&s->apply_cond, &s->apply_mu, &until);
        if (s->apply_quit)
            break;
        pthread_mutex_unlock(&s->apply_mu);
        psd_rowlog *l = s->rowlog;
        int a = psd_rowlog_active(l);
        uint64_t act = psd_rowlog_bytes(l, a), trig = psd_sparse_budget(s) / 4;
        if (trig > APPLY_MAX_BYTES)
            trig = APPLY_MAX_BYTES;
        int64_t now = ps_now_ms();
        bool asap = atomic_exchange(&s->apply_asap, false);
        if (act >= trig || psd_rowlog_bytes(l, !a) > 0 || (act > 0 && asap) ||
            (act > 0 && now - s->last_apply_ms >= APPLY_EVERY_MS)) {
            pthread_mutex_lock(&s->apply_run_mu);
            bool did;
            int rc = apply_sealed(s, &did);
            pthread_mutex_unlock(&s->apply_run_mu);
            s->last_apply_ms = ps_now_ms();
            if (rc != 0 && s->last_apply_ms - logged_ms > 10000) {
                ps_log_err(rc, "applying the row log to LMDB failed (tried again; "
                           "its rows stay in memory and in the log)");
                logged_ms = s->last_apply_ms;
            }
        }
        pthread_mutex_lock(&s->apply_mu);
    }
    pthread_mutex_unlock(&s->apply_mu);
    return NULL;
}

int shard_applier_start(psd_shard *s)
{
    s->last_apply_ms = ps_now_ms();
    if (pthread_create(&s->applier, NULL, applier_main, s) != 0)
        return -EAGAIN;
    s->applier_started = true;
    return 0;
}

void shard_applier_stop(psd_shard *s)
{
    if (!s->applier_started)
        return;
    pthread_mutex_lock(&s->apply_mu);
    s->apply_quit = true;
    pthread_cond_signal(&s->apply_cond);
    pthread_mutex_unlock(&s->apply_mu);
    pthread_join(s->applier, NULL);
    s->applier_started = false;
}

/* ---- checkpoints ------------------------------------------------------- */

/* The copy of the store holds the dense variables of one commit, whose
 * "logged" mark names the last batch written before it, and the rows
 * applied up to the drain: the batches in between, still in the active
 * file (nothing is applied while the checkpoint holds apply_run_mu),
 * complete it to that one moment. */
static int complete_copy(void *ctx, const char *dir)
{
    psd_shard *s = ctx;
    psd_store *ck = NULL;
    int rc = psd_store_open(dir, s->o.map_size, 0, &ck);
    uint64_t logged = 0, applied = atomic_load(&s->log_applied);
    if (rc == 0)
        rc = psd_store_log_mark(ck, PSD_STORE_LOG_LOGGED, &logged);
    if (rc == 0 && logged > applied) {
        size_t nlive;
        uint32_t *live = live_ids(s, &nlive);
        rc = live == NULL ? -ENOMEM
                          : apply_file(ck, s->rowlog, psd_rowlog_active(s->rowlog), applied,
                                       logged, live, nlive, chunk_rows(s), logged, NULL, NULL);
        free(live);
    }
    if (rc == 0)
        rc = psd_store_sync(ck);
    psd_store_close(ck);
    if (rc != 0)
        ps_log_err(rc, "checkpoint: adding the row log's batches to the copy");
    return rc;
}

int shard_ckpt_begin(psd_shard *s)
{
    pthread_mutex_lock(&s->apply_run_mu);
    int rc = s->rowlog ? drain_locked(s, false) : 0;
    if (rc != 0) {
        pthread_mutex_unlock(&s->apply_run_mu);
        ps_log_err(rc, "checkpoint: applying the row log to LMDB failed");
    }
    return rc;
}

int shard_ckpt_copy(psd_shard *s, uint64_t step, uint64_t nvars, char *path, size_t pathlen,
                    uint64_t *bytes)
{
    return psd_ckpt_write_with(s->store, s->ckpt_root, step, nvars, complete_copy, s, path,
                               pathlen, bytes);
}

void shard_ckpt_end(psd_shard *s)
{
    pthread_mutex_unlock(&s->apply_run_mu);
}
