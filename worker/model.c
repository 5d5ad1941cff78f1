/*
 * model.c - the three classifiers of model.h: the spec parsed into a layer
 * plan and a tensor table, one block of scratch carved into views, and the
 * forward and backward passes as calls into the model's backend.
 */
#include "worker/model.h"

#include "common/buf.h"
#include "common/errors.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Model ------------------------------------------------------------- */

#define MLP_MAX_WIDTHS 17   /* 16 dense layers */
#define MAX_WIDTH (1 << 24) /* any one layer's width, to keep sizes in range */
#define CONV_K 3            /* the CNN's kernels are 3x3, stride 1, pad 1 */
#define NAME_LEN 32
#define SPEC_LEN 64

enum layer_kind { LAYER_DENSE, LAYER_CONV, LAYER_RELU, LAYER_POOL };

/* One layer; shapes are per example, NHWC (a dense layer's are 1x1xC). */
struct layer {
    enum layer_kind kind;
    int ih, iw, ic;
    int oh, ow, oc;
    int kernel;      /* tensor index of the kernel, bias at kernel + 1; or -1 */
    float *out;      /* (max_batch, oh, ow, oc) */
    float *dout;     /* (max_batch, oh, ow, oc) d loss / d out */
    float *col;      /* conv: (max_batch * oh * ow, 3 * 3 * ic) input patches */
    int32_t *argmax; /* pool: (max_batch, oh, ow, oc) */
};

struct ps_model {
    const struct ps_backend *be;
    char spec[SPEC_LEN];
    int in_h, in_w, in_c, nclasses, max_batch;
    bool is_cnn;
    size_t in_size;

    int nlayers;
    struct layer *layers;

    int ntensors;
    struct ps_param_info *info;
    char (*names)[NAME_LEN];
    size_t nparams;
    float *params; /* (nparams) every tensor, in info order */
    float *grads;  /* (nparams) same layout */
    float *own_params, *own_grads; /* the blocks allocated here (params and
                                      grads may point elsewhere: use_blocks) */

    /* Backend memory. */
    float *acts;     /* one block for every layer's out/dout/col and below */
    float *dcol;     /* (max_batch * oh * ow, 9 * ic) for the widest conv */
    float *losses;   /* (max_batch) */
    float *x;        /* device backends: (max_batch, in_size) inputs */
    int32_t *ints;   /* one block for argmax arrays and pred */
    int32_t *pred;   /* (max_batch) */
    int32_t *y;      /* device backends: (max_batch) labels */

    /* Host memory: the losses and predictions read back (on the CPU
     * backend, the same as losses and pred), and on device backends a
     * staging block of nparams floats for ps_model_init_params. */
    float *host_losses; /* (max_batch) */
    int32_t *host_pred; /* (max_batch) */
    float *host;        /* device backends: one block for all three */

    /* A whole-step backend's program (backend.h's step slots), and whether
     * params changed since it last read them. */
    void *step;
    bool step_stale;

    char errmsg[256];
};

static size_t layer_out_size(const struct layer *l)
{
    return (size_t)l->oh * (size_t)l->ow * (size_t)l->oc;
}

static size_t layer_in_size(const struct layer *l)
{
    return (size_t)l->ih * (size_t)l->iw * (size_t)l->ic;
}

/* Parses "a-b-c" into widths; returns how many, or -1 when malformed. */
static int parse_widths(const char *s, int *w, int maxn)
{
    int n = 0;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || *s == '-' || *s == '+' || errno != 0 || v < 1 ||
            v > MAX_WIDTH || n == maxn)
            return -1;
        w[n++] = (int)v;
        if (*end == '\0')
            return n;
        if (*end != '-')
            return -1;
        s = end + 1;
    }
}

/* Appends a layer to the plan; the caller sized the array. */
static struct layer *add_layer(ps_model *m, enum layer_kind kind, int ih,
                               int iw, int ic)
{
    struct layer *l = &m->layers[m->nlayers++];
    /* The output keeps the input's shape until the caller sets it. */
    *l = (struct layer){.kind = kind, .ih = ih, .iw = iw, .ic = ic,
                        .oh = ih, .ow = iw, .oc = ic, .kernel = -1};
    return l;
}

static void add_tensor(ps_model *m, const char *layer, const char *what,
                       int ndim, const int64_t *shape, enum ps_init_kind init,
                       int64_t fan_in, int64_t fan_out)
{
    int i = m->ntensors++;
    struct ps_param_info *t = &m->info[i];
    snprintf(m->names[i], NAME_LEN, "%s/%s", layer, what);
    t->name = m->names[i];
    t->ndim = ndim;
    t->count = 1;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->count *= (size_t)shape[d];
    }
    t->offset = m->nparams;
    t->init = init;
    t->fan_in = fan_in;
    t->fan_out = fan_out;
    m->nparams += t->count;
}

static void add_dense(ps_model *m, int index, int in, int out)
{
    char layer[16];
    snprintf(layer, sizeof layer, "dense%d", index);
    struct layer *l = add_layer(m, LAYER_DENSE, 1, 1, in);
    l->oc = out;
    l->kernel = m->ntensors;
    add_tensor(m, layer, "kernel", 2, (int64_t[]){in, out},
               PS_INIT_GLOROT_UNIFORM, in, out);
    add_tensor(m, layer, "bias", 1, (int64_t[]){out}, PS_INIT_ZEROS, in, out);
}

static void add_conv(ps_model *m, int index, int h, int w, int in, int out)
{
    char layer[16];
    snprintf(layer, sizeof layer, "conv%d", index);
    struct layer *l = add_layer(m, LAYER_CONV, h, w, in);
    l->oc = out;
    l->kernel = m->ntensors;
    int64_t taps = CONV_K * CONV_K;
    add_tensor(m, layer, "kernel", 4, (int64_t[]){CONV_K, CONV_K, in, out},
               PS_INIT_GLOROT_UNIFORM, taps * in, taps * out);
    add_tensor(m, layer, "bias", 1, (int64_t[]){out}, PS_INIT_ZEROS,
               taps * in, taps * out);
}

static void add_relu(ps_model *m)
{
    const struct layer *prev = &m->layers[m->nlayers - 1];
    add_layer(m, LAYER_RELU, prev->oh, prev->ow, prev->oc);
}

static void add_pool(ps_model *m)
{
    const struct layer *prev = &m->layers[m->nlayers - 1];
    struct layer *l = add_layer(m, LAYER_POOL, prev->oh, prev->ow, prev->oc);
    l->oh = prev->oh / 2;
    l->ow = prev->ow / 2;
}

/*
 * Turns the spec into the layer plan and the tensor table. Sizes only; the
 * buffers are pointed afterwards by alloc_buffers.
 */
static int plan(ps_model *m, const char *spec, char *err, size_t errlen)
{
    int widths[MLP_MAX_WIDTHS];
    int nw;
    if (strcmp(spec, "softmax") == 0) {
        widths[0] = (int)m->in_size;
        widths[1] = m->nclasses;
        nw = 2;
    } else if (strncmp(spec, "mlp:", 4) == 0) {
        nw = parse_widths(spec + 4, widths, MLP_MAX_WIDTHS);
        if (nw < 2)
            return ps_errf(PS_EINVAL_ARG, err, errlen,
                           "model '%s': expected mlp:IN-HIDDEN-...-CLASSES with 2 to "
                           "%d widths in [1, %d]",
                           spec, MLP_MAX_WIDTHS, MAX_WIDTH);
        if ((size_t)widths[0] != m->in_size)
            return ps_errf(PS_ESHAPE, err, errlen,
                           "model '%s' takes %d inputs but examples are %dx%dx%d = "
                           "%zu floats",
                           spec, widths[0], m->in_h, m->in_w, m->in_c, m->in_size);
        if (widths[nw - 1] != m->nclasses)
            return ps_errf(PS_ESHAPE, err, errlen,
                           "model '%s' has %d outputs but there are %d "
                           "classes", spec, widths[nw - 1], m->nclasses);
    } else if (strcmp(spec, "cnn") == 0 || strncmp(spec, "cnn:", 4) == 0) {
        int cw[3] = {32, 64, 128};
        if (spec[3] == ':' && parse_widths(spec + 4, cw, 3) != 3)
            return ps_errf(PS_EINVAL_ARG, err, errlen, "model '%s': expected cnn or "
                           "cnn:CONV0-CONV1-DENSE, each in [1, %d]", spec, MAX_WIDTH);
        if (m->in_h < 4 || m->in_w < 4)
            return ps_errf(PS_ESHAPE, err, errlen,
                           "model '%s' needs images of at least 4x4 "
                           "(two 2x2 pools), got %dx%d", spec, m->in_h, m->in_w);
        m->is_cnn = true;
        m->layers = calloc(10, sizeof *m->layers);
        m->info = calloc(8, sizeof *m->info);
        m->names = calloc(8, sizeof *m->names);
        if (m->layers == NULL || m->info == NULL || m->names == NULL)
            goto nomem;
        add_conv(m, 0, m->in_h, m->in_w, m->in_c, cw[0]);
        add_relu(m);
        add_pool(m);
        const struct layer *p = &m->layers[m->nlayers - 1];
        add_conv(m, 1, p->oh, p->ow, p->oc, cw[1]);
        add_relu(m);
        add_pool(m);
        p = &m->layers[m->nlayers - 1];
        if (layer_out_size(p) > MAX_WIDTH)
            return ps_errf(PS_EINVAL_ARG, err, errlen,
                           "model '%s': %zu features after the pools is "
                           "too many", spec, layer_out_size(p));
        add_dense(m, 0, (int)layer_out_size(p), cw[2]);
        add_relu(m);
        add_dense(m, 1, cw[2], m->nclasses);
        return 0;
    } else {
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                       "unknown model '%s': expected softmax, "
                       "mlp:784-256-10 or cnn", spec);
    }

    int ndense = nw - 1;
    m->layers = calloc((size_t)(2 * ndense), sizeof *m->layers);
    m->info = calloc((size_t)(2 * ndense), sizeof *m->info);
    m->names = calloc((size_t)(2 * ndense), sizeof *m->names);
    if (m->layers == NULL || m->info == NULL || m->names == NULL)
        goto nomem;
    for (int i = 0; i < ndense; i++) {
        if (i > 0)
            add_relu(m);
        add_dense(m, i, widths[i], widths[i + 1]);
    }
    return 0;

nomem:
    return ps_errf(-ENOMEM, err, errlen, "model '%s': out of memory", spec);
}

/*
 * Sizes and points the scratch buffers for max_batch examples: one float
 * block and one int block, carved into per-layer views, so a step never
 * allocates.
 */
static int alloc_buffers(ps_model *m, char *err, size_t errlen)
{
    size_t mb = (size_t)m->max_batch;
    size_t nfloat = mb, nint = mb, dcol = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const struct layer *l = &m->layers[i];
        size_t rows = mb * (size_t)l->oh * (size_t)l->ow;
        size_t biggest = layer_out_size(l) > layer_in_size(l)
                             ? layer_out_size(l) : layer_in_size(l);
        size_t taps = (size_t)l->oh * l->ow * CONV_K * CONV_K * (size_t)l->ic;
        if (l->kind == LAYER_CONV && taps > biggest)
            biggest = taps;
        /* GEMM sizes and pooling indices are ints: keep every buffer's
         * element count in range. */
        if (biggest > (size_t)INT_MAX / mb)
            return ps_errf(PS_EINVAL_ARG, err, errlen,
                           "model '%s': batches of %d do not fit (a "
                           "layer would need more than %d elements)",
                           m->spec, m->max_batch, INT_MAX);
        nfloat += 2 * mb * layer_out_size(l);
        if (l->kind == LAYER_CONV) {
            size_t c = rows * CONV_K * CONV_K * (size_t)l->ic;
            nfloat += c;
            if (i > 0 && c > dcol)
                dcol = c;
        }
        if (l->kind == LAYER_POOL)
            nint += mb * layer_out_size(l);
    }
    nfloat += dcol;
    const struct ps_backend *be = m->be;
    bool device = !be->host_memory;
    if (device) {
        nfloat += mb * m->in_size;
        nint += mb;
    }
    m->acts = be->alloc(be, nfloat * sizeof *m->acts);
    m->ints = be->alloc(be, nint * sizeof *m->ints);
    m->params = m->own_params = be->alloc(be, m->nparams * sizeof *m->params);
    m->grads = m->own_grads = be->alloc(be, m->nparams * sizeof *m->grads);
    if (device)
        m->host = malloc((m->nparams + 2 * mb) * sizeof(float));
    if (m->acts == NULL || m->ints == NULL || m->params == NULL ||
        m->grads == NULL || (device && m->host == NULL)) {
        return ps_errf(-ENOMEM, err, errlen,
                       "model '%s': out of %s memory for %zu parameters "
                       "and %zu scratch floats", m->spec, be->name, m->nparams,
                       nfloat);
    }
    /* Zero parameters, as promised; zero gradients, so that a block read
     * before the first step holds numbers. */
    be->zero(be, m->params, m->nparams * sizeof *m->params);
    be->zero(be, m->grads, m->nparams * sizeof *m->grads);
    float *f = m->acts;
    int32_t *n = m->ints;
    m->losses = f;
    f += mb;
    m->pred = n;
    n += mb;
    if (device) {
        m->x = f;
        f += mb * m->in_size;
        m->y = n;
        n += mb;
        m->host_losses = m->host + m->nparams;
        m->host_pred = (int32_t *)(m->host_losses + mb);
    } else {
        m->host_losses = m->losses;
        m->host_pred = m->pred;
    }
    for (int i = 0; i < m->nlayers; i++) {
        struct layer *l = &m->layers[i];
        size_t out = mb * layer_out_size(l);
        l->out = f;
        f += out;
        l->dout = f;
        f += out;
        if (l->kind == LAYER_CONV) {
            l->col = f;
            f += mb * (size_t)l->oh * l->ow * CONV_K * CONV_K * (size_t)l->ic;
        }
        if (l->kind == LAYER_POOL) {
            l->argmax = n;
            n += out;
        }
    }
    m->dcol = dcol > 0 ? f : NULL;
    return 0;
}

int ps_model_create(const char *spec, int in_h, int in_w, int in_c,
                    int nclasses, int max_batch, ps_model **out, char *err,
                    size_t errlen)
{
    return ps_model_create_on(&ps_backend_cpu, spec, in_h, in_w, in_c,
                              nclasses, max_batch, out, err, errlen);
}

/* On a whole-step backend: the model as it sees it, and its step. */
static int open_step(ps_model *m, char *err, size_t errlen)
{
    struct ps_step_net net = {.cnn = m->is_cnn, .h = m->in_h, .w = m->in_w,
                              .c = m->in_c};
    for (int i = 0; i < m->nlayers && net.nwidths < PS_STEP_MAX_WIDTHS; i++) {
        const struct layer *l = &m->layers[i];
        if (l->kind == LAYER_CONV)
            net.widths[net.nwidths++] = l->oc;
        if (l->kind != LAYER_DENSE)
            continue;
        if (net.nwidths == 0)
            net.widths[net.nwidths++] = l->ic;
        net.widths[net.nwidths++] = l->oc;
    }
    m->step = m->be->step_open(m->be, &net, err, errlen);
    m->step_stale = true;
    return m->step != NULL ? 0 : PS_ESHAPE;
}

int ps_model_create_on(const struct ps_backend *be, const char *spec,
                       int in_h, int in_w, int in_c, int nclasses,
                       int max_batch, ps_model **out, char *err,
                       size_t errlen)
{
    if (be == NULL)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "model '%s': no backend",
                       spec != NULL ? spec : "(null)");
    if (spec == NULL || in_h < 1 || in_w < 1 || in_c < 1 || nclasses < 2 ||
        max_batch < 1 || (int64_t)in_h * in_w * in_c > MAX_WIDTH) {
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                       "model '%s': need input sizes in [1, %d] in "
                       "all, at least 2 classes and max_batch >= 1 (got %dx%dx%d, "
                       "%d classes, max_batch %d)",
                       spec != NULL ? spec : "(null)", MAX_WIDTH, in_h, in_w, in_c,
                       nclasses, max_batch);
    }
    if (strlen(spec) >= SPEC_LEN)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                       "model spec '%.32s...' is too long", spec);
    ps_model *m = calloc(1, sizeof *m);
    if (m == NULL)
        return ps_errf(-ENOMEM, err, errlen, "model '%s': out of memory", spec);
    m->be = be;
    snprintf(m->spec, sizeof m->spec, "%s", spec);
    m->in_h = in_h;
    m->in_w = in_w;
    m->in_c = in_c;
    m->nclasses = nclasses;
    m->max_batch = max_batch;
    m->in_size = (size_t)in_h * (size_t)in_w * (size_t)in_c;
    int rc = plan(m, spec, err, errlen);
    if (rc == 0)
        rc = alloc_buffers(m, err, errlen);
    if (rc == 0 && be->step_open != NULL)
        rc = open_step(m, err, errlen);
    if (rc == 0)
        *out = m;
    else
        ps_model_destroy(m);
    return rc;
}

void ps_model_destroy(ps_model *m)
{
    if (m == NULL)
        return;
    const struct ps_backend *be = m->be;
    if (m->step != NULL)
        be->step_close(m->step);
    be->free(be, m->own_grads);
    be->free(be, m->own_params);
    be->free(be, m->ints);
    be->free(be, m->acts);
    PS_FREE_ALL(m->host, m->names, m->info, m->layers, m);
}

int ps_model_check_input(const ps_model *m, int h, int w, int c, char *err,
                         size_t errlen)
{
    if (m->is_cnn ? (h != m->in_h || w != m->in_w || c != m->in_c)
                  : (int64_t)h * w * c != (int64_t)m->in_size) {
        return ps_errf(PS_ESHAPE, err, errlen,
                       "model '%s' expects %dx%dx%d inputs (%zu floats), the data "
                       "has %dx%dx%d",
                       m->spec, m->in_h, m->in_w, m->in_c, m->in_size, h, w, c);
    }
    return 0;
}

const char *ps_model_spec(const ps_model *m)
{
    return m->spec;
}

size_t ps_model_input_size(const ps_model *m)
{
    return m->in_size;
}

int ps_model_nclasses(const ps_model *m)
{
    return m->nclasses;
}

int ps_model_max_batch(const ps_model *m)
{
    return m->max_batch;
}

const struct ps_backend *ps_model_backend(const ps_model *m)
{
    return m->be;
}

size_t ps_model_nparams(const ps_model *m)
{
    return m->nparams;
}

float *ps_model_params(ps_model *m)
{
    return m->params;
}

float *ps_model_grads(ps_model *m)
{
    return m->grads;
}

int ps_model_param_count(const ps_model *m)
{
    return m->ntensors;
}

const struct ps_param_info *ps_model_param_info(const ps_model *m, int i)
{
    if (i < 0 || i >= m->ntensors)
        return NULL;
    return &m->info[i];
}

/* Waits for the backend and turns its error into the model's. */
static int sync_backend(ps_model *m)
{
    char reason[200];
    int rc = m->be->sync(m->be, reason, sizeof reason);
    if (rc != 0)
        snprintf(m->errmsg, sizeof m->errmsg, "model '%s' on %s: %.150s",
                 m->spec, m->be->name, reason);
    return rc;
}

/* The four block copies: one transfer each, then a sync so that the error
 * of this copy (or of any step before it) is reported here. */
static int copy_block(ps_model *m, void *dst, const void *src, bool up)
{
    size_t bytes = m->nparams * sizeof(float);
    m->errmsg[0] = '\0';
    if (up)
        m->be->upload(m->be, dst, src, bytes);
    else
        m->be->download(m->be, dst, src, bytes);
    return sync_backend(m);
}

int ps_model_use_params(ps_model *m, float *block)
{
    if (!m->be->host_memory)
        return PS_EINVAL_ARG;
    m->params = block != NULL ? block : m->own_params;
    return 0;
}

int ps_model_use_grads(ps_model *m, float *block)
{
    if (!m->be->host_memory)
        return PS_EINVAL_ARG;
    m->grads = block != NULL ? block : m->own_grads;
    return 0;
}

int ps_model_params_to_host(ps_model *m, float *dst)
{
    return copy_block(m, dst, m->params, false);
}

int ps_model_params_from_host(ps_model *m, const float *src)
{
    m->step_stale = true;
    return copy_block(m, m->params, src, true);
}

int ps_model_grads_to_host(ps_model *m, float *dst)
{
    return copy_block(m, dst, m->grads, false);
}

int ps_model_grads_from_host(ps_model *m, const float *src)
{
    return copy_block(m, m->grads, src, true);
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void ps_model_init_params(ps_model *m, uint64_t seed)
{
    float *block = m->be->host_memory ? m->params : m->host;
    for (int i = 0; i < m->ntensors; i++) {
        const struct ps_param_info *t = &m->info[i];
        float *p = block + t->offset;
        if (t->init == PS_INIT_ZEROS) {
            memset(p, 0, t->count * sizeof *p);
            continue;
        }
        uint64_t a = seed;
        uint64_t s = splitmix64(&a) ^ ((uint64_t)i + 1) * 0xd1b54a32d192ed03ULL;
        float limit = (float)sqrt(6.0 / (double)(t->fan_in + t->fan_out));
        for (size_t k = 0; k < t->count; k++) {
            /* 24 random bits: uniform on [0, 1) exactly in float. */
            float u = (float)(splitmix64(&s) >> 40) * 0x1p-24f;
            p[k] = (2.0f * u - 1.0f) * limit;
        }
    }
    if (!m->be->host_memory)
        m->be->upload(m->be, m->params, block, m->nparams * sizeof *block);
    m->step_stale = true;
}

static int check_labels(ps_model *m, const int32_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (y[i] < 0 || y[i] >= m->nclasses) {
            snprintf(m->errmsg, sizeof m->errmsg,
                     "model '%s': label %d of example %lld is outside "
                     "[0, %d)",
                     m->spec, (int)y[i], (long long)i, m->nclasses);
            return PS_EINVAL_ARG;
        }
    }
    return 0;
}

static struct ps_conv_geom conv_geom(const struct layer *l, int batch)
{
    return (struct ps_conv_geom){
        .batch = batch, .h = l->ih, .w = l->iw, .c = l->ic,
        .kh = CONV_K, .kw = CONV_K, .pad = 1, .stride = 1,
        .oh = l->oh, .ow = l->ow,
    };
}

/* Runs every layer on batch examples of x; the logits end in the last
 * layer's out. */
static void forward(ps_model *m, const float *x, int batch)
{
    const struct ps_backend *be = m->be;
    const float *in = x;
    for (int i = 0; i < m->nlayers; i++) {
        struct layer *l = &m->layers[i];
        const float *k = l->kernel >= 0 ? m->params + m->info[l->kernel].offset
                                        : NULL;
        const float *b = l->kernel >= 0
                             ? m->params + m->info[l->kernel + 1].offset
                             : NULL;
        switch (l->kind) {
        case LAYER_DENSE:
            be->gemm(be, false, false, batch, l->oc, l->ic, 1.0f, in, l->ic, k,
                     l->oc, 0.0f, l->out, l->oc);
            be->bias_add(be, l->out, b, batch, l->oc);
            break;
        case LAYER_CONV: {
            struct ps_conv_geom g = conv_geom(l, batch);
            int rows = batch * l->oh * l->ow, taps = CONV_K * CONV_K * l->ic;
            be->im2col(be, &g, in, l->col);
            be->gemm(be, false, false, rows, l->oc, taps, 1.0f, l->col, taps, k,
                     l->oc, 0.0f, l->out, l->oc);
            be->bias_add(be, l->out, b, rows, l->oc);
            break;
        }
        case LAYER_RELU:
            be->relu_forward(be, l->out, in, (size_t)batch * layer_out_size(l));
            break;
        case LAYER_POOL:
            be->maxpool_forward(be, batch, l->ih, l->iw, l->ic, in, l->out,
                                l->argmax);
            break;
        }
        in = l->out;
    }
}

/* Walks the layers back from the last one's dout, writing the parameter
 * gradients; the first layer's input gradient is never needed. */
static void backward(ps_model *m, const float *x, int batch)
{
    const struct ps_backend *be = m->be;
    for (int i = m->nlayers - 1; i >= 0; i--) {
        struct layer *l = &m->layers[i];
        const float *in = i > 0 ? m->layers[i - 1].out : x;
        float *din = i > 0 ? m->layers[i - 1].dout : NULL;
        const float *k = NULL;
        float *dk = NULL, *db = NULL;
        if (l->kernel >= 0) {
            k = m->params + m->info[l->kernel].offset;
            dk = m->grads + m->info[l->kernel].offset;
            db = m->grads + m->info[l->kernel + 1].offset;
        }
        switch (l->kind) {
        case LAYER_DENSE:
            be->gemm(be, true, false, l->ic, l->oc, batch, 1.0f, in, l->ic,
                     l->dout, l->oc, 0.0f, dk, l->oc);
            be->bias_grad(be, db, l->dout, batch, l->oc);
            if (din != NULL)
                be->gemm(be, false, true, batch, l->ic, l->oc, 1.0f, l->dout,
                         l->oc, k, l->oc, 0.0f, din, l->ic);
            break;
        case LAYER_CONV: {
            struct ps_conv_geom g = conv_geom(l, batch);
            int rows = batch * l->oh * l->ow, taps = CONV_K * CONV_K * l->ic;
            be->gemm(be, true, false, taps, l->oc, rows, 1.0f, l->col, taps,
                     l->dout, l->oc, 0.0f, dk, l->oc);
            be->bias_grad(be, db, l->dout, rows, l->oc);
            if (din != NULL) {
                be->gemm(be, false, true, rows, taps, l->oc, 1.0f, l->dout, l->oc,
                         k, l->oc, 0.0f, m->dcol, taps);
                be->col2im(be, &g, m->dcol, din);
            }
            break;
        }
        case LAYER_RELU:
            if (din != NULL)
                be->relu_backward(be, din, l->dout, l->out,
                                  (size_t)batch * layer_out_size(l));
            break;
        case LAYER_POOL:
            if (din != NULL)
                be->maxpool_backward(be, batch, l->ih, l->iw, l->ic, l->dout,
                                     l->argmax, din);
            break;
        }
    }
}

/* Where a batch's inputs and labels are read from: the caller's host
 * arrays on the CPU backend (no copy), else uploaded into the model's
 * device buffers. */
static void stage_batch(ps_model *m, const float **x, const int32_t **y,
                        int batch)
{
    if (m->be->host_memory)
        return;
    m->be->upload(m->be, m->x, *x,
                  (size_t)batch * m->in_size * sizeof **x);
    m->be->upload(m->be, m->y, *y, (size_t)batch * sizeof **y);
    *x = m->x;
    *y = m->y;
}

/* The step on a whole-step backend: fresh values to it first if they
 * changed, then the gradient straight into the (host) gradient block. */
static int run_step(ps_model *m, const float *x, const int32_t *y, int batch,
                    float *loss_out)
{
    char reason[200];
    int rc = 0;
    if (m->step_stale)
        rc = m->be->step_params(m->step, m->params, reason, sizeof reason);
    if (rc == 0) {
        m->step_stale = false;
        rc = m->be->step_run(m->step, x, y, batch, m->grads, loss_out, reason,
                             sizeof reason);
    }
    if (rc != 0)
        snprintf(m->errmsg, sizeof m->errmsg, "model '%s' on %s: %.150s",
                 m->spec, m->be->name, reason);
    return rc;
}

int ps_model_forward_backward(ps_model *m, const float *x, const int32_t *y,
                              int batch, float *loss_out)
{
    m->errmsg[0] = '\0';
    if (batch < 1 || batch > m->max_batch) {
        snprintf(m->errmsg, sizeof m->errmsg,
                 "model '%s': batch of %d is outside [1, %d]", m->spec, batch,
                 m->max_batch);
        return PS_EINVAL_ARG;
    }
    int rc = check_labels(m, y, batch);
    if (rc != 0)
        return rc;
    const struct ps_backend *be = m->be;
    if (m->step != NULL)
        return run_step(m, x, y, batch, loss_out);
    stage_batch(m, &x, &y, batch);
    forward(m, x, batch);
    struct layer *last = &m->layers[m->nlayers - 1];
    be->softmax_xent(be, last->out, y, batch, m->nclasses, m->losses, NULL,
                     last->dout, 1.0f / (float)batch);
    backward(m, x, batch);
    if (loss_out != NULL && !be->host_memory)
        be->download(be, m->host_losses, m->losses,
                     (size_t)batch * sizeof *m->losses);
    if (!be->host_memory && (rc = sync_backend(m)) != 0)
        return rc;
    if (loss_out != NULL) {
        double sum = 0.0;
        for (int i = 0; i < batch; i++)
            sum += m->host_losses[i];
        *loss_out = (float)(sum / batch);
    }
    return 0;
}

int ps_model_evaluate(ps_model *m, const float *x, const int32_t *y, int64_t n,
                      float *loss, float *accuracy)
{
    m->errmsg[0] = '\0';
    if (n < 1) {
        snprintf(m->errmsg, sizeof m->errmsg,
                 "model '%s': nothing to evaluate (%lld examples)", m->spec,
                 (long long)n);
        return PS_EINVAL_ARG;
    }
    int rc = check_labels(m, y, n);
    if (rc != 0)
        return rc;
    const struct ps_backend *be = m->be;
    const struct layer *last = &m->layers[m->nlayers - 1];
    double sum = 0.0;
    int64_t correct = 0;
    for (int64_t off = 0; off < n; off += m->max_batch) {
        int k = n - off < m->max_batch ? (int)(n - off) : m->max_batch;
        const float *xc = x + (size_t)off * m->in_size;
        const int32_t *yc = y + off;
        stage_batch(m, &xc, &yc, k);
        forward(m, xc, k);
        be->softmax_xent(be, last->out, yc, k, m->nclasses, m->losses,
                         m->pred, NULL, 0.0f);
        if (!be->host_memory) {
            be->download(be, m->host_losses, m->losses,
                         (size_t)k * sizeof *m->losses);
            be->download(be, m->host_pred, m->pred,
                         (size_t)k * sizeof *m->pred);
            if ((rc = sync_backend(m)) != 0)
                return rc;
        }
        for (int i = 0; i < k; i++) {
            sum += m->host_losses[i];
            correct += m->host_pred[i] == y[off + i];
        }
    }
    if (loss != NULL)
        *loss = (float)(sum / (double)n);
    if (accuracy != NULL)
        *accuracy = (float)((double)correct / (double)n);
    return 0;
}

void ps_model_sgd_step(ps_model *m, float lr)
{
    m->step_stale = true;
    m->be->axpy(m->be, m->params, -lr, m->grads, m->nparams);
}

const char *ps_model_errmsg(const ps_model *m)
{
    return m->errmsg;
}
