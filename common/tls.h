/*
 * tls.h - transport security for every gRPC port and client: TLS and
 * mutual TLS from PEM files, certificate reload on SIGHUP, and the rule
 * that a daemon serves a non-loopback address only with TLS or --insecure.
 *
 * Files. A server has a certificate (chain) and its private key, and
 * optionally a CA bundle: when the CA is given every client must present a
 * certificate that chains to it (mutual TLS). A client has the CA that the
 * server's certificate must chain to, and optionally a certificate and key
 * of its own (for a server that requires one). The daemons use one set of
 * files both ways: psd and pscoord serve with --tls-cert/--tls-key and call
 * each other with the same certificate as their client identity, so a
 * task's certificate carries both the serverAuth and clientAuth usages
 * (tools/pscerts.sh makes them so). The files are read by the process
 * itself, at start and at each reload; an error names the file.
 *
 * One-way TLS. A server with a certificate and key but no CA serves TLS
 * that clients verify while it asks them for no certificate: tokens
 * (auth.h) are then the clients' identity. A daemon so configured checks
 * the daemons it calls against the system's roots, as it has no CA.
 *
 * Reload. The server credentials are made with gRPC's certificate-config
 * fetcher: gRPC asks it at every TLS handshake whether the configuration
 * changed. ps_tls_reload() (psd's and pscoord's control loop calls it on
 * SIGHUP) bumps a process-wide generation; the next handshake re-reads the
 * certificate, key and CA files and, if they read and hold PEM, switches
 * to them (connections already made keep theirs). A file that is missing
 * or bad keeps the old configuration and logs one line naming it.
 *
 * Unix sockets ("unix:PATH") are always served and called in plaintext:
 * they are reachable only on this host, as their file mode allows.
 *
 * Threads and lifetime: ps_tls_reload may be called from any thread; the
 * fetcher runs on gRPC's threads. The state behind a server's credentials
 * lives until the process ends (gRPC gives the fetcher no destructor), a
 * few hundred bytes per server. ps_tls_set_client_default is called once
 * by main before any client is made. Every other function is pure or
 * returns objects its caller releases.
 */
#ifndef PS_TLS_H
#define PS_TLS_H

#include <stdbool.h>
#include <stddef.h>

/* gRPC's own types, named here so that this header needs no gRPC header
 * (a repeated typedef is valid C11). */
typedef struct grpc_server_credentials grpc_server_credentials;
typedef struct grpc_channel_credentials grpc_channel_credentials;

typedef struct ps_tls_opts {
    const char *cert; /* PEM certificate (chain): the server's, or the
                         client's own for mutual TLS; NULL/"" = none */
    const char *key;  /* its PEM private key; required with cert */
    const char *ca;   /* server: client certificates must chain to it
                         (mutual TLS); client: the server's must;
                         NULL/"" = server: no client certificates,
                         client: the system's roots */
    const char *target_name; /* client: the name the server's certificate
                                must carry, when it is not the target's
                                host (an address); NULL/"" = the host */
    bool require_client_cert; /* server: true with a CA (set by
                                 ps_tls_server_creds from ca) */
} ps_tls_opts;

/* True when o configures TLS: a certificate (server), or a CA or a
 * certificate (client). o may be NULL. */
bool ps_tls_server_enabled(const ps_tls_opts *o);
bool ps_tls_client_enabled(const ps_tls_opts *o);

/* "mtls" (certificate and CA), "tls" (certificate) or "plaintext", for
 * Stats' transport_security and the start-up log line. */
const char *ps_tls_server_mode(const ps_tls_opts *o);

/* Server credentials for a gRPC port: insecure ones when o has no
 * certificate (o may be NULL), else SSL credentials that reload on
 * ps_tls_reload. Returns NULL with err set to one line naming the file
 * ("--tls-key /x/k.pem: No such file or directory") when a file cannot be
 * read or does not hold PEM, or a key or certificate is missing. The
 * caller releases the result (grpc_server_credentials_release) once the
 * ports are added; the auth module may attach its metadata processor to
 * it first. */
grpc_server_credentials *ps_tls_server_creds(const ps_tls_opts *o, char *err,
                                             size_t errlen);

/* Channel credentials for a client: insecure ones when o configures no TLS
 * (o may be NULL), else SSL credentials with o's CA (or the system's
 * roots) and client certificate. Returns NULL with err set as above. The
 * target name override is a channel argument: see
 * ps_tls_target_name. */
grpc_channel_credentials *ps_tls_channel_creds(const ps_tls_opts *o, char *err,
                                               size_t errlen);

/* The TLS target name override for a channel, or NULL. */
const char *ps_tls_target_name(const ps_tls_opts *o);

/* Reads the files o names as ps_tls_server_creds or ps_tls_channel_creds
 * would, so that main can refuse a bad one at start with one line.
 * Returns 0, or -1 with err naming the flag and file. */
int ps_tls_check_files(const ps_tls_opts *o, char *err, size_t errlen);

/* Reads a certificate and its key for a listener that gRPC does not serve
 * (the /metrics endpoint's HTTPS, common/metrics_http.h): both PEM files
 * whole and NUL-terminated into *cert_pem and *key_pem (the caller frees
 * both), checked to be a pair. cert_flag and key_flag name the options in
 * err. Returns 0, or -1 with err naming the flag and file and nothing
 * held. */
int ps_tls_read_pair(const char *cert_flag, const char *cert, const char *key_flag,
                     const char *key, char **cert_pem, char **key_pem, char *err,
                     size_t errlen);

/* Asks every TLS server of the process to re-read its files at its next
 * handshake (see Reload). Async-signal-safe (one atomic increment). */
void ps_tls_reload(void);

/* The client TLS every ps_rpc_client uses whose options name none
 * (psclient, coordclient, pscoord's calls to psd): the process's identity.
 * The strings are copied. NULL or no TLS: plaintext (the default). Returns
 * 0 or -ENOMEM. */
int ps_tls_set_client_default(const ps_tls_opts *o);
/* The process default (NULL: plaintext). Valid until the next set. */
const ps_tls_opts *ps_tls_client_default(void);

/* True for a unix socket target or listen address ("unix:...",
 * "unix-abstract:..."), served and called in plaintext. */
bool ps_tls_is_unix(const char *addr);

/* The rule for a daemon's listen address: a unix socket or a host that is
 * loopback (127.0.0.0/8, ::1, "localhost", or a name that resolves only to
 * those) may be served in plaintext; any other needs TLS (o) or insecure.
 * Returns 0 when the address may be served, else -1 with err set to the
 * one line to print. */
int ps_tls_check_listen(const char *listen, const ps_tls_opts *o,
                        bool insecure, char *err, size_t errlen);

/* True when host (a name, an address, or "[v6]") resolves to loopback
 * addresses only: 127.0.0.0/8 and ::1. "" and unresolvable names are not. */
bool ps_tls_host_is_loopback(const char *host);

/* ---- the flags --------------------------------------------------------- */

/* The TLS flags as a daemon's or tool's config struct holds them (each a
 * malloc'd string from ps_conf_load, NULL when not given). */
typedef struct ps_tls_conf {
    char *cert, *key, *ca, *target_name;
    bool insecure; /* servers: --insecure */
} ps_tls_conf;

/* The ps_tls_opts that c names (borrowing its strings). */
ps_tls_opts ps_tls_opts_of(const ps_tls_conf *c);

/* Entries of an options table (common/conf.h) for a ps_tls_conf at
 * offsetof(TYPE, MEMBER): the client flags, and the server flags (which
 * also make the daemon's identity as a client of other daemons). */
#define PS_TLS_CLIENT_OPTS(TYPE, MEMBER)                                        \
    {"tls-ca", PS_OPT_STRING, offsetof(TYPE, MEMBER.ca), NULL,                  \
     "PEM CA file the servers' certificates must chain to: turns TLS on for "  \
     "every call (default: plaintext)", 0, 0, NULL},                           \
    {"tls-cert", PS_OPT_STRING, offsetof(TYPE, MEMBER.cert), NULL,              \
     "PEM certificate this process presents to servers that require one "      \
     "(mutual TLS); default: none", 0, 0, NULL},                               \
    {"tls-key", PS_OPT_STRING, offsetof(TYPE, MEMBER.key), NULL,                \
     "the PEM private key of --tls-cert", 0, 0, NULL},                         \
    {"tls-target-name", PS_OPT_STRING, offsetof(TYPE, MEMBER.target_name),     \
     NULL, "name the servers' certificates must carry when it is not the "     \
     "host of the address called (default: that host)", 0, 0, NULL}

#define PS_TLS_SERVER_OPTS(TYPE, MEMBER)                                        \
    {"tls-cert", PS_OPT_STRING, offsetof(TYPE, MEMBER.cert), NULL,              \
     "PEM certificate (chain) to serve with, also presented when this daemon " \
     "calls another; read again on SIGHUP (default: none, plaintext)", 0, 0,  \
     NULL},                                                                     \
    {"tls-key", PS_OPT_STRING, offsetof(TYPE, MEMBER.key), NULL,                \
     "the PEM private key of --tls-cert; read again on SIGHUP", 0, 0, NULL},   \
    {"tls-ca", PS_OPT_STRING, offsetof(TYPE, MEMBER.ca), NULL,                  \
     "PEM CA file: clients must present a certificate that chains to it "      \
     "(mutual TLS), and the daemons this one calls must too; read again on "   \
     "SIGHUP (default: no client certificates)", 0, 0, NULL},                  \
    {"tls-target-name", PS_OPT_STRING, offsetof(TYPE, MEMBER.target_name),     \
     NULL, "name the certificates of the daemons this one calls must carry "   \
     "when it is not the host of their address (default: that host)", 0, 0,  \
     NULL},                                                                     \
    {"insecure", PS_OPT_BOOL, offsetof(TYPE, MEMBER.insecure), "false",        \
     "serve a --listen address that is not loopback in plaintext (logged as "  \
     "a warning and shown in Stats); without it such an address needs TLS",   \
     0, 0, NULL}

#endif
