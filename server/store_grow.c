/*
 * store_grow.c - the growth of the store's LMDB map (store.h's
 * psd_store_grow): a full map doubles, up to --map-size-max or the disk.
 * Part of psd_store_lib, compiled with -DPS_OWNS_LMDB.
 *
 * Threads and lifetime: as store.h; a growth takes the store's gate for
 * writing (store_internal.h), so it waits until no transaction is open.
 */
#include "server/store_internal.h"

#include "common/errors.h"
#include "common/log.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

void psd_store_set_map_max(psd_store *s, uint64_t max)
{
    if (s)
        s->map_max = max;
}

/* The most the map may grow to: the cap given, else the file as it is
 * plus the free space of its file system (a bigger map could never be
 * filled). 0 when the disk cannot be asked. */
static uint64_t growth_cap(psd_store *s, char *why, size_t why_len)
{
    if (s->map_max > 0) {
        snprintf(why, why_len, "--map-size-max %llu MiB",
                 (unsigned long long)(s->map_max >> 20));
        return s->map_max;
    }
    struct statvfs fs;
    struct stat st;
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s/data.mdb", s->dir);
    if (statvfs(s->dir, &fs) != 0 || stat(file, &st) != 0)
        return 0;
    uint64_t free_b = (uint64_t)fs.f_bavail * fs.f_frsize;
    snprintf(why, why_len, "the disk of %s (%llu MiB free)", s->dir,
             (unsigned long long)(free_b >> 20));
    return (uint64_t)st.st_size + free_b;
}

uint64_t psd_store_room(psd_store *s)
{
    char why[PATH_MAX + 64];
    uint64_t cap = growth_cap(s, why, sizeof why), used = psd_store_disk_bytes(s);
    if (cap == 0)
        return UINT64_MAX; /* the disk cannot be asked */
    return cap > used ? cap - used : 0;
}

bool store_disk_full(psd_store *s)
{
    struct statvfs fs;
    if (statvfs(s->dir, &fs) != 0)
        return false;
    if ((uint64_t)fs.f_bavail * fs.f_frsize >= ((uint64_t)1 << 20))
        return false;
    __atomic_store_n(&s->full_reason, 2, __ATOMIC_RELAXED);
    return true;
}

int psd_store_grow(psd_store *s)
{
    if (!s || (s->flags & PSD_STORE_RDONLY))
        return PS_EFULL;
    if (!__atomic_exchange_n(&s->map_full, 0, __ATOMIC_RELAXED)) {
        __atomic_store_n(&s->full_reason, 2, __ATOMIC_RELAXED); /* ENOSPC... */
        return PS_EFULL;
    }
    char why[PATH_MAX + 64] = "unknown (the disk cannot be asked)";
    uint64_t cap = growth_cap(s, why, sizeof why);
    pthread_rwlock_wrlock(&s->gate);
    uint64_t now = s->map_size, want = now * 2;
    long page = sysconf(_SC_PAGESIZE);
    if (want > cap)
        want = cap / (uint64_t)page * (uint64_t)page;
    int rc = PS_EFULL;
    if (want <= now || want > SIZE_MAX) {
        if (!s->cap_logged) /* once: the flusher tries again every period */
            ps_log_error("store %s: the map (%llu MiB) is full and cannot grow: its cap is %s",
                     s->dir, (unsigned long long)(now >> 20), why);
        s->cap_logged = true;
        __atomic_store_n(&s->full_reason, s->map_max > 0 ? 1 : 2, __ATOMIC_RELAXED);
    } else {
        int mrc = mdb_env_set_mapsize(s->env, (size_t)want);
        if (mrc == 0) {
            s->map_size = want;
            s->cap_logged = false;
            rc = 0;
            ps_log_info("store %s: the map grew from %llu to %llu MiB", s->dir,
                        (unsigned long long)(now >> 20), (unsigned long long)(want >> 20));
        } else {
            ps_log_error("store %s: growing the map to %llu MiB: %s", s->dir,
                         (unsigned long long)(want >> 20), mdb_strerror(mrc));
            mdb_env_set_mapsize(s->env, (size_t)now);
        }
    }
    pthread_rwlock_unlock(&s->gate);
    return rc;
}

const char *psd_store_full_reason(psd_store *s)
{
    switch (s ? __atomic_load_n(&s->full_reason, __ATOMIC_RELAXED) : 0) {
    case 1:
        return "the LMDB map is at --map-size-max";
    case 2:
        return "the disk is full";
    default:
        return "the LMDB map is full";
    }
}

uint64_t psd_store_map_size(psd_store *s)
{
    pthread_rwlock_rdlock(&s->gate);
    uint64_t n = s->map_size;
    pthread_rwlock_unlock(&s->gate);
    return n;
}
