#include "server/init.h"

#include "common/errors.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The same bits on every host needs double arithmetic evaluated as written:
 * no x87 extended precision (FLT_EVAL_METHOD 2, or -1 for unknown; 0, 1 and
 * TS 18661-3's 16, 32, 64 all evaluate double as double) and no fused
 * multiply-add (server/meson.build passes -ffp-contract=off). */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD == 2 || FLT_EVAL_METHOD < 0
#error "init.c needs double evaluated as double (SSE2, not x87) for reproducible initializers"
#endif

/* Keras's RandomUniform default range, used for a UNIFORM left unset. */
#define DEFAULT_UNIFORM_MIN -0.05f
#define DEFAULT_UNIFORM_MAX 0.05f
/* TRUNCATED_NORMAL redraws beyond this many standard deviations. */
#define TRUNCATE_AT 2.0
/* A truncated draw is refused with probability 0.0455 per candidate, so
 * 2 * MAX_DRAWS refusals in a row never happen; the cap only guarantees that
 * the loop ends. */
#define MAX_DRAWS 64

static const char *const kind_names[] = {
    "ZEROS", "CONSTANT", "UNIFORM", "NORMAL", "TRUNCATED_NORMAL",
    "GLOROT_UNIFORM",
};

static bool kind_known(enum psd_init_kind kind)
{
    return (unsigned)kind <= (unsigned)PSD_INIT_GLOROT_UNIFORM;
}

const char *psd_init_name(enum psd_init_kind kind)
{
    return kind_known(kind) ? kind_names[kind] : "UNKNOWN";
}

void psd_init_defaults(psd_init *i)
{
    if (i->stddev == 0.0f)
        i->stddev = 1.0f;
    if (i->kind == PSD_INIT_UNIFORM && i->minval == 0.0f && i->maxval == 0.0f) {
        i->minval = DEFAULT_UNIFORM_MIN;
        i->maxval = DEFAULT_UNIFORM_MAX;
    }
}

int psd_init_validate(const psd_init *i, char *why, size_t whylen)
{
    char dummy[1];
    if (why == NULL || whylen == 0) {
        why = dummy;
        whylen = sizeof dummy;
    }
    if (!kind_known(i->kind)) {
        snprintf(why, whylen,
                 "initializer kind %d is unknown (expected 0 ZEROS, 1 "
                 "CONSTANT, 2 UNIFORM, 3 NORMAL, 4 TRUNCATED_NORMAL or 5 "
                 "GLOROT_UNIFORM)", (int)i->kind);
        return PS_EINVAL_ARG;
    }
    const char *name = kind_names[i->kind];
    const struct {
        const char *field;
        float value;
    } fields[] = {
        {"value", i->value}, {"minval", i->minval}, {"maxval", i->maxval},
        {"mean", i->mean},   {"stddev", i->stddev},
    };
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
        if (!isfinite(fields[k].value)) {
            snprintf(why, whylen, "initializer %s: %s must be finite, got %g",
                     name, fields[k].field, (double)fields[k].value);
            return PS_EINVAL_ARG;
        }
    }
    if (i->kind == PSD_INIT_UNIFORM && !(i->maxval > i->minval)) {
        snprintf(why, whylen,
                 "initializer UNIFORM: maxval must exceed minval, got minval "
                 "%g maxval %g", (double)i->minval, (double)i->maxval);
        return PS_EINVAL_ARG;
    }
    if ((i->kind == PSD_INIT_NORMAL || i->kind == PSD_INIT_TRUNCATED_NORMAL) &&
        !(i->stddev > 0.0f)) {
        snprintf(why, whylen, "initializer %s: stddev must be > 0, got %g",
                 name, (double)i->stddev);
        return PS_EINVAL_ARG;
    }
    return 0;
}

/*
 * Philox4x32-10, as in Random123's philox.h: ten rounds of two 32x32->64
 * multiplications whose halves are xored with the other words and the key,
 * the key bumped by the Weyl constants between rounds.
 */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void psd_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                       uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The random block for counter (index, draw) under a seed. The layout (the
 * 64-bit index in words 0-1, the draw in word 2, word 3 zero; the seed as
 * the key, low word first) is part of the reproducibility promise. */
static void block(uint64_t seed, uint64_t index, uint32_t draw,
                  uint32_t out[4])
{
    const uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), draw, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    psd_philox4x32_10(ctr, key, out);
}

/* 53 random bits from two words, as an integer below 2^53. */
static uint64_t bits53(uint32_t hi, uint32_t lo)
{
    return (((uint64_t)hi << 32) | lo) >> 11;
}

/*
 * Natural log and sine/cosine from IEEE basic operations only, so that they
 * give the same bits everywhere (libm's differ in the last place between
 * versions and machines). Plain series, accurate to a few units in the last
 * place of a double, far more than a float result needs.
 */

/* The series below, highest power first, for Horner's rule. */
static const double atanh_series[] = { /* 1/23, 1/21, ..., 1/3 */
    1.0 / 23, 1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13,
    1.0 / 11, 1.0 / 9,  1.0 / 7,  1.0 / 5,  1.0 / 3,
};
static const double sin_series[] = { /* -1/19!, 1/17!, ..., -1/3! */
    -1.0 / 121645100408832000.0, 1.0 / 355687428096000.0, -1.0 / 1307674368000.0,
    1.0 / 6227020800.0,          -1.0 / 39916800.0,       1.0 / 362880.0,
    -1.0 / 5040.0,               1.0 / 120.0,             -1.0 / 6.0,
};
static const double cos_series[] = { /* -1/18!, 1/16!, ..., 1/4! */
    -1.0 / 6402373705728000.0, 1.0 / 20922789888000.0, -1.0 / 87178291200.0,
    1.0 / 479001600.0,         -1.0 / 3628800.0,       1.0 / 40320.0,
    -1.0 / 720.0,              1.0 / 24.0,
};
#define SERIES_LEN(a) (sizeof (a) / sizeof (a)[0])

/* c[0] x^(n-1) + c[1] x^(n-2) + ... + c[n-1], by Horner's rule: the same
 * operations in the same order on every host. */
static double horner(const double *c, size_t n, double x)
{
    double p = c[0];
    for (size_t i = 1; i < n; i++)
        p = c[i] + x * p;
    return p;
}

/* ln(x) for 0 < x <= 1. x = m * 2^e with m in [sqrt(1/2), sqrt(2)); then
 * ln(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172, and the atanh
 * series to s^23 is below 1e-18. */
static double det_log(double x)
{
    int e;
    double m = frexp(x, &e); /* exact: m in [0.5, 1) */
    if (m < 0.70710678118654752) {
        m *= 2.0;
        e -= 1;
    }
    double f = m - 1.0; /* exact (Sterbenz) */
    double s = f / (2.0 + f);
    double s2 = s * s;
    double p = horner(atanh_series, SERIES_LEN(atanh_series), s2);
    double log_m = 2.0 * s + 2.0 * s * s2 * p;
    return (double)e * 0.69314718055994530942 + log_m;
}

/* sin and cos of 2*pi*u for u in [0, 1) a multiple of 2^-53. 4u = q + r with
 * q an integer and |r| <= 1/2 exactly, so the series runs on
 * x = r * pi/2 in [-pi/4, pi/4] (terms to x^19 / 19!, below 1e-18) and the
 * quadrant q only swaps and negates. */
static void det_sincos_2pi(double u, double *sin_out, double *cos_out)
{
    double t = 4.0 * u;
    double q = floor(t + 0.5);
    double r = t - q;
    double x = r * 1.57079632679489661923;
    double x2 = x * x;
    double sp = horner(sin_series, SERIES_LEN(sin_series), x2);
    double s = x + x * x2 * sp;
    double cp = horner(cos_series, SERIES_LEN(cos_series), x2);
    double c = 1.0 - x2 * (0.5 - x2 * cp);
    switch ((int)q & 3) {
    case 0:
        *sin_out = s;
        *cos_out = c;
        break;
    case 1:
        *sin_out = c;
        *cos_out = -s;
        break;
    case 2:
        *sin_out = -s;
        *cos_out = -c;
        break;
    default:
        *sin_out = -c;
        *cos_out = s;
        break;
    }
}

/* Two independent standard normals from the block (index, draw), by
 * Box-Muller: u1 in (0, 1] (so the log is finite), u2 in [0, 1). */
static void normal_pair(uint64_t seed, uint64_t index, uint32_t draw,
                        double *z0, double *z1)
{
    uint32_t r[4];
    block(seed, index, draw, r);
    double u1 = (double)(bits53(r[0], r[1]) + 1) * 0x1p-53;
    double u2 = (double)bits53(r[2], r[3]) * 0x1p-53;
    double radius = sqrt(-2.0 * det_log(u1));
    double s, c;
    det_sincos_2pi(u2, &s, &c);
    *z0 = radius * c;
    *z1 = radius * s;
}

/* Element k of a standard normal: the first of its draw-0 pair, so NORMAL
 * and TRUNCATED_NORMAL with one seed agree wherever the first is in range. */
static double normal_at(uint64_t seed, uint64_t k)
{
    double z0, z1;
    normal_pair(seed, k, 0, &z0, &z1);
    return z0;
}

/* Element k of a standard normal truncated to [-2, 2]: the first candidate
 * in range among z0, z1 of draws 0, 1, 2, ... of counter k. */
static double truncated_at(uint64_t seed, uint64_t k)
{
    for (uint32_t d = 0; d < MAX_DRAWS; d++) {
        double z0, z1;
        normal_pair(seed, k, d, &z0, &z1);
        if (fabs(z0) <= TRUNCATE_AT)
            return z0;
        if (fabs(z1) <= TRUNCATE_AT)
            return z1;
    }
    return 0.0;
}

/* Uniform on [lo, hi) for elements first .. first+count-1: element k is word
 * k % 4 of block (k / 4, 0), scaled in double and rounded to float; a value
 * that rounds up to hi is moved to the float just below it. The reference:
 * the AVX2 kernel below gives the same bits. */
void psd_init_uniform_portable(uint64_t seed, float lo, float hi, float *w,
                               uint64_t first, size_t count)
{
    double base = lo, span = (double)hi - (double)lo;
    float below_hi = nextafterf(hi, -INFINITY);
    uint32_t r[4];
    uint64_t have = UINT64_MAX;
    for (size_t j = 0; j < count; j++) {
        uint64_t k = first + j;
        if (k / 4 != have) {
            have = k / 4;
            block(seed, have, 0, r);
        }
        double u = (double)r[k % 4] * 0x1p-32;
        float x = (float)(base + span * u);
        w[j] = x < hi ? x : below_hi;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define INIT_X86 1
#include <immintrin.h>

struct uniform_avx2_k {
    __m256i keys[10][2];
    __m256d base, span;
    __m128 top, below;
};

/* Blocks blk .. blk+3 into w[0..16). */
__attribute__((target("avx2"))) static inline void
philox4_avx2(const struct uniform_avx2_k *k, uint64_t blk, float *w)
{
    const __m256i m0 = _mm256_set1_epi64x(PHILOX_M0), m1 = _mm256_set1_epi64x(PHILOX_M1);
    const __m256i low = _mm256_set1_epi64x(0xffffffffLL);
    const __m128i flip = _mm_set1_epi32((int)0x80000000u);
    const __m256d two31 = _mm256_set1_pd(0x1p31), scale = _mm256_set1_pd(0x1p-32);
    __m256i idx = _mm256_add_epi64(_mm256_set1_epi64x((long long)blk),
                                   _mm256_set_epi64x(3, 2, 1, 0));
    __m256i c0 = idx, c1 = _mm256_srli_epi64(idx, 32);
    __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
    for (int round = 0; round < 10; round++) {
        __m256i p0 = _mm256_mul_epu32(c0, m0), p1 = _mm256_mul_epu32(c2, m1);
        c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1),
                              k->keys[round][0]);
        c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3),
                              k->keys[round][1]);
        c1 = p1;
        c3 = p0;
    }
    /* Lanes {c0 | c1 << 32} and {c2 | c3 << 32}, then each block's four
     * words together, blocks in order. */
    __m256i c01 = _mm256_or_si256(_mm256_and_si256(c0, low), _mm256_slli_epi64(c1, 32));
    __m256i c23 = _mm256_or_si256(_mm256_and_si256(c2, low), _mm256_slli_epi64(c3, 32));
    __m256i b02 = _mm256_unpacklo_epi64(c01, c23), b13 = _mm256_unpackhi_epi64(c01, c23);
    __m256i words[2] = {_mm256_permute2x128_si256(b02, b13, 0x20),
                        _mm256_permute2x128_si256(b02, b13, 0x31)};
    for (int h = 0; h < 4; h++) {
        __m128i r = h & 1 ? _mm256_extracti128_si256(words[h >> 1], 1)
                          : _mm256_castsi256_si128(words[h >> 1]);
        __m256d u = _mm256_add_pd(_mm256_cvtepi32_pd(_mm_xor_si128(r, flip)), two31);
        __m256d x = _mm256_add_pd(k->base, _mm256_mul_pd(k->span, _mm256_mul_pd(u, scale)));
        __m128 f = _mm256_cvtpd_ps(x);
        f = _mm_blendv_ps(k->below, f, _mm_cmplt_ps(f, k->top));
        _mm_storeu_ps(w + h * 4, f);
    }
}

/*
 * Four Philox blocks at once, one per 64-bit lane: _mm256_mul_epu32 takes
 * each lane's low word, so the high words may hold anything until the words
 * are gathered at the end. The uniform fill of a sparse row of dim 64 is 16
 * blocks; scalar, the generator and the scaling were ~19% of psd's samples
 * in bench/sparse's in-RAM pulls, whose Zipf draws a fifth of the ids past
 * the table (never pushed: answered with their initial rows). Each word is
 * scaled exactly as the portable code does: uint32 to double (exact), times
 * 2^-32 (exact), times span and plus base as two roundings (no FMA: the
 * target is "avx2" only), to float with the same round-to-nearest. On the
 * "Intel(R) Xeon(R) Processor" of 2026-11-28: 158-186 ns a row of 64,
 * against 393 portable. nblocks: a multiple of 4.
 */
__attribute__((target("avx2"))) static void
uniform_avx2(uint64_t seed, float lo, float hi, float *w, uint64_t blk, size_t nblocks)
{
    struct uniform_avx2_k k;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        k.keys[round][0] = _mm256_set1_epi64x(k0);
        k.keys[round][1] = _mm256_set1_epi64x(k1);
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    k.base = _mm256_set1_pd(lo);
    k.span = _mm256_set1_pd((double)hi - (double)lo);
    k.top = _mm_set1_ps(hi);
    k.below = _mm_set1_ps(nextafterf(hi, -INFINITY));
    for (size_t b = 0; b < nblocks; b += 4)
        philox4_avx2(&k, blk + b, w + b * 4);
}

static bool have_avx2;
static pthread_once_t pick_once = PTHREAD_ONCE_INIT;

static void pick(void)
{
    const char *env = getenv("PS_INIT_PORTABLE");
    if (env != NULL && env[0] != '\0' && strcmp(env, "0") != 0)
        return;
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
}
#endif

const char *psd_init_kernel(void)
{
#ifdef INIT_X86
    pthread_once(&pick_once, pick);
    if (have_avx2)
        return "avx2";
#endif
    return "portable";
}

static void fill_uniform(uint64_t seed, float lo, float hi, float *w,
                         uint64_t first, size_t count)
{
#ifdef INIT_X86
    pthread_once(&pick_once, pick);
    if (have_avx2) {
        /* The portable code up to a block's start, then four blocks at a
         * time, then the portable code for the rest. */
        size_t head = (size_t)((4 - first % 4) % 4);
        head = head < count ? head : count;
        psd_init_uniform_portable(seed, lo, hi, w, first, head);
        size_t body = (count - head) / 16 * 16;
        if (body)
            uniform_avx2(seed, lo, hi, w + head, (first + head) / 4, body / 4);
        psd_init_uniform_portable(seed, lo, hi, w + head + body, first + head + body,
                                  count - head - body);
        return;
    }
#endif
    psd_init_uniform_portable(seed, lo, hi, w, first, count);
}

/* Keras's glorot_uniform limit, sqrt(6 / (fan_in + fan_out)), with its fans
 * (keras.initializers' compute_fans, channels last). */
static float glorot_limit(const int64_t *shape, int ndim)
{
    double fan_in, fan_out;
    if (ndim <= 0 || shape == NULL) {
        fan_in = fan_out = 1.0;
    } else if (ndim == 1) {
        fan_in = fan_out = (double)shape[0];
    } else {
        double receptive = 1.0;
        for (int d = 0; d < ndim - 2; d++)
            receptive *= (double)shape[d];
        fan_in = (double)shape[ndim - 2] * receptive;
        fan_out = (double)shape[ndim - 1] * receptive;
    }
    double avg = (fan_in + fan_out) / 2.0;
    return (float)sqrt(3.0 / (avg > 1.0 ? avg : 1.0));
}

void psd_init_fill_range(const psd_init *i, float *w, uint64_t first,
                         size_t count, const int64_t *shape, int ndim)
{
    switch (i->kind) {
    case PSD_INIT_CONSTANT:
        for (size_t j = 0; j < count; j++)
            w[j] = i->value;
        return;
    case PSD_INIT_UNIFORM:
        fill_uniform(i->seed, i->minval, i->maxval, w, first, count);
        return;
    case PSD_INIT_GLOROT_UNIFORM: {
        float limit = glorot_limit(shape, ndim);
        fill_uniform(i->seed, -limit, limit, w, first, count);
        return;
    }
    case PSD_INIT_NORMAL:
        for (size_t j = 0; j < count; j++)
            w[j] = (float)((double)i->mean +
                           (double)i->stddev * normal_at(i->seed, first + j));
        return;
    case PSD_INIT_TRUNCATED_NORMAL:
        for (size_t j = 0; j < count; j++)
            w[j] = (float)((double)i->mean +
                           (double)i->stddev * truncated_at(i->seed, first + j));
        return;
    case PSD_INIT_ZEROS:
        break;
    }
    memset(w, 0, count * sizeof *w); /* all-zero bits are +0.0f */
}

void psd_init_fill(const psd_init *i, float *w, size_t n,
                   const int64_t *shape, int ndim)
{
    psd_init_fill_range(i, w, 0, n, shape, ndim);
}
