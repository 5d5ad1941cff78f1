/*
 * pscoord - the job's coordinator: membership and roles, heartbeats and
 * liveness, the placement of variables over ps shards, the job checkpoint
 * schedule and the restore of a ps that comes back empty. Serves
 * ps.v1.Coordinator (and grpc.health.v1.Health) over gRPC.
 *
 * The cluster is a TF_CONFIG-shaped spec from --cluster FILE or $TF_CONFIG
 * (static membership), or, with neither, whatever registers (dynamic). The
 * state lives in --state-dir: state.json (reloaded at start, so a restarted
 * coordinator carries the job on), checkpoints/job-<step>.json (the job
 * checkpoint manifests) and, on shutdown, summary.json.
 *
 * Prints "PORT <n>" on stdout once it serves, logs one line per event on
 * stderr, and on SIGTERM or SIGINT ends the watch streams, drains the calls
 * in flight, stops its threads, writes state.json and summary.json and
 * exits 0.
 *
 * Exit status: 0 after a clean shutdown; 1 when it cannot start (state of
 * another job, address in use); 2 for a bad command line or cluster spec.
 */
#include "cluster.h"
#include "conf.h"
#include "coord.h"
#include "errors.h"
#include "log.h"
#include "ps_config.h"
#include "rpc.h"
#include "schedule.h"
#include "service.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pscoord_conf {
    char *listen;
    char *cluster;
    char *job_id;
    char *state_dir;
    int64_t heartbeat_interval_ms;
    int64_t heartbeat_timeout_ms;
    uint64_t checkpoint_every_steps;
    int64_t checkpoint_every_ms;
    int checkpoint_keep;
    uint64_t split_threshold;
    int64_t register_warn_ms;
    int threads;
    int64_t shutdown_grace_ms;
    int log_level;
};

static const char *const level_choices[] = {"error", "warn", "info", "debug",
                                            NULL};

/* Defaults, each with why. */
static const ps_opt pscoord_opts[] = {
    /* 7071: beside psd's 7070, so a one-host job needs no port list. */
    {"listen", PS_OPT_STRING, offsetof(struct pscoord_conf, listen),
     "0.0.0.0:7071",
     "host:port to serve on; port 0 picks a free one (printed as PORT <n>)",
     0, 0, NULL},
    {"cluster", PS_OPT_STRING, offsetof(struct pscoord_conf, cluster), NULL,
     "TF_CONFIG-shaped cluster spec (static membership); default: "
     "$TF_CONFIG, else dynamic membership", 0, 0, NULL},
    {"job-id", PS_OPT_STRING, offsetof(struct pscoord_conf, job_id), NULL,
     "the job's id, which every task must name (default: the spec's "
     "job_id, else \"job\")", 0, 0, NULL},
    {"state-dir", PS_OPT_STRING, offsetof(struct pscoord_conf, state_dir),
     NULL, "directory of state.json, checkpoints/ and summary.json "
     "(required)", 0, 0, NULL},
    /* 500 ms: six heartbeats fit in the timeout, so one lost packet or a
     * short pause never kills a task, and a death is seen within seconds. */
    {"heartbeat-interval", PS_OPT_DURATION_MS,
     offsetof(struct pscoord_conf, heartbeat_interval_ms), "500ms",
     "how often tasks are told to send Heartbeat", 10, 600000, NULL},
    /* 3 s: long enough to ride out a GC-like stall or a busy host, short
     * enough that sync training waits seconds, not minutes, for the dead. */
    {"heartbeat-timeout", PS_OPT_DURATION_MS,
     offsetof(struct pscoord_conf, heartbeat_timeout_ms), "3s",
     "a task not heard from for longer is dead", 20, 3600000, NULL},
    {"checkpoint-every-steps", PS_OPT_UINT64,
     offsetof(struct pscoord_conf, checkpoint_every_steps), "0",
     "take a job checkpoint each time the global step crosses a multiple of "
     "N (0 = off)", 0, 0, NULL},
    {"checkpoint-every", PS_OPT_DURATION_MS,
     offsetof(struct pscoord_conf, checkpoint_every_ms), "0",
     "take a job checkpoint this often while the global step advances "
     "(0 = off)", 0, 31536000000.0, NULL},
    /* 3: the latest, plus two to fall back on if it turns out bad. */
    {"checkpoint-keep", PS_OPT_INT,
     offsetof(struct pscoord_conf, checkpoint_keep), "3",
     "job checkpoint manifests kept", 1, 1000000, NULL},
    /* 512 KiB: a part per shard pays off once a variable is big enough that
     * one shard's bandwidth, not the call overhead, bounds a pull. It is
     * PS_PLACE_SPLIT_DEFAULT, which a worker without a coordinator uses. */
    {"split-threshold", PS_OPT_SIZE,
     offsetof(struct pscoord_conf, split_threshold), "512K",
     "a variable of more bytes (and more than one row) is split by rows "
     "over all ps shards", 0, 1e15, NULL},
    /* 30 s: time for every host of a job to start its tasks. */
    {"register-warn-after", PS_OPT_DURATION_MS,
     offsetof(struct pscoord_conf, register_warn_ms), "30s",
     "static spec: warn about a task that has not registered after this "
     "long (and stop counting it as a sync worker)", 0, 86400000, NULL},
    {"threads", PS_OPT_INT, offsetof(struct pscoord_conf, threads), "2",
     "gRPC completion-queue threads", 1, 64, NULL},
    {"shutdown-grace", PS_OPT_DURATION_MS,
     offsetof(struct pscoord_conf, shutdown_grace_ms), "5s",
     "how long SIGTERM waits for calls in flight before cancelling them", 0,
     600000, NULL},
    {"log-level", PS_OPT_ENUM, offsetof(struct pscoord_conf, log_level),
     "info", "error, warn, info or debug", 0, 0, level_choices},
    {0},
};

/* Loads the spec from --cluster or $TF_CONFIG into *spec. Returns 1 when
 * one was loaded, 0 when there is none (dynamic), -1 after an error line. */
static int load_cluster(const struct pscoord_conf *c, ps_cluster *spec)
{
    char err[1024];
    int rc;
    if (c->cluster != NULL && c->cluster[0] != '\0') {
        rc = ps_cluster_load_file(c->cluster, spec, err, sizeof err);
    } else {
        const char *env = getenv("TF_CONFIG");
        if (env == NULL || env[0] == '\0')
            return 0;
        rc = ps_cluster_from_env(spec, err, sizeof err);
    }
    if (rc != 0) {
        fprintf(stderr, "pscoord: %s\n", err);
        return -1;
    }
    return 1;
}

int main(int argc, char **argv)
{
    struct pscoord_conf c;
    memset(&c, 0, sizeof c);
    char err[1024];
    int first = argc;
    int rc = ps_conf_load(pscoord_opts, &c, argc, argv, &first, err,
                          sizeof err);
    if (rc == PS_CONF_HELP) {
        ps_conf_usage(pscoord_opts, "pscoord", "--state-dir DIR [options]",
                      stdout);
        ps_conf_free(pscoord_opts, &c);
        return 0;
    }
    if (rc == PS_CONF_VERSION) {
        printf("pscoord %s\n", PS_VERSION);
        ps_conf_free(pscoord_opts, &c);
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "pscoord: %s\n", err);
        ps_conf_free(pscoord_opts, &c);
        return 2;
    }
    if (first < argc) {
        fprintf(stderr, "pscoord: unexpected argument '%s'\n", argv[first]);
        ps_conf_free(pscoord_opts, &c);
        return 2;
    }
    if (c.state_dir == NULL || c.state_dir[0] == '\0') {
        fprintf(stderr, "pscoord: --state-dir is required\n");
        ps_conf_free(pscoord_opts, &c);
        return 2;
    }
    if (c.heartbeat_timeout_ms <= c.heartbeat_interval_ms) {
        fprintf(stderr, "pscoord: --heartbeat-timeout (%" PRId64 " ms) must "
                "exceed --heartbeat-interval (%" PRId64 " ms)\n",
                c.heartbeat_timeout_ms, c.heartbeat_interval_ms);
        ps_conf_free(pscoord_opts, &c);
        return 2;
    }
    ps_cluster spec;
    memset(&spec, 0, sizeof spec);
    int have_spec = load_cluster(&c, &spec);
    if (have_spec < 0) {
        ps_conf_free(pscoord_opts, &c);
        return 2;
    }
    const char *job_id = "job";
    if (have_spec && spec.job_id != NULL)
        job_id = spec.job_id;
    if (c.job_id != NULL && c.job_id[0] != '\0') {
        if (have_spec && spec.job_id != NULL &&
            strcmp(spec.job_id, c.job_id) != 0) {
            fprintf(stderr, "pscoord: --job-id '%s' differs from the cluster "
                    "spec's job_id '%s'\n", c.job_id, spec.job_id);
            ps_cluster_close(&spec);
            ps_conf_free(pscoord_opts, &c);
            return 2;
        }
        job_id = c.job_id;
    }
    ps_log_init(argv[0], (enum ps_log_level)c.log_level);
    ps_signals_block();

    coord *co = NULL;
    coord_sched *sched = NULL;
    coord_service *svc = NULL;
    ps_rpc_server *srv = NULL;
    int status = 1;
    struct coord_opts co_opts = {
        .job_id = job_id,
        .state_dir = c.state_dir,
        .cluster = have_spec ? &spec : NULL,
        .heartbeat_interval_ms = (int)c.heartbeat_interval_ms,
        .heartbeat_timeout_ms = (int)c.heartbeat_timeout_ms,
        .register_warn_ms = (int)c.register_warn_ms,
        .checkpoint_every_steps = c.checkpoint_every_steps,
        .checkpoint_every_ms = c.checkpoint_every_ms,
        .checkpoint_keep = c.checkpoint_keep,
        .split_threshold = c.split_threshold,
    };
    if ((rc = coord_create(&co_opts, &co, err, sizeof err)) != 0) {
        fprintf(stderr, "pscoord: %s\n", err);
        goto close_spec;
    }
    struct coord_sched_opts so = {.checkpoint_keep = c.checkpoint_keep};
    if ((rc = coord_sched_start(co, &so, &sched)) != 0) {
        fprintf(stderr, "pscoord: cannot start its threads: %s\n",
                ps_strerror(rc));
        goto destroy_coord;
    }
    if ((rc = coord_service_create(co, sched,
                                   (int)c.heartbeat_interval_ms, &svc)) != 0) {
        fprintf(stderr, "pscoord: out of memory\n");
        goto stop_sched;
    }
    ps_rpc_server_opts ro = {.listen = c.listen, .threads = c.threads};
    int port = 0;
    if ((rc = ps_rpc_server_create(&ro, &srv)) != 0 ||
        (rc = coord_service_register(svc, srv)) != 0 ||
        (rc = ps_rpc_server_start(srv, &port)) != 0) {
        fprintf(stderr, "pscoord: cannot serve on %s: %s\n", c.listen,
                rc == -EADDRINUSE ? "address in use or not host:port"
                                  : ps_strerror(rc));
        goto destroy_server;
    }
    if ((rc = coord_service_start(svc)) != 0) {
        fprintf(stderr, "pscoord: cannot start the watch thread: %s\n",
                ps_strerror(rc));
        goto destroy_server;
    }
    printf("PORT %d\n", port);
    fflush(stdout);
    ps_log_info("pscoord %s serving job '%s' on %s (port %d), %s membership"
                "%s, state in %s", PS_VERSION, job_id, c.listen, port,
                have_spec ? "static" : "dynamic",
                have_spec ? (c.cluster != NULL ? " from --cluster"
                                               : " from TF_CONFIG") : "",
                c.state_dir);

    int sig = ps_signals_wait(-1);
    ps_log_info("signal %d: ending watches, draining calls, saving state",
                sig);
    status = 0;
    coord_service_stop(svc);
    ps_rpc_server_shutdown(srv, (int)c.shutdown_grace_ms);
destroy_server:
    coord_service_stop(svc);
    ps_rpc_server_destroy(srv);
    coord_service_destroy(svc);
stop_sched:
    coord_stop(co);
    coord_sched_destroy(sched);
    if (status == 0) {
        if (coord_save(co) != 0 || coord_write_summary(co) != 0)
            status = 1;
        else
            ps_log_info("stopped cleanly");
    }
destroy_coord:
    coord_destroy(co);
close_spec:
    ps_cluster_close(&spec);
    ps_conf_free(pscoord_opts, &c);
    return status;
}
