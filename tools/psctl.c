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
 * The commands that talk to a psd (list, show, pull, create, delete,
 * checkpoint, restore, stats, health) take --server HOST:PORT and --rpc-timeout
 * either before the command (psctl's own options) or among the command's
 * options; the command's own wins. --server defaults to $PSD_ADDR, else
 * 127.0.0.1:7070. Before its real call, a command asks grpc.health.v1 with a
 * deadline of at most PROBE_MS, so that an address where nothing answers is
 * reported in seconds as "cannot reach psd at ..." and not after --rpc-timeout.
 * No call is retried: an operator sees the first answer and decides.
 *
 * status and top ask the job's coordinator (pscoord) instead:
 * --coordinator HOST:PORT, default $PSCOORD_ADDR, else 127.0.0.1:7071.
 * Given --coordinator, list and stats ask pscoord for the job's ps tasks
 * and then each of them (a shard column, and totals).
 *
 * The read commands (list, stats, status, top --once, cluster validate)
 * take -o json: one JSON object on stdout whose fields doc/psctl.md lists
 * (pbjson.c: a reply's fields by their names in proto/ps.proto).
 *
 * The files of psctl are listed in psctl.h.
 *
 * Exit status: 0 success; 1 the command ran and failed (one line
 * "psctl: <problem>" on stderr; for a failed call "psctl: <command>:
 * <STATUS>: <server's message>"); 2 the command line was wrong (one line on
 * stderr, or the usage on --help), including a psd command sent to pscoord
 * or the reverse (session.c names the mismatch).
 */
#include "tools/psctl.h"

#include "common/errors.h"
#include "common/log.h"
#include "common/proc.h"
#include "ps_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct command commands[] = {
    {"list", "",
     "one line per variable: name, shape, dtype, optimizer, consistency, "
     "version, bytes (value + slots); --coordinator: of every shard",
     NULL, NULL, &list_fan},
    {"show", "NAME",
     "a variable's spec, sizes and the L2 norm, min, max and mean of its "
     "value (pulls it)",
     cmd_show},
    {"pull", "NAME -o FILE.npy",
     "write a variable's value to a NumPy .npy file with its shape",
     cmd_pull},
    {"create", "NAME --shape DIMS",
     "create a variable (idempotent for an identical spec)", cmd_create},
    {"delete", "NAME",
     "delete a variable for good, from memory and the store", cmd_delete},
    {"checkpoint", "",
     "checkpoint every variable on the server; prints path, step and bytes",
     NULL, &checkpoint_call},
    {"restore", "",
     "replace every variable with a checkpoint's (default: the latest)",
     NULL, &restore_call},
    {"stats", "", "the server's counters and memory use; --coordinator: "
     "of every shard, with totals", NULL, NULL, &stats_fan},
    {"health", "",
     "SERVING or NOT_SERVING via grpc.health.v1; exit 0 only when SERVING",
     cmd_health},
    {"cluster validate", "[FILE]",
     "check a TF_CONFIG-shaped cluster spec (FILE, else $TF_CONFIG) and "
     "summarise it",
     cmd_cluster_validate},
    {"status", "",
     "the job as its coordinator sees it: job, generation, global step, live "
     "workers, last checkpoint and evaluation, then one row per task "
     "(--watch: a new block at each change)",
     cmd_status},
    {"top", "",
     "a live view of the job from its coordinator, redrawn each --interval: "
     "per task its state, step, steps/s, lag, examples/s, loss and accuracy "
     "(--once: one frame)",
     cmd_top},
    {"token", "ROLE",
     "print 'ROLE TOKEN', a fresh random token (256 bits) for a server's "
     "--tokens file and a client's --token-file",
     cmd_token},
    {NULL, NULL, NULL, NULL, NULL},
};

/* Set once by main before a command runs; commands only read it. */
struct global_cfg psctl_global;

static const ps_opt global_opts[] = {
    {"log-level", PS_OPT_ENUM, offsetof(struct global_cfg, log_level), PS_PROC_LOG_DEFAULT,
     "least severe log lines shown on stderr", 0, 0, ps_proc_log_levels},
    {"log-format", PS_OPT_ENUM, offsetof(struct global_cfg, log_format), "text",
     PS_PROC_LOG_FORMAT_HELP, 0, 0, ps_proc_log_formats},
    {"server", PS_OPT_STRING, offsetof(struct global_cfg, server), NULL,
     "psd to talk to, HOST:PORT (default: $PSD_ADDR, else " DEFAULT_SERVER
     ")", 0, 0, NULL},
    /* 10 s: a Pull of a 1 GiB variable fits; a hung server does not keep a
     * script waiting for minutes. */
    {"rpc-timeout", PS_OPT_DURATION_MS, offsetof(struct global_cfg, timeout_ms),
     "10s", "deadline of each call to psd or pscoord", 1, 3600000, NULL, "timeout"},
    PS_TLS_CLIENT_OPTS(struct global_cfg, tls),
    {"token-file", PS_OPT_STRING, offsetof(struct global_cfg, token_file), NULL,
     "file holding the token to send (servers started with --tokens need "
     "one; 'psctl token' makes one); default: none", 0, 0, NULL},
    {0},
};

/* A command with no options of its own: it still gets --help. */
const ps_opt no_opts[] = {{0}};

const char *const output_formats[] = {"text", "json", NULL};

const ps_opt fan_opts[] = {
    CONN_OPTS(struct fan_cfg),
    {"coordinator", PS_OPT_STRING, offsetof(struct fan_cfg, coordinator), NULL,
     "ask every psd shard of the job this pscoord (HOST:PORT) coordinates, "
     "instead of one --server: a shard column and totals", 0, 0, NULL},
    OUTPUT_OPT(struct fan_cfg),
    {0},
};

const ps_opt conn_opts[] = {
    CONN_OPTS(struct conn_only_cfg),
    {0},
};

/* The exit statuses, as every --help states them. */
#define EXIT_HELP                                                           \
    "\nExit status: 0 success; 1 the command ran and a call failed (one line " \
    "on stderr);\n2 bad usage: a wrong option or argument, or a psd command " \
    "sent to pscoord\nor the reverse (one line on stderr).\n"

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
    fprintf(out, "\nRun 'psctl COMMAND --help' for a command's options.\n%s", EXIT_HELP);
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
int command_options(const struct command *cmd, const ps_opt *opts,
                           void *cfg, int argc, char **argv, int *first)
{
    char err[512];
    int rc = ps_conf_load(opts, cfg, argc, argv, first, err, sizeof err);
    if (rc == PS_CONF_HELP) {
        char synopsis[256];
        snprintf(synopsis, sizeof synopsis, "%s [OPTIONS] %s", cmd->words,
                 cmd->args);
        ps_conf_usage(opts, "psctl", synopsis, stdout);
        printf("\n%s\n%s", cmd->help, EXIT_HELP);
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
        if (strcmp(o->name, name) == 0 ||
            (o->alias != NULL && strcmp(o->alias, name) == 0))
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
int parse_command(const struct command *cmd, const ps_opt *opts,
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

int main(int argc, char **argv)
{
    char err[512];
    int first;
    int rc = ps_conf_load(global_opts, &psctl_global, argc, argv, &first, err,
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
    ps_log_init("psctl", (enum ps_log_level)psctl_global.log_level);
    ps_log_set_format((enum ps_log_format)psctl_global.log_format);
    ps_tls_opts tls = ps_tls_opts_of(&psctl_global.tls);
    if (ps_tls_check_files(&tls, err, sizeof err) != 0) {
        fprintf(stderr, "psctl: %s\n", err);
        ps_conf_free(global_opts, &psctl_global);
        return EXIT_USAGE;
    }
    if (ps_tls_set_client_default(&tls) != 0) {
        fprintf(stderr, "psctl: out of memory\n");
        return EXIT_FAIL;
    }
    if (psctl_global.token_file != NULL && psctl_global.token_file[0] != '\0' &&
        ps_auth_read_token(psctl_global.token_file, psctl_global.token,
                           sizeof psctl_global.token, err, sizeof err) != 0) {
        fprintf(stderr, "psctl: --token-file: %s\n", err);
        ps_conf_free(global_opts, &psctl_global);
        return EXIT_USAGE;
    }
    if (psctl_global.server == NULL) {
        const char *env = getenv("PSD_ADDR");
        psctl_global.server = strdup(env != NULL && env[0] != '\0' ? env
                                                             : DEFAULT_SERVER);
        if (psctl_global.server == NULL) {
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
        if (n > 0) {
            int nargs = argc - first - n + 1;
            char **args = argv + first + n - 1;
            rc = c->run != NULL    ? c->run(c, nargs, args)
                 : c->call != NULL ? run_one_call(c, nargs, args, c->call)
                                   : run_fan(c, nargs, args, c->fan);
        }
    }
    ps_conf_free(global_opts, &psctl_global);
    explicit_bzero(psctl_global.token, sizeof psctl_global.token);
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
