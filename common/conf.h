/*
 * conf.h - configuration from defaults, a JSON file and the command line.
 *
 * A program describes its options once, in a table of ps_opt terminated by
 * {0}; each entry names a field of the program's own config struct by
 * offsetof. ps_conf_load then fills that struct in layers, later ones
 * winning:
 *
 *   1. every option's default (ps_opt.def, as text; NULL means zero/NULL);
 *   2. the keys of the JSON object in FILE, if "--config FILE" is given
 *      (or, with an environment prefix, $PREFIX_CONFIG);
 *   3. with an environment prefix (ps_conf_load_env), the environment:
 *      PREFIX_NAME for --name, upper case, '-' as '_' (psd's --data-dir is
 *      PSD_DATA_DIR), its value as on the command line; a variable that is
 *      not an option is ignored, one with a bad value refused by its name;
 *   4. the command line: "--name value", "--name=value"; for booleans
 *      "--name" and "--no-name".
 *
 * An option may keep an old name (ps_opt.alias): "--old" on the command
 * line and the key "old" in the file still set it, with one warning per
 * old name and process on stderr ("PROG: warning: --old is an old name for
 * --name").
 *
 * Options stop at the first argument that does not start with "-" (or is
 * just "-"), or after "--"; what follows is positional, so a tool can take
 * subcommands and parse their options with a second table.
 *
 * Each type and the C field it fills:
 *   PS_OPT_STRING       char *     a malloc'd copy; ps_conf_free frees it
 *   PS_OPT_INT          int        decimal, optional sign
 *   PS_OPT_UINT64       uint64_t   decimal, no sign
 *   PS_OPT_DOUBLE       double     finite
 *   PS_OPT_BOOL         bool       true/false, yes/no, on/off, 1/0
 *   PS_OPT_SIZE         uint64_t   bytes: "4096", "64K", "64M", "1G", "2T";
 *                                  K/KB/KiB all mean 1024 (memory sizes)
 *   PS_OPT_DURATION_MS  int64_t    milliseconds: "50ms", "2s", "1m", "1h";
 *                                  a plain number is milliseconds
 *   PS_OPT_ENUM         int        index into choices (exact match)
 * When min < max, a numeric value (for SIZE in bytes, for DURATION_MS in
 * milliseconds) must lie in [min, max]. In the JSON file SIZE and DURATION_MS
 * take a string with a unit or a plain integer (bytes, milliseconds).
 *
 * "--help" (or "-h"), "--version" and "--config" are built in and must not
 * appear in a table.
 *
 * Threads and lifetime: a loaded struct is plain data. The one state kept
 * across loads is the list of old names already warned about (so that one
 * is warned about once per process): load at start-up, from one thread.
 */
#ifndef PS_CONF_H
#define PS_CONF_H

#include <stddef.h>
#include <stdio.h>

enum ps_opt_type {
    PS_OPT_STRING,
    PS_OPT_INT,
    PS_OPT_UINT64,
    PS_OPT_DOUBLE,
    PS_OPT_BOOL,
    PS_OPT_SIZE,        /* bytes, accepts 64M, 1G, 4KiB... */
    PS_OPT_DURATION_MS, /* accepts 50ms, 2s, 1m, plain number = ms */
    PS_OPT_ENUM,        /* one of choices, stored as int index */
};

typedef struct ps_opt {
    const char *name;   /* "data-dir" -> --data-dir and JSON key "data-dir" */
    enum ps_opt_type type;
    size_t offset;      /* offsetof in the caller's config struct */
    const char *def;    /* default as text, NULL = zero/NULL */
    const char *help;
    double min, max;    /* numeric range when min < max */
    const char *const *choices; /* ENUM: NULL-terminated */
    const char *alias;  /* an old name still taken, with a warning; NULL */
} ps_opt;

/* Positive results of ps_conf_load: not errors, but the caller should print
 * something and exit instead of running. */
#define PS_CONF_HELP 1    /* --help or -h was given */
#define PS_CONF_VERSION 2 /* --version was given */

/* Fills cfg from the defaults, then --config FILE, then argv[1..]. Every
 * field named in the table is overwritten without being freed first, so call
 * ps_conf_free before loading into the same struct again.
 *
 * first_positional receives the index of the first positional argument
 * (argc when there is none); when it is NULL, a positional argument is an
 * error. A later --name wins over an earlier one.
 *
 * Returns 0; PS_CONF_HELP or PS_CONF_VERSION (the first one met among the
 * options; cfg is then left untouched); PS_EINVAL_ARG for a
 * bad option or value; PS_EPARSE when the config file is not JSON; -errno
 * when it cannot be read. On every failure err holds one line naming the
 * option (or file and key) and the problem, e.g. "--threads: 0 is out of
 * range [1, 64]", and nothing in cfg needs freeing (its string fields are
 * NULL or untouched). */
int ps_conf_load(const ps_opt *opts, void *cfg, int argc, char **argv,
                 int *first_positional, char *err, size_t errlen);

/* ps_conf_load with the environment between the config file and the
 * command line: env_prefix "PSD" reads PSD_DATA_DIR for --data-dir, and
 * PSD_CONFIG for the file when no --config is given (NULL: no environment,
 * as ps_conf_load). A bad value is PS_EINVAL_ARG with err naming the
 * variable: "PSD_THREADS: 'x' is not an integer". */
int ps_conf_load_env(const ps_opt *opts, void *cfg, int argc, char **argv,
                     const char *env_prefix, int *first_positional, char *err,
                     size_t errlen);

/* Frees the strings of cfg and sets them to NULL. Safe to call twice. */
void ps_conf_free(const ps_opt *opts, void *cfg);

/* Prints "Usage: PROG SYNOPSIS" and one entry per option (type, help, range,
 * default), then the built-in options. */
void ps_conf_usage(const ps_opt *opts, const char *prog, const char *synopsis,
                   FILE *out);

/* ps_conf_usage, then how the environment (env_prefix, as
 * ps_conf_load_env) and the layers' precedence work. */
void ps_conf_usage_env(const ps_opt *opts, const char *prog, const char *synopsis,
                       const char *env_prefix, FILE *out);

#endif
