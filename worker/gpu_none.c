/* gpu_none.c - the probe of a build without CUDA. */
#include "worker/gpu.h"

#include "common/errors.h"

#include <stdio.h>

bool ps_gpu_compiled(void)
{
    return false;
}

int ps_gpu_probe(int *count, char *err, size_t errlen)
{
    *count = 0;
    snprintf(err, errlen, "CUDA support not compiled in (rebuild with nvcc "
                          "installed, or -Dcuda=enabled)");
    return PS_ENODEV;
}

int ps_gpu_describe(int dev, char *name, size_t namelen, size_t *mem_bytes,
                    char *err, size_t errlen)
{
    int n;
    return ps_gpu_probe(&n, err, errlen);
}
