/*
 * state.c - <state-dir>/state.json and summary.json.
 *
 * state.json holds what a restarted coordinator needs to carry the job on:
 *
 *   {"format": 1, "job_id": "mnist-42", "membership": "static",
 *    "saved_unix": 1767225600, "generation": 12, "global_step": 1200,
 *    "tasks": [{"role": "ps", "index": 0, "address": "h3:2222",
 *               "incarnation": 2, "step": 0, "secret": "9f...",
 *               "local_address": "unix:/run/psd/0.sock",
 *               "host_id": "...", "insecure_collective": false}, ...],
 *    "placement": {"num_ps": 2, "variables": [{"name": "w1",
 *                  "shape": [784, 128], "parts": [{"name": "w1/part0",
 *                  "shard": 0, "row_begin": 0, "row_end": 392}, ...]}]},
 *    "checkpoints": [{"step": 1000, "manifest": "...", "created_unix": ...,
 *                     "shards": 2}],
 *    "last_eval": {"step": 1000, "accuracy": 0.91, "loss": 0.27,
 *                  "unix": ...},
 *    "restores": [{"index": 1, "incarnation": 3, "step": 1000, "ok": true,
 *                  "detail": "...", "unix": ...}]}
 *
 * "secret" is the task's secret (coord.h): the file is written with mode
 * 0600 so that only pscoord's user reads it. A task without one (a state
 * file from before secrets) is refused until it has missed heartbeats and
 * registers afresh. "placement" and "last_eval" are null until set. The checkpoint list is
 * written for people and tools; at start the manifests themselves are the
 * truth (jobckpt.c scans them).
 */
#include "common/clock.h"
#include "coordinator/coord_internal.h"

#include "common/errors.h"
#include "coordinator/jsonfile.h"
#include "common/log.h"
#include "common/rpc.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_FORMAT 1

static json_t *placement_json(const struct ps_placement *p)
{
    json_t *vars = json_array();
    for (int i = 0; i < p->nvars; i++) {
        const struct ps_place_var *v = &p->vars[i];
        json_t *shape = json_array(), *parts = json_array();
        for (int d = 0; d < v->ndims; d++)
            json_array_append_new(shape, json_integer(v->shape[d]));
        for (int k = 0; k < v->nparts; k++)
            json_array_append_new(parts, json_pack(
                "{s:s, s:I, s:I, s:I}", "name", v->parts[k].name,
                "shard", (json_int_t)v->parts[k].shard,
                "row_begin", (json_int_t)v->parts[k].row_begin,
                "row_end", (json_int_t)v->parts[k].row_end));
        json_t *vj = json_pack("{s:s, s:o, s:o}", "name", v->name, "shape", shape,
                               "parts", parts);
        if (v->hash_partitioned)
            json_object_set_new(vj, "hash_partitioned", json_true());
        json_array_append_new(vars, vj);
    }
    return json_pack("{s:I, s:o}", "num_ps", (json_int_t)p->num_ps,
                     "variables", vars);
}

static json_t *eval_json(const coord *c)
{
    if (!c->has_eval)
        return json_null();
    return json_pack("{s:I, s:f, s:f, s:I}", "step", (json_int_t)c->eval_step,
                     "accuracy", c->eval_accuracy, "loss", c->eval_loss,
                     "unix", (json_int_t)c->eval_unix);
}

static json_t *last_ckpt_json(const coord *c)
{
    if (c->nckpts == 0)
        return json_null();
    const struct ckpt_rec *k = &c->ckpts[c->nckpts - 1];
    return json_pack("{s:I, s:s, s:I, s:i}", "step", (json_int_t)k->step,
                     "manifest", k->path, "created_unix",
                     (json_int_t)k->created_unix, "shards", k->nshards);
}

int coord_state_save_locked(coord *c)
{
    json_t *tasks = json_array(), *ckpts = json_array(),
           *restores = json_array();
    for (int i = 0; i < c->ntasks; i++) {
        const struct ctask *t = &c->tasks[i];
        json_array_append_new(tasks, json_pack(
            "{s:s, s:i, s:s, s:I, s:I, s:s, s:s, s:s, s:b}", "role",
            ps_role_name(t->role), "index", t->index, "address", t->address,
            "incarnation", (json_int_t)t->incarnation, "step",
            (json_int_t)t->step, "secret", t->secret, "local_address",
            t->local_address, "host_id", t->host_id, "insecure_collective",
            t->insecure_collective));
    }
    for (int i = 0; i < c->nckpts; i++)
        json_array_append_new(ckpts, json_pack(
            "{s:I, s:s, s:I, s:i}", "step", (json_int_t)c->ckpts[i].step,
            "manifest", c->ckpts[i].path, "created_unix",
            (json_int_t)c->ckpts[i].created_unix, "shards",
            c->ckpts[i].nshards));
    for (int i = 0; i < c->nrestores; i++) {
        const struct restore_rec *r = &c->restores[i];
        json_array_append_new(restores, json_pack(
            "{s:i, s:I, s:I, s:b, s:s, s:I}", "index", (int)r->index,
            "incarnation", (json_int_t)r->incarnation, "step",
            (json_int_t)r->step, "ok", r->ok, "detail",
            r->detail != NULL ? r->detail : "", "unix",
            (json_int_t)r->unix_time));
    }
    json_t *root = json_pack(
        "{s:i, s:s, s:s, s:I, s:I, s:I, s:o, s:o, s:o, s:o, s:o}",
        "format", STATE_FORMAT, "job_id", c->job_id, "membership",
        c->spec != NULL ? "static" : "dynamic", "saved_unix",
        (json_int_t)coord_unix_now(), "generation", (json_int_t)c->generation,
        "global_step", (json_int_t)c->global_step, "tasks", tasks,
        "placement", c->placed ? placement_json(&c->placement) : json_null(),
        "checkpoints", ckpts, "last_eval", eval_json(c), "restores",
        restores);
    if (root == NULL) {
        ps_log_error("cannot build %s: out of memory", c->state_path);
        return -ENOMEM;
    }
    char err[600];
    int rc = coord_json_write(c->state_path, root, 0600, err, sizeof err);
    json_decref(root);
    if (rc != 0)
        ps_log_error("cannot save the coordinator's state: %s", err);
    return rc;
}

int coord_summary_write_locked(coord *c)
{
    int64_t now = ps_now_ms();
    json_t *tasks = json_array();
    uint32_t live = 0, workers = 0;
    for (int i = 0; i < c->ntasks; i++) {
        const struct ctask *t = &c->tasks[i];
        if (t->role == PS_ROLE_WORKER) {
            workers++;
            live += t->state == CT_ALIVE;
        }
        json_array_append_new(tasks, json_pack(
            "{s:s, s:i, s:s, s:s, s:I, s:I, s:f, s:f, s:f}",
            "role", ps_role_name(t->role), "index", t->index, "address",
            t->address, "state", coord_state_name(t->state), "incarnation",
            (json_int_t)t->incarnation, "step", (json_int_t)t->step,
            "examples_per_second", t->examples_per_second, "loss", t->loss,
            "heartbeat_age_seconds",
            t->heard_ms < 0 ? -1.0 : (double)(now - t->heard_ms) / 1000.0));
    }
    json_t *root = json_pack(
        "{s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:o, s:o, s:o}",
        "format", STATE_FORMAT, "job_id", c->job_id, "written_unix",
        (json_int_t)coord_unix_now(), "uptime_seconds",
        (json_int_t)((now - c->start_ms) / 1000), "global_step",
        (json_int_t)c->global_step, "generation", (json_int_t)c->generation,
        "num_ps", (json_int_t)coord_num_ps_locked(c), "live_workers",
        (json_int_t)live, "num_workers", (int)workers, "tasks", tasks,
        "last_checkpoint", last_ckpt_json(c), "last_eval", eval_json(c));
    if (root == NULL)
        return -ENOMEM;
    json_object_set_new(root, "placed_variables",
                        json_integer(c->placed ? c->placement.nvars : 0));
    char err[600];
    int rc = coord_json_write(c->summary_path, root, 0644, err, sizeof err);
    json_decref(root);
    if (rc != 0)
        ps_log_error("cannot write the training summary: %s", err);
    else
        ps_log_info("wrote the training summary to %s", c->summary_path);
    return rc;
}

/* ---- loading ----------------------------------------------------------- */

static int bad(char *err, size_t errlen, const char *path, const char *what)
{
    snprintf(err, errlen, "%s: %s", path, what);
    return PS_ECORRUPT;
}

static bool get_u64(json_t *o, const char *key, uint64_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static int load_placement(coord *c, json_t *pj, char *err, size_t errlen)
{
    json_t *vars = json_object_get(pj, "variables");
    uint64_t num_ps;
    if (!get_u64(pj, "num_ps", &num_ps) || num_ps == 0 || num_ps > 65536 ||
        !json_is_array(vars) || json_array_size(vars) == 0)
        return bad(err, errlen, c->state_path,
                   "\"placement\" needs num_ps >= 1 and variables");
    struct ps_placement *p = &c->placement;
    size_t n = json_array_size(vars);
    p->vars = calloc(n, sizeof *p->vars);
    if (p->vars == NULL)
        return -ENOMEM;
    p->nvars = (int)n;
    p->num_ps = (uint32_t)num_ps;
    for (size_t i = 0; i < n; i++) {
        json_t *vj = json_array_get(vars, i);
        json_t *name = json_object_get(vj, "name");
        json_t *shape = json_object_get(vj, "shape");
        json_t *parts = json_object_get(vj, "parts");
        struct ps_place_var *v = &p->vars[i];
        if (!json_is_string(name) || !json_is_array(shape) ||
            json_array_size(shape) > PS_PLACE_MAX_DIMS || !json_is_array(parts)
            || json_array_size(parts) == 0)
            return bad(err, errlen, c->state_path,
                       "a placed variable needs name, shape and parts");
        if ((v->name = strdup(json_string_value(name))) == NULL)
            return -ENOMEM;
        v->ndims = (int)json_array_size(shape);
        v->hash_partitioned = json_is_true(json_object_get(vj, "hash_partitioned"));
        for (int d = 0; d < v->ndims; d++)
            v->shape[d] = json_integer_value(json_array_get(shape, (size_t)d));
        size_t np = json_array_size(parts);
        if ((v->parts = calloc(np, sizeof *v->parts)) == NULL)
            return -ENOMEM;
        v->nparts = (int)np;
        for (size_t k = 0; k < np; k++) {
            json_t *pk = json_array_get(parts, k);
            json_t *pn = json_object_get(pk, "name");
            uint64_t shard, rb, re;
            if (!json_is_string(pn) || !get_u64(pk, "shard", &shard) ||
                shard >= num_ps || !get_u64(pk, "row_begin", &rb) ||
                !get_u64(pk, "row_end", &re) || re < rb)
                return bad(err, errlen, c->state_path,
                           "a placed part needs name, shard < num_ps and "
                           "rows");
            if ((v->parts[k].name = strdup(json_string_value(pn))) == NULL)
                return -ENOMEM;
            v->parts[k].shard = (uint32_t)shard;
            v->parts[k].row_begin = (int64_t)rb;
            v->parts[k].row_end = (int64_t)re;
        }
    }
    char why[400];
    if (ps_place_check(p->vars, p->nvars, why, sizeof why) != 0)
        return bad(err, errlen, c->state_path, why);
    c->placed = true;
    return 0;
}

/* A task's unix socket and host id, when the file has them (it has not
 * before they existed) and they are of a length registration takes. */
static void local_json(struct ctask *t, json_t *tj)
{
    json_t *la = json_object_get(tj, "local_address");
    json_t *hi = json_object_get(tj, "host_id");
    const char *l = json_is_string(la) ? json_string_value(la) : "";
    const char *h = json_is_string(hi) ? json_string_value(hi) : "";
    if (strlen(l) >= sizeof t->local_address || strlen(h) >= sizeof t->host_id ||
        (l[0] != '\0' && strncmp(l, "unix:/", 6) != 0))
        l = h = "";
    snprintf(t->local_address, sizeof t->local_address, "%s", l);
    snprintf(t->host_id, sizeof t->host_id, "%s", h);
}

static int load_tasks(coord *c, json_t *tasks, char *err, size_t errlen)
{
    int64_t now = ps_now_ms();
    size_t i;
    json_t *tj;
    json_array_foreach(tasks, i, tj) {
        json_t *role = json_object_get(tj, "role");
        json_t *addr = json_object_get(tj, "address");
        uint64_t index, inc, step = 0;
        enum ps_role r;
        if (!json_is_string(role) ||
            ps_role_parse(json_string_value(role), &r) != 0 ||
            !get_u64(tj, "index", &index) || index > 65535 ||
            !get_u64(tj, "incarnation", &inc) || !json_is_string(addr))
            return bad(err, errlen, c->state_path,
                       "each task needs role, index, address and "
                       "incarnation");
        get_u64(tj, "step", &step);
        struct ctask *t = coord_find_locked(c, r, (int)index);
        if (t == NULL && c->spec != NULL) {
            ps_log_warn("%s: %s[%d] is not in the cluster spec any more; "
                        "forgotten", c->state_path, ps_role_name(r),
                        (int)index);
            continue;
        }
        if (t == NULL && (t = coord_add_locked(c, r, (int)index)) == NULL)
            return -ENOMEM;
        if (!(c->spec != NULL && r == PS_ROLE_PS) &&
            coord_set_address(t, json_string_value(addr)) != 0)
            return bad(err, errlen, c->state_path, "a task's address has more "
                       "than 255 bytes");
        json_t *sec = json_object_get(tj, "secret");
        const char *sv = json_is_string(sec) ? json_string_value(sec) : "";
        if (strlen(sv) != COORD_SECRET_HEX)
            sv = "";
        snprintf(t->secret, sizeof t->secret, "%s", sv);
        local_json(t, tj);
        /* Until the task registers again: `psctl status` goes on naming a
         * worker whose all-reduce is plaintext across the restart. */
        t->insecure_collective = json_is_true(json_object_get(tj, "insecure_collective"));
        t->incarnation = inc;
        t->step = step;
        if (inc > 0) {
            t->state = CT_UNKNOWN;
            t->grace_until_ms = now + c->o.heartbeat_timeout_ms;
        }
    }
    return 0;
}

static int load_restores(coord *c, json_t *rs)
{
    size_t i;
    json_t *rj;
    json_array_foreach(rs, i, rj) {
        if (c->nrestores == COORD_MAX_RESTORES)
            break;
        struct restore_rec *r = &c->restores[c->nrestores];
        uint64_t index = 0, inc = 0, step = 0, t = 0;
        get_u64(rj, "index", &index);
        get_u64(rj, "incarnation", &inc);
        get_u64(rj, "step", &step);
        get_u64(rj, "unix", &t);
        json_t *d = json_object_get(rj, "detail");
        r->detail = strdup(json_is_string(d) ? json_string_value(d) : "");
        if (r->detail == NULL)
            return -ENOMEM;
        r->index = (uint32_t)index;
        r->incarnation = inc;
        r->step = step;
        r->ok = json_is_true(json_object_get(rj, "ok"));
        r->unix_time = (int64_t)t;
        c->nrestores++;
    }
    return 0;
}

int coord_state_load_locked(coord *c, char *err, size_t errlen)
{
    json_t *root;
    int rc = coord_json_read(c->state_path, &root, err, errlen);
    if (rc == -ENOENT) {
        ps_log_info("no %s: job '%s' starts fresh", c->state_path,
                    c->job_id);
        return 0;
    }
    if (rc != 0)
        return rc;
    json_t *job = json_object_get(root, "job_id");
    json_t *tasks = json_object_get(root, "tasks");
    json_t *pl = json_object_get(root, "placement");
    json_t *ev = json_object_get(root, "last_eval");
    json_t *rs = json_object_get(root, "restores");
    uint64_t format = 0;
    if (!get_u64(root, "format", &format) || format != STATE_FORMAT) {
        rc = bad(err, errlen, c->state_path, "\"format\" is not 1");
        goto out;
    }
    if (!json_is_string(job) || !json_is_array(tasks)) {
        rc = bad(err, errlen, c->state_path, "needs job_id and tasks");
        goto out;
    }
    if (strcmp(json_string_value(job), c->job_id) != 0) {
        snprintf(err, errlen, "%s holds the state of job '%s'; this "
                 "coordinator runs job '%s' (give it its own --state-dir)",
                 c->state_path, json_string_value(job), c->job_id);
        rc = PS_ECONFLICT;
        goto out;
    }
    /* "epoch": the same counter in a state file written before it was
     * called the generation. */
    if (json_object_get(root, "generation") != NULL)
        get_u64(root, "generation", &c->generation);
    else
        get_u64(root, "epoch", &c->generation);
    get_u64(root, "global_step", &c->global_step);
    if ((rc = load_tasks(c, tasks, err, errlen)) != 0)
        goto out;
    if (json_is_object(pl) && (rc = load_placement(c, pl, err, errlen)) != 0)
        goto out;
    if (json_is_object(ev)) {
        json_t *a = json_object_get(ev, "accuracy");
        json_t *l = json_object_get(ev, "loss");
        uint64_t t = 0;
        c->has_eval = true;
        c->eval_accuracy = json_number_value(a);
        c->eval_loss = json_number_value(l);
        get_u64(ev, "step", &c->eval_step);
        get_u64(ev, "unix", &t);
        c->eval_unix = (int64_t)t;
    }
    if (json_is_array(rs) && (rc = load_restores(c, rs)) != 0)
        goto out;
    int known = 0;
    for (int i = 0; i < c->ntasks; i++)
        known += c->tasks[i].incarnation > 0;
    ps_log_info("recovered job '%s' from %s: %d registered tasks (each "
                "unknown until heard from, dead after %d ms), %s, global "
                "step %" PRIu64, c->job_id, c->state_path, known,
                c->o.heartbeat_timeout_ms,
                c->placed ? "placement kept" : "no placement yet",
                c->global_step);
out:
    if (rc == -ENOMEM)
        snprintf(err, errlen, "%s: out of memory", c->state_path);
    if (rc != 0) {
        ps_placement_free(&c->placement);
        c->placed = false;
    }
    json_decref(root);
    return rc;
}
