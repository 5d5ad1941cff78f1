/*
 * rowlog.c - the two files of changed sparse rows (rowlog.h).
 */
#include "server/rowlog.h"

#include "common/errors.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#define BATCH_MAGIC 0x4c525350u /* "PSRL" little-endian */
#define BATCH_HEAD 24           /* u32 magic, u32 crc, u64 seq, u32 n, u32 len */

struct psd_rowlog {
    pthread_mutex_t mu;
    int fd[2];
    uint64_t size[2];
    int active;
    char path[2][PATH_MAX];
};

int psd_rowlog_open(const char *dir, psd_rowlog **out)
{
    psd_rowlog *l = calloc(1, sizeof *l);
    if (l == NULL)
        return -ENOMEM;
    pthread_mutex_init(&l->mu, NULL);
    l->fd[0] = l->fd[1] = -1;
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        if (snprintf(l->path[i], sizeof l->path[i], "%s/rows.log.%d", dir, i) >=
            (int)sizeof l->path[i]) {
            rc = -ENAMETOOLONG;
            break;
        }
        l->fd[i] = open(l->path[i], O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        struct stat st;
        if (l->fd[i] < 0 || fstat(l->fd[i], &st) != 0)
            rc = -errno;
        else
            l->size[i] = (uint64_t)st.st_size;
    }
    if (rc != 0) {
        ps_log_error("row log in %s: %s", dir, strerror(-rc));
        psd_rowlog_destroy(l);
        return rc;
    }
    /* Appends go to the empty file, or the smaller (the caller applies and
     * empties both before the first append). */
    l->active = l->size[1] < l->size[0];
    *out = l;
    return 0;
}

void psd_rowlog_destroy(psd_rowlog *l)
{
    if (l == NULL)
        return;
    for (int i = 0; i < 2; i++)
        if (l->fd[i] >= 0)
            close(l->fd[i]);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

int psd_rowlog_append(psd_rowlog *l, uint64_t seq, const void *payload, size_t len,
                      uint32_t nrecs)
{
    if (len > UINT32_MAX)
        return PS_EINVAL_ARG;
    uint8_t h[BATCH_HEAD];
    put32(h, BATCH_MAGIC);
    memcpy(h + 8, &seq, 8);
    put32(h + 16, nrecs);
    put32(h + 20, (uint32_t)len);
    uLong crc = crc32(0L, h + 8, BATCH_HEAD - 8);
    crc = crc32_z(crc, payload, len);
    put32(h + 4, (uint32_t)crc);
    struct iovec iov[2] = {{h, sizeof h}, {(void *)payload, len}};
    pthread_mutex_lock(&l->mu);
    int a = l->active, rc = 0;
    uint64_t at = l->size[a], want = sizeof h + len, done = 0;
    while (rc == 0 && done < want) {
        /* pwritev from where the last batch ended; a short write resumes. */
        struct iovec v[2];
        int nv = 0;
        uint64_t skip = done;
        for (int i = 0; i < 2; i++) {
            if (skip >= iov[i].iov_len) {
                skip -= iov[i].iov_len;
                continue;
            }
            v[nv].iov_base = (uint8_t *)iov[i].iov_base + skip;
            v[nv++].iov_len = iov[i].iov_len - skip;
            skip = 0;
        }
        ssize_t w = pwritev(l->fd[a], v, nv, (off_t)(at + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = w < 0 ? -errno : -EIO;
            break;
        }
        done += (uint64_t)w;
    }
    if (rc == 0 && fdatasync(l->fd[a]) != 0)
        rc = -errno;
    if (rc == 0)
        l->size[a] = at + want; /* else the next batch overwrites this one */
    pthread_mutex_unlock(&l->mu);
    if (rc == -ENOSPC || rc == -EDQUOT)
        return PS_EFULL;
    if (rc != 0)
        ps_log_error("row log %s: %s", l->path[a], strerror(-rc));
    return rc;
}

int psd_rowlog_seal(psd_rowlog *l)
{
    pthread_mutex_lock(&l->mu);
    int a = l->active, r = -1;
    if (l->size[a] > 0 && l->size[!a] == 0) {
        l->active = !a;
        r = a;
    }
    pthread_mutex_unlock(&l->mu);
    return r;
}

int psd_rowlog_reset(psd_rowlog *l, int which)
{
    /* Its pages are clean (each batch was fdatasync'd) and are not read
     * again, but the kernel keeps them as long as LMDB's: in bench/sparse's
     * 221 MiB memory group the two files held 50 MiB of the page cache
     * beside 64 MiB of LMDB's pages while pulls ran (fincore); dropped,
     * LMDB's had 116 MiB. Advice only: a failure changes nothing. */
    (void)posix_fadvise(l->fd[which], 0, 0, POSIX_FADV_DONTNEED);
    pthread_mutex_lock(&l->mu);
    l->size[which] = 0;
    pthread_mutex_unlock(&l->mu);
    return 0;
}

uint64_t psd_rowlog_bytes(psd_rowlog *l, int which)
{
    pthread_mutex_lock(&l->mu);
    uint64_t n = l->size[which];
    pthread_mutex_unlock(&l->mu);
    return n;
}

uint64_t psd_rowlog_total(psd_rowlog *l)
{
    pthread_mutex_lock(&l->mu);
    uint64_t n = l->size[0] + l->size[1];
    pthread_mutex_unlock(&l->mu);
    return n;
}

int psd_rowlog_active(psd_rowlog *l)
{
    pthread_mutex_lock(&l->mu);
    int a = l->active;
    pthread_mutex_unlock(&l->mu);
    return a;
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The records of one batch at p (n of them in len bytes): false when they
 * do not tile the payload exactly. */
static bool records_ok(const uint8_t *p, uint32_t n, uint32_t len)
{
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (len - off < PSD_ROWLOG_REC_HEAD)
            return false;
        uint32_t rl = get32(p + off + 4);
        if (len - off - PSD_ROWLOG_REC_HEAD < rl)
            return false;
        off += PSD_ROWLOG_REC_HEAD + rl;
    }
    return off == len;
}

int psd_rowlog_walk(psd_rowlog *l, int which, uint64_t after, psd_rowlog_fn fn,
                    psd_rowlog_end_fn end, void *ctx, uint64_t *last)
{
    if (last)
        *last = 0;
    /* The batches whole when the walk begins (appends may go on after). */
    uint64_t size = psd_rowlog_bytes(l, which);
    const uint8_t *m = NULL;
    if (size > 0) {
        m = mmap(NULL, size, PROT_READ, MAP_SHARED, l->fd[which], 0);
        if (m == MAP_FAILED)
            return -errno;
        madvise((void *)m, size, MADV_SEQUENTIAL);
    }
    int rc = 0;
    uint64_t off = 0, prev = 0;
    while (rc == 0 && off < size) {
        const uint8_t *h = m + off;
        uint64_t seq = 0;
        uint32_t n = 0, len = 0;
        bool whole = size - off >= BATCH_HEAD;
        if (whole) {
            memcpy(&seq, h + 8, 8);
            n = get32(h + 16);
            len = get32(h + 20);
            whole = get32(h) == BATCH_MAGIC && size - off - BATCH_HEAD >= len;
        }
        if (whole) {
            uLong crc = crc32(0L, h + 8, BATCH_HEAD - 8);
            crc = crc32_z(crc, h + BATCH_HEAD, len);
            whole = (uint32_t)crc == get32(h + 4) && records_ok(h + BATCH_HEAD, n, len);
        }
        if (!whole || seq <= prev) {
            /* A file is written again from its start once applied, so what
             * follows its last batch is an older batch (a lower seq), the
             * rest of one, or a batch a crash cut short: never
             * acknowledged, all of it. */
            if (off < size)
                ps_log_debug("row log %s: ends at byte %llu", l->path[which],
                             (unsigned long long)off);
            break;
        }
        prev = seq;
        if (last)
            *last = seq;
        const uint8_t *p = h + BATCH_HEAD;
        for (uint32_t i = 0; fn != NULL && i < n && seq > after && rc == 0; i++) {
            uint32_t var_id = get32(p), rl = get32(p + 4);
            int64_t id;
            memcpy(&id, p + 8, 8);
            rc = fn(ctx, seq, var_id, id, p + PSD_ROWLOG_REC_HEAD, rl);
            p += PSD_ROWLOG_REC_HEAD + rl;
        }
        off += BATCH_HEAD + len;
    }
    if (rc == 0 && end != NULL)
        rc = end(ctx);
    if (m != NULL)
        munmap((void *)m, size);
    return rc;
}
