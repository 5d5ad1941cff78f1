/*
 * psclient.h - the C client library of psd's ParameterServer service, for
 * workerd, psctl and the benchmarks.
 *
 * The hot calls move tensors with as few copies as the wire allows: Push
 * encodes the gradients by hand, sending each from the caller's memory in
 * place when it lies in a message buffer (ps_client_item.msg), else copying
 * it into a pooled request buffer, and Pull parses the response in place
 * and copies each value straight into the caller's memory (one copy), so a
 * model whose parameters are one block with views is pulled into that block
 * directly. With shared memory (ps_client_set_shm) a psd on the same host
 * reads the gradients and writes the values there itself, and the call
 * carries only references. The other calls go through protobuf-c.
 *
 * Threads and lifetime: one ps_client is used by one thread at a time (it
 * owns the reused buffers); give each thread its own, as each holds its own
 * gRPC channel. Every call returns 0, PS_ERPC with *st filled (st may be
 * NULL), PS_EPARSE for a response that does not parse, PS_ESHAPE when a
 * pulled value does not have the element count the caller expects (the
 * message names the variable), or -ENOMEM.
 */
#ifndef PS_PSCLIENT_H
#define PS_PSCLIENT_H

#include "common/buf.h"
#include "common/rpc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ps_client ps_client;

/* One tensor of a push or pull: a name and n float32 values. */
typedef struct ps_client_item {
    const char *name;
    float *data;             /* push: read; pull: written */
    size_t n;                /* elements */
    const int64_t *shape;    /* push: optional (NULL = not sent) */
    int ndim;
    uint64_t min_version;    /* pull: wait for it (0 = no wait) */
    uint64_t version;        /* out: the version pushed to / pulled */
    /* push: optional; the message buffer data lies in. The gradient is then
     * sent from it in place, with no copy: gRPC holds a reference until it
     * has written the bytes, and the caller must not change them while
     * ps_rpc_msg_shared(msg) (ps_rpc_msg_wait_unshared waits). */
    ps_rpc_msg *msg;
} ps_client_item;

int ps_client_create(const char *address, const ps_rpc_client_opts *opts,
                     ps_client **out);

/* Shared memory with a psd on this host (shm.h): from now on a gradient
 * whose data lies in shm goes by reference, and a value pulled into memory
 * in shm is written there by psd, with no bytes of either through the
 * socket. The caller must not change a gradient until its push returns.
 * If psd answers that it cannot map shm, the client logs it once and sends
 * everything inline from then on. shm must outlive the client's use of it;
 * NULL turns it off. */
struct ps_shm;
void ps_client_set_shm(ps_client *c, const struct ps_shm *shm);
/* Whether tensors in the shared memory go by reference (set, and psd has
 * not refused it). */
bool ps_client_shm_active(const ps_client *c);
void ps_client_destroy(ps_client *c);

/* Where this process should reach the psd at address: its unix socket when
 * address is a TCP address of this host (ps_shm_target_is_local) and psd's
 * Stats advertises a socket (local_address) with this process's host id
 * that this process may connect to (hostid.h's ps_host_use_local); the
 * socket skips the TCP stack and lets tensors go through shared memory.
 * Else address itself, and why says why not ("another host", "psd
 * advertises no local socket", the Stats call's error, ...). A unix:
 * address is its own route. opts are the TCP connection's (the Stats call
 * is made with them, within deadline_ms). Returns 0 with out filled (why ""
 * when out is the socket), or -ENAMETOOLONG when out is too small. */
int ps_client_local_route(const char *address, const ps_rpc_client_opts *opts,
                          int deadline_ms, char *out, size_t outlen, char *why,
                          size_t whylen);
const char *ps_client_address(const ps_client *c);
/* The client's RPC channel, for the calls built elsewhere (sparseclient.c). */
ps_rpc_client *ps_client_rpc(ps_client *c);

/* CreateVariable with a packed-or-not ps.v1.VariableSpec (const
 * Ps__V1__VariableSpec *). *created and *version may be NULL. */
int ps_client_create_variable(ps_client *c, const void *spec, int *created,
                              uint64_t *version, int deadline_ms,
                              ps_rpc_status *st);

/* Pushes the gradients of items[0..n) as one PushRequest. Each item's
 * version is set to the variable's version after the push. */
int ps_client_push(ps_client *c, uint32_t worker, uint64_t step,
                   ps_client_item *items, size_t n, int deadline_ms,
                   ps_rpc_status *st);

/* A push that also brings the values back, in one round trip: pushes the
 * gradients of pushes[0..n) (PushRequest.return_values) and copies each
 * variable's value, once the push is applied, into pulls[i].data (same
 * variable, same order; pulls[i].version is set to the value's version,
 * pushes[i].version to the version this push produced). */
int ps_client_push_pull(ps_client *c, uint32_t worker, uint64_t step,
                        ps_client_item *pushes, ps_client_item *pulls, size_t n,
                        int deadline_ms, ps_rpc_status *st);

/* Pulls items[0..n) in one PullRequest, copying each value into its data
 * (which must hold exactly n elements) and setting its version. */
int ps_client_pull(ps_client *c, ps_client_item *items, size_t n,
                   int deadline_ms, ps_rpc_status *st);

/* Dense tensors on the wire in half precision from now on: dtype 2
 * (ps.v1.DTYPE_FLOAT16) or 3 (BFLOAT16) sends each gradient rounded to it
 * and asks each value in it (half the bytes; psd keeps float32), 1 or 0
 * float32 again. With error_feedback the client keeps, per variable name,
 * the residual of each rounding and adds it to the variable's next
 * gradient (common/half.h), so that nothing is lost over time. A push
 * that fails leaves in the residual the whole gradient (with the residual
 * before) of each gradient or piece psd did not apply, for the next push
 * to send: a failed push must not be sent again with the same gradient,
 * which would count it twice. Counted as applied: a call answered OK, and
 * one whose answer never came though it may have reached psd (deadline,
 * cancelled, UNKNOWN); not applied: one psd refused, UNAVAILABLE (as the
 * client's retries take it), or never sent. Tensors in shared memory stay
 * float32. Returns 0, or PS_EINVAL_ARG for another dtype. */
int ps_client_set_wire_dtype(ps_client *c, int dtype, bool error_feedback);

/* The error feedback residual the client keeps for variable name: *r and
 * *n set (borrowed, valid until the client's next push or its destroy),
 * or returns PS_ENOTFOUND when it has none (no half push of it with
 * error feedback yet). */
int ps_client_residual(const ps_client *c, const char *name, const float **r,
                       size_t *n);

/* Tensors of more than piece_bytes go in pieces of piece_bytes, on by
 * default (1 MiB, 2): a push's pieces one behind the other, each started
 * once the one before is handed to the connection (the next encoded, and
 * rounded to half, while the client waits), so that psd applies a piece
 * while the next is on the wire; a pull's up to window calls not yet
 * answered at once; and a push's values come back while its later pieces
 * still go out (the link is full duplex). Each piece is a call
 * of its own that names its place in the tensor (Gradient.offset and
 * .total, PullItem.offset, .count and .total); the items that are not cut
 * go whole in one call beside them, and a push or pull is cut into at most
 * 64 calls (bigger tensors get bigger pieces; one with more than 32 tensors
 * to cut goes in one call). A push in pieces is still one update: psd
 * raises the version once the pieces cover the variable, and a SYNC step
 * counts them as the worker's one push (the pieces before the last are
 * answered at once, the last once the step is applied, with the whole
 * value when asked). A pull in pieces may see pushes land between its
 * pieces; each value's version is the lowest its pieces had. Tensors in
 * shared memory are never cut. piece_bytes 0 turns it off. Returns 0, or
 * PS_EINVAL_ARG for piece_bytes in 1..4095 or window outside 1..64. */
int ps_client_set_pieces(ps_client *c, size_t piece_bytes, int window);

/* From now on this client's pushes are deltas (PushRequest.delta): psd
 * adds each tensor to its variable, w += d, with no optimizer (local SGD's
 * exchange). false: gradients again. */
void ps_client_set_delta(ps_client *c, bool delta);

/* The same as worker `worker` at clock `step` (PullRequest.worker, step:
 * the steps it has pushed), so that psd holds the pull of a
 * BOUNDED_STALENESS variable until the slowest live worker is within its
 * staleness. step 0 is ps_client_pull. */
int ps_client_pull_at(ps_client *c, uint32_t worker, uint64_t step,
                      ps_client_item *items, size_t n, int deadline_ms,
                      ps_rpc_status *st);

/* Encodes a PushRequest into b (reused); exposed for the benchmarks and the
 * fuzz tests. Returns 0 or -ENOMEM. */
int ps_push_encode(ps_buf *b, uint32_t worker, uint64_t step,
                   const ps_client_item *items, size_t n);

/* Parses a PullResponse in place, copying values into items (matched by
 * position and checked by name). Returns 0, PS_EPARSE or PS_ESHAPE with one
 * line in err. */
int ps_pull_decode(const uint8_t *buf, size_t len, ps_client_item *items,
                   size_t n, char *err, size_t errlen);

/* The same over a message received in pieces (as gRPC hands it over). */
int ps_pull_decode_pieces(const struct ps_piece *pieces, int np,
                          ps_client_item *items, size_t n, char *err, size_t errlen);

#endif
