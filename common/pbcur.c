#include "pbcur.h"

#include <string.h>

void ps_pbcur_init(ps_pbcur *c, const struct ps_piece *pieces, int np)
{
    size_t total = 0;
    for (int i = 0; i < np; i++)
        total += pieces[i].len;
    *c = (ps_pbcur){pieces, np, 0, 0, total};
}

/* Moves past exhausted pieces; false when none is left. */
static int settle(ps_pbcur *c)
{
    while (c->i < c->np && c->off == c->p[c->i].len) {
        c->i++;
        c->off = 0;
    }
    return c->i < c->np;
}

int ps_pbcur_varint(ps_pbcur *c, uint64_t *out)
{
    uint64_t v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (c->left == 0 || !settle(c))
            return -1;
        uint8_t b = c->p[c->i].data[c->off++];
        c->left--;
        v |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

int ps_pbcur_bool(ps_pbcur *c, int *out)
{
    int any = 0;
    for (int i = 0; i < 10; i++) {
        if (c->left == 0 || !settle(c))
            return -1;
        uint8_t b = c->p[c->i].data[c->off++];
        c->left--;
        any |= (b & 0x7f) != 0;
        if (!(b & 0x80)) {
            *out = any;
            return 0;
        }
    }
    return -1;
}

int ps_pbcur_take(ps_pbcur *c, void *dst, size_t n)
{
    if (n > c->left)
        return -1;
    c->left -= n;
    uint8_t *d = dst;
    while (n > 0) {
        if (!settle(c))
            return -1;
        size_t avail = c->p[c->i].len - c->off;
        size_t k = avail < n ? avail : n;
        if (d != NULL) {
            memcpy(d, c->p[c->i].data + c->off, k);
            d += k;
        }
        c->off += k;
        n -= k;
    }
    return 0;
}

int ps_pbcur_sub(ps_pbcur *c, ps_pbcur *sub)
{
    uint64_t len;
    if (ps_pbcur_varint(c, &len) != 0 || len > c->left)
        return -1;
    *sub = *c;
    sub->left = (size_t)len;
    return ps_pbcur_take(c, NULL, (size_t)len);
}

int ps_pbcur_skip(ps_pbcur *c, int wt)
{
    uint64_t v;
    ps_pbcur s;
    switch (wt) {
    case PS_WT_VARINT: return ps_pbcur_varint(c, &v);
    case PS_WT_I64: return ps_pbcur_take(c, NULL, 8);
    case PS_WT_I32: return ps_pbcur_take(c, NULL, 4);
    case PS_WT_LEN: return ps_pbcur_sub(c, &s);
    default: return -1;
    }
}

size_t ps_pbcur_peek(ps_pbcur *c, const uint8_t **p)
{
    if (c->left == 0 || !settle(c))
        return 0;
    size_t avail = c->p[c->i].len - c->off;
    *p = c->p[c->i].data + c->off;
    return avail < c->left ? avail : c->left;
}

uint8_t *ps_pb_put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

size_t ps_pb_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}
