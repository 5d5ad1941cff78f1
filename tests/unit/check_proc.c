/* check_proc: the daemons' prologue and control loop (common/proc.c). */
#include "common/proc.h"

#include "tests/unit/pscheck.h"

#include <check.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct tconf {
    char *name;
    int level;
};

static const ps_opt topts[] = {
    {"name", PS_OPT_STRING, offsetof(struct tconf, name), "x", "a name", 0, 0, NULL},
    {"log-level", PS_OPT_ENUM, offsetof(struct tconf, level), "info", "level",
     0, 0, ps_proc_log_levels},
    {0},
};

static int run_prologue(int argc, char **argv, struct tconf *c)
{
    memset(c, 0, sizeof *c);
    ps_proc_cmd cmd = {.name = "tproc", .usage = "[options]", .opts = topts,
                       .conf = c, .log_level = &c->level};
    return ps_proc_prologue(&cmd, argc, argv);
}

START_TEST(test_prologue)
{
    struct tconf c;
    char *ok[] = {"tproc", "--name", "y", NULL};
    ck_assert_int_eq(run_prologue(3, ok, &c), PS_PROC_RUN);
    ck_assert_str_eq(c.name, "y");
    ps_conf_free(topts, &c);
    char *version[] = {"tproc", "--version", NULL};
    ck_assert_int_eq(run_prologue(2, version, &c), 0);
    char *bad[] = {"tproc", "--nope", NULL};
    ck_assert_int_eq(run_prologue(2, bad, &c), 2);
    char *extra[] = {"tproc", "stray", NULL};
    ck_assert_int_eq(run_prologue(2, extra, &c), 2);
}
END_TEST

START_TEST(test_epilogue)
{
    struct tconf c;
    char *ok[] = {"tproc", "--name", "y", NULL};
    ck_assert_int_eq(run_prologue(3, ok, &c), PS_PROC_RUN);
    ps_proc_cmd cmd = {.name = "tproc", .opts = topts, .conf = &c};
    ps_proc_loop *l;
    ck_assert_int_eq(ps_proc_loop_create(&l), 0);
    ck_assert_int_eq(ps_proc_epilogue(&cmd, l, 7), 7);
    ck_assert_ptr_null(c.name);
    ck_assert_int_eq(run_prologue(3, ok, &c), PS_PROC_RUN);
    ck_assert_int_eq(ps_proc_epilogue(&cmd, NULL, 0), 0);
    ck_assert_ptr_null(c.name);
}
END_TEST

struct ticks {
    int n;
};

/* The first tick sends SIGHUP, which must not stop the loop (it asks for
 * a TLS reload); the third sends SIGTERM, which the loop must return. */
static void tick(void *ctx)
{
    struct ticks *t = ctx;
    if (++t->n == 1)
        kill(getpid(), SIGHUP);
    else if (t->n == 3)
        kill(getpid(), SIGTERM);
}

START_TEST(test_loop_timer_and_signal)
{
    ps_proc_loop *l;
    ck_assert_int_eq(ps_proc_loop_create(&l), 0);
    struct ticks t = {0};
    ck_assert_int_eq(ps_proc_loop_every(l, 5, tick, &t), 0);
    ck_assert_int_ne(ps_proc_loop_every(l, 0, tick, &t), 0);
    ck_assert_int_eq(ps_proc_loop_run(l), SIGTERM);
    ck_assert_int_eq(t.n, 3);
    /* A signal sent while the loop is not running waits for it. */
    kill(getpid(), SIGINT);
    ck_assert_int_eq(ps_proc_loop_run(l), SIGINT);
    ps_proc_loop_destroy(l);
    ps_proc_loop_destroy(NULL);
}
END_TEST

PSCHECK_MAIN("proc",
    {"ps_proc_prologue", {test_prologue}},
    {"ps_proc_epilogue", {test_epilogue}},
    {"ps_proc_loop", {test_loop_timer_and_signal}})
