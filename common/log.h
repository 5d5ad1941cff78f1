/*
 * log.h - leveled logging to stderr, one line per event, for journald.
 *
 * Two formats. Text, the default, reads
 *   2026-11-21T23:59:01.123Z psd[1234] ERROR message
 * and json (--log-format json) writes one object per line,
 *   {"time":"2026-11-21T23:59:01.123Z","level":"error","daemon":"psd",
 *    "pid":1234,"task":"ps0","event":"message","error":"not found"}
 * with "task" only once the process knows it (ps_log_set_task), "error"
 * only from ps_log_err, and the event's named fields (ps_log_event) as
 * further members. Text appends those fields as " key=value". Every string
 * is escaped by hand, and bytes that are not UTF-8 become U+FFFD, so a line
 * is valid JSON whatever a message holds (a client's variable name, say);
 * a line too long for its buffer is cut inside a string, never across
 * the syntax.
 *
 * The level is checked before anything is formatted, so a disabled debug
 * line costs one comparison. ps_log_err appends ": <ps_strerror(err)>"
 * (nginx's ngx_log_error).
 *
 * Threads and lifetime: safe from any thread; each line is written with one
 * write(2), so lines from different threads never interleave. The program
 * name passed to ps_log_init must outlive all logging (argv[0] does); the
 * format is set at start, before other threads log; the task may be set at
 * any time (it is copied).
 */
#ifndef PS_LOG_H
#define PS_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ps_log_level {
    PS_LOG_ERROR = 0,
    PS_LOG_WARN = 1,
    PS_LOG_INFO = 2,
    PS_LOG_DEBUG = 3,
};

/* In the order of proc.h's ps_proc_log_formats (the --log-format choices). */
enum ps_log_format {
    PS_LOG_TEXT = 0,
    PS_LOG_JSON = 1,
};

extern int ps_log_level_current;

/* Sets the program name shown on each line and the level. */
void ps_log_init(const char *progname, enum ps_log_level level);
/* Parses "error", "warn", "info", "debug". Returns 0, or PS_EINVAL_ARG. */
int ps_log_level_parse(const char *s, enum ps_log_level *out);
void ps_log_set_level(enum ps_log_level level);
/* Text (the default) or one JSON object per line. */
void ps_log_set_format(enum ps_log_format format);
/* The task of the job this process is, for JSON's "task": role and index
 * ("ps", 0 -> "ps0"), the role alone for index < 0 ("chief"), none for a
 * NULL role. Copied; cut at 31 bytes. */
void ps_log_set_task(const char *role, int index);

/* A named field of an event. Keys are JSON-plain names (letters, digits,
 * '_') other than the line's own: time, level, daemon, pid, task, event,
 * error. */
enum ps_log_field_type {
    PS_LOG_FSTR,
    PS_LOG_FINT,
    PS_LOG_FUINT,
    PS_LOG_FNUM,
    PS_LOG_FBOOL,
};
typedef struct ps_log_field {
    const char *key;
    enum ps_log_field_type type;
    union {
        const char *s; /* NULL: JSON null, text "(null)" */
        int64_t i;
        uint64_t u;
        double d;      /* NaN and infinities: JSON null */
        bool b;
    } v;
} ps_log_field;

#define PS_LOG_STR(k, x) \
    ((ps_log_field){.key = (k), .type = PS_LOG_FSTR, .v.s = (x)})
#define PS_LOG_INT(k, x) \
    ((ps_log_field){.key = (k), .type = PS_LOG_FINT, .v.i = (int64_t)(x)})
#define PS_LOG_UINT(k, x) \
    ((ps_log_field){.key = (k), .type = PS_LOG_FUINT, .v.u = (uint64_t)(x)})
#define PS_LOG_NUM(k, x) \
    ((ps_log_field){.key = (k), .type = PS_LOG_FNUM, .v.d = (double)(x)})
#define PS_LOG_BOOL(k, x) \
    ((ps_log_field){.key = (k), .type = PS_LOG_FBOOL, .v.b = (x)})
/* The fields argument pair of ps_log_event:
 * ps_log_event(PS_LOG_INFO, 0, PS_LOG_FIELDS(PS_LOG_INT("port", p)), "serving"). */
#define PS_LOG_FIELDS(...)                                                \
    (const ps_log_field[]){__VA_ARGS__},                                  \
        (sizeof((const ps_log_field[]){__VA_ARGS__}) / sizeof(ps_log_field))

void ps_log_write(enum ps_log_level level, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* One event with named fields; err as ps_log_err's (0: none). Checks the
 * level itself. */
void ps_log_event(enum ps_log_level level, int err, const ps_log_field *fields,
                  size_t nfields, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

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
