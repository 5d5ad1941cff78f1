/*
 * log.h - leveled logging to stderr, one line per event, for journald.
 *
 * Each line reads "2026-11-21T23:59:01.123Z psd[1234] ERROR message". The
 * level is checked before anything is formatted, so a disabled debug line
 * costs one comparison. ps_log_err appends ": <ps_strerror(err)>" (nginx's
 * ngx_log_error).
 *
 * Threads and lifetime: safe from any thread; each line is written with one
 * write(2), so lines from different threads never interleave. The program
 * name passed to ps_log_init must outlive all logging (argv[0] does).
 */
#ifndef PS_LOG_H
#define PS_LOG_H

#include <stdbool.h>

enum ps_log_level {
    PS_LOG_ERROR = 0,
    PS_LOG_WARN = 1,
    PS_LOG_INFO = 2,
    PS_LOG_DEBUG = 3,
};

extern int ps_log_level_current;

/* Sets the program name shown on each line and the level. */
void ps_log_init(const char *progname, enum ps_log_level level);
/* Parses "error", "warn", "info", "debug". Returns 0, or PS_EINVAL_ARG. */
int ps_log_level_parse(const char *s, enum ps_log_level *out);
void ps_log_set_level(enum ps_log_level level);

void ps_log_write(enum ps_log_level level, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ps_log_enabled(lvl) ((int)(lvl) <= ps_log_level_current)
#define PS_LOG(lvl, ...)                                                  \
    do {                                                                  \
        if (ps_log_enabled(lvl))                                          \
            ps_log_write((lvl), 0, __VA_ARGS__);                          \
    } while (0)
#define ps_log_error(...) PS_LOG(PS_LOG_ERROR, __VA_ARGS__)
#define ps_log_warn(...) PS_LOG(PS_LOG_WARN, __VA_ARGS__)
#define ps_log_info(...) PS_LOG(PS_LOG_INFO, __VA_ARGS__)
#define ps_log_debug(...) PS_LOG(PS_LOG_DEBUG, __VA_ARGS__)
/* Error line with the text of `err` (a project code or -errno) appended. */
#define ps_log_err(err, ...)                                              \
    do {                                                                  \
        if (ps_log_enabled(PS_LOG_ERROR))                                 \
            ps_log_write(PS_LOG_ERROR, (err), __VA_ARGS__);               \
    } while (0)

#endif
