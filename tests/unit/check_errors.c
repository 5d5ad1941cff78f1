#include "common/errors.h"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_strerror_project_codes)
{
    ck_assert_str_eq(ps_strerror(0), "success");
    ck_assert_str_eq(ps_strerror(PS_ENOTFOUND), "not found");
    ck_assert_str_eq(ps_strerror(PS_ESHAPE), "shape mismatch");
    ck_assert_str_eq(ps_errname(PS_ENONFINITE), "PS_ENONFINITE");
}
END_TEST

START_TEST(test_strerror_errno)
{
    ck_assert_str_eq(ps_strerror(-ENOENT), strerror(ENOENT));
    ck_assert_str_eq(ps_errname(-ENOSPC), "ENOSPC");
}
END_TEST

START_TEST(test_strerror_unknown)
{
    ck_assert_str_eq(ps_strerror(-29999), "unknown error");
    ck_assert_str_eq(ps_strerror(12345), "unknown error");
    ck_assert_str_eq(ps_errname(-29999), "UNKNOWN");
}
END_TEST

START_TEST(test_codes_distinct_from_errno)
{
    /* Every project code must sit below the errno range. */
#define CHECK_BAND(name, value, text) ck_assert_int_lt(name, -4095);
    PS_ERRNO_MAP(CHECK_BAND)
#undef CHECK_BAND
}
END_TEST

START_TEST(test_errf)
{
    char err[8];
    ck_assert_int_eq(ps_errf(PS_EPARSE, err, sizeof err, "line %d", 12), PS_EPARSE);
    ck_assert_str_eq(err, "line 12");
    /* Truncated to the buffer, still terminated. */
    ck_assert_int_eq(ps_errf(-ENOMEM, err, sizeof err, "%s", "much too long"), -ENOMEM);
    ck_assert_str_eq(err, "much to");
    /* No buffer: only the code. */
    ck_assert_int_eq(ps_errf(PS_EINVAL_ARG, NULL, 0, "x"), PS_EINVAL_ARG);
    err[0] = 'k';
    ck_assert_int_eq(ps_errf(PS_EINVAL_ARG, err, 0, "x"), PS_EINVAL_ARG);
    ck_assert_int_eq(err[0], 'k');
}
END_TEST

PSCHECK_MAIN("errors",
    {"ps_strerror", {test_strerror_project_codes, test_strerror_errno, test_strerror_unknown,
                     test_codes_distinct_from_errno}},
    {"ps_errf", {test_errf}})
