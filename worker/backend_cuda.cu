/*
 * backend_cuda.cu - the CUDA backend: the CPU backend's table (backend.h)
 * filled with cuBLAS GEMMs and small kernels, cuda_<slot> beside
 * backend_cpu.c's cpu_<slot>, in the same order.
 *
 * One backend per device, created on first use and kept until the process
 * exits. It owns one stream, one cuBLAS handle bound to it, and a vector of
 * ones for the bias gradients; every kernel and copy is queued on that
 * stream in call order, so the model's steps need no synchronization of
 * their own until results come back to the host. CUDA errors are not
 * returned by the kernels (the table's kernels never fail): the first one
 * is kept and reported, with where it happened, by the next sync.
 *
 * Each kernel is the CPU reference's loop with the loop indices turned into
 * threads, and keeps the reference's order of operations where that is
 * cheap (pooling's comparisons, col2im's summation order, softmax in
 * double), so the gpu test suite can hold most kernels to exact equality.
 * CUDA headers stay in this file; the rest of the code sees backend.h.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "worker/backend.h"
#include "worker/softmax_row.h"
#include "common/errors.h"
#include "worker/gpu.h"
}

#define MAX_DEVICES 16
#define THREADS 256
/* Grid-stride loops cover any size with at most this many blocks. */
#define MAX_BLOCKS 65535
/* bias_grad sums rows in chunks of the ones vector's length. */
#define ONES_LEN (1 << 20)

struct cuda_state {
    int dev;
    cudaStream_t stream;
    cublasHandle_t blas;
    float *ones; /* (ONES_LEN) all 1, for bias_grad's GEMV */
    char name[16];
    /* The first error since the last sync, and the call it came from. */
    pthread_mutex_t lock;
    int err;
    char errmsg[160];
};

static struct cuda_state *state(const struct ps_backend *be)
{
    return (struct cuda_state *)be->state;
}

static void record(struct cuda_state *s, const char *where, const char *what)
{
    pthread_mutex_lock(&s->lock);
    if (s->err == 0) {
        s->err = PS_ECUDA;
        snprintf(s->errmsg, sizeof s->errmsg, "%s: %s", where, what);
    }
    pthread_mutex_unlock(&s->lock);
}

static void check(struct cuda_state *s, cudaError_t e, const char *where)
{
    if (e != cudaSuccess)
        record(s, where, cudaGetErrorString(e));
}

static void check_blas(struct cuda_state *s, cublasStatus_t st,
                       const char *where)
{
    if (st != CUBLAS_STATUS_SUCCESS)
        record(s, where, cublasGetStatusString(st));
}

/* Makes the backend's device current in the calling thread: a replica
 * thread may never have touched CUDA, and its current device is 0. */
static struct cuda_state *enter(const struct ps_backend *be)
{
    struct cuda_state *s = state(be);
    check(s, cudaSetDevice(s->dev), "cudaSetDevice");
    return s;
}

/* Launch geometry of a grid-stride loop over n elements. */
static unsigned blocks_for(size_t n)
{
    size_t b = (n + THREADS - 1) / THREADS;
    if (b < 1)
        b = 1;
    return (unsigned)(b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

#define LAUNCHED(s, name) check((s), cudaGetLastError(), name)

/* ---- Memory ------------------------------------------------------------ */

static void *cuda_alloc(const struct ps_backend *be, size_t bytes)
{
    enter(be);
    void *p = NULL;
    /* cudaMalloc's alignment is 256 bytes. A failure here is not sticky and
     * is the caller's to report, so it is not recorded. */
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_free(const struct ps_backend *be, void *p)
{
    if (p == NULL)
        return;
    struct cuda_state *s = enter(be);
    check(s, cudaFree(p), "cudaFree");
}

static void cuda_upload(const struct ps_backend *be, void *dst,
                        const void *src, size_t bytes)
{
    struct cuda_state *s = enter(be);
    /* From pageable memory the runtime stages src before returning, so
     * the caller may reuse it at once. */
    check(s, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                             s->stream), "upload");
}

static void cuda_download(const struct ps_backend *be, void *dst,
                          const void *src, size_t bytes)
{
    struct cuda_state *s = enter(be);
    check(s, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                             s->stream), "download");
    check(s, cudaStreamSynchronize(s->stream), "download");
}

static void cuda_zero(const struct ps_backend *be, void *p, size_t bytes)
{
    struct cuda_state *s = enter(be);
    check(s, cudaMemsetAsync(p, 0, bytes, s->stream), "zero");
}

static int cuda_sync(const struct ps_backend *be, char *err, size_t errlen)
{
    struct cuda_state *s = enter(be);
    check(s, cudaStreamSynchronize(s->stream), "sync");
    pthread_mutex_lock(&s->lock);
    int rc = s->err;
    if (rc != 0 && err != NULL && errlen > 0)
        snprintf(err, errlen, "%s", s->errmsg);
    s->err = 0;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* ---- Kernels ----------------------------------------------------------- */

/*
 * Row-major C = op(A) op(B) is, read column-major, C^T = op(B)^T op(A)^T:
 * the same call with the operands swapped and m, n exchanged, each operand
 * keeping its own transpose flag and leading dimension.
 */
static void cuda_gemm(const struct ps_backend *be, bool trans_a, bool trans_b,
                      int m, int n, int k, float alpha, const float *a,
                      int lda, const float *b, int ldb, float beta, float *c,
                      int ldc)
{
    struct cuda_state *s = enter(be);
    check_blas(s, cublasSgemm(s->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                              &alpha, b, ldb, a, lda, &beta, c, ldc),
               "gemm");
}

static __global__ void k_bias_add(float *y, const float *bias, size_t n,
                                  int cols)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % (size_t)cols];
}

static void cuda_bias_add(const struct ps_backend *be, float *y,
                          const float *bias, int rows, int cols)
{
    struct cuda_state *s = enter(be);
    size_t n = (size_t)rows * (size_t)cols;
    k_bias_add<<<blocks_for(n), THREADS, 0, s->stream>>>(y, bias, n, cols);
    LAUNCHED(s, "bias_add");
}

/* db = dy^T ones, a GEMV (row-major dy is column-major dy^T), in chunks of
 * ONES_LEN rows accumulated with beta = 1. */
static void cuda_bias_grad(const struct ps_backend *be, float *db,
                           const float *dy, int rows, int cols)
{
    struct cuda_state *s = enter(be);
    const float one = 1.0f;
    if (rows == 0) {
        check(s, cudaMemsetAsync(db, 0, (size_t)cols * sizeof *db,
                                 s->stream), "bias_grad");
        return;
    }
    for (int r = 0; r < rows; r += ONES_LEN) {
        int chunk = rows - r < ONES_LEN ? rows - r : ONES_LEN;
        const float beta = r == 0 ? 0.0f : 1.0f;
        check_blas(s, cublasSgemv(s->blas, CUBLAS_OP_N, cols, chunk, &one,
                                  dy + (size_t)r * (size_t)cols, cols,
                                  s->ones, 1, &beta, db, 1),
                   "bias_grad");
    }
}

static __global__ void k_relu_forward(float *y, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void cuda_relu_forward(const struct ps_backend *be, float *y,
                              const float *x, size_t n)
{
    struct cuda_state *s = enter(be);
    k_relu_forward<<<blocks_for(n), THREADS, 0, s->stream>>>(y, x, n);
    LAUNCHED(s, "relu_forward");
}

static __global__ void k_relu_backward(float *dx, const float *dy,
                                       const float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static void cuda_relu_backward(const struct ps_backend *be, float *dx,
                               const float *dy, const float *y, size_t n)
{
    struct cuda_state *s = enter(be);
    k_relu_backward<<<blocks_for(n), THREADS, 0, s->stream>>>(dx, dy, y, n);
    LAUNCHED(s, "relu_backward");
}

/* Not cublasSaxpy: its n is an int, and parameter blocks may be longer. */
static __global__ void k_axpy(float *y, float alpha, const float *x,
                              size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += alpha * x[i];
}

static void cuda_axpy(const struct ps_backend *be, float *y, float alpha,
                      const float *x, size_t n)
{
    struct cuda_state *s = enter(be);
    k_axpy<<<blocks_for(n), THREADS, 0, s->stream>>>(y, alpha, x, n);
    LAUNCHED(s, "axpy");
}

/* One thread per example, in double as the CPU reference: the class count
 * is small (tens), and the batch gives the parallelism. */
static __global__ void k_softmax_xent(const float *logits,
                                      const int32_t *labels, int batch,
                                      int nclasses, float *losses,
                                      int32_t *pred, float *dlogits,
                                      float dscale)
{
    for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < batch;
         b += gridDim.x * blockDim.x)
        ps_softmax_xent_row(logits + (size_t)b * (size_t)nclasses, labels[b], nclasses,
                            &losses[b], pred != NULL ? &pred[b] : NULL,
                            dlogits != NULL ? dlogits + (size_t)b * (size_t)nclasses : NULL,
                            dscale);
}

static void cuda_softmax_xent(const struct ps_backend *be,
                              const float *logits, const int32_t *labels,
                              int batch, int nclasses, float *losses,
                              int32_t *pred, float *dlogits, float dscale)
{
    struct cuda_state *s = enter(be);
    int threads = 128;
    int blocks = (batch + threads - 1) / threads;
    if (batch < 1)
        return;
    k_softmax_xent<<<blocks, threads, 0, s->stream>>>(
        logits, labels, batch, nclasses, losses, pred, dlogits, dscale);
    LAUNCHED(s, "softmax_xent");
}

/* One thread per entry of col: its row is an output pixel, its column a
 * (ki, kj, channel) tap; consecutive threads read consecutive channels. */
static __global__ void k_im2col(struct ps_conv_geom g, const float *x,
                                float *col)
{
    size_t k = (size_t)g.kh * g.kw * g.c;
    size_t n = (size_t)g.batch * g.oh * g.ow * k;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / k, tap = i % k;
        int ch = (int)(tap % g.c), kj = (int)(tap / g.c % g.kw);
        int ki = (int)(tap / g.c / g.kw);
        int ox = (int)(row % g.ow), oy = (int)(row / g.ow % g.oh);
        size_t b = row / g.ow / g.oh;
        int iy = oy * g.stride - g.pad + ki, ix = ox * g.stride - g.pad + kj;
        col[i] = iy < 0 || iy >= g.h || ix < 0 || ix >= g.w
                     ? 0.0f
                     : x[((b * g.h + iy) * g.w + ix) * g.c + ch];
    }
}

static void cuda_im2col(const struct ps_backend *be,
                        const struct ps_conv_geom *g, const float *x,
                        float *col)
{
    struct cuda_state *s = enter(be);
    size_t n = (size_t)g->batch * g->oh * g->ow * g->kh * g->kw * g->c;
    k_im2col<<<blocks_for(n), THREADS, 0, s->stream>>>(*g, x, col);
    LAUNCHED(s, "im2col");
}

/*
 * One thread per pixel of dx, gathering the patch entries that came from it
 * (no atomics, so the result does not depend on scheduling). The CPU
 * reference adds them in increasing output position (oy, ox); oy =
 * (iy + pad - ki) / stride grows as ki falls, so the taps are visited from
 * the last to the first, giving the same sums bit for bit.
 */
static __global__ void k_col2im(struct ps_conv_geom g, const float *dcol,
                                float *dx)
{
    size_t k = (size_t)g.kh * g.kw * g.c;
    size_t n = (size_t)g.batch * g.h * g.w * g.c;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ch = (int)(i % g.c), ix = (int)(i / g.c % g.w);
        int iy = (int)(i / g.c / g.w % g.h);
        size_t b = i / g.c / g.w / g.h;
        float sum = 0.0f;
        for (int ki = g.kh - 1; ki >= 0; ki--) {
            int ty = iy + g.pad - ki;
            if (ty < 0 || ty % g.stride != 0 || ty / g.stride >= g.oh)
                continue;
            int oy = ty / g.stride;
            for (int kj = g.kw - 1; kj >= 0; kj--) {
                int tx = ix + g.pad - kj;
                if (tx < 0 || tx % g.stride != 0 || tx / g.stride >= g.ow)
                    continue;
                int ox = tx / g.stride;
                size_t row = (b * g.oh + oy) * g.ow + ox;
                sum += dcol[row * k + ((size_t)ki * g.kw + kj) * g.c + ch];
            }
        }
        dx[i] = sum;
    }
}

static void cuda_col2im(const struct ps_backend *be,
                        const struct ps_conv_geom *g, const float *dcol,
                        float *dx)
{
    struct cuda_state *s = enter(be);
    size_t n = (size_t)g->batch * g->h * g->w * g->c;
    k_col2im<<<blocks_for(n), THREADS, 0, s->stream>>>(*g, dcol, dx);
    LAUNCHED(s, "col2im");
}

/* One thread per output; the window is compared in the reference's order
 * so ties go to the same (first) element. */
static __global__ void k_maxpool_forward(int batch, int h, int w, int c,
                                  const float *x, float *y, int32_t *argmax)
{
    int oh = h / 2, ow = w / 2;
    size_t n = (size_t)batch * oh * ow * c;
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < n;
         o += (size_t)gridDim.x * blockDim.x) {
        int ch = (int)(o % c), ox = (int)(o / c % ow);
        int oy = (int)(o / c / ow % oh), b = (int)(o / c / ow / oh);
        int32_t p00 = ((b * h + 2 * oy) * w + 2 * ox) * c + ch;
        int32_t p01 = p00 + c, p10 = p00 + w * c, p11 = p10 + c;
        int32_t best = p00;
        if (x[p01] > x[best])
            best = p01;
        if (x[p10] > x[best])
            best = p10;
        if (x[p11] > x[best])
            best = p11;
        y[o] = x[best];
        argmax[o] = best;
    }
}

static void cuda_maxpool_forward(const struct ps_backend *be, int batch,
                                 int h, int w, int c, const float *x,
                                 float *y, int32_t *argmax)
{
    struct cuda_state *s = enter(be);
    size_t n = (size_t)batch * (h / 2) * (w / 2) * c;
    if (n == 0)
        return;
    k_maxpool_forward<<<blocks_for(n), THREADS, 0, s->stream>>>(
        batch, h, w, c, x, y, argmax);
    LAUNCHED(s, "maxpool_forward");
}

/* The 2x2 stride-2 windows do not overlap: each input takes at most one
 * output's gradient, so a plain store after the zeroing suffices. */
static __global__ void k_maxpool_backward(size_t n, const float *dy,
                                   const int32_t *argmax, float *dx)
{
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < n;
         o += (size_t)gridDim.x * blockDim.x)
        dx[argmax[o]] = dy[o];
}

static void cuda_maxpool_backward(const struct ps_backend *be, int batch,
                                  int h, int w, int c, const float *dy,
                                  const int32_t *argmax, float *dx)
{
    struct cuda_state *s = enter(be);
    size_t nin = (size_t)batch * h * w * c;
    size_t nout = (size_t)batch * (h / 2) * (w / 2) * c;
    check(s, cudaMemsetAsync(dx, 0, nin * sizeof *dx, s->stream),
          "maxpool_backward");
    if (nout == 0)
        return;
    k_maxpool_backward<<<blocks_for(nout), THREADS, 0, s->stream>>>(
        nout, dy, argmax, dx);
    LAUNCHED(s, "maxpool_backward");
}

static __global__ void k_fill(float *p, float v, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

/* ---- Creation ---------------------------------------------------------- */

static pthread_mutex_t backends_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ps_backend *backends[MAX_DEVICES];

/* The one-line reason for a failed set-up call: "out of memory" when the
 * device (or the host, for cuBLAS) ran out, else the library's text. */
static void reason(char *err, size_t errlen, int dev, bool oom,
                   const char *what)
{
    if (err == NULL || errlen == 0)
        return;
    if (oom)
        snprintf(err, errlen, "cuda:%d: out of memory (%s)", dev, what);
    else
        snprintf(err, errlen, "cuda:%d: %s", dev, what);
}

/*
 * Sets up device dev: its stream, cuBLAS handle and ones vector. Called once
 * per device under backends_lock. Returns the backend, or NULL with the
 * reason, having released whatever it had made.
 */
static struct ps_backend *create(int dev, char *err, size_t errlen)
{
    struct ps_backend *be = (struct ps_backend *)calloc(1, sizeof *be);
    struct cuda_state *s = (struct cuda_state *)calloc(1, sizeof *s);
    cudaError_t e;
    cublasStatus_t st;
    if (be == NULL || s == NULL) {
        reason(err, errlen, dev, true, "host memory for the backend");
        goto free_structs;
    }
    s->dev = dev;
    snprintf(s->name, sizeof s->name, "cuda:%d", dev);
    pthread_mutex_init(&s->lock, NULL);
    if ((e = cudaSetDevice(dev)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) !=
            cudaSuccess) {
        reason(err, errlen, dev, e == cudaErrorMemoryAllocation,
               cudaGetErrorString(e));
        goto free_structs;
    }
    if ((st = cublasCreate(&s->blas)) != CUBLAS_STATUS_SUCCESS) {
        reason(err, errlen, dev, st == CUBLAS_STATUS_ALLOC_FAILED,
               cublasGetStatusString(st));
        goto destroy_stream;
    }
    /* Default math: full FP32 GEMMs, no TF32, so the CPU comparison holds
     * to float rounding. */
    if ((st = cublasSetStream(s->blas, s->stream)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetMathMode(s->blas, CUBLAS_DEFAULT_MATH)) !=
            CUBLAS_STATUS_SUCCESS) {
        reason(err, errlen, dev, false, cublasGetStatusString(st));
        goto destroy_blas;
    }
    if ((e = cudaMalloc(&s->ones, ONES_LEN * sizeof(float))) != cudaSuccess) {
        reason(err, errlen, dev, e == cudaErrorMemoryAllocation,
               "cudaMalloc of the backend's 4 MiB");
        (void)cudaGetLastError();
        goto destroy_blas;
    }
    k_fill<<<blocks_for(ONES_LEN), THREADS, 0, s->stream>>>(s->ones, 1.0f,
                                                           ONES_LEN);
    if ((e = cudaGetLastError()) != cudaSuccess ||
        (e = cudaStreamSynchronize(s->stream)) != cudaSuccess) {
        /* Typically a binary without code for this GPU's architecture. */
        reason(err, errlen, dev, false, cudaGetErrorString(e));
        goto free_ones;
    }

    be->name = s->name;
    be->host_memory = false;
    be->state = s;
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->upload = cuda_upload;
    be->download = cuda_download;
    be->zero = cuda_zero;
    be->sync = cuda_sync;
    be->gemm = cuda_gemm;
    be->bias_add = cuda_bias_add;
    be->bias_grad = cuda_bias_grad;
    be->relu_forward = cuda_relu_forward;
    be->relu_backward = cuda_relu_backward;
    be->axpy = cuda_axpy;
    be->softmax_xent = cuda_softmax_xent;
    be->im2col = cuda_im2col;
    be->col2im = cuda_col2im;
    be->maxpool_forward = cuda_maxpool_forward;
    be->maxpool_backward = cuda_maxpool_backward;
    return be;

free_ones:
    cudaFree(s->ones);
destroy_blas:
    cublasDestroy(s->blas);
destroy_stream:
    cudaStreamDestroy(s->stream);
free_structs:
    free(s);
    free(be);
    return NULL;
}

extern "C" const struct ps_backend *ps_backend_cuda(int device, char *err,
                                                    size_t errlen)
{
    int count;
    char why[200];
    if (ps_gpu_probe(&count, why, sizeof why) != 0) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "%s", why);
        return NULL;
    }
    if (device < 0 || device >= count || device >= MAX_DEVICES) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "cuda:%d does not exist (%d device%s)",
                     device, count, count == 1 ? "" : "s");
        return NULL;
    }
    pthread_mutex_lock(&backends_lock);
    if (backends[device] == NULL)
        backends[device] = create(device, err, errlen);
    struct ps_backend *be = backends[device];
    pthread_mutex_unlock(&backends_lock);
    return be;
}
