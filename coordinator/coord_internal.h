/*
 * coord_internal.h - the coordinator's state, shared by the files that
 * implement coord.h: coord.c (the task table, heartbeats, liveness,
 * snapshots, placement requests), register.c (RegisterTask), state.c
 * (state.json, summary.json), jobckpt.c (the checkpoint schedule,
 * manifests, restores) and metrics.c (the /metrics page). Nothing else
 * includes it.
 *
 * Every field below is guarded by coord.mu; functions named *_locked expect
 * it held.
 */
#ifndef COORD_INTERNAL_H
#define COORD_INTERNAL_H

#include "coordinator/coord.h"

#include <pthread.h>

enum ctask_state {
    CT_NEVER_SEEN, /* static spec: has not registered */
    CT_UNKNOWN,    /* loaded from state.json: not heard from since restart */
    CT_ALIVE,
    CT_DEAD,
};

struct ctask {
    enum ps_role role;
    int index;
    char address[COORD_ADDR_MAX]; /* "" when it serves nothing */
    char local_address[COORD_LOCAL_MAX]; /* coord_register_req's */
    char host_id[COORD_LOCAL_MAX];
    bool insecure_collective; /* coord_register_req's */
    uint64_t incarnation;   /* 0: never registered */
    enum ctask_state state;
    int64_t heard_ms;       /* last register or heartbeat; -1 = never here */
    int64_t grace_until_ms; /* CT_UNKNOWN: dead after this */
    uint64_t step;          /* the last reported step, as paced (coord.h) */
    uint64_t pace_step;     /* the pace's start: step and time; pace_ms 0 = */
    int64_t pace_ms;        /* not yet started (coord.c: paced_step_locked) */
    bool pace_warned;       /* "reported step ... held to" logged */
    double examples_per_second;
    double loss;            /* workers: the heartbeat's; evaluators: their last
                               evaluation's (ReportMetrics), which heartbeats
                               do not overwrite */
    double accuracy;        /* evaluators: their last evaluation's */
    bool restoring;         /* ps: a restore is under way */
    uint32_t sync_told;     /* ps: the sync count it has (0 = not told) */
    bool warned;            /* static: "has not registered" logged */
    char secret[COORD_SECRET_HEX + 1]; /* hex; "" = none issued */
    int64_t registered_ms;  /* ps_now_ms() of its registration; -1 unknown */
};

struct ckpt_rec {
    uint64_t step;
    char *path;           /* the manifest */
    int64_t created_unix;
    int nshards;
};

struct restore_rec {
    uint32_t index;
    uint64_t incarnation;
    uint64_t step;
    bool ok;
    char *detail;
    int64_t unix_time;
};

#define COORD_MAX_RESTORES 20

struct coord {
    pthread_mutex_t mu;
    pthread_cond_t cond; /* broadcast on generation change and stop */

    char *job_id;
    char *state_dir;
    char *state_path;   /* <state-dir>/state.json */
    char *summary_path; /* <state-dir>/summary.json */
    char *ckpt_dir;     /* <state-dir>/checkpoints */
    const ps_cluster *spec;
    struct coord_opts o;

    struct ctask *tasks; /* sorted by (role, index) */
    int ntasks, cap;

    uint64_t generation;
    uint64_t progress;
    uint64_t kicks; /* coord_kick: wakes coord_wait without a generation */
    uint64_t global_step;
    int64_t start_ms;
    bool stopping;

    bool placed;
    struct ps_placement placement;

    struct ckpt_rec *ckpts; /* ascending by step */
    int nckpts;
    bool ck_running;
    uint64_t ck_last_step;  /* the last round's step (attempted) */
    int64_t ck_last_ms;
    char ck_skip_why[160];  /* why the due round waits, as last logged */
    int64_t ck_skip_ms;

    bool has_eval;
    double eval_accuracy, eval_loss;
    uint64_t eval_step;
    int64_t eval_unix;

    struct restore_rec restores[COORD_MAX_RESTORES]; /* oldest first */
    int nrestores;

    uint32_t sync_desired; /* 0: nothing to tell yet */

    /* Counted since this process started, for /metrics (metrics.c). */
    uint64_t missed_heartbeats[PS_ROLE_COUNT]; /* tasks found dead by tick */
    uint64_t restores_ok, restores_failed;
    uint64_t ckpt_rounds_ok, ckpt_rounds_failed;
};

/* coord.c */
/* Whether given (NULL or "" when none was sent) is t's secret, compared in
 * constant time. False when t has none. */
bool coord_secret_ok(const struct ctask *t, const char *given);
/* Fills t->secret with 128 new random bits. Returns 0 or -errno. */
int coord_secret_new(struct ctask *t);
struct ctask *coord_find_locked(coord *c, enum ps_role role, int index);
struct ctask *coord_add_locked(coord *c, enum ps_role role, int index);
/* Records a task's address. Returns 0, or PS_EINVAL_ARG (t unchanged) for
 * an address of COORD_ADDR_MAX bytes or more. */
int coord_set_address(struct ctask *t, const char *addr);
void coord_bump_locked(coord *c);
/* Recounts the workers SYNC steps wait for (see coord.h). */
void coord_recompute_sync_locked(coord *c);
uint32_t coord_num_ps_locked(coord *c);
struct coord_cluster *coord_snapshot_locked(coord *c);
const char *coord_state_name(enum ctask_state s);
/* "worker", "ps"... for an enum ps_role; "?" for anything else. */
const char *coord_role_label(int role);
/* The address, or "(no address)" for NULL or "". */
const char *coord_addr_or_none(const char *a);
/* Seconds since the task was heard from; -1 when never. */
double coord_age_s(const struct ctask *t, int64_t now);
int64_t coord_unix_now(void);

/* state.c */
int coord_state_load_locked(coord *c, char *err, size_t errlen);
int coord_state_save_locked(coord *c);
int coord_summary_write_locked(coord *c);

/* jobckpt.c */
int coord_ckpt_scan_locked(coord *c, char *err, size_t errlen);
void coord_ckpt_free_locked(coord *c);

#endif
