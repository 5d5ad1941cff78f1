#include "common/cluster.h"
#include "common/errors.h"
#define PSCHECK_TMPFILE "spec.json"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *full_spec =
    "{\"cluster\": {\"chief\": [\"h0:2222\"],"
    " \"worker\": [\"h1:2222\", \"h2:2222\"],"
    " \"ps\": [\"h3:2222\", \"[::1]:2223\"],"
    " \"evaluator\": [\"h4:2222\"]},"
    " \"task\": {\"type\": \"worker\", \"index\": 1},"
    " \"job_id\": \"mnist-42\"}";

START_TEST(test_role_name)
{
    ck_assert_str_eq(ps_role_name(PS_ROLE_CHIEF), "chief");
    ck_assert_str_eq(ps_role_name(PS_ROLE_WORKER), "worker");
    ck_assert_str_eq(ps_role_name(PS_ROLE_PS), "ps");
    ck_assert_str_eq(ps_role_name(PS_ROLE_EVALUATOR), "evaluator");
    ck_assert_str_eq(ps_role_name(PS_ROLE_COUNT), "unknown");
}
END_TEST

START_TEST(test_role_parse)
{
    enum ps_role r = PS_ROLE_COUNT;
    for (int i = 0; i < PS_ROLE_COUNT; i++) {
        ck_assert_int_eq(ps_role_parse(ps_role_name((enum ps_role)i), &r), 0);
        ck_assert_int_eq(r, i);
    }
    ck_assert_int_eq(ps_role_parse("master", &r), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_role_parse("Worker", &r), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_role_parse("", &r), PS_EINVAL_ARG);
}
END_TEST

START_TEST(test_addr_split_ok)
{
    char host[64];
    int port = 0;
    ck_assert_int_eq(ps_addr_split("h1.example.com:2222", host, sizeof host,
                                   &port), 0);
    ck_assert_str_eq(host, "h1.example.com");
    ck_assert_int_eq(port, 2222);
    ck_assert_int_eq(ps_addr_split("[::1]:65535", host, sizeof host, &port),
                     0);
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(port, 65535);
    ck_assert_int_eq(ps_addr_split("10.0.0.1:1", host, sizeof host, &port), 0);
    ck_assert_str_eq(host, "10.0.0.1");
    ck_assert_int_eq(port, 1);
    ck_assert_int_eq(ps_addr_split("[fe80::1%eth0]:80", host, sizeof host,
                                   &port), 0);
    ck_assert_str_eq(host, "fe80::1%eth0");
}
END_TEST

START_TEST(test_addr_split_bad)
{
    char host[8];
    int port = 0;
    const char *bad[] = {
        "h1",          /* no port */
        "h1:",         /* empty port */
        ":2222",       /* no host */
        "h1:0",        /* port out of range */
        "h1:65536",    /* port out of range */
        "h1:99999999", /* port out of range, long */
        "h1:22a",      /* port not a number */
        "h1:-1",       /* port not a number */
        "::1:2222",    /* IPv6 without brackets */
        "[::1",        /* unclosed bracket */
        "[::1]2222",   /* no colon after the bracket */
        "[]:2222",     /* empty v6 host */
        "a b:2222",    /* space in host */
        "grpc://h:1",  /* a URL, not host:port */
        "verylonghost:1", /* does not fit in host[8] */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(ps_addr_split(bad[i], host, sizeof host, &port) ==
                          PS_EINVAL_ARG,
                      "'%s' was accepted", bad[i]);
    ck_assert_int_eq(ps_addr_split(NULL, host, sizeof host, &port),
                     PS_EINVAL_ARG);
}
END_TEST

START_TEST(test_parse_full)
{
    ps_cluster c;
    char err[256] = "";
    ck_assert_int_eq(ps_cluster_parse(full_spec, &c, err, sizeof err), 0);
    ck_assert_int_eq(c.n[PS_ROLE_CHIEF], 1);
    ck_assert_int_eq(c.n[PS_ROLE_WORKER], 2);
    ck_assert_int_eq(c.n[PS_ROLE_PS], 2);
    ck_assert_int_eq(c.n[PS_ROLE_EVALUATOR], 1);
    ck_assert_str_eq(c.addrs[PS_ROLE_PS][1], "[::1]:2223");
    ck_assert(c.has_task);
    ck_assert_int_eq(c.task_role, PS_ROLE_WORKER);
    ck_assert_int_eq(c.task_index, 1);
    ck_assert_str_eq(c.job_id, "mnist-42");
    ps_cluster_close(&c);
    ck_assert_int_eq(c.n[PS_ROLE_WORKER], 0);
    ck_assert_ptr_null(c.job_id);
    ps_cluster_close(&c); /* twice is harmless */
}
END_TEST

START_TEST(test_parse_minimal)
{
    ps_cluster c;
    char err[256] = "";
    /* No task, no job_id, a role left out, an empty list, TF's extra keys. */
    ck_assert_int_eq(
        ps_cluster_parse("{\"cluster\": {\"worker\": [\"localhost:1\"], "
                         "\"ps\": []}, \"rpc_layer\": \"grpc\", "
                         "\"environment\": \"cloud\"}",
                         &c, err, sizeof err), 0);
    ck_assert(!c.has_task);
    ck_assert_ptr_null(c.job_id);
    ck_assert_int_eq(c.n[PS_ROLE_WORKER], 1);
    ck_assert_int_eq(c.n[PS_ROLE_PS], 0);
    ck_assert_int_eq(c.n[PS_ROLE_CHIEF], 0);
    ps_cluster_close(&c);

    /* A task without an index is index 0. */
    ck_assert_int_eq(
        ps_cluster_parse("{\"cluster\": {\"chief\": [\"c:1\"]}, "
                         "\"task\": {\"type\": \"chief\"}}",
                         &c, err, sizeof err), 0);
    ck_assert(c.has_task);
    ck_assert_int_eq(c.task_role, PS_ROLE_CHIEF);
    ck_assert_int_eq(c.task_index, 0);
    ps_cluster_close(&c);

    /* An evaluator outside the training cluster (TensorFlow's, TFJob's). */
    ck_assert_int_eq(
        ps_cluster_parse("{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": "
                         "[\"w:1\"]}, \"task\": {\"type\": \"evaluator\", "
                         "\"index\": 0}}", &c, err, sizeof err), 0);
    ck_assert(c.has_task);
    ck_assert_int_eq(c.task_role, PS_ROLE_EVALUATOR);
    ck_assert_int_eq(c.task_index, 0);
    ck_assert_ptr_null(ps_cluster_task_address(&c, PS_ROLE_EVALUATOR, 0));
    ps_cluster_close(&c);
}
END_TEST

/* Each malformed spec, the code it must give, and the exact message. */
static const struct bad_case {
    const char *json;
    int rc;
    const char *msg;
} bad_cases[] = {
    {"{\"cluster\": {", PS_EPARSE, NULL},
    {"not json", PS_EPARSE, NULL},
    {"[1, 2]", PS_EINVAL_ARG, "the spec must be a JSON object, got a list"},
    {"{}", PS_EINVAL_ARG,
     "key 'cluster' is missing; expected {\"cluster\": {\"worker\": "
     "[\"host:port\", ...], ...}}"},
    {"{\"cluster\": [\"h:1\"]}", PS_EINVAL_ARG,
     "'cluster' must be an object mapping roles to address lists, got a "
     "list"},
    {"{\"cluster\": {\"master\": [\"h:1\"]}}", PS_EINVAL_ARG,
     "cluster has unknown role 'master'; valid roles are chief, worker, ps, "
     "evaluator"},
    {"{\"cluster\": {\"worker\": \"h:1\"}}", PS_EINVAL_ARG,
     "cluster.worker must be a list of \"host:port\" strings, got a string"},
    {"{\"cluster\": {\"worker\": [\"h:1\", 2]}}", PS_EINVAL_ARG,
     "worker[1] must be a \"host:port\" string, got an integer"},
    {"{\"cluster\": {\"ps\": [\"h3\"]}}", PS_EINVAL_ARG,
     "ps[0]: address 'h3' has no port (expected host:port)"},
    {"{\"cluster\": {\"ps\": [\"h3:70000\"]}}", PS_EINVAL_ARG,
     "ps[0]: port 70000 in 'h3:70000' is out of range 1..65535"},
    {"{\"cluster\": {\"ps\": [\"h3:0\"]}}", PS_EINVAL_ARG,
     "ps[0]: port 0 in 'h3:0' is out of range 1..65535"},
    {"{\"cluster\": {\"ps\": [\"h3:http\"]}}", PS_EINVAL_ARG,
     "ps[0]: port 'http' in 'h3:http' is not a number"},
    {"{\"cluster\": {\"ps\": [\"a:1\", \"h:2222\"], \"worker\": "
     "[\"h:2222\"]}}",
     PS_EINVAL_ARG, "ps[1] and worker[0] both use 'h:2222'"},
    {"{\"cluster\": {\"worker\": [\"H:1\", \"h:1\"]}}", PS_EINVAL_ARG,
     "worker[0] and worker[1] both use 'h:1'"},
    {"{\"cluster\": {\"chief\": [\"a:1\", \"b:1\"]}}", PS_EINVAL_ARG,
     "cluster has 2 chiefs; at most one is allowed"},
    {"{\"cluster\": {\"ps\": []}}", PS_EINVAL_ARG, "cluster lists no tasks"},
    {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
     "\"master\", \"index\": 0}}",
     PS_EINVAL_ARG,
     "task type 'master' is not a role; valid roles are chief, worker, ps, "
     "evaluator"},
    {"{\"cluster\": {\"worker\": [\"a:1\", \"b:1\"]}, \"task\": {\"type\": "
     "\"worker\", \"index\": 3}}",
     PS_EINVAL_ARG, "task worker[3] but the cluster has 2 workers"},
    {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
     "\"ps\", \"index\": 0}}",
     PS_EINVAL_ARG, "task ps[0] but the cluster has 0 ps"},
    {"{\"cluster\": {\"worker\": [\"a:1\"], \"evaluator\": [\"e:1\"]}, "
     "\"task\": {\"type\": \"evaluator\", \"index\": 1}}",
     PS_EINVAL_ARG, "task evaluator[1] but the cluster has 1 evaluator"},
    {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
     "\"worker\", \"index\": -1}}",
     PS_EINVAL_ARG, "task index -1 is negative"},
    {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
     "\"worker\", \"index\": \"0\"}}",
     PS_EINVAL_ARG, "task.index must be an integer, got a string"},
    {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"index\": 0}}",
     PS_EINVAL_ARG, "task.type is missing"},
    {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": \"worker\"}",
     PS_EINVAL_ARG,
     "'task' must be an object like {\"type\": \"worker\", \"index\": 0}, "
     "got a string"},
    {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
     "\"worker\", \"idx\": 0}}",
     PS_EINVAL_ARG, "task has unknown key 'idx'; expected type, index"},
    {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"job_id\": \"\"}", PS_EINVAL_ARG,
     "job_id must be a non-empty string, got \"\""},
    {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"job_id\": 7}", PS_EINVAL_ARG,
     "job_id must be a non-empty string, got an integer"},
    {"{\"cluster\": {\"worker\": [\"a:1\"]}, \"tsak\": {}}", PS_EINVAL_ARG,
     "unknown key 'tsak'; expected cluster, task, job_id"},
};

START_TEST(test_parse_bad)
{
    const struct bad_case *bc = &bad_cases[_i];
    ps_cluster c;
    char err[512] = "";
    int rc = ps_cluster_parse(bc->json, &c, err, sizeof err);
    ck_assert_msg(rc == bc->rc, "%s: rc %d, want %d (%s)", bc->json, rc,
                  bc->rc, err);
    if (bc->msg != NULL)
        ck_assert_str_eq(err, bc->msg);
    ck_assert_ptr_null(strchr(err, '\n'));
    ck_assert_int_eq(c.n[PS_ROLE_WORKER], 0); /* zeroed on failure */
    ck_assert_ptr_null(c.job_id);
    ps_cluster_close(&c);
}
END_TEST

START_TEST(test_parse_not_json_position)
{
    ps_cluster c;
    char err[512] = "";
    ck_assert_int_eq(ps_cluster_parse("{\"cluster\":\n  {\"worker\": [h1:1]}}",
                                      &c, err, sizeof err), PS_EPARSE);
    ck_assert_ptr_nonnull(strstr(err, "not valid JSON at line 2, column "));
    ck_assert_int_eq(ps_cluster_parse("{\"cluster\": {\"worker\": []}, "
                                      "\"cluster\": {}}",
                                      &c, err, sizeof err), PS_EPARSE);
    ck_assert_ptr_nonnull(strstr(err, "duplicate"));
    ck_assert_int_eq(ps_cluster_parse(NULL, &c, err, sizeof err),
                     PS_EINVAL_ARG);
}
END_TEST

START_TEST(test_load_file)
{
    ps_cluster c;
    char err[512] = "";
    pscheck_write_text(tmppath, full_spec);
    ck_assert_int_eq(ps_cluster_load_file(tmppath, &c, err, sizeof err), 0);
    ck_assert_int_eq(c.n[PS_ROLE_WORKER], 2);
    ps_cluster_close(&c);

    pscheck_write_text(tmppath, "{\"cluster\": {\"chief\": [\"a:1\", \"b:1\"]}}");
    ck_assert_int_eq(ps_cluster_load_file(tmppath, &c, err, sizeof err),
                     PS_EINVAL_ARG);
    char want[512];
    snprintf(want, sizeof want,
             "%s: cluster has 2 chiefs; at most one is allowed", tmppath);
    ck_assert_str_eq(err, want);

    pscheck_write_text(tmppath, "");
    ck_assert_int_eq(ps_cluster_load_file(tmppath, &c, err, sizeof err),
                     PS_EPARSE);

    ck_assert_int_eq(ps_cluster_load_file("/nonexistent/spec.json", &c, err,
                                          sizeof err), -ENOENT);
    ck_assert_str_eq(err, "/nonexistent/spec.json: No such file or directory");
}
END_TEST

START_TEST(test_load_file_large)
{
    /* A spec larger than the first read buffer. */
    size_t n = 2000;
    size_t cap = n * 32 + 64;
    char *json = malloc(cap);
    size_t len = (size_t)snprintf(json, cap, "{\"cluster\": {\"worker\": [");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(json + len, cap - len, "%s\"w%zu:2222\"",
                                i > 0 ? ", " : "", i);
    snprintf(json + len, cap - len, "]}}");
    pscheck_write_text(tmppath, json);
    free(json);
    ps_cluster c;
    char err[512] = "";
    ck_assert_int_eq(ps_cluster_load_file(tmppath, &c, err, sizeof err), 0);
    ck_assert_int_eq(c.n[PS_ROLE_WORKER], (int)n);
    ck_assert_str_eq(c.addrs[PS_ROLE_WORKER][1999], "w1999:2222");
    ps_cluster_close(&c);
}
END_TEST

START_TEST(test_from_env)
{
    ps_cluster c;
    char err[512] = "";
    unsetenv("TF_CONFIG");
    ck_assert_int_eq(ps_cluster_from_env(&c, err, sizeof err), PS_ENOTFOUND);
    ck_assert_str_eq(err, "TF_CONFIG is not set");
    setenv("TF_CONFIG", "", 1);
    ck_assert_int_eq(ps_cluster_from_env(&c, err, sizeof err), PS_ENOTFOUND);

    setenv("TF_CONFIG", full_spec, 1);
    ck_assert_int_eq(ps_cluster_from_env(&c, err, sizeof err), 0);
    ck_assert_int_eq(c.task_index, 1);
    ps_cluster_close(&c);

    setenv("TF_CONFIG", "{\"cluster\": {\"worker\": [\"a\"]}}", 1);
    ck_assert_int_eq(ps_cluster_from_env(&c, err, sizeof err), PS_EINVAL_ARG);
    ck_assert_str_eq(err, "TF_CONFIG: worker[0]: address 'a' has no port "
                          "(expected host:port)");
    unsetenv("TF_CONFIG");
}
END_TEST

START_TEST(test_close)
{
    ps_cluster c;
    memset(&c, 0, sizeof c);
    ps_cluster_close(&c);
    ps_cluster_close(NULL);
    ck_assert_int_eq(ps_cluster_parse(full_spec, &c, NULL, 0), 0);
    ps_cluster_close(&c);
    for (int r = 0; r < PS_ROLE_COUNT; r++) {
        ck_assert_ptr_null(c.addrs[r]);
        ck_assert_int_eq(c.n[r], 0);
    }
    ck_assert(!c.has_task);
}
END_TEST

START_TEST(test_task_address)
{
    ps_cluster c;
    ck_assert_int_eq(ps_cluster_parse(full_spec, &c, NULL, 0), 0);
    ck_assert_str_eq(ps_cluster_task_address(&c, PS_ROLE_WORKER, 1),
                     "h2:2222");
    ck_assert_str_eq(ps_cluster_task_address(&c, PS_ROLE_CHIEF, 0), "h0:2222");
    ck_assert_ptr_null(ps_cluster_task_address(&c, PS_ROLE_WORKER, 2));
    ck_assert_ptr_null(ps_cluster_task_address(&c, PS_ROLE_WORKER, -1));
    ck_assert_ptr_null(ps_cluster_task_address(&c, PS_ROLE_COUNT, 0));
    ck_assert_ptr_null(ps_cluster_task_address(NULL, PS_ROLE_PS, 0));
    ps_cluster_close(&c);
}
END_TEST

int main(void)
{
    const struct pscheck_case before[] = {
        {"ps_role_name", {test_role_name}},
        {"ps_role_parse", {test_role_parse}},
        {"ps_addr_split", {test_addr_split_ok, test_addr_split_bad}},
    }, after[] = {
        {"ps_cluster_load_file", {test_load_file, test_load_file_large}, &pscheck_tmp},
        {"ps_cluster_from_env", {test_from_env}},
        {"ps_cluster_close", {test_close}},
        {"ps_cluster_task_address", {test_task_address}},
    };
    Suite *s = pscheck_suite("cluster");
    pscheck_add(s, before, sizeof before / sizeof before[0]);
    /* One run of test_parse_bad per malformed spec in bad_cases. */
    TCase *tc = PSCHECK_TCASE(s, NULL, "ps_cluster_parse", test_parse_full,
                              test_parse_minimal);
    tcase_add_loop_test(tc, test_parse_bad, 0,
                        (int)(sizeof bad_cases / sizeof bad_cases[0]));
    tcase_add_test(tc, test_parse_not_json_position);
    pscheck_add(s, after, sizeof after / sizeof after[0]);
    return pscheck_run(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
