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
 * Exit status: 0 success; 1 the command ran and failed (one line
 * "psctl: <problem>" on stderr); 2 the command line was wrong (one line on
 * stderr, or the usage on --help).
 */
#include "cluster.h"
#include "conf.h"
#include "errors.h"
#include "log.h"
#include "ps_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

struct command {
    const char *words; /* the command, space-separated: "cluster validate" */
    const char *args;  /* what follows it, for the usage line */
    const char *help;
    int (*run)(const struct command *self, int argc, char **argv);
};

static int cmd_cluster_validate(const struct command *self, int argc,
                                char **argv);

static const struct command commands[] = {
    {"cluster validate", "[FILE]",
     "check a TF_CONFIG-shaped cluster spec (FILE, else $TF_CONFIG) and "
     "summarise it",
     cmd_cluster_validate},
    {NULL, NULL, NULL, NULL},
};

/* Options that come before the command. */
struct global_cfg {
    int log_level; /* an enum ps_log_level */
};

static const char *const log_levels[] = {"error", "warn", "info", "debug",
                                         NULL};

static const ps_opt global_opts[] = {
    {"log-level", PS_OPT_ENUM, offsetof(struct global_cfg, log_level), "warn",
     "least severe log lines shown on stderr", 0, 0, log_levels},
    {0},
};

/* A command with no options of its own: it still gets --help. */
static const ps_opt no_opts[] = {{0}};

static void usage(FILE *out)
{
    ps_conf_usage(global_opts, "psctl", "[OPTIONS] COMMAND [ARGS]", out);
    fprintf(out, "\nCommands:\n");
    for (const struct command *c = commands; c->words != NULL; c++) {
        char left[128];
        snprintf(left, sizeof left, "%s %s", c->words, c->args);
        fprintf(out, "  %-28s %s\n", left, c->help);
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

int main(int argc, char **argv)
{
    struct global_cfg g;
    char err[512];
    int first;
    int rc = ps_conf_load(global_opts, &g, argc, argv, &first, err,
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
    ps_log_init("psctl", (enum ps_log_level)g.log_level);
    ps_conf_free(global_opts, &g);

    if (first >= argc) {
        fprintf(stderr, "psctl: no command given; try 'psctl --help'\n");
        return EXIT_USAGE;
    }
    for (const struct command *c = commands; c->words != NULL; c++) {
        int n = match_command(c, argc - first, argv + first);
        if (n > 0)
            return c->run(c, argc - first - n + 1, argv + first + n - 1);
    }

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
