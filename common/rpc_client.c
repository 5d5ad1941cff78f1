/*
 * rpc_client.c - the blocking gRPC-core client: one channel per target,
 * per-call deadlines, retry with exponential backoff and jitter on
 * UNAVAILABLE. See rpc.h.
 *
 * Each call uses its own pluck completion queue, so any number of threads
 * can call through one client at once without sharing queue state.
 */
#include "common/rpc.h"

#include "common/clock.h"
#include "common/errors.h"
#include "proto/health.pb-c.h"
#include "common/log.h"
#include "common/rpc_slice.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ps_rpc_client {
    grpc_channel *ch;
    char *target;
    ps_rpc_client_opts o;
    atomic_uint_fast64_t rng; /* jitter state, shared by the calling threads */
    grpc_metadata auth_md;    /* "authorization: Bearer TOKEN" */
    size_t n_md;              /* 1 with a token, else 0 */
};

int ps_rpc_client_create(const char *target, const ps_rpc_client_opts *opts,
                         ps_rpc_client **out)
{
    if (target == NULL || target[0] == '\0')
        return PS_EINVAL_ARG;
    ps_rpc_client_opts o = opts != NULL ? *opts : (ps_rpc_client_opts){0};
    if (o.deadline_ms < 0 || o.max_attempts < 0 || o.backoff_initial_ms < 0 ||
        o.backoff_max_ms < 0 || o.max_message_bytes > PS_RPC_MAX_MESSAGE_CEILING)
        return PS_EINVAL_ARG;
    if (o.deadline_ms == 0)
        o.deadline_ms = 10000;
    if (o.max_attempts == 0)
        o.max_attempts = 1;
    if (o.backoff_initial_ms == 0)
        o.backoff_initial_ms = 50;
    if (o.backoff_max_ms == 0)
        o.backoff_max_ms = 2000;
    if (o.max_message_bytes == 0)
        o.max_message_bytes = PS_RPC_DEFAULT_MAX_MESSAGE;

    ps_rpc_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -ENOMEM;
    c->target = strdup(target);
    if (c->target == NULL) {
        free(c);
        return -ENOMEM;
    }
    c->o = o;
    c->o.token = NULL; /* held only as auth_md */
    if (o.token != NULL && o.token[0] != '\0') {
        size_t tn = strlen(o.token);
        grpc_slice v = grpc_slice_malloc(7 + tn);
        memcpy(GRPC_SLICE_START_PTR(v), "Bearer ", 7);
        memcpy(GRPC_SLICE_START_PTR(v) + 7, o.token, tn);
        c->auth_md.key = grpc_slice_from_static_string("authorization");
        c->auth_md.value = v;
        c->n_md = 1;
    }
    atomic_init(&c->rng, (uint64_t)ps_now_ms() * 0x9E3779B97F4A7C15ull ^
                             (uint64_t)(uintptr_t)c);
    ps_rpc_init_logging();
    grpc_init();
    int max = (int)o.max_message_bytes;
    grpc_arg args[] = {
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = max}},
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, {.integer = max}},
        /* A restarted server should be found again within a second, not
         * after gRPC's default two-minute reconnect backoff. */
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, {.integer = 1000}},
        /* We retry ourselves, with the caller's budget. */
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_ENABLE_RETRIES, {.integer = 0}},
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_HTTP2_MAX_FRAME_SIZE, {.integer = 4 << 20}},
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
         {.integer = 16 << 20}},
        /* Last, and only with TLS to a name other than the target's host. */
        {GRPC_ARG_STRING, (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, {.string = NULL}},
    };
    const ps_tls_opts *tls = ps_tls_is_unix(target) ? NULL
                             : o.tls != NULL ? o.tls : ps_tls_client_default();
    const char *name = ps_tls_target_name(tls);
    size_t nargs = sizeof args / sizeof args[0] - (name != NULL ? 0 : 1);
    if (name != NULL)
        args[nargs - 1].value.string = (char *)name;
    grpc_channel_args cargs = {nargs, args};
    char err[512];
    grpc_channel_credentials *creds = ps_tls_channel_creds(tls, err, sizeof err);
    if (creds == NULL) {
        ps_log_error("rpc: client for %s: %s", target, err);
        ps_rpc_client_destroy(c);
        return PS_EINVAL_ARG;
    }
    c->ch = grpc_channel_create(target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    if (c->ch == NULL) {
        ps_rpc_client_destroy(c);
        return PS_EINVAL_ARG;
    }
    *out = c;
    return 0;
}

void ps_rpc_client_destroy(ps_rpc_client *c)
{
    if (c == NULL)
        return;
    if (c->ch != NULL)
        grpc_channel_destroy(c->ch);
    if (c->n_md > 0)
        grpc_slice_unref(c->auth_md.value);
    free(c->target);
    free(c);
    grpc_shutdown();
}

const char *ps_rpc_client_target(const ps_rpc_client *c)
{
    return c->target;
}

static gpr_timespec deadline_after(int ms)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(ms, GPR_TIMESPAN));
}

static void set_status(ps_rpc_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_status(ps_rpc_status *st, int code, const char *fmt, ...)
{
    if (st == NULL)
        return;
    st->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->message, sizeof st->message, fmt, ap);
    va_end(ap);
}

/* Copies the status details into st. */
static void take_status(ps_rpc_status *st, grpc_status_code code,
                        grpc_slice details)
{
    if (st == NULL)
        return;
    st->code = (int)code;
    size_t n = GRPC_SLICE_LENGTH(details);
    if (n >= sizeof st->message)
        n = sizeof st->message - 1;
    memcpy(st->message, GRPC_SLICE_START_PTR(details), n);
    st->message[n] = '\0';
}

/* A call of method on c's channel, with its own pluck queue in *cq and a
 * deadline deadline_ms from now. end_call undoes both. */
static grpc_call *start_call(ps_rpc_client *c, const char *method,
                             int deadline_ms, grpc_completion_queue **cq)
{
    *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice mslice = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(c->ch, NULL,
                                               GRPC_PROPAGATE_DEFAULTS, *cq,
                                               mslice, NULL,
                                               deadline_after(deadline_ms), NULL);
    grpc_slice_unref(mslice);
    return call;
}

/* The first four ops of a call with one request message: send it (with
 * the client's token, if it has one) and the close, and receive the
 * server's initial metadata into init_md. */
static void put_request_ops(ps_rpc_client *c, grpc_op ops[4],
                            grpc_byte_buffer *send_bb,
                            grpc_metadata_array *init_md)
{
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = c->n_md;
    ops[0].data.send_initial_metadata.metadata = c->n_md ? &c->auth_md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = init_md;
}

/* Drops the call and drains and destroys its queue. */
static void end_call(grpc_call *call, grpc_completion_queue *cq)
{
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME),
                                       NULL).type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

/* Where a response goes: copied into a buffer, or handed over in pieces. */
struct sink {
    ps_buf *buf;
    ps_rpc_pieces_fn fn;
    void *ctx;
    int fn_rc;
};

/* One attempt of a unary call sending send_bb (consumed). Returns the gRPC
 * status code (or PS_RPC_INTERNAL for a local failure, with st set). */
static int call_once(ps_rpc_client *c, const char *method,
                     grpc_byte_buffer *send_bb, struct sink *out,
                     int deadline_ms, ps_rpc_status *st)
{
    grpc_completion_queue *cq;
    grpc_call *call = start_call(c, method, deadline_ms, &cq);

    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_byte_buffer *recv_bb = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;

    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    put_request_ops(c, ops, send_bb, &init_md);
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &error_string;

    int tag = 1;
    int result;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, &tag, NULL);
    if (e != GRPC_CALL_OK) {
        set_status(st, PS_RPC_INTERNAL, "%s: cannot start call (%d)", method,
                   (int)e);
        result = PS_RPC_INTERNAL;
    } else {
        grpc_event ev = grpc_completion_queue_pluck(
            cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        (void)ev; /* RECV_STATUS always completes, with the deadline's help. */
        take_status(st, code, details);
        result = (int)code;
        if (code == GRPC_STATUS_OK) {
            if (recv_bb == NULL) {
                set_status(st, PS_RPC_INTERNAL,
                           "%s: status OK but no response message", method);
                result = PS_RPC_INTERNAL;
            } else if (out != NULL && out->buf != NULL &&
                       ps_rpc_bb_read(recv_bb, out->buf) != 0) {
                set_status(st, PS_RPC_RESOURCE_EXHAUSTED,
                           "%s: out of memory reading the response", method);
                result = PS_RPC_RESOURCE_EXHAUSTED;
            } else if (out != NULL && out->fn != NULL) {
                out->fn_rc = ps_rpc_bb_pieces(recv_bb, out->fn, out->ctx);
            }
        } else if (st != NULL && st->message[0] == '\0' &&
                   error_string != NULL) {
            snprintf(st->message, sizeof st->message, "%s", error_string);
        }
    }

    if (error_string != NULL)
        gpr_free((void *)error_string);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    if (recv_bb != NULL)
        grpc_byte_buffer_destroy(recv_bb);
    grpc_byte_buffer_destroy(send_bb);
    end_call(call, cq);
    return result;
}

static uint64_t next_rand(ps_rpc_client *c)
{
    /* splitmix64 over an atomic counter: good enough for jitter. */
    uint64_t z = atomic_fetch_add(&c->rng, 0x9E3779B97F4A7C15ull) +
                 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* The retry loop around call_once; make_bb builds each attempt's message
 * (sending consumes it). */
static int invoke(ps_rpc_client *c, const char *method,
                  grpc_byte_buffer *(*make_bb)(void *ctx), void *bb_ctx,
                  struct sink *out, int deadline_ms, ps_rpc_status *st)
{
    ps_rpc_status local;
    if (st == NULL)
        st = &local;
    memset(st, 0, sizeof *st);
    if (deadline_ms <= 0)
        deadline_ms = c->o.deadline_ms;
    int64_t start = ps_now_ms();
    int64_t backoff = c->o.backoff_initial_ms;
    for (int attempt = 1;; attempt++) {
        st->attempts = attempt;
        st->message[0] = '\0';
        grpc_byte_buffer *bb = make_bb(bb_ctx);
        if (bb == NULL) {
            set_status(st, PS_RPC_RESOURCE_EXHAUSTED, "%s: out of memory", method);
            return -ENOMEM;
        }
        int code = call_once(c, method, bb, out, deadline_ms, st);
        if (code == PS_RPC_OK)
            return out != NULL && out->fn_rc != 0 ? out->fn_rc : 0;
        if (code != PS_RPC_UNAVAILABLE || attempt >= c->o.max_attempts)
            break;
        /* Jitter around the exponential step: [0.5, 1.5) x backoff. */
        int64_t delay = backoff / 2 + (int64_t)(next_rand(c) % (uint64_t)(backoff > 0 ? backoff : 1));
        if (c->o.retry_budget_ms > 0 &&
            ps_now_ms() + delay - start >= c->o.retry_budget_ms)
            break;
        ps_log_debug("rpc: %s %s: UNAVAILABLE (%s); retry %d in %lld ms",
                     c->target, method, st->message, attempt,
                     (long long)delay);
        sleep_ms(delay);
        backoff = backoff * 2 > c->o.backoff_max_ms ? c->o.backoff_max_ms
                                                    : backoff * 2;
    }
    return PS_ERPC;
}

struct plain_req {
    const void *req;
    size_t len;
};

/* A copy of the caller's request, in a pooled buffer when it is big (as the
 * server's replies are): no fresh pages per call. */
static grpc_byte_buffer *plain_bb(void *ctx)
{
    struct plain_req *p = ctx;
    return ps_rpc_bb_copy(p->req, p->len);
}

int ps_rpc_invoke(ps_rpc_client *c, const char *method, const void *req,
                  size_t len, ps_buf *resp, int deadline_ms, ps_rpc_status *st)
{
    struct plain_req p = {req, len};
    struct sink out = {.buf = resp};
    return invoke(c, method, plain_bb, &p, &out, deadline_ms, st);
}

static grpc_byte_buffer *msg_bb(void *ctx)
{
    return ps_rpc_msg_byte_buffer(ctx);
}

int ps_rpc_invoke_msg(ps_rpc_client *c, const char *method, ps_rpc_msg *req,
                      ps_rpc_pieces_fn on_resp, void *ctx, int deadline_ms,
                      ps_rpc_status *st)
{
    struct sink out = {.fn = on_resp, .ctx = ctx};
    return invoke(c, method, msg_bb, req, &out, deadline_ms, st);
}

struct parts_req {
    const ps_rpc_part *parts;
    int n;
};

/* Each attempt's message holds its own references to the in-place parts. */
static grpc_byte_buffer *parts_bb(void *ctx)
{
    struct parts_req *p = ctx;
    for (int i = 0; i < p->n; i++)
        if (p->parts[i].release != NULL)
            ps_rpc_msg_ref(p->parts[i].arg);
    return ps_rpc_bb_parts(p->parts, p->n);
}

int ps_rpc_invoke_parts(ps_rpc_client *c, const char *method,
                        const ps_rpc_part *parts, int n, ps_rpc_pieces_fn on_resp,
                        void *ctx, int deadline_ms, ps_rpc_status *st)
{
    for (int i = 0; i < n; i++)
        if (parts[i].release != NULL && parts[i].release != ps_rpc_msg_release)
            return PS_EINVAL_ARG;
    struct parts_req p = {parts, n};
    struct sink out = {.fn = on_resp, .ctx = ctx};
    return invoke(c, method, parts_bb, &p, &out, deadline_ms, st);
}

/* ---- several calls in flight ------------------------------------------- */

/* One call of ps_rpc_invoke_window: its request, and what it receives. It
 * runs as two batches on the shared queue, the send (tagged with the slot
 * with its low bit set) and the receive (the slot), so that the window can
 * count the calls still sending apart from those waiting for an answer. */
struct slot {
    size_t i;             /* which request */
    int attempts;
    int pending;          /* batches not completed yet */
    bool sending;         /* its send batch has not completed */
    ps_rpc_part parts[PS_RPC_WINDOW_PARTS]; /* its request, kept for a retry */
    int np;
    grpc_call *call;
    grpc_byte_buffer *send_bb, *recv_bb;
    grpc_metadata_array init_md, trail_md;
    grpc_status_code code;
    grpc_slice details;
    const char *error_string;
};

/* Starts slot's call on cq: the send batch (its message and the close) and
 * the receive batch (the response and the status). Returns 0, or -1 with
 * st set and nothing left to undo. */
static int slot_start(ps_rpc_client *c, grpc_completion_queue *cq, const char *method,
                      struct slot *sl, int deadline_ms, ps_rpc_status *st)
{
    grpc_slice mslice = grpc_slice_from_copied_string(method);
    sl->call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                        mslice, NULL, deadline_after(deadline_ms),
                                        NULL);
    grpc_slice_unref(mslice);
    grpc_metadata_array_init(&sl->init_md);
    grpc_metadata_array_init(&sl->trail_md);
    for (int k = 0; k < sl->np; k++)
        ps_rpc_msg_ref(sl->parts[k].arg); /* the send's own, as parts_bb's */
    sl->send_bb = ps_rpc_bb_parts(sl->parts, sl->np);
    sl->recv_bb = NULL;
    sl->code = GRPC_STATUS_UNKNOWN;
    sl->details = grpc_empty_slice();
    sl->error_string = NULL;
    sl->pending = 0;
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    put_request_ops(c, ops, sl->send_bb, &sl->init_md);
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &sl->recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &sl->trail_md;
    ops[5].data.recv_status_on_client.status = &sl->code;
    ops[5].data.recv_status_on_client.status_details = &sl->details;
    ops[5].data.recv_status_on_client.error_string = &sl->error_string;
    grpc_call_error e = GRPC_CALL_ERROR;
    if (sl->send_bb != NULL &&
        (e = grpc_call_start_batch(sl->call, ops, 3, (void *)((uintptr_t)sl | 1),
                                   NULL)) == GRPC_CALL_OK) {
        sl->pending = 1;
        e = grpc_call_start_batch(sl->call, ops + 3, 3, sl, NULL);
        if (e == GRPC_CALL_OK)
            sl->pending = 2;
    }
    if (e == GRPC_CALL_OK)
        return 0;
    set_status(st, PS_RPC_INTERNAL, "%s: cannot start call (%d)", method, (int)e);
    /* A send batch already started completes (cancelled) on the queue. */
    if (sl->pending > 0) {
        grpc_call_cancel(sl->call, NULL);
        return -1;
    }
    grpc_metadata_array_destroy(&sl->init_md);
    grpc_metadata_array_destroy(&sl->trail_md);
    if (sl->send_bb != NULL)
        grpc_byte_buffer_destroy(sl->send_bb);
    grpc_call_unref(sl->call);
    sl->call = NULL;
    return -1;
}

/* Frees what slot_start made, once both its batches completed. */
static void slot_end(struct slot *sl)
{
    if (sl->error_string != NULL)
        gpr_free((void *)sl->error_string);
    grpc_slice_unref(sl->details);
    grpc_metadata_array_destroy(&sl->init_md);
    grpc_metadata_array_destroy(&sl->trail_md);
    if (sl->recv_bb != NULL)
        grpc_byte_buffer_destroy(sl->recv_bb);
    grpc_byte_buffer_destroy(sl->send_bb);
    grpc_call_unref(sl->call);
    sl->call = NULL;
}

struct window_resp {
    ps_rpc_resp_fn fn;
    void *ctx;
    size_t i;
};

static int window_pieces(void *ctx, const struct ps_piece *pieces, int np)
{
    struct window_resp *w = ctx;
    return w->fn(w->ctx, w->i, pieces, np);
}

/* What a completed call of the window comes to: 0 (its response taken),
 * 1 to send it again, or the error (st set). */
static int slot_result(ps_rpc_client *c, const char *method, struct slot *sl,
                       ps_rpc_resp_fn on_resp, void *ctx, ps_rpc_status *st)
{
    if (sl->code == GRPC_STATUS_OK && sl->recv_bb == NULL) {
        set_status(st, PS_RPC_INTERNAL, "%s: status OK but no response message",
                   method);
        return PS_ERPC;
    }
    if (sl->code == GRPC_STATUS_OK) {
        struct window_resp w = {on_resp, ctx, sl->i};
        return ps_rpc_bb_pieces(sl->recv_bb, window_pieces, &w);
    }
    if (sl->code == GRPC_STATUS_UNAVAILABLE && sl->attempts < c->o.max_attempts)
        return 1;
    take_status(st, sl->code, sl->details);
    if (st != NULL && st->message[0] == '\0' && sl->error_string != NULL)
        snprintf(st->message, sizeof st->message, "%s", sl->error_string);
    return PS_ERPC;
}

/* After the window's first failure: cancels the calls in flight, unless
 * the caller asked each call's outcome (codes), which they then give. */
static void cancel_all(struct slot *slots, size_t n, const int *codes)
{
    for (size_t k = 0; codes == NULL && k < n; k++)
        if (slots[k].call != NULL)
            grpc_call_cancel(slots[k].call, NULL);
}

/* Drops make's references to slot's parts: its call is over. */
static void slot_release(struct slot *sl)
{
    for (int k = 0; k < sl->np; k++)
        ps_rpc_msg_unref(sl->parts[k].arg);
    sl->np = 0;
}

/* The caller's status, or local, cleared for a call's first attempt; the
 * client's deadline for deadline_ms <= 0. */
static ps_rpc_status *status_begin(const ps_rpc_client *c, ps_rpc_status *st,
                                   ps_rpc_status *local, int *deadline_ms)
{
    if (st == NULL)
        st = local;
    memset(st, 0, sizeof *st);
    st->attempts = 1;
    if (*deadline_ms <= 0)
        *deadline_ms = c->o.deadline_ms;
    return st;
}

int ps_rpc_invoke_window(ps_rpc_client *c, const char *method, size_t n, int window,
                         bool by_answer, ps_rpc_make_fn make, ps_rpc_resp_fn on_resp,
                         void *ctx, int deadline_ms, ps_rpc_status *st, int *codes)
{
    ps_rpc_status local;
    st = status_begin(c, st, &local, &deadline_ms);
    if (window < 1)
        window = 1;
    for (size_t i = 0; codes != NULL && i < n; i++)
        codes[i] = -1;
    if (n == 0)
        return 0;
    struct slot *slots = calloc(n, sizeof *slots);
    if (slots == NULL)
        return -ENOMEM;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    size_t next = 0, active = 0;
    int sending = 0, rc = 0;
    bool made = false; /* request next is made, not started yet */
    int64_t backoff = c->o.backoff_initial_ms;
    while (active > 0 || (rc == 0 && next < n)) {
        bool room = (by_answer ? (int)active : sending) < window;
        if (rc == 0 && next < n && (room || !made)) {
            struct slot *sl = &slots[next];
            if (!made) {
                /* Made as soon as the one before is started, before this
                 * thread waits for the window: the making (a piece's
                 * rounding to half) overlaps the calls on the wire, and
                 * the call starts the moment the window has room. */
                *sl = (struct slot){.i = next, .attempts = 1};
                rc = make(ctx, next, sl->parts, &sl->np);
                made = rc == 0;
                if (rc != 0) {
                    slot_release(sl);
                    cancel_all(slots, next, codes);
                }
                continue;
            }
            made = false;
            if (slot_start(c, cq, method, sl, deadline_ms, st) != 0)
                rc = PS_ERPC;
            next++;
            if (sl->pending > 0) {
                active++;
                sending++;
                sl->sending = true;
            }
            if (rc != 0) {
                if (sl->pending == 0)
                    slot_release(sl);
                cancel_all(slots, next, codes);
            }
            continue;
        }
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                                   NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        struct slot *sl = (struct slot *)((uintptr_t)ev.tag & ~(uintptr_t)1);
        if ((uintptr_t)ev.tag & 1) {
            sending--;
            sl->sending = false;
        }
        if (--sl->pending > 0)
            continue;
        active--;
        int r = 0;
        if (rc == 0) {
            r = slot_result(c, method, sl, on_resp, ctx, st);
        } else if (codes != NULL && sl->code == GRPC_STATUS_OK && sl->recv_bb != NULL) {
            /* Answered after another call failed: still taken, for what
             * it says was done. */
            struct window_resp w = {on_resp, ctx, sl->i};
            (void)ps_rpc_bb_pieces(sl->recv_bb, window_pieces, &w);
        }
        if (codes != NULL)
            codes[sl->i] = (int)sl->code;
        slot_end(sl);
        if (r == 1) {
            /* UNAVAILABLE: the same message again after the backoff. */
            ps_log_debug("rpc: %s %s: UNAVAILABLE; call %zu again in %lld ms",
                         c->target, method, sl->i, (long long)backoff);
            sleep_ms(backoff);
            backoff = backoff * 2 > c->o.backoff_max_ms ? c->o.backoff_max_ms
                                                        : backoff * 2;
            sl->attempts++;
            if (sl->attempts > st->attempts)
                st->attempts = sl->attempts;
            r = slot_start(c, cq, method, sl, deadline_ms, st) == 0 ? 0 : PS_ERPC;
            if (sl->pending > 0) {
                active++;
                sending++;
                sl->sending = true;
            }
            if (r == 0)
                continue;
        }
        if (sl->pending == 0)
            slot_release(sl);
        if (r != 0 && rc == 0) {
            rc = r;
            cancel_all(slots, next, codes);
        }
    }
    if (made)
        slot_release(&slots[next]); /* made, then a call before it failed */
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                      NULL).type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    free(slots);
    return rc;
}

int ps_rpc_invoke_pb(ps_rpc_client *c, const char *method, const void *req_msg,
                   const void *resp_desc, void **resp_out, int deadline_ms,
                   ps_rpc_status *st)
{
    ps_rpc_status local;
    if (st == NULL)
        st = &local;
    const ProtobufCMessage *m = req_msg;
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(len ? len : 1);
    if (buf == NULL) {
        set_status(st, PS_RPC_RESOURCE_EXHAUSTED, "out of memory");
        return -ENOMEM;
    }
    protobuf_c_message_pack(m, buf);
    ps_buf resp = {0};
    int rc = ps_rpc_invoke(c, method, buf, len, &resp, deadline_ms, st);
    free(buf);
    if (rc == 0) {
        *resp_out = protobuf_c_message_unpack(resp_desc, NULL, resp.len,
                                              resp.data);
        if (*resp_out == NULL) {
            set_status(st, PS_RPC_INTERNAL,
                       "%s: the response (%zu bytes) does not parse", method,
                       resp.len);
            rc = PS_EPARSE;
        }
    }
    ps_buf_free(&resp);
    return rc;
}

int ps_rpc_invoke_stream(ps_rpc_client *c, const char *method, const void *req,
                       size_t len, int deadline_ms, ps_rpc_stream_fn on_msg,
                       void *ctx, ps_rpc_status *st)
{
    ps_rpc_status local;
    st = status_begin(c, st, &local, &deadline_ms);
    grpc_completion_queue *cq;
    grpc_call *call = start_call(c, method, deadline_ms, &cq);

    grpc_slice s = grpc_slice_malloc(len);
    if (len > 0)
        memcpy(GRPC_SLICE_START_PTR(s), req, len);
    grpc_byte_buffer *send_bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    ps_buf msg = {0};
    int stopped = 0;

    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    put_request_ops(c, ops, send_bb, &init_md);
    int tag_send = 1, tag_msg = 2, tag_status = 3;
    grpc_call_start_batch(call, ops, 4, &tag_send, NULL);
    grpc_completion_queue_pluck(cq, &tag_send,
                                gpr_inf_future(GPR_CLOCK_REALTIME), NULL);

    for (;;) {
        grpc_byte_buffer *bb = NULL;
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_RECV_MESSAGE;
        ops[0].data.recv_message.recv_message = &bb;
        grpc_call_start_batch(call, ops, 1, &tag_msg, NULL);
        grpc_event ev = grpc_completion_queue_pluck(
            cq, &tag_msg, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (!ev.success || bb == NULL)
            break;
        int rc = ps_rpc_bb_read(bb, &msg);
        grpc_byte_buffer_destroy(bb);
        if (rc != 0 || on_msg(ctx, msg.data, msg.len) != 0) {
            stopped = 1;
            grpc_call_cancel(call, NULL);
            break;
        }
    }
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[0].data.recv_status_on_client.status = &code;
    ops[0].data.recv_status_on_client.status_details = &details;
    grpc_call_start_batch(call, ops, 1, &tag_status, NULL);
    grpc_completion_queue_pluck(cq, &tag_status,
                                gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    take_status(st, code, details);
    if (stopped && code == GRPC_STATUS_CANCELLED)
        snprintf(st->message, sizeof st->message, "stopped by the reader");

    ps_buf_free(&msg);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_byte_buffer_destroy(send_bb);
    end_call(call, cq);
    return code == GRPC_STATUS_OK ? 0 : PS_ERPC;
}

int ps_rpc_health_check(ps_rpc_client *c, const char *service,
                        int deadline_ms, bool *serving, ps_rpc_status *st)
{
    Grpc__Health__V1__HealthCheckRequest req =
        GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)(service != NULL ? service : "");
    void *resp = NULL;
    int rc = ps_rpc_invoke_pb(c, "/grpc.health.v1.Health/Check", &req,
                            &grpc__health__v1__health_check_response__descriptor,
                            &resp, deadline_ms, st);
    if (rc != 0)
        return rc;
    Grpc__Health__V1__HealthCheckResponse *r = resp;
    *serving = r->status ==
               GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    grpc__health__v1__health_check_response__free_unpacked(r, NULL);
    return 0;
}
