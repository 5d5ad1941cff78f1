/*
 * model.h - the models a worker trains, on a compute backend (backend.h).
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
 * All math goes through a compute backend (backend.h): ps_model_create
 * uses the CPU reference, ps_model_create_on any backend. A model keeps its
 * parameters, gradients and scratch in its backend's memory; inputs, labels
 * and results always cross in host memory.
 *
 * Threads and lifetime: a ps_model is not thread-safe; give each replica
 * thread its own. Its scratch buffers are sized at creation for max_batch
 * examples and reused, so a training step allocates nothing. Pointers from
 * ps_model_params, ps_model_grads and ps_model_param_info stay valid until
 * ps_model_destroy. Models on one CUDA backend share its stream (backend.h).
 */
#ifndef PS_WORKER_MODEL_H
#define PS_WORKER_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/backend.h"

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
