#include "common/errors.h"
#include "common/log.h"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs fn with stderr redirected to a pipe and returns what it wrote. */
static char captured[32768];
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
    size_t got = 0;
    ssize_t n;
    while (got < sizeof captured - 1 &&
           (n = read(fds[0], captured + got, sizeof captured - 1 - got)) > 0)
        got += (size_t)n;
    captured[got] = '\0';
    close(fds[0]);
}

/* Line i (from 0) of what was captured, parsed by jansson (the oracle):
 * the line must be one JSON object. Free with json_decref. */
static json_t *json_line(int i)
{
    const char *p = captured;
    for (int k = 0; k < i; k++) {
        p = strchr(p, '\n');
        ck_assert_ptr_nonnull(p);
        p++;
    }
    const char *end = strchr(p, '\n');
    ck_assert_msg(end != NULL, "line %d has no newline", i);
    json_error_t jerr;
    json_t *o = json_loadb(p, (size_t)(end - p), 0, &jerr);
    ck_assert_msg(o != NULL, "line %d is not JSON (%s): %.*s", i, jerr.text,
                  (int)(end - p), p);
    ck_assert(json_is_object(o));
    return o;
}

static const char *str_member(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_string(v), "member %s is not a string", key);
    return json_string_value(v);
}

/* Line i of what was captured has these string members: (name, value)
 * pairs, ended by NULL. */
static void expect_strings(int i, ...)
{
    json_t *o = json_line(i);
    va_list ap;
    va_start(ap, i);
    for (const char *k; (k = va_arg(ap, const char *)) != NULL;)
        ck_assert_str_eq(str_member(o, k), va_arg(ap, const char *));
    va_end(ap);
    json_decref(o);
}

static int count_lines(void)
{
    int n = 0;
    for (const char *p = captured; (p = strchr(p, '\n')) != NULL; p++)
        n++;
    return n;
}

/* Captures fn's lines, checks that there are n, and returns the first as
 * JSON (the caller drops it). */
static json_t *capture_json(void (*fn)(void), int n)
{
    capture(fn);
    ck_assert_int_eq(count_lines(), n);
    return json_line(0);
}

static void emit_info_and_debug(void)
{
    ps_log_set_format(PS_LOG_TEXT);
    ps_log_init("/usr/bin/testprog", PS_LOG_INFO);
    ps_log_info("hello %d", 42);
    ps_log_debug("hidden %d", 1);
}

static void emit_err(void)
{
    ps_log_set_format(PS_LOG_TEXT);
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

static void emit_json(void)
{
    ps_log_set_format(PS_LOG_JSON);
    ps_log_init("/usr/sbin/psd", PS_LOG_INFO);
    ps_log_set_task(NULL, -1);
    ps_log_info("no task yet");
    ps_log_set_task("ps", 3);
    ps_log_warn("serving %d", 7);
    ps_log_debug("hidden");
    ps_log_err(PS_ENOTFOUND, "variable '%s'", "w1");
    ps_log_set_task("chief", -1);
    ps_log_info("the chief");
}

/* One object per line with the line's own members. */
START_TEST(test_json_members)
{
    json_t *o = capture_json(emit_json, 4);
    const char *t = str_member(o, "time");
    /* RFC 3339 in UTC with milliseconds: 2026-11-21T23:59:01.123Z */
    ck_assert_uint_eq(strlen(t), 24);
    ck_assert(t[4] == '-' && t[10] == 'T' && t[19] == '.' && t[23] == 'Z');
    ck_assert_str_eq(str_member(o, "level"), "info");
    ck_assert_str_eq(str_member(o, "daemon"), "psd");
    ck_assert_int_eq(json_integer_value(json_object_get(o, "pid")), getpid());
    ck_assert_str_eq(str_member(o, "event"), "no task yet");
    ck_assert_ptr_null(json_object_get(o, "task"));
    ck_assert_ptr_null(json_object_get(o, "error"));
    json_decref(o);
    expect_strings(1, "level", "warn", "task", "ps3", "event", "serving 7", NULL);
    expect_strings(2, "level", "error", "event", "variable 'w1'", "error", "not found",
                   NULL);
    expect_strings(3, "task", "chief", NULL);
}
END_TEST

static void emit_escapes(void)
{
    ps_log_set_format(PS_LOG_JSON);
    ps_log_init("psd", PS_LOG_INFO);
    /* quote, backslash, newline, tab, a control byte, UTF-8 (é, €, 😀),
     * then bytes that are not UTF-8: a stray continuation, a cut sequence,
     * an overlong '/', a surrogate. */
    ps_log_info("a\"b\\c\nd\te\x01" "f \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 "
                "\x80|\xe2\x82|\xc0\xaf|\xed\xa0\x80|");
}

START_TEST(test_json_escapes)
{
    json_t *o = capture_json(emit_escapes, 1);
    ck_assert_str_eq(str_member(o, "event"),
                     "a\"b\\c\nd\te\x01" "f \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 "
                     "\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd|"
                     "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|");
    json_decref(o);
}
END_TEST

static void emit_fields(void)
{
    ps_log_set_format(PS_LOG_JSON);
    ps_log_init("psd", PS_LOG_INFO);
    ps_log_set_task("worker", 1);
    ps_log_event(PS_LOG_INFO, 0,
                 PS_LOG_FIELDS(PS_LOG_STR("variable", "w\"1\n"),
                               PS_LOG_INT("delta", -5),
                               PS_LOG_UINT("step", 4000000000ULL),
                               PS_LOG_NUM("loss", 0.25), PS_LOG_NUM("nan", NAN),
                               PS_LOG_BOOL("durable", true),
                               PS_LOG_STR("none", NULL)),
                 "pushed %s", "w1");
    ps_log_event(PS_LOG_ERROR, -2, PS_LOG_FIELDS(PS_LOG_STR("path", "/x")),
                 "cannot open");
    ps_log_event(PS_LOG_DEBUG, 0, PS_LOG_FIELDS(PS_LOG_INT("n", 1)), "hidden");
}

START_TEST(test_json_fields)
{
    json_t *o = capture_json(emit_fields, 2);
    ck_assert_str_eq(str_member(o, "event"), "pushed w1");
    ck_assert_str_eq(str_member(o, "task"), "worker1");
    ck_assert_str_eq(str_member(o, "variable"), "w\"1\n");
    ck_assert_int_eq(json_integer_value(json_object_get(o, "delta")), -5);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "step")), 4000000000LL);
    ck_assert(fabs(json_number_value(json_object_get(o, "loss")) - 0.25) < 1e-12);
    ck_assert(json_is_null(json_object_get(o, "nan")));
    ck_assert(json_is_true(json_object_get(o, "durable")));
    ck_assert(json_is_null(json_object_get(o, "none")));
    json_decref(o);
    expect_strings(1, "level", "error", "error", "No such file or directory", "path", "/x",
                   NULL);
}
END_TEST

/* A message far longer than a line holds, all of it needing escapes: the
 * line is cut inside the string and stays one valid object. */
static void emit_long(void)
{
    static char big[6000];
    memset(big, '"', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ps_log_set_format(PS_LOG_JSON);
    ps_log_init("psd", PS_LOG_INFO);
    ps_log_event(PS_LOG_INFO, 0, PS_LOG_FIELDS(PS_LOG_STR("v", big)), "%s%s",
                 big, big);
    memset(big, 0x01, sizeof big - 1); /* each byte \u0001: six bytes */
    ps_log_info("%s", big);
}

START_TEST(test_json_long_line)
{
    json_t *o = capture_json(emit_long, 2);
    const char *ev = str_member(o, "event");
    ck_assert_uint_gt(strlen(ev), 1000);
    ck_assert(strspn(ev, "\"") == strlen(ev));
    json_decref(o);
    o = json_line(1);
    ev = str_member(o, "event");
    ck_assert_uint_gt(strlen(ev), 500);
    ck_assert(strspn(ev, "\x01") == strlen(ev));
    json_decref(o);
}
END_TEST

static void emit_text_fields(void)
{
    ps_log_set_format(PS_LOG_TEXT);
    ps_log_init("psd", PS_LOG_INFO);
    ps_log_set_task("ps", 0);
    ps_log_event(PS_LOG_INFO, 0,
                 PS_LOG_FIELDS(PS_LOG_STR("variable", "w1"),
                               PS_LOG_STR("path", "a b"), PS_LOG_INT("step", 12),
                               PS_LOG_BOOL("ok", false)),
                 "checkpoint");
    ps_log_event(PS_LOG_ERROR, PS_ENOTFOUND,
                 PS_LOG_FIELDS(PS_LOG_STR("variable", "w2")), "pull");
}

/* Text lines keep their shape: fields follow as key=value, the task is
 * JSON's alone. */
START_TEST(test_text_fields)
{
    capture(emit_text_fields);
    ck_assert_ptr_nonnull(strstr(captured, " INFO checkpoint variable=w1 "
                                           "path=\"a b\" step=12 ok=false\n"));
    ck_assert_ptr_nonnull(strstr(captured, " ERROR pull: not found variable=w2\n"));
    ck_assert_ptr_null(strstr(captured, "ps0"));
    ck_assert_ptr_nonnull(strstr(captured, "psd["));
}
END_TEST

PSCHECK_MAIN("log",
    {"ps_log_write", {test_level_filters, test_err_appends_text, test_json_members,
                      test_json_escapes, test_json_long_line}},
    {"ps_log_event", {test_json_fields, test_text_fields}},
    {"ps_log_level_parse", {test_level_parse}})
