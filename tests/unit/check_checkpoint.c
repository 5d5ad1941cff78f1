#include "server/checkpoint.h"
#include "common/errors.h"
#include "tests/unit/pscheck.h"
#include "server/store.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

/* Each test gets a fresh data directory (the fixture's tmpdir); the store
 * lives in it, as in psd, and checkpoints under it. */
static const char *const data_dir = tmpdir;
static char ck_dir[PATH_MAX + 16];

static void setup(void)
{
    pscheck_tmp_setup();
    snprintf(ck_dir, sizeof ck_dir, "%s/checkpoints", data_dir);
}

/* Puts one variable "w" of n floats, all equal to fill, plus a second small
 * one so checkpoints hold more than one record. */
static void put_model(psd_store *s, size_t n, float fill)
{
    float *buf = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        buf[i] = fill;
    psd_store_txn *t;
    ck_assert_int_eq(psd_store_begin(s, &t), 0);
    psd_var_rec r = {.name = "w", .spec = "spec", .spec_len = 4, .version = (uint64_t)fill,
                     .value = buf, .n = n, .slots = buf, .nslots = 1};
    ck_assert_int_eq(psd_store_put(t, &r), 0);
    psd_var_rec b = {.name = "b", .version = 1, .value = buf, .n = 3};
    ck_assert_int_eq(psd_store_put(t, &b), 0);
    ck_assert_int_eq(psd_store_commit(t), 0);
    free(buf);
}

static int visit_w_fill(void *ctx, const psd_var_rec *r)
{
    float *fill = ctx;
    *fill = r->n > 0 ? r->value[0] : -1.0f;
    return 0;
}

/* The value of "w" in the checkpoint at dir, opened read-only. */
static float ckpt_fill(const char *dir)
{
    psd_store *c;
    ck_assert_int_eq(psd_store_open(dir, 0, PSD_STORE_RDONLY, &c), 0);
    float fill = 0;
    ck_assert_int_eq(psd_store_get(c, "w", visit_w_fill, &fill), 0);
    psd_store_close(c);
    return fill;
}

static void write_ckpt(psd_store *s, uint64_t step)
{
    char path[PATH_MAX];
    uint64_t bytes = 0;
    ck_assert_int_eq(psd_ckpt_write(s, data_dir, step, 2, path, sizeof path, &bytes), 0);
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "%s/%llu", ck_dir, (unsigned long long)step);
    ck_assert_str_eq(path, want);
    ck_assert_uint_gt(bytes, 0);
}

static void ckpt_file(char *out, size_t len, uint64_t step, const char *name)
{
    snprintf(out, len, "%s/%llu/%s", ck_dir, (unsigned long long)step, name);
}

/* How many entries of checkpoints/ contain s. */
static int count_entries(const char *s)
{
    DIR *d = opendir(ck_dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, s) != NULL;
    closedir(d);
    return n;
}

static void list_eq(const uint64_t *want, size_t nwant)
{
    uint64_t got[16];
    size_t n = 99;
    ck_assert_int_eq(psd_ckpt_list(data_dir, got, 16, &n), 0);
    ck_assert_uint_eq(n, nwant);
    for (size_t i = 0; i < n; i++)
        ck_assert_uint_eq(got[i], want[i]);
}

/* Opens the store in data_dir, puts the model (n floats of fill) and writes
 * a checkpoint at each of the nsteps steps; the store stays open. */
static psd_store *open_with_ckpts(size_t n, float fill, const uint64_t *steps, int nsteps)
{
    psd_store *s;
    ck_assert_int_eq(psd_store_open(data_dir, 0, 0, &s), 0);
    put_model(s, n, fill);
    for (int i = 0; i < nsteps; i++)
        write_ckpt(s, steps[i]);
    return s;
}

/* psd_ckpt_latest finds a whole checkpoint, and it is of step want. */
static void latest_eq(uint64_t want)
{
    uint64_t step = 0;
    ck_assert_int_eq(psd_ckpt_latest(data_dir, &step), 0);
    ck_assert_uint_eq(step, want);
}

/* What psd_ckpt_path returns for step. */
static int path_rc(uint64_t step)
{
    char path[PATH_MAX];
    return psd_ckpt_path(data_dir, step, path, sizeof path);
}

/* The value of "w" in the checkpoint of step, which must be whole. */
static float step_fill(uint64_t step)
{
    char path[PATH_MAX];
    ck_assert_int_eq(psd_ckpt_path(data_dir, step, path, sizeof path), 0);
    return ckpt_fill(path);
}

START_TEST(test_write_two_latest_highest)
{
    psd_store *s = open_with_ckpts(1000, 1.0f, (uint64_t[]){10}, 1);
    put_model(s, 1000, 2.0f);
    write_ckpt(s, 20);
    put_model(s, 1000, 3.0f); /* after the last checkpoint: in neither */

    latest_eq(20);
    list_eq((uint64_t[]){10, 20}, 2);
    ck_assert(step_fill(10) == 1.0f);
    ck_assert(step_fill(20) == 2.0f);
    ck_assert_int_eq(count_entries(".tmp-"), 0);

    /* The manifest says what the directory holds. */
    char file[PATH_MAX + 64];
    ckpt_file(file, sizeof file, 20, "MANIFEST.json");
    json_error_t jerr;
    json_t *m = json_load_file(file, 0, &jerr);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(json_integer_value(json_object_get(m, "format")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(m, "step")), 20);
    ck_assert_int_eq(json_integer_value(json_object_get(m, "sequence")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(m, "variables")), 2);
    ck_assert_str_eq(json_string_value(json_object_get(m, "data_file")), "data.mdb");
    ck_assert_int_gt(json_integer_value(json_object_get(m, "created_unix")), 0);
    json_int_t bytes = json_integer_value(json_object_get(m, "bytes"));
    json_int_t crc = json_integer_value(json_object_get(m, "crc32"));
    json_decref(m);
    ckpt_file(file, sizeof file, 20, "data.mdb");
    FILE *f = fopen(file, "rb");
    ck_assert_ptr_nonnull(f);
    static unsigned char buf[1 << 16];
    uLong c = crc32(0L, Z_NULL, 0);
    size_t n, total = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        c = crc32(c, buf, (uInt)n);
        total += n;
    }
    fclose(f);
    ck_assert_uint_eq(total, (size_t)bytes);
    ck_assert_uint_eq(c, (uLong)crc);
    psd_store_close(s);
}
END_TEST

START_TEST(test_latest_none)
{
    uint64_t step = 7, steps[4];
    size_t n = 9;
    ck_assert_int_eq(psd_ckpt_latest(data_dir, &step), PS_ENOTFOUND);
    ck_assert_uint_eq(step, 7);
    ck_assert_int_eq(psd_ckpt_list(data_dir, steps, 4, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(path_rc(1), PS_ENOTFOUND);
    ck_assert_int_eq(psd_ckpt_prune(data_dir, 1), 0);
}
END_TEST

START_TEST(test_dir_without_manifest_ignored)
{
    psd_store *s = open_with_ckpts(100, 1.0f, (uint64_t[]){10}, 1);
    /* Higher steps that are not whole checkpoints: an empty directory, a
     * copy without its manifest, names psd never writes, a temp dir. */
    char dir[PATH_MAX + 64];
    static const char *const junk[] = {"30", "40", "050", "abc", "60.tmp-1", "+70"};
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        snprintf(dir, sizeof dir, "%s/%s", ck_dir, junk[i]);
        ck_assert_int_eq(mkdir(dir, 0755), 0);
    }
    snprintf(dir, sizeof dir, "%s/40", ck_dir);
    ck_assert_int_eq(psd_store_copy(s, dir), 0);

    latest_eq(10);
    list_eq((uint64_t[]){10}, 1);
    ck_assert_int_eq(path_rc(30), PS_ENOTFOUND);
    ck_assert_int_eq(path_rc(40), PS_ENOTFOUND);
    ck_assert_int_eq(path_rc(99), PS_ENOTFOUND);
    /* Prune leaves what it did not write alone. */
    ck_assert_int_eq(psd_ckpt_prune(data_dir, 1), 0);
    ck_assert_int_eq(count_entries("40"), 1);
    ck_assert_int_eq(count_entries("abc"), 1);
    psd_store_close(s);
}
END_TEST

START_TEST(test_bad_manifest_ignored)
{
    psd_store_close(open_with_ckpts(100, 1.0f, (uint64_t[]){10, 20, 30}, 3));

    char file[PATH_MAX + 64];
    ckpt_file(file, sizeof file, 30, "MANIFEST.json");
    pscheck_write_text(file, "{\"format\": 1, \"step\": 30, \"trunc");
    ckpt_file(file, sizeof file, 20, "MANIFEST.json");
    pscheck_write_text(file, "{\"format\": 1, \"step\": 21, \"variables\": 2, \"bytes\": 1,"
                    " \"created_unix\": 1, \"data_file\": \"data.mdb\", \"crc32\": 0}");

    latest_eq(10);
    ck_assert_int_eq(path_rc(30), PS_ECORRUPT);
    ck_assert_int_eq(path_rc(20), PS_ECORRUPT);
    ck_assert_int_eq(path_rc(10), 0);
    list_eq((uint64_t[]){10}, 1);
}
END_TEST

START_TEST(test_bad_crc_ignored)
{
    psd_store_close(open_with_ckpts(1000, 1.0f, (uint64_t[]){10, 20}, 2));

    /* Flip one byte of 20's data file: same size, wrong crc. */
    char file[PATH_MAX + 64];
    ckpt_file(file, sizeof file, 20, "data.mdb");
    FILE *f = fopen(file, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 5000, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 5000, SEEK_SET);
    fputc(c ^ 0xff, f);
    fclose(f);

    latest_eq(10);
    ck_assert_int_eq(path_rc(20), PS_ECORRUPT);
    /* list does not read the data: 20 still looks complete to it. */
    list_eq((uint64_t[]){10, 20}, 2);
    /* Prune never removes the checkpoint latest would pick. */
    ck_assert_int_eq(psd_ckpt_prune(data_dir, 1), 0);
    list_eq((uint64_t[]){10, 20}, 2);
}
END_TEST

/* Run under pscheck_fork: writes past 64 KiB fail as on a full disk, and so
 * must the checkpoint of step 20. */
static int child_write_full(void)
{
    char path[PATH_MAX];
    uint64_t bytes = 0;
    psd_store *s;
    if (psd_store_open(data_dir, 0, 0, &s) != 0)
        return 10;
    int code = pscheck_limit_writes(64 << 10) != 0 ? 11 : 0;
    if (code == 0 && psd_ckpt_write(s, data_dir, 20, 2, path, sizeof path, &bytes) != PS_EFULL)
        code = 12;
    psd_store_close(s);
    return code;
}

START_TEST(test_write_full_disk)
{
    /* 1 MiB with its slot. */
    psd_store *s = open_with_ckpts(1 << 17, 1.0f, (uint64_t[]){10}, 1);
    put_model(s, 1 << 17, 2.0f);
    psd_store_close(s); /* LMDB handles must not cross fork() */

    ck_assert_int_eq(pscheck_fork(child_write_full), 0);

    latest_eq(10);
    ck_assert(step_fill(10) == 1.0f);
    ck_assert_int_eq(path_rc(20), PS_ENOTFOUND);
    ck_assert_int_eq(count_entries(".tmp-"), 0);
    list_eq((uint64_t[]){10}, 1);
    /* The store itself is unharmed. */
    ck_assert_int_eq(psd_store_open(data_dir, 0, 0, &s), 0);
    float fill = 0;
    ck_assert_int_eq(psd_store_get(s, "w", visit_w_fill, &fill), 0);
    ck_assert(fill == 2.0f);
    psd_store_close(s);
}
END_TEST

static int child_exit(void)
{
    return 0;
}

START_TEST(test_prune_by_creation)
{
    /* Forged steps far ahead (the audit's attack) are the newest only until
     * honest checkpoints follow; they do not outrank those for good. */
    const uint64_t big = (uint64_t)1 << 40;
    psd_store *s = open_with_ckpts(100, 1.0f,
                                   (uint64_t[]){100, 200, 300, big + 99, big + 100, big + 50},
                                   6);
    latest_eq(big + 50);
    ck_assert_int_eq(psd_ckpt_prune(data_dir, 3), 0);
    list_eq((uint64_t[]){big + 50, big + 99, big + 100}, 3);
    for (uint64_t st = 400; st <= 600; st += 100) {
        write_ckpt(s, st);
        ck_assert_int_eq(psd_ckpt_prune_sparing(data_dir, 3, st), 0);
    }
    psd_store_close(s);
    list_eq((uint64_t[]){400, 500, 600}, 3);
    latest_eq(600);
}
END_TEST

START_TEST(test_prune_keeps_last)
{
    psd_store_close(open_with_ckpts(100, 1.0f, (uint64_t[]){1, 2, 3, 4, 5}, 5));

    /* A temp dir whose writer is dead goes; one whose writer lives stays. */
    fflush(NULL);
    pid_t dead = fork();
    ck_assert_int_ge(dead, 0);
    if (dead == 0)
        _exit(child_exit());
    ck_assert_int_eq(waitpid(dead, NULL, 0), dead);
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/6.tmp-%ld", ck_dir, (long)dead);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    snprintf(dir, sizeof dir, "%s/7.tmp-%ld", ck_dir, (long)getpid());
    ck_assert_int_eq(mkdir(dir, 0755), 0);

    ck_assert_int_eq(psd_ckpt_prune(data_dir, 2), 0);
    list_eq((uint64_t[]){4, 5}, 2);
    ck_assert_int_eq(count_entries("6.tmp-"), 0);
    ck_assert_int_eq(count_entries("7.tmp-"), 1);
    latest_eq(5);

    /* Asking for more than there are removes nothing; 0 keeps latest. */
    ck_assert_int_eq(psd_ckpt_prune(data_dir, 10), 0);
    list_eq((uint64_t[]){4, 5}, 2);
    ck_assert_int_eq(psd_ckpt_prune(data_dir, 0), 0);
    list_eq((uint64_t[]){5}, 1);
}
END_TEST

START_TEST(test_replace_same_step)
{
    psd_store *s = open_with_ckpts(1000, 1.0f, (uint64_t[]){10}, 1);
    put_model(s, 1000, 2.0f);
    write_ckpt(s, 10);
    put_model(s, 2000, 3.0f);
    write_ckpt(s, 10);
    psd_store_close(s);

    list_eq((uint64_t[]){10}, 1);
    ck_assert(step_fill(10) == 3.0f);
    ck_assert_int_eq(count_entries(".tmp-"), 0);
}
END_TEST

START_TEST(test_list_and_path_limits)
{
    psd_store *s = open_with_ckpts(10, 1.0f, (uint64_t[]){3, 100, 20}, 3);
    /* Too small a buffer for the path: refused before any work. */
    char small[8];
    ck_assert_int_eq(psd_ckpt_write(s, data_dir, 40, 2, small, sizeof small, NULL),
                     PS_EINVAL_ARG);
    ck_assert_int_eq(psd_ckpt_path(data_dir, 20, small, sizeof small), PS_EINVAL_ARG);
    ck_assert_int_eq(psd_ckpt_write(s, data_dir, (uint64_t)INT64_MAX + 1, 2, NULL, 0, NULL),
                     PS_EINVAL_ARG);
    /* NULL outputs are fine. */
    ck_assert_int_eq(psd_ckpt_write(s, data_dir, 50, 2, NULL, 0, NULL), 0);
    psd_store_close(s);

    /* Sorted numerically, not by name; a short array gets the first ones. */
    uint64_t steps[2];
    size_t n = 0;
    ck_assert_int_eq(psd_ckpt_list(data_dir, steps, 2, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_uint_eq(steps[0], 3);
    ck_assert_uint_eq(steps[1], 20);
    list_eq((uint64_t[]){3, 20, 50, 100}, 4);
    ck_assert_int_eq(psd_ckpt_list(data_dir, NULL, 0, &n), 0);
    ck_assert_uint_eq(n, 4);
}
END_TEST

static const struct pscheck_opts fx = {setup, pscheck_tmp_teardown, 0};

PSCHECK_MAIN("checkpoint",
    {"psd_ckpt_write", {test_write_two_latest_highest, test_write_full_disk,
                        test_replace_same_step}, &fx},
    {"psd_ckpt_latest", {test_latest_none, test_dir_without_manifest_ignored,
                         test_bad_manifest_ignored}, &fx},
    {"psd_ckpt_path", {test_bad_crc_ignored}, &fx},
    {"psd_ckpt_list", {test_list_and_path_limits}, &fx},
    {"psd_ckpt_prune", {test_prune_keeps_last, test_prune_by_creation}, &fx})
