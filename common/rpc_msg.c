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
#include <grpc/byte_buffer_reader.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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
    /* A raw (uncompressed) buffer's slices are its pieces, borrowed. */
    enum { MAXP = 64 };
    struct ps_piece pieces[MAXP];
    grpc_slice slices[MAXP];
    int n = 0, rc = 0;
    grpc_slice s;
    ps_buf joined = {0};
    bool overflow = false;
    while (grpc_byte_buffer_reader_next(&reader, &s)) {
        if (n < MAXP && !overflow) {
            /* Point into the stored copy: a small slice keeps its bytes
             * inline, inside the grpc_slice value itself, so a pointer into
             * `s` would dangle at the next iteration. */
            slices[n] = s;
            pieces[n].data = GRPC_SLICE_START_PTR(slices[n]);
            pieces[n].len = GRPC_SLICE_LENGTH(slices[n]);
            n++;
            continue;
        }
        /* Too many pieces: fall back to one joined copy. */
        if (!overflow) {
            overflow = true;
            for (int i = 0; i < n && rc == 0; i++) {
                rc = ps_buf_reserve(&joined, joined.len + pieces[i].len);
                if (rc == 0) {
                    memcpy(joined.data + joined.len, pieces[i].data, pieces[i].len);
                    joined.len += pieces[i].len;
                }
            }
        }
        size_t len = GRPC_SLICE_LENGTH(s);
        if (rc == 0)
            rc = ps_buf_reserve(&joined, joined.len + len);
        if (rc == 0) {
            memcpy(joined.data + joined.len, GRPC_SLICE_START_PTR(s), len);
            joined.len += len;
        }
        grpc_slice_unref(s);
    }
    grpc_byte_buffer_reader_destroy(&reader);
    if (rc == 0) {
        if (overflow) {
            struct ps_piece one = {joined.data, joined.len};
            rc = fn(ctx, &one, 1);
        } else {
            rc = fn(ctx, pieces, n);
        }
    }
    for (int i = 0; i < n; i++)
        grpc_slice_unref(slices[i]);
    ps_buf_free(&joined);
    return rc;
}
