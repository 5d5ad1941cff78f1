/*
 * buf.h - a growable byte buffer that calls reuse, so a steady stream of
 * requests or responses costs no allocation; and PS_FREE_ALL, which frees
 * the buffers a struct owns in one statement.
 *
 * Threads and lifetime: a ps_buf belongs to whoever holds it and is not
 * locked; zero-initialize it, and ps_buf_free releases its memory (it may
 * be reused afterwards). Growing it moves data, so pointers into it are
 * valid only until the next ps_buf_reserve.
 */
#ifndef PS_BUF_H
#define PS_BUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct ps_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
} ps_buf;

/* Makes room for `cap` bytes (contents up to len kept). 0 or -ENOMEM. */
int ps_buf_reserve(ps_buf *b, size_t cap);
/* Frees the memory and leaves b empty (and zeroed). */
void ps_buf_free(ps_buf *b);

/* Frees each pointer given, in order; NULL ones are passed over, as free
 * passes them. For a teardown that releases several owned buffers:
 * PS_FREE_ALL(p->a, p->b, p->c). */
#define PS_FREE_ALL(...)                                                  \
    ps_free_all((void *[]){__VA_ARGS__},                                  \
                sizeof((void *[]){__VA_ARGS__}) / sizeof(void *))

static inline void ps_free_all(void *const *ptrs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(ptrs[i]);
}

/* An array arr of *cap elements of size bytes, holding n: with room for
 * one more, arr itself; else arr grown (doubled, first when empty) and
 * *cap updated, or NULL with arr left as it was. */
static inline void *ps_grow(void *arr, size_t *cap, size_t n, size_t size, size_t first)
{
    if (n < *cap)
        return arr;
    size_t nc = *cap ? *cap * 2 : first;
    void *p = realloc(arr, nc * size);
    if (p != NULL)
        *cap = nc;
    return p;
}

#endif
