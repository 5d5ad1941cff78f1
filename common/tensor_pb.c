#include "common/tensor_pb.h"

#include "common/errors.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* enum ps_dtype is the wire's DType, value for value. */
_Static_assert((int)PS_DTYPE_FLOAT32 == (int)PS__V1__DTYPE__DTYPE_FLOAT32 &&
               (int)PS_DTYPE_FLOAT16 == (int)PS__V1__DTYPE__DTYPE_FLOAT16 &&
               (int)PS_DTYPE_BFLOAT16 == (int)PS__V1__DTYPE__DTYPE_BFLOAT16,
               "enum ps_dtype must match ps.v1.DType");

int ps_tensor_view_pb(const Ps__V1__Tensor *pb, ps_tensor *view, char *err,
                      size_t errlen)
{
    if (pb == NULL)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "tensor is missing");

    enum ps_dtype dtype = (enum ps_dtype)pb->dtype;
    if (dtype == PS_DTYPE_UNSPECIFIED)
        return ps_errf(PS_EDTYPE, err, errlen,
                    "tensor dtype is unspecified; only float32 is served");
    if (dtype != PS_DTYPE_FLOAT32) {
        if (ps_dtype_size(dtype) == 0)
            return ps_errf(PS_EDTYPE, err, errlen,
                        "tensor dtype %d is unknown; only float32 is served",
                        (int)pb->dtype);
        return ps_errf(PS_EDTYPE, err, errlen,
                    "tensor dtype %s is not served; only float32 is",
                    ps_dtype_name(dtype));
    }

    if (pb->n_shape > PS_TENSOR_MAX_DIMS)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "tensor has %zu dimensions; at most %d are allowed",
                    pb->n_shape, PS_TENSOR_MAX_DIMS);
    int ndim = (int)pb->n_shape;
    char shape[256];
    ps_tensor_shape_str(pb->shape, ndim, shape, sizeof shape);
    for (int i = 0; i < ndim; i++) {
        if (pb->shape[i] < 1)
            return ps_errf(PS_EINVAL_ARG, err, errlen,
                        "tensor shape %s: dimension %d is %" PRId64
                        "; each must be >= 1",
                        shape, i, pb->shape[i]);
    }
    size_t numel;
    if (ps_shape_numel(pb->shape, ndim, &numel) != 0 ||
        numel > SIZE_MAX / sizeof(float))
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "tensor shape %s has too many elements", shape);

    size_t need = numel * sizeof(float);
    if (pb->data.len != need)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "tensor has %zu bytes, shape %s float32 needs %zu",
                    pb->data.len, shape, need);
    if ((uintptr_t)pb->data.data % _Alignof(float) != 0)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "tensor data is not 4-byte aligned");

    memset(view, 0, sizeof *view);
    view->dtype = dtype;
    view->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        view->shape[i] = pb->shape[i];
    view->numel = numel;
    view->data = (float *)(void *)pb->data.data;
    view->owns = false;
    return 0;
}

int ps_tensor_from_pb(const Ps__V1__Tensor *pb, ps_tensor **out, char *err,
                      size_t errlen)
{
    ps_tensor view;
    int rc = ps_tensor_view_pb(pb, &view, err, errlen);
    if (rc != 0)
        return rc;
    ps_tensor *t;
    rc = ps_tensor_create(view.dtype, view.ndim, view.shape, &t);
    if (rc != 0)
        return ps_errf(rc, err, errlen, "out of memory copying a tensor");
    if (view.numel > 0)
        memcpy(t->data, view.data, view.numel * sizeof(float));
    *out = t;
    return 0;
}

void ps_tensor_to_pb(ps_tensor *t, Ps__V1__Tensor *pb)
{
    pb->dtype = (Ps__V1__DType)t->dtype;
    pb->n_shape = (size_t)t->ndim;
    pb->shape = t->ndim > 0 ? t->shape : NULL;
    pb->data.len = t->numel * ps_dtype_size(t->dtype);
    pb->data.data = (uint8_t *)t->data;
}
