/*
 * rpc_slice.h - what the server (rpc_server.c, rpc_call.c) and the client
 * (rpc_client.c) share and nobody else sees: messages turned into gRPC
 * byte buffers (pooled buffers and in-place parts become slices with no
 * copy) and received byte buffers read back.
 * With rpc_server_internal.h, the only headers that name a gRPC type.
 *
 * Threads and lifetime: every function may run on any thread. A byte buffer
 * returned here belongs to the caller (gRPC consumes it when it is sent);
 * the slices in it hold what they point into (a ps_rpc_msg reference, or a
 * part until its release runs).
 */
#ifndef PS_RPC_SLICE_H
#define PS_RPC_SLICE_H

#include "common/buf.h"
#include "common/rpc_msg.h"

#include <grpc/byte_buffer.h>
#include <grpc/slice.h>

/* A byte buffer whose one slice is msg's bytes: no copy. The slice holds a
 * reference to msg until gRPC is done with it. */
grpc_byte_buffer *ps_rpc_msg_byte_buffer(ps_rpc_msg *msg);

/* A byte buffer holding `len` bytes written by fill(ctx, dst) into a pooled
 * buffer (big messages) or a fresh slice (small ones). */
grpc_byte_buffer *ps_rpc_bb_fill(size_t len, void (*fill)(void *ctx, uint8_t *dst),
                                 void *ctx);

/* A byte buffer holding a copy of data[0..len), pooled when big (so that a
 * steady stream of big messages costs no fresh pages). */
grpc_byte_buffer *ps_rpc_bb_copy(const void *data, size_t len);

/* A byte buffer of the concatenation of parts (see ps_rpc_part): copied
 * parts are joined into slices of their own, in-place parts become slices
 * that call release when gRPC drops them. NULL when out of memory (every
 * release has then been called). */
grpc_byte_buffer *ps_rpc_bb_parts(const ps_rpc_part *parts, int n);

/* Copies a received byte buffer into b (reused). Returns 0, PS_EPARSE or
 * -ENOMEM. */
int ps_rpc_bb_read(grpc_byte_buffer *bb, ps_buf *b);

/* Calls fn with the received message as a list of borrowed pieces. Returns
 * fn's return, PS_EPARSE or -ENOMEM (fn not called). */
int ps_rpc_bb_pieces(grpc_byte_buffer *bb, ps_rpc_pieces_fn fn, void *ctx);

#endif
