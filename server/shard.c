/*
 * shard.c - the shard's lifetime (open, stop, close), its method table,
 * and the checkpoint thread that runs Checkpoint, Restore and the creation
 * of big variables in order. See shard.h for the model and the promise,
 * shard_internal.h for the files of the module and the lock order.
 */
#include "server/shard_internal.h"

#include "server/checkpoint.h"
#include "server/sparse.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/retention.h"
#include "common/thread.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the checkpoint thread -------------------------------------------- */

/* Hands a Checkpoint, Restore or big CreateVariable to the checkpoint
 * thread, in order. */
void shard_ckpt_enqueue(psd_shard *s, struct ckpt_job *j)
{
    pthread_mutex_lock(&s->ckpt_mu);
    *s->ckpt_tail = j;
    s->ckpt_tail = &j->next;
    pthread_cond_signal(&s->ckpt_cond);
    pthread_mutex_unlock(&s->ckpt_mu);
}

/* Queues a Checkpoint or Restore for the checkpoint thread; method names
 * the call in the message when there is no memory for it. */
static void job_enqueue(psd_shard *s, ps_rpc_call *call, int kind, uint64_t step,
                        size_t keep_at_least, const char *method)
{
    struct ckpt_job *j = calloc(1, sizeof *j);
    if (j == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "%s: out of memory", method);
        return;
    }
    *j = (struct ckpt_job){NULL, call, step, keep_at_least, kind, NULL, 0};
    shard_ckpt_enqueue(s, j);
}

static void checkpoint(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    Ps__V1__CheckpointRequest *r = shard_unpack(ctx, call, "Checkpoint",
                                                &ps__v1__checkpoint_request__descriptor, req, len);
    if (r != NULL && r->keep_at_least > PS_RETENTION_MAX_KEEP) {
        shard_count_bad(ctx);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Checkpoint: keep_at_least %u is "
                    "more than %d; keep more with psd's --checkpoint-keep",
                    r->keep_at_least, PS_RETENTION_MAX_KEEP);
    } else if (r != NULL) {
        job_enqueue(ctx, call, JOB_CHECKPOINT, r->step, r->keep_at_least, "Checkpoint");
    }
    ps__v1__checkpoint_request__free_unpacked(r, NULL);
}

/* How far a Checkpoint's step may run ahead of the highest variable
 * version on this psd. The step names the directory; retention follows the
 * order of creation (checkpoint.h), so a forged step no longer outranks
 * anything, and this bound only refuses labels no job reaches. An honest
 * step can still exceed the versions: pscoord sends its
 * global step (coordinator/jobckpt.c: the lower median of the steps the workers
 * reported), and in async mode a shard holding no variable, or variables a
 * restarted psd recreated at version 0 while workers go on counting, has
 * versions far below it. So the bound is a margin no job reaches: 2^40
 * steps is 35 years at 1,000 steps a second, and still leaves a forged
 * step 2^23 times below 2^63. */
#define CKPT_STEP_AHEAD ((uint64_t)1 << 40)

/* Takes one checkpoint and answers its call. On the checkpoint thread.
 * Retention never deletes the checkpoint this call just wrote, whatever
 * the steps of the others. */
static void checkpoint_run(psd_shard *s, ps_rpc_call *call, uint64_t step,
                           size_t keep_at_least)
{
    /* Everything acknowledged so far goes into the store, then the copy is
     * taken from one read transaction while pushes go on. */
    double t0 = ps_metrics_now();
    /* The row log applied first without the flusher held off (it may be
     * long), then what the last commit adds with it: psd_sparse_ckpt_begin
     * keeps the applier out until the copy is taken. */
    psd_sparse_drain(s->sparse);
    pthread_mutex_lock(&s->flush_mu);
    int rc = shard_flush_locked(s);
    if (rc == 0)
        rc = psd_sparse_ckpt_begin(s->sparse);
    bool began = rc == 0;
    uint64_t nvars = 0;
    uint64_t top = 0; /* the highest variable version */
    pthread_rwlock_rdlock(&s->table_lock);
    nvars = s->nvars;
    for (size_t i = 0; i < s->nvars; i++)
        if (s->vars[i]->version > top)
            top = s->vars[i]->version;
    pthread_rwlock_unlock(&s->table_lock);
    pthread_mutex_unlock(&s->flush_mu);
    if (step == 0)
        step = top;
    if (step > top && step - top > CKPT_STEP_AHEAD) {
        if (began)
            psd_sparse_ckpt_end(s->sparse);
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Checkpoint: step %llu is far "
                    "ahead of the variables' highest version %llu (at most that "
                    "plus 2^40)", (unsigned long long)step, (unsigned long long)top);
        return;
    }
    if (rc != 0) {
        ps_rpc_fail(call, ps_rpc_code_from_err(rc),
                    "Checkpoint: flushing to LMDB failed: %s", ps_strerror(rc));
        return;
    }
    char path[4096];
    uint64_t bytes = 0;
    rc = psd_ckpt_write_with(s->store, s->ckpt_root, step, nvars, psd_sparse_ckpt_complete,
                             s->sparse, path, sizeof path, &bytes);
    psd_sparse_ckpt_end(s->sparse);
    if (rc != 0) {
        ps_rpc_fail(call, ps_rpc_code_from_err(rc),
                    "Checkpoint at step %llu in %s/checkpoints failed: %s%s",
                    (unsigned long long)step, s->ckpt_root, ps_strerror(rc),
                    rc == PS_EFULL ? " (disk full; earlier checkpoints are intact)"
                                   : "");
        return;
    }
    atomic_store(&s->last_ckpt, step);
    atomic_store(&s->last_ckpt_bytes, bytes);
    ps_histogram_observe(&s->ckpt_seconds, ps_metrics_now() - t0);
    size_t keep = ps_retention_keep(s->o.checkpoint_keep, keep_at_least);
    if (keep > 0)
        psd_ckpt_prune_sparing(s->ckpt_root, keep, step);
    ps_log_info("checkpoint at step %llu: %s (%llu bytes)",
                (unsigned long long)step, path, (unsigned long long)bytes);
    Ps__V1__CheckpointResponse resp = PS__V1__CHECKPOINT_RESPONSE__INIT;
    resp.path = path;
    resp.step = step;
    resp.bytes = bytes;
    ps_rpc_reply_pb(call, &resp);
}

static void restore_run(psd_shard *s, ps_rpc_call *call, uint64_t step, int row_dtype,
                        int slot_dtype);

static void *ckpt_main(void *arg)
{
    psd_shard *s = arg;
    pthread_setname_np(pthread_self(), "psd-ckpt");
    pthread_mutex_lock(&s->ckpt_mu);
    for (;;) {
        while (!s->ckpt_quit && s->ckpt_jobs == NULL)
            pthread_cond_wait(&s->ckpt_cond, &s->ckpt_mu);
        struct ckpt_job *j = s->ckpt_jobs;
        if (j == NULL)
            break; /* quit, nothing left */
        s->ckpt_jobs = j->next;
        if (s->ckpt_jobs == NULL)
            s->ckpt_tail = &s->ckpt_jobs;
        bool quit = s->ckpt_quit;
        pthread_mutex_unlock(&s->ckpt_mu);
        if (quit)
            ps_rpc_fail(j->call, PS_RPC_UNAVAILABLE, "psd is shutting down");
        else if (j->kind == JOB_RESTORE)
            restore_run(s, j->call, j->step, (int)(j->keep_at_least & 0xff),
                        (int)(j->keep_at_least >> 8));
        else if (j->kind == JOB_CREATE)
            shard_create_variable_run(s, j->call, j->req, j->len, true);
        else
            checkpoint_run(s, j->call, j->step, j->keep_at_least);
        free(j->req);
        free(j);
        pthread_mutex_lock(&s->ckpt_mu);
    }
    pthread_mutex_unlock(&s->ckpt_mu);
    return NULL;
}

/* Fails every waiting call: Restore replaces the variables they point to. */
static void fail_all_waits(psd_shard *s, enum ps_rpc_code code, const char *msg)
{
    pthread_mutex_lock(&s->wait_mu);
    pull_waiter *w = s->waiters;
    s->waiters = NULL;
    s->nwaiters = 0;
    pending_push *p = s->pending;
    s->pending = NULL;
    /* Pushes waiting for their commit: their updates are gone with the
     * variables they changed. */
    pending_push *d = s->durable;
    s->durable = NULL;
    pthread_mutex_unlock(&s->wait_mu);
    while (d != NULL) {
        pending_push *next = d->next;
        ps_rpc_fail(d->call, code, "%s", msg);
        shard_pending_free(d);
        d = next;
    }
    while (w != NULL) {
        pull_waiter *next = w->next;
        ps_rpc_fail(w->call, code, "%s", msg);
        shard_waiter_free(w);
        w = next;
    }
    while (p != NULL) {
        pending_push *next = p->next;
        ps_rpc_fail(p->call, code, "%s", msg);
        shard_pending_free(p);
        p = next;
    }
}

/* Restore runs on the checkpoint thread (after any checkpoint before it):
 * loading a big checkpoint and writing it into the live store take
 * seconds, during which the serving thread goes on answering with the
 * variables as they are; only the swap holds every call. */
static void restore(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    Ps__V1__RestoreRequest *r = shard_unpack(ctx, call, "Restore",
                                             &ps__v1__restore_request__descriptor, req, len);
    int d = r != NULL ? (int)r->sparse_row_dtype : 0;
    int sd = r != NULL ? (int)r->sparse_slot_dtype : 0;
    bool bad_d = d != 0 && d != PS__V1__DTYPE__DTYPE_FLOAT32 && !shard_is_half(d);
    if (r != NULL && (bad_d || (sd != 0 && sd != PS__V1__DTYPE__DTYPE_FLOAT32 &&
                                !shard_is_half(sd)))) {
        shard_count_bad(ctx);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Restore: sparse_%s_dtype %d is not "
                    "FLOAT32, FLOAT16 or BFLOAT16", bad_d ? "row" : "slot", bad_d ? d : sd);
    } else if (r != NULL) {
        /* The dtypes (each < 256) ride in the job's second number, unused
         * by Restore. */
        job_enqueue(ctx, call, JOB_RESTORE, r->step, (size_t)d | (size_t)sd << 8, "Restore");
    }
    ps__v1__restore_request__free_unpacked(r, NULL);
}

/* Finds the checkpoint of *step (0: the latest, written back) and loads
 * its variables into lc. Returns false with call failed. */
static bool restore_load(psd_shard *s, ps_rpc_call *call, uint64_t *step,
                         struct var_list *lc)
{
    int rc = 0;
    if (*step == 0 && (rc = psd_ckpt_latest(s->ckpt_root, step)) != 0) {
        ps_rpc_fail(call, PS_RPC_NOT_FOUND,
                    "Restore: no complete checkpoint under %s/checkpoints",
                    s->ckpt_root);
        return false;
    }
    char path[4096];
    rc = psd_ckpt_path(s->ckpt_root, *step, path, sizeof path);
    if (rc != 0) {
        ps_rpc_fail(call, rc == PS_ECORRUPT ? PS_RPC_DATA_LOSS : PS_RPC_NOT_FOUND,
                    "Restore: checkpoint %llu under %s/checkpoints %s",
                    (unsigned long long)*step, s->ckpt_root,
                    rc == PS_ECORRUPT ? "is corrupt (its checksum does not match)"
                                      : "does not exist or is incomplete");
        return false;
    }
    rc = shard_ckpt_load(path, lc);
    if (rc != 0) {
        ps_rpc_fail(call, PS_RPC_DATA_LOSS, "Restore: checkpoint %s does not "
                    "load: %s", path, ps_strerror(rc));
        return false;
    }
    return true;
}

/* Writes the variables of lc into the live store and, once committed,
 * swaps them in for the table's. Returns 0, with lc's variables now the
 * table's, or the store's error with nothing changed. */
static int restore_swap(psd_shard *s, struct var_list *lc)
{
    /* The live store first, with the flusher held off (flush_mu) but calls
     * going on: updates from now to the swap are lost with the variables
     * they change, as a restore means. */
    pthread_mutex_lock(&s->flush_mu);
    /* CreateVariable checks this under table_lock, held through its own
     * store write: one done before is cleared below, one after refused. */
    pthread_rwlock_wrlock(&s->table_lock);
    s->restoring = true;
    pthread_rwlock_unlock(&s->table_lock);
    int rc = shard_store_replace(s, lc);
    if (rc == 0) {
        /* The swap: no handler runs now, so every waiting call is listed
         * and armed. */
        pthread_rwlock_wrlock(&s->table_lock);
        fail_all_waits(s, PS_RPC_ABORTED, "the variables were restored from a "
                       "checkpoint while this call waited; pull again");
        for (size_t i = 0; i < s->nvars; i++) {
            shard_var_detach(s, s->vars[i]);
            shard_var_free(s->vars[i]);
        }
        free(s->vars);
        s->vars = lc->vars;
        s->nvars = s->cap = lc->n;
        for (size_t i = 0; i < s->nvars; i++)
            shard_var_attach(s, s->vars[i]);
        free(lc->from); /* the checkpoint's path, read by the replace */
        lc->from = NULL;
        shard_sort_vars(s->vars, s->nvars);
        shard_caps_recount(s);
        atomic_store(&s->committed_seq, atomic_load(&s->apply_seq));
        atomic_store(&s->dirty_since_ms, 0);
        s->restoring = false;
        pthread_rwlock_unlock(&s->table_lock);
    } else {
        /* Not committed: LMDB kept the store as it was, the live
         * variables'. */
        pthread_rwlock_wrlock(&s->table_lock);
        s->restoring = false;
        pthread_rwlock_unlock(&s->table_lock);
    }
    pthread_mutex_unlock(&s->flush_mu);
    return rc;
}

static void restore_run(psd_shard *s, ps_rpc_call *call, uint64_t step, int row_dtype,
                        int slot_dtype)
{
    struct var_list lc;
    if (!restore_load(s, call, &step, &lc))
        return;
    size_t n = lc.n;
    char why[512];
    int rc = row_dtype || slot_dtype
                 ? shard_ckpt_convert(&lc, row_dtype, slot_dtype, why, sizeof why) : 0;
    if (rc != 0) {
        shard_vars_free(&lc);
        if (rc == -ENOMEM)
            ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Restore: out of memory converting "
                        "the sparse tables (the variables are unchanged)");
        else
            ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Restore: %s (the variables are "
                        "unchanged)", why);
        return;
    }
    rc = restore_swap(s, &lc);
    uint64_t tables = lc.tables_converted, rows = lc.rows_converted;
    if (rc == 0)
        shard_ckpt_converted_free(&lc); /* the rest is the table's now */
    if (rc != 0) {
        shard_vars_free(&lc);
        ps_rpc_fail(call, ps_rpc_code_from_err(rc), "Restore: writing the "
                    "checkpoint into the live store failed: %s (the variables "
                    "are unchanged)", ps_strerror(rc));
        return;
    }
    ps_log_info("restored %zu variable(s) from checkpoint %llu", n,
                (unsigned long long)step);
    Ps__V1__RestoreResponse resp = PS__V1__RESTORE_RESPONSE__INIT;
    resp.step = step;
    resp.variables = n;
    resp.sparse_tables_converted = tables;
    resp.sparse_rows_converted = rows;
    ps_rpc_reply_pb(call, &resp);
}

/* ---- the method table and its counters ------------------------------ */

/* Counts a call of the method ctx is, then handles it. */
static void counted(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    struct shard_method *m = ctx;
    atomic_fetch_add_explicit(&m->calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->bytes, len, memory_order_relaxed);
    m->fn(call, req, len, m->s);
}

static void counted_push(ps_rpc_call *call, const struct ps_piece *pieces, int np,
                         void *ctx)
{
    struct shard_method *m = ctx;
    size_t len = 0;
    for (int i = 0; i < np; i++)
        len += pieces[i].len;
    atomic_fetch_add_explicit(&m->calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->bytes, len, memory_order_relaxed);
    shard_push(call, pieces, np, m->s);
}

/* The methods, named as /metrics labels them and registered as
 * /ps.v1.ParameterServer/<name>. */
static const struct {
    const char *name;
    ps_rpc_handler fn;
} method_table[SHARD_NMETHODS] = {
    /* Push reads its request in the pieces it arrived in (wire.h). */
    [SHARD_M_PUSH] = {"Push", NULL},
    [SHARD_M_PULL] = {"Pull", shard_pull},
    [SHARD_M_CREATE_VARIABLE] = {"CreateVariable", shard_create_variable},
    [SHARD_M_LIST_VARIABLES] = {"ListVariables", shard_list_variables},
    [SHARD_M_STATS] = {"Stats", shard_stats},
    [SHARD_M_CHECKPOINT] = {"Checkpoint", checkpoint},
    [SHARD_M_RESTORE] = {"Restore", restore},
    [SHARD_M_SET_SYNC_WORKERS] = {"SetSyncWorkers", shard_set_sync_workers},
    [SHARD_M_DELETE_VARIABLE] = {"DeleteVariable", shard_delete_variable},
    [SHARD_M_SPARSE_PULL] = {"SparsePull", shard_sparse_pull},
    [SHARD_M_SPARSE_PUSH] = {"SparsePush", shard_sparse_push},
};

/* The counters /metrics reads, zero before anything is served. */
static void metrics_init(psd_shard *s)
{
    for (int i = 0; i < SHARD_NMETHODS; i++) {
        struct shard_method *m = &s->methods[i];
        m->s = s;
        m->name = method_table[i].name;
        m->fn = method_table[i].fn;
        atomic_init(&m->calls, 0);
        atomic_init(&m->bytes, 0);
    }
    atomic_init(&s->dirty_since_ms, 0);
    atomic_init(&s->last_ckpt_bytes, 0);
    ps_histogram_init(&s->push_seconds, ps_latency_bounds, PS_LATENCY_NBOUNDS);
    ps_histogram_init(&s->pull_seconds, ps_latency_bounds, PS_LATENCY_NBOUNDS);
    ps_histogram_init(&s->commit_seconds, ps_latency_bounds, PS_LATENCY_NBOUNDS);
    ps_histogram_init(&s->ckpt_seconds, ps_long_bounds, PS_LONG_NBOUNDS);
}

/* ---- lifetime --------------------------------------------------------- */

/* Takes the shard's own copy of opts: defaults filled in, the paths its
 * own strings (a checkpoint root of "" or NULL is the data directory). */
static int copy_opts(psd_shard *s, const psd_shard_opts *opts)
{
    s->o = *opts;
    if (s->o.max_message_bytes == 0)
        s->o.max_message_bytes = PS_RPC_DEFAULT_MAX_MESSAGE;
    s->data_dir = strdup(opts->data_dir);
    s->o.data_dir = s->data_dir;
    s->ckpt_root = strdup(opts->checkpoint_root && opts->checkpoint_root[0]
                              ? opts->checkpoint_root : opts->data_dir);
    s->o.checkpoint_root = s->ckpt_root;
    return s->data_dir != NULL && s->ckpt_root != NULL ? 0 : -ENOMEM;
}

/* Starts the checkpoint thread, the push helper, the flusher and the
 * sweeper; -EAGAIN when one does not start. */
static int start_threads(psd_shard *s)
{
    if (ps_thread_start(&s->ckpt_thread, &s->ckpt_mu, &s->ckpt_cond, ckpt_main, s) != 0)
        return -EAGAIN;
    s->ckpt_started = true;
    if (psd_assist_start(&s->assist) != 0 ||
        pthread_create(&s->flusher, NULL, shard_flusher_main, s) != 0 ||
        pthread_create(&s->sweeper, NULL, shard_sweeper_main, s) != 0)
        return -EAGAIN; /* (a started flusher is stopped by close) */
    s->threads_started = true;
    psd_sparse_set_assist(s->sparse, s->assist);
    if (psd_sparse_start(s->sparse) != 0)
        return -EAGAIN;
    return 0;
}

int psd_shard_open(const psd_shard_opts *opts, psd_shard **out)
{
    if (opts->data_dir == NULL || opts->data_dir[0] == '\0' ||
        opts->commit_interval_ms <= 0 || opts->workers == 0)
        return PS_EINVAL_ARG;
    psd_shard *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    pthread_rwlock_init(&s->table_lock, NULL);
    pthread_mutex_init(&s->wait_mu, NULL);
    pthread_cond_init(&s->wait_cond, NULL);
    pthread_mutex_init(&s->flush_mu, NULL);
    pthread_cond_init(&s->flush_cond, NULL);
    pthread_cond_init(&s->flushed_cond, NULL);
    pthread_mutex_init(&s->caps_mu, NULL);
    s->ckpt_tail = &s->ckpt_jobs;
    s->started_ms = ps_now_ms();
    metrics_init(s);
    int rc = copy_opts(s, opts);
    if (rc == 0)
        rc = psd_shmmap_create(&s->shm);
    if (rc == 0)
        rc = shard_store_open(s, opts->map_size);
    /* The caller's buffer serves this open only. */
    s->o.why = NULL;
    s->o.whylen = 0;
    if (rc != 0)
        goto fail;
    uint64_t last = 0;
    if (psd_ckpt_latest(s->ckpt_root, &last) == 0)
        atomic_store(&s->last_ckpt, last);
    rc = start_threads(s);
    if (rc != 0)
        goto fail;
    ps_log_info("loaded %zu variable(s) from %s", s->nvars, s->data_dir);
    *out = s;
    return 0;
fail:
    psd_shard_close(s);
    return rc;
}

void psd_shard_brief(psd_shard *s, struct psd_shard_brief *out)
{
    uint64_t max = 0;
    pthread_rwlock_rdlock(&s->table_lock);
    for (size_t i = 0; i < s->nvars; i++) {
        psd_var *v = s->vars[i];
        pthread_rwlock_rdlock(&v->lock);
        if (v->version > max)
            max = v->version;
        pthread_rwlock_unlock(&v->lock);
    }
    out->variables = s->nvars;
    pthread_rwlock_unlock(&s->table_lock);
    out->max_version = max;
    out->updates = atomic_load(&s->apply_seq);
    out->last_checkpoint = atomic_load(&s->last_ckpt);
}

void psd_shard_set_fixed_overhead(psd_shard *s, uint64_t bytes)
{
    s->fixed_overhead = bytes;
}

int psd_shard_register(psd_shard *s, ps_rpc_server *srv)
{
    s->srv = srv;
    for (int i = 0; i < SHARD_NMETHODS; i++) {
        struct shard_method *m = &s->methods[i];
        char path[96];
        snprintf(path, sizeof path, "/ps.v1.ParameterServer/%s", m->name);
        int rc = m->fn == NULL
                     ? ps_rpc_server_add_method_pieces(srv, path, counted_push, m)
                     : ps_rpc_server_add_method(srv, path, PS_RPC_UNARY, counted, m);
        if (rc != 0)
            return rc;
    }
    return 0;
}

void psd_shard_stop(psd_shard *s)
{
    ps_cond_raise(&s->wait_mu, &s->wait_cond, &s->stopping);
    /* Durable pushes are answered by one last flush. */
    psd_shard_flush(s);
    /* Let the sweeper answer the waits; wait until it has. */
    for (int i = 0; i < 500; i++) {
        pthread_mutex_lock(&s->wait_mu);
        bool empty = s->waiters == NULL && s->pending == NULL;
        pthread_mutex_unlock(&s->wait_mu);
        if (empty)
            break;
        struct timespec ts = {0, 2 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int psd_shard_close(psd_shard *s)
{
    if (s == NULL)
        return 0;
    int rc = 0;
    if (s->threads_started) {
        pthread_mutex_lock(&s->wait_mu);
        s->closing = true;
        s->stopping = true;
        pthread_cond_signal(&s->wait_cond);
        pthread_mutex_unlock(&s->wait_mu);
        ps_cond_raise(&s->flush_mu, &s->flush_cond, NULL);
        ps_cond_raise(&s->flush_mu, &s->flushed_cond, NULL);
        pthread_join(s->flusher, NULL);
        pthread_join(s->sweeper, NULL);
        rc = psd_shard_flush(s);
        fail_all_waits(s, PS_RPC_UNAVAILABLE, "psd is shutting down");
    }
    /* The row log applied: LMDB whole after a clean stop. */
    if (psd_sparse_stop(s->sparse) != 0 && rc == 0)
        rc = PS_ESTORE;
    /* A checkpoint under way finishes; queued ones are refused. */
    if (s->ckpt_started)
        ps_thread_stop(s->ckpt_thread, &s->ckpt_mu, &s->ckpt_cond, &s->ckpt_quit);
    psd_assist_stop(s->assist);
    psd_shmmap_destroy(s->shm);
    for (size_t i = 0; i < s->nvars; i++)
        shard_var_free(s->vars[i]);
    free(s->vars);
    psd_sparse_close(s->sparse);
    shard_store_close(s);
    shard_clocks_free(s);
    pthread_rwlock_destroy(&s->table_lock);
    pthread_mutex_destroy(&s->wait_mu);
    pthread_cond_destroy(&s->wait_cond);
    pthread_mutex_destroy(&s->flush_mu);
    pthread_cond_destroy(&s->flush_cond);
    pthread_cond_destroy(&s->flushed_cond);
    pthread_mutex_destroy(&s->caps_mu);
    free(s->data_dir);
    free(s->ckpt_root);
    free(s);
    return rc;
}
