/*
 * psd - the parameter-server daemon: one shard of model variables in LMDB,
 * served over gRPC (ps.v1.ParameterServer and grpc.health.v1.Health).
 *
 * Prints "PORT <n>" on stdout once it serves (so scripts and tests can start
 * it on port 0), then "METRICS_PORT <n>" when it serves Prometheus' /metrics
 * (--metrics-listen), logs one line per event on stderr, and on SIGTERM or
 * SIGINT drains the calls in flight, flushes everything acknowledged to LMDB
 * and exits 0. SIGHUP reloads the --tokens file.
 */
#include "common/auth.h"
#include "common/cluster.h"
#include "common/conf.h"
#include "common/daemon.h"
#include "common/coordclient.h"
#include "proto/ps.pb-c.h"
#include "common/errors.h"
#include "common/hostid.h"
#include "common/log.h"
#include "common/metrics_http.h"
#include "common/notify.h"
#include "common/probe.h"
#include "common/proc.h"
#include "ps_config.h"
#include "common/rpc.h"
#include "common/tls.h"
#include "server/shard.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>

struct psd_conf {
    char *listen;
    char *local_socket;
    char *data_dir;
    char *checkpoint_root;
    char *coordinator;
    char *job_id;
    int task_index;
    char *advertise;
    int threads;
    uint64_t max_message;
    int consistency;
    int workers;
    int max_sync_workers;
    int64_t commit_interval_ms;
    bool durable;
    bool allow_nonfinite;
    uint64_t map_size;
    uint64_t map_size_max;
    int checkpoint_keep;
    int64_t shutdown_grace_ms;
    int max_variables;
    uint64_t max_bytes;
    int max_waiting_pulls;
    int64_t max_pull_wait_ms;
    int64_t worker_timeout_ms;
    int max_streams;
    int max_connections;
    int64_t handshake_timeout_ms;
    int64_t idle_timeout_ms;
    int64_t keepalive_ms;
    int64_t probe_interval_ms;
    uint64_t memory_limit;
    uint64_t max_rows_per_table;
    uint64_t segment_size;
    uint64_t compact_rate;
    ps_daemon_conf common; /* --metrics-*, --tls-*, --tokens, --log-* */
};

static const char *const consistency_choices[] = {"async", "sync", NULL};

/* Defaults, each with why. */
static const ps_opt psd_opts[] = {
    {"listen", PS_OPT_STRING, offsetof(struct psd_conf, listen), NULL,
     "host:port to serve on; port 0 picks a free one (printed as PORT <n>); "
     "or unix:PATH, a unix socket for workers on this host (no TCP stack; "
     "PORT 0); an address other than loopback needs TLS or --insecure; "
     "default: this ps task's address in TF_CONFIG, else 127.0.0.1:7070",
     0, 0, NULL},
    /* auto: a worker on this host given the TCP address finds the socket
     * in Stats and moves tensors through shared memory, with nothing to
     * set; the data directory is psd's own (locked), so the path is too. */
    {"local-socket", PS_OPT_STRING, offsetof(struct psd_conf, local_socket), "auto",
     "also serve on this unix socket path, for workers on this host: no TCP "
     "stack on their data path, and shared memory; advertised in Stats with "
     "the host id, so that workerd, libpsclient and Python given the TCP "
     "address switch to it; auto = psd.sock in the data directory (none when "
     "that path is too long for a socket); off = none", 0, 0, NULL},
    {"data-dir", PS_OPT_STRING, offsetof(struct psd_conf, data_dir), NULL,
     "directory of the LMDB store and checkpoints/ (required)", 0, 0, NULL},
    {"checkpoint-root", PS_OPT_STRING, offsetof(struct psd_conf, checkpoint_root), NULL,
     "checkpoints go to DIR/checkpoints/<step> (default: the data dir); put it "
     "where it outlives the data dir, so a wiped shard can be restored", 0, 0, NULL},
    {"coordinator", PS_OPT_STRING, offsetof(struct psd_conf, coordinator), NULL,
     "pscoord host:port to register with as a ps task (default: TF_CONFIG's "
     "chief, else none: standalone)", 0, 0, NULL},
    {"job-id", PS_OPT_STRING, offsetof(struct psd_conf, job_id), "job",
     "the job this shard belongs to (checked by the coordinator)", 0, 0, NULL},
    {"task-index", PS_OPT_INT, offsetof(struct psd_conf, task_index), "-1",
     "this shard's ps index (-1: the coordinator assigns one)", -1, 65535, NULL},
    {"advertise", PS_OPT_STRING, offsetof(struct psd_conf, advertise), NULL,
     "host:port others reach this shard at (default: the listen host, "
     "127.0.0.1 for 0.0.0.0, with the bound port)", 0, 0, NULL},
    /* Two completion-queue threads keep both cores of a small host busy. */
    /* 1: a call then stays on the thread that read it. With more, gRPC
     * hands about half the calls to another thread's queue, a wake-up
     * each: measured here, 4 MiB push+pull 3.2-3.4 ms with 1, 4.0-4.4 ms
     * with 2; at 4 concurrent 4 MiB streams 2 threads gave ~10% more.
     * Big pushes use a second core anyway (assist.c). */
    {"threads", PS_OPT_INT, offsetof(struct psd_conf, threads), "1",
     "gRPC completion-queue threads: 1 gives each call the lowest latency; "
     "more serve many concurrent workers on a big host", 1, 64, NULL},
    /* 1 GiB: no tensor meets gRPC's 4 MiB default. */
    {"max-message", PS_OPT_SIZE, offsetof(struct psd_conf, max_message), "1G",
     "largest message accepted or sent (bounds a variable's size)", 1024, 2147483647.0, NULL},
    {"consistency", PS_OPT_ENUM, offsetof(struct psd_conf, consistency), "async",
     "default for variables whose spec leaves it unset: async or sync", 0, 0,
     consistency_choices},
    {"workers", PS_OPT_INT, offsetof(struct psd_conf, workers), "1",
     "sync: pushes aggregated per step when a spec says 0", 1, 65536, NULL},
    /* 1024: beyond any job we know of, and a bound a caller that creates a
     * SYNC variable cannot raise (SetSyncWorkers is capped by the specs). */
    {"max-sync-workers", PS_OPT_INT, offsetof(struct psd_conf, max_sync_workers), "1024",
     "sync: the most workers a variable's num_workers may name, and so the most "
     "SetSyncWorkers may ask for (at least --workers)", 1, 65536, NULL},
    /* 20 ms: a kill -9 loses at most ~20 ms of acknowledged pushes while
     * group commits stay cheap next to the pushes they batch. */
    {"commit-interval", PS_OPT_DURATION_MS, offsetof(struct psd_conf, commit_interval_ms),
     "20ms", "write-behind period: how often changed variables are committed to LMDB",
     1, 60000, NULL},
    {"durable", PS_OPT_BOOL, offsetof(struct psd_conf, durable), "false",
     "acknowledge a push only once it is committed to LMDB", 0, 0, NULL},
    {"allow-nonfinite", PS_OPT_BOOL, offsetof(struct psd_conf, allow_nonfinite), "false",
     "accept gradients holding NaN or Inf (refused by default)", 0, 0, NULL},
    /* 64 GiB of address space, not memory: LMDB maps it sparsely. */
    {"map-size", PS_OPT_SIZE, offsetof(struct psd_conf, map_size), "64G",
     "the LMDB map's first size; a full map doubles, up to --map-size-max",
     1048576.0, 1e15, NULL},
    {"map-size-max", PS_OPT_SIZE, offsetof(struct psd_conf, map_size_max), "0",
     "the most the LMDB map may grow to; 0: the data file plus its disk's free space",
     0, 1e15, NULL},
    {"checkpoint-keep", PS_OPT_INT, offsetof(struct psd_conf, checkpoint_keep), "5",
     "complete checkpoints kept (0 keeps all)", 0, 1000000, NULL},
    {"shutdown-grace", PS_OPT_DURATION_MS, offsetof(struct psd_conf, shutdown_grace_ms),
     "10s", "how long SIGTERM waits for calls in flight before cancelling them",
     0, 600000, NULL},
    /* The caps: what any client may make psd hold (server/limits.c). Each
     * is far above what a job needs and far below what exhausts a host. */
    /* 65536: a big model has a few thousand variables per shard; each
     * costs a commit (an fsync) to create and a look at every flush. */
    {"max-variables", PS_OPT_INT, offsetof(struct psd_conf, max_variables), "65536",
     "most variables this psd holds; a CreateVariable beyond is refused "
     "(RESOURCE_EXHAUSTED)", 1, 16777216, NULL},
    /* 0, half of physical memory: variables live in memory, and a restart
     * holds their LMDB pages beside them while it loads (about twice the
     * bytes), which must still fit. */
    /* 0: plan for the host's memory, or psd's memory cgroup's limit. */
    {"memory-limit", PS_OPT_SIZE, offsetof(struct psd_conf, memory_limit), "0",
     "memory psd's sparse tables plan for, e.g. 4G: their RAM tier of rows "
     "is kept under it less 88M or a fifth, whichever is more, at least a quarter "
     "(the rest of the rows are read from their segment files with O_DIRECT); run "
     "psd in a memory cgroup of this size to bound it; 0: the host's physical "
     "memory, or psd's memory cgroup's limit when lower", 0, 1e18, NULL},
    {"max-bytes", PS_OPT_SIZE, offsetof(struct psd_conf, max_bytes), "0",
     "most bytes the variables hold (values, optimizer slots, sync "
     "aggregates, sparse tables' rows with their slots), e.g. 16G; a "
     "CreateVariable or a SparsePush beyond is refused (RESOURCE_EXHAUSTED); "
     "0: half of this host's physical memory", 0, 1e18, NULL},
    /* 0: a row of at least 64 bytes stored (head, a float, its key and
     * LMDB's node) on at most half of the disk and memory psd plans for. */
    {"max-rows-per-table", PS_OPT_UINT64, offsetof(struct psd_conf, max_rows_per_table), "0",
     "most rows a sparse table holds, and the highest max_rows a spec may ask; "
     "a SparsePush whose new rows pass it is refused whole (RESOURCE_EXHAUSTED); "
     "0: (free disk of --data-dir + --memory-limit) / 128", 0, 0, NULL},
    /* 256M: a segment compacted is read and rewritten whole, a few seconds
     * at the compaction's rate; fewer, larger files would hold dead bytes
     * longer. */
    {"segment-size", PS_OPT_SIZE, offsetof(struct psd_conf, segment_size), "256M",
     "size past which a segment file of sparse rows is sealed (and may be "
     "compacted once a third of it is dead)", 65536, 1e15, NULL},
    /* 32M: a tenth of a common SSD's write rate, so that compaction never
     * crowds out the appends and cold reads of the calls. */
    {"compact-rate", PS_OPT_SIZE, offsetof(struct psd_conf, compact_rate), "32M",
     "bytes a second compaction of the segment files reads and writes at "
     "most", 65536, 1e15, NULL},
    /* 4096: each worker waits on about one pull per shard at a time;
     * thousands of workers per shard is beyond any job psd serves. */
    {"max-waiting-pulls", PS_OPT_INT, offsetof(struct psd_conf, max_waiting_pulls),
     "4096", "most pulls waiting for a version at once; one beyond is refused "
     "at once (RESOURCE_EXHAUSTED)", 1, 1000000, NULL},
    /* 60 s: a sync step waits for the slowest worker, seconds at most; a
     * pull still waiting after a minute waits for a worker that is gone
     * (workerd's own deadline, --rpc-timeout, is 10 s). */
    {"max-pull-wait", PS_OPT_DURATION_MS, offsetof(struct psd_conf, max_pull_wait_ms),
     "60s", "longest a pull waits for a version before psd answers "
     "DEADLINE_EXCEEDED, whatever deadline its client set", 1, 86400000, NULL},
    /* 10 s: a worker's step takes well under a second; ten seconds of
     * silence is a worker gone, not a slow one (pscoord's heartbeat
     * timeout is 3 s; its workers pull every step). */
    {"worker-timeout", PS_OPT_DURATION_MS, offsetof(struct psd_conf, worker_timeout_ms),
     "10s", "BOUNDED_STALENESS: a worker not heard from (no pull) this long "
     "stops holding the faster ones back", 1, 86400000, NULL},
    /* 256: a worker runs a few calls at a time on a connection (its comm
     * threads, a waiting pull); one connection may not hold thousands. */
    {"max-streams", PS_OPT_INT, offsetof(struct psd_conf, max_streams), "256",
     "most calls in flight on one connection (HTTP/2 max concurrent "
     "streams; a client queues the ones beyond)", 1, 1000000, NULL},
    /* Connections (issue 13 d): what holds a descriptor for nothing is
     * closed, and a listener that stops accepting is found and psd exits
     * to be restarted (server/psd.c's probe, common/probe.h). */
    /* 0: half the descriptor limit, which leaves the other half for the
     * TCP connections, LMDB, checkpoints and the metrics endpoint. */
    {"max-connections", PS_OPT_INT, offsetof(struct psd_conf, max_connections), "0",
     "most connections open at once on the unix socket (--local-socket); one "
     "beyond is closed at once and counted; 0: half the descriptor limit",
     0, 1000000, NULL},
    /* 10 s: a client on any network sends its HTTP/2 preface in
     * milliseconds; one that does not only holds a descriptor. */
    {"handshake-timeout", PS_OPT_DURATION_MS,
     offsetof(struct psd_conf, handshake_timeout_ms), "10s",
     "a new connection that has not finished its HTTP/2 handshake by then is "
     "closed", 100, 3600000, NULL},
    /* 15 min: a worker calls many times a second; a connection with no
     * call for this long belongs to a client that is done (it reconnects
     * by itself if not). 0: never. */
    {"idle-timeout", PS_OPT_DURATION_MS, offsetof(struct psd_conf, idle_timeout_ms),
     "15min", "a connection with no call for this long is closed (its client "
     "reconnects when it calls again); 0: never", 0, 86400000, NULL},
    /* 60 s: finds a peer that vanished (a host that died holds its
     * connections open otherwise) within about a minute and a half. */
    {"keepalive", PS_OPT_DURATION_MS, offsetof(struct psd_conf, keepalive_ms), "60s",
     "ping each connection this often; one that does not answer within "
     "min(this, 20s) is closed; 0: no pings", 0, 86400000, NULL},
    /* 10 s: gRPC 1.51's listener stops accepting for good after running out
     * of descriptors once (grpc/grpc#20418); psd finds it within two
     * probes and exits 1 (systemd restarts it). */
    {"probe-interval", PS_OPT_DURATION_MS, offsetof(struct psd_conf, probe_interval_ms),
     "10s", "connect to the TCP listener this often; when two probes in a row "
     "are not answered (not counted while every gRPC thread has been handling a "
     "call for less than a minute), psd exits 1 with one line, to be restarted; "
     "0: no probe", 0, 3600000, NULL},
    PS_DAEMON_OPTS(struct psd_conf, common,
                   "file holding the token psd sends to --coordinator (a worker's); "
                   "default: none"),
    {0},
};

/* A re-registration tells the coordinator whether the shard holds state
 * now, not when psd started: else a restarted coordinator would restore a
 * shard that is training. */
static bool shard_empty(void *ctx)
{
    struct psd_shard_brief b;
    psd_shard_brief(ctx, &b);
    return b.variables == 0;
}

/* Everything main holds, so that each step takes one pointer and the
 * way out undoes what is there. */
struct psd {
    struct psd_conf c;
    ps_proc_cmd cmd;
    ps_proc_loop *loop;
    psd_shard *shard;
    ps_rpc_server *srv;
    ps_coord *coord;
    ps_metrics_http *metrics; /* NULL: --metrics-listen off */
    psd_metrics_src msrc;     /* what the metrics collector reads */
    ps_auth *auth;            /* --tokens; NULL: open */
    char token[PS_AUTH_TOKEN_MAX + 1]; /* --token-file's, or "" */
    char also[300]; /* "unix:PATH" of --local-socket, or "" */
    char local[300]; /* its absolute "unix:/PATH" for Stats and pscoord, or "" */
    char hostid[PS_HOST_ID_MAX]; /* this host's id (hostid.h), or "" */
    bool insecure;  /* a non-loopback address in plaintext (--insecure) */
    int port;
    int probe_failures; /* in a row (probe) */
    bool probe_failed;  /* probing is over ... */
    bool probe_exit;    /* ... because the listener stopped accepting: exit 1 */
};

/* The port of a host:port (or unix:PATH: -1). */
static int port_of(const char *addr)
{
    char host[256];
    int port;
    return ps_addr_split(addr, host, sizeof host, &port) == 0 ? port : -1;
}

/* TF_CONFIG, as TensorFlow's tasks read it: naming this task ps[i], psd
 * serves on that address's port, advertises it, and takes the index and
 * the job id; a chief in the cluster is the coordinator (pscoord does the
 * chief's duties). A flag left unset takes TF_CONFIG's value; a flag that
 * disagrees with it (another index, another port, another coordinator) is
 * refused with one line naming both, since one of the two is a mistake.
 * Returns PS_PROC_RUN, or 2 after the error line. */
static int tf_config_defaults(struct psd *d)
{
    struct psd_conf *c = &d->c;
    char err[512];
    ps_cluster tf;
    memset(&tf, 0, sizeof tf);
    int rc = ps_cluster_from_env(&tf, err, sizeof err);
    if (rc == PS_ENOTFOUND)
        return PS_PROC_RUN;
    if (rc != 0)
        return ps_proc_quit(&d->cmd, 2, "%s", err);
    int status = PS_PROC_RUN;
    if (tf.has_task && tf.task_role != PS_ROLE_PS) {
        status = ps_proc_quit(&d->cmd, 2, "TF_CONFIG names this task %s[%d], not ps",
                              ps_role_name(tf.task_role), tf.task_index);
        goto close;
    }
    const char *chief = ps_cluster_task_address(&tf, PS_ROLE_CHIEF, 0);
    if (chief != NULL && c->coordinator != NULL && c->coordinator[0] != '\0' &&
        strcmp(chief, c->coordinator) != 0) {
        status = ps_proc_quit(&d->cmd, 2, "TF_CONFIG's chief is %s but --coordinator "
                              "says %s", chief, c->coordinator);
        goto close;
    }
    if (chief != NULL && c->coordinator == NULL)
        c->coordinator = strdup(chief);
    if (tf.has_task) {
        const char *addr = ps_cluster_task_address(&tf, PS_ROLE_PS, tf.task_index);
        if (c->task_index >= 0 && c->task_index != tf.task_index) {
            status = ps_proc_quit(&d->cmd, 2, "TF_CONFIG names this task ps[%d] but "
                                  "--task-index says %lld", tf.task_index,
                                  (long long)c->task_index);
            goto close;
        }
        if (c->listen != NULL && port_of(c->listen) != port_of(addr)) {
            status = ps_proc_quit(&d->cmd, 2, "TF_CONFIG's ps[%d] is %s but --listen "
                                  "says %s", tf.task_index, addr, c->listen);
            goto close;
        }
        /* The task's own address, as given: a name or address others
         * reach it at, so not loopback unless the cluster is one host. */
        if (c->listen == NULL && addr != NULL)
            c->listen = strdup(addr);
        if (c->advertise == NULL)
            c->advertise = strdup(addr);
        if (c->task_index < 0)
            c->task_index = tf.task_index;
        if (tf.job_id != NULL && strcmp(c->job_id, "job") == 0) {
            free(c->job_id);
            c->job_id = strdup(tf.job_id);
        }
    }
close:
    ps_cluster_close(&tf);
    return status;
}

/* The loopback rule and the process's identity as a client (its calls to
 * pscoord); d->insecure says that --insecure was needed. Returns
 * PS_PROC_RUN, or 2 after the error line. */
static int transport(struct psd *d)
{
    const struct psd_conf *c = &d->c;
    char err[512];
    ps_tls_opts tls = ps_tls_opts_of(&c->common.tls);
    d->insecure = ps_tls_check_listen(c->listen, &tls, false, err, sizeof err) != 0;
    if ((d->insecure && !c->common.tls.insecure) ||
        ps_tls_check_files(&tls, err, sizeof err) != 0)
        return ps_proc_quit(&d->cmd, 2, "%s", err);
    if (ps_tls_set_client_default(&tls) != 0)
        return ps_proc_quit(&d->cmd, 1, "out of memory");
    if (d->insecure)
        ps_log_warn("--insecure: serving %s in plaintext: anyone who reaches it "
                    "can read and change every variable", c->listen);
    return PS_PROC_RUN;
}

/* --tokens (the table every call is checked against) and --token-file
 * (what psd sends to its coordinator). Returns PS_PROC_RUN, or 2 after one
 * line naming the file (and line). */
static int load_tokens(struct psd *d)
{
    return ps_daemon_load_tokens(&d->cmd, &d->c.common, d->c.listen, &d->auth, d->token,
                                 sizeof d->token);
}

/* --max-bytes 0: half of the host's physical memory (see psd_opts). */
static uint64_t half_of_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || size <= 0)
        return (uint64_t)16 << 30; /* unknown: a common host's */
    return (uint64_t)pages * (uint64_t)size / 2;
}

/* The memory psd may use: the host's physical memory, or the limit of its
 * memory cgroup (v1 memory.limit_in_bytes, v2 memory.max) when lower.
 * --memory-limit 0 plans the sparse tables' RAM tier for it. */
static uint64_t memory_available(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    uint64_t mem = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size
                                         : (uint64_t)1 << 30;
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[512], path[700];
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        char *rel = strchr(line, ':') ? strchr(strchr(line, ':') + 1, ':') : NULL;
        if (rel == NULL)
            continue;
        rel[strcspn(rel, "\n")] = '\0';
        if (strncmp(line, "0::", 3) == 0)
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", rel + 1);
        else if (strstr(line, ":memory:") != NULL)
            snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes",
                     rel + 1);
        else
            continue;
        FILE *m = fopen(path, "r");
        unsigned long long v = 0;
        if (m != NULL && fscanf(m, "%llu", &v) == 1 && v > 0 && v < mem)
            mem = v; /* "max" (v2) and v1's huge "no limit" do not parse or are above */
        if (m != NULL)
            fclose(m);
    }
    if (f != NULL)
        fclose(f);
    return mem;
}

/* --max-rows-per-table 0: (free disk + memory) / 128, at least a million. */
static uint64_t rows_per_table(const char *dir, uint64_t memory)
{
    struct statvfs v;
    uint64_t disk = statvfs(dir, &v) == 0 ? (uint64_t)v.f_bavail * v.f_frsize : 0;
    uint64_t rows = (disk + memory) / 128;
    return rows < 1000000 ? 1000000 : rows;
}

/* Opens the store (and starts the shard's threads). Returns 0, or 1 after
 * the error line. */
static int open_shard(struct psd *d, uint64_t *base_rss)
{
    const struct psd_conf *c = &d->c;
    ps_tls_opts tls = ps_tls_opts_of(&c->common.tls);
    psd_shard_opts so = {
        .data_dir = c->data_dir,
        .checkpoint_root = c->checkpoint_root,
        .map_size = c->map_size,
        .map_size_max = c->map_size_max,
        .consistency = c->consistency == 1 ? PSD_SYNC : PSD_ASYNC,
        .workers = (uint32_t)c->workers,
        .max_sync_workers = (uint32_t)c->max_sync_workers,
        .commit_interval_ms = (int)c->commit_interval_ms,
        .durable = c->durable,
        .allow_nonfinite = c->allow_nonfinite,
        .max_message_bytes = (size_t)c->max_message,
        .checkpoint_keep = (size_t)c->checkpoint_keep,
        .max_variables = (size_t)c->max_variables,
        .max_bytes = c->max_bytes != 0 ? c->max_bytes : half_of_memory(),
        .max_waiting_pulls = (size_t)c->max_waiting_pulls,
        .max_pull_wait_ms = c->max_pull_wait_ms,
        .insecure = d->insecure,
        .transport_security = ps_tls_server_mode(&tls),
        .worker_timeout_ms = c->worker_timeout_ms,
        .tokens_required = d->auth != NULL,
        .memory_limit = c->memory_limit != 0 ? c->memory_limit : memory_available(),
        .local_address = d->local,
        .host_id = d->hostid,
    };
    so.segment_size = c->segment_size;
    so.compact_rate = c->compact_rate;
    so.max_rows_per_table = c->max_rows_per_table != 0
                                ? c->max_rows_per_table
                                : rows_per_table(c->data_dir, so.memory_limit);
    *base_rss = psd_rss_bytes();
    char why[1024] = "";
    so.why = why;
    so.whylen = sizeof why;
    int rc = psd_shard_open(&so, &d->shard);
    if (rc != 0) {
        /* One line: what is damaged and where, when the store says. */
        fprintf(stderr, "psd: cannot open the data directory %s: %s\n", c->data_dir,
                why[0] ? why : ps_strerror(rc));
        return 1;
    }
    ps_log_info("caps: %zu variables, %.1f GiB held, %llu rows per sparse table, %zu "
                "waiting pulls for at most %lld ms, %d calls per connection",
                so.max_variables, (double)so.max_bytes / (1 << 30),
                (unsigned long long)so.max_rows_per_table, so.max_waiting_pulls,
                (long long)so.max_pull_wait_ms, c->max_streams);
    return 0;
}

/* Whether a unix socket can be made at path: one there already (a stale
 * one is replaced when psd binds), or a test bind that succeeds (the file
 * is removed again). A data directory on a filesystem without sockets
 * says no here, so that the default does not stop psd from starting. */
static bool socket_possible(const char *path, char *why, size_t whylen)
{
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            snprintf(why, whylen, "%s exists and is not a socket", path);
        return S_ISSOCK(st.st_mode);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    if (!ok)
        snprintf(why, whylen, "%s: %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    if (ok)
        unlink(path);
    return ok;
}

/* --local-socket as a second listen address in d->also, and its absolute
 * address and the host id in d->local and d->hostid for Stats and pscoord.
 * auto is psd.sock in the data directory, unless psd listens on a unix
 * socket already or that path is too long for one (a warning: workers then
 * use TCP). Returns 0, or 2 after the error line. */
static int local_socket(struct psd *d)
{
    const char *path = d->c.local_socket;
    size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
    char dflt[4096];
    bool isauto = path != NULL && strcmp(path, "auto") == 0;
    if (path == NULL || path[0] == '\0' || strcmp(path, "off") == 0)
        return 0;
    if (isauto) {
        if (strncmp(d->c.listen, "unix:", 5) == 0)
            return 0;
        snprintf(dflt, sizeof dflt, "%s/psd.sock", d->c.data_dir);
        path = dflt;
    }
    char why[600];
    if (isauto && strlen(path) < max && !socket_possible(path, why, sizeof why)) {
        ps_log_warn("no local socket: %s; workers on this host use TCP (set "
                    "--local-socket to another path)", why);
        return 0;
    }
    if (strlen(path) >= max) {
        if (isauto) {
            ps_log_warn("no local socket: %s is longer than a unix socket path "
                        "may be (%zu bytes); workers on this host use TCP (set "
                        "--local-socket to a shorter path)", path, max - 1);
            return 0;
        }
        fprintf(stderr, "psd: --local-socket: '%s' is longer than a unix "
                "socket path may be (%zu bytes)\n", path, max - 1);
        return 2;
    }
    snprintf(d->also, sizeof d->also, "unix:%s", path);
    /* Without an absolute path or a host id, no client can check that the
     * socket is its own host's: Stats then advertises none. */
    if (ps_host_local_address(path, d->local, sizeof d->local) != 0 ||
        ps_host_id(d->hostid, sizeof d->hostid) != 0) {
        ps_log_warn("local socket %s: not advertised (no absolute path, or no "
                    "host id): workers on this host reach it only when told "
                    "unix:PATH", path);
        d->local[0] = d->hostid[0] = '\0';
    }
    return 0;
}

/* Starts the gRPC server with the shard's methods. Returns 0, or 1 after
 * the error line. */
static int serve(struct psd *d)
{
    const struct psd_conf *c = &d->c;
    ps_tls_opts tls = ps_tls_opts_of(&c->common.tls);
    long files = ps_probe_raise_files();
    int maxc = c->max_connections;
    if (maxc == 0)
        maxc = files > 32 ? (int)(files / 2) : 16;
    ps_rpc_server_opts ro = {.listen = c->listen, .threads = (int)c->threads,
                             .max_message_bytes = (size_t)c->max_message,
                             .listen_also = d->also[0] ? d->also : NULL,
                             .max_streams = c->max_streams, .tls = &tls,
                             .auth = d->auth,
                             /* Over the unix socket, psd's own uid (or
                              * root) is a worker without a token. */
                             .fd_channel_role = PS_AUTH_WORKER,
                             .max_connections = maxc,
                             .handshake_timeout_ms = (int)c->handshake_timeout_ms,
                             .idle_timeout_ms = (int)c->idle_timeout_ms,
                             .keepalive_ms = (int)c->keepalive_ms};
    ps_log_info("connections: %ld descriptors, at most %d on the unix socket, "
                "handshake within %lld ms, closed after %lld ms idle, pinged "
                "every %lld ms, listener probed every %lld ms", files, maxc,
                (long long)c->handshake_timeout_ms, (long long)c->idle_timeout_ms,
                (long long)c->keepalive_ms, (long long)c->probe_interval_ms);
    int rc;
    if ((rc = ps_rpc_server_create(&ro, &d->srv)) != 0 ||
        (rc = psd_shard_register(d->shard, d->srv)) != 0 ||
        (rc = ps_rpc_server_start(d->srv, &d->port)) != 0) {
        fprintf(stderr, "psd: cannot serve on %s%s%s: %s\n", c->listen,
                d->also[0] ? " and " : "", d->also,
                rc == -EADDRINUSE ? "an address is in use, or not host:port or "
                                    "a unix socket path in an existing directory"
                                  : ps_strerror(rc));
        return 1;
    }
    return 0;
}

/* Serves /metrics on --metrics-listen, unless it is off. Returns 0 or
 * the exit code after the error line (ps_metrics_http_serve). */
static int serve_metrics(struct psd *d)
{
    d->msrc = (psd_metrics_src){.shard = d->shard, .srv = d->srv};
    return ps_metrics_http_serve("psd", d->c.common.metrics_listen, &d->c.common.metrics_http,
                                 psd_metrics_collect, &d->msrc, &d->metrics);
}

/* Registers with pscoord, when there is one, under the address others
 * reach this shard at. Returns 0, or 1 after the error line. */
static int join_coordinator(struct psd *d)
{
    const struct psd_conf *c = &d->c;
    if (c->coordinator == NULL || c->coordinator[0] == '\0')
        return 0;
    char adv[300], host[256], err[512];
    int lport;
    if (c->advertise != NULL && c->advertise[0] != '\0') {
        snprintf(adv, sizeof adv, "%s", c->advertise);
    } else if (ps_addr_split(c->listen, host, sizeof host, &lport) == 0) {
        bool any = strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 ||
                   host[0] == '\0';
        snprintf(adv, sizeof adv, "%s:%d", any ? "127.0.0.1" : host, d->port);
    } else {
        snprintf(adv, sizeof adv, "127.0.0.1:%d", d->port);
    }
    /* With a local socket, workers on this host reach it there (hostid.h). */
    ps_coord_opts co = {.coordinator = c->coordinator, .job_id = c->job_id,
                        .role = PS__V1__ROLE__PS, .index = (int)c->task_index,
                        .address = adv, .is_empty = shard_empty, .ctx = d->shard,
                        .register_budget_ms = 60000,
                        .token = d->token[0] ? d->token : NULL,
                        .local_address = d->hostid[0] ? d->local : "",
                        .host_id = d->hostid};
    int idx;
    if (ps_coord_join(&co, &d->coord, &idx, err, sizeof err) != 0) {
        fprintf(stderr, "psd: %s\n", err);
        return 1;
    }
    ps_log_set_task("ps", idx);
    return 0;
}

/* From nothing to serving: the control loop (before any thread starts, so
 * that every thread inherits the blocked signals), the shard, the server,
 * /metrics, the coordinator, then "PORT <n>" and "METRICS_PORT <n>".
 * Returns 0, or the exit status after the error line, with what was
 * started undone. */
static int start(struct psd *d)
{
    int rc = ps_proc_loop_create(&d->loop);
    if (rc != 0) {
        fprintf(stderr, "psd: cannot set up signal handling: %s\n",
                ps_strerror(rc));
        return 1;
    }
    uint64_t base_rss;
    if ((rc = local_socket(d)) != 0 || (rc = open_shard(d, &base_rss)) != 0)
        return rc;
    if ((rc = serve(d)) != 0)
        goto close_shard;
    /* What a psd with no variables costs: the overhead Stats reports. */
    uint64_t rss = psd_rss_bytes();
    psd_shard_set_fixed_overhead(d->shard, rss > base_rss ? rss : base_rss);
    if ((rc = serve_metrics(d)) != 0 || (rc = join_coordinator(d)) != 0)
        goto close_shard;
    /* A unix socket has no port: PORT 0 still says psd serves. */
    const struct psd_conf *c = &d->c;
    int port = strncmp(c->listen, "unix:", 5) == 0 ? 0 : d->port;
    ps_proc_announce(port);
    if (d->metrics != NULL) {
        ps_metrics_http_announce(ps_metrics_http_port(d->metrics));
        ps_log_info("metrics on %s (port %d), GET /metrics", c->common.metrics_listen,
                    ps_metrics_http_port(d->metrics));
    }
    ps_tls_opts tls = ps_tls_opts_of(&c->common.tls);
    ps_log_info("psd %s serving on %s (port %d, %s)%s%s, data in %s, %s commits "
                "every %lld ms", PS_VERSION, c->listen, port, ps_tls_server_mode(&tls),
                d->also[0] ? " and " : "", d->also, c->data_dir,
                c->durable ? "durable" : "write-behind",
                (long long)c->commit_interval_ms);
    return 0;
close_shard:
    ps_metrics_http_stop(d->metrics);
    ps_rpc_server_destroy(d->srv);
    psd_shard_close(d->shard);
    return rc;
}

/* How often the STATUS= line is brought up to date: often enough that
 * `systemctl status` is current, and it is sent only when it changed. */
#define PSD_STATUS_MS 2000

/* The STATUS= line: where the shard is. */
static void describe(void *ctx, char *out, size_t len)
{
    struct psd *d = ctx;
    struct psd_shard_brief b;
    psd_shard_brief(d->shard, &b);
    char ckpt[64] = "no checkpoint yet";
    if (b.last_checkpoint > 0)
        snprintf(ckpt, sizeof ckpt, "last checkpoint at step %llu",
                 (unsigned long long)b.last_checkpoint);
    snprintf(out, len, "serving on port %d: %zu variable%s, version %llu, "
             "%llu updates since start, %s", d->port, b.variables,
             b.variables == 1 ? "" : "s", (unsigned long long)b.max_version,
             (unsigned long long)b.updates, ckpt);
}

/* Probes failed in a row before psd gives up on its listener. */
#define PROBE_TRIES 2
#define PROBE_TIMEOUT_MS 3000
/* A probe not accepted while every gRPC thread is inside a handler is not
 * counted (they are what accepts: a push waiting for the RAM tier's room
 * on a slow disk), unless that handler has run this long: stuck. */
#define PROBE_BUSY_MAX_MS 60000

/* The listener's self-probe, on the control loop (common/probe.h): two
 * probes in a row unanswered (one that was accepted and answered late is
 * not counted: the listener works), and psd says so in one line and stops as on
 * SIGTERM (answering and flushing what it has), then exits 1, so that
 * systemd (Restart=) starts a psd that accepts again. */
static void probe(void *ctx)
{
    struct psd *d = ctx;
    char host[256], err[256];
    /* The host of --listen ("[::]:0" -> "::"; ps_addr_split takes no port
     * 0), at the port it bound. */
    const char *l = d->c.listen, *colon = strrchr(l, ':');
    size_t hl = colon != NULL ? (size_t)(colon - l) : 0;
    if (hl >= 2 && l[0] == '[' && l[hl - 1] == ']') {
        l++;
        hl -= 2;
    }
    if (d->probe_failed || colon == NULL || hl >= sizeof host)
        return;
    memcpy(host, l, hl);
    host[hl] = '\0';
    int rc = ps_probe_listener(host, d->port, PROBE_TIMEOUT_MS, err, sizeof err);
    if (rc == 0) {
        d->probe_failures = 0;
        return;
    }
    if (rc == -EINVAL) {
        /* A host name: probing its address is not psd's to decide. */
        ps_log_warn("listener probe off: %s", err);
        d->probe_failed = true;
        return;
    }
    if (rc == -EAGAIN) {
        /* Accepted: the listener works, psd is slow to answer (its gRPC
         * threads busy or starved, a disk that makes pushes wait). */
        ps_log_warn("listener probe: %s; not counted", err);
        return;
    }
    int64_t busy = rc == -ETIMEDOUT ? ps_rpc_server_busy_ms(d->srv) : 0;
    if (busy > 0 && busy < PROBE_BUSY_MAX_MS) {
        ps_log_warn("listener probe: %s, while every gRPC thread has been handling a "
                    "call for %lld ms; not counted", err, (long long)busy);
        return;
    }
    if (++d->probe_failures < PROBE_TRIES) {
        ps_log_warn("listener probe: %s; trying again", err);
        return;
    }
    d->probe_failed = d->probe_exit = true;
    fprintf(stderr, "psd: the listener on %s stopped accepting connections (%d "
            "probes in a row: %s); exiting to be restarted\n", d->c.listen,
            PROBE_TRIES, err);
    kill(getpid(), SIGTERM);
}

/* Starts the probe on the control loop, for a TCP listener when
 * --probe-interval is set. A timer that cannot be added is logged. */
static void start_probe(struct psd *d)
{
    if (d->c.probe_interval_ms <= 0 || strncmp(d->c.listen, "unix:", 5) == 0)
        return;
    int rc = ps_proc_loop_every(d->loop, d->c.probe_interval_ms, probe, d);
    if (rc != 0)
        ps_log_err(rc, "cannot add the listener probe's timer");
}

/* Once psd serves with its store loaded (start): tells systemd it is
 * ready, with a first STATUS= line, then from the control loop keeps the
 * status current and sends the watchdog's keep-alives (common/notify.h).
 * Nothing without systemd. A timer that cannot be added (out of memory)
 * is logged and psd serves on. */
static void supervise(struct psd *d)
{
    ps_proc_loop_supervise(d->loop, PSD_STATUS_MS, describe, d);
}

/* SIGTERM's shutdown: leave the job, answer the waiting calls, drain the
 * rest within the grace period, then flush to LMDB. Returns the exit
 * status. */
static int drain(struct psd *d)
{
    /* First: the collector reads the shard and the server. */
    ps_metrics_http_stop(d->metrics);
    ps_coord_leave(d->coord);
    psd_shard_stop(d->shard);
    ps_rpc_server_shutdown(d->srv, (int)d->c.shutdown_grace_ms);
    ps_rpc_server_destroy(d->srv);
    int rc = psd_shard_close(d->shard);
    if (rc != 0)
        ps_log_err(rc, "the final flush failed");
    else
        ps_log_info("stopped cleanly");
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    struct psd d;
    memset(&d, 0, sizeof d);
    d.cmd = ps_daemon_cmd("psd", "--data-dir DIR [options]", psd_opts, &d.c, &d.c.common,
                          "PSD");
    int status = ps_proc_prologue(&d.cmd, argc, argv);
    if (status != PS_PROC_RUN)
        return status;
    if (d.c.data_dir == NULL || d.c.data_dir[0] == '\0')
        return ps_proc_quit(&d.cmd, 2, "--data-dir is required");
    if ((status = ps_proc_lock_dir(&d.cmd, "--data-dir", d.c.data_dir)) != PS_PROC_RUN)
        return status;
    if ((status = tf_config_defaults(&d)) != PS_PROC_RUN)
        return status;
    /* Loopback: a psd serves the network only when told to, with TLS. */
    if (d.c.listen == NULL)
        d.c.listen = strdup("127.0.0.1:7070");
    if ((status = transport(&d)) != PS_PROC_RUN)
        return status;
    if (d.c.task_index >= 0)
        ps_log_set_task("ps", d.c.task_index);
    if ((status = load_tokens(&d)) != PS_PROC_RUN)
        return status;

    status = start(&d);
    if (status == 0) {
        supervise(&d);
        ps_proc_loop_on_hup(d.loop, ps_auth_reload_logged, d.auth);
        start_probe(&d);
        int sig = ps_proc_loop_run(d.loop);
        ps_log_info("signal %d: draining calls and flushing to LMDB", sig);
        status = drain(&d);
        if (d.probe_exit)
            status = 1;
    }
    status = ps_proc_epilogue(&d.cmd, d.loop, status);
    ps_auth_destroy(d.auth); /* after the server that checked with it */
    explicit_bzero(d.token, sizeof d.token);
    return status;
}
