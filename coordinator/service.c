#include "service.h"

#include "clock.h"
#include "errors.h"
#include "log.h"
#include "ps.pb-c.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COORD_METHOD(m) "/ps.v1.Coordinator/" m

struct watcher {
    ps_rpc_call *call;
    uint64_t epoch;    /* of the last state sent */
    uint64_t progress;
    int64_t sent_ms;
    struct watcher *next;
};

struct coord_service {
    coord *c;
    coord_sched *sched;
    int interval_ms;
    pthread_mutex_t mu;   /* guards the fields below; taken before coord's */
    struct watcher *watchers;
    bool stopping;
    bool started;
    pthread_t th;
};

/* A request that does not parse is the client's mistake, said plainly. */
#define UNPACK(type, fn, call, req, len)                                    \
    type *r = fn(NULL, len, req);                                           \
    if (r == NULL) {                                                        \
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,                          \
                    #type ": %zu bytes that do not parse", len);            \
        return;                                                             \
    }

static void on_register(ps_rpc_call *call, const uint8_t *req, size_t len,
                        void *ctx)
{
    coord_service *s = ctx;
    UNPACK(Ps__V1__RegisterRequest, ps__v1__register_request__unpack, call,
           req, len);
    Ps__V1__RegisterResponse resp = PS__V1__REGISTER_RESPONSE__INIT;
    struct coord_ps_call restore;
    struct coord_status st;
    bool want_restore = false;
    if (coord_register(s->c, r, ps_rpc_call_peer(call), &resp, &restore,
                       &want_restore, &st) != 0) {
        ps_rpc_fail(call, (enum ps_rpc_code)st.code, "%s", st.msg);
    } else {
        ps_rpc_reply_pb(call, &resp);
        coord_snapshot_free(resp.cluster);
        if (want_restore)
            coord_sched_restore(s->sched, &restore);
    }
    ps__v1__register_request__free_unpacked(r, NULL);
}

static void on_heartbeat(ps_rpc_call *call, const uint8_t *req, size_t len,
                         void *ctx)
{
    coord_service *s = ctx;
    UNPACK(Ps__V1__HeartbeatRequest, ps__v1__heartbeat_request__unpack, call,
           req, len);
    Ps__V1__HeartbeatResponse resp = PS__V1__HEARTBEAT_RESPONSE__INIT;
    Ps__V1__Directive d = PS__V1__DIRECTIVE__INIT;
    Ps__V1__Directive *dp = &d;
    struct coord_status st;
    int kind;
    if (coord_heartbeat(s->c, r, &kind, &resp.epoch, &st) != 0) {
        ps_rpc_fail(call, (enum ps_rpc_code)st.code, "%s", st.msg);
    } else {
        if (kind != PS__V1__DIRECTIVE__KIND__NONE) {
            d.kind = (Ps__V1__Directive__Kind)kind;
            resp.directives = &dp;
            resp.n_directives = 1;
        }
        ps_rpc_reply_pb(call, &resp);
    }
    ps__v1__heartbeat_request__free_unpacked(r, NULL);
}

static void on_get_cluster(ps_rpc_call *call, const uint8_t *req, size_t len,
                           void *ctx)
{
    coord_service *s = ctx;
    UNPACK(Ps__V1__GetClusterRequest, ps__v1__get_cluster_request__unpack,
           call, req, len);
    struct coord_status st;
    if (coord_check_job(s->c, r->job_id, "GetCluster", &st) != 0) {
        ps_rpc_fail(call, (enum ps_rpc_code)st.code, "%s", st.msg);
    } else {
        Ps__V1__ClusterState *snap = coord_snapshot(s->c);
        if (snap == NULL) {
            ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED,
                        "out of memory building the cluster state");
        } else {
            ps_rpc_reply_pb(call, snap);
            coord_snapshot_free(snap);
        }
    }
    ps__v1__get_cluster_request__free_unpacked(r, NULL);
}

/* Packs the current state for watchers. Returns a malloc'd buffer (and its
 * epoch and length) or NULL when out of memory. */
static uint8_t *pack_state(coord *c, size_t *len, uint64_t *epoch)
{
    Ps__V1__ClusterState *snap = coord_snapshot(c);
    if (snap == NULL)
        return NULL;
    *len = protobuf_c_message_get_packed_size(&snap->base);
    uint8_t *buf = malloc(*len > 0 ? *len : 1);
    if (buf != NULL)
        protobuf_c_message_pack(&snap->base, buf);
    *epoch = snap->epoch;
    coord_snapshot_free(snap);
    return buf;
}

static void on_watch_cluster(ps_rpc_call *call, const uint8_t *req,
                             size_t len, void *ctx)
{
    coord_service *s = ctx;
    UNPACK(Ps__V1__GetClusterRequest, ps__v1__get_cluster_request__unpack,
           call, req, len);
    struct coord_status st;
    int rc = coord_check_job(s->c, r->job_id, "WatchCluster", &st);
    ps__v1__get_cluster_request__free_unpacked(r, NULL);
    if (rc != 0) {
        ps_rpc_fail(call, (enum ps_rpc_code)st.code, "%s", st.msg);
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
    uint64_t epoch, progress;
    coord_versions(s->c, &epoch, &progress);
    size_t n = 0;
    uint8_t *buf = pack_state(s->c, &n, &w->epoch);
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

static void on_report_metrics(ps_rpc_call *call, const uint8_t *req,
                              size_t len, void *ctx)
{
    coord_service *s = ctx;
    UNPACK(Ps__V1__ReportMetricsRequest,
           ps__v1__report_metrics_request__unpack, call, req, len);
    struct coord_status st;
    if (coord_report_metrics(s->c, r, &st) != 0) {
        ps_rpc_fail(call, (enum ps_rpc_code)st.code, "%s", st.msg);
    } else {
        Ps__V1__ReportMetricsResponse resp =
            PS__V1__REPORT_METRICS_RESPONSE__INIT;
        ps_rpc_reply_pb(call, &resp);
    }
    ps__v1__report_metrics_request__free_unpacked(r, NULL);
}

static void on_place(ps_rpc_call *call, const uint8_t *req, size_t len,
                     void *ctx)
{
    coord_service *s = ctx;
    UNPACK(Ps__V1__PlaceRequest, ps__v1__place_request__unpack, call, req,
           len);
    Ps__V1__PlaceResponse resp = PS__V1__PLACE_RESPONSE__INIT;
    struct coord_status st;
    if (coord_place(s->c, r, &resp, &st) != 0) {
        ps_rpc_fail(call, (enum ps_rpc_code)st.code, "%s", st.msg);
    } else {
        ps_rpc_reply_pb(call, &resp);
        coord_place_free(&resp);
    }
    ps__v1__place_request__free_unpacked(r, NULL);
}

/* ---- the watch thread -------------------------------------------------- */

/* One pass over the watchers: ends cancelled streams and sends the state to
 * those that are behind. Called with s->mu held. */
static void serve_watchers_locked(coord_service *s)
{
    uint64_t epoch, progress;
    coord_versions(s->c, &epoch, &progress);
    int64_t now = ps_now_ms();
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t buf_epoch = epoch;
    for (struct watcher **p = &s->watchers; *p != NULL;) {
        struct watcher *w = *p;
        bool send = w->epoch != epoch ||
                    (w->progress != progress &&
                     now - w->sent_ms >= s->interval_ms);
        bool gone = ps_rpc_call_cancelled(w->call);
        if (!gone && send) {
            if (buf == NULL)
                buf = pack_state(s->c, &len, &buf_epoch);
            if (buf == NULL)
                break; /* out of memory: try again next pass */
            gone = ps_rpc_stream_write(w->call, buf, len) != 0;
            w->epoch = buf_epoch;
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
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return 0;
}

int coord_service_register(coord_service *s, ps_rpc_server *srv)
{
    static const struct {
        const char *path;
        enum ps_rpc_kind kind;
        ps_rpc_handler fn;
    } m[] = {
        {COORD_METHOD("RegisterTask"), PS_RPC_UNARY, on_register},
        {COORD_METHOD("Heartbeat"), PS_RPC_UNARY, on_heartbeat},
        {COORD_METHOD("GetCluster"), PS_RPC_UNARY, on_get_cluster},
        {COORD_METHOD("WatchCluster"), PS_RPC_SERVER_STREAM,
         on_watch_cluster},
        {COORD_METHOD("ReportMetrics"), PS_RPC_UNARY, on_report_metrics},
        {COORD_METHOD("Place"), PS_RPC_UNARY, on_place},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        int rc = ps_rpc_server_add_method(srv, m[i].path, m[i].kind, m[i].fn,
                                          s);
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
    pthread_mutex_destroy(&s->mu);
    free(s);
}
