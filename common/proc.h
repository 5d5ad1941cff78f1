/*
 * proc.h - what each daemon's main does around its real work: the
 * command-line prologue that psd, workerd and pscoord share, the "PORT <n>"
 * line and the epilogue of the daemons that serve, and the control loop
 * that psd and pscoord run on the main thread while their other threads
 * serve.
 *
 * The prologue loads the options (ps_conf_load), answers --help and
 * --version, refuses a bad option or an extra argument with one line
 * "NAME: ..." on stderr and exit status 2, and starts logging.
 *
 * The control loop is a libuv loop (the only user of libuv: nothing else
 * includes uv.h). It owns SIGINT, SIGTERM and SIGHUP: they are blocked in
 * every thread and taken only while ps_proc_loop_run runs, by uv_signal
 * handlers: SIGINT and SIGTERM stop the loop, SIGHUP has the TLS
 * certificates read again (ps_tls_reload, tls.h), runs the reload set with
 * ps_proc_loop_on_hup, and the loop goes on. Periodic work that belongs to the process
 * rather than to a module (keep-alives, metrics) hangs on it as timers:
 * ps_proc_loop_keepalive sends systemd's watchdog keep-alives from it, so
 * that a loop that stops turning is restarted (common/notify.h), and when a
 * signal stops the loop it tells systemd that the daemon is stopping.
 *
 * Threads and lifetime: the prologue runs first in main. The loop is
 * created in main before any other thread starts (so that they inherit the
 * blocked signals), and run, given timers and destroyed only on that
 * thread; its libuv handles live inside it and are freed in their close
 * callbacks by ps_proc_loop_destroy.
 */
#ifndef PS_PROC_H
#define PS_PROC_H

#include "common/conf.h"

#include <stdint.h>

/* A daemon's command line: what the prologue needs to know about it. */
typedef struct ps_proc_cmd {
    const char *name;     /* "psd": prefix of error lines, --version */
    const char *usage;    /* after the name in --help: "--data-dir DIR [options]" */
    const ps_opt *opts;   /* the options table ... */
    void *conf;           /* ... and the zeroed struct it fills */
    const int *log_level; /* in conf: logging starts at this level once the
                             options are loaded; NULL: the caller starts it */
    const int *log_format; /* in conf: a --log-format option (choices
                              ps_proc_log_formats); NULL: text */
    const char *env_prefix; /* "PSD": options also from PSD_<NAME> in the
                               environment (ps_conf_load_env); NULL: none */
} ps_proc_cmd;

/* The choices of a --log-level option (PS_OPT_ENUM) in the order of enum
 * ps_log_level, so that the int it fills can be cmd->log_level: "error",
 * "warn", "info", "debug". */
extern const char *const ps_proc_log_levels[];
/* Every binary's --log-level default: warn, so that a run that goes well
 * is quiet and a refusal is the one line on stderr; info adds the events
 * (registrations, reloads, restores). */
#define PS_PROC_LOG_DEFAULT "warn"

/* The choices of a --log-format option (PS_OPT_ENUM) in the order of enum
 * ps_log_format, for cmd->log_format: "text" (the default lines), "json"
 * (one object per line). */
extern const char *const ps_proc_log_formats[];
#define PS_PROC_LOG_FORMAT_HELP \
    "text (one line per event) or json (one object per line: time, level, " \
    "daemon, task, event and its fields)"

typedef struct ps_proc_loop ps_proc_loop; /* the control loop, below */

/* ps_proc_prologue's result when main should go on. */
#define PS_PROC_RUN (-1)

/* Loads argv (and the config file it names) into cmd->conf. Returns
 * PS_PROC_RUN when the process goes on (logging started, with argv[0] as
 * its name, if cmd->log_level is set); otherwise the exit status main
 * returns, with the configuration already freed: 0 after printing --help or
 * --version on stdout, 2 after one line "NAME: what was wrong" on stderr
 * (a bad option or value, or an argument that is not an option). */
int ps_proc_prologue(const ps_proc_cmd *cmd, int argc, char **argv);

/* For a later refusal: prints one line "NAME: <fmt...>" on stderr, frees
 * the configuration and returns status, so that main can
 * `return ps_proc_quit(&cmd, 2, "--data-dir is required");`. */
int ps_proc_quit(const ps_proc_cmd *cmd, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Takes the daemon's exclusive lock on its directory (ps_dir_lock: the file
 * LOCK in dir, made with the directory if missing), so that a second daemon
 * given the same directory stops before it touches anything there. Returns
 * PS_PROC_RUN with the lock held until the process ends; otherwise 1 after
 * one line naming the directory, the flag that gave it and the pid of the
 * holder (exit status 1, configuration freed). */
int ps_proc_lock_dir(const ps_proc_cmd *cmd, const char *flag, const char *dir);

/* Tells whoever started the daemon that it serves: one line "PORT <n>" on
 * stdout, flushed (scripts and tests start daemons on port 0 and read it). */
void ps_proc_announce(int port);

/* The end of main, after the prologue went on: destroys the loop (NULL:
 * none), frees the configuration and returns status, so that main can
 * `return ps_proc_epilogue(&cmd, loop, status);`. */
int ps_proc_epilogue(const ps_proc_cmd *cmd, ps_proc_loop *loop, int status);

/* ---- The control loop ------------------------------------------------- */

/* Creates the loop and its handlers for SIGINT, SIGTERM and SIGHUP, blocks
 * those in the calling thread (and so in every thread started afterwards:
 * a signal that comes early waits for ps_proc_loop_run) and ignores
 * SIGPIPE. Returns 0, -ENOMEM, or a negated errno from libuv. */
int ps_proc_loop_create(ps_proc_loop **out);

/* Runs fn(ctx) on the loop's thread every period_ms (the first time
 * period_ms after ps_proc_loop_run starts) while the loop runs. Returns 0,
 * PS_EINVAL_ARG for a period below 1 ms, -ENOMEM. */
int ps_proc_loop_every(ps_proc_loop *l, int64_t period_ms,
                       void (*fn)(void *ctx), void *ctx);

/* Sends WATCHDOG=1 from the loop every half of the watchdog interval
 * systemd asked for (WATCHDOG_USEC), when it asked for one: a keep-alive
 * then says that the loop comes round, and a loop that is stuck (or a
 * process that is stopped) lets the watchdog fire. Returns 0 (also without
 * a watchdog, adding nothing), or as ps_proc_loop_every. */
int ps_proc_loop_keepalive(ps_proc_loop *l);

/* A daemon's supervision under systemd, once it serves: READY=1 with a
 * first STATUS= line that describe(ctx) writes, then from the loop a new
 * STATUS= line every period_ms and the watchdog's keep-alives
 * (common/notify.h). Nothing without systemd; a timer that cannot be added
 * (out of memory) is logged and the daemon serves on. */
void ps_proc_loop_supervise(ps_proc_loop *l, int64_t period_ms,
                            void (*describe)(void *ctx, char *line, size_t len), void *ctx);

/* Makes SIGHUP run fn(ctx) on the loop's thread (a reload: of the token
 * file, say) instead of stopping the loop. */
void ps_proc_loop_on_hup(ps_proc_loop *l, void (*fn)(void *ctx), void *ctx);

/* Runs the loop (its timers) until SIGINT or SIGTERM arrives, tells
 * systemd the daemon is stopping (STOPPING=1; nothing outside systemd) and
 * returns the signal's number; the signals are blocked again when it
 * returns, so a second one during the shutdown that follows is not taken. */
int ps_proc_loop_run(ps_proc_loop *l);

/* Stops the timers, closes every handle and frees the loop. NULL: no-op. */
void ps_proc_loop_destroy(ps_proc_loop *l);

#endif
