/* check_tls: TLS options, files, credentials and the loopback rule
 * (common/tls.c). The handshakes themselves are tests/integration/test_tls.py's. */
#include "common/tls.h"

#define PSCHECK_TMPFILE "x.pem"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <stdio.h>
#include <string.h>

/* A real P-256 certificate (CN=check, valid until 2126), its key, and
 * another key: tls.c checks that a key is its certificate's. */
static const char *const test_cert =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBdjCCAR2gAwIBAgIUJdajgrigwGYOhY1rpo3eHx32yLowCgYIKoZIzj0EAwIw\n"
    "EDEOMAwGA1UEAwwFY2hlY2swIBcNMjYxMTIzMjM0MjI0WhgPMjEyNjEwMzAyMzQy\n"
    "MjRaMBAxDjAMBgNVBAMMBWNoZWNrMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n"
    "X+O3+kQTomqpIiPoEXK30D32Ckx4FLVgn0T0zeDHsW1/5V9d8VYKzyU48MPRKcbc\n"
    "DIYXMQldyBxVzx/dSZQ9oqNTMFEwHQYDVR0OBBYEFDYoESn6yhClv6gRRyfenc+R\n"
    "b/rHMB8GA1UdIwQYMBaAFDYoESn6yhClv6gRRyfenc+Rb/rHMA8GA1UdEwEB/wQF\n"
    "MAMBAf8wCgYIKoZIzj0EAwIDRwAwRAIgVusRqmW8wZA3CfubnN/Y7HrNZfqx7osj\n"
    "qotvPS6V7rACICj5ZnzmM3tMLEzbRcb6G7sj1d041mCPLDTpF0OgiCh3\n"
    "-----END CERTIFICATE-----\n";
static const char *const test_key =
    "-----BEGIN PRIVATE KEY-----\n"
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgrO6HQr5ioKHWeZN4\n"
    "6bdq5/DD80umt1+kQcHp4qFw7ZihRANCAARf47f6RBOiaqkiI+gRcrfQPfYKTHgU\n"
    "tWCfRPTN4MexbX/lX13xVgrPJTjww9EpxtwMhhcxCV3IHFXPH91JlD2i\n"
    "-----END PRIVATE KEY-----\n";
static const char *const other_key =
    "-----BEGIN PRIVATE KEY-----\n"
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgClTB6N4e0Uo19uLL\n"
    "RzkiIiIBhNw8NKwIN7mCQjlQGpChRANCAARPrMfjRQWuLDP716yojZFQAUu8m94Z\n"
    "ai+nWTaYMxwHnq0zJjPfNK54DqShsYlJcoPR4kpUYz27xd3xwSD47MJX\n"
    "-----END PRIVATE KEY-----\n";
static const char *const fake_cert =
    "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";

#define PATH_CAP 160
static char cert[PATH_CAP], key[PATH_CAP], ca[PATH_CAP], junk[PATH_CAP], other[PATH_CAP],
    fake[PATH_CAP];

/* Each file the tests read, in a new temporary directory: its path, name
 * and contents. */
static void setup(void)
{
    pscheck_tmp_setup();
    const struct {
        char *path;
        const char *name, *text;
    } f[] = {
        {cert, "c.pem", test_cert},  {key, "c.key", test_key},
        {ca, "ca.pem", test_cert},   {junk, "junk.pem", "not pem\n"},
        {other, "other.key", other_key}, {fake, "fake.pem", fake_cert},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        snprintf(f[i].path, PATH_CAP, "%s/%s", tmpdir, f[i].name);
        pscheck_write_text(f[i].path, f[i].text);
    }
}

static void teardown(void)
{
    pscheck_tmp_teardown();
}

static const struct pscheck_opts files = {setup, teardown, 0};

START_TEST(test_check_listen)
{
    char err[512];
    ps_tls_opts none = {0}, tls = {.cert = "c.pem", .key = "c.key"};
    static const char *const ok[] = {"127.0.0.1:0", "127.1.2.3:7070", "localhost:7070",
                                     "[::1]:0", "unix:/tmp/psd.sock",
                                     "unix-abstract:psd", NULL};
    for (int i = 0; ok[i] != NULL; i++)
        ck_assert_msg(ps_tls_check_listen(ok[i], &none, false, err, sizeof err) == 0,
                      "%s should be loopback", ok[i]);
    static const char *const net[] = {"0.0.0.0:7070", "[::]:0", ":7070",
                                      "10.1.2.3:7070", NULL};
    for (int i = 0; net[i] != NULL; i++) {
        ck_assert_int_eq(ps_tls_check_listen(net[i], &none, false, err, sizeof err), -1);
        ck_assert_ptr_nonnull(strstr(err, net[i]));
        ck_assert_ptr_nonnull(strstr(err, "--insecure"));
        ck_assert_ptr_nonnull(strstr(err, "--tls-cert"));
        ck_assert_int_eq(ps_tls_check_listen(net[i], &none, true, err, sizeof err), 0);
        ck_assert_int_eq(ps_tls_check_listen(net[i], &tls, false, err, sizeof err), 0);
    }
    ck_assert_int_eq(ps_tls_check_listen("0.0.0.0:1", NULL, false, err, sizeof err), -1);
}
END_TEST

START_TEST(test_modes)
{
    ps_tls_opts none = {0}, tls = {.cert = "c", .key = "k"},
                mtls = {.cert = "c", .key = "k", .ca = "a"}, client = {.ca = "a"};
    ck_assert_str_eq(ps_tls_server_mode(NULL), "plaintext");
    ck_assert_str_eq(ps_tls_server_mode(&none), "plaintext");
    ck_assert_str_eq(ps_tls_server_mode(&tls), "tls");
    ck_assert_str_eq(ps_tls_server_mode(&mtls), "mtls");
    ck_assert(!ps_tls_client_enabled(&none));
    ck_assert(ps_tls_client_enabled(&client));
    ck_assert(ps_tls_client_enabled(&tls));
    ck_assert(!ps_tls_server_enabled(&client));
    ck_assert(ps_tls_is_unix("unix:/x") && ps_tls_is_unix("unix-abstract:x"));
    ck_assert(!ps_tls_is_unix("unixhost:7070") && !ps_tls_is_unix("127.0.0.1:1"));
    ps_tls_conf c = {.cert = "c", .ca = "a", .target_name = "ps0"};
    ps_tls_opts o = ps_tls_opts_of(&c);
    ck_assert(o.require_client_cert);
    ck_assert_str_eq(ps_tls_target_name(&o), "ps0");
    ck_assert_ptr_null(ps_tls_target_name(&none));
}
END_TEST

START_TEST(test_check_files)
{
    char err[512];
    ps_tls_opts good = {.cert = cert, .key = key, .ca = ca};
    ck_assert_int_eq(ps_tls_check_files(&good, err, sizeof err), 0);
    ck_assert_int_eq(ps_tls_check_files(NULL, err, sizeof err), 0);
    /* Each refused, its message equal to `is` or holding `has` and `names`. */
    const struct {
        ps_tls_opts o;
        const char *is, *has, *names;
    } bad[] = {
        {{.cert = cert, .key = key, .ca = "/nonexistent/ca.pem"},
         "--tls-ca /nonexistent/ca.pem: No such file or directory", NULL, NULL},
        {{.cert = junk, .key = key}, NULL, "holds no PEM CERTIFICATE", junk},
        {{.cert = key, .key = cert}, NULL, NULL, NULL},
        {{.cert = cert, .key = other}, NULL, "is not the key of --tls-cert", other},
        {{.cert = fake, .key = key}, NULL, "cannot be parsed", NULL},
        {{.cert = cert}, "--tls-cert is given without --tls-key", NULL, NULL},
        {{.key = key}, NULL, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(ps_tls_check_files(&bad[i].o, err, sizeof err), -1);
        if (bad[i].is != NULL)
            ck_assert_str_eq(err, bad[i].is);
        if (bad[i].has != NULL)
            ck_assert_ptr_nonnull(strstr(err, bad[i].has));
        if (bad[i].names != NULL)
            ck_assert_ptr_nonnull(strstr(err, bad[i].names));
    }
}
END_TEST

START_TEST(test_creds)
{
    char err[512];
    grpc_init();
    grpc_server_credentials *s = ps_tls_server_creds(NULL, err, sizeof err);
    ck_assert_ptr_nonnull(s);
    grpc_server_credentials_release(s);
    ps_tls_opts good = {.cert = cert, .key = key, .ca = ca};
    s = ps_tls_server_creds(&good, err, sizeof err);
    ck_assert_ptr_nonnull(s);
    grpc_server_credentials_release(s);
    ps_tls_opts missing = {.cert = "/nonexistent/c.pem", .key = key};
    ck_assert_ptr_null(ps_tls_server_creds(&missing, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/c.pem"));
    grpc_channel_credentials *c = ps_tls_channel_creds(NULL, err, sizeof err);
    ck_assert_ptr_nonnull(c);
    grpc_channel_credentials_release(c);
    c = ps_tls_channel_creds(&good, err, sizeof err);
    ck_assert_ptr_nonnull(c);
    grpc_channel_credentials_release(c);
    ps_tls_opts bad_ca = {.ca = junk};
    ck_assert_ptr_null(ps_tls_channel_creds(&bad_ca, err, sizeof err));
    grpc_shutdown();
}
END_TEST

START_TEST(test_client_default)
{
    ck_assert_ptr_null(ps_tls_client_default());
    ps_tls_opts o = {.ca = "ca.pem", .target_name = "ps0"};
    ck_assert_int_eq(ps_tls_set_client_default(&o), 0);
    const ps_tls_opts *d = ps_tls_client_default();
    ck_assert_ptr_nonnull(d);
    ck_assert_str_eq(d->ca, "ca.pem");
    ck_assert_ptr_ne(d->ca, o.ca);
    ck_assert_str_eq(d->target_name, "ps0");
    ck_assert_ptr_null(d->cert);
    ps_tls_opts none = {0};
    ck_assert_int_eq(ps_tls_set_client_default(&none), 0);
    ck_assert_ptr_null(ps_tls_client_default());
    ps_tls_reload(); /* nothing to reload: only bumps the generation */
}
END_TEST

PSCHECK_MAIN("tls",
    {"ps_tls_check_listen", {test_check_listen}},
    {"ps_tls_server_mode", {test_modes}},
    {"ps_tls_check_files", {test_check_files}, &files},
    {"ps_tls_server_creds", {test_creds}, &files},
    {"ps_tls_set_client_default", {test_client_default}})
