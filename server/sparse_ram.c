/*
 * sparse_ram.c - the RAM tier (sparse_internal.h): each table's hash of
 * rows held in memory, changed rows until the row log's batch that holds
 * them is in LMDB, and within the tier's budget the rows read most, kept
 * by a clock. Every function runs with the table's mutex held.
 */
#include "server/sparse_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define CACHE_SWEEP_BUCKETS 64

/* The size an entry is malloc'd with. */
static size_t entry_size(const psd_sparse_table *t)
{
    return sizeof(struct sp_entry) + (sparse_row_bytes(t) - SPARSE_ROW_HEAD);
}

/* What an entry costs: glibc's chunk (the size word, 16-byte rounding).
 * Of fp16 rows (320-byte entries) the tier counted 450 MiB where its
 * arena held 491 in use: with the hash's buckets, uncounted, psd's memory
 * went past a 627 MiB group's and the group killed it. */
size_t sparse_entry_bytes(const psd_sparse_table *t)
{
    size_t n = entry_size(t) + sizeof(size_t);
    return n < 32 ? 32 : (n + 15) & ~(size_t)15;
}

uint64_t sparse_table_ram(const psd_sparse_table *t)
{
    return (uint64_t)t->nentries * sparse_entry_bytes(t) +
           (uint64_t)t->nbuckets * sizeof *t->buckets;
}

bool sparse_dirty(const struct sp_entry *e)
{
    return e->mod != e->saved;
}

bool sparse_pinned(const psd_sparse *sp, const struct sp_entry *e)
{
    return sparse_dirty(e) || e->listed || e->logged > atomic_load(&sp->log_applied);
}

static size_t bucket_of(const psd_sparse_table *t, int64_t id)
{
    return (size_t)(sparse_mix64((uint64_t)id) & (t->nbuckets - 1));
}

struct sp_entry **sparse_link(psd_sparse_table *t, int64_t id)
{
    struct sp_entry **l = &t->buckets[bucket_of(t, id)];
    while (*l != NULL && (*l)->id != id)
        l = &(*l)->next;
    return l;
}

struct sp_entry *sparse_find(psd_sparse_table *t, int64_t id)
{
    return *sparse_link(t, id);
}

static void grow(psd_sparse *sp, psd_sparse_table *t)
{
    size_t nb = t->nbuckets * 2;
    struct sp_entry **b = calloc(nb, sizeof *b);
    if (b == NULL)
        return; /* longer chains, still correct */
    struct sp_entry **old = t->buckets;
    size_t on = t->nbuckets;
    t->buckets = b;
    t->nbuckets = nb;
    for (size_t i = 0; i < on; i++)
        for (struct sp_entry *e = old[i], *n; e != NULL; e = n) {
            n = e->next;
            size_t k = bucket_of(t, e->id);
            e->next = b[k];
            b[k] = e;
        }
    free(old);
    atomic_fetch_add(&sp->ram, (uint64_t)(nb - on) * sizeof *b);
}

int sparse_reserve(psd_sparse_table *t, size_t rows, size_t entries)
{
    if (t->dn + rows > t->dcap) {
        size_t nc = t->dcap ? t->dcap * 2 : 1024;
        if (nc < t->dn + rows)
            nc = t->dn + rows;
        struct sp_entry **d = realloc(t->dlist, nc * sizeof *d);
        if (d == NULL)
            return -ENOMEM;
        t->dlist = d;
        t->dcap = nc;
    }
    for (size_t k = 0; k < entries; k++) {
        struct sp_entry *e = malloc(entry_size(t));
        if (e == NULL)
            return -ENOMEM;
        e->next = t->spare;
        t->spare = e;
    }
    return 0;
}

void sparse_unreserve(psd_sparse_table *t)
{
    for (struct sp_entry *e = t->spare, *n; e != NULL; e = n) {
        n = e->next;
        free(e);
    }
    t->spare = NULL;
}

/* A new entry for id (not in the hash), its row uninitialized: a reserved
 * one first. */
static struct sp_entry *entry_add(psd_sparse *sp, psd_sparse_table *t, int64_t id)
{
    if (t->nentries >= t->nbuckets)
        grow(sp, t);
    struct sp_entry *e = t->spare;
    if (e != NULL)
        t->spare = e->next;
    else if ((e = malloc(entry_size(t))) == NULL)
        return NULL;
    memset(e, 0, sizeof *e);
    e->id = id;
    size_t k = bucket_of(t, id);
    e->next = t->buckets[k];
    t->buckets[k] = e;
    t->nentries++;
    atomic_fetch_add(&sp->ram, sparse_entry_bytes(t));
    return e;
}

void sparse_entry_drop(psd_sparse *sp, psd_sparse_table *t, struct sp_entry **link)
{
    struct sp_entry *e = *link;
    *link = e->next;
    free(e);
    t->nentries--;
    t->drops++;
    atomic_fetch_sub(&sp->ram, sparse_entry_bytes(t));
}

/* Frees every entry of a table that left its tier. */
void sparse_free_entries(psd_sparse_table *t)
{
    sparse_unreserve(t);
    for (size_t b = 0; b < t->nbuckets && t->buckets; b++)
        for (struct sp_entry *e = t->buckets[b], *n; e != NULL; e = n) {
            n = e->next;
            free(e);
        }
}

/* A walk over ids runs this at each i: the bucket of the id 16 ahead and
 * the entry (and the first lines of its row) of the id 8 ahead are fetched
 * into the cache while this one is looked up, and for an id not in the
 * tier its slot of the index of rows: a table of a million rows is ~600 MB of entries,
 * and each lookup was two or three cache misses in a row (sparse_find was
 * a third of psd's time in bench/sparse's pull). */
void sparse_ahead(const psd_sparse_table *t, const int64_t *ids, size_t i, size_t n)
{
    if (i + 16 < n)
        __builtin_prefetch(&t->buckets[bucket_of(t, ids[i + 16])]);
    if (i + 8 < n) {
        const struct sp_entry *e = t->buckets[bucket_of(t, ids[i + 8])];
        if (e != NULL)
            sparse_prefetch_entry(e);
        else
            sparse_index_prefetch(t, ids[i + 8]);
    }
}

void sparse_prefetch_entry(const struct sp_entry *e)
{
    const char *p = (const char *)e;
    __builtin_prefetch(p);
    __builtin_prefetch(p + 64);
    __builtin_prefetch(p + 128);
    __builtin_prefetch(p + 192);
}

/* Installs a row's new state (rowf floats, rounded to the row dtype here)
 * into the RAM tier: a change to write at the next commit. Returns the
 * entry or NULL. */
struct sp_entry *sparse_install(psd_sparse *sp, psd_sparse_table *t, int64_t id,
                                const float *state, uint64_t updates, uint64_t last_step)
{
    if (t->dn == t->dcap) { /* room on the dirty list first: nothing half-done */
        size_t nc = t->dcap ? t->dcap * 2 : 1024;
        struct sp_entry **d = realloc(t->dlist, nc * sizeof *d);
        if (d == NULL)
            return NULL;
        t->dlist = d;
        t->dcap = nc;
    }
    struct sp_entry *e = sparse_find(t, id);
    if (e == NULL && (e = entry_add(sp, t, id)) == NULL)
        return NULL;
    if (!e->listed) {
        e->listed = true;
        t->dlist[t->dn++] = e;
    }
    e->ref = true;
    size_t clamped = sparse_row_pack(t, state, e->row);
    if (clamped > 0)
        atomic_fetch_add(&sp->clamped, clamped);
    e->updates = updates;
    e->last_step = last_step;
    if (!sparse_dirty(e)) {
        t->ndirty++;
        atomic_fetch_add(&sp->dirty, 1);
    }
    e->mod++;
    return e;
}

/* The RAM tier keeps the rows read most: a clock over the hash's buckets
 * (CLOCK, the second-chance approximation of LRU). A row read or written
 * gets its ref bit; the hand, where the last sweep stopped, clears the bit
 * of a row that has it and drops a row that does not (never a pinned
 * one), until the tier costs at most target or max_buckets were visited.
 * A row read from LMDB enters without the bit: read once and not again
 * before the hand comes round, it goes first. With a Zipf stream the hot
 * rows stay; before, the tier kept the first rows it read and dropped
 * rows in bucket order whatever their use. */
static void clock_sweep(psd_sparse *sp, psd_sparse_table *t, uint64_t target,
                        size_t max_buckets)
{
    for (size_t n = 0; n < max_buckets && sparse_ram_cost(sp) > target; n++) {
        size_t b = t->trim_from;
        for (struct sp_entry **l = &t->buckets[b]; *l != NULL;) {
            struct sp_entry *e = *l;
            if (sparse_pinned(sp, e)) {
                l = &e->next;
            } else if (e->ref) {
                e->ref = false;
                l = &e->next;
            } else {
                sparse_entry_drop(sp, t, l);
            }
        }
        t->trim_from = (b + 1) % t->nbuckets;
    }
}

/* Brings the tier down to 7/8 of its budget (room for the next calls' new
 * rows), at most two turns of the hand. */
void sparse_trim(psd_sparse *sp, psd_sparse_table *t)
{
    clock_sweep(sp, t, sparse_budget(sp) / 8 * 7, 2 * t->nbuckets);
}

/* Keeps a copy of a row read from LMDB (data: its stored bytes) in the RAM
 * tier, entering without its clock bit; past the tier's budget the clock
 * first makes room, and the row is not kept if it cannot: hot rows are
 * then read from memory at ~600 bytes each instead of a 4 KiB page each. */
void sparse_cache(psd_sparse *sp, psd_sparse_table *t, int64_t id, const uint8_t *data)
{
    uint64_t budget = sparse_budget(sp), eb = sparse_entry_bytes(t);
    if (sparse_ram_cost(sp) + eb > budget)
        clock_sweep(sp, t, budget - 8 * eb, CACHE_SWEEP_BUCKETS);
    if (sparse_ram_cost(sp) + eb > budget)
        return;
    struct sp_entry *e = entry_add(sp, t, id);
    if (e == NULL)
        return;
    memcpy(&e->updates, data, sizeof e->updates);
    memcpy(&e->last_step, data + 8, sizeof e->last_step);
    memcpy(e->row, data + SPARSE_ROW_HEAD, sparse_row_bytes(t) - SPARSE_ROW_HEAD);
}
