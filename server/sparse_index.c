/*
 * sparse_index.c - each table's index of its stored rows
 * (sparse_internal.h): id -> where the row's record is, in memory, so that
 * a cold read finds its records without touching LMDB. LMDB's catalog
 * pages did not stay cached beside the RAM tier in a small memory cgroup,
 * and each cold row cost a synchronous 4 KiB fault on the catalog before
 * its O_DIRECT read (~45% of psd's samples in bench/sparse's 4x-over
 * phase).
 *
 * The shape is DeepRec's SSDHASH and KVell's: open-addressing arrays of
 * 16-byte slots {id, packed location}, linear probing, deletion by
 * backward shift (no tombstones), 4/5 to 7/8 full; 64 of them, by the
 * hash's top bits, so that growing one holds two copies of 1/64 of the
 * index for a moment, not of all of it. A location packs the
 * segment (24 bits) and the offset (40 bits); the length is the table's
 * fixed record length. An empty slot has location 0 (segment 0 does not
 * exist), and SPARSE_LOC_LMDB says "ask the catalog": a row LMDB still
 * holds (not converted yet), or a record that does not fit the packing.
 *
 * Membership is exact: an id the index does not hold has no row outside
 * the RAM tier (it replaced a Bloom filter). Writers keep it right after
 * their LMDB transaction commits: the applier (sparse_index_apply, room
 * reserved before the commit so that nothing fails after it), compaction
 * (only where the index still holds the old record), the sweeps, the
 * conversion of rows LMDB held. A table deleted frees its index with it;
 * a restored one builds its own at its first use (sparse_ready).
 */
#include "server/sparse_internal.h"

#include "common/errors.h"
#include "common/log.h"

#include <errno.h>
#include <stdlib.h>

#define OFF_BITS 40
#define SEG_MAX (((uint64_t)1 << 24) - 1)
#define MIN_CAP 16 /* a part's: 1024 slots, 16 KiB, for a table */
/* Full at 7/8, and grown to 4/5: the index is as large as the RAM tier's
 * rows in a small memory group (21 MiB for a million rows between 2/3 and
 * 4/5 full, ~18 between 4/5 and 7/8), and what it saves the tier keeps.
 * A lookup of an id that is not there probes ~13-32 slots (4-8 cache
 * lines, in a row), one that is there ~3-5, against the cold read of a
 * record that follows it. */
#define LOAD_NUM 7
#define LOAD_DEN 8
#define GROW_BY 4 /* a quarter more than needed: 4/5 full after */

struct sp_slot {
    int64_t id;
    uint64_t loc; /* 0: empty */
};

uint64_t sparse_loc_pack(psd_seg_loc l, uint64_t rec_len)
{
    if (l.seg == 0 || l.seg > SEG_MAX || l.off >> OFF_BITS || l.len != rec_len)
        return SPARSE_LOC_LMDB;
    return (uint64_t)l.seg << OFF_BITS | l.off;
}

psd_seg_loc sparse_loc_unpack(uint64_t p, uint64_t rec_len)
{
    return (psd_seg_loc){.seg = (uint32_t)(p >> OFF_BITS), .len = (uint32_t)rec_len,
                         .off = p & (((uint64_t)1 << OFF_BITS) - 1)};
}

static uint64_t hash_of(int64_t id)
{
    return sparse_mix64((uint64_t)id ^ 0x5851f42d4c957f2dULL);
}

/* The part of an id (the hash's top bits), and its home slot there (the
 * other bits scaled to [0, cap): any capacity, not only powers of two). */
static struct sp_ixpart *part_of(const struct sp_index *x, uint64_t h)
{
    return (struct sp_ixpart *)&x->part[h >> (64 - SPARSE_IX_PART_BITS)];
}

static size_t home(const struct sp_ixpart *x, uint64_t h)
{
    return (size_t)(__extension__(((unsigned __int128)(h << SPARSE_IX_PART_BITS) * x->cap) >>
                                  64));
}

/* The slot of id (hash h) in part x, or the empty slot where it would go. */
static size_t probe(const struct sp_ixpart *x, int64_t id, uint64_t h)
{
    size_t i = home(x, h);
    while (x->slot[i].loc != 0 && x->slot[i].id != id)
        i = i + 1 == x->cap ? 0 : i + 1;
    return i;
}

static void count_bytes(psd_sparse_table *t, int64_t d)
{
    t->ix.bytes += (uint64_t)d;
    if (t->sp != NULL)
        atomic_fetch_add(&t->sp->index_bytes, (uint64_t)d);
}

uint64_t sparse_index_bytes(const psd_sparse_table *t)
{
    return t->ix.bytes;
}

/* Moves part x into an array of cap slots: a part is 1/64 of the index,
 * so that growing holds both arrays of one part only, not of the whole. */
static int resize(psd_sparse_table *t, struct sp_ixpart *x, size_t cap)
{
    struct sp_ixpart nx = {.slot = calloc(cap, sizeof(struct sp_slot)), .cap = cap};
    if (nx.slot == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < x->cap; i++)
        if (x->slot[i].loc != 0)
            nx.slot[probe(&nx, x->slot[i].id, hash_of(x->slot[i].id))] = x->slot[i];
    nx.n = x->n;
    count_bytes(t, ((int64_t)cap - (int64_t)x->cap) * (int64_t)sizeof(struct sp_slot));
    free(x->slot);
    *x = nx;
    return 0;
}

/* Room in part x for more new ids without growing. */
static int part_reserve(psd_sparse_table *t, struct sp_ixpart *x, size_t more)
{
    size_t want = x->n + more;
    if (x->cap > 0 && want * LOAD_DEN <= x->cap * LOAD_NUM)
        return 0;
    size_t cap = want + want / GROW_BY;
    return resize(t, x, cap > MIN_CAP ? cap : MIN_CAP);
}

int sparse_index_reserve(psd_sparse_table *t, size_t more)
{
    /* Spread evenly by the hash, with some slack; a part that gets more
     * grows as it fills. */
    size_t each = more / SPARSE_IX_PARTS + more / SPARSE_IX_PARTS / 16 + 1;
    int rc = 0;
    for (size_t p = 0; p < SPARSE_IX_PARTS && rc == 0; p++)
        rc = part_reserve(t, &t->ix.part[p], each);
    return rc;
}

void sparse_index_free(psd_sparse_table *t)
{
    count_bytes(t, -(int64_t)t->ix.bytes);
    for (size_t p = 0; p < SPARSE_IX_PARTS; p++)
        free(t->ix.part[p].slot);
    t->ix = (struct sp_index){.gen = t->ix.gen + 1};
}

uint64_t sparse_index_get(const psd_sparse_table *t, int64_t id)
{
    uint64_t h = hash_of(id);
    const struct sp_ixpart *x = part_of(&t->ix, h);
    if (x->n == 0)
        return 0;
    return x->slot[probe(x, id, h)].loc;
}

void sparse_index_prefetch(const psd_sparse_table *t, int64_t id)
{
    uint64_t h = hash_of(id);
    const struct sp_ixpart *x = part_of(&t->ix, h);
    if (x->n > 0)
        __builtin_prefetch(&x->slot[home(x, h)]);
}

int sparse_index_set(psd_sparse_table *t, int64_t id, uint64_t loc)
{
    uint64_t h = hash_of(id);
    struct sp_ixpart *x = part_of(&t->ix, h);
    size_t i = x->cap ? probe(x, id, h) : 0;
    if (x->cap == 0 || x->slot[i].loc == 0) {
        /* Past the load, grow; if that fails, a free slot still does
         * (room was reserved before any commit that needs it). */
        if (part_reserve(t, x, 1) != 0 && x->n + 1 >= x->cap)
            return -ENOMEM;
        i = probe(x, id, h);
        x->n++;
        t->ix.n++;
    }
    x->slot[i] = (struct sp_slot){.id = id, .loc = loc};
    t->ix.gen++;
    return 0;
}

bool sparse_index_replace(psd_sparse_table *t, int64_t id, uint64_t old, uint64_t loc)
{
    uint64_t h = hash_of(id);
    struct sp_ixpart *x = part_of(&t->ix, h);
    if (x->n == 0)
        return false;
    struct sp_slot *s = &x->slot[probe(x, id, h)];
    if (s->loc == 0 || s->loc != old)
        return false;
    s->loc = loc;
    t->ix.gen++;
    return true;
}

void sparse_index_del(psd_sparse_table *t, int64_t id)
{
    uint64_t h = hash_of(id);
    struct sp_ixpart *x = part_of(&t->ix, h);
    if (x->n == 0)
        return;
    size_t i = probe(x, id, h);
    if (x->slot[i].loc == 0)
        return;
    /* Backward shift: each later slot of the run whose home is not in
     * (i, j] moves into the hole, which moves to it. */
    for (size_t j = i;;) {
        j = j + 1 == x->cap ? 0 : j + 1;
        if (x->slot[j].loc == 0)
            break;
        size_t k = home(x, hash_of(x->slot[j].id));
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            x->slot[i] = x->slot[j];
            i = j;
        }
    }
    x->slot[i] = (struct sp_slot){0};
    x->n--;
    t->ix.n--;
    t->ix.gen++;
}

/* Room for the ids of s[0..n) (one table's) the index does not hold yet,
 * counted per part; each s[k].was set to the record it replaces. */
static int reserve_new(psd_sparse_table *t, struct sp_ixset *s, size_t n)
{
    size_t more[SPARSE_IX_PARTS] = {0};
    uint64_t rec = sparse_row_bytes(t) + PSD_SEG_REC_HEAD;
    for (size_t k = 0; k < n; k++) {
        uint64_t was = sparse_index_get(t, s[k].id);
        more[hash_of(s[k].id) >> (64 - SPARSE_IX_PART_BITS)] += was == 0;
        s[k].was = was != 0 && was != SPARSE_LOC_LMDB ? sparse_loc_unpack(was, rec)
                                                      : (psd_seg_loc){0};
    }
    int rc = 0;
    for (size_t p = 0; p < SPARSE_IX_PARTS && rc == 0; p++)
        rc = more[p] ? part_reserve(t, &t->ix.part[p], more[p]) : 0;
    return rc;
}

/* ---- what writers changed, applied to the indexes ------------------------ */

/* The ready table of var_id, locked, or NULL. tables_mu held. */
static psd_sparse_table *table_of(psd_sparse *sp, uint32_t var_id)
{
    for (psd_sparse_table *t = sp->tables; t != NULL; t = t->next) {
        if (t->var_id != var_id)
            continue;
        sparse_lock(t);
        if (t->ready && t->var_id == var_id)
            return t;
        pthread_mutex_unlock(&t->mu);
    }
    return NULL;
}

int sparse_index_apply(psd_sparse *sp, struct sp_ixset *s, size_t n, bool reserve)
{
    int rc = 0;
    pthread_mutex_lock(&sp->tables_mu);
    for (size_t i = 0, j; i < n && rc == 0; i = j) {
        for (j = i + 1; j < n && s[j].var_id == s[i].var_id; j++)
            ;
        psd_sparse_table *t = table_of(sp, s[i].var_id);
        if (t == NULL)
            continue; /* deleted, or not used yet: built from LMDB then */
        uint64_t rec = sparse_row_bytes(t) + PSD_SEG_REC_HEAD;
        if (reserve) {
            /* When the index grows, within the budget, the tier gives it
             * room at once rather than at the next round of room (a
             * part's array grows by a quarter at a time: megabytes). */
            uint64_t was = t->ix.bytes;
            rc = reserve_new(t, s + i, j - i);
            if (t->ix.bytes > was && sparse_ram_cost(sp) > sparse_budget(sp))
                sparse_trim(sp, t);
        } else {
            for (size_t k = i; k < j && rc == 0; k++) {
                uint64_t loc = sparse_loc_pack(s[k].loc, rec);
                if (s[k].gone)
                    sparse_index_del(t, s[k].id);
                else if (s[k].only_if != NULL)
                    sparse_index_replace(t, s[k].id, sparse_loc_pack(*s[k].only_if, rec),
                                         loc);
                else
                    rc = sparse_index_set(t, s[k].id, loc);
            }
            if (rc != 0)
                ps_log_err(rc, "sparse table '%s': its index of rows could not grow",
                           t->name);
        }
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&sp->tables_mu);
    return rc;
}

int sparse_index_holds(psd_sparse *sp, uint32_t var_id, int64_t id, psd_seg_loc loc)
{
    pthread_mutex_lock(&sp->tables_mu);
    psd_sparse_table *t = table_of(sp, var_id);
    int r = -1;
    if (t != NULL) {
        uint64_t rec = sparse_row_bytes(t) + PSD_SEG_REC_HEAD;
        uint64_t have = sparse_index_get(t, id);
        r = have == SPARSE_LOC_LMDB ? -1 : have != 0 && have == sparse_loc_pack(loc, rec);
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&sp->tables_mu);
    return r;
}

/* ---- building it -------------------------------------------------------- */

/* A row of the catalog scan, into the index being built (ctx: the
 * table; its row count grows in ix.n). */
static int build_row(void *ctx, uint32_t var_id, int64_t id, const void *d, size_t len)
{
    psd_sparse_table *t = ctx;
    if (var_id != t->var_id)
        return SPARSE_SCAN_END;
    struct sp_cat c;
    uint64_t loc = SPARSE_LOC_LMDB;
    if (sparse_cat_decode(d, len, &c))
        loc = sparse_loc_pack(c.loc, sparse_row_bytes(t) + PSD_SEG_REC_HEAD);
    return sparse_index_set(t, id, loc);
}

int sparse_index_build(psd_sparse *sp, psd_sparse_table *t, uint64_t rows, uint64_t *found)
{
    sparse_index_free(t);
    int rc = sparse_index_reserve(t, rows);
    uint32_t var = t->var_id;
    int64_t id = INT64_MIN;
    bool done = false;
    while (rc == 0 && !done)
        rc = psd_store_rows_scan(sp->store, &var, &id, (size_t)1 << 16, build_row, t, &done);
    if (rc == SPARSE_SCAN_END)
        rc = 0;
    if (rc != 0)
        sparse_index_free(t);
    *found = t->ix.n;
    return rc;
}
