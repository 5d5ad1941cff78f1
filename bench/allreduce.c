/*
 * allreduce.c - Gloo's all-reduce (worker/collective.h) on 2 and 4
 * processes over loopback, beside raw loopback TCP measured in the same run.
 *
 * The bench starts a real pscoord on 127.0.0.1:0 and forks one process per
 * rank; each registers with pscoord (ps_coord_join, a worker index of its own per
 * group, as a fresh slot needs no predecessor's secret) and
 * forms a Gloo group through pscoord's KvSet/KvGet, the path workerd
 * --strategy multi_worker_mirrored takes. Per size, ranks and algorithm
 * (ring, halving-doubling): W warm-up all-reduces, then N timed ones, each
 * after a one-float all-reduce as a barrier; rank 0 reports the median.
 * algbw = bytes / time; busbw = algbw x 2(n-1)/n (nccl-tests' convention).
 * Every result is checked against the sum of the ranks' inputs: a wrong
 * one prints a line and the bench exits 1.
 *
 * Raw TCP: two processes stream the largest size over a socket pair on
 * 127.0.0.1 (median of N transfers), the ceiling one rank pair can reach,
 * before the all-reduces and after them (a shared machine's load moves
 * it); the last line's ratio is to the larger of the two.
 *
 * Ends with one line: "allreduce: 64 MiB 2 ranks busbw X GB/s = R of raw
 * TCP" (the largest size and the smallest rank count measured).
 *
 * Threads and lifetime: one thread per process; pscoord and the ranks get
 * SIGKILL when the bench dies (PR_SET_PDEATHSIG).
 */
#include "common/clock.h"
#include "common/coordclient.h"
#include "common/errors.h"
#include "common/log.h"
#include "proto/ps.pb-c.h"
#include "worker/collective.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXV 8
#define MIB (1024.0 * 1024.0)

struct opts {
    const char *pscoord;
    int sizes[MAXV], nsizes;     /* MiB */
    int ranks[MAXV], nranks;
    int iters, warmup;
};

struct result {                  /* one per rank, in shared memory */
    double median_s;
    int status;                  /* 0 ok, 1 wrong sum, 2 error */
    char err[512];
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int parse_list(const char *s, int *out, const char *flag)
{
    int n = 0;
    char *end;
    while (*s != '\0') {
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || n == MAXV || (*end != ',' && *end != '\0')) {
            fprintf(stderr, "allreduce: %s: '%s' is not a list of positive numbers "
                    "(at most %d)\n", flag, s, MAXV);
            exit(2);
        }
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: allreduce --pscoord PATH [--sizes 4,16,64] [--ranks 2,4]\n"
            "                 [--iters 20] [--warmup 3] [--quick]\n"
            "Gloo all-reduce of float32 over loopback (sizes in MiB) beside raw TCP.\n"
            "--quick: sizes 4,64, ranks 2, 5 iterations, 1 warm-up.\n");
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.sizes = {4, 16, 64}, .nsizes = 3, .ranks = {2, 4}, .nranks = 2,
                       .iters = 20, .warmup = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--quick") == 0) {
            o->sizes[0] = 4, o->sizes[1] = 64, o->nsizes = 2;
            o->ranks[0] = 2, o->nranks = 1;
            o->iters = 5, o->warmup = 1;
        } else if (v == NULL) {
            fprintf(stderr, "allreduce: unknown option or missing value: %s\n", a);
            exit(2);
        } else if (strcmp(a, "--pscoord") == 0) {
            o->pscoord = argv[++i];
        } else if (strcmp(a, "--sizes") == 0) {
            o->nsizes = parse_list(argv[++i], o->sizes, a);
        } else if (strcmp(a, "--ranks") == 0) {
            o->nranks = parse_list(argv[++i], o->ranks, a);
        } else if (strcmp(a, "--iters") == 0 || strcmp(a, "--warmup") == 0) {
            int x[MAXV];
            parse_list(argv[++i], x, a);
            *(a[2] == 'i' ? &o->iters : &o->warmup) = x[0];
        } else {
            fprintf(stderr, "allreduce: unknown option: %s\n", a);
            exit(2);
        }
    }
    if (o->pscoord == NULL) {
        fprintf(stderr, "allreduce: --pscoord PATH is required\n");
        exit(2);
    }
}

/* ---- pscoord ------------------------------------------------------------ */

static char coord_root[256];
static pid_t coord_pid = -1;

static void stop_coord(void)
{
    if (coord_pid > 0) {
        kill(coord_pid, SIGTERM);
        waitpid(coord_pid, NULL, 0);
        coord_pid = -1;
    }
    if (coord_root[0] != '\0') {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", coord_root);
        if (system(cmd) != 0)
            fprintf(stderr, "allreduce: could not remove %s\n", coord_root);
        coord_root[0] = '\0';
    }
}

/* Starts pscoord on 127.0.0.1:0; its port, or -1 after a line. */
static int start_coord(const char *path)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(coord_root, sizeof coord_root, "%s/allreduce.XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(coord_root) == NULL) {
        fprintf(stderr, "allreduce: mkdtemp: %s\n", strerror(errno));
        coord_root[0] = '\0';
        return -1;
    }
    char state[300], log[300];
    snprintf(state, sizeof state, "%s/state", coord_root);
    snprintf(log, sizeof log, "%s/pscoord.log", coord_root);
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    coord_pid = fork();
    if (coord_pid == 0) {
        int lfd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (lfd < 0 || dup2(pfd[1], 1) < 0 || dup2(lfd, 2) < 0)
            _exit(127);
        close(pfd[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(path, path, "--state-dir", state, "--listen", "127.0.0.1:0",
              "--metrics-listen", "off", "--heartbeat-timeout", "30s", (char *)NULL);
        dprintf(2, "allreduce: cannot run %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    char buf[512];
    size_t len = 0;
    double until = ps_now_s() + 30;
    int port = -1;
    while (ps_now_s() < until && port < 0) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        if (poll(&p, 1, 200) <= 0)
            continue;
        ssize_t r = read(pfd[0], buf + len, sizeof buf - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        buf[len] = '\0';
        char *at = strstr(buf, "PORT ");
        if (at != NULL && strchr(at, '\n') != NULL)
            port = atoi(at + 5);
    }
    close(pfd[0]);
    if (port <= 0)
        fprintf(stderr, "allreduce: pscoord (%s) did not serve; see %s\n", path, log);
    return port;
}

/* ---- one rank ------------------------------------------------------------ */

static float input(int rank, size_t i)
{
    return (float)((rank + 1) * (int)(i % 7 + 1));
}

/* The timed loop of one rank in a formed group; 0, 1 (wrong sum) or 2. */
static int measure(wd_coll *c, const struct opts *o, size_t n, struct result *r)
{
    float *buf = malloc(n * sizeof *buf);
    double *t = calloc((size_t)o->iters, sizeof *t);
    float one = 1;
    int rc = buf == NULL || t == NULL ? 2 : 0;
    for (int it = 0; rc == 0 && it < o->warmup + o->iters; it++) {
        for (size_t i = 0; i < n; i++)
            buf[i] = input(c->rank, i);
        if (c->allreduce_f32(c, &one, 1, r->err, sizeof r->err) != 0) {
            rc = 2;
            break;
        }
        double t0 = ps_now_s();
        if (c->allreduce_f32(c, buf, n, r->err, sizeof r->err) != 0) {
            rc = 2;
            break;
        }
        if (it >= o->warmup)
            t[it - o->warmup] = ps_now_s() - t0;
        float tri = (float)(c->size * (c->size + 1) / 2);
        for (size_t i = 0; i < n; i++)
            if (buf[i] != tri * (float)(i % 7 + 1)) {
                snprintf(r->err, sizeof r->err, "rank %d: element %zu is %g, not the sum "
                         "%g", c->rank, i, (double)buf[i], (double)(tri * (float)(i % 7 + 1)));
                rc = 1;
                break;
            }
    }
    if (rc == 0)
        r->median_s = median(t, o->iters);
    free(buf);
    free(t);
    return rc;
}

/* The generation pscoord formed of exactly this run's ranks (worker
 * indexes base .. base + size - 1), its prefix and this rank's place in
 * it: the rendezvous keys are a generation's, each written by its rank
 * (ps.proto, the Kv calls), so the group is named as workerd names it.
 * 0, or -1 with r->err set. */
static int await_generation(struct wd_coll_store *store, ps_coord *pc, uint32_t base,
                            int size, uint32_t me, char *prefix, size_t plen, int *rank,
                            char *err, size_t errlen)
{
    double until = ps_now_s() + 30;
    char why[256] = "no generation yet";
    while (ps_now_s() < until) {
        void *v = NULL;
        size_t len = 0;
        if (store->get(pc, "generation", 200, &v, &len, why, sizeof why) != 0)
            continue;
        long long g = strtoll(v, NULL, 10);
        free(v);
        char key[64];
        snprintf(key, sizeof key, "gen/%lld/members", g);
        if (store->get(pc, key, 200, &v, &len, why, sizeof why) != 0)
            continue;
        int n = 0, at = -1;
        bool ours = true;
        for (const char *s = v; *s != '\0'; n++) {
            char *end;
            unsigned long w = strtoul(s, &end, 10);
            ours = ours && end != s && w >= base && w < base + (uint32_t)size;
            if (w == me)
                at = n;
            s = *end == ',' ? end + 1 : end;
            if (end == s && *s != '\0')
                break;
        }
        free(v);
        if (ours && n == size && at >= 0) {
            snprintf(prefix, plen, "gen/%lld/", g);
            *rank = at;
            return 0;
        }
        snprintf(why, sizeof why, "generation %lld has %d worker(s), not this run's %d", g,
                 n, size);
        usleep(20000);
    }
    snprintf(err, errlen, "no generation of this run's %d ranks within 30 s (%s)", size,
             why);
    return -1;
}

static int rank_main(const struct opts *o, int port, int run, int rank, int size,
                     int algo, size_t n, struct result *r)
{
    char addr[64], prefix[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    uint32_t base = (uint32_t)(run * MAXV * 8);
    ps_coord_opts co = {.coordinator = addr, .job_id = "job",
                        .role = PS__V1__ROLE__WORKER, .index = (int)base + rank,
                        .address = "127.0.0.1", .register_budget_ms = 30000};
    ps_coord *pc = NULL;
    if (ps_coord_join(&co, &pc, NULL, r->err, sizeof r->err) != 0)
        return 2;
    struct wd_coll_store store = wd_coll_coord_store(pc);
    int place = rank;
    if (await_generation(&store, pc, base, size, base + (uint32_t)rank, prefix,
                         sizeof prefix, &place, r->err, sizeof r->err) != 0) {
        ps_coord_leave(pc);
        return 2;
    }
    struct wd_coll_opts go = {.rank = place, .size = size, .prefix = prefix,
                              .host = "127.0.0.1", .timeout_ms = 30000,
                              .algorithm = algo, .store = &store};
    wd_coll *c = NULL;
    int rc = 2;
    if (wd_coll_gloo_create(&go, &c, r->err, sizeof r->err) == 0) {
        rc = measure(c, o, n, r);
        /* No rank closes its sockets before every rank is done: a close
         * with bytes still unread sends a reset that can cut a peer's last
         * all-reduce short. One more small all-reduce is the barrier. */
        double done = 1;
        char e[256];
        if (c->allreduce_f64(c, &done, 1, e, sizeof e) != 0 && rc == 0) {
            snprintf(r->err, sizeof r->err, "the closing barrier: %s", e);
            rc = 1;
        }
        wd_coll_destroy(c);
    }
    ps_coord_leave(pc);
    return rc;
}

/* Forks size ranks for one measurement; rank 0's median, or < 0. */
static double run_group(const struct opts *o, int port, int run, int size, int algo,
                        size_t n, struct result *res)
{
    pid_t pid[MAXV * 8];
    memset(res, 0, sizeof *res * (size_t)size);
    for (int r = 0; r < size; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            res[r].status = rank_main(o, port, run, r, size, algo, n, &res[r]);
            _exit(res[r].status);
        }
    }
    int bad = 0;
    for (int r = 0; r < size; r++) {
        int st;
        waitpid(pid[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "allreduce: %d ranks, rank %d: %s\n", size, r,
                    res[r].err[0] ? res[r].err : "died");
            bad = bad ? bad : (WIFEXITED(st) && WEXITSTATUS(st) == 1 ? 1 : 2);
        }
    }
    return bad ? -bad : res[0].median_s;
}

/* ---- raw loopback TCP --------------------------------------------------- */

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* A listening socket on 127.0.0.1 at a free port, its address in *sa;
 * -1 on failure. */
static int loopback_listener(struct sockaddr_in *sa)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    *sa = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof *sa;
    if (ls >= 0 && bind(ls, (struct sockaddr *)sa, sizeof *sa) == 0 && listen(ls, 1) == 0 &&
        getsockname(ls, (struct sockaddr *)sa, &sl) == 0)
        return ls;
    if (ls >= 0)
        close(ls);
    return -1;
}

/* Bytes per second of one TCP stream on 127.0.0.1: median of iters
 * transfers of bytes, each acknowledged by one byte back. */
static double raw_tcp(size_t bytes, int iters)
{
    struct sockaddr_in sa;
    int ls = loopback_listener(&sa);
    if (ls < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int s = socket(AF_INET, SOCK_STREAM, 0);
        char *buf = calloc(1, bytes), ack;
        if (s < 0 || buf == NULL || connect(s, (struct sockaddr *)&sa, sizeof sa) != 0)
            _exit(2);
        for (int it = 0; it < iters + 1; it++)
            if (write_all(s, buf, bytes) != 0 || read(s, &ack, 1) != 1)
                _exit(2);
        _exit(0);
    }
    int s = accept(ls, NULL, NULL);
    close(ls);
    char *buf = malloc(1 << 20);
    double *t = calloc((size_t)iters, sizeof *t);
    for (int it = 0; s >= 0 && it < iters + 1; it++) {
        double t0 = ps_now_s();
        size_t got = 0;
        while (got < bytes) {
            ssize_t r = read(s, buf, 1 << 20);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (got < bytes || write(s, "k", 1) != 1)
            break;
        if (it > 0) /* the first is the warm-up */
            t[it - 1] = ps_now_s() - t0;
    }
    int st;
    waitpid(pid, &st, 0);
    double bw = WIFEXITED(st) && WEXITSTATUS(st) == 0 ? (double)bytes / median(t, iters) : -1;
    if (s >= 0)
        close(s);
    free(buf);
    free(t);
    return bw;
}

/* One side of raw_tcp_exchange: writes bytes to fd while the caller
 * reads. */
struct xsend {
    int fd;
    const char *buf;
    size_t bytes;
    int rc;
};

static void *xsend_main(void *arg)
{
    struct xsend *x = arg;
    x->rc = write_all(x->fd, x->buf, x->bytes);
    return NULL;
}

/* One exchange on a connected socket: a one-byte barrier (the side that
 * leads sends it, the other echoes it), then both send bytes to each
 * other at once, a thread writing while this one reads. Its seconds, or
 * < 0. */
static double exchange_once(int s, char *sbuf, char *rbuf, size_t bytes, bool lead)
{
    char b = 'b';
    if (lead ? (write(s, &b, 1) != 1 || read(s, &b, 1) != 1)
             : (read(s, &b, 1) != 1 || write(s, &b, 1) != 1))
        return -1;
    double t0 = ps_now_s();
    struct xsend x = {.fd = s, .buf = sbuf, .bytes = bytes};
    pthread_t th;
    if (pthread_create(&th, NULL, xsend_main, &x) != 0)
        return -1;
    size_t got = 0;
    while (got < bytes) {
        ssize_t r = read(s, rbuf, bytes - got < (1u << 20) ? bytes - got : (1u << 20));
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    pthread_join(th, NULL);
    return got == bytes && x.rc == 0 ? ps_now_s() - t0 : -1;
}

/* Bytes per second one way when two processes on 127.0.0.1 send bytes to
 * each other at the same time over one socket pair, as the two ranks of
 * a ring all-reduce do (each sends its half while it receives the
 * other's): median of iters exchanges after one warm-up. */
static double raw_tcp_exchange(size_t bytes, int iters)
{
    struct sockaddr_in sa;
    int ls = loopback_listener(&sa);
    if (ls < 0)
        return -1;
    char *sbuf = calloc(1, bytes), *rbuf = malloc(1 << 20);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0 || sbuf == NULL || rbuf == NULL ||
            connect(s, (struct sockaddr *)&sa, sizeof sa) != 0)
            _exit(2);
        for (int it = 0; it < iters + 1; it++)
            if (exchange_once(s, sbuf, rbuf, bytes, false) < 0)
                _exit(2);
        _exit(0);
    }
    int s = accept(ls, NULL, NULL);
    close(ls);
    double *t = calloc((size_t)iters, sizeof *t);
    bool ok = s >= 0 && sbuf != NULL && rbuf != NULL && t != NULL;
    for (int it = 0; ok && it < iters + 1; it++) {
        double x = exchange_once(s, sbuf, rbuf, bytes, true);
        ok = x > 0;
        if (ok && it > 0)
            t[it - 1] = x;
    }
    if (s >= 0)
        close(s);
    int st;
    waitpid(pid, &st, 0);
    double bw = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? (double)bytes / median(t, iters)
                                                            : -1;
    free(sbuf);
    free(rbuf);
    free(t);
    return bw;
}

int main(int argc, char **argv)
{
    struct opts o;
    parse_opts(argc, argv, &o);
    setvbuf(stdout, NULL, _IOLBF, 0);
    ps_log_set_level(PS_LOG_WARN); /* not each rank's registration */
    int maxsize = 0, minranks = MAXV * 8, maxranks = 0;
    for (int i = 0; i < o.nsizes; i++)
        maxsize = o.sizes[i] > maxsize ? o.sizes[i] : maxsize;
    for (int i = 0; i < o.nranks; i++) {
        if (o.ranks[i] < 2 || o.ranks[i] > MAXV * 8) {
            fprintf(stderr, "allreduce: --ranks: %d is not in 2..%d\n", o.ranks[i], MAXV * 8);
            return 2;
        }
        minranks = o.ranks[i] < minranks ? o.ranks[i] : minranks;
        maxranks = o.ranks[i] > maxranks ? o.ranks[i] : maxranks;
    }
    struct result *res = mmap(NULL, sizeof *res * (size_t)maxranks, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED)
        return 2;

    size_t maxbytes = (size_t)maxsize << 20;
    int citers = o.iters > 3 ? o.iters : 3;
    double raw = raw_tcp(maxbytes, citers), xraw = raw_tcp_exchange(maxbytes, citers);
    if (raw <= 0 || xraw <= 0) {
        fprintf(stderr, "allreduce: the raw loopback TCP %s failed\n",
                raw <= 0 ? "stream" : "exchange");
        return 2;
    }
    printf("raw TCP 127.0.0.1: %d MiB one-way stream %.2f GB/s; both ways at once %.2f "
           "GB/s each way (before)\n", maxsize, raw / 1e9, xraw / 1e9);
    int port = start_coord(o.pscoord);
    if (port < 0) {
        stop_coord();
        return 2;
    }
    printf("%-18s %5s %8s %10s %11s %11s %8s %8s\n", "algorithm", "ranks", "MiB", "time ms",
           "algbw GB/s", "busbw GB/s", "of 1-way", "of both");
    const char *names[] = {"ring", "halving-doubling"};
    double headline = -1;
    int run = 0, status = 0;
    for (int ri = 0; ri < o.nranks && status == 0; ri++)
        for (int si = 0; si < o.nsizes && status == 0; si++)
            for (int a = 0; a < 2 && status == 0; a++) {
                int n = o.ranks[ri];
                size_t bytes = (size_t)o.sizes[si] << 20;
                double t = run_group(&o, port, run++, n, a, bytes / sizeof(float), res);
                if (t < 0) {
                    status = (int)-t;
                    break;
                }
                double alg = (double)bytes / t, bus = alg * 2.0 * (n - 1) / n;
                printf("%-18s %5d %8d %10.2f %11.2f %11.2f %8.2f %8.2f\n", names[a], n,
                       o.sizes[si], t * 1e3, alg / 1e9, bus / 1e9, bus / raw, bus / xraw);
                if (n == minranks && o.sizes[si] == maxsize && bus > headline)
                    headline = bus;
            }
    stop_coord();
    if (status != 0)
        return status;
    double raw2 = raw_tcp(maxbytes, citers), xraw2 = raw_tcp_exchange(maxbytes, citers);
    printf("raw TCP 127.0.0.1: %d MiB one-way stream %.2f GB/s; both ways at once %.2f "
           "GB/s each way (after)\n", maxsize, raw2 / 1e9, xraw2 / 1e9);
    if (raw2 > raw || xraw2 > xraw)
        printf("(the columns above are to the first; the lines below to the larger)\n");
    raw = raw2 > raw ? raw2 : raw;
    xraw = xraw2 > xraw ? xraw2 : xraw;
    /* A ring all-reduce's ranks send and receive at once; on one host
     * both directions share the same cores' copies, so the ceiling that
     * matches its traffic is the exchange, not the one-way stream. */
    printf("against a one-way stream (each byte crossing loopback with the other "
           "direction idle): %.2f\n", headline / raw);
    printf("allreduce: %d MiB %d ranks busbw %.2f GB/s = %.2f of raw TCP\n", maxsize,
           minranks, headline / 1e9, headline / xraw);
    return 0;
}
