/*
 * hlo_gen.h - the training step of a dense model (softmax regression, the
 * MLP) and of the CNN as a StableHLO module in MLIR text, generated from the
 * layer sizes, for backends that compile whole programs
 * (worker/backend_pjrt.c).
 *
 * The module's one function, @main, takes the model's tensors in block order
 * (model.h: dense0/kernel (in, out), dense0/bias (out), dense1/kernel, ...),
 * then x (batch, widths[0]) f32 and y (batch) i32, and returns the gradient
 * of each tensor in the same order, then the mean softmax cross-entropy over
 * the batch, a scalar f32: the math of ps_model_forward_backward on the CPU
 * backend (ReLU between dense layers, the loss stabilized around each row's
 * maximum, gradients of the mean loss).
 *
 * Threads and lifetime: pure string building, reentrant; the text is the
 * caller's to free.
 */
#ifndef PS_WORKER_HLO_GEN_H
#define PS_WORKER_HLO_GEN_H

#include <stddef.h>

/* The most dense layers a generated step holds (model.c's MLP limit). */
#define PS_HLO_MAX_LAYERS 16

/*
 * The training step for dense widths[0..nwidths) (nwidths - 1 layers, 1 to
 * PS_HLO_MAX_LAYERS) and a batch of `batch` examples. Returns the module
 * text (malloc'd, NUL-terminated), or NULL with a one-line reason in err
 * (may be NULL): a width or the batch outside [1, 2^24], too many layers,
 * out of memory.
 */
char *ps_hlo_dense_step(const int *widths, int nwidths, int batch, char *err,
                        size_t errlen);

/*
 * The training step of model.h's CNN on (h, w, c) images: conv 3x3 pad 1
 * (cw[0]) -> ReLU -> 2x2 max-pool -> conv (cw[1]) -> ReLU -> pool -> dense
 * (cw[2]) -> ReLU -> dense (nclasses). Its arguments are conv0/kernel
 * (3, 3, c, cw[0]), conv0/bias, conv1/kernel, conv1/bias, dense0/kernel,
 * dense0/bias, dense1/kernel, dense1/bias, then x (batch, h, w, c) and y
 * (batch); its results their gradients and the loss. NULL with a reason
 * as ps_hlo_dense_step (images under 4x4 too).
 */
char *ps_hlo_cnn_step(int h, int w, int c, const int cw[3], int nclasses,
                      int batch, char *err, size_t errlen);

#endif
