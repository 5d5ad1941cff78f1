/*
 * half.c - float32 <-> float16 / bfloat16, portable C and the x86 kernels
 * chosen at run time. See half.h.
 */
#include "common/half.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HALF_X86 1
#include <immintrin.h>
#endif

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* float32 -> bfloat16, round to nearest even; NaN made quiet. */
static uint16_t bf16_of(float x)
{
    uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* float32 -> binary16, round to nearest even, finite overflow clamped to
 * +-65504 (*clamped set). */
static uint16_t f16_of(float x, bool *clamped)
{
    uint32_t u = bits_of(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* Inf, NaN (quiet) */
        return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 | ((a >> 13) & 0x3ff) : 0));
    if (a >= 0x477ff000u) { /* >= 65520: would round to Inf */
        *clamped = true;
        return (uint16_t)(sign | 0x7bff);
    }
    if (a >= 0x38800000u) { /* normal in half: >= 2^-14 */
        uint32_t m = a - 0x38000000u; /* rebias exponent 127 -> 15 */
        m += 0xfffu + ((m >> 13) & 1);
        return (uint16_t)(sign | (m >> 13));
    }
    if (a < 0x33000000u) /* below half the smallest subnormal: +-0 */
        return sign;
    /* Subnormal in half: shift the mantissa with its hidden bit in. */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* value / 2^-24 = m x 2^(e - 126); 14..24 */
    uint32_t half = 1u << (shift - 1);
    uint32_t r = m >> shift, rest = m & ((1u << shift) - 1);
    if (rest > half || (rest == half && (r & 1)))
        r++;
    return (uint16_t)(sign | r);
}

static float f32_of_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f)
        return float_of(sign | 0x7f800000u | (m << 13));
    if (e != 0)
        return float_of(sign | ((e + 112) << 23) | (m << 13));
    /* Subnormal (or zero): m x 2^-24, exact in float32. */
    float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
}

uint16_t ps_half_from_f32_one(int type, float x, bool *clamped)
{
    bool c = false;
    uint16_t h = type == PS_HALF_BF16 ? bf16_of(x) : f16_of(x, &c);
    if (clamped != NULL)
        *clamped = c;
    return h;
}

float ps_half_to_f32_one(int type, uint16_t h)
{
    return type == PS_HALF_BF16 ? float_of((uint32_t)h << 16) : f32_of_f16(h);
}

size_t ps_half_from_f32_portable(int type, const float *in, uint16_t *out, size_t n)
{
    size_t clamped = 0;
    if (type == PS_HALF_BF16) {
        for (size_t i = 0; i < n; i++)
            out[i] = bf16_of(in[i]);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        bool c = false;
        out[i] = f16_of(in[i], &c);
        clamped += c;
    }
    return clamped;
}

void ps_half_to_f32_portable(int type, const uint16_t *in, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)in + 2 * i, sizeof h);
        out[i] = ps_half_to_f32_one(type, h);
    }
}

static uint16_t to_f32_mag_portable(int type, const uint16_t *in, float *out, size_t n)
{
    uint16_t mag = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)in + 2 * i, sizeof h);
        out[i] = ps_half_to_f32_one(type, h);
        mag = (uint16_t)(h & 0x7fff) > mag ? (uint16_t)(h & 0x7fff) : mag;
    }
    return mag;
}

static bool nonfinite_portable(uint16_t mask, const uint16_t *in, size_t n)
{
    uint16_t any = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)in + 2 * i, sizeof h);
        any |= (uint16_t)((h & mask) == mask);
    }
    return any != 0;
}

/* Error feedback in portable C, element by element (see half.h). */
static size_t ef_portable(int type, const float *g, float *res, uint16_t *out, size_t n)
{
    size_t clamped = 0;
    for (size_t i = 0; i < n; i++) {
        float t = g[i] + res[i];
        bool c = false;
        uint16_t h = type == PS_HALF_BF16 ? bf16_of(t) : f16_of(t, &c);
        clamped += c;
        memcpy((uint8_t *)out + 2 * i, &h, sizeof h);
        res[i] = t - ps_half_to_f32_one(type, h);
    }
    return clamped;
}

/* ---- x86 kernels ---------------------------------------------------------- */

#ifdef HALF_X86
__attribute__((target("avx,f16c"))) static size_t
f16_from_f32_f16c(const float *in, uint16_t *out, size_t n)
{
    size_t clamped = 0, i = 0;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(65520.0f), inf = _mm256_set1_ps(INFINITY);
    const __m256 max = _mm256_set1_ps(65504.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(in + i);
        __m256 a = _mm256_and_ps(x, absmask);
        /* finite and >= 65520: clamped to +-65504 with x's sign */
        __m256 over = _mm256_and_ps(_mm256_cmp_ps(a, big, _CMP_GE_OQ),
                                    _mm256_cmp_ps(a, inf, _CMP_LT_OQ));
        int m = _mm256_movemask_ps(over);
        if (m != 0) {
            clamped += (size_t)__builtin_popcount((unsigned)m);
            __m256 c = _mm256_or_ps(max, _mm256_andnot_ps(absmask, x));
            x = _mm256_blendv_ps(x, c, over);
        }
        __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(out + i), h);
    }
    return clamped + ps_half_from_f32_portable(PS_HALF_F16, in + i, out + i, n - i);
}

__attribute__((target("avx,f16c"))) static void
f16_to_f32_f16c(const uint16_t *in, float *out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    ps_half_to_f32_portable(PS_HALF_F16, in + i, out + i, n - i);
}

__attribute__((target("avx512f,avx512bf16,avx512vl"))) static void
bf16_from_f32_avx512(const float *in, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(in + i);
        __m256bh h = _mm512_cvtneps_pbh(x);
        _mm256_storeu_si256((__m256i *)(void *)(out + i), (__m256i)h);
    }
    ps_half_from_f32_portable(PS_HALF_BF16, in + i, out + i, n - i);
}

__attribute__((target("avx2"))) static void
bf16_to_f32_avx2(const uint16_t *in, float *out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
        __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(w));
    }
    ps_half_to_f32_portable(PS_HALF_BF16, in + i, out + i, n - i);
}

/* The widenings with the largest magnitude taken on the way (unsigned
 * 16-bit max of the bits without the sign), 8 at a time. */
__attribute__((target("avx2,f16c"))) static uint16_t
to_f32_mag_avx2(int type, const uint16_t *in, float *out, size_t n)
{
    size_t i = 0;
    const __m128i absm = _mm_set1_epi16(0x7fff);
    __m128i mx = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
        mx = _mm_max_epu16(mx, _mm_and_si128(h, absm));
        __m256 f = type == PS_HALF_F16
                       ? _mm256_cvtph_ps(h)
                       : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        _mm256_storeu_ps(out + i, f);
    }
    /* The largest of the 8 lanes: minpos finds the smallest of ~x. */
    uint16_t m = (uint16_t)~_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(
        mx, _mm_set1_epi16(-1))));
    uint16_t t = to_f32_mag_portable(type, in + i, out + i, n - i);
    return t > m ? t : m;
}

/* float32 -> bfloat16 with AVX2's integers, bf16_of's rounding (to
 * nearest even, NaN made quiet), for CPUs without AVX512-BF16. */
__attribute__((target("avx2"))) static inline __m128i bf16_round_avx2(__m256 x)
{
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    __m256i u = _mm256_castps_si256(x);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(
                                         _mm256_srli_epi32(u, 16), one)));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
    __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    r = _mm256_srli_epi32(_mm256_blendv_epi8(r, q, nan), 16);
    /* Pack the 8 low halves: packus works per 128-bit lane. */
    __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
    return _mm_packus_epi32(lo, hi);
}

__attribute__((target("avx2"))) static void
bf16_from_f32_avx2(const float *in, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(out + i), bf16_round_avx2(_mm256_loadu_ps(in + i)));
    ps_half_from_f32_portable(PS_HALF_BF16, in + i, out + i, n - i);
}

/* Error feedback fused: t = g + r, h = half(t), r = t - float(h), one pass. */
__attribute__((target("avx,f16c"))) static size_t
f16_ef_f16c(const float *g, float *res, uint16_t *out, size_t n)
{
    size_t clamped = 0, i = 0;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(65520.0f), inf = _mm256_set1_ps(INFINITY);
    const __m256 max = _mm256_set1_ps(65504.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 t = _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(res + i));
        __m256 x = t, a = _mm256_and_ps(t, absmask);
        __m256 over = _mm256_and_ps(_mm256_cmp_ps(a, big, _CMP_GE_OQ),
                                    _mm256_cmp_ps(a, inf, _CMP_LT_OQ));
        int m = _mm256_movemask_ps(over);
        if (m != 0) {
            clamped += (size_t)__builtin_popcount((unsigned)m);
            x = _mm256_blendv_ps(x, _mm256_or_ps(max, _mm256_andnot_ps(absmask, x)), over);
        }
        __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(out + i), h);
        _mm256_storeu_ps(res + i, _mm256_sub_ps(t, _mm256_cvtph_ps(h)));
    }
    return clamped + ef_portable(PS_HALF_F16, g + i, res + i, out + i, n - i);
}

__attribute__((target("avx2"))) static void
bf16_ef_avx2(const float *g, float *res, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 t = _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(res + i));
        __m128i h = bf16_round_avx2(t);
        __m256 back = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        _mm_storeu_si128((__m128i *)(void *)(out + i), h);
        _mm256_storeu_ps(res + i, _mm256_sub_ps(t, back));
    }
    ef_portable(PS_HALF_BF16, g + i, res + i, out + i, n - i);
}

/* Any half whose exponent bits are all set (Inf, NaN), 16 at a time. */
__attribute__((target("avx2"))) static bool
nonfinite_avx2(uint16_t mask, const uint16_t *in, size_t n)
{
    size_t i = 0;
    const __m256i m = _mm256_set1_epi16((short)mask);
    __m256i any = _mm256_setzero_si256();
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(in + i));
        any = _mm256_or_si256(any, _mm256_cmpeq_epi16(_mm256_and_si256(h, m), m));
    }
    return !_mm256_testz_si256(any, any) || nonfinite_portable(mask, in + i, n - i);
}
#endif

/* The kernels picked once: 0 portable, 1 the instructions. */
static struct {
    bool f16c, bf16_avx512, avx2;
} have;
static pthread_once_t pick_once = PTHREAD_ONCE_INIT;

static void pick(void)
{
    const char *env = getenv("PS_HALF_PORTABLE");
    if (env != NULL && env[0] != '\0' && strcmp(env, "0") != 0)
        return;
#ifdef HALF_X86
    __builtin_cpu_init();
    have.f16c = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    have.avx2 = __builtin_cpu_supports("avx2");
    have.bf16_avx512 = __builtin_cpu_supports("avx512f") &&
                       __builtin_cpu_supports("avx512vl") &&
                       __builtin_cpu_supports("avx512bf16");
#endif
}

const char *ps_half_kernel(int type, bool to_f32)
{
    pthread_once(&pick_once, pick);
    if (type == PS_HALF_F16)
        return have.f16c ? "f16c" : "portable";
    if (to_f32)
        return have.avx2 ? "avx2" : "portable";
    return have.bf16_avx512 ? "avx512bf16" : have.avx2 ? "avx2" : "portable";
}

const char *ps_half_ef_kernel(int type)
{
    pthread_once(&pick_once, pick);
    if (type == PS_HALF_F16)
        return have.f16c ? "f16c" : "portable";
    return have.avx2 ? "avx2" : "portable";
}

size_t ps_half_from_f32(int type, const float *in, uint16_t *out, size_t n)
{
    pthread_once(&pick_once, pick);
#ifdef HALF_X86
    if (type == PS_HALF_F16 && have.f16c)
        return f16_from_f32_f16c(in, out, n);
    if (type == PS_HALF_BF16 && have.bf16_avx512) {
        bf16_from_f32_avx512(in, out, n);
        return 0;
    }
    if (type == PS_HALF_BF16 && have.avx2) {
        bf16_from_f32_avx2(in, out, n);
        return 0;
    }
#endif
    return ps_half_from_f32_portable(type, in, out, n);
}

void ps_half_to_f32(int type, const uint16_t *in, float *out, size_t n)
{
    pthread_once(&pick_once, pick);
#ifdef HALF_X86
    if (type == PS_HALF_F16 && have.f16c) {
        f16_to_f32_f16c(in, out, n);
        return;
    }
    if (type == PS_HALF_BF16 && have.avx2) {
        bf16_to_f32_avx2(in, out, n);
        return;
    }
#endif
    ps_half_to_f32_portable(type, in, out, n);
}

uint16_t ps_half_to_f32_mag(int type, const uint16_t *in, float *out, size_t n)
{
    pthread_once(&pick_once, pick);
#ifdef HALF_X86
    /* F16C for float16 comes with AVX2 on every CPU that has both. */
    if (have.avx2 && (type == PS_HALF_BF16 || have.f16c))
        return to_f32_mag_avx2(type, in, out, n);
#endif
    return to_f32_mag_portable(type, in, out, n);
}

bool ps_half_nonfinite(int type, const uint16_t *in, size_t n)
{
    uint16_t mask = type == PS_HALF_BF16 ? 0x7f80 : 0x7c00;
    pthread_once(&pick_once, pick);
#ifdef HALF_X86
    if (have.avx2)
        return nonfinite_avx2(mask, in, n);
#endif
    return nonfinite_portable(mask, in, n);
}

size_t ps_half_encode_ef(int type, const float *g, float *residual, uint16_t *out,
                         size_t n)
{
    if (residual == NULL)
        return ps_half_from_f32(type, g, out, n);
    pthread_once(&pick_once, pick);
#ifdef HALF_X86
    if (type == PS_HALF_F16 && have.f16c)
        return f16_ef_f16c(g, residual, out, n);
    if (type == PS_HALF_BF16 && have.avx2) {
        /* AVX2's rounding is bf16_of's, the same bits as AVX512-BF16's. */
        bf16_ef_avx2(g, residual, out, n);
        return 0;
    }
#endif
    return ef_portable(type, g, residual, out, n);
}
