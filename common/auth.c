/*
 * auth.c - the role table, token files, and gRPC's server auth metadata
 * processor that checks every call against them. See auth.h.
 */
#include "common/auth.h"

#include "common/errors.h"
#include "common/log.h"
#include "common/rpc_code.h"
#include "common/sha256.h"

#include <ctype.h>
#include <errno.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* ---- the role table ----------------------------------------------------- */

#define R PS_AUTH_READER
#define W PS_AUTH_WORKER
#define O PS_AUTH_OPERATOR

/* Every method psd and pscoord serve, and who may call it. Operator is in
 * every entry: it may do what the others may. */
static const struct {
    const char *path;
    unsigned roles;
} method_roles[] = {
    {"/ps.v1.ParameterServer/CreateVariable", W | O},
    {"/ps.v1.ParameterServer/Pull", W | O},
    {"/ps.v1.ParameterServer/Push", W | O},
    {"/ps.v1.ParameterServer/ListVariables", R | O},
    {"/ps.v1.ParameterServer/Stats", R | O},
    {"/ps.v1.ParameterServer/Checkpoint", O},
    {"/ps.v1.ParameterServer/Restore", O},
    {"/ps.v1.ParameterServer/SetSyncWorkers", O},
    {"/ps.v1.ParameterServer/DeleteVariable", O},
    {"/ps.v1.ParameterServer/SparsePull", W | O},
    {"/ps.v1.ParameterServer/SparsePush", W | O},
    {"/ps.v1.Coordinator/RegisterTask", W | O},
    {"/ps.v1.Coordinator/Heartbeat", W | O},
    {"/ps.v1.Coordinator/GetCluster", R | W | O},
    {"/ps.v1.Coordinator/WatchCluster", R | W | O},
    {"/ps.v1.Coordinator/ReportMetrics", W | O},
    /* A worker also needs its task secret here (coordinator/service.c). */
    {"/ps.v1.Coordinator/Place", W | O},
    /* multi_worker_mirrored's rendezvous (coordinator/kvstore.c). */
    {"/ps.v1.Coordinator/KvSet", W | O},
    {"/ps.v1.Coordinator/KvGet", W | O},
    {"/grpc.health.v1.Health/Check", R | W | O},
    {"/grpc.health.v1.Health/Watch", R | W | O},
};

#undef R
#undef W
#undef O

unsigned ps_auth_method_roles(const char *path)
{
    if (path == NULL)
        return 0;
    for (size_t i = 0; i < sizeof method_roles / sizeof method_roles[0]; i++)
        if (strcmp(method_roles[i].path, path) == 0)
            return method_roles[i].roles;
    return 0;
}

const char *ps_auth_role_name(int role)
{
    switch (role) {
    case PS_AUTH_READER:
        return "reader";
    case PS_AUTH_WORKER:
        return "worker";
    case PS_AUTH_OPERATOR:
        return "operator";
    default:
        return "none";
    }
}

static int role_parse(const char *s, size_t n)
{
    static const int roles[] = {PS_AUTH_READER, PS_AUTH_WORKER, PS_AUTH_OPERATOR};
    for (size_t i = 0; i < 3; i++) {
        const char *name = ps_auth_role_name(roles[i]);
        if (strlen(name) == n && strncmp(name, s, n) == 0)
            return roles[i];
    }
    return PS_AUTH_NONE;
}

void ps_auth_roles_text(unsigned roles, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (int r = PS_AUTH_READER; r <= PS_AUTH_OPERATOR; r <<= 1) {
        if (!(roles & (unsigned)r) || used >= len)
            continue;
        int n = snprintf(out + used, len - used, "%s%s", used ? ", " : "",
                         ps_auth_role_name(r));
        used += n > 0 ? (size_t)n : 0;
    }
    if (out[0] == '\0')
        snprintf(out, len, "no role");
}

/* ---- token files -------------------------------------------------------- */

struct entry {
    int role;
    uint8_t hash[PS_SHA256_LEN];
};

struct table {
    struct entry *e;
    size_t n;
};

struct ps_auth {
    char *path;
    pthread_rwlock_t lock; /* over tab: a reload swaps it */
    struct table tab;
    atomic_uint_fast64_t unauthenticated, denied; /* by the processor */
};

static bool token_char(int c)
{
    return c > 0x20 && c < 0x7f;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The next word of a line: skips blanks, sets *w and its length. */
static size_t word(const char **p, const char **w)
{
    const char *s = *p;
    while (*s == ' ' || *s == '\t')
        s++;
    *w = s;
    while (*s != '\0' && *s != ' ' && *s != '\t')
        s++;
    *p = s;
    return (size_t)(s - *w);
}

/* Checks a token's form: length and characters. NULL, or why not. */
static const char *token_problem(const char *t, size_t n)
{
    if (n < PS_AUTH_TOKEN_MIN)
        return "is shorter than 16 characters";
    if (n > PS_AUTH_TOKEN_MAX)
        return "is longer than 512 characters";
    for (size_t i = 0; i < n; i++)
        if (!token_char((unsigned char)t[i]))
            return "holds a character that is not printable ASCII";
    return NULL;
}

/* One line of a server's token file into *e (the hash of its token).
 * Returns 0, or PS_EPARSE with why. *plain says the line held a token in
 * the clear. */
static int parse_line(const char *line, struct entry *e, bool *plain,
                      char *why, size_t whylen)
{
    const char *p = line, *rw, *tw, *extra;
    size_t rn = word(&p, &rw), tn = word(&p, &tw);
    if (word(&p, &extra) != 0 || tn == 0) {
        snprintf(why, whylen, "expected 'ROLE TOKEN' or 'ROLE sha256:HEX'");
        return PS_EPARSE;
    }
    if ((e->role = role_parse(rw, rn)) == PS_AUTH_NONE) {
        snprintf(why, whylen, "unknown role '%.*s' (reader, worker or operator)",
                 (int)(rn > 32 ? 32 : rn), rw);
        return PS_EPARSE;
    }
    if (tn > 7 && strncmp(tw, "sha256:", 7) == 0) {
        if (tn != 7 + 2 * PS_SHA256_LEN) {
            snprintf(why, whylen, "sha256: takes 64 hex digits");
            return PS_EPARSE;
        }
        for (int i = 0; i < PS_SHA256_LEN; i++) {
            int hi = hexval(tw[7 + 2 * i]), lo = hexval(tw[8 + 2 * i]);
            if (hi < 0 || lo < 0) {
                snprintf(why, whylen, "sha256: takes 64 hex digits");
                return PS_EPARSE;
            }
            e->hash[i] = (uint8_t)(hi << 4 | lo);
        }
        *plain = false;
        return 0;
    }
    const char *bad = token_problem(tw, tn);
    if (bad != NULL) {
        snprintf(why, whylen, "the token %s", bad);
        return PS_EPARSE;
    }
    ps_sha256(tw, tn, e->hash);
    *plain = true;
    return 0;
}

/* Strips a comment (a '#' that starts a word: a token may hold one) and
 * the line end; true when something is left. */
static bool content(char *line)
{
    for (char *p = line; *p != '\0'; p++) {
        if (*p == '#' && (p == line || p[-1] == ' ' || p[-1] == '\t')) {
            *p = '\0';
            break;
        }
    }
    size_t n = strlen(line);
    while (n > 0 && isspace((unsigned char)line[n - 1]))
        line[--n] = '\0';
    const char *s = line;
    while (*s == ' ' || *s == '\t')
        s++;
    return *s != '\0';
}

static int table_add(struct table *t, const struct entry *e, char *why,
                     size_t whylen)
{
    for (size_t i = 0; i < t->n; i++) {
        if (memcmp(t->e[i].hash, e->hash, PS_SHA256_LEN) == 0 &&
            t->e[i].role != e->role) {
            snprintf(why, whylen, "the same token is %s on an earlier line",
                     ps_auth_role_name(t->e[i].role));
            return PS_EPARSE;
        }
    }
    struct entry *ne = realloc(t->e, (t->n + 1) * sizeof *ne);
    if (ne == NULL) {
        snprintf(why, whylen, "out of memory");
        return -ENOMEM;
    }
    t->e = ne;
    t->e[t->n++] = *e;
    return 0;
}

/* Opens a token file for reading and gives its permission bits (0 when
 * fstat fails). NULL when it cannot be opened, with err naming the file and
 * *rc set to -errno. */
static FILE *token_open(const char *path, mode_t *mode, int *rc, char *err,
                        size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        *rc = -errno;
        snprintf(err, errlen, "%s: cannot read the token file: %s", path,
                 strerror(-*rc));
        return NULL;
    }
    struct stat st;
    *mode = fstat(fileno(f), &st) == 0 ? st.st_mode : 0;
    return f;
}

/* Reads path into t. Returns as ps_auth_create. */
static int table_load(const char *path, struct table *t, char *err,
                      size_t errlen)
{
    memset(t, 0, sizeof *t);
    mode_t mode;
    int rc = 0;
    FILE *f = token_open(path, &mode, &rc, err, errlen);
    if (f == NULL)
        return rc;
    /* As ssh treats a private key: a file of clear tokens that a group or
     * others may read is refused, and so is any that they may write (they
     * could add a token of their own), hashes or not. */
    bool others_read = mode & (S_IRGRP | S_IROTH);
    bool others_write = mode & (S_IWGRP | S_IWOTH);
    char line[PS_AUTH_TOKEN_MAX + 128], why[160];
    int lineno = 0;
    bool any_plain = false;
    while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
        lineno++;
        if (strchr(line, '\n') == NULL && !feof(f)) {
            snprintf(why, sizeof why, "line longer than %zu characters",
                     sizeof line - 2);
            rc = PS_EPARSE;
            break;
        }
        if (!content(line))
            continue;
        struct entry e;
        bool plain = false;
        if ((rc = parse_line(line, &e, &plain, why, sizeof why)) == 0 &&
            (rc = table_add(t, &e, why, sizeof why)) == 0)
            any_plain |= plain;
    }
    fclose(f);
    if (rc != 0) {
        snprintf(err, errlen, "%s:%d: %s", path, lineno, why);
    } else if (t->n == 0) {
        snprintf(err, errlen, "%s: no tokens (lines 'ROLE TOKEN')", path);
        rc = PS_EPARSE;
    } else if (others_write) {
        snprintf(err, errlen, "%s: group or others may write the token file "
                 "(mode %03o): chmod go-w (600 for tokens in the clear)", path,
                 (unsigned)(mode & 0777));
        rc = PS_EINVAL_ARG;
    } else if (any_plain && others_read) {
        snprintf(err, errlen, "%s: holds tokens in the clear and group or others "
                 "may read it (mode %03o): chmod 600, or write 'ROLE sha256:HEX'",
                 path, (unsigned)(mode & 0777));
        rc = PS_EINVAL_ARG;
    }
    if (rc != 0) {
        free(t->e);
        memset(t, 0, sizeof *t);
    }
    return rc;
}

int ps_auth_create(const char *path, ps_auth **out, char *err, size_t errlen)
{
    ps_auth *a = calloc(1, sizeof *a);
    if (a == NULL || (a->path = strdup(path)) == NULL) {
        free(a);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = table_load(path, &a->tab, err, errlen);
    if (rc != 0) {
        free(a->path);
        free(a);
        return rc;
    }
    pthread_rwlock_init(&a->lock, NULL);
    *out = a;
    return 0;
}

int ps_auth_reload(ps_auth *a, char *err, size_t errlen)
{
    struct table t;
    int rc = table_load(a->path, &t, err, errlen);
    if (rc != 0)
        return rc;
    pthread_rwlock_wrlock(&a->lock);
    struct table old = a->tab;
    a->tab = t;
    pthread_rwlock_unlock(&a->lock);
    free(old.e);
    return 0;
}

void ps_auth_destroy(ps_auth *a)
{
    if (a == NULL)
        return;
    pthread_rwlock_destroy(&a->lock);
    free(a->tab.e);
    free(a->path);
    free(a);
}

size_t ps_auth_count(const ps_auth *a)
{
    pthread_rwlock_rdlock(&((ps_auth *)a)->lock);
    size_t n = a->tab.n;
    pthread_rwlock_unlock(&((ps_auth *)a)->lock);
    return n;
}

uint64_t ps_auth_refused(const ps_auth *a, int code)
{
    ps_auth *m = (ps_auth *)a;
    if (code == PS_RPC_UNAUTHENTICATED)
        return atomic_load_explicit(&m->unauthenticated, memory_order_relaxed);
    if (code == PS_RPC_PERMISSION_DENIED)
        return atomic_load_explicit(&m->denied, memory_order_relaxed);
    return 0;
}

const char *ps_auth_path(const ps_auth *a)
{
    return a->path;
}

int ps_auth_lookup(const ps_auth *a, const char *token, size_t len)
{
    uint8_t h[PS_SHA256_LEN];
    ps_sha256(token, len, h);
    int role = PS_AUTH_NONE;
    pthread_rwlock_rdlock(&((ps_auth *)a)->lock);
    /* Every entry is compared in full: no early exit on a match or a
     * mismatching byte. */
    for (size_t i = 0; i < a->tab.n; i++) {
        unsigned diff = 0;
        for (int k = 0; k < PS_SHA256_LEN; k++)
            diff |= (unsigned)(a->tab.e[i].hash[k] ^ h[k]);
        /* mask: all ones when diff == 0 */
        unsigned mask = (unsigned)(((diff | (0u - diff)) >> 31) & 1u) - 1u;
        role |= (int)((unsigned)a->tab.e[i].role & mask);
    }
    pthread_rwlock_unlock(&((ps_auth *)a)->lock);
    return role;
}

int ps_auth_decide(const ps_auth *a, const char *path, const char *authz,
                   size_t authz_len, int implicit_role, int *role, char *msg,
                   size_t msglen)
{
    *role = PS_AUTH_NONE;
    const char *m = path != NULL ? path : "(no method)";
    int who;
    if (authz == NULL) {
        who = implicit_role;
        if (who == PS_AUTH_NONE) {
            snprintf(msg, msglen, "%s: this server requires a token and the "
                     "call sent none (metadata 'authorization: Bearer TOKEN'; "
                     "psctl and workerd take --token-file FILE)", m);
            return PS_RPC_UNAUTHENTICATED;
        }
    } else {
        if (authz_len < 7 || strncasecmp(authz, "Bearer ", 7) != 0) {
            snprintf(msg, msglen, "%s: the authorization metadata is not "
                     "'Bearer TOKEN'", m);
            return PS_RPC_UNAUTHENTICATED;
        }
        who = ps_auth_lookup(a, authz + 7, authz_len - 7);
        if (who == PS_AUTH_NONE) {
            snprintf(msg, msglen, "%s: the token sent is not one of this "
                     "server's (--tokens)", m);
            return PS_RPC_UNAUTHENTICATED;
        }
    }
    unsigned may = ps_auth_method_roles(path);
    if (may == 0) {
        snprintf(msg, msglen, "%s is not in the role table: no role may call "
                 "it", m);
        return PS_RPC_PERMISSION_DENIED;
    }
    if (!(may & (unsigned)who)) {
        char need[64];
        ps_auth_roles_text(may, need, sizeof need);
        snprintf(msg, msglen, "role '%s' may not call %s (it takes: %s)",
                 ps_auth_role_name(who), m, need);
        return PS_RPC_PERMISSION_DENIED;
    }
    *role = who;
    return 0;
}

int ps_auth_server_setup(const char *path, const char *listen, ps_auth **out,
                         char *err, size_t errlen)
{
    *out = NULL;
    if (path == NULL || path[0] == '\0') {
        if (!ps_auth_is_loopback(listen))
            ps_log_warn("listening on %s without --tokens: anyone who can reach "
                        "it may call every method", listen);
        return 0;
    }
    int rc = ps_auth_create(path, out, err, errlen);
    if (rc == 0)
        ps_log_info("tokens: %zu from %s; every call needs one", ps_auth_count(*out),
                    path);
    return rc;
}

void ps_auth_reload_logged(void *ctx)
{
    ps_auth *a = ctx;
    if (a == NULL) {
        ps_log_info("SIGHUP: no --tokens file to reload");
        return;
    }
    char err[512];
    if (ps_auth_reload(a, err, sizeof err) == 0)
        ps_log_info("SIGHUP: tokens reloaded, %zu from %s", ps_auth_count(a), a->path);
    else
        ps_log_error("SIGHUP: tokens not reloaded, the old ones stay: %s", err);
}

/* ---- gRPC's auth metadata processor ------------------------------------- */

struct processor {
    ps_auth *a;
    int implicit_role;
};

static bool key_is(grpc_slice s, const char *k)
{
    size_t n = strlen(k);
    return GRPC_SLICE_LENGTH(s) == n && memcmp(GRPC_SLICE_START_PTR(s), k, n) == 0;
}

/* Runs on a gRPC thread for every call, before the call reaches the
 * server's queue; answers at once (it never blocks). */
static void process(void *state, grpc_auth_context *ctx, const grpc_metadata *md,
                    size_t n, grpc_process_auth_metadata_done_cb cb,
                    void *user_data)
{
    const struct processor *p = state;
    char path[256] = "";
    const grpc_metadata *authz = NULL;
    for (size_t i = 0; i < n; i++) {
        if (key_is(md[i].key, ":path")) {
            size_t len = GRPC_SLICE_LENGTH(md[i].value);
            if (len >= sizeof path)
                len = sizeof path - 1;
            memcpy(path, GRPC_SLICE_START_PTR(md[i].value), len);
            path[len] = '\0';
        } else if (key_is(md[i].key, "authorization")) {
            authz = &md[i];
        }
    }
    int role;
    char msg[512];
    int code = ps_auth_decide(
        p->a, path, authz ? (const char *)GRPC_SLICE_START_PTR(authz->value) : NULL,
        authz ? GRPC_SLICE_LENGTH(authz->value) : 0, p->implicit_role, &role,
        msg, sizeof msg);
    if (code != 0) {
        atomic_fetch_add_explicit(code == PS_RPC_UNAUTHENTICATED ? &p->a->unauthenticated
                                                                 : &p->a->denied,
                                  1, memory_order_relaxed);
        ps_log_debug("auth: refused: %s", msg);
        cb(user_data, NULL, 0, NULL, 0, (grpc_status_code)code, msg);
        return;
    }
    /* Nothing is added to ctx: in gRPC 1.51 it is the connection's, shared
     * by its calls (a property per call would pile up on it, and race);
     * ps_rpc_call_role reads the header again where a handler needs it. */
    (void)ctx;
    cb(user_data, NULL, 0, NULL, 0, GRPC_STATUS_OK, NULL);
}

static void processor_destroy(void *state)
{
    free(state);
}

void ps_auth_attach(ps_auth *a, struct grpc_server_credentials *creds,
                    int implicit_role)
{
    struct processor *p = malloc(sizeof *p);
    if (p == NULL)
        abort(); /* start-up only: a server without its check must not run */
    p->a = a;
    p->implicit_role = implicit_role;
    grpc_auth_metadata_processor proc = {process, processor_destroy, p};
    grpc_server_credentials_set_auth_metadata_processor(creds, proc);
}

/* ---- client side -------------------------------------------------------- */

int ps_auth_read_token(const char *path, char *out, size_t outlen, char *err,
                       size_t errlen)
{
    mode_t mode;
    int rc = 0;
    FILE *f = token_open(path, &mode, &rc, err, errlen);
    if (f == NULL)
        return rc;
    /* The token itself: refused when a group or others may read or write
     * the file, as ssh refuses such a private key. */
    if (mode & 077) {
        snprintf(err, errlen, "%s: group or others may read or write the token "
                 "file (mode %03o): chmod 600", path, (unsigned)(mode & 0777));
        fclose(f);
        return PS_EINVAL_ARG;
    }
    char line[PS_AUTH_TOKEN_MAX + 128], why[128] = "";
    int lineno = 0;
    rc = PS_EPARSE;
    while (fgets(line, sizeof line, f) != NULL) {
        lineno++;
        if (!content(line))
            continue;
        const char *p = line, *w1, *w2, *w3;
        size_t n1 = word(&p, &w1), n2 = word(&p, &w2);
        const char *t = n2 > 0 ? w2 : w1, *bad;
        size_t tn = n2 > 0 ? n2 : n1;
        if (word(&p, &w3) != 0 || (n2 > 0 && role_parse(w1, n1) == PS_AUTH_NONE))
            snprintf(why, sizeof why, "expected 'TOKEN' or 'ROLE TOKEN' "
                     "(ROLE reader, worker or operator)");
        else if (tn > 7 && strncmp(t, "sha256:", 7) == 0)
            snprintf(why, sizeof why, "a token's hash, not the token itself");
        else if ((bad = token_problem(t, tn)) != NULL || tn >= outlen)
            snprintf(why, sizeof why, "the token %s",
                     bad != NULL ? bad : "is too long");
        else {
            memcpy(out, t, tn);
            out[tn] = '\0';
            rc = 0;
        }
        break;
    }
    fclose(f);
    if (rc != 0 && why[0] != '\0')
        snprintf(err, errlen, "%s:%d: %s", path, lineno, why);
    else if (rc != 0)
        snprintf(err, errlen, "%s: holds no token", path);
    return rc;
}

bool ps_auth_is_loopback(const char *listen)
{
    if (listen == NULL)
        return false;
    if (strncmp(listen, "unix:", 5) == 0 || strncmp(listen, "127.", 4) == 0 ||
        strncmp(listen, "[::1]:", 6) == 0 || strncmp(listen, "localhost:", 10) == 0 ||
        strncmp(listen, "ipv4:127.", 9) == 0)
        return true;
    return false;
}
