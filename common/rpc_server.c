/*
 * rpc_server.c - the gRPC-core server: methods, completion-queue threads,
 * starting and graceful shutdown, the calls of the health service (whose
 * table is health.c's), and handing each arriving call to its handler. A
 * call's own lifetime and answer are rpc_call.c's; rpc_server_internal.h
 * tells a call's life. See rpc.h for the model.
 */
#include "common/buf.h"
#include "common/rpc_server_internal.h"

#include "common/auth.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/health.h"
#include "common/log.h"
#include "common/rpc_local.h"
#include "common/rpc_slice.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Calls kept requested per method per thread: enough that a burst is
 * matched without waiting for the re-request after each arrival. */
#define REQUESTS_PER_METHOD 4
#define MAX_THREADS 64

struct cq_thread {
    ps_rpc_server *srv;
    int index;
    grpc_completion_queue *cq;
    pthread_t th;
    ps_buf buf; /* the request bytes of the call being handled */
    _Atomic int64_t busy_since; /* ps_now_ms() a handler began; 0: none */
};

struct ps_rpc_server {
    ps_rpc_server_opts opts;
    char *listen;
    char *listen_also; /* NULL: none */
    grpc_server *server;
    struct method *methods;
    int nmethods;
    struct cq_thread *threads;
    int nthreads;
    bool started;
    atomic_bool shutting_down;
    bool shutdown_done;
    bool destroyed_server;
    struct tag t_shutdown;
    pthread_mutex_t mu; /* shutdown state, in-flight count */
    pthread_cond_t cond;
    int in_flight;
    atomic_uint_fast64_t calls_total;
    atomic_uint_fast64_t failures[PS_RPC_UNAUTHENTICATED + 1]; /* by code */
    ps_health *health;
    rpc_local *local; /* the unix listen_also, accepted by us; NULL: none */
};

/* ---- small helpers ---------------------------------------------------- */

/* gRPC's own log lines (multi-line error trees) go through our logger at
 * debug level: the error that matters is reported by us, in one line. */
static void grpc_log_to_ps(gpr_log_func_args *args)
{
    ps_log_debug("grpc: %s:%d %s", args->file, args->line, args->message);
}

void ps_rpc_init_logging(void)
{
    gpr_set_log_function(grpc_log_to_ps);
}

/* Thread buffers bigger than this are freed after their call, so that
 * one huge request does not pin its size per thread for ever. */
#define KEEP_THREAD_BUF ((size_t)16 << 20)

/* ---- calls arriving --------------------------------------------------- */

static void request_call(ps_rpc_server *srv, struct method *m,
                         struct cq_thread *thr)
{
    if (atomic_load(&srv->shutting_down))
        return;
    ps_rpc_call *c = rpc_call_new(srv, m, thr);
    if (c == NULL) {
        ps_log_error("rpc: out of memory requesting a call");
        return;
    }
    grpc_call_error e;
    if (m != NULL) {
        e = grpc_server_request_registered_call(
            srv->server, m->handle, &c->call, &c->deadline, &c->md,
            &c->payload, thr->cq, thr->cq, &c->t_new);
    } else {
        e = grpc_server_request_call(srv->server, &c->call, &c->details,
                                     &c->md, thr->cq, thr->cq, &c->t_new);
    }
    if (e != GRPC_CALL_OK) {
        rpc_call_free(c);
        if (!atomic_load(&srv->shutting_down))
            ps_log_error("rpc: requesting a call failed (%d)", (int)e);
    }
}

void rpc_server_call_done(ps_rpc_server *srv)
{
    pthread_mutex_lock(&srv->mu);
    srv->in_flight--;
    pthread_cond_broadcast(&srv->cond);
    pthread_mutex_unlock(&srv->mu);
}

/* ---- health ----------------------------------------------------------- */

/* health.c decides what grpc.health.v1 answers; these answer the calls. */

static void health_send(void *watcher, const uint8_t *msg, size_t len)
{
    ps_rpc_stream_write(watcher, msg, len);
}

static void health_check(ps_rpc_call *call, const uint8_t *req, size_t len,
                         void *ctx)
{
    ps_rpc_server *srv = ctx;
    uint8_t out[PS_HEALTH_RESPONSE_MAX];
    size_t n = 0;
    char err[1024];
    int rc = ps_health_check(srv->health, req, len, out, &n, err, sizeof err);
    if (rc == 0)
        ps_rpc_reply(call, out, n);
    else
        ps_rpc_fail(call, ps_rpc_code_from_err(rc), "%s", err);
}

static void health_watch(ps_rpc_call *call, const uint8_t *req, size_t len,
                         void *ctx)
{
    ps_rpc_server *srv = ctx;
    char err[1024];
    /* Marked first: the watch may end (on_close) as soon as it is listed. */
    call->is_health_watcher = true;
    int rc = ps_health_watch(srv->health, call, req, len, err, sizeof err);
    if (rc != 0)
        ps_rpc_fail(call, ps_rpc_code_from_err(rc), "%s", err);
}

static void health_end(void *watcher, void *ctx)
{
    ps_rpc_fail(watcher, PS_RPC_UNAVAILABLE, "server is shutting down");
}

void ps_rpc_server_set_serving(ps_rpc_server *srv, const char *service,
                               bool serving)
{
    ps_health_set(srv->health, service, serving);
}

/* ---- the completion-queue threads ------------------------------------- */

struct pieces_call {
    ps_rpc_call *call;
    bool called;
};

static int pieces_call(void *ctx, const struct ps_piece *pieces, int np)
{
    struct pieces_call *pc = ctx;
    pc->called = true;
    pc->call->m->pfn(pc->call, pieces, np, pc->call->m->ctx);
    return 0;
}

/* The calls on a channel added from a file descriptor (its peer is
 * "fd:N") never pass gRPC 1.51's auth metadata processor (found by
 * experiment), so the token table is checked here again for every call:
 * for those it is the only check, for the others a second one. True when
 * the call may go on; otherwise it is answered. */
static bool admitted(ps_rpc_call *c)
{
    ps_rpc_server *srv = c->srv;
    if (srv->opts.auth == NULL)
        return true;
    const char *authz = NULL;
    size_t alen = 0;
    for (size_t i = 0; i < c->md.count; i++) {
        grpc_slice k = c->md.metadata[i].key;
        if (GRPC_SLICE_LENGTH(k) == 13 &&
            memcmp(GRPC_SLICE_START_PTR(k), "authorization", 13) == 0) {
            authz = (const char *)GRPC_SLICE_START_PTR(c->md.metadata[i].value);
            alen = GRPC_SLICE_LENGTH(c->md.metadata[i].value);
        }
    }
    int implicit = rpc_server_fd_role(c);
    int role;
    char msg[512];
    int code = ps_auth_decide(srv->opts.auth, c->path, authz, alen, implicit,
                              &role, msg, sizeof msg);
    if (code == 0)
        return true;
    ps_rpc_fail(c, (enum ps_rpc_code)code, "%s", msg);
    return false;
}

/* Runs the method's handler on the request, or answers the call itself
 * when there is none to run. */
static void dispatch(ps_rpc_call *c)
{
    ps_rpc_server *srv = c->srv;
    struct cq_thread *thr = c->thr;
    if (!admitted(c))
        return;
    if (c->m == NULL) {
        ps_rpc_fail(c, PS_RPC_UNIMPLEMENTED, "unknown method '%s'", c->path);
        return;
    }
    if (c->payload == NULL) {
        ps_rpc_fail(c, PS_RPC_INVALID_ARGUMENT,
                    "%s: the call carried no request message", c->path);
        return;
    }
    if (c->m->pfn != NULL) {
        struct pieces_call pc = {c, false};
        atomic_fetch_add(&srv->calls_total, 1);
        int rc = ps_rpc_bb_pieces(c->payload, pieces_call, &pc);
        grpc_byte_buffer_destroy(c->payload);
        c->payload = NULL;
        if (rc != 0 && !pc.called)
            ps_rpc_fail(c, PS_RPC_RESOURCE_EXHAUSTED,
                        "%s: cannot read the request: %s", c->path,
                        ps_strerror(rc));
        return;
    }
    int rc = ps_rpc_bb_read(c->payload, &thr->buf);
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    if (rc != 0) {
        ps_rpc_fail(c, PS_RPC_RESOURCE_EXHAUSTED,
                    "%s: cannot read the request: %s", c->path,
                    ps_strerror(rc));
        return;
    }
    atomic_fetch_add(&srv->calls_total, 1);
    c->m->fn(c, thr->buf.data, thr->buf.len, c->m->ctx);
    if (thr->buf.cap > KEEP_THREAD_BUF)
        ps_buf_free(&thr->buf);
}

/* Notes the credentials of a call over the unix socket as it arrives,
 * while its connection is surely still open (rpc_local.h). */
static void note_peer(ps_rpc_call *c)
{
    c->cred_state = -1;
    if (c->srv->local != NULL &&
        rpc_local_lookup(c->srv->local, ps_rpc_call_peer(c), &c->cred) == 0)
        c->cred_state = 1;
}

int ps_rpc_call_peer_cred(ps_rpc_call *call, ps_rpc_peer_cred *out)
{
    if (call->cred_state != 1)
        return -ENOENT;
    *out = call->cred;
    return 0;
}

/* A client's call arrived on c: another is requested in its place before
 * this one is handled, so that the method stays served meanwhile. */
static void on_new_call(ps_rpc_call *c)
{
    ps_rpc_server *srv = c->srv;
    note_peer(c);
    request_call(srv, c->m, c->thr);
    pthread_mutex_lock(&srv->mu);
    srv->in_flight++;
    pthread_mutex_unlock(&srv->mu);
    rpc_call_begin(c);
    atomic_store(&c->thr->busy_since, ps_now_ms());
    dispatch(c);
    atomic_store(&c->thr->busy_since, 0);
}

static void on_close(ps_rpc_call *c)
{
    if (c->close_cancelled)
        atomic_store(&c->cancelled, true);
    if (c->is_health_watcher && ps_health_unwatch(c->srv->health, c))
        ps_rpc_fail(c, PS_RPC_CANCELLED, "watch ended by the client");
    rpc_call_unref(c);
}

static void *cq_thread_main(void *arg)
{
    struct cq_thread *thr = arg;
    ps_rpc_server *srv = thr->srv;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(
            thr->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        struct tag *t = ev.tag;
        switch (t->kind) {
        case TAG_NEW:
            if (ev.success)
                on_new_call(t->obj);
            else
                rpc_call_free(t->obj); /* the server is shutting down */
            break;
        case TAG_SEND:
            rpc_call_unref(t->obj);
            break;
        case TAG_CLOSE:
            on_close(t->obj);
            break;
        case TAG_WRITE:
            rpc_call_write_done(t->obj, ev.success);
            break;
        case TAG_SHUTDOWN:
            pthread_mutex_lock(&srv->mu);
            srv->shutdown_done = true;
            pthread_cond_broadcast(&srv->cond);
            pthread_mutex_unlock(&srv->mu);
            break;
        }
    }
    return NULL;
}

/* ---- server ----------------------------------------------------------- */

int ps_rpc_server_create(const ps_rpc_server_opts *opts, ps_rpc_server **out)
{
    if (opts == NULL || opts->listen == NULL || opts->listen[0] == '\0' ||
        opts->threads < 0 || opts->threads > MAX_THREADS || opts->max_streams < 0 ||
        opts->max_connections < 0 || opts->handshake_timeout_ms < 0 ||
        opts->idle_timeout_ms < 0 || opts->keepalive_ms < 0 ||
        opts->max_message_bytes > PS_RPC_MAX_MESSAGE_CEILING)
        return PS_EINVAL_ARG;
    ps_rpc_server *srv = calloc(1, sizeof *srv);
    if (srv == NULL)
        return -ENOMEM;
    srv->opts = *opts;
    if (srv->opts.threads == 0)
        srv->opts.threads = 2;
    if (srv->opts.max_message_bytes == 0)
        srv->opts.max_message_bytes = PS_RPC_DEFAULT_MAX_MESSAGE;
    srv->listen = strdup(opts->listen);
    srv->listen_also = opts->listen_also ? strdup(opts->listen_also) : NULL;
    if (srv->listen == NULL || (opts->listen_also && srv->listen_also == NULL)) {
        free(srv->listen);
        free(srv->listen_also);
        free(srv);
        return -ENOMEM;
    }
    srv->opts.listen = srv->listen;
    srv->opts.listen_also = srv->listen_also;
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cond, NULL);
    atomic_init(&srv->shutting_down, false);
    atomic_init(&srv->calls_total, 0);
    for (int i = 0; i <= PS_RPC_UNAUTHENTICATED; i++)
        atomic_init(&srv->failures[i], 0);
    srv->t_shutdown = (struct tag){TAG_SHUTDOWN, srv};
    ps_rpc_init_logging();
    grpc_init();

    int rc = ps_health_create(health_send, &srv->health);
    if (rc == 0)
        rc = ps_rpc_server_add_method(srv, "/grpc.health.v1.Health/Check",
                                      PS_RPC_UNARY, health_check, srv);
    if (rc == 0)
        rc = ps_rpc_server_add_method(srv, "/grpc.health.v1.Health/Watch",
                                      PS_RPC_SERVER_STREAM, health_watch, srv);
    if (rc != 0) {
        ps_rpc_server_destroy(srv);
        return rc;
    }
    *out = srv;
    return 0;
}

static int add_method(ps_rpc_server *srv, const char *path,
                      enum ps_rpc_kind kind, ps_rpc_handler fn,
                      ps_rpc_pieces_handler pfn, void *ctx)
{
    if (srv->started || path == NULL || path[0] != '/' ||
        (fn == NULL) == (pfn == NULL) || strlen(path) >= 255)
        return PS_EINVAL_ARG;
    const char *slash = strchr(path + 1, '/');
    if (slash == NULL || slash == path + 1 || slash[1] == '\0')
        return PS_EINVAL_ARG;
    for (int i = 0; i < srv->nmethods; i++)
        if (strcmp(srv->methods[i].path, path) == 0)
            return PS_EEXIST;
    struct method *m = realloc(srv->methods,
                               sizeof *m * (size_t)(srv->nmethods + 1));
    if (m == NULL)
        return -ENOMEM;
    srv->methods = m;
    m = &srv->methods[srv->nmethods];
    memset(m, 0, sizeof *m);
    m->path = strdup(path);
    m->service = strndup(path + 1, (size_t)(slash - path - 1));
    if (m->path == NULL || m->service == NULL) {
        free(m->path);
        free(m->service);
        return -ENOMEM;
    }
    m->kind = kind;
    m->fn = fn;
    m->pfn = pfn;
    m->ctx = ctx;
    srv->nmethods++;
    return 0;
}

int ps_rpc_server_add_method(ps_rpc_server *srv, const char *path,
                             enum ps_rpc_kind kind, ps_rpc_handler fn,
                             void *ctx)
{
    return fn == NULL ? PS_EINVAL_ARG : add_method(srv, path, kind, fn, NULL, ctx);
}

int ps_rpc_server_add_method_pieces(ps_rpc_server *srv, const char *path,
                                    ps_rpc_pieces_handler fn, void *ctx)
{
    return fn == NULL ? PS_EINVAL_ARG
                      : add_method(srv, path, PS_RPC_UNARY, NULL, fn, ctx);
}

/* Shuts down a completion queue nothing runs on, drains and destroys it. */
static void cq_discard(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                      NULL).type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

/* The channel arguments that close the connections that hold descriptors
 * for nothing (issue 13 d): one that never finishes its HTTP/2 preface, one
 * with no call for a while, one whose peer stopped answering pings. Writes
 * at most 5 into out; returns how many. */
static size_t conn_args(const ps_rpc_server_opts *o, grpc_arg *out)
{
    size_t n = 0;
    if (o->handshake_timeout_ms > 0)
        out[n++] = (grpc_arg){GRPC_ARG_INTEGER, (char *)GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                              {.integer = o->handshake_timeout_ms}};
    if (o->idle_timeout_ms > 0)
        out[n++] = (grpc_arg){GRPC_ARG_INTEGER, (char *)GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                              {.integer = o->idle_timeout_ms}};
    if (o->keepalive_ms > 0) {
        out[n++] = (grpc_arg){GRPC_ARG_INTEGER, (char *)GRPC_ARG_KEEPALIVE_TIME_MS,
                              {.integer = o->keepalive_ms}};
        out[n++] = (grpc_arg){GRPC_ARG_INTEGER, (char *)GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                              {.integer = o->keepalive_ms < 20000 ? o->keepalive_ms : 20000}};
        out[n++] = (grpc_arg){GRPC_ARG_INTEGER,
                              (char *)GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, {.integer = 1}};
    }
    return n;
}

/* The gRPC server with our channel arguments, its methods registered and
 * each method's service (and "") listed for health. */
static int server_make(ps_rpc_server *srv)
{
    int max = (int)srv->opts.max_message_bytes;
    grpc_arg args[] = {
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = max}},
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, {.integer = max}},
        /* SO_REUSEPORT off: a second psd on a taken port must fail
         * loudly, not silently share the port with the first. */
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_ALLOW_REUSEPORT, {.integer = 0}},
        /* Big tensors: bigger HTTP/2 frames and a stream window that does
         * not make a 4 MiB message wait for window updates. */
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_HTTP2_MAX_FRAME_SIZE, {.integer = 4 << 20}},
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
         {.integer = 16 << 20}},
        /* Last, and only when set: the cap on one connection's calls, and
         * the connection timeouts (conn_args). */
        {GRPC_ARG_INTEGER, (char *)GRPC_ARG_MAX_CONCURRENT_STREAMS,
         {.integer = srv->opts.max_streams}},
        {0}, {0}, {0}, {0}, {0},
    };
    size_t nargs = sizeof args / sizeof args[0] - 6 + (srv->opts.max_streams > 0 ? 1 : 0);
    nargs += conn_args(&srv->opts, args + nargs);
    grpc_channel_args cargs = {nargs, args};
    srv->server = grpc_server_create(&cargs, NULL);
    if (srv->server == NULL)
        return -ENOMEM;
    int rc;
    for (int i = 0; i < srv->nmethods; i++) {
        srv->methods[i].handle = grpc_server_register_method(
            srv->server, srv->methods[i].path, NULL,
            GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
        if (srv->methods[i].handle == NULL)
            return PS_EINVAL_ARG;
        if ((rc = ps_health_add(srv->health, srv->methods[i].service)) != 0)
            return rc;
    }
    return ps_health_add(srv->health, "");
}

/* Adds one listening port with its credentials: TLS as the options say,
 * plaintext for a unix socket. Returns the bound port, or 0 (err set when
 * the credentials could not be made). */
static int add_port(ps_rpc_server *srv, const char *addr, char *err,
                    size_t errlen)
{
    grpc_server_credentials *creds =
        ps_tls_server_creds(ps_tls_is_unix(addr) ? NULL : srv->opts.tls, err, errlen);
    if (creds == NULL)
        return 0;
    /* Tokens: gRPC 1.51 runs the processor for plaintext credentials too
     * (auth.h), and for TLS ones alike. */
    if (srv->opts.auth != NULL)
        ps_auth_attach(srv->opts.auth, creds, PS_AUTH_NONE);
    int port = grpc_server_add_http2_port(srv->server, addr, creds);
    grpc_server_credentials_release(creds);
    return port;
}

/* Binds the listen address(es). Returns the bound port, or 0 after undoing
 * the server and its queues (gRPC only lets go of a server with a listener
 * once it was started and shut down). */
static int server_bind(ps_rpc_server *srv)
{
    char err[512] = "";
    int port = add_port(srv, srv->listen, err, sizeof err);
    const char *bad = port == 0 ? srv->listen : NULL;
    if (port != 0 && srv->listen_also != NULL && srv->local == NULL &&
        add_port(srv, srv->listen_also, err, sizeof err) == 0) {
        bad = srv->listen_also;
        port = 0;
    }
    if (port != 0)
        return port;
    if (err[0] != '\0')
        ps_log_error("rpc: cannot listen on '%s': %s", bad, err);
    else
        ps_log_error("rpc: cannot listen on '%s' (address in use, or not "
                     "host:port or unix:PATH%s)", bad,
                     ps_tls_server_enabled(srv->opts.tls)
                         ? ", or a TLS key that does not match its certificate" : "");
    if (bad == srv->listen_also) {
        /* The first address is bound. */
        int done_tag;
        grpc_server_start(srv->server);
        grpc_server_shutdown_and_notify(srv->server, srv->threads[0].cq,
                                        &done_tag);
        grpc_server_cancel_all_calls(srv->server);
        while (grpc_completion_queue_next(srv->threads[0].cq,
                                          gpr_inf_future(GPR_CLOCK_REALTIME),
                                          NULL).tag != &done_tag)
            ;
    }
    /* Nothing runs on the queues: they can go at once. */
    for (int i = 0; i < srv->nthreads; i++) {
        cq_discard(srv->threads[i].cq);
        srv->threads[i].cq = NULL;
    }
    grpc_server_destroy(srv->server);
    srv->server = NULL;
    free(srv->threads);
    srv->threads = NULL;
    srv->nthreads = 0;
    return 0;
}

/* Requests the first calls on each queue and starts its thread. */
static int threads_start(ps_rpc_server *srv)
{
    for (int i = 0; i < srv->nthreads; i++) {
        struct cq_thread *thr = &srv->threads[i];
        for (int k = 0; k < srv->nmethods; k++)
            for (int r = 0; r < REQUESTS_PER_METHOD; r++)
                request_call(srv, &srv->methods[k], thr);
        request_call(srv, NULL, thr);
        if (pthread_create(&thr->th, NULL, cq_thread_main, thr) != 0) {
            ps_log_error("rpc: cannot start thread %d", i);
            /* Threads already running are stopped by shutdown. */
            srv->nthreads = i;
            cq_discard(thr->cq);
            return -EAGAIN;
        }
    }
    return 0;
}

/* A unix listen_also is bound and accepted by us (rpc_local.h), so that
 * each of its calls knows its peer. Returns 0, or -EADDRINUSE after the
 * error line. */
static int local_bind(ps_rpc_server *srv)
{
    const char *a = srv->listen_also;
    if (a == NULL || strncmp(a, "unix:", 5) != 0)
        return 0;
    int rc = rpc_local_listen(a + 5, srv->opts.max_connections,
                              srv->opts.handshake_timeout_ms, &srv->local);
    if (rc != 0) {
        ps_log_error("rpc: cannot listen on '%s': %s", a, strerror(-rc));
        return -EADDRINUSE;
    }
    return 0;
}

int ps_rpc_server_local_open(const ps_rpc_server *srv)
{
    return srv->local != NULL ? rpc_local_open(srv->local) : 0;
}

uint64_t ps_rpc_server_local_refused(const ps_rpc_server *srv)
{
    return srv->local != NULL ? rpc_local_refused(srv->local) : 0;
}

int ps_rpc_server_start(ps_rpc_server *srv, int *port_out)
{
    if (srv->started)
        return PS_EINVAL_ARG;
    int rc = server_make(srv);
    if (rc != 0)
        return rc;
    srv->nthreads = srv->opts.threads;
    srv->threads = calloc((size_t)srv->nthreads, sizeof *srv->threads);
    if (srv->threads == NULL)
        return -ENOMEM;
    for (int i = 0; i < srv->nthreads; i++) {
        srv->threads[i].srv = srv;
        srv->threads[i].index = i;
        srv->threads[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(srv->server,
                                              srv->threads[i].cq, NULL);
    }
    if ((rc = local_bind(srv)) != 0)
        return rc;
    int port = server_bind(srv);
    if (port == 0) {
        rpc_local_free(srv->local);
        srv->local = NULL;
        return -EADDRINUSE;
    }
    grpc_server_start(srv->server);
    srv->started = true;
    if (srv->local != NULL && (rc = rpc_local_start(srv->local, srv->server)) != 0)
        return rc;
    if ((rc = threads_start(srv)) != 0)
        return rc;
    ps_health_set_all(srv->health, true);
    if (port_out != NULL)
        *port_out = port;
    return 0;
}

void ps_rpc_server_shutdown(ps_rpc_server *srv, int grace_ms)
{
    if (!srv->started || atomic_exchange(&srv->shutting_down, true))
        return;
    /* No new connections on the unix socket: its file goes now. */
    rpc_local_stop(srv->local);

    /* Watchers are told NOT_SERVING and ended, or they would hold the
     * drain open forever. */
    ps_health_shutdown(srv->health, health_end, NULL);

    grpc_server_shutdown_and_notify(srv->server, srv->threads[0].cq,
                                    &srv->t_shutdown);
    /* The shutdown completes once the calls are done and every client has
     * closed its connection, which an idle client does only when it gets
     * round to the GOAWAY (4.5 s for one of grpcio's, the stop held that
     * long). So once no call is in flight, seen twice SETTLE_MS apart (a
     * call matched as the shutdown began is counted by then), the
     * connections left are closed: they carry nothing. */
    enum { SETTLE_MS = 50 };
    int64_t end = ps_now_ms() + grace_ms;
    int idle = 0;
    pthread_mutex_lock(&srv->mu);
    while (!srv->shutdown_done && idle < 2) {
        int64_t left_ms = end - ps_now_ms();
        if (left_ms <= 0)
            break;
        struct timespec until = ps_time_after_ms(
            CLOCK_REALTIME, left_ms < SETTLE_MS ? left_ms : SETTLE_MS);
        if (pthread_cond_timedwait(&srv->cond, &srv->mu, &until) == ETIMEDOUT)
            idle = srv->in_flight == 0 ? idle + 1 : 0;
    }
    bool drained = srv->shutdown_done;
    int left = srv->in_flight;
    pthread_mutex_unlock(&srv->mu);
    if (!drained) {
        if (left > 0)
            ps_log_warn("rpc: %d call(s) still in flight after %d ms; cancelling",
                    left, grace_ms);
        grpc_server_cancel_all_calls(srv->server);
        pthread_mutex_lock(&srv->mu);
        while (!srv->shutdown_done)
            pthread_cond_wait(&srv->cond, &srv->mu);
        pthread_mutex_unlock(&srv->mu);
    }
    for (int i = 0; i < srv->nthreads; i++)
        grpc_completion_queue_shutdown(srv->threads[i].cq);
    for (int i = 0; i < srv->nthreads; i++) {
        pthread_join(srv->threads[i].th, NULL);
        grpc_completion_queue_destroy(srv->threads[i].cq);
        ps_buf_free(&srv->threads[i].buf);
    }
    grpc_server_destroy(srv->server);
    srv->server = NULL;
}

void ps_rpc_server_destroy(ps_rpc_server *srv)
{
    if (srv == NULL)
        return;
    ps_rpc_server_shutdown(srv, 0);
    if (srv->server != NULL)
        grpc_server_destroy(srv->server);
    rpc_local_free(srv->local);
    for (int i = 0; i < srv->nmethods; i++) {
        free(srv->methods[i].path);
        free(srv->methods[i].service);
    }
    ps_health_destroy(srv->health);
    PS_FREE_ALL(srv->methods, srv->threads, srv->listen, srv->listen_also);
    pthread_mutex_destroy(&srv->mu);
    pthread_cond_destroy(&srv->cond);
    free(srv);
    grpc_shutdown();
}

uint64_t ps_rpc_server_calls_total(const ps_rpc_server *srv)
{
    return atomic_load(&((ps_rpc_server *)srv)->calls_total);
}

struct ps_auth *rpc_server_auth(ps_rpc_server *srv)
{
    return srv->opts.auth;
}

/* The implicit role of a call without a token (auth.h's trusted
 * transports): only on the unix socket psd accepts itself, and only for a
 * peer of psd's own uid or root, as the kernel names it (rpc_local.h). */
int rpc_server_fd_role(ps_rpc_call *c)
{
    if (c->cred_state != 1 || (c->cred.uid != geteuid() && c->cred.uid != 0))
        return 0;
    return c->srv->opts.fd_channel_role;
}

void rpc_server_count_failure(ps_rpc_server *srv, int code)
{
    if (code > 0 && code <= PS_RPC_UNAUTHENTICATED)
        atomic_fetch_add_explicit(&srv->failures[code], 1, memory_order_relaxed);
}

uint64_t ps_rpc_server_failures(const ps_rpc_server *srv, int code)
{
    if (code <= 0 || code > PS_RPC_UNAUTHENTICATED)
        return 0;
    uint64_t n = atomic_load(&((ps_rpc_server *)srv)->failures[code]);
    return n + (srv->opts.auth != NULL ? ps_auth_refused(srv->opts.auth, code) : 0);
}

int64_t ps_rpc_server_busy_ms(const ps_rpc_server *srv)
{
    int64_t now = ps_now_ms(), least = INT64_MAX;
    for (int i = 0; i < srv->nthreads; i++) {
        int64_t since = atomic_load(&srv->threads[i].busy_since);
        if (since == 0)
            return 0;
        if (now - since < least)
            least = now - since;
    }
    return srv->nthreads > 0 ? (least > 0 ? least : 1) : 0;
}

int ps_rpc_server_calls_in_flight(const ps_rpc_server *srv)
{
    ps_rpc_server *s = (ps_rpc_server *)srv;
    pthread_mutex_lock(&s->mu);
    int n = s->in_flight;
    pthread_mutex_unlock(&s->mu);
    return n;
}
