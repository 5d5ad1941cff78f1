/*
 * fuzz_decode - libFuzzer target: the same bytes go to every decoder a
 * request meets in psd, that is common/wire.c's zero-copy PushRequest
 * decoder and the protobuf-c unpack of every other request the
 * ParameterServer and Health services read.
 *
 * Besides the sanitizers, it checks what is cheap to check:
 * - a decoded push points only into the input (names and gradient bytes),
 *   and every byte it points to is read, so ASan sees any overrun;
 * - the decoder agrees with protobuf-c: a PushRequest that protobuf-c
 *   accepts decodes, with the same worker, step, gradients, names, shapes
 *   and bytes, except one with field number 0 (invalid protobuf, which
 *   protobuf-c skips and the decoder refuses). The reverse need not hold:
 *   the decoder skips a known field with the wrong wire type as unknown,
 *   where protobuf-c refuses the message. The same for a
 *   SparsePullRequest and a SparsePushRequest (ps_wire_sparse_decode): the
 *   items, their ids and their next_ids, and a push's worker and step.
 * A broken invariant aborts, which libFuzzer reports as a crash.
 */
#include "common/errors.h"
#include "proto/health.pb-c.h"
#include "proto/ps.pb-c.h"
#include "common/wire.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                       \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "fuzz_decode: %s:%d: invariant broken: %s\n", \
                    __FILE__, __LINE__, #cond);                           \
            abort();                                                      \
        }                                                                 \
    } while (0)

/* Reused across inputs, as the server reuses one per thread. */
static ps_wire_push push;
static ps_wire_sparse spull, spush;

static int inside(const uint8_t *p, size_t n, const uint8_t *buf, size_t len)
{
    return n == 0 || (p >= buf && n <= len && (size_t)(p - buf) <= len - n);
}

/* Reads every byte so that ASan checks the range; the sum is returned only
 * so that the compiler keeps the loop. */
static unsigned touch(const uint8_t *p, size_t n)
{
    unsigned s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i];
    return s;
}

/* A walk over protobuf fields in one buffer, apart from the decoder under
 * test: next_field reads a key and moves past its value (a length-delimited
 * one's bytes in *sub); -1 at bytes that do not parse. */
struct walk {
    const uint8_t *p, *end;
};

static int walk_varint(struct walk *w, uint64_t *out)
{
    uint64_t v = 0;
    for (int s = 0; s < 64 && w->p < w->end; s += 7) {
        uint8_t b = *w->p++;
        v |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

static int next_field(struct walk *w, uint64_t *key, struct walk *sub)
{
    uint64_t v;
    size_t skip;
    if (walk_varint(w, key) != 0)
        return -1;
    switch (*key & 7) {
    case 0: return walk_varint(w, &v);
    case 1: skip = 8; break;
    case 5: skip = 4; break;
    case 2:
        if (walk_varint(w, &v) != 0)
            return -1;
        skip = (size_t)v;
        if (v > (uint64_t)(w->end - w->p))
            return -1;
        *sub = (struct walk){w->p, w->p + skip};
        break;
    default: return -1;
    }
    if (skip > (size_t)(w->end - w->p))
        return -1;
    w->p += skip;
    return 0;
}

/* How many times gradient k (the k-th field 3) carries field 2, its
 * Tensor. */
static int tensor_count(const uint8_t *data, size_t size, size_t k)
{
    struct walk w = {data, data + size}, g;
    uint64_t key;
    size_t seen = 0;
    while (w.p < w.end && next_field(&w, &key, &g) == 0) {
        if (key != ((3 << 3) | 2) || seen++ != k)
            continue;
        int n = 0;
        struct walk t;
        while (g.p < g.end && next_field(&g, &key, &t) == 0)
            n += key == ((2 << 3) | 2);
        return g.p == g.end ? n : -1;
    }
    return -1;
}

/* True when every top-level field 4 of the message is a varint (the message
 * parsed, so its top level is well formed). */
static int field4_varints_only(const uint8_t *data, size_t size)
{
    struct walk w = {data, data + size}, sub;
    uint64_t key;
    while (w.p < w.end) {
        if (next_field(&w, &key, &sub) != 0 || ((key >> 3) == 4 && (key & 7) != 0))
            return 0;
    }
    return 1;
}

/* Whether a decoder refused the bytes (rc not 0, err its message), and
 * then that it named a parse error, or ran out of memory, and that
 * protobuf-c's unpack (pb, freed here) did not accept them, but for field
 * number 0 (field0: the decoder's words for it), which protobuf forbids and
 * protobuf-c lets pass as an unknown field. */
static bool refused(int rc, const char *err, size_t errlen, void *pb, const char *field0)
{
    if (rc == 0)
        return false;
    CHECK(rc == PS_EPARSE || rc == -ENOMEM);
    if (rc == PS_EPARSE)
        CHECK(err[0] != '\0' && memchr(err, '\0', errlen) != NULL);
    CHECK(pb == NULL || strncmp(err, field0, strlen(field0)) == 0);
    if (pb != NULL)
        protobuf_c_message_free_unpacked(pb, NULL);
    return true;
}

static void check_push(const uint8_t *data, size_t size)
{
    char err[256];
    err[0] = '\0';
    /* Three pieces, as gRPC hands a message over in the slices it arrived
     * in: fields and floats straddle the cuts. */
    struct ps_piece pieces[3] = {{data, size / 3},
                                 {data + size / 3, size / 3 + size % 3},
                                 {data + 2 * (size / 3) + size % 3, size / 3}};
    int rc = ps_wire_push_decode(pieces, 3, &push, err, sizeof err);
    Ps__V1__PushRequest *pb = ps__v1__push_request__unpack(NULL, size, data);
    if (refused(rc, err, sizeof err, pb, "PushRequest: malformed field 0 "))
        return;
    CHECK(push.ngrads <= push.cap);
    unsigned sum = 0;
    for (size_t i = 0; i < push.ngrads; i++) {
        const ps_wire_grad *g = &push.grads[i];
        CHECK(g->name_len <= size);
        CHECK(g->name[g->name_len < PS_WIRE_MAX_NAME ? g->name_len
                                                      : PS_WIRE_MAX_NAME] == '\0');
        CHECK(g->data.left == g->nbytes && g->nbytes <= size);
        CHECK(g->ndim >= -1 && g->ndim <= PS_WIRE_MAX_DIMS);
        CHECK(g->dtype >= 0 && g->dtype <= 1000);
        if (g->nbytes) {
            const uint8_t *run;
            ps_wire_bytes c = g->data;
            size_t k = ps_wire_bytes_peek(&c, &run);
            CHECK(k > 0 && inside(run, k, data, size));
            sum += touch(run, k);
        }
    }
    (void)sum;
    if (pb == NULL)
        return;
    CHECK(pb->worker == push.worker);
    CHECK(pb->step == push.step);
    /* protobuf-c reads field 4 as a bool whatever its wire type; the
     * decoder, as protobuf says, skips a field of the wrong wire type. So
     * the two agree when every field 4 is a varint. */
    if (field4_varints_only(data, size))
        CHECK(pb->return_values == (protobuf_c_boolean)push.return_values);
    CHECK(pb->n_grads == push.ngrads);
    for (size_t i = 0; i < push.ngrads; i++) {
        const ps_wire_grad *g = &push.grads[i];
        const Ps__V1__Gradient *pg = pb->grads[i];
        CHECK(strlen(pg->name) <= g->name_len);
        /* protobuf-c's string stops at an embedded NUL; the prefix agrees. */
        size_t kept = strlen(pg->name) < PS_WIRE_MAX_NAME ? strlen(pg->name)
                                                           : PS_WIRE_MAX_NAME;
        CHECK(memcmp(pg->name, g->name, kept) == 0);
        CHECK((pg->grad != NULL) == (g->has_tensor != 0));
        /* Shared-memory references: present on both sides or neither (a
         * ref sent twice merges differently, so values are not compared). */
        CHECK((pg->value_into != NULL) == (g->value_into.set != 0));
        if (pg->grad == NULL)
            continue;
        CHECK((pg->grad->shm != NULL) == (g->shm.set != 0));
        const Ps__V1__Tensor *t = pg->grad;
        if (t->n_shape <= PS_WIRE_MAX_DIMS) {
            CHECK(g->ndim == (int)t->n_shape);
            for (size_t d = 0; d < t->n_shape; d++)
                CHECK(g->shape[d] == t->shape[d]);
        } else {
            CHECK(g->ndim == -1);
        }
        /* A Tensor sent twice in one Gradient is merged: the decoder keeps
         * each field's last value on the wire, as protobuf requires, where
         * protobuf-c's merge differs (it may keep an earlier data, or drop
         * an earlier dtype). So dtype and data are compared when the
         * Tensor came once, and then only when the decoder's is not zero. */
        if (tensor_count(data, size, i) != 1)
            continue;
        if (g->dtype > 0 && g->dtype < 1000)
            CHECK((int)t->dtype == g->dtype);
        if (g->nbytes > 0) {
            CHECK(t->data.len == g->nbytes);
            uint8_t *joined = malloc(g->nbytes);
            ps_wire_bytes c = g->data;
            CHECK(joined != NULL && ps_wire_bytes_take(&c, joined, g->nbytes) == 0);
            CHECK(memcmp(t->data.data, joined, g->nbytes) == 0);
            free(joined);
        }
    }
    ps__v1__push_request__free_unpacked(pb, NULL);
}

/* The items of a decoded SparsePullRequest or SparsePushRequest: each
 * one's ids and next_ids where it says in the request's arrays. */
static void check_sparse_items(const ps_wire_sparse *r)
{
    CHECK(r->nitems <= r->cap);
    size_t ids = 0, next = 0;
    for (size_t i = 0; i < r->nitems; i++) {
        const ps_wire_sparse_item *it = &r->items[i];
        CHECK(it->ids_at == ids && it->next_at == next);
        ids += it->nids;
        next += it->nnext;
    }
    CHECK(ids == r->nids && next == r->nnext);
}

/* Whether an item's ids and next_ids are those protobuf-c unpacked. */
static bool same_ids(const ps_wire_sparse_item *it, size_t nids, const int64_t *ids,
                     size_t nnext, const int64_t *next)
{
    return nids == it->nids && nnext == it->nnext &&
           (nids == 0 || memcmp(ids, it->ids, nids * sizeof *ids) == 0) &&
           (nnext == 0 || memcmp(next, it->next_ids, nnext * sizeof *next) == 0);
}

/* A SparsePullRequest (push false) or SparsePushRequest decoded in place
 * (psd's SparsePull, SparsePush) against protobuf-c's unpack of the same
 * bytes: the items, their ids and their next_ids, which both concatenate
 * when a field comes more than once, and a push's worker and step (its
 * tensors are the push decoder's, checked above). */
static void check_sparse(const uint8_t *data, size_t size, bool push)
{
    ps_wire_sparse *r = push ? &spush : &spull;
    char err[256];
    err[0] = '\0';
    int rc = ps_wire_sparse_decode(data, size, push, r, err, sizeof err);
    void *pb = push ? (void *)ps__v1__sparse_push_request__unpack(NULL, size, data)
                    : (void *)ps__v1__sparse_pull_request__unpack(NULL, size, data);
    if (refused(rc, err, sizeof err, pb, push ? "SparsePushRequest: malformed field 0 "
                                              : "SparsePullRequest: malformed field 0 "))
        return;
    check_sparse_items(r);
    if (pb == NULL)
        return;
    const Ps__V1__SparsePushRequest *ps = pb;
    const Ps__V1__SparsePullRequest *pl = pb;
    CHECK(!push || (ps->worker == r->worker && ps->step == r->step));
    CHECK((push ? ps->n_grads : pl->n_items) == r->nitems);
    for (size_t i = 0; i < r->nitems; i++) {
        const Ps__V1__SparseGradient *g = push ? ps->grads[i] : NULL;
        const Ps__V1__SparsePullItem *pi = push ? NULL : pl->items[i];
        CHECK(push ? same_ids(&r->items[i], g->n_ids, g->ids, g->n_next_ids, g->next_ids)
                   : same_ids(&r->items[i], pi->n_ids, pi->ids, pi->n_next_ids,
                              pi->next_ids));
    }
    protobuf_c_message_free_unpacked(pb, NULL);
}

/* The other requests go through protobuf-c as the handlers use it: unpack,
 * read the fields the handler reads, free. */
static void check_others(const uint8_t *data, size_t size)
{
    Ps__V1__CreateVariableRequest *cv =
        ps__v1__create_variable_request__unpack(NULL, size, data);
    if (cv != NULL) {
        if (cv->spec != NULL) {
            const Ps__V1__VariableSpec *sp = cv->spec;
            CHECK(sp->name != NULL);
            (void)strlen(sp->name);
            for (size_t i = 0; i < sp->n_shape; i++)
                (void)touch((const uint8_t *)&sp->shape[i], sizeof sp->shape[i]);
            /* The handler packs the spec again to compare it. */
            size_t n = ps__v1__variable_spec__get_packed_size(sp);
            uint8_t *buf = malloc(n ? n : 1);
            CHECK(buf != NULL);
            CHECK(ps__v1__variable_spec__pack(sp, buf) == n);
            free(buf);
        }
        ps__v1__create_variable_request__free_unpacked(cv, NULL);
    }

    Ps__V1__PullRequest *pr = ps__v1__pull_request__unpack(NULL, size, data);
    if (pr != NULL) {
        for (size_t i = 0; i < pr->n_items; i++) {
            CHECK(pr->items[i] != NULL && pr->items[i]->name != NULL);
            (void)strlen(pr->items[i]->name);
        }
        ps__v1__pull_request__free_unpacked(pr, NULL);
    }

    /* The requests whose fields need no look. */
    static const ProtobufCMessageDescriptor *const plain[] = {
        &ps__v1__list_variables_request__descriptor,
        &ps__v1__stats_request__descriptor,
        &ps__v1__checkpoint_request__descriptor,
        &ps__v1__restore_request__descriptor,
    };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        ProtobufCMessage *m = protobuf_c_message_unpack(plain[i], NULL, size, data);
        if (m != NULL)
            protobuf_c_message_free_unpacked(m, NULL);
    }

    Grpc__Health__V1__HealthCheckRequest *hr =
        grpc__health__v1__health_check_request__unpack(NULL, size, data);
    if (hr != NULL) {
        CHECK(hr->service != NULL);
        (void)strlen(hr->service);
        grpc__health__v1__health_check_request__free_unpacked(hr, NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_push(data, size);
    check_sparse(data, size, false);
    check_sparse(data, size, true);
    check_others(data, size);
    return 0;
}
