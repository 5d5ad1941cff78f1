/*
 * notify.c - the notify protocol through libsystemd (notify.h).
 *
 * Why libsystemd rather than a datagram written by hand: the protocol is
 * small, but sd_notify also handles the abstract-namespace and vsock
 * addresses, the credentials systemd checks with NotifyAccess=, and
 * sd_watchdog_enabled's WATCHDOG_PID rule; Debian ships it
 * (libsystemd-dev) on every host that runs these units.
 */
#include "common/notify.h"

#include "common/clock.h"
#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static bool enabled;
static int64_t keepalive_ms;

static pthread_mutex_t status_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_status[512];
static atomic_int_fast64_t last_alive_ms;
static atomic_bool warned;

static void read_env(void)
{
    const char *sock = getenv("NOTIFY_SOCKET");
    enabled = sock != NULL && sock[0] != '\0';
    uint64_t usec = 0;
    if (enabled && sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        keepalive_ms = (int64_t)(usec / 2000);
        if (keepalive_ms < 1)
            keepalive_ms = 1;
    }
}

bool ps_notify_enabled(void)
{
    pthread_once(&env_once, read_env);
    return enabled;
}

int64_t ps_notify_keepalive_ms(void)
{
    pthread_once(&env_once, read_env);
    return keepalive_ms;
}

/* Sends state; a failure is worth one warning per process, not one per
 * keep-alive. */
static void send_state(const char *state)
{
    int rc = sd_notify(0, state);
    if (rc < 0 && !atomic_exchange(&warned, true))
        ps_log_err(rc, "cannot notify the service manager at $NOTIFY_SOCKET "
                   "(further failures are not logged)");
}

/* fmt into out as one line: a newline would end the STATUS= assignment. */
static void format_line(char *out, size_t len, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
static void format_line(char *out, size_t len, const char *fmt, va_list ap)
{
    vsnprintf(out, len, fmt, ap);
    for (char *p = out; *p != '\0'; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

/* Sends head (a state line and its newline, or "") followed by
 * STATUS=<fmt...>, when notification is on. remember keeps the status as the last one sent; with
 * only_changed too, nothing is sent when it equals the last one. */
static void send_with_status(const char *head, bool remember, bool only_changed,
                             const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
static void send_with_status(const char *head, bool remember, bool only_changed,
                             const char *fmt, va_list ap)
{
    if (!ps_notify_enabled())
        return;
    char status[sizeof last_status], state[sizeof status + 32];
    format_line(status, sizeof status, fmt, ap);
    if (remember) {
        pthread_mutex_lock(&status_mu);
        bool same = strcmp(status, last_status) == 0;
        if (!same)
            memcpy(last_status, status, sizeof status);
        pthread_mutex_unlock(&status_mu);
        if (same && only_changed)
            return;
    }
    snprintf(state, sizeof state, "%sSTATUS=%s", head, status);
    send_state(state);
}

void ps_notify_ready(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    send_with_status("READY=1\n", true, false, fmt, ap);
    va_end(ap);
}

void ps_notify_status(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    send_with_status("", true, true, fmt, ap);
    va_end(ap);
}

void ps_notify_watchdog(void)
{
    if (ps_notify_keepalive_ms() == 0)
        return;
    atomic_store(&last_alive_ms, ps_now_ms());
    send_state("WATCHDOG=1");
}

void ps_notify_alive(void)
{
    int64_t period = ps_notify_keepalive_ms();
    if (period == 0)
        return;
    int64_t now = ps_now_ms();
    if (now - atomic_load(&last_alive_ms) < period / 2)
        return;
    ps_notify_watchdog();
}

void ps_notify_stopping(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    send_with_status("STOPPING=1\n", false, false, fmt, ap);
    va_end(ap);
}
