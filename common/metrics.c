/*
 * metrics.c - see metrics.h. The text follows Prometheus' exposition
 * format 0.0.4: https://prometheus.io/docs/instrumenting/exposition_formats/
 */
#include "common/metrics.h"

#include "common/errors.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Label pairs a sample may carry (le aside): more is a collector's bug. */
#define MAX_LABELS 8

const double ps_latency_bounds[PS_LATENCY_NBOUNDS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
};

const double ps_long_bounds[PS_LONG_NBOUNDS] = {
    0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 600,
};

/* ---- the page's text --------------------------------------------------- */

void ps_metrics_init(ps_metrics *m)
{
    memset(m, 0, sizeof *m);
}

void ps_metrics_close(ps_metrics *m)
{
    ps_buf_free(&m->out);
    memset(m, 0, sizeof *m);
}

const char *ps_metrics_text(const ps_metrics *m, size_t *len)
{
    if (len != NULL)
        *len = m->out.len;
    return m->out.data != NULL ? (const char *)m->out.data : "";
}

int ps_metrics_error(const ps_metrics *m)
{
    return m->err;
}

static void fail(ps_metrics *m, int err)
{
    if (m->err == 0)
        m->err = err;
}

/* Appends n bytes, keeping the text NUL-terminated. */
static void put(ps_metrics *m, const char *s, size_t n)
{
    if (m->err == -ENOMEM)
        return;
    if (ps_buf_reserve(&m->out, m->out.len + n + 1) != 0) {
        fail(m, -ENOMEM);
        return;
    }
    memcpy(m->out.data + m->out.len, s, n);
    m->out.len += n;
    m->out.data[m->out.len] = '\0';
}

static void puts_(ps_metrics *m, const char *s)
{
    put(m, s, strlen(s));
}

/* Appends s escaped: backslash and newline always, the double quote too
 * in a label value (in_label). */
static void put_escaped(ps_metrics *m, const char *s, bool in_label)
{
    const char *run = s;
    for (; *s != '\0'; s++) {
        const char *esc = *s == '\\' ? "\\\\" : *s == '\n' ? "\\n"
                        : in_label && *s == '"' ? "\\\"" : NULL;
        if (esc == NULL)
            continue;
        put(m, run, (size_t)(s - run));
        puts_(m, esc);
        run = s + 1;
    }
    put(m, run, (size_t)(s - run));
}

/* v as Prometheus reads it: integers in full, other values in the
 * shortest form that reads back the same, NaN and +Inf/-Inf by name. */
static void format_value(char *buf, size_t n, double v)
{
    if (isnan(v))
        snprintf(buf, n, "NaN");
    else if (isinf(v))
        snprintf(buf, n, "%s", v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0)
        snprintf(buf, n, "%.0f", v == 0 ? 0.0 : v);
    else {
        snprintf(buf, n, "%.15g", v);
        if (strtod(buf, NULL) != v)
            snprintf(buf, n, "%.17g", v);
    }
}

static bool name_ok(const char *s, bool colon)
{
    if (s == NULL || *s == '\0' || (*s >= '0' && *s <= '9'))
        return false;
    for (; *s != '\0'; s++) {
        char c = *s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || (colon && c == ':')))
            return false;
    }
    return true;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

void ps_metrics_family(ps_metrics *m, const char *name, enum ps_metric_type type,
                       const char *help)
{
    static const char *const types[] = {"counter", "gauge", "histogram"};
    m->family[0] = '\0';
    if (!name_ok(name, true) || strlen(name) >= sizeof m->family ||
        (unsigned)type > (unsigned)PS_METRIC_HISTOGRAM ||
        (type == PS_METRIC_COUNTER) != ends_with(name, "_total")) {
        fail(m, PS_EINVAL_ARG);
        return;
    }
    snprintf(m->family, sizeof m->family, "%s", name);
    m->type = type;
    puts_(m, "# HELP ");
    puts_(m, name);
    puts_(m, " ");
    put_escaped(m, help != NULL ? help : "", false);
    puts_(m, "\n# TYPE ");
    puts_(m, name);
    puts_(m, " ");
    puts_(m, types[type]);
    puts_(m, "\n");
}

/* Reads the NULL-terminated label pairs of ap into kv; returns how many
 * strings (twice the pairs), or -1 for too many, a bad name or a name
 * without its value. */
static int read_labels(va_list ap, const char **kv)
{
    int n = 0;
    for (;;) {
        const char *k = va_arg(ap, const char *);
        if (k == NULL)
            return n;
        const char *v = va_arg(ap, const char *);
        if (n == 2 * MAX_LABELS || v == NULL || !name_ok(k, false) ||
            strcmp(k, "le") == 0 || strncmp(k, "__", 2) == 0)
            return -1;
        kv[n++] = k;
        kv[n++] = v;
    }
}

/* One line: family+suffix{kv...,le="le"} value. */
static void write_series(ps_metrics *m, const char *suffix, const char **kv, int nkv,
                         const char *le, double value)
{
    char num[64];
    puts_(m, m->family);
    puts_(m, suffix);
    if (nkv > 0 || le != NULL) {
        puts_(m, "{");
        for (int i = 0; i < nkv; i += 2) {
            if (i > 0)
                puts_(m, ",");
            puts_(m, kv[i]);
            puts_(m, "=\"");
            put_escaped(m, kv[i + 1], true);
            puts_(m, "\"");
        }
        if (le != NULL) {
            puts_(m, nkv > 0 ? ",le=\"" : "le=\"");
            puts_(m, le);
            puts_(m, "\"");
        }
        puts_(m, "}");
    }
    format_value(num, sizeof num, value);
    puts_(m, " ");
    puts_(m, num);
    puts_(m, "\n");
}

void ps_metrics_sample(ps_metrics *m, double value, ...)
{
    const char *kv[2 * MAX_LABELS];
    va_list ap;
    va_start(ap, value);
    int nkv = read_labels(ap, kv);
    va_end(ap);
    if (nkv < 0 || m->family[0] == '\0' || m->type == PS_METRIC_HISTOGRAM) {
        fail(m, PS_EINVAL_ARG);
        return;
    }
    write_series(m, "", kv, nkv, NULL, value);
}

void ps_metrics_counter(ps_metrics *m, const char *name, const char *help,
                        double value)
{
    ps_metrics_family(m, name, PS_METRIC_COUNTER, help);
    ps_metrics_sample(m, value, NULL);
}

void ps_metrics_gauge(ps_metrics *m, const char *name, const char *help,
                      double value)
{
    ps_metrics_family(m, name, PS_METRIC_GAUGE, help);
    ps_metrics_sample(m, value, NULL);
}

/* ---- histograms -------------------------------------------------------- */

int ps_histogram_init(ps_histogram *h, const double *bounds, size_t n)
{
    if (bounds == NULL || n == 0 || n > PS_HISTOGRAM_MAX_BOUNDS)
        return PS_EINVAL_ARG;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1]))
            return PS_EINVAL_ARG;
    h->bounds = bounds;
    h->nbounds = n;
    for (size_t i = 0; i <= PS_HISTOGRAM_MAX_BOUNDS; i++)
        atomic_init(&h->counts[i], 0);
    atomic_init(&h->sum, 0.0);
    return 0;
}

void ps_histogram_observe(ps_histogram *h, double v)
{
    if (isnan(v))
        return;
    size_t i = 0;
    while (i < h->nbounds && v > h->bounds[i])
        i++;
    atomic_fetch_add_explicit(&h->counts[i], 1, memory_order_relaxed);
    /* No atomic add of a double in C11: a compare-and-swap of the sum
     * (lock-free where a uint64_t's is). */
    double old = atomic_load_explicit(&h->sum, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&h->sum, &old, old + v,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

uint64_t ps_histogram_count(const ps_histogram *h)
{
    uint64_t n = 0;
    for (size_t i = 0; i <= h->nbounds; i++)
        n += atomic_load_explicit(&((ps_histogram *)h)->counts[i], memory_order_relaxed);
    return n;
}

double ps_histogram_sum(const ps_histogram *h)
{
    return atomic_load_explicit(&((ps_histogram *)h)->sum, memory_order_relaxed);
}

void ps_metrics_histogram(ps_metrics *m, const ps_histogram *h, ...)
{
    const char *kv[2 * MAX_LABELS];
    va_list ap;
    va_start(ap, h);
    int nkv = read_labels(ap, kv);
    va_end(ap);
    if (nkv < 0 || m->family[0] == '\0' || m->type != PS_METRIC_HISTOGRAM) {
        fail(m, PS_EINVAL_ARG);
        return;
    }
    /* The sum first: read before the counts, it never runs ahead of them
     * by more than the observations in flight. */
    double sum = ps_histogram_sum(h);
    uint64_t cum = 0;
    char le[64];
    for (size_t i = 0; i <= h->nbounds; i++) {
        cum += atomic_load_explicit(&((ps_histogram *)h)->counts[i], memory_order_relaxed);
        if (i < h->nbounds)
            format_value(le, sizeof le, h->bounds[i]);
        else
            snprintf(le, sizeof le, "+Inf");
        write_series(m, "_bucket", kv, nkv, le, (double)cum);
    }
    write_series(m, "_sum", kv, nkv, NULL, sum);
    write_series(m, "_count", kv, nkv, NULL, (double)cum);
}

double ps_metrics_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
