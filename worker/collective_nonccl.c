/*
 * collective_nonccl.c - collective.h's NCCL entry points in a build without
 * CUDA or NCCL: they say so.
 */
#include "worker/collective.h"

#include "common/errors.h"

#include <stdio.h>

int wd_coll_nccl_create(const struct wd_coll_opts *o, wd_coll **out, char *err,
                        size_t errlen)
{
    (void)o;
    *out = NULL;
    snprintf(err, errlen, "this workerd was built without NCCL (no CUDA toolkit "
             "with nccl.h at build time)");
    return PS_ENODEV;
}

bool wd_coll_nccl_built(void)
{
    return false;
}
