/* check_gpu - the GPU probe answers truthfully on any machine: a count of
 * devices where one answers, otherwise PS_ENODEV with a cause to print. */
#include "common/errors.h"
#include "worker/gpu.h"
#include "ps_config.h"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_probe)
{
    char err[256] = "";
    int n = -1;
    int rc = ps_gpu_probe(&n, err, sizeof err);
    ck_assert_int_eq(ps_gpu_compiled(), PS_HAVE_CUDA);
    if (rc == 0) {
        ck_assert_int_ge(n, 1);
        char name[256];
        size_t mem = 0;
        ck_assert_int_eq(ps_gpu_describe(0, name, sizeof name, &mem, err,
                                         sizeof err), 0);
        ck_assert_uint_gt(mem, 0);
        ck_assert_int_eq(ps_gpu_describe(n, name, sizeof name, &mem, err,
                                         sizeof err), PS_ENODEV);
        ck_assert_ptr_nonnull(strstr(err, "does not exist"));
    } else {
        ck_assert_int_eq(rc, PS_ENODEV);
        ck_assert_int_eq(n, 0);
        ck_assert_uint_gt(strlen(err), 5);
        ck_assert_ptr_null(strchr(err, '\n'));
    }
}
END_TEST

PSCHECK_MAIN("gpu",
    {"ps_gpu_probe", {test_probe}})
