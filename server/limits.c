/*
 * limits.c - the caps on what one shard holds and keeps waiting, set by
 * psd's --max-variables, --max-bytes, --max-waiting-pulls and
 * --max-pull-wait (psd_shard_opts; 0 is no cap). A call over a cap is
 * refused with RESOURCE_EXHAUSTED naming the limit and its value, before
 * anything is allocated, listed or stored.
 *
 * The bytes a variable holds are its value, its optimizer's slots and, for
 * a SYNC variable, its step's aggregate (allocated at the first push): what
 * it costs in memory for as long as it lives. A sparse table's rows, each
 * with its slots, count too, as they are stored (psd_sparse_row_bytes):
 * a push whose new rows would pass the cap is refused whole by the tier,
 * as is one past --max-rows-per-table. A CreateVariable reserves its
 * bytes and one variable before it allocates anything, so that concurrent
 * creates cannot together pass a cap; the reservation is settled, as held
 * or let go, under table_lock held for writing, where the variable enters
 * the table (or does not), so that a Restore's recount never meets a
 * variable half counted. The lock order is in shard_internal.h.
 */
#include "server/shard_internal.h"

#include "server/sparse.h"

#include "common/clock.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>

/* "512 B", "784.0 KiB", "16.0 GiB": bytes as an operator sets them. */
static const char *human_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (n < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", n);
        return buf;
    }
    double v = (double)n;
    int u = 0;
    while (v >= 1023.95 && u < 5) { /* not "1024.0 MiB" */
        v /= 1024;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, unit[u]);
    return buf;
}

/* "250 ms", "60 s", "1.5 s". */
static const char *human_ms(int64_t ms, char *buf, size_t len)
{
    if (ms < 1000)
        snprintf(buf, len, "%" PRId64 " ms", ms);
    else if (ms % 1000 == 0)
        snprintf(buf, len, "%" PRId64 " s", ms / 1000);
    else
        snprintf(buf, len, "%.3g s", (double)ms / 1000.0);
    return buf;
}

/* ---- variables and bytes held ----------------------------------------- */

uint64_t shard_var_bytes(const psd_var *v)
{
    uint64_t arrays = 1 + (uint64_t)v->nslots + (v->consistency == PSD_SYNC);
    return (uint64_t)v->n * sizeof(float) * arrays;
}

/* The bytes of v's optimizer slots and of its sync step's aggregate when
 * it has one now: what Stats, ListVariables and /metrics call slot bytes,
 * the same sum in all three. Takes v->lock. */
uint64_t shard_slot_bytes(psd_var *v)
{
    pthread_rwlock_rdlock(&v->lock);
    uint64_t b = (uint64_t)v->n * (size_t)v->nslots * sizeof(float) +
                 (v->accum ? v->n * sizeof(float) : 0);
    pthread_rwlock_unlock(&v->lock);
    return b;
}

/* As shard_var_bytes, for a variable of a normalized spec with n elements
 * that is not built yet. */
uint64_t shard_spec_bytes(const Ps__V1__VariableSpec *sp, size_t n)
{
    psd_opt o = {.kind = sp->optimizer != NULL
                             ? (enum psd_opt_kind)sp->optimizer->kind : PSD_OPT_SGD};
    uint64_t arrays = 1 + (uint64_t)psd_opt_slot_count(&o) +
                      (sp->consistency == PS__V1__CONSISTENCY__SYNC);
    return (uint64_t)n * sizeof(float) * arrays;
}

/* Reserves room for variable `name` of `bytes` against --max-variables and
 * --max-bytes, counting what other creates have reserved. Returns true, or
 * false with call failed RESOURCE_EXHAUSTED naming the limit. Every true
 * return is followed by one shard_caps_settle with the same bytes. */
bool shard_caps_reserve(psd_shard *s, ps_rpc_call *call, const char *name,
                        uint64_t bytes)
{
    size_t maxv = s->o.max_variables;
    uint64_t maxb = s->o.max_bytes;
    pthread_mutex_lock(&s->caps_mu);
    size_t vars = s->held_vars + s->reserved_vars;
    uint64_t held = s->held_bytes + s->reserved_bytes + psd_sparse_row_bytes(s->sparse);
    bool over_vars = maxv != 0 && vars >= maxv;
    bool over_bytes = maxb != 0 && (bytes > maxb || held > maxb - bytes);
    if (!over_vars && !over_bytes) {
        s->reserved_vars++;
        s->reserved_bytes += bytes;
    }
    pthread_mutex_unlock(&s->caps_mu);
    char a[32], b[32], c[32];
    if (over_vars)
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED,
                    "CreateVariable '%s': psd holds %zu variables, the most "
                    "--max-variables %zu allows; delete one (psctl delete) or "
                    "raise the limit", name, vars, maxv);
    else if (over_bytes)
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED,
                    "CreateVariable '%s': %s more would hold %s, over "
                    "--max-bytes %s", name, human_bytes(bytes, a, sizeof a),
                    human_bytes(held + bytes, b, sizeof b),
                    human_bytes(maxb, c, sizeof c));
    return !over_vars && !over_bytes;
}

/* The bytes --max-bytes leaves for sparse tables' rows: the cap less
 * what the variables hold and creates have reserved (the rows themselves
 * are counted by the tier); UINT64_MAX without a cap. */
uint64_t shard_caps_room(psd_shard *s)
{
    uint64_t maxb = s->o.max_bytes;
    if (maxb == 0)
        return UINT64_MAX;
    pthread_mutex_lock(&s->caps_mu);
    uint64_t held = s->held_bytes + s->reserved_bytes;
    pthread_mutex_unlock(&s->caps_mu);
    return held < maxb ? maxb - held : 0;
}

/* Ends a reservation of shard_caps_reserve: held, the variable is in the
 * table now; else it is let go. Called with table_lock held for writing
 * when held. */
void shard_caps_settle(psd_shard *s, uint64_t bytes, bool held)
{
    pthread_mutex_lock(&s->caps_mu);
    s->reserved_vars--;
    s->reserved_bytes -= bytes;
    if (held) {
        s->held_vars++;
        s->held_bytes += bytes;
    }
    pthread_mutex_unlock(&s->caps_mu);
}

/* A variable of `bytes` left the table (DeleteVariable). Called with
 * table_lock held for writing. */
void shard_caps_release(psd_shard *s, uint64_t bytes)
{
    pthread_mutex_lock(&s->caps_mu);
    s->held_vars--;
    s->held_bytes -= bytes;
    pthread_mutex_unlock(&s->caps_mu);
}

/* Counts what the table holds, after it was loaded (open) or replaced
 * (Restore). Called with table_lock held for writing, or before any thread
 * starts. A store over the caps (they were lowered since) still loads: it
 * is logged, and new variables are refused until enough are deleted. */
void shard_caps_recount(psd_shard *s)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < s->nvars; i++)
        bytes += shard_var_bytes(s->vars[i]);
    pthread_mutex_lock(&s->caps_mu);
    s->held_vars = s->nvars;
    s->held_bytes = bytes;
    pthread_mutex_unlock(&s->caps_mu);
    char a[32], b[32];
    if (s->o.max_variables != 0 && s->nvars > s->o.max_variables)
        ps_log_warn("psd holds %zu variables, over --max-variables %zu: new "
                    "variables are refused until some are deleted", s->nvars,
                    s->o.max_variables);
    if (s->o.max_bytes != 0 && bytes > s->o.max_bytes)
        ps_log_warn("psd's variables hold %s, over --max-bytes %s: new "
                    "variables are refused until some are deleted",
                    human_bytes(bytes, a, sizeof a),
                    human_bytes(s->o.max_bytes, b, sizeof b));
}

/* ---- waiting pulls ---------------------------------------------------- */

/* Counts w as one more waiting pull and sets when --max-pull-wait gives up
 * on it, unless --max-waiting-pulls wait already. Called with wait_mu held;
 * returns whether it was admitted (if not, the caller lets wait_mu go and
 * fails the call with shard_pull_refuse). */
bool shard_pull_admit(psd_shard *s, pull_waiter *w)
{
    if (s->o.max_waiting_pulls != 0 && s->nwaiters >= s->o.max_waiting_pulls)
        return false;
    s->nwaiters++;
    w->give_up_ms = s->o.max_pull_wait_ms > 0 ? ps_now_ms() + s->o.max_pull_wait_ms
                                              : INT64_MAX;
    return true;
}

void shard_pull_refuse(psd_shard *s, ps_rpc_call *call)
{
    ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED,
                "Pull: %zu pulls wait for versions already, the most "
                "--max-waiting-pulls %zu allows; pull again later, or without "
                "min_version", s->o.max_waiting_pulls, s->o.max_waiting_pulls);
}

/* Whether --max-pull-wait has run out for w, a pull its client still waits
 * for. */
bool shard_pull_timed_out(const pull_waiter *w, int64_t now_ms)
{
    return now_ms >= w->give_up_ms;
}

/* Answers a pull that waited --max-pull-wait for variable v to reach minv:
 * DEADLINE_EXCEEDED, though its client set a longer deadline or none. */
void shard_pull_expired(psd_shard *s, pull_waiter *w, psd_var *v, uint64_t minv)
{
    pthread_rwlock_rdlock(&v->lock);
    uint64_t ver = v->version;
    pthread_rwlock_unlock(&v->lock);
    char d[32];
    ps_rpc_fail(w->call, PS_RPC_DEADLINE_EXCEEDED,
                "variable '%s' is at version %" PRIu64 "; psd gives up on a "
                "pull after --max-pull-wait %s waiting for version %" PRIu64
                "; pull again", v->name, ver,
                human_ms(s->o.max_pull_wait_ms, d, sizeof d), minv);
}
