#include "wire.h"

#include "errors.h"
#include "pbcur.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A ShmRef; a name too long for ref keeps its wire length in name_len. */
static const char *decode_shm_ref(ps_pbcur *c, psd_shm_ref *ref)
{
    memset(ref, 0, sizeof *ref);
    ref->set = 1;
    return ps_shm_ref_decode(c, ref->name, sizeof ref->name, &ref->name_len,
                             &ref->offset, &ref->length);
}

static const char *decode_tensor(ps_pbcur *c, psd_wire_grad *g)
{
    while (c->left > 0) {
        uint64_t key;
        if (ps_pbcur_varint(c, &key) != 0)
            return "Tensor: truncated field key";
        int field = (int)(key >> 3), wt = (int)(key & 7);
        if (field == 1 && wt == PS_WT_VARINT) {
            uint64_t v;
            if (ps_pbcur_varint(c, &v) != 0)
                return "Tensor.dtype: truncated varint";
            g->dtype = v > 1000 ? 1000 : (int)v;
        } else if (field == 2 && wt == PS_WT_LEN) { /* packed */
            ps_pbcur s;
            if (ps_pbcur_sub(c, &s) != 0)
                return "Tensor.shape: length past the end";
            while (s.left > 0) {
                uint64_t d;
                if (ps_pbcur_varint(&s, &d) != 0)
                    return "Tensor.shape: truncated varint";
                add_dim(g, d);
            }
        } else if (field == 2 && wt == PS_WT_VARINT) { /* unpacked */
            uint64_t d;
            if (ps_pbcur_varint(c, &d) != 0)
                return "Tensor.shape: truncated varint";
            add_dim(g, d);
        } else if (field == 3 && wt == PS_WT_LEN) {
            ps_pbcur s;
            if (ps_pbcur_sub(c, &s) != 0)
                return "Tensor.data: length past the end";
            g->data = s;
            g->nbytes = s.left;
            g->has_data = 1;
        } else if (field == 4 && wt == PS_WT_LEN) {
            ps_pbcur s;
            if (ps_pbcur_sub(c, &s) != 0)
                return "Tensor.shm: length past the end";
            const char *why = decode_shm_ref(&s, &g->shm);
            if (why != NULL)
                return why;
        } else if (ps_pbcur_skip(c, wt) != 0) {
            return "Tensor: malformed unknown field";
        }
    }
    return NULL;
}

static const char *decode_grad(ps_pbcur *c, psd_wire_grad *g)
{
    while (c->left > 0) {
        uint64_t key;
        if (ps_pbcur_varint(c, &key) != 0)
            return "Gradient: truncated field key";
        int field = (int)(key >> 3), wt = (int)(key & 7);
        if (field == 1 && wt == PS_WT_LEN) {
            ps_pbcur s;
            if (ps_pbcur_sub(c, &s) != 0)
                return "Gradient.name: length past the end";
            /* Up to 255 bytes are kept; name_len says how long it was, so
             * the caller can refuse a longer one by name. */
            g->name_len = s.left;
            size_t keep = s.left < PSD_WIRE_MAX_NAME ? s.left : PSD_WIRE_MAX_NAME;
            if (ps_pbcur_take(&s, g->name, keep) != 0)
                return "Gradient.name: length past the end";
            g->name[keep] = '\0';
        } else if (field == 2 && wt == PS_WT_LEN) {
            ps_pbcur s;
            if (ps_pbcur_sub(c, &s) != 0)
                return "Gradient.grad: length past the end";
            /* A repeated embedded message merges; the last one wins here,
             * which matches for the fields we read. */
            g->has_tensor = 1;
            const char *why = decode_tensor(&s, g);
            if (why != NULL)
                return why;
        } else if (field == 3 && wt == PS_WT_LEN) {
            ps_pbcur s;
            if (ps_pbcur_sub(c, &s) != 0)
                return "Gradient.value_into: length past the end";
            const char *why = decode_shm_ref(&s, &g->value_into);
            if (why != NULL)
                return why;
        } else if (ps_pbcur_skip(c, wt) != 0) {
            return "Gradient: malformed unknown field";
        }
    }
    return NULL;
}

int psd_push_decode(const struct ps_piece *pieces, int np, psd_push_req *req,
                    char *err, size_t errlen)
{
    ps_pbcur c;
    ps_pbcur_init(&c, pieces, np);
    size_t total = c.left;
    req->worker = 0;
    req->step = 0;
    req->return_values = 0;
    req->ngrads = 0;
    while (c.left > 0) {
        size_t at = total - c.left;
        uint64_t key, v;
        if (ps_pbcur_varint(&c, &key) != 0) {
            snprintf(err, errlen, "PushRequest: truncated field key at byte %zu", at);
            return PS_EPARSE;
        }
        int field = (int)(key >> 3), wt = (int)(key & 7);
        if (field == 1 && wt == PS_WT_VARINT) {
            if (ps_pbcur_varint(&c, &v) != 0)
                goto truncated;
            req->worker = (uint32_t)v;
        } else if (field == 2 && wt == PS_WT_VARINT) {
            if (ps_pbcur_varint(&c, &v) != 0)
                goto truncated;
            req->step = v;
        } else if (field == 4 && wt == PS_WT_VARINT) {
            if (ps_pbcur_bool(&c, &req->return_values) != 0)
                goto truncated;
        } else if (field == 3 && wt == PS_WT_LEN) {
            ps_pbcur s;
            if (ps_pbcur_sub(&c, &s) != 0) {
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
            const char *why = decode_grad(&s, g);
            if (why != NULL) {
                snprintf(err, errlen, "PushRequest.grads[%zu]: %s", req->ngrads, why);
                return PS_EPARSE;
            }
            req->ngrads++;
        } else if (field == 0 || ps_pbcur_skip(&c, wt) != 0) {
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

int psd_push_decode_buf(const uint8_t *buf, size_t len, psd_push_req *req,
                        char *err, size_t errlen)
{
    req->one = (struct ps_piece){buf, len};
    return psd_push_decode(&req->one, 1, req, err, errlen);
}

void psd_push_req_free(psd_push_req *req)
{
    free(req->grads);
    req->grads = NULL;
    req->cap = req->ngrads = 0;
}
