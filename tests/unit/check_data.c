#include "worker/data.h"

#include "common/errors.h"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char errbuf[512];

/* A path inside the fixture's temporary directory; static, so one at a time
 * per slot. */
static const char *tpath(int slot, const char *name)
{
    static char paths[4][128];
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", tmpdir, name);
    return paths[slot];
}

static void write_gz(const char *path, const void *data, size_t n)
{
    gzFile gz = gzopen(path, "wb");
    ck_assert_ptr_nonnull(gz);
    ck_assert_int_eq(gzwrite(gz, data, (unsigned)n), (int)n);
    ck_assert_int_eq(gzclose(gz), Z_OK);
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static unsigned char pixel(int i, int k)
{
    return (unsigned char)((i * 37 + k * 11) & 0xff);
}

/* An IDX3 images file of n rows x cols images, returned in a new buffer. */
static unsigned char *idx_images(int n, int rows, int cols, size_t *len)
{
    *len = 16 + (size_t)n * rows * cols;
    unsigned char *b = malloc(*len);
    put_be32(b, 0x00000803);
    put_be32(b + 4, (uint32_t)n);
    put_be32(b + 8, (uint32_t)rows);
    put_be32(b + 12, (uint32_t)cols);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < rows * cols; k++)
            b[16 + (size_t)i * rows * cols + k] = pixel(i, k);
    return b;
}

static unsigned char *idx_labels(int n, size_t *len)
{
    *len = 8 + (size_t)n;
    unsigned char *b = malloc(*len);
    put_be32(b, 0x00000801);
    put_be32(b + 4, (uint32_t)n);
    for (int i = 0; i < n; i++)
        b[8 + i] = (unsigned char)((i * 3) % 7);
    return b;
}

/* Writes nimg images of 4x3 and nlbl labels, each plain or gzip, to the
 * paths it sets *img and *lbl to (tpath 0 and 1, ".gz" where gzip). */
static void write_pair(bool img_gz, bool lbl_gz, int nimg, int nlbl, const char **img,
                       const char **lbl)
{
    *img = tpath(0, img_gz ? "img.gz" : "img");
    *lbl = tpath(1, lbl_gz ? "lbl.gz" : "lbl");
    size_t li, ll;
    unsigned char *bi = idx_images(nimg, 4, 3, &li);
    unsigned char *bl = idx_labels(nlbl, &ll);
    (img_gz ? write_gz : pscheck_write)(*img, bi, li);
    (lbl_gz ? write_gz : pscheck_write)(*lbl, bl, ll);
    free(bi);
    free(bl);
}

static void check_pair_contents(const struct ps_dataset *ds, int n)
{
    ck_assert_int_eq(ds->n, n);
    ck_assert_int_eq(ds->h, 4);
    ck_assert_int_eq(ds->w, 3);
    ck_assert_int_eq(ds->c, 1);
    ck_assert_int_eq(ds->dim, 12);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(ds->y[i], (i * 3) % 7);
        for (int k = 0; k < 12; k++)
            ck_assert_float_eq(ds->x[i * 12 + k], pixel(i, k) / 255.0f);
    }
}

/* ps_dataset_load_idx of img and lbl, all of them, its message in errbuf. */
static int load(const char *img, const char *lbl, struct ps_dataset *ds)
{
    return ps_dataset_load_idx(img, lbl, 0, ds, errbuf, sizeof errbuf);
}

/* load must fail with rc, its message naming says (a path or a phrase;
 * NULL: any message), and leave nothing to close (data.h). */
static void load_fails(const char *img, const char *lbl, int rc, const char *says)
{
    struct ps_dataset ds;
    ck_assert_int_eq(load(img, lbl, &ds), rc);
    if (says != NULL)
        ck_assert_ptr_nonnull(strstr(errbuf, says));
    ck_assert_ptr_null(ds.x);
}

START_TEST(test_idx_plain_and_gzip)
{
    for (int variant = 0; variant < 4; variant++) {
        bool gi = variant & 1, gl = variant & 2;
        const char *img, *lbl;
        write_pair(gi, gl, 5, 5, &img, &lbl);
        struct ps_dataset ds;
        ck_assert_int_eq(load(img, lbl, &ds), 0);
        check_pair_contents(&ds, 5);
        ck_assert_int_eq(ds.nclasses, 7); /* labels 0 3 6 2 5 */
        ps_dataset_close(&ds);
        ck_assert_ptr_null(ds.x);
    }
}
END_TEST

START_TEST(test_idx_limit)
{
    const char *img, *lbl;
    write_pair(true, true, 5, 5, &img, &lbl);
    struct ps_dataset ds;
    ck_assert_int_eq(ps_dataset_load_idx(img, lbl, 3, &ds, errbuf,
                                         sizeof errbuf), 0);
    check_pair_contents(&ds, 3);
    ps_dataset_close(&ds);
    /* A limit beyond the file is just the whole file. */
    ck_assert_int_eq(ps_dataset_load_idx(img, lbl, 50, &ds, NULL, 0), 0);
    check_pair_contents(&ds, 5);
    ps_dataset_close(&ds);
}
END_TEST

START_TEST(test_idx_missing_file)
{
    const char *img, *lbl;
    write_pair(false, false, 5, 5, &img, &lbl);
    const char *nope = tpath(2, "nope-idx3-ubyte.gz");
    struct ps_dataset ds;
    ck_assert_int_eq(ps_dataset_load_idx(nope, lbl, 0, &ds, errbuf,
                                         sizeof errbuf), -ENOENT);
    ck_assert_ptr_nonnull(strstr(errbuf, nope));
    ck_assert_ptr_null(strchr(errbuf, '\n'));
    ck_assert_int_eq(ps_dataset_load_idx(img, nope, 0, &ds, errbuf,
                                         sizeof errbuf), -ENOENT);
    ck_assert_ptr_nonnull(strstr(errbuf, nope));
    ck_assert_ptr_null(ds.x);
    ps_dataset_close(&ds);
}
END_TEST

START_TEST(test_idx_truncated)
{
    size_t li, ll;
    unsigned char *bi = idx_images(5, 4, 3, &li);
    unsigned char *bl = idx_labels(5, &ll);
    const char *img = tpath(0, "img"), *lbl = tpath(1, "lbl");

    /* Plain pixels cut short. */
    pscheck_write(img, bi, li - 7);
    pscheck_write(lbl, bl, ll);
    load_fails(img, lbl, PS_ECORRUPT, img);
    ck_assert_ptr_nonnull(strstr(errbuf, "truncated"));

    /* Labels cut short. */
    pscheck_write(img, bi, li);
    pscheck_write(lbl, bl, ll - 1);
    load_fails(img, lbl, PS_ECORRUPT, lbl);

    /* A header cut in the middle, and an empty file. */
    pscheck_write(img, bi, 10);
    load_fails(img, lbl, PS_ECORRUPT, img);
    pscheck_write(img, bi, 0);
    load_fails(img, lbl, PS_ECORRUPT, NULL);

    /* A gzip stream cut in the middle: compress a larger file so the cut
     * lands inside the deflate data. */
    free(bi);
    bi = idx_images(400, 28, 28, &li);
    const char *full = tpath(2, "full.gz");
    write_gz(full, bi, li);
    size_t gzlen;
    unsigned char *gzbytes = pscheck_read(full, &gzlen);
    long sz = (long)gzlen;
    const char *cut = tpath(0, "cut.gz");
    pscheck_write(cut, gzbytes, (size_t)sz / 2);
    free(bl);
    bl = idx_labels(400, &ll);
    pscheck_write(lbl, bl, ll);
    load_fails(cut, lbl, PS_ECORRUPT, cut);

    /* Damaged deflate data (not just short) is reported too. */
    for (long i = 40; i < sz - 40; i += 97)
        gzbytes[i] ^= 0x5a;
    pscheck_write(cut, gzbytes, (size_t)sz);
    load_fails(cut, lbl, PS_ECORRUPT, cut);
    free(gzbytes);
    free(bi);
    free(bl);
}
END_TEST

START_TEST(test_idx_wrong_magic)
{
    const char *img, *lbl;
    write_pair(false, true, 5, 5, &img, &lbl);
    /* The files swapped: each has the other's magic. */
    load_fails(lbl, img, PS_EPARSE, lbl);
    ck_assert_ptr_nonnull(strstr(errbuf, "magic 0x00000801"));
    /* Text is not IDX either; neither are float IDX files (type 0x0d). */
    pscheck_write(img, "hello, world\n", 13);
    load_fails(img, lbl, PS_EPARSE, img);
    unsigned char fl[16] = {0, 0, 0x0d, 3};
    pscheck_write(img, fl, sizeof fl);
    load_fails(img, lbl, PS_EPARSE, NULL);
}
END_TEST

START_TEST(test_idx_count_mismatch)
{
    const char *img, *lbl;
    write_pair(true, true, 5, 4, &img, &lbl);
    load_fails(img, lbl, PS_ESHAPE, img);
    ck_assert_ptr_nonnull(strstr(errbuf, lbl));
    ck_assert_ptr_nonnull(strstr(errbuf, "5 images"));
    ck_assert_ptr_nonnull(strstr(errbuf, "4 labels"));
    /* A limit does not hide the mismatch. */
    struct ps_dataset ds;
    ck_assert_int_eq(ps_dataset_load_idx(img, lbl, 2, &ds, NULL, 0),
                     PS_ESHAPE);
}
END_TEST

START_TEST(test_idx_fashion_mnist)
{
    const char *img = PSCHECK_FMNIST_DIR "/t10k-images-idx3-ubyte.gz";
    const char *lbl = PSCHECK_FMNIST_DIR "/t10k-labels-idx1-ubyte.gz";
    if (!pscheck_have_fmnist(img, lbl))
        return;
    /* The whole test set natively; a slice under valgrind. */
    int64_t limit = getenv("PS_UNDER_VALGRIND") != NULL ? 1000 : 0;
    struct ps_dataset ds;
    ck_assert_msg(ps_dataset_load_idx(img, lbl, limit, &ds, errbuf,
                                      sizeof errbuf) == 0, "%s", errbuf);
    ck_assert_int_eq(ds.n, limit > 0 ? limit : 10000);
    ck_assert_int_eq(ds.h, 28);
    ck_assert_int_eq(ds.w, 28);
    ck_assert_int_eq(ds.dim, 784);
    ck_assert_int_eq(ds.nclasses, 10);
    int counts[10] = {0};
    for (int64_t i = 0; i < ds.n; i++) {
        ck_assert(ds.y[i] >= 0 && ds.y[i] < 10);
        counts[ds.y[i]]++;
    }
    for (int k = 0; k < 10; k++)
        ck_assert_int_gt(counts[k], ds.n / 20);
    double sum = 0;
    float lo = 1, hi = 0;
    for (int64_t i = 0; i < ds.n * ds.dim; i++) {
        sum += ds.x[i];
        lo = ds.x[i] < lo ? ds.x[i] : lo;
        hi = ds.x[i] > hi ? ds.x[i] : hi;
    }
    ck_assert_float_eq(lo, 0.0f);
    ck_assert_float_eq(hi, 1.0f);
    /* Fashion-MNIST's mean pixel is about 0.286. */
    double mean = sum / (double)(ds.n * ds.dim);
    ck_assert_double_gt(mean, 0.25);
    ck_assert_double_lt(mean, 0.32);
    ps_dataset_close(&ds);
}
END_TEST

START_TEST(test_gather)
{
    const char *img, *lbl;
    write_pair(false, false, 5, 5, &img, &lbl);
    struct ps_dataset ds;
    ck_assert_int_eq(ps_dataset_load_idx(img, lbl, 0, &ds, NULL, 0), 0);
    int64_t idx[3] = {4, 0, 2};
    float x[3 * 12];
    int32_t y[3];
    ps_dataset_gather(&ds, idx, 3, x, y);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(y[i], ds.y[idx[i]]);
        ck_assert_mem_eq(x + i * 12, ds.x + idx[i] * 12, 12 * sizeof(float));
    }
    ps_dataset_close(&ds);
}
END_TEST

static const char good_svm[] =
    "# a comment line\n"
    "+1 1:0.5 3:-2 10:1e-3\n"
    "\n"
    "-1 qid:7 2:4   # trailing comment\n"
    "   \t\n"
    "0\n"
    "2.5 1:1 2:2 3:3\r\n"
    "3 7:7"; /* no final newline */

static void check_good_svm(const struct ps_sparse_dataset *ds)
{
    ck_assert_int_eq(ds->n, 5);
    ck_assert_int_eq(ds->nnz, 8);
    ck_assert_int_eq(ds->dim, 10);
    const float y[] = {1, -1, 0, 2.5f, 3};
    const int64_t indptr[] = {0, 3, 4, 4, 7, 8};
    const int32_t indices[] = {0, 2, 9, 1, 0, 1, 2, 6};
    const float values[] = {0.5f, -2, 1e-3f, 4, 1, 2, 3, 7};
    for (int i = 0; i < 5; i++)
        ck_assert_float_eq(ds->y[i], y[i]);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(ds->indptr[i], indptr[i]);
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(ds->indices[i], indices[i]);
        ck_assert_float_eq(ds->values[i], values[i]);
    }
}

START_TEST(test_libsvm_good)
{
    const char *plain = tpath(0, "a.svm"), *gz = tpath(1, "a.svm.gz");
    pscheck_write(plain, good_svm, strlen(good_svm));
    write_gz(gz, good_svm, strlen(good_svm));
    struct ps_sparse_dataset ds;
    ck_assert_msg(ps_sparse_load_libsvm(plain, &ds, errbuf, sizeof errbuf) ==
                  0, "%s", errbuf);
    check_good_svm(&ds);
    ps_sparse_dataset_close(&ds);
    ck_assert_ptr_null(ds.indptr);
    ck_assert_msg(ps_sparse_load_libsvm(gz, &ds, errbuf, sizeof errbuf) == 0,
                  "%s", errbuf);
    check_good_svm(&ds);
    ps_sparse_dataset_close(&ds);

    /* An empty file is an empty dataset. */
    pscheck_write(plain, "", 0);
    ck_assert_int_eq(ps_sparse_load_libsvm(plain, &ds, NULL, 0), 0);
    ck_assert_int_eq(ds.n, 0);
    ck_assert_int_eq(ds.indptr[0], 0);
    ps_sparse_dataset_close(&ds);
}
END_TEST

START_TEST(test_libsvm_long_lines)
{
    /* Lines far longer than the reader's first buffer. */
    size_t cap = 1 << 20, len = 0;
    char *text = malloc(cap);
    for (int row = 0; row < 3; row++) {
        len += (size_t)snprintf(text + len, cap - len, "%d", row);
        for (int k = 1; k <= 5000; k++)
            len += (size_t)snprintf(text + len, cap - len, " %d:%d", k * 2,
                                    row + k);
        text[len++] = '\n';
    }
    const char *path = tpath(0, "long.svm");
    pscheck_write(path, text, len);
    free(text);
    struct ps_sparse_dataset ds;
    ck_assert_msg(ps_sparse_load_libsvm(path, &ds, errbuf, sizeof errbuf) ==
                  0, "%s", errbuf);
    ck_assert_int_eq(ds.n, 3);
    ck_assert_int_eq(ds.nnz, 15000);
    ck_assert_int_eq(ds.dim, 10000);
    ck_assert_int_eq(ds.indices[5000 + 4999], 9999);
    ck_assert_float_eq(ds.values[2 * 5000 + 9], 2 + 10);
    ps_sparse_dataset_close(&ds);
}
END_TEST

/* Each malformed line must give `code` and a message naming the file and
 * line 3. */
static void expect_bad_line(const char *line, int code, const char *needle)
{
    char text[256];
    snprintf(text, sizeof text, "1 1:1\n# ok\n%s\n0 2:2\n", line);
    const char *path = tpath(0, "bad.svm");
    pscheck_write(path, text, strlen(text));
    struct ps_sparse_dataset ds;
    errbuf[0] = '\0';
    int rc = ps_sparse_load_libsvm(path, &ds, errbuf, sizeof errbuf);
    ck_assert_msg(rc == code, "line '%s': got %s (%s), want %s", line,
                  ps_errname(rc), errbuf, ps_errname(code));
    char where[160];
    snprintf(where, sizeof where, "%s:3:", path);
    ck_assert_msg(strstr(errbuf, where) != NULL, "'%s' lacks '%s'", errbuf,
                  where);
    ck_assert_msg(needle == NULL || strstr(errbuf, needle) != NULL,
                  "'%s' lacks '%s'", errbuf, needle);
    ck_assert_ptr_null(strchr(errbuf, '\n'));
    ck_assert_ptr_null(ds.indptr);
    ck_assert_int_eq(ds.n, 0);
}

START_TEST(test_libsvm_malformed)
{
    expect_bad_line("abc 1:2", PS_EPARSE, "label");
    expect_bad_line("1 1:2 3", PS_EPARSE, "'3'");
    expect_bad_line("1 1:2 x:3", PS_EPARSE, "'x:3'");
    expect_bad_line("1 4:", PS_EPARSE, "'4:'");
    expect_bad_line("1 4:1.5x", PS_EPARSE, NULL);
    expect_bad_line("1 0:1", PS_EPARSE, "outside");
    expect_bad_line("1 -3:1", PS_EPARSE, "outside");
    expect_bad_line("1 99999999999:1", PS_EPARSE, "outside");
    expect_bad_line("1 3:1 2:1", PS_EPARSE, "ascending");
    expect_bad_line("1 3:1 3:1", PS_EPARSE, "ascending");
    expect_bad_line("1 1:nan", PS_ENONFINITE, NULL);
    expect_bad_line("inf 1:1", PS_ENONFINITE, NULL);
    expect_bad_line("1 2:1e99", PS_ENONFINITE, NULL);
}
END_TEST

START_TEST(test_libsvm_missing_and_damaged)
{
    struct ps_sparse_dataset ds;
    const char *nope = tpath(0, "nope.svm");
    ck_assert_int_eq(ps_sparse_load_libsvm(nope, &ds, errbuf, sizeof errbuf),
                     -ENOENT);
    ck_assert_ptr_nonnull(strstr(errbuf, nope));
    /* A directory cannot be read as a file. */
    ck_assert_int_lt(ps_sparse_load_libsvm(tmpdir, &ds, errbuf,
                                           sizeof errbuf), 0);
    ck_assert_ptr_nonnull(strstr(errbuf, tmpdir));

    /* A truncated gzip file. */
    size_t cap = 1 << 18, len = 0;
    char *text = malloc(cap);
    for (int row = 0; len + 64 < cap; row++)
        len += (size_t)snprintf(text + len, cap - len, "%d 1:%d 5:%d\n",
                                row % 2, row * 7919 % 1000, row);
    const char *full = tpath(1, "full.svm.gz");
    write_gz(full, text, len);
    free(text);
    struct stat st;
    ck_assert_int_eq(stat(full, &st), 0);
    ck_assert_int_eq(truncate(full, st.st_size / 2), 0);
    ck_assert_int_eq(ps_sparse_load_libsvm(full, &ds, errbuf, sizeof errbuf),
                     PS_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(errbuf, full));
}
END_TEST

START_TEST(test_sparse_gather_dense)
{
    const char *path = tpath(0, "a.svm");
    pscheck_write(path, good_svm, strlen(good_svm));
    struct ps_sparse_dataset ds;
    ck_assert_int_eq(ps_sparse_load_libsvm(path, &ds, NULL, 0), 0);
    int64_t idx[2] = {3, 0};
    float x[2 * 10], y[2];
    ck_assert_int_eq(ps_sparse_gather_dense(&ds, idx, 2, 10, x, y), 0);
    const float want[20] = {1, 2, 3, 0, 0, 0, 0, 0, 0, 0,
                            0.5f, 0, -2, 0, 0, 0, 0, 0, 0, 1e-3f};
    for (int i = 0; i < 20; i++)
        ck_assert_float_eq(x[i], want[i]);
    ck_assert_float_eq(y[0], 2.5f);
    ck_assert_float_eq(y[1], 1.0f);
    /* Row 0 has feature 10, which does not fit in 8 columns. */
    ck_assert_int_eq(ps_sparse_gather_dense(&ds, idx, 2, 8, x, y), PS_ESHAPE);
    ps_sparse_dataset_close(&ds);
}
END_TEST

/* The policy ps_shard_files gives, which must succeed; the files in sel,
 * their count in *n. */
static enum ps_shard_policy shard(size_t nfiles, int worker, int nworkers, size_t *sel,
                                  size_t *n)
{
    enum ps_shard_policy pol;
    ck_assert_int_eq(ps_shard_files(nfiles, worker, nworkers, sel, n, &pol), 0);
    return pol;
}

START_TEST(test_shard_files)
{
    size_t sel[8], n;
    enum ps_shard_policy pol;
    /* Enough files: by file, round robin, disjoint and covering. */
    int seen[5] = {0};
    for (int w = 0; w < 2; w++) {
        ck_assert_int_eq(shard(5, w, 2, sel, &n), PS_SHARD_BY_FILE);
        ck_assert_uint_eq(n, w == 0 ? 3 : 2);
        for (size_t k = 0; k < n; k++) {
            ck_assert_uint_eq(sel[k], (size_t)w + 2 * k);
            seen[sel[k]]++;
        }
    }
    for (int f = 0; f < 5; f++)
        ck_assert_int_eq(seen[f], 1);
    /* As many files as workers: one each. */
    ck_assert_int_eq(shard(3, 2, 3, sel, &n), PS_SHARD_BY_FILE);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(sel[0], 2);
    /* One file, or fewer files than workers: every file, by example. */
    ck_assert_int_eq(shard(1, 1, 4, sel, &n), PS_SHARD_BY_EXAMPLE);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(shard(3, 0, 4, sel, &n), PS_SHARD_BY_EXAMPLE);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(sel[2], 2);
    /* A single worker with one file is trivially by example. */
    ck_assert_int_eq(shard(1, 0, 1, sel, &n), PS_SHARD_BY_EXAMPLE);
    ck_assert_int_eq(ps_shard_files(0, 0, 1, sel, &n, &pol), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_shard_files(2, 2, 2, sel, &n, &pol), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_shard_files(2, -1, 2, sel, &n, &pol), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_shard_files(2, 0, 0, sel, &n, &pol), PS_EINVAL_ARG);
}
END_TEST

START_TEST(test_shard_count)
{
    for (int64_t n = 0; n < 40; n++) {
        for (int workers = 1; workers < 9; workers++) {
            int64_t total = 0;
            for (int w = 0; w < workers; w++) {
                int64_t c = ps_shard_count(n, w, workers);
                int64_t want = 0;
                for (int64_t i = w; i < n; i += workers)
                    want++;
                ck_assert_int_eq(c, want);
                total += c;
            }
            ck_assert_int_eq(total, n);
        }
    }
    ck_assert_int_eq(ps_shard_count(10, 3, 3), 0);
}
END_TEST

START_TEST(test_batch_sizes)
{
    int g = 0, r = 0;
    ck_assert_int_eq(ps_batch_global(64, 4, &g), 0);
    ck_assert_int_eq(g, 256);
    ck_assert_int_eq(ps_batch_per_replica(256, 4, &r), 0);
    ck_assert_int_eq(r, 64);
    ck_assert_int_eq(ps_batch_global(0, 4, &g), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_batch_global(1 << 20, 1 << 12, &g), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_batch_per_replica(100, 3, &r), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_batch_per_replica(100, 0, &r), PS_EINVAL_ARG);
}
END_TEST

static bool same(const int64_t *a, const int64_t *b, int64_t n)
{
    return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

START_TEST(test_shuffle)
{
    enum { N = 1000 };
    static int64_t a[N], b[N], c[N];
    for (int i = 0; i < N; i++)
        a[i] = b[i] = c[i] = i;
    ps_shuffle(a, N, 7, 0);
    ps_shuffle(b, N, 7, 0);
    ps_shuffle(c, N, 7, 1);
    ck_assert(same(a, b, N));
    ck_assert(!same(a, c, N));
    int hits[N] = {0};
    int fixed = 0;
    for (int i = 0; i < N; i++) {
        hits[a[i]]++;
        fixed += a[i] == i;
    }
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(hits[i], 1);
    ck_assert_int_lt(fixed, 10); /* a random permutation fixes ~1 point */
    for (int i = 0; i < N; i++)
        b[i] = i;
    ps_shuffle(b, N, 8, 0);
    ck_assert(!same(a, b, N));
    /* Tiny inputs are fine. */
    ps_shuffle(a, 0, 1, 1);
    ps_shuffle(a, 1, 1, 1);
}
END_TEST

START_TEST(test_batcher_shards_cover)
{
    /* Every example in exactly one shard, per epoch, for awkward sizes. */
    const int64_t sizes[] = {0, 1, 7, 100, 1001};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int64_t n = sizes[s];
        for (int workers = 1; workers <= 5; workers++) {
            int *hits = calloc((size_t)n + 1, sizeof *hits);
            for (int w = 0; w < workers; w++) {
                struct ps_batcher b;
                ck_assert_int_eq(ps_batcher_init(&b, n, w, workers, 16,
                                                 PS_BATCH_SHUFFLE, 3), 0);
                ps_batcher_start_epoch(&b, 2);
                const int64_t *idx;
                int k;
                int64_t steps = 0;
                while ((k = ps_batcher_next(&b, &idx)) > 0) {
                    ck_assert_int_le(k, 16);
                    steps++;
                    for (int i = 0; i < k; i++) {
                        ck_assert(idx[i] >= 0 && idx[i] < n);
                        ck_assert_int_eq(idx[i] % workers, w);
                        hits[idx[i]]++;
                    }
                }
                ck_assert_int_eq(steps, ps_batcher_steps(&b));
                ck_assert_int_eq(ps_batcher_next(&b, &idx), 0);
                ps_batcher_close(&b);
            }
            for (int64_t i = 0; i < n; i++)
                ck_assert_int_eq(hits[i], 1);
            free(hits);
        }
    }
}
END_TEST

/* Copies one epoch's order out of b. */
static void epoch_order(struct ps_batcher *b, uint64_t epoch, int64_t *out)
{
    ps_batcher_start_epoch(b, epoch);
    const int64_t *idx;
    int k;
    int64_t pos = 0;
    while ((k = ps_batcher_next(b, &idx)) > 0) {
        memcpy(out + pos, idx, (size_t)k * sizeof *idx);
        pos += k;
    }
    ck_assert_int_eq(pos, b->count);
}

START_TEST(test_batcher_epochs)
{
    enum { N = 300 };
    static int64_t e0[N], e1[N], again[N], other[N], plain[N];
    struct ps_batcher b, b2, b3;
    ck_assert_int_eq(ps_batcher_init(&b, N, 0, 1, 32, PS_BATCH_SHUFFLE, 11),
                     0);
    ck_assert_int_eq(ps_batcher_init(&b2, N, 0, 1, 7, PS_BATCH_SHUFFLE, 11),
                     0);
    ck_assert_int_eq(ps_batcher_init(&b3, N, 0, 1, 32, 0, 11), 0);
    epoch_order(&b, 0, e0);
    epoch_order(&b, 1, e1);
    ck_assert(!same(e0, e1, N));
    /* The order is a function of (seed, epoch) only: not of the epochs
     * walked before, nor of the batch size, nor of the batcher. */
    epoch_order(&b, 5, again);
    epoch_order(&b, 0, again);
    ck_assert(same(e0, again, N));
    epoch_order(&b2, 1, other);
    ck_assert(same(e1, other, N));
    /* Without PS_BATCH_SHUFFLE the shard is walked in order. */
    epoch_order(&b3, 4, plain);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(plain[i], i);
    ps_batcher_close(&b);
    ps_batcher_close(&b2);
    ps_batcher_close(&b3);
    /* Another seed, another order. */
    ck_assert_int_eq(ps_batcher_init(&b, N, 0, 1, 32, PS_BATCH_SHUFFLE, 12),
                     0);
    epoch_order(&b, 0, other);
    ck_assert(!same(e0, other, N));
    ps_batcher_close(&b);
}
END_TEST

START_TEST(test_batcher_remainder)
{
    struct ps_batcher b;
    const int64_t *idx;
    ck_assert_int_eq(ps_batcher_init(&b, 10, 0, 1, 4, 0, 0), 0);
    ck_assert_int_eq(ps_batcher_steps(&b), 3);
    ck_assert_int_eq(ps_batcher_next(&b, &idx), 4);
    ck_assert_int_eq(ps_batcher_next(&b, &idx), 4);
    ck_assert_int_eq(ps_batcher_next(&b, &idx), 2);
    ck_assert_int_eq(idx[1], 9);
    ck_assert_int_eq(ps_batcher_next(&b, &idx), 0);
    ps_batcher_close(&b);
    ck_assert_int_eq(ps_batcher_init(&b, 10, 0, 1, 4,
                                     PS_BATCH_DROP_REMAINDER, 0), 0);
    ck_assert_int_eq(ps_batcher_steps(&b), 2);
    ck_assert_int_eq(ps_batcher_next(&b, &idx), 4);
    ck_assert_int_eq(ps_batcher_next(&b, &idx), 4);
    ck_assert_int_eq(ps_batcher_next(&b, &idx), 0);
    ps_batcher_close(&b);
    ck_assert_int_eq(ps_batcher_init(&b, 10, 0, 1, 0, 0, 0), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_batcher_init(&b, 10, 3, 3, 4, 0, 0), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_batcher_init(&b, -1, 0, 1, 4, 0, 0), PS_EINVAL_ARG);
    ps_batcher_close(NULL);
}
END_TEST

PSCHECK_MAIN("data",
    {"ps_dataset_load_idx", {test_idx_plain_and_gzip, test_idx_limit, test_idx_missing_file,
                             test_idx_truncated, test_idx_wrong_magic, test_idx_count_mismatch,
                             test_idx_fashion_mnist}, &pscheck_tmp},
    {"ps_dataset_gather", {test_gather}, &pscheck_tmp},
    {"ps_sparse_load_libsvm", {test_libsvm_good, test_libsvm_long_lines, test_libsvm_malformed,
                               test_libsvm_missing_and_damaged}, &pscheck_tmp},
    {"ps_sparse_gather_dense", {test_sparse_gather_dense}, &pscheck_tmp},
    {"ps_shard_files", {test_shard_files}},
    {"ps_shard_count", {test_shard_count}},
    {"ps_batch_global", {test_batch_sizes}},
    {"ps_shuffle", {test_shuffle}},
    {"ps_batcher", {test_batcher_shards_cover, test_batcher_epochs, test_batcher_remainder}})
