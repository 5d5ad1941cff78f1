/*
 * shard.h - one parameter-server shard: the variables it holds in memory,
 * their write-behind to LMDB, and the ps.v1.ParameterServer service over
 * them.
 *
 * Dense variables live in memory, one aligned block for the value and one
 * for the optimizer's slots, each guarded by its own read-write lock: a push
 * applies the optimizer in place straight from the request's bytes, a pull
 * serializes straight from the value into the response. A flusher thread
 * writes every variable that changed to LMDB in one transaction per commit
 * interval (group commit); --durable makes each push wait for the commit
 * that holds it before it is acknowledged.
 *
 * Durability promise (doc/operating.md): with the default 20 ms commit
 * interval a kill -9 loses at most the pushes acknowledged in the last
 * commit interval plus the duration of one commit; --durable loses nothing
 * acknowledged. A SIGTERM loses nothing: the shard flushes before it closes.
 *
 * Threads and lifetime: psd_shard_open loads the store; the service may then
 * be registered on an rpc server and called from its threads. Call
 * psd_shard_stop before the rpc server's shutdown (it answers every call
 * that waits, with UNAVAILABLE, so the drain can finish), and
 * psd_shard_close after it (it flushes and closes the store).
 */
#ifndef PSD_SHARD_H
#define PSD_SHARD_H

#include "common/metrics.h"
#include "common/rpc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct psd_shard psd_shard;

enum psd_consistency {
    PSD_ASYNC = 1,
    PSD_SYNC = 2,
    PSD_BOUNDED = 3, /* BOUNDED_STALENESS: applied as ASYNC, pulls wait */
};

typedef struct psd_shard_opts {
    const char *data_dir;        /* the LMDB environment */
    const char *checkpoint_root; /* checkpoints/ goes here; NULL = data_dir */
    uint64_t map_size;           /* LMDB map size; 0 = store's default */
    uint64_t map_size_max;       /* the map grows up to it; 0 = the free disk */
    int consistency;             /* default for specs that leave it unset */
    uint32_t workers;            /* sync: pushes per step when a spec says 0 */
    uint32_t max_sync_workers;   /* sync: most num_workers of a spec (or
                                    workers, if more); 0 = 65536 */
    int commit_interval_ms;      /* write-behind period, > 0 */
    bool durable;                /* acknowledge a push only once committed */
    bool allow_nonfinite;        /* accept NaN/Inf gradients */
    size_t max_message_bytes;    /* the rpc limit: bounds a variable's size */
    size_t checkpoint_keep;      /* complete checkpoints kept; 0 = all */
    /* Caps (limits.c), each 0 for none; psd sets them all. */
    size_t max_variables;        /* variables held */
    uint64_t max_bytes;          /* bytes held: values, slots, sync aggregates */
    size_t max_waiting_pulls;    /* pulls waiting for a version at once */
    int64_t max_pull_wait_ms;    /* the longest a pull waits for a version */
    /* What Stats reports of the transport (psd's --insecure and TLS). */
    bool insecure;               /* a non-loopback address in plaintext */
    const char *transport_security; /* "tls", "mtls", "plaintext"; static */
    int64_t worker_timeout_ms;   /* BOUNDED_STALENESS: a worker silent this
                                    long stops holding the others back */
    bool tokens_required;        /* psd --tokens: shown in Stats */
    /* Stats' local_address ("unix:/abs/path", "" or NULL for none) and
     * host_id: where a client on this host reaches psd (hostid.h). */
    const char *local_address;
    const char *host_id;
    uint64_t memory_limit;       /* sparse tables' RAM tier: about half (psd.c: never 0) */
    uint64_t max_rows_per_table; /* rows a sparse table may hold; bounds max_rows */
    uint64_t segment_size;       /* sparse rows' segment files sealed past it (0: 256M) */
    uint64_t compact_rate;       /* their compaction's bytes of I/O a second (0: 32M) */
    char *why;                   /* an open refused for damaged data names what
                                    and where here, one line (NULL: in the log) */
    size_t whylen;
} psd_shard_opts;

/* Opens the store under data_dir (creating it) and loads every variable.
 * Returns 0, PS_EINVAL_ARG, PS_ECORRUPT (a record or spec that does not
 * load; the log names it), -errno or PS_ESTORE. */
int psd_shard_open(const psd_shard_opts *opts, psd_shard **out);

/* Registers ParameterServer's methods on srv (before it starts). */
int psd_shard_register(psd_shard *s, ps_rpc_server *srv);

/* Refuses new waits and answers every waiting call with UNAVAILABLE. */
void psd_shard_stop(psd_shard *s);

/* Flushes what is not yet in LMDB, stops the flusher and the sweeper, closes
 * the store and frees. Returns the final flush's result. NULL is a no-op. */
int psd_shard_close(psd_shard *s);

/* Commits every change now (the checkpoint path and tests use it). */
int psd_shard_flush(psd_shard *s);

/* Resident bytes measured at open, before any variable was loaded: the
 * fixed overhead Stats reports beside the variables' own bytes. */
void psd_shard_set_fixed_overhead(psd_shard *s, uint64_t bytes);

/* Where the shard is, for the daemon's status line (systemd's STATUS=) and
 * its re-registration (whether it holds any variable). */
struct psd_shard_brief {
    size_t variables;
    uint64_t max_version;     /* the highest version of any variable */
    uint64_t updates;         /* pushes applied since psd started */
    uint64_t last_checkpoint; /* its step; 0: none */
};
void psd_shard_brief(psd_shard *s, struct psd_shard_brief *out);

/* The process's resident set size in bytes (from /proc/self/statm). */
uint64_t psd_rss_bytes(void);

/* What psd's /metrics page reads: the shard, and the rpc server that serves
 * it (for its calls failed, by code). Both outlive the endpoint. */
typedef struct psd_metrics_src {
    psd_shard *shard;
    const ps_rpc_server *srv;
} psd_metrics_src;

/* psd's collector (a ps_metrics_collect_fn, common/metrics.h; ctx is a
 * psd_metrics_src): writes every psd_* family, reading the shard's
 * counters and histograms and, briefly, its locks. Any thread. The
 * families and their meaning are listed in server/metrics.c and
 * doc/operating.md, "Metrics: Prometheus". */
void psd_metrics_collect(ps_metrics *m, void *ctx);

#endif
