/*
 * metrics.h - what workerd shows on its /metrics page: the training loop's
 * step times and progress, and the latest evaluation, kept in atomics that
 * the loop and its comm threads update as they go and the page reads at
 * scrape time (common/metrics_http.h runs the collector on its own thread).
 *
 *   workerd_step_compute_seconds  forward and backward of one step (all
 *                                 replicas), histogram
 *   workerd_step_wait_seconds     what one step waited for the comm threads
 *                                 (the previous job's push and pull; in sync
 *                                 mode also this step's), histogram
 *   workerd_step_push_seconds     one Push to one psd shard (in the round
 *                                 trip that also brings the values back,
 *                                 unless a pull fetches them), histogram
 *   workerd_step_pull_seconds     one Pull from one psd shard, histogram
 *   workerd_steps_total, workerd_examples_total, workerd_step,
 *   workerd_examples_per_second, workerd_loss
 *   workerd_evaluations_total, workerd_eval_accuracy, workerd_eval_loss,
 *   workerd_eval_step            the evaluator's (and a worker's final)
 *
 * Compute and wait are per step; push and pull per call, on each shard's
 * comm thread, overlapping the next step's compute (train.h's picture).
 *
 * Threads and lifetime: wd_metrics_init once before any thread records
 * into it; then every function may be called from any thread, and each
 * takes a NULL wd_metrics as "not recording". It must outlive the
 * endpoint that collects it.
 */
#ifndef PS_WORKER_METRICS_H
#define PS_WORKER_METRICS_H

#include "common/metrics.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct wd_metrics {
    ps_histogram compute, wait, push, pull;
    atomic_uint_fast64_t steps, examples, step;
    atomic_uint_fast64_t rate_bits, loss_bits; /* doubles' bits */
    atomic_uint_fast64_t evals, eval_step;
    atomic_uint_fast64_t eval_acc_bits, eval_loss_bits;
    bool evaluator;
};

/* Sets m empty; evaluator: the page leaves out the training families. */
void wd_metrics_init(struct wd_metrics *m, bool evaluator);

/* One step's compute and its wait for the comm threads, in seconds. */
void wd_metrics_step_times(struct wd_metrics *m, double compute, double wait);
/* A finished step: the step the loop is at next, its examples and loss,
 * and the loop's examples/s (the figure it reports to the coordinator). */
void wd_metrics_step_done(struct wd_metrics *m, uint64_t step, int examples,
                          double loss, double examples_per_second);
/* One Push (push) or Pull (!push) call to a shard, in seconds. */
void wd_metrics_call(struct wd_metrics *m, bool push, double seconds);
/* An evaluation of the variables at version step. */
void wd_metrics_eval(struct wd_metrics *m, uint64_t step, double loss,
                     double accuracy);

/* The collector for ps_metrics_http_start; ctx is the wd_metrics. */
void wd_metrics_collect(ps_metrics *page, void *ctx);

#endif
