#include "common/probe.h"

#include "common/clock.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* The address to reach host:port at; false for a host that is not a
 * literal. */
static bool probe_addr(const char *host, int port, struct sockaddr_storage *ss,
                       socklen_t *len)
{
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    memset(ss, 0, sizeof *ss);
    if (host[0] == '\0' || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "localhost") == 0)
        host = "127.0.0.1";
    else if (strcmp(host, "::") == 0)
        host = "::1";
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        *len = sizeof *v4;
        return true;
    }
    if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        *len = sizeof *v6;
        return true;
    }
    return false;
}

/* Connections waiting in the accept queues of this network namespace's
 * TCP listeners on port (their rx_queue in /proc/net/tcp and tcp6, state
 * 0A: LISTEN), summed; -1 when neither file can be read or no listener on
 * port is there. */
static long accept_queue(int port)
{
    static const char *const files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    long queued = -1;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        FILE *f = fopen(files[i], "re");
        if (f == NULL)
            continue;
        char line[512];
        while (fgets(line, sizeof line, f) != NULL) {
            char local[64];
            unsigned st, lport;
            unsigned long txq, rxq;
            if (sscanf(line, " %*u: %63s %*s %x %lx:%lx", local, &st, &txq, &rxq) != 4 ||
                st != 0x0A)
                continue;
            const char *colon = strrchr(local, ':');
            if (colon == NULL || sscanf(colon + 1, "%x", &lport) != 1 ||
                lport != (unsigned)port)
                continue;
            queued = (queued < 0 ? 0 : queued) + (long)rxq;
        }
        fclose(f);
    }
    return queued;
}

/* Waits until fd is ready for events or the deadline; 1, 0 at the
 * deadline, or -errno. */
static int wait_for(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - ps_now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, (int)left);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -errno;
    }
}

int ps_probe_listener(const char *host, int port, int timeout_ms, char *err,
                      size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (!probe_addr(host, port, &ss, &len)) {
        snprintf(err, errlen, "'%s' is not an IP address to probe", host);
        return -EINVAL;
    }
    int64_t deadline = ps_now_ms() + timeout_ms;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot open a socket to probe it: %s", strerror(e));
        return -e;
    }
    int rc = 0;
    if (connect(fd, (struct sockaddr *)&ss, len) != 0 && errno != EINPROGRESS) {
        rc = -errno;
    } else {
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        int w = wait_for(fd, POLLOUT, deadline);
        if (w <= 0)
            rc = w == 0 ? -ETIMEDOUT : w;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0)
            rc = soerr != 0 ? -soerr : -errno;
    }
    if (rc != 0) {
        snprintf(err, errlen, "a connection to port %d failed: %s", port,
                 strerror(-rc));
    } else {
        /* Connected; accepted only if the server answers. The HTTP/2
         * preface prompts one from any server: a plaintext one sends its
         * SETTINGS anyway, a TLS one answers the bytes that are no
         * ClientHello with an alert or a close. A close (EOF, or a reset)
         * is an answer too: only an accepted connection is closed by the
         * server; one waiting in the backlog hears nothing. */
        static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        char b;
        if (send(fd, preface, sizeof preface - 1, MSG_NOSIGNAL) < 0 && errno != EAGAIN)
            rc = errno == EPIPE || errno == ECONNRESET ? 0 : -errno;
        int w = rc != 0 ? -1 : wait_for(fd, POLLIN, deadline);
        if (w == 0 && accept_queue(port) == 0) {
            /* Ours is not waiting to be accepted: it was, and the answer is
             * late. */
            rc = -EAGAIN;
            snprintf(err, errlen, "a connection to port %d was accepted but not "
                     "answered in %d ms: the server is busy", port, timeout_ms);
        } else if (w == 0) {
            rc = -ETIMEDOUT;
            snprintf(err, errlen, "a connection to port %d was not answered in "
                     "%d ms: the listener is not accepting", port, timeout_ms);
        } else if (w < 0 && rc == 0) {
            rc = w;
        } else if (w > 0 && recv(fd, &b, 1, MSG_DONTWAIT) < 0 && errno != ECONNRESET &&
                   errno != EAGAIN) {
            rc = -errno;
        }
        if (rc != 0 && rc != -ETIMEDOUT && rc != -EAGAIN)
            snprintf(err, errlen, "a connection to port %d failed: %s", port,
                     strerror(-rc));
    }
    close(fd);
    return rc;
}

int ps_probe_open_files(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

long ps_probe_max_files(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return -1;
    return (long)rl.rlim_cur;
}

long ps_probe_raise_files(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    return ps_probe_max_files();
}
