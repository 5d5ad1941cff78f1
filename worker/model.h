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
 * All math goes through a struct ps_backend: a table of the dozen kernels the
 * models need. ps_backend_cpu is the reference implementation (OpenBLAS for
 * the GEMMs, plain loops for the rest). A CUDA backend fills the same table
 * with kernels of the same names, so both can live in one binary and a test
 * can run each kernel on both and compare (llm.c's dev/cuda idiom).
 *
 * Threads and lifetime: a ps_model is not thread-safe; give each replica
 * thread its own. Its scratch buffers are sized at creation for max_batch
 * examples and reused, so a training step allocates nothing. Pointers from
 * ps_model_params, ps_model_grads and ps_model_param_info stay valid until
 * ps_model_destroy. The CPU kernels are reentrant; OpenBLAS's thread count is
 * process-wide (ps_backend_cpu_set_threads).
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
 * The compute kernels. Pointers are in the backend's memory (host memory
 * for the CPU backend, device memory for a GPU one). Matrices are row-major.
 * None of them fails: arguments are validated by the model before they get
 * here.
 */
struct ps_backend {
    const char *name;
    /* c = alpha * op(a) @ op(b) + beta * c, op(x) = x or its transpose;
     * op(a) is (m, k), op(b) is (k, n), c is (m, n). */
    void (*gemm)(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta,
                 float *c, int ldc);
    /* y (rows, cols) += bias (cols) on every row. */
    void (*bias_add)(float *y, const float *bias, int rows, int cols);
    /* db (cols) = column sums of dy (rows, cols). */
    void (*bias_grad)(float *db, const float *dy, int rows, int cols);
    /* y = max(x, 0); y may be x. */
    void (*relu_forward)(float *y, const float *x, size_t n);
    /* dx = dy where y > 0, else 0; dx may be dy. */
    void (*relu_backward)(float *dx, const float *dy, const float *y,
                          size_t n);
    /* y += alpha * x (the local SGD step). */
    void (*axpy)(float *y, float alpha, const float *x, size_t n);
    /*
     * Softmax cross-entropy of logits (batch, nclasses) against labels,
     * computed stably (log-sum-exp around the row maximum). Writes each
     * example's loss to losses (batch); its argmax class to pred (batch)
     * unless pred is NULL; and unless dlogits is NULL, dlogits (batch,
     * nclasses) = dscale * (softmax - onehot), the gradient of
     * dscale * sum(losses).
     */
    void (*softmax_xent)(const float *logits, const int32_t *labels,
                         int batch, int nclasses, float *losses,
                         int32_t *pred, float *dlogits, float dscale);
    /* col (batch * oh * ow, kh * kw * c) = the patches of x (batch, h, w,
     * c), zeros where a tap falls in the padding. */
    void (*im2col)(const struct ps_conv_geom *g, const float *x, float *col);
    /* dx (batch, h, w, c) = the adjoint of im2col applied to dcol: each
     * patch entry summed back into the pixel it came from. Overwrites dx. */
    void (*col2im)(const struct ps_conv_geom *g, const float *dcol,
                   float *dx);
    /* 2x2 max-pool, stride 2, no padding (a last odd row or column is
     * dropped, as TensorFlow's VALID): x (batch, h, w, c) -> y (batch, h/2,
     * w/2, c); argmax (same shape as y) gets the index into x of each
     * maximum, the first one on ties. */
    void (*maxpool_forward)(int batch, int h, int w, int c, const float *x,
                            float *y, int32_t *argmax);
    /* dx (batch, h, w, c) = dy routed to the argmax positions, 0 elsewhere. */
    void (*maxpool_backward)(int batch, int h, int w, int c, const float *dy,
                             const int32_t *argmax, float *dx);
};

/* The CPU reference backend. */
extern const struct ps_backend ps_backend_cpu;

/* Sets the number of threads OpenBLAS uses for the CPU backend's GEMMs
 * (process-wide; n < 1 means one per core). */
void ps_backend_cpu_set_threads(int n);

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

void ps_model_destroy(ps_model *m);

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

/* Total parameter floats, and the blocks that hold them. */
size_t ps_model_nparams(const ps_model *m);
float *ps_model_params(ps_model *m);
float *ps_model_grads(ps_model *m);

/* The parameter tensors, in block order; NULL when i is out of range. */
int ps_model_param_count(const ps_model *m);
const struct ps_param_info *ps_model_param_info(const ps_model *m, int i);

/* Draws every tensor from its initializer, for local training. Tensor i's
 * values depend only on (seed, i), so any host can reproduce them; they are
 * not the bits psd's own initializer draws for the same spec, so in
 * distributed training create the variables on the server from
 * ps_model_param_info and pull them instead. */
void ps_model_init_params(ps_model *m, uint64_t seed);

/*
 * One training step's math: forward on x (batch, input) and y (batch), then
 * backward, writing the gradient of the mean loss over the batch into the
 * gradient block (overwritten, not accumulated). *loss_out (may be NULL)
 * gets that mean loss. Returns 0; PS_EINVAL_ARG when batch is outside
 * [1, max_batch] or a label is outside [0, nclasses); the reason is then in
 * ps_model_errmsg.
 */
int ps_model_forward_backward(ps_model *m, const float *x, const int32_t *y,
                              int batch, float *loss_out);

/*
 * Mean loss and accuracy over n examples, run in chunks of max_batch, with
 * no gradient work. Either output may be NULL. Returns 0 or PS_EINVAL_ARG
 * (n < 1, a label out of range; see ps_model_errmsg).
 */
int ps_model_evaluate(ps_model *m, const float *x, const int32_t *y, int64_t n,
                      float *loss, float *accuracy);

/* params -= lr * grads: a local SGD step, for tests and single-process
 * training. */
void ps_model_sgd_step(ps_model *m, float lr);

/* The reason for the last failed call on m ("" if none); valid until the
 * next call on m. */
const char *ps_model_errmsg(const ps_model *m);

#endif
