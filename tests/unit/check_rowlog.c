/* The row log's files (server/rowlog.h): batches written and walked back,
 * a torn or corrupt batch ending its file, seal and reset. */
#include "server/rowlog.h"

#include "common/errors.h"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

/* A batch of n records of table var, ids first..first+n-1, each a 24-byte
 * row whose bytes are (id + k). */
static size_t batch(uint8_t *p, uint32_t var, int64_t first, uint32_t n)
{
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        int64_t id = first + i;
        uint32_t len = 24;
        memcpy(p + off, &var, 4);
        memcpy(p + off + 4, &len, 4);
        memcpy(p + off + 8, &id, 8);
        for (uint32_t k = 0; k < len; k++)
            p[off + 16 + k] = (uint8_t)(id + k);
        off += 16 + len;
    }
    return off;
}

struct seen {
    int n;
    uint64_t seqs[64];
    int64_t ids[64];
    int bad;
    int ended;
};

static int see(void *ctx, uint64_t seq, uint32_t var_id, int64_t id, const uint8_t *d,
               uint32_t len)
{
    struct seen *s = ctx;
    for (uint32_t k = 0; k < len; k++)
        if (d[k] != (uint8_t)(id + k))
            s->bad++;
    if (var_id != 7 || len != 24)
        s->bad++;
    if (s->n < 64) {
        s->seqs[s->n] = seq;
        s->ids[s->n] = id;
    }
    s->n++;
    return 0;
}

static int end(void *ctx)
{
    ((struct seen *)ctx)->ended++;
    return 0;
}

static char path0[PATH_MAX];

/* Walks file `which` of l past `after` and checks that it gave n rows and
 * ended at batch `last`; returns what it saw. */
static struct seen walk_expect(psd_rowlog *l, int which, uint64_t after, bool with_end, int n,
                               uint64_t last)
{
    struct seen s = {0};
    uint64_t got = 0;
    ck_assert_int_eq(psd_rowlog_walk(l, which, after, see, with_end ? end : NULL, &s, &got), 0);
    ck_assert_int_eq(s.n, n);
    ck_assert_uint_eq(got, last);
    return s;
}

static psd_rowlog *three_batches(void)
{
    psd_rowlog *l = NULL;
    ck_assert_int_eq(psd_rowlog_open(tmpdir, &l), 0);
    uint8_t buf[4096];
    for (uint64_t seq = 1; seq <= 3; seq++) {
        size_t len = batch(buf, 7, (int64_t)seq * 10, 2);
        ck_assert_int_eq(psd_rowlog_append(l, seq, buf, len, 2), 0);
    }
    snprintf(path0, sizeof path0, "%s/rows.log.%d", tmpdir, psd_rowlog_active(l));
    return l;
}

START_TEST(test_roundtrip)
{
    psd_rowlog *l = three_batches();
    /* batches 2 and 3: after 1 */
    struct seen s = walk_expect(l, psd_rowlog_active(l), 1, true, 4, 3);
    ck_assert_int_eq(s.bad, 0);
    ck_assert_int_eq(s.ended, 1);
    ck_assert_uint_eq(s.seqs[0], 2);
    ck_assert_int_eq(s.ids[0], 20);
    ck_assert_int_eq(s.ids[3], 31);
    psd_rowlog_destroy(l);
    /* Reopened: the same batches. */
    ck_assert_int_eq(psd_rowlog_open(tmpdir, &l), 0);
    walk_expect(l, strstr(path0, "rows.log.0") ? 0 : 1, 0, false, 6, 3);
    psd_rowlog_destroy(l);
}
END_TEST

/* A batch cut short (a crash during its write) or with a flipped byte ends
 * the file: the batches before it are read, nothing after. */
START_TEST(test_torn_and_corrupt)
{
    psd_rowlog *l = three_batches();
    psd_rowlog_destroy(l);
    struct stat st;
    ck_assert_int_eq(stat(path0, &st), 0);
    ck_assert_int_eq(truncate(path0, st.st_size - 5), 0);
    ck_assert_int_eq(psd_rowlog_open(tmpdir, &l), 0);
    int which = strstr(path0, "rows.log.0") ? 0 : 1;
    struct seen s = walk_expect(l, which, 0, true, 4, 2);
    ck_assert_int_eq(s.ended, 1);
    psd_rowlog_destroy(l);
    /* A byte of batch 2's payload flipped: batch 1 alone. */
    int fd = open(path0, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t b;
    off_t at = 24 + 2 * 40 + 24 + 30;
    ck_assert_int_eq(pread(fd, &b, 1, at), 1);
    b ^= 0x40;
    ck_assert_int_eq(pwrite(fd, &b, 1, at), 1);
    close(fd);
    ck_assert_int_eq(psd_rowlog_open(tmpdir, &l), 0);
    s = walk_expect(l, which, 0, false, 2, 1);
    ck_assert_int_eq(s.bad, 0);
    psd_rowlog_destroy(l);
}
END_TEST

/* Seal: appends go to the other file until the sealed one is reset. */
START_TEST(test_seal_reset)
{
    psd_rowlog *l = three_batches();
    int a = psd_rowlog_active(l);
    ck_assert_uint_gt(psd_rowlog_bytes(l, a), 0);
    ck_assert_int_eq(psd_rowlog_seal(l), a);
    ck_assert_int_eq(psd_rowlog_active(l), !a);
    ck_assert_int_eq(psd_rowlog_seal(l), -1); /* the new active one is empty */
    uint8_t buf[256];
    size_t len = batch(buf, 7, 100, 1);
    ck_assert_int_eq(psd_rowlog_append(l, 4, buf, len, 1), 0);
    ck_assert_int_eq(psd_rowlog_seal(l), -1); /* the sealed one is not applied yet */
    walk_expect(l, !a, 0, false, 1, 4);
    ck_assert_int_eq(psd_rowlog_reset(l, a), 0);
    ck_assert_uint_eq(psd_rowlog_bytes(l, a), 0);
    ck_assert_uint_eq(psd_rowlog_total(l), 24 + 40);
    ck_assert_int_eq(psd_rowlog_seal(l), !a);
    psd_rowlog_destroy(l);
}
END_TEST

/* A file written again from its start after a reset: a reopened walk reads
 * the new batches and stops at the older ones after them. */
START_TEST(test_reuse)
{
    psd_rowlog *l = three_batches();
    int a = psd_rowlog_active(l);
    ck_assert_int_eq(psd_rowlog_seal(l), a);
    ck_assert_int_eq(psd_rowlog_reset(l, a), 0);
    uint8_t buf[4096];
    size_t len = batch(buf, 7, 200, 1);
    ck_assert_int_eq(psd_rowlog_append(l, 4, buf, len, 1), 0); /* to !a */
    ck_assert_int_eq(psd_rowlog_seal(l), !a);
    len = batch(buf, 7, 300, 1);
    ck_assert_int_eq(psd_rowlog_append(l, 5, buf, len, 1), 0); /* over a's batch 1 */
    psd_rowlog_destroy(l);
    ck_assert_int_eq(psd_rowlog_open(tmpdir, &l), 0);
    /* batch 5; then batch 2 (older): the end */
    struct seen s = walk_expect(l, a, 0, false, 1, 5);
    ck_assert_int_eq(s.ids[0], 300);
    ck_assert_int_eq(s.bad, 0);
    psd_rowlog_destroy(l);
}
END_TEST

/* Pages of file `path` in the page cache (mincore through a mapping). */
static size_t resident(const char *path)
{
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    long pg = sysconf(_SC_PAGESIZE);
    size_t npages = ((size_t)st.st_size + (size_t)pg - 1) / (size_t)pg, n = 0;
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(m, MAP_FAILED);
    unsigned char *vec = malloc(npages);
    ck_assert_int_eq(mincore(m, (size_t)st.st_size, vec), 0);
    for (size_t i = 0; i < npages; i++)
        n += vec[i] & 1;
    free(vec);
    munmap(m, (size_t)st.st_size);
    close(fd);
    return n;
}

/* A reset file leaves the page cache (its pages would crowd out LMDB's in
 * a memory cgroup); its blocks stay, and the next batches write over it. */
START_TEST(test_reset_drops_pages)
{
    psd_rowlog *l = NULL;
    ck_assert_int_eq(psd_rowlog_open(tmpdir, &l), 0);
    int a = psd_rowlog_active(l);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/rows.log.%d", tmpdir, a);
    static uint8_t buf[40 * 1000];
    for (uint64_t seq = 1; seq <= 50; seq++) { /* ~2 MB */
        size_t len = batch(buf, 7, (int64_t)seq * 1000, 1000);
        ck_assert_int_eq(psd_rowlog_append(l, seq, buf, len, 1000), 0);
    }
    struct statfs fs;
    ck_assert_int_eq(statfs(tmpdir, &fs), 0);
    if (fs.f_type == TMPFS_MAGIC) {
        /* tmpfs pages are the file: nothing to drop. */
        printf("rowlog: %s is on tmpfs, the page-cache check is skipped\n", tmpdir);
        psd_rowlog_destroy(l);
        return;
    }
    size_t before = resident(path);
    ck_assert_uint_gt(before, 200); /* just written: cached */
    ck_assert_int_eq(psd_rowlog_seal(l), a);
    ck_assert_int_eq(psd_rowlog_reset(l, a), 0);
    /* The kernel may keep a few it cannot drop at once (4 of ~490 seen
     * under valgrind): not the file. */
    ck_assert_uint_le(resident(path), before / 20);
    size_t len = batch(buf, 7, 5, 1); /* written at the start again */
    ck_assert_int_eq(psd_rowlog_append(l, 51, buf, len, 1), 0); /* to !a */
    ck_assert_int_eq(psd_rowlog_seal(l), !a);
    ck_assert_int_eq(psd_rowlog_append(l, 52, buf, len, 1), 0); /* to a */
    struct seen s = walk_expect(l, a, 0, false, 1, 52);
    ck_assert_int_eq(s.bad, 0);
    psd_rowlog_destroy(l);
}
END_TEST

/* A batch whose sequence number does not grow is not this log's. */
START_TEST(test_seq_must_grow)
{
    psd_rowlog *l = three_batches();
    uint8_t buf[256];
    size_t len = batch(buf, 7, 5, 1);
    ck_assert_int_eq(psd_rowlog_append(l, 2, buf, len, 1), 0);
    walk_expect(l, psd_rowlog_active(l), 0, false, 6, 3);
    psd_rowlog_destroy(l);
}
END_TEST

PSCHECK_MAIN("rowlog",
    {"psd_rowlog_append", {test_roundtrip, test_seq_must_grow}, &pscheck_tmp},
    {"psd_rowlog_walk", {test_torn_and_corrupt}, &pscheck_tmp},
    {"psd_rowlog_seal", {test_seal_reset}, &pscheck_tmp},
    {"psd_rowlog_reset", {test_reuse, test_reset_drops_pages}, &pscheck_tmp})
