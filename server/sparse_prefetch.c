/*
 * sparse_prefetch.c - faults in, from several threads at once, the LMDB
 * pages of rows a call is about to read, when the table is larger than the
 * memory psd plans for (see sparse.h).
 *
 * Rows outside the RAM tier are read through LMDB's map; when the file is
 * larger than memory most of them are not resident and each read is a
 * major fault that waits for the disk, one after another (queue depth 1).
 * Reading the same rows first from SPARSE_PREFETCH_THREADS threads, each in its
 * own read transaction, keeps that many faults in flight; the call's own
 * pass under the table's mutex then finds the pages resident. It is only
 * a hint: what it reads is thrown away, and a page reclaimed in between
 * is simply read again.
 *
 * Threads and lifetime: a pool of SPARSE_PREFETCH_THREADS threads, the
 * tier's, started on first need and kept until psd_sparse_stop (starting 32 threads a call cost
 * ~1 ms of a ~10 ms call, and the last of them to finish its fixed share
 * set the call's end). A call queues one job and reads in it too; every
 * thread takes the job's next id until none is left, so no thread waits
 * on a slower one's share; the call returns once no thread is inside its
 * job. Each thread opens its own read transaction per job, touches only
 * LMDB's map and the job's ids, and keeps a 256 KiB stack (mdb_get's
 * cursor is its largest frame) instead of glibc's 8 MiB.
 */
#include "server/sparse_internal.h"

#include "common/log.h"

#include <stdlib.h>

/* Faults in flight: 32 threads gave the disk behind this VM ~120k random
 * 4 KiB reads/s through a mapped file in a 220 MiB memory cgroup, 64
 * ~140k, 8 ~50k (one thread ~11k). */
#define PREFETCH_STACK (256 << 10)
#define PREFETCH_MIN 32 /* fewer ids are read in the call's own pass */

struct sp_pf_job {
    psd_store *store;
    uint32_t var_id;
    const int64_t *ids;
    size_t n;
    atomic_size_t next; /* the next index to read */
    int busy;           /* pool threads inside the job (pool.mu) */
    struct sp_pf_job *link;
};


/* Reads the job's rows until none is left. */
static void pf_read(struct sp_pf_job *j)
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
    volatile uint8_t sink = x; /* the reads are kept */
    (void)sink;
    psd_store_rend(rt);
}

/* Takes j off the queue if it is on it. pool.mu held. */
static void unqueue(psd_sparse *sp, struct sp_pf_job *j)
{
    for (struct sp_pf_job **l = &sp->pool.jobs; *l != NULL; l = &(*l)->link)
        if (*l == j) {
            *l = j->link;
            return;
        }
}

static void *pf_main(void *arg)
{
    psd_sparse *sp = arg;
    pthread_setname_np(pthread_self(), "psd-prefetch");
    pthread_mutex_lock(&sp->pool.mu);
    for (;;) {
        while (sp->pool.jobs == NULL && !sp->pool.quit)
            pthread_cond_wait(&sp->pool.work, &sp->pool.mu);
        if (sp->pool.quit)
            break;
        struct sp_pf_job *j = sp->pool.jobs;
        j->busy++;
        pthread_mutex_unlock(&sp->pool.mu);
        pf_read(j);
        pthread_mutex_lock(&sp->pool.mu);
        unqueue(sp, j); /* nothing left in it */
        if (--j->busy == 0)
            pthread_cond_broadcast(&sp->pool.idle);
    }
    pthread_mutex_unlock(&sp->pool.mu);
    return NULL;
}

/* Starts the pool once. pool.mu held. Returns whether it runs. */
static bool pool_start(psd_sparse *sp)
{
    if (sp->pool.threads != 0 || sp->pool.quit)
        return sp->pool.threads > 0 && !sp->pool.quit;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, PREFETCH_STACK);
    for (int k = 0; k < SPARSE_PREFETCH_THREADS; k++) {
        if (pthread_create(&sp->pool.tid[k], &a, pf_main, sp) != 0)
            break;
        sp->pool.threads++;
    }
    pthread_attr_destroy(&a);
    if (sp->pool.threads == 0) {
        sp->pool.threads = -1;
        ps_log_warn("sparse prefetch: no thread could start; rows outside the RAM tier "
                    "are read one at a time");
    }
    return sp->pool.threads > 0;
}

/* Stops the pool's threads (no call is inside a job: the shard's calls
 * have ended, and the applier was stopped first). */
void sparse_pool_stop(psd_sparse *sp)
{
    pthread_mutex_lock(&sp->pool.mu);
    sp->pool.quit = true;
    pthread_cond_broadcast(&sp->pool.work);
    int n = sp->pool.threads;
    sp->pool.threads = n > 0 ? 0 : n;
    pthread_mutex_unlock(&sp->pool.mu);
    for (int k = 0; k < n; k++)
        pthread_join(sp->pool.tid[k], NULL);
}

/* Whether the shard's file is larger than half the memory it plans for. */
static bool larger_than_memory(psd_sparse *sp)
{
    uint64_t lim = sp->memory_limit;
    return lim > 0 && psd_store_disk_bytes(sp->store) > lim / 2;
}

/* Reads rows ids[0..n) of table var_id from the pool's threads and this
 * one. */
static void fault_in(psd_sparse *sp, uint32_t var_id, const int64_t *ids, size_t n)
{
    struct sp_pf_job j = {.store = sp->store, .var_id = var_id, .ids = ids, .n = n};
    atomic_init(&j.next, 0);
    pthread_mutex_lock(&sp->pool.mu);
    bool pool = pool_start(sp);
    if (pool) {
        struct sp_pf_job **l = &sp->pool.jobs;
        while (*l != NULL)
            l = &(*l)->link;
        *l = &j;
        pthread_cond_broadcast(&sp->pool.work);
    }
    pthread_mutex_unlock(&sp->pool.mu);
    if (!pool)
        return; /* the call's own pass reads them */
    pf_read(&j);
    pthread_mutex_lock(&sp->pool.mu);
    unqueue(sp, &j);
    while (j.busy > 0)
        pthread_cond_wait(&sp->pool.idle, &sp->pool.mu);
    pthread_mutex_unlock(&sp->pool.mu);
}

void sparse_prefetch_rows(psd_sparse *sp, uint32_t var_id, const int64_t *ids, size_t n)
{
    if (n >= PREFETCH_MIN && larger_than_memory(sp))
        fault_in(sp, var_id, ids, n);
}

void sparse_prefetch(psd_sparse *sp, psd_sparse_table *t, const int64_t *ids, size_t n)
{
    if (n < PREFETCH_MIN || !larger_than_memory(sp))
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
        fault_in(sp, var_id, miss, m);
    free(miss);
}
