/*
 * metrics_http.c - see metrics_http.h. The only file that includes
 * <microhttpd.h>; built with -DPS_OWNS_MHD (common/meson.build).
 */
#include "common/metrics_http.h"

#include "common/errors.h"
#include "common/log.h"
#include "common/tls.h"

#include <errno.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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
#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct ps_metrics_http {
    struct MHD_Daemon *d;
    int fd;
    int port;
    ps_metrics_collect_fn collect;
    void *ctx;
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

int ps_metrics_http_start(const char *addr, ps_metrics_collect_fn collect,
                          void *ctx, ps_metrics_http **out, char *err,
                          size_t errlen)
{
    if (addr == NULL || collect == NULL)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "no address or no collector");
    ps_metrics_http *h = calloc(1, sizeof *h);
    if (h == NULL)
        return ps_errf(-ENOMEM, err, errlen, "%s: out of memory", addr);
    h->collect = collect;
    h->ctx = ctx;
    h->fd = bind_listen(addr, &h->port, err, errlen);
    if (h->fd < 0) {
        int rc = h->fd;
        free(h);
        return rc;
    }
    /* The page names every variable and the job's progress; it is plain
     * HTTP without authentication, as Prometheus scrapes by default. */
    char why[256];
    if (ps_tls_check_listen(addr, NULL, false, why, sizeof why) != 0)
        ps_log_warn("--metrics-listen %s is not a loopback address: /metrics is served in "
                    "plaintext, without authentication, to anyone who can reach it "
                    "(keep it behind a firewall or a TLS proxy)", addr);
    h->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ITC | MHD_USE_ERROR_LOG,
        0, NULL, NULL, answer, h,
        /* First, so that the library logs nothing before it is set. */
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)MAX_CONNECTIONS,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)PER_IP_CONNECTIONS,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)IDLE_TIMEOUT_S,
        /* HTTP/1.1 without Host, spaces in the path: 400, not a guess. */
        MHD_OPTION_STRICT_FOR_CLIENT, (int)1,
        MHD_OPTION_END);
    if (h->d == NULL) {
        close(h->fd);
        free(h);
        return ps_errf(PS_EUNAVAIL, err, errlen, "%s: libmicrohttpd did not start "
                       "(run with --log-level debug for its reason)", addr);
    }
    *out = h;
    return 0;
}

int ps_metrics_http_port(const ps_metrics_http *h)
{
    return h->port;
}

void ps_metrics_http_stop(ps_metrics_http *h)
{
    if (h == NULL)
        return;
    /* Quiesced first, the socket is ours again to close after the stop
     * (the library then never closes it, nor uses it after). */
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    MHD_stop_daemon(h->d);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
    free(h);
}

void ps_metrics_http_announce(int port)
{
    printf("METRICS_PORT %d\n", port);
    fflush(stdout);
}
