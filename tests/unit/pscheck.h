/*
 * pscheck - the scaffolding every tests/unit/check_<module>.c shares: a
 * suite's TCases (one per public function) as one table, its main
 * (PSCHECK_MAIN) that runs them and fails if any test failed, a fresh
 * temporary directory per test, and the small file and process helpers
 * the tests kept writing again.
 *
 * Threads and lifetime: everything here is for the test's own thread. The
 * fixture's tmpdir and tmppath hold the running test's directory from its
 * setup to its teardown, which removes the directory and all in it; Check
 * forks each test (not under valgrind, CK_FORK=no), so nothing here may
 * rely on a test's process ending. Every function is static inline, so a
 * suite that does not use one pays nothing for it.
 */
#ifndef PSCHECK_H
#define PSCHECK_H

#include <check.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The suite's name, which also names its temporary directories. */
static const char *pscheck_name = "pscheck";

/* The running test's temporary directory, and a file in it named by
 * PSCHECK_TMPFILE when the suite defines that before including this. */
static char tmpdir[64];
#ifdef PSCHECK_TMPFILE
static char tmppath[128];
#endif

/* Creates the suite and remembers its name for the temporary directories. */
static inline Suite *pscheck_suite(const char *name)
{
    pscheck_name = name;
    return suite_create(name);
}

/* Runs every test of s, frees it, and returns how many failed. */
static inline int pscheck_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}

/* What each test of a TCase runs in: a checked fixture around it (both
 * NULL for none) and a timeout in seconds (0 keeps Check's default). */
struct pscheck_opts {
    void (*setup)(void);
    void (*teardown)(void);
    double timeout;
};

static inline TCase *pscheck_tcase_add(Suite *s, const struct pscheck_opts *o,
                                       const char *name, const TTest *const *tests)
{
    TCase *tc = tcase_create(name);
    if (o != NULL && o->setup != NULL)
        tcase_add_checked_fixture(tc, o->setup, o->teardown);
    if (o != NULL && o->timeout > 0)
        tcase_set_timeout(tc, o->timeout);
    for (size_t i = 0; tests[i] != NULL; i++)
        tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    return tc;
}

/* Adds a TCase called name to s with the tests that follow, run in opts
 * (NULL: no fixture); returns it for anything else it needs. */
#define PSCHECK_TCASE(s, opts, name, ...)                                      \
    pscheck_tcase_add((s), (opts), (name), (const TTest *const[]){__VA_ARGS__, NULL})

/* One TCase of a suite's table: the public function it tests (its name),
 * its tests, and what they run in (NULL: no fixture). */
#define PSCHECK_MAX_TESTS 12
struct pscheck_case {
    const char *name;
    const TTest *tests[PSCHECK_MAX_TESTS + 1];
    const struct pscheck_opts *opts;
};

/* Adds a TCase to s for each of the n cases. */
static inline void pscheck_add(Suite *s, const struct pscheck_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++)
        pscheck_tcase_add(s, cases[i].opts, cases[i].name, cases[i].tests);
}

/* Creates the suite name with a TCase for each of the n cases, runs it and
 * returns how many tests failed. A suite with a TCase that needs more (a
 * loop test, an unchecked fixture) uses pscheck_suite, pscheck_add,
 * PSCHECK_TCASE and pscheck_run instead. */
static inline int pscheck_main(const char *name, const struct pscheck_case *cases,
                               size_t n)
{
    Suite *s = pscheck_suite(name);
    pscheck_add(s, cases, n);
    return pscheck_run(s);
}

/* Defines main for a suite that is only its table: the TCases follow the
 * name as struct pscheck_case initializers, and main exits with
 * EXIT_FAILURE if any test failed. */
#define PSCHECK_MAIN(name, ...)                                                \
    int main(void)                                                             \
    {                                                                          \
        const struct pscheck_case cases_[] = {__VA_ARGS__};                    \
        size_t n_ = sizeof cases_ / sizeof cases_[0];                          \
        return pscheck_main((name), cases_, n_) == 0 ? EXIT_SUCCESS : EXIT_FAILURE; \
    }

static inline int pscheck_rm_entry(const char *path, const struct stat *st, int type,
                            struct FTW *ftw)
{
    (void)st, (void)type, (void)ftw;
    return remove(path);
}

/* The temporary-directory fixture: /tmp/check_<suite>.XXXXXX, removed with
 * everything the test left in it. */
static inline void pscheck_tmp_setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/check_%s.XXXXXX", pscheck_name);
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
#ifdef PSCHECK_TMPFILE
    snprintf(tmppath, sizeof tmppath, "%s/%s", tmpdir, PSCHECK_TMPFILE);
#endif
}

static inline void pscheck_tmp_teardown(void)
{
    nftw(tmpdir, pscheck_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static const struct pscheck_opts pscheck_tmp = {pscheck_tmp_setup,
                                                pscheck_tmp_teardown, 0};

/* Writes len bytes to path, replacing what was there. */
static inline void pscheck_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

static inline void pscheck_write_text(const char *path, const char *text)
{
    pscheck_write(path, text, strlen(text));
}

/* The whole of path in a new buffer the caller frees; its size in *len. */
static inline unsigned char *pscheck_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(n > 0 ? (size_t)n : 1);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Forks a child that runs fn and returns its exit status. Limits the child
 * sets (pscheck_limit_writes) live and die with it, whether or not Check
 * forks the test itself (under valgrind it does not). */
static inline int pscheck_fork(int (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(fn());
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status), "child died (status %d)", status);
    return WEXITSTATUS(status);
}

/* Makes writes past bytes fail as on a full disk: EFBIG, SIGXFSZ ignored.
 * For a pscheck_fork child only. Returns setrlimit's result. */
static inline int pscheck_limit_writes(rlim_t bytes)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {bytes, bytes};
    return setrlimit(RLIMIT_FSIZE, &rl);
}

/* Fashion-MNIST as Debian's dataset-fashion-mnist package installs it. */
#define PSCHECK_FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* True if both files are readable; otherwise says the test is skipped. */
static inline bool pscheck_have_fmnist(const char *a, const char *b)
{
    if (access(a, R_OK) == 0 && access(b, R_OK) == 0)
        return true;
    fprintf(stderr, "skipped: %s not installed (apt install dataset-fashion-mnist)\n",
            PSCHECK_FMNIST_DIR);
    return false;
}

#endif
