/*
 * sparse_rpc.c - SparsePull and SparsePush, the sparse tier's RPC edge
 * (sparse.h): each request is decoded, its tables found and its
 * gradients checked here, under the shard's table_lock; the rows are the
 * tier's (psd_sparse_pull, psd_sparse_push), which applies a push whole or
 * not at all.
 */
#include "server/shard_internal.h"

#include "server/sparse.h"
#include "server/store.h"
#include "common/errors.h"
#include "common/half.h"
#include "common/log.h"
#include "common/rpc_msg.h"
#include "common/wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Finds the sparse table `name` (len bytes on the wire) for method.
 * Returns it, or NULL with call failed and counted as a bad request.
 * table_lock held. */
static psd_var *find_table(psd_shard *s, ps_rpc_call *call, const char *method,
                           const char *name, size_t len)
{
    psd_var *v = shard_find_var(s, name, len, NULL);
    if (v != NULL && v->sparse != NULL)
        return v;
    shard_count_bad(s);
    const char *np = v ? NULL : shard_name_problem(name, len);
    if (np != NULL)
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: table name %s", method, np);
    else if (v == NULL)
        ps_rpc_fail(call, PS_RPC_NOT_FOUND, "%s: sparse table '%s' does not exist",
                    method, name);
    else
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: variable '%s' is dense, not "
                    "a sparse table; use %s", method, name,
                    strcmp(method, "SparsePull") == 0 ? "Pull" : "Push");
    return NULL;
}

static void fail_rc(ps_rpc_call *call, const char *method, const char *name, int rc)
{
    ps_rpc_fail(call, ps_rpc_code_from_err(rc), "%s: sparse table '%s': the store "
                "failed: %s", method, name, ps_strerror(rc));
}

/* Decodes a request in place (wire.c): the ids into r's array, a
 * gradient's bytes left where they arrived. False with call failed: bytes
 * that do not parse, a name with a NUL, or no items. */
static bool decode(psd_shard *s, ps_rpc_call *call, bool push, const uint8_t *req,
                   size_t len, ps_wire_sparse *r)
{
    const char *method = push ? "SparsePush" : "SparsePull";
    const ProtobufCMessageDescriptor *d = push ? &ps__v1__sparse_push_request__descriptor
                                               : &ps__v1__sparse_pull_request__descriptor;
    char err[256], where[256];
    size_t at;
    int rc = ps_wire_sparse_decode(req, len, push, r, err, sizeof err);
    if (rc == -ENOMEM) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "%s: out of memory", method);
        return false;
    }
    shard_count_bad(s);
    if (rc != 0)
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: %zu bytes that are not a "
                    "%sRequest (%s)", method, len, method, err);
    else if (ps_wire_pb_nul(req, len, d, where, sizeof where, &at))
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: %s has a NUL byte at %zu",
                    method, where, at);
    else if (r->nitems == 0)
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: no %s", method,
                    push ? "grads" : "items");
    else {
        atomic_fetch_sub(&s->bad, 1); /* counted only when refused */
        return true;
    }
    return false;
}

/* Room for a reply: the rows and their headers within the message limit. */
static bool reply_fits(psd_shard *s, ps_rpc_call *call, const char *method,
                       uint64_t bytes)
{
    if (bytes + 4096 <= s->o.max_message_bytes)
        return true;
    shard_count_bad(s);
    ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: the rows asked for are %llu "
                "bytes, over the message limit of %zu; ask for fewer ids", method,
                (unsigned long long)bytes, s->o.max_message_bytes);
    return false;
}

/* An item's next_ids: at most the ids one call of the method can carry
 * within the message limit (the hint is of one call): rows of vb bytes
 * each, those a pull answers or a push's gradient of the table at its
 * narrowest (the row dtype). False with call failed. */
static bool next_fits(psd_shard *s, ps_rpc_call *call, bool push, const psd_var *v,
                      const ps_wire_sparse_item *it, bool f32)
{
    uint64_t vb = psd_sparse_value_bytes(v->sparse, f32);
    uint64_t most = s->o.max_message_bytes > 4096 ? (s->o.max_message_bytes - 4096) / vb : 0;
    if (it->nnext <= most)
        return true;
    shard_count_bad(s);
    ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: sparse table '%s': next_ids has %zu "
                "ids, more than one %s can %s within the message limit of %zu bytes (at "
                "most %llu); send the ids of the next %s only%s",
                push ? "SparsePush" : "SparsePull", v->name, it->nnext,
                push ? "push" : "pull", push ? "carry" : "answer", s->o.max_message_bytes,
                (unsigned long long)most, push ? "push" : "pull",
                push ? "; nothing applied" : "");
    return false;
}

/* A table's row dtype as a ps.v1.DType (half.h's types are numbered so). */
static int row_dtype(const psd_var *v)
{
    int t = psd_sparse_row_type(v->sparse);
    return t ? t : PS__V1__DTYPE__DTYPE_FLOAT32;
}

/* The dtype a pull item asks its rows in: unset or the row dtype (the
 * stored bits), or FLOAT32 (*f32, widened). False with call failed. */
static bool pull_dtype(psd_shard *s, ps_rpc_call *call, const psd_var *v, int asked,
                       bool *f32)
{
    *f32 = asked == PS__V1__DTYPE__DTYPE_FLOAT32;
    if (asked == 0 || asked == PS__V1__DTYPE__DTYPE_FLOAT32 || asked == row_dtype(v))
        return true;
    shard_count_bad(s);
    ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePull: sparse table '%s': dtype %s "
                "asked, its rows are %s; ask FLOAT32 or leave dtype unset", v->name,
                shard_is_half(asked) ? shard_dtype_name(asked)
                                     : "(not FLOAT32, FLOAT16 or BFLOAT16)",
                shard_dtype_name(row_dtype(v)));
    return false;
}

/* The rows of each table are gathered straight into a pooled message
 * (rpc_msg.h) that gRPC sends in place and gives back to the pool, warm:
 * no copy of the rows after the gather, no fresh megabyte a call. A
 * SparsePullResponse is a PullResponse on the wire (rows = values), so
 * wire.c writes each table's header. */
void shard_sparse_pull(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    psd_shard *s = ctx;
    ps_wire_sparse r = {0};
    if (!decode(s, call, false, req, len, &r)) {
        ps_wire_sparse_free(&r);
        return;
    }
    size_t n = r.nitems;
    psd_var **vars = calloc(n, sizeof *vars);
    ps_rpc_msg **msgs = calloc(n, sizeof *msgs);
    uint8_t *hdr = malloc(n * PS_WIRE_VALUE_HDR_MAX);
    ps_rpc_part *parts = calloc(2 * n, sizeof *parts);
    pthread_rwlock_rdlock(&s->table_lock);
    bool ok = vars && msgs && hdr && parts;
    if (!ok)
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePull: out of memory");
    uint64_t bytes = 0;
    bool *f32 = calloc(n, sizeof *f32), half = false;
    if (ok && f32 == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePull: out of memory");
        ok = false;
    }
    for (size_t i = 0; i < n && ok; i++) {
        const ps_wire_grad *g = &r.items[i].g;
        vars[i] = find_table(s, call, "SparsePull", g->name, g->name_len);
        ok = vars[i] != NULL && pull_dtype(s, call, vars[i], g->dtype, &f32[i]);
        for (size_t j = 0; j < i && ok; j++)
            if (vars[j] == vars[i]) {
                shard_count_bad(s);
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePull: table '%s' "
                            "is named twice", vars[i]->name);
                ok = false;
            }
        if (ok) {
            bytes += (uint64_t)r.items[i].nids * psd_sparse_value_bytes(vars[i]->sparse,
                                                                        f32[i]);
            half |= !f32[i] && psd_sparse_row_type(vars[i]->sparse) != 0;
            ok = next_fits(s, call, false, vars[i], &r.items[i], f32[i]);
        }
    }
    ok = ok && reply_fits(s, call, "SparsePull", bytes);
    for (size_t i = 0; i < n && ok; i++) {
        psd_var *v = vars[i];
        size_t ni = r.items[i].nids, dim = psd_sparse_table_dim(v->sparse);
        size_t nb = ni * psd_sparse_value_bytes(v->sparse, f32[i]);
        msgs[i] = ps_rpc_msg_new(nb ? nb : 1);
        uint8_t *out = msgs[i] ? ps_rpc_msg_data(msgs[i]) : NULL;
        uint64_t inserted = 0;
        int rc = out ? psd_sparse_pull_next(s->sparse, v->sparse, r.items[i].ids, ni,
                                            r.items[i].next_ids, r.items[i].nnext, out,
                                            f32[i], &inserted)
                     : -ENOMEM;
        if (inserted > 0)
            shard_count_apply(s);
        if (rc != 0) {
            fail_rc(call, "SparsePull", v->name, rc);
            ok = false;
            break;
        }
        ps_rpc_msg_set_len(msgs[i], nb);
        int64_t shape[2] = {(int64_t)ni, (int64_t)dim};
        uint8_t *h = hdr + i * PS_WIRE_VALUE_HDR_MAX;
        pthread_rwlock_rdlock(&v->lock);
        uint8_t *end = ps_wire_value_header_dtype(
            h, 1, v->name, v->version, shape, 2, nb, NULL,
            f32[i] ? PS__V1__DTYPE__DTYPE_FLOAT32 : row_dtype(v));
        pthread_rwlock_unlock(&v->lock);
        parts[2 * i] = (ps_rpc_part){h, (size_t)(end - h), NULL, NULL};
        parts[2 * i + 1] = (ps_rpc_part){out, nb, ps_rpc_msg_release, msgs[i]};
    }
    pthread_rwlock_unlock(&s->table_lock);
    if (ok) {
        atomic_fetch_add(&s->bytes_out, bytes);
        if (half)
            atomic_fetch_add(&s->half_pulls, 1);
        ps_rpc_reply_parts(call, parts, (int)(2 * n)); /* releases the messages */
    } else {
        for (size_t i = 0; msgs && i < n; i++)
            if (msgs[i] != NULL)
                ps_rpc_msg_unref(msgs[i]);
    }
    free(vars);
    free(msgs);
    free(hdr);
    free(parts);
    free(f32);
    ps_wire_sparse_free(&r);
}

/* ---- SparsePush ---------------------------------------------------------- */

/* Checks gradient g of the push against its table v, declared its dtype
 * (SparsePushRequest.wire_dtype); false with call failed. A half
 * gradient's bytes are widened into *wide, which moves on past them. */
static bool check_grad(psd_shard *s, ps_rpc_call *call, const ps_wire_sparse_item *it,
                       const psd_var *v, int declared, float **wide)
{
    size_t dim = psd_sparse_table_dim(v->sparse), n = it->nids;
    const ps_wire_grad *g = &it->g;
    const uint8_t *data = NULL;
    ps_wire_bytes b = g->data;
    if (g->nbytes > 0)
        ps_wire_bytes_peek(&b, &data); /* one piece: all of it */
    bool half = shard_is_half(declared);
    size_t esz = half ? 2 : sizeof(float);
    const char *why = NULL;
    char buf[200];
    if (!g->has_tensor) {
        why = "grad is missing";
    } else if (g->dtype != declared) {
        snprintf(buf, sizeof buf, "grad dtype is %s, the push declares %s "
                 "(SparsePushRequest.wire_dtype)", shard_dtype_name(g->dtype),
                 shard_dtype_name(declared));
        why = buf;
    } else if (half && declared != row_dtype(v)) {
        snprintf(buf, sizeof buf, "a %s grad, but its rows are %s; push FLOAT32 or "
                 "the rows' dtype", shard_dtype_name(declared),
                 shard_dtype_name(row_dtype(v)));
        why = buf;
    } else if (g->shm.set) {
        why = "grad in shared memory is not served for sparse tables; send it inline";
    } else if (g->ndim != 2 || g->shape[0] != (int64_t)n || g->shape[1] != (int64_t)dim) {
        snprintf(buf, sizeof buf, "grad must have shape [%zu, %zu] (ids, dim), got "
                 "%d dimension(s) %lld x %lld", n, dim, g->ndim,
                 g->ndim > 0 ? (long long)g->shape[0] : 0LL,
                 g->ndim > 1 ? (long long)g->shape[1] : 0LL);
        why = buf;
    } else if (g->nbytes != n * dim * esz) {
        snprintf(buf, sizeof buf, "grad has %zu bytes, [%zu, %zu] of %s need %zu",
                 g->nbytes, n, dim, shard_dtype_name(declared), n * dim * esz);
        why = buf;
    } else if (half) {
        /* Widened first, then checked: NaN and Inf stay so, and a half
         * gradient's are refused whatever --allow-nonfinite says. */
        ps_half_to_f32(declared, (const uint16_t *)(const void *)data, *wide, n * dim);
        if (!psd_all_finite((const psd_ufloat *)*wide, n * dim)) {
            atomic_fetch_add(&s->nonfinite, 1);
            snprintf(buf, sizeof buf, "the %s grad holds NaN or Inf",
                     shard_dtype_name(declared));
            why = buf;
        }
        *wide += n * dim;
    } else if (!s->o.allow_nonfinite &&
               !psd_all_finite((const psd_ufloat *)(const void *)data, n * dim)) {
        atomic_fetch_add(&s->nonfinite, 1);
        why = "grad holds NaN or Inf";
    }
    if (why == NULL)
        return true;
    shard_count_bad(s);
    ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePush: sparse table '%s': %s; "
                "nothing applied", v->name, why);
    return false;
}

/* The float32 a push's half gradients widen into: one block for the
 * call, NULL (nothing to free) when they are FLOAT32. False with call
 * failed. */
static bool widen_room(psd_shard *s, ps_rpc_call *call, const ps_wire_sparse *r,
                       float **wide)
{
    *wide = NULL;
    int d = r->wire_dtype;
    if (d != 0 && d != PS__V1__DTYPE__DTYPE_FLOAT32 && !shard_is_half(d)) {
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePush: wire_dtype %d is not "
                    "FLOAT32, FLOAT16 or BFLOAT16; nothing applied", d);
        return false;
    }
    if (!shard_is_half(d))
        return true;
    size_t total = 0;
    for (size_t i = 0; i < r->nitems; i++)
        total += r->items[i].g.nbytes / 2;
    *wide = malloc(total ? total * sizeof(float) : 1);
    if (*wide == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePush: out of memory");
        return false;
    }
    return true;
}

/* Checks every gradient, each table named once, and makes the tier's
 * parts of the push (half gradients widened into wide, widen_room's);
 * false with call failed. */
static bool push_check(psd_shard *s, ps_rpc_call *call, const ps_wire_sparse *r,
                       psd_var **vars, struct psd_sparse_grad *parts, float *wide,
                       uint64_t *bytes)
{
    int declared = r->wire_dtype ? r->wire_dtype : PS__V1__DTYPE__DTYPE_FLOAT32;
    for (size_t i = 0; i < r->nitems; i++) {
        const ps_wire_sparse_item *it = &r->items[i];
        float *at = wide;
        vars[i] = find_table(s, call, "SparsePush", it->g.name, it->g.name_len);
        if (vars[i] == NULL || !check_grad(s, call, it, vars[i], declared, &wide) ||
            !next_fits(s, call, true, vars[i], it, false))
            return false;
        for (size_t j = 0; j < i; j++)
            if (vars[j] == vars[i]) {
                shard_count_bad(s);
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePush: table '%s' "
                            "has two gradients in one push", vars[i]->name);
                return false;
            }
        const uint8_t *data = NULL;
        ps_wire_bytes b = it->g.data;
        if (it->g.nbytes > 0)
            ps_wire_bytes_peek(&b, &data);
        parts[i] = (struct psd_sparse_grad){.t = vars[i]->sparse, .ids = it->ids,
                                            .n = it->nids,
                                            .grad = at != NULL ? (const void *)at : data,
                                            .next = it->next_ids, .nnext = it->nnext};
        *bytes += it->g.nbytes;
    }
    return true;
}

/* The answer of a push, built where it is applied: PushResponse's bytes
 * (versions, then with return_values each table's rows as a value), in
 * one block: the rows first, where the tier writes them, then the
 * headers. */
struct answer {
    void *mem;
    uint8_t *hdr;          /* after the rows */
    ps_rpc_part *parts;
    int nparts;
};

static bool answer_alloc(ps_rpc_call *call, struct psd_sparse_grad *parts, size_t n,
                         bool values, struct answer *a)
{
    size_t rows = 0;
    for (size_t i = 0; values && i < n; i++)
        rows += parts[i].n * psd_sparse_value_bytes(parts[i].t, false);
    rows = (rows + 7) & ~(size_t)7;
    size_t hdr = 11 + 10 * n + (values ? n * PS_WIRE_VALUE_HDR_MAX : 0);
    a->mem = malloc(rows + hdr);
    a->parts = calloc(1 + 2 * n, sizeof *a->parts);
    if (a->mem == NULL || a->parts == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePush: out of memory");
        return false;
    }
    a->hdr = (uint8_t *)a->mem + rows;
    uint8_t *at = a->mem;
    for (size_t i = 0; values && i < n; i++) {
        parts[i].values = at;
        at += parts[i].n * psd_sparse_value_bytes(parts[i].t, false);
    }
    return true;
}

/* Writes the headers of an applied push (versions known now). table_lock
 * held: the names are the variables'. */
static void answer_put(struct answer *a, psd_var **vars, struct psd_sparse_grad *parts,
                       size_t n, const uint64_t *versions, bool values)
{
    uint8_t *h = a->hdr, *end = ps_wire_versions_put(h, versions, n);
    a->nparts = 0;
    for (size_t i = 0; values && i < n; i++) {
        size_t dim = psd_sparse_table_dim(parts[i].t);
        size_t nb = parts[i].n * psd_sparse_value_bytes(parts[i].t, false);
        int64_t shape[2] = {(int64_t)parts[i].n, (int64_t)dim};
        end = ps_wire_value_header_dtype(end, 2, vars[i]->name, versions[i], shape, 2, nb,
                                         NULL, row_dtype(vars[i]));
        a->parts[a->nparts++] = (ps_rpc_part){h, (size_t)(end - h), NULL, NULL};
        a->parts[a->nparts++] = (ps_rpc_part){parts[i].values, nb, NULL, NULL};
        h = end;
    }
    if (end > h)
        a->parts[a->nparts++] = (ps_rpc_part){h, (size_t)(end - h), NULL, NULL};
}

/* The push applied: each variable's version moves on, and its step. */
static void push_note(psd_shard *s, psd_var **vars, size_t n, uint64_t step,
                      uint64_t *versions)
{
    for (size_t i = 0; i < n; i++) {
        psd_var *v = vars[i];
        pthread_rwlock_wrlock(&v->lock);
        v->version++;
        if (step > v->step)
            v->step = step;
        versions[i] = v->version;
        pthread_rwlock_unlock(&v->lock);
        shard_count_apply(s);
    }
}

static void push_failed(psd_shard *s, ps_rpc_call *call, psd_var *v, int rc, const char *why)
{
    if (rc == PS_EINVAL_ARG) {
        atomic_fetch_add(&s->nonfinite, 1);
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePush: %s", why);
    } else if (rc == PS_EFULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePush: %s", why);
    } else {
        fail_rc(call, "SparsePush", v->name, rc);
    }
}

/* Past the RAM tier's budget, or with more changed rows than a commit
 * writes in ~40 ms: a commit first (and past the budget, an apply of the
 * row log), so that clean rows can go and the kill -9 bound holds. A
 * commit that fails (a full map or disk) leaves them all changed: then
 * the push is refused rather than the tier outgrowing its bound. False
 * with call failed. */
static bool push_room(psd_shard *s, ps_rpc_call *call)
{
    if (!psd_sparse_needs_commit(s->sparse))
        return true;
    int frc = shard_flush_wait(s);
    /* Rows still held: logged but not yet in LMDB. Apply enough of the
     * log. */
    if (frc == 0 && psd_sparse_over_budget(s->sparse))
        frc = psd_sparse_make_room(s->sparse);
    if (frc == 0 || !psd_sparse_over_budget(s->sparse))
        return true;
    const char *full = psd_sparse_full_reason(s->sparse);
    ps_rpc_fail(call, frc == PS_EFULL ? PS_RPC_RESOURCE_EXHAUSTED : ps_rpc_code_from_err(frc),
                "SparsePush: the rows changed so far cannot be committed (%s%s%s) and "
                "fill the RAM tier; nothing applied", ps_strerror(frc),
                frc == PS_EFULL ? ": " : "",
                frc != PS_EFULL ? "" : full ? full : psd_store_full_reason(s->store));
    return false;
}

/* Named steps, as Push's: decode, make room, check every gradient, apply
 * them all or none (the tier), note the versions, answer at once or, with
 * --durable, after the flusher's commit (push.c's durable list). */
void shard_sparse_push(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    psd_shard *s = ctx;
    ps_wire_sparse r = {0};
    pending_push *p = NULL;
    struct psd_sparse_grad *parts = NULL;
    struct answer a = {0};
    uint64_t bytes = 0, reply = 0;
    float *wide = NULL;
    double t0 = ps_metrics_now();
    if (!decode(s, call, true, req, len, &r) || !widen_room(s, call, &r, &wide) ||
        !push_room(s, call))
        goto out;
    size_t n = r.nitems;
    p = calloc(1, sizeof *p);
    parts = calloc(n, sizeof *parts);
    if (p == NULL || parts == NULL || (p->vars = calloc(n, sizeof *p->vars)) == NULL ||
        (p->versions = calloc(n, sizeof *p->versions)) == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePush: out of memory");
        goto out;
    }
    p->call = call;
    p->nitems = n;
    p->t0 = t0;
    pthread_rwlock_rdlock(&s->table_lock);
    bool ok = push_check(s, call, &r, p->vars, parts, wide, &bytes);
    for (size_t i = 0; ok && r.return_values && i < n; i++)
        reply += parts[i].n * psd_sparse_value_bytes(parts[i].t, false);
    ok = ok && (!r.return_values || reply_fits(s, call, "SparsePush", reply)) &&
              answer_alloc(call, parts, n, r.return_values, &a);
    if (ok) {
        size_t bad;
        char why[512];
        int rc = psd_sparse_push(s->sparse, parts, n, r.step, shard_caps_room(s), &bad, why,
                                 sizeof why);
        if (rc != 0)
            push_failed(s, call, p->vars[bad], rc, why);
        ok = rc == 0;
    }
    if (ok) {
        push_note(s, p->vars, n, r.step, p->versions);
        answer_put(&a, p->vars, parts, n, p->versions, r.return_values);
        p->parts = a.parts;
        p->nparts = a.nparts;
        p->reply_mem = a.mem;
        a = (struct answer){0};
        if (s->o.durable) { /* parked while its variables are sure to be listed */
            shard_push_complete(s, p);
            p = NULL;
        }
    }
    pthread_rwlock_unlock(&s->table_lock);
    if (ok) {
        atomic_fetch_add(&s->bytes_in, bytes);
        if (wide != NULL)
            atomic_fetch_add(&s->half_pushes, 1);
        if (p != NULL) /* the answer reads no variable: sent without the lock */
            shard_push_complete(s, p);
        p = NULL;
    }
out:
    if (p != NULL)
        shard_pending_free(p);
    free(a.mem);
    free(a.parts);
    free(parts);
    free(wide);
    ps_wire_sparse_free(&r);
}
