/*
 * comm.c - the training session's comm threads: one per psd shard that
 * pushes the handed-over gradient and pulls fresh values, and in async mode
 * with --concurrent-pull one more per shard that pulls at the same time as
 * the push. train_internal.h has the interface, train.h the picture.
 */
#include "worker/train_internal.h"

#include "common/errors.h"
#include "common/log.h"
#include "common/metrics.h"
#include "worker/metrics.h"

#include <errno.h>
#include <stdio.h>

/* The job the loop posted last, as a comm thread reads it under s->mu. */
struct job {
    uint64_t step;
    bool pull_only;
    uint64_t min_version;
};

/* Records the first comm error of the session and wakes the loop. */
static void comm_fail(struct session *s, struct shard *sh, int rc,
                      const ps_rpc_status *st, const char *what)
{
    pthread_mutex_lock(&s->mu);
    if (s->failed == 0) {
        s->failed = rc ? rc : PS_ERPC;
        if (rc == PS_ERPC)
            snprintf(s->fail_msg, sizeof s->fail_msg, "psd at %s: %s: %s: %s",
                     sh->address, what, ps_rpc_code_name(st->code), st->message);
        else
            snprintf(s->fail_msg, sizeof s->fail_msg, "psd at %s: %s: %s%s%s",
                     sh->address, what, ps_strerror(rc), st->message[0] ? ": " : "",
                     st->message);
    }
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

/* Waits until a job is posted that this thread (which has finished *done
 * jobs) has not run, and copies it to *j; false when the session quits. */
static bool next_job(struct session *s, const uint64_t *done, struct job *j)
{
    pthread_mutex_lock(&s->mu);
    while (!s->quit && *done == s->posted)
        pthread_cond_wait(&s->cond, &s->mu);
    bool go = !s->quit;
    j->step = s->job_step;
    j->pull_only = s->job_pull_only;
    j->min_version = s->min_version;
    pthread_mutex_unlock(&s->mu);
    return go;
}

/* Counts a job this thread finished and wakes the loop. */
static void job_done(struct session *s, uint64_t *done)
{
    pthread_mutex_lock(&s->mu);
    (*done)++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

/*
 * The push of one job. Sets *together when the push brought the values
 * back in the same round trip, and *minv to the version the pull must
 * reach (sync). A stale sync push (the variables aggregate another step)
 * is not an error: *stale_out is set, and the worker rejoins at their step.
 */
static int push_job(struct shard *sh, const struct job *j, ps_client_item *items,
                    ps_rpc_status *st, bool *together, uint64_t *minv, bool *stale_out)
{
    const struct wd_train_opts *o = sh->s->o;
    /* A sync push waits for every worker's push of the step. */
    int dl = o->consistency == 2 ? o->rpc_timeout_ms * 6 : o->rpc_timeout_ms;
    uint64_t push_step = o->consistency == 2 ? sh->sync_step : j->step;
    *stale_out = false;
    int rc;
    /* The push brings the values back in the same round trip, unless a
     * concurrent pull fetches them (async). */
    *together = o->consistency == 2 || o->local_steps > 0 ||
                (!o->concurrent_pull && o->consistency != 3);
    double t0 = ps_metrics_now();
    if (*together)
        rc = ps_client_push_pull(sh->client, (uint32_t)o->task_index,
                                 push_step, items, sh->pull_items,
                                 sh->nitems, dl, st);
    else
        rc = ps_client_push(sh->client, (uint32_t)o->task_index, push_step,
                            items, sh->nitems, dl, st);
    bool stale = rc == PS_ERPC && o->consistency == 2 &&
                 st->code == PS_RPC_FAILED_PRECONDITION;
    if (rc != 0 && !stale)
        return rc;
    wd_metrics_call(o->metrics, true, ps_metrics_now() - t0);
    if (stale) {
        /* A worker that rejoins a sync job (or fell behind while it was
         * counted out) takes the step the variables are at: the pull
         * below learns it, and push_then_pull sends the gradient again
         * at that step. */
        ps_log_info("step %llu is not the one the variables aggregate "
                    "(%s); rejoining at theirs", (unsigned long long)push_step,
                    st->message);
        *minv = 0;
        *together = false;
        *stale_out = true;
    } else if (o->consistency == 2) {
        *minv = items[0].version;
    }
    return 0;
}

/* The shard's push items over zeros (made on first use; NULL when out of
 * memory): a gradient psd refused is in the error feedback residuals
 * already (ps_client_set_wire_dtype), and a push of zeros sends exactly
 * it, where the gradient itself would count twice. */
static ps_client_item *zero_items(struct shard *sh)
{
    if (sh->zero_items != NULL || sh->nitems == 0)
        return sh->zero_items;
    size_t total = 0;
    for (size_t i = 0; i < sh->nitems; i++)
        total += sh->push_items[i].n;
    float *z = calloc(total ? total : 1, sizeof *z);
    ps_client_item *its = malloc(sh->nitems * sizeof *its);
    if (z == NULL || its == NULL) {
        free(z);
        free(its);
        return NULL;
    }
    for (size_t i = 0, off = 0; i < sh->nitems; off += its[i].n, i++) {
        its[i] = sh->push_items[i];
        its[i].data = z + off;
        its[i].msg = NULL;
    }
    return sh->zero_items = its;
}

/* One job of a comm thread. Returns 0, or a code with *st set and *what
 * naming the RPC that failed. */
typedef int job_fn(struct shard *sh, const struct job *j, ps_rpc_status *st,
                   const char **what);

/* A comm thread's loop: runs each posted job and counts it in *done. A
 * failed job is recorded for the loop instead, and not counted. */
static void serve_jobs(struct shard *sh, uint64_t *done, job_fn *run)
{
    struct job j;
    while (next_job(sh->s, done, &j)) {
        ps_rpc_status st = {0};
        const char *what = "";
        int rc = run(sh, &j, &st, &what);
        if (rc != 0)
            comm_fail(sh->s, sh, rc, &st, what);
        else
            job_done(sh->s, done);
    }
}

/* comm_main's job: the push, then the pull unless the push brought the
 * values or pull_main fetches them. */
static int push_then_pull(struct shard *sh, const struct job *j,
                          ps_rpc_status *st, const char **what)
{
    const struct wd_train_opts *o = sh->s->o;
    uint64_t minv = j->min_version;
    bool together = false; /* the push brought the values */
    bool stale = false;
    int rc;
    *what = "Push";
    if (!j->pull_only && sh->nitems > 0 &&
        (rc = push_job(sh, j, sh->push_items, st, &together, &minv, &stale)) != 0)
        return rc;
    for (size_t i = 0; i < sh->nitems; i++)
        sh->pull_items[i].min_version = o->consistency == 2 ? minv : 0;
    *what = "Pull";
    if (sh->nitems > 0 && !together &&
        (o->consistency != 1 || !o->concurrent_pull || j->pull_only)) {
        double t0 = ps_metrics_now();
        /* Bounded staleness (3): the pull names this worker's clock, the
         * steps it has pushed, and psd holds it until the slowest live
         * worker is close enough (relaxed.h). */
        if (o->consistency == 3 && !j->pull_only)
            rc = ps_client_pull_at(sh->client, (uint32_t)o->task_index,
                                   j->step + 1, sh->pull_items, sh->nitems,
                                   o->rpc_timeout_ms * 6, st);
        else
            rc = ps_client_pull(sh->client, sh->pull_items, sh->nitems,
                                o->rpc_timeout_ms, st);
        if (rc != 0)
            return rc;
        wd_metrics_call(o->metrics, false, ps_metrics_now() - t0);
    }
    if (o->consistency == 2 && sh->nitems > 0)
        sh->sync_step = sh->pull_items[0].version;
    if (stale) {
        /* The gradient again, at the step this shard aggregates, in this
         * job. Dropped, this shard's step would wait for this worker's
         * next job, which waits for every shard of this one: another
         * shard's step waiting for a worker that waits here would never
         * come (the other workers keep that lockstep too). Stale again
         * (the step was applied without this worker meanwhile): dropped,
         * or with error feedback kept in the residuals for the next push.
         * With error feedback it is in the residuals already and goes
         * again as zeros. */
        bool again = false;
        ps_client_item *items = sh->feedback ? zero_items(sh) : sh->push_items;
        *what = "Push";
        if (items == NULL)
            return -ENOMEM;
        if ((rc = push_job(sh, j, items, st, &together, &minv, &again)) != 0)
            return rc;
        if (!again) /* a sync push brings the step's values back */
            sh->sync_step = sh->pull_items[0].version;
    }
    return 0;
}

/* pull_main's job: the pull, on the second connection. */
static int pull_beside(struct shard *sh, const struct job *j,
                       ps_rpc_status *st, const char **what)
{
    *what = "Pull";
    if (sh->nitems == 0 || j->pull_only)
        return 0;
    double t0 = ps_metrics_now();
    int rc = ps_client_pull(sh->pull_client, sh->pull_items, sh->nitems,
                            sh->s->o->rpc_timeout_ms, st);
    if (rc == 0)
        wd_metrics_call(sh->s->o->metrics, false, ps_metrics_now() - t0);
    return rc;
}

static void *comm_main(void *arg)
{
    struct shard *sh = arg;
    serve_jobs(sh, &sh->done, push_then_pull);
    return NULL;
}

/* Async only: each job's pull, beside the push on comm_main. */
static void *pull_main(void *arg)
{
    struct shard *sh = arg;
    serve_jobs(sh, &sh->pull_done, pull_beside);
    return NULL;
}

int wd_comm_start(struct session *s, const ps_rpc_client_opts *co, char *err,
                  size_t errlen)
{
    const struct wd_train_opts *o = s->o;
    for (int k = 0; k < s->nshards; k++) {
        struct shard *sh = &s->shards[k];
        if (pthread_create(&sh->th, NULL, comm_main, sh) != 0)
            return -EAGAIN;
        if (o->consistency != 1 || !o->concurrent_pull || o->local_steps > 0 ||
            sh->nitems == 0)
            continue;
        /* A second channel: gRPC shares one connection between channels
         * with equal arguments, so give it a distinct message limit. */
        ps_rpc_client_opts pco = *co;
        pco.max_message_bytes = PS_RPC_DEFAULT_MAX_MESSAGE - 1;
        int rc = ps_client_create(sh->address, &pco, &sh->pull_client);
        if (rc != 0) {
            snprintf(err, errlen, "psd address '%s': %s", sh->address,
                     ps_strerror(rc));
            return rc;
        }
        if (ps_client_shm_active(sh->client))
            ps_client_set_shm(sh->pull_client, s->shm);
        else if (o->wire_dtype != 0)
            ps_client_set_wire_dtype(sh->pull_client, o->wire_dtype, false);
        ps_client_set_pieces(sh->pull_client, o->piece_bytes, 4); /* checked above */
        if (pthread_create(&sh->pull_th, NULL, pull_main, sh) != 0)
            return -EAGAIN;
    }
    return 0;
}

void wd_comm_stop(struct session *s)
{
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    for (int k = 0; k < s->nshards; k++) {
        struct shard *sh = &s->shards[k];
        if (sh->th)
            pthread_join(sh->th, NULL);
        if (sh->pull_th)
            pthread_join(sh->pull_th, NULL);
    }
}

/* Makes the freshly reduced gradient the one to push (the previous push
 * must be done): swaps the two gradient buffers under the push items. */
void wd_swap_grads(struct session *s)
{
    float *old = s->grads_send;
    ps_rpc_msg *old_msg = s->send_msg;
    s->grads_send = s->grads_fill;
    s->send_msg = s->fill_msg;
    s->grads_fill = old;
    s->fill_msg = old_msg;
    for (int k = 0; k < s->nshards; k++)
        for (size_t i = 0; i < s->shards[k].nitems; i++) {
            ps_client_item *it = &s->shards[k].push_items[i];
            it->data = s->grads_send + (it->data - old);
            it->msg = s->send_msg;
        }
}

/* Makes the values the last pull brought the model's. Replica 0 on a host
 * backend reads the pulled block itself and the next pull lands in the one
 * it read before, with no copy; other replicas copy. Called while no job
 * runs (the comm threads read pull_items). */
int wd_take_pulled(struct session *s)
{
    float *pulled = s->params_pull;
    bool direct = ps_model_use_params(s->replicas[0], pulled) == 0;
    for (int r = direct ? 1 : 0; r < s->nrep; r++) {
        int rc = ps_model_params_from_host(s->replicas[r], pulled);
        if (rc != 0)
            return rc;
    }
    if (direct) {
        s->params_pull = s->params_live;
        s->params_live = pulled;
        for (int k = 0; k < s->nshards; k++)
            for (size_t i = 0; i < s->shards[k].nitems; i++) {
                ps_client_item *it = &s->shards[k].pull_items[i];
                it->data = s->params_pull + (it->data - pulled);
            }
    }
    return 0;
}

/* Posts a job (push grads_send for step, then pull) to every shard. */
void wd_post_job(struct session *s, uint64_t step, bool pull_only)
{
    pthread_mutex_lock(&s->mu);
    s->job_step = step;
    s->job_pull_only = pull_only;
    s->posted++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

/* Waits for the last job on every shard; returns the comm error if any. */
int wd_wait_job(struct session *s)
{
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->failed)
            break;
        bool all = true;
        for (int k = 0; k < s->nshards; k++)
            all = all && s->shards[k].done == s->posted &&
                  (s->shards[k].pull_th == 0 || s->shards[k].pull_done == s->posted);
        if (all)
            break;
        pthread_cond_wait(&s->cond, &s->mu);
    }
    int rc = s->failed;
    pthread_mutex_unlock(&s->mu);
    return rc;
}
