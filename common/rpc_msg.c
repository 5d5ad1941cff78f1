/*
 * rpc_msg.c - pooled buffers for big outgoing messages (see rpc_msg.h).
 *
 * A 4 MiB reply packed into fresh memory every time costs a page fault per
 * 4 KiB page, which here runs at a fifth of memcpy's speed. Big messages are
 * built in buffers taken from a process-wide pool and handed to gRPC as
 * slices that point into them; when gRPC drops its last reference the
 * buffer goes back to the pool, warm. The pool keeps at most
 * POOL_KEEP_BYTES of idle buffers, so its memory is bounded and reported.
 */
#include "common/rpc_msg.h"

#include "common/clock.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POOL_KEEP_BYTES ((size_t)16 << 20)  /* idle buffers kept at most */
#define POOL_GRAIN ((size_t)64 << 10)

struct ps_rpc_msg {
    struct ps_rpc_msg *next; /* in the pool */
    atomic_int refs;
    size_t cap;
    size_t len;
    uint8_t *data;
};

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static ps_rpc_msg *pool_head;
static size_t pool_bytes;

ps_rpc_msg *ps_rpc_msg_new(size_t cap)
{
    size_t want = (cap + POOL_GRAIN - 1) / POOL_GRAIN * POOL_GRAIN;
    if (want == 0)
        want = POOL_GRAIN;
    ps_rpc_msg *m = NULL;
    pthread_mutex_lock(&pool_mu);
    /* The smallest idle buffer that fits without wasting more than half. */
    ps_rpc_msg **best = NULL;
    for (ps_rpc_msg **p = &pool_head; *p != NULL; p = &(*p)->next)
        if ((*p)->cap >= want && (*p)->cap <= 2 * want &&
            (best == NULL || (*p)->cap < (*best)->cap))
            best = p;
    if (best != NULL) {
        m = *best;
        *best = m->next;
        pool_bytes -= m->cap;
    }
    pthread_mutex_unlock(&pool_mu);
    if (m == NULL) {
        m = malloc(sizeof *m);
        if (m == NULL)
            return NULL;
        m->data = aligned_alloc(64, want);
        if (m->data == NULL) {
            free(m);
            return NULL;
        }
        m->cap = want;
    }
    m->next = NULL;
    m->len = 0;
    atomic_init(&m->refs, 1);
    return m;
}

uint8_t *ps_rpc_msg_data(ps_rpc_msg *m)
{
    return m->data;
}

size_t ps_rpc_msg_cap(const ps_rpc_msg *m)
{
    return m->cap;
}

void ps_rpc_msg_set_len(ps_rpc_msg *m, size_t len)
{
    m->len = len;
}

size_t ps_rpc_msg_len(const ps_rpc_msg *m)
{
    return m->len;
}

void ps_rpc_msg_unref(ps_rpc_msg *m)
{
    if (m == NULL || atomic_fetch_sub(&m->refs, 1) != 1)
        return;
    pthread_mutex_lock(&pool_mu);
    if (pool_bytes + m->cap <= POOL_KEEP_BYTES) {
        m->next = pool_head;
        pool_head = m;
        pool_bytes += m->cap;
        m = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    if (m != NULL) {
        free(m->data);
        free(m);
    }
}

void ps_rpc_msg_ref(ps_rpc_msg *m)
{
    atomic_fetch_add(&m->refs, 1);
}

bool ps_rpc_msg_shared(ps_rpc_msg *m)
{
    return atomic_load(&m->refs) > 1;
}

void ps_rpc_msg_release(void *m)
{
    ps_rpc_msg_unref(m);
}

bool ps_rpc_msg_wait_unshared_for(ps_rpc_msg *m, int timeout_ms)
{
    /* gRPC drops its reference once the bytes are in the kernel, which is
     * before the peer can answer: this almost never waits. */
    if (m == NULL)
        return true;
    int64_t until = ps_now_ms() + timeout_ms;
    for (int i = 0; atomic_load(&m->refs) > 1; i++) {
        if (ps_now_ms() >= until)
            return false;
        struct timespec ts = {0, i < 100 ? 10000L : 1000000L};
        nanosleep(&ts, NULL);
    }
    return true;
}

void ps_rpc_msg_wait_unshared(ps_rpc_msg *m)
{
    ps_rpc_msg_wait_unshared_for(m, INT_MAX);
}

size_t ps_rpc_pool_bytes(void)
{
    pthread_mutex_lock(&pool_mu);
    size_t b = pool_bytes;
    pthread_mutex_unlock(&pool_mu);
    return b;
}
