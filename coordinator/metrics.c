/*
 * metrics.c - pscoord's /metrics page (coord.h's coord_metrics_collect):
 * the job as the coordinator sees it, copied out of the core under its
 * mutex in one short hold and written after it is released, so a scrape
 * delays a heartbeat by a copy of a few numbers per task.
 *
 * Tasks:        pscoord_tasks{role,state}, pscoord_workers,
 *               pscoord_live_workers, pscoord_ps_shards,
 *               pscoord_sync_workers, pscoord_ps_restoring
 * Liveness:     pscoord_missed_heartbeats_total{role}
 * Progress:     pscoord_global_step, pscoord_cluster_generation,
 *               pscoord_eval_accuracy, pscoord_eval_loss, pscoord_eval_step
 * Checkpoints:  pscoord_job_checkpoint_last_step,
 *               pscoord_job_checkpoint_last_timestamp_seconds,
 *               pscoord_job_checkpoint_age_seconds,
 *               pscoord_job_checkpoints_total{result},
 *               pscoord_restores_total{result}
 * Process:      pscoord_uptime_seconds
 *
 * The counters count since this process started (Prometheus' rate() takes
 * a restart's reset in its stride); the gauges are the state, which a
 * restarted coordinator reloads from state.json.
 */
#include "coordinator/coord_internal.h"

#include "common/clock.h"

#include <math.h>
#include <string.h>

#define NSTATES 4 /* enum ctask_state */

/* What the page shows, copied under the core's mutex. */
struct view {
    uint64_t tasks[PS_ROLE_COUNT][NSTATES];
    uint64_t missed[PS_ROLE_COUNT];
    uint32_t workers, live_workers, num_ps, sync_workers, restoring;
    uint64_t global_step, generation;
    bool has_eval;
    double eval_accuracy, eval_loss;
    uint64_t eval_step;
    bool has_ckpt;
    uint64_t ckpt_step;
    int64_t ckpt_unix;
    uint64_t ckpt_ok, ckpt_failed, restores_ok, restores_failed;
    int64_t start_ms;
};

/* Labels of enum ctask_state, in its order: label values with no space
 * (coord_state_name's "never seen" is for people). */
static const char *const state_labels[NSTATES] = {"never_seen", "unknown",
                                                  "alive", "dead"};

static void copy_view(coord *c, struct view *v)
{
    memset(v, 0, sizeof *v);
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->ntasks; i++) {
        const struct ctask *t = &c->tasks[i];
        if ((unsigned)t->role >= PS_ROLE_COUNT || (unsigned)t->state >= NSTATES)
            continue;
        v->tasks[t->role][t->state]++;
        v->workers += t->role == PS_ROLE_WORKER;
        v->live_workers += t->role == PS_ROLE_WORKER && t->state == CT_ALIVE;
        v->restoring += t->role == PS_ROLE_PS && t->restoring;
    }
    memcpy(v->missed, c->missed_heartbeats, sizeof v->missed);
    /* As GetCluster counts them: the spec's, else those registered. */
    if (c->spec != NULL)
        v->workers = (uint32_t)c->spec->n[PS_ROLE_WORKER];
    v->num_ps = coord_num_ps_locked(c);
    v->sync_workers = c->sync_desired;
    v->global_step = c->global_step;
    v->generation = c->generation;
    v->has_eval = c->has_eval;
    v->eval_accuracy = c->eval_accuracy;
    v->eval_loss = c->eval_loss;
    v->eval_step = c->eval_step;
    if (c->nckpts > 0) {
        v->has_ckpt = true;
        v->ckpt_step = c->ckpts[c->nckpts - 1].step;
        v->ckpt_unix = c->ckpts[c->nckpts - 1].created_unix;
    }
    v->ckpt_ok = c->ckpt_rounds_ok;
    v->ckpt_failed = c->ckpt_rounds_failed;
    v->restores_ok = c->restores_ok;
    v->restores_failed = c->restores_failed;
    v->start_ms = c->start_ms;
    pthread_mutex_unlock(&c->mu);
}

static void tasks(ps_metrics *m, const struct view *v)
{
    /* Every role and state, zeros too: a series that appears only when a
     * task first dies hides that death from rate() and alerts. */
    ps_metrics_family(m, "pscoord_tasks", PS_METRIC_GAUGE,
                      "Tasks of the job by role and state: never_seen (in the "
                      "spec, not registered yet), unknown (not heard from since "
                      "the coordinator restarted), alive, dead.");
    for (int r = 0; r < PS_ROLE_COUNT; r++)
        for (int st = 0; st < NSTATES; st++)
            ps_metrics_sample(m, (double)v->tasks[r][st], "role",
                              ps_role_name((enum ps_role)r), "state",
                              state_labels[st], NULL);
    ps_metrics_gauge(m, "pscoord_workers", "Workers of the job (the spec's, else "
                     "those that registered).", (double)v->workers);
    ps_metrics_gauge(m, "pscoord_live_workers", "Workers alive (heard from within "
                     "the heartbeat timeout).", (double)v->live_workers);
    ps_metrics_gauge(m, "pscoord_ps_shards", "ps shards the variables are placed "
                     "over.", (double)v->num_ps);
    ps_metrics_gauge(m, "pscoord_sync_workers", "Workers a sync step waits for, as "
                     "told to the ps shards (0: none told yet).",
                     (double)v->sync_workers);
    ps_metrics_gauge(m, "pscoord_ps_restoring", "ps shards being restored from the "
                     "latest job checkpoint now.", (double)v->restoring);
    ps_metrics_family(m, "pscoord_missed_heartbeats_total", PS_METRIC_COUNTER,
                      "Tasks declared dead for sending no heartbeat within the "
                      "heartbeat timeout, by role (a task that comes back and "
                      "falls silent again counts again).");
    for (int r = 0; r < PS_ROLE_COUNT; r++)
        ps_metrics_sample(m, (double)v->missed[r], "role",
                          ps_role_name((enum ps_role)r), NULL);
}

static void progress(ps_metrics *m, const struct view *v)
{
    ps_metrics_gauge(m, "pscoord_global_step", "The job's global step: the highest "
                     "step a worker has reported.", (double)v->global_step);
    ps_metrics_gauge(m, "pscoord_cluster_generation", "The cluster's membership "
                     "generation (GetCluster's generation): rises with every change of "
                     "membership, liveness, placement or latest checkpoint.",
                     (double)v->generation);
    /* NaN until an evaluator reports: 0 would read as a model that is
     * always wrong. */
    ps_metrics_gauge(m, "pscoord_eval_accuracy", "Test accuracy of the latest "
                     "evaluation (NaN: none yet).",
                     v->has_eval ? v->eval_accuracy : NAN);
    ps_metrics_gauge(m, "pscoord_eval_loss", "Test loss of the latest evaluation "
                     "(NaN: none yet).", v->has_eval ? v->eval_loss : NAN);
    ps_metrics_gauge(m, "pscoord_eval_step", "Version of the variables the latest "
                     "evaluation read (0: none yet).", (double)v->eval_step);
}

static void checkpoints(ps_metrics *m, const struct view *v)
{
    double now = (double)coord_unix_now();
    /* Without a checkpoint the age counts from the coordinator's start, so
     * that an alert on it fires for a job that never takes one. */
    double since = v->has_ckpt ? (double)v->ckpt_unix
                               : now - (double)(ps_now_ms() - v->start_ms) / 1000.0;
    ps_metrics_gauge(m, "pscoord_job_checkpoint_last_step", "Global step of the "
                     "latest complete job checkpoint (0: none).",
                     (double)v->ckpt_step);
    ps_metrics_gauge(m, "pscoord_job_checkpoint_last_timestamp_seconds", "Unix time "
                     "the latest complete job checkpoint was taken (0: none).",
                     v->has_ckpt ? (double)v->ckpt_unix : 0.0);
    ps_metrics_gauge(m, "pscoord_job_checkpoint_age_seconds", "Seconds since the "
                     "latest complete job checkpoint was taken (none: since the "
                     "coordinator started).", now > since ? now - since : 0.0);
    ps_metrics_family(m, "pscoord_job_checkpoints_total", PS_METRIC_COUNTER,
                      "Job checkpoint rounds run, by result: ok (every shard "
                      "answered, manifest written) or failed.");
    ps_metrics_sample(m, (double)v->ckpt_ok, "result", "ok", NULL);
    ps_metrics_sample(m, (double)v->ckpt_failed, "result", "failed", NULL);
    ps_metrics_family(m, "pscoord_restores_total", PS_METRIC_COUNTER,
                      "Restores of a ps shard that came back empty from the "
                      "latest job checkpoint, by result (ok, failed).");
    ps_metrics_sample(m, (double)v->restores_ok, "result", "ok", NULL);
    ps_metrics_sample(m, (double)v->restores_failed, "result", "failed", NULL);
}

void coord_metrics_collect(ps_metrics *m, void *ctx)
{
    struct view v;
    copy_view(ctx, &v);
    tasks(m, &v);
    progress(m, &v);
    checkpoints(m, &v);
    ps_metrics_gauge(m, "pscoord_uptime_seconds", "Seconds since the coordinator "
                     "started.", (double)(ps_now_ms() - v.start_ms) / 1000.0);
}
