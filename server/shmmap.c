#include "server/shmmap.h"

#include "common/clock.h"
#include "common/rpc.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_REGIONS 1024

struct region {
    char name[PS_SHM_NAME_MAX];
    pid_t pid;      /* its owner, who alone may name it */
    uint64_t start; /* the owner's start time (ps_rpc_peer_cred) */
    void *base;
    size_t size;
    int64_t last_used_ms; /* atomic */
};

struct psd_shmmap {
    pthread_rwlock_t use;  /* callers read-hold it; unmapping write-holds it */
    pthread_mutex_t mu;    /* the table */
    struct region *r;
    size_t n;
};

int psd_shmmap_create(psd_shmmap **out)
{
    psd_shmmap *m = calloc(1, sizeof *m);
    if (m == NULL)
        return -ENOMEM;
    pthread_rwlock_init(&m->use, NULL);
    pthread_mutex_init(&m->mu, NULL);
    *out = m;
    return 0;
}

void psd_shmmap_destroy(psd_shmmap *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->n; i++)
        munmap(m->r[i].base, m->r[i].size);
    free(m->r);
    pthread_rwlock_destroy(&m->use);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void psd_shmmap_enter(psd_shmmap *m)
{
    pthread_rwlock_rdlock(&m->use);
}

void psd_shmmap_leave(psd_shmmap *m)
{
    pthread_rwlock_unlock(&m->use);
}

/* Opens and maps the region called name, of process pid (the caller's:
 * psd_shmmap_get checked); 0 or a ps_rpc_code with err. Nothing of what
 * the descriptor turns out to be goes into err or the log: before issue 13
 * a wrong name was answered with readlink's target, the secret name of a
 * memfd or the path of any file another process had open. */
static int map_region(const char *name, struct region *out, char *err, size_t errlen)
{
    char path[64], want[64], ours[64], got[128];
    int pid;
    if (ps_shm_parse_name(name, path, sizeof path, want, sizeof want, &pid) != 0) {
        snprintf(err, errlen, "shared memory name '%s' is not "
                 "memfd:PID:FD:ps-<16 hex digits>", name);
        return PS_RPC_INVALID_ARGUMENT;
    }
    /* Only a regular file (a memfd is one) is opened: opening a device or
     * a FIFO can have effects of its own. O_NONBLOCK | O_NOCTTY for one
     * swapped in between. */
    struct stat pre;
    if (stat(path, &pre) == 0 && !S_ISREG(pre.st_mode)) {
        snprintf(err, errlen, "shared memory '%s': not the memfd named", name);
        return PS_RPC_FAILED_PRECONDITION;
    }
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, errlen, "shared memory '%s': cannot open it: %s (is the "
                 "client in another pid namespace, or another user's?)", name,
                 strerror(errno));
        return PS_RPC_FAILED_PRECONDITION;
    }
    /* What was opened, not what the path named a moment before. */
    snprintf(ours, sizeof ours, "/proc/self/fd/%d", fd);
    ssize_t gl = readlink(ours, got, sizeof got - 1);
    got[gl > 0 ? gl : 0] = '\0';
    size_t wl = strlen(want);
    int seals = fcntl(fd, F_GET_SEALS);
    struct stat st;
    int code = PS_RPC_FAILED_PRECONDITION;
    if (gl <= 0 || strncmp(got, want, wl) != 0 ||
        (got[wl] != '\0' && strcmp(got + wl, " (deleted)") != 0)) {
        snprintf(err, errlen, "shared memory '%s': not the memfd named", name);
    } else if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        snprintf(err, errlen, "shared memory '%s': its size is not sealed against "
                 "shrinking (F_SEAL_SHRINK)", name);
    } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        snprintf(err, errlen, "shared memory '%s': empty", name);
    } else {
        void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                          fd, 0);
        if (base == MAP_FAILED) {
            snprintf(err, errlen, "shared memory '%s': cannot map %lld bytes: %s",
                     name, (long long)st.st_size, strerror(errno));
        } else {
            snprintf(out->name, sizeof out->name, "%s", name);
            out->base = base;
            out->size = (size_t)st.st_size;
            code = 0;
        }
    }
    close(fd);
    return code;
}

/* Whether who may name ref: it came over the unix socket, from the process
 * the name carries. Returns 0, or a ps_rpc_code with err. */
static int may_name(const ps_rpc_peer_cred *who, const psd_shm_ref *ref, char *err,
                    size_t errlen)
{
    char path[64], want[64];
    int pid;
    if (ps_shm_parse_name(ref->name, path, sizeof path, want, sizeof want, &pid) != 0) {
        snprintf(err, errlen, "shared memory name '%s' is not "
                 "memfd:PID:FD:ps-<16 hex digits>", ref->name);
        return PS_RPC_INVALID_ARGUMENT;
    }
    if (who == NULL) {
        snprintf(err, errlen, "shared memory is accepted only over psd's unix "
                 "socket (--local-socket), where the kernel names the caller; "
                 "this call came over TCP: send the tensor inline");
        return PS_RPC_FAILED_PRECONDITION;
    }
    if ((pid_t)pid != who->pid) {
        snprintf(err, errlen, "shared memory '%s' is process %d's; this call "
                 "comes from process %d, and a process may share only its own "
                 "memory", ref->name, pid, (int)who->pid);
        return PS_RPC_PERMISSION_DENIED;
    }
    return 0;
}

int psd_shmmap_get(psd_shmmap *m, const ps_rpc_peer_cred *who,
                   const psd_shm_ref *ref, void **p, char *err, size_t errlen)
{
    if (ref->name_len >= PS_SHM_NAME_MAX) {
        snprintf(err, errlen, "shared memory name of %zu bytes is too long "
                 "(at most %d)", ref->name_len, PS_SHM_NAME_MAX - 1);
        return PS_RPC_INVALID_ARGUMENT;
    }
    if (ref->offset % 4 != 0) {
        snprintf(err, errlen, "shared memory '%s': offset %llu is not a multiple "
                 "of 4", ref->name, (unsigned long long)ref->offset);
        return PS_RPC_INVALID_ARGUMENT;
    }
    int code = may_name(who, ref, err, errlen);
    if (code != 0)
        return code;
    pthread_mutex_lock(&m->mu);
    struct region *r = NULL;
    for (size_t i = 0; i < m->n && r == NULL; i++)
        if (strcmp(m->r[i].name, ref->name) == 0 && m->r[i].pid == who->pid &&
            m->r[i].start == who->start)
            r = &m->r[i];
    if (r == NULL) {
        struct region nr;
        if (m->n == MAX_REGIONS) {
            snprintf(err, errlen, "shared memory: %d regions are mapped already",
                     MAX_REGIONS);
            code = PS_RPC_RESOURCE_EXHAUSTED;
        } else if ((code = map_region(ref->name, &nr, err, errlen)) == 0) {
            struct region *g = realloc(m->r, (m->n + 1) * sizeof *g);
            if (g == NULL) {
                munmap(nr.base, nr.size);
                snprintf(err, errlen, "shared memory: out of memory");
                code = PS_RPC_RESOURCE_EXHAUSTED;
            } else {
                m->r = g;
                r = &m->r[m->n++];
                *r = nr;
                r->pid = who->pid;
                r->start = who->start;
            }
        }
    }
    if (r != NULL) {
        if (ref->offset > r->size || ref->length > r->size - ref->offset) {
            snprintf(err, errlen, "shared memory '%s': offset %llu + length %llu "
                     "is past its end (%zu bytes)", ref->name,
                     (unsigned long long)ref->offset,
                     (unsigned long long)ref->length, r->size);
            code = PS_RPC_INVALID_ARGUMENT;
        } else {
            *p = (uint8_t *)r->base + ref->offset;
            __atomic_store_n(&r->last_used_ms, ps_now_ms(), __ATOMIC_RELAXED);
        }
    }
    pthread_mutex_unlock(&m->mu);
    return code;
}

size_t psd_shmmap_sweep(psd_shmmap *m, int64_t idle_ms)
{
    int64_t now = ps_now_ms();
    /* Never waits for callers: the sweeper has other work; next time. */
    if (pthread_rwlock_trywrlock(&m->use) != 0)
        return psd_shmmap_count(m);
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n;) {
        if (now - __atomic_load_n(&m->r[i].last_used_ms, __ATOMIC_RELAXED) >= idle_ms) {
            munmap(m->r[i].base, m->r[i].size);
            m->r[i] = m->r[--m->n];
        } else {
            i++;
        }
    }
    size_t left = m->n;
    pthread_mutex_unlock(&m->mu);
    pthread_rwlock_unlock(&m->use);
    return left;
}

size_t psd_shmmap_count(psd_shmmap *m)
{
    pthread_mutex_lock(&m->mu);
    size_t n = m->n;
    pthread_mutex_unlock(&m->mu);
    return n;
}
