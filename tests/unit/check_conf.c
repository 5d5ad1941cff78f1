#include "common/conf.h"
#include "common/errors.h"
#define PSCHECK_TMPFILE "conf.json"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A config struct with one field of each type. */
struct cfg {
    char *data_dir;
    char *name;
    int port;
    int threads;
    uint64_t seed;
    double lr;
    bool verbose;
    bool sync;
    uint64_t map_size;
    int64_t timeout_ms;
    int consistency;
};

static const char *const consistency_choices[] = {"async", "sync", "bounded",
                                                  NULL};

static const ps_opt opts[] = {
    {"data-dir", PS_OPT_STRING, offsetof(struct cfg, data_dir), "/var/lib/psd",
     "where the LMDB environment lives"},
    {"name", PS_OPT_STRING, offsetof(struct cfg, name), NULL, "a label"},
    {"port", PS_OPT_INT, offsetof(struct cfg, port), "7000", "listen port",
     1, 65535},
    {"threads", PS_OPT_INT, offsetof(struct cfg, threads), "4",
     "worker threads", 1, 64},
    {"seed", PS_OPT_UINT64, offsetof(struct cfg, seed), NULL, "random seed"},
    {"lr", PS_OPT_DOUBLE, offsetof(struct cfg, lr), "0.01", "learning rate",
     0.0, 10.0},
    {"verbose", PS_OPT_BOOL, offsetof(struct cfg, verbose), NULL,
     "log more"},
    {"sync", PS_OPT_BOOL, offsetof(struct cfg, sync), "true", "fsync"},
    {"map-size", PS_OPT_SIZE, offsetof(struct cfg, map_size), "1G",
     "LMDB map size", 1 << 20, 1099511627776.0},
    {"timeout", PS_OPT_DURATION_MS, offsetof(struct cfg, timeout_ms), "2s",
     "call deadline", 1, 3600000, NULL, "deadline"},
    {"consistency", PS_OPT_ENUM, offsetof(struct cfg, consistency), "async",
     "update rule", 0, 0, consistency_choices},
    {0},
};

/* Runs ps_conf_load on a NULL-terminated argument list (LOAD adds argv[0]);
 * with an environment prefix (LOAD_ENV's "PSX"), ps_conf_load_env. */
static char err[512];
static int first;
#define LOAD(cfgp, ...)                                                   \
    load((cfgp), (const char *[]){"prog", __VA_ARGS__, NULL}, NULL)
#define LOAD_ENV(cfgp, ...)                                               \
    load((cfgp), (const char *[]){"prog", __VA_ARGS__, NULL}, "PSX")
static int load(struct cfg *c, const char **args, const char *env_prefix)
{
    int argc = 0;
    while (args[argc] != NULL)
        argc++;
    err[0] = '\0';
    first = -1;
    memset(c, 0xAB, sizeof *c); /* whatever was there is overwritten */
    if (env_prefix != NULL)
        return ps_conf_load_env(opts, c, argc, (char **)args, env_prefix, &first, err,
                                sizeof err);
    return ps_conf_load(opts, c, argc, (char **)args, &first, err, sizeof err);
}

START_TEST(test_defaults)
{
    struct cfg c;
    ck_assert_int_eq(load(&c, (const char *[]){"prog", NULL}, NULL), 0);
    ck_assert_str_eq(c.data_dir, "/var/lib/psd");
    ck_assert_ptr_null(c.name);
    ck_assert_int_eq(c.port, 7000);
    ck_assert_int_eq(c.threads, 4);
    ck_assert_uint_eq(c.seed, 0);
    ck_assert_double_eq(c.lr, 0.01);
    ck_assert(!c.verbose);
    ck_assert(c.sync);
    ck_assert_uint_eq(c.map_size, 1ull << 30);
    ck_assert_int_eq(c.timeout_ms, 2000);
    ck_assert_int_eq(c.consistency, 0);
    ck_assert_int_eq(first, 1);
    ps_conf_free(opts, &c);
    ck_assert_ptr_null(c.data_dir);
}
END_TEST

START_TEST(test_command_line)
{
    struct cfg c;
    ck_assert_int_eq(LOAD(&c, "--data-dir", "/srv/ps", "--port=7001",
                          "--threads", "8", "--seed", "18446744073709551615",
                          "--lr=0.5", "--verbose",
                          "--no-sync", "--map-size", "64M", "--timeout",
                          "50ms", "--consistency=bounded", "--name="),
                     0);
    ck_assert_str_eq(c.data_dir, "/srv/ps");
    ck_assert_str_eq(c.name, "");
    ck_assert_int_eq(c.port, 7001);
    ck_assert_int_eq(c.threads, 8);
    ck_assert_uint_eq(c.seed, UINT64_MAX);
    ck_assert(c.verbose);
    ck_assert(!c.sync);
    ck_assert_uint_eq(c.map_size, 64ull << 20);
    ck_assert_int_eq(c.timeout_ms, 50);
    ck_assert_int_eq(c.consistency, 2);
    ck_assert_double_eq(c.lr, 0.5);
    ck_assert_int_eq(first, 17);
    ps_conf_free(opts, &c);

    /* The last of a repeated option wins; bools take =value too. */
    ck_assert_int_eq(LOAD(&c, "--port", "1", "--port", "2", "--verbose=yes",
                          "--sync=off"), 0);
    ck_assert_int_eq(c.port, 2);
    ck_assert(c.verbose);
    ck_assert(!c.sync);
    ps_conf_free(opts, &c);

    /* A negative number is a value, not an option. */
    ck_assert_int_eq(LOAD(&c, "--lr", "-1"), PS_EINVAL_ARG);
    ck_assert_str_eq(err, "--lr: -1 is out of range [0, 10]");
}
END_TEST

START_TEST(test_units)
{
    struct cfg c;
    static const struct {
        const char *size;
        uint64_t bytes;
    } sizes[] = {
        {"1048576", 1048576},  {"4096K", 4096ull << 10}, {"4MiB", 4ull << 20},
        {"2g", 2ull << 30},    {"1T", 1ull << 40},       {"3 MB", 3ull << 20},
        {"1024kib", 1ull << 20},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ck_assert_int_eq(LOAD(&c, "--map-size", sizes[i].size), 0);
        ck_assert_msg(c.map_size == sizes[i].bytes, "%s", sizes[i].size);
        ps_conf_free(opts, &c);
    }
    /* 16 KiB is below the 1 MiB minimum. */
    ck_assert_int_eq(LOAD(&c, "--map-size", "16KiB"), PS_EINVAL_ARG);
    ck_assert_str_eq(err,
                     "--map-size: 16KiB is out of range [1048576, 1099511627776]");

    static const struct {
        const char *text;
        int64_t ms;
    } durs[] = {
        {"50ms", 50}, {"2s", 2000}, {"1m", 60000}, {"1h", 3600000},
        {"250", 250}, {"3 s", 3000}, {"2min", 120000},
    };
    for (size_t i = 0; i < sizeof durs / sizeof durs[0]; i++) {
        ck_assert_int_eq(LOAD(&c, "--timeout", durs[i].text), 0);
        ck_assert_int_eq(c.timeout_ms, durs[i].ms);
        ps_conf_free(opts, &c);
    }
}
END_TEST

START_TEST(test_bad_values)
{
    static const struct {
        const char *args[3];
        const char *msg;
    } cases[] = {
        {{"--port", "abc"}, "--port: 'abc' is not an integer"},
        {{"--port", "12x"}, "--port: '12x' is not an integer"},
        {{"--port", ""}, "--port: '' is not an integer"},
        {{"--port", "70000"}, "--port: 70000 is out of range [1, 65535]"},
        {{"--port", "99999999999"},
         "--port: 99999999999 is out of range [1, 65535]"},
        {{"--threads", "0"}, "--threads: 0 is out of range [1, 64]"},
        {{"--seed", "-1"}, "--seed: '-1' is not a non-negative integer"},
        {{"--seed", "18446744073709551616"},
         "--seed: 18446744073709551616 is too large for 64 bits"},
        {{"--lr", "fast"}, "--lr: 'fast' is not a number"},
        {{"--lr", "nan"}, "--lr: nan is not a finite number"},
        {{"--lr", "11"}, "--lr: 11 is out of range [0, 10]"},
        {{"--verbose=maybe"}, "--verbose: 'maybe' is not a boolean (true or "
                              "false)"},
        {{"--no-verbose=1"}, "--no-verbose: takes no value"},
        {{"--map-size", "64X"}, "--map-size: '64X' is not a size (bytes, or a "
                                "number with K, M, G or T)"},
        {{"--map-size", "-1G"}, "--map-size: '-1G' is not a size (bytes, or a "
                                "number with K, M, G or T)"},
        {{"--map-size", "99999999999T"}, "--map-size: '99999999999T' is too "
                                         "large"},
        {{"--timeout", "5x"}, "--timeout: '5x' is not a duration (a number "
                              "with ms, s, m or h; plain numbers are ms)"},
        {{"--timeout", "2h"}, "--timeout: 2h is out of range [1, 3600000]"},
        {{"--consistency", "eventual"},
         "--consistency: 'eventual' is not one of async, sync, bounded"},
        {{"--prot", "1"}, "unknown option '--prot' (did you mean --port?)"},
        {{"--frobnicate"}, "unknown option '--frobnicate'"},
        {{"--frobnicate=1"}, "unknown option '--frobnicate'"},
        {{"-p", "1"}, "unknown option '-p'"},
        {{"--no-port"}, "unknown option '--no-port' (--port is not a "
                        "boolean)"},
        {{"--xy"}, "unknown option '--xy'"},
        {{"--port"}, "--port: missing value"},
        {{"--port", "--threads", "4"}, "--port: missing value"},
        {{"--config"}, "--config: missing value"},
        {{"--config="}, "--config: empty file name"},
    };
    struct cfg c;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *argv[5] = {"prog"};
        int argc = 1;
        for (int j = 0; j < 3 && cases[i].args[j] != NULL; j++)
            argv[argc++] = cases[i].args[j];
        memset(&c, 0xAB, sizeof c);
        err[0] = '\0';
        int rc = ps_conf_load(opts, &c, argc, (char **)argv, &first, err,
                              sizeof err);
        ck_assert_msg(rc == PS_EINVAL_ARG, "case %zu: rc %d", i, rc);
        ck_assert_str_eq(err, cases[i].msg);
    }
}
END_TEST

START_TEST(test_failure_frees)
{
    /* A failure after strings were set leaves none allocated (valgrind
     * checks the "none leaked" half). */
    struct cfg c;
    ck_assert_int_eq(LOAD(&c, "--data-dir", "/x", "--name", "n", "--port",
                          "0"), PS_EINVAL_ARG);
    ck_assert_ptr_null(c.data_dir);
    ck_assert_ptr_null(c.name);
    ps_conf_free(opts, &c); /* harmless */
}
END_TEST

START_TEST(test_positionals)
{
    struct cfg c;
    ck_assert_int_eq(LOAD(&c, "--port", "1", "cluster", "validate",
                          "--port", "x"), 0);
    ck_assert_int_eq(first, 3);
    ck_assert_int_eq(c.port, 1);
    ps_conf_free(opts, &c);

    ck_assert_int_eq(LOAD(&c, "--verbose", "--", "--port", "x"), 0);
    ck_assert_int_eq(first, 3);
    ps_conf_free(opts, &c);

    ck_assert_int_eq(LOAD(&c, "-"), 0);
    ck_assert_int_eq(first, 1);
    ps_conf_free(opts, &c);

    ck_assert_int_eq(LOAD(&c, "--verbose"), 0);
    ck_assert_int_eq(first, 2);
    ps_conf_free(opts, &c);

    /* Without first_positional, a positional argument is an error. */
    const char *argv[] = {"prog", "--port", "5", "extra", NULL};
    ck_assert_int_eq(ps_conf_load(opts, &c, 4, (char **)argv, NULL, err,
                                  sizeof err), PS_EINVAL_ARG);
    ck_assert_str_eq(err, "unexpected argument 'extra'");
    ck_assert_int_eq(ps_conf_load(opts, &c, 3, (char **)argv, NULL, err,
                                  sizeof err), 0);
    ps_conf_free(opts, &c);
}
END_TEST

START_TEST(test_help_version)
{
    struct cfg c;
    ck_assert_int_eq(LOAD(&c, "--help"), PS_CONF_HELP);
    ck_assert_int_eq(LOAD(&c, "--port", "1", "-h"), PS_CONF_HELP);
    ck_assert_int_eq(LOAD(&c, "--version", "--help"), PS_CONF_VERSION);
    /* An error before --help is still an error... */
    ck_assert_int_eq(LOAD(&c, "--prot", "--help"), PS_EINVAL_ARG);
    /* ...and --help after the options is a positional argument. */
    ck_assert_int_eq(LOAD(&c, "cmd", "--help"), 0);
    ck_assert_int_eq(first, 1);
    ps_conf_free(opts, &c);
}
END_TEST

START_TEST(test_config_file)
{
    struct cfg c;
    pscheck_write_text(tmppath, "{\"port\": 7100, \"data-dir\": \"/from/file\", "
                        "\"verbose\": true, \"lr\": 0.5, \"map-size\": \"2G\", "
                        "\"timeout\": 1500, \"consistency\": \"sync\", "
                        "\"seed\": 42, \"threads\": 2}");
    /* The file overrides defaults; the command line overrides the file,
     * wherever --config sits on it. */
    ck_assert_int_eq(LOAD(&c, "--port", "7200", "--config", tmppath), 0);
    ck_assert_int_eq(c.port, 7200);
    ck_assert_str_eq(c.data_dir, "/from/file");
    ck_assert(c.verbose);
    ck_assert_double_eq(c.lr, 0.5);
    ck_assert_uint_eq(c.map_size, 2ull << 30);
    ck_assert_int_eq(c.timeout_ms, 1500);
    ck_assert_int_eq(c.consistency, 1);
    ck_assert_uint_eq(c.seed, 42);
    ck_assert_int_eq(c.threads, 2);
    ck_assert(c.sync); /* untouched: the default */
    ps_conf_free(opts, &c);

    char arg[160];
    snprintf(arg, sizeof arg, "--config=%s", tmppath);
    ck_assert_int_eq(LOAD(&c, arg, "--data-dir", "/cli"), 0);
    ck_assert_str_eq(c.data_dir, "/cli");
    ck_assert_int_eq(c.port, 7100);
    ps_conf_free(opts, &c);

    ck_assert_int_eq(LOAD(&c, arg, arg), PS_EINVAL_ARG);
    ck_assert_str_eq(err, "--config: given more than once");
}
END_TEST

START_TEST(test_env)
{
    struct cfg c;
    setenv("PSX_PORT", "7300", 1);
    setenv("PSX_DATA_DIR", "/from/env", 1);
    setenv("PSX_VERBOSE", "yes", 1);
    setenv("PSX_MAP_SIZE", "2G", 1);
    setenv("PSX_NOT_AN_OPTION", "whatever", 1);
    ck_assert_int_eq(LOAD_ENV(&c, "--name", "n"), 0);
    ck_assert_int_eq(c.port, 7300);
    ck_assert_str_eq(c.data_dir, "/from/env");
    ck_assert(c.verbose);
    ck_assert_uint_eq(c.map_size, 2ull << 30);
    ck_assert_int_eq(c.threads, 4); /* the default */
    ps_conf_free(opts, &c);

    /* defaults < file < environment < command line */
    pscheck_write_text(tmppath, "{\"port\": 7100, \"threads\": 2, \"lr\": 0.5}");
    ck_assert_int_eq(LOAD_ENV(&c, "--config", tmppath, "--data-dir", "/cli"), 0);
    ck_assert_int_eq(c.port, 7300);
    ck_assert_int_eq(c.threads, 2);
    ck_assert_double_eq(c.lr, 0.5);
    ck_assert_str_eq(c.data_dir, "/cli");
    ps_conf_free(opts, &c);

    /* PREFIX_CONFIG names the file when --config does not. */
    setenv("PSX_CONFIG", tmppath, 1);
    ck_assert_int_eq(LOAD_ENV(&c, "--lr", "1"), 0);
    ck_assert_int_eq(c.threads, 2);
    ck_assert_double_eq(c.lr, 1.0);
    ps_conf_free(opts, &c);
    setenv("PSX_CONFIG", "/nonexistent/psx.json", 1);
    ck_assert_int_eq(LOAD_ENV(&c, "--lr", "1"), -ENOENT);
    ck_assert_str_eq(err, "PSX_CONFIG: cannot open '/nonexistent/psx.json': "
                          "No such file or directory");
    unsetenv("PSX_CONFIG");

    /* A bad value is refused by the variable's name, before the command
     * line is looked at. */
    setenv("PSX_THREADS", "0", 1);
    ck_assert_int_eq(LOAD_ENV(&c, "--threads", "3"), PS_EINVAL_ARG);
    ck_assert_str_eq(err, "PSX_THREADS: 0 is out of range [1, 64]");
    setenv("PSX_THREADS", "many", 1);
    ck_assert_int_eq(LOAD_ENV(&c, "--name", "n"), PS_EINVAL_ARG);
    ck_assert_str_eq(err, "PSX_THREADS: 'many' is not an integer");
    unsetenv("PSX_THREADS");
    setenv("PSX_TIMEOUT", "soon", 1);
    ck_assert_int_eq(LOAD_ENV(&c, "--name", "n"), PS_EINVAL_ARG);
    ck_assert_ptr_nonnull(strstr(err, "PSX_TIMEOUT: 'soon' is not a duration"));
    unsetenv("PSX_TIMEOUT");

    /* ps_conf_load reads no environment. */
    ck_assert_int_eq(LOAD(&c, "--name", "n"), 0);
    ck_assert_int_eq(c.port, 7000);
    ps_conf_free(opts, &c);
    unsetenv("PSX_PORT");
    unsetenv("PSX_DATA_DIR");
    unsetenv("PSX_VERBOSE");
    unsetenv("PSX_MAP_SIZE");
    unsetenv("PSX_NOT_AN_OPTION");
}
END_TEST

START_TEST(test_old_name)
{
    struct cfg c;
    /* The old name sets the option, on the command line and in a file. */
    ck_assert_int_eq(LOAD(&c, "--deadline", "5s"), 0);
    ck_assert_int_eq(c.timeout_ms, 5000);
    ps_conf_free(opts, &c);
    ck_assert_int_eq(LOAD(&c, "--deadline=300ms", "--timeout", "7s"), 0);
    ck_assert_int_eq(c.timeout_ms, 7000);
    ps_conf_free(opts, &c);
    ck_assert_int_eq(LOAD(&c, "--deadline", "soon"), PS_EINVAL_ARG);
    ck_assert_ptr_nonnull(strstr(err, "--deadline: 'soon' is not a duration"));
    pscheck_write_text(tmppath, "{\"deadline\": 700}");
    ck_assert_int_eq(LOAD(&c, "--config", tmppath), 0);
    ck_assert_int_eq(c.timeout_ms, 700);
    ps_conf_free(opts, &c);
}
END_TEST

START_TEST(test_config_file_bad)
{
    static const struct {
        const char *json;
        int rc;
        const char *msg; /* after "<path>: " */
    } cases[] = {
        {"{\"prot\": 1}", PS_EINVAL_ARG, "unknown key 'prot'"},
        {"{\"port\": \"7000\"}", PS_EINVAL_ARG,
         "key 'port': expected an integer, got a string"},
        {"{\"port\": 0}", PS_EINVAL_ARG,
         "key 'port': 0 is out of range [1, 65535]"},
        {"{\"port\": 1.5}", PS_EINVAL_ARG,
         "key 'port': expected an integer, got a number"},
        {"{\"seed\": -3}", PS_EINVAL_ARG, "key 'seed': -3 is negative"},
        {"{\"lr\": \"fast\"}", PS_EINVAL_ARG,
         "key 'lr': expected a number, got a string"},
        {"{\"verbose\": 1}", PS_EINVAL_ARG,
         "key 'verbose': expected true or false, got an integer"},
        {"{\"data-dir\": null}", PS_EINVAL_ARG,
         "key 'data-dir': expected a string, got null"},
        {"{\"map-size\": \"lots\"}", PS_EINVAL_ARG,
         "key 'map-size': 'lots' is not a size (bytes, or a number with K, M, "
         "G or T)"},
        {"{\"map-size\": true}", PS_EINVAL_ARG,
         "key 'map-size': expected a size like \"64M\" or an integer, got a "
         "boolean"},
        {"{\"timeout\": -5}", PS_EINVAL_ARG, "key 'timeout': -5 is negative"},
        {"{\"consistency\": \"eventual\"}", PS_EINVAL_ARG,
         "key 'consistency': 'eventual' is not one of async, sync, bounded"},
        {"[1]", PS_EINVAL_ARG, "expected a JSON object of options, got a list"},
        {"{\"config\": \"x\"}", PS_EINVAL_ARG, "unknown key 'config'"},
        {"{\"port\": 1,\n \"port\": 2}", PS_EPARSE, NULL},
        {"{\"port\": ", PS_EPARSE, NULL},
    };
    struct cfg c;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pscheck_write_text(tmppath, cases[i].json);
        int rc = LOAD(&c, "--config", tmppath);
        ck_assert_msg(rc == cases[i].rc, "case %zu: rc %d (%s)", i, rc, err);
        ck_assert_ptr_null(c.data_dir);
        char want[512];
        if (cases[i].msg != NULL) {
            snprintf(want, sizeof want, "%s: %s", tmppath, cases[i].msg);
            ck_assert_str_eq(err, want);
        } else {
            snprintf(want, sizeof want, "%s: not valid JSON at line ",
                     tmppath);
            ck_assert_ptr_eq(strstr(err, want), err);
        }
    }
    pscheck_write_text(tmppath, "{\"port\": 1,\n \"port\": 2}");
    ck_assert_int_eq(LOAD(&c, "--config", tmppath), PS_EPARSE);
    ck_assert_ptr_nonnull(strstr(err, "line 2, column"));

    char missing[160];
    snprintf(missing, sizeof missing, "%s/missing.json", tmpdir);
    ck_assert_int_eq(LOAD(&c, "--config", missing), -ENOENT);
    char want[512];
    snprintf(want, sizeof want,
             "--config: cannot open '%s': No such file or directory", missing);
    ck_assert_str_eq(err, want);
}
END_TEST

START_TEST(test_bad_default)
{
    /* A table with a default outside its own range is caught at load. */
    struct cfg c;
    static const ps_opt broken[] = {
        {"port", PS_OPT_INT, offsetof(struct cfg, port), "0", "port", 1, 10},
        {0},
    };
    const char *argv[] = {"prog", NULL};
    ck_assert_int_eq(ps_conf_load(broken, &c, 1, (char **)argv, NULL, err,
                                  sizeof err), PS_EINVAL_ARG);
    ck_assert_str_eq(err, "--port (default): 0 is out of range [1, 10]");
}
END_TEST

START_TEST(test_free)
{
    struct cfg c;
    ck_assert_int_eq(LOAD(&c, "--name", "x"), 0);
    ps_conf_free(opts, &c);
    ck_assert_ptr_null(c.name);
    ck_assert_ptr_null(c.data_dir);
    ck_assert_int_eq(c.port, 7000); /* only strings are touched */
    ps_conf_free(opts, &c);
}
END_TEST

START_TEST(test_usage)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ps_conf_usage(opts, "/usr/bin/psd", "[OPTIONS]", f);
    fclose(f);
    ck_assert_ptr_eq(strstr(buf, "Usage: psd [OPTIONS]\n"), buf);
    static const char *const want[] = {
        "--data-dir STRING", "(default: /var/lib/psd)", "--port INT",
        "listen port [1, 65535] (default: 7000)", "--[no-]verbose",
        "log more (default: false)", "--map-size SIZE", "--timeout DURATION",
        "call deadline [1, 3600000] (old name: --deadline)",
        "--consistency async|sync|bounded", "--config FILE", "--help"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        ck_assert_msg(strstr(buf, want[i]) != NULL, "the usage lacks \"%s\"", want[i]);
    free(buf);
}
END_TEST

PSCHECK_MAIN("conf",
    {"ps_conf_load", {test_defaults, test_command_line, test_units, test_bad_values,
                      test_failure_frees, test_positionals, test_help_version,
                      test_bad_default}},
    {"ps_conf_load --config", {test_config_file, test_config_file_bad, test_old_name},
     &pscheck_tmp},
    {"ps_conf_load_env", {test_env}, &pscheck_tmp},
    {"ps_conf_free", {test_free}},
    {"ps_conf_usage", {test_usage}})
