/* The segment files of sparse rows (server/segment.h) in a real temporary
 * directory: rows appended, synced and read back in one batch through
 * io_uring; segments sealed and reopened; a truncated or corrupt segment
 * refused with its file and offset; a full disk leaving nothing of a batch. */
#include "server/segment.h"

#include "common/errors.h"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define ROW 530 /* bytes of a stored row: 16 of head, 514 of body */

static char segdir[256];

static const char *dir_of(void)
{
    snprintf(segdir, sizeof segdir, "%s/segments", tmpdir);
    return segdir;
}

/* Row id's bytes at version v. */
static void fill(uint8_t *p, int64_t id, uint64_t v)
{
    for (int k = 0; k < ROW; k++)
        p[k] = (uint8_t)(id * 31 + (int64_t)v * 7 + k);
}

/* Appends rows first..first+n-1 at version v and syncs them. */
static void put_rows(psd_segs *s, int64_t first, size_t n, uint64_t v, psd_seg_loc *locs)
{
    uint8_t row[ROW];
    for (size_t i = 0; i < n; i++) {
        int64_t id = first + (int64_t)i;
        fill(row, id, v);
        ck_assert_int_eq(psd_segs_append(s, 3, id, v, row, 16, row + 16, ROW - 16, &locs[i]),
                         0);
    }
    ck_assert_int_eq(psd_segs_sync(s), 0);
}

/* Reads rows first..first+n-1 at locs in one batch, in a shuffled order,
 * and checks each against version v. */
static void check_rows(psd_segs *s, int64_t first, size_t n, uint64_t v,
                       const psd_seg_loc *locs)
{
    psd_seg_read *rq = calloc(n, sizeof *rq);
    uint8_t *out = malloc(n * ROW), want[ROW];
    ck_assert_ptr_nonnull(rq);
    ck_assert_ptr_nonnull(out);
    for (size_t i = 0; i < n; i++) {
        size_t j = (i * 7919) % n; /* n not a multiple of 7919 */
        rq[i] = (psd_seg_read){.loc = locs[j], .var_id = 3, .id = first + (int64_t)j,
                               .dst = out + i * ROW, .cap = ROW};
    }
    ck_assert_int_eq(psd_segs_read(s, rq, n), 0);
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(rq[i].rc, 0);
        ck_assert_uint_eq(rq[i].version, v);
        fill(want, rq[i].id, v);
        ck_assert_mem_eq(out + i * ROW, want, ROW);
    }
    free(rq);
    free(out);
}

static psd_segs *open_ok(uint64_t seg_max)
{
    psd_segs *s = NULL;
    char why[512] = "";
    int rc = psd_segs_open(dir_of(), seg_max, NULL, &s, why, sizeof why);
    ck_assert_msg(rc == 0, "open: %s (%s)", why, ps_strerror(rc));
    return s;
}

static uint64_t file_size(uint32_t n)
{
    char p[512];
    snprintf(p, sizeof p, "%s/seg-%08u.psg", dir_of(), n);
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    return (uint64_t)st.st_size;
}

/* More rows than the ring is deep, read back in one call, each its own
 * aligned read. */
START_TEST(test_roundtrip)
{
    psd_segs *s = open_ok(0);
    size_t n = 1000;
    psd_seg_loc *locs = calloc(n, sizeof *locs);
    put_rows(s, -500, n, 1, locs);
    ck_assert_uint_eq(locs[0].off, PSD_SEG_FILE_HEAD);
    ck_assert_uint_eq(locs[1].off, locs[0].off + PSD_SEG_REC_HEAD + ROW);
    ck_assert_uint_eq(file_size(1), PSD_SEG_FILE_HEAD + n * (PSD_SEG_REC_HEAD + ROW));
    ck_assert_uint_ge(psd_segs_align(s), 512);
    check_rows(s, -500, n, 1, locs);
    /* A newer version of the same rows: both stay readable where they are. */
    psd_seg_loc *locs2 = calloc(n, sizeof *locs2);
    put_rows(s, -500, n, 2, locs2);
    check_rows(s, -500, n, 2, locs2);
    check_rows(s, -500, n, 1, locs);
    free(locs);
    free(locs2);
    psd_segs_close(s);
}
END_TEST

/* A segment past seg_max is sealed at the next batch; a reopen appends to
 * the newest one and reads the old ones. */
START_TEST(test_seal_reopen)
{
    psd_segs *s = open_ok(8192);
    psd_seg_loc locs[40];
    for (int b = 0; b < 4; b++)
        put_rows(s, b * 10, 10, 1, locs + b * 10);
    ck_assert_uint_eq(locs[0].seg, 1);
    ck_assert_uint_eq(locs[10].seg, 1);
    ck_assert_uint_eq(locs[20].seg, 2); /* 10 rows are 5620 bytes: 2 batches a segment */
    ck_assert_uint_eq(locs[39].seg, 2);
    psd_segs_close(s);
    /* a segment a crash left before its rename: not one, removed */
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s/seg-%08u.psg.tmp", dir_of(), 7u);
    int fd = open(tmp, O_WRONLY | O_CREAT, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    s = open_ok(8192); /* seg 2 is past seg_max: a new one takes appends */
    ck_assert_int_ne(access(tmp, F_OK), 0);
    ck_assert_uint_eq(psd_segs_current(s), 3);
    psd_seg_loc more[10];
    put_rows(s, 40, 10, 1, more);
    ck_assert_uint_eq(more[0].seg, 3);
    check_rows(s, 0, 40, 1, locs);
    check_rows(s, 40, 10, 1, more);
    psd_segs_close(s);
}
END_TEST

/* A row read where the catalog says, but not the row it names, is refused. */
START_TEST(test_wrong_row)
{
    psd_segs *s = open_ok(0);
    psd_seg_loc locs[2];
    put_rows(s, 1, 2, 1, locs);
    uint8_t out[ROW];
    psd_seg_read rq = {.loc = locs[0], .var_id = 3, .id = 2, .dst = out, .cap = ROW};
    ck_assert_int_eq(psd_segs_read(s, &rq, 1), PS_ECORRUPT);
    ck_assert_int_eq(rq.rc, PS_ECORRUPT);
    rq = (psd_seg_read){.loc = locs[0], .var_id = 4, .id = 1, .dst = out, .cap = ROW};
    ck_assert_int_eq(psd_segs_read(s, &rq, 1), PS_ECORRUPT);
    psd_segs_close(s);
}
END_TEST

static void flip_byte(uint32_t seg, uint64_t off)
{
    char p[512];
    snprintf(p, sizeof p, "%s/seg-%08u.psg", dir_of(), seg);
    int fd = open(p, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t b;
    ck_assert_int_eq(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x40;
    ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

/* A segment cut short: the open is refused, naming the file and the offset
 * of the record cut. */
START_TEST(test_truncated_refused)
{
    psd_segs *s = open_ok(0);
    psd_seg_loc locs[5];
    put_rows(s, 1, 5, 1, locs);
    psd_segs_close(s);
    char p[512];
    snprintf(p, sizeof p, "%s/seg-%08u.psg", dir_of(), 1u);
    ck_assert_int_eq(truncate(p, (off_t)(file_size(1) - 7)), 0);
    char why[512] = "", want[600];
    ck_assert_int_eq(psd_segs_open(dir_of(), 0, NULL, &s, why, sizeof why), PS_ECORRUPT);
    snprintf(want, sizeof want, "segment %s: offset %llu: truncated record", p,
             (unsigned long long)locs[4].off);
    ck_assert_str_eq(why, want);
    /* and a file whose header is cut */
    ck_assert_int_eq(truncate(p, 5), 0);
    ck_assert_int_eq(psd_segs_open(dir_of(), 0, NULL, &s, why, sizeof why), PS_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(why, "offset 0: truncated file header"));
}
END_TEST

/* After a kill, bytes past the committed end (a batch never acknowledged)
 * are cut and newer segments removed; a segment that lost committed bytes
 * is refused. */
START_TEST(test_committed_end)
{
    psd_segs *s = open_ok(8192);
    psd_seg_loc a[10], b[10], c[10];
    put_rows(s, 0, 10, 1, a);
    put_rows(s, 10, 10, 1, b);
    psd_seg_loc end = psd_segs_end(s);
    ck_assert_uint_eq(end.seg, 1);
    put_rows(s, 20, 10, 1, c); /* seg 2: "never committed" */
    ck_assert_uint_eq(c[0].seg, 2);
    psd_segs_close(s);
    char p[512];
    snprintf(p, sizeof p, "%s/seg-%08u.psg", dir_of(), 1u);
    int fd = open(p, O_WRONLY | O_APPEND);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "torn", 4), 4); /* a torn batch */
    close(fd);
    char why[512] = "";
    ck_assert_int_eq(psd_segs_open(dir_of(), 8192, &end, &s, why, sizeof why), 0);
    ck_assert_uint_eq(file_size(1), end.off);
    /* seg 2 was removed; seg 1 being past seg_max, a new one is empty */
    ck_assert_uint_eq(file_size(2), PSD_SEG_FILE_HEAD);
    check_rows(s, 0, 10, 1, a);
    check_rows(s, 10, 10, 1, b);
    psd_segs_close(s);
    /* committed rows missing */
    snprintf(p, sizeof p, "%s/seg-%08u.psg", dir_of(), 1u);
    ck_assert_int_eq(truncate(p, (off_t)b[5].off), 0);
    ck_assert_int_eq(psd_segs_open(dir_of(), 8192, &end, &s, why, sizeof why), PS_ECORRUPT);
    char want[128];
    snprintf(want, sizeof want, "offset %llu: truncated (committed rows end at %llu)",
             (unsigned long long)b[5].off, (unsigned long long)end.off);
    ck_assert_msg(strstr(why, want) != NULL, "%s", why);
}
END_TEST

/* A flipped byte: refused at open with the record's offset; and a read of
 * a record corrupted after the open is refused, not served. */
START_TEST(test_corrupt_refused)
{
    psd_segs *s = open_ok(0);
    psd_seg_loc locs[5];
    put_rows(s, 1, 5, 1, locs);
    flip_byte(1, locs[2].off + PSD_SEG_REC_HEAD + 100);
    uint8_t out[ROW];
    psd_seg_read rq = {.loc = locs[2], .var_id = 3, .id = 3, .dst = out, .cap = ROW};
    ck_assert_int_eq(psd_segs_read(s, &rq, 1), PS_ECORRUPT);
    ck_assert_int_eq(rq.rc, PS_ECORRUPT);
    check_rows(s, 4, 2, 1, locs + 3); /* its neighbours are sound */
    psd_segs_close(s);
    char why[512] = "";
    ck_assert_int_eq(psd_segs_open(dir_of(), 0, NULL, &s, why, sizeof why), PS_ECORRUPT);
    char want[64];
    snprintf(want, sizeof want, "offset %llu: record checksum mismatch",
             (unsigned long long)locs[2].off);
    ck_assert_msg(strstr(why, want) != NULL && strstr(why, "seg-00000001.psg") != NULL,
                  "%s", why);
}
END_TEST

/* No room for a batch (the file size limit stands in for a full disk):
 * PS_EFULL, the segment ends where it did, what was there reads back, and
 * with room again the next batch lands and the directory opens clean. */
START_TEST(test_full_disk)
{
    signal(SIGXFSZ, SIG_IGN);
    psd_segs *s = open_ok(0);
    psd_seg_loc locs[10], big[200];
    put_rows(s, 1, 10, 1, locs);
    uint64_t before = file_size(1);
    struct rlimit old, lim;
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = before + 20000; /* room for part of the batch only */
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    uint8_t row[ROW];
    for (int i = 0; i < 200; i++) {
        fill(row, 100 + i, 1);
        ck_assert_int_eq(psd_segs_append(s, 3, 100 + i, 1, row, 16, row + 16, ROW - 16,
                                         &big[i]), 0);
    }
    ck_assert_int_eq(psd_segs_sync(s), PS_EFULL);
    ck_assert_uint_eq(file_size(1), before);
    check_rows(s, 1, 10, 1, locs);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    put_rows(s, 100, 200, 2, big);
    ck_assert_uint_eq(big[0].off, before);
    check_rows(s, 100, 200, 2, big);
    psd_segs_close(s);
    s = open_ok(0);
    check_rows(s, 1, 10, 1, locs);
    psd_segs_close(s);
}
END_TEST

PSCHECK_MAIN("segment",
    {"psd_segs_read", {test_roundtrip, test_wrong_row}, &pscheck_tmp},
    {"psd_segs_append", {test_seal_reopen}, &pscheck_tmp},
    {"psd_segs_open", {test_truncated_refused, test_corrupt_refused, test_committed_end}, &pscheck_tmp},
    {"psd_segs_sync", {test_full_disk}, &pscheck_tmp})
