/* The listener probe (common/probe.c) against real sockets on 127.0.0.1:
 * a listener that answers, one that accepts and stays silent (a busy
 * server: -EAGAIN), one that never accepts (its connections wait in the
 * accept queue: -ETIMEDOUT, what gRPC 1.51's listener does after an
 * EMFILE), no listener at all, and a host that is no address literal. */
#include "tests/unit/pscheck.h"
#include "common/probe.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A listening socket on 127.0.0.1 port 0; its port in *port. */
static int listener(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, 8), 0);
    socklen_t len = sizeof a;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

struct acceptor {
    int lfd, cfd;
    bool answer;
};

/* Accepts one connection; writes one byte on it when answer. */
static void *accept_one(void *arg)
{
    struct acceptor *a = arg;
    a->cfd = accept(a->lfd, NULL, NULL);
    if (a->cfd >= 0 && a->answer)
        (void)!write(a->cfd, "x", 1);
    return NULL;
}

static int probe_with(bool answer, char *err, size_t errlen)
{
    int port;
    struct acceptor a = {listener(&port), -1, answer};
    pthread_t th;
    pthread_create(&th, NULL, accept_one, &a);
    int rc = ps_probe_listener("127.0.0.1", port, 400, err, errlen);
    pthread_join(th, NULL);
    close(a.cfd);
    close(a.lfd);
    return rc;
}

START_TEST(test_answered)
{
    char err[256] = "";
    ck_assert_int_eq(probe_with(true, err, sizeof err), 0);
}
END_TEST

START_TEST(test_accepted_silent)
{
    char err[256] = "";
    int rc = probe_with(false, err, sizeof err);
    ck_assert_msg(rc == -EAGAIN, "rc %d: %s", rc, err);
    ck_assert_ptr_nonnull(strstr(err, "accepted but not answered in 400 ms"));
}
END_TEST

START_TEST(test_never_accepted)
{
    char err[256] = "";
    int port, lfd = listener(&port);
    int rc = ps_probe_listener("127.0.0.1", port, 400, err, sizeof err);
    ck_assert_msg(rc == -ETIMEDOUT, "rc %d: %s", rc, err);
    ck_assert_ptr_nonnull(strstr(err, "the listener is not accepting"));
    close(lfd);
}
END_TEST

START_TEST(test_no_listener)
{
    char err[256] = "";
    int port, lfd = listener(&port);
    close(lfd);
    ck_assert_int_eq(ps_probe_listener("127.0.0.1", port, 400, err, sizeof err),
                     -ECONNREFUSED);
    ck_assert_int_eq(ps_probe_listener("psd.example", port, 400, err, sizeof err),
                     -EINVAL);
}
END_TEST

PSCHECK_MAIN("probe",
    {"listener", {test_answered, test_accepted_silent, test_never_accepted,
                  test_no_listener}})
