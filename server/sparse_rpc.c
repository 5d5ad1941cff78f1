/*
 * sparse_rpc.c - SparsePull and SparsePush (sparse.h). A push is checked
 * whole before anything is applied: names, shapes, finite gradients, and
 * every row's update proven finite, with the mutexes of all its tables held
 * (taken in table order), so a refused push changes nothing.
 */
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

/* Finds the sparse table `name` for item i of method. Returns it, or NULL
 * with call failed. table_lock held. */
static psd_var *find_table(psd_shard *s, ps_rpc_call *call, const char *method,
                           const char *name, size_t *pos)
{
    size_t len = strlen(name);
    psd_var *v = shard_find_var(s, name, len, pos);
    const char *np = v ? NULL : shard_name_problem(name, len);
    shard_count_bad(s);
    if (np != NULL) {
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: table name %s", method, np);
        return NULL;
    }
    if (v == NULL) {
        ps_rpc_fail(call, PS_RPC_NOT_FOUND, "%s: sparse table '%s' does not exist",
                    method, name);
        return NULL;
    }
    if (v->sparse == NULL) {
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: variable '%s' is dense, not "
                    "a sparse table; use %s", method, name,
                    strcmp(method, "SparsePull") == 0 ? "Pull" : "Push");
        return NULL;
    }
    atomic_fetch_sub(&s->bad, 1); /* not bad after all */
    return v;
}

static void fail_rc(ps_rpc_call *call, const char *method, const char *name, int rc)
{
    ps_rpc_fail(call, ps_rpc_code_from_err(rc), "%s: sparse table '%s': the store "
                "failed: %s", method, name, ps_strerror(rc));
}

/* A row with no stored state: its initial value (and slots), stored now
 * with insert_on_pull. mu held. */
static int pull_new(psd_shard *s, psd_var *v, int64_t id, float *out, float *scratch)
{
    struct psd_sparse *t = v->sparse;
    if (!t->insert_on_pull) {
        sparse_init_row(t, id, out, false);
        return 0;
    }
    sparse_init_row(t, id, scratch, true);
    pthread_rwlock_rdlock(&v->lock);
    uint64_t clock = v->step;
    pthread_rwlock_unlock(&v->lock);
    if (sparse_install(t, id, scratch, 0, clock) == NULL)
        return -ENOMEM;
    sparse_count_new(t);
    shard_count_apply(s);
    memcpy(out, scratch, t->dim * sizeof(float));
    return 0;
}

/* Writes the values of ids into out (n * dim floats), in order. */
static int pull_rows(psd_shard *s, psd_var *v, const int64_t *ids, size_t n, float *out)
{
    struct psd_sparse *t = v->sparse;
    size_t dim = t->dim;
    float *scratch = t->insert_on_pull ? malloc(t->rowf * sizeof(float)) : NULL;
    if (t->insert_on_pull && scratch == NULL)
        return -ENOMEM;
    sparse_prefetch(s, t, ids, n);
    psd_store_rtxn *rt = NULL;
    sparse_lock(t);
    int rc = sparse_ready(s, t, v->name);
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct sp_entry *e;
        const uint8_t *data;
        sparse_ahead(t, ids, i, n);
        int k = sparse_lookup(s, t, &rt, ids[i], &e, &data);
        if (k == 1)
            memcpy(out + i * dim, e->row, dim * sizeof(float));
        else if (k == 2) {
            memcpy(out + i * dim, data + SPARSE_ROW_HEAD, dim * sizeof(float));
            sparse_cache(s, t, ids[i], data);
        }
        else if (k == 0)
            rc = pull_new(s, v, ids[i], out + i * dim, scratch);
        else
            rc = k;
    }
    pthread_mutex_unlock(&t->mu);
    psd_store_rend(rt);
    free(scratch);
    return rc;
}

static void rows_msg(Ps__V1__SparseRows *r, Ps__V1__Tensor *tn, int64_t *shape,
                     psd_var *v, size_t n, float *data)
{
    ps__v1__sparse_rows__init(r);
    ps__v1__tensor__init(tn);
    r->name = v->name;
    pthread_rwlock_rdlock(&v->lock);
    r->version = v->version;
    pthread_rwlock_unlock(&v->lock);
    shape[0] = (int64_t)n;
    shape[1] = (int64_t)v->sparse->dim;
    tn->dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    tn->n_shape = 2;
    tn->shape = shape;
    tn->data.len = n * v->sparse->dim * sizeof(float);
    tn->data.data = (uint8_t *)data;
    r->values = tn;
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
    uint64_t floats = 0, nrows = 0;
    for (size_t i = 0; i < n && ok; i++) {
        vars[i] = find_table(s, call, "SparsePull", r->items[i]->name, NULL);
        ok = vars[i] != NULL;
        for (size_t j = 0; j < i && ok; j++)
            if (vars[j] == vars[i]) {
                shard_count_bad(s);
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePull: table '%s' "
                            "is named twice", vars[i]->name);
                ok = false;
            }
        if (ok) {
            floats += (uint64_t)r->items[i]->n_ids * vars[i]->sparse->dim;
            nrows += r->items[i]->n_ids;
        }
    }
    ok = ok && reply_fits(s, call, "SparsePull", floats);
    for (size_t i = 0; i < n && ok; i++) {
        psd_var *v = vars[i];
        size_t ni = r->items[i]->n_ids, dim = v->sparse->dim, nb = ni * dim * sizeof(float);
        msgs[i] = ps_rpc_msg_new(nb ? nb : 1);
        float *out = msgs[i] ? (float *)(void *)ps_rpc_msg_data(msgs[i]) : NULL;
        int rc = out ? pull_rows(s, v, r->items[i]->ids, ni, out) : -ENOMEM;
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
        psd_sparse_count(nrows, 0, 0);
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

/* One gradient of a push, prepared: its distinct ids with their summed
 * gradients and their rows' current state. */
struct item {
    psd_var *v;
    size_t pos;          /* in the table of variables: the lock order */
    const Ps__V1__SparseGradient *g;
    size_t n, nu;        /* ids, distinct ids */
    int64_t *uid;        /* (nu) */
    size_t *which;       /* (n): the distinct id of ids[i] */
    float *gsum;         /* (nu * dim) */
    float *state;        /* (nu * rowf): value and slots */
    uint64_t *upd;       /* (nu) updates applied so far */
    uint8_t *kind;       /* (nu) 0 not admitted, 1 has a row, 2 new */
};

static void item_free(struct item *it)
{
    free(it->uid);
    free(it->which);
    free(it->gsum);
    free(it->state);
    free(it->upd);
    free(it->kind);
}

/* Checks gradient i of the push; its table's into it->v. */
static bool check_grad(psd_shard *s, ps_rpc_call *call, const Ps__V1__SparseGradient *g,
                       struct item *it)
{
    it->v = find_table(s, call, "SparsePush", g->name, &it->pos);
    if (it->v == NULL)
        return false;
    it->g = g;
    it->n = g->n_ids;
    size_t dim = it->v->sparse->dim;
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
                "nothing applied", it->v->name, why);
    return false;
}

static int cmp_idpos(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* Groups the ids, sums the gradients of each (in request order). */
static int group_ids(struct item *it)
{
    size_t n = it->n, dim = it->v->sparse->dim;
    int64_t *pairs = malloc((n ? n : 1) * 2 * sizeof *pairs);
    it->uid = malloc((n ? n : 1) * sizeof *it->uid);
    it->which = malloc((n ? n : 1) * sizeof *it->which);
    it->gsum = malloc((n ? n : 1) * dim * sizeof(float));
    if (!pairs || !it->uid || !it->which || !it->gsum) {
        free(pairs);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        pairs[2 * i] = it->g->ids[i];
        pairs[2 * i + 1] = (int64_t)i;
    }
    qsort(pairs, n, 2 * sizeof *pairs, cmp_idpos);
    const uint8_t *g = it->g->grad->data.data;
    size_t nu = 0;
    for (size_t k = 0; k < n; k++) {
        size_t i = (size_t)pairs[2 * k + 1];
        const psd_ufloat *gi = (const psd_ufloat *)(const void *)(g + i * dim * sizeof(float));
        if (k == 0 || pairs[2 * k] != pairs[2 * k - 2]) {
            it->uid[nu] = pairs[2 * k];
            memset(it->gsum + nu * dim, 0, dim * sizeof(float));
            nu++;
        }
        psd_accumulate(it->gsum + (nu - 1) * dim, gi, dim);
        it->which[i] = nu - 1;
    }
    it->nu = nu;
    free(pairs);
    return 0;
}

/* Reads each distinct id's state; t->mu held. Returns 0 or an error. */
static int load_state(psd_shard *s, struct item *it)
{
    struct psd_sparse *t = it->v->sparse;
    size_t nu = it->nu, rowf = t->rowf;
    it->state = malloc((nu ? nu : 1) * rowf * sizeof(float));
    it->upd = malloc((nu ? nu : 1) * sizeof *it->upd);
    it->kind = malloc(nu ? nu : 1);
    if (!it->state || !it->upd || !it->kind)
        return -ENOMEM;
    int rc = sparse_ready(s, t, it->v->name);
    psd_store_rtxn *rt = NULL;
    for (size_t u = 0; u < nu && rc == 0; u++) {
        struct sp_entry *e;
        const uint8_t *data;
        float *st = it->state + u * rowf;
        sparse_ahead(t, it->uid, u, nu);
        int k = sparse_lookup(s, t, &rt, it->uid[u], &e, &data);
        if (k == 1) {
            memcpy(st, e->row, rowf * sizeof(float));
            it->upd[u] = e->updates;
        } else if (k == 2) {
            memcpy(st, data + SPARSE_ROW_HEAD, rowf * sizeof(float));
            memcpy(&it->upd[u], data, sizeof(uint64_t));
        } else if (k == 0) {
            sparse_init_row(t, it->uid[u], st, true);
            it->upd[u] = 0;
        } else {
            rc = k;
        }
        it->kind[u] = (uint8_t)(k == 0 ? (sparse_admits(t, it->uid[u]) ? 2 : 0) : 1);
    }
    psd_store_rend(rt);
    return rc;
}

/* The first row whose update would be non-finite, or -1. */
static ptrdiff_t check_updates(const struct item *it)
{
    const struct psd_sparse *t = it->v->sparse;
    size_t dim = t->dim;
    for (size_t u = 0; u < it->nu; u++) {
        if (it->kind[u] == 0)
            continue;
        const float *st = it->state + u * t->rowf;
        if (psd_opt_check_part(&t->opt, st, st + dim, dim,
                               (const psd_ufloat *)(it->gsum + u * dim), dim, 1.0f,
                               it->upd[u] + 1) < dim)
            return (ptrdiff_t)u;
    }
    return -1;
}

/* Applies the item's updates and installs the rows; t->mu held. */
static int apply_item(psd_shard *s, struct item *it, uint64_t step, uint64_t *version)
{
    struct psd_sparse *t = it->v->sparse;
    size_t dim = t->dim;
    uint64_t applied = 0, skipped = 0;
    for (size_t u = 0; u < it->nu; u++) {
        float *st = it->state + u * t->rowf;
        if (it->kind[u] == 0) {
            sparse_count_push(t, it->uid[u]);
            skipped++;
            continue;
        }
        psd_opt_apply(&t->opt, st, st + dim, it->gsum + u * dim, dim, 1.0f,
                      it->upd[u] + 1);
        if (sparse_install(t, it->uid[u], st, it->upd[u] + 1, step) == NULL)
            return -ENOMEM;
        if (it->kind[u] == 2)
            sparse_count_new(t);
        applied++;
    }
    psd_sparse_count(0, applied, skipped);
    psd_var *v = it->v;
    pthread_rwlock_wrlock(&v->lock);
    v->version++;
    if (step > v->step)
        v->step = step;
    *version = v->version;
    pthread_rwlock_unlock(&v->lock);
    shard_count_apply(s);
    (void)s;
    return 0;
}

static int cmp_item_pos(const void *a, const void *b)
{
    const struct item *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Everything between the checks and the answer, with every table's mutex
 * held. Returns false with call failed (nothing applied). */
static bool push_apply(psd_shard *s, ps_rpc_call *call, struct item *items, size_t n,
                       uint64_t step, uint64_t *versions)
{
    for (size_t i = 0; i < n; i++) {
        int rc = group_ids(&items[i]);
        if (rc == 0)
            rc = load_state(s, &items[i]);
        if (rc != 0) {
            fail_rc(call, "SparsePush", items[i].v->name, rc);
            return false;
        }
        ptrdiff_t bad = check_updates(&items[i]);
        if (bad >= 0) {
            atomic_fetch_add(&s->nonfinite, 1);
            shard_count_bad(s);
            ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePush: sparse table "
                        "'%s': the update of row %lld would make a value or slot "
                        "non-finite; nothing applied", items[i].v->name,
                        (long long)items[i].uid[bad]);
            return false;
        }
    }
    for (size_t i = 0; i < n; i++) {
        int rc = apply_item(s, &items[i], step, &versions[i]);
        if (rc != 0) { /* out of memory mid-way: say so */
            fail_rc(call, "SparsePush", items[i].v->name, rc);
            return false;
        }
    }
    return true;
}

/* Answers an applied push, with the rows when asked. items are in the
 * request's order. */
static void push_reply(psd_shard *s, ps_rpc_call *call, struct item *items, size_t n,
                       uint64_t *versions, bool values)
{
    Ps__V1__SparsePushResponse resp = PS__V1__SPARSE_PUSH_RESPONSE__INIT;
    resp.n_versions = n;
    resp.versions = versions;
    Ps__V1__SparseRows *rows = values ? calloc(n, sizeof *rows) : NULL;
    Ps__V1__SparseRows **rowp = values ? calloc(n, sizeof *rowp) : NULL;
    Ps__V1__Tensor *tens = values ? calloc(n, sizeof *tens) : NULL;
    int64_t(*shapes)[2] = values ? calloc(n, sizeof *shapes) : NULL;
    float **bufs = values ? calloc(n, sizeof *bufs) : NULL;
    bool ok = !values || (rows && rowp && tens && shapes && bufs);
    for (size_t i = 0; values && ok && i < n; i++) {
        struct item *it = &items[i];
        size_t dim = it->v->sparse->dim, rowf = it->v->sparse->rowf;
        bufs[i] = malloc(it->n * dim * sizeof(float) + 1);
        if (bufs[i] == NULL) {
            ok = false;
            break;
        }
        for (size_t k = 0; k < it->n; k++)
            memcpy(bufs[i] + k * dim, it->state + it->which[k] * rowf, dim * sizeof(float));
        rows_msg(&rows[i], &tens[i], shapes[i], it->v, it->n, bufs[i]);
        rows[i].version = versions[i];
        rowp[i] = &rows[i];
    }
    if (ok) {
        resp.n_values = values ? n : 0;
        resp.values = rowp;
        ps_rpc_reply_pb(call, &resp);
    } else {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePush: applied, but out "
                    "of memory for the returned rows");
    }
    for (size_t i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(rows);
    free(rowp);
    free(tens);
    free(shapes);
}

/* Checks every gradient, each table named once; false with call failed. */
static bool push_check(psd_shard *s, ps_rpc_call *call, const Ps__V1__SparsePushRequest *r,
                       struct item *items, uint64_t *floats)
{
    for (size_t i = 0; i < r->n_grads; i++) {
        if (!check_grad(s, call, r->grads[i], &items[i]))
            return false;
        for (size_t j = 0; j < i; j++)
            if (items[j].v == items[i].v) {
                shard_count_bad(s);
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SparsePush: table '%s' "
                            "has two gradients in one push", items[i].v->name);
                return false;
            }
        *floats += (uint64_t)items[i].n * items[i].v->sparse->dim;
    }
    return true;
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
    /* Past the RAM tier's budget, or with more changed rows than a commit
     * writes in ~40 ms: commit first (and past the budget, apply the row
     * log), so that clean rows can go and the kill -9 bound holds.
     * A commit that fails (a full map or disk) leaves them all changed:
     * then the push is refused rather than the tier outgrowing its bound. */
    if (psd_sparse_ram_cost() > psd_sparse_budget(s) || psd_sparse_backlogged()) {
        int frc = psd_shard_flush(s);
        /* Rows still held: logged but not yet in LMDB. Apply enough of
         * the log. */
        if (frc == 0 && psd_sparse_ram_cost() > psd_sparse_budget(s))
            frc = psd_sparse_make_room(s);
        if (frc != 0 && psd_sparse_ram_cost() > psd_sparse_budget(s)) {
            ps_rpc_fail(call, frc == PS_EFULL ? PS_RPC_RESOURCE_EXHAUSTED
                                              : ps_rpc_code_from_err(frc),
                        "SparsePush: the rows changed so far cannot be committed "
                        "(%s%s%s) and fill the RAM tier; nothing applied",
                        ps_strerror(frc), frc == PS_EFULL ? ": " : "",
                        frc == PS_EFULL ? psd_store_full_reason(s->store) : "");
            ps__v1__sparse_push_request__free_unpacked(r, NULL);
            return;
        }
    }
    struct item *items = calloc(n, sizeof *items);
    struct item **order = calloc(n, sizeof *order);
    uint64_t *versions = calloc(n, sizeof *versions);
    uint64_t floats = 0;
    pthread_rwlock_rdlock(&s->table_lock);
    bool ok = items && order && versions;
    if (!ok)
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePush: out of memory");
    ok = ok && push_check(s, call, r, items, &floats);
    ok = ok && (!r->return_values || reply_fits(s, call, "SparsePush", floats));
    for (size_t i = 0; ok && i < n; i++)
        sparse_prefetch(s, items[i].v->sparse, items[i].g->ids, items[i].g->n_ids);
    if (ok) {
        /* The tables' mutexes in table order (the item order sorted). */
        struct item *sorted = malloc(n * sizeof *sorted);
        if (sorted == NULL) {
            ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "SparsePush: out of memory");
            ok = false;
        } else {
            memcpy(sorted, items, n * sizeof *sorted);
            qsort(sorted, n, sizeof *sorted, cmp_item_pos);
            for (size_t i = 0; i < n; i++)
                sparse_lock(sorted[i].v->sparse);
            ok = push_apply(s, call, items, n, r->step, versions);
            for (size_t i = n; i-- > 0;)
                pthread_mutex_unlock(&sorted[i].v->sparse->mu);
            free(sorted);
        }
    }
    pthread_rwlock_unlock(&s->table_lock);
    if (ok) {
        atomic_fetch_add(&s->bytes_in, floats * sizeof(float));
        int rc = s->o.durable ? psd_shard_flush(s) : 0;
        if (rc != 0)
            ps_rpc_fail(call, ps_rpc_code_from_err(rc), "SparsePush: applied, but "
                        "the commit to LMDB failed: %s", ps_strerror(rc));
        else
            push_reply(s, call, items, n, versions, r->return_values);
    }
    for (size_t i = 0; items && i < n; i++)
        item_free(&items[i]);
    free(items);
    free(order);
    free(versions);
    ps__v1__sparse_push_request__free_unpacked(r, NULL);
}
