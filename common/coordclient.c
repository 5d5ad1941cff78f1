#include "common/buf.h"
#include "common/coordclient.h"

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "proto/ps.pb-c.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ps_coord {
    ps_coord_opts o;
    char *coordinator, *job_id, *address;
    char *local_address, *host_id; /* "" when none */
    ps_rpc_client *rpc;
    int index;
    uint64_t incarnation;
    char secret[64];    /* the coordinator's task secret; "" before */
    uint32_t interval_ms;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stop;
    uint64_t step;
    double exps, loss;
    bool down_warned;
};

static const char *const role_names[] = {"?", "chief", "worker", "ps", "evaluator"};

static const char *role_name(int r)
{
    return r >= 0 && r <= 4 ? role_names[r] : "?";
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One registration attempt. */
static int do_register(ps_coord *c, int index, ps_rpc_status *st)
{
    Ps__V1__RegisterRequest req = PS__V1__REGISTER_REQUEST__INIT;
    req.job_id = c->job_id;
    req.role = (Ps__V1__Role)c->o.role;
    req.index = index;
    req.address = c->address;
    req.local_address = c->local_address;
    req.host_id = c->host_id;
    req.insecure_collective = c->o.insecure_collective;
    req.empty = c->o.is_empty != NULL ? c->o.is_empty(c->o.ctx) : c->o.empty;
    pthread_mutex_lock(&c->mu);
    char secret[sizeof c->secret];
    memcpy(secret, c->secret, sizeof secret);
    pthread_mutex_unlock(&c->mu);
    req.task_secret = secret;
    void *resp = NULL;
    int rc = ps_rpc_invoke_pb(c->rpc, "/ps.v1.Coordinator/RegisterTask", &req,
                              &ps__v1__register_response__descriptor, &resp,
                              5000, st);
    if (rc != 0)
        return rc;
    Ps__V1__RegisterResponse *r = resp;
    pthread_mutex_lock(&c->mu);
    c->index = (int)r->index;
    c->incarnation = r->incarnation;
    c->interval_ms = r->heartbeat_interval_ms ? r->heartbeat_interval_ms : 500;
    snprintf(c->secret, sizeof c->secret, "%s",
             r->task_secret != NULL ? r->task_secret : "");
    pthread_mutex_unlock(&c->mu);
    ps__v1__register_response__free_unpacked(r, NULL);
    return 0;
}

static void *heartbeat_main(void *arg)
{
    ps_coord *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        struct timespec until = ps_time_after_ms(CLOCK_REALTIME, c->interval_ms);
        pthread_cond_timedwait(&c->cond, &c->mu, &until);
        if (c->stop)
            break;
        Ps__V1__HeartbeatRequest req = PS__V1__HEARTBEAT_REQUEST__INIT;
        req.job_id = c->job_id;
        req.role = (Ps__V1__Role)c->o.role;
        req.index = (uint32_t)c->index;
        req.incarnation = c->incarnation;
        req.step = c->step;
        req.examples_per_second = c->exps;
        req.loss = c->loss;
        char secret[sizeof c->secret];
        memcpy(secret, c->secret, sizeof secret);
        req.task_secret = secret;
        pthread_mutex_unlock(&c->mu);

        void *resp = NULL;
        ps_rpc_status st;
        int rc = ps_rpc_invoke_pb(c->rpc, "/ps.v1.Coordinator/Heartbeat", &req,
                                  &ps__v1__heartbeat_response__descriptor, &resp,
                                  (int)c->interval_ms * 2, &st);
        if (rc != 0) {
            if (!c->down_warned)
                ps_log_warn("coordinator %s: heartbeat failed (%s: %s); training "
                            "goes on, retrying", c->coordinator,
                            ps_rpc_code_name(st.code), st.message);
            c->down_warned = true;
        } else {
            if (c->down_warned)
                ps_log_info("coordinator %s answers again", c->coordinator);
            c->down_warned = false;
            Ps__V1__HeartbeatResponse *r = resp;
            for (size_t i = 0; i < r->n_directives; i++) {
                int kind = (int)r->directives[i]->kind;
                uint64_t step = r->directives[i]->step;
                if (kind == PS__V1__DIRECTIVE__KIND__REREGISTER) {
                    ps_rpc_status rs;
                    if (do_register(c, c->index, &rs) == 0)
                        ps_log_info("registered again with the coordinator as "
                                    "%s[%d]", role_name(c->o.role), c->index);
                } else if (c->o.on_directive != NULL) {
                    c->o.on_directive(c->o.ctx, kind, step);
                }
            }
            ps__v1__heartbeat_response__free_unpacked(r, NULL);
        }
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int ps_coord_join(const ps_coord_opts *o, ps_coord **out, int *index_out,
                  char *err, size_t errlen)
{
    ps_coord *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -ENOMEM;
    c->o = *o;
    c->coordinator = strdup(o->coordinator);
    c->job_id = strdup(o->job_id ? o->job_id : "job");
    c->address = strdup(o->address ? o->address : "");
    c->local_address = strdup(o->local_address ? o->local_address : "");
    c->host_id = strdup(o->host_id ? o->host_id : "");
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cond, NULL);
    ps_rpc_client_opts co = {.deadline_ms = 5000, .token = o->token};
    c->o.token = NULL; /* the client keeps its own copy */
    int rc = ps_rpc_client_create(c->coordinator, &co, &c->rpc);
    if (rc != 0) {
        snprintf(err, errlen, "--coordinator '%s': %s", o->coordinator,
                 ps_strerror(rc));
        ps_coord_leave(c);
        return rc;
    }
    int64_t until = ps_now_ms() + (o->register_budget_ms > 0 ? o->register_budget_ms
                                                             : 30000);
    ps_rpc_status st;
    for (;;) {
        rc = do_register(c, o->index, &st);
        if (rc == 0)
            break;
        /* PERMISSION_DENIED: the slot's holder is this task's previous
         * process, whose secret died with it; the slot is free once that
         * one has missed heartbeats for the coordinator's timeout. */
        bool retry = st.code == PS_RPC_UNAVAILABLE || st.code == PS_RPC_DEADLINE_EXCEEDED ||
                     st.code == PS_RPC_ALREADY_EXISTS ||
                     st.code == PS_RPC_PERMISSION_DENIED;
        if (!retry || ps_now_ms() >= until) {
            snprintf(err, errlen, "coordinator %s refused %s[%d]: %s: %s",
                     o->coordinator, role_name(o->role), o->index,
                     ps_rpc_code_name(st.code), st.message);
            ps_coord_leave(c);
            return PS_ERPC;
        }
        ps_log_debug("registration: %s: %s; retrying", ps_rpc_code_name(st.code),
                     st.message);
        sleep_ms(200);
    }
    if (pthread_create(&c->th, NULL, heartbeat_main, c) != 0) {
        ps_coord_leave(c);
        return -EAGAIN;
    }
    ps_log_info("registered with coordinator %s as %s[%d] (incarnation %llu)",
                c->coordinator, role_name(o->role), c->index,
                (unsigned long long)c->incarnation);
    if (index_out)
        *index_out = c->index;
    *out = c;
    return 0;
}

void ps_coord_report(ps_coord *c, uint64_t step, double exps, double loss)
{
    pthread_mutex_lock(&c->mu);
    c->step = step;
    c->exps = exps;
    c->loss = loss;
    pthread_mutex_unlock(&c->mu);
}

int ps_coord_cluster(ps_coord *c, void **state_out, ps_rpc_status *st)
{
    Ps__V1__GetClusterRequest req = PS__V1__GET_CLUSTER_REQUEST__INIT;
    req.job_id = c->job_id;
    return ps_rpc_invoke_pb(c->rpc, "/ps.v1.Coordinator/GetCluster", &req,
                            &ps__v1__cluster_state__descriptor, state_out, 5000, st);
}

/* The task's index and secret as one pair (registering again replaces the
 * secret), copied under the lock for a request to carry. */
static uint32_t task_credentials(ps_coord *c, char secret[])
{
    pthread_mutex_lock(&c->mu);
    uint32_t index = (uint32_t)c->index;
    memcpy(secret, c->secret, sizeof c->secret);
    pthread_mutex_unlock(&c->mu);
    return index;
}

int ps_coord_kv_set(ps_coord *c, const char *key, const void *val, size_t len,
                    ps_rpc_status *st)
{
    Ps__V1__KvSetRequest req = PS__V1__KV_SET_REQUEST__INIT;
    req.job_id = c->job_id;
    req.key = (char *)key;
    req.value.data = (uint8_t *)val;
    req.value.len = len;
    char secret[sizeof c->secret];
    req.index = task_credentials(c, secret);
    req.task_secret = secret;
    void *resp = NULL;
    int rc = ps_rpc_invoke_pb(c->rpc, "/ps.v1.Coordinator/KvSet", &req,
                              &ps__v1__kv_set_response__descriptor, &resp, 10000, st);
    if (resp != NULL)
        protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

int ps_coord_kv_get(ps_coord *c, const char *key, int timeout_ms, void **val,
                    size_t *len, uint64_t *generation, ps_rpc_status *st)
{
    Ps__V1__KvGetRequest req = PS__V1__KV_GET_REQUEST__INIT;
    char *keys[1] = {(char *)key};
    req.job_id = c->job_id;
    req.keys = keys;
    req.n_keys = 1;
    req.timeout_ms = (uint32_t)(timeout_ms > 0 ? timeout_ms : 0);
    char secret[sizeof c->secret];
    req.index = task_credentials(c, secret);
    req.task_secret = secret;
    void *p = NULL;
    *val = NULL;
    *len = 0;
    int rc = ps_rpc_invoke_pb(c->rpc, "/ps.v1.Coordinator/KvGet", &req,
                              &ps__v1__kv_get_response__descriptor, &p,
                              (timeout_ms > 0 ? timeout_ms : 0) + 10000, st);
    if (rc != 0)
        return rc;
    Ps__V1__KvGetResponse *r = p;
    if (r->n_values != 1) {
        protobuf_c_message_free_unpacked(p, NULL);
        if (st != NULL) {
            st->code = PS_RPC_INTERNAL;
            snprintf(st->message, sizeof st->message, "KvGet: %zu values for 1 key",
                     r->n_values);
        }
        return PS_ERPC;
    }
    *val = malloc(r->values[0].len + 1);
    if (*val == NULL) {
        protobuf_c_message_free_unpacked(p, NULL);
        return -ENOMEM;
    }
    memcpy(*val, r->values[0].data, r->values[0].len);
    ((char *)*val)[r->values[0].len] = '\0';
    *len = r->values[0].len;
    if (generation != NULL)
        *generation = r->generation;
    protobuf_c_message_free_unpacked(p, NULL);
    return 0;
}

int ps_coord_index(const ps_coord *c)
{
    return c->index;
}

int ps_coord_place(ps_coord *c, void *req, void **resp_out, ps_rpc_status *st)
{
    Ps__V1__PlaceRequest *r = req;
    r->job_id = c->job_id;
    /* pscoord places only for a registered task that proves it is one, and
     * makes the first placement only for the chief. */
    r->role = (Ps__V1__Role)c->o.role;
    char secret[sizeof c->secret];
    r->index = task_credentials(c, secret);
    r->task_secret = secret;
    int rc = ps_rpc_invoke_pb(c->rpc, "/ps.v1.Coordinator/Place", r,
                              &ps__v1__place_response__descriptor, resp_out, 10000, st);
    r->task_secret = (char *)protobuf_c_empty_string;
    return rc;
}

int ps_coord_metrics(ps_coord *c, uint64_t step, double loss, double accuracy)
{
    Ps__V1__ReportMetricsRequest req = PS__V1__REPORT_METRICS_REQUEST__INIT;
    req.job_id = c->job_id;
    req.role = (Ps__V1__Role)c->o.role;
    req.step = step;
    req.loss = loss;
    req.accuracy = accuracy;
    char secret[sizeof c->secret];
    req.index = task_credentials(c, secret);
    req.task_secret = secret;
    void *resp = NULL;
    ps_rpc_status st;
    int rc = ps_rpc_invoke_pb(c->rpc, "/ps.v1.Coordinator/ReportMetrics", &req,
                              &ps__v1__report_metrics_response__descriptor, &resp,
                              5000, &st);
    if (rc == 0)
        ps__v1__report_metrics_response__free_unpacked(resp, NULL);
    return rc;
}

void ps_coord_leave(ps_coord *c)
{
    if (c == NULL)
        return;
    if (c->th) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_cond_signal(&c->cond);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->th, NULL);
    }
    ps_rpc_client_destroy(c->rpc);
    PS_FREE_ALL(c->coordinator, c->job_id, c->address, c->local_address, c->host_id);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cond);
    free(c);
}
