/* Host ids and the unix-socket check (common/hostid.c): the id's shape and
 * its parts against /proc, the PS_HOST_ID override, the absolute local
 * address, and each reason ps_host_use_local gives. */
#include "tests/unit/pscheck.h"
#include "common/hostid.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

START_TEST(test_host_id)
{
    unsetenv("PS_HOST_ID");
    char id[PS_HOST_ID_MAX], boot[64] = "";
    ck_assert_int_eq(ps_host_id(id, sizeof id), 0);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(boot, sizeof boot, f));
    fclose(f);
    boot[strcspn(boot, "\n")] = '\0';
    struct stat st;
    ck_assert_int_eq(stat("/proc/self/ns/pid", &st), 0);
    char want[PS_HOST_ID_MAX];
    snprintf(want, sizeof want, "%s:%llu", boot, (unsigned long long)st.st_ino);
    ck_assert_str_eq(id, want);
    setenv("PS_HOST_ID", "rack7-node3", 1);
    ck_assert_int_eq(ps_host_id(id, sizeof id), 0);
    ck_assert_str_eq(id, "rack7-node3");
    char big[300];
    memset(big, 'h', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    setenv("PS_HOST_ID", big, 1);
    ck_assert_int_eq(ps_host_id(id, sizeof id), -ENAMETOOLONG);
    unsetenv("PS_HOST_ID");
}
END_TEST

START_TEST(test_local_address)
{
    char out[300], cwd[256];
    ck_assert_int_eq(ps_host_local_address("/run/psd/0.sock", out, sizeof out), 0);
    ck_assert_str_eq(out, "unix:/run/psd/0.sock");
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_int_eq(ps_host_local_address("ps0.sock", out, sizeof out), 0);
    char want[300];
    snprintf(want, sizeof want, "unix:%s/ps0.sock", cwd);
    ck_assert_str_eq(out, want);
    ck_assert_int_eq(ps_host_local_address("/a/long/path", out, 10), -ENAMETOOLONG);
}
END_TEST

START_TEST(test_use_local)
{
    char dir[] = "/tmp/check-hostid-XXXXXX", path[64], addr[80], why[200];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ps.sock", dir);
    snprintf(addr, sizeof addr, "unix:%s", path);
    ck_assert(!ps_host_use_local("h1", "h2", addr, why, sizeof why));
    ck_assert_str_eq(why, "another host");
    ck_assert(!ps_host_use_local("h1", "", addr, why, sizeof why));
    ck_assert_str_eq(why, "its host is not known");
    ck_assert(!ps_host_use_local("", "", addr, why, sizeof why));
    ck_assert(!ps_host_use_local("h1", "h1", "", why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "no local socket"));
    ck_assert(!ps_host_use_local("h1", "h1", "unix:rel.sock", why, sizeof why));
    ck_assert(!ps_host_use_local("h1", "h1", addr, why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "No such file"));
    /* A regular file at the path is no socket. */
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert(!ps_host_use_local("h1", "h1", addr, why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "is not a socket"));
    unlink(path);
    /* A listening socket: yes. */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(fd, 1), 0);
    ck_assert_msg(ps_host_use_local("h1", "h1", addr, why, sizeof why), "%s", why);
    close(fd);
    unlink(path);
    rmdir(dir);
}
END_TEST

PSCHECK_MAIN("hostid",
    {"core", {test_host_id, test_local_address, test_use_local}})
