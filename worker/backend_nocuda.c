/* backend_nocuda.c - ps_backend_cuda in a build without CUDA: no backend,
 * and the probe's reason (which says so). */
#include "worker/backend.h"

#include "worker/gpu.h"

#include <stdio.h>

const struct ps_backend *ps_backend_cuda(int device, char *err, size_t errlen)
{
    char why[200];
    int count;
    if (ps_gpu_probe(&count, why, sizeof why) == 0)
        snprintf(why, sizeof why, "CUDA support not compiled in");
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "%s", why);
    return NULL;
}
