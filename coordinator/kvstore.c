/*
 * kvstore.c - the rendezvous key/value store and the all-reduce generations
 * (kvstore.h).
 */
#include "coordinator/kvstore.h"

#include "common/auth.h"
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
#define KV_MAX_BYTES (32u << 20) /* keys and values in all */
#define KV_GENS 3                /* the generations whose keys are kept */

/* One generation's members: rank r is worker m[r]. */
struct gen_members {
    uint64_t gen; /* 0: none */
    uint32_t *m;
    size_t n;
};

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
    struct gen_members hist[KV_GENS]; /* the newest first */
    size_t bytes;                     /* of every key and value held */
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

/* Sets key (mu held). Returns 0, -ENOMEM, -ENOSPC (KV_MAX_KEYS) or -E2BIG
 * (KV_MAX_BYTES). */
static int put_locked(coord_kv *kv, const char *key, const void *val, size_t len)
{
    struct entry *e = find(kv, key);
    size_t was = e != NULL ? e->len : 0, klen = e != NULL ? 0 : strlen(key);
    if (kv->bytes - was + len + klen > KV_MAX_BYTES)
        return -E2BIG;
    if (e == NULL && kv->n == KV_MAX_KEYS)
        return -ENOSPC;
    uint8_t *copy = malloc(len > 0 ? len : 1);
    if (copy == NULL)
        return -ENOMEM;
    memcpy(copy, val, len);
    if (e != NULL) {
        free(e->val);
        e->val = copy;
        e->len = len;
        kv->bytes = kv->bytes - was + len;
        return 0;
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
    kv->bytes += klen + len;
    return 0;
}

/* Drops the keys of generations below `below` (mu held). */
static void drop_old_locked(coord_kv *kv, uint64_t below)
{
    for (size_t i = 0; i < kv->n;) {
        unsigned long long g;
        if (sscanf(kv->e[i].key, "gen/%llu/", &g) == 1 && g < below) {
            kv->bytes -= strlen(kv->e[i].key) + kv->e[i].len;
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
    uint32_t *copy = malloc((n > 0 ? n : 1) * sizeof *copy);
    free(kv->hist[KV_GENS - 1].m);
    memmove(kv->hist + 1, kv->hist, (KV_GENS - 1) * sizeof *kv->hist);
    kv->hist[0] = (struct gen_members){.gen = kv->gen, .m = copy, .n = copy ? n : 0};
    if (copy != NULL)
        memcpy(copy, m, n * sizeof *copy);
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
    for (int i = 0; i < KV_GENS; i++)
        free(kv->hist[i].m);
    pthread_mutex_destroy(&kv->mu);
    pthread_cond_destroy(&kv->cond);
    free(kv);
}

static bool key_ok(const char *k)
{
    size_t l = strlen(k);
    return l >= 1 && l <= KV_MAX_KEY;
}

/* A bare decimal (no sign, no space, no leading zero) at s, up to end (or
 * the NUL): its value, or -1. */
static int64_t decimal(const char *s, const char **end)
{
    const char *p = s;
    int64_t v = 0;
    while (*p >= '0' && *p <= '9' && p - s < 18) /* 18 digits fit */
        v = v * 10 + (*p++ - '0');
    if (p == s || (s[0] == '0' && p - s > 1) || (*p >= '0' && *p <= '9'))
        return -1;
    if (end != NULL)
        *end = p;
    else if (*p != '\0')
        return -1;
    return v;
}

/* A key "gen/<G>/<rest>": G and rest, or false. */
static bool gen_key(const char *key, uint64_t *g, const char **rest)
{
    const char *p;
    if (strncmp(key, "gen/", 4) != 0)
        return false;
    int64_t v = decimal(key + 4, &p);
    if (v < 0 || *p != '/')
        return false;
    *g = (uint64_t)v;
    *rest = p + 1;
    return true;
}

/* The members of generation g if it is one of the last KV_GENS (mu held). */
static const struct gen_members *gen_of(const coord_kv *kv, uint64_t g)
{
    for (int i = 0; i < KV_GENS; i++)
        if (kv->hist[i].gen != 0 && kv->hist[i].gen == g)
            return &kv->hist[i];
    return NULL;
}

static bool member(const struct gen_members *gm, uint32_t w)
{
    for (size_t i = 0; i < gm->n; i++)
        if (gm->m[i] == w)
            return true;
    return false;
}

/* The rank a key of a generation belongs to: "<r>" and "rank_<r>" (Gloo's
 * connectFullMesh), the same under "sync/" (the second mesh of
 * worker/collective_gloo.cc), "nccl_id" (rank 0's), else -1. */
static int64_t rank_key(const char *rest)
{
    if (strcmp(rest, "nccl_id") == 0)
        return 0;
    if (strncmp(rest, "sync/", 5) == 0)
        rest += 5;
    if (strncmp(rest, "rank_", 5) == 0)
        rest += 5;
    return decimal(rest, NULL);
}

/* Whether worker w may set key (mu held): 0, or a gRPC code with msg set.
 * The rules are ps.proto's, above the Kv calls. */
static int may_set_locked(coord_kv *kv, uint32_t w, const char *key, char *msg,
                          size_t len)
{
    uint64_t g;
    const char *rest;
    if (strcmp(key, "started") == 0 || strcmp(key, "done") == 0)
        return 0;
    if (strncmp(key, "model/", 6) == 0) {
        if (decimal(key + 6, NULL) == (int64_t)w)
            return 0;
        snprintf(msg, len, "'%s' is not worker[%u]'s: a worker sets only its own "
                 "model/%u", key, w, w);
        return PS_RPC_PERMISSION_DENIED;
    }
    if (strcmp(key, "generation") == 0 ||
        (gen_key(key, &g, &rest) && strcmp(rest, "members") == 0)) {
        snprintf(msg, len, "'%s' is pscoord's to set, not a worker's", key);
        return PS_RPC_PERMISSION_DENIED;
    }
    if (!gen_key(key, &g, &rest)) {
        snprintf(msg, len, "'%s' is not a key of the rendezvous (model/<index>, "
                 "started, done, gen/<generation>/...)", key);
        return PS_RPC_PERMISSION_DENIED;
    }
    const struct gen_members *gm = gen_of(kv, g);
    if (gm == NULL) {
        snprintf(msg, len, "generation %" PRIu64 " is not one of the last %d "
                 "(the current one is %" PRIu64 ")", g, KV_GENS, kv->gen);
        return PS_RPC_FAILED_PRECONDITION;
    }
    if (strcmp(rest, "failed") == 0) {
        if (member(gm, w))
            return 0;
        snprintf(msg, len, "worker[%u] is not a member of generation %" PRIu64, w, g);
        return PS_RPC_PERMISSION_DENIED;
    }
    int64_t r = rank_key(rest);
    if (r < 0) {
        snprintf(msg, len, "'%s' is not a key of the rendezvous", key);
        return PS_RPC_PERMISSION_DENIED;
    }
    if ((uint64_t)r < gm->n && gm->m[r] == w)
        return 0;
    snprintf(msg, len, "'%s' is rank %" PRId64 "'s of generation %" PRIu64 ", and "
             "worker[%u] is %s", key, r, g, w,
             member(gm, w) ? "another rank" : "not a member");
    return PS_RPC_PERMISSION_DENIED;
}

/* Whether worker w may read key (mu held): a generation's rank keys and
 * NCCL id (its members' addresses) only by its members. */
static int may_get_locked(coord_kv *kv, uint32_t w, const char *key, char *msg,
                          size_t len)
{
    uint64_t g;
    const char *rest;
    if (!gen_key(key, &g, &rest) || strcmp(rest, "members") == 0 ||
        strcmp(rest, "failed") == 0 || rank_key(rest) < 0)
        return 0;
    const struct gen_members *gm = gen_of(kv, g);
    if (gm != NULL && member(gm, w))
        return 0;
    snprintf(msg, len, "'%s' is for the members of generation %" PRIu64 ", and "
             "worker[%u] is not one", key, g, w);
    return PS_RPC_PERMISSION_DENIED;
}

void coord_kv_on_set(coord_kv *kv, ps_rpc_call *call, const void *req)
{
    const Ps__V1__KvSetRequest *r = req;
    struct coord_status st;
    if (coord_check_job(kv->c, r->job_id, "KvSet", &st) != 0 ||
        (key_ok(r->key) && coord_check_worker(kv->c, r->index, r->task_secret, "KvSet",
                                              &st) != 0)) {
        ps_rpc_fail(call, (enum ps_rpc_code)st.code, "KvSet: %s", st.msg);
        return;
    }
    if (!key_ok(r->key)) {
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "KvSet: key of %zu bytes (1..%d)",
                    strlen(r->key), KV_MAX_KEY);
        return;
    }
    if (r->value.len > KV_MAX_VALUE) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "KvSet '%s': a value of %zu bytes "
                    "is past the cap of %u bytes per value", r->key, r->value.len,
                    KV_MAX_VALUE);
        return;
    }
    char msg[512];
    pthread_mutex_lock(&kv->mu);
    kv->active = true;
    int code = may_set_locked(kv, r->index, r->key, msg, sizeof msg);
    if (code != 0) {
        pthread_mutex_unlock(&kv->mu);
        ps_log_warn("KvSet by worker[%u] refused: %s", r->index, msg);
        ps_rpc_fail(call, (enum ps_rpc_code)code, "KvSet: %s", msg);
        return;
    }
    uint64_t g;
    const char *rest;
    if (gen_key(r->key, &g, &rest) && strcmp(rest, "failed") == 0 && g == kv->gen)
        kv->bump = true;
    int rc = put_locked(kv, r->key, r->value.data, r->value.len);
    Ps__V1__KvSetResponse resp = PS__V1__KV_SET_RESPONSE__INIT;
    resp.generation = kv->gen;
    if (rc == 0)
        serve_waits_locked(kv, ps_now_ms());
    pthread_cond_broadcast(&kv->cond);
    pthread_mutex_unlock(&kv->mu);
    if (rc == -ENOSPC)
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "KvSet '%s': the store holds %d "
                    "keys, its cap", r->key, KV_MAX_KEYS);
    else if (rc == -E2BIG)
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "KvSet '%s': the store would hold "
                    "more than its cap of %u bytes of keys and values", r->key,
                    KV_MAX_BYTES);
    else if (rc != 0)
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "KvSet: out of memory");
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
    bool op = ps_rpc_call_role(call) == PS_AUTH_OPERATOR;
    if (!op && coord_check_worker(kv->c, r->index, r->task_secret, "KvGet", &st) != 0) {
        ps_rpc_fail(call, (enum ps_rpc_code)st.code, "KvGet: %s", st.msg);
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
    char msg[512];
    for (size_t i = 0; !op && i < w->nkeys; i++) {
        int code = may_get_locked(kv, r->index, w->keys[i], msg, sizeof msg);
        if (code != 0) {
            pthread_mutex_unlock(&kv->mu);
            wait_free(w);
            ps_log_warn("KvGet by worker[%u] refused: %s", r->index, msg);
            ps_rpc_fail(call, (enum ps_rpc_code)code, "KvGet: %s", msg);
            return;
        }
    }
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
