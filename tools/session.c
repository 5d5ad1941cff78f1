/*
 * session.c - psctl's connection to the server a command talks to (psd, or
 * pscoord for status): the address check, the first probe, the calls, and
 * one line on stderr for each way they fail. See psctl.h.
 */
#include "tools/psctl.h"

#include "common/cluster.h"
#include "common/errors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Status messages from gRPC itself may span lines; psctl's errors are one. */
static void one_line(char *s)
{
    for (; *s != '\0'; s++)
        if (*s == '\n' || *s == '\r')
            *s = ' ';
}

static bool target_ok(const char *t)
{
    /* gRPC's own schemes ("unix:/run/psd.sock", "dns:///h:7070") pass. */
    static const char *const schemes[] = {"unix:", "unix-abstract:", "dns:",
                                          "ipv4:", "ipv6:", NULL};
    for (int i = 0; schemes[i] != NULL; i++)
        if (strncmp(t, schemes[i], strlen(schemes[i])) == 0)
            return t[strlen(schemes[i])] != '\0';
    char host[256];
    int port;
    return ps_addr_split(t, host, sizeof host, &port) == 0;
}

int session_open_at(struct session *s, const struct command *cmd,
                    const char *peer, const char *flag, const char *target,
                    int timeout_ms)
{
    memset(s, 0, sizeof *s);
    s->cmd = cmd;
    s->peer = peer;
    s->target = target;
    s->timeout_ms = timeout_ms;
    if (!target_ok(s->target)) {
        fprintf(stderr, "psctl: %s: %s: '%s' is not HOST:PORT (or "
                "[v6addr]:PORT) with a port in 1..65535\n", cmd->words, flag,
                s->target);
        return EXIT_USAGE;
    }
    ps_rpc_client_opts o = {.deadline_ms = s->timeout_ms, .max_attempts = 1,
                            .token = psctl_global.token};
    int rc = ps_rpc_client_create(s->target, &o, &s->client);
    if (rc != 0) {
        fprintf(stderr, "psctl: cannot reach %s at %s: %s\n", s->peer,
                s->target, ps_strerror(rc));
        return EXIT_FAIL;
    }
    return -1;
}

/* Picks the address and deadline (the command's options, else psctl's). */
int session_open(struct session *s, const struct command *cmd,
                 const struct conn_cfg *cc)
{
    return session_open_at(
        s, cmd, "psd", "--server",
        cc->server != NULL ? cc->server : psctl_global.server,
        (int)(cc->timeout_ms > 0 ? cc->timeout_ms : psctl_global.timeout_ms));
}

void session_close(struct session *s)
{
    ps_rpc_client_destroy(s->client);
    s->client = NULL;
}

int probe_ms(const struct session *s)
{
    return s->timeout_ms < PROBE_MS ? s->timeout_ms : PROBE_MS;
}

/* True when a failed first contact means nothing answered at the address. */
bool unreachable(const ps_rpc_status *st)
{
    return st->code == PS_RPC_UNAVAILABLE ||
           st->code == PS_RPC_DEADLINE_EXCEEDED;
}

void report_unreachable(const struct session *s, ps_rpc_status *st)
{
    if (st->code == PS_RPC_DEADLINE_EXCEEDED)
        snprintf(st->message, sizeof st->message, "no answer within %d ms",
                 probe_ms(s));
    one_line(st->message);
    fprintf(stderr, "psctl: cannot reach %s at %s: %s: %s\n", s->peer,
            s->target, ps_rpc_code_name(st->code),
            st->message[0] != '\0' ? st->message : "(no message)");
}

void report_status(const struct session *s, ps_rpc_status *st)
{
    one_line(st->message);
    fprintf(stderr, "psctl: %s: %s: %s\n", s->cmd->words,
            ps_rpc_code_name(st->code),
            st->message[0] != '\0' ? st->message : "(no message)");
}

/* A call that the server does not implement: when the other daemon's
 * service answers there, the command was sent to the wrong daemon (psd's
 * to pscoord, or pscoord's to psd); says so in one line and returns true.
 * False when the server is neither (the caller reports the status). */
bool report_mismatch(const struct session *s, const char *method)
{
    bool to_psd = strncmp(method, PS_METHOD(""), strlen(PS_METHOD(""))) == 0;
    void *resp = NULL;
    ps_rpc_status st;
    int rc;
    if (to_psd) {
        Ps__V1__GetClusterRequest req = PS__V1__GET_CLUSTER_REQUEST__INIT;
        rc = ps_rpc_invoke_pb(s->client, COORD_METHOD("GetCluster"), &req,
                              &ps__v1__cluster_state__descriptor, &resp,
                              probe_ms(s), &st);
    } else {
        Ps__V1__StatsRequest req = PS__V1__STATS_REQUEST__INIT;
        rc = ps_rpc_invoke_pb(s->client, PS_METHOD("Stats"), &req,
                              &ps__v1__stats_response__descriptor, &resp,
                              probe_ms(s), &st);
    }
    if (resp != NULL)
        protobuf_c_message_free_unpacked(resp, NULL);
    /* Answered, or refused for a reason other than not knowing the call
     * (a token): the other service is there. */
    if (rc != 0 && (st.code == PS_RPC_UNIMPLEMENTED || unreachable(&st)))
        return false;
    if (to_psd)
        fprintf(stderr, "psctl: %s: %s is pscoord, not psd: give a psd's address "
                "with --server%s\n", s->cmd->words, s->target,
                strcmp(s->cmd->words, "stats") == 0 || strcmp(s->cmd->words, "list") == 0
                    ? ", or this one with --coordinator to ask every shard" : "");
    else
        fprintf(stderr, "psctl: %s: %s is psd, not pscoord: give the job's "
                "coordinator with --coordinator\n", s->cmd->words, s->target);
    return true;
}

/* The first contact: a health check with a short deadline. Returns -1 when
 * something answered (even a server without the health service, or one
 * that is NOT_SERVING: its real answer will say why), else EXIT_FAIL after
 * "cannot reach". */
int session_probe(struct session *s)
{
    ps_rpc_status st;
    bool serving;
    if (ps_rpc_health_check(s->client, "", probe_ms(s), &serving, &st) == 0 ||
        !unreachable(&st))
        return -1;
    report_unreachable(s, &st);
    return EXIT_FAIL;
}

/* One unary call with the session's deadline. Returns 0 with *resp set
 * (free it with protobuf_c_message_free_unpacked), or EXIT_FAIL after the
 * one-line report of the status. */
int session_call(struct session *s, const char *method,
                        const void *req, const ProtobufCMessageDescriptor *desc,
                        void **resp)
{
    ps_rpc_status st;
    if (ps_rpc_invoke_pb(s->client, method, req, desc, resp, s->timeout_ms,
                         &st) == 0)
        return 0;
    if (st.code == PS_RPC_UNIMPLEMENTED && report_mismatch(s, method))
        return EXIT_USAGE;
    report_status(s, &st);
    return EXIT_FAIL;
}

int session_start(struct session *s, const struct command *cmd,
                  const struct conn_cfg *cc)
{
    int rc = session_open(s, cmd, cc);
    if (rc < 0)
        rc = session_probe(s);
    if (rc >= 0)
        session_close(s);
    return rc;
}

/* session_call, then print(resp) (whose return is returned) and free. */
static int session_call_print(struct session *s, const char *method,
                              const void *req,
                              const ProtobufCMessageDescriptor *resp_desc,
                              int (*print)(const void *resp))
{
    void *resp;
    int rc = session_call(s, method, req, resp_desc, &resp);
    if (rc != 0)
        return rc;
    rc = print(resp);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

int server_command(const struct command *cmd, const ps_opt *opts, void *cfg,
                   const struct conn_cfg *conn, int argc, char **argv,
                   const char *what, int min_pos, int max_pos, char **pos,
                   struct session *s)
{
    int npos = 0;
    int rc = parse_command(cmd, opts, cfg, argc, argv, what, min_pos, max_pos,
                           pos, &npos);
    if (rc >= 0)
        return rc;
    return session_start(s, cmd, conn);
}

int run_one_call(const struct command *self, int argc, char **argv,
                 const struct one_call *call)
{
    void *cfg = calloc(1, call->step_at != 0 ? sizeof(struct step_cfg)
                                             : sizeof(struct conn_only_cfg));
    void *req = calloc(1, call->req_desc->sizeof_message);
    if (cfg == NULL || req == NULL) {
        free(cfg);
        free(req);
        fprintf(stderr, "psctl: %s: out of memory\n", self->words);
        return EXIT_FAIL;
    }
    struct session s;
    int rc = server_command(self, call->opts, cfg, cfg, argc, argv, "", 0, 0,
                            NULL, &s);
    if (rc < 0) {
        protobuf_c_message_init(call->req_desc, req);
        if (call->step_at != 0)
            memcpy((char *)req + call->step_at,
                   &((const struct step_cfg *)cfg)->step, sizeof(uint64_t));
        /* keep, f32, bf16, fp16 -> ps.v1.DType */
        static const Ps__V1__DType dt[] = {0, PS__V1__DTYPE__DTYPE_FLOAT32,
                                           PS__V1__DTYPE__DTYPE_BFLOAT16,
                                           PS__V1__DTYPE__DTYPE_FLOAT16};
        const struct step_cfg *sc = cfg;
        if (call->row_dtype_at != 0)
            memcpy((char *)req + call->row_dtype_at, &dt[sc->row_dtype], sizeof(Ps__V1__DType));
        if (call->slot_dtype_at != 0)
            memcpy((char *)req + call->slot_dtype_at, &dt[sc->slot_dtype],
                   sizeof(Ps__V1__DType));
        rc = session_call_print(&s, call->method, req, call->resp_desc,
                                call->print);
        session_close(&s);
    }
    ps_conf_free(call->opts, cfg);
    free(req);
    free(cfg);
    return rc;
}

/* The job's psd shards as pscoord lists them: its ps tasks that serve an
 * address, by index. Returns -1 with *out (free it) and *n, else the exit
 * status after one line. */
static int job_shards(const struct command *cmd, const struct fan_cfg *cfg,
                      int timeout_ms, struct shard **out, size_t *n,
                      char *job_id, size_t joblen)
{
    struct session s;
    int rc = session_open_at(&s, cmd, "pscoord", "--coordinator", cfg->coordinator,
                             timeout_ms);
    if (rc >= 0)
        return rc;
    void *resp = NULL;
    Ps__V1__GetClusterRequest req = PS__V1__GET_CLUSTER_REQUEST__INIT;
    if ((rc = session_probe(&s)) < 0)
        rc = session_call(&s, COORD_METHOD("GetCluster"), &req,
                          &ps__v1__cluster_state__descriptor, &resp);
    if (rc != 0) {
        session_close(&s);
        return rc;
    }
    const Ps__V1__ClusterState *c = resp;
    snprintf(job_id, joblen, "%s", c->job_id);
    struct shard *sh = calloc(c->n_tasks > 0 ? c->n_tasks : 1, sizeof *sh);
    size_t k = 0;
    for (size_t i = 0; sh != NULL && i < c->n_tasks; i++) {
        const Ps__V1__TaskInfo *t = c->tasks[i];
        if (t->role != PS__V1__ROLE__PS || t->address[0] == '\0')
            continue;
        size_t at = k++;
        while (at > 0 && sh[at - 1].index > t->index) {
            sh[at] = sh[at - 1];
            at--;
        }
        sh[at].index = t->index;
        snprintf(sh[at].address, sizeof sh[at].address, "%s", t->address);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    session_close(&s);
    if (sh == NULL) {
        fprintf(stderr, "psctl: %s: out of memory\n", cmd->words);
        return EXIT_FAIL;
    }
    if (k == 0) {
        fprintf(stderr, "psctl: %s: the job '%s' at %s has no ps task with an "
                "address yet\n", cmd->words, job_id, cfg->coordinator);
        free(sh);
        return EXIT_FAIL;
    }
    *out = sh;
    *n = k;
    return -1;
}

int fan_call(const struct command *cmd, const struct fan_cfg *cfg,
             const char *method, const void *req,
             const ProtobufCMessageDescriptor *resp_desc, void ***resps,
             struct shard **shards, size_t *n, char *job_id, size_t joblen)
{
    int timeout_ms = (int)(cfg->conn.timeout_ms > 0 ? cfg->conn.timeout_ms
                                                    : psctl_global.timeout_ms);
    struct shard *sh = NULL;
    size_t ns = 1;
    int rc;
    job_id[0] = '\0';
    if (cfg->coordinator != NULL) {
        if (cfg->conn.server != NULL) {
            fprintf(stderr, "psctl: %s: give --server (one psd) or --coordinator "
                    "(every shard of the job), not both\n", cmd->words);
            return EXIT_USAGE;
        }
        if ((rc = job_shards(cmd, cfg, timeout_ms, &sh, &ns, job_id, joblen)) >= 0)
            return rc;
    } else {
        sh = calloc(1, sizeof *sh);
        if (sh == NULL) {
            fprintf(stderr, "psctl: %s: out of memory\n", cmd->words);
            return EXIT_FAIL;
        }
        sh->index = UINT32_MAX;
        snprintf(sh->address, sizeof sh->address, "%s",
                 cfg->conn.server != NULL ? cfg->conn.server : psctl_global.server);
    }
    void **out = calloc(ns, sizeof *out);
    rc = out != NULL ? -1 : EXIT_FAIL;
    if (out == NULL)
        fprintf(stderr, "psctl: %s: out of memory\n", cmd->words);
    for (size_t i = 0; rc < 0 && i < ns; i++) {
        struct session s;
        char flag[32];
        if (sh[i].index == UINT32_MAX)
            snprintf(flag, sizeof flag, "--server");
        else
            snprintf(flag, sizeof flag, "ps[%u]", sh[i].index);
        rc = session_open_at(&s, cmd, "psd", flag, sh[i].address, timeout_ms);
        if (rc >= 0)
            break;
        if ((rc = session_probe(&s)) < 0 &&
            (rc = session_call(&s, method, req, resp_desc, &out[i])) == 0)
            rc = -1;
        session_close(&s);
    }
    if (rc >= 0) {
        fan_free(out, sh, ns);
        return rc;
    }
    *resps = out;
    *shards = sh;
    *n = ns;
    return -1;
}

void fan_free(void **resps, struct shard *shards, size_t n)
{
    for (size_t i = 0; resps != NULL && i < n; i++)
        if (resps[i] != NULL)
            protobuf_c_message_free_unpacked(resps[i], NULL);
    free(resps);
    free(shards);
}

int run_fan(const struct command *self, int argc, char **argv, const struct fan_cmd *f)
{
    struct fan_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    void *req = NULL;
    int npos;
    int rc = parse_command(self, fan_opts, &cfg, argc, argv, "", 0, 0, NULL, &npos);
    if (rc >= 0)
        goto out;
    if ((req = malloc(f->req_desc->sizeof_message)) == NULL) {
        fprintf(stderr, "psctl: %s: out of memory\n", self->words);
        rc = EXIT_FAIL;
        goto out;
    }
    protobuf_c_message_init(f->req_desc, req);
    void **resps;
    struct shard *sh;
    size_t n;
    char job[256];
    rc = fan_call(self, &cfg, f->method, req, f->resp_desc, &resps, &sh, &n, job, sizeof job);
    if (rc >= 0)
        goto out;
    if (cfg.output == OUTPUT_JSON)
        rc = pbjson_print(self, f->json(resps, sh, n, job));
    else
        rc = f->print(resps, sh, n, job, cfg.coordinator != NULL);
    fan_free(resps, sh, n);
out:
    free(req);
    ps_conf_free(fan_opts, &cfg);
    return rc;
}

void shard_json(json_t *obj, const struct shard *sh)
{
    json_object_set_new(obj, "shard", sh->index == UINT32_MAX ? json_null()
                                                              : json_integer(sh->index));
    json_object_set_new(obj, "server", json_string(sh->address));
}
