/*
 * tensor.h - the in-process dense tensor, its checks against the wire, and
 * NumPy .npy files.
 *
 * A ps_tensor is a dtype, a shape of at most PS_TENSOR_MAX_DIMS dimensions
 * (each >= 1; zero dimensions is a scalar of one element) and a row-major
 * block of elements. Only float32 is served today, so the element pointer is
 * a float *; the other dtypes exist so that their names and sizes can be
 * reported when a client sends them.
 *
 * Tensors arrive from the wire as ps.v1.Tensor messages; tensor_pb.h, the
 * RPC edge, checks them and turns them into ps_tensors (views without a copy
 * on the hot path). This header knows nothing of protobuf.
 *
 * Threads and lifetime: no function keeps state; a tensor may be read from
 * any number of threads, and written from one. A tensor from
 * ps_tensor_create (or tensor_pb.h's ps_tensor_from_pb) owns its data and is
 * freed with ps_tensor_destroy. A view (owns false) owns nothing: its data
 * belongs to whatever it points into.
 */
#ifndef PS_TENSOR_H
#define PS_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PS_TENSOR_MAX_DIMS 8

/* The same values as ps.v1.DType on the wire. */
enum ps_dtype {
    PS_DTYPE_UNSPECIFIED = 0,
    PS_DTYPE_FLOAT32 = 1,
    PS_DTYPE_FLOAT16 = 2,  /* reserved: never served today */
    PS_DTYPE_BFLOAT16 = 3, /* reserved: never served today */
};

typedef struct ps_tensor {
    enum ps_dtype dtype;
    int ndim;                             /* 0 (scalar) .. PS_TENSOR_MAX_DIMS */
    int64_t shape[PS_TENSOR_MAX_DIMS];    /* outermost first; unused dims 0 */
    float *data;                          /* (numel), row-major */
    size_t numel;                         /* product of shape; 1 for a scalar */
    bool owns;                            /* data is freed with the tensor */
} ps_tensor;

/* Bytes per element: 4 for float32, 2 for float16 and bfloat16, 0 for
 * PS_DTYPE_UNSPECIFIED and any value not in the enum. */
size_t ps_dtype_size(enum ps_dtype dtype);

/* "float32", "float16", "bfloat16", "unspecified"; "unknown" for a value not
 * in the enum. Never NULL; static storage. */
const char *ps_dtype_name(enum ps_dtype dtype);

/* Stores the number of elements of `shape` in *out (1 when ndim is 0).
 * Returns 0, or PS_EINVAL_ARG when ndim is outside 0..PS_TENSOR_MAX_DIMS, a
 * dimension is below 1, or the product overflows size_t; *out is then left
 * alone. */
int ps_shape_numel(const int64_t *shape, int ndim, size_t *out);

/* Writes the shape as numpy prints it: "(784, 256)", "(10,)", "()" into buf
 * (truncated to fit len, always NUL-terminated when len > 0). Returns buf, so
 * that it can be used as a printf argument. */
char *ps_tensor_shape_str(const int64_t *shape, int ndim, char *buf,
                          size_t len);

/* Allocates a zero-filled tensor that owns its data. Returns 0, PS_EDTYPE for
 * any dtype but float32, PS_EINVAL_ARG for a bad shape (see ps_shape_numel)
 * or -ENOMEM. *out is set only on success. */
int ps_tensor_create(enum ps_dtype dtype, int ndim, const int64_t *shape,
                     ps_tensor **out);

/* Frees a tensor from ps_tensor_create or ps_tensor_from_pb (tensor_pb.h),
 * and its data if it owns it. NULL does nothing. */
void ps_tensor_destroy(ps_tensor *t);

/* Writes a NumPy .npy file, format version 1.0, dtype '<f4', C order, header
 * padded with spaces to a multiple of 64 bytes as numpy does. The file is
 * written to "<path>.tmp" and renamed into place, so a reader never sees half
 * of it. Returns 0, PS_EINVAL_ARG for a bad shape, or -errno. */
int ps_npy_write(const char *path, const int64_t *shape, int ndim,
                 const float *data);

/* Reads a .npy file written by ps_npy_write or numpy (version 1.0, 2.0 or 3.0,
 * '<f4', C order) into a new owned tensor. Returns 0, -errno when the file
 * cannot be read, PS_EDTYPE for another dtype or Fortran order, or
 * PS_ECORRUPT when it is not a well-formed .npy file or its size does not
 * match its header. Meant for tests and tools. */
int ps_npy_read(const char *path, ps_tensor **out);

#endif
