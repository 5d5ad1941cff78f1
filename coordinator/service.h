/*
 * service.h - ps.v1.Coordinator over gRPC: RegisterTask, Heartbeat,
 * GetCluster, WatchCluster, ReportMetrics, Place. Each handler decodes its
 * request, converts it to coord.h's plain structs, asks coord.c, and
 * converts the answer back; refusals carry coord's status and message.
 * service.c is the coordinator's server edge: the only file on that side
 * that includes the generated protobuf header (shardcall.c is the client
 * edge).
 *
 * WatchCluster streams stay open: each is kept in a list served by one
 * thread, which sends the cluster state when the generation changes, and at most
 * once per interval while only progress (steps, metrics) changes. A stream
 * ends when the client cancels it (CANCELLED) or when the service stops
 * (UNAVAILABLE "the coordinator is shutting down"); each exactly once.
 *
 * Threads and lifetime: handlers run on the server's threads. Call
 * coord_service_stop before ps_rpc_server_shutdown, so that no watch stream
 * holds the drain open; after it, new watches are refused. The coord and
 * scheduler must outlive the service.
 */
#ifndef COORD_SERVICE_H
#define COORD_SERVICE_H

#include "coordinator/coord.h"
#include "common/rpc.h"
#include "coordinator/schedule.h"

typedef struct coord_service coord_service;

/* interval_ms: the longest a watcher waits for a state whose steps moved.
 * Returns 0 or -ENOMEM. */
int coord_service_create(coord *c, coord_sched *sched, int interval_ms,
                         coord_service **out);
/* Adds the six methods to srv (before ps_rpc_server_start). Returns 0 or
 * what ps_rpc_server_add_method returns. */
int coord_service_register(coord_service *s, ps_rpc_server *srv);
/* Starts the watch thread. Returns 0 or -errno. */
int coord_service_start(coord_service *s);
/* Ends every watch stream and joins the watch thread. Idempotent. */
void coord_service_stop(coord_service *s);
void coord_service_destroy(coord_service *s);

#endif
