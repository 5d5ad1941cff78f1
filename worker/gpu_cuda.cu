/* gpu_cuda.cu - the probe of a build with CUDA: asks the runtime. */
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "common/errors.h"
#include "worker/gpu.h"
}

static const char *cause(cudaError_t e)
{
    switch (e) {
    case cudaErrorNoDevice:
        return "no CUDA device";
    case cudaErrorInsufficientDriver:
        return "no CUDA driver, or one too old for this CUDA runtime";
    case cudaErrorInitializationError:
        return "the CUDA driver failed to initialize";
    default:
        return cudaGetErrorString(e);
    }
}

extern "C" bool ps_gpu_compiled(void)
{
    return true;
}

extern "C" int ps_gpu_probe(int *count, char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    *count = 0;
    if (e != cudaSuccess) {
        snprintf(err, errlen, "%s (%s)", cause(e), cudaGetErrorName(e));
        return PS_ENODEV;
    }
    if (n == 0) {
        snprintf(err, errlen, "no CUDA device");
        return PS_ENODEV;
    }
    *count = n;
    return 0;
}

extern "C" int ps_gpu_describe(int dev, char *name, size_t namelen,
                               size_t *mem_bytes, char *err, size_t errlen)
{
    int n;
    int rc = ps_gpu_probe(&n, err, errlen);
    if (rc != 0)
        return rc;
    if (dev < 0 || dev >= n) {
        snprintf(err, errlen, "cuda:%d does not exist (%d device%s)", dev, n,
                 n == 1 ? "" : "s");
        return PS_ENODEV;
    }
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, dev);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cuda:%d: %s", dev, cause(e));
        return PS_ENODEV;
    }
    snprintf(name, namelen, "%s", p.name);
    *mem_bytes = p.totalGlobalMem;
    return 0;
}
