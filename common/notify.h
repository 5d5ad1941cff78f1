/*
 * notify.h - telling the service manager how the daemon is doing, through
 * systemd's notify protocol (sd_notify(3), libsystemd): READY=1 once it
 * serves, STATUS= lines that say where it is, WATCHDOG=1 keep-alives and
 * STOPPING=1 at shutdown. The units (deploy/systemd) are Type=notify with
 * WatchdogSec=, so systemd starts what depends on a daemon only once it
 * serves, and restarts one whose keep-alives stop.
 *
 * Without NOTIFY_SOCKET in the environment (a daemon not started by
 * systemd, or by a unit of another type) every call does nothing, at the
 * cost of one load. A send that fails is logged once, as a warning, and
 * the daemon goes on: its work matters more than its supervision.
 *
 * This is the only file that includes <systemd/sd-daemon.h>
 * (common/confine.h).
 *
 * Threads and lifetime: every function may be called from any thread; the
 * environment is read once, at the first call.
 */
#ifndef PS_NOTIFY_H
#define PS_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

/* Whether a service manager listens (NOTIFY_SOCKET is set). */
bool ps_notify_enabled(void);

/* The period at which keep-alives must be sent: half the watchdog interval
 * systemd asked for (WATCHDOG_USEC, for this process when WATCHDOG_PID
 * names one), in ms, at least 1; 0 when there is no watchdog. */
int64_t ps_notify_keepalive_ms(void);

/* READY=1, with a first STATUS= line from fmt: the daemon serves and its
 * state is loaded. */
void ps_notify_ready(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* STATUS=<fmt...>, one line (newlines become spaces), sent only when it
 * differs from the last one sent. */
void ps_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* WATCHDOG=1: the daemon's loop is alive. */
void ps_notify_watchdog(void);

/* WATCHDOG=1 unless one went out less than a quarter of the watchdog
 * interval ago: for a loop that comes round more often than it needs to
 * send (workerd's training steps). Nothing without a watchdog. */
void ps_notify_alive(void);

/* STOPPING=1 with a STATUS= line from fmt: the daemon is shutting down. */
void ps_notify_stopping(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
