/*
 * refusals.h - a validate function's refusals as a table: each row a
 * defaulted spec of one kind with one or two float fields changed, the code
 * the function must return for it and, where the test pins it, the reason
 * it must give (the whole of it, or a part). check_optim.c and check_init.c
 * write their psd_opt_validate and psd_init_validate cases this way.
 *
 * Threads and lifetime: for the test's own thread; the table is the
 * caller's and only read.
 */
#ifndef PS_REFUSALS_H
#define PS_REFUSALS_H

#include <check.h>
#include <stddef.h>
#include <string.h>

/* A float field set to value: at is its offsetof in the spec. Every spec
 * begins with its kind, which a row never sets this way, so at 0 marks an
 * unused change. */
struct ps_refusal_set {
    size_t at;
    float value;
};

struct ps_refusal {
    int kind;                     /* the spec is this kind's defaults ... */
    struct ps_refusal_set set[2]; /* ... with these fields changed */
    int rc;                       /* what validating it returns */
    const char *why;              /* the reason exactly, or NULL */
    const char *part;             /* a part of the reason, or NULL */
};

/* Builds row's spec and returns what validating it returns, with the
 * reason in why. Each suite writes one for its spec type. */
typedef int ps_refusal_run(const struct ps_refusal *row, char *why, size_t whylen);

/* Applies row's changes to spec, a defaulted spec of row's kind. */
static inline void ps_refusal_apply(void *spec, const struct ps_refusal *row)
{
    for (size_t j = 0; j < 2 && row->set[j].at != 0; j++)
        memcpy((char *)spec + row->set[j].at, &row->set[j].value, sizeof(float));
}

/* Runs every row of t and checks its code and reason; a failure names the
 * row (its index in t). */
static inline void ps_check_refusals(const struct ps_refusal *t, size_t n, ps_refusal_run *run)
{
    for (size_t i = 0; i < n; i++) {
        char why[256] = "";
        int rc = run(&t[i], why, sizeof why);
        ck_assert_msg(rc == t[i].rc, "row %zu: returned %d, expected %d", i, rc, t[i].rc);
        if (t[i].why != NULL)
            ck_assert_msg(strcmp(why, t[i].why) == 0, "row %zu: reason \"%s\", expected \"%s\"",
                          i, why, t[i].why);
        if (t[i].part != NULL)
            ck_assert_msg(strstr(why, t[i].part) != NULL,
                          "row %zu: reason \"%s\" does not hold \"%s\"", i, why, t[i].part);
    }
}

#define PS_CHECK_REFUSALS(table, run) \
    ps_check_refusals(table, sizeof(table) / sizeof(table)[0], run)

#endif
