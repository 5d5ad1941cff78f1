/*
 * format.c - how psctl writes numbers, shapes and a variable's settings for
 * an operator. See psctl.h.
 */
#include "tools/psctl.h"

#include "common/tensor.h"

#include <inttypes.h>
#include <stdio.h>

/* "512 B", "784.0 KiB", "2.3 MiB": bytes as an operator reads them. */
const char *human_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    if (n < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", n);
        return buf;
    }
    double v = (double)n / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

/* "42.1 s", "3m 07s", "5h 03m 07s", "2d 05h 03m". */
const char *human_duration(double seconds, char *buf, size_t len)
{
    if (seconds < 60.0) {
        snprintf(buf, len, "%.1f s", seconds);
        return buf;
    }
    uint64_t s = (uint64_t)seconds;
    uint64_t d = s / 86400, h = s / 3600 % 24, m = s / 60 % 60;
    if (d > 0)
        snprintf(buf, len, "%" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m", d,
                 h, m);
    else if (h > 0)
        snprintf(buf, len, "%" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s", h,
                 m, s % 60);
    else
        snprintf(buf, len, "%" PRIu64 "m %02" PRIu64 "s", m, s % 60);
    return buf;
}

const char *shape_text(const int64_t *shape, size_t n, char *buf, size_t len)
{
    if (n > PS_TENSOR_MAX_DIMS) {
        snprintf(buf, len, "(%zu dimensions)", n);
        return buf;
    }
    return ps_tensor_shape_str(shape, (int)n, buf, len);
}

/* The names psctl create takes. */
const char *optimizer_label(const Ps__V1__Optimizer *o)
{
    if (o == NULL)
        return "sgd";
    switch (o->kind) {
    case PS__V1__OPTIMIZER__KIND__SGD:
        return "sgd";
    case PS__V1__OPTIMIZER__KIND__MOMENTUM:
        return o->nesterov ? "nesterov" : "momentum";
    case PS__V1__OPTIMIZER__KIND__ADAGRAD:
        return "adagrad";
    case PS__V1__OPTIMIZER__KIND__ADAM:
        return "adam";
    case PS__V1__OPTIMIZER__KIND__FTRL:
        return "ftrl";
    default:
        return "unknown";
    }
}

const char *consistency_label(const Ps__V1__VariableSpec *sp, char *buf,
                              size_t len)
{
    switch (sp->consistency) {
    case PS__V1__CONSISTENCY__CONSISTENCY_DEFAULT:
        snprintf(buf, len, "default");
        break;
    case PS__V1__CONSISTENCY__ASYNC:
        snprintf(buf, len, "async");
        break;
    case PS__V1__CONSISTENCY__SYNC:
        snprintf(buf, len, "sync(%u)", sp->num_workers);
        break;
    case PS__V1__CONSISTENCY__BOUNDED_STALENESS:
        snprintf(buf, len, "bounded(%u)", sp->staleness);
        break;
    default:
        snprintf(buf, len, "unknown(%d)", (int)sp->consistency);
        break;
    }
    return buf;
}
