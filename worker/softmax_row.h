/*
 * softmax_row.h - one example's softmax cross-entropy, shared by the CPU
 * backend (backend_cpu.c) and the CUDA kernel (backend_cuda.cu), so that
 * both compute it the same way: in double, from the largest logit.
 *
 * Threads and lifetime: a pure function of its arguments.
 */
#ifndef PS_WORKER_SOFTMAX_ROW_H
#define PS_WORKER_SOFTMAX_ROW_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define PS_HOST_DEVICE __host__ __device__
#else
#define PS_HOST_DEVICE
#endif

/* Logits l[0..nclasses) of an example of label y: its loss in *loss, the
 * arg-max in *pred (unless NULL) and, unless d is NULL, dscale times the
 * gradient of the loss in d[0..nclasses). */
static inline PS_HOST_DEVICE void ps_softmax_xent_row(const float *l, int y, int nclasses,
                                                      float *loss, int32_t *pred, float *d,
                                                      float dscale)
{
    int arg = 0;
    for (int j = 1; j < nclasses; j++)
        if (l[j] > l[arg])
            arg = j;
    double mx = l[arg], sum = 0.0;
    for (int j = 0; j < nclasses; j++)
        sum += exp((double)l[j] - mx);
    *loss = (float)(log(sum) - ((double)l[y] - mx));
    if (pred != NULL)
        *pred = arg;
    if (d != NULL)
        for (int j = 0; j < nclasses; j++) {
            double p = exp((double)l[j] - mx) / sum;
            d[j] = (float)(dscale * (p - (j == y ? 1.0 : 0.0)));
        }
}

#endif
