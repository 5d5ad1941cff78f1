#include "common/tensor.h"

#include "common/errors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The wire is little-endian and the data pointer of a view is the wire's
 * bytes, so a big-endian host would need a byte-swapping copy everywhere. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensor.c assumes a little-endian host"
#endif

_Static_assert(sizeof(float) == 4, "float must be IEEE 754 binary32");

size_t ps_dtype_size(enum ps_dtype dtype)
{
    switch (dtype) {
    case PS_DTYPE_FLOAT32:
        return 4;
    case PS_DTYPE_FLOAT16:
    case PS_DTYPE_BFLOAT16:
        return 2;
    case PS_DTYPE_UNSPECIFIED:
        break;
    }
    return 0;
}

static const char *const dtype_names[] = {
    [PS_DTYPE_UNSPECIFIED] = "unspecified",
    [PS_DTYPE_FLOAT32] = "float32",
    [PS_DTYPE_FLOAT16] = "float16",
    [PS_DTYPE_BFLOAT16] = "bfloat16",
};

const char *ps_dtype_name(enum ps_dtype dtype)
{
    if ((unsigned)dtype >= sizeof dtype_names / sizeof dtype_names[0])
        return "unknown";
    return dtype_names[dtype];
}

int ps_shape_numel(const int64_t *shape, int ndim, size_t *out)
{
    if (ndim < 0 || ndim > PS_TENSOR_MAX_DIMS || (ndim > 0 && shape == NULL))
        return PS_EINVAL_ARG;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1)
            return PS_EINVAL_ARG;
        if ((uint64_t)shape[i] > SIZE_MAX / n)
            return PS_EINVAL_ARG;
        n *= (size_t)shape[i];
    }
    *out = n;
    return 0;
}

char *ps_tensor_shape_str(const int64_t *shape, int ndim, char *buf,
                          size_t len)
{
    if (len == 0)
        return buf;
    size_t used = 0;
    buf[0] = '\0';
#define APPEND(...)                                                       \
    do {                                                                  \
        if (used < len) {                                                 \
            int k_ = snprintf(buf + used, len - used, __VA_ARGS__);       \
            used += k_ > 0 ? (size_t)k_ : 0;                              \
        }                                                                 \
    } while (0)
    APPEND("(");
    for (int i = 0; i < ndim; i++)
        APPEND("%s%" PRId64, i > 0 ? ", " : "", shape[i]);
    APPEND(ndim == 1 ? ",)" : ")");
#undef APPEND
    return buf;
}

int ps_tensor_create(enum ps_dtype dtype, int ndim, const int64_t *shape,
                     ps_tensor **out)
{
    if (dtype != PS_DTYPE_FLOAT32)
        return PS_EDTYPE;
    size_t numel;
    int rc = ps_shape_numel(shape, ndim, &numel);
    if (rc != 0)
        return rc;
    if (numel > SIZE_MAX / sizeof(float))
        return PS_EINVAL_ARG;

    ps_tensor *t = calloc(1, sizeof *t);
    if (t == NULL)
        return -ENOMEM;
    t->data = calloc(numel, sizeof(float));
    if (t->data == NULL) {
        free(t);
        return -ENOMEM;
    }
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->numel = numel;
    t->owns = true;
    *out = t;
    return 0;
}

void ps_tensor_destroy(ps_tensor *t)
{
    if (t == NULL)
        return;
    if (t->owns)
        free(t->data);
    free(t);
}

/* .npy layout: "\x93NUMPY", major, minor, a little-endian header length
 * (2 bytes in 1.0, 4 in 2.0 and 3.0), then a Python dict literal padded with
 * spaces and ended by '\n' so that the data starts at a multiple of 64. */
static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

int ps_npy_write(const char *path, const int64_t *shape, int ndim,
                 const float *data)
{
    size_t numel;
    if (ps_shape_numel(shape, ndim, &numel) != 0 ||
        numel > SIZE_MAX / sizeof(float))
        return PS_EINVAL_ARG;

    char header[512];
    char shp[256];
    ps_tensor_shape_str(shape, ndim, shp, sizeof shp);
    int dict = snprintf(header + 10, sizeof header - 10,
                        "{'descr': '<f4', 'fortran_order': False, "
                        "'shape': %s, }", shp);
    if (dict < 0 || (size_t)dict >= sizeof header - 10 - 64)
        return PS_EINVAL_ARG;
    size_t total = 10 + (size_t)dict + 1;
    total = (total + 63) / 64 * 64;
    memcpy(header, npy_magic, sizeof npy_magic);
    header[6] = 1;
    header[7] = 0;
    uint16_t hlen = (uint16_t)(total - 10);
    header[8] = (char)(hlen & 0xff);
    header[9] = (char)(hlen >> 8);
    memset(header + 10 + dict, ' ', total - 10 - (size_t)dict - 1);
    header[total - 1] = '\n';

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    int rc = 0;
    FILE *f = fopen(tmp, "wb");
    if (f == NULL)
        return -errno;
    errno = 0;
    if (fwrite(header, 1, total, f) != total ||
        (numel > 0 && fwrite(data, sizeof(float), numel, f) != numel) ||
        fflush(f) != 0 || fsync(fileno(f)) != 0) {
        rc = errno != 0 ? -errno : -EIO;
        fclose(f);
        goto unlink_tmp;
    }
    if (fclose(f) != 0) {
        rc = -errno;
        goto unlink_tmp;
    }
    if (rename(tmp, path) != 0) {
        rc = -errno;
        goto unlink_tmp;
    }
    return 0;

unlink_tmp:
    unlink(tmp);
    return rc;
}

/* Finds `'key':` in a NUL-terminated header dict and returns a pointer to
 * the value after it, spaces skipped, or NULL. */
static const char *npy_value(const char *dict, const char *key)
{
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(dict, pat);
    if (p == NULL)
        return NULL;
    p += strlen(pat);
    while (*p == ' ')
        p++;
    if (*p != ':')
        return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

/* Parses the header dict: dtype '<f4', C order, and the shape tuple. */
static int npy_parse_header(const char *dict, int64_t *shape, int *ndim)
{
    const char *v = npy_value(dict, "descr");
    if (v == NULL)
        return PS_ECORRUPT;
    if (strncmp(v, "'<f4'", 5) != 0)
        return PS_EDTYPE;

    v = npy_value(dict, "fortran_order");
    if (v == NULL)
        return PS_ECORRUPT;
    if (strncmp(v, "True", 4) == 0)
        return PS_EDTYPE;
    if (strncmp(v, "False", 5) != 0)
        return PS_ECORRUPT;

    v = npy_value(dict, "shape");
    if (v == NULL || *v != '(')
        return PS_ECORRUPT;
    v++;
    int n = 0;
    for (;;) {
        while (*v == ' ')
            v++;
        if (*v == ')')
            break;
        if (n == PS_TENSOR_MAX_DIMS)
            return PS_ECORRUPT;
        char *end;
        errno = 0;
        long long d = strtoll(v, &end, 10);
        if (end == v || errno != 0 || d < 1)
            return PS_ECORRUPT;
        shape[n++] = d;
        v = end;
        while (*v == ' ')
            v++;
        if (*v == ',')
            v++;
        else if (*v != ')')
            return PS_ECORRUPT;
    }
    *ndim = n;
    return 0;
}

int ps_npy_read(const char *path, ps_tensor **out)
{
    int rc;
    char *dict = NULL;
    ps_tensor *t = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -errno;

    unsigned char pre[12];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, npy_magic, 6) != 0) {
        rc = PS_ECORRUPT;
        goto close_file;
    }
    size_t hlen;
    if (pre[6] == 1 && pre[7] == 0) {
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
    } else if ((pre[6] == 2 || pre[6] == 3) && pre[7] == 0) {
        if (fread(pre + 10, 1, 2, f) != 2) {
            rc = PS_ECORRUPT;
            goto close_file;
        }
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 |
               (size_t)pre[11] << 24;
        if (hlen > (1u << 20)) {
            rc = PS_ECORRUPT;
            goto close_file;
        }
    } else {
        rc = PS_ECORRUPT;
        goto close_file;
    }

    dict = malloc(hlen + 1);
    if (dict == NULL) {
        rc = -ENOMEM;
        goto close_file;
    }
    if (fread(dict, 1, hlen, f) != hlen) {
        rc = PS_ECORRUPT;
        goto free_dict;
    }
    dict[hlen] = '\0';
    int64_t shape[PS_TENSOR_MAX_DIMS];
    int ndim;
    rc = npy_parse_header(dict, shape, &ndim);
    if (rc != 0)
        goto free_dict;
    rc = ps_tensor_create(PS_DTYPE_FLOAT32, ndim, shape, &t);
    if (rc != 0) {
        rc = rc == -ENOMEM ? rc : PS_ECORRUPT;
        goto free_dict;
    }
    if (fread(t->data, sizeof(float), t->numel, f) != t->numel ||
        fgetc(f) != EOF) {
        rc = PS_ECORRUPT;
        goto destroy_tensor;
    }
    free(dict);
    fclose(f);
    *out = t;
    return 0;

destroy_tensor:
    ps_tensor_destroy(t);
free_dict:
    free(dict);
close_file:
    fclose(f);
    return rc;
}
