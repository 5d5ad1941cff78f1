/*
 * kvstore.c - the rendezvous key/value store and the all-reduce generations
 * (kvstore.h).
 */
#include "coordinator/kvstore.h"

#include "common/clock.h"
#include "common/log.h"
#include "proto/ps.pb-c.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KV_TICK_MS 100
#define KV_MAX_KEYS 4096
#define KV_MAX_KEY 256
#define KV_MAX_VALUE (1u << 20)
#define KV_MAX_WAITS 1024
#define KV_MAX_GET_KEYS 64
#define KV_MAX_TIMEOUT_MS 600000u
#define KV_MAX_MEMBERS 4096

struct entry {
    char *key;
    uint8_t *val;
    size_t len;
};

struct wait {
    ps_rpc_call *call;
    char **keys;
    size_t nkeys;
    int64_t deadline_ms;
    struct wait *next;
};

struct coord_kv {
    coord *c;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    struct entry *e;
    size_t n;
    struct wait *waits;
    int nwaits;
    bool active;          /* a worker used the store: track generations */
    bool bump;            /* a member reported the current one failed */
    uint64_t gen;
    uint32_t *members;
    size_t nmembers;
    bool stop;
    pthread_t th;
};

static struct entry *find(coord_kv *kv, const char *key)
{
    for (size_t i = 0; i < kv->n; i++)
        if (strcmp(kv->e[i].key, key) == 0)
            return &kv->e[i];
    return NULL;
}

/* Sets key (mu held). Returns 0 or -ENOMEM / -ENOSPC. */
static int put_locked(coord_kv *kv, const char *key, const void *val, size_t len)
{
    uint8_t *copy = malloc(len > 0 ? len : 1);
    if (copy == NULL)
        return -ENOMEM;
    memcpy(copy, val, len);
    struct entry *e = find(kv, key);
    if (e != NULL) {
        free(e->val);
        e->val = copy;
        e->len = len;
        return 0;
    }
    if (kv->n == KV_MAX_KEYS) {
        free(copy);
        return -ENOSPC;
    }
    if ((kv->n & (kv->n - 1)) == 0 || kv->e == NULL) {
        struct entry *ne = realloc(kv->e, (kv->n ? kv->n * 2 : 16) * sizeof *ne);
        if (ne == NULL) {
            free(copy);
            return -ENOMEM;
        }
        kv->e = ne;
    }
    char *k = strdup(key);
    if (k == NULL) {
        free(copy);
        return -ENOMEM;
    }
    kv->e[kv->n++] = (struct entry){k, copy, len};
    return 0;
}

/* Drops the keys of generations below `below` (mu held). */
static void drop_old_locked(coord_kv *kv, uint64_t below)
{
    for (size_t i = 0; i < kv->n;) {
        unsigned long long g;
        if (sscanf(kv->e[i].key, "gen/%llu/", &g) == 1 && g < below) {
            free(kv->e[i].key);
            free(kv->e[i].val);
            kv->e[i] = kv->e[--kv->n];
        } else {
            i++;
        }
    }
}

/* Answers w if all its keys are set (mu held); whether it did. */
static bool try_answer_locked(coord_kv *kv, struct wait *w)
{
    for (size_t i = 0; i < w->nkeys; i++)
        if (find(kv, w->keys[i]) == NULL)
            return false;
    Ps__V1__KvGetResponse resp = PS__V1__KV_GET_RESPONSE__INIT;
    ProtobufCBinaryData *vals = calloc(w->nkeys, sizeof *vals);
    if (vals == NULL) {
        ps_rpc_fail(w->call, PS_RPC_RESOURCE_EXHAUSTED, "KvGet: out of memory");
        return true;
    }
    for (size_t i = 0; i < w->nkeys; i++) {
        struct entry *e = find(kv, w->keys[i]);
        vals[i].data = e->val;
        vals[i].len = e->len;
    }
    resp.values = vals;
    resp.n_values = w->nkeys;
    resp.generation = kv->gen;
    ps_rpc_reply_pb(w->call, &resp);
    free(vals);
    return true;
}

static void wait_free(struct wait *w)
{
    for (size_t i = 0; i < w->nkeys; i++)
        free(w->keys[i]);
    free(w->keys);
    free(w);
}

/* One pass over the waiting calls: answers the complete ones, fails the
 * expired and forgets the cancelled (mu held). */
static void serve_waits_locked(coord_kv *kv, int64_t now)
{
    for (struct wait **p = &kv->waits; *p != NULL;) {
        struct wait *w = *p;
        bool done = try_answer_locked(kv, w);
        if (!done && (now >= w->deadline_ms || ps_rpc_call_cancelled(w->call))) {
            char missing[512] = "";
            size_t used = 0;
            for (size_t i = 0; i < w->nkeys && used < sizeof missing - 1; i++)
                if (find(kv, w->keys[i]) == NULL)
                    used += (size_t)snprintf(missing + used, sizeof missing - used,
                                             "%s%s", used ? ", " : "", w->keys[i]);
            ps_rpc_fail(w->call, PS_RPC_DEADLINE_EXCEEDED,
                        "KvGet: not set within the timeout: %s", missing);
            done = true;
        }
        if (done) {
            *p = w->next;
            wait_free(w);
            kv->nwaits--;
        } else {
            p = &w->next;
        }
    }
}

/* The live workers, ascending; -ENOMEM. */
static int live_workers(coord *c, uint32_t **out, size_t *n)
{
    struct coord_cluster *snap = coord_snapshot(c);
    if (snap == NULL)
        return -ENOMEM;
    uint32_t *m = calloc((size_t)(snap->ntasks > 0 ? snap->ntasks : 1), sizeof *m);
    *n = 0;
    for (int i = 0; m != NULL && i < snap->ntasks; i++)
        if (snap->tasks[i].role == PS_ROLE_WORKER && snap->tasks[i].alive &&
            *n < KV_MAX_MEMBERS)
            m[(*n)++] = snap->tasks[i].index;
    coord_cluster_free(snap);
    if (m == NULL)
        return -ENOMEM;
    /* tasks come by (role, index): already ascending */
    *out = m;
    return 0;
}

/* Starts a new generation if the live workers changed or one was reported
 * failed (mu held; the snapshot is taken with it released). */
static void tick_generation(coord_kv *kv)
{
    if (!kv->active)
        return;
    pthread_mutex_unlock(&kv->mu);
    uint32_t *m = NULL;
    size_t n = 0;
    int rc = live_workers(kv->c, &m, &n);
    pthread_mutex_lock(&kv->mu);
    if (rc != 0)
        return;
    bool same = n == kv->nmembers &&
                (n == 0 || memcmp(m, kv->members, n * sizeof *m) == 0);
    if ((same && !kv->bump) || n == 0) {
        free(m);
        return;
    }
    kv->bump = false;
    free(kv->members);
    kv->members = m;
    kv->nmembers = n;
    /* The first generation is numbered from the clock (milliseconds since
     * 1970), so that a restarted pscoord, which has lost the store, still
     * numbers above every generation its workers have seen. */
    if (kv->gen == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        kv->gen = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    }
    kv->gen++;
    char list[KV_MAX_MEMBERS * 11 + 1], key[64], val[32];
    size_t used = 0;
    list[0] = '\0';
    for (size_t i = 0; i < n; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%" PRIu32,
                                 i ? "," : "", m[i]);
    snprintf(key, sizeof key, "gen/%" PRIu64 "/members", kv->gen);
    snprintf(val, sizeof val, "%" PRIu64, kv->gen);
    if (kv->gen >= 2)
        drop_old_locked(kv, kv->gen - 2);
    if (put_locked(kv, key, list, strlen(list)) != 0 ||
        put_locked(kv, "generation", val, strlen(val)) != 0)
        ps_log_warn("kv: cannot record generation %" PRIu64, kv->gen);
    ps_log_info("all-reduce generation %" PRIu64 ": workers %s", kv->gen, list);
}

static void *kv_main(void *arg)
{
    coord_kv *kv = arg;
    pthread_mutex_lock(&kv->mu);
    while (!kv->stop) {
        tick_generation(kv);
        serve_waits_locked(kv, ps_now_ms());
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += KV_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&kv->cond, &kv->mu, &ts);
    }
    pthread_mutex_unlock(&kv->mu);
    return NULL;
}

int coord_kv_create(coord *c, coord_kv **out)
{
    coord_kv *kv = calloc(1, sizeof *kv);
    if (kv == NULL)
        return -ENOMEM;
    kv->c = c;
    pthread_mutex_init(&kv->mu, NULL);
    pthread_cond_init(&kv->cond, NULL);
    int rc = pthread_create(&kv->th, NULL, kv_main, kv);
    if (rc != 0) {
        pthread_mutex_destroy(&kv->mu);
        pthread_cond_destroy(&kv->cond);
        free(kv);
        return -rc;
    }
    *out = kv;
    return 0;
}

void coord_kv_stop(coord_kv *kv)
{
    if (kv == NULL)
        return;
    pthread_mutex_lock(&kv->mu);
    kv->stop = true;
    while (kv->waits != NULL) {
        struct wait *w = kv->waits;
        kv->waits = w->next;
        ps_rpc_fail(w->call, PS_RPC_UNAVAILABLE, "the coordinator is shutting down");
        wait_free(w);
    }
    kv->nwaits = 0;
    pthread_cond_broadcast(&kv->cond);
    pthread_mutex_unlock(&kv->mu);
}

void coord_kv_destroy(coord_kv *kv)
{
    if (kv == NULL)
        return;
    coord_kv_stop(kv);
    pthread_join(kv->th, NULL);
    for (size_t i = 0; i < kv->n; i++) {
        free(kv->e[i].key);
        free(kv->e[i].val);
    }
    free(kv->e);
    free(kv->members);
    pthread_mutex_destroy(&kv->mu);
    pthread_cond_destroy(&kv->cond);
    free(kv);
}

static bool key_ok(const char *k)
{
    size_t l = strlen(k);
    return l >= 1 && l <= KV_MAX_KEY;
}

void coord_kv_on_set(coord_kv *kv, ps_rpc_call *call, const void *req)
{
    const Ps__V1__KvSetRequest *r = req;
    struct coord_status st;
    if (coord_check_job(kv->c, r->job_id, "KvSet", &st) != 0) {
        ps_rpc_fail(call, (enum ps_rpc_code)st.code, "%s", st.msg);
        return;
    }
    if (!key_ok(r->key) || r->value.len > KV_MAX_VALUE) {
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "KvSet: key of %zu bytes (1..%d) "
                    "or value of %zu bytes (at most %u)", strlen(r->key), KV_MAX_KEY,
                    r->value.len, KV_MAX_VALUE);
        return;
    }
    pthread_mutex_lock(&kv->mu);
    kv->active = true;
    unsigned long long g;
    char tail[16];
    if (sscanf(r->key, "gen/%llu/%15s", &g, tail) == 2 &&
        strcmp(tail, "failed") == 0 && g == kv->gen)
        kv->bump = true;
    int rc = put_locked(kv, r->key, r->value.data, r->value.len);
    Ps__V1__KvSetResponse resp = PS__V1__KV_SET_RESPONSE__INIT;
    resp.generation = kv->gen;
    if (rc == 0)
        serve_waits_locked(kv, ps_now_ms());
    pthread_cond_broadcast(&kv->cond);
    pthread_mutex_unlock(&kv->mu);
    if (rc != 0)
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "KvSet: %s",
                    rc == -ENOSPC ? "the store holds its 4096 keys" : "out of memory");
    else
        ps_rpc_reply_pb(call, &resp);
}

void coord_kv_on_get(coord_kv *kv, ps_rpc_call *call, const void *req)
{
    const Ps__V1__KvGetRequest *r = req;
    struct coord_status st;
    if (coord_check_job(kv->c, r->job_id, "KvGet", &st) != 0) {
        ps_rpc_fail(call, (enum ps_rpc_code)st.code, "%s", st.msg);
        return;
    }
    if (r->n_keys == 0 || r->n_keys > KV_MAX_GET_KEYS || r->timeout_ms > KV_MAX_TIMEOUT_MS) {
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "KvGet: %zu keys (1..%d), timeout "
                    "%u ms (at most %u)", r->n_keys, KV_MAX_GET_KEYS, r->timeout_ms,
                    KV_MAX_TIMEOUT_MS);
        return;
    }
    for (size_t i = 0; i < r->n_keys; i++)
        if (!key_ok(r->keys[i])) {
            ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "KvGet: key %zu has %zu bytes "
                        "(1..%d)", i, strlen(r->keys[i]), KV_MAX_KEY);
            return;
        }
    struct wait *w = calloc(1, sizeof *w);
    if (w != NULL && (w->keys = calloc(r->n_keys, sizeof *w->keys)) != NULL)
        for (size_t i = 0; i < r->n_keys; i++)
            if ((w->keys[w->nkeys] = strdup(r->keys[i])) != NULL)
                w->nkeys++;
    if (w == NULL || w->nkeys != r->n_keys) {
        if (w != NULL)
            wait_free(w);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "KvGet: out of memory");
        return;
    }
    w->call = call;
    w->deadline_ms = ps_now_ms() + r->timeout_ms;
    pthread_mutex_lock(&kv->mu);
    kv->active = true;
    if (try_answer_locked(kv, w)) {
        pthread_mutex_unlock(&kv->mu);
        wait_free(w);
        return;
    }
    if (r->timeout_ms == 0 || kv->nwaits >= KV_MAX_WAITS || kv->stop) {
        bool full = r->timeout_ms != 0;
        const char *missing = "";
        for (size_t i = 0; i < w->nkeys && missing[0] == '\0'; i++)
            if (find(kv, w->keys[i]) == NULL)
                missing = w->keys[i];
        if (kv->stop)
            ps_rpc_fail(call, PS_RPC_UNAVAILABLE, "the coordinator is shutting down");
        else if (full)
            ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "KvGet: %d calls wait already",
                        kv->nwaits);
        else
            ps_rpc_fail(call, PS_RPC_NOT_FOUND, "KvGet: '%s' is not set", missing);
        pthread_mutex_unlock(&kv->mu);
        wait_free(w);
        return;
    }
    w->next = kv->waits;
    kv->waits = w;
    kv->nwaits++;
    pthread_cond_broadcast(&kv->cond);
    pthread_mutex_unlock(&kv->mu);
}

uint64_t coord_kv_generation(coord_kv *kv, uint32_t **members, size_t *n)
{
    pthread_mutex_lock(&kv->mu);
    uint64_t g = kv->gen;
    if (members != NULL) {
        *n = 0;
        *members = malloc((kv->nmembers ? kv->nmembers : 1) * sizeof **members);
        if (*members != NULL) {
            memcpy(*members, kv->members, kv->nmembers * sizeof **members);
            *n = kv->nmembers;
        }
    }
    pthread_mutex_unlock(&kv->mu);
    return g;
}
