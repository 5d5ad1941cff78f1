#include "worker/data.h"

#include "common/buf.h"
#include "common/errors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_UBYTE 0x08
/* Pixels are decoded through a bounce buffer of this many bytes, so the
 * float array grows with what the file really holds rather than with what a
 * (possibly corrupt) header claims. */
#define IDX_CHUNK (1u << 20)

/* Grows *p (of *cap elements of size elem) to hold at least need elements,
 * doubling so that appends stay amortised O(1). */
static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap > 0 ? *cap : 1024;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / elem)
            return -ENOMEM;
        ncap *= 2;
    }
    void *np = realloc(*p, ncap * elem);
    if (np == NULL)
        return -ENOMEM;
    *p = np;
    *cap = ncap;
    return 0;
}

/*
 * Opens path for reading through zlib, which reads gzip streams and plain
 * files alike. The first two bytes are looked at only to name the format in
 * messages. Returns 0 or -errno with err set.
 */
static int open_any(const char *path, gzFile *out, bool *gzip, char *err,
                    size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        return ps_errf(rc, err, errlen, "%s: cannot open: %s", path, strerror(errno));
    }
    unsigned char m[2] = {0, 0};
    ssize_t got = pread(fd, m, sizeof m, 0);
    if (got < 0) {
        int rc = -errno;
        close(fd);
        return ps_errf(rc, err, errlen, "%s: cannot read: %s", path, strerror(-rc));
    }
    *gzip = got == 2 && m[0] == 0x1f && m[1] == 0x8b;
    gzFile gz = gzdopen(fd, "rb");
    if (gz == NULL) {
        close(fd);
        return ps_errf(-ENOMEM, err, errlen,
                       "%s: out of memory opening the stream", path);
    }
    gzbuffer(gz, 1u << 17);
    *out = gz;
    return 0;
}

/*
 * Reads exactly n bytes. A short read is reported as truncation, or as a
 * damaged stream when zlib saw one. Returns 0, PS_ECORRUPT or -errno, with
 * err set; `what` names the part being read for the message.
 */
static int read_exact(gzFile gz, const char *path, bool gzip, void *buf,
                      size_t n, const char *what, char *err, size_t errlen)
{
    size_t done = 0;
    while (done < n) {
        size_t want = n - done;
        if (want > (1u << 30))
            want = 1u << 30;
        int got = gzread(gz, (char *)buf + done, (unsigned)want);
        if (got <= 0) {
            int zerr = Z_OK;
            const char *msg = gzerror(gz, &zerr);
            if (zerr == Z_ERRNO) {
                int rc = errno != 0 ? -errno : -EIO;
                return ps_errf(rc, err, errlen, "%s: read error in %s: %s", path, what,
                               strerror(-rc));
            }
            if (zerr != Z_OK && zerr != Z_STREAM_END)
                return ps_errf(PS_ECORRUPT, err, errlen,
                               "%s: damaged %s stream in %s: %s", path,
                               gzip ? "gzip" : "plain", what, msg);
            return ps_errf(PS_ECORRUPT, err, errlen,
                           "%s: truncated: %s ends after %zu of %zu bytes", path,
                           what, done, n);
        }
        done += (size_t)got;
    }
    return 0;
}

struct idx_file {
    const char *path;
    gzFile gz;
    bool gzip;
    int ndim;
    uint32_t dims[3];
};

/*
 * Opens an IDX file and checks its header: two zero bytes, the dtype byte
 * (unsigned byte only) and the number of dimensions the caller expects.
 */
static int idx_open(struct idx_file *f, const char *path, int ndim,
                    const char *kind, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    int rc = open_any(path, &f->gz, &f->gzip, err, errlen);
    if (rc != 0)
        return rc;
    unsigned char hdr[4 + 4 * 3];
    rc = read_exact(f->gz, path, f->gzip, hdr, 4, "the IDX header", err,
                    errlen);
    if (rc != 0)
        goto close_gz;
    uint32_t magic = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 |
                     (uint32_t)hdr[2] << 8 | hdr[3];
    uint32_t want = (uint32_t)IDX_UBYTE << 8 | (uint32_t)ndim;
    if (magic != want) {
        rc = ps_errf(PS_EPARSE, err, errlen,
                     "%s: not an IDX %s file: magic 0x%08x, expected 0x%08x "
                     "(unsigned bytes, %d dimensions)",
                     path, kind, magic, want, ndim);
        goto close_gz;
    }
    f->ndim = ndim;
    rc = read_exact(f->gz, path, f->gzip, hdr + 4, 4 * (size_t)ndim,
                    "the IDX header", err, errlen);
    if (rc != 0)
        goto close_gz;
    for (int i = 0; i < ndim; i++) {
        const unsigned char *d = hdr + 4 + 4 * i;
        f->dims[i] = (uint32_t)d[0] << 24 | (uint32_t)d[1] << 16 |
                     (uint32_t)d[2] << 8 | d[3];
    }
    return 0;

close_gz:
    gzclose(f->gz);
    f->gz = NULL;
    return rc;
}

static void idx_close(struct idx_file *f)
{
    if (f->gz != NULL)
        gzclose(f->gz);
    f->gz = NULL;
}

/* Reads n images of `pixels` bytes each, scaled to [0, 1], into a new
 * array. */
static int idx_read_images(struct idx_file *f, int64_t n, size_t pixels,
                           float **out, char *err, size_t errlen)
{
    if ((uint64_t)n > SIZE_MAX / sizeof(float) / (pixels > 0 ? pixels : 1))
        return ps_errf(-ENOMEM, err, errlen,
                       "%s: %lld images of %zu pixels do not fit in memory",
                       f->path, (long long)n, pixels);
    size_t total = (size_t)n * pixels, done = 0, cap = 0;
    float *x = NULL;
    unsigned char *chunk = malloc(IDX_CHUNK);
    int rc = chunk == NULL ? -ENOMEM : 0;
    while (rc == 0 && done < total) {
        size_t k = total - done < IDX_CHUNK ? total - done : IDX_CHUNK;
        rc = grow((void **)&x, &cap, done + k, sizeof *x);
        if (rc == 0)
            rc = read_exact(f->gz, f->path, f->gzip, chunk, k, "the pixels",
                            err, errlen);
        if (rc == 0) {
            for (size_t i = 0; i < k; i++)
                x[done + i] = (float)chunk[i] / 255.0f;
            done += k;
        }
    }
    free(chunk);
    if (rc == -ENOMEM)
        ps_errf(rc, err, errlen, "%s: out of memory reading %zu pixels", f->path,
                total);
    if (rc != 0) {
        free(x);
        return rc;
    }
    *out = x;
    return 0;
}

int ps_dataset_load_idx(const char *images_path, const char *labels_path,
                        int64_t limit, struct ps_dataset *ds, char *err,
                        size_t errlen)
{
    memset(ds, 0, sizeof *ds);
    if (images_path == NULL || labels_path == NULL || limit < 0)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "ps_dataset_load_idx: %s",
                       limit < 0 ? "negative limit" : "missing path");
    struct idx_file img, lbl;
    int rc = idx_open(&img, images_path, 3, "images", err, errlen);
    if (rc != 0)
        return rc;
    rc = idx_open(&lbl, labels_path, 1, "labels", err, errlen);
    if (rc != 0)
        goto close_img;
    if (img.dims[0] != lbl.dims[0]) {
        rc = ps_errf(PS_ESHAPE, err, errlen, "%s holds %u images but %s holds %u labels",
                     images_path, img.dims[0], labels_path, lbl.dims[0]);
        goto close_lbl;
    }
    if (img.dims[1] == 0 || img.dims[2] == 0 || img.dims[1] > 65535 ||
        img.dims[2] > 65535) {
        rc = ps_errf(PS_EPARSE, err, errlen,
                     "%s: implausible image size %ux%u", images_path,
                     img.dims[1], img.dims[2]);
        goto close_lbl;
    }
    int64_t n = img.dims[0];
    if (limit > 0 && limit < n)
        n = limit;
    size_t pixels = (size_t)img.dims[1] * img.dims[2];

    float *x = NULL;
    rc = idx_read_images(&img, n, pixels, &x, err, errlen);
    if (rc != 0)
        goto close_lbl;
    int32_t *y = malloc((size_t)(n > 0 ? n : 1) * sizeof *y);
    unsigned char *raw = malloc((size_t)(n > 0 ? n : 1));
    if (y == NULL || raw == NULL) {
        rc = ps_errf(-ENOMEM, err, errlen,
                     "%s: out of memory for %lld labels", labels_path,
                     (long long)n);
        goto free_labels;
    }
    rc = read_exact(lbl.gz, labels_path, lbl.gzip, raw, (size_t)n,
                    "the labels", err, errlen);
    if (rc != 0)
        goto free_labels;
    int maxlabel = -1;
    for (int64_t i = 0; i < n; i++) {
        y[i] = raw[i];
        if (y[i] > maxlabel)
            maxlabel = y[i];
    }
    free(raw);
    idx_close(&lbl);
    idx_close(&img);
    ds->n = n;
    ds->h = (int)img.dims[1];
    ds->w = (int)img.dims[2];
    ds->c = 1;
    ds->dim = (int64_t)pixels;
    ds->nclasses = maxlabel + 1;
    ds->x = x;
    ds->y = y;
    return 0;

free_labels:
    free(raw);
    free(y);
    free(x);
close_lbl:
    idx_close(&lbl);
close_img:
    idx_close(&img);
    return rc;
}

void ps_dataset_close(struct ps_dataset *ds)
{
    if (ds == NULL)
        return;
    free(ds->x);
    free(ds->y);
    memset(ds, 0, sizeof *ds);
}

void ps_dataset_gather(const struct ps_dataset *ds, const int64_t *idx, int n,
                       float *x, int32_t *y)
{
    size_t dim = (size_t)ds->dim;
    for (int i = 0; i < n; i++) {
        memcpy(x + (size_t)i * dim, ds->x + (size_t)idx[i] * dim,
               dim * sizeof *x);
        y[i] = ds->y[idx[i]];
    }
}

/* Reads one line of any length, newline stripped, from a gz stream. */
struct line_reader {
    gzFile gz;
    const char *path;
    bool gzip;
    char *buf;
    size_t cap;
    int64_t lineno;
};

/* Returns 1 with a line in r->buf, 0 at the end of the file, or a negative
 * code with err set. */
static int read_line(struct line_reader *r, char *err, size_t errlen)
{
    size_t len = 0;
    for (;;) {
        if (r->cap - len < 2) {
            int rc = grow((void **)&r->buf, &r->cap, r->cap + 1, 1);
            if (rc != 0)
                return ps_errf(rc, err, errlen, "%s:%lld: out of memory for the line",
                               r->path, (long long)r->lineno + 1);
        }
        size_t room = r->cap - len > INT_MAX ? INT_MAX : r->cap - len;
        if (gzgets(r->gz, r->buf + len, (int)room) == NULL) {
            int zerr = Z_OK;
            const char *msg = gzerror(r->gz, &zerr);
            if (zerr == Z_ERRNO) {
                int rc = errno != 0 ? -errno : -EIO;
                return ps_errf(rc, err, errlen, "%s: read error: %s", r->path,
                               strerror(-rc));
            }
            if (zerr != Z_OK && zerr != Z_STREAM_END)
                return ps_errf(PS_ECORRUPT, err, errlen,
                               "%s:%lld: damaged gzip stream: %s",
                               r->path, (long long)r->lineno + 1, msg);
            if (len == 0)
                return 0;
            break;
        }
        len += strlen(r->buf + len);
        if (len > 0 && r->buf[len - 1] == '\n')
            break;
        if (r->cap - len > 1 && gzeof(r->gz))
            break;
    }
    while (len > 0 && (r->buf[len - 1] == '\n' || r->buf[len - 1] == '\r'))
        r->buf[--len] = '\0';
    r->lineno++;
    return 1;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r';
}

static int bad_index(const char *path, int64_t lineno, const char *tok,
                     size_t toklen, char *err, size_t errlen)
{
    return ps_errf(PS_EPARSE, err, errlen,
                   "%s:%lld: feature index in '%.*s' is outside [1, 2147483647]",
                   path, (long long)lineno, (int)(toklen > 32 ? 32 : toklen), tok);
}

struct csr_builder {
    struct ps_sparse_dataset ds;
    size_t ycap, pcap, icap, vcap;
};

/* Parses one idx:val token of a data line (toklen bytes at tok) into the
 * builder: *prev is the line's index before it, *next gets where the token
 * ends. Returns 0 or a code with err set naming the line. */
static int parse_feature(struct csr_builder *b, const char *path, int64_t lineno,
                         char *tok, size_t toklen, long long *prev, char **next,
                         char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long long idx = strtoll(tok, &end, 10);
    if (end == tok || *end != ':' || tok[0] == '+' || tok[0] == '-' ||
        errno == ERANGE) {
        if (end != tok && *end == ':' && (idx < 1 || tok[0] == '-' ||
                                          errno == ERANGE))
            return bad_index(path, lineno, tok, toklen, err, errlen);
        return ps_errf(PS_EPARSE, err, errlen, "%s:%lld: expected idx:val, got '%.*s'",
                       path, (long long)lineno, (int)(toklen > 32 ? 32 : toklen),
                       tok);
    }
    if (idx < 1 || idx > INT32_MAX)
        return bad_index(path, lineno, tok, toklen, err, errlen);
    if (idx <= *prev)
        return ps_errf(PS_EPARSE, err, errlen,
                       "%s:%lld: feature index %lld after %lld: indices must be "
                       "strictly ascending",
                       path, (long long)lineno, idx, *prev);
    char *vs = end + 1;
    errno = 0;
    float v = strtof(vs, &end);
    if (end == vs || !(*end == '\0' || is_space(*end)))
        return ps_errf(PS_EPARSE, err, errlen, "%s:%lld: expected idx:val, got '%.*s'",
                       path, (long long)lineno, (int)(toklen > 32 ? 32 : toklen),
                       tok);
    if (!isfinite(v))
        return ps_errf(PS_ENONFINITE, err, errlen,
                       "%s:%lld: value of feature %lld is not finite",
                       path, (long long)lineno, idx);
    size_t k = (size_t)b->ds.nnz;
    int rc = grow((void **)&b->ds.indices, &b->icap, k + 1,
                  sizeof *b->ds.indices);
    if (rc == 0)
        rc = grow((void **)&b->ds.values, &b->vcap, k + 1,
                  sizeof *b->ds.values);
    if (rc != 0)
        return ps_errf(-ENOMEM, err, errlen,
                       "%s:%lld: out of memory", path, (long long)lineno);
    b->ds.indices[k] = (int32_t)(idx - 1);
    b->ds.values[k] = v;
    b->ds.nnz++;
    if (idx > b->ds.dim)
        b->ds.dim = idx;
    *prev = idx;
    *next = end;
    return 0;
}

/* Parses one data line into the builder. Returns 0 or a code with err set
 * naming the line. */
static int parse_libsvm_line(struct csr_builder *b, const char *path,
                             int64_t lineno, char *line, char *err,
                             size_t errlen)
{
    char *p = line;
    char *end;
    errno = 0;
    double label = strtod(p, &end);
    if (end == p || !(*end == '\0' || is_space(*end)))
        return ps_errf(PS_EPARSE, err, errlen,
                       "%s:%lld: expected a numeric label, got '%.32s'",
                       path, (long long)lineno, p);
    if (!isfinite(label) || fabs(label) > 3.0e38)
        return ps_errf(PS_ENONFINITE, err, errlen,
                       "%s:%lld: label '%.*s' is not a finite float",
                       path, (long long)lineno, (int)(end - p > 32 ? 32 : end - p), p);
    int rc = grow((void **)&b->ds.y, &b->ycap, (size_t)b->ds.n + 1,
                  sizeof *b->ds.y);
    if (rc == 0)
        rc = grow((void **)&b->ds.indptr, &b->pcap, (size_t)b->ds.n + 2,
                  sizeof *b->ds.indptr);
    if (rc != 0)
        goto nomem;
    b->ds.y[b->ds.n] = (float)label;

    long long prev = 0;
    p = end;
    for (;;) {
        while (is_space(*p))
            p++;
        if (*p == '\0')
            break;
        char *tok = p;
        size_t toklen = 0;
        while (tok[toklen] != '\0' && !is_space(tok[toklen]))
            toklen++;
        if (strncmp(tok, "qid:", 4) == 0) {
            p = tok + toklen;
            continue;
        }
        rc = parse_feature(b, path, lineno, tok, toklen, &prev, &p, err,
                           errlen);
        if (rc != 0)
            return rc;
    }
    b->ds.n++;
    b->ds.indptr[b->ds.n] = b->ds.nnz;
    return 0;

nomem:
    return ps_errf(-ENOMEM, err, errlen,
                   "%s:%lld: out of memory", path, (long long)lineno);
}

int ps_sparse_load_libsvm(const char *path, struct ps_sparse_dataset *ds,
                          char *err, size_t errlen)
{
    memset(ds, 0, sizeof *ds);
    if (path == NULL)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "ps_sparse_load_libsvm: missing path");
    struct line_reader r = {.path = path};
    int rc = open_any(path, &r.gz, &r.gzip, err, errlen);
    if (rc != 0)
        return rc;
    struct csr_builder b;
    memset(&b, 0, sizeof b);
    rc = grow((void **)&b.ds.indptr, &b.pcap, 1, sizeof *b.ds.indptr);
    if (rc != 0) {
        ps_errf(rc, err, errlen, "%s: out of memory", path);
        goto close_reader;
    }
    b.ds.indptr[0] = 0;
    while ((rc = read_line(&r, err, errlen)) == 1) {
        char *hash = strchr(r.buf, '#');
        if (hash != NULL)
            *hash = '\0';
        char *s = r.buf;
        while (is_space(*s))
            s++;
        if (*s == '\0')
            continue;
        rc = parse_libsvm_line(&b, path, r.lineno, s, err, errlen);
        if (rc != 0)
            break;
    }

close_reader:
    /* rc is 0 only when every line was read and parsed. */
    if (rc == 0)
        *ds = b.ds;
    else
        ps_sparse_dataset_close(&b.ds);
    free(r.buf);
    gzclose(r.gz);
    return rc;
}

void ps_sparse_dataset_close(struct ps_sparse_dataset *ds)
{
    if (ds == NULL)
        return;
    PS_FREE_ALL(ds->y, ds->indptr, ds->indices, ds->values);
    memset(ds, 0, sizeof *ds);
}

int ps_sparse_gather_dense(const struct ps_sparse_dataset *ds,
                           const int64_t *idx, int n, int64_t dim, float *x,
                           float *y)
{
    memset(x, 0, (size_t)n * (size_t)dim * sizeof *x);
    for (int i = 0; i < n; i++) {
        int64_t r = idx[i];
        float *row = x + (size_t)i * (size_t)dim;
        for (int64_t k = ds->indptr[r]; k < ds->indptr[r + 1]; k++) {
            if (ds->indices[k] >= dim)
                return PS_ESHAPE;
            row[ds->indices[k]] = ds->values[k];
        }
        y[i] = ds->y[r];
    }
    return 0;
}

int ps_shard_files(size_t nfiles, int worker, int nworkers, size_t *files_out,
                   size_t *nout, enum ps_shard_policy *policy)
{
    if (nfiles == 0 || nworkers < 1 || worker < 0 || worker >= nworkers)
        return PS_EINVAL_ARG;
    size_t k = 0;
    if (nfiles > 1 && nfiles >= (size_t)nworkers) {
        for (size_t f = (size_t)worker; f < nfiles; f += (size_t)nworkers)
            files_out[k++] = f;
        *policy = PS_SHARD_BY_FILE;
    } else {
        for (size_t f = 0; f < nfiles; f++)
            files_out[k++] = f;
        *policy = PS_SHARD_BY_EXAMPLE;
    }
    *nout = k;
    return 0;
}

int64_t ps_shard_count(int64_t n, int worker, int nworkers)
{
    if (nworkers < 1 || worker < 0 || worker >= nworkers || worker >= n)
        return 0;
    return (n - 1 - worker) / nworkers + 1;
}

int ps_batch_global(int per_replica, int replicas, int *global)
{
    if (per_replica < 1 || replicas < 1 || per_replica > INT_MAX / replicas)
        return PS_EINVAL_ARG;
    *global = per_replica * replicas;
    return 0;
}

int ps_batch_per_replica(int global, int replicas, int *per_replica)
{
    if (global < 1 || replicas < 1 || global % replicas != 0)
        return PS_EINVAL_ARG;
    *per_replica = global / replicas;
    return 0;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform on [0, bound) without modulo bias. */
static uint64_t below(uint64_t *s, uint64_t bound)
{
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t r = splitmix64(s);
        if (r >= threshold)
            return r % bound;
    }
}

void ps_shuffle(int64_t *idx, int64_t n, uint64_t seed, uint64_t epoch)
{
    uint64_t a = seed, b = epoch ^ 0x6a09e667f3bcc909ULL;
    uint64_t s = splitmix64(&a);
    s ^= splitmix64(&b) * 0xd1b54a32d192ed03ULL;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)below(&s, (uint64_t)i + 1);
        int64_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

int ps_batcher_init(struct ps_batcher *b, int64_t nexamples, int worker,
                    int nworkers, int batch, unsigned flags, uint64_t seed)
{
    memset(b, 0, sizeof *b);
    if (batch < 1 || nexamples < 0 || nworkers < 1 || worker < 0 ||
        worker >= nworkers)
        return PS_EINVAL_ARG;
    int64_t count = ps_shard_count(nexamples, worker, nworkers);
    if ((uint64_t)count > SIZE_MAX / sizeof *b->order)
        return -ENOMEM;
    b->order = malloc((size_t)(count > 0 ? count : 1) * sizeof *b->order);
    if (b->order == NULL)
        return -ENOMEM;
    b->count = count;
    b->batch = batch;
    b->flags = flags;
    b->seed = seed;
    b->nworkers = nworkers;
    b->worker = worker;
    ps_batcher_start_epoch(b, 0);
    return 0;
}

void ps_batcher_start_epoch(struct ps_batcher *b, uint64_t epoch)
{
    /* Refill before shuffling so that the order depends on (seed, epoch)
     * alone, not on the epochs walked before this one. */
    for (int64_t k = 0; k < b->count; k++)
        b->order[k] = b->worker + k * b->nworkers;
    if (b->flags & PS_BATCH_SHUFFLE)
        ps_shuffle(b->order, b->count, b->seed, epoch);
    b->epoch = epoch;
    b->pos = 0;
}

int ps_batcher_next(struct ps_batcher *b, const int64_t **idx)
{
    int64_t left = b->count - b->pos;
    if (left <= 0)
        return 0;
    int k = left < b->batch ? (int)left : b->batch;
    if (k < b->batch && (b->flags & PS_BATCH_DROP_REMAINDER)) {
        b->pos = b->count;
        return 0;
    }
    *idx = b->order + b->pos;
    b->pos += k;
    return k;
}

int64_t ps_batcher_steps(const struct ps_batcher *b)
{
    if (b->flags & PS_BATCH_DROP_REMAINDER)
        return b->count / b->batch;
    return (b->count + b->batch - 1) / b->batch;
}

void ps_batcher_close(struct ps_batcher *b)
{
    if (b == NULL)
        return;
    free(b->order);
    memset(b, 0, sizeof *b);
}
