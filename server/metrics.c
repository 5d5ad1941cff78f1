/*
 * metrics.c - psd's /metrics page (shard.h's psd_metrics_collect): every
 * family read at scrape time from what the shard counts anyway (its
 * atomics, its histograms, its table under the read lock), so a scrape
 * costs the serving threads nothing but a short shared lock.
 *
 * Calls:       psd_calls_total{method}, psd_received_bytes_total{method},
 *              psd_pushes_total, psd_pulls_total, psd_gradient_bytes_total,
 *              psd_value_bytes_sent_total, psd_refused_total{reason},
 *              psd_stale_pushes_total, psd_nonfinite_pushes_total
 * Latency:     psd_push_seconds, psd_pull_seconds, psd_commit_seconds,
 *              psd_checkpoint_seconds (histograms)
 * Waiting:     psd_pulls_waiting, psd_sync_pushes_waiting,
 *              psd_sync_steps_waiting, psd_sync_wait_seconds,
 *              psd_durable_pushes_waiting, psd_write_behind_lag_seconds
 * State:       psd_variables, psd_elements, psd_value_bytes,
 *              psd_slot_bytes, psd_resident_memory_bytes,
 *              psd_fixed_overhead_bytes, psd_commits_total,
 *              psd_checkpoint_last_step, psd_checkpoint_last_bytes,
 *              psd_shm_bytes_total, psd_shm_regions, psd_uptime_seconds
 * Sparse:      psd_sparse_* (sparse.c's psd_sparse_metrics): tables, rows,
 *              row, RAM tier, budget, disk and row-log bytes, unsaved
 *              rows, RAM hits and misses, cold reads, rows pulled, pushed,
 *              admitted, not admitted, evicted and refused, commits and
 *              the commit rate
 */
#include "server/shard_internal.h"

#include "server/sparse.h"

#include "common/rpc_code.h"

#include <ctype.h>
#include <stdio.h>

static uint64_t load(atomic_uint_fast64_t *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

static void calls(ps_metrics *m, psd_shard *s, const ps_rpc_server *srv)
{
    ps_metrics_family(m, "psd_calls_total", PS_METRIC_COUNTER,
                      "Calls received, by method of ps.v1.ParameterServer.");
    for (int i = 0; i < SHARD_NMETHODS; i++)
        ps_metrics_sample(m, (double)load(&s->methods[i].calls),
                          "method", s->methods[i].name, NULL);
    ps_metrics_family(m, "psd_received_bytes_total", PS_METRIC_COUNTER,
                      "Request bytes received, by method.");
    for (int i = 0; i < SHARD_NMETHODS; i++)
        ps_metrics_sample(m, (double)load(&s->methods[i].bytes),
                          "method", s->methods[i].name, NULL);
    ps_metrics_counter(m, "psd_pushes_total", "Pushes answered OK.",
                       (double)load(&s->pushes));
    ps_metrics_counter(m, "psd_pulls_total", "Pulls answered with values.",
                       (double)load(&s->pulls));
    ps_metrics_counter(m, "psd_gradient_bytes_total",
                       "Gradient bytes applied by pushes.", (double)load(&s->bytes_in));
    ps_metrics_counter(m, "psd_value_bytes_sent_total", "Value bytes sent by pulls "
                       "and by pushes that return values.", (double)load(&s->bytes_out));
    /* Every code from 1 on, zeros too: a rate over a series that appears
     * only at its first refusal misses that refusal. */
    ps_metrics_family(m, "psd_refused_total", PS_METRIC_COUNTER,
                      "Calls answered with an error, by gRPC status code "
                      "(invalid_argument, not_found, failed_precondition, ...).");
    for (int code = PS_RPC_CANCELLED; code <= PS_RPC_UNAUTHENTICATED; code++) {
        char reason[32];
        snprintf(reason, sizeof reason, "%s", ps_rpc_code_name(code));
        for (char *c = reason; *c != '\0'; c++)
            *c = (char)tolower((unsigned char)*c);
        ps_metrics_sample(m, srv ? (double)ps_rpc_server_failures(srv, code) : 0.0,
                          "reason", reason, NULL);
    }
    ps_metrics_counter(m, "psd_stale_pushes_total", "Sync pushes refused for a "
                       "step already applied.", (double)load(&s->stale));
    ps_metrics_counter(m, "psd_nonfinite_pushes_total", "Pushes refused for a "
                       "gradient holding NaN or Inf, or an update that would "
                       "make a value or slot non-finite.", (double)load(&s->nonfinite));
}

static void latencies(ps_metrics *m, psd_shard *s)
{
    ps_metrics_family(m, "psd_push_seconds", PS_METRIC_HISTOGRAM,
                      "Pushes answered OK: from arrival to answer (a sync push "
                      "waits for its step, a durable one for its commit).");
    ps_metrics_histogram(m, &s->push_seconds, NULL);
    ps_metrics_family(m, "psd_pull_seconds", PS_METRIC_HISTOGRAM,
                      "Pulls answered with values: from arrival to answer "
                      "(with any wait for a version).");
    ps_metrics_histogram(m, &s->pull_seconds, NULL);
    ps_metrics_family(m, "psd_commit_seconds", PS_METRIC_HISTOGRAM,
                      "Write-behind commits of changed variables to LMDB.");
    ps_metrics_histogram(m, &s->commit_seconds, NULL);
    ps_metrics_family(m, "psd_checkpoint_seconds", PS_METRIC_HISTOGRAM,
                      "Checkpoints taken: the flush and the copy.");
    ps_metrics_histogram(m, &s->ckpt_seconds, NULL);
}

/* What waits now: pulls for a version, sync pushes for their step's other
 * workers, durable pushes for their commit. Under wait_mu. */
static void waiting(ps_metrics *m, psd_shard *s)
{
    size_t pulls = 0, sync = 0, durable = 0;
    double now = ps_metrics_now(), oldest = now;
    pthread_mutex_lock(&s->wait_mu);
    for (const pull_waiter *w = s->waiters; w != NULL; w = w->next)
        pulls++;
    for (const pending_push *p = s->pending; p != NULL; p = p->next) {
        sync++;
        if (p->t0 < oldest)
            oldest = p->t0;
    }
    for (const pending_push *p = s->durable; p != NULL; p = p->next)
        durable++;
    pthread_mutex_unlock(&s->wait_mu);

    ps_metrics_gauge(m, "psd_pulls_waiting", "Pulls waiting for a version.",
                     (double)pulls);
    ps_metrics_gauge(m, "psd_sync_pushes_waiting",
                     "Sync pushes waiting for the other workers of their step.",
                     (double)sync);
    ps_metrics_gauge(m, "psd_sync_wait_seconds", "How long the oldest waiting "
                     "sync push has waited (0: none waits).", now - oldest);
    ps_metrics_gauge(m, "psd_durable_pushes_waiting",
                     "Durable pushes waiting for their commit.", (double)durable);
    ps_metrics_gauge(m, "psd_write_behind_lag_seconds", "Age of the oldest update "
                     "not yet committed to LMDB (0: all committed).",
                     (double)shard_write_behind_lag_ms(s) / 1000.0);
}

/* The variables and their memory, under the table's read lock (a sync
 * step's progress under each variable's). */
static void state(ps_metrics *m, psd_shard *s)
{
    uint64_t elements = 0, value_bytes = 0, slot_bytes = 0;
    size_t steps = 0;
    pthread_rwlock_rdlock(&s->table_lock);
    size_t nvars = s->nvars;
    for (size_t i = 0; i < nvars; i++) {
        psd_var *v = s->vars[i];
        elements += v->n;
        value_bytes += v->n * sizeof(float);
        slot_bytes += shard_slot_bytes(v);
        if (v->consistency == PSD_SYNC) {
            pthread_rwlock_rdlock(&v->lock);
            steps += v->accum_count > 0;
            pthread_rwlock_unlock(&v->lock);
        }
    }
    pthread_rwlock_unlock(&s->table_lock);

    ps_metrics_gauge(m, "psd_sync_steps_waiting", "Sync variables whose step holds "
                     "some of its workers' pushes and waits for the rest.",
                     (double)steps);
    ps_metrics_gauge(m, "psd_variables", "Variables held.", (double)nvars);
    ps_metrics_gauge(m, "psd_elements", "Elements of all variables' values.",
                     (double)elements);
    ps_metrics_gauge(m, "psd_value_bytes", "Bytes of all variables' values.",
                     (double)value_bytes);
    ps_metrics_gauge(m, "psd_slot_bytes", "Bytes of the optimizers' slots and sync "
                     "aggregates.", (double)slot_bytes);
    ps_metrics_gauge(m, "psd_resident_memory_bytes", "Resident memory of psd (less "
                     "co-located clients' shared memory), beside psd_value_bytes and "
                     "psd_slot_bytes.", (double)psd_rss_bytes());
    ps_metrics_gauge(m, "psd_fixed_overhead_bytes", "Resident memory of psd before "
                     "any variable was loaded.", (double)s->fixed_overhead);
}

static void storage(ps_metrics *m, psd_shard *s)
{
    ps_metrics_counter(m, "psd_commits_total", "Commits to LMDB.",
                       (double)shard_store_commits(s));
    ps_metrics_gauge(m, "psd_checkpoint_last_step", "Step of the latest complete "
                     "checkpoint (0: none).", (double)load(&s->last_ckpt));
    ps_metrics_gauge(m, "psd_checkpoint_last_bytes", "Size of the last checkpoint "
                     "this psd took (0: none since start).",
                     (double)load(&s->last_ckpt_bytes));
    ps_metrics_counter(m, "psd_shm_bytes_total", "Bytes moved through co-located "
                       "clients' shared memory.", (double)load(&s->shm_bytes));
    ps_metrics_gauge(m, "psd_shm_regions", "Shared-memory regions mapped.",
                     (double)psd_shmmap_count(s->shm));
    ps_metrics_gauge(m, "psd_uptime_seconds", "Seconds since the shard opened.",
                     (double)(ps_now_ms() - s->started_ms) / 1000.0);
}

void psd_metrics_collect(ps_metrics *m, void *ctx)
{
    const psd_metrics_src *src = ctx;
    calls(m, src->shard, src->srv);
    latencies(m, src->shard);
    waiting(m, src->shard);
    state(m, src->shard);
    storage(m, src->shard);
    psd_sparse_metrics(src->shard->sparse, m);
}
