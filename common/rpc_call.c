/*
 * rpc_call.c - one server call: its lifetime (references, freeing) and its
 * answer (reply, fail, stream writes and the final status). See
 * rpc_server_internal.h for a call's life and rpc.h for the model.
 */
#include "common/rpc_server_internal.h"

#include "common/auth.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/rpc_slice.h"

#include <protobuf-c/protobuf-c.h>

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void fill_pb(void *ctx, uint8_t *dst)
{
    protobuf_c_message_pack(ctx, dst);
}

/* Packs straight into the outgoing buffer: the message's bytes fields are
 * copied once, into pooled (warm) memory for big messages. */
static grpc_byte_buffer *make_bb_pb(const ProtobufCMessage *msg)
{
    return ps_rpc_bb_fill(protobuf_c_message_get_packed_size(msg), fill_pb,
                          (void *)msg);
}

/* ---- call lifetime ---------------------------------------------------- */

ps_rpc_call *rpc_call_new(ps_rpc_server *srv, struct method *m,
                          struct cq_thread *thr)
{
    ps_rpc_call *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->srv = srv;
    c->m = m;
    c->thr = thr;
    c->t_new = (struct tag){TAG_NEW, c};
    c->t_send = (struct tag){TAG_SEND, c};
    c->t_close = (struct tag){TAG_CLOSE, c};
    c->t_write = (struct tag){TAG_WRITE, c};
    grpc_metadata_array_init(&c->md);
    grpc_call_details_init(&c->details);
    pthread_mutex_init(&c->mu, NULL);
    atomic_init(&c->refs, 0);
    atomic_init(&c->cancelled, false);
    return c;
}

/* Drops the stream messages not sent yet. */
static void drop_queue(ps_rpc_call *c)
{
    for (struct outmsg *o = c->q_head, *next; o != NULL; o = next) {
        next = o->next;
        grpc_byte_buffer_destroy(o->bb);
        free(o);
    }
    c->q_head = c->q_tail = NULL;
}

/* Frees everything of a call; the last reference's holder calls it. */
void rpc_call_free(ps_rpc_call *c)
{
    if (c->call != NULL)
        grpc_call_unref(c->call);
    grpc_metadata_array_destroy(&c->md);
    grpc_call_details_destroy(&c->details);
    if (c->payload != NULL)
        grpc_byte_buffer_destroy(c->payload);
    if (c->send_bb != NULL)
        grpc_byte_buffer_destroy(c->send_bb);
    if (c->write_bb != NULL)
        grpc_byte_buffer_destroy(c->write_bb);
    if (c->have_details)
        grpc_slice_unref(c->status_details);
    drop_queue(c);
    if (c->peer != NULL)
        gpr_free(c->peer);
    free(c->finish_msg);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void rpc_call_unref(ps_rpc_call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    ps_rpc_server *srv = c->srv;
    rpc_call_free(c);
    rpc_server_call_done(srv);
}

/* Called on the call's completion-queue thread when it arrives, before its
 * handler runs. */
void rpc_call_begin(ps_rpc_call *c)
{
    atomic_store(&c->refs, 2);
    if (c->m != NULL) {
        snprintf(c->path, sizeof c->path, "%s", c->m->path);
    } else {
        char *m = grpc_slice_to_c_string(c->details.method);
        snprintf(c->path, sizeof c->path, "%s", m);
        gpr_free(m);
        c->deadline = c->details.deadline;
    }
    if (gpr_time_cmp(c->deadline, gpr_inf_future(c->deadline.clock_type)) == 0) {
        c->deadline_ms = INT64_MAX;
    } else {
        gpr_timespec left = gpr_time_sub(c->deadline,
                                         gpr_now(c->deadline.clock_type));
        c->deadline_ms = ps_now_ms() + gpr_time_to_millis(left);
    }

    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) !=
        GRPC_CALL_OK) {
        ps_log_error("rpc: %s: cannot watch for close", c->path);
        atomic_fetch_sub(&c->refs, 1);
    }
}

/* Puts the initial metadata first in a batch's ops unless it went already.
 * Returns how many ops it used (0 or 1). Called with c->mu held. */
static size_t put_initial_md_locked(ps_rpc_call *c, grpc_op *ops)
{
    if (c->md_sent)
        return 0;
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->md_sent = true;
    return 1;
}

/* Starts a batch of the call's answer. Returns false, after the error line
 * naming what failed, if gRPC refused it. */
static bool start_batch(ps_rpc_call *c, const grpc_op *ops, size_t n,
                        struct tag *t, const char *what)
{
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, t, NULL);
    if (e == GRPC_CALL_OK)
        return true;
    ps_log_error("rpc: %s: %s failed (%d)", c->path, what, (int)e);
    return false;
}

/* Sends the final status (with initial metadata if none went yet). Called
 * with c->mu held, once no write is in flight. Returns false if gRPC refused
 * the batch: the caller then drops the answer's reference after unlocking. */
static bool send_status_locked(ps_rpc_call *c)
{
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = put_initial_md_locked(c, ops);
    c->status_details =
        grpc_slice_from_copied_string(c->finish_msg ? c->finish_msg : "");
    c->have_details = true;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status =
        (grpc_status_code)c->finish_code;
    ops[n].data.send_status_from_server.status_details =
        c->finish_code == PS_RPC_OK ? NULL : &c->status_details;
    n++;
    c->status_sent = true;
    return start_batch(c, ops, n, &c->t_send, "sending status");
}

/* Starts the next queued stream message. Called with c->mu held. */
static void start_write_locked(ps_rpc_call *c)
{
    struct outmsg *o = c->q_head;
    c->q_head = o->next;
    if (c->q_head == NULL)
        c->q_tail = NULL;
    c->write_bb = o->bb;
    free(o);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = put_initial_md_locked(c, ops);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = c->write_bb;
    n++;
    c->write_in_flight = true;
    if (!start_batch(c, ops, n, &c->t_write, "stream write")) {
        c->write_in_flight = false;
        grpc_byte_buffer_destroy(c->write_bb);
        c->write_bb = NULL;
    }
}

void rpc_call_write_done(ps_rpc_call *c, bool ok)
{
    pthread_mutex_lock(&c->mu);
    grpc_byte_buffer_destroy(c->write_bb);
    c->write_bb = NULL;
    c->write_in_flight = false;
    if (!ok) {
        /* The stream is gone: drop what is queued. */
        drop_queue(c);
        atomic_store(&c->cancelled, true);
    }
    bool sent = true;
    if (c->q_head != NULL)
        start_write_locked(c);
    else if (c->ended && !c->status_sent)
        sent = send_status_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (!sent)
        rpc_call_unref(c);
}

/* Marks the call ended with a status and sends it when the queue is empty.
 *
 * Every function that starts a batch from outside the call's own
 * completion-queue thread holds a reference of its own while it does: the
 * batch may complete on that thread, and the call be freed, before this
 * thread unlocks c->mu (a client that went away fails the send at once). */
static void finish_call(ps_rpc_call *c, enum ps_rpc_code code, char *msg)
{
    atomic_fetch_add(&c->refs, 1);
    pthread_mutex_lock(&c->mu);
    if (c->ended) {
        pthread_mutex_unlock(&c->mu);
        ps_log_error("rpc: %s: answered twice (ignored)", c->path);
        free(msg);
        rpc_call_unref(c);
        return;
    }
    c->ended = true;
    c->finish_code = code;
    c->finish_msg = msg;
    if (code != PS_RPC_OK) {
        /* An error ends a stream at once; queued messages are dropped. */
        drop_queue(c);
    }
    bool sent = true;
    if (!c->write_in_flight && c->q_head == NULL)
        sent = send_status_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (!sent)
        rpc_call_unref(c);
    rpc_call_unref(c);
}

/* ---- answering -------------------------------------------------------- */

static int reply_bb(ps_rpc_call *c, grpc_byte_buffer *bb)
{
    if (bb == NULL) {
        ps_rpc_fail(c, PS_RPC_RESOURCE_EXHAUSTED,
                    "out of memory building the response");
        return -ENOMEM;
    }
    atomic_fetch_add(&c->refs, 1); /* see finish_call */
    pthread_mutex_lock(&c->mu);
    if (c->ended) {
        pthread_mutex_unlock(&c->mu);
        grpc_byte_buffer_destroy(bb);
        ps_log_error("rpc: %s: answered twice (ignored)", c->path);
        rpc_call_unref(c);
        return PS_ECONFLICT;
    }
    c->ended = true;
    c->finish_code = PS_RPC_OK;
    c->send_bb = bb;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
    c->md_sent = true;
    c->status_sent = true;
    bool sent = start_batch(c, ops, 3, &c->t_send, "sending reply");
    pthread_mutex_unlock(&c->mu);
    if (!sent) {
        rpc_call_unref(c);
        rpc_call_unref(c);
        return PS_ERPC;
    }
    rpc_call_unref(c);
    return 0;
}

int ps_rpc_reply(ps_rpc_call *c, const void *msg, size_t len)
{
    if (c->m != NULL && c->m->kind == PS_RPC_SERVER_STREAM) {
        int rc = ps_rpc_stream_write(c, msg, len);
        ps_rpc_stream_finish(c);
        return rc;
    }
    return reply_bb(c, ps_rpc_bb_copy(msg, len));
}

int ps_rpc_reply_parts(ps_rpc_call *c, const ps_rpc_part *parts, int n)
{
    return reply_bb(c, ps_rpc_bb_parts(parts, n));
}

int ps_rpc_reply_pb(ps_rpc_call *c, const void *msg)
{
    if (c->m != NULL && c->m->kind == PS_RPC_SERVER_STREAM) {
        int rc = ps_rpc_stream_write_pb(c, msg);
        ps_rpc_stream_finish(c);
        return rc;
    }
    return reply_bb(c, make_bb_pb(msg));
}

void ps_rpc_vfail(ps_rpc_call *c, enum ps_rpc_code code, const char *fmt,
                  va_list ap)
{
    char *msg = NULL;
    if (vasprintf(&msg, fmt, ap) < 0)
        msg = NULL;
    if (code == PS_RPC_OK)
        code = PS_RPC_UNKNOWN;
    ps_log_debug("rpc: %s -> %s: %s", c->path, ps_rpc_code_name(code),
                 msg ? msg : "");
    rpc_server_count_failure(c->srv, code);
    finish_call(c, code, msg);
}

void ps_rpc_fail(ps_rpc_call *c, enum ps_rpc_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ps_rpc_vfail(c, code, fmt, ap);
    va_end(ap);
}

static int stream_write_bb(ps_rpc_call *c, grpc_byte_buffer *bb)
{
    if (bb == NULL)
        return -ENOMEM;
    struct outmsg *o = malloc(sizeof *o);
    if (o == NULL) {
        grpc_byte_buffer_destroy(bb);
        return -ENOMEM;
    }
    o->bb = bb;
    o->next = NULL;
    atomic_fetch_add(&c->refs, 1); /* see finish_call */
    pthread_mutex_lock(&c->mu);
    if (c->ended || atomic_load(&c->cancelled)) {
        pthread_mutex_unlock(&c->mu);
        grpc_byte_buffer_destroy(bb);
        free(o);
        rpc_call_unref(c);
        return PS_ESHUTDOWN;
    }
    if (c->q_tail != NULL)
        c->q_tail->next = o;
    else
        c->q_head = o;
    c->q_tail = o;
    if (!c->write_in_flight)
        start_write_locked(c);
    pthread_mutex_unlock(&c->mu);
    rpc_call_unref(c);
    return 0;
}

int ps_rpc_stream_write(ps_rpc_call *c, const void *msg, size_t len)
{
    return stream_write_bb(c, ps_rpc_bb_copy(msg, len));
}

int ps_rpc_stream_write_pb(ps_rpc_call *c, const void *msg)
{
    return stream_write_bb(c, make_bb_pb(msg));
}

void ps_rpc_stream_finish(ps_rpc_call *c)
{
    finish_call(c, PS_RPC_OK, NULL);
}

int64_t ps_rpc_call_deadline_ms(const ps_rpc_call *c)
{
    return c->deadline_ms;
}

bool ps_rpc_call_cancelled(const ps_rpc_call *c)
{
    return atomic_load(&c->cancelled) ||
           (c->deadline_ms != INT64_MAX && ps_now_ms() >= c->deadline_ms);
}

const char *ps_rpc_call_method(const ps_rpc_call *c)
{
    return c->path;
}

const char *ps_rpc_call_peer(ps_rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    if (c->peer == NULL)
        c->peer = grpc_call_get_peer(c->call);
    pthread_mutex_unlock(&c->mu);
    return c->peer;
}

/* The processor (auth.c) admitted the call; the role is looked up again
 * here from the call's own metadata, because gRPC 1.51 gives the processor
 * the connection's auth context, shared by every call on it, not one of
 * the call's own. */
int ps_rpc_call_role(ps_rpc_call *c)
{
    struct ps_auth *a = rpc_server_auth(c->srv);
    if (a == NULL)
        return PS_AUTH_NONE;
    for (size_t i = 0; i < c->md.count; i++) {
        const grpc_metadata *m = &c->md.metadata[i];
        size_t n = GRPC_SLICE_LENGTH(m->value);
        const char *v = (const char *)GRPC_SLICE_START_PTR(m->value);
        if (GRPC_SLICE_LENGTH(m->key) == 13 &&
            memcmp(GRPC_SLICE_START_PTR(m->key), "authorization", 13) == 0 &&
            n > 7 && strncasecmp(v, "Bearer ", 7) == 0)
            return ps_auth_lookup(a, v + 7, n - 7);
    }
    int r = rpc_server_fd_role(c);
    return r != 0 ? r : PS_AUTH_NONE;
}
