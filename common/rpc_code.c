/*
 * rpc_code.c - see rpc_code.h.
 */
#include "common/rpc_code.h"

#include "common/errors.h"

#include <errno.h>

static const char *const code_names[] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
    "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
};

const char *ps_rpc_code_name(int code)
{
    if (code < 0 || code > 16)
        return "UNKNOWN_CODE";
    return code_names[code];
}

enum ps_rpc_code ps_rpc_code_from_err(int err)
{
    switch (err) {
    case 0: return PS_RPC_OK;
    case PS_EINVAL_ARG:
    case PS_EPARSE:
    case PS_ESHAPE:
    case PS_EDTYPE:
    case PS_ENONFINITE:
    case -EINVAL: return PS_RPC_INVALID_ARGUMENT;
    case PS_ENOTFOUND:
    case -ENOENT: return PS_RPC_NOT_FOUND;
    case PS_EEXIST: return PS_RPC_ALREADY_EXISTS;
    case PS_ESTALE:
    case PS_ECONFLICT: return PS_RPC_FAILED_PRECONDITION;
    case PS_ETIMEDOUT: return PS_RPC_DEADLINE_EXCEEDED;
    case PS_EUNAVAIL:
    case PS_ESHUTDOWN: return PS_RPC_UNAVAILABLE;
    case PS_EFULL:
    case -ENOSPC:
    case -ENOMEM: return PS_RPC_RESOURCE_EXHAUSTED;
    case PS_ECORRUPT: return PS_RPC_DATA_LOSS;
    default: return PS_RPC_INTERNAL;
    }
}
