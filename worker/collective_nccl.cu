/*
 * collective_nccl.cu - collective.h over NCCL, for GPU workers: the only
 * file that sees nccl.h (common/confine.h). Compiled whenever the build has
 * CUDA and finds NCCL in the toolkit; chosen at run time only when a CUDA
 * device answers (ps_gpu_probe), as the CUDA backend is.
 *
 * Rendezvous: rank 0 draws NCCL's unique id and sets it under
 * "<prefix>nccl_id" in the caller's store (pscoord's Kv store); the others
 * wait for it there. The communicator is non-blocking (ncclConfig_t
 * blocking = 0), so that every call can be bounded: this file polls
 * ncclCommGetAsyncError until the operation is done or opts.timeout_ms has
 * passed, and then aborts the communicator (ncclCommAbort) and fails: a
 * dead peer never hangs the worker. The all-reduce moves host buffers
 * through one device buffer per group (the training loop's gradient is on
 * the host after the in-host reduction).
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "common/errors.h"
#include "worker/gpu.h"
}
#include "worker/collective.h"

namespace {

struct NcclColl {
    wd_coll base; /* first: collective.h's face */
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    int timeout_ms;
    void *dbuf;
    size_t dbytes;
};

int64_t now_ms()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for the communicator's pending work (and the stream) within the
 * timeout; aborts the communicator past it. */
int finish(NcclColl *g, ncclResult_t issued, const char *what, char *err, size_t errlen)
{
    int64_t until = now_ms() + g->timeout_ms;
    ncclResult_t st = issued;
    while (st == ncclSuccess || st == ncclInProgress) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(g->comm, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
            st = async;
            break;
        }
        if (async == ncclSuccess && cudaStreamQuery(g->stream) == cudaSuccess)
            return 0;
        if (now_ms() > until) {
            ncclCommAbort(g->comm);
            g->comm = nullptr;
            snprintf(err, errlen, "nccl %s: not done within %d ms: communicator aborted",
                     what, g->timeout_ms);
            return PS_EUNAVAIL;
        }
        struct timespec ts = {0, 200000};
        nanosleep(&ts, nullptr);
    }
    snprintf(err, errlen, "nccl %s: %s", what, ncclGetErrorString(st));
    if (g->comm != nullptr) {
        ncclCommAbort(g->comm);
        g->comm = nullptr;
    }
    return PS_EUNAVAIL;
}

int device_buffer(NcclColl *g, size_t bytes, char *err, size_t errlen)
{
    if (g->dbytes >= bytes)
        return 0;
    cudaFree(g->dbuf);
    g->dbuf = nullptr;
    g->dbytes = 0;
    if (cudaMalloc(&g->dbuf, bytes) != cudaSuccess) {
        snprintf(err, errlen, "nccl: cannot allocate %zu bytes on cuda:%d", bytes, g->device);
        return -12; /* -ENOMEM */
    }
    g->dbytes = bytes;
    return 0;
}

int run(NcclColl *g, void *buf, size_t bytes, const char *what, char *err, size_t errlen,
        ncclResult_t (*op)(NcclColl *, size_t, int), size_t count, int root)
{
    if (g->comm == nullptr) {
        snprintf(err, errlen, "nccl %s: the communicator was aborted", what);
        return PS_EUNAVAIL;
    }
    cudaSetDevice(g->device);
    int rc = device_buffer(g, bytes, err, errlen);
    if (rc != 0)
        return rc;
    cudaMemcpyAsync(g->dbuf, buf, bytes, cudaMemcpyHostToDevice, g->stream);
    rc = finish(g, op(g, count, root), what, err, errlen);
    if (rc != 0)
        return rc;
    cudaMemcpyAsync(buf, g->dbuf, bytes, cudaMemcpyDeviceToHost, g->stream);
    return cudaStreamSynchronize(g->stream) == cudaSuccess ? 0 : PS_EUNAVAIL;
}

ncclResult_t op_sum_f32(NcclColl *g, size_t n, int)
{
    return ncclAllReduce(g->dbuf, g->dbuf, n, ncclFloat32, ncclSum, g->comm, g->stream);
}

ncclResult_t op_sum_f64(NcclColl *g, size_t n, int)
{
    return ncclAllReduce(g->dbuf, g->dbuf, n, ncclFloat64, ncclSum, g->comm, g->stream);
}

ncclResult_t op_bcast(NcclColl *g, size_t n, int root)
{
    return ncclBroadcast(g->dbuf, g->dbuf, n, ncclUint8, root, g->comm, g->stream);
}

NcclColl *self(wd_coll *c)
{
    return reinterpret_cast<NcclColl *>(c);
}

int allreduce_f32(wd_coll *c, float *buf, size_t n, char *err, size_t errlen)
{
    return run(self(c), buf, n * sizeof *buf, "all-reduce", err, errlen, op_sum_f32, n, 0);
}

int allreduce_f64(wd_coll *c, double *buf, size_t n, char *err, size_t errlen)
{
    return run(self(c), buf, n * sizeof *buf, "all-reduce", err, errlen, op_sum_f64, n, 0);
}

int broadcast(wd_coll *c, void *buf, size_t bytes, int root, char *err, size_t errlen)
{
    return run(self(c), buf, bytes, "broadcast", err, errlen, op_bcast, bytes, root);
}

void destroy(wd_coll *c)
{
    NcclColl *g = self(c);
    cudaSetDevice(g->device);
    if (g->comm != nullptr)
        ncclCommDestroy(g->comm);
    cudaFree(g->dbuf);
    if (g->stream != nullptr)
        cudaStreamDestroy(g->stream);
    delete g;
}

/* NCCL's unique id through the store: drawn by rank 0, read by the rest. */
int exchange_id(const struct wd_coll_opts *o, ncclUniqueId *id, char *err, size_t errlen)
{
    char key[256];
    snprintf(key, sizeof key, "%snccl_id", o->prefix != nullptr ? o->prefix : "");
    if (o->rank == 0) {
        ncclResult_t st = ncclGetUniqueId(id);
        if (st != ncclSuccess) {
            snprintf(err, errlen, "ncclGetUniqueId: %s", ncclGetErrorString(st));
            return PS_EUNAVAIL;
        }
        return o->store->set(o->store->ctx, key, id, sizeof *id, err, errlen) != 0
                   ? PS_EUNAVAIL : 0;
    }
    void *val = nullptr;
    size_t len = 0;
    if (o->store->get(o->store->ctx, key, o->timeout_ms, &val, &len, err, errlen) != 0)
        return PS_EUNAVAIL;
    int rc = len == sizeof *id ? 0 : PS_EUNAVAIL;
    if (rc == 0)
        memcpy(id, val, sizeof *id);
    else
        snprintf(err, errlen, "nccl: the unique id under %s has %zu bytes, not %zu", key,
                 len, sizeof *id);
    free(val);
    return rc;
}

} // namespace

extern "C" bool wd_coll_nccl_built(void)
{
    return true;
}

extern "C" int wd_coll_nccl_create(const struct wd_coll_opts *o, wd_coll **out, char *err,
                                   size_t errlen)
{
    int count = 0;
    char why[200];
    *out = nullptr;
    if (ps_gpu_probe(&count, why, sizeof why) != 0 || o->device < 0 || o->device >= count) {
        snprintf(err, errlen, "nccl: no CUDA device cuda:%d answers (%s)", o->device,
                 count > 0 ? "out of range" : why);
        return PS_ENODEV;
    }
    ncclUniqueId id;
    int rc = exchange_id(o, &id, err, errlen);
    if (rc != 0)
        return rc;
    NcclColl *g = new NcclColl();
    g->base = wd_coll{"nccl", o->rank, o->size, allreduce_f32, allreduce_f64, broadcast, destroy};
    g->device = o->device;
    g->timeout_ms = o->timeout_ms;
    cudaSetDevice(o->device);
    cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t st = ncclCommInitRankConfig(&g->comm, o->size, id, o->rank, &config);
    if ((rc = finish(g, st, "rendezvous", err, errlen)) != 0) {
        destroy(&g->base);
        return rc;
    }
    *out = &g->base;
    return 0;
}
