/*
 * store_rows.c - the rows of sparse tables in the store's "rows" database
 * (layout in store.h). The second file of psd_store_lib: it sees LMDB, and
 * shares the store's state through store_internal.h.
 */
#include "server/store_internal.h"

#include "common/errors.h"
#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define ROW_KEY_LEN 12 /* u32 var_id BE + u64 (id ^ sign bit) BE */
#define SIGN_BIT ((uint64_t)1 << 63)

struct psd_store_rtxn {
    psd_store *s;
    MDB_txn *txn;
};

static void row_key(uint8_t k[ROW_KEY_LEN], uint32_t var_id, int64_t id)
{
    uint64_t u = (uint64_t)id ^ SIGN_BIT;
    for (int i = 0; i < 4; i++)
        k[i] = (uint8_t)(var_id >> (24 - 8 * i));
    for (int i = 0; i < 8; i++)
        k[4 + i] = (uint8_t)(u >> (56 - 8 * i));
}

/* The id of a row key of var_id, or false when the key is not one. */
static bool key_id(const MDB_val *k, uint32_t var_id, int64_t *id)
{
    if (k->mv_size != ROW_KEY_LEN)
        return false;
    const uint8_t *p = k->mv_data;
    uint32_t v = 0;
    uint64_t u = 0;
    for (int i = 0; i < 4; i++)
        v = v << 8 | p[i];
    for (int i = 0; i < 8; i++)
        u = u << 8 | p[4 + i];
    *id = (int64_t)(u ^ SIGN_BIT);
    return v == var_id;
}

/* The var_id in a "vars" record read in txn. */
static int var_id_in(psd_store *s, MDB_txn *txn, const char *name, uint32_t *id)
{
    size_t len = name ? strnlen(name, 256) : 0;
    if (len == 0 || len > 255)
        return PS_EINVAL_ARG;
    MDB_val k = {len, (void *)name}, v;
    int mrc = mdb_get(txn, s->vars, &k, &v);
    if (mrc != 0)
        return store_map_rc(mrc, false);
    /* struct var_hdr: u32 magic, u16 format, u16 hdr_size, u32 var_id. */
    if (v.mv_size < 12)
        return PS_ECORRUPT;
    memcpy(id, (const uint8_t *)v.mv_data + 8, sizeof *id);
    return 0;
}

int psd_store_var_id(psd_store *s, const char *name, uint32_t *id)
{
    MDB_txn *txn;
    int mrc = store_txn_begin(s, MDB_RDONLY, &txn);
    if (mrc != 0)
        return store_map_rc(mrc, false);
    int rc = var_id_in(s, txn, name, id);
    store_txn_end(s, txn);
    return rc;
}

int psd_store_rbegin(psd_store *s, psd_store_rtxn **out)
{
    psd_store_rtxn *r = malloc(sizeof *r);
    if (r == NULL)
        return -ENOMEM;
    r->s = s;
    int mrc = store_txn_begin(s, MDB_RDONLY, &r->txn);
    if (mrc != 0) {
        ps_log_error("store %s: begin: %s", s->dir, mdb_strerror(mrc));
        free(r);
        return store_map_rc(mrc, false);
    }
    *out = r;
    return 0;
}

void psd_store_rend(psd_store_rtxn *r)
{
    if (r == NULL)
        return;
    store_txn_end(r->s, r->txn);
    free(r);
}

int psd_store_row_get(psd_store_rtxn *r, uint32_t var_id, int64_t id,
                      const void **data, size_t *len)
{
    uint8_t kb[ROW_KEY_LEN];
    row_key(kb, var_id, id);
    MDB_val k = {sizeof kb, kb}, v;
    int mrc = mdb_get(r->txn, r->s->rows, &k, &v);
    if (mrc != 0)
        return store_map_rc(mrc, false);
    *data = v.mv_data;
    *len = v.mv_size;
    return 0;
}

int psd_store_row_peek(psd_store_txn *t, uint32_t var_id, int64_t id,
                       const void **data, size_t *len)
{
    if (t->err)
        return t->err;
    uint8_t kb[ROW_KEY_LEN];
    row_key(kb, var_id, id);
    MDB_val k = {sizeof kb, kb}, v;
    int mrc = mdb_get(t->txn, t->s->rows, &k, &v);
    if (mrc == MDB_NOTFOUND)
        return PS_ENOTFOUND;
    if (mrc != 0)
        return store_txn_fail(t, mrc, "reading a row", "(sparse)");
    *data = v.mv_data;
    *len = v.mv_size;
    return 0;
}

int psd_store_row_put(psd_store_txn *t, uint32_t var_id, int64_t id,
                      const void *head, size_t head_len, const void *body,
                      size_t body_len)
{
    if (t->err)
        return t->err;
    uint8_t kb[ROW_KEY_LEN];
    row_key(kb, var_id, id);
    MDB_val k = {sizeof kb, kb}, v = {head_len + body_len, NULL};
    int mrc = mdb_put(t->txn, t->s->rows, &k, &v, MDB_RESERVE);
    if (mrc != 0)
        return store_txn_fail(t, mrc, "writing a row", "(sparse)");
    memcpy(v.mv_data, head, head_len);
    /* The catalog's entries and a copied row have no body (NULL, 0):
     * memcpy from NULL is undefined even for no bytes. */
    if (body_len != 0)
        memcpy((uint8_t *)v.mv_data + head_len, body, body_len);
    return 0;
}

int psd_store_rows_walk(psd_store_txn *t, uint32_t var_id, int64_t *from, size_t max,
                        psd_store_row_fn fn, void *ctx, int *done)
{
    if (t->err)
        return t->err;
    MDB_cursor *cur;
    int mrc = mdb_cursor_open(t->txn, t->s->rows, &cur);
    if (mrc != 0)
        return store_txn_fail(t, mrc, "cursor", "(sparse)");
    uint8_t kb[ROW_KEY_LEN];
    row_key(kb, var_id, *from);
    MDB_val k = {sizeof kb, kb}, v;
    *done = 0;
    int rc = 0;
    size_t seen = 0;
    mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    while (rc == 0) {
        int64_t id;
        if (mrc == MDB_NOTFOUND || (mrc == 0 && !key_id(&k, var_id, &id))) {
            *done = 1;
            break;
        }
        if (mrc != 0) {
            rc = store_txn_fail(t, mrc, "walking rows", "(sparse)");
            break;
        }
        if (seen == max) {
            *from = id;
            break;
        }
        seen++;
        int verdict = fn(ctx, id, v.mv_data, v.mv_size);
        if (verdict < 0) {
            rc = verdict;
            break;
        }
        if (verdict == 1) {
            mrc = mdb_cursor_del(cur, 0);
            if (mrc != 0) {
                rc = store_txn_fail(t, mrc, "deleting a row", "(sparse)");
                break;
            }
            /* Seek afresh past a deleted item (as delete_prefix does). */
            if (id == INT64_MAX) {
                *done = 1;
                break;
            }
            row_key(kb, var_id, id + 1);
            k = (MDB_val){sizeof kb, kb};
            mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
        } else {
            mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
        }
    }
    mdb_cursor_close(cur);
    return rc;
}

/* The var_id of any row key. */
static uint32_t key_var(const MDB_val *k);

/* Begins a read-only transaction of s and opens a cursor on dbi in it, for
 * the scans below; on failure nothing is left open. Returns 0 or a project
 * code. */
static int read_cursor(psd_store *s, MDB_dbi dbi, MDB_txn **txn, MDB_cursor **cur)
{
    int mrc = store_txn_begin(s, MDB_RDONLY, txn);
    if (mrc != 0)
        return store_map_rc(mrc, false);
    if ((mrc = mdb_cursor_open(*txn, dbi, cur)) != 0)
        store_txn_end(s, *txn);
    return store_map_rc(mrc, false);
}

static void read_cursor_end(psd_store *s, MDB_txn *txn, MDB_cursor *cur)
{
    mdb_cursor_close(cur);
    store_txn_end(s, txn);
}

/* Calls fn for each row of var under cur (a cursor on the rows), in id
 * order, until fn returns nonzero. Returns fn's nonzero code, a project
 * code for a failed read, else 0. */
static int var_rows(MDB_cursor *cur, uint32_t var,
                    int (*fn)(void *ctx, int64_t id, const MDB_val *v), void *ctx)
{
    uint8_t kb[ROW_KEY_LEN];
    row_key(kb, var, INT64_MIN);
    MDB_val k = {sizeof kb, kb}, v;
    int64_t id;
    int rc = 0, mrc;
    for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
         mrc == 0 && key_id(&k, var, &id) && rc == 0;
         mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
        rc = fn(ctx, id, &v);
    if (rc == 0 && mrc != 0 && mrc != MDB_NOTFOUND)
        rc = store_map_rc(mrc, false);
    return rc;
}

int psd_store_rows_scan(psd_store *s, uint32_t *var_id, int64_t *id, size_t max,
                        psd_store_scan_fn fn, void *ctx, bool *done)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    *done = false;
    int rc = read_cursor(s, s->rows, &txn, &cur);
    if (rc != 0)
        return rc;
    uint8_t kb[ROW_KEY_LEN];
    row_key(kb, *var_id, *id);
    int mrc;
    MDB_val k = {sizeof kb, kb}, v;
    size_t seen = 0;
    bool stop = false;
    for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); mrc == 0;
         mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        int64_t kid;
        if (k.mv_size != ROW_KEY_LEN)
            continue;
        uint32_t kv = key_var(&k);
        key_id(&k, kv, &kid);
        if (seen == max || stop) {
            *var_id = kv;
            *id = kid;
            break;
        }
        seen++;
        if ((rc = fn(ctx, kv, kid, v.mv_data, v.mv_size)) < 0)
            break;
        stop = rc == 1;
        rc = 0;
    }
    read_cursor_end(s, txn, cur);
    if (mrc == MDB_NOTFOUND) {
        *done = true;
        mrc = 0;
    }
    return rc ? rc : store_map_rc(mrc, false);
}

int psd_store_rows_count(psd_store *s, uint32_t var_id, uint64_t *n)
{
    return psd_store_rows_ids(s, var_id, n, NULL, NULL);
}

struct count_ctx {
    void (*each)(void *ctx, int64_t id);
    void *ctx;
    uint64_t n;
};

static int count_one(void *ctx, int64_t id, const MDB_val *v)
{
    struct count_ctx *cc = ctx;
    (void)v;
    if (cc->each != NULL)
        cc->each(cc->ctx, id);
    cc->n++;
    return 0;
}

int psd_store_rows_ids(psd_store *s, uint32_t var_id, uint64_t *n,
                       void (*each)(void *ctx, int64_t id), void *ctx)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    struct count_ctx cc = {each, ctx, 0};
    int rc = read_cursor(s, s->rows, &txn, &cur);
    if (rc != 0) {
        *n = 0;
        return rc;
    }
    rc = var_rows(cur, var_id, count_one, &cc);
    read_cursor_end(s, txn, cur);
    *n = cc.n;
    return rc;
}

struct put_ctx {
    psd_store_txn *t;
    uint32_t to;
};

static int put_one(void *ctx, int64_t id, const MDB_val *v)
{
    struct put_ctx *pc = ctx;
    return psd_store_row_put(pc->t, pc->to, id, v->mv_data, v->mv_size, NULL, 0);
}

int psd_store_rows_copy(psd_store_txn *t, psd_store *src, const char *name)
{
    if (t->err)
        return t->err;
    uint32_t to = 0, from = 0;
    int rc = var_id_in(t->s, t->txn, name, &to);
    if (rc != 0)
        return rc;
    MDB_txn *rt;
    MDB_cursor *cur;
    if ((rc = read_cursor(src, src->rows, &rt, &cur)) != 0)
        return rc;
    struct put_ctx pc = {t, to};
    rc = var_id_in(src, rt, name, &from);
    if (rc == 0)
        rc = var_rows(cur, from, put_one, &pc);
    read_cursor_end(src, rt, cur);
    return rc;
}

uint64_t psd_store_disk_bytes(psd_store *s)
{
    /* mdb_env_info reads the meta pages through the map: not while a
     * growth remaps it (psd segfaulted in mdb_env_info under
     * test_psd_sparse's map-cap case, the prefetch asking while a push
     * grew the map). */
    pthread_rwlock_rdlock(&s->gate);
    MDB_envinfo info;
    MDB_stat st;
    uint64_t n = 0;
    if (mdb_env_info(s->env, &info) == 0 && mdb_env_stat(s->env, &st) == 0)
        n = (uint64_t)(info.me_last_pgno + 1) * st.ms_psize;
    pthread_rwlock_unlock(&s->gate);
    return n;
}

/* ---- restore: staged copies and orphan rows ---------------------------- */

/* One transaction of psd_store_rows_stage: rows of from in src, from id
 * *next on, at most chunk of them, put under to. *next moves past them;
 * *done when the table has no more. */
static int stage_chunk(psd_store *s, MDB_cursor *src, uint32_t from, uint32_t to,
                       size_t chunk, int64_t *next, bool *done)
{
    psd_store_txn *t = NULL;
    int rc = psd_store_begin(s, &t);
    if (rc != 0)
        return rc;
    uint8_t kb[ROW_KEY_LEN];
    row_key(kb, from, *next);
    MDB_val k = {sizeof kb, kb}, v;
    int64_t id = *next;
    size_t n = 0;
    int mrc;
    for (mrc = mdb_cursor_get(src, &k, &v, MDB_SET_RANGE);
         mrc == 0 && key_id(&k, from, &id) && n < chunk && rc == 0;
         mrc = mdb_cursor_get(src, &k, &v, MDB_NEXT), n++)
        rc = psd_store_row_put(t, to, id, v.mv_data, v.mv_size, NULL, 0);
    if (rc != 0) {
        psd_store_abort(t);
        return rc;
    }
    if (mrc != 0 && mrc != MDB_NOTFOUND) {
        psd_store_abort(t);
        return store_map_rc(mrc, false);
    }
    *done = n < chunk || mrc != 0 || !key_id(&k, from, &id);
    rc = psd_store_commit(t);
    if (rc == 0 && !*done)
        *next = id; /* the first row of the next chunk */
    return rc;
}

int psd_store_rows_stage(psd_store *s, psd_store *src, const char *name, uint32_t to,
                         size_t chunk)
{
    MDB_txn *rt;
    MDB_cursor *cur;
    int rc = read_cursor(src, src->rows, &rt, &cur);
    if (rc != 0)
        return rc;
    uint32_t from = 0;
    rc = var_id_in(src, rt, name, &from);
    int64_t next = INT64_MIN;
    bool done = false;
    while (rc == 0 && !done) {
        rc = stage_chunk(s, cur, from, to, chunk, &next, &done);
        if (rc == PS_EFULL && psd_store_grow(s) == 0)
            rc = 0; /* the same chunk again, in the grown map */
    }
    read_cursor_end(src, rt, cur);
    return rc;
}

/* The var_ids the "vars" records name, sorted, into *ids (malloc'd). */
static int named_ids(psd_store *s, uint32_t **ids, size_t *n)
{
    MDB_txn *rt;
    MDB_cursor *cur;
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    int rc = read_cursor(s, s->vars, &rt, &cur);
    if (rc != 0)
        return rc;
    MDB_val k, v;
    int mrc;
    for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0 && rc == 0;
         mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (v.mv_size < 12)
            continue; /* unreadable: its rows are kept, being unknown */
        if (*n == cap) {
            cap = cap ? cap * 2 : 64;
            uint32_t *g = realloc(*ids, cap * sizeof *g);
            if (g == NULL) {
                rc = -ENOMEM;
                break;
            }
            *ids = g;
        }
        memcpy(&(*ids)[(*n)++], (const uint8_t *)v.mv_data + 8, sizeof **ids);
    }
    read_cursor_end(s, rt, cur);
    if (rc == 0 && mrc != 0 && mrc != MDB_NOTFOUND)
        rc = store_map_rc(mrc, false);
    return rc;
}

static bool id_named(const uint32_t *ids, size_t n, uint32_t v)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == v)
            return true;
    return false;
}

static uint32_t key_var(const MDB_val *k)
{
    const uint8_t *p = k->mv_data;
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* One transaction of psd_store_rows_gc from var_id *vid on: deletes up to
 * chunk orphan rows. *done when the walk reached the end. */
static int gc_chunk(psd_store *s, const uint32_t *ids, size_t nids, size_t chunk,
                    uint32_t *vid, uint64_t *deleted, bool *done)
{
    psd_store_txn *t = NULL;
    int rc = psd_store_begin(s, &t);
    if (rc != 0)
        return rc;
    MDB_cursor *cur;
    int mrc = mdb_cursor_open(t->txn, s->rows, &cur);
    size_t n = 0;
    uint8_t kb[ROW_KEY_LEN];
    row_key(kb, *vid, INT64_MIN);
    MDB_val k = {sizeof kb, kb}, v;
    if (mrc == 0)
        mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    while (mrc == 0 && n < chunk) {
        uint32_t kv = k.mv_size >= 4 ? key_var(&k) : 0;
        if (k.mv_size >= 4 && id_named(ids, nids, kv)) {
            if (kv == UINT32_MAX) {
                mrc = MDB_NOTFOUND;
                break;
            }
            *vid = kv + 1;
            row_key(kb, *vid, INT64_MIN);
            k = (MDB_val){sizeof kb, kb};
            mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
            continue;
        }
        *vid = kv;
        if ((mrc = mdb_cursor_del(cur, 0)) != 0)
            break;
        n++;
        mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    if (mrc == 0 || mrc == MDB_NOTFOUND) {
        *done = mrc == MDB_NOTFOUND;
        mdb_cursor_close(cur);
        *deleted += n;
        return psd_store_commit(t);
    }
    rc = store_txn_fail(t, mrc, "deleting orphan rows", "*");
    mdb_cursor_close(cur);
    psd_store_abort(t);
    return rc;
}

int psd_store_rows_gc(psd_store *s, size_t chunk, uint64_t *deleted)
{
    uint32_t *ids = NULL;
    size_t nids = 0;
    *deleted = 0;
    int rc = named_ids(s, &ids, &nids);
    uint32_t vid = 0;
    bool done = false;
    while (rc == 0 && !done)
        rc = gc_chunk(s, ids, nids, chunk, &vid, deleted, &done);
    free(ids);
    return rc;
}

static MDB_val mark_key(enum psd_store_log_mark m)
{
    static const char *keys[] = {"rowlog_applied", "rowlog_logged", "segs_end", "cat_upto"};
    return (MDB_val){strlen(keys[m]), (void *)keys[m]};
}

int psd_store_log_mark(psd_store *s, enum psd_store_log_mark m, uint64_t *seq)
{
    *seq = 0;
    MDB_txn *txn;
    int mrc = store_txn_begin(s, MDB_RDONLY, &txn);
    if (mrc != 0)
        return store_map_rc(mrc, false);
    MDB_val k = mark_key(m), v;
    mrc = mdb_get(txn, s->meta, &k, &v);
    int rc = 0;
    if (mrc == 0 && v.mv_size == sizeof *seq)
        memcpy(seq, v.mv_data, sizeof *seq);
    else if (mrc == 0)
        rc = PS_ECORRUPT;
    else if (mrc != MDB_NOTFOUND)
        rc = store_map_rc(mrc, false);
    store_txn_end(s, txn);
    return rc;
}

int psd_store_set_log_mark(psd_store_txn *t, enum psd_store_log_mark m, uint64_t seq)
{
    if (t->err)
        return t->err;
    MDB_val k = mark_key(m), v = {sizeof seq, &seq};
    int mrc = mdb_put(t->txn, t->s->meta, &k, &v, 0);
    return mrc == 0 ? 0 : store_txn_fail(t, mrc, "writing a mark of the row log", "(sparse)");
}
