/*
 * rpc_local.c - the unix socket's acceptor: credentials per connection,
 * a cap on connections, and a listener that survives EMFILE. See
 * rpc_local.h.
 */
#include "common/rpc_local.h"

#include "common/clock.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* The client's HTTP/2 connection preface ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"):
 * a connection is handed to gRPC once this many bytes have come. */
#define PREFACE_LEN 24
/* How often a connection that sent part of it is looked at again. */
#define PARTIAL_RECHECK_MS 10

/* A connection accepted but not yet handed to gRPC: its preface has not
 * all come. */
struct pending {
    int fd;
    int64_t deadline_ms;
    bool partial; /* some bytes came: poll would not wait for more */
};

/* One accepted connection, at the index of its descriptor. */
struct conn {
    bool used;
    dev_t dev;
    ino_t ino; /* the socket's: descriptor N is still this connection */
    ps_rpc_peer_cred cred;
};

struct rpc_local {
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int lfd;     /* the listening socket */
    int wake;    /* eventfd: rpc_local_stop */
    int spare;   /* a descriptor kept to let go at EMFILE */
    int max_conns;
    int handshake_ms; /* the preface must come within this; 0 = no limit */
    struct pending *pend;
    size_t npend, cappend;
    grpc_server *server;
    pthread_t th;
    bool started;
    pthread_mutex_t mu; /* the table */
    struct conn *t;
    size_t nt;
    uint64_t next_conn;
    atomic_uint_fast64_t refused;
    int64_t last_warn_ms;
};

int rpc_local_listen(const char *path, int max_conns, int handshake_ms, rpc_local **out)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return -ENAMETOOLONG;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    rpc_local *l = calloc(1, sizeof *l);
    if (l == NULL)
        return -ENOMEM;
    snprintf(l->path, sizeof l->path, "%s", path);
    l->max_conns = max_conns > 0 ? max_conns : 1 << 30;
    l->handshake_ms = handshake_ms > 0 ? handshake_ms : 0;
    l->wake = l->spare = -1;
    pthread_mutex_init(&l->mu, NULL);
    int rc = 0;
    /* As gRPC's listener did: a socket file left by a psd that died is
     * replaced; anything else at the path is not touched (bind fails). */
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(path);
    l->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (l->lfd < 0 || bind(l->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(l->lfd, SOMAXCONN) != 0)
        rc = errno == EADDRINUSE || errno == ENOENT || errno == EACCES ? -EADDRINUSE
                                                                       : -errno;
    if (rc == 0 && (l->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        rc = -errno;
    if (rc != 0) {
        if (l->lfd >= 0)
            close(l->lfd);
        pthread_mutex_destroy(&l->mu);
        free(l);
        return rc;
    }
    l->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    *out = l;
    return 0;
}

/* Whether entry i is still the connection it was (descriptor i is the same
 * socket). Called with mu held. */
static bool conn_alive(const rpc_local *l, size_t i)
{
    struct stat st;
    return l->t[i].used && fstat((int)i, &st) == 0 && st.st_dev == l->t[i].dev &&
           st.st_ino == l->t[i].ino;
}

/* Connections still open; forgets the others. Called with mu held. */
static int count_open(rpc_local *l)
{
    int n = 0;
    for (size_t i = 0; i < l->nt; i++) {
        if (!l->t[i].used)
            continue;
        if (conn_alive(l, i))
            n++;
        else
            l->t[i].used = false;
    }
    return n;
}

/* Records fd's credentials. Returns 0, or -ENOMEM. Called with mu held. */
static int record(rpc_local *l, int fd)
{
    if ((size_t)fd >= l->nt) {
        size_t n = (size_t)fd + 64;
        struct conn *t = realloc(l->t, n * sizeof *t);
        if (t == NULL)
            return -ENOMEM;
        memset(t + l->nt, 0, (n - l->nt) * sizeof *t);
        l->t = t;
        l->nt = n;
    }
    struct ucred uc;
    socklen_t len = sizeof uc;
    struct stat st;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) != 0 || fstat(fd, &st) != 0)
        return -errno;
    struct conn *c = &l->t[fd];
    *c = (struct conn){.used = true, .dev = st.st_dev, .ino = st.st_ino};
    /* start: the peer's start time (field 22 of /proc/PID/stat, clock
     * ticks since boot; 0 if it is gone already). */
    c->cred = (ps_rpc_peer_cred){.pid = uc.pid, .uid = uc.uid, .gid = uc.gid,
                                 .start = ps_proc_stat_field(uc.pid, 22),
                                 .conn = ++l->next_conn};
    return 0;
}

/* A connection turned away: counted, and said at most every 10 s. */
static void refuse(rpc_local *l, int fd, const char *why)
{
    if (fd >= 0)
        close(fd);
    atomic_fetch_add(&l->refused, 1);
    int64_t now = ps_now_ms();
    if (now - l->last_warn_ms >= 10000) {
        l->last_warn_ms = now;
        ps_log_warn("rpc: %s: a connection to %s refused (%llu so far)", why,
                    l->path, (unsigned long long)atomic_load(&l->refused));
    }
}

static void handoff(rpc_local *l, int fd)
{
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    grpc_server_add_channel_from_fd(l->server, fd, creds);
    grpc_server_credentials_release(creds);
}

/* Waits for fd's preface (or hands it over at once without a handshake
 * timeout). gRPC's own handshake timeout applies only to the connections
 * its listener accepts, not to one given by descriptor: without this, a
 * process that may connect could hold every slot of --max-connections
 * until the idle timeout by saying nothing. */
static void pend(rpc_local *l, int fd)
{
    if (l->handshake_ms == 0) {
        handoff(l, fd);
        return;
    }
    if (l->npend == l->cappend) {
        size_t n = l->cappend ? l->cappend * 2 : 64;
        struct pending *p = realloc(l->pend, n * sizeof *p);
        if (p == NULL) {
            refuse(l, fd, "out of memory");
            return;
        }
        l->pend = p;
        l->cappend = n;
    }
    l->pend[l->npend++] = (struct pending){fd, ps_now_ms() + l->handshake_ms, false};
}

/* Hands over the pending connections whose preface came, closes the ones
 * that closed or whose time is up. ready[i]: poll saw pend[i] readable. */
static void serve_pending(rpc_local *l, const bool *ready)
{
    int64_t now = ps_now_ms();
    size_t keep = 0;
    for (size_t i = 0; i < l->npend; i++) {
        struct pending p = l->pend[i];
        if (ready[i] || p.partial) {
            char buf[PREFACE_LEN];
            ssize_t n = recv(p.fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
            if (n == PREFACE_LEN) {
                handoff(l, p.fd);
                continue;
            }
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                close(p.fd);
                continue;
            }
            p.partial = n > 0;
        }
        if (now >= p.deadline_ms) {
            refuse(l, p.fd, "no HTTP/2 preface within --handshake-timeout");
            continue;
        }
        l->pend[keep++] = p;
    }
    l->npend = keep;
}

/* Accepts what is waiting. At EMFILE the spare descriptor is let go so
 * that the connection can be taken and closed (its client sees the close
 * at once instead of waiting in the backlog), and accepting goes on. */
static void accept_all(rpc_local *l)
{
    for (;;) {
        int fd = accept4(l->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE) && l->spare >= 0) {
            close(l->spare);
            fd = accept4(l->lfd, NULL, NULL, SOCK_CLOEXEC);
            refuse(l, fd, "out of file descriptors");
            l->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
            continue;
        }
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                refuse(l, -1, "out of file descriptors");
            return; /* EAGAIN, or an error of the one connection */
        }
        pthread_mutex_lock(&l->mu);
        int rc = count_open(l) >= l->max_conns ? -EDQUOT : record(l, fd);
        pthread_mutex_unlock(&l->mu);
        if (rc != 0) {
            refuse(l, fd, rc == -EDQUOT ? "at --max-connections" : "cannot read its "
                                                                   "credentials");
            continue;
        }
        pend(l, fd);
    }
}

static void *accept_main(void *arg)
{
    rpc_local *l = arg;
    struct pollfd *p = NULL;
    bool *ready = NULL;
    size_t cap = 0;
    for (;;) {
        if (cap < l->npend + 2) {
            size_t n = l->npend + 64;
            struct pollfd *np = realloc(p, n * sizeof *np);
            bool *nr = np != NULL ? realloc(ready, n * sizeof *nr) : NULL;
            if (np != NULL)
                p = np;
            if (nr != NULL)
                ready = nr;
            if (np == NULL || nr == NULL) {
                ps_log_warn("rpc: the unix socket's acceptor is out of memory");
                break;
            }
            cap = n;
        }
        /* At the descriptor limit with no spare: the listener is left
         * alone (its backlog waits) and looked at again shortly. */
        p[0] = (struct pollfd){l->spare < 0 ? -1 : l->lfd, POLLIN, 0};
        p[1] = (struct pollfd){l->wake, POLLIN, 0};
        int timeout = l->spare < 0 ? 100 : -1;
        int64_t now = ps_now_ms();
        for (size_t i = 0; i < l->npend; i++) {
            /* A partial preface is looked at again by the clock: poll
             * would answer at once for the bytes already there. */
            p[2 + i] = (struct pollfd){l->pend[i].partial ? -1 : l->pend[i].fd, POLLIN, 0};
            int64_t left = l->pend[i].deadline_ms - now;
            if (l->pend[i].partial && left > PARTIAL_RECHECK_MS)
                left = PARTIAL_RECHECK_MS;
            if (left < 0)
                left = 0;
            if (timeout < 0 || left < timeout)
                timeout = (int)left;
        }
        int n = poll(p, (nfds_t)(2 + l->npend), timeout);
        if (n < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (l->spare < 0)
            l->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
        size_t npend = l->npend;
        for (size_t i = 0; i < npend; i++)
            ready[i] = n > 0 && p[2 + i].revents != 0;
        serve_pending(l, ready);
        if (n > 0 && p[0].revents)
            accept_all(l);
    }
    for (size_t i = 0; i < l->npend; i++)
        close(l->pend[i].fd);
    l->npend = 0;
    free(p);
    free(ready);
    return NULL;
}

int rpc_local_start(rpc_local *l, grpc_server *server)
{
    l->server = server;
    int rc = pthread_create(&l->th, NULL, accept_main, l);
    if (rc != 0)
        return -rc;
    l->started = true;
    return 0;
}

void rpc_local_stop(rpc_local *l)
{
    if (l == NULL || l->lfd < 0)
        return;
    if (l->started) {
        uint64_t one = 1;
        if (write(l->wake, &one, sizeof one) < 0)
            ps_log_warn("rpc: cannot wake the unix socket's acceptor");
        pthread_join(l->th, NULL);
        l->started = false;
    }
    close(l->lfd);
    l->lfd = -1;
    unlink(l->path);
}

void rpc_local_free(rpc_local *l)
{
    if (l == NULL)
        return;
    rpc_local_stop(l);
    close(l->wake);
    if (l->spare >= 0)
        close(l->spare);
    pthread_mutex_destroy(&l->mu);
    free(l->pend);
    free(l->t);
    free(l);
}

int rpc_local_lookup(rpc_local *l, const char *peer, ps_rpc_peer_cred *out)
{
    if (l == NULL || peer == NULL || strncmp(peer, "fd:", 3) != 0)
        return -ENOENT;
    char *end;
    long fd = strtol(peer + 3, &end, 10);
    if (*end != '\0' || fd < 0)
        return -ENOENT;
    int rc = -ENOENT;
    pthread_mutex_lock(&l->mu);
    if ((size_t)fd < l->nt && conn_alive(l, (size_t)fd)) {
        *out = l->t[fd].cred;
        rc = 0;
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int rpc_local_open(rpc_local *l)
{
    pthread_mutex_lock(&l->mu);
    int n = count_open(l);
    pthread_mutex_unlock(&l->mu);
    return n;
}

uint64_t rpc_local_refused(const rpc_local *l)
{
    return atomic_load(&((rpc_local *)l)->refused);
}
