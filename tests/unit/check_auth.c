/*
 * check_auth.c - common/auth.c without gRPC: the role table, token files
 * (their parser and every refusal), lookups and the decision for a call,
 * the client's token file, and common/sha256.c against known digests.
 */
#include "common/auth.h"
#include "common/errors.h"
#include "common/rpc_code.h"
#include "common/sha256.h"
#define PSCHECK_TMPFILE "tokens"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TW "worker-token-0123456789"
#define TO "operator-token-0123456789"
#define TR "reader-token-0123456789"

static char err[600];

static void tokens(const char *text, mode_t mode)
{
    pscheck_write_text(tmppath, text);
    ck_assert_int_eq(chmod(tmppath, mode), 0);
}

static ps_auth *load_ok(const char *text)
{
    tokens(text, 0600);
    ps_auth *a = NULL;
    ck_assert_msg(ps_auth_create(tmppath, &a, err, sizeof err) == 0, "%s", err);
    return a;
}

/* A file that must be refused with err holding "FILE:LINE: words". */
static void load_bad(const char *text, mode_t mode, int rc, const char *where,
                     const char *words)
{
    tokens(text, mode);
    ps_auth *a = (ps_auth *)1;
    ck_assert_int_eq(ps_auth_create(tmppath, &a, err, sizeof err), rc);
    char want[300];
    snprintf(want, sizeof want, "%s%s", tmppath, where);
    ck_assert_msg(strstr(err, want) != NULL && strstr(err, words) != NULL,
                  "'%s' lacks '%s' or '%s'", err, want, words);
}

static void hex(const uint8_t *h, char out[65])
{
    for (int i = 0; i < PS_SHA256_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

START_TEST(test_sha256)
{
    uint8_t h[PS_SHA256_LEN];
    char x[65];
    ps_sha256("", 0, h);
    hex(h, x);
    ck_assert_str_eq(x, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    ps_sha256("abc", 3, h);
    hex(h, x);
    ck_assert_str_eq(x, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    ps_sha256(two, strlen(two), h); /* 56 bytes: the padding takes a block */
    hex(h, x);
    ck_assert_str_eq(x, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}
END_TEST

START_TEST(test_method_roles)
{
    const unsigned R = PS_AUTH_READER, W = PS_AUTH_WORKER, O = PS_AUTH_OPERATOR;
    ck_assert_uint_eq(ps_auth_method_roles("/ps.v1.ParameterServer/Push"), W | O);
    ck_assert_uint_eq(ps_auth_method_roles("/ps.v1.ParameterServer/Pull"), W | O);
    ck_assert_uint_eq(ps_auth_method_roles("/ps.v1.ParameterServer/Stats"), R | O);
    ck_assert_uint_eq(ps_auth_method_roles("/ps.v1.ParameterServer/Restore"), O);
    ck_assert_uint_eq(ps_auth_method_roles("/ps.v1.ParameterServer/SetSyncWorkers"), O);
    ck_assert_uint_eq(ps_auth_method_roles("/ps.v1.Coordinator/Place"), W | O);
    ck_assert_uint_eq(ps_auth_method_roles("/ps.v1.Coordinator/WatchCluster"), R | W | O);
    ck_assert_uint_eq(ps_auth_method_roles("/grpc.health.v1.Health/Check"), R | W | O);
    ck_assert_uint_eq(ps_auth_method_roles("/ps.v1.ParameterServer/Nope"), 0);
    ck_assert_uint_eq(ps_auth_method_roles("/ps.v1.ParameterServer/Push/"), 0);
    ck_assert_uint_eq(ps_auth_method_roles(NULL), 0);
    char t[64];
    ps_auth_roles_text(W | O, t, sizeof t);
    ck_assert_str_eq(t, "worker, operator");
}
END_TEST

/* Every rpc of every service in proto/ps.proto has a row in the role
 * table: a method added to the wire without one would be refused to every
 * role (and a table row for a method that no longer exists goes unnoticed
 * the other way, which is harmless). */
START_TEST(test_every_rpc_has_roles)
{
    const char *root = getenv("PS_SOURCE_ROOT");
    ck_assert_msg(root != NULL, "PS_SOURCE_ROOT is not set");
    char path[1024], line[512], service[128] = "";
    snprintf(path, sizeof path, "%s/proto/ps.proto", root);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    int rpcs = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        char name[128];
        if (sscanf(line, " service %127[A-Za-z0-9_]", name) == 1)
            snprintf(service, sizeof service, "%s", name);
        else if (sscanf(line, " rpc %127[A-Za-z0-9_](", name) == 1) {
            char method[300];
            snprintf(method, sizeof method, "/ps.v1.%s/%s", service, name);
            ck_assert_msg(ps_auth_method_roles(method) != 0,
                          "%s has no row in common/auth.c's role table", method);
            rpcs++;
        }
    }
    fclose(f);
    ck_assert_int_ge(rpcs, 15);
}
END_TEST

START_TEST(test_create_lookup)
{
    char line[300];
    uint8_t h[PS_SHA256_LEN];
    char x[65];
    ps_sha256("hashed-reader-token-01", 22, h);
    hex(h, x);
    snprintf(line, sizeof line, "# comment\n\nworker " TW "\n  operator\t" TO
             "   # trailing comment\nreader " TR "\nreader sha256:%s\n", x);
    ps_auth *a = load_ok(line);
    ck_assert_uint_eq(ps_auth_count(a), 4);
    ck_assert_int_eq(ps_auth_lookup(a, TW, strlen(TW)), PS_AUTH_WORKER);
    ck_assert_int_eq(ps_auth_lookup(a, TO, strlen(TO)), PS_AUTH_OPERATOR);
    ck_assert_int_eq(ps_auth_lookup(a, TR, strlen(TR)), PS_AUTH_READER);
    ck_assert_int_eq(ps_auth_lookup(a, "hashed-reader-token-01", 22), PS_AUTH_READER);
    ck_assert_int_eq(ps_auth_lookup(a, TW, strlen(TW) - 1), PS_AUTH_NONE);
    ck_assert_int_eq(ps_auth_lookup(a, "", 0), PS_AUTH_NONE);
    ps_auth_destroy(a);
    /* A '#' inside a token is the token's; one that starts a word, a comment. */
    a = load_ok("worker abc#defghijklmnopq #comment\n#worker " TO "\n");
    ck_assert_int_eq(ps_auth_lookup(a, "abc#defghijklmnopq", 18), PS_AUTH_WORKER);
    ck_assert_int_eq(ps_auth_lookup(a, TO, strlen(TO)), PS_AUTH_NONE);
    /* The same token twice under one role is harmless. */
    tokens("worker " TW "\nworker " TW "\n", 0600);
    ck_assert_int_eq(ps_auth_reload(a, err, sizeof err), 0);
    ck_assert_int_eq(ps_auth_lookup(a, TO, strlen(TO)), PS_AUTH_NONE);
    /* A bad reload keeps the table. */
    tokens("wrker " TW "\n", 0600);
    ck_assert_int_eq(ps_auth_reload(a, err, sizeof err), PS_EPARSE);
    ck_assert_int_eq(ps_auth_lookup(a, TW, strlen(TW)), PS_AUTH_WORKER);
    ps_auth_destroy(a);
    ps_auth_destroy(NULL);
}
END_TEST

START_TEST(test_create_refusals)
{
    load_bad("worker " TW "\nwrker " TR "\n", 0600, PS_EPARSE, ":2:", "unknown role 'wrker'");
    load_bad("\n\nworker\n", 0600, PS_EPARSE, ":3:", "expected 'ROLE TOKEN'");
    load_bad("worker " TW " extra\n", 0600, PS_EPARSE, ":1:", "expected");
    load_bad("worker short\n", 0600, PS_EPARSE, ":1:", "shorter than 16");
    load_bad("worker sha256:abcd\n", 0600, PS_EPARSE, ":1:", "64 hex digits");
    load_bad("worker sha256:zz0000000000000000000000000000000000000000000000000000000000000"
             "0\n", 0600, PS_EPARSE, ":1:", "64 hex digits");
    load_bad("worker " TW "\noperator " TW "\n", 0600, PS_EPARSE, ":2:", "worker on an earlier");
    load_bad("# nothing\n", 0600, PS_EPARSE, ":", "no tokens");
    load_bad("worker " TW "\n", 0644, PS_EINVAL_ARG, ":", "others may read");
    ck_assert_msg(strstr(err, TW) == NULL, "the error quotes the token: %s", err);
    char missing[200];
    snprintf(missing, sizeof missing, "%s/none", tmpdir);
    ps_auth *a;
    ck_assert_int_lt(ps_auth_create(missing, &a, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, missing));
    /* Hashes only: others may read them. */
    a = NULL;
    tokens("reader sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n",
           0644);
    ck_assert_int_eq(ps_auth_create(tmppath, &a, err, sizeof err), 0);
    ps_auth_destroy(a);
}
END_TEST

START_TEST(test_decide)
{
    ps_auth *a = load_ok("worker " TW "\noperator " TO "\nreader " TR "\n");
    int role;
    char msg[512];
    const char *push = "/ps.v1.ParameterServer/Push";
    ck_assert_int_eq(ps_auth_decide(a, push, NULL, 0, PS_AUTH_NONE, &role, msg, sizeof msg),
                     PS_RPC_UNAUTHENTICATED);
    ck_assert_ptr_nonnull(strstr(msg, "sent none"));
    const char *bw = "Bearer " TW, *br = "bearer " TR, *bo = "Bearer " TO;
    ck_assert_int_eq(ps_auth_decide(a, push, bw, strlen(bw), 0, &role, msg, sizeof msg), 0);
    ck_assert_int_eq(role, PS_AUTH_WORKER);
    ck_assert_int_eq(ps_auth_decide(a, push, br, strlen(br), 0, &role, msg, sizeof msg),
                     PS_RPC_PERMISSION_DENIED);
    ck_assert_ptr_nonnull(strstr(msg, "role 'reader' may not call /ps.v1.ParameterServer/Push"));
    ck_assert_ptr_null(strstr(msg, TR));
    const char *restore = "/ps.v1.ParameterServer/Restore";
    ck_assert_int_eq(ps_auth_decide(a, restore, bw, strlen(bw), 0, &role, msg, sizeof msg),
                     PS_RPC_PERMISSION_DENIED);
    ck_assert_int_eq(ps_auth_decide(a, restore, bo, strlen(bo), 0, &role, msg, sizeof msg), 0);
    ck_assert_int_eq(role, PS_AUTH_OPERATOR);
    const char *wrong = "Bearer not-a-token-of-the-file";
    ck_assert_int_eq(ps_auth_decide(a, push, wrong, strlen(wrong), 0, &role, msg, sizeof msg),
                     PS_RPC_UNAUTHENTICATED);
    ck_assert_ptr_null(strstr(msg, "not-a-token"));
    ck_assert_int_eq(ps_auth_decide(a, push, TW, strlen(TW), 0, &role, msg, sizeof msg),
                     PS_RPC_UNAUTHENTICATED);
    ck_assert_int_eq(ps_auth_decide(a, "/x.Y/Z", bo, strlen(bo), 0, &role, msg, sizeof msg),
                     PS_RPC_PERMISSION_DENIED);
    ck_assert_ptr_nonnull(strstr(msg, "not in the role table"));
    /* A trusted transport's implicit role stands in for a missing token only. */
    ck_assert_int_eq(ps_auth_decide(a, push, NULL, 0, PS_AUTH_WORKER, &role, msg, sizeof msg), 0);
    ck_assert_int_eq(role, PS_AUTH_WORKER);
    ck_assert_int_eq(ps_auth_decide(a, restore, NULL, 0, PS_AUTH_WORKER, &role, msg,
                                    sizeof msg), PS_RPC_PERMISSION_DENIED);
    ck_assert_int_eq(ps_auth_decide(a, push, wrong, strlen(wrong), PS_AUTH_WORKER, &role, msg,
                                    sizeof msg), PS_RPC_UNAUTHENTICATED);
    ps_auth_destroy(a);
}
END_TEST

START_TEST(test_read_token)
{
    char tok[PS_AUTH_TOKEN_MAX + 1];
    tokens("# mine\n\n  " TW "  \n", 0600);
    ck_assert_int_eq(ps_auth_read_token(tmppath, tok, sizeof tok, err, sizeof err), 0);
    ck_assert_str_eq(tok, TW);
    tokens("operator " TO "\n", 0600);
    ck_assert_int_eq(ps_auth_read_token(tmppath, tok, sizeof tok, err, sizeof err), 0);
    ck_assert_str_eq(tok, TO);
    tokens("admin " TO "\n", 0600);
    ck_assert_int_eq(ps_auth_read_token(tmppath, tok, sizeof tok, err, sizeof err), PS_EPARSE);
    ck_assert_ptr_nonnull(strstr(err, ":1:"));
    tokens("reader sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n",
           0600);
    ck_assert_int_eq(ps_auth_read_token(tmppath, tok, sizeof tok, err, sizeof err), PS_EPARSE);
    ck_assert_ptr_nonnull(strstr(err, "hash"));
    tokens("# none\n", 0600);
    ck_assert_int_eq(ps_auth_read_token(tmppath, tok, sizeof tok, err, sizeof err), PS_EPARSE);
    ck_assert_ptr_nonnull(strstr(err, "holds no token"));
}
END_TEST

START_TEST(test_is_loopback)
{
    ck_assert(ps_auth_is_loopback("127.0.0.1:7070"));
    ck_assert(ps_auth_is_loopback("[::1]:0"));
    ck_assert(ps_auth_is_loopback("localhost:1"));
    ck_assert(ps_auth_is_loopback("unix:/run/psd.sock"));
    ck_assert(!ps_auth_is_loopback("0.0.0.0:7070"));
    ck_assert(!ps_auth_is_loopback("[::]:7070"));
    ck_assert(!ps_auth_is_loopback("10.0.0.5:7070"));
    ck_assert(!ps_auth_is_loopback(NULL));
}
END_TEST

PSCHECK_MAIN("auth",
    {"ps_sha256", {test_sha256}},
    {"ps_auth_method_roles", {test_method_roles, test_every_rpc_has_roles}},
    {"ps_auth_create", {test_create_lookup, test_create_refusals}, &pscheck_tmp},
    {"ps_auth_decide", {test_decide}, &pscheck_tmp},
    {"ps_auth_read_token", {test_read_token}, &pscheck_tmp},
    {"ps_auth_is_loopback", {test_is_loopback}})
