/*
 * model.h - the models a worker trains, and the compute backend under them.
 *
 * Three classifiers, chosen by a spec string:
 *   "softmax"                softmax regression (one dense layer)
 *   "mlp:784-256-256-10"     dense layers with ReLU between; the first number
 *                            must be the input size, the last the classes
 *   "cnn" or "cnn:32-64-128" conv 3x3 (pad 1) -> ReLU -> maxpool 2x2 ->
 *                            conv 3x3 (pad 1) -> ReLU -> maxpool 2x2 ->
 *                            dense -> ReLU -> dense to the classes; the
 *                            numbers are the two conv widths and the hidden
 *                            dense width (default 32-64-128)
 * all trained with softmax cross-entropy. Inputs are float32 (batch, h, w, c),
 * channels last as in TensorFlow, labels int32 in [0, nclasses).
 *
 * Parameters live in one contiguous float block with a view per tensor (as
 * llm.c's malloc_and_point_parameters), gradients in a second block with the
 * same layout, so a push or pull of the whole model is one copy. Each tensor
 * has a name ("conv0/kernel", "dense1/bias"), a TensorFlow-layout shape
 * (dense kernels (in, out), conv kernels (kh, kw, in, out), biases (out)) and
 * an initializer, enough for the training loop to create the server's
 * variables from the model alone.
 *
 * All math goes through a struct ps_backend: a table of memory operations
 * and of the dozen kernels the models need. ps_backend_cpu is the reference
 * implementation (OpenBLAS for the GEMMs, vectorized loops for the rest).
 * ps_backend_cuda fills the same table with kernels of the same names on a
 * GPU (cuBLAS for the GEMMs), so both live in one binary and a test can run
 * each kernel on both and compare (llm.c's dev/cuda idiom). A model created
 * with ps_model_create_on keeps its parameters, gradients and scratch in its
 * backend's memory; inputs, labels and results always cross in host memory.
 *
 * Threads and lifetime: a ps_model is not thread-safe; give each replica
 * thread its own. Its scratch buffers are sized at creation for max_batch
 * examples and reused, so a training step allocates nothing. Pointers from
 * ps_model_params, ps_model_grads and ps_model_param_info stay valid until
 * ps_model_destroy. The CPU kernels are reentrant; OpenBLAS's thread count is
 * process-wide (ps_backend_cpu_set_threads). A CUDA backend is one stream on
 * one device, shared by every model created on it: calls from several
 * threads are safe but queue behind each other, and a sync waits for all of
 * them. Backends live until the process exits.
 */
#ifndef PS_WORKER_MODEL_H
#define PS_WORKER_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Backend ----------------------------------------------------------- */

/* Geometry of a 2-D convolution over a batch of NHWC images. The im2col
 * matrix has one row per output pixel, (batch * oh * ow) rows, and one
 * column per kernel tap, (kh * kw * c) columns ordered (ki, kj, channel), to
 * match a (kh, kw, c, out) kernel seen as a (kh * kw * c, out) matrix. */
struct ps_conv_geom {
    int batch, h, w, c;       /* input */
    int kh, kw, pad, stride;  /* kernel; zero padding on every side */
    int oh, ow;               /* output: (h + 2 * pad - kh) / stride + 1, ... */
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
};

/* The CPU reference backend. */
extern const struct ps_backend ps_backend_cpu;

/* Sets the number of threads OpenBLAS uses for the CPU backend's GEMMs
 * (process-wide; n < 1 means one per core). */
void ps_backend_cpu_set_threads(int n);

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

/* ---- Models ------------------------------------------------------------ */

typedef struct ps_model ps_model;

/* Initializers, numbered as ps.v1 Initializer.Kind so the training loop can
 * copy them into a CreateVariable request unchanged. */
enum ps_init_kind {
    PS_INIT_ZEROS = 0,
    PS_INIT_GLOROT_UNIFORM = 5, /* uniform on +-sqrt(6 / (fan_in + fan_out)) */
};

#define PS_PARAM_MAXDIM 4

struct ps_param_info {
    const char *name;               /* "dense0/kernel" */
    int ndim;
    int64_t shape[PS_PARAM_MAXDIM]; /* outermost first */
    size_t offset;                  /* first float in the param/grad blocks */
    size_t count;                   /* floats: the product of shape */
    enum ps_init_kind init;
    int64_t fan_in, fan_out;        /* as TensorFlow computes them */
};

/*
 * Builds the model named by spec for inputs of (in_h, in_w, in_c) and
 * nclasses classes, with scratch space for batches of up to max_batch
 * examples. Parameters start at zero: call ps_model_init_params or copy
 * values in. Returns 0; PS_EINVAL_ARG for an unknown or malformed spec or
 * a non-positive size; PS_ESHAPE when the spec does not fit the input or the
 * classes (an MLP whose first width is not in_h * in_w * in_c, a CNN on
 * images smaller than 4x4); -ENOMEM. err (may be NULL) gets a one-line
 * reason.
 */
int ps_model_create(const char *spec, int in_h, int in_w, int in_c,
                    int nclasses, int max_batch, ps_model **out, char *err,
                    size_t errlen);

/* The same, on backend be (ps_model_create is ps_model_create_on with
 * &ps_backend_cpu). The parameter and gradient blocks and all scratch live in
 * be's memory. Fails as ps_model_create, with -ENOMEM when be's memory is
 * short. */
int ps_model_create_on(const struct ps_backend *be, const char *spec,
                       int in_h, int in_w, int in_c, int nclasses,
                       int max_batch, ps_model **out, char *err,
                       size_t errlen);

void ps_model_destroy(ps_model *m);

/* The backend the model computes on. */
const struct ps_backend *ps_model_backend(const ps_model *m);

/* Checks that examples of shape (h, w, c) fit the model: the dense models
 * need h * w * c inputs, the CNN exactly (h, w, c). Returns 0 or PS_ESHAPE
 * with a one-line reason in err. */
int ps_model_check_input(const ps_model *m, int h, int w, int c, char *err,
                         size_t errlen);

/* The spec as given, the floats one example takes, the classes. */
const char *ps_model_spec(const ps_model *m);
size_t ps_model_input_size(const ps_model *m);
int ps_model_nclasses(const ps_model *m);
int ps_model_max_batch(const ps_model *m);

/* Total parameter floats, and the blocks that hold them, in the backend's
 * memory: the caller may read and write them directly only when
 * ps_model_backend(m)->host_memory; otherwise use the copies below. */
size_t ps_model_nparams(const ps_model *m);
float *ps_model_params(ps_model *m);
float *ps_model_grads(ps_model *m);

/*
 * Whole-block copies between the model and nparams floats of host memory,
 * for the training loop's pull (params_from_host), push (grads_to_host) and
 * the reverse directions. On the CPU backend each is one memcpy. Each waits
 * until the copy is done. Return 0, or the backend's error (PS_ECUDA) with
 * the reason in ps_model_errmsg.
 */
int ps_model_params_to_host(ps_model *m, float *dst);
int ps_model_params_from_host(ps_model *m, const float *src);
int ps_model_grads_to_host(ps_model *m, float *dst);
int ps_model_grads_from_host(ps_model *m, const float *src);

/*
 * Host backends only (PS_EINVAL_ARG otherwise): the model reads its
 * parameters from, or writes its gradients into, the caller's block of
 * nparams floats (64-byte aligned) instead of its own, until called again
 * (NULL: its own block). The block stays the caller's, who keeps it alive
 * while the model uses it. The training loop uses them to take a pulled
 * block and to write the gradient straight into the buffer a push sends,
 * with no copy of either.
 */
int ps_model_use_params(ps_model *m, float *block);
int ps_model_use_grads(ps_model *m, float *block);

/* The parameter tensors, in block order; NULL when i is out of range. */
int ps_model_param_count(const ps_model *m);
const struct ps_param_info *ps_model_param_info(const ps_model *m, int i);

/* Draws every tensor from its initializer, for local training (on a device
 * backend: drawn on the host and uploaded). Tensor i's
 * values depend only on (seed, i), so any host can reproduce them; they are
 * not the bits psd's own initializer draws for the same spec, so in
 * distributed training create the variables on the server from
 * ps_model_param_info and pull them instead. */
void ps_model_init_params(ps_model *m, uint64_t seed);

/*
 * One training step's math: forward on x (batch, input) and y (batch), then
 * backward, writing the gradient of the mean loss over the batch into the
 * gradient block (overwritten, not accumulated). *loss_out (may be NULL)
 * gets that mean loss. x and y are host memory on every backend; on a
 * device backend they are uploaded first, and the call returns when the
 * gradient is complete. Returns 0; PS_EINVAL_ARG when batch is outside
 * [1, max_batch] or a label is outside [0, nclasses); the backend's error
 * (PS_ECUDA); the reason is then in ps_model_errmsg.
 */
int ps_model_forward_backward(ps_model *m, const float *x, const int32_t *y,
                              int batch, float *loss_out);

/*
 * Mean loss and accuracy over n examples (host memory), run in chunks of
 * max_batch, with no gradient work. Either output may be NULL. Returns 0,
 * PS_EINVAL_ARG (n < 1, a label out of range) or the backend's error
 * (PS_ECUDA); see ps_model_errmsg.
 */
int ps_model_evaluate(ps_model *m, const float *x, const int32_t *y, int64_t n,
                      float *loss, float *accuracy);

/* params -= lr * grads: a local SGD step, for tests and single-process
 * training. On a device backend it is queued; the next call that returns a
 * result waits for it. */
void ps_model_sgd_step(ps_model *m, float lr);

/* The reason for the last failed call on m ("" if none); valid until the
 * next call on m. */
const char *ps_model_errmsg(const ps_model *m);

#endif
