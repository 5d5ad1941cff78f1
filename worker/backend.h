/*
 * backend.h - the compute backends the models run on: one table of memory
 * operations and kernels, one file per backend.
 *
 * A struct ps_backend holds the memory operations and the dozen kernels the
 * models need (worker/model.c calls nothing else). Each backend is one file
 * that fills the table with static functions named <backend>_<slot>, in the
 * order of the table:
 *   backend_cpu.c    ps_backend_cpu, the reference (OpenBLAS for the GEMMs,
 *                    vectorized loops for the rest); always built;
 *   backend_cuda.cu  ps_backend_cuda(device), the same kernels on a GPU
 *                    (cuBLAS for the GEMMs); built when nvcc is found;
 *   backend_nocuda.c ps_backend_cuda in a build without CUDA: NULL and the
 *                    reason;
 *   backend_pjrt.c   ps_backend_pjrt(plugin, device), a PJRT plugin's device
 *                    (libtpu, XLA's CPU plugin) dlopened at run time: the
 *                    whole training step as one compiled program (the step slots below), the rest on the host
 *                    with the CPU kernels; always built.
 * All of them link into one binary, so a test can run each kernel on two
 * backends and compare (llm.c's dev/cuda idiom, tests/gpu). A further
 * backend is one more file of the same shape and one constructor here;
 * workerd chooses among them at run time (--device, worker/train.c
 * pick_backends).
 *
 * Threads and lifetime: the CPU kernels are reentrant; OpenBLAS's thread
 * count is process-wide (ps_backend_cpu_set_threads). A CUDA backend is one
 * stream on one device, shared by every model created on it: calls from
 * several threads are safe but queue behind each other, and a sync waits
 * for all of them. A PJRT plugin is loaded once per process with one
 * client; its devices' backends may run steps from several threads at once
 * (the PJRT C API is thread-safe), and a compile holds a lock so that each
 * shape compiles once. Backends live until the process exits.
 */
#ifndef PS_WORKER_BACKEND_H
#define PS_WORKER_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Geometry of a 2-D convolution over a batch of NHWC images. The im2col
 * matrix has one row per output pixel, (batch * oh * ow) rows, and one
 * column per kernel tap, (kh * kw * c) columns ordered (ki, kj, channel), to
 * match a (kh, kw, c, out) kernel seen as a (kh * kw * c, out) matrix. */
struct ps_conv_geom {
    int batch, h, w, c;       /* input */
    int kh, kw, pad, stride;  /* kernel; zero padding on every side */
    int oh, ow;               /* output: (h + 2 * pad - kh) / stride + 1, ... */
};

/* A model as a whole-step backend sees it (model.c fills it; unused fields
 * zero): the dense models by their widths, the CNN by its image and its
 * widths (conv0, conv1, dense, classes). */
#define PS_STEP_MAX_WIDTHS 17
struct ps_step_net {
    bool cnn;
    int h, w, c;                        /* cnn: the input images */
    int widths[PS_STEP_MAX_WIDTHS];
    int nwidths;
};

/*
 * A compute backend. Pointers given to its kernels are in the backend's
 * memory (host memory for the CPU backend, device memory for a GPU one;
 * host_memory says which) and every function takes the backend itself first,
 * for its state. Matrices are row-major. On a device backend, kernels and
 * copies are queued in call order and run asynchronously: errors are kept
 * and reported by the next sync. None of the kernels fails: arguments are
 * validated by the model before they get here.
 */
struct ps_backend {
    const char *name;  /* "cpu", "cuda:0" */
    bool host_memory;  /* the backend's pointers are host memory */
    void *state;       /* the backend's own (a device's handles) */

    /* ---- Memory ---- */
    /* bytes (> 0) of backend memory, 64-byte aligned, contents undefined;
     * NULL when out of memory. */
    void *(*alloc)(const struct ps_backend *be, size_t bytes);
    /* Frees what alloc returned; NULL does nothing. Waits for queued work. */
    void (*free)(const struct ps_backend *be, void *p);
    /* Host src -> backend dst. src may be reused when this returns. */
    void (*upload)(const struct ps_backend *be, void *dst, const void *src,
                   size_t bytes);
    /* Backend src -> host dst, after the work queued before it; dst holds
     * the data when this returns (unless the next sync reports an error). */
    void (*download)(const struct ps_backend *be, void *dst, const void *src,
                     size_t bytes);
    /* bytes of backend memory at p = 0. */
    void (*zero)(const struct ps_backend *be, void *p, size_t bytes);
    /* Waits for everything queued so far. Returns 0, or PS_ECUDA with a
     * one-line reason in err (may be NULL) for the first error since the
     * last sync. */
    int (*sync)(const struct ps_backend *be, char *err, size_t errlen);

    /* ---- Kernels ---- */
    /* c = alpha * op(a) @ op(b) + beta * c, op(x) = x or its transpose;
     * op(a) is (m, k), op(b) is (k, n), c is (m, n). */
    void (*gemm)(const struct ps_backend *be, bool trans_a, bool trans_b,
                 int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc);
    /* y (rows, cols) += bias (cols) on every row. */
    void (*bias_add)(const struct ps_backend *be, float *y, const float *bias,
                     int rows, int cols);
    /* db (cols) = column sums of dy (rows, cols). */
    void (*bias_grad)(const struct ps_backend *be, float *db, const float *dy,
                      int rows, int cols);
    /* y = max(x, 0); y may be x. */
    void (*relu_forward)(const struct ps_backend *be, float *y,
                         const float *x, size_t n);
    /* dx = dy where y > 0, else 0; dx may be dy. */
    void (*relu_backward)(const struct ps_backend *be, float *dx,
                          const float *dy, const float *y, size_t n);
    /* y += alpha * x (the local SGD step). */
    void (*axpy)(const struct ps_backend *be, float *y, float alpha,
                 const float *x, size_t n);
    /*
     * Softmax cross-entropy of logits (batch, nclasses) against labels,
     * computed stably (log-sum-exp around the row maximum). Writes each
     * example's loss to losses (batch); its argmax class to pred (batch)
     * unless pred is NULL; and unless dlogits is NULL, dlogits (batch,
     * nclasses) = dscale * (softmax - onehot), the gradient of
     * dscale * sum(losses).
     */
    void (*softmax_xent)(const struct ps_backend *be, const float *logits,
                         const int32_t *labels, int batch, int nclasses,
                         float *losses, int32_t *pred, float *dlogits,
                         float dscale);
    /* col (batch * oh * ow, kh * kw * c) = the patches of x (batch, h, w,
     * c), zeros where a tap falls in the padding. g is host memory. */
    void (*im2col)(const struct ps_backend *be, const struct ps_conv_geom *g,
                   const float *x, float *col);
    /* dx (batch, h, w, c) = the adjoint of im2col applied to dcol: each
     * patch entry summed back into the pixel it came from. Overwrites dx. */
    void (*col2im)(const struct ps_backend *be, const struct ps_conv_geom *g,
                   const float *dcol, float *dx);
    /* 2x2 max-pool, stride 2, no padding (a last odd row or column is
     * dropped, as TensorFlow's VALID): x (batch, h, w, c) -> y (batch, h/2,
     * w/2, c); argmax (same shape as y) gets the index into x of each
     * maximum, the first one on ties. */
    void (*maxpool_forward)(const struct ps_backend *be, int batch, int h,
                            int w, int c, const float *x, float *y,
                            int32_t *argmax);
    /* dx (batch, h, w, c) = dy routed to the argmax positions, 0 elsewhere. */
    void (*maxpool_backward)(const struct ps_backend *be, int batch, int h,
                             int w, int c, const float *dy,
                             const int32_t *argmax, float *dx);

    /* ---- Whole-step programs (NULL on the kernel backends) ---- */
    /* A backend that compiles the whole training step (backend_pjrt.c) sets
     * these; its memory slots are then host memory behind host_memory =
     * false, and model.c hands ps_model_forward_backward to them. step_open
     * returns the
     * model's step (NULL with a one-line reason); step_params makes params
     * (host, nparams floats in block order) the values the step reads;
     * step_run computes the mean loss's gradient of batch (host x, y) into
     * grads (host) and the loss; both return 0 or PS_ENODEV with the
     * reason in err. */
    void *(*step_open)(const struct ps_backend *be,
                       const struct ps_step_net *net, char *err, size_t errlen);
    int (*step_params)(void *step, const float *params, char *err,
                       size_t errlen);
    int (*step_run)(void *step, const float *x, const int32_t *y, int batch,
                    float *grads, float *loss, char *err, size_t errlen);
    void (*step_close)(void *step);
};

/* The CPU reference backend. */
extern const struct ps_backend ps_backend_cpu;

/* Sets the number of threads OpenBLAS uses for the CPU backend's GEMMs
 * (process-wide; n < 1 means one per core). */
void ps_backend_cpu_set_threads(int n);

/* Run-time dispatch of OpenBLAS's kernels, called first thing in main.
 * OpenBLAS (a DYNAMIC_ARCH build, Debian's) picks its kernels by the CPU's
 * family and model as the library loads, and takes a model it does not
 * know for a Prescott, with SSE3 kernels: Debian 12's 0.3.21 does so on a
 * 5th-generation Xeon (family 6 model 207). When OPENBLAS_CORETYPE is
 * unset and the kernels chosen are weaker than the CPU's features allow
 * (AVX-512 F/BW/VL/DQ: SkylakeX; AVX2 and FMA: Haswell; AVX: Sandybridge),
 * this sets OPENBLAS_CORETYPE and executes the program again with argv
 * (the same pid), once: the variable set, the next start keeps what it
 * says. Returns when nothing needs changing, in builds without BLAS, and
 * when the exec fails (logged). */
void ps_backend_cpu_pick_core(char **argv);

/*
 * The CUDA backend on device `device`, created on first use and kept until
 * the process exits (later calls return the same one). Returns NULL with a
 * one-line reason in err (may be NULL): the reason ps_gpu_probe gives ("no
 * CUDA driver", "no CUDA device", "CUDA support not compiled in" in builds
 * without CUDA), "cuda:N does not exist (M devices)", or "... out of memory"
 * when the device cannot hold the backend's handles.
 */
const struct ps_backend *ps_backend_cuda(int device, char *err,
                                         size_t errlen);

/*
 * The PJRT backends (backend_pjrt.c). ps_pjrt_plugin_path turns a --device
 * value into a plugin path: "pjrt:PATH" is PATH; "tpu" is TPU_LIBRARY_PATH
 * or libtpu/libtpu.so of the pip package `libtpu` (a virtualenv's, the
 * user's or the system's site-packages); else PS_EINVAL_ARG or PS_ENODEV
 * with the reason. ps_pjrt_open loads the plugin (once per process; later
 * calls with the same path return at once) and returns its addressable
 * device count (>= 1), or PS_ENODEV with one line in err: the file missing,
 * not a shared library, without GetPjrtApi, of another PJRT C API major
 * version, the plugin's own error (initialize, client), no device.
 * ps_backend_pjrt is device `device` of that plugin (NULL and the reason).
 * ps_pjrt_compile_seconds: time spent compiling steps so far.
 */
int ps_pjrt_plugin_path(const char *device, char *path, size_t pathlen,
                        char *err, size_t errlen);
int ps_pjrt_open(const char *path, char *err, size_t errlen);
const struct ps_backend *ps_backend_pjrt(const char *path, int device,
                                         char *err, size_t errlen);
double ps_pjrt_compile_seconds(void);

#endif
