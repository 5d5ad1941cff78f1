/*
 * health.h - the state behind the standard grpc.health.v1.Health service
 * that every server answers: which services it has, which of them serve,
 * and the Watch calls to tell when that changes.
 *
 * rpc_server.c answers the calls; this module decides what they say. It
 * knows nothing of gRPC or of calls: requests and responses are the
 * serialized health.proto messages, a watcher is an opaque pointer, and a
 * status reaches a watcher through the send function given at creation.
 *
 * Threads and lifetime: every function may be called from any thread (one
 * mutex, held while send runs, so send must not call back in here). A
 * watcher stays listed from ps_health_watch until ps_health_unwatch or
 * ps_health_shutdown hands it back; after that it is never touched again.
 */
#ifndef PS_HEALTH_H
#define PS_HEALTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ps_health ps_health;

/* Sends msg (a serialized HealthCheckResponse, msg[0..len)) to a watcher. */
typedef void (*ps_health_send_fn)(void *watcher, const uint8_t *msg, size_t len);

/* Room a serialized HealthCheckResponse needs. */
#define PS_HEALTH_RESPONSE_MAX 16

/* 0 or -ENOMEM. */
int ps_health_create(ps_health_send_fn send, ps_health **out);
/* Frees the table; watchers must have been handed back. NULL: no-op. */
void ps_health_destroy(ps_health *h);

/* Lists a service ("" = the whole server) as NOT_SERVING if it is not
 * listed yet. 0 or -ENOMEM. */
int ps_health_add(ps_health *h, const char *service);
/* Sets a service's status, listing it if needed, and tells its watchers
 * when it changes. */
void ps_health_set(ps_health *h, const char *service, bool serving);
/* Sets every listed service's status (watchers are not told: a server
 * calls it at start, before any call can watch). */
void ps_health_set_all(ps_health *h, bool serving);

/* Answers a Check request: 0 with the response in out[0..*outlen);
 * PS_EPARSE when req does not parse, PS_ENOTFOUND for a service not
 * listed, -ENOMEM; err then says what was wrong, in the words the client
 * is sent. */
int ps_health_check(ps_health *h, const uint8_t *req, size_t len,
                    uint8_t out[PS_HEALTH_RESPONSE_MAX], size_t *outlen,
                    char *err, size_t errlen);

/* Starts a Watch: sends the service's status to watcher at once and lists
 * it to be told of changes. Returns 0; PS_EPARSE or -ENOMEM (nothing sent);
 * PS_ESHUTDOWN after ps_health_shutdown (NOT_SERVING sent, not listed);
 * err says what was wrong. */
int ps_health_watch(ps_health *h, void *watcher, const uint8_t *req,
                    size_t len, char *err, size_t errlen);
/* Takes a watcher whose call ended off the list. True when it was still
 * listed (its call then still needs ending). */
bool ps_health_unwatch(ps_health *h, void *watcher);

/* The server is going away: every service reads NOT_SERVING from now on,
 * each watcher is sent NOT_SERVING and then handed to end(watcher, ctx)
 * (outside the lock) to end its call. */
void ps_health_shutdown(ps_health *h, void (*end)(void *watcher, void *ctx),
                        void *ctx);

#endif
