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
 * Threads and lifetime: the threads live for one call and are joined
 * before sparse_prefetch returns; they touch only LMDB's map and their own
 * slice of a private copy of the ids.
 */
#include "server/sparse.h"

#include "server/store.h"

#include <pthread.h>
#include <stdlib.h>

#define PREFETCH_THREADS 32
#define PREFETCH_MIN_PER_THREAD 16

struct pf_job {
    psd_store *store;
    uint32_t var_id;
    const int64_t *ids;
    size_t n, stride, first;
    volatile uint8_t sink;
};

static void *pf_main(void *arg)
{
    struct pf_job *j = arg;
    psd_store_rtxn *rt = NULL;
    if (psd_store_rbegin(j->store, &rt) != 0)
        return NULL;
    uint8_t x = 0;
    for (size_t i = j->first; i < j->n; i += j->stride) {
        const void *d;
        size_t len;
        if (psd_store_row_get(rt, j->var_id, j->ids[i], &d, &len) == 0 && len > 0)
            x ^= ((const volatile uint8_t *)d)[len - 1];
    }
    j->sink = x;
    psd_store_rend(rt);
    return NULL;
}

/* Whether the shard's file is larger than half the memory it plans for. */
static bool larger_than_memory(psd_shard *s)
{
    uint64_t lim = s->o.memory_limit;
    return lim > 0 && psd_store_disk_bytes(s->store) > lim / 2;
}

/* Reads rows ids[0..n) of table var_id from up to PREFETCH_THREADS
 * threads. */
static void fault_in(psd_shard *s, uint32_t var_id, const int64_t *ids, size_t n)
{
    size_t nt = n / PREFETCH_MIN_PER_THREAD;
    nt = nt > PREFETCH_THREADS ? PREFETCH_THREADS : nt;
    struct pf_job jobs[PREFETCH_THREADS];
    pthread_t th[PREFETCH_THREADS];
    bool started[PREFETCH_THREADS] = {false};
    for (size_t k = 0; k < nt; k++) {
        jobs[k] = (struct pf_job){.store = s->store, .var_id = var_id, .ids = ids, .n = n,
                                  .stride = nt, .first = k};
        started[k] = pthread_create(&th[k], NULL, pf_main, &jobs[k]) == 0;
    }
    for (size_t k = 0; k < nt; k++)
        if (started[k])
            pthread_join(th[k], NULL);
}

void sparse_prefetch_rows(psd_shard *s, uint32_t var_id, const int64_t *ids, size_t n)
{
    if (n >= 2 * PREFETCH_MIN_PER_THREAD && larger_than_memory(s))
        fault_in(s, var_id, ids, n);
}

void sparse_prefetch(psd_shard *s, struct psd_sparse *t, const int64_t *ids, size_t n)
{
    if (n < 2 * PREFETCH_MIN_PER_THREAD || !larger_than_memory(s))
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
    if (m >= 2 * PREFETCH_MIN_PER_THREAD)
        fault_in(s, var_id, miss, m);
    free(miss);
}
