/* pushpull_env.c - the options of bench/pushpull, the ceilings it measures
 * (loopback TCP, memcpy) and psd as its child process. See pushpull.h. */
#include "bench/pushpull.h"

/* ---- options ------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: pushpull [options]\n"
        "  --psd PATH        psd binary (default: <build>/server/psd beside this one)\n"
        "  --sizes LIST      variable sizes, e.g. 4K,1M,4M,64M (K/M/G are binary)\n"
        "  --streams LIST    client streams per case, e.g. 1,2,4\n"
        "  --seconds S       timed seconds per case (default 2)\n"
        "  --quick           smoke matrix: 4K and 4M, 1 stream, 1 second each\n"
        "  --json            one JSON object per line instead of a table\n"
        "  --psd-arg ARG     extra argument for psd (repeatable), e.g.\n"
        "                    --psd-arg=--commit-interval=1s\n"
        "  --misalign        place the gradient off a 4-byte boundary in the\n"
        "                    request (what an unaware encoder may do)\n"
        "  --tcp-bytes N     bytes per loopback TCP ceiling run (default 1G)\n"
        "  --shm             gradients and values through shared memory with\n"
        "                    psd (ShmRef), as workerd moves them on one host\n"
        "  --pscerts PATH    the certificate maker for the TLS comparison\n"
        "                    (default: <build>/tools/pscerts)\n"
        "  --no-tls          skip the 4 MiB comparison with mutual TLS\n"
        "  --token-file F    send the token in F (an operator's: Stats too),\n"
        "                    for a psd given --psd-arg=--tokens=FILE\n"
        "  --wire-dtype T    bf16 or fp16: psclient streams send gradients and\n"
        "                    take values in half precision (error feedback)\n"
        "  --pieces BYTES    psclient streams cut tensors above BYTES into pieces\n"
        "                    of it, --window calls at once (default:\n"
        "                    psclient's, 1M and 2; 0: one call per tensor)\n"
        "  --window N        a pull's pieces not yet answered at once (default 2)\n"
        "  --link RATE       psd and the client in two network namespaces joined\n"
        "                    by a veth pair shaped to RATE (10gbit, 25gbit; tc\n"
        "                    tbf, 256 KB burst), raw TCP over it the ceiling;\n"
        "                    4 MiB, 1 stream unless --sizes/--streams; needs\n"
        "                    root (else one line and exit 77)\n");
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s)
        return -1;
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B')
        end++;
    if (*end == 'B')
        end++;
    if (*end != '\0')
        return -1;
    *out = (size_t)v;
    return 0;
}

/* Splits a comma list in place and calls fn on each item. */
static int parse_list(char *s, int (*fn)(const char *, void *, int), void *dst)
{
    int n = 0;
    for (char *tok = strtok(s, ","); tok != NULL; tok = strtok(NULL, ",")) {
        if (n == MAX_LIST || fn(tok, dst, n) != 0)
            return -1;
        n++;
    }
    return n;
}

static int size_item(const char *tok, void *dst, int i)
{
    size_t *sizes = dst;
    if (parse_size(tok, &sizes[i]) != 0 || sizes[i] < 4 || sizes[i] % 4 != 0 ||
        sizes[i] > ((size_t)1 << 30) - 4096)
        return -1;
    return 0;
}

static int stream_item(const char *tok, void *dst, int i)
{
    int *streams = dst;
    char *end;
    long v = strtol(tok, &end, 10);
    if (*end != '\0' || v < 1 || v > 64)
        return -1;
    streams[i] = (int)v;
    return 0;
}

/* Takes "--name VALUE" or "--name=VALUE"; NULL when argv[*i] is not --name. */
static const char *opt_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "pushpull: %s needs a value\n", name);
        exit(2);
    }
    return argv[++*i];
}

static char default_psd[PATH_MAX];

/* <build>/server/psd, with <build> the directory above this binary's. */
static const char *find_default_psd(void)
{
    ssize_t n = readlink("/proc/self/exe", default_psd, sizeof default_psd - 1);
    if (n <= 0)
        return "server/psd";
    default_psd[n] = '\0';
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(default_psd, '/');
        if (slash == NULL)
            return "server/psd";
        *slash = '\0';
    }
    size_t len = strlen(default_psd);
    snprintf(default_psd + len, sizeof default_psd - len, "/server/psd");
    return default_psd;
}

/* --token-file's token, sent with every call; "" for none. Set once by
 * parse_opts before any thread starts. */
char bench_token[PS_AUTH_TOKEN_MAX + 1];

void parse_opts(int argc, char **argv, struct opts *o)
{
    static const size_t full_sizes[] = {4 << 10, 1 << 20, 4 << 20, 64 << 20};
    static const int full_streams[] = {1, 2, 4};
    memset(o, 0, sizeof *o);
    o->seconds = -1;
    o->piece_bytes = (size_t)1 << 20; /* psclient's own default */
    o->tcp_bytes = (size_t)1 << 30;
    bool quick = false;
    char *sizes = NULL, *streams = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(argv[i], "--json") == 0) {
            o->json = true;
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = true;
        } else if (strcmp(argv[i], "--misalign") == 0) {
            o->misalign = true;
            o->raw = true;
        } else if (strcmp(argv[i], "--raw") == 0) {
            o->raw = true;
        } else if (strcmp(argv[i], "--shm") == 0) {
            o->shm = true;
        } else if (strcmp(argv[i], "--no-tls") == 0) {
            o->no_tls = true;
        } else if ((v = opt_value(argc, argv, &i, "--pscerts")) != NULL) {
            o->pscerts = v;
        } else if ((v = opt_value(argc, argv, &i, "--token-file")) != NULL) {
            char err[600];
            if (ps_auth_read_token(v, bench_token, sizeof bench_token, err,
                                   sizeof err) != 0) {
                fprintf(stderr, "pushpull: --token-file: %s\n", err);
                exit(2);
            }
        } else if ((v = opt_value(argc, argv, &i, "--wire-dtype")) != NULL) {
            o->wire_dtype = strcmp(v, "bf16") == 0 ? 3 : strcmp(v, "fp16") == 0 ? 2
                            : strcmp(v, "f32") == 0 ? 0 : -1;
            if (o->wire_dtype < 0) {
                fprintf(stderr, "pushpull: --wire-dtype: '%s' is not bf16, fp16 or f32\n", v);
                exit(2);
            }
        } else if ((v = opt_value(argc, argv, &i, "--pieces")) != NULL) {
            if (parse_size(v, &o->piece_bytes) != 0 ||
                (o->piece_bytes != 0 && o->piece_bytes < 4096)) {
                fprintf(stderr, "pushpull: --pieces: '%s' is not 0 or a size of at "
                        "least 4K\n", v);
                exit(2);
            }
            o->pieces_set = true;
        } else if ((v = opt_value(argc, argv, &i, "--window")) != NULL) {
            char *end;
            long w = strtol(v, &end, 10);
            if (*end != '\0' || w < 1 || w > 64) {
                fprintf(stderr, "pushpull: --window: '%s' is not in 1..64\n", v);
                exit(2);
            }
            o->piece_window = (int)w;
            o->pieces_set = true;
        } else if ((v = opt_value(argc, argv, &i, "--link")) != NULL) {
            if (link_parse_rate(v, &o->link_gbit) != 0) {
                fprintf(stderr, "pushpull: --link: '%s' is not a rate like 10gbit, "
                        "25gbit or 800mbit\n", v);
                exit(2);
            }
            o->link = v;
        } else if ((v = opt_value(argc, argv, &i, "--psd")) != NULL) {
            o->psd = v;
        } else if ((v = opt_value(argc, argv, &i, "--sizes")) != NULL) {
            sizes = strdup(v);
        } else if ((v = opt_value(argc, argv, &i, "--streams")) != NULL) {
            streams = strdup(v);
        } else if ((v = opt_value(argc, argv, &i, "--seconds")) != NULL) {
            char *end;
            o->seconds = strtod(v, &end);
            if (*end != '\0' || !(o->seconds > 0 && o->seconds < 3600)) {
                fprintf(stderr, "pushpull: --seconds: '%s' is not a duration in "
                        "seconds (0 < S < 3600)\n", v);
                exit(2);
            }
        } else if ((v = opt_value(argc, argv, &i, "--tcp-bytes")) != NULL) {
            if (parse_size(v, &o->tcp_bytes) != 0 || o->tcp_bytes < (1 << 20)) {
                fprintf(stderr, "pushpull: --tcp-bytes: '%s' is not a size of at "
                        "least 1M\n", v);
                exit(2);
            }
        } else if ((v = opt_value(argc, argv, &i, "--psd-arg")) != NULL) {
            if (o->npsd_args == MAX_PSD_ARGS) {
                fprintf(stderr, "pushpull: at most %d --psd-arg\n", MAX_PSD_ARGS);
                exit(2);
            }
            o->psd_args[o->npsd_args++] = v;
        } else {
            fprintf(stderr, "pushpull: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            exit(2);
        }
    }
    if (o->psd == NULL)
        o->psd = find_default_psd();
    o->host = "127.0.0.1";
    if (o->link != NULL) {
        /* The case: 4 MiB, one stream. */
        o->sizes[0] = 4 << 20;
        o->nsizes = 1;
        o->streams[0] = 1;
        o->nstreams = 1;
        if (o->seconds < 0)
            o->seconds = quick ? 1 : 4;
    } else if (quick) {
        o->sizes[0] = 4 << 10;
        o->sizes[1] = 4 << 20;
        o->nsizes = 2;
        o->streams[0] = 1;
        o->nstreams = 1;
        if (o->seconds < 0)
            o->seconds = 1;
    } else {
        memcpy(o->sizes, full_sizes, sizeof full_sizes);
        o->nsizes = 4;
        memcpy(o->streams, full_streams, sizeof full_streams);
        o->nstreams = 3;
    }
    if (o->seconds < 0)
        o->seconds = 2;
    if (sizes != NULL && (o->nsizes = parse_list(sizes, size_item, o->sizes)) <= 0) {
        fprintf(stderr, "pushpull: --sizes: expected sizes like 4K,1M,4M,64M "
                "(multiples of 4 bytes, below 1 GiB)\n");
        exit(2);
    }
    if (streams != NULL &&
        (o->nstreams = parse_list(streams, stream_item, o->streams)) <= 0) {
        fprintf(stderr, "pushpull: --streams: expected counts like 1,2,4 (1..64)\n");
        exit(2);
    }
    free(sizes);
    free(streams);
}

/* ---- small helpers ------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile (0..1) of v, sorting it; nearest rank. */
double quantile(double *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t k = (size_t)(q * (double)(n - 1) + 0.5);
    return v[k < n ? k : n - 1];
}

const char *size_str(size_t bytes, char *buf, size_t len)
{
    if (bytes >= (1 << 30) && bytes % (1 << 30) == 0)
        snprintf(buf, len, "%zu GiB", bytes >> 30);
    else if (bytes >= (1 << 20) && bytes % (1 << 20) == 0)
        snprintf(buf, len, "%zu MiB", bytes >> 20);
    else if (bytes >= (1 << 10) && bytes % (1 << 10) == 0)
        snprintf(buf, len, "%zu KiB", bytes >> 10);
    else
        snprintf(buf, len, "%zu B", bytes);
    return buf;
}

int samples_add(struct samples *s, double x)
{
    if (ps_buf_reserve(&s->b, (s->n + 1) * sizeof *s->v) != 0)
        return -ENOMEM;
    s->v = (double *)s->b.data;
    s->v[s->n++] = x;
    return 0;
}

/* ---- ceilings: loopback TCP and memcpy ---------------------------------- */

struct tcp_side {
    int fd;
    size_t total;
    size_t chunk;
    uint8_t *buf;
    double t0, t1; /* sender: first write; receiver: last byte */
    int err;
};

static void *tcp_sender(void *arg)
{
    struct tcp_side *t = arg;
    t->t0 = ps_now_s();
    size_t left = t->total;
    while (left > 0) {
        size_t n = left < t->chunk ? left : t->chunk;
        ssize_t w = write(t->fd, t->buf, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            t->err = errno;
            break;
        }
        left -= (size_t)w;
    }
    shutdown(t->fd, SHUT_WR);
    return NULL;
}

static void *tcp_receiver(void *arg)
{
    struct tcp_side *t = arg;
    size_t got = 0;
    while (got < t->total) {
        ssize_t r = read(t->fd, t->buf, t->chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            t->err = r < 0 ? errno : EPIPE;
            break;
        }
        got += (size_t)r;
    }
    t->t1 = ps_now_s();
    return NULL;
}

/* One transfer of `total` bytes over a fresh 127.0.0.1 connection, by a
 * sender thread and a receiver thread. Returns GB/s, or a negative errno. */
static double tcp_once(size_t total, uint8_t *sbuf, uint8_t *rbuf, size_t chunk)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    double result = -EIO;
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    if (lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 &&
        listen(lfd, 1) == 0 && getsockname(lfd, (struct sockaddr *)&a, &alen) == 0)
        result = tcp_once_on(lfd, &a, total, sbuf, rbuf, chunk);
    if (lfd >= 0)
        close(lfd);
    return result;
}

double tcp_once_on(int lfd, const struct sockaddr_in *a, size_t total, uint8_t *sbuf,
                   uint8_t *rbuf, size_t chunk)
{
    int cfd = -1, afd = -1;
    double result = -EIO;
    cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (cfd < 0 || connect(cfd, (const struct sockaddr *)a, sizeof *a) != 0)
        goto close_fds;
    afd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (afd < 0)
        goto close_fds;
    struct tcp_side tx = {.fd = cfd, .total = total, .chunk = chunk, .buf = sbuf};
    struct tcp_side rx = {.fd = afd, .total = total, .chunk = chunk, .buf = rbuf};
    pthread_t ts, tr;
    if (pthread_create(&tr, NULL, tcp_receiver, &rx) != 0)
        goto close_fds;
    if (pthread_create(&ts, NULL, tcp_sender, &tx) != 0) {
        shutdown(afd, SHUT_RDWR);
        pthread_join(tr, NULL);
        goto close_fds;
    }
    pthread_join(ts, NULL);
    pthread_join(tr, NULL);
    if (tx.err == 0 && rx.err == 0 && rx.t1 > tx.t0)
        result = (double)total / (rx.t1 - tx.t0) / 1e9;
close_fds:
    if (afd >= 0)
        close(afd);
    if (cfd >= 0)
        close(cfd);
    return result;
}


/* Measures both ceilings, or with `recheck` only TCP again into tcp_end_*.
 * Returns 0, -ENOMEM, or the socket error. */
int measure_ceilings(const struct opts *o, struct ceilings *c, bool recheck)
{
    const size_t chunk = (size_t)4 << 20;
    const size_t mbytes = (size_t)64 << 20;
    int rc = -ENOMEM;
    uint8_t *sbuf = aligned_alloc(4096, chunk);
    uint8_t *rbuf = aligned_alloc(4096, chunk);
    uint8_t *src = recheck ? NULL : aligned_alloc(4096, mbytes);
    uint8_t *dst = recheck ? NULL : aligned_alloc(4096, mbytes);
    if (sbuf == NULL || rbuf == NULL || (!recheck && (src == NULL || dst == NULL)))
        goto free_bufs;
    memset(sbuf, 0x5a, chunk);
    memset(rbuf, 0, chunk);
    double runs[5];
    double *tcp_runs = recheck ? c->tcp_end_runs : c->tcp_runs;
    for (int i = 0; i < 3; i++) {
        tcp_runs[i] = tcp_once(o->tcp_bytes, sbuf, rbuf, chunk);
        if (tcp_runs[i] < 0) {
            rc = (int)tcp_runs[i];
            goto free_bufs;
        }
        runs[i] = tcp_runs[i];
    }
    *(recheck ? &c->tcp_end_gbps : &c->tcp_gbps) = quantile(runs, 3, 0.5);
    if (recheck) {
        rc = 0;
        goto free_bufs;
    }

    /* Warm: both buffers faulted in and one copy made before timing. */
    memset(src, 0x3c, mbytes);
    memset(dst, 0, mbytes);
    memcpy(dst, src, mbytes);
    for (int i = 0; i < 5; i++) {
        src[i] = (uint8_t)i;
        double t0 = ps_now_s();
        memcpy(dst, src, mbytes);
        double t1 = ps_now_s();
        c->memcpy_runs[i] = (double)mbytes / (t1 - t0) / 1e9;
        runs[i] = c->memcpy_runs[i];
    }
    if (dst[4] != 4) /* keeps the copies observable */
        fprintf(stderr, "pushpull: memcpy check failed\n");
    c->memcpy_gbps = quantile(runs, 5, 0.5);
    rc = 0;
free_bufs:
    free(sbuf);
    free(rbuf);
    free(src);
    free(dst);
    return rc;
}

/* ---- psd as a child process --------------------------------------------- */

/* What the signal thread takes down if we are interrupted: psd and its
 * temporary directory. Set by main's thread only. */
_Atomic pid_t live_psd;
char live_root[256];


/* Waits for SIGINT, SIGTERM or SIGHUP (blocked in every other thread), then
 * kills psd, removes its directory and exits as if killed by the signal. */
void *signal_main(void *arg)
{
    sigset_t *set = arg;
    int sig = 0;
    sigwait(set, &sig);
    fprintf(stderr, "pushpull: interrupted by signal %d; stopping psd\n", sig);
    pid_t pid = atomic_exchange(&live_psd, 0);
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        if (live_root[0] != '\0')
            nftw(live_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    link_cleanup_now();
    _exit(128 + sig);
}

int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void print_log_tail(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[1024];
    char tail[20][1024];
    int n = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        snprintf(tail[n % 20], sizeof tail[0], "%s", line);
        n++;
    }
    fclose(f);
    for (int i = n > 20 ? n - 20 : 0; i < n; i++)
        fprintf(stderr, "  psd: %s", tail[i % 20]);
}

/* Reads psd's stdout until "PORT <n>", psd exits, or 30 s pass. */
static int read_port(struct psd_proc *p)
{
    char buf[512];
    size_t len = 0;
    double until = ps_now_s() + 30;
    while (ps_now_s() < until) {
        struct pollfd pfd = {.fd = p->out_fd, .events = POLLIN};
        int pr = poll(&pfd, 1, 200);
        if (pr < 0 && errno != EINTR)
            return -errno;
        if (pr <= 0)
            continue;
        ssize_t r = read(p->out_fd, buf + len, sizeof buf - 1 - len);
        if (r <= 0)
            return PS_EUNAVAIL; /* psd exited before serving */
        len += (size_t)r;
        buf[len] = '\0';
        char *at = strstr(buf, "PORT ");
        if (at != NULL && strchr(at, '\n') != NULL) {
            p->port = atoi(at + 5);
            return p->port > 0 ? 0 : PS_EPARSE;
        }
        if (len == sizeof buf - 1)
            len = 0;
    }
    return PS_ETIMEDOUT;
}

/* --shm: psd's unix socket, the only way psd takes shared memory. */
char shm_sock[sizeof(((struct psd_proc *)0)->root) + 16];

/* Starts psd on 127.0.0.1:0 with a fresh data directory (and, with --shm,
 * its unix socket in it). On failure the directory is removed and psd's
 * log tail printed. */
int psd_start(const struct opts *o, struct psd_proc *p)
{
    memset(p, 0, sizeof *p);
    p->pid = -1;
    p->out_fd = -1;
    const char *tmp = getenv("TMPDIR");
    snprintf(p->root, sizeof p->root, "%s/pushpull.XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(p->root) == NULL)
        return -errno;
    snprintf(p->data, sizeof p->data, "%s/data", p->root);
    snprintf(p->log, sizeof p->log, "%s/psd.log", p->root);
    int rc = 0;
    int pipefd[2] = {-1, -1};
    if (mkdir(p->data, 0700) != 0 || pipe2(pipefd, O_CLOEXEC) != 0) {
        rc = -errno;
        goto remove_root;
    }
    const char *argv[12 + MAX_PSD_ARGS];
    int argc = 0;
    argv[argc++] = o->psd;
    char listen_at[64];
    snprintf(listen_at, sizeof listen_at, "%s:0", o->host);
    argv[argc++] = "--listen";
    argv[argc++] = listen_at;
    if (o->psd_netns != NULL)
        argv[argc++] = "--insecure"; /* a link of two namespaces of one host */
    argv[argc++] = "--data-dir";
    argv[argc++] = p->data;
    if (o->shm) {
        snprintf(shm_sock, sizeof shm_sock, "%s/psd.sock", p->root);
        argv[argc++] = "--local-socket";
        argv[argc++] = shm_sock;
    }
    for (int i = 0; i < o->npsd_args; i++)
        argv[argc++] = o->psd_args[i];
    argv[argc] = NULL;

    pid_t parent = getpid();
    p->pid = fork();
    if (p->pid < 0) {
        rc = -errno;
        goto close_pipe;
    }
    if (p->pid == 0) {
        int logfd = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (logfd < 0 || dup2(pipefd[1], 1) < 0 || dup2(logfd, 2) < 0)
            _exit(127);
        /* psd must not outlive the benchmark, whatever kills it; and it
         * gets our blocked stop signals back (a mask survives exec). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (getppid() != parent)
            _exit(127);
        if (o->psd_netns != NULL && link_enter(o->psd_netns) != 0) {
            dprintf(2, "pushpull: cannot enter network namespace %s\n", o->psd_netns);
            _exit(127);
        }
        execv(o->psd, (char *const *)argv);
        dprintf(2, "pushpull: cannot run %s: %s\n", o->psd, strerror(errno));
        _exit(127);
    }
    snprintf(live_root, sizeof live_root, "%s", p->root);
    atomic_store(&live_psd, p->pid);
    close(pipefd[1]);
    pipefd[1] = -1;
    p->out_fd = pipefd[0];
    rc = read_port(p);
    if (rc == 0)
        return 0;
    fprintf(stderr, "pushpull: psd (%s) did not start serving: %s\n", o->psd,
            ps_strerror(rc));
    atomic_store(&live_psd, 0);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    print_log_tail(p->log);
close_pipe:
    if (pipefd[0] >= 0)
        close(pipefd[0]);
    if (pipefd[1] >= 0)
        close(pipefd[1]);
    p->out_fd = -1;
remove_root:
    nftw(p->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}

/* A "Name:  N kB" line of /proc/<pid>/status, in bytes; 0 if unreadable. */
uint64_t proc_status_bytes(pid_t pid, const char *name)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    uint64_t kb = 0;
    size_t n = strlen(name);
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, name, n) == 0 && line[n] == ':') {
            kb = strtoull(line + n + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb * 1024;
}

/* SIGTERM, up to 30 s for the drain and final flush, then SIGKILL; removes
 * the temporary directory. Returns psd's exit status, or -1 if killed. */
int psd_stop(struct psd_proc *p)
{
    int status = 0, result = -1;
    if (p->pid > 0 && atomic_exchange(&live_psd, 0) == p->pid) {
        kill(p->pid, SIGTERM);
        double until = ps_now_s() + 30;
        pid_t w;
        while ((w = waitpid(p->pid, &status, WNOHANG)) == 0 && ps_now_s() < until) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (w == 0) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
        }
        if (w > 0 && WIFEXITED(status))
            result = WEXITSTATUS(status);
        p->pid = -1;
    }
    if (p->out_fd >= 0)
        close(p->out_fd);
    p->out_fd = -1;
    if (result != 0)
        print_log_tail(p->log);
    if (p->root[0] != '\0')
        nftw(p->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return result;
}
