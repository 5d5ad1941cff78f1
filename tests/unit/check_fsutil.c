/* ps_proc_stat_field (common/fsutil.c): fields of /proc/PID/stat counted
 * past a command name that holds spaces and parentheses, and the 0 of a
 * process that is gone. */
#include "tests/unit/pscheck.h"
#include "common/fsutil.h"

#include <check.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

START_TEST(test_stat_field)
{
    /* A name with spaces and a ')' would throw off a count from the
     * start of the line. */
    char old[17] = "";
    prctl(PR_GET_NAME, old);
    ck_assert_int_eq(prctl(PR_SET_NAME, "a) b c", 0, 0, 0), 0);
    ck_assert_uint_eq(ps_proc_stat_field(getpid(), 4), (uint64_t)getppid());
    ck_assert_uint_eq(ps_proc_stat_field(getpid(), 5), (uint64_t)getpgrp());
    ck_assert_uint_gt(ps_proc_stat_field(getpid(), 22), 0); /* start time */
    prctl(PR_SET_NAME, old, 0, 0, 0);
    /* Fields 1-3 (pid, name, state) are not numbers past the name. */
    ck_assert_uint_eq(ps_proc_stat_field(getpid(), 3), 0);
    /* Minor faults only grow: touch fresh pages. */
    uint64_t f0 = ps_proc_stat_field(getpid(), 10);
    volatile char *p = malloc(1 << 22);
    for (int i = 0; i < (1 << 22); i += 4096)
        p[i] = 1;
    ck_assert_uint_gt(ps_proc_stat_field(getpid(), 10), f0);
    free((void *)p);
    /* A process that is gone (reaped): 0. */
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    ck_assert_int_eq(waitpid(child, NULL, 0), child);
    ck_assert_uint_eq(ps_proc_stat_field(child, 22), 0);
}
END_TEST

PSCHECK_MAIN("fsutil",
    {"ps_proc_stat_field", {test_stat_field}})
