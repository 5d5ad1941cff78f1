/*
 * segment.c - append-only segment files of sparse rows (segment.h). The
 * one file of psd that sees liburing and, on psd's side, ISA-L's CRC
 * (common/confine.h); compiled with -DPS_OWNS_URING -DPS_OWNS_ISAL.
 */
#include "server/segment.h"

#include "common/errors.h"
#include "common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <limits.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#endif
#ifndef VALGRIND_MAKE_MEM_DEFINED
#define VALGRIND_MAKE_MEM_DEFINED(p, n) ((void)(p), (void)(n))
#endif

#define SEG_MAGIC 0x52535350u /* "PSSR" little-endian */
static const char seg_file_magic[8] = "PSDSEG1";
#define RING_DEPTH 256
#define ALIGN_FALLBACK 4096

struct psd_segs {
    char *dir;
    uint64_t seg_max;
    pthread_mutex_t mu; /* rfd */
    int *rfd;           /* per segment number: the read fd, -1 not open */
    uint32_t rfd_cap;
    uint32_t cur;       /* the segment appends go to */
    int wfd;
    uint64_t wend;      /* its synced end */
    uint8_t *buf;       /* the batch not yet written */
    size_t blen, bcap;
    atomic_uint_fast64_t bytes;
    atomic_bool direct;
    uint32_t align;
};

/* ---- records ------------------------------------------------------------ */

static uint32_t crc32c_chain(uint32_t crc, const void *p, size_t len)
{
    /* ISA-L's crc32_iscsi neither inverts its seed nor its result (see
     * worker/events.c); its length is an int. */
    const unsigned char *c = p;
    while (len > 0) {
        int n = len > (size_t)(INT_MAX / 2) ? INT_MAX / 2 : (int)len;
        crc = crc32_iscsi((unsigned char *)c, n, crc);
        c += n;
        len -= (size_t)n;
    }
    return crc;
}

static uint32_t rec_crc(const uint8_t *rec, size_t len)
{
    uint8_t h[PSD_SEG_REC_HEAD];
    memcpy(h, rec, sizeof h);
    memset(h + 12, 0, 4);
    uint32_t crc = crc32c_chain(0xffffffffu, h, sizeof h);
    return ~crc32c_chain(crc, rec + PSD_SEG_REC_HEAD, len);
}

/* Checks the record at rec (avail bytes there): 0 with its payload length,
 * or a reason. */
static const char *rec_check(const uint8_t *rec, uint64_t avail, uint32_t *len)
{
    if (avail < PSD_SEG_REC_HEAD)
        return "truncated record header";
    uint32_t magic, l, crc;
    memcpy(&magic, rec, 4);
    memcpy(&l, rec + 4, 4);
    memcpy(&crc, rec + 12, 4);
    if (magic != SEG_MAGIC)
        return "bad record magic";
    if (l > avail - PSD_SEG_REC_HEAD)
        return "truncated record";
    if (rec_crc(rec, l) != crc)
        return "record checksum mismatch";
    *len = l;
    return NULL;
}

/* ---- files -------------------------------------------------------------- */

static char *seg_path(const psd_segs *s, uint32_t n, const char *suffix)
{
    char *p;
    if (asprintf(&p, "%s/seg-%08u.psg%s", s->dir, n, suffix) < 0)
        return NULL;
    return p;
}

static int sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

static int full_rc(int e)
{
    return e == ENOSPC || e == EFBIG || e == EDQUOT ? PS_EFULL : -e;
}

static int write_all(int fd, const uint8_t *p, size_t len, uint64_t off)
{
    while (len > 0) {
        ssize_t w = pwrite(fd, p, len, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return full_rc(errno);
        }
        p += w;
        len -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

/* Creates segment n whole (header written and synced under a temporary
 * name, then renamed), and makes it the one appends go to. */
static int seg_create(psd_segs *s, uint32_t n)
{
    char *tmp = seg_path(s, n, ".tmp"), *path = seg_path(s, n, "");
    int rc = tmp && path ? 0 : -ENOMEM;
    int fd = -1;
    if (rc == 0) {
        fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
            rc = -errno;
    }
    if (rc == 0) {
        uint8_t h[PSD_SEG_FILE_HEAD] = {0};
        memcpy(h, seg_file_magic, 8);
        memcpy(h + 8, &n, 4);
        rc = write_all(fd, h, sizeof h, 0);
    }
    if (rc == 0 && fdatasync(fd) != 0)
        rc = full_rc(errno);
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -errno;
    if (rc == 0)
        rc = sync_dir(s->dir);
    if (rc != 0) {
        if (fd >= 0)
            close(fd);
        if (tmp)
            unlink(tmp);
    } else {
        if (s->wfd >= 0)
            close(s->wfd);
        s->wfd = fd;
        s->cur = n;
        s->wend = PSD_SEG_FILE_HEAD;
        atomic_fetch_add(&s->bytes, PSD_SEG_FILE_HEAD);
    }
    free(tmp);
    free(path);
    return rc;
}

/* Checks every record of segment n; *end: where the last whole one ends.
 * cut: the committed end when n holds it (bytes past it are cut off), else
 * 0. */
static int seg_verify(psd_segs *s, uint32_t n, uint64_t cut, uint64_t *end, char *why,
                      size_t whylen)
{
    char *path = seg_path(s, n, "");
    if (path == NULL)
        return -ENOMEM;
    int rc = 0;
    int fd = open(path, (cut ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        rc = ps_errf(-errno, why, whylen, "segment %s: cannot open: %s", path,
                     strerror(errno));
        goto out;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (cut && size < cut) {
        rc = ps_errf(PS_ECORRUPT, why, whylen,
                     "segment %s: offset %llu: truncated (committed rows end at %llu)", path,
                     (unsigned long long)size, (unsigned long long)cut);
        goto out;
    }
    if (cut && size > cut) {
        ps_log_warn("segment %s: cutting %llu bytes past the committed end %llu (a batch "
                    "never acknowledged)", path, (unsigned long long)(size - cut),
                    (unsigned long long)cut);
        if (ftruncate(fd, (off_t)cut) != 0 || fdatasync(fd) != 0) {
            rc = ps_errf(-errno, why, whylen, "segment %s: cannot cut: %s", path,
                         strerror(errno));
            goto out;
        }
        size = cut;
    }
    if (size < PSD_SEG_FILE_HEAD) {
        rc = ps_errf(PS_ECORRUPT, why, whylen, "segment %s: offset 0: truncated file header",
                     path);
        goto out;
    }
    const uint8_t *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        rc = ps_errf(-errno, why, whylen, "segment %s: cannot map: %s", path, strerror(errno));
        goto out;
    }
    madvise((void *)m, size, MADV_SEQUENTIAL);
    uint32_t hn;
    memcpy(&hn, m + 8, 4);
    if (memcmp(m, seg_file_magic, 8) != 0 || hn != n) {
        rc = ps_errf(PS_ECORRUPT, why, whylen, "segment %s: offset 0: bad file header", path);
    } else {
        uint64_t off = PSD_SEG_FILE_HEAD;
        while (off < size) {
            uint32_t len;
            const char *bad = rec_check(m + off, size - off, &len);
            if (bad != NULL) {
                rc = ps_errf(PS_ECORRUPT, why, whylen, "segment %s: offset %llu: %s", path,
                             (unsigned long long)off, bad);
                break;
            }
            off += PSD_SEG_REC_HEAD + len;
        }
        *end = off;
    }
    munmap((void *)m, size);
out:
    if (fd >= 0)
        close(fd);
    free(path);
    return rc;
}

int psd_segs_open(const char *dir, uint64_t seg_max, const psd_seg_loc *committed,
                  psd_segs **out, char *why, size_t whylen)
{
    psd_segs *s = calloc(1, sizeof *s);
    if (s == NULL || (s->dir = strdup(dir)) == NULL) {
        free(s);
        return -ENOMEM;
    }
    s->seg_max = seg_max ? seg_max : PSD_SEG_MAX_DEFAULT;
    s->wfd = -1;
    s->align = ALIGN_FALLBACK;
    atomic_init(&s->direct, true);
    pthread_mutex_init(&s->mu, NULL);
    int rc = 0;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        rc = ps_errf(-errno, why, whylen, "segments %s: cannot create: %s", dir,
                     strerror(errno));
        goto fail;
    }
    DIR *d = opendir(dir);
    if (d == NULL) {
        rc = -errno;
        goto fail;
    }
    uint32_t max = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        unsigned n;
        char tail;
        int got = sscanf(de->d_name, "seg-%8u.psg%c", &n, &tail);
        if (got == 1 && n > max)
            max = n;
        if (got == 2 && strcmp(de->d_name + strlen(de->d_name) - 4, ".tmp") == 0 &&
            unlinkat(dirfd(d), de->d_name, 0) != 0)
            ps_log_warn("segments %s: cannot remove %s, a segment a crash left unmade: %s",
                        dir, de->d_name, strerror(errno));
    }
    closedir(d);
    for (; committed != NULL && max > committed->seg; max--) {
        /* Only batches never committed: gone. */
        char *p = seg_path(s, max, "");
        if (p != NULL && unlink(p) != 0 && errno != ENOENT)
            ps_log_warn("segment %s: cannot remove: %s", p, strerror(errno));
        free(p);
    }
    if (committed != NULL && committed->seg > 0 && max < committed->seg) {
        rc = ps_errf(PS_ECORRUPT, why, whylen,
                     "segment %s/seg-%08u.psg: offset 0: missing (committed rows end at %llu)",
                     dir, committed->seg, (unsigned long long)committed->off);
        goto fail;
    }
    uint64_t end = 0;
    for (uint32_t n = 1; n <= max; n++) {
        char *p = seg_path(s, n, "");
        struct stat st;
        bool exists = p != NULL && stat(p, &st) == 0;
        free(p);
        if (!exists)
            continue; /* compacted away */
        uint64_t cut = committed != NULL && committed->seg == n ? committed->off : 0;
        rc = seg_verify(s, n, cut, &end, why, whylen);
        if (rc != 0)
            goto fail;
        atomic_fetch_add(&s->bytes, end);
    }
    if (max == 0 || end >= s->seg_max) {
        rc = seg_create(s, max + 1);
        if (rc != 0) {
            ps_errf(rc, why, whylen, "segments %s: cannot create a segment: %s", dir,
                    ps_strerror(rc));
            goto fail;
        }
    } else {
        char *p = seg_path(s, max, "");
        s->wfd = p ? open(p, O_RDWR | O_CLOEXEC) : -1;
        free(p);
        if (s->wfd < 0) {
            rc = -errno;
            goto fail;
        }
        s->cur = max;
        s->wend = end;
    }
#ifdef STATX_DIOALIGN
    /* The direct-I/O alignment of a segment file (a directory has none). */
    char *cp = seg_path(s, s->cur, "");
    struct statx sx;
    if (cp != NULL && statx(AT_FDCWD, cp, 0, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align > 0) {
        uint32_t a = sx.stx_dio_offset_align;
        if (sx.stx_dio_mem_align > a)
            a = sx.stx_dio_mem_align;
        s->align = a;
    }
    free(cp);
#endif
    *out = s;
    return 0;
fail:
    psd_segs_close(s);
    return rc;
}

void psd_segs_close(psd_segs *s)
{
    if (s == NULL)
        return;
    for (uint32_t i = 0; i < s->rfd_cap; i++)
        if (s->rfd[i] >= 0)
            close(s->rfd[i]);
    if (s->wfd >= 0)
        close(s->wfd);
    pthread_mutex_destroy(&s->mu);
    free(s->rfd);
    free(s->buf);
    free(s->dir);
    free(s);
}

/* ---- appends ------------------------------------------------------------ */

int psd_segs_append(psd_segs *s, uint32_t var_id, int64_t id, uint64_t version,
                    const void *head, size_t head_len, const void *body, size_t body_len,
                    psd_seg_loc *loc)
{
    size_t len = head_len + body_len;
    if (len > UINT32_MAX - PSD_SEG_REC_HEAD)
        return PS_EINVAL_ARG;
    if (s->blen == 0 && s->wend >= s->seg_max) {
        /* Sealed: the batch starts a new segment. */
        int rc = seg_create(s, s->cur + 1);
        if (rc != 0)
            return rc;
    }
    size_t need = s->blen + PSD_SEG_REC_HEAD + len;
    if (need > s->bcap) {
        size_t nc = s->bcap ? s->bcap : 65536;
        while (nc < need)
            nc *= 2;
        uint8_t *b = realloc(s->buf, nc);
        if (b == NULL)
            return -ENOMEM;
        s->buf = b;
        s->bcap = nc;
    }
    uint8_t *r = s->buf + s->blen;
    uint32_t magic = SEG_MAGIC, l = (uint32_t)len, zero = 0;
    memcpy(r, &magic, 4);
    memcpy(r + 4, &l, 4);
    memcpy(r + 8, &var_id, 4);
    memcpy(r + 12, &zero, 4);
    memcpy(r + 16, &id, 8);
    memcpy(r + 24, &version, 8);
    if (head_len)
        memcpy(r + PSD_SEG_REC_HEAD, head, head_len);
    if (body_len)
        memcpy(r + PSD_SEG_REC_HEAD + head_len, body, body_len);
    uint32_t crc = rec_crc(r, len);
    memcpy(r + 12, &crc, 4);
    loc->seg = s->cur;
    loc->off = s->wend + s->blen;
    loc->len = (uint32_t)(PSD_SEG_REC_HEAD + len);
    s->blen = need;
    return 0;
}

int psd_segs_sync(psd_segs *s)
{
    if (s->blen == 0)
        return 0;
    int rc = write_all(s->wfd, s->buf, s->blen, s->wend);
    if (rc == 0 && fdatasync(s->wfd) != 0)
        rc = full_rc(errno);
    if (rc != 0) {
        /* Nothing of the batch stays: the file ends where it did. */
        if (ftruncate(s->wfd, (off_t)s->wend) != 0)
            ps_log_warn("segment %s/seg-%08u.psg: cannot cut a failed batch: %s", s->dir,
                        s->cur, strerror(errno));
        s->blen = 0;
        return rc;
    }
    s->wend += s->blen;
    atomic_fetch_add(&s->bytes, s->blen);
    s->blen = 0;
    return 0;
}

void psd_segs_discard(psd_segs *s)
{
    s->blen = 0;
}

/* ---- reads -------------------------------------------------------------- */

/* The read fd of segment n (opened with O_DIRECT where the file system
 * takes it), or -errno. */
static int read_fd(psd_segs *s, uint32_t n)
{
    pthread_mutex_lock(&s->mu);
    int fd;
    if (n >= s->rfd_cap) {
        uint32_t nc = s->rfd_cap ? s->rfd_cap : 64;
        while (nc <= n)
            nc *= 2;
        int *a = realloc(s->rfd, nc * sizeof *a);
        if (a == NULL) {
            fd = -ENOMEM;
            goto out;
        }
        for (uint32_t i = s->rfd_cap; i < nc; i++)
            a[i] = -1;
        s->rfd = a;
        s->rfd_cap = nc;
    }
    fd = s->rfd[n];
    if (fd < 0) {
        char *p = seg_path(s, n, "");
        if (p == NULL) {
            fd = -ENOMEM;
            goto out;
        }
        fd = open(p, O_RDONLY | O_CLOEXEC | (atomic_load(&s->direct) ? O_DIRECT : 0));
        if (fd < 0 && errno == EINVAL) {
            ps_log_warn("segments %s: no O_DIRECT on this file system: cold reads go "
                        "through the page cache", s->dir);
            atomic_store(&s->direct, false);
            fd = open(p, O_RDONLY | O_CLOEXEC);
        }
        if (fd < 0)
            fd = -errno;
        else
            s->rfd[n] = fd;
        free(p);
    }
out:
    pthread_mutex_unlock(&s->mu);
    return fd;
}

/* The calling thread's ring; NULL where io_uring is not available. */
static pthread_key_t ring_key;
static pthread_once_t ring_once = PTHREAD_ONCE_INIT;
static atomic_bool ring_broken;
static __thread struct io_uring *ring_tls;

static void ring_free(void *p)
{
    io_uring_queue_exit(p);
    free(p);
}

static void ring_key_make(void)
{
    pthread_key_create(&ring_key, ring_free);
}

static struct io_uring *ring_get(void)
{
    if (ring_tls != NULL)
        return ring_tls;
    if (atomic_load(&ring_broken))
        return NULL;
    pthread_once(&ring_once, ring_key_make);
    struct io_uring *r = malloc(sizeof *r);
    if (r == NULL)
        return NULL;
    int rc = io_uring_queue_init(RING_DEPTH, r, 0);
    if (rc < 0) {
        if (!atomic_exchange(&ring_broken, true))
            ps_log_warn("io_uring unavailable (%s): cold sparse rows are read with pread",
                        strerror(-rc));
        free(r);
        return NULL;
    }
    pthread_setspecific(ring_key, r);
    ring_tls = r;
    return r;
}

/* Checks the record read for q (at rec) and copies its row out. */
static void read_finish(psd_seg_read *q, const uint8_t *rec)
{
    uint32_t len, var_id;
    int64_t id;
    q->rc = PS_ECORRUPT;
    q->version = 0;
    if (rec_check(rec, q->loc.len, &len) != NULL || PSD_SEG_REC_HEAD + len != q->loc.len)
        return;
    memcpy(&var_id, rec + 8, 4);
    memcpy(&id, rec + 16, 8);
    if (var_id != q->var_id || id != q->id || len > q->cap)
        return;
    memcpy(&q->version, rec + 24, 8);
    memcpy(q->dst, rec + PSD_SEG_REC_HEAD, len);
    q->rc = 0;
}

static uint64_t span_of(const psd_seg_read *q, uint64_t a, uint64_t *start);

static int read_one_pread(psd_segs *s, psd_seg_read *q, uint8_t *tmp)
{
    int fd = read_fd(s, q->loc.seg);
    if (fd < 0)
        return fd;
    uint64_t start, span = span_of(q, s->align, &start);
    ssize_t r = pread(fd, tmp, span, (off_t)start);
    if (r < 0)
        return -errno;
    if ((uint64_t)r < q->loc.off + q->loc.len - start) {
        q->rc = PS_ECORRUPT;
        return 0;
    }
    read_finish(q, tmp + (q->loc.off - start));
    return 0;
}

/* The bytes read for q: its record widened to a's multiples. */
static uint64_t span_of(const psd_seg_read *q, uint64_t a, uint64_t *start)
{
    *start = q->loc.off & ~(a - 1);
    return (q->loc.off + q->loc.len - *start + a - 1) & ~(a - 1);
}

/* Reads through the ring, keeping up to RING_DEPTH in flight: a slot whose
 * read completes takes the next request at once, so no round waits for
 * its slowest read. */
static int read_ring(psd_segs *s, struct io_uring *ring, psd_seg_read *rq, size_t n,
                     uint8_t *arena, uint64_t slot_bytes)
{
    uint64_t a = s->align;
    size_t next = 0, inflight = 0, freeslot[RING_DEPTH], nfree = 0;
    for (size_t k = 0; k < RING_DEPTH; k++)
        freeslot[nfree++] = RING_DEPTH - 1 - k;
    int rc = 0;
    while (next < n || inflight > 0) {
        size_t queued = 0;
        while (rc == 0 && next < n && nfree > 0) {
            psd_seg_read *q = &rq[next];
            int fd = read_fd(s, q->loc.seg);
            if (fd < 0) {
                rc = fd;
                break;
            }
            uint64_t start, span = span_of(q, a, &start);
            size_t slot = freeslot[--nfree];
            struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
            io_uring_prep_read(sqe, fd, arena + slot * slot_bytes, (unsigned)span, start);
            io_uring_sqe_set_data64(sqe, (uint64_t)next << 16 | slot);
            next++;
            queued++;
        }
        if (rc != 0 && next < n)
            next = n; /* what is in flight still completes */
        if (queued == 0 && inflight == 0)
            break;
        int sr;
        do
            sr = io_uring_submit_and_wait(ring, 1);
        while (sr == -EINTR);
        if (sr < 0) {
            /* Nothing more was queued: what is in flight stays in flight
             * and the ring is left as is, for its thread's next call. */
            return rc ? rc : sr;
        }
        inflight += queued;
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(ring, head, cqe) {
            uint64_t d = io_uring_cqe_get_data64(cqe);
            size_t slot = (size_t)(d & 0xffff);
            psd_seg_read *q = &rq[d >> 16];
            int res = cqe->res;
            seen++;
            uint8_t *buf = arena + slot * slot_bytes;
            uint64_t start;
            span_of(q, a, &start);
            if (res == -EINVAL) {
                /* Alignment refused: read this one through pread. */
                int pr = read_one_pread(s, q, buf);
                rc = rc ? rc : pr;
            } else if (res < 0) {
                rc = rc ? rc : res;
            } else if (VALGRIND_MAKE_MEM_DEFINED(buf, res),
                       (uint64_t)res < q->loc.off + q->loc.len - start) {
                /* (the kernel filled buf behind valgrind's back) */
                q->rc = PS_ECORRUPT;
            } else {
                read_finish(q, buf + (q->loc.off - start));
            }
            freeslot[nfree++] = slot;
        }
        io_uring_cq_advance(ring, seen);
        inflight -= seen;
    }
    return rc;
}

int psd_segs_read(psd_segs *s, psd_seg_read *rq, size_t n)
{
    uint64_t a = s->align, slot_bytes = a;
    for (size_t i = 0; i < n; i++) {
        uint64_t start, span = span_of(&rq[i], a, &start);
        if (span > slot_bytes)
            slot_bytes = span;
        rq[i].rc = PS_ECORRUPT; /* until its read says otherwise */
    }
    struct io_uring *ring = ring_get();
    size_t slots = ring != NULL ? RING_DEPTH : 1;
    uint8_t *arena;
    if (posix_memalign((void **)&arena, a, slots * slot_bytes) != 0)
        return -ENOMEM;
    int rc = 0;
    if (ring != NULL)
        rc = read_ring(s, ring, rq, n, arena, slot_bytes);
    else
        for (size_t i = 0; i < n && rc == 0; i++)
            rc = read_one_pread(s, &rq[i], arena);
    free(arena);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        if (rq[i].rc != 0)
            return PS_ECORRUPT;
    return 0;
}

psd_seg_loc psd_segs_end(const psd_segs *s)
{
    return (psd_seg_loc){.seg = s->cur, .off = s->wend, .len = 0};
}

uint32_t psd_segs_current(const psd_segs *s)
{
    return s->cur;
}

uint64_t psd_segs_bytes(const psd_segs *s)
{
    return atomic_load(&((psd_segs *)s)->bytes);
}

bool psd_segs_direct(const psd_segs *s)
{
    return atomic_load(&((psd_segs *)s)->direct) && !atomic_load(&ring_broken);
}

uint32_t psd_segs_align(const psd_segs *s)
{
    return s->align;
}
