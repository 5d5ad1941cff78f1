/*
 * buf.c - see buf.h.
 */
#include "common/buf.h"

#include <errno.h>
#include <stdlib.h>

int ps_buf_reserve(ps_buf *b, size_t cap)
{
    if (cap <= b->cap)
        return 0;
    size_t ncap = b->cap ? b->cap : 4096;
    while (ncap < cap)
        ncap = ncap * 2 > ncap ? ncap * 2 : cap;
    uint8_t *p = realloc(b->data, ncap);
    if (p == NULL)
        return -ENOMEM;
    b->data = p;
    b->cap = ncap;
    return 0;
}

void ps_buf_free(ps_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
