#include "model.h"

#include "errors.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- CPU backend ------------------------------------------------------- */

static void cpu_gemm(bool trans_a, bool trans_b, int m, int n, int k,
                     float alpha, const float *a, int lda, const float *b,
                     int ldb, float beta, float *c, int ldc)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
                b, ldb, beta, c, ldc);
}

static void cpu_bias_add(float *y, const float *bias, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        float *row = y + (size_t)r * (size_t)cols;
        for (int j = 0; j < cols; j++)
            row[j] += bias[j];
    }
}

static void cpu_bias_grad(float *db, const float *dy, int rows, int cols)
{
    memset(db, 0, (size_t)cols * sizeof *db);
    for (int r = 0; r < rows; r++) {
        const float *row = dy + (size_t)r * (size_t)cols;
        for (int j = 0; j < cols; j++)
            db[j] += row[j];
    }
}

static void cpu_relu_forward(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void cpu_relu_backward(float *dx, const float *dy, const float *y,
                              size_t n)
{
    for (size_t i = 0; i < n; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static void cpu_axpy(float *y, float alpha, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

/* The exponentials are taken in double around the row maximum: no overflow
 * for any finite logits, and a loss exact to float rounding, which keeps the
 * finite-difference checks of the tests tight. */
static void cpu_softmax_xent(const float *logits, const int32_t *labels,
                             int batch, int nclasses, float *losses,
                             int32_t *pred, float *dlogits, float dscale)
{
    for (int b = 0; b < batch; b++) {
        const float *l = logits + (size_t)b * (size_t)nclasses;
        int arg = 0;
        for (int j = 1; j < nclasses; j++)
            if (l[j] > l[arg])
                arg = j;
        double mx = l[arg], sum = 0.0;
        for (int j = 0; j < nclasses; j++)
            sum += exp((double)l[j] - mx);
        int y = labels[b];
        losses[b] = (float)(log(sum) - ((double)l[y] - mx));
        if (pred != NULL)
            pred[b] = arg;
        if (dlogits != NULL) {
            float *d = dlogits + (size_t)b * (size_t)nclasses;
            for (int j = 0; j < nclasses; j++) {
                double p = exp((double)l[j] - mx) / sum;
                d[j] = (float)(dscale * (p - (j == y ? 1.0 : 0.0)));
            }
        }
    }
}

static void cpu_im2col(const struct ps_conv_geom *g, const float *x,
                       float *col)
{
    size_t c = (size_t)g->c, k = (size_t)g->kh * (size_t)g->kw * c;
    for (int n = 0; n < g->batch; n++) {
        for (int oy = 0; oy < g->oh; oy++) {
            for (int ox = 0; ox < g->ow; ox++) {
                float *row = col + (((size_t)n * (size_t)g->oh + (size_t)oy) *
                                        (size_t)g->ow + (size_t)ox) * k;
                for (int ki = 0; ki < g->kh; ki++) {
                    int iy = oy * g->stride - g->pad + ki;
                    for (int kj = 0; kj < g->kw; kj++) {
                        int ix = ox * g->stride - g->pad + kj;
                        float *dst = row + ((size_t)ki * (size_t)g->kw +
                                            (size_t)kj) * c;
                        if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) {
                            memset(dst, 0, c * sizeof *dst);
                            continue;
                        }
                        memcpy(dst,
                               x + (((size_t)n * (size_t)g->h + (size_t)iy) *
                                        (size_t)g->w + (size_t)ix) * c,
                               c * sizeof *dst);
                    }
                }
            }
        }
    }
}

static void cpu_col2im(const struct ps_conv_geom *g, const float *dcol,
                       float *dx)
{
    size_t c = (size_t)g->c, k = (size_t)g->kh * (size_t)g->kw * c;
    memset(dx, 0, (size_t)g->batch * (size_t)g->h * (size_t)g->w * c *
                      sizeof *dx);
    for (int n = 0; n < g->batch; n++) {
        for (int oy = 0; oy < g->oh; oy++) {
            for (int ox = 0; ox < g->ow; ox++) {
                const float *row =
                    dcol + (((size_t)n * (size_t)g->oh + (size_t)oy) *
                                (size_t)g->ow + (size_t)ox) * k;
                for (int ki = 0; ki < g->kh; ki++) {
                    int iy = oy * g->stride - g->pad + ki;
                    if (iy < 0 || iy >= g->h)
                        continue;
                    for (int kj = 0; kj < g->kw; kj++) {
                        int ix = ox * g->stride - g->pad + kj;
                        if (ix < 0 || ix >= g->w)
                            continue;
                        const float *src = row + ((size_t)ki * (size_t)g->kw +
                                                  (size_t)kj) * c;
                        float *dst = dx + (((size_t)n * (size_t)g->h +
                                            (size_t)iy) * (size_t)g->w +
                                           (size_t)ix) * c;
                        for (size_t ch = 0; ch < c; ch++)
                            dst[ch] += src[ch];
                    }
                }
            }
        }
    }
}

static void cpu_maxpool_forward(int batch, int h, int w, int c,
                                const float *x, float *y, int32_t *argmax)
{
    int oh = h / 2, ow = w / 2;
    size_t o = 0;
    for (int n = 0; n < batch; n++) {
        for (int oy = 0; oy < oh; oy++) {
            for (int ox = 0; ox < ow; ox++) {
                int32_t p00 = ((n * h + 2 * oy) * w + 2 * ox) * c;
                int32_t p01 = p00 + c;
                int32_t p10 = p00 + w * c;
                int32_t p11 = p10 + c;
                for (int ch = 0; ch < c; ch++, o++) {
                    int32_t best = p00 + ch;
                    if (x[p01 + ch] > x[best])
                        best = p01 + ch;
                    if (x[p10 + ch] > x[best])
                        best = p10 + ch;
                    if (x[p11 + ch] > x[best])
                        best = p11 + ch;
                    y[o] = x[best];
                    argmax[o] = best;
                }
            }
        }
    }
}

static void cpu_maxpool_backward(int batch, int h, int w, int c,
                                 const float *dy, const int32_t *argmax,
                                 float *dx)
{
    size_t nout = (size_t)batch * (size_t)(h / 2) * (size_t)(w / 2) *
                  (size_t)c;
    memset(dx, 0, (size_t)batch * (size_t)h * (size_t)w * (size_t)c *
                      sizeof *dx);
    for (size_t o = 0; o < nout; o++)
        dx[argmax[o]] += dy[o];
}

const struct ps_backend ps_backend_cpu = {
    .name = "cpu",
    .gemm = cpu_gemm,
    .bias_add = cpu_bias_add,
    .bias_grad = cpu_bias_grad,
    .relu_forward = cpu_relu_forward,
    .relu_backward = cpu_relu_backward,
    .axpy = cpu_axpy,
    .softmax_xent = cpu_softmax_xent,
    .im2col = cpu_im2col,
    .col2im = cpu_col2im,
    .maxpool_forward = cpu_maxpool_forward,
    .maxpool_backward = cpu_maxpool_backward,
};

void ps_backend_cpu_set_threads(int n)
{
    openblas_set_num_threads(n >= 1 ? n : openblas_get_num_procs());
}

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

    float *acts;     /* one block for every layer's out/dout/col and below */
    float *dcol;     /* (max_batch * oh * ow, 9 * ic) for the widest conv */
    float *losses;   /* (max_batch) */
    int32_t *ints;   /* one block for argmax arrays and pred */
    int32_t *pred;   /* (max_batch) */

    char errmsg[256];
};

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

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
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->ih = ih;
    l->iw = iw;
    l->ic = ic;
    l->oh = ih;
    l->ow = iw;
    l->oc = ic;
    l->kernel = -1;
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
        if (nw < 2) {
            seterr(err, errlen,
                   "model '%s': expected mlp:IN-HIDDEN-...-CLASSES with 2 to "
                   "%d widths in [1, %d]",
                   spec, MLP_MAX_WIDTHS, MAX_WIDTH);
            return PS_EINVAL_ARG;
        }
        if ((size_t)widths[0] != m->in_size) {
            seterr(err, errlen,
                   "model '%s' takes %d inputs but examples are %dx%dx%d = "
                   "%zu floats",
                   spec, widths[0], m->in_h, m->in_w, m->in_c, m->in_size);
            return PS_ESHAPE;
        }
        if (widths[nw - 1] != m->nclasses) {
            seterr(err, errlen, "model '%s' has %d outputs but there are %d "
                   "classes", spec, widths[nw - 1], m->nclasses);
            return PS_ESHAPE;
        }
    } else if (strcmp(spec, "cnn") == 0 || strncmp(spec, "cnn:", 4) == 0) {
        int cw[3] = {32, 64, 128};
        if (spec[3] == ':' && parse_widths(spec + 4, cw, 3) != 3) {
            seterr(err, errlen, "model '%s': expected cnn or "
                   "cnn:CONV0-CONV1-DENSE, each in [1, %d]", spec, MAX_WIDTH);
            return PS_EINVAL_ARG;
        }
        if (m->in_h < 4 || m->in_w < 4) {
            seterr(err, errlen, "model '%s' needs images of at least 4x4 "
                   "(two 2x2 pools), got %dx%d", spec, m->in_h, m->in_w);
            return PS_ESHAPE;
        }
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
        if (layer_out_size(p) > MAX_WIDTH) {
            seterr(err, errlen, "model '%s': %zu features after the pools is "
                   "too many", spec, layer_out_size(p));
            return PS_EINVAL_ARG;
        }
        add_dense(m, 0, (int)layer_out_size(p), cw[2]);
        add_relu(m);
        add_dense(m, 1, cw[2], m->nclasses);
        return 0;
    } else {
        seterr(err, errlen, "unknown model '%s': expected softmax, "
               "mlp:784-256-10 or cnn", spec);
        return PS_EINVAL_ARG;
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
    seterr(err, errlen, "model '%s': out of memory", spec);
    return -ENOMEM;
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
        if (biggest > (size_t)INT_MAX / mb) {
            seterr(err, errlen, "model '%s': batches of %d do not fit (a "
                   "layer would need more than %d elements)",
                   m->spec, m->max_batch, INT_MAX);
            return PS_EINVAL_ARG;
        }
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
    m->acts = malloc(nfloat * sizeof *m->acts);
    m->ints = malloc(nint * sizeof *m->ints);
    m->params = calloc(m->nparams, sizeof *m->params);
    m->grads = calloc(m->nparams, sizeof *m->grads);
    if (m->acts == NULL || m->ints == NULL || m->params == NULL ||
        m->grads == NULL) {
        seterr(err, errlen, "model '%s': out of memory for %zu parameters "
               "and %zu scratch floats", m->spec, m->nparams, nfloat);
        return -ENOMEM;
    }
    float *f = m->acts;
    int32_t *n = m->ints;
    m->losses = f;
    f += mb;
    m->pred = n;
    n += mb;
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
    if (spec == NULL || in_h < 1 || in_w < 1 || in_c < 1 || nclasses < 2 ||
        max_batch < 1 || (int64_t)in_h * in_w * in_c > MAX_WIDTH) {
        seterr(err, errlen, "model '%s': need input sizes in [1, %d] in "
               "all, at least 2 classes and max_batch >= 1 (got %dx%dx%d, "
               "%d classes, max_batch %d)",
               spec != NULL ? spec : "(null)", MAX_WIDTH, in_h, in_w, in_c,
               nclasses, max_batch);
        return PS_EINVAL_ARG;
    }
    if (strlen(spec) >= SPEC_LEN) {
        seterr(err, errlen, "model spec '%.32s...' is too long", spec);
        return PS_EINVAL_ARG;
    }
    ps_model *m = calloc(1, sizeof *m);
    if (m == NULL) {
        seterr(err, errlen, "model '%s': out of memory", spec);
        return -ENOMEM;
    }
    m->be = &ps_backend_cpu;
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
    if (rc != 0) {
        ps_model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

void ps_model_destroy(ps_model *m)
{
    if (m == NULL)
        return;
    free(m->grads);
    free(m->params);
    free(m->ints);
    free(m->acts);
    free(m->names);
    free(m->info);
    free(m->layers);
    free(m);
}

int ps_model_check_input(const ps_model *m, int h, int w, int c, char *err,
                         size_t errlen)
{
    if (m->is_cnn ? (h != m->in_h || w != m->in_w || c != m->in_c)
                  : (int64_t)h * w * c != (int64_t)m->in_size) {
        seterr(err, errlen,
               "model '%s' expects %dx%dx%d inputs (%zu floats), the data "
               "has %dx%dx%d",
               m->spec, m->in_h, m->in_w, m->in_c, m->in_size, h, w, c);
        return PS_ESHAPE;
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

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void ps_model_init_params(ps_model *m, uint64_t seed)
{
    for (int i = 0; i < m->ntensors; i++) {
        const struct ps_param_info *t = &m->info[i];
        float *p = m->params + t->offset;
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
            be->gemm(false, false, batch, l->oc, l->ic, 1.0f, in, l->ic, k,
                     l->oc, 0.0f, l->out, l->oc);
            be->bias_add(l->out, b, batch, l->oc);
            break;
        case LAYER_CONV: {
            struct ps_conv_geom g = conv_geom(l, batch);
            int rows = batch * l->oh * l->ow, taps = CONV_K * CONV_K * l->ic;
            be->im2col(&g, in, l->col);
            be->gemm(false, false, rows, l->oc, taps, 1.0f, l->col, taps, k,
                     l->oc, 0.0f, l->out, l->oc);
            be->bias_add(l->out, b, rows, l->oc);
            break;
        }
        case LAYER_RELU:
            be->relu_forward(l->out, in, (size_t)batch * layer_out_size(l));
            break;
        case LAYER_POOL:
            be->maxpool_forward(batch, l->ih, l->iw, l->ic, in, l->out,
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
            be->gemm(true, false, l->ic, l->oc, batch, 1.0f, in, l->ic,
                     l->dout, l->oc, 0.0f, dk, l->oc);
            be->bias_grad(db, l->dout, batch, l->oc);
            if (din != NULL)
                be->gemm(false, true, batch, l->ic, l->oc, 1.0f, l->dout,
                         l->oc, k, l->oc, 0.0f, din, l->ic);
            break;
        case LAYER_CONV: {
            struct ps_conv_geom g = conv_geom(l, batch);
            int rows = batch * l->oh * l->ow, taps = CONV_K * CONV_K * l->ic;
            be->gemm(true, false, taps, l->oc, rows, 1.0f, l->col, taps,
                     l->dout, l->oc, 0.0f, dk, l->oc);
            be->bias_grad(db, l->dout, rows, l->oc);
            if (din != NULL) {
                be->gemm(false, true, rows, taps, l->oc, 1.0f, l->dout, l->oc,
                         k, l->oc, 0.0f, m->dcol, taps);
                be->col2im(&g, m->dcol, din);
            }
            break;
        }
        case LAYER_RELU:
            if (din != NULL)
                be->relu_backward(din, l->dout, l->out,
                                  (size_t)batch * layer_out_size(l));
            break;
        case LAYER_POOL:
            if (din != NULL)
                be->maxpool_backward(batch, l->ih, l->iw, l->ic, l->dout,
                                     l->argmax, din);
            break;
        }
    }
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
    forward(m, x, batch);
    struct layer *last = &m->layers[m->nlayers - 1];
    m->be->softmax_xent(last->out, y, batch, m->nclasses, m->losses, NULL,
                        last->dout, 1.0f / (float)batch);
    backward(m, x, batch);
    if (loss_out != NULL) {
        double sum = 0.0;
        for (int i = 0; i < batch; i++)
            sum += m->losses[i];
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
    const struct layer *last = &m->layers[m->nlayers - 1];
    double sum = 0.0;
    int64_t correct = 0;
    for (int64_t off = 0; off < n; off += m->max_batch) {
        int k = n - off < m->max_batch ? (int)(n - off) : m->max_batch;
        forward(m, x + (size_t)off * m->in_size, k);
        m->be->softmax_xent(last->out, y + off, k, m->nclasses, m->losses,
                            m->pred, NULL, 0.0f);
        for (int i = 0; i < k; i++) {
            sum += m->losses[i];
            correct += m->pred[i] == y[off + i];
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
    m->be->axpy(m->params, -lr, m->grads, m->nparams);
}

const char *ps_model_errmsg(const ps_model *m)
{
    return m->errmsg;
}
