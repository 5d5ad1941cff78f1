/*
 * wire.h - the hot messages in protobuf wire format, encoded and decoded by
 * hand: PushRequest, PullResponse (and the values half of PushResponse),
 * SparsePullRequest and SparsePushRequest (whose responses are a
 * PullResponse's and a PushResponse's bytes) and ShmRef, as
 * proto/ps.proto defines them.
 *
 * protobuf-c copies every bytes field into fresh memory, which for a 4 MiB
 * tensor costs more than the optimizer that consumes it. So these messages
 * are read straight from the pieces gRPC received them in (a tensor's bytes
 * are handed over as a ps_wire_bytes over those pieces, never joined into
 * one buffer), and written with their tensors' bytes left for the caller to
 * send in place. Every other message is small and goes through protobuf-c.
 *
 * The encoders write what protobuf-c's pack writes for the same message:
 * fields in number order, packed repeated scalars, and a scalar or string
 * at its default value left out; but for two overlong varints that a caller
 * may ask for to place a tensor's bytes (PushRequest's step and a Tensor's
 * dtype), which every parser reads as the same value. tests/unit/check_wire.c
 * holds them to protobuf-c's bytes. The decoders skip unknown fields, as
 * protobuf requires, and refuse a message that does not parse with one line
 * saying where.
 *
 * Threads and lifetime: no state; any thread. A ps_wire_bytes, and the
 * decoded structs holding them, borrow the pieces (array and bytes), which
 * must outlive their use. ps_wire_push reuses its grads array from decode to
 * decode; ps_wire_push_free releases it.
 */
#ifndef PS_WIRE_H
#define PS_WIRE_H

#include "common/rpc_msg.h"
#include "common/shm.h"

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PS_WIRE_MAX_DIMS 8   /* dimensions a decoded gradient keeps */
#define PS_WIRE_MAX_NAME 255 /* bytes of a name a decoder keeps */

/* Room for one value's header (ps_wire_value_header) whose name has at
 * most PS_WIRE_MAX_NAME bytes and which has at most PS_WIRE_MAX_DIMS
 * dimensions. */
#define PS_WIRE_VALUE_HDR_MAX 512

/* ---- varints ------------------------------------------------------------ */

/* A varint written at p, returning its end; a varint's length. */
uint8_t *ps_wire_put_varint(uint8_t *p, uint64_t v);
size_t ps_wire_varint_len(uint64_t v);
/* v as exactly `width` bytes (continuation bits on leading zero groups),
 * so that it can be rewritten in place; v must be below 2^(7 width). */
void ps_wire_put_varint_fixed(uint8_t *p, uint64_t v, int width);

/* ---- bytes in pieces ------------------------------------------------------ */

/* `left` bytes starting at piece i, offset off: the bytes of a field as
 * gRPC received them. A copy is an independent reader of the same bytes. */
typedef struct ps_wire_bytes {
    const struct ps_piece *p;
    int np;
    int i;          /* current piece */
    size_t off;     /* offset in it */
    size_t left;    /* bytes left */
} ps_wire_bytes;

/* All the bytes of pieces[0..np). */
void ps_wire_bytes_init(ps_wire_bytes *b, const struct ps_piece *pieces, int np);
/* The contiguous bytes at the reader, without moving it: *p and the count
 * (at most b->left); 0 when no bytes are left. */
size_t ps_wire_bytes_peek(ps_wire_bytes *b, const uint8_t **p);
/* Copies the next n bytes to dst, or skips them when dst is NULL. Returns
 * 0, or -1 when fewer than n are left. */
int ps_wire_bytes_take(ps_wire_bytes *b, void *dst, size_t n);

/* ---- ShmRef --------------------------------------------------------------- */

/* A ps.v1.ShmRef as decoded: the first PS_SHM_NAME_MAX - 1 bytes of the
 * name, NUL-terminated, and its length on the wire (so that a longer name
 * can be refused by it). */
typedef struct ps_wire_shm_ref {
    char name[PS_SHM_NAME_MAX];
    size_t name_len;
    uint64_t offset, length;
    int set;        /* the field was present */
} ps_wire_shm_ref;

/* The encoded length of a ShmRef's contents (without its tag and length),
 * and the field `field` holding it written at p (returns the end). */
size_t ps_wire_shm_ref_len(const char *name, uint64_t offset, uint64_t length);
uint8_t *ps_wire_shm_ref_put(uint8_t *p, int field, const char *name,
                             uint64_t offset, uint64_t length);
/* Decodes a ShmRef's contents buf[0..len) into *ref (set = 1). Returns NULL,
 * or what is wrong ("ShmRef.name: length past the end", ...). */
const char *ps_wire_shm_ref_decode(const uint8_t *buf, size_t len,
                                   ps_wire_shm_ref *ref);

/* ---- PushRequest ---------------------------------------------------------- */

/* What psd appends to the message of a push it refused at grads[i] after
 * applying the gradients before it (async variables are updated one by
 * one), and what a client with error feedback reads there to know which
 * of its gradients psd applied. */
#define PS_WIRE_APPLIED_BEFORE "; the gradients before grads["
#define PS_WIRE_APPLIED_BEFORE_FMT PS_WIRE_APPLIED_BEFORE "%zu] in this push were applied"

/* One decoded Gradient. */
typedef struct ps_wire_grad {
    char name[PS_WIRE_MAX_NAME + 1]; /* the first 255 bytes, NUL-terminated */
    size_t name_len;       /* the name's length on the wire */
    int dtype;             /* ps.v1.DType value (at most 1000); 0 when absent */
    int64_t shape[PS_WIRE_MAX_DIMS];
    int ndim;              /* -1: more than PS_WIRE_MAX_DIMS dimensions */
    ps_wire_bytes data;    /* the tensor's bytes, in pieces (any alignment) */
    size_t nbytes;
    int has_tensor;        /* the grad field was present */
    int widened_from;      /* psd: the half dtype data was widened from, or 0 */
    int has_data;          /* Tensor.data was present */
    ps_wire_shm_ref shm;   /* Tensor.shm: the bytes are in shared memory */
    ps_wire_shm_ref value_into; /* Gradient.value_into */
    uint64_t offset, total; /* a piece (total >= 1): its first element, and
                               the whole gradient's element count */
    struct ps_piece shm_piece; /* the caller's: data over shared memory */
} ps_wire_grad;

/* A decoded PushRequest. */
typedef struct ps_wire_push {
    uint32_t worker;
    uint64_t step;
    int return_values;     /* answer with the values too */
    int delta;             /* w += grad, no optimizer (PushRequest.delta) */
    int wire_dtype;        /* PushRequest.wire_dtype (0: unset, FLOAT32) */
    ps_wire_grad *grads;   /* ngrads entries; reused across decodes */
    size_t ngrads;
    size_t cap;
    struct ps_piece one;      /* ps_wire_push_decode_buf's one piece */
} ps_wire_push;

/* Decodes the message in pieces[0..np) into req (reusing req->grads).
 * Returns 0, PS_EPARSE with one line in err saying where the bytes stop
 * making sense, or -ENOMEM. A field number 0 is refused. */
int ps_wire_push_decode(const struct ps_piece *pieces, int np, ps_wire_push *req,
                        char *err, size_t errlen);
/* The same for a message in one buffer (which must outlive req's use). */
int ps_wire_push_decode_buf(const uint8_t *buf, size_t len, ps_wire_push *req,
                            char *err, size_t errlen);
void ps_wire_push_free(ps_wire_push *req);

/* One Gradient to encode: its Tensor has the dtype, the shape (ndim 0: none
 * sent) and either nbytes of data (data NULL: the bytes are not written,
 * the caller puts or sends them right after the header; with data_at set
 * the encoder goes on past them and stores where they go in *data_at, for
 * the caller to write) or, with shm set, a reference instead; value_into,
 * when set, asks the value into shared memory; total >= 1 makes it a piece
 * of a gradient of total elements that starts at element offset.
 * dtype_pad overlong bytes in the dtype varint move the data. */
typedef struct ps_wire_grad_out {
    const char *name;
    int dtype;
    const int64_t *shape;
    int ndim;
    const void *data;
    size_t nbytes;
    const ps_wire_shm_ref *shm;
    const ps_wire_shm_ref *value_into;
    int dtype_pad;
    uint64_t offset, total; /* Gradient.offset, .total; 0: not sent */
    uint8_t **data_at;
} ps_wire_grad_out;

/* A PushRequest to encode. With step_width > 0 the step is always written,
 * as a varint of exactly that many bytes (ps_wire_put_varint_fixed), at
 * offset ps_wire_push_step_at() of the message. */
typedef struct ps_wire_push_out {
    uint32_t worker;
    uint64_t step;
    int step_width;
    const ps_wire_grad_out *grads;
    size_t ngrads;
    bool return_values;
    bool delta;       /* PushRequest.delta */
    int wire_dtype;   /* PushRequest.wire_dtype, below 128; 0: not sent */
} ps_wire_push_out;

/* The encoded length; the message written at p (returns its end). A
 * gradient with data NULL is written up to its data's tag and length, and
 * its nbytes are left for the caller (ps_wire_push_len counts them). */
size_t ps_wire_push_len(const ps_wire_push_out *m);
uint8_t *ps_wire_push_put(uint8_t *p, const ps_wire_push_out *m);
size_t ps_wire_push_step_at(const ps_wire_push_out *m);

/* ---- SparsePullRequest / SparsePushRequest ----------------------------------- */

/* One decoded SparsePullItem or SparseGradient: its name (g.name,
 * g.name_len) and, for a gradient, its tensor (g.dtype, g.shape, g.data
 * over the request's bytes, g.shm, g.has_tensor), for a pull item the
 * answer's dtype (g.dtype, 0 when absent), and for both its next_ids (the
 * hint of the client's next call of the table); the ids decoded into the
 * request's arrays (repeated int64, packed or not). */
typedef struct ps_wire_sparse_item {
    ps_wire_grad g;
    const int64_t *ids;    /* (nids), in the request's ids array */
    size_t nids;
    size_t ids_at;         /* where they start in that array */
    const int64_t *next_ids; /* (nnext), in the request's next array */
    size_t nnext;
    size_t next_at;
} ps_wire_sparse_item;

/* A decoded SparsePullRequest (items) or SparsePushRequest (worker, step,
 * grads as items, return_values). Its arrays are reused from decode to
 * decode; ps_wire_sparse_free releases them. */
typedef struct ps_wire_sparse {
    uint32_t worker;
    uint64_t step;
    int return_values;
    int wire_dtype;        /* SparsePushRequest.wire_dtype (0: unset, FLOAT32) */
    ps_wire_sparse_item *items;
    size_t nitems, cap;
    int64_t *ids;          /* every item's ids, one after the other */
    size_t nids, idcap;
    int64_t *next;         /* every item's next_ids, the same way */
    size_t nnext, nextcap;
    struct ps_piece one;
} ps_wire_sparse;

/* Decode a SparsePullRequest (push false) or a SparsePushRequest in buf,
 * which must outlive req's use: a gradient's bytes are not copied. Returns
 * 0, PS_EPARSE with one line in err, or -ENOMEM. */
int ps_wire_sparse_decode(const uint8_t *buf, size_t len, bool push, ps_wire_sparse *req,
                          char *err, size_t errlen);
void ps_wire_sparse_free(ps_wire_sparse *req);

/* ---- PullResponse / PushResponse ------------------------------------------ */

/* The bytes of one VariableValue up to its data: values' tag (field 1 of a
 * PullResponse, 2 of a PushResponse) and length, name, version, the value's
 * tag and length, dtype FLOAT32, the shape, and then the data's tag and
 * length (nbytes of data follow, the caller's), or with into the ShmRef
 * saying where the bytes were written instead. Writes at most
 * PS_WIRE_VALUE_HDR_MAX bytes for a name of up to 255 and 8 dimensions;
 * returns the end. */
uint8_t *ps_wire_value_header(uint8_t *p, int field, const char *name,
                              uint64_t version, const int64_t *shape, int ndim,
                              size_t nbytes, const ps_wire_shm_ref *into);
/* The same with Tensor.dtype `dtype` (a ps.v1.DType below 128). */
uint8_t *ps_wire_value_header_dtype(uint8_t *p, int field, const char *name,
                                    uint64_t version, const int64_t *shape, int ndim,
                                    size_t nbytes, const ps_wire_shm_ref *into,
                                    int dtype);

/* PushResponse.versions, packed: its encoded length (at most 11 + 10 n)
 * and the field written at p (returns the end). */
size_t ps_wire_versions_len(const uint64_t *versions, size_t n);
uint8_t *ps_wire_versions_put(uint8_t *p, const uint64_t *versions, size_t n);

/* One VariableValue as the decoder walks it. */
typedef struct ps_wire_value {
    size_t index;          /* its position among the values */
    char name[256];
    size_t name_len;
    uint64_t version;
    int dtype;             /* Tensor.dtype when met before its data; 0: absent */
    ps_wire_bytes data;    /* PS_WIRE_DATA: Tensor.data */
    ps_wire_shm_ref shm;   /* PS_WIRE_SHM: Tensor.shm */
} ps_wire_value;

/* What the decoder tells its callback: a value's Tensor.data (v->data; the
 * callback may read it), its Tensor.shm (v->shm), or the end of the value
 * (name and version complete). Each comes as it is met on the wire. */
enum ps_wire_event { PS_WIRE_DATA, PS_WIRE_SHM, PS_WIRE_END };

/* Returns 0 to go on, or an error code (the callback wrote err) that stops
 * the decoder and is returned. */
typedef int (*ps_wire_value_fn)(void *ctx, enum ps_wire_event ev,
                                ps_wire_value *v, char *err, size_t errlen);

/* Walks a PullResponse (push false) or a PushResponse (push true) in
 * pieces[0..np), which must hold exactly nvalues values (and for a
 * PushResponse nversions versions, stored in versions[]), calling fn as it
 * goes. Returns 0, fn's code, or PS_EPARSE with one line in err ("Pull:
 * the response does not parse", "Push: 2 versions for 3 gradients", ...). */
int ps_wire_values_decode(const struct ps_piece *pieces, int np, bool push,
                          size_t nvalues, uint64_t *versions, size_t nversions,
                          ps_wire_value_fn fn, void *ctx, char *err, size_t errlen);

/* ---- strings with a NUL byte ---------------------------------------------- */

/* protobuf-c unpacks a string field into a NUL-terminated char * and drops
 * its length, so a name "a\0b" on the wire arrives as "a". This walks the
 * bytes buf[0..len) of a message of type d, sub-messages included, for the
 * first string field whose bytes hold a NUL. Returns 0 when none does (and
 * for bytes that do not parse: the unpacker refuses those), or 1 with the
 * field's path in where ("spec.name", "items[1].name") and the NUL's offset
 * in that string in *at. Call it on a request before or after unpacking it;
 * the bytes must be the ones unpacked. */
int ps_wire_pb_nul(const uint8_t *buf, size_t len, const ProtobufCMessageDescriptor *d,
                   char *where, size_t wherelen, size_t *at);

#endif
