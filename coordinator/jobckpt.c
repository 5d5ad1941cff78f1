/*
 * jobckpt.c - job checkpoints: when a round is due, the manifest that makes
 * it whole, pruning, and the record of restores.
 *
 * A job checkpoint at global step G is one psd checkpoint per ps shard, all
 * at step G, plus the manifest <state-dir>/checkpoints/job-<G>.json:
 *
 *   {"format": 1, "job_id": "mnist-42", "step": 1200,
 *    "created_unix": 1767225600,
 *    "shards": [{"index": 0, "address": "h3:2222",
 *                "path": "/var/lib/psd/checkpoints/1200", "bytes": 81920},
 *               ...]}
 *
 * The manifest is written only once every shard has answered OK, through a
 * temporary file, fsync and rename, so a manifest that exists names a
 * complete checkpoint and a failed round leaves the previous one the latest.
 */
#include "common/clock.h"
#include "coordinator/coord_internal.h"

#include "common/errors.h"
#include "coordinator/jsonfile.h"
#include "common/log.h"
#include "common/retention.h"
#include "common/rpc.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MANIFEST_FORMAT 1

static int rec_cmp(const void *a, const void *b)
{
    const struct ckpt_rec *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step;
}

void coord_ckpt_free_locked(coord *c)
{
    for (int i = 0; i < c->nckpts; i++)
        free(c->ckpts[i].path);
    free(c->ckpts);
    c->ckpts = NULL;
    c->nckpts = 0;
}

/* Reads one manifest; 0 with *rec filled (path not set), or nonzero when it
 * is not a whole manifest of this job (logged). */
static int read_manifest(coord *c, const char *path, uint64_t step,
                         struct ckpt_rec *rec)
{
    char err[600];
    json_t *root;
    if (coord_json_read(path, &root, err, sizeof err) != 0) {
        ps_log_warn("ignoring job checkpoint manifest: %s", err);
        return PS_ECORRUPT;
    }
    json_t *job = json_object_get(root, "job_id");
    json_t *shards = json_object_get(root, "shards");
    json_t *st = json_object_get(root, "step");
    int rc = 0;
    if (!json_is_string(job) || !json_is_array(shards) ||
        json_array_size(shards) == 0 || !json_is_integer(st) ||
        (uint64_t)json_integer_value(st) != step) {
        ps_log_warn("ignoring %s: it needs job_id, step %" PRIu64 " and "
                    "shards", path, step);
        rc = PS_ECORRUPT;
    } else if (strcmp(json_string_value(job), c->job_id) != 0) {
        ps_log_warn("ignoring %s: it is job '%s''s, not '%s''s", path,
                    json_string_value(job), c->job_id);
        rc = PS_ECONFLICT;
    } else {
        rec->step = step;
        rec->nshards = (int)json_array_size(shards);
        rec->created_unix =
            json_integer_value(json_object_get(root, "created_unix"));
    }
    json_decref(root);
    return rc;
}

int coord_ckpt_scan_locked(coord *c, char *err, size_t errlen)
{
    DIR *d = opendir(c->ckpt_dir);
    if (d == NULL) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", c->ckpt_dir, strerror(e));
        return -e;
    }
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)) != NULL) {
        unsigned long long step;
        char check[64];
        if (sscanf(de->d_name, "job-%llu.json", &step) != 1)
            continue;
        snprintf(check, sizeof check, "job-%llu.json", step);
        if (strcmp(check, de->d_name) != 0)
            continue;
        struct ckpt_rec rec = {0};
        if (asprintf(&rec.path, "%s/%s", c->ckpt_dir, de->d_name) < 0) {
            rc = -ENOMEM;
            break;
        }
        if (read_manifest(c, rec.path, step, &rec) != 0) {
            free(rec.path);
            continue;
        }
        struct ckpt_rec *k =
            realloc(c->ckpts, sizeof *k * (size_t)(c->nckpts + 1));
        if (k == NULL) {
            free(rec.path);
            rc = -ENOMEM;
            break;
        }
        c->ckpts = k;
        c->ckpts[c->nckpts++] = rec;
    }
    closedir(d);
    if (rc != 0) {
        snprintf(err, errlen, "%s: out of memory", c->ckpt_dir);
        return rc;
    }
    qsort(c->ckpts, (size_t)c->nckpts, sizeof *c->ckpts, rec_cmp);
    if (c->nckpts > 0)
        ps_log_info("%d job checkpoint%s in %s, the latest at step %" PRIu64,
                    c->nckpts, c->nckpts == 1 ? "" : "s", c->ckpt_dir,
                    c->ckpts[c->nckpts - 1].step);
    return 0;
}

/* Logs why a due round cannot run: once per reason, and again every 30 s
 * while it lasts, not on every tick. */
static void skip_locked(coord *c, int64_t now, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void skip_locked(coord *c, int64_t now, const char *fmt, ...)
{
    char why[sizeof c->ck_skip_why];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (strcmp(why, c->ck_skip_why) == 0 && now - c->ck_skip_ms < 30000)
        return;
    snprintf(c->ck_skip_why, sizeof c->ck_skip_why, "%s", why);
    c->ck_skip_ms = now;
    ps_log_warn("job checkpoint at step %" PRIu64 " waits: %s",
                c->global_step, why);
}

bool coord_checkpoint_due(coord *c, uint64_t *step, struct coord_ps_call *out,
                          int max, int *n)
{
    *n = 0;
    bool go = false;
    pthread_mutex_lock(&c->mu);
    uint64_t g = c->global_step, every = c->o.checkpoint_every_steps;
    int64_t now = ps_now_ms();
    if (c->stopping || c->ck_running)
        goto out;
    bool due = every > 0 && g / every > c->ck_last_step / every;
    if (c->o.checkpoint_every_ms > 0 &&
        now - c->ck_last_ms >= c->o.checkpoint_every_ms &&
        g > c->ck_last_step)
        due = true;
    if (!due)
        goto out;
    /* A round that cannot run yet (no shard, one dead or restoring) stays
     * due and runs once the shards are back; one that runs and fails counts
     * as taken, so the next try is at the next boundary. */
    uint32_t nps = coord_num_ps_locked(c);
    if (nps == 0) {
        skip_locked(c, now, "the job has no ps task yet");
        goto out;
    }
    if ((int)nps > max) {
        skip_locked(c, now, "%u ps shards, more than the %d a round can "
                    "call", nps, max);
        goto out;
    }
    for (uint32_t i = 0; i < nps; i++) {
        const struct ctask *t = coord_find_locked(c, PS_ROLE_PS, (int)i);
        if (t == NULL || t->state != CT_ALIVE || t->restoring) {
            skip_locked(c, now, "ps[%u]%s%s is %s", i,
                        t != NULL ? " at " : "", t != NULL ? t->address : "",
                        t == NULL ? "not registered"
                        : t->restoring ? "restoring"
                                       : coord_state_name(t->state));
            goto out;
        }
        memset(&out[i], 0, sizeof out[i]);
        out[i].index = i;
        out[i].incarnation = t->incarnation;
        out[i].step = g;
        snprintf(out[i].address, sizeof out[i].address, "%s", t->address);
    }
    c->ck_skip_why[0] = '\0';
    c->ck_last_step = g;
    c->ck_last_ms = now;
    *n = (int)nps;
    *step = g;
    c->ck_running = true;
    go = true;
out:
    pthread_mutex_unlock(&c->mu);
    return go;
}

static const char *latest_text(const coord *c, char *buf, size_t len)
{
    if (c->nckpts == 0)
        snprintf(buf, len, "none");
    else
        snprintf(buf, len, "step %" PRIu64, c->ckpts[c->nckpts - 1].step);
    return buf;
}

/* Deletes the oldest manifests by the retention rule (common/retention.h)
 * with --checkpoint-keep. The shards' own checkpoint directories are the
 * psd's to prune by the same rule; each Checkpoint call asks it to keep at
 * least as many (CheckpointRequest.keep_at_least). */
static void prune_locked(coord *c)
{
    int drop = (int)ps_retention_drop((size_t)c->nckpts,
                                      ps_retention_keep((size_t)c->o.checkpoint_keep, 0));
    if (drop == 0)
        return;
    for (int i = 0; i < drop; i++) {
        if (unlink(c->ckpts[i].path) != 0 && errno != ENOENT)
            ps_log_warn("cannot delete the old manifest %s: %s",
                        c->ckpts[i].path, strerror(errno));
        else
            ps_log_info("pruned job checkpoint %" PRIu64 " (%s)",
                        c->ckpts[i].step, c->ckpts[i].path);
        free(c->ckpts[i].path);
    }
    memmove(c->ckpts, c->ckpts + drop,
            sizeof *c->ckpts * (size_t)(c->nckpts - drop));
    c->nckpts -= drop;
}

/* Logs each shard that failed the round; returns how many did. */
static int log_failed_locked(const coord *c, uint64_t step,
                             const struct coord_shard_result *res, int n)
{
    char latest[64];
    int failed = 0;
    for (int i = 0; i < n; i++) {
        if (res[i].ok)
            continue;
        failed++;
        ps_log_error("job checkpoint at step %" PRIu64 " failed on ps[%u] at "
                     "%s: %s; the latest job checkpoint stays %s", step,
                     res[i].index, res[i].address, res[i].error,
                     latest_text(c, latest, sizeof latest));
    }
    return failed;
}

/* Writes the manifest of a round every shard answered. Returns 0 with
 * rec->path (the caller's to free) and *total (the shards' bytes) set, or
 * nonzero after logging why the round is not taken. */
static int write_manifest_locked(const coord *c, uint64_t step,
                                 const struct coord_shard_result *res, int n,
                                 struct ckpt_rec *rec, uint64_t *total)
{
    if (asprintf(&rec->path, "%s/job-%" PRIu64 ".json", c->ckpt_dir, step) <
        0) {
        ps_log_error("job checkpoint at step %" PRIu64 ": out of memory",
                     step);
        return -ENOMEM;
    }
    json_t *shards = json_array();
    *total = 0;
    for (int i = 0; i < n; i++) {
        *total += res[i].bytes;
        json_array_append_new(shards, json_pack(
            "{s:i, s:s, s:s, s:I}", "index", (int)res[i].index, "address",
            res[i].address, "path", res[i].path, "bytes",
            (json_int_t)res[i].bytes));
    }
    json_t *root = json_pack("{s:i, s:s, s:I, s:I, s:o}", "format",
                             MANIFEST_FORMAT, "job_id", c->job_id, "step",
                             (json_int_t)step, "created_unix",
                             (json_int_t)rec->created_unix, "shards", shards);
    char err[600];
    int rc = root != NULL ? coord_json_write(rec->path, root, 0644, err,
                                            sizeof err)
                          : -ENOMEM;
    json_decref(root);
    if (rc != 0) {
        char latest[64];
        ps_log_error("job checkpoint at step %" PRIu64 ": the shards are "
                     "written but the manifest is not (%s); the latest job "
                     "checkpoint stays %s", step,
                     rc == -ENOMEM ? "out of memory" : err,
                     latest_text(c, latest, sizeof latest));
        free(rec->path);
        rec->path = NULL;
    }
    return rc;
}

/* Puts rec into the list by step, replacing one of the same step. Returns
 * its index, or -1 when out of memory (rec is then the caller's). */
static int insert_rec_locked(coord *c, const struct ckpt_rec *rec)
{
    int at = 0;
    while (at < c->nckpts && c->ckpts[at].step < rec->step)
        at++;
    if (at < c->nckpts && c->ckpts[at].step == rec->step) {
        free(c->ckpts[at].path);
        c->ckpts[at] = *rec;
        return at;
    }
    struct ckpt_rec *k =
        realloc(c->ckpts, sizeof *k * (size_t)(c->nckpts + 1));
    if (k == NULL)
        return -1;
    c->ckpts = k;
    memmove(&c->ckpts[at + 1], &c->ckpts[at],
            sizeof *k * (size_t)(c->nckpts - at));
    c->ckpts[at] = *rec;
    c->nckpts++;
    return at;
}

void coord_checkpoint_done(coord *c, uint64_t step,
                           const struct coord_shard_result *res, int n)
{
    char latest[64];
    pthread_mutex_lock(&c->mu);
    c->ck_running = false;
    if (res == NULL || n <= 0) {
        ps_log_error("job checkpoint at step %" PRIu64 " was not taken; the "
                     "latest job checkpoint stays %s", step,
                     latest_text(c, latest, sizeof latest));
        goto out;
    }
    if (log_failed_locked(c, step, res, n) > 0)
        goto out;
    struct ckpt_rec rec = {.step = step, .created_unix = coord_unix_now(),
                           .nshards = n};
    uint64_t total;
    if (write_manifest_locked(c, step, res, n, &rec, &total) != 0)
        goto out;
    int at = insert_rec_locked(c, &rec);
    if (at < 0) {
        free(rec.path);
        ps_log_error("job checkpoint at step %" PRIu64 ": out of memory",
                     step);
        goto out;
    }
    ps_log_info("job checkpoint at step %" PRIu64 ": %d shard%s, %" PRIu64
                " bytes, manifest %s", step, n, n == 1 ? "" : "s", total,
                c->ckpts[at].path);
    prune_locked(c);
    coord_bump_locked(c);
    coord_state_save_locked(c);
    c->ckpt_rounds_ok++;
    pthread_mutex_unlock(&c->mu);
    return;
out:
    c->ckpt_rounds_failed++;
    pthread_mutex_unlock(&c->mu);
}

bool coord_restore_wanted(coord *c, const struct coord_ps_call *call)
{
    pthread_mutex_lock(&c->mu);
    const struct ctask *t = coord_find_locked(c, PS_ROLE_PS,
                                              (int)call->index);
    bool want = !c->stopping && t != NULL &&
                t->incarnation == call->incarnation && t->restoring;
    pthread_mutex_unlock(&c->mu);
    return want;
}

void coord_restore_done(coord *c, const struct coord_ps_call *call, bool ok,
                        uint64_t variables, const char *detail)
{
    pthread_mutex_lock(&c->mu);
    struct ctask *t = coord_find_locked(c, PS_ROLE_PS, (int)call->index);
    if (t != NULL && t->incarnation == call->incarnation)
        t->restoring = false;
    if (c->nrestores == COORD_MAX_RESTORES) {
        free(c->restores[0].detail);
        memmove(c->restores, c->restores + 1,
                sizeof c->restores[0] * (COORD_MAX_RESTORES - 1));
        c->nrestores--;
    }
    struct restore_rec *r = &c->restores[c->nrestores];
    r->index = call->index;
    r->incarnation = call->incarnation;
    r->step = call->step;
    r->ok = ok;
    r->unix_time = coord_unix_now();
    r->detail = strdup(detail != NULL ? detail : "");
    if (r->detail != NULL)
        c->nrestores++;
    if (ok)
        c->restores_ok++;
    else
        c->restores_failed++;
    coord_bump_locked(c);
    coord_state_save_locked(c);
    /* Logged once the record is in state.json: whoever reads the line may
     * read the record. */
    if (ok)
        ps_log_info("restored ps[%u] at %s from job checkpoint %" PRIu64
                    ": %" PRIu64 " variable%s", call->index, call->address,
                    call->step, variables, variables == 1 ? "" : "s");
    else
        ps_log_error("restore of ps[%u] at %s from job checkpoint %" PRIu64
                     " failed: %s", call->index, call->address, call->step,
                     detail);
    pthread_mutex_unlock(&c->mu);
}
