/*
 * rpc_msg.c - pooled buffers for big outgoing messages.
 *
 * A 4 MiB reply packed into fresh memory every time costs a page fault per
 * 4 KiB page, which here runs at a fifth of memcpy's speed. Big messages are
 * built in buffers taken from a process-wide pool and handed to gRPC as
 * slices that point into them; when gRPC drops its last reference the
 * buffer goes back to the pool, warm. The pool keeps at most
 * POOL_KEEP_BYTES of idle buffers, so its memory is bounded and reported.
 */
#include "rpc_internal.h"

#include "errors.h"

#include <errno.h>
#include <limits.h>
#include <grpc/byte_buffer_reader.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POOL_MIN_BYTES ((size_t)256 << 10)  /* smaller: a plain slice */
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

static void slice_done(void *p)
{
    ps_rpc_msg_unref(p);
}

grpc_byte_buffer *ps_rpc_msg_byte_buffer(ps_rpc_msg *m)
{
    atomic_fetch_add(&m->refs, 1);
    grpc_slice s = grpc_slice_new_with_user_data(m->data, m->len, slice_done, m);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

grpc_byte_buffer *ps_rpc_bb_fill(size_t len, void (*fill)(void *ctx, uint8_t *dst),
                                 void *ctx)
{
    if (len < POOL_MIN_BYTES) {
        grpc_slice s = grpc_slice_malloc(len);
        fill(ctx, GRPC_SLICE_START_PTR(s));
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        return bb;
    }
    ps_rpc_msg *m = ps_rpc_msg_new(len);
    if (m == NULL)
        return NULL;
    fill(ctx, m->data);
    m->len = len;
    grpc_byte_buffer *bb = ps_rpc_msg_byte_buffer(m);
    ps_rpc_msg_unref(m);
    return bb;
}

grpc_byte_buffer *ps_rpc_bb_parts(const ps_rpc_part *parts, int n)
{
    enum { STACKS = 16 };
    grpc_slice slices_s[STACKS], *slices = slices_s;
    if (n > STACKS) {
        /* At most one slice per part: a run of copied parts is one. */
        slices = malloc(sizeof *slices * (size_t)n);
        if (slices == NULL)
            goto fail;
    }
    int ns = 0;
    for (int i = 0; i < n;) {
        if (parts[i].release != NULL) {
            /* A zero-length slice would not call release: call it here. */
            if (parts[i].len == 0)
                parts[i].release(parts[i].arg);
            else
                slices[ns++] = grpc_slice_new_with_user_data(
                    (void *)parts[i].data, parts[i].len, parts[i].release,
                    parts[i].arg);
            i++;
            continue;
        }
        int j = i;
        size_t len = 0;
        for (; j < n && parts[j].release == NULL; j++)
            len += parts[j].len;
        grpc_slice s = grpc_slice_malloc(len);
        uint8_t *dst = GRPC_SLICE_START_PTR(s);
        for (; i < j; i++) {
            if (parts[i].len > 0)
                memcpy(dst, parts[i].data, parts[i].len);
            dst += parts[i].len;
        }
        slices[ns++] = s;
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, (size_t)ns);
    for (int i = 0; i < ns; i++)
        grpc_slice_unref(slices[i]);
    if (slices != slices_s)
        free(slices);
    return bb;
fail:
    for (int i = 0; i < n; i++)
        if (parts[i].release != NULL)
            parts[i].release(parts[i].arg);
    return NULL;
}

int ps_rpc_bb_read(grpc_byte_buffer *bb, ps_buf *b)
{
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return PS_EPARSE;
    b->len = 0;
    int rc = ps_buf_reserve(b, grpc_byte_buffer_length(bb));
    grpc_slice s;
    while (rc == 0 && grpc_byte_buffer_reader_next(&reader, &s)) {
        size_t n = GRPC_SLICE_LENGTH(s);
        rc = ps_buf_reserve(b, b->len + n);
        if (rc == 0) {
            memcpy(b->data + b->len, GRPC_SLICE_START_PTR(s), n);
            b->len += n;
        }
        grpc_slice_unref(s);
    }
    grpc_byte_buffer_reader_destroy(&reader);
    return rc;
}

int ps_rpc_bb_pieces(grpc_byte_buffer *bb, ps_rpc_pieces_fn fn, void *ctx)
{
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return PS_EPARSE;
    /* A raw (uncompressed) buffer's slices are its pieces, borrowed. The
     * slices are kept (one reference each) and the pieces point into the
     * kept copies: a small slice holds its bytes inline, inside the
     * grpc_slice value itself, so a pointer into a loop variable would
     * dangle. Up to 64 on the stack, more on the heap. */
    enum { STACKP = 64 };
    struct ps_piece pieces_s[STACKP], *pieces = pieces_s;
    grpc_slice slices_s[STACKP], *slices = slices_s;
    int n = 0, cap = STACKP, rc = 0;
    grpc_slice s;
    while (grpc_byte_buffer_reader_next(&reader, &s)) {
        if (n == cap && rc == 0) {
            int ncap = cap * 4;
            struct ps_piece *np = malloc(sizeof *np * (size_t)ncap);
            grpc_slice *ns = malloc(sizeof *ns * (size_t)ncap);
            if (np == NULL || ns == NULL) {
                free(np);
                free(ns);
                rc = -ENOMEM;
            } else {
                memcpy(ns, slices, sizeof *ns * (size_t)n);
                if (slices != slices_s) {
                    free(slices);
                    free(pieces);
                }
                slices = ns;
                pieces = np;
                cap = ncap;
            }
        }
        if (rc != 0) {
            grpc_slice_unref(s);
            continue;
        }
        slices[n++] = s;
    }
    grpc_byte_buffer_reader_destroy(&reader);
    for (int i = 0; i < n; i++) {
        pieces[i].data = GRPC_SLICE_START_PTR(slices[i]);
        pieces[i].len = GRPC_SLICE_LENGTH(slices[i]);
    }
    if (rc == 0)
        rc = fn(ctx, pieces, n);
    for (int i = 0; i < n; i++)
        grpc_slice_unref(slices[i]);
    if (slices != slices_s) {
        free(slices);
        free(pieces);
    }
    return rc;
}
