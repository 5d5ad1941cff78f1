/*
 * metrics.c - workerd's /metrics page; metrics.h lists what it shows.
 */
#include "worker/metrics.h"

#include <math.h>
#include <string.h>

static uint64_t bits(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static double load_double(atomic_uint_fast64_t *a)
{
    uint64_t b = atomic_load_explicit(a, memory_order_relaxed);
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

static void store_double(atomic_uint_fast64_t *a, double v)
{
    atomic_store_explicit(a, bits(v), memory_order_relaxed);
}

static double load(atomic_uint_fast64_t *a)
{
    return (double)atomic_load_explicit(a, memory_order_relaxed);
}

void wd_metrics_init(struct wd_metrics *m, bool evaluator)
{
    memset(m, 0, sizeof *m);
    m->evaluator = evaluator;
    /* The latency bounds (100 us to 10 s) hold a step of a small MLP on a
     * CPU and a large model's push alike. */
    ps_histogram_init(&m->compute, ps_latency_bounds, PS_LATENCY_NBOUNDS);
    ps_histogram_init(&m->wait, ps_latency_bounds, PS_LATENCY_NBOUNDS);
    ps_histogram_init(&m->push, ps_latency_bounds, PS_LATENCY_NBOUNDS);
    ps_histogram_init(&m->pull, ps_latency_bounds, PS_LATENCY_NBOUNDS);
    /* NaN until there is a figure: 0 would read as a perfect loss. */
    store_double(&m->loss_bits, NAN);
    store_double(&m->eval_acc_bits, NAN);
    store_double(&m->eval_loss_bits, NAN);
}

void wd_metrics_step_times(struct wd_metrics *m, double compute, double wait)
{
    if (m == NULL)
        return;
    ps_histogram_observe(&m->compute, compute);
    ps_histogram_observe(&m->wait, wait);
}

void wd_metrics_step_done(struct wd_metrics *m, uint64_t step, int examples,
                          double loss, double examples_per_second)
{
    if (m == NULL)
        return;
    atomic_fetch_add_explicit(&m->steps, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->examples, (uint64_t)examples, memory_order_relaxed);
    atomic_store_explicit(&m->step, step, memory_order_relaxed);
    store_double(&m->loss_bits, loss);
    store_double(&m->rate_bits, examples_per_second);
}

void wd_metrics_call(struct wd_metrics *m, bool push, double seconds)
{
    if (m != NULL)
        ps_histogram_observe(push ? &m->push : &m->pull, seconds);
}

void wd_metrics_eval(struct wd_metrics *m, uint64_t step, double loss,
                     double accuracy)
{
    if (m == NULL)
        return;
    store_double(&m->eval_loss_bits, loss);
    store_double(&m->eval_acc_bits, accuracy);
    atomic_store_explicit(&m->eval_step, step, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->evals, 1, memory_order_relaxed);
}

static void histogram(ps_metrics *page, const char *name, const char *help,
                      const ps_histogram *h)
{
    ps_metrics_family(page, name, PS_METRIC_HISTOGRAM, help);
    ps_metrics_histogram(page, h, NULL);
}

static void training(ps_metrics *page, struct wd_metrics *m)
{
    histogram(page, "workerd_step_compute_seconds", "Forward and backward of one "
              "step, all local replicas.", &m->compute);
    histogram(page, "workerd_step_wait_seconds", "Time one step waited for the comm "
              "threads (the previous job's push and pull; sync: this step's too).",
              &m->wait);
    histogram(page, "workerd_step_push_seconds", "One Push to one psd shard (with "
              "the values it brings back when push and pull share a round trip).",
              &m->push);
    histogram(page, "workerd_step_pull_seconds", "One Pull from one psd shard.",
              &m->pull);
    ps_metrics_counter(page, "workerd_steps_total", "Training steps taken.",
                       load(&m->steps));
    ps_metrics_counter(page, "workerd_examples_total", "Training examples "
                       "computed.", load(&m->examples));
    ps_metrics_gauge(page, "workerd_step", "The step the next push is for (sync: "
                     "the variables' step).", load(&m->step));
    ps_metrics_gauge(page, "workerd_examples_per_second", "Examples per second over "
                     "the last progress window (as reported to the coordinator).",
                     load_double(&m->rate_bits));
    ps_metrics_gauge(page, "workerd_loss", "Training loss of the latest step (NaN: "
                     "none yet).", load_double(&m->loss_bits));
}

static void evaluation(ps_metrics *page, struct wd_metrics *m)
{
    ps_metrics_counter(page, "workerd_evaluations_total", "Evaluations on the test "
                       "set.", load(&m->evals));
    ps_metrics_gauge(page, "workerd_eval_accuracy", "Test accuracy of the latest "
                     "evaluation (NaN: none yet).", load_double(&m->eval_acc_bits));
    ps_metrics_gauge(page, "workerd_eval_loss", "Test loss of the latest evaluation "
                     "(NaN: none yet).", load_double(&m->eval_loss_bits));
    ps_metrics_gauge(page, "workerd_eval_step", "Version of the variables the latest "
                     "evaluation read.", load(&m->eval_step));
}

void wd_metrics_collect(ps_metrics *page, void *ctx)
{
    struct wd_metrics *m = ctx;
    if (!m->evaluator)
        training(page, m);
    evaluation(page, m);
}
