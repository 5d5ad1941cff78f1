/*
 * metrics_http.c - see metrics_http.h. The only file that includes
 * <microhttpd.h>; built with -DPS_OWNS_MHD (common/meson.build).
 */
#include "common/metrics_http.h"

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/tls.h"

#include <errno.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <microhttpd.h>

/* Enough for Prometheus and a person with curl; the rest wait in the
 * backlog. A connection idle this long is dropped (a slow or stuck client
 * holds no slot for ever). */
#define MAX_CONNECTIONS 64
#define IDLE_TIMEOUT_S 10
/* Connections from one address at once: a client that trickles bytes to
 * stay under the idle timeout (slowloris) holds only these, and the
 * scrapes of other addresses go on. */
#define PER_IP_CONNECTIONS 8
/* Deadlines that hold however steadily a client trickles bytes (the idle
 * timeout restarts with each one): from a connection's accept, or the end
 * of its previous request, to a whole request's headers (the TLS handshake
 * included); and from those headers to the end of the answer. A scrape
 * takes milliseconds of both. */
#define REQUEST_DEADLINE_MS 5000
#define ANSWER_DEADLINE_MS 10000
/* How often the event loop looks at the deadlines (and at a stop). */
#define LOOP_WAKE_MS 200
#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define USER_MAX 64
#define PASSWORD_MAX 512

/* One connection, from the library's notice of its start to that of its
 * close; its socket_context. */
struct conn {
    struct MHD_Connection *c;
    int64_t deadline_ms;
    bool cut; /* shut down at its deadline; the library closes it */
    struct conn *prev, *next;
};

/* A user of --metrics-auth: the SHA-256 of its password. */
struct user {
    char name[USER_MAX + 1];
    uint8_t hash[PS_SHA256_LEN];
};

struct ps_metrics_http {
    struct MHD_Daemon *d;
    int fd;
    int port;
    ps_metrics_collect_fn collect;
    void *ctx;
    struct user *users; /* NULL: no basic auth */
    size_t nusers;
    char *cert_pem, *key_pem; /* HTTPS; kept while the daemon runs */
    struct conn *conns;       /* touched only on the loop's thread */
    pthread_t th;
    bool th_started;
    atomic_bool quit;
};

bool ps_metrics_http_off(const char *addr)
{
    return addr == NULL || addr[0] == '\0' || strcmp(addr, "off") == 0;
}

/* Splits "host:port" or "[v6]:port" with a port in 0..65535 (0: any).
 * Returns 0 or PS_EINVAL_ARG. */
static int split_addr(const char *addr, char *host, size_t hostlen, char *port,
                      size_t portlen)
{
    const char *colon;
    const char *h = addr;
    size_t hn;
    if (addr[0] == '[') {
        const char *rb = strchr(addr, ']');
        if (rb == NULL || rb[1] != ':')
            return PS_EINVAL_ARG;
        h = addr + 1;
        hn = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(addr, ':');
        if (colon == NULL || memchr(addr, ':', (size_t)(colon - addr)) != NULL)
            return PS_EINVAL_ARG; /* none, or a v6 address without brackets */
        hn = (size_t)(colon - addr);
    }
    const char *p = colon + 1;
    size_t pn = strlen(p);
    if (hn == 0 || hn >= hostlen || pn == 0 || pn > 5 || pn >= portlen ||
        strspn(p, "0123456789") != pn || atoi(p) > 65535)
        return PS_EINVAL_ARG;
    memcpy(host, h, hn);
    host[hn] = '\0';
    memcpy(port, p, pn + 1);
    return 0;
}

/* Binds and listens on addr; returns the socket, or a negative code
 * with err written. */
static int bind_listen(const char *addr, int *port_out, char *err, size_t errlen)
{
    char host[256], port[8];
    if (split_addr(addr, host, sizeof host, port, sizeof port) != 0)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "'%s' is not HOST:PORT (port "
                       "0..65535; [ADDR]:PORT for IPv6)", addr);
    struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV,
                             .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host, port, &hints, &ai);
    if (g != 0)
        return ps_errf(g == EAI_SYSTEM ? -errno : -EADDRNOTAVAIL, err, errlen,
                       "%s: %s", addr, gai_strerror(g));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = fd < 0 ? -errno : 0;
    int one = 1;
    /* A restarted daemon rebinds at once over its old connections in
     * TIME_WAIT; a socket that listens still refuses the bind. */
    if (rc == 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (rc == 0 && (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0))
        rc = -errno;
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (rc == 0 && getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        rc = -errno;
    if (rc != 0) {
        if (fd >= 0)
            close(fd);
        return ps_errf(rc, err, errlen, "%s: %s", addr, strerror(-rc));
    }
    *port_out = ntohs(ss.ss_family == AF_INET6
                          ? ((struct sockaddr_in6 *)&ss)->sin6_port
                          : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

/* The library's own messages (a client's malformed request, mostly):
 * worth a line only when debugging. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    if (!ps_log_enabled(PS_LOG_DEBUG))
        return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    ps_log_debug("metrics http: %s", line);
}

/* ---- --metrics-auth ---------------------------------------------------- */

/* One "USER:PASSWORD" or "USER:sha256:HEX" line (its end stripped) into
 * *u. Returns 0, or PS_EPARSE with why. *plain says the password was in the
 * clear. */
static int user_parse(const char *line, struct user *u, bool *plain, char *why,
                      size_t whylen)
{
    const char *colon = strchr(line, ':');
    size_t un = colon != NULL ? (size_t)(colon - line) : 0;
    if (un == 0 || un > USER_MAX) {
        snprintf(why, whylen, "expected 'USER:PASSWORD' or 'USER:sha256:HEX' with a "
                 "user of 1 to %d characters", USER_MAX);
        return PS_EPARSE;
    }
    for (size_t i = 0; i < un; i++) {
        if (line[i] <= 0x20 || line[i] >= 0x7f) {
            snprintf(why, whylen, "the user holds a space or a character that is not "
                     "printable ASCII");
            return PS_EPARSE;
        }
    }
    memcpy(u->name, line, un);
    u->name[un] = '\0';
    const char *pw = colon + 1;
    size_t pn = strlen(pw);
    *plain = strncmp(pw, "sha256:", 7) != 0;
    if (*plain) {
        if (pn == 0 || pn > PASSWORD_MAX) {
            snprintf(why, whylen, "user '%s': a password of 1 to %d characters",
                     u->name, PASSWORD_MAX);
            return PS_EPARSE;
        }
        ps_sha256(pw, pn, u->hash);
        return 0;
    }
    const char *hex = pw + 7;
    if (pn != 7 + 2 * PS_SHA256_LEN ||
        strspn(hex, "0123456789abcdefABCDEF") != 2 * PS_SHA256_LEN) {
        snprintf(why, whylen, "user '%s': sha256: takes the 64 hex digits of the "
                 "password's SHA-256", u->name);
        return PS_EPARSE;
    }
    for (int i = 0; i < PS_SHA256_LEN; i++) {
        char byte[3] = {hex[2 * i], hex[2 * i + 1], '\0'};
        u->hash[i] = (uint8_t)strtoul(byte, NULL, 16);
    }
    return 0;
}

/* Refuses a file of secrets that others may change, or read in the clear,
 * as common/auth.c does token files. Returns 0 or PS_EINVAL_ARG. */
static int users_mode_ok(const char *path, const struct stat *st, bool any_plain,
                         char *err, size_t errlen)
{
    unsigned mode = (unsigned)(st->st_mode & 0777);
    if (st->st_mode & (S_IWGRP | S_IWOTH))
        return ps_errf(PS_EINVAL_ARG, err, errlen, "--metrics-auth %s: group or "
                       "others may write it (mode %03o): chmod go-w", path, mode);
    if (any_plain && (st->st_mode & (S_IRGRP | S_IROTH)))
        return ps_errf(PS_EINVAL_ARG, err, errlen, "--metrics-auth %s: holds "
                       "passwords in the clear and group or others may read it (mode "
                       "%03o): chmod 600, or write 'USER:sha256:HEX'", path, mode);
    return 0;
}

/* Reads --metrics-auth into h->users. Returns 0, or PS_EINVAL_ARG (a bad
 * line, no users, a mode too open), -errno (unreadable), -ENOMEM; err names
 * the file (and line). */
static int users_load(ps_metrics_http *h, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int e = errno;
        return ps_errf(-e, err, errlen, "--metrics-auth %s: %s", path, strerror(e));
    }
    struct stat st;
    int rc = fstat(fileno(f), &st) != 0 ? -errno : 0;
    char line[USER_MAX + PASSWORD_MAX + 16], why[160];
    int lineno = 0;
    bool any_plain = false;
    while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
        lineno++;
        size_t n = strlen(line);
        if (n > 0 && line[n - 1] != '\n' && !feof(f)) {
            snprintf(why, sizeof why, "a line longer than %zu characters", sizeof line - 2);
            rc = PS_EPARSE;
            break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (n == 0 || line[0] == '#')
            continue;
        struct user u;
        bool plain = false;
        if ((rc = user_parse(line, &u, &plain, why, sizeof why)) != 0)
            break;
        struct user *nu = realloc(h->users, (h->nusers + 1) * sizeof *nu);
        if (nu == NULL) {
            rc = -ENOMEM;
            break;
        }
        h->users = nu;
        h->users[h->nusers++] = u;
        any_plain |= plain;
    }
    fclose(f);
    if (rc == PS_EPARSE)
        rc = ps_errf(PS_EINVAL_ARG, err, errlen, "--metrics-auth %s:%d: %s", path,
                     lineno, why);
    else if (rc == 0 && h->nusers == 0)
        rc = ps_errf(PS_EINVAL_ARG, err, errlen, "--metrics-auth %s: no users (lines "
                     "'USER:PASSWORD' or 'USER:sha256:HEX')", path);
    else if (rc == 0)
        rc = users_mode_ok(path, &st, any_plain, err, errlen);
    else
        ps_errf(rc, err, errlen, "--metrics-auth %s: %s", path, strerror(-rc));
    return rc;
}

/* Whether the request names a user of the file with its password. Every
 * entry is compared, the hashes in constant time. */
static bool authorized(const ps_metrics_http *h, struct MHD_Connection *conn)
{
    char *pass = NULL;
    char *user = MHD_basic_auth_get_username_password(conn, &pass);
    bool ok = false;
    if (user != NULL && pass != NULL) {
        uint8_t hash[PS_SHA256_LEN];
        ps_sha256(pass, strlen(pass), hash);
        for (size_t i = 0; i < h->nusers; i++) {
            unsigned diff = 0;
            for (int k = 0; k < PS_SHA256_LEN; k++)
                diff |= (unsigned)(hash[k] ^ h->users[i].hash[k]);
            ok |= diff == 0 && strcmp(user, h->users[i].name) == 0;
        }
    }
    if (user != NULL)
        MHD_free(user);
    if (pass != NULL)
        MHD_free(pass);
    return ok;
}

/* ---- the connections' deadlines ---------------------------------------- */

static struct conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

/* The library's notice of a connection's start and close (on the loop's
 * thread; the close comes before the socket is closed). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode what)
{
    ps_metrics_http *h = cls;
    struct conn *k = *socket_context;
    if (what == MHD_CONNECTION_NOTIFY_STARTED) {
        if ((k = calloc(1, sizeof *k)) == NULL)
            return; /* no deadline: the idle timeout still holds */
        k->c = c;
        k->deadline_ms = ps_now_ms() + REQUEST_DEADLINE_MS;
        k->next = h->conns;
        if (h->conns != NULL)
            h->conns->prev = k;
        h->conns = k;
        *socket_context = k;
    } else if (k != NULL) {
        if (k->prev != NULL)
            k->prev->next = k->next;
        else
            h->conns = k->next;
        if (k->next != NULL)
            k->next->prev = k->prev;
        free(k);
        *socket_context = NULL;
    }
}

/* A request answered (or abandoned): the connection's next one has the
 * request deadline from now. */
static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)req_cls;
    (void)toe;
    struct conn *k = conn_of(c);
    if (k != NULL)
        k->deadline_ms = ps_now_ms() + REQUEST_DEADLINE_MS;
}

/* Shuts down the sockets of the connections past their deadline; the
 * library sees the end of the stream and closes them. On the loop's thread,
 * so no socket is closed under us. */
static void cut_late(ps_metrics_http *h)
{
    int64_t now = ps_now_ms();
    for (struct conn *k = h->conns; k != NULL; k = k->next) {
        if (k->cut || now < k->deadline_ms)
            continue;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(k->c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci != NULL)
            shutdown(ci->connect_fd, SHUT_RDWR);
        k->cut = true;
        ps_log_debug("metrics http: a connection past its deadline closed");
    }
}

static void *loop_main(void *arg)
{
    ps_metrics_http *h = arg;
    while (!atomic_load(&h->quit)) {
        MHD_run_wait(h->d, LOOP_WAKE_MS);
        cut_late(h);
    }
    return NULL;
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status,
                               const char *type, const char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body,
                                                             MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned status,
                                    const char *text)
{
    return respond(conn, status, "text/plain; charset=utf-8", text, strlen(text));
}

/* The page, written by the daemon's collector now. */
static enum MHD_Result scrape(ps_metrics_http *h, struct MHD_Connection *conn)
{
    ps_metrics m;
    ps_metrics_init(&m);
    h->collect(&m, h->ctx);
    enum MHD_Result ret;
    int rc = ps_metrics_error(&m);
    if (rc != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "the metrics page could not be written: %s",
                 rc == PS_EINVAL_ARG ? "a metric or label name breaks Prometheus' "
                                       "conventions (a bug: please report it)"
                                     : ps_strerror(rc));
        ps_log_warn("/metrics: %s", msg);
        size_t n = strlen(msg);
        if (n + 1 < sizeof msg)
            memcpy(msg + n, "\n", 2);
        ret = respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, msg);
    } else {
        size_t len;
        const char *text = ps_metrics_text(&m, &len);
        ret = respond(conn, MHD_HTTP_OK, CONTENT_TYPE, text, len);
    }
    ps_metrics_close(&m);
    return ret;
}

/* Called by the library for each request, first once its headers are in
 * (*req_cls NULL), then for its body if any, then once more at its end. */
static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version,
                              const char *upload_data, size_t *upload_data_size,
                              void **req_cls)
{
    ps_metrics_http *h = cls;
    (void)version;
    (void)upload_data;
    if (*req_cls == NULL) {
        /* The headers are in: the answer's deadline from now. */
        struct conn *k = conn_of(conn);
        if (k != NULL)
            k->deadline_ms = ps_now_ms() + ANSWER_DEADLINE_MS;
        if (h->users != NULL && !authorized(h, conn)) {
            static const char msg[] = "unauthorized: /metrics needs HTTP basic auth "
                                      "with a user and password of --metrics-auth\n";
            struct MHD_Response *r = MHD_create_response_from_buffer(
                sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
            if (r == NULL)
                return MHD_NO;
            MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                    "text/plain; charset=utf-8");
            enum MHD_Result ret = MHD_queue_basic_auth_fail_response(conn, "metrics", r);
            MHD_destroy_response(r);
            return ret;
        }
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
        strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                            "only GET and HEAD are served here\n");
    if (*req_cls == NULL) {
        *req_cls = h; /* headers seen; answer at the end of the request */
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        *upload_data_size = 0; /* a GET's body means nothing: skipped */
        return MHD_YES;
    }
    if (strcmp(url, "/metrics") != 0)
        return respond_text(conn, MHD_HTTP_NOT_FOUND, "not found: the metrics are "
                            "at /metrics\n");
    return scrape(h, conn);
}

static bool given(const char *s)
{
    return s != NULL && s[0] != '\0';
}

/* Frees what start made (the daemon is stopped, or was never started). */
static void endpoint_free(ps_metrics_http *h)
{
    free(h->users);
    free(h->cert_pem);
    free(h->key_pem);
    free(h);
}

/* Reads what conf asks for into h. Returns 0 or as ps_metrics_http_start. */
static int conf_load(ps_metrics_http *h, const ps_metrics_http_conf *conf, char *err,
                     size_t errlen)
{
    if (conf == NULL)
        return 0;
    if (given(conf->tls_cert) != given(conf->tls_key))
        return ps_errf(PS_EINVAL_ARG, err, errlen, "%s is given without %s",
                       given(conf->tls_cert) ? "--metrics-tls-cert" : "--metrics-tls-key",
                       given(conf->tls_cert) ? "--metrics-tls-key" : "--metrics-tls-cert");
    if (given(conf->tls_cert)) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
            return ps_errf(PS_EUNAVAIL, err, errlen, "--metrics-tls-cert: this "
                           "libmicrohttpd was built without TLS");
        if (ps_tls_read_pair("--metrics-tls-cert", conf->tls_cert, "--metrics-tls-key",
                             conf->tls_key, &h->cert_pem, &h->key_pem, err, errlen) != 0)
            return PS_EINVAL_ARG;
    }
    if (given(conf->auth))
        return users_load(h, conf->auth, err, errlen);
    return 0;
}

int ps_metrics_http_start(const char *addr, const ps_metrics_http_conf *conf,
                          ps_metrics_collect_fn collect, void *ctx,
                          ps_metrics_http **out, char *err, size_t errlen)
{
    if (addr == NULL || collect == NULL)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "no address or no collector");
    ps_metrics_http *h = calloc(1, sizeof *h);
    if (h == NULL)
        return ps_errf(-ENOMEM, err, errlen, "%s: out of memory", addr);
    h->collect = collect;
    h->ctx = ctx;
    int rc = conf_load(h, conf, err, errlen);
    if (rc != 0)
        goto fail_conf;
    h->fd = bind_listen(addr, &h->port, err, errlen);
    if (h->fd < 0) {
        rc = h->fd;
        goto fail_conf;
    }
    /* The page names every variable and the job's progress. */
    char why[256];
    bool tls = h->cert_pem != NULL, auth = h->users != NULL;
    if ((!tls || !auth) && ps_tls_check_listen(addr, NULL, false, why, sizeof why) != 0)
        ps_log_warn("--metrics-listen %s is not a loopback address: /metrics is served %s "
                    "to anyone who can reach it (see --metrics-tls-cert, --metrics-auth)",
                    addr, !tls && !auth ? "in plaintext and without authentication"
                          : !tls ? "in plaintext (the password too)"
                                 : "without authentication");
    unsigned flags = MHD_USE_EPOLL | MHD_USE_ITC | MHD_USE_ERROR_LOG |
                     (tls ? MHD_USE_TLS : 0);
    /* The library's own event loop runs on our thread (loop_main), which
     * also holds the deadlines. */
    h->d = MHD_start_daemon(
        flags, 0, NULL, NULL, answer, h,
        /* First, so that the library logs nothing before it is set. */
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)MAX_CONNECTIONS,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)PER_IP_CONNECTIONS,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)IDLE_TIMEOUT_S,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        /* HTTP/1.1 without Host, spaces in the path: 400, not a guess. */
        MHD_OPTION_STRICT_FOR_CLIENT, (int)1,
        /* Without TLS the list ends here. */
        tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, h->cert_pem,
        MHD_OPTION_HTTPS_MEM_KEY, h->key_pem,
        MHD_OPTION_END);
    if (h->d == NULL) {
        rc = ps_errf(PS_EUNAVAIL, err, errlen, "%s: libmicrohttpd did not start "
                     "(run with --log-level debug for its reason)", addr);
        goto fail_fd;
    }
    atomic_init(&h->quit, false);
    if ((rc = pthread_create(&h->th, NULL, loop_main, h)) != 0) {
        rc = ps_errf(-rc, err, errlen, "%s: no thread for the endpoint: %s", addr,
                     strerror(rc));
        goto fail_daemon;
    }
    h->th_started = true;
    if (tls || auth)
        ps_log_info("/metrics on %s: %s%s%s", addr, tls ? "HTTPS" : "HTTP",
                    auth ? ", basic auth of " : "", auth ? conf->auth : "");
    *out = h;
    return 0;

fail_daemon:
    MHD_quiesce_daemon(h->d);
    MHD_stop_daemon(h->d);
fail_fd:
    close(h->fd);
fail_conf:
    endpoint_free(h);
    return rc;
}

int ps_metrics_http_port(const ps_metrics_http *h)
{
    return h->port;
}

void ps_metrics_http_stop(ps_metrics_http *h)
{
    if (h == NULL)
        return;
    /* The loop first (it sees quit within LOOP_WAKE_MS), then the library
     * on this thread: its close notices free the connections' records. */
    atomic_store(&h->quit, true);
    if (h->th_started)
        pthread_join(h->th, NULL);
    /* Quiesced first, the socket is ours again to close after the stop
     * (the library then never closes it, nor uses it after). */
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    MHD_stop_daemon(h->d);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
    endpoint_free(h);
}

void ps_metrics_http_announce(int port)
{
    printf("METRICS_PORT %d\n", port);
    fflush(stdout);
}
