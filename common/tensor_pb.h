/*
 * tensor_pb.h - tensors at the RPC edge: ps.v1.Tensor messages to and from
 * the in-process ps_tensor (tensor.h).
 *
 * Tensors arrive from the wire as Ps__V1__Tensor messages (raw little-endian
 * bytes + dtype + shape). ps_tensor_view_pb checks such a message and points
 * a ps_tensor at its bytes without copying: that is the hot path for pushes.
 * ps_tensor_from_pb makes an owned copy for when the message will not live
 * long enough; ps_tensor_to_pb describes a tensor for sending, again without
 * a copy. Only the files that speak protobuf include this header; the rest
 * of the code talks to tensor.h.
 *
 * Threads and lifetime: no function keeps state. A tensor from
 * ps_tensor_from_pb owns its data and is freed with ps_tensor_destroy. A view
 * from ps_tensor_view_pb owns nothing and is valid only while the message it
 * came from is alive and unchanged; a message filled by ps_tensor_to_pb is
 * valid only while its tensor is.
 */
#ifndef PS_TENSOR_PB_H
#define PS_TENSOR_PB_H

#include <stddef.h>

#include "proto/ps.pb-c.h"
#include "common/tensor.h"

/* Checks a wire tensor and fills *view to point at its bytes without copying
 * (view->owns is false). The checks: the message is present; the dtype is
 * float32 (PS_EDTYPE, naming the dtype, otherwise); the shape has at most
 * PS_TENSOR_MAX_DIMS dimensions, each >= 1, and its element count fits in
 * memory; the byte length is exactly numel * 4; the bytes are 4-byte aligned
 * (protobuf-c's unpack always allocates them so). Returns 0, PS_EDTYPE or
 * PS_EINVAL_ARG with one line in err, e.g. "tensor has 4000 bytes, shape
 * (1000, 2) float32 needs 8000". err may be NULL when errlen is 0. The view is
 * valid while pb is alive and unchanged. */
int ps_tensor_view_pb(const Ps__V1__Tensor *pb, ps_tensor *view, char *err,
                      size_t errlen);

/* The same checks as ps_tensor_view_pb, then an owned copy in *out. Returns
 * 0, PS_EDTYPE, PS_EINVAL_ARG (with err) or -ENOMEM. */
int ps_tensor_from_pb(const Ps__V1__Tensor *pb, ps_tensor **out, char *err,
                      size_t errlen);

/* Fills *pb (initialised by the caller with PS__V1__TENSOR__INIT) to describe
 * t without copying: pb->shape and pb->data point into t, so pb is valid
 * only while t is alive and must not be freed with
 * ps__v1__tensor__free_unpacked. */
void ps_tensor_to_pb(ps_tensor *t, Ps__V1__Tensor *pb);

#endif
