/*
 * sparse_seg.c - the tier's rows on disk (sparse_internal.h): the segment
 * files beside data.mdb (segment.h) and the catalog in the store's "rows"
 * database that points each row at its record, the live bytes of each
 * segment, the one-time conversion of rows LMDB still holds, and the copy
 * of a checkpoint that takes the rows' bytes along.
 *
 * Order of durability: records are appended and fdatasynced
 * (psd_segs_sync) before the LMDB transaction that points the catalog at
 * them commits, and that transaction moves "segs_end" to where the synced
 * records end. psd_segs_open cuts anything past "segs_end" (a batch whose
 * transaction never committed: its rows are still in the row log), and
 * refuses a segment shorter than it, or a corrupt one, naming file and
 * offset. A directory with no "segs_end" has no catalog entry: any segment
 * in it is such a batch, removed.
 *
 * The catalog is behind "segs_end" and holds every record before
 * "cat_upto": the rest is replayed at open. Its entries wait in a queue
 * of at most sparse_catq_max; past that the queue is dropped and the next
 * write reads the records from "cat_upto" on instead, so that the queue
 * never holds the RAM budget while pushes run, and a write costs one
 * sequential read of the records besides its LMDB pages. Both forms write
 * in key order, each row's last record, in transactions of a bounded
 * number of rows (LMDB keeps a write transaction's dirty pages in memory).
 */
#include "server/sparse_internal.h"

#include "common/buf.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAT_TAG 0x43 /* 'C' */
#define END_OFF_BITS 40
#define SCAN_CHUNK ((size_t)1 << 16)
/* Rows a conversion or a checkpoint's copy moves per transaction, and the
 * bytes it buffers at most. */
#define MOVE_ROWS 8192
#define MOVE_BYTES ((size_t)4 << 20)

/* ---- catalog entries ---------------------------------------------------- */

bool sparse_cat_decode(const void *data, size_t len, struct sp_cat *c)
{
    const uint8_t *p = data;
    if (len != SPARSE_CAT_LEN || p[0] != CAT_TAG)
        return false;
    memcpy(&c->loc.seg, p + 1, 4);
    memcpy(&c->loc.len, p + 5, 4);
    memcpy(&c->loc.off, p + 9, 8);
    memcpy(&c->version, p + 17, 8);
    memcpy(&c->last_step, p + 25, 8);
    return true;
}

static void cat_encode(uint8_t p[SPARSE_CAT_LEN], const struct sp_cat *c)
{
    p[0] = CAT_TAG;
    memcpy(p + 1, &c->loc.seg, 4);
    memcpy(p + 5, &c->loc.len, 4);
    memcpy(p + 9, &c->loc.off, 8);
    memcpy(p + 17, &c->version, 8);
    memcpy(p + 25, &c->last_step, 8);
}

uint64_t sparse_stored_last_step(const void *data, size_t len)
{
    struct sp_cat c;
    uint64_t last = 0;
    if (sparse_cat_decode(data, len, &c))
        return c.last_step;
    if (len >= SPARSE_ROW_HEAD)
        memcpy(&last, (const uint8_t *)data + 8, sizeof last);
    return last;
}

/* ---- catalog transactions ----------------------------------------------- */

static void add_delta(struct sp_catw *w, uint32_t seg, int64_t d)
{
    if (seg >= w->ndelta) {
        uint32_t nc = w->ndelta ? w->ndelta : 64;
        while (nc <= seg)
            nc *= 2;
        int64_t *a = realloc(w->delta, nc * sizeof *a);
        if (a == NULL) {
            /* The counts are only compaction's hint: counted again. */
            atomic_store(&w->sp->seg_recount, true);
            return;
        }
        memset(a + w->ndelta, 0, (nc - w->ndelta) * sizeof *a);
        w->delta = a;
        w->ndelta = nc;
    }
    w->delta[seg] += d;
}

int sparse_catw_begin(psd_sparse *sp, struct sp_catw *w, bool set_end)
{
    *w = (struct sp_catw){.sp = sp, .set_end = set_end};
    return psd_store_begin(sp->store, &w->t);
}

void sparse_catw_live(struct sp_catw *w, psd_seg_loc gone, psd_seg_loc now)
{
    if (gone.len > 0)
        add_delta(w, gone.seg, -(int64_t)gone.len);
    add_delta(w, now.seg, now.len);
}

void sparse_cat_gone(struct sp_catw *w, const void *data, size_t len)
{
    struct sp_cat c;
    if (sparse_cat_decode(data, len, &c))
        add_delta(w, c.loc.seg, -(int64_t)c.loc.len);
}

/* Writes c's entry for row id; old: the entry it replaces (NULL: none). */
static int cat_put(struct sp_catw *w, uint32_t var_id, int64_t id, const struct sp_cat *c,
                   const struct sp_cat *old)
{
    uint8_t e[SPARSE_CAT_LEN];
    cat_encode(e, c);
    int rc = psd_store_row_put(w->t, var_id, id, e, sizeof e, NULL, 0);
    if (rc != 0 || w->no_live)
        return rc;
    if (old != NULL)
        add_delta(w, old->loc.seg, -(int64_t)old->loc.len);
    add_delta(w, c->loc.seg, c->loc.len);
    return 0;
}

int sparse_cat_set(struct sp_catw *w, uint32_t var_id, int64_t id, const struct sp_cat *c)
{
    const void *d;
    size_t len;
    struct sp_cat old;
    int rc = psd_store_row_peek(w->t, var_id, id, &d, &len);
    if (rc != 0 && rc != PS_ENOTFOUND)
        return rc;
    bool had = rc == 0 && sparse_cat_decode(d, len, &old);
    return cat_put(w, var_id, id, c, had ? &old : NULL);
}

int sparse_catw_commit(struct sp_catw *w)
{
    psd_sparse *sp = w->sp;
    int rc = 0;
    if (w->set_end) {
        psd_seg_loc e = psd_segs_end(sp->segs);
        rc = psd_store_set_log_mark(w->t, PSD_STORE_SEGS_END,
                                    (uint64_t)e.seg << END_OFF_BITS | e.off);
    }
    if (rc == 0) {
        rc = psd_store_commit(w->t);
    } else {
        psd_store_abort(w->t);
    }
    w->t = NULL;
    if (rc == 0 && w->ndelta > 0) {
        pthread_mutex_lock(&sp->seg_mu);
        if (w->ndelta > sp->seg_cap) {
            uint64_t *a = realloc(sp->seg_live, w->ndelta * sizeof *a);
            if (a != NULL) {
                memset(a + sp->seg_cap, 0, (w->ndelta - sp->seg_cap) * sizeof *a);
                sp->seg_live = a;
                sp->seg_cap = w->ndelta;
            } else {
                atomic_store(&sp->seg_recount, true);
            }
        }
        int64_t total = 0;
        for (uint32_t i = 0; i < w->ndelta && i < sp->seg_cap; i++) {
            int64_t v = (int64_t)sp->seg_live[i] + w->delta[i];
            sp->seg_live[i] = v > 0 ? (uint64_t)v : 0;
            total += w->delta[i];
        }
        uint64_t live = atomic_load(&sp->live_bytes);
        atomic_store(&sp->live_bytes, (int64_t)live + total > 0 ? live + (uint64_t)total : 0);
        pthread_mutex_unlock(&sp->seg_mu);
    }
    free(w->delta);
    w->delta = NULL;
    w->ndelta = 0;
    return rc;
}

void sparse_catw_abort(struct sp_catw *w)
{
    psd_store_abort(w->t);
    w->t = NULL;
    free(w->delta);
    w->delta = NULL;
    w->ndelta = 0;
}

int sparse_catw_end(struct sp_catw *w, int rc)
{
    if (rc == 0)
        return sparse_catw_commit(w);
    sparse_catw_abort(w);
    return rc;
}

/* Whether the catalog, in transaction w, points row (var_id, id) at loc;
 * *old: its entry. */
static bool cat_points(struct sp_catw *w, uint32_t var_id, int64_t id, psd_seg_loc loc,
                       struct sp_cat *old, int *rc)
{
    const void *d;
    size_t len;
    *rc = psd_store_row_peek(w->t, var_id, id, &d, &len);
    if (*rc == PS_ENOTFOUND)
        *rc = 0;
    else if (*rc == 0 && sparse_cat_decode(d, len, old))
        return old->loc.seg == loc.seg && old->loc.off == loc.off;
    return false;
}

int sparse_relocate(psd_sparse *sp, const struct sp_move *mv, size_t n, size_t *moved)
{
    struct sp_ixset *ix = malloc((n ? n : 1) * sizeof *ix);
    /* Per move: 1 queued (a ready table's index holds the old record), 2
     * written into the catalog (no ready table: the catalog says), 0 not
     * moved; +4 once moved. */
    uint8_t *how = malloc(n ? n : 1);
    int rc = ix && how ? sparse_catq_reserve(sp, n) : -ENOMEM;
    for (size_t i = 0; i < n && rc == 0; i++) {
        int held = sparse_index_holds(sp, mv[i].var_id, mv[i].id, mv[i].old_loc);
        how[i] = held > 0 ? 1 : held < 0 ? 2 : 0;
    }
    size_t nix = 0;
    while (rc == 0) {
        struct sp_catw w;
        *moved = nix = 0;
        rc = sparse_catw_begin(sp, &w, true);
        for (size_t i = 0; i < n && rc == 0; i++) {
            const struct sp_move *m = &mv[i];
            struct sp_cat old;
            how[i] &= 3;
            if (how[i] == 0 ||
                (how[i] == 2 && !cat_points(&w, m->var_id, m->id, m->old_loc, &old, &rc)))
                continue; /* a newer write won, or deleted since */
            if (how[i] == 2) {
                struct sp_cat c = old;
                c.loc = m->new_loc;
                rc = cat_put(&w, m->var_id, m->id, &c, &old);
            } else {
                sparse_catw_live(&w, m->old_loc, m->new_loc);
            }
            ix[nix++] = (struct sp_ixset){.var_id = m->var_id, .id = m->id,
                                          .loc = m->new_loc, .only_if = &m->old_loc};
            how[i] |= 4;
        }
        *moved = nix;
        rc = sparse_catw_end(&w, rc);
        if (rc != PS_EFULL || psd_store_grow(sp->store) != 0)
            break;
        rc = 0;
    }
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (how[i] == (1 | 4))
            sparse_catq_add(sp, &(struct sp_catq){.var_id = mv[i].var_id, .id = mv[i].id,
                                                  .loc = mv[i].new_loc, .moved = true});
    if (rc == 0)
        sparse_index_apply(sp, ix, nix, false); /* no new id: nothing to fail */
    free(ix);
    free(how);
    return rc;
}

/* ---- the catalog queue ---------------------------------------------------- */

static uint64_t pack_end(psd_seg_loc e)
{
    return (uint64_t)e.seg << END_OFF_BITS | e.off;
}

static psd_seg_loc unpack_end(uint64_t p)
{
    return (psd_seg_loc){.seg = (uint32_t)(p >> END_OFF_BITS),
                         .off = p & (((uint64_t)1 << END_OFF_BITS) - 1)};
}

static void catq_counts(psd_sparse *sp)
{
    atomic_store(&sp->catq_bytes, sp->catq_cap * sizeof *sp->catq);
}

static void catq_free(psd_sparse *sp)
{
    sparse_cat_ahead_end(sp); /* they read the array */
    free(sp->catq);
    sp->catq = NULL;
    sp->catq_n = sp->catq_cap = 0;
    catq_counts(sp);
}

/* The queue's array to room for cap entries: 0 or -ENOMEM (as it was). */
static int catq_resize(psd_sparse *sp, size_t cap)
{
    sparse_cat_ahead_end(sp); /* they read the array */
    struct sp_catq *q = realloc(sp->catq, cap * sizeof *q);
    if (q == NULL)
        return -ENOMEM;
    sp->catq = q;
    sp->catq_cap = cap;
    catq_counts(sp);
    return 0;
}

/* Forgets the queue, and a write of it under way (what that write
 * committed stays: entries of records past "cat_upto", which a replay
 * writes again): "cat_upto" stays where it is, and the next write reads
 * the records past it from the segments. Then the queue no longer holds
 * the RAM budget: in bench/sparse's 4x-over pushes it passed its size
 * within a second, and pushes waited for room behind its writes. */
void sparse_cat_drop(psd_sparse *sp)
{
    catq_free(sp);
    sp->catw_n = sp->catw_k = 0;
    sp->catw_upto = 0;
    sp->catw_scan = false;
    sp->catq_lost = true;
}

int sparse_catq_reserve(psd_sparse *sp, size_t n)
{
    if (sp->catq_lost)
        return 0;
    size_t max = sparse_catq_max(sp);
    if (sp->catq_n + n > max) {
        sparse_cat_drop(sp);
        return 0;
    }
    if (sp->catq_n + n <= sp->catq_cap)
        return 0;
    size_t nc = sp->catq_cap ? sp->catq_cap : 4096;
    while (nc < sp->catq_n + n)
        nc *= 2;
    if (nc > max)
        nc = max;
    return catq_resize(sp, nc);
}

void sparse_catq_add(psd_sparse *sp, const struct sp_catq *e)
{
    atomic_fetch_add(&sp->catq_len, 1);
    if (sp->catq_lost)
        return; /* the next write reads its record */
    struct sp_catq *q = &sp->catq[sp->catq_n];
    *q = *e;
    q->ord = sp->catq_n++;
}

uint64_t sparse_cat_span(psd_sparse *sp)
{
    psd_seg_loc u = unpack_end(atomic_load(&sp->cat_upto)), e = psd_segs_end(sp->segs);
    if (u.seg >= e.seg)
        return u.seg == e.seg && e.off > u.off ? e.off - u.off : 0;
    uint64_t b = e.off;
    for (uint32_t n = u.seg; n < e.seg; n++) {
        uint64_t bytes, live;
        if (psd_segs_usage(sp->segs, n, &bytes, &live) == 0)
            b += PSD_SEG_FILE_HEAD + bytes;
    }
    return b > u.off ? b - u.off : 0;
}

bool sparse_cat_covers(psd_sparse *sp, psd_seg_loc loc)
{
    return pack_end(loc) < atomic_load(&sp->cat_upto);
}

/* What a catalog entry not written yet may take of the store's file:
 * its key and entry in a leaf page, pages about half full after splits. */
#define CAT_ENTRY_ROOM 128

bool sparse_cat_due(psd_sparse *sp, bool must)
{
    uint64_t k = must ? 2 : 1;
    if (sparse_cat_span(sp) >= k * SPARSE_CAT_SPAN)
        return true;
    uint64_t need = (uint64_t)atomic_load(&sp->catq_len) * CAT_ENTRY_ROOM;
    return need > 0 && need * (must ? 1 : 2) >= psd_store_room(sp->store);
}

bool sparse_cat_reaches(psd_sparse *sp, psd_seg_loc end)
{
    return atomic_load(&sp->cat_upto) >= pack_end(end);
}

size_t sparse_catq_max(const psd_sparse *sp)
{
    /* A 32nd of the RAM budget (whose cost counts the queue; its sort
     * takes as much again for a moment), at least 1024 entries: over
     * several applies a hot row's entries collapse into one write. */
    size_t n = (size_t)(sparse_budget(sp) / 32 / sizeof(struct sp_catq));
    return n > 1024 ? n : 1024;
}

static int cmp_catq(const void *pa, const void *pb)
{
    const struct sp_catq *a = pa, *b = pb;
    return sparse_cmp_row(a->var_id, a->id, a->ord, b->var_id, b->id, b->ord);
}

/* Writes the entries of q[*k..n) into w, one per row: its last entry,
 * with the version and last step of the last one not a relocation (or of
 * the catalog's entry); until about max leaf pages are dirty. LMDB keeps
 * a write transaction's dirty pages in memory, and each commit costs two
 * fsyncs: a chunk read from the records is dense in the keys, tens of
 * rows to a leaf page, and a transaction bounded by rows (a page each)
 * made psd-segments-kill's first restart commit 764 times to replay 587k
 * records (4.8 s). The pages are counted from where LMDB hands out each
 * row's old entry, inside its leaf page: a change of page counts one (a
 * page's first entry is read from the map, its next from the dirty copy:
 * about two a page), a new row one. */
static int flush_some(struct sp_catw *w, const struct sp_catq *q, size_t n, size_t *k,
                      size_t max, const uint32_t *live, size_t nlive)
{
    int rc = 0;
    uintptr_t page = 0;
    size_t pages = 0;
    while (*k < n && pages < max && rc == 0) {
        size_t g = *k;
        const struct sp_catq *own = NULL;
        for (; g < n && q[g].var_id == q[*k].var_id && q[g].id == q[*k].id; g++)
            if (!q[g].moved)
                own = &q[g];
        const struct sp_catq *last = &q[g - 1];
        *k = g;
        if (live && !bsearch(&last->var_id, live, nlive, sizeof *live, sparse_cmp_u32))
            continue; /* its table went */
        const void *d;
        size_t len;
        struct sp_cat old, c = {.loc = last->loc};
        rc = psd_store_row_peek(w->t, last->var_id, last->id, &d, &len);
        if (rc != 0 && rc != PS_ENOTFOUND)
            break;
        uintptr_t at = rc == 0 ? (uintptr_t)d & ~(uintptr_t)(SPARSE_DIRTY_PAGE - 1) : 0;
        if (at == 0 || at != page) {
            pages++;
            if ((pages & 63) == 0) /* the transaction's pages, as the RAM budget sees them */
                sparse_txn_pages(w->sp, pages);
        }
        page = at;
        bool had = rc == 0 && sparse_cat_decode(d, len, &old);
        if (own != NULL) {
            c.version = own->version;
            c.last_step = own->last_step;
        } else if (had) {
            c.version = old.version;
            c.last_step = old.last_step;
        }
        rc = cat_put(w, last->var_id, last->id, &c, had ? &old : NULL);
    }
    sparse_txn_pages(w->sp, pages);
    return rc;
}

/* The catalog's pages that a transaction of the write is about to change,
 * read ahead by CAT_AHEAD_THREADS threads at once. In a small memory
 * cgroup the catalog does not stay in the page cache, and the writer
 * faulted its leaf pages in one at a time: bench/sparse's 4x-over pushes
 * spent ~75% of the applier's time there (a write of ~45k entries took
 * ~1.8 s), each fault a 4 KiB read waited for alone. Lookups in read
 * transactions of their own (the store is opened MDB_NOTLS) fault the
 * same pages, many in flight. */
#define CAT_AHEAD_THREADS 16
#define CAT_AHEAD_GRAIN 16

struct sp_cat_ahead {
    psd_store *st;
    const struct sp_catq *q;
    size_t end;
    atomic_size_t next;
    pthread_t th[CAT_AHEAD_THREADS];
    int n;
};

static void *cat_ahead_main(void *arg)
{
    struct sp_cat_ahead *a = arg;
    psd_store_rtxn *rt = NULL;
    if (psd_store_rbegin(a->st, &rt) != 0)
        return NULL;
    for (;;) {
        size_t i = atomic_fetch_add(&a->next, CAT_AHEAD_GRAIN);
        if (i >= a->end)
            break;
        size_t e = i + CAT_AHEAD_GRAIN < a->end ? i + CAT_AHEAD_GRAIN : a->end;
        for (; i < e; i++) {
            const void *d;
            size_t len;
            (void)psd_store_row_get(rt, a->q[i].var_id, a->q[i].id, &d, &len);
        }
    }
    psd_store_rend(rt);
    return NULL;
}

/* Starts reading ahead the pages of the write's entries [from, end):
 * the next transaction's, while this one commits. What it cannot start
 * (a thread, memory) the writer faults in itself. */
static void cat_ahead_start(psd_sparse *sp, size_t from, size_t end)
{
    if (sp->cat_ahead != NULL || end - from < 2 * CAT_AHEAD_GRAIN)
        return;
    struct sp_cat_ahead *a = calloc(1, sizeof *a);
    pthread_attr_t at;
    if (a == NULL || pthread_attr_init(&at) != 0) {
        free(a);
        return;
    }
    *a = (struct sp_cat_ahead){.st = sp->store, .q = sp->catq, .end = end};
    atomic_store(&a->next, from);
    pthread_attr_setstacksize(&at, (size_t)256 << 10);
    for (; a->n < CAT_AHEAD_THREADS; a->n++)
        if (pthread_create(&a->th[a->n], &at, cat_ahead_main, a) != 0)
            break;
    pthread_attr_destroy(&at);
    sp->cat_ahead = a;
}

void sparse_cat_ahead_end(psd_sparse *sp)
{
    struct sp_cat_ahead *a = sp->cat_ahead;
    if (a == NULL)
        return;
    while (a->n-- > 0)
        pthread_join(a->th[a->n], NULL);
    free(a);
    sp->cat_ahead = NULL;
}

/* Takes the whole queue as the part to write, sorted, covering the
 * records up to the segments' end: every record before it has its entry
 * in the part or in the catalog (entries are queued under apply_run_mu
 * right after the commit of their records). Entries queued from now on
 * are of later records, written by the next write; they follow the part
 * in the same array (one array: two, the part and a new queue, took
 * psd-sparse-caps' psd ~10 MiB past its bound). The queue dropped, the
 * part is read from the records past "cat_upto" instead, a chunk at a
 * time (cat_chunk). */
static void cat_take(psd_sparse *sp, bool all)
{
    sp->catw_k = 0;
    sp->catw_upto = pack_end(psd_segs_end(sp->segs));
    sp->catw_all = all;
    sp->catw_gone = atomic_load(&sp->tables_gone);
    sp->catw_recs = atomic_load(&sp->catq_len);
    sp->catw_scan = sp->catq_lost;
    if (sp->catw_scan) {
        sp->catw_n = sp->catq_n = 0;
        sp->catw_from = unpack_end(atomic_load(&sp->cat_upto));
        sp->catw_scanned = 0;
        return;
    }
    sp->catw_n = sp->catq_n;
    if (sp->catw_n > 1)
        qsort(sp->catq, sp->catw_n, sizeof *sp->catq, cmp_catq);
}

/* The scan of a chunk: the records from catw_from up to catw_upto, at
 * most the array's room. */
static int chunk_rec(void *ctx, uint32_t var_id, int64_t id, uint64_t version,
                     psd_seg_loc loc, const void *row, size_t len)
{
    psd_sparse *sp = ctx;
    if (pack_end(loc) >= sp->catw_upto) {
        sp->catw_from = unpack_end(sp->catw_upto); /* committed after the write began */
        return SPARSE_SCAN_END;
    }
    if (sp->catw_n >= sp->catq_cap)
        return SPARSE_SCAN_END;
    struct sp_catq *e = &sp->catq[sp->catw_n];
    *e = (struct sp_catq){.var_id = var_id, .id = id, .loc = loc, .version = version,
                          .ord = sp->catw_n};
    if (len >= SPARSE_ROW_HEAD)
        memcpy(&e->last_step, (const uint8_t *)row + 8, sizeof e->last_step);
    sp->catw_n++;
    sp->catw_scanned++;
    sp->catw_from = (psd_seg_loc){.seg = loc.seg, .off = loc.off + loc.len};
    return 0;
}

/* Keeps, of the sorted chunk q[0..n), the records of rows the indexes of
 * the ready tables hold (a later record of a row wins when written, so
 * that the catalog never points at a record older than the span's: a
 * compaction removes a segment once "cat_upto" is past its copies). The
 * others are of tables that went (a sweep leaves the rows a compaction
 * step copied until their copies are behind "cat_upto", its relocation
 * committed or not). Returns the entries kept, in order. */
static size_t chunk_keep(psd_sparse *sp, struct sp_catq *q, size_t n)
{
    size_t kept = 0;
    pthread_mutex_lock(&sp->tables_mu);
    for (size_t i = 0; i < n;) {
        size_t g = i;
        while (g < n && q[g].var_id == q[i].var_id)
            g++;
        psd_sparse_table *t = sp->tables;
        while (t != NULL && !(t->ready && t->var_id == q[i].var_id))
            t = t->next;
        if (t != NULL) {
            sparse_lock(t);
            for (; i < g; i++)
                if (sparse_index_get(t, q[i].id) != 0)
                    q[kept++] = q[i];
            pthread_mutex_unlock(&t->mu);
        }
        i = g;
    }
    pthread_mutex_unlock(&sp->tables_mu);
    return kept;
}

/* Reads the next chunk of the write's records into the array, sorted and
 * (unless the write is of every table, at open) only of rows the indexes
 * hold; an empty chunk once the scan reached the write's end. */
static int cat_chunk(psd_sparse *sp)
{
    /* At open, before any table is ready, the RAM tier is empty: a chunk
     * may take half the budget. Every chunk rewrites the catalog's leaf
     * pages its rows fall on, whatever their number: fewer, denser chunks
     * rewrite fewer pages. */
    size_t cap = sp->cat_roomy ? (size_t)(sparse_budget(sp) / 2 / sizeof *sp->catq)
                               : sparse_catq_max(sp);
    /* No more than the records left can hold (each a head and a row's). */
    uint64_t left = sparse_cat_span(sp) / (PSD_SEG_REC_HEAD + SPARSE_ROW_HEAD) + 1;
    if (cap > left)
        cap = left < 1024 ? 1024 : (size_t)left;
    int rc = 0;
    sparse_cat_ahead_end(sp); /* they read the array */
    if (sp->catq_cap != cap && (rc = catq_resize(sp, cap)) != 0)
        return rc;
    sp->catw_n = sp->catw_k = 0;
    while (rc == 0 && sp->catw_n == 0 && pack_end(sp->catw_from) < sp->catw_upto) {
        psd_seg_loc from = sp->catw_from;
        uint64_t scanned = sp->catw_scanned;
        rc = psd_segs_scan(sp->segs, &from, chunk_rec, sp);
        if (rc == SPARSE_SCAN_END) {
            rc = 0;
        } else if (rc == 0) {
            sp->catw_from = unpack_end(sp->catw_upto); /* the segments' end */
        } else {
            sp->catw_from = from; /* the same chunk again next time */
            sp->catw_scanned = scanned;
            sp->catw_n = 0;
        }
        if (rc == 0 && sp->catw_n > 1)
            qsort(sp->catq, sp->catw_n, sizeof *sp->catq, cmp_catq);
        if (rc == 0 && !sp->catw_all)
            sp->catw_n = chunk_keep(sp, sp->catq, sp->catw_n);
    }
    sp->catq_n = sp->catw_n;
    return rc;
}

/* Whether the write under way has more entries than its current part:
 * another chunk of records to read. */
static bool cat_more(const psd_sparse *sp)
{
    return sp->catw_scan && pack_end(sp->catw_from) < sp->catw_upto;
}

/* The write under way is in the catalog: "cat_upto" moved (committed
 * with its last transaction), the sweeps due again (they see its rows
 * now). */
static void cat_done(psd_sparse *sp)
{
    sparse_cat_ahead_end(sp); /* none: the last transaction starts none */
    atomic_store(&sp->cat_upto, sp->catw_upto);
    if (!sp->catw_all) /* it skipped the entries of the tables gone before it */
        sp->cat_gone_done = sp->catw_gone;
    atomic_fetch_sub(&sp->catq_len, sp->catw_recs);
    pthread_mutex_lock(&sp->tables_mu);
    for (psd_sparse_table *t = sp->tables; t != NULL; t = t->next) {
        sparse_flusher_lock(t);
        t->sweep_clock = UINT64_MAX;
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&sp->tables_mu);
    if (sp->catw_scan) {
        /* Nothing was queued meanwhile: whether records were committed
         * since the write began says whether the next write reads them. */
        catq_free(sp);
        sp->catq_lost = pack_end(psd_segs_end(sp->segs)) != sp->catw_upto;
    } else {
        /* What was queued meanwhile moves to the front, in its order (an
         * empty queue may have no array: no arithmetic on NULL). */
        if (sp->catq_n > sp->catw_n)
            memmove(sp->catq, sp->catq + sp->catw_n,
                    (sp->catq_n - sp->catw_n) * sizeof *sp->catq);
        sp->catq_n -= sp->catw_n;
    }
    sp->catw_n = sp->catw_k = 0;
    sp->catw_upto = 0;
    sp->catw_scan = false;
}

/* Writes up to txns transactions of the write under way, each begun
 * before until (ps_now_ms; 0: any time): 0 (*busy: more is left) or the
 * store's error (the part kept, written again from where it stands). */
static int cat_write(psd_sparse *sp, size_t txns, int64_t until, bool *busy)
{
    size_t nlive = 0;
    uint32_t *live = sp->catw_all ? NULL : sparse_live_ids(sp, &nlive);
    if (!sp->catw_all && live == NULL)
        return -ENOMEM;
    /* Pages a transaction dirties at most; the entries read ahead, as many
     * as the last transaction took (about as many pages). */
    size_t max = sparse_txn_rows(sp);
    if (sp->cat_txn_pages > 0)
        max = sp->cat_txn_pages;
    size_t ahead = max;
    int rc = 0;
    for (size_t n = 0; n < txns && rc == 0 && sp->catw_upto != 0 &&
                       (until == 0 || ps_now_ms() < until);
         n++) {
        if (sp->catw_k >= sp->catw_n && cat_more(sp) && (rc = cat_chunk(sp)) != 0)
            break;
        size_t from = sp->catw_k, k = from;
        /* This transaction's pages: read ahead during the last one's
         * commit (the same entries, unless that one failed), or now. */
        cat_ahead_start(sp, from, sp->catw_n - from < ahead ? sp->catw_n : from + ahead);
        sparse_cat_ahead_end(sp);
        struct sp_catw w;
        rc = sparse_catw_begin(sp, &w, false);
        w.no_live = true; /* counted when queued */
        if (rc == 0)
            rc = flush_some(&w, sp->catq, sp->catw_n, &k, max, live, nlive);
        bool last = k >= sp->catw_n && !cat_more(sp);
        if (k - from > ahead)
            ahead = k - from;
        if (rc == 0 && k < sp->catw_n)
            cat_ahead_start(sp, k, sp->catw_n - k < ahead ? sp->catw_n : k + ahead);
        if (rc == 0 && last)
            rc = psd_store_set_log_mark(w.t, PSD_STORE_CAT_UPTO, sp->catw_upto);
        rc = sparse_catw_end(&w, rc);
        atomic_store(&sp->apply_pages, 0);
        if (rc == PS_EFULL) {
            sparse_cat_ahead_end(sp); /* a growth waits for every transaction */
            if (psd_store_grow(sp->store) == 0) {
                rc = 0; /* the same entries again in a bigger map */
                continue;
            }
        }
        if (rc == 0)
            sp->catw_k = k;
        if (rc == 0 && last)
            cat_done(sp);
    }
    free(live);
    *busy = sp->catw_upto != 0;
    if (rc != 0) {
        int64_t now = ps_now_ms();
        if (now - sp->cat_logged_ms >= 60000) {
            ps_log_err(rc, "writing %zu applied entries into the catalog (kept, written "
                       "again later; past %llu MiB of records behind it nothing more is "
                       "applied)", atomic_load(&sp->catq_len),
                       (unsigned long long)(2 * SPARSE_CAT_SPAN >> 20));
            sp->cat_logged_ms = now;
        }
    }
    return rc;
}

bool sparse_cat_behind(psd_sparse *sp)
{
    return sp->catq_n > sp->catw_n ||
           atomic_load(&sp->cat_upto) != pack_end(psd_segs_end(sp->segs));
}

int sparse_cat_step(psd_sparse *sp, bool *busy)
{
    *busy = false;
    if (sp->catw_upto == 0) {
        if (!sparse_cat_behind(sp))
            return 0;
        cat_take(sp, false);
    }
    return cat_write(sp, 1, 0, busy);
}

bool sparse_cat_reads(const psd_sparse *sp)
{
    return sp->catw_upto != 0 ? sp->catw_scan : sp->catq_lost;
}

int sparse_cat_flush(psd_sparse *sp, bool all)
{
    return sparse_cat_flush_until(sp, all, 0);
}

int sparse_cat_flush_until(psd_sparse *sp, bool all, int64_t until)
{
    int rc = 0;
    bool busy = false;
    /* The write under way first (the catalog's entries of a row go in in
     * the order of its records), then what was queued since. */
    for (int round = 0; round < 2 && rc == 0; round++) {
        if (sp->catw_upto == 0) {
            if (!sparse_cat_behind(sp))
                break;
            cat_take(sp, all);
        }
        sp->catw_all = sp->catw_all || all;
        rc = cat_write(sp, SIZE_MAX, until, &busy);
    }
    if (rc == 0 && sp->catq_n == 0 && sp->catq_cap > 2 * sparse_catq_max(sp))
        catq_free(sp); /* empty */
    return rc;
}

/* ---- live bytes --------------------------------------------------------- */

struct recount {
    uint64_t *live;
    uint32_t cap;
    uint64_t total, inline_rows;
};

static int recount_row(void *ctx, uint32_t var_id, int64_t id, const void *d, size_t len)
{
    struct recount *r = ctx;
    struct sp_cat c;
    (void)var_id;
    (void)id;
    if (!sparse_cat_decode(d, len, &c)) {
        r->inline_rows++;
        return 0;
    }
    if (c.loc.seg >= r->cap) {
        uint32_t nc = r->cap ? r->cap : 64;
        while (nc <= c.loc.seg)
            nc *= 2;
        uint64_t *a = realloc(r->live, nc * sizeof *a);
        if (a == NULL)
            return -ENOMEM;
        memset(a + r->cap, 0, (nc - r->cap) * sizeof *a);
        r->live = a;
        r->cap = nc;
    }
    r->live[c.loc.seg] += c.loc.len;
    r->total += c.loc.len;
    return 0;
}

/* Counts the live bytes from the catalog, in read transactions of
 * SCAN_CHUNK rows, seg_mu held throughout (the appender is the caller or
 * not started, and a sweep's counts wait). *inline_rows: rows not in the
 * segments yet. */
static int recount(psd_sparse *sp, uint64_t *inline_rows)
{
    struct recount r = {0};
    uint32_t var = 0;
    int64_t id = INT64_MIN;
    bool done = false;
    int rc = 0;
    pthread_mutex_lock(&sp->seg_mu);
    atomic_store(&sp->seg_recount, false);
    while (rc == 0 && !done)
        rc = psd_store_rows_scan(sp->store, &var, &id, SCAN_CHUNK, recount_row, &r, &done);
    if (rc == 0) {
        free(sp->seg_live);
        sp->seg_live = r.live;
        sp->seg_cap = r.cap;
        atomic_store(&sp->live_bytes, r.total);
        r.live = NULL;
    }
    pthread_mutex_unlock(&sp->seg_mu);
    free(r.live);
    if (inline_rows != NULL)
        *inline_rows = r.inline_rows;
    return rc;
}

int sparse_seg_recount(psd_sparse *sp)
{
    return recount(sp, NULL);
}

const char *psd_sparse_full_reason(psd_sparse *sp)
{
    return sp != NULL && atomic_load(&sp->seg_full)
               ? "the disk is full, or a segment file is at psd's file size limit"
               : NULL;
}

uint64_t sparse_dead_bytes(psd_sparse *sp)
{
    if (sp->segs == NULL)
        return 0;
    uint64_t all = psd_segs_bytes(sp->segs), live = atomic_load(&sp->live_bytes);
    return all > live ? all - live : 0;
}

/* ---- moving rows: conversion and checkpoint copies ---------------------- */

/* A batch of rows a scan picked: their keys, entries and bytes. */
struct move_row {
    uint32_t var, len;  /* len: the row's bytes */
    int64_t id;
    size_t off;         /* of its bytes in buf */
    struct sp_cat cat;  /* its catalog entry (a checkpoint's copy) */
    psd_seg_loc loc;    /* where it was appended (a conversion) */
};

struct move {
    bool want_inline;  /* rows held in LMDB (conversion), else catalog entries */
    bool one_table;    /* only the rows of table from, appended as table to
                          (a restore's staging) */
    uint32_t from, to;
    struct psd_sparse_conv *conv; /* a restore's staging into another row dtype */
    float *scratch;    /* conv's, psd_sparse_state_floats */
    ps_buf rows;       /* struct move_row of each row */
    ps_buf buf;        /* their bytes */
    size_t n;
};

static void move_free(struct move *m)
{
    ps_buf_free(&m->rows);
    ps_buf_free(&m->buf);
}

static struct move_row *move_rows(const struct move *m)
{
    return (struct move_row *)(void *)m->rows.data;
}

/* Picks a row for the batch; 1 (stop after it) once the batch is full,
 * MOVE_END past the one table it moves. */
#define MOVE_END (-ECANCELED)

static int move_pick(void *ctx, uint32_t var_id, int64_t id, const void *d, size_t len)
{
    struct move *m = ctx;
    if (m->one_table && var_id != m->from)
        return MOVE_END;
    struct sp_cat c = {0};
    bool cat = sparse_cat_decode(d, len, &c);
    if (cat == m->want_inline)
        return 0;
    if (!cat && len > UINT32_MAX - PSD_SEG_REC_HEAD)
        return PS_ECORRUPT;
    size_t in = len;
    if (!cat && m->conv != NULL)
        len = sparse_row_bytes(m->conv->to);
    size_t bytes = cat ? c.loc.len : len;
    if (ps_buf_reserve(&m->rows, (m->n + 1) * sizeof(struct move_row)) != 0 ||
        ps_buf_reserve(&m->buf, m->buf.len + bytes) != 0)
        return -ENOMEM;
    int crc = !cat && m->conv != NULL
                  ? psd_sparse_convert_row(m->conv->from, m->conv->to, d, in,
                                           m->buf.data + m->buf.len, m->scratch,
                                           &m->conv->clamped)
                  : 0;
    if (crc != 0)
        return crc;
    move_rows(m)[m->n++] = (struct move_row){
        .var = var_id, .id = id, .off = m->buf.len, .cat = c,
        .len = (uint32_t)(cat ? c.loc.len - PSD_SEG_REC_HEAD : len)};
    if (!cat && m->conv == NULL)
        memcpy(m->buf.data + m->buf.len, d, len);
    m->buf.len += bytes;
    return m->n >= MOVE_ROWS || m->buf.len >= MOVE_BYTES ? 1 : 0;
}

/* Appends the batch's rows to the segments and syncs them (r[k].loc). */
static int move_append(psd_sparse *sp, struct move *m)
{
    struct move_row *r = move_rows(m);
    int rc = 0;
    for (size_t k = 0; k < m->n && rc == 0; k++)
        rc = psd_segs_append(sp->segs, m->one_table ? m->to : r[k].var, r[k].id, 0,
                             m->buf.data + r[k].off, r[k].len, NULL, 0, &r[k].loc);
    if (rc != 0) {
        psd_segs_discard(sp->segs);
        return rc;
    }
    rc = psd_segs_sync(sp->segs);
    atomic_store(&sp->seg_full, rc == PS_EFULL);
    return rc;
}

/* Appends the batch's rows to the segments, syncs them, and points the
 * catalog at them: a conversion only where LMDB still holds the same bytes
 * (a sweep may have deleted the row, an apply replaced it); a restore's
 * staging (m->one_table) under m->to, a fresh var_id no other writer
 * knows. apply_run_mu held. */
static int append_batch(psd_sparse *sp, psd_store *st, struct move *m)
{
    (void)st;
    struct move_row *r = move_rows(m);
    static const psd_seg_loc in_lmdb = {0}; /* packs to SPARSE_LOC_LMDB */
    struct sp_ixset *ix = malloc((m->n ? m->n : 1) * sizeof *ix);
    size_t nix = 0;
    int rc = ix == NULL ? -ENOMEM : move_append(sp, m);
    if (rc != 0) {
        free(ix);
        return rc;
    }
    do {
        struct sp_catw w;
        nix = 0;
        rc = sparse_catw_begin(sp, &w, true);
        for (size_t k = 0; k < m->n && rc == 0; k++) {
            const uint8_t *row = m->buf.data + r[k].off;
            const void *d;
            size_t len;
            if (!m->one_table) {
                int prc = psd_store_row_peek(w.t, r[k].var, r[k].id, &d, &len);
                if (prc != 0 && prc != PS_ENOTFOUND) {
                    rc = prc;
                    break;
                }
                if (prc == PS_ENOTFOUND || len != r[k].len || memcmp(d, row, len) != 0)
                    continue;
                /* A ready table's index says "ask the catalog" for it. */
                ix[nix++] = (struct sp_ixset){.var_id = r[k].var, .id = r[k].id,
                                              .loc = r[k].loc, .only_if = &in_lmdb};
            }
            struct sp_cat c = {.loc = r[k].loc,
                               .last_step = sparse_stored_last_step(row, r[k].len)};
            rc = cat_put(&w, m->one_table ? m->to : r[k].var, r[k].id, &c, NULL);
        }
        rc = sparse_catw_end(&w, rc);
    } while (rc == PS_EFULL && psd_store_grow(sp->store) == 0);
    if (rc == 0)
        sparse_index_apply(sp, ix, nix, false); /* no new id: nothing to fail */
    free(ix);
    return rc;
}

/* Scans the rows of st (m says which) in batches, each handed to fn;
 * *moved: the rows of the batches fn took. */
static int move_all(psd_sparse *sp, psd_store *st, struct move *m,
                    int (*fn)(psd_sparse *sp, psd_store *st, struct move *m), uint64_t *moved)
{
    uint32_t var = m->one_table ? m->from : 0;
    int64_t id = INT64_MIN;
    bool done = false;
    int rc = 0;
    *moved = 0;
    while (rc == 0 && !done) {
        m->n = m->buf.len = 0;
        rc = psd_store_rows_scan(st, &var, &id, SIZE_MAX, move_pick, m, &done);
        if (rc == MOVE_END) {
            rc = 0;
            done = true;
        }
        if (rc == 0 && m->n > 0)
            rc = fn(sp, st, m);
        *moved += rc == 0 ? m->n : 0;
    }
    move_free(m);
    return rc;
}

int psd_sparse_stage(psd_sparse *sp, struct psd_store *src, const char *name, uint32_t to,
                     struct psd_sparse_conv *conv)
{
    struct move m = {.want_inline = true, .one_table = true, .to = to, .conv = conv};
    uint64_t moved = 0;
    if (conv != NULL &&
        (m.scratch = malloc(psd_sparse_state_floats(conv->to) * sizeof(float))) == NULL)
        return -ENOMEM;
    int rc = psd_store_var_id(src, name, &m.from);
    if (rc == 0) {
        pthread_mutex_lock(&sp->apply_run_mu);
        rc = sparse_cat_flush(sp, false);
        if (rc == 0)
            rc = move_all(sp, src, &m, append_batch, &moved);
        pthread_mutex_unlock(&sp->apply_run_mu);
    }
    if (rc != 0)
        ps_log_err(rc, "restore: staging the rows of sparse table '%s' into segment files "
                   "(%llu staged)", name, (unsigned long long)moved);
    if (conv != NULL)
        conv->rows = moved;
    free(m.scratch);
    return rc;
}

int sparse_convert(psd_sparse *sp)
{
    struct move m = {.want_inline = true};
    uint64_t moved = 0;
    /* The queue first: what the conversion appends comes after it. */
    int rc = sparse_cat_flush(sp, false);
    if (rc == 0)
        rc = move_all(sp, sp->store, &m, append_batch, &moved);
    atomic_fetch_add(&sp->converted, moved);
    if (rc != 0)
        ps_log_err(rc, "moving the sparse rows held in LMDB into segment files (%llu moved; "
                   "the rest are read from LMDB, and moved at the next start)",
                   (unsigned long long)moved);
    else if (moved > 0)
        ps_log_info("moved %llu sparse rows from LMDB into segment files",
                    (unsigned long long)moved);
    return rc;
}

/* Reads the batch's rows from the segments and writes their bytes into the
 * store copy ck in place of their catalog entries. */
static int materialize_batch(psd_sparse *sp, psd_store *ck, struct move *m)
{
    struct move_row *r = move_rows(m);
    psd_seg_read *rq = calloc(m->n, sizeof *rq);
    if (rq == NULL)
        return -ENOMEM;
    for (size_t k = 0; k < m->n; k++)
        rq[k] = (psd_seg_read){.loc = r[k].cat.loc, .var_id = r[k].var, .id = r[k].id,
                               .dst = m->buf.data + r[k].off, .cap = r[k].len};
    int rc = psd_segs_read(sp->segs, rq, m->n);
    for (size_t k = 0; rc == PS_ECORRUPT && k < m->n; k++)
        if (rq[k].rc != 0) {
            ps_log_error("checkpoint: row %lld of table id %u: its record at segment %u "
                         "offset %llu is corrupt", (long long)r[k].id, r[k].var,
                         r[k].cat.loc.seg, (unsigned long long)r[k].cat.loc.off);
            break;
        }
    free(rq);
    while (rc == 0) {
        psd_store_txn *t = NULL;
        rc = psd_store_begin(ck, &t);
        for (size_t k = 0; k < m->n && rc == 0; k++)
            rc = psd_store_row_put(t, r[k].var, r[k].id, m->buf.data + r[k].off, r[k].len,
                                   NULL, 0);
        if (rc == 0)
            return psd_store_commit(t);
        psd_store_abort(t);
        if (rc == PS_EFULL && psd_store_grow(ck) == 0)
            rc = 0;
        else
            break;
    }
    return rc;
}

int sparse_ckpt_materialize(psd_sparse *sp, psd_store *ck)
{
    struct move m = {.want_inline = false};
    uint64_t moved;
    return move_all(sp, ck, &m, materialize_batch, &moved);
}

/* ---- open --------------------------------------------------------------- */

/* The records between "cat_upto" and the committed end, which the
 * applier and compaction committed without writing the catalog, into it
 * (a write that reads them, in chunks in segment order: a later record of
 * a row wins). A directory with no "cat_upto" was written row by row into
 * the catalog, or is new: it is whole, and gets the mark. */
static int cat_replay(psd_sparse *sp)
{
    uint64_t upto = 0;
    int64_t t0 = ps_now_ms();
    int rc = psd_store_log_mark(sp->store, PSD_STORE_CAT_UPTO, &upto);
    if (rc == 0 && upto != 0) {
        atomic_store(&sp->cat_upto, upto);
        /* Nothing is queued: read from the segments. */
        sp->catq_lost = upto != pack_end(psd_segs_end(sp->segs));
        uint64_t span = sparse_cat_span(sp);
        rc = sparse_cat_flush(sp, true);
        if (rc == 0 && sp->catw_scanned > 0)
            ps_log_info("catalog: replayed %llu records (%llu MiB) of the segments written "
                        "after its last write, in %lld ms",
                        (unsigned long long)sp->catw_scanned,
                        (unsigned long long)(span >> 20), (long long)(ps_now_ms() - t0));
    } else if (rc == 0) {
        atomic_store(&sp->cat_upto, 1); /* not the end: the flush sets the mark */
        rc = sparse_cat_flush(sp, true);
    }
    return rc;
}

int sparse_segs_open(psd_sparse *sp, char *why_out, size_t why_len)
{
    uint64_t packed = 0;
    int rc = psd_store_log_mark(sp->store, PSD_STORE_SEGS_END, &packed);
    if (rc != 0) {
        ps_log_err(rc, "cannot read the segments' committed end in %s", sp->data_dir);
        return rc;
    }
    psd_seg_loc end = {.seg = (uint32_t)(packed >> END_OFF_BITS),
                       .off = packed & (((uint64_t)1 << END_OFF_BITS) - 1)};
    char why[1024] = "";
    rc = psd_segs_open(sp->data_dir, sp->segment_size, &end, &sp->segs, why, sizeof why);
    if (rc != 0) {
        if (why_out != NULL && why_len > 0)
            snprintf(why_out, why_len, "%s", why[0] ? why : ps_strerror(rc));
        else
            ps_log_error("%s", why[0] ? why : ps_strerror(rc));
        return rc;
    }
    rc = cat_replay(sp);
    if (rc != 0) {
        if (why_out != NULL && why_len > 0)
            snprintf(why_out, why_len, "cannot replay the segments' records into the "
                     "catalog of %s: %s", sp->data_dir, ps_strerror(rc));
        return rc;
    }
    uint64_t inline_rows = 0;
    rc = recount(sp, &inline_rows);
    if (rc == 0 && inline_rows > 0) {
        ps_log_info("%llu sparse rows are held in LMDB (a directory of an older psd, or "
                    "a restore): moving them into segment files",
                    (unsigned long long)inline_rows);
        sparse_convert(sp); /* what fails is logged, and read from LMDB */
    }
    return rc;
}
