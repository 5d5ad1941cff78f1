#include "common/errors.h"
#include "common/tensor.h"
#define PSCHECK_TMPFILE "t.npy"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

START_TEST(test_dtype_size)
{
    ck_assert_uint_eq(ps_dtype_size(PS_DTYPE_FLOAT32), 4);
    ck_assert_uint_eq(ps_dtype_size(PS_DTYPE_FLOAT16), 2);
    ck_assert_uint_eq(ps_dtype_size(PS_DTYPE_BFLOAT16), 2);
    ck_assert_uint_eq(ps_dtype_size(PS_DTYPE_UNSPECIFIED), 0);
    ck_assert_uint_eq(ps_dtype_size((enum ps_dtype)42), 0);
}
END_TEST

START_TEST(test_dtype_name)
{
    ck_assert_str_eq(ps_dtype_name(PS_DTYPE_FLOAT32), "float32");
    ck_assert_str_eq(ps_dtype_name(PS_DTYPE_FLOAT16), "float16");
    ck_assert_str_eq(ps_dtype_name(PS_DTYPE_BFLOAT16), "bfloat16");
    ck_assert_str_eq(ps_dtype_name(PS_DTYPE_UNSPECIFIED), "unspecified");
    ck_assert_str_eq(ps_dtype_name((enum ps_dtype)42), "unknown");
}
END_TEST

START_TEST(test_shape_numel_ok)
{
    size_t n = 0;
    int64_t s[] = {784, 256};
    ck_assert_int_eq(ps_shape_numel(s, 2, &n), 0);
    ck_assert_uint_eq(n, 784 * 256);
    ck_assert_int_eq(ps_shape_numel(NULL, 0, &n), 0);
    ck_assert_uint_eq(n, 1);
    int64_t eight[8] = {1, 2, 1, 2, 1, 2, 1, 2};
    ck_assert_int_eq(ps_shape_numel(eight, 8, &n), 0);
    ck_assert_uint_eq(n, 16);
}
END_TEST

START_TEST(test_shape_numel_bad)
{
    size_t n = 7;
    int64_t zero[] = {3, 0};
    int64_t neg[] = {-1};
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    int64_t huge[] = {INT64_MAX, INT64_MAX, 4};
    ck_assert_int_eq(ps_shape_numel(zero, 2, &n), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_shape_numel(neg, 1, &n), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_shape_numel(nine, 9, &n), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_shape_numel(nine, -1, &n), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_shape_numel(huge, 3, &n), PS_EINVAL_ARG);
    ck_assert_uint_eq(n, 7);
}
END_TEST

START_TEST(test_shape_str)
{
    char buf[64];
    int64_t s2[] = {784, 256};
    int64_t s1[] = {10};
    ck_assert_str_eq(ps_tensor_shape_str(s2, 2, buf, sizeof buf), "(784, 256)");
    ck_assert_str_eq(ps_tensor_shape_str(s1, 1, buf, sizeof buf), "(10,)");
    ck_assert_str_eq(ps_tensor_shape_str(NULL, 0, buf, sizeof buf), "()");
    char small[6];
    ck_assert_str_eq(ps_tensor_shape_str(s2, 2, small, sizeof small), "(784,");
    ck_assert_ptr_eq(ps_tensor_shape_str(s2, 2, small, 0), small);
}
END_TEST

START_TEST(test_create_destroy)
{
    ps_tensor *t = NULL;
    int64_t s[] = {3, 4};
    ck_assert_int_eq(ps_tensor_create(PS_DTYPE_FLOAT32, 2, s, &t), 0);
    ck_assert_int_eq(t->ndim, 2);
    ck_assert_int_eq(t->shape[0], 3);
    ck_assert_int_eq(t->shape[1], 4);
    ck_assert_uint_eq(t->numel, 12);
    ck_assert(t->owns);
    for (size_t i = 0; i < t->numel; i++)
        ck_assert_float_eq(t->data[i], 0.0f);
    t->data[11] = 1.5f;
    ps_tensor_destroy(t);

    ck_assert_int_eq(ps_tensor_create(PS_DTYPE_FLOAT32, 0, NULL, &t), 0);
    ck_assert_uint_eq(t->numel, 1);
    ps_tensor_destroy(t);
    ps_tensor_destroy(NULL);
}
END_TEST

START_TEST(test_create_bad)
{
    ps_tensor *t = NULL;
    int64_t s[] = {3, 0};
    int64_t ok[] = {3};
    int64_t huge[] = {INT64_MAX}; /* numel fits, bytes do not */
    ck_assert_int_eq(ps_tensor_create(PS_DTYPE_FLOAT32, 2, s, &t),
                     PS_EINVAL_ARG);
    ck_assert_int_eq(ps_tensor_create(PS_DTYPE_FLOAT16, 1, ok, &t), PS_EDTYPE);
    ck_assert_int_eq(ps_tensor_create(PS_DTYPE_UNSPECIFIED, 1, ok, &t),
                     PS_EDTYPE);
    ck_assert_int_eq(ps_tensor_create(PS_DTYPE_FLOAT32, 1, huge, &t),
                     PS_EINVAL_ARG);
    ck_assert_ptr_null(t);
}
END_TEST

START_TEST(test_npy_write)
{
    float data[12];
    for (int i = 0; i < 12; i++)
        data[i] = (float)i * 0.5f;
    int64_t s[] = {3, 4};
    ck_assert_int_eq(ps_npy_write(tmppath, s, 2, data), 0);
    /* numpy's own header for a (3, 4) float32 array, byte for byte. */
    size_t size;
    unsigned char *file = pscheck_read(tmppath, &size);
    ck_assert_uint_ge(size, 128);
    char head[128];
    memcpy(head, file, sizeof head);
    free(file);
    ck_assert_mem_eq(head, "\x93NUMPY\x01\x00\x76\x00", 10);
    const char *dict = "{'descr': '<f4', 'fortran_order': False, "
                       "'shape': (3, 4), }";
    ck_assert_mem_eq(head + 10, dict, strlen(dict));
    for (size_t i = 10 + strlen(dict); i < 127; i++)
        ck_assert_int_eq(head[i], ' ');
    ck_assert_int_eq(head[127], '\n');
    ck_assert_uint_eq(size, 128 + sizeof data);

    int64_t bad[] = {0};
    ck_assert_int_eq(ps_npy_write(tmppath, bad, 1, data), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_npy_write("/nonexistent-dir/x.npy", s, 2, data),
                     -ENOENT);
}
END_TEST

START_TEST(test_npy_read)
{
    float data[24];
    for (int i = 0; i < 24; i++)
        data[i] = (float)i - 3.75f;
    int64_t s[] = {2, 3, 4};
    ck_assert_int_eq(ps_npy_write(tmppath, s, 3, data), 0);
    ps_tensor *t = NULL;
    ck_assert_int_eq(ps_npy_read(tmppath, &t), 0);
    ck_assert_int_eq(t->ndim, 3);
    ck_assert_int_eq(t->shape[0], 2);
    ck_assert_int_eq(t->shape[2], 4);
    ck_assert_mem_eq(t->data, data, sizeof data);
    ps_tensor_destroy(t);

    /* 1-D and scalar shapes survive the trip too. */
    int64_t one[] = {5};
    ck_assert_int_eq(ps_npy_write(tmppath, one, 1, data), 0);
    ck_assert_int_eq(ps_npy_read(tmppath, &t), 0);
    ck_assert_int_eq(t->ndim, 1);
    ck_assert_int_eq(t->shape[0], 5);
    ps_tensor_destroy(t);
    ck_assert_int_eq(ps_npy_write(tmppath, NULL, 0, data), 0);
    ck_assert_int_eq(ps_npy_read(tmppath, &t), 0);
    ck_assert_int_eq(t->ndim, 0);
    ck_assert_float_eq(t->data[0], data[0]);
    ps_tensor_destroy(t);
}
END_TEST

/* A version 1.0 file with the given header dict and `nbytes` zero bytes of
 * data. */
static void write_npy_raw(const char *path, const char *dict, size_t nbytes)
{
    char file[256] = "\x93NUMPY\x01\x00";
    size_t len = strlen(dict);
    size_t total = (10 + len + 1 + 63) / 64 * 64;
    ck_assert_uint_le(total + nbytes, sizeof file);
    file[8] = (char)(total - 10);
    file[9] = 0;
    memcpy(file + 10, dict, len);
    memset(file + 10 + len, ' ', total - 10 - len - 1);
    file[total - 1] = '\n';
    memset(file + total, 0, nbytes);
    pscheck_write(path, file, total + nbytes);
}

START_TEST(test_npy_read_bad)
{
    ps_tensor *t = NULL;
    char path2[160];
    snprintf(path2, sizeof path2, "%s/missing.npy", tmpdir);
    ck_assert_int_eq(ps_npy_read(path2, &t), -ENOENT);

    pscheck_write(tmppath, "not numpy at all", 16);
    ck_assert_int_eq(ps_npy_read(tmppath, &t), PS_ECORRUPT);

    /* Truncated data: the header promises 12 floats. */
    float data[12] = {0};
    int64_t s[] = {3, 4};
    ck_assert_int_eq(ps_npy_write(tmppath, s, 2, data), 0);
    ck_assert_int_eq(truncate(tmppath, 128 + 20), 0);
    ck_assert_int_eq(ps_npy_read(tmppath, &t), PS_ECORRUPT);

    /* Header dicts and what reading them gives, with 8 bytes of data. */
    static const struct {
        int rc;
        const char *dict;
    } heads[] = {
        /* Another dtype, and Fortran order. */
        {PS_EDTYPE, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }"},
        {PS_EDTYPE, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }"},
        /* A broken shape tuple. */
        {PS_ECORRUPT, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }"},
        /* Keys in another order, as other writers may put them: accepted. */
        {0, "{'shape': (2,), 'fortran_order': False, 'descr': '<f4'}"},
    };
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        write_npy_raw(tmppath, heads[i].dict, 8);
        ck_assert_int_eq(ps_npy_read(tmppath, &t), heads[i].rc);
    }
    ck_assert_uint_eq(t->numel, 2);
    ps_tensor_destroy(t);
    t = NULL;
    ck_assert_ptr_null(t);
}
END_TEST

PSCHECK_MAIN("tensor",
    {"ps_dtype_size", {test_dtype_size}},
    {"ps_dtype_name", {test_dtype_name}},
    {"ps_shape_numel", {test_shape_numel_ok, test_shape_numel_bad}},
    {"ps_tensor_shape_str", {test_shape_str}},
    {"ps_tensor_create", {test_create_destroy, test_create_bad}},
    {"ps_npy_write", {test_npy_write}, &pscheck_tmp},
    {"ps_npy_read", {test_npy_read, test_npy_read_bad}, &pscheck_tmp})
