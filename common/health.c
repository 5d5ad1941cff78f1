/*
 * health.c - the grpc.health.v1 status table and its watchers. See
 * health.h; rpc_server.c answers the calls with what this decides.
 */
#include "common/health.h"

#include "common/errors.h"
#include "proto/health.pb-c.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef Grpc__Health__V1__HealthCheckResponse__ServingStatus status_t;
#define ST(x) GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__##x

struct entry {
    char *service;
    bool serving;
};

struct watcher {
    struct watcher *next;
    void *who;
    char *service;
};

struct ps_health {
    pthread_mutex_t mu;
    ps_health_send_fn send;
    struct entry *entries;
    int n;
    struct watcher *watchers;
    bool shut; /* ps_health_shutdown ran: everything NOT_SERVING */
};

int ps_health_create(ps_health_send_fn send, ps_health **out)
{
    ps_health *h = calloc(1, sizeof *h);
    if (h == NULL)
        return -ENOMEM;
    pthread_mutex_init(&h->mu, NULL);
    h->send = send;
    *out = h;
    return 0;
}

void ps_health_destroy(ps_health *h)
{
    if (h == NULL)
        return;
    for (int i = 0; i < h->n; i++)
        free(h->entries[i].service);
    free(h->entries);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

static struct entry *find_locked(ps_health *h, const char *svc)
{
    for (int i = 0; i < h->n; i++)
        if (strcmp(h->entries[i].service, svc) == 0)
            return &h->entries[i];
    return NULL;
}

static int add_locked(ps_health *h, const char *svc)
{
    if (find_locked(h, svc) != NULL)
        return 0;
    struct entry *e = realloc(h->entries, sizeof *e * (size_t)(h->n + 1));
    if (e == NULL)
        return -ENOMEM;
    h->entries = e;
    e[h->n].service = strdup(svc);
    e[h->n].serving = false;
    if (e[h->n].service == NULL)
        return -ENOMEM;
    h->n++;
    return 0;
}

int ps_health_add(ps_health *h, const char *service)
{
    pthread_mutex_lock(&h->mu);
    int rc = add_locked(h, service);
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* What Check (watch false) or Watch (true) reports for svc. */
static status_t status_locked(ps_health *h, const char *svc, bool watch)
{
    struct entry *e = find_locked(h, svc);
    if (e == NULL)
        return watch ? ST(SERVICE_UNKNOWN) : ST(UNKNOWN);
    return e->serving && !h->shut ? ST(SERVING) : ST(NOT_SERVING);
}

static size_t encode(status_t st, uint8_t out[PS_HEALTH_RESPONSE_MAX])
{
    Grpc__Health__V1__HealthCheckResponse resp =
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = st;
    return grpc__health__v1__health_check_response__pack(&resp, out);
}

static void send_status(ps_health *h, void *who, status_t st)
{
    uint8_t msg[PS_HEALTH_RESPONSE_MAX];
    size_t len = encode(st, msg);
    h->send(who, msg, len);
}

void ps_health_set(ps_health *h, const char *service, bool serving)
{
    pthread_mutex_lock(&h->mu);
    struct entry *e = find_locked(h, service);
    if (e == NULL && add_locked(h, service) == 0)
        e = find_locked(h, service);
    if (e != NULL && e->serving != serving) {
        e->serving = serving;
        for (struct watcher *w = h->watchers; w != NULL; w = w->next)
            if (strcmp(w->service, service) == 0)
                send_status(h, w->who, status_locked(h, service, true));
    }
    pthread_mutex_unlock(&h->mu);
}

void ps_health_set_all(ps_health *h, bool serving)
{
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < h->n; i++)
        h->entries[i].serving = serving;
    pthread_mutex_unlock(&h->mu);
}

/* The service a request names, malloc'd; NULL with err set otherwise. */
static char *parse_request(const uint8_t *req, size_t len, int *rc, char *err,
                           size_t errlen)
{
    Grpc__Health__V1__HealthCheckRequest *r =
        grpc__health__v1__health_check_request__unpack(NULL, len, req);
    if (r == NULL) {
        *rc = ps_errf(PS_EPARSE, err, errlen,
                      "HealthCheckRequest: %zu bytes that do not parse", len);
        return NULL;
    }
    char *svc = strdup(r->service);
    grpc__health__v1__health_check_request__free_unpacked(r, NULL);
    if (svc == NULL)
        *rc = ps_errf(-ENOMEM, err, errlen, "out of memory");
    return svc;
}

int ps_health_check(ps_health *h, const uint8_t *req, size_t len,
                    uint8_t out[PS_HEALTH_RESPONSE_MAX], size_t *outlen,
                    char *err, size_t errlen)
{
    int rc = 0;
    char *svc = parse_request(req, len, &rc, err, errlen);
    if (svc == NULL)
        return rc;
    pthread_mutex_lock(&h->mu);
    bool known = find_locked(h, svc) != NULL;
    status_t st = status_locked(h, svc, false);
    pthread_mutex_unlock(&h->mu);
    if (known)
        *outlen = encode(st, out);
    else
        rc = ps_errf(PS_ENOTFOUND, err, errlen, "unknown service '%s'", svc);
    free(svc);
    return rc;
}

int ps_health_watch(ps_health *h, void *who, const uint8_t *req, size_t len,
                    char *err, size_t errlen)
{
    int rc = 0;
    char *svc = parse_request(req, len, &rc, err, errlen);
    if (svc == NULL)
        return rc;
    struct watcher *w = malloc(sizeof *w);
    if (w == NULL) {
        free(svc);
        return ps_errf(-ENOMEM, err, errlen, "out of memory");
    }
    w->who = who;
    w->service = svc;
    pthread_mutex_lock(&h->mu);
    send_status(h, who, status_locked(h, svc, true));
    if (h->shut) {
        pthread_mutex_unlock(&h->mu);
        free(w->service);
        free(w);
        return ps_errf(PS_ESHUTDOWN, err, errlen, "server is shutting down");
    }
    w->next = h->watchers;
    h->watchers = w;
    pthread_mutex_unlock(&h->mu);
    return 0;
}

bool ps_health_unwatch(ps_health *h, void *who)
{
    struct watcher *found = NULL;
    pthread_mutex_lock(&h->mu);
    for (struct watcher **p = &h->watchers; *p != NULL; p = &(*p)->next) {
        if ((*p)->who == who) {
            found = *p;
            *p = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&h->mu);
    if (found == NULL)
        return false;
    free(found->service);
    free(found);
    return true;
}

void ps_health_shutdown(ps_health *h, void (*end)(void *watcher, void *ctx),
                        void *ctx)
{
    pthread_mutex_lock(&h->mu);
    h->shut = true;
    struct watcher *w = h->watchers;
    h->watchers = NULL;
    for (struct watcher *x = w; x != NULL; x = x->next)
        send_status(h, x->who, ST(NOT_SERVING));
    pthread_mutex_unlock(&h->mu);
    while (w != NULL) {
        struct watcher *next = w->next;
        end(w->who, ctx);
        free(w->service);
        free(w);
        w = next;
    }
}
