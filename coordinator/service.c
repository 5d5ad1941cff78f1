#include "coordinator/service.h"

#include "common/auth.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/wire.h"
#include "coordinator/kvstore.h"
#include "coordinator/shardcall.h"
#include "proto/ps.pb-c.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COORD_METHOD(m) "/ps.v1.Coordinator/" m

struct watcher {
    ps_rpc_call *call;
    uint64_t generation;    /* of the last state sent */
    uint64_t progress;
    int64_t sent_ms;
    struct watcher *next;
};

/* A Coordinator method: its request's type and the handler of a request
 * that parsed (the request is freed when the handler returns). */
struct method {
    const char *path;
    enum ps_rpc_kind kind;
    const ProtobufCMessageDescriptor *req;
    void (*fn)(coord_service *s, ps_rpc_call *call, const void *req);
};

#define NMETHODS 8

/* What the server hands dispatch for one method. */
struct bound_method {
    coord_service *s;
    const struct method *m;
};

struct coord_service {
    coord *c;
    coord_sched *sched;
    coord_kv *kv;         /* KvSet, KvGet and the all-reduce generations */
    int interval_ms;
    pthread_mutex_t mu;   /* guards the fields below; taken before coord's */
    struct watcher *watchers;
    bool stopping;
    bool started;
    pthread_t th;
    struct bound_method bound[NMETHODS];
};

/* ---- ps.v1 messages <-> coord.h's structs ------------------------------ */

/* The wire's Role values are ps_role + 1; 0 is "unspecified". */
static void role_in(Ps__V1__Role pb, int *role, int *sent)
{
    *sent = (int)pb;
    if (pb == PS__V1__ROLE__ROLE_UNSPECIFIED)
        *role = COORD_ROLE_ANY;
    else if (pb >= PS__V1__ROLE__CHIEF && pb <= PS__V1__ROLE__EVALUATOR)
        *role = (int)pb - 1;
    else
        *role = COORD_ROLE_BAD;
}

static struct coord_task_ref task_ref_in(const char *job_id, Ps__V1__Role role,
                                         uint32_t index, const char *secret)
{
    struct coord_task_ref ref = {.job_id = job_id, .index = index,
                                 .secret = secret};
    role_in(role, &ref.role, &ref.role_sent);
    return ref;
}

static Ps__V1__Role role_out(enum ps_role r)
{
    return (Ps__V1__Role)((int)r + 1);
}

/* A new message of d, malloc'd and initialised, as
 * protobuf_c_message_free_unpacked expects of what it frees; NULL when out
 * of memory. */
static void *pb_new(const ProtobufCMessageDescriptor *d)
{
    ProtobufCMessage *m = malloc(d->sizeof_message);
    if (m != NULL)
        protobuf_c_message_init(d, m);
    return m;
}

/* Builds the protobuf form of a placement; the array and everything in it
 * are malloc'd, as protobuf_c_message_free_unpacked expects. On failure
 * what was built is left in *out and *nout for placement_pb_free. */
static int placement_pb(const struct ps_placement *p,
                        Ps__V1__VariablePlacement ***out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    if (p->nvars == 0)
        return 0;
    Ps__V1__VariablePlacement **arr = calloc((size_t)p->nvars, sizeof *arr);
    if (arr == NULL)
        return -ENOMEM;
    *out = arr;
    for (int i = 0; i < p->nvars; i++) {
        const struct ps_place_var *v = &p->vars[i];
        Ps__V1__VariablePlacement *vp =
            pb_new(&ps__v1__variable_placement__descriptor);
        if (vp == NULL)
            return -ENOMEM;
        arr[i] = vp;
        (*nout)++;
        vp->name = strdup(v->name);
        if (vp->name == NULL)
            return -ENOMEM;
        vp->hash_partitioned = v->hash_partitioned;
        if (v->ndims > 0) {
            vp->shape = malloc(sizeof *vp->shape * (size_t)v->ndims);
            if (vp->shape == NULL)
                return -ENOMEM;
            memcpy(vp->shape, v->shape, sizeof *vp->shape * (size_t)v->ndims);
            vp->n_shape = (size_t)v->ndims;
        }
        vp->parts = calloc((size_t)v->nparts, sizeof *vp->parts);
        if (vp->parts == NULL)
            return -ENOMEM;
        for (int k = 0; k < v->nparts; k++) {
            Ps__V1__VariablePart *part =
                pb_new(&ps__v1__variable_part__descriptor);
            if (part == NULL)
                return -ENOMEM;
            vp->parts[k] = part;
            vp->n_parts++;
            part->name = strdup(v->parts[k].name);
            if (part->name == NULL)
                return -ENOMEM;
            part->shard = v->parts[k].shard;
            part->row_begin = v->parts[k].row_begin;
            part->row_end = v->parts[k].row_end;
        }
    }
    return 0;
}

static void placement_pb_free(Ps__V1__VariablePlacement **arr, size_t n)
{
    for (size_t i = 0; i < n; i++)
        protobuf_c_message_free_unpacked(&arr[i]->base, NULL);
    free(arr);
}

/* Fills ti (from pb_new) with a task; -ENOMEM leaves it for the caller to
 * free. */
static int task_pb(const struct coord_task_info *t, Ps__V1__TaskInfo *ti)
{
    ti->address = strdup(t->address);
    ti->local_address = strdup(t->local_address);
    ti->host_id = strdup(t->host_id);
    if (ti->address == NULL || ti->local_address == NULL || ti->host_id == NULL)
        return -ENOMEM;
    ti->role = role_out(t->role);
    ti->index = t->index;
    ti->alive = t->alive;
    ti->insecure_collective = t->insecure_collective;
    ti->incarnation = t->incarnation;
    ti->step = t->step;
    ti->examples_per_second = t->examples_per_second;
    ti->loss = t->loss;
    ti->accuracy = t->accuracy;
    ti->last_heartbeat_age_seconds = t->last_heartbeat_age_seconds;
    return 0;
}

/* The ClusterState message of a snapshot, malloc'd throughout; free with
 * protobuf_c_message_free_unpacked. NULL when out of memory. */
static Ps__V1__ClusterState *cluster_pb(const struct coord_cluster *c)
{
    Ps__V1__ClusterState *s = pb_new(&ps__v1__cluster_state__descriptor);
    if (s == NULL)
        return NULL;
    s->job_id = strdup(c->job_id);
    s->last_checkpoint_path = strdup(c->last_checkpoint_path);
    s->tasks = calloc((size_t)(c->ntasks > 0 ? c->ntasks : 1),
                      sizeof *s->tasks);
    if (s->job_id == NULL || s->last_checkpoint_path == NULL ||
        s->tasks == NULL)
        goto fail;
    for (int i = 0; i < c->ntasks; i++) {
        Ps__V1__TaskInfo *ti = pb_new(&ps__v1__task_info__descriptor);
        if (ti == NULL)
            goto fail;
        s->tasks[s->n_tasks++] = ti;
        if (task_pb(&c->tasks[i], ti) != 0)
            goto fail;
    }
    s->last_checkpoint_step = c->last_checkpoint_step;
    s->eval_accuracy = c->eval_accuracy;
    s->eval_loss = c->eval_loss;
    s->eval_step = c->eval_step;
    s->generation = c->generation;
    if (placement_pb(&c->placement, &s->placement, &s->n_placement) != 0)
        goto fail;
    s->num_ps = c->num_ps;
    s->num_workers = c->num_workers;
    s->live_workers = c->live_workers;
    s->global_step = c->global_step;
    s->last_checkpoint_age_seconds = c->last_checkpoint_age_seconds;
    s->heartbeat_interval_ms = c->heartbeat_interval_ms;
    return s;
fail:
    protobuf_c_message_free_unpacked(&s->base, NULL);
    return NULL;
}

/* The coordinator's snapshot as a message; NULL when out of memory. */
static Ps__V1__ClusterState *snapshot_pb(coord *c)
{
    struct coord_cluster *snap = coord_snapshot(c);
    if (snap == NULL)
        return NULL;
    Ps__V1__ClusterState *s = cluster_pb(snap);
    coord_cluster_free(snap);
    return s;
}

/* The snapshot with the all-reduce generation (kvstore.h). */
static Ps__V1__ClusterState *snapshot_gen_pb(coord_service *sv)
{
    Ps__V1__ClusterState *s = snapshot_pb(sv->c);
    if (s != NULL && sv->kv != NULL)
        s->group_generation = coord_kv_generation(sv->kv, &s->group_workers,
                                                  &s->n_group_workers);
    return s;
}

/* A Place proposal as variables (names borrowed from req). Refuses, as the
 * core does, one with too many dimensions. */
static int proposal_in(const Ps__V1__PlaceRequest *req,
                       struct ps_place_var **out, struct coord_status *st)
{
    size_t n = req->n_variables;
    struct ps_place_var *vars = calloc(n > 0 ? n : 1, sizeof *vars);
    if (vars == NULL)
        return coord_refuse(st, PS_RPC_RESOURCE_EXHAUSTED, "Place",
                            "out of memory");
    for (size_t i = 0; i < n; i++) {
        const Ps__V1__VariablePlacement *v = req->variables[i];
        vars[i].name = v->name;
        if (v->n_shape > PS_PLACE_MAX_DIMS) {
            free(vars);
            return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, "Place",
                                "variable '%s': %zu dimensions, at most %d",
                                v->name, v->n_shape, PS_PLACE_MAX_DIMS);
        }
        vars[i].ndims = (int)v->n_shape;
        vars[i].hash_partitioned = v->hash_partitioned;
        memcpy(vars[i].shape, v->shape, sizeof *v->shape * v->n_shape);
    }
    *out = vars;
    return 0;
}

/* ---- the handlers ------------------------------------------------------ */

/* Each handler is given a request that parsed; dispatch (below the
 * handlers) unpacks it and frees it once the handler returns. */

static void refused(ps_rpc_call *call, const struct coord_status *st)
{
    ps_rpc_fail(call, (enum ps_rpc_code)st->code, "%s", st->msg);
}

/* A ps registered without its secret from the address of the live ps that
 * holds its slot (coord.h, probe_incarnation): whether the process that
 * answers Stats there started after the holder registered. Its uptime is
 * measured after the holder's age was, so an answer from the holder itself
 * is always the longer. A process of the same user on that host with
 * SO_REUSEPORT could answer in its place; that user owns psd anyway. */
static bool holder_gone(const struct coord_register_resp *out,
                        const char *addr)
{
    if (out->probe_incarnation == 0 || addr == NULL || addr[0] == '\0')
        return false;
    struct coord_stats_answer a;
    ps_rpc_status st;
    if (coord_call_stats(addr, 1000, &a, &st) != 0)
        return false;
    return a.uptime_seconds >= 0 &&
           a.uptime_seconds * 1000.0 < (double)out->probe_age_ms;
}

static void on_register(coord_service *s, ps_rpc_call *call, const void *req)
{
    const Ps__V1__RegisterRequest *r = req;
    struct coord_register_req in = {.job_id = r->job_id,
                                    .index = r->index,
                                    .address = r->address,
                                    .local_address = r->local_address,
                                    .host_id = r->host_id,
                                    .insecure_collective = r->insecure_collective,
                                    .empty = r->empty,
                                    .secret = r->task_secret};
    role_in(r->role, &in.role, &in.role_sent);
    struct coord_register_resp out;
    struct coord_ps_call restore;
    struct coord_status st;
    bool want_restore = false;
    const char *peer = ps_rpc_call_peer(call);
    int rc = coord_register(s->c, &in, peer, &out, &restore, &want_restore,
                            &st);
    if (rc != 0 && holder_gone(&out, in.address)) {
        in.holder_gone = out.probe_incarnation;
        rc = coord_register(s->c, &in, peer, &out, &restore, &want_restore,
                            &st);
    }
    if (rc != 0) {
        refused(call, &st);
    } else {
        Ps__V1__RegisterResponse resp = PS__V1__REGISTER_RESPONSE__INIT;
        resp.role = role_out(out.role);
        resp.index = (uint32_t)out.index;
        resp.incarnation = out.incarnation;
        resp.heartbeat_interval_ms = out.heartbeat_interval_ms;
        resp.task_secret = out.secret;
        /* NULL when out of memory: registered all the same; the task
         * fetches the cluster later. */
        resp.cluster = out.cluster != NULL ? cluster_pb(out.cluster) : NULL;
        ps_rpc_reply_pb(call, &resp);
        if (resp.cluster != NULL)
            protobuf_c_message_free_unpacked(&resp.cluster->base, NULL);
        coord_cluster_free(out.cluster);
        if (want_restore)
            coord_sched_restore(s->sched, &restore);
    }
}

static void on_heartbeat(coord_service *s, ps_rpc_call *call, const void *req)
{
    const Ps__V1__HeartbeatRequest *r = req;
    struct coord_heartbeat_req in = {
        .from = task_ref_in(r->job_id, r->role, r->index, r->task_secret),
        .incarnation = r->incarnation, .step = r->step,
        .examples_per_second = r->examples_per_second, .loss = r->loss};
    Ps__V1__HeartbeatResponse resp = PS__V1__HEARTBEAT_RESPONSE__INIT;
    Ps__V1__Directive d = PS__V1__DIRECTIVE__INIT;
    Ps__V1__Directive *dp = &d;
    struct coord_status st;
    enum coord_directive kind;
    if (coord_heartbeat(s->c, &in, &kind, &resp.generation, &st) != 0) {
        refused(call, &st);
    } else {
        if (kind == COORD_DIRECTIVE_REREGISTER) {
            d.kind = PS__V1__DIRECTIVE__KIND__REREGISTER;
            resp.directives = &dp;
            resp.n_directives = 1;
        }
        ps_rpc_reply_pb(call, &resp);
    }
}

static void on_get_cluster(coord_service *s, ps_rpc_call *call,
                           const void *req)
{
    const Ps__V1__GetClusterRequest *r = req;
    struct coord_status st;
    if (coord_check_job(s->c, r->job_id, "GetCluster", &st) != 0) {
        refused(call, &st);
    } else {
        Ps__V1__ClusterState *snap = snapshot_gen_pb(s);
        if (snap == NULL) {
            ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED,
                        "out of memory building the cluster state");
        } else {
            ps_rpc_reply_pb(call, snap);
            protobuf_c_message_free_unpacked(&snap->base, NULL);
        }
    }
}

/* Packs the current state for watchers. Returns a malloc'd buffer (and its
 * generation and length) or NULL when out of memory. */
static uint8_t *pack_state(coord *c, size_t *len, uint64_t *generation)
{
    Ps__V1__ClusterState *snap = snapshot_pb(c);
    if (snap == NULL)
        return NULL;
    *len = protobuf_c_message_get_packed_size(&snap->base);
    uint8_t *buf = malloc(*len > 0 ? *len : 1);
    if (buf != NULL)
        protobuf_c_message_pack(&snap->base, buf);
    *generation = snap->generation;
    protobuf_c_message_free_unpacked(&snap->base, NULL);
    return buf;
}

static void on_watch_cluster(coord_service *s, ps_rpc_call *call,
                             const void *req)
{
    const Ps__V1__GetClusterRequest *r = req;
    struct coord_status st;
    int rc = coord_check_job(s->c, r->job_id, "WatchCluster", &st);
    if (rc != 0) {
        refused(call, &st);
        return;
    }
    struct watcher *w = calloc(1, sizeof *w);
    if (w == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    w->call = call;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        free(w);
        ps_rpc_fail(call, PS_RPC_UNAVAILABLE,
                    "the coordinator is shutting down");
        return;
    }
    uint64_t generation, progress;
    coord_versions(s->c, &generation, &progress);
    size_t n = 0;
    uint8_t *buf = pack_state(s->c, &n, &w->generation);
    w->progress = progress;
    w->sent_ms = ps_now_ms();
    if (buf == NULL || ps_rpc_stream_write(call, buf, n) != 0) {
        pthread_mutex_unlock(&s->mu);
        free(buf);
        free(w);
        ps_rpc_fail(call, buf == NULL ? PS_RPC_RESOURCE_EXHAUSTED
                                      : PS_RPC_CANCELLED,
                    buf == NULL ? "out of memory building the cluster state"
                                : "the watch was cancelled");
        return;
    }
    free(buf);
    w->next = s->watchers;
    s->watchers = w;
    pthread_mutex_unlock(&s->mu);
    ps_log_debug("WatchCluster from %s: watching", ps_rpc_call_peer(call));
}

static void on_report_metrics(coord_service *s, ps_rpc_call *call,
                              const void *req)
{
    const Ps__V1__ReportMetricsRequest *r = req;
    struct coord_metrics_req in = {
        .from = task_ref_in(r->job_id, r->role, r->index, r->task_secret),
        .step = r->step,
        .loss = r->loss, .accuracy = r->accuracy};
    struct coord_status st;
    if (coord_report_metrics(s->c, &in, &st) != 0) {
        refused(call, &st);
    } else {
        Ps__V1__ReportMetricsResponse resp =
            PS__V1__REPORT_METRICS_RESPONSE__INIT;
        ps_rpc_reply_pb(call, &resp);
    }
}

/* Answers a Place request: the job check first, then the proposal's own
 * shape, then the core. */
static int place(coord *c, const Ps__V1__PlaceRequest *req, bool operator,
                 Ps__V1__PlaceResponse *resp, struct coord_status *st)
{
    struct ps_place_var *vars = NULL;
    struct ps_placement placed;
    int rc = coord_check_job(c, req->job_id, "Place", st);
    if (rc == 0)
        rc = proposal_in(req, &vars, st);
    struct coord_task_ref from = task_ref_in(req->job_id, req->role, req->index,
                                             req->task_secret);
    if (rc == 0)
        rc = coord_place(c, vars, (int)req->n_variables, &from, operator, &placed, st);
    free(vars);
    if (rc != 0)
        return rc;
    if (placement_pb(&placed, &resp->placement, &resp->n_placement) != 0) {
        placement_pb_free(resp->placement, resp->n_placement);
        resp->placement = NULL;
        resp->n_placement = 0;
        rc = coord_refuse(st, PS_RPC_RESOURCE_EXHAUSTED, "Place",
                          "out of memory");
    }
    ps_placement_free(&placed);
    return rc;
}

static void on_place(coord_service *s, ps_rpc_call *call, const void *req)
{
    const Ps__V1__PlaceRequest *r = req;
    Ps__V1__PlaceResponse resp = PS__V1__PLACE_RESPONSE__INIT;
    struct coord_status st;
    bool operator = ps_rpc_call_role(call) == PS_AUTH_OPERATOR;
    if (place(s->c, r, operator, &resp, &st) != 0) {
        refused(call, &st);
    } else {
        ps_rpc_reply_pb(call, &resp);
        placement_pb_free(resp.placement, resp.n_placement);
    }
}

static void on_kv_set(coord_service *s, ps_rpc_call *call, const void *req)
{
    coord_kv_on_set(s->kv, call, req);
}

static void on_kv_get(coord_service *s, ps_rpc_call *call, const void *req)
{
    coord_kv_on_get(s->kv, call, req);
}

/* ---- the watch thread -------------------------------------------------- */

/* One pass over the watchers: ends cancelled streams and sends the state to
 * those that are behind. Called with s->mu held. */
static void serve_watchers_locked(coord_service *s)
{
    uint64_t generation, progress;
    coord_versions(s->c, &generation, &progress);
    int64_t now = ps_now_ms();
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t buf_generation = generation;
    for (struct watcher **p = &s->watchers; *p != NULL;) {
        struct watcher *w = *p;
        bool send = w->generation != generation ||
                    (w->progress != progress &&
                     now - w->sent_ms >= s->interval_ms);
        bool gone = ps_rpc_call_cancelled(w->call);
        if (!gone && send) {
            if (buf == NULL)
                buf = pack_state(s->c, &len, &buf_generation);
            if (buf == NULL)
                break; /* out of memory: try again next pass */
            gone = ps_rpc_stream_write(w->call, buf, len) != 0;
            w->generation = buf_generation;
            w->progress = progress;
            w->sent_ms = now;
        }
        if (!gone) {
            p = &w->next;
            continue;
        }
        *p = w->next;
        ps_rpc_fail(w->call, PS_RPC_CANCELLED, "watch ended by the client");
        free(w);
    }
    free(buf);
}

static void *watch_main(void *arg)
{
    coord_service *s = arg;
    uint64_t seen = 0;
    for (;;) {
        seen = coord_wait(s->c, seen, s->interval_ms);
        pthread_mutex_lock(&s->mu);
        if (s->stopping) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        serve_watchers_locked(s);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* ---- lifecycle --------------------------------------------------------- */

int coord_service_create(coord *c, coord_sched *sched, int interval_ms,
                         coord_service **out)
{
    coord_service *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    s->c = c;
    s->sched = sched;
    s->interval_ms = interval_ms > 0 ? interval_ms : 500;
    int rc = coord_kv_create(c, &s->kv);
    if (rc != 0) {
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return 0;
}

static const struct method methods[NMETHODS] = {
    {COORD_METHOD("RegisterTask"), PS_RPC_UNARY,
     &ps__v1__register_request__descriptor, on_register},
    {COORD_METHOD("Heartbeat"), PS_RPC_UNARY,
     &ps__v1__heartbeat_request__descriptor, on_heartbeat},
    {COORD_METHOD("GetCluster"), PS_RPC_UNARY,
     &ps__v1__get_cluster_request__descriptor, on_get_cluster},
    {COORD_METHOD("WatchCluster"), PS_RPC_SERVER_STREAM,
     &ps__v1__get_cluster_request__descriptor, on_watch_cluster},
    {COORD_METHOD("ReportMetrics"), PS_RPC_UNARY,
     &ps__v1__report_metrics_request__descriptor, on_report_metrics},
    {COORD_METHOD("Place"), PS_RPC_UNARY, &ps__v1__place_request__descriptor,
     on_place},
    {COORD_METHOD("KvSet"), PS_RPC_UNARY, &ps__v1__kv_set_request__descriptor,
     on_kv_set},
    {COORD_METHOD("KvGet"), PS_RPC_UNARY, &ps__v1__kv_get_request__descriptor,
     on_kv_get},
};

/* Every method's entry: parses the request and runs its handler. A request
 * that does not parse is the client's mistake, said plainly. */
static void dispatch(ps_rpc_call *call, const uint8_t *req, size_t len,
                     void *ctx)
{
    const struct bound_method *b = ctx;
    ProtobufCMessage *r = protobuf_c_message_unpack(b->m->req, NULL, len, req);
    if (r == NULL) {
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                    "%s: %zu bytes that do not parse", b->m->req->c_name,
                    len);
        return;
    }
    /* protobuf-c cuts a string at its first NUL ("job\0x" is "job"): a
     * name or address that holds one is refused, never taken cut short. */
    char where[256];
    size_t at;
    if (ps_wire_pb_nul(req, len, b->m->req, where, sizeof where, &at)) {
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: %s has a NUL byte at %zu",
                    b->m->req->short_name, where, at);
        protobuf_c_message_free_unpacked(r, NULL);
        return;
    }
    b->m->fn(b->s, call, r);
    protobuf_c_message_free_unpacked(r, NULL);
}

int coord_service_register(coord_service *s, ps_rpc_server *srv)
{
    for (int i = 0; i < NMETHODS; i++) {
        s->bound[i] = (struct bound_method){.s = s, .m = &methods[i]};
        int rc = ps_rpc_server_add_method(srv, methods[i].path,
                                          methods[i].kind, dispatch,
                                          &s->bound[i]);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int coord_service_start(coord_service *s)
{
    int rc = pthread_create(&s->th, NULL, watch_main, s);
    if (rc != 0)
        return -rc;
    s->started = true;
    return 0;
}

void coord_service_stop(coord_service *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    bool was = s->stopping;
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);
    if (was)
        return;
    coord_kv_stop(s->kv);
    coord_kick(s->c);
    if (s->started)
        pthread_join(s->th, NULL);
    s->started = false;
    pthread_mutex_lock(&s->mu);
    struct watcher *w = s->watchers;
    s->watchers = NULL;
    pthread_mutex_unlock(&s->mu);
    while (w != NULL) {
        struct watcher *next = w->next;
        ps_rpc_fail(w->call, PS_RPC_UNAVAILABLE,
                    "the coordinator is shutting down");
        free(w);
        w = next;
    }
}

void coord_service_destroy(coord_service *s)
{
    if (s == NULL)
        return;
    coord_service_stop(s);
    coord_kv_destroy(s->kv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
