/*
 * pushpull.h - what bench/pushpull.c (the cases, their output and main) and
 * bench/pushpull_env.c (its options, the TCP and memcpy ceilings, and psd as
 * a child process) share. See pushpull.c's opening comment for the bench.
 *
 * Threads and lifetime: the options are parsed once before any thread
 * starts; live_psd and live_root are set by main's thread and read by the
 * signal thread (signal_main).
 */
#ifndef BENCH_PUSHPULL_H
#define BENCH_PUSHPULL_H

#include "common/auth.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/errors.h"
#include "proto/ps.pb-c.h"
#include "common/psclient.h"
#include "common/rpc.h"
#include "common/shm.h"
#include "common/tls.h"
#include "common/wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define METHOD_PUSH "/ps.v1.ParameterServer/Push"
#define METHOD_PULL "/ps.v1.ParameterServer/Pull"
#define METHOD_CREATE "/ps.v1.ParameterServer/CreateVariable"
#define METHOD_STATS "/ps.v1.ParameterServer/Stats"

/* The target: 4 MiB push+pull at least this share of raw TCP. */
#define TARGET_RATIO 0.55
#define TARGET_BYTES ((size_t)4 << 20)

#define MAX_LIST 16
#define MAX_PSD_ARGS 16
struct opts {
    const char *psd;
    size_t sizes[MAX_LIST];
    int nsizes;
    int streams[MAX_LIST];
    int nstreams;
    double seconds;           /* timed phases of one case, together */
    bool json;
    bool misalign;            /* put the gradient bytes off a float boundary */
    bool raw;                 /* hand-built request reused as is, not psclient */
    bool shm;                 /* tensors through shared memory (workerd's way
                                 with a psd on its host) */
    const char *psd_args[MAX_PSD_ARGS];
    int npsd_args;
    size_t tcp_bytes;
    const char *pscerts;      /* NULL: <build>/tools/pscerts */
    bool no_tls;              /* skip the TLS comparison */
    const ps_tls_opts *tls;   /* the clients' TLS (the TLS case only) */
    const char *host;         /* psd's address: 127.0.0.1, or its link end */
    const char *link;         /* --link RATE as given, or NULL */
    double link_gbit;         /* its rate in Gbit/s */
    const char *psd_netns;    /* psd runs in this network namespace, or NULL */
    int wire_dtype;           /* psclient streams: 0 float32, 2 FLOAT16, 3
                                 BFLOAT16 (with error feedback) */
    bool pieces_set;          /* --pieces or --window given: psclient streams
                                 use these (ps_client_set_pieces) */
    size_t piece_bytes;       /* 0: one call per tensor */
    int piece_window;         /* 0: 4 */
};

/* A growable array of samples in seconds: v[n] in the buffer's memory. */
struct samples {
    ps_buf b;
    double *v;
    size_t n;
};

struct ceilings {
    double tcp_gbps;      /* median of 3, before the cases: the ratios' base */
    double tcp_runs[3];
    double memcpy_gbps;   /* median of 5 */
    double memcpy_runs[5];
    double tcp_end_gbps;  /* median of 3 again after the cases: a drift check */
    double tcp_end_runs[3];
    double echo_ms;       /* --link: raw TCP 4 MiB there and back, median */
    double echo_half_ms;  /* the same with 2 MiB: half precision's bytes */
};

struct psd_proc {
    pid_t pid;
    int out_fd;           /* psd's stdout, kept open until it exits */
    int port;
    char root[256];       /* mkdtemp: data/ and psd.log inside */
    char data[300];
    char log[300];
};

/* Options (--token-file's token in bench_token); exits 2 on bad ones. */
void parse_opts(int argc, char **argv, struct opts *o);
extern char bench_token[PS_AUTH_TOKEN_MAX + 1];

/* Small helpers (the clock is ps_now_s): the q-quantile of v (sorting it),
 * a size as text, a sample appended (-ENOMEM). */
double quantile(double *v, size_t n, double q);
const char *size_str(size_t bytes, char *buf, size_t len);
int samples_add(struct samples *s, double x);

/* Both ceilings, or with recheck only TCP again (tcp_end_*). Returns 0,
 * -ENOMEM, or the socket error. */
int measure_ceilings(const struct opts *o, struct ceilings *c, bool recheck);

/* psd as a child process on 127.0.0.1:0 in a fresh directory, its unix
 * socket (--shm) in shm_sock; the VmRSS-style field `name` of
 * /proc/PID/status in bytes; nftw's callback that removes a tree. */
int psd_start(const struct opts *o, struct psd_proc *p);
int psd_stop(struct psd_proc *p);
extern char shm_sock[sizeof(((struct psd_proc *)0)->root) + 16];
uint64_t proc_status_bytes(pid_t pid, const char *name);
int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw);

/* One transfer of total bytes, from a fresh connection to the listener lfd
 * at a, by a sender and a receiver thread. Returns GB/s, or -errno. */
struct sockaddr_in;
double tcp_once_on(int lfd, const struct sockaddr_in *a, size_t total, uint8_t *sbuf,
                   uint8_t *rbuf, size_t chunk);

/* --link (pushpull_link.c). link_parse_rate: "10gbit" -> 10 (0, or -1).
 * link_setup: the two namespaces, the veth pair and tbf; returns 0, 77
 * (not root, or no ip/tc) or 1, with err set. link_enter: this thread into
 * the namespace (0 or -errno). link_tcp_ceiling: raw TCP from the client's
 * namespace to psd's (0 or -errno). link_tcp_echo: raw TCP requests of
 * `bytes` answered with as many, the median in ms (0 or -errno).
 * link_cleanup_now: removes both namespaces if they exist (from any
 * thread). */
int link_parse_rate(const char *s, double *gbit);
int link_setup(const char *rate, char *err, size_t errlen);
int link_enter(const char *ns);
const char *link_psd_netns(void);
const char *link_psd_host(void);
const char *link_client_netns(void);
int link_tcp_ceiling(const struct opts *o, double runs[3], double *median);
int link_tcp_echo(size_t bytes, int rounds, double *ms);
void link_cleanup_now(void);

/* What the signal thread (signal_main, given the blocked set) takes down if
 * we are interrupted. */
extern _Atomic pid_t live_psd;
extern char live_root[256];
void *signal_main(void *arg);

#endif
