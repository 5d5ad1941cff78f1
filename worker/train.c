/*
 * train.c - the training loop: replicas, in-host gradient reduction, one
 * comm thread per psd shard, overlap of communication and computation. See
 * train.h for the picture.
 */
#include "worker/train_internal.h"
#include "worker/relaxed.h"

#include "common/buf.h"
#include "common/clock.h"
#include "common/errors.h"
#include "worker/gpu.h"
#include "common/log.h"
#include "worker/metrics.h"
#include "common/place.h"
#include "proto/ps.pb-c.h"
#include "common/psclient.h"
#include "common/rpc.h"
#include "common/shm.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

volatile int wd_stop_requested;

static double now_s(void)
{
    return (double)ps_now_ms() / 1000.0;
}

/* ---- placement -------------------------------------------------------- */

/* Without a coordinator, the placement one would make (common/place.h), so
 * that the model's variables are the same either way. */
static int local_placement(const ps_model *m, int nshards, struct wd_placement *pl,
                           char *err, size_t errlen)
{
    int np = ps_model_param_count(m);
    struct ps_place_var *vars = calloc((size_t)np, sizeof *vars);
    struct ps_placement cp = {0};
    if (vars == NULL)
        return -ENOMEM;
    for (int i = 0; i < np; i++) {
        const struct ps_param_info *pi = ps_model_param_info(m, i);
        vars[i].name = (char *)pi->name;
        vars[i].ndims = pi->ndim;
        memcpy(vars[i].shape, pi->shape, (size_t)pi->ndim * sizeof *pi->shape);
    }
    char why[256];
    int rc = ps_place_check(vars, np, why, sizeof why);
    if (rc != 0)
        snprintf(err, errlen, "placing the model: %s", why);
    else
        rc = ps_place_compute(vars, np, (uint32_t)nshards, PS_PLACE_SPLIT_DEFAULT, &cp);
    free(vars);
    if (rc != 0)
        return rc;
    pl->n = cp.nvars;
    pl->vars = calloc((size_t)cp.nvars, sizeof *pl->vars);
    for (int i = 0; pl->vars != NULL && i < cp.nvars; i++) {
        struct wd_var_place *v = &pl->vars[i];
        snprintf(v->name, sizeof v->name, "%s", cp.vars[i].name);
        v->nparts = cp.vars[i].nparts;
        v->parts = calloc((size_t)v->nparts, sizeof *v->parts);
        if (v->parts == NULL) {
            rc = -ENOMEM;
            break;
        }
        for (int k = 0; k < v->nparts; k++) {
            const struct ps_place_part *cpp = &cp.vars[i].parts[k];
            snprintf(v->parts[k].name, sizeof v->parts[k].name, "%s", cpp->name);
            v->parts[k].shard = (int)cpp->shard;
            v->parts[k].row_begin = cpp->row_begin;
            v->parts[k].row_end = cpp->row_end;
        }
    }
    if (pl->vars == NULL)
        rc = -ENOMEM;
    ps_placement_free(&cp);
    return rc;
}

static void local_placement_free(struct wd_placement *pl)
{
    for (int i = 0; pl->vars != NULL && i < pl->n; i++)
        free(pl->vars[i].parts);
    free(pl->vars);
    memset(pl, 0, sizeof *pl);
}

/* ---- replicas --------------------------------------------------------- */

/* Replica r's slice of the step's examples. */
static void slice(const struct session *s, int r, int *lo, int *n)
{
    int per = s->rep_n / s->nrep, extra = s->rep_n % s->nrep;
    *lo = r * per + (r < extra ? r : extra);
    *n = per + (r < extra);
}

static int run_replica(struct session *s, int r)
{
    int lo, n;
    slice(s, r, &lo, &n);
    if (n == 0) {
        s->rep_loss[r] = 0; /* left out of the reduction */
        return 0;
    }
    size_t dim = ps_model_input_size(s->replicas[r]);
    return ps_model_forward_backward(s->replicas[r], s->rep_x + (size_t)lo * dim,
                                     s->rep_y + lo, n, &s->rep_loss[r]);
}

static void *replica_main(void *arg)
{
    struct session *s = ((void **)arg)[0];
    int r = (int)(intptr_t)((void **)arg)[1];
    free(arg);
    ps_backend_cpu_set_threads(s->o->blas_threads);
    for (;;) {
        pthread_barrier_wait(&s->rep_start);
        if (s->rep_quit)
            break;
        int rc = run_replica(s, r);
        if (rc != 0)
            s->rep_err = rc;
        pthread_barrier_wait(&s->rep_done);
    }
    return NULL;
}

/* One step on every replica; the gradient of the whole batch (the mean over
 * its examples) ends in replica 0's gradient block. */
static int compute_step(struct session *s, const float *x, const int32_t *y,
                        int n, float *loss)
{
    s->rep_x = x;
    s->rep_y = y;
    s->rep_n = n;
    s->rep_err = 0;
    /* Replica 0 on a host backend writes its gradient straight into the
     * buffer the next push sends, once gRPC has let go of it (the push that
     * last sent it is answered, but gRPC may hold it a moment more). An
     * attempt that timed out on a dead connection may hold it for minutes:
     * then the gradient goes to a fresh buffer and gRPC keeps the old one
     * until it lets go. */
    if (!ps_rpc_msg_wait_unshared_for(s->fill_msg, 20)) {
        ps_rpc_msg *fresh = ps_rpc_msg_new(s->nparams * sizeof(float));
        if (fresh == NULL)
            return -ENOMEM;
        ps_rpc_msg_unref(s->fill_msg);
        s->fill_msg = fresh;
        s->grads_fill = (float *)(void *)ps_rpc_msg_data(fresh);
    }
    ps_model_use_grads(s->replicas[0], s->grads_fill);
    if (s->nrep > 1)
        pthread_barrier_wait(&s->rep_start);
    int rc = run_replica(s, 0);
    if (s->nrep > 1)
        pthread_barrier_wait(&s->rep_done);
    if (rc == 0)
        rc = s->rep_err;
    if (rc != 0)
        return rc;
    /* All-reduce inside the host, into the buffer the push sends: each
     * replica's gradient is the mean over its slice, so the batch's is their
     * example-weighted sum. Device replicas' gradients come down first. */
    double total = 0;
    float *g = s->grads_fill;
    bool first = true;
    for (int r = 0; r < s->nrep; r++) {
        int lo, nr;
        slice(s, r, &lo, &nr);
        if (nr == 0)
            continue;
        ps_model *m = s->replicas[r];
        const float *gr = ps_model_grads(m);
        if (!ps_model_backend(m)->host_memory) {
            if ((rc = ps_model_grads_to_host(m, first ? g : s->grads_tmp)) != 0)
                return rc;
            gr = first ? g : s->grads_tmp;
        }
        float w = (float)nr / (float)n;
        if (first) {
            if (gr != g)
                memcpy(g, gr, s->nparams * sizeof(float));
            if (s->nrep > 1)
                for (size_t i = 0; i < s->nparams; i++)
                    g[i] *= w;
            first = false;
        } else {
            for (size_t i = 0; i < s->nparams; i++)
                g[i] += w * gr[i];
        }
    }
    for (int r = 0; r < s->nrep; r++) {
        int lo, nr;
        slice(s, r, &lo, &nr);
        total += (double)s->rep_loss[r] * nr;
    }
    *loss = (float)(total / n);
    return 0;
}

/* ---- session setup ---------------------------------------------------- */

void wd_var_spec_init(struct wd_var_spec *v, const struct wd_train_opts *o,
                      const char *name, int ndim, const int64_t *shape,
                      enum ps_init_kind init, int k, Ps__V1__Optimizer__Kind opt)
{
    *v = (struct wd_var_spec){.spec = PS__V1__VARIABLE_SPEC__INIT,
                              .init = PS__V1__INITIALIZER__INIT,
                              .opt = PS__V1__OPTIMIZER__INIT};
    v->spec.name = (char *)name;
    v->spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    v->spec.n_shape = (size_t)ndim;
    v->spec.shape = (int64_t *)shape;
    v->init.kind = (Ps__V1__Initializer__Kind)init;
    v->init.seed = o->init_seed * 1000003u + (uint64_t)k;
    v->opt.kind = opt;
    v->opt.learning_rate = o->lr;
    v->spec.initializer = &v->init;
    v->spec.optimizer = &v->opt;
}

static int create_variables(struct session *s, char *err, size_t errlen)
{
    const struct wd_train_opts *o = s->o;
    ps_model *m = s->replicas[0];
    for (int k = 0; k < s->nparts; k++) {
        const struct part *pt = &s->parts[k];
        const struct ps_param_info *pi = ps_model_param_info(m, pt->param);
        struct wd_var_spec vs;
        wd_var_spec_init(&vs, o, pt->name, pt->ndim, pt->shape, pi->init, k,
                         (Ps__V1__Optimizer__Kind)o->optimizer);
        Ps__V1__VariableSpec *spec = &vs.spec;
        if (pi->init == PS_INIT_GLOROT_UNIFORM && pt->count != pi->count) {
            vs.init.fan_in = pt->fan_in;
            vs.init.fan_out = pt->fan_out;
        }
        vs.opt.momentum = o->optimizer == PS__V1__OPTIMIZER__KIND__MOMENTUM ? o->momentum : 0;
        spec->consistency = o->consistency == 2 ? PS__V1__CONSISTENCY__SYNC
                            : o->consistency == WD_BOUNDED
                                ? PS__V1__CONSISTENCY__BOUNDED_STALENESS
                                : PS__V1__CONSISTENCY__ASYNC;
        spec->staleness = o->consistency == WD_BOUNDED ? (uint32_t)o->staleness : 0;
        spec->num_workers = o->consistency == 2 ? (uint32_t)o->num_workers : 0;
        struct shard *sh = &s->shards[pt->shard];
        ps_rpc_status st = {0};
        int rc = ps_client_create_variable(sh->client, spec, NULL, NULL,
                                           o->rpc_timeout_ms, &st);
        if (rc != 0) {
            if (rc == PS_ERPC && st.code == PS_RPC_ALREADY_EXISTS)
                snprintf(err, errlen, "psd at %s holds a variable that does not "
                         "fit model %s: %s", sh->address, o->model, st.message);
            else if (rc == PS_ERPC)
                snprintf(err, errlen, "psd at %s: CreateVariable '%s': %s: %s",
                         sh->address, pt->name, ps_rpc_code_name(st.code),
                         st.message);
            else
                snprintf(err, errlen, "psd at %s: CreateVariable '%s': %s",
                         sh->address, pt->name, ps_strerror(rc));
            return rc == PS_ERPC && st.code == PS_RPC_ALREADY_EXISTS ? PS_ESHAPE : rc;
        }
    }
    return 0;
}

/* The parts: from the coordinator's placement, or without one from the same
 * rule applied here. */
static int make_parts(struct session *s, char *err, size_t errlen)
{
    const struct wd_train_opts *o = s->o;
    ps_model *m = s->replicas[0];
    int np = ps_model_param_count(m);
    const struct wd_placement *pl = o->placement;
    if (pl == NULL) {
        int rc = local_placement(m, s->nshards, &s->local_pl, err, errlen);
        if (rc != 0)
            return rc;
        pl = &s->local_pl;
    }
    int cap = np;
    for (int i = 0; i < pl->n; i++)
        cap += pl->vars[i].nparts;
    s->parts = calloc((size_t)cap, sizeof *s->parts);
    if (s->parts == NULL)
        return -ENOMEM;
    for (int i = 0; i < np; i++) {
        const struct ps_param_info *pi = ps_model_param_info(m, i);
        size_t row = pi->ndim > 0 && pi->shape[0] > 0 ? pi->count / (size_t)pi->shape[0]
                                                      : pi->count;
        const struct wd_var_place *vp = NULL;
        for (int k = 0; k < pl->n; k++)
            if (strcmp(pl->vars[k].name, pi->name) == 0)
                vp = &pl->vars[k];
        if (vp == NULL) {
            snprintf(err, errlen, "the coordinator's placement has no '%s'", pi->name);
            return PS_ESHAPE;
        }
        int nparts = vp->nparts;
        for (int k = 0; k < nparts; k++) {
            struct part *pt = &s->parts[s->nparts++];
            pt->param = i;
            pt->ndim = pi->ndim;
            memcpy(pt->shape, pi->shape, sizeof pt->shape);
            pt->fan_in = pi->fan_in;
            pt->fan_out = pi->fan_out;
            const struct wd_part_place *pp = &vp->parts[k];
            if (pp->shard < 0 || pp->shard >= s->nshards ||
                pp->row_begin < 0 || pp->row_end <= pp->row_begin ||
                (pi->ndim > 0 && pp->row_end > pi->shape[0])) {
                snprintf(err, errlen, "the coordinator's placement of '%s' part %d "
                         "(shard %d, rows %lld..%lld) does not fit the model or the "
                         "%d shards", pi->name, k, pp->shard, (long long)pp->row_begin,
                         (long long)pp->row_end, s->nshards);
                return PS_ESHAPE;
            }
            snprintf(pt->name, sizeof pt->name, "%s", pp->name);
            pt->shard = pp->shard;
            pt->offset = pi->offset + (size_t)pp->row_begin * row;
            pt->count = (size_t)(pp->row_end - pp->row_begin) * row;
            if (pi->ndim > 0)
                pt->shape[0] = pp->row_end - pp->row_begin;
        }
    }
    return 0;
}

static void session_close(struct session *s)
{
    if (s->rep_th != NULL) {
        s->rep_quit = true;
        pthread_barrier_wait(&s->rep_start);
        for (int r = 1; r < s->nrep; r++)
            pthread_join(s->rep_th[r], NULL);
        free(s->rep_th);
        pthread_barrier_destroy(&s->rep_start);
        pthread_barrier_destroy(&s->rep_done);
    }
    wd_comm_stop(s);
    for (int k = 0; k < s->nshards; k++) {
        struct shard *sh = &s->shards[k];
        ps_client_destroy(sh->client);
        ps_client_destroy(sh->pull_client);
        if (sh->zero_items != NULL && sh->nitems > 0)
            free(sh->zero_items[0].data);
        PS_FREE_ALL(sh->push_items, sh->pull_items, sh->zero_items);
    }
    for (int r = 0; r < s->nrep; r++)
        ps_model_destroy(s->replicas[r]);
    /* gRPC may still hold them: the last reference frees them. */
    ps_rpc_msg_unref(s->send_msg);
    ps_rpc_msg_unref(s->fill_msg);
    if (s->shm == NULL)
        PS_FREE_ALL(s->params_pull, s->params_live);
    ps_shm_destroy(s->shm);
    PS_FREE_ALL(s->replicas, s->rep_loss, s->grads_tmp, s->backends, s->parts);
    local_placement_free(&s->local_pl);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cond);
}

/* The backend of replica r on --device: the CPU, GPU N+r for cuda:N, or
 * the PJRT plugin's device r for tpu or pjrt:PATH. NULL with err set
 * (naming the device) when that device is not there. */
static const struct ps_backend *device_backend(const char *device, int r, bool many,
                                               char *err, size_t errlen)
{
    bool cuda = strncmp(device, "cuda:", 5) == 0;
    bool pjrt = strcmp(device, "tpu") == 0 || strncmp(device, "pjrt:", 5) == 0;
    if (!cuda && !pjrt)
        return &ps_backend_cpu;
    char plugin[4096], why[256];
    const struct ps_backend *be = NULL;
    if (pjrt && ps_pjrt_plugin_path(device, plugin, sizeof plugin, err, errlen) != 0)
        return NULL;
    be = pjrt ? ps_backend_pjrt(plugin, r, why, sizeof why)
              : ps_backend_cuda(atoi(device + 5) + r, why, sizeof why);
    if (be == NULL)
        snprintf(err, errlen, "--device %s%s: %s", device, many ? " with --replicas" : "",
                 why);
    return be;
}

/* Where each replica computes (device_backend). */
static int pick_backends(struct session *s, const struct wd_train_opts *o, int nrep,
                         char *err, size_t errlen)
{
    s->backends = calloc((size_t)nrep, sizeof *s->backends);
    if (s->backends == NULL)
        return -ENOMEM;
    for (int r = 0; r < nrep; r++) {
        s->backends[r] = device_backend(o->device, r, nrep > 1, err, errlen);
        if (s->backends[r] == NULL)
            return PS_ENODEV;
    }
    return 0;
}

/* The replicas, each on its backend. */
static int make_replicas(struct session *s, int in_h, int in_w, int in_c,
                         int nclasses, int max_batch, int nrep, char *err,
                         size_t errlen)
{
    const struct wd_train_opts *o = s->o;
    s->nrep = nrep;
    s->replicas = calloc((size_t)nrep, sizeof *s->replicas);
    s->rep_loss = calloc((size_t)nrep, sizeof *s->rep_loss);
    if (s->replicas == NULL || s->rep_loss == NULL)
        return -ENOMEM;
    int rc = pick_backends(s, o, nrep, err, errlen);
    if (rc != 0)
        return rc;
    for (int r = 0; r < nrep; r++) {
        rc = ps_model_create_on(s->backends[r], o->model, in_h, in_w, in_c,
                                nclasses, max_batch, &s->replicas[r], err, errlen);
        if (rc != 0)
            return rc;
    }
    s->nparams = ps_model_nparams(s->replicas[0]);
    return 0;
}

/* Marks the shards to share memory with (--shm; auto: those reached by
 * their unix socket, since psd refuses shared memory over TCP: there the
 * kernel cannot tell it who the caller is); whether there is any. */
static bool want_shm(const struct wd_train_opts *o, bool *with)
{
    bool any = false;
    for (int k = 0; k < o->nps; k++) {
        with[k] = o->shm == 1 || (o->shm == 0 && strncmp(o->ps[k], "unix:", 5) == 0);
        any = any || with[k];
    }
    return any;
}

/* The two gradient and two value blocks: in memory shared with psd when
 * shm, else gradients in message buffers and values on the heap; and the
 * staging block of device replicas. */
static int alloc_blocks(struct session *s, bool shm)
{
    size_t block = (s->nparams * 4 + 4095) / 4096 * 4096;
    if (shm && ps_shm_create(4 * block, &s->shm) == 0) {
        /* psd reads the gradients where the model wrote them and writes
         * the values where the model reads them. */
        uint8_t *base = ps_shm_base(s->shm);
        s->grads_send = (float *)(void *)base;
        s->grads_fill = (float *)(void *)(base + block);
        s->params_pull = (float *)(void *)(base + 2 * block);
        s->params_live = (float *)(void *)(base + 3 * block);
    } else {
        /* The two gradient buffers are message buffers, so that pushes send
         * them in place (64-byte aligned, as the others). */
        s->send_msg = ps_rpc_msg_new(s->nparams * 4);
        s->fill_msg = ps_rpc_msg_new(s->nparams * 4);
        if (s->send_msg == NULL || s->fill_msg == NULL)
            return -ENOMEM;
        s->grads_send = (float *)(void *)ps_rpc_msg_data(s->send_msg);
        s->grads_fill = (float *)(void *)ps_rpc_msg_data(s->fill_msg);
        s->params_pull = aligned_alloc(64, ((s->nparams * 4 + 63) / 64) * 64);
        s->params_live = aligned_alloc(64, ((s->nparams * 4 + 63) / 64) * 64);
        if (s->params_pull == NULL || s->params_live == NULL)
            return -ENOMEM;
    }
    s->grads_tmp = aligned_alloc(64, ((s->nparams * 4 + 63) / 64) * 64);
    return s->grads_tmp == NULL ? -ENOMEM : 0;
}

/* A client per shard, and each part as a push item over grads_send and a
 * pull item over params_pull on its shard. */
static int connect_shards(struct session *s, const ps_rpc_client_opts *co,
                          const bool *shm_with, char *err, size_t errlen)
{
    const struct wd_train_opts *o = s->o;
    int np = s->nparts;
    for (int k = 0; k < s->nshards; k++) {
        struct shard *sh = &s->shards[k];
        sh->s = s;
        sh->index = k;
        sh->address = o->ps[k];
        int rc = ps_client_create(sh->address, co, &sh->client);
        if (rc != 0) {
            snprintf(err, errlen, "psd address '%s': %s", sh->address, ps_strerror(rc));
            return rc;
        }
        if (s->shm != NULL && shm_with[k])
            ps_client_set_shm(sh->client, s->shm);
        else if (o->wire_dtype != 0)
            ps_client_set_wire_dtype(sh->client, o->wire_dtype, o->error_feedback);
        sh->feedback = !(s->shm != NULL && shm_with[k]) && o->wire_dtype != 0 &&
                       o->error_feedback;
        if (ps_client_set_pieces(sh->client, o->piece_bytes, 4) != 0) {
            snprintf(err, errlen, "--pieces %zu: 0 or at least 4096 bytes",
                     o->piece_bytes);
            return PS_EINVAL_ARG;
        }
        sh->push_items = calloc((size_t)np, sizeof *sh->push_items);
        sh->pull_items = calloc((size_t)np, sizeof *sh->pull_items);
        if (sh->push_items == NULL || sh->pull_items == NULL)
            return -ENOMEM;
    }
    for (int i = 0; i < np; i++) {
        const struct part *pt = &s->parts[i];
        struct shard *sh = &s->shards[pt->shard];
        ps_client_item it = {.name = pt->name, .n = pt->count,
                             .shape = pt->shape, .ndim = pt->ndim};
        it.data = s->grads_send + pt->offset;
        it.msg = s->send_msg;
        sh->push_items[sh->nitems] = it;
        it.msg = NULL;
        it.data = s->params_pull + pt->offset;
        sh->pull_items[sh->nitems] = it;
        sh->nitems++;
        sh->bytes += pt->count * sizeof(float);
    }
    return 0;
}

/* The first pull, on this thread, so that a mismatch is reported here. An
 * evaluator (create false) waits, within the retry budget, for the workers
 * to create the variables. */
static int first_pull(struct session *s, bool create, char *err, size_t errlen)
{
    const struct wd_train_opts *o = s->o;
    int64_t wait_until = ps_now_ms() + (o->retry_budget_ms > 0 ? o->retry_budget_ms : 60000);
    for (int k = 0; k < s->nshards; k++) {
        struct shard *sh = &s->shards[k];
        if (sh->nitems == 0)
            continue;
        ps_rpc_status st = {0};
        int rc = ps_client_pull(sh->client, sh->pull_items, sh->nitems,
                                o->rpc_timeout_ms, &st);
        while (!create && rc == PS_ERPC && st.code == PS_RPC_NOT_FOUND &&
               ps_now_ms() < wait_until && !wd_stop_requested) {
            struct timespec ts = {0, 200 * 1000000L};
            nanosleep(&ts, NULL);
            rc = ps_client_pull(sh->client, sh->pull_items, sh->nitems,
                                o->rpc_timeout_ms, &st);
        }
        if (rc == 0)
            sh->sync_step = sh->pull_items[0].version;
        if (rc == PS_ESHAPE) {
            snprintf(err, errlen, "psd at %s: %s (model %s)", sh->address,
                     st.message, o->model);
            return rc;
        }
        if (rc != 0) {
            snprintf(err, errlen, "psd at %s: Pull: %s: %s", sh->address,
                     ps_rpc_code_name(st.code), st.message);
            return rc;
        }
    }
    int rc = wd_take_pulled(s);
    if (rc != 0)
        snprintf(err, errlen, "loading parameters: %s", ps_model_errmsg(s->replicas[0]));
    return rc;
}

/* The threads of replicas 1 and up; replica 0 runs on the caller's. */
static void start_replicas(struct session *s)
{
    s->rep_th = calloc((size_t)s->nrep, sizeof *s->rep_th);
    pthread_barrier_init(&s->rep_start, NULL, (unsigned)s->nrep);
    pthread_barrier_init(&s->rep_done, NULL, (unsigned)s->nrep);
    for (int r = 1; r < s->nrep; r++) {
        void **arg = malloc(2 * sizeof *arg);
        arg[0] = s;
        arg[1] = (void *)(intptr_t)r;
        pthread_create(&s->rep_th[r], NULL, replica_main, arg);
    }
}

/* Builds replicas, buffers, placement and clients; creates the variables
 * (create) and pulls them once; with start_comm (training, not an
 * evaluation) starts the comm and replica threads. On failure the caller
 * still calls session_close. */
static int session_open(struct session *s, const struct wd_train_opts *o,
                        int in_h, int in_w, int in_c, int nclasses, int max_batch,
                        int nrep, bool start_comm, bool create, char *err,
                        size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->o = o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    if (o->nps < 1 || o->nps > MAX_SHARDS) {
        snprintf(err, errlen, "need 1 to %d psd addresses, got %d", MAX_SHARDS, o->nps);
        return PS_EINVAL_ARG;
    }
    int rc = make_replicas(s, in_h, in_w, in_c, nclasses, max_batch, nrep, err,
                           errlen);
    if (rc != 0)
        return rc;
    /* Training sessions only: an evaluation pulls once, and a region per
     * evaluation would stay mapped in psd until its idle sweep. */
    bool shm_with[MAX_SHARDS] = {false};
    if ((rc = alloc_blocks(s, start_comm && want_shm(o, shm_with))) != 0)
        return rc;
    s->nshards = o->nps;
    if ((rc = make_parts(s, err, errlen)) != 0)
        return rc;
    ps_rpc_client_opts co = {
        .deadline_ms = o->rpc_timeout_ms,
        .max_attempts = 1000000,
        .backoff_initial_ms = 100,
        .backoff_max_ms = 2000,
        .retry_budget_ms = o->retry_budget_ms,
        .token = o->token,
    };
    if ((rc = connect_shards(s, &co, shm_with, err, errlen)) != 0)
        return rc;
    /* Workers create the variables; an evaluator only reads them, so that
     * it never fixes their spec. */
    if (create && (rc = create_variables(s, err, errlen)) != 0)
        return rc;
    if ((rc = first_pull(s, create, err, errlen)) != 0)
        return rc;
    if (start_comm) {
        if ((rc = wd_comm_start(s, &co, err, errlen)) != 0)
            return rc;
        if (nrep > 1)
            start_replicas(s);
    }
    ps_log_info("model %s: %zu parameters in %d server variables over %d psd "
                "shard(s), %d replica(s)", o->model, s->nparams, s->nparts,
                s->nshards, nrep);
    return 0;
}

/* ---- TensorBoard summaries -------------------------------------------- */

/* The chief's steps since its last event (--summary-steps). */
struct summary {
    double t0;          /* when the window began */
    double loss;        /* sum of its steps' losses */
    int64_t n, examples;
    int64_t last_step;  /* of the last event written */
    bool wrote;
};

/* Writes the window as one event at step (TensorBoard's x axis) and starts
 * the next. The x axis must not go back (TensorBoard takes that for a
 * restart and drops what it had after it): a window whose step is not
 * above the last event's waits for the next step, and at the end (last)
 * one at the same step is written anyway. */
static void summary_flush(struct summary *sm, const struct wd_train_opts *o,
                          int64_t step, bool last)
{
    if (o->events == NULL || sm->n == 0 ||
        (sm->wrote && (step < sm->last_step || (step == sm->last_step && !last))))
        return;
    double t = ps_now_s();
    struct wd_scalar v[] = {
        {"loss", (float)(sm->loss / (double)sm->n)},
        {"examples_per_second", t > sm->t0 ? (float)((double)sm->examples / (t - sm->t0)) : 0},
        {"learning_rate", o->lr},
    };
    wd_events_write(o->events, step, v, sizeof v / sizeof v[0]);
    sm->last_step = step;
    sm->wrote = true;
    sm->t0 = t;
    sm->loss = 0;
    sm->n = sm->examples = 0;
}

/* Counts a finished step of n examples into the window; an event once it
 * holds --summary-steps steps. */
static void summary_add(struct summary *sm, const struct wd_train_opts *o,
                        int64_t step, int n, float loss)
{
    if (o->events == NULL)
        return;
    sm->loss += loss;
    sm->n++;
    sm->examples += n;
    if (sm->n >= (o->summary_steps > 0 ? o->summary_steps : 1))
        summary_flush(sm, o, step, false);
}

/* ---- the loop --------------------------------------------------------- */

/* --local: the same model and batches with SGD applied in-process and no
 * psd, the "workerd computing alone" baseline the benchmark compares
 * against. One replica, on --device. */
static int train_local(const struct wd_train_opts *o, const struct ps_dataset *train,
                       struct wd_train_result *res, char *err, size_t errlen)
{
    ps_model *m;
    const struct ps_backend *be = device_backend(o->device, 0, false, err, errlen);
    if (be == NULL)
        return PS_ENODEV;
    int rc = ps_model_create_on(be, o->model, train->h, train->w, train->c, o->nclasses,
                                o->batch, &m, err, errlen);
    if (rc != 0)
        return rc;
    ps_model_init_params(m, o->init_seed);
    struct ps_batcher b;
    rc = ps_batcher_init(&b, train->n, o->task_index, o->num_workers, o->batch,
                         PS_BATCH_SHUFFLE | PS_BATCH_DROP_REMAINDER, o->seed);
    float *xb = malloc((size_t)o->batch * (size_t)train->dim * sizeof(float));
    int32_t *yb = malloc((size_t)o->batch * sizeof(int32_t));
    if (rc != 0 || xb == NULL || yb == NULL) {
        snprintf(err, errlen, "cannot set up local training");
        rc = rc ? rc : -ENOMEM;
        goto out;
    }
    double t0 = now_s(), compute = 0, loss_sum = 0;
    int64_t steps = 0, examples = 0, nloss = 0;
    struct summary sm = {.t0 = ps_now_s()};
    for (int epoch = 0; o->epochs == 0 || epoch < o->epochs; epoch++) {
        ps_batcher_start_epoch(&b, (uint64_t)epoch);
        const int64_t *idx;
        int n;
        while ((n = ps_batcher_next(&b, &idx)) > 0) {
            if (wd_stop_requested || (o->max_steps && steps >= o->max_steps))
                goto done;
            ps_dataset_gather(train, idx, n, xb, yb);
            double c0 = now_s();
            float loss;
            if ((rc = ps_model_forward_backward(m, xb, yb, n, &loss)) != 0) {
                snprintf(err, errlen, "%s", ps_model_errmsg(m));
                goto out;
            }
            ps_model_sgd_step(m, o->lr);
            compute += now_s() - c0;
            steps++;
            examples += n;
            loss_sum += loss;
            nloss++;
            summary_add(&sm, o, steps, n, loss);
        }
    }
done:
    summary_flush(&sm, o, steps, true);
    res->steps = steps;
    res->examples = examples;
    res->seconds = now_s() - t0;
    res->examples_per_second = res->seconds > 0 ? (double)examples / res->seconds : 0;
    res->final_loss = nloss ? loss_sum / (double)nloss : 0;
    res->compute_seconds = compute;
out:
    free(xb);
    free(yb);
    ps_batcher_close(&b);
    ps_model_destroy(m);
    return rc;
}

/* The state of wd_train's loop: the session, the batches, the timings and
 * the progress window. */
struct run {
    const struct wd_train_opts *o;
    struct session s;
    struct ps_batcher b;
    float *xb;          /* (global, dim) this step's examples */
    int32_t *yb;        /* (global) their labels */
    uint64_t step;      /* the step the next push is for */
    uint64_t version;   /* of the values the replicas compute with: the
                           job's global step as this worker last saw it */
    struct summary sm;  /* TensorBoard (--logdir) */
    struct wd_local local; /* --local-steps (relaxed.h) */
    bool sync;
    bool self_update;
    bool pending;       /* a job is posted and not waited for */
    double t0, last_report, compute, waited;
    double window_loss, rate;
    int64_t window_n, window_ex, steps, examples;
};

/* Copies the comm threads' error text to err; returns rc. */
static int comm_error(struct run *r, int rc, char *err, size_t errlen)
{
    pthread_mutex_lock(&r->s.mu);
    snprintf(err, errlen, "%s", r->s.fail_msg);
    pthread_mutex_unlock(&r->s.mu);
    return rc;
}

/* Opens the session and the batcher and sizes the batch buffers. */
static int run_open(struct run *r, const struct wd_train_opts *o,
                    const struct ps_dataset *train, int global, char *err,
                    size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->o = o;
    int rc = session_open(&r->s, o, train->h, train->w, train->c, o->nclasses,
                          o->batch, o->replicas, true, true, err, errlen);
    if (rc != 0)
        return rc;
    rc = ps_batcher_init(&r->b, train->n, o->task_index, o->num_workers, global,
                         PS_BATCH_SHUFFLE | PS_BATCH_DROP_REMAINDER, o->seed);
    if (rc != 0) {
        snprintf(err, errlen, "cannot shard %lld examples for worker %d of %d",
                 (long long)train->n, o->task_index, o->num_workers);
        return rc;
    }
    r->xb = malloc((size_t)global * (size_t)train->dim * sizeof(float));
    r->yb = malloc((size_t)global * sizeof(int32_t));
    if (r->xb == NULL || r->yb == NULL)
        return -ENOMEM;
    /* Sync: the job's step is the variables' step count, so a restarted
     * worker joins the step the others are on. */
    r->sync = o->consistency == 2;
    r->step = r->sync ? r->s.shards[0].pull_items[0].version : 0;
    r->version = r->s.shards[0].pull_items[0].version;
    /* Only where the copy is exact: SGD, one replica that reads the pulled
     * block itself (workerd refuses the flag otherwise). */
    r->self_update = o->self_update && !r->sync && o->optimizer == 0 &&
                     r->s.nrep == 1 &&
                     ps_model_backend(r->s.replicas[0])->host_memory;
    if (o->local_steps > 0 &&
        (rc = wd_local_open(&r->s, &r->local, err, errlen)) != 0)
        return rc;
    if (ps_batcher_steps(&r->b) == 0) {
        snprintf(err, errlen, "worker %d of %d has no full batch of %d in %lld "
                 "examples", o->task_index, o->num_workers, global,
                 (long long)train->n);
        return PS_EINVAL_ARG;
    }
    return 0;
}

/* run_open's undo; safe on a partly opened run. */
static void run_close(struct run *r)
{
    free(r->xb);
    free(r->yb);
    wd_local_close(&r->local);
    ps_batcher_close(&r->b);
    session_close(&r->s);
}

/*
 * One step on the batch in xb/yb: compute the gradient, hand it over once
 * the previous push is done, take the values that job pulled, post the
 * next job. Returns 0, the model's error or the comm error, with err set.
 */
static int run_step(struct run *r, int n, float *loss, char *err, size_t errlen)
{
    struct session *s = &r->s;
    wd_step_delay(r->o);
    double c0 = now_s(), waited0 = r->waited;
    int rc = compute_step(s, r->xb, r->yb, n, loss);
    double c1 = now_s();
    r->compute += c1 - c0;
    if (rc != 0) {
        snprintf(err, errlen, "step %lld: %s", (long long)r->steps,
                 ps_model_errmsg(s->replicas[0]));
        return rc;
    }
    if (r->local.anchor != NULL) {
        if ((rc = wd_local_step(s, &r->local, r->step, false)) != 0)
            return comm_error(r, rc, err, errlen);
        r->waited += now_s() - c1;
        r->version = s->shards[0].pull_items[0].version;
        goto counted;
    }
    if (r->pending && (rc = wd_wait_job(s)) != 0)
        return comm_error(r, rc, err, errlen);
    double c2 = now_s();
    r->waited += c2 - c1;
    if (r->pending) {
        wd_take_pulled(s);
        r->version = s->shards[0].pull_items[0].version;
    }
    wd_swap_grads(s);
    wd_post_job(s, r->step, false);
    r->pending = true;
    /* The next step computes on values that lack the update just pushed
     * (one step of staleness); with --self-update it is applied here too,
     * as psd applies it (SGD), and the next pull replaces the copy with
     * psd's values. */
    if (r->self_update) {
        /* The backend's vectorized axpy: a scalar loop here (-O2) cost 8%
         * of a batch-64 step. */
        const struct ps_backend *be = ps_model_backend(s->replicas[0]);
        be->axpy(be, s->params_live, -r->o->lr, s->grads_send, s->nparams);
    }
    if (r->sync || r->o->consistency == WD_BOUNDED) {
        /* The next step needs this step's update (sync), or must not start
         * before psd let this worker go on (bounded). */
        if ((rc = wd_wait_job(s)) != 0)
            return comm_error(r, rc, err, errlen);
        wd_take_pulled(s);
        r->version = s->shards[0].pull_items[0].version;
        r->pending = false;
        r->waited += now_s() - c2;
    }
counted:
    wd_metrics_step_times(r->o->metrics, c1 - c0, r->waited - waited0);
    r->step++;
    r->steps++;
    r->examples += n;
    return 0;
}

/* Counts a finished step into the progress window; reports to the
 * coordinator every step and prints a line every --progress. */
static void run_progress(struct run *r, int epoch, int n, float loss,
                         struct wd_train_result *res)
{
    const struct wd_train_opts *o = r->o;
    r->window_loss += loss;
    r->window_n++;
    r->window_ex += n;
    double t = now_s();
    if (o->on_progress != NULL)
        o->on_progress(o->progress_ctx, r->step, r->rate, loss);
    summary_add(&r->sm, o, (int64_t)r->version, n, loss);
    if ((t - r->last_report) * 1000 >= (o->progress_ms > 0 ? o->progress_ms : 2000)) {
        r->rate = (double)r->window_ex / (t - r->last_report);
    }
    wd_metrics_step_done(o->metrics, r->step, n, loss, r->rate);
    if (o->progress_ms > 0 && (t - r->last_report) * 1000 >= o->progress_ms) {
        res->final_loss = r->window_loss / (double)r->window_n;
        if (!o->quiet)
            fprintf(stdout, "worker %d: epoch %d step %lld  %.0f examples/s  "
                    "loss %.4f\n", o->task_index, epoch, (long long)r->steps,
                    (double)r->window_ex / (t - r->last_report), res->final_loss);
        fflush(stdout);
        r->last_report = t;
        r->window_loss = 0;
        r->window_n = 0;
        r->window_ex = 0;
    }
}

/* Waits for the last job and fills res. */
static int run_finish(struct run *r, struct wd_train_result *res, char *err,
                      size_t errlen)
{
    int rc;
    if (r->pending && (rc = wd_wait_job(&r->s)) != 0)
        return comm_error(r, rc, err, errlen);
    r->pending = false;
    if ((rc = wd_local_finish(&r->s, &r->local, r->step)) != 0)
        return comm_error(r, rc, err, errlen);
    res->steps = r->steps;
    res->examples = r->examples;
    res->seconds = now_s() - r->t0;
    res->examples_per_second = res->seconds > 0 ? (double)r->examples / res->seconds : 0;
    if (r->window_n > 0)
        res->final_loss = r->window_loss / (double)r->window_n;
    res->compute_seconds = r->compute;
    res->wait_seconds = r->waited;
    res->version = r->s.shards[0].pull_items[0].version;
    summary_flush(&r->sm, r->o, (int64_t)res->version, true);
    for (int k = 0; k < r->s.nshards; k++)
        res->shm_shards += ps_client_shm_active(r->s.shards[k].client);
    return 0;
}

int wd_train(const struct wd_train_opts *o, const struct ps_dataset *train,
             struct wd_train_result *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    if (o->nps == 0) {
        ps_backend_cpu_set_threads(o->blas_threads);
        return train_local(o, train, res, err, errlen);
    }
    ps_backend_cpu_set_threads(o->blas_threads);
    int global = 0;
    if (ps_batch_global(o->batch, o->replicas, &global) != 0) {
        snprintf(err, errlen, "--batch %d x --replicas %d is not a valid global "
                 "batch", o->batch, o->replicas);
        return PS_EINVAL_ARG;
    }
    struct run *r = malloc(sizeof *r);
    if (r == NULL)
        return -ENOMEM;
    int rc = run_open(r, o, train, global, err, errlen);
    if (rc != 0)
        goto out;
    r->t0 = r->last_report = now_s();
    r->sm.t0 = ps_now_s();
    for (int epoch = 0; o->epochs == 0 || epoch < o->epochs; epoch++) {
        ps_batcher_start_epoch(&r->b, (uint64_t)epoch);
        const int64_t *idx;
        int n;
        while ((n = ps_batcher_next(&r->b, &idx)) > 0) {
            if (wd_stop_requested || (o->max_steps && r->steps >= o->max_steps))
                goto done;
            ps_dataset_gather(train, idx, n, r->xb, r->yb);
            float loss = 0;
            if ((rc = run_step(r, n, &loss, err, errlen)) != 0)
                goto out;
            run_progress(r, epoch, n, loss, res);
        }
    }
done:
    rc = run_finish(r, res, err, errlen);
out:
    run_close(r);
    free(r);
    return rc;
}

int wd_evaluate(const struct wd_train_opts *o, const struct ps_dataset *test,
                float *loss, float *accuracy, uint64_t *version, char *err,
                size_t errlen)
{
    struct session s;
    int max_batch = 1000;
    int rc = session_open(&s, o, test->h, test->w, test->c, o->nclasses,
                          max_batch, 1, false, o->evaluator_only == false, err, errlen);
    if (rc == 0) {
        rc = ps_model_evaluate(s.replicas[0], test->x, test->y, test->n, loss,
                               accuracy);
        if (rc != 0)
            snprintf(err, errlen, "evaluate: %s", ps_model_errmsg(s.replicas[0]));
        *version = s.shards[0].pull_items[0].version;
    }
    session_close(&s);
    return rc;
}
