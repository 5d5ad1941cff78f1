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
 * Prints "PORT <n>" on stdout once it serves, then "METRICS_PORT <n>" when
 * it serves Prometheus' /metrics (--metrics-listen), logs one line per
 * event on stderr, and on SIGTERM or SIGINT ends the watch streams, drains the calls
 * in flight, stops its threads, writes state.json and summary.json and
 * exits 0. SIGHUP reloads the --tokens file.
 *
 * Exit status: 0 after a clean shutdown; 1 when it cannot start (state of
 * another job, address in use); 2 for a bad command line or cluster spec.
 */
#include "common/auth.h"
#include "common/cluster.h"
#include "common/conf.h"
#include "common/daemon.h"
#include "coordinator/coord.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/retention.h"
#include "common/metrics_http.h"
#include "common/notify.h"
#include "common/proc.h"
#include "ps_config.h"
#include "common/rpc.h"
#include "common/tls.h"
#include "coordinator/schedule.h"
#include "coordinator/shardcall.h"
#include "coordinator/service.h"

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
    ps_daemon_conf common; /* --metrics-*, --tls-*, --tokens, --log-* */
};

/* Defaults, each with why. */
static const ps_opt pscoord_opts[] = {
    /* Unset: TF_CONFIG naming this task the chief gives the port (see
     * listen_from_tf_config), else 127.0.0.1:7071: beside psd's 7070, so a
     * one-host job needs no port list, and loopback, so the network only
     * when told to, with TLS. */
    {"listen", PS_OPT_STRING, offsetof(struct pscoord_conf, listen), NULL,
     "host:port to serve on; port 0 picks a free one (printed as PORT <n>); "
     "an address other than loopback needs TLS or --insecure; default: "
     "the chief's port (on 0.0.0.0 unless the chief's address is loopback) "
     "when TF_CONFIG names this task the chief, else 127.0.0.1:7071", 0, 0, NULL},
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
     "job checkpoint manifests kept", 1, PS_RETENTION_MAX_KEEP, NULL},
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
    PS_DAEMON_OPTS(struct pscoord_conf, common,
                   "file holding the token pscoord sends to the psd shards (an operator's: "
                   "it checkpoints, restores and sets sync counts); default: none"),
    {0},
};

/* Everything main holds, so that each step takes one pointer and the
 * way out undoes what is there. */
struct pscoord {
    struct pscoord_conf c;
    ps_proc_cmd cmd;
    ps_cluster spec;
    bool have_spec;
    const char *job_id; /* borrowed from c or spec */
    ps_proc_loop *loop;
    coord *co;
    coord_sched *sched;
    coord_service *svc;
    ps_rpc_server *srv;
    ps_metrics_http *metrics; /* NULL: --metrics-listen off */
    ps_auth *auth;            /* --tokens; NULL: open */
    int port;
};

/* Loads the spec from --cluster or $TF_CONFIG into p->spec, when there is
 * one (else membership is dynamic). Returns 0, or -1 after an error line. */
static int load_cluster(struct pscoord *p)
{
    const struct pscoord_conf *c = &p->c;
    char err[1024];
    int rc;
    if (c->cluster != NULL && c->cluster[0] != '\0') {
        rc = ps_cluster_load_file(c->cluster, &p->spec, err, sizeof err);
    } else {
        const char *env = getenv("TF_CONFIG");
        if (env == NULL || env[0] == '\0')
            return 0;
        rc = ps_cluster_from_env(&p->spec, err, sizeof err);
    }
    if (rc != 0) {
        fprintf(stderr, "pscoord: %s\n", err);
        return -1;
    }
    p->have_spec = true;
    return 0;
}

/* --tokens (the table every call is checked against) and --token-file
 * (what pscoord sends to the shards). Returns PS_PROC_RUN, or 2 after one
 * line naming the file (and line), with the configuration freed. */
static int load_tokens(struct pscoord *p)
{
    char token[PS_AUTH_TOKEN_MAX + 1];
    int status = ps_daemon_load_tokens(&p->cmd, &p->c.common, p->c.listen, &p->auth, token,
                                       sizeof token);
    if (status != PS_PROC_RUN)
        return status;
    coord_call_set_token(token);
    explicit_bzero(token, sizeof token);
    return PS_PROC_RUN;
}

/* TF_CONFIG naming this task chief[0] (as a Kubeflow TFJob or any
 * TensorFlow launcher does for the chief's pod): pscoord, which does the
 * chief's duties, serves on the chief's port, on every interface (as
 * TensorFlow's own server binds its task's port: the chief's name may not
 * resolve to this host before it is ready), or on the chief's address
 * when that is a loopback one (a cluster on one host stays on loopback).
 * A --listen on another port is refused with one line naming both.
 * Without such a TF_CONFIG, --listen defaults to 127.0.0.1:7071. Returns
 * PS_PROC_RUN, or 2 after the error line (configuration freed). */
static int listen_from_tf_config(struct pscoord *p)
{
    struct pscoord_conf *c = &p->c;
    char err[512], host[256] = "";
    int port = -1, lport;
    ps_cluster tf;
    memset(&tf, 0, sizeof tf);
    int rc = ps_cluster_from_env(&tf, err, sizeof err);
    if (rc != 0 && rc != PS_ENOTFOUND)
        return ps_proc_quit(&p->cmd, 2, "%s", err);
    const char *chief = rc == 0 && tf.has_task && tf.task_role == PS_ROLE_CHIEF
                        ? ps_cluster_task_address(&tf, PS_ROLE_CHIEF, tf.task_index)
                        : NULL;
    if (chief != NULL && ps_addr_split(chief, host, sizeof host, &port) != 0)
        port = -1;
    int status = PS_PROC_RUN;
    if (chief != NULL && c->listen != NULL &&
        (ps_addr_split(c->listen, host, sizeof host, &lport) != 0 || lport != port)) {
        char both[600];
        snprintf(both, sizeof both, "TF_CONFIG's chief[%d] is %s but --listen says %s",
                 tf.task_index, chief, c->listen);
        ps_cluster_close(&tf);
        return ps_proc_quit(&p->cmd, 2, "%s", both);
    }
    if (c->listen == NULL) {
        char addr[64];
        bool loopback = strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
                        strcmp(host, "localhost") == 0;
        if (chief != NULL && loopback)
            snprintf(addr, sizeof addr, "%s", chief);
        else if (chief != NULL)
            snprintf(addr, sizeof addr, "0.0.0.0:%d", port);
        else
            snprintf(addr, sizeof addr, "127.0.0.1:7071");
        c->listen = strdup(addr);
        if (c->listen == NULL)
            status = ps_proc_quit(&p->cmd, 1, "out of memory");
    }
    ps_cluster_close(&tf);
    return status;
}

/* The checks the options table cannot make, the cluster spec and the job
 * id. Returns PS_PROC_RUN, or 2 after the error line (configuration and
 * spec freed). */
static int check_conf(struct pscoord *p)
{
    const struct pscoord_conf *c = &p->c;
    if (c->state_dir == NULL || c->state_dir[0] == '\0')
        return ps_proc_quit(&p->cmd, 2, "--state-dir is required");
    int tf_status = listen_from_tf_config(p);
    if (tf_status != PS_PROC_RUN)
        return tf_status;
    if (c->heartbeat_timeout_ms <= c->heartbeat_interval_ms)
        return ps_proc_quit(&p->cmd, 2, "--heartbeat-timeout (%" PRId64 " ms) "
                            "must exceed --heartbeat-interval (%" PRId64 " ms)",
                            c->heartbeat_timeout_ms, c->heartbeat_interval_ms);
    char err[512];
    ps_tls_opts tls = ps_tls_opts_of(&c->common.tls);
    bool exposed = ps_tls_check_listen(c->listen, &tls, false, err, sizeof err) != 0;
    if ((exposed && !c->common.tls.insecure) || ps_tls_check_files(&tls, err, sizeof err) != 0)
        return ps_proc_quit(&p->cmd, 2, "%s", err);
    /* Its calls to psd (shardcall.c) go with the same identity. */
    if (ps_tls_set_client_default(&tls) != 0)
        return ps_proc_quit(&p->cmd, 1, "out of memory");
    if (exposed)
        ps_log_warn("--insecure: serving %s in plaintext: anyone who reaches it "
                    "can register tasks and drive checkpoints and restores",
                    c->listen);
    if (load_cluster(p) != 0) {
        ps_conf_free(pscoord_opts, &p->c);
        return 2;
    }
    if (load_tokens(p) != PS_PROC_RUN) {
        ps_cluster_close(&p->spec);
        return 2;
    }
    const char *spec_job = p->have_spec ? p->spec.job_id : NULL;
    p->job_id = spec_job != NULL ? spec_job : "job";
    if (c->job_id != NULL && c->job_id[0] != '\0') {
        if (spec_job != NULL && strcmp(spec_job, c->job_id) != 0) {
            int st = ps_proc_quit(&p->cmd, 2, "--job-id '%s' differs from the "
                                  "cluster spec's job_id '%s'", c->job_id, spec_job);
            ps_cluster_close(&p->spec);
            return st;
        }
        p->job_id = c->job_id;
    }
    return PS_PROC_RUN;
}

/* The coordinator's core and its scheduling threads. Returns 0, or 1
 * after the error line (what was made is undone by main's way out). */
static int start_core(struct pscoord *p)
{
    const struct pscoord_conf *c = &p->c;
    char err[1024];
    struct coord_opts co_opts = {
        .job_id = p->job_id,
        .state_dir = c->state_dir,
        .cluster = p->have_spec ? &p->spec : NULL,
        .heartbeat_interval_ms = (int)c->heartbeat_interval_ms,
        .heartbeat_timeout_ms = (int)c->heartbeat_timeout_ms,
        .register_warn_ms = (int)c->register_warn_ms,
        .checkpoint_every_steps = c->checkpoint_every_steps,
        .checkpoint_every_ms = c->checkpoint_every_ms,
        .checkpoint_keep = c->checkpoint_keep,
        .split_threshold = c->split_threshold,
    };
    int rc = coord_create(&co_opts, &p->co, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "pscoord: %s\n", err);
        return 1;
    }
    struct coord_sched_opts so = {.checkpoint_keep = c->checkpoint_keep};
    if ((rc = coord_sched_start(p->co, &so, &p->sched)) != 0) {
        fprintf(stderr, "pscoord: cannot start its threads: %s\n",
                ps_strerror(rc));
        return 1;
    }
    return 0;
}

/* Serves /metrics on --metrics-listen, unless it is off (announced by
 * serve, after PORT). Returns 0 or the exit code after the error line
 * (ps_metrics_http_serve). */
static int serve_metrics(struct pscoord *p)
{
    return ps_metrics_http_serve("pscoord", p->c.common.metrics_listen, &p->c.common.metrics_http,
                                 coord_metrics_collect, p->co, &p->metrics);
}

/* The Coordinator service on a gRPC server, then its watch thread, then
 * "PORT <n>" and "METRICS_PORT <n>". Returns 0, or 1 after the error
 * line. */
static int serve(struct pscoord *p)
{
    const struct pscoord_conf *c = &p->c;
    int rc = coord_service_create(p->co, p->sched, (int)c->heartbeat_interval_ms,
                                  &p->svc);
    if (rc != 0) {
        fprintf(stderr, "pscoord: out of memory\n");
        return 1;
    }
    ps_tls_opts tls = ps_tls_opts_of(&c->common.tls);
    ps_rpc_server_opts ro = {.listen = c->listen, .threads = c->threads,
                             .tls = &tls, .auth = p->auth};
    if ((rc = ps_rpc_server_create(&ro, &p->srv)) != 0 ||
        (rc = coord_service_register(p->svc, p->srv)) != 0 ||
        (rc = ps_rpc_server_start(p->srv, &p->port)) != 0) {
        fprintf(stderr, "pscoord: cannot serve on %s: %s\n", c->listen,
                rc == -EADDRINUSE ? "address in use or not host:port"
                                  : ps_strerror(rc));
        return 1;
    }
    if ((rc = coord_service_start(p->svc)) != 0) {
        fprintf(stderr, "pscoord: cannot start the watch thread: %s\n",
                ps_strerror(rc));
        return 1;
    }
    ps_proc_announce(p->port);
    if (p->metrics != NULL) {
        ps_metrics_http_announce(ps_metrics_http_port(p->metrics));
        ps_log_info("metrics on %s (port %d), GET /metrics", c->common.metrics_listen,
                    ps_metrics_http_port(p->metrics));
    }
    ps_log_info("pscoord %s serving job '%s' on %s (port %d, %s), %s membership"
                "%s, state in %s", PS_VERSION, p->job_id, c->listen, p->port,
                ps_tls_server_mode(&tls),
                p->have_spec ? "static" : "dynamic",
                p->have_spec ? (c->cluster != NULL ? " from --cluster"
                                                   : " from TF_CONFIG") : "",
                c->state_dir);
    return 0;
}

/* How often the STATUS= line is brought up to date (sent only when it
 * changed): about a heartbeat's scale, so `systemctl status` is current. */
#define PSCOORD_STATUS_MS 2000

/* The STATUS= line: live tasks, the global step, the last job checkpoint. */
static void describe(void *ctx, char *out, size_t len)
{
    struct pscoord *p = ctx;
    struct coord_cluster *cs = coord_snapshot(p->co);
    if (cs == NULL) {
        snprintf(out, len, "serving job '%s' on port %d", p->job_id, p->port);
        return;
    }
    int ps_live = 0;
    for (int i = 0; i < cs->ntasks; i++)
        ps_live += cs->tasks[i].role == PS_ROLE_PS && cs->tasks[i].alive;
    char ckpt[64] = "no job checkpoint yet";
    if (cs->last_checkpoint_step > 0)
        snprintf(ckpt, sizeof ckpt, "last job checkpoint at step %llu",
                 (unsigned long long)cs->last_checkpoint_step);
    snprintf(out, len, "serving job '%s' on port %d: %u/%u workers live, "
             "%d/%u ps live, global step %llu, %s", p->job_id, p->port,
             cs->live_workers, cs->num_workers, ps_live, cs->num_ps,
             (unsigned long long)cs->global_step, ckpt);
    coord_cluster_free(cs);
}

/* Once pscoord serves with its state loaded (start_core, serve): tells
 * systemd it is ready, with a first STATUS= line, then from the control
 * loop keeps the status current and sends the watchdog's keep-alives
 * (common/notify.h). Nothing without systemd; a timer that cannot be added
 * (out of memory) is logged and pscoord serves on. */
static void supervise(struct pscoord *p)
{
    ps_proc_loop_supervise(p->loop, PSCOORD_STATUS_MS, describe, p);
}

/* Undoes whatever start_core and serve made, in reverse. After a signal
 * (clean) the watch streams end and the calls in flight drain within the
 * grace period first, and the state and summary are written last. Returns
 * the exit status. */
static int stop(struct pscoord *p, bool clean)
{
    int status = clean ? 0 : 1;
    /* First: the collector reads the core. */
    ps_metrics_http_stop(p->metrics);
    if (clean) {
        coord_service_stop(p->svc);
        ps_rpc_server_shutdown(p->srv, (int)p->c.shutdown_grace_ms);
    }
    coord_service_stop(p->svc);
    ps_rpc_server_destroy(p->srv);
    coord_service_destroy(p->svc);
    if (p->sched != NULL) {
        coord_stop(p->co);
        coord_sched_destroy(p->sched);
    }
    if (clean) {
        if (coord_save(p->co) != 0 || coord_write_summary(p->co) != 0)
            status = 1;
        else
            ps_log_info("stopped cleanly");
    }
    coord_destroy(p->co);
    return status;
}

int main(int argc, char **argv)
{
    struct pscoord p;
    memset(&p, 0, sizeof p);
    p.cmd = ps_daemon_cmd("pscoord", "--state-dir DIR [options]", pscoord_opts, &p.c,
                          &p.c.common, "PSCOORD");
    int status = ps_proc_prologue(&p.cmd, argc, argv);
    if (status != PS_PROC_RUN)
        return status;
    if ((status = check_conf(&p)) != PS_PROC_RUN)
        return status;
    if ((status = ps_proc_lock_dir(&p.cmd, "--state-dir", p.c.state_dir)) != PS_PROC_RUN) {
        ps_cluster_close(&p.spec);
        return status;
    }
    /* TF_CONFIG's chief: the coordinator does the chief's duties. */
    ps_log_set_task("chief", -1);

    bool clean = false;
    int metrics_status = 0; /* serve_metrics' exit status: 2 for a bad value */
    int rc = ps_proc_loop_create(&p.loop);
    if (rc != 0)
        fprintf(stderr, "pscoord: cannot set up signal handling: %s\n",
                ps_strerror(rc));
    else if (start_core(&p) == 0 && (metrics_status = serve_metrics(&p)) == 0 &&
             serve(&p) == 0) {
        supervise(&p);
        ps_proc_loop_on_hup(p.loop, ps_auth_reload_logged, p.auth);
        int sig = ps_proc_loop_run(p.loop);
        ps_log_info("signal %d: ending watches, draining calls, saving state",
                    sig);
        clean = true;
    }
    status = stop(&p, clean);
    if (metrics_status != 0)
        status = metrics_status;
    ps_cluster_close(&p.spec);
    status = ps_proc_epilogue(&p.cmd, p.loop, status);
    ps_auth_destroy(p.auth); /* after the server that checked with it */
    return status;
}
