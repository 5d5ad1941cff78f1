/*
 * cmd_server.c - the commands about a psd as a whole: checkpoint, restore,
 * stats, health. See psctl.h.
 */
#include "tools/psctl.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* ---- checkpoint, restore ---------------------------------------------- */

static const ps_opt checkpoint_opts[] = {
    {"step", PS_OPT_UINT64, offsetof(struct step_cfg, step), NULL,
     "global step the checkpoint is named by (default: the highest variable "
     "version on the server)", 0, 0, NULL},
    CONN_OPTS(struct step_cfg),
    {0},
};

static const char *const row_dtype_choices[] = {"keep", "f32", "bf16", "fp16", NULL};

static const ps_opt restore_opts[] = {
    {"step", PS_OPT_UINT64, offsetof(struct step_cfg, step), NULL,
     "checkpoint to load (default: the latest complete one)", 0, 0, NULL},
    {"sparse-row-dtype", PS_OPT_ENUM, offsetof(struct step_cfg, row_dtype), "keep",
     "the row dtype every sparse table comes back with, its rows converted where "
     "the checkpoint holds another; keep = as saved", 0, 0, row_dtype_choices},
    {"sparse-slot-dtype", PS_OPT_ENUM, offsetof(struct step_cfg, slot_dtype), "keep",
     "the same for the sparse tables' optimizer slots (fp16 is refused for a table "
     "with ADAM)", 0, 0, row_dtype_choices},
    CONN_OPTS(struct step_cfg),
    {0},
};

static int print_checkpoint(const void *resp)
{
    const Ps__V1__CheckpointResponse *r = resp;
    char human[32];
    printf("checkpoint step %" PRIu64 ": %s (%s, %" PRIu64 " bytes)\n",
           r->step, r->path, human_bytes(r->bytes, human, sizeof human),
           r->bytes);
    return EXIT_OK;
}

const struct one_call checkpoint_call = {
    checkpoint_opts, PS_METHOD("Checkpoint"),
    &ps__v1__checkpoint_request__descriptor,
    offsetof(Ps__V1__CheckpointRequest, step),
    &ps__v1__checkpoint_response__descriptor, print_checkpoint};

static int print_restore(const void *resp)
{
    const Ps__V1__RestoreResponse *r = resp;
    printf("restored step %" PRIu64 ": %" PRIu64 " variable%s", r->step,
           r->variables, r->variables == 1 ? "" : "s");
    if (r->sparse_tables_converted > 0)
        printf(" (%" PRIu64 " sparse table(s), %" PRIu64 " rows converted to another row "
               "or slot dtype)", r->sparse_tables_converted, r->sparse_rows_converted);
    printf("\n");
    return EXIT_OK;
}

const struct one_call restore_call = {
    restore_opts, PS_METHOD("Restore"), &ps__v1__restore_request__descriptor,
    offsetof(Ps__V1__RestoreRequest, step),
    &ps__v1__restore_response__descriptor, print_restore,
    offsetof(Ps__V1__RestoreRequest, sparse_row_dtype),
    offsetof(Ps__V1__RestoreRequest, sparse_slot_dtype)};

/* ---- stats, health ---------------------------------------------------- */

static void print_stats(const Ps__V1__StatsResponse *r)
{
    char a[32];
#define ROW(label, fmt, ...) printf("%-22s " fmt "\n", label, __VA_ARGS__)
    ROW("variables", "%" PRIu64, r->variables);
    ROW("value bytes", "%s", human_bytes(r->value_bytes, a, sizeof a));
    ROW("slot bytes", "%s", human_bytes(r->slot_bytes, a, sizeof a));
    ROW("pushes", "%" PRIu64, r->pushes);
    ROW("pulls", "%" PRIu64, r->pulls);
    ROW("bytes received", "%s", human_bytes(r->bytes_received, a, sizeof a));
    ROW("bytes sent", "%s", human_bytes(r->bytes_sent, a, sizeof a));
    ROW("stale pushes refused", "%" PRIu64, r->stale_pushes_refused);
    ROW("nonfinite refused", "%" PRIu64, r->nonfinite_refused);
    ROW("via shared memory", "%s", human_bytes(r->shm_bytes, a, sizeof a));
    ROW("shared-memory maps", "%" PRIu64, r->shm_regions);
    ROW("open files", "%" PRIu64 " of %" PRIu64, r->open_files, r->max_open_files);
    ROW("unix connections", "%" PRIu64 " open, %" PRIu64 " refused",
        r->local_connections, r->connections_refused);
    ROW("bad requests", "%" PRIu64, r->bad_requests);
    ROW("commits", "%" PRIu64, r->commits);
    ROW("write-behind lag", "%" PRIu64 " ms (oldest update not yet durable)",
        r->write_behind_lag_ms);
    ROW("resident", "%s", human_bytes(r->resident_bytes, a, sizeof a));
    ROW("fixed overhead", "%s",
        human_bytes(r->fixed_overhead_bytes, a, sizeof a));
    uint64_t held = r->value_bytes + r->slot_bytes;
    if (r->variables > 0 && held > 0)
        ROW("memory ratio", "%.2f (resident - fixed overhead) / (value + "
            "slot bytes)",
            ((double)r->resident_bytes - (double)r->fixed_overhead_bytes) /
                (double)held);
    ROW("uptime", "%s", human_duration(r->uptime_seconds, a, sizeof a));
    ROW("tokens required", "%s", r->tokens_required ? "yes (--tokens)" : "no");
    /* The proto's 0 means "none", but a checkpoint may be at step 0. */
    if (r->last_checkpoint_step > 0)
        ROW("last checkpoint step", "%" PRIu64, r->last_checkpoint_step);
    else
        ROW("last checkpoint step", "%s", "0 (none, or at step 0)");
    if (r->sparse_tables > 0) {
        ROW("sparse tables", "%" PRIu64, r->sparse_tables);
        ROW("sparse rows", "%" PRIu64 " (%" PRIu64 " not yet committed)", r->sparse_rows,
            r->sparse_rows_unsaved);
        ROW("sparse RAM tier", "%s", human_bytes(r->sparse_ram_bytes, a, sizeof a));
        ROW("sparse index of rows", "%s", human_bytes(r->sparse_index_bytes, a, sizeof a));
        ROW("LMDB file in use", "%s", human_bytes(r->sparse_disk_bytes, a, sizeof a));
        ROW("row log to apply", "%s", human_bytes(r->sparse_log_bytes, a, sizeof a));
        ROW("rows read from LMDB", "%" PRIu64 " (the others from the RAM tier)",
            r->sparse_rows_read_lmdb);
        ROW("rows admitted", "%" PRIu64 " (evicted %" PRIu64 ", pushes not admitted %"
            PRIu64 ")", r->sparse_admitted, r->sparse_evicted, r->sparse_not_admitted);
        ROW("rows pulled, pushed", "%" PRIu64 ", %" PRIu64, r->sparse_rows_pulled,
            r->sparse_rows_pushed);
    }
    /* An older psd sends neither field. */
    if (r->transport_security != NULL && r->transport_security[0] != '\0')
        ROW("transport", "%s%s", r->transport_security,
            r->insecure ? " (--insecure: not loopback, no TLS)" : "");
#undef ROW
}

/* A job's stats as a table: one row per shard, then the totals. */
static void print_stats_table(Ps__V1__StatsResponse **r, const struct shard *sh,
                              size_t n, const char *job_id)
{
    printf("job %s: %zu shard%s\n", job_id, n, n == 1 ? "" : "s");
    bool sparse = false;
    int aw = (int)strlen("ADDRESS");
    for (size_t i = 0; i < n; i++) {
        sparse |= r[i]->sparse_tables > 0;
        if ((int)strlen(sh[i].address) > aw)
            aw = (int)strlen(sh[i].address);
    }
    printf("%-5s  %-*s  %9s  %10s  %10s  %10s  %10s  %10s  %10s  %10s%s\n", "SHARD",
           aw, "ADDRESS", "VARIABLES", "BYTES", "PUSHES", "PULLS", "RECEIVED", "SENT",
           "RESIDENT", "UPTIME", sparse ? "  SPARSE-ROWS" : "");
    Ps__V1__StatsResponse tot = PS__V1__STATS_RESPONSE__INIT;
    for (size_t i = 0; i <= n; i++) {
        const Ps__V1__StatsResponse *x = i < n ? r[i] : &tot;
        char idx[16], b[5][32];
        if (i < n) {
            snprintf(idx, sizeof idx, "%u", sh[i].index);
            tot.variables += x->variables;
            tot.value_bytes += x->value_bytes;
            tot.slot_bytes += x->slot_bytes;
            tot.pushes += x->pushes;
            tot.pulls += x->pulls;
            tot.bytes_received += x->bytes_received;
            tot.bytes_sent += x->bytes_sent;
            tot.resident_bytes += x->resident_bytes;
            tot.sparse_rows += x->sparse_rows;
            if (i == 0 || x->uptime_seconds < tot.uptime_seconds)
                tot.uptime_seconds = x->uptime_seconds;
        } else {
            snprintf(idx, sizeof idx, "TOTAL");
        }
        char rows[32] = "";
        if (sparse)
            snprintf(rows, sizeof rows, "  %11" PRIu64, x->sparse_rows);
        printf("%-5s  %-*s  %9" PRIu64 "  %10s  %10" PRIu64 "  %10" PRIu64
               "  %10s  %10s  %10s  %10s%s\n", idx, aw, i < n ? sh[i].address : "",
               x->variables, human_bytes(x->value_bytes + x->slot_bytes, b[0], 32),
               x->pushes, x->pulls, human_bytes(x->bytes_received, b[1], 32),
               human_bytes(x->bytes_sent, b[2], 32),
               human_bytes(x->resident_bytes, b[3], 32),
               human_duration(x->uptime_seconds, b[4], 32), rows);
    }
}

/* {"job_id", "shards": [{"shard", "server", StatsResponse's fields}],
 * "total": {...}}; job_id null for --server. */
static json_t *stats_json(void **resps, const struct shard *sh, size_t n, const char *job_id)
{
    Ps__V1__StatsResponse **r = (Ps__V1__StatsResponse **)resps;
    /* A job has a checkpoint at a step when every shard has it; it has been
     * up as long as its youngest shard. */
    static const char *const lowest[] = {"uptime_seconds", "last_checkpoint_step",
                                         NULL};
    json_t *root = json_object(), *shards = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *o = pbjson_message(&r[i]->base);
        if (o == NULL)
            continue;
        shard_json(o, &sh[i]);
        json_array_append_new(shards, o);
    }
    json_object_set_new(root, "job_id", job_id[0] ? json_string(job_id) : json_null());
    json_t *tot = pbjson_total(shards, lowest);
    /* The job's lag is its most lagging shard's. */
    uint64_t lag = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i]->write_behind_lag_ms > lag)
            lag = r[i]->write_behind_lag_ms;
    json_object_set_new(tot, "write_behind_lag_ms", json_integer((json_int_t)lag));
    json_object_del(tot, "shard");
    json_object_del(tot, "server");
    json_object_set_new(root, "shards", shards);
    json_object_set_new(root, "total", tot);
    return root;
}

/* One server's Stats in full; a job's as a table. */
static int print_stats_fan(void **resps, const struct shard *sh, size_t n, const char *job,
                           bool job_wide)
{
    Ps__V1__StatsResponse **r = (Ps__V1__StatsResponse **)resps;
    if (job_wide)
        print_stats_table(r, sh, n, job);
    else
        print_stats(r[0]);
    return EXIT_OK;
}

const struct fan_cmd stats_fan = {PS_METHOD("Stats"), &ps__v1__stats_request__descriptor,
                                  &ps__v1__stats_response__descriptor, stats_json,
                                  print_stats_fan};

struct health_cfg {
    struct conn_cfg conn;
    char *service;
};

static const ps_opt health_opts[] = {
    {"service", PS_OPT_STRING, offsetof(struct health_cfg, service), NULL,
     "service to ask about, e.g. ps.v1.ParameterServer (default: the whole "
     "server)", 0, 0, NULL},
    CONN_OPTS(struct health_cfg),
    {0},
};

int cmd_health(const struct command *self, int argc, char **argv)
{
    struct health_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    struct session s;
    int npos;
    int rc = parse_command(self, health_opts, &cfg, argc, argv, "", 0, 0,
                           NULL, &npos);
    if (rc >= 0)
        goto out;
    if ((rc = session_open(&s, self, &cfg.conn)) >= 0)
        goto out;
    ps_rpc_status st;
    bool serving = false;
    if (ps_rpc_health_check(s.client, cfg.service, probe_ms(&s), &serving,
                            &st) == 0) {
        printf("%s\n", serving ? "SERVING" : "NOT_SERVING");
        rc = serving ? EXIT_OK : EXIT_FAIL;
    } else {
        if (unreachable(&st))
            report_unreachable(&s, &st);
        else
            report_status(&s, &st);
        rc = EXIT_FAIL;
    }
    session_close(&s);
out:
    ps_conf_free(health_opts, &cfg);
    return rc;
}
