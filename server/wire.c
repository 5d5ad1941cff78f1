#include "wire.h"

#include "errors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

struct cursor {
    const uint8_t *p, *end;
};

static int get_varint(struct cursor *c, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (c->p >= c->end)
            return -1;
        uint8_t b = *c->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* Skips one field of wire type wt. */
static int skip_field(struct cursor *c, int wt)
{
    uint64_t v;
    switch (wt) {
    case WT_VARINT:
        return get_varint(c, &v);
    case WT_I64:
        if (c->end - c->p < 8)
            return -1;
        c->p += 8;
        return 0;
    case WT_I32:
        if (c->end - c->p < 4)
            return -1;
        c->p += 4;
        return 0;
    case WT_LEN:
        if (get_varint(c, &v) != 0 || v > (uint64_t)(c->end - c->p))
            return -1;
        c->p += v;
        return 0;
    default:
        return -1; /* groups are not proto3 */
    }
}

static int get_len(struct cursor *c, struct cursor *sub)
{
    uint64_t v;
    if (get_varint(c, &v) != 0 || v > (uint64_t)(c->end - c->p))
        return -1;
    sub->p = c->p;
    sub->end = c->p + v;
    c->p += v;
    return 0;
}

static int add_dim(psd_wire_grad *g, uint64_t d)
{
    if (g->ndim < 0)
        return 0;
    if (g->ndim >= PSD_MAX_DIMS) {
        g->ndim = -1;
        return 0;
    }
    g->shape[g->ndim++] = (int64_t)d;
    return 0;
}

static const char *decode_tensor(struct cursor *c, psd_wire_grad *g)
{
    while (c->p < c->end) {
        uint64_t key;
        if (get_varint(c, &key) != 0)
            return "Tensor: truncated field key";
        int field = (int)(key >> 3), wt = (int)(key & 7);
        if (field == 1 && wt == WT_VARINT) {
            uint64_t v;
            if (get_varint(c, &v) != 0)
                return "Tensor.dtype: truncated varint";
            g->dtype = v > 1000 ? 1000 : (int)v;
        } else if (field == 2 && wt == WT_LEN) { /* packed */
            struct cursor s;
            if (get_len(c, &s) != 0)
                return "Tensor.shape: length past the end";
            while (s.p < s.end) {
                uint64_t d;
                if (get_varint(&s, &d) != 0)
                    return "Tensor.shape: truncated varint";
                add_dim(g, d);
            }
        } else if (field == 2 && wt == WT_VARINT) { /* unpacked */
            uint64_t d;
            if (get_varint(c, &d) != 0)
                return "Tensor.shape: truncated varint";
            add_dim(g, d);
        } else if (field == 3 && wt == WT_LEN) {
            struct cursor s;
            if (get_len(c, &s) != 0)
                return "Tensor.data: length past the end";
            g->data = s.p;
            g->nbytes = (size_t)(s.end - s.p);
        } else if (skip_field(c, wt) != 0) {
            return "Tensor: malformed unknown field";
        }
    }
    return NULL;
}

static const char *decode_grad(struct cursor *c, psd_wire_grad *g)
{
    while (c->p < c->end) {
        uint64_t key;
        if (get_varint(c, &key) != 0)
            return "Gradient: truncated field key";
        int field = (int)(key >> 3), wt = (int)(key & 7);
        if (field == 1 && wt == WT_LEN) {
            struct cursor s;
            if (get_len(c, &s) != 0)
                return "Gradient.name: length past the end";
            g->name = (const char *)s.p;
            g->name_len = (size_t)(s.end - s.p);
        } else if (field == 2 && wt == WT_LEN) {
            struct cursor s;
            if (get_len(c, &s) != 0)
                return "Gradient.grad: length past the end";
            /* A repeated embedded message merges; the last one wins here,
             * which matches for the fields we read. */
            g->has_tensor = 1;
            const char *why = decode_tensor(&s, g);
            if (why != NULL)
                return why;
        } else if (skip_field(c, wt) != 0) {
            return "Gradient: malformed unknown field";
        }
    }
    return NULL;
}

int psd_push_decode(const uint8_t *buf, size_t len, psd_push_req *req,
                    char *err, size_t errlen)
{
    struct cursor c = {buf, buf + len};
    req->worker = 0;
    req->step = 0;
    req->ngrads = 0;
    while (c.p < c.end) {
        size_t at = (size_t)(c.p - buf);
        uint64_t key, v;
        if (get_varint(&c, &key) != 0) {
            snprintf(err, errlen, "PushRequest: truncated field key at byte %zu", at);
            return PS_EPARSE;
        }
        int field = (int)(key >> 3), wt = (int)(key & 7);
        if (field == 1 && wt == WT_VARINT) {
            if (get_varint(&c, &v) != 0)
                goto truncated;
            req->worker = (uint32_t)v;
        } else if (field == 2 && wt == WT_VARINT) {
            if (get_varint(&c, &v) != 0)
                goto truncated;
            req->step = v;
        } else if (field == 3 && wt == WT_LEN) {
            struct cursor s;
            if (get_len(&c, &s) != 0) {
                snprintf(err, errlen, "PushRequest.grads[%zu]: length past the end "
                         "of the message", req->ngrads);
                return PS_EPARSE;
            }
            if (req->ngrads == req->cap) {
                size_t ncap = req->cap ? req->cap * 2 : 8;
                psd_wire_grad *g = realloc(req->grads, ncap * sizeof *g);
                if (g == NULL)
                    return -ENOMEM;
                req->grads = g;
                req->cap = ncap;
            }
            psd_wire_grad *g = &req->grads[req->ngrads];
            memset(g, 0, sizeof *g);
            g->name = "";
            const char *why = decode_grad(&s, g);
            if (why != NULL) {
                snprintf(err, errlen, "PushRequest.grads[%zu]: %s", req->ngrads, why);
                return PS_EPARSE;
            }
            req->ngrads++;
        } else if (field == 0 || skip_field(&c, wt) != 0) {
            snprintf(err, errlen, "PushRequest: malformed field %d (wire type %d) "
                     "at byte %zu", field, wt, at);
            return PS_EPARSE;
        }
        continue;
    truncated:
        snprintf(err, errlen, "PushRequest: truncated varint at byte %zu", at);
        return PS_EPARSE;
    }
    return 0;
}

void psd_push_req_free(psd_push_req *req)
{
    free(req->grads);
    req->grads = NULL;
    req->cap = req->ngrads = 0;
}
