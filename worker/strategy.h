/*
 * strategy.h - workerd's --strategy: TensorFlow's distribution strategies
 * as settings of workerd's finer flags (doc/strategies.md, "Strategies",
 * has the table), and multi_worker_mirrored's closing line.
 *
 * Threads and lifetime: plain functions of their arguments, called from
 * workerd's main thread.
 */
#ifndef PS_WORKER_STRATEGY_H
#define PS_WORKER_STRATEGY_H

#include "worker/train.h"

#include <stdbool.h>
#include <stddef.h>

enum wd_strategy {
    WD_STRATEGY_AUTO,           /* the finer flags alone decide */
    WD_STRATEGY_ONE_DEVICE,
    WD_STRATEGY_MIRRORED,
    WD_STRATEGY_CENTRAL_STORAGE,
    WD_STRATEGY_PARAMETER_SERVER,
    WD_STRATEGY_MULTI_WORKER_MIRRORED,
};

/* The names --strategy takes, in enum order, NULL-terminated. */
extern const char *const wd_strategy_names[];

/* The flags a strategy sets or checks (workerd's, by address). */
struct wd_strategy_flags {
    bool *local;
    int *replicas;
    int *num_workers;
    int *consistency;           /* workerd's enum: 0 async, 1 sync */
    int *shm;                   /* 0 auto, 1 on, 2 off */
    const char *optimizer;      /* its name */
    const char *device;
    bool nccl_asked;            /* --allreduce-engine nccl */
    bool use_coord;
};

/* Applies strategy s to the flags. Returns 0, or PS_EINVAL_ARG with one
 * line in err naming the flag the strategy contradicts. */
int wd_strategy_settle(int s, struct wd_strategy_flags *f, char *err, size_t errlen);

/* multi_worker_mirrored's last line: one JSON object, or text. */
void wd_strategy_print_mwm(const struct wd_train_result *res, int task_index,
                           const char *model, int batch, bool json);

#endif
