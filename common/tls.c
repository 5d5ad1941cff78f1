/*
 * tls.c - TLS and mutual TLS credentials, their reload, and the loopback
 * rule (tls.h).
 *
 * Why the certificate-config fetcher rather than fixed credentials: gRPC
 * core makes a server's SSL context once per port; only a fetcher lets a
 * running server take new certificates, and gRPC calls it at every
 * handshake. The fetcher answers UNCHANGED in a few nanoseconds (one atomic
 * load) unless ps_tls_reload bumped the generation since it last read.
 */
#include "common/tls.h"

#include "common/log.h"
#include "common/pemcheck.h"

#include <errno.h>
#include <grpc/grpc_security.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

/* A PEM file bigger than this is not a certificate bundle. */
#define PEM_MAX (4u << 20)

static atomic_uint generation;

bool ps_tls_server_enabled(const ps_tls_opts *o)
{
    return o != NULL && o->cert != NULL && o->cert[0] != '\0';
}

bool ps_tls_client_enabled(const ps_tls_opts *o)
{
    return o != NULL && ((o->ca != NULL && o->ca[0] != '\0') ||
                         (o->cert != NULL && o->cert[0] != '\0'));
}

static bool given(const char *s)
{
    return s != NULL && s[0] != '\0';
}

const char *ps_tls_server_mode(const ps_tls_opts *o)
{
    if (!ps_tls_server_enabled(o))
        return "plaintext";
    return given(o->ca) ? "mtls" : "tls";
}

const char *ps_tls_target_name(const ps_tls_opts *o)
{
    return o != NULL && given(o->target_name) ? o->target_name : NULL;
}

bool ps_tls_is_unix(const char *addr)
{
    return addr != NULL && strncmp(addr, "unix", 4) == 0 &&
           (addr[4] == ':' || strncmp(addr + 4, "-abstract:", 10) == 0);
}

void ps_tls_reload(void)
{
    atomic_fetch_add(&generation, 1);
}

/* Reads a PEM file whole, NUL-terminated, into *out (the caller frees),
 * checking that it holds a block whose header ends in `kind` ("CERTIFICATE",
 * "PRIVATE KEY"). Returns 0, or -1 with err naming the flag and file. */
static int read_pem(const char *flag, const char *path, const char *kind,
                    char **out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "%s %s: %s", flag, path, strerror(errno));
        return -1;
    }
    char *buf = malloc(PEM_MAX + 1);
    size_t n = buf != NULL ? fread(buf, 1, PEM_MAX + 1, f) : 0;
    int bad = buf == NULL ? ENOMEM : ferror(f) ? EIO : 0;
    fclose(f);
    if (bad != 0 || n > PEM_MAX) {
        snprintf(err, errlen, "%s %s: %s", flag, path,
                 bad != 0 ? strerror(bad) : "larger than 4 MiB, not a PEM file");
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    char want[64];
    snprintf(want, sizeof want, "%s-----", kind);
    const char *begin = strstr(buf, "-----BEGIN ");
    const char *end = begin != NULL ? strstr(begin, "\n") : NULL;
    const char *hit = begin != NULL ? strstr(begin, want) : NULL;
    if (hit == NULL || (end != NULL && hit > end)) {
        snprintf(err, errlen, "%s %s: holds no PEM %s", flag, path, kind);
        free(buf);
        return -1;
    }
    *out = buf;
    return 0;
}

/* The three PEM texts of a server or client configuration. */
struct pems {
    char *cert, *key, *ca;
};

static void pems_free(struct pems *p)
{
    free(p->cert);
    free(p->key);
    free(p->ca);
    memset(p, 0, sizeof *p);
}

/* Whether key_pem (from key_flag's file key) is the key of cert_pem (from
 * cert_flag's file cert): gRPC or GnuTLS would take a wrong pair and fail
 * every handshake after. Returns 0, or -1 with err set. */
static int pair_check(const char *cert_flag, const char *cert, const char *cert_pem,
                      const char *key_flag, const char *key, const char *key_pem,
                      char *err, size_t errlen)
{
    switch (ps_pem_check_pair(cert_pem, key_pem)) {
    case PS_PEM_OK:
        return 0;
    case PS_PEM_BAD_CERT:
        snprintf(err, errlen, "%s %s: its certificate cannot be parsed", cert_flag, cert);
        return -1;
    case PS_PEM_BAD_KEY:
        snprintf(err, errlen, "%s %s: its private key cannot be parsed", key_flag, key);
        return -1;
    case PS_PEM_MISMATCH:
    default:
        snprintf(err, errlen, "%s %s is not the key of %s %s", key_flag, key, cert_flag,
                 cert);
        return -1;
    }
}

int ps_tls_read_pair(const char *cert_flag, const char *cert, const char *key_flag,
                     const char *key, char **cert_pem, char **key_pem, char *err,
                     size_t errlen)
{
    *cert_pem = *key_pem = NULL;
    if (read_pem(cert_flag, cert, "CERTIFICATE", cert_pem, err, errlen) != 0)
        return -1;
    if (read_pem(key_flag, key, "PRIVATE KEY", key_pem, err, errlen) != 0 ||
        pair_check(cert_flag, cert, *cert_pem, key_flag, key, *key_pem, err,
                   errlen) != 0) {
        free(*cert_pem);
        free(*key_pem);
        *cert_pem = *key_pem = NULL;
        return -1;
    }
    return 0;
}

/* Reads what o names. A certificate needs its key and the other way
 * round, and the key must be the certificate's. Returns 0, or -1 with err set and nothing held. */
static int pems_read(const ps_tls_opts *o, struct pems *p, char *err,
                     size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (given(o->cert) != given(o->key)) {
        snprintf(err, errlen, "%s is given without %s",
                 given(o->cert) ? "--tls-cert" : "--tls-key",
                 given(o->cert) ? "--tls-key" : "--tls-cert");
        return -1;
    }
    if ((given(o->cert) &&
         (read_pem("--tls-cert", o->cert, "CERTIFICATE", &p->cert, err, errlen) != 0 ||
          read_pem("--tls-key", o->key, "PRIVATE KEY", &p->key, err, errlen) != 0)) ||
        (given(o->ca) &&
         read_pem("--tls-ca", o->ca, "CERTIFICATE", &p->ca, err, errlen) != 0)) {
        pems_free(p);
        return -1;
    }
    if (given(o->cert) && pair_check("--tls-cert", o->cert, p->cert, "--tls-key", o->key,
                                     p->key, err, errlen) != 0) {
        pems_free(p);
        return -1;
    }
    return 0;
}

int ps_tls_check_files(const ps_tls_opts *o, char *err, size_t errlen)
{
    struct pems p;
    if (o == NULL)
        return 0;
    if (pems_read(o, &p, err, errlen) != 0)
        return -1;
    pems_free(&p);
    return 0;
}

/* How close to its end a server certificate's validity draws a warning. */
#define EXPIRY_WARN_S (7 * 86400)

/* Warns, one line each, about what a server's files leave open: a
 * certificate that expired or expires within 7 days (clients will refuse
 * it), and a private key that others may read. At start and at each
 * reload that takes new files. */
static void warn_server_files(const ps_tls_opts *o, const struct pems *p)
{
    long long end;
    if (p->cert != NULL && ps_pem_cert_not_after(p->cert, &end) == 0) {
        long long left = end - (long long)time(NULL);
        char when[32];
        time_t t = (time_t)end;
        struct tm tm;
        strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime_r(&t, &tm));
        if (left <= 0)
            ps_log_warn("tls: --tls-cert %s expired on %s: clients will refuse it",
                        o->cert, when);
        else if (left < EXPIRY_WARN_S)
            ps_log_warn("tls: --tls-cert %s expires on %s, in %.1f days", o->cert,
                        when, (double)left / 86400.0);
    }
    struct stat st;
    if (given(o->key) && stat(o->key, &st) == 0 && (st.st_mode & S_IROTH))
        ps_log_warn("tls: --tls-key %s may be read by others (mode %03o): chmod 600",
                    o->key, (unsigned)(st.st_mode & 0777));
}

/* ---- the server's fetcher ----------------------------------------------- */

/* What one server's credentials re-read. On a static list, so that it
 * stays reachable for as long as gRPC may call the fetcher. */
struct reloader {
    char *cert, *key, *ca; /* paths; ca NULL: no client certificates */
    pthread_mutex_t mu;
    bool loaded;           /* the first fetch is done */
    unsigned seen;         /* the generation last read */
    struct reloader *next;
};

static pthread_mutex_t reloaders_mu = PTHREAD_MUTEX_INITIALIZER;
static struct reloader *reloaders;

/* gRPC's certificate-config callback: at the port's creation (which must
 * answer NEW) and before every handshake. */
static grpc_ssl_certificate_config_reload_status
fetch_config(void *user_data, grpc_ssl_server_certificate_config **config)
{
    struct reloader *r = user_data;
    unsigned gen = atomic_load(&generation);
    grpc_ssl_certificate_config_reload_status st =
        GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    pthread_mutex_lock(&r->mu);
    if (r->loaded && gen == r->seen)
        goto out;
    bool first = !r->loaded;
    r->seen = gen;
    ps_tls_opts o = {.cert = r->cert, .key = r->key, .ca = r->ca};
    struct pems p;
    char err[512];
    if (pems_read(&o, &p, err, sizeof err) != 0) {
        if (first) {
            ps_log_error("tls: %s", err);
            st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
        } else {
            ps_log_warn("tls: reload: %s; keeping the certificates in use", err);
        }
        goto out;
    }
    grpc_ssl_pem_key_cert_pair pair = {.private_key = p.key, .cert_chain = p.cert};
    /* gRPC copies the strings. gRPC 1.51's server connector asserts that a
     * fetched configuration has root certificates, even when it asks
     * clients for none (GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE): without
     * a CA (one-way TLS) the server's own chain stands in. It verifies
     * nothing, since no client is asked for a certificate. */
    *config = grpc_ssl_server_certificate_config_create(p.ca != NULL ? p.ca : p.cert,
                                                        &pair, 1);
    if (!first)
        warn_server_files(&o, &p);
    pems_free(&p);
    r->loaded = true;
    st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
    if (!first)
        ps_log_info("tls: reloaded %s, %s%s%s", r->cert, r->key,
                    r->ca != NULL ? " and " : "", r->ca != NULL ? r->ca : "");
out:
    pthread_mutex_unlock(&r->mu);
    return st;
}

static struct reloader *reloader_create(const ps_tls_opts *o)
{
    struct reloader *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->cert = strdup(o->cert);
    r->key = strdup(o->key);
    r->ca = given(o->ca) ? strdup(o->ca) : NULL;
    if (r->cert == NULL || r->key == NULL || (given(o->ca) && r->ca == NULL)) {
        free(r->cert);
        free(r->key);
        free(r->ca);
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_lock(&reloaders_mu);
    r->next = reloaders;
    reloaders = r;
    pthread_mutex_unlock(&reloaders_mu);
    return r;
}

/* Whether a side speaks TLS: when enabled, or when a key is given (which
 * pems_read then refuses without its certificate). If so, reads the files
 * into *p. Returns 1 with *p read, 0 for plaintext, -1 with err set. */
static int pems_wanted(const ps_tls_opts *o, bool enabled, struct pems *p, char *err,
                       size_t errlen)
{
    if (!enabled && !(o != NULL && given(o->key)))
        return 0;
    return pems_read(o, p, err, errlen) == 0 ? 1 : -1;
}

/* Whether the server speaks TLS, as pems_wanted. Its files are read once
 * here so that a bad file is refused at start, by name, and what they leave
 * open is said at start; the credentials read them again at each handshake
 * (fetch_config). */
static int server_files_check(const ps_tls_opts *o, char *err, size_t errlen)
{
    struct pems p;
    int tls = pems_wanted(o, ps_tls_server_enabled(o), &p, err, errlen);
    if (tls == 1) {
        warn_server_files(o, &p);
        pems_free(&p);
    }
    return tls;
}

grpc_server_credentials *ps_tls_server_creds(const ps_tls_opts *o, char *err,
                                             size_t errlen)
{
    int tls = server_files_check(o, err, errlen);
    if (tls <= 0)
        return tls == 0 ? grpc_insecure_server_credentials_create() : NULL;
    struct reloader *r = reloader_create(o);
    if (r == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    grpc_ssl_server_credentials_options *so =
        grpc_ssl_server_credentials_create_options_using_config_fetcher(
            given(o->ca) ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                         : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            fetch_config, r);
    grpc_server_credentials *creds =
        so != NULL ? grpc_ssl_server_credentials_create_with_options(so) : NULL;
    if (creds == NULL)
        snprintf(err, errlen, "gRPC refused the TLS configuration of %s", o->cert);
    return creds;
}

grpc_channel_credentials *ps_tls_channel_creds(const ps_tls_opts *o, char *err,
                                               size_t errlen)
{
    struct pems p;
    int tls = pems_wanted(o, ps_tls_client_enabled(o), &p, err, errlen);
    if (tls <= 0)
        return tls == 0 ? grpc_insecure_credentials_create() : NULL;
    grpc_ssl_pem_key_cert_pair pair = {.private_key = p.key, .cert_chain = p.cert};
    grpc_channel_credentials *creds = grpc_ssl_credentials_create_ex(
        p.ca, p.cert != NULL ? &pair : NULL, NULL, NULL);
    pems_free(&p);
    if (creds == NULL)
        snprintf(err, errlen, "gRPC refused the TLS configuration");
    return creds;
}

/* ---- the process's client default ---------------------------------------- */

static ps_tls_opts client_default;
static bool client_default_set;

static void client_default_free(void)
{
    free((char *)client_default.cert);
    free((char *)client_default.key);
    free((char *)client_default.ca);
    free((char *)client_default.target_name);
    memset(&client_default, 0, sizeof client_default);
    client_default_set = false;
}

static int dup_opt(const char *s, const char **out)
{
    *out = NULL;
    if (!given(s))
        return 0;
    *out = strdup(s);
    return *out != NULL ? 0 : -ENOMEM;
}

int ps_tls_set_client_default(const ps_tls_opts *o)
{
    client_default_free();
    if (o == NULL || (!ps_tls_client_enabled(o) && !given(o->key)))
        return 0;
    if (dup_opt(o->cert, &client_default.cert) != 0 ||
        dup_opt(o->key, &client_default.key) != 0 ||
        dup_opt(o->ca, &client_default.ca) != 0 ||
        dup_opt(o->target_name, &client_default.target_name) != 0) {
        client_default_free();
        return -ENOMEM;
    }
    client_default_set = true;
    return 0;
}

const ps_tls_opts *ps_tls_client_default(void)
{
    return client_default_set ? &client_default : NULL;
}

ps_tls_opts ps_tls_opts_of(const ps_tls_conf *c)
{
    return (ps_tls_opts){.cert = c->cert, .key = c->key, .ca = c->ca,
                         .target_name = c->target_name,
                         .require_client_cert = given(c->ca)};
}

/* ---- the loopback rule ---------------------------------------------------- */

/* The host of "host:port", "[v6]:port" or a bare host, into host. */
static void listen_host(const char *listen, char *host, size_t len)
{
    const char *start = listen, *end;
    if (strncmp(start, "dns:///", 7) == 0)
        start += 7;
    else if (strncmp(start, "ipv4:", 5) == 0 || strncmp(start, "ipv6:", 5) == 0)
        start += 5;
    if (*start == '[') {
        start++;
        end = strchr(start, ']');
    } else {
        end = strrchr(start, ':');
    }
    if (end == NULL)
        end = start + strlen(start);
    size_t n = (size_t)(end - start);
    if (n >= len)
        n = len - 1;
    memcpy(host, start, n);
    host[n] = '\0';
}

/* True when host resolves to loopback addresses only. */
static bool host_is_loopback(const char *host)
{
    if (host[0] == '\0')
        return false; /* ":7070" is every interface */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return false;
    bool all = res != NULL;
    for (struct addrinfo *a = res; a != NULL; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            const struct sockaddr_in *s = (const void *)a->ai_addr;
            all &= (ntohl(s->sin_addr.s_addr) >> 24) == 127;
        } else if (a->ai_family == AF_INET6) {
            const struct sockaddr_in6 *s = (const void *)a->ai_addr;
            all &= IN6_IS_ADDR_LOOPBACK(&s->sin6_addr);
        } else {
            all = false;
        }
    }
    freeaddrinfo(res);
    return all;
}

bool ps_tls_host_is_loopback(const char *host)
{
    if (host == NULL)
        return false;
    /* A bracketed IPv6 literal, as "[::1]". */
    char h[256];
    size_t n = strlen(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']' && n - 2 < sizeof h) {
        memcpy(h, host + 1, n - 2);
        h[n - 2] = '\0';
        return host_is_loopback(h);
    }
    return host_is_loopback(host);
}

int ps_tls_check_listen(const char *listen, const ps_tls_opts *o,
                        bool insecure, char *err, size_t errlen)
{
    if (listen == NULL || ps_tls_is_unix(listen) || ps_tls_server_enabled(o) ||
        insecure)
        return 0;
    char host[256];
    listen_host(listen, host, sizeof host);
    if (host_is_loopback(host))
        return 0;
    snprintf(err, errlen, "--listen %s is not a loopback address: serve it with "
             "TLS (--tls-cert FILE --tls-key FILE), or in plaintext with "
             "--insecure", listen);
    return -1;
}
