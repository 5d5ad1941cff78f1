/*
 * rpc_handlers.h - the test handlers that both rpc_test_server (called from
 * outside the process) and check_rpc (called in-process) serve:
 *   handle_echo   unary: answers the request bytes back;
 *   handle_sleep  unary: answers "slept" after N ms, N = the request as
 *                 text, from a helper thread, as a waiting handler would;
 *                 fails DEADLINE_EXCEEDED once the call is cancelled or
 *                 past its deadline, INVALID_ARGUMENT if the request is
 *                 not a number.
 *
 * Threads and lifetime: the handlers run on the server's threads; each
 * sleep has a detached thread of its own that ends the call and frees its
 * state. Every function is static, for a test's own translation unit.
 */
#ifndef PS_TEST_RPC_HANDLERS_H
#define PS_TEST_RPC_HANDLERS_H

#include "common/clock.h"
#include "common/rpc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void handle_echo(ps_rpc_call *call, const uint8_t *req, size_t len,
                      void *ctx)
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
        struct timespec ts = {0, 2 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (ps_rpc_call_cancelled(s->call))
        ps_rpc_fail(s->call, PS_RPC_DEADLINE_EXCEEDED, "slept past the deadline");
    else
        ps_rpc_reply(s->call, "slept", 5);
    free(s);
    return NULL;
}

static void handle_sleep(ps_rpc_call *call, const uint8_t *req, size_t len,
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

#endif
