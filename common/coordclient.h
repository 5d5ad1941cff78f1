/*
 * coordclient.h - a task's side of the coordinator: register, then a
 * heartbeat thread that reports progress and relays directives.
 *
 * The data path never waits on the coordinator: if it is down, heartbeats
 * fail quietly (one warning, then debug lines) and resume when it is back;
 * a coordinator that restarted and lost track of the task answers
 * REREGISTER, and the thread registers again with the same role and index.
 *
 * The coordinator's answer to the first registration carries a task secret,
 * kept here in memory only and sent with every heartbeat, metrics report and
 * re-registration. A restarted process has lost it: its registration is
 * refused (PERMISSION_DENIED or ALREADY_EXISTS) until its previous process
 * has missed heartbeats for the coordinator's timeout, and ps_coord_join
 * retries that long within register_budget_ms.
 *
 * Threads and lifetime: ps_coord_join registers on the calling thread and
 * starts the heartbeat thread; ps_coord_report may be called from any
 * thread; ps_coord_leave stops the thread and frees.
 */
#ifndef PS_COORDCLIENT_H
#define PS_COORDCLIENT_H

#include "common/rpc.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct ps_coord ps_coord;

/* Called on the heartbeat thread for each directive (ps.v1 Directive.Kind
 * and its step). */
typedef void (*ps_coord_directive_fn)(void *ctx, int kind, uint64_t step);

typedef struct ps_coord_opts {
    const char *coordinator;   /* host:port */
    const char *job_id;
    int role;                  /* ps.v1 Role */
    int index;                 /* -1: let the coordinator assign one */
    const char *address;       /* where this task serves ("" if nowhere) */
    bool empty;                /* ps: holds no variables (at the first
                                  registration; is_empty is asked later) */
    bool (*is_empty)(void *ctx);/* ps: asked at each re-registration */
    int64_t register_budget_ms;/* keep retrying registration this long */
    ps_coord_directive_fn on_directive;
    void *ctx;
    const char *token;         /* sent with every call (auth.h); NULL: none */
    const char *local_address; /* ps: "unix:/path" of its local socket; NULL
                                  or "": none */
    const char *host_id;       /* ps: common/hostid.h; NULL or "": none */
    bool insecure_collective;  /* worker: all-reduce in plaintext on a
                                  non-loopback address (published) */
} ps_coord_opts;

/* Registers (retrying UNAVAILABLE, and ALREADY_EXISTS or PERMISSION_DENIED
 * while an old incarnation of this task times out, within
 * register_budget_ms) and starts
 * heartbeats. On success *index_out (may be NULL) is the assigned index.
 * Returns 0, or PS_ERPC with one line in err (the coordinator's refusal). */
int ps_coord_join(const ps_coord_opts *o, ps_coord **out, int *index_out,
                  char *err, size_t errlen);

/* Progress for the next heartbeat. */
void ps_coord_report(ps_coord *c, uint64_t step, double examples_per_second,
                     double loss);

/* The cluster as the coordinator sees it now: a Ps__V1__ClusterState the
 * caller frees with ps__v1__cluster_state__free_unpacked. */
int ps_coord_cluster(ps_coord *c, void **state_out, ps_rpc_status *st);

/* Place: proposes a model's variables (a const Ps__V1__PlaceRequest *, job
 * id filled in here) and returns the placement (a Ps__V1__PlaceResponse *
 * to free with ps__v1__place_response__free_unpacked). */
int ps_coord_place(ps_coord *c, void *req, void **resp_out, ps_rpc_status *st);

/* ReportMetrics for an evaluator. */
int ps_coord_metrics(ps_coord *c, uint64_t step, double loss, double accuracy);

/* The coordinator's key/value store (multi_worker_mirrored's rendezvous,
 * coordinator/kvstore.h). KvSet: 0 or PS_ERPC. KvGet waits up to
 * timeout_ms (0: not at all) for key; *val (malloc'd, freed by the caller)
 * and *len, and *generation (may be NULL) the store's generation. PS_ERPC
 * with st->code DEADLINE_EXCEEDED (or NOT_FOUND for timeout 0) when the key
 * is not set. UNAVAILABLE is retried within the call's deadline. */
int ps_coord_kv_set(ps_coord *c, const char *key, const void *val, size_t len,
                    ps_rpc_status *st);
int ps_coord_kv_get(ps_coord *c, const char *key, int timeout_ms, void **val,
                    size_t *len, uint64_t *generation, ps_rpc_status *st);

/* This task's index as the coordinator assigned it. */
int ps_coord_index(const ps_coord *c);

void ps_coord_leave(ps_coord *c);

#endif
