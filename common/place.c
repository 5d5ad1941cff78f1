#include "common/place.h"

#include "common/errors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 2^40 float32 elements: 4 TiB, far beyond any shard, far below overflow. */
#define MAX_ELEMENTS ((uint64_t)1 << 40)

static uint64_t elements(const struct ps_place_var *v)
{
    uint64_t n = 1;
    for (int d = 0; d < v->ndims; d++)
        n *= (uint64_t)v->shape[d];
    return n;
}

uint64_t ps_place_var_bytes(const struct ps_place_var *v)
{
    return elements(v) * 4;
}

const char *ps_place_shape_str(const int64_t *shape, int ndims, char *buf,
                               size_t len)
{
    size_t used = 0;
    int k = snprintf(buf, len, "[");
    used = k > 0 ? (size_t)k : 0;
    for (int d = 0; d < ndims && used < len; d++) {
        k = snprintf(buf + used, len - used, "%s%" PRId64, d > 0 ? ", " : "",
                     shape[d]);
        used += k > 0 ? (size_t)k : 0;
    }
    if (used < len)
        snprintf(buf + used, len - used, "]");
    return buf;
}

int ps_place_check(const struct ps_place_var *vars, int n, char *why,
                   size_t whylen)
{
    if (n <= 0) {
        snprintf(why, whylen, "the proposal holds no variables; give each "
                 "variable's name and shape");
        return PS_EINVAL_ARG;
    }
    for (int i = 0; i < n; i++) {
        const struct ps_place_var *v = &vars[i];
        size_t len = v->name != NULL ? strlen(v->name) : 0;
        if (len == 0 || len > 255) {
            snprintf(why, whylen, "variable #%d: a name must be 1 to 255 "
                     "bytes, got %zu", i, len);
            return PS_EINVAL_ARG;
        }
        if (v->ndims < 0 || v->ndims > PS_PLACE_MAX_DIMS) {
            snprintf(why, whylen, "variable '%s': %d dimensions, at most %d",
                     v->name, v->ndims, PS_PLACE_MAX_DIMS);
            return PS_EINVAL_ARG;
        }
        uint64_t e = 1;
        for (int d = 0; d < v->ndims; d++) {
            if (v->shape[d] < 1) {
                snprintf(why, whylen, "variable '%s': dimension %d is %" PRId64
                         ", each must be >= 1", v->name, d, v->shape[d]);
                return PS_EINVAL_ARG;
            }
            if ((uint64_t)v->shape[d] > MAX_ELEMENTS ||
                e * (uint64_t)v->shape[d] > MAX_ELEMENTS) {
                snprintf(why, whylen, "variable '%s': more than 2^40 "
                         "elements", v->name);
                return PS_EINVAL_ARG;
            }
            e *= (uint64_t)v->shape[d];
        }
        for (int j = 0; j < i; j++) {
            if (strcmp(vars[j].name, v->name) == 0) {
                snprintf(why, whylen, "variable '%s' is named twice (#%d and "
                         "#%d)", v->name, j, i);
                return PS_EINVAL_ARG;
            }
        }
    }
    return 0;
}

/* Largest first; equal sizes by name, so that any order of the same model
 * gives the same placement. */
struct order {
    int i;
    uint64_t bytes;
    const char *name;
};

static int order_cmp(const void *a, const void *b)
{
    const struct order *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static void var_free(struct ps_place_var *v)
{
    for (int k = 0; k < v->nparts; k++)
        free(v->parts[k].name);
    free(v->parts);
    free(v->name);
    memset(v, 0, sizeof *v);
}

void ps_placement_free(struct ps_placement *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < p->nvars; i++)
        var_free(&p->vars[i]);
    free(p->vars);
    memset(p, 0, sizeof *p);
}

/* Gives v (name and shape already set) its parts: one whole part on `shard`,
 * or, when split, nparts row ranges on shards 0..nparts-1. */
static int set_parts(struct ps_place_var *v, int nparts, uint32_t shard)
{
    v->parts = calloc((size_t)nparts, sizeof *v->parts);
    if (v->parts == NULL)
        return -ENOMEM;
    v->nparts = nparts;
    int64_t rows = v->ndims > 0 ? v->shape[0] : 1;
    if (nparts == 1) {
        v->parts[0].name = strdup(v->name);
        v->parts[0].shard = shard;
        v->parts[0].row_begin = 0;
        v->parts[0].row_end = rows;
        return v->parts[0].name == NULL ? -ENOMEM : 0;
    }
    int64_t base = rows / nparts, extra = rows % nparts, at = 0;
    for (int k = 0; k < nparts; k++) {
        int64_t take = base + (k < extra ? 1 : 0);
        struct ps_place_part *p = &v->parts[k];
        if (asprintf(&p->name, "%s/part%d", v->name, k) < 0) {
            p->name = NULL;
            return -ENOMEM;
        }
        p->shard = (uint32_t)k;
        p->row_begin = at;
        p->row_end = at + take;
        at += take;
    }
    return 0;
}

/* A sparse table's parts: one per shard, named as the table, no rows. */
static int set_hashed_parts(struct ps_place_var *v, uint32_t num_ps)
{
    v->parts = calloc(num_ps, sizeof *v->parts);
    if (v->parts == NULL)
        return -ENOMEM;
    v->nparts = (int)num_ps;
    for (uint32_t k = 0; k < num_ps; k++) {
        v->parts[k].name = strdup(v->name);
        v->parts[k].shard = k;
        if (v->parts[k].name == NULL)
            return -ENOMEM;
    }
    return 0;
}

int ps_place_compute(const struct ps_place_var *vars, int n, uint32_t num_ps,
                     uint64_t split_threshold, struct ps_placement *out)
{
    memset(out, 0, sizeof *out);
    if (num_ps == 0 || n <= 0)
        return PS_EINVAL_ARG;
    int rc = -ENOMEM;
    struct order *ord = calloc((size_t)n, sizeof *ord);
    uint64_t *load = calloc(num_ps, sizeof *load);
    out->vars = calloc((size_t)n, sizeof *out->vars);
    if (ord == NULL || load == NULL || out->vars == NULL)
        goto fail;
    out->nvars = n;
    out->num_ps = num_ps;
    for (int i = 0; i < n; i++) {
        struct ps_place_var *v = &out->vars[i];
        v->name = strdup(vars[i].name);
        if (v->name == NULL)
            goto fail;
        v->ndims = vars[i].ndims;
        v->hash_partitioned = vars[i].hash_partitioned;
        memcpy(v->shape, vars[i].shape, sizeof v->shape);
        ord[i] = (struct order){i, ps_place_var_bytes(v), v->name};
    }
    qsort(ord, (size_t)n, sizeof *ord, order_cmp);

    for (int j = 0; j < n; j++) {
        struct ps_place_var *v = &out->vars[ord[j].i];
        int64_t rows = v->ndims > 0 ? v->shape[0] : 1;
        if (v->hash_partitioned) {
            if ((rc = set_hashed_parts(v, num_ps)) != 0)
                goto fail;
            continue;
        }
        if (num_ps > 1 && ord[j].bytes > split_threshold && rows > 1) {
            int nparts = rows < (int64_t)num_ps ? (int)rows : (int)num_ps;
            if ((rc = set_parts(v, nparts, 0)) != 0)
                goto fail;
            uint64_t row_bytes = ord[j].bytes / (uint64_t)rows;
            for (int k = 0; k < nparts; k++)
                load[k] += row_bytes * (uint64_t)(v->parts[k].row_end -
                                                  v->parts[k].row_begin);
            continue;
        }
        uint32_t best = 0;
        for (uint32_t s = 1; s < num_ps; s++)
            if (load[s] < load[best])
                best = s;
        if ((rc = set_parts(v, 1, best)) != 0)
            goto fail;
        load[best] += ord[j].bytes;
    }
    free(ord);
    free(load);
    return 0;
fail:
    free(ord);
    free(load);
    ps_placement_free(out);
    return rc;
}

static bool same_shape(const struct ps_place_var *a,
                       const struct ps_place_var *b)
{
    if (a->ndims != b->ndims)
        return false;
    for (int d = 0; d < a->ndims; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    return true;
}

int ps_place_same(const struct ps_placement *p,
                  const struct ps_place_var *vars, int n, char *why,
                  size_t whylen)
{
    char s1[128], s2[128];
    for (int i = 0; i < n; i++) {
        const struct ps_place_var *placed = NULL;
        for (int j = 0; j < p->nvars && placed == NULL; j++)
            if (strcmp(p->vars[j].name, vars[i].name) == 0)
                placed = &p->vars[j];
        if (placed == NULL) {
            snprintf(why, whylen, "variable '%s' is not in the placed model "
                     "(%d variables)", vars[i].name, p->nvars);
            return PS_ECONFLICT;
        }
        if (!same_shape(placed, &vars[i])) {
            snprintf(why, whylen, "variable '%s' has shape %s, the placed "
                     "model's has %s", vars[i].name,
                     ps_place_shape_str(vars[i].shape, vars[i].ndims, s1,
                                     sizeof s1),
                     ps_place_shape_str(placed->shape, placed->ndims, s2,
                                     sizeof s2));
            return PS_ECONFLICT;
        }
        if (placed->hash_partitioned != vars[i].hash_partitioned) {
            snprintf(why, whylen, "variable '%s' is %shash-partitioned, the placed "
                     "model's is %s", vars[i].name, vars[i].hash_partitioned ? "" : "not ",
                     placed->hash_partitioned ? "" : "not");
            return PS_ECONFLICT;
        }
    }
    for (int j = 0; j < p->nvars; j++) {
        bool found = false;
        for (int i = 0; i < n && !found; i++)
            found = strcmp(p->vars[j].name, vars[i].name) == 0;
        if (!found) {
            snprintf(why, whylen, "the placed model's variable '%s' is "
                     "missing (placed model has %d variables, this one %d)",
                     p->vars[j].name, p->nvars, n);
            return PS_ECONFLICT;
        }
    }
    return 0;
}

int ps_placement_copy(const struct ps_placement *src,
                      struct ps_placement *dst)
{
    memset(dst, 0, sizeof *dst);
    if (src->nvars == 0)
        return 0;
    dst->vars = calloc((size_t)src->nvars, sizeof *dst->vars);
    if (dst->vars == NULL)
        return -ENOMEM;
    dst->nvars = src->nvars;
    dst->num_ps = src->num_ps;
    for (int i = 0; i < src->nvars; i++) {
        const struct ps_place_var *s = &src->vars[i];
        struct ps_place_var *d = &dst->vars[i];
        d->name = strdup(s->name);
        d->ndims = s->ndims;
        d->hash_partitioned = s->hash_partitioned;
        memcpy(d->shape, s->shape, sizeof d->shape);
        d->parts = calloc((size_t)(s->nparts > 0 ? s->nparts : 1),
                          sizeof *d->parts);
        if (d->name == NULL || d->parts == NULL)
            goto fail;
        d->nparts = s->nparts;
        for (int k = 0; k < s->nparts; k++) {
            d->parts[k] = s->parts[k];
            d->parts[k].name = strdup(s->parts[k].name);
            if (d->parts[k].name == NULL)
                goto fail;
        }
    }
    return 0;
fail:
    ps_placement_free(dst);
    return -ENOMEM;
}
