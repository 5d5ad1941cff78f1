/*
 * rpc_msg.h - pooled buffers for big outgoing messages, and the pieces and
 * parts that messages cross the rpc interface in (rpc.h).
 *
 * A big outgoing message is built in place: take a buffer from the pool,
 * write the message into it, set its length, and send it. gRPC sends
 * straight from it and gives it back to the pool, warm, when done; a steady
 * stream of big messages then costs no allocation and no page fault.
 *
 * Threads and lifetime: a ps_rpc_msg is refcounted and may be passed
 * between threads; the creator drops its reference with ps_rpc_msg_unref
 * (after sending), and its bytes must not be written while
 * ps_rpc_msg_shared() says gRPC still holds it. The pool is process-wide,
 * locked, and keeps at most 16 MiB of idle buffers.
 */
#ifndef PS_RPC_MSG_H
#define PS_RPC_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ps_rpc_msg ps_rpc_msg;

/* A buffer of at least cap bytes (contents undefined); NULL when out of
 * memory. */
ps_rpc_msg *ps_rpc_msg_new(size_t cap);
uint8_t *ps_rpc_msg_data(ps_rpc_msg *m);
size_t ps_rpc_msg_cap(const ps_rpc_msg *m);
void ps_rpc_msg_set_len(ps_rpc_msg *m, size_t len);
size_t ps_rpc_msg_len(const ps_rpc_msg *m);
void ps_rpc_msg_unref(ps_rpc_msg *m);
/* Takes one more reference (for a ps_rpc_part that sends m in place). */
void ps_rpc_msg_ref(ps_rpc_msg *m);
/* True when anyone but the caller holds a reference (gRPC still sending
 * it): the caller must not write into it then. */
bool ps_rpc_msg_shared(ps_rpc_msg *m);
/* ps_rpc_msg_unref with the type a ps_rpc_part's release takes. */
void ps_rpc_msg_release(void *m);
/* Waits until nobody but the caller holds m (gRPC has written what it sent
 * from it), so that the caller may write into it again. NULL: at once. */
void ps_rpc_msg_wait_unshared(ps_rpc_msg *m);
/* The same for at most timeout_ms; false if gRPC still holds it then (a
 * send stuck on a dead connection holds it until the connection is torn
 * down, which can take minutes: a caller that cannot wait takes a fresh
 * buffer instead). */
bool ps_rpc_msg_wait_unshared_for(ps_rpc_msg *m, int timeout_ms);
/* Bytes of idle buffers the pool keeps (bounded at 16 MiB). */
size_t ps_rpc_pool_bytes(void);

/* A received message as the pieces it arrived in, borrowed for the length
 * of a callback: decoders that can work across pieces avoid a copy. */
struct ps_piece {
    const uint8_t *data;
    size_t len;
};
typedef int (*ps_rpc_pieces_fn)(void *ctx, const struct ps_piece *pieces,
                                int npieces);

/* One part of a message sent as the concatenation of parts. A part with no
 * release function is copied. A part with one is sent in place, with no
 * copy: its bytes must stay unchanged until gRPC calls release(arg), which
 * it does exactly once, from any thread, whether the send succeeds or not
 * (also when building the message fails). */
typedef struct ps_rpc_part {
    const void *data;
    size_t len;
    void (*release)(void *arg);
    void *arg;
} ps_rpc_part;

#endif
