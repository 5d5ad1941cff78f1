/*
 * coord.h - the coordinator's state machine: who is in the job, who is
 * alive, where the variables live, which job checkpoints exist.
 *
 * Membership. With a cluster spec (STATIC) the tasks are the spec's; each is
 * "never seen" until it registers. Without one (DYNAMIC) a task registers
 * with its role and index -1 and is given the lowest free index of its role.
 * Each registration of a task raises its incarnation; heartbeats carry the
 * incarnation, and one the coordinator does not know (a task it forgot, or
 * an older process of a re-registered task) is answered REREGISTER. A task
 * not heard from for the heartbeat timeout is dead; a dead task's slot is
 * free for the next registration.
 *
 * Identity. Each registration that takes a free slot is given a task
 * secret: 128 random bits (COORD_SECRET_HEX hex digits) from getrandom.
 * Heartbeats and metrics reports must carry it, and a slot held by a live
 * task (or one not heard from since a coordinator restart) goes only to a
 * registration that presents it; a missing or wrong secret is
 * PERMISSION_DENIED. An address proves nothing (GetCluster publishes them
 * all). A restarted process has lost its secret: it gets its slot once the
 * holder has missed heartbeats for the timeout (ps_coord_join retries that
 * long), and with it a new secret; a restarted ps at once, once its own
 * Stats shows it started after the holder registered (probe_incarnation
 * below). The secrets are kept in state.json (mode
 * 0600) so that a restarted coordinator still knows its running tasks.
 *
 * Steps. A reported step more than COORD_STEP_AHEAD_MAX past the global step
 * is refused (INVALID_ARGUMENT) and moves nothing: the global step drives the
 * checkpoint schedule, and psd itself refuses a checkpoint step that far
 * past its variables' versions. Below that, a task's steps are paced: since
 * its registration (or the coordinator's start) a task's recorded step may
 * rise by at most COORD_STEP_SLACK plus COORD_STEP_RATE_MAX per second, over
 * the larger of its step and the global step then. A report past that is
 * taken (the task is alive) with its step held to the pace, logged once per
 * incarnation. Heartbeats sent in a burst gain nothing, and an honest worker
 * (slower than COORD_STEP_RATE_MAX) that ran on while pscoord was down
 * catches up within seconds.
 *
 * The global step is the job's: the lower median of the steps of the live
 * workers and chief, and it never goes down. One lying worker (of three or
 * more) cannot move it past the honest ones; with two, the slower one
 * decides; alone, a worker is the job, and only its pace bounds it.
 *
 * The generation rises whenever membership (registered, dead, alive again),
 * placement or the latest checkpoint changes; watchers wait on it.
 *
 * Sync worker count. The coordinator tells every live ps how many workers a
 * SYNC step waits for: the live workers, plus those not yet heard from since
 * a coordinator restart (within their grace), plus, in a static spec, those
 * that have not registered yet within the registration window (so a sync job
 * that is starting does not take its first steps with the first worker
 * alone). At least 1; nothing is sent before the job has any worker.
 *
 * Same host. A ps may give, with its address, its unix socket and its host
 * id (common/hostid.h); both are kept with the task, replaced at each
 * registration, and published (TaskInfo.local_address, host_id), so that
 * a worker on the same host reaches it there, with shared memory.
 *
 * Persistence. <state-dir>/state.json (job id, tasks with incarnations and
 * addresses, placement, checkpoints, last evaluation, restores) is rewritten
 * atomically on every membership, placement or checkpoint change and loaded
 * by coord_create; tasks loaded from it are "unknown" (not heard from since
 * the restart) for one heartbeat timeout, then dead. The job checkpoints are
 * the manifests <state-dir>/checkpoints/job-<step>.json, found by scanning
 * that folder at start (a manifest is written last, so one that exists
 * describes a complete checkpoint).
 *
 * Threads and lifetime: every function takes the coordinator's one mutex and
 * may be called from any thread; none makes a remote call (the RPCs to ps
 * shards are schedule.c's, which asks this module what to do and reports back).
 * The ps_cluster passed in the options is borrowed and must outlive the
 * coordinator. Snapshots and placements it returns are deep copies owned by
 * the caller.
 *
 * Plain C throughout: the requests and answers below are this module's own
 * structs. service.c, the gRPC edge, converts them from and to ps.v1
 * messages; nothing here includes the generated protobuf header.
 */
#ifndef COORD_COORD_H
#define COORD_COORD_H

#include "common/cluster.h"
#include "common/metrics.h"
#include "common/place.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct coord coord;

/* A task secret in hex: 128 bits. */
#define COORD_SECRET_HEX 32
/* How far past the global step a reported step may be: psd's own Checkpoint
 * bound (2^40 past its versions). No honest worker jumps that far (2^40 steps
 * are 127 days at 10^5 steps/s), yet 2^63-1 is refused. */
#define COORD_STEP_AHEAD_MAX (UINT64_C(1) << 40)
/* A task's steps are paced (see Steps above): at most this many steps a
 * second on average (10x the fastest jobs we know of), plus a burst of
 * COORD_STEP_SLACK (a worker that resumes a little ahead, or reports after
 * a pause). */
#define COORD_STEP_RATE_MAX UINT64_C(1000000)
#define COORD_STEP_SLACK UINT64_C(100000)
/* The most bytes, NUL included, of a task's local address ("unix:" and a
 * unix socket path of at most 107) and of its host id. */
#define COORD_LOCAL_MAX 128
/* A task's host:port address, with its NUL: RegisterTask refuses a longer
 * one, so each task holds its address in place, as every copy of it does. */
#define COORD_ADDR_MAX 256

struct coord_opts {
    const char *job_id;           /* required */
    const char *state_dir;        /* required; created if missing */
    const ps_cluster *cluster;    /* NULL: dynamic membership */
    int heartbeat_interval_ms;    /* told to tasks */
    int heartbeat_timeout_ms;     /* silence after which a task is dead */
    int register_warn_ms;         /* static: warn about a task not registered */
    uint64_t checkpoint_every_steps; /* 0 = off */
    int64_t checkpoint_every_ms;     /* 0 = off */
    int checkpoint_keep;          /* job manifests kept, >= 1 */
    uint64_t split_threshold;     /* bytes */
};

/* A refused request: a gRPC status code (enum ps_rpc_code) and its message,
 * which has also been logged. */
struct coord_status {
    int code;
    char msg[512];
};

/* A ps to call: the checkpoint round's shards, a sync-count update, or a
 * restore. */
struct coord_ps_call {
    uint32_t index;
    uint64_t incarnation;
    char address[COORD_ADDR_MAX];
    uint32_t workers; /* sync: the count to set */
    uint64_t step;    /* restore: the checkpoint to load */
};

/* One shard's answer to Checkpoint. */
struct coord_shard_result {
    uint32_t index;
    char address[COORD_ADDR_MAX];
    bool ok;
    char path[1024];  /* ok: the shard's checkpoint directory */
    uint64_t bytes;
    char error[600];  /* !ok: "UNAVAILABLE: ..." */
};

/* Loads <state-dir>/state.json (if any) and the manifests, and checks that
 * they belong to this job. Returns 0; PS_ECONFLICT when the state is another
 * job's or its placement is for another shard count; PS_EPARSE /
 * PS_ECORRUPT for a state file that does not parse or holds an address of
 * COORD_ADDR_MAX bytes or more; PS_EINVAL_ARG for such an address in the
 * spec; -errno when the state directory cannot be made. err holds one
 * line. */
int coord_create(const struct coord_opts *o, coord **out, char *err,
                 size_t errlen);
void coord_destroy(coord *c);

/* A role as a request names it: an enum ps_role, or one of these. */
#define COORD_ROLE_ANY (-1) /* RegisterTask: unspecified, the coordinator
                               picks */
#define COORD_ROLE_BAD (-2) /* none of the roles; role_sent names it */

struct coord_register_req {
    const char *job_id;
    int role;             /* enum ps_role, COORD_ROLE_ANY or _BAD */
    int role_sent;        /* the role's number as sent, for a refusal */
    int index;            /* -1: the coordinator picks */
    const char *address;  /* host:port it serves on; "" = none */
    /* ps: its unix socket ("unix:/path"), and its host id
     * (common/hostid.h); NULL or "": none. Published for workers. */
    const char *local_address;
    const char *host_id;
    bool insecure_collective; /* worker: --insecure-collective in use */
    bool empty;           /* a ps that holds no variables (restore it) */
    const char *secret;   /* the task secret it was given; NULL or "" */
    /* The edge's finding (see probe_incarnation below): the ps serving the
     * holder's address started after incarnation holder_gone of the slot
     * registered, so that holder's process is gone. 0: none. */
    uint64_t holder_gone;
};

/* A task as clients see it. */
struct coord_task_info {
    enum ps_role role;
    uint32_t index;
    char address[COORD_ADDR_MAX]; /* "" when it serves nothing */
    char local_address[COORD_LOCAL_MAX]; /* ps: "unix:/path" or "" */
    char host_id[COORD_LOCAL_MAX];       /* "" when not given */
    bool insecure_collective;            /* as registered */
    bool alive;
    uint64_t incarnation;
    uint64_t step;
    double examples_per_second;
    double loss;
    double accuracy;      /* evaluators: their last evaluation's; else 0 */
    double last_heartbeat_age_seconds; /* -1: never heard */
};

/* The cluster as clients see it (GetCluster, WatchCluster). */
struct coord_cluster {
    char *job_id;
    struct coord_task_info *tasks; /* by (role, index) */
    int ntasks;
    uint64_t last_checkpoint_step; /* 0: none yet */
    char *last_checkpoint_path;    /* "" when none */
    double eval_accuracy, eval_loss; /* 0 until an evaluator reports */
    uint64_t eval_step;
    uint64_t generation;
    struct ps_placement placement; /* empty until placed */
    uint32_t num_ps, num_workers, live_workers;
    uint64_t global_step;
    double last_checkpoint_age_seconds; /* -1: none, or its time unknown */
    uint32_t heartbeat_interval_ms;     /* what tasks are told */
};

struct coord_register_resp {
    enum ps_role role;
    int index;
    uint64_t incarnation;
    uint32_t heartbeat_interval_ms;
    char secret[COORD_SECRET_HEX + 1]; /* the task's secret */
    /* Set on a refusal only: a ps registered without a secret from the
     * address of the live ps holding its slot, incarnation
     * probe_incarnation, registered probe_age_ms ago. A process that
     * started since then answers at that address only if the holder's
     * process is gone (one process binds a port): the edge asks the
     * address's Stats, and if its uptime is shorter, registers again with
     * holder_gone = probe_incarnation. So a restarted psd (its secret lost)
     * takes its slot back at once, and an impostor, whose claim the live
     * psd itself answers, never does. */
    uint64_t probe_incarnation;
    int64_t probe_age_ms;
    /* NULL when out of memory (registered all the same: the task fetches
     * the cluster later); free with coord_cluster_free. */
    struct coord_cluster *cluster;
};

/* Who a heartbeat or a metrics report comes from. */
struct coord_task_ref {
    const char *job_id;
    int role;             /* enum ps_role or COORD_ROLE_BAD */
    int role_sent;        /* the role's number as sent, for a refusal */
    uint32_t index;
    const char *secret;   /* the task secret; NULL or "" when none sent */
};

struct coord_heartbeat_req {
    struct coord_task_ref from;
    uint64_t incarnation;
    uint64_t step;
    double examples_per_second;
    double loss;
};

/* What a heartbeat's answer tells the task to do. */
enum coord_directive {
    COORD_DIRECTIVE_NONE,
    COORD_DIRECTIVE_REREGISTER, /* the coordinator does not know this
                                   incarnation */
};

struct coord_metrics_req {
    struct coord_task_ref from;
    uint64_t step;
    double loss;
    double accuracy;      /* evaluator: test accuracy */
};

/* The RPCs. On refusal they return nonzero with st filled (and logged at
 * warn level). */
int coord_register(coord *c, const struct coord_register_req *req,
                   const char *peer, struct coord_register_resp *resp,
                   struct coord_ps_call *restore, bool *want_restore,
                   struct coord_status *st);
int coord_heartbeat(coord *c, const struct coord_heartbeat_req *req,
                    enum coord_directive *directive, uint64_t *generation,
                    struct coord_status *st);
int coord_report_metrics(coord *c, const struct coord_metrics_req *req,
                         struct coord_status *st);
/* Places a proposal (the first one made fixes the job's placement; later
 * ones must name the same model). The caller has checked the job id with
 * coord_check_job. from is the proposing task (role COORD_ROLE_ANY: the
 * task whose secret from->secret is) and must present its task secret, or
 * operator is true (the caller's token). A ps never proposes; the first
 * placement is the chief's (a chief task, or worker 0) or an operator's.
 * PERMISSION_DENIED otherwise, INVALID_ARGUMENT for a role that is none.
 * On success *out holds the job's placement, which the caller frees with
 * ps_placement_free. */
int coord_place(coord *c, const struct ps_place_var *vars, int n,
                const struct coord_task_ref *from, bool operator,
                struct ps_placement *out, struct coord_status *st);
/* Refuses a job id that is not "" and not this job's. */
int coord_check_job(coord *c, const char *job_id, const char *what,
                    struct coord_status *st);
/* A refusal the edge makes itself (a request it cannot convert): fills st,
 * logs "<what> refused: ..." as the core does, returns code (nonzero). */
int coord_refuse(struct coord_status *st, int code, const char *what,
                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* The cluster as clients see it; NULL when out of memory. */
struct coord_cluster *coord_snapshot(coord *c);
/* Whether worker[index] has registered and secret is its task secret (the
 * Kv store's callers). Returns 0, or PERMISSION_DENIED in st, its message
 * opening with what. */
int coord_check_worker(coord *c, uint32_t index, const char *secret,
                       const char *what, struct coord_status *st);
void coord_cluster_free(struct coord_cluster *s);

/* Epoch (membership, placement, checkpoints) and progress (steps, metrics)
 * counters, for watchers. */
void coord_versions(coord *c, uint64_t *generation, uint64_t *progress);
/* Waits until the generation differs from seen, the coordinator stops, or
 * timeout_ms passes. Returns the current generation. */
uint64_t coord_wait(coord *c, uint64_t seen, int timeout_ms);
/* Wakes every coord_wait (e.g. for a thread that is stopping). */
void coord_kick(coord *c);
void coord_stop(coord *c);
bool coord_stopping(coord *c);

/* Liveness: marks silent tasks dead, warns once about static tasks that
 * never registered. Called by the liveness thread every tick. */
void coord_tick(coord *c);

/* Sync counts: fills up to max live ps shards that have not been told the
 * current count; returns how many. coord_sync_done records an answer:
 * settled = told (or gave an answer that retrying would not change). */
int coord_sync_pending(coord *c, struct coord_ps_call *out, int max);
void coord_sync_done(coord *c, const struct coord_ps_call *call,
                     bool settled);

/* Checkpoint schedule: true when a round is due now, with its step and the
 * shards to call (all ps of the job, each alive). A due round that cannot
 * run yet (a shard dead, unknown, never seen or restoring) is logged and
 * waits for the shards. */
bool coord_checkpoint_due(coord *c, uint64_t *step, struct coord_ps_call *out,
                          int max, int *n);
/* Ends a round: all ok -> manifest, state, generation, pruning; else logged and
 * the previous checkpoint stays the latest. */
void coord_checkpoint_done(coord *c, uint64_t step,
                           const struct coord_shard_result *res, int n);

/* Restores: true while the restore of call->index should go on (the same
 * incarnation registered, not stopping). */
bool coord_restore_wanted(coord *c, const struct coord_ps_call *call);
void coord_restore_done(coord *c, const struct coord_ps_call *call, bool ok,
                        uint64_t variables, const char *detail);

/* Writes state.json now; writes summary.json (shutdown). Both log a
 * failure and return its code. */
int coord_save(coord *c);
int coord_write_summary(coord *c);

/* pscoord's /metrics page (coordinator/metrics.c): the collector that
 * common/metrics_http.h calls at each scrape, ctx being the coord. It reads
 * the core under its mutex, like the calls above. */
void coord_metrics_collect(ps_metrics *m, void *ctx);

#endif
