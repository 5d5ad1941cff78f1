/*
 * simd.h - VECTOR_CLONES, the attribute that compiles a hot loop twice.
 *
 * Put VECTOR_CLONES before a function whose loops the compiler vectorizes
 * (restrict pointers, no branch in the body). On x86-64 with GCC the
 * function is built for AVX2 and for the baseline (SSE2), and the loader
 * picks the clone the CPU runs (an ifunc): one binary that uses AVX2 where
 * it exists and still runs where it does not, without -march. Measured on
 * psd's optimizer loops: 1.1x (ADAM) to 1.5x (SGD) faster than SSE2 alone;
 * in the worker's CPU backend the ReLU loops had been a quarter of an MLP
 * step. Only "avx2", not "fma": no multiply-add is fused, so both clones
 * give the same bits.
 *
 * GCC only: clang 14 emits just the .ifunc symbol for a cloned function
 * with external linkage (psd's psd_accumulate, psd_l2_norm), which then
 * fails to link; it clones static functions correctly, but one rule for
 * every function is simpler than two, and clang builds (the fuzz build)
 * are not the ones measured. Elsewhere the macro is empty: same results,
 * baseline speed.
 *
 * Threads and lifetime: a compile-time attribute; no state.
 */
#ifndef PS_SIMD_H
#define PS_SIMD_H

#if defined(__x86_64__) && defined(__has_attribute) && !defined(__clang__)
#if __has_attribute(target_clones)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef VECTOR_CLONES
#define VECTOR_CLONES
#endif

#endif
