/*
 * shard_internal.h - the shard's state, shared by the files that implement
 * shard.h. Nothing outside them includes it.
 *
 *   shard.c     lifetime (open, stop, close), the method table, and the
 *               checkpoint thread with Checkpoint and Restore
 *   vartable.c  the table of variables, spec normalisation and validation,
 *               CreateVariable, ListVariables, Stats
 *   persist.c   the store: loading it, the write-behind flusher, the writes
 *               of a new variable and of a restore
 *   pull.c      Pull, its waiters and the sweeper that answers them
 *   push.c      Push, sync steps, durable acknowledgements, SetSyncWorkers
 *   staleness.c BOUNDED_STALENESS: the workers' clocks and the bound
 *   limits.c    the caps: variables and bytes held, waiting pulls and how
 *               long they wait
 *   delete.c    DeleteVariable
 *   metrics.c   psd's /metrics page, read from the counters below
 *   sparse_rpc.c SparsePull and SparsePush: the edge of the sparse tier,
 *               s->sparse (sparse.h), whose own files keep its state
 *
 * Locks, always taken in this order and never the reverse:
 *   s->flush_mu         one flush (commit) at a time
 *   the tier's apply_run_mu  one apply of the row log at a time (sparse.h)
 *   s->table_lock (rw)  the set of variables; handlers hold it for reading
 *                       for their whole run, CreateVariable and Restore for
 *                       writing
 *   the tier's tables_mu, then a table's mu (sparse.h); a push holds the
 *                       mutexes of all its tables
 *   v->lock (rw)        one variable's value, slots, version and sync state
 *   s->wait_mu          the lists of calls that wait (pulls for a version,
 *                       sync pushes for their step, durable pushes for their
 *                       commit)
 *   s->caps_mu          the counts of what is held and reserved (limits.c)
 * DeleteVariable, like Restore, takes s->flush_mu before table_lock: a
 * durable push is answered (its values read) with flush_mu held.
 * The store's write transaction is begun only with table_lock held, but
 * for the sparse tier's (the applier's and the sweeps'), which take no
 * shard lock while they hold one.
 *
 * Threads: the handlers run on the rpc server's threads; the flusher
 * (persist.c), the sweeper (pull.c) and the checkpoint thread (shard.c) are
 * started by psd_shard_open and joined by psd_shard_close.
 */
#ifndef PSD_SHARD_INTERNAL_H
#define PSD_SHARD_INTERNAL_H

#include "server/shard.h"

#include "common/buf.h"

#include "server/assist.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "server/optim.h"
#include "proto/ps.pb-c.h"
#include "server/shmmap.h"
#include "common/wire.h" /* PS_WIRE_MAX_DIMS */

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define MAX_NAME 255
/* BOUNDED_STALENESS: a larger bound is no bound (a million steps). */
#define PSD_MAX_STALENESS 1000000u
/* Values at least this big are sent in place by Pull (see psd_var.vmsg). */
#define VALUE_IN_PLACE_MIN ((size_t)64 << 10)
/* A new variable at least this big (values and slots) is created on the
 * checkpoint thread: drawing its initial values takes ~10 ms per 4 MiB,
 * which the serving thread would otherwise spend holding every call. */
#define CREATE_OFFLOAD_BYTES ((size_t)4 << 20)

struct psd_store; /* store.h: reached only through persist.c */

/* Work for the checkpoint thread, in order. */
struct ckpt_job {
    struct ckpt_job *next;
    ps_rpc_call *call;
    uint64_t step;
    size_t keep_at_least;
    enum { JOB_CHECKPOINT, JOB_RESTORE, JOB_CREATE } kind;
    uint8_t *req;        /* JOB_CREATE: the request's bytes */
    size_t len;
};

typedef struct psd_var {
    char *name;
    uint8_t *spec_blob; /* packed, normalized VariableSpec */
    size_t spec_len;
    Ps__V1__VariableSpec *spec; /* unpacked spec_blob */
    int64_t shape[PS_WIRE_MAX_DIMS];
    int ndim;
    size_t n;
    psd_opt opt;
    int nslots;
    int consistency;
    uint32_t num_workers;
    uint32_t staleness;  /* BOUNDED_STALENESS: steps ahead of the slowest */

    pthread_rwlock_t lock;
    float *value; /* (n); in vmsg when it is set */
    /* A big value lives in a refcounted message buffer, so that a Pull's
     * reply sends it in place; an update while a reply still holds it
     * writes a copy (value_writable). Small values are plain memory, copied
     * into replies. */
    ps_rpc_msg *vmsg;
    float *slots; /* (nslots, n) */
    uint64_t version;
    /* The largest magnitude among value and slots (psd_opt_apply's result)
     * as of version mag_version; 0 mag_version: not known. push.c proves
     * the next update finite from it (psd_opt_safe). */
    uint32_t mag;
    uint64_t mag_version;
    uint64_t step;            /* sync: the step being aggregated */
    uint64_t persisted_version;
    uint64_t persisted_step;
    /* sync aggregation of `step` */
    float *accum;             /* (n), allocated on first sync push */
    uint32_t accum_count;
    uint32_t *pushed;         /* workers that pushed this step */
    size_t npushed, cap_pushed;
    size_t accum_elems;       /* elements accumulated this step */
    /* Pushes in pieces (Gradient.total) under way, one per worker: the
     * version rises (sync: the worker counts in its step) once its pieces
     * cover the variable (push.c). */
    struct psd_piecework *pw;
    size_t npw, cap_pw;
    struct psd_sparse_table *sparse; /* a sparse table's rows (sparse.h), or NULL */
} psd_var;

/* A piece of a dense variable in a push or pull: elements [off, off + n);
 * n 0: the whole variable. */
typedef struct psd_range {
    size_t off, n;
} psd_range;

/* A push that answers later: sync parts waiting for their step, or a
 * durable push waiting for its commit. */
typedef struct pending_push {
    struct pending_push *next; /* in s->pending (sync) or s->durable list */
    ps_rpc_call *call;
    size_t nitems;
    size_t nleft;             /* sync parts not yet applied */
    psd_var **vars;           /* (nitems) */
    uint64_t *versions;       /* (nitems) */
    uint64_t step;
    uint64_t seq;             /* durable: the apply sequence to commit */
    bool return_values;       /* answer with the values too */
    psd_shm_ref *into;        /* (nitems) or NULL: values into shared memory */
    psd_range *ranges;        /* (nitems) or NULL: the pieces pushed */
    bool *settled;            /* (nitems) with ranges: a sync piece answered
                                 before its step (not the worker's last) */
    int wire_dtype;           /* the values' dtype (PushRequest.wire_dtype) */
    bool armed;               /* its handler is done with it (under wait_mu) */
    double t0;                /* its arrival (ps_metrics_now): psd_push_seconds */
    char *refused;            /* set: a sync step it joined was refused (its
                                 aggregate would make a value non-finite);
                                 the push is answered INVALID_ARGUMENT with it */
    /* A SparsePush's answer, encoded when it was applied (sparse_rpc.c):
     * parts over reply_mem, sent as they are. */
    ps_rpc_part *parts;
    int nparts;
    void *reply_mem;
} pending_push;

/* A Pull waiting for a version. */
typedef struct pull_waiter {
    struct pull_waiter *next;
    ps_rpc_call *call;
    size_t nitems;
    psd_var **vars;
    uint64_t *min_versions;
    psd_shm_ref *into;        /* (nitems) or NULL: values into shared memory */
    psd_range *ranges;        /* (nitems) or NULL: pieces of the values */
    int wire_dtype;           /* the values' dtype (PullItem.wire_dtype) */
    double t0;                /* its arrival (ps_metrics_now): psd_pull_seconds */
    int64_t give_up_ms;       /* --max-pull-wait: ps_now_ms it is answered
                                 DEADLINE_EXCEEDED at; INT64_MAX never */
    char client[64];          /* its connection (limits.c: the per-client cap) */
    /* BOUNDED_STALENESS: the pulling worker and its clock, and the least
     * staleness of the variables pulled; bounded false: no such wait. */
    bool bounded;
    uint32_t worker, staleness;
    uint64_t step;
} pull_waiter;

/* One worker's clock as this shard heard it (staleness.c). */
struct shard_clock {
    uint32_t worker;
    uint64_t step;     /* the highest PullRequest.step it sent */
    int64_t seen_ms;   /* when it last pulled, or last waited in a pull */
};

/* ParameterServer's methods, each counted as its calls arrive (shard.c's
 * method table; /metrics). */
enum shard_method_id {
    SHARD_M_PUSH,
    SHARD_M_PULL,
    SHARD_M_CREATE_VARIABLE,
    SHARD_M_LIST_VARIABLES,
    SHARD_M_STATS,
    SHARD_M_CHECKPOINT,
    SHARD_M_RESTORE,
    SHARD_M_SET_SYNC_WORKERS,
    SHARD_M_DELETE_VARIABLE,
    SHARD_M_SPARSE_PULL,
    SHARD_M_SPARSE_PUSH,
    SHARD_NMETHODS
};

/* A method as registered: its handler's ctx, which counts the call and
 * hands it on to the handler with the shard. */
struct shard_method {
    psd_shard *s;
    const char *name;                  /* "Push" */
    ps_rpc_handler fn;                 /* NULL for Push (shard_push, pieces) */
    atomic_uint_fast64_t calls, bytes; /* calls received, their request bytes */
};

/* A list of variables built outside the table (loading a store). */
struct var_list {
    psd_var **vars;
    size_t n, cap;
    char *from; /* the checkpoint directory loaded, or NULL (sparse rows) */
    /* A restore into another row or slot dtype (shard_ckpt_convert): was[i] is the
     * checkpoint's table that vars[i] converts, or NULL; NULL when none. */
    psd_var **was;
    uint64_t tables_converted, rows_converted;
};

struct psd_shard {
    psd_shard_opts o;
    char *data_dir;
    char *ckpt_root;     /* checkpoints live in <ckpt_root>/checkpoints */
    struct psd_store *store;

    pthread_rwlock_t table_lock;
    psd_var **vars; /* sorted by name */
    size_t nvars, cap;
    /* The count SetSyncWorkers set last (pscoord's, from its registered
     * workers; 0: never set): every SYNC variable's steps wait for it, one
     * created later too, whatever num_workers its creator's spec names.
     * Written with table_lock held for reading, read with it held. */
    atomic_uint sync_workers;

    pthread_mutex_t wait_mu;
    pthread_cond_t wait_cond;
    pull_waiter *waiters;
    pending_push *pending;   /* sync pushes waiting for their step */
    pending_push *durable;   /* pushes waiting for a commit */
    size_t nwaiters;         /* pulls on waiters (--max-waiting-pulls) */
    struct shard_clock *clocks; /* BOUNDED_STALENESS (staleness.c) */
    size_t nclocks, cap_clocks;
    bool stopping;
    bool closing;

    /* The sparse tier (sparse.h): the rows of every sparse table, their
     * row log and its applier. Opened with the store. */
    struct psd_sparse *sparse;

    pthread_mutex_t flush_mu; /* one flush at a time */
    pthread_cond_t flush_cond;
    bool flush_requested;
    /* Commits asked by shard_flush_wait, and the last the flusher ran for
     * them (its result in flush_rc); flush_mu. */
    pthread_cond_t flushed_cond;
    uint64_t flush_asked, flush_done;
    int flush_rc;
    pthread_t flusher, sweeper, ckpt_thread;
    /* Checkpoints run on their own thread (a copy of a big store takes
     * seconds, and the completion-queue thread must go on serving). */
    pthread_mutex_t ckpt_mu;
    pthread_cond_t ckpt_cond;
    struct ckpt_job *ckpt_jobs, **ckpt_tail;
    bool ckpt_quit;
    bool restoring;      /* a Restore writes the live store (table_lock) */
    bool ckpt_started;
    bool threads_started;

    atomic_uint_fast64_t apply_seq;   /* updates applied, ever */
    atomic_uint_fast64_t committed_seq;
    atomic_uint_fast64_t pushes, pulls, bytes_in, bytes_out, stale, bad,
        nonfinite, commits, last_ckpt, shm_bytes, last_ckpt_bytes;
    /* wirehalf.c: float16 values clamped, half pushes and pulls. */
    atomic_uint_fast64_t wire_clamped, half_pushes, half_pulls;
    /* When the oldest update not yet committed was applied (ps_now_ms), 0
     * when every update is committed: the write-behind lag. */
    atomic_int_fast64_t dirty_since_ms;
    struct shard_method methods[SHARD_NMETHODS];
    /* From a call's arrival to its answer (pushes answered OK, pulls
     * answered with values), a commit's start to its end, a checkpoint's. */
    ps_histogram push_seconds, pull_seconds, commit_seconds, ckpt_seconds;
    uint64_t fixed_overhead;
    int64_t started_ms;
    psd_assist *assist;  /* takes half of a big push (assist.h) */
    psd_shmmap *shm;     /* co-located clients' shared memory (shmmap.h) */
    const ps_rpc_server *srv; /* serving it (psd_shard_register): Stats'
                                 connection counts */
    /* What the table holds, and what CreateVariables about to insert have
     * reserved, against --max-variables and --max-bytes (limits.c). */
    pthread_mutex_t caps_mu;
    size_t held_vars, reserved_vars;
    uint64_t held_bytes, reserved_bytes;
};

/* A request that is refused for what it holds. */
static inline void shard_count_bad(psd_shard *s)
{
    atomic_fetch_add(&s->bad, 1);
}

/* Counts one update applied, and notes when the oldest one not yet
 * committed was applied. Pairs with shard_note_committed (persist.c): both
 * sides sequentially consistent, so either the flusher sees this update's
 * seq or this sees its reset, and no update goes unnoticed. */
static inline void shard_count_apply(psd_shard *s)
{
    atomic_fetch_add(&s->apply_seq, 1);
    if (atomic_load(&s->dirty_since_ms) == 0) {
        int_fast64_t none = 0;
        int64_t now = ps_now_ms();
        atomic_compare_exchange_strong(&s->dirty_since_ms, &none, now > 0 ? now : 1);
    }
}

/* A gradient's largest magnitude as float32 bits without the sign
 * (psd_max_mag's measure, push.c and wirehalf.c): at or above this when an
 * element is NaN or Inf. */
#define PSD_NONFINITE_MAG 0x7f800000u

/* The write-behind lag: how long ago the oldest update not yet committed
 * was applied, in milliseconds; 0 when every update is committed. */
static inline uint64_t shard_write_behind_lag_ms(psd_shard *s)
{
    int64_t dirty = atomic_load(&s->dirty_since_ms);
    int64_t now = ps_now_ms();
    return dirty != 0 && now > dirty ? (uint64_t)(now - dirty) : 0;
}

/* The opening of a unary handler: unpacks the request of method, a
 * message of type d, for the caller to free (protobuf_c_message_free_unpacked).
 * Bytes that do not parse count as a bad request and fail call ("Pull: 12
 * bytes that are not a PullRequest"); then NULL. */
static inline void *shard_unpack(psd_shard *s, ps_rpc_call *call, const char *method,
                                 const ProtobufCMessageDescriptor *d, const uint8_t *req,
                                 size_t len)
{
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, req);
    char where[256];
    size_t at;
    if (m == NULL) {
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: %zu bytes that are not a %sRequest",
                    method, len, method);
    } else if (ps_wire_pb_nul(req, len, d, where, sizeof where, &at)) {
        /* protobuf-c would cut the string short there ("a\0b" is "a"). */
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s: %s has a NUL byte at %zu",
                    method, where, at);
        protobuf_c_message_free_unpacked(m, NULL);
        m = NULL;
    }
    return m;
}

/* shard_unpack for a request with nothing in it to read: true when it
 * parses, else false with call failed. */
static inline bool shard_request_parses(psd_shard *s, ps_rpc_call *call, const char *method,
                                        const ProtobufCMessageDescriptor *d,
                                        const uint8_t *req, size_t len)
{
    ProtobufCMessage *m = shard_unpack(s, call, method, d, req, len);
    if (m == NULL)
        return false;
    protobuf_c_message_free_unpacked(m, NULL);
    return true;
}

/* shard.c */
void shard_ckpt_enqueue(psd_shard *s, struct ckpt_job *j);

/* vartable.c */
float *shard_alloc_floats(size_t n);
const char *shard_dtype_name(int d);
const char *shard_name_problem(const char *name, size_t len);
psd_var *shard_find_var(psd_shard *s, const char *name, size_t len, size_t *pos);
int shard_var_new(const Ps__V1__VariableSpec *sp, size_t n, psd_var **out);
void shard_var_free(psd_var *v);
void shard_var_attach(psd_shard *s, psd_var *v);
void shard_var_detach(psd_shard *s, psd_var *v);
void shard_vars_free(struct var_list *l);
void shard_sort_vars(psd_var **vars, size_t n);
void shard_create_variable_run(psd_shard *s, ps_rpc_call *call, const uint8_t *req,
                               size_t len, bool on_job_thread);
void shard_create_variable(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx);
void shard_list_variables(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx);
void shard_stats(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx);

/* persist.c */
int shard_store_open(psd_shard *s, uint64_t map_size);
void shard_store_close(psd_shard *s);
int shard_store_add(psd_shard *s, const psd_var *v);
int shard_store_del(psd_shard *s, const char *name);
int shard_store_replace(psd_shard *s, struct var_list *l);
uint64_t shard_store_commits(psd_shard *s);
int shard_ckpt_load(const char *path, struct var_list *l);
int shard_ckpt_convert(struct var_list *l, int row_dtype, int slot_dtype, char *why,
                       size_t whylen);
void shard_ckpt_converted_free(struct var_list *l);
int shard_flush_locked(psd_shard *s);
void shard_request_flush(psd_shard *s);
int shard_flush_wait(psd_shard *s);
void *shard_flusher_main(void *arg);

/* sparse_rpc.c */
void shard_sparse_pull(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx);
void shard_sparse_push(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx);

/* push.c: the pieces under way of a variable being freed. */
void shard_pieces_free(psd_var *v);

/* pull.c */
void shard_pull(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx);
bool shard_into_ok(psd_shard *s, ps_rpc_call *call, psd_var **vars,
                   const psd_shm_ref *into, size_t n);
uint64_t shard_reply_with_values(psd_shard *s, ps_rpc_call *call,
                                 const uint8_t *prefix, size_t prefix_len,
                                 int field, psd_var **vars, size_t n,
                                 const psd_shm_ref *into, const psd_range *ranges,
                                 int wire_dtype);

/* wirehalf.c: dense values and gradients in half precision on the wire.
 * shard_half_widen: every half gradient of r converted to float32 in this
 * thread's scratch (valid until the thread's next push), so that the rest
 * of the push sees FLOAT32; false with call failed (INVALID_ARGUMENT) for a
 * dtype other than the push declares, NaN or Inf, or half in shared memory.
 * shard_half_wire_ok: whether PullRequest r's items name one wire dtype
 * (into *dtype); false with call failed. shard_half_value: the part of a
 * value narrowed to dtype (a fresh buffer, released by the reply), the
 * clamps counted; false when out of memory. */
struct ps_wire_push;
bool shard_half_widen(psd_shard *s, ps_rpc_call *call, struct ps_wire_push *r);
/* The largest magnitude of each gradient of r as shard_half_widen found it
 * (UINT32_MAX: not widened), for push_check, when r is a half push; else
 * NULL. Valid until the thread's next push. */
const uint32_t *shard_half_mags(const struct ps_wire_push *r);
bool shard_half_wire_ok(psd_shard *s, ps_rpc_call *call, const void *pull_request,
                        int *dtype);
bool shard_half_value(psd_shard *s, const psd_var *v, psd_range r, int dtype,
                      ps_rpc_part *part);
bool shard_is_half(int dtype);
void shard_waiter_free(pull_waiter *w);
void shard_wake_waiters(psd_shard *s);
void *shard_sweeper_main(void *arg);

/* limits.c */
uint64_t shard_var_bytes(const psd_var *v);
uint64_t shard_slot_bytes(psd_var *v);
uint64_t shard_spec_bytes(const Ps__V1__VariableSpec *sp, size_t n);
uint64_t shard_caps_room(psd_shard *s);
bool shard_caps_reserve(psd_shard *s, ps_rpc_call *call, const char *name,
                        uint64_t bytes);
void shard_caps_settle(psd_shard *s, uint64_t bytes, bool held);
void shard_caps_release(psd_shard *s, uint64_t bytes);
void shard_caps_recount(psd_shard *s);
int shard_pull_admit(psd_shard *s, pull_waiter *w);
void shard_pull_refuse(psd_shard *s, ps_rpc_call *call, int why);
bool shard_pull_timed_out(const pull_waiter *w, int64_t now_ms);
void shard_pull_expired(psd_shard *s, pull_waiter *w, psd_var *v, uint64_t minv);

/* staleness.c: note and ok with wait_mu held; fail takes it. */
void shard_clock_note(psd_shard *s, uint32_t worker, uint64_t step, int64_t now_ms);
bool shard_clock_ok(const psd_shard *s, uint64_t step, uint32_t staleness,
                    int64_t now_ms);
void shard_clock_fail(psd_shard *s, ps_rpc_call *call, uint32_t worker,
                      uint64_t step, uint32_t staleness, bool server_gave_up);
void shard_clocks_free(psd_shard *s);

/* delete.c */
void shard_delete_variable(ps_rpc_call *call, const uint8_t *req, size_t len,
                           void *ctx);

/* push.c */
void shard_push(ps_rpc_call *call, const struct ps_piece *pieces, int npieces,
                void *ctx);
void shard_set_sync_workers(ps_rpc_call *call, const uint8_t *req, size_t len,
                            void *ctx);
void shard_pending_free(pending_push *p);
void shard_push_complete(psd_shard *s, pending_push *p);
void shard_answer_durable(psd_shard *s, uint64_t upto);

/* ---- pushshm.c: a push's gradients in shared memory ------------------ */

/* A gradient at least this big is checked, copied and applied in two
 * halves, one on the helper thread when it is idle (assist.h). */
#define SHARD_SPLIT_MIN_BYTES ((size_t)1 << 20)

/* Makes the gradients of r that lie in shared memory cursors over a copy
 * of them (read once, for the caller the unix socket names), and keeps the
 * push's value_into references in p. Called between psd_shmmap_enter and
 * _leave; returns false with call failed. */
bool shard_push_shm(psd_shard *s, ps_rpc_call *call, ps_wire_push *r,
                    pending_push *p, uint64_t *shm_in);
/* The largest magnitude of each gradient of this thread's last
 * shard_push_shm (UINT32_MAX: not from shared memory), or NULL. */
const uint32_t *shard_push_shm_mags(void);
/* Lets go of a big copy after its push. */
void shard_push_shm_trim(void);

#endif
