/*
 * store.c - variable records in LMDB. The key layout is described in
 * store.h; this is the only file in the project that includes lmdb.h.
 */
#include "server/store.h"

#include "common/errors.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <lmdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif

/* The floats and the integers in values are written in host order; see the
 * byte-order note in store.h. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "psd's store format is little-endian only");
_Static_assert(sizeof(float) == 4, "float must be IEEE-754 binary32");

/* 64 GiB of address space: LMDB maps it sparse and the file grows only as
 * pages are written, so a big default costs nothing and leaves room. */
#define DEFAULT_MAP_SIZE (sizeof(size_t) >= 8 ? (uint64_t)64 << 30 : (uint64_t)1 << 30)
/* Except under valgrind, whose memcheck (with --track-origins) spends about
 * two seconds per GiB of a new mapping, and cannot map 64 GiB at all. */
#define VALGRIND_MAP_SIZE ((uint64_t)1 << 30)
#define MIN_FALLBACK_MAP ((uint64_t)256 << 20)
#define MAX_DBS 8
#define MAX_NAME 255

#define STORE_MAGIC 0x53445350u /* "PSDS" as little-endian bytes */
#define STORE_FORMAT 1u
#define STORE_BOM 0x01020304u
#define VAR_MAGIC 0x52565350u   /* "PSVR" */
#define VAR_FORMAT 1u

#define KEY_FORMAT "format"
#define KEY_NEXT_ID "next_var_id"

struct store_format {
    uint32_t magic;
    uint32_t format;
    uint32_t bom;
};

/* The fixed head of a "vars" value; the spec blob follows it. */
struct var_hdr {
    uint32_t magic;
    uint16_t format;
    uint16_t hdr_size;
    uint32_t var_id;
    uint32_t nslots;
    uint64_t version;
    uint64_t step;
    uint64_t n;
    uint64_t spec_len;
};
_Static_assert(sizeof(struct var_hdr) == 48, "var_hdr must have no padding");

#define DENSE_KEY_LEN 5 /* u32 var_id BE + kind */

#include "server/store_internal.h" /* struct psd_store, psd_store_txn */

static bool is_space_error(int mrc)
{
    return mrc == MDB_MAP_FULL || mrc == MDB_TXN_FULL || mrc == ENOSPC ||
           mrc == EDQUOT || mrc == EFBIG;
}

/* An LMDB return code as a project code. System errors pass through as
 * -errno when errno_ok, and become PS_ESTORE otherwise. */
static int map_rc(int mrc, bool errno_ok)
{
    if (mrc == 0)
        return 0;
    if (is_space_error(mrc))
        return PS_EFULL;
    switch (mrc) {
    case MDB_NOTFOUND:
        return PS_ENOTFOUND;
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
        return PS_ECORRUPT;
    case ENOMEM:
        return -ENOMEM;
    default:
        if (errno_ok && mrc > 0)
            return -mrc;
        return PS_ESTORE;
    }
}

/* Begins a transaction. Another process may have grown the map since we
 * opened (MDB_MAP_RESIZED): adopt its size and try once more. */
static int txn_begin(psd_store *s, unsigned flags, MDB_txn **out)
{
    pthread_rwlock_rdlock(&s->gate);
    int mrc = mdb_txn_begin(s->env, NULL, flags, out);
    if (mrc == MDB_MAP_RESIZED) {
        /* Adopting the other process's size remaps: not with our gate held
         * for reading. Take it for writing, adopt, and begin again. */
        pthread_rwlock_unlock(&s->gate);
        pthread_rwlock_wrlock(&s->gate);
        mrc = mdb_env_set_mapsize(s->env, 0);
        pthread_rwlock_unlock(&s->gate);
        pthread_rwlock_rdlock(&s->gate);
        if (mrc == 0)
            mrc = mdb_txn_begin(s->env, NULL, flags, out);
    }
    if (mrc != 0)
        pthread_rwlock_unlock(&s->gate);
    return mrc;
}

static void txn_end(psd_store *s, MDB_txn *txn)
{
    mdb_txn_abort(txn);
    pthread_rwlock_unlock(&s->gate);
}

static int txn_commit(psd_store *s, MDB_txn *txn)
{
    int mrc = mdb_txn_commit(txn);
    if (mrc == MDB_MAP_FULL)
        __atomic_store_n(&s->map_full, 1, __ATOMIC_RELAXED);
    pthread_rwlock_unlock(&s->gate);
    return mrc;
}

static int name_key(const char *name, MDB_val *key)
{
    if (!name)
        return PS_EINVAL_ARG;
    size_t len = strnlen(name, MAX_NAME + 1);
    if (len == 0 || len > MAX_NAME)
        return PS_EINVAL_ARG;
    key->mv_size = len;
    key->mv_data = (void *)name;
    return 0;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void dense_key(uint8_t buf[DENSE_KEY_LEN], uint32_t var_id, unsigned kind)
{
    put_be32(buf, var_id);
    buf[4] = (uint8_t)kind;
}

/* Checks the "meta"/"format" record, or writes it into a new store. */
static int check_format(psd_store *s, MDB_txn *txn, bool rdonly)
{
    MDB_val k = {sizeof KEY_FORMAT - 1, KEY_FORMAT}, v;
    int mrc = mdb_get(txn, s->meta, &k, &v);
    if (mrc == MDB_NOTFOUND && !rdonly) {
        struct store_format f = {STORE_MAGIC, STORE_FORMAT, STORE_BOM};
        v.mv_size = sizeof f;
        v.mv_data = &f;
        mrc = mdb_put(txn, s->meta, &k, &v, MDB_NOOVERWRITE);
        if (mrc != 0) {
            ps_log_error("store %s: writing the format record: %s", s->dir, mdb_strerror(mrc));
            return map_rc(mrc, true);
        }
        return 0;
    }
    if (mrc == MDB_NOTFOUND) {
        ps_log_error("store %s: not a psd store (no format record)", s->dir);
        return PS_ECORRUPT;
    }
    if (mrc != 0) {
        ps_log_error("store %s: reading the format record: %s", s->dir, mdb_strerror(mrc));
        return map_rc(mrc, true);
    }
    struct store_format f;
    if (v.mv_size != sizeof f) {
        ps_log_error("store %s: format record has %zu bytes, expected %zu", s->dir, v.mv_size,
                     sizeof f);
        return PS_ECORRUPT;
    }
    memcpy(&f, v.mv_data, sizeof f);
    if (f.magic == __builtin_bswap32(STORE_MAGIC) || f.bom == __builtin_bswap32(STORE_BOM)) {
        ps_log_error("store %s: written on a host of the other byte order", s->dir);
        return PS_ECORRUPT;
    }
    if (f.magic != STORE_MAGIC || f.bom != STORE_BOM) {
        ps_log_error("store %s: not a psd store (bad magic)", s->dir);
        return PS_ECORRUPT;
    }
    if (f.format != STORE_FORMAT) {
        ps_log_error("store %s: format %u, this psd reads format %u", s->dir, f.format,
                     STORE_FORMAT);
        return PS_ECORRUPT;
    }
    return 0;
}

/* Opens the four sub-databases (creating them unless read-only) and checks
 * the format. The handles stay valid for the life of the environment once
 * the transaction that opened them commits. */
static int open_dbs(psd_store *s, bool rdonly)
{
    MDB_txn *txn;
    int mrc = txn_begin(s, rdonly ? MDB_RDONLY : 0, &txn);
    if (mrc != 0) {
        ps_log_error("store %s: begin: %s", s->dir, mdb_strerror(mrc));
        return map_rc(mrc, true);
    }
    const struct {
        const char *name;
        MDB_dbi *dbi;
    } dbs[] = {
        {"meta", &s->meta}, {"vars", &s->vars}, {"dense", &s->dense}, {"rows", &s->rows},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof dbs / sizeof dbs[0]; i++) {
        mrc = mdb_dbi_open(txn, dbs[i].name, rdonly ? 0 : MDB_CREATE, dbs[i].dbi);
        if (mrc == MDB_NOTFOUND) {
            ps_log_error("store %s: not a psd store (no \"%s\" database)", s->dir, dbs[i].name);
            rc = PS_ECORRUPT;
            goto abort;
        }
        if (mrc != 0) {
            ps_log_error("store %s: opening \"%s\": %s", s->dir, dbs[i].name, mdb_strerror(mrc));
            rc = map_rc(mrc, true);
            goto abort;
        }
    }
    rc = check_format(s, txn, rdonly);
    if (rc != 0)
        goto abort;
    mrc = txn_commit(s, txn);
    if (mrc != 0) {
        ps_log_error("store %s: commit: %s", s->dir, mdb_strerror(mrc));
        return map_rc(mrc, true);
    }
    return 0;

abort:
    txn_end(s, txn);
    return rc;
}

static uint64_t default_map_size(void)
{
#ifdef RUNNING_ON_VALGRIND
    if (RUNNING_ON_VALGRIND)
        return VALGRIND_MAP_SIZE;
#endif
    /* Set by the project's valgrind test setup, for builds without
     * valgrind's headers. */
    if (getenv("PS_UNDER_VALGRIND"))
        return VALGRIND_MAP_SIZE;
    return DEFAULT_MAP_SIZE;
}

/* Creates and opens the environment. The default map may not fit where
 * address space is capped (ulimit -v, valgrind): mmap then fails with
 * EINVAL or ENOMEM, and with fallback the map is halved down to
 * MIN_FALLBACK_MAP until it fits. */
static int env_open(psd_store *s, const char *dir, uint64_t map_size, bool fallback, bool rdonly)
{
    uint64_t want = map_size;
    int mrc;
    for (;;) {
        mrc = mdb_env_create(&s->env);
        if (mrc != 0) {
            ps_log_error("store %s: mdb_env_create: %s", dir, mdb_strerror(mrc));
            return map_rc(mrc, true);
        }
        mrc = mdb_env_set_maxdbs(s->env, MAX_DBS);
        if (mrc == 0)
            mrc = mdb_env_set_mapsize(s->env, (size_t)map_size);
        if (mrc == 0)
            /* No readahead: rows of sparse tables are read at random from
             * a map larger than memory, where the kernel's readahead read
             * 100 times the bytes used (bench/sparse, 4x over its cgroup).
             * psd_store_load asks for it back while it streams the dense
             * variables in. */
            mrc = mdb_env_open(s->env, dir, MDB_NOTLS | MDB_NORDAHEAD |
                               (rdonly ? MDB_RDONLY : 0), 0644);
        if (mrc == 0)
            break;
        /* A failed mdb_env_open leaves a handle only mdb_env_close may touch. */
        mdb_env_close(s->env);
        s->env = NULL;
        if (!fallback || (mrc != EINVAL && mrc != ENOMEM) || map_size / 2 < MIN_FALLBACK_MAP) {
            ps_log_error("store %s: opening the environment (map %llu MiB): %s", dir,
                         (unsigned long long)(map_size >> 20), mdb_strerror(mrc));
            return map_rc(mrc, true);
        }
        map_size /= 2;
    }
    if (map_size != want)
        ps_log_warn("store %s: a %llu MiB map does not fit in the address space, using %llu MiB",
                    dir, (unsigned long long)(want >> 20), (unsigned long long)(map_size >> 20));
    return 0;
}

int psd_store_open(const char *dir, uint64_t map_size, unsigned flags, psd_store **out)
{
    if (!out)
        return PS_EINVAL_ARG;
    *out = NULL;
    if (!dir || !*dir || (flags & ~(unsigned)PSD_STORE_RDONLY))
        return PS_EINVAL_ARG;
    bool rdonly = flags & PSD_STORE_RDONLY;
    bool fallback = map_size == 0;
    if (map_size == 0)
        map_size = default_map_size();
    if (map_size > SIZE_MAX)
        return PS_EINVAL_ARG;

    int rc;
    if (!rdonly) {
        rc = ps_mkdirs(dir);
        if (rc != 0) {
            ps_log_err(rc, "store %s: creating the directory", dir);
            return rc;
        }
    }
    psd_store *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->flags = flags;
    pthread_rwlock_init(&s->gate, NULL);
    s->dir = strdup(dir);
    if (!s->dir) {
        rc = -ENOMEM;
        goto free_store;
    }
    rc = env_open(s, dir, map_size, fallback, rdonly);
    if (rc != 0)
        goto free_store;
    rc = open_dbs(s, rdonly);
    if (rc != 0)
        goto close_env;
    MDB_envinfo info;
    s->map_size = mdb_env_info(s->env, &info) == 0 ? info.me_mapsize : map_size;
    *out = s;
    return 0;

close_env:
    mdb_env_close(s->env);
free_store:
    pthread_rwlock_destroy(&s->gate);
    free(s->dir);
    free(s);
    return rc;
}

void psd_store_close(psd_store *s)
{
    if (!s)
        return;
    mdb_env_close(s->env);
    pthread_rwlock_destroy(&s->gate);
    free(s->dir);
    free(s);
}

/* Per-walk state: the NUL-terminated name and a scratch buffer for values
 * that LMDB hands back unaligned (small values sit inside leaf pages at odd
 * addresses) and for slots, which the record wants contiguous. */
struct reader {
    char name[MAX_NAME + 1];
    float *scratch;
    size_t scratch_cap; /* floats */
};

static int reader_reserve(struct reader *r, size_t nfloats)
{
    if (nfloats <= r->scratch_cap)
        return 0;
    float *p = realloc(r->scratch, nfloats * sizeof(float));
    if (!p)
        return -ENOMEM;
    r->scratch = p;
    r->scratch_cap = nfloats;
    return 0;
}

static bool float_aligned(const void *p)
{
    return ((uintptr_t)p % _Alignof(float)) == 0;
}

/* Checks the header of the "vars" record of variable name against the
 * record's size and the limits this build can hold. */
static int check_var_hdr(const psd_store *s, const char *name, const MDB_val *data,
                         struct var_hdr *h)
{
    if (data->mv_size < sizeof *h) {
        ps_log_error("store %s: variable '%s': record of %zu bytes is shorter than its header",
                     s->dir, name, data->mv_size);
        return PS_ECORRUPT;
    }
    memcpy(h, data->mv_data, sizeof *h);
    if (h->magic == __builtin_bswap32(VAR_MAGIC)) {
        ps_log_error("store %s: variable '%s': written on a host of the other byte order", s->dir,
                     name);
        return PS_ECORRUPT;
    }
    if (h->magic != VAR_MAGIC) {
        ps_log_error("store %s: variable '%s': bad magic 0x%08x", s->dir, name, h->magic);
        return PS_ECORRUPT;
    }
    if (h->format != VAR_FORMAT || h->hdr_size != sizeof *h) {
        ps_log_error("store %s: variable '%s': record format %u (header %u bytes), expected %u (%zu)",
                     s->dir, name, h->format, h->hdr_size, VAR_FORMAT, sizeof *h);
        return PS_ECORRUPT;
    }
    if (h->spec_len != data->mv_size - sizeof *h) {
        ps_log_error("store %s: variable '%s': header says a %llu-byte spec, record holds %zu",
                     s->dir, name, (unsigned long long)h->spec_len, data->mv_size - sizeof *h);
        return PS_ECORRUPT;
    }
    if (h->nslots > PSD_STORE_MAX_SLOTS || h->n > SIZE_MAX / sizeof(float) / (h->nslots + 1)) {
        ps_log_error("store %s: variable '%s': impossible size (n %llu, %u slots)", s->dir, name,
                     (unsigned long long)h->n, h->nslots);
        return PS_ECORRUPT;
    }
    return 0;
}

/* Fetches the value (vals[0]) and the slots (vals[1..nslots]) of the
 * variable h describes; each must be there and hold exactly h->n floats. */
static int get_dense(const psd_store *s, MDB_txn *txn, const char *name,
                     const struct var_hdr *h, MDB_val *vals)
{
    size_t n = (size_t)h->n;
    for (unsigned kind = 0; kind <= h->nslots; kind++) {
        uint8_t kb[DENSE_KEY_LEN];
        dense_key(kb, h->var_id, kind);
        MDB_val k = {sizeof kb, kb};
        char what[16] = "the value";
        if (kind > 0)
            snprintf(what, sizeof what, "slot %u", kind - 1);
        int mrc = mdb_get(txn, s->dense, &k, &vals[kind]);
        if (mrc == MDB_NOTFOUND) {
            ps_log_error("store %s: variable '%s': %s is missing", s->dir, name, what);
            return PS_ECORRUPT;
        }
        if (mrc != 0) {
            ps_log_error("store %s: variable '%s': reading %s: %s", s->dir, name, what,
                         mdb_strerror(mrc));
            return map_rc(mrc, true);
        }
        if (vals[kind].mv_size != n * sizeof(float)) {
            ps_log_error("store %s: variable '%s': %s has %zu bytes, expected %zu (%zu floats)",
                         s->dir, name, what, vals[kind].mv_size, n * sizeof(float), n);
            return PS_ECORRUPT;
        }
    }
    return 0;
}

/* Sets rec->value and rec->slots from vals: pointing into the map where we
 * can, copying into r's scratch where we must (unaligned, or several slots
 * that the record wants contiguous). An empty variable still gets aligned
 * (dummy) pointers. */
static int point_dense(struct reader *r, size_t n, unsigned nslots, const MDB_val *vals,
                       psd_var_rec *rec)
{
    static const float empty[1];
    bool copy_value = n > 0 && !float_aligned(vals[0].mv_data);
    bool copy_slots = n > 0 && (nslots > 1 || (nslots == 1 && !float_aligned(vals[1].mv_data)));
    size_t need = (copy_value ? n : 0) + (copy_slots ? n * nslots : 0);
    if (reader_reserve(r, need) != 0)
        return -ENOMEM;
    float *p = r->scratch;
    rec->value = vals[0].mv_data;
    if (copy_value) {
        memcpy(p, vals[0].mv_data, n * sizeof(float));
        rec->value = p;
        p += n;
    }
    rec->slots = NULL;
    if (nslots > 0)
        rec->slots = vals[1].mv_data;
    if (copy_slots) {
        rec->slots = p;
        for (unsigned k = 0; k < nslots; k++)
            memcpy(p + (size_t)k * n, vals[k + 1].mv_data, n * sizeof(float));
    }
    if (n == 0) {
        rec->value = empty;
        rec->slots = nslots > 0 ? empty : NULL;
    }
    return 0;
}

/* Checks a "vars" record and its dense values and fills rec, which stays
 * valid until txn ends or r is reused. Every inconsistency is PS_ECORRUPT,
 * logged with the variable's name. */
static int read_var(psd_store *s, MDB_txn *txn, const MDB_val *key, const MDB_val *data,
                    struct reader *r, psd_var_rec *rec)
{
    if (key->mv_size == 0 || key->mv_size > MAX_NAME) {
        ps_log_error("store %s: a variable name of %zu bytes", s->dir, key->mv_size);
        return PS_ECORRUPT;
    }
    memcpy(r->name, key->mv_data, key->mv_size);
    r->name[key->mv_size] = '\0';
    const char *name = r->name;

    struct var_hdr h;
    int rc = check_var_hdr(s, name, data, &h);
    if (rc != 0)
        return rc;
    MDB_val vals[PSD_STORE_MAX_SLOTS + 1];
    rc = get_dense(s, txn, name, &h, vals);
    if (rc != 0)
        return rc;
    size_t n = (size_t)h.n;
    rc = point_dense(r, n, h.nslots, vals, rec);
    if (rc != 0)
        return rc;
    rec->name = name;
    rec->spec = (const char *)data->mv_data + sizeof h;
    rec->spec_len = (size_t)h.spec_len;
    rec->version = h.version;
    rec->step = h.step;
    rec->n = n;
    rec->nslots = (int)h.nslots;
    return 0;
}

/* Begins a read transaction, logging why it cannot. Returns 0 or as
 * map_rc. */
static int read_begin(psd_store *s, MDB_txn **txn)
{
    int mrc = txn_begin(s, MDB_RDONLY, txn);
    if (mrc != 0) {
        ps_log_error("store %s: begin: %s", s->dir, mdb_strerror(mrc));
        return map_rc(mrc, true);
    }
    return 0;
}

/* Readahead on (sequential) or off for the whole map. */
static void map_advise(psd_store *s, int advice)
{
    MDB_envinfo info;
    if (mdb_env_info(s->env, &info) == 0 && info.me_mapaddr != NULL)
        madvise(info.me_mapaddr, info.me_mapsize, advice);
}

static int store_load(psd_store *s, psd_store_visit_fn fn, void *ctx);

int psd_store_load(psd_store *s, psd_store_visit_fn fn, void *ctx)
{
    if (!s || !fn)
        return PS_EINVAL_ARG;
    map_advise(s, MADV_NORMAL);
    int rc = store_load(s, fn, ctx);
    map_advise(s, MADV_RANDOM);
    return rc;
}

static int store_load(psd_store *s, psd_store_visit_fn fn, void *ctx)
{
    MDB_txn *txn;
    int rc = read_begin(s, &txn);
    if (rc != 0)
        return rc;
    MDB_cursor *cur;
    int mrc = mdb_cursor_open(txn, s->vars, &cur);
    if (mrc != 0) {
        ps_log_error("store %s: cursor: %s", s->dir, mdb_strerror(mrc));
        rc = map_rc(mrc, true);
        goto abort;
    }
    struct reader r = {0};
    MDB_val k, v;
    for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0;
         mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        psd_var_rec rec;
        rc = read_var(s, txn, &k, &v, &r, &rec);
        if (rc != 0)
            break;
        rc = fn(ctx, &rec);
        if (rc != 0)
            break;
    }
    if (rc == 0 && mrc != MDB_NOTFOUND) {
        ps_log_error("store %s: walking the variables: %s", s->dir, mdb_strerror(mrc));
        rc = map_rc(mrc, true);
    }
    free(r.scratch);
    mdb_cursor_close(cur);
abort:
    txn_end(s, txn);
    return rc;
}

int psd_store_get(psd_store *s, const char *name, psd_store_visit_fn fn, void *ctx)
{
    MDB_val k, v;
    if (!s || !fn || name_key(name, &k) != 0)
        return PS_EINVAL_ARG;
    MDB_txn *txn;
    int rc = read_begin(s, &txn);
    if (rc != 0)
        return rc;
    int mrc = mdb_get(txn, s->vars, &k, &v);
    if (mrc != 0) {
        if (mrc != MDB_NOTFOUND)
            ps_log_error("store %s: variable '%s': %s", s->dir, name, mdb_strerror(mrc));
        rc = map_rc(mrc, true);
        goto abort;
    }
    struct reader r = {0};
    psd_var_rec rec;
    rc = read_var(s, txn, &k, &v, &r, &rec);
    if (rc == 0)
        rc = fn(ctx, &rec);
    free(r.scratch);
abort:
    txn_end(s, txn);
    return rc;
}

int psd_store_begin(psd_store *s, psd_store_txn **out)
{
    if (!out)
        return PS_EINVAL_ARG;
    *out = NULL;
    if (!s || (s->flags & PSD_STORE_RDONLY))
        return PS_EINVAL_ARG;
    psd_store_txn *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->s = s;
    int mrc = txn_begin(s, 0, &t->txn);
    if (mrc != 0) {
        ps_log_error("store %s: begin: %s", s->dir, mdb_strerror(mrc));
        free(t);
        return map_rc(mrc, false);
    }
    *out = t;
    return 0;
}

/* Records a failed LMDB call inside a write transaction: LMDB refuses
 * everything after such a failure, so the transaction is spoiled and every
 * later call returns the same code. */
static int txn_fail(psd_store_txn *t, int mrc, const char *what, const char *name)
{
    if (mrc == MDB_MAP_FULL) {
        /* Not an error yet: the caller grows the map and tries again. */
        __atomic_store_n(&t->s->map_full, 1, __ATOMIC_RELAXED);
        ps_log_info("store %s: the map (%llu MiB) is full", t->s->dir,
                    (unsigned long long)(t->s->map_size >> 20));
        t->err = PS_EFULL;
        return t->err;
    }
    ps_log_error("store %s: variable '%s': %s: %s", t->s->dir, name, what, mdb_strerror(mrc));
    t->err = map_rc(mrc, false);
    return t->err;
}

/* Reads the header of an existing record; false if it is not a readable
 * header of this format. */
static bool parse_hdr(const MDB_val *v, struct var_hdr *h)
{
    if (v->mv_size < sizeof *h)
        return false;
    memcpy(h, v->mv_data, sizeof *h);
    return h->magic == VAR_MAGIC && h->format == VAR_FORMAT && h->hdr_size == sizeof *h &&
           h->nslots <= PSD_STORE_MAX_SLOTS;
}

/* Hands out the next variable id from "meta"/"next_var_id". */
static int next_var_id(psd_store_txn *t, const char *name, uint32_t *out)
{
    MDB_val k = {sizeof KEY_NEXT_ID - 1, KEY_NEXT_ID}, v;
    uint32_t id = 1;
    int mrc = mdb_get(t->txn, t->s->meta, &k, &v);
    if (mrc == 0) {
        if (v.mv_size != sizeof id) {
            ps_log_error("store %s: the variable id counter has %zu bytes", t->s->dir, v.mv_size);
            return t->err = PS_ECORRUPT;
        }
        memcpy(&id, v.mv_data, sizeof id);
    } else if (mrc != MDB_NOTFOUND) {
        return txn_fail(t, mrc, "reading the id counter", name);
    }
    if (id == UINT32_MAX) {
        ps_log_error("store %s: variable ids exhausted", t->s->dir);
        return t->err = PS_EFULL;
    }
    uint32_t next = id + 1;
    v.mv_size = sizeof next;
    v.mv_data = &next;
    mrc = mdb_put(t->txn, t->s->meta, &k, &v, 0);
    if (mrc != 0)
        return txn_fail(t, mrc, "writing the id counter", name);
    *out = id;
    return 0;
}

int psd_store_reserve_ids(psd_store_txn *t, uint32_t n, uint32_t *first)
{
    if (!t || n == 0)
        return PS_EINVAL_ARG;
    if (t->err)
        return t->err;
    uint32_t id = 0;
    for (uint32_t i = 0; i < n; i++) {
        int rc = next_var_id(t, "(reserved)", i == 0 ? first : &id);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Deletes every key of dbi that starts with var_id in big-endian: a
 * variable's dense values or its rows. */
static int delete_prefix(psd_store_txn *t, MDB_dbi dbi, uint32_t var_id, const char *name)
{
    MDB_cursor *cur;
    int mrc = mdb_cursor_open(t->txn, dbi, &cur);
    if (mrc != 0)
        return txn_fail(t, mrc, "cursor", name);
    uint8_t prefix[ID_PREFIX_LEN];
    put_be32(prefix, var_id);
    for (;;) {
        /* Seek afresh after each delete rather than trust the cursor's
         * position past a deleted item. */
        MDB_val k = {sizeof prefix, prefix}, v;
        mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
        if (mrc == MDB_NOTFOUND ||
            (mrc == 0 && (k.mv_size < sizeof prefix || memcmp(k.mv_data, prefix, sizeof prefix))))
            break;
        if (mrc == 0)
            mrc = mdb_cursor_del(cur, 0);
        if (mrc != 0) {
            mdb_cursor_close(cur);
            return txn_fail(t, mrc, "deleting dense values or rows", name);
        }
    }
    mdb_cursor_close(cur);
    return 0;
}

int psd_store_put(psd_store_txn *t, const psd_var_rec *rec)
{
    if (!t || !rec)
        return PS_EINVAL_ARG;
    if (t->err)
        return t->err;
    MDB_val key;
    if (name_key(rec->name, &key) != 0 || rec->nslots < 0 ||
        rec->nslots > PSD_STORE_MAX_SLOTS || (rec->n > 0 && !rec->value) ||
        (rec->n > 0 && rec->nslots > 0 && !rec->slots) || (rec->spec_len > 0 && !rec->spec) ||
        rec->n > SIZE_MAX / sizeof(float) / (size_t)(rec->nslots + 1) ||
        rec->spec_len > SIZE_MAX - sizeof(struct var_hdr))
        return PS_EINVAL_ARG;
    const char *name = rec->name;
    psd_store *s = t->s;
    unsigned nslots = (unsigned)rec->nslots;

    /* Replacing keeps the variable's id, and remembers how many slots it had
     * so the ones the new record lacks can go. An unreadable old header is
     * replaced as if new: its dense values become unreachable orphans. */
    struct var_hdr h;
    unsigned old_nslots = 0;
    MDB_val v;
    int rc;
    int mrc = mdb_get(t->txn, s->vars, &key, &v);
    if (mrc == 0 && parse_hdr(&v, &h)) {
        old_nslots = h.nslots;
    } else if (mrc == 0 || mrc == MDB_NOTFOUND) {
        if (mrc == 0)
            ps_log_warn("store %s: variable '%s': replacing an unreadable record", s->dir, name);
        if (rec->var_id != 0)
            h.var_id = rec->var_id; /* reserved by psd_store_reserve_ids */
        else if ((rc = next_var_id(t, name, &h.var_id)) != 0)
            return rc;
    } else {
        return txn_fail(t, mrc, "reading the old record", name);
    }
    h.magic = VAR_MAGIC;
    h.format = VAR_FORMAT;
    h.hdr_size = sizeof h;
    h.nslots = nslots;
    h.version = rec->version;
    h.step = rec->step;
    h.n = rec->n;
    h.spec_len = rec->spec_len;

    v.mv_size = sizeof h + rec->spec_len;
    mrc = mdb_put(t->txn, s->vars, &key, &v, MDB_RESERVE);
    if (mrc != 0)
        return txn_fail(t, mrc, "writing the record", name);
    memcpy(v.mv_data, &h, sizeof h);
    if (rec->spec_len > 0)
        memcpy((char *)v.mv_data + sizeof h, rec->spec, rec->spec_len);

    size_t bytes = rec->n * sizeof(float);
    for (unsigned kind = 0; kind <= nslots; kind++) {
        uint8_t kb[DENSE_KEY_LEN];
        dense_key(kb, h.var_id, kind);
        MDB_val k = {sizeof kb, kb};
        v.mv_size = bytes;
        mrc = mdb_put(t->txn, s->dense, &k, &v, MDB_RESERVE);
        if (mrc != 0)
            return txn_fail(t, mrc, kind ? "writing a slot" : "writing the value", name);
        if (bytes > 0)
            memcpy(v.mv_data, kind ? rec->slots + (size_t)(kind - 1) * rec->n : rec->value, bytes);
    }
    for (unsigned kind = nslots + 1; kind <= old_nslots; kind++) {
        uint8_t kb[DENSE_KEY_LEN];
        dense_key(kb, h.var_id, kind);
        MDB_val k = {sizeof kb, kb};
        mrc = mdb_del(t->txn, s->dense, &k, NULL);
        if (mrc != 0 && mrc != MDB_NOTFOUND)
            return txn_fail(t, mrc, "dropping a slot", name);
    }
    return 0;
}

int psd_store_del(psd_store_txn *t, const char *name)
{
    MDB_val key, v;
    if (!t || name_key(name, &key) != 0)
        return PS_EINVAL_ARG;
    if (t->err)
        return t->err;
    psd_store *s = t->s;
    int mrc = mdb_get(t->txn, s->vars, &key, &v);
    if (mrc == MDB_NOTFOUND)
        return PS_ENOTFOUND;
    if (mrc != 0)
        return txn_fail(t, mrc, "reading the record", name);
    struct var_hdr h;
    if (parse_hdr(&v, &h)) {
        int rc = delete_prefix(t, s->dense, h.var_id, name);
        if (rc == 0)
            rc = delete_prefix(t, s->rows, h.var_id, name);
        if (rc != 0)
            return rc;
    } else {
        ps_log_warn("store %s: variable '%s': deleting an unreadable record", s->dir, name);
    }
    mrc = mdb_del(t->txn, s->vars, &key, NULL);
    if (mrc != 0)
        return txn_fail(t, mrc, "deleting the record", name);
    return 0;
}

int psd_store_clear(psd_store_txn *t, bool keep_rows)
{
    if (!t)
        return PS_EINVAL_ARG;
    if (t->err)
        return t->err;
    const MDB_dbi dbis[] = {t->s->vars, t->s->dense, t->s->rows};
    for (size_t i = 0; i < (keep_rows ? 2 : 3); i++) {
        int mrc = mdb_drop(t->txn, dbis[i], 0);
        if (mrc != 0)
            return txn_fail(t, mrc, "clearing", "*");
    }
    return 0;
}

int psd_store_commit(psd_store_txn *t)
{
    if (!t)
        return PS_EINVAL_ARG;
    psd_store *s = t->s;
    int rc = t->err;
    if (rc != 0) {
        txn_end(s, t->txn);
        free(t);
        return rc;
    }
    int mrc = txn_commit(s, t->txn);
    free(t);
    if (mrc != 0) {
        bool full = is_space_error(mrc) || (mrc == EIO && store_disk_full(s));
        ps_log_error("store %s: commit: %s%s", s->dir, mdb_strerror(mrc),
                     full && mrc == EIO ? " (the disk is full)" : "");
        return full ? PS_EFULL : PS_ESTORE;
    }
    __atomic_add_fetch(&s->commits, 1, __ATOMIC_RELAXED);
    return 0;
}

void psd_store_abort(psd_store_txn *t)
{
    if (!t)
        return;
    txn_end(t->s, t->txn);
    free(t);
}

int psd_store_copy(psd_store *s, const char *dst_dir)
{
    if (!s || !dst_dir || !*dst_dir)
        return PS_EINVAL_ARG;
    char file[PATH_MAX];
    if (snprintf(file, sizeof file, "%s/data.mdb", dst_dir) >= (int)sizeof file)
        return -ENAMETOOLONG;
    pthread_rwlock_rdlock(&s->gate); /* the copy reads in a transaction */
    int mrc = mdb_env_copy2(s->env, dst_dir, MDB_CP_COMPACT);
    pthread_rwlock_unlock(&s->gate);
    if (mrc == 0)
        return 0;
    ps_log_error("store %s: copying to %s: %s", s->dir, dst_dir, mdb_strerror(mrc));
    /* A data.mdb that was there before is not ours to remove. */
    if (mrc != EEXIST && unlink(file) != 0 && errno != ENOENT)
        ps_log_warn("store %s: removing the partial copy %s: %s", s->dir, file, strerror(errno));
    return map_rc(mrc, true);
}

int psd_store_sync(psd_store *s)
{
    if (!s)
        return PS_EINVAL_ARG;
    if (s->flags & PSD_STORE_RDONLY)
        return 0;
    int mrc = mdb_env_sync(s->env, 1);
    if (mrc != 0) {
        ps_log_error("store %s: sync: %s", s->dir, mdb_strerror(mrc));
        return is_space_error(mrc) ? PS_EFULL : PS_ESTORE;
    }
    return 0;
}

uint64_t psd_store_commits(const psd_store *s)
{
    return s ? __atomic_load_n(&s->commits, __ATOMIC_RELAXED) : 0;
}

/* For store_rows.c, the other file of the store module. */
int store_map_rc(int mrc, bool errno_ok)
{
    return map_rc(mrc, errno_ok);
}

int store_txn_begin(psd_store *s, unsigned flags, MDB_txn **out)
{
    return txn_begin(s, flags, out);
}

void store_txn_end(psd_store *s, MDB_txn *txn)
{
    txn_end(s, txn);
}

int store_txn_commit(psd_store *s, MDB_txn *txn)
{
    return txn_commit(s, txn);
}

int store_txn_fail(psd_store_txn *t, int mrc, const char *what, const char *name)
{
    return txn_fail(t, mrc, what, name);
}
