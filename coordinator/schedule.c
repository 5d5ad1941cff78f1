#include "coordinator/schedule.h"

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/rpc.h"
#include "coordinator/shardcall.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Shards one checkpoint round or sync pass handles. */
#define MAX_SHARDS 1024

struct restore_job {
    coord_sched *s;
    struct coord_ps_call call;
    pthread_t th;
    atomic_bool done;
    struct restore_job *next;
};

struct coord_sched {
    coord *c;
    struct coord_sched_opts o;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stopping;
    bool stopped;
    int nthreads;
    pthread_t threads[3];
    struct restore_job *restores; /* under mu */
};

/* Sleeps up to ms or until stopping. Returns false once stopping. */
static bool nap(coord_sched *s, int ms)
{
    struct timespec until = ps_time_after_ms(CLOCK_MONOTONIC, ms);
    pthread_mutex_lock(&s->mu);
    while (!s->stopping)
        if (pthread_cond_timedwait(&s->cond, &s->mu, &until) == ETIMEDOUT)
            break;
    bool go = !s->stopping;
    pthread_mutex_unlock(&s->mu);
    return go;
}

static bool retryable(int code)
{
    return code == PS_RPC_UNAVAILABLE || code == PS_RPC_DEADLINE_EXCEEDED;
}

/* ---- liveness ---------------------------------------------------------- */

static void *liveness_main(void *arg)
{
    coord_sched *s = arg;
    do
        coord_tick(s->c);
    while (nap(s, s->o.tick_ms));
    return NULL;
}

/* ---- sync worker counts ------------------------------------------------ */

static void *sync_main(void *arg)
{
    coord_sched *s = arg;
    struct coord_ps_call *calls = calloc(MAX_SHARDS, sizeof *calls);
    /* The last failure logged per ps index, so a shard that is down is
     * reported once per count, not every pass. */
    struct coord_ps_call *warned = calloc(MAX_SHARDS, sizeof *warned);
    if (calls == NULL || warned == NULL) {
        ps_log_error("sync-count thread: out of memory; ps shards will not "
                     "be told the live worker count");
        free(calls);
        free(warned);
        return NULL;
    }
    int pause = 100;
    while (nap(s, pause)) {
        int n = coord_sync_pending(s->c, calls, MAX_SHARDS);
        pause = 100;
        for (int i = 0; i < n; i++) {
            struct coord_ps_call *k = &calls[i];
            uint32_t previous = 0;
            ps_rpc_status st;
            if (coord_call_set_sync(k->address, k->workers,
                                    s->o.sync_deadline_ms, &previous,
                                    &st) == 0) {
                ps_log_info("ps[%u] at %s: sync steps wait for %u worker%s "
                            "(was %u)", k->index, k->address, k->workers,
                            k->workers == 1 ? "" : "s", previous);
                coord_sync_done(s->c, k, true);
                continue;
            }
            struct coord_ps_call *w =
                k->index < MAX_SHARDS ? &warned[k->index] : NULL;
            bool again = w != NULL && w->incarnation == k->incarnation &&
                         w->workers == k->workers;
            if (!again)
                ps_log_warn("ps[%u] at %s: SetSyncWorkers(%u) failed: %s: "
                            "%s%s", k->index, k->address, k->workers,
                            ps_rpc_code_name(st.code), st.message,
                            retryable(st.code) ? "; retrying" : "");
            if (w != NULL)
                *w = *k;
            if (retryable(st.code))
                pause = 500;
            coord_sync_done(s->c, k, !retryable(st.code));
        }
    }
    free(calls);
    free(warned);
    return NULL;
}

/* ---- checkpoints ------------------------------------------------------- */

struct shard_job {
    const struct coord_ps_call *call;
    struct coord_shard_result *res;
    int deadline_ms;
    int keep;
    struct coord_ckpt_answer answer;
};

static void *shard_checkpoint(void *arg)
{
    struct shard_job *j = arg;
    const struct coord_ps_call *k = j->call;
    struct coord_shard_result *r = j->res;
    memset(r, 0, sizeof *r);
    r->index = k->index;
    snprintf(r->address, sizeof r->address, "%s", k->address);
    struct coord_ckpt_answer *a = &j->answer;
    ps_rpc_status st;
    if (coord_call_checkpoint(k->address, k->step,
                              j->keep > 0 ? (uint32_t)j->keep : 0,
                              j->deadline_ms, a, &st) != 0) {
        snprintf(r->error, sizeof r->error, "%s: %s",
                 ps_rpc_code_name(st.code), st.message);
        return NULL;
    }
    if (a->step != k->step) {
        snprintf(r->error, sizeof r->error, "it checkpointed step %" PRIu64
                 ", not %" PRIu64, a->step, k->step);
    } else {
        r->ok = true;
        r->bytes = a->bytes;
        snprintf(r->path, sizeof r->path, "%s", a->path);
    }
    return NULL;
}

static void checkpoint_round(coord_sched *s, uint64_t step,
                             const struct coord_ps_call *calls, int n)
{
    struct coord_shard_result *res = calloc((size_t)n, sizeof *res);
    struct shard_job *jobs = calloc((size_t)n, sizeof *jobs);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    bool *started = calloc((size_t)n, sizeof *started);
    if (res == NULL || jobs == NULL || th == NULL || started == NULL) {
        ps_log_error("job checkpoint at step %" PRIu64 ": out of memory",
                     step);
        coord_checkpoint_done(s->c, step, NULL, 0);
        goto out;
    }
    ps_log_info("job checkpoint at step %" PRIu64 ": asking %d ps shard%s",
                step, n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
        jobs[i] = (struct shard_job){.call = &calls[i], .res = &res[i],
                                     .deadline_ms =
                                         s->o.checkpoint_deadline_ms,
                                     .keep = s->o.checkpoint_keep};
        started[i] = pthread_create(&th[i], NULL, shard_checkpoint,
                                    &jobs[i]) == 0;
        if (!started[i])
            shard_checkpoint(&jobs[i]);
    }
    for (int i = 0; i < n; i++)
        if (started[i])
            pthread_join(th[i], NULL);
    coord_checkpoint_done(s->c, step, res, n);
out:
    free(res);
    free(jobs);
    free(th);
    free(started);
}

static void *checkpoint_main(void *arg)
{
    coord_sched *s = arg;
    struct coord_ps_call *calls = calloc(MAX_SHARDS, sizeof *calls);
    if (calls == NULL) {
        ps_log_error("checkpoint thread: out of memory; no job checkpoints "
                     "will be taken");
        return NULL;
    }
    while (nap(s, 100)) {
        uint64_t step;
        int n;
        if (coord_checkpoint_due(s->c, &step, calls, MAX_SHARDS, &n))
            checkpoint_round(s, step, calls, n);
    }
    free(calls);
    return NULL;
}

/* ---- restores ---------------------------------------------------------- */

static void *restore_main(void *arg)
{
    struct restore_job *j = arg;
    coord_sched *s = j->s;
    const struct coord_ps_call *k = &j->call;
    int backoff = 200;
    bool told = false;
    while (coord_restore_wanted(s->c, k)) {
        uint64_t restored = 0, variables = 0;
        struct coord_stats_answer now = {0};
        ps_rpc_status st;
        /* "empty" is the registration's word; the shard's own answer
         * decides, so that a registration in a live shard's name cannot
         * roll its variables back. */
        int rc = coord_call_stats(k->address, s->o.restore_deadline_ms,
                                  &now, &st);
        uint64_t held = now.variables;
        if (rc == 0 && held > 0) {
            char detail[200];
            snprintf(detail, sizeof detail, "not restored: it registered "
                     "empty, but its Stats answers %" PRIu64 " variable%s",
                     held, held == 1 ? "" : "s");
            coord_restore_done(s->c, k, false, 0, detail);
            goto out;
        }
        if (rc == 0)
            rc = coord_call_restore(k->address, k->step,
                                    s->o.restore_deadline_ms, &restored,
                                    &variables, &st);
        if (rc == 0) {
            char detail[128];
            snprintf(detail, sizeof detail, "restored step %" PRIu64
                     ", %" PRIu64 " variables", restored, variables);
            coord_restore_done(s->c, k, true, variables, detail);
            goto out;
        }
        char detail[600];
        snprintf(detail, sizeof detail, "%s: %s", ps_rpc_code_name(st.code),
                 st.message);
        if (!retryable(st.code)) {
            coord_restore_done(s->c, k, false, 0, detail);
            goto out;
        }
        if (!told)
            ps_log_info("restore of ps[%u] at %s: no answer yet (%s); "
                        "retrying", k->index, k->address, detail);
        told = true;
        if (!nap(s, backoff))
            break;
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
    }
    ps_log_info("restore of ps[%u] at %s abandoned: %s", k->index,
                k->address, coord_stopping(s->c) ? "the coordinator stops"
                : "the task registered again");
out:
    atomic_store(&j->done, true);
    return NULL;
}

/* Joins restore threads that have ended. Called with s->mu held. */
static void reap_locked(coord_sched *s)
{
    for (struct restore_job **p = &s->restores; *p != NULL;) {
        struct restore_job *j = *p;
        if (!atomic_load(&j->done)) {
            p = &j->next;
            continue;
        }
        pthread_join(j->th, NULL);
        *p = j->next;
        free(j);
    }
}

int coord_sched_restore(coord_sched *s, const struct coord_ps_call *call)
{
    struct restore_job *j = calloc(1, sizeof *j);
    if (j == NULL) {
        coord_restore_done(s->c, call, false, 0, "out of memory");
        return -ENOMEM;
    }
    j->s = s;
    j->call = *call;
    atomic_init(&j->done, false);
    pthread_mutex_lock(&s->mu);
    reap_locked(s);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        free(j);
        return PS_ESHUTDOWN;
    }
    int rc = pthread_create(&j->th, NULL, restore_main, j);
    if (rc == 0) {
        j->next = s->restores;
        s->restores = j;
    }
    pthread_mutex_unlock(&s->mu);
    if (rc != 0) {
        free(j);
        coord_restore_done(s->c, call, false, 0,
                           "cannot start a thread for it");
        return -rc;
    }
    return 0;
}

/* ---- start, stop ------------------------------------------------------- */

int coord_sched_start(coord *c, const struct coord_sched_opts *o,
                      coord_sched **out)
{
    *out = NULL;
    coord_sched *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    s->c = c;
    s->o = *o;
    if (s->o.tick_ms <= 0)
        s->o.tick_ms = 100;
    if (s->o.checkpoint_deadline_ms <= 0)
        s->o.checkpoint_deadline_ms = 60000;
    if (s->o.restore_deadline_ms <= 0)
        s->o.restore_deadline_ms = 60000;
    if (s->o.sync_deadline_ms <= 0)
        s->o.sync_deadline_ms = 2000;
    pthread_mutex_init(&s->mu, NULL);
    ps_cond_init_monotonic(&s->cond);
    void *(*mains[])(void *) = {liveness_main, sync_main, checkpoint_main};
    for (int i = 0; i < 3; i++) {
        int rc = pthread_create(&s->threads[i], NULL, mains[i], s);
        if (rc != 0) {
            coord_sched_stop(s);
            coord_sched_destroy(s);
            return -rc;
        }
        s->nthreads++;
    }
    *out = s;
    return 0;
}

void coord_sched_stop(coord_sched *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->stopped) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->stopping = true;
    s->stopped = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    s->nthreads = 0;
    /* No restore starts once stopping, so the list only shrinks. */
    pthread_mutex_lock(&s->mu);
    struct restore_job *j = s->restores;
    s->restores = NULL;
    pthread_mutex_unlock(&s->mu);
    while (j != NULL) {
        struct restore_job *next = j->next;
        pthread_join(j->th, NULL);
        free(j);
        j = next;
    }
}

void coord_sched_destroy(coord_sched *s)
{
    if (s == NULL)
        return;
    coord_sched_stop(s);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
