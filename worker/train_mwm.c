/*
 * train_mwm.c - multi_worker_mirrored: every worker holds the whole model,
 * each step's gradients are summed over the workers by an all-reduce
 * (worker/collective.h: Gloo over TCP, or NCCL on GPUs), and every worker
 * applies the same averaged gradient with SGD, so all hold the same bits.
 * No psd on the data path; pscoord is the rendezvous (its Kv store) and
 * decides the generations (coordinator/kvstore.h).
 *
 * The data order is global: epoch e is one permutation of the training set
 * (seed, e); each step takes size x batch examples at the job's position,
 * rank r the r-th slice. So a group that changes size neither skips nor
 * repeats examples: the position (with the step and the epoch) travels
 * with the parameters when a group forms.
 *
 * Forming a group (form): read the current generation and its members; a
 * worker not among them, or a first group smaller than --workers,
 * waits for the next. Each compares its model with the members' ("model/<i>"
 * keys) and refuses a difference. Then Gloo's rendezvous under "gen/<G>/",
 * an all-reduce of each rank's step to find the one furthest on (the
 * lowest rank of those), and a broadcast of its parameters and position:
 * a worker that comes back starts from the job's state, not its own.
 *
 * Failure: an all-reduce that fails (a dead peer, a link cut past the
 * timeout) is not applied; the worker reports "gen/<G>/failed", waits for
 * generation G+1 (pscoord starts it when the heartbeats say who is gone,
 * or at once on that report) and forms it. A new generation seen while
 * training (a worker came back) is agreed on inside the next all-reduce
 * (one float of the buffer), so that every member leaves at the same step.
 */
#include "worker/train_internal.h"

#include "common/buf.h"
#include "common/clock.h"
#include "common/coordclient.h"
#include "common/errors.h"
#include "common/log.h"
#include "worker/backend.h"
#include "worker/collective.h"
#include "worker/metrics.h"
#include "worker/relaxed.h"
#include "common/psclient.h"
#include "proto/ps.pb-c.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MWM_POLL_MS 200       /* how often a training worker looks for a new generation */
#define MWM_WAIT_SLICE_MS 1000

struct mwm {
    const struct wd_train_opts *o;
    const struct wd_mwm_opts *mo;
    const struct ps_dataset *train;
    ps_model *m;
    size_t np;
    float *buf;              /* (np + 2) gradient, loss, "new generation" */
    float *state;            /* (np + 6) params, step, epoch, pos as floats
                                pairs: sent by broadcast */
    int64_t *perm;           /* this epoch's order */
    int64_t perm_epoch;
    float *xb;
    int32_t *yb;
    /* the job's position, the same on every member */
    int64_t step, epoch, pos;
    /* the group */
    wd_coll *coll;
    uint64_t gen, skip_below;/* form only generations >= skip_below */
    int rank, size;
    bool formed_once;
    int64_t last_poll_ms;
    int64_t failed_at_ms;    /* when this worker last left a group; 0: none */
    const char *left_why;    /* "a failure" or "a new generation" */
    bool reported;           /* the failed generation was reported */
    bool left_out;           /* the job finished while this worker was out */
    char model_desc[4096];
    struct wd_coll_store store;
    /* The checkpoint psd (o->nps > 0): the job's variables, which the
     * group's rank 0 keeps equal to the workers' by pushing each step's
     * averaged gradient (SGD, the same rate), so that pscoord's job
     * checkpoints and restores work as for a parameter-server job. */
    ps_client *ps;
    ps_client_item *items;
    int nitems;
    bool ps_warned;
    /* seconds in each phase of a step, summed */
    double t_gather, t_compute, t_reduce, t_update, t_push;
    /* when the first group formed: the training's seconds start there, as
     * a parameter-server run's start once its variables are set up */
    int64_t started_ms;
};

/* A key as a number; -1 when not set within timeout_ms. */
static int64_t kv_get_u64(struct mwm *w, const char *key, int timeout_ms)
{
    void *v = NULL;
    size_t len = 0;
    char err[256];
    if (w->store.get(w->store.ctx, key, timeout_ms, &v, &len, err, sizeof err) != 0)
        return -1;
    int64_t x = strtoll(v, NULL, 10);
    free(v);
    return x;
}

/* ---- the model's description, compared at rendezvous ------------------- */

static void describe_model(struct mwm *w)
{
    size_t used = (size_t)snprintf(w->model_desc, sizeof w->model_desc, "%s",
                                   ps_model_spec(w->m));
    for (int i = 0; i < ps_model_param_count(w->m) && used < sizeof w->model_desc; i++) {
        const struct ps_param_info *pi = ps_model_param_info(w->m, i);
        used += (size_t)snprintf(w->model_desc + used, sizeof w->model_desc - used,
                                 ";%s:float32[", pi->name);
        for (int d = 0; d < pi->ndim && used < sizeof w->model_desc; d++)
            used += (size_t)snprintf(w->model_desc + used, sizeof w->model_desc - used,
                                     "%s%lld", d ? "," : "", (long long)pi->shape[d]);
        if (used < sizeof w->model_desc)
            used += (size_t)snprintf(w->model_desc + used, sizeof w->model_desc - used, "]");
    }
}

/* The first ';'-separated field where a and b differ, into out. */
static void first_difference(const char *a, const char *b, char *out, size_t len)
{
    for (;;) {
        size_t la = strcspn(a, ";"), lb = strcspn(b, ";");
        if (la != lb || memcmp(a, b, la) != 0) {
            snprintf(out, len, "'%.*s' here, '%.*s' there", (int)la, a, (int)lb, b);
            return;
        }
        if (a[la] == '\0' || b[lb] == '\0') {
            snprintf(out, len, "%s", a[la] ? "more variables here" : "more variables there");
            return;
        }
        a += la + 1;
        b += lb + 1;
    }
}

/* Every member's model against ours. Returns 0, PS_ESHAPE with err, or
 * PS_EUNAVAIL when one has not said yet within timeout. */
static int check_models(struct mwm *w, const uint32_t *mem, int n, char *err, size_t errlen)
{
    for (int i = 0; i < n; i++) {
        char key[64];
        void *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "model/%" PRIu32, mem[i]);
        if (w->store.get(w->store.ctx, key, w->mo->timeout_ms, &v, &len, err, errlen) != 0)
            return PS_EUNAVAIL;
        int same = strcmp(v, w->model_desc) == 0;
        if (!same) {
            char diff[600];
            first_difference(w->model_desc, v, diff, sizeof diff);
            snprintf(err, errlen, "worker %" PRIu32 " trains another model than worker "
                     "%d: %s", mem[i], w->o->task_index, diff);
        }
        free(v);
        if (!same)
            return PS_ESHAPE;
    }
    return 0;
}

/* ---- forming a group --------------------------------------------------- */

/* Parses "0,1,2" into mem (cap entries); the count. */
static int parse_members(const char *s, uint32_t *mem, int cap)
{
    int n = 0;
    while (*s != '\0' && n < cap) {
        char *end;
        mem[n++] = (uint32_t)strtoul(s, &end, 10);
        s = *end == ',' ? end + 1 : end;
        if (end == s && *s != '\0')
            break;
    }
    return n;
}

/* Packs and unpacks the job's state after the parameters (3 int64 as 6
 * floats' worth of bytes). */
static void pack_state(struct mwm *w)
{
    int64_t v[3] = {w->step, w->epoch, w->pos};
    memcpy(w->state + w->np, v, sizeof v);
}

static void unpack_state(struct mwm *w)
{
    int64_t v[3];
    memcpy(v, w->state + w->np, sizeof v);
    w->step = v[0];
    w->epoch = v[1];
    w->pos = v[2];
}

/* The furthest member's parameters and position to every member. */
static int sync_state(struct mwm *w, char *err, size_t errlen)
{
    double *steps = calloc((size_t)w->size, sizeof *steps);
    if (steps == NULL)
        return -ENOMEM;
    steps[w->rank] = (double)w->step;
    int rc = w->coll->allreduce_f64(w->coll, steps, (size_t)w->size, err, errlen);
    int root = 0;
    for (int r = 1; rc == 0 && r < w->size; r++)
        if (steps[r] > steps[root])
            root = r;
    free(steps);
    if (rc != 0)
        return rc;
    if (w->rank == root) {
        if ((rc = ps_model_params_to_host(w->m, w->state)) != 0) {
            snprintf(err, errlen, "%s", ps_model_errmsg(w->m));
            return rc;
        }
        pack_state(w);
    }
    rc = w->coll->broadcast(w->coll, w->state, (w->np + 6) * sizeof(float), root, err,
                            errlen);
    if (rc != 0)
        return rc;
    if (w->rank != root) {
        unpack_state(w);
        if ((rc = ps_model_params_from_host(w->m, w->state)) != 0) {
            snprintf(err, errlen, "%s", ps_model_errmsg(w->m));
            return rc;
        }
    }
    return 0;
}

/* The names of the workers of [0, want) missing from mem, for an error. */
static void missing_workers(const uint32_t *mem, int n, int want, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; k < want && used < len; k++) {
        bool in = false;
        for (int i = 0; i < n; i++)
            in = in || mem[i] == (uint32_t)k;
        if (!in)
            used += (size_t)snprintf(out + used, len - used, "%s%d", used ? ", " : "", k);
    }
}

/* One attempt at generation g with its members: the models, Gloo's (or
 * NCCL's) rendezvous, the state. Returns 0 (formed), PS_EUNAVAIL (this
 * generation failed: try the next), or a hard error. */
static int form_gen(struct mwm *w, uint64_t g, const uint32_t *mem, int n, char *err,
                    size_t errlen)
{
    /* Again at every group: a restarted pscoord has lost the store. */
    char key[64];
    snprintf(key, sizeof key, "model/%d", w->o->task_index);
    w->store.set(w->store.ctx, key, w->model_desc, strlen(w->model_desc) + 1, err, errlen);
    int rc = check_models(w, mem, n, err, errlen);
    if (rc != 0)
        return rc;
    w->rank = -1;
    for (int i = 0; i < n; i++)
        if (mem[i] == (uint32_t)w->o->task_index)
            w->rank = i;
    w->size = n;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "gen/%" PRIu64 "/", g);
    struct wd_coll_opts co = {.rank = w->rank, .size = n, .prefix = prefix,
                              .host = w->mo->host, .timeout_ms = w->mo->timeout_ms,
                              .algorithm = w->mo->algorithm, .device = w->mo->device,
                              .store = &w->store};
    rc = w->mo->nccl ? wd_coll_nccl_create(&co, &w->coll, err, errlen)
                     : wd_coll_gloo_create(&co, &w->coll, err, errlen);
    if (rc == 0 && (rc = sync_state(w, err, errlen)) != 0) {
        wd_coll_destroy(w->coll);
        w->coll = NULL;
    }
    return rc == PS_ENODEV || rc == -ENOMEM ? rc : rc != 0 ? PS_EUNAVAIL : 0;
}

/* Reports generation g failed, so that pscoord moves on without waiting
 * for a heartbeat timeout when the members stay the same. */
static void report_failed(struct mwm *w, uint64_t g)
{
    char key[64], err[256];
    snprintf(key, sizeof key, "gen/%" PRIu64 "/failed", g);
    w->store.set(w->store.ctx, key, "1", 1, err, sizeof err);
    if (w->skip_below <= g)
        w->skip_below = g + 1;
}

/* Forms the next group this worker belongs to. Returns 0, 1 when the job
 * finished without this worker ("done" set) or a stop was asked, or an
 * error with err set. */
static int form(struct mwm *w, char *err, size_t errlen)
{
    int64_t t0 = ps_now_ms();
    int64_t budget = w->formed_once ? w->mo->reform_ms : w->mo->rendezvous_ms;
    /* The job's first group waits for all --workers; once it started
     * ("started"), any group of the live workers will do. */
    int want = w->formed_once || kv_get_u64(w, "started", 0) >= 0 ? 1 : w->o->num_workers;
    uint32_t mem[1024];
    int n = 0;
    char why[1024] = "no generation yet";
    while (!wd_stop_requested) {
        if (ps_now_ms() - t0 > budget) {
            char miss[512];
            missing_workers(mem, n, w->o->num_workers, miss, sizeof miss);
            snprintf(err, errlen, "all-reduce rendezvous: no group within %.0f s "
                     "(workers missing: %s; last: %s)", (double)budget / 1000.0,
                     miss[0] ? miss : "none", why);
            return PS_ETIMEDOUT;
        }
        if (kv_get_u64(w, "done", 0) >= 0) {
            w->left_out = true;
            return 1;
        }
        /* A failed group: first wait for pscoord's next generation (its
         * heartbeat timeout names the dead); past our own timeout, report
         * the failure, which starts one at once with the same members. */
        if (w->failed_at_ms && !w->reported &&
            ps_now_ms() - w->failed_at_ms > w->mo->timeout_ms && w->skip_below > 0) {
            report_failed(w, w->skip_below - 1);
            w->reported = true;
        }
        int64_t g = kv_get_u64(w, "generation", MWM_WAIT_SLICE_MS);
        if (g < 0 || (uint64_t)g < w->skip_below) {
            char key[64];
            snprintf(key, sizeof key, "gen/%" PRIu64 "/members", w->skip_below);
            int64_t ignored = kv_get_u64(w, key, MWM_WAIT_SLICE_MS);
            (void)ignored;
            continue;
        }
        char key[64], *list = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "gen/%" PRId64 "/members", g);
        if (w->store.get(w->store.ctx, key, MWM_WAIT_SLICE_MS, (void **)&list, &len, why,
                   sizeof why) != 0)
            continue;
        n = parse_members(list, mem, 1024);
        free(list);
        bool in = false;
        for (int i = 0; i < n; i++)
            in = in || mem[i] == (uint32_t)w->o->task_index;
        if (!in || n < want) {
            snprintf(why, sizeof why, "generation %" PRId64 " has %d worker(s)%s", g, n,
                     in ? "" : ", not this one");
            w->skip_below = (uint64_t)g + 1;
            continue;
        }
        int rc = form_gen(w, (uint64_t)g, mem, n, why, sizeof why);
        if (rc == 0) {
            w->gen = (uint64_t)g;
            w->skip_below = (uint64_t)g + 1;
            double since = w->failed_at_ms ? (double)(ps_now_ms() - w->failed_at_ms) / 1000.0
                                           : (double)(ps_now_ms() - t0) / 1000.0;
            printf("worker %d: generation %" PRIu64 " formed: %d worker(s), rank %d, "
                   "step %" PRId64 ", %.2f s after %s\n", w->o->task_index, w->gen,
                   w->size, w->rank, w->step, since,
                   w->failed_at_ms ? w->left_why : "the rendezvous began");
            fflush(stdout);
            if (!w->formed_once)
                w->store.set(w->store.ctx, "started", "1", 1, why, sizeof why);
            w->formed_once = true;
            w->failed_at_ms = 0;
            w->reported = false;
            return 0;
        }
        if (rc != PS_EUNAVAIL) {
            snprintf(err, errlen, "%s", why);
            return rc;
        }
        ps_log_warn("generation %" PRId64 ": %s", g, why);
        report_failed(w, (uint64_t)g);
    }
    return 1;
}

/* ---- the checkpoint psd ------------------------------------------------- */

/* Creates the variables on the checkpoint psd (idempotent for the same
 * spec) and starts from its values and version: a fresh job from psd's
 * initializers, a restored or resumed one from where it was. */
static int mirror_open(struct mwm *w, char *err, size_t errlen)
{
    const struct wd_train_opts *o = w->o;
    ps_rpc_client_opts co = {.deadline_ms = o->rpc_timeout_ms, .max_attempts = 1000000,
                             .backoff_initial_ms = 100, .backoff_max_ms = 2000,
                             .retry_budget_ms = o->retry_budget_ms};
    int rc = ps_client_create(o->ps[0], &co, &w->ps);
    if (rc != 0) {
        snprintf(err, errlen, "checkpoint psd %s: %s", o->ps[0], ps_strerror(rc));
        return rc;
    }
    w->nitems = ps_model_param_count(w->m);
    w->items = calloc((size_t)w->nitems, sizeof *w->items);
    if (w->items == NULL)
        return -ENOMEM;
    for (int k = 0; k < w->nitems; k++) {
        const struct ps_param_info *pi = ps_model_param_info(w->m, k);
        struct wd_var_spec vs;
        wd_var_spec_init(&vs, o, pi->name, pi->ndim, pi->shape, pi->init, k,
                         PS__V1__OPTIMIZER__KIND__SGD);
        vs.spec.consistency = PS__V1__CONSISTENCY__ASYNC;
        ps_rpc_status st = {0};
        if ((rc = ps_client_create_variable(w->ps, &vs.spec, NULL, NULL, o->rpc_timeout_ms,
                                            &st)) != 0) {
            snprintf(err, errlen, "checkpoint psd %s: CreateVariable '%s': %s", o->ps[0],
                     pi->name, rc == PS_ERPC ? st.message : ps_strerror(rc));
            return rc == PS_ERPC && st.code == PS_RPC_ALREADY_EXISTS ? PS_ESHAPE : rc;
        }
        w->items[k] = (ps_client_item){.name = pi->name, .data = w->state + pi->offset,
                                       .n = pi->count};
    }
    ps_rpc_status st = {0};
    if ((rc = ps_client_pull(w->ps, w->items, (size_t)w->nitems, o->rpc_timeout_ms,
                             &st)) != 0) {
        snprintf(err, errlen, "checkpoint psd %s: Pull: %s", o->ps[0],
                 rc == PS_ERPC ? st.message : ps_strerror(rc));
        return rc;
    }
    if ((rc = ps_model_params_from_host(w->m, w->state)) != 0) {
        snprintf(err, errlen, "%s", ps_model_errmsg(w->m));
        return rc;
    }
    /* Resumed: the position the job would have reached with all its
     * workers (the exact one travels only between live groups). */
    w->step = (int64_t)w->items[0].version;
    int64_t global = (int64_t)(o->num_workers > 0 ? o->num_workers : 1) * o->batch;
    int64_t per_epoch = w->train->n / global;
    if (w->step > 0 && per_epoch > 0) {
        w->epoch = w->step / per_epoch;
        w->pos = (w->step % per_epoch) * global;
    }
    return 0;
}

/* Rank 0: this step's averaged gradient (in buf) to the checkpoint psd. A
 * psd that is away costs a warning, not the step: the checkpoints lag
 * until it is back. */
static void mirror_push(struct mwm *w)
{
    if (w->ps == NULL || w->rank != 0)
        return;
    for (int k = 0; k < w->nitems; k++)
        w->items[k].data = w->buf + ps_model_param_info(w->m, k)->offset;
    ps_rpc_status st = {0};
    int rc = ps_client_push(w->ps, (uint32_t)w->o->task_index, (uint64_t)w->step, w->items,
                            (size_t)w->nitems, w->o->rpc_timeout_ms, &st);
    if (rc != 0 && !w->ps_warned)
        ps_log_warn("checkpoint psd %s: Push of step %" PRId64 ": %s", w->o->ps[0],
                    w->step, rc == PS_ERPC ? st.message : ps_strerror(rc));
    w->ps_warned = rc != 0;
}

/* ---- the steps --------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Epoch e's order of the training set: the same on every worker. */
static void shuffle_epoch(struct mwm *w, int64_t e)
{
    int64_t n = w->train->n;
    uint64_t s = w->o->seed * 0x100000001b3ull + (uint64_t)e;
    for (int64_t i = 0; i < n; i++)
        w->perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(splitmix(&s) % (uint64_t)(i + 1));
        int64_t t = w->perm[i];
        w->perm[i] = w->perm[j];
        w->perm[j] = t;
    }
    w->perm_epoch = e;
}

/* FNV-1a of the parameters' bytes: equal on every member after each step. */
static uint64_t checksum(struct mwm *w)
{
    if (ps_model_params_to_host(w->m, w->state) != 0)
        return 0;
    const unsigned char *p = (const unsigned char *)w->state;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < w->np * sizeof(float); i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Whether pscoord has a generation past ours (looked up every
 * MWM_POLL_MS). */
static bool newer_generation(struct mwm *w)
{
    int64_t now = ps_now_ms();
    if (now - w->last_poll_ms < MWM_POLL_MS)
        return false;
    w->last_poll_ms = now;
    int64_t g = kv_get_u64(w, "generation", 0);
    return g > 0 && (uint64_t)g > w->gen;
}

/* One step of the group: this rank's slice, the all-reduce, the update.
 * Returns 0 (applied), 1 (the group must re-form: it failed, or agreed to
 * move to a newer generation), or a model error. */
static int mwm_step(struct mwm *w, float *loss, char *err, size_t errlen)
{
    const struct wd_train_opts *o = w->o;
    int b = o->batch;
    const int64_t *idx = w->perm + w->pos + (int64_t)w->rank * b;
    wd_step_delay(o);
    double c0 = ps_now_s();
    ps_dataset_gather(w->train, idx, b, w->xb, w->yb);
    double c1 = ps_now_s();
    int rc = ps_model_forward_backward(w->m, w->xb, w->yb, b, loss);
    if (rc == 0)
        rc = ps_model_grads_to_host(w->m, w->buf);
    double c2 = ps_now_s();
    w->t_gather += c1 - c0;
    w->t_compute += c2 - c1;
    if (rc != 0) {
        snprintf(err, errlen, "step %" PRId64 ": %s", w->step, ps_model_errmsg(w->m));
        return rc;
    }
    w->buf[w->np] = *loss;
    w->buf[w->np + 1] = newer_generation(w) ? 1.0f : 0.0f;
    char why[1024];
    int64_t t0 = ps_now_ms();
    if (w->coll->allreduce_f32(w->coll, w->buf, w->np + 2, why, sizeof why) != 0) {
        ps_log_warn("generation %" PRIu64 " step %" PRId64 ": %s", w->gen, w->step, why);
        printf("worker %d: generation %" PRIu64 " failed at step %" PRId64 " after "
               "%.2f s: %s\n", o->task_index, w->gen, w->step,
               (double)(ps_now_ms() - t0) / 1000.0, why);
        fflush(stdout);
        w->failed_at_ms = ps_now_ms();
        w->left_why = "a failure";
        if (w->skip_below <= w->gen)
            w->skip_below = w->gen + 1;
        return 1;
    }
    double c3 = ps_now_s();
    w->t_reduce += c3 - c2;
    float inv = 1.0f / (float)w->size;
    for (size_t i = 0; i < w->np; i++)
        w->buf[i] *= inv;
    if ((rc = ps_model_grads_from_host(w->m, w->buf)) != 0) {
        snprintf(err, errlen, "step %" PRId64 ": %s", w->step, ps_model_errmsg(w->m));
        return rc;
    }
    ps_model_sgd_step(w->m, o->lr);
    double c4 = ps_now_s();
    mirror_push(w);
    w->t_update += c4 - c3;
    w->t_push += ps_now_s() - c4;
    *loss = w->buf[w->np] * inv;
    w->step++;
    w->pos += (int64_t)w->size * b;
    if (w->buf[w->np + 1] > 0) {
        w->failed_at_ms = ps_now_ms();
        w->left_why = "a new generation";
        w->reported = true; /* nothing failed */
        return 1;
    }
    return 0;
}

static void mwm_close(struct mwm *w)
{
    wd_coll_destroy(w->coll);
    ps_client_destroy(w->ps);
    ps_model_destroy(w->m);
    PS_FREE_ALL(w->items, w->buf, w->state, w->perm, w->xb, w->yb);
}

static int mwm_open(struct mwm *w, const struct wd_train_opts *o,
                    const struct ps_dataset *train, char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    w->o = o;
    w->mo = o->mwm;
    w->train = train;
    w->perm_epoch = -1;
    w->store = wd_coll_coord_store(o->mwm->coord);
    const struct ps_backend *be = &ps_backend_cpu;
    if (strncmp(o->device, "cuda:", 5) == 0) {
        char why[256];
        be = ps_backend_cuda(atoi(o->device + 5), why, sizeof why);
        if (be == NULL) {
            snprintf(err, errlen, "--device %s: %s", o->device, why);
            return PS_ENODEV;
        }
    }
    int rc = ps_model_create_on(be, o->model, train->h, train->w, train->c, o->nclasses,
                                o->batch, &w->m, err, errlen);
    if (rc != 0)
        return rc;
    ps_model_init_params(w->m, o->init_seed);
    w->np = ps_model_nparams(w->m);
    w->buf = malloc((w->np + 2) * sizeof *w->buf);
    w->state = malloc((w->np + 6) * sizeof *w->state);
    w->perm = malloc((size_t)train->n * sizeof *w->perm);
    w->xb = malloc((size_t)o->batch * (size_t)train->dim * sizeof *w->xb);
    w->yb = malloc((size_t)o->batch * sizeof *w->yb);
    if (!w->buf || !w->state || !w->perm || !w->xb || !w->yb)
        return -ENOMEM;
    describe_model(w);
    if (!w->mo->nccl && (rc = wd_coll_gloo_check_host(w->mo->host, err, errlen)) != 0)
        return rc;
    if (o->nps > 0 && (rc = mirror_open(w, err, errlen)) != 0)
        return rc;
    char key[64];
    snprintf(key, sizeof key, "model/%d", o->task_index);
    return w->store.set(w->store.ctx, key, w->model_desc, strlen(w->model_desc) + 1, err,
                  errlen) != 0 ? PS_ERPC : 0;
}

/* Whether the job's position is past its end. */
static bool finished(struct mwm *w)
{
    const struct wd_train_opts *o = w->o;
    return wd_stop_requested || (o->max_steps && w->step >= o->max_steps) ||
           (o->epochs > 0 && w->epoch >= o->epochs);
}

/* The loop: form, step until the group must re-form or the job ends. */
static int mwm_run(struct mwm *w, struct wd_train_result *res, char *err, size_t errlen)
{
    const struct wd_train_opts *o = w->o;
    int64_t t0 = ps_now_ms(), last = t0, window_ex = 0, steps0 = 0;
    double window_loss = 0;
    int window_n = 0;
    for (;;) {
        if (w->coll == NULL) {
            int rc = form(w, err, errlen);
            if (rc != 0)
                return rc == 1 ? 0 : rc;
            steps0 = w->step;
            if (w->started_ms == 0)
                w->started_ms = t0 = last = ps_now_ms();
        }
        if (finished(w))
            break;
        if (w->pos + (int64_t)w->size * o->batch > w->train->n) {
            w->epoch++;
            w->pos = 0;
            continue;
        }
        if (w->perm_epoch != w->epoch)
            shuffle_epoch(w, w->epoch);
        float loss = 0;
        int rc = mwm_step(w, &loss, err, errlen);
        if (rc < 0 || rc > 1)
            return rc;
        if (rc == 1) {
            wd_coll_destroy(w->coll);
            w->coll = NULL;
            continue;
        }
        res->steps++;
        res->examples += o->batch;
        window_loss += loss;
        window_n++;
        window_ex += o->batch;
        int64_t now = ps_now_ms();
        double rate = now > t0 ? (double)res->examples * 1000.0 / (double)(now - t0) : 0;
        if (o->on_progress != NULL)
            o->on_progress(o->progress_ctx, (uint64_t)w->step, rate, loss);
        wd_metrics_step_done(o->metrics, (uint64_t)w->step, o->batch, loss, rate);
        if (w->mo->checksum_every > 0 && w->step % w->mo->checksum_every == 0)
            printf("worker %d: step %" PRId64 " generation %" PRIu64 " checksum %016"
                   PRIx64 "\n", o->task_index, w->step, w->gen, checksum(w));
        if (o->progress_ms > 0 && now - last >= o->progress_ms) {
            res->final_loss = window_loss / window_n;
            if (!o->quiet)
                printf("worker %d: epoch %" PRId64 " step %" PRId64 "  %.0f examples/s  "
                       "loss %.4f\n", o->task_index, w->epoch, w->step,
                       (double)window_ex * 1000.0 / (double)(now - last), res->final_loss);
            last = now;
            window_loss = 0;
            window_n = 0;
            window_ex = 0;
        }
        fflush(stdout);
    }
    (void)steps0;
    if (window_n > 0)
        res->final_loss = window_loss / window_n;
    char err2[256];
    char val[32];
    snprintf(val, sizeof val, "%" PRId64, w->step);
    if (!wd_stop_requested)
        w->store.set(w->store.ctx, "done", val, strlen(val), err2, sizeof err2);
    return 0;
}

int wd_train_mwm(const struct wd_train_opts *o, const struct ps_dataset *train,
                 const struct ps_dataset *test, struct wd_train_result *res, char *err,
                 size_t errlen)
{
    memset(res, 0, sizeof *res);
    ps_backend_cpu_set_threads(o->blas_threads);
    struct mwm *w = malloc(sizeof *w);
    if (w == NULL)
        return -ENOMEM;
    int64_t t0 = ps_now_ms();
    int rc = mwm_open(w, o, train, err, errlen);
    if (rc == 0)
        rc = mwm_run(w, res, err, errlen);
    /* From the first formation (model set-up and rendezvous excluded, as
     * train.c's seconds exclude connecting and creating variables). */
    res->seconds = (double)(ps_now_ms() - (w->started_ms > 0 ? w->started_ms : t0)) / 1000.0;
    res->examples_per_second = res->seconds > 0 ? (double)res->examples / res->seconds : 0;
    res->version = (uint64_t)w->step;
    res->left_out = w->left_out;
    res->compute_seconds = w->t_compute;
    res->wait_seconds = w->t_reduce;
    ps_log_info("step phases (s): gather %.3f compute %.3f all-reduce %.3f update %.3f "
                "checkpoint push %.3f", w->t_gather, w->t_compute, w->t_reduce,
                w->t_update, w->t_push);
    if (w->left_out)
        res->version = (uint64_t)(kv_get_u64(w, "done", 0) > 0 ? kv_get_u64(w, "done", 0) : 0);
    if (rc == 0 && w->m != NULL && !w->left_out) {
        res->checksum = checksum(w);
        if (test != NULL && test->n > 0) {
            rc = ps_model_evaluate(w->m, test->x, test->y, test->n, &res->test_loss,
                                   &res->test_accuracy);
            if (rc != 0)
                snprintf(err, errlen, "evaluate: %s", ps_model_errmsg(w->m));
            res->evaluated = rc == 0;
        }
    }
    mwm_close(w);
    free(w);
    return rc;
}
