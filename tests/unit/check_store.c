#include "common/errors.h"
#include "tests/unit/pscheck.h"
#include "server/store.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Each test gets a fresh temporary directory; the store lives in
 * <tmp>/store and copies go to <tmp>/copy. */
static char store_dir[PATH_MAX];
static char copy_dir[PATH_MAX];

static void setup(void)
{
    pscheck_tmp_setup();
    snprintf(store_dir, sizeof store_dir, "%s/store", tmpdir);
    snprintf(copy_dir, sizeof copy_dir, "%s/copy", tmpdir);
}

/* A variable owned by the test, with a recognizable spec and values that
 * depend on (seed, index) so mismatches show. */
struct var {
    char name[256];
    char spec[64];
    float *value;
    float *slots;
    size_t n;
    int nslots;
    uint64_t version;
    uint64_t step;
};

static void var_make(struct var *v, const char *name, size_t n, int nslots, float seed)
{
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    snprintf(v->spec, sizeof v->spec, "spec-of-%s", name);
    v->n = n;
    v->nslots = nslots;
    v->version = (uint64_t)(seed * 10);
    v->step = (uint64_t)seed + 7;
    v->value = malloc((n ? n : 1) * sizeof(float));
    v->slots = nslots ? malloc((n ? n : 1) * (size_t)nslots * sizeof(float)) : NULL;
    for (size_t i = 0; i < n; i++)
        v->value[i] = seed + (float)i * 0.5f;
    for (size_t i = 0; i < n * (size_t)nslots; i++)
        v->slots[i] = -seed - (float)i;
}

static void var_free(struct var *v)
{
    free(v->value);
    free(v->slots);
    v->value = v->slots = NULL;
}

/* var_make's arguments, for a table of variables. */
struct var_spec {
    const char *name;
    size_t n;
    int nslots;
    float seed;
};

/* "a" on overflow pages with two slots, "b" small with one. */
static const struct var_spec a_and_b[2] = {{"a", 3000, 2, 1.0f}, {"b", 7, 1, 2.0f}};

static void vars_make(struct var *v, int n, const struct var_spec *specs)
{
    for (int i = 0; i < n; i++)
        var_make(&v[i], specs[i].name, specs[i].n, specs[i].nslots, specs[i].seed);
}

static void vars_free(struct var *v, int n)
{
    for (int i = 0; i < n; i++)
        var_free(&v[i]);
}

/* The test's store on store_dir, opened read-write. */
static psd_store *open_rw(size_t map_size)
{
    psd_store *s;
    ck_assert_int_eq(psd_store_open(store_dir, map_size, 0, &s), 0);
    return s;
}

static psd_var_rec var_rec(const struct var *v)
{
    return (psd_var_rec){
        .name = v->name, .spec = v->spec, .spec_len = strlen(v->spec),
        .version = v->version, .step = v->step, .value = v->value, .n = v->n,
        .slots = v->slots, .nslots = v->nslots,
    };
}

/* A write transaction on s, which must open. */
static psd_store_txn *begin(psd_store *s)
{
    psd_store_txn *t;
    ck_assert_int_eq(psd_store_begin(s, &t), 0);
    return t;
}

static void put_var(psd_store_txn *t, const struct var *v)
{
    psd_var_rec r = var_rec(v);
    ck_assert_int_eq(psd_store_put(t, &r), 0);
}

/* Checks that v does not fit (PS_EFULL) and aborts the transaction. */
static void put_full(psd_store *s, const struct var *v)
{
    psd_store_txn *t = begin(s);
    psd_var_rec r = var_rec(v);
    ck_assert_int_eq(psd_store_put(t, &r), PS_EFULL);
    psd_store_abort(t);
}

/* Puts vars in one transaction and commits it. */
static void commit_vars(psd_store *s, struct var *vars, int nvars)
{
    psd_store_txn *t = begin(s);
    for (int i = 0; i < nvars; i++)
        put_var(t, &vars[i]);
    ck_assert_int_eq(psd_store_commit(t), 0);
}

static void rec_eq(const psd_var_rec *r, const struct var *v)
{
    ck_assert_str_eq(r->name, v->name);
    ck_assert_uint_eq(r->spec_len, strlen(v->spec));
    ck_assert_int_eq(memcmp(r->spec, v->spec, r->spec_len), 0);
    ck_assert_uint_eq(r->version, v->version);
    ck_assert_uint_eq(r->step, v->step);
    ck_assert_uint_eq(r->n, v->n);
    ck_assert_int_eq(r->nslots, v->nslots);
    ck_assert_uint_eq((uintptr_t)r->value % _Alignof(float), 0);
    ck_assert_int_eq(memcmp(r->value, v->value, v->n * sizeof(float)), 0);
    if (v->nslots == 0) {
        ck_assert_ptr_null(r->slots);
    } else {
        ck_assert_uint_eq((uintptr_t)r->slots % _Alignof(float), 0);
        ck_assert_int_eq(memcmp(r->slots, v->slots, v->n * (size_t)v->nslots * sizeof(float)), 0);
    }
}

/* Visitor that checks records against an expected list, in order. */
struct expect {
    const struct var *vars;
    int nvars;
    int seen;
};

/* Opens the test's store read-write, makes n variables from specs into v
 * and commits the first ncommit of them in one transaction. */
static psd_store *open_with(struct var *v, int n, const struct var_spec *specs,
                            int ncommit)
{
    psd_store *s = open_rw(0);
    vars_make(v, n, specs);
    commit_vars(s, v, ncommit);
    return s;
}

/* Frees the n variables of v and closes s: open_with's undoing. */
static void close_with(psd_store *s, struct var *v, int n)
{
    vars_free(v, n);
    psd_store_close(s);
}

static int visit_expect(void *ctx, const psd_var_rec *r)
{
    struct expect *e = ctx;
    ck_assert_int_lt(e->seen, e->nvars);
    rec_eq(r, &e->vars[e->seen]);
    e->seen++;
    return 0;
}

static void load_expect(psd_store *s, const struct var *vars, int nvars)
{
    struct expect e = {vars, nvars, 0};
    ck_assert_int_eq(psd_store_load(s, visit_expect, &e), 0);
    ck_assert_int_eq(e.seen, nvars);
}

static int visit_count(void *ctx, const psd_var_rec *r)
{
    (*(int *)ctx)++;
    return 0;
}

static int count_vars(psd_store *s)
{
    int n = 0;
    ck_assert_int_eq(psd_store_load(s, visit_count, &n), 0);
    return n;
}

START_TEST(test_put_commit_load_roundtrip)
{
    psd_store *s = open_rw(0);
    ck_assert_uint_eq(psd_store_commits(s), 0);
    /* "a" is big enough to sit on overflow pages; "b" and "c" are small and
     * come back unaligned from LMDB, so the store copies them. */
    struct var v[3];
    vars_make(v, 3, (const struct var_spec[]){{"a", 5000, 2, 1.0f}, {"b", 3, 1, 2.0f},
                                              {"c", 0, 0, 3.0f}});
    commit_vars(s, v, 3);
    ck_assert_uint_eq(psd_store_commits(s), 1);
    load_expect(s, v, 3);
    ck_assert_int_eq(psd_store_sync(s), 0);
    psd_store_close(s);
    vars_free(v, 3);
}
END_TEST

START_TEST(test_put_replace)
{
    psd_store *s = open_rw(0);
    struct var v;
    var_make(&v, "w", 100, 3, 1.0f);
    commit_vars(s, &v, 1);
    var_free(&v);

    /* Fewer slots and another size: the dropped slots must not linger. */
    var_make(&v, "w", 40, 1, 5.0f);
    commit_vars(s, &v, 1);
    load_expect(s, &v, 1);
    var_free(&v);

    /* More slots again: only what this put wrote is there. */
    var_make(&v, "w", 2000, 2, 9.0f);
    commit_vars(s, &v, 1);
    load_expect(s, &v, 1);
    var_free(&v);
    psd_store_close(s);
}
END_TEST

START_TEST(test_put_invalid)
{
    psd_store *s = open_rw(0);
    struct var v;
    var_make(&v, "ok", 4, 1, 1.0f);
    psd_store_txn *t = begin(s);
    psd_var_rec r = var_rec(&v);
    r.nslots = PSD_STORE_MAX_SLOTS + 1;
    ck_assert_int_eq(psd_store_put(t, &r), PS_EINVAL_ARG);
    r = var_rec(&v);
    r.value = NULL;
    ck_assert_int_eq(psd_store_put(t, &r), PS_EINVAL_ARG);
    r = var_rec(&v);
    r.slots = NULL;
    ck_assert_int_eq(psd_store_put(t, &r), PS_EINVAL_ARG);
    r = var_rec(&v);
    r.name = "";
    ck_assert_int_eq(psd_store_put(t, &r), PS_EINVAL_ARG);
    char longname[300];
    memset(longname, 'x', 256);
    longname[256] = '\0';
    r.name = longname;
    ck_assert_int_eq(psd_store_put(t, &r), PS_EINVAL_ARG);
    longname[255] = '\0'; /* 255 bytes is the limit, and fine */
    r.name = longname;
    ck_assert_int_eq(psd_store_put(t, &r), 0);
    /* Bad arguments do not spoil the transaction. */
    put_var(t, &v);
    ck_assert_int_eq(psd_store_commit(t), 0);
    ck_assert_int_eq(count_vars(s), 2);
    var_free(&v);
    psd_store_close(s);
}
END_TEST

START_TEST(test_del)
{
    struct var v[2];
    psd_store *s = open_with(v, 2, (const struct var_spec[]){{"a", 10, 1, 1.0f},
                                                             {"b", 10, 2, 2.0f}}, 2);

    psd_store_txn *t = begin(s);
    ck_assert_int_eq(psd_store_del(t, "a"), 0);
    ck_assert_int_eq(psd_store_del(t, "a"), PS_ENOTFOUND);
    ck_assert_int_eq(psd_store_del(t, "nope"), PS_ENOTFOUND);
    /* A miss leaves the transaction usable. */
    ck_assert_int_eq(psd_store_commit(t), 0);
    load_expect(s, &v[1], 1);

    /* Re-creating a deleted name starts clean. */
    commit_vars(s, v, 1);
    load_expect(s, v, 2);
    close_with(s, v, 2);
}
END_TEST

START_TEST(test_clear)
{
    struct var v[3];
    psd_store *s = open_with(v, 3, (const struct var_spec[]){{"a", 10, 1, 1.0f},
                                                             {"b", 3000, 2, 2.0f},
                                                             {"c", 1, 0, 3.0f}}, 3);

    psd_store_txn *t = begin(s);
    ck_assert_int_eq(psd_store_clear(t, false), 0);
    ck_assert_int_eq(psd_store_commit(t), 0);
    ck_assert_int_eq(count_vars(s), 0);

    commit_vars(s, &v[1], 1);
    load_expect(s, &v[1], 1);
    close_with(s, v, 3);
}
END_TEST

/* A 4 MiB map holding "x" (2.5 MiB), committed, and v[1] "y" of the same
 * size made but not stored: one of them fits, not both. v[2], for n = 3, is
 * a small "z". */
static psd_store *x_stored(struct var *v, int n)
{
    psd_store *s = open_rw(4 << 20);
    vars_make(v, n, (const struct var_spec[]){{"x", 640 << 10, 0, 1.0f},
                                              {"y", 640 << 10, 0, 2.0f},
                                              {"z", 10, 0, 3.0f}});
    commit_vars(s, v, 1);
    return s;
}

/* A full map grows: the transaction that filled it is aborted, the map
 * doubles, and the same put then fits. At the cap given, growth is
 * refused and the store keeps what it had. */
START_TEST(test_map_grows)
{
    struct var v[2];
    psd_store *s = x_stored(v, 2);
    ck_assert_uint_eq(psd_store_map_size(s), 4 << 20);
    ck_assert_int_eq(psd_store_grow(s), PS_EFULL); /* nothing was full */
    put_full(s, &v[1]);
    ck_assert_int_eq(psd_store_grow(s), 0);
    ck_assert_uint_eq(psd_store_map_size(s), 8 << 20);
    commit_vars(s, &v[1], 1);
    load_expect(s, v, 2);

    /* A third variable of 5 MiB does not fit in 8 MiB; the cap is 8 MiB. */
    psd_store_set_map_max(s, 8 << 20);
    struct var w;
    vars_make(&w, 1, (const struct var_spec[]){{"z", 1280 << 10, 0, 3.0f}});
    psd_store_txn *t = begin(s);
    psd_var_rec r = var_rec(&w);
    int rc = psd_store_put(t, &r);
    if (rc == 0)
        rc = psd_store_commit(t);
    else
        psd_store_abort(t);
    ck_assert_int_eq(rc, PS_EFULL);
    ck_assert_int_eq(psd_store_grow(s), PS_EFULL);
    ck_assert_str_eq(psd_store_full_reason(s), "the LMDB map is at --map-size-max");
    load_expect(s, v, 2);
    vars_free(&w, 1);
    close_with(s, v, 2);
}
END_TEST

/* DeleteVariable's promise: a deleted variable stays deleted across a
 * reopen (a psd restart), and the space it took is reused: "y" fits in a
 * map that "x" filled only once "x" is deleted (LMDB reuses the pages a
 * commit freed from the second commit after it on, as psd's next flushes
 * are: "z" stands for one). */
START_TEST(test_del_persists_and_frees)
{
    struct var v[3];
    psd_store *s = x_stored(v, 3);
    put_full(s, &v[1]);

    psd_store_txn *t = begin(s);
    ck_assert_int_eq(psd_store_del(t, "x"), 0);
    ck_assert_int_eq(psd_store_commit(t), 0);
    psd_store_close(s);

    s = open_rw(4 << 20);
    ck_assert_int_eq(count_vars(s), 0);
    struct expect e = {v, 1, 0};
    ck_assert_int_eq(psd_store_get(s, "x", visit_expect, &e), PS_ENOTFOUND);
    commit_vars(s, &v[2], 1);
    commit_vars(s, &v[1], 1);
    load_expect(s, &v[1], 2);
    close_with(s, v, 3);
}
END_TEST

START_TEST(test_abort_leaves_nothing)
{
    struct var v[2];
    psd_store *s = open_with(v, 1, (const struct var_spec[]){{"kept", 10, 1, 1.0f}}, 1);
    var_make(&v[1], "gone", 10, 1, 2.0f); /* never committed */

    psd_store_txn *t = begin(s);
    put_var(t, &v[1]);
    ck_assert_int_eq(psd_store_del(t, "kept"), 0);
    psd_store_abort(t);
    psd_store_abort(NULL);
    load_expect(s, v, 1);
    ck_assert_uint_eq(psd_store_commits(s), 1);
    close_with(s, v, 2);
}
END_TEST

START_TEST(test_load_sorted_by_name)
{
    psd_store *s = open_rw(0);
    static const char *const put_order[] = {"zeta", "alpha", "mid", "Beta", "alpha2"};
    static const char *const sorted[] = {"Beta", "alpha", "alpha2", "mid", "zeta"};
    struct var v[5];
    for (int i = 0; i < 5; i++)
        var_make(&v[i], put_order[i], 4, 0, (float)i);
    commit_vars(s, v, 5);
    vars_free(v, 5);
    for (int i = 0; i < 5; i++) {
        int at = 0;
        while (strcmp(put_order[at], sorted[i]) != 0)
            at++;
        var_make(&v[i], sorted[i], 4, 0, (float)at);
    }
    load_expect(s, v, 5);
    close_with(s, v, 5);
}
END_TEST

static int visit_stop_after_two(void *ctx, const psd_var_rec *r)
{
    return ++*(int *)ctx == 2 ? 42 : 0;
}

START_TEST(test_load_visitor_stops)
{
    struct var v[3];
    psd_store *s = open_with(v, 3, (const struct var_spec[]){{"a", 4, 0, 1.0f}, {"b", 4, 0, 2.0f},
                                                             {"c", 4, 0, 3.0f}}, 3);
    int n = 0;
    ck_assert_int_eq(psd_store_load(s, visit_stop_after_two, &n), 42);
    ck_assert_int_eq(n, 2);
    close_with(s, v, 3);
}
END_TEST

START_TEST(test_reopen_keeps_data)
{
    struct var v[2];
    psd_store *s = open_with(v, 2, a_and_b, 2);
    psd_store_close(s);
    psd_store_close(NULL);

    s = open_rw(0);
    load_expect(s, v, 2);
    psd_store_close(s);

    ck_assert_int_eq(psd_store_open(store_dir, 0, PSD_STORE_RDONLY, &s), 0);
    load_expect(s, v, 2);
    psd_store_txn *t;
    ck_assert_int_eq(psd_store_begin(s, &t), PS_EINVAL_ARG);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(psd_store_sync(s), 0);
    psd_store_close(s);
    vars_free(v, 2);
}
END_TEST

START_TEST(test_open_errors)
{
    psd_store *s = (psd_store *)1;
    char missing[PATH_MAX + 16];
    snprintf(missing, sizeof missing, "%s/missing", tmpdir);
    ck_assert_int_eq(psd_store_open(missing, 0, PSD_STORE_RDONLY, &s), -ENOENT);
    ck_assert_ptr_null(s);
    /* A read-write open creates missing parents. */
    snprintf(missing, sizeof missing, "%s/a/b/c", tmpdir);
    ck_assert_int_eq(psd_store_open(missing, 0, 0, &s), 0);
    psd_store_close(s);
    ck_assert_int_eq(psd_store_open(missing, 0, 0x10, &s), PS_EINVAL_ARG);
}
END_TEST

START_TEST(test_get)
{
    struct var v[2];
    psd_store *s = open_with(v, 2, a_and_b, 2);
    struct expect e = {&v[1], 1, 0};
    ck_assert_int_eq(psd_store_get(s, "b", visit_expect, &e), 0);
    ck_assert_int_eq(e.seen, 1);
    e = (struct expect){&v[0], 1, 0};
    ck_assert_int_eq(psd_store_get(s, "a", visit_expect, &e), 0);
    ck_assert_int_eq(e.seen, 1);
    ck_assert_int_eq(psd_store_get(s, "c", visit_expect, &e), PS_ENOTFOUND);
    ck_assert_int_eq(psd_store_get(s, "", visit_expect, &e), PS_EINVAL_ARG);
    ck_assert_int_eq(e.seen, 1);
    close_with(s, v, 2);
}
END_TEST

/* Overwrites len bytes at (each occurrence of marker) + off in path. The
 * record header sits just before the spec, which holds the marker. */
static int patch_file(const char *path, const char *marker, long off, const void *bytes,
                      size_t len)
{
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    char *buf = malloc((size_t)size);
    fseek(f, 0, SEEK_SET);
    ck_assert_uint_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
    int hits = 0;
    size_t mlen = strlen(marker);
    for (long i = 0; i + (long)mlen <= size; i++) {
        if (memcmp(buf + i, marker, mlen) != 0)
            continue;
        fseek(f, i + off, SEEK_SET);
        ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
        hits++;
    }
    free(buf);
    fclose(f);
    return hits;
}

/* Runs a load with stderr captured, so the log line can be checked. */
static char logbuf[8192];
static int load_capture(psd_store *s)
{
    fflush(stderr);
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/stderr", tmpdir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    int n = 0;
    int rc = psd_store_load(s, visit_count, &n);
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t got = pread(fd, logbuf, sizeof logbuf - 1, 0);
    logbuf[got > 0 ? got : 0] = '\0';
    close(fd);
    return rc;
}

/* Header offsets, counted back from the spec that follows it. */
#define OFF_MAGIC (-48)
#define OFF_N (-16)
#define OFF_SPEC_LEN (-8)

static void corrupt_case(const char *victim, long off, const void *bytes, size_t len,
                         const char *expect_log)
{
    struct var v[2];
    psd_store *s = open_with(v, 2, (const struct var_spec[]){{"good", 10, 1, 1.0f},
                                                             {victim, 3000, 1, 2.0f}}, 2);
    psd_store_close(s);

    char file[PATH_MAX + 16], marker[128];
    snprintf(file, sizeof file, "%s/data.mdb", store_dir);
    snprintf(marker, sizeof marker, "spec-of-%s", victim);
    ck_assert_int_ge(patch_file(file, marker, off, bytes, len), 1);

    s = open_rw(0);
    ck_assert_int_eq(load_capture(s), PS_ECORRUPT);
    ck_assert_msg(strstr(logbuf, victim) && strstr(logbuf, expect_log), "log: %s", logbuf);
    /* The healthy variable is still readable on its own. */
    struct expect e = {&v[0], 1, 0};
    ck_assert_int_eq(psd_store_get(s, "good", visit_expect, &e), 0);
    ck_assert_int_eq(psd_store_get(s, victim, visit_expect, &e), PS_ECORRUPT);
    /* A put over the broken record repairs it. */
    commit_vars(s, &v[1], 1);
    load_expect(s, v, 2);
    psd_store_close(s);
    vars_free(v, 2);
}

START_TEST(test_corrupt_magic)
{
    corrupt_case("victim1", OFF_MAGIC, "XXXX", 4, "bad magic");
}
END_TEST

START_TEST(test_corrupt_byte_order)
{
    corrupt_case("victim2", OFF_MAGIC, "RVSP", 4, "other byte order");
}
END_TEST

START_TEST(test_corrupt_spec_len)
{
    uint64_t bad = 5;
    corrupt_case("victim3", OFF_SPEC_LEN, &bad, sizeof bad, "spec");
}
END_TEST

START_TEST(test_corrupt_value_size)
{
    uint64_t bad = 2999; /* the value holds 3000 floats */
    corrupt_case("victim4", OFF_N, &bad, sizeof bad, "expected");
}
END_TEST

START_TEST(test_map_full)
{
    psd_store *s = open_rw(1 << 20);
    struct var v[2];
    /* "huge" is 2 MiB in a 1 MiB map. */
    vars_make(v, 2, (const struct var_spec[]){{"small", 100, 1, 1.0f},
                                              {"huge", 1 << 19, 0, 2.0f}});
    commit_vars(s, v, 1);
    psd_store_txn *t = begin(s);
    psd_var_rec r = var_rec(&v[1]);
    ck_assert_int_eq(psd_store_put(t, &r), PS_EFULL);
    /* The transaction is spoiled: later calls and the commit say so. */
    r = var_rec(&v[0]);
    ck_assert_int_eq(psd_store_put(t, &r), PS_EFULL);
    ck_assert_int_eq(psd_store_commit(t), PS_EFULL);
    ck_assert_uint_eq(psd_store_commits(s), 1);
    load_expect(s, v, 1);
    close_with(s, v, 2);
}
END_TEST

/* The children below run under pscheck_fork, with writes past a limit
 * failing as on a full disk. */
static int child_copy_full(void)
{
    psd_store *s;
    if (psd_store_open(store_dir, 0, 0, &s) != 0)
        return 10;
    int code = 0;
    if (mkdir(copy_dir, 0755) != 0 || pscheck_limit_writes(64 << 10) != 0)
        code = 11;
    else if (psd_store_copy(s, copy_dir) != PS_EFULL)
        code = 12;
    char file[PATH_MAX + 16];
    snprintf(file, sizeof file, "%s/data.mdb", copy_dir);
    if (code == 0 && access(file, F_OK) == 0)
        code = 13; /* the partial copy must be gone */
    psd_store_close(s);
    return code;
}

START_TEST(test_copy_full_disk)
{
    struct var v[2];
    /* "a" is 2 MiB with its slot. */
    psd_store *s = open_with(v, 2, (const struct var_spec[]){{"a", 1 << 18, 1, 1.0f},
                                                             {"b", 100, 0, 2.0f}}, 2);
    psd_store_close(s); /* LMDB handles must not cross fork() */

    ck_assert_int_eq(pscheck_fork(child_copy_full), 0);

    s = open_rw(0);
    load_expect(s, v, 2);
    /* The store itself still takes writes after the failed copy. */
    commit_vars(s, &v[1], 1);
    psd_store_close(s);
    vars_free(v, 2);
}
END_TEST

static struct var full_vars[2];
static int child_commit_full(void)
{
    psd_store *s;
    if (psd_store_open(store_dir, 0, 0, &s) != 0)
        return 10;
    int code = 0;
    struct stat st;
    char file[PATH_MAX + 16];
    snprintf(file, sizeof file, "%s/data.mdb", store_dir);
    if (stat(file, &st) != 0)
        code = 11;
    psd_store_txn *t;
    psd_var_rec r = var_rec(&full_vars[1]);
    if (code == 0 && (pscheck_limit_writes((rlim_t)st.st_size) != 0 ||
                      psd_store_begin(s, &t) != 0))
        code = 12;
    else if (code == 0 && psd_store_put(t, &r) != 0)
        code = 13, psd_store_abort(t);
    else if (code == 0 && psd_store_commit(t) != PS_EFULL)
        code = 14;
    psd_store_close(s);
    return code;
}

START_TEST(test_commit_full_disk)
{
    psd_store *s = open_rw(0);
    vars_make(full_vars, 2,
              (const struct var_spec[]){{"a", 1000, 1, 1.0f}, {"b", 1 << 18, 0, 2.0f}});
    commit_vars(s, full_vars, 1);
    psd_store_close(s);

    ck_assert_int_eq(pscheck_fork(child_commit_full), 0);

    s = open_rw(0);
    load_expect(s, full_vars, 1);
    psd_store_close(s);
    vars_free(full_vars, 2);
}
END_TEST

START_TEST(test_copy_snapshot)
{
    struct var v[2], w;
    psd_store *s = open_with(v, 2, a_and_b, 2), *c;

    /* A write transaction is open across the copy and commits after it:
     * the copy has the state before, the store the state after. */
    psd_store_txn *t = begin(s);
    var_make(&w, "a", 10, 0, 5.0f);
    put_var(t, &w);
    ck_assert_int_eq(mkdir(copy_dir, 0755), 0);
    ck_assert_int_eq(psd_store_copy(s, copy_dir), 0);
    ck_assert_int_eq(psd_store_commit(t), 0);

    ck_assert_int_eq(psd_store_open(copy_dir, 0, PSD_STORE_RDONLY, &c), 0);
    load_expect(c, v, 2);
    psd_store_close(c);
    struct var after[2] = {w, v[1]};
    load_expect(s, after, 2);

    /* A second copy into the same directory refuses to clobber the first. */
    ck_assert_int_eq(psd_store_copy(s, copy_dir), -EEXIST);
    ck_assert_int_eq(psd_store_open(copy_dir, 0, PSD_STORE_RDONLY, &c), 0);
    load_expect(c, v, 2);
    psd_store_close(c);
    char missing[PATH_MAX + 16];
    snprintf(missing, sizeof missing, "%s/missing", tmpdir);
    ck_assert_int_eq(psd_store_copy(s, missing), -ENOENT);

    var_free(&w);
    close_with(s, v, 2);
}
END_TEST

/* The writer thread rewrites every variable with the same version in each
 * commit until the copy is done, so a copy that mixed two commits would
 * show two versions. */
#define SNAP_VARS 8
#define SNAP_N (1 << 16)
struct writer {
    psd_store *s;
    volatile int stop;
    int commits;
    int err;
};

static void fill_version(float *p, size_t n, uint64_t version)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)version + (float)(i % 1000) * 0.001f;
}

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    float *buf = malloc(SNAP_N * sizeof(float));
    for (uint64_t version = 2; !__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE); version++) {
        fill_version(buf, SNAP_N, version);
        psd_store_txn *t;
        if ((w->err = psd_store_begin(w->s, &t)) != 0)
            break;
        for (int i = 0; i < SNAP_VARS; i++) {
            char name[16];
            snprintf(name, sizeof name, "v%d", i);
            psd_var_rec r = {.name = name, .version = version, .value = buf, .n = SNAP_N};
            if ((w->err = psd_store_put(t, &r)) != 0)
                break;
        }
        if (w->err != 0 || (w->err = psd_store_commit(t)) != 0)
            break;
        w->commits++;
    }
    free(buf);
    return NULL;
}

struct snap_check {
    uint64_t version;
    int seen;
    float *expect;
};

static int visit_snapshot(void *ctx, const psd_var_rec *r)
{
    struct snap_check *c = ctx;
    if (c->seen == 0) {
        c->version = r->version;
        fill_version(c->expect, SNAP_N, r->version);
    }
    ck_assert_uint_eq(r->version, c->version);
    ck_assert_uint_eq(r->n, SNAP_N);
    ck_assert_int_eq(memcmp(r->value, c->expect, SNAP_N * sizeof(float)), 0);
    c->seen++;
    return 0;
}

START_TEST(test_copy_during_commits)
{
    psd_store *s = open_rw(0), *c;
    float *buf = malloc(SNAP_N * sizeof(float));
    fill_version(buf, SNAP_N, 1);
    psd_store_txn *t = begin(s);
    for (int i = 0; i < SNAP_VARS; i++) {
        char name[16];
        snprintf(name, sizeof name, "v%d", i);
        psd_var_rec r = {.name = name, .version = 1, .value = buf, .n = SNAP_N};
        ck_assert_int_eq(psd_store_put(t, &r), 0);
    }
    ck_assert_int_eq(psd_store_commit(t), 0);

    struct writer w = {.s = s};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, writer_main, &w), 0);
    while (psd_store_commits(s) < 3) /* let the writer get going */
        usleep(1000);
    ck_assert_int_eq(mkdir(copy_dir, 0755), 0);
    ck_assert_int_eq(psd_store_copy(s, copy_dir), 0);
    __atomic_store_n(&w.stop, 1, __ATOMIC_RELEASE);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(w.err, 0);
    ck_assert_int_ge(w.commits, 2);

    ck_assert_int_eq(psd_store_open(copy_dir, 0, PSD_STORE_RDONLY, &c), 0);
    struct snap_check chk = {.expect = buf};
    ck_assert_int_eq(psd_store_load(c, visit_snapshot, &chk), 0);
    ck_assert_int_eq(chk.seen, SNAP_VARS);
    ck_assert_uint_ge(chk.version, 2);
    psd_store_close(c);
    free(buf);
    psd_store_close(s);
}
END_TEST

static const struct pscheck_opts fx = {setup, pscheck_tmp_teardown, 0};

PSCHECK_MAIN("store",
    {"psd_store_put", {test_put_commit_load_roundtrip, test_put_replace, test_put_invalid},
     &fx},
    {"psd_store_del", {test_del, test_del_persists_and_frees}, &fx},
    {"psd_store_clear", {test_clear}, &fx},
    {"psd_store_abort", {test_abort_leaves_nothing}, &fx},
    {"psd_store_load", {test_load_sorted_by_name, test_load_visitor_stops, test_corrupt_magic,
                        test_corrupt_byte_order, test_corrupt_spec_len,
                        test_corrupt_value_size}, &fx},
    {"psd_store_open", {test_reopen_keeps_data, test_open_errors}, &fx},
    {"psd_store_get", {test_get}, &fx},
    {"psd_store_commit", {test_map_full, test_commit_full_disk}, &fx},
    {"psd_store_grow", {test_map_grows}, &fx},
    {"psd_store_copy", {test_copy_snapshot, test_copy_during_commits, test_copy_full_disk},
     &fx})
