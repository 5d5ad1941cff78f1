#include "common/errors.h"
#include "common/log.h"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs fn with stderr redirected to a pipe and returns what it wrote. */
static char captured[4096];
static void capture(void (*fn)(void))
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    int saved = dup(STDERR_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[1]);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = read(fds[0], captured, sizeof captured - 1);
    captured[n > 0 ? n : 0] = '\0';
    close(fds[0]);
}

static void emit_info_and_debug(void)
{
    ps_log_init("/usr/bin/testprog", PS_LOG_INFO);
    ps_log_info("hello %d", 42);
    ps_log_debug("hidden %d", 1);
}

static void emit_err(void)
{
    ps_log_init("testprog", PS_LOG_WARN);
    ps_log_err(PS_ENOTFOUND, "variable '%s'", "w1");
    ps_log_info("not shown");
}

START_TEST(test_level_filters)
{
    capture(emit_info_and_debug);
    ck_assert_ptr_nonnull(strstr(captured, "testprog["));
    ck_assert_ptr_nonnull(strstr(captured, " INFO hello 42\n"));
    ck_assert_ptr_null(strstr(captured, "hidden"));
}
END_TEST

START_TEST(test_err_appends_text)
{
    capture(emit_err);
    ck_assert_ptr_nonnull(strstr(captured, " ERROR variable 'w1': not found\n"));
    ck_assert_ptr_null(strstr(captured, "not shown"));
}
END_TEST

START_TEST(test_level_parse)
{
    enum ps_log_level l;
    ck_assert_int_eq(ps_log_level_parse("debug", &l), 0);
    ck_assert_int_eq(l, PS_LOG_DEBUG);
    ck_assert_int_eq(ps_log_level_parse("WARN", &l), 0);
    ck_assert_int_eq(l, PS_LOG_WARN);
    ck_assert_int_eq(ps_log_level_parse("loud", &l), PS_EINVAL_ARG);
}
END_TEST

PSCHECK_MAIN("log",
    {"ps_log_write", {test_level_filters, test_err_appends_text}},
    {"ps_log_level_parse", {test_level_parse}})
