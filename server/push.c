/*
 * push.c - Push: gradients applied by each variable's optimizer straight
 * from the request's bytes (or a co-located client's shared memory), in
 * named steps: decode and check everything, apply the async parts, join
 * the sync parts to their step's aggregate, answer (at once, when the step
 * completes, or once committed with --durable). SetSyncWorkers, which
 * changes how many pushes a sync step waits for, is here too. The lock
 * order is in shard_internal.h.
 */
#include "server/shard_internal.h"

#include "common/buf.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "server/shmmap.h"
#include "common/wire.h"
#include "common/tensor.h"
#include "common/thread.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- pushes that wait ------------------------------------------------- */

void shard_pending_free(pending_push *p)
{
    PS_FREE_ALL(p->vars, p->versions, p->into, p->ranges, p->settled, p->refused,
                p->parts, p->reply_mem, p);
}

/* Answers a push with its versions, and with the values when it asked.
 * The caller keeps the variables alive: it holds table_lock, or flush_mu
 * (Restore takes both before it frees any). */
static void reply_push(psd_shard *s, pending_push *p)
{
    if (p->refused != NULL) {
        shard_count_bad(s);
        ps_rpc_fail(p->call, PS_RPC_INVALID_ARGUMENT, "%s", p->refused);
        return;
    }
    if (p->parts != NULL) { /* a SparsePush's, encoded already */
        ps_rpc_reply_parts(p->call, p->parts, p->nparts);
        return;
    }
    if (!p->return_values) {
        Ps__V1__PushResponse resp = PS__V1__PUSH_RESPONSE__INIT;
        resp.n_versions = p->nitems;
        resp.versions = p->versions;
        ps_rpc_reply_pb(p->call, &resp);
    } else {
        /* PushResponse.versions, packed, then .values. */
        uint8_t *pre = malloc(ps_wire_versions_len(p->versions, p->nitems)), *q;
        if (pre == NULL) {
            ps_rpc_fail(p->call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
        } else {
            q = ps_wire_versions_put(pre, p->versions, p->nitems);
            uint64_t bytes = shard_reply_with_values(s, p->call, pre, (size_t)(q - pre),
                                                     2, p->vars, p->nitems, p->into,
                                                     p->ranges, p->wire_dtype);
            atomic_fetch_add(&s->bytes_out, bytes);
            free(pre);
        }
    }
    atomic_fetch_add(&s->pushes, 1);
    ps_histogram_observe(&s->push_seconds, ps_metrics_now() - p->t0);
}

/* Answers the durable pushes whose updates are all committed. */
void shard_answer_durable(psd_shard *s, uint64_t upto)
{
    pthread_mutex_lock(&s->wait_mu);
    pending_push *done = NULL;
    for (pending_push **pp = &s->durable; *pp != NULL;) {
        pending_push *p = *pp;
        if (p->seq <= upto) {
            *pp = p->next;
            p->next = done;
            done = p;
        } else {
            pp = &p->next;
        }
    }
    pthread_mutex_unlock(&s->wait_mu);
    while (done != NULL) {
        pending_push *p = done;
        done = p->next;
        reply_push(s, p);
        shard_pending_free(p);
    }
}

/* A push whose every part is applied: answer now, or after its commit. */
void shard_push_complete(psd_shard *s, pending_push *p)
{
    if (s->o.durable) {
        /* A commit may have taken this push's update already (a sync step
         * applied by another thread, committed before the push got here):
         * the flusher answers only what is listed when it commits, and
         * with nothing new applied it would not commit again. */
        pthread_mutex_lock(&s->wait_mu);
        p->seq = atomic_load(&s->apply_seq);
        bool committed = atomic_load(&s->committed_seq) >= p->seq;
        if (!committed) {
            p->next = s->durable;
            s->durable = p;
        }
        pthread_mutex_unlock(&s->wait_mu);
        if (!committed) {
            shard_request_flush(s);
            return;
        }
    }
    reply_push(s, p);
    shard_pending_free(p);
}

/* Completes every push of the list ready (maybe_apply_step's). */
static void complete_all(psd_shard *s, pending_push *ready)
{
    while (ready != NULL) {
        pending_push *q = ready;
        ready = q->next;
        shard_push_complete(s, q);
    }
}

/* What a push handler reuses from call to call on its thread: the decoded
 * request. Freed by the thread-exit destructor of a pthread key. */
struct thread_bufs {
    ps_wire_push req;
    float straddle; /* a float split between two pieces, joined */
    /* The largest magnitude of each gradient the check step read, in the
     * order it read them (grad_finite_split), for the apply step's proof
     * (grad_stays_finite); emptied at the start of each push. */
    struct grad_mag {
        ps_wire_bytes c;
        uint32_t mag;
    } *mags;
    size_t nmags, cap_mags;
};

static void bufs_free(void *p)
{
    struct thread_bufs *b = p;
    ps_wire_push_free(&b->req);
    free(b->mags);
    free(b);
}

static ps_thread_slot bufs_slot = PS_THREAD_SLOT(struct thread_bufs, bufs_free);

static struct thread_bufs *thread_bufs(void)
{
    return ps_thread_slot_get(&bufs_slot);
}

/* The next floats of a gradient whose bytes the cursor c covers (a whole
 * number of floats), read in place from the piece they arrived in, at
 * whatever alignment; a float split between two pieces is joined in
 * *straddle. Returns how many floats *out holds; 0 at the end. */
static size_t grad_next(ps_wire_bytes *c, float *straddle, const psd_ufloat **out)
{
    const uint8_t *p;
    size_t k = ps_wire_bytes_peek(c, &p);
    if (k == 0)
        return 0;
    if (k < sizeof(float)) {
        ps_wire_bytes_take(c, straddle, sizeof(float));
        *out = straddle;
        return 1;
    }
    size_t nf = k / sizeof(float);
    *out = (const psd_ufloat *)(const void *)p;
    ps_wire_bytes_take(c, NULL, nf * sizeof(float));
    return nf;
}

/* Makes v's value safe to update: when a Pull's reply is still sending it
 * in place, the value moves to a copy (pooled memory, warm) and the reply
 * keeps the old bytes. Called with v->lock held for writing. */
static void value_writable(psd_var *v)
{
    if (v->vmsg == NULL || !ps_rpc_msg_shared(v->vmsg))
        return;
    size_t bytes = v->n * sizeof(float);
    ps_rpc_msg *m = ps_rpc_msg_new(bytes);
    /* Out of memory for the copy: wait for the reply to be sent instead
     * (gRPC releases it without this variable's lock). */
    for (int i = 0; m == NULL && ps_rpc_msg_shared(v->vmsg); i++) {
        if (i % 1000 == 0)
            ps_log_warn("variable '%s': no memory to copy the value a Pull is "
                        "sending; the update waits for the send", v->name);
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
        m = ps_rpc_msg_new(bytes);
    }
    if (m == NULL)
        return;
    memcpy(ps_rpc_msg_data(m), v->value, bytes);
    ps_rpc_msg_unref(v->vmsg);
    v->vmsg = m;
    v->value = (float *)(void *)ps_rpc_msg_data(m);
}

/* The largest magnitude in gradient c (psd_max_mag): at or above
 * PSD_NONFINITE_MAG when an element is NaN or Inf. One pass, the cost of a
 * finiteness check. */

static uint32_t grad_mag(ps_wire_bytes c, float *straddle)
{
    const psd_ufloat *g;
    size_t k;
    uint32_t mag = 0, m;
    while ((k = grad_next(&c, straddle, &g)) > 0) {
        m = psd_max_mag(g, k);
        mag = m > mag ? m : mag;
    }
    return mag;
}

/* Keeps the magnitude of gradient c, read by the check step, for the
 * apply step of the same push (out of memory: not kept, and the apply
 * step reads the gradient again). */
static void keep_mag(ps_wire_bytes c, uint32_t mag)
{
    struct thread_bufs *tb = thread_bufs();
    if (tb == NULL)
        return;
    if (tb->nmags == tb->cap_mags) {
        size_t ncap = tb->cap_mags ? 2 * tb->cap_mags : 16;
        struct grad_mag *m = realloc(tb->mags, ncap * sizeof *m);
        if (m == NULL)
            return;
        tb->mags = m;
        tb->cap_mags = ncap;
    }
    tb->mags[tb->nmags++] = (struct grad_mag){c, mag};
}

/* The magnitude of gradient c, the i-th the check step read, from
 * keep_mag when it is that same gradient, else read now. */
static uint32_t kept_mag(size_t i, ps_wire_bytes c, float *straddle)
{
    struct thread_bufs *tb = thread_bufs();
    if (tb != NULL && i < tb->nmags && tb->mags[i].c.p == c.p &&
        tb->mags[i].c.i == c.i && tb->mags[i].c.off == c.off &&
        tb->mags[i].c.left == c.left)
        return tb->mags[i].mag;
    return grad_mag(c, straddle);
}

/* Applies the optimizer with gradient c to v's elements from off on, part
 * by part as the gradient arrived. Called with v->lock held for writing
 * (by this thread or the one that handed the job over). Returns the largest
 * magnitude written (psd_opt_apply_part). */
static uint32_t grad_apply_at(psd_var *v, ps_wire_bytes c, size_t off,
                              float *straddle, uint64_t t)
{
    const psd_ufloat *g;
    size_t k;
    uint32_t mag = 0, m;
    while ((k = grad_next(&c, straddle, &g)) > 0) {
        m = psd_opt_apply_part(&v->opt, v->value + off,
                               v->slots ? v->slots + off : NULL, v->n, g, k, 1.0f, t);
        mag = m > mag ? m : mag;
        off += k;
    }
    return mag;
}

/* A gradient at least this big is checked and applied in two halves, one
 * on the helper thread when it is idle (assist.h). */
#define SPLIT_MIN_BYTES SHARD_SPLIT_MIN_BYTES

struct half {
    psd_var *v;
    ps_wire_bytes c;
    size_t off; /* its first element */
    uint64_t t;
    uint32_t mag; /* half_check: grad_mag; half_apply: grad_apply_at's */
    float straddle;
};

static void half_check(void *p)
{
    struct half *h = p;
    h->mag = grad_mag(h->c, &h->straddle);
}

static void half_apply(void *p)
{
    struct half *h = p;
    h->mag = grad_apply_at(h->v, h->c, h->off, &h->straddle, h->t);
}

/* Splits gradient c of n floats at a cache-line boundary near its middle:
 * lo covers the elements before the returned index, hi the rest. */
static size_t split_grad(ps_wire_bytes c, size_t n, ps_wire_bytes *lo, ps_wire_bytes *hi)
{
    size_t mid = (n / 2) & ~(size_t)15;
    *lo = c;
    lo->left = mid * sizeof(float);
    *hi = c;
    ps_wire_bytes_take(hi, NULL, mid * sizeof(float));
    return mid;
}

/* Whether every float of gradient c is finite: its largest magnitude,
 * which the apply step's proof takes too (keep_mag), so that one pass over
 * the gradient serves both steps. */
static bool grad_finite_split(psd_shard *s, ps_wire_bytes c, size_t n, float *straddle)
{
    struct half h = {0};
    ps_wire_bytes lo;
    uint32_t mag;
    if (n * sizeof(float) < SPLIT_MIN_BYTES) {
        mag = grad_mag(c, straddle);
    } else {
        split_grad(c, n, &lo, &h.c);
        if (!psd_assist_try(s->assist, half_check, &h)) {
            mag = grad_mag(c, straddle);
        } else {
            mag = grad_mag(lo, straddle);
            psd_assist_join(s->assist);
            mag = h.mag > mag ? h.mag : mag;
        }
    }
    keep_mag(c, mag);
    return mag < PSD_NONFINITE_MAG;
}

/* Applies gradient c to v (the whole value). Called with v->lock held for
 * writing. Either way each element gets the same bits. Records the largest
 * magnitude written with the version it will have (v->mag). */
static void grad_apply(psd_shard *s, psd_var *v, ps_wire_bytes c, float *straddle,
                       uint64_t t)
{
    struct half h = {.v = v, .t = t};
    ps_wire_bytes lo;
    uint32_t mag;
    value_writable(v);
    if (v->n * sizeof(float) < SPLIT_MIN_BYTES) {
        mag = grad_apply_at(v, c, 0, straddle, t);
    } else {
        h.off = split_grad(c, v->n, &lo, &h.c);
        if (!psd_assist_try(s->assist, half_apply, &h)) {
            mag = grad_apply_at(v, c, 0, straddle, t);
        } else {
            mag = grad_apply_at(v, lo, 0, straddle, t);
            psd_assist_join(s->assist);
            mag = h.mag > mag ? h.mag : mag;
        }
    }
    v->mag = mag;
    v->mag_version = t;
}

/*
 * Whether applying gradient c to v leaves every value and slot finite
 * (issue 13 f: 120 pushes of 3.4e38 drove an SGD value to -inf; Adam's
 * second moment overflowed and froze its element). Called with v->lock held
 * for writing, before grad_apply, unless --allow-nonfinite.
 *
 * The updates run in place (in halves on the helper thread, from shared
 * memory for big variables), so once a write turned an element non-finite
 * the elements before it are already changed, and undoing would need a copy
 * of the old values on every push. Instead the update is proven finite
 * before it starts, at almost no cost: every apply loop returns, for free
 * (an integer max in registers), the largest magnitude it wrote, kept as
 * v->mag; the check step's finiteness pass over the gradient gives its
 * largest magnitude at the same cost (grad_finite_split, kept_mag), and
 * psd_opt_safe bounds the whole update from
 * the two numbers and the hyperparameters in constant time (a piece of
 * the variable, from element off on, the same way: v->mag bounds every
 * element). Only when that
 * proof fails (v->mag unknown: the first update after create or restore;
 * or magnitudes near float's range) does the exact check run: the update's
 * own arithmetic without writing (psd_opt_check_part), a second pass, after
 * which the update is applied or refused with nothing changed. Returns
 * true, or false with err written.
 */
static bool grad_stays_finite(psd_var *v, size_t i, ps_wire_bytes c, size_t off,
                              float *straddle, uint64_t t, char *err, size_t errlen)
{
    const psd_ufloat *g;
    size_t k;
    uint32_t gmag = kept_mag(i, c, straddle);
    if (v->mag_version != 0 && v->mag_version == v->version &&
        psd_opt_safe(&v->opt, v->mag, gmag, 1.0f, t))
        return true;
    while ((k = grad_next(&c, straddle, &g)) > 0) {
        size_t bad = psd_opt_check_part(&v->opt, v->value + off,
                                        v->slots ? v->slots + off : NULL, v->n,
                                        g, k, 1.0f, t);
        if (bad < k) {
            snprintf(err, errlen, "variable '%s': this update would make "
                     "element %zu non-finite (value %g, gradient %g, %s); "
                     "refused, the variable is unchanged (start psd with "
                     "--allow-nonfinite to accept)", v->name, off + bad,
                     (double)v->value[off + bad], (double)g[bad],
                     psd_opt_name(v->opt.kind));
            return false;
        }
        off += k;
    }
    return true;
}

/* ---- pushes in pieces ------------------------------------------------- */

/* One worker's push in pieces under way on a variable (Gradient.total): the
 * elements its pieces covered so far, and where each piece began, so that a
 * piece sent again (a retry) is known. */
typedef struct psd_piecework {
    uint32_t worker;
    uint64_t step;
    size_t done;
    size_t *offs; /* (noffs) */
    size_t noffs, cap_offs;
} psd_piecework;

void shard_pieces_free(psd_var *v)
{
    for (size_t i = 0; i < v->npw; i++)
        free(v->pw[i].offs);
    free(v->pw);
    v->pw = NULL;
    v->npw = v->cap_pw = 0;
}

/* The piece gradient g covers ({0, 0}: the whole variable). Valid once
 * check_tensor has passed it. */
static psd_range grad_range(const ps_wire_grad *g)
{
    if (g->total == 0)
        return (psd_range){0, 0};
    return (psd_range){(size_t)g->offset, g->nbytes / sizeof(float)};
}

enum { PIECE_MORE, PIECE_COVERED, PIECE_REPEAT };

/* Notes piece r of worker's push of step on v. Returns PIECE_COVERED when
 * that push's pieces now cover v (its entry is dropped), PIECE_MORE when
 * not yet, PIECE_REPEAT for a piece noted already (a call sent again: not
 * counted twice), -ENOMEM. A worker's pieces of another step start over:
 * its push before was left unfinished. Pieces of one push do not overlap
 * (the client cuts them so). Called with v->lock held for writing. */
static int piece_note(psd_var *v, uint32_t worker, uint64_t step, psd_range r)
{
    psd_piecework *w = NULL;
    for (size_t i = 0; i < v->npw && w == NULL; i++)
        if (v->pw[i].worker == worker)
            w = &v->pw[i];
    if (w == NULL) {
        psd_piecework *grown = ps_grow(v->pw, &v->cap_pw, v->npw, sizeof *grown, 4);
        if (grown == NULL)
            return -ENOMEM;
        v->pw = grown;
        w = &v->pw[v->npw++];
        *w = (psd_piecework){.worker = worker, .step = step};
    } else if (w->step != step) {
        w->step = step;
        w->done = 0;
        w->noffs = 0;
    }
    for (size_t j = 0; j < w->noffs; j++)
        if (w->offs[j] == r.off)
            return PIECE_REPEAT;
    size_t *offs = ps_grow(w->offs, &w->cap_offs, w->noffs, sizeof *offs, 16);
    if (offs == NULL)
        return -ENOMEM;
    w->offs = offs;
    w->offs[w->noffs++] = r.off;
    w->done += r.n;
    if (w->done < v->n)
        return PIECE_MORE;
    free(w->offs);
    *w = v->pw[--v->npw];
    return PIECE_COVERED;
}

/* accum = g (first push of a step) or accum += g. */
static void grad_accumulate(float *accum, bool first, ps_wire_bytes c, float *straddle)
{
    const psd_ufloat *g;
    size_t k, off = 0;
    while ((k = grad_next(&c, straddle, &g)) > 0) {
        if (first)
            memcpy(accum + off, g, k * sizeof(float));
        else
            psd_accumulate(accum + off, g, k);
        off += k;
    }
}

/* Adds a worker to the step's set; false if it was there already. Called
 * with v->lock held for writing. */
static bool mark_pushed(psd_var *v, uint32_t worker)
{
    for (size_t i = 0; i < v->npushed; i++)
        if (v->pushed[i] == worker)
            return false;
    if (v->npushed == v->cap_pushed) {
        size_t ncap = v->cap_pushed ? v->cap_pushed * 2 : 8;
        uint32_t *p = realloc(v->pushed, ncap * sizeof *p);
        if (p == NULL)
            return false;
        v->pushed = p;
        v->cap_pushed = ncap;
    }
    v->pushed[v->npushed++] = worker;
    return true;
}

/* Whether applying the step's aggregate (v->accum, count pushes) leaves
 * every value and slot finite, as grad_stays_finite asks of an async push
 * (issue 13 e): each push of the step was finite, but their sum need not be
 * (3e38 + 3e38 is Inf in float). Called with v->lock held for writing.
 * Returns true, or false with err written. */
static bool step_stays_finite(psd_var *v, float scale, uint64_t t, char *err,
                              size_t errlen)
{
    uint32_t amag = psd_max_mag(v->accum, v->n);
    if (amag < PSD_NONFINITE_MAG && v->mag_version != 0 &&
        v->mag_version == v->version && psd_opt_safe(&v->opt, v->mag, amag, scale, t))
        return true;
    size_t bad = v->n;
    if (amag >= PSD_NONFINITE_MAG) {
        for (bad = 0; bad < v->n && psd_all_finite(v->accum + bad, 1); bad++)
            ;
        snprintf(err, errlen, "variable '%s': step %llu: the sum of its %u "
                 "gradients is non-finite at element %zu (each push was finite); "
                 "refused, the variable is unchanged (start psd with "
                 "--allow-nonfinite to accept)", v->name,
                 (unsigned long long)v->step, v->accum_count, bad);
        return false;
    }
    bad = psd_opt_check_part(&v->opt, v->value, v->slots, v->n, v->accum, v->n,
                             scale, t);
    if (bad >= v->n)
        return true;
    snprintf(err, errlen, "variable '%s': step %llu: its aggregate would make "
             "element %zu non-finite (value %g, mean gradient %g, %s); refused, "
             "the variable is unchanged (start psd with --allow-nonfinite to "
             "accept)", v->name, (unsigned long long)v->step, bad,
             (double)v->value[bad], (double)(v->accum[bad] * scale),
             psd_opt_name(v->opt.kind));
    return false;
}

/* Applies the step's aggregate when every worker has pushed, and completes
 * the pushes that waited for it. An aggregate that would make the variable
 * non-finite (step_stays_finite) is dropped instead: the value stays, the
 * step is over, and each push of it is answered INVALID_ARGUMENT. Called
 * with v->lock held for writing; returns the pushes to complete (the caller
 * does, after unlocking). */
static pending_push *maybe_apply_step(psd_shard *s, psd_var *v)
{
    /* A worker counts once its pieces cover the variable; one half through
     * them when the count is met anyway (the count was lowered because it
     * died, or it is a worker too many) leaves its pieces in the aggregate,
     * and its later pieces find the step applied. */
    if (v->accum_count < v->num_workers)
        return NULL;
    float scale = 1.0f / (float)v->accum_count;
    char err[512];
    bool refused = !s->o.allow_nonfinite &&
                   !step_stays_finite(v, scale, v->version + 1, err, sizeof err);
    if (refused) {
        atomic_fetch_add(&s->nonfinite, 1);
        ps_log_warn("%s", err);
    } else {
        value_writable(v);
        v->mag = psd_opt_apply(&v->opt, v->value, v->slots, v->accum, v->n, scale,
                               v->version + 1);
        v->mag_version = __atomic_add_fetch(&v->version, 1, __ATOMIC_RELEASE);
        shard_count_apply(s);
    }
    uint64_t done_step = v->step;
    v->step++;
    v->accum_count = 0;
    v->accum_elems = 0;
    v->npushed = 0;
    shard_pieces_free(v);
    /* Collect the pushes of this step that now have every part applied. */
    pending_push *ready = NULL;
    pthread_mutex_lock(&s->wait_mu);
    for (pending_push **pp = &s->pending; *pp != NULL;) {
        pending_push *p = *pp;
        bool mine = false;
        if (p->step == done_step)
            for (size_t i = 0; i < p->nitems; i++)
                if (p->vars[i] == v && p->versions[i] == 0 &&
                    (p->settled == NULL || !p->settled[i])) {
                    p->versions[i] = v->version;
                    p->nleft--;
                    mine = true;
                    if (refused && p->refused == NULL)
                        p->refused = strdup(err);
                }
        if (mine && p->nleft == 0 && p->armed) {
            *pp = p->next;
            p->next = ready;
            ready = p;
        } else {
            pp = &p->next;
        }
    }
    pthread_mutex_unlock(&s->wait_mu);
    return ready;
}

/* Decodes a Push into the thread's buffers and makes the pending push that
 * will answer it, with its shared memory resolved (shard_push_shm). Returns NULL
 * with call failed. */
static pending_push *push_begin(psd_shard *s, ps_rpc_call *call,
                                const struct ps_piece *pieces, int npieces,
                                struct thread_bufs *tb, double t0, uint64_t *shm_in)
{
    char err[512];
    ps_wire_push *r = &tb->req;
    int rc = ps_wire_push_decode(pieces, npieces, r, err, sizeof err);
    if (rc != 0) {
        shard_count_bad(s);
        ps_rpc_fail(call, rc == PS_EPARSE ? PS_RPC_INVALID_ARGUMENT
                                          : PS_RPC_RESOURCE_EXHAUSTED,
                    "%s", rc == PS_EPARSE ? err : "Push: out of memory");
        return NULL;
    }
    if (r->ngrads == 0) {
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                    "Push: no gradients; send at least one");
        return NULL;
    }
    if (s->stopping) {
        ps_rpc_fail(call, PS_RPC_UNAVAILABLE, "psd is shutting down");
        return NULL;
    }
    pending_push *p = calloc(1, sizeof *p);
    if (p == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
        return NULL;
    }
    p->call = call;
    p->t0 = t0;
    p->nitems = r->ngrads;
    p->step = r->step;
    p->return_values = r->return_values;
    p->wire_dtype = r->wire_dtype;
    p->vars = calloc(r->ngrads, sizeof *p->vars);
    p->versions = calloc(r->ngrads, sizeof *p->versions);
    if (p->vars == NULL || p->versions == NULL) {
        shard_pending_free(p);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
        return NULL;
    }
    if (!shard_push_shm(s, call, r, p, shm_in)) {
        shard_pending_free(p);
        return NULL;
    }
    return p;
}

/* Finds the variable of grads[i] into p->vars[i], named once in the push.
 * Returns PS_RPC_OK, or a code with err written. */
static enum ps_rpc_code check_name(psd_shard *s, const ps_wire_grad *g, size_t i,
                                   pending_push *p, char *err, size_t errlen)
{
    psd_var *v = g->name_len > PS_WIRE_MAX_NAME
                     ? NULL : shard_find_var(s, g->name, g->name_len, NULL);
    const char *nul = g->name_len > PS_WIRE_MAX_NAME
                          ? NULL : memchr(g->name, 0, g->name_len);
    if (nul != NULL) {
        /* Said as the other methods say it (shard_unpack), not as a mere
         * control character: protobuf-c clients would see "a" for "a\0b". */
        snprintf(err, errlen, "Push: grads[%zu].name has a NUL byte at %zu", i,
                 (size_t)(nul - g->name));
        return PS_RPC_INVALID_ARGUMENT;
    }
    if (v == NULL) {
        const char *np = shard_name_problem(g->name, g->name_len);
        if (np)
            snprintf(err, errlen, "Push: grads[%zu]: variable name %s", i, np);
        else
            snprintf(err, errlen, "Push: variable '%.*s' does not exist",
                     (int)g->name_len, g->name);
        return np ? PS_RPC_INVALID_ARGUMENT : PS_RPC_NOT_FOUND;
    }
    if (v->sparse != NULL) {
        snprintf(err, errlen, "Push: variable '%s' is a sparse table; push its "
                 "rows with SparsePush", v->name);
        return PS_RPC_INVALID_ARGUMENT;
    }
    p->vars[i] = v;
    enum ps_rpc_code code = PS_RPC_OK;
    for (size_t j = 0; j < i; j++)
        if (p->vars[j] == v) {
            code = PS_RPC_INVALID_ARGUMENT;
            snprintf(err, errlen, "Push: variable '%s' has two gradients "
                     "in one push", v->name);
        }
    return code;
}

/* Checks gradient g against its variable v: present, FLOAT32, as many
 * elements, the same shape when it has one, finite unless
 * --allow-nonfinite. Returns PS_RPC_OK, or a code with err written. */
static bool grad_finite_known(psd_shard *s, ps_wire_bytes c, size_t n,
                              float *straddle, uint32_t known)
{
    if (known == UINT32_MAX)
        return grad_finite_split(s, c, n, straddle);
    keep_mag(c, known);
    return known < PSD_NONFINITE_MAG;
}

/* Checks a piece (Gradient.total): of the variable's size, within it, not
 * in shared memory. Returns true, or false with err written. */
static bool check_piece(const ps_wire_grad *g, const psd_var *v, char *err,
                        size_t errlen)
{
    size_t k = g->nbytes / sizeof(float);
    if (g->total != v->n)
        snprintf(err, errlen, "variable '%s': gradient has %llu elements, "
                 "variable has %zu", v->name, (unsigned long long)g->total, v->n);
    else if (g->shm.set || g->value_into.set)
        snprintf(err, errlen, "variable '%s': a piece of a gradient (total "
                 "set) cannot lie in shared memory or ask its value there",
                 v->name);
    else if (g->nbytes % sizeof(float) != 0)
        snprintf(err, errlen, "variable '%s': gradient piece has %zu bytes, "
                 "not a whole number of float32 elements", v->name, g->nbytes);
    else if (k == 0 || g->offset >= v->n || k > v->n - g->offset)
        snprintf(err, errlen, "variable '%s': a gradient piece of %zu elements "
                 "at element %llu does not lie within its %zu elements", v->name,
                 k, (unsigned long long)g->offset, v->n);
    else
        return true;
    return false;
}

static enum ps_rpc_code check_tensor(psd_shard *s, const ps_wire_grad *g,
                                     const psd_var *v, float *straddle,
                                     uint32_t known, char *err, size_t errlen)
{
    if (g->has_tensor && g->total != 0 && g->dtype == PS__V1__DTYPE__DTYPE_FLOAT32 &&
        !check_piece(g, v, err, errlen))
        return PS_RPC_INVALID_ARGUMENT;
    size_t n = g->total != 0 ? g->nbytes / sizeof(float) : v->n;
    if (!g->has_tensor) {
        snprintf(err, errlen, "variable '%s': the gradient tensor is "
                 "missing", v->name);
    } else if (g->dtype != PS__V1__DTYPE__DTYPE_FLOAT32) {
        snprintf(err, errlen, "variable '%s': gradient dtype is %s, "
                 "variable is FLOAT32", v->name, shard_dtype_name(g->dtype));
    } else if (g->widened_from != 0 && v->spec->float32_only) {
        snprintf(err, errlen, "variable '%s': a %s gradient, but the variable "
                 "was created float32_only", v->name,
                 shard_dtype_name(g->widened_from));
    } else if (g->total == 0 && g->nbytes != v->n * sizeof(float)) {
        if (g->nbytes % sizeof(float) != 0)
            snprintf(err, errlen, "variable '%s': gradient has %zu bytes, "
                     "not a whole number of float32 elements", v->name, g->nbytes);
        else
            snprintf(err, errlen, "variable '%s': gradient has %zu elements, "
                     "variable has %zu", v->name, g->nbytes / sizeof(float), v->n);
    } else if (g->ndim != 0 &&
               (g->ndim != v->ndim ||
                memcmp(g->shape, v->shape, (size_t)v->ndim * sizeof *v->shape) != 0)) {
        char a[128], b[128];
        ps_tensor_shape_str(g->shape, g->ndim < 0 ? 0 : g->ndim, a, sizeof a);
        ps_tensor_shape_str(v->shape, v->ndim, b, sizeof b);
        snprintf(err, errlen, "variable '%s': gradient shape %s, variable "
                 "shape %s", v->name, g->ndim < 0 ? "(more than 8 dims)" : a, b);
    } else if (!s->o.allow_nonfinite &&
               !grad_finite_known(s, g->data, n, straddle, known)) {
        atomic_fetch_add(&s->nonfinite, 1);
        snprintf(err, errlen, "variable '%s': the gradient holds NaN or "
                 "Inf; refused (start psd with --allow-nonfinite to accept)",
                 v->name);
    } else {
        return PS_RPC_OK;
    }
    return PS_RPC_INVALID_ARGUMENT;
}

/* A sync variable takes a push only for the step it is aggregating.
 * Returns PS_RPC_OK, or a code with err written. */
static enum ps_rpc_code check_step(psd_shard *s, psd_var *v, uint64_t step,
                                   char *err, size_t errlen)
{
    pthread_rwlock_rdlock(&v->lock);
    uint64_t at = v->step;
    pthread_rwlock_unlock(&v->lock);
    if (step < at) {
        atomic_fetch_add(&s->stale, 1);
        snprintf(err, errlen, "variable '%s': step %llu was already "
                 "applied (the variable is aggregating step %llu)", v->name,
                 (unsigned long long)step, (unsigned long long)at);
        return PS_RPC_FAILED_PRECONDITION;
    }
    if (step > at) {
        snprintf(err, errlen, "variable '%s': step %llu is ahead of "
                 "the step being aggregated, %llu", v->name,
                 (unsigned long long)step, (unsigned long long)at);
        return PS_RPC_FAILED_PRECONDITION;
    }
    return PS_RPC_OK;
}

/* Phase 1: checks every gradient, changing nothing. Returns PS_RPC_OK, or
 * the code of the first refusal with err written. Called with table_lock
 * held for reading. */
static enum ps_rpc_code push_check(psd_shard *s, const ps_wire_push *r,
                                   pending_push *p, float *straddle,
                                   const uint32_t *shm_mag, char *err, size_t errlen)
{
    for (size_t i = 0; i < r->ngrads; i++) {
        const ps_wire_grad *g = &r->grads[i];
        enum ps_rpc_code code = check_name(s, g, i, p, err, errlen);
        if (code == PS_RPC_OK)
            code = check_tensor(s, g, p->vars[i], straddle,
                                shm_mag != NULL ? shm_mag[i] : UINT32_MAX, err, errlen);
        if (code == PS_RPC_OK && p->vars[i]->consistency == PSD_SYNC && r->delta) {
            shard_count_bad(s);
            snprintf(err, errlen, "variable '%s': a delta push (local SGD) "
                     "needs an ASYNC or BOUNDED_STALENESS variable, not SYNC",
                     p->vars[i]->name);
            code = PS_RPC_INVALID_ARGUMENT;
        }
        if (code == PS_RPC_OK && p->vars[i]->consistency == PSD_SYNC)
            code = check_step(s, p->vars[i], r->step, err, errlen);
        if (code != PS_RPC_OK)
            return code;
    }
    return PS_RPC_OK;
}

/* Applies piece rg of an async push (gradient c): the optimizer with the
 * step count of the version to come (v->version + 1, as a whole push would
 * use), the version left as it is. Returns whether the push still has
 * pieces to come; false when this one covered the rest of the variable (the
 * caller raises the version). v->mag stays a bound on every element: the
 * larger of the bound before and what this piece wrote. Called with v->lock
 * held for writing. */
static bool apply_piece(psd_var *v, const ps_wire_push *r, psd_range rg,
                        ps_wire_bytes c, float *straddle)
{
    bool known = v->mag_version != 0 && v->mag_version == v->version;
    value_writable(v);
    uint32_t mag = grad_apply_at(v, c, rg.off, straddle, v->version + 1);
    v->mag = known && v->mag > mag ? v->mag : mag;
    v->mag_version = known ? v->version : 0;
    int got = piece_note(v, r->worker, r->step, rg);
    if (got == -ENOMEM)
        ps_log_warn("variable '%s': out of memory noting a pushed piece; its "
                    "version may rise late", v->name);
    return got != PIECE_COVERED;
}

/* Applies the async part i now, unless it would make the variable
 * non-finite (grad_stays_finite): then returns false with err written and
 * the variable unchanged. Called with v->lock held for writing; lets it
 * go. */
static bool apply_async(psd_shard *s, pending_push *p, size_t i,
                        const ps_wire_push *r, float *straddle, char *err,
                        size_t errlen)
{
    psd_var *v = p->vars[i];
    ps_wire_bytes g = r->grads[i].data;
    bool delta = r->delta;
    psd_range rg = grad_range(&r->grads[i]);
    /* A delta push (local SGD) is SGD at learning rate -1, w - (-1) g,
     * which is w + g exactly, through the same checked and split update;
     * the variable's own optimizer is set back before the lock goes. The
     * magnitude it records covers the value only, not the slots, so the
     * next update proves nothing from it (mag_version 0). */
    psd_opt own = v->opt;
    if (delta)
        v->opt = (psd_opt){.kind = PSD_OPT_SGD, .lr = -1.0f};
    if (!s->o.allow_nonfinite &&
        !grad_stays_finite(v, i, g, rg.off, straddle, v->version + 1, err, errlen)) {
        v->opt = own;
        pthread_rwlock_unlock(&v->lock);
        atomic_fetch_add(&s->nonfinite, 1);
        return false;
    }
    if (rg.n == 0) {
        grad_apply(s, v, g, straddle, v->version + 1);
    } else if (apply_piece(v, r, rg, g, straddle)) {
        p->versions[i] = v->version;
        if (delta) {
            v->opt = own;
            v->mag_version = 0;
        }
        shard_count_apply(s);
        pthread_rwlock_unlock(&v->lock);
        return true;
    }
    if (delta) {
        v->opt = own;
        v->mag_version = 0;
    }
    p->versions[i] = __atomic_add_fetch(&v->version, 1, __ATOMIC_RELEASE);
    if (rg.n != 0 && v->mag_version == v->version - 1 && !delta)
        v->mag_version = v->version;
    shard_count_apply(s);
    pthread_rwlock_unlock(&v->lock);
    return true;
}

/* Adds piece rg of a worker's sync push to the step's aggregate (a piece
 * sent again adds nothing), and counts the worker in once its pieces cover
 * the variable. The first piece of a step starts the aggregate at -0.0, the
 * one float whose sum with every x is x itself, so that pieces give the
 * same bits as a whole push's copy. Called with v->lock held for writing. */
static int join_piece(psd_var *v, uint32_t worker, uint64_t step, psd_range rg,
                      ps_wire_bytes g, float *straddle)
{
    int got = piece_note(v, worker, step, rg);
    if (got == PIECE_REPEAT)
        return got;
    if (got == -ENOMEM) {
        ps_log_warn("variable '%s': out of memory noting a pushed piece of "
                    "worker %u; its step waits for the piece again", v->name,
                    worker);
        return got;
    }
    if (v->accum_elems == 0)
        for (size_t j = 0; j < v->n; j++)
            v->accum[j] = -0.0f;
    grad_accumulate(v->accum + rg.off, false, g, straddle);
    v->accum_elems += rg.n;
    if (got == PIECE_COVERED && mark_pushed(v, worker))
        v->accum_count++;
    return got;
}

/* Joins the sync part i to its step's aggregate, and applies the step
 * when this was its last push. Called with v->lock held for writing; lets
 * it go before it completes the pushes the step finished. */
static void join_step(psd_shard *s, pending_push *p, size_t i,
                      const ps_wire_push *r, ps_wire_bytes g, float *straddle)
{
    psd_var *v = p->vars[i];
    psd_range rg = grad_range(&r->grads[i]);
    /* The step may have been applied since phase 1 checked it (this push
     * was a retry the others completed): this part is then done already,
     * and must not spill into the next step's aggregate. */
    if (v->step != r->step) {
        pthread_mutex_lock(&s->wait_mu);
        p->versions[i] = v->version;
        p->nleft--;
        pthread_mutex_unlock(&s->wait_mu);
        pthread_rwlock_unlock(&v->lock);
        return;
    }
    /* A worker pushing a step again (a retry after its deadline) adds
     * nothing and just waits for the step again. */
    if (v->accum == NULL)
        v->accum = shard_alloc_floats(v->n);
    if (rg.n != 0 &&
        join_piece(v, r->worker, r->step, rg, g, straddle) != PIECE_COVERED) {
        /* Not the worker's last piece: answered now (the step's version
         * comes with the last one), so that a client need not keep every
         * piece of a step in flight at once. */
        pthread_mutex_lock(&s->wait_mu);
        p->versions[i] = v->version;
        p->settled[i] = true;
        p->nleft--;
        pthread_mutex_unlock(&s->wait_mu);
        pthread_rwlock_unlock(&v->lock);
        return;
    } else if (rg.n != 0) {
        /* The last piece answers with the whole value once the step is
         * applied: the other pieces' answers came before it. */
        p->ranges[i] = (psd_range){0, 0};
    } else if (mark_pushed(v, r->worker)) {
        grad_accumulate(v->accum, v->accum_elems == 0, g, straddle);
        v->accum_elems += v->n;
        v->accum_count++;
    }
    pending_push *ready = maybe_apply_step(s, v);
    pthread_rwlock_unlock(&v->lock);
    complete_all(s, ready);
}

/* Phase 2: applies every part, async ones first, then sync ones into their
 * step. The pending push is listed before any sync part joins, with every
 * sync part counted, so that whichever thread applies the last part's step
 * sees the whole count; it completes the push only once armed (push_arm),
 * that is once this handler is done with it. An async part that would turn
 * its variable non-finite stops the push before any sync part joins: the
 * async parts before it stay applied (each variable is updated under its
 * own lock), and the error says so. Returns the number of sync parts, or
 * SIZE_MAX with err written. Called with table_lock held for reading. */
static size_t push_apply(psd_shard *s, pending_push *p, const ps_wire_push *r,
                         float *straddle, uint64_t *bytes, char *err, size_t errlen)
{
    size_t nsync = 0;
    for (size_t i = 0; i < r->ngrads; i++) {
        psd_var *v = p->vars[i];
        if (v->consistency == PSD_SYNC) {
            nsync++;
            continue;
        }
        pthread_rwlock_wrlock(&v->lock);
        if (!apply_async(s, p, i, r, straddle, err, errlen)) {
            if (i > 0) {
                size_t len = strlen(err);
                snprintf(err + len, errlen - len, PS_WIRE_APPLIED_BEFORE_FMT, i);
            }
            return SIZE_MAX;
        }
        *bytes += r->grads[i].nbytes;
    }
    if (nsync > 0) {
        pthread_mutex_lock(&s->wait_mu);
        p->nleft = nsync;
        p->next = s->pending;
        s->pending = p;
        pthread_mutex_unlock(&s->wait_mu);
    }
    for (size_t i = 0; i < r->ngrads; i++) {
        psd_var *v = p->vars[i];
        if (v->consistency != PSD_SYNC)
            continue;
        *bytes += r->grads[i].nbytes;
        pthread_rwlock_wrlock(&v->lock);
        join_step(s, p, i, r, r->grads[i].data, straddle);
    }
    return nsync;
}

/* Hands a push with sync parts back to the sync steps (armed). Returns
 * whether every part is applied already, in which case it is off the
 * pending list and the caller completes it. */
static bool push_arm(psd_shard *s, pending_push *p)
{
    bool done = false;
    pthread_mutex_lock(&s->wait_mu);
    p->armed = true;
    if (p->nleft == 0) {
        for (pending_push **pp = &s->pending; *pp != NULL; pp = &(*pp)->next)
            if (*pp == p) {
                *pp = p->next;
                break;
            }
        done = true;
    }
    pthread_mutex_unlock(&s->wait_mu);
    return done;
}

/* The pieces of a push that has any, for its answer (p->ranges); false
 * when out of memory. */
static bool push_ranges(pending_push *p, const ps_wire_push *r)
{
    bool any = false;
    for (size_t i = 0; i < r->ngrads; i++)
        any = any || r->grads[i].total != 0;
    if (!any)
        return true;
    p->ranges = calloc(r->ngrads, sizeof *p->ranges);
    p->settled = calloc(r->ngrads, sizeof *p->settled);
    if (p->ranges == NULL || p->settled == NULL)
        return false;
    for (size_t i = 0; i < r->ngrads; i++)
        p->ranges[i] = grad_range(&r->grads[i]);
    return true;
}

static void push_locked(psd_shard *s, ps_rpc_call *call,
                        const struct ps_piece *pieces, int npieces, double t0)
{
    struct thread_bufs *tb = thread_bufs();
    if (tb == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
        return;
    }
    tb->nmags = 0; /* keep_mag's, for this push */
    uint64_t shm_in = 0;
    pending_push *p = push_begin(s, call, pieces, npieces, tb, t0, &shm_in);
    if (p == NULL)
        return;
    ps_wire_push *r = &tb->req;
    if (!shard_half_widen(s, call, r)) {
        shard_pending_free(p);
        return;
    }

    pthread_rwlock_rdlock(&s->table_lock);
    char err[512];
    /* Magnitudes known already: a half push's from its widening, shared
     * memory's from its copy (a half gradient is never in shared memory). */
    const uint32_t *known = shard_half_mags(r);
    enum ps_rpc_code code = push_check(s, r, p, &tb->straddle,
                                       known != NULL ? known : shard_push_shm_mags(),
                                       err, sizeof err);
    if (code != PS_RPC_OK) {
        pthread_rwlock_unlock(&s->table_lock);
        if (code == PS_RPC_INVALID_ARGUMENT)
            shard_count_bad(s);
        ps_rpc_fail(call, code, "%s", err);
        shard_pending_free(p);
        return;
    }
    /* Values that cannot be written where asked fail the push before it
     * changes anything. */
    if (p->into != NULL && !shard_into_ok(s, call, p->vars, p->into, p->nitems)) {
        pthread_rwlock_unlock(&s->table_lock);
        shard_pending_free(p);
        return;
    }
    if (!push_ranges(p, r)) {
        pthread_rwlock_unlock(&s->table_lock);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
        shard_pending_free(p);
        return;
    }
    uint64_t bytes = 0;
    size_t nsync = push_apply(s, p, r, &tb->straddle, &bytes, err, sizeof err);
    if (nsync == SIZE_MAX) {
        pthread_rwlock_unlock(&s->table_lock);
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s", err);
        shard_pending_free(p);
        atomic_fetch_add(&s->bytes_in, bytes);
        shard_wake_waiters(s);
        return;
    }
    bool done = nsync == 0 || push_arm(s, p);
    /* Answered before table_lock is let go: a reply with values reads the
     * variables, which only a Restore (holding it for writing) frees. */
    if (done)
        shard_push_complete(s, p);
    pthread_rwlock_unlock(&s->table_lock);
    atomic_fetch_add(&s->bytes_in, bytes);
    atomic_fetch_add(&s->shm_bytes, shm_in);
    shard_wake_waiters(s);
}

/* Push holds the shared-memory map for its whole run: its gradients may be
 * read from it, its values written into it. */
void shard_push(ps_rpc_call *call, const struct ps_piece *pieces, int npieces,
                void *ctx)
{
    psd_shard *s = ctx;
    double t0 = ps_metrics_now();
    psd_shmmap_enter(s->shm);
    push_locked(s, call, pieces, npieces, t0);
    psd_shmmap_leave(s->shm);
    shard_push_shm_trim();
}

/* The most workers a step may wait for: the job's size as its variables
 * were created for it (the largest num_workers of a SYNC variable's spec),
 * or --workers. A count above it would wait for workers the job does not
 * have, and stall every sync step. Called with the table lock held. */
static uint32_t sync_workers_cap_locked(const psd_shard *s)
{
    uint32_t cap = s->o.workers;
    for (size_t i = 0; i < s->nvars; i++) {
        const psd_var *v = s->vars[i];
        if (v->consistency == PSD_SYNC && v->spec->num_workers > cap)
            cap = v->spec->num_workers;
    }
    return cap;
}

/* The coordinator's word on how many workers are alive: every SYNC
 * variable's step now waits for that many pushes, and a step that already
 * holds them is applied at once.
 *
 * table_lock is held for writing: a push joins its variables one after
 * another under it (held for reading), and a count changed between two of
 * them would leave the first ones applied with the old count and the
 * others waiting for the new one. The shard's variables would then
 * aggregate different steps, and a worker's push, one step for all of
 * them, would be stale on some for good (both workers of a sync job ended
 * in DEADLINE_EXCEEDED after a rejoin). Pushes waiting for their step hold
 * no lock, so this waits only for the joins under way. */
void shard_set_sync_workers(ps_rpc_call *call, const uint8_t *req, size_t len,
                            void *ctx)
{
    psd_shard *s = ctx;
    Ps__V1__SetSyncWorkersRequest *r =
        ps__v1__set_sync_workers_request__unpack(NULL, len, req);
    if (r == NULL || r->workers < 1 || r->workers > 65536) {
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SetSyncWorkers: %s",
                    r == NULL ? "bytes that are not a SetSyncWorkersRequest"
                              : "workers must be in [1, 65536]");
        if (r)
            ps__v1__set_sync_workers_request__free_unpacked(r, NULL);
        return;
    }
    uint32_t n = r->workers, previous = s->o.workers;
    ps__v1__set_sync_workers_request__free_unpacked(r, NULL);
    pthread_rwlock_wrlock(&s->table_lock);
    uint32_t cap = sync_workers_cap_locked(s);
    if (n > cap) {
        pthread_rwlock_unlock(&s->table_lock);
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SetSyncWorkers: %u workers "
                    "is more than the job has: at most %u (the most any SYNC "
                    "variable was created for, or --workers)", n, cap);
        return;
    }
    atomic_store(&s->sync_workers, n);
    for (size_t i = 0; i < s->nvars; i++) {
        psd_var *v = s->vars[i];
        if (v->consistency != PSD_SYNC)
            continue;
        pthread_rwlock_wrlock(&v->lock);
        previous = v->num_workers;
        v->num_workers = n;
        pending_push *ready = v->accum_count > 0 ? maybe_apply_step(s, v) : NULL;
        pthread_rwlock_unlock(&v->lock);
        complete_all(s, ready);
    }
    pthread_rwlock_unlock(&s->table_lock);
    shard_wake_waiters(s);
    ps_log_info("sync variables now aggregate %u worker(s) per step (were %u)",
                n, previous);
    Ps__V1__SetSyncWorkersResponse resp = PS__V1__SET_SYNC_WORKERS_RESPONSE__INIT;
    resp.previous = previous;
    ps_rpc_reply_pb(call, &resp);
}
