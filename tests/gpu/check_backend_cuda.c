/*
 * check_backend_cuda - the CUDA backend against the CPU reference, kernel by
 * kernel and for whole training steps (llm.c's check_tensor idiom).
 *
 * Where no CUDA device answers (no driver, no GPU, a build without CUDA) it
 * prints the probe's reason and exits 77, which meson reports as SKIP.
 *
 * Tolerances, each stated where it is checked:
 *   - exact: bias_add, relu forward and backward, im2col, col2im (the
 *     kernel sums in the reference's order), maxpool forward (values and
 *     argmax) and backward, softmax's predictions, every memory operation,
 *     and GEMMs and bias gradients whose inputs are small integers (every
 *     partial sum exact in float, so the order of summation cannot matter:
 *     this pins down transposes, leading dimensions and chunking);
 *   - GEMM on random floats, K up to 1024, with op(b) scaled by 1/sqrt(K)
 *     as trained weights are: |gpu - cpu| <= 1e-4 * max(1, |cpu|);
 *   - bias gradient on random floats: |gpu - cpu| <= (rows - 1) * 2^-24 *
 *     sum|dy| over the column, the worst-case error bound of a float sum in
 *     any order (Higham), which both sides meet;
 *   - softmax cross-entropy (double inside on both): losses and dlogits
 *     within 1e-6 * max(1, |cpu|);
 *   - axpy and the SGD step: within 1e-6 * max(1, |cpu|), as the GPU may
 *     fuse the multiply-add that the CPU build rounds twice;
 *   - whole models: loss within 1e-5 * max(1, |loss|), every gradient
 *     within 1e-4 of its tensor's largest gradient (see model_check for why
 *     that bound is safe).
 *
 * The runner does not fork (CK_NOFORK): a CUDA context does not survive
 * fork, and the probe in main already made one.
 */
#include "common/errors.h"
#include "worker/gpu.h"
#include "worker/model.h"
#include "tests/unit/model_cases.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SKIP 77

static const struct ps_backend *cpu = &ps_backend_cpu;
static const struct ps_backend *gpu;
static char errbuf[512];

/* ---- Helpers ----------------------------------------------------------- */

static float *randf(size_t n, double lo, double hi)
{
    float *p = malloc(n * sizeof *p);
    ck_assert_ptr_nonnull(p);
    fill(p, n, lo, hi);
    return p;
}

/* Small integers in [lo, hi]: sums of a few thousand stay exact. */
static float *randint(size_t n, int lo, int hi)
{
    float *p = malloc(n * sizeof *p);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(lo + (int)(urand() * (hi - lo + 1)));
    return p;
}

/* bytes of device memory holding a copy of host, or uninitialized when
 * host is NULL. */
static void *dev_from(const void *host, size_t bytes)
{
    void *d = gpu->alloc(gpu, bytes);
    ck_assert_ptr_nonnull(d);
    if (host != NULL)
        gpu->upload(gpu, d, host, bytes);
    return d;
}

/* A fresh host copy of n bytes of device memory, after a clean sync. */
static void *host_from(const void *dev, size_t bytes)
{
    void *h = malloc(bytes > 0 ? bytes : 1);
    ck_assert_ptr_nonnull(h);
    gpu->download(gpu, h, dev, bytes);
    ck_assert_msg(gpu->sync(gpu, errbuf, sizeof errbuf) == 0, "%s", errbuf);
    return h;
}

/* Exact equality, element by element (== so that -0 equals 0). */
static void expect_same(const char *what, const float *got, const float *want,
                        size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == want[i], "%s[%zu]: cuda %.9g, cpu %.9g", what,
                      i, got[i], want[i]);
}

static void expect_same_int(const char *what, const int32_t *got,
                            const int32_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == want[i], "%s[%zu]: cuda %d, cpu %d", what, i,
                      (int)got[i], (int)want[i]);
}

/* |got - want| <= tol * max(1, |want|) everywhere; prints the worst. */
static void expect_close(const char *what, const float *got,
                         const float *want, size_t n, double tol)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]) / fmax(1.0, fabs(want[i]));
        ck_assert_msg(e <= tol, "%s[%zu]: cuda %.9g, cpu %.9g (%.2e > %.0e)",
                      what, i, got[i], want[i], e, tol);
        worst = e > worst ? e : worst;
    }
    fprintf(stderr, "%-40s %8zu values, worst %.2e (tolerance %.0e)\n", what,
            n, worst, tol);
}

/* ---- Memory ------------------------------------------------------------ */

START_TEST(test_memory)
{
    rng_state = 1;
    ck_assert(!gpu->host_memory);
    ck_assert_ptr_nonnull(strstr(gpu->name, "cuda:"));
    size_t n = 100003;
    float *h = randf(n, -1, 1);
    float *d = dev_from(h, n * sizeof *h);
    float *back = host_from(d, n * sizeof *h);
    expect_same("upload/download", back, h, n);
    free(back);
    gpu->zero(gpu, d + 10, 20 * sizeof *d);
    back = host_from(d, n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        ck_assert_float_eq(back[i], i >= 10 && i < 30 ? 0.0f : h[i]);
    free(back);
    gpu->free(gpu, d);
    gpu->free(gpu, NULL);
    /* An impossible allocation fails without poisoning the backend. */
    ck_assert_ptr_null(gpu->alloc(gpu, (size_t)1 << 60));
    ck_assert_int_eq(gpu->sync(gpu, errbuf, sizeof errbuf), 0);
    free(h);
}
END_TEST

START_TEST(test_sync_reports_errors)
{
    /* A GEMM with a leading dimension too small is refused by cuBLAS; the
     * kernel cannot fail, so the next sync reports it, once. */
    float *d = dev_from(NULL, 64 * sizeof(float));
    gpu->gemm(gpu, false, false, 4, 4, 4, 1.0f, d, 1, d, 4, 0.0f, d + 32, 4);
    ck_assert_int_eq(gpu->sync(gpu, errbuf, sizeof errbuf), PS_ECUDA);
    ck_assert_ptr_nonnull(strstr(errbuf, "gemm"));
    fprintf(stderr, "reported: %s\n", errbuf);
    ck_assert_int_eq(gpu->sync(gpu, errbuf, sizeof errbuf), 0);
    gpu->free(gpu, d);
}
END_TEST

START_TEST(test_backend_cuda)
{
    /* The same backend for the same device; a missing device by name. */
    ck_assert_ptr_eq(ps_backend_cuda(0, NULL, 0), gpu);
    int count;
    ck_assert_int_eq(ps_gpu_probe(&count, errbuf, sizeof errbuf), 0);
    ck_assert_ptr_null(ps_backend_cuda(count, errbuf, sizeof errbuf));
    ck_assert_ptr_nonnull(strstr(errbuf, "does not exist"));
}
END_TEST

/* ---- GEMM -------------------------------------------------------------- */

/*
 * op(a) (m, k) @ op(b) (k, n) on both backends with alpha 0.75, beta 0.5
 * and leading dimensions padded by pad, compared over c. integers: small
 * integer inputs and an exact comparison; else random floats with op(b)
 * scaled by 1/sqrt(k) and the relative bound.
 */
static void gemm_case(bool ta, bool tb, int m, int n, int k, int pad,
                      bool integers)
{
    int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int lda = ac + pad, ldb = bc + pad, ldc = n + pad;
    size_t na = (size_t)ar * lda, nb = (size_t)br * ldb, nc = (size_t)m * ldc;
    float *a, *b, *c;
    if (integers) {
        a = randint(na, -3, 3);
        b = randint(nb, -3, 3);
        c = randint(nc, -8, 8);
    } else {
        a = randf(na, -1, 1);
        b = randf(nb, -1, 1);
        c = randf(nc, -1, 1);
        for (size_t i = 0; i < nb; i++)
            b[i] /= sqrtf((float)k);
    }
    float *da = dev_from(a, na * sizeof *a), *db = dev_from(b, nb * sizeof *b);
    float *dc = dev_from(c, nc * sizeof *c);
    const float alpha = integers ? 1.0f : 0.75f, beta = integers ? 2.0f : 0.5f;
    cpu->gemm(cpu, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    gpu->gemm(gpu, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc);
    float *got = host_from(dc, nc * sizeof *got);
    char what[96];
    snprintf(what, sizeof what, "gemm %c%c m=%d n=%d k=%d pad=%d%s",
             ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, pad,
             integers ? " (int)" : "");
    if (integers)
        expect_same(what, got, c, nc);
    else
        expect_close(what, got, c, nc, 1e-4);
    free(got);
    gpu->free(gpu, da);
    gpu->free(gpu, db);
    gpu->free(gpu, dc);
    free(a);
    free(b);
    free(c);
}

START_TEST(test_gemm)
{
    rng_state = 2;
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        gemm_case(ta, tb, 37, 53, 61, 0, true);
        gemm_case(ta, tb, 17, 9, 300, 3, true);
        gemm_case(ta, tb, 1, 1, 1, 0, false);
        gemm_case(ta, tb, 37, 53, 61, 5, false);
        gemm_case(ta, tb, 64, 256, 784, 0, false);
        gemm_case(ta, tb, 256, 128, 1024, 0, false);
        gemm_case(ta, tb, 784, 256, 64, 0, false);
    }
}
END_TEST

/* ---- Elementwise kernels ----------------------------------------------- */

START_TEST(test_bias)
{
    rng_state = 3;
    const int shapes[3][2] = {{64, 256}, {3001, 37}, {1, 1}};
    for (int s = 0; s < 3; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        size_t n = (size_t)rows * cols;
        float *y = randf(n, -1, 1), *bias = randf((size_t)cols, -1, 1);
        float *dy = dev_from(y, n * sizeof *y);
        float *dbias = dev_from(bias, (size_t)cols * sizeof *bias);
        cpu->bias_add(cpu, y, bias, rows, cols);
        gpu->bias_add(gpu, dy, dbias, rows, cols);
        float *got = host_from(dy, n * sizeof *got);
        expect_same("bias_add", got, y, n);
        free(got);

        /* Column sums of random floats: the GEMV adds in another order, so
         * each side is within the worst-case bound of the exact sum. */
        float *g = malloc((size_t)cols * sizeof *g);
        float *dg = dev_from(NULL, (size_t)cols * sizeof *g);
        cpu->bias_grad(cpu, g, y, rows, cols);
        gpu->bias_grad(gpu, dg, dy, rows, cols);
        got = host_from(dg, (size_t)cols * sizeof *got);
        double worst = 0;
        for (int j = 0; j < cols; j++) {
            double abssum = 0;
            for (int r = 0; r < rows; r++)
                abssum += fabs(y[(size_t)r * cols + j]);
            double e = fabs((double)got[j] - g[j]);
            double tol = (rows - 1) * 0x1p-24 * abssum;
            ck_assert_msg(e <= tol, "bias_grad %dx%d [%d]: cuda %.9g, cpu "
                          "%.9g (tolerance %.3g)", rows, cols, j, got[j], g[j],
                          tol);
            worst = fmax(worst, tol > 0 ? e / tol : e);
        }
        fprintf(stderr, "bias_grad %dx%d: worst %.2f of the tolerance\n",
                rows, cols, worst);
        free(got);
        gpu->free(gpu, dg);
        free(g);
        gpu->free(gpu, dy);
        gpu->free(gpu, dbias);
        free(y);
        free(bias);
    }
}
END_TEST

START_TEST(test_bias_grad_chunks)
{
    /* More rows than the backend's ones vector (2^20), in integers so the
     * chunked sums are exact. */
    rng_state = 4;
    int rows = (1 << 20) + 4099, cols = 3;
    size_t n = (size_t)rows * cols;
    float *y = randint(n, -2, 2), g[3];
    float *dy = dev_from(y, n * sizeof *y);
    float *dg = dev_from(NULL, sizeof g);
    cpu->bias_grad(cpu, g, y, rows, cols);
    gpu->bias_grad(gpu, dg, dy, rows, cols);
    float *got = host_from(dg, sizeof g);
    expect_same("bias_grad chunked (int)", got, g, 3);
    free(got);
    gpu->free(gpu, dg);
    gpu->free(gpu, dy);
    free(y);
}
END_TEST

START_TEST(test_relu_axpy)
{
    rng_state = 5;
    size_t n = 300007;
    float *x = randf(n, -1, 1), *dy = randf(n, -1, 1);
    x[0] = -0.0f;
    x[1] = 0.0f;
    float *y = malloc(n * sizeof *y), *dx = malloc(n * sizeof *dx);
    float *d_x = dev_from(x, n * sizeof *x);
    float *d_dy = dev_from(dy, n * sizeof *dy);
    float *d_y = dev_from(NULL, n * sizeof *y);
    float *d_dx = dev_from(NULL, n * sizeof *dx);
    cpu->relu_forward(cpu, y, x, n);
    gpu->relu_forward(gpu, d_y, d_x, n);
    float *got = host_from(d_y, n * sizeof *got);
    expect_same("relu_forward", got, y, n);
    free(got);
    cpu->relu_backward(cpu, dx, dy, y, n);
    gpu->relu_backward(gpu, d_dx, d_dy, d_y, n);
    got = host_from(d_dx, n * sizeof *got);
    expect_same("relu_backward", got, dx, n);
    free(got);
    /* In place, as the contract allows. */
    cpu->relu_forward(cpu, x, x, n);
    gpu->relu_forward(gpu, d_x, d_x, n);
    got = host_from(d_x, n * sizeof *got);
    expect_same("relu_forward in place", got, x, n);
    free(got);
    cpu->relu_backward(cpu, dy, dy, x, n);
    gpu->relu_backward(gpu, d_dy, d_dy, d_x, n);
    got = host_from(d_dy, n * sizeof *got);
    expect_same("relu_backward in place", got, dy, n);
    free(got);
    /* y += alpha * x, fused or not. */
    float *p = randf(n, -1, 1), *g = randf(n, -1, 1);
    float *d_p = dev_from(p, n * sizeof *p), *d_g = dev_from(g, n * sizeof *g);
    cpu->axpy(cpu, p, -0.37f, g, n);
    gpu->axpy(gpu, d_p, -0.37f, d_g, n);
    got = host_from(d_p, n * sizeof *got);
    expect_close("axpy", got, p, n, 1e-6);
    free(got);
    gpu->free(gpu, d_p);
    gpu->free(gpu, d_g);
    gpu->free(gpu, d_x);
    gpu->free(gpu, d_dy);
    gpu->free(gpu, d_y);
    gpu->free(gpu, d_dx);
    free(p);
    free(g);
    free(x);
    free(dy);
    free(y);
    free(dx);
}
END_TEST

START_TEST(test_softmax_xent)
{
    rng_state = 6;
    const int shapes[3][2] = {{64, 10}, {300, 1000}, {3, 2}};
    for (int s = 0; s < 3; s++) {
        int batch = shapes[s][0], ncls = shapes[s][1];
        size_t n = (size_t)batch * ncls;
        float *l = randf(n, -20, 20);
        l[0] = 1e30f; /* no overflow in the log-sum-exp */
        int32_t *y = malloc((size_t)batch * sizeof *y);
        for (int i = 0; i < batch; i++)
            y[i] = (int32_t)(urand() * ncls);
        float *loss = malloc((size_t)batch * sizeof *loss);
        float *dl = malloc(n * sizeof *dl);
        int32_t *pred = malloc((size_t)batch * sizeof *pred);
        float *d_l = dev_from(l, n * sizeof *l);
        int32_t *d_y = dev_from(y, (size_t)batch * sizeof *y);
        float *d_loss = dev_from(NULL, (size_t)batch * sizeof *loss);
        float *d_dl = dev_from(NULL, n * sizeof *dl);
        int32_t *d_pred = dev_from(NULL, (size_t)batch * sizeof *pred);
        cpu->softmax_xent(cpu, l, y, batch, ncls, loss, pred, dl, 0.25f);
        gpu->softmax_xent(gpu, d_l, d_y, batch, ncls, d_loss, d_pred, d_dl,
                          0.25f);
        float *gl = host_from(d_loss, (size_t)batch * sizeof *gl);
        float *gd = host_from(d_dl, n * sizeof *gd);
        int32_t *gp = host_from(d_pred, (size_t)batch * sizeof *gp);
        ck_assert(isfinite(gl[0]));
        expect_close("softmax_xent losses", gl, loss, (size_t)batch, 1e-6);
        expect_close("softmax_xent dlogits", gd, dl, n, 1e-6);
        expect_same_int("softmax_xent pred", gp, pred, (size_t)batch);
        /* Losses only: pred and dlogits NULL. */
        gpu->softmax_xent(gpu, d_l, d_y, batch, ncls, d_loss, NULL, NULL, 0);
        free(gl);
        gl = host_from(d_loss, (size_t)batch * sizeof *gl);
        expect_close("softmax_xent losses only", gl, loss, (size_t)batch,
                     1e-6);
        free(gl);
        free(gd);
        free(gp);
        gpu->free(gpu, d_l);
        gpu->free(gpu, d_y);
        gpu->free(gpu, d_loss);
        gpu->free(gpu, d_dl);
        gpu->free(gpu, d_pred);
        free(l);
        free(y);
        free(loss);
        free(dl);
        free(pred);
    }
}
END_TEST

/* ---- Convolution and pooling ------------------------------------------- */

START_TEST(test_im2col_col2im)
{
    rng_state = 7;
    for (int t = 0; t < MODEL_CONV_GEOMS; t++) {
        const struct ps_conv_geom *g = &model_conv_geoms[t];
        size_t nx = (size_t)g->batch * g->h * g->w * g->c;
        size_t ncol = (size_t)g->batch * g->oh * g->ow * g->kh * g->kw * g->c;
        float *x = randf(nx, -1, 1), *col = malloc(ncol * sizeof *col);
        float *d_x = dev_from(x, nx * sizeof *x);
        float *d_col = dev_from(NULL, ncol * sizeof *col);
        cpu->im2col(cpu, g, x, col);
        gpu->im2col(gpu, g, d_x, d_col);
        float *got = host_from(d_col, ncol * sizeof *got);
        expect_same("im2col", got, col, ncol);
        free(got);
        float *r = randf(ncol, -1, 1), *dx = malloc(nx * sizeof *dx);
        float *d_r = dev_from(r, ncol * sizeof *r);
        cpu->col2im(cpu, g, r, dx);
        gpu->upload(gpu, d_x, x, nx * sizeof *x); /* garbage to overwrite */
        gpu->col2im(gpu, g, d_r, d_x);
        got = host_from(d_x, nx * sizeof *got);
        expect_same("col2im", got, dx, nx);
        fprintf(stderr, "im2col/col2im geometry %d: %zu and %zu values "
                "equal\n", t, ncol, nx);
        free(got);
        gpu->free(gpu, d_r);
        gpu->free(gpu, d_x);
        gpu->free(gpu, d_col);
        free(x);
        free(col);
        free(r);
        free(dx);
    }
}
END_TEST

START_TEST(test_maxpool)
{
    rng_state = 8;
    /* Even and odd sizes; integer values from a small set, so windows have
     * ties, which go to the first element on both. */
    const int shapes[3][4] = {{16, 28, 28, 32}, {3, 9, 7, 5}, {1, 2, 2, 1}};
    for (int s = 0; s < 3; s++) {
        int b = shapes[s][0], h = shapes[s][1], w = shapes[s][2];
        int c = shapes[s][3];
        size_t nx = (size_t)b * h * w * c;
        size_t ny = (size_t)b * (h / 2) * (w / 2) * c;
        float *x = randint(nx, -3, 3), *y = malloc(ny * sizeof *y);
        int32_t *am = malloc(ny * sizeof *am);
        float *d_x = dev_from(x, nx * sizeof *x);
        float *d_y = dev_from(NULL, ny * sizeof *y);
        int32_t *d_am = dev_from(NULL, ny * sizeof *am);
        cpu->maxpool_forward(cpu, b, h, w, c, x, y, am);
        gpu->maxpool_forward(gpu, b, h, w, c, d_x, d_y, d_am);
        float *gy = host_from(d_y, ny * sizeof *gy);
        int32_t *gam = host_from(d_am, ny * sizeof *gam);
        expect_same("maxpool_forward", gy, y, ny);
        expect_same_int("maxpool_forward argmax", gam, am, ny);
        float *dy = randf(ny, -1, 1), *dx = malloc(nx * sizeof *dx);
        float *d_dy = dev_from(dy, ny * sizeof *dy);
        cpu->maxpool_backward(cpu, b, h, w, c, dy, am, dx);
        gpu->maxpool_backward(gpu, b, h, w, c, d_dy, d_am, d_x);
        float *gdx = host_from(d_x, nx * sizeof *gdx);
        expect_same("maxpool_backward", gdx, dx, nx);
        free(gy);
        free(gam);
        free(gdx);
        gpu->free(gpu, d_x);
        gpu->free(gpu, d_y);
        gpu->free(gpu, d_am);
        gpu->free(gpu, d_dy);
        free(x);
        free(y);
        free(am);
        free(dy);
        free(dx);
    }
}
END_TEST

/* ---- Whole models ------------------------------------------------------ */

/*
 * Parameters and inputs on a coarse binary grid: inputs k/16 in [0, 1],
 * weights and biases in {-2, ..., 2}/8. Every forward product and partial
 * sum is then a float with few significant bits (the deepest layers of
 * these models need under 22), so the forward pass is exact on both
 * backends whatever the order of summation, and both take the same ReLU
 * masks and pooling argmaxes. With random floats a pre-activation within
 * rounding of zero would flip a mask on one side only and move single
 * gradient entries by a whole batch term, a difference of behaviour at a
 * tie, not an error. The backward starts from softmax gradients that are
 * arbitrary floats, so gradients are compared with a tolerance: 1e-4 of
 * the largest gradient of the same tensor.
 */
static void grid_params(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((int)(urand() * 5) - 2) / 8.0f;
}

static void model_check(const char *spec, int h, int w, int c, int ncls,
                        int max_batch, int batch)
{
    ps_model *mc, *mg;
    ck_assert_msg(ps_model_create(spec, h, w, c, ncls, max_batch, &mc, errbuf,
                                  sizeof errbuf) == 0, "%s", errbuf);
    ck_assert_msg(ps_model_create_on(gpu, spec, h, w, c, ncls, max_batch,
                                     &mg, errbuf, sizeof errbuf) == 0,
                  "%s", errbuf);
    ck_assert_ptr_eq(ps_model_backend(mg), gpu);
    size_t np = ps_model_nparams(mc), in = (size_t)h * w * c;
    ck_assert_uint_eq(ps_model_nparams(mg), np);
    grid_params(ps_model_params(mc), np);
    ck_assert_int_eq(ps_model_params_from_host(mg, ps_model_params(mc)), 0);

    float *x = malloc((size_t)batch * in * sizeof *x);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    for (size_t i = 0; i < (size_t)batch * in; i++)
        x[i] = (float)(int)(urand() * 17) / 16.0f;
    for (int i = 0; i < batch; i++)
        y[i] = (int32_t)(urand() * ncls);

    float lc, lg;
    ck_assert_int_eq(ps_model_forward_backward(mc, x, y, batch, &lc), 0);
    ck_assert_msg(ps_model_forward_backward(mg, x, y, batch, &lg) == 0, "%s",
                  ps_model_errmsg(mg));
    ck_assert_msg(fabs((double)lg - lc) <= 1e-5 * fmax(1.0, fabs(lc)),
                  "%s: loss cuda %.9g, cpu %.9g", spec, lg, lc);
    fprintf(stderr, "%s batch %d: loss cuda %.9g, cpu %.9g\n", spec, batch,
            lg, lc);
    float *g = malloc(np * sizeof *g);
    ck_assert_int_eq(ps_model_grads_to_host(mg, g), 0);
    const float *gc = ps_model_grads(mc);
    for (int t = 0; t < ps_model_param_count(mc); t++) {
        const struct ps_param_info *pi = ps_model_param_info(mc, t);
        double gmax = 0, worst = 0;
        for (size_t k = 0; k < pi->count; k++)
            gmax = fmax(gmax, fabs(gc[pi->offset + k]));
        for (size_t k = 0; k < pi->count; k++) {
            size_t i = pi->offset + k;
            /* A tensor whose gradient is all zero must stay so. */
            double e = gmax > 0 ? fabs((double)g[i] - gc[i]) / gmax
                                : fabs((double)g[i]);
            ck_assert_msg(e <= 1e-4, "%s: %s[%zu]: cuda %.9g, cpu %.9g "
                          "(largest %.3g)", spec, pi->name, k, g[i], gc[i],
                          gmax);
            worst = fmax(worst, e);
        }
        fprintf(stderr, "%s batch %d: %-14s %7zu gradients, worst %.2e of "
                "the largest (tolerance 1e-4)\n", spec, batch, pi->name,
                pi->count, worst);
    }

    /* Evaluation agrees too (same forward, so accuracy exactly). */
    float ec, eg, ac, ag;
    ck_assert_int_eq(ps_model_evaluate(mc, x, y, batch, &ec, &ac), 0);
    ck_assert_int_eq(ps_model_evaluate(mg, x, y, batch, &eg, &ag), 0);
    ck_assert_msg(fabs((double)eg - ec) <= 1e-5 * fmax(1.0, fabs(ec)),
                  "%s: evaluate loss cuda %.9g, cpu %.9g", spec, eg, ec);
    ck_assert_float_eq(ag, ac);

    /* One SGD step each from the same gradient: the same parameters. */
    ck_assert_int_eq(ps_model_grads_from_host(mg, gc), 0);
    ps_model_sgd_step(mc, 0.125f);
    ps_model_sgd_step(mg, 0.125f);
    ck_assert_int_eq(ps_model_params_to_host(mg, g), 0);
    expect_close("sgd step", g, ps_model_params(mc), np, 1e-6);

    free(g);
    free(x);
    free(y);
    ps_model_destroy(mc);
    ps_model_destroy(mg);
}

START_TEST(test_model_mlp)
{
    rng_state = 9;
    model_check("mlp:784-256-256-10", 28, 28, 1, 10, 64, 64);
    model_check("mlp:784-256-256-10", 28, 28, 1, 10, 64, 13);
    model_check("softmax", 28, 28, 1, 10, 32, 32);
}
END_TEST

START_TEST(test_model_cnn)
{
    rng_state = 10;
    model_check("cnn", 28, 28, 1, 10, 16, 16);
    model_check("cnn:3-4-6", 9, 7, 2, 3, 5, 4);
}
END_TEST

START_TEST(test_model_errors)
{
    ps_model *m;
    ck_assert_int_eq(ps_model_create_on(gpu, "mlp:6-4-3", 1, 1, 6, 3, 2, &m,
                                        errbuf, sizeof errbuf), 0);
    float x[18] = {0};
    int32_t y[3] = {0, 1, 5};
    ck_assert_int_eq(ps_model_forward_backward(m, x, y, 3, NULL),
                     PS_EINVAL_ARG);
    ck_assert_int_eq(ps_model_forward_backward(m, x, y, 2, NULL), 0);
    ck_assert_int_eq(ps_model_evaluate(m, x, y, 3, NULL, NULL), PS_EINVAL_ARG);
    ck_assert_ptr_nonnull(strstr(ps_model_errmsg(m), "label 5"));
    ps_model_destroy(m);
    /* A model too big for the device fails cleanly with -ENOMEM. */
    ck_assert_int_eq(ps_model_create_on(gpu, "mlp:1000000-100000-10", 1000,
                                        1000, 1, 10, 1, &m, errbuf,
                                        sizeof errbuf), -ENOMEM);
    fprintf(stderr, "too big: %s\n", errbuf);
    ck_assert_int_eq(gpu->sync(gpu, errbuf, sizeof errbuf), 0);
}
END_TEST

/* ---- Timing ------------------------------------------------------------ */

/* Median examples/s of a batch-64 MLP step (forward_backward + sgd_step)
 * over 7 runs of 50 steps; the CUDA step includes the upload of the batch
 * and the wait for its gradient, as a training loop sees it. */
static double step_rate(ps_model *m, const float *x, const int32_t *y)
{
    double r[7];
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(ps_model_forward_backward(m, x, y, 64, NULL), 0);
        ps_model_sgd_step(m, 0.01f);
    }
    for (int k = 0; k < 7; k++) {
        double t0 = now_s();
        for (int i = 0; i < 50; i++) {
            ck_assert_int_eq(ps_model_forward_backward(m, x, y, 64, NULL), 0);
            ps_model_sgd_step(m, 0.01f);
        }
        const struct ps_backend *be = ps_model_backend(m);
        ck_assert_int_eq(be->sync(be, NULL, 0), 0); /* the last SGD step */
        r[k] = 50.0 * 64 / (now_s() - t0);
    }
    for (int i = 1; i < 7; i++)
        for (int j = i; j > 0 && r[j] < r[j - 1]; j--) {
            double t = r[j];
            r[j] = r[j - 1];
            r[j - 1] = t;
        }
    return r[3];
}

START_TEST(test_timing)
{
    rng_state = 11;
    ps_model *mc, *mg;
    const char *spec = "mlp:784-256-256-10";
    ck_assert_int_eq(ps_model_create(spec, 28, 28, 1, 10, 64, &mc, NULL, 0),
                     0);
    ck_assert_int_eq(ps_model_create_on(gpu, spec, 28, 28, 1, 10, 64, &mg,
                                        NULL, 0), 0);
    ps_model_init_params(mc, 1);
    ps_model_init_params(mg, 1);
    float *x = randf(64 * 784, 0, 1);
    int32_t y[64];
    for (int i = 0; i < 64; i++)
        y[i] = i % 10;
    double rc = step_rate(mc, x, y), rg = step_rate(mg, x, y);
    fprintf(stderr, "%s batch 64 step: cpu (1 OpenBLAS thread) %.0f "
            "examples/s, %s %.0f examples/s (%.1fx)\n", spec, rc, gpu->name,
            rg, rg / rc);
    free(x);
    ps_model_destroy(mc);
    ps_model_destroy(mg);
}
END_TEST

static TCase *tcase(Suite *s, const char *name, int timeout)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, timeout);
    suite_add_tcase(s, tc);
    return tc;
}

int main(void)
{
    int count;
    char reason[256];
    if (ps_gpu_probe(&count, reason, sizeof reason) != 0) {
        printf("SKIP: no CUDA device to test: %s\n", reason);
        return SKIP;
    }
    gpu = ps_backend_cuda(0, reason, sizeof reason);
    if (gpu == NULL) {
        /* A device answered but the backend cannot run on it: a failure,
         * not a skip (an architecture the build has no code for, say). */
        printf("FAIL: %d device(s) answer, but the CUDA backend does not "
               "start: %s\n", count, reason);
        return EXIT_FAILURE;
    }
    char name[256];
    size_t mem = 0;
    if (ps_gpu_describe(0, name, sizeof name, &mem, reason,
                        sizeof reason) == 0)
        fprintf(stderr, "testing %s on %s, %.1f GiB\n", gpu->name, name,
                (double)mem / (1 << 30));
    ps_backend_cpu_set_threads(1);

    Suite *s = suite_create("backend_cuda");
    TCase *tc = tcase(s, "memory", 60);
    tcase_add_test(tc, test_memory);
    tcase_add_test(tc, test_sync_reports_errors);
    tcase_add_test(tc, test_backend_cuda);
    tc = tcase(s, "gemm", 120);
    tcase_add_test(tc, test_gemm);
    tc = tcase(s, "elementwise", 60);
    tcase_add_test(tc, test_bias);
    tcase_add_test(tc, test_bias_grad_chunks);
    tcase_add_test(tc, test_relu_axpy);
    tcase_add_test(tc, test_softmax_xent);
    tc = tcase(s, "conv", 60);
    tcase_add_test(tc, test_im2col_col2im);
    tcase_add_test(tc, test_maxpool);
    tc = tcase(s, "model", 120);
    tcase_add_test(tc, test_model_mlp);
    tcase_add_test(tc, test_model_cnn);
    tcase_add_test(tc, test_model_errors);
    tc = tcase(s, "timing", 120);
    tcase_add_test(tc, test_timing);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
