/*
 * rpc_test_server - a real server built on common/rpc, for the tests that
 * call it from outside the process (the Python interop test, the shutdown
 * test). It serves:
 *   /ps.test.Test/Echo   unary: answers the request bytes back;
 *   /ps.test.Test/Sleep  unary: answers "slept" after N ms, N = the request
 *                        as text (both from tests/rpc_handlers.h);
 *   /ps.test.Test/Count  server-streaming: N messages "0".."N-1";
 * plus grpc.health.v1.Health. It prints "PORT <n>" on stdout once serving
 * and exits 0 after a graceful drain on SIGTERM or SIGINT.
 */
#include "common/errors.h"
#include "common/log.h"
#include "common/proc.h"
#include "common/rpc.h"
#include "tests/rpc_handlers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    ps_rpc_server_add_method(srv, "/ps.test.Test/Echo", PS_RPC_UNARY, handle_echo,
                             NULL);
    ps_rpc_server_add_method(srv, "/ps.test.Test/Sleep", PS_RPC_UNARY,
                             handle_sleep, NULL);
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
    ps_proc_announce(port);
    int sig = ps_proc_loop_run(loop);
    ps_log_info("signal %d: draining", sig);
    ps_rpc_server_shutdown(srv, 5000);
    ps_rpc_server_destroy(srv);
    ps_proc_loop_destroy(loop);
    return 0;
}
