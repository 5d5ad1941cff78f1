/*
 * sparse_cold.c - cold reads (sparse_internal.h): the rows of a call that
 * are not in the RAM tier, looked up in the index of rows all at once and read
 * from the segments in one batch (psd_segs_read: io_uring, O_DIRECT, a row
 * one read), never through a page fault on row bytes.
 *
 * The first pass runs before the call takes the table's mutex, so that
 * neither the flusher nor the other calls of the table wait for the disk:
 * under the mutex for a moment it copies out the locations of the ids
 * with no RAM entry that the table's index of rows holds (sparse_index.c:
 * no LMDB page is touched), then reads them without it. What it
 * read is still the row's last state when the call, under the mutex again,
 * finds no RAM entry, unless an apply or a sweep ran in between: a row
 * leaves the RAM tier only once the apply that wrote its last change is
 * done (sparse_pinned), so while the applied mark and the table's sweep
 * count stand still, a row with no RAM entry was not written since. The
 * second pass (sparse_cold_settle) reads under the mutex what the first
 * could not vouch for, which is rare: rows that left the RAM tier in
 * between, or the whole miss set after an apply or a sweep.
 */
#include "server/sparse_internal.h"

#include "common/errors.h"
#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void sparse_cold_free(struct sp_cold *c)
{
    free(c->slot);
    free(c->rows);
    free(c->have);
    *c = (struct sp_cold){0};
}

static int cmp_pair(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* Room for m more slots. */
static int slots_grow(struct sp_cold *c, size_t m, size_t rb)
{
    if (c->nslots + m <= c->cap)
        return 0;
    size_t nc = c->cap ? c->cap : 64;
    while (nc < c->nslots + m)
        nc *= 2;
    uint8_t *r = realloc(c->rows, nc * rb);
    if (r == NULL)
        return -ENOMEM;
    c->rows = r;
    uint8_t *h = realloc(c->have, nc);
    if (h == NULL)
        return -ENOMEM;
    c->have = h;
    c->cap = nc;
    return 0;
}

/* The rows to read: ids[idx[k]], whose record is at loc[k], k < m. */
struct want {
    const int64_t *ids;
    const size_t *idx;
    const uint64_t *loc; /* (m) packed, from the index under t->mu */
    size_t m;
};

/* Reads the rows of w into new slots of c (table var_id, rb bytes a row),
 * each distinct id once: a record becomes one read of a batch; a row the
 * catalog must be asked for (SPARSE_LOC_LMDB: not converted yet) is
 * looked up in LMDB and, a catalog entry, read too, or copied. */
static int read_rows(psd_sparse *sp, const char *name, uint32_t var_id, size_t rb,
                     const struct want *w, struct sp_cold *c)
{
    size_t m = w->m;
    int64_t *pairs = malloc(m * 2 * sizeof *pairs);
    psd_seg_read *rq = malloc(m * sizeof *rq);
    int rc = pairs && rq ? slots_grow(c, m, rb) : -ENOMEM;
    psd_store_rtxn *rt = NULL;
    if (rc != 0)
        goto out;
    for (size_t k = 0; k < m; k++) {
        pairs[2 * k] = w->ids[w->idx[k]];
        pairs[2 * k + 1] = (int64_t)k;
    }
    qsort(pairs, m, 2 * sizeof *pairs, cmp_pair);
    size_t nr = 0, copied = 0;
    for (size_t j = 0; j < m && rc == 0; j++) {
        int64_t id = pairs[2 * j];
        size_t k = (size_t)pairs[2 * j + 1];
        if (j > 0 && id == pairs[2 * j - 2]) {
            c->slot[w->idx[k]] = c->slot[w->idx[pairs[2 * j - 1]]];
            continue;
        }
        size_t s = c->nslots++;
        c->slot[w->idx[k]] = (int32_t)s;
        c->have[s] = 0;
        psd_seg_read r = {.var_id = var_id, .id = id, .dst = c->rows + s * rb, .cap = rb,
                          .version = s};
        if (w->loc[k] != SPARSE_LOC_LMDB) {
            r.loc = sparse_loc_unpack(w->loc[k], rb + PSD_SEG_REC_HEAD);
            rq[nr++] = r;
            continue;
        }
        const void *d;
        size_t len;
        struct sp_cat cat;
        if (rt == NULL && (rc = psd_store_rbegin(sp->store, &rt)) != 0)
            break;
        rc = psd_store_row_get(rt, var_id, id, &d, &len);
        if (rc == PS_ENOTFOUND) {
            rc = 0;
        } else if (rc == 0 && sparse_cat_decode(d, len, &cat)) {
            r.loc = cat.loc;
            rq[nr++] = r;
        } else if (rc == 0 && len == rb) {
            memcpy(c->rows + s * rb, d, rb);
            c->have[s] = 1;
            copied++;
        } else if (rc == 0) {
            ps_log_error("sparse table '%s': row %lld has %zu bytes in LMDB, expected %zu",
                         name, (long long)id, len, rb);
            rc = PS_ECORRUPT;
        }
    }
    if (rt != NULL)
        psd_store_rend(rt);
    if (rc == 0 && nr > 0) {
        /* version is overwritten by the read: the slots are kept apart. */
        size_t *slot_of = malloc(nr * sizeof *slot_of);
        if (slot_of == NULL) {
            rc = -ENOMEM;
            goto out;
        }
        for (size_t k = 0; k < nr; k++)
            slot_of[k] = (size_t)rq[k].version;
        rc = psd_segs_read(sp->segs, rq, nr);
        for (size_t k = 0; k < nr && (rc == 0 || rc == PS_ECORRUPT); k++) {
            bool ok = rq[k].rc == 0 && rq[k].loc.len - PSD_SEG_REC_HEAD == rb;
            if (ok) {
                c->have[slot_of[k]] = 1;
            } else if (rc == 0 || rq[k].rc != 0) {
                ps_log_error("sparse table '%s': row %lld: its record in segment %u at "
                             "offset %llu is corrupt", name, (long long)rq[k].id,
                             rq[k].loc.seg, (unsigned long long)rq[k].loc.off);
                rc = PS_ECORRUPT;
                break;
            }
        }
        free(slot_of);
        if (rc != 0 && rc != PS_ECORRUPT)
            ps_log_err(rc, "sparse table '%s': reading %zu rows from the segments", name, nr);
        atomic_fetch_add_explicit(&sp->seg_reads, nr, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&sp->read_cold, nr + copied, memory_order_relaxed);
out:
    free(pairs);
    free(rq);
    return rc;
}

/* The ids of ids[0..n) to read (those not read yet, slot[i] < 0, or all
 * of them): those with no RAM entry that the index holds, with their
 * locations. t->mu held. */
static size_t misses(psd_sparse_table *t, const int64_t *ids, size_t n, const int32_t *slot,
                     bool all, size_t *idx, uint64_t *loc)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        sparse_ahead(t, ids, i, n);
        if (!all && slot[i] >= 0)
            continue;
        uint64_t l;
        if (sparse_find(t, ids[i]) == NULL && (l = sparse_index_get(t, ids[i])) != 0) {
            idx[m] = i;
            loc[m++] = l;
        }
    }
    return m;
}

int sparse_cold_read(psd_sparse *sp, psd_sparse_table *t, const int64_t *ids, size_t n,
                     struct sp_cold *c)
{
    *c = (struct sp_cold){.n = n};
    size_t one = n ? n : 1;
    c->slot = malloc(one * sizeof *c->slot);
    size_t *idx = malloc(one * sizeof *idx);
    uint64_t *loc = malloc(one * sizeof *loc);
    int rc = c->slot && idx && loc ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++)
        c->slot[i] = -1;
    size_t m = 0;
    if (rc == 0) {
        sparse_lock(t);
        rc = sparse_ready(sp, t);
        c->applied = atomic_load(&sp->log_applied);
        c->evicts = t->evicts;
        /* Every row in the RAM tier: nothing to read (the in-RAM case
         * costs no second walk). The locations are copied out: the reads
         * run without the mutex. */
        if (rc == 0 && t->nentries < t->rows)
            m = misses(t, ids, n, c->slot, true, idx, loc);
        pthread_mutex_unlock(&t->mu);
    }
    struct want w = {.ids = ids, .idx = idx, .loc = loc, .m = m};
    if (rc == 0 && m > 0)
        rc = read_rows(sp, t->name, t->var_id, sparse_row_bytes(t), &w, c);
    free(idx);
    free(loc);
    return rc;
}

int sparse_cold_remap(struct sp_cold *c, const size_t *which, size_t nu)
{
    int32_t *s = malloc((nu ? nu : 1) * sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    for (size_t u = 0; u < nu; u++)
        s[u] = -1;
    for (size_t i = 0; i < c->n; i++)
        if (c->slot[i] >= 0)
            s[which[i]] = c->slot[i];
    free(c->slot);
    c->slot = s;
    c->n = nu;
    return 0;
}

int sparse_cold_settle(psd_sparse *sp, psd_sparse_table *t, const int64_t *ids,
                       struct sp_cold *c)
{
    if (t->nentries >= t->rows)
        return 0; /* every row is in the RAM tier */
    bool stale = c->applied != atomic_load(&sp->log_applied) || c->evicts != t->evicts;
    size_t one = c->n ? c->n : 1;
    size_t *idx = malloc(one * sizeof *idx);
    uint64_t *loc = malloc(one * sizeof *loc);
    int rc = idx && loc ? 0 : -ENOMEM;
    struct want w = {.ids = ids, .idx = idx, .loc = loc};
    if (rc == 0)
        w.m = misses(t, ids, c->n, c->slot, stale, idx, loc);
    if (rc == 0 && w.m > 0)
        rc = read_rows(sp, t->name, t->var_id, sparse_row_bytes(t), &w, c);
    free(idx);
    free(loc);
    return rc;
}

const uint8_t *sparse_cold_row(const psd_sparse_table *t, const struct sp_cold *c, size_t i)
{
    int32_t s = c->slot[i];
    return s >= 0 && c->have[s] ? c->rows + (size_t)s * sparse_row_bytes(t) : NULL;
}
