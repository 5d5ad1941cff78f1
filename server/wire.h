/*
 * wire.h - the zero-copy decoder of the hot path's request, PushRequest.
 *
 * protobuf-c's unpack copies every bytes field into fresh memory, which for
 * a 4 MiB gradient costs more than the optimizer that consumes it. This
 * decoder walks the protobuf wire format of ps.v1.PushRequest (see
 * proto/ps.proto) in the pieces gRPC received it in, and returns each
 * gradient's bytes as a cursor over those pieces: the optimizer reads them
 * where they landed, with no copy into one buffer first. Every other request
 * is small and goes through protobuf-c.
 *
 * Threads and lifetime: psd_push_req is the caller's; the data cursors in it
 * borrow the pieces (array and bytes) and are valid as long as they are.
 * psd_push_req_free releases only the grads array.
 */
#ifndef PSD_WIRE_H
#define PSD_WIRE_H

#include "pbcur.h"
#include "shmmap.h"

#include <stddef.h>
#include <stdint.h>

#define PSD_MAX_DIMS 8
#define PSD_WIRE_MAX_NAME 255

typedef struct psd_wire_grad {
    char name[PSD_WIRE_MAX_NAME + 1]; /* the first 255 bytes, NUL-terminated */
    size_t name_len;       /* the name's length on the wire */
    int dtype;             /* ps.v1.DType value; 0 when absent */
    int64_t shape[PSD_MAX_DIMS];
    int ndim;              /* -1: more than PSD_MAX_DIMS dimensions */
    ps_pbcur data;         /* the tensor's bytes, in pieces (any alignment) */
    size_t nbytes;
    int has_tensor;        /* the grad field was present */
    int has_data;          /* Tensor.data was present */
    psd_shm_ref shm;       /* Tensor.shm: the bytes are in shared memory */
    psd_shm_ref value_into;/* Gradient.value_into */
    struct ps_piece shm_piece; /* the caller's: data over shared memory */
} psd_wire_grad;

typedef struct psd_push_req {
    uint32_t worker;
    uint64_t step;
    int return_values;     /* answer with the values too */
    psd_wire_grad *grads;  /* ngrads entries; reused across decodes */
    size_t ngrads;
    size_t cap;
    struct ps_piece one;   /* psd_push_decode_buf's one piece */
} psd_push_req;

/* Decodes the message in pieces[0..np) into req (reusing req->grads).
 * Returns 0, PS_EPARSE with one line in err saying where the bytes stop
 * making sense, or -ENOMEM. Unknown fields are skipped, as protobuf
 * requires. */
int psd_push_decode(const struct ps_piece *pieces, int np, psd_push_req *req,
                    char *err, size_t errlen);
/* The same for a message in one buffer (which must outlive req's use). */
int psd_push_decode_buf(const uint8_t *buf, size_t len, psd_push_req *req,
                        char *err, size_t errlen);
void psd_push_req_free(psd_push_req *req);

#endif
