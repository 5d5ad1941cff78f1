/*
 * cmd_cluster.c - the commands about the job: cluster validate (a cluster
 * spec, offline) and status (what the coordinator knows), and the labels
 * status shares with top. See psctl.h.
 */
#include "tools/psctl.h"

#include "common/cluster.h"
#include "common/errors.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- cluster validate ------------------------------------------------- */

/* Prints "worker    2  h1:2222, h2:2222", eliding past four addresses. */
static void print_role(const ps_cluster *c, enum ps_role r)
{
    printf("  %-10s %d", ps_role_name(r), c->n[r]);
    for (int i = 0; i < c->n[r] && i < 4; i++)
        printf("%s%s", i == 0 ? "  " : ", ", c->addrs[r][i]);
    if (c->n[r] > 4)
        printf(", ... (%d more)", c->n[r] - 4);
    printf("\n");
}

struct validate_cfg {
    int output;
};

static const ps_opt validate_opts[] = {
    OUTPUT_OPT(struct validate_cfg),
    {0},
};

/* {"source", "tasks": N, "cluster": {role: [addresses]}, "task": {"type",
 * "index", "address"} or null, "job_id": string or null}. */
static json_t *validate_json(const ps_cluster *c, const char *source, int total)
{
    json_t *root = json_object(), *roles = json_object();
    json_object_set_new(root, "source", json_string(source));
    json_object_set_new(root, "tasks", json_integer(total));
    for (int r = 0; r < PS_ROLE_COUNT; r++) {
        json_t *list = json_array();
        for (int i = 0; i < c->n[r]; i++)
            json_array_append_new(list, json_string(c->addrs[r][i]));
        json_object_set_new(roles, ps_role_name((enum ps_role)r), list);
    }
    json_object_set_new(root, "cluster", roles);
    if (c->has_task)
        json_object_set_new(root, "task", json_pack(
            "{sssiss}", "type", ps_role_name(c->task_role), "index", c->task_index,
            "address", ps_cluster_task_address(c, c->task_role, c->task_index)));
    else
        json_object_set_new(root, "task", json_null());
    json_object_set_new(root, "job_id", c->job_id != NULL ? json_string(c->job_id)
                                                          : json_null());
    return root;
}

int cmd_cluster_validate(const struct command *self, int argc, char **argv)
{
    struct validate_cfg cfg = {0};
    char *pos[64];
    int npos = 0;
    int rc = parse_command(self, validate_opts, &cfg, argc, argv, "FILE", 0, 64, pos,
                           &npos);
    if (rc >= 0)
        return rc;
    if (npos > 1) {
        fprintf(stderr, "psctl: cluster validate takes at most one FILE, "
                        "got %d arguments\n", npos);
        return EXIT_USAGE;
    }

    ps_cluster c;
    char err[1024];
    const char *source;
    if (npos > 0) {
        source = pos[0];
        rc = ps_cluster_load_file(source, &c, err, sizeof err);
    } else {
        source = "TF_CONFIG";
        rc = ps_cluster_from_env(&c, err, sizeof err);
        if (rc == PS_ENOTFOUND)
            snprintf(err, sizeof err, "no FILE given and TF_CONFIG is not set");
    }
    if (rc != 0) {
        fprintf(stderr, "psctl: %s\n", err);
        return EXIT_FAIL;
    }

    int total = 0;
    for (int r = 0; r < PS_ROLE_COUNT; r++)
        total += c.n[r];
    if (cfg.output == OUTPUT_JSON) {
        rc = pbjson_print(self, validate_json(&c, source, total));
        ps_cluster_close(&c);
        return rc;
    }
    printf("%s: valid cluster spec, %d task%s\n", source, total,
           total == 1 ? "" : "s");
    for (int r = 0; r < PS_ROLE_COUNT; r++)
        print_role(&c, (enum ps_role)r);
    if (c.has_task)
        printf("  task       %s[%d] at %s\n", ps_role_name(c.task_role),
               c.task_index,
               ps_cluster_task_address(&c, c.task_role, c.task_index));
    else
        printf("  task       (none)\n");
    if (c.job_id != NULL)
        printf("  job_id     %s\n", c.job_id);
    ps_cluster_close(&c);
    return EXIT_OK;
}

/* ---- status (the coordinator) ----------------------------------------- */

struct status_cfg {
    char *coordinator;
    int64_t timeout_ms;
    bool watch;
    int output;
};

static const ps_opt status_opts[] = {
    COORD_OPTS(struct status_cfg, "deadline of the call (default: 10s); --watch waits forever"),
    {"watch", PS_OPT_BOOL, offsetof(struct status_cfg, watch), "false",
     "print a new block each time the coordinator sends one, until "
     "interrupted", 0, 0, NULL},
    OUTPUT_OPT(struct status_cfg),
    {0},
};

static const char *task_state(const Ps__V1__TaskInfo *t)
{
    if (t->alive)
        return "alive";
    if (t->incarnation == 0)
        return "never seen";
    /* Registered before the coordinator restarted, not heard from since. */
    if (t->last_heartbeat_age_seconds < 0)
        return "unknown";
    return "dead";
}

/* One word per task state, for scripts: "alive"; "unseen" (never
 * registered); "unknown" (registered before the coordinator restarted, not
 * heard from since); "dead". */
static const char *state_word(const Ps__V1__TaskInfo *t)
{
    if (t->alive)
        return "alive";
    if (t->incarnation == 0)
        return "unseen";
    return t->last_heartbeat_age_seconds < 0 ? "unknown" : "dead";
}

json_t *cluster_json(const Ps__V1__ClusterState *c)
{
    json_t *root = pbjson_message(&c->base);
    json_t *tasks = root != NULL ? json_object_get(root, "tasks") : NULL;
    for (size_t i = 0; tasks != NULL && i < c->n_tasks; i++) {
        const Ps__V1__TaskInfo *t = c->tasks[i];
        json_t *o = json_array_get(tasks, i);
        json_object_set_new(o, "state", json_string(state_word(t)));
        bool trains = t->role == PS__V1__ROLE__WORKER || t->role == PS__V1__ROLE__CHIEF;
        bool heard = t->incarnation > 0 && t->last_heartbeat_age_seconds >= 0;
        json_object_set_new(o, "lag", trains && heard
                                          ? json_integer((json_int_t)(c->global_step - t->step))
                                          : json_null());
    }
    return root;
}

/* The wire's Role values are ps_role + 1; 0 (unspecified) and any value
 * past EVALUATOR read "unknown", as ps_role_name says of a role it does not
 * know. */
const char *role_label(Ps__V1__Role r)
{
    return ps_role_name((enum ps_role)((int)r - 1));
}

const char *coordinator_target(const char *flag)
{
    const char *env = getenv("PSCOORD_ADDR");
    return flag != NULL ? flag
           : env != NULL && env[0] != '\0' ? env
                                           : DEFAULT_COORDINATOR;
}

/* One block: the job's lines, then one row per task. */
static void print_cluster(const Ps__V1__ClusterState *c, bool stamp)
{
#define ROW(label, ...)                                                     \
    do {                                                                    \
        printf("%-16s ", label);                                            \
        printf(__VA_ARGS__);                                                \
        printf("\n");                                                       \
    } while (0)
    if (stamp) {
        char when[32];
        time_t now = time(NULL);
        struct tm tm;
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S",
                 localtime_r(&now, &tm));
        ROW("time", "%s", when);
    }
    ROW("job", "%s", c->job_id);
    ROW("generation", "%" PRIu64, c->generation);
    ROW("global step", "%" PRIu64, c->global_step);
    ROW("workers", "%u/%u live", c->live_workers, c->num_workers);
    ROW("ps shards", "%u", c->num_ps);
    if (c->last_checkpoint_path != NULL && c->last_checkpoint_path[0] != '\0')
        ROW("last checkpoint", "step %" PRIu64 ": %s", c->last_checkpoint_step,
            c->last_checkpoint_path);
    else
        ROW("last checkpoint", "none");
    if (c->eval_step > 0 || c->eval_accuracy != 0 || c->eval_loss != 0)
        ROW("evaluation", "accuracy %.4f, loss %.4f at step %" PRIu64,
            c->eval_accuracy, c->eval_loss, c->eval_step);
    else
        ROW("evaluation", "none");
    size_t split = 0;
    for (size_t i = 0; i < c->n_placement; i++)
        split += c->placement[i]->n_parts > 1;
    if (c->n_placement > 0)
        ROW("placement", "%zu variable%s over %u ps shards, %zu split",
            c->n_placement, c->n_placement == 1 ? "" : "s", c->num_ps, split);
    else
        ROW("placement", "none yet");
    /* multi_worker_mirrored workers whose all-reduce crosses the network
     * in plaintext: Gloo and NCCL encrypt nothing. */
    char coll[512] = "";
    size_t clen = 0;
    for (size_t i = 0; i < c->n_tasks && clen < sizeof coll - 32; i++)
        if (c->tasks[i]->insecure_collective)
            clen += (size_t)snprintf(coll + clen, sizeof coll - clen, "%s%s[%u]",
                                     clen > 0 ? ", " : "", role_label(c->tasks[i]->role),
                                     c->tasks[i]->index);
    if (clen > 0)
        ROW("collective", "plaintext on the network (--insecure-collective): %s", coll);
#undef ROW
    int aw = (int)strlen("ADDRESS");
    for (size_t i = 0; i < c->n_tasks; i++) {
        int n = (int)strlen(c->tasks[i]->address);
        if (n > aw)
            aw = n;
    }
    printf("\n%-10s %5s  %-*s  %-10s  %10s  %11s  %s\n", "ROLE", "INDEX", aw,
           "ADDRESS", "STATE", "STEP", "EXAMPLES/S", "HEARTBEAT-AGE");
    for (size_t i = 0; i < c->n_tasks; i++) {
        const Ps__V1__TaskInfo *t = c->tasks[i];
        bool heard = t->incarnation > 0 && t->last_heartbeat_age_seconds >= 0;
        char step[32] = "-", rate[32] = "-", age[32] = "-";
        if (heard) {
            snprintf(step, sizeof step, "%" PRIu64, t->step);
            snprintf(rate, sizeof rate, "%.1f", t->examples_per_second);
            human_duration(t->last_heartbeat_age_seconds, age, sizeof age);
        }
        printf("%-10s %5u  %-*s  %-10s  %10s  %11s  %s\n",
               role_label(t->role), t->index, aw,
               t->address[0] != '\0' ? t->address : "-", task_state(t), step,
               rate, age);
    }
    fflush(stdout);
}

/* The closing "transport" line: each live shard's transport as its own
 * Stats says, so that a psd serving the network in plaintext (--insecure)
 * shows ("ps[0] mtls, ps[1] plaintext (--insecure)"). A shard that does
 * not answer within timeout_ms reads "no answer". */
static void print_transport(const Ps__V1__ClusterState *c, int timeout_ms)
{
    char line[1024] = "";
    size_t len = 0;
    for (size_t i = 0; i < c->n_tasks && len < sizeof line - 64; i++) {
        const Ps__V1__TaskInfo *t = c->tasks[i];
        if (t->role != PS__V1__ROLE__PS || !t->alive || t->address[0] == '\0')
            continue;
        char what[96] = "no answer";
        ps_rpc_client *cl;
        ps_rpc_client_opts o = {.deadline_ms = timeout_ms, .max_attempts = 1};
        if (ps_rpc_client_create(t->address, &o, &cl) == 0) {
            Ps__V1__StatsRequest req = PS__V1__STATS_REQUEST__INIT;
            void *resp;
            ps_rpc_status st;
            if (ps_rpc_invoke_pb(cl, "/ps.v1.ParameterServer/Stats", &req,
                                 &ps__v1__stats_response__descriptor, &resp,
                                 timeout_ms, &st) == 0) {
                const Ps__V1__StatsResponse *r = resp;
                snprintf(what, sizeof what, "%s%s",
                         r->transport_security[0] != '\0' ? r->transport_security
                                                          : "unknown",
                         r->insecure ? " (--insecure)" : "");
                protobuf_c_message_free_unpacked(resp, NULL);
            }
            ps_rpc_client_destroy(cl);
        }
        len += (size_t)snprintf(line + len, sizeof line - len, "%sps[%u] %s",
                                len > 0 ? ", " : "", t->index, what);
    }
    if (len > 0)
        printf("\n%-16s %s\n", "transport", line);
    fflush(stdout);
}

/* --watch: prints each ClusterState as it comes; a blank line between
 * blocks. */
static int on_cluster_msg(void *ctx, const uint8_t *msg, size_t len)
{
    int *blocks = ctx;
    Ps__V1__ClusterState *c = ps__v1__cluster_state__unpack(NULL, len, msg);
    if (c == NULL) {
        fprintf(stderr, "psctl: status: the coordinator sent %zu bytes that "
                "are not a ClusterState\n", len);
        return 1;
    }
    if ((*blocks)++ > 0)
        printf("\n");
    print_cluster(c, true);
    ps__v1__cluster_state__free_unpacked(c, NULL);
    return 0;
}

int cmd_status(const struct command *self, int argc, char **argv)
{
    struct status_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    int npos;
    struct session s;
    memset(&s, 0, sizeof s);
    int rc = parse_command(self, status_opts, &cfg, argc, argv, "", 0, 0,
                           NULL, &npos);
    if (rc >= 0)
        goto out;
    if (cfg.watch && cfg.output == OUTPUT_JSON) {
        fprintf(stderr, "psctl: status: --watch prints blocks for people; "
                "-o json is one answer (poll it)\n");
        rc = EXIT_USAGE;
        goto out;
    }
    rc = session_open_at(
        &s, self, "pscoord", "--coordinator",
        coordinator_target(cfg.coordinator),
        (int)(cfg.timeout_ms > 0 ? cfg.timeout_ms : psctl_global.timeout_ms));
    if (rc >= 0)
        goto out;
    if ((rc = session_probe(&s)) >= 0)
        goto close;
    Ps__V1__GetClusterRequest req = PS__V1__GET_CLUSTER_REQUEST__INIT;
    if (!cfg.watch) {
        void *resp;
        rc = session_call(&s, COORD_METHOD("GetCluster"), &req,
                          &ps__v1__cluster_state__descriptor, &resp);
        if (rc == 0 && cfg.output == OUTPUT_JSON) {
            rc = pbjson_print(self, cluster_json(resp));
            protobuf_c_message_free_unpacked(resp, NULL);
        } else if (rc == 0) {
            print_cluster(resp, false);
            print_transport(resp, s.timeout_ms < 2000 ? s.timeout_ms : 2000);
            protobuf_c_message_free_unpacked(resp, NULL);
        }
        goto close;
    }
    uint8_t buf[16];
    size_t len = ps__v1__get_cluster_request__pack(&req, buf);
    int blocks = 0;
    ps_rpc_status st;
    /* No deadline worth the name: a watch lasts until interrupted. */
    if (ps_rpc_invoke_stream(s.client, COORD_METHOD("WatchCluster"), buf, len,
                             INT32_MAX, on_cluster_msg, &blocks, &st) == 0) {
        fprintf(stderr, "psctl: status: the coordinator ended the watch\n");
    } else if (blocks == 0 && unreachable(&st)) {
        report_unreachable(&s, &st);
    } else if (st.code == PS_RPC_UNIMPLEMENTED &&
               report_mismatch(&s, COORD_METHOD("WatchCluster"))) {
        rc = EXIT_USAGE;
        goto close;
    } else if (strcmp(st.message, "stopped by the reader") != 0) {
        report_status(&s, &st);
    }
    rc = EXIT_FAIL;
close:
    session_close(&s);
out:
    ps_conf_free(status_opts, &cfg);
    return rc;
}
