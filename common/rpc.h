/*
 * rpc.h - the gRPC-core plumbing every process shares: a server over
 * completion queues, a blocking client with deadlines and retry, and the
 * standard grpc.health.v1 service answered by every server.
 *
 * Messages cross this interface as serialized protobuf bytes, so nothing
 * outside rpc_server.c, rpc_call.c, rpc_client.c and rpc_slice.c includes a
 * gRPC header. Status codes are in rpc_code.h, pooled messages and the pieces
 * and parts messages travel in are in rpc_msg.h, the health service's state
 * is health.c's.
 *
 * Server model. Each method is registered with a path ("/ps.v1.
 * ParameterServer/Push") and a handler. The server runs `threads`
 * completion-queue threads; each keeps a few calls requested for every method,
 * so calls are spread over the threads. When a call arrives, the handler runs
 * on that thread with the request bytes. It answers exactly once, with
 * ps_rpc_reply*() or ps_rpc_fail(), at once or later from any thread (a Pull
 * that waits for a version answers when the version arrives). A
 * server-streaming handler writes any number of messages with
 * ps_rpc_stream_write() and ends with ps_rpc_stream_finish() or ps_rpc_fail().
 * Unknown methods are answered UNIMPLEMENTED with the method's name.
 *
 * Threads and lifetime:
 * - The request bytes passed to a handler are valid only until the handler
 *   returns (they live in a per-thread buffer that is reused for the next
 *   call). A handler that answers later copies what it needs.
 * - A ps_rpc_call is valid from the handler's start until the call that ends
 *   it (reply, fail, stream_finish) returns; after that it must not be used.
 *   Every call must be ended exactly once, even one the client cancelled:
 *   ps_rpc_call_cancelled() tells a waiting handler to give up.
 * - ps_rpc_server_shutdown() stops taking calls, waits up to its grace period
 *   for calls in flight to be answered, then cancels the rest. Handlers that
 *   answer later must be told to answer (e.g. UNAVAILABLE) before or during
 *   the grace period, or they are cancelled.
 * - A client may be used from several threads at once; each call is
 *   independent. ps_buf responses belong to the caller.
 */
#ifndef PS_RPC_H
#define PS_RPC_H

#include "common/buf.h"
#include "common/rpc_code.h"
#include "common/rpc_msg.h"
#include "common/tls.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Default message-size limit for both directions: 1 GiB, so that no tensor
 * meets gRPC's 4 MiB default. The hard ceiling is INT32_MAX (gRPC's own). */
#define PS_RPC_DEFAULT_MAX_MESSAGE ((size_t)1 << 30)
#define PS_RPC_MAX_MESSAGE_CEILING ((size_t)INT32_MAX)

/* ---- Server ---------------------------------------------------------- */

typedef struct ps_rpc_server ps_rpc_server;
typedef struct ps_rpc_call ps_rpc_call;

enum ps_rpc_kind {
    PS_RPC_UNARY,
    PS_RPC_SERVER_STREAM,
};

typedef void (*ps_rpc_handler)(ps_rpc_call *call, const uint8_t *req,
                               size_t len, void *ctx);

/* A unary handler that takes the request as the pieces gRPC received it in
 * (borrowed until it returns), for decoders that read across pieces and so
 * never join a big request into one buffer. */
typedef void (*ps_rpc_pieces_handler)(ps_rpc_call *call,
                                      const struct ps_piece *pieces, int np,
                                      void *ctx);

typedef struct ps_rpc_server_opts {
    const char *listen;       /* "127.0.0.1:0", "[::]:7000"; port 0 = any */
    const char *listen_also;  /* a second address, e.g. "unix:/run/psd.sock"
                                 for clients on this host; NULL = none */
    int threads;              /* completion-queue threads; 0 = 2 */
    size_t max_message_bytes; /* 0 = PS_RPC_DEFAULT_MAX_MESSAGE */
    int max_streams;          /* calls in flight per connection (HTTP/2
                                 SETTINGS_MAX_CONCURRENT_STREAMS: a client
                                 queues the ones beyond); 0 = gRPC's, none */
    /* Connections and their timeouts (issue 13 d); 0 = none. A unix
     * listen_also is accepted by the server itself (rpc_local.h): it knows
     * each connection's peer (ps_rpc_call_peer_cred), holds at most
     * max_connections open and survives running out of descriptors. */
    int max_connections;      /* on the unix socket */
    int handshake_timeout_ms; /* a connection's HTTP/2 preface must come
                                 within this (GRPC_ARG_SERVER_HANDSHAKE_...;
                                 on the unix socket, rpc_local.h) */
    int idle_timeout_ms;      /* a connection with no call for this long is
                                 closed (GRPC_ARG_MAX_CONNECTION_IDLE_MS) */
    int keepalive_ms;         /* pings an idle connection this often and
                                 closes it when unanswered for as long */
    const ps_tls_opts *tls;   /* TLS of the listen address (tls.h), read at
                                 start; NULL or no certificate = plaintext.
                                 A unix: address is always plaintext. */
    struct ps_auth *auth;     /* tokens and roles (common/auth.h) checked on
                                 every call of every listener, kept not owned
                                 (it must outlive the server); NULL: open */
    int fd_channel_role;      /* with auth: the role (enum ps_auth_role) a
                                 call without a token gets on a channel added
                                 from a file descriptor whose peer was
                                 checked (psd's unix socket, SO_PEERCRED);
                                 0: none, such a call needs a token too */
} ps_rpc_server_opts;

/* Creates a server; nothing listens until ps_rpc_server_start. Returns 0,
 * PS_EINVAL_ARG for bad options, -ENOMEM. */
int ps_rpc_server_create(const ps_rpc_server_opts *opts, ps_rpc_server **out);

/* Registers a method before start. `path` is "/package.Service/Method" and
 * is copied. Returns 0, PS_EINVAL_ARG (bad path, after start), PS_EEXIST. */
int ps_rpc_server_add_method(ps_rpc_server *srv, const char *path,
                             enum ps_rpc_kind kind, ps_rpc_handler fn,
                             void *ctx);

/* Registers a unary method whose handler takes the request in pieces. */
int ps_rpc_server_add_method_pieces(ps_rpc_server *srv, const char *path,
                                    ps_rpc_pieces_handler fn, void *ctx);

/* Binds, starts the threads and marks every registered service and "" as
 * SERVING. *port_out (may be NULL) receives the bound port. Returns 0,
 * -EADDRINUSE when the address cannot be bound, PS_EINVAL_ARG. */
int ps_rpc_server_start(ps_rpc_server *srv, int *port_out);

/* Sets a service's health status ("" = the whole server). Watchers are told. */
void ps_rpc_server_set_serving(ps_rpc_server *srv, const char *service,
                               bool serving);

/* Graceful stop: health NOT_SERVING, no new calls, up to grace_ms for calls
 * in flight, then the rest cancelled; joins the threads. Idempotent. */
void ps_rpc_server_shutdown(ps_rpc_server *srv, int grace_ms);

/* Shuts down (with no grace) if needed and frees. NULL is a no-op. */
void ps_rpc_server_destroy(ps_rpc_server *srv);

/* The unix socket's connections (listen_also "unix:..."): open now, and
 * refused since start (over max_connections, or at the descriptor limit).
 * 0 without one. */
int ps_rpc_server_local_open(const ps_rpc_server *srv);
uint64_t ps_rpc_server_local_refused(const ps_rpc_server *srv);

/* Calls answered since start, and calls in flight now. */
uint64_t ps_rpc_server_calls_total(const ps_rpc_server *srv);
int ps_rpc_server_calls_in_flight(const ps_rpc_server *srv);
/* How long every completion-queue thread has been inside a handler, in ms
 * (the shortest of their times); 0 while one of them is free. gRPC's
 * listener accepts on those threads: while this is above 0 a new
 * connection waits in the accept queue. */
int64_t ps_rpc_server_busy_ms(const ps_rpc_server *srv);
/* Calls ended with status `code` (enum ps_rpc_code) by ps_rpc_fail since
 * start, and those the token check refused before any handler: a daemon's
 * /metrics reports them as refused, by reason. 0 for a code outside
 * 1..16. */
uint64_t ps_rpc_server_failures(const ps_rpc_server *srv, int code);

/* ---- Answering a call (any thread, exactly once) ---------------------- */

/* Sends `len` bytes as the response and status OK. Returns 0 or -ENOMEM
 * (the call is then failed with INTERNAL). */
int ps_rpc_reply(ps_rpc_call *call, const void *msg, size_t len);

/* Serializes a protobuf-c message straight into the outgoing buffer (one
 * copy of its bytes fields) and sends it with status OK. `msg` is a
 * const ProtobufCMessage *; it stays the caller's. */
int ps_rpc_reply_pb(ps_rpc_call *call, const void *msg);

/* Sends the concatenation of parts[0..n) as the response, the parts that
 * have a release function in place (see ps_rpc_part). Unary calls only.
 * Returns 0 or -ENOMEM (the call is then failed with RESOURCE_EXHAUSTED). */
int ps_rpc_reply_parts(ps_rpc_call *call, const ps_rpc_part *parts, int n);

/* Ends the call with a non-OK status and a message naming the problem.
 * Works for unary and streaming calls. Logs at debug level. */
void ps_rpc_fail(ps_rpc_call *call, enum ps_rpc_code code, const char *fmt,
                 ...) __attribute__((format(printf, 3, 4)));
void ps_rpc_vfail(ps_rpc_call *call, enum ps_rpc_code code, const char *fmt,
                  va_list ap) __attribute__((format(printf, 3, 0)));

/* Streaming: queues one message (copied; sent in order). Returns 0,
 * PS_ESHUTDOWN if the call was cancelled, -ENOMEM. */
int ps_rpc_stream_write(ps_rpc_call *call, const void *msg, size_t len);
int ps_rpc_stream_write_pb(ps_rpc_call *call, const void *msg);
/* Ends a stream with OK once every queued message is sent. */
void ps_rpc_stream_finish(ps_rpc_call *call);

/* The call's deadline in ms on CLOCK_MONOTONIC (ps_now_ms, clock.h), INT64_MAX if the
 * client set none. */
int64_t ps_rpc_call_deadline_ms(const ps_rpc_call *call);
/* True once the client cancelled or the deadline passed. */
bool ps_rpc_call_cancelled(const ps_rpc_call *call);
/* The full method path of the call ("/ps.v1.ParameterServer/Push"). */
const char *ps_rpc_call_method(const ps_rpc_call *call);
/* The role of the token the call sent (enum ps_auth_role, common/auth.h),
 * looked up again from its authorization metadata; PS_AUTH_NONE (0) on a
 * server without tokens, and for a call admitted without a token by a
 * trusted transport's implicit role. */
int ps_rpc_call_role(ps_rpc_call *call);
/* The client's address ("ipv4:127.0.0.1:51234"), for logs. Valid while the
 * call is. */
const char *ps_rpc_call_peer(ps_rpc_call *call);

/* Who is at the other end of a call over the server's unix socket (its
 * listen_also): the connecting process as the kernel saw it at connect()
 * (SO_PEERCRED), so that it cannot be claimed by the request. */
typedef struct ps_rpc_peer_cred {
    pid_t pid;      /* in the server's pid namespace */
    uid_t uid;
    gid_t gid;
    uint64_t start; /* the process's start time, clock ticks since boot
                       (/proc/PID/stat field 22): with pid, one process for
                       the life of the host; 0 if it had exited already */
    uint64_t conn;  /* the connection's number, unique in the server */
} ps_rpc_peer_cred;

/* 0 with *out for a call that came over the unix socket; -ENOENT for any
 * other (TCP, or gRPC's own unix listener). */
int ps_rpc_call_peer_cred(ps_rpc_call *call, ps_rpc_peer_cred *out);

/* ---- Client ---------------------------------------------------------- */

typedef struct ps_rpc_client ps_rpc_client;

typedef struct ps_rpc_client_opts {
    int deadline_ms;          /* per attempt; 0 = 10000 */
    int max_attempts;         /* on UNAVAILABLE; 0 = 1 (no retry) */
    int backoff_initial_ms;   /* 0 = 50 */
    int backoff_max_ms;       /* 0 = 2000 */
    int64_t retry_budget_ms;  /* total time for all attempts; 0 = no limit
                                 beyond max_attempts */
    size_t max_message_bytes; /* 0 = PS_RPC_DEFAULT_MAX_MESSAGE */
    const ps_tls_opts *tls;   /* TLS to the target (tls.h), read at create;
                                 NULL = the process default
                                 (ps_tls_set_client_default). A unix: target
                                 is always plaintext. */
    const char *token;        /* sent as "authorization: Bearer TOKEN" with
                                 every call (copied); NULL or "": none */
} ps_rpc_client_opts;

typedef struct ps_rpc_status {
    int code;           /* enum ps_rpc_code */
    char message[512];  /* the server's message, or ours for local errors */
    int attempts;       /* how many attempts were made */
} ps_rpc_status;

/* Creates a client for "host:port" (any gRPC target). The connection is
 * made lazily. Returns 0, PS_EINVAL_ARG, -ENOMEM, or PS_EINVAL_ARG when a
 * TLS file cannot be read (logged as an error naming it). */
int ps_rpc_client_create(const char *target, const ps_rpc_client_opts *opts,
                         ps_rpc_client **out);
void ps_rpc_client_destroy(ps_rpc_client *c);
const char *ps_rpc_client_target(const ps_rpc_client *c);

/* A unary call. The response bytes land in `resp` (reused, resized as
 * needed). deadline_ms 0 uses the client's default. UNAVAILABLE is retried
 * with exponential backoff and jitter as the options allow. Returns 0 when
 * the status is OK, PS_ERPC with *st filled otherwise (st may be NULL). */
int ps_rpc_invoke(ps_rpc_client *c, const char *method, const void *req,
                size_t len, ps_buf *resp, int deadline_ms, ps_rpc_status *st);

/* As ps_rpc_invoke, sending a pooled message (not consumed: the caller
 * still unrefs it) and handing the response to on_resp as borrowed pieces
 * (no copy); on_resp's nonzero return is returned. */
int ps_rpc_invoke_msg(ps_rpc_client *c, const char *method, ps_rpc_msg *req,
                      ps_rpc_pieces_fn on_resp, void *ctx, int deadline_ms,
                      ps_rpc_status *st);

/* As ps_rpc_invoke_msg, sending the concatenation of parts: the parts with
 * no release function are copied; the others must have release ==
 * ps_rpc_msg_release and arg the ps_rpc_msg their bytes lie in, and are
 * sent in place (each attempt takes its own reference; the caller keeps
 * its own and must not write those bytes while ps_rpc_msg_shared). */
int ps_rpc_invoke_parts(ps_rpc_client *c, const char *method,
                        const ps_rpc_part *parts, int n, ps_rpc_pieces_fn on_resp,
                        void *ctx, int deadline_ms, ps_rpc_status *st);

/* Up to `window` unary calls of one method sending at once (HTTP/2
 * streams of the one connection), for a message cut in pieces: make(ctx,
 * i, parts, &np) gives request i (0 <= i < n, in order) as at most
 * PS_RPC_WINDOW_PARTS parts, each sent in place (release ==
 * ps_rpc_msg_release, arg the message its bytes lie in, whose reference
 * passes to the window: it drops it once the call is over), on this thread
 * as soon as the call before it has started, ahead of the window's room,
 * so that building one overlaps the calls on the wire and it starts the
 * moment the window lets it; on_resp(ctx, i, pieces, np) takes response i when it
 * arrives (in any order), on this thread, borrowed as ps_rpc_invoke_msg's
 * are. The window counts the calls still sending (a call whose request is
 * out waits for its answer without holding the next back: pushes, whose
 * requests are the big part), or with by_answer the calls not answered yet
 * (pulls, whose requests are small and answers big: a few answers streaming
 * at once on the link finish one after another, not all at the end). A call answered
 * UNAVAILABLE is sent again with the same parts as the client's options
 * allow (max_attempts, backoff). The first failure stops the lot: no call
 * starts after it, the ones in flight are cancelled and waited for. With
 * codes (n entries, else NULL) the ones in flight are not cancelled but
 * answered, each answered OK still taken by on_resp, and codes[i] says how
 * call i ended: -1 not started, else the status code of its last attempt
 * (PS_RPC_OK: answered OK), so that a push knows which pieces psd applied.
 * Returns 0, PS_ERPC with *st (the failed call's status), make's or
 * on_resp's nonzero return, or -ENOMEM. */
#define PS_RPC_WINDOW_PARTS 4
typedef int (*ps_rpc_make_fn)(void *ctx, size_t i, ps_rpc_part *parts, int *np);
typedef int (*ps_rpc_resp_fn)(void *ctx, size_t i, const struct ps_piece *pieces,
                              int np);
int ps_rpc_invoke_window(ps_rpc_client *c, const char *method, size_t n, int window,
                         bool by_answer, ps_rpc_make_fn make, ps_rpc_resp_fn on_resp,
                         void *ctx, int deadline_ms, ps_rpc_status *st, int *codes);

/* Packs a protobuf-c request, calls, and unpacks the response with
 * `resp_desc` (a const ProtobufCMessageDescriptor *) into *resp_out, which
 * the caller frees with protobuf_c_message_free_unpacked. A response that
 * does not parse is PS_EPARSE with st->code INTERNAL. */
int ps_rpc_invoke_pb(ps_rpc_client *c, const char *method, const void *req_msg,
                   const void *resp_desc, void **resp_out, int deadline_ms,
                   ps_rpc_status *st);

/* A server-streaming call: on_msg runs for each message (bytes valid during
 * the callback); a nonzero return cancels the call. Returns as ps_rpc_invoke.
 * Not retried. */
typedef int (*ps_rpc_stream_fn)(void *ctx, const uint8_t *msg, size_t len);
int ps_rpc_invoke_stream(ps_rpc_client *c, const char *method, const void *req,
                       size_t len, int deadline_ms, ps_rpc_stream_fn on_msg,
                       void *ctx, ps_rpc_status *st);

/* grpc.health.v1.Health/Check: 0 and *serving set, or PS_ERPC. */
int ps_rpc_health_check(ps_rpc_client *c, const char *service,
                        int deadline_ms, bool *serving, ps_rpc_status *st);

/* ---- Logging ----------------------------------------------------------- */

/* Sends gRPC's own log output through ps_log at debug level. Called by the
 * server and client constructors; idempotent. */
void ps_rpc_init_logging(void);

#endif
