/* check_psclient - the hand-written Push encoder and Pull decoder agree
 * with protobuf-c on the same messages. */
#include "common/buf.h"
#include "common/errors.h"
#include "proto/ps.pb-c.h"
#include "tests/unit/pscheck.h"
#include "common/psclient.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_push_encode)
{
    float a[6] = {1, 2, 3, 4, 5, 6}, b[1] = {-7.5f};
    int64_t sa[2] = {2, 3};
    ps_client_item items[2] = {
        {.name = "dense0/kernel", .data = a, .n = 6, .shape = sa, .ndim = 2},
        {.name = "b", .data = b, .n = 1},
    };
    ps_buf buf = {0};
    ck_assert_int_eq(ps_push_encode(&buf, 3, 1u << 20, items, 2), 0);
    Ps__V1__PushRequest *r = ps__v1__push_request__unpack(NULL, buf.len, buf.data);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->worker, 3);
    ck_assert_uint_eq(r->step, 1u << 20);
    ck_assert_uint_eq(r->n_grads, 2);
    ck_assert_str_eq(r->grads[0]->name, "dense0/kernel");
    ck_assert_int_eq(r->grads[0]->grad->dtype, PS__V1__DTYPE__DTYPE_FLOAT32);
    ck_assert_uint_eq(r->grads[0]->grad->n_shape, 2);
    ck_assert_int_eq(r->grads[0]->grad->shape[1], 3);
    ck_assert_uint_eq(r->grads[0]->grad->data.len, sizeof a);
    ck_assert_mem_eq(r->grads[0]->grad->data.data, a, sizeof a);
    ck_assert_uint_eq(r->grads[1]->grad->n_shape, 0);
    ck_assert_mem_eq(r->grads[1]->grad->data.data, b, sizeof b);
    ps__v1__push_request__free_unpacked(r, NULL);
    /* Every gradient's floats start 4-byte aligned in the message, whatever
     * the name lengths, so psd can apply them without a copy. */
    for (int len = 1; len < 40; len++) {
        char name[64];
        memset(name, 'x', (size_t)len);
        name[len] = '\0';
        items[0].name = name;
        ck_assert_int_eq(ps_push_encode(&buf, (uint32_t)len, (uint64_t)len * 977u,
                                        items, 2), 0);
        for (int g = 0; g < 2; g++) {
            const uint8_t *want = (const uint8_t *)(g == 0 ? (void *)a : (void *)b);
            size_t nb = g == 0 ? sizeof a : sizeof b;
            const uint8_t *at = NULL;
            for (size_t off = 0; off + nb <= buf.len; off++)
                if (memcmp(buf.data + off, want, nb) == 0) {
                    at = buf.data + off;
                    break;
                }
            ck_assert_ptr_nonnull(at);
            ck_assert_uint_eq((size_t)(at - buf.data) % 4, 0);
        }
        r = ps__v1__push_request__unpack(NULL, buf.len, buf.data);
        ck_assert_ptr_nonnull(r);
        ck_assert_int_eq(r->grads[0]->grad->dtype, PS__V1__DTYPE__DTYPE_FLOAT32);
        ck_assert_str_eq(r->grads[0]->name, name);
        ps__v1__push_request__free_unpacked(r, NULL);
    }
    ps_buf_free(&buf);
}
END_TEST

static size_t pack_pull(uint8_t **out, const char *n0, float *d0, size_t c0,
                        const char *n1, float *d1, size_t c1)
{
    Ps__V1__Tensor t[2] = {PS__V1__TENSOR__INIT, PS__V1__TENSOR__INIT};
    Ps__V1__VariableValue v[2] = {PS__V1__VARIABLE_VALUE__INIT,
                                  PS__V1__VARIABLE_VALUE__INIT};
    Ps__V1__VariableValue *pv[2] = {&v[0], &v[1]};
    t[0].dtype = t[1].dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    t[0].data.data = (uint8_t *)d0;
    t[0].data.len = c0 * sizeof(float);
    t[1].data.data = (uint8_t *)d1;
    t[1].data.len = c1 * sizeof(float);
    v[0].name = (char *)n0;
    v[0].version = 41;
    v[0].value = &t[0];
    v[1].name = (char *)n1;
    v[1].version = 42;
    v[1].value = &t[1];
    Ps__V1__PullResponse r = PS__V1__PULL_RESPONSE__INIT;
    r.n_values = 2;
    r.values = pv;
    size_t len = ps__v1__pull_response__get_packed_size(&r);
    *out = malloc(len);
    ps__v1__pull_response__pack(&r, *out);
    return len;
}

START_TEST(test_pull_decode)
{
    float a[4] = {1, 2, 3, 4}, b[2] = {9, 8};
    uint8_t *msg;
    size_t len = pack_pull(&msg, "a", a, 4, "b", b, 2);
    float ra[4] = {0}, rb[2] = {0};
    ps_client_item items[2] = {{.name = "a", .data = ra, .n = 4},
                               {.name = "b", .data = rb, .n = 2}};
    char err[256];
    ck_assert_int_eq(ps_pull_decode(msg, len, items, 2, err, sizeof err), 0);
    ck_assert_mem_eq(ra, a, sizeof a);
    ck_assert_mem_eq(rb, b, sizeof b);
    ck_assert_uint_eq(items[0].version, 41);
    ck_assert_uint_eq(items[1].version, 42);

    /* The model expects another size: PS_ESHAPE naming the variable. */
    items[1].n = 3;
    ck_assert_int_eq(ps_pull_decode(msg, len, items, 2, err, sizeof err), PS_ESHAPE);
    ck_assert_ptr_nonnull(strstr(err, "'b' has 2 elements"));
    /* Names out of order. */
    items[1].n = 2;
    items[0].name = "b";
    ck_assert_int_eq(ps_pull_decode(msg, len, items, 2, err, sizeof err), PS_EPARSE);
    /* The same message in pieces cut at every pair of places decodes the
     * same. */
    for (size_t cut1 = 0; cut1 < len; cut1 += 3) {
        for (size_t cut2 = cut1; cut2 <= len; cut2 += 5) {
            struct ps_piece p[3] = {{msg, cut1}, {msg + cut1, cut2 - cut1},
                                    {msg + cut2, len - cut2}};
            memset(ra, 0, sizeof ra);
            memset(rb, 0, sizeof rb);
            items[0].name = "a";
            items[1].n = 2;
            ck_assert_int_eq(ps_pull_decode_pieces(p, 3, items, 2, err, sizeof err), 0);
            ck_assert_mem_eq(ra, a, sizeof a);
            ck_assert_mem_eq(rb, b, sizeof b);
        }
    }
    /* Every truncation is refused without reading past the end. */
    items[0].name = "a";
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *part = malloc(cut ? cut : 1);
        memcpy(part, msg, cut);
        ck_assert_int_ne(ps_pull_decode(part, cut, items, 2, err, sizeof err), 0);
        free(part);
    }
    free(msg);
}
END_TEST

PSCHECK_MAIN("psclient",
    {"ps_push_encode", {test_push_encode}},
    {"ps_pull_decode", {test_pull_decode}})
