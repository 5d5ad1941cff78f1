/*
 * gpu.h - whether a CUDA device answers, and what it is.
 *
 * The CUDA path is compiled whenever the build finds nvcc, but chosen at run
 * time only when a device answers: a process asks ps_gpu_probe first and
 * falls back to the CPU, or fails with the reason, when it gets an error.
 * Builds without CUDA link gpu_none.c, whose probe says so.
 *
 * Threads and lifetime: safe from any thread; no state is kept.
 */
#ifndef PS_GPU_H
#define PS_GPU_H

#include <stdbool.h>
#include <stddef.h>

/* True when the CUDA backend was compiled in. */
bool ps_gpu_compiled(void);

/* Counts usable CUDA devices. Returns 0 with *count >= 1, or PS_ENODEV with
 * one line in err naming the cause: "CUDA support not compiled in", "no
 * CUDA driver", "driver too old for this CUDA runtime", "no CUDA device". */
int ps_gpu_probe(int *count, char *err, size_t errlen);

/* Name and memory of device `dev`. Returns 0, or PS_ENODEV with err set. */
int ps_gpu_describe(int dev, char *name, size_t namelen, size_t *mem_bytes,
                    char *err, size_t errlen);

#endif
