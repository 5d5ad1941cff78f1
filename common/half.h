/*
 * half.h - float32 to and from the two half-precision wire types,
 * IEEE 754 binary16 (ps.v1.DTYPE_FLOAT16) and bfloat16 (DTYPE_BFLOAT16).
 *
 * psd keeps float32 master values and optimizer state; a worker may send
 * gradients and take values in half precision to halve the bytes on a
 * link. Conversions round to nearest, ties to even, as numpy's float16 and
 * ml_dtypes' bfloat16 do; NaN stays NaN (quiet), Inf stays Inf.
 *
 * Narrowing to float16 clamps: a finite value whose float16 would be Inf
 * (|x| >= 65520) becomes +-65504, float16's largest finite value, and is
 * counted, so that a pull says so instead of sending Inf. bfloat16 has
 * float32's range and needs no clamp.
 *
 * Each function picks its kernel at run time: F16C (float16) and
 * AVX512-BF16 (float32 to bfloat16) where the CPU has them, portable C
 * otherwise (ps_half_kernel names the choice; PS_HALF_PORTABLE=1 in the
 * environment forces portable C). The instructions give the portable
 * code's bits, except that AVX512-BF16 treats float32 subnormals (below
 * 1.2e-38) as zero, as the hardware defines it.
 *
 * Threads and lifetime: pure functions; the dispatch is decided once,
 * thread-safely, on first use.
 */
#ifndef PS_HALF_H
#define PS_HALF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ps_half_type {
    PS_HALF_F16 = 2,  /* ps.v1.DTYPE_FLOAT16 */
    PS_HALF_BF16 = 3, /* ps.v1.DTYPE_BFLOAT16 */
};

/* out[i] = half(in[i]) for i < n. Returns the number of float16 values
 * clamped to +-65504 (always 0 for bfloat16). */
size_t ps_half_from_f32(int type, const float *in, uint16_t *out, size_t n);

/* out[i] = float32(in[i]) for i < n (exact). in may be unaligned. */
void ps_half_to_f32(int type, const uint16_t *in, float *out, size_t n);

/* ps_half_to_f32 and the largest magnitude of in[0..n) in one pass: returns
 * the largest (in[i] & 0x7fff), half bits without the sign, which orders the
 * values by magnitude; at least 0x7c00 (float16) or 0x7f80 (bfloat16) when
 * one is Inf or NaN. 0 for n == 0. in may be unaligned. */
uint16_t ps_half_to_f32_mag(int type, const uint16_t *in, float *out, size_t n);

/* Whether any of in[0..n) is NaN or Inf. */
bool ps_half_nonfinite(int type, const uint16_t *in, size_t n);

/* One value each way, portable C (the reference the kernels are tested
 * against). */
uint16_t ps_half_from_f32_one(int type, float x, bool *clamped);
float ps_half_to_f32_one(int type, uint16_t h);

/* The portable loops, for the tests' comparison with the dispatched ones. */
size_t ps_half_from_f32_portable(int type, const float *in, uint16_t *out, size_t n);
void ps_half_to_f32_portable(int type, const uint16_t *in, float *out, size_t n);

/* "f16c", "avx512bf16", "portable": the kernel used for type in that
 * direction (to_f32 false: narrowing). */
const char *ps_half_kernel(int type, bool to_f32);

/* The kernel of ps_half_encode_ef's loop with a residual for type:
 * "f16c", "avx2", "portable". */
const char *ps_half_ef_kernel(int type);

/* Error feedback (1-bit Adam's and BytePS's): sends half(g + r) and keeps
 * r = (g + r) - float(sent), so that over any number of steps the sum of
 * what was sent plus r equals the sum of the gradients (up to float32
 * rounding of g + r). residual (n) is read and updated; NULL: no feedback
 * (plain rounding). Returns the float16 clamp count. */
size_t ps_half_encode_ef(int type, const float *g, float *residual, uint16_t *out,
                         size_t n);

#endif
