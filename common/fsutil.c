#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int ps_mkdirs(const char *path)
{
    char buf[PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof buf)
        return -ENAMETOOLONG;
    memcpy(buf, path, len + 1);
    for (char *p = buf + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* The pid written in an open lock file, or 0. */
static pid_t lock_holder(int fd)
{
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    long pid = strtol(buf, NULL, 10);
    return pid > 0 && pid <= INT32_MAX ? (pid_t)pid : 0;
}

int ps_dir_lock(const char *dir, const char *name, pid_t *holder)
{
    *holder = 0;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return -ENAMETOOLONG;
    int rc = ps_mkdirs(dir);
    if (rc != 0)
        return rc;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        rc = -errno;
        if (rc == -EWOULDBLOCK)
            *holder = lock_holder(fd);
        close(fd);
        return rc;
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
        rc = -errno;
        close(fd);
        return rc != 0 ? rc : -EIO;
    }
    return fd;
}

uint64_t ps_proc_stat_field(pid_t pid, int field)
{
    if (field < 4)
        return 0;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: count
     * from the last ')', which ends it. */
    char *p = strrchr(buf, ')');
    for (int f = 2; p != NULL && f < field; f++)
        p = strchr(p + 1, ' ');
    return p != NULL ? strtoull(p + 1, NULL, 10) : 0;
}

int ps_write_all(int fd, const void *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, (const char *)buf + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        done += (size_t)w;
    }
    return 0;
}
