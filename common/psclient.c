#include "common/psclient.h"

#include "common/buf.h"
#include "common/errors.h"
#include "common/half.h"
#include "common/hostid.h"
#include "common/log.h"
#include "proto/ps.pb-c.h"
#include "common/shm.h"
#include "common/thread.h"
#include "common/wire.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A plain-memory gradient at least this big is not copied into a part of
 * its own (fresh memory) but makes the request one pooled buffer. */
#define PLAIN_COPY_MAX ((size_t)256 << 10)

/* Tensors of more than this many bytes go in pieces of it
 * (ps_client_set_pieces): on a 10 Gbit/s link a 1 MiB piece is
 * about 1 ms on the wire (0.5 ms in bf16), long beside what a call costs
 * each end (measured on loopback: 512 KiB pieces took the client 0.66 ms
 * more CPU per 4 MiB than one call, 1 MiB pieces 0.23 ms), and short enough
 * that a 4 MiB tensor is 4 pieces whose phases overlap. */
#define PIECE_BYTES_DEFAULT ((size_t)1 << 20)
/* Two calls not yet answered at once: one on the link while the next is
 * made and the one before applied. gRPC buffers a message whole once its
 * call starts and interleaves the streams of one connection, so more
 * pieces at once share the link and all end late (traced on the link: 4
 * pieces of a push answered after 1.8, 7.0, 7.2 and 7.8 ms; 2 at a time
 * after 2.1, 3.4, 4.7 and 4.8 ms). */
#define PIECE_WINDOW_DEFAULT 2
/* The most calls one push or pull is cut into: bigger tensors get bigger
 * pieces, so that the calls' own cost (about 0.1 ms of CPU each end) stays
 * small beside the tensor's. */
#define MAX_PIECES 64

struct ps_client {
    ps_rpc_client *rpc;
    char *address;
    ps_buf req;   /* encoded requests, reused */
    const ps_shm *shm; /* tensors in it go by reference (ps_client_set_shm) */
    bool shm_off;      /* psd could not map it: inline from then on */
    bool delta;        /* pushes carry PushRequest.delta (ps_client_set_delta) */
    int wire;          /* 2, 3: half on the wire (ps_client_set_wire_dtype); 0 */
    bool feedback;     /* keep each variable's rounding residual */
    struct residual *res; /* (nres), by variable name */
    size_t nres;
    ps_buf half;       /* the half gradients of one push */
    size_t piece_bytes; /* tensors bigger go in pieces of it; 0: never */
    int piece_window;   /* pieces not yet answered at once */
    struct ahead *ahead; /* rounds a half push's pieces ahead; NULL: not yet */
};

/* One piece of a tensor: the caller's item's elements [off, off + n) of
 * its total; n 0 stands for the call that carries the small items whole. */
struct piece {
    size_t item, off, n, total;
};

static bool by_ref(const ps_client *c, const float *p, size_t n, uint64_t *off);
static int push_pieces(ps_client *c, uint32_t worker, uint64_t step,
                       ps_client_item *items, ps_client_item *pulls, size_t n,
                       int deadline_ms, ps_rpc_status *st);
static int pull_pieces(ps_client *c, uint32_t worker, uint64_t step,
                       ps_client_item *items, size_t n, int deadline_ms,
                       ps_rpc_status *st);

int ps_client_set_pieces(ps_client *c, size_t piece_bytes, int window)
{
    if (window < 1 || window > 64 || (piece_bytes != 0 && piece_bytes < 4096))
        return PS_EINVAL_ARG;
    c->piece_bytes = piece_bytes;
    c->piece_window = window;
    return 0;
}

/* Whether item it goes in pieces: bigger than a piece, not by reference. */
static bool in_pieces(const ps_client *c, const ps_client_item *it)
{
    uint64_t off;
    return c->piece_bytes != 0 && it->n * sizeof(float) > c->piece_bytes &&
           !by_ref(c, it->data, it->n, &off);
}

/* Whether a push or pull of items goes in pieces: some are big, and few
 * enough that the calls stay within MAX_PIECES (else one call, as before). */
static bool cut_any(const ps_client *c, const ps_client_item *items, size_t n)
{
    size_t nbig = 0;
    for (size_t i = 0; i < n; i++)
        nbig += in_pieces(c, &items[i]);
    return nbig > 0 && nbig <= MAX_PIECES / 2;
}

/* Error feedback's memory of one variable: what its last rounding lost. */
struct residual {
    char *name;
    float *r; /* (n) */
    size_t n;
};

int ps_client_set_wire_dtype(ps_client *c, int dtype, bool error_feedback)
{
    if (dtype != 0 && dtype != PS__V1__DTYPE__DTYPE_FLOAT32 &&
        dtype != PS_HALF_F16 && dtype != PS_HALF_BF16)
        return PS_EINVAL_ARG;
    c->wire = dtype == PS_HALF_F16 || dtype == PS_HALF_BF16 ? dtype : 0;
    c->feedback = error_feedback;
    return 0;
}

/* The residual of variable name (n elements), made zero on first use or
 * when its size changed; NULL when out of memory. */
static float *residual_of(ps_client *c, const char *name, size_t n)
{
    for (size_t i = 0; i < c->nres; i++) {
        struct residual *e = &c->res[i];
        if (strcmp(e->name, name) != 0)
            continue;
        if (e->n != n) {
            float *r = calloc(n ? n : 1, sizeof *r);
            if (r == NULL)
                return NULL;
            free(e->r);
            e->r = r;
            e->n = n;
        }
        return e->r;
    }
    struct residual *grown = realloc(c->res, (c->nres + 1) * sizeof *grown);
    if (grown == NULL)
        return NULL;
    c->res = grown;
    struct residual *e = &c->res[c->nres];
    e->name = strdup(name);
    e->r = calloc(n ? n : 1, sizeof *e->r);
    e->n = n;
    if (e->name == NULL || e->r == NULL) {
        free(e->name);
        free(e->r);
        return NULL;
    }
    c->nres++;
    return e->r;
}

int ps_client_residual(const ps_client *c, const char *name, const float **r,
                       size_t *n)
{
    for (size_t i = 0; i < c->nres; i++)
        if (strcmp(c->res[i].name, name) == 0) {
            *r = c->res[i].r;
            *n = c->res[i].n;
            return 0;
        }
    return PS_ENOTFOUND;
}

/* Whether psd applied, or may have applied, a push call that ended with
 * status code (-1: never sent). Its answer OK says so; a call whose answer
 * never came (its deadline passed, it was cancelled, the status is
 * UNKNOWN) reached psd or may have, and psd applies what it has received
 * whatever the client's deadline (a SYNC push waiting for its step keeps
 * its gradients in the step): giving it back to the residual would apply
 * it twice. Not applied: a refusal, which changes nothing, and
 * UNAVAILABLE, which the client's retries take as not received (they send
 * the call again). */
static bool push_call_applied(int code)
{
    return code == PS_RPC_OK || code == PS_RPC_DEADLINE_EXCEEDED ||
           code == PS_RPC_CANCELLED || code == PS_RPC_UNKNOWN;
}

/* How many gradients of a refused call psd applied before the one it
 * refused, as its message says (PS_WIRE_APPLIED_BEFORE); 0 when it does
 * not say. */
static size_t applied_before(const ps_rpc_status *st)
{
    const char *p = strstr(st->message, PS_WIRE_APPLIED_BEFORE);
    size_t i = 0;
    if (p == NULL || sscanf(p + strlen(PS_WIRE_APPLIED_BEFORE), "%zu]", &i) != 1)
        return 0;
    return i;
}

/* Gives back to the residual r (n elements) what a push did not deliver
 * of gradient g: its half rounding h (in a message, 2 bytes an element,
 * any alignment), widened, since r + float(h) is exactly the g + r the
 * rounding started from (x - half(x) is exact in float32); or, h NULL, g
 * itself, never rounded. After it r holds all that is owed to psd. */
static void feedback_restore(int wire, float *r, const float *g, const uint8_t *h,
                             size_t n)
{
    if (h == NULL) {
        for (size_t i = 0; i < n; i++)
            r[i] += g[i];
        return;
    }
    uint16_t chunk[1024];
    float w[1024];
    for (size_t i = 0; i < n;) {
        size_t k = n - i < 1024 ? n - i : 1024;
        memcpy(chunk, h + 2 * i, k * 2);
        ps_half_to_f32(wire, chunk, w, k);
        for (size_t q = 0; q < k; q++)
            r[i + q] += w[q];
        i += k;
    }
}

/* The fields written after the gradients, two bytes each: return_values
 * (4) and delta (5). */
enum { TAIL_RETURN_VALUES = 1, TAIL_DELTA = 2 };

static size_t tail_len(unsigned tail)
{
    return (tail & TAIL_RETURN_VALUES ? 2 : 0) + (tail & TAIL_DELTA ? 2 : 0);
}

static uint8_t *put_tail(uint8_t *p, unsigned tail)
{
    if (tail & TAIL_RETURN_VALUES) {
        *p++ = (4 << 3) | 0;
        *p++ = 1;
    }
    if (tail & TAIL_DELTA) {
        *p++ = (5 << 3) | 0;
        *p++ = 1;
    }
    return p;
}

void ps_client_set_delta(ps_client *c, bool delta)
{
    c->delta = delta;
}

void ps_client_set_shm(ps_client *c, const ps_shm *shm)
{
    c->shm = shm;
    c->shm_off = false;
}

bool ps_client_shm_active(const ps_client *c)
{
    return c->shm != NULL && !c->shm_off;
}

/* Whether n floats at p go by reference; *off is then their offset. */
static bool by_ref(const ps_client *c, const float *p, size_t n, uint64_t *off)
{
    return ps_client_shm_active(c) && n > 0 &&
           ps_shm_contains(c->shm, p, n * sizeof(float), off);
}

/* A call that failed because psd cannot map the shared memory: the client
 * goes on without it (the call changed nothing; the caller repeats it). */
static bool shm_refused(ps_client *c, int rc, const ps_rpc_status *st)
{
    if (rc != PS_ERPC || st == NULL ||
        (st->code != PS_RPC_FAILED_PRECONDITION &&
         st->code != PS_RPC_PERMISSION_DENIED) ||
        strstr(st->message, "shared memory") == NULL)
        return false;
    /* Said once per process (each session and connection finds out). */
    static atomic_bool said;
    if (!atomic_exchange(&said, true))
        ps_log_warn("psd at %s cannot use this process's shared memory; sending "
                    "tensors inline (%s)", c->address, st->message);
    else
        ps_log_info("psd at %s cannot use this process's shared memory: %s",
                    c->address, st->message);
    c->shm_off = true;
    return true;
}

static size_t shmref_len(const ps_shm *m, uint64_t off, uint64_t len)
{
    return ps_wire_shm_ref_len(ps_shm_name(m), off, len);
}

static uint8_t *put_shmref(uint8_t *p, int field, const ps_shm *m, uint64_t off,
                           uint64_t len)
{
    return ps_wire_shm_ref_put(p, field, ps_shm_name(m), off, len);
}

static size_t field_len(size_t len)
{
    return 1 + ps_wire_varint_len(len) + len;
}

static void ahead_destroy(struct ahead *a);

void ps_client_destroy(ps_client *c)
{
    if (c == NULL)
        return;
    ahead_destroy(c->ahead);
    ps_rpc_client_destroy(c->rpc);
    ps_buf_free(&c->req);
    ps_buf_free(&c->half);
    for (size_t i = 0; i < c->nres; i++) {
        free(c->res[i].name);
        free(c->res[i].r);
    }
    free(c->res);
    free(c->address);
    free(c);
}

int ps_client_create(const char *address, const ps_rpc_client_opts *opts,
                     ps_client **out)
{
    ps_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -ENOMEM;
    c->address = strdup(address);
    c->piece_bytes = PIECE_BYTES_DEFAULT;
    c->piece_window = PIECE_WINDOW_DEFAULT;
    int rc = c->address ? ps_rpc_client_create(address, opts, &c->rpc) : -ENOMEM;
    if (rc != 0) {
        ps_client_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* Asks the psd at address (a TCP address of this host) for its local
 * socket; copies it into out when this process is to use it, else sets
 * why. Returns 0 or -ENAMETOOLONG. */
static int stats_route(const char *address, const ps_rpc_client_opts *opts,
                       int deadline_ms, char *out, size_t outlen, char *why,
                       size_t whylen)
{
    ps_rpc_client *rpc = NULL;
    ps_rpc_status st = {0};
    void *resp = NULL;
    Ps__V1__StatsRequest req = PS__V1__STATS_REQUEST__INIT;
    int rc = ps_rpc_client_create(address, opts, &rpc);
    if (rc == 0)
        rc = ps_rpc_invoke_pb(rpc, "/ps.v1.ParameterServer/Stats", &req,
                              &ps__v1__stats_response__descriptor, &resp,
                              deadline_ms, &st);
    ps_rpc_client_destroy(rpc);
    if (rc == PS_ERPC) {
        snprintf(why, whylen, "Stats: %s: %s", ps_rpc_code_name(st.code), st.message);
        return 0;
    }
    if (rc != 0) {
        snprintf(why, whylen, "Stats: %s", ps_strerror(rc));
        return 0;
    }
    Ps__V1__StatsResponse *r = resp;
    char mine[PS_HOST_ID_MAX];
    if (ps_host_id(mine, sizeof mine) != 0)
        mine[0] = '\0';
    rc = 0;
    if (r->local_address == NULL || r->local_address[0] == '\0') {
        snprintf(why, whylen, "psd advertises no local socket (--local-socket off)");
    } else if (ps_host_use_local(mine, r->host_id, r->local_address, why, whylen)) {
        int n = snprintf(out, outlen, "%s", r->local_address);
        rc = n < 0 || (size_t)n >= outlen ? -ENAMETOOLONG : 0;
    }
    ps__v1__stats_response__free_unpacked(r, NULL);
    return rc;
}

int ps_client_local_route(const char *address, const ps_rpc_client_opts *opts,
                          int deadline_ms, char *out, size_t outlen, char *why,
                          size_t whylen)
{
    why[0] = '\0';
    if (strncmp(address, "unix:", 5) != 0) {
        if (!ps_shm_target_is_local(address))
            snprintf(why, whylen, "another host");
        else if (stats_route(address, opts, deadline_ms, out, outlen, why,
                             whylen) != 0)
            return -ENAMETOOLONG;
        if (why[0] == '\0')
            return 0; /* out is the socket */
    }
    int n = snprintf(out, outlen, "%s", address);
    return n < 0 || (size_t)n >= outlen ? -ENAMETOOLONG : 0;
}

const char *ps_client_address(const ps_client *c)
{
    return c->address;
}

ps_rpc_client *ps_client_rpc(ps_client *c)
{
    return c->rpc;
}

int ps_client_create_variable(ps_client *c, const void *spec, int *created,
                              uint64_t *version, int deadline_ms,
                              ps_rpc_status *st)
{
    Ps__V1__CreateVariableRequest req = PS__V1__CREATE_VARIABLE_REQUEST__INIT;
    req.spec = (Ps__V1__VariableSpec *)spec;
    void *resp = NULL;
    int rc = ps_rpc_invoke_pb(c->rpc, "/ps.v1.ParameterServer/CreateVariable",
                              &req, &ps__v1__create_variable_response__descriptor,
                              &resp, deadline_ms, st);
    if (rc != 0)
        return rc;
    Ps__V1__CreateVariableResponse *r = resp;
    if (created)
        *created = r->created;
    if (version)
        *version = r->version;
    ps__v1__create_variable_response__free_unpacked(r, NULL);
    return 0;
}

/* ---- protobuf wire format, by hand ------------------------------------ */

/* The layout of one Gradient field. psd's optimizer wants each gradient's
 * floats 4-byte aligned in the request; the dtype varint is padded with
 * overlong (still valid) encodings of its value so that they are, given the
 * offset `off` at which the field starts. */
struct grad_layout {
    size_t pad;        /* extra dtype varint bytes */
    size_t shape_len;  /* packed shape bytes */
    size_t tl, gl;     /* Tensor and Gradient lengths */
    size_t total;      /* the whole field, tag and length included */
};

static void layout(const ps_client_item *it, size_t off, struct grad_layout *L)
{
    size_t nl = strlen(it->name), bytes = it->n * sizeof(float);
    size_t sl = 0;
    for (int d = 0; d < it->ndim; d++)
        sl += ps_wire_varint_len((uint64_t)it->shape[d]);
    size_t shape_part = it->ndim > 0 ? 1 + ps_wire_varint_len(sl) + sl : 0;
    for (size_t pad = 0; pad < 8; pad++) {
        size_t tl = 1 + (1 + pad) + shape_part + 1 + ps_wire_varint_len(bytes) + bytes;
        size_t gl = 1 + ps_wire_varint_len(nl) + nl + 1 + ps_wire_varint_len(tl) + tl;
        size_t data_off = off + 1 + ps_wire_varint_len(gl) + 1 + ps_wire_varint_len(nl) + nl + 1 +
                          ps_wire_varint_len(tl) + tl - bytes;
        *L = (struct grad_layout){pad, sl, tl, gl, 1 + ps_wire_varint_len(gl) + gl};
        if (data_off % 4 == 0)
            return;
    }
}

/* With return_values, its field (two bytes) goes last, so that the
 * gradients' offsets do not depend on it. */
static size_t push_len(uint32_t worker, uint64_t step,
                       const ps_client_item *items, size_t n, unsigned tail)
{
    size_t total = 1 + ps_wire_varint_len(worker) + 1 + ps_wire_varint_len(step);
    for (size_t i = 0; i < n; i++) {
        struct grad_layout L;
        layout(&items[i], total, &L);
        total += L.total;
    }
    return total + tail_len(tail);
}

/* Writes the PushRequest at p (push_len bytes); returns its end. With
 * parts, the data of items that have a msg is not written but becomes an
 * in-place part between the header parts written at p (at most 2n + 1
 * parts, *nparts set). */
static uint8_t *push_write(uint8_t *p, uint32_t worker, uint64_t step,
                           const ps_client_item *items, size_t n,
                           unsigned tail, ps_rpc_part *parts, int *nparts)
{
    uint8_t *part_start = p;
    size_t skipped = 0; /* bytes left out of p, for the message offsets */
    int np = 0;
    uint8_t *start = p;
    *p++ = (1 << 3) | 0;
    p = ps_wire_put_varint(p, worker);
    *p++ = (2 << 3) | 0;
    p = ps_wire_put_varint(p, step);
    for (size_t i = 0; i < n; i++) {
        const ps_client_item *it = &items[i];
        struct grad_layout L;
        layout(it, (size_t)(p - start) + skipped, &L);
        size_t nl = strlen(it->name);
        size_t bytes = it->n * sizeof(float);
        *p++ = (3 << 3) | 2;
        p = ps_wire_put_varint(p, L.gl);
        *p++ = (1 << 3) | 2;
        p = ps_wire_put_varint(p, nl);
        memcpy(p, it->name, nl);
        p += nl;
        *p++ = (2 << 3) | 2;
        p = ps_wire_put_varint(p, L.tl);
        *p++ = (1 << 3) | 0;
        /* DTYPE_FLOAT32 (1), overlong by L.pad bytes: 0x81 0x80.. 0x00. */
        if (L.pad == 0) {
            *p++ = PS__V1__DTYPE__DTYPE_FLOAT32;
        } else {
            *p++ = 0x80 | PS__V1__DTYPE__DTYPE_FLOAT32;
            for (size_t k = 1; k < L.pad; k++)
                *p++ = 0x80;
            *p++ = 0x00;
        }
        if (it->ndim > 0) {
            *p++ = (2 << 3) | 2;
            p = ps_wire_put_varint(p, L.shape_len);
            for (int d = 0; d < it->ndim; d++)
                p = ps_wire_put_varint(p, (uint64_t)it->shape[d]);
        }
        *p++ = (3 << 3) | 2;
        p = ps_wire_put_varint(p, bytes);
        if (parts != NULL && it->msg != NULL && bytes > 0) {
            parts[np++] = (ps_rpc_part){part_start, (size_t)(p - part_start), NULL, NULL};
            parts[np++] = (ps_rpc_part){it->data, bytes, ps_rpc_msg_release, it->msg};
            part_start = p;
            skipped += bytes;
            continue;
        }
        memcpy(p, it->data, bytes);
        p += bytes;
    }
    p = put_tail(p, tail);
    if (parts != NULL) {
        if (p > part_start)
            parts[np++] = (ps_rpc_part){part_start, (size_t)(p - part_start), NULL, NULL};
        *nparts = np;
    }
    return p;
}

int ps_push_encode(ps_buf *b, uint32_t worker, uint64_t step,
                   const ps_client_item *items, size_t n)
{
    int rc = ps_buf_reserve(b, push_len(worker, step, items, n, 0));
    if (rc != 0)
        return rc;
    b->len = (size_t)(push_write(b->data, worker, step, items, n, 0, NULL,
                                 NULL) - b->data);
    return 0;
}

/* What decode_pieces expects: n values copied into items, and for a
 * PushResponse (versions not NULL) nversions versions. */
struct pull_ctx {
    const ps_client *c;      /* for values written into its shared memory */
    ps_client_item *items;
    size_t n;
    uint64_t *versions;
    size_t nversions;
    char *err;
    size_t errlen;
    bool have_data;          /* the value being decoded has had its data */
    /* A piece's answer (items[0] a view of it): whole is the whole value's
     * item, which the answer may hold instead (a SYNC step's last piece
     * brings the whole value once the step is applied), and *final says it
     * came, after which a piece's value, older, is skipped. */
    ps_client_item *whole;
    bool *final;
};

static int decode_pieces(void *ctx, const struct ps_piece *pieces, int np);

/* The Tensor of a pushed item: inline bytes, or a reference. */
static size_t shm_tensor_len(const ps_client *c, const ps_client_item *it)
{
    uint64_t off;
    size_t sl = 0, bytes = it->n * sizeof(float);
    for (int d = 0; d < it->ndim; d++)
        sl += ps_wire_varint_len((uint64_t)it->shape[d]);
    size_t tl = 2 + (it->ndim > 0 ? field_len(sl) : 0);
    if (by_ref(c, it->data, it->n, &off))
        return tl + field_len(shmref_len(c->shm, off, bytes));
    return tl + field_len(bytes);
}

static size_t shm_grad_len(const ps_client *c, const ps_client_item *it,
                           const ps_client_item *pull)
{
    uint64_t off;
    size_t gl = field_len(strlen(it->name)) + field_len(shm_tensor_len(c, it));
    if (pull != NULL && by_ref(c, pull->data, pull->n, &off))
        gl += field_len(shmref_len(c->shm, off, pull->n * sizeof(float)));
    return gl;
}

/* A PushRequest whose tensors in shared memory go by reference (and, with
 * pulls, whose values are asked into it): a few hundred bytes. */
static int push_encode_shm(ps_client *c, uint32_t worker, uint64_t step,
                           const ps_client_item *items, const ps_client_item *pulls,
                           size_t n, ps_rpc_msg **out)
{
    unsigned tail = (pulls ? TAIL_RETURN_VALUES : 0) | (c->delta ? TAIL_DELTA : 0);
    size_t total = 1 + ps_wire_varint_len(worker) + 1 + ps_wire_varint_len(step) +
                   tail_len(tail);
    for (size_t i = 0; i < n; i++)
        total += field_len(shm_grad_len(c, &items[i], pulls ? &pulls[i] : NULL));
    ps_rpc_msg *m = ps_rpc_msg_new(total);
    if (m == NULL)
        return -ENOMEM;
    uint8_t *p = ps_rpc_msg_data(m);
    *p++ = (1 << 3) | 0;
    p = ps_wire_put_varint(p, worker);
    *p++ = (2 << 3) | 0;
    p = ps_wire_put_varint(p, step);
    for (size_t i = 0; i < n; i++) {
        const ps_client_item *it = &items[i];
        size_t nl = strlen(it->name), bytes = it->n * sizeof(float), sl = 0;
        uint64_t off;
        *p++ = (3 << 3) | 2;
        p = ps_wire_put_varint(p, shm_grad_len(c, it, pulls ? &pulls[i] : NULL));
        *p++ = (1 << 3) | 2;
        p = ps_wire_put_varint(p, nl);
        memcpy(p, it->name, nl);
        p += nl;
        *p++ = (2 << 3) | 2;
        p = ps_wire_put_varint(p, shm_tensor_len(c, it));
        *p++ = (1 << 3) | 0;
        *p++ = PS__V1__DTYPE__DTYPE_FLOAT32;
        for (int d = 0; d < it->ndim; d++)
            sl += ps_wire_varint_len((uint64_t)it->shape[d]);
        if (it->ndim > 0) {
            *p++ = (2 << 3) | 2;
            p = ps_wire_put_varint(p, sl);
            for (int d = 0; d < it->ndim; d++)
                p = ps_wire_put_varint(p, (uint64_t)it->shape[d]);
        }
        if (by_ref(c, it->data, it->n, &off)) {
            p = put_shmref(p, 4, c->shm, off, bytes);
        } else {
            *p++ = (3 << 3) | 2;
            p = ps_wire_put_varint(p, bytes);
            memcpy(p, it->data, bytes);
            p += bytes;
        }
        if (pulls != NULL && by_ref(c, pulls[i].data, pulls[i].n, &off))
            p = put_shmref(p, 3, c->shm, off, pulls[i].n * sizeof(float));
    }
    p = put_tail(p, tail);
    ps_rpc_msg_set_len(m, (size_t)(p - ps_rpc_msg_data(m)));
    *out = m;
    return 0;
}

/* Whether any of the push's tensors goes through shared memory. */
static bool push_uses_shm(const ps_client *c, const ps_client_item *items,
                          const ps_client_item *pulls, size_t n)
{
    uint64_t off;
    for (size_t i = 0; i < n; i++)
        if (by_ref(c, items[i].data, items[i].n, &off) ||
            (pulls != NULL && by_ref(c, pulls[i].data, pulls[i].n, &off)))
            return true;
    return false;
}

/* A Push of items in the client's half wire dtype into a new message
 * (common/wire.h's encoder): each gradient rounded into c->half, one after
 * the other, with its residual when error feedback is on (*rounded: how
 * many were). Returns 0 or -ENOMEM. */
static int push_encode_half(ps_client *c, uint32_t worker, uint64_t step,
                            const ps_client_item *items, size_t n, bool rv,
                            ps_rpc_msg **out, size_t *rounded)
{
    size_t total = 0;
    *rounded = 0;
    for (size_t i = 0; i < n; i++)
        total += items[i].n;
    ps_wire_grad_out *g = calloc(n ? n : 1, sizeof *g);
    if (g == NULL || ps_buf_reserve(&c->half, total * 2 + 2) != 0) {
        free(g);
        return -ENOMEM;
    }
    uint16_t *h = (uint16_t *)(void *)c->half.data;
    for (size_t i = 0; i < n; i++) {
        const ps_client_item *it = &items[i];
        float *r = c->feedback ? residual_of(c, it->name, it->n) : NULL;
        if (c->feedback && r == NULL) {
            free(g);
            return -ENOMEM;
        }
        ps_half_encode_ef(c->wire, it->data, r, h, it->n);
        *rounded = i + 1;
        g[i] = (ps_wire_grad_out){.name = it->name, .dtype = c->wire,
                                  .shape = it->shape, .ndim = it->shape ? it->ndim : 0,
                                  .data = h, .nbytes = it->n * 2};
        h += it->n;
    }
    ps_wire_push_out m = {.worker = worker, .step = step, .grads = g, .ngrads = n,
                          .return_values = rv, .delta = c->delta,
                          .wire_dtype = c->wire};
    size_t len = ps_wire_push_len(&m);
    ps_rpc_msg *msg = ps_rpc_msg_new(len);
    if (msg != NULL) {
        uint8_t *end = ps_wire_push_put(ps_rpc_msg_data(msg), &m);
        ps_rpc_msg_set_len(msg, (size_t)(end - ps_rpc_msg_data(msg)));
    }
    free(g);
    *out = msg;
    return msg != NULL ? 0 : -ENOMEM;
}

/* After a whole half push with error feedback that failed (rc, st):
 * gives the gradients psd did not apply back to their residuals, from
 * their roundings still in c->half (the first `rounded` items were; the
 * others' gradients as they are). */
static void whole_restore(ps_client *c, const ps_client_item *items, size_t n,
                          size_t rounded, int rc, const ps_rpc_status *st)
{
    /* An answer that came OK but did not decode was applied. */
    if (rc == PS_ESHAPE || rc == PS_EPARSE ||
        (rc == PS_ERPC && push_call_applied(st->code)))
        return;
    size_t from = rc == PS_ERPC ? applied_before(st) : 0;
    const uint8_t *h = c->half.data;
    for (size_t i = 0; i < n; i++) {
        float *r = i >= from ? residual_of(c, items[i].name, items[i].n) : NULL;
        if (r != NULL)
            feedback_restore(c->wire, r, items[i].data, i < rounded ? h : NULL,
                             items[i].n);
        h += items[i].n * 2;
    }
}

/* A Push, and with pulls != NULL the values it asks back (see
 * ps_client_push_pull). */
static int push_common(ps_client *c, uint32_t worker, uint64_t step,
                       ps_client_item *items, ps_client_item *pulls, size_t n,
                       int deadline_ms, ps_rpc_status *st)
{
    bool rv = pulls != NULL;
    unsigned tail = (rv ? TAIL_RETURN_VALUES : 0) | (c->delta ? TAIL_DELTA : 0);
    /* Gradients in message buffers go out in place, between small header
     * parts; a big one in plain memory makes the whole request one pooled
     * buffer that gRPC sends from (one copy, into warm memory). */
    size_t len = push_len(worker, step, items, n, tail), in_place = 0;
    bool big_plain = false;
    for (size_t i = 0; i < n; i++) {
        size_t bytes = items[i].n * sizeof(float);
        if (items[i].msg != NULL)
            in_place += bytes;
        else if (bytes >= PLAIN_COPY_MAX)
            big_plain = true;
    }
    uint64_t *versions = calloc(n ? n : 1, sizeof *versions);
    if (versions == NULL)
        return -ENOMEM;
    char err[256] = "";
    struct pull_ctx pc = {c, pulls, rv ? n : 0, versions, n, err, sizeof err, false,
                          NULL, NULL};
    ps_rpc_status local;
    if (st == NULL)
        st = &local; /* error feedback reads what the call came to */
    int rc;
again:;
    bool shm = push_uses_shm(c, items, pulls, n);
    if (!shm && cut_any(c, items, n)) {
        free(versions);
        return push_pieces(c, worker, step, items, pulls, n, deadline_ms, st);
    }
    if (shm || c->wire != 0) {
        /* Shared memory, else half precision: a message encoded whole. */
        ps_rpc_msg *m = NULL;
        size_t rounded = 0;
        rc = shm ? push_encode_shm(c, worker, step, items, pulls, n, &m)
                 : push_encode_half(c, worker, step, items, n, rv, &m, &rounded);
        if (rc == 0) {
            rc = ps_rpc_invoke_msg(c->rpc, "/ps.v1.ParameterServer/Push", m,
                                   decode_pieces, &pc, deadline_ms, st);
            ps_rpc_msg_unref(m);
            if (shm && shm_refused(c, rc, st))
                goto again;
        }
        if (rc != 0 && !shm && c->feedback)
            whole_restore(c, items, n, rounded, rc, st);
    } else if (in_place > 0 && !big_plain) {
        ps_rpc_part *parts = malloc((2 * n + 1) * sizeof *parts);
        rc = parts ? ps_buf_reserve(&c->req, len - in_place) : -ENOMEM;
        if (rc == 0) {
            int np = 0;
            push_write(c->req.data, worker, step, items, n, tail, parts, &np);
            rc = ps_rpc_invoke_parts(c->rpc, "/ps.v1.ParameterServer/Push", parts,
                                     np, decode_pieces, &pc, deadline_ms, st);
        }
        free(parts);
    } else {
        ps_rpc_msg *m = ps_rpc_msg_new(len);
        if (m == NULL) {
            rc = -ENOMEM;
        } else {
            uint8_t *end = push_write(ps_rpc_msg_data(m), worker, step, items, n,
                                      tail, NULL, NULL);
            ps_rpc_msg_set_len(m, (size_t)(end - ps_rpc_msg_data(m)));
            rc = ps_rpc_invoke_msg(c->rpc, "/ps.v1.ParameterServer/Push", m,
                                   decode_pieces, &pc, deadline_ms, st);
            ps_rpc_msg_unref(m);
        }
    }
    if (rc == 0)
        for (size_t i = 0; i < n; i++)
            items[i].version = versions[i];
    free(versions);
    if (rc != 0 && rc != PS_ERPC && rc != -ENOMEM && st != NULL) {
        st->code = rc == PS_ESHAPE ? PS_RPC_FAILED_PRECONDITION : PS_RPC_INTERNAL;
        snprintf(st->message, sizeof st->message, "%s", err);
    }
    return rc;
}

int ps_client_push(ps_client *c, uint32_t worker, uint64_t step,
                   ps_client_item *items, size_t n, int deadline_ms,
                   ps_rpc_status *st)
{
    return push_common(c, worker, step, items, NULL, n, deadline_ms, st);
}

int ps_client_push_pull(ps_client *c, uint32_t worker, uint64_t step,
                        ps_client_item *pushes, ps_client_item *pulls, size_t n,
                        int deadline_ms, ps_rpc_status *st)
{
    return push_common(c, worker, step, pushes, pulls, n, deadline_ms, st);
}

/* ---- Pull ------------------------------------------------------------- */

/* A PullItem's contents; pc (NULL: a whole value) the piece it asks. */
static size_t pull_item_len(const ps_client *c, const ps_client_item *it,
                            const struct piece *pc)
{
    uint64_t off;
    size_t il = field_len(strlen(it->name));
    if (pc != NULL)
        il += (pc->off ? 1 + ps_wire_varint_len(pc->off) : 0) + 1 +
              ps_wire_varint_len(pc->n) + 1 + ps_wire_varint_len(pc->total);
    if (it->min_version)
        il += 1 + ps_wire_varint_len(it->min_version);
    if (c != NULL && by_ref(c, it->data, it->n, &off))
        il += field_len(shmref_len(c->shm, off, it->n * sizeof(float)));
    else if (c != NULL && c->wire != 0)
        il += 2; /* PullItem.wire_dtype */
    return il;
}

/* A PullRequest for items into b; with pc (n entries), item i is the
 * piece pc[i] of a value (a view of it, ps_client_item.data and .n the
 * piece's). */
static int encode_pull(const ps_client *c, ps_buf *b, const ps_client_item *items,
                       size_t n, uint32_t worker, uint64_t step, const struct piece *pc)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += field_len(pull_item_len(c, &items[i], pc ? &pc[i] : NULL));
    if (step != 0) /* PullRequest.worker = 2, step = 3 */
        total += 2 + ps_wire_varint_len(worker) + ps_wire_varint_len(step);
    int rc = ps_buf_reserve(b, total ? total : 1);
    if (rc != 0)
        return rc;
    uint8_t *p = b->data;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(items[i].name);
        uint64_t off;
        *p++ = (1 << 3) | 2;
        p = ps_wire_put_varint(p, pull_item_len(c, &items[i], pc ? &pc[i] : NULL));
        *p++ = (1 << 3) | 2;
        p = ps_wire_put_varint(p, nl);
        memcpy(p, items[i].name, nl);
        p += nl;
        if (items[i].min_version) {
            *p++ = (2 << 3) | 0;
            p = ps_wire_put_varint(p, items[i].min_version);
        }
        if (c != NULL && by_ref(c, items[i].data, items[i].n, &off)) {
            p = put_shmref(p, 3, c->shm, off, items[i].n * sizeof(float));
        } else if (c != NULL && c->wire != 0) {
            *p++ = (4 << 3) | 0;
            *p++ = (uint8_t)c->wire;
        }
        if (pc != NULL) { /* PullItem.offset = 5, count = 6, total = 7 */
            if (pc[i].off) {
                *p++ = (5 << 3) | 0;
                p = ps_wire_put_varint(p, pc[i].off);
            }
            *p++ = (6 << 3) | 0;
            p = ps_wire_put_varint(p, pc[i].n);
            *p++ = (7 << 3) | 0;
            p = ps_wire_put_varint(p, pc[i].total);
        }
    }
    if (step != 0) {
        *p++ = (2 << 3) | 0;
        p = ps_wire_put_varint(p, worker);
        *p++ = (3 << 3) | 0;
        p = ps_wire_put_varint(p, step);
    }
    b->len = (size_t)(p - b->data);
    return 0;
}

/* A value sent in half precision, widened into the item's float32 memory
 * in chunks. Returns 0, or -1 with err written when its size is not the
 * item's. */
static int take_half(ps_wire_value *v, ps_client_item *it, char *err, size_t errlen)
{
    if (v->data.left != it->n * 2) {
        snprintf(err, errlen, "variable '%s' has %zu elements on the server, "
                 "the model expects %zu", it->name, v->data.left / 2, it->n);
        return -1;
    }
    uint16_t chunk[2048];
    for (size_t i = 0; i < it->n;) {
        size_t k = it->n - i < 2048 ? it->n - i : 2048;
        ps_wire_bytes_take(&v->data, chunk, k * 2);
        ps_half_to_f32(v->dtype, chunk, it->data + i, k);
        i += k;
    }
    return 0;
}

/* What decode_pieces does with each value as the decoder meets it: checks
 * it against the item in its place and copies its data straight into the
 * caller's block (the one copy). */
static int on_value(void *ctx, enum ps_wire_event ev, ps_wire_value *v, char *err,
                    size_t errlen)
{
    struct pull_ctx *pc = ctx;
    ps_client_item *it = &pc->items[v->index];
    size_t bytes = it->n * sizeof(float);
    uint64_t want;
    if (ev == PS_WIRE_DATA && pc->whole != NULL) {
        size_t esz = v->dtype == PS_HALF_F16 || v->dtype == PS_HALF_BF16 ? 2 : sizeof(float);
        if (v->data.left == pc->whole->n * esz) {
            it = pc->whole;
            bytes = it->n * sizeof(float);
            *pc->final = true;
        } else if (*pc->final) {
            ps_wire_bytes_take(&v->data, NULL, v->data.left);
            pc->have_data = true;
            return 0;
        }
    }
    switch (ev) {
    case PS_WIRE_DATA:
        if (v->dtype == PS_HALF_F16 || v->dtype == PS_HALF_BF16) {
            if (take_half(v, it, err, errlen) != 0)
                return PS_ESHAPE;
            pc->have_data = true;
            return 0;
        }
        if (v->data.left != bytes) {
            snprintf(err, errlen, "variable '%s' has %zu elements on the server, "
                     "the model expects %zu", it->name, v->data.left / sizeof(float),
                     it->n);
            return PS_ESHAPE;
        }
        ps_wire_bytes_take(&v->data, it->data, bytes);
        pc->have_data = true;
        return 0;
    case PS_WIRE_SHM:
        /* psd wrote the value into our shared memory: it must say where we
         * asked. */
        if (pc->c == NULL || pc->c->shm == NULL ||
            !ps_shm_contains(pc->c->shm, it->data, bytes, &want) ||
            strcmp(v->shm.name, ps_shm_name(pc->c->shm)) != 0 ||
            v->shm.offset != want || v->shm.length != bytes) {
            snprintf(err, errlen, "variable '%s': psd wrote the value into shared "
                     "memory not asked for", it->name);
            return PS_EPARSE;
        }
        pc->have_data = true;
        return 0;
    case PS_WIRE_END:
        break;
    }
    bool had = pc->have_data;
    pc->have_data = false;
    if (v->name_len != strlen(it->name) || memcmp(v->name, it->name, v->name_len) != 0) {
        snprintf(err, errlen, "%s: value %zu is '%.*s', expected '%s'",
                 pc->versions ? "Push" : "Pull", v->index, (int)v->name_len, v->name,
                 it->name);
        return PS_EPARSE;
    }
    if (!had && it->n != 0) {
        snprintf(err, errlen, "variable '%s' has 0 elements on the server, the "
                 "model expects %zu", it->name, it->n);
        return PS_ESHAPE;
    }
    it->version = v->version;
    return 0;
}

static int decode_pieces(void *ctx, const struct ps_piece *pieces, int np)
{
    struct pull_ctx *pc = ctx;
    pc->have_data = false;
    return ps_wire_values_decode(pieces, np, pc->versions != NULL, pc->n,
                                 pc->versions, pc->nversions, on_value, pc,
                                 pc->err, pc->errlen);
}

int ps_pull_decode_pieces(const struct ps_piece *pieces, int np,
                          ps_client_item *items, size_t n, char *err, size_t errlen)
{
    struct pull_ctx pc = {NULL, items, n, NULL, 0, err, errlen, false, NULL, NULL};
    return decode_pieces(&pc, pieces, np);
}

int ps_pull_decode(const uint8_t *buf, size_t len, ps_client_item *items,
                   size_t n, char *err, size_t errlen)
{
    struct ps_piece one = {buf, len};
    struct pull_ctx pc = {NULL, items, n, NULL, 0, err, errlen, false, NULL, NULL};
    return decode_pieces(&pc, &one, 1);
}

int ps_client_pull(ps_client *c, ps_client_item *items, size_t n,
                   int deadline_ms, ps_rpc_status *st)
{
    return ps_client_pull_at(c, 0, 0, items, n, deadline_ms, st);
}

int ps_client_pull_at(ps_client *c, uint32_t worker, uint64_t step,
                      ps_client_item *items, size_t n, int deadline_ms,
                      ps_rpc_status *st)
{
    int rc;
    if (cut_any(c, items, n))
        return pull_pieces(c, worker, step, items, n, deadline_ms, st);
again:
    rc = encode_pull(c, &c->req, items, n, worker, step, NULL);
    if (rc != 0)
        return rc;
    char err[256] = "";
    struct pull_ctx pc = {c, items, n, NULL, 0, err, sizeof err, false, NULL, NULL};
    ps_rpc_msg *m = ps_rpc_msg_new(c->req.len);
    if (m == NULL)
        return -ENOMEM;
    memcpy(ps_rpc_msg_data(m), c->req.data, c->req.len);
    ps_rpc_msg_set_len(m, c->req.len);
    rc = ps_rpc_invoke_msg(c->rpc, "/ps.v1.ParameterServer/Pull", m,
                           decode_pieces, &pc, deadline_ms, st);
    ps_rpc_msg_unref(m);
    if (shm_refused(c, rc, st))
        goto again;
    if (rc == PS_ERPC || rc == -ENOMEM)
        return rc;
    if (rc != 0 && st != NULL) {
        st->code = rc == PS_ESHAPE ? PS_RPC_FAILED_PRECONDITION : PS_RPC_INTERNAL;
        snprintf(st->message, sizeof st->message, "%s", err);
    }
    return rc;
}

/* ---- tensors in pieces -------------------------------------------------- */

/* One half piece of a push to round (error feedback's pass) into the
 * message that will carry it. */
struct ahead_piece {
    const float *g; /* (n) the gradient's elements of the piece */
    float *r;       /* (n) their residual; NULL: plain rounding */
    uint16_t *out;  /* (n) their place in the message, 2-aligned */
    size_t n;
    int state;      /* under the thread's mu: 0 to round, 1 being rounded, 2 done */
};

/* The client's rounding thread. On a link the thread that starts a call
 * also pays the kernel's send of it (512 KiB of bfloat16 kept it busy
 * 0.3-0.45 ms, about as long as a 10 Gbit/s link takes), and rounding the
 * next piece after that added 0.1-0.2 ms a piece, one after the other.
 * This thread rounds a push's pieces in order while the calling thread
 * sends the ones before; a piece the calling thread needs before this
 * thread has taken it (the first, or when this one is slow to wake) it
 * rounds itself rather than wait. */
struct ahead {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool quit;
    int wire;
    struct ahead_piece *job; /* (njob) the current push's; NULL: none */
    size_t njob, next;       /* under mu; next: the piece this thread looks at */
    bool busy;               /* this thread is rounding one of job */
    bool cancel;             /* take no more of job */
};

static void *ahead_main(void *arg)
{
    struct ahead *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->quit && (a->job == NULL || a->cancel || a->next >= a->njob))
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->quit)
            break;
        struct ahead_piece *p = &a->job[a->next++];
        if (p->state != 0)
            continue; /* taken by the calling thread */
        p->state = 1;
        a->busy = true;
        int wire = a->wire;
        pthread_mutex_unlock(&a->mu);
        ps_half_encode_ef(wire, p->g, p->r, p->out, p->n);
        pthread_mutex_lock(&a->mu);
        p->state = 2;
        a->busy = false;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* c's rounding thread, started on first use; NULL when it cannot start
 * (the pieces are then rounded as they are made, on the caller's thread). */
static struct ahead *ahead_get(ps_client *c)
{
    if (c->ahead != NULL)
        return c->ahead;
    struct ahead *a = calloc(1, sizeof *a);
    if (a == NULL)
        return NULL;
    if (ps_thread_start(&a->th, &a->mu, &a->cv, ahead_main, a) != 0) {
        free(a);
        return NULL;
    }
    return c->ahead = a;
}

static void ahead_destroy(struct ahead *a)
{
    if (a == NULL)
        return;
    ps_thread_stop(a->th, &a->mu, &a->cv, &a->quit);
    free(a);
}

/* Hands the thread job (njob pieces, state 0, which stay valid until
 * ahead_end). */
static void ahead_begin(struct ahead *a, int wire, struct ahead_piece *job, size_t njob)
{
    pthread_mutex_lock(&a->mu);
    a->wire = wire;
    a->job = job;
    a->njob = njob;
    a->next = 0;
    a->cancel = false;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* Returns once piece i of the job is rounded: by this thread if the
 * rounding thread has not taken it yet, else by that one. */
static void ahead_take(struct ahead *a, size_t i)
{
    struct ahead_piece *p = &a->job[i];
    pthread_mutex_lock(&a->mu);
    if (p->state == 0) {
        p->state = 1;
        pthread_mutex_unlock(&a->mu);
        ps_half_encode_ef(a->wire, p->g, p->r, p->out, p->n);
        pthread_mutex_lock(&a->mu);
        p->state = 2;
    }
    while (p->state != 2)
        pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
}

/* Takes no more of the job and waits for the piece being rounded: the
 * job's memory is the caller's again. */
static void ahead_end(struct ahead *a)
{
    pthread_mutex_lock(&a->mu);
    a->cancel = true;
    while (a->busy)
        pthread_cond_wait(&a->cv, &a->mu);
    a->job = NULL;
    a->njob = 0;
    pthread_mutex_unlock(&a->mu);
}

/* A call of a push made before the window runs: its parts, and which
 * piece of the rounding thread's job it waits for. */
struct premade {
    ps_rpc_part parts[PS_RPC_WINDOW_PARTS];
    int np;        /* 0: made by pieces_make, or handed over already */
    size_t seq;    /* its piece in the job; SIZE_MAX: written already */
};

/* Where a half push's call wrote one gradient's rounding, with error
 * feedback: kept until the push is over, so that the gradient of a call
 * psd did not apply goes back to its residual (pieces_restore). */
struct half_sent {
    const uint8_t *h; /* (n) 2 bytes an element in msg; NULL: not written */
    ps_rpc_msg *msg;  /* the pjob's own reference */
    size_t job;       /* its piece of the rounding thread's job; SIZE_MAX: rounded */
};

/* A push or pull whose big tensors go in pieces (push_pieces, pull_pieces):
 * its calls, the small items whole in the first when there are any and
 * then one per piece, a few in flight at once (ps_rpc_invoke_window),
 * and what their answers are merged into. */
struct pjob {
    ps_client *c;
    uint32_t worker;
    uint64_t step;
    bool push;
    ps_client_item *items;  /* the caller's */
    ps_client_item *pulls;  /* push: the values asked back, or NULL */
    size_t n;
    struct piece *calls;    /* (ncalls); n 0: the call of the small items */
    size_t ncalls;
    size_t *small;          /* (nsmall) the items sent whole */
    size_t nsmall;
    ps_client_item *views;  /* (nsmall) the small call's items */
    uint64_t *vers;         /* (nsmall) the small call's versions */
    uint64_t *vmin;         /* (n) each value's lowest version over its pieces */
    bool *final;            /* (n) push: the whole value came (pull_ctx.final) */
    struct premade *pre;    /* (ncalls) a half push's pieces made ahead, or NULL */
    struct ahead_piece *job; /* (njob) their rounding, on the client's thread */
    size_t njob;
    struct ahead *ahead;    /* the thread, while it has job */
    /* A half push with error feedback: how each call ended (-1: not sent,
     * else its status code), and where each gradient's rounding is: hs[k]
     * for call k of a piece, hs[ncalls + q] for small[q]. Else NULL. */
    int *codes;             /* (ncalls) */
    struct half_sent *hs;   /* (ncalls + nsmall) */
    char err[256];
};

static void pjob_free(struct pjob *j)
{
    if (j->ahead != NULL)
        ahead_end(j->ahead);
    for (size_t k = 0; j->hs != NULL && k < j->ncalls + j->nsmall; k++)
        if (j->hs[k].msg != NULL)
            ps_rpc_msg_unref(j->hs[k].msg);
    free(j->hs);
    free(j->codes);
    for (size_t k = 0; j->pre != NULL && k < j->ncalls; k++)
        for (int q = 0; q < j->pre[k].np; q++)
            ps_rpc_msg_unref(j->pre[k].parts[q].arg);
    free(j->pre);
    free(j->job);
    free(j->calls);
    free(j->small);
    free(j->views);
    free(j->vers);
    free(j->vmin);
    free(j->final);
}

/* Cuts item i (n elements) into pieces of per from its start, written at
 * out (NULL: only counted); returns how many. With ends (a half push) the
 * first and the last piece of a tensor cut in two or more go each as a
 * quarter and the rest, the quarter outermost: the first piece's rounding
 * is all the link waits for before it starts, and the last one's widening
 * and apply on psd all the answer waits for after it ends (traced on the
 * 10 Gbit/s link: 0.1 and 0.13 ms for 256K values, a quarter of that for
 * 64K, beside 0.47 ms a 512 KiB piece takes on the wire). */
static size_t cut_item(size_t i, size_t n, size_t per, bool ends, struct piece *out)
{
    size_t k = 0, cnt = (n + per - 1) / per;
    for (size_t off = 0; off < n; off += per) {
        size_t len = n - off < per ? n - off : per;
        size_t q = ends && cnt >= 2 && (off == 0 || off + len == n) ? len / 4 : 0;
        size_t a = q == 0 ? len : off == 0 ? q : len - q;
        if (out != NULL)
            out[k] = (struct piece){i, off, a, n};
        k++;
        if (a < len && out != NULL)
            out[k] = (struct piece){i, off + a, len - a, n};
        k += a < len;
    }
    return k;
}

/* Cuts the big items of j into pieces of the client's size, or bigger ones
 * when they would be more than MAX_PIECES. Returns 0 or -ENOMEM. */
static int pjob_init(struct pjob *j)
{
    size_t per = j->c->piece_bytes / sizeof(float), ncalls = 0, nsmall = 0, big = 0,
           nbig = 0;
    for (size_t i = 0; i < j->n; i++)
        if (in_pieces(j->c, &j->items[i])) {
            big += j->items[i].n;
            nbig++;
        }
    /* Calls: at most big / per + nbig (3 nbig with the ends cut again),
     * and one for the small items. */
    size_t extra = 3 * nbig + 1 < MAX_PIECES / 2 ? 3 * nbig : nbig;
    bool ends = j->push && j->c->wire != 0 && extra > nbig;
    if (!ends)
        extra = nbig;
    if (big / per + extra + 1 > MAX_PIECES)
        per = big / (MAX_PIECES - extra - 1) + 1;
    for (size_t i = 0; i < j->n; i++) {
        if (in_pieces(j->c, &j->items[i]))
            ncalls += cut_item(i, j->items[i].n, per, ends, NULL);
        else
            nsmall++;
    }
    ncalls += nsmall > 0;
    j->calls = calloc(ncalls, sizeof *j->calls);
    j->small = calloc(nsmall ? nsmall : 1, sizeof *j->small);
    j->views = calloc(nsmall ? nsmall : 1, sizeof *j->views);
    j->vers = calloc(nsmall ? nsmall : 1, sizeof *j->vers);
    j->vmin = malloc(j->n * sizeof *j->vmin);
    j->final = calloc(j->n, sizeof *j->final);
    if (j->calls == NULL || j->small == NULL || j->views == NULL || j->vers == NULL ||
        j->vmin == NULL || j->final == NULL)
        return -ENOMEM;
    j->ncalls = nsmall > 0;
    for (size_t i = 0; i < j->n; i++) {
        j->vmin[i] = UINT64_MAX;
        j->items[i].version = 0;
        if (!in_pieces(j->c, &j->items[i])) {
            j->small[j->nsmall++] = i;
            continue;
        }
        j->ncalls += cut_item(i, j->items[i].n, per, ends, j->calls + j->ncalls);
    }
    if (j->push && j->c->wire != 0 && j->c->feedback) {
        j->codes = calloc(j->ncalls, sizeof *j->codes);
        j->hs = calloc(j->ncalls + j->nsmall, sizeof *j->hs);
        if (j->codes == NULL || j->hs == NULL)
            return -ENOMEM;
        for (size_t k = 0; k < j->ncalls; k++)
            j->codes[k] = -1; /* until the window says */
    }
    return 0;
}

/* The caller's item i of src seen as the piece pc (pc->n 0: whole). */
static ps_client_item piece_view(const ps_client_item *src, size_t i,
                                 const struct piece *pc)
{
    ps_client_item v = src[i];
    if (pc->n != 0) {
        v.data += pc->off;
        v.n = pc->n;
    }
    return v;
}

/* Writes gradient it's elements [off, off + cnt) at dst in the wire dtype:
 * float32 as they are, half rounded with the residual of error feedback;
 * with defer (NULL: now) a half piece at a 2-aligned dst is only described
 * there, for the rounding thread (defer->n 0: written already).
 * Returns 0 or -ENOMEM. */
static int put_grad_data(ps_client *c, const ps_client_item *it, size_t off,
                         size_t cnt, uint8_t *dst, struct ahead_piece *defer)
{
    if (defer != NULL)
        defer->n = 0;
    if (c->wire == 0) {
        memcpy(dst, it->data + off, cnt * sizeof(float));
        return 0;
    }
    float *r = c->feedback ? residual_of(c, it->name, it->n) : NULL;
    if (c->feedback && r == NULL)
        return -ENOMEM;
    if (((uintptr_t)dst & 1) == 0 && defer != NULL) {
        *defer = (struct ahead_piece){it->data + off, r ? r + off : NULL,
                                      (uint16_t *)(void *)dst, cnt, 0};
        return 0;
    }
    if (((uintptr_t)dst & 1) == 0) {
        ps_half_encode_ef(c->wire, it->data + off, r ? r + off : NULL,
                          (uint16_t *)(void *)dst, cnt);
        return 0;
    }
    if (ps_buf_reserve(&c->half, cnt * 2) != 0)
        return -ENOMEM;
    ps_half_encode_ef(c->wire, it->data + off, r ? r + off : NULL,
                      (uint16_t *)(void *)c->half.data, cnt);
    memcpy(dst, c->half.data, cnt * 2);
    return 0;
}

/* The PushRequest of call pc as parts: a float32 piece of a gradient that
 * lies in a message buffer (ps_client_item.msg) sent in place between its
 * header and trailer (encoded into c->req, whose room for the data is
 * never written, then copied out: a few bytes); every other gradient's
 * bytes written once, straight into the message, a half piece's 2-aligned
 * (its dtype varint padded so) for the narrowing to store into. */
static int push_call_encode(struct pjob *j, const struct piece *pc, ps_rpc_part *parts,
                            int *np, struct ahead_piece *defer)
{
    ps_client *c = j->c;
    size_t ng = pc->n ? 1 : j->nsmall, esz = c->wire ? 2 : sizeof(float);
    const ps_client_item *one = pc->n ? &j->items[pc->item] : NULL;
    bool in_place = one != NULL && c->wire == 0 && one->msg != NULL;
    ps_wire_grad_out *g = calloc(ng, sizeof *g);
    uint8_t **at = calloc(ng, sizeof *at);
    ps_rpc_msg *msg = NULL;
    int rc = -ENOMEM;
    if (g == NULL || at == NULL)
        goto free_arrays;
    for (size_t k = 0; k < ng; k++) {
        const ps_client_item *it = &j->items[pc->n ? pc->item : j->small[k]];
        g[k] = (ps_wire_grad_out){
            .name = it->name, .dtype = c->wire ? c->wire : PS__V1__DTYPE__DTYPE_FLOAT32,
            .shape = it->shape, .ndim = it->shape ? it->ndim : 0,
            .nbytes = (pc->n ? pc->n : it->n) * esz, .offset = pc->off,
            .total = pc->n ? it->n : 0, .data_at = &at[k]};
    }
    ps_wire_push_out m = {.worker = j->worker, .step = j->step, .grads = g,
                          .ngrads = ng, .return_values = j->pulls != NULL,
                          .delta = c->delta, .wire_dtype = c->wire};
    size_t len = ps_wire_push_len(&m);
    if (in_place) {
        if (ps_buf_reserve(&c->req, len) != 0)
            goto free_arrays;
        uint8_t *end = ps_wire_push_put(c->req.data, &m);
        size_t head = (size_t)(at[0] - c->req.data), bytes = g[0].nbytes;
        size_t tail = (size_t)(end - c->req.data) - head - bytes;
        if ((msg = ps_rpc_msg_new(head + tail)) == NULL)
            goto free_arrays;
        memcpy(ps_rpc_msg_data(msg), c->req.data, head);
        memcpy(ps_rpc_msg_data(msg) + head, at[0] + bytes, tail);
        ps_rpc_msg_set_len(msg, head + tail);
        ps_rpc_msg_ref(msg);
        ps_rpc_msg_ref(one->msg);
        parts[0] = (ps_rpc_part){ps_rpc_msg_data(msg), head, ps_rpc_msg_release, msg};
        parts[1] = (ps_rpc_part){one->data + pc->off, bytes, ps_rpc_msg_release,
                                 one->msg};
        parts[2] = (ps_rpc_part){ps_rpc_msg_data(msg) + head, tail, ps_rpc_msg_release,
                                 msg};
        *np = 3;
        rc = 0;
        goto free_arrays;
    }
    msg = ps_rpc_msg_new(len + 8);
    if (msg == NULL)
        goto free_arrays;
    uint8_t *end = ps_wire_push_put(ps_rpc_msg_data(msg), &m);
    for (int pad = 1; c->wire && ng == 1 && ((uintptr_t)at[0] & 1) && pad <= 2; pad++) {
        g[0].dtype_pad = pad;
        end = ps_wire_push_put(ps_rpc_msg_data(msg), &m);
    }
    ps_rpc_msg_set_len(msg, (size_t)(end - ps_rpc_msg_data(msg)));
    rc = 0;
    for (size_t k = 0; k < ng && rc == 0; k++) {
        const ps_client_item *it = &j->items[pc->n ? pc->item : j->small[k]];
        rc = put_grad_data(c, it, pc->off, pc->n ? pc->n : it->n, at[k],
                           ng == 1 ? defer : NULL);
        if (rc == 0 && j->hs != NULL) {
            struct half_sent *e = &j->hs[pc->n ? (size_t)(pc - j->calls) : j->ncalls + k];
            ps_rpc_msg_ref(msg);
            *e = (struct half_sent){at[k], msg, SIZE_MAX};
        }
    }
    if (rc != 0) {
        ps_rpc_msg_unref(msg);
        goto free_arrays;
    }
    parts[0] = (ps_rpc_part){ps_rpc_msg_data(msg), ps_rpc_msg_len(msg),
                             ps_rpc_msg_release, msg};
    *np = 1;
free_arrays:
    free(g);
    free(at);
    return rc;
}

/* The PullRequest of call pc, as one part. */
static int pull_call_encode(struct pjob *j, const struct piece *pc, ps_rpc_part *parts,
                            int *np)
{
    ps_client_item one;
    const ps_client_item *its = &one;
    size_t ni = 1;
    if (pc->n != 0) {
        one = piece_view(j->items, pc->item, pc);
    } else {
        for (size_t k = 0; k < j->nsmall; k++)
            j->views[k] = j->items[j->small[k]];
        its = j->views;
        ni = j->nsmall;
    }
    int rc = encode_pull(j->c, &j->c->req, its, ni, j->worker, j->step,
                         pc->n ? pc : NULL);
    if (rc != 0)
        return rc;
    ps_rpc_msg *m = ps_rpc_msg_new(j->c->req.len);
    if (m == NULL)
        return -ENOMEM;
    memcpy(ps_rpc_msg_data(m), j->c->req.data, j->c->req.len);
    ps_rpc_msg_set_len(m, j->c->req.len);
    parts[0] = (ps_rpc_part){ps_rpc_msg_data(m), j->c->req.len, ps_rpc_msg_release, m};
    *np = 1;
    return 0;
}

static int pieces_make(void *ctx, size_t k, ps_rpc_part *parts, int *np)
{
    struct pjob *j = ctx;
    *np = 0;
    if (j->pre != NULL && j->pre[k].np > 0) {
        struct premade *m = &j->pre[k];
        if (m->seq != SIZE_MAX)
            ahead_take(j->ahead, m->seq);
        memcpy(parts, m->parts, (size_t)m->np * sizeof *parts);
        *np = m->np;
        m->np = 0;
        return 0;
    }
    return j->push ? push_call_encode(j, &j->calls[k], parts, np, NULL)
                   : pull_call_encode(j, &j->calls[k], parts, np);
}

/* Takes call k's answer: the values into the caller's memory where the
 * piece belongs, each pushed item's version the highest of its pieces'
 * (the piece that completed the push has the new one), each value's the
 * lowest (every piece is at least that new). */
static int pieces_resp(void *ctx, size_t k, const struct ps_piece *pp, int np)
{
    struct pjob *j = ctx;
    const struct piece *pc = &j->calls[k];
    size_t ni = pc->n ? 1 : j->nsmall;
    ps_client_item *src = j->push ? j->pulls : j->items, one, *vals = NULL;
    uint64_t ver1 = 0, *vers = pc->n ? &ver1 : j->vers;
    if (src != NULL && pc->n != 0) {
        one = piece_view(src, pc->item, pc);
        vals = &one;
    } else if (src != NULL) {
        for (size_t kk = 0; kk < ni; kk++)
            j->views[kk] = src[j->small[kk]];
        vals = j->views;
    }
    struct pull_ctx x = {j->c, vals, vals ? ni : 0, j->push ? vers : NULL,
                         j->push ? ni : 0, j->err, sizeof j->err, false, NULL, NULL};
    if (j->push && vals != NULL && pc->n != 0) {
        x.whole = &j->pulls[pc->item];
        x.final = &j->final[pc->item];
    }
    int rc = decode_pieces(&x, pp, np);
    if (rc != 0)
        return rc;
    for (size_t kk = 0; kk < ni; kk++) {
        size_t i = pc->n ? pc->item : j->small[kk];
        if (j->push && vers[kk] > j->items[i].version)
            j->items[i].version = vers[kk];
        if (vals != NULL && vals[kk].version < j->vmin[i])
            j->vmin[i] = vals[kk].version;
    }
    return 0;
}

/* Runs j's calls, window at a time; sets the values' versions. */
static int pjob_run(struct pjob *j, const char *method, int deadline_ms,
                    ps_rpc_status *st)
{
    /* A push's pieces go out one behind the other, each started once the
     * one before is all handed to the connection (counted as sending, not
     * as answered): the link never waits for an answer, and the streams
     * never interleave, so psd gets and applies piece k while k + 1 is on
     * the wire. A pull's answers, the big part, come window at a time. */
    int rc = ps_rpc_invoke_window(j->c->rpc, method, j->ncalls,
                                  j->push ? 1 : j->c->piece_window, !j->push,
                                  pieces_make, pieces_resp, j, deadline_ms, st,
                                  j->codes);
    /* A value pushed and brought back holds this push's update in every
     * piece, though the pieces before the last answered the version before
     * it: it is at least the version the push produced. */
    ps_client_item *vals = j->push ? j->pulls : j->items;
    for (size_t i = 0; rc == 0 && vals != NULL && i < j->n; i++)
        vals[i].version = j->push && j->items[i].version > j->vmin[i]
                              ? j->items[i].version : j->vmin[i];
    if (rc != 0 && rc != PS_ERPC && rc != -ENOMEM && st != NULL) {
        st->code = rc == PS_ESHAPE ? PS_RPC_FAILED_PRECONDITION : PS_RPC_INTERNAL;
        snprintf(st->message, sizeof st->message, "%s", j->err);
    }
    return rc;
}

/* A half push's pieces made before its calls run: the messages whole but
 * for their bfloat16 or float16 data, which the client's rounding thread
 * writes one piece after another while this thread sends the ones before
 * (pieces_make waits for a piece's, or rounds it itself). Without the
 * thread (it could not start) nothing is made ahead. Returns 0 or -ENOMEM. */
static int premake_half(struct pjob *j)
{
    struct ahead *a = ahead_get(j->c);
    if (a == NULL)
        return 0;
    j->pre = calloc(j->ncalls, sizeof *j->pre);
    j->job = calloc(j->ncalls, sizeof *j->job);
    if (j->pre == NULL || j->job == NULL)
        return -ENOMEM;
    for (size_t k = 0; k < j->ncalls; k++) {
        struct premade *m = &j->pre[k];
        if (j->calls[k].n == 0)
            continue; /* the small items' call, made when it goes */
        struct ahead_piece p;
        int rc = push_call_encode(j, &j->calls[k], m->parts, &m->np, &p);
        if (rc != 0)
            return rc;
        m->seq = SIZE_MAX;
        if (p.n != 0)
            j->job[m->seq = j->njob++] = p;
        if (j->hs != NULL)
            j->hs[k].job = m->seq;
    }
    if (j->njob > 0) {
        j->ahead = a;
        ahead_begin(a, j->c->wire, j->job, j->njob);
    }
    return 0;
}

/* After a half push in pieces with error feedback that failed (st its
 * status, NULL when the failure was not psd's): gives back to the
 * residuals the gradients of the calls psd did not apply
 * (push_call_applied), rounded or not. Called once the rounding thread has
 * let go of the job. */
static void pieces_restore(struct pjob *j, const ps_rpc_status *st)
{
    /* Only the small items' call has several gradients, of which psd may
     * have applied the first few. */
    size_t before = st != NULL ? applied_before(st) : 0;
    for (size_t k = 0; k < j->ncalls; k++) {
        const struct piece *pc = &j->calls[k];
        size_t ng = pc->n ? 1 : j->nsmall;
        for (size_t q = 0; q < ng && !push_call_applied(j->codes[k]); q++) {
            if (pc->n == 0 && q < before)
                continue;
            const ps_client_item *it = &j->items[pc->n ? pc->item : j->small[q]];
            const struct half_sent *e = &j->hs[pc->n ? k : j->ncalls + q];
            bool rounded = e->h != NULL && (e->job == SIZE_MAX || j->job[e->job].state == 2);
            float *r = residual_of(j->c, it->name, it->n);
            if (r != NULL)
                feedback_restore(j->c->wire, r + pc->off, it->data + pc->off,
                                 rounded ? e->h : NULL, pc->n ? pc->n : it->n);
        }
    }
}

/* A push whose big gradients go in pieces, several calls in flight: while
 * one piece is on the wire the next is encoded (rounded to half, with its
 * residual) and psd applies the one before, and with pulls a piece's value
 * comes back while later pieces still go out. Pieces of one push carry the
 * same worker and step: psd raises the version once they cover the
 * variable, and a SYNC step counts them as the worker's one push. */
static int push_pieces(ps_client *c, uint32_t worker, uint64_t step,
                       ps_client_item *items, ps_client_item *pulls, size_t n,
                       int deadline_ms, ps_rpc_status *st)
{
    struct pjob j = {.c = c, .worker = worker, .step = step, .push = true,
                     .items = items, .pulls = pulls, .n = n};
    int rc = pjob_init(&j);
    if (rc == 0 && c->wire != 0)
        rc = premake_half(&j);
    ps_rpc_status local;
    if (st == NULL)
        st = &local; /* error feedback reads what the calls came to */
    if (rc == 0)
        rc = pjob_run(&j, "/ps.v1.ParameterServer/Push", deadline_ms, st);
    if (rc != 0 && j.codes != NULL && j.hs != NULL) {
        if (j.ahead != NULL)
            ahead_end(j.ahead);
        j.ahead = NULL;
        pieces_restore(&j, rc == PS_ERPC ? st : NULL);
    }
    pjob_free(&j);
    return rc;
}

/* A pull whose big values come in pieces, several calls in flight. */
static int pull_pieces(ps_client *c, uint32_t worker, uint64_t step,
                       ps_client_item *items, size_t n, int deadline_ms,
                       ps_rpc_status *st)
{
    int rc;
again:;
    struct pjob j = {.c = c, .worker = worker, .step = step, .items = items, .n = n};
    rc = pjob_init(&j);
    if (rc == 0)
        rc = pjob_run(&j, "/ps.v1.ParameterServer/Pull", deadline_ms, st);
    pjob_free(&j);
    if (shm_refused(c, rc, st))
        goto again;
    return rc;
}
