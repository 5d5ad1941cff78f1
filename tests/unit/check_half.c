/* Half-precision conversions (common/half.c): the dispatched kernels (F16C,
 * AVX512-BF16, AVX2, whichever this CPU has) against the portable C
 * reference on random and special values, every half bit pattern through
 * float32 and back, float16's clamp and its count, NaN/Inf detection, and
 * error feedback's invariant: the sum of what was sent plus the residual
 * equals the sum of the true gradients. numpy's float16 and a numpy
 * bfloat16 rounding are the oracle in tests/python/test_half.py. */
#include "tests/unit/pscheck.h"
#include "common/half.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rng = 12345;

static uint32_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

static float f_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* n floats: random bit patterns, random values at several scales, and
 * the edges (0, -0, Inf, NaN, 65504, 65519.99, 65520, subnormals). */
static float *values(size_t n)
{
    float *v = malloc(n * sizeof *v);
    static const float edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f,
                                 65519.99f, 65520.0f, -65520.0f, 1e9f, 6e-8f, 3e-8f,
                                 2.9e-8f, 5.96e-8f, 6.1e-5f, 1.0f, -1.0f, 1.00048828125f,
                                 0.1f, 3.4e38f};
    /* NaNs whose payload would carry into the exponent, or the sign, if a
     * kernel rounded them as numbers; the signalling one too. */
    static const uint32_t nan_bits[] = {0x7fffffffu, 0xffffffffu, 0x7f800001u, 0x7fbfffffu};
    size_t n_edge = sizeof edge / sizeof edge[0], n_nan = sizeof nan_bits / sizeof nan_bits[0];
    for (size_t i = 0; i < n; i++) {
        if (i < n_edge)
            v[i] = edge[i];
        else if (i < n_edge + n_nan)
            v[i] = f_of(nan_bits[i - n_edge]);
        else if (i % 3 == 0)
            v[i] = f_of(next());
        else
            v[i] = ((float)(next() % 2000000) / 1e6f - 1.0f) *
                   powf(10.0f, (float)((int)(next() % 12) - 8));
    }
    return v;
}

static bool subnormal32(float x)
{
    return x != 0.0f && fabsf(x) < 1.17549435e-38f;
}

START_TEST(test_kernels_match_portable)
{
    size_t n = 100003; /* not a multiple of a vector: the tails too */
    float *v = values(n);
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    float *fa = malloc(n * 4), *fb = malloc(n * 4);
    for (int type = PS_HALF_F16; type <= PS_HALF_BF16; type++) {
        size_t ca = ps_half_from_f32(type, v, a, n);
        size_t cb = ps_half_from_f32_portable(type, v, b, n);
        ck_assert_uint_eq(ca, cb);
        for (size_t i = 0; i < n; i++) {
            /* AVX512-BF16 reads float32 subnormals as zero (half.h). */
            if (type == PS_HALF_BF16 && subnormal32(v[i]) &&
                strcmp(ps_half_kernel(type, false), "avx512bf16") == 0) {
                ck_assert_uint_eq(a[i] & 0x7fff, 0);
                continue;
            }
            ck_assert_msg(a[i] == b[i], "%s %s: %a -> %04x, portable %04x",
                          type == PS_HALF_F16 ? "f16" : "bf16",
                          ps_half_kernel(type, false), (double)v[i], a[i], b[i]);
        }
        ps_half_to_f32(type, b, fa, n);
        ps_half_to_f32_portable(type, b, fb, n);
        ck_assert_int_eq(memcmp(fa, fb, n * 4), 0);
    }
    free(v);
    free(a);
    free(b);
    free(fa);
    free(fb);
}
END_TEST

START_TEST(test_round_trip_all_patterns)
{
    uint16_t h[65536], back[65536];
    float f[65536];
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    for (int type = PS_HALF_F16; type <= PS_HALF_BF16; type++) {
        ps_half_to_f32(type, h, f, 65536);
        ck_assert_uint_eq(ps_half_from_f32_portable(type, f, back, 65536), 0);
        for (uint32_t i = 0; i < 65536; i++) {
            if (isnan(f[i])) {
                ck_assert(isnan(ps_half_to_f32_one(type, back[i])));
                continue;
            }
            ck_assert_msg(back[i] == h[i], "type %d: %04x -> %a -> %04x", type, i,
                          (double)f[i], back[i]);
        }
    }
}
END_TEST

START_TEST(test_f16_values)
{
    bool c;
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_F16, 1.0f, &c), 0x3c00);
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_F16, -2.0f, &c), 0xc000);
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_F16, 65504.0f, &c), 0x7bff);
    ck_assert(!c);
    /* 65519.99 rounds down to 65504; 65520 and beyond would be Inf. */
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_F16, 65519.99f, &c), 0x7bff);
    ck_assert(!c);
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_F16, 65520.0f, &c), 0x7bff);
    ck_assert(c);
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_F16, -1e30f, &c), 0xfbff);
    ck_assert(c);
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_F16, INFINITY, &c), 0x7c00);
    ck_assert(!c);
    /* The smallest subnormal, 2^-24, and a tie below it to even (0). */
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_F16, 0x1p-24f, &c), 0x0001);
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_F16, 0x1p-25f, &c), 0x0000);
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_F16, 0x1.8p-24f, &c), 0x0002);
    /* 1 + 2^-11 is a tie between 1 and 1 + 2^-10: to even, 1. */
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_F16, 1.0f + 0x1p-11f, &c), 0x3c00);
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_BF16, 1.0f, &c), 0x3f80);
    /* bf16: 1 + 2^-8 is a tie: to even (1); 1 + 3 x 2^-8 up to 1 + 2^-6. */
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_BF16, 1.0f + 0x1p-8f, &c), 0x3f80);
    ck_assert_uint_eq(ps_half_from_f32_one(PS_HALF_BF16, 1.0f + 0x3p-8f, &c), 0x3f82);
    float big[32];
    uint16_t out[32];
    for (int i = 0; i < 32; i++)
        big[i] = i % 4 == 0 ? 7e4f : i % 4 == 1 ? -1e5f : 1.0f;
    ck_assert_uint_eq(ps_half_from_f32(PS_HALF_F16, big, out, 32), 16);
    ck_assert_uint_eq(out[0], 0x7bff);
    ck_assert_uint_eq(out[1], 0xfbff);
}
END_TEST

START_TEST(test_nonfinite)
{
    uint16_t h[40] = {0};
    ck_assert(!ps_half_nonfinite(PS_HALF_F16, h, 40));
    h[37] = 0x7c00; /* f16 Inf */
    ck_assert(ps_half_nonfinite(PS_HALF_F16, h, 40));
    ck_assert(!ps_half_nonfinite(PS_HALF_BF16, h, 40)); /* a finite bf16 */
    h[37] = 0xff81; /* bf16 NaN */
    ck_assert(ps_half_nonfinite(PS_HALF_BF16, h, 40));
}
END_TEST

/* The fused error-feedback kernels give, bit for bit, what the rounding of
 * one element at a time gives: the half sent and the residual kept, over
 * every kind of value (subnormal, huge, NaN) and the vector tails. */
START_TEST(test_error_feedback_kernels)
{
    size_t n = 100003;
    /* The loop named is one this CPU runs: F16C or AVX2 where it has them. */
    ck_assert(strcmp(ps_half_ef_kernel(PS_HALF_F16), ps_half_kernel(PS_HALF_F16, false)) == 0);
    ck_assert(strcmp(ps_half_ef_kernel(PS_HALF_BF16), ps_half_kernel(PS_HALF_BF16, true)) == 0);
    float *g = values(n), *r = malloc(n * 4), *r_ref = malloc(n * 4);
    uint16_t *out = malloc(n * 2);
    for (int type = PS_HALF_F16; type <= PS_HALF_BF16; type++) {
        for (size_t i = 0; i < n; i++)
            r[i] = r_ref[i] = (float)(next() % 2001) * 1e-6f - 1e-3f;
        size_t clamped = ps_half_encode_ef(type, g, r, out, n), clamped_ref = 0;
        for (size_t i = 0; i < n; i++) {
            float t = g[i] + r_ref[i];
            bool c = false;
            uint16_t h = ps_half_from_f32_one(type, t, &c);
            clamped_ref += c;
            r_ref[i] = t - ps_half_to_f32_one(type, h);
            ck_assert_msg(out[i] == h, "%s: %a + %a -> %04x, one at a time %04x",
                          type == PS_HALF_F16 ? "f16" : "bf16", (double)g[i],
                          (double)(t - g[i]), out[i], h);
            ck_assert_msg(memcmp(&r[i], &r_ref[i], 4) == 0 || (isnan(r[i]) && isnan(r_ref[i])),
                          "residual %zu: %a against %a", i, (double)r[i], (double)r_ref[i]);
        }
        ck_assert_uint_eq(clamped, clamped_ref);
    }
    free(g);
    free(r);
    free(r_ref);
    free(out);
}
END_TEST

/* The widening that finds the largest magnitude on the way gives the
 * plain widening's floats, and the largest |h| of what it read, wherever
 * the largest, an Inf or a NaN lies, at an odd address too. */
START_TEST(test_to_f32_mag)
{
    enum { N = 1037 };
    uint16_t *buf = malloc((N + 1) * 2), *h = buf + 1; /* 2-aligned, not 4 */
    float *a = malloc(N * 4), *b = malloc(N * 4);
    uint8_t *odd = malloc(N * 2 + 1);
    for (int type = PS_HALF_F16; type <= PS_HALF_BF16; type++) {
        uint16_t inf = type == PS_HALF_F16 ? 0x7c00 : 0x7f80;
        for (size_t i = 0; i < N; i++)
            h[i] = (uint16_t)(next() % inf) | (uint16_t)(next() & 0x8000); /* finite */
        for (size_t len = 0; len <= N; len += len < 20 ? 1 : 101) {
            uint16_t want = 0;
            for (size_t i = 0; i < len; i++)
                want = (uint16_t)(h[i] & 0x7fff) > want ? (uint16_t)(h[i] & 0x7fff) : want;
            ck_assert_uint_eq(ps_half_to_f32_mag(type, h, a, len), want);
            ps_half_to_f32_portable(type, h, b, len);
            ck_assert_int_eq(memcmp(a, b, len * 4), 0);
            memcpy(odd + 1, h, len * 2);
            ck_assert_uint_eq(ps_half_to_f32_mag(type, (const uint16_t *)(void *)(odd + 1),
                                                 a, len), want);
            ck_assert_int_eq(memcmp(a, b, len * 4), 0);
        }
        uint16_t bad[] = {inf, (uint16_t)(inf | 0x8000), (uint16_t)(inf | 0x41), 0xffff};
        for (size_t k = 0; k < 4; k++)
            for (size_t at = 0; at < N; at += 97) {
                uint16_t keep = h[at];
                h[at] = bad[k];
                ck_assert_uint_eq(ps_half_to_f32_mag(type, h, a, N), bad[k] & 0x7fff);
                ck_assert(ps_half_to_f32_mag(type, h, a, at) < inf); /* before it */
                h[at] = keep;
            }
    }
    free(buf);
    free(a);
    free(b);
    free(odd);
}
END_TEST

/* One Inf or NaN anywhere in a long array, in the vector body or the tail. */
START_TEST(test_nonfinite_positions)
{
    enum { N = 1037 };
    uint16_t h[N];
    for (int type = PS_HALF_F16; type <= PS_HALF_BF16; type++) {
        uint16_t bad = type == PS_HALF_F16 ? 0xfc00 : 0x7fc1;
        for (size_t i = 0; i < N; i++)
            h[i] = (uint16_t)(0x3c00 + (i & 0x3ff)); /* finite in both types */
        ck_assert(!ps_half_nonfinite(type, h, N));
        for (size_t at = 0; at < N; at += 97) {
            uint16_t keep = h[at];
            h[at] = bad;
            ck_assert_msg(ps_half_nonfinite(type, h, N), "type %d: missed at %zu", type, at);
            ck_assert(!ps_half_nonfinite(type, h, at)); /* before it: finite */
            h[at] = keep;
        }
        h[N - 1] = bad;
        ck_assert(ps_half_nonfinite(type, h, N));
    }
}
END_TEST

/* Over many steps: sum(sent) + residual == sum(g), in double, within the
 * float32 rounding of g + r at each step; without feedback the rounding
 * error grows with the step count instead. */
START_TEST(test_error_feedback_invariant)
{
    enum { N = 1000, STEPS = 500 };
    for (int type = PS_HALF_F16; type <= PS_HALF_BF16; type++) {
        float g[N], r[N] = {0}, back[N];
        uint16_t out[N];
        static double sum_g[N], sum_sent[N], sum_plain[N];
        memset(sum_g, 0, sizeof sum_g);
        memset(sum_sent, 0, sizeof sum_sent);
        memset(sum_plain, 0, sizeof sum_plain);
        for (int s = 0; s < STEPS; s++) {
            for (int i = 0; i < N; i++) {
                g[i] = ((float)(next() % 20001) / 10000.0f - 1.0f) * 1e-3f;
                sum_g[i] += g[i];
            }
            ps_half_encode_ef(type, g, r, out, N);
            ps_half_to_f32(type, out, back, N);
            for (int i = 0; i < N; i++)
                sum_sent[i] += back[i];
            ps_half_encode_ef(type, g, NULL, out, N);
            ps_half_to_f32(type, out, back, N);
            for (int i = 0; i < N; i++)
                sum_plain[i] += back[i];
        }
        double worst = 0, worst_plain = 0;
        for (int i = 0; i < N; i++) {
            worst = fmax(worst, fabs(sum_sent[i] + r[i] - sum_g[i]));
            worst_plain = fmax(worst_plain, fabs(sum_plain[i] - sum_g[i]));
        }
        /* Each step's g + r rounds by at most 2^-24 x 2e-3. */
        ck_assert_msg(worst < STEPS * 2e-3 * 0x1p-23, "type %d: |sent + r - g| "
                      "%g", type, worst);
        ck_assert_msg(worst_plain > 100 * worst, "type %d: plain rounding error "
                      "%g is not far above feedback's %g", type, worst_plain, worst);
    }
}
END_TEST

PSCHECK_MAIN("half",
    {"kernels", {test_kernels_match_portable, test_round_trip_all_patterns}},
    {"values", {test_f16_values, test_nonfinite, test_nonfinite_positions, test_to_f32_mag}},
    {"feedback", {test_error_feedback_invariant, test_error_feedback_kernels}})
