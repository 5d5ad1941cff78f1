/*
 * cmd_var.c - the commands about variables: list (all of them), show, pull,
 * create and delete (one). See psctl.h.
 */
#include "tools/psctl.h"

#include "common/errors.h"
#include "common/tensor.h"
#include "common/tensor_pb.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- list ------------------------------------------------------------- */

enum { COL_SHARD, COL_NAME, COL_SHAPE, COL_DTYPE, COL_OPT, COL_CONS, COL_VERSION,
       COL_BYTES, NCOLS };

struct list_row {
    const char *cell[NCOLS];
    char shard[16];
    char shape[192];
    char cons[32];
    char dtype[48];
    char version[24];
    char bytes[64];
};

/* A sparse table's cells: its rows and dim for the shape ("1200 rows x
 * 64"), its rows' bytes on disk and in RAM for the bytes, and with half
 * slots (slot_dtype) their dtype after the rows' ("float16, bfloat16
 * slots"). */
static void sparse_cells(const Ps__V1__VariableInfo *v, const Ps__V1__VariableSpec *sp,
                         struct list_row *row)
{
    char disk[24], ram[24];
    snprintf(row->shape, sizeof row->shape, "%" PRIu64 " rows x %lld", v->sparse_rows,
             sp->n_shape == 1 ? (long long)sp->shape[0] : 0LL);
    snprintf(row->bytes, sizeof row->bytes, "%s disk, %s RAM",
             human_bytes(v->sparse_disk_bytes, disk, sizeof disk),
             human_bytes(v->sparse_ram_bytes, ram, sizeof ram));
    row->cell[COL_SHAPE] = row->shape;
    row->cell[COL_BYTES] = row->bytes;
    if (sp->slot_dtype != 0) {
        snprintf(row->dtype, sizeof row->dtype, "%s, %s slots", row->cell[COL_DTYPE],
                 ps_dtype_name((enum ps_dtype)sp->slot_dtype));
        row->cell[COL_DTYPE] = row->dtype;
    }
}

/* One row; the shard column only when fanned out over a job. */
static void print_row(const char *const *cell, const int *width, bool shards)
{
    for (int c = shards ? 0 : 1; c < NCOLS; c++) {
        bool right = c == COL_VERSION || c == COL_BYTES;
        printf(right ? "%*s%s" : "%-*s%s", c == NCOLS - 1 && !right ? 0
                                                                    : width[c],
               cell[c], c == NCOLS - 1 ? "\n" : "  ");
    }
}

/* The variables of each answer, in shard order; with shards, a SHARD column
 * and a closing total line. */
static int print_list(void **resps, const struct shard *sh, size_t nresp, const char *job,
                      bool shards)
{
    Ps__V1__ListVariablesResponse **r = (Ps__V1__ListVariablesResponse **)resps;
    (void)job;
    static const char *const header[NCOLS] = {
        "SHARD", "NAME", "SHAPE", "DTYPE", "OPTIMIZER", "CONSISTENCY", "VERSION",
        "BYTES"};
    size_t total = 0;
    for (size_t k = 0; k < nresp; k++)
        total += r[k]->n_variables;
    struct list_row *rows = calloc(total ? total : 1, sizeof *rows);
    if (rows == NULL) {
        fprintf(stderr, "psctl: list: out of memory\n");
        return EXIT_FAIL;
    }
    int width[NCOLS];
    for (int c = 0; c < NCOLS; c++)
        width[c] = (int)strlen(header[c]);
    uint64_t bytes = 0;
    size_t i = 0;
    for (size_t k = 0; k < nresp; k++) {
        for (size_t j = 0; j < r[k]->n_variables; j++, i++) {
            const Ps__V1__VariableInfo *v = r[k]->variables[j];
            const Ps__V1__VariableSpec *sp = v->spec;
            struct list_row *row = &rows[i];
            if (sp == NULL) {
                static const Ps__V1__VariableSpec empty =
                    PS__V1__VARIABLE_SPEC__INIT;
                sp = &empty;
            }
            snprintf(row->shard, sizeof row->shard, "%u", sh[k].index);
            row->cell[COL_SHARD] = row->shard;
            row->cell[COL_NAME] = sp->name;
            row->cell[COL_SHAPE] = shape_text(sp->shape, sp->n_shape, row->shape,
                                              sizeof row->shape);
            /* A sparse table's is its rows' (row_dtype), unset meaning float32. */
            row->cell[COL_DTYPE] = ps_dtype_name(
                (enum ps_dtype)(sp->sparse && sp->row_dtype ? sp->row_dtype : sp->dtype));
            row->cell[COL_OPT] = optimizer_label(sp->optimizer);
            row->cell[COL_CONS] = consistency_label(sp, row->cons,
                                                    sizeof row->cons);
            snprintf(row->version, sizeof row->version, "%" PRIu64, v->version);
            row->cell[COL_VERSION] = row->version;
            row->cell[COL_BYTES] = human_bytes(v->value_bytes + v->slot_bytes,
                                               row->bytes, sizeof row->bytes);
            if (sp->sparse)
                sparse_cells(v, sp, row);
            bytes += v->value_bytes + v->slot_bytes;
            for (int c = 0; c < NCOLS; c++) {
                int w = (int)strlen(row->cell[c]);
                if (w > width[c])
                    width[c] = w;
            }
        }
    }
    print_row(header, width, shards);
    for (i = 0; i < total; i++)
        print_row(rows[i].cell, width, shards);
    if (shards) {
        char b[32];
        printf("TOTAL  %zu variable%s on %zu shard%s, %s\n", total,
               total == 1 ? "" : "s", nresp, nresp == 1 ? "" : "s",
               human_bytes(bytes, b, sizeof b));
    }
    free(rows);
    return EXIT_OK;
}

/* {"job_id", "variables": [{"shard", "server", VariableInfo's fields}],
 * "total": {"variables", "value_bytes", "slot_bytes"}}. */
static json_t *list_json(void **resps, const struct shard *sh, size_t n, const char *job_id)
{
    Ps__V1__ListVariablesResponse **r = (Ps__V1__ListVariablesResponse **)resps;
    json_t *root = json_object(), *vars = json_array();
    json_int_t count = 0, value = 0, slot = 0;
    for (size_t k = 0; k < n; k++) {
        for (size_t j = 0; j < r[k]->n_variables; j++) {
            const Ps__V1__VariableInfo *v = r[k]->variables[j];
            json_t *o = pbjson_message(&v->base);
            if (o == NULL)
                continue;
            shard_json(o, &sh[k]);
            json_array_append_new(vars, o);
            count++;
            value += (json_int_t)v->value_bytes;
            slot += (json_int_t)v->slot_bytes;
        }
    }
    json_object_set_new(root, "job_id", job_id[0] ? json_string(job_id) : json_null());
    json_object_set_new(root, "variables", vars);
    json_object_set_new(root, "total", json_pack("{sIsIsI}", "variables", count,
                                                 "value_bytes", value, "slot_bytes",
                                                 slot));
    return root;
}

const struct fan_cmd list_fan = {PS_METHOD("ListVariables"),
                                 &ps__v1__list_variables_request__descriptor,
                                 &ps__v1__list_variables_response__descriptor, list_json,
                                 print_list};

/* ---- show, pull ------------------------------------------------------- */

/* Pulls one variable. Returns 0 with *resp_out (the caller frees it with
 * protobuf_c_message_free_unpacked) and *view pointing into it, or
 * EXIT_FAIL after one line on stderr. */
static int pull_one(struct session *s, const char *name,
                    Ps__V1__PullResponse **resp_out, ps_tensor *view,
                    uint64_t *version)
{
    Ps__V1__PullItem item = PS__V1__PULL_ITEM__INIT;
    item.name = (char *)name;
    Ps__V1__PullItem *items[1] = {&item};
    Ps__V1__PullRequest req = PS__V1__PULL_REQUEST__INIT;
    req.n_items = 1;
    req.items = items;
    void *out;
    int rc = session_call(s, PS_METHOD("Pull"), &req,
                          &ps__v1__pull_response__descriptor, &out);
    if (rc != 0)
        return rc;
    Ps__V1__PullResponse *r = out;
    char err[256];
    if (r->n_values != 1 || r->values[0]->value == NULL) {
        fprintf(stderr, "psctl: %s: the server answered %zu values for "
                "variable '%s', expected 1\n", s->cmd->words, r->n_values,
                name);
        rc = EXIT_FAIL;
    } else if (ps_tensor_view_pb(r->values[0]->value, view, err,
                                 sizeof err) != 0) {
        fprintf(stderr, "psctl: %s: variable '%s': %s\n", s->cmd->words, name,
                err);
        rc = EXIT_FAIL;
    }
    if (rc != 0) {
        protobuf_c_message_free_unpacked(&r->base, NULL);
        return rc;
    }
    *version = r->values[0]->version;
    *resp_out = r;
    return 0;
}

static void print_optimizer(const Ps__V1__Optimizer *o)
{
    if (o == NULL) {
        printf("sgd (server defaults)\n");
        return;
    }
    printf("%s (learning_rate %g", optimizer_label(o),
           (double)o->learning_rate);
    switch (o->kind) {
    case PS__V1__OPTIMIZER__KIND__MOMENTUM:
        printf(", momentum %g", (double)o->momentum);
        break;
    case PS__V1__OPTIMIZER__KIND__ADAGRAD:
        printf(", initial_accumulator %g, epsilon %g",
               (double)o->initial_accumulator, (double)o->epsilon);
        break;
    case PS__V1__OPTIMIZER__KIND__ADAM:
        printf(", beta1 %g, beta2 %g, epsilon %g", (double)o->beta1,
               (double)o->beta2, (double)o->epsilon);
        break;
    case PS__V1__OPTIMIZER__KIND__FTRL:
        printf(", initial_accumulator %g, learning_rate_power %g, l1 %g, "
               "l2 %g, l2_shrinkage %g, beta %g",
               (double)o->initial_accumulator, (double)o->learning_rate_power,
               (double)o->l1, (double)o->l2, (double)o->l2_shrinkage,
               (double)o->beta);
        break;
    default:
        break;
    }
    printf(")\n");
}

static void print_initializer(const Ps__V1__Initializer *in)
{
    if (in == NULL) {
        printf("zeros\n");
        return;
    }
    switch (in->kind) {
    case PS__V1__INITIALIZER__KIND__ZEROS:
        printf("zeros\n");
        break;
    case PS__V1__INITIALIZER__KIND__CONSTANT:
        printf("constant (value %g)\n", (double)in->value);
        break;
    case PS__V1__INITIALIZER__KIND__UNIFORM:
        printf("uniform (min %g, max %g, seed %" PRIu64 ")\n",
               (double)in->minval, (double)in->maxval, in->seed);
        break;
    case PS__V1__INITIALIZER__KIND__NORMAL:
    case PS__V1__INITIALIZER__KIND__TRUNCATED_NORMAL:
        printf("%s (mean %g, stddev %g, seed %" PRIu64 ")\n",
               in->kind == PS__V1__INITIALIZER__KIND__NORMAL
                   ? "normal" : "truncated_normal",
               (double)in->mean, (double)in->stddev, in->seed);
        break;
    case PS__V1__INITIALIZER__KIND__GLOROT_UNIFORM:
        printf("glorot_uniform (seed %" PRIu64 ")\n", in->seed);
        break;
    default:
        printf("unknown (kind %d)\n", (int)in->kind);
        break;
    }
}

/* "784.0 KiB (802816 bytes)"; "48 B" needs no exact count beside it. */
static void print_bytes(const char *label, uint64_t n)
{
    char human[32];
    human_bytes(n, human, sizeof human);
    if (n < 1024)
        printf("%-13s %s\n", label, human);
    else
        printf("%-13s %s (%" PRIu64 " bytes)\n", label, human, n);
}

/* Prints what `show` says of a variable, its spec from ListVariables and
 * its value from Pull. */
static void print_variable(const Ps__V1__VariableInfo *info,
                           const ps_tensor *val, uint64_t version)
{
    const Ps__V1__VariableSpec *sp = info->spec;
    char buf[192];
    printf("%-13s %s\n", "name", sp->name);
    printf("%-13s %s\n", "shape",
           ps_tensor_shape_str(val->shape, val->ndim, buf, sizeof buf));
    printf("%-13s %s\n", "dtype", ps_dtype_name(val->dtype));
    printf("%-13s %" PRIu64 "\n", "version", version);
    printf("%-13s ", "optimizer");
    print_optimizer(sp->optimizer);
    printf("%-13s ", "initializer");
    print_initializer(sp->initializer);
    if (sp->consistency == PS__V1__CONSISTENCY__SYNC)
        printf("%-13s sync (%u worker%s per step)\n", "consistency",
               sp->num_workers, sp->num_workers == 1 ? "" : "s");
    else
        printf("%-13s %s\n", "consistency", consistency_label(sp, buf,
                                                              sizeof buf));
    print_bytes("value bytes", info->value_bytes);
    print_bytes("slot bytes", info->slot_bytes);

    /* In double: a float sum of a million squares loses digits. */
    double sumsq = 0, sum = 0;
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < val->numel; i++) {
        double x = val->data[i];
        sumsq += x * x;
        sum += x;
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
    printf("%-13s %.8g\n", "l2 norm", sqrt(sumsq));
    printf("%-13s %.8g\n", "min", lo);
    printf("%-13s %.8g\n", "max", hi);
    printf("%-13s %.8g\n", "mean", sum / (double)val->numel);
}

/* show and pull: the connection options, and pull's --output. */
struct pull_cfg {
    struct conn_cfg conn;
    char *output;
};

/* What show and pull do with the value they pulled; returns the exit
 * status. */
typedef int (*pulled_fn)(struct session *s, const char *name,
                         const ps_tensor *val, uint64_t version,
                         const struct pull_cfg *cfg);

/* Zeroes cfg (size bytes) and parses the one NAME and opts of a command on
 * a variable into them. Returns what parse_command does. */
static int parse_name(const struct command *self, const ps_opt *opts, void *cfg, size_t size,
                      int argc, char **argv, char **name)
{
    memset(cfg, 0, size);
    int npos;
    return parse_command(self, opts, cfg, argc, argv, "NAME", 1, 1, name, &npos);
}

/* show and pull: parses NAME and opts, lets check refuse the options (it
 * returns -1 to go on; NULL: nothing to check), opens and probes the
 * session, pulls NAME and hands its value to use. Returns the exit
 * status. */
static int run_pull_command(const struct command *self, int argc,
                            char **argv, const ps_opt *opts,
                            int (*check)(const struct pull_cfg *cfg),
                            pulled_fn use)
{
    struct pull_cfg cfg;
    struct session s;
    char *name;
    int rc = parse_name(self, opts, &cfg, sizeof cfg, argc, argv, &name);
    if (rc >= 0)
        goto out;
    if (check != NULL && (rc = check(&cfg)) >= 0)
        goto out;
    if ((rc = session_start(&s, self, &cfg.conn)) >= 0)
        goto out;
    /* Pull first: for an unknown name its NOT_FOUND is the answer. */
    Ps__V1__PullResponse *pulled;
    ps_tensor val;
    uint64_t version;
    rc = pull_one(&s, name, &pulled, &val, &version);
    if (rc == 0) {
        rc = use(&s, name, &val, version, &cfg);
        protobuf_c_message_free_unpacked(&pulled->base, NULL);
    }
    session_close(&s);
out:
    ps_conf_free(opts, &cfg);
    return rc;
}

/* show: the pulled value beside the variable's spec from ListVariables. */
static int show_pulled(struct session *s, const char *name,
                       const ps_tensor *val, uint64_t version,
                       const struct pull_cfg *cfg)
{
    (void)cfg;
    Ps__V1__ListVariablesRequest req = PS__V1__LIST_VARIABLES_REQUEST__INIT;
    void *resp;
    int rc = session_call(s, PS_METHOD("ListVariables"), &req,
                          &ps__v1__list_variables_response__descriptor,
                          &resp);
    if (rc != 0)
        return rc;
    Ps__V1__ListVariablesResponse *list = resp;
    const Ps__V1__VariableInfo *info = NULL;
    for (size_t i = 0; i < list->n_variables && info == NULL; i++)
        if (list->variables[i]->spec != NULL &&
            strcmp(list->variables[i]->spec->name, name) == 0)
            info = list->variables[i];
    if (info == NULL) {
        /* Only a Restore between the two calls can do this. */
        fprintf(stderr, "psctl: show: variable '%s' was pulled but is no "
                "longer listed (restored meanwhile?); try again\n", name);
        rc = EXIT_FAIL;
    } else {
        print_variable(info, val, version);
        rc = EXIT_OK;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

int cmd_show(const struct command *self, int argc, char **argv)
{
    return run_pull_command(self, argc, argv, conn_opts, NULL, show_pulled);
}

static const ps_opt pull_opts[] = {
    {"output", PS_OPT_STRING, offsetof(struct pull_cfg, output), NULL,
     "the .npy file to write (required; also -o FILE); replaced atomically",
     0, 0, NULL},
    CONN_OPTS(struct pull_cfg),
    {0},
};

static int check_pull(const struct pull_cfg *cfg)
{
    if (cfg->output != NULL && cfg->output[0] != '\0')
        return -1;
    fprintf(stderr, "psctl: pull: -o FILE is required (where to write "
            "the .npy)\n");
    return EXIT_USAGE;
}

/* pull: the value into the .npy file --output names. */
static int write_pulled(struct session *s, const char *name,
                        const ps_tensor *val, uint64_t version,
                        const struct pull_cfg *cfg)
{
    (void)s;
    (void)name;
    const char *output = cfg->output;
    int wrc = ps_npy_write(output, val->shape, val->ndim, val->data);
    if (wrc != 0) {
        fprintf(stderr, "psctl: pull: cannot write %s: %s\n", output,
                ps_strerror(wrc));
        return EXIT_FAIL;
    }
    char shape[192];
    printf("wrote %s (shape %s, version %" PRIu64 ")\n", output,
           ps_tensor_shape_str(val->shape, val->ndim, shape, sizeof shape),
           version);
    return EXIT_OK;
}

int cmd_pull(const struct command *self, int argc, char **argv)
{
    return run_pull_command(self, argc, argv, pull_opts, check_pull,
                            write_pulled);
}

/* ---- create ----------------------------------------------------------- */

struct create_cfg {
    struct conn_cfg conn;
    char *shape;
    char *init;
    uint64_t seed;
    int optimizer;   /* index into optimizer_choices */
    double lr;       /* 0: the server's default, as in the proto */
    double momentum;
    double beta1;
    double beta2;
    double epsilon;
    double initial_accumulator;
    double lr_power, l1, l2, l2_shrinkage, beta; /* ftrl */
    int consistency; /* index into consistency_choices = the proto's value */
    int workers;
    int staleness;
};

enum { OPT_SGD, OPT_MOMENTUM, OPT_NESTEROV, OPT_ADAGRAD, OPT_ADAM, OPT_FTRL };
static const char *const optimizer_choices[] = {
    "sgd", "momentum", "nesterov", "adagrad", "adam", "ftrl", NULL};
static const char *const consistency_choices[] = {"default", "async", "sync",
                                                  "bounded", NULL};

static const ps_opt create_opts[] = {
    {"shape", PS_OPT_STRING, offsetof(struct create_cfg, shape), NULL,
     "dimensions, outermost first, e.g. 784,256 (required; \"\" for a "
     "scalar)", 0, 0, NULL},
    {"init", PS_OPT_STRING, offsetof(struct create_cfg, init), "zeros",
     "initial value: zeros, constant:V, uniform:MIN,MAX, normal:MEAN,STD, "
     "truncated_normal:MEAN,STD or glorot_uniform", 0, 0, NULL},
    {"init-seed", PS_OPT_UINT64, offsetof(struct create_cfg, seed), "0",
     "seed of a random --init: the same seed gives the same bits on every "
     "host", 0, 0, NULL},
    {"optimizer", PS_OPT_ENUM, offsetof(struct create_cfg, optimizer), "sgd",
     "update rule the server applies to pushed gradients", 0, 0,
     optimizer_choices},
    {"lr", PS_OPT_DOUBLE, offsetof(struct create_cfg, lr), NULL,
     "learning rate, > 0 (default: the server's, 0.01)", 0, 0, NULL},
    {"momentum", PS_OPT_DOUBLE, offsetof(struct create_cfg, momentum), NULL,
     "momentum, nesterov: in [0, 1) (default 0.9)", 0, 0, NULL},
    {"beta1", PS_OPT_DOUBLE, offsetof(struct create_cfg, beta1), NULL,
     "adam: in [0, 1) (default 0.9)", 0, 0, NULL},
    {"beta2", PS_OPT_DOUBLE, offsetof(struct create_cfg, beta2), NULL,
     "adam: in [0, 1) (default 0.999)", 0, 0, NULL},
    {"epsilon", PS_OPT_DOUBLE, offsetof(struct create_cfg, epsilon), NULL,
     "adagrad, adam: > 0 (default 1e-7)", 0, 0, NULL},
    {"initial-accumulator", PS_OPT_DOUBLE,
     offsetof(struct create_cfg, initial_accumulator), NULL,
     "adagrad, ftrl: >= 0 (default 0.1)", 0, 0, NULL},
    {"lr-power", PS_OPT_DOUBLE, offsetof(struct create_cfg, lr_power), NULL,
     "ftrl: learning_rate_power in [-10, 0] (default -0.5; -1e-38 for TF's 0)",
     0, 0, NULL},
    {"l1", PS_OPT_DOUBLE, offsetof(struct create_cfg, l1), NULL,
     "ftrl: l1 regularization strength, >= 0 (default 0)", 0, 0, NULL},
    {"l2", PS_OPT_DOUBLE, offsetof(struct create_cfg, l2), NULL,
     "ftrl: l2 regularization strength, >= 0 (default 0)", 0, 0, NULL},
    {"l2-shrinkage", PS_OPT_DOUBLE, offsetof(struct create_cfg, l2_shrinkage),
     NULL, "ftrl: l2 shrinkage regularization strength, >= 0 (default 0)",
     0, 0, NULL},
    {"beta", PS_OPT_DOUBLE, offsetof(struct create_cfg, beta), NULL,
     "ftrl: Keras' beta, >= 0 (default 0)", 0, 0, NULL},
    {"consistency", PS_OPT_ENUM, offsetof(struct create_cfg, consistency),
     "default", "async (each push applied on arrival), sync (pushes "
     "averaged per step) or bounded (async, pulls held to --staleness); "
     "'default' leaves it to the server's --consistency",
     0, 0,
     consistency_choices},
    {"workers", PS_OPT_INT, offsetof(struct create_cfg, workers), NULL,
     "sync: pushes averaged per step (default: the server's --workers)",
     1, 65536, NULL},
    {"staleness", PS_OPT_INT, offsetof(struct create_cfg, staleness), NULL,
     "bounded: steps a worker may run ahead of the slowest live one "
     "(default 0, lock-step)", 0, 1000000, NULL},
    CONN_OPTS(struct create_cfg),
    {0},
};

/* Parses "784,256" (or numpy's "(784, 256)"; "" or "()" is a scalar) into
 * dims. Returns 0, or -1 with the problem in err. */
static int parse_shape(const char *text, int64_t *dims, size_t *n, char *err,
                       size_t errlen)
{
    const char *p = text;
    *n = 0;
    while (isspace((unsigned char)*p))
        p++;
    bool paren = *p == '(';
    if (paren)
        p++;
    for (;;) {
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '\0' || *p == ')')
            break;
        if (!isdigit((unsigned char)*p) && *p != '-' && *p != '+')
            goto syntax;
        char *end;
        errno = 0;
        long long d = strtoll(p, &end, 10);
        if (end == p)
            goto syntax;
        if (errno == ERANGE) {
            snprintf(err, errlen, "--shape: dimension %zu (%.*s) is too "
                     "large", *n, (int)(end - p), p);
            return -1;
        }
        if (d < 1) {
            snprintf(err, errlen, "--shape: dimension %zu is %lld; every "
                     "dimension must be >= 1", *n, d);
            return -1;
        }
        if (*n == PS_TENSOR_MAX_DIMS) {
            snprintf(err, errlen, "--shape: '%s' has more than %d "
                     "dimensions", text, PS_TENSOR_MAX_DIMS);
            return -1;
        }
        dims[(*n)++] = d;
        p = end;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == ',')
            p++;
        else if (*p != '\0' && *p != ')')
            goto syntax;
    }
    if (paren != (*p == ')'))
        goto syntax;
    if (paren)
        p++;
    while (isspace((unsigned char)*p))
        p++;
    if (*p == '\0')
        return 0;
syntax:
    snprintf(err, errlen, "--shape: '%s' is not a list of dimensions like "
             "784,256", text);
    return -1;
}

struct init_kind {
    const char *name;
    Ps__V1__Initializer__Kind kind;
    const char *params; /* "" when it takes none */
    bool random;        /* --init-seed applies */
};

static const struct init_kind init_kinds[] = {
    {"zeros", PS__V1__INITIALIZER__KIND__ZEROS, "", false},
    {"constant", PS__V1__INITIALIZER__KIND__CONSTANT, "V", false},
    {"uniform", PS__V1__INITIALIZER__KIND__UNIFORM, "MIN,MAX", true},
    {"normal", PS__V1__INITIALIZER__KIND__NORMAL, "MEAN,STD", true},
    {"truncated_normal", PS__V1__INITIALIZER__KIND__TRUNCATED_NORMAL,
     "MEAN,STD", true},
    {"glorot_uniform", PS__V1__INITIALIZER__KIND__GLOROT_UNIFORM, "", true},
    {NULL, 0, NULL, false},
};

/* Parses --init ("uniform:-0.1,0.1") into *in. Returns the kind's row, or
 * NULL with the problem in err. The server checks the values' ranges. */
static const struct init_kind *parse_init(const char *text,
                                          Ps__V1__Initializer *in, char *err,
                                          size_t errlen)
{
    size_t nlen = strcspn(text, ":");
    const struct init_kind *k = init_kinds;
    while (k->name != NULL &&
           (strlen(k->name) != nlen || strncmp(k->name, text, nlen) != 0))
        k++;
    if (k->name == NULL) {
        snprintf(err, errlen, "--init: unknown initializer '%.*s'; expected "
                 "zeros, constant:V, uniform:MIN,MAX, normal:MEAN,STD, "
                 "truncated_normal:MEAN,STD or glorot_uniform", (int)nlen,
                 text);
        return NULL;
    }
    int want = k->params[0] == '\0' ? 0 : strchr(k->params, ',') ? 2 : 1;
    double v[2] = {0, 0};
    int got = 0;
    const char *p = text[nlen] == ':' ? text + nlen + 1 : NULL;
    while (p != NULL && got < 2) {
        char *end;
        v[got] = strtod(p, &end);
        if (end == p || (*end != ',' && *end != '\0') || !isfinite(v[got])) {
            snprintf(err, errlen, "--init: '%.*s' in '%s' is not a finite "
                     "number", (int)strcspn(p, ","), p, text);
            return NULL;
        }
        got++;
        p = *end == ',' ? end + 1 : NULL;
    }
    if (got != want || p != NULL) {
        if (want == 0)
            snprintf(err, errlen, "--init: %s takes no parameters", k->name);
        else
            snprintf(err, errlen, "--init: %s takes %s, e.g. %s:%s", k->name,
                     k->params, k->name, want == 1 ? "0.5" : "-0.1,0.1");
        return NULL;
    }
    in->kind = k->kind;
    switch (k->kind) {
    case PS__V1__INITIALIZER__KIND__CONSTANT:
        in->value = (float)v[0];
        break;
    case PS__V1__INITIALIZER__KIND__UNIFORM:
        in->minval = (float)v[0];
        in->maxval = (float)v[1];
        break;
    case PS__V1__INITIALIZER__KIND__NORMAL:
    case PS__V1__INITIALIZER__KIND__TRUNCATED_NORMAL:
        in->mean = (float)v[0];
        in->stddev = (float)v[1];
        break;
    default:
        break;
    }
    return k;
}

/* Refuses a hyper-parameter the chosen optimizer would silently ignore.
 * Returns 0 or -1 with the problem in err. */
static int check_applies(const struct create_cfg *c, char *err, size_t errlen)
{
    int o = c->optimizer;
    const char *flag = NULL, *applies = NULL;
    if (c->momentum != 0 && o != OPT_MOMENTUM && o != OPT_NESTEROV)
        flag = "--momentum", applies = "momentum or nesterov";
    else if (c->beta1 != 0 && o != OPT_ADAM)
        flag = "--beta1", applies = "adam";
    else if (c->beta2 != 0 && o != OPT_ADAM)
        flag = "--beta2", applies = "adam";
    else if (c->epsilon != 0 && o != OPT_ADAGRAD && o != OPT_ADAM)
        flag = "--epsilon", applies = "adagrad or adam";
    else if (c->initial_accumulator != 0 && o != OPT_ADAGRAD && o != OPT_FTRL)
        flag = "--initial-accumulator", applies = "adagrad or ftrl";
    else if ((c->lr_power != 0 || c->l1 != 0 || c->l2 != 0 ||
              c->l2_shrinkage != 0 || c->beta != 0) && o != OPT_FTRL)
        flag = "--lr-power, --l1, --l2, --l2-shrinkage or --beta",
        applies = "ftrl";
    if (flag != NULL) {
        snprintf(err, errlen, "%s applies to --optimizer %s only, not %s",
                 flag, applies, optimizer_choices[o]);
        return -1;
    }
    if (c->staleness != 0 &&
        c->consistency != PS__V1__CONSISTENCY__BOUNDED_STALENESS) {
        snprintf(err, errlen, "--staleness applies to --consistency bounded only");
        return -1;
    }
    if (c->workers != 0 && c->consistency == PS__V1__CONSISTENCY__ASYNC) {
        snprintf(err, errlen, "--workers applies to --consistency sync only");
        return -1;
    }
    return 0;
}

/* The optimizer create's options describe. Out-of-range values go
 * through: the server's refusal names them. */
static void fill_optimizer(const struct create_cfg *c, Ps__V1__Optimizer *opt)
{
    static const Ps__V1__Optimizer__Kind kinds[] = {
        [OPT_SGD] = PS__V1__OPTIMIZER__KIND__SGD,
        [OPT_MOMENTUM] = PS__V1__OPTIMIZER__KIND__MOMENTUM,
        [OPT_NESTEROV] = PS__V1__OPTIMIZER__KIND__MOMENTUM,
        [OPT_ADAGRAD] = PS__V1__OPTIMIZER__KIND__ADAGRAD,
        [OPT_ADAM] = PS__V1__OPTIMIZER__KIND__ADAM,
        [OPT_FTRL] = PS__V1__OPTIMIZER__KIND__FTRL,
    };
    opt->kind = kinds[c->optimizer];
    opt->nesterov = c->optimizer == OPT_NESTEROV;
    opt->learning_rate = (float)c->lr;
    opt->momentum = (float)c->momentum;
    opt->beta1 = (float)c->beta1;
    opt->beta2 = (float)c->beta2;
    opt->epsilon = (float)c->epsilon;
    opt->initial_accumulator = (float)c->initial_accumulator;
    opt->learning_rate_power = (float)c->lr_power;
    opt->l1 = (float)c->l1;
    opt->l2 = (float)c->l2;
    opt->l2_shrinkage = (float)c->l2_shrinkage;
    opt->beta = (float)c->beta;
}

int cmd_create(const struct command *self, int argc, char **argv)
{
    struct create_cfg cfg;
    char *name;
    int rc = parse_name(self, create_opts, &cfg, sizeof cfg, argc, argv, &name);
    if (rc >= 0)
        goto out;

    char err[512];
    int64_t dims[PS_TENSOR_MAX_DIMS];
    size_t ndims = 0;
    Ps__V1__Initializer init = PS__V1__INITIALIZER__INIT;
    const struct init_kind *ik = NULL;
    if (cfg.shape == NULL) {
        snprintf(err, sizeof err, "--shape is required, e.g. --shape 784,256");
    } else if (parse_shape(cfg.shape, dims, &ndims, err, sizeof err) == 0 &&
               (ik = parse_init(cfg.init, &init, err, sizeof err)) != NULL) {
        if (cfg.seed != 0 && !ik->random)
            snprintf(err, sizeof err, "--init-seed applies to a random --init "
                     "only, not %s", ik->name);
        else if (check_applies(&cfg, err, sizeof err) == 0)
            err[0] = '\0';
    }
    if (cfg.shape == NULL || ik == NULL || err[0] != '\0') {
        fprintf(stderr, "psctl: create: %s\n", err);
        rc = EXIT_USAGE;
        goto out;
    }
    init.seed = cfg.seed;

    Ps__V1__Optimizer opt = PS__V1__OPTIMIZER__INIT;
    fill_optimizer(&cfg, &opt);

    Ps__V1__VariableSpec spec = PS__V1__VARIABLE_SPEC__INIT;
    spec.name = name;
    spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    spec.n_shape = ndims;
    spec.shape = dims;
    spec.initializer = &init;
    spec.optimizer = &opt;
    spec.consistency = (Ps__V1__Consistency)cfg.consistency;
    spec.num_workers = (uint32_t)cfg.workers;
    spec.staleness = (uint32_t)cfg.staleness;
    Ps__V1__CreateVariableRequest req = PS__V1__CREATE_VARIABLE_REQUEST__INIT;
    req.spec = &spec;

    struct session s;
    if ((rc = session_start(&s, self, &cfg.conn)) >= 0)
        goto out;
    void *resp;
    rc = session_call(&s, PS_METHOD("CreateVariable"), &req,
                      &ps__v1__create_variable_response__descriptor, &resp);
    if (rc == 0) {
        Ps__V1__CreateVariableResponse *r = resp;
        if (r->created)
            printf("created %s\n", name);
        else
            printf("%s exists (identical spec), version %" PRIu64 "\n", name,
                   r->version);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    session_close(&s);
out:
    ps_conf_free(create_opts, &cfg);
    return rc;
}

/* ---- delete ----------------------------------------------------------- */

static void print_deleted(const char *name, const Ps__V1__DeleteVariableResponse *r)
{
    char human[32];
    printf("deleted %s (version %" PRIu64 ", %s freed)\n", name, r->version,
           human_bytes(r->bytes, human, sizeof human));
}

/* delete: removes one variable from the server, its store included, for
 * good (an operator's command: checkpoints taken before still hold it). */
int cmd_delete(const struct command *self, int argc, char **argv)
{
    struct conn_only_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    struct session s;
    char *name;
    int rc = server_command(self, conn_opts, &cfg, &cfg.conn, argc, argv,
                            "NAME", 1, 1, &name, &s);
    if (rc >= 0)
        goto out;
    Ps__V1__DeleteVariableRequest req = PS__V1__DELETE_VARIABLE_REQUEST__INIT;
    req.name = name;
    void *resp;
    rc = session_call(&s, PS_METHOD("DeleteVariable"), &req,
                      &ps__v1__delete_variable_response__descriptor, &resp);
    if (rc == 0) {
        print_deleted(name, resp);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    session_close(&s);
out:
    ps_conf_free(conn_opts, &cfg);
    return rc;
}
