/*
 * sparse - rows/s of psd's sparse tables (issue 12 item 8): SparsePull,
 * SparsePush (Adagrad) and SparsePush with return_values, batches of
 * --batch ids drawn as DLRM's synthetic data: Zipf(s = 1.1) over the ranks
 * of a key space of --keyspace ids (10^9), rank r being id (r * M + 12345)
 * mod keyspace (M odd and prime to it: a bijection that scatters the hot
 * ids over the key space, LMDB's pages and the shards). The table holds
 * the rows of the first --rows ranks before a run; draws beyond them are
 * ids never pushed (the bench says what share): psd answers a pull of one
 * with its initial row and a push inserts it, the RAM ceiling copies a
 * zero row, the LMDB ceiling finds nothing and copies zeros, Redis answers
 * nil (zeros) and a push SETs it. dim --dim, from one C client over
 * 127.0.0.1, against, in the same run and on the same id sequences:
 *   - ceilings: an in-process gather from a RAM array of the table, and an
 *     in-process read of the same rows from psd's own store: the catalog
 *     in its LMDB file (psd_store_lib, read only, while psd runs), the
 *     bytes from its segment files through a warm page cache;
 *   - the peer: redis-server on a free loopback port holding the same rows
 *     the way TFRA's Redis backend does (bench/redis_peer.h).
 * psd's pulls, in both regimes and the warm-up, carry the ids of the
 * next pull as a hint (ps_sparse_item.next_ids: SparsePullItem.next_ids),
 * and its pushes the ids of the next push (SparseGradient.next_ids), as a
 * trainer that knows its next batch sends them: psd starts reading those
 * on disk before it serves the call. The ceilings and Redis get the same
 * ids without it.
 * Two regimes for psd: the table in RAM (no memory limit), and psd with
 * --memory-limit a quarter of the table's bytes (LMDB and segments),
 * inside a cgroup v1 memory group of that size when run as root (else
 * --memory-limit alone, said so). For that regime a ceiling from the disk,
 * measured in the same run: psd's own cold reads of the timed pulls (Stats
 * sparse_segment_reads) at the rate the disk gives random O_DIRECT reads
 * of a record's aligned size in psd's segment files, BENCH_DISK_DEPTH in flight
 * through io_uring as psd keeps them.
 *
 *   sparse --psd build/server/psd [--rows 1000000] [--keyspace 1000000000]
 *          [--dim 64] [--batch 4096] [--calls 200] [--redis redis-server]
 *          [--half-rows fp16|bf16 [--half-slots]] [--quick]
 *
 * --half-rows: after the 4x regime, the same again with the table's rows
 * stored in that dtype (VariableSpec.row_dtype; Adagrad's slot float32,
 * or with --half-slots in the same dtype: VariableSpec.slot_dtype), in a
 * memory group of the same size, and a line "half rows: ... pull N rows/s
 * (X.XXx float32 rows), push N rows/s (X.XXx)" that says which. Both
 * tables are filled and warmed up, each psd in its group, before either
 * regime's timed calls, and their pulls are first timed by turns: 20
 * rounds of 20 pulls of each table on the same ids, both psds running
 * ("half rows, by turns: ... (X.XXx; a round's ratio ...)"). The two
 * regimes' own timed pulls run minutes apart on a disk whose rate can
 * drift by a third in that time; by turns, a drift weighs on both.
 *
 * Before each regime's timed calls, --warmup untimed pulls (200), and in
 * the memory-limited regimes more, 50 at a time, until psd has read twice
 * the rows its RAM tier held after the fill from the disk (or reads less
 * than a row a pull: the tier holds what they draw), so that the tier
 * holds what the stream keeps there and not the fill's last rows. Each
 * such regime also says how many cold reads a pull would make with an
 * ideal tier of the same rows (the table's most drawn ones), which bounds
 * what any replacement policy can save.
 *
 * SIGINT, SIGTERM or SIGHUP stop the bench cleanly: a thread of its own
 * kills the psd and the redis-server it runs, removes their directories
 * (/tmp/bench-sparse.*, /tmp/bench-redis.*) and the memory cgroup, and
 * exits as killed by the signal.
 *
 * --quick: 100000 rows, 30 calls. Ends with one line: "sparse: pull N
 * rows/s (R of lmdb, X.Xx redis); push N rows/s (X.Xx redis); 4x over
 * memory R of in-ram, pull C of disk ceiling" (the factor is the table's
 * bytes over the limit). The disk ceiling, in rows/s, is the disk's rate
 * for reads like psd's cold reads (random O_DIRECT reads of the same size
 * at the same depth, measured in the run) times the rows psd served per
 * cold read in the timed pulls (their rows over their segment reads);
 * "n/a" when the regime made no cold reads or the disk was not measured.
 */
#include "bench/diskrate.h"
#include "common/buf.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/psclient.h"
#include "common/rpc.h"
#include "common/sparseclient.h"
#include "proto/ps.pb-c.h"
#include "server/store.h"
#ifdef BENCH_HAVE_REDIS
#include "bench/redis_peer.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct opts {
    const char *psd, *redis;
    long rows, dim, batch, calls;
    long keyspace; /* ids are drawn from [0, keyspace) */
    long warmup;   /* untimed pulls before psd's timed calls */
    int row_dtype; /* VariableSpec.row_dtype of the table: 0 float32, 2 fp16, 3 bf16 */
    int slot_dtype; /* VariableSpec.slot_dtype of the table: the same */
    int half_rows; /* --half-rows: the 4x regime again with rows of this dtype */
    bool half_slots; /* --half-slots: and its slots in that dtype too */
};

/* One call of kind 0 (pull), 1 (push) or 2 (push with return) on ids;
 * out (batch * dim) receives rows. Returns 0 or nonzero to stop. */
typedef int (*op_fn)(void *ctx, int kind, int64_t *ids, float *g, float *out, uint64_t step);

struct psd {
    int slot; /* 0, or 1 for a second psd running beside it */
    pid_t pid;
    char dir[256], cg[256];
    int port;
    ps_client *pc;    /* the C client users link (libpsclient) */
    ps_rpc_client *c; /* its channel, for Stats and CreateVariable */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define DISK_SECONDS 2.0

/* What a stop signal undoes (stop_main): the psd and the redis-server
 * running now and their directories, and the memory cgroup. live_mu is
 * held from making a child's directory to knowing its pid, so that
 * stop_main sees both or neither; a pid is taken back once its process
 * was waited for, a directory once it was removed (a removal racing
 * stop_main's is harmless: rm -rf twice). */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic pid_t live_psd[2], live_redis; /* by struct psd's slot */
static char live_psd_dir[2][256], live_redis_dir[256], live_cg[2][256];
static _Atomic bool live_psd_has_dir[2], stopping;

/* An exit of main's thread while stop_main cleans up (a call failing once
 * the signal killed its peer) waits here for stop_main's _exit: exit()
 * would end the process half-way through the cleanup. */
static void wait_for_stop(void)
{
    while (atomic_load(&stopping))
        pause();
}

/* Removes directory dir and everything in it. */
static void remove_dir(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "sparse: could not remove %s\n", dir);
}

/* Removes memory cgroup cg (nothing when it was not made), waiting up to
 * 2 s for the kernel to let go of a psd just killed in it (EBUSY). */
static void cg_remove(const char *cg)
{
    for (int i = 0; i < 100 && rmdir(cg) != 0 && errno == EBUSY; i++)
        nanosleep(&(struct timespec){0, 20000000}, NULL);
}

/* Kills the children running now (SIGKILL: nothing of theirs is kept),
 * removes their directories and the cgroup. live_mu held. */
static void undo_live(void)
{
    pid_t pids[3] = {atomic_load(&live_psd[0]), atomic_load(&live_psd[1]),
                     atomic_load(&live_redis)};
    for (int i = 0; i < 3; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0); /* ECHILD when main's thread waited first */
        }
    for (int k = 0; k < 2; k++)
        if (atomic_load(&live_psd_has_dir[k]))
            remove_dir(live_psd_dir[k]);
    if (pids[2] > 0 && live_redis_dir[0])
        remove_dir(live_redis_dir);
    for (int k = 0; k < 2; k++)
        if (live_cg[k][0])
            cg_remove(live_cg[k]);
}

/* An exit on a failed call (exit(1)) leaves nothing behind either: psd
 * exiting on its own, its directory, the memory cgroup. */
static void undo_at_exit(void)
{
    if (atomic_load(&stopping))
        return;
    pthread_mutex_lock(&live_mu);
    undo_live();
    pthread_mutex_unlock(&live_mu);
}

/* The signal thread: waits for SIGINT, SIGTERM or SIGHUP (blocked in
 * every other thread and unblocked in the children), undoes what runs
 * (undo_live), and exits as the signal would have. */
static void *stop_main(void *arg)
{
    int sig = 0;
    sigwait(arg, &sig);
    atomic_store(&stopping, true);
    fprintf(stderr, "sparse: interrupted by signal %d; stopping psd and redis, removing "
            "their directories\n", sig);
    pthread_mutex_lock(&live_mu); /* kept: main's thread starts nothing more */
    undo_live();
    _exit(128 + sig);
}

/* Starts psd (in cgroup cg when cg[0]) with --memory-limit limit (0: none). */
static int psd_start(const struct opts *o, struct psd *p, uint64_t limit)
{
    int pfd[2];
    if (pipe(pfd) != 0)
        return -errno;
    pthread_mutex_lock(&live_mu);
    snprintf(p->dir, sizeof p->dir, "/tmp/bench-sparse.XXXXXX");
    if (mkdtemp(p->dir) == NULL) {
        int e = errno;
        pthread_mutex_unlock(&live_mu);
        close(pfd[0]);
        close(pfd[1]);
        return -e;
    }
    snprintf(live_psd_dir[p->slot], sizeof live_psd_dir[p->slot], "%s", p->dir);
    atomic_store(&live_psd_has_dir[p->slot], true);
    char lim[32];
    snprintf(lim, sizeof lim, "%llu", (unsigned long long)limit);
    p->pid = fork();
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        sigset_t none; /* the stop signals back: a mask survives exec */
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (p->cg[0]) {
            char path[300];
            snprintf(path, sizeof path, "%s/cgroup.procs", p->cg);
            FILE *f = fopen(path, "w");
            if (f == NULL || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0)
                _exit(126);
        }
        dup2(pfd[1], 1);
        close(pfd[0]);
        execl(o->psd, o->psd, "--listen", "127.0.0.1:0", "--data-dir", p->dir,
              "--memory-limit", lim, "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    if (p->pid > 0)
        atomic_store(&live_psd[p->slot], p->pid);
    pthread_mutex_unlock(&live_mu);
    close(pfd[1]);
    char buf[256];
    ssize_t n = read(pfd[0], buf, sizeof buf - 1);
    close(pfd[0]);
    if (n <= 0 || strncmp(buf, "PORT ", 5) != 0)
        return PS_EUNAVAIL;
    buf[n] = 0;
    p->port = atoi(buf + 5);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", p->port);
    ps_rpc_client_opts co = {.deadline_ms = 120000};
    int rc = ps_client_create(target, &co, &p->pc);
    if (rc == 0)
        p->c = ps_client_rpc(p->pc);
    return rc;
}

/* Stops psd (it applies its row log first) and removes its directory;
 * before the removal, when disk is not NULL, *disk = the disk's random
 * reads/s of a record's aligned span (rec bytes at any offset, as psd
 * reads it: 512-byte alignment, else 4096) in psd's first segment file
 * (bench_disk_rate). */
static void psd_stop(struct psd *p, double *disk, uint32_t rec)
{
    ps_client_destroy(p->pc);
    kill(p->pid, SIGTERM);
    waitpid(p->pid, NULL, 0);
    atomic_store(&live_psd[p->slot], 0);
    char cmd[300];
    if (disk != NULL) {
        uint32_t nseg = 0;
        struct stat st;
        do
            snprintf(cmd, sizeof cmd, "%s/seg-%08u.psg", p->dir, ++nseg);
        while (stat(cmd, &st) == 0);
        *disk = 0;
        for (uint32_t a = 512; a <= 4096 && *disk == 0 && nseg > 1; a *= 8)
            *disk = bench_disk_rate(p->dir, nseg - 1, (rec + a - 1) / a * a, a,
                                    DISK_SECONDS);
    }
    remove_dir(p->dir);
    atomic_store(&live_psd_has_dir[p->slot], false);
}

static int call(struct psd *p, const char *m, const void *req, const void *desc, void **resp)
{
    ps_rpc_status st;
    int rc = ps_rpc_invoke_pb(p->c, m, req, desc, resp, 0, &st);
    if (rc != 0)
        fprintf(stderr, "sparse: %s: %s\n", m, st.message);
    return rc;
}

static int create(struct psd *p, const struct opts *o)
{
    Ps__V1__Optimizer opt = PS__V1__OPTIMIZER__INIT;
    opt.kind = PS__V1__OPTIMIZER__KIND__ADAGRAD;
    opt.learning_rate = 0.01f;
    Ps__V1__Initializer in = PS__V1__INITIALIZER__INIT;
    in.kind = PS__V1__INITIALIZER__KIND__UNIFORM;
    int64_t shape = o->dim;
    Ps__V1__VariableSpec sp = PS__V1__VARIABLE_SPEC__INIT;
    sp.name = "emb";
    sp.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    sp.n_shape = 1;
    sp.shape = &shape;
    sp.optimizer = &opt;
    sp.initializer = &in;
    sp.sparse = true;
    sp.row_dtype = (Ps__V1__DType)o->row_dtype;
    sp.slot_dtype = (Ps__V1__DType)o->slot_dtype;
    Ps__V1__CreateVariableRequest r = PS__V1__CREATE_VARIABLE_REQUEST__INIT;
    r.spec = &sp;
    void *resp = NULL;
    int rc = call(p, "/ps.v1.ParameterServer/CreateVariable", &r,
                  &ps__v1__create_variable_response__descriptor, &resp);
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

/* One SparsePull (kind 0), SparsePush (1) or push with return (2), through
 * the C client's calls (common/sparseclient.h), as a program linking
 * libpsclient makes them; a call tells psd the ids of the next call of
 * its kind, next (NULL: none). */
static int one(struct psd *p, const struct opts *o, int kind, int64_t *ids, float *g,
               float *out, uint64_t step, const int64_t *next)
{
    float *rows = kind == 1 ? g : out; /* a push without return leaves g as it is */
    if (kind == 2)
        memcpy(out, g, (size_t)(o->batch * o->dim) * sizeof *out);
    ps_sparse_item it = {"emb", ids, (size_t)o->batch, (int)o->dim, rows, 0, next,
                         next ? (size_t)o->batch : 0};
    ps_rpc_status st;
    int rc = kind == 0 ? ps_client_sparse_pull(&p->pc, 1, &it, 1, 0, &st)
                       : ps_client_sparse_push(&p->pc, 1, 0, step, &it, 1, kind == 2, 0, &st);
    if (rc != 0)
        fprintf(stderr, "sparse: %s: %s\n", kind ? "SparsePush" : "SparsePull", st.message);
    return rc;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Zipf(s) over ranks 1..n by rejection-inversion (Hoermann and Derflinger
 * 1996, as Apache Commons' ZipfRejectionInversionSampler): no table, so n
 * can be the 10^9 ids of the key space. */
struct zipf {
    double s, n, hx1, hn, sdiv;
};

static double zh1(double x) /* log1p(x) / x */
{
    return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
}

static double zh2(double x) /* expm1(x) / x */
{
    return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x * 0.5 * (1 + x / 3 * (1 + 0.25 * x));
}

static double zipf_h(const struct zipf *z, double x)
{
    return exp(-z->s * log(x));
}

static double zipf_hint(const struct zipf *z, double x)
{
    double lx = log(x);
    return zh2((1 - z->s) * lx) * lx;
}

static double zipf_hinv(const struct zipf *z, double x)
{
    double t = x * (1 - z->s);
    return exp(zh1(t < -1 ? -1 : t) * x);
}

static void zipf_init(struct zipf *z, double s, double n)
{
    z->s = s;
    z->n = n;
    z->hx1 = zipf_hint(z, 1.5) - 1;
    z->hn = zipf_hint(z, n + 0.5);
    z->sdiv = 2 - zipf_hinv(z, zipf_hint(z, 2.5) - zipf_h(z, 2));
}

/* A rank in 0..n-1 (rank 0 the most frequent). */
static uint64_t zipf_rank(const struct zipf *z, uint64_t *rng)
{
    for (;;) {
        *rng = mix64(*rng + 0x9e3779b97f4a7c15ULL);
        double u01 = (double)(*rng >> 11) * 0x1p-53;
        double u = z->hn + u01 * (z->hx1 - z->hn);
        double x = zipf_hinv(z, u), k = floor(x + 0.5);
        k = k < 1 ? 1 : k > z->n ? z->n : k;
        if (k - x <= z->sdiv || u >= zipf_hint(z, k + 0.5) - zipf_h(z, k))
            return (uint64_t)k - 1;
    }
}

/* Rank r's id: a bijection of [0, keyspace) that scatters the hot ranks
 * over the key space (and so over LMDB's pages and psd's shards). */
static uint64_t g_mul;

static uint64_t gcd(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int64_t id_of(const struct opts *o, uint64_t rank)
{
    if (g_mul == 0)
        for (g_mul = 1000003; gcd(g_mul, (uint64_t)o->keyspace) != 1; g_mul += 2)
            ;
    return (int64_t)((rank * g_mul + 12345u) % (uint64_t)o->keyspace); /* < 2^64 for K < 10^12 */
}

/* The ranks of the ids of the current call, for the RAM ceiling, which
 * holds the table's rows by rank, and of the next call's; and how many
 * draws fell beyond the table's --rows ranks (ids never pushed before the
 * run). g_next_ids: the next call's ids, which psd's pulls are told
 * (NULL after the last call). */
static uint64_t *g_ranks, *g_next_ranks;
static const int64_t *g_next_ids;
static uint64_t g_drawn, g_beyond;

/* Draws a batch of ids (and their ranks) from the Zipf stream rng. */
static void draw(const struct opts *o, const struct zipf *z, uint64_t *rng, int64_t *ids,
                 uint64_t *ranks)
{
    for (long i = 0; i < o->batch; i++) {
        ranks[i] = zipf_rank(z, rng);
        ids[i] = id_of(o, ranks[i]);
        g_drawn++;
        g_beyond += ranks[i] >= (uint64_t)o->rows;
    }
}

/* rows/s of calls of one kind; p50 and p99 per call in ms. The ids are
 * the same sequence for every target of a kind; each call's are drawn
 * with the next call's before it is timed, so that a pull can say them. */
static double measure(const struct opts *o, op_fn fn, void *ctx, int kind,
                      const struct zipf *z, int64_t *ids, float *g, float *out, const char *who)
{
    double *lat = malloc((size_t)o->calls * sizeof *lat);
    int64_t *next = malloc((size_t)o->batch * sizeof *next), *own = next;
    uint64_t *ranks0 = g_ranks;
    uint64_t rng = 42 + (uint64_t)kind;
    double busy = 0;
    if (lat == NULL || next == NULL)
        exit(1);
    draw(o, z, &rng, ids, g_ranks);
    for (long c = 0; c < o->calls; c++) {
        g_next_ids = c + 1 < o->calls ? next : NULL;
        if (g_next_ids != NULL)
            draw(o, z, &rng, next, g_next_ranks);
        double t = now_s();
        if (fn(ctx, kind, ids, g, out, (uint64_t)(1000 + c)) != 0)
            exit(1);
        lat[c] = now_s() - t;
        busy += lat[c];
        int64_t *ti = ids;
        ids = next;
        next = ti;
        uint64_t *tr = g_ranks;
        g_ranks = g_next_ranks;
        g_next_ranks = tr;
    }
    if (g_ranks != ranks0) { /* as they were, for the caller */
        g_next_ranks = g_ranks;
        g_ranks = ranks0;
    }
    g_next_ids = NULL;
    free(own);
    qsort(lat, (size_t)o->calls, sizeof *lat, cmp_d);
    double rate = (double)(o->calls * o->batch) / busy; /* id drawing excluded */
    static const char *names[] = {"pull", "push (Adagrad)", "push+return"};
    printf("%-14s %-15s %11.0f rows/s  p50 %7.3f ms  p99 %7.3f ms\n", who, names[kind],
           rate, lat[o->calls / 2] * 1e3, lat[o->calls * 99 / 100] * 1e3);
    free(lat);
    return rate;
}

struct psd_ctx {
    struct psd *p;
    const struct opts *o;
};

static int psd_op(void *ctx, int kind, int64_t *ids, float *g, float *out, uint64_t step)
{
    struct psd_ctx *c = ctx;
    return one(c->p, c->o, kind, ids, g, out, step, g_next_ids);
}

/* Ceiling 1: the rows gathered from a RAM array (rows * dim floats). */
struct ram_ctx {
    const float *table;
    long dim, batch, rows;
};

static int ram_op(void *ctx, int kind, int64_t *ids, float *g, float *out, uint64_t step)
{
    struct ram_ctx *c = ctx;
    (void)kind, (void)g, (void)step;
    size_t rb = (size_t)c->dim * sizeof(float);
    (void)ids;
    for (long i = 0; i < c->batch; i++)
        if (g_ranks[i] < (uint64_t)c->rows)
            memcpy(out + i * c->dim, c->table + g_ranks[i] * (uint64_t)c->dim, rb);
        else
            memset(out + i * c->dim, 0, rb); /* never pushed: a zero row */
    return 0;
}

/* Ceiling 2: the same rows read from psd's store: each row's catalog
 * entry in LMDB (one read transaction a call), then its bytes from the
 * segment file mapped read-only (the page cache, warm), copied out as psd
 * copies them into its reply. A catalog entry (server/sparse_seg.c) is
 * 33 bytes: 'C', u32 segment, u32 record length, u64 offset, ...; the row
 * is after the record's 32-byte head and its own 16-byte head. */
struct lmdb_ctx {
    psd_store *st;
    const char *dir;
    const uint8_t *map[64]; /* per segment number, NULL: not mapped */
    size_t size[64];
    uint32_t var_id;
    long dim, batch;
    uint64_t missing;
};

static int lmdb_row(struct lmdb_ctx *c, const uint8_t *d, size_t len, float *out, size_t rb)
{
    uint32_t seg;
    uint64_t off;
    if (len >= 16 + rb && len != 33) {
        memcpy(out, d + 16, rb); /* a row LMDB still holds, after its head */
        return 0;
    }
    if (len != 33 || d[0] != 'C')
        return -1;
    memcpy(&seg, d + 1, 4);
    memcpy(&off, d + 9, 8);
    if (seg >= 64)
        return -1;
    if (c->map[seg] == NULL) {
        char p[300];
        struct stat st;
        snprintf(p, sizeof p, "%s/seg-%08u.psg", c->dir, seg);
        int fd = open(p, O_RDONLY);
        if (fd < 0 || fstat(fd, &st) != 0) {
            if (fd >= 0)
                close(fd);
            return -1;
        }
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED)
            return -1;
        c->map[seg] = m;
        c->size[seg] = (size_t)st.st_size;
    }
    if (off + 32 + 16 + rb > c->size[seg])
        return -1;
    memcpy(out, c->map[seg] + off + 32 + 16, rb);
    return 0;
}

static int lmdb_op(void *ctx, int kind, int64_t *ids, float *g, float *out, uint64_t step)
{
    struct lmdb_ctx *c = ctx;
    (void)kind, (void)g, (void)step;
    psd_store_rtxn *rt;
    if (psd_store_rbegin(c->st, &rt) != 0)
        return 1;
    size_t rb = (size_t)c->dim * sizeof(float);
    for (long i = 0; i < c->batch; i++) {
        const void *d;
        size_t len;
        if (psd_store_row_get(rt, c->var_id, ids[i], &d, &len) != 0 ||
            lmdb_row(c, d, len, out + i * c->dim, rb) != 0) {
            memset(out + i * c->dim, 0, rb);
            c->missing++;
        }
    }
    psd_store_rend(rt);
    return 0;
}

#ifdef BENCH_HAVE_REDIS
struct redis_ctx {
    rpeer *r;
    size_t batch;
};

/* The peer: lr 0.01 as psd's table. */
static int redis_op(void *ctx, int kind, int64_t *ids, float *g, float *out, uint64_t step)
{
    struct redis_ctx *c = ctx;
    (void)step;
    if (kind == 0)
        return rpeer_pull(c->r, ids, c->batch, out);
    return rpeer_push(c->r, ids, c->batch, g, 0.01f, kind == 2 ? out : NULL);
}
#endif

/* Fills the table: every row pushed once, ids in order (LMDB appends).
 * Returns its LMDB bytes (Stats). */
static uint64_t fill(struct psd *p, const struct opts *o, int64_t *ids, float *g)
{
    for (long k = 0; k < o->rows; k += o->batch) {
        for (long i = 0; i < o->batch; i++)
            ids[i] = id_of(o, (uint64_t)((k + i) % o->rows));
        if (one(p, o, 1, ids, g, NULL, 0, NULL) != 0)
            exit(1);
    }
    /* Until the write-behind has logged every row, applied the log and
     * written the catalog (at most a minute):
     * the LMDB ceiling reads psd's file, and the 4x regime is sized on it. */
    Ps__V1__StatsRequest r = PS__V1__STATS_REQUEST__INIT;
    Ps__V1__StatsResponse *s = NULL;
    for (int tries = 0;; tries++) {
        if (call(p, "/ps.v1.ParameterServer/Stats", &r, &ps__v1__stats_response__descriptor,
                 (void **)&s) != 0)
            exit(1);
        if (s->sparse_rows_unsaved == 0 && s->sparse_log_bytes == 0 &&
            s->sparse_catalog_queued == 0)
            break;
        if (tries == 600) {
            printf("table: psd had not applied its row log after a minute (%llu bytes "
                   "left): LMDB's size below is short of the table's\n",
                   (unsigned long long)s->sparse_log_bytes);
            break;
        }
        protobuf_c_message_free_unpacked(&s->base, NULL);
        usleep(100000);
    }
    uint64_t bytes = s->sparse_disk_bytes + s->sparse_segment_live_bytes;
    printf("table: %llu rows of dim %ld, %llu MiB (LMDB's catalog %llu MiB, the rest in "
           "segment files)\n", (unsigned long long)s->sparse_rows, o->dim,
           (unsigned long long)(bytes >> 20),
           (unsigned long long)(s->sparse_disk_bytes >> 20));
    protobuf_c_message_free_unpacked(&s->base, NULL);
    return bytes;
}

/* What the in-RAM regime is compared with: [0] RAM gather, [1] LMDB read
 * (pull only), [2..4] Redis pull, push, push+return (0 if not measured). */
struct peers {
    double ram, lmdb, redis[3], redis_aof[3];
};

/* The ceilings, measured on psd's data dir while psd runs (its rows are
 * committed: psd's commit interval is 20 ms), and the Redis peer. */
static void measure_peers(const struct opts *o, struct psd *p, const struct zipf *cdf,
                          int64_t *ids, float *g, float *out, struct peers *pr)
{
    size_t d = (size_t)o->dim;
    float *table = malloc((size_t)o->rows * d * sizeof *table);
    if (table == NULL) {
        fprintf(stderr, "sparse: no memory for the RAM ceiling's table\n");
        exit(1);
    }
    for (size_t i = 0; i < (size_t)o->rows * d; i++)
        table[i] = (float)(mix64(i) >> 40) * 0x1p-24f - 0.5f;
    struct ram_ctx rc = {table, o->dim, o->batch, o->rows};
    pr->ram = measure(o, ram_op, &rc, 0, cdf, ids, g, out, "ceiling ram");

    nanosleep(&(struct timespec){0, 200000000}, NULL); /* the last commit */
    struct lmdb_ctx lc = {.dim = o->dim, .batch = o->batch, .dir = p->dir};
    if (psd_store_open(p->dir, 0, PSD_STORE_RDONLY, &lc.st) != 0 ||
        psd_store_var_id(lc.st, "emb", &lc.var_id) != 0) {
        fprintf(stderr, "sparse: cannot read psd's LMDB in %s\n", p->dir);
        exit(1);
    }
    pr->lmdb = measure(o, lmdb_op, &lc, 0, cdf, ids, g, out, "ceiling lmdb");
    if (lc.missing)
        printf("ceiling lmdb: %llu of %ld rows read are not in psd's file (ids never "
               "pushed, read as zeros)\n", (unsigned long long)lc.missing,
               o->calls * o->batch);
    psd_store_close(lc.st);
    for (int k = 0; k < 64; k++)
        if (lc.map[k] != NULL)
            munmap((void *)lc.map[k], lc.size[k]);

#ifdef BENCH_HAVE_REDIS
    /* Redis as TFRA runs it (no persistence), then for pushes with its
     * append-only file fsynced every second: psd's own bound is 100 ms
     * for a kill -9 and for a power cut. */
    for (int aof = 0; aof < 2; aof++) {
        rpeer *r;
        pthread_mutex_lock(&live_mu);
        if (rpeer_start(o->redis, o->dim, aof, &r) != 0) {
            pthread_mutex_unlock(&live_mu);
            exit(1);
        }
        snprintf(live_redis_dir, sizeof live_redis_dir, "%s", rpeer_dir(r));
        atomic_store(&live_redis, rpeer_pid(r));
        pthread_mutex_unlock(&live_mu);
        for (long k = 0; k < o->rows; k += o->batch) {
            long n = o->rows - k < o->batch ? o->rows - k : o->batch;
            for (long i = 0; i < n; i++)
                ids[i] = id_of(o, (uint64_t)(k + i));
            if (rpeer_fill(r, ids, (size_t)n, table + (size_t)k * d, 0.1f) != 0) {
                fprintf(stderr, "sparse: filling redis failed\n");
                exit(1);
            }
        }
        if (!aof)
            printf("redis: %ld rows (value and Adagrad accumulator keys), %llu MiB used\n",
                   o->rows, (unsigned long long)(rpeer_used_memory(r) >> 20));
        struct redis_ctx xc = {r, (size_t)o->batch};
        for (int k = aof; k < 3; k++) {
            double v = measure(o, redis_op, &xc, k, cdf, ids, g, out,
                               aof ? "redis aof" : "redis");
            if (aof)
                pr->redis_aof[k] = v;
            else
                pr->redis[k] = v;
        }
        rpeer_stop(r);
        atomic_store(&live_redis, 0);
    }
#else
    printf("redis: not measured (bench built without hiredis: apt-get install "
           "libhiredis-dev redis-server)\n");
#endif
    free(table);
}

/* Rows psd has read from disk since it started (Stats); *ram: its RAM
 * tier; *segs: its reads of the segment files. */
static uint64_t tier_misses(struct psd *p, uint64_t *ram, uint64_t *segs)
{
    Ps__V1__StatsRequest r = PS__V1__STATS_REQUEST__INIT;
    Ps__V1__StatsResponse *s = NULL;
    if (call(p, "/ps.v1.ParameterServer/Stats", &r, &ps__v1__stats_response__descriptor,
             (void **)&s) != 0)
        exit(1);
    uint64_t n = s->sparse_rows_read_lmdb;
    if (ram)
        *ram = s->sparse_ram_bytes;
    if (segs)
        *segs = s->sparse_segment_reads;
    protobuf_c_message_free_unpacked(&s->base, NULL);
    return n;
}

/* Rows the table's RAM tier holds now (ListVariables). */
static uint64_t tier_rows(struct psd *p)
{
    Ps__V1__ListVariablesRequest r = PS__V1__LIST_VARIABLES_REQUEST__INIT;
    Ps__V1__ListVariablesResponse *l = NULL;
    if (call(p, "/ps.v1.ParameterServer/ListVariables", &r,
             &ps__v1__list_variables_response__descriptor, (void **)&l) != 0)
        exit(1);
    uint64_t n = 0;
    for (size_t i = 0; i < l->n_variables; i++)
        n += l->variables[i]->sparse_ram_rows;
    protobuf_c_message_free_unpacked(&l->base, NULL);
    return n;
}

/* The cold reads a pull would make, on average, if the RAM tier held
 * exactly the k most drawn rows of the table (its first k ranks: an ideal
 * replacement, which no policy beats): the expected number of distinct
 * ranks of [k, rows) among a call's batch draws, sum of 1 - (1 - p_r)^B
 * over them. Zipf's sum over the key space past the table is its integral
 * (rank r drawn with probability (r+1)^-s / H). */
static double ideal_reads(const struct opts *o, double s, uint64_t k)
{
    double h = 0;
    for (long r = 1; r <= o->rows; r++)
        h += pow((double)r, -s);
    h += (pow((double)o->rows + 0.5, 1 - s) - pow((double)o->keyspace + 0.5, 1 - s)) / (s - 1);
    double reads = 0;
    for (uint64_t r = k; r < (uint64_t)o->rows; r++)
        reads += -expm1((double)o->batch * log1p(-pow((double)(r + 1), -s) / h));
    return reads;
}

/* Warm-up past the fixed one: in a memory-limited regime, pulls go on
 * until psd has read from the disk twice the rows its RAM tier holds, so
 * that the tier holds what the stream keeps there rather than what the
 * fill left (at 4M rows, 200 pulls left ~14% of the in-table ids missing
 * where the steady state misses ~10%). At most this many more pulls. */
#define TURNOVER_MAX_CALLS 30000

/* The 4x regime's pull over its disk ceiling (0: not measured). */
static double g_disk_frac;
static double g_disk_bound[2]; /* 4x-over pulls' disk bounds: float32 rows, half rows */
static double g_cold[2];        /* 4x-over pulls' cold reads a call: float32 rows, half rows */
static double g_ideal[2];       /* the same with an ideal tier of the same rows */

/* A regime measured by run: what run_end needs once its psd stops. */
struct regime {
    struct opts o;
    struct psd *p;
    const struct zipf *cdf; /* the draws */
    uint64_t limit;
    char who[48];
    uint64_t sr0, sr1, held; /* Stats' segment reads before and after the timed pulls */
    double res[3];
};

static void run_end(const struct regime *rg);

/* The buffers of a regime's calls: ids (batch), a gradient and rows
 * (batch * dim). */
static void bufs_new(const struct opts *o, int64_t **ids, float **g, float **out)
{
    *ids = malloc((size_t)o->batch * sizeof **ids);
    *g = malloc((size_t)(o->batch * o->dim) * sizeof **g);
    *out = malloc((size_t)(o->batch * o->dim) * sizeof **out);
    if (*ids == NULL || *g == NULL || *out == NULL)
        exit(1);
    for (long i = 0; i < o->batch * o->dim; i++)
        (*g)[i] = (float)((i % 7) - 3) * 0.01f;
}

/* A regime's psd started (in p->cg when set) with --memory-limit limit
 * (0: none), its table made and filled (*bytes: its size on disk), and
 * warmed up; rg says the regime for run_timed and run_end. */
static void run_ready(struct regime *rg, const struct opts *o, struct psd *p, uint64_t limit,
                      const char *regime, const struct zipf *cdf, uint64_t *bytes)
{
    int64_t *ids;
    float *g, *out;
    bufs_new(o, &ids, &g, &out);
    *rg = (struct regime){.o = *o, .p = p, .cdf = cdf, .limit = limit};
    if (psd_start(o, p, limit) != 0 || create(p, o) != 0) {
        fprintf(stderr, "sparse: psd did not start\n");
        exit(1);
    }
    uint64_t b = fill(p, o, ids, g);
    if (bytes)
        *bytes = b;
    snprintf(rg->who, sizeof rg->who, "psd %s", regime);
    const char *who = rg->who;
    /* Warm-up: pulls of the same distribution (other draws), untimed, so
     * that the tiers hold what a steady stream keeps there, as the LMDB
     * ceiling reads a warm page cache. */
    uint64_t wrng = 4242;
    int64_t *wnext = malloc((size_t)o->batch * sizeof *wnext);
    if (wnext == NULL)
        exit(1);
    for (long i = 0; i < o->batch; i++)
        ids[i] = id_of(o, zipf_rank(cdf, &wrng));
    uint64_t k0 = limit ? tier_rows(p) : 0, w0 = limit ? tier_misses(p, NULL, NULL) : 0;
    long c = 0, round = o->warmup;
    uint64_t wl = w0;
    for (;;) {
        for (long r = 0; r < round; r++, c++) {
            for (long i = 0; i < o->batch; i++)
                wnext[i] = id_of(o, zipf_rank(cdf, &wrng));
            if (one(p, o, 0, ids, g, out, 0, r + 1 < round ? wnext : NULL) != 0)
                exit(1);
            memcpy(ids, wnext, (size_t)o->batch * sizeof *ids);
        }
        uint64_t w = limit ? tier_misses(p, NULL, NULL) : 0;
        if (!limit || c - o->warmup >= TURNOVER_MAX_CALLS || w - w0 >= 2 * k0 ||
            (c > o->warmup && w - wl < (uint64_t)round))
            break; /* or the tier holds what the pulls draw: less than a read a pull */
        wl = w;
        round = 50;
    }
    free(wnext);
    uint64_t wr = limit ? tier_misses(p, NULL, NULL) - w0 : 0;
    if (limit)
        printf("%s: warm-up of %ld pulls: %llu rows read from disk, the RAM tier's %llu rows "
               "after the fill %s\n", who, c, (unsigned long long)wr, (unsigned long long)k0,
               wr >= 2 * k0 ? "read twice over"
               : c - o->warmup >= TURNOVER_MAX_CALLS ? "not yet read twice over (stopped at the cap)"
                                                     : "not read twice over: the tier holds what "
                                                       "the pulls draw");
    free(ids);
    free(g);
    free(out);
}

/* A ready regime's calls timed into res (rows/s of pulls, pushes, pushes
 * with return), and with pr the peers on the same calls. */
static void run_timed(struct regime *rg, double res[3], struct peers *pr)
{
    const struct opts *o = &rg->o;
    const struct zipf *cdf = rg->cdf;
    struct psd *p = rg->p;
    const char *who = rg->who;
    uint64_t limit = rg->limit;
    int64_t *ids;
    float *g, *out;
    bufs_new(o, &ids, &g, &out);
    struct psd_ctx pc = {p, o};
    /* psd's cold reads (Stats) over the timed pulls */
    uint64_t sr0 = 0, sr1 = 0, read0 = tier_misses(p, NULL, &sr0);
    res[0] = measure(o, psd_op, &pc, 0, cdf, ids, g, out, who);
    tier_misses(p, NULL, &sr1);
    uint64_t held = limit ? tier_rows(p) : 0; /* the rows the timed pulls found in RAM */
    for (int k = 1; k < 3; k++)
        res[k] = measure(o, psd_op, &pc, k, cdf, ids, g, out, who);
    uint64_t ram = 0, read1 = tier_misses(p, &ram, NULL);
    printf("%s: %.1f%% of the rows the calls touched were read from disk, the rest from "
           "the RAM tier (%llu MiB)\n", who,
           100.0 * (double)(read1 - read0) / (double)(3 * o->calls * o->batch),
           (unsigned long long)(ram >> 20));
    if (pr)
        measure_peers(o, p, cdf, ids, g, out, pr);
    rg->sr0 = sr0;
    rg->sr1 = sr1;
    rg->held = held;
    memcpy(rg->res, res, sizeof rg->res);
    free(ids);
    free(g);
    free(out);
}

/* One regime, start to end. */
static void run(const struct opts *o, struct psd *p, uint64_t limit, const char *regime,
                const struct zipf *cdf, double res[3], uint64_t *bytes, struct peers *pr)
{
    struct regime rg;
    run_ready(&rg, o, p, limit, regime, cdf, bytes);
    run_timed(&rg, res, pr);
    run_end(&rg);
}

/* Stops a regime's psd, and for a memory-limited one prints what the disk
 * allows its pulls. */
static void run_end(const struct regime *rg)
{
    const struct opts *o = &rg->o;
    const double *res = rg->res;
    const char *who = rg->who;
    uint64_t limit = rg->limit, sr0 = rg->sr0, sr1 = rg->sr1, held = rg->held;
    struct psd *p = rg->p;
    double disk = 0;
    /* A stored record: its 32-byte head, the row's 16-byte head, the value
     * and Adagrad's slot, each padded to 4 bytes. */
    uint32_t val = (uint32_t)(o->dim * (o->row_dtype ? 2 : 4) + 3) / 4 * 4;
    uint32_t rec = 32 + 16 + val + (uint32_t)(o->dim * (o->slot_dtype ? 2 : 4) + 3) / 4 * 4;
    psd_stop(p, limit ? &disk : NULL, rec);
    /* What the disk allows a pull that reads this much from it: the rows
     * psd served per cold read at the rate the disk gives reads like them
     * (same size, same depth), and nothing else. */
    double cold = (double)(sr1 - sr0);
    if (limit && disk > 0 && cold >= 1) {
        double per = (double)o->calls * (double)o->batch / cold;
        double bound = disk * per;
        printf("%s: pulls made %.0f cold reads a call (%.1f rows served per read); the disk "
               "gave %.0f random reads/s of a %u-byte record (O_DIRECT, %d in flight, in "
               "psd's segment file after the calls): reads alone bound a pull at %.0f "
               "rows/s, psd's is %.2f of it\n", who, cold / (double)o->calls, per, disk,
               rec, BENCH_DISK_DEPTH, bound, res[0] / bound);
        if (o->row_dtype == 0)
            g_disk_frac = res[0] / bound;
        g_disk_bound[o->row_dtype != 0] = bound;
        int h = o->row_dtype != 0;
        g_cold[h] = cold / (double)o->calls;
        g_ideal[h] = ideal_reads(o, rg->cdf->s, held);
        printf("%s: were the RAM tier's %llu rows the table's most drawn ones (an ideal "
               "replacement), a pull would make %.0f cold reads, not %.0f\n", who,
               (unsigned long long)held, g_ideal[h], g_cold[h]);
    }
}

/* Makes q's memory group, /sys/fs/cgroup/memory/bench-sparse-PID<suffix>,
 * of limit bytes, for a psd started after (as root with cgroup v1's
 * memory controller); false when it cannot. */
static bool cg_make(struct psd *q, const char *suffix, uint64_t limit)
{
    snprintf(q->cg, sizeof q->cg, "/sys/fs/cgroup/memory/bench-sparse-%d%s", (int)getpid(),
             suffix);
    snprintf(live_cg[q->slot], sizeof live_cg[q->slot], "%s", q->cg);
    char path[300];
    snprintf(path, sizeof path, "%s/memory.limit_in_bytes", q->cg);
    FILE *f = NULL;
    if (geteuid() != 0 || mkdir(q->cg, 0755) != 0 || (f = fopen(path, "w")) == NULL)
        return false;
    fprintf(f, "%llu\n", (unsigned long long)limit);
    return fclose(f) == 0;
}

/* Says how often q's memory group refused psd memory, and removes it. */
static void cg_end(struct psd *q)
{
    if (q->cg[0]) {
        char path[300];
        snprintf(path, sizeof path, "%s/memory.failcnt", q->cg);
        FILE *f = fopen(path, "r");
        if (f != NULL) {
            unsigned long long fc = 0;
            if (fscanf(f, "%llu", &fc) == 1)
                printf("4x-over: the memory group %s's memory.failcnt %llu (psd was never "
                       "killed: every call succeeded)\n", q->cg, fc);
            fclose(f);
        }
        cg_remove(q->cg);
    }
    live_cg[q->slot][0] = 0;
}

/* The two 4x-over tables' pulls, float32 rows (psd a) and half rows (b),
 * both psds running: blocks of TURN_CALLS pulls by turns, TURN_ROUNDS
 * rounds, the same ids for both, each call naming the table's next one
 * (a block's last names the first of its table's next block). The two
 * regimes before ran minutes apart on a disk whose rate drifted by a
 * third between them (85-126k random reads/s); taken by turns, a drift
 * weighs on both alike. */
#define TURN_ROUNDS 20
#define TURN_CALLS 20
static void interleave(const struct opts *o, struct psd *a, struct psd *b,
                       const struct zipf *cdf, const char *hname)
{
    long calls = TURN_ROUNDS * TURN_CALLS;
    size_t nb = (size_t)o->batch;
    int64_t *all = malloc((size_t)calls * nb * sizeof *all);
    float *g = calloc(nb * (size_t)o->dim, sizeof *g), *out = malloc(nb * (size_t)o->dim *
                                                                    sizeof *out);
    double busy[2] = {0}, r[2], ratio[TURN_ROUNDS];
    if (all == NULL || g == NULL || out == NULL)
        exit(1);
    uint64_t rng = 4343;
    for (size_t i = 0; i < (size_t)calls * nb; i++)
        all[i] = id_of(o, zipf_rank(cdf, &rng));
    for (long k = 0; k < TURN_ROUNDS; k++) {
        double t[2] = {0};
        for (int w = 0; w < 2; w++)
            for (long c = k * TURN_CALLS; c < (k + 1) * TURN_CALLS; c++) {
                const int64_t *next = c + 1 < calls ? all + (size_t)(c + 1) * nb : NULL;
                double t0 = now_s();
                if (one(w ? b : a, o, 0, all + (size_t)c * nb, g, out, 0, next) != 0)
                    exit(1);
                t[w] += now_s() - t0;
            }
        busy[0] += t[0];
        busy[1] += t[1];
        ratio[k] = t[0] / t[1];
    }
    for (int w = 0; w < 2; w++)
        r[w] = (double)calls * (double)nb / busy[w];
    qsort(ratio, TURN_ROUNDS, sizeof *ratio, cmp_d);
    printf("half rows, by turns: the two 4x-over tables' pulls, both psds running, %d "
           "rounds of %d pulls each (the same ids): float32 rows %.0f rows/s, %s rows %.0f "
           "rows/s (%.2fx; a round's ratio %.2f-%.2fx, median %.2fx)\n", TURN_ROUNDS,
           TURN_CALLS, r[0], hname, r[1], r[1] / r[0], ratio[0], ratio[TURN_ROUNDS - 1],
           ratio[TURN_ROUNDS / 2]);
    free(all);
    free(g);
    free(out);
}

int main(int argc, char **argv)
{
    struct opts o = {NULL, NULL, 1000000, 64, 4096, 200, 1000000000, 200, 0, 0, 0, false};
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            o.rows = 100000;
            o.calls = 30;
            o.warmup = 20;
            continue;
        }
        if (!strcmp(argv[i], "--half-slots")) {
            o.half_slots = true;
            continue;
        }
        if (i + 1 >= argc)
            break;
        const struct {
            const char *flag;
            long *dst;
        } nums[] = {{"--keyspace", &o.keyspace}, {"--rows", &o.rows}, {"--dim", &o.dim},
                    {"--batch", &o.batch},       {"--calls", &o.calls}, {"--warmup", &o.warmup}};
        for (size_t k = 0; k < sizeof nums / sizeof *nums; k++)
            if (!strcmp(argv[i], nums[k].flag))
                *nums[k].dst = atol(argv[i + 1]);
        if (!strcmp(argv[i], "--psd"))
            o.psd = argv[i + 1];
        else if (!strcmp(argv[i], "--redis"))
            o.redis = argv[i + 1];
        else if (!strcmp(argv[i], "--half-rows"))
            o.half_rows = !strcmp(argv[i + 1], "fp16") ? 2 : !strcmp(argv[i + 1], "bf16") ? 3 : -1;
        i++;
    }
    if (o.psd == NULL || o.rows < o.batch || o.dim < 1 || o.batch < 1 || o.calls < 2 ||
        o.warmup < 0 || o.half_rows < 0 || (o.half_slots && !o.half_rows) ||
        o.keyspace < o.rows || o.keyspace > 1000000000000L) {
        fprintf(stderr, "usage: sparse --psd PATH [--rows N] [--keyspace K in [N, 10^12]] [--dim D] "
                "[--batch B] [--calls C] [--warmup W] [--redis PATH] [--half-rows fp16|bf16 "
                "[--half-slots]] [--quick]\n");
        return 2;
    }
    /* Every thread started from here on inherits the mask; the signal
     * thread alone takes these signals. */
    static sigset_t stop_set;
    static const int stops[] = {SIGINT, SIGTERM, SIGHUP};
    sigemptyset(&stop_set);
    for (size_t i = 0; i < sizeof stops / sizeof *stops; i++)
        sigaddset(&stop_set, stops[i]);
    pthread_sigmask(SIG_BLOCK, &stop_set, NULL);
    pthread_t stop_thread;
    if (atexit(undo_at_exit) != 0 || atexit(wait_for_stop) != 0 ||
        pthread_create(&stop_thread, NULL, stop_main, &stop_set) != 0) {
        fprintf(stderr, "sparse: cannot start the signal thread\n");
        return 1;
    }
    pthread_detach(stop_thread);
    printf("each psd regime: %ld untimed pulls first (the same distribution, other "
           "draws), then %ld timed calls of each kind\n", o.warmup, o.calls);
    struct zipf zz;
    zipf_init(&zz, 1.1, (double)o.keyspace);
    const struct zipf *cdf = &zz;
    g_ranks = malloc((size_t)o.batch * sizeof *g_ranks);
    g_next_ranks = malloc((size_t)o.batch * sizeof *g_next_ranks);
    struct psd p = {0};
    double ram[3], over[3];
    struct peers pr = {0};
    uint64_t bytes = 0;
    run(&o, &p, 0, "in-ram", cdf, ram, &bytes, &pr);
    /* psd's own anonymous memory (gRPC, buffers, LMDB's transaction) is
     * ~25-50 MiB whatever the table: below 128 MiB the cgroup would measure
     * that, not the table, so smaller tables get 128 MiB (said below). */
    uint64_t limit = bytes / 4 > ((uint64_t)128 << 20) ? bytes / 4 : (uint64_t)128 << 20;
    /* Each 4x-over regime's psd in a memory group of its own, of the same
     * size: the half-rows one runs beside the float32 one for the pulls by
     * turns (interleave). */
    struct psd q = {0}, q2 = {.slot = 1};
    bool cg = cg_make(&q, "", limit) && (!o.half_rows || cg_make(&q2, "-half", limit));
    if (cg) {
        printf("4x-over: psd in a cgroup v1 memory group of %llu MiB (table %.1fx that), "
               "--memory-limit the same\n", (unsigned long long)(limit >> 20),
               (double)bytes / (double)limit);
    } else {
        cg_remove(q.cg);
        if (q2.cg[0])
            cg_remove(q2.cg);
        q.cg[0] = q2.cg[0] = live_cg[0][0] = live_cg[1][0] = 0;
        printf("4x-over: no writable memory cgroup (not root, or no cgroup v1 memory "
               "controller): --memory-limit %llu MiB alone\n",
               (unsigned long long)(limit >> 20));
    }
    /* The factor printed is the 4x regime's own table over its limit: the
     * same rows fill LMDB's pages more or less densely from run to run
     * (654-894 MiB seen for the in-RAM table). */
    uint64_t over_bytes = 0;
    /* The same table with half-precision rows (Adagrad's slot float32,
     * or with --half-slots of the same dtype), in a memory group of the
     * same size: the same ids and calls, the rows widened to float32 by the
     * client as users get them. Both tables are made and warmed up first,
     * and their pulls by turns (interleave) come before either's timed
     * calls: the pushes insert rows, and the tables they leave are no
     * longer the ones the timed pulls saw. Then each regime alone, as
     * without --half-rows, the float32 psd stopped before the other's. */
    double half[3] = {0};
    const char *hname = o.half_rows == 2 ? "fp16" : "bf16";
    if (o.half_rows) {
        struct opts oh = o;
        oh.row_dtype = o.half_rows;
        oh.slot_dtype = o.half_slots ? o.half_rows : 0;
        char reg[48];
        snprintf(reg, sizeof reg, "4x-over %s%s", hname, o.half_slots ? " +slots" : "");
        struct regime r32, r16;
        run_ready(&r32, &o, &q, limit, "4x-over", cdf, &over_bytes);
        run_ready(&r16, &oh, &q2, limit, reg, cdf, NULL);
        interleave(&o, &q, &q2, cdf, hname);
        run_timed(&r32, over, NULL);
        run_end(&r32);
        run_timed(&r16, half, NULL);
        run_end(&r16);
    } else {
        run(&o, &q, limit, "4x-over", cdf, over, &over_bytes, NULL);
    }
    cg_end(&q);
    cg_end(&q2);
    printf("ids: Zipf(1.1) over %ld ranks; %.1f%% of the %llu drawn were beyond the "
           "table's %ld first ranks (never pushed when a run began: psd answers a pull of "
           "one with its initial row, a push inserts it)\n", o.keyspace,
           100.0 * (double)g_beyond / (double)(g_drawn ? g_drawn : 1),
           (unsigned long long)g_drawn, o.rows);
    double x = (double)(over_bytes ? over_bytes : bytes) / (double)limit;
    char xs[16];
    snprintf(xs, sizeof xs, x >= 1 ? "%.0fx" : "%.1fx", x);
    char rr[32] = "n/a redis", rp[32] = "n/a redis";
    if (pr.redis[0] > 0)
        snprintf(rr, sizeof rr, "%.1fx redis", ram[0] / pr.redis[0]);
    if (pr.redis[1] > 0)
        snprintf(rp, sizeof rp, "%.1fx redis", ram[1] / pr.redis[1]);
    if (pr.redis_aof[1] > 0)
        printf("push against redis with its append-only file fsynced every second: "
               "%.1fx (push+return %.1fx)\n", ram[1] / pr.redis_aof[1],
               ram[2] / pr.redis_aof[2]);
    char dc[16] = "n/a";
    if (g_disk_frac > 0)
        snprintf(dc, sizeof dc, "%.2f", g_disk_frac);
    if (o.half_rows && over[0] > 0)
        printf("half rows: the 4x-over table with %s rows and %s Adagrad slots, in the same "
               "memory: pull %.0f rows/s (%.2fx float32 rows), push %.0f rows/s (%.2fx)\n",
               hname, o.half_slots ? hname : "float32", half[0], half[0] / over[0], half[1],
               over[1] > 0 ? half[1] / over[1] : 0);
    /* What halving the rows can gain at all: a cold row costs one read at
     * either size, so only the hits the larger RAM tier adds, and the
     * disk's rate at the smaller record, move the bound. */
    if (o.half_rows && g_disk_bound[0] > 0 && g_disk_bound[1] > 0)
        printf("half rows' bound: the disk bounds the %s table's pull at %.2fx the float32 "
               "table's (%.0f against %.0f rows/s): what half rows gain with both at their "
               "disk's bound; psd's %s pull %.2f of its bound, float32's %.2f\n", hname,
               g_disk_bound[1] / g_disk_bound[0], g_disk_bound[1], g_disk_bound[0], hname,
               half[0] / g_disk_bound[1], over[0] / g_disk_bound[0]);
    /* What half rows gain in reads: a pull near the disk's bound goes as
     * its cold reads, and the ideal replacement's reads say how far a
     * better policy for both tables could move the ratio. */
    if (o.half_rows && g_cold[0] >= 1 && g_cold[1] >= 1 && g_ideal[1] > 0)
        printf("half rows' reads: %.0f cold reads a pull against float32 rows' %.0f (%.2fx "
               "fewer); with ideal tiers %.0f against %.0f (%.2fx fewer)\n", g_cold[1],
               g_cold[0], g_cold[0] / g_cold[1], g_ideal[1], g_ideal[0], g_ideal[0] / g_ideal[1]);
    printf("sparse: pull %.0f rows/s (%.2f of lmdb, %s); push %.0f rows/s (%s); "
           "%s over memory %.2f of in-ram, pull %s of disk ceiling\n", ram[0],
           ram[0] / pr.lmdb, rr, ram[1], rp, xs, (over[0] + over[1]) / (ram[0] + ram[1]), dc);
    free(g_ranks);
    free(g_next_ranks);
    return 0;
}
