/*
 * train.h - workerd's training loop against one or more psd shards.
 *
 * A session owns the model replicas, one comm thread per psd shard, and the
 * host buffers that move between them:
 *
 *   compute (main thread + replica threads)       comm (one thread per shard)
 *   step s: forward/backward on params   --->     push g(s-1), then pull the
 *           (replicas split the batch,            freshest values into the
 *            gradients summed in-host)            pull buffer
 *   then hand g(s) over, take the pulled values, start step s+1
 *
 * so communication of one step overlaps the computation of the next, with at
 * most one step's push in flight (async). In sync mode each push waits for
 * its step to be applied by every worker, and the next step pulls that
 * update first (min_version), as MultiWorkerMirroredStrategy would.
 *
 * Variables are placed on shards by size, largest first onto the least
 * loaded shard, the same way in every worker, so all agree on placement
 * without talking to each other.
 *
 * Threads and lifetime: a session is driven by one thread (the caller's);
 * it starts and joins its own threads. Errors come back as a project error
 * code with one line in the session's error text.
 */
#ifndef PS_WORKER_TRAIN_H
#define PS_WORKER_TRAIN_H

#include "worker/data.h"
#include "worker/events.h"
#include "worker/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The coordinator's placement of the model's tensors (see proto
 * VariablePlacement); NULL in wd_train_opts = place locally by size. */
struct wd_part_place {
    char name[300];
    int shard;
    int64_t row_begin, row_end;
};
struct wd_var_place {
    char name[256];
    struct wd_part_place *parts;
    int nparts;
};
struct wd_placement {
    struct wd_var_place *vars;
    int n;
};

struct wd_metrics; /* worker/metrics.h */
struct ps_coord;   /* common/coordclient.h */

/* multi_worker_mirrored (worker/train_mwm.c): all-reduce among the workers,
 * rendezvous and generations through the coordinator. */
struct wd_mwm_opts {
    struct ps_coord *coord;    /* joined; its Kv store is the rendezvous */
    const char *host;          /* address this worker's Gloo listens on */
    int timeout_ms;            /* each collective and rendezvous */
    int rendezvous_ms;         /* the first group's budget */
    int reform_ms;             /* a later group's budget */
    int algorithm;             /* enum wd_coll_algo (worker/collective.h) */
    bool nccl;                 /* NCCL (GPU workers) instead of Gloo */
    int device;                /* NCCL's CUDA device */
    int checksum_every;        /* print the parameters' checksum every N
                                  steps; 0 never */
};

/* Reports progress (from the training thread) and evaluations. */
typedef void (*wd_progress_fn)(void *ctx, uint64_t step, double examples_per_second,
                               double loss);

struct wd_train_opts {
    const struct wd_placement *placement;
    wd_progress_fn on_progress;
    void *progress_ctx;
    const char *const *ps;     /* psd addresses */
    int nps;
    const char *model;         /* model spec */
    int nclasses;              /* classes the model predicts */
    int batch;                 /* per replica */
    int replicas;              /* local replicas (CPU threads or GPUs) */
    const char *device;        /* "cpu", "cuda:N", "tpu" or "pjrt:PATH" */
    int blas_threads;          /* OpenBLAS threads per replica */
    int epochs;                /* 0 = until max_steps */
    int64_t max_steps;         /* 0 = no limit */
    float lr;
    int optimizer;             /* ps.v1 Optimizer.Kind */
    float momentum;
    int consistency;           /* 1 async, 2 sync, 3 bounded (relaxed.h) */
    int staleness;             /* bounded: steps ahead of the slowest */
    int local_steps;           /* local SGD: steps between exchanges; 0 off */
    int step_delay_ms;         /* sleep before each step (tests) */
    int num_workers;           /* cluster size (sharding, sync count) */
    int task_index;            /* this worker's index */
    uint64_t seed;             /* shuffle */
    uint64_t init_seed;        /* variable initializers */
    int rpc_timeout_ms;        /* per call */
    int64_t retry_budget_ms;   /* how long to keep retrying an absent psd */
    int progress_ms;           /* progress line period; 0 = none */
    bool quiet;
    bool evaluator_only;       /* never create variables, only read them */
    bool concurrent_pull;      /* async: pull beside the push, not after it
                                  (faster; one more step of staleness) */
    bool self_update;          /* async SGD: apply this worker's own step to
                                  its copy while the push is in flight */
    struct wd_metrics *metrics; /* step times and progress for /metrics;
                                   NULL: none */
    int wire_dtype;            /* ps.v1.DType of dense tensors on the wire:
                                  0 float32, 2 FLOAT16, 3 BFLOAT16 (not
                                  with shared memory: float32 there) */
    bool error_feedback;       /* with a half wire_dtype (common/half.h) */
    size_t piece_bytes;        /* tensors above it go in pieces of it
                                  (ps_client_set_pieces); 0: whole */
    int sparse_row_dtype;      /* ps.v1.DType of widedeep's sparse rows:
                                  0 float32, 2 FLOAT16, 3 BFLOAT16 */
    int sparse_slot_dtype;     /* the same for their optimizer slots */
    int shm;                   /* shared memory with psd (common/shm.h):
                                  0 auto (a psd reached by unix:, the only
                                  way psd takes it), 1 on (any address),
                                  2 off */
    wd_events *events;         /* the chief's TensorBoard event file (NULL:
                                  none): loss, examples/s and learning rate
                                  every summary_steps steps, at the job's
                                  global step as this worker last saw it */
    int summary_steps;
    const char *token;         /* sent to every psd (auth.h); NULL: none */
    const struct wd_mwm_opts *mwm; /* NULL: not multi_worker_mirrored */
};

struct wd_train_result {
    int64_t steps;
    int64_t examples;
    double seconds;
    double examples_per_second;
    double final_loss;         /* mean of the last progress window */
    double compute_seconds;    /* time inside forward/backward */
    double wait_seconds;       /* time the compute waited for comm */
    uint64_t version;          /* of the first variable at the end */
    int shm_shards;            /* shards whose tensors went through shared
                                  memory to the end */
    /* wd_train_mwm: the final parameters' checksum and, given a test set,
     * their test figures */
    uint64_t checksum;
    bool evaluated;
    bool left_out;             /* the job finished while this worker was out
                                  of its group: nothing trained here counts */
    float test_loss, test_accuracy;
};

/* Trains on `train` and fills *res. Returns 0, or a project error with one
 * line in err: PS_ESHAPE (model and data or server variables disagree),
 * PS_ERPC (a psd refused or stayed unreachable past the retry budget),
 * PS_ENODEV (no usable device), PS_EINVAL_ARG, -ENOMEM. */
int wd_train(const struct wd_train_opts *o, const struct ps_dataset *train,
             struct wd_train_result *res, char *err, size_t errlen);

/* multi_worker_mirrored (o->mwm set): trains with the workers of the
 * coordinator's current generation, re-forming after failures, then
 * evaluates the final parameters on test (NULL: not). Returns 0 (also when
 * the job finished while this worker was out of it), PS_ETIMEDOUT (no group
 * within the rendezvous budget; err names the missing workers), PS_ESHAPE
 * (a member trains another model; err names the first difference),
 * PS_ENODEV, -ENOMEM. */
int wd_train_mwm(const struct wd_train_opts *o, const struct ps_dataset *train,
                 const struct ps_dataset *test, struct wd_train_result *res,
                 char *err, size_t errlen);

/* Pulls the current parameters into a fresh CPU model and evaluates it on
 * `test`. Fills loss, accuracy and the first variable's version. */
int wd_evaluate(const struct wd_train_opts *o, const struct ps_dataset *test,
                float *loss, float *accuracy, uint64_t *version, char *err,
                size_t errlen);

/* Set by a signal handler to ask the loop to stop after the current step. */
extern volatile int wd_stop_requested;

#endif
