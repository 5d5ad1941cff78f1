#include "psclient.h"

#include "errors.h"
#include "ps.pb-c.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ps_client {
    ps_rpc_client *rpc;
    char *address;
    ps_buf req;   /* encoded requests, reused */
    ps_buf resp;  /* responses, reused */
};

int ps_client_create(const char *address, const ps_rpc_client_opts *opts,
                     ps_client **out)
{
    ps_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -ENOMEM;
    c->address = strdup(address);
    int rc = c->address ? ps_rpc_client_create(address, opts, &c->rpc) : -ENOMEM;
    if (rc != 0) {
        free(c->address);
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void ps_client_destroy(ps_client *c)
{
    if (c == NULL)
        return;
    ps_rpc_client_destroy(c->rpc);
    ps_buf_free(&c->req);
    ps_buf_free(&c->resp);
    free(c->address);
    free(c);
}

const char *ps_client_address(const ps_client *c)
{
    return c->address;
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

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* Tensor{dtype=1, shape=2 packed, data=3}: its encoded length. */
static size_t tensor_len(const ps_client_item *it, size_t *shape_len)
{
    size_t sl = 0;
    for (int d = 0; d < it->ndim; d++)
        sl += varint_len((uint64_t)it->shape[d]);
    *shape_len = sl;
    size_t bytes = it->n * sizeof(float);
    size_t len = 2; /* dtype tag + value 1 */
    if (it->ndim > 0)
        len += 1 + varint_len(sl) + sl;
    len += 1 + varint_len(bytes) + bytes;
    return len;
}

static size_t grad_len(const ps_client_item *it, size_t *tlen, size_t *shape_len)
{
    size_t nl = strlen(it->name);
    *tlen = tensor_len(it, shape_len);
    return 1 + varint_len(nl) + nl + 1 + varint_len(*tlen) + *tlen;
}

int ps_push_encode(ps_buf *b, uint32_t worker, uint64_t step,
                   const ps_client_item *items, size_t n)
{
    size_t total = 1 + varint_len(worker) + 1 + varint_len(step);
    for (size_t i = 0; i < n; i++) {
        size_t tl, sl;
        size_t gl = grad_len(&items[i], &tl, &sl);
        total += 1 + varint_len(gl) + gl;
    }
    int rc = ps_buf_reserve(b, total);
    if (rc != 0)
        return rc;
    uint8_t *p = b->data;
    *p++ = (1 << 3) | 0;
    p = put_varint(p, worker);
    *p++ = (2 << 3) | 0;
    p = put_varint(p, step);
    for (size_t i = 0; i < n; i++) {
        const ps_client_item *it = &items[i];
        size_t tl, sl;
        size_t gl = grad_len(it, &tl, &sl);
        size_t nl = strlen(it->name);
        size_t bytes = it->n * sizeof(float);
        *p++ = (3 << 3) | 2;
        p = put_varint(p, gl);
        *p++ = (1 << 3) | 2;
        p = put_varint(p, nl);
        memcpy(p, it->name, nl);
        p += nl;
        *p++ = (2 << 3) | 2;
        p = put_varint(p, tl);
        *p++ = (1 << 3) | 0;
        *p++ = PS__V1__DTYPE__DTYPE_FLOAT32;
        if (it->ndim > 0) {
            *p++ = (2 << 3) | 2;
            p = put_varint(p, sl);
            for (int d = 0; d < it->ndim; d++)
                p = put_varint(p, (uint64_t)it->shape[d]);
        }
        *p++ = (3 << 3) | 2;
        p = put_varint(p, bytes);
        memcpy(p, it->data, bytes);
        p += bytes;
    }
    b->len = (size_t)(p - b->data);
    return 0;
}

int ps_client_push(ps_client *c, uint32_t worker, uint64_t step,
                   ps_client_item *items, size_t n, int deadline_ms,
                   ps_rpc_status *st)
{
    int rc = ps_push_encode(&c->req, worker, step, items, n);
    if (rc != 0)
        return rc;
    rc = ps_rpc_invoke(c->rpc, "/ps.v1.ParameterServer/Push", c->req.data,
                       c->req.len, &c->resp, deadline_ms, st);
    if (rc != 0)
        return rc;
    Ps__V1__PushResponse *r =
        ps__v1__push_response__unpack(NULL, c->resp.len, c->resp.data);
    if (r == NULL || r->n_versions != n) {
        if (r)
            ps__v1__push_response__free_unpacked(r, NULL);
        if (st) {
            st->code = PS_RPC_INTERNAL;
            snprintf(st->message, sizeof st->message,
                     "Push: the response does not parse or lacks versions");
        }
        return PS_EPARSE;
    }
    for (size_t i = 0; i < n; i++)
        items[i].version = r->versions[i];
    ps__v1__push_response__free_unpacked(r, NULL);
    return 0;
}

/* ---- Pull ------------------------------------------------------------- */

static int encode_pull(ps_buf *b, const ps_client_item *items, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(items[i].name);
        size_t il = 1 + varint_len(nl) + nl;
        if (items[i].min_version)
            il += 1 + varint_len(items[i].min_version);
        total += 1 + varint_len(il) + il;
    }
    int rc = ps_buf_reserve(b, total ? total : 1);
    if (rc != 0)
        return rc;
    uint8_t *p = b->data;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(items[i].name);
        size_t il = 1 + varint_len(nl) + nl;
        if (items[i].min_version)
            il += 1 + varint_len(items[i].min_version);
        *p++ = (1 << 3) | 2;
        p = put_varint(p, il);
        *p++ = (1 << 3) | 2;
        p = put_varint(p, nl);
        memcpy(p, items[i].name, nl);
        p += nl;
        if (items[i].min_version) {
            *p++ = (2 << 3) | 0;
            p = put_varint(p, items[i].min_version);
        }
    }
    b->len = (size_t)(p - b->data);
    return 0;
}

struct cur {
    const uint8_t *p, *end;
};

static int get_varint(struct cur *c, uint64_t *out)
{
    uint64_t v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (c->p >= c->end)
            return -1;
        uint8_t b = *c->p++;
        v |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

static int get_sub(struct cur *c, struct cur *sub)
{
    uint64_t len;
    if (get_varint(c, &len) != 0 || len > (uint64_t)(c->end - c->p))
        return -1;
    sub->p = c->p;
    sub->end = c->p + len;
    c->p += len;
    return 0;
}

static int skip(struct cur *c, int wt)
{
    uint64_t v;
    struct cur s;
    switch (wt) {
    case 0: return get_varint(c, &v);
    case 1: if (c->end - c->p < 8) return -1; c->p += 8; return 0;
    case 5: if (c->end - c->p < 4) return -1; c->p += 4; return 0;
    case 2: return get_sub(c, &s);
    default: return -1;
    }
}

int ps_pull_decode(const uint8_t *buf, size_t len, ps_client_item *items,
                   size_t n, char *err, size_t errlen)
{
    struct cur c = {buf, buf + len};
    size_t k = 0;
    while (c.p < c.end) {
        uint64_t key;
        if (get_varint(&c, &key) != 0)
            goto bad;
        if (key != ((1 << 3) | 2)) {
            if (skip(&c, (int)(key & 7)) != 0)
                goto bad;
            continue;
        }
        struct cur vv;
        if (get_sub(&c, &vv) != 0)
            goto bad;
        if (k >= n) {
            snprintf(err, errlen, "Pull: more values than requested");
            return PS_EPARSE;
        }
        const uint8_t *name = NULL, *data = NULL;
        size_t name_len = 0, data_len = 0;
        uint64_t version = 0;
        while (vv.p < vv.end) {
            if (get_varint(&vv, &key) != 0)
                goto bad;
            if (key == ((1 << 3) | 2)) {
                struct cur s;
                if (get_sub(&vv, &s) != 0)
                    goto bad;
                name = s.p;
                name_len = (size_t)(s.end - s.p);
            } else if (key == ((2 << 3) | 0)) {
                if (get_varint(&vv, &version) != 0)
                    goto bad;
            } else if (key == ((3 << 3) | 2)) {
                struct cur t;
                if (get_sub(&vv, &t) != 0)
                    goto bad;
                while (t.p < t.end) {
                    if (get_varint(&t, &key) != 0)
                        goto bad;
                    if (key == ((3 << 3) | 2)) {
                        struct cur s;
                        if (get_sub(&t, &s) != 0)
                            goto bad;
                        data = s.p;
                        data_len = (size_t)(s.end - s.p);
                    } else if (skip(&t, (int)(key & 7)) != 0) {
                        goto bad;
                    }
                }
            } else if (skip(&vv, (int)(key & 7)) != 0) {
                goto bad;
            }
        }
        ps_client_item *it = &items[k];
        if (name_len != strlen(it->name) || memcmp(name, it->name, name_len) != 0) {
            snprintf(err, errlen, "Pull: value %zu is '%.*s', expected '%s'", k,
                     (int)name_len, name ? (const char *)name : "", it->name);
            return PS_EPARSE;
        }
        if (data_len != it->n * sizeof(float)) {
            snprintf(err, errlen, "variable '%s' has %zu elements on the server, "
                     "the model expects %zu", it->name, data_len / sizeof(float),
                     it->n);
            return PS_ESHAPE;
        }
        memcpy(it->data, data, data_len);
        it->version = version;
        k++;
    }
    if (k != n) {
        snprintf(err, errlen, "Pull: %zu values for %zu items", k, n);
        return PS_EPARSE;
    }
    return 0;
bad:
    snprintf(err, errlen, "Pull: the response does not parse");
    return PS_EPARSE;
}

int ps_client_pull(ps_client *c, ps_client_item *items, size_t n,
                   int deadline_ms, ps_rpc_status *st)
{
    int rc = encode_pull(&c->req, items, n);
    if (rc != 0)
        return rc;
    rc = ps_rpc_invoke(c->rpc, "/ps.v1.ParameterServer/Pull", c->req.data,
                       c->req.len, &c->resp, deadline_ms, st);
    if (rc != 0)
        return rc;
    char err[256];
    rc = ps_pull_decode(c->resp.data, c->resp.len, items, n, err, sizeof err);
    if (rc != 0 && st != NULL) {
        st->code = rc == PS_ESHAPE ? PS_RPC_FAILED_PRECONDITION : PS_RPC_INTERNAL;
        snprintf(st->message, sizeof st->message, "%s", err);
    }
    return rc;
}
