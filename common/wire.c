#include "common/wire.h"

#include "common/buf.h"
#include "common/errors.h"
#include "proto/ps.pb-c.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the cursor --------------------------------------------------------- */

/* Parsing walks a ps_wire_bytes as a cursor over the message: a
 * sub-message's cursor is a copy with a shorter `left`. Every function here
 * returns 0, or -1 when the bytes end early or do not parse (the cursor is
 * then in no useful state). */

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

typedef ps_wire_bytes cursor;

#define KEY(field, wt) ((uint64_t)(((field) << 3) | (wt)))

void ps_wire_bytes_init(ps_wire_bytes *b, const struct ps_piece *pieces, int np)
{
    size_t total = 0;
    for (int i = 0; i < np; i++)
        total += pieces[i].len;
    *b = (ps_wire_bytes){pieces, np, 0, 0, total};
}

/* Moves past exhausted pieces; false when none is left. */
/* arr (n used of *cap elements of size bytes) with room for one more,
 * doubling from first: arr itself, a new block, or NULL when out of memory
 * (arr and *cap as they were). */
static int settle(cursor *c)
{
    while (c->i < c->np && c->off == c->p[c->i].len) {
        c->i++;
        c->off = 0;
    }
    return c->i < c->np;
}

static int get_varint(cursor *c, uint64_t *out)
{
    /* Most varints lie whole inside one piece and the field: read them
     * from the piece with no check per byte (a sparse call's ids, 5-byte
     * varints, 8192 a call, were 10% of psd's time in bench/sparse's
     * in-RAM pulls). Nine or ten bytes, or too near the end: the byte loop. */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (c->left >= 8 && c->i < c->np && c->p[c->i].len - c->off >= 8) {
        const uint8_t *p = c->p[c->i].data + c->off;
        uint64_t x;
        memcpy(&x, p, sizeof x); /* little-endian: the first byte lowest */
        uint64_t stops = ~x & 0x8080808080808080ull;
        if (stops != 0) { /* at most 8 bytes, all in the field: no branch on each */
            int len = __builtin_ctzll(stops) / 8 + 1;
            x &= len == 8 ? ~0ull : (1ull << (8 * len)) - 1;
            x = ((x & 0x7f007f007f007f00ull) >> 1) | (x & 0x007f007f007f007full);
            x = ((x & 0x3fff00003fff0000ull) >> 2) | (x & 0x00003fff00003fffull);
            x = ((x & 0x0fffffff00000000ull) >> 4) | (x & 0x000000000fffffffull);
            c->off += (size_t)len;
            c->left -= (size_t)len;
            *out = x;
            return 0;
        }
    }
#endif
    uint64_t v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (c->left == 0 || !settle(c))
            return -1;
        uint8_t b = c->p[c->i].data[c->off++];
        c->left--;
        v |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A bool: true when any payload bit of the varint is set (a varint longer
 * than 64 bits reads as protobuf-c reads it, not truncated to zero). */
static int get_bool(cursor *c, int *out)
{
    int any = 0;
    for (int i = 0; i < 10; i++) {
        if (c->left == 0 || !settle(c))
            return -1;
        uint8_t b = c->p[c->i].data[c->off++];
        c->left--;
        any |= (b & 0x7f) != 0;
        if (!(b & 0x80)) {
            *out = any;
            return 0;
        }
    }
    return -1;
}

int ps_wire_bytes_take(ps_wire_bytes *c, void *dst, size_t n)
{
    if (n > c->left)
        return -1;
    c->left -= n;
    uint8_t *d = dst;
    while (n > 0) {
        if (!settle(c))
            return -1;
        size_t avail = c->p[c->i].len - c->off;
        size_t k = avail < n ? avail : n;
        if (d != NULL) {
            memcpy(d, c->p[c->i].data + c->off, k);
            d += k;
        }
        c->off += k;
        n -= k;
    }
    return 0;
}

size_t ps_wire_bytes_peek(ps_wire_bytes *c, const uint8_t **p)
{
    if (c->left == 0 || !settle(c))
        return 0;
    size_t avail = c->p[c->i].len - c->off;
    *p = c->p[c->i].data + c->off;
    return avail < c->left ? avail : c->left;
}

/* Reads a length prefix and makes *sub a cursor over that many bytes; the
 * parent moves past them. */
static int get_sub(cursor *c, cursor *sub)
{
    uint64_t len;
    if (get_varint(c, &len) != 0 || len > c->left)
        return -1;
    *sub = *c;
    sub->left = (size_t)len;
    return ps_wire_bytes_take(c, NULL, (size_t)len);
}

/* A field's key, split into its number and wire type. Returns 0, or -1
 * when the varint is cut short. */
static int get_key(cursor *c, int *field, int *wt)
{
    uint64_t key;
    if (get_varint(c, &key) != 0)
        return -1;
    *field = (int)(key >> 3);
    *wt = (int)(key & 7);
    return 0;
}

/* Skips the value of one field of wire type wt (groups are refused). */
static int skip_field(cursor *c, int wt)
{
    uint64_t v;
    cursor s;
    switch (wt) {
    case WT_VARINT: return get_varint(c, &v);
    case WT_I64: return ps_wire_bytes_take(c, NULL, 8);
    case WT_I32: return ps_wire_bytes_take(c, NULL, 4);
    case WT_LEN: return get_sub(c, &s);
    default: return -1;
    }
}

/* A string field's first cap - 1 bytes into buf, NUL-terminated, and its
 * length on the wire in *len. */
static int get_name(cursor *c, char *buf, size_t cap, size_t *len)
{
    cursor s;
    if (get_sub(c, &s) != 0)
        return -1;
    *len = s.left;
    size_t keep = s.left < cap - 1 ? s.left : cap - 1;
    if (ps_wire_bytes_take(&s, buf, keep) != 0)
        return -1;
    buf[keep] = '\0';
    return 0;
}

/* ---- writing ------------------------------------------------------------ */

uint8_t *ps_wire_put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

size_t ps_wire_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

void ps_wire_put_varint_fixed(uint8_t *p, uint64_t v, int width)
{
    for (int i = 0; i < width - 1; i++) {
        *p++ = (uint8_t)((v & 0x7f) | 0x80);
        v >>= 7;
    }
    *p = (uint8_t)(v & 0x7f);
}

/* A field's tag and length; the length of a field with len bytes of
 * contents, tag included. */
static uint8_t *put_len_tag(uint8_t *p, int field, uint64_t len)
{
    *p++ = (uint8_t)KEY(field, WT_LEN);
    return ps_wire_put_varint(p, len);
}

static size_t field_len(size_t len)
{
    return 1 + ps_wire_varint_len(len) + len;
}

static uint8_t *put_bytes(uint8_t *p, int field, const void *data, size_t len)
{
    p = put_len_tag(p, field, len);
    memcpy(p, data, len);
    return p + len;
}

/* Packed int64 shape: the bytes of its contents; the field at p. */
static size_t shape_len(const int64_t *shape, int ndim)
{
    size_t n = 0;
    for (int d = 0; d < ndim; d++)
        n += ps_wire_varint_len((uint64_t)shape[d]);
    return n;
}

static uint8_t *put_shape(uint8_t *p, const int64_t *shape, int ndim)
{
    p = put_len_tag(p, 2, shape_len(shape, ndim));
    for (int d = 0; d < ndim; d++)
        p = ps_wire_put_varint(p, (uint64_t)shape[d]);
    return p;
}

/* ---- ShmRef --------------------------------------------------------------- */

size_t ps_wire_shm_ref_len(const char *name, uint64_t offset, uint64_t length)
{
    return field_len(strlen(name)) + (offset ? 1 + ps_wire_varint_len(offset) : 0) +
           (length ? 1 + ps_wire_varint_len(length) : 0);
}

uint8_t *ps_wire_shm_ref_put(uint8_t *p, int field, const char *name,
                             uint64_t offset, uint64_t length)
{
    p = put_len_tag(p, field, ps_wire_shm_ref_len(name, offset, length));
    p = put_bytes(p, 1, name, strlen(name));
    if (offset) {
        *p++ = KEY(2, WT_VARINT);
        p = ps_wire_put_varint(p, offset);
    }
    if (length) {
        *p++ = KEY(3, WT_VARINT);
        p = ps_wire_put_varint(p, length);
    }
    return p;
}

/* A ShmRef's contents, which the cursor covers (and which it consumes). */
static const char *read_shm_ref(cursor *c, ps_wire_shm_ref *ref)
{
    memset(ref, 0, sizeof *ref);
    ref->set = 1;
    while (c->left > 0) {
        int field, wt;
        if (get_key(c, &field, &wt) != 0)
            return "ShmRef: truncated field key";
        if (field == 1 && wt == WT_LEN) {
            if (get_name(c, ref->name, sizeof ref->name, &ref->name_len) != 0)
                return "ShmRef.name: length past the end";
        } else if (field == 2 && wt == WT_VARINT) {
            if (get_varint(c, &ref->offset) != 0)
                return "ShmRef.offset: truncated varint";
        } else if (field == 3 && wt == WT_VARINT) {
            if (get_varint(c, &ref->length) != 0)
                return "ShmRef.length: truncated varint";
        } else if (skip_field(c, wt) != 0) {
            return "ShmRef: malformed unknown field";
        }
    }
    return NULL;
}

const char *ps_wire_shm_ref_decode(const uint8_t *buf, size_t len,
                                   ps_wire_shm_ref *ref)
{
    struct ps_piece one = {buf, len};
    cursor c;
    ps_wire_bytes_init(&c, &one, 1);
    return read_shm_ref(&c, ref);
}

/* ---- PushRequest: decoding ------------------------------------------------ */

static void add_dim(ps_wire_grad *g, uint64_t d)
{
    if (g->ndim < 0)
        return;
    if (g->ndim >= PS_WIRE_MAX_DIMS) {
        g->ndim = -1;
        return;
    }
    g->shape[g->ndim++] = (int64_t)d;
}

static const char *read_tensor(cursor *c, ps_wire_grad *g)
{
    while (c->left > 0) {
        uint64_t v;
        cursor s;
        int field, wt;
        if (get_key(c, &field, &wt) != 0)
            return "Tensor: truncated field key";
        if (field == 1 && wt == WT_VARINT) {
            if (get_varint(c, &v) != 0)
                return "Tensor.dtype: truncated varint";
            g->dtype = v > 1000 ? 1000 : (int)v;
        } else if (field == 2 && wt == WT_LEN) { /* packed */
            if (get_sub(c, &s) != 0)
                return "Tensor.shape: length past the end";
            while (s.left > 0) {
                if (get_varint(&s, &v) != 0)
                    return "Tensor.shape: truncated varint";
                add_dim(g, v);
            }
        } else if (field == 2 && wt == WT_VARINT) { /* unpacked */
            if (get_varint(c, &v) != 0)
                return "Tensor.shape: truncated varint";
            add_dim(g, v);
        } else if (field == 3 && wt == WT_LEN) {
            if (get_sub(c, &s) != 0)
                return "Tensor.data: length past the end";
            g->data = s;
            g->nbytes = s.left;
            g->has_data = 1;
        } else if (field == 4 && wt == WT_LEN) {
            if (get_sub(c, &s) != 0)
                return "Tensor.shm: length past the end";
            const char *why = read_shm_ref(&s, &g->shm);
            if (why != NULL)
                return why;
        } else if (skip_field(c, wt) != 0) {
            return "Tensor: malformed unknown field";
        }
    }
    return NULL;
}

static const char *read_grad(cursor *c, ps_wire_grad *g)
{
    while (c->left > 0) {
        cursor s;
        const char *why = NULL;
        int field, wt;
        if (get_key(c, &field, &wt) != 0)
            return "Gradient: truncated field key";
        if (field == 1 && wt == WT_LEN) {
            /* Up to 255 bytes are kept; name_len says how long it was, so
             * the caller can refuse a longer one by name. */
            if (get_name(c, g->name, sizeof g->name, &g->name_len) != 0)
                return "Gradient.name: length past the end";
        } else if (field == 2 && wt == WT_LEN) {
            if (get_sub(c, &s) != 0)
                return "Gradient.grad: length past the end";
            /* A repeated embedded message merges; the last one wins here,
             * which matches for the fields we read. */
            g->has_tensor = 1;
            why = read_tensor(&s, g);
        } else if (field == 3 && wt == WT_LEN) {
            if (get_sub(c, &s) != 0)
                return "Gradient.value_into: length past the end";
            why = read_shm_ref(&s, &g->value_into);
        } else if ((field == 4 || field == 5) && wt == WT_VARINT) {
            if (get_varint(c, field == 4 ? &g->offset : &g->total) != 0)
                return field == 4 ? "Gradient.offset: truncated varint"
                                  : "Gradient.total: truncated varint";
        } else if (skip_field(c, wt) != 0) {
            return "Gradient: malformed unknown field";
        }
        if (why != NULL)
            return why;
    }
    return NULL;
}

/* PushRequest.grads[req->ngrads]: the field's bytes in c. */
static int read_push_grad(cursor *c, ps_wire_push *req, char *err, size_t errlen)
{
    cursor s;
    if (get_sub(c, &s) != 0)
        return ps_errf(PS_EPARSE, err, errlen,
                       "PushRequest.grads[%zu]: length past the end of the message",
                       req->ngrads);
    ps_wire_grad *grads = ps_grow(req->grads, &req->cap, req->ngrads, sizeof *grads, 8);
    if (grads == NULL)
        return -ENOMEM;
    req->grads = grads;
    ps_wire_grad *g = &req->grads[req->ngrads];
    memset(g, 0, sizeof *g);
    const char *why = read_grad(&s, g);
    if (why != NULL)
        return ps_errf(PS_EPARSE, err, errlen, "PushRequest.grads[%zu]: %s", req->ngrads,
                       why);
    req->ngrads++;
    return 0;
}

/* The top-level loop of a request's decoder, msg its message's name: the
 * key of the field at byte *at (total less what is left). Returns 0, or
 * PS_EPARSE with err naming the byte. */
static int read_key(cursor *c, size_t total, const char *msg, size_t *at, int *field,
                    int *wt, char *err, size_t errlen)
{
    *at = total - c->left;
    if (get_key(c, field, wt) != 0)
        return ps_errf(PS_EPARSE, err, errlen, "%s: truncated field key at byte %zu", msg,
                       *at);
    return 0;
}

/* Where that loop stops: a field it cannot read or skip (rc 0), or one whose
 * varint was cut short (rc not 0). Returns PS_EPARSE, err naming the byte. */
static int bad_field(int rc, const char *msg, int field, int wt, size_t at, char *err,
                     size_t errlen)
{
    if (rc != 0)
        return ps_errf(PS_EPARSE, err, errlen, "%s: truncated varint at byte %zu", msg, at);
    return ps_errf(PS_EPARSE, err, errlen, "%s: malformed field %d (wire type %d) at byte %zu",
                   msg, field, wt, at);
}

int ps_wire_push_decode(const struct ps_piece *pieces, int np, ps_wire_push *req,
                        char *err, size_t errlen)
{
    cursor c;
    ps_wire_bytes_init(&c, pieces, np);
    size_t total = c.left;
    /* Every field unset but the array kept for reuse (and one, which
     * pieces may be). */
    *req = (ps_wire_push){.grads = req->grads, .cap = req->cap, .one = req->one};
    while (c.left > 0) {
        size_t at;
        uint64_t v = 0;
        int field = 0, wt = 0;
        int rc = read_key(&c, total, "PushRequest", &at, &field, &wt, err, errlen);
        if (rc != 0)
            return rc;
        if (field == 1 && wt == WT_VARINT) {
            rc = get_varint(&c, &v);
            req->worker = (uint32_t)v;
        } else if (field == 2 && wt == WT_VARINT) {
            rc = get_varint(&c, &req->step);
        } else if (field == 4 && wt == WT_VARINT) {
            rc = get_bool(&c, &req->return_values);
        } else if (field == 5 && wt == WT_VARINT) {
            rc = get_bool(&c, &req->delta);
        } else if (field == 6 && wt == WT_VARINT) {
            rc = get_varint(&c, &v);
            req->wire_dtype = v > 1000 ? 1000 : (int)v;
        } else if (field == 3 && wt == WT_LEN) {
            if ((rc = read_push_grad(&c, req, err, errlen)) != 0)
                return rc;
        } else if (field == 0 || skip_field(&c, wt) != 0) {
            return bad_field(0, "PushRequest", field, wt, at, err, errlen);
        }
        if (rc != 0)
            return bad_field(rc, "PushRequest", field, wt, at, err, errlen);
    }
    return 0;
}

int ps_wire_push_decode_buf(const uint8_t *buf, size_t len, ps_wire_push *req,
                            char *err, size_t errlen)
{
    req->one = (struct ps_piece){buf, len};
    return ps_wire_push_decode(&req->one, 1, req, err, errlen);
}

void ps_wire_push_free(ps_wire_push *req)
{
    free(req->grads);
    req->grads = NULL;
    req->cap = req->ngrads = 0;
}

/* ---- SparsePullRequest / SparsePushRequest -------------------------------- */

/* Appends v to *arr (n used of *cap). */
static int sparse_id(int64_t **arr, size_t *n, size_t *cap, uint64_t v)
{
    int64_t *ids = ps_grow(*arr, cap, *n, sizeof *ids, 256);
    if (ids == NULL)
        return -ENOMEM;
    *arr = ids;
    ids[(*n)++] = (int64_t)v;
    return 0;
}

/* A repeated int64 field of an item, packed (wt WT_LEN) or one varint,
 * appended to *arr (*n used of *cap) and counted in *count. NULL, or what
 * is wrong: past or cut (the field's own words), or "out of memory" with
 * *rc -ENOMEM. */
static const char *read_ids(cursor *c, int wt, const char *past, const char *cut,
                            int64_t **arr, size_t *n, size_t *cap, size_t *count, int *rc)
{
    cursor s;
    uint64_t v;
    int one = wt == WT_VARINT;
    if (!one && get_sub(c, &s) != 0)
        return past;
    cursor *r = one ? c : &s;
    /* Packed, any number of varints: none is valid too (protobuf-c and
     * every parser accept an empty packed field). */
    while (one || s.left > 0) {
        if (get_varint(r, &v) != 0)
            return cut;
        if ((*rc = sparse_id(arr, n, cap, v)) != 0)
            return "out of memory";
        (*count)++;
        if (one)
            break;
    }
    return NULL;
}

/* A SparsePullItem or SparseGradient: name 1, ids 2, (gradient) grad 3,
 * next_ids 4 (the hint of the next call's ids, both).
 * Returns NULL, or what is wrong; *rc -ENOMEM when out of memory. */
static const char *read_sparse_item(cursor *c, bool push, ps_wire_sparse *req,
                                    ps_wire_sparse_item *it, int *rc)
{
    while (c->left > 0) {
        uint64_t v;
        cursor s;
        int field, wt;
        if (get_key(c, &field, &wt) != 0)
            return push ? "SparseGradient: truncated field key"
                        : "SparsePullItem: truncated field key";
        if (field == 1 && wt == WT_LEN) {
            if (get_name(c, it->g.name, sizeof it->g.name, &it->g.name_len) != 0)
                return push ? "SparseGradient.name: length past the end"
                            : "SparsePullItem.name: length past the end";
        } else if ((field == 2 || field == 4) && (wt == WT_LEN || wt == WT_VARINT)) {
            /* ids, or next_ids: each into its own array of the request. */
            static const char *const why_of[2][2][2] = {
                {{"SparsePullItem.ids: length past the end",
                  "SparsePullItem.ids: truncated varint"},
                 {"SparsePullItem.next_ids: length past the end",
                  "SparsePullItem.next_ids: truncated varint"}},
                {{"SparseGradient.ids: length past the end",
                  "SparseGradient.ids: truncated varint"},
                 {"SparseGradient.next_ids: length past the end",
                  "SparseGradient.next_ids: truncated varint"}}};
            bool nx = field == 4;
            const char *const *w = why_of[push][nx];
            const char *why = nx ? read_ids(c, wt, w[0], w[1], &req->next, &req->nnext,
                                            &req->nextcap, &it->nnext, rc)
                                 : read_ids(c, wt, w[0], w[1], &req->ids, &req->nids,
                                            &req->idcap, &it->nids, rc);
            if (why != NULL)
                return why;
        } else if (!push && field == 3 && wt == WT_VARINT) {
            if (get_varint(c, &v) != 0)
                return "SparsePullItem.dtype: truncated varint";
            it->g.dtype = v > 1000 ? 1000 : (int)v; /* the answer's dtype */
        } else if (push && field == 3 && wt == WT_LEN) {
            if (get_sub(c, &s) != 0)
                return "SparseGradient.grad: length past the end";
            it->g.has_tensor = 1;
            const char *why = read_tensor(&s, &it->g);
            if (why != NULL)
                return why;
        } else if (skip_field(c, wt) != 0) {
            return push ? "SparseGradient: malformed unknown field"
                        : "SparsePullItem: malformed unknown field";
        }
    }
    return NULL;
}

static int read_sparse_items(cursor *c, bool push, ps_wire_sparse *req, char *err,
                             size_t errlen)
{
    const char *what = push ? "SparsePushRequest.grads" : "SparsePullRequest.items";
    cursor s;
    if (get_sub(c, &s) != 0)
        return ps_errf(PS_EPARSE, err, errlen, "%s[%zu]: length past the end of the message",
                       what, req->nitems);
    ps_wire_sparse_item *items = ps_grow(req->items, &req->cap, req->nitems, sizeof *items, 8);
    if (items == NULL)
        return -ENOMEM;
    req->items = items;
    ps_wire_sparse_item *it = &req->items[req->nitems];
    memset(it, 0, sizeof *it);
    it->ids_at = req->nids;
    it->next_at = req->nnext;
    int rc = 0;
    const char *why = read_sparse_item(&s, push, req, it, &rc);
    if (rc != 0)
        return rc;
    if (why != NULL)
        return ps_errf(PS_EPARSE, err, errlen, "%s[%zu]: %s", what, req->nitems, why);
    req->nitems++;
    return 0;
}

int ps_wire_sparse_decode(const uint8_t *buf, size_t len, bool push, ps_wire_sparse *req,
                          char *err, size_t errlen)
{
    const char *msg = push ? "SparsePushRequest" : "SparsePullRequest";
    /* Every field unset but the arrays kept for reuse. */
    *req = (ps_wire_sparse){.items = req->items, .cap = req->cap, .ids = req->ids,
                            .idcap = req->idcap, .next = req->next,
                            .nextcap = req->nextcap, .one = {buf, len}};
    cursor c;
    ps_wire_bytes_init(&c, &req->one, 1);
    while (c.left > 0) {
        size_t at;
        uint64_t v = 0;
        int field = 0, wt = 0, rc = read_key(&c, len, msg, &at, &field, &wt, err, errlen);
        if (rc != 0)
            return rc;
        bool items = push ? field == 3 : field == 1;
        if (items && wt == WT_LEN) {
            if ((rc = read_sparse_items(&c, push, req, err, errlen)) != 0)
                return rc;
        } else if (push && field == 1 && wt == WT_VARINT) {
            rc = get_varint(&c, &v);
            req->worker = (uint32_t)v;
        } else if (push && field == 2 && wt == WT_VARINT) {
            rc = get_varint(&c, &req->step);
        } else if (push && field == 4 && wt == WT_VARINT) {
            rc = get_bool(&c, &req->return_values);
        } else if (push && field == 5 && wt == WT_VARINT) {
            rc = get_varint(&c, &v);
            req->wire_dtype = v > 1000 ? 1000 : (int)v;
        } else if (field == 0 || skip_field(&c, wt) != 0) {
            return bad_field(0, msg, field, wt, at, err, errlen);
        }
        if (rc != 0)
            return bad_field(rc, msg, field, wt, at, err, errlen);
    }
    /* The arrays have stopped moving (NULL while nothing was put in one:
     * no offset is added to it). */
    for (size_t i = 0; i < req->nitems; i++) {
        ps_wire_sparse_item *it = &req->items[i];
        it->ids = req->ids ? req->ids + it->ids_at : NULL;
        it->next_ids = req->next ? req->next + it->next_at : NULL;
    }
    return 0;
}

void ps_wire_sparse_free(ps_wire_sparse *req)
{
    free(req->items);
    free(req->ids);
    free(req->next);
    req->items = NULL;
    req->ids = req->next = NULL;
    req->cap = req->nitems = req->idcap = req->nids = req->nextcap = req->nnext = 0;
}


/* ---- PushRequest: encoding ------------------------------------------------ */

/* The contents of a gradient's Tensor, and of the Gradient. */
static size_t tensor_len(const ps_wire_grad_out *g)
{
    size_t n = 0;
    if (g->dtype || g->dtype_pad)
        n += 1 + ps_wire_varint_len((uint64_t)g->dtype) + (size_t)g->dtype_pad;
    if (g->ndim > 0)
        n += field_len(shape_len(g->shape, g->ndim));
    if (g->nbytes > 0)
        n += field_len(g->nbytes);
    if (g->shm != NULL)
        n += field_len(ps_wire_shm_ref_len(g->shm->name, g->shm->offset, g->shm->length));
    return n;
}

static size_t grad_len(const ps_wire_grad_out *g)
{
    size_t nl = strlen(g->name), n = field_len(tensor_len(g));
    if (nl > 0)
        n += field_len(nl);
    if (g->value_into != NULL)
        n += field_len(ps_wire_shm_ref_len(g->value_into->name, g->value_into->offset,
                                           g->value_into->length));
    if (g->offset)
        n += 1 + ps_wire_varint_len(g->offset);
    if (g->total)
        n += 1 + ps_wire_varint_len(g->total);
    return n;
}

size_t ps_wire_push_step_at(const ps_wire_push_out *m)
{
    return m->worker ? 2 + ps_wire_varint_len(m->worker) : 1;
}

size_t ps_wire_push_len(const ps_wire_push_out *m)
{
    size_t n = m->worker ? 1 + ps_wire_varint_len(m->worker) : 0;
    if (m->step_width > 0)
        n += 1 + (size_t)m->step_width;
    else if (m->step)
        n += 1 + ps_wire_varint_len(m->step);
    for (size_t i = 0; i < m->ngrads; i++)
        n += field_len(grad_len(&m->grads[i]));
    return n + (m->return_values ? 2 : 0) + (m->delta ? 2 : 0) + (m->wire_dtype ? 2 : 0);
}

/* A dtype varint made `pad` bytes longer (0x81 0x80.. 0x00 for 1). */
static uint8_t *put_dtype(uint8_t *p, int dtype, int pad)
{
    *p++ = KEY(1, WT_VARINT);
    if (pad == 0)
        return ps_wire_put_varint(p, (uint64_t)dtype);
    int width = (int)ps_wire_varint_len((uint64_t)dtype) + pad;
    ps_wire_put_varint_fixed(p, (uint64_t)dtype, width);
    return p + width;
}

static uint8_t *put_grad(uint8_t *p, const ps_wire_grad_out *g)
{
    size_t nl = strlen(g->name);
    p = put_len_tag(p, 3, grad_len(g));
    if (nl > 0)
        p = put_bytes(p, 1, g->name, nl);
    p = put_len_tag(p, 2, tensor_len(g));
    if (g->dtype || g->dtype_pad)
        p = put_dtype(p, g->dtype, g->dtype_pad);
    if (g->ndim > 0)
        p = put_shape(p, g->shape, g->ndim);
    if (g->nbytes > 0) {
        p = put_len_tag(p, 3, g->nbytes);
        if (g->data == NULL && g->data_at != NULL) {
            *g->data_at = p; /* the caller writes them there */
        } else if (g->data == NULL) {
            return p; /* the caller's bytes follow */
        } else {
            memcpy(p, g->data, g->nbytes);
        }
        p += g->nbytes;
    }
    if (g->shm != NULL)
        p = ps_wire_shm_ref_put(p, 4, g->shm->name, g->shm->offset, g->shm->length);
    if (g->value_into != NULL)
        p = ps_wire_shm_ref_put(p, 3, g->value_into->name, g->value_into->offset,
                                g->value_into->length);
    if (g->offset) {
        *p++ = KEY(4, WT_VARINT);
        p = ps_wire_put_varint(p, g->offset);
    }
    if (g->total) {
        *p++ = KEY(5, WT_VARINT);
        p = ps_wire_put_varint(p, g->total);
    }
    return p;
}

uint8_t *ps_wire_push_put(uint8_t *p, const ps_wire_push_out *m)
{
    if (m->worker) {
        *p++ = KEY(1, WT_VARINT);
        p = ps_wire_put_varint(p, m->worker);
    }
    if (m->step_width > 0) {
        *p++ = KEY(2, WT_VARINT);
        ps_wire_put_varint_fixed(p, m->step, m->step_width);
        p += m->step_width;
    } else if (m->step) {
        *p++ = KEY(2, WT_VARINT);
        p = ps_wire_put_varint(p, m->step);
    }
    for (size_t i = 0; i < m->ngrads; i++)
        p = put_grad(p, &m->grads[i]);
    if (m->return_values) {
        *p++ = KEY(4, WT_VARINT);
        *p++ = 1;
    }
    if (m->delta) {
        *p++ = KEY(5, WT_VARINT);
        *p++ = 1;
    }
    if (m->wire_dtype) {
        *p++ = KEY(6, WT_VARINT);
        *p++ = (uint8_t)m->wire_dtype;
    }
    return p;
}

/* ---- PullResponse / PushResponse: encoding --------------------------------- */

uint8_t *ps_wire_value_header(uint8_t *p, int field, const char *name,
                              uint64_t version, const int64_t *shape, int ndim,
                              size_t nbytes, const ps_wire_shm_ref *into)
{
    return ps_wire_value_header_dtype(p, field, name, version, shape, ndim, nbytes,
                                      into, PS__V1__DTYPE__DTYPE_FLOAT32);
}

uint8_t *ps_wire_value_header_dtype(uint8_t *p, int field, const char *name,
                                    uint64_t version, const int64_t *shape, int ndim,
                                    size_t nbytes, const ps_wire_shm_ref *into,
                                    int dtype)
{
    size_t sl = shape_len(shape, ndim);
    size_t into_len = into ? ps_wire_shm_ref_len(into->name, into->offset, into->length) : 0;
    size_t tl = 2 + (ndim ? field_len(sl) : 0) +
                (into ? field_len(into_len) : nbytes ? field_len(nbytes) : 0);
    size_t name_len = strlen(name);
    size_t vv_len = field_len(name_len) +
                    (version ? 1 + ps_wire_varint_len(version) : 0) + field_len(tl);
    p = put_len_tag(p, field, vv_len); /* PullResponse or PushResponse .values */
    p = put_bytes(p, 1, name, name_len); /* VariableValue.name */
    if (version) {
        *p++ = KEY(2, WT_VARINT); /* VariableValue.version */
        p = ps_wire_put_varint(p, version);
    }
    p = put_len_tag(p, 3, tl); /* VariableValue.value */
    *p++ = KEY(1, WT_VARINT); /* Tensor.dtype */
    *p++ = (uint8_t)dtype;
    if (ndim)
        p = put_shape(p, shape, ndim);
    if (into != NULL) /* Tensor.shm: where the bytes went */
        p = ps_wire_shm_ref_put(p, 4, into->name, into->offset, into->length);
    else if (nbytes)
        p = put_len_tag(p, 3, nbytes); /* Tensor.data */
    return p;
}

size_t ps_wire_versions_len(const uint64_t *versions, size_t n)
{
    size_t vlen = 0;
    for (size_t i = 0; i < n; i++)
        vlen += ps_wire_varint_len(versions[i]);
    return field_len(vlen);
}

uint8_t *ps_wire_versions_put(uint8_t *p, const uint64_t *versions, size_t n)
{
    size_t vlen = 0;
    for (size_t i = 0; i < n; i++)
        vlen += ps_wire_varint_len(versions[i]);
    p = put_len_tag(p, 1, vlen);
    for (size_t i = 0; i < n; i++)
        p = ps_wire_put_varint(p, versions[i]);
    return p;
}

/* ---- PullResponse / PushResponse: decoding --------------------------------- */

/* The decoder's state, for the helpers below. BAD: the bytes do not
 * parse (the caller says so). */
enum { BAD = 1 }; /* the callback's codes are negative */

struct values_walk {
    ps_wire_value_fn fn;
    void *ctx;
    char *err;
    size_t errlen;
};

/* A value's Tensor, handing its data and shm to the callback as met. */
static int read_value_tensor(cursor *t, ps_wire_value *v, struct values_walk *w)
{
    while (t->left > 0) {
        uint64_t key;
        cursor s;
        if (get_varint(t, &key) != 0)
            return BAD;
        if (key == KEY(1, WT_VARINT)) {
            uint64_t d;
            if (get_varint(t, &d) != 0)
                return BAD;
            v->dtype = d > 1000 ? 1000 : (int)d;
        } else if (key == KEY(3, WT_LEN)) {
            if (get_sub(t, &v->data) != 0)
                return BAD;
            int rc = w->fn(w->ctx, PS_WIRE_DATA, v, w->err, w->errlen);
            if (rc != 0)
                return rc;
        } else if (key == KEY(4, WT_LEN)) {
            if (get_sub(t, &s) != 0 || read_shm_ref(&s, &v->shm) != NULL)
                return BAD;
            int rc = w->fn(w->ctx, PS_WIRE_SHM, v, w->err, w->errlen);
            if (rc != 0)
                return rc;
        } else if (skip_field(t, (int)(key & 7)) != 0) {
            return BAD;
        }
    }
    return 0;
}

/* One VariableValue, whose bytes vv covers. */
static int read_value(cursor *vv, ps_wire_value *v, struct values_walk *w)
{
    v->name[0] = '\0';
    v->name_len = 0;
    v->version = 0;
    v->dtype = 0;
    while (vv->left > 0) {
        uint64_t key;
        cursor s;
        if (get_varint(vv, &key) != 0)
            return BAD;
        if (key == KEY(1, WT_LEN)) {
            if (get_sub(vv, &s) != 0 || s.left >= sizeof v->name)
                return BAD;
            v->name_len = s.left;
            if (ps_wire_bytes_take(&s, v->name, v->name_len) != 0)
                return BAD;
            v->name[v->name_len] = '\0';
        } else if (key == KEY(2, WT_VARINT)) {
            if (get_varint(vv, &v->version) != 0)
                return BAD;
        } else if (key == KEY(3, WT_LEN)) {
            int rc = get_sub(vv, &s) != 0 ? BAD : read_value_tensor(&s, v, w);
            if (rc != 0)
                return rc;
        } else if (skip_field(vv, (int)(key & 7)) != 0) {
            return BAD;
        }
    }
    return w->fn(w->ctx, PS_WIRE_END, v, w->err, w->errlen);
}

/* PushResponse.versions, packed or not, into versions[*kv...]. */
static int read_versions(cursor *c, uint64_t key, uint64_t *versions,
                         size_t nversions, size_t *kv)
{
    cursor vs;
    uint64_t v;
    if (key == KEY(1, WT_VARINT)) {
        if (get_varint(c, &v) != 0 || *kv >= nversions)
            return BAD;
        versions[(*kv)++] = v;
        return 0;
    }
    if (get_sub(c, &vs) != 0)
        return BAD;
    while (vs.left > 0) {
        if (get_varint(&vs, &v) != 0 || *kv >= nversions)
            return BAD;
        versions[(*kv)++] = v;
    }
    return 0;
}

int ps_wire_values_decode(const struct ps_piece *pieces, int np, bool push,
                          size_t nvalues, uint64_t *versions, size_t nversions,
                          ps_wire_value_fn fn, void *ctx, char *err, size_t errlen)
{
    struct values_walk w = {fn, ctx, err, errlen};
    const char *what = push ? "Push" : "Pull";
    const uint64_t values_key = KEY(push ? 2 : 1, WT_LEN);
    cursor c;
    ps_wire_bytes_init(&c, pieces, np);
    ps_wire_value v;
    size_t k = 0, kv = 0;
    int rc = 0;
    while (c.left > 0 && rc == 0) {
        uint64_t key;
        cursor vv;
        if (get_varint(&c, &key) != 0) {
            rc = BAD;
        } else if (push && (key == KEY(1, WT_LEN) || key == KEY(1, WT_VARINT))) {
            rc = read_versions(&c, key, versions, nversions, &kv);
        } else if (key != values_key) {
            rc = skip_field(&c, (int)(key & 7)) != 0 ? BAD : 0;
        } else if (get_sub(&c, &vv) != 0) {
            rc = BAD;
        } else if (k >= nvalues) {
            snprintf(err, errlen, "%s: more values than requested", what);
            return PS_EPARSE;
        } else {
            v.index = k++;
            rc = read_value(&vv, &v, &w);
        }
    }
    if (rc == BAD) {
        snprintf(err, errlen, "%s: the response does not parse", what);
        return PS_EPARSE;
    }
    if (rc != 0)
        return rc;
    if (k != nvalues) {
        snprintf(err, errlen, "%s: %zu values for %zu items", what, k, nvalues);
        return PS_EPARSE;
    }
    if (push && kv != nversions) {
        snprintf(err, errlen, "Push: %zu versions for %zu gradients", kv, nversions);
        return PS_EPARSE;
    }
    return 0;
}

/* ---- strings with a NUL byte ---------------------------------------------- */

#define NUL_MAX_DEPTH 16 /* sub-messages deeper than this are not walked */
#define NUL_COUNTED 64   /* fields whose repeats are numbered in the path */

/* One level of ps_wire_pb_nul: walks the fields of c as a message of type
 * d. Returns 1 with where and *at set, else 0. */
static int nul_walk(cursor *c, const ProtobufCMessageDescriptor *d, char *where,
                    size_t wherelen, size_t *at, int depth)
{
    unsigned seen[NUL_COUNTED] = {0};
    while (c->left > 0) {
        uint64_t key;
        cursor s;
        if (get_varint(c, &key) != 0)
            return 0;
        int wt = (int)(key & 7);
        const ProtobufCFieldDescriptor *f =
            key >> 3 <= UINT32_MAX
                ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3))
                : NULL;
        if (f == NULL || wt != WT_LEN ||
            (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)) {
            if (skip_field(c, wt) != 0)
                return 0;
            continue;
        }
        if (get_sub(c, &s) != 0)
            return 0;
        size_t fi = (size_t)(f - d->fields);
        char name[160];
        if (f->label == PROTOBUF_C_LABEL_REPEATED && fi < NUL_COUNTED)
            snprintf(name, sizeof name, "%s[%u]", f->name, seen[fi]++);
        else
            snprintf(name, sizeof name, "%s", f->name);
        if (f->type == PROTOBUF_C_TYPE_STRING) {
            size_t off = 0, n;
            const uint8_t *p;
            while ((n = ps_wire_bytes_peek(&s, &p)) > 0) {
                const uint8_t *z = memchr(p, 0, n);
                if (z != NULL) {
                    *at = off + (size_t)(z - p);
                    snprintf(where, wherelen, "%s", name);
                    return 1;
                }
                off += n;
                ps_wire_bytes_take(&s, NULL, n);
            }
        } else if (depth < NUL_MAX_DEPTH) {
            char sub[256];
            if (nul_walk(&s, f->descriptor, sub, sizeof sub, at, depth + 1)) {
                snprintf(where, wherelen, "%s.%s", name, sub);
                return 1;
            }
        }
    }
    return 0;
}

int ps_wire_pb_nul(const uint8_t *buf, size_t len, const ProtobufCMessageDescriptor *d,
                   char *where, size_t wherelen, size_t *at)
{
    struct ps_piece one = {buf, len};
    cursor c;
    ps_wire_bytes_init(&c, &one, 1);
    return nul_walk(&c, d, where, wherelen, at, 0);
}
