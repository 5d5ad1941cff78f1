/* The Prometheus page writer and histogram (common/metrics.h), and the
 * /metrics endpoint over a real socket (common/metrics_http.h). */
#include "common/metrics.h"
#include "common/metrics_http.h"

#include "common/errors.h"
#include "tests/unit/pscheck.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

static const char *text(ps_metrics *m)
{
    ck_assert_int_eq(ps_metrics_error(m), 0);
    return ps_metrics_text(m, NULL);
}

START_TEST(test_counter)
{
    ps_metrics m;
    ps_metrics_init(&m);
    ck_assert_str_eq(ps_metrics_text(&m, NULL), "");
    ps_metrics_counter(&m, "ps_things_total", "Things seen, with a \\ and a\nnewline.",
                       42);
    ck_assert_str_eq(text(&m),
                     "# HELP ps_things_total Things seen, with a \\\\ and a\\nnewline.\n"
                     "# TYPE ps_things_total counter\n"
                     "ps_things_total 42\n");
    ps_metrics_close(&m);
}
END_TEST

START_TEST(test_sample_labels)
{
    ps_metrics m;
    ps_metrics_init(&m);
    ps_metrics_family(&m, "ps_temp_celsius", PS_METRIC_GAUGE, "A \"quoted\" help.");
    ps_metrics_sample(&m, 1.5, "path", "a\"b\\c\nd", "method", "Push", NULL);
    ps_metrics_sample(&m, -0.25, NULL);
    ck_assert_str_eq(text(&m),
                     "# HELP ps_temp_celsius A \"quoted\" help.\n"
                     "# TYPE ps_temp_celsius gauge\n"
                     "ps_temp_celsius{path=\"a\\\"b\\\\c\\nd\",method=\"Push\"} 1.5\n"
                     "ps_temp_celsius -0.25\n");
    ps_metrics_close(&m);
}
END_TEST

START_TEST(test_values)
{
    static const double rows[] = {0, -0.0, 7, 1e15, 0.1, 1e-05, 2.5e-4, 1.0 / 3,
                                  123456.789, 1e300, -2e-300};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        ps_metrics m;
        ps_metrics_init(&m);
        ps_metrics_gauge(&m, "g", "", rows[i]);
        const char *t = text(&m);
        const char *line = strstr(t, "\ng ");
        ck_assert_ptr_nonnull(line);
        /* Whatever the form, it reads back as the same double. */
        ck_assert_msg(strtod(line + 3, NULL) == rows[i], "%s", line);
        ps_metrics_close(&m);
    }
    ps_metrics m;
    ps_metrics_init(&m);
    ps_metrics_family(&m, "g", PS_METRIC_GAUGE, "h");
    ps_metrics_sample(&m, NAN, NULL);
    ps_metrics_sample(&m, INFINITY, NULL);
    ps_metrics_sample(&m, -INFINITY, NULL);
    ps_metrics_sample(&m, 0.1, NULL);
    ck_assert_str_eq(text(&m), "# HELP g h\n# TYPE g gauge\ng NaN\ng +Inf\ng -Inf\ng 0.1\n");
    ps_metrics_close(&m);
}
END_TEST

/* Each misuse records PS_EINVAL_ARG and writes no sample. */
START_TEST(test_misuse)
{
    ps_metrics m;
    ps_metrics_init(&m);
    ps_metrics_sample(&m, 1, NULL); /* before any family */
    ck_assert_int_eq(ps_metrics_error(&m), PS_EINVAL_ARG);
    ps_metrics_close(&m);

    ps_metrics_init(&m);
    ps_metrics_counter(&m, "ps_things", "no _total", 1);
    ck_assert_int_eq(ps_metrics_error(&m), PS_EINVAL_ARG);
    ck_assert_str_eq(ps_metrics_text(&m, NULL), "");
    ps_metrics_close(&m);

    const char *bad_names[] = {"ps_gauge_total", "1abc", "a-b", "", "é"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        ps_metrics_init(&m);
        ps_metrics_gauge(&m, bad_names[i], "h", 1);
        ck_assert_int_eq(ps_metrics_error(&m), PS_EINVAL_ARG);
        ps_metrics_close(&m);
    }

    const char *bad_labels[] = {"le", "__x", "a:b", "9", "a b"};
    for (size_t i = 0; i < sizeof bad_labels / sizeof bad_labels[0]; i++) {
        ps_metrics_init(&m);
        ps_metrics_family(&m, "g", PS_METRIC_GAUGE, "h");
        ps_metrics_sample(&m, 1, bad_labels[i], "v", NULL);
        ck_assert_int_eq(ps_metrics_error(&m), PS_EINVAL_ARG);
        ck_assert_ptr_null(strstr(ps_metrics_text(&m, NULL), "\ng"));
        ps_metrics_close(&m);
    }

    ps_histogram h;
    double b[] = {1};
    ck_assert_int_eq(ps_histogram_init(&h, b, 1), 0);
    ps_metrics_init(&m);
    ps_metrics_family(&m, "g", PS_METRIC_GAUGE, "h");
    ps_metrics_histogram(&m, &h, NULL); /* not a histogram family */
    ck_assert_int_eq(ps_metrics_error(&m), PS_EINVAL_ARG);
    ps_metrics_close(&m);
    ps_metrics_init(&m);
    ps_metrics_family(&m, "h_seconds", PS_METRIC_HISTOGRAM, "h");
    ps_metrics_sample(&m, 1, NULL); /* a plain sample in a histogram */
    ck_assert_int_eq(ps_metrics_error(&m), PS_EINVAL_ARG);
    ps_metrics_close(&m);
}
END_TEST

START_TEST(test_histogram_init)
{
    ps_histogram h;
    double unsorted[] = {1, 0.5}, same[] = {1, 1}, nan[] = {NAN}, inf[] = {INFINITY};
    double many[PS_HISTOGRAM_MAX_BOUNDS + 1];
    for (int i = 0; i <= PS_HISTOGRAM_MAX_BOUNDS; i++)
        many[i] = i;
    ck_assert_int_eq(ps_histogram_init(&h, unsorted, 2), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_histogram_init(&h, same, 2), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_histogram_init(&h, nan, 1), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_histogram_init(&h, inf, 1), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_histogram_init(&h, many, 0), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_histogram_init(&h, many, PS_HISTOGRAM_MAX_BOUNDS + 1), PS_EINVAL_ARG);
    ck_assert_int_eq(ps_histogram_init(&h, many, PS_HISTOGRAM_MAX_BOUNDS), 0);
    ck_assert_int_eq(ps_histogram_init(&h, ps_latency_bounds, PS_LATENCY_NBOUNDS), 0);
    ck_assert_int_eq(ps_histogram_init(&h, ps_long_bounds, PS_LONG_NBOUNDS), 0);
    ck_assert_uint_eq(ps_histogram_count(&h), 0);
    ck_assert(ps_histogram_sum(&h) == 0.0);
}
END_TEST

/* Buckets are cumulative, a bound is inclusive (le), +Inf equals _count. */
START_TEST(test_histogram_text)
{
    static const double bounds[] = {0.25, 1, 10};
    ps_histogram h;
    ck_assert_int_eq(ps_histogram_init(&h, bounds, 3), 0);
    const double obs[] = {0.125, 0.25, 0.5, 5, 50, 50, NAN}; /* sums exactly */
    for (size_t i = 0; i < sizeof obs / sizeof obs[0]; i++)
        ps_histogram_observe(&h, obs[i]);
    ck_assert_uint_eq(ps_histogram_count(&h), 6); /* NaN ignored */
    ck_assert(ps_histogram_sum(&h) == 105.875);

    ps_metrics m;
    ps_metrics_init(&m);
    ps_metrics_family(&m, "ps_wait_seconds", PS_METRIC_HISTOGRAM, "Waits.");
    ps_metrics_histogram(&m, &h, "method", "Pull", NULL);
    ps_histogram e;
    ck_assert_int_eq(ps_histogram_init(&e, bounds, 1), 0);
    ps_metrics_histogram(&m, &e, NULL);
    ck_assert_str_eq(text(&m),
                     "# HELP ps_wait_seconds Waits.\n"
                     "# TYPE ps_wait_seconds histogram\n"
                     "ps_wait_seconds_bucket{method=\"Pull\",le=\"0.25\"} 2\n"
                     "ps_wait_seconds_bucket{method=\"Pull\",le=\"1\"} 3\n"
                     "ps_wait_seconds_bucket{method=\"Pull\",le=\"10\"} 4\n"
                     "ps_wait_seconds_bucket{method=\"Pull\",le=\"+Inf\"} 6\n"
                     "ps_wait_seconds_sum{method=\"Pull\"} 105.875\n"
                     "ps_wait_seconds_count{method=\"Pull\"} 6\n"
                     "ps_wait_seconds_bucket{le=\"0.25\"} 0\n"
                     "ps_wait_seconds_bucket{le=\"+Inf\"} 0\n"
                     "ps_wait_seconds_sum 0\n"
                     "ps_wait_seconds_count 0\n");
    ps_metrics_close(&m);
}
END_TEST

#define OBSERVERS 4
#define EACH 100000

static void *observe_many(void *arg)
{
    ps_histogram *h = arg;
    for (int i = 0; i < EACH; i++)
        ps_histogram_observe(h, (i % 4) * 0.5); /* 0, 0.5, 1, 1.5 */
    return NULL;
}

/* Threads observing at once lose nothing: every count and the whole sum. */
START_TEST(test_histogram_threads)
{
    static const double bounds[] = {0.25, 1.25};
    ps_histogram h;
    ck_assert_int_eq(ps_histogram_init(&h, bounds, 2), 0);
    pthread_t th[OBSERVERS];
    for (int i = 0; i < OBSERVERS; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, observe_many, &h), 0);
    for (int i = 0; i < OBSERVERS; i++)
        pthread_join(th[i], NULL);
    ck_assert_uint_eq(ps_histogram_count(&h), (uint64_t)OBSERVERS * EACH);
    ck_assert_uint_eq(atomic_load(&h.counts[0]), (uint64_t)OBSERVERS * EACH / 4);
    ck_assert_uint_eq(atomic_load(&h.counts[1]), (uint64_t)OBSERVERS * EACH / 2);
    ck_assert_uint_eq(atomic_load(&h.counts[2]), (uint64_t)OBSERVERS * EACH / 4);
    /* Sums of multiples of 0.5 below 2^52 are exact in a double. */
    ck_assert(ps_histogram_sum(&h) == 0.75 * OBSERVERS * EACH);
}
END_TEST

/* ---- the endpoint ------------------------------------------------------ */

static void collect(ps_metrics *m, void *ctx)
{
    int *scrapes = ctx;
    ps_metrics_counter(m, "test_scrapes_total", "Scrapes.", ++*scrapes);
}

static void collect_bad(ps_metrics *m, void *ctx)
{
    (void)ctx;
    ps_metrics_counter(m, "test_scrapes", "No _total.", 1);
}

/* Sends req to 127.0.0.1:port and returns the whole answer (malloc'd). */
static char *http(int port, const char *req)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    shutdown(fd, SHUT_WR);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t n;
    while (len + 1 < cap && (n = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    buf[len] = '\0';
    close(fd);
    return buf;
}

/* The answer to req has status (its first line "HTTP/1.x <status> ...")
 * and holds has. */
static void expect(int port, const char *req, const char *status, const char *has)
{
    char *got = http(port, req);
    ck_assert_msg(strncmp(got, "HTTP/1.", 7) == 0 && strncmp(got + 9, status, 3) == 0 &&
                  strstr(got, has) != NULL, "%s -> %s", req, got);
    free(got);
}

START_TEST(test_http)
{
    int scrapes = 0;
    char err[256];
    ps_metrics_http *h;
    ck_assert_int_eq(ps_metrics_http_start("127.0.0.1:0", NULL, collect, &scrapes, &h, err,
                                           sizeof err), 0);
    int port = ps_metrics_http_port(h);
    ck_assert_int_gt(port, 0);
    expect(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
           "200", "\r\n\r\n# HELP test_scrapes_total Scrapes.\n"
           "# TYPE test_scrapes_total counter\ntest_scrapes_total 1\n");
    expect(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n", "200",
           "text/plain; version=0.0.4");
    expect(port, "GET / HTTP/1.0\r\n\r\n", "404", "/metrics");
    expect(port, "POST /metrics HTTP/1.0\r\nContent-Length: 2\r\n\r\nab", "405",
           "GET, HEAD");
    expect(port, "GET /metrics HTTP/1.1\r\n\r\n", "400", ""); /* no Host */
    expect(port, "GET /metrics HTTP/1.0\r\n\r\n", "200", "test_scrapes_total 3\n");

    /* The port taken: refused, naming the address. */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    ps_metrics_http *h2 = NULL;
    ck_assert_int_eq(ps_metrics_http_start(addr, NULL, collect, &scrapes, &h2, err, sizeof err),
                     -EADDRINUSE);
    ck_assert_msg(strstr(err, addr) != NULL, "%s", err);
    ps_metrics_http_stop(h);
    ps_metrics_http_stop(NULL);

    /* Stopped, the port is free again. */
    ck_assert_int_eq(ps_metrics_http_start(addr, NULL, collect_bad, NULL, &h, err, sizeof err), 0);
    expect(port, "GET /metrics HTTP/1.0\r\n\r\n", "500", "conventions");
    ps_metrics_http_stop(h);
}
END_TEST

START_TEST(test_http_listen)
{
    const char *bad[] = {"nohost", ":80", "127.0.0.1:", "127.0.0.1:65536", "::1:80",
                         "127.0.0.1:8x", "[::1]80"};
    char err[256];
    ps_metrics_http *h;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(ps_metrics_http_start(bad[i], NULL, collect, NULL, &h, err, sizeof err),
                         PS_EINVAL_ARG);
        ck_assert_msg(strstr(err, bad[i]) != NULL, "%s", err);
    }
    ck_assert(ps_metrics_http_off(NULL));
    ck_assert(ps_metrics_http_off(""));
    ck_assert(ps_metrics_http_off("off"));
    ck_assert(!ps_metrics_http_off("127.0.0.1:0"));
    /* IPv6 loopback, where the host has it. */
    int rc = ps_metrics_http_start("[::1]:0", NULL, collect, NULL, &h, err, sizeof err);
    if (rc == 0) {
        ck_assert_int_gt(ps_metrics_http_port(h), 0);
        ps_metrics_http_stop(h);
    }
}
END_TEST

/* A file of lines for --metrics-auth, with mode; its path (a static
 * buffer, removed by the caller). */
static const char *auth_file(const char *text, mode_t mode)
{
    static char path[] = "/tmp/check-metrics-auth-XXXXXX";
    strcpy(path + sizeof path - 7, "XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    ck_assert_int_eq(fchmod(fd, mode), 0);
    close(fd);
    return path;
}

/* Basic auth: 401 with WWW-Authenticate and no scrape without the right
 * user and password, 200 with them, in the clear or as a SHA-256. */
START_TEST(test_http_auth)
{
    int scrapes = 0;
    char err[256];
    ps_metrics_http *h;
    ps_metrics_http_conf conf = {.auth = (char *)auth_file("# who\nu:pw\n", 0600)};
    ck_assert_int_eq(ps_metrics_http_start("127.0.0.1:0", &conf, collect, &scrapes, &h,
                                           err, sizeof err), 0);
    unlink(conf.auth);
    int port = ps_metrics_http_port(h);
    expect(port, "GET /metrics HTTP/1.0\r\n\r\n", "401", "WWW-Authenticate: Basic");
    expect(port, "GET /metrics HTTP/1.0\r\nAuthorization: Basic dTpubw==\r\n\r\n", "401",
           "--metrics-auth");
    ck_assert_int_eq(scrapes, 0);
    expect(port, "GET /metrics HTTP/1.0\r\nAuthorization: Basic dTpwdw==\r\n\r\n", "200",
           "test_scrapes_total 1\n");
    ps_metrics_http_stop(h);

    conf.auth = (char *)auth_file("u:sha256:30c952fab122c3f9759f02a6d95c3758b246b4fee23995"
                                  "7b2d4fee46e26170c4\n", 0644);
    ck_assert_int_eq(ps_metrics_http_start("127.0.0.1:0", &conf, collect, &scrapes, &h,
                                           err, sizeof err), 0);
    unlink(conf.auth);
    expect(ps_metrics_http_port(h),
           "GET /metrics HTTP/1.0\r\nAuthorization: Basic dTpwdw==\r\n\r\n", "200",
           "test_scrapes_total 2\n");
    ps_metrics_http_stop(h);

    /* Refused: passwords in the clear others may read, a file others may
     * write, a bad line, half a TLS pair. */
    const struct {
        const char *text;
        mode_t mode;
        const char *why;
    } bad[] = {{"u:pw\n", 0644, "chmod 600"}, {"u:sha256:00\n", 0600, "64 hex digits"},
               {"u:pw\n", 0620, "chmod go-w"}, {"nocolon\n", 0600, ":1:"},
               {"# none\n", 0600, "no users"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        conf.auth = (char *)auth_file(bad[i].text, bad[i].mode);
        ck_assert_int_eq(ps_metrics_http_start("127.0.0.1:0", &conf, collect, NULL, &h, err,
                                               sizeof err), PS_EINVAL_ARG);
        ck_assert_msg(strstr(err, bad[i].why) != NULL && strstr(err, conf.auth) != NULL,
                      "%s", err);
        unlink(conf.auth);
    }
    ps_metrics_http_conf half = {.tls_cert = "/nonexistent.pem"};
    ck_assert_int_eq(ps_metrics_http_start("127.0.0.1:0", &half, collect, NULL, &h, err,
                                           sizeof err), PS_EINVAL_ARG);
    ck_assert_msg(strstr(err, "without --metrics-tls-key") != NULL, "%s", err);
}
END_TEST

/* A client that trickles its request a byte at a time (so the idle timeout
 * never fires) is cut at the request deadline (5 s). */
START_TEST(test_http_deadline)
{
    char err[256];
    ps_metrics_http *h;
    ck_assert_int_eq(ps_metrics_http_start("127.0.0.1:0", NULL, collect_bad, NULL, &h, err,
                                           sizeof err), 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)ps_metrics_http_port(h))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {0, 300000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-a: aaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    int closed_after = -1;
    for (int i = 0; req[i] != '\0' && closed_after < 0; i++) {
        char c;
        if (send(fd, &req[i], 1, MSG_NOSIGNAL) != 1 || read(fd, &c, 1) == 0)
            closed_after = i;
    }
    close(fd);
    ps_metrics_http_stop(h);
    /* 0.3 s a byte: cut between 5 and about 7 s in, so after 16 to 24 bytes. */
    ck_assert_msg(closed_after >= 15 && closed_after <= 25, "cut after %d bytes",
                  closed_after);
}
END_TEST

PSCHECK_MAIN("metrics",
    {"ps_metrics_counter", {test_counter}},
    {"ps_metrics_sample", {test_sample_labels, test_values, test_misuse}},
    {"ps_histogram_init", {test_histogram_init}},
    {"ps_metrics_histogram", {test_histogram_text, test_histogram_threads}},
    {"ps_metrics_http_start", {test_http, test_http_listen, test_http_auth,
                               test_http_deadline}})
