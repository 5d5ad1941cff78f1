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
 * between, or the whole miss set after an apply or a sweep; while no
 * entry left the tier (the table's drop count), it does not even look.
 * By the same count a pull serves the RAM entries the first pass found
 * without looking them up again (sparse_cold_entry).
 *
 * Reads ahead: a pull may name the ids of its table's next pull. Those
 * with no RAM entry, not claimed by a batch already, are looked up under
 * the mutex into one of the table's two batches while the device still
 * reads the other (the batch the last pull named), on the shard's helper
 * thread when it is idle, beside the call's lookup of its own ids, and
 * handed to its psd_seg_aread (a thread and a ring of its own) once the
 * call's own reads, what its batch does not hold, are done: those queue
 * behind its batch only, and the device goes on to the next batch
 * without waiting for the call's lookups, copies and serving. Their ids
 * are claimed, so that no other call reads them twice. The call then
 * waits for its batch and takes the rows it left to it (cold, indexed and
 * claimed when it looked) as its own cold rows (prefetch_adopt), each
 * with the record it was read from, which settle checks against the
 * index under the mutex; the rest is dropped.
 */
#include "server/sparse_internal.h"

#include "server/assist.h"

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
    free(c->vloc);
    free(c->ent);
    *c = (struct sp_cold){0};
}

static int cmp_pair(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* p (an array) grown to n elements of size bytes, or, when *rc is not 0
 * or realloc fails, p as it was, with *rc -ENOMEM. */
static void *grown(void *p, size_t n, size_t size, int *rc)
{
    void *q = *rc == 0 ? realloc(p, n * size) : NULL;
    if (q == NULL)
        *rc = -ENOMEM;
    return q != NULL ? q : p;
}

/* The capacity, doubled from first, that holds need. */
static size_t cap_for(size_t cap, size_t first, size_t need)
{
    size_t nc = cap ? cap : first;
    while (nc < need)
        nc *= 2;
    return nc;
}

/* Room for m more slots. */
static int slots_grow(struct sp_cold *c, size_t m, size_t rb)
{
    if (c->nslots + m <= c->cap)
        return 0;
    size_t nc = cap_for(c->cap, 64, c->nslots + m);
    int rc = 0;
    c->rows = grown(c->rows, nc, rb, &rc);
    c->have = grown(c->have, nc, 1, &rc);
    c->vloc = grown(c->vloc, nc, sizeof *c->vloc, &rc);
    if (rc == 0)
        c->cap = nc;
    return rc;
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
        c->vloc[s] = 0;
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

/* sp_cold.slot[i] of an id the first pass left to a batch of reads
 * ahead; -1: not read (yet); >= 0: its row's slot. */
#define SLOT_LEFT (-2)

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Whether batch b claims id. t->mu held. */
static bool claims(const struct sp_batch *b, int64_t id)
{
    return b->nclaim > 0 && bsearch(&id, b->claim, b->nclaim, sizeof id, cmp_i64) != NULL;
}

/* Whether id's read is one of the table's batches of reads ahead. t->mu
 * held. */
static bool claimed(const psd_sparse_table *t, int64_t id)
{
    return claims(&t->pf.b[0], id) || claims(&t->pf.b[1], id);
}

/* The ids of ids[0..n) to read (those not read yet, slot[i] < 0, or all
 * of them): those with no RAM entry that the index holds, with their
 * locations. With *left (a first pass), an id that batch to, or with to
 * NULL either of the table's batches of reads ahead, is reading is left
 * to it, counted there and marked SLOT_LEFT: the only ids prefetch_adopt
 * looks for in a batch (in bench/sparse's 4x-over pulls, 180 of 4096). With
 * ent, ent[i] is the RAM entry found for ids[i] (NULL: none, or not looked
 * up). t->mu held. */
static size_t misses(psd_sparse_table *t, const int64_t *ids, size_t n, int32_t *slot,
                     bool all, size_t *idx, uint64_t *loc, const struct sp_batch *to,
                     size_t *left, struct sp_entry **ent)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        sparse_ahead(t, ids, i, n);
        struct sp_entry *e = !all && slot[i] >= 0 ? NULL : sparse_find(t, ids[i]);
        if (ent != NULL)
            ent[i] = e;
        if (!all && slot[i] >= 0)
            continue;
        uint64_t l;
        if (e == NULL && (l = sparse_index_get(t, ids[i])) != 0) {
            if (left != NULL && (to != NULL ? claims(to, ids[i]) : claimed(t, ids[i]))) {
                (*left)++;
                slot[i] = SLOT_LEFT;
                continue;
            }
            idx[m] = i;
            loc[m++] = l;
        }
    }
    return m;
}

/* ---- reads ahead --------------------------------------------------------- */

void sparse_prefetch_init(psd_sparse_table *t)
{
    pthread_mutex_init(&t->pf.mu, NULL);
}

void sparse_prefetch_free(psd_sparse_table *t)
{
    struct sp_prefetch *pf = &t->pf;
    for (int k = 0; k < 2; k++) {
        struct sp_batch *b = &pf->b[k];
        psd_seg_aread_destroy(b->ar); /* waits for a batch in flight */
        PS_FREE_ALL(b->rq, b->loc, b->claim);
    }
    pthread_mutex_destroy(&pf->mu);
}

void sparse_prefetch_end(psd_sparse *sp, psd_sparse_table *t)
{
    struct sp_prefetch *pf = &t->pf;
    pthread_mutex_lock(&pf->mu);
    for (int k = 0; k < 2; k++) {
        struct sp_batch *b = &pf->b[k];
        psd_seg_aread_destroy(b->ar);
        b->ar = NULL;
        b->busy = false;
        atomic_fetch_sub(&sp->pf_bytes, b->bytes);
        b->bytes = 0;
    }
    sparse_lock(t);
    pf->b[0].nclaim = pf->b[1].nclaim = 0;
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&pf->mu);
}

/* Takes the table's prefetch (pf->mu): false when reads ahead cannot be
 * made here. A batch in flight is waited for by whoever takes it next. */
static bool prefetch_take(psd_sparse_table *t)
{
    struct sp_prefetch *pf = &t->pf;
    if (atomic_load(&pf->off))
        return false;
    pthread_mutex_lock(&pf->mu);
    return true;
}

/* Room for k more of the batch. */
static int batch_grow(struct sp_batch *b, size_t k)
{
    if (b->n + k <= b->cap)
        return 0;
    size_t nc = cap_for(b->cap, 256, b->n + k);
    int rc = 0;
    b->rq = grown(b->rq, nc, sizeof *b->rq, &rc);
    b->loc = grown(b->loc, nc, sizeof *b->loc, &rc);
    b->claim = grown(b->claim, nc, sizeof *b->claim, &rc);
    if (rc == 0)
        b->cap = nc;
    return rc;
}

/* The most reads of a batch: PSD_SEG_AREAD_MAX, and buffers of at most a
 * sixteenth of the RAM budget (a record read with the alignment on both
 * sides): the two batches an eighth. */
static size_t prefetch_max(const psd_sparse *sp, const psd_sparse_table *t)
{
    uint64_t a = psd_segs_align(sp->segs), rec = sparse_row_bytes(t) + PSD_SEG_REC_HEAD;
    uint64_t slot = (rec + a - 1) / a * a + a;
    uint64_t k = sparse_budget(sp) / 16 / slot;
    return k < PSD_SEG_AREAD_MAX ? (size_t)k : PSD_SEG_AREAD_MAX;
}

/* Fills batch b with the ids of next[0..nn) to read ahead: no RAM entry,
 * a record the index holds, and not claimed by a batch: not read by the
 * other batch, which holds this call's rows read ahead (this call keeps
 * them in the tier once served); each id once, sorted, up to
 * prefetch_max. The batch's ids are claimed. t->mu and pf->mu held.
 * Returns 0 or -ENOMEM (an empty batch). */
static int prefetch_lookup(psd_sparse *sp, psd_sparse_table *t, struct sp_batch *b,
                           const int64_t *next, size_t nn)
{
    b->n = 0;
    int rc = 0;
    for (size_t i = 0; i < nn; i++) {
        sparse_ahead(t, next, i, nn);
        uint64_t l;
        if (sparse_find(t, next[i]) != NULL || (l = sparse_index_get(t, next[i])) == 0 ||
            l == SPARSE_LOC_LMDB || claimed(t, next[i]))
            continue;
        if ((rc = batch_grow(b, 1)) != 0)
            break;
        b->claim[b->n] = next[i]; /* (id, loc) pairs for now, in rq's room */
        b->loc[b->n++] = l;
    }
    size_t n = b->n;
    int64_t *pairs = rc == 0 ? malloc((n ? n : 1) * 2 * sizeof *pairs) : NULL;
    if (pairs == NULL) {
        b->n = 0;
        return -ENOMEM;
    }
    for (size_t k = 0; k < n; k++) {
        pairs[2 * k] = b->claim[k];
        pairs[2 * k + 1] = (int64_t)b->loc[k];
    }
    qsort(pairs, n, 2 * sizeof *pairs, cmp_pair);
    size_t max = prefetch_max(sp, t), j = 0;
    uint64_t rec = sparse_row_bytes(t) + PSD_SEG_REC_HEAD;
    for (size_t k = 0; k < n && j < max; k++) {
        int64_t id = pairs[2 * k];
        if (k > 0 && id == pairs[2 * k - 2])
            continue;
        b->claim[j] = id;
        b->loc[j] = (uint64_t)pairs[2 * k + 1];
        b->rq[j] = (psd_seg_read){.var_id = t->var_id, .id = id,
                                  .loc = sparse_loc_unpack(b->loc[j], rec)};
        j++;
    }
    b->n = b->nclaim = j;
    b->ixgen = t->ix.gen;
    free(pairs);
    return 0;
}

/* Submits batch b, filled (without t->mu), to its thread. A batch that
 * cannot be submitted is dropped, its claims with it. pf->mu held. */
static void prefetch_submit(psd_sparse *sp, psd_sparse_table *t, struct sp_batch *b)
{
    struct sp_prefetch *pf = &t->pf;
    int rc = 0;
    if (b->n > 0 && b->ar == NULL && (rc = psd_seg_aread_create(&b->ar)) != 0) {
        /* (a table whose rows are all in RAM never gets this far) */
        ps_log_warn("sparse table '%s': no reads ahead (%s): a pull's next_ids are "
                    "ignored", t->name, ps_strerror(rc));
        atomic_store(&pf->off, true);
        b->n = 0;
        rc = 0;
    }
    if (b->n > 0)
        rc = psd_seg_aread_submit(b->ar, sp->segs, b->rq, b->n);
    uint64_t bytes = psd_seg_aread_bytes(b->ar);
    if (bytes != b->bytes) {
        atomic_fetch_add(&sp->pf_bytes, bytes - b->bytes); /* modulo 2^64 */
        b->bytes = bytes;
    }
    if (rc == 0 && b->n > 0) {
        b->busy = true;
        atomic_fetch_add_explicit(&sp->pf_reads, b->n, memory_order_relaxed);
        atomic_fetch_add_explicit(&sp->seg_reads, b->n, memory_order_relaxed);
        atomic_fetch_add_explicit(&sp->read_cold, b->n, memory_order_relaxed);
        return;
    }
    if (rc != 0)
        ps_log_err(rc, "sparse table '%s': reading %zu rows ahead", t->name, b->n);
    if (b->nclaim > 0) { /* written only with pf->mu held, as here */
        sparse_lock(t);
        b->nclaim = 0;
        pthread_mutex_unlock(&t->mu);
    }
}

/* Waits for batch b, if it is in flight, and takes the rows of ids[0..n)
 * it holds that the call left to the batches (c->slot[i] SLOT_LEFT) as its
 * own, each with the record it was read from, which sparse_cold_settle
 * checks under the mutex; they enter the tier as the call's other cold
 * rows do, once served. The rest of the batch is dropped (a hint not
 * followed), its claims with it. *used: the ids it gave a row. pf->mu
 * held. Returns 0 or -ENOMEM. */
static int prefetch_adopt(psd_sparse *sp, psd_sparse_table *t, struct sp_batch *b,
                          const int64_t *ids, size_t n, struct sp_cold *c, size_t *used)
{
    *used = 0;
    if (!b->busy)
        return 0;
    int rc = psd_seg_aread_wait(b->ar);
    if (rc != 0) /* the reads it submitted completed; the rest failed */
        ps_log_err(rc, "sparse table '%s': reading %zu rows ahead", t->name, b->n);
    size_t rb = sparse_row_bytes(t);
    if (b->n == 0) /* nothing was claimed: b->claim may be NULL */
        n = 0;
    int grc = n > 0 ? slots_grow(c, b->n < n ? b->n : n, rb) : 0;
    for (size_t i = 0; i < n && grc == 0; i++) {
        const int64_t *hit;
        if (c->slot[i] != SLOT_LEFT ||
            (hit = bsearch(&ids[i], b->claim, b->n, sizeof *hit, cmp_i64)) == NULL)
            continue;
        size_t k = (size_t)(hit - b->claim);
        if (b->rq[k].rc != 0 || (grc = slots_grow(c, 1, rb)) != 0)
            continue; /* not read: the call reads it under the mutex */
        size_t sl = c->nslots++;
        memcpy(c->rows + sl * rb, b->rq[k].dst, rb); /* the row: head, then body */
        c->have[sl] = 1;
        c->vloc[sl] = b->loc[k];
        c->slot[i] = (int32_t)sl;
        (*used)++;
    }
    if (*used > 0 && b->ixgen < c->ixgen)
        c->ixgen = b->ixgen;
    sparse_lock(t);
    b->nclaim = 0;
    pthread_mutex_unlock(&t->mu);
    b->busy = false;
    atomic_fetch_add_explicit(&sp->pf_rows, *used, memory_order_relaxed);
    return grc;
}

/* The lookup of a hint's batch: next[0..nnext) into b, the batch not in
 * flight, while the device still reads the other. It only reads the
 * table, under t->mu held by the call that made it, and writes b only;
 * so it runs on the shard's helper thread (assist.h), when that is idle,
 * while the call looks up its own ids: the two are the most of a pull's
 * CPU before the device gets the next batch, and while psd works on a
 * pull the client that made it waits, its core idle (bench/sparse's
 * 4x-over fp16 table, 4096 ids and 4096 next: 0.87-0.90 ms one after the
 * other, 0.70 side by side). */
struct ahead_job {
    psd_sparse *sp;
    psd_sparse_table *t;
    struct sp_batch *b;
    const int64_t *next;
    size_t nnext;
};

static void ahead_run(void *arg)
{
    struct ahead_job *j = arg;
    if (prefetch_lookup(j->sp, j->t, j->b, j->next, j->nnext) != 0)
        j->b->n = 0;
}

/* ---- the first pass ------------------------------------------------------ */

int sparse_cold_read_next(psd_sparse *sp, psd_sparse_table *t, const int64_t *ids, size_t n,
                          const int64_t *next, size_t nnext, bool entries, struct sp_cold *c)
{
    *c = (struct sp_cold){.n = n, .ixgen = UINT64_MAX};
    size_t one = n ? n : 1;
    c->slot = malloc(one * sizeof *c->slot);
    size_t *idx = malloc(one * sizeof *idx);
    uint64_t *loc = malloc(one * sizeof *loc);
    int rc = c->slot && idx && loc ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++)
        c->slot[i] = -1;
    /* A pull with a hint: the next pull's batch is looked up first, while
     * the device reads this call's (the last pull's hint), and submitted
     * once the call's own reads (what that batch does not hold) are done:
     * they queue behind this call's batch only, and the next batch right
     * after them, with no lookup in between. */
    struct sp_prefetch *pf = &t->pf;
    bool took = rc == 0 && nnext > 0 && prefetch_take(t);
    struct sp_batch *mine = took ? &pf->b[pf->cur] : NULL;
    struct ahead_job job = {sp, t, took ? &pf->b[pf->cur ^ 1] : NULL, next, nnext};
    size_t m = 0, left = 0, unused;
    if (took && job.b->busy) /* (only if a hinted call left it: dropped) */
        (void)prefetch_adopt(sp, t, job.b, NULL, 0, NULL, &unused);
    if (took)
        job.b->n = 0; /* filled below when the table has rows to read */
    if (rc == 0) {
        sparse_lock(t);
        rc = sparse_ready(sp, t);
        c->applied = atomic_load(&sp->log_applied);
        c->evicts = t->evicts;
        c->drops = t->drops;
        /* Every row in the RAM tier: nothing to read ahead or read (the
         * in-RAM case costs no second walk). The next pull's batch is
         * looked up on the helper when it is idle, else first, here. */
        bool cold = rc == 0 && t->nentries < t->rows;
        bool helped = took && cold && psd_assist_try(sp->assist, ahead_run, &job);
        if (took && cold && !helped)
            ahead_run(&job);
        /* The locations are copied out: the reads run without the mutex.
         * A call with a hint leaves to its batch only the rows it holds,
         * and reads the rest itself, even rows the next batch claims. */
        if (cold) {
            c->ent = entries ? malloc(one * sizeof *c->ent) : NULL;
            m = misses(t, ids, n, c->slot, false, idx, loc, mine, &left, c->ent);
        }
        if (helped)
            psd_assist_join(sp->assist);
        pthread_mutex_unlock(&t->mu);
    }
    struct want w = {.ids = ids, .idx = idx, .loc = loc, .m = m};
    if (rc == 0 && m > 0)
        rc = read_rows(sp, t->name, t->var_id, sparse_row_bytes(t), &w, c);
    c->left = left;
    if (took) {
        size_t used = 0;
        prefetch_submit(sp, t, &pf->b[pf->cur ^ 1]);
        if (rc == 0)
            rc = prefetch_adopt(sp, t, mine, ids, n, c, &used);
        else
            (void)prefetch_adopt(sp, t, mine, NULL, 0, NULL, &used);
        c->left -= used < c->left ? used : c->left;
        pf->cur ^= 1;
        pthread_mutex_unlock(&pf->mu);
    } else if (rc == 0 && left > 0 && prefetch_take(t)) {
        /* Rows another call's batches are reading are taken from them,
         * the older first, not read twice (what they could not read is
         * read by sparse_cold_settle, under the mutex). */
        for (unsigned k = 0; k < 2 && rc == 0; k++) {
            size_t used;
            rc = prefetch_adopt(sp, t, &pf->b[pf->cur ^ k], ids, n, c, &used);
            c->left -= used < c->left ? used : c->left;
        }
        pthread_mutex_unlock(&pf->mu);
    }
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
    /* Every row in the RAM tier and none read: nothing to check or read.
     * A row read ahead with no RAM entry now was deleted since (a sweep),
     * even when every row left is in the tier: the check below drops it. */
    if (t->nentries >= t->rows && c->nslots == 0)
        return 0;
    bool stale = c->applied != atomic_load(&sp->log_applied) || c->evicts != t->evicts;
    bool moved = c->ixgen != t->ix.gen; /* (no row read ahead: none to check) */
    /* A row read ahead is the row's last state only while the index still
     * points at the record read: records are never rewritten, and a row
     * leaves the tier only once its last change is applied and indexed (a
     * RAM entry, if the row has one now, is what the call answers). A
     * push, an apply, a compaction or a sweep since: read it again. With
     * the index unchanged since the batches were looked up (moved false),
     * none of that happened to their rows, and nothing is asked. */
    uint64_t dropped = 0;
    for (size_t i = 0; i < c->n; i++) {
        int32_t sl = c->slot[i];
        if (sl >= 0 && c->vloc[sl] != 0 && moved &&
            sparse_index_get(t, ids[i]) != c->vloc[sl]) {
            c->slot[i] = -1;
            dropped++;
        } else if (sl >= 0 && stale && sparse_find(t, ids[i]) == NULL &&
                   sparse_index_get(t, ids[i]) == 0) {
            /* Read by the first pass, then deleted (a sweep): it has no
             * row now, and the walk below reads only rows there are. */
            c->slot[i] = -1;
        }
    }
    atomic_fetch_add_explicit(&sp->pf_stale, dropped, memory_order_relaxed);
    /* No entry left the tier since the first pass, nothing was applied or
     * swept, no row read ahead went stale and none was left to another
     * call's batch: the first pass read every row there is to read, and
     * the walk below would find nothing. */
    if (!stale && dropped == 0 && c->drops == t->drops && c->left == 0)
        return 0;
    size_t one = c->n ? c->n : 1;
    size_t *idx = malloc(one * sizeof *idx);
    uint64_t *loc = malloc(one * sizeof *loc);
    int rc = idx && loc ? 0 : -ENOMEM;
    struct want w = {.ids = ids, .idx = idx, .loc = loc};
    if (rc == 0)
        w.m = misses(t, ids, c->n, c->slot, stale, idx, loc, NULL, NULL, NULL);
    if (rc == 0 && w.m > 0)
        rc = read_rows(sp, t->name, t->var_id, sparse_row_bytes(t), &w, c);
    free(idx);
    free(loc);
    return rc;
}

struct sp_entry *sparse_cold_entry(psd_sparse *sp, psd_sparse_table *t, const struct sp_cold *c,
                                   const int64_t *ids, size_t i, size_t n)
{
    if (c->ent == NULL || c->drops != t->drops) {
        sparse_ahead(t, ids, i, n);
        return sparse_get(sp, t, ids[i]);
    }
    if (i + 8 < n && c->ent[i + 8] != NULL)
        sparse_prefetch_entry(c->ent[i + 8]);
    struct sp_entry *e = c->ent[i];
    /* none then: one may have come since */
    return e != NULL ? sparse_hit(sp, e) : sparse_get(sp, t, ids[i]);
}

const uint8_t *sparse_cold_row(const psd_sparse_table *t, const struct sp_cold *c, size_t i)
{
    int32_t s = c->slot[i];
    return s >= 0 && c->have[s] ? c->rows + (size_t)s * sparse_row_bytes(t) : NULL;
}
