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
 * 400 and touches nothing of the daemon's. At most 64 connections, each
 * dropped after 10 s idle.
 *
 * Threads and lifetime: start and stop from the daemon's main thread (start
 * after its signals are blocked, so the library's thread inherits the
 * mask). The collector runs on the library's thread, one scrape at a time,
 * concurrently with the daemon's own threads, from start until stop
 * returns; it reads what it reports from atomics or under the daemon's
 * locks. Stop before freeing what the collector reads.
 */
#ifndef PS_METRICS_HTTP_H
#define PS_METRICS_HTTP_H

#include "common/metrics.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct ps_metrics_http ps_metrics_http;

/* True when a --metrics-listen value turns the endpoint off: NULL, "" or
 * "off". */
bool ps_metrics_http_off(const char *addr);

/* Serves collect(ctx) on addr, "HOST:PORT" or "[V6ADDR]:PORT" (port 0: a
 * free one; ps_metrics_http_port tells which). Returns 0 with *out, or:
 * PS_EINVAL_ARG when addr is not HOST:PORT with a port in 0..65535,
 * -errno when the address does not resolve or cannot be bound (-EADDRINUSE,
 * -EADDRNOTAVAIL, -EACCES...), PS_EUNAVAIL when the library does not start,
 * -ENOMEM; each failure with one line in err naming the address and the
 * reason ("127.0.0.1:9100: address already in use"). */
int ps_metrics_http_start(const char *addr, ps_metrics_collect_fn collect,
                          void *ctx, ps_metrics_http **out, char *err,
                          size_t errlen);

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
