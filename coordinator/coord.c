/*
 * coord.c - membership, liveness, snapshots and placement requests; see
 * coord.h for the rules. state.c persists what this file changes and
 * jobckpt.c keeps the checkpoints.
 */
#include "common/buf.h"
#include "common/clock.h"
#include "coordinator/coord_internal.h"

#include "common/errors.h"
#include "coordinator/jsonfile.h"
#include "common/log.h"
#include "common/rpc.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

const char *coord_role_label(int role)
{
    return role >= 0 && role < PS_ROLE_COUNT ? ps_role_name((enum ps_role)role)
                                             : "?";
}

const char *coord_state_name(enum ctask_state s)
{
    switch (s) {
    case CT_NEVER_SEEN:
        return "never seen";
    case CT_UNKNOWN:
        return "unknown";
    case CT_ALIVE:
        return "alive";
    case CT_DEAD:
        return "dead";
    }
    return "?";
}

int64_t coord_unix_now(void)
{
    return (int64_t)time(NULL);
}

/* A refusal: fills st and logs it with what was refused. Returns the code,
 * which is nonzero. */
int coord_refuse(struct coord_status *st, int code, const char *what,
                 const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    st->code = code;
    ps_log_warn("%s refused: %s: %s", what, ps_rpc_code_name(code), st->msg);
    return code;
}

const char *coord_addr_or_none(const char *a)
{
    return a != NULL && a[0] != '\0' ? a : "(no address)";
}

double coord_age_s(const struct ctask *t, int64_t now)
{
    return t->heard_ms < 0 ? -1.0 : (double)(now - t->heard_ms) / 1000.0;
}

/* ---- the task table ---------------------------------------------------- */

struct ctask *coord_find_locked(coord *c, enum ps_role role, int index)
{
    for (int i = 0; i < c->ntasks; i++)
        if (c->tasks[i].role == role && c->tasks[i].index == index)
            return &c->tasks[i];
    return NULL;
}

/* Adds a never-seen task in (role, index) order. NULL when out of memory.
 * Pointers into the table are invalidated. */
struct ctask *coord_add_locked(coord *c, enum ps_role role, int index)
{
    if (c->ntasks == c->cap) {
        int cap = c->cap > 0 ? c->cap * 2 : 16;
        struct ctask *t = realloc(c->tasks, sizeof *t * (size_t)cap);
        if (t == NULL)
            return NULL;
        c->tasks = t;
        c->cap = cap;
    }
    int at = 0;
    while (at < c->ntasks &&
           (c->tasks[at].role < role ||
            (c->tasks[at].role == role && c->tasks[at].index < index)))
        at++;
    memmove(&c->tasks[at + 1], &c->tasks[at],
            sizeof *c->tasks * (size_t)(c->ntasks - at));
    c->ntasks++;
    c->tasks[at] = (struct ctask){.role = role,
                                  .index = index,
                                  .state = CT_NEVER_SEEN,
                                  .heard_ms = -1,
                                  .registered_ms = -1};
    return &c->tasks[at];
}

int coord_set_address(struct ctask *t, const char *addr)
{
    size_t n = strlen(addr);
    if (n >= sizeof t->address)
        return PS_EINVAL_ARG;
    memcpy(t->address, addr, n + 1);
    return 0;
}

void coord_bump_locked(coord *c)
{
    c->generation++;
    pthread_cond_broadcast(&c->cond);
}

uint32_t coord_num_ps_locked(coord *c)
{
    if (c->spec != NULL)
        return (uint32_t)c->spec->n[PS_ROLE_PS];
    if (c->placed)
        return c->placement.num_ps;
    uint32_t n = 0;
    for (int i = 0; i < c->ntasks; i++)
        n += c->tasks[i].role == PS_ROLE_PS;
    return n;
}

static uint32_t num_workers_locked(coord *c)
{
    if (c->spec != NULL)
        return (uint32_t)c->spec->n[PS_ROLE_WORKER];
    uint32_t n = 0;
    for (int i = 0; i < c->ntasks; i++)
        n += c->tasks[i].role == PS_ROLE_WORKER;
    return n;
}

static uint32_t live_workers_locked(coord *c)
{
    uint32_t n = 0;
    for (int i = 0; i < c->ntasks; i++)
        n += c->tasks[i].role == PS_ROLE_WORKER &&
             c->tasks[i].state == CT_ALIVE;
    return n;
}

/* The count SYNC steps wait for (see coord.h), told to every live ps when
 * it changes. */
void coord_recompute_sync_locked(coord *c)
{
    uint32_t counted = 0, any = 0;
    for (int i = 0; i < c->ntasks; i++) {
        const struct ctask *t = &c->tasks[i];
        if (t->role != PS_ROLE_WORKER)
            continue;
        any++;
        counted += t->state == CT_ALIVE || t->state == CT_UNKNOWN ||
                   (t->state == CT_NEVER_SEEN && !t->warned);
    }
    uint32_t want = any == 0 ? 0 : (counted > 0 ? counted : 1);
    if (want == c->sync_desired)
        return;
    ps_log_info("sync workers %u -> %u (%u of %u workers alive)",
                c->sync_desired, want, live_workers_locked(c), any);
    c->sync_desired = want;
    pthread_cond_broadcast(&c->cond);
}

/* ---- create, destroy --------------------------------------------------- */

static char *join(const char *dir, const char *name)
{
    char *p;
    if (asprintf(&p, "%s/%s", dir, name) < 0)
        return NULL;
    return p;
}

int coord_create(const struct coord_opts *o, coord **out, char *err,
                 size_t errlen)
{
    *out = NULL;
    coord *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    ps_cond_init_monotonic(&c->cond);
    c->o = *o;
    c->spec = o->cluster;
    c->start_ms = ps_now_ms();
    c->ck_last_ms = c->start_ms;
    c->job_id = strdup(o->job_id);
    c->state_dir = strdup(o->state_dir);
    c->state_path = join(o->state_dir, "state.json");
    c->summary_path = join(o->state_dir, "summary.json");
    c->ckpt_dir = join(o->state_dir, "checkpoints");
    int rc = -ENOMEM;
    if (c->job_id == NULL || c->state_dir == NULL || c->state_path == NULL ||
        c->summary_path == NULL || c->ckpt_dir == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if ((rc = coord_mkdirs(c->ckpt_dir)) != 0) {
        snprintf(err, errlen, "cannot make %s: %s", c->ckpt_dir,
                 ps_strerror(rc));
        goto fail;
    }
    if (c->spec != NULL) {
        for (int r = 0; r < PS_ROLE_COUNT; r++) {
            for (int i = 0; i < c->spec->n[r]; i++) {
                struct ctask *t = coord_add_locked(c, (enum ps_role)r, i);
                if (t == NULL) {
                    rc = -ENOMEM;
                    snprintf(err, errlen, "out of memory");
                    goto fail;
                }
                const char *a = c->spec->addrs[r][i];
                if ((rc = coord_set_address(t, a)) != 0) {
                    snprintf(err, errlen, "cluster spec: %s[%d]: an address of %zu "
                             "bytes; at most %d", ps_role_name((enum ps_role)r), i,
                             strlen(a), COORD_ADDR_MAX - 1);
                    goto fail;
                }
            }
        }
    }
    if ((rc = coord_state_load_locked(c, err, errlen)) != 0)
        goto fail;
    if ((rc = coord_ckpt_scan_locked(c, err, errlen)) != 0)
        goto fail;
    if (c->spec != NULL && c->placed &&
        c->placement.num_ps != (uint32_t)c->spec->n[PS_ROLE_PS]) {
        snprintf(err, errlen, "%s: the job's placement is over %u ps shards, "
                 "the cluster spec has %d; a shard count that changes under "
                 "a running job is refused", c->state_path,
                 c->placement.num_ps, c->spec->n[PS_ROLE_PS]);
        rc = PS_ECONFLICT;
        goto fail;
    }
    if (c->nckpts > 0)
        c->ck_last_step = c->ckpts[c->nckpts - 1].step;
    c->generation++;
    coord_recompute_sync_locked(c);
    if ((rc = coord_state_save_locked(c)) != 0) {
        snprintf(err, errlen, "cannot write %s: %s", c->state_path,
                 ps_strerror(rc));
        goto fail;
    }
    *out = c;
    return 0;
fail:
    coord_destroy(c);
    return rc;
}

void coord_destroy(coord *c)
{
    if (c == NULL)
        return;
    free(c->tasks);
    ps_placement_free(&c->placement);
    coord_ckpt_free_locked(c);
    for (int i = 0; i < c->nrestores; i++)
        free(c->restores[i].detail);
    PS_FREE_ALL(c->job_id, c->state_dir, c->state_path, c->summary_path, c->ckpt_dir);
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- snapshots --------------------------------------------------------- */

static int tasks_info_locked(coord *c, struct coord_cluster *s, int64_t now)
{
    s->tasks = calloc((size_t)(c->ntasks > 0 ? c->ntasks : 1),
                      sizeof *s->tasks);
    if (s->tasks == NULL)
        return -ENOMEM;
    s->ntasks = c->ntasks;
    for (int i = 0; i < c->ntasks; i++) {
        const struct ctask *t = &c->tasks[i];
        struct coord_task_info *ti = &s->tasks[i];
        memcpy(ti->address, t->address, sizeof ti->address);
        memcpy(ti->local_address, t->local_address, sizeof ti->local_address);
        memcpy(ti->host_id, t->host_id, sizeof ti->host_id);
        ti->insecure_collective = t->insecure_collective;
        ti->role = t->role;
        ti->index = (uint32_t)t->index;
        ti->alive = t->state == CT_ALIVE;
        ti->incarnation = t->incarnation;
        ti->step = t->step;
        ti->examples_per_second = t->examples_per_second;
        ti->loss = t->loss;
        ti->accuracy = t->accuracy;
        ti->last_heartbeat_age_seconds = coord_age_s(t, now);
    }
    return 0;
}

struct coord_cluster *coord_snapshot_locked(coord *c)
{
    struct coord_cluster *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    const struct ckpt_rec *last =
        c->nckpts > 0 ? &c->ckpts[c->nckpts - 1] : NULL;
    s->job_id = strdup(c->job_id);
    s->last_checkpoint_path = strdup(last != NULL ? last->path : "");
    if (s->job_id == NULL || s->last_checkpoint_path == NULL ||
        tasks_info_locked(c, s, ps_now_ms()) != 0)
        goto fail;
    s->last_checkpoint_age_seconds = -1;
    if (last != NULL)
        s->last_checkpoint_step = last->step;
    if (last != NULL && last->created_unix > 0) {
        int64_t age = coord_unix_now() - last->created_unix;
        s->last_checkpoint_age_seconds = age > 0 ? (double)age : 0.0;
    }
    s->heartbeat_interval_ms = (uint32_t)c->o.heartbeat_interval_ms;
    if (c->has_eval) {
        s->eval_accuracy = c->eval_accuracy;
        s->eval_loss = c->eval_loss;
        s->eval_step = c->eval_step;
    }
    s->generation = c->generation;
    if (c->placed && ps_placement_copy(&c->placement, &s->placement) != 0)
        goto fail;
    s->num_ps = coord_num_ps_locked(c);
    s->num_workers = num_workers_locked(c);
    s->live_workers = live_workers_locked(c);
    s->global_step = c->global_step;
    return s;
fail:
    coord_cluster_free(s);
    return NULL;
}

struct coord_cluster *coord_snapshot(coord *c)
{
    pthread_mutex_lock(&c->mu);
    struct coord_cluster *s = coord_snapshot_locked(c);
    pthread_mutex_unlock(&c->mu);
    return s;
}

void coord_cluster_free(struct coord_cluster *s)
{
    if (s == NULL)
        return;
    free(s->tasks);
    ps_placement_free(&s->placement);
    PS_FREE_ALL(s->job_id, s->last_checkpoint_path, s);
}

/* The largest loss a report may carry: FLT_MAX, rounded down. */
#define COORD_LOSS_MAX 3.4e38

/* ---- task secrets ------------------------------------------------------ */

bool coord_secret_ok(const struct ctask *t, const char *given)
{
    if (t->secret[0] == '\0' || given == NULL ||
        strlen(given) != COORD_SECRET_HEX)
        return false;
    unsigned char diff = 0;
    for (int i = 0; i < COORD_SECRET_HEX; i++)
        diff |= (unsigned char)(t->secret[i] ^ given[i]);
    return diff == 0;
}

int coord_secret_new(struct ctask *t)
{
    unsigned char raw[COORD_SECRET_HEX / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(t->secret + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

/* ---- Heartbeat, ReportMetrics ------------------------------------------ */

int coord_check_job(coord *c, const char *job_id, const char *what,
                    struct coord_status *st)
{
    memset(st, 0, sizeof *st);
    if (job_id == NULL || job_id[0] == '\0' || strcmp(job_id, c->job_id) == 0)
        return 0;
    return coord_refuse(st, PS_RPC_FAILED_PRECONDITION, what,
                  "job '%s': this coordinator runs job '%s'", job_id,
                  c->job_id);
}

int coord_check_worker(coord *c, uint32_t index, const char *secret,
                       const char *what, struct coord_status *st)
{
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&c->mu);
    const struct ctask *t =
        index <= INT32_MAX ? coord_find_locked(c, PS_ROLE_WORKER, (int)index) : NULL;
    int rc = 0;
    if (t == NULL || t->incarnation == 0)
        rc = coord_refuse(st, PS_RPC_PERMISSION_DENIED, what,
                          "worker[%u] has not registered; the rendezvous is for "
                          "registered workers, with their task_secret", index);
    else if (secret == NULL || secret[0] == '\0')
        rc = coord_refuse(st, PS_RPC_PERMISSION_DENIED, what,
                          "no task_secret: send the one worker[%u]'s RegisterTask "
                          "answered with", index);
    else if (!coord_secret_ok(t, secret))
        rc = coord_refuse(st, PS_RPC_PERMISSION_DENIED, what,
                          "the task_secret sent is not worker[%u]'s", index);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* The checks a heartbeat and a metrics report share: the job, the role, and
 * two numbers that must be finite (named in finite_names). Fills what
 * ("Heartbeat of ps[1]"). */
static int check_task_report(coord *c, const char *verb,
                             const struct coord_task_ref *from, double a,
                             double b, const char *finite_names, char *what,
                             size_t whatlen, struct coord_status *st)
{
    snprintf(what, whatlen, "%s of %s[%u]", verb,
             coord_role_label(from->role), from->index);
    int rc = coord_check_job(c, from->job_id, what, st);
    if (rc != 0)
        return rc;
    if (from->role < 0 || from->role >= PS_ROLE_COUNT)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                            "role %d is not CHIEF, WORKER, PS or EVALUATOR",
                            from->role_sent);
    if (!isfinite(a) || !isfinite(b))
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                            "%s must be finite", finite_names);
    return 0;
}

/* The checks of a heartbeat or a metrics report from a task the coordinator
 * knows: its secret, and a step not far past the global step (which drives
 * the checkpoint schedule; see COORD_STEP_AHEAD_MAX). Called with c->mu
 * held. */
static int check_reporter_locked(coord *c, const struct ctask *t,
                                 const char *what, const char *secret,
                                 uint64_t step, struct coord_status *st)
{
    const char *rn = ps_role_name(t->role);
    if (secret == NULL || secret[0] == '\0')
        return coord_refuse(st, PS_RPC_PERMISSION_DENIED, what,
                            "no task_secret: send the one %s[%d]'s "
                            "RegisterTask answered with", rn, t->index);
    if (!coord_secret_ok(t, secret))
        return coord_refuse(st, PS_RPC_PERMISSION_DENIED, what,
                            "the task_secret sent is not %s[%d]'s (it is "
                            "the one its RegisterTask answered with)", rn,
                            t->index);
    uint64_t g = c->global_step;
    if (step > g && step - g > COORD_STEP_AHEAD_MAX)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                            "step %" PRIu64 " is more than 2^40 past the "
                            "job's global step %" PRIu64, step, g);
    return 0;
}

/* The step a report may record for t at now: req_step held to the task's
 * pace (coord.h, Steps), logged the first time per incarnation that it is
 * held. Called with c->mu held. */
static uint64_t paced_step_locked(coord *c, struct ctask *t, uint64_t req_step,
                                  int64_t now)
{
    if (t->pace_ms == 0) {
        /* Loaded from state.json: paced from the coordinator's start. */
        t->pace_step = t->step > c->global_step ? t->step : c->global_step;
        t->pace_ms = c->start_ms;
    }
    uint64_t elapsed_ms = now > t->pace_ms ? (uint64_t)(now - t->pace_ms) : 0;
    uint64_t room = COORD_STEP_SLACK + COORD_STEP_RATE_MAX / 1000 * elapsed_ms;
    uint64_t limit = t->pace_step + room; /* no overflow: both below 2^62 */
    if (req_step <= limit)
        return req_step;
    if (!t->pace_warned)
        ps_log_warn("%s[%d]: reported step %" PRIu64 " is past its pace; held to %" PRIu64
                    " (at most %" PRIu64 " steps a second since step %" PRIu64 ")",
                    ps_role_name(t->role), t->index, req_step, limit,
                    COORD_STEP_RATE_MAX, t->pace_step);
    t->pace_warned = true;
    return limit > t->step ? limit : t->step;
}

static int cmp_step(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Raises the global step to the lower median of the live workers' and
 * chief's steps (coord.h, Steps). Called with c->mu held. */
static void global_step_locked(coord *c)
{
    uint64_t *v = malloc(sizeof *v * (size_t)(c->ntasks > 0 ? c->ntasks : 1));
    if (v == NULL)
        return; /* it stays; the next heartbeat tries again */
    size_t n = 0;
    for (int i = 0; i < c->ntasks; i++) {
        const struct ctask *t = &c->tasks[i];
        if ((t->role == PS_ROLE_WORKER || t->role == PS_ROLE_CHIEF) &&
            t->incarnation != 0 && t->state == CT_ALIVE)
            v[n++] = t->step;
    }
    if (n > 0) {
        qsort(v, n, sizeof *v, cmp_step);
        uint64_t median = v[(n - 1) / 2];
        if (median > c->global_step)
            c->global_step = median;
    }
    free(v);
}

/* A heartbeat from the task's current incarnation: alive (again), and its
 * progress. Called with c->mu held. */
static void heard_locked(coord *c, struct ctask *t,
                         const struct coord_heartbeat_req *req, int64_t now)
{
    const char *rn = ps_role_name(t->role);
    if (t->state != CT_ALIVE) {
        if (t->state == CT_DEAD)
            ps_log_info("%s[%u] at %s is alive again after %.1f s of "
                        "silence", rn, req->from.index,
                        coord_addr_or_none(t->address), coord_age_s(t, now));
        else
            ps_log_info("%s[%u] at %s heard from again after the "
                        "coordinator's restart", rn, req->from.index,
                        coord_addr_or_none(t->address));
        t->state = CT_ALIVE;
        coord_bump_locked(c);
    }
    t->heard_ms = now;
    uint64_t step = paced_step_locked(c, t, req->step, now);
    if (t->step != step ||
        t->examples_per_second != req->examples_per_second)
        c->progress++;
    t->step = step;
    t->examples_per_second = req->examples_per_second;
    /* An evaluator's loss is its evaluation's, which ReportMetrics brings;
     * its heartbeats carry none. */
    if (t->role != PS_ROLE_EVALUATOR)
        t->loss = req->loss;
    if (t->role == PS_ROLE_WORKER || t->role == PS_ROLE_CHIEF)
        global_step_locked(c);
    coord_recompute_sync_locked(c);
}

int coord_heartbeat(coord *c, const struct coord_heartbeat_req *req,
                    enum coord_directive *directive, uint64_t *generation,
                    struct coord_status *st)
{
    *directive = COORD_DIRECTIVE_NONE;
    char what[96];
    int rc = check_task_report(c, "Heartbeat", &req->from,
                               req->examples_per_second, req->loss,
                               "examples_per_second and loss", what,
                               sizeof what, st);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    struct ctask *t = coord_find_locked(c, (enum ps_role)req->from.role,
                                        (int)req->from.index);
    if (t != NULL && t->incarnation != 0 &&
        (rc = check_reporter_locked(c, t, what, req->from.secret, req->step,
                                    st)) != 0) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    if (t == NULL || t->incarnation == 0 ||
        t->incarnation != req->incarnation) {
        ps_log_info("%s: incarnation %" PRIu64 " is not the registered one "
                    "(%" PRIu64 "): told to register again", what,
                    req->incarnation, t != NULL ? t->incarnation : 0);
        *directive = COORD_DIRECTIVE_REREGISTER;
    } else {
        heard_locked(c, t, req, ps_now_ms());
    }
    *generation = c->generation;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

int coord_report_metrics(coord *c, const struct coord_metrics_req *req,
                         struct coord_status *st)
{
    char what[96];
    int rc = check_task_report(c, "ReportMetrics", &req->from, req->loss,
                               req->accuracy, "loss and accuracy", what,
                               sizeof what, st);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    enum ps_role role = (enum ps_role)req->from.role;
    struct ctask *t = coord_find_locked(c, role, (int)req->from.index);
    if (t == NULL || t->incarnation == 0)
        rc = coord_refuse(st, PS_RPC_PERMISSION_DENIED, what,
                          "%s[%u] has not registered; register first and "
                          "send the task_secret RegisterTask answers with",
                          ps_role_name(role), req->from.index);
    else
        rc = check_reporter_locked(c, t, what, req->from.secret, req->step,
                                   st);
    /* What GetCluster and psctl show as the job's result: a fraction, and
     * a loss within a float's range (a model's loss is a float). Checked
     * once the reporter is known to be the task. */
    if (rc == 0 && !(req->accuracy >= 0.0 && req->accuracy <= 1.0))
        rc = coord_refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                          "accuracy %g is not in [0, 1]", req->accuracy);
    if (rc == 0 && !(req->loss >= 0.0 && req->loss <= COORD_LOSS_MAX))
        rc = coord_refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                          "loss %g is not in [0, 3.4e38]", req->loss);
    if (rc != 0) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    t->loss = req->loss;
    if (role == PS_ROLE_EVALUATOR) {
        t->accuracy = req->accuracy;
        c->has_eval = true;
        c->eval_accuracy = req->accuracy;
        c->eval_loss = req->loss;
        c->eval_step = req->step;
        c->eval_unix = coord_unix_now();
        ps_log_info("evaluation at step %" PRIu64 ": accuracy %.4f, loss %.4f "
                    "(evaluator[%u])", req->step, req->accuracy, req->loss,
                    req->from.index);
        coord_state_save_locked(c);
    }
    c->progress++;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* ---- Place ------------------------------------------------------------- */

/* The shard count a first placement is made for, or a refusal. */
static int place_shards_locked(coord *c, uint32_t *num_ps,
                               struct coord_status *st)
{
    if (c->spec != NULL) {
        *num_ps = (uint32_t)c->spec->n[PS_ROLE_PS];
        if (*num_ps == 0)
            return coord_refuse(st, PS_RPC_FAILED_PRECONDITION, "Place",
                          "the cluster spec has no ps tasks to place "
                          "variables on");
        return 0;
    }
    int n = 0, top = -1;
    for (int i = 0; i < c->ntasks; i++) {
        if (c->tasks[i].role != PS_ROLE_PS)
            continue;
        n++;
        if (c->tasks[i].index > top)
            top = c->tasks[i].index;
    }
    if (n == 0)
        return coord_refuse(st, PS_RPC_UNAVAILABLE, "Place",
                      "no ps task has registered yet");
    for (int i = 0; i <= top; i++)
        if (coord_find_locked(c, PS_ROLE_PS, i) == NULL)
            return coord_refuse(st, PS_RPC_UNAVAILABLE, "Place",
                          "ps[%d] has not registered yet (ps[%d] has); the "
                          "shards must be ps[0] to ps[%d]", i, top, top);
    *num_ps = (uint32_t)n;
    return 0;
}

/* The job's first placement, for the shards it has. Called with c->mu
 * held. */
static int place_first_locked(coord *c, const struct ps_place_var *vars,
                              int n, struct coord_status *st)
{
    uint32_t num_ps = 0;
    int rc = place_shards_locked(c, &num_ps, st);
    if (rc != 0)
        return rc;
    if (ps_place_compute(vars, n, num_ps, c->o.split_threshold,
                         &c->placement) != 0)
        return coord_refuse(st, PS_RPC_RESOURCE_EXHAUSTED, "Place",
                            "out of memory");
    int split = 0;
    for (int i = 0; i < c->placement.nvars; i++)
        split += c->placement.vars[i].nparts > 1;
    c->placed = true;
    coord_bump_locked(c);
    ps_log_info("placed %d variables over %u ps shards (%d split over all "
                "shards)", c->placement.nvars, num_ps, split);
    coord_state_save_locked(c);
    return 0;
}

/* The registered task that sends secret, found by it (a proposal from a
 * client that names no task): every task is compared (no early exit).
 * NULL when none. Called with c->mu held. */
static const struct ctask *task_by_secret_locked(coord *c, const char *secret)
{
    const struct ctask *found = NULL;
    for (int i = 0; i < c->ntasks; i++) {
        const struct ctask *t = &c->tasks[i];
        if (t->incarnation != 0 && coord_secret_ok(t, secret))
            found = t;
    }
    return found;
}

/* The task a Place comes from, proven by its secret, into *out; or the
 * refusal. Called with c->mu held. */
static int proposer_locked(coord *c, const struct coord_task_ref *from,
                           const struct ctask **out, struct coord_status *st)
{
    const char *secret = from->secret != NULL ? from->secret : "";
    const char *rn = coord_role_label(from->role);
    if (from->role == COORD_ROLE_BAD)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, "Place",
                            "role %d is not CHIEF, WORKER, PS or EVALUATOR",
                            from->role_sent);
    if (secret[0] == '\0')
        return coord_refuse(st, PS_RPC_PERMISSION_DENIED, "Place",
                            "no task_secret: only a registered chief, worker or "
                            "evaluator that sends the task_secret its RegisterTask "
                            "answered with (or an operator token) may propose the "
                            "job's model");
    const struct ctask *t;
    if (from->role == COORD_ROLE_ANY) {
        t = task_by_secret_locked(c, secret);
        if (t == NULL)
            return coord_refuse(st, PS_RPC_PERMISSION_DENIED, "Place",
                                "the task_secret is no registered task's");
    } else {
        t = from->index <= INT32_MAX
                ? coord_find_locked(c, (enum ps_role)from->role, (int)from->index)
                : NULL;
        if (t == NULL || t->incarnation == 0)
            return coord_refuse(st, PS_RPC_PERMISSION_DENIED, "Place",
                                "%s[%u] has not registered", rn, from->index);
        if (!coord_secret_ok(t, secret))
            return coord_refuse(st, PS_RPC_PERMISSION_DENIED, "Place",
                                "the task_secret sent is not %s[%u]'s", rn,
                                from->index);
    }
    if (t->role == PS_ROLE_PS)
        return coord_refuse(st, PS_RPC_PERMISSION_DENIED, "Place",
                            "the task_secret is a ps's: a ps does not propose the "
                            "job's model");
    *out = t;
    return 0;
}

/* Whether t may make the job's first placement, which fixes it for good:
 * the chief, as TensorFlow names it (a chief task, else worker 0). */
static bool chief(const struct ctask *t)
{
    return t->role == PS_ROLE_CHIEF || (t->role == PS_ROLE_WORKER && t->index == 0);
}

int coord_place(coord *c, const struct ps_place_var *vars, int n,
                const struct coord_task_ref *from, bool operator,
                struct ps_placement *out, struct coord_status *st)
{
    memset(st, 0, sizeof *st);
    memset(out, 0, sizeof *out);
    char why[400];
    if (ps_place_check(vars, n, why, sizeof why) != 0)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, "Place", "%s", why);
    pthread_mutex_lock(&c->mu);
    const struct ctask *t = NULL;
    int rc = operator ? 0 : proposer_locked(c, from, &t, st);
    if (rc == 0 && !c->placed && t != NULL && !chief(t))
        rc = coord_refuse(st, PS_RPC_PERMISSION_DENIED, "Place",
                          "%s[%d] may not make the job's first placement, which "
                          "fixes it for good: only the chief (worker[0], or a "
                          "chief task) or an operator token may; once it has, "
                          "a proposal of the same model is answered (GetCluster "
                          "shows the placement)", ps_role_name(t->role), t->index);
    else if (rc == 0 && !c->placed)
        rc = place_first_locked(c, vars, n, st);
    else if (rc == 0 && ps_place_same(&c->placement, vars, n, why, sizeof why) != 0)
        rc = coord_refuse(st, PS_RPC_FAILED_PRECONDITION, "Place",
                          "this job's model is placed already and the "
                          "proposal differs: %s", why);
    if (rc == 0 && ps_placement_copy(&c->placement, out) != 0)
        rc = coord_refuse(st, PS_RPC_RESOURCE_EXHAUSTED, "Place",
                          "out of memory");
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- waiting, stopping ------------------------------------------------- */

void coord_versions(coord *c, uint64_t *generation, uint64_t *progress)
{
    pthread_mutex_lock(&c->mu);
    *generation = c->generation;
    *progress = c->progress;
    pthread_mutex_unlock(&c->mu);
}

uint64_t coord_wait(coord *c, uint64_t seen, int timeout_ms)
{
    struct timespec until = ps_time_after_ms(CLOCK_MONOTONIC, timeout_ms);
    pthread_mutex_lock(&c->mu);
    uint64_t kicks = c->kicks;
    while (!c->stopping && c->generation == seen && c->kicks == kicks)
        if (pthread_cond_timedwait(&c->cond, &c->mu, &until) == ETIMEDOUT)
            break;
    uint64_t e = c->generation;
    pthread_mutex_unlock(&c->mu);
    return e;
}

void coord_kick(coord *c)
{
    pthread_mutex_lock(&c->mu);
    c->kicks++;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
}

void coord_stop(coord *c)
{
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
}

bool coord_stopping(coord *c)
{
    pthread_mutex_lock(&c->mu);
    bool s = c->stopping;
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* ---- liveness ---------------------------------------------------------- */

void coord_tick(coord *c)
{
    pthread_mutex_lock(&c->mu);
    int64_t now = ps_now_ms();
    bool changed = false, recount = false;
    for (int i = 0; i < c->ntasks; i++) {
        struct ctask *t = &c->tasks[i];
        const char *rn = ps_role_name(t->role);
        if (t->state == CT_ALIVE &&
            now - t->heard_ms > c->o.heartbeat_timeout_ms) {
            t->state = CT_DEAD;
            c->missed_heartbeats[t->role]++;
            changed = true;
            ps_log_warn("%s[%d] at %s is dead: no heartbeat for %.1f s", rn,
                        t->index, coord_addr_or_none(t->address), coord_age_s(t, now));
        } else if (t->state == CT_UNKNOWN && now > t->grace_until_ms) {
            t->state = CT_DEAD;
            c->missed_heartbeats[t->role]++;
            /* Not heard since the restart at least: ages count from it. */
            t->heard_ms = c->start_ms;
            changed = true;
            ps_log_warn("%s[%d] at %s is dead: not heard from since the "
                        "coordinator restarted %.1f s ago", rn, t->index,
                        coord_addr_or_none(t->address),
                        (double)(now - c->start_ms) / 1000.0);
        } else if (t->state == CT_NEVER_SEEN && c->spec != NULL &&
                   !t->warned && now - c->start_ms > c->o.register_warn_ms) {
            t->warned = true;
            recount = true;
            ps_log_warn("%s[%d] at %s has not registered after %.0f s", rn,
                        t->index, coord_addr_or_none(t->address),
                        (double)c->o.register_warn_ms / 1000.0);
        }
    }
    if (changed)
        coord_bump_locked(c);
    if (changed || recount)
        coord_recompute_sync_locked(c);
    pthread_mutex_unlock(&c->mu);
}

/* ---- sync counts ------------------------------------------------------- */

int coord_sync_pending(coord *c, struct coord_ps_call *out, int max)
{
    int n = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->ntasks && n < max && c->sync_desired > 0; i++) {
        const struct ctask *t = &c->tasks[i];
        if (t->role != PS_ROLE_PS || t->state != CT_ALIVE ||
            t->sync_told == c->sync_desired)
            continue;
        memset(&out[n], 0, sizeof out[n]);
        out[n].index = (uint32_t)t->index;
        out[n].incarnation = t->incarnation;
        out[n].workers = c->sync_desired;
        snprintf(out[n].address, sizeof out[n].address, "%s", t->address);
        n++;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

void coord_sync_done(coord *c, const struct coord_ps_call *call,
                     bool settled)
{
    pthread_mutex_lock(&c->mu);
    struct ctask *t = coord_find_locked(c, PS_ROLE_PS, (int)call->index);
    if (settled && t != NULL && t->incarnation == call->incarnation)
        t->sync_told = call->workers;
    pthread_mutex_unlock(&c->mu);
}

/* ---- persistence entry points ------------------------------------------ */

/* Runs one of the _locked writers with c->mu held. */
static int write_locked(coord *c, int (*write)(coord *c))
{
    pthread_mutex_lock(&c->mu);
    int rc = write(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int coord_save(coord *c)
{
    return write_locked(c, coord_state_save_locked);
}

int coord_write_summary(coord *c)
{
    return write_locked(c, coord_summary_write_locked);
}
