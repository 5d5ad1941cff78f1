/*
 * rpc_slice.c - messages as gRPC byte buffers: pooled buffers and parts
 * sent in place as slices, received buffers read as one copy or as
 * borrowed pieces. See rpc_slice.h.
 */
#include "common/rpc_slice.h"

#include "common/errors.h"

#include <errno.h>
#include <grpc/byte_buffer_reader.h>
#include <stdlib.h>
#include <string.h>

/* Smaller messages go into a plain slice: the pool pays off for big ones. */
#define POOL_MIN_BYTES ((size_t)256 << 10)

static void slice_done(void *p)
{
    ps_rpc_msg_unref(p);
}

grpc_byte_buffer *ps_rpc_msg_byte_buffer(ps_rpc_msg *m)
{
    ps_rpc_msg_ref(m);
    grpc_slice s = grpc_slice_new_with_user_data(ps_rpc_msg_data(m),
                                                 ps_rpc_msg_len(m), slice_done, m);
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
    fill(ctx, ps_rpc_msg_data(m));
    ps_rpc_msg_set_len(m, len);
    grpc_byte_buffer *bb = ps_rpc_msg_byte_buffer(m);
    ps_rpc_msg_unref(m);
    return bb;
}

struct copy {
    const void *src;
    size_t len;
};

static void fill_copy(void *ctx, uint8_t *dst)
{
    struct copy *c = ctx;
    if (c->len > 0)
        memcpy(dst, c->src, c->len);
}

grpc_byte_buffer *ps_rpc_bb_copy(const void *data, size_t len)
{
    struct copy c = {data, len};
    return ps_rpc_bb_fill(len, fill_copy, &c);
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
