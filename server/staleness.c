/*
 * staleness.c - BOUNDED_STALENESS (stale synchronous parallel, Ho et al.
 * 2013): the workers' clocks as this shard hears them, and the test a pull
 * of a bounded variable must pass before it is answered.
 *
 * A worker's clock is the step it names in its pulls (PullRequest.step:
 * the steps it has pushed so far). A pull at clock k of a variable with
 * `staleness` S is answered once every live worker's clock is at least
 * k - S, so no worker gets more than S steps ahead of the slowest. A
 * worker is live while it has been heard from (a pull, or a pull of its
 * still waiting) within --worker-timeout: a worker that died stops holding
 * the others back after that long.
 *
 * Threads and lifetime: shard_clock_note and shard_clock_ok are called
 * with s->wait_mu held, shard_clock_fail without (it takes it); the table
 * lives in the shard and is freed with it (shard_clocks_free).
 */
#include "server/shard_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

/* Workers one shard keeps clocks for: far past any job (a sync step
 * already caps at 65536 workers); a pull from one more is not bounded. */
#define MAX_CLOCKS 65536

static struct shard_clock *find(psd_shard *s, uint32_t worker)
{
    for (size_t i = 0; i < s->nclocks; i++)
        if (s->clocks[i].worker == worker)
            return &s->clocks[i];
    return NULL;
}

void shard_clock_note(psd_shard *s, uint32_t worker, uint64_t step, int64_t now_ms)
{
    struct shard_clock *c = find(s, worker);
    if (c == NULL) {
        if (s->nclocks == s->cap_clocks) {
            size_t cap = s->cap_clocks ? s->cap_clocks * 2 : 16;
            struct shard_clock *n = cap <= MAX_CLOCKS
                                        ? realloc(s->clocks, cap * sizeof *n) : NULL;
            if (n == NULL)
                return;
            s->clocks = n;
            s->cap_clocks = cap;
        }
        c = &s->clocks[s->nclocks++];
        *c = (struct shard_clock){.worker = worker, .step = step};
    }
    if (step > c->step)
        c->step = step;
    c->seen_ms = now_ms;
}

/* The live worker with the lowest clock, or NULL when none is live. */
static const struct shard_clock *slowest(const psd_shard *s, int64_t now_ms)
{
    const struct shard_clock *min = NULL;
    for (size_t i = 0; i < s->nclocks; i++) {
        const struct shard_clock *c = &s->clocks[i];
        if (now_ms - c->seen_ms > s->o.worker_timeout_ms)
            continue;
        if (min == NULL || c->step < min->step)
            min = c;
    }
    return min;
}

bool shard_clock_ok(const psd_shard *s, uint64_t step, uint32_t staleness,
                    int64_t now_ms)
{
    const struct shard_clock *min = slowest(s, now_ms);
    return min == NULL || step <= min->step + staleness;
}

void shard_clock_fail(psd_shard *s, ps_rpc_call *call, uint32_t worker,
                      uint64_t step, uint32_t staleness, bool server_gave_up)
{
    char slow[160] = "no live worker";
    pthread_mutex_lock(&s->wait_mu);
    int64_t now = ps_now_ms();
    const struct shard_clock *min = slowest(s, now);
    if (min != NULL)
        snprintf(slow, sizeof slow, "worker %" PRIu32 " at step %" PRIu64
                 ", heard from %.1f s ago", min->worker, min->step,
                 (double)(now - min->seen_ms) / 1000.0);
    pthread_mutex_unlock(&s->wait_mu);
    ps_rpc_fail(call, PS_RPC_DEADLINE_EXCEEDED,
                "bounded staleness: worker %" PRIu32 " at step %" PRIu64
                " may be at most %" PRIu32 " steps ahead of the slowest live "
                "worker, %s; %s (a worker silent for --worker-timeout %lld ms "
                "stops counting)", worker, step, staleness, slow,
                server_gave_up ? "psd gave up after --max-pull-wait"
                               : "the deadline passed",
                (long long)s->o.worker_timeout_ms);
}

void shard_clocks_free(psd_shard *s)
{
    free(s->clocks);
    s->clocks = NULL;
    s->nclocks = s->cap_clocks = 0;
}
