/*
 * rpc_server_internal.h - the server's call state, shared by the two files
 * that implement the server half of rpc.h. Nothing else includes it.
 *
 *   rpc_server.c  the server: methods, completion-queue threads, starting
 *                 and shutting down, the health service's calls, and
 *                 handing each arriving call to its handler
 *   rpc_call.c    one call: its lifetime (references, freeing) and its
 *                 answer (reply, fail, stream writes, the final status)
 *
 * A call's life: a ps_rpc_call is allocated and requested from gRPC (tag
 * t_new). When a client's call arrives on it, rpc_server.c requests a fresh
 * one for the same method, counts the call in flight and has rpc_call_begin
 * start RECV_CLOSE_ON_SERVER (t_close) so that a cancellation is noticed;
 * then the payload is copied into the thread's reusable buffer and the
 * handler runs. The call holds two references: one for the close operation
 * and one for the answer; it is freed when both completions (t_close and
 * the final status batch, t_send) have come back, and the server is then
 * told (rpc_server_call_done) so that it counts one call fewer in flight.
 *
 * Threads and lifetime: a call's completions come back on the thread of the
 * completion queue it was requested on; its answer may be given from any
 * thread. The answer side is under c->mu; refs and cancelled are atomic.
 * Every function that starts a batch from outside the call's own
 * completion-queue thread holds a reference of its own while it does (see
 * rpc_call.c).
 */
#ifndef PS_RPC_SERVER_INTERNAL_H
#define PS_RPC_SERVER_INTERNAL_H

#include "common/rpc.h"

#include <grpc/grpc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum tag_kind { TAG_NEW, TAG_SEND, TAG_CLOSE, TAG_WRITE, TAG_SHUTDOWN };

/* A completion-queue tag: what completed, and for which object. */
struct tag {
    enum tag_kind kind;
    void *obj;
};

struct method {
    char *path;
    char *service; /* "ps.v1.ParameterServer" */
    enum ps_rpc_kind kind;
    ps_rpc_handler fn;
    ps_rpc_pieces_handler pfn; /* instead of fn: the request in pieces */
    void *ctx;
    void *handle; /* from grpc_server_register_method */
};

struct cq_thread; /* rpc_server.c's */

/* A stream message waiting for the write before it to complete. */
struct outmsg {
    struct outmsg *next;
    grpc_byte_buffer *bb;
};

struct ps_rpc_call {
    struct tag t_new, t_send, t_close, t_write;
    ps_rpc_server *srv;
    struct method *m; /* NULL: an unregistered method */
    struct cq_thread *thr;
    grpc_call *call;
    gpr_timespec deadline;
    int64_t deadline_ms;
    grpc_metadata_array md;
    grpc_call_details details; /* unregistered calls only */
    grpc_byte_buffer *payload;
    int close_cancelled; /* written by gRPC when t_close completes */
    atomic_bool cancelled;
    atomic_int refs;
    char *peer;
    char path[256];

    /* Answer side, under mu (streams write from several threads). */
    pthread_mutex_t mu;
    grpc_byte_buffer *send_bb;
    grpc_slice status_details;
    bool have_details;
    bool md_sent;
    bool ended;           /* reply/fail/finish was called */
    bool write_in_flight;
    bool status_sent;
    enum ps_rpc_code finish_code;
    char *finish_msg;
    struct outmsg *q_head, *q_tail;
    grpc_byte_buffer *write_bb;

    bool is_health_watcher; /* a Watch call: health.c may list it */

    /* The peer over the unix socket, noted as the call arrives
     * (ps_rpc_call_peer_cred): 1 known, -1 not a unix-socket call. */
    int cred_state;
    ps_rpc_peer_cred cred;
};

/* ---- rpc_call.c ------------------------------------------------------- */

/* A call to request from gRPC for method m (NULL: any unregistered one) on
 * thr's queue, holding no reference yet. NULL when out of memory. */
ps_rpc_call *rpc_call_new(ps_rpc_server *srv, struct method *m,
                          struct cq_thread *thr);

/* Frees everything of a call that never arrived (its request failed, or
 * the server shut down), or whose last reference went. */
void rpc_call_free(ps_rpc_call *c);

/* Drops a reference; the last one frees the call and tells the server. */
void rpc_call_unref(ps_rpc_call *c);

/* For a call that arrived: takes its two references, notes its method path
 * and deadline, and starts watching for its close (t_close). */
void rpc_call_begin(ps_rpc_call *c);

/* t_write completed (ok false: the stream is gone). */
void rpc_call_write_done(ps_rpc_call *c, bool ok);

/* ---- rpc_server.c ----------------------------------------------------- */

/* A call of srv was freed: one call fewer in flight. */
void rpc_server_call_done(ps_rpc_server *srv);
/* The token table srv checks calls against (opts.auth); NULL: none. */
struct ps_auth *rpc_server_auth(ps_rpc_server *srv);
/* opts.fd_channel_role for a call over the unix socket from psd's uid or
 * root (its peer's SO_PEERCRED); 0 (none) for any other call. */
int rpc_server_fd_role(ps_rpc_call *c);
/* A call of srv was failed with code (ps_rpc_server_failures). */
void rpc_server_count_failure(ps_rpc_server *srv, int code);

#endif
