/*
 * psctl - the operator's command line.
 *
 *   psctl [OPTIONS] COMMAND [ARGS]
 *
 * Each command is one row of the table below: its words ("cluster
 * validate"), a synopsis of its arguments, a help line, and the function
 * that runs it. A command function gets argv starting at its last word, so
 * it can parse its own options with ps_conf_load and a table of its own, and
 * returns the process exit status.
 *
 * The commands that talk to a psd (list, show, pull, create, checkpoint,
 * restore, stats, health) take --server HOST:PORT and --timeout either
 * before the command (psctl's own options) or among the command's options;
 * the command's own wins. --server defaults to $PSD_ADDR, else
 * 127.0.0.1:7070. Before its real call, a command asks grpc.health.v1 with a
 * deadline of at most PROBE_MS, so that an address where nothing answers is
 * reported in seconds as "cannot reach psd at ..." and not after --timeout.
 * No call is retried: an operator sees the first answer and decides.
 *
 * status asks the job's coordinator (pscoord) instead: --coordinator
 * HOST:PORT, default $PSCOORD_ADDR, else 127.0.0.1:7071.
 *
 * Exit status: 0 success; 1 the command ran and failed (one line
 * "psctl: <problem>" on stderr; for a failed call "psctl: <command>:
 * <STATUS>: <server's message>"); 2 the command line was wrong (one line on
 * stderr, or the usage on --help).
 */
#include "cluster.h"
#include "conf.h"
#include "errors.h"
#include "log.h"
#include "ps.pb-c.h"
#include "ps_config.h"
#include "rpc.h"
#include "tensor.h"
#include "tensor_pb.h"

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
#include <time.h>

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

/* Where psctl looks for psd when neither --server nor $PSD_ADDR says. */
#define DEFAULT_SERVER "127.0.0.1:7070"
/* Where status looks for pscoord when neither --coordinator nor
 * $PSCOORD_ADDR says. */
#define DEFAULT_COORDINATOR "127.0.0.1:7071"
/* The first contact's deadline (or --timeout, if shorter): long enough for
 * a loaded server, or one under valgrind, to answer a health check; short
 * enough that a mistyped address is reported while the operator waits. */
#define PROBE_MS 3000

#define PS_METHOD(m) "/ps.v1.ParameterServer/" m
#define COORD_METHOD(m) "/ps.v1.Coordinator/" m

struct command {
    const char *words; /* the command, space-separated: "cluster validate" */
    const char *args;  /* what follows it, for the usage line */
    const char *help;
    int (*run)(const struct command *self, int argc, char **argv);
};

static int cmd_list(const struct command *self, int argc, char **argv);
static int cmd_show(const struct command *self, int argc, char **argv);
static int cmd_pull(const struct command *self, int argc, char **argv);
static int cmd_create(const struct command *self, int argc, char **argv);
static int cmd_checkpoint(const struct command *self, int argc, char **argv);
static int cmd_restore(const struct command *self, int argc, char **argv);
static int cmd_stats(const struct command *self, int argc, char **argv);
static int cmd_health(const struct command *self, int argc, char **argv);
static int cmd_cluster_validate(const struct command *self, int argc,
                                char **argv);
static int cmd_status(const struct command *self, int argc, char **argv);

static const struct command commands[] = {
    {"list", "",
     "one line per variable: name, shape, dtype, optimizer, consistency, "
     "version, bytes (value + slots)",
     cmd_list},
    {"show", "NAME",
     "a variable's spec, sizes and the L2 norm, min, max and mean of its "
     "value (pulls it)",
     cmd_show},
    {"pull", "NAME -o FILE.npy",
     "write a variable's value to a NumPy .npy file with its shape",
     cmd_pull},
    {"create", "NAME --shape DIMS",
     "create a variable (idempotent for an identical spec)", cmd_create},
    {"checkpoint", "",
     "checkpoint every variable on the server; prints path, step and bytes",
     cmd_checkpoint},
    {"restore", "",
     "replace every variable with a checkpoint's (default: the latest)",
     cmd_restore},
    {"stats", "", "the server's counters and memory use", cmd_stats},
    {"health", "",
     "SERVING or NOT_SERVING via grpc.health.v1; exit 0 only when SERVING",
     cmd_health},
    {"cluster validate", "[FILE]",
     "check a TF_CONFIG-shaped cluster spec (FILE, else $TF_CONFIG) and "
     "summarise it",
     cmd_cluster_validate},
    {"status", "",
     "the job as its coordinator sees it: job, epoch, global step, live "
     "workers, last checkpoint and evaluation, then one row per task "
     "(--watch: a new block at each change)",
     cmd_status},
    {NULL, NULL, NULL, NULL},
};

/* Options that come before the command. */
struct global_cfg {
    int log_level;      /* an enum ps_log_level */
    char *server;       /* NULL until main resolves $PSD_ADDR or the default */
    int64_t timeout_ms; /* each call's deadline */
};

/* Set once by main before a command runs; commands only read it. */
static struct global_cfg global;

static const char *const log_levels[] = {"error", "warn", "info", "debug",
                                         NULL};

static const ps_opt global_opts[] = {
    {"log-level", PS_OPT_ENUM, offsetof(struct global_cfg, log_level), "warn",
     "least severe log lines shown on stderr", 0, 0, log_levels},
    {"server", PS_OPT_STRING, offsetof(struct global_cfg, server), NULL,
     "psd to talk to, HOST:PORT (default: $PSD_ADDR, else " DEFAULT_SERVER
     ")", 0, 0, NULL},
    /* 10 s: a Pull of a 1 GiB variable fits; a hung server does not keep a
     * script waiting for minutes. */
    {"timeout", PS_OPT_DURATION_MS, offsetof(struct global_cfg, timeout_ms),
     "10s", "deadline of each call to psd", 1, 3600000, NULL},
    {0},
};

/* The connection options every server command also takes after its name;
 * zero values mean "as psctl's own --server and --timeout say". */
struct conn_cfg {
    char *server;
    int64_t timeout_ms;
};

#define CONN_OPTS(type)                                                     \
    {"server", PS_OPT_STRING, offsetof(type, conn.server), NULL,            \
     "psd to talk to, HOST:PORT (default: $PSD_ADDR, else " DEFAULT_SERVER  \
     ")", 0, 0, NULL},                                                      \
    {"timeout", PS_OPT_DURATION_MS, offsetof(type, conn.timeout_ms), NULL,  \
     "deadline of each call to psd (default: 10s)", 1, 3600000, NULL}

/* A command with no options of its own: it still gets --help. */
static const ps_opt no_opts[] = {{0}};

/* list, show, stats: the connection options only. */
struct conn_only_cfg {
    struct conn_cfg conn;
};

static const ps_opt conn_opts[] = {
    CONN_OPTS(struct conn_only_cfg),
    {0},
};

static void usage(FILE *out)
{
    ps_conf_usage(global_opts, "psctl", "[OPTIONS] COMMAND [ARGS]", out);
    fprintf(out, "\nCommands:\n");
    for (const struct command *c = commands; c->words != NULL; c++) {
        char left[128];
        snprintf(left, sizeof left, "%s %s", c->words, c->args);
        if (strlen(left) <= 28)
            fprintf(out, "  %-28s %s\n", left, c->help);
        else
            fprintf(out, "  %s\n  %-28s %s\n", left, "", c->help);
    }
    fprintf(out, "\nRun 'psctl COMMAND --help' for a command's options.\n");
}

/* Counts how many of argv[0..argc) spell out c->words, word by word;
 * returns that count when all of them match, else 0. */
static int match_command(const struct command *c, int argc, char **argv)
{
    const char *w = c->words;
    int n = 0;
    while (*w != '\0') {
        size_t len = strcspn(w, " ");
        if (n >= argc || strlen(argv[n]) != len ||
            strncmp(argv[n], w, len) != 0)
            return 0;
        n++;
        w += len;
        while (*w == ' ')
            w++;
    }
    return n;
}

/* Parses a command's own options. Returns -1 to go on, or the exit status
 * (after printing the command's help or its one-line error). */
static int command_options(const struct command *cmd, const ps_opt *opts,
                           void *cfg, int argc, char **argv, int *first)
{
    char err[512];
    int rc = ps_conf_load(opts, cfg, argc, argv, first, err, sizeof err);
    if (rc == PS_CONF_HELP) {
        char synopsis[256];
        snprintf(synopsis, sizeof synopsis, "%s [OPTIONS] %s", cmd->words,
                 cmd->args);
        ps_conf_usage(opts, "psctl", synopsis, stdout);
        printf("\n%s\n", cmd->help);
        return EXIT_OK;
    }
    if (rc == PS_CONF_VERSION) {
        printf("psctl %s\n", PS_VERSION);
        return EXIT_OK;
    }
    if (rc != 0) {
        fprintf(stderr, "psctl: %s: %s\n", cmd->words, err);
        return EXIT_USAGE;
    }
    return -1;
}

/* How many argv slots the option at argv[i] takes (1 or 2), by the same
 * syntax as ps_conf_load: "--name=value", booleans and unknown options
 * stand alone; any other "--name" takes the next word unless that is an
 * option too. */
static int option_width(const ps_opt *opts, int argc, char **argv, int i)
{
    const char *arg = argv[i];
    if (arg[1] != '-' || strchr(arg, '=') != NULL)
        return 1;
    const char *name = arg + 2;
    const ps_opt *found = NULL;
    for (const ps_opt *o = opts; o->name != NULL; o++)
        if (strcmp(o->name, name) == 0)
            found = o;
    bool takes_value = strcmp(name, "config") == 0 ||
                       (found != NULL && found->type != PS_OPT_BOOL);
    if (takes_value && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
        return 2;
    return 1;
}

static bool has_option(const ps_opt *opts, const char *name)
{
    for (const ps_opt *o = opts; o->name != NULL; o++)
        if (strcmp(o->name, name) == 0)
            return true;
    return false;
}

/* Parses a command's options wherever they stand among its positional
 * arguments (ps_conf_load stops at the first positional, but an operator
 * writes "psctl create w1 --shape 3,4"), then checks that there are
 * between min_pos and max_pos positionals. "-o" is read as "--output" when
 * the command has that option. On success returns -1 with pos[0..] set
 * (pointers into argv) and *npos; otherwise the exit status, after the help
 * or one line on stderr. `what` names the positionals for "missing ...". */
static int parse_command(const struct command *cmd, const ps_opt *opts,
                         void *cfg, int argc, char **argv, const char *what,
                         int min_pos, int max_pos, char **pos, int *npos)
{
    /* Options first, then "--", then the positionals. */
    char **v = calloc((size_t)argc + 2, sizeof *v);
    if (v == NULL) {
        fprintf(stderr, "psctl: %s: out of memory\n", cmd->words);
        return EXIT_FAIL;
    }
    char **positional = calloc((size_t)argc + 1, sizeof *positional);
    if (positional == NULL) {
        free(v);
        fprintf(stderr, "psctl: %s: out of memory\n", cmd->words);
        return EXIT_FAIL;
    }
    static char output_flag[] = "--output";
    static char end_flag[] = "--";
    int nv = 0, np = 0;
    v[nv++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            while (++i < argc)
                positional[np++] = argv[i];
            break;
        }
        if (argv[i][0] != '-' || argv[i][1] == '\0') {
            positional[np++] = argv[i];
            continue;
        }
        if (strcmp(argv[i], "-o") == 0 && has_option(opts, "output")) {
            v[nv++] = output_flag;
            if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
                v[nv++] = argv[++i];
            continue;
        }
        int w = option_width(opts, argc, argv, i);
        for (int k = 0; k < w; k++)
            v[nv++] = argv[i + k];
        i += w - 1;
    }
    v[nv++] = end_flag;
    int first;
    int rc = command_options(cmd, opts, cfg, nv, v, &first);
    free(v);
    if (rc < 0 && np < min_pos) {
        fprintf(stderr, "psctl: %s: missing %s; see 'psctl %s --help'\n",
                cmd->words, what, cmd->words);
        rc = EXIT_USAGE;
    } else if (rc < 0 && np > max_pos) {
        fprintf(stderr, "psctl: %s: unexpected argument '%s'\n", cmd->words,
                positional[max_pos]);
        rc = EXIT_USAGE;
    }
    if (rc < 0) {
        for (int k = 0; k < np; k++)
            pos[k] = positional[k];
        *npos = np;
    }
    free(positional);
    return rc;
}

/* ---- Talking to psd --------------------------------------------------- */

/* One command's connection to one psd (or, for status, to pscoord). */
struct session {
    const struct command *cmd;
    const char *peer;   /* "psd" or "pscoord", for messages */
    const char *target; /* borrowed from the options */
    int timeout_ms;
    ps_rpc_client *client;
};

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

/* Picks the address and deadline (the command's options, else psctl's) and
 * makes the client; nothing is sent yet. Returns -1 to go on, or the exit
 * status after one line on stderr. */
static int session_open(struct session *s, const struct command *cmd,
                        const struct conn_cfg *cc)
{
    memset(s, 0, sizeof *s);
    s->cmd = cmd;
    s->peer = "psd";
    s->target = cc->server != NULL ? cc->server : global.server;
    s->timeout_ms = (int)(cc->timeout_ms > 0 ? cc->timeout_ms
                                             : global.timeout_ms);
    if (!target_ok(s->target)) {
        fprintf(stderr, "psctl: %s: --server: '%s' is not HOST:PORT (or "
                "[v6addr]:PORT) with a port in 1..65535\n", cmd->words,
                s->target);
        return EXIT_USAGE;
    }
    ps_rpc_client_opts o = {.deadline_ms = s->timeout_ms, .max_attempts = 1};
    int rc = ps_rpc_client_create(s->target, &o, &s->client);
    if (rc != 0) {
        fprintf(stderr, "psctl: cannot reach %s at %s: %s\n", s->peer,
                s->target, ps_strerror(rc));
        return EXIT_FAIL;
    }
    return -1;
}

static void session_close(struct session *s)
{
    ps_rpc_client_destroy(s->client);
    s->client = NULL;
}

static int probe_ms(const struct session *s)
{
    return s->timeout_ms < PROBE_MS ? s->timeout_ms : PROBE_MS;
}

/* True when a failed first contact means nothing answered at the address. */
static bool unreachable(const ps_rpc_status *st)
{
    return st->code == PS_RPC_UNAVAILABLE ||
           st->code == PS_RPC_DEADLINE_EXCEEDED;
}

static void report_unreachable(const struct session *s, ps_rpc_status *st)
{
    if (st->code == PS_RPC_DEADLINE_EXCEEDED)
        snprintf(st->message, sizeof st->message, "no answer within %d ms",
                 probe_ms(s));
    one_line(st->message);
    fprintf(stderr, "psctl: cannot reach %s at %s: %s: %s\n", s->peer,
            s->target, ps_rpc_code_name(st->code),
            st->message[0] != '\0' ? st->message : "(no message)");
}

static void report_status(const struct session *s, ps_rpc_status *st)
{
    one_line(st->message);
    fprintf(stderr, "psctl: %s: %s: %s\n", s->cmd->words,
            ps_rpc_code_name(st->code),
            st->message[0] != '\0' ? st->message : "(no message)");
}

/* The first contact: a health check with a short deadline. Returns -1 when
 * something answered (even a server without the health service, or one
 * that is NOT_SERVING: its real answer will say why), else EXIT_FAIL after
 * "cannot reach". */
static int session_probe(struct session *s)
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
static int session_call(struct session *s, const char *method,
                        const void *req, const ProtobufCMessageDescriptor *desc,
                        void **resp)
{
    ps_rpc_status st;
    if (ps_rpc_invoke_pb(s->client, method, req, desc, resp, s->timeout_ms,
                         &st) == 0)
        return 0;
    report_status(s, &st);
    return EXIT_FAIL;
}

/* Parses options and positionals, opens the session and probes the server:
 * the start every server command shares. Returns -1 to go on (the session
 * is then open), or the exit status. */
static int server_command(const struct command *cmd, const ps_opt *opts,
                          void *cfg, const struct conn_cfg *conn, int argc,
                          char **argv, const char *what, int min_pos,
                          int max_pos, char **pos, struct session *s)
{
    int npos = 0;
    int rc = parse_command(cmd, opts, cfg, argc, argv, what, min_pos, max_pos,
                           pos, &npos);
    if (rc >= 0)
        return rc;
    rc = session_open(s, cmd, conn);
    if (rc < 0)
        rc = session_probe(s);
    if (rc >= 0)
        session_close(s);
    return rc;
}

/* ---- Formatting ------------------------------------------------------- */

/* "512 B", "784.0 KiB", "2.3 MiB": bytes as an operator reads them. */
static const char *human_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    if (n < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", n);
        return buf;
    }
    double v = (double)n / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

/* "42.1 s", "3m 07s", "5h 03m 07s", "2d 05h 03m". */
static const char *human_duration(double seconds, char *buf, size_t len)
{
    if (seconds < 60.0) {
        snprintf(buf, len, "%.1f s", seconds);
        return buf;
    }
    uint64_t s = (uint64_t)seconds;
    uint64_t d = s / 86400, h = s / 3600 % 24, m = s / 60 % 60;
    if (d > 0)
        snprintf(buf, len, "%" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m", d,
                 h, m);
    else if (h > 0)
        snprintf(buf, len, "%" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s", h,
                 m, s % 60);
    else
        snprintf(buf, len, "%" PRIu64 "m %02" PRIu64 "s", m, s % 60);
    return buf;
}

static const char *shape_text(const int64_t *shape, size_t n, char *buf,
                              size_t len)
{
    if (n > PS_TENSOR_MAX_DIMS) {
        snprintf(buf, len, "(%zu dimensions)", n);
        return buf;
    }
    return ps_tensor_shape_str(shape, (int)n, buf, len);
}

/* The names psctl create takes. */
static const char *optimizer_label(const Ps__V1__Optimizer *o)
{
    if (o == NULL)
        return "sgd";
    switch (o->kind) {
    case PS__V1__OPTIMIZER__KIND__SGD:
        return "sgd";
    case PS__V1__OPTIMIZER__KIND__MOMENTUM:
        return o->nesterov ? "nesterov" : "momentum";
    case PS__V1__OPTIMIZER__KIND__ADAGRAD:
        return "adagrad";
    case PS__V1__OPTIMIZER__KIND__ADAM:
        return "adam";
    default:
        return "unknown";
    }
}

static const char *consistency_label(const Ps__V1__VariableSpec *sp,
                                     char *buf, size_t len)
{
    switch (sp->consistency) {
    case PS__V1__CONSISTENCY__CONSISTENCY_DEFAULT:
        snprintf(buf, len, "default");
        break;
    case PS__V1__CONSISTENCY__ASYNC:
        snprintf(buf, len, "async");
        break;
    case PS__V1__CONSISTENCY__SYNC:
        snprintf(buf, len, "sync(%u)", sp->num_workers);
        break;
    case PS__V1__CONSISTENCY__BOUNDED_STALENESS:
        snprintf(buf, len, "bounded(%u)", sp->staleness);
        break;
    default:
        snprintf(buf, len, "unknown(%d)", (int)sp->consistency);
        break;
    }
    return buf;
}

/* ---- list ------------------------------------------------------------- */

enum { COL_NAME, COL_SHAPE, COL_DTYPE, COL_OPT, COL_CONS, COL_VERSION,
       COL_BYTES, NCOLS };

struct list_row {
    const char *cell[NCOLS];
    char shape[192];
    char cons[32];
    char version[24];
    char bytes[24];
};

static void print_row(const char *const *cell, const int *width)
{
    for (int c = 0; c < NCOLS; c++) {
        bool right = c == COL_VERSION || c == COL_BYTES;
        printf(right ? "%*s%s" : "%-*s%s", c == NCOLS - 1 && !right ? 0
                                                                    : width[c],
               cell[c], c == NCOLS - 1 ? "\n" : "  ");
    }
}

static int print_list(const Ps__V1__ListVariablesResponse *r)
{
    static const char *const header[NCOLS] = {
        "NAME", "SHAPE", "DTYPE", "OPTIMIZER", "CONSISTENCY", "VERSION",
        "BYTES"};
    struct list_row *rows = calloc(r->n_variables ? r->n_variables : 1,
                                   sizeof *rows);
    if (rows == NULL) {
        fprintf(stderr, "psctl: list: out of memory\n");
        return EXIT_FAIL;
    }
    int width[NCOLS];
    for (int c = 0; c < NCOLS; c++)
        width[c] = (int)strlen(header[c]);
    for (size_t i = 0; i < r->n_variables; i++) {
        const Ps__V1__VariableInfo *v = r->variables[i];
        const Ps__V1__VariableSpec *sp = v->spec;
        struct list_row *row = &rows[i];
        if (sp == NULL) {
            static const Ps__V1__VariableSpec empty =
                PS__V1__VARIABLE_SPEC__INIT;
            sp = &empty;
        }
        row->cell[COL_NAME] = sp->name;
        row->cell[COL_SHAPE] = shape_text(sp->shape, sp->n_shape, row->shape,
                                          sizeof row->shape);
        row->cell[COL_DTYPE] = ps_dtype_name((enum ps_dtype)sp->dtype);
        row->cell[COL_OPT] = optimizer_label(sp->optimizer);
        row->cell[COL_CONS] = consistency_label(sp, row->cons,
                                                sizeof row->cons);
        snprintf(row->version, sizeof row->version, "%" PRIu64, v->version);
        row->cell[COL_VERSION] = row->version;
        row->cell[COL_BYTES] = human_bytes(v->value_bytes + v->slot_bytes,
                                           row->bytes, sizeof row->bytes);
        for (int c = 0; c < NCOLS; c++) {
            int w = (int)strlen(row->cell[c]);
            if (w > width[c])
                width[c] = w;
        }
    }
    print_row(header, width);
    for (size_t i = 0; i < r->n_variables; i++)
        print_row(rows[i].cell, width);
    free(rows);
    return EXIT_OK;
}

/* The commands that take no argument but the connection: make one call
 * with an empty request and print the answer with `print`. */
static int call_and_print(const struct command *self, int argc, char **argv,
                          const char *method, const void *req,
                          const ProtobufCMessageDescriptor *resp_desc,
                          int (*print)(const void *resp))
{
    struct conn_only_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    struct session s;
    int rc = server_command(self, conn_opts, &cfg, &cfg.conn, argc, argv, "",
                            0, 0, NULL, &s);
    if (rc >= 0)
        goto out;
    void *resp;
    rc = session_call(&s, method, req, resp_desc, &resp);
    if (rc == 0) {
        rc = print(resp);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    session_close(&s);
out:
    ps_conf_free(conn_opts, &cfg);
    return rc;
}

static int print_list_resp(const void *resp)
{
    return print_list(resp);
}

static int cmd_list(const struct command *self, int argc, char **argv)
{
    Ps__V1__ListVariablesRequest req = PS__V1__LIST_VARIABLES_REQUEST__INIT;
    return call_and_print(self, argc, argv, PS_METHOD("ListVariables"), &req,
                          &ps__v1__list_variables_response__descriptor,
                          print_list_resp);
}

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

static int cmd_show(const struct command *self, int argc, char **argv)
{
    struct conn_only_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    struct session s;
    char *name;
    int rc = server_command(self, conn_opts, &cfg, &cfg.conn, argc, argv,
                            "NAME", 1, 1, &name, &s);
    if (rc >= 0)
        goto out;
    /* Pull first: for an unknown name its NOT_FOUND is the answer. */
    Ps__V1__PullResponse *pulled = NULL;
    ps_tensor val;
    uint64_t version;
    rc = pull_one(&s, name, &pulled, &val, &version);
    if (rc != 0)
        goto close;
    Ps__V1__ListVariablesRequest req = PS__V1__LIST_VARIABLES_REQUEST__INIT;
    void *resp;
    rc = session_call(&s, PS_METHOD("ListVariables"), &req,
                      &ps__v1__list_variables_response__descriptor, &resp);
    if (rc != 0)
        goto free_pulled;
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
        print_variable(info, &val, version);
        rc = EXIT_OK;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
free_pulled:
    protobuf_c_message_free_unpacked(&pulled->base, NULL);
close:
    session_close(&s);
out:
    ps_conf_free(conn_opts, &cfg);
    return rc;
}

struct pull_cfg {
    struct conn_cfg conn;
    char *output;
};

static const ps_opt pull_opts[] = {
    {"output", PS_OPT_STRING, offsetof(struct pull_cfg, output), NULL,
     "the .npy file to write (required; also -o FILE); replaced atomically",
     0, 0, NULL},
    CONN_OPTS(struct pull_cfg),
    {0},
};

static int cmd_pull(const struct command *self, int argc, char **argv)
{
    struct pull_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    struct session s;
    char *name;
    int npos;
    int rc = parse_command(self, pull_opts, &cfg, argc, argv, "NAME", 1, 1,
                           &name, &npos);
    if (rc >= 0)
        goto out;
    if (cfg.output == NULL || cfg.output[0] == '\0') {
        fprintf(stderr, "psctl: pull: -o FILE is required (where to write "
                "the .npy)\n");
        rc = EXIT_USAGE;
        goto out;
    }
    if ((rc = session_open(&s, self, &cfg.conn)) >= 0)
        goto out;
    if ((rc = session_probe(&s)) >= 0)
        goto close;
    Ps__V1__PullResponse *pulled;
    ps_tensor val;
    uint64_t version;
    rc = pull_one(&s, name, &pulled, &val, &version);
    if (rc != 0)
        goto close;
    int wrc = ps_npy_write(cfg.output, val.shape, val.ndim, val.data);
    if (wrc != 0) {
        fprintf(stderr, "psctl: pull: cannot write %s: %s\n", cfg.output,
                ps_strerror(wrc));
        rc = EXIT_FAIL;
    } else {
        char shape[192];
        printf("wrote %s (shape %s, version %" PRIu64 ")\n", cfg.output,
               ps_tensor_shape_str(val.shape, val.ndim, shape, sizeof shape),
               version);
        rc = EXIT_OK;
    }
    protobuf_c_message_free_unpacked(&pulled->base, NULL);
close:
    session_close(&s);
out:
    ps_conf_free(pull_opts, &cfg);
    return rc;
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
    int consistency; /* index into consistency_choices = the proto's value */
    int workers;
};

enum { OPT_SGD, OPT_MOMENTUM, OPT_NESTEROV, OPT_ADAGRAD, OPT_ADAM };
static const char *const optimizer_choices[] = {
    "sgd", "momentum", "nesterov", "adagrad", "adam", NULL};
static const char *const consistency_choices[] = {"default", "async", "sync",
                                                  NULL};

static const ps_opt create_opts[] = {
    {"shape", PS_OPT_STRING, offsetof(struct create_cfg, shape), NULL,
     "dimensions, outermost first, e.g. 784,256 (required; \"\" for a "
     "scalar)", 0, 0, NULL},
    {"init", PS_OPT_STRING, offsetof(struct create_cfg, init), "zeros",
     "initial value: zeros, constant:V, uniform:MIN,MAX, normal:MEAN,STD, "
     "truncated_normal:MEAN,STD or glorot_uniform", 0, 0, NULL},
    {"seed", PS_OPT_UINT64, offsetof(struct create_cfg, seed), "0",
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
     "adagrad: >= 0 (default 0.1)", 0, 0, NULL},
    {"consistency", PS_OPT_ENUM, offsetof(struct create_cfg, consistency),
     "default", "async (each push applied on arrival) or sync (pushes "
     "averaged per step); 'default' leaves it to the server's --consistency",
     0, 0,
     consistency_choices},
    {"workers", PS_OPT_INT, offsetof(struct create_cfg, workers), NULL,
     "sync: pushes averaged per step (default: the server's --workers)",
     1, 65536, NULL},
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
    bool random;        /* --seed applies */
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
    else if (c->initial_accumulator != 0 && o != OPT_ADAGRAD)
        flag = "--initial-accumulator", applies = "adagrad";
    if (flag != NULL) {
        snprintf(err, errlen, "%s applies to --optimizer %s only, not %s",
                 flag, applies, optimizer_choices[o]);
        return -1;
    }
    if (c->workers != 0 && c->consistency == PS__V1__CONSISTENCY__ASYNC) {
        snprintf(err, errlen, "--workers applies to --consistency sync only");
        return -1;
    }
    return 0;
}

static int cmd_create(const struct command *self, int argc, char **argv)
{
    struct create_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    struct session s;
    char *name;
    int npos;
    int rc = parse_command(self, create_opts, &cfg, argc, argv, "NAME", 1, 1,
                           &name, &npos);
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
            snprintf(err, sizeof err, "--seed applies to a random --init "
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
    static const Ps__V1__Optimizer__Kind kinds[] = {
        [OPT_SGD] = PS__V1__OPTIMIZER__KIND__SGD,
        [OPT_MOMENTUM] = PS__V1__OPTIMIZER__KIND__MOMENTUM,
        [OPT_NESTEROV] = PS__V1__OPTIMIZER__KIND__MOMENTUM,
        [OPT_ADAGRAD] = PS__V1__OPTIMIZER__KIND__ADAGRAD,
        [OPT_ADAM] = PS__V1__OPTIMIZER__KIND__ADAM,
    };
    opt.kind = kinds[cfg.optimizer];
    opt.nesterov = cfg.optimizer == OPT_NESTEROV;
    /* Out-of-range values go through: the server's refusal names them. */
    opt.learning_rate = (float)cfg.lr;
    opt.momentum = (float)cfg.momentum;
    opt.beta1 = (float)cfg.beta1;
    opt.beta2 = (float)cfg.beta2;
    opt.epsilon = (float)cfg.epsilon;
    opt.initial_accumulator = (float)cfg.initial_accumulator;

    Ps__V1__VariableSpec spec = PS__V1__VARIABLE_SPEC__INIT;
    spec.name = name;
    spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    spec.n_shape = ndims;
    spec.shape = dims;
    spec.initializer = &init;
    spec.optimizer = &opt;
    spec.consistency = (Ps__V1__Consistency)cfg.consistency;
    spec.num_workers = (uint32_t)cfg.workers;
    Ps__V1__CreateVariableRequest req = PS__V1__CREATE_VARIABLE_REQUEST__INIT;
    req.spec = &spec;

    if ((rc = session_open(&s, self, &cfg.conn)) >= 0)
        goto out;
    if ((rc = session_probe(&s)) >= 0)
        goto close;
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
close:
    session_close(&s);
out:
    ps_conf_free(create_opts, &cfg);
    return rc;
}

/* ---- checkpoint, restore ---------------------------------------------- */

struct step_cfg {
    struct conn_cfg conn;
    uint64_t step; /* 0: the server chooses */
};

static const ps_opt checkpoint_opts[] = {
    {"step", PS_OPT_UINT64, offsetof(struct step_cfg, step), NULL,
     "global step the checkpoint is named by (default: the highest variable "
     "version on the server)", 0, 0, NULL},
    CONN_OPTS(struct step_cfg),
    {0},
};

static const ps_opt restore_opts[] = {
    {"step", PS_OPT_UINT64, offsetof(struct step_cfg, step), NULL,
     "checkpoint to load (default: the latest complete one)", 0, 0, NULL},
    CONN_OPTS(struct step_cfg),
    {0},
};

static int cmd_checkpoint(const struct command *self, int argc, char **argv)
{
    struct step_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    struct session s;
    int rc = server_command(self, checkpoint_opts, &cfg, &cfg.conn, argc,
                            argv, "", 0, 0, NULL, &s);
    if (rc >= 0)
        goto out;
    Ps__V1__CheckpointRequest req = PS__V1__CHECKPOINT_REQUEST__INIT;
    req.step = cfg.step;
    void *resp;
    rc = session_call(&s, PS_METHOD("Checkpoint"), &req,
                      &ps__v1__checkpoint_response__descriptor, &resp);
    if (rc == 0) {
        Ps__V1__CheckpointResponse *r = resp;
        char human[32];
        printf("checkpoint step %" PRIu64 ": %s (%s, %" PRIu64 " bytes)\n",
               r->step, r->path, human_bytes(r->bytes, human, sizeof human),
               r->bytes);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    session_close(&s);
out:
    ps_conf_free(checkpoint_opts, &cfg);
    return rc;
}

static int cmd_restore(const struct command *self, int argc, char **argv)
{
    struct step_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    struct session s;
    int rc = server_command(self, restore_opts, &cfg, &cfg.conn, argc, argv,
                            "", 0, 0, NULL, &s);
    if (rc >= 0)
        goto out;
    Ps__V1__RestoreRequest req = PS__V1__RESTORE_REQUEST__INIT;
    req.step = cfg.step;
    void *resp;
    rc = session_call(&s, PS_METHOD("Restore"), &req,
                      &ps__v1__restore_response__descriptor, &resp);
    if (rc == 0) {
        Ps__V1__RestoreResponse *r = resp;
        printf("restored step %" PRIu64 ": %" PRIu64 " variable%s\n", r->step,
               r->variables, r->variables == 1 ? "" : "s");
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    session_close(&s);
out:
    ps_conf_free(restore_opts, &cfg);
    return rc;
}

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
    ROW("bad requests", "%" PRIu64, r->bad_requests);
    ROW("commits", "%" PRIu64, r->commits);
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
    /* The proto's 0 means "none", but a checkpoint may be at step 0. */
    if (r->last_checkpoint_step > 0)
        ROW("last checkpoint step", "%" PRIu64, r->last_checkpoint_step);
    else
        ROW("last checkpoint step", "%s", "0 (none, or at step 0)");
#undef ROW
}

static int print_stats_resp(const void *resp)
{
    print_stats(resp);
    return EXIT_OK;
}

static int cmd_stats(const struct command *self, int argc, char **argv)
{
    Ps__V1__StatsRequest req = PS__V1__STATS_REQUEST__INIT;
    return call_and_print(self, argc, argv, PS_METHOD("Stats"), &req,
                          &ps__v1__stats_response__descriptor, print_stats_resp);
}

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

static int cmd_health(const struct command *self, int argc, char **argv)
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

static int cmd_cluster_validate(const struct command *self, int argc,
                                char **argv)
{
    int first;
    int rc = command_options(self, no_opts, NULL, argc, argv, &first);
    if (rc >= 0)
        return rc;
    if (argc - first > 1) {
        fprintf(stderr, "psctl: cluster validate takes at most one FILE, "
                        "got %d arguments\n", argc - first);
        return EXIT_USAGE;
    }

    ps_cluster c;
    char err[1024];
    const char *source;
    if (first < argc) {
        source = argv[first];
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
};

static const ps_opt status_opts[] = {
    {"coordinator", PS_OPT_STRING, offsetof(struct status_cfg, coordinator),
     NULL, "pscoord to ask, HOST:PORT (default: $PSCOORD_ADDR, else "
     DEFAULT_COORDINATOR ")", 0, 0, NULL},
    {"timeout", PS_OPT_DURATION_MS, offsetof(struct status_cfg, timeout_ms),
     NULL, "deadline of the call (default: 10s); --watch waits forever",
     1, 3600000, NULL},
    {"watch", PS_OPT_BOOL, offsetof(struct status_cfg, watch), "false",
     "print a new block each time the coordinator sends one, until "
     "interrupted", 0, 0, NULL},
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

static const char *role_label(Ps__V1__Role r)
{
    switch (r) {
    case PS__V1__ROLE__CHIEF:
        return "chief";
    case PS__V1__ROLE__WORKER:
        return "worker";
    case PS__V1__ROLE__PS:
        return "ps";
    case PS__V1__ROLE__EVALUATOR:
        return "evaluator";
    default:
        return "unknown";
    }
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
    ROW("epoch", "%" PRIu64, c->epoch);
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

static int cmd_status(const struct command *self, int argc, char **argv)
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
    const char *env = getenv("PSCOORD_ADDR");
    s.cmd = self;
    s.peer = "pscoord";
    s.target = cfg.coordinator != NULL ? cfg.coordinator
               : env != NULL && env[0] != '\0' ? env
                                               : DEFAULT_COORDINATOR;
    s.timeout_ms = (int)(cfg.timeout_ms > 0 ? cfg.timeout_ms
                                            : global.timeout_ms);
    if (!target_ok(s.target)) {
        fprintf(stderr, "psctl: status: --coordinator: '%s' is not HOST:PORT "
                "(or [v6addr]:PORT) with a port in 1..65535\n", s.target);
        rc = EXIT_USAGE;
        goto out;
    }
    ps_rpc_client_opts o = {.deadline_ms = s.timeout_ms, .max_attempts = 1};
    if ((rc = ps_rpc_client_create(s.target, &o, &s.client)) != 0) {
        fprintf(stderr, "psctl: cannot reach pscoord at %s: %s\n", s.target,
                ps_strerror(rc));
        rc = EXIT_FAIL;
        goto out;
    }
    if ((rc = session_probe(&s)) >= 0)
        goto close;
    Ps__V1__GetClusterRequest req = PS__V1__GET_CLUSTER_REQUEST__INIT;
    if (!cfg.watch) {
        void *resp;
        rc = session_call(&s, COORD_METHOD("GetCluster"), &req,
                          &ps__v1__cluster_state__descriptor, &resp);
        if (rc == 0) {
            print_cluster(resp, false);
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

int main(int argc, char **argv)
{
    char err[512];
    int first;
    int rc = ps_conf_load(global_opts, &global, argc, argv, &first, err,
                          sizeof err);
    if (rc == PS_CONF_HELP) {
        usage(stdout);
        return EXIT_OK;
    }
    if (rc == PS_CONF_VERSION) {
        printf("psctl %s\n", PS_VERSION);
        return EXIT_OK;
    }
    if (rc != 0) {
        fprintf(stderr, "psctl: %s\n", err);
        return EXIT_USAGE;
    }
    ps_log_init("psctl", (enum ps_log_level)global.log_level);
    if (global.server == NULL) {
        const char *env = getenv("PSD_ADDR");
        global.server = strdup(env != NULL && env[0] != '\0' ? env
                                                             : DEFAULT_SERVER);
        if (global.server == NULL) {
            fprintf(stderr, "psctl: out of memory\n");
            return EXIT_FAIL;
        }
    }

    rc = -1;
    if (first >= argc) {
        fprintf(stderr, "psctl: no command given; try 'psctl --help'\n");
        rc = EXIT_USAGE;
    }
    for (const struct command *c = commands; rc < 0 && c->words != NULL;
         c++) {
        int n = match_command(c, argc - first, argv + first);
        if (n > 0)
            rc = c->run(c, argc - first - n + 1, argv + first + n - 1);
    }
    ps_conf_free(global_opts, &global);
    if (rc >= 0)
        return rc;

    /* "psctl cluster": a group without its subcommand. */
    char subs[256] = "";
    size_t slen = 0;
    size_t glen = strlen(argv[first]);
    for (const struct command *c = commands; c->words != NULL; c++) {
        if (strncmp(c->words, argv[first], glen) == 0 && c->words[glen] == ' '
            && slen < sizeof subs) {
            int k = snprintf(subs + slen, sizeof subs - slen, "%s%s",
                             slen > 0 ? ", " : "", c->words + glen + 1);
            slen += k > 0 ? (size_t)k : 0;
        }
    }
    if (slen > 0 && (first + 1 >= argc || argv[first + 1][0] == '-')) {
        fprintf(stderr, "psctl: '%s' needs a command: %s\n", argv[first],
                subs);
        return EXIT_USAGE;
    }

    /* Name as many words as a command would have, for a clearer message. */
    char words[256] = "";
    size_t used = 0;
    for (int i = first; i < argc && i < first + 2 && argv[i][0] != '-'; i++) {
        int k = snprintf(words + used, sizeof words - used, "%s%s",
                         used > 0 ? " " : "", argv[i]);
        if (k < 0 || (size_t)k >= sizeof words - used)
            break;
        used += (size_t)k;
    }
    fprintf(stderr, "psctl: unknown command '%s'; try 'psctl --help'\n",
            words);
    return EXIT_USAGE;
}
