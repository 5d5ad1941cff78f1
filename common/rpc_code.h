/*
 * rpc_code.h - gRPC status codes as the project names them, and the code
 * that reports each project error (errors.h) to a client.
 *
 * Threads and lifetime: constant tables; the strings returned are static.
 */
#ifndef PS_RPC_CODE_H
#define PS_RPC_CODE_H

/* gRPC status codes, with the same values as grpc_status_code. */
enum ps_rpc_code {
    PS_RPC_OK = 0,
    PS_RPC_CANCELLED = 1,
    PS_RPC_UNKNOWN = 2,
    PS_RPC_INVALID_ARGUMENT = 3,
    PS_RPC_DEADLINE_EXCEEDED = 4,
    PS_RPC_NOT_FOUND = 5,
    PS_RPC_ALREADY_EXISTS = 6,
    PS_RPC_PERMISSION_DENIED = 7,
    PS_RPC_RESOURCE_EXHAUSTED = 8,
    PS_RPC_FAILED_PRECONDITION = 9,
    PS_RPC_ABORTED = 10,
    PS_RPC_OUT_OF_RANGE = 11,
    PS_RPC_UNIMPLEMENTED = 12,
    PS_RPC_INTERNAL = 13,
    PS_RPC_UNAVAILABLE = 14,
    PS_RPC_DATA_LOSS = 15,
    PS_RPC_UNAUTHENTICATED = 16,
};

/* "INVALID_ARGUMENT" etc.; "UNKNOWN_CODE" for values outside the table. */
const char *ps_rpc_code_name(int code);
/* The status code that best reports a project error code (PS_ENOTFOUND ->
 * NOT_FOUND, PS_ESHAPE -> INVALID_ARGUMENT, PS_EFULL -> RESOURCE_EXHAUSTED...). */
enum ps_rpc_code ps_rpc_code_from_err(int err);

#endif
