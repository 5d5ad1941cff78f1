/* The checkpoint-retention rule (common/retention.h) that psd and pscoord
 * both apply. */
#include "common/retention.h"

#include "tests/unit/pscheck.h"

#include <check.h>
#include <stdlib.h>

START_TEST(test_keep)
{
    static const struct {
        size_t own, asked, keep;
    } rows[] = {
        {0, 0, 0},   /* --checkpoint-keep 0 keeps all ... */
        {0, 7, 0},   /* ... whatever the caller asks */
        {5, 0, 5},   /* nothing asked: its own */
        {5, 2, 5},   /* asked fewer: its own */
        {3, 8, 8},   /* asked more: the caller's, so its manifests keep shards */
        {1, 1, 1},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        ck_assert_uint_eq(ps_retention_keep(rows[i].own, rows[i].asked), rows[i].keep);
}
END_TEST

START_TEST(test_drop)
{
    static const struct {
        size_t have, keep, drop;
    } rows[] = {
        {10, 0, 0}, /* keep all */
        {0, 3, 0},  {2, 3, 0}, {3, 3, 0},
        {4, 3, 1},  {10, 3, 7}, {1, 1, 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        ck_assert_uint_eq(ps_retention_drop(rows[i].have, rows[i].keep), rows[i].drop);
}
END_TEST

PSCHECK_MAIN("retention",
    {"ps_retention_keep", {test_keep}},
    {"ps_retention_drop", {test_drop}})
