#include "common/shm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

struct ps_shm {
    int fd;
    void *base;
    size_t size;
    char name[PS_SHM_NAME_MAX];
};

int ps_shm_create(size_t bytes, ps_shm **out)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t size = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    if (size == 0)
        size = (size_t)page;
    uint64_t tag;
    if (getrandom(&tag, sizeof tag, 0) != (ssize_t)sizeof tag)
        return errno ? -errno : -EIO;
    ps_shm *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    char mname[32];
    snprintf(mname, sizeof mname, "ps-%016llx", (unsigned long long)tag);
    s->fd = memfd_create(mname, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    int rc = 0;
    if (s->fd < 0 || ftruncate(s->fd, (off_t)size) != 0 ||
        fcntl(s->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        rc = -errno;
    if (rc == 0) {
        s->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
        if (s->base == MAP_FAILED) {
            rc = -errno;
            s->base = NULL;
        }
    }
    if (rc != 0) {
        if (s->fd >= 0)
            close(s->fd);
        free(s);
        return rc;
    }
    s->size = size;
    snprintf(s->name, sizeof s->name, "memfd:%d:%d:%s", (int)getpid(), s->fd, mname);
    *out = s;
    return 0;
}

void ps_shm_destroy(ps_shm *s)
{
    if (s == NULL)
        return;
    munmap(s->base, s->size);
    close(s->fd);
    free(s);
}

void *ps_shm_base(const ps_shm *s)
{
    return s->base;
}

size_t ps_shm_size(const ps_shm *s)
{
    return s->size;
}

const char *ps_shm_name(const ps_shm *s)
{
    return s->name;
}

bool ps_shm_contains(const ps_shm *s, const void *p, size_t len, uint64_t *off)
{
    if (s == NULL || p == NULL)
        return false;
    uintptr_t b = (uintptr_t)s->base, q = (uintptr_t)p;
    if (q < b || q - b > s->size || len > s->size - (q - b))
        return false;
    *off = q - b;
    return true;
}

/* Digits only, no sign, no leading zero (bar "0"), below 2^31. */
static int parse_int(const char *p, size_t n, int *out)
{
    if (n == 0 || n > 10 || (n > 1 && p[0] == '0'))
        return -1;
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        v = v * 10 + (p[i] - '0');
    }
    if (v > 0x7fffffff)
        return -1;
    *out = (int)v;
    return 0;
}

int ps_shm_parse_name(const char *name, char *path, size_t pathlen,
                      char *memfd_name, size_t memfd_len, int *pid)
{
    if (strncmp(name, "memfd:", 6) != 0)
        return -EINVAL;
    const char *p = name + 6, *c1 = strchr(p, ':');
    const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    int fd;
    if (c2 == NULL || parse_int(p, (size_t)(c1 - p), pid) != 0 ||
        parse_int(c1 + 1, (size_t)(c2 - c1 - 1), &fd) != 0 || *pid == 0)
        return -EINVAL;
    const char *tag = c2 + 1;
    if (strncmp(tag, "ps-", 3) != 0 || strlen(tag) != 19)
        return -EINVAL;
    for (int i = 3; i < 19; i++)
        if (!((tag[i] >= '0' && tag[i] <= '9') || (tag[i] >= 'a' && tag[i] <= 'f')))
            return -EINVAL;
    snprintf(path, pathlen, "/proc/%d/fd/%d", *pid, fd);
    snprintf(memfd_name, memfd_len, "/memfd:%s", tag);
    return 0;
}

/* a is a loopback address, or the same address as one of the interfaces'. */
static bool addr_is_local(const struct sockaddr *a, const struct ifaddrs *ifs)
{
    if (a->sa_family == AF_INET) {
        const struct sockaddr_in *v4 = (const void *)a;
        if ((ntohl(v4->sin_addr.s_addr) >> 24) == 127)
            return true;
    } else if (a->sa_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const void *)a;
        if (IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr))
            return true;
    } else {
        return false;
    }
    for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        const struct sockaddr *b = i->ifa_addr;
        if (b == NULL || b->sa_family != a->sa_family)
            continue;
        if (a->sa_family == AF_INET &&
            ((const struct sockaddr_in *)(const void *)a)->sin_addr.s_addr ==
                ((const struct sockaddr_in *)(const void *)b)->sin_addr.s_addr)
            return true;
        if (a->sa_family == AF_INET6 &&
            memcmp(&((const struct sockaddr_in6 *)(const void *)a)->sin6_addr,
                   &((const struct sockaddr_in6 *)(const void *)b)->sin6_addr,
                   sizeof(struct in6_addr)) == 0)
            return true;
    }
    return false;
}

bool ps_shm_target_is_local(const char *target)
{
    if (strncmp(target, "unix:", 5) == 0)
        return true;
    const char *t = target;
    if (strncmp(t, "ipv4:", 5) == 0 || strncmp(t, "ipv6:", 5) == 0)
        t += 5;
    else if (strncmp(t, "dns:///", 7) == 0)
        t += 7;
    else if (strncmp(t, "dns:", 4) == 0)
        t += 4;
    char host[256];
    const char *end;
    if (*t == '[') {
        t++;
        end = strchr(t, ']');
    } else {
        end = strrchr(t, ':');
    }
    if (end == NULL || end == t || (size_t)(end - t) >= sizeof host)
        return false;
    memcpy(host, t, (size_t)(end - t));
    host[end - t] = '\0';
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return false;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        ifs = NULL;
    bool local = false;
    for (struct addrinfo *r = res; r != NULL && !local; r = r->ai_next)
        local = addr_is_local(r->ai_addr, ifs);
    freeifaddrs(ifs);
    freeaddrinfo(res);
    return local;
}
