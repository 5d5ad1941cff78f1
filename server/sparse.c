/*
 * sparse.c - the rows of sparse tables: the RAM tier (a hash of rows), the
 * reads from LMDB, initial rows, admission, the update of a push, and the
 * flusher's side (write-behind, sweeps, restore). See sparse.h.
 */
#include "server/sparse.h"

#include "server/init.h"
#include "server/rowlog.h"
#include "server/store.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CMS_DEPTH 4
#define CMS_WIDTH 65536
#define SWEEP_EVERY_MS 1000
#define TTL_SWEEP_ROWS 65536
#define ROW_HEAD 16 /* u64 updates, u64 last step */

/* Process-wide counters (one shard per psd process). */
static atomic_uint_fast64_t g_ram, g_dirty, g_admitted, g_evicted, g_not_admitted, g_pulled,
    g_pushed, g_read_lmdb;

/* The kill -9 bound needs each commit to end soon after it starts: the
 * rows a commit may carry follow what the last commits wrote per ms
 * (rows_per_ms, an average the flusher keeps), so that one takes about
 * BACKLOG_MS; past that a push first commits (psd_sparse_backlogged). */
#define BACKLOG_MS 40
#define BACKLOG_MIN_ROWS 8192
static _Atomic double g_rows_per_ms = 0;
static int64_t g_flush_t0_us; /* flusher thread only */
static uint64_t g_flush_rows;

bool psd_sparse_backlogged(void)
{
    double rate = atomic_load(&g_rows_per_ms);
    double cap = rate * BACKLOG_MS;
    if (cap < BACKLOG_MIN_ROWS)
        cap = BACKLOG_MIN_ROWS;
    return (double)atomic_load(&g_dirty) > cap;
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

uint64_t psd_sparse_ram_bytes(void)
{
    return atomic_load(&g_ram);
}

/* What the RAM tier costs: its rows, and the LMDB pages the applier's
 * transaction holds (LMDB mallocs a write transaction's dirty pages and
 * keeps them on its free list after, mdb_dpage_free: anonymous memory
 * too). */
static atomic_uint_fast64_t g_apply_pages;

void psd_sparse_apply_pages(uint64_t pages)
{
    atomic_store(&g_apply_pages, pages);
}

uint64_t psd_sparse_ram_cost(void)
{
    return atomic_load(&g_ram) + atomic_load(&g_apply_pages) * SPARSE_DIRTY_PAGE;
}

void psd_sparse_count(uint64_t pulled, uint64_t pushed, uint64_t not_admitted)
{
    atomic_fetch_add(&g_pulled, pulled);
    atomic_fetch_add(&g_pushed, pushed);
    atomic_fetch_add(&g_not_admitted, not_admitted);
}

/* ---- specs ------------------------------------------------------------ */

int psd_sparse_validate(const Ps__V1__VariableSpec *sp, char *why, size_t whylen)
{
    if (sp->n_shape != 1 || sp->shape[0] < 1 || sp->shape[0] > PSD_SPARSE_MAX_DIM) {
        snprintf(why, whylen, "sparse table '%s': shape must be [dim] with dim in "
                 "[1, %d], got %zu dimension(s)%s%lld", sp->name, PSD_SPARSE_MAX_DIM,
                 sp->n_shape, sp->n_shape ? ", first " : "",
                 sp->n_shape ? (long long)sp->shape[0] : 0LL);
        return PS_ESHAPE;
    }
    if (sp->initializer->kind == PS__V1__INITIALIZER__KIND__GLOROT_UNIFORM) {
        snprintf(why, whylen, "sparse table '%s': GLOROT_UNIFORM has no fans for "
                 "a table of rows; use UNIFORM or NORMAL", sp->name);
        return PS_EINVAL_ARG;
    }
    if (sp->consistency != PS__V1__CONSISTENCY__ASYNC) {
        snprintf(why, whylen, "sparse table '%s': only ASYNC consistency is served "
                 "for sparse tables", sp->name);
        return PS_EINVAL_ARG;
    }
    return 0;
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t splitmix64(uint64_t x)
{
    return mix64(x + 0x9e3779b97f4a7c15ULL);
}

struct psd_sparse *psd_sparse_new(const Ps__V1__VariableSpec *sp, const psd_opt *opt)
{
    struct psd_sparse *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    pthread_mutex_init(&t->mu, NULL);
    t->dim = (size_t)sp->shape[0];
    t->opt = *opt; /* the variable's, as vartable.c reads it: every kind */
    const Ps__V1__Initializer *q = sp->initializer;
    t->init = (psd_init){.kind = (enum psd_init_kind)q->kind, .value = q->value,
                         .minval = q->minval, .maxval = q->maxval, .mean = q->mean,
                         .stddev = q->stddev, .seed = q->seed};
    psd_init_defaults(&t->init);
    t->nslots = psd_opt_slot_count(&t->opt);
    t->rowf = t->dim * (size_t)(1 + t->nslots);
    t->admit_after = sp->admit_after;
    t->ttl = sp->ttl_steps;
    t->max_rows = sp->max_rows;
    t->insert_on_pull = sp->insert_on_pull;
    t->nbuckets = 1024;
    t->buckets = calloc(t->nbuckets, sizeof *t->buckets);
    if (t->admit_after > 1)
        t->cms = calloc(CMS_DEPTH, CMS_WIDTH);
    t->sweep_from = INT64_MIN;
    if (t->buckets == NULL || (t->admit_after > 1 && t->cms == NULL)) {
        psd_sparse_free(t);
        return NULL;
    }
    return t;
}

static size_t entry_bytes(const struct psd_sparse *t)
{
    return sizeof(struct sp_entry) + t->rowf * sizeof(float);
}

void psd_sparse_free(struct psd_sparse *t)
{
    if (t == NULL)
        return;
    for (size_t b = 0; b < t->nbuckets && t->buckets; b++)
        for (struct sp_entry *e = t->buckets[b], *n; e != NULL; e = n) {
            n = e->next;
            free(e);
        }
    atomic_fetch_sub(&g_ram, t->nentries * entry_bytes(t));
    atomic_fetch_sub(&g_dirty, t->ndirty);
    free(t->dlist);
    free(t->bloom);
    free(t->buckets);
    free(t->cms);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* ---- the table's mutex ------------------------------------------------ */

/* A pusher that unlocks and locks again at once wins the mutex over a
 * waiting flusher almost every time (no handoff), which starved the commit
 * for 400 ms under three busy pushers (test_psd_sparse_kill). The flusher
 * raises flusher_waits; callers step aside until it has had its turn. */
void sparse_lock(struct psd_sparse *t)
{
    while (atomic_load_explicit(&t->flusher_waits, memory_order_acquire))
        sched_yield();
    pthread_mutex_lock(&t->mu);
}

static void flusher_lock(struct psd_sparse *t)
{
    atomic_fetch_add(&t->flusher_waits, 1);
    pthread_mutex_lock(&t->mu);
    atomic_fetch_sub(&t->flusher_waits, 1);
}

/* ---- the RAM tier ----------------------------------------------------- */

static size_t bucket_of(const struct psd_sparse *t, int64_t id)
{
    return (size_t)(mix64((uint64_t)id) & (t->nbuckets - 1));
}

struct sp_entry *sparse_find(struct psd_sparse *t, int64_t id)
{
    for (struct sp_entry *e = t->buckets[bucket_of(t, id)]; e != NULL; e = e->next)
        if (e->id == id)
            return e;
    return NULL;
}

static void grow(struct psd_sparse *t)
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
}

/* A new entry for id (not in the hash), its row uninitialized. */
static struct sp_entry *entry_add(struct psd_sparse *t, int64_t id)
{
    if (t->nentries >= t->nbuckets)
        grow(t);
    struct sp_entry *e = malloc(entry_bytes(t));
    if (e == NULL)
        return NULL;
    memset(e, 0, sizeof *e);
    e->id = id;
    size_t k = bucket_of(t, id);
    e->next = t->buckets[k];
    t->buckets[k] = e;
    t->nentries++;
    atomic_fetch_add(&g_ram, entry_bytes(t));
    return e;
}

static void entry_drop(struct psd_sparse *t, struct sp_entry **link)
{
    struct sp_entry *e = *link;
    *link = e->next;
    free(e);
    t->nentries--;
    atomic_fetch_sub(&g_ram, entry_bytes(t));
}

static bool entry_dirty(const struct sp_entry *e)
{
    return e->mod != e->saved;
}

static void clock_sweep(psd_shard *s, struct psd_sparse *t, uint64_t target,
                        size_t max_buckets);
#define CACHE_SWEEP_BUCKETS 64

/* ---- initial rows and admission ---------------------------------------- */

void sparse_init_row(const struct psd_sparse *t, int64_t id, float *row, bool slots)
{
    psd_init in = t->init;
    in.seed = splitmix64(t->init.seed ^ splitmix64((uint64_t)id));
    int64_t shape = (int64_t)t->dim;
    psd_init_fill(&in, row, t->dim, &shape, 1);
    if (slots && t->nslots)
        psd_opt_init_slots(&t->opt, row + t->dim, t->dim);
}

static uint8_t *cms_cell(struct psd_sparse *t, int64_t id, int d)
{
    uint64_t h = mix64((uint64_t)id + 0x632be59bd9b4e019ULL * (uint64_t)(d + 1));
    return &t->cms[(size_t)d * CMS_WIDTH + (h & (CMS_WIDTH - 1))];
}

/* Whether a push of id, which has no row, stores it now. */
bool sparse_admits(struct psd_sparse *t, int64_t id)
{
    if (t->admit_after <= 1)
        return true;
    unsigned est = 255;
    for (int d = 0; d < CMS_DEPTH; d++) {
        unsigned c = *cms_cell(t, id, d);
        est = c < est ? c : est;
    }
    return est + 1 >= t->admit_after;
}

/* Counts one push of id, which was not admitted (conservative update). */
void sparse_count_push(struct psd_sparse *t, int64_t id)
{
    unsigned est = 255;
    for (int d = 0; d < CMS_DEPTH; d++) {
        unsigned c = *cms_cell(t, id, d);
        est = c < est ? c : est;
    }
    if (est == 255)
        return;
    for (int d = 0; d < CMS_DEPTH; d++) {
        uint8_t *c = cms_cell(t, id, d);
        if (*c == est)
            *c = (uint8_t)(est + 1);
    }
}

/* ---- the store side ---------------------------------------------------- */

/* Learns the table's var_id and its row count, once (the first call after
 * it was created, loaded or restored). With t->mu held. */
/* ---- the filter of ids with a row ------------------------------------- */

#define BLOOM_K 4
#define BLOOM_MIN_BITS ((uint64_t)1 << 24)  /* 2 MiB */
#define BLOOM_MAX_BITS ((uint64_t)1 << 29)  /* 64 MiB */

/* The first of an id's BLOOM_K bit positions (*d apart: double hashing). */
static uint64_t bloom_hash(int64_t id, uint64_t *d)
{
    uint64_t h = mix64((uint64_t)id ^ 0x5851f42d4c957f2dULL);
    *d = (h >> 32) | 1;
    return h;
}

static void bloom_add(struct psd_sparse *t, int64_t id)
{
    if (t->bloom == NULL)
        return;
    uint64_t d, h = bloom_hash(id, &d);
    for (int i = 0; i < BLOOM_K; i++, h += d)
        t->bloom[(h & t->bloom_mask) >> 6] |= (uint64_t)1 << (h & 63);
}

/* False only when id certainly has no row. */
bool sparse_maybe_stored(const struct psd_sparse *t, int64_t id)
{
    if (t->bloom == NULL || t->rows > t->bloom_cap)
        return true;
    uint64_t d, h = bloom_hash(id, &d);
    for (int i = 0; i < BLOOM_K; i++, h += d)
        if (!(t->bloom[(h & t->bloom_mask) >> 6] & ((uint64_t)1 << (h & 63))))
            return false;
    return true;
}

/* A walk over ids runs this at each i: the bucket of the id 16 ahead and
 * the entry (and the first lines of its row) of the id 8 ahead are fetched
 * into the cache while this one is looked up, and for an id not in the
 * tier its filter words: a table of a million rows is ~600 MB of entries,
 * and each lookup was two or three cache misses in a row (sparse_find was
 * a third of psd's time in bench/sparse's pull). */
void sparse_ahead(const struct psd_sparse *t, const int64_t *ids, size_t i, size_t n)
{
    if (i + 16 < n)
        __builtin_prefetch(&t->buckets[bucket_of(t, ids[i + 16])]);
    if (i + 8 < n) {
        const struct sp_entry *e = t->buckets[bucket_of(t, ids[i + 8])];
        if (e != NULL) {
            const char *p = (const char *)e;
            __builtin_prefetch(p);
            __builtin_prefetch(p + 64);
            __builtin_prefetch(p + 128);
            __builtin_prefetch(p + 192);
        } else if (t->bloom != NULL) {
            uint64_t d, h = bloom_hash(ids[i + 8], &d);
            for (int k = 0; k < BLOOM_K; k++, h += d)
                __builtin_prefetch(&t->bloom[(h & t->bloom_mask) >> 6]);
        }
    }
}

/* Sized for 4x the table's rows at 16 bits a row (a false positive about
 * 1 in 400 until then), between 2 and 64 MiB; past bloom_cap rows the
 * filter answers "maybe" for every id. */
static void bloom_alloc(struct psd_sparse *t, uint64_t rows)
{
    uint64_t bits = BLOOM_MIN_BITS;
    while (bits < BLOOM_MAX_BITS && bits < rows * 64)
        bits <<= 1;
    t->bloom = calloc(bits / 64, sizeof *t->bloom);
    t->bloom_mask = bits - 1;
    t->bloom_cap = bits / 16;
}

static void bloom_each(void *ctx, int64_t id)
{
    bloom_add(ctx, id);
}

int sparse_ready(psd_shard *s, struct psd_sparse *t, const char *name)
{
    if (t->ready)
        return 0;
    int rc = psd_store_var_id(s->store, name, &t->var_id);
    if (rc == 0)
        rc = psd_store_rows_count(s->store, t->var_id, &t->rows);
    if (rc == 0 && t->bloom == NULL) {
        bloom_alloc(t, t->rows);
        if (t->bloom != NULL && t->rows > 0)
            rc = psd_store_rows_ids(s->store, t->var_id, &t->rows, bloom_each, t);
    }
    if (rc != 0) {
        ps_log_err(rc, "sparse table '%s': cannot find its rows in the store", name);
        return rc;
    }
    t->ready = true;
    return 0;
}

/* The state of id's row: 1 with *e its RAM entry; 2 with its stored bytes
 * at *data (value at data + ROW_HEAD); 0 when it has none. rt is begun on
 * first need. Returns a negative error too. */
int sparse_lookup(psd_shard *s, struct psd_sparse *t, struct psd_store_rtxn **rt,
                  int64_t id, struct sp_entry **e, const uint8_t **data)
{
    *e = sparse_find(t, id);
    if (*e != NULL) {
        if (!(*e)->ref)
            (*e)->ref = true; /* no store when set: the line stays clean */
        return 1;
    }
    if (!sparse_maybe_stored(t, id))
        return 0; /* never stored: no LMDB lookup */
    if (*rt == NULL) {
        int rc = psd_store_rbegin(s->store, rt);
        if (rc != 0)
            return rc;
    }
    const void *d;
    size_t len;
    int rc = psd_store_row_get(*rt, t->var_id, id, &d, &len);
    if (rc == PS_ENOTFOUND)
        return 0;
    if (rc != 0)
        return rc;
    if (len != ROW_HEAD + t->rowf * sizeof(float)) {
        ps_log_error("sparse table: row %lld has %zu bytes, expected %zu",
                     (long long)id, len, ROW_HEAD + t->rowf * sizeof(float));
        return PS_ECORRUPT;
    }
    *data = d;
    atomic_fetch_add_explicit(&g_read_lmdb, 1, memory_order_relaxed);
    return 2;
}

/* Installs a row's new state (row: rowf floats) into the RAM tier: a
 * change to write at the next commit. Returns the entry or NULL. */
struct sp_entry *sparse_install(struct psd_sparse *t, int64_t id, const float *row,
                                uint64_t updates, uint64_t last_step)
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
    if (e == NULL && (e = entry_add(t, id)) == NULL)
        return NULL;
    if (!e->listed) {
        e->listed = true;
        t->dlist[t->dn++] = e;
    }
    bloom_add(t, id);
    e->ref = true;
    memcpy(e->row, row, t->rowf * sizeof(float));
    e->updates = updates;
    e->last_step = last_step;
    if (!entry_dirty(e)) {
        t->ndirty++;
        atomic_fetch_add(&g_dirty, 1);
    }
    e->mod++;
    return e;
}

void sparse_cache(psd_shard *s, struct psd_sparse *t, int64_t id, const uint8_t *data)
{
    uint64_t budget = psd_sparse_budget(s);
    if (psd_sparse_ram_cost() + entry_bytes(t) > budget)
        clock_sweep(s, t, budget - 8 * entry_bytes(t), CACHE_SWEEP_BUCKETS);
    if (psd_sparse_ram_cost() + entry_bytes(t) > budget)
        return;
    struct sp_entry *e = entry_add(t, id);
    if (e == NULL)
        return;
    memcpy(&e->updates, data, sizeof e->updates);
    memcpy(&e->last_step, data + 8, sizeof e->last_step);
    memcpy(e->row, data + SPARSE_ROW_HEAD, t->rowf * sizeof(float));
}

void sparse_count_new(struct psd_sparse *t)
{
    t->rows++;
    atomic_fetch_add(&g_admitted, 1);
}

static int entry_by_id(const void *a, const void *b)
{
    int64_t x = (*(struct sp_entry *const *)a)->id, y = (*(struct sp_entry *const *)b)->id;
    return x < y ? -1 : x > y;
}

bool sparse_pinned(psd_shard *s, const struct sp_entry *e)
{
    return entry_dirty(e) || e->listed || e->logged > atomic_load(&s->log_applied);
}

/* s->logbuf, the batch being built, is kept from one commit to the next
 * so that a commit every 20 ms costs no allocation; let go after a burst
 * made it big. */
#define LOGBUF_KEEP ((size_t)16 << 20)

/* Copies the changed rows of t into the batch, under t->mu all at once
 * (each marked as being saved at its current change, and as held by batch
 * seq), so that a batch holds the table as of one moment: a push is in it
 * whole or not at all. The buffer grows before the copy, under the mutex
 * only the copy runs. */
static int flush_table(struct psd_sparse *t, uint64_t seq, ps_buf *b, uint32_t *nrecs)
{
    size_t recb = ROW_HEAD + t->rowf * sizeof(float);
    flusher_lock(t);
    size_t n0 = t->ready ? t->dn : 0;
    if (n0 == 0) {
        pthread_mutex_unlock(&t->mu);
        return 0;
    }
    if (ps_buf_reserve(b, b->len + n0 * (PSD_ROWLOG_REC_HEAD + recb)) != 0) {
        pthread_mutex_unlock(&t->mu);
        return -ENOMEM;
    }
    /* In id order, the order of the keys: the applier's sort has less to
     * do. */
    qsort(t->dlist, t->dn, sizeof *t->dlist, entry_by_id);
    uint32_t rl = (uint32_t)recb;
    for (size_t j = 0; j < n0; j++) {
        struct sp_entry *e = t->dlist[j];
        if (!entry_dirty(e))
            continue;
        uint8_t *r = b->data + b->len;
        memcpy(r, &t->var_id, 4);
        memcpy(r + 4, &rl, 4);
        memcpy(r + 8, &e->id, 8);
        r += PSD_ROWLOG_REC_HEAD;
        memcpy(r, &e->updates, 8);
        memcpy(r + 8, &e->last_step, 8);
        memcpy(r + ROW_HEAD, e->row, t->rowf * sizeof(float));
        b->len += PSD_ROWLOG_REC_HEAD + recb;
        (*nrecs)++;
        e->saving = e->mod;
        e->logged = seq;
    }
    pthread_mutex_unlock(&t->mu);
    return 0;
}

int psd_sparse_flush(psd_shard *s, uint64_t seq, bool *wrote)
{
    int rc = 0;
    *wrote = false;
    g_flush_t0_us = now_us();
    g_flush_rows = atomic_load(&g_dirty);
    ps_buf *b = &s->logbuf;
    uint32_t nrecs = 0;
    b->len = 0;
    for (size_t i = 0; i < s->nvars && rc == 0; i++)
        if (s->vars[i]->sparse != NULL)
            rc = flush_table(s->vars[i]->sparse, seq, b, &nrecs);
    if (rc == 0 && nrecs > 0) {
        rc = psd_rowlog_append(s->rowlog, seq, b->data, b->len, nrecs);
        *wrote = rc == 0;
    }
    if (b->cap > LOGBUF_KEEP)
        ps_buf_free(b);
    return rc;
}

/* The RAM tier keeps the rows read most: a clock over the hash's buckets
 * (CLOCK, the second-chance approximation of LRU). A row read or written
 * gets its ref bit; the hand, where the last sweep stopped, clears the bit
 * of a row that has it and drops a row that does not (never a pinned
 * one), until the tier costs at most target or max_buckets were visited.
 * A row read from LMDB enters without the bit: read once and not again
 * before the hand comes round, it goes first. With a Zipf stream the hot
 * rows stay; before, the tier kept the first rows it read and dropped
 * rows in bucket order whatever their use. mu held. */
static void clock_sweep(psd_shard *s, struct psd_sparse *t, uint64_t target,
                        size_t max_buckets)
{
    for (size_t n = 0; n < max_buckets && psd_sparse_ram_cost() > target; n++) {
        size_t b = t->trim_from;
        for (struct sp_entry **l = &t->buckets[b]; *l != NULL;) {
            struct sp_entry *e = *l;
            if (sparse_pinned(s, e)) {
                l = &e->next;
            } else if (e->ref) {
                e->ref = false;
                l = &e->next;
            } else {
                entry_drop(t, l);
            }
        }
        t->trim_from = (b + 1) % t->nbuckets;
    }
}

/* Brings the tier down to 7/8 of its budget (room for the next calls' new
 * rows), at most two turns of the hand. mu held. */
static void trim(psd_shard *s, struct psd_sparse *t)
{
    clock_sweep(s, t, psd_sparse_budget(s) / 8 * 7, 2 * t->nbuckets);
}

void psd_sparse_committed(psd_shard *s, bool ok)
{
    int64_t took = now_us() - g_flush_t0_us;
    if (ok && g_flush_rows >= 1024 && took > 0) {
        double r = (double)g_flush_rows * 1000.0 / (double)took, old = atomic_load(&g_rows_per_ms);
        atomic_store(&g_rows_per_ms, old > 0 ? 0.7 * old + 0.3 * r : r);
    }
    for (size_t i = 0; i < s->nvars; i++) {
        struct psd_sparse *t = s->vars[i]->sparse;
        if (t == NULL)
            continue;
        flusher_lock(t);
        size_t keep = 0;
        for (size_t k = 0; k < t->dn; k++) {
            struct sp_entry *e = t->dlist[k];
            bool was = entry_dirty(e);
            if (ok)
                e->saved = e->saving;
            e->saving = e->saved;
            if (was && !entry_dirty(e)) {
                t->ndirty--;
                atomic_fetch_sub(&g_dirty, 1);
            }
            if (entry_dirty(e))
                t->dlist[keep++] = e; /* changed again, or the commit failed */
            else
                e->listed = false;
        }
        t->dn = keep;
        trim(s, t);
        pthread_mutex_unlock(&t->mu);
    }
}

void psd_sparse_applied(psd_shard *s)
{
    pthread_rwlock_rdlock(&s->table_lock);
    for (size_t i = 0; i < s->nvars; i++) {
        struct psd_sparse *t = s->vars[i]->sparse;
        if (t == NULL)
            continue;
        flusher_lock(t);
        trim(s, t);
        t->sweep_clock = UINT64_MAX;
        pthread_mutex_unlock(&t->mu);
    }
    pthread_rwlock_unlock(&s->table_lock);
}

uint64_t psd_sparse_budget(psd_shard *s)
{
    uint64_t lim = s->o.memory_limit;
    return lim ? lim / 4 : (uint64_t)256 << 20;
}

/* ---- sweeps ------------------------------------------------------------ */

struct sweep {
    psd_shard *s;
    struct psd_sparse *t;
    uint64_t clock;
    /* max_rows: pass 1 collects (last step, id); pass 2 deletes below cut */
    uint64_t *keys;
    size_t n, cap;
    uint64_t cut_step;
    int64_t cut_id;
    int mode; /* 0 ttl, 1 collect, 2 cut */
    uint64_t deleted;
};

static int sweep_visit(void *ctx, int64_t id, const void *data, size_t len)
{
    struct sweep *w = ctx;
    struct psd_sparse *t = w->t;
    if (len < ROW_HEAD)
        return 0;
    uint64_t last;
    memcpy(&last, (const uint8_t *)data + 8, sizeof last);
    struct sp_entry **l = &t->buckets[bucket_of(t, id)];
    while (*l != NULL && (*l)->id != id)
        l = &(*l)->next;
    if (*l != NULL) {
        if (sparse_pinned(w->s, *l))
            return 0; /* changed since the commit or not in LMDB yet: kept */
        last = (*l)->last_step;
    }
    bool del;
    if (w->mode == 1) {
        if (w->n == w->cap) {
            size_t nc = w->cap ? w->cap * 2 : 4096;
            uint64_t *k = realloc(w->keys, nc * 2 * sizeof *k);
            if (k == NULL)
                return -ENOMEM;
            w->keys = k;
            w->cap = nc;
        }
        w->keys[2 * w->n] = last;
        w->keys[2 * w->n + 1] = (uint64_t)id;
        w->n++;
        return 0;
    } else if (w->mode == 2) {
        del = last < w->cut_step || (last == w->cut_step && id < w->cut_id);
    } else {
        del = w->clock > last && w->clock - last > t->ttl;
    }
    if (del) {
        if (*l != NULL)
            entry_drop(t, l);
        w->deleted++;
    }
    return del ? 1 : 0;
}

static int cmp_pair(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    int64_t i = (int64_t)x[1], j = (int64_t)y[1];
    return i < j ? -1 : i > j;
}

/* One sweep of table t (mu held) in a transaction of its own. */
static int sweep_table(psd_shard *s, struct psd_sparse *t, uint64_t clock)
{
    psd_store_txn *txn;
    int rc = psd_store_begin(s->store, &txn);
    if (rc != 0)
        return rc;
    struct sweep w = {.s = s, .t = t, .clock = clock};
    int done = 0;
    if (t->ttl > 0) {
        rc = psd_store_rows_walk(txn, t->var_id, &t->sweep_from, TTL_SWEEP_ROWS,
                                 sweep_visit, &w, &done);
        if (done)
            t->sweep_from = INT64_MIN;
    }
    if (rc == 0 && t->max_rows > 0 && t->rows - w.deleted > t->max_rows) {
        int64_t from = INT64_MIN;
        w.mode = 1;
        rc = psd_store_rows_walk(txn, t->var_id, &from, SIZE_MAX, sweep_visit, &w, &done);
        if (rc == 0 && w.n > t->max_rows) {
            qsort(w.keys, w.n, 2 * sizeof *w.keys, cmp_pair);
            size_t k = w.n - t->max_rows; /* the first k pairs go */
            w.cut_step = w.keys[2 * k];
            w.cut_id = (int64_t)w.keys[2 * k + 1];
            w.mode = 2;
            from = INT64_MIN;
            rc = psd_store_rows_walk(txn, t->var_id, &from, SIZE_MAX, sweep_visit, &w,
                                     &done);
        }
        free(w.keys);
    }
    if (rc == 0 && w.deleted > 0)
        rc = psd_store_commit(txn);
    else
        psd_store_abort(txn);
    if (rc == 0) {
        t->rows -= w.deleted;
        atomic_fetch_add(&g_evicted, w.deleted);
    }
    return rc;
}

void psd_sparse_maintain(psd_shard *s)
{
    int64_t now = ps_now_ms();
    pthread_rwlock_rdlock(&s->table_lock);
    for (size_t i = 0; i < s->nvars; i++) {
        psd_var *v = s->vars[i];
        struct psd_sparse *t = v->sparse;
        if (t == NULL || (t->ttl == 0 && t->max_rows == 0))
            continue;
        pthread_rwlock_rdlock(&v->lock);
        uint64_t clock = v->step;
        pthread_rwlock_unlock(&v->lock);
        flusher_lock(t);
        bool due = t->ready && now - t->last_sweep_ms >= SWEEP_EVERY_MS &&
                   (t->sweep_from != INT64_MIN || t->sweep_clock != clock ||
                    (t->max_rows && t->rows > t->max_rows));
        if (due && s->rowlog != NULL && psd_rowlog_total(s->rowlog) > 0) {
            /* Rows still in the log are not in LMDB, where the sweep looks:
             * apply now (psd_sparse_applied makes the sweep due again). */
            atomic_store(&s->apply_asap, true);
            pthread_cond_signal(&s->apply_cond);
        }
        if (due) {
            t->last_sweep_ms = now;
            t->sweep_clock = clock;
            int rc = sweep_table(s, t, clock);
            if (rc != 0)
                ps_log_err(rc, "sparse table '%s': eviction sweep failed", v->name);
        }
        pthread_mutex_unlock(&t->mu);
    }
    pthread_rwlock_unlock(&s->table_lock);
}

void psd_sparse_stats(psd_shard *s, Ps__V1__StatsResponse *r)
{
    for (size_t i = 0; i < s->nvars; i++) {
        struct psd_sparse *t = s->vars[i]->sparse;
        if (t == NULL)
            continue;
        r->sparse_tables++;
        sparse_lock(t);
        sparse_ready(s, t, s->vars[i]->name);
        r->sparse_rows += t->rows;
        pthread_mutex_unlock(&t->mu);
    }
    r->sparse_admitted = atomic_load(&g_admitted);
    r->sparse_evicted = atomic_load(&g_evicted);
    r->sparse_ram_bytes = atomic_load(&g_ram);
    r->sparse_disk_bytes = psd_store_disk_bytes(s->store);
    r->sparse_not_admitted = atomic_load(&g_not_admitted);
    r->sparse_rows_pulled = atomic_load(&g_pulled);
    r->sparse_rows_pushed = atomic_load(&g_pushed);
    r->sparse_rows_unsaved = atomic_load(&g_dirty);
    r->sparse_log_bytes = s->rowlog ? psd_rowlog_total(s->rowlog) : 0;
    r->sparse_rows_read_lmdb = atomic_load(&g_read_lmdb);
}
