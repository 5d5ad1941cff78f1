/* pushpull_link.c - bench/pushpull --link RATE: psd and the client on the two
 * ends of a real (virtual) link instead of loopback. See pushpull.h.
 *
 * Two network namespaces, ppA<pid> (psd) and ppB<pid> (this process's
 * client threads), joined by a veth pair (ppa<pid>, ppb<pid>) whose two
 * ends each send through a token bucket (tc qdisc tbf) at RATE with a
 * burst of 256 KB: a burst of megabytes would let a whole 4 MiB message
 * through at memory speed, and the link would limit nothing. Raw TCP over
 * the same link (a listener made in ppA, a sender in ppB) is the ceiling.
 *
 * Sockets belong to the namespace they were made in, and threads inherit
 * their creator's, so main switches itself into ppB (setns) before any
 * gRPC thread exists; psd's child switches into ppA before exec. The
 * namespaces (and with them the veth pair) are removed on every way out:
 * link_teardown on return, and the signal thread on SIGINT/SIGTERM/SIGHUP.
 *
 * Threads and lifetime: link_setup and link_teardown run on main's thread;
 * link_cleanup_now may run on the signal thread (it only runs `ip netns
 * del`, which is harmless twice).
 */
#include "bench/pushpull.h"

#include <sched.h>

#define ADDR_A "10.213.0.1"
#define ADDR_B "10.213.0.2"

static char ns_a[32], ns_b[32];
static _Atomic int link_live; /* namespaces exist */

/* Runs ip or tc with argv, its output to /dev/null (stderr kept when
 * loud). Returns its exit status, or 127 when it cannot run. */
static int run(bool loud, const char *const *argv)
{
    pid_t pid = fork();
    if (pid < 0)
        return 127;
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, 1);
            if (!loud)
                dup2(null, 2);
        }
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return 127;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 127;
}

void link_cleanup_now(void)
{
    if (!atomic_exchange(&link_live, 0))
        return;
    const char *da[] = {"ip", "netns", "del", ns_a, NULL};
    const char *db[] = {"ip", "netns", "del", ns_b, NULL};
    run(false, da);
    run(false, db);
}

int link_parse_rate(const char *s, double *gbit)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0))
        return -1;
    if (strcasecmp(end, "gbit") == 0)
        *gbit = v;
    else if (strcasecmp(end, "mbit") == 0)
        *gbit = v / 1000;
    else
        return -1;
    return *gbit >= 0.01 && *gbit <= 400 ? 0 : -1;
}

/* One tbf on dev in ns: rate, a 256 KB bucket, 5 ms of queue. */
static int shape(const char *ns, const char *dev, const char *rate)
{
    const char *argv[] = {"tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                          "rate", rate, "burst", "256kb", "latency", "5ms", NULL};
    return run(true, argv);
}

int link_setup(const char *rate, char *err, size_t errlen)
{
    if (geteuid() != 0) {
        snprintf(err, errlen, "needs root (network namespaces, veth and tc)");
        return 77;
    }
    const char *ipv[] = {"ip", "-V", NULL}, *tcv[] = {"tc", "-V", NULL};
    if (run(false, ipv) != 0 || run(false, tcv) != 0) {
        snprintf(err, errlen, "needs ip and tc (Debian's iproute2)");
        return 77;
    }
    int pid = (int)getpid();
    char va[16], vb[16], cidr_a[32], cidr_b[32];
    snprintf(ns_a, sizeof ns_a, "ppA%d", pid);
    snprintf(ns_b, sizeof ns_b, "ppB%d", pid);
    snprintf(va, sizeof va, "ppa%d", pid);
    snprintf(vb, sizeof vb, "ppb%d", pid);
    snprintf(cidr_a, sizeof cidr_a, "%s/24", ADDR_A);
    snprintf(cidr_b, sizeof cidr_b, "%s/24", ADDR_B);
    const char *add_a[] = {"ip", "netns", "add", ns_a, NULL};
    const char *add_b[] = {"ip", "netns", "add", ns_b, NULL};
    if (run(true, add_a) != 0) {
        snprintf(err, errlen, "ip netns add %s failed", ns_a);
        return 1;
    }
    atomic_store(&link_live, 1);
    const char *const *steps[] = {
        add_b,
        (const char *[]){"ip", "link", "add", va, "netns", ns_a, "type", "veth",
                         "peer", "name", vb, "netns", ns_b, NULL},
        (const char *[]){"ip", "-n", ns_a, "addr", "add", cidr_a, "dev", va, NULL},
        (const char *[]){"ip", "-n", ns_b, "addr", "add", cidr_b, "dev", vb, NULL},
        (const char *[]){"ip", "-n", ns_a, "link", "set", va, "up", NULL},
        (const char *[]){"ip", "-n", ns_b, "link", "set", vb, "up", NULL},
        (const char *[]){"ip", "-n", ns_a, "link", "set", "lo", "up", NULL},
        (const char *[]){"ip", "-n", ns_b, "link", "set", "lo", "up", NULL},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        if (run(true, steps[i]) != 0) {
            snprintf(err, errlen, "setting up the link: '%s %s %s %s ...' failed",
                     steps[i][0], steps[i][1], steps[i][2], steps[i][3]);
            link_cleanup_now();
            return 1;
        }
    }
    if (shape(ns_a, va, rate) != 0 || shape(ns_b, vb, rate) != 0) {
        snprintf(err, errlen, "tc qdisc add ... tbf rate %s burst 256kb failed "
                 "(no sch_tbf in this kernel?)", rate);
        link_cleanup_now();
        return 1;
    }
    return 0;
}

const char *link_psd_netns(void)
{
    return ns_a;
}

const char *link_client_netns(void)
{
    return ns_b;
}

const char *link_psd_host(void)
{
    return ADDR_A;
}

int link_enter(const char *ns)
{
    char path[96];
    snprintf(path, sizeof path, "/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = setns(fd, CLONE_NEWNET) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

/* A listener on ADDR_A port 0 made in psd's namespace, this thread back in
 * the client's (it must be there on entry). Returns 0 or -errno. */
static int listen_in_a(int *lfd_out, struct sockaddr_in *a)
{
    int rc = link_enter(ns_a);
    if (rc != 0)
        return rc;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int saved = errno;
    rc = link_enter(ns_b);
    if (lfd < 0)
        return -saved;
    if (rc != 0) {
        close(lfd);
        return rc;
    }
    *a = (struct sockaddr_in){.sin_family = AF_INET};
    inet_pton(AF_INET, ADDR_A, &a->sin_addr);
    socklen_t alen = sizeof *a;
    if (bind(lfd, (struct sockaddr *)a, sizeof *a) != 0 || listen(lfd, 4) != 0 ||
        getsockname(lfd, (struct sockaddr *)a, &alen) != 0) {
        rc = -errno;
        close(lfd);
        return rc;
    }
    *lfd_out = lfd;
    return 0;
}

/* The raw TCP ceiling over the link: three transfers of o->tcp_bytes from
 * the client's end to a listener in psd's. The caller's thread must be in
 * ppB and is again afterwards. Returns 0 or -errno. */
int link_tcp_ceiling(const struct opts *o, double runs[3], double *median)
{
    int lfd;
    struct sockaddr_in a;
    int rc = listen_in_a(&lfd, &a);
    if (rc != 0)
        return rc;
    const size_t chunk = (size_t)4 << 20;
    uint8_t *sbuf = aligned_alloc(4096, chunk), *rbuf = aligned_alloc(4096, chunk);
    double v[3];
    rc = sbuf != NULL && rbuf != NULL ? 0 : -ENOMEM;
    if (rc == 0) {
        memset(sbuf, 0x5a, chunk);
        memset(rbuf, 0, chunk);
    }
    for (int i = 0; i < 3 && rc == 0; i++) {
        runs[i] = tcp_once_on(lfd, &a, o->tcp_bytes, sbuf, rbuf, chunk);
        if (runs[i] < 0)
            rc = (int)runs[i];
        v[i] = runs[i];
    }
    if (rc == 0)
        *median = quantile(v, 3, 0.5);
    free(sbuf);
    free(rbuf);
    close(lfd);
    return rc;
}

/* ---- raw TCP request and answer ------------------------------------------ */

static int xfer(int fd, uint8_t *buf, size_t n, bool out)
{
    while (n > 0) {
        ssize_t k = out ? write(fd, buf, n) : read(fd, buf, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -EPIPE;
        buf += k;
        n -= (size_t)k;
    }
    return 0;
}

struct echo {
    int fd;
    size_t bytes;
    int rounds;
    uint8_t *buf;
    int rc;
};

/* psd's end: each round reads the whole request, then writes as many bytes
 * back (a push answered, then a pull's answer: one after the other). */
static void *echo_main(void *arg)
{
    struct echo *e = arg;
    for (int i = 0; i < e->rounds && e->rc == 0; i++) {
        e->rc = xfer(e->fd, e->buf, e->bytes, false);
        if (e->rc == 0)
            e->rc = xfer(e->fd, e->buf, e->bytes, true);
    }
    return NULL;
}

/* Raw TCP in the shape of one push then one pull of `bytes` each way, over
 * one connection kept open (as gRPC's), TCP_NODELAY on both ends (as
 * gRPC's): the client sends `bytes`, psd's end reads them all and sends
 * `bytes` back. `rounds` timed after 10 untimed; *ms their median. What no
 * RPC over this link can beat: the ceiling of push+pull at that size, and
 * with half the bytes the most half precision can gain here. The caller's
 * thread must be in ppB. Returns 0 or -errno. */
int link_tcp_echo(size_t bytes, int rounds, double *ms)
{
    const int warm = 10;
    int lfd, cfd = -1, one = 1;
    struct sockaddr_in a;
    int rc = listen_in_a(&lfd, &a);
    if (rc != 0)
        return rc;
    struct echo e = {.fd = -1, .bytes = bytes, .rounds = warm + rounds};
    uint8_t *buf = aligned_alloc(4096, bytes);
    double *t = calloc((size_t)rounds, sizeof *t);
    e.buf = aligned_alloc(4096, bytes);
    rc = -ENOMEM;
    if (buf == NULL || e.buf == NULL || t == NULL)
        goto free_all;
    memset(buf, 0x5a, bytes);
    memset(e.buf, 0, bytes);
    cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (cfd < 0 || connect(cfd, (const struct sockaddr *)&a, sizeof a) != 0 ||
        (e.fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) < 0) {
        rc = -errno;
        goto free_all;
    }
    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(e.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_t th;
    if ((rc = -pthread_create(&th, NULL, echo_main, &e)) != 0)
        goto free_all;
    for (int i = 0; i < warm + rounds && rc == 0; i++) {
        double t0 = ps_now_s();
        rc = xfer(cfd, buf, bytes, true);
        if (rc == 0)
            rc = xfer(cfd, buf, bytes, false);
        if (i >= warm)
            t[i - warm] = ps_now_s() - t0;
    }
    if (rc != 0)
        shutdown(cfd, SHUT_RDWR); /* the far end's read fails: it stops */
    pthread_join(th, NULL);
    if (rc == 0)
        rc = e.rc;
    if (rc == 0)
        *ms = quantile(t, (size_t)rounds, 0.5) * 1e3;
free_all:
    if (e.fd >= 0)
        close(e.fd);
    if (cfd >= 0)
        close(cfd);
    close(lfd);
    free(t);
    free(buf);
    free(e.buf);
    return rc;
}
