/*
 * init.h - the initial values of new variables, drawn reproducibly.
 *
 * Implements proto/ps.proto's Initializer message. Every random kind draws
 * from Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1,
 * 2, 3", SC11), a counter-based generator: element k of a variable is a pure
 * function of (seed, k), so
 *   - the same kind, parameters, shape and seed give the same bits on every
 *     host: the arithmetic after the generator uses only IEEE-754 double
 *     +, -, *, / and sqrt (our own log, sin and cos, not libm's, whose last
 *     bit differs between versions), built without FMA contraction;
 *   - element k does not depend on n, nor on how a fill is split across
 *     threads or chunks (fill a range with psd_init_fill_range).
 * The stream layout is part of the contract, like a file format: a change
 * to it changes every variable created afterwards, so the tests pin it.
 *
 * Threads and lifetime: every function is reentrant and keeps no state.
 */
#ifndef PSD_INIT_H
#define PSD_INIT_H

#include <stddef.h>
#include <stdint.h>

/* The same numbering as proto Initializer.Kind. */
enum psd_init_kind {
    PSD_INIT_ZEROS = 0,
    PSD_INIT_CONSTANT = 1,
    PSD_INIT_UNIFORM = 2,
    PSD_INIT_NORMAL = 3,
    PSD_INIT_TRUNCATED_NORMAL = 4,
    PSD_INIT_GLOROT_UNIFORM = 5,
};

/* The proto's Initializer message, in C. */
typedef struct psd_init {
    enum psd_init_kind kind;
    float value;          /* CONSTANT */
    float minval, maxval; /* UNIFORM: [minval, maxval) */
    float mean, stddev;   /* NORMAL, TRUNCATED_NORMAL */
    uint64_t seed;        /* random kinds; 0 is a seed like any other */
} psd_init;

/* Replaces unset fields with the proto's defaults: stddev 0 (or -0) becomes
 * 1 whatever the kind; a UNIFORM with minval == maxval == 0 becomes
 * [-0.05, 0.05), Keras's RandomUniform default. Call it once, when a spec
 * arrives, before psd_init_validate. */
void psd_init_defaults(psd_init *i);

/* Checks a spec after psd_init_defaults. Returns 0, or PS_EINVAL_ARG with a
 * sentence in `why` (NUL-terminated, truncated to whylen; why may be NULL)
 * naming the field, what was expected and what was given, e.g.
 * "initializer UNIFORM: maxval must exceed minval, got minval 1 maxval 1".
 * Refused: an unknown kind; any non-finite float field (whatever the kind: a
 * NaN would make identical specs compare unequal); for UNIFORM, maxval <=
 * minval; for NORMAL and TRUNCATED_NORMAL, stddev <= 0. */
int psd_init_validate(const psd_init *i, char *why, size_t whylen);

/* The proto's name of the kind ("ZEROS", ..., "GLOROT_UNIFORM"), or
 * "UNKNOWN". A static string, never NULL. */
const char *psd_init_name(enum psd_init_kind kind);

/* Fills w (n floats, normally the product of the shape) with the initial
 * value of a variable of the given shape (ndim dimensions, outermost first;
 * shape may be NULL when ndim is 0). The shape matters only to
 * GLOROT_UNIFORM, whose fans are Keras's: scalar 1 and 1; 1-D (d) d and d;
 * 2-D (in, out) in and out; N-D kernels (..., in, out) in * r and out * r,
 * r the product of the leading (receptive field) dimensions. The spec must
 * have passed psd_init_validate; an unknown kind fills zeros. */
void psd_init_fill(const psd_init *i, float *w, size_t n,
                   const int64_t *shape, int ndim);

/* Fills w[0..count) with elements first .. first+count-1 of what
 * psd_init_fill would write: the same bits, for splitting a large fill
 * across threads or writing it chunk by chunk. */
void psd_init_fill_range(const psd_init *i, float *w, uint64_t first,
                         size_t count, const int64_t *shape, int ndim);

/* Philox4x32-10: encrypts the 128-bit counter ctr under the 64-bit key and
 * writes 128 random bits to out. Exposed so that tests can check it against
 * Random123's published known answers, and so that other modules needing
 * reproducible randomness draw from the same generator. */
void psd_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                       uint32_t out[4]);

/* The uniform kinds' fill in portable C, element k of [lo, hi) for k from
 * first: the reference the AVX2 kernel psd_init_fill_range uses where the
 * CPU has it (four Philox blocks a step) must equal bit for bit. */
void psd_init_uniform_portable(uint64_t seed, float lo, float hi, float *w,
                               uint64_t first, size_t count);

/* The uniform fill's kernel: "avx2", or "portable" without AVX2 or with
 * PS_INIT_PORTABLE set (not "0") in the environment when first used. */
const char *psd_init_kernel(void);

#endif
