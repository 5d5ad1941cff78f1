/*
 * events.c - TensorBoard event files in TFRecord framing (events.h).
 */
#include "worker/events.h"

#include "common/fsutil.h"
#include "common/log.h"
#include "proto/tensorboard.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct wd_events {
    int fd;             /* -1 once a write failed */
    char *path;
};

/* TFRecord's mask, so that a CRC stored beside the data it covers does not
 * checksum to a constant. */
#define CRC_MASK_DELTA 0xa282ead8u

uint32_t wd_crc32c(const void *buf, size_t len)
{
    /* ISA-L's crc32_iscsi neither inverts its seed nor its result: the
     * standard CRC32C starts from ~0 and ends inverted, and a chain of calls
     * passes the raw value on. Its length is an int. */
    const unsigned char *p = buf;
    uint32_t crc = 0xffffffffu;
    while (len > 0) {
        int n = len > (size_t)(INT_MAX / 2) ? INT_MAX / 2 : (int)len;
        crc = crc32_iscsi((unsigned char *)p, n, crc);
        p += n;
        len -= (size_t)n;
    }
    return ~crc;
}

uint32_t wd_crc32c_masked(const void *buf, size_t len)
{
    uint32_t crc = wd_crc32c(buf, len);
    return ((crc >> 15) | (crc << 17)) + CRC_MASK_DELTA;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Frames the len bytes of data that already lie at rec + 12. */
static size_t frame_in_place(uint8_t *rec, size_t len)
{
    put_le64(rec, (uint64_t)len);
    put_le32(rec + 8, wd_crc32c_masked(rec, 8));
    put_le32(rec + 12 + len, wd_crc32c_masked(rec + 12, len));
    return len + WD_RECORD_OVERHEAD;
}

size_t wd_record_frame(uint8_t *out, const void *data, size_t len)
{
    memmove(out + 12, data, len);
    return frame_in_place(out, len);
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Frames the event and writes it with one write(2) (or more, if the kernel
 * takes it in parts). Returns 0 or -errno. */
static int write_event(int fd, const Tensorflow__Event *e)
{
    size_t len = tensorflow__event__get_packed_size(e);
    uint8_t *rec = malloc(len + WD_RECORD_OVERHEAD);
    if (rec == NULL)
        return -ENOMEM;
    tensorflow__event__pack(e, rec + 12);
    int rc = ps_write_all(fd, rec, frame_in_place(rec, len));
    free(rec);
    return rc;
}

/* Opens a new file in rundir under TensorFlow's name; a second writer in
 * the same second on the same host gets ".<pid>" after it. Returns the fd
 * or -errno, with *path set to the file's path (or the directory's, when
 * it cannot be made). */
static int open_file(const char *rundir, char **path)
{
    char host[256];
    if (gethostname(host, sizeof host) != 0 || host[0] == '\0')
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    *path = strdup(rundir);
    if (*path == NULL)
        return -ENOMEM;
    int rc = ps_mkdirs(rundir);
    if (rc != 0)
        return rc;
    long long secs = (long long)time(NULL);
    for (int attempt = 0; attempt < 2; attempt++) {
        char *p = NULL;
        int n = attempt == 0
            ? asprintf(&p, "%s/events.out.tfevents.%lld.%s", rundir, secs, host)
            : asprintf(&p, "%s/events.out.tfevents.%lld.%s.%ld", rundir, secs, host,
                       (long)getpid());
        if (n < 0)
            return -ENOMEM;
        free(*path);
        *path = p;
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0)
            return fd;
        if (errno != EEXIST)
            return -errno;
    }
    return -EEXIST;
}

int wd_events_create(const char *rundir, wd_events **out)
{
    *out = NULL;
    wd_events *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return -ENOMEM;
    int rc = open_file(rundir, &ev->path);
    if (rc < 0)
        goto fail;
    ev->fd = rc;
    Tensorflow__Event e = TENSORFLOW__EVENT__INIT;
    e.wall_time = wall_now();
    e.what_case = TENSORFLOW__EVENT__WHAT_FILE_VERSION;
    e.file_version = (char *)"brain.Event:2";
    rc = write_event(ev->fd, &e);
    if (rc != 0) {
        close(ev->fd);
        goto fail;
    }
    *out = ev;
    return 0;
fail:
    ps_log_warn("--logdir: cannot write TensorBoard events to %s: %s; training "
                "goes on without them", ev->path ? ev->path : rundir, strerror(-rc));
    free(ev->path);
    free(ev);
    return rc;
}

int wd_events_write(wd_events *ev, int64_t step, const struct wd_scalar *v, size_t n)
{
    if (ev == NULL || ev->fd < 0)
        return 0;
    Tensorflow__Summary__Value *vals = calloc(n ? n : 1, sizeof *vals);
    Tensorflow__Summary__Value **pv = calloc(n ? n : 1, sizeof *pv);
    int rc = -ENOMEM;
    if (vals != NULL && pv != NULL) {
        for (size_t i = 0; i < n; i++) {
            tensorflow__summary__value__init(&vals[i]);
            vals[i].tag = (char *)v[i].tag;
            vals[i].value_case = TENSORFLOW__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
            vals[i].simple_value = v[i].value;
            pv[i] = &vals[i];
        }
        Tensorflow__Summary s = TENSORFLOW__SUMMARY__INIT;
        s.n_value = n;
        s.value = pv;
        Tensorflow__Event e = TENSORFLOW__EVENT__INIT;
        e.wall_time = wall_now();
        e.step = step;
        e.what_case = TENSORFLOW__EVENT__WHAT_SUMMARY;
        e.summary = &s;
        rc = write_event(ev->fd, &e);
    }
    free(vals);
    free(pv);
    if (rc != 0) {
        ps_log_warn("--logdir: cannot write TensorBoard events to %s: %s; training "
                    "goes on without them", ev->path, strerror(-rc));
        close(ev->fd);
        ev->fd = -1;
    }
    return rc;
}

const char *wd_events_path(const wd_events *ev)
{
    return ev->path;
}

void wd_events_destroy(wd_events *ev)
{
    if (ev == NULL)
        return;
    if (ev->fd >= 0)
        close(ev->fd);
    free(ev->path);
    free(ev);
}
