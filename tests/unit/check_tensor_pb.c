/* The tensor <-> protobuf conversion at the RPC edge (common/tensor_pb.h). */
#include "common/errors.h"
#include "common/tensor_pb.h"

#include "tests/unit/pscheck.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_dtype_wire)
{
    /* The enum must track the wire values. */
    ck_assert_int_eq(PS_DTYPE_FLOAT32, PS__V1__DTYPE__DTYPE_FLOAT32);
    ck_assert_int_eq(PS_DTYPE_FLOAT16, PS__V1__DTYPE__DTYPE_FLOAT16);
    ck_assert_int_eq(PS_DTYPE_BFLOAT16, PS__V1__DTYPE__DTYPE_BFLOAT16);
}
END_TEST

/* A wire tensor over caller-owned storage. */
static Ps__V1__Tensor make_pb(int dtype, int64_t *shape, size_t ndim,
                              void *data, size_t len)
{
    Ps__V1__Tensor pb = PS__V1__TENSOR__INIT;
    pb.dtype = (Ps__V1__DType)dtype;
    pb.n_shape = ndim;
    pb.shape = shape;
    pb.data.data = data;
    pb.data.len = len;
    return pb;
}

/* What ps_tensor_view_pb returns for the wire tensor make_pb makes of the
 * same arguments; err holds its message. */
static int view_rc(int dtype, int64_t *shape, size_t ndim, void *data,
                   size_t len, char *err, size_t errlen)
{
    Ps__V1__Tensor pb = make_pb(dtype, shape, ndim, data, len);
    ps_tensor v;
    return ps_tensor_view_pb(&pb, &v, err, errlen);
}

START_TEST(test_view_pb_ok)
{
    float data[6] = {1, 2, 3, 4, 5, 6};
    int64_t s[] = {2, 3};
    Ps__V1__Tensor pb = make_pb(1, s, 2, data, sizeof data);
    ps_tensor v;
    char err[256] = "";
    ck_assert_int_eq(ps_tensor_view_pb(&pb, &v, err, sizeof err), 0);
    ck_assert_ptr_eq(v.data, data); /* no copy */
    ck_assert(!v.owns);
    ck_assert_uint_eq(v.numel, 6);
    ck_assert_int_eq(v.ndim, 2);
    ck_assert_int_eq(v.shape[1], 3);

    /* A scalar: empty shape, one element. */
    Ps__V1__Tensor sc = make_pb(1, NULL, 0, data, 4);
    ck_assert_int_eq(ps_tensor_view_pb(&sc, &v, NULL, 0), 0);
    ck_assert_uint_eq(v.numel, 1);
    ck_assert_int_eq(v.ndim, 0);

    /* Round trip through protobuf-c's packer and unpacker. */
    size_t len = ps__v1__tensor__get_packed_size(&pb);
    uint8_t *buf = malloc(len);
    ps__v1__tensor__pack(&pb, buf);
    Ps__V1__Tensor *un = ps__v1__tensor__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(un);
    ck_assert_int_eq(ps_tensor_view_pb(un, &v, err, sizeof err), 0);
    ck_assert_float_eq(v.data[5], 6.0f);
    ps__v1__tensor__free_unpacked(un, NULL);
    free(buf);
}
END_TEST

START_TEST(test_view_pb_dtype)
{
    float data[2] = {0};
    int64_t s[] = {2};
    char err[256];
    ck_assert_int_eq(view_rc(2, s, 1, data, 4, err, sizeof err), PS_EDTYPE);
    ck_assert_str_eq(err, "tensor dtype float16 is not served; only float32 is");
    ck_assert_int_eq(view_rc(3, s, 1, data, 4, err, sizeof err), PS_EDTYPE);
    ck_assert_ptr_nonnull(strstr(err, "bfloat16"));
    ck_assert_int_eq(view_rc(0, s, 1, data, 8, err, sizeof err), PS_EDTYPE);
    ck_assert_ptr_nonnull(strstr(err, "unspecified"));
    ck_assert_int_eq(view_rc(9, s, 1, data, 8, err, sizeof err), PS_EDTYPE);
    ck_assert_ptr_nonnull(strstr(err, "dtype 9 is unknown"));
}
END_TEST

START_TEST(test_view_pb_shape)
{
    float data[8] = {0};
    char err[256];
    int64_t zero[] = {3, 0};
    ck_assert_int_eq(view_rc(1, zero, 2, data, 0, err, sizeof err),
                     PS_EINVAL_ARG);
    ck_assert_str_eq(err, "tensor shape (3, 0): dimension 1 is 0; each must "
                          "be >= 1");
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    ck_assert_int_eq(view_rc(1, nine, 9, data, 4, err, sizeof err),
                     PS_EINVAL_ARG);
    ck_assert_str_eq(err, "tensor has 9 dimensions; at most 8 are allowed");
    int64_t huge[] = {INT64_MAX, INT64_MAX};
    ck_assert_int_eq(view_rc(1, huge, 2, data, 4, err, sizeof err),
                     PS_EINVAL_ARG);
    ck_assert_ptr_nonnull(strstr(err, "too many elements"));
    ps_tensor v;
    ck_assert_int_eq(ps_tensor_view_pb(NULL, &v, err, sizeof err),
                     PS_EINVAL_ARG);
    ck_assert_str_eq(err, "tensor is missing");
}
END_TEST

START_TEST(test_view_pb_bytes)
{
    static float data[2000];
    char err[256];
    int64_t s[] = {1000, 2};
    ck_assert_int_eq(view_rc(1, s, 2, data, 4000, err, sizeof err),
                     PS_EINVAL_ARG);
    ck_assert_str_eq(err,
                     "tensor has 4000 bytes, shape (1000, 2) float32 needs 8000");
    ck_assert_int_eq(view_rc(1, s, 2, data, 8004, err, sizeof err),
                     PS_EINVAL_ARG);
    /* Misaligned bytes are refused rather than read as floats. */
    ck_assert_int_eq(
        view_rc(1, s, 1, (char *)data + 1, 4000, err, sizeof err),
        PS_EINVAL_ARG);
    ck_assert_ptr_nonnull(strstr(err, "aligned"));
}
END_TEST

START_TEST(test_from_pb)
{
    float data[3] = {1.5f, -2.0f, 3.25f};
    int64_t s[] = {3};
    Ps__V1__Tensor pb = make_pb(1, s, 1, data, sizeof data);
    ps_tensor *t = NULL;
    char err[256];
    ck_assert_int_eq(ps_tensor_from_pb(&pb, &t, err, sizeof err), 0);
    ck_assert(t->owns);
    ck_assert_ptr_ne(t->data, data);
    ck_assert_mem_eq(t->data, data, sizeof data);
    data[0] = 99.0f; /* the copy is independent */
    ck_assert_float_eq(t->data[0], 1.5f);
    ps_tensor_destroy(t);

    t = NULL;
    pb = make_pb(2, s, 1, data, 6);
    ck_assert_int_eq(ps_tensor_from_pb(&pb, &t, err, sizeof err), PS_EDTYPE);
    ck_assert_ptr_null(t);
    pb = make_pb(1, s, 1, data, 8);
    ck_assert_int_eq(ps_tensor_from_pb(&pb, &t, err, sizeof err),
                     PS_EINVAL_ARG);
    ck_assert_str_eq(err, "tensor has 8 bytes, shape (3,) float32 needs 12");
    ck_assert_ptr_null(t);
}
END_TEST

START_TEST(test_to_pb)
{
    ps_tensor *t;
    int64_t s[] = {2, 2};
    ck_assert_int_eq(ps_tensor_create(PS_DTYPE_FLOAT32, 2, s, &t), 0);
    t->data[3] = 4.0f;
    Ps__V1__Tensor pb = PS__V1__TENSOR__INIT;
    ps_tensor_to_pb(t, &pb);
    ck_assert_int_eq(pb.dtype, PS__V1__DTYPE__DTYPE_FLOAT32);
    ck_assert_uint_eq(pb.n_shape, 2);
    ck_assert_uint_eq(pb.data.len, 16);
    ps_tensor v;
    ck_assert_int_eq(ps_tensor_view_pb(&pb, &v, NULL, 0), 0);
    ck_assert_ptr_eq(v.data, t->data);
    ck_assert_float_eq(v.data[3], 4.0f);
    ps_tensor_destroy(t);
}
END_TEST

PSCHECK_MAIN("tensor_pb",
    {"ps_dtype (wire values)", {test_dtype_wire}},
    {"ps_tensor_view_pb", {test_view_pb_ok, test_view_pb_dtype, test_view_pb_shape,
                           test_view_pb_bytes}},
    {"ps_tensor_from_pb", {test_from_pb}},
    {"ps_tensor_to_pb", {test_to_pb}})
