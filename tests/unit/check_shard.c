/*
 * check_shard - the shard's Push and Pull through real gRPC: each test opens
 * a shard on a temporary directory, serves it with ps_rpc_server on
 * 127.0.0.1:0 and calls it with the C client, as psd and a worker do.
 * Values are checked exactly against a C reference of SGD.
 */
#include "common/errors.h"
#include "common/log.h"
#include "proto/ps.pb-c.h"
#include "common/rpc.h"
#include "server/shard.h"

#include "common/clock.h"

#include "tests/unit/pscheck.h"

#include <check.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define M_CREATE "/ps.v1.ParameterServer/CreateVariable"
#define M_PULL "/ps.v1.ParameterServer/Pull"
#define M_PUSH "/ps.v1.ParameterServer/Push"

#define N 6          /* elements of every test variable: shape (2, 3) */
#define INIT 0.5f    /* its constant initial value */
#define LR 0.1f      /* its SGD learning rate */
#define DEADLINE_MS 5000

static psd_shard *shard;
static ps_rpc_server *srv;
static ps_rpc_client *cli;

static void setup(void)
{
    ps_log_init("check_shard", PS_LOG_ERROR);
    pscheck_tmp_setup();
    psd_shard_opts so = {
        .data_dir = tmpdir,
        .map_size = (uint64_t)64 << 20,
        .consistency = PSD_ASYNC,
        .workers = 1,
        .commit_interval_ms = 5,
    };
    ck_assert_int_eq(psd_shard_open(&so, &shard), 0);
    ps_rpc_server_opts ro = {.listen = "127.0.0.1:0", .threads = 4};
    int port = 0;
    ck_assert_int_eq(ps_rpc_server_create(&ro, &srv), 0);
    ck_assert_int_eq(psd_shard_register(shard, srv), 0);
    ck_assert_int_eq(ps_rpc_server_start(srv, &port), 0);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    ps_rpc_client_opts co = {.deadline_ms = DEADLINE_MS, .max_attempts = 1};
    ck_assert_int_eq(ps_rpc_client_create(target, &co, &cli), 0);
}

/* In the order psd shuts down. */
static void teardown(void)
{
    ps_rpc_client_destroy(cli);
    psd_shard_stop(shard);
    ps_rpc_server_shutdown(srv, 2000);
    ps_rpc_server_destroy(srv);
    ck_assert_int_eq(psd_shard_close(shard), 0);
    pscheck_tmp_teardown();
}

/* ---- calls ------------------------------------------------------------ */

/* Creates a (2, 3) variable of INIT with SGD at LR; workers > 0 makes it
 * SYNC with that many workers. Returns the status code. */
static int create_var(const char *name, uint32_t workers, Ps__V1__CreateVariableResponse **out)
{
    int64_t shape[2] = {2, 3};
    Ps__V1__Optimizer opt = PS__V1__OPTIMIZER__INIT;
    opt.kind = PS__V1__OPTIMIZER__KIND__SGD;
    opt.learning_rate = LR;
    Ps__V1__Initializer init = PS__V1__INITIALIZER__INIT;
    init.kind = PS__V1__INITIALIZER__KIND__CONSTANT;
    init.value = INIT;
    Ps__V1__VariableSpec spec = PS__V1__VARIABLE_SPEC__INIT;
    spec.name = (char *)name;
    spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    spec.n_shape = 2;
    spec.shape = shape;
    spec.optimizer = &opt;
    spec.initializer = &init;
    if (workers > 0) {
        spec.consistency = PS__V1__CONSISTENCY__SYNC;
        spec.num_workers = workers;
    }
    Ps__V1__CreateVariableRequest req = PS__V1__CREATE_VARIABLE_REQUEST__INIT;
    req.spec = &spec;
    void *resp = NULL;
    ps_rpc_status st = {0};
    ps_rpc_invoke_pb(cli, M_CREATE, &req, &ps__v1__create_variable_response__descriptor,
                     &resp, 0, &st);
    if (out != NULL)
        *out = resp;
    else if (resp != NULL)
        protobuf_c_message_free_unpacked(resp, NULL);
    return st.code;
}

static void create_ok(const char *name, uint32_t workers)
{
    ck_assert_int_eq(create_var(name, workers, NULL), PS_RPC_OK);
}

/* Pulls one variable. Returns the status code; *out is the response on OK
 * (the caller frees it) and *st the status. */
static int pull_var(const char *name, uint64_t min_version, int deadline_ms,
                    Ps__V1__PullResponse **out, ps_rpc_status *st)
{
    Ps__V1__PullItem item = PS__V1__PULL_ITEM__INIT;
    item.name = (char *)name;
    item.min_version = min_version;
    Ps__V1__PullItem *items[1] = {&item};
    Ps__V1__PullRequest req = PS__V1__PULL_REQUEST__INIT;
    req.n_items = 1;
    req.items = items;
    void *resp = NULL;
    *st = (ps_rpc_status){0};
    ps_rpc_invoke_pb(cli, M_PULL, &req, &ps__v1__pull_response__descriptor, &resp,
                     deadline_ms, st);
    *out = resp;
    return st->code;
}

struct push_args {
    const char *name;
    const float *g;
    size_t n;
    uint32_t worker;
    uint64_t step;
    bool return_values;
    /* results */
    int code;
    ps_rpc_status st;
    Ps__V1__PushResponse *resp;
};

/* Pushes one gradient; results in a. */
static void push_run(struct push_args *a)
{
    Ps__V1__Tensor t = PS__V1__TENSOR__INIT;
    t.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    t.data.len = a->n * sizeof(float);
    t.data.data = (uint8_t *)(void *)a->g;
    Ps__V1__Gradient g = PS__V1__GRADIENT__INIT;
    g.name = (char *)a->name;
    g.grad = &t;
    Ps__V1__Gradient *grads[1] = {&g};
    Ps__V1__PushRequest req = PS__V1__PUSH_REQUEST__INIT;
    req.worker = a->worker;
    req.step = a->step;
    req.n_grads = 1;
    req.grads = grads;
    req.return_values = a->return_values;
    void *resp = NULL;
    a->st = (ps_rpc_status){0};
    ps_rpc_invoke_pb(cli, M_PUSH, &req, &ps__v1__push_response__descriptor, &resp, 0,
                     &a->st);
    a->code = a->st.code;
    a->resp = resp;
}

static void *push_thread(void *p)
{
    push_run(p);
    return NULL;
}

/* Pushes g to name asynchronously; returns the status code, with the
 * message in st when st is not NULL. */
static int push_grad(const char *name, const float *g, size_t n, ps_rpc_status *st)
{
    struct push_args a = {.name = name, .g = g, .n = n};
    push_run(&a);
    if (a.resp != NULL)
        protobuf_c_message_free_unpacked(&a.resp->base, NULL);
    if (st != NULL)
        *st = a.st;
    return a.code;
}

/* ---- checks ----------------------------------------------------------- */

/* The reference: w -= LR * g, element by element, in float. */
static void sgd_ref(float *w, const float *g, float lr)
{
    for (int i = 0; i < N; i++)
        w[i] -= lr * g[i];
}

/* A value as the shard answers it: FLOAT32, shape (2, 3), exactly want. */
static void check_value(const Ps__V1__VariableValue *v, const char *name,
                        uint64_t version, const float *want)
{
    ck_assert_str_eq(v->name, name);
    ck_assert_uint_eq(v->version, version);
    ck_assert_ptr_nonnull(v->value);
    ck_assert_int_eq(v->value->dtype, PS__V1__DTYPE__DTYPE_FLOAT32);
    ck_assert_uint_eq(v->value->n_shape, 2);
    ck_assert_int_eq(v->value->shape[0], 2);
    ck_assert_int_eq(v->value->shape[1], 3);
    ck_assert_uint_eq(v->value->data.len, N * sizeof(float));
    float got[N];
    memcpy(got, v->value->data.data, sizeof got);
    for (int i = 0; i < N; i++)
        ck_assert_msg(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                      "element %d: got %.9g, want %.9g", i, (double)got[i],
                      (double)want[i]);
}

/* Pulls name at once and checks its version and value. */
static void check_pulled(const char *name, uint64_t version, const float *want)
{
    Ps__V1__PullResponse *r;
    ps_rpc_status st;
    ck_assert_int_eq(pull_var(name, 0, 0, &r, &st), PS_RPC_OK);
    ck_assert_uint_eq(r->n_values, 1);
    check_value(r->values[0], name, version, want);
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void fill(float *w, float x)
{
    for (int i = 0; i < N; i++)
        w[i] = x;
}

static const float G1[N] = {1.0f, -2.0f, 0.25f, 3.5f, -0.125f, 1e-3f};
static const float G2[N] = {0.3f, 0.7f, -1.1f, 2.2f, 5.0f, -0.001f};

/* ---- CreateVariable and Pull ------------------------------------------ */

START_TEST(test_create_then_pull)
{
    Ps__V1__CreateVariableResponse *c;
    ck_assert_int_eq(create_var("w", 0, &c), PS_RPC_OK);
    ck_assert(c->created);
    ck_assert_uint_eq(c->version, 0);
    protobuf_c_message_free_unpacked(&c->base, NULL);
    /* The same spec again: kept, not created. */
    ck_assert_int_eq(create_var("w", 0, &c), PS_RPC_OK);
    ck_assert(!c->created);
    protobuf_c_message_free_unpacked(&c->base, NULL);
    /* Another spec under the same name. */
    ck_assert_int_eq(create_var("w", 2, NULL), PS_RPC_ALREADY_EXISTS);
    float want[N];
    fill(want, INIT);
    check_pulled("w", 0, want);
    struct psd_shard_brief b;
    psd_shard_brief(shard, &b);
    ck_assert_uint_eq(b.variables, 1);
}
END_TEST

START_TEST(test_pull_unknown)
{
    Ps__V1__PullResponse *r;
    ps_rpc_status st;
    ck_assert_int_eq(pull_var("nope", 0, 0, &r, &st), PS_RPC_NOT_FOUND);
    ck_assert_str_eq(st.message, "Pull: variable 'nope' does not exist");
    ck_assert_ptr_null(r);
}
END_TEST

/* A pull for a version not reached yet waits, and a push wakes it. */
struct pull_args {
    Ps__V1__PullResponse *r;
    ps_rpc_status st;
    int code;
    int64_t answered_ms;
};

static void *pull_thread(void *p)
{
    struct pull_args *a = p;
    a->code = pull_var("w", 1, DEADLINE_MS, &a->r, &a->st);
    a->answered_ms = ps_now_ms();
    return NULL;
}

START_TEST(test_pull_waits_for_push)
{
    create_ok("w", 0);
    struct pull_args pa = {0};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, pull_thread, &pa), 0);
    usleep(200 * 1000);
    int64_t pushed_ms = ps_now_ms();
    ck_assert_int_eq(push_grad("w", G1, N, NULL), PS_RPC_OK);
    pthread_join(th, NULL);
    ck_assert_int_eq(pa.code, PS_RPC_OK);
    /* Answered by the push, not before it nor at the deadline. */
    ck_assert_int_ge(pa.answered_ms, pushed_ms);
    ck_assert_int_lt(pa.answered_ms - pushed_ms, DEADLINE_MS / 2);
    float want[N];
    fill(want, INIT);
    sgd_ref(want, G1, LR);
    ck_assert_uint_eq(pa.r->n_values, 1);
    check_value(pa.r->values[0], "w", 1, want);
    protobuf_c_message_free_unpacked(&pa.r->base, NULL);
}
END_TEST

/* A pull whose version never comes fails with DEADLINE_EXCEEDED once the
 * call's deadline passes. */
START_TEST(test_pull_times_out)
{
    create_ok("w", 0);
    Ps__V1__PullResponse *r;
    ps_rpc_status st;
    int64_t t0 = ps_now_ms();
    ck_assert_int_eq(pull_var("w", 5, 300, &r, &st), PS_RPC_DEADLINE_EXCEEDED);
    ck_assert_ptr_null(r);
    ck_assert_int_ge(ps_now_ms() - t0, 250);
    float want[N];
    fill(want, INIT);
    check_pulled("w", 0, want);
}
END_TEST

/* ---- Push ------------------------------------------------------------- */

/* The first push to name, of G1: answered OK with version 1, and with the
 * new value when return_values. The caller frees the answer. */
static Ps__V1__PushResponse *push_first(const char *name, bool return_values)
{
    struct push_args a = {.name = name, .g = G1, .n = N, .return_values = return_values};
    push_run(&a);
    ck_assert_int_eq(a.code, PS_RPC_OK);
    ck_assert_uint_eq(a.resp->n_versions, 1);
    ck_assert_uint_eq(a.resp->versions[0], 1);
    ck_assert_uint_eq(a.resp->n_values, return_values ? 1 : 0);
    return a.resp;
}

START_TEST(test_push_sgd)
{
    create_ok("w", 0);
    float want[N];
    fill(want, INIT);
    Ps__V1__PushResponse *resp = push_first("w", false);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    sgd_ref(want, G1, LR);
    check_pulled("w", 1, want);
    ck_assert_int_eq(push_grad("w", G2, N, NULL), PS_RPC_OK);
    sgd_ref(want, G2, LR);
    check_pulled("w", 2, want);
}
END_TEST

START_TEST(test_push_return_values)
{
    create_ok("w", 0);
    float want[N];
    fill(want, INIT);
    sgd_ref(want, G1, LR);
    Ps__V1__PushResponse *resp = push_first("w", true);
    check_value(resp->values[0], "w", 1, want);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}
END_TEST

/* Refused pushes answer what was wrong and change nothing. */
START_TEST(test_push_bad_inputs)
{
    create_ok("w", 0);
    ps_rpc_status st;
    ck_assert_int_eq(push_grad("nope", G1, N, &st), PS_RPC_NOT_FOUND);
    ck_assert_str_eq(st.message, "Push: variable 'nope' does not exist");
    ck_assert_int_eq(push_grad("w", G1, N - 1, &st), PS_RPC_INVALID_ARGUMENT);
    ck_assert_str_eq(st.message, "variable 'w': gradient has 5 elements, variable has 6");
    float bad[N];
    memcpy(bad, G1, sizeof bad);
    bad[3] = NAN;
    ck_assert_int_eq(push_grad("w", bad, N, &st), PS_RPC_INVALID_ARGUMENT);
    ck_assert_str_eq(st.message, "variable 'w': the gradient holds NaN or Inf; refused "
                                 "(start psd with --allow-nonfinite to accept)");
    bad[3] = INFINITY;
    ck_assert_int_eq(push_grad("w", bad, N, &st), PS_RPC_INVALID_ARGUMENT);
    float want[N];
    fill(want, INIT);
    check_pulled("w", 0, want);
}
END_TEST

/* ---- sync ------------------------------------------------------------- */

/* Two workers' pushes for step 0 make one update with their mean; each
 * push answers once the step is applied. A push for the applied step again
 * is refused as stale. */
START_TEST(test_sync_two_workers)
{
    create_ok("s", 2);
    struct push_args a = {.name = "s", .g = G1, .n = N, .worker = 0, .step = 0};
    struct push_args b = {.name = "s", .g = G2, .n = N, .worker = 1, .step = 0};
    pthread_t ta;
    ck_assert_int_eq(pthread_create(&ta, NULL, push_thread, &a), 0);
    /* The first push waits for the second. */
    usleep(100 * 1000);
    float want[N];
    fill(want, INIT);
    check_pulled("s", 0, want);
    push_run(&b);
    pthread_join(ta, NULL);
    ck_assert_int_eq(a.code, PS_RPC_OK);
    ck_assert_int_eq(b.code, PS_RPC_OK);
    ck_assert_uint_eq(a.resp->versions[0], 1);
    ck_assert_uint_eq(b.resp->versions[0], 1);
    protobuf_c_message_free_unpacked(&a.resp->base, NULL);
    protobuf_c_message_free_unpacked(&b.resp->base, NULL);
    /* The reference: accum = g1 + g2, then w -= (LR * 1/2) * accum. */
    float sum[N];
    for (int i = 0; i < N; i++)
        sum[i] = G1[i] + G2[i];
    sgd_ref(want, sum, LR * (1.0f / 2.0f));
    check_pulled("s", 1, want);
    ps_rpc_status st;
    ck_assert_int_eq(push_grad("s", G1, N, &st), PS_RPC_FAILED_PRECONDITION);
    ck_assert_str_eq(st.message, "variable 's': step 0 was already applied (the "
                                 "variable is aggregating step 1)");
    check_pulled("s", 1, want);
}
END_TEST

/* Each test gets a psd of its own on 127.0.0.1:0 and a fresh directory. */
static const struct pscheck_opts served = {setup, teardown, 30};

PSCHECK_MAIN("shard",
    {"CreateVariable", {test_create_then_pull}, &served},
    {"Pull", {test_pull_unknown, test_pull_waits_for_push, test_pull_times_out}, &served},
    {"Push", {test_push_sgd, test_push_return_values, test_push_bad_inputs}, &served},
    {"Push sync", {test_sync_two_workers}, &served})
