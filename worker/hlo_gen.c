/*
 * hlo_gen.c - the dense training step of hlo_gen.h as StableHLO text: one
 * growing buffer and one line per op, named by layer.
 */
#include "worker/hlo_gen.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM (1 << 24)

struct text {
    char *s;
    size_t len, cap;
    bool nomem;
};

static void put(struct text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void put(struct text *t, const char *fmt, ...)
{
    for (;;) {
        if (t->nomem)
            return;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap * 2 + (size_t)(n > 0 ? n : 0);
        char *s = realloc(t->s, cap);
        if (s == NULL) {
            t->nomem = true;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
}

/* tensor<AxBxf32> and friends, into a small ring of buffers so that one
 * put() can name several types. */
static const char *ty(int a, int b, const char *elem)
{
    static __thread char ring[8][48];
    static __thread int next;
    char *buf = ring[next++ % 8];
    if (a < 0)
        snprintf(buf, sizeof ring[0], "tensor<%s>", elem);
    else if (b < 0)
        snprintf(buf, sizeof ring[0], "tensor<%dx%s>", a, elem);
    else
        snprintf(buf, sizeof ring[0], "tensor<%dx%dx%s>", a, b, elem);
    return buf;
}

/* The signature: tensors, x, y in; their gradients and the loss out. */
static void signature(struct text *t, const int *w, int nl, int batch)
{
    put(t, "module @ps_train_step {\n  func.func public @main(");
    for (int l = 0; l < nl; l++)
        put(t, "%%w%d: %s, %%b%d: %s, ", l, ty(w[l], w[l + 1], "f32"), l,
            ty(w[l + 1], -1, "f32"));
    put(t, "%%x: %s, %%y: %s) -> (", ty(batch, w[0], "f32"), ty(batch, -1, "i32"));
    for (int l = 0; l < nl; l++)
        put(t, "%s, %s, ", ty(w[l], w[l + 1], "f32"), ty(w[l + 1], -1, "f32"));
    put(t, "tensor<f32>) {\n");
    put(t, "    %%zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>\n"
           "    %%ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>\n");
}

/* The name of layer l's input: in0 for the first, else %h<l>. */
static void layer_input(char *src, size_t len, int l, const char *in0)
{
    if (l == 0)
        snprintf(src, len, "%s", in0);
    else
        snprintf(src, len, "%%h%d", l);
}

/* h0 = in (%x, or the CNN's %flat); z_l = h_l W_l + b_l; h_{l+1} =
 * max(z_l, 0) but for the last. */
static void forward(struct text *t, const int *w, int nl, int batch, const char *in0)
{
    for (int l = 0; l < nl; l++) {
        const char *in = ty(batch, w[l], "f32"), *out = ty(batch, w[l + 1], "f32");
        char src[16];
        layer_input(src, sizeof src, l, in0);
        put(t, "    %%mm%d = stablehlo.dot_general %s, %%w%d, contracting_dims = [1] x [0]"
               " : (%s, %s) -> %s\n", l, src, l, in, ty(w[l], w[l + 1], "f32"), out);
        put(t, "    %%bb%d = stablehlo.broadcast_in_dim %%b%d, dims = [1] : (%s) -> %s\n",
            l, l, ty(w[l + 1], -1, "f32"), out);
        put(t, "    %%z%d = stablehlo.add %%mm%d, %%bb%d : %s\n", l, l, l, out);
        if (l + 1 < nl) {
            put(t, "    %%zeros%d = stablehlo.broadcast_in_dim %%zero, dims = [] : "
                   "(tensor<f32>) -> %s\n", l + 1, out);
            put(t, "    %%h%d = stablehlo.maximum %%z%d, %%zeros%d : %s\n", l + 1, l,
                l + 1, out);
        }
    }
}

/* The mean cross-entropy of logits z_{nl-1} and dlogits = (softmax -
 * onehot) / batch, as the CPU backend's softmax_xent. */
static void loss(struct text *t, int nl, int batch, int nc)
{
    const char *m = ty(batch, nc, "f32"), *v = ty(batch, -1, "f32");
    const char *mi = ty(batch, nc, "i32");
    int z = nl - 1;
    put(t, "    %%mx = stablehlo.reduce(%%z%d init: %%ninf) applies stablehlo.maximum "
           "across dimensions = [1] : (%s, tensor<f32>) -> %s\n", z, m, v);
    put(t, "    %%mxb = stablehlo.broadcast_in_dim %%mx, dims = [0] : (%s) -> %s\n", v, m);
    put(t, "    %%sh = stablehlo.subtract %%z%d, %%mxb : %s\n", z, m);
    put(t, "    %%ex = stablehlo.exponential %%sh : %s\n", m);
    put(t, "    %%se = stablehlo.reduce(%%ex init: %%zero) applies stablehlo.add "
           "across dimensions = [1] : (%s, tensor<f32>) -> %s\n", m, v);
    put(t, "    %%lse = stablehlo.log %%se : %s\n", v);
    put(t, "    %%seb = stablehlo.broadcast_in_dim %%se, dims = [0] : (%s) -> %s\n", v, m);
    put(t, "    %%prob = stablehlo.divide %%ex, %%seb : %s\n", m);
    put(t, "    %%iota = stablehlo.iota dim = 1 : %s\n", mi);
    put(t, "    %%yb = stablehlo.broadcast_in_dim %%y, dims = [0] : (%s) -> %s\n",
        ty(batch, -1, "i32"), mi);
    put(t, "    %%eq = stablehlo.compare EQ, %%iota, %%yb : (%s, %s) -> %s\n", mi, mi,
        ty(batch, nc, "i1"));
    put(t, "    %%onehot = stablehlo.convert %%eq : (%s) -> %s\n",
        ty(batch, nc, "i1"), m);
    put(t, "    %%picked = stablehlo.multiply %%sh, %%onehot : %s\n", m);
    put(t, "    %%pk = stablehlo.reduce(%%picked init: %%zero) applies stablehlo.add "
           "across dimensions = [1] : (%s, tensor<f32>) -> %s\n", m, v);
    put(t, "    %%lex = stablehlo.subtract %%lse, %%pk : %s\n", v);
    put(t, "    %%lsum = stablehlo.reduce(%%lex init: %%zero) applies stablehlo.add "
           "across dimensions = [0] : (%s, tensor<f32>) -> tensor<f32>\n", v);
    put(t, "    %%inv = stablehlo.constant dense<%.9e> : tensor<f32>\n",
        (double)(1.0f / (float)batch));
    put(t, "    %%loss = stablehlo.multiply %%lsum, %%inv : tensor<f32>\n");
    put(t, "    %%invb = stablehlo.broadcast_in_dim %%inv, dims = [] : "
           "(tensor<f32>) -> %s\n", m);
    put(t, "    %%pmo = stablehlo.subtract %%prob, %%onehot : %s\n", m);
    put(t, "    %%d%d = stablehlo.multiply %%pmo, %%invb : %s\n", z, m);
}

/* From d_l = d loss / d z_l down: the kernel and bias gradients, through
 * each ReLU to d_{l-1}, and with dflat to %dflat, d loss / d in0. */
static void backward(struct text *t, const int *w, int nl, int batch, const char *in0,
                     bool dflat)
{
    for (int l = nl - 1; l >= 0; l--) {
        const char *dl = ty(batch, w[l + 1], "f32"), *hl = ty(batch, w[l], "f32");
        char src[16];
        layer_input(src, sizeof src, l, in0);
        put(t, "    %%gw%d = stablehlo.dot_general %s, %%d%d, contracting_dims = [0] x [0]"
               " : (%s, %s) -> %s\n", l, src, l, hl, dl, ty(w[l], w[l + 1], "f32"));
        put(t, "    %%gb%d = stablehlo.reduce(%%d%d init: %%zero) applies stablehlo.add "
               "across dimensions = [0] : (%s, tensor<f32>) -> %s\n", l, l, dl,
            ty(w[l + 1], -1, "f32"));
        if (l == 0 && dflat)
            put(t, "    %%dflat = stablehlo.dot_general %%d0, %%w0, contracting_dims = [1] x [1]"
                   " : (%s, %s) -> %s\n", dl, ty(w[0], w[1], "f32"), hl);
        if (l == 0)
            break;
        put(t, "    %%dh%d = stablehlo.dot_general %%d%d, %%w%d, contracting_dims = [1] x [1]"
               " : (%s, %s) -> %s\n", l, l, l, dl, ty(w[l], w[l + 1], "f32"), hl);
        put(t, "    %%pos%d = stablehlo.compare GT, %%h%d, %%zeros%d : (%s, %s) -> %s\n",
            l, l, l, hl, hl, ty(batch, w[l], "i1"));
        put(t, "    %%d%d = stablehlo.select %%pos%d, %%dh%d, %%zeros%d : %s, %s\n",
            l - 1, l, l, l, ty(batch, w[l], "i1"), hl);
    }
}

/* The gradients of the dense layers and the loss; conv, the CNN's part
 * before them ("%gck0, %gcb0, ..." and their types). */
static void ret(struct text *t, const int *w, int nl, const char *conv,
                const char *conv_types)
{
    put(t, "    return %s", conv);
    for (int l = 0; l < nl; l++)
        put(t, "%%gw%d, %%gb%d, ", l, l);
    put(t, "%%loss : %s", conv_types);
    for (int l = 0; l < nl; l++)
        put(t, "%s, %s, ", ty(w[l], w[l + 1], "f32"), ty(w[l + 1], -1, "f32"));
    put(t, "tensor<f32>\n  }\n}\n");
}

/* The text, or NULL when memory ran out. */
static char *finish(struct text *t, char *err, size_t errlen)
{
    if (t->nomem) {
        free(t->s);
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "out of memory building the step's text");
        return NULL;
    }
    return t->s;
}

char *ps_hlo_dense_step(const int *widths, int nwidths, int batch, char *err,
                        size_t errlen)
{
    int nl = nwidths - 1;
    if (nl < 1 || nl > PS_HLO_MAX_LAYERS) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "a dense step needs 1 to %d layers, got %d",
                     PS_HLO_MAX_LAYERS, nl);
        return NULL;
    }
    for (int i = 0; i <= nwidths; i++) {
        int v = i < nwidths ? widths[i] : batch;
        if (v < 1 || v > MAX_DIM) {
            if (err != NULL && errlen > 0)
                snprintf(err, errlen, "%s %d is outside [1, %d]",
                         i < nwidths ? "width" : "batch", v, MAX_DIM);
            return NULL;
        }
    }
    struct text t = {.s = malloc(4096), .cap = 4096};
    t.nomem = t.s == NULL;
    signature(&t, widths, nl, batch);
    forward(&t, widths, nl, batch, "%x");
    loss(&t, nl, batch, widths[nl]);
    backward(&t, widths, nl, batch, "%x", false);
    ret(&t, widths, nl, "", "");
    return finish(&t, err, errlen);
}

/* ---- The CNN ----------------------------------------------------------- */

static const char *ty4(int a, int b, int c, int d)
{
    static __thread char ring[8][64];
    static __thread int next;
    char *buf = ring[next++ % 8];
    snprintf(buf, sizeof ring[0], "tensor<%dx%dx%dx%dxf32>", a, b, c, d);
    return buf;
}

#define CONV_ATTRS "window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, " \
                   "feature_group_count = 1 : i64}"
#define POOL_ATTRS "{window_dimensions = array<i64: 1, 2, 2, 1>, " \
                   "window_strides = array<i64: 1, 2, 2, 1>}"

/* The shapes: image (n, h, w, c), conv l's input (h[l], w[l], c[l]) and
 * output channels c[l + 1]; after both pools (h[2], w[2], c[2]). */
struct cnn {
    int n, h[3], w[3], c[3];
};

static void cnn_signature(struct text *t, const struct cnn *g, const int *dw)
{
    put(t, "module @ps_train_step {\n  func.func public @main(");
    for (int l = 0; l < 2; l++)
        put(t, "%%ck%d: %s, %%cb%d: %s, ", l, ty4(3, 3, g->c[l], g->c[l + 1]), l,
            ty(g->c[l + 1], -1, "f32"));
    for (int l = 0; l < 2; l++)
        put(t, "%%w%d: %s, %%b%d: %s, ", l, ty(dw[l], dw[l + 1], "f32"), l,
            ty(dw[l + 1], -1, "f32"));
    put(t, "%%x: %s, %%y: %s) -> (", ty4(g->n, g->h[0], g->w[0], g->c[0]),
        ty(g->n, -1, "i32"));
    for (int l = 0; l < 2; l++)
        put(t, "%s, %s, ", ty4(3, 3, g->c[l], g->c[l + 1]), ty(g->c[l + 1], -1, "f32"));
    for (int l = 0; l < 2; l++)
        put(t, "%s, %s, ", ty(dw[l], dw[l + 1], "f32"), ty(dw[l + 1], -1, "f32"));
    put(t, "tensor<f32>) {\n");
    put(t, "    %%zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>\n"
           "    %%ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>\n");
}

/* conv l (3x3, pad 1) -> + bias -> ReLU (%cr) -> 2x2 max-pool (%cp). */
static void cnn_forward(struct text *t, const struct cnn *g, int l)
{
    int n = g->n, h = g->h[l], w = g->w[l], ci = g->c[l], co = g->c[l + 1];
    const char *in = l == 0 ? "%x" : "%cp0", *out = ty4(n, h, w, co);
    put(t, "    %%cv%d = stablehlo.convolution(%s, %%ck%d) dim_numbers = [b, 0, 1, f]x"
           "[0, 1, i, o]->[b, 0, 1, f], " CONV_ATTRS " : (%s, %s) -> %s\n", l, in, l,
        ty4(n, h, w, ci), ty4(3, 3, ci, co), out);
    put(t, "    %%cbb%d = stablehlo.broadcast_in_dim %%cb%d, dims = [3] : (%s) -> %s\n",
        l, l, ty(co, -1, "f32"), out);
    put(t, "    %%ca%d = stablehlo.add %%cv%d, %%cbb%d : %s\n", l, l, l, out);
    put(t, "    %%czero%d = stablehlo.broadcast_in_dim %%zero, dims = [] : (tensor<f32>)"
           " -> %s\n", l, out);
    put(t, "    %%cr%d = stablehlo.maximum %%ca%d, %%czero%d : %s\n", l, l, l, out);
    put(t, "    %%cp%d = \"stablehlo.reduce_window\"(%%cr%d, %%ninf) ({\n"
           "    ^bb0(%%rwa%d: tensor<f32>, %%rwb%d: tensor<f32>):\n"
           "      %%rwm%d = stablehlo.maximum %%rwa%d, %%rwb%d : tensor<f32>\n"
           "      stablehlo.return %%rwm%d : tensor<f32>\n"
           "    }) " POOL_ATTRS " : (%s, tensor<f32>) -> %s\n", l, l, l, l, l, l, l, l,
        out, ty4(n, h / 2, w / 2, co));
}

/* From %dcp (d loss / d pool output) of conv block l: through the pool
 * and the ReLU, the kernel and bias gradients, and for l = 1 on to
 * %dcp0. */
static void cnn_backward(struct text *t, const struct cnn *g, int l)
{
    int n = g->n, h = g->h[l], w = g->w[l], ci = g->c[l], co = g->c[l + 1];
    const char *in = l == 0 ? "%x" : "%cp0", *out = ty4(n, h, w, co);
    put(t, "    %%dcr%d = \"stablehlo.select_and_scatter\"(%%cr%d, %%dcp%d, %%zero) ({\n"
           "    ^bb0(%%ssa%d: tensor<f32>, %%ssb%d: tensor<f32>):\n"
           "      %%ssge%d = stablehlo.compare GE, %%ssa%d, %%ssb%d : (tensor<f32>, "
           "tensor<f32>) -> tensor<i1>\n"
           "      stablehlo.return %%ssge%d : tensor<i1>\n"
           "    }, {\n"
           "    ^bb0(%%ssc%d: tensor<f32>, %%ssd%d: tensor<f32>):\n"
           "      %%sssum%d = stablehlo.add %%ssc%d, %%ssd%d : tensor<f32>\n"
           "      stablehlo.return %%sssum%d : tensor<f32>\n"
           "    }) " POOL_ATTRS " : (%s, %s, tensor<f32>) -> %s\n",
        l, l, l, l, l, l, l, l, l, l, l, l, l, l, l, out, ty4(n, h / 2, w / 2, co), out);
    put(t, "    %%cpos%d = stablehlo.compare GT, %%cr%d, %%czero%d : (%s, %s) -> "
           "tensor<%dx%dx%dx%dxi1>\n", l, l, l, out, out, n, h, w, co);
    put(t, "    %%dca%d = stablehlo.select %%cpos%d, %%dcr%d, %%czero%d : "
           "tensor<%dx%dx%dx%dxi1>, %s\n", l, l, l, l, n, h, w, co, out);
    put(t, "    %%gck%d = stablehlo.convolution(%s, %%dca%d) dim_numbers = [f, 0, 1, b]x"
           "[i, 0, 1, o]->[0, 1, b, f], " CONV_ATTRS " : (%s, %s) -> %s\n", l, in, l,
        ty4(n, h, w, ci), out, ty4(3, 3, ci, co));
    put(t, "    %%gcb%d = stablehlo.reduce(%%dca%d init: %%zero) applies stablehlo.add "
           "across dimensions = [0, 1, 2] : (%s, tensor<f32>) -> %s\n", l, l, out,
        ty(co, -1, "f32"));
    if (l == 0)
        return;
    put(t, "    %%ckr%d = stablehlo.reverse %%ck%d, dims = [0, 1] : %s\n", l, l,
        ty4(3, 3, ci, co));
    put(t, "    %%dcp%d = stablehlo.convolution(%%dca%d, %%ckr%d) dim_numbers = "
           "[b, 0, 1, f]x[0, 1, o, i]->[b, 0, 1, f], " CONV_ATTRS " : (%s, %s) -> %s\n",
        l - 1, l, l, out, ty4(3, 3, ci, co), ty4(n, h, w, ci));
}

char *ps_hlo_cnn_step(int h, int w, int c, const int cw[3], int nclasses, int batch,
                      char *err, size_t errlen)
{
    const int v[] = {h, w, c, cw[0], cw[1], cw[2], nclasses, batch};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        if (v[i] < 1 || v[i] > MAX_DIM || (i < 2 && v[i] < 4)) {
            if (err != NULL && errlen > 0)
                snprintf(err, errlen, "a CNN step needs images of at least 4x4 and "
                         "sizes in [1, %d], got %d", MAX_DIM, v[i]);
            return NULL;
        }
    }
    struct cnn g = {.n = batch, .h = {h, h / 2, h / 4}, .w = {w, w / 2, w / 4},
                    .c = {c, cw[0], cw[1]}};
    int flat = g.h[2] * g.w[2] * g.c[2];
    int dw[3] = {flat, cw[2], nclasses};
    struct text t = {.s = malloc(8192), .cap = 8192};
    t.nomem = t.s == NULL;
    cnn_signature(&t, &g, dw);
    cnn_forward(&t, &g, 0);
    cnn_forward(&t, &g, 1);
    put(&t, "    %%flat = stablehlo.reshape %%cp1 : (%s) -> %s\n",
        ty4(batch, g.h[2], g.w[2], g.c[2]), ty(batch, flat, "f32"));
    forward(&t, dw, 2, batch, "%flat");
    loss(&t, 2, batch, nclasses);
    backward(&t, dw, 2, batch, "%flat", true);
    put(&t, "    %%dcp1 = stablehlo.reshape %%dflat : (%s) -> %s\n",
        ty(batch, flat, "f32"), ty4(batch, g.h[2], g.w[2], g.c[2]));
    cnn_backward(&t, &g, 1);
    cnn_backward(&t, &g, 0);
    char types[256];
    snprintf(types, sizeof types, "%s, %s, %s, %s, ", ty4(3, 3, c, cw[0]),
             ty(cw[0], -1, "f32"), ty4(3, 3, cw[0], cw[1]), ty(cw[1], -1, "f32"));
    ret(&t, dw, 2, "%gck0, %gcb0, %gck1, %gcb1, ", types);
    return finish(&t, err, errlen);
}
