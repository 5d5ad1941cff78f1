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
#include "common/log.h"
#include "common/rpc_msg.h"
#include "common/wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Finds the sparse table `name` for method. Returns it, or NULL with call
 * failed and counted as a bad request. table_lock held. */
static psd_var *find_table(psd_shard *s, ps_rpc_call *call, const char *method,
                           const char *name)
{
    size_t len = strlen(name);
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

/* Room for a reply: the rows and their headers within the message limit. */
static bool reply_fits(psd_shard *s, ps_rpc_call *call, const char *method,
                       uint64_t floats)
{
    if (floats * sizeof(float) + 4096 <= s->o.max_message_bytes)
        return true;
    shard_count_bad(s);
    ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: the rows asked for are %llu "
                "bytes, over the message limit of %zu; ask for fewer ids", method,
                (unsigned long long)(floats * sizeof(float)), s->o.max_message_bytes);
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
    Ps__V1__SparsePullRequest *r = shard_unpack(
        s, call, "SparsePull", &ps__v1__sparse_pull_request__descriptor, req, len);
    if (r == NULL)
        return;
    size_t n = r->n_items;
    if (n == 0) {
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePull: no items");
        ps__v1__sparse_pull_request__free_unpacked(r, NULL);
        return;
    }
    psd_var **vars = calloc(n, sizeof *vars);
    ps_rpc_msg **msgs = calloc(n, sizeof *msgs);
    uint8_t *hdr = malloc(n * PS_WIRE_VALUE_HDR_MAX);
    ps_rpc_part *parts = calloc(2 * n, sizeof *parts);
    pthread_rwlock_rdlock(&s->table_lock);
    bool ok = vars && msgs && hdr && parts;
    if (!ok)
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePull: out of memory");
    uint64_t floats = 0;
    for (size_t i = 0; i < n && ok; i++) {
        vars[i] = find_table(s, call, "SparsePull", r->items[i]->name);
        ok = vars[i] != NULL;
        for (size_t j = 0; j < i && ok; j++)
            if (vars[j] == vars[i]) {
                shard_count_bad(s);
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePull: table '%s' "
                            "is named twice", vars[i]->name);
                ok = false;
            }
        if (ok)
            floats += (uint64_t)r->items[i]->n_ids * psd_sparse_table_dim(vars[i]->sparse);
    }
    ok = ok && reply_fits(s, call, "SparsePull", floats);
    for (size_t i = 0; i < n && ok; i++) {
        psd_var *v = vars[i];
        size_t ni = r->items[i]->n_ids, dim = psd_sparse_table_dim(v->sparse);
        size_t nb = ni * dim * sizeof(float);
        msgs[i] = ps_rpc_msg_new(nb ? nb : 1);
        float *out = msgs[i] ? (float *)(void *)ps_rpc_msg_data(msgs[i]) : NULL;
        uint64_t inserted = 0;
        int rc = out ? psd_sparse_pull(s->sparse, v->sparse, r->items[i]->ids, ni, out,
                                       &inserted)
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
        uint8_t *end = ps_wire_value_header(h, 1, v->name, v->version, shape, 2, nb, NULL);
        pthread_rwlock_unlock(&v->lock);
        parts[2 * i] = (ps_rpc_part){h, (size_t)(end - h), NULL, NULL};
        parts[2 * i + 1] = (ps_rpc_part){out, nb, ps_rpc_msg_release, msgs[i]};
    }
    pthread_rwlock_unlock(&s->table_lock);
    if (ok) {
        atomic_fetch_add(&s->bytes_out, floats * sizeof(float));
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
    ps__v1__sparse_pull_request__free_unpacked(r, NULL);
}

/* ---- SparsePush ---------------------------------------------------------- */

/* Checks gradient g of the push against its table v; false with call
 * failed. */
static bool check_grad(psd_shard *s, ps_rpc_call *call, const Ps__V1__SparseGradient *g,
                       const psd_var *v)
{
    size_t dim = psd_sparse_table_dim(v->sparse);
    const Ps__V1__Tensor *tn = g->grad;
    const char *why = NULL;
    char buf[160];
    if (tn == NULL)
        why = "grad is missing";
    else if (tn->dtype != PS__V1__DTYPE__DTYPE_FLOAT32)
        why = "grad must be FLOAT32";
    else if (tn->shm != NULL)
        why = "grad in shared memory is not served for sparse tables; send it inline";
    else if (tn->n_shape != 2 || tn->shape[0] != (int64_t)g->n_ids ||
             tn->shape[1] != (int64_t)dim) {
        snprintf(buf, sizeof buf, "grad must have shape [%zu, %zu] (ids, dim), got "
                 "%zu dimension(s) %lld x %lld", g->n_ids, dim, tn->n_shape,
                 tn->n_shape > 0 ? (long long)tn->shape[0] : 0LL,
                 tn->n_shape > 1 ? (long long)tn->shape[1] : 0LL);
        why = buf;
    } else if (tn->data.len != g->n_ids * dim * sizeof(float)) {
        snprintf(buf, sizeof buf, "grad has %zu bytes, [%zu, %zu] floats need %zu",
                 tn->data.len, g->n_ids, dim, g->n_ids * dim * sizeof(float));
        why = buf;
    } else if (!s->o.allow_nonfinite &&
               !psd_all_finite((const psd_ufloat *)(const void *)tn->data.data,
                               g->n_ids * dim)) {
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

/* Checks every gradient, each table named once, and makes the tier's
 * parts of the push; false with call failed. */
static bool push_check(psd_shard *s, ps_rpc_call *call, const Ps__V1__SparsePushRequest *r,
                       psd_var **vars, struct psd_sparse_grad *parts, uint64_t *floats)
{
    for (size_t i = 0; i < r->n_grads; i++) {
        const Ps__V1__SparseGradient *g = r->grads[i];
        vars[i] = find_table(s, call, "SparsePush", g->name);
        if (vars[i] == NULL || !check_grad(s, call, g, vars[i]))
            return false;
        for (size_t j = 0; j < i; j++)
            if (vars[j] == vars[i]) {
                shard_count_bad(s);
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePush: table '%s' "
                            "has two gradients in one push", vars[i]->name);
                return false;
            }
        size_t dim = psd_sparse_table_dim(vars[i]->sparse);
        parts[i] = (struct psd_sparse_grad){.t = vars[i]->sparse, .ids = g->ids,
                                            .n = g->n_ids, .grad = g->grad->data.data};
        *floats += (uint64_t)g->n_ids * dim;
    }
    return true;
}

/* Room for the rows a push returns, after the update. */
static bool push_values_alloc(psd_shard *s, ps_rpc_call *call, struct psd_sparse_grad *parts,
                              size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t dim = psd_sparse_table_dim(parts[i].t);
        parts[i].values = malloc(parts[i].n * dim * sizeof(float) + 1);
        if (parts[i].values == NULL) {
            (void)s;
            ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePush: out of memory");
            return false;
        }
    }
    return true;
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

static void push_failed(psd_shard *s, ps_rpc_call *call, psd_var *v, int rc, int64_t bad_id)
{
    if (rc == PS_EINVAL_ARG) {
        atomic_fetch_add(&s->nonfinite, 1);
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePush: sparse table '%s': the "
                    "update of row %lld would make a value or slot non-finite; nothing "
                    "applied", v->name, (long long)bad_id);
    } else {
        fail_rc(call, "SparsePush", v->name, rc);
    }
}

/* Answers an applied push, with the rows when asked. */
static void push_reply(ps_rpc_call *call, psd_var **vars, struct psd_sparse_grad *parts,
                       size_t n, uint64_t *versions, bool values)
{
    Ps__V1__SparsePushResponse resp = PS__V1__SPARSE_PUSH_RESPONSE__INIT;
    resp.n_versions = n;
    resp.versions = versions;
    Ps__V1__SparseRows *rows = values ? calloc(n, sizeof *rows) : NULL;
    Ps__V1__SparseRows **rowp = values ? calloc(n, sizeof *rowp) : NULL;
    Ps__V1__Tensor *tens = values ? calloc(n, sizeof *tens) : NULL;
    int64_t(*shapes)[2] = values ? calloc(n, sizeof *shapes) : NULL;
    if (values && !(rows && rowp && tens && shapes)) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePush: applied, but out "
                    "of memory for the returned rows");
        goto out;
    }
    for (size_t i = 0; values && i < n; i++) {
        size_t dim = psd_sparse_table_dim(parts[i].t);
        ps__v1__sparse_rows__init(&rows[i]);
        ps__v1__tensor__init(&tens[i]);
        rows[i].name = vars[i]->name;
        rows[i].version = versions[i];
        shapes[i][0] = (int64_t)parts[i].n;
        shapes[i][1] = (int64_t)dim;
        tens[i].dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
        tens[i].n_shape = 2;
        tens[i].shape = shapes[i];
        tens[i].data.len = parts[i].n * dim * sizeof(float);
        tens[i].data.data = (uint8_t *)parts[i].values;
        rows[i].values = &tens[i];
        rowp[i] = &rows[i];
    }
    resp.n_values = values ? n : 0;
    resp.values = rowp;
    ps_rpc_reply_pb(call, &resp);
out:
    free(rows);
    free(rowp);
    free(tens);
    free(shapes);
}

/* Past the RAM tier's budget, or with more changed rows than a commit
 * writes in ~40 ms: commit first (and past the budget, apply the row
 * log), so that clean rows can go and the kill -9 bound holds. A commit
 * that fails (a full map or disk) leaves them all changed: then the push
 * is refused rather than the tier outgrowing its bound. False with call
 * failed. */
static bool push_room(psd_shard *s, ps_rpc_call *call)
{
    if (!psd_sparse_needs_commit(s->sparse))
        return true;
    int frc = psd_shard_flush(s);
    /* Rows still held: logged but not yet in LMDB. Apply enough of the
     * log. */
    if (frc == 0 && psd_sparse_over_budget(s->sparse))
        frc = psd_sparse_make_room(s->sparse);
    if (frc == 0 || !psd_sparse_over_budget(s->sparse))
        return true;
    ps_rpc_fail(call, frc == PS_EFULL ? PS_RPC_RESOURCE_EXHAUSTED : ps_rpc_code_from_err(frc),
                "SparsePush: the rows changed so far cannot be committed (%s%s%s) and "
                "fill the RAM tier; nothing applied", ps_strerror(frc),
                frc == PS_EFULL ? ": " : "",
                frc == PS_EFULL ? psd_store_full_reason(s->store) : "");
    return false;
}

void shard_sparse_push(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    psd_shard *s = ctx;
    Ps__V1__SparsePushRequest *r = shard_unpack(
        s, call, "SparsePush", &ps__v1__sparse_push_request__descriptor, req, len);
    if (r == NULL)
        return;
    size_t n = r->n_grads;
    if (n == 0) {
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePush: no grads");
        ps__v1__sparse_push_request__free_unpacked(r, NULL);
        return;
    }
    if (!push_room(s, call)) {
        ps__v1__sparse_push_request__free_unpacked(r, NULL);
        return;
    }
    psd_var **vars = calloc(n, sizeof *vars);
    struct psd_sparse_grad *parts = calloc(n, sizeof *parts);
    uint64_t *versions = calloc(n, sizeof *versions);
    uint64_t floats = 0;
    pthread_rwlock_rdlock(&s->table_lock);
    bool ok = vars && parts && versions;
    if (!ok)
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePush: out of memory");
    ok = ok && push_check(s, call, r, vars, parts, &floats);
    ok = ok && (!r->return_values || reply_fits(s, call, "SparsePush", floats));
    ok = ok && (!r->return_values || push_values_alloc(s, call, parts, n));
    if (ok) {
        size_t bad;
        int64_t bad_id;
        int rc = psd_sparse_push(s->sparse, parts, n, r->step, &bad, &bad_id);
        if (rc == 0)
            push_note(s, vars, n, r->step, versions);
        else
            push_failed(s, call, vars[bad], rc, bad_id);
        ok = rc == 0;
    }
    pthread_rwlock_unlock(&s->table_lock);
    if (ok) {
        atomic_fetch_add(&s->bytes_in, floats * sizeof(float));
        int rc = s->o.durable ? psd_shard_flush(s) : 0;
        if (rc != 0)
            ps_rpc_fail(call, ps_rpc_code_from_err(rc), "SparsePush: applied, but "
                        "the commit to LMDB failed: %s", ps_strerror(rc));
        else
            push_reply(call, vars, parts, n, versions, r->return_values);
    }
    for (size_t i = 0; parts && i < n; i++)
        free(parts[i].values);
    free(parts);
    free(vars);
    free(versions);
    ps__v1__sparse_push_request__free_unpacked(r, NULL);
}
