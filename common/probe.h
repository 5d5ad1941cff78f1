/*
 * probe.h - a daemon's look at its own listener from outside: a connection
 * to its port, as a client would make one, that must be answered.
 *
 * Why (issue 13 d): gRPC 1.51's TCP listener stops accepting for good once
 * accept() fails with EMFILE (grpc/grpc#20418), while the calls on the
 * connections it has go on, so the process looks healthy to everything
 * but a new client. The kernel still completes the TCP handshake of a
 * connection nobody accepts (it waits in the backlog), so a connect()
 * alone proves nothing: the probe sends the HTTP/2 client preface and
 * waits for the server to answer (a plaintext HTTP/2 server sends its
 * SETTINGS frame as soon as it accepts, a TLS one an alert or a close:
 * either shows the connection was accepted).
 *
 * Threads and lifetime: no state; any thread. It blocks for at most
 * timeout_ms.
 */
#ifndef PS_PROBE_H
#define PS_PROBE_H

#include <stddef.h>

/* Connects to host:port (an IPv4 or IPv6 literal, or "localhost"; "0.0.0.0"
 * and "::" mean this host's loopback), sends the HTTP/2 preface and waits
 * up to timeout_ms for the server to answer (a byte, or a close). Returns
 * 0 when it did; otherwise a negative errno with one line in err:
 * -ETIMEDOUT (connected, nothing came, and the connection still waits in
 * the listener's accept queue: nobody accepts), -EAGAIN (nothing came, but
 * the connection was accepted: the server is alive and slow, its threads
 * busy or starved), -EMFILE (this process has no descriptor left), -EINVAL
 * (host is not an address literal: the caller cannot probe it). The accept
 * queue is read from /proc/net/tcp and tcp6 (a listener's rx_queue is its
 * queue's length), in this network namespace: the probe is of a listener
 * of this host; where they cannot be read, a silence is -ETIMEDOUT. */
int ps_probe_listener(const char *host, int port, int timeout_ms, char *err,
                      size_t errlen);

/* Descriptors this process has open now, and its limit (RLIMIT_NOFILE's
 * soft value); -1 for what cannot be read. */
int ps_probe_open_files(void);
long ps_probe_max_files(void);

/* Raises RLIMIT_NOFILE's soft limit to its hard one (what a server wants:
 * the soft limit, often 1024, is a default for interactive shells). Returns
 * the soft limit now. */
long ps_probe_raise_files(void);

#endif
