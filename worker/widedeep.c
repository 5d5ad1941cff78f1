/*
 * widedeep.c - the wide-and-deep model and its loop (widedeep.h).
 */
#include "worker/widedeep.h"

#include "common/buf.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/psclient.h"
#include "common/sparseclient.h"
#include "proto/ps.pb-c.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WIDE_TABLE "wide/cross"
#define DEEP_TABLE "deep/embed"
#define ID_MASK ((UINT64_C(1) << 40) - 1)
#define WIDE_LR 0.05f   /* FTRL learning rate of the wide table */
#define DEEP_LR 0.05f   /* Adagrad learning rate of the embedding table */
#define NDENSE 4

bool wd_is_widedeep(const char *spec)
{
    return spec != NULL && strncmp(spec, "widedeep", 8) == 0 &&
           (spec[8] == '\0' || spec[8] == ':');
}

static int parse_spec(const char *spec, int *e, int *h)
{
    *e = 16;
    *h = 64;
    if (spec[8] == '\0')
        return 0;
    char tail;
    if (sscanf(spec + 9, "%d-%d%c", e, h, &tail) != 2 || *e < 1 || *e > 1024 ||
        *h < 1 || *h > 65536)
        return PS_EINVAL_ARG;
    return 0;
}

int wd_widedeep_check(const char *spec, int h, int w, int c, int nclasses,
                      char *err, size_t errlen)
{
    int e, hid;
    if (!wd_is_widedeep(spec) || parse_spec(spec, &e, &hid) != 0)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "'%s' is not widedeep or "
                       "widedeep:E-H with 1 <= E <= 1024, 1 <= H <= 65536", spec);
    if (h < 3 || w < 3 || c != 1 || nclasses < 2)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "widedeep takes one-channel "
                       "images of at least 3x3 and 2 or more classes (got %dx%dx%d, "
                       "%d classes)", h, w, c, nclasses);
    return 0;
}

int wd_widedeep_vars(const char *spec, int nclasses, struct wd_widedeep_var *out,
                     int cap)
{
    int e, h;
    if (parse_spec(spec, &e, &h) != 0)
        return 0;
    struct wd_widedeep_var v[6] = {
        {"deep/dense0/kernel", {e, h}, 2, false},
        {"deep/dense0/bias", {h, 0}, 1, false},
        {"deep/dense1/kernel", {h, nclasses}, 2, false},
        {"deep/dense1/bias", {nclasses, 0}, 1, false},
        {WIDE_TABLE, {nclasses, 0}, 1, true},
        {DEEP_TABLE, {e, 0}, 1, true},
    };
    for (int i = 0; i < 6 && i < cap; i++)
        out[i] = v[i];
    return 6;
}

/* ---- features -------------------------------------------------------- */

static inline int level(float v, int levels)
{
    int b = (int)(v * (float)levels);
    return b < 0 ? 0 : b >= levels ? levels - 1 : b;
}

static int64_t hashed(uint64_t kind, uint64_t pos, uint64_t code)
{
    return (int64_t)(ps_sparse_mix64((kind << 56) ^ (pos << 32) ^ code) & ID_MASK);
}

/* The ids (cross `kind`) of the 3x3 patches of an h x w image at every
 * `stride`-th row and column, each pixel quantized to `levels` levels, into
 * out; returns their count (an all-zero patch has none). */
static int patch_ids(const float *x, int h, int w, int stride, unsigned levels,
                     uint64_t kind, int64_t *out)
{
    int n = 0;
    for (int r = 0; r + 2 < h; r += stride)
        for (int c = 0; c + 2 < w; c += stride) {
            unsigned code = 0;
            for (int dr = 0; dr < 3; dr++)
                for (int dc = 0; dc < 3; dc++)
                    code = code * levels +
                           (unsigned)level(x[(r + dr) * w + c + dc], (int)levels);
            if (code)
                out[n++] = hashed(kind, (uint64_t)(r * w + c), code);
        }
    return n;
}

/* The wide ids of one h x w image into out (room for (h-1)(w-1) +
 * (h/3)(w/3) + (h/2)(w/2)); returns their count. Three crosses of
 * quantized pixels: every 2x2 patch at 4 levels, the 3x3 tiles at 3
 * levels, and 3x3 patches at 4 levels on a stride of 2 (4^9 codes at each
 * of 13 x 13 places on Fashion-MNIST: the rare shapes that make the table
 * grow to millions of ids, as a real wide model's crosses do). */
static int wide_ids(const float *x, int h, int w, int64_t *out)
{
    int n = 0;
    for (int r = 0; r + 1 < h; r++)
        for (int c = 0; c + 1 < w; c++) {
            unsigned code = (unsigned)(level(x[r * w + c], 4) << 6 |
                                       level(x[r * w + c + 1], 4) << 4 |
                                       level(x[(r + 1) * w + c], 4) << 2 |
                                       level(x[(r + 1) * w + c + 1], 4));
            if (code)
                out[n++] = hashed(1, (uint64_t)(r * w + c), code);
        }
    n += patch_ids(x, h, w, 3, 3, 2, out + n);
    n += patch_ids(x, h, w, 2, 4, 3, out + n);
    return n;
}

/* The deep ids: pixel * 4 + level of the non-zero pixels. */
static int deep_ids(const float *x, int npix, int64_t *out)
{
    int n = 0;
    for (int p = 0; p < npix; p++) {
        int b = level(x[p], 4);
        if (b)
            out[n++] = (int64_t)p * 4 + b;
    }
    return n;
}

/* ---- a batch's ids ---------------------------------------------------- */

/* The ids of a batch for one table: per example [off[i], off[i+1]) into
 * occ (the positions in uniq of each occurrence), and the distinct ids. */
struct bag {
    int64_t *raw;     /* (cap) occurrences, then sorted for uniq */
    int *occ;         /* (cap) index in uniq of each occurrence */
    int *off;         /* (batch + 1) */
    int64_t *uniq;    /* (cap) */
    int nuniq;
    float *rows;      /* (cap * dim) pulled rows of uniq */
    float *grad;      /* (cap * dim) their gradient */
    int dim;
};

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int bag_init(struct bag *b, size_t cap, int batch, int dim)
{
    memset(b, 0, sizeof *b);
    b->dim = dim;
    b->raw = malloc(cap * sizeof *b->raw);
    b->occ = malloc(cap * sizeof *b->occ);
    b->off = malloc(((size_t)batch + 1) * sizeof *b->off);
    b->uniq = malloc(cap * sizeof *b->uniq);
    b->rows = malloc(cap * (size_t)dim * sizeof(float));
    b->grad = malloc(cap * (size_t)dim * sizeof(float));
    return b->raw && b->occ && b->off && b->uniq && b->rows && b->grad ? 0 : -ENOMEM;
}

static void bag_free(struct bag *b)
{
    PS_FREE_ALL(b->raw, b->occ, b->off, b->uniq, b->rows, b->grad);
}

/* After raw[0..off[n]) is filled: the distinct ids and each occurrence's. */
static void bag_index(struct bag *b, int n)
{
    int total = b->off[n];
    memcpy(b->uniq, b->raw, (size_t)total * sizeof *b->uniq);
    qsort(b->uniq, (size_t)total, sizeof *b->uniq, cmp_i64);
    int u = 0;
    for (int i = 0; i < total; i++)
        if (u == 0 || b->uniq[u - 1] != b->uniq[i])
            b->uniq[u++] = b->uniq[i];
    b->nuniq = u;
    for (int i = 0; i < total; i++) {
        const int64_t *f = bsearch(&b->raw[i], b->uniq, (size_t)u, sizeof *b->uniq,
                                   cmp_i64);
        b->occ[i] = (int)(f - b->uniq);
    }
}

/* ---- the session -------------------------------------------------------- */

struct wdm {
    const struct wd_train_opts *o;
    int e, hid, k;                 /* embedding dim, hidden width, classes */
    int h, w, batch;
    ps_client *cl[64];
    int ncl;
    ps_client_item dense[NDENSE];
    int dense_shard[NDENSE];
    int64_t dense_shape[NDENSE][2];
    float *params, *grads;         /* dense, in the order of dense[] */
    size_t nparams;
    struct bag wide, deep;
    float *emb, *hid_act, *logits; /* (batch, e), (batch, hid), (batch, k) */
    float *scratch;                /* (k + hid + e) one example's gradients */
};

static int dense_shard_of(const struct wd_train_opts *o, const char *name, int nps)
{
    for (int i = 0; o->placement && i < o->placement->n; i++)
        if (strcmp(o->placement->vars[i].name, name) == 0 &&
            o->placement->vars[i].nparts > 0)
            return o->placement->vars[i].parts[0].shard % nps;
    return 0;
}

static void wdm_close(struct wdm *m)
{
    for (int i = 0; i < m->ncl; i++)
        ps_client_destroy(m->cl[i]);
    for (int i = 0; i < NDENSE; i++)
        free((char *)m->dense[i].name);
    bag_free(&m->wide);
    bag_free(&m->deep);
    PS_FREE_ALL(m->params, m->grads, m->emb, m->hid_act, m->logits, m->scratch);
}

static int wdm_open(struct wdm *m, const struct wd_train_opts *o, int h, int w,
                    int batch, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->o = o;
    m->h = h;
    m->w = w;
    m->batch = batch;
    m->k = o->nclasses;
    if (parse_spec(o->model, &m->e, &m->hid) != 0 || o->nps < 1 || o->nps > 64)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "widedeep: bad spec or shard count");
    ps_rpc_client_opts co = {.deadline_ms = o->rpc_timeout_ms, .max_attempts = 1000000,
                             .backoff_initial_ms = 100, .backoff_max_ms = 2000,
                             .retry_budget_ms = o->retry_budget_ms, .token = o->token};
    for (int i = 0; i < o->nps; i++) {
        int rc = ps_client_create(o->ps[i], &co, &m->cl[i]);
        if (rc != 0)
            return ps_errf(rc, err, errlen, "psd at %s: cannot make a client", o->ps[i]);
        m->ncl++;
    }
    struct wd_widedeep_var v[6];
    wd_widedeep_vars(o->model, m->k, v, 6);
    size_t off[NDENSE];
    for (int i = 0; i < NDENSE; i++) {
        size_t cnt = (size_t)v[i].shape[0] * (size_t)(v[i].ndim == 2 ? v[i].shape[1] : 1);
        off[i] = m->nparams;
        m->nparams += cnt;
        m->dense_shape[i][0] = v[i].shape[0];
        m->dense_shape[i][1] = v[i].shape[1];
        m->dense[i] = (ps_client_item){.name = strdup(v[i].name), .n = cnt,
                                       .ndim = v[i].ndim};
        m->dense_shard[i] = dense_shard_of(o, v[i].name, o->nps);
    }
    m->params = calloc(m->nparams, sizeof(float));
    m->grads = calloc(m->nparams, sizeof(float));
    size_t npix = (size_t)h * (size_t)w;
    size_t wcap = (size_t)batch * (npix + npix / 9 + npix / 4 + 1), dcap = (size_t)batch * npix;
    int rc = bag_init(&m->wide, wcap, batch, m->k) | bag_init(&m->deep, dcap, batch, m->e);
    m->emb = malloc((size_t)batch * (size_t)m->e * sizeof(float));
    m->hid_act = malloc((size_t)batch * (size_t)m->hid * sizeof(float));
    m->logits = malloc((size_t)batch * (size_t)m->k * sizeof(float));
    m->scratch = malloc((size_t)(m->k + m->hid + m->e) * sizeof(float));
    if (rc || !m->params || !m->grads || !m->emb || !m->hid_act || !m->logits || !m->scratch)
        return ps_errf(-ENOMEM, err, errlen, "widedeep: out of memory");
    for (int i = 0; i < NDENSE; i++) {
        m->dense[i].data = m->params + off[i];
        m->dense[i].shape = m->dense_shape[i];
    }
    return 0;
}

static int rpc_fail(int rc, const ps_rpc_status *st, const char *what, char *err,
                    size_t errlen)
{
    if (rc == PS_ERPC)
        return ps_errf(rc, err, errlen, "widedeep: %s: %s: %s", what,
                       ps_rpc_code_name(st->code), st->message);
    return ps_errf(rc, err, errlen, "widedeep: %s: %s%s%s", what, ps_strerror(rc),
                   st->message[0] ? ": " : "", st->message);
}

/* CreateVariable of the dense variables (on their shard) and of both tables
 * (on every shard: each holds the rows its hash gives it). */
static int create_vars(struct wdm *m, char *err, size_t errlen)
{
    const struct wd_train_opts *o = m->o;
    for (int i = 0; i < NDENSE + 2 * m->ncl; i++) {
        Ps__V1__VariableSpec spec = PS__V1__VARIABLE_SPEC__INIT;
        Ps__V1__Initializer init = PS__V1__INITIALIZER__INIT;
        Ps__V1__Optimizer opt = PS__V1__OPTIMIZER__INIT;
        int64_t shape[2];
        int shard;
        spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
        spec.consistency = PS__V1__CONSISTENCY__ASYNC;
        spec.initializer = &init;
        spec.optimizer = &opt;
        if (i < NDENSE) {
            spec.name = (char *)m->dense[i].name;
            spec.n_shape = (size_t)m->dense[i].ndim;
            spec.shape = m->dense_shape[i];
            init.kind = m->dense[i].ndim == 2 ? PS__V1__INITIALIZER__KIND__GLOROT_UNIFORM
                                              : PS__V1__INITIALIZER__KIND__ZEROS;
            init.seed = o->init_seed * 1000003u + (uint64_t)i;
            opt.kind = (Ps__V1__Optimizer__Kind)o->optimizer;
            opt.learning_rate = o->lr;
            opt.momentum = o->optimizer == PS__V1__OPTIMIZER__KIND__MOMENTUM ? o->momentum : 0;
            shard = m->dense_shard[i];
        } else {
            bool wide = (i - NDENSE) % 2 == 0;
            shard = (i - NDENSE) / 2;
            spec.name = wide ? WIDE_TABLE : DEEP_TABLE;
            spec.sparse = true;
            shape[0] = wide ? m->k : m->e;
            spec.n_shape = 1;
            spec.shape = shape;
            init.kind = wide ? PS__V1__INITIALIZER__KIND__ZEROS
                             : PS__V1__INITIALIZER__KIND__UNIFORM;
            init.minval = -0.05f;
            init.maxval = 0.05f;
            init.seed = o->init_seed * 1000003u + 77;
            opt.kind = wide ? PS__V1__OPTIMIZER__KIND__FTRL : PS__V1__OPTIMIZER__KIND__ADAGRAD;
            opt.learning_rate = wide ? WIDE_LR : DEEP_LR;
            spec.row_dtype = (Ps__V1__DType)o->sparse_row_dtype;
            spec.slot_dtype = (Ps__V1__DType)o->sparse_slot_dtype;
        }
        ps_rpc_status st = {0};
        int rc = ps_client_create_variable(m->cl[shard], &spec, NULL, NULL,
                                           o->rpc_timeout_ms, &st);
        if (rc != 0) {
            char what[300];
            snprintf(what, sizeof what, "psd at %s: CreateVariable '%s'", o->ps[shard],
                     spec.name);
            return rpc_fail(rc, &st, what, err, errlen);
        }
    }
    return 0;
}

/* Pulls the dense variables, one Pull per shard holding some. */
static int pull_dense(struct wdm *m, uint64_t *version, char *err, size_t errlen)
{
    for (int s = 0; s < m->ncl; s++) {
        ps_client_item it[NDENSE];
        int n = 0, which[NDENSE];
        for (int i = 0; i < NDENSE; i++)
            if (m->dense_shard[i] == s) {
                which[n] = i;
                it[n++] = m->dense[i];
            }
        if (n == 0)
            continue;
        ps_rpc_status st = {0};
        int rc = ps_client_pull(m->cl[s], it, (size_t)n, m->o->rpc_timeout_ms, &st);
        if (rc != 0)
            return rpc_fail(rc, &st, "Pull", err, errlen);
        for (int j = 0; j < n; j++)
            m->dense[which[j]].version = it[j].version;
    }
    if (version)
        *version = m->dense[0].version;
    return 0;
}

static int push_dense(struct wdm *m, uint64_t step, char *err, size_t errlen)
{
    for (int s = 0; s < m->ncl; s++) {
        ps_client_item it[NDENSE];
        int n = 0;
        for (int i = 0; i < NDENSE; i++)
            if (m->dense_shard[i] == s) {
                it[n] = m->dense[i];
                it[n++].data = m->grads + (m->dense[i].data - m->params);
            }
        if (n == 0)
            continue;
        ps_rpc_status st = {0};
        int rc = ps_client_push(m->cl[s], (uint32_t)m->o->task_index, step, it,
                                (size_t)n, m->o->rpc_timeout_ms, &st);
        if (rc != 0)
            return rpc_fail(rc, &st, "Push", err, errlen);
    }
    return 0;
}

/* The two tables' items for a call: the batch's distinct ids of each, with
 * wide_rows and deep_rows as the rows pulled into or pushed from. */
static void table_items(struct wdm *m, float *wide_rows, float *deep_rows,
                        ps_sparse_item it[2])
{
    it[0] = (ps_sparse_item){.name = WIDE_TABLE, .ids = m->wide.uniq,
                             .n = (size_t)m->wide.nuniq, .dim = m->k, .rows = wide_rows};
    it[1] = (ps_sparse_item){.name = DEEP_TABLE, .ids = m->deep.uniq,
                             .n = (size_t)m->deep.nuniq, .dim = m->e, .rows = deep_rows};
}

/* The batch's ids of both tables, and their rows pulled. */
static int gather_rows(struct wdm *m, const float *x, int n, char *err, size_t errlen)
{
    int npix = m->h * m->w;
    m->wide.off[0] = m->deep.off[0] = 0;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * (size_t)npix;
        m->wide.off[i + 1] = m->wide.off[i] + wide_ids(xi, m->h, m->w,
                                                      m->wide.raw + m->wide.off[i]);
        m->deep.off[i + 1] = m->deep.off[i] + deep_ids(xi, npix, m->deep.raw + m->deep.off[i]);
    }
    bag_index(&m->wide, n);
    bag_index(&m->deep, n);
    ps_sparse_item it[2];
    table_items(m, m->wide.rows, m->deep.rows, it);
    ps_rpc_status st = {0};
    int rc = ps_client_sparse_pull(m->cl, m->ncl, it, 2, m->o->rpc_timeout_ms, &st);
    return rc ? rpc_fail(rc, &st, "SparsePull", err, errlen) : 0;
}

/* Back through a dense layer y = x W, W (nin, nout) stored by input row:
 * adds x^T dy to gw and sets dx = W dy (before any activation's mask). */
static void dense_back(const float *x, const float *w, const float *dy, int nin, int nout,
                       float *gw, float *dx)
{
    for (int a = 0; a < nin; a++) {
        float s = 0;
        for (int b = 0; b < nout; b++) {
            gw[(size_t)a * nout + b] += x[a] * dy[b];
            s += w[(size_t)a * nout + b] * dy[b];
        }
        dx[a] = s;
    }
}

/* Forward over the pulled rows; with y, also the loss and, if grads, the
 * gradients of the mean loss (dense into m->grads, rows into the bags). */
static void forward(struct wdm *m, int n, const int32_t *y, bool grads, double *loss,
                    int *correct)
{
    int E = m->e, H = m->hid, K = m->k;
    const float *w0 = m->dense[0].data, *b0 = m->dense[1].data;
    const float *w1 = m->dense[2].data, *b1 = m->dense[3].data;
    float *gw0 = m->grads, *gb0 = gw0 + (size_t)E * H, *gw1 = gb0 + H, *gb1 = gw1 + (size_t)H * K;
    if (grads) {
        memset(m->grads, 0, m->nparams * sizeof(float));
        memset(m->wide.grad, 0, (size_t)m->wide.nuniq * (size_t)K * sizeof(float));
        memset(m->deep.grad, 0, (size_t)m->deep.nuniq * (size_t)E * sizeof(float));
    }
    float *dz = m->scratch, *dh = dz + K, *de = dh + H;
    for (int i = 0; i < n; i++) {
        float *e = m->emb + (size_t)i * E, *h = m->hid_act + (size_t)i * H;
        float *z = m->logits + (size_t)i * K;
        int d0 = m->deep.off[i], d1 = m->deep.off[i + 1];
        memset(e, 0, (size_t)E * sizeof(float));
        for (int j = d0; j < d1; j++) {
            const float *r = m->deep.rows + (size_t)m->deep.occ[j] * E;
            for (int a = 0; a < E; a++)
                e[a] += r[a];
        }
        float inv = d1 > d0 ? 1.0f / (float)(d1 - d0) : 0.0f;
        for (int a = 0; a < E; a++)
            e[a] *= inv;
        for (int b = 0; b < H; b++) {
            float s = b0[b];
            for (int a = 0; a < E; a++)
                s += e[a] * w0[(size_t)a * H + b];
            h[b] = s > 0 ? s : 0;
        }
        for (int c = 0; c < K; c++) {
            float s = b1[c];
            for (int b = 0; b < H; b++)
                s += h[b] * w1[(size_t)b * K + c];
            z[c] = s;
        }
        for (int j = m->wide.off[i]; j < m->wide.off[i + 1]; j++) {
            const float *r = m->wide.rows + (size_t)m->wide.occ[j] * K;
            for (int c = 0; c < K; c++)
                z[c] += r[c];
        }
        float mx = z[0];
        int arg = 0;
        for (int c = 1; c < K; c++)
            if (z[c] > mx) {
                mx = z[c];
                arg = c;
            }
        double sum = 0;
        for (int c = 0; c < K; c++)
            sum += exp((double)(z[c] - mx));
        if (y == NULL)
            continue;
        *loss += log(sum) - (double)(z[y[i]] - mx);
        *correct += arg == y[i];
        if (!grads)
            continue;
        for (int c = 0; c < K; c++)
            dz[c] = (float)(exp((double)(z[c] - mx)) / sum) / (float)n - (c == y[i] ? 1.0f / (float)n : 0);
        for (int c = 0; c < K; c++)
            gb1[c] += dz[c];
        dense_back(h, w1, dz, H, K, gw1, dh);
        for (int b = 0; b < H; b++) {
            dh[b] = h[b] > 0 ? dh[b] : 0;
            gb0[b] += dh[b];
        }
        dense_back(e, w0, dh, E, H, gw0, de);
        for (int a = 0; a < E; a++)
            de[a] *= inv;
        for (int j = d0; j < d1; j++) {
            float *g = m->deep.grad + (size_t)m->deep.occ[j] * E;
            for (int a = 0; a < E; a++)
                g[a] += de[a];
        }
        for (int j = m->wide.off[i]; j < m->wide.off[i + 1]; j++) {
            float *g = m->wide.grad + (size_t)m->wide.occ[j] * K;
            for (int c = 0; c < K; c++)
                g[c] += dz[c];
        }
    }
}

static int push_rows(struct wdm *m, uint64_t step, char *err, size_t errlen)
{
    ps_sparse_item it[2];
    table_items(m, m->wide.grad, m->deep.grad, it);
    ps_rpc_status st = {0};
    int rc = ps_client_sparse_push(m->cl, m->ncl, (uint32_t)m->o->task_index, step, it,
                                   2, false, m->o->rpc_timeout_ms, &st);
    return rc ? rpc_fail(rc, &st, "SparsePush", err, errlen) : 0;
}

static void gather_batch(const struct ps_dataset *d, const int64_t *idx, int n,
                         float *xb, int32_t *yb)
{
    for (int i = 0; i < n; i++) {
        memcpy(xb + (size_t)i * (size_t)d->dim, d->x + (size_t)idx[i] * (size_t)d->dim,
               (size_t)d->dim * sizeof(float));
        yb[i] = d->y[idx[i]];
    }
}

/* One step: pull, forward/backward, push. */
static int train_step(struct wdm *m, const float *xb, const int32_t *yb, int n,
                      uint64_t step, double *loss, char *err, size_t errlen)
{
    int rc = gather_rows(m, xb, n, err, errlen);
    if (rc == 0)
        rc = pull_dense(m, NULL, err, errlen);
    if (rc != 0)
        return rc;
    int correct = 0;
    *loss = 0;
    forward(m, n, yb, true, loss, &correct);
    *loss /= n;
    rc = push_rows(m, step, err, errlen);
    return rc ? rc : push_dense(m, step, err, errlen);
}

int wd_train_widedeep(const struct wd_train_opts *o, const struct ps_dataset *train,
                      struct wd_train_result *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    struct wdm m;
    struct ps_batcher b;
    memset(&b, 0, sizeof b);
    int rc = wdm_open(&m, o, train->h, train->w, o->batch, err, errlen);
    if (rc == 0)
        rc = create_vars(&m, err, errlen);
    if (rc == 0)
        rc = ps_batcher_init(&b, train->n, o->task_index, o->num_workers, o->batch,
                             PS_BATCH_SHUFFLE | PS_BATCH_DROP_REMAINDER, o->seed);
    float *xb = malloc((size_t)o->batch * (size_t)train->dim * sizeof(float));
    int32_t *yb = malloc((size_t)o->batch * sizeof(int32_t));
    if (rc == 0 && (!xb || !yb))
        rc = ps_errf(-ENOMEM, err, errlen, "widedeep: out of memory");
    double t0 = (double)ps_now_ms() / 1000.0, last = t0, win_loss = 0;
    int64_t win_n = 0, win_ex = 0;
    for (int epoch = 0; rc == 0 && (o->epochs == 0 || epoch < o->epochs); epoch++) {
        ps_batcher_start_epoch(&b, (uint64_t)epoch);
        const int64_t *idx;
        int n;
        while (rc == 0 && (n = ps_batcher_next(&b, &idx)) > 0) {
            if (wd_stop_requested || (o->max_steps && res->steps >= o->max_steps))
                goto done;
            gather_batch(train, idx, n, xb, yb);
            double loss = 0;
            rc = train_step(&m, xb, yb, n, (uint64_t)res->steps + 1, &loss, err, errlen);
            res->steps++;
            res->examples += n;
            win_loss += loss;
            win_n++;
            win_ex += n;
            double now = (double)ps_now_ms() / 1000.0;
            if (o->on_progress && o->progress_ms > 0 && (now - last) * 1000 >= o->progress_ms) {
                o->on_progress(o->progress_ctx, (uint64_t)res->steps,
                               (double)win_ex / (now - last), win_loss / (double)win_n);
                last = now;
                res->final_loss = win_loss / (double)win_n;
                win_loss = 0;
                win_n = win_ex = 0;
            }
        }
    }
done:
    if (win_n)
        res->final_loss = win_loss / (double)win_n;
    res->seconds = (double)ps_now_ms() / 1000.0 - t0;
    res->examples_per_second = res->seconds > 0 ? (double)res->examples / res->seconds : 0;
    res->version = m.dense[0].version;
    free(xb);
    free(yb);
    ps_batcher_close(&b);
    wdm_close(&m);
    return rc;
}

int wd_evaluate_widedeep(const struct wd_train_opts *o, const struct ps_dataset *test,
                         float *loss, float *accuracy, uint64_t *version, char *err,
                         size_t errlen)
{
    struct wdm m;
    int batch = 256;
    int rc = wdm_open(&m, o, test->h, test->w, batch, err, errlen);
    /* An evaluator waits for the workers to create the variables. */
    int64_t until = ps_now_ms() + (o->retry_budget_ms > 0 ? o->retry_budget_ms : 60000);
    while (rc == 0 && (rc = pull_dense(&m, version, err, errlen)) != 0 &&
           o->evaluator_only && ps_now_ms() < until && !wd_stop_requested) {
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
        rc = 0;
    }
    double sum = 0;
    int correct = 0;
    for (int64_t i = 0; rc == 0 && i < test->n; i += batch) {
        int n = (int)(test->n - i < batch ? test->n - i : batch);
        rc = gather_rows(&m, test->x + (size_t)i * (size_t)test->dim, n, err, errlen);
        if (rc == 0)
            forward(&m, n, test->y + i, false, &sum, &correct);
    }
    if (rc == 0) {
        *loss = (float)(sum / (double)test->n);
        *accuracy = (float)correct / (float)test->n;
    }
    wdm_close(&m);
    return rc;
}
