/*
 * backend_cpu.c - the CPU reference backend: backend.h's table filled with
 * OpenBLAS GEMMs and plain loops, in the order and under the names
 * (cpu_<slot>) that backend_cuda.cu follows with cuda_<slot>.
 *
 * The elementwise loops below are written for the vectorizer: restrict
 * pointers, no branch in the body (the ternaries become masks or max), one
 * output per iteration. worker/meson.build builds this file at -O3, where
 * GCC 12 vectorizes loops of unknown trip count, and VECTOR_CLONES
 * (common/simd.h) adds an AVX2 clone of each. Before this, the scalar ReLU
 * loops alone took a quarter of an MLP step, their data-dependent branch
 * mispredicted half the time.
 */
#include "worker/backend.h"

#include "worker/softmax_row.h"

#include "common/simd.h"

#include "ps_config.h"

#if PS_HAVE_BLAS
#include <cblas.h>
#endif
#include "common/log.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Host allocations are 64-byte aligned, a cache line and an AVX-512
 * vector, so OpenBLAS's packing and the loops never straddle lines at the
 * start of a buffer. */
#define CPU_ALIGN 64

static void *cpu_alloc(const struct ps_backend *be, size_t bytes)
{
    size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    if (rounded < bytes)
        return NULL;
    return aligned_alloc(CPU_ALIGN, rounded);
}

static void cpu_free(const struct ps_backend *be, void *p)
{
    free(p);
}

static void cpu_copy(const struct ps_backend *be, void *dst, const void *src,
                     size_t bytes)
{
    if (dst != src)
        memcpy(dst, src, bytes);
}

static void cpu_zero(const struct ps_backend *be, void *p, size_t bytes)
{
    memset(p, 0, bytes);
}

static int cpu_sync(const struct ps_backend *be, char *err, size_t errlen)
{
    return 0;
}

#if PS_HAVE_BLAS
/*
 * Row-major GEMM straight through to OpenBLAS, which runs it as the
 * column-major product of the transposes. The model's calls are NN (forward),
 * TN (kernel gradient) and NT (input gradient); OpenBLAS packs both operands
 * of all three, so none is a slow path. Measured with one thread on a
 * Sapphire Rapids core (OpenBLAS 0.3.21, SkylakeX kernels) at the shapes of
 * mlp:784-256-256-10, batch 64: NN 129-141 GFLOP/s, TN 145-151, NT 119;
 * storing kernels transposed to run the forward as NT would be slower (117).
 */
static void cpu_gemm(const struct ps_backend *be, bool trans_a, bool trans_b,
                     int m, int n, int k, float alpha, const float *a,
                     int lda, const float *b, int ldb, float beta, float *c,
                     int ldc)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
                b, ldb, beta, c, ldc);
}
#else
/*
 * The portable GEMM of a build without BLAS (-Dblas=disabled): the same
 * row-major contract as cblas_sgemm, correct for every transpose, and some
 * ten times slower than OpenBLAS at the MLP's shapes. With B untransposed
 * the inner loop runs along a row of B and C (vectorized at -O3); with B
 * transposed it is a dot product along rows of A and B.
 */
VECTOR_CLONES
static void cpu_gemm(const struct ps_backend *be, bool trans_a, bool trans_b,
                     int m, int n, int k, float alpha, const float *a,
                     int lda, const float *b, int ldb, float beta, float *c,
                     int ldc)
{
    for (int i = 0; i < m; i++) {
        float *restrict ci = c + (size_t)i * (size_t)ldc;
        for (int j = 0; j < n; j++)
            ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
        for (int p = 0; p < k && !trans_b; p++) {
            float aip = alpha * (trans_a ? a[(size_t)p * (size_t)lda + (size_t)i]
                                         : a[(size_t)i * (size_t)lda + (size_t)p]);
            const float *restrict bp = b + (size_t)p * (size_t)ldb;
            for (int j = 0; j < n; j++)
                ci[j] += aip * bp[j];
        }
        for (int j = 0; j < n && trans_b; j++) {
            const float *bj = b + (size_t)j * (size_t)ldb;
            float sum = 0.0f;
            for (int p = 0; p < k; p++)
                sum += (trans_a ? a[(size_t)p * (size_t)lda + (size_t)i]
                                : a[(size_t)i * (size_t)lda + (size_t)p]) * bj[p];
            ci[j] += alpha * sum;
        }
    }
}
#endif

VECTOR_CLONES
static void cpu_bias_add(const struct ps_backend *be, float *restrict y,
                         const float *restrict bias, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        float *restrict row = y + (size_t)r * (size_t)cols;
        for (int j = 0; j < cols; j++)
            row[j] += bias[j];
    }
}

/* Row by row, so that the inner loop runs along memory and vectorizes; each
 * column's sum is taken in row order, as a GEMV with a ones vector would. */
VECTOR_CLONES
static void cpu_bias_grad(const struct ps_backend *be, float *restrict db,
                          const float *restrict dy, int rows, int cols)
{
    memset(db, 0, (size_t)cols * sizeof *db);
    for (int r = 0; r < rows; r++) {
        const float *restrict row = dy + (size_t)r * (size_t)cols;
        for (int j = 0; j < cols; j++)
            db[j] += row[j];
    }
}

VECTOR_CLONES
static void relu_copy(float *restrict y, const float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

VECTOR_CLONES
static void relu_inplace(float *restrict v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] = v[i] > 0.0f ? v[i] : 0.0f;
}

/* The in-place call gets its own loop: with y == x the restrict loop would
 * be undefined, and a loop without restrict is versioned on an overlap test
 * that in-place data fails, falling back to scalar code. */
static void cpu_relu_forward(const struct ps_backend *be, float *y,
                             const float *x, size_t n)
{
    if (y == x)
        relu_inplace(y, n);
    else
        relu_copy(y, x, n);
}

VECTOR_CLONES
static void relu_grad_copy(float *restrict dx, const float *restrict dy,
                           const float *restrict y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

VECTOR_CLONES
static void relu_grad_inplace(float *restrict d, const float *restrict y,
                              size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = y[i] > 0.0f ? d[i] : 0.0f;
}

static void cpu_relu_backward(const struct ps_backend *be, float *dx,
                              const float *dy, const float *y, size_t n)
{
    if (dx == dy)
        relu_grad_inplace(dx, y, n);
    else
        relu_grad_copy(dx, dy, y, n);
}

VECTOR_CLONES
static void cpu_axpy(const struct ps_backend *be, float *restrict y,
                     float alpha, const float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

/* The exponentials are taken in double around the row maximum: no overflow
 * for any finite logits, and a loss exact to float rounding, which keeps the
 * finite-difference checks of the tests tight. */
static void cpu_softmax_xent(const struct ps_backend *be, const float *logits,
                             const int32_t *labels, int batch, int nclasses,
                             float *losses, int32_t *pred, float *dlogits,
                             float dscale)
{
    for (int b = 0; b < batch; b++)
        ps_softmax_xent_row(logits + (size_t)b * (size_t)nclasses, labels[b], nclasses,
                            &losses[b], pred != NULL ? &pred[b] : NULL,
                            dlogits != NULL ? dlogits + (size_t)b * (size_t)nclasses : NULL,
                            dscale);
}

/*
 * One output pixel's taps of kernel row ki are kw * c contiguous floats in
 * col and, where they fall inside the image, kw * c contiguous floats in x
 * (the kernel columns cover consecutive pixels of one image row): so each
 * kernel row is one copy with zeros at the borders, not one libc call per
 * tap, which for the first conv's single channel copied 4 bytes a call.
 */
static void cpu_im2col(const struct ps_backend *be,
                       const struct ps_conv_geom *g, const float *x,
                       float *col)
{
    size_t c = (size_t)g->c, k = (size_t)g->kh * (size_t)g->kw * c;
    size_t kwc = (size_t)g->kw * c;
    for (int n = 0; n < g->batch; n++) {
        for (int oy = 0; oy < g->oh; oy++) {
            for (int ox = 0; ox < g->ow; ox++) {
                float *row = col + (((size_t)n * (size_t)g->oh + (size_t)oy) *
                                        (size_t)g->ow + (size_t)ox) * k;
                int ix0 = ox * g->stride - g->pad;
                /* Kernel columns [lo, hi) land inside the image. */
                int lo = ix0 < 0 ? -ix0 : 0;
                int hi = g->w - ix0 < g->kw ? g->w - ix0 : g->kw;
                for (int ki = 0; ki < g->kh; ki++) {
                    int iy = oy * g->stride - g->pad + ki;
                    float *dst = row + (size_t)ki * kwc;
                    if (iy < 0 || iy >= g->h || hi <= lo) {
                        memset(dst, 0, kwc * sizeof *dst);
                        continue;
                    }
                    const float *src =
                        x + (((size_t)n * (size_t)g->h + (size_t)iy) *
                                 (size_t)g->w + (size_t)(ix0 + lo)) * c;
                    memset(dst, 0, (size_t)lo * c * sizeof *dst);
                    memcpy(dst + (size_t)lo * c, src,
                           (size_t)(hi - lo) * c * sizeof *dst);
                    memset(dst + (size_t)hi * c, 0,
                           (size_t)(g->kw - hi) * c * sizeof *dst);
                }
            }
        }
    }
}

VECTOR_CLONES
static void add_into(float *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

/* Each pixel's sum is taken in the order of the output positions (oy, ox)
 * that cover it, the order the CUDA kernel reproduces. */
static void cpu_col2im(const struct ps_backend *be,
                       const struct ps_conv_geom *g, const float *dcol,
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
                        add_into(dx + (((size_t)n * (size_t)g->h +
                                        (size_t)iy) * (size_t)g->w +
                                       (size_t)ix) * c,
                                 row + ((size_t)ki * (size_t)g->kw +
                                        (size_t)kj) * c,
                                 c);
                    }
                }
            }
        }
    }
}

static void cpu_maxpool_forward(const struct ps_backend *be, int batch, int h,
                                int w, int c, const float *x, float *y,
                                int32_t *argmax)
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

static void cpu_maxpool_backward(const struct ps_backend *be, int batch,
                                 int h, int w, int c, const float *dy,
                                 const int32_t *argmax, float *dx)
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
    .host_memory = true,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
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

#if PS_HAVE_BLAS
/* OpenBLAS's core names by the widest kernels they use; a name not here
 * ranks 0 (Prescott, Core2, Nehalem, ...). Compared without case, as
 * OPENBLAS_CORETYPE is. */
static int core_rank(const char *name)
{
    static const struct {
        const char *name;
        int rank;
    } ranks[] = {{"sandybridge", 1}, {"haswell", 2},    {"zen", 2},
                 {"skylakex", 3},    {"cooperlake", 3}, {"sapphirerapids", 3}};
    for (size_t i = 0; name != NULL && i < sizeof ranks / sizeof ranks[0]; i++)
        if (strcasecmp(name, ranks[i].name) == 0)
            return ranks[i].rank;
    return 0;
}
#endif

void ps_backend_cpu_pick_core(char **argv)
{
#if PS_HAVE_BLAS && defined(__x86_64__)
    if (getenv("OPENBLAS_CORETYPE") != NULL)
        return;
    __builtin_cpu_init();
    const char *want = NULL;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        want = "Haswell";
    else if (__builtin_cpu_supports("avx"))
        want = "Sandybridge";
    const char *got = openblas_get_corename();
    if (want == NULL || core_rank(got) >= core_rank(want))
        return;
    ps_log_info("OpenBLAS took this CPU for a %s; its %s kernels instead "
                "(OPENBLAS_CORETYPE=%s)", got ? got : "(unknown)", want, want);
    if (setenv("OPENBLAS_CORETYPE", want, 1) != 0)
        return;
    execv("/proc/self/exe", argv);
    ps_log_warn("could not start again with OPENBLAS_CORETYPE=%s (%s); GEMMs run "
                "on OpenBLAS's %s kernels", want, strerror(errno), got ? got : "default");
    unsetenv("OPENBLAS_CORETYPE");
#else
    (void)argv;
#endif
}

void ps_backend_cpu_set_threads(int n)
{
#if PS_HAVE_BLAS
    openblas_set_num_threads(n >= 1 ? n : openblas_get_num_procs());
#else
    (void)n; /* the portable GEMM runs on the calling thread */
#endif
}
