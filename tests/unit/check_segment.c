/* The segment files of sparse rows (server/segment.h) in a real temporary
 * directory: rows appended, synced and read back in one batch through
 * io_uring; segments sealed and reopened; a truncated or corrupt segment
 * refused with its file and offset; a full disk leaving nothing of a batch;
 * compaction against a small catalog of the test's own (in memory, or in a
 * file a child process commits and is killed around), its token bucket,
 * and checkpoints linked and copied, then restored. */
#include "server/segment.h"

#include "common/errors.h"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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

/* A batch of reads left in flight: more than the submission queue is
 * deep, in shuffled order, with a read of the wrong row among them; the
 * rows are checked in the batch's buffer once waited for, and a second
 * batch reuses it. A batch in flight refuses another; a dst is refused. */
START_TEST(test_aread)
{
    psd_segs *s = open_ok(0);
    size_t n = 1000;
    psd_seg_loc *locs = calloc(n, sizeof *locs);
    psd_seg_read *rq = calloc(n, sizeof *rq);
    ck_assert_ptr_nonnull(locs);
    ck_assert_ptr_nonnull(rq);
    put_rows(s, 100, n, 5, locs);
    psd_seg_aread *a = NULL;
    int rc = psd_seg_aread_create(&a);
    if (rc == -ENOTSUP) { /* no io_uring here: psd reads nothing ahead */
        free(locs);
        free(rq);
        psd_segs_close(s);
        return;
    }
    ck_assert_int_eq(rc, 0);
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < n; i++) {
            size_t j = (i * 7919 + (size_t)round) % n;
            rq[i] = (psd_seg_read){.loc = locs[j], .var_id = 3, .id = 100 + (int64_t)j};
        }
        rq[7].id = rq[8].id; /* its record is another row's */
        ck_assert_int_eq(psd_seg_aread_submit(a, s, rq, n), 0);
        ck_assert(psd_seg_aread_busy(a));
        ck_assert_int_eq(psd_seg_aread_submit(a, s, rq, 1), -EBUSY);
        ck_assert_int_eq(psd_seg_aread_wait(a), 0);
        ck_assert(!psd_seg_aread_busy(a));
        ck_assert_uint_ge(psd_seg_aread_bytes(a), n * psd_segs_align(s));
        uint8_t want[ROW];
        for (size_t i = 0; i < n; i++) {
            if (i == 7) {
                ck_assert_int_eq(rq[i].rc, PS_ECORRUPT);
                ck_assert_ptr_null(rq[i].dst);
                continue;
            }
            ck_assert_int_eq(rq[i].rc, 0);
            ck_assert_uint_eq(rq[i].version, 5);
            fill(want, rq[i].id, 5);
            ck_assert_mem_eq(rq[i].dst, want, ROW);
        }
    }
    uint8_t out[ROW];
    rq[0].dst = out;
    ck_assert_int_eq(psd_seg_aread_submit(a, s, rq, 1), -EINVAL);
    ck_assert_int_eq(psd_seg_aread_submit(a, s, rq, PSD_SEG_AREAD_MAX + 1), -EINVAL);
    /* Destroyed with a batch in flight: it waits for it first. */
    for (size_t i = 0; i < 10; i++)
        rq[i].dst = NULL; /* (the last wait pointed them into the buffer) */
    ck_assert_int_eq(psd_seg_aread_submit(a, s, rq, 10), 0);
    psd_seg_aread_destroy(a);
    psd_seg_aread_destroy(NULL);
    free(locs);
    free(rq);
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

/* ---- compaction --------------------------------------------------------- */

#define REC (PSD_SEG_REC_HEAD + ROW) /* 562 bytes a record */
#define NCAT 200

/* The test's stand-in for psd's catalog: where each row of var 3, ids 0 to
 * NCAT-1, is, at which version, and the committed end. In kill tests it
 * lives in a file, written whole and renamed as LMDB would commit it. */
typedef struct {
    psd_seg_loc end;
    psd_seg_loc loc[NCAT];
    uint64_t ver[NCAT];
} catalog;

typedef struct {
    psd_segs *s;
    catalog *cat;
    const char *file; /* where commits go, or NULL */
    int64_t vanish;   /* a row deleted between the liveness test and the commit */
    int fail_moved;   /* moved callbacks to fail before one succeeds */
    size_t moves, stale;
} owner;

/* The points where a kill test stops a child (at its kill_at-th event),
 * which it first notes in tmpdir/killed for the parent to count. */
enum kill_point {
    K_PUT_SYNCED,    /* a batch synced, its catalog commit not made */
    K_PUT_COMMITTED,
    K_COPIES_SYNCED, /* relocations synced, the catalog not moved */
    K_MOVES_COMMITTED,
    K_SEG_DONE,      /* every record of the segment went through */
    K_END_COMMITTED, /* the segment not yet removed */
    K_REMOVED,
    K_POINTS
};
static int kill_at, events;

static void event(enum kill_point k)
{
    if (++events != kill_at)
        return;
    char p[300];
    snprintf(p, sizeof p, "%s/killed", tmpdir);
    FILE *f = fopen(p, "w");
    if (f != NULL) {
        fprintf(f, "%d\n", (int)k);
        fclose(f);
    }
    raise(SIGKILL);
}

static int cat_save(const owner *o)
{
    if (o->file == NULL)
        return 0;
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", o->file);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return -1;
    int ok = write(fd, o->cat, sizeof *o->cat) == (ssize_t)sizeof *o->cat &&
             fdatasync(fd) == 0;
    close(fd);
    if (!ok || rename(tmp, o->file) != 0)
        return -1;
    fd = open(tmpdir, O_RDONLY | O_DIRECTORY);
    ok = fd >= 0 && fsync(fd) == 0;
    if (fd >= 0)
        close(fd);
    return ok ? 0 : -1;
}

static int cat_live(void *arg, uint32_t var_id, int64_t id, uint64_t version, psd_seg_loc loc)
{
    owner *o = arg;
    if (var_id != 3 || id < 0 || id >= NCAT)
        return -1;
    psd_seg_loc at = o->cat->loc[id];
    int live = at.seg == loc.seg && at.off == loc.off;
    if (live && version != o->cat->ver[id])
        return -2;
    if (live && id == o->vanish) {
        /* Deleted meanwhile, as if by another thread of the owner. */
        psd_segs_dead(o->s, at);
        o->cat->loc[id] = (psd_seg_loc){0};
        o->vanish = -1;
    }
    return live;
}

static int cat_moved(void *arg, psd_seg_move *mv, size_t n)
{
    owner *o = arg;
    if (o->fail_moved > 0) {
        o->fail_moved--;
        return PS_ESTORE;
    }
    event(K_COPIES_SYNCED);
    for (size_t i = 0; i < n; i++) {
        psd_seg_loc *at = &o->cat->loc[mv[i].id];
        mv[i].stale = at->seg != mv[i].from.seg || at->off != mv[i].from.off;
        if (!mv[i].stale)
            *at = mv[i].to;
        o->stale += mv[i].stale;
    }
    o->moves += n;
    o->cat->end = psd_segs_end(o->s);
    if (cat_save(o) != 0)
        return PS_ESTORE;
    event(K_MOVES_COMMITTED);
    return 0;
}

/* Writes rows first, first+stride, ... (n of them) at version v in batches
 * of 10, moving the catalog and counting the records they replace dead. */
static int cat_put_every(owner *o, int64_t first, size_t n, int64_t stride, uint64_t v)
{
    uint8_t row[ROW];
    for (size_t b = 0; b < n; b += 10) {
        psd_seg_loc to[10];
        size_t m = n - b < 10 ? n - b : 10;
        for (size_t i = 0; i < m; i++) {
            int64_t id = first + stride * (int64_t)(b + i);
            fill(row, id, v);
            if (psd_segs_append(o->s, 3, id, v, row, 16, row + 16, ROW - 16, &to[i]) != 0)
                return -1;
        }
        if (psd_segs_sync(o->s) != 0)
            return -1;
        event(K_PUT_SYNCED);
        for (size_t i = 0; i < m; i++) {
            int64_t id = first + stride * (int64_t)(b + i);
            if (o->cat->loc[id].seg != 0)
                psd_segs_dead(o->s, o->cat->loc[id]);
            o->cat->loc[id] = to[i];
            o->cat->ver[id] = v;
        }
        o->cat->end = psd_segs_end(o->s);
        if (cat_save(o) != 0)
            return -1;
        event(K_PUT_COMMITTED);
    }
    return 0;
}

static int cat_put(owner *o, int64_t first, size_t n, uint64_t v)
{
    return cat_put_every(o, first, n, 1, v);
}

/* Compacts segment seg whole (no rate bound unless rate), then commits the
 * end and removes it. Returns 0, or the failing call's code. */
static int cat_compact(owner *o, uint32_t seg, uint64_t rate, uint32_t batch, size_t *steps)
{
    psd_seg_compact_opts co = {.rate = rate ? rate : (uint64_t)1 << 40, .batch = batch,
                               .live = cat_live, .moved = cat_moved, .arg = o};
    psd_segs_compact *c;
    char why[512] = "";
    int rc = psd_segs_compact_begin(o->s, seg, &co, &c, why, sizeof why);
    if (rc != 0)
        return rc;
    uint64_t wait = 0;
    size_t k = 0;
    while ((rc = psd_segs_compact_step(c, &wait, why, sizeof why)) == 0) {
        k++;
        if (wait > 0)
            nanosleep(&(struct timespec){(time_t)(wait / 1000000000), (long)(wait % 1000000000)},
                      NULL);
    }
    psd_segs_compact_end(c);
    if (steps != NULL)
        *steps = k;
    if (rc != 1)
        return rc;
    event(K_SEG_DONE);
    o->cat->end = psd_segs_end(o->s);
    if (cat_save(o) != 0)
        return -1;
    event(K_END_COMMITTED);
    rc = psd_segs_remove(o->s, seg, &o->cat->end);
    event(K_REMOVED);
    return rc;
}

/* Every row of the catalog reads back where it says, at its version. */
static void cat_check(psd_segs *s, const catalog *cat)
{
    psd_seg_read rq[NCAT];
    static uint8_t out[NCAT][ROW];
    uint8_t want[ROW];
    size_t n = 0;
    for (int64_t id = 0; id < NCAT; id++) {
        if (cat->loc[id].seg == 0)
            continue;
        rq[n] = (psd_seg_read){.loc = cat->loc[id], .var_id = 3, .id = id, .dst = out[n],
                               .cap = ROW};
        n++;
    }
    int rc = psd_segs_read(s, rq, n);
    ck_assert_msg(rc == 0, "read: %s", ps_strerror(rc));
    for (size_t i = 0; i < n; i++) {
        ck_assert_uint_eq(rq[i].version, cat->ver[rq[i].id]);
        fill(want, rq[i].id, rq[i].version);
        ck_assert_mem_eq(out[i], want, ROW);
    }
}

/* The live bytes the segments count add up to the records the catalog
 * points at. */
static void cat_counts(psd_segs *s, const catalog *cat)
{
    uint64_t live = 0, want = 0, b, l;
    for (uint32_t n = 1; n <= psd_segs_current(s); n++)
        if (psd_segs_usage(s, n, &b, &l) == 0) {
            ck_assert_uint_le(l, b);
            live += l;
        }
    for (int i = 0; i < NCAT; i++)
        want += cat->loc[i].len;
    ck_assert_uint_eq(live, want);
}

/* Per segment the record bytes and the live ones; a sealed segment a third
 * dead picked, the most dead first, never the active one; counts rebuilt
 * from a walk of the catalog. */
START_TEST(test_pick)
{
    psd_segs *s = open_ok(8192);
    psd_seg_loc locs[50];
    for (int b = 0; b < 5; b++) /* two batches of 10 a segment */
        put_rows(s, b * 10, 10, 1, locs + b * 10);
    ck_assert_uint_eq(psd_segs_current(s), 3);
    uint64_t bytes, live;
    uint32_t seg = 0;
    ck_assert_int_eq(psd_segs_usage(s, 1, &bytes, &live), 0);
    ck_assert_uint_eq(bytes, 20 * REC);
    ck_assert_uint_eq(live, 20 * REC);
    ck_assert_int_eq(psd_segs_usage(s, 9, &bytes, &live), PS_ENOTFOUND);
    ck_assert_int_eq(psd_segs_pick(s, 0, &seg), PS_ENOTFOUND);
    for (int i = 0; i < 6; i++) /* 0.30 dead */
        psd_segs_dead(s, locs[i]);
    ck_assert_int_eq(psd_segs_pick(s, 0, &seg), PS_ENOTFOUND);
    ck_assert_int_eq(psd_segs_pick(s, 0.25, &seg), 0);
    ck_assert_uint_eq(seg, 1);
    psd_segs_dead(s, locs[6]); /* 0.35 */
    ck_assert_int_eq(psd_segs_pick(s, 0, &seg), 0);
    ck_assert_uint_eq(seg, 1);
    for (int i = 20; i < 32; i++)
        psd_segs_dead(s, locs[i]);
    ck_assert_int_eq(psd_segs_pick(s, 0, &seg), 0);
    ck_assert_uint_eq(seg, 2);
    for (int i = 40; i < 50; i++) /* the active segment: never */
        psd_segs_dead(s, locs[i]);
    ck_assert_int_eq(psd_segs_usage(s, 3, &bytes, &live), 0);
    ck_assert_uint_eq(live, 0);
    ck_assert_int_eq(psd_segs_pick(s, 0, &seg), 0);
    ck_assert_uint_eq(seg, 2);
    /* Rebuilt from the catalog: rows 0-9 of segment 1 and all of 2. */
    psd_segs_recount(s);
    for (int i = 0; i < 10; i++)
        psd_segs_live(s, locs[i]);
    for (int i = 20; i < 40; i++)
        psd_segs_live(s, locs[i]);
    ck_assert_int_eq(psd_segs_usage(s, 1, &bytes, &live), 0);
    ck_assert_uint_eq(live, 10 * REC);
    ck_assert_int_eq(psd_segs_pick(s, 0, &seg), 0);
    ck_assert_uint_eq(seg, 1);
    psd_segs_close(s);
    /* After a reopen every record counts live. */
    s = open_ok(8192);
    ck_assert_int_eq(psd_segs_usage(s, 2, &bytes, &live), 0);
    ck_assert_uint_eq(live, bytes);
    ck_assert_int_eq(psd_segs_pick(s, 0, &seg), PS_ENOTFOUND);
    psd_segs_close(s);
}
END_TEST

/* Rows 0..NCAT-1 at version 1, then the even ones of the first 80 at 2. */
static void cat_fill(owner *o)
{
    ck_assert_int_eq(cat_put(o, 0, NCAT, 1), 0);
    for (int64_t id = 0; id < 80; id += 2)
        ck_assert_int_eq(cat_put(o, id, 1, 2), 0);
}

/* An owner of a new catalog *cat over segments of seg_size bytes, filled
 * by cat_fill. */
static owner filled(catalog *cat, size_t seg_size)
{
    memset(cat, 0, sizeof *cat);
    owner o = {.s = open_ok(seg_size), .cat = cat, .vanish = -1};
    cat_fill(&o);
    return o;
}

/* Every row reads where the catalog says, and the live counts agree. */
static void owner_check(const owner *o)
{
    cat_check(o->s, o->cat);
    cat_counts(o->s, o->cat);
}

/* Compaction of segment seg, unbounded in rate, three records a step. */
static psd_segs_compact *begin_fast(owner *o, uint32_t seg)
{
    psd_seg_compact_opts co = {.rate = (uint64_t)1 << 40, .batch = 3 * REC,
                               .live = cat_live, .moved = cat_moved, .arg = o};
    psd_segs_compact *c = NULL;
    char why[512] = "";
    ck_assert_msg(psd_segs_compact_begin(o->s, seg, &co, &c, why, sizeof why) == 0, "%s", why);
    return c;
}

/* A half-dead segment compacted in batches of three records: after every
 * step every row reads where the catalog says; at the end the live records
 * are in the active segment, the old file removed, and a reopen at the
 * committed end reads them all. A row deleted while its copy was made is a
 * stale relocation, counted dead. */
START_TEST(test_compact)
{
    catalog cat;
    owner o = filled(&cat, 8192);
    owner_check(&o);
    uint32_t seg;
    ck_assert_int_eq(psd_segs_pick(o.s, 0, &seg), 0);
    ck_assert_uint_eq(seg, 1); /* rows 0-19, half of them superseded */
    uint64_t bytes, live;
    ck_assert_int_eq(psd_segs_usage(o.s, 1, &bytes, &live), 0);
    ck_assert_uint_eq(live * 2, bytes);
    psd_segs_compact *c = begin_fast(&o, seg);
    char why[512] = "";
    uint64_t wait;
    int rc, steps = 0;
    o.vanish = 5;
    while ((rc = psd_segs_compact_step(c, &wait, why, sizeof why)) == 0) {
        steps++;
        owner_check(&o);
    }
    ck_assert_msg(rc == 1, "step: %s (%s)", why, ps_strerror(rc));
    ck_assert_int_eq(psd_segs_compact_step(c, &wait, why, sizeof why), 1);
    psd_segs_compact_end(c);
    ck_assert_int_ge(steps, (int)(bytes / (3 * REC)) - 1);
    ck_assert_uint_eq(o.moves, bytes / REC / 2);
    ck_assert_uint_eq(o.stale, 1);
    ck_assert_uint_eq(psd_segs_copied(o.s), o.moves * REC);
    ck_assert_int_eq(psd_segs_usage(o.s, 1, &bytes, &live), 0);
    ck_assert_uint_eq(live, 0);
    cat_counts(o.s, &cat);
    for (int64_t id = 0; id < 20; id++)
        ck_assert_uint_ne(cat.loc[id].seg, 1);
    /* A reader that looked row 3 up before the move still reads it after
     * the removal (the descriptor is kept for the grace). */
    psd_seg_loc old3 = {.seg = 1, .len = REC, .off = PSD_SEG_FILE_HEAD + 3 * REC};
    uint8_t got3[ROW], want3[ROW];
    psd_seg_read rq3 = {.loc = old3, .var_id = 3, .id = 3, .dst = got3, .cap = ROW};
    ck_assert_int_eq(psd_segs_read(o.s, &rq3, 1), 0);
    /* Removed only past the committed end. */
    cat.end = psd_segs_end(o.s);
    psd_seg_loc early = {.seg = 1, .off = 100};
    ck_assert_int_eq(psd_segs_remove(o.s, 1, &early), PS_EINVAL_ARG);
    ck_assert_int_eq(psd_segs_remove(o.s, 1, &cat.end), 0);
    ck_assert_int_eq(psd_segs_remove(o.s, 1, &cat.end), PS_EINVAL_ARG);
    ck_assert_int_eq(psd_segs_usage(o.s, 1, &bytes, &live), PS_ENOTFOUND);
    ck_assert_uint_eq(psd_segs_removed(o.s), 1);
    char p[512];
    snprintf(p, sizeof p, "%s/seg-%08u.psg", dir_of(), 1u);
    ck_assert_int_ne(access(p, F_OK), 0);
    cat_check(o.s, &cat);
    memset(got3, 0, sizeof got3);
    ck_assert_int_eq(psd_segs_read(o.s, &rq3, 1), 0);
    fill(want3, 3, 1);
    ck_assert_mem_eq(got3, want3, ROW);
    /* The next pick, whole, through cat_compact. */
    ck_assert_int_eq(psd_segs_pick(o.s, 0, &seg), 0);
    ck_assert_uint_eq(seg, 2);
    ck_assert_int_eq(cat_compact(&o, seg, 0, 0, NULL), 0);
    owner_check(&o);
    psd_segs_close(o.s);
    char why2[512] = "";
    ck_assert_int_eq(psd_segs_open(dir_of(), 8192, &cat.end, &o.s, why2, sizeof why2), 0);
    cat_check(o.s, &cat);
    psd_segs_close(o.s);
}
END_TEST

/* The owner's batches between the steps: rows of the segment rewritten
 * before their turn (then skipped as dead) and after their copy (the copy
 * then dead); the counts stay those of the catalog all along. */
START_TEST(test_compact_interleaved)
{
    catalog cat;
    owner o = filled(&cat, 8192);
    psd_segs_compact *c = begin_fast(&o, 1);
    char why[512] = "";
    uint64_t wait;
    int rc, step = 0;
    while ((rc = psd_segs_compact_step(c, &wait, why, sizeof why)) == 0) {
        /* Row 19 (last of the segment) before its turn, then each step the
         * odd row just copied. */
        int64_t id = step == 0 ? 19 : 2 * step + 1;
        ck_assert_int_eq(cat_put(&o, id, 1, 7), 0);
        step++;
        owner_check(&o);
    }
    ck_assert_int_eq(rc, 1);
    psd_segs_compact_end(c);
    ck_assert_uint_lt(o.moves, 10); /* row 19 was dead at its turn */
    cat.end = psd_segs_end(o.s);
    ck_assert_int_eq(psd_segs_remove(o.s, 1, &cat.end), 0);
    owner_check(&o);
    psd_segs_close(o.s);
}
END_TEST

/* What compaction refuses, and a step that failed tried again. */
START_TEST(test_compact_refused)
{
    catalog cat;
    owner o = filled(&cat, 8192);
    psd_seg_compact_opts co = {.live = cat_live, .moved = cat_moved, .arg = &o};
    psd_segs_compact *c;
    char why[512] = "";
    uint32_t cur = psd_segs_current(o.s);
    ck_assert_int_eq(psd_segs_compact_begin(o.s, cur, &co, &c, why, sizeof why),
                     PS_EINVAL_ARG);
    ck_assert_ptr_nonnull(strstr(why, "not a sealed segment"));
    ck_assert_int_eq(psd_segs_compact_begin(o.s, 0, &co, &c, why, sizeof why), PS_EINVAL_ARG);
    ck_assert_int_eq(psd_segs_remove(o.s, cur, &cat.end), PS_EINVAL_ARG);
    co.moved = NULL;
    ck_assert_int_eq(psd_segs_compact_begin(o.s, 1, &co, &c, why, sizeof why), PS_EINVAL_ARG);
    co.moved = cat_moved;
    ck_assert_int_eq(psd_segs_compact_begin(o.s, 1, &co, &c, why, sizeof why), 0);
    /* A batch of the owner's buffered: not now. */
    uint8_t row[ROW];
    psd_seg_loc loc;
    uint64_t wait;
    fill(row, 7, 9);
    ck_assert_int_eq(psd_segs_append(o.s, 3, 7, 9, row, 16, row + 16, ROW - 16, &loc), 0);
    ck_assert_int_eq(psd_segs_compact_step(c, &wait, why, sizeof why), -EBUSY);
    psd_segs_discard(o.s);
    /* The catalog refuses twice: the same records go again. */
    o.fail_moved = 2;
    ck_assert_int_eq(psd_segs_compact_step(c, &wait, why, sizeof why), PS_ESTORE);
    ck_assert_ptr_nonnull(strstr(why, "did not take its relocations"));
    ck_assert_int_eq(psd_segs_compact_step(c, &wait, why, sizeof why), PS_ESTORE);
    owner_check(&o);
    int rc;
    while ((rc = psd_segs_compact_step(c, &wait, why, sizeof why)) == 0)
        ;
    ck_assert_int_eq(rc, 1);
    psd_segs_compact_end(c);
    owner_check(&o);
    for (int64_t id = 0; id < NCAT; id++)
        ck_assert_uint_ne(cat.loc[id].seg, 1);
    /* A corrupt record in the next segment stops its compaction there, with
     * the file and offset; nothing is lost. */
    uint32_t seg = 2;
    uint64_t bad = 0;
    for (int64_t id = 0; id < NCAT; id++)
        if (cat.loc[id].seg == seg && bad == 0)
            bad = cat.loc[id].off;
    ck_assert_uint_gt(bad, 0);
    flip_byte(seg, bad + PSD_SEG_REC_HEAD + 3);
    ck_assert_int_eq(psd_segs_compact_begin(o.s, seg, &co, &c, why, sizeof why), 0);
    while ((rc = psd_segs_compact_step(c, &wait, why, sizeof why)) == 0)
        ;
    psd_segs_compact_end(c);
    ck_assert_int_eq(rc, PS_ECORRUPT);
    char want[64];
    snprintf(want, sizeof want, "offset %llu: record checksum mismatch",
             (unsigned long long)bad);
    ck_assert_msg(strstr(why, want) != NULL && strstr(why, "seg-00000002.psg") != NULL,
                  "%s", why);
    ck_assert_int_eq(psd_segs_usage(o.s, seg, &(uint64_t){0}, &(uint64_t){0}), 0);
    psd_segs_close(o.s);
}
END_TEST

static double secs_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* The token bucket: a segment of I/O bytes at rate takes about I/O/rate,
 * each step at most a batch; a step while in debt does nothing. */
START_TEST(test_compact_rate)
{
    catalog cat;
    owner o = filled(&cat, 64 << 10);
    uint64_t bytes, live;
    ck_assert_int_eq(psd_segs_usage(o.s, 1, &bytes, &live), 0);
    ck_assert_uint_eq(bytes, 120 * REC); /* 12 batches of 10 pass 64 KiB */
    ck_assert_uint_eq(live, 80 * REC);
    uint64_t rate = 128 << 10, io = bytes + live;
    uint32_t batch = 8 << 10;
    psd_seg_compact_opts co = {.rate = rate, .batch = batch, .live = cat_live,
                               .moved = cat_moved, .arg = &o};
    psd_segs_compact *c;
    char why[512] = "";
    ck_assert_int_eq(psd_segs_compact_begin(o.s, 1, &co, &c, why, sizeof why), 0);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t wait;
    int rc;
    double longest = 0;
    size_t idle = 0;
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t before = psd_segs_copied(o.s);
        rc = psd_segs_compact_step(c, &wait, why, sizeof why);
        double took = secs_since(&ts);
        longest = took > longest ? took : longest;
        if (rc != 0)
            break;
        if (wait > 0) {
            /* In debt: a step now does nothing. */
            uint64_t mid = psd_segs_copied(o.s);
            ck_assert_uint_le(mid - before, batch);
            ck_assert_int_eq(psd_segs_compact_step(c, &wait, why, sizeof why), 0);
            ck_assert_uint_gt(wait, 0);
            ck_assert_uint_eq(psd_segs_copied(o.s), mid);
            idle++;
            nanosleep(&(struct timespec){(time_t)(wait / 1000000000), (long)(wait % 1000000000)},
                      NULL);
        }
    }
    double took = secs_since(&t0);
    ck_assert_int_eq(rc, 1);
    psd_segs_compact_end(c);
    /* The bucket starts full, and the last step's debt is never waited. */
    double floor = (double)(io - 3 * batch) / (double)rate;
    fprintf(stderr, "compaction of %llu bytes (%llu live) at %llu B/s: %.3f s (floor %.3f s), "
            "longest step %.2f ms\n", (unsigned long long)bytes, (unsigned long long)live,
            (unsigned long long)rate, took, floor, longest * 1e3);
    ck_assert_msg(took >= floor, "%.3f s, the bucket allows no less than %.3f s",
                  took, floor);
    ck_assert_uint_gt(idle, 3);
    cat_check(o.s, &cat);
    psd_segs_close(o.s);
}
END_TEST

/* One run of the child of test_compact_kill: opens the directory at the
 * catalog's committed end, rebuilds the counts from the catalog, writes a
 * new version of a slice of rows and compacts whatever is a third dead,
 * rounds times. Killed at its kill_at-th event, or by the parent. */
static int kill_child(int rounds)
{
    char file[512], why[512] = "";
    snprintf(file, sizeof file, "%s/catalog", tmpdir);
    static catalog cat;
    events = 0;
    int fd = open(file, O_RDONLY);
    if (fd < 0 || read(fd, &cat, sizeof cat) != (ssize_t)sizeof cat)
        return 2;
    close(fd);
    owner o = {.cat = &cat, .file = file, .vanish = -1};
    if (psd_segs_open(dir_of(), 12 << 10, cat.end.seg ? &cat.end : NULL, &o.s, why,
                      sizeof why) != 0) {
        fprintf(stderr, "child: open: %s\n", why);
        return 3;
    }
    psd_segs_recount(o.s);
    for (int i = 0; i < NCAT; i++)
        if (cat.loc[i].seg != 0)
            psd_segs_live(o.s, cat.loc[i]);
    for (int r = 0; r < rounds; r++) {
        /* Every other row of a slice: the segments behind are half dead. */
        int64_t first = (int64_t)(cat.ver[0] * 37 % (NCAT / 4));
        if (cat_put_every(&o, first, NCAT / 4, 2, cat.ver[0] + 1) != 0)
            return 4;
        uint32_t seg;
        while (psd_segs_pick(o.s, 0, &seg) == 0) {
            int rc = cat_compact(&o, seg, 0, 4096, NULL);
            if (rc != 0) {
                fprintf(stderr, "child: compaction of %u: %s\n", seg, ps_strerror(rc));
                return 5;
            }
        }
    }
    psd_segs_close(o.s);
    return 0;
}

/* Runs kill_child in a child process that dies with its parent; returns
 * its wait status, after a SIGKILL after delay_us when that is not 0. */
static int kill_run(int rounds, long delay_us)
{
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(kill_child(rounds));
    }
    if (delay_us > 0) {
        usleep((useconds_t)delay_us);
        kill(pid, SIGKILL);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return status;
}

/* The committed catalog, read from its file, reads back whole. */
static void kill_check(void)
{
    char file[512], why[512] = "";
    snprintf(file, sizeof file, "%s/catalog", tmpdir);
    size_t len;
    catalog *cat = (catalog *)pscheck_read(file, &len);
    ck_assert_uint_eq(len, sizeof *cat);
    psd_segs *s = NULL;
    int rc = psd_segs_open(dir_of(), 12 << 10, &cat->end, &s, why, sizeof why);
    ck_assert_msg(rc == 0, "open after a kill: %s", why);
    cat_check(s, cat);
    psd_segs_close(s);
    free(cat);
}

/* A kill at every point of writes and compaction (after a sync, after the
 * catalog's commit, before and after a segment's removal), and at random
 * times: every row the catalog holds reads back. */
START_TEST(test_compact_kill)
{
    static catalog cat;
    char file[512];
    snprintf(file, sizeof file, "%s/catalog", tmpdir);
    owner o = {.s = open_ok(12 << 10), .cat = &cat, .file = file, .vanish = -1};
    ck_assert_int_eq(cat_put(&o, 0, NCAT, 1), 0);
    psd_segs_close(o.s);
    int stride = getenv("PS_UNDER_VALGRIND") ? 9 : 1, killed = 0, at[K_POINTS] = {0};
    char noted[300];
    snprintf(noted, sizeof noted, "%s/killed", tmpdir);
    for (kill_at = 1;; kill_at += stride) {
        int st = kill_run(3, 0);
        kill_check();
        if (WIFEXITED(st)) {
            ck_assert_int_eq(WEXITSTATUS(st), 0);
            break;
        }
        ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "status %d", st);
        size_t len;
        char *k = (char *)pscheck_read(noted, &len);
        int point = atoi(k);
        free(k);
        ck_assert_int_lt(point, K_POINTS);
        at[point]++;
        unlink(noted);
        killed++;
    }
    ck_assert_int_gt(killed * stride, 40);
    for (int k = 0; k < K_POINTS && stride == 1; k++)
        ck_assert_msg(at[k] > 0, "no kill at point %d", k);
    kill_at = 0;
    unsigned seed = (unsigned)getpid();
    for (int i = 0; i < 12; i++) {
        int st = kill_run(1000, 2000 + (long)(rand_r(&seed) % 40000));
        ck_assert_msg(WIFSIGNALED(st), "the child ended on its own: status %d", st);
        kill_check();
    }
    fprintf(stderr, "compaction killed at %d points in turn (%d %d %d %d %d %d %d of each "
            "kind) and 12 random times\n", killed, at[0], at[1], at[2], at[3], at[4], at[5],
            at[6]);
}
END_TEST

/* ---- checkpoints -------------------------------------------------------- */

static ino_t inode_of(const char *dir, uint32_t n, nlink_t *links, off_t *size)
{
    char p[512];
    snprintf(p, sizeof p, "%s/seg-%08u.psg", dir, n);
    struct stat st;
    ck_assert_msg(stat(p, &st) == 0, "%s", p);
    if (links)
        *links = st.st_nlink;
    if (size)
        *size = st.st_size;
    return st.st_ino;
}

/* Sealed segments hard-linked, the active one copied to the committed end;
 * the store goes on (appends, a compaction removing a linked segment)
 * without touching the checkpoint; a restore reads the checkpoint's rows
 * and appends apart from it. */
START_TEST(test_checkpoint)
{
    catalog cat, snap;
    owner o = filled(&cat, 8192);
    ck_assert_int_eq(cat_put(&o, 100, 5, 4), 0); /* the active segment part full */
    snap = cat;
    uint32_t last = snap.end.seg;
    char ck[300], rs[300], why[512] = "";
    snprintf(ck, sizeof ck, "%s/ckpt", tmpdir);
    snprintf(rs, sizeof rs, "%s/restored", tmpdir);
    psd_seg_loc past = snap.end;
    past.off += 1;
    ck_assert_int_eq(psd_segs_checkpoint(o.s, ck, &past, why, sizeof why), PS_EINVAL_ARG);
    ck_assert_int_eq(psd_segs_checkpoint(o.s, dir_of(), &snap.end, why, sizeof why),
                     PS_EINVAL_ARG);
    ck_assert_int_eq(psd_segs_checkpoint(o.s, ck, &snap.end, why, sizeof why), 0);
    nlink_t links;
    off_t size;
    for (uint32_t n = 1; n < last; n++) {
        ck_assert_uint_eq(inode_of(ck, n, &links, NULL), inode_of(dir_of(), n, NULL, NULL));
        ck_assert_uint_eq(links, 2);
    }
    ck_assert_uint_ne(inode_of(ck, last, &links, &size), inode_of(dir_of(), last, NULL, NULL));
    ck_assert_uint_eq(links, 1);
    ck_assert_uint_eq((uint64_t)size, snap.end.off);
    /* The store goes on. */
    ck_assert_int_eq(cat_put(&o, 100, 20, 5), 0);
    ck_assert_int_eq(cat_compact(&o, 1, 0, 0, NULL), 0);
    inode_of(ck, 1, &links, NULL);
    ck_assert_uint_eq(links, 1);
    inode_of(ck, last, NULL, &size);
    ck_assert_uint_eq((uint64_t)size, snap.end.off);
    cat_check(o.s, &cat);
    /* Restore into a directory with other segments: they go. */
    ck_assert_int_eq(mkdir(rs, 0700), 0);
    char stray[512];
    snprintf(stray, sizeof stray, "%s/seg-%08u.psg", rs, 77u);
    pscheck_write_text(stray, "stray");
    ck_assert_int_eq(psd_segs_restore(ck, rs, &snap.end, why, sizeof why), 0);
    ck_assert_int_ne(access(stray, F_OK), 0);
    psd_segs *r = NULL;
    ck_assert_int_eq(psd_segs_open(rs, 8192, &snap.end, &r, why, sizeof why), 0);
    cat_check(r, &snap);
    catalog after = snap;
    owner ro = {.s = r, .cat = &after, .vanish = -1};
    ck_assert_int_eq(cat_put(&ro, 0, 30, 6), 0);
    cat_check(r, &after);
    psd_segs_close(r);
    inode_of(ck, last, NULL, &size);
    ck_assert_uint_eq((uint64_t)size, snap.end.off);
    /* The checkpoint restores again as it was. */
    ck_assert_int_eq(psd_segs_restore(ck, rs, &snap.end, why, sizeof why), 0);
    ck_assert_int_eq(psd_segs_open(rs, 8192, &snap.end, &r, why, sizeof why), 0);
    cat_check(r, &snap);
    psd_segs_close(r);
    /* A checkpoint missing committed bytes is refused. */
    char p[512];
    snprintf(p, sizeof p, "%s/seg-%08u.psg", ck, last);
    ck_assert_int_eq(truncate(p, (off_t)(snap.end.off - 100)), 0);
    ck_assert_int_eq(psd_segs_restore(ck, rs, &snap.end, why, sizeof why), PS_ECORRUPT);
    ck_assert_msg(strstr(why, "truncated (committed rows end at") != NULL, "%s", why);
    cat_check(o.s, &cat);
    psd_segs_close(o.s);
}
END_TEST

/* An active segment of several MiB is copied whole and exact. */
START_TEST(test_checkpoint_big)
{
    psd_segs *s = open_ok(0);
    size_t n = 6000;
    psd_seg_loc *locs = calloc(n, sizeof *locs);
    for (size_t b = 0; b < n; b += 1000)
        put_rows(s, (int64_t)b, 1000, 1, locs + b);
    psd_seg_loc end = psd_segs_end(s);
    ck_assert_uint_gt(end.off, 3u << 20);
    char ck[300], why[512] = "";
    snprintf(ck, sizeof ck, "%s/ckpt", tmpdir);
    ck_assert_int_eq(psd_segs_checkpoint(s, ck, &end, why, sizeof why), 0);
    psd_segs_close(s);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/seg-%08u.psg", dir_of(), 1u);
    snprintf(b, sizeof b, "%s/seg-%08u.psg", ck, 1u);
    size_t la, lb;
    unsigned char *da = pscheck_read(a, &la), *db = pscheck_read(b, &lb);
    ck_assert_uint_eq(la, lb);
    ck_assert_int_eq(memcmp(da, db, la), 0);
    free(da);
    free(db);
    ck_assert_int_eq(psd_segs_open(ck, 0, &end, &s, why, sizeof why), 0);
    check_rows(s, 0, n, 1, locs);
    psd_segs_close(s);
    free(locs);
}
END_TEST

/* A checkpoint on another file system (/dev/shm, a tmpfs): the sealed
 * segments are copied, not linked, and restore back the same way. */
START_TEST(test_checkpoint_elsewhere)
{
    struct stat a, b;
    if (stat("/dev/shm", &b) != 0 || stat(tmpdir, &a) != 0 || a.st_dev == b.st_dev) {
        fprintf(stderr, "skipped: no /dev/shm on another file system than %s\n", tmpdir);
        return;
    }
    char ck[64] = "/dev/shm/check_segment.XXXXXX", rs[300], why[512] = "";
    ck_assert_ptr_nonnull(mkdtemp(ck));
    catalog cat;
    owner o = filled(&cat, 8192);
    int rc = psd_segs_checkpoint(o.s, ck, &cat.end, why, sizeof why);
    nlink_t links;
    if (rc == 0)
        inode_of(ck, 1, &links, NULL);
    snprintf(rs, sizeof rs, "%s/restored", tmpdir);
    int rrc = rc == 0 ? psd_segs_restore(ck, rs, &cat.end, why, sizeof why) : rc;
    nftw(ck, pscheck_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    ck_assert_msg(rc == 0 && rrc == 0, "%s", why);
    ck_assert_uint_eq(links, 1);
    inode_of(rs, 1, &links, NULL);
    ck_assert_uint_eq(links, 1);
    psd_segs *r = NULL;
    ck_assert_int_eq(psd_segs_open(rs, 8192, &cat.end, &r, why, sizeof why), 0);
    cat_check(r, &cat);
    psd_segs_close(r);
    psd_segs_close(o.s);
}
END_TEST

static const struct pscheck_opts slow_tmp = {pscheck_tmp_setup, pscheck_tmp_teardown, 300};

PSCHECK_MAIN("segment",
    {"psd_segs_read", {test_roundtrip, test_wrong_row}, &pscheck_tmp},
    {"psd_seg_aread_submit", {test_aread}, &pscheck_tmp},
    {"psd_segs_append", {test_seal_reopen}, &pscheck_tmp},
    {"psd_segs_open", {test_truncated_refused, test_corrupt_refused, test_committed_end}, &pscheck_tmp},
    {"psd_segs_sync", {test_full_disk}, &pscheck_tmp},
    {"psd_segs_pick", {test_pick}, &pscheck_tmp},
    {"psd_segs_compact_step", {test_compact, test_compact_interleaved, test_compact_refused,
                               test_compact_rate},
     &pscheck_tmp},
    {"psd_segs_remove", {test_compact_kill}, &slow_tmp},
    {"psd_segs_checkpoint", {test_checkpoint, test_checkpoint_big, test_checkpoint_elsewhere},
     &pscheck_tmp})
