/*
 * checkpoint.c - checkpoint directories: write, find, verify, prune. The
 * crash-safety argument is in checkpoint.h.
 */
#include "server/checkpoint.h"

#include "common/errors.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "server/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define CKPT_DIR "checkpoints"
#define MANIFEST "MANIFEST.json"
#define DATA_FILE "data.mdb"
#define TMP_MARK ".tmp-"
#define MANIFEST_FORMAT 2 /* 1: no "sequence" (read as 0) */
#define IO_CHUNK (1u << 20)

struct manifest {
    uint64_t step;
    uint64_t seq; /* creation order: one more than any other checkpoint's */
    uint64_t nvars;
    uint64_t bytes;
    uint32_t crc;
};

/* A failed write or rename as a code: running out of room is PS_EFULL. */
static int io_rc(int e)
{
    return (e == ENOSPC || e == EDQUOT || e == EFBIG) ? PS_EFULL : -e;
}

static int pathf(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int pathf(char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, len, fmt, ap);
    va_end(ap);
    return (n < 0 || (size_t)n >= len) ? -ENAMETOOLONG : 0;
}

static int fsync_path(const char *path, int oflags)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | oflags);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) == 0 ? 0 : io_rc(errno);
    close(fd);
    return rc;
}

static int rm_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

/* Removes a directory tree; a missing one is fine. */
static int rm_rf(const char *path)
{
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT) {
        int rc = -errno;
        ps_log_err(rc, "checkpoint: removing %s", path);
        return rc;
    }
    return 0;
}

/* Reads a whole file for its size and crc32, and fsyncs it when asked. */
static int file_crc(const char *path, bool sync, uint32_t *crc_out, uint64_t *size_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = 0;
    unsigned char *buf = malloc(IO_CHUNK);
    if (!buf) {
        rc = -ENOMEM;
        goto close_fd;
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    uint64_t size = 0;
    for (;;) {
        ssize_t n = read(fd, buf, IO_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            goto free_buf;
        }
        if (n == 0)
            break;
        crc = crc32(crc, buf, (uInt)n);
        size += (uint64_t)n;
    }
    if (sync && fsync(fd) != 0) {
        rc = io_rc(errno);
        goto free_buf;
    }
    *crc_out = (uint32_t)crc;
    *size_out = size;
free_buf:
    free(buf);
close_fd:
    close(fd);
    return rc;
}

static int write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return io_rc(errno);
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Writes dir/MANIFEST.json.tmp, fsyncs it, renames it to MANIFEST.json and
 * fsyncs dir, so the manifest is either whole or absent. */
static int write_manifest(const char *dir, const struct manifest *m)
{
    char tmp[PATH_MAX], final[PATH_MAX];
    int rc = pathf(tmp, sizeof tmp, "%s/" MANIFEST ".tmp", dir);
    if (rc == 0)
        rc = pathf(final, sizeof final, "%s/" MANIFEST, dir);
    if (rc != 0)
        return rc;
    json_t *root = json_pack("{s:i, s:I, s:I, s:I, s:I, s:I, s:s, s:I}", "format",
                             MANIFEST_FORMAT, "step", (json_int_t)m->step, "sequence",
                             (json_int_t)m->seq, "variables", (json_int_t)m->nvars,
                             "bytes", (json_int_t)m->bytes, "created_unix",
                             (json_int_t)time(NULL), "data_file", DATA_FILE, "crc32",
                             (json_int_t)m->crc);
    if (!root)
        return -ENOMEM;
    char *text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!text)
        return -ENOMEM;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = io_rc(errno);
        goto free_text;
    }
    rc = write_all(fd, text, strlen(text));
    if (rc == 0)
        rc = write_all(fd, "\n", 1);
    if (rc == 0 && fsync(fd) != 0)
        rc = io_rc(errno);
    if (close(fd) != 0 && rc == 0)
        rc = io_rc(errno);
    if (rc == 0 && rename(tmp, final) != 0)
        rc = io_rc(errno);
    if (rc == 0)
        rc = fsync_path(dir, O_DIRECTORY);
free_text:
    free(text);
    return rc;
}

/* Reads dir's manifest and checks it against the directory: PS_ENOTFOUND
 * without one, PS_ECORRUPT (logged unless quiet) when it does not parse,
 * does not name this step, or data.mdb's size differs. */
static int read_manifest(const char *dir, uint64_t step, struct manifest *m)
{
    char path[PATH_MAX];
    int rc = pathf(path, sizeof path, "%s/" MANIFEST, dir);
    if (rc != 0)
        return rc;
    FILE *f = fopen(path, "re");
    if (!f)
        return (errno == ENOENT || errno == ENOTDIR) ? PS_ENOTFOUND : -errno;
    json_error_t jerr;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    if (!root) {
        ps_log_warn("checkpoint %s: %s line %d: %s", dir, MANIFEST, jerr.line, jerr.text);
        return PS_ECORRUPT;
    }
    json_int_t format, jstep, seq = 0, nvars, bytes, created, crc;
    const char *data_file;
    if (json_unpack_ex(root, &jerr, JSON_STRICT, "{s:I, s:I, s?I, s:I, s:I, s:I, s:s, s:I}",
                       "format", &format, "step", &jstep, "sequence", &seq, "variables",
                       &nvars, "bytes", &bytes, "created_unix", &created, "data_file",
                       &data_file, "crc32", &crc) != 0) {
        ps_log_warn("checkpoint %s: %s: %s", dir, MANIFEST, jerr.text);
        rc = PS_ECORRUPT;
        goto decref;
    }
    if (format < 1 || format > MANIFEST_FORMAT || seq < 0 || jstep < 0 ||
        (uint64_t)jstep != step || nvars < 0 ||
        bytes < 0 || crc < 0 || crc > (json_int_t)UINT32_MAX || strcmp(data_file, DATA_FILE)) {
        ps_log_warn("checkpoint %s: %s does not describe this checkpoint (format %lld, step %lld,"
                    " data file '%s')", dir, MANIFEST, (long long)format, (long long)jstep,
                    data_file);
        rc = PS_ECORRUPT;
        goto decref;
    }
    m->step = step;
    m->seq = (uint64_t)seq;
    m->nvars = (uint64_t)nvars;
    m->bytes = (uint64_t)bytes;
    m->crc = (uint32_t)crc;

    struct stat st;
    rc = pathf(path, sizeof path, "%s/" DATA_FILE, dir);
    if (rc != 0)
        goto decref;
    if (stat(path, &st) != 0) {
        ps_log_warn("checkpoint %s: %s: %s", dir, DATA_FILE, strerror(errno));
        rc = PS_ECORRUPT;
        goto decref;
    }
    if ((uint64_t)st.st_size != m->bytes) {
        ps_log_warn("checkpoint %s: %s has %llu bytes, the manifest says %llu", dir, DATA_FILE,
                    (unsigned long long)st.st_size, (unsigned long long)m->bytes);
        rc = PS_ECORRUPT;
        goto decref;
    }
decref:
    json_decref(root);
    return rc;
}

/* read_manifest, then the crc32 of the whole data file. */
static int verify(const char *dir, uint64_t step)
{
    struct manifest m = {0};
    int rc = read_manifest(dir, step, &m);
    if (rc != 0)
        return rc;
    char path[PATH_MAX];
    rc = pathf(path, sizeof path, "%s/" DATA_FILE, dir);
    if (rc != 0)
        return rc;
    uint32_t crc;
    uint64_t size;
    rc = file_crc(path, false, &crc, &size);
    if (rc != 0) {
        ps_log_err(rc, "checkpoint %s: reading %s", dir, DATA_FILE);
        return rc;
    }
    if (crc != m.crc || size != m.bytes) {
        ps_log_warn("checkpoint %s: %s has crc32 %08x (%llu bytes), the manifest says %08x",
                    dir, DATA_FILE, crc, (unsigned long long)size, m.crc);
        return PS_ECORRUPT;
    }
    return 0;
}

/* A bare decimal step, as psd_ckpt_write names directories: no sign, no
 * leading zeros, nothing after. */
static bool parse_step(const char *name, uint64_t *out)
{
    if (name[0] < '0' || name[0] > '9' || (name[0] == '0' && name[1] != '\0'))
        return false;
    uint64_t v = 0;
    for (const char *p = name; *p; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return true;
}

/* One complete checkpoint as scan() finds it. */
struct entry {
    uint64_t step, seq;
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Creation order: by sequence, then (for format-1 manifests, all 0) by step. */
static int cmp_created(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    if (x->seq != y->seq)
        return (x->seq > y->seq) - (x->seq < y->seq);
    return (x->step > y->step) - (x->step < y->step);
}

/* Every complete checkpoint in ckdir, oldest created first, in a malloc'd
 * array (NULL when there are none). A missing ckdir has none.
 *
 * Why creation order and not the step: the step is the caller's word.
 * Ordered by step, three checkpoints at steps far ahead of the training
 * (within any bound a shard could check, since pscoord's global step may
 * run ahead of a shard's versions) would outrank every honest checkpoint
 * to come: retention would prune the honest ones at each call and Restore
 * of the latest would load the forged one for good. Ordered by creation, a
 * checkpoint at any step is just the newest one, pruned in its turn by
 * the next --checkpoint-keep ones taken. */
static int scan(const char *ckdir, struct entry **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    DIR *d = opendir(ckdir);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    struct entry *steps = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        uint64_t step;
        if (!parse_step(e->d_name, &step))
            continue;
        char dir[PATH_MAX];
        struct manifest m = {0};
        if (pathf(dir, sizeof dir, "%s/%s", ckdir, e->d_name) != 0 ||
            read_manifest(dir, step, &m) != 0)
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            struct entry *p = realloc(steps, ncap * sizeof *p);
            if (!p) {
                rc = -ENOMEM;
                break;
            }
            steps = p;
            cap = ncap;
        }
        steps[n++] = (struct entry){.step = step, .seq = m.seq};
    }
    closedir(d);
    if (rc != 0) {
        free(steps);
        return rc;
    }
    if (n > 1)
        qsort(steps, n, sizeof *steps, cmp_created);
    *out = steps;
    *n_out = n;
    return 0;
}

/* A data directory's checkpoints directory and the checkpoints scan()
 * found in it, oldest created first; the caller frees steps. */
struct listing {
    char ckdir[PATH_MAX];
    struct entry *steps;
    size_t n;
};

/* scan() of data_dir's checkpoints directory into l. */
static int scan_root(const char *data_dir, struct listing *l)
{
    l->steps = NULL;
    l->n = 0;
    int rc = pathf(l->ckdir, sizeof l->ckdir, "%s/" CKPT_DIR, data_dir);
    return rc != 0 ? rc : scan(l->ckdir, &l->steps, &l->n);
}

/* Removes the entry name of ckdir with all below it; a failure goes to *rc
 * unless *rc already holds one. Returns whether it was removed. */
static bool rm_entry_of(const char *ckdir, const char *name, int *rc)
{
    char dir[PATH_MAX];
    int r = pathf(dir, sizeof dir, "%s/%s", ckdir, name);
    if (r == 0)
        r = rm_rf(dir);
    if (r != 0 && *rc == 0)
        *rc = r;
    return r == 0;
}

/* One more than the highest sequence of the complete checkpoints in ckdir
 * (1 when there are none): the new checkpoint is the newest created. */
static int next_seq(const char *ckdir, uint64_t *out)
{
    struct entry *e;
    size_t n;
    int rc = scan(ckdir, &e, &n);
    if (rc != 0)
        return rc;
    *out = (n > 0 ? e[n - 1].seq : 0) + 1;
    free(e);
    return 0;
}

/* Puts the finished tmp directory in place as final. A directory already at
 * final (an earlier checkpoint of the same step) is swapped out atomically
 * where the file system can, else renamed aside first; either way it is
 * removed only after the new one is in place. */
static int install(const char *ckdir, const char *tmp, const char *final, uint64_t step)
{
    if (rename(tmp, final) == 0)
        return 0;
    if (errno != ENOTEMPTY && errno != EEXIST)
        return io_rc(errno);
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        rm_rf(tmp); /* the old one, now under the tmp name */
        return 0;
    }
    if (errno != EINVAL && errno != ENOSYS)
        return io_rc(errno);
    char aside[PATH_MAX];
    int rc = pathf(aside, sizeof aside, "%s/%llu" TMP_MARK "%ld-old", ckdir,
                   (unsigned long long)step, (long)getpid());
    if (rc != 0)
        return rc;
    rm_rf(aside);
    if (rename(final, aside) != 0)
        return io_rc(errno);
    if (rename(tmp, final) != 0) {
        rc = io_rc(errno);
        if (rename(aside, final) != 0)
            ps_log_err(-errno, "checkpoint %s: could not put the old checkpoint back from %s",
                       final, aside);
        return rc;
    }
    rm_rf(aside);
    return 0;
}

int psd_ckpt_write(psd_store *s, const char *data_dir, uint64_t step, uint64_t nvars,
                   char *path_out, size_t pathlen, uint64_t *bytes_out)
{
    return psd_ckpt_write_with(s, data_dir, step, nvars, NULL, NULL, path_out, pathlen,
                               bytes_out);
}

int psd_ckpt_write_with(psd_store *s, const char *data_dir, uint64_t step, uint64_t nvars,
                        int (*complete)(void *ctx, const char *dir), void *ctx,
                        char *path_out, size_t pathlen, uint64_t *bytes_out)
{
    if (!s || !data_dir || !*data_dir || step > INT64_MAX || nvars > INT64_MAX)
        return PS_EINVAL_ARG;
    char ckdir[PATH_MAX], tmp[PATH_MAX], final[PATH_MAX], file[PATH_MAX];
    int rc = pathf(ckdir, sizeof ckdir, "%s/" CKPT_DIR, data_dir);
    if (rc == 0)
        rc = pathf(tmp, sizeof tmp, "%s/%llu" TMP_MARK "%ld", ckdir, (unsigned long long)step,
                   (long)getpid());
    if (rc == 0)
        rc = pathf(final, sizeof final, "%s/%llu", ckdir, (unsigned long long)step);
    if (rc == 0)
        rc = pathf(file, sizeof file, "%s/" DATA_FILE, tmp);
    if (rc != 0)
        return rc;
    if (path_out && strlen(final) >= pathlen)
        return PS_EINVAL_ARG;

    rc = ps_mkdirs(ckdir);
    if (rc < 0)
        rc = io_rc(-rc);
    if (rc == 0)
        rc = fsync_path(data_dir, O_DIRECTORY); /* checkpoints/ may be new */
    if (rc != 0) {
        ps_log_err(rc, "checkpoint: creating %s", ckdir);
        return rc;
    }
    rm_rf(tmp); /* left by an earlier failed attempt of this process */
    if (mkdir(tmp, 0755) != 0) {
        rc = io_rc(errno);
        ps_log_err(rc, "checkpoint: creating %s", tmp);
        return rc;
    }
    rc = psd_store_copy(s, tmp);
    if (rc == 0 && complete != NULL)
        rc = complete(ctx, tmp);
    if (rc != 0)
        goto remove_tmp;
    struct manifest m = {.step = step, .nvars = nvars};
    rc = next_seq(ckdir, &m.seq);
    if (rc == 0)
        rc = file_crc(file, true, &m.crc, &m.bytes);
    if (rc != 0) {
        ps_log_err(rc, "checkpoint: reading back %s", file);
        goto remove_tmp;
    }
    rc = write_manifest(tmp, &m);
    if (rc != 0) {
        ps_log_err(rc, "checkpoint: writing %s/" MANIFEST, tmp);
        goto remove_tmp;
    }
    rc = install(ckdir, tmp, final, step);
    if (rc != 0) {
        ps_log_err(rc, "checkpoint: renaming %s to %s", tmp, final);
        goto remove_tmp;
    }
    rc = fsync_path(ckdir, O_DIRECTORY);
    if (rc != 0) {
        /* The checkpoint is in place and whole; only its name may not
         * survive a power cut. */
        ps_log_err(rc, "checkpoint: fsync %s", ckdir);
        return rc;
    }
    if (path_out)
        memcpy(path_out, final, strlen(final) + 1);
    if (bytes_out)
        *bytes_out = m.bytes;
    ps_log_info("checkpoint %s: %llu variables, %llu bytes", final, (unsigned long long)nvars,
                (unsigned long long)m.bytes);
    return 0;

remove_tmp:
    rm_rf(tmp);
    return rc;
}

int psd_ckpt_latest(const char *data_dir, uint64_t *step_out)
{
    if (!data_dir || !step_out)
        return PS_EINVAL_ARG;
    struct listing l;
    int rc = scan_root(data_dir, &l);
    if (rc != 0)
        return rc;
    rc = PS_ENOTFOUND;
    for (size_t i = l.n; i-- > 0;) {
        char dir[PATH_MAX];
        if (pathf(dir, sizeof dir, "%s/%llu", l.ckdir, (unsigned long long)l.steps[i].step) != 0)
            continue;
        if (verify(dir, l.steps[i].step) == 0) {
            *step_out = l.steps[i].step;
            rc = 0;
            break;
        }
        ps_log_warn("checkpoint %s: skipped, it does not verify", dir);
    }
    free(l.steps);
    return rc;
}

int psd_ckpt_path(const char *data_dir, uint64_t step, char *out, size_t len)
{
    if (!data_dir || !out)
        return PS_EINVAL_ARG;
    char dir[PATH_MAX];
    int rc = pathf(dir, sizeof dir, "%s/" CKPT_DIR "/%llu", data_dir, (unsigned long long)step);
    if (rc != 0)
        return rc;
    if (strlen(dir) >= len)
        return PS_EINVAL_ARG;
    rc = verify(dir, step);
    if (rc != 0)
        return rc;
    memcpy(out, dir, strlen(dir) + 1);
    return 0;
}

int psd_ckpt_list(const char *data_dir, uint64_t *steps, size_t cap, size_t *count)
{
    if (!data_dir || !count || (cap > 0 && !steps))
        return PS_EINVAL_ARG;
    struct listing l;
    int rc = scan_root(data_dir, &l);
    if (rc != 0)
        return rc;
    uint64_t *all = l.n > 0 ? malloc(l.n * sizeof *all) : NULL;
    if (l.n > 0 && all == NULL) {
        free(l.steps);
        return -ENOMEM;
    }
    for (size_t i = 0; i < l.n; i++)
        all[i] = l.steps[i].step;
    if (l.n > 1)
        qsort(all, l.n, sizeof *all, cmp_u64);
    if (l.n > 0)
        memcpy(steps, all, (l.n < cap ? l.n : cap) * sizeof *all);
    free(all);
    *count = l.n;
    free(l.steps);
    return 0;
}

static int prune(const char *data_dir, size_t keep_last, bool have_spare, uint64_t spare);

/* A *.tmp-<pid>* directory whose writer is gone: not this process, and no
 * process of that id exists. */
static bool stale_tmp(const char *name)
{
    const char *p = strstr(name, TMP_MARK);
    if (!p)
        return false;
    char *end;
    errno = 0;
    long pid = strtol(p + strlen(TMP_MARK), &end, 10);
    if (errno || end == p + strlen(TMP_MARK) || pid <= 0 || pid > INT_MAX)
        return false;
    if (pid == (long)getpid())
        return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int psd_ckpt_prune(const char *data_dir, size_t keep_last)
{
    return prune(data_dir, keep_last, false, 0);
}

int psd_ckpt_prune_sparing(const char *data_dir, size_t keep_last, uint64_t spare)
{
    return prune(data_dir, keep_last, true, spare);
}

static int prune(const char *data_dir, size_t keep_last, bool have_spare, uint64_t spare)
{
    if (!data_dir)
        return PS_EINVAL_ARG;
    struct listing l;
    int rc = scan_root(data_dir, &l);
    if (rc != 0)
        return rc;
    uint64_t keep;
    bool have_keep = l.n > 0 && psd_ckpt_latest(data_dir, &keep) == 0;
    for (size_t i = 0; i + keep_last < l.n; i++) {
        if ((have_keep && l.steps[i].step == keep) ||
            (have_spare && l.steps[i].step == spare))
            continue;
        char name[24];
        snprintf(name, sizeof name, "%llu", (unsigned long long)l.steps[i].step);
        if (rm_entry_of(l.ckdir, name, &rc))
            ps_log_info("checkpoint %s/%s: pruned", l.ckdir, name);
    }
    free(l.steps);

    DIR *d = opendir(l.ckdir);
    if (!d)
        return rc != 0 ? rc : (errno == ENOENT ? 0 : -errno);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (stale_tmp(e->d_name))
            rm_entry_of(l.ckdir, e->d_name, &rc);
    }
    closedir(d);
    return rc;
}
