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

/* h0 = x; z_l = h_l W_l + b_l; h_{l+1} = max(z_l, 0) but for the last. */
static void forward(struct text *t, const int *w, int nl, int batch)
{
    for (int l = 0; l < nl; l++) {
        const char *in = ty(batch, w[l], "f32"), *out = ty(batch, w[l + 1], "f32");
        char src[16];
        snprintf(src, sizeof src, l == 0 ? "%%x" : "%%h%d", l);
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

/* From d_l = d loss / d z_l down: the kernel and bias gradients, and
 * through each ReLU to d_{l-1}. */
static void backward(struct text *t, const int *w, int nl, int batch)
{
    for (int l = nl - 1; l >= 0; l--) {
        const char *dl = ty(batch, w[l + 1], "f32"), *hl = ty(batch, w[l], "f32");
        char src[16];
        snprintf(src, sizeof src, l == 0 ? "%%x" : "%%h%d", l);
        put(t, "    %%gw%d = stablehlo.dot_general %s, %%d%d, contracting_dims = [0] x [0]"
               " : (%s, %s) -> %s\n", l, src, l, hl, dl, ty(w[l], w[l + 1], "f32"));
        put(t, "    %%gb%d = stablehlo.reduce(%%d%d init: %%zero) applies stablehlo.add "
               "across dimensions = [0] : (%s, tensor<f32>) -> %s\n", l, l, dl,
            ty(w[l + 1], -1, "f32"));
        if (l == 0)
            break;
        put(t, "    %%dh%d = stablehlo.dot_general %%d%d, %%w%d, contracting_dims = [1] x [1]"
               " : (%s, %s) -> %s\n", l, l, l, dl, ty(w[l], w[l + 1], "f32"), hl);
        put(t, "    %%pos%d = stablehlo.compare GT, %%h%d, %%zeros%d : (%s, %s) -> %s\n",
            l, l, l, hl, hl, ty(batch, w[l], "i1"));
        put(t, "    %%d%d = stablehlo.select %%pos%d, %%dh%d, %%zeros%d : %s, %s\n",
            l - 1, l, l, l, ty(batch, w[l], "i1"), hl);
    }
    put(t, "    return ");
    for (int l = 0; l < nl; l++)
        put(t, "%%gw%d, %%gb%d, ", l, l);
    put(t, "%%loss : ");
    for (int l = 0; l < nl; l++)
        put(t, "%s, %s, ", ty(w[l], w[l + 1], "f32"), ty(w[l + 1], -1, "f32"));
    put(t, "tensor<f32>\n  }\n}\n");
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
    forward(&t, widths, nl, batch);
    loss(&t, nl, batch, widths[nl]);
    backward(&t, widths, nl, batch);
    if (t.nomem) {
        free(t.s);
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "out of memory building the step's text");
        return NULL;
    }
    return t.s;
}
