/*
 * sparse_prefetch.c - faults in, from several threads at once, the LMDB
 * pages of rows a call is about to read, when the table is larger than the
 * memory psd plans for (see sparse.h).
 *
 * Rows outside the RAM tier are read through LMDB's map; when the file is
 * larger than memory most of them are not resident and each read is a
 * major fault that waits for the disk, one after another (queue depth 1).
 * Reading the same rows first from PREFETCH_THREADS threads, each in its
 * own read transaction, keeps that many faults in flight; the call's own
 * pass under the table's mutex then finds the pages resident. It is only
 * a hint: what it reads is thrown away, and a page reclaimed in between
 * is simply read again.
 *
 * Threads and lifetime: a pool of PREFETCH_THREADS threads, started on
 * first need and kept for the process (starting 32 threads a call cost
 * ~1 ms of a ~10 ms call, and the last of them to finish its fixed share
 * set the call's end). A call queues one job and reads in it too; every
 * thread takes the job's next id until none is left, so no thread waits
 * on a slower one's share; the call returns once no thread is inside its
 * job. Each thread opens its own read transaction per job, touches only
 * LMDB's map and the job's ids, and keeps a 256 KiB stack (mdb_get's
 * cursor is its largest frame) instead of glibc's 8 MiB.
 */
#include "server/sparse.h"

#include "server/store.h"
#include "common/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Faults in flight: 32 threads gave the disk behind this VM ~120k random
 * 4 KiB reads/s through a mapped file in a 220 MiB memory cgroup, 64
 * ~140k, 8 ~50k (one thread ~11k). */
#define PREFETCH_THREADS 48
#define PREFETCH_STACK (256 << 10)
#define PREFETCH_MIN 32 /* fewer ids are read in the call's own pass */

struct pf_job {
    psd_store *store;
    uint32_t var_id;
    const int64_t *ids;
    size_t n;
    atomic_size_t next; /* the next index to read */
    int busy;           /* pool threads inside the job (g_pool.mu) */
    struct pf_job *link;
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    struct pf_job *jobs; /* queued, ids may be left */
    int threads;         /* started; -1 when starting failed */
} g_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
            NULL, 0};

static volatile uint8_t g_sink;

/* Reads the job's rows until none is left. */
static void pf_read(struct pf_job *j)
{
    if (atomic_load(&j->next) >= j->n)
        return;
    psd_store_rtxn *rt = NULL;
    if (psd_store_rbegin(j->store, &rt) != 0)
        return;
    uint8_t x = 0;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
        const void *d;
        size_t len;
        if (psd_store_row_get(rt, j->var_id, j->ids[i], &d, &len) == 0 && len > 0)
            x ^= ((const volatile uint8_t *)d)[len - 1];
    }
    g_sink = x;
    psd_store_rend(rt);
}

/* Takes j off the queue if it is on it. g_pool.mu held. */
static void unqueue(struct pf_job *j)
{
    for (struct pf_job **l = &g_pool.jobs; *l != NULL; l = &(*l)->link)
        if (*l == j) {
            *l = j->link;
            return;
        }
}

static void *pf_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "psd-prefetch");
    pthread_mutex_lock(&g_pool.mu);
    for (;;) {
        while (g_pool.jobs == NULL)
            pthread_cond_wait(&g_pool.work, &g_pool.mu);
        struct pf_job *j = g_pool.jobs;
        j->busy++;
        pthread_mutex_unlock(&g_pool.mu);
        pf_read(j);
        pthread_mutex_lock(&g_pool.mu);
        unqueue(j); /* nothing left in it */
        if (--j->busy == 0)
            pthread_cond_broadcast(&g_pool.idle);
    }
    return NULL;
}

/* Starts the pool once. g_pool.mu held. Returns whether it runs. */
static bool pool_start(void)
{
    if (g_pool.threads != 0)
        return g_pool.threads > 0;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, PREFETCH_STACK);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    for (int k = 0; k < PREFETCH_THREADS; k++) {
        pthread_t th;
        if (pthread_create(&th, &a, pf_main, NULL) != 0)
            break;
        g_pool.threads++;
    }
    pthread_attr_destroy(&a);
    if (g_pool.threads == 0) {
        g_pool.threads = -1;
        ps_log_warn("sparse prefetch: no thread could start; rows outside the RAM tier "
                    "are read one at a time");
    }
    return g_pool.threads > 0;
}

/* Whether the shard's file is larger than half the memory it plans for. */
static bool larger_than_memory(psd_shard *s)
{
    uint64_t lim = s->o.memory_limit;
    return lim > 0 && psd_store_disk_bytes(s->store) > lim / 2;
}

/* Reads rows ids[0..n) of table var_id from the pool's threads and this
 * one. */
static void fault_in(psd_shard *s, uint32_t var_id, const int64_t *ids, size_t n)
{
    struct pf_job j = {.store = s->store, .var_id = var_id, .ids = ids, .n = n};
    atomic_init(&j.next, 0);
    pthread_mutex_lock(&g_pool.mu);
    bool pool = pool_start();
    if (pool) {
        struct pf_job **l = &g_pool.jobs;
        while (*l != NULL)
            l = &(*l)->link;
        *l = &j;
        pthread_cond_broadcast(&g_pool.work);
    }
    pthread_mutex_unlock(&g_pool.mu);
    if (!pool)
        return; /* the call's own pass reads them */
    pf_read(&j);
    pthread_mutex_lock(&g_pool.mu);
    unqueue(&j);
    while (j.busy > 0)
        pthread_cond_wait(&g_pool.idle, &g_pool.mu);
    pthread_mutex_unlock(&g_pool.mu);
}

void sparse_prefetch_rows(psd_shard *s, uint32_t var_id, const int64_t *ids, size_t n)
{
    if (n >= PREFETCH_MIN && larger_than_memory(s))
        fault_in(s, var_id, ids, n);
}

void sparse_prefetch(psd_shard *s, struct psd_sparse *t, const int64_t *ids, size_t n)
{
    if (n < PREFETCH_MIN || !larger_than_memory(s))
        return;
    int64_t *miss = malloc(n * sizeof *miss);
    if (miss == NULL)
        return;
    size_t m = 0;
    sparse_lock(t);
    uint32_t var_id = t->var_id;
    bool ready = t->ready;
    for (size_t i = 0; ready && i < n; i++) /* a row never stored has no page */
        if (sparse_find(t, ids[i]) == NULL && sparse_maybe_stored(t, ids[i]))
            miss[m++] = ids[i];
    pthread_mutex_unlock(&t->mu);
    if (m >= PREFETCH_MIN)
        fault_in(s, var_id, miss, m);
    free(miss);
}
