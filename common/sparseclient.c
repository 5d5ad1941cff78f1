/*
 * sparseclient.c - SparsePull / SparsePush split over hash-partitioned
 * shards and merged back in request order (sparseclient.h has the rule).
 */
#include "common/sparseclient.h"
#include "common/errors.h"
#include "common/half.h"
#include "common/rpc_msg.h"
#include "common/wire.h"
#include "proto/ps.pb-c.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t ps_sparse_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* Lamping & Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm". */
static uint32_t jump_hash(uint64_t key, uint32_t n)
{
    int64_t b = -1, j = 0;
    while (j < (int64_t)n) {
        b = j;
        key = key * 2862933555777941757ULL + 1;
        j = (int64_t)((double)(b + 1) * ((double)(1LL << 31) / (double)((key >> 33) + 1)));
    }
    return (uint32_t)b;
}

uint32_t ps_sparse_shard_of(int64_t id, uint32_t nshards)
{
    if (nshards <= 1)
        return 0;
    return jump_hash(ps_sparse_mix64((uint64_t)id), nshards);
}

/* The per-shard split of a call: for each (shard, item), the positions in
 * the item's ids that go there, and the ids in that order. */
struct split {
    int nshards;
    size_t nitems;
    size_t *count;   /* [shard * nitems + item] */
    size_t **pos;    /* [shard * nitems + item] -> positions */
    int64_t **ids;   /* same, the ids */
};

static void split_free(struct split *sp)
{
    size_t k = (size_t)sp->nshards * sp->nitems;
    for (size_t i = 0; sp->pos && i < k; i++) {
        free(sp->pos[i]);
        free(sp->ids[i]);
    }
    free(sp->pos);
    free(sp->ids);
    free(sp->count);
}

static int split_make(struct split *sp, int nshards, const ps_sparse_item *items,
                      size_t n)
{
    size_t k = (size_t)nshards * n;
    *sp = (struct split){.nshards = nshards, .nitems = n};
    sp->count = calloc(k, sizeof *sp->count);
    sp->pos = calloc(k, sizeof *sp->pos);
    sp->ids = calloc(k, sizeof *sp->ids);
    uint32_t *shard_of = NULL;
    size_t maxn = 0;
    for (size_t i = 0; i < n; i++)
        maxn = items[i].n > maxn ? items[i].n : maxn;
    shard_of = malloc((maxn ? maxn : 1) * sizeof *shard_of);
    if (!sp->count || !sp->pos || !sp->ids || !shard_of)
        goto nomem;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < items[i].n; j++) {
            shard_of[j] = ps_sparse_shard_of(items[i].ids[j], (uint32_t)nshards);
            sp->count[shard_of[j] * n + i]++;
        }
        for (int s = 0; s < nshards; s++) {
            size_t c = sp->count[(size_t)s * n + i];
            if (c == 0)
                continue;
            sp->pos[(size_t)s * n + i] = malloc(c * sizeof(size_t));
            sp->ids[(size_t)s * n + i] = malloc(c * sizeof(int64_t));
            if (!sp->pos[(size_t)s * n + i] || !sp->ids[(size_t)s * n + i])
                goto nomem;
            sp->count[(size_t)s * n + i] = 0;
        }
        for (size_t j = 0; j < items[i].n; j++) {
            size_t slot = shard_of[j] * n + i;
            sp->pos[slot][sp->count[slot]] = j;
            sp->ids[slot][sp->count[slot]++] = items[i].ids[j];
        }
    }
    free(shard_of);
    return 0;
nomem:
    free(shard_of);
    split_free(sp);
    return -ENOMEM;
}

static int check_items(int nshards, const ps_sparse_item *items, size_t n,
                       ps_rpc_status *st)
{
    const char *why = NULL;
    if (nshards < 1 || n == 0 || n > PS_SPARSE_MAX_TABLES)
        why = "no shard, or no table or more than 16 tables";
    for (size_t i = 0; !why && i < n; i++)
        if (items[i].name == NULL || items[i].dim < 1 ||
            (items[i].n > 0 && (items[i].ids == NULL || items[i].rows == NULL)))
            why = "a table without a name, a dim or its arrays";
    if (!why)
        return 0;
    if (st) {
        st->code = PS_RPC_INVALID_ARGUMENT;
        snprintf(st->message, sizeof st->message, "sparse call: %s", why);
    }
    return PS_EINVAL_ARG;
}

/* What a pull and a push do before any shard is called: check the items, split them by shard
 * and clear the versions the answers fill in. */
static int split_begin(struct split *sp, int nshards, ps_sparse_item *items, size_t n,
                       ps_rpc_status *st)
{
    int rc = check_items(nshards, items, n, st);
    if (rc != 0)
        return rc;
    rc = split_make(sp, nshards, items, n);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        items[i].version = 0;
    return 0;
}

/* Copies one shard's answer for item i (rows of its ids in the split's
 * order) back to the item's positions. */
/* The bytes of an element of a SparseRows Tensor of dtype: a table of
 * float16 or bfloat16 rows answers them as stored, 2 bytes each. */
static size_t elem_bytes(int dtype)
{
    return dtype == PS_HALF_F16 || dtype == PS_HALF_BF16 ? 2 : sizeof(float);
}

/* Row j of c received (src, of dtype) into dst, d float32. */
static void row_in(float *dst, const uint8_t *src, size_t d, int dtype)
{
    if (elem_bytes(dtype) == 2)
        ps_half_to_f32(dtype, (const uint16_t *)(const void *)src, dst, d);
    else
        memcpy(dst, src, d * sizeof(float));
}

static int merge_rows(const struct split *sp, int s, size_t i, ps_sparse_item *it,
                      const Ps__V1__SparseRows *r, ps_rpc_status *st)
{
    size_t c = sp->count[(size_t)s * sp->nitems + i];
    size_t d = (size_t)it->dim;
    size_t eb = r && r->values ? elem_bytes((int)r->values->dtype) : sizeof(float);
    if (r == NULL || r->values == NULL || r->values->data.len != c * d * eb) {
        if (st) {
            st->code = PS_RPC_INTERNAL;
            snprintf(st->message, sizeof st->message, "shard %d answered %zu bytes for "
                     "table '%s', expected %zu rows of dim %zu", s,
                     r && r->values ? r->values->data.len : 0, it->name, c, d);
        }
        return PS_ESHAPE;
    }
    const uint8_t *src = r->values->data.data;
    const size_t *pos = sp->pos[(size_t)s * sp->nitems + i];
    for (size_t j = 0; j < c; j++)
        row_in(it->rows + pos[j] * d, src + j * d * eb, d, (int)r->values->dtype);
    if (r->version > it->version)
        it->version = r->version;
    return 0;
}

static void name_shard(ps_rpc_status *st, int s)
{
    if (!st)
        return;
    char m[sizeof st->message - 24];
    memcpy(m, st->message, sizeof m);
    m[sizeof m - 1] = '\0';
    snprintf(st->message, sizeof st->message, "shard %d: %s", s, m);
}

/* A shard's SparsePullResponse, read as gRPC hands it over: each table's
 * rows go from the received pieces straight to their places in the
 * caller's array (a SparsePullResponse is a PullResponse on the wire: rows
 * = values, field 1 of {name 1, version 2, Tensor 3}). Before, the
 * response was copied whole, unpacked (copied again) and then scattered:
 * a megabyte twice more for a batch of 4096 rows of dim 64. */
struct pull_rows {
    const struct split *sp;
    int s;
    ps_sparse_item *items;
    const size_t *used;
    bool had;
    uint16_t *tmp; /* a half row as received, before it is widened (max dim) */
};

static int on_rows(void *ctx, enum ps_wire_event ev, ps_wire_value *v, char *err,
                   size_t errlen)
{
    struct pull_rows *pr = ctx;
    size_t i = pr->used[v->index];
    ps_sparse_item *it = &pr->items[i];
    size_t c = pr->sp->count[(size_t)pr->s * pr->sp->nitems + i], d = (size_t)it->dim;
    if (ev == PS_WIRE_SHM) {
        snprintf(err, errlen, "table '%s': rows in shared memory, not asked for", it->name);
        return PS_EPARSE;
    }
    if (ev == PS_WIRE_DATA) {
        size_t eb = elem_bytes(v->dtype);
        if (v->data.left != c * d * eb) {
            snprintf(err, errlen, "answered %zu bytes for table '%s', expected %zu rows "
                     "of dim %zu", v->data.left, it->name, c, d);
            return PS_ESHAPE;
        }
        const size_t *pos = pr->sp->pos[(size_t)pr->s * pr->sp->nitems + i];
        for (size_t j = 0; j < c; j++) {
            float *dst = it->rows + pos[j] * d;
            if (ps_wire_bytes_take(&v->data, eb == 2 ? (void *)pr->tmp : (void *)dst,
                                   d * eb) != 0)
                return PS_EPARSE;
            if (eb == 2)
                ps_half_to_f32(v->dtype, pr->tmp, dst, d);
        }
        pr->had = true;
        return 0;
    }
    bool had = pr->had;
    pr->had = false;
    if (v->name_len != strlen(it->name) || memcmp(v->name, it->name, v->name_len) != 0) {
        snprintf(err, errlen, "rows %zu are of table '%.*s', expected '%s'", v->index,
                 (int)v->name_len, v->name, it->name);
        return PS_EPARSE;
    }
    if (!had && c > 0) {
        snprintf(err, errlen, "no rows for table '%s', expected %zu of dim %zu", it->name,
                 c, d);
        return PS_ESHAPE;
    }
    if (v->version > it->version)
        it->version = v->version;
    return 0;
}

struct pull_decode {
    struct pull_rows pr;
    size_t m;
    char err[200];
};

static int decode_rows(void *ctx, const struct ps_piece *pieces, int np)
{
    struct pull_decode *pd = ctx;
    pd->pr.had = false;
    return ps_wire_values_decode(pieces, np, false, pd->m, NULL, 0, on_rows, &pd->pr,
                                 pd->err, sizeof pd->err);
}

/* The items' next ids split as the ids of items of their own, into *nx
 * when any were given (*hint; then split_free it). Returns 0 or -ENOMEM. */
static int split_next(struct split *nx, int nshards, const ps_sparse_item *items, size_t n,
                      bool *hint)
{
    ps_sparse_item next[PS_SPARSE_MAX_TABLES];
    *hint = false;
    for (size_t i = 0; i < n; i++) {
        next[i] = (ps_sparse_item){.name = items[i].name, .ids = items[i].next_ids,
                                   .n = items[i].next_ids ? items[i].next_n : 0};
        *hint |= next[i].n > 0;
    }
    int rc = *hint ? split_make(nx, nshards, next, n) : 0;
    if (rc != 0)
        *hint = false;
    return rc;
}

/* One shard's pull: its ids of each table, and of the next ids (nx: their
 * split, NULL when none were given) its own, so that a shard with no ids
 * of a table now but some next still hears of them. */
static int pull_shard(ps_client *c, int s, const struct split *sp, const struct split *nx,
                      ps_sparse_item *items, size_t n, int deadline_ms,
                      ps_rpc_status *st)
{
    Ps__V1__SparsePullItem pi[PS_SPARSE_MAX_TABLES];
    Ps__V1__SparsePullItem *pp[PS_SPARSE_MAX_TABLES];
    size_t used[PS_SPARSE_MAX_TABLES], m = 0;
    for (size_t i = 0; i < n; i++) {
        size_t cnt = sp->count[(size_t)s * n + i];
        size_t cn = nx ? nx->count[(size_t)s * n + i] : 0;
        if (cnt == 0 && cn == 0)
            continue;
        ps__v1__sparse_pull_item__init(&pi[m]);
        pi[m].name = (char *)items[i].name;
        pi[m].n_ids = cnt;
        pi[m].ids = sp->ids[(size_t)s * n + i];
        pi[m].n_next_ids = cn;
        pi[m].next_ids = cn ? nx->ids[(size_t)s * n + i] : NULL;
        pp[m] = &pi[m];
        used[m++] = i;
    }
    if (m == 0)
        return 0;
    Ps__V1__SparsePullRequest req = PS__V1__SPARSE_PULL_REQUEST__INIT;
    req.n_items = m;
    req.items = pp;
    size_t len = ps__v1__sparse_pull_request__get_packed_size(&req);
    ps_rpc_msg *msg = ps_rpc_msg_new(len);
    if (msg == NULL)
        return -ENOMEM;
    ps__v1__sparse_pull_request__pack(&req, ps_rpc_msg_data(msg));
    ps_rpc_msg_set_len(msg, len);
    int maxd = 1;
    for (size_t k = 0; k < m; k++)
        maxd = items[used[k]].dim > maxd ? items[used[k]].dim : maxd;
    struct pull_decode pd = {{sp, s, items, used, false, malloc((size_t)maxd * 2)}, m, ""};
    if (pd.pr.tmp == NULL) {
        ps_rpc_msg_unref(msg);
        return -ENOMEM;
    }
    ps_rpc_status local;
    ps_rpc_status *stp = st ? st : &local;
    int rc = ps_rpc_invoke_msg(ps_client_rpc(c), "/ps.v1.ParameterServer/SparsePull", msg,
                               decode_rows, &pd, deadline_ms, stp);
    ps_rpc_msg_unref(msg);
    free(pd.pr.tmp);
    if (rc != 0 && pd.err[0] != '\0') {
        stp->code = PS_RPC_INTERNAL;
        snprintf(stp->message, sizeof stp->message, "SparsePull: %s", pd.err);
    }
    if (rc != 0)
        name_shard(st, s);
    return rc;
}

int ps_client_sparse_pull(ps_client *const *shards, int nshards,
                          ps_sparse_item *items, size_t n, int deadline_ms,
                          ps_rpc_status *st)
{
    struct split sp, nx;
    int rc = split_begin(&sp, nshards, items, n, st);
    if (rc != 0)
        return rc;
    bool hint = false;
    if ((rc = split_next(&nx, nshards, items, n, &hint)) != 0) {
        split_free(&sp);
        return rc;
    }
    for (int s = 0; rc == 0 && s < nshards; s++)
        rc = pull_shard(shards[s], s, &sp, hint ? &nx : NULL, items, n, deadline_ms, st);
    if (hint)
        split_free(&nx);
    split_free(&sp);
    return rc;
}

/* One shard's push: the gradient rows of its ids, gathered, with its
 * share of the next ids (nx: their split, NULL when none were given). */
static int push_shard(ps_client *c, int s, const struct split *sp, const struct split *nx,
                      uint32_t worker, uint64_t step, ps_sparse_item *items, size_t n,
                      bool ret, int deadline_ms, ps_rpc_status *st)
{
    Ps__V1__SparseGradient g[PS_SPARSE_MAX_TABLES];
    Ps__V1__SparseGradient *gp[PS_SPARSE_MAX_TABLES];
    Ps__V1__Tensor t[PS_SPARSE_MAX_TABLES];
    int64_t shape[PS_SPARSE_MAX_TABLES][2];
    float *buf[PS_SPARSE_MAX_TABLES];
    size_t used[PS_SPARSE_MAX_TABLES], m = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        size_t cnt = sp->count[(size_t)s * n + i], d = (size_t)items[i].dim;
        if (cnt == 0)
            continue;
        buf[m] = malloc(cnt * d * sizeof(float));
        if (!buf[m]) {
            rc = -ENOMEM;
            break;
        }
        const size_t *pos = sp->pos[(size_t)s * n + i];
        for (size_t j = 0; j < cnt; j++)
            memcpy(buf[m] + j * d, items[i].rows + pos[j] * d, d * sizeof(float));
        ps__v1__tensor__init(&t[m]);
        t[m].dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
        shape[m][0] = (int64_t)cnt;
        shape[m][1] = (int64_t)d;
        t[m].n_shape = 2;
        t[m].shape = shape[m];
        t[m].data.data = (uint8_t *)buf[m];
        t[m].data.len = cnt * d * sizeof(float);
        ps__v1__sparse_gradient__init(&g[m]);
        g[m].name = (char *)items[i].name;
        g[m].n_ids = cnt;
        g[m].ids = sp->ids[(size_t)s * n + i];
        g[m].n_next_ids = nx ? nx->count[(size_t)s * n + i] : 0;
        g[m].next_ids = g[m].n_next_ids ? nx->ids[(size_t)s * n + i] : NULL;
        g[m].grad = &t[m];
        gp[m] = &g[m];
        used[m++] = i;
    }
    if (rc == 0 && m > 0) {
        Ps__V1__SparsePushRequest req = PS__V1__SPARSE_PUSH_REQUEST__INIT;
        req.worker = worker;
        req.step = step;
        req.n_grads = m;
        req.grads = gp;
        req.return_values = ret;
        void *resp = NULL;
        rc = ps_rpc_invoke_pb(ps_client_rpc(c), "/ps.v1.ParameterServer/SparsePush", &req,
                              &ps__v1__sparse_push_response__descriptor, &resp,
                              deadline_ms, st);
        if (rc != 0)
            name_shard(st, s);
        Ps__V1__SparsePushResponse *r = resp;
        for (size_t k = 0; rc == 0 && k < m; k++) {
            ps_sparse_item *it = &items[used[k]];
            if (k < r->n_versions && r->versions[k] > it->version)
                it->version = r->versions[k];
            if (ret)
                rc = merge_rows(sp, s, used[k], it, k < r->n_values ? r->values[k] : NULL,
                                st);
        }
        if (r)
            ps__v1__sparse_push_response__free_unpacked(r, NULL);
    }
    for (size_t k = 0; k < m; k++)
        free(buf[k]);
    return rc;
}

int ps_client_sparse_push(ps_client *const *shards, int nshards, uint32_t worker,
                          uint64_t step, ps_sparse_item *items, size_t n,
                          bool return_values, int deadline_ms, ps_rpc_status *st)
{
    struct split sp, nx;
    int rc = split_begin(&sp, nshards, items, n, st);
    if (rc != 0)
        return rc;
    bool hint = false;
    rc = split_next(&nx, nshards, items, n, &hint);
    for (int s = 0; rc == 0 && s < nshards; s++)
        rc = push_shard(shards[s], s, &sp, hint ? &nx : NULL, worker, step, items, n,
                        return_values, deadline_ms, st);
    if (hint)
        split_free(&nx);
    split_free(&sp);
    return rc;
}
