/*
 * metrics_http.h - a daemon's /metrics endpoint: GET /metrics answers the
 * page the daemon's collector writes (common/metrics.h) as
 * "text/plain; version=0.0.4", for Prometheus to scrape.
 *
 * HTTP is Debian's libmicrohttpd's, with its own polling thread: this file
 * is the only one that includes <microhttpd.h> (common/confine.h). It binds
 * the listen socket itself, so that an address that cannot be bound is
 * refused at start with the reason, and hands the socket to the library.
 * Answers: GET or HEAD /metrics 200 (500 naming the problem if the
 * collector wrote an invalid page), any other path 404, any other method
 * 405 with "Allow: GET, HEAD"; a request the library cannot parse gets its
 * 400 and touches nothing of the daemon's.
 *
 * Limits: at most 64 connections, 8 from one address; a connection gets 5 s
 * from its accept (or the end of its previous request) to have sent a whole
 * request's headers, TLS handshake included, and 10 s more to be answered;
 * past either it is closed, however steadily it trickles bytes. Idle, it is
 * dropped after 10 s.
 *
 * Options (ps_metrics_http_conf, the flags PS_METRICS_HTTP_OPTS declares):
 * HTTP basic auth from a file of "USER:PASSWORD" or "USER:sha256:HEX" lines
 * (HEX the SHA-256 of the password; a file with passwords in the clear that
 * a group or others may read is refused, and any file they may write, as
 * for token files), and HTTPS from a PEM certificate and key (GnuTLS, in
 * libmicrohttpd). Both are read once, at start; a bad file is one line
 * naming it. A request without the right user and password is 401 with
 * WWW-Authenticate, and the collector does not run.
 *
 * Threads and lifetime: start and stop from the daemon's main thread (start
 * after its signals are blocked, so the endpoint's thread inherits the
 * mask). The endpoint runs the library's event loop on a thread of its own;
 * the collector runs there, one scrape at a time, concurrently with the
 * daemon's own threads, from start until stop returns; it reads what it
 * reports from atomics or under the daemon's locks. Stop before freeing
 * what the collector reads.
 */
#ifndef PS_METRICS_HTTP_H
#define PS_METRICS_HTTP_H

#include "common/metrics.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct ps_metrics_http ps_metrics_http;

/* What a daemon's flags ask of the endpoint beyond its address; NULL
 * strings: not asked. The daemons fill it from PS_METRICS_HTTP_OPTS. */
typedef struct ps_metrics_http_conf {
    char *auth;     /* --metrics-auth FILE: basic auth */
    char *tls_cert; /* --metrics-tls-cert, --metrics-tls-key: HTTPS */
    char *tls_key;
} ps_metrics_http_conf;

/* The flags of a ps_metrics_http_conf member of a daemon's config struct,
 * for its ps_opt table (common/conf.h): a string each, no default. */
#define PS_METRICS_HTTP_OPT(NAME, TYPE, FIELD, HELP) \
    {NAME, PS_OPT_STRING, offsetof(TYPE, FIELD), NULL, HELP, 0, 0, NULL}
#define PS_METRICS_HTTP_OPTS(TYPE, MEMBER)                                                \
    PS_METRICS_HTTP_OPT("metrics-auth", TYPE, MEMBER.auth,                                \
                        "file of 'USER:PASSWORD' or 'USER:sha256:HEX' lines: /metrics "   \
                        "then needs HTTP basic auth from one of them (default: none)"),   \
    PS_METRICS_HTTP_OPT("metrics-tls-cert", TYPE, MEMBER.tls_cert,                        \
                        "PEM certificate (chain) /metrics is served with over HTTPS, "    \
                        "with --metrics-tls-key (default: plain HTTP)"),                  \
    PS_METRICS_HTTP_OPT("metrics-tls-key", TYPE, MEMBER.tls_key,                          \
                        "the PEM private key of --metrics-tls-cert")

/* True when a --metrics-listen value turns the endpoint off: NULL, "" or
 * "off". */
bool ps_metrics_http_off(const char *addr);

/* Serves collect(ctx) on addr, "HOST:PORT" or "[V6ADDR]:PORT" (port 0: a
 * free one; ps_metrics_http_port tells which), with conf's options (NULL:
 * none). Returns 0 with *out, or: PS_EINVAL_ARG when addr is not HOST:PORT
 * with a port in 0..65535, or a file of conf is missing, malformed or too
 * open (err names the flag and the file), -errno when the address does not
 * resolve or cannot be bound (-EADDRINUSE, -EADDRNOTAVAIL, -EACCES...),
 * PS_EUNAVAIL when the library does not start (or has no TLS), -ENOMEM;
 * each failure with one line in err naming the address or file and the
 * reason ("127.0.0.1:9100: address already in use"). */
int ps_metrics_http_start(const char *addr, const ps_metrics_http_conf *conf,
                          ps_metrics_collect_fn collect, void *ctx,
                          ps_metrics_http **out, char *err, size_t errlen);

/* The port the endpoint listens on. */
int ps_metrics_http_port(const ps_metrics_http *h);

/* Stops serving (waits for a scrape in progress), closes the socket and
 * frees. NULL is a no-op. */
void ps_metrics_http_stop(ps_metrics_http *h);

/* Tells whoever started the daemon where its metrics are: one line
 * "METRICS_PORT <n>" on stdout, flushed; daemons print it right after
 * "PORT <n>" (common/proc.h). */
void ps_metrics_http_announce(int port);

#endif
