/*
 * hostid.c - this host's id and the check for a psd's unix socket. See
 * hostid.h for the rule.
 */
#include "common/hostid.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The first line of a small file into buf, without its newline. Returns 0
 * or -errno. */
static int read_line(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, len - 1);
    int rc = n < 0 ? -errno : 0;
    close(fd);
    if (rc != 0)
        return rc;
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return buf[0] != '\0' ? 0 : -ENODATA;
}

/* The inode in "pid:[4026531836]", the target of /proc/self/ns/pid. */
static int pid_namespace(char *buf, size_t len)
{
    char link[64];
    ssize_t n = readlink("/proc/self/ns/pid", link, sizeof link - 1);
    if (n < 0)
        return -errno;
    link[n] = '\0';
    const char *open_br = strchr(link, '[');
    const char *close_br = strchr(link, ']');
    if (open_br == NULL || close_br == NULL || close_br <= open_br + 1)
        return -EINVAL;
    snprintf(buf, len, "%.*s", (int)(close_br - open_br - 1), open_br + 1);
    return 0;
}

int ps_host_id(char *buf, size_t len)
{
    buf[0] = '\0';
    const char *env = getenv("PS_HOST_ID");
    if (env != NULL && env[0] != '\0') {
        if (strlen(env) >= len || strlen(env) >= PS_HOST_ID_MAX)
            return -ENAMETOOLONG;
        snprintf(buf, len, "%s", env);
        return 0;
    }
    char boot[64], ns[32];
    int rc = read_line("/proc/sys/kernel/random/boot_id", boot, sizeof boot);
    if (rc == 0)
        rc = pid_namespace(ns, sizeof ns);
    if (rc != 0)
        return rc;
    snprintf(buf, len, "%s:%s", boot, ns);
    return 0;
}

int ps_host_local_address(const char *path, char *out, size_t len)
{
    char cwd[4096] = "";
    if (path[0] != '/' && getcwd(cwd, sizeof cwd) == NULL)
        return -errno;
    int n = snprintf(out, len, "unix:%s%s%s", cwd, cwd[0] ? "/" : "", path);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

bool ps_host_use_local(const char *mine, const char *theirs,
                       const char *local_address, char *why, size_t whylen)
{
    if (mine == NULL || theirs == NULL || mine[0] == '\0' ||
        strcmp(mine, theirs) != 0) {
        snprintf(why, whylen, "%s", theirs == NULL || theirs[0] == '\0'
                                        ? "its host is not known"
                                        : "another host");
        return false;
    }
    if (local_address == NULL || strncmp(local_address, "unix:/", 6) != 0) {
        snprintf(why, whylen, "it has no local socket (psd --local-socket)");
        return false;
    }
    const char *path = local_address + 5;
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(why, whylen, "%s: %s", local_address, strerror(errno));
        return false;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(why, whylen, "%s is not a socket", local_address);
        return false;
    }
    /* Connecting to a unix socket takes write permission on its file; a
     * read-only mount (systemd's ProtectSystem=strict) does not stop it, so
     * EROFS is no refusal. */
    if (access(path, W_OK) != 0 && errno != EROFS) {
        snprintf(why, whylen, "%s: %s", local_address, strerror(errno));
        return false;
    }
    why[0] = '\0';
    return true;
}
