/* check_wire - the hand codecs of common/wire.c against protobuf-c's own
 * pack and unpack, on random messages (fixed seed): what the module encodes
 * unpacks to the same fields, and is byte for byte what protobuf-c packs;
 * what protobuf-c packs decodes to the same fields, from random pieces as
 * gRPC hands them over; malformed bytes are refused with the errors psd and
 * the client have always given. */
#include "common/errors.h"
#include "proto/ps.pb-c.h"
#include "common/wire.h"

#include "tests/unit/pscheck.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 2000
#define MAXG 5

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* Below n; sometimes a value of any size. */
static uint64_t below(uint64_t n)
{
    return rnd() % n;
}

static uint64_t any_varint(void)
{
    switch (below(4)) {
    case 0: return 0;
    case 1: return below(128);
    case 2: return below(1u << 20);
    default: return rnd() >> below(64);
    }
}

static void rand_name(char *buf, size_t len)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (char)('a' + below(26));
    buf[len] = '\0';
}

/* Cuts buf into 1..8 pieces at random places (empty ones included). */
static int cut(const uint8_t *buf, size_t len, struct ps_piece *p)
{
    int np = 1 + (int)below(8);
    size_t at = 0;
    for (int i = 0; i < np; i++) {
        size_t k = i == np - 1 ? len - at : below(len - at + 1);
        p[i] = (struct ps_piece){buf + at, k};
        at += k;
    }
    return np;
}

/* ---- one random PushRequest, in both shapes --------------------------------- */

struct rgrad {
    char name[300];
    int64_t shape[10];
    uint8_t data[200];
    char shm_name[40], into_name[40];
    ps_wire_shm_ref shm, into;
    Ps__V1__Tensor t;
    Ps__V1__Gradient g;
    Ps__V1__ShmRef pshm, pinto;
};

struct rpush {
    struct rgrad g[MAXG];
    Ps__V1__Gradient *pg[MAXG];
    Ps__V1__PushRequest pb;
    ps_wire_grad_out out[MAXG];
    ps_wire_push_out m;
};

/* A ShmRef, in both shapes; name empty only when `empty` may be. */
static void rand_ref(char *name, ps_wire_shm_ref *r, Ps__V1__ShmRef *p, int empty)
{
    rand_name(name, below(30) + (empty ? 0 : 1));
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->offset = any_varint();
    r->length = any_varint();
    ps__v1__shm_ref__init(p);
    p->name = name;
    p->offset = r->offset;
    p->length = r->length;
}

/* A random PushRequest. For_encode: only what the module's encoder can say
 * (a Tensor in every gradient, names in ShmRefs not empty); else also
 * absent Tensors, empty names, long names and many dimensions. */
static void rand_push(struct rpush *r, int for_encode)
{
    ps__v1__push_request__init(&r->pb);
    memset(&r->m, 0, sizeof r->m);
    r->pb.worker = r->m.worker = (uint32_t)any_varint();
    r->pb.step = r->m.step = any_varint();
    r->pb.return_values = r->m.return_values = below(2);
    size_t n = below(MAXG + 1);
    for (size_t i = 0; i < n; i++) {
        struct rgrad *g = &r->g[i];
        ps_wire_grad_out *o = &r->out[i];
        memset(o, 0, sizeof *o);
        size_t nl = below(6) == 0 && !for_encode ? 256 + below(40) : below(40);
        rand_name(g->name, nl);
        ps__v1__gradient__init(&g->g);
        ps__v1__tensor__init(&g->t);
        g->g.name = g->name;
        o->name = g->name;
        g->t.dtype = (Ps__V1__DType)below(4);
        o->dtype = (int)g->t.dtype;
        g->t.n_shape = below(for_encode ? 5 : 11);
        for (size_t d = 0; d < g->t.n_shape; d++)
            g->shape[d] = (int64_t)any_varint();
        g->t.shape = g->shape;
        o->shape = g->shape;
        o->ndim = (int)g->t.n_shape;
        g->t.data.len = o->nbytes = below(3) ? below(sizeof g->data) : 0;
        for (size_t k = 0; k < g->t.data.len; k++)
            g->data[k] = (uint8_t)rnd();
        g->t.data.data = g->data;
        o->data = g->data;
        if (below(3) == 0) {
            rand_ref(g->shm_name, &g->shm, &g->pshm, !for_encode);
            g->t.shm = &g->pshm;
            o->shm = &g->shm;
        }
        if (below(3) == 0) {
            rand_ref(g->into_name, &g->into, &g->pinto, !for_encode);
            g->g.value_into = &g->pinto;
            o->value_into = &g->into;
        }
        if (below(3) == 0) { /* a piece of a bigger gradient */
            g->g.offset = o->offset = below(2) ? any_varint() : 0;
            g->g.total = o->total = any_varint();
        }
        g->g.grad = for_encode || below(5) ? &g->t : NULL;
        r->pg[i] = &g->g;
    }
    r->pb.n_grads = r->m.ngrads = n;
    r->pb.grads = r->pg;
    r->m.grads = r->out;
}

static void same_ref(const ps_wire_shm_ref *w, const Ps__V1__ShmRef *p)
{
    ck_assert_int_eq(w->set, p != NULL);
    if (p == NULL)
        return;
    ck_assert_uint_eq(w->name_len, strlen(p->name));
    ck_assert_int_eq(strncmp(w->name, p->name, sizeof w->name - 1), 0);
    ck_assert_uint_eq(w->offset, p->offset);
    ck_assert_uint_eq(w->length, p->length);
}

/* A decoded push against the protobuf-c message, field by field. */
static void same_push(const ps_wire_push *w, const Ps__V1__PushRequest *p)
{
    ck_assert_uint_eq(w->worker, p->worker);
    ck_assert_uint_eq(w->step, p->step);
    ck_assert_int_eq(w->return_values, p->return_values);
    ck_assert_uint_eq(w->ngrads, p->n_grads);
    for (size_t i = 0; i < w->ngrads; i++) {
        const ps_wire_grad *g = &w->grads[i];
        const Ps__V1__Gradient *pg = p->grads[i];
        size_t nl = strlen(pg->name);
        ck_assert_uint_eq(g->name_len, nl);
        ck_assert_int_eq(memcmp(g->name, pg->name, nl < 255 ? nl : 255), 0);
        ck_assert_int_eq(g->has_tensor, pg->grad != NULL);
        same_ref(&g->value_into, pg->value_into);
        ck_assert_uint_eq(g->offset, pg->offset);
        ck_assert_uint_eq(g->total, pg->total);
        if (pg->grad == NULL)
            continue;
        const Ps__V1__Tensor *t = pg->grad;
        ck_assert_int_eq(g->dtype, (int)t->dtype);
        if (t->n_shape > PS_WIRE_MAX_DIMS) {
            ck_assert_int_eq(g->ndim, -1);
        } else {
            ck_assert_int_eq(g->ndim, (int)t->n_shape);
            for (size_t d = 0; d < t->n_shape; d++)
                ck_assert_int_eq(g->shape[d], t->shape[d]);
        }
        ck_assert_uint_eq(g->nbytes, t->data.len);
        ck_assert_int_eq(g->has_data, t->data.len > 0);
        uint8_t joined[256];
        ps_wire_bytes b = g->data;
        ck_assert_int_eq(ps_wire_bytes_take(&b, joined, g->nbytes), 0);
        ck_assert_int_eq(memcmp(joined, t->data.data, g->nbytes), 0);
        same_ref(&g->shm, t->shm);
    }
}

START_TEST(test_push_encode)
{
    rng_state = 0x9e3779b97f4a7c15ull;
    static struct rpush r;
    static uint8_t mine[8192], theirs[8192];
    for (int round = 0; round < ROUNDS; round++) {
        rand_push(&r, 1);
        size_t len = ps_wire_push_len(&r.m);
        ck_assert_uint_le(len, sizeof mine);
        ck_assert_ptr_eq(ps_wire_push_put(mine, &r.m), mine + len);
        /* The same bytes as protobuf-c's. */
        ck_assert_uint_eq(ps__v1__push_request__get_packed_size(&r.pb), len);
        ck_assert_uint_eq(ps__v1__push_request__pack(&r.pb, theirs), len);
        ck_assert_int_eq(memcmp(mine, theirs, len), 0);
        Ps__V1__PushRequest *u = ps__v1__push_request__unpack(NULL, len, mine);
        ck_assert_ptr_nonnull(u);
        /* And it decodes as it unpacks, from pieces. */
        static ps_wire_push w;
        struct ps_piece p[8];
        char err[256];
        ck_assert_int_eq(ps_wire_push_decode(p, cut(mine, len, p), &w, err, sizeof err), 0);
        same_push(&w, u);
        ps__v1__push_request__free_unpacked(u, NULL);
        /* Overlong step and dtype varints, and data left to the caller:
         * other bytes, the same message. */
        r.m.step_width = 10;
        for (size_t i = 0; i < r.m.ngrads; i++)
            r.out[i].dtype_pad = (int)below(4);
        len = ps_wire_push_len(&r.m);
        uint8_t *end = ps_wire_push_put(mine, &r.m);
        ck_assert_uint_eq(mine[ps_wire_push_step_at(&r.m) - 1], (2 << 3) | 0);
        if (r.m.ngrads > 0 && r.out[r.m.ngrads - 1].shm == NULL &&
            r.out[r.m.ngrads - 1].value_into == NULL && !r.m.return_values &&
            r.out[r.m.ngrads - 1].offset == 0 && r.out[r.m.ngrads - 1].total == 0) {
            /* The last gradient's data is the message's tail. */
            ps_wire_grad_out *last = &r.out[r.m.ngrads - 1];
            last->data = NULL;
            uint8_t *head_end = ps_wire_push_put(theirs, &r.m);
            ck_assert_uint_eq((size_t)(head_end - theirs), len - last->nbytes);
            ck_assert_int_eq(memcmp(theirs, mine, len - last->nbytes), 0);
        }
        ck_assert_ptr_eq(end, mine + len);
        /* Data left to the caller in the middle (data_at): the fields
         * after it written, the place of the bytes told. */
        for (size_t i = 0; i < r.m.ngrads; i++)
            r.out[i].data = r.g[i].data; /* the tail case above took one */
        for (size_t i = 0; i < r.m.ngrads; i++) {
            ps_wire_grad_out *o = &r.out[i];
            uint8_t *at = NULL;
            const void *data = o->data;
            if (o->nbytes == 0)
                continue;
            o->data = NULL;
            o->data_at = &at;
            memset(theirs, 0, len);
            ck_assert_ptr_eq(ps_wire_push_put(theirs, &r.m), theirs + len);
            ck_assert_ptr_nonnull(at);
            memcpy(at, data, o->nbytes);
            ck_assert_int_eq(memcmp(theirs, mine, len), 0);
            o->data = data;
            o->data_at = NULL;
        }
        u = ps__v1__push_request__unpack(NULL, len, mine);
        ck_assert_ptr_nonnull(u);
        ck_assert_int_eq(ps_wire_push_decode(p, cut(mine, len, p), &w, err, sizeof err), 0);
        same_push(&w, u);
        ck_assert_uint_eq(u->step, r.pb.step);
        ps__v1__push_request__free_unpacked(u, NULL);
        if (round == ROUNDS - 1)
            ps_wire_push_free(&w);
    }
}
END_TEST

START_TEST(test_push_decode)
{
    rng_state = 0x2545f4914f6cdd1dull;
    static struct rpush r;
    static uint8_t buf[16384];
    static ps_wire_push w;
    for (int round = 0; round < ROUNDS; round++) {
        rand_push(&r, 0);
        size_t len = ps__v1__push_request__pack(&r.pb, buf);
        struct ps_piece p[8];
        char err[256];
        ck_assert_int_eq(ps_wire_push_decode(p, cut(buf, len, p), &w, err, sizeof err), 0);
        same_push(&w, &r.pb);
        ck_assert_int_eq(ps_wire_push_decode_buf(buf, len, &w, err, sizeof err), 0);
        same_push(&w, &r.pb);
        /* Every truncation is refused, or is a shorter message that
         * protobuf-c reads the same way. */
        size_t at = below(len + 1);
        int rc = ps_wire_push_decode(p, cut(buf, at, p), &w, err, sizeof err);
        Ps__V1__PushRequest *u = ps__v1__push_request__unpack(NULL, at, buf);
        ck_assert_int_eq(rc == 0, u != NULL);
        if (u != NULL) {
            same_push(&w, u);
            ps__v1__push_request__free_unpacked(u, NULL);
        } else {
            ck_assert_int_eq(rc, PS_EPARSE);
        }
    }
    ps_wire_push_free(&w);
}
END_TEST

/* ---- PullResponse and PushResponse ------------------------------------------ */

struct rvalue {
    char name[60], into_name[40];
    int64_t shape[8];
    uint8_t data[200];
    ps_wire_shm_ref into;
    Ps__V1__ShmRef pinto;
    Ps__V1__Tensor t;
    Ps__V1__VariableValue v;
};

struct rresp {
    struct rvalue v[MAXG];
    Ps__V1__VariableValue *pv[MAXG];
    uint64_t versions[MAXG];
    size_t n;
};

/* Random values as psd sends them: dtype FLOAT32, a name, the data or
 * where it went. */
static void rand_values(struct rresp *r)
{
    r->n = below(MAXG + 1);
    for (size_t i = 0; i < r->n; i++) {
        struct rvalue *v = &r->v[i];
        rand_name(v->name, 1 + below(50));
        ps__v1__variable_value__init(&v->v);
        ps__v1__tensor__init(&v->t);
        v->v.name = v->name;
        v->v.version = any_varint();
        v->v.value = &v->t;
        v->t.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
        v->t.n_shape = below(PS_WIRE_MAX_DIMS + 1);
        for (size_t d = 0; d < v->t.n_shape; d++)
            v->shape[d] = (int64_t)any_varint();
        v->t.shape = v->shape;
        v->t.data.len = below(3) ? 4 * below(sizeof v->data / 4) : 0;
        for (size_t k = 0; k < v->t.data.len; k++)
            v->data[k] = (uint8_t)rnd();
        v->t.data.data = v->data;
        if (below(3) == 0) { /* written into shared memory: no data */
            rand_ref(v->into_name, &v->into, &v->pinto, 0);
            v->t.shm = &v->pinto;
            v->t.data.len = 0;
        }
        r->versions[i] = any_varint();
        r->pv[i] = &v->v;
    }
}

/* The values encoded as psd does (ps_wire_value_header, then the data). */
static size_t put_values(uint8_t *p, const struct rresp *r, int field)
{
    uint8_t *start = p;
    for (size_t i = 0; i < r->n; i++) {
        const struct rvalue *v = &r->v[i];
        const ps_wire_shm_ref *into = v->t.shm ? &v->into : NULL;
        uint8_t *h = p;
        p = ps_wire_value_header(p, field, v->name, v->v.version, v->shape,
                                 (int)v->t.n_shape, v->t.data.len, into);
        ck_assert_uint_le((size_t)(p - h), PS_WIRE_VALUE_HDR_MAX);
        memcpy(p, v->data, v->t.data.len);
        p += v->t.data.len;
    }
    return (size_t)(p - start);
}

/* What the decoder saw, to compare with the message. */
struct seen {
    const struct rresp *r;
    size_t ends;
    int fail_at_data; /* return PS_ESHAPE at the first data event */
};

static int on_value(void *ctx, enum ps_wire_event ev, ps_wire_value *v, char *err,
                    size_t errlen)
{
    struct seen *s = ctx;
    const struct rvalue *rv = &s->r->v[v->index];
    uint8_t joined[256];
    switch (ev) {
    case PS_WIRE_DATA:
        if (s->fail_at_data) {
            snprintf(err, errlen, "stopped at value %zu", v->index);
            return PS_ESHAPE;
        }
        ck_assert_ptr_null(rv->t.shm);
        ck_assert_uint_eq(v->data.left, rv->t.data.len);
        ck_assert_int_eq(ps_wire_bytes_take(&v->data, joined, rv->t.data.len), 0);
        ck_assert_int_eq(memcmp(joined, rv->data, rv->t.data.len), 0);
        break;
    case PS_WIRE_SHM:
        ck_assert_ptr_nonnull(rv->t.shm);
        same_ref(&v->shm, rv->t.shm);
        break;
    case PS_WIRE_END:
        ck_assert_uint_eq(v->index, s->ends++);
        ck_assert_str_eq(v->name, rv->name);
        ck_assert_uint_eq(v->version, rv->v.version);
        break;
    }
    return 0;
}

START_TEST(test_values)
{
    rng_state = 0xd1b54a32d192ed03ull;
    static struct rresp r;
    static uint8_t mine[8192], theirs[8192];
    for (int round = 0; round < ROUNDS; round++) {
        rand_values(&r);
        int push = (int)below(2);
        size_t len = 0, plen;
        if (push)
            len = (size_t)(ps_wire_versions_put(mine, r.versions, r.n) - mine);
        len += put_values(mine + len, &r, push ? 2 : 1);
        if (push) {
            ck_assert_uint_eq(ps_wire_versions_len(r.versions, r.n),
                              (size_t)(len - put_values(theirs, &r, 2)));
            Ps__V1__PushResponse pb = PS__V1__PUSH_RESPONSE__INIT;
            pb.n_versions = r.n;
            pb.versions = r.versions;
            pb.n_values = r.n;
            pb.values = r.pv;
            plen = ps__v1__push_response__pack(&pb, theirs);
        } else {
            Ps__V1__PullResponse pb = PS__V1__PULL_RESPONSE__INIT;
            pb.n_values = r.n;
            pb.values = r.pv;
            plen = ps__v1__pull_response__pack(&pb, theirs);
        }
        /* Byte for byte protobuf-c's, but for an empty versions field,
         * which psd writes and protobuf-c leaves out. */
        size_t skip = push && r.n == 0 ? 2 : 0;
        ck_assert_uint_eq(len - skip, plen);
        ck_assert_int_eq(memcmp(mine + skip, theirs, plen), 0);
        /* protobuf-c's bytes decode, from pieces, to the same values. */
        uint64_t versions[MAXG];
        struct seen s = {&r, 0, 0};
        struct ps_piece p[8];
        char err[256];
        ck_assert_int_eq(ps_wire_values_decode(p, cut(theirs, plen, p), push, r.n,
                                               versions, r.n, on_value, &s, err,
                                               sizeof err), 0);
        ck_assert_uint_eq(s.ends, r.n);
        if (push)
            ck_assert_int_eq(memcmp(versions, r.versions, r.n * sizeof *versions), 0);
        /* The callback's error stops the walk and is returned as is. */
        s = (struct seen){&r, 0, 1};
        int rc = ps_wire_values_decode(p, cut(theirs, plen, p), push, r.n, versions,
                                       r.n, on_value, &s, err, sizeof err);
        int has_data = 0;
        for (size_t i = 0; i < r.n; i++)
            has_data |= r.v[i].t.shm == NULL && r.v[i].t.data.len > 0;
        ck_assert_int_eq(rc, has_data ? PS_ESHAPE : 0);
    }
}
END_TEST

/* ---- refusals ------------------------------------------------------------ */

static void push_refused(const char *bytes, size_t len, int want_rc, const char *want)
{
    static ps_wire_push w;
    char err[256] = "";
    int rc = ps_wire_push_decode_buf((const uint8_t *)bytes, len, &w, err, sizeof err);
    ck_assert_int_eq(rc, want_rc);
    ck_assert_str_eq(err, want);
    ps_wire_push_free(&w);
}

START_TEST(test_push_refused)
{
    push_refused("\x08", 1, PS_EPARSE, "PushRequest: truncated varint at byte 0");
    push_refused("\x08\x01\x80", 3, PS_EPARSE, "PushRequest: truncated field key at byte 2");
    push_refused("\x10\x01\x02\x00", 4, PS_EPARSE,
                 "PushRequest: malformed field 0 (wire type 2) at byte 2");
    push_refused("\x1a\x05\x0a", 3, PS_EPARSE,
                 "PushRequest.grads[0]: length past the end of the message");
    push_refused("\x1a\x00\x1a\x02\x0a\x05", 6, PS_EPARSE,
                 "PushRequest.grads[1]: Gradient.name: length past the end");
    push_refused("\x1a\x02\x12\x01", 4, PS_EPARSE,
                 "PushRequest.grads[0]: Gradient.grad: length past the end");
    push_refused("\x1a\x03\x12\x01\x08", 5, PS_EPARSE,
                 "PushRequest.grads[0]: Tensor.dtype: truncated varint");
    push_refused("\x1a\x04\x12\x02\x12\x01", 6, PS_EPARSE,
                 "PushRequest.grads[0]: Tensor.shape: length past the end");
    push_refused("\x1a\x05\x12\x03\x12\x01\x80", 7, PS_EPARSE,
                 "PushRequest.grads[0]: Tensor.shape: truncated varint");
    push_refused("\x1a\x04\x12\x02\x1a\x01", 6, PS_EPARSE,
                 "PushRequest.grads[0]: Tensor.data: length past the end");
    push_refused("\x1a\x05\x12\x03\x22\x01\x10", 7, PS_EPARSE,
                 "PushRequest.grads[0]: ShmRef.offset: truncated varint");
    push_refused("\x1a\x04\x1a\x02\x0a\x03", 6, PS_EPARSE,
                 "PushRequest.grads[0]: ShmRef.name: length past the end");
    push_refused("\x1a\x03\x1a\x01\x0f", 5, PS_EPARSE,
                 "PushRequest.grads[0]: ShmRef: malformed unknown field");
    push_refused("\x1a\x02\x0f\x00", 4, PS_EPARSE,
                 "PushRequest.grads[0]: Gradient: malformed unknown field");
    push_refused("\x1a\x03\x12\x01\x0f", 5, PS_EPARSE,
                 "PushRequest.grads[0]: Tensor: malformed unknown field");
    push_refused("\x0b", 1, PS_EPARSE,
                 "PushRequest: malformed field 1 (wire type 3) at byte 0");
    /* A known field of the wrong wire type is skipped as unknown. */
    push_refused("\x0d\x01\x02\x03\x04", 5, 0, "");
}
END_TEST

static int no_check(void *ctx, enum ps_wire_event ev, ps_wire_value *v, char *err,
                    size_t errlen)
{
    (void)ctx, (void)ev, (void)v, (void)err, (void)errlen;
    return 0;
}

static void values_refused(const char *bytes, size_t len, bool push, size_t n,
                           size_t nv, const char *want)
{
    struct ps_piece one = {(const uint8_t *)bytes, len};
    uint64_t versions[4];
    char err[256] = "";
    ck_assert_int_eq(ps_wire_values_decode(&one, 1, push, n, versions, nv, no_check,
                                           NULL, err, sizeof err), PS_EPARSE);
    ck_assert_str_eq(err, want);
}

START_TEST(test_values_refused)
{
    values_refused("\x0a\x05\x0a", 3, false, 1, 0, "Pull: the response does not parse");
    values_refused("\x0a\x00\x0a\x00", 4, false, 1, 0, "Pull: more values than requested");
    values_refused("", 0, false, 1, 0, "Pull: 0 values for 1 items");
    values_refused("\x0a\x01\x05", 3, true, 0, 2, "Push: 1 versions for 2 gradients");
    values_refused("\x08\x01\x08\x02", 4, true, 0, 1, "Push: the response does not parse");
    values_refused("\x0a\x04\x1a\x02\x22\x01", 6, false, 1, 0,
                   "Pull: the response does not parse");
    /* A name of 256 bytes or more does not parse. */
    static char big[300] = "\x0a\x83\x02\x0a\x80\x02";
    values_refused(big, 262, false, 1, 0, "Pull: the response does not parse");
}
END_TEST

/* Whether ps_wire_pb_nul finds a NUL in buf[0..len), as a message of d,
 * at the path want (NULL: none) and offset want_at. */
static void nul_case(const char *buf, size_t len, const ProtobufCMessageDescriptor *d,
                     const char *want, size_t want_at)
{
    char where[256] = "";
    size_t at = 999;
    int got = ps_wire_pb_nul((const uint8_t *)buf, len, d, where, sizeof where, &at);
    if (want == NULL) {
        ck_assert_msg(got == 0, "found a NUL at %s:%zu", where, at);
        return;
    }
    ck_assert_int_eq(got, 1);
    ck_assert_str_eq(where, want);
    ck_assert_uint_eq(at, want_at);
}

START_TEST(test_pb_nul)
{
    /* PullRequest{items: [{name "w"}, {name "bw\0x"}]}: protobuf-c would
     * unpack the second name as "bw". */
    nul_case("\x0a\x03\x0a\x01w\x0a\x06\x0a\x04" "bw\0x", 13,
             &ps__v1__pull_request__descriptor, "items[1].name", 2);
    nul_case("\x0a\x03\x0a\x01w\x0a\x06\x0a\x04" "bwox", 13,
             &ps__v1__pull_request__descriptor, NULL, 0);
    /* RegisterRequest.job_id "j\0x"; a NUL in the first byte too. */
    nul_case("\x0a\x03j\0x", 5, &ps__v1__register_request__descriptor, "job_id", 1);
    nul_case("\x0a\x01\0", 3, &ps__v1__register_request__descriptor, "job_id", 0);
    /* A bytes field may hold NULs (Tensor.data), an unknown field too. */
    nul_case("\x1a\x02\0\0", 4, &ps__v1__tensor__descriptor, NULL, 0);
    nul_case("\x7a\x02\0\0", 4, &ps__v1__register_request__descriptor, NULL, 0);
    /* Bytes that do not parse are the unpacker's to refuse. */
    nul_case("\x0a\x09j\0", 4, &ps__v1__register_request__descriptor, NULL, 0);
    nul_case("", 0, &ps__v1__register_request__descriptor, NULL, 0);
}
END_TEST

/* ---- SparsePullRequest / SparsePushRequest / SparsePushResponse ----------- */

static int64_t any_id(void)
{
    switch (below(4)) {
    case 0: return INT64_MIN;
    case 1: return INT64_MAX;
    case 2: return -(int64_t)below(1000);
    default: return (int64_t)rnd();
    }
}

/* Random SparsePushRequests (push) or SparsePullRequests packed by
 * protobuf-c decode to the same fields, ids and each item's next_ids
 * included (negative ones are ten-byte varints), and a gradient's bytes
 * stay where they were. */
static void sparse_round(bool push)
{
    size_t n = 1 + below(MAXG);
    Ps__V1__SparseGradient g[MAXG], *gp[MAXG];
    Ps__V1__SparsePullItem it[MAXG], *ip[MAXG];
    Ps__V1__Tensor tn[MAXG];
    char names[MAXG][40];
    int64_t ids[MAXG][20], next[MAXG][20], shape[MAXG][2];
    float data[MAXG][20 * 3];
    for (size_t i = 0; i < n; i++) {
        rand_name(names[i], 1 + below(30));
        size_t k = below(20), dim = 1 + below(3);
        for (size_t j = 0; j < k; j++)
            ids[i][j] = any_id();
        size_t kn = below(3) ? below(20) : 0;
        for (size_t j = 0; j < kn; j++)
            next[i][j] = any_id();
        for (size_t j = 0; j < k * dim; j++)
            data[i][j] = (float)j - 7.5f;
        ps__v1__sparse_gradient__init(&g[i]);
        ps__v1__sparse_pull_item__init(&it[i]);
        ps__v1__tensor__init(&tn[i]);
        g[i].name = it[i].name = names[i];
        g[i].n_ids = it[i].n_ids = k;
        g[i].ids = it[i].ids = ids[i];
        it[i].n_next_ids = g[i].n_next_ids = kn;
        it[i].next_ids = g[i].next_ids = next[i];
        shape[i][0] = (int64_t)k;
        shape[i][1] = (int64_t)dim;
        tn[i].dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
        tn[i].n_shape = 2;
        tn[i].shape = shape[i];
        tn[i].data.len = k * dim * sizeof(float);
        tn[i].data.data = (uint8_t *)data[i];
        g[i].grad = below(8) ? &tn[i] : NULL;
        gp[i] = &g[i];
        ip[i] = &it[i];
    }
    Ps__V1__SparsePushRequest pr = PS__V1__SPARSE_PUSH_REQUEST__INIT;
    Ps__V1__SparsePullRequest lr = PS__V1__SPARSE_PULL_REQUEST__INIT;
    pr.worker = (uint32_t)below(1000);
    pr.step = any_varint();
    pr.return_values = below(2);
    pr.n_grads = lr.n_items = n;
    pr.grads = gp;
    lr.items = ip;
    const ProtobufCMessage *m = push ? &pr.base : &lr.base;
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(m, buf);
    ps_wire_sparse r = {0};
    char err[256] = "";
    ck_assert_msg(ps_wire_sparse_decode(buf, len, push, &r, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.nitems, n);
    if (push) {
        ck_assert_uint_eq(r.worker, pr.worker);
        ck_assert_uint_eq(r.step, pr.step);
        ck_assert_int_eq(r.return_values, pr.return_values);
    }
    for (size_t i = 0; i < n; i++) {
        const ps_wire_sparse_item *w = &r.items[i];
        ck_assert_str_eq(w->g.name, names[i]);
        ck_assert_uint_eq(w->nids, g[i].n_ids);
        for (size_t j = 0; j < w->nids; j++)
            ck_assert(w->ids[j] == ids[i][j]);
        ck_assert_uint_eq(w->nnext, it[i].n_next_ids);
        for (size_t j = 0; j < w->nnext; j++)
            ck_assert(w->next_ids[j] == next[i][j]);
        if (!push)
            continue;
        ck_assert_int_eq(w->g.has_tensor, g[i].grad != NULL);
        if (g[i].grad == NULL)
            continue;
        ck_assert_int_eq(w->g.dtype, PS__V1__DTYPE__DTYPE_FLOAT32);
        ck_assert_int_eq(w->g.ndim, 2);
        ck_assert(w->g.shape[0] == shape[i][0] && w->g.shape[1] == shape[i][1]);
        ck_assert_uint_eq(w->g.nbytes, tn[i].data.len);
        const uint8_t *at = NULL;
        ps_wire_bytes b = w->g.data;
        if (w->g.nbytes > 0) {
            ck_assert_uint_eq(ps_wire_bytes_peek(&b, &at), w->g.nbytes);
            ck_assert(at >= buf && at + w->g.nbytes <= buf + len); /* in place */
            ck_assert(memcmp(at, data[i], w->g.nbytes) == 0);
        }
    }
    ps_wire_sparse_free(&r);
    free(buf);
}

START_TEST(test_sparse_decode)
{
    rng_state = 0x5eed5a55u;
    for (int k = 0; k < ROUNDS; k++) {
        sparse_round(true);
        sparse_round(false);
    }
}
END_TEST

/* Ids of every varint length, 1 to 10 bytes (the decoder reads those that
 * lie whole in its buffer eight bytes at a time, the rest byte by byte),
 * decode to what protobuf-c packed. */
START_TEST(test_sparse_varint_lengths)
{
    rng_state = 0x7a1e5u;
    enum { N = 64 * 4 };
    int64_t ids[N];
    for (int b = 0; b < 64; b++)
        for (int k = 0; k < 4; k++) {
            uint64_t top = (uint64_t)1 << b, v = k == 0 ? top : k == 1 ? 2 * top - 1
                                                : top | (rnd() & (top - 1));
            ids[b * 4 + k] = k == 3 ? -(int64_t)v : (int64_t)v;
        }
    for (int shift = 0; shift < N; shift += 37) { /* each length near the end too */
        Ps__V1__SparsePullItem it = PS__V1__SPARSE_PULL_ITEM__INIT, *ip = &it;
        Ps__V1__SparsePullRequest lr = PS__V1__SPARSE_PULL_REQUEST__INIT;
        it.name = "t";
        it.n_ids = N - (size_t)shift;
        it.ids = ids + shift;
        lr.n_items = 1;
        lr.items = &ip;
        size_t len = protobuf_c_message_get_packed_size(&lr.base);
        uint8_t *buf = malloc(len);
        protobuf_c_message_pack(&lr.base, buf);
        ps_wire_sparse r = {0};
        char err[256] = "";
        ck_assert_msg(ps_wire_sparse_decode(buf, len, false, &r, err, sizeof err) == 0, "%s",
                      err);
        ck_assert_uint_eq(r.items[0].nids, it.n_ids);
        for (size_t j = 0; j < it.n_ids; j++)
            ck_assert_msg(r.items[0].ids[j] == it.ids[j], "id %zu: %lld, not %lld", j,
                          (long long)r.items[0].ids[j], (long long)it.ids[j]);
        ps_wire_sparse_free(&r);
        free(buf);
    }
}
END_TEST

/* A SparsePushResponse as psd writes it (versions, then each table's rows
 * as a value of field 2) is what protobuf-c packs. */
START_TEST(test_sparse_push_response)
{
    rng_state = 0x0dd5eedu;
    for (int k = 0; k < ROUNDS; k++) {
        size_t n = 1 + below(MAXG);
        bool values = below(2);
        uint64_t versions[MAXG];
        char names[MAXG][40];
        int64_t shape[MAXG][2];
        float data[MAXG][12];
        Ps__V1__SparseRows rows[MAXG], *rp[MAXG];
        Ps__V1__Tensor tn[MAXG];
        uint8_t out[MAXG * (PS_WIRE_VALUE_HDR_MAX + sizeof data[0]) + 64], *e = out;
        for (size_t i = 0; i < n; i++)
            versions[i] = 1 + below(1u << 30);
        e = ps_wire_versions_put(e, versions, n);
        for (size_t i = 0; i < n; i++) {
            rand_name(names[i], 1 + below(30));
            shape[i][0] = (int64_t)below(4);
            shape[i][1] = 3;
            size_t nb = (size_t)shape[i][0] * 3 * sizeof(float);
            for (size_t j = 0; j < 12; j++)
                data[i][j] = (float)(i * 12 + j);
            ps__v1__sparse_rows__init(&rows[i]);
            ps__v1__tensor__init(&tn[i]);
            rows[i].name = names[i];
            rows[i].version = versions[i];
            tn[i].dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
            tn[i].n_shape = 2;
            tn[i].shape = shape[i];
            tn[i].data.len = nb;
            tn[i].data.data = (uint8_t *)data[i];
            rows[i].values = &tn[i];
            rp[i] = &rows[i];
            if (values) {
                e = ps_wire_value_header(e, 2, names[i], versions[i], shape[i], 2, nb, NULL);
                memcpy(e, data[i], nb);
                e += nb;
            }
        }
        Ps__V1__SparsePushResponse resp = PS__V1__SPARSE_PUSH_RESPONSE__INIT;
        resp.n_versions = n;
        resp.versions = versions;
        resp.n_values = values ? n : 0;
        resp.values = rp;
        size_t want = ps__v1__sparse_push_response__get_packed_size(&resp);
        uint8_t *pb = malloc(want);
        ps__v1__sparse_push_response__pack(&resp, pb);
        ck_assert_uint_eq((size_t)(e - out), want);
        ck_assert(memcmp(out, pb, want) == 0);
        free(pb);
    }
}
END_TEST

static void sparse_refused(const char *bytes, size_t len, bool push, const char *want)
{
    ps_wire_sparse r = {0};
    char err[256] = "";
    ck_assert_int_eq(ps_wire_sparse_decode((const uint8_t *)bytes, len, push, &r, err,
                                           sizeof err), PS_EPARSE);
    ck_assert_str_eq(err, want);
    ps_wire_sparse_free(&r);
}

START_TEST(test_sparse_refused)
{
    sparse_refused("\x1a\x05\x0a", 3, true,
                   "SparsePushRequest.grads[0]: length past the end of the message");
    sparse_refused("\x0a\x03\x12\x01\x80", 5, false,
                   "SparsePullRequest.items[0]: SparsePullItem.ids: truncated varint");
    sparse_refused("\x1a\x02\x10\x80", 4, true,
                   "SparsePushRequest.grads[0]: SparseGradient.ids: truncated varint");
    sparse_refused("\x1a\x03\x1a\x01\x08", 5, true,
                   "SparsePushRequest.grads[0]: Tensor.dtype: truncated varint");
    sparse_refused("\x0a\x05\x22\x02\x01\x80\x01", 7, false,
                   "SparsePullRequest.items[0]: SparsePullItem.next_ids: truncated varint");
    sparse_refused("\x0a\x02\x22\x05", 4, false,
                   "SparsePullRequest.items[0]: SparsePullItem.next_ids: length past the end");
    sparse_refused("\x1a\x05\x22\x02\x01\x80\x01", 7, true,
                   "SparsePushRequest.grads[0]: SparseGradient.next_ids: truncated varint");
    sparse_refused("\x1a\x02\x22\x05", 4, true,
                   "SparsePushRequest.grads[0]: SparseGradient.next_ids: length past the end");
    sparse_refused("\x0b", 1, false,
                   "SparsePullRequest: malformed field 1 (wire type 3) at byte 0");
    sparse_refused("\x10\x80", 2, true, "SparsePushRequest: truncated varint at byte 0");
}
END_TEST

/* An empty packed field is valid protobuf (no encoder here writes one, but
 * any may): ids and next_ids of no element, as protobuf-c reads them, in a
 * pull and a push (found by fuzz_decode: psd refused such a request). */
START_TEST(test_sparse_empty_packed)
{
    static const struct { const char *b; size_t len; bool push; size_t ids, next; } cases[] = {
        {"\x0a\x05\x0a\x01" "e\x12\x00", 7, false, 0, 0},
        {"\x0a\x0a\x0a\x01" "e\x12\x00\x22\x03\x09\x01\x02", 12, false, 0, 3},
        {"\x0a\x0a\x0a\x01" "e\x22\x00\x12\x03\x09\x01\x02", 12, false, 3, 0},
        {"\x1a\x05\x0a\x01" "e\x12\x00", 7, true, 0, 0},
        {"\x1a\x0a\x0a\x01" "e\x12\x00\x22\x03\x09\x01\x02", 12, true, 0, 3},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const uint8_t *b = (const uint8_t *)cases[k].b;
        ps_wire_sparse r = {0};
        char err[256] = "";
        ck_assert_msg(ps_wire_sparse_decode(b, cases[k].len, cases[k].push, &r, err,
                                            sizeof err) == 0, "case %zu: %s", k, err);
        ck_assert_uint_eq(r.nitems, 1);
        ck_assert_uint_eq(r.items[0].nids, cases[k].ids);
        ck_assert_uint_eq(r.items[0].nnext, cases[k].next);
        ps_wire_sparse_free(&r);
        if (cases[k].push) {
            Ps__V1__SparsePushRequest *pb =
                ps__v1__sparse_push_request__unpack(NULL, cases[k].len, b);
            ck_assert(pb != NULL && pb->n_grads == 1 && pb->grads[0]->n_ids == cases[k].ids &&
                      pb->grads[0]->n_next_ids == cases[k].next);
            ps__v1__sparse_push_request__free_unpacked(pb, NULL);
        } else {
            Ps__V1__SparsePullRequest *pb =
                ps__v1__sparse_pull_request__unpack(NULL, cases[k].len, b);
            ck_assert(pb != NULL && pb->n_items == 1 && pb->items[0]->n_ids == cases[k].ids &&
                      pb->items[0]->n_next_ids == cases[k].next);
            ps__v1__sparse_pull_request__free_unpacked(pb, NULL);
        }
    }
}
END_TEST

PSCHECK_MAIN("wire",
    {"ps_wire_pb_nul", {test_pb_nul}},
    {"ps_wire_push_put", {test_push_encode}},
    {"ps_wire_push_decode", {test_push_decode}},
    {"ps_wire_values_decode", {test_values}},
    {"push refusals", {test_push_refused}},
    {"values refusals", {test_values_refused}},
    {"ps_wire_sparse_decode", {test_sparse_decode, test_sparse_varint_lengths}},
    {"SparsePushResponse", {test_sparse_push_response}},
    {"sparse refusals", {test_sparse_refused}},
    {"sparse empty packed fields", {test_sparse_empty_packed}})
