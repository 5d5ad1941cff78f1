/*
 * diskrate.c - the disk's ceiling for psd's cold reads (diskrate.h).
 */
#include "bench/diskrate.h"

#include "common/sparseclient.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct probe {
    int *fds;
    uint64_t *sizes;
    uint32_t nseg, span, align;
    uint8_t *buf;
    uint64_t rng;
};

/* Queues a read of a random span into slot. */
static void queue_read(struct io_uring *ring, struct probe *p, uint64_t slot)
{
    uint32_t n = 1 + (uint32_t)(ps_sparse_mix64(++p->rng) % p->nseg);
    uint64_t blocks = (p->sizes[n] - p->span) / p->align;
    uint64_t off = (ps_sparse_mix64(++p->rng) % (blocks ? blocks : 1)) * p->align;
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    io_uring_prep_read(sqe, p->fds[n], p->buf + slot * p->span, p->span, off);
    io_uring_sqe_set_data64(sqe, slot);
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double bench_disk_rate(const char *dir, uint32_t nseg, uint32_t span, uint32_t align,
                       double secs)
{
    struct probe p = {.nseg = nseg, .span = span, .align = align, .rng = 99};
    p.fds = calloc(nseg + 1, sizeof *p.fds);
    p.sizes = calloc(nseg + 1, sizeof *p.sizes);
    struct io_uring ring;
    bool ring_ok = false, drained = false;
    double rate = 0;
    int opened = 1;
    for (; p.fds && p.sizes && opened <= (int)nseg; opened++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/seg-%08u.psg", dir, (unsigned)opened);
        struct stat st;
        p.fds[opened] = open(path, O_RDONLY | O_DIRECT);
        if (p.fds[opened] < 0 || fstat(p.fds[opened], &st) != 0 || st.st_size < span) {
            fprintf(stderr, "disk rate: %s: %s\n", path, strerror(errno ? errno : EINVAL));
            goto out;
        }
        p.sizes[opened] = (uint64_t)st.st_size;
    }
    if (!p.fds || !p.sizes || io_uring_queue_init(BENCH_DISK_DEPTH, &ring, 0) < 0 ||
        !(ring_ok = true) ||
        posix_memalign((void **)&p.buf, align, (size_t)BENCH_DISK_DEPTH * span) != 0)
        goto out;
    for (uint64_t slot = 0; slot < BENCH_DISK_DEPTH; slot++)
        queue_read(&ring, &p, slot);
    /* Like psd_segs_read: refill the slots each wake-up reaped, one submit
     * for them all. */
    uint64_t done = 0;
    double t0 = seconds(), t1 = t0;
    while ((t1 = seconds()) - t0 < secs) {
        if (io_uring_submit_and_wait(&ring, 1) < 0)
            continue;
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            if (cqe->res < 0) {
                fprintf(stderr, "disk rate: read: %s\n", strerror(-cqe->res));
                goto out;
            }
            queue_read(&ring, &p, io_uring_cqe_get_data64(cqe));
            seen++;
        }
        io_uring_cq_advance(&ring, seen);
        done += seen;
    }
    rate = (double)done / (t1 - t0);
    /* Every slot has a read queued or in flight: all complete before buf is
     * freed (the kernel would write into freed memory). */
    io_uring_submit(&ring);
    for (int left = BENCH_DISK_DEPTH; left > 0; left--) {
        struct io_uring_cqe *cqe;
        while (io_uring_wait_cqe(&ring, &cqe) == -EINTR)
            ;
        io_uring_cqe_seen(&ring, cqe);
    }
    drained = true;
out:
    if (!drained && p.buf != NULL)
        p.buf = NULL; /* reads may still land in it: left to the process's exit */
    if (ring_ok)
        io_uring_queue_exit(&ring);
    for (uint32_t n = 1; p.fds && n <= nseg; n++)
        if (p.fds[n] > 0)
            close(p.fds[n]);
    free(p.fds);
    free(p.sizes);
    free(p.buf);
    return rate;
}
