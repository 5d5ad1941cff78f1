/*
 * model_cases.h - what the CPU model test (tests/unit/check_model.c) and the
 * CUDA comparison (tests/gpu/check_backend_cuda.c) share: a deterministic
 * generator for test inputs, a monotonic clock, and the convolution
 * geometries both run im2col and col2im on.
 *
 * Threads and lifetime: for single-threaded test programs that include it
 * once; rng_state belongs to that program, and each test seeds it first so
 * that its inputs do not depend on the tests run before it.
 */
#ifndef PS_TESTS_MODEL_CASES_H
#define PS_TESTS_MODEL_CASES_H

#include "worker/backend.h"

#include <stddef.h>
#include <stdint.h>
#include <time.h>

static uint64_t rng_state;

/* Uniform in [0, 1) (splitmix64 on rng_state): the same numbers on every
 * host and every run. */
static inline double urand(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1p-53;
}

/* p[0..n) uniform in [lo, hi). */
static inline void fill(float *p, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(lo + (hi - lo) * urand());
}

/* Seconds on the monotonic clock. */
static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The CNN's two convolutions (3x3, pad 1, stride 1) at their real sizes,
 * and two odd geometries: 3x2 kernels with stride 2 and no padding on an
 * odd image, and 4x3 kernels with pad 2 and stride 3, where whole kernel
 * rows fall in the padding. */
#define MODEL_CONV_GEOMS 4
static const struct ps_conv_geom model_conv_geoms[MODEL_CONV_GEOMS] = {
    {.batch = 4, .h = 28, .w = 28, .c = 1, .kh = 3, .kw = 3, .pad = 1,
     .stride = 1, .oh = 28, .ow = 28},
    {.batch = 3, .h = 14, .w = 14, .c = 32, .kh = 3, .kw = 3, .pad = 1,
     .stride = 1, .oh = 14, .ow = 14},
    {.batch = 2, .h = 7, .w = 5, .c = 2, .kh = 3, .kw = 2, .pad = 0,
     .stride = 2, .oh = 3, .ow = 2},
    {.batch = 2, .h = 9, .w = 8, .c = 3, .kh = 4, .kw = 3, .pad = 2,
     .stride = 3, .oh = 4, .ow = 4},
};

#endif
