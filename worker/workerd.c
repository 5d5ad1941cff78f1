/*
 * workerd - trains a model on a shard of the data against psd shards, or,
 * as the evaluator, reports test loss and accuracy of the latest parameters.
 * Serves Prometheus' /metrics on --metrics-listen while it runs (printing
 * "METRICS_PORT <n>" first on stdout; worker/metrics.h lists the figures).
 *
 * Exit status: 0 done; 1 a runtime failure (one line on stderr: data that
 * does not load, a model that does not fit the data or the server's
 * variables, a psd unreachable past the retry budget, no usable device);
 * 2 a bad flag.
 */
#include "common/clock.h"
#include "common/cluster.h"
#include "common/auth.h"
#include "common/conf.h"
#include "common/hostid.h"
#include "common/coordclient.h"
#include "worker/backend.h"
#include "worker/collective.h"
#include "worker/data.h"
#include "common/errors.h"
#include "worker/events.h"
#include "worker/jsonout.h"
#include "common/log.h"
#include "common/metrics_http.h"
#include "worker/metrics.h"
#include "worker/model.h"
#include "worker/widedeep.h"
#include "common/notify.h"
#include "common/proc.h"
#include "common/psclient.h"
#include "common/tls.h"
#include "worker/wd_conf.h"
#include "proto/ps.pb-c.h"
#include "ps_config.h"
#include "common/rpc.h"
#include "worker/strategy.h"
#include "worker/train.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static void on_signal(int sig)
{
    (void)sig;
    wd_stop_requested = 1;
}

/* Finds FILE or FILE.gz under dir. */
static void data_path(const char *dir, const char *base, char *out, size_t len)
{
    snprintf(out, len, "%s/%s.gz", dir, base);
    FILE *f = fopen(out, "rb");
    if (f != NULL) {
        fclose(f);
        return;
    }
    snprintf(out, len, "%s/%s", dir, base);
}

static int split_ps(char *list, const char **out, int cap)
{
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (n == cap)
            return -1;
        out[n++] = tok;
    }
    return n;
}

/* Prints one line "workerd: ..." on stderr and returns status, the exit
 * status: 1 for a runtime failure, 2 for a bad flag. */
static int fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int status, const char *fmt, ...)
{
    char *line = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "workerd: %s\n", n >= 0 ? line : fmt);
    if (n >= 0)
        free(line);
    return status;
}

/* How often the STATUS= line is brought up to date. */
#define WD_STATUS_MS 2000

/* systemd (common/notify.h), from the training loop's progress point: its
 * first call, after the first step, means workerd is connected and its
 * first pull is done, so READY=1; then the status now and then, and a
 * keep-alive whenever one is due. workerd trains on its main thread and
 * runs no control loop, so the keep-alives prove that steps finish: a
 * wedged step stops them (WatchdogSec in its unit is longer than the retry
 * budget, so that a psd restart ridden out is no hang). */
static void notify_progress(const char *what, uint64_t step, double exps,
                            double loss)
{
    static bool ready;
    static int64_t last_status_ms;
    if (!ps_notify_enabled())
        return;
    int64_t now = ps_now_ms();
    if (!ready) {
        ready = true;
        last_status_ms = now;
        ps_notify_ready("%s: step %llu, %.0f examples/s, loss %.4f", what,
                        (unsigned long long)step, exps, loss);
    } else if (now - last_status_ms >= WD_STATUS_MS) {
        last_status_ms = now;
        ps_notify_status("%s: step %llu, %.0f examples/s, loss %.4f", what,
                         (unsigned long long)step, exps, loss);
    }
    ps_notify_alive();
}

/* Each finished step: to the coordinator (ctx, NULL without one) and to
 * systemd. */
static void report_progress(void *ctx, uint64_t step, double exps, double loss)
{
    if (ctx != NULL)
        ps_coord_report(ctx, step, exps, loss);
    notify_progress("training", step, exps, loss);
}

static void on_directive(void *ctx, int kind, uint64_t step)
{
    (void)ctx;
    (void)step;
    if (kind == PS__V1__DIRECTIVE__KIND__STOP) {
        ps_log_info("the coordinator asks this task to stop");
        wd_stop_requested = 1;
    }
}

/* The address to reach ps task t at: its unix socket when it is on this
 * host (common/hostid.h) and --shm is not off, else its TCP address; why
 * says why not. */
static const char *ps_route(const Ps__V1__TaskInfo *t, int shm, char *why,
                            size_t whylen)
{
    char mine[PS_HOST_ID_MAX];
    if (shm == 2) {
        snprintf(why, whylen, "--shm off");
        return t->address;
    }
    if (ps_host_id(mine, sizeof mine) != 0)
        mine[0] = '\0';
    return ps_host_use_local(mine, t->host_id, t->local_address, why, whylen)
               ? t->local_address : t->address;
}

/* GetCluster: *out (freed with ps__v1__cluster_state__free_unpacked), or
 * the call's failure with err set. */
static int get_cluster(ps_coord *coord, Ps__V1__ClusterState **out, char *err,
                       size_t errlen)
{
    void *p = NULL;
    ps_rpc_status st;
    int rc = ps_coord_cluster(coord, &p, &st);
    if (rc != 0)
        snprintf(err, errlen, "coordinator: GetCluster: %s: %s",
                 ps_rpc_code_name(st.code), st.message);
    *out = p;
    return rc;
}

/* From the coordinator: the ps addresses by index (ps_route's) and the
 * worker count. Waits (within budget) until every ps task has an address;
 * then logs, per shard, how it is reached (local: what the unix socket
 * brings). */
static int learn_cluster(ps_coord *coord, char *store, size_t storelen,
                         const char **ps, int *nps, int *nworkers, int shm,
                         const char *local, char *err, size_t errlen)
{
    int64_t until = ps_now_ms() + 60000;
    char why[64][160];
    for (;;) {
        Ps__V1__ClusterState *cs;
        int rc = get_cluster(coord, &cs, err, errlen);
        if (rc != 0)
            return rc;
        int n = (int)cs->num_ps, have = 0;
        size_t used = 0;
        if (n > 0 && n <= 64) {
            for (int k = 0; k < n; k++)
                ps[k] = NULL;
            for (size_t i = 0; i < cs->n_tasks; i++) {
                Ps__V1__TaskInfo *t = cs->tasks[i];
                if (t->role != PS__V1__ROLE__PS || (int)t->index >= n ||
                    t->address[0] == '\0' || ps[t->index] != NULL)
                    continue;
                const char *a = ps_route(t, shm, why[t->index], sizeof why[0]);
                size_t l = strlen(a) + 1;
                if (used + l > storelen)
                    break;
                memcpy(store + used, a, l);
                ps[t->index] = store + used;
                used += l;
                have++;
            }
        }
        *nps = n;
        *nworkers = cs->num_workers > 0 ? (int)cs->num_workers : 1;
        ps__v1__cluster_state__free_unpacked(cs, NULL);
        for (int k = 0; n > 0 && have == n && k < n; k++)
            if (strncmp(ps[k], "unix:", 5) == 0)
                ps_log_info("ps[%d]: %s (on this host: %s)", k, ps[k], local);
            else
                ps_log_info("ps[%d]: %s over TCP (%s)", k, ps[k], why[k]);
        if (n > 0 && have == n)
            return 0;
        if (ps_now_ms() >= until) {
            snprintf(err, errlen, "coordinator: %d of %d ps tasks have an address "
                     "after 60 s", have, n);
            return PS_EUNAVAIL;
        }
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* --ps without a coordinator: each psd given by a TCP address of this host
 * that advertises its unix socket in Stats (psd's default) is reached there
 * instead, so that the worker skips the TCP stack and, with --shm auto,
 * moves tensors through shared memory (ps_client_local_route). --shm off
 * keeps the addresses as given. ps[k] then points into store. Logs, per
 * shard, how it is reached. */
static void route_local(const struct wd_conf *c, const char **ps, int nps,
                        char *store, size_t storelen)
{
    if (c->shm == 2)
        return;
    ps_rpc_client_opts co = {.deadline_ms = 2000, .max_attempts = 3,
                             .token = c->token[0] ? c->token : NULL};
    size_t used = 0;
    for (int k = 0; k < nps; k++) {
        char route[300], why[300];
        if (strncmp(ps[k], "unix:", 5) == 0 ||
            ps_client_local_route(ps[k], &co, 2000, route, sizeof route, why,
                                  sizeof why) != 0)
            continue;
        size_t l = strlen(route) + 1;
        if (why[0] != '\0' || used + l > storelen) {
            ps_log_info("ps[%d]: %s over TCP (%s)", k, ps[k], why);
            continue;
        }
        ps_log_info("ps[%d]: %s through its unix socket %s (on this host)", k,
                    ps[k], route);
        memcpy(store + used, route, l);
        ps[k] = store + used;
        used += l;
    }
}

/* Waits (within 120 s) until the job's placement exists: pscoord makes the
 * first one only for the chief (worker 0, or a chief task) or an operator,
 * so every other task proposes once it has. Returns 0, or PS_EUNAVAIL (or
 * the GetCluster failure) with err set. */
static int wait_placement(ps_coord *coord, const char *who, char *err, size_t errlen)
{
    int64_t until = ps_now_ms() + 120000;
    bool told = false;
    for (;;) {
        Ps__V1__ClusterState *cs;
        int rc = get_cluster(coord, &cs, err, errlen);
        if (rc != 0)
            return rc;
        size_t placed = cs->n_placement;
        ps__v1__cluster_state__free_unpacked(cs, NULL);
        if (placed > 0)
            return 0;
        if (ps_now_ms() >= until || wd_stop_requested) {
            snprintf(err, errlen, "coordinator: the chief (worker 0) has not placed the "
                     "model after 120 s; %s proposes only once it has", who);
            return PS_EUNAVAIL;
        }
        if (!told)
            ps_log_info("waiting for the chief (worker 0) to place the model");
        told = true;
        struct timespec ts = {0, 250 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Proposes the model to the coordinator and converts its placement. */
static int learn_placement(ps_coord *coord, const char *model, int h, int w, int ch,
                           int nclasses, struct wd_placement *pl, char *err,
                           size_t errlen)
{
    ps_model *m = NULL;
    struct wd_widedeep_var wv[8];
    int np;
    if (wd_is_widedeep(model)) {
        np = wd_widedeep_vars(model, nclasses, wv, 8);
    } else {
        int rc = ps_model_create(model, h, w, ch, nclasses, 1, &m, err, errlen);
        if (rc != 0)
            return rc;
        np = ps_model_param_count(m);
    }
    Ps__V1__PlaceRequest req = PS__V1__PLACE_REQUEST__INIT;
    Ps__V1__VariablePlacement *vars = calloc((size_t)np, sizeof *vars);
    Ps__V1__VariablePlacement **pv = calloc((size_t)np, sizeof *pv);
    for (int i = 0; i < np; i++) {
        ps__v1__variable_placement__init(&vars[i]);
        if (m == NULL) {
            vars[i].name = wv[i].name;
            vars[i].n_shape = (size_t)wv[i].ndim;
            vars[i].shape = wv[i].shape;
            vars[i].hash_partitioned = wv[i].sparse;
        } else {
            const struct ps_param_info *pi = ps_model_param_info(m, i);
            vars[i].name = (char *)pi->name;
            vars[i].n_shape = (size_t)pi->ndim;
            vars[i].shape = (int64_t *)pi->shape;
        }
        pv[i] = &vars[i];
    }
    req.n_variables = (size_t)np;
    req.variables = pv;
    void *p = NULL;
    ps_rpc_status st;
    int rc = ps_coord_place(coord, &req, &p, &st);
    free(vars);
    free(pv);
    ps_model_destroy(m);
    if (rc != 0) {
        snprintf(err, errlen, "coordinator: Place: %s: %s", ps_rpc_code_name(st.code),
                 st.message);
        return rc;
    }
    Ps__V1__PlaceResponse *r = p;
    pl->n = (int)r->n_placement;
    pl->vars = calloc(r->n_placement ? r->n_placement : 1, sizeof *pl->vars);
    for (size_t i = 0; i < r->n_placement; i++) {
        Ps__V1__VariablePlacement *vp = r->placement[i];
        snprintf(pl->vars[i].name, sizeof pl->vars[i].name, "%s", vp->name);
        pl->vars[i].nparts = (int)vp->n_parts;
        pl->vars[i].parts = calloc(vp->n_parts ? vp->n_parts : 1,
                                   sizeof *pl->vars[i].parts);
        for (size_t k = 0; k < vp->n_parts; k++) {
            struct wd_part_place *pp = &pl->vars[i].parts[k];
            snprintf(pp->name, sizeof pp->name, "%s", vp->parts[k]->name);
            pp->shard = (int)vp->parts[k]->shard;
            pp->row_begin = vp->parts[k]->row_begin;
            pp->row_end = vp->parts[k]->row_end;
        }
    }
    ps__v1__place_response__free_unpacked(r, NULL);
    return 0;
}

static void placement_free(struct wd_placement *pl)
{
    for (int i = 0; i < pl->n; i++)
        free(pl->vars[i].parts);
    free(pl->vars);
    pl->vars = NULL;
    pl->n = 0;
}

/* The evaluator's TensorBoard event for one evaluation of new parameters:
 * at their version, the job's global step. */
static void eval_summary(wd_events *ev, uint64_t version, float loss, float acc)
{
    struct wd_scalar v[] = {{"loss", loss}, {"accuracy", acc}};
    wd_events_write(ev, (int64_t)version, v, sizeof v / sizeof v[0]);
}

/* The evaluator's progress point for systemd: READY=1 after its first
 * evaluation (connected, first pull done), then the status and a
 * keep-alive after each; its wait between evaluations sends keep-alives
 * too. */
static void notify_evaluation(uint64_t version, float loss, float acc)
{
    static bool ready;
    if (!ps_notify_enabled())
        return;
    if (!ready)
        ps_notify_ready("evaluating: version %llu, test loss %.4f, test "
                        "accuracy %.4f", (unsigned long long)version, loss, acc);
    else
        ps_notify_status("evaluating: version %llu, test loss %.4f, test "
                         "accuracy %.4f", (unsigned long long)version, loss, acc);
    ready = true;
    ps_notify_alive();
}

/* One evaluation of the variables on the test set, by the model's own
 * evaluator (widedeep reads sparse tables, the others dense variables). */
static int evaluate_model(const struct wd_train_opts *o, const struct ps_dataset *test,
                          float *loss, float *acc, uint64_t *version, char *err,
                          size_t errlen)
{
    return wd_is_widedeep(o->model)
               ? wd_evaluate_widedeep(o, test, loss, acc, version, err, errlen)
               : wd_evaluate(o, test, loss, acc, version, err, errlen);
}

static int run_evaluator(struct wd_train_opts *o, struct wd_conf *c,
                         const struct ps_dataset *test, ps_coord *coord)
{
    int64_t n = 0;
    uint64_t last_version = UINT64_MAX;
    while (!wd_stop_requested && (c->eval_count == 0 || n < c->eval_count)) {
        float loss = 0, acc = 0;
        uint64_t version = 0;
        char err[512];
        int rc = evaluate_model(o, test, &loss, &acc, &version, err, sizeof err);
        if (rc != 0)
            return fail(1, "%s", err);
        n++;
        wd_metrics_eval(o->metrics, version, loss, acc);
        if (coord != NULL)
            ps_coord_metrics(coord, version, loss, acc);
        if (version != last_version)
            eval_summary(o->events, version, loss, acc);
        notify_evaluation(version, loss, acc);
        if (c->json)
            printf("{\"role\":\"evaluator\",\"version\":%llu,\"test_loss\":%.6f,"
                   "\"test_accuracy\":%.6f}\n", (unsigned long long)version, loss, acc);
        else if (version != last_version)
            printf("evaluator: version %llu  test loss %.4f  test accuracy %.4f\n",
                   (unsigned long long)version, loss, acc);
        fflush(stdout);
        last_version = version;
        for (int64_t t = 0; t < c->eval_interval_ms && !wd_stop_requested &&
                            (c->eval_count == 0 || n < c->eval_count); t += 50) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
            ps_notify_alive();
        }
    }
    ps_notify_stopping("evaluated %lld times", (long long)n);
    return 0;
}

/* The training set (workers) and the test set (the evaluator, and workers
 * that evaluate at the end). Returns the exit status: 0, or 1 with the
 * reason on stderr. */
static int load_data(const struct wd_conf *c, bool evaluator,
                     struct ps_dataset *train, struct ps_dataset *test)
{
    char img[1024], lbl[1024], err[1024];
    int rc;
    if (!evaluator) {
        data_path(c->data, "train-images-idx3-ubyte", img, sizeof img);
        data_path(c->data, "train-labels-idx1-ubyte", lbl, sizeof lbl);
        rc = ps_dataset_load_idx(c->train_images ? c->train_images : img,
                                 c->train_labels ? c->train_labels : lbl, c->limit,
                                 train, err, sizeof err);
        if (rc != 0)
            return fail(1, "%s", err);
        if (train->nclasses > c->classes)
            return fail(1, "the training labels have %d classes, the model "
                        "predicts --classes %lld", train->nclasses,
                        (long long)c->classes);
    }
    if (evaluator || c->evaluate) {
        data_path(c->data, "t10k-images-idx3-ubyte", img, sizeof img);
        data_path(c->data, "t10k-labels-idx1-ubyte", lbl, sizeof lbl);
        rc = ps_dataset_load_idx(c->test_images ? c->test_images : img,
                                 c->test_labels ? c->test_labels : lbl, 0, test,
                                 err, sizeof err);
        if (rc != 0)
            return fail(1, "%s", err);
    }
    return 0;
}

/* The model must fit the data before any server is touched. */
static int check_model(const struct wd_conf *c, const struct ps_dataset *d)
{
    char err[1024];
    ps_model *probe;
    if (wd_is_widedeep(c->model))
        return wd_widedeep_check(c->model, d->h, d->w, d->c, (int)c->classes, err,
                                 sizeof err) ? fail(1, "--model %s: %s", c->model, err) : 0;
    int rc = ps_model_create(c->model, d->h, d->w, d->c, (int)c->classes, 1,
                             &probe, err, sizeof err);
    if (rc != 0)
        return fail(1, "--model %s: %s", c->model, err);
    ps_model_destroy(probe);
    /* A PJRT device compiles only some models: ask its backend, before
     * anything is created on psd. */
    char path[4096];
    if ((strcmp(c->device, "tpu") == 0 || strncmp(c->device, "pjrt:", 5) == 0) &&
        ps_pjrt_plugin_path(c->device, path, sizeof path, err, sizeof err) == 0) {
        const struct ps_backend *be = ps_backend_pjrt(path, 0, err, sizeof err);
        if (be == NULL ||
            ps_model_create_on(be, c->model, d->h, d->w, d->c, (int)c->classes, 1,
                               &probe, err, sizeof err) != 0)
            return fail(2, "--model %s: %s", c->model, err);
        ps_model_destroy(probe);
    }
    return 0;
}

/* --coordinator: registers, then learns the ps addresses (into ps, pointing
 * into store), the worker count, this task's index and the placement of d's
 * model. Returns the exit status; *coord is set once joined. */
static int join_coordinator(struct wd_conf *c, bool evaluator,
                            const struct ps_dataset *d, ps_coord **coord,
                            const char **ps, int *nps, char *store,
                            size_t storelen, struct wd_placement *placement)
{
    char err[1024];
    ps_coord_opts co = {.coordinator = c->coordinator, .job_id = c->job_id,
                        .role = evaluator ? PS__V1__ROLE__EVALUATOR
                                          : PS__V1__ROLE__WORKER,
                        .index = (int)c->task_index, .address = "",
                        .register_budget_ms = 60000,
                        .on_directive = on_directive,
                        .token = c->token[0] ? c->token : NULL};
    int idx = 0;
    int rc = ps_coord_join(&co, coord, &idx, err, sizeof err);
    if (rc != 0)
        return fail(1, "%s", err);
    c->task_index = idx;
    int nw = 1;
    rc = learn_cluster(*coord, store, storelen, ps, nps, &nw, c->shm,
                       evaluator ? "its unix socket" : "its unix socket and shared memory",
                       err, sizeof err);
    if (rc != 0)
        return fail(1, "%s", err);
    c->num_workers = nw;
    if (c->task_index >= c->num_workers && !evaluator)
        return fail(1, "the coordinator made this worker %lld of %lld",
                    (long long)c->task_index, (long long)c->num_workers);
    if (evaluator || c->task_index != 0) {
        char who[64];
        snprintf(who, sizeof who, "%s %lld", evaluator ? "evaluator" : "worker",
                 (long long)c->task_index);
        if ((rc = wait_placement(*coord, who, err, sizeof err)) != 0)
            return fail(1, "%s", err);
    }
    rc = learn_placement(*coord, c->model, d->h, d->w, d->c, (int)c->classes,
                         placement, err, sizeof err);
    if (rc != 0)
        return fail(1, "%s", err);
    return 0;
}

/* multi_worker_mirrored: Gloo's TCP transport and NCCL have neither
 * encryption nor authentication, so off loopback the gradients travel in
 * the clear: that needs --insecure-collective, and is logged. Returns 0, or
 * 2 after one line on stderr. */
static int check_collective(const struct wd_conf *c)
{
    if (ps_tls_host_is_loopback(c->allreduce_host))
        return 0;
    if (!c->insecure_collective)
        return fail(2, "--allreduce-host %s is not a loopback address: the all-reduce "
                    "is plaintext; allow it with --insecure-collective",
                    c->allreduce_host);
    ps_log_warn("--insecure-collective: the all-reduce listens on %s in plaintext; "
                "gradients cross the network unencrypted and unauthenticated",
                c->allreduce_host);
    return 0;
}

/* multi_worker_mirrored: registers (the heartbeats tell pscoord who is
 * alive, which decides the generations) and learns the worker count unless
 * --workers gave it. Returns the exit status. */
static int join_mwm(struct wd_conf *c, int nw_flag, ps_coord **coord, const char **ps,
                    int *nps, char *store, size_t storelen)
{
    char err[1024];
    bool open_net = !ps_tls_host_is_loopback(c->allreduce_host);
    ps_coord_opts co = {.coordinator = c->coordinator, .job_id = c->job_id,
                        .role = PS__V1__ROLE__WORKER, .index = (int)c->task_index,
                        .address = c->allreduce_host, .register_budget_ms = 60000,
                        .on_directive = on_directive,
                        .insecure_collective = open_net};
    int idx = 0;
    if (ps_coord_join(&co, coord, &idx, err, sizeof err) != 0)
        return fail(1, "%s", err);
    c->task_index = idx;
    void *p = NULL;
    ps_rpc_status st;
    if (ps_coord_cluster(*coord, &p, &st) != 0)
        return fail(1, "coordinator: GetCluster: %s: %s", ps_rpc_code_name(st.code),
                    st.message);
    Ps__V1__ClusterState *cs = p;
    if (nw_flag == 0)
        c->num_workers = cs->num_workers > 0 ? (int)cs->num_workers : 1;
    bool has_ps = cs->num_ps > 0;
    ps__v1__cluster_state__free_unpacked(cs, NULL);
    /* A job with a ps task: that psd (shard 0) holds the job's checkpoints. */
    int nw = 0;
    if (*nps == 0 && has_ps &&
        learn_cluster(*coord, store, storelen, ps, nps, &nw, c->shm, "its unix socket",
                      err, sizeof err) != 0)
        return fail(1, "%s", err);
    return 0;
}

/* multi_worker_mirrored's run: train with the group, evaluate the final
 * parameters here (every worker holds them), print the summary. */
static int run_mwm(struct wd_train_opts *o, const struct wd_conf *c, ps_coord *coord,
                   const struct ps_dataset *train, const struct ps_dataset *test)
{
    bool cuda = strncmp(c->device, "cuda:", 5) == 0;
    struct wd_mwm_opts mo = {
        .coord = coord, .host = c->allreduce_host,
        .timeout_ms = (int)c->allreduce_timeout_ms,
        .rendezvous_ms = (int)c->rendezvous_timeout_ms,
        .reform_ms = (int)c->rendezvous_timeout_ms,
        .algorithm = c->allreduce_algorithm,
        .nccl = c->allreduce_engine == 2 || (c->allreduce_engine == 0 && cuda &&
                                             wd_coll_nccl_built()),
        .device = cuda ? atoi(c->device + 5) : 0,
        .checksum_every = (int)c->checksum_every,
    };
    o->mwm = &mo;
    o->quiet = false;
    char err[1024];
    struct wd_train_result res;
    int rc = wd_train_mwm(o, train, c->evaluate ? test : NULL, &res, err, sizeof err);
    if (rc != 0)
        return fail(1, "%s", err);
    ps_notify_stopping("%s after %lld steps", wd_stop_requested
                       ? "stopped by a signal" : "done training", (long long)res.steps);
    if (res.evaluated)
        wd_metrics_eval(o->metrics, res.version, res.test_loss, res.test_accuracy);
    wd_strategy_print_mwm(&res, (int)c->task_index, c->model, (int)c->batch, c->json);
    return 0;
}

/* --logdir: the chief's or the evaluator's event file (NULL for other
 * workers, without --logdir, or after the one warning of a directory that
 * cannot be written). */
static wd_events *open_events(const struct wd_conf *c, bool evaluator)
{
    if (c->logdir == NULL || c->logdir[0] == '\0')
        return NULL;
    if (!evaluator && c->task_index != 0) {
        ps_log_info("--logdir: worker %lld is not the chief (worker 0): no event "
                    "files", (long long)c->task_index);
        return NULL;
    }
    char *dir = NULL;
    wd_events *ev = NULL;
    if (asprintf(&dir, "%s/%s", c->logdir, evaluator ? "eval" : "worker0") < 0)
        return NULL;
    if (wd_events_create(dir, &ev) == 0)
        ps_log_info("TensorBoard events in %s", wd_events_path(ev));
    free(dir);
    return ev;
}

/* The training loop's options from the flags (and the coordinator). */
static struct wd_train_opts train_opts(const struct wd_conf *c, ps_coord *coord,
                                       const struct wd_placement *placement,
                                       const char **ps, int nps)
{
    return (struct wd_train_opts){
        .placement = coord != NULL ? placement : NULL,
        .on_progress = report_progress,
        .progress_ctx = coord,
        .ps = ps,
        .nps = c->local ? 0 : nps,
        .model = c->model,
        .nclasses = (int)c->classes,
        .batch = (int)c->batch,
        .replicas = (int)c->replicas,
        .device = c->device,
        .blas_threads = (int)c->threads,
        .epochs = (int)c->epochs,
        .max_steps = c->steps,
        .lr = (float)c->lr,
        .optimizer = c->optimizer,
        .momentum = (float)c->momentum,
        .consistency = c->consistency == 1 ? 2 : c->consistency == 2 ? 3 : 1,
        .staleness = (int)c->staleness,
        .local_steps = (int)c->local_steps,
        .step_delay_ms = (int)c->step_delay_ms,
        .num_workers = (int)c->num_workers,
        .task_index = (int)c->task_index,
        .seed = c->seed,
        .init_seed = c->init_seed,
        .rpc_timeout_ms = (int)c->rpc_timeout_ms,
        .retry_budget_ms = c->retry_budget_ms,
        .progress_ms = c->json ? 0 : (int)c->progress_ms,
        .concurrent_pull = c->concurrent_pull,
        .self_update = c->self_update != 2,
        .shm = c->shm,
        /* wire_choices' order: f32, bf16, fp16 -> ps.v1.DType */
        .wire_dtype = c->wire_dtype == 1 ? 3 : c->wire_dtype == 2 ? 2 : 0,
        .error_feedback = c->error_feedback,
        .piece_bytes = (size_t)c->pieces,
        .sparse_row_dtype = c->sparse_row_dtype == 1 ? 3 : c->sparse_row_dtype == 2 ? 2 : 0,
        .sparse_slot_dtype = c->sparse_slot_dtype == 1 ? 3 : c->sparse_slot_dtype == 2 ? 2 : 0,
        .summary_steps = (int)c->summary_steps,
        .token = c->token[0] ? c->token : NULL,
    };
}

/* The worker's last line: JSON or text; the test figures only when
 * evaluated. */
static void print_summary(const struct wd_conf *c, const struct wd_train_result *res,
                          bool evaluated, float loss, float acc, uint64_t version)
{
    if (c->json) {
        char fl[40], tl[40], ta[40], ver[40];
        printf("{\"role\":\"worker\",\"task_index\":%lld,\"model\":\"%s\","
               "\"batch\":%lld,\"replicas\":%lld,\"steps\":%lld,\"examples\":%lld,"
               "\"seconds\":%.3f,\"examples_per_second\":%.1f,\"final_loss\":%s,"
               "\"compute_seconds\":%.3f,\"comm_wait_seconds\":%.3f,"
               "\"test_loss\":%s,\"test_accuracy\":%s,\"version\":%s,"
               "\"shm_shards\":%d,\"wire_dtype\":\"%s\",\"error_feedback\":%s}\n",
               (long long)c->task_index, c->model, (long long)c->batch,
               (long long)c->replicas, (long long)res->steps, (long long)res->examples,
               res->seconds, res->examples_per_second,
               wd_json_num(fl, res->steps > 0, res->final_loss, 5),
               res->compute_seconds, res->wait_seconds,
               wd_json_num(tl, evaluated, loss, 5), wd_json_num(ta, evaluated, acc, 5),
               wd_json_num(ver, evaluated, (double)version, 0), res->shm_shards,
               c->wire_dtype == 1 ? "bf16" : c->wire_dtype == 2 ? "fp16" : "f32",
               c->error_feedback ? "true" : "false");
    } else {
        printf("worker %lld: done: %lld steps, %lld examples in %.1f s (%.0f "
               "examples/s; compute %.1f s, waiting for psd %.1f s), loss %.4f",
               (long long)c->task_index, (long long)res->steps, (long long)res->examples,
               res->seconds, res->examples_per_second, res->compute_seconds,
               res->wait_seconds, res->final_loss);
        if (evaluated)
            printf(", test loss %.4f, test accuracy %.4f", loss, acc);
        printf("\n");
    }
}

/* A worker's run: train, evaluate the final parameters unless --local (the
 * local model is gone; its loss is reported) or --evaluate false, print
 * the summary. Returns the exit status. */
static int run_worker(const struct wd_train_opts *o, const struct wd_conf *c,
                      const struct ps_dataset *train, const struct ps_dataset *test)
{
    char err[1024];
    struct wd_train_result res;
    int rc = wd_is_widedeep(o->model) ? wd_train_widedeep(o, train, &res, err, sizeof err)
                                      : wd_train(o, train, &res, err, sizeof err);
    if (rc != 0)
        return fail(1, "%s", err);
    ps_notify_stopping("%s after %lld steps", wd_stop_requested
                       ? "stopped by a signal" : "done training",
                       (long long)res.steps);
    float loss = NAN, acc = NAN;
    uint64_t version = 0;
    bool evaluate = c->evaluate && !c->local;
    if (evaluate) {
        rc = evaluate_model(o, test, &loss, &acc, &version, err, sizeof err);
        if (rc != 0)
            return fail(1, "%s", err);
        wd_metrics_eval(o->metrics, version, loss, acc);
    }
    print_summary(c, &res, evaluate, loss, acc, version);
    if (wd_stop_requested)
        ps_log_warn("stopped by a signal after %lld steps", (long long)res.steps);
    return 0;
}

/* Joins TF_CONFIG's ps addresses into one --ps list. */
static char *tf_ps_list(const ps_cluster *tf)
{
    size_t len = 0;
    for (int i = 0; i < tf->n[PS_ROLE_PS]; i++)
        len += strlen(tf->addrs[PS_ROLE_PS][i]) + 1;
    char *list = malloc(len);
    list[0] = '\0';
    for (int i = 0; i < tf->n[PS_ROLE_PS]; i++) {
        if (i)
            strcat(list, ",");
        strcat(list, tf->addrs[PS_ROLE_PS][i]);
    }
    return list;
}

/* This task's index, role (an evaluator) and job id from TF_CONFIG, where
 * no flag gave them; a --task-index that disagrees is refused. *evaluator,
 * when given, says whether the role is already an evaluator's and is set
 * when TF_CONFIG makes it one. Returns 0, or 2 after one line on stderr. */
static int take_tf_task(struct wd_conf *c, const ps_cluster *tf, bool *evaluator)
{
    if (tf->has_task && c->task_index >= 0 && c->task_index != tf->task_index)
        return fail(2, "TF_CONFIG names this task %s[%d] but --task-index says %lld",
                    ps_role_name(tf->task_role), tf->task_index, (long long)c->task_index);
    if (tf->has_task && c->task_index < 0)
        c->task_index = tf->task_index;
    if (tf->has_task && tf->task_role == PS_ROLE_EVALUATOR &&
        (evaluator == NULL || !*evaluator)) {
        free(c->role);
        c->role = strdup("evaluator");
        if (evaluator != NULL)
            *evaluator = true;
    }
    if (tf->job_id != NULL && strcmp(c->job_id, "job") == 0) {
        free(c->job_id);
        c->job_id = strdup(tf->job_id);
    }
    return 0;
}

/* Reads TF_CONFIG and hands it to `use`, then closes it. Returns 0 without
 * TF_CONFIG, 2 after one line on stderr when it does not parse, or what
 * `use` returns (0, or 2 after one line on stderr). */
static int with_tf_config(struct wd_conf *c, bool *evaluator,
                          int (*use)(struct wd_conf *, const ps_cluster *, bool *))
{
    ps_cluster tf;
    memset(&tf, 0, sizeof tf);
    char tferr[512];
    int rc = ps_cluster_from_env(&tf, tferr, sizeof tferr);
    if (rc == PS_ENOTFOUND)
        return 0;
    if (rc != 0)
        return fail(2, "%s", tferr);
    int status = use(c, &tf, evaluator);
    ps_cluster_close(&tf);
    return status;
}

/* TF_CONFIG, as TensorFlow's tasks take it: the ps addresses, this task's
 * role and index, the worker count and the job. Flags given explicitly win.
 * Refuses a TF_CONFIG that names a task that is not workerd's. */
static int use_tf_config(struct wd_conf *c, const ps_cluster *tf, bool *evaluator)
{
    if (tf->has_task && tf->task_role == PS_ROLE_CHIEF)
        return fail(2, "TF_CONFIG names this task chief[%d]: the chief's duties "
                    "are pscoord's; run workerd as a worker", tf->task_index);
    if (tf->has_task && tf->task_role == PS_ROLE_PS)
        return fail(2, "TF_CONFIG names this task ps[%d]: run psd for it",
                    tf->task_index);
    if (c->ps == NULL && tf->n[PS_ROLE_PS] > 0)
        c->ps = tf_ps_list(tf);
    if (c->num_workers == 0)
        c->num_workers = tf->n[PS_ROLE_WORKER] > 0 ? tf->n[PS_ROLE_WORKER] : 1;
    return take_tf_task(c, tf, evaluator);
}

/* TF_CONFIG with a chief: the chief's duties are pscoord's, so its address
 * is the coordinator's, taken when neither --coordinator nor --ps names a
 * way to the job; with it, this task's index and role (an evaluator) and
 * the job id, unless flags give them. A flag that disagrees with TF_CONFIG
 * (another coordinator, another index) is refused with one line naming
 * both. */
static int use_tf_chief(struct wd_conf *c, const ps_cluster *tf, bool *evaluator)
{
    const char *chief = ps_cluster_task_address(tf, PS_ROLE_CHIEF, 0);
    bool given = c->coordinator != NULL && c->coordinator[0] != '\0';
    if (chief != NULL && given && strcmp(chief, c->coordinator) != 0)
        return fail(2, "TF_CONFIG's chief is %s but --coordinator says %s", chief,
                    c->coordinator);
    if (chief == NULL || given || c->ps != NULL)
        return 0;
    /* A chief or ps task is refused by use_tf_config's rules, here too. */
    if (tf->has_task && (tf->task_role == PS_ROLE_CHIEF || tf->task_role == PS_ROLE_PS))
        return fail(2, "TF_CONFIG names this task %s[%d]: run %s for it",
                    ps_role_name(tf->task_role), tf->task_index,
                    tf->task_role == PS_ROLE_PS ? "psd" : "pscoord (the chief's duties)");
    int status = take_tf_task(c, tf, evaluator);
    if (status != 0)
        return status;
    free(c->coordinator);
    c->coordinator = strdup(chief);
    return 0;
}

/* Flags that only make sense together. Returns 0, or 2 after one line on
 * stderr. */
static int check_compute_flags(const struct wd_conf *c)
{
    if (c->self_update == 1 && (c->optimizer != 0 || c->consistency == 1 ||
                                c->replicas > 1 || strcmp(c->device, "cpu") != 0))
        return fail(2, "--self-update on needs async SGD on one CPU replica "
                    "(--optimizer %s, --consistency %s, --replicas %lld, --device %s)",
                    opt_choices[c->optimizer], c->consistency == 1 ? "sync" : "async",
                    (long long)c->replicas, c->device);
    if (strcmp(c->device, "cpu") != 0 && strncmp(c->device, "cuda:", 5) != 0 &&
        strcmp(c->device, "tpu") != 0 && strncmp(c->device, "pjrt:", 5) != 0)
        return fail(2, "--device: '%s' is not cpu, cuda:N, tpu or pjrt:PATH", c->device);
    if (c->local_steps > 0 && (c->optimizer != 0 || c->consistency != 0 ||
                               c->replicas > 1 || strcmp(c->device, "cpu") != 0))
        return fail(2, "--local-steps needs async SGD on one CPU replica "
                    "(--optimizer %s, --consistency %s, --replicas %lld, --device %s)",
                    opt_choices[c->optimizer], cons_choices[c->consistency],
                    (long long)c->replicas, c->device);
    /* Only the dense models run on a device, and multi_worker_mirrored
     * on CUDA only: anything else would train on the CPU unasked. */
    bool cpu = strcmp(c->device, "cpu") == 0;
    if (!cpu && wd_is_widedeep(c->model))
        return fail(2, "--model %s runs on the CPU only, not --device %s", c->model,
                    c->device);
    if (!cpu && strncmp(c->device, "cuda:", 5) != 0 &&
        c->strategy == WD_STRATEGY_MULTI_WORKER_MIRRORED)
        return fail(2, "--strategy multi_worker_mirrored runs on cpu or cuda:N, "
                    "not --device %s", c->device);
    if (c->staleness != 0 && c->consistency != 2)
        return fail(2, "--staleness applies to --consistency bounded only, not %s",
                    cons_choices[c->consistency]);
    return 0;
}

/* --device cuda:N: every device the replicas use (N to N + replicas - 1)
 * must answer before anything is loaded or connected, with or without
 * --local, so that a host without the GPU never trains on the CPU instead.
 * Returns 0, or 2 after one line on stderr naming the cause. */
static int check_cuda(const struct wd_conf *c)
{
    const char *n = c->device + 5;
    if (*n == '\0' || strspn(n, "0123456789") != strlen(n) || strlen(n) > 4)
        return fail(2, "--device: '%s' is not cpu, cuda:N, tpu or pjrt:PATH", c->device);
    int dev0 = atoi(n), nrep = c->replicas > 1 ? (int)c->replicas : 1;
    for (int r = 0; r < nrep; r++) {
        char why[256];
        if (ps_backend_cuda(dev0 + r, why, sizeof why) == NULL)
            return fail(2, "--device %s%s: %s", c->device,
                        nrep > 1 ? " with --replicas" : "", why);
    }
    return 0;
}

/* --device cuda:N, tpu or pjrt:PATH: the device must be there before
 * anything connects. For tpu and pjrt:PATH loads the plugin and makes the
 * replicas its devices (the first --replicas when that is > 1). Returns 0,
 * or 2 after one line on stderr naming the cause. */
static int open_device(struct wd_conf *c)
{
    if (strncmp(c->device, "cuda:", 5) == 0)
        return check_cuda(c);
    if (strcmp(c->device, "tpu") != 0 && strncmp(c->device, "pjrt:", 5) != 0)
        return 0;
    char path[4096], err[600];
    int n = ps_pjrt_plugin_path(c->device, path, sizeof path, err, sizeof err);
    if (n == 0)
        n = ps_pjrt_open(path, err, sizeof err);
    if (n < 0)
        return fail(2, "--device %s: %s", c->device, err);
    if (c->replicas > n)
        return fail(2, "--replicas %lld: --device %s has %d device(s)",
                    (long long)c->replicas, c->device, n);
    /* --local trains one replica, on the plugin's first device. */
    if (c->replicas <= 1 && !c->local)
        c->replicas = n;
    return 0;
}

/* --strategy onto the finer flags (worker/strategy.h). Returns 0, or 2
 * after one line on stderr. */
static int settle_strategy(struct wd_conf *c, bool use_coord)
{
    struct wd_strategy_flags f = {
        .local = &c->local, .replicas = &c->replicas, .num_workers = &c->num_workers,
        .consistency = &c->consistency, .shm = &c->shm,
        .optimizer = opt_choices[c->optimizer], .device = c->device,
        .nccl_asked = c->allreduce_engine == 2, .use_coord = use_coord};
    char err[512];
    if (wd_strategy_settle(c->strategy, &f, err, sizeof err) != 0)
        return fail(2, "%s", err);
    return 0;
}

/* Splits --ps (list, modified) into ps[0..*nps) and checks each address.
 * Returns 0, or 2 after one line on stderr. */
static int parse_ps(char *list, const char **ps, int *nps)
{
    *nps = split_ps(list, ps, 64);
    if (*nps <= 0)
        return fail(2, "--ps: give 1 to 64 host:port addresses");
    for (int i = 0; i < *nps; i++) {
        char host[256];
        int port;
        /* A psd on this host may also be reached on its unix socket
         * (psd --listen unix:/path), which skips the TCP stack. */
        bool unix_path = strncmp(ps[i], "unix:", 5) == 0 && ps[i][5] != '\0';
        if (!unix_path && ps_addr_split(ps[i], host, sizeof host, &port) != 0)
            return fail(2, "--ps: '%s' is not host:port or unix:PATH", ps[i]);
    }
    return 0;
}

/* After the prologue: the role, TF_CONFIG (unless a coordinator assigns the
 * task), the defaults that depend on both, and the checks across flags;
 * fills ps from --ps. Returns 0, or 2 after one line on stderr. */
static int settle_flags(struct wd_conf *c, bool use_coord, bool *evaluator,
                        const char **ps, int *nps)
{
    if (strcmp(c->role, "evaluator") == 0)
        *evaluator = true;
    else if (strcmp(c->role, "worker") != 0)
        return fail(2, "--role: '%s' is not worker or evaluator", c->role);
    int status = use_coord ? 0 : with_tf_config(c, evaluator, use_tf_config);
    if (status != 0)
        return status;
    if (c->ps == NULL)
        c->ps = strdup("127.0.0.1:7070");
    if (c->num_workers == 0)
        c->num_workers = 1;
    if (!use_coord && c->task_index < 0)
        c->task_index = 0;
    if (!use_coord && c->task_index >= c->num_workers)
        return fail(2, "--task-index %lld is out of range for --workers %lld",
                    (long long)c->task_index, (long long)c->num_workers);
    status = check_compute_flags(c);
    if (status != 0)
        return status;
    return parse_ps(c->ps, ps, nps);
}

/* --token-file into c->token. Returns 0, or 2 after one line naming the
 * file (and line). */
static int read_token(struct wd_conf *c)
{
    char err[600];
    if (c->token_file == NULL || c->token_file[0] == '\0')
        return 0;
    if (ps_auth_read_token(c->token_file, c->token, sizeof c->token, err,
                           sizeof err) != 0)
        return fail(2, "--token-file: %s", err);
    return 0;
}

/* Serves /metrics on --metrics-listen, unless it is off, and prints
 * "METRICS_PORT <n>". Returns 0, or after one line naming the address 2
 * for a value that is not HOST:PORT, 1 for one that cannot be served. */
static int serve_metrics(const struct wd_conf *c, struct wd_metrics *m,
                         ps_metrics_http **out)
{
    if (ps_metrics_http_off(c->metrics_listen))
        return 0;
    char err[512];
    int rc = ps_metrics_http_start(c->metrics_listen, NULL, wd_metrics_collect, m, out,
                                   err, sizeof err);
    if (rc != 0)
        return fail(rc == PS_EINVAL_ARG ? 2 : 1, "--metrics-listen: %s", err);
    ps_metrics_http_announce(ps_metrics_http_port(*out));
    ps_log_info("metrics on %s (port %d), GET /metrics", c->metrics_listen,
                ps_metrics_http_port(*out));
    return 0;
}

int main(int argc, char **argv)
{
    struct wd_conf c;
    memset(&c, 0, sizeof c);
    ps_proc_cmd cmd = {.name = "workerd", .usage = "[options]",
                       .opts = wd_opts, .conf = &c, .log_format = &c.log_format,
                       .env_prefix = "WORKERD"};
    int rc = ps_proc_prologue(&cmd, argc, argv);
    if (rc != PS_PROC_RUN)
        return rc;
    const char *ps[64];
    int nps = 0;
    bool evaluator = false;
    struct ps_dataset train, test;
    /* Before the first goto out: out frees them. */
    ps_coord *coord = NULL;
    struct wd_placement placement = {0};
    wd_events *events = NULL;
    ps_metrics_http *metrics = NULL;
    struct wd_metrics wm;
    memset(&train, 0, sizeof train);
    memset(&test, 0, sizeof test);
    int status = with_tf_config(&c, NULL, use_tf_chief);
    bool use_coord = c.coordinator != NULL && c.coordinator[0] != '\0';
    int nw_flag = (int)c.num_workers;
    bool mwm = c.strategy == WD_STRATEGY_MULTI_WORKER_MIRRORED;
    bool ps_given = c.ps != NULL;
    if (status == 0)
        status = settle_strategy(&c, use_coord);
    if (status == 0)
        status = settle_flags(&c, use_coord, &evaluator, ps, &nps);
    if (status == 0)
        status = read_token(&c);
    if (status != 0)
        goto out;
    ps_log_init(argv[0], (enum ps_log_level)c.log_level);
    /* Before any thread or descriptor: it may execute workerd again. */
    ps_backend_cpu_pick_core(argv);
    if (c.strategy == WD_STRATEGY_MULTI_WORKER_MIRRORED && !evaluator &&
        (status = check_collective(&c)) != 0)
        goto out;
    /* Every call, to psd and to pscoord, with the same TLS. */
    ps_tls_opts tls = ps_tls_opts_of(&c.tls);
    char tls_err[512];
    if (ps_tls_check_files(&tls, tls_err, sizeof tls_err) != 0) {
        fprintf(stderr, "workerd: %s\n", tls_err);
        status = 2;
        goto out;
    }
    if (ps_tls_set_client_default(&tls) != 0) {
        status = 1;
        goto out;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);

    status = open_device(&c);
    if (status != 0)
        goto out;
    wd_metrics_init(&wm, evaluator);
    status = serve_metrics(&c, &wm, &metrics);
    if (status == 0)
        status = load_data(&c, evaluator, &train, &test);
    const struct ps_dataset *d = evaluator ? &test : &train;
    if (status == 0)
        status = check_model(&c, d);
    char ps_store[64 * 300];
    if (status == 0 && mwm && !evaluator) {
        /* multi_worker_mirrored has no psd on the data path: --ps (or the
         * coordinator's ps task) is only the checkpoint psd. */
        if (!ps_given)
            nps = 0;
        status = join_mwm(&c, nw_flag, &coord, ps, &nps, ps_store, sizeof ps_store);
    } else if (status == 0 && use_coord && !c.local)
        status = join_coordinator(&c, evaluator, d, &coord, ps, &nps, ps_store,
                                  sizeof ps_store, &placement);
    else if (status == 0 && !use_coord && !c.local && !mwm)
        route_local(&c, ps, nps, ps_store, sizeof ps_store);
    if (status != 0)
        goto out;
    events = open_events(&c, evaluator);
    ps_log_set_task(evaluator ? "evaluator" : "worker", (int)c.task_index);
    struct wd_train_opts o = train_opts(&c, coord, &placement, ps, nps);
    o.events = events;
    o.metrics = &wm;
    if (evaluator) {
        o.evaluator_only = true;
        status = run_evaluator(&o, &c, &test, coord);
    } else if (mwm) {
        status = run_mwm(&o, &c, coord, &train, &test);
    } else {
        status = run_worker(&o, &c, &train, &test);
    }
out:
    wd_events_destroy(events);
    ps_metrics_http_stop(metrics);
    ps_coord_leave(coord);
    placement_free(&placement);
    ps_dataset_close(&train);
    ps_dataset_close(&test);
    ps_conf_free(wd_opts, &c);
    explicit_bzero(c.token, sizeof c.token);
    return status;
}
