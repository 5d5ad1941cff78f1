#include "coordinator/shardcall.h"

#include "common/auth.h"
#include "common/errors.h"
#include "proto/ps.pb-c.h"

#include <stdio.h>

#define PS_METHOD(m) "/ps.v1.ParameterServer/" m

/* pscoord's token for the shards: written once before any call. */
static char call_token[PS_AUTH_TOKEN_MAX + 1];

void coord_call_set_token(const char *token)
{
    snprintf(call_token, sizeof call_token, "%s", token != NULL ? token : "");
}

/* One unary call to a ps, on a client of its own: read copies what the
 * caller needs out of the answer (into out) before it is freed. Returns 0,
 * or PS_ERPC with st filled (local failures as UNAVAILABLE). */
static int ps_call(const char *addr, const char *method, const void *req,
                   const ProtobufCMessageDescriptor *desc,
                   void (*read)(const void *resp, void *out), void *out,
                   int deadline_ms, ps_rpc_status *st)
{
    ps_rpc_client *cl;
    ps_rpc_client_opts o = {.deadline_ms = deadline_ms, .max_attempts = 1,
                            .token = call_token};
    int rc = ps_rpc_client_create(addr, &o, &cl);
    if (rc != 0) {
        st->code = PS_RPC_UNAVAILABLE;
        snprintf(st->message, sizeof st->message,
                 "cannot make a client for '%s': %s", addr, ps_strerror(rc));
        return PS_ERPC;
    }
    void *resp = NULL;
    rc = ps_rpc_invoke_pb(cl, method, req, desc, &resp, deadline_ms, st);
    ps_rpc_client_destroy(cl);
    if (rc != 0)
        return rc;
    read(resp, out);
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

static void read_set_sync(const void *resp, void *out)
{
    const Ps__V1__SetSyncWorkersResponse *r = resp;
    *(uint32_t *)out = r->previous;
}

int coord_call_set_sync(const char *addr, uint32_t workers, int deadline_ms,
                        uint32_t *previous, ps_rpc_status *st)
{
    Ps__V1__SetSyncWorkersRequest req = PS__V1__SET_SYNC_WORKERS_REQUEST__INIT;
    req.workers = workers;
    return ps_call(addr, PS_METHOD("SetSyncWorkers"), &req,
                   &ps__v1__set_sync_workers_response__descriptor,
                   read_set_sync, previous, deadline_ms, st);
}

static void read_checkpoint(const void *resp, void *out)
{
    const Ps__V1__CheckpointResponse *cr = resp;
    struct coord_ckpt_answer *a = out;
    a->step = cr->step;
    a->bytes = cr->bytes;
    snprintf(a->path, sizeof a->path, "%s", cr->path);
}

int coord_call_checkpoint(const char *addr, uint64_t step,
                          uint32_t keep_at_least, int deadline_ms,
                          struct coord_ckpt_answer *out, ps_rpc_status *st)
{
    Ps__V1__CheckpointRequest req = PS__V1__CHECKPOINT_REQUEST__INIT;
    req.step = step;
    req.keep_at_least = keep_at_least;
    return ps_call(addr, PS_METHOD("Checkpoint"), &req,
                   &ps__v1__checkpoint_response__descriptor, read_checkpoint,
                   out, deadline_ms, st);
}

struct restore_answer {
    uint64_t *restored, *variables;
};

static void read_restore(const void *resp, void *out)
{
    const Ps__V1__RestoreResponse *r = resp;
    const struct restore_answer *a = out;
    *a->restored = r->step;
    *a->variables = r->variables;
}

int coord_call_restore(const char *addr, uint64_t step, int deadline_ms,
                       uint64_t *restored, uint64_t *variables,
                       ps_rpc_status *st)
{
    Ps__V1__RestoreRequest req = PS__V1__RESTORE_REQUEST__INIT;
    req.step = step;
    struct restore_answer a = {restored, variables};
    return ps_call(addr, PS_METHOD("Restore"), &req,
                   &ps__v1__restore_response__descriptor, read_restore, &a,
                   deadline_ms, st);
}

static void read_stats(const void *resp, void *out)
{
    const Ps__V1__StatsResponse *r = resp;
    struct coord_stats_answer *a = out;
    a->variables = r->variables;
    a->uptime_seconds = r->uptime_seconds;
}

int coord_call_stats(const char *addr, int deadline_ms,
                     struct coord_stats_answer *out, ps_rpc_status *st)
{
    Ps__V1__StatsRequest req = PS__V1__STATS_REQUEST__INIT;
    return ps_call(addr, PS_METHOD("Stats"), &req,
                   &ps__v1__stats_response__descriptor, read_stats, out,
                   deadline_ms, st);
}
