/*
 * check_rpc - the gRPC plumbing against itself: a real server on
 * 127.0.0.1 port 0 in this process, called through the real client.
 */
#include "common/auth.h"
#include "common/clock.h"
#include "common/errors.h"
#include "proto/health.pb-c.h"
#include "tests/unit/pscheck.h"
#include "common/rpc.h"
#include "common/rpc_slice.h"
#include "tests/rpc_handlers.h"

#include <grpc/grpc.h>

#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static ps_rpc_server *srv;
static ps_rpc_client *cli;
static int port;
static char target[64];

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void fail_with_name(ps_rpc_call *call, const uint8_t *req, size_t len,
                           void *ctx)
{
    ps_rpc_fail(call, PS_RPC_NOT_FOUND, "variable '%.*s' not found", (int)len,
                (const char *)req);
}

static void count(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    int n = (int)len;
    for (int i = 0; i < n; i++) {
        uint8_t b = (uint8_t)i;
        ps_rpc_stream_write(call, &b, 1);
    }
    ps_rpc_stream_finish(call);
}

/* Replies "hdr" + the request + "end", the request sent in place from a
 * message buffer the test then checks gRPC lets go of. */
static ps_rpc_msg *parts_reply_msg;

static void echo_parts(ps_rpc_call *call, const struct ps_piece *pieces, int np,
                       void *ctx)
{
    size_t len = 0;
    for (int i = 0; i < np; i++)
        len += pieces[i].len;
    ps_rpc_msg *m = ps_rpc_msg_new(len);
    for (size_t i = 0, off = 0; i < (size_t)np; off += pieces[i].len, i++)
        memcpy(ps_rpc_msg_data(m) + off, pieces[i].data, pieces[i].len);
    parts_reply_msg = m; /* the test's reference */
    ps_rpc_msg_ref(m);   /* the reply's */
    ps_rpc_part parts[3] = {{"hdr", 3, NULL, NULL},
                            {ps_rpc_msg_data(m), len, ps_rpc_msg_release, m},
                            {"end", 3, NULL, NULL}};
    ps_rpc_reply_parts(call, parts, 3);
}

static void start_server(size_t max_message)
{
    ps_rpc_server_opts o = {.listen = "127.0.0.1:0", .threads = 2,
                            .max_message_bytes = max_message};
    ck_assert_int_eq(ps_rpc_server_create(&o, &srv), 0);
    ck_assert_int_eq(ps_rpc_server_add_method(srv, "/t.T/Echo", PS_RPC_UNARY,
                                              handle_echo, NULL), 0);
    ck_assert_int_eq(ps_rpc_server_add_method(srv, "/t.T/Fail", PS_RPC_UNARY,
                                              fail_with_name, NULL), 0);
    ck_assert_int_eq(ps_rpc_server_add_method(srv, "/t.T/Slow", PS_RPC_UNARY,
                                              handle_sleep, NULL), 0);
    ck_assert_int_eq(ps_rpc_server_add_method(srv, "/t.T/Count",
                                              PS_RPC_SERVER_STREAM, count,
                                              NULL), 0);
    ck_assert_int_eq(ps_rpc_server_add_method_pieces(srv, "/t.T/EchoParts",
                                                     echo_parts, NULL), 0);
    ck_assert_int_eq(ps_rpc_server_start(srv, &port), 0);
    ck_assert_int_gt(port, 0);
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
}

static void setup(void)
{
    start_server(0);
    ps_rpc_client_opts co = {.deadline_ms = 5000};
    ck_assert_int_eq(ps_rpc_client_create(target, &co, &cli), 0);
}

static void teardown(void)
{
    ps_rpc_client_destroy(cli);
    cli = NULL;
    ps_rpc_server_destroy(srv);
    srv = NULL;
}

START_TEST(test_echo)
{
    ps_buf resp = {0};
    ps_rpc_status st;
    ck_assert_int_eq(ps_rpc_invoke(cli, "/t.T/Echo", "hello", 5, &resp, 0, &st), 0);
    ck_assert_int_eq(st.code, PS_RPC_OK);
    ck_assert_uint_eq(resp.len, 5);
    ck_assert_mem_eq(resp.data, "hello", 5);
    /* The same buffer is reused for the next response. */
    ck_assert_int_eq(ps_rpc_invoke(cli, "/t.T/Echo", "", 0, &resp, 0, &st), 0);
    ck_assert_uint_eq(resp.len, 0);
    ps_buf_free(&resp);
}
END_TEST

START_TEST(test_large_message)
{
    /* 64 MiB: far past gRPC's 4 MiB default, inside our 1 GiB default. */
    size_t n = (size_t)64 << 20;
    uint8_t *big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (uint8_t)(i * 131u);
    ps_buf resp = {0};
    ps_rpc_status st;
    ck_assert_int_eq(ps_rpc_invoke(cli, "/t.T/Echo", big, n, &resp, 30000, &st), 0);
    ck_assert_uint_eq(resp.len, n);
    ck_assert(memcmp(resp.data, big, n) == 0);
    ps_buf_free(&resp);
    free(big);
}
END_TEST

struct joined {
    uint8_t *data;
    size_t len;
};

static int join_pieces(void *ctx, const struct ps_piece *p, int np)
{
    struct joined *j = ctx;
    j->len = 0;
    for (int i = 0; i < np; i++) {
        memcpy(j->data + j->len, p[i].data, p[i].len);
        j->len += p[i].len;
    }
    return 0;
}

START_TEST(test_pieces)
{
    /* Responses handed over in the pieces gRPC received them in must join
     * to the exact bytes sent, whatever their sizes (a small piece keeps its
     * bytes inside the slice value: a decoder once read them after that
     * value was reused). */
    size_t max = (size_t)2 << 20;
    uint8_t *want = malloc(max + 8);
    struct joined got = {malloc(max), 0};
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < max + 8; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        want[i] = (uint8_t)x;
    }
    for (int k = 0; k < 200; k++) {
        size_t len = (size_t)((k * 2654435761u) % max) + (size_t)(k % 7);
        if (len > max)
            len = max;
        ps_rpc_msg *m = ps_rpc_msg_new(len);
        memcpy(ps_rpc_msg_data(m), want + (k % 5), len);
        ps_rpc_msg_set_len(m, len);
        const uint8_t *src = ps_rpc_msg_data(m);
        ps_rpc_status st;
        ck_assert_int_eq(ps_rpc_invoke_msg(cli, "/t.T/Echo", m, join_pieces, &got,
                                           10000, &st), 0);
        ck_assert_uint_eq(got.len, len);
        ck_assert(memcmp(got.data, src, len) == 0);
        ps_rpc_msg_unref(m);
    }
    free(want);
    free(got.data);
}
END_TEST

START_TEST(test_parts_in_place)
{
    /* A request of copied and in-place parts, answered by a handler that
     * reads it in pieces and replies with copied and in-place parts: the
     * bytes arrive in order, and both message buffers are let go of. */
    size_t big = (size_t)1 << 20;
    ps_rpc_msg *c = ps_rpc_msg_new(big);
    for (size_t i = 0; i < big; i++)
        ps_rpc_msg_data(c)[i] = (uint8_t)(i * 7 + 3);
    ps_rpc_part parts[3] = {{"abc", 3, NULL, NULL},
                            {ps_rpc_msg_data(c), big, ps_rpc_msg_release, c},
                            {"xyz", 3, NULL, NULL}};
    struct joined got = {malloc(big + 12), 0};
    ps_rpc_status st;
    for (int round = 0; round < 3; round++) {
        got.len = 0;
        ck_assert_int_eq(ps_rpc_invoke_parts(cli, "/t.T/EchoParts", parts, 3,
                                             join_pieces, &got, 10000, &st), 0);
        ck_assert_uint_eq(got.len, big + 12);
        ck_assert(memcmp(got.data, "hdrabc", 6) == 0);
        ck_assert(memcmp(got.data + 6, ps_rpc_msg_data(c), big) == 0);
        ck_assert(memcmp(got.data + 6 + big, "xyzend", 6) == 0);
        ps_rpc_msg_wait_unshared(c);
        ck_assert(!ps_rpc_msg_shared(c));
        ck_assert_ptr_nonnull(parts_reply_msg);
        ps_rpc_msg_wait_unshared(parts_reply_msg);
        ps_rpc_msg_unref(parts_reply_msg);
        parts_reply_msg = NULL;
    }
    /* A buffer someone still holds: the bounded wait gives up in time. */
    ps_rpc_msg_ref(c);
    int64_t t0 = ps_now_ms();
    ck_assert(!ps_rpc_msg_wait_unshared_for(c, 30));
    int64_t waited = ps_now_ms() - t0;
    ck_assert_msg(waited >= 29 && waited < 1000, "waited %lld ms", (long long)waited);
    ps_rpc_msg_unref(c);
    ck_assert(ps_rpc_msg_wait_unshared_for(c, 30));
    /* In-place parts must be message buffers: anything else is refused. */
    ps_rpc_part bad = {"x", 1, free, NULL};
    ck_assert_int_eq(ps_rpc_invoke_parts(cli, "/t.T/EchoParts", &bad, 1,
                                         join_pieces, &got, 1000, &st),
                     PS_EINVAL_ARG);
    ps_rpc_msg_unref(c);
    free(got.data);
}
END_TEST

START_TEST(test_pieces_inline)
{
    /* The same, deterministic: a byte buffer of small (inline) and large
     * slices, as gRPC hands over a message split at frame boundaries. */
    size_t sizes[] = {5, 1000, 3, 17, 2000, 1, 23, 24, 4096, 2};
    int ns = (int)(sizeof sizes / sizeof sizes[0]);
    grpc_slice sl[10];
    uint8_t want[8192];
    size_t total = 0;
    for (int i = 0; i < ns; i++) {
        uint8_t part[4096];
        for (size_t k = 0; k < sizes[i]; k++)
            part[k] = (uint8_t)(i * 31 + k * 7);
        memcpy(want + total, part, sizes[i]);
        total += sizes[i];
        sl[i] = grpc_slice_from_copied_buffer((const char *)part, sizes[i]);
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, (size_t)ns);
    for (int i = 0; i < ns; i++)
        grpc_slice_unref(sl[i]);
    struct joined got = {malloc(total), 0};
    ck_assert_int_eq(ps_rpc_bb_pieces(bb, join_pieces, &got), 0);
    ck_assert_uint_eq(got.len, total);
    ck_assert(memcmp(got.data, want, total) == 0);
    free(got.data);
    grpc_byte_buffer_destroy(bb);
}
END_TEST

/* Calls method with req through the fixture's client; the call must fail
 * with status code, and its status is returned. */
static ps_rpc_status call_fails(const char *method, const char *req, int code)
{
    ps_rpc_status st;
    ck_assert_int_eq(ps_rpc_invoke(cli, method, req, strlen(req), NULL, 0, &st), PS_ERPC);
    ck_assert_int_eq(st.code, code);
    return st;
}

START_TEST(test_error_status_message)
{
    ps_rpc_status st = call_fails("/t.T/Fail", "w1", PS_RPC_NOT_FOUND);
    ck_assert_str_eq(st.message, "variable 'w1' not found");
}
END_TEST

START_TEST(test_unknown_method)
{
    ps_rpc_status st = call_fails("/t.T/NoSuch", "x", PS_RPC_UNIMPLEMENTED);
    ck_assert_ptr_nonnull(strstr(st.message, "/t.T/NoSuch"));
}
END_TEST

START_TEST(test_deadline)
{
    ps_rpc_status st;
    int64_t t0 = ps_now_ms();
    ck_assert_int_eq(ps_rpc_invoke(cli, "/t.T/Slow", "3000", 4, NULL, 200, &st),
                     PS_ERPC);
    int64_t took = ps_now_ms() - t0;
    ck_assert_int_eq(st.code, PS_RPC_DEADLINE_EXCEEDED);
    ck_assert_int_lt(took, 2000);
    /* The server noticed too and freed the call. */
    int64_t until = ps_now_ms() + 3000;
    while (ps_rpc_server_calls_in_flight(srv) > 0 && ps_now_ms() < until)
        sleep_ms(10);
    ck_assert_int_eq(ps_rpc_server_calls_in_flight(srv), 0);
    /* A call answered within its deadline is fine. */
    ps_buf resp = {0};
    ck_assert_int_eq(ps_rpc_invoke(cli, "/t.T/Slow", "10", 2, &resp, 2000, &st), 0);
    ck_assert_mem_eq(resp.data, "slept", 5);
    ps_buf_free(&resp);
}
END_TEST

struct counted {
    int n;
    int bad;
};

static int on_count(void *ctx, const uint8_t *msg, size_t len)
{
    struct counted *c = ctx;
    if (len != 1 || msg[0] != (uint8_t)c->n)
        c->bad++;
    c->n++;
    return 0;
}

START_TEST(test_stream)
{
    char req[100];
    memset(req, 'x', sizeof req);
    struct counted c = {0, 0};
    ps_rpc_status st;
    ck_assert_int_eq(ps_rpc_invoke_stream(cli, "/t.T/Count", req, sizeof req, 0,
                                        on_count, &c, &st), 0);
    ck_assert_int_eq(c.n, 100);
    ck_assert_int_eq(c.bad, 0);
}
END_TEST

static int on_health(void *ctx, const uint8_t *msg, size_t len)
{
    Grpc__Health__V1__HealthCheckResponse *r =
        grpc__health__v1__health_check_response__unpack(NULL, len, msg);
    *(int *)ctx = r ? (int)r->status : -1;
    grpc__health__v1__health_check_response__free_unpacked(r, NULL);
    return 1; /* one message is enough */
}

START_TEST(test_health)
{
    bool serving = false;
    ps_rpc_status st;
    ck_assert_int_eq(ps_rpc_health_check(cli, "", 0, &serving, &st), 0);
    ck_assert(serving);
    ck_assert_int_eq(ps_rpc_health_check(cli, "t.T", 0, &serving, &st), 0);
    ck_assert(serving);
    ck_assert_int_eq(ps_rpc_health_check(cli, "no.Such", 0, &serving, &st),
                     PS_ERPC);
    ck_assert_int_eq(st.code, PS_RPC_NOT_FOUND);
    ps_rpc_server_set_serving(srv, "t.T", false);
    ck_assert_int_eq(ps_rpc_health_check(cli, "t.T", 0, &serving, &st), 0);
    ck_assert(!serving);

    /* Watch sends the current status first. */
    Grpc__Health__V1__HealthCheckRequest req =
        GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)"";
    uint8_t buf[64];
    size_t len = grpc__health__v1__health_check_request__pack(&req, buf);
    int status = -1;
    ps_rpc_invoke_stream(cli, "/grpc.health.v1.Health/Watch", buf, len, 2000,
                       on_health, &status, &st);
    ck_assert_int_eq(status,
                     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    /* The cancelled watcher is gone from the server. */
    int64_t until = ps_now_ms() + 3000;
    while (ps_rpc_server_calls_in_flight(srv) > 0 && ps_now_ms() < until)
        sleep_ms(10);
    ck_assert_int_eq(ps_rpc_server_calls_in_flight(srv), 0);
}
END_TEST

START_TEST(test_message_limit)
{
    ps_rpc_client_destroy(cli);
    ps_rpc_server_destroy(srv);
    start_server(1 << 20);
    ps_rpc_client_opts co = {.deadline_ms = 5000};
    ck_assert_int_eq(ps_rpc_client_create(target, &co, &cli), 0);
    size_t n = (1 << 20) + 1024;
    uint8_t *big = calloc(1, n);
    ps_rpc_status st;
    ck_assert_int_eq(ps_rpc_invoke(cli, "/t.T/Echo", big, n, NULL, 0, &st),
                     PS_ERPC);
    ck_assert_int_eq(st.code, PS_RPC_RESOURCE_EXHAUSTED);
    free(big);
    /* The server still serves after refusing. */
    ck_assert_int_eq(ps_rpc_invoke(cli, "/t.T/Echo", "ok", 2, NULL, 0, &st), 0);
}
END_TEST

START_TEST(test_retry_unavailable)
{
    /* Nothing listens on this port: every attempt is UNAVAILABLE. */
    ps_rpc_client *c2;
    char t2[64];
    int dead_port = port;
    ps_rpc_client_destroy(cli);
    cli = NULL;
    ps_rpc_server_destroy(srv);
    srv = NULL;
    snprintf(t2, sizeof t2, "127.0.0.1:%d", dead_port);
    ps_rpc_client_opts co = {.deadline_ms = 500, .max_attempts = 4,
                             .backoff_initial_ms = 20, .backoff_max_ms = 100};
    ck_assert_int_eq(ps_rpc_client_create(t2, &co, &c2), 0);
    ps_rpc_status st;
    ck_assert_int_eq(ps_rpc_invoke(c2, "/t.T/Echo", "x", 1, NULL, 0, &st), PS_ERPC);
    ck_assert_int_eq(st.code, PS_RPC_UNAVAILABLE);
    ck_assert_int_eq(st.attempts, 4);
    ps_rpc_client_destroy(c2);
    start_server(0); /* for teardown */
    ck_assert_int_eq(ps_rpc_client_create(target, NULL, &cli), 0);
}
END_TEST

static void *start_server_later(void *arg)
{
    sleep_ms(300);
    ps_rpc_server_opts o = {.listen = arg, .threads = 1};
    ps_rpc_server *s2;
    ck_assert_int_eq(ps_rpc_server_create(&o, &s2), 0);
    ps_rpc_server_add_method(s2, "/t.T/Echo", PS_RPC_UNARY, handle_echo, NULL);
    ck_assert_int_eq(ps_rpc_server_start(s2, NULL), 0);
    return s2;
}

START_TEST(test_retry_then_success)
{
    /* A server that comes up after the first attempts: the retries find it. */
    ps_rpc_client_destroy(cli);
    cli = NULL;
    ps_rpc_server_destroy(srv);
    srv = NULL;
    ps_rpc_client_opts co = {.deadline_ms = 300, .max_attempts = 30,
                             .backoff_initial_ms = 50, .backoff_max_ms = 200,
                             .retry_budget_ms = 10000};
    ps_rpc_client *c2;
    ck_assert_int_eq(ps_rpc_client_create(target, &co, &c2), 0);
    pthread_t th;
    pthread_create(&th, NULL, start_server_later, target);
    ps_rpc_status st;
    int rc = ps_rpc_invoke(c2, "/t.T/Echo", "x", 1, NULL, 0, &st);
    void *s2;
    pthread_join(th, &s2);
    ck_assert_msg(rc == 0, "call failed: %s %s", ps_rpc_code_name(st.code),
                  st.message);
    ck_assert_int_gt(st.attempts, 1);
    ps_rpc_client_destroy(c2);
    srv = s2;
    ck_assert_int_eq(ps_rpc_client_create(target, NULL, &cli), 0);
}
END_TEST

static void *call_slow(void *arg)
{
    static ps_rpc_status st;
    ps_buf resp = {0};
    ps_rpc_invoke(cli, "/t.T/Slow", "400", 3, &resp, 5000, &st);
    ps_buf_free(&resp);
    return &st;
}

START_TEST(test_graceful_shutdown_drains)
{
    pthread_t th;
    pthread_create(&th, NULL, call_slow, NULL);
    int64_t until = ps_now_ms() + 3000;
    while (ps_rpc_server_calls_in_flight(srv) == 0 && ps_now_ms() < until)
        sleep_ms(5);
    ck_assert_int_eq(ps_rpc_server_calls_in_flight(srv), 1);
    ps_rpc_server_shutdown(srv, 5000);
    ps_rpc_status *st;
    pthread_join(th, (void **)&st);
    ck_assert_msg(st->code == PS_RPC_OK, "in-flight call got %s: %s",
                  ps_rpc_code_name(st->code), st->message);
    /* New calls are refused once the server is gone. */
    ps_rpc_status st2;
    ck_assert_int_eq(ps_rpc_invoke(cli, "/t.T/Echo", "x", 1, NULL, 500, &st2),
                     PS_ERPC);
    ck_assert_int_eq(st2.code, PS_RPC_UNAVAILABLE);
}
END_TEST

START_TEST(test_bad_options)
{
    ps_rpc_server *s;
    ps_rpc_server_opts o = {.listen = ""};
    ck_assert_int_eq(ps_rpc_server_create(&o, &s), PS_EINVAL_ARG);
    o.listen = "127.0.0.1:0";
    o.threads = -1;
    ck_assert_int_eq(ps_rpc_server_create(&o, &s), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_rpc_server_add_method(srv, "noslash", PS_RPC_UNARY,
                                              handle_echo, NULL), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_rpc_server_add_method(srv, "/x.Y/Z", PS_RPC_UNARY,
                                              handle_echo, NULL), PS_EINVAL_ARG);
    /* The port taken by the fixture's server cannot be bound twice. */
    o.threads = 1;
    o.listen = target;
    ck_assert_int_eq(ps_rpc_server_create(&o, &s), 0);
    ck_assert_int_eq(ps_rpc_server_start(s, NULL), -EADDRINUSE);
    ps_rpc_server_destroy(s);
    ps_rpc_client *c;
    ck_assert_int_eq(ps_rpc_client_create("", NULL, &c), PS_EINVAL_ARG);
}
END_TEST

START_TEST(test_code_mapping)
{
    ck_assert_int_eq(ps_rpc_code_from_err(PS_ENOTFOUND), PS_RPC_NOT_FOUND);
    ck_assert_int_eq(ps_rpc_code_from_err(PS_ESHAPE), PS_RPC_INVALID_ARGUMENT);
    ck_assert_int_eq(ps_rpc_code_from_err(PS_EFULL), PS_RPC_RESOURCE_EXHAUSTED);
    ck_assert_int_eq(ps_rpc_code_from_err(PS_ESTALE), PS_RPC_FAILED_PRECONDITION);
    ck_assert_int_eq(ps_rpc_code_from_err(PS_EEXIST), PS_RPC_ALREADY_EXISTS);
    ck_assert_str_eq(ps_rpc_code_name(PS_RPC_DEADLINE_EXCEEDED),
                     "DEADLINE_EXCEEDED");
    ck_assert_str_eq(ps_rpc_code_name(99), "UNKNOWN_CODE");
}
END_TEST

/* Answers with the caller's pid and uid as the unix socket knows them, or
 * "none" for a call that came another way. */
static void who(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    ps_rpc_peer_cred c;
    char out[64] = "none";
    if (ps_rpc_call_peer_cred(call, &c) == 0)
        snprintf(out, sizeof out, "%d %d %d", (int)c.pid, (int)c.uid, c.start > 0);
    ps_rpc_reply(call, out, strlen(out));
}

/* A unix listen_also is accepted by the server itself: its calls know
 * their peer (SO_PEERCRED), TCP calls do not; the socket file goes at
 * shutdown. */
START_TEST(test_peer_cred)
{
    char dir[] = "/tmp/check-rpc-XXXXXX", path[64], unix_target[80];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/s.sock", dir);
    snprintf(unix_target, sizeof unix_target, "unix:%s", path);
    ps_rpc_server *s;
    ps_rpc_server_opts o = {.listen = "127.0.0.1:0", .listen_also = unix_target,
                            .threads = 1, .max_connections = 4,
                            .handshake_timeout_ms = 1000, .idle_timeout_ms = 60000,
                            .keepalive_ms = 30000};
    ck_assert_int_eq(ps_rpc_server_create(&o, &s), 0);
    ck_assert_int_eq(ps_rpc_server_add_method(s, "/t.T/Who", PS_RPC_UNARY, who, NULL), 0);
    int p;
    ck_assert_int_eq(ps_rpc_server_start(s, &p), 0);
    char tcp[64], want[64];
    snprintf(tcp, sizeof tcp, "127.0.0.1:%d", p);
    snprintf(want, sizeof want, "%d %d 1", (int)getpid(), (int)getuid());
    ps_rpc_client *ct, *cu;
    ck_assert_int_eq(ps_rpc_client_create(tcp, NULL, &ct), 0);
    ck_assert_int_eq(ps_rpc_client_create(unix_target, NULL, &cu), 0);
    ps_buf resp = {0};
    ck_assert_int_eq(ps_rpc_invoke(cu, "/t.T/Who", "", 0, &resp, 0, NULL), 0);
    ck_assert_uint_eq(resp.len, strlen(want));
    ck_assert_mem_eq(resp.data, want, resp.len);
    ck_assert_int_eq(ps_rpc_server_local_open(s), 1);
    ck_assert_int_eq(ps_rpc_invoke(ct, "/t.T/Who", "", 0, &resp, 0, NULL), 0);
    ck_assert_uint_eq(resp.len, 4);
    ck_assert_mem_eq(resp.data, "none", 4);
    ps_buf_free(&resp);
    ps_rpc_client_destroy(cu);
    ps_rpc_client_destroy(ct);
    ps_rpc_server_shutdown(s, 1000);
    ck_assert_int_ne(access(path, F_OK), 0);
    ps_rpc_server_destroy(s);
    rmdir(dir);
}
END_TEST

static const struct pscheck_opts server = {setup, teardown, 60};

/* The caller's role as one byte. */
static void reply_role(ps_rpc_call *call, const uint8_t *req, size_t len,
                       void *ctx)
{
    uint8_t role = (uint8_t)ps_rpc_call_role(call);
    ps_rpc_reply(call, &role, 1);
}

static int count_msgs(void *ctx, const uint8_t *msg, size_t len)
{
    (*(int *)ctx)++;
    return 0;
}

/* A server with a token table: the processor on its credentials refuses
 * or admits each call before the handler, for unary calls and streams, and
 * the handler learns the role of the token that was sent. */
START_TEST(test_tokens)
{
    char path[] = "/tmp/check_rpc_tokens.XXXXXX", err[512];
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char *text = "worker worker-token-0123456789\nreader reader-token-0123456789\n";
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ps_auth *a;
    ck_assert_int_eq(ps_auth_create(path, &a, err, sizeof err), 0);
    unlink(path);
    ps_rpc_server *s;
    ps_rpc_server_opts o = {.listen = "127.0.0.1:0", .threads = 1, .auth = a};
    ck_assert_int_eq(ps_rpc_server_create(&o, &s), 0);
    ck_assert_int_eq(ps_rpc_server_add_method(s, "/ps.v1.ParameterServer/Push",
                                              PS_RPC_UNARY, reply_role, NULL), 0);
    ck_assert_int_eq(ps_rpc_server_add_method(s, "/ps.v1.Coordinator/WatchCluster",
                                              PS_RPC_SERVER_STREAM, count, NULL), 0);
    int p;
    ck_assert_int_eq(ps_rpc_server_start(s, &p), 0);
    char t[64];
    snprintf(t, sizeof t, "127.0.0.1:%d", p);
    const char *toks[] = {NULL, "worker-token-0123456789", "reader-token-0123456789",
                          "other-token-0123456789"};
    const int want[] = {PS_RPC_UNAUTHENTICATED, PS_RPC_OK, PS_RPC_PERMISSION_DENIED,
                        PS_RPC_UNAUTHENTICATED};
    for (int i = 0; i < 4; i++) {
        ps_rpc_client *c;
        ps_rpc_client_opts co = {.deadline_ms = 5000, .token = toks[i]};
        ck_assert_int_eq(ps_rpc_client_create(t, &co, &c), 0);
        ps_buf resp = {0};
        ps_rpc_status st;
        ps_rpc_invoke(c, "/ps.v1.ParameterServer/Push", "x", 1, &resp, 0, &st);
        ck_assert_msg(st.code == want[i], "token %d: %d %s", i, st.code, st.message);
        if (i == 1)
            ck_assert(resp.len == 1 && resp.data[0] == PS_AUTH_WORKER);
        if (toks[i] != NULL)
            ck_assert_ptr_null(strstr(st.message, toks[i]));
        int n = 0;
        ps_rpc_invoke_stream(c, "/ps.v1.Coordinator/WatchCluster", "abc", 3, 0,
                             count_msgs, &n, &st);
        ck_assert_msg(st.code == (i == 3 ? PS_RPC_UNAUTHENTICATED : want[i] ==
                                  PS_RPC_PERMISSION_DENIED ? PS_RPC_OK : want[i]),
                      "stream, token %d: %d %s", i, st.code, st.message);
        ck_assert_int_eq(n, st.code == PS_RPC_OK ? 3 : 0);
        ps_buf_free(&resp);
        ps_rpc_client_destroy(c);
    }
    /* Refused before any handler, and counted (/metrics' refused). */
    ck_assert_uint_eq(ps_rpc_server_failures(s, PS_RPC_UNAUTHENTICATED), 4);
    ck_assert_uint_eq(ps_rpc_server_failures(s, PS_RPC_PERMISSION_DENIED), 1);
    ps_rpc_server_destroy(s);
    ps_auth_destroy(a);
}
END_TEST

PSCHECK_MAIN("rpc",
    {"unary", {test_echo}, &server},
    {"large", {test_large_message}, &server},
    {"pieces", {test_pieces}, &server},
    {"pieces_inline", {test_pieces_inline}, &server},
    {"parts_in_place", {test_parts_in_place}, &server},
    {"fail", {test_error_status_message}, &server},
    {"unimplemented", {test_unknown_method}, &server},
    {"deadline", {test_deadline}, &server},
    {"stream", {test_stream}, &server},
    {"health", {test_health}, &server},
    {"message_limit", {test_message_limit}, &server},
    {"retry_unavailable", {test_retry_unavailable}, &server},
    {"retry_success", {test_retry_then_success}, &server},
    {"shutdown", {test_graceful_shutdown_drains}, &server},
    {"bad_options", {test_bad_options}, &server},
    {"code_mapping", {test_code_mapping}, &server},
    {"peer_cred", {test_peer_cred}, &server},
    {"tokens", {test_tokens}})
