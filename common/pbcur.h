/*
 * pbcur.h - a cursor over protobuf wire format that arrived in pieces, and
 * the two helpers the hand-written encoders share.
 *
 * gRPC hands a received message over as the slices it arrived in; the hot
 * messages (PushRequest on the server, PullResponse on the client) are
 * decoded straight from those pieces, so a 4 MiB tensor is never joined into
 * one buffer first. A cursor covers `left` bytes starting at piece i, offset
 * off; a sub-cursor over a length-delimited field is a copy of the cursor
 * with a shorter `left`.
 *
 * Threads and lifetime: a cursor borrows the pieces array and the bytes it
 * points to; both must outlive it. Every function returns 0, or -1 when the
 * bytes end early or do not parse (the cursor is then in no useful state).
 */
#ifndef PS_PBCUR_H
#define PS_PBCUR_H

#include "rpc.h"

#include <stddef.h>
#include <stdint.h>

enum { PS_WT_VARINT = 0, PS_WT_I64 = 1, PS_WT_LEN = 2, PS_WT_I32 = 5 };

typedef struct ps_pbcur {
    const struct ps_piece *p;
    int np;
    int i;          /* current piece */
    size_t off;     /* offset in it */
    size_t left;    /* bytes left in this (sub)message */
} ps_pbcur;

/* A cursor over all the bytes of pieces[0..np). */
void ps_pbcur_init(ps_pbcur *c, const struct ps_piece *pieces, int np);

int ps_pbcur_varint(ps_pbcur *c, uint64_t *out);

/* A bool: true when any payload bit of the varint is set (a varint longer
 * than 64 bits reads as protobuf-c reads it, not truncated to zero). */
int ps_pbcur_bool(ps_pbcur *c, int *out);

/* Copies the next n bytes to dst, or skips them when dst is NULL. */
int ps_pbcur_take(ps_pbcur *c, void *dst, size_t n);

/* Reads a length prefix and makes *sub a cursor over that many bytes; the
 * parent moves past them. */
int ps_pbcur_sub(ps_pbcur *c, ps_pbcur *sub);

/* Skips the value of one field of wire type wt (groups are refused). */
int ps_pbcur_skip(ps_pbcur *c, int wt);

/* Writing by hand: a varint at p, returning its end; a varint's length. */
uint8_t *ps_pb_put_varint(uint8_t *p, uint64_t v);
size_t ps_pb_varint_len(uint64_t v);

/* The contiguous bytes at the cursor, without moving it: *p and the count
 * (at most c->left); 0 when no bytes are left. */
size_t ps_pbcur_peek(ps_pbcur *c, const uint8_t **p);

#endif
