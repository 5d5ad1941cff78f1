/*
 * pull.c - Pull: the values of variables, answered at once or once each
 * reaches the version asked for; the waiters and the sweeper thread that
 * answers them (and expires the sync pushes that wait too long). Replies
 * send a big value in place from its refcounted buffer, or write it into a
 * co-located client's shared memory. The lock order is in shard_internal.h.
 */
#include "server/shard_internal.h"
#include "common/clock.h"

#include "common/log.h"
#include "common/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SWEEP_MS 20
/* Shared memory unused this long is unmapped (shmmap.h); checked every
 * SHM_SWEEP_MS. */
#define SHM_IDLE_MS 60000
#define SHM_SWEEP_MS 5000

/* ---- answering pulls -------------------------------------------------- */

/* Resolves the references of into[0..n) (NULL: none) that are set, into
 * dst; fails call and returns false when one does not resolve or does not
 * fit its variable. Called between psd_shmmap_enter and _leave. */
static bool resolve_into(psd_shard *s, ps_rpc_call *call, psd_var **vars,
                         const psd_shm_ref *into, size_t n, void **dst)
{
    ps_rpc_peer_cred who;
    bool local = ps_rpc_call_peer_cred(call, &who) == 0;
    for (size_t i = 0; i < n; i++) {
        dst[i] = NULL;
        if (into == NULL || !into[i].set)
            continue;
        char err[400];
        int code = psd_shmmap_get(s->shm, local ? &who : NULL, &into[i], &dst[i], err,
                                  sizeof err);
        if (code == 0 && into[i].length != vars[i]->n * sizeof(float)) {
            snprintf(err, sizeof err, "variable '%s': shared memory for its value "
                     "has %llu bytes, the value %zu", vars[i]->name,
                     (unsigned long long)into[i].length, vars[i]->n * sizeof(float));
            code = PS_RPC_INVALID_ARGUMENT;
        }
        if (code != 0) {
            if (code == PS_RPC_INVALID_ARGUMENT)
                atomic_fetch_add(&s->bad, 1);
            ps_rpc_fail(call, code, "%s", err);
            return false;
        }
    }
    return true;
}

/* Whether every set reference of into resolves and fits (resolve_into),
 * before a call changes or waits for anything; fails call if not. */
bool shard_into_ok(psd_shard *s, ps_rpc_call *call, psd_var **vars,
                    const psd_shm_ref *into, size_t n)
{
    void **dst = calloc(n ? n : 1, sizeof *dst);
    if (dst == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    psd_shmmap_enter(s->shm);
    bool ok = resolve_into(s, call, vars, into, n, dst);
    psd_shmmap_leave(s->shm);
    free(dst);
    return ok;
}

/* Answers with prefix (copied) followed by the values of vars as repeated
 * field `field` of the response: the headers copied, big values in place
 * (the reply holds a reference to each, and an update meanwhile writes a
 * copy), small ones copied. With ranges, the pieces of the values they
 * say: a Pull's (field 1) in place too, a Push's copied, since the push's
 * next piece, arriving while this reply may still be sending, would have
 * to copy the whole value. Takes each variable's read lock until the reply
 * is built. Returns the value bytes sent. */
uint64_t shard_reply_with_values(psd_shard *s, ps_rpc_call *call,
                                 const uint8_t *prefix, size_t prefix_len,
                                 int field, psd_var **vars, size_t n,
                                 const psd_shm_ref *into, const psd_range *ranges,
                                 int wire_dtype)
{
    bool half = shard_is_half(wire_dtype), oom = false;
    uint8_t *hdr = malloc((n ? n : 1) * PS_WIRE_VALUE_HDR_MAX);
    ps_rpc_part *parts = calloc(2 * n + 1, sizeof *parts);
    /* With shared memory: each value's destination, and whether its lock
     * was let go early (one allocation; none for an inline reply). */
    void **dst = NULL;
    bool *unlocked = NULL;
    if (into != NULL && (dst = calloc(n ? n : 1, sizeof *dst + sizeof *unlocked)) != NULL)
        unlocked = (bool *)(void *)(dst + n);
    if (hdr == NULL || parts == NULL || (into != NULL && dst == NULL)) {
        free(hdr);
        free(parts);
        free(dst);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "out of memory building "
                    "the response");
        return 0;
    }
    if (into != NULL) {
        psd_shmmap_enter(s->shm);
        if (!resolve_into(s, call, vars, into, n, dst)) {
            psd_shmmap_leave(s->shm);
            free(hdr);
            free(parts);
            free(dst);
            return 0;
        }
    }
    uint64_t bytes = 0;
    int np = 0;
    if (prefix_len > 0)
        parts[np++] = (ps_rpc_part){prefix, prefix_len, NULL, NULL};
    for (size_t i = 0; i < n; i++) {
        psd_var *v = vars[i];
        pthread_rwlock_rdlock(&v->lock);
        uint8_t *h = hdr + i * PS_WIRE_VALUE_HDR_MAX;
        const psd_shm_ref *to = dst != NULL && dst[i] != NULL ? &into[i] : NULL;
        psd_range r = ranges != NULL ? ranges[i] : (psd_range){0, 0};
        size_t nbytes = (r.n ? r.n : v->n) * (half && to == NULL ? 2 : sizeof(float));
        uint8_t *end = ps_wire_value_header_dtype(
            h, field, v->name, v->version, v->shape, v->ndim, nbytes, to,
            half && to == NULL ? wire_dtype : PS__V1__DTYPE__DTYPE_FLOAT32);
        parts[np++] = (ps_rpc_part){h, (size_t)(end - h), NULL, NULL};
        if (half && to == NULL) {
            /* Narrowed under the lock into a buffer of its own (wirehalf.c). */
            if (!shard_half_value(s, v, r, wire_dtype, &parts[np])) {
                parts[np] = (ps_rpc_part){NULL, 0, NULL, NULL};
                oom = true;
            }
            np++;
        } else if (to != NULL && v->vmsg != NULL) {
            /* The one copy, straight to the client, from the value held by
             * a reference and not the lock: an update meanwhile writes a
             * copy (value_writable), so a big copy does not stall pushes. */
            ps_rpc_msg *m = v->vmsg;
            const float *src = v->value;
            ps_rpc_msg_ref(m);
            pthread_rwlock_unlock(&v->lock);
            unlocked[i] = true;
            memcpy(dst[i], src, nbytes);
            ps_rpc_msg_unref(m);
            atomic_fetch_add(&s->shm_bytes, nbytes);
        } else if (to != NULL) {
            memcpy(dst[i], v->value, nbytes); /* small: under the lock */
            atomic_fetch_add(&s->shm_bytes, nbytes);
        } else if (v->vmsg != NULL && (r.n == 0 || field == 1)) {
            ps_rpc_msg_ref(v->vmsg);
            parts[np++] = (ps_rpc_part){v->value + r.off, nbytes, ps_rpc_msg_release,
                                        v->vmsg};
        } else {
            parts[np++] = (ps_rpc_part){v->value + r.off, nbytes, NULL, NULL};
        }
        bytes += nbytes;
    }
    if (!oom) {
        ps_rpc_reply_parts(call, parts, np);
    } else {
        for (int k = 0; k < np; k++)
            if (parts[k].release != NULL)
                parts[k].release(parts[k].arg);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "out of memory building "
                    "the response");
        bytes = 0;
    }
    for (size_t i = 0; i < n; i++)
        if (unlocked == NULL || !unlocked[i])
            pthread_rwlock_unlock(&vars[i]->lock);
    if (into != NULL)
        psd_shmmap_leave(s->shm);
    free(hdr);
    free(parts);
    free(dst);
    return bytes;
}

/* Answers a Pull that arrived at t0 (ps_metrics_now) with the values of
 * vars. */
static void reply_values(psd_shard *s, ps_rpc_call *call, psd_var **vars,
                         size_t n, const psd_shm_ref *into, const psd_range *ranges,
                         int wire_dtype, double t0)
{
    uint64_t bytes = shard_reply_with_values(s, call, NULL, 0, 1, vars, n, into,
                                             ranges, wire_dtype);
    atomic_fetch_add(&s->pulls, 1);
    atomic_fetch_add(&s->bytes_out, bytes);
    ps_histogram_observe(&s->pull_seconds, ps_metrics_now() - t0);
}

void shard_waiter_free(pull_waiter *w)
{
    free(w->vars);
    free(w->min_versions);
    free(w->into);
    free(w->ranges);
    free(w);
}

/* Returns the first item below its min_version, or n if none. Reads the
 * versions without the variables' locks: the sweeper calls it holding
 * wait_mu, which pushes take while holding a variable's lock, so taking the
 * lock here could deadlock. Versions only rise, and are written atomically. */
static size_t first_unmet(psd_var **vars, const uint64_t *minv, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (__atomic_load_n(&vars[i]->version, __ATOMIC_ACQUIRE) < minv[i])
            return i;
    return n;
}

static void fail_unmet(ps_rpc_call *call, psd_var *v, uint64_t minv)
{
    pthread_rwlock_rdlock(&v->lock);
    uint64_t ver = v->version;
    pthread_rwlock_unlock(&v->lock);
    ps_rpc_fail(call, PS_RPC_DEADLINE_EXCEEDED,
                "variable '%s' is at version %llu; the deadline passed waiting "
                "for version %llu", v->name, (unsigned long long)ver,
                (unsigned long long)minv);
}

void shard_wake_waiters(psd_shard *s)
{
    pthread_mutex_lock(&s->wait_mu);
    if (s->waiters != NULL)
        pthread_cond_signal(&s->wait_cond);
    pthread_mutex_unlock(&s->wait_mu);
}

/* Whether w may be answered: its versions reached, and its worker within
 * the staleness bound. A pull that still waits keeps its worker live.
 * Called with wait_mu held. */
static bool waiter_ready(psd_shard *s, pull_waiter *w, int64_t now)
{
    if (first_unmet(w->vars, w->min_versions, w->nitems) != w->nitems)
        return false;
    if (!w->bounded)
        return true;
    shard_clock_note(s, w->worker, w->step, now);
    return shard_clock_ok(s, w->step, w->staleness, now);
}

/* What one round of the sweeper takes off the lists: pulls to answer,
 * pulls to fail, sync pushes to fail. */
struct sweep {
    pull_waiter *ready, *expired;
    pending_push *gone;
    bool stopping;
};

/* Moves the waits that are due off the lists into sw: pulls whose versions
 * arrived, and pulls whose client went away or whose --max-pull-wait ran
 * out. Called with wait_mu held. */
static void sweep_take(psd_shard *s, struct sweep *sw)
{
    *sw = (struct sweep){NULL, NULL, NULL, false};
    int64_t now = ps_now_ms();
    for (pull_waiter **pw = &s->waiters; *pw != NULL;) {
        pull_waiter *w = *pw;
        if (waiter_ready(s, w, now)) {
            *pw = w->next;
            s->nwaiters--;
            w->next = sw->ready;
            sw->ready = w;
        } else if (ps_rpc_call_cancelled(w->call) || s->stopping ||
                   shard_pull_timed_out(w, now)) {
            *pw = w->next;
            s->nwaiters--;
            w->next = sw->expired;
            sw->expired = w;
        } else {
            pw = &w->next;
        }
    }
    for (pending_push **pp = &s->pending; *pp != NULL;) {
        pending_push *p = *pp;
        if (p->armed && (ps_rpc_call_cancelled(p->call) || s->stopping)) {
            *pp = p->next;
            p->next = sw->gone;
            sw->gone = p;
        } else {
            pp = &p->next;
        }
    }
    sw->stopping = s->stopping;
}

/* Answers the pulls sw took. Called with table_lock held for reading. */
static void sweep_answer_pulls(psd_shard *s, struct sweep *sw)
{
    while (sw->ready != NULL) {
        pull_waiter *w = sw->ready;
        sw->ready = w->next;
        reply_values(s, w->call, w->vars, w->nitems, w->into, w->ranges,
                             w->wire_dtype, w->t0);
        shard_waiter_free(w);
    }
    while (sw->expired != NULL) {
        pull_waiter *w = sw->expired;
        sw->expired = w->next;
        if (sw->stopping) {
            ps_rpc_fail(w->call, PS_RPC_UNAVAILABLE, "psd is shutting down");
        } else {
            size_t i = first_unmet(w->vars, w->min_versions, w->nitems);
            bool client = ps_rpc_call_cancelled(w->call);
            if (i == w->nitems && w->bounded)
                shard_clock_fail(s, w->call, w->worker, w->step, w->staleness,
                                 !client);
            else if (i < w->nitems && !client)
                shard_pull_expired(s, w, w->vars[i], w->min_versions[i]);
            else if (i < w->nitems)
                fail_unmet(w->call, w->vars[i], w->min_versions[i]);
            else
                reply_values(s, w->call, w->vars, w->nitems, w->into, w->ranges,
                             w->wire_dtype, w->t0);
        }
        shard_waiter_free(w);
    }
}

/* Fails the sync pushes sw took. */
static void sweep_fail_pushes(struct sweep *sw)
{
    while (sw->gone != NULL) {
        pending_push *p = sw->gone;
        sw->gone = p->next;
        if (sw->stopping)
            ps_rpc_fail(p->call, PS_RPC_UNAVAILABLE, "psd is shutting down");
        else
            ps_rpc_fail(p->call, PS_RPC_DEADLINE_EXCEEDED,
                        "step %llu: the deadline passed waiting for the other "
                        "workers' pushes (the gradient was kept; push the "
                        "same step again to wait again)",
                        (unsigned long long)p->step);
        /* Off every list: nothing else can reach it. */
        shard_pending_free(p);
    }
}

/* The sweeper answers pulls whose versions arrived and fails waits whose
 * deadline passed or whose client went away. The table read lock, taken
 * before the waits are (the lock order) and held until they are answered,
 * keeps their variables alive: DeleteVariable and Restore free variables
 * only with it held for writing, after taking their waits off the lists. */
void *shard_sweeper_main(void *arg)
{
    psd_shard *s = arg;
    pthread_setname_np(pthread_self(), "psd-sweep");
    int64_t last_shm_sweep = ps_now_ms();
    pthread_mutex_lock(&s->wait_mu);
    while (!s->closing) {
        struct timespec until = ps_time_after_ms(CLOCK_REALTIME, SWEEP_MS);
        pthread_cond_timedwait(&s->wait_cond, &s->wait_mu, &until);
        if (s->closing)
            break;
        pthread_mutex_unlock(&s->wait_mu);

        struct sweep sw;
        pthread_rwlock_rdlock(&s->table_lock);
        pthread_mutex_lock(&s->wait_mu);
        sweep_take(s, &sw);
        pthread_mutex_unlock(&s->wait_mu);
        sweep_answer_pulls(s, &sw);
        pthread_rwlock_unlock(&s->table_lock);
        if (ps_now_ms() - last_shm_sweep >= SHM_SWEEP_MS) {
            psd_shmmap_sweep(s->shm, SHM_IDLE_MS);
            last_shm_sweep = ps_now_ms();
        }
        sweep_fail_pushes(&sw);
        pthread_mutex_lock(&s->wait_mu);
    }
    pthread_mutex_unlock(&s->wait_mu);
    return NULL;
}

/* ---- Pull ------------------------------------------------------------- */

/* One Pull's items, resolved: the variables, the versions they must reach,
 * and where their values go (NULL: in the reply). */
struct pull_items {
    size_t n;
    psd_var **vars;
    uint64_t *minv;
    psd_shm_ref *into;
    psd_range *ranges; /* NULL: no item asks a piece */
};

static void pull_items_free(struct pull_items *it)
{
    free(it->vars);
    free(it->minv);
    free(it->into);
    free(it->ranges);
}

/* Allocates it for r's items and copies their shared-memory references.
 * Returns false with call failed. */
static bool pull_items_init(ps_rpc_call *call, const Ps__V1__PullRequest *r,
                            struct pull_items *it)
{
    size_t n = r->n_items;
    bool any_into = false, any_piece = false;
    for (size_t i = 0; i < n; i++) {
        any_into = any_into || r->items[i]->into != NULL;
        any_piece = any_piece || r->items[i]->count != 0;
    }
    *it = (struct pull_items){n, calloc(n, sizeof *it->vars),
                              calloc(n, sizeof *it->minv),
                              any_into ? calloc(n, sizeof *it->into) : NULL,
                              any_piece ? calloc(n, sizeof *it->ranges) : NULL};
    if (it->vars == NULL || it->minv == NULL || (any_into && it->into == NULL) ||
        (any_piece && it->ranges == NULL)) {
        pull_items_free(it);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Pull: out of memory");
        return false;
    }
    for (size_t i = 0; it->into != NULL && i < n; i++) {
        const Ps__V1__ShmRef *ref = r->items[i]->into;
        if (ref == NULL)
            continue;
        it->into[i].set = 1;
        it->into[i].name_len = strlen(ref->name);
        snprintf(it->into[i].name, sizeof it->into[i].name, "%s", ref->name);
        it->into[i].offset = ref->offset;
        it->into[i].length = ref->length;
    }
    return true;
}

/* The staleness bound of a pull: the least staleness of the bounded
 * variables it names; false when it names none, or carries no clock. */
static bool pull_bound(const Ps__V1__PullRequest *r, const struct pull_items *it,
                       uint32_t *staleness)
{
    bool any = false;
    if (r->step == 0)
        return false;
    for (size_t i = 0; i < it->n; i++) {
        const psd_var *v = it->vars[i];
        if (v->consistency != PSD_BOUNDED)
            continue;
        if (!any || v->staleness < *staleness)
            *staleness = v->staleness;
        any = true;
    }
    return any;
}

/* Notes the pulling worker's clock and tells whether the bound lets the
 * pull be answered now (true also for an unbounded pull). */
static bool pull_clock(psd_shard *s, const Ps__V1__PullRequest *r, bool bounded,
                       uint32_t staleness)
{
    if (!bounded)
        return true;
    pthread_mutex_lock(&s->wait_mu);
    int64_t now = ps_now_ms();
    shard_clock_note(s, r->worker, r->step, now);
    bool ok = shard_clock_ok(s, r->step, staleness, now);
    pthread_mutex_unlock(&s->wait_mu);
    return ok;
}

/* Checks item i's piece (PullItem.count set) against its variable and
 * keeps it in it->ranges. Returns false with call failed. */
static bool pull_piece(psd_shard *s, ps_rpc_call *call, const Ps__V1__PullItem *item,
                       struct pull_items *it, size_t i)
{
    const psd_var *v = it->vars[i];
    if (item->total != v->n) {
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_FAILED_PRECONDITION, "variable '%s' has %zu "
                    "elements on the server, the model expects %llu", v->name, v->n,
                    (unsigned long long)item->total);
        return false;
    }
    if (item->into != NULL || item->offset >= v->n || item->count > v->n - item->offset) {
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Pull: variable '%s': %s", v->name,
                    item->into != NULL ? "a piece of the value (count set) cannot "
                                         "go into shared memory"
                                       : "the piece asked lies beyond its elements");
        return false;
    }
    it->ranges[i] = (psd_range){(size_t)item->offset, (size_t)item->count};
    return true;
}

/* Finds the variables r names, each once. Returns false with call failed.
 * Called with table_lock held for reading. */
static bool pull_lookup(psd_shard *s, ps_rpc_call *call, const Ps__V1__PullRequest *r,
                        struct pull_items *it)
{
    for (size_t i = 0; i < it->n; i++) {
        const char *name = r->items[i]->name;
        it->vars[i] = shard_find_var(s, name, strlen(name), NULL);
        it->minv[i] = r->items[i]->min_version;
        if (it->vars[i] == NULL) {
            shard_count_bad(s);
            const char *np = shard_name_problem(name, strlen(name));
            if (np != NULL)
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                            "Pull: items[%zu]: variable name %s", i, np);
            else
                ps_rpc_fail(call, PS_RPC_NOT_FOUND,
                            "Pull: variable '%s' does not exist", name);
            return false;
        }
        if (it->vars[i]->sparse != NULL) {
            shard_count_bad(s);
            ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Pull: variable '%s' is a "
                        "sparse table; pull its rows with SparsePull", name);
            return false;
        }
        if (r->items[i]->count != 0 && !pull_piece(s, call, r->items[i], it, i))
            return false;
        for (size_t j = 0; j < i; j++) {
            if (it->vars[j] == it->vars[i]) {
                shard_count_bad(s);
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                            "Pull: variable '%s' is named twice", name);
                return false;
            }
        }
    }
    return true;
}

/* Lists the pull as a waiter, taking over its arrays, unless
 * --max-waiting-pulls wait already (limits.c). Called with table_lock held
 * for reading. */
static void pull_wait(psd_shard *s, ps_rpc_call *call, struct pull_items *it,
                      double t0, const Ps__V1__PullRequest *r, bool bounded,
                      uint32_t staleness)
{
    pull_waiter *w = calloc(1, sizeof *w);
    if (w == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Pull: out of memory");
        return;
    }
    *w = (pull_waiter){
        .call = call,
        .t0 = t0,
        .nitems = it->n,
        .vars = it->vars,
        .min_versions = it->minv,
        .into = it->into,
        .ranges = it->ranges,
        .wire_dtype = (int)r->items[0]->wire_dtype,
        .bounded = bounded,
        .worker = r->worker,
        .step = r->step,
        .staleness = staleness,
    };
    *it = (struct pull_items){0};
    pthread_mutex_lock(&s->wait_mu);
    int why = shard_pull_admit(s, w);
    if (why != 0) {
        pthread_mutex_unlock(&s->wait_mu);
        shard_pull_refuse(s, call, why);
        shard_waiter_free(w);
        return;
    }
    w->next = s->waiters;
    s->waiters = w;
    /* A version may have arrived between the check and the listing. */
    pthread_cond_signal(&s->wait_cond);
    pthread_mutex_unlock(&s->wait_mu);
}

void shard_pull(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    psd_shard *s = ctx;
    double t0 = ps_metrics_now();
    Ps__V1__PullRequest *r = shard_unpack(s, call, "Pull", &ps__v1__pull_request__descriptor,
                                          req, len);
    if (r == NULL)
        return;
    struct pull_items it;
    if (r->n_items == 0) {
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Pull: no items; name at "
                    "least one variable");
        goto out;
    }
    int wire = 0;
    if (!shard_half_wire_ok(s, call, r, &wire) || !pull_items_init(call, r, &it))
        goto out;
    pthread_rwlock_rdlock(&s->table_lock);
    if (pull_lookup(s, call, r, &it)) {
        uint32_t staleness = 0;
        bool bounded = pull_bound(r, &it, &staleness);
        bool clock_ok = pull_clock(s, r, bounded, staleness);
        size_t n = it.n, unmet = first_unmet(it.vars, it.minv, n);
        if (unmet == n && clock_ok)
            reply_values(s, call, it.vars, n, it.into, it.ranges, wire, t0);
        else if (s->stopping)
            ps_rpc_fail(call, PS_RPC_UNAVAILABLE, "psd is shutting down");
        else if (ps_rpc_call_cancelled(call) && unmet == n)
            shard_clock_fail(s, call, r->worker, r->step, staleness, false);
        else if (ps_rpc_call_cancelled(call))
            fail_unmet(call, it.vars[unmet], it.minv[unmet]);
        /* (Shared memory that will not do fails the call now, not after
         * the wait; an answer at once checks it as it writes.) */
        else if (it.into == NULL || shard_into_ok(s, call, it.vars, it.into, n))
            pull_wait(s, call, &it, t0, r, bounded, staleness);
    }
    pthread_rwlock_unlock(&s->table_lock);
    pull_items_free(&it);
out:
    ps__v1__pull_request__free_unpacked(r, NULL);
}
