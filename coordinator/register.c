/*
 * register.c - RegisterTask: which slot a registration claims (from the
 * cluster spec, or the lowest free index of its role), whether its holder
 * lets it go, and what follows (a new incarnation, a restore for an empty
 * ps). See coord.h for the rules.
 */
#include "coordinator/coord_internal.h"
#include "common/clock.h"

#include "common/errors.h"
#include "common/log.h"
#include "common/rpc.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The slot a registration claims, and what it is known by while being
 * checked. */
struct claim {
    const struct coord_register_req *req;
    const char *what;   /* "RegisterTask of ps[1] at h:2222 from ..." */
    bool any_role;      /* the coordinator picks the role */
    enum ps_role role;
    int index;          /* -1 until picked */
    const char *addr;   /* the address to record (may become the spec's) */
    const char *given;  /* the address the task gave */
};

static bool slot_free(const struct ctask *t)
{
    return t == NULL || t->state == CT_NEVER_SEEN || t->state == CT_DEAD;
}

/* The lowest index below n whose slot of the role is free, or -1. */
static int lowest_free_locked(coord *c, enum ps_role role, int n)
{
    for (int i = 0; i < n; i++)
        if (slot_free(coord_find_locked(c, role, i)))
            return i;
    return -1;
}

/* "chief 1, worker 2, ps 2, evaluator 0" */
static const char *spec_counts(const ps_cluster *s, char *buf, size_t len)
{
    snprintf(buf, len, "chief %d, worker %d, ps %d, evaluator %d",
             s->n[PS_ROLE_CHIEF], s->n[PS_ROLE_WORKER], s->n[PS_ROLE_PS],
             s->n[PS_ROLE_EVALUATOR]);
    return buf;
}

/* The checks that need no state: the job, the address, the role, the
 * index. */
static int check_request(coord *c, struct claim *k, struct coord_status *st)
{
    const struct coord_register_req *req = k->req;
    const char *job = req->job_id != NULL ? req->job_id : "";
    if (strcmp(job, c->job_id) != 0)
        return coord_refuse(st, PS_RPC_FAILED_PRECONDITION, k->what,
                            "job '%s': this coordinator runs job '%s'", job,
                            c->job_id);
    if (strlen(k->addr) >= COORD_ADDR_MAX)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, k->what,
                            "an address of %zu bytes; at most %d",
                            strlen(k->addr), COORD_ADDR_MAX - 1);
    const char *local = req->local_address != NULL ? req->local_address : "";
    const char *host = req->host_id != NULL ? req->host_id : "";
    if (strlen(local) >= COORD_LOCAL_MAX ||
        (local[0] != '\0' && strncmp(local, "unix:/", 6) != 0))
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, k->what,
                            "local_address: give \"unix:/ABSOLUTE/PATH\" of at "
                            "most %d bytes, or nothing", COORD_LOCAL_MAX - 1);
    if (strlen(host) >= COORD_LOCAL_MAX)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, k->what,
                            "a host_id of %zu bytes; at most %d", strlen(host),
                            COORD_LOCAL_MAX - 1);
    k->role = PS_ROLE_WORKER;
    k->any_role = req->role == COORD_ROLE_ANY;
    if (!k->any_role) {
        if (req->role < 0 || req->role >= PS_ROLE_COUNT)
            return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, k->what,
                                "role %d is not CHIEF, WORKER, PS, EVALUATOR "
                                "or ROLE_UNSPECIFIED", req->role_sent);
        k->role = (enum ps_role)req->role;
    }
    if (req->index < -1)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, k->what,
                            "index %d: give a task index >= 0, or -1 to let "
                            "the coordinator choose", req->index);
    return 0;
}

/* Static spec, no role given: the spec's task at the address given (*found
 * then), else a worker. */
static int pick_static_role(const ps_cluster *s, struct claim *k, bool *found,
                            struct coord_status *st)
{
    char counts[96];
    *found = false;
    for (int r = 0; r < PS_ROLE_COUNT && k->addr[0] != '\0'; r++) {
        for (int i = 0; i < s->n[r]; i++) {
            if (strcmp(s->addrs[r][i], k->addr) == 0) {
                k->role = (enum ps_role)r;
                k->index = i;
                *found = true;
                return 0;
            }
        }
    }
    if (s->n[PS_ROLE_WORKER] == 0)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, k->what,
                            "no role given, no task of the cluster spec is "
                            "at '%s', and it has no worker tasks (%s)",
                            k->addr, spec_counts(s, counts, sizeof counts));
    k->role = PS_ROLE_WORKER;
    return 0;
}

static int pick_dynamic_locked(coord *c, struct claim *k,
                               struct coord_status *st);

/* Static spec: which task of the spec a registration claims. Returns 0 with
 * k->role, k->index and k->addr (the address to record) set, or the
 * refusal. */
static int pick_static_locked(coord *c, struct claim *k,
                              struct coord_status *st)
{
    const ps_cluster *s = c->spec;
    char counts[96];
    bool found = false;
    if (k->any_role) {
        int rc = pick_static_role(s, k, &found, st);
        if (rc != 0 || found)
            return rc;
    }
    const char *rn = ps_role_name(k->role);
    int n = s->n[k->role], want_index = k->req->index;
    /* TensorFlow keeps the evaluator out of the training cluster (TFJob's
     * TF_CONFIG lists none): a spec without evaluators takes them as
     * dynamic membership does. */
    if (n == 0 && k->role == PS_ROLE_EVALUATOR)
        return pick_dynamic_locked(c, k, st);
    if (n == 0)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, k->what,
                            "%s[%d]: the cluster spec has no %s tasks (%s)",
                            rn, want_index, rn,
                            spec_counts(s, counts, sizeof counts));
    if (want_index >= n)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, k->what,
                            "%s[%d]: out of range, the cluster spec has %d "
                            "%s task%s (%s[0] to %s[%d])", rn, want_index, n,
                            rn, n == 1 ? "" : "s", rn, rn, n - 1);
    k->index = want_index;
    if (k->index < 0 && k->addr[0] != '\0')
        for (int i = 0; i < n && k->index < 0; i++)
            if (strcmp(s->addrs[k->role][i], k->addr) == 0)
                k->index = i;
    if (k->index < 0)
        k->index = lowest_free_locked(c, k->role, n);
    if (k->index < 0)
        return coord_refuse(st, PS_RPC_ALREADY_EXISTS, k->what,
                            "%s: all %d %s tasks of the cluster spec are "
                            "held by live tasks", rn, n, rn);
    /* The coordinator calls ps shards at their address, so a ps must be
     * where the spec says. Other tasks may serve nowhere; one that gives
     * no address is shown at the spec's. */
    const char *want = s->addrs[k->role][k->index];
    if (k->role == PS_ROLE_PS && k->addr[0] != '\0' &&
        strcmp(k->addr, want) != 0)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, k->what,
                            "ps[%d]: registered with address '%s', the "
                            "cluster spec says '%s'", k->index, k->addr,
                            want);
    if (k->addr[0] == '\0')
        k->addr = want;
    return 0;
}

/* Dynamic membership: the lowest free index of the role, the slot of the
 * same address, or the index asked for. */
static int pick_dynamic_locked(coord *c, struct claim *k,
                               struct coord_status *st)
{
    const char *addr = k->addr;
    int want_index = k->req->index;
    if (k->any_role) {
        k->role = PS_ROLE_WORKER;
        for (int i = 0; i < c->ntasks && addr[0] != '\0'; i++) {
            if (strcmp(c->tasks[i].address, addr) == 0) {
                k->role = c->tasks[i].role;
                break;
            }
        }
    }
    const char *rn = ps_role_name(k->role);
    if (want_index > 65535)
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, k->what,
                            "%s[%d]: a task index is at most 65535", rn,
                            want_index);
    int limit = 65536;
    if (k->role == PS_ROLE_PS && c->placed)
        limit = (int)c->placement.num_ps;
    if (k->role == PS_ROLE_PS && addr[0] == '\0')
        return coord_refuse(st, PS_RPC_INVALID_ARGUMENT, k->what,
                            "ps[%d]: a ps task must give the address it "
                            "serves on (host:port)", want_index);
    if (want_index >= limit)
        return coord_refuse(st, PS_RPC_FAILED_PRECONDITION, k->what,
                            "ps[%d]: the job has %d ps shards; a shard count "
                            "that changes under a running job is refused",
                            want_index, limit);
    k->index = want_index;
    for (int i = 0; i < c->ntasks && k->index < 0 && addr[0] != '\0'; i++)
        if (c->tasks[i].role == k->role &&
            strcmp(c->tasks[i].address, addr) == 0 &&
            c->tasks[i].index < limit)
            k->index = c->tasks[i].index;
    if (k->index < 0)
        k->index = lowest_free_locked(c, k->role, limit);
    if (k->index < 0)
        return coord_refuse(st, PS_RPC_FAILED_PRECONDITION, k->what,
                            "ps: the job has %d ps shards, all held by live "
                            "tasks; a shard count that changes under a "
                            "running job is refused", limit);
    return 0;
}

/* Whether the slot's holder lets it go: a slot held by a live (or not yet
 * heard from) task goes only to that task registering again, which only
 * the task secret it was given proves (an address is public: GetCluster
 * shows them all), or, for a ps, to a new process at the holder's address
 * once the edge has found the holder's process gone there (coord.h,
 * probe_incarnation; sets *replaced). A registration that gives a secret,
 * or the holder's address, claims to be the holder, and a wrong or missing
 * secret is PERMISSION_DENIED; one from elsewhere without one is an
 * ordinary competing claim (ALREADY_EXISTS). Sets *restart. */
static int check_holder_locked(const struct claim *k, const struct ctask *t,
                               int64_t now, bool *restart, bool *replaced,
                               struct coord_register_resp *resp,
                               struct coord_status *st)
{
    *restart = *replaced = false;
    if (t == NULL || (t->state != CT_ALIVE && t->state != CT_UNKNOWN))
        return 0;
    const char *secret = k->req->secret != NULL ? k->req->secret : "";
    *restart = coord_secret_ok(t, secret);
    if (*restart)
        return 0;
    bool same_addr = k->given[0] != '\0' && strcmp(k->given, t->address) == 0;
    if (k->role == PS_ROLE_PS && same_addr && secret[0] == '\0' &&
        t->registered_ms >= 0) {
        *replaced = k->req->holder_gone == t->incarnation;
        if (*replaced)
            return 0;
        resp->probe_incarnation = t->incarnation;
        resp->probe_age_ms = now - t->registered_ms;
    }
    const char *rn = ps_role_name(k->role);
    char held[160];
    if (t->state == CT_ALIVE)
        snprintf(held, sizeof held, "held by a live task at %s, heard %.1f s "
                 "ago", coord_addr_or_none(t->address), coord_age_s(t, now));
    else
        snprintf(held, sizeof held, "held by a task at %s that has not been "
                 "heard from since the coordinator restarted; it is free if "
                 "it stays silent for %.1f s more",
                 coord_addr_or_none(t->address),
                 (double)(t->grace_until_ms - now) / 1000.0);
    bool claims_holder = secret[0] != '\0' || same_addr;
    if (!claims_holder)
        return coord_refuse(st, PS_RPC_ALREADY_EXISTS, k->what,
                            "%s[%d] is %s", rn, k->index, held);
    return coord_refuse(st, PS_RPC_PERMISSION_DENIED, k->what,
                        "%s[%d] is %s; registering it again needs the "
                        "task_secret its registration was given, and %s "
                        "(a restarted task gets the slot once the holder "
                        "has missed heartbeats for the timeout)", rn,
                        k->index, held,
                        secret[0] == '\0' ? "none was sent"
                                           : "the one sent is not it");
}

/* The slot becomes the registering task's: a new incarnation, alive now,
 * its progress and sync count forgotten. */
static void take_slot_locked(coord *c, struct ctask *t, int64_t now)
{
    t->incarnation++;
    t->state = CT_ALIVE;
    t->heard_ms = now;
    t->registered_ms = now;
    /* A new incarnation's steps are paced from here (coord.h, Steps). */
    t->pace_step = t->step > c->global_step ? t->step : c->global_step;
    t->pace_ms = now;
    t->pace_warned = false;
    t->restoring = false;
    t->sync_told = 0;
    t->examples_per_second = 0;
    t->loss = 0;
    coord_bump_locked(c);
    coord_recompute_sync_locked(c);
}

/* A ps that registered empty is restored from the latest job checkpoint
 * that has a shard for it. */
static void plan_restore_locked(coord *c, struct ctask *t, const char *addr,
                                struct coord_ps_call *restore,
                                bool *want_restore)
{
    int index = t->index;
    const struct ckpt_rec *last =
        c->nckpts > 0 ? &c->ckpts[c->nckpts - 1] : NULL;
    if (last == NULL) {
        ps_log_info("ps[%d] registered empty; there is no job checkpoint "
                    "to restore it from", index);
        return;
    }
    if (index >= last->nshards) {
        ps_log_warn("ps[%d] registered empty, but job checkpoint %" PRIu64
                    " has %d shards; nothing to restore it from", index,
                    last->step, last->nshards);
        return;
    }
    t->restoring = true;
    *want_restore = true;
    memset(restore, 0, sizeof *restore);
    restore->index = (uint32_t)index;
    restore->incarnation = t->incarnation;
    restore->step = last->step;
    snprintf(restore->address, sizeof restore->address, "%s", addr);
    ps_log_info("ps[%d] at %s registered empty: restoring it from job "
                "checkpoint %" PRIu64 " (%s)", index, addr, last->step,
                last->path);
}

/* Claims the picked slot for the registration. Called with c->mu held. */
static int claim_locked(coord *c, struct claim *k, const char *peer,
                        struct coord_register_resp *resp,
                        struct coord_ps_call *restore, bool *want_restore,
                        struct coord_status *st)
{
    int rc = c->spec != NULL ? pick_static_locked(c, k, st)
                             : pick_dynamic_locked(c, k, st);
    if (rc != 0)
        return rc;
    int64_t now = ps_now_ms();
    struct ctask *t = coord_find_locked(c, k->role, k->index);
    bool restart, replaced;
    if ((rc = check_holder_locked(k, t, now, &restart, &replaced, resp,
                                  st)) != 0)
        return rc;
    if (t == NULL && (t = coord_add_locked(c, k->role, k->index)) == NULL)
        return coord_refuse(st, PS_RPC_RESOURCE_EXHAUSTED, k->what,
                            "out of memory");
    /* It fits: check_request measured the address given, coord_create the
     * spec's. */
    coord_set_address(t, k->addr);
    snprintf(t->local_address, sizeof t->local_address, "%s",
             k->req->local_address != NULL ? k->req->local_address : "");
    snprintf(t->host_id, sizeof t->host_id, "%s",
             k->req->host_id != NULL ? k->req->host_id : "");
    t->insecure_collective = k->req->insecure_collective;
    if (t->insecure_collective)
        ps_log_warn("%s[%d] runs its all-reduce in plaintext on %s "
                    "(--insecure-collective)", ps_role_name(k->role), k->index,
                    coord_addr_or_none(k->addr));
    enum ctask_state was = t->state;
    /* A new holder gets a new secret; the holder itself keeps its own. */
    if (!restart && (rc = coord_secret_new(t)) != 0)
        return coord_refuse(st, PS_RPC_INTERNAL, k->what,
                            "no random bits for its task secret: %s",
                            ps_strerror(rc));
    take_slot_locked(c, t, now);
    ps_log_info("registered %s[%d] at %s%s%s, incarnation %" PRIu64 " (%s%s)",
                ps_role_name(k->role), k->index, coord_addr_or_none(k->addr),
                t->local_address[0] ? " and " : "", t->local_address,
                t->incarnation,
                restart ? "the holder again, with its task secret; "
                : replaced ? "a new process at the holder's address, "
                             "started after the holder registered; "
                : was == CT_DEAD ? "was dead; " : "",
                peer != NULL ? peer : "?");
    if (k->role == PS_ROLE_PS && k->req->empty)
        plan_restore_locked(c, t, k->addr, restore, want_restore);
    coord_state_save_locked(c);

    resp->role = k->role;
    resp->index = k->index;
    resp->incarnation = t->incarnation;
    resp->heartbeat_interval_ms = (uint32_t)c->o.heartbeat_interval_ms;
    memcpy(resp->secret, t->secret, sizeof resp->secret);
    resp->cluster = coord_snapshot_locked(c);
    return 0;
}

int coord_register(coord *c, const struct coord_register_req *req,
                   const char *peer, struct coord_register_resp *resp,
                   struct coord_ps_call *restore, bool *want_restore,
                   struct coord_status *st)
{
    *want_restore = false;
    memset(st, 0, sizeof *st);
    memset(resp, 0, sizeof *resp);
    char what[200];
    struct claim k = {.req = req, .what = what, .index = -1};
    k.addr = req->address != NULL ? req->address : "";
    k.given = k.addr; /* k.addr may become the spec's */
    snprintf(what, sizeof what, "RegisterTask of %s[%d] at %s from %s",
             coord_role_label(req->role), req->index,
             coord_addr_or_none(k.addr), peer != NULL ? peer : "?");
    int rc = check_request(c, &k, st);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = claim_locked(c, &k, peer, resp, restore, want_restore, st);
    pthread_mutex_unlock(&c->mu);
    return rc;
}
