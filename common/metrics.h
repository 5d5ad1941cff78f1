/*
 * metrics.h - what a /metrics page is made of: the Prometheus text
 * exposition format 0.0.4, written by a daemon's collector at scrape time,
 * and a lock-free histogram that hot paths observe into.
 *
 * A page is families, each a "# HELP" and a "# TYPE" line followed by its
 * samples:
 *
 *   # HELP psd_calls_total Calls received, by method.
 *   # TYPE psd_calls_total counter
 *   psd_calls_total{method="Push"} 12
 *
 * The collector (ps_metrics_collect_fn, called by common/metrics_http.h at
 * each scrape) declares a family with ps_metrics_family and writes its
 * samples with ps_metrics_sample (labels as name/value pairs, escaped here)
 * or ps_metrics_histogram; ps_metrics_counter and ps_metrics_gauge do both
 * for a family of one unlabelled sample. Counters and gauges are read at
 * scrape time from the atomics the daemon keeps anyway: the page holds no
 * state of its own.
 *
 * Conventions the writer enforces (a breach is a bug in the collector: the
 * page records PS_EINVAL_ARG, ps_metrics_error reports it and the HTTP
 * endpoint answers 500 naming it): metric and label names match
 * [a-zA-Z_:][a-zA-Z0-9_:]* (labels without ':', and not "le" outside a
 * histogram), a counter's name ends in _total, a histogram's does not.
 * Units are base units in the name: _seconds, _bytes.
 *
 * A histogram has fixed upper bounds (increasing, finite; +Inf is implied)
 * and counts per bucket plus the sum of what was observed, all atomic:
 * ps_histogram_observe is a handful of compares and two atomic adds, safe
 * from any thread. Its page shows the buckets cumulative
 * (name_bucket{le="0.001"}), name_sum and name_count, the count being the
 * +Inf bucket's, so the two always agree.
 *
 * Threads and lifetime: a ps_metrics page belongs to the one thread that
 * writes it (the scrape), from ps_metrics_init to ps_metrics_close. A
 * ps_histogram is initialised once before any thread observes into it and
 * may then be observed and written from any threads at once; its bounds
 * array is borrowed and must outlive it (the bounds below are static).
 */
#ifndef PS_METRICS_H
#define PS_METRICS_H

#include "common/buf.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum ps_metric_type {
    PS_METRIC_COUNTER,
    PS_METRIC_GAUGE,
    PS_METRIC_HISTOGRAM,
};

/* A page being written. Caller-allocated; the fields are the writer's. */
typedef struct ps_metrics {
    ps_buf out;
    int err;                  /* the first error, 0 if none */
    char family[128];         /* the family samples go to */
    enum ps_metric_type type;
} ps_metrics;

/* The callback a daemon gives its /metrics endpoint: writes every family
 * into m. Runs on the endpoint's thread, once per scrape. */
typedef void (*ps_metrics_collect_fn)(ps_metrics *m, void *ctx);

/* Starts an empty page. */
void ps_metrics_init(ps_metrics *m);
/* Frees the page's memory; m may be initialised again. */
void ps_metrics_close(ps_metrics *m);
/* The text written so far (NUL-terminated; "" when empty) and its length
 * in *len (may be NULL). Valid until the next write or ps_metrics_close. */
const char *ps_metrics_text(const ps_metrics *m, size_t *len);
/* 0, or the first error: PS_EINVAL_ARG (a name breaking the conventions
 * above, a sample before any family, a histogram sample in a family not
 * declared as one), -ENOMEM. */
int ps_metrics_error(const ps_metrics *m);

/* Begins family `name` of `type`: its # HELP line (help escaped) and its
 * # TYPE line. Samples that follow belong to it. */
void ps_metrics_family(ps_metrics *m, const char *name, enum ps_metric_type type,
                       const char *help);

/* One sample of the current counter or gauge family, with the label pairs
 * that follow value: name, value, name, value, ..., NULL. Label values are
 * any text (escaped here); NaN and infinities print as Prometheus spells
 * them. */
void ps_metrics_sample(ps_metrics *m, double value, ...) __attribute__((sentinel));

/* ps_metrics_family and one unlabelled sample. */
void ps_metrics_counter(ps_metrics *m, const char *name, const char *help,
                        double value);
void ps_metrics_gauge(ps_metrics *m, const char *name, const char *help,
                      double value);

/* ---- Histograms -------------------------------------------------------- */

#define PS_HISTOGRAM_MAX_BOUNDS 24

typedef struct ps_histogram {
    const double *bounds;     /* (nbounds) upper bounds, increasing */
    size_t nbounds;
    /* Per bucket, not cumulative: counts[i] holds observations in
     * (bounds[i-1], bounds[i]]; counts[nbounds] those above every bound. */
    atomic_uint_fast64_t counts[PS_HISTOGRAM_MAX_BOUNDS + 1];
    _Atomic double sum;            /* the sum observed */
} ps_histogram;

/* Latency bounds in seconds, 100 us to 10 s (calls, commits). */
#define PS_LATENCY_NBOUNDS 16
extern const double ps_latency_bounds[PS_LATENCY_NBOUNDS];
/* Bounds in seconds for long jobs, 10 ms to 10 min (checkpoints). */
#define PS_LONG_NBOUNDS 12
extern const double ps_long_bounds[PS_LONG_NBOUNDS];

/* Sets h empty with the n bounds (borrowed). Returns 0, or PS_EINVAL_ARG
 * when n is 0 or above PS_HISTOGRAM_MAX_BOUNDS, or the bounds are not
 * finite and strictly increasing. */
int ps_histogram_init(ps_histogram *h, const double *bounds, size_t n);

/* Counts one observation of v (seconds, bytes: the family's unit). NaN is
 * ignored. Any thread; lock-free. */
void ps_histogram_observe(ps_histogram *h, double v);

/* Observations so far, and their sum. Any thread. */
uint64_t ps_histogram_count(const ps_histogram *h);
double ps_histogram_sum(const ps_histogram *h);

/* Writes h as a sample set of the current histogram family: name_bucket
 * (cumulative, with le), name_sum and name_count, each with the label
 * pairs that follow h (name, value, ..., NULL). */
void ps_metrics_histogram(ps_metrics *m, const ps_histogram *h, ...)
    __attribute__((sentinel));

/* Seconds on CLOCK_MONOTONIC: what a hot path notes at a call's start and
 * subtracts at its end for ps_histogram_observe. */
double ps_metrics_now(void);

#endif
