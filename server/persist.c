/*
 * persist.c - the shard's variables in the store: loading them at open,
 * the write-behind flusher (one transaction per commit interval for every
 * variable that changed), the write of a new variable and its deletion,
 * the rewrite of the store by a Restore, and the copy a checkpoint takes. The only file of
 * the shard module that includes store.h. The lock order is in
 * shard_internal.h.
 */
#include "server/shard_internal.h"

#include "server/checkpoint.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "server/sparse.h"
#include "server/store.h"

#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void var_rec(const psd_var *v, psd_var_rec *r)
{
    *r = (psd_var_rec){.name = v->name, .spec = v->spec_blob,
                       .spec_len = v->spec_len, .version = v->version,
                       .step = v->step, .value = v->value, .n = v->n,
                       .slots = v->slots, .nslots = v->nslots};
}

/* ---- loading ---------------------------------------------------------- */

static int load_visit(void *ctx, const psd_var_rec *r)
{
    struct var_list *lc = ctx;
    Ps__V1__VariableSpec *sp =
        ps__v1__variable_spec__unpack(NULL, r->spec_len, r->spec);
    if (sp == NULL || sp->optimizer == NULL || sp->initializer == NULL ||
        strcmp(sp->name, r->name) != 0) {
        ps_log_error("store: variable '%s': its spec does not parse", r->name);
        if (sp)
            ps__v1__variable_spec__free_unpacked(sp, NULL);
        return PS_ECORRUPT;
    }
    size_t n = 1;
    for (size_t i = 0; i < sp->n_shape; i++)
        n *= (size_t)(sp->shape[i] > 0 ? sp->shape[i] : 0);
    psd_var *v = NULL;
    int rc = n == r->n && sp->n_shape <= PS_WIRE_MAX_DIMS ? shard_var_new(sp, n, &v)
                                                      : PS_ECORRUPT;
    ps__v1__variable_spec__free_unpacked(sp, NULL);
    if (rc == PS_ECORRUPT)
        ps_log_error("store: variable '%s': %zu stored elements do not match "
                     "its shape", r->name, r->n);
    if (rc != 0)
        return rc;
    if (r->nslots != v->nslots) {
        ps_log_error("store: variable '%s': %d stored slots, its optimizer "
                     "has %d", r->name, r->nslots, v->nslots);
        shard_var_free(v);
        return PS_ECORRUPT;
    }
    memcpy(v->value, r->value, n * sizeof(float));
    if (v->nslots)
        memcpy(v->slots, r->slots, n * (size_t)v->nslots * sizeof(float));
    v->version = v->persisted_version = r->version;
    v->step = v->persisted_step = r->step;
    if (lc->n == lc->cap) {
        size_t ncap = lc->cap ? lc->cap * 2 : 16;
        psd_var **nv = realloc(lc->vars, ncap * sizeof *nv);
        if (nv == NULL) {
            shard_var_free(v);
            return -ENOMEM;
        }
        lc->vars = nv;
        lc->cap = ncap;
    }
    lc->vars[lc->n++] = v;
    return 0;
}

static int load_store(psd_store *st, struct var_list *lc)
{
    memset(lc, 0, sizeof *lc);
    int rc = psd_store_load(st, load_visit, lc);
    if (rc != 0)
        shard_vars_free(lc);
    return rc;
}

/* ---- flushing --------------------------------------------------------- */

/* A commit that holds every update up to seq, begun at start_ms, is done:
 * the write-behind lag starts again. Updates applied since seq are dated
 * from the commit's start, an upper bound. Pairs with shard_count_apply:
 * either it sees the reset, or the reload here sees its seq. */
static void note_committed(psd_shard *s, uint64_t seq, int64_t start_ms)
{
    atomic_store(&s->dirty_since_ms, 0);
    if (atomic_load(&s->apply_seq) != seq) {
        int_fast64_t none = 0;
        atomic_compare_exchange_strong(&s->dirty_since_ms, &none,
                                       start_ms > 0 ? start_ms : 1);
    }
}

static int flush_once(psd_shard *s);

/* Writes every changed variable in one transaction, growing the map and
 * writing again when the map is full. Called with flush_mu held. */
int shard_flush_locked(psd_shard *s)
{
    int rc;
    while ((rc = flush_once(s)) == PS_EFULL && psd_store_grow(s->store) == 0)
        ;
    if (rc != 0)
        ps_log_err(rc, "flush to LMDB failed");
    return rc;
}

static int flush_once(psd_shard *s)
{
    double t0 = ps_metrics_now();
    int64_t start_ms = ps_now_ms();
    uint64_t seq = atomic_load(&s->apply_seq);
    pthread_rwlock_rdlock(&s->table_lock);
    size_t nv = s->nvars;
    uint64_t *snap_v = malloc((nv ? nv : 1) * 2 * sizeof *snap_v);
    if (snap_v == NULL) {
        pthread_rwlock_unlock(&s->table_lock);
        return -ENOMEM;
    }
    /* The sparse tables' changed rows first, as one batch of the row log;
     * then the dense variables' records, in a transaction that marks the
     * batch (a copy of the store then knows which batches complete it). */
    bool wrote = false;
    int rc = psd_sparse_flush(s->sparse, &wrote);
    psd_sparse_committed(s->sparse, rc == 0);
    psd_store_txn *t = NULL;
    size_t written = 0;
    for (size_t i = 0; i < nv && rc == 0; i++) {
        psd_var *v = s->vars[i];
        pthread_rwlock_rdlock(&v->lock);
        snap_v[2 * i] = v->version;
        snap_v[2 * i + 1] = v->step;
        if (v->version != v->persisted_version || v->step != v->persisted_step) {
            if (t == NULL)
                rc = psd_store_begin(s->store, &t);
            if (rc == 0) {
                psd_var_rec r;
                var_rec(v, &r);
                rc = psd_store_put(t, &r);
                written++;
            }
        }
        pthread_rwlock_unlock(&v->lock);
    }
    if (t != NULL) {
        if (rc == 0)
            rc = psd_store_set_log_mark(t, PSD_STORE_LOG_LOGGED,
                                        psd_sparse_logged(s->sparse));
        if (rc == 0)
            rc = psd_store_commit(t);
        else
            psd_store_abort(t);
        if (rc == 0) {
            for (size_t i = 0; i < nv; i++) {
                psd_var *v = s->vars[i];
                pthread_rwlock_wrlock(&v->lock);
                v->persisted_version = snap_v[2 * i];
                v->persisted_step = snap_v[2 * i + 1];
                pthread_rwlock_unlock(&v->lock);
            }
        }
    }
    if (rc == 0 && (t != NULL || wrote)) {
        atomic_fetch_add(&s->commits, 1);
        ps_histogram_observe(&s->commit_seconds, ps_metrics_now() - t0);
    }
    pthread_rwlock_unlock(&s->table_lock);
    free(snap_v);
    if (rc == 0) {
        atomic_store(&s->committed_seq, seq);
        note_committed(s, seq, start_ms);
        shard_answer_durable(s, seq);
    } else if (rc != PS_EFULL) {
        ps_log_err(rc, "flush of %zu variable(s) to LMDB failed", written);
    }
    return rc;
}

int psd_shard_flush(psd_shard *s)
{
    pthread_mutex_lock(&s->flush_mu);
    int rc = shard_flush_locked(s);
    pthread_mutex_unlock(&s->flush_mu);
    return rc;
}

/* Hands back to the kernel the memory malloc keeps after a burst of big
 * messages: gRPC reads each request into fresh slices, and once freed
 * glibc keeps them in its arenas (its mmap threshold rises to the biggest
 * freed block), so resident memory would stay at the burst's peak. At most
 * once a second, and only after traffic; the next burst pays a page fault
 * per 4 KiB again, a few ms a second at most. */
#define TRIM_EVERY_MS 1000

static void maybe_trim(psd_shard *s, int64_t *last_ms, uint64_t *last_bytes)
{
    int64_t now = ps_now_ms();
    uint64_t bytes = atomic_load(&s->bytes_in) + atomic_load(&s->bytes_out);
    if (now - *last_ms < TRIM_EVERY_MS || bytes == *last_bytes)
        return;
    malloc_trim(0);
    *last_ms = now;
    *last_bytes = bytes;
}

void *shard_flusher_main(void *arg)
{
    psd_shard *s = arg;
    pthread_setname_np(pthread_self(), "psd-flush");
    int64_t trimmed_ms = ps_now_ms();
    uint64_t trimmed_bytes = 0;
    pthread_mutex_lock(&s->flush_mu);
    while (!s->closing) {
        struct timespec until = ps_time_after_ms(CLOCK_REALTIME,
                                                 s->o.commit_interval_ms);
        while (!s->closing && !s->flush_requested)
            if (pthread_cond_timedwait(&s->flush_cond, &s->flush_mu, &until) ==
                ETIMEDOUT)
                break;
        s->flush_requested = false;
        uint64_t asked = s->flush_asked;
        int rc = 0;
        if (atomic_load(&s->apply_seq) != atomic_load(&s->committed_seq))
            rc = shard_flush_locked(s);
        if (asked != s->flush_done) {
            s->flush_done = asked;
            s->flush_rc = rc;
            pthread_cond_broadcast(&s->flushed_cond);
        }
        psd_sparse_maintain(s->sparse);
        maybe_trim(s, &trimmed_ms, &trimmed_bytes);
    }
    pthread_mutex_unlock(&s->flush_mu);
    return NULL;
}

/* Has the flusher commit everything applied so far and waits for it: an
 * rpc thread that needs a commit does not write to LMDB itself. Returns
 * the commit's result, or -ESHUTDOWN when psd is closing. */
int shard_flush_wait(psd_shard *s)
{
    pthread_mutex_lock(&s->flush_mu);
    uint64_t mine = ++s->flush_asked;
    s->flush_requested = true;
    pthread_cond_signal(&s->flush_cond);
    while (s->flush_done < mine && !s->closing)
        pthread_cond_wait(&s->flushed_cond, &s->flush_mu);
    int rc = s->flush_done >= mine ? s->flush_rc : -ESHUTDOWN;
    pthread_mutex_unlock(&s->flush_mu);
    return rc;
}

void shard_request_flush(psd_shard *s)
{
    pthread_mutex_lock(&s->flush_mu);
    s->flush_requested = true;
    pthread_cond_signal(&s->flush_cond);
    pthread_mutex_unlock(&s->flush_mu);
}

/* ---- open, create, restore, checkpoint -------------------------------- */

static void store_gc(psd_shard *s);

/* Opens the store under s->data_dir and loads its variables into the
 * table. Returns 0 or the store's error, logged. */
int shard_store_open(psd_shard *s, uint64_t map_size)
{
    int rc = psd_store_open(s->data_dir, map_size, 0, &s->store);
    if (rc != 0) {
        ps_log_err(rc, "cannot open the store in %s", s->data_dir);
        return rc;
    }
    psd_store_set_map_max(s->store, s->o.map_size_max);
    /* The sparse tier replays the rows acknowledged but not yet in LMDB. */
    struct psd_sparse_conf sc = {.store = s->store, .data_dir = s->data_dir,
                                 .memory_limit = s->o.memory_limit,
                                 .map_size = s->o.map_size,
                                 .max_rows = s->o.max_rows_per_table,
                                 .segment_size = s->o.segment_size,
                                 .compact_rate = s->o.compact_rate,
                                 .why = s->o.why, .whylen = s->o.whylen};
    rc = psd_sparse_open(&sc, &s->sparse);
    if (rc != 0)
        return rc;
    store_gc(s); /* the rows a restore cut short by a crash left behind */
    struct var_list lc;
    rc = load_store(s->store, &lc);
    if (rc != 0) {
        ps_log_err(rc, "cannot load the variables in %s", s->data_dir);
        return rc;
    }
    s->vars = lc.vars;
    s->nvars = lc.n;
    s->cap = lc.cap;
    for (size_t i = 0; i < s->nvars; i++)
        shard_var_attach(s, s->vars[i]);
    shard_caps_recount(s);
    return 0;
}

void shard_store_close(psd_shard *s)
{
    psd_store_close(s->store);
    s->store = NULL;
}

/* Writes a new variable in a transaction of its own. Called with
 * table_lock held for writing. */
int shard_store_add(psd_shard *s, const psd_var *v)
{
    int rc;
    do {
        psd_store_txn *t;
        rc = psd_store_begin(s->store, &t);
        if (rc == 0) {
            psd_var_rec rec;
            var_rec(v, &rec);
            rc = psd_store_put(t, &rec);
            if (rc == 0)
                rc = psd_store_commit(t);
            else
                psd_store_abort(t);
        }
    } while (rc == PS_EFULL && psd_store_grow(s->store) == 0);
    return rc;
}

/* Deletes variable name from the store in a transaction of its own,
 * committed before it returns: gone after a restart. A name the store
 * does not hold is not an error (nothing to do). Called with table_lock
 * held for writing (DeleteVariable). Returns 0 or the store's error, with
 * the store unchanged. */
int shard_store_del(psd_shard *s, const char *name)
{
    psd_store_txn *t;
    int rc = psd_store_begin(s->store, &t);
    if (rc != 0)
        return rc;
    rc = psd_store_del(t, name);
    if (rc == PS_ENOTFOUND) {
        psd_store_abort(t);
        return 0;
    }
    if (rc != 0) {
        psd_store_abort(t);
        return rc;
    }
    return psd_store_commit(t);
}

/* Rows a restore copies per transaction: ~2-4 MiB of LMDB pages for rows
 * of dim 64, whatever the table's size. */
#define RESTORE_CHUNK 8192

/* The ps.v1.DType of a sparse table's rows, of its slots (FLOAT32 for
 * unset). */
static int row_dtype_of(const psd_var *v)
{
    return v->spec->row_dtype ? (int)v->spec->row_dtype : PS__V1__DTYPE__DTYPE_FLOAT32;
}

static int slot_dtype_of(const psd_var *v)
{
    return v->spec->slot_dtype ? (int)v->spec->slot_dtype : PS__V1__DTYPE__DTYPE_FLOAT32;
}

/* Copies the rows of l's variable i from the checkpoint ck under id, each
 * converted into the variable's row and slot dtypes when l->was[i] says so
 * (logged: a restore that changes what is stored says it did). */
static int stage_table(psd_shard *s, psd_store *ck, struct var_list *l, size_t i, uint32_t id)
{
    psd_var *v = l->vars[i], *was = l->was != NULL ? l->was[i] : NULL;
    if (was == NULL)
        return psd_sparse_stage(s->sparse, ck, v->name, id, NULL);
    struct psd_sparse_conv c = {was->sparse, v->sparse, 0, 0};
    int rc = psd_sparse_stage(s->sparse, ck, v->name, id, &c);
    if (rc == 0) {
        l->rows_converted += c.rows;
        ps_log_info("restore: sparse table '%s': %llu rows converted from %s rows, %s "
                    "slots to %s rows, %s slots (%llu float16 values clamped to +-65504)",
                    v->name, (unsigned long long)c.rows, shard_dtype_name(row_dtype_of(was)),
                    shard_dtype_name(slot_dtype_of(was)), shard_dtype_name(row_dtype_of(v)),
                    shard_dtype_name(slot_dtype_of(v)), (unsigned long long)c.clamped);
    }
    return rc;
}

/* Reserves a variable id for each sparse table of l and copies its rows
 * from l's checkpoint under it into the segment files (psd_sparse_stage,
 * in bounded transactions):
 * ids[i] for l->vars[i], 0 for a dense one. Nothing refers to these ids
 * until store_replace_once commits; if it never does, they are orphans that
 * psd_store_rows_gc deletes. */
static int stage_sparse(psd_shard *s, struct var_list *l, uint32_t *ids)
{
    uint32_t k = 0, first = 0;
    for (size_t i = 0; i < l->n; i++)
        k += l->vars[i]->sparse != NULL;
    if (k == 0 || l->from == NULL)
        return 0;
    int rc;
    do {
        psd_store_txn *t = NULL;
        rc = psd_store_begin(s->store, &t);
        if (rc == 0)
            rc = psd_store_reserve_ids(t, k, &first);
        rc = rc == 0 ? psd_store_commit(t) : (psd_store_abort(t), rc);
    } while (rc == PS_EFULL && psd_store_grow(s->store) == 0);
    psd_store *ck = NULL;
    if (rc == 0)
        rc = psd_store_open(l->from, 0, PSD_STORE_RDONLY, &ck);
    for (size_t i = 0, j = 0; i < l->n && rc == 0; i++)
        if (l->vars[i]->sparse != NULL) {
            ids[i] = first + (uint32_t)j++;
            rc = stage_table(s, ck, l, i, ids[i]);
        }
    psd_store_close(ck);
    return rc;
}

/* Replaces every variable record by those of l in one transaction (the
 * sparse ones naming their staged rows): on failure the store is as it
 * was. Called with flush_mu held (Restore). */
static int store_replace_once(psd_shard *s, const struct var_list *l, const uint32_t *ids)
{
    psd_store_txn *t = NULL;
    int rc = psd_store_begin(s->store, &t);
    if (rc == 0)
        rc = psd_store_clear(t, true); /* old rows: orphans, deleted below */
    for (size_t i = 0; i < l->n && rc == 0; i++) {
        psd_var_rec rec;
        var_rec(l->vars[i], &rec);
        rec.var_id = ids[i];
        rc = psd_store_put(t, &rec);
    }
    if (rc == 0)
        rc = psd_store_commit(t);
    else if (t != NULL)
        psd_store_abort(t);
    return rc;
}

/* Deletes rows no variable names, in bounded transactions; logged. */
static void store_gc(psd_shard *s)
{
    uint64_t n = 0;
    int rc = psd_store_rows_gc(s->store, RESTORE_CHUNK, &n);
    if (rc != 0)
        ps_log_err(rc, "deleting the rows of replaced tables (%llu so far); the next "
                   "start tries again", (unsigned long long)n);
    else if (n > 0)
        ps_log_info("deleted %llu rows of tables no variable names", (unsigned long long)n);
}

/* Restore's store side: the sparse tables' rows staged in bounded
 * transactions, then one transaction switching the records, then the old
 * rows deleted in bounded transactions: a table larger than memory never
 * sits whole in one transaction. A crash leaves the old variables or the
 * new ones, and at most orphan rows that the next start deletes. */
int shard_store_replace(psd_shard *s, struct var_list *l)
{
    uint32_t *ids = calloc(l->n ? l->n : 1, sizeof *ids);
    if (ids == NULL)
        return -ENOMEM;
    int rc = stage_sparse(s, l, ids);
    while (rc == 0 && (rc = store_replace_once(s, l, ids)) == PS_EFULL &&
           psd_store_grow(s->store) == 0)
        ;
    store_gc(s);
    if (rc == 0)
        psd_sparse_restored(s->sparse); /* what fails stays readable in LMDB */
    free(ids);
    return rc;
}

uint64_t shard_store_commits(psd_shard *s)
{
    return psd_store_commits(s->store);
}

/* A DType as a spec stores it: FLOAT32 as unset. */
static Ps__V1__DType spec_dtype(int dtype)
{
    return dtype == PS__V1__DTYPE__DTYPE_FLOAT32 ? PS__V1__DTYPE__DTYPE_UNSPECIFIED
                                                 : (Ps__V1__DType)dtype;
}

/* Restore's sparse_row_dtype and sparse_slot_dtype (FLOAT32, FLOAT16 or
 * BFLOAT16; 0 keeps the checkpoint's): each sparse table of l whose rows or
 * slots are of another dtype is replaced by a variable of the same spec
 * and state with rows and slots of those dtypes, and kept in l->was, so
 * that stage_sparse converts its rows as it copies them. Every table's
 * slot dtype is checked first (psd_sparse_validate_slots). Returns 0,
 * PS_EINVAL_ARG with why (l unchanged), or -ENOMEM (l as it was, or partly
 * converted: consistent either way). */
int shard_ckpt_convert(struct var_list *l, int row_dtype, int slot_dtype, char *why,
                       size_t whylen)
{
    for (size_t i = 0; slot_dtype != 0 && i < l->n; i++) {
        psd_var *v = l->vars[i];
        int rc = v->sparse == NULL ? 0 : psd_sparse_validate_slots(
            v->name, slot_dtype, v->spec->optimizer, why, whylen);
        if (rc != 0)
            return rc;
    }
    for (size_t i = 0; i < l->n; i++) {
        psd_var *v = l->vars[i], *nv;
        int rd = row_dtype ? row_dtype : row_dtype_of(v);
        /* SGD keeps no slots: nothing to convert, its spec as saved. */
        int sd = slot_dtype && v->nslots > 0 ? slot_dtype : slot_dtype_of(v);
        if (v->sparse == NULL || (row_dtype_of(v) == rd && slot_dtype_of(v) == sd))
            continue;
        if (l->was == NULL && (l->was = calloc(l->n, sizeof *l->was)) == NULL)
            return -ENOMEM;
        Ps__V1__VariableSpec sp = *v->spec;
        sp.row_dtype = spec_dtype(rd);
        sp.slot_dtype = spec_dtype(sd);
        int rc = shard_var_new(&sp, v->n, &nv);
        if (rc != 0)
            return rc;
        memcpy(nv->value, v->value, v->n * sizeof(float));
        if (v->nslots)
            memcpy(nv->slots, v->slots, v->n * (size_t)v->nslots * sizeof(float));
        nv->version = v->version;
        nv->persisted_version = v->persisted_version;
        nv->step = v->step;
        nv->persisted_step = v->persisted_step;
        l->was[i] = v;
        l->vars[i] = nv;
        l->tables_converted++;
    }
    return 0;
}

/* Frees the checkpoint's tables that shard_ckpt_convert replaced. */
void shard_ckpt_converted_free(struct var_list *l)
{
    for (size_t i = 0; l->was != NULL && i < l->n; i++)
        shard_var_free(l->was[i]);
    free(l->was);
    l->was = NULL;
}

/* Loads the variables of the checkpoint in directory path into l. Returns
 * 0 or the store's error. */
int shard_ckpt_load(const char *path, struct var_list *l)
{
    psd_store *ck;
    int rc = psd_store_open(path, 0, PSD_STORE_RDONLY, &ck);
    if (rc == 0) {
        rc = load_store(ck, l);
        psd_store_close(ck);
    }
    if (rc == 0 && (l->from = strdup(path)) == NULL) {
        shard_vars_free(l);
        rc = -ENOMEM;
    }
    return rc;
}
