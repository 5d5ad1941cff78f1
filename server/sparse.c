/*
 * sparse.c - the sparse tier (sparse.h): its lifetime and its tables,
 * initial rows and admission, the pull and the push of rows, and what
 * Stats and /metrics read of it. The rows themselves are sparse_ram.c's
 * (in memory), sparse_cold.c's (read from the segments) and
 * sparse_seg.c's (the segments and the catalog in LMDB).
 */
#include "server/sparse_internal.h"

#include "common/clock.h"
#include "common/errors.h"
#include "common/half.h"
#include "common/log.h"

#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A push commits first past BACKLOG_MS of rows at the flusher's measured
 * rate (psd_sparse_needs_commit), and at least past BACKLOG_MIN_ROWS. */
#define BACKLOG_MS 40
#define BACKLOG_MIN_ROWS 8192

/* ---- the tier ------------------------------------------------------------ */

/* The tier's mutexes and condition variables, made and destroyed
 * together. */
enum { SYNC_N = 4, SYNC_C = 2 };

static void sync_objects(psd_sparse *sp, pthread_mutex_t *m[SYNC_N], pthread_cond_t *c[SYNC_C])
{
    m[0] = &sp->tables_mu;
    m[1] = &sp->apply_run_mu;
    m[2] = &sp->apply_mu;
    m[3] = &sp->seg_mu;
    c[0] = &sp->apply_cond;
    c[1] = &sp->room_cond;
}

int psd_sparse_open(const struct psd_sparse_conf *c, psd_sparse **out)
{
    psd_sparse *sp = calloc(1, sizeof *sp);
    if (sp == NULL)
        return -ENOMEM;
    sp->store = c->store;
    sp->memory_limit = c->memory_limit;
    sp->map_size = c->map_size;
    sp->max_rows = c->max_rows;
    sp->segment_size = c->segment_size;
    sp->compact_rate = c->compact_rate;
    pthread_mutex_t *mu[SYNC_N];
    pthread_cond_t *cv[SYNC_C];
    sync_objects(sp, mu, cv);
    for (int i = 0; i < SYNC_N; i++)
        pthread_mutex_init(mu[i], NULL);
    for (int i = 0; i < SYNC_C; i++)
        pthread_cond_init(cv[i], NULL);
    sp->data_dir = strdup(c->data_dir);
    int rc = sp->data_dir == NULL ? -ENOMEM : sparse_log_open(sp, c->why, c->whylen);
    if (rc != 0) {
        psd_sparse_close(sp);
        return rc;
    }
    *out = sp;
    return 0;
}

void psd_sparse_set_assist(psd_sparse *sp, struct psd_assist *a)
{
    sp->assist = a;
}

int psd_sparse_stop(psd_sparse *sp)
{
    if (sp == NULL)
        return 0;
    sparse_applier_stop(sp);
    return sparse_stop_drain(sp);
}

void psd_sparse_close(psd_sparse *sp)
{
    if (sp == NULL)
        return;
    sparse_applier_stop(sp);
    sparse_cat_ahead_end(sp); /* they read the store */
    sparse_compact_free(sp);
    psd_rowlog_destroy(sp->rowlog);
    psd_segs_close(sp->segs);
    ps_buf_free(&sp->logbuf);
    pthread_mutex_t *mu[SYNC_N];
    pthread_cond_t *cv[SYNC_C];
    sync_objects(sp, mu, cv);
    for (int i = 0; i < SYNC_N; i++)
        pthread_mutex_destroy(mu[i]);
    for (int i = 0; i < SYNC_C; i++)
        pthread_cond_destroy(cv[i]);
    free(sp->seg_live);
    free(sp->catq);
    free(sp->data_dir);
    free(sp);
}

/* --memory-limit less SPARSE_OWN_BYTES (or a fifth of it, below, when
 * that is more), and at least a quarter. Rows are read with O_DIRECT, so
 * the page cache no longer holds them, and in a small group what it needs
 * besides the budget does not grow with the limit:
 * psd's own anonymous memory (gRPC, the calls' buffers, the cold reads'
 * batch, the row log's batch, malloc's free pages), what the tier's cost
 * passes its budget by during pushes (rows pinned until applied, the
 * catalog queue's growth: up to ~12 MiB), and a working page cache
 * (psd's code and libraries, ~15 MiB resident, the catalog's leaf pages a
 * transaction rewrites, the row log's pages). Measured in bench/sparse's
 * 4x-over phases in a 147 MiB group: psd's anonymous memory besides what
 * the budget counts was 18-40 MiB; with a budget of the limit less 72 MiB
 * (75 MiB) anonymous memory reached 118 MiB, the page cache fell to 26-28
 * MiB and psd thrashed on its own code until its listener stopped
 * answering, where with the budget at 49.5 MiB the page cache never fell
 * below 47 MiB. In psd-sparse-cgroup's 96 MiB group, with a checkpoint
 * and a restore, anonymous memory peaked at 62 MiB with the tier's 24 MiB,
 * which a tier of 36 MiB had the group kill three times in four runs. 88
 * MiB keeps the 96 MiB group's tier at its 24 MiB and gives the tier what
 * a larger limit adds: 59 MiB of 147, leaving the page cache ~40 MiB. */
#define SPARSE_OWN_BYTES ((uint64_t)88 << 20)

/* What the group needs besides the budget does grow with the tier after
 * all, about as a fifth of the limit once that is larger than 440 MiB: in a
 * 606-634 MiB group (bench/sparse --rows 4000000, fp16 rows, the tier's
 * rows turned over twice), malloc's arenas held 64 MiB free beside 548 MiB
 * in use, psd's anonymous memory reached 614 MiB with a budget of the limit
 * less 88 MiB, the page cache fell to 13 MiB, and in one run of two the
 * group killed psd (its flusher could not get a page to write). Measuring
 * psd's anonymous memory and taking what the budget does not count off
 * it was tried: rows the tier drops go back to malloc, not to the kernel,
 * so the measured excess grew with each eviction and the budget fell from
 * 524 to 281 MiB in one push phase. */
#define SPARSE_OWN_SHARE 5

uint64_t sparse_budget(const psd_sparse *sp)
{
    uint64_t lim = sp->memory_limit;
    if (lim == 0)
        return (uint64_t)256 << 20;
    uint64_t own = lim / SPARSE_OWN_SHARE > SPARSE_OWN_BYTES ? lim / SPARSE_OWN_SHARE
                                                             : SPARSE_OWN_BYTES;
    return lim > lim / 4 + own ? lim - own : lim / 4;
}

/* The indexes of rows count (16 bytes a slot): they are memory of psd's
 * own that grows with the tables, as the RAM tier's rows are, and the
 * group's limit holds them all; the tier gives them room. So do the
 * catalog's queue and LMDB's dirty pages: those of the transaction open
 * now (the checkpoint's copy, apply_pages) and those the store's LMDB
 * keeps of its largest catalog transaction (dpages_kept), which it never
 * gives back to malloc; and the tables' buffers of reads ahead. */
uint64_t sparse_ram_cost(const psd_sparse *sp)
{
    uint64_t open = atomic_load(&sp->apply_pages), kept = atomic_load(&sp->dpages_kept);
    return atomic_load(&sp->ram) + atomic_load(&sp->index_bytes) +
           atomic_load(&sp->catq_bytes) + atomic_load(&sp->pf_bytes) +
           atomic_load(&sp->apply_bytes) +
           (open > kept ? open : kept) * SPARSE_DIRTY_PAGE;
}

void sparse_txn_pages(psd_sparse *sp, uint64_t pages)
{
    atomic_store(&sp->apply_pages, pages);
    uint64_t k = atomic_load(&sp->dpages_kept);
    while (pages > k && !atomic_compare_exchange_weak(&sp->dpages_kept, &k, pages))
        ;
}

/* An eighth of the budget in pages, as before they were counted after the
 * transaction, and at least 16 rows: at 256 rows, a tier of a few hundred
 * KiB could never be within its budget again. */
size_t sparse_txn_rows(const psd_sparse *sp)
{
    size_t max = (size_t)(sparse_budget(sp) / 8 / SPARSE_DIRTY_PAGE);
    return max < 16 ? 16 : max > 8192 ? 8192 : max;
}

bool psd_sparse_over_budget(psd_sparse *sp)
{
    return sparse_ram_cost(sp) > sparse_budget(sp);
}

bool psd_sparse_needs_commit(psd_sparse *sp)
{
    double cap = atomic_load(&sp->rows_per_ms) * BACKLOG_MS;
    if (cap < BACKLOG_MIN_ROWS)
        cap = BACKLOG_MIN_ROWS;
    return psd_sparse_over_budget(sp) || (double)atomic_load(&sp->dirty) > cap;
}

/* ---- tables -------------------------------------------------------------- */

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
    if (sp->row_dtype != PS__V1__DTYPE__DTYPE_UNSPECIFIED &&
        sp->row_dtype != PS__V1__DTYPE__DTYPE_FLOAT32 &&
        sp->row_dtype != PS__V1__DTYPE__DTYPE_FLOAT16 &&
        sp->row_dtype != PS__V1__DTYPE__DTYPE_BFLOAT16) {
        snprintf(why, whylen, "sparse table '%s': row_dtype %d is not FLOAT32, FLOAT16 "
                 "or BFLOAT16", sp->name, (int)sp->row_dtype);
        return PS_EDTYPE;
    }
    return psd_sparse_validate_slots(sp->name, sp->slot_dtype, sp->optimizer, why, whylen);
}

/* FLOAT16 slots are refused for ADAM: its second moment v moves by
 * (1 - beta2) * g^2, below float16's smallest subnormal (6e-8) for |g| <
 * 7.7e-3 at the default beta2, so v would read 0 and the step
 * lr * m / (sqrt(v) + epsilon) blow up by 1/epsilon. bfloat16 keeps
 * float32's range. The other kinds' slots are of the gradient's size
 * (MOMENTUM) or accumulate squares (ADAGRAD, FTRL): in float16 a slot past
 * +-65504 is clamped and counted, as a value is, which only stops its
 * growth. */
int psd_sparse_validate_slots(const char *name, int slot_dtype, const Ps__V1__Optimizer *o,
                              char *why, size_t whylen)
{
    if (slot_dtype != PS__V1__DTYPE__DTYPE_UNSPECIFIED &&
        slot_dtype != PS__V1__DTYPE__DTYPE_FLOAT32 && slot_dtype != PS__V1__DTYPE__DTYPE_FLOAT16 &&
        slot_dtype != PS__V1__DTYPE__DTYPE_BFLOAT16) {
        snprintf(why, whylen, "sparse table '%s': slot_dtype %d is not FLOAT32, FLOAT16 "
                 "or BFLOAT16", name, slot_dtype);
        return PS_EDTYPE;
    }
    if (slot_dtype == PS__V1__DTYPE__DTYPE_FLOAT16 && o != NULL &&
        o->kind == PS__V1__OPTIMIZER__KIND__ADAM) {
        snprintf(why, whylen, "sparse table '%s': slot_dtype FLOAT16 is refused for ADAM "
                 "(its second moment underflows float16 for gradients below 7.7e-3); use "
                 "BFLOAT16 or FLOAT32", name);
        return PS_EINVAL_ARG;
    }
    return 0;
}

/* The half type (half.h) of a spec's ps.v1.DType, or 0 for float32. */
static int half_type(int dtype)
{
    if (dtype == PS__V1__DTYPE__DTYPE_FLOAT16)
        return PS_HALF_F16;
    return dtype == PS__V1__DTYPE__DTYPE_BFLOAT16 ? PS_HALF_BF16 : 0;
}

/* n elements of a row or slot type, padded to 4 bytes so that what
 * follows stays aligned. */
static uint64_t value_bytes(uint64_t n, int type)
{
    return type ? (n * 2 + 3) & ~(uint64_t)3 : n * sizeof(float);
}

/* n float32 from body (any alignment), stored in type. */
static void widen(int type, const uint8_t *body, float *out, size_t n)
{
    if (type)
        ps_half_to_f32(type, (const uint16_t *)(const void *)body, out, n);
    else
        memcpy(out, body, n * sizeof(float));
}

/* n float32 into body in type, its padding to 4 bytes zeroed; returns the
 * float16 values clamped. */
static size_t narrow(int type, const float *in, uint8_t *body, size_t n)
{
    if (!type) {
        memcpy(body, in, n * sizeof(float));
        return 0;
    }
    size_t clamped = ps_half_from_f32(type, in, (uint16_t *)(void *)body, n);
    memset(body + n * 2, 0, value_bytes(n, type) - n * 2);
    return clamped;
}

uint64_t sparse_row_bytes(const psd_sparse_table *t)
{
    return t->row_bytes;
}

void sparse_row_unpack(const psd_sparse_table *t, const uint8_t *body, float *state)
{
    size_t dim = t->dim;
    widen(t->row_dtype, body, state, dim);
    widen(t->slot_dtype, body + t->vbytes, state + dim, t->rowf - dim);
}

size_t sparse_row_pack(const psd_sparse_table *t, const float *state, uint8_t *body)
{
    size_t dim = t->dim;
    return narrow(t->row_dtype, state, body, dim) +
           narrow(t->slot_dtype, state + dim, body + t->vbytes, t->rowf - dim);
}

int psd_sparse_row_type(const psd_sparse_table *t)
{
    return t->row_dtype;
}

int psd_sparse_slot_type(const psd_sparse_table *t)
{
    return t->slot_dtype;
}

uint64_t psd_sparse_stored_bytes(const psd_sparse_table *t)
{
    return sparse_row_bytes(t);
}

size_t psd_sparse_state_floats(const psd_sparse_table *t)
{
    return 2 * t->rowf + 1; /* the state, then the body packed from it */
}

int psd_sparse_convert_row(const psd_sparse_table *from, const psd_sparse_table *to,
                           const void *in, size_t in_len, void *out, float *scratch,
                           uint64_t *clamped)
{
    if (in_len != sparse_row_bytes(from) || from->rowf != to->rowf) {
        ps_log_error("sparse table '%s': a row of %zu bytes in the checkpoint, expected "
                     "%zu", from->name, in_len, (size_t)sparse_row_bytes(from));
        return PS_ECORRUPT;
    }
    const uint8_t *p = in;
    uint8_t *o = out;
    memcpy(o, p, SPARSE_ROW_HEAD);
    sparse_row_unpack(from, p + SPARSE_ROW_HEAD, scratch);
    /* out need not be aligned: the body is packed aside, then copied. */
    uint8_t *body = (uint8_t *)(void *)(scratch + from->rowf);
    *clamped += sparse_row_pack(to, scratch, body);
    memcpy(o + SPARSE_ROW_HEAD, body, sparse_row_bytes(to) - SPARSE_ROW_HEAD);
    return 0;
}

uint64_t sparse_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t splitmix64(uint64_t x)
{
    return sparse_mix64(x + 0x9e3779b97f4a7c15ULL);
}

psd_sparse_table *psd_sparse_table_new(const Ps__V1__VariableSpec *sp, const psd_opt *opt)
{
    psd_sparse_table *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    pthread_mutex_init(&t->mu, NULL);
    sparse_prefetch_init(t);
    t->name = strdup(sp->name);
    t->dim = (size_t)sp->shape[0];
    t->opt = *opt; /* the variable's, as vartable.c reads it: every kind */
    const Ps__V1__Initializer *q = sp->initializer;
    t->init = (psd_init){.kind = (enum psd_init_kind)q->kind, .value = q->value,
                         .minval = q->minval, .maxval = q->maxval, .mean = q->mean,
                         .stddev = q->stddev, .seed = q->seed};
    psd_init_defaults(&t->init);
    t->nslots = psd_opt_slot_count(&t->opt);
    t->rowf = t->dim * (size_t)(1 + t->nslots);
    t->row_dtype = half_type(sp->row_dtype);
    t->slot_dtype = half_type(sp->slot_dtype);
    t->vbytes = value_bytes(t->dim, t->row_dtype);
    t->row_bytes = SPARSE_ROW_HEAD + t->vbytes + value_bytes(t->rowf - t->dim, t->slot_dtype);
    t->admit_after = sp->admit_after;
    t->ttl = sp->ttl_steps;
    t->max_rows = sp->max_rows;
    t->insert_on_pull = sp->insert_on_pull;
    t->nbuckets = 1024;
    t->buckets = calloc(t->nbuckets, sizeof *t->buckets);
    if (t->admit_after > 1)
        t->cms = calloc(SPARSE_CMS_DEPTH, SPARSE_CMS_WIDTH);
    t->sweep_from = INT64_MIN;
    if (t->name == NULL || t->buckets == NULL || (t->admit_after > 1 && t->cms == NULL)) {
        psd_sparse_table_free(t);
        return NULL;
    }
    return t;
}

void psd_sparse_table_free(psd_sparse_table *t)
{
    if (t == NULL)
        return;
    sparse_prefetch_free(t); /* first: its reads may be in flight */
    sparse_free_entries(t);
    sparse_index_free(t);
    void *own[] = {t->dlist, t->buckets, t->cms, t->name, t};
    pthread_mutex_destroy(&t->mu);
    for (size_t i = 0; i < sizeof own / sizeof *own; i++)
        free(own[i]);
}

void psd_sparse_attach(psd_sparse *sp, psd_sparse_table *t, uint64_t clock)
{
    pthread_mutex_lock(&sp->tables_mu);
    t->sp = sp;
    atomic_store(&t->clock, clock);
    t->next = sp->tables;
    sp->tables = t;
    atomic_fetch_add(&sp->ram, sparse_table_ram(t));
    atomic_fetch_add(&sp->index_bytes, sparse_index_bytes(t));
    atomic_fetch_add(&sp->dirty, t->ndirty);
    if (t->ready)
        atomic_fetch_add(&sp->row_bytes, t->rows * t->row_bytes);
    pthread_mutex_unlock(&sp->tables_mu);
}

void psd_sparse_detach(psd_sparse *sp, psd_sparse_table *t)
{
    sparse_prefetch_end(sp, t); /* its buffer leaves sp's budget */
    pthread_mutex_lock(&sp->tables_mu);
    for (psd_sparse_table **l = &sp->tables; *l != NULL; l = &(*l)->next)
        if (*l == t) {
            *l = t->next;
            break;
        }
    t->next = NULL;
    t->sp = NULL;
    sparse_lock(t);
    atomic_fetch_sub(&sp->ram, sparse_table_ram(t));
    atomic_fetch_sub(&sp->index_bytes, sparse_index_bytes(t));
    atomic_fetch_sub(&sp->dirty, t->ndirty);
    if (t->ready)
        atomic_fetch_sub(&sp->row_bytes, t->rows * t->row_bytes);
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&sp->tables_mu);
    /* Its rows go with its variable's record: their records are dead. */
    atomic_store(&sp->seg_recount, true);
    atomic_fetch_add(&sp->tables_gone, 1);
}

size_t psd_sparse_table_dim(const psd_sparse_table *t)
{
    return t->dim;
}

/* A pusher that unlocks and locks again at once wins the mutex over a
 * waiting flusher almost every time (no handoff), which starved the commit
 * for 400 ms under three busy pushers (test_psd_sparse_kill). The flusher
 * raises flusher_waits; callers step aside until it has had its turn. */
void sparse_lock(psd_sparse_table *t)
{
    while (atomic_load_explicit(&t->flusher_waits, memory_order_acquire))
        sched_yield();
    pthread_mutex_lock(&t->mu);
}

void sparse_flusher_lock(psd_sparse_table *t)
{
    atomic_fetch_add(&t->flusher_waits, 1);
    pthread_mutex_lock(&t->mu);
    atomic_fetch_sub(&t->flusher_waits, 1);
}

/* ---- initial rows and admission ------------------------------------------ */

static void init_row(const psd_sparse_table *t, int64_t id, float *row, bool slots)
{
    psd_init in = t->init;
    in.seed = splitmix64(t->init.seed ^ splitmix64((uint64_t)id));
    int64_t shape = (int64_t)t->dim;
    psd_init_fill(&in, row, t->dim, &shape, 1);
    if (slots && t->nslots)
        psd_opt_init_slots(&t->opt, row + t->dim, t->dim);
}

/* n values of a new row as storing them would make them (rounded to type):
 * its first update starts from what a pull of it answered, and from its
 * slots as stored. */
static void round_to(int type, float *x, size_t n)
{
    uint16_t h[256];
    for (size_t i = 0; type && i < n; i += sizeof h / sizeof h[0]) {
        size_t k = n - i < sizeof h / sizeof h[0] ? n - i : sizeof h / sizeof h[0];
        ps_half_from_f32(type, x + i, h, k);
        ps_half_to_f32(type, h, x + i, k);
    }
}

static uint8_t *cms_cell(psd_sparse_table *t, int64_t id, int d)
{
    uint64_t h = sparse_mix64((uint64_t)id + 0x632be59bd9b4e019ULL * (uint64_t)(d + 1));
    return &t->cms[(size_t)d * SPARSE_CMS_WIDTH + (h & (SPARSE_CMS_WIDTH - 1))];
}

static unsigned cms_estimate(psd_sparse_table *t, int64_t id)
{
    unsigned est = 255;
    for (int d = 0; d < SPARSE_CMS_DEPTH; d++) {
        unsigned c = *cms_cell(t, id, d);
        est = c < est ? c : est;
    }
    return est;
}

/* Whether a push of id, which has no row, stores it now. */
static bool admits(psd_sparse_table *t, int64_t id)
{
    return t->admit_after <= 1 || cms_estimate(t, id) + 1 >= t->admit_after;
}

/* Counts one push of id, which was not admitted (conservative update). */
static void count_push(psd_sparse_table *t, int64_t id)
{
    unsigned est = cms_estimate(t, id);
    if (est == 255)
        return;
    for (int d = 0; d < SPARSE_CMS_DEPTH; d++) {
        uint8_t *c = cms_cell(t, id, d);
        if (*c == est)
            *c = (uint8_t)(est + 1);
    }
}

static void count_new(psd_sparse *sp, psd_sparse_table *t)
{
    t->rows++;
    atomic_fetch_add(&sp->admitted, 1);
    atomic_fetch_add(&sp->row_bytes, t->row_bytes);
}

uint64_t psd_sparse_row_bytes(psd_sparse *sp)
{
    return atomic_load(&sp->row_bytes);
}

uint64_t psd_sparse_spec_row_bytes(const Ps__V1__VariableSpec *spec, const psd_opt *opt)
{
    uint64_t dim = spec->n_shape == 1 && spec->shape[0] > 0 ? (uint64_t)spec->shape[0] : 0;
    return SPARSE_ROW_HEAD + value_bytes(dim, half_type(spec->row_dtype)) +
           value_bytes(dim * (uint64_t)psd_opt_slot_count(opt), half_type(spec->slot_dtype));
}

/* ---- pull -------------------------------------------------------------- */

/* The value of a row's body as an answer wants it: the stored bits, or
 * widened to float32 (f32 with a half table). out: dim elements of the
 * answer's dtype, any alignment. */
static void value_out(const psd_sparse_table *t, const uint8_t *body, void *out, bool f32)
{
    if (t->row_dtype && f32)
        ps_half_to_f32(t->row_dtype, (const uint16_t *)(const void *)body, out, t->dim);
    else
        memcpy(out, body, t->dim * (t->row_dtype ? 2 : sizeof(float)));
}

/* A float32 value (dim) as an answer wants it: rounded to the row dtype as
 * storing it would, unless f32. */
static void state_out(const psd_sparse_table *t, const float *value, void *out, bool f32)
{
    if (t->row_dtype && !f32)
        ps_half_from_f32(t->row_dtype, value, out, t->dim);
    else
        memcpy(out, value, t->dim * sizeof(float));
}

/* A row with no stored state: its initial value (and slots), stored now
 * with insert_on_pull. scratch: rowf floats. mu held. */
static int pull_new(psd_sparse *sp, psd_sparse_table *t, int64_t id, void *out, bool f32,
                    float *scratch, uint64_t *inserted)
{
    if (!t->insert_on_pull) {
        init_row(t, id, scratch, false);
        if (f32) /* as stored, whatever is asked */
            round_to(t->row_dtype, scratch, t->dim);
        state_out(t, scratch, out, f32);
        return 0;
    }
    init_row(t, id, scratch, true);
    struct sp_entry *e = sparse_install(sp, t, id, scratch, 0, atomic_load(&t->clock));
    if (e == NULL)
        return -ENOMEM;
    count_new(sp, t);
    (*inserted)++;
    value_out(t, e->row, out, f32);
    return 0;
}

size_t psd_sparse_value_bytes(const psd_sparse_table *t, bool f32)
{
    return t->dim * (t->row_dtype && !f32 ? 2 : sizeof(float));
}

int psd_sparse_pull(psd_sparse *sp, psd_sparse_table *t, const int64_t *ids, size_t n,
                    void *out, bool f32, uint64_t *inserted)
{
    return psd_sparse_pull_next(sp, t, ids, n, NULL, 0, out, f32, inserted);
}

int psd_sparse_pull_next(psd_sparse *sp, psd_sparse_table *t, const int64_t *ids, size_t n,
                         const int64_t *next, size_t nnext, void *out, bool f32,
                         uint64_t *inserted)
{
    size_t vb = psd_sparse_value_bytes(t, f32);
    uint8_t *o = out;
    *inserted = 0;
    float *scratch = malloc(t->rowf * sizeof(float));
    if (scratch == NULL)
        return -ENOMEM;
    struct sp_cold c = {0};
    /* The call's cold rows, cached once every row is copied out: caching
     * drops rows the clock passes over, which the loop may still need. */
    size_t *cold = malloc((n ? n : 1) * sizeof *cold), ncold = 0;
    int rc = cold == NULL ? -ENOMEM : sparse_cold_read_next(sp, t, ids, n, next, nnext, true, &c);
    if (rc == 0 && sp->cold_read != NULL)
        sp->cold_read(sp);
    sparse_lock(t);
    if (rc == 0)
        rc = sparse_ready(sp, t);
    if (rc == 0)
        rc = sparse_cold_settle(sp, t, ids, &c);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const uint8_t *data;
        int64_t id = ids[i];
        struct sp_entry *e = sparse_cold_entry(sp, t, &c, ids, i, n);
        if (e != NULL) {
            value_out(t, e->row, o + i * vb, f32);
        } else if ((data = sparse_cold_row(t, &c, i)) != NULL) {
            value_out(t, data + SPARSE_ROW_HEAD, o + i * vb, f32);
            cold[ncold++] = i;
        } else {
            rc = pull_new(sp, t, id, o + i * vb, f32, scratch, inserted);
        }
    }
    for (size_t k = 0; k < ncold; k++)
        if (sparse_find(t, ids[cold[k]]) == NULL) /* an id twice in the call */
            sparse_cache(sp, t, ids[cold[k]], sparse_cold_row(t, &c, cold[k]));
    pthread_mutex_unlock(&t->mu);
    sparse_cold_free(&c);
    free(cold);
    free(scratch);
    atomic_fetch_add(&sp->pulled, rc == 0 ? n : 0);
    return rc;
}

/* ---- push -------------------------------------------------------------- */

/* One part of a push, prepared: its distinct ids with their summed
 * gradients and their rows' current state. */
struct item {
    struct psd_sparse_grad *g;
    psd_sparse_table *t;
    void *grouped, *loaded; /* the blocks of the arrays below */
    size_t nu;           /* distinct ids */
    int64_t *uid;        /* (nu) */
    size_t *which;       /* (n): the distinct id of ids[i] */
    float *gsum;         /* (nu * dim) */
    float *state;        /* (nu * rowf): value and slots */
    uint64_t *upd;       /* (nu) updates applied so far */
    uint8_t *kind;       /* (nu) 0 not admitted, 1 has a row, 2 new */
    size_t need;         /* rows to install that have no RAM entry */
    struct sp_cold cold; /* its rows outside the RAM tier, read first */
};

static void item_free(struct item *it)
{
    free(it->grouped);
    free(it->loaded);
    sparse_cold_free(&it->cold);
}

static int cmp_idpos(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* Groups the ids and sums the gradients of each (in request order): the
 * one copy of the gradient, read from the request's bytes. */
static int group_ids(struct item *it)
{
    size_t n = it->g->n, dim = it->t->dim, m = n ? n : 1;
    int64_t *pairs = malloc(m * 2 * sizeof *pairs);
    /* uid (m), which (m), gsum (m * dim): 8-byte elements first. */
    it->grouped = malloc(m * (sizeof *it->uid + sizeof *it->which + dim * sizeof(float)));
    if (!pairs || !it->grouped) {
        free(pairs);
        return -ENOMEM;
    }
    it->uid = it->grouped;
    it->which = (size_t *)(void *)(it->uid + m);
    it->gsum = (float *)(void *)(it->which + m);
    for (size_t i = 0; i < n; i++) {
        pairs[2 * i] = it->g->ids[i];
        pairs[2 * i + 1] = (int64_t)i;
    }
    qsort(pairs, n, 2 * sizeof *pairs, cmp_idpos);
    const uint8_t *g = it->g->grad;
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
static int load_state(psd_sparse *sp, struct item *it)
{
    psd_sparse_table *t = it->t;
    size_t nu = it->nu, rowf = t->rowf, m = nu ? nu : 1;
    /* upd (m), state (m * rowf), kind (m). */
    it->loaded = malloc(m * (sizeof *it->upd + rowf * sizeof(float) + 1));
    if (it->loaded == NULL)
        return -ENOMEM;
    it->upd = it->loaded;
    it->state = (float *)(void *)(it->upd + m);
    it->kind = (uint8_t *)(it->state + m * rowf);
    int rc = sparse_ready(sp, t);
    if (rc == 0)
        rc = sparse_cold_remap(&it->cold, it->which, nu);
    if (rc == 0)
        rc = sparse_cold_settle(sp, t, it->uid, &it->cold);
    for (size_t u = 0; u < nu && rc == 0; u++) {
        const uint8_t *data = NULL;
        float *st = it->state + u * rowf;
        sparse_ahead(t, it->uid, u, nu);
        struct sp_entry *e = sparse_get(sp, t, it->uid[u]);
        if (e != NULL) {
            sparse_row_unpack(t, e->row, st);
            it->upd[u] = e->updates;
        } else if ((data = sparse_cold_row(t, &it->cold, u)) != NULL) {
            sparse_row_unpack(t, data + SPARSE_ROW_HEAD, st);
            memcpy(&it->upd[u], data, sizeof(uint64_t));
        } else {
            init_row(t, it->uid[u], st, true);
            round_to(t->row_dtype, st, t->dim);
            round_to(t->slot_dtype, st + t->dim, t->rowf - t->dim);
            it->upd[u] = 0;
        }
        bool had = e != NULL || data != NULL;
        it->kind[u] = (uint8_t)(!had ? (admits(t, it->uid[u]) ? 2 : 0) : 1);
        it->need += e == NULL && it->kind[u] != 0;
    }
    return rc;
}

/* The first row whose update would be non-finite, or -1. */
static ptrdiff_t check_updates(const struct item *it)
{
    const psd_sparse_table *t = it->t;
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
static int apply_item(psd_sparse *sp, struct item *it, uint64_t step)
{
    psd_sparse_table *t = it->t;
    size_t dim = t->dim;
    uint64_t applied = 0, skipped = 0;
    for (size_t u = 0; u < it->nu; u++) {
        float *st = it->state + u * t->rowf;
        if (it->kind[u] == 0) {
            count_push(t, it->uid[u]);
            skipped++;
            continue;
        }
        psd_opt_apply(&t->opt, st, st + dim, it->gsum + u * dim, dim, 1.0f,
                      it->upd[u] + 1);
        if (sparse_install(sp, t, it->uid[u], st, it->upd[u] + 1, step) == NULL)
            return -ENOMEM;
        if (it->kind[u] == 2)
            count_new(sp, t);
        applied++;
    }
    atomic_fetch_add(&sp->pushed, applied);
    atomic_fetch_add(&sp->not_admitted, skipped);
    uint64_t c = atomic_load(&t->clock);
    while (step > c && !atomic_compare_exchange_weak(&t->clock, &c, step))
        ;
    /* The values as stored: rounded to the row dtype, as sparse_install
     * rounded them. */
    size_t vb = psd_sparse_value_bytes(t, false);
    for (size_t k = 0; it->g->values != NULL && k < it->g->n; k++)
        state_out(t, it->state + it->which[k] * t->rowf, (uint8_t *)it->g->values + k * vb,
                  false);
    return 0;
}

static int cmp_item_table(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const struct item *)a)->t;
    uintptr_t y = (uintptr_t)((const struct item *)b)->t;
    return x < y ? -1 : x > y;
}

/* The new rows of a prepared part within the caps: the table's rows
 * within --max-rows-per-table, all the parts' new bytes within room (what
 * is left of it is passed on). Returns 0, or PS_EFULL with why. */
static int check_caps(psd_sparse *sp, const struct item *it, uint64_t *room, char *why,
                      size_t whylen)
{
    const psd_sparse_table *t = it->t;
    uint64_t fresh = 0;
    for (size_t u = 0; u < it->nu; u++)
        fresh += it->kind[u] == 2;
    if (fresh == 0)
        return 0;
    if (sp->max_rows != 0 && t->rows + fresh > sp->max_rows) {
        snprintf(why, whylen, "sparse table '%s': %llu new rows would make %llu, over "
                 "--max-rows-per-table %llu; nothing applied%s", t->name,
                 (unsigned long long)fresh, (unsigned long long)(t->rows + fresh),
                 (unsigned long long)sp->max_rows,
                 t->max_rows || t->ttl ? " (its eviction has not caught up)" : "");
        atomic_fetch_add(&sp->refused_rows, fresh);
        return PS_EFULL;
    }
    uint64_t need = fresh * t->row_bytes;
    if (need > *room) {
        snprintf(why, whylen, "sparse table '%s': %llu new rows of %llu bytes would "
                 "hold %llu bytes more, over --max-bytes (%llu bytes left); nothing "
                 "applied", t->name, (unsigned long long)fresh,
                 (unsigned long long)t->row_bytes, (unsigned long long)need,
                 (unsigned long long)*room);
        atomic_fetch_add(&sp->refused_rows, fresh);
        return PS_EFULL;
    }
    *room -= need;
    return 0;
}

/* Prepares and checks every part, then applies them all; every table's
 * mutex held. */
static int push_locked(psd_sparse *sp, struct item *items, size_t n, uint64_t step,
                       uint64_t room, size_t *bad, char *why, size_t whylen)
{
    for (size_t i = 0; i < n; i++) {
        int rc = group_ids(&items[i]);
        if (rc == 0)
            rc = load_state(sp, &items[i]);
        ptrdiff_t u = rc == 0 ? check_updates(&items[i]) : -1;
        if (u >= 0) {
            snprintf(why, whylen, "sparse table '%s': the update of row %lld would "
                     "make a value or slot non-finite; nothing applied", items[i].t->name,
                     (long long)items[i].uid[u]);
            rc = PS_EINVAL_ARG;
        }
        if (rc == 0)
            rc = check_caps(sp, &items[i], &room, why, whylen);
        /* Every entry and place on the dirty list the rows need, before
         * any is applied: the push is applied whole or not at all. */
        if (rc == 0)
            rc = sparse_reserve(items[i].t, items[i].nu, items[i].need);
        if (rc != 0) {
            *bad = i;
            return rc;
        }
    }
    for (size_t i = 0; i < n; i++) {
        int rc = apply_item(sp, &items[i], step);
        if (rc != 0) { /* out of memory mid-way: said so */
            *bad = i;
            return rc;
        }
    }
    return 0;
}

int psd_sparse_push(psd_sparse *sp, struct psd_sparse_grad *g, size_t n, uint64_t step,
                    uint64_t bytes_room, size_t *bad, char *why, size_t whylen)
{
    *bad = 0;
    uint64_t held = atomic_load(&sp->row_bytes);
    uint64_t room = bytes_room > held ? bytes_room - held : 0;
    struct item *items = calloc(n ? n : 1, sizeof *items);
    if (items == NULL)
        return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        items[i] = (struct item){.g = &g[i], .t = g[i].t};
        rc = sparse_cold_read_next(sp, g[i].t, g[i].ids, g[i].n, g[i].next, g[i].nnext,
                                   false, &items[i].cold);
        *bad = i;
    }
    if (rc == 0 && sp->cold_read != NULL)
        sp->cold_read(sp);
    if (rc != 0) {
        for (size_t i = 0; i < n; i++)
            item_free(&items[i]);
        free(items);
        return rc;
    }
    /* The tables' mutexes in address order; items sorted so, their g
     * pointers still name their parts. */
    qsort(items, n, sizeof *items, cmp_item_table);
    for (size_t i = 0; i < n; i++)
        sparse_lock(items[i].t);
    rc = push_locked(sp, items, n, step, room, bad, why, whylen);
    for (size_t i = n; i-- > 0;) {
        sparse_unreserve(items[i].t);
        pthread_mutex_unlock(&items[i].t->mu);
    }
    if (rc != 0)
        *bad = (size_t)(items[*bad].g - g);
    for (size_t i = 0; i < n; i++)
        item_free(&items[i]);
    free(items);
    return rc;
}

/* ---- what Stats, /metrics and ListVariables read --------------------------- */

void psd_sparse_stats(psd_sparse *sp, Ps__V1__StatsResponse *r)
{
    pthread_mutex_lock(&sp->tables_mu);
    for (psd_sparse_table *t = sp->tables; t != NULL; t = t->next) {
        r->sparse_tables++;
        sparse_lock(t);
        sparse_ready(sp, t);
        r->sparse_rows += t->rows;
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&sp->tables_mu);
    r->sparse_admitted = atomic_load(&sp->admitted);
    r->sparse_evicted = atomic_load(&sp->evicted);
    r->sparse_ram_bytes = atomic_load(&sp->ram);
    r->sparse_index_bytes = atomic_load(&sp->index_bytes);
    r->sparse_catalog_queued = atomic_load(&sp->catq_len);
    r->sparse_disk_bytes = psd_store_disk_bytes(sp->store);
    r->sparse_not_admitted = atomic_load(&sp->not_admitted);
    r->sparse_rows_pulled = atomic_load(&sp->pulled);
    r->sparse_rows_pushed = atomic_load(&sp->pushed);
    r->sparse_rows_unsaved = atomic_load(&sp->dirty);
    r->sparse_log_bytes = sp->rowlog ? psd_rowlog_total(sp->rowlog) : 0;
    r->sparse_rows_read_lmdb = atomic_load(&sp->read_cold);
    r->sparse_segment_reads = atomic_load(&sp->seg_reads);
    r->sparse_segment_bytes = sp->segs ? psd_segs_bytes(sp->segs) : 0;
    r->sparse_segment_live_bytes = atomic_load(&sp->live_bytes);
    r->sparse_segment_dead_bytes = sparse_dead_bytes(sp);
    r->sparse_values_clamped = atomic_load(&sp->clamped);
}

/* The tier's counters on /metrics, each with its unit in its name; a
 * counter's ends in _total (common/metrics.h). */
static const struct {
    const char *name, *help;
    size_t off; /* of an atomic_uint_fast64_t in struct psd_sparse */
} counters[] = {
#define C(n, f, h) {"psd_sparse_" n, h, offsetof(struct psd_sparse, f)}
    C("row_bytes", row_bytes, "Bytes of the sparse rows as stored (value, optimizer "
      "slots, head), counted against --max-bytes."),
    C("ram_bytes", ram, "Bytes of the sparse RAM tier."),
    C("index_bytes", index_bytes, "Bytes of the in-memory indexes of the stored sparse "
      "rows (id to record), within the RAM tier's budget."),
    C("rows_unsaved", dirty, "Sparse rows changed and not yet committed."),
    C("ram_hits_total", ram_hits, "Row lookups answered from the RAM tier."),
    C("ram_misses_total", ram_misses, "Row lookups not in the RAM tier (read from "
      "LMDB, or no row yet)."),
    C("cold_reads_total", read_cold, "Rows read from disk (not in the RAM tier)."),
    C("segment_reads_total", seg_reads, "Rows read from the segment files (O_DIRECT)."),
    C("prefetch_reads_total", pf_reads, "Rows read ahead for a pull's next_ids (also in "
      "segment_reads_total)."),
    C("prefetch_rows_total", pf_rows, "Rows read ahead that the next call took."),
    C("prefetch_stale_total", pf_stale, "Rows read ahead, taken and read again: the row "
      "changed meanwhile."),
    C("prefetch_bytes", pf_bytes, "Bytes of the buffers of the reads ahead, within the "
      "RAM tier's budget."),
    C("segment_live_bytes", live_bytes, "Bytes of the segments' records the catalog "
      "points at."),
    C("converted_rows_total", converted, "Rows moved from LMDB into the segment files."),
    C("compacted_bytes_total", compacted, "Bytes of live records compaction copied out of "
      "segments a third dead."),
    C("segments_removed_total", segs_removed, "Segment files compaction removed."),
    C("rows_pulled_total", pulled, "Rows answered by SparsePull."),
    C("rows_pushed_total", pushed, "Rows updated by SparsePush."),
    C("admitted_total", admitted, "Rows created."),
    C("not_admitted_total", not_admitted, "Pushed rows not created yet (admit_after)."),
    C("evicted_total", evicted, "Rows evicted (ttl_steps, max_rows)."),
    C("refused_rows_total", refused_rows, "New rows refused by --max-rows-per-table "
      "or --max-bytes."),
    C("commits_total", log_batches, "Batches of changed rows appended to the row log."),
    C("values_clamped_total", clamped, "Values and optimizer slots of float16 rows "
      "stored as +-65504, their update being beyond float16's range."),
#undef C
};

void psd_sparse_metrics(psd_sparse *sp, ps_metrics *m)
{
    uint64_t tables = 0, rows = 0, ram_rows = 0;
    pthread_mutex_lock(&sp->tables_mu);
    for (psd_sparse_table *t = sp->tables; t != NULL; t = t->next) {
        tables++;
        sparse_lock(t);
        sparse_ready(sp, t);
        rows += t->rows;
        ram_rows += t->nentries;
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&sp->tables_mu);
    ps_metrics_gauge(m, "psd_sparse_tables", "Sparse tables held.", (double)tables);
    ps_metrics_gauge(m, "psd_sparse_rows", "Rows of all sparse tables, stored or "
                     "waiting to be.", (double)rows);
    ps_metrics_gauge(m, "psd_sparse_ram_rows", "Rows the sparse RAM tier holds "
                     "(ListVariables' sparse_ram_rows, summed).", (double)ram_rows);
    for (size_t i = 0; i < sizeof counters / sizeof *counters; i++) {
        const char *n = counters[i].name;
        double v = (double)atomic_load(
            (atomic_uint_fast64_t *)(void *)((char *)sp + counters[i].off));
        size_t len = strlen(n);
        if (len > 6 && strcmp(n + len - 6, "_total") == 0)
            ps_metrics_counter(m, n, counters[i].help, v);
        else
            ps_metrics_gauge(m, n, counters[i].help, v);
    }
    const struct { const char *name, *help; double v; } gauges[] = {
        {"psd_sparse_catalog_queued", "Catalog entries applied (committed with the "
         "segments' end) and not yet written into LMDB's catalog.",
         (double)atomic_load(&sp->catq_len)},
        {"psd_sparse_catalog_queue_bytes", "Bytes of memory the catalog's queue holds.",
         (double)atomic_load(&sp->catq_bytes)},
        {"psd_sparse_lmdb_dirty_bytes", "Bytes of dirty pages LMDB holds: its largest "
         "catalog transaction's, which it keeps for the next ones.",
         (double)(atomic_load(&sp->dpages_kept) * SPARSE_DIRTY_PAGE)},
        {"psd_sparse_ram_budget_bytes", "The sparse RAM tier's budget, with the indexes "
         "of rows, the catalog's queue and LMDB's dirty pages (--memory-limit less 88 "
         "MiB or a fifth of it, whichever is more, at least a quarter of it).",
         (double)sparse_budget(sp)},
        {"psd_sparse_disk_bytes", "Bytes of the LMDB file in use.",
         (double)psd_store_disk_bytes(sp->store)},
        {"psd_sparse_segment_bytes", "Bytes of the segment files of sparse rows.",
         sp->segs ? (double)psd_segs_bytes(sp->segs) : 0.0},
        {"psd_sparse_segment_dead_bytes", "Bytes of the segments' records no row "
         "points at (overwritten or deleted): what compaction reclaims.",
         (double)sparse_dead_bytes(sp)},
        {"psd_sparse_log_bytes", "Bytes of the row log not yet applied to LMDB.",
         sp->rowlog ? (double)psd_rowlog_total(sp->rowlog) : 0.0},
        {"psd_sparse_commit_rows_per_second", "Rows a commit writes per second, as "
         "measured on the last commits.", atomic_load(&sp->rows_per_ms) * 1000.0},
    };
    for (size_t i = 0; i < sizeof gauges / sizeof *gauges; i++)
        ps_metrics_gauge(m, gauges[i].name, gauges[i].help, gauges[i].v);
}

void psd_sparse_table_brief(psd_sparse *sp, psd_sparse_table *t, struct psd_sparse_brief *b)
{
    sparse_lock(t);
    sparse_ready(sp, t);
    b->rows = t->rows;
    b->row_bytes = sparse_row_bytes(t);
    b->ram_bytes = sparse_table_ram(t);
    b->ram_rows = t->nentries;
    pthread_mutex_unlock(&t->mu);
}
