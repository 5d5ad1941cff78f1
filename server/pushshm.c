/*
 * pushshm.c - a Push's gradients that lie in a co-located client's shared
 * memory (ps.v1.ShmRef, server/shmmap.h): resolved for the caller the unix
 * socket names, and copied out once, so that the rest of the push (push.c)
 * checks and applies psd's own bytes (issue 13 a). The copy's buffers are
 * per thread, like push.c's decoded request.
 */
#include "server/shard_internal.h"

#include "common/thread.h"
#include "common/wire.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The push's gradients copied out of shared memory, and the largest
 * magnitude of each, found as it was copied (UINT32_MAX: not from shared
 * memory); (ngrads). Freed by the thread-exit destructor of a key. */
struct shm_bufs {
    uint8_t *copy;
    size_t cap;
    uint32_t *mag;
    size_t cap_mag;
};

static void bufs_free(void *p)
{
    struct shm_bufs *b = p;
    free(b->copy);
    free(b->mag);
    free(b);
}

static ps_thread_slot bufs_slot = PS_THREAD_SLOT(struct shm_bufs, bufs_free);

static struct shm_bufs *shm_bufs(void)
{
    return ps_thread_slot_get(&bufs_slot);
}

/* Room for bytes of gradients copied out of shared memory in tb, and for
 * the magnitudes of n gradients (all unknown). A copy held after a push is
 * at most SHM_COPY_KEEP (the next push of the same size reuses it warm); a
 * bigger one is let go after its push. */
#define SHM_COPY_KEEP ((size_t)64 << 20)

static int shm_room(struct shm_bufs *tb, size_t bytes, size_t n)
{
    if (n > tb->cap_mag) {
        uint32_t *m = realloc(tb->mag, n * sizeof *m);
        if (m == NULL)
            return -ENOMEM;
        tb->mag = m;
        tb->cap_mag = n;
    }
    for (size_t i = 0; i < n; i++)
        tb->mag[i] = UINT32_MAX;
    if (bytes > tb->cap) {
        uint8_t *b = malloc(bytes);
        if (b == NULL)
            return -ENOMEM;
        free(tb->copy);
        tb->copy = b;
        tb->cap = bytes;
    }
    return 0;
}

/* Copies bytes from the client's memory and returns the largest magnitude
 * of the floats copied, read back from the copy chunk by chunk while it is
 * in L1: the copy and the check in one pass over memory. */
#define COPY_CHUNK ((size_t)16 << 10)

struct copy_part {
    uint8_t *dst;
    const uint8_t *src;
    size_t bytes;
    uint32_t mag;
};

static void copy_mag(void *arg)
{
    struct copy_part *c = arg;
    uint32_t mag = 0;
    for (size_t off = 0; off < c->bytes; off += COPY_CHUNK) {
        size_t k = c->bytes - off < COPY_CHUNK ? c->bytes - off : COPY_CHUNK;
        memcpy(c->dst + off, c->src + off, k);
        uint32_t m = psd_max_mag((const psd_ufloat *)(const void *)(c->dst + off),
                                 k / sizeof(float));
        mag = m > mag ? m : mag;
    }
    c->mag = mag;
}

/* copy_mag of a whole gradient, in two halves (one on the helper thread
 * when it is idle) for a big one, as the check used to be. */
static uint32_t copy_grad(psd_shard *s, uint8_t *dst, const uint8_t *src, size_t bytes)
{
    struct copy_part lo = {dst, src, bytes, 0}, hi;
    if (bytes >= SHARD_SPLIT_MIN_BYTES) {
        size_t mid = bytes / 2 & ~(size_t)63;
        hi = (struct copy_part){dst + mid, src + mid, bytes - mid, 0};
        if (psd_assist_try(s->assist, copy_mag, &hi)) {
            lo.bytes = mid;
            copy_mag(&lo);
            psd_assist_join(s->assist);
            return hi.mag > lo.mag ? hi.mag : lo.mag;
        }
    }
    copy_mag(&lo);
    return lo.mag;
}

/* Makes the gradients that lie in shared memory cursors over a copy of
 * them, and keeps the push's value_into references in p. The copy is the
 * one read of the client's memory (issue 13 a): the gradient is checked
 * (finite), proven safe and applied from psd's own bytes, so a client
 * rewriting its memory between the check and the apply changes nothing
 * (before, a thread flipping it to NaN got all 262,144 elements of a
 * variable past the check). Called between psd_shmmap_enter and _leave;
 * returns false with call failed. */
bool shard_push_shm(psd_shard *s, ps_rpc_call *call, ps_wire_push *r,
                    pending_push *p, uint64_t *shm_in_out)
{
    char err[400];
    uint64_t shm_in = 0;
    ps_rpc_peer_cred who;
    bool local = ps_rpc_call_peer_cred(call, &who) == 0;
    void **at = NULL;
    for (size_t i = 0; i < r->ngrads; i++) {
        ps_wire_grad *g = &r->grads[i];
        if (g->value_into.set) {
            if (!r->return_values) {
                atomic_fetch_add(&s->bad, 1);
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Push: grads[%zu]: "
                            "value_into without return_values", i);
                goto fail;
            }
            if (p->into == NULL && (p->into = calloc(r->ngrads, sizeof *p->into)) == NULL)
                goto oom;
            p->into[i] = g->value_into;
        }
        if (!g->shm.set)
            continue;
        if (g->has_data && g->nbytes > 0) {
            atomic_fetch_add(&s->bad, 1);
            ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Push: grads[%zu]: the "
                        "gradient has both data and shm; send one", i);
            goto fail;
        }
        if (at == NULL && (at = calloc(r->ngrads, sizeof *at)) == NULL)
            goto oom;
        int code = psd_shmmap_get(s->shm, local ? &who : NULL, &g->shm, &at[i], err,
                                  sizeof err);
        if (code != 0) {
            if (code == PS_RPC_INVALID_ARGUMENT)
                atomic_fetch_add(&s->bad, 1);
            ps_rpc_fail(call, code, "Push: grads[%zu]: %s", i, err);
            goto fail;
        }
        shm_in += g->shm.length;
    }
    struct shm_bufs *tb = shm_bufs();
    if (tb == NULL || shm_room(tb, (size_t)shm_in, r->ngrads) != 0)
        goto oom;
    uint8_t *copy = tb->copy;
    if (shm_in > 0) {
        for (size_t i = 0; i < r->ngrads; i++) {
            ps_wire_grad *g = &r->grads[i];
            if (!g->shm.set)
                continue;
            tb->mag[i] = copy_grad(s, copy, at[i], g->shm.length);
            g->shm_piece = (struct ps_piece){copy, g->shm.length};
            ps_wire_bytes_init(&g->data, &g->shm_piece, 1);
            g->nbytes = g->shm.length;
            copy += g->shm.length;
        }
    }
    free(at);
    *shm_in_out = shm_in;
    return true;
oom:
    ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
fail:
    free(at);
    return false;
}

const uint32_t *shard_push_shm_mags(void)
{
    struct shm_bufs *b = shm_bufs();
    return b != NULL ? b->mag : NULL;
}

void shard_push_shm_trim(void)
{
    struct shm_bufs *b = shm_bufs();
    if (b != NULL && b->cap > SHM_COPY_KEEP) {
        free(b->copy);
        b->copy = NULL;
        b->cap = 0;
    }
}
