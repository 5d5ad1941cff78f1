/*
 * redis_peer.c - bench/sparse's Redis peer (redis_peer.h); the one file
 * that includes hiredis.
 */
#include "bench/redis_peer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK 1024 /* keys per MGET / MSET in a pipeline */
#define KEY_LEN 9  /* 'v' or 'a', then the id's 8 bytes */

struct rpeer {
    pid_t pid;
    char dir[64]; /* its --dir with the append-only file, or "" */
    redisContext *c;
    long dim;
    /* Scratch for up to n keys of one call. */
    size_t cap;
    char *keys;       /* cap * 2 keys */
    const char **argv;
    size_t *argl;
    int64_t *uid;     /* distinct ids of a push */
    float *gsum;      /* their summed gradients */
    float *state;     /* value then accumulator of each distinct id */
    size_t *slot;     /* the distinct index of each request position */
};

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int grow(rpeer *r, size_t n)
{
    if (n <= r->cap)
        return 0;
    size_t d = (size_t)r->dim;
    free(r->keys), free(r->argv), free(r->argl), free(r->uid), free(r->gsum);
    free(r->state), free(r->slot);
    r->keys = malloc(2 * n * KEY_LEN);
    r->argv = malloc((2 * n + 1) * 2 * sizeof *r->argv);
    r->argl = malloc((2 * n + 1) * 2 * sizeof *r->argl);
    r->uid = malloc(n * sizeof *r->uid);
    r->gsum = malloc(n * d * sizeof *r->gsum);
    r->state = malloc(2 * n * d * sizeof *r->state);
    r->slot = malloc(n * sizeof *r->slot);
    r->cap = n;
    return r->keys && r->argv && r->argl && r->uid && r->gsum && r->state && r->slot ? 0 : -1;
}

static char *key(rpeer *r, size_t i, char kind, int64_t id)
{
    char *k = r->keys + i * KEY_LEN;
    k[0] = kind;
    memcpy(k + 1, &id, 8);
    return k;
}

int rpeer_start(const char *server, long dim, bool aof, rpeer **out)
{
    rpeer *r = calloc(1, sizeof *r);
    int port = free_port();
    if (r == NULL || port < 0)
        return free(r), -1;
    if (aof) {
        snprintf(r->dir, sizeof r->dir, "/tmp/bench-redis.XXXXXX");
        if (mkdtemp(r->dir) == NULL)
            return free(r), -1;
    }
    r->dim = dim;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    r->pid = fork();
    if (r->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        /* The stop signals bench/sparse blocks for its signal thread: a
         * mask survives exec, and redis must see SIGTERM. */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, 1), dup2(null, 2);
        if (aof)
            execlp(server ? server : "redis-server", "redis-server", "--port", ps, "--bind",
                   "127.0.0.1", "--save", "", "--appendonly", "yes", "--appendfsync",
                   "everysec", "--dir", r->dir, "--loglevel", "warning", (char *)NULL);
        else
            execlp(server ? server : "redis-server", "redis-server", "--port", ps, "--bind",
                   "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning",
                   (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) { /* up to 10 s */
        r->c = redisConnect("127.0.0.1", port);
        if (r->c && !r->c->err) {
            redisReply *rep = redisCommand(r->c, "PING");
            bool ok = rep && rep->type == REDIS_REPLY_STATUS;
            freeReplyObject(rep);
            if (ok) {
                *out = r;
                return 0;
            }
        }
        if (r->c)
            redisFree(r->c);
        r->c = NULL;
        if (waitpid(r->pid, NULL, WNOHANG) == r->pid)
            break;
        nanosleep(&(struct timespec){0, 50000000}, NULL);
    }
    fprintf(stderr, "sparse: redis-server did not start on 127.0.0.1:%d "
            "(apt-get install redis-server)\n", port);
    r->c = NULL;
    rpeer_stop(r);
    return -1;
}

pid_t rpeer_pid(const rpeer *r)
{
    return r->pid;
}

const char *rpeer_dir(const rpeer *r)
{
    return r->dir;
}

void rpeer_stop(rpeer *r)
{
    if (r == NULL)
        return;
    if (r->c)
        redisFree(r->c);
    if (r->pid > 0) {
        kill(r->pid, SIGTERM);
        waitpid(r->pid, NULL, 0);
    }
    if (r->dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "sparse: could not remove %s\n", r->dir);
    }
    free(r->keys), free(r->argv), free(r->argl), free(r->uid), free(r->gsum);
    free(r->state), free(r->slot);
    free(r);
}

/* MSETs keys [0, nk) with values vals (dim floats each), CHUNK at a time,
 * pipelined. */
static int mset(rpeer *r, size_t nk, const float *vals)
{
    size_t vb = (size_t)r->dim * sizeof(float), sent = 0;
    for (size_t k = 0; k < nk; k += CHUNK) {
        size_t m = nk - k < CHUNK ? nk - k : CHUNK, a = 0;
        r->argv[a] = "MSET", r->argl[a++] = 4;
        for (size_t i = k; i < k + m; i++) {
            r->argv[a] = r->keys + i * KEY_LEN, r->argl[a++] = KEY_LEN;
            r->argv[a] = (const char *)(vals + i * (size_t)r->dim), r->argl[a++] = vb;
        }
        if (redisAppendCommandArgv(r->c, (int)a, r->argv, r->argl) != REDIS_OK)
            return -1;
        sent++;
    }
    int rc = 0;
    for (size_t i = 0; i < sent; i++) {
        redisReply *rep;
        if (redisGetReply(r->c, (void **)&rep) != REDIS_OK)
            return -1;
        if (rep->type == REDIS_REPLY_ERROR)
            rc = -1;
        freeReplyObject(rep);
    }
    return rc;
}

/* MGETs keys [0, nk) into out (dim floats each; a missing key gives 0),
 * CHUNK keys a command, every command sent before the first reply. */
static int mget(rpeer *r, size_t nk, float *out)
{
    size_t vb = (size_t)r->dim * sizeof(float), sent = 0;
    for (size_t k = 0; k < nk; k += CHUNK) {
        size_t m = nk - k < CHUNK ? nk - k : CHUNK, a = 0;
        r->argv[a] = "MGET", r->argl[a++] = 4;
        for (size_t i = k; i < k + m; i++)
            r->argv[a] = r->keys + i * KEY_LEN, r->argl[a++] = KEY_LEN;
        if (redisAppendCommandArgv(r->c, (int)a, r->argv, r->argl) != REDIS_OK)
            return -1;
        sent++;
    }
    int rc = 0;
    for (size_t s = 0, k = 0; s < sent; s++) {
        redisReply *rep;
        if (redisGetReply(r->c, (void **)&rep) != REDIS_OK)
            return -1;
        if (rep->type != REDIS_REPLY_ARRAY)
            rc = -1;
        for (size_t i = 0; rc == 0 && i < rep->elements; i++, k++) {
            redisReply *e = rep->element[i];
            if (e->type == REDIS_REPLY_STRING && e->len == vb)
                memcpy(out + k * (size_t)r->dim, e->str, vb);
            else
                memset(out + k * (size_t)r->dim, 0, vb);
        }
        freeReplyObject(rep);
    }
    return rc;
}

int rpeer_fill(rpeer *r, const int64_t *ids, size_t n, const float *values, float init_acc)
{
    if (grow(r, n) != 0)
        return -1;
    size_t d = (size_t)r->dim;
    for (size_t i = 0; i < n; i++) {
        key(r, i, 'v', ids[i]);
        key(r, n + i, 'a', ids[i]);
        memcpy(r->state + i * d, values + i * d, d * sizeof(float));
        for (size_t j = 0; j < d; j++)
            r->state[(n + i) * d + j] = init_acc;
    }
    return mset(r, 2 * n, r->state);
}

int rpeer_pull(rpeer *r, const int64_t *ids, size_t n, float *out)
{
    if (grow(r, n) != 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        key(r, i, 'v', ids[i]);
    return mget(r, n, out);
}

/* The distinct ids of ids (open addressing over 2n slots), their summed
 * gradients in r->gsum; returns how many. */
static size_t distinct(rpeer *r, const int64_t *ids, size_t n, const float *g)
{
    size_t d = (size_t)r->dim, nu = 0, cap = 1;
    while (cap < 2 * n)
        cap <<= 1;
    int64_t *tab = malloc(cap * sizeof *tab * 2);
    if (tab == NULL)
        return 0;
    for (size_t i = 0; i < cap; i++)
        tab[2 * i] = -1;
    for (size_t i = 0; i < n; i++) {
        size_t h = (size_t)(((uint64_t)ids[i] * 0x9e3779b97f4a7c15ULL) >> 20) & (cap - 1);
        while (tab[2 * h] >= 0 && r->uid[tab[2 * h]] != ids[i])
            h = (h + 1) & (cap - 1);
        if (tab[2 * h] < 0) {
            tab[2 * h] = (int64_t)nu;
            r->uid[nu] = ids[i];
            memset(r->gsum + nu * d, 0, d * sizeof(float));
            nu++;
        }
        size_t u = (size_t)tab[2 * h];
        r->slot[i] = u;
        for (size_t j = 0; j < d; j++)
            r->gsum[u * d + j] += g[i * d + j];
    }
    free(tab);
    return nu;
}

int rpeer_push(rpeer *r, const int64_t *ids, size_t n, const float *g, float lr, float *out)
{
    if (grow(r, n) != 0)
        return -1;
    size_t d = (size_t)r->dim, nu = distinct(r, ids, n, g);
    for (size_t u = 0; u < nu; u++) {
        key(r, u, 'v', r->uid[u]);
        key(r, nu + u, 'a', r->uid[u]);
    }
    if (mget(r, 2 * nu, r->state) != 0)
        return -1;
    for (size_t u = 0; u < nu; u++) {
        float *w = r->state + u * d, *acc = r->state + (nu + u) * d;
        const float *gu = r->gsum + u * d;
        for (size_t j = 0; j < d; j++) {
            acc[j] += gu[j] * gu[j];
            w[j] -= lr * gu[j] / (sqrtf(acc[j]) + 1e-7f);
        }
    }
    if (mset(r, 2 * nu, r->state) != 0)
        return -1;
    for (size_t i = 0; out && i < n; i++)
        memcpy(out + i * d, r->state + r->slot[i] * d, d * sizeof(float));
    return 0;
}

uint64_t rpeer_used_memory(rpeer *r)
{
    redisReply *rep = redisCommand(r->c, "INFO memory");
    uint64_t n = 0;
    if (rep && rep->type == REDIS_REPLY_STRING) {
        const char *m = strstr(rep->str, "used_memory:");
        if (m)
            n = strtoull(m + 12, NULL, 10);
    }
    freeReplyObject(rep);
    return n;
}
