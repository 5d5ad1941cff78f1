/*
 * collective.h - the all-reduce group of a multi_worker_mirrored job, in C.
 *
 * Two engines sit behind it, each in one file: Gloo over TCP for CPU
 * workers (worker/collective_gloo.cc, the only C++ of the project: Gloo's
 * headers are C++ and cannot reach a C file), and NCCL for GPU workers
 * (worker/collective_nccl.cu when the build has CUDA, else a stub that
 * says so). Neither makes its own rendezvous: both read and write keys
 * through the caller's store (wd_coll_store), which worker/train_mwm.c
 * backs with pscoord's KvSet/KvGet (common/coordclient.h), so that each
 * rank's address and NCCL's unique id travel through the coordinator, as
 * PyTorch's TCPStore serves Gloo.
 *
 * A group is one generation: a fixed rank and size. Any failure (a peer
 * that died, a link cut past the timeout, a peer that never came) makes the
 * call return an error within opts.timeout_ms, never hang; the group is
 * then unusable and is destroyed, and the caller forms the next one.
 *
 * Threads and lifetime: a group is used by one thread at a time; the
 * store's callbacks run on that thread during wd_coll_*_create. Errors are
 * project error codes with one line in err.
 */
#ifndef PS_WORKER_COLLECTIVE_H
#define PS_WORKER_COLLECTIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The rendezvous store. get waits up to timeout_ms for key and returns 0
 * with *val malloc'd (the caller frees it), or nonzero with err set. */
struct wd_coll_store {
    void *ctx;
    int (*set)(void *ctx, const char *key, const void *val, size_t len,
               char *err, size_t errlen);
    int (*get)(void *ctx, const char *key, int timeout_ms, void **val,
               size_t *len, char *err, size_t errlen);
};

struct ps_coord;
/* The store backed by pscoord's KvSet and KvGet (common/coordclient.h)
 * through pc, which outlives it (worker/collective_store.c). */
struct wd_coll_store wd_coll_coord_store(struct ps_coord *pc);

enum wd_coll_algo {
    WD_COLL_RING = 0,               /* Gloo's ring all-reduce */
    WD_COLL_HALVING_DOUBLING = 1,   /* Gloo's halving-doubling */
    WD_COLL_AUTO = 2,               /* halving-doubling under 4 MiB or over sync-mode
                                       pairs (wmem_max), else ring */
};

struct wd_coll_opts {
    int rank, size;
    const char *prefix;          /* of every key this group uses ("gen/3/") */
    const char *host;            /* Gloo: the address this rank listens on */
    int timeout_ms;              /* every operation, the rendezvous too */
    int algorithm;               /* enum wd_coll_algo */
    int device;                  /* NCCL: the CUDA device */
    const struct wd_coll_store *store;
};

typedef struct wd_coll wd_coll;

/* The engines' common face: the first member of each engine's struct. */
struct wd_coll {
    const char *engine;          /* "gloo" or "nccl" */
    int rank, size;
    /* Sum in place over the group: n floats / doubles in host memory. */
    int (*allreduce_f32)(wd_coll *c, float *buf, size_t n, char *err, size_t errlen);
    int (*allreduce_f64)(wd_coll *c, double *buf, size_t n, char *err, size_t errlen);
    /* root's bytes to every rank. */
    int (*broadcast)(wd_coll *c, void *buf, size_t bytes, int root, char *err,
                     size_t errlen);
    void (*destroy)(wd_coll *c);
};

/* Forms a Gloo group over TCP: connects the full mesh through the store.
 * Returns 0, PS_EUNAVAIL (a peer did not come or cannot be reached within
 * the timeout), -ENOMEM. */
int wd_coll_gloo_create(const struct wd_coll_opts *o, wd_coll **out, char *err,
                        size_t errlen);

/* Whether Gloo can listen on host (an address of this machine): 0, or
 * PS_EINVAL_ARG with one line in err. A worker checks its --allreduce-host
 * once at start, so that its own bad address fails the process, while a
 * peer that cannot be reached fails only the generation. */
int wd_coll_gloo_check_host(const char *host, char *err, size_t errlen);

/* Forms an NCCL group on CUDA device o->device: rank 0's unique id goes
 * through the store. Returns 0, PS_ENODEV (built without NCCL, or no device
 * answers), PS_EUNAVAIL. */
int wd_coll_nccl_create(const struct wd_coll_opts *o, wd_coll **out, char *err,
                        size_t errlen);

/* Whether this build has NCCL. */
bool wd_coll_nccl_built(void);

static inline void wd_coll_destroy(wd_coll *c)
{
    if (c != NULL)
        c->destroy(c);
}

#ifdef __cplusplus
}
#endif

#endif
