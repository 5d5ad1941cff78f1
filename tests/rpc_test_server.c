/*
 * rpc_test_server - a real server built on common/rpc, for the tests that
 * call it from outside the process (the Python interop test, the shutdown
 * test). It serves:
 *   /ps.test.Test/Echo   unary: answers the request bytes back;
 *   /ps.test.Test/Sleep  unary: answers after N ms, N = the request as text
 *                        (a helper thread answers, as a waiting handler would);
 *   /ps.test.Test/Count  server-streaming: N messages "0".."N-1";
 * plus grpc.health.v1.Health. It prints "PORT <n>" on stdout once serving
 * and exits 0 after a graceful drain on SIGTERM or SIGINT.
 */
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/proc.h"
#include "common/rpc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void echo(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    ps_rpc_reply(call, req, len);
}

struct sleeper {
    ps_rpc_call *call;
    long ms;
};

static void *sleep_thread(void *arg)
{
    struct sleeper *s = arg;
    int64_t until = ps_now_ms() + s->ms;
    while (ps_now_ms() < until && !ps_rpc_call_cancelled(s->call)) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (ps_rpc_call_cancelled(s->call))
        ps_rpc_fail(s->call, PS_RPC_DEADLINE_EXCEEDED, "slept past the deadline");
    else
        ps_rpc_reply(s->call, "slept", 5);
    free(s);
    return NULL;
}

static void sleep_handler(ps_rpc_call *call, const uint8_t *req, size_t len,
                          void *ctx)
{
    char text[32];
    size_t n = len < sizeof text - 1 ? len : sizeof text - 1;
    memcpy(text, req, n);
    text[n] = '\0';
    char *end;
    long ms = strtol(text, &end, 10);
    if (n == 0 || *end != '\0' || ms < 0) {
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                    "Sleep: request must be a number of ms, got '%s'", text);
        return;
    }
    struct sleeper *s = malloc(sizeof *s);
    s->call = call;
    s->ms = ms;
    pthread_t th;
    pthread_create(&th, NULL, sleep_thread, s);
    pthread_detach(th);
}

static void count(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    char text[32];
    size_t n = len < sizeof text - 1 ? len : sizeof text - 1;
    memcpy(text, req, n);
    text[n] = '\0';
    long k = strtol(text, NULL, 10);
    for (long i = 0; i < k; i++) {
        char m[32];
        int ml = snprintf(m, sizeof m, "%ld", i);
        ps_rpc_stream_write(call, m, (size_t)ml);
    }
    ps_rpc_stream_finish(call);
}

int main(int argc, char **argv)
{
    ps_log_init(argv[0], getenv("PS_DEBUG") ? PS_LOG_DEBUG : PS_LOG_INFO);
    ps_proc_loop *loop;
    if (ps_proc_loop_create(&loop) != 0)
        return 1;
    ps_rpc_server_opts o = {.listen = argc > 1 ? argv[1] : "127.0.0.1:0",
                            .threads = 2};
    ps_rpc_server *srv;
    int port = 0;
    if (ps_rpc_server_create(&o, &srv) != 0) {
        ps_proc_loop_destroy(loop);
        return 1;
    }
    ps_rpc_server_add_method(srv, "/ps.test.Test/Echo", PS_RPC_UNARY, echo, NULL);
    ps_rpc_server_add_method(srv, "/ps.test.Test/Sleep", PS_RPC_UNARY,
                             sleep_handler, NULL);
    ps_rpc_server_add_method(srv, "/ps.test.Test/Count", PS_RPC_SERVER_STREAM,
                             count, NULL);
    int rc = ps_rpc_server_start(srv, &port);
    if (rc != 0) {
        fprintf(stderr, "rpc_test_server: cannot listen on %s: %s\n", o.listen,
                ps_strerror(rc));
        ps_rpc_server_destroy(srv);
        ps_proc_loop_destroy(loop);
        return 1;
    }
    printf("PORT %d\n", port);
    fflush(stdout);
    int sig = ps_proc_loop_run(loop);
    ps_log_info("signal %d: draining", sig);
    ps_rpc_server_shutdown(srv, 5000);
    ps_rpc_server_destroy(srv);
    ps_proc_loop_destroy(loop);
    return 0;
}
