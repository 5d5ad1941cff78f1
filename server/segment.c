/*
 * segment.c - append-only segment files of sparse rows (segment.h). The
 * one file of psd that sees liburing and, on psd's side, ISA-L's CRC
 * (common/confine.h); compiled with -DPS_OWNS_URING -DPS_OWNS_ISAL.
 */
#include "server/segment.h"

#include "common/buf.h"
#include "common/clock.h"
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
#define SEG_NUM_MAX (1u << 24) /* segments of a directory, with room to spare */

/* What the module knows of one segment number. */
struct seg_info {
    int rfd;         /* the read fd, -1 not open */
    bool exists;     /* a file of the directory, not removed */
    uint64_t bytes;  /* its record bytes (the file header not counted) */
    uint64_t live;   /* of them, what the catalog points at */
    int64_t gone_ms; /* when psd_segs_remove unlinked it (0: never) */
};

struct psd_segs {
    char *dir;
    uint64_t seg_max;
    pthread_mutex_t mu; /* seg, seg_cap */
    struct seg_info *seg; /* by segment number */
    uint32_t seg_cap;
    uint32_t cur;       /* the segment appends go to */
    int wfd;
    uint64_t wend;      /* its synced end */
    uint8_t *buf;       /* the batch not yet written */
    size_t blen, bcap;
    atomic_uint_fast64_t bytes;
    atomic_bool direct;
    uint32_t align;
    atomic_uint_fast64_t copied, removed; /* by compaction */
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

static char *seg_path_in(const char *dir, uint32_t n, const char *suffix)
{
    char *p;
    if (asprintf(&p, "%s/seg-%08u.psg%s", dir, n, suffix) < 0)
        return NULL;
    return p;
}

static char *seg_path(const psd_segs *s, uint32_t n, const char *suffix)
{
    return seg_path_in(s->dir, n, suffix);
}

/* The state of segment n, the array grown to hold it; NULL when out of
 * memory or for a number no directory reaches (a corrupt location). Under
 * s->mu. */
static struct seg_info *seg_get(psd_segs *s, uint32_t n)
{
    if (n >= SEG_NUM_MAX)
        return NULL;
    if (n >= s->seg_cap) {
        uint32_t nc = s->seg_cap ? s->seg_cap : 64;
        while (nc <= n)
            nc *= 2;
        struct seg_info *a = realloc(s->seg, nc * sizeof *a);
        if (a == NULL)
            return NULL;
        for (uint32_t i = s->seg_cap; i < nc; i++)
            a[i] = (struct seg_info){.rfd = -1};
        s->seg = a;
        s->seg_cap = nc;
    }
    return &s->seg[n];
}

/* Segment n's state starts over as a file of bytes record bytes, all of
 * them counted live. Returns 0 or -ENOMEM. */
static int seg_found(psd_segs *s, uint32_t n, uint64_t bytes)
{
    pthread_mutex_lock(&s->mu);
    struct seg_info *g = seg_get(s, n);
    if (g != NULL) {
        g->exists = true;
        g->bytes = g->live = bytes;
        g->gone_ms = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return g != NULL ? 0 : -ENOMEM;
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
        rc = seg_found(s, n, 0);
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
        if (!exists && n == max) {
            rc = ps_errf(PS_ECORRUPT, why, whylen, "segment %s/seg-%08u.psg: offset 0: "
                         "missing (the newest segment%s)", dir, n,
                         committed != NULL ? ", which holds the committed end" : "");
            goto fail;
        }
        if (!exists)
            continue; /* compacted away */
        uint64_t cut = committed != NULL && committed->seg == n ? committed->off : 0;
        rc = seg_verify(s, n, cut, &end, why, whylen);
        if (rc == 0)
            rc = seg_found(s, n, end - PSD_SEG_FILE_HEAD);
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
    for (uint32_t i = 0; i < s->seg_cap; i++)
        if (s->seg[i].rfd >= 0)
            close(s->seg[i].rfd);
    if (s->wfd >= 0)
        close(s->wfd);
    pthread_mutex_destroy(&s->mu);
    PS_FREE_ALL(s->seg, s->buf, s->dir, s);
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
    pthread_mutex_lock(&s->mu);
    struct seg_info *g = &s->seg[s->cur]; /* seg_create made it */
    g->bytes += s->blen;
    g->live += s->blen;
    pthread_mutex_unlock(&s->mu);
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
    struct seg_info *g = seg_get(s, n);
    int fd = g != NULL ? g->rfd : -ENOMEM;
    if (g != NULL && fd < 0) {
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
            g->rfd = fd;
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

/* Each thread's read arena, kept from call to call: a batch's reads land
 * in slots of it (RING_DEPTH of the widest span), and allocating it for
 * every call cost an mmap, its page faults and a munmap per call (charged
 * to psd's memory group each time). */
static pthread_key_t arena_key;
static pthread_once_t arena_once = PTHREAD_ONCE_INIT;
static __thread uint8_t *arena_tls;
static __thread size_t arena_cap, arena_align;

static void arena_key_make(void)
{
    pthread_key_create(&arena_key, free);
}

/* At least bytes aligned to align, or NULL. */
static uint8_t *arena_get(size_t align, size_t bytes)
{
    if (arena_tls != NULL && arena_cap >= bytes && arena_align == align)
        return arena_tls;
    pthread_once(&arena_once, arena_key_make);
    uint8_t *a;
    if (posix_memalign((void **)&a, align, bytes) != 0)
        return NULL;
    free(arena_tls);
    arena_tls = a;
    arena_cap = bytes;
    arena_align = align;
    pthread_setspecific(arena_key, a);
    return a;
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

/* Checks the record read for q (at rec): its CRC, length, table and id.
 * Returns its row's length, or sets q->rc PS_ECORRUPT and returns 0. */
static uint32_t read_check(psd_seg_read *q, const uint8_t *rec)
{
    uint32_t len, var_id;
    int64_t id;
    q->rc = PS_ECORRUPT;
    q->version = 0;
    if (rec_check(rec, q->loc.len, &len) != NULL || PSD_SEG_REC_HEAD + len != q->loc.len)
        return 0;
    memcpy(&var_id, rec + 8, 4);
    memcpy(&id, rec + 16, 8);
    if (var_id != q->var_id || id != q->id || len > q->cap)
        return 0;
    memcpy(&q->version, rec + 24, 8);
    q->rc = 0;
    return len;
}

/* Checks the record read for q (at rec) and copies its row out. */
static void read_finish(psd_seg_read *q, const uint8_t *rec)
{
    uint32_t len = read_check(q, rec);
    if (q->rc == 0)
        memcpy(q->dst, rec + PSD_SEG_REC_HEAD, len);
}

/* Checks the record read for q (at rec), whose row stays where it is. */
static void read_finish_in_place(psd_seg_read *q, const uint8_t *rec)
{
    (void)read_check(q, rec);
    if (q->rc != 0)
        q->dst = NULL;
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
    uint8_t *arena = arena_get(a, slots * slot_bytes);
    if (arena == NULL)
        return -ENOMEM;
    int rc = 0;
    if (ring != NULL)
        rc = read_ring(s, ring, rq, n, arena, slot_bytes);
    else
        for (size_t i = 0; i < n && rc == 0; i++)
            rc = read_one_pread(s, &rq[i], arena);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        if (rq[i].rc != 0)
            return PS_ECORRUPT;
    return 0;
}

/* ---- reads in the background ---------------------------------------------- */

/* A batch's reads are submitted and reaped by a thread of its own: the
 * device takes only so many at once (128 tags on this machine's virtio
 * disk), and io_uring_enter with a batch of 600 blocked the caller for
 * ~5.5 ms, as long as the reads themselves. The thread keeps up to
 * AREAD_DEPTH in flight and finishes each read as it completes. A table
 * has two of these in flight at once (sparse_cold.c), and the disk's
 * scheduler holds 256 requests (its nr_requests): past that, io_uring
 * hands reads to worker threads of its own (iou-wrk, seen in psd during
 * bench/sparse with 256 a ring), so each keeps 128, the disk's tags. */
#define AREAD_DEPTH 128

struct psd_seg_aread {
    struct io_uring ring;
    uint8_t *arena;        /* the batch's buffers, aligned to its segments' */
    size_t arena_cap;
    uint32_t align;
    uint64_t slot_bytes;   /* a read's room in it */
    psd_seg_read *rq;      /* the batch (the caller's) */
    int *fd;               /* (n) each read's descriptor, -1: none */
    size_t n, fdcap;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool busy;             /* handed to the thread, not yet waited for */
    bool done;             /* the thread finished it (rc) */
    bool quit;
    bool ready;            /* the thread made its ring (rc says whether) */
    int rc;
};

/* Reads the batch: up to AREAD_DEPTH in flight, a slot's next read
 * submitted as one completes. Returns 0, or io_uring_enter's error (what
 * was in flight was reaped first). */
static int aread_run(psd_seg_aread *a)
{
    uint64_t al = a->align;
    size_t next = 0, inflight = 0;
    int rc = 0;
    while (next < a->n || inflight > 0) {
        while (rc == 0 && next < a->n && inflight < AREAD_DEPTH) {
            psd_seg_read *q = &a->rq[next];
            struct io_uring_sqe *sqe = a->fd[next] >= 0 ? io_uring_get_sqe(&a->ring) : NULL;
            if (sqe == NULL && a->fd[next] >= 0)
                break; /* the queue is full: submitted below */
            if (sqe != NULL) {
                uint64_t start, span = span_of(q, al, &start);
                io_uring_prep_read(sqe, a->fd[next], a->arena + next * a->slot_bytes,
                                   (unsigned)span, start);
                io_uring_sqe_set_data64(sqe, next);
                inflight++;
            }
            next++;
        }
        if (inflight == 0)
            break;
        int sr;
        do
            sr = io_uring_submit_and_wait(&a->ring, 1);
        while (sr == -EINTR);
        if (sr < 0 && rc == 0) {
            rc = sr;
            next = a->n; /* nothing more: what is in flight is reaped */
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&a->ring, head, cqe) {
            size_t k = (size_t)io_uring_cqe_get_data64(cqe);
            psd_seg_read *q = &a->rq[k];
            int res = cqe->res;
            seen++;
            uint8_t *buf = a->arena + k * a->slot_bytes;
            uint64_t start;
            span_of(q, al, &start);
            if (res < 0) {
                q->rc = res;
            } else if (VALGRIND_MAKE_MEM_DEFINED(buf, res),
                       (uint64_t)res < q->loc.off + q->loc.len - start) {
                q->rc = PS_ECORRUPT;
            } else {
                /* read_finish copies the row out; here it stays in place. */
                uint8_t *rec = buf + (q->loc.off - start);
                q->dst = rec + PSD_SEG_REC_HEAD;
                q->cap = q->loc.len - PSD_SEG_REC_HEAD;
                read_finish_in_place(q, rec);
            }
        }
        io_uring_cq_advance(&a->ring, seen);
        inflight -= seen;
        if (sr < 0 && seen == 0 && inflight > 0)
            usleep(1000); /* the ring refused even the wait: try again */
    }
    return rc;
}

static void *aread_main(void *arg)
{
    psd_seg_aread *a = arg;
    /* The ring is this thread's alone (SINGLE_ISSUER), and completions are
     * processed when it waits for them (DEFER_TASKRUN), not by interrupting
     * it as they come: made here, by the thread that uses it. */
    struct io_uring_params p = {.flags = IORING_SETUP_SINGLE_ISSUER |
                                         IORING_SETUP_DEFER_TASKRUN};
    int irc = io_uring_queue_init_params(AREAD_DEPTH, &a->ring, &p);
    if (irc < 0)
        irc = io_uring_queue_init(AREAD_DEPTH, &a->ring, 0); /* an older kernel */
    pthread_mutex_lock(&a->mu);
    a->rc = irc < 0 ? irc : 0;
    a->ready = true;
    pthread_cond_broadcast(&a->cv);
    if (irc < 0) {
        pthread_mutex_unlock(&a->mu);
        return NULL;
    }
    for (;;) {
        while (!a->quit && !(a->busy && !a->done))
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->quit)
            break;
        pthread_mutex_unlock(&a->mu);
        int rc = aread_run(a);
        pthread_mutex_lock(&a->mu);
        a->rc = rc;
        a->done = true;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

int psd_seg_aread_create(psd_seg_aread **out)
{
    *out = NULL;
    if (atomic_load(&ring_broken))
        return -ENOTSUP;
    psd_seg_aread *a = calloc(1, sizeof *a);
    if (a == NULL)
        return -ENOMEM;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    int rc = -pthread_create(&a->thread, NULL, aread_main, a);
    if (rc == 0) { /* until the thread has made its ring, or could not */
        pthread_mutex_lock(&a->mu);
        while (!a->ready)
            pthread_cond_wait(&a->cv, &a->mu);
        rc = a->rc;
        pthread_mutex_unlock(&a->mu);
        if (rc != 0) {
            pthread_join(a->thread, NULL);
            rc = rc == -ENOMEM ? rc : -ENOTSUP;
        }
    }
    if (rc != 0) {
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
        free(a);
        return rc;
    }
    *out = a;
    return 0;
}

bool psd_seg_aread_busy(const psd_seg_aread *a)
{
    pthread_mutex_lock((pthread_mutex_t *)&a->mu);
    bool b = a->busy;
    pthread_mutex_unlock((pthread_mutex_t *)&a->mu);
    return b;
}

uint64_t psd_seg_aread_bytes(const psd_seg_aread *a)
{
    return a ? a->arena_cap + a->fdcap * sizeof(int) : 0;
}

/* Room for n reads of slot bytes aligned to align (the old buffer is free:
 * nothing is in flight). */
static int aread_room(psd_seg_aread *a, uint32_t align, uint64_t slot, size_t n)
{
    int *fd = n > a->fdcap ? realloc(a->fd, n * sizeof *fd) : a->fd;
    if (fd == NULL)
        return -ENOMEM;
    a->fd = fd;
    a->fdcap = n > a->fdcap ? n : a->fdcap;
    size_t need = (size_t)(slot * n);
    if (a->arena != NULL && a->arena_cap >= need && a->align == align)
        return 0;
    uint8_t *m;
    if (posix_memalign((void **)&m, align, need) != 0)
        return -ENOMEM;
    free(a->arena);
    a->arena = m;
    a->arena_cap = need;
    a->align = align;
    return 0;
}

int psd_seg_aread_submit(psd_seg_aread *a, psd_segs *s, psd_seg_read *rq, size_t n)
{
    if (psd_seg_aread_busy(a))
        return -EBUSY;
    if (n > PSD_SEG_AREAD_MAX)
        return -EINVAL;
    uint64_t al = s->align, slot = al;
    for (size_t k = 0; k < n; k++) {
        uint64_t start, span = span_of(&rq[k], al, &start);
        if (span > slot)
            slot = span;
        if (rq[k].dst != NULL)
            return -EINVAL;
        rq[k].rc = PS_ECORRUPT; /* until its read says otherwise */
    }
    if (n == 0)
        return 0;
    int rc = aread_room(a, (uint32_t)al, slot, n);
    if (rc != 0)
        return rc;
    for (size_t k = 0; k < n; k++) { /* the descriptors here: the thread sees no s */
        a->fd[k] = read_fd(s, rq[k].loc.seg);
        if (a->fd[k] < 0)
            rq[k].rc = a->fd[k];
    }
    pthread_mutex_lock(&a->mu);
    a->slot_bytes = slot;
    a->rq = rq;
    a->n = n;
    a->busy = true;
    a->done = false;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return 0;
}

int psd_seg_aread_wait(psd_seg_aread *a)
{
    pthread_mutex_lock(&a->mu);
    while (a->busy && !a->done)
        pthread_cond_wait(&a->cv, &a->mu);
    int rc = a->busy ? a->rc : 0;
    a->busy = false;
    pthread_mutex_unlock(&a->mu);
    return rc;
}

void psd_seg_aread_destroy(psd_seg_aread *a)
{
    if (a == NULL)
        return;
    (void)psd_seg_aread_wait(a); /* the thread ends its batch first */
    pthread_mutex_lock(&a->mu);
    a->quit = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    io_uring_queue_exit(&a->ring);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    PS_FREE_ALL(a->arena, a->fd, a);
}

/* Calls fn for the records of segment n from offset off to end (its
 * synced end when it is the active one). */
static int scan_file(psd_segs *s, uint32_t n, uint64_t off, psd_seg_scan_fn fn, void *ctx)
{
    char *path = seg_path(s, n, "");
    if (path == NULL)
        return -ENOMEM;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    free(path);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int rc = errno == ENOENT ? 0 : -errno; /* compacted away: nothing needed */
        if (fd >= 0)
            close(fd);
        return rc;
    }
    uint64_t size = n == s->cur ? s->wend : (uint64_t)st.st_size;
    int rc = 0;
    if (size > off) {
        const uint8_t *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            close(fd);
            return -errno;
        }
        madvise((void *)m, size, MADV_SEQUENTIAL);
        while (rc == 0 && off < size) {
            uint32_t len, var_id;
            int64_t id;
            uint64_t version;
            if (rec_check(m + off, size - off, &len) != NULL) {
                rc = PS_ECORRUPT; /* psd_segs_open checked them: changed since */
                break;
            }
            memcpy(&var_id, m + off + 8, 4);
            memcpy(&id, m + off + 16, 8);
            memcpy(&version, m + off + 24, 8);
            psd_seg_loc loc = {.seg = n, .off = off, .len = PSD_SEG_REC_HEAD + len};
            rc = fn(ctx, var_id, id, version, loc, m + off + PSD_SEG_REC_HEAD, len);
            off += PSD_SEG_REC_HEAD + len;
        }
        munmap((void *)m, size);
    }
    close(fd);
    return rc;
}

int psd_segs_scan(psd_segs *s, const psd_seg_loc *from, psd_seg_scan_fn fn, void *ctx)
{
    int rc = 0;
    for (uint32_t n = from->seg ? from->seg : 1; n <= s->cur && rc == 0; n++)
        rc = scan_file(s, n, n == from->seg && from->off > PSD_SEG_FILE_HEAD
                                 ? from->off : PSD_SEG_FILE_HEAD, fn, ctx);
    return rc;
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

uint64_t psd_segs_copied(const psd_segs *s)
{
    return atomic_load(&((psd_segs *)s)->copied);
}

uint64_t psd_segs_removed(const psd_segs *s)
{
    return atomic_load(&((psd_segs *)s)->removed);
}

/* ---- compaction accounting ---------------------------------------------- */

void psd_segs_dead(psd_segs *s, psd_seg_loc loc)
{
    pthread_mutex_lock(&s->mu);
    if (loc.seg < s->seg_cap) {
        struct seg_info *g = &s->seg[loc.seg];
        g->live -= loc.len < g->live ? loc.len : g->live;
    }
    pthread_mutex_unlock(&s->mu);
}

void psd_segs_live(psd_segs *s, psd_seg_loc loc)
{
    pthread_mutex_lock(&s->mu);
    if (loc.seg < s->seg_cap) {
        struct seg_info *g = &s->seg[loc.seg];
        g->live = g->live + loc.len < g->bytes ? g->live + loc.len : g->bytes;
    }
    pthread_mutex_unlock(&s->mu);
}

void psd_segs_recount(psd_segs *s)
{
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < s->seg_cap; i++)
        s->seg[i].live = 0;
    pthread_mutex_unlock(&s->mu);
}

int psd_segs_usage(const psd_segs *cs, uint32_t seg, uint64_t *bytes, uint64_t *live)
{
    psd_segs *s = (psd_segs *)cs;
    int rc = PS_ENOTFOUND;
    pthread_mutex_lock(&s->mu);
    if (seg < s->seg_cap && s->seg[seg].exists) {
        *bytes = s->seg[seg].bytes;
        *live = s->seg[seg].live;
        rc = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int psd_segs_pick(psd_segs *s, double dead_frac, uint32_t *seg)
{
    return psd_segs_pick_by(s, dead_frac, NULL, 0, seg);
}

int psd_segs_pick_by(psd_segs *s, double dead_frac, const uint64_t *live, uint32_t nlive,
                     uint32_t *seg)
{
    if (dead_frac <= 0)
        dead_frac = PSD_SEG_DEAD_FRAC;
    int rc = PS_ENOTFOUND;
    uint64_t most = 0;
    pthread_mutex_lock(&s->mu);
    for (uint32_t n = 1; n < s->cur && n < s->seg_cap; n++) {
        const struct seg_info *g = &s->seg[n];
        if (!g->exists)
            continue;
        uint64_t l = live == NULL ? g->live : n < nlive ? live[n] : 0;
        uint64_t dead = g->bytes > l ? g->bytes - l : 0;
        if (g->bytes > 0 && (double)dead < dead_frac * (double)g->bytes)
            continue;
        if (rc != 0 || dead > most) {
            most = dead;
            *seg = n;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- compaction --------------------------------------------------------- */

struct psd_segs_compact {
    psd_segs *s;
    uint32_t seg;
    psd_seg_compact_opts o;
    char *path;
    int fd;
    uint64_t pos, end; /* the next record, the end of the file */
    uint8_t *buf;      /* what a step read */
    size_t cap;
    psd_seg_move *mv;
    size_t mv_cap;
    double tokens;     /* bytes of I/O the bucket allows now; below 0, a debt */
    int64_t filled_ns; /* when it was filled last */
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The token bucket: rate bytes a second flow in, up to one batch. */
static void bucket_fill(psd_segs_compact *c)
{
    int64_t t = now_ns();
    c->tokens += (double)c->o.rate * (double)(t - c->filled_ns) / 1e9;
    if (c->tokens > (double)c->o.batch)
        c->tokens = (double)c->o.batch;
    c->filled_ns = t;
}

static uint64_t bucket_wait_ns(const psd_segs_compact *c)
{
    return c->tokens >= 0 ? 0 : (uint64_t)(-c->tokens * 1e9 / (double)c->o.rate) + 1;
}

int psd_segs_compact_begin(psd_segs *s, uint32_t seg, const psd_seg_compact_opts *o,
                           psd_segs_compact **out, char *why, size_t whylen)
{
    if (o == NULL || o->live == NULL || o->moved == NULL)
        return ps_errf(PS_EINVAL_ARG, why, whylen, "compaction needs a live and a moved "
                       "callback");
    pthread_mutex_lock(&s->mu);
    bool sealed = seg > 0 && seg < s->cur && seg < s->seg_cap && s->seg[seg].exists;
    pthread_mutex_unlock(&s->mu);
    if (!sealed)
        return ps_errf(PS_EINVAL_ARG, why, whylen, "segments %s: %u is not a sealed segment "
                       "(the active one is %u)", s->dir, seg, s->cur);
    psd_segs_compact *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -ENOMEM;
    c->s = s;
    c->seg = seg;
    c->o = *o;
    if (c->o.rate == 0)
        c->o.rate = PSD_SEG_RATE_DEFAULT;
    if (c->o.batch == 0)
        c->o.batch = PSD_SEG_BATCH_DEFAULT;
    if (c->o.batch < PSD_SEG_REC_HEAD)
        c->o.batch = PSD_SEG_REC_HEAD;
    c->cap = c->o.batch;
    c->tokens = (double)c->o.batch;
    c->filled_ns = now_ns();
    c->pos = PSD_SEG_FILE_HEAD;
    c->fd = -1;
    int rc = 0;
    struct stat st;
    if ((c->path = seg_path(s, seg, "")) == NULL || (c->buf = malloc(c->cap)) == NULL) {
        rc = -ENOMEM;
        goto fail;
    }
    c->fd = open(c->path, O_RDONLY | O_CLOEXEC);
    if (c->fd < 0 || fstat(c->fd, &st) != 0) {
        rc = ps_errf(-errno, why, whylen, "segment %s: cannot open: %s", c->path,
                     strerror(errno));
        goto fail;
    }
    c->end = (uint64_t)st.st_size;
    posix_fadvise(c->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    *out = c;
    return 0;
fail:
    psd_segs_compact_end(c);
    return rc;
}

void psd_segs_compact_end(psd_segs_compact *c)
{
    if (c == NULL)
        return;
    if (c->fd >= 0)
        close(c->fd);
    PS_FREE_ALL(c->path, c->buf, c->mv, c);
}

/* Reads len bytes at the step's position into c->buf, grown to hold them. */
static int compact_read(psd_segs_compact *c, uint64_t len, char *why, size_t whylen)
{
    if (len > c->cap) {
        uint8_t *b = realloc(c->buf, len);
        if (b == NULL)
            return -ENOMEM;
        c->buf = b;
        c->cap = len;
    }
    uint64_t got = 0;
    while (got < len) {
        ssize_t r = pread(c->fd, c->buf + got, len - got, (off_t)(c->pos + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return ps_errf(-errno, why, whylen, "segment %s: offset %llu: cannot read: %s",
                           c->path, (unsigned long long)(c->pos + got), strerror(errno));
        if (r == 0)
            return ps_errf(PS_ECORRUPT, why, whylen, "segment %s: offset %llu: truncated "
                           "while compacted", c->path, (unsigned long long)(c->pos + got));
        got += (uint64_t)r;
    }
    return 0;
}

/* Adds one relocation to the step's list. */
static int compact_move(psd_segs_compact *c, size_t n, const psd_seg_move *m)
{
    if (n == c->mv_cap) {
        size_t nc = c->mv_cap ? c->mv_cap * 2 : 256;
        psd_seg_move *a = realloc(c->mv, nc * sizeof *a);
        if (a == NULL)
            return -ENOMEM;
        c->mv = a;
        c->mv_cap = nc;
    }
    c->mv[n] = *m;
    return 0;
}

/* The records of the step's batch (from c->pos, got bytes in c->buf): the
 * live ones appended, their relocations in c->mv (*nmv); *used: the bytes
 * of the whole records gone through. */
static int compact_scan(psd_segs_compact *c, uint64_t got, uint64_t *used, size_t *nmv,
                        char *why, size_t whylen)
{
    psd_segs *s = c->s;
    uint64_t off = 0;
    size_t n = 0;
    int rc = 0;
    while (rc == 0 && off < got) {
        uint32_t len = 0;
        if (got - off >= 8)
            memcpy(&len, c->buf + off + 4, 4);
        uint64_t rl = PSD_SEG_REC_HEAD + (uint64_t)len;
        if (got - off < PSD_SEG_REC_HEAD || rl > got - off) {
            if (off > 0)
                break; /* the next step's */
            if (c->pos + rl > c->end || got - off < 8)
                return ps_errf(PS_ECORRUPT, why, whylen, "segment %s: offset %llu: "
                               "truncated record", c->path, (unsigned long long)c->pos);
            /* One record larger than a batch: read whole. */
            if ((rc = compact_read(c, rl, why, whylen)) != 0)
                return rc;
            got = rl;
        }
        const uint8_t *r = c->buf + off;
        const char *bad = rec_check(r, got - off, &len);
        if (bad != NULL)
            return ps_errf(PS_ECORRUPT, why, whylen, "segment %s: offset %llu: %s", c->path,
                           (unsigned long long)(c->pos + off), bad);
        psd_seg_move m = {.from = {.seg = c->seg, .len = (uint32_t)rl, .off = c->pos + off}};
        memcpy(&m.var_id, r + 8, 4);
        memcpy(&m.id, r + 16, 8);
        memcpy(&m.version, r + 24, 8);
        int live = c->o.live(c->o.arg, m.var_id, m.id, m.version, m.from);
        if (live < 0)
            rc = live;
        else if (live > 0 &&
                 (rc = psd_segs_append(s, m.var_id, m.id, m.version, r + PSD_SEG_REC_HEAD,
                                       len, NULL, 0, &m.to)) == 0)
            rc = compact_move(c, n++, &m);
        off += rl;
    }
    *used = off;
    *nmv = n;
    return rc;
}

/* Called by the owner's maintenance between its batches. A step reads a
 * batch of the old segment, appends what is live, syncs it and only then
 * hands the relocations to the owner, so that its catalog never points at
 * bytes not on the disk; the position moves on only once the owner has
 * committed them, so an error anywhere makes the next step try the same
 * records again. */
int psd_segs_compact_step(psd_segs_compact *c, uint64_t *wait_ns, char *why, size_t whylen)
{
    psd_segs *s = c->s;
    *wait_ns = 0;
    if (s->blen != 0)
        return -EBUSY;
    if (c->pos >= c->end)
        return 1;
    bucket_fill(c);
    if (c->tokens < 0) {
        *wait_ns = bucket_wait_ns(c);
        return 0;
    }
    uint64_t got = c->end - c->pos < c->o.batch ? c->end - c->pos : c->o.batch;
    uint64_t used = 0, copied = 0;
    size_t n = 0;
    int rc = compact_read(c, got, why, whylen);
    if (rc == 0)
        rc = compact_scan(c, got, &used, &n, why, whylen);
    c->tokens -= (double)got;
    if (rc != 0) {
        psd_segs_discard(s);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        copied += c->mv[i].to.len;
    if (n > 0 && (rc = psd_segs_sync(s)) != 0) {
        ps_errf(rc, why, whylen, "segments %s: compaction of segment %u: %s", s->dir, c->seg,
                ps_strerror(rc));
        goto out;
    }
    c->tokens -= (double)copied;
    if (n > 0 && (rc = c->o.moved(c->o.arg, c->mv, n)) != 0) {
        for (size_t i = 0; i < n; i++)
            psd_segs_dead(s, c->mv[i].to);
        ps_errf(rc, why, whylen, "segments %s: compaction of segment %u: the catalog did not "
                "take its relocations: %s", s->dir, c->seg, ps_strerror(rc));
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        psd_segs_dead(s, c->mv[i].stale ? c->mv[i].to : c->mv[i].from);
    atomic_fetch_add(&s->copied, copied);
    posix_fadvise(c->fd, (off_t)c->pos, (off_t)used, POSIX_FADV_DONTNEED);
    c->pos += used;
    if (c->pos >= c->end) {
        /* Whatever the counts said, nothing of it is live now. */
        pthread_mutex_lock(&s->mu);
        s->seg[c->seg].live = 0;
        pthread_mutex_unlock(&s->mu);
        rc = 1;
    }
out:
    bucket_fill(c);
    *wait_ns = bucket_wait_ns(c);
    return rc;
}

/* Closes the descriptors of segments removed more than the grace ago. */
static void retire_old(psd_segs *s, int64_t now)
{
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < s->seg_cap; i++) {
        struct seg_info *g = &s->seg[i];
        if (g->gone_ms != 0 && g->rfd >= 0 && now - g->gone_ms > PSD_SEG_GRACE_S * 1000) {
            close(g->rfd);
            g->rfd = -1;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

int psd_segs_remove(psd_segs *s, uint32_t seg, const psd_seg_loc *committed)
{
    if (seg == 0 || seg >= s->cur || committed == NULL || seg >= committed->seg)
        return PS_EINVAL_ARG;
    pthread_mutex_lock(&s->mu);
    bool there = seg < s->seg_cap && s->seg[seg].exists;
    pthread_mutex_unlock(&s->mu);
    if (!there)
        return PS_EINVAL_ARG;
    /* A reader holding an old location reads through this descriptor until
     * the grace is over. */
    int rc = read_fd(s, seg);
    if (rc < 0)
        return rc;
    char *p = seg_path(s, seg, "");
    if (p == NULL)
        return -ENOMEM;
    rc = unlink(p) == 0 ? sync_dir(s->dir) : -errno;
    free(p);
    if (rc != 0)
        return rc;
    int64_t now = ps_now_ms();
    pthread_mutex_lock(&s->mu);
    struct seg_info *g = &s->seg[seg];
    atomic_fetch_sub(&s->bytes, g->bytes + PSD_SEG_FILE_HEAD);
    g->exists = false;
    g->bytes = g->live = 0;
    g->gone_ms = now > 0 ? now : 1;
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->removed, 1);
    retire_old(s, now);
    return 0;
}

/* ---- checkpoints -------------------------------------------------------- */

#define COPY_BUF (1u << 20)

/* Copies len bytes of src_fd to dst_fd, in the kernel where it can
 * (copy_file_range, which may also share the blocks), else through one
 * buffer of COPY_BUF bytes. */
static int copy_bytes(int src_fd, int dst_fd, uint64_t len)
{
    uint64_t done = 0;
    bool kernel = true;
    uint8_t *buf = NULL;
    int rc = 0;
    while (rc == 0 && done < len) {
        size_t want = len - done > COPY_BUF ? COPY_BUF : (size_t)(len - done);
        ssize_t r;
        if (kernel) {
            off_t in = (off_t)done, outo = (off_t)done;
            r = copy_file_range(src_fd, &in, dst_fd, &outo, want, 0);
            if (r < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
                          errno == EOPNOTSUPP || errno == EPERM)) {
                kernel = false;
                continue;
            }
            if (r < 0 && errno != EINTR)
                rc = full_rc(errno);
        } else {
            if (buf == NULL && (buf = malloc(COPY_BUF)) == NULL)
                return -ENOMEM;
            r = pread(src_fd, buf, want, (off_t)done);
            if (r < 0 && errno != EINTR)
                rc = -errno;
            if (r > 0)
                rc = write_all(dst_fd, buf, (size_t)r, done);
        }
        if (rc == 0 && r == 0)
            rc = PS_ECORRUPT; /* the source ended early */
        if (r > 0)
            done += (uint64_t)r;
    }
    free(buf);
    return rc;
}

/* Copies the first len bytes of src (all of it: UINT64_MAX) to dst, whole
 * or not at all: through dst.tmp, synced, renamed. */
static int copy_file(const char *src, const char *dst, uint64_t len, char *why,
                     size_t whylen)
{
    char *tmp = NULL;
    int sfd = open(src, O_RDONLY | O_CLOEXEC), dfd = -1, rc = 0;
    struct stat st;
    if (sfd < 0)
        return ps_errf(-errno, why, whylen, "segment %s: cannot open: %s", src,
                       strerror(errno));
    if (fstat(sfd, &st) != 0) {
        rc = ps_errf(-errno, why, whylen, "segment %s: cannot stat: %s", src, strerror(errno));
        goto out;
    }
    if (len == UINT64_MAX)
        len = (uint64_t)st.st_size;
    if ((uint64_t)st.st_size < len) {
        rc = ps_errf(PS_ECORRUPT, why, whylen, "segment %s: offset %llu: truncated "
                     "(committed rows end at %llu)", src, (unsigned long long)st.st_size,
                     (unsigned long long)len);
        goto out;
    }
    if (asprintf(&tmp, "%s.tmp", dst) < 0) {
        tmp = NULL;
        rc = -ENOMEM;
        goto out;
    }
    dfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (dfd < 0) {
        rc = -errno;
        goto fail;
    }
    posix_fadvise(sfd, 0, 0, POSIX_FADV_SEQUENTIAL);
    rc = copy_bytes(sfd, dfd, len);
    if (rc == 0 && fdatasync(dfd) != 0)
        rc = full_rc(errno);
    if (rc == 0 && rename(tmp, dst) != 0)
        rc = -errno;
    if (rc == 0)
        goto out;
fail:
    ps_errf(rc, why, whylen, "segment %s: cannot copy to %s: %s", src, dst, ps_strerror(rc));
    unlink(tmp);
out:
    if (dfd >= 0)
        close(dfd);
    close(sfd);
    free(tmp);
    return rc;
}

/* Removes the segment files (and their .tmp) of dir. */
static int clear_segments(const char *dir, char *why, size_t whylen)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return ps_errf(-errno, why, whylen, "segments %s: cannot list: %s", dir,
                       strerror(errno));
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        unsigned n;
        if (sscanf(de->d_name, "seg-%8u.psg", &n) == 1 &&
            unlinkat(dirfd(d), de->d_name, 0) != 0)
            rc = ps_errf(-errno, why, whylen, "segments %s: cannot remove %s: %s", dir,
                         de->d_name, strerror(errno));
    }
    closedir(d);
    return rc;
}

/* Makes dst hold src's segments up to end: the sealed ones linked (they
 * are never written again, so the two directories share them safely), the
 * one holding end copied up to it, for appends to go on in each apart. */
static int copy_segments(const char *src, const char *dst, const psd_seg_loc *end,
                         char *why, size_t whylen)
{
    struct stat a, b;
    if (mkdir(dst, 0700) != 0 && errno != EEXIST)
        return ps_errf(-errno, why, whylen, "segments %s: cannot create: %s", dst,
                       strerror(errno));
    if (stat(src, &a) != 0)
        return ps_errf(-errno, why, whylen, "segments %s: %s", src, strerror(errno));
    if (stat(dst, &b) != 0)
        return ps_errf(-errno, why, whylen, "segments %s: %s", dst, strerror(errno));
    if (a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return ps_errf(PS_EINVAL_ARG, why, whylen, "segments %s: a checkpoint cannot be "
                       "its own source", dst);
    int rc = clear_segments(dst, why, whylen);
    for (uint32_t n = 1; rc == 0 && n <= end->seg; n++) {
        char *sp = seg_path_in(src, n, ""), *dp = seg_path_in(dst, n, "");
        if (sp == NULL || dp == NULL) {
            rc = -ENOMEM;
        } else if (n == end->seg) {
            rc = copy_file(sp, dp, end->off, why, whylen);
        } else if (link(sp, dp) != 0) {
            if (errno == ENOENT)
                ; /* compacted away */
            else if (errno == EXDEV || errno == EPERM || errno == EMLINK ||
                     errno == EOPNOTSUPP)
                rc = copy_file(sp, dp, UINT64_MAX, why, whylen);
            else
                rc = ps_errf(-errno, why, whylen, "segment %s: cannot link to %s: %s", sp,
                             dp, strerror(errno));
        }
        free(sp);
        free(dp);
    }
    if (rc == 0 && (rc = sync_dir(dst)) != 0)
        ps_errf(rc, why, whylen, "segments %s: cannot sync: %s", dst, ps_strerror(rc));
    return rc;
}

int psd_segs_checkpoint(psd_segs *s, const char *dst, const psd_seg_loc *end, char *why,
                        size_t whylen)
{
    if (end->seg > s->cur || (end->seg == s->cur && end->off > s->wend))
        return ps_errf(PS_EINVAL_ARG, why, whylen, "segments %s: checkpoint end %u:%llu is "
                       "past the synced end %u:%llu", s->dir, end->seg,
                       (unsigned long long)end->off, s->cur, (unsigned long long)s->wend);
    return copy_segments(s->dir, dst, end, why, whylen);
}

int psd_segs_restore(const char *src, const char *dst, const psd_seg_loc *end, char *why,
                     size_t whylen)
{
    return copy_segments(src, dst, end, why, whylen);
}
