/*
 * coord.c - membership, liveness, snapshots and placement requests; see
 * coord.h for the rules. state.c persists what this file changes and
 * jobckpt.c keeps the checkpoints.
 */
#include "coord_internal.h"

#include "errors.h"
#include "jsonfile.h"
#include "log.h"
#include "rpc.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The protobuf Role values are ps_role + 1 (0 is "unspecified"). */
static int role_from_pb(int pb, enum ps_role *out)
{
    if (pb < PS__V1__ROLE__CHIEF || pb > PS__V1__ROLE__EVALUATOR)
        return PS_EINVAL_ARG;
    *out = (enum ps_role)(pb - 1);
    return 0;
}

static int role_to_pb(enum ps_role r)
{
    return (int)r + 1;
}

const char *coord_role_name_pb(int role)
{
    enum ps_role r;
    return role_from_pb(role, &r) == 0 ? ps_role_name(r) : NULL;
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
static int refuse(struct coord_status *st, int code, const char *what,
                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int refuse(struct coord_status *st, int code, const char *what,
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

static const char *addr_or_none(const char *a)
{
    return a != NULL && a[0] != '\0' ? a : "(no address)";
}

static double age_s(const struct ctask *t, int64_t now)
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
    char *addr = strdup("");
    if (addr == NULL)
        return NULL;
    int at = 0;
    while (at < c->ntasks &&
           (c->tasks[at].role < role ||
            (c->tasks[at].role == role && c->tasks[at].index < index)))
        at++;
    memmove(&c->tasks[at + 1], &c->tasks[at],
            sizeof *c->tasks * (size_t)(c->ntasks - at));
    c->ntasks++;
    struct ctask *t = &c->tasks[at];
    memset(t, 0, sizeof *t);
    t->role = role;
    t->index = index;
    t->address = addr;
    t->state = CT_NEVER_SEEN;
    t->heard_ms = -1;
    return t;
}

static int set_address(struct ctask *t, const char *addr)
{
    if (strcmp(t->address, addr) == 0)
        return 0;
    char *a = strdup(addr);
    if (a == NULL)
        return -ENOMEM;
    free(t->address);
    t->address = a;
    return 0;
}

void coord_bump_locked(coord *c)
{
    c->epoch++;
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
static void recompute_sync_locked(coord *c)
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
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cond, &ca);
    pthread_condattr_destroy(&ca);
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
                if (t == NULL || set_address(t, c->spec->addrs[r][i]) != 0) {
                    rc = -ENOMEM;
                    snprintf(err, errlen, "out of memory");
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
    c->epoch++;
    recompute_sync_locked(c);
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
    for (int i = 0; i < c->ntasks; i++)
        free(c->tasks[i].address);
    free(c->tasks);
    ps_placement_free(&c->placement);
    coord_ckpt_free_locked(c);
    for (int i = 0; i < c->nrestores; i++)
        free(c->restores[i].detail);
    free(c->job_id);
    free(c->state_dir);
    free(c->state_path);
    free(c->summary_path);
    free(c->ckpt_dir);
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- snapshots --------------------------------------------------------- */

static char *dup_or_empty(const char *s)
{
    return strdup(s != NULL ? s : "");
}

/* Builds the protobuf form of a placement; the array and everything in it
 * are malloc'd, as protobuf_c_message_free_unpacked expects. */
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
        Ps__V1__VariablePlacement *vp = malloc(sizeof *vp);
        if (vp == NULL)
            return -ENOMEM;
        ps__v1__variable_placement__init(vp);
        arr[i] = vp;
        (*nout)++;
        vp->name = strdup(v->name);
        if (vp->name == NULL)
            return -ENOMEM;
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
            Ps__V1__VariablePart *part = malloc(sizeof *part);
            if (part == NULL)
                return -ENOMEM;
            ps__v1__variable_part__init(part);
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

static Ps__V1__ClusterState *snapshot_locked(coord *c)
{
    int64_t now = ps_now_ms();
    Ps__V1__ClusterState *s = malloc(sizeof *s);
    if (s == NULL)
        return NULL;
    ps__v1__cluster_state__init(s);
    s->job_id = strdup(c->job_id);
    s->last_checkpoint_path = dup_or_empty(
        c->nckpts > 0 ? c->ckpts[c->nckpts - 1].path : NULL);
    s->tasks = calloc((size_t)(c->ntasks > 0 ? c->ntasks : 1),
                      sizeof *s->tasks);
    if (s->job_id == NULL || s->last_checkpoint_path == NULL ||
        s->tasks == NULL)
        goto fail;
    for (int i = 0; i < c->ntasks; i++) {
        const struct ctask *t = &c->tasks[i];
        Ps__V1__TaskInfo *ti = malloc(sizeof *ti);
        if (ti == NULL)
            goto fail;
        ps__v1__task_info__init(ti);
        s->tasks[s->n_tasks++] = ti;
        ti->address = strdup(t->address);
        if (ti->address == NULL)
            goto fail;
        ti->role = (Ps__V1__Role)role_to_pb(t->role);
        ti->index = (uint32_t)t->index;
        ti->alive = t->state == CT_ALIVE;
        ti->incarnation = t->incarnation;
        ti->step = t->step;
        ti->examples_per_second = t->examples_per_second;
        ti->loss = t->loss;
        ti->last_heartbeat_age_seconds = age_s(t, now);
    }
    if (c->nckpts > 0)
        s->last_checkpoint_step = c->ckpts[c->nckpts - 1].step;
    if (c->has_eval) {
        s->eval_accuracy = c->eval_accuracy;
        s->eval_loss = c->eval_loss;
        s->eval_step = c->eval_step;
    }
    s->epoch = c->epoch;
    if (c->placed &&
        placement_pb(&c->placement, &s->placement, &s->n_placement) != 0)
        goto fail;
    s->num_ps = coord_num_ps_locked(c);
    s->num_workers = num_workers_locked(c);
    s->live_workers = live_workers_locked(c);
    s->global_step = c->global_step;
    return s;
fail:
    coord_snapshot_free(s);
    return NULL;
}

Ps__V1__ClusterState *coord_snapshot(coord *c)
{
    pthread_mutex_lock(&c->mu);
    Ps__V1__ClusterState *s = snapshot_locked(c);
    pthread_mutex_unlock(&c->mu);
    return s;
}

void coord_snapshot_free(Ps__V1__ClusterState *s)
{
    if (s != NULL)
        protobuf_c_message_free_unpacked(&s->base, NULL);
}

/* ---- RegisterTask ------------------------------------------------------ */

static bool slot_free(const struct ctask *t)
{
    return t == NULL || t->state == CT_NEVER_SEEN || t->state == CT_DEAD;
}

/* "chief 1, worker 2, ps 2, evaluator 0" */
static const char *spec_counts(const ps_cluster *s, char *buf, size_t len)
{
    snprintf(buf, len, "chief %d, worker %d, ps %d, evaluator %d",
             s->n[PS_ROLE_CHIEF], s->n[PS_ROLE_WORKER], s->n[PS_ROLE_PS],
             s->n[PS_ROLE_EVALUATOR]);
    return buf;
}

/* Static spec: which task of the spec a registration claims. Returns 0 with
 * *role, *index and *addr (the address to record) set, or the refusal. */
static int pick_static_locked(coord *c, const Ps__V1__RegisterRequest *req,
                              bool any_role, enum ps_role *role, int *index,
                              const char **addr, const char *what,
                              struct coord_status *st)
{
    const ps_cluster *s = c->spec;
    char counts[96];
    if (any_role) {
        for (int r = 0; r < PS_ROLE_COUNT && (*addr)[0] != '\0'; r++) {
            for (int i = 0; i < s->n[r]; i++) {
                if (strcmp(s->addrs[r][i], *addr) == 0) {
                    *role = (enum ps_role)r;
                    *index = i;
                    return 0;
                }
            }
        }
        if (s->n[PS_ROLE_WORKER] == 0)
            return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                          "no role given, no task of the cluster spec is at "
                          "'%s', and it has no worker tasks (%s)",
                          *addr, spec_counts(s, counts, sizeof counts));
        *role = PS_ROLE_WORKER;
    }
    const char *rn = ps_role_name(*role);
    int n = s->n[*role];
    if (n == 0)
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "%s[%d]: the cluster spec has no %s tasks (%s)", rn,
                      req->index, rn, spec_counts(s, counts, sizeof counts));
    if (req->index >= n)
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "%s[%d]: out of range, the cluster spec has %d %s "
                      "task%s (%s[0] to %s[%d])", rn, req->index, n, rn,
                      n == 1 ? "" : "s", rn, rn, n - 1);
    *index = req->index;
    if (*index < 0 && (*addr)[0] != '\0')
        for (int i = 0; i < n && *index < 0; i++)
            if (strcmp(s->addrs[*role][i], *addr) == 0)
                *index = i;
    for (int i = 0; i < n && *index < 0; i++)
        if (slot_free(coord_find_locked(c, *role, i)))
            *index = i;
    if (*index < 0)
        return refuse(st, PS_RPC_ALREADY_EXISTS, what,
                      "%s: all %d %s tasks of the cluster spec are held by "
                      "live tasks", rn, n, rn);
    /* The coordinator calls ps shards at their address, so a ps must be
     * where the spec says. Other tasks may serve nowhere; one that gives
     * no address is shown at the spec's. */
    const char *want = s->addrs[*role][*index];
    if (*role == PS_ROLE_PS && (*addr)[0] != '\0' && strcmp(*addr, want) != 0)
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "ps[%d]: registered with address '%s', the cluster "
                      "spec says '%s'", *index, *addr, want);
    if ((*addr)[0] == '\0')
        *addr = want;
    return 0;
}

/* Dynamic membership: the lowest free index of the role, the slot of the
 * same address, or the index asked for. */
static int pick_dynamic_locked(coord *c, const Ps__V1__RegisterRequest *req,
                               bool any_role, enum ps_role *role, int *index,
                               const char *addr, const char *what,
                               struct coord_status *st)
{
    if (any_role) {
        *role = PS_ROLE_WORKER;
        for (int i = 0; i < c->ntasks && addr[0] != '\0'; i++) {
            if (strcmp(c->tasks[i].address, addr) == 0) {
                *role = c->tasks[i].role;
                break;
            }
        }
    }
    const char *rn = ps_role_name(*role);
    if (req->index > 65535)
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "%s[%d]: a task index is at most 65535", rn,
                      req->index);
    int limit = 65536;
    if (*role == PS_ROLE_PS && c->placed)
        limit = (int)c->placement.num_ps;
    if (*role == PS_ROLE_PS && addr[0] == '\0')
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "ps[%d]: a ps task must give the address it serves on "
                      "(host:port)", req->index);
    if (req->index >= limit)
        return refuse(st, PS_RPC_FAILED_PRECONDITION, what,
                      "ps[%d]: the job has %d ps shards; a shard count that "
                      "changes under a running job is refused", req->index,
                      limit);
    *index = req->index;
    for (int i = 0; i < c->ntasks && *index < 0 && addr[0] != '\0'; i++)
        if (c->tasks[i].role == *role &&
            strcmp(c->tasks[i].address, addr) == 0 &&
            c->tasks[i].index < limit)
            *index = c->tasks[i].index;
    for (int i = 0; i < limit && *index < 0; i++)
        if (slot_free(coord_find_locked(c, *role, i)))
            *index = i;
    if (*index < 0)
        return refuse(st, PS_RPC_FAILED_PRECONDITION, what,
                      "ps: the job has %d ps shards, all held by live tasks; "
                      "a shard count that changes under a running job is "
                      "refused", limit);
    return 0;
}

int coord_register(coord *c, const Ps__V1__RegisterRequest *req,
                   const char *peer, Ps__V1__RegisterResponse *resp,
                   struct coord_ps_call *restore, bool *want_restore,
                   struct coord_status *st)
{
    *want_restore = false;
    memset(st, 0, sizeof *st);
    char what[200];
    const char *addr = req->address != NULL ? req->address : "";
    const char *given = addr; /* addr may become the spec's */
    const char *job = req->job_id != NULL ? req->job_id : "";
    snprintf(what, sizeof what, "RegisterTask of %s[%d] at %s from %s",
             coord_role_name_pb(req->role) != NULL
                 ? coord_role_name_pb(req->role) : "?",
             req->index, addr_or_none(addr), peer != NULL ? peer : "?");
    if (strcmp(job, c->job_id) != 0)
        return refuse(st, PS_RPC_FAILED_PRECONDITION, what,
                      "job '%s': this coordinator runs job '%s'", job,
                      c->job_id);
    if (strlen(addr) > 255)
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "an address of %zu bytes; at most 255", strlen(addr));
    enum ps_role role = PS_ROLE_WORKER;
    bool any_role = req->role == PS__V1__ROLE__ROLE_UNSPECIFIED;
    if (!any_role && role_from_pb(req->role, &role) != 0)
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "role %d is not CHIEF, WORKER, PS, EVALUATOR or "
                      "ROLE_UNSPECIFIED", (int)req->role);
    if (req->index < -1)
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "index %d: give a task index >= 0, or -1 to let the "
                      "coordinator choose", req->index);

    pthread_mutex_lock(&c->mu);
    int index = -1, rc;
    if (c->spec != NULL)
        rc = pick_static_locked(c, req, any_role, &role, &index, &addr, what,
                                st);
    else
        rc = pick_dynamic_locked(c, req, any_role, &role, &index, addr, what,
                                 st);
    if (rc != 0)
        goto out;
    const char *rn = ps_role_name(role);
    int64_t now = ps_now_ms();
    struct ctask *t = coord_find_locked(c, role, index);
    bool restart = false;
    if (t != NULL && (t->state == CT_ALIVE || t->state == CT_UNKNOWN)) {
        /* Only an address the task gave proves it is the holder. */
        restart = given[0] != '\0' && strcmp(given, t->address) == 0;
        if (!restart && t->state == CT_ALIVE) {
            rc = refuse(st, PS_RPC_ALREADY_EXISTS, what,
                        "%s[%d] is held by a live task at %s, heard %.1f s "
                        "ago", rn, index, addr_or_none(t->address),
                        age_s(t, now));
            goto out;
        }
        if (!restart) {
            rc = refuse(st, PS_RPC_ALREADY_EXISTS, what,
                        "%s[%d] is held by a task at %s that has not been "
                        "heard from since the coordinator restarted; it is "
                        "free if it stays silent for %.1f s more", rn, index,
                        addr_or_none(t->address),
                        (double)(t->grace_until_ms - now) / 1000.0);
            goto out;
        }
    }
    if (t == NULL && (t = coord_add_locked(c, role, index)) == NULL) {
        rc = refuse(st, PS_RPC_RESOURCE_EXHAUSTED, what, "out of memory");
        goto out;
    }
    if (set_address(t, addr) != 0) {
        rc = refuse(st, PS_RPC_RESOURCE_EXHAUSTED, what, "out of memory");
        goto out;
    }
    enum ctask_state was = t->state;
    t->incarnation++;
    t->state = CT_ALIVE;
    t->heard_ms = now;
    t->restoring = false;
    t->sync_told = 0;
    t->examples_per_second = 0;
    t->loss = 0;
    coord_bump_locked(c);
    recompute_sync_locked(c);
    ps_log_info("registered %s[%d] at %s, incarnation %" PRIu64 " (%s%s)", rn,
                index, addr_or_none(addr), t->incarnation,
                restart ? "a restart: same address as the holder; "
                        : was == CT_DEAD ? "was dead; " : "",
                peer != NULL ? peer : "?");

    if (role == PS_ROLE_PS && req->empty) {
        const struct ckpt_rec *last =
            c->nckpts > 0 ? &c->ckpts[c->nckpts - 1] : NULL;
        if (last == NULL) {
            ps_log_info("ps[%d] registered empty; there is no job checkpoint "
                        "to restore it from", index);
        } else if (index >= last->nshards) {
            ps_log_warn("ps[%d] registered empty, but job checkpoint %" PRIu64
                        " has %d shards; nothing to restore it from", index,
                        last->step, last->nshards);
        } else {
            t->restoring = true;
            *want_restore = true;
            memset(restore, 0, sizeof *restore);
            restore->index = (uint32_t)index;
            restore->incarnation = t->incarnation;
            restore->step = last->step;
            snprintf(restore->address, sizeof restore->address, "%s", addr);
            ps_log_info("ps[%d] at %s registered empty: restoring it from "
                        "job checkpoint %" PRIu64 " (%s)", index, addr,
                        last->step, last->path);
        }
    }
    coord_state_save_locked(c);

    resp->role = (Ps__V1__Role)role_to_pb(role);
    resp->index = (uint32_t)index;
    resp->incarnation = t->incarnation;
    resp->heartbeat_interval_ms = (uint32_t)c->o.heartbeat_interval_ms;
    /* NULL when out of memory: registered all the same; the task fetches
     * the cluster later. */
    resp->cluster = snapshot_locked(c);
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- Heartbeat, ReportMetrics ------------------------------------------ */

int coord_check_job(coord *c, const char *job_id, const char *what,
                    struct coord_status *st)
{
    memset(st, 0, sizeof *st);
    if (job_id == NULL || job_id[0] == '\0' || strcmp(job_id, c->job_id) == 0)
        return 0;
    return refuse(st, PS_RPC_FAILED_PRECONDITION, what,
                  "job '%s': this coordinator runs job '%s'", job_id,
                  c->job_id);
}

int coord_heartbeat(coord *c, const Ps__V1__HeartbeatRequest *req,
                    int *directive, uint64_t *epoch, struct coord_status *st)
{
    *directive = PS__V1__DIRECTIVE__KIND__NONE;
    enum ps_role role;
    char what[96];
    snprintf(what, sizeof what, "Heartbeat of %s[%u]",
             coord_role_name_pb(req->role) != NULL
                 ? coord_role_name_pb(req->role) : "?", req->index);
    int rc = coord_check_job(c, req->job_id, what, st);
    if (rc != 0)
        return rc;
    if (role_from_pb(req->role, &role) != 0)
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "role %d is not CHIEF, WORKER, PS or EVALUATOR",
                      (int)req->role);
    if (!isfinite(req->examples_per_second) || !isfinite(req->loss))
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "examples_per_second and loss must be finite");
    pthread_mutex_lock(&c->mu);
    struct ctask *t = coord_find_locked(c, role, (int)req->index);
    int64_t now = ps_now_ms();
    if (t == NULL || t->incarnation == 0 ||
        t->incarnation != req->incarnation) {
        ps_log_info("%s: incarnation %" PRIu64 " is not the registered one "
                    "(%" PRIu64 "): told to register again", what,
                    req->incarnation, t != NULL ? t->incarnation : 0);
        *directive = PS__V1__DIRECTIVE__KIND__REREGISTER;
        *epoch = c->epoch;
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    if (t->state != CT_ALIVE) {
        if (t->state == CT_DEAD)
            ps_log_info("%s[%u] at %s is alive again after %.1f s of "
                        "silence", ps_role_name(role), req->index,
                        addr_or_none(t->address), age_s(t, now));
        else
            ps_log_info("%s[%u] at %s heard from again after the "
                        "coordinator's restart", ps_role_name(role),
                        req->index, addr_or_none(t->address));
        t->state = CT_ALIVE;
        coord_bump_locked(c);
    }
    t->heard_ms = now;
    if (t->step != req->step || t->examples_per_second !=
                                    req->examples_per_second)
        c->progress++;
    t->step = req->step;
    t->examples_per_second = req->examples_per_second;
    t->loss = req->loss;
    if ((role == PS_ROLE_WORKER || role == PS_ROLE_CHIEF) &&
        req->step > c->global_step)
        c->global_step = req->step;
    recompute_sync_locked(c);
    *epoch = c->epoch;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

int coord_report_metrics(coord *c, const Ps__V1__ReportMetricsRequest *req,
                         struct coord_status *st)
{
    enum ps_role role;
    char what[96];
    snprintf(what, sizeof what, "ReportMetrics of %s[%u]",
             coord_role_name_pb(req->role) != NULL
                 ? coord_role_name_pb(req->role) : "?", req->index);
    int rc = coord_check_job(c, req->job_id, what, st);
    if (rc != 0)
        return rc;
    if (role_from_pb(req->role, &role) != 0)
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "role %d is not CHIEF, WORKER, PS or EVALUATOR",
                      (int)req->role);
    if (!isfinite(req->loss) || !isfinite(req->accuracy))
        return refuse(st, PS_RPC_INVALID_ARGUMENT, what,
                      "loss and accuracy must be finite");
    pthread_mutex_lock(&c->mu);
    struct ctask *t = coord_find_locked(c, role, (int)req->index);
    if (t != NULL)
        t->loss = req->loss;
    if (role == PS_ROLE_EVALUATOR) {
        c->has_eval = true;
        c->eval_accuracy = req->accuracy;
        c->eval_loss = req->loss;
        c->eval_step = req->step;
        c->eval_unix = coord_unix_now();
        ps_log_info("evaluation at step %" PRIu64 ": accuracy %.4f, loss %.4f "
                    "(evaluator[%u])", req->step, req->accuracy, req->loss,
                    req->index);
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
            return refuse(st, PS_RPC_FAILED_PRECONDITION, "Place",
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
        return refuse(st, PS_RPC_UNAVAILABLE, "Place",
                      "no ps task has registered yet");
    for (int i = 0; i <= top; i++)
        if (coord_find_locked(c, PS_ROLE_PS, i) == NULL)
            return refuse(st, PS_RPC_UNAVAILABLE, "Place",
                          "ps[%d] has not registered yet (ps[%d] has); the "
                          "shards must be ps[0] to ps[%d]", i, top, top);
    *num_ps = (uint32_t)n;
    return 0;
}

int coord_place(coord *c, const Ps__V1__PlaceRequest *req,
                Ps__V1__PlaceResponse *resp, struct coord_status *st)
{
    int rc = coord_check_job(c, req->job_id, "Place", st);
    if (rc != 0)
        return rc;
    size_t n = req->n_variables;
    struct ps_place_var *vars = calloc(n > 0 ? n : 1, sizeof *vars);
    if (vars == NULL)
        return refuse(st, PS_RPC_RESOURCE_EXHAUSTED, "Place",
                      "out of memory");
    char why[400];
    for (size_t i = 0; i < n; i++) {
        const Ps__V1__VariablePlacement *v = req->variables[i];
        vars[i].name = v->name;
        if (v->n_shape > PS_PLACE_MAX_DIMS) {
            rc = refuse(st, PS_RPC_INVALID_ARGUMENT, "Place",
                        "variable '%s': %zu dimensions, at most %d", v->name,
                        v->n_shape, PS_PLACE_MAX_DIMS);
            goto out;
        }
        vars[i].ndims = (int)v->n_shape;
        memcpy(vars[i].shape, v->shape, sizeof *v->shape * v->n_shape);
    }
    if (ps_place_check(vars, (int)n, why, sizeof why) != 0) {
        rc = refuse(st, PS_RPC_INVALID_ARGUMENT, "Place", "%s", why);
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    if (c->placed) {
        if (ps_place_same(&c->placement, vars, (int)n, why, sizeof why)
            != 0)
            rc = refuse(st, PS_RPC_FAILED_PRECONDITION, "Place",
                        "this job's model is placed already and the proposal "
                        "differs: %s", why);
    } else {
        uint32_t num_ps = 0;
        rc = place_shards_locked(c, &num_ps, st);
        if (rc == 0 &&
            ps_place_compute(vars, (int)n, num_ps, c->o.split_threshold,
                                &c->placement) != 0)
            rc = refuse(st, PS_RPC_RESOURCE_EXHAUSTED, "Place",
                        "out of memory");
        if (rc == 0) {
            int split = 0;
            for (int i = 0; i < c->placement.nvars; i++)
                split += c->placement.vars[i].nparts > 1;
            c->placed = true;
            coord_bump_locked(c);
            ps_log_info("placed %d variables over %u ps shards (%d split "
                        "over all shards)", c->placement.nvars, num_ps,
                        split);
            coord_state_save_locked(c);
        }
    }
    if (rc == 0 && placement_pb(&c->placement, &resp->placement,
                                &resp->n_placement) != 0) {
        placement_pb_free(resp->placement, resp->n_placement);
        resp->placement = NULL;
        resp->n_placement = 0;
        rc = refuse(st, PS_RPC_RESOURCE_EXHAUSTED, "Place", "out of memory");
    }
    pthread_mutex_unlock(&c->mu);
out:
    free(vars);
    return rc;
}

void coord_place_free(Ps__V1__PlaceResponse *resp)
{
    placement_pb_free(resp->placement, resp->n_placement);
    resp->placement = NULL;
    resp->n_placement = 0;
}

/* ---- waiting, stopping ------------------------------------------------- */

void coord_versions(coord *c, uint64_t *epoch, uint64_t *progress)
{
    pthread_mutex_lock(&c->mu);
    *epoch = c->epoch;
    *progress = c->progress;
    pthread_mutex_unlock(&c->mu);
}

uint64_t coord_wait(coord *c, uint64_t seen, int timeout_ms)
{
    struct timespec until = ps_time_after_ms(CLOCK_MONOTONIC, timeout_ms);
    pthread_mutex_lock(&c->mu);
    uint64_t kicks = c->kicks;
    while (!c->stopping && c->epoch == seen && c->kicks == kicks)
        if (pthread_cond_timedwait(&c->cond, &c->mu, &until) == ETIMEDOUT)
            break;
    uint64_t e = c->epoch;
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
            changed = true;
            ps_log_warn("%s[%d] at %s is dead: no heartbeat for %.1f s", rn,
                        t->index, addr_or_none(t->address), age_s(t, now));
        } else if (t->state == CT_UNKNOWN && now > t->grace_until_ms) {
            t->state = CT_DEAD;
            /* Not heard since the restart at least: ages count from it. */
            t->heard_ms = c->start_ms;
            changed = true;
            ps_log_warn("%s[%d] at %s is dead: not heard from since the "
                        "coordinator restarted %.1f s ago", rn, t->index,
                        addr_or_none(t->address),
                        (double)(now - c->start_ms) / 1000.0);
        } else if (t->state == CT_NEVER_SEEN && c->spec != NULL &&
                   !t->warned && now - c->start_ms > c->o.register_warn_ms) {
            t->warned = true;
            recount = true;
            ps_log_warn("%s[%d] at %s has not registered after %.0f s", rn,
                        t->index, addr_or_none(t->address),
                        (double)c->o.register_warn_ms / 1000.0);
        }
    }
    if (changed)
        coord_bump_locked(c);
    if (changed || recount)
        recompute_sync_locked(c);
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

int coord_save(coord *c)
{
    pthread_mutex_lock(&c->mu);
    int rc = coord_state_save_locked(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int coord_write_summary(coord *c)
{
    pthread_mutex_lock(&c->mu);
    int rc = coord_summary_write_locked(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}
