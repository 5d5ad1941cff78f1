#include "common/errors.h"
#include "server/init.h"
#include "tests/unit/pscheck.h"
#include "tests/unit/refusals.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Samples for the moment tests: the standard error of a mean is then
 * stddev / 1000, far inside the 3% tolerances. */
#define MANY 1000000

static float *many_a, *many_b;

static void setup_many(void)
{
    many_a = malloc(MANY * sizeof *many_a);
    many_b = malloc(MANY * sizeof *many_b);
    ck_assert_ptr_nonnull(many_a);
    ck_assert_ptr_nonnull(many_b);
}

static void teardown_many(void)
{
    free(many_a);
    free(many_b);
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static psd_init spec(enum psd_init_kind kind, uint64_t seed)
{
    psd_init i = {.kind = kind, .seed = seed};
    psd_init_defaults(&i);
    return i;
}

struct moments {
    double mean, std, min, max;
};

static struct moments moments_of(const float *x, size_t n)
{
    double sum = 0.0, sum2 = 0.0;
    struct moments m = {.min = INFINITY, .max = -INFINITY};
    for (size_t k = 0; k < n; k++) {
        sum += x[k];
        if (x[k] < m.min)
            m.min = x[k];
        if (x[k] > m.max)
            m.max = x[k];
    }
    m.mean = sum / (double)n;
    for (size_t k = 0; k < n; k++)
        sum2 += ((double)x[k] - m.mean) * ((double)x[k] - m.mean);
    m.std = sqrt(sum2 / (double)n);
    return m;
}

/* ---- psd_philox4x32_10 ------------------------------------------------ */

/* Random123's published known answers (its tests/kat_vectors). */
START_TEST(test_philox_known_answers)
{
    static const struct {
        uint32_t ctr[4], key[2], want[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0},
         {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t k = 0; k < sizeof kat / sizeof kat[0]; k++) {
        uint32_t out[4];
        psd_philox4x32_10(kat[k].ctr, kat[k].key, out);
        ck_assert_mem_eq(out, kat[k].want, sizeof out);
    }
}
END_TEST

/* ---- psd_init_defaults ------------------------------------------------ */

START_TEST(test_defaults)
{
    psd_init i = {.kind = PSD_INIT_NORMAL};
    psd_init_defaults(&i);
    ck_assert_float_eq(i.stddev, 1.0f);
    ck_assert_float_eq(i.mean, 0.0f);

    i = (psd_init){.kind = PSD_INIT_TRUNCATED_NORMAL, .stddev = -0.0f};
    psd_init_defaults(&i);
    ck_assert_float_eq(i.stddev, 1.0f);

    i = (psd_init){.kind = PSD_INIT_NORMAL, .mean = 3.0f, .stddev = 0.5f};
    psd_init_defaults(&i);
    ck_assert_float_eq(i.mean, 3.0f);
    ck_assert_float_eq(i.stddev, 0.5f);

    i = (psd_init){.kind = PSD_INIT_UNIFORM};
    psd_init_defaults(&i);
    ck_assert_float_eq(i.minval, -0.05f);
    ck_assert_float_eq(i.maxval, 0.05f);

    /* One bound set: both kept. */
    i = (psd_init){.kind = PSD_INIT_UNIFORM, .maxval = 1.0f};
    psd_init_defaults(&i);
    ck_assert_float_eq(i.minval, 0.0f);
    ck_assert_float_eq(i.maxval, 1.0f);

    /* Only UNIFORM reads minval and maxval. */
    i = (psd_init){.kind = PSD_INIT_CONSTANT, .value = 2.0f};
    psd_init_defaults(&i);
    ck_assert_float_eq(i.minval, 0.0f);
    ck_assert_float_eq(i.maxval, 0.0f);
    ck_assert_float_eq(i.value, 2.0f);
}
END_TEST

/* ---- psd_init_validate ------------------------------------------------ */

START_TEST(test_validate_accepts_defaults)
{
    char why[256];
    for (int k = PSD_INIT_ZEROS; k <= PSD_INIT_GLOROT_UNIFORM; k++) {
        psd_init i = spec((enum psd_init_kind)k, 7);
        ck_assert_int_eq(psd_init_validate(&i, why, sizeof why), 0);
    }
}
END_TEST

START_TEST(test_validate_unknown_kind)
{
    char why[256];
    psd_init i = spec(PSD_INIT_ZEROS, 0);
    i.kind = (enum psd_init_kind)6;
    ck_assert_int_eq(psd_init_validate(&i, why, sizeof why), PS_EINVAL_ARG);
    ck_assert_ptr_nonnull(strstr(why, "initializer kind 6 is unknown"));
    i.kind = (enum psd_init_kind)-2;
    ck_assert_int_eq(psd_init_validate(&i, NULL, 0), PS_EINVAL_ARG);
}
END_TEST

/* psd_init_validate on a row of a refusal table (refusals.h). */
static int validate_row(const struct ps_refusal *row, char *why, size_t whylen)
{
    psd_init i = spec((enum psd_init_kind)row->kind, 0);
    ps_refusal_apply(&i, row);
    return psd_init_validate(&i, why, whylen);
}

#define SET(field, v) {offsetof(psd_init, field), v}

START_TEST(test_validate_uniform_bounds)
{
    const struct ps_refusal t[] = {
        {PSD_INIT_UNIFORM, {SET(minval, 1.0f), SET(maxval, 1.0f)}, PS_EINVAL_ARG,
         "initializer UNIFORM: maxval must exceed minval, got minval 1 maxval 1"},
        {PSD_INIT_UNIFORM, {SET(minval, 1.0f), SET(maxval, -3.0f)}, PS_EINVAL_ARG, NULL,
         "got minval 1 maxval -3"},
        {PSD_INIT_UNIFORM, {SET(minval, 1.0f), SET(maxval, nextafterf(1.0f, 2.0f))}, 0},
        /* Other kinds ignore the bounds. */
        {PSD_INIT_NORMAL, {SET(minval, 1.0f), SET(maxval, -3.0f)}, 0},
    };
    PS_CHECK_REFUSALS(t, validate_row);
}
END_TEST

START_TEST(test_validate_stddev)
{
    const struct ps_refusal t[] = {
        {PSD_INIT_NORMAL, {SET(stddev, -1.0f)}, PS_EINVAL_ARG,
         "initializer NORMAL: stddev must be > 0, got -1"},
        {PSD_INIT_TRUNCATED_NORMAL, {SET(stddev, -1.0f)}, PS_EINVAL_ARG,
         "initializer TRUNCATED_NORMAL: stddev must be > 0, got -1"},
        /* not defaulted: refused */
        {PSD_INIT_TRUNCATED_NORMAL, {SET(stddev, 0.0f)}, PS_EINVAL_ARG},
        {PSD_INIT_GLOROT_UNIFORM, {SET(stddev, 0.0f)}, 0}, /* ignores stddev */
    };
    PS_CHECK_REFUSALS(t, validate_row);
}
END_TEST

START_TEST(test_validate_non_finite)
{
    const struct ps_refusal t[] = {
        {PSD_INIT_CONSTANT, {SET(value, NAN)}, PS_EINVAL_ARG,
         "initializer CONSTANT: value must be finite, got nan"},
        {PSD_INIT_CONSTANT, {SET(value, INFINITY)}, PS_EINVAL_ARG,
         "initializer CONSTANT: value must be finite, got inf"},
        {PSD_INIT_UNIFORM, {SET(minval, -INFINITY)}, PS_EINVAL_ARG, NULL,
         "minval must be finite, got -inf"},
        {PSD_INIT_UNIFORM, {SET(maxval, INFINITY)}, PS_EINVAL_ARG, NULL,
         "maxval must be finite"},
        {PSD_INIT_NORMAL, {SET(mean, NAN)}, PS_EINVAL_ARG, NULL, "mean must be finite"},
        {PSD_INIT_TRUNCATED_NORMAL, {SET(stddev, INFINITY)}, PS_EINVAL_ARG, NULL,
         "stddev must be finite"},
        /* Even in a field the kind ignores. */
        {PSD_INIT_ZEROS, {SET(mean, NAN)}, PS_EINVAL_ARG,
         "initializer ZEROS: mean must be finite, got nan"},
    };
    PS_CHECK_REFUSALS(t, validate_row);
}
END_TEST

#undef SET

START_TEST(test_validate_why_short)
{
    char why[10];
    psd_init i = spec(PSD_INIT_NORMAL, 0);
    i.stddev = -1.0f;
    ck_assert_int_eq(psd_init_validate(&i, why, sizeof why), PS_EINVAL_ARG);
    ck_assert_str_eq(why, "initializ");
    ck_assert_int_eq(psd_init_validate(&i, NULL, 0), PS_EINVAL_ARG);
}
END_TEST

/* ---- psd_init_name ---------------------------------------------------- */

START_TEST(test_name)
{
    /* Each kind by its name; one past either end (6 and -1) is UNKNOWN. */
    static const char *const names[] = {"ZEROS", "CONSTANT", "UNIFORM", "NORMAL",
                                        "TRUNCATED_NORMAL", "GLOROT_UNIFORM"};
    for (int k = PSD_INIT_ZEROS - 1; k <= PSD_INIT_GLOROT_UNIFORM + 1; k++) {
        bool known = k >= PSD_INIT_ZEROS && k <= PSD_INIT_GLOROT_UNIFORM;
        ck_assert_str_eq(psd_init_name((enum psd_init_kind)k),
                         known ? names[k - PSD_INIT_ZEROS] : "UNKNOWN");
    }
}
END_TEST

/* ---- psd_init_fill: the deterministic kinds --------------------------- */

START_TEST(test_fill_zeros)
{
    float w[1001];
    memset(w, 0xab, sizeof w);
    psd_init i = spec(PSD_INIT_ZEROS, 0);
    psd_init_fill(&i, w, 1001, NULL, 0);
    for (size_t k = 0; k < 1001; k++)
        ck_assert_uint_eq(bits_of(w[k]), 0); /* +0, not -0 */
    /* An unknown kind fills zeros too. */
    memset(w, 0xab, sizeof w);
    i.kind = (enum psd_init_kind)42;
    psd_init_fill(&i, w, 1001, NULL, 0);
    for (size_t k = 0; k < 1001; k++)
        ck_assert_uint_eq(bits_of(w[k]), 0);
    psd_init_fill(&i, NULL, 0, NULL, 0);
}
END_TEST

START_TEST(test_fill_constant)
{
    float w[1001];
    psd_init i = {.kind = PSD_INIT_CONSTANT, .value = -3.25f};
    psd_init_defaults(&i);
    psd_init_fill(&i, w, 1001, (const int64_t[]){7, 11, 13}, 3);
    for (size_t k = 0; k < 1001; k++)
        ck_assert_float_eq(w[k], -3.25f);
    /* CONSTANT with value 0 is all zeros. */
    i.value = 0.0f;
    psd_init_fill(&i, w, 1001, NULL, 0);
    for (size_t k = 0; k < 1001; k++)
        ck_assert_uint_eq(bits_of(w[k]), 0);
}
END_TEST

/* ---- psd_init_fill: reproducibility ----------------------------------- */

static const enum psd_init_kind random_kinds[] = {
    PSD_INIT_UNIFORM, PSD_INIT_NORMAL, PSD_INIT_TRUNCATED_NORMAL,
    PSD_INIT_GLOROT_UNIFORM,
};
#define NRANDOM (sizeof random_kinds / sizeof random_kinds[0])

START_TEST(test_fill_same_seed_same_bits)
{
    static float a[4099], b[4099];
    const int64_t shape[] = {4099};
    for (size_t r = 0; r < NRANDOM; r++) {
        for (uint64_t seed = 0; seed < 3; seed++) {
            psd_init i = spec(random_kinds[r], seed * UINT64_C(0x9e3779b97f4a7c15));
            memset(a, 0x11, sizeof a);
            memset(b, 0x22, sizeof b);
            psd_init_fill(&i, a, 4099, shape, 1);
            psd_init_fill(&i, b, 4099, shape, 1);
            ck_assert_mem_eq(a, b, sizeof a);
        }
    }
}
END_TEST

START_TEST(test_fill_different_seed_differs)
{
    static float a[4099], b[4099];
    const int64_t shape[] = {4099};
    for (size_t r = 0; r < NRANDOM; r++) {
        psd_init i = spec(random_kinds[r], 0); /* 0 is a seed like any other */
        psd_init j = spec(random_kinds[r], 1);
        psd_init h = spec(random_kinds[r], UINT64_C(1) << 32); /* high word */
        psd_init_fill(&i, a, 4099, shape, 1);
        psd_init_fill(&j, b, 4099, shape, 1);
        size_t same = 0;
        for (size_t k = 0; k < 4099; k++)
            same += bits_of(a[k]) == bits_of(b[k]);
        ck_assert_uint_lt(same, 10);
        psd_init_fill(&h, b, 4099, shape, 1);
        same = 0;
        for (size_t k = 0; k < 4099; k++)
            same += bits_of(a[k]) == bits_of(b[k]);
        ck_assert_uint_lt(same, 10);
    }
}
END_TEST

/* Element k depends only on (seed, k): a short fill is a prefix of a long
 * one, and a range fill is a slice of it, from any offset. */
START_TEST(test_fill_prefix_and_range)
{
    static float whole[1000], part[1000];
    const int64_t shape[] = {40, 25};
    for (size_t r = 0; r < NRANDOM; r++) {
        psd_init i = spec(random_kinds[r], 12345);
        psd_init_fill(&i, whole, 1000, shape, 2);
        psd_init_fill(&i, part, 10, shape, 2);
        ck_assert_mem_eq(part, whole, 10 * sizeof *part);
        const size_t cuts[][2] = {{0, 1}, {3, 5}, {1, 998}, {999, 1},
                                  {500, 300}, {4, 4}, {7, 0}};
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            memset(part, 0x33, sizeof part);
            psd_init_fill_range(&i, part, cuts[c][0], cuts[c][1], shape, 2);
            ck_assert_mem_eq(part, whole + cuts[c][0],
                             cuts[c][1] * sizeof *part);
        }
    }
}
END_TEST

/* The stream is part of the contract: these bits must never change (a
 * change would give every new variable different values than before). */
START_TEST(test_fill_pinned_bits)
{
    float w[4];
    psd_init u = {.kind = PSD_INIT_UNIFORM, .minval = -1.0f, .maxval = 1.0f,
                  .seed = 42};
    psd_init_defaults(&u);
    psd_init_fill(&u, w, 4, NULL, 0);
    const uint32_t want_u[4] = {0x3e675783, 0xbd80ab6c, 0xbf5a815f,
                                0xbea2f531};
    for (int k = 0; k < 4; k++)
        ck_assert_msg(bits_of(w[k]) == want_u[k], "uniform[%d] = 0x%08x",
                      k, bits_of(w[k]));
    psd_init n = spec(PSD_INIT_NORMAL, 42);
    psd_init_fill(&n, w, 4, NULL, 0);
    const uint32_t want_n[4] = {0x3f62f180, 0xbe205e46, 0xbefcfabe,
                                0xbf2e0d61};
    for (int k = 0; k < 4; k++)
        ck_assert_msg(bits_of(w[k]) == want_n[k], "normal[%d] = 0x%08x", k,
                      bits_of(w[k]));
}
END_TEST

/* FNV-1a over the little-endian bytes of each float: a byte order that does
 * not depend on the host's. */
static uint64_t fnv1a(const float *x, size_t n)
{
    uint64_t h = UINT64_C(14695981039346656037);
    for (size_t k = 0; k < n; k++) {
        uint32_t b = bits_of(x[k]);
        for (int byte = 0; byte < 4; byte++) {
            h ^= (b >> (8 * byte)) & 0xff;
            h *= UINT64_C(1099511628211);
        }
    }
    return h;
}

/* Whole streams pinned too, so that a change in the last bit of one element
 * among many (a coefficient of the log or cosine series, say) is caught. */
START_TEST(test_fill_pinned_hashes)
{
    static float w[65536];
    const int64_t shape[] = {256, 256};
    static const struct {
        enum psd_init_kind kind;
        uint64_t hash;
    } pinned[] = {
        {PSD_INIT_UNIFORM, UINT64_C(0xc08747a45b3a9d2c)},
        {PSD_INIT_NORMAL, UINT64_C(0x96c9b01caf9dc675)},
        {PSD_INIT_TRUNCATED_NORMAL, UINT64_C(0xdb5d3ce307974ab3)},
        {PSD_INIT_GLOROT_UNIFORM, UINT64_C(0xc0dd2369b1d2aeb6)},
    };
    for (size_t k = 0; k < sizeof pinned / sizeof pinned[0]; k++) {
        psd_init i = spec(pinned[k].kind, 42);
        psd_init_fill(&i, w, 65536, shape, 2);
        uint64_t h = fnv1a(w, 65536);
        ck_assert_msg(h == pinned[k].hash, "%s: hash 0x%016llx",
                      psd_init_name(pinned[k].kind), (unsigned long long)h);
    }
}
END_TEST

/* The documented layout, recomputed here from the generator and libm: a
 * uniform element k is word k % 4 of block (k / 4, 0) over 2^32; a normal
 * element k is Box-Muller's cosine branch on block (k, 0), 53 bits each for
 * u1 in (0, 1] and u2 in [0, 1). libm may differ from init.c's own log and
 * cosine in the last bit of a double, never by a float's ulp in practice. */
START_TEST(test_fill_matches_documented_layout)
{
    enum { K = 64 };
    float w[K];
    const uint64_t seed = UINT64_C(0x0123456789abcdef);
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};

    psd_init u = {.kind = PSD_INIT_UNIFORM, .minval = -2.0f, .maxval = 6.0f,
                  .seed = seed};
    psd_init_fill(&u, w, K, NULL, 0);
    for (uint32_t k = 0; k < K; k++) {
        uint32_t out[4], ctr[4] = {k / 4, 0, 0, 0};
        psd_philox4x32_10(ctr, key, out);
        double x = -2.0 + 8.0 * ((double)out[k % 4] * 0x1p-32);
        ck_assert_float_eq(w[k], (float)x);
    }

    psd_init n = {.kind = PSD_INIT_NORMAL, .mean = 1.0f, .stddev = 2.0f,
                  .seed = seed};
    psd_init_fill(&n, w, K, NULL, 0);
    for (uint32_t k = 0; k < K; k++) {
        uint32_t r[4], ctr[4] = {k, 0, 0, 0};
        psd_philox4x32_10(ctr, key, r);
        uint64_t a = ((((uint64_t)r[0] << 32) | r[1]) >> 11) + 1;
        uint64_t b = (((uint64_t)r[2] << 32) | r[3]) >> 11;
        double u1 = (double)a * 0x1p-53, u2 = (double)b * 0x1p-53;
        double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
        double x = 1.0 + 2.0 * z;
        ck_assert_msg(fabs(w[k] - x) <= 1e-6 * fmax(1.0, fabs(x)),
                      "normal[%u] = %.9g, libm gives %.9g", k, (double)w[k], x);
    }
}
END_TEST

/* ---- psd_init_fill: distributions ------------------------------------- */

START_TEST(test_fill_uniform_moments)
{
    psd_init i = {.kind = PSD_INIT_UNIFORM, .minval = -2.0f, .maxval = 3.0f,
                  .seed = 1};
    psd_init_fill(&i, many_a, MANY, NULL, 0);
    struct moments m = moments_of(many_a, MANY);
    ck_assert_double_ge(m.min, -2.0);
    ck_assert_double_lt(m.max, 3.0);
    ck_assert_double_lt(m.min, -2.0 + 1e-4); /* the range is attained */
    ck_assert_double_gt(m.max, 3.0 - 1e-4);
    ck_assert_double_eq_tol(m.mean, 0.5, 0.03 * 0.5);
    double var = 25.0 / 12.0;
    ck_assert_double_eq_tol(m.std * m.std, var, 0.03 * var);

    /* The default range. */
    i = spec(PSD_INIT_UNIFORM, 2);
    psd_init_fill(&i, many_a, MANY, NULL, 0);
    m = moments_of(many_a, MANY);
    ck_assert_double_ge(m.min, -0.05f);
    ck_assert_double_lt(m.max, 0.05f);
    ck_assert_double_eq_tol(m.std, 0.1 / sqrt(12.0), 0.03 * 0.1 / sqrt(12.0));
}
END_TEST

/* A range one float wide: every draw that would round up to maxval must
 * come back below it. */
START_TEST(test_fill_uniform_never_maxval)
{
    float w[4096];
    psd_init i = {.kind = PSD_INIT_UNIFORM, .minval = 1.0f,
                  .maxval = nextafterf(1.0f, 2.0f), .seed = 3};
    psd_init_fill(&i, w, 4096, NULL, 0);
    for (size_t k = 0; k < 4096; k++)
        ck_assert_float_eq(w[k], 1.0f);
    i = (psd_init){.kind = PSD_INIT_UNIFORM, .minval = -1e30f,
                   .maxval = 1e30f, .seed = 4};
    psd_init_fill(&i, w, 4096, NULL, 0);
    for (size_t k = 0; k < 4096; k++)
        ck_assert(w[k] >= -1e30f && w[k] < 1e30f);
}
END_TEST

START_TEST(test_fill_normal_moments)
{
    psd_init i = {.kind = PSD_INIT_NORMAL, .mean = 2.0f, .stddev = 3.0f,
                  .seed = 5};
    psd_init_fill(&i, many_a, MANY, NULL, 0);
    struct moments m = moments_of(many_a, MANY);
    ck_assert_double_eq_tol(m.mean, 2.0, 0.03 * 2.0);
    ck_assert_double_eq_tol(m.std, 3.0, 0.03 * 3.0);
    /* Its tails are a normal's: 4.55% beyond 2 sigma, 0.27% beyond 3. */
    size_t beyond2 = 0, beyond3 = 0;
    for (size_t k = 0; k < MANY; k++) {
        double z = fabs((many_a[k] - 2.0) / 3.0);
        beyond2 += z > 2.0;
        beyond3 += z > 3.0;
    }
    ck_assert_double_eq_tol((double)beyond2 / MANY, 0.0455, 0.03 * 0.0455);
    ck_assert_double_eq_tol((double)beyond3 / MANY, 0.0027, 0.1 * 0.0027);

    /* A zero mean and the default stddev. */
    i = spec(PSD_INIT_NORMAL, 6);
    psd_init_fill(&i, many_a, MANY, NULL, 0);
    m = moments_of(many_a, MANY);
    ck_assert_double_eq_tol(m.mean, 0.0, 0.03);
    ck_assert_double_eq_tol(m.std, 1.0, 0.03);
}
END_TEST

START_TEST(test_fill_truncated_normal)
{
    const float mean = -1.0f, sd = 0.5f;
    psd_init i = {.kind = PSD_INIT_TRUNCATED_NORMAL, .mean = mean,
                  .stddev = sd, .seed = 7};
    psd_init_fill(&i, many_a, MANY, NULL, 0);
    const float lo = (float)(mean - 2.0 * sd), hi = (float)(mean + 2.0 * sd);
    struct moments m = moments_of(many_a, MANY);
    ck_assert_double_ge(m.min, lo);
    ck_assert_double_le(m.max, hi);
    ck_assert_double_eq_tol(m.mean, mean, 0.03 * fabs(mean));
    /* The standard deviation of a normal truncated at 2 sigma is
     * sqrt(1 - 4 phi(2) / (2 Phi(2) - 1)) = 0.8796 sigma. */
    ck_assert_double_eq_tol(m.std, 0.8796 * sd, 0.03 * 0.8796 * sd);
    ck_assert_double_lt(m.min, lo + 0.01); /* close to the bounds */
    ck_assert_double_gt(m.max, hi - 0.01);

    /* Where NORMAL's draw is in range, TRUNCATED_NORMAL keeps it. */
    psd_init n = i;
    n.kind = PSD_INIT_NORMAL;
    psd_init_fill(&n, many_b, MANY, NULL, 0);
    size_t kept = 0, inside = 0;
    for (size_t k = 0; k < MANY; k++) {
        if (many_b[k] >= lo && many_b[k] <= hi) {
            inside++;
            kept += bits_of(many_a[k]) == bits_of(many_b[k]);
        }
    }
    ck_assert_uint_eq(kept, inside);
    ck_assert_uint_lt(inside, MANY);
}
END_TEST

/* Fills MANY elements for a variable of the given shape and checks the
 * Glorot bound: never reached or passed, approached, and the variance of a
 * uniform on it. */
static void check_glorot(const int64_t *shape, int ndim, double fan_sum)
{
    double limit = sqrt(6.0 / fan_sum);
    psd_init i = spec(PSD_INIT_GLOROT_UNIFORM, (uint64_t)ndim);
    psd_init_fill(&i, many_a, MANY, shape, ndim);
    struct moments m = moments_of(many_a, MANY);
    float flimit = (float)limit;
    ck_assert_double_ge(m.min, -flimit);
    ck_assert_double_lt(m.max, flimit);
    ck_assert_double_gt(m.max, 0.999 * limit);
    ck_assert_double_lt(m.min, -0.999 * limit);
    ck_assert_double_eq_tol(m.mean, 0.0, 0.03 * limit);
    ck_assert_double_eq_tol(m.std, limit / sqrt(3.0), 0.03 * limit / sqrt(3.0));
}

START_TEST(test_fill_glorot)
{
    check_glorot((const int64_t[]){300, 200}, 2, 500.0);
    /* A conv kernel (h, w, in, out): fans scaled by the receptive field. */
    check_glorot((const int64_t[]){3, 3, 64, 128}, 4, 9.0 * (64 + 128));
    check_glorot((const int64_t[]){5, 16, 32}, 3, 5.0 * (16 + 32));
    check_glorot((const int64_t[]){100}, 1, 200.0);
    check_glorot(NULL, 0, 2.0); /* a scalar: fans 1 and 1 */
}
END_TEST

/* The uniform fill psd_init_fill_range picks (AVX2 where the CPU has it)
 * gives the portable reference's bits, from every offset within a few
 * blocks and for lengths around the kernel's four-block step, for seeds
 * with both key words set, indexes past 2^32 (the counter's high word), and
 * a range so narrow that half the draws round up to maxval and must be
 * moved below it. */
START_TEST(test_fill_uniform_kernel_matches_portable)
{
    static float got[300], want[300];
    const float bounds[][2] = {{-0.05f, 0.05f}, {-3.0f, 7.5f},
                               {1.0f, 1.00000012f}, {-1e-30f, 1e-30f}};
    const uint64_t seeds[] = {0, 42, UINT64_C(0xdeadbeefcafef00d)};
    const uint64_t firsts[] = {0, 1, 2, 3, 4, 5, 15, 16, 17, 63, 64,
                               (UINT64_C(1) << 34) - 9};
    const size_t counts[] = {0, 1, 3, 4, 15, 16, 17, 31, 64, 65, 299};
    ck_assert(bits_of(nextafterf(1.0f, 2.0f)) == bits_of(1.00000012f));
    size_t at_edge = 0;
    for (size_t bi = 0; bi < sizeof bounds / sizeof bounds[0]; bi++)
        for (size_t si = 0; si < sizeof seeds / sizeof seeds[0]; si++)
            for (size_t fi = 0; fi < sizeof firsts / sizeof firsts[0]; fi++)
                for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                    psd_init i = {.kind = PSD_INIT_UNIFORM, .minval = bounds[bi][0],
                                  .maxval = bounds[bi][1], .seed = seeds[si]};
                    size_t n = counts[ci];
                    memset(got, 0x5a, sizeof got);
                    memset(want, 0x5a, sizeof want);
                    psd_init_fill_range(&i, got, firsts[fi], n, NULL, 0);
                    psd_init_uniform_portable(seeds[si], bounds[bi][0], bounds[bi][1],
                                              want, firsts[fi], n);
                    for (size_t k = 0; k < 300; k++)
                        ck_assert_msg(bits_of(got[k]) == bits_of(want[k]),
                                      "%s kernel: bounds %zu seed %zu first %llu n %zu: "
                                      "element %zu 0x%08x, portable 0x%08x",
                                      psd_init_kernel(), bi, si,
                                      (unsigned long long)firsts[fi], n, k,
                                      bits_of(got[k]), bits_of(want[k]));
                    for (size_t k = 0; bi == 2 && k < n; k++)
                        at_edge += got[k] == 1.0f;
                }
    ck_assert_uint_gt(at_edge, 1000); /* the narrow range did reach the edge */
}
END_TEST

int main(void)
{
    const struct pscheck_case cases[] = {
        {"psd_philox4x32_10", {test_philox_known_answers}},
        {"psd_init_defaults", {test_defaults}},
        {"psd_init_validate", {test_validate_accepts_defaults, test_validate_unknown_kind,
                               test_validate_uniform_bounds, test_validate_stddev,
                               test_validate_non_finite, test_validate_why_short}},
        {"psd_init_name", {test_name}},
        {"psd_init_fill_range", {test_fill_prefix_and_range,
                                 test_fill_uniform_kernel_matches_portable}},
    };
    Suite *s = pscheck_suite("init");
    pscheck_add(s, cases, sizeof cases / sizeof cases[0]);
    /* The samples are allocated once for the case (an unchecked fixture). */
    TCase *tc = PSCHECK_TCASE(s, NULL, "psd_init_fill", test_fill_zeros,
                              test_fill_constant, test_fill_same_seed_same_bits,
                              test_fill_different_seed_differs, test_fill_pinned_bits,
                              test_fill_pinned_hashes, test_fill_matches_documented_layout,
                              test_fill_uniform_moments, test_fill_uniform_never_maxval,
                              test_fill_normal_moments, test_fill_truncated_normal,
                              test_fill_glorot);
    tcase_add_unchecked_fixture(tc, setup_many, teardown_many);
    return pscheck_run(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
