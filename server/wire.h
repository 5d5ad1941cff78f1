/*
 * wire.h - the zero-copy decoder of the hot path's request, PushRequest.
 *
 * protobuf-c's unpack copies every bytes field into fresh memory, which for
 * a 4 MiB gradient costs more than the optimizer that consumes it. This
 * decoder walks the protobuf wire format of ps.v1.PushRequest (see
 * proto/ps.proto) and returns pointers into the caller's buffer. Every other
 * request is small and goes through protobuf-c.
 *
 * Threads and lifetime: psd_push_req is the caller's; the name and data
 * pointers in it borrow from the decoded buffer and are valid as long as it
 * is. psd_push_req_free releases only the grads array.
 */
#ifndef PSD_WIRE_H
#define PSD_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define PSD_MAX_DIMS 8

typedef struct psd_wire_grad {
    const char *name;      /* not NUL-terminated */
    size_t name_len;
    int dtype;             /* ps.v1.DType value; 0 when absent */
    int64_t shape[PSD_MAX_DIMS];
    int ndim;              /* -1: more than PSD_MAX_DIMS dimensions */
    const uint8_t *data;   /* may be unaligned */
    size_t nbytes;
    int has_tensor;        /* the grad field was present */
} psd_wire_grad;

typedef struct psd_push_req {
    uint32_t worker;
    uint64_t step;
    psd_wire_grad *grads;  /* ngrads entries; reused across decodes */
    size_t ngrads;
    size_t cap;
} psd_push_req;

/* Decodes buf into req (reusing req->grads). Returns 0, PS_EPARSE with one
 * line in err saying where the bytes stop making sense, or -ENOMEM. Unknown
 * fields are skipped, as protobuf requires. */
int psd_push_decode(const uint8_t *buf, size_t len, psd_push_req *req,
                    char *err, size_t errlen);
void psd_push_req_free(psd_push_req *req);

#endif
