/*
 * segments - cold-row reads from psd's segment files (server/segment.h)
 * against the disk they sit on, in one run: --rows rows of --row bytes are
 * appended and synced under --dir, then --calls calls each read --batch
 * random rows with psd_segs_read (O_DIRECT through io_uring, the whole
 * batch submitted at once), timed; the ceiling is the disk's rate for
 * random O_DIRECT reads of the same span, with as many in flight as
 * psd_segs_read keeps (a raw io_uring loop over the same files for
 * --seconds), times the rows per read. The bench owns liburing for that
 * loop (-DPS_OWNS_URING, common/confine.h). Then every other row is written
 * again and the segments compacted at no rate bound, timing each step.
 *
 *   segments [--dir DIR] [--rows 400000] [--row 530] [--batch 4096]
 *            [--calls 50] [--seconds 3] [--seg-mib 16] [--compact-kib 256]
 *
 * Ends with one line: "segments: read N rows/s, C of disk ceiling (D reads/s
 * of S bytes with Q in flight)".
 */
#include "bench/diskrate.h"
#include "common/clock.h"
#include "common/errors.h"
#include "server/segment.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The bench's catalog, for compaction: where each row is now. */
static psd_seg_loc *cat;

static int cat_live(void *arg, uint32_t var_id, int64_t id, uint64_t version, psd_seg_loc loc)
{
    (void)arg, (void)var_id, (void)version;
    return cat[id].seg == loc.seg && cat[id].off == loc.off;
}

static int cat_moved(void *arg, psd_seg_move *mv, size_t n)
{
    (void)arg;
    for (size_t i = 0; i < n; i++)
        cat[mv[i].id] = mv[i].to;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Writes every other row again (the old record dead), then compacts each
 * segment picked, unbounded in rate, and prints the rate and the steps'
 * durations. Returns 0 or 1. */
static int compact_run(psd_segs *s, long rows, long row, uint32_t batch)
{
    uint8_t *r = calloc(1, (size_t)row);
    for (long i = 0; i < rows; i += 2) {
        psd_seg_loc to;
        memcpy(r, &i, sizeof i);
        if (psd_segs_append(s, 1, i, 2, r, 16, r + 16, (size_t)row - 16, &to) != 0)
            return 1;
        psd_segs_dead(s, cat[i]);
        cat[i] = to;
        if ((i / 2 + 1) % 4096 == 0 || i + 2 >= rows) {
            if (psd_segs_sync(s) != 0)
                return 1;
        }
    }
    free(r);
    size_t nstep = 0, cap = 1024;
    double *step = malloc(cap * sizeof *step), t = 0;
    uint64_t read = 0, before = psd_segs_copied(s);
    uint32_t seg, segs = 0;
    psd_seg_compact_opts o = {.rate = UINT64_MAX / 4, .batch = batch, .live = cat_live,
                              .moved = cat_moved};
    while (psd_segs_pick(s, 0, &seg) == 0) {
        psd_segs_compact *c;
        char why[512] = "";
        uint64_t bytes, live, wait;
        psd_segs_usage(s, seg, &bytes, &live);
        if (psd_segs_compact_begin(s, seg, &o, &c, why, sizeof why) != 0) {
            fprintf(stderr, "segments: compaction: %s\n", why);
            return 1;
        }
        int rc;
        do {
            double a = now_s();
            rc = psd_segs_compact_step(c, &wait, why, sizeof why);
            double d = now_s() - a;
            t += d;
            if (nstep == cap)
                step = realloc(step, (cap *= 2) * sizeof *step);
            step[nstep++] = d;
        } while (rc == 0);
        psd_segs_compact_end(c);
        psd_seg_loc end = psd_segs_end(s);
        if (rc != 1 || psd_segs_remove(s, seg, &end) != 0) {
            fprintf(stderr, "segments: compaction of %u: %s\n", seg, why);
            return 1;
        }
        read += bytes;
        segs++;
    }
    uint64_t copied = psd_segs_copied(s) - before;
    qsort(step, nstep, sizeof *step, cmp_double);
    printf("compaction: %u segment(s), %.1f MiB read and %.1f MiB copied in %.2f s "
           "(%.0f MiB/s unbounded), %zu steps of %u KiB: p50 %.2f ms, p99 %.2f ms, "
           "max %.2f ms\n", segs, (double)read / 1048576, (double)copied / 1048576, t,
           (double)(read + copied) / 1048576 / (t > 0 ? t : 1), nstep,
           batch >> 10, nstep ? 1e3 * step[nstep / 2] : 0,
           nstep ? 1e3 * step[nstep * 99 / 100] : 0, nstep ? 1e3 * step[nstep - 1] : 0);
    free(step);
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    long rows = 400000, row = 530, batch = 4096, calls = 50, seg_mib = 16;
    long compact_kib = PSD_SEG_BATCH_DEFAULT >> 10;
    double secs = 3;
    /* The numeric flags as data; --dir and --seconds apart. A flag not
     * known, one without a value or a value not a whole number is refused
     * with the usage line below. */
    const char *const names[] = {"--rows", "--row", "--batch", "--calls", "--seg-mib",
                                 "--compact-kib", NULL};
    long *const vals[] = {&rows, &row, &batch, &calls, &seg_mib, &compact_kib};
    bool bad = argc % 2 == 0;
    for (int i = 1; !bad && i + 1 < argc; i += 2) {
        const char *v = argv[i + 1];
        char *end = NULL;
        int k = 0;
        while (names[k] != NULL && strcmp(argv[i], names[k]) != 0)
            k++;
        if (!strcmp(argv[i], "--dir"))
            dir = v;
        else if (!strcmp(argv[i], "--seconds"))
            secs = strtod(v, &end);
        else if (names[k] != NULL)
            *vals[k] = strtol(v, &end, 10);
        else
            bad = true;
        if (end != NULL && (end == v || *end != '\0'))
            bad = true;
    }
    if (bad || rows < batch || row < 16 || batch < 1 || calls < 1 || secs <= 0 ||
        seg_mib < 1 || compact_kib < 1) {
        fprintf(stderr, "usage: segments [--dir DIR] [--rows N] [--row BYTES] [--batch B] "
                "[--calls C] [--seconds S] [--seg-mib M] [--compact-kib K]\n");
        return 2;
    }
    char tmpl[] = "/var/tmp/segbench.XXXXXX";
    if (dir == NULL && (dir = mkdtemp(tmpl)) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    char segdir[4096];
    snprintf(segdir, sizeof segdir, "%s/segments", dir);
    psd_segs *s;
    char why[512] = "";
    int rc = psd_segs_open(segdir, (uint64_t)seg_mib << 20, NULL, &s, why, sizeof why);
    if (rc != 0) {
        fprintf(stderr, "segments: %s (%s)\n", why, ps_strerror(rc));
        return 1;
    }
    psd_seg_loc *locs = malloc((size_t)rows * sizeof *locs);
    uint8_t *r = calloc(1, (size_t)row);
    double t0 = now_s();
    for (long i = 0; i < rows; i++) {
        memcpy(r, &i, sizeof i);
        if (psd_segs_append(s, 1, i, 1, r, 16, r + 16, (size_t)row - 16, &locs[i]) != 0)
            return 1;
        if ((i + 1) % 4096 == 0 || i + 1 == rows) {
            rc = psd_segs_sync(s);
            if (rc != 0) {
                fprintf(stderr, "segments: sync: %s\n", ps_strerror(rc));
                return 1;
            }
        }
    }
    double tw = now_s() - t0;
    printf("wrote %ld rows of %ld bytes in %.2f s (%.0f rows/s, batches of 4096 synced), "
           "%llu MiB in %u segment(s)\n", rows, row, tw, (double)rows / tw,
           (unsigned long long)(psd_segs_bytes(s) >> 20), psd_segs_current(s));
    psd_seg_read *rq = calloc((size_t)batch, sizeof *rq);
    uint8_t *out = malloc((size_t)batch * (size_t)row);
    uint64_t rng = 7;
    double t = 0;
    for (long c = 0; c < calls; c++) {
        for (long k = 0; k < batch; k++) {
            int64_t id = (int64_t)(rng_next(&rng) % (uint64_t)rows);
            rq[k] = (psd_seg_read){.loc = locs[id], .var_id = 1, .id = id,
                                   .dst = out + k * row, .cap = (size_t)row};
        }
        double a = now_s();
        rc = psd_segs_read(s, rq, (size_t)batch);
        t += now_s() - a;
        if (rc != 0) {
            fprintf(stderr, "segments: read: %s\n", ps_strerror(rc));
            return 1;
        }
    }
    double rate = (double)(calls * batch) / t;
    uint32_t align = psd_segs_align(s);
    /* A row's read spans its record widened to the alignment: most fit one
     * block, some straddle two; the ceiling reads the average span. */
    uint32_t span = align * (uint32_t)(((uint64_t)row + PSD_SEG_REC_HEAD + align - 1) / align);
    double blocks_per_row = ((double)row + PSD_SEG_REC_HEAD + align - 1) / align;
    printf("read: %ld calls of %ld random rows, %.3f ms a call, %s, alignment %u "
           "(%.2f blocks a row on average)\n", calls, batch, 1e3 * t / (double)calls,
           psd_segs_direct(s) ? "O_DIRECT through io_uring" : "pread fallback", align,
           blocks_per_row);
    uint32_t nseg = psd_segs_current(s);
    double disk = bench_disk_rate(segdir, nseg, span, align, secs);
    if (disk <= 0)
        return 1;
    cat = locs;
    if (compact_run(s, rows, row, (uint32_t)compact_kib << 10) != 0)
        return 1;
    nseg = psd_segs_current(s);
    psd_segs_close(s);
    printf("segments: read %.0f rows/s, %.2f of disk ceiling (%.0f reads/s of %u bytes with "
           "%d in flight)\n", rate, rate / disk, disk, span, BENCH_DISK_DEPTH);
    for (uint32_t n = 1; n <= nseg; n++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/seg-%08u.psg", segdir, n);
        unlink(p);
    }
    rmdir(segdir);
    if (dir == tmpl)
        rmdir(dir);
    free(locs);
    free(r);
    free(rq);
    free(out);
    return 0;
}
