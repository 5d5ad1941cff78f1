/*
 * log.c - the lines of log.h, in text or JSON.
 *
 * Why the JSON is written by hand, not with jansson (which the project
 * already links): jansson refuses a string that is not UTF-8 and allocates
 * for every object, and a log line must come out whatever it holds and
 * from any thread, even out of memory. The escaper below is the whole of
 * JSON a log line needs: strings, integers, numbers, booleans, null.
 */
#include "common/log.h"

#include "common/errors.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int ps_log_level_current = PS_LOG_INFO;
static const char *log_progname = "ps";
static enum ps_log_format log_format = PS_LOG_TEXT;
/* The task, copied in by ps_log_set_task at any time. */
static pthread_mutex_t task_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_task[32];

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
static const char *const level_json[] = {"error", "warn", "info", "debug"};

void ps_log_init(const char *progname, enum ps_log_level level)
{
    if (progname != NULL) {
        const char *slash = strrchr(progname, '/');
        log_progname = slash != NULL ? slash + 1 : progname;
    }
    ps_log_level_current = level;
}

void ps_log_set_level(enum ps_log_level level)
{
    ps_log_level_current = level;
}

void ps_log_set_format(enum ps_log_format format)
{
    log_format = format == PS_LOG_JSON ? PS_LOG_JSON : PS_LOG_TEXT;
}

void ps_log_set_task(const char *role, int index)
{
    pthread_mutex_lock(&task_mu);
    if (role == NULL)
        log_task[0] = '\0';
    else if (index < 0)
        snprintf(log_task, sizeof log_task, "%s", role);
    else
        snprintf(log_task, sizeof log_task, "%s%d", role, index);
    pthread_mutex_unlock(&task_mu);
}

int ps_log_level_parse(const char *s, enum ps_log_level *out)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, names[i]) == 0) {
            *out = (enum ps_log_level)i;
            return 0;
        }
    }
    return PS_EINVAL_ARG;
}

/* ---- a line being built ------------------------------------------------ */

/* cap leaves room for what closes the line ("}\n" or "\n"). */
struct line {
    char *p;
    size_t len, cap;
};

/* Appends n bytes if they all fit; returns whether they did. */
static bool put(struct line *l, const char *s, size_t n)
{
    if (l->len + n > l->cap)
        return false;
    memcpy(l->p + l->len, s, n);
    l->len += n;
    return true;
}

static bool puts_(struct line *l, const char *s)
{
    return put(l, s, strlen(s));
}

/* The length of the UTF-8 sequence at s (n bytes left), or 0 when it is not
 * one: a stray continuation byte, a cut or overlong sequence, a surrogate. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80)
        return 1;
    if ((c & 0xE0) == 0xC0) {
        len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4, cp = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* Appends s as a JSON string, quotes included. The caller made room for at
 * least the two quotes; when the rest does not fit the string is cut before
 * the first escape or character that does not, and still closed. */
static void json_string(struct line *l, const char *s)
{
    l->p[l->len++] = '"';
    size_t room = l->cap - 1; /* the closing quote */
    const unsigned char *u = (const unsigned char *)(s != NULL ? s : "");
    size_t n = strlen((const char *)u);
    for (size_t i = 0; i < n;) {
        char esc[8];
        const char *out = esc;
        size_t k = 1, w;
        unsigned c = u[i];
        if (c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t') {
            esc[0] = '\\';
            esc[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : (char)c;
            w = 2;
        } else if (c < 0x20) {
            w = (size_t)snprintf(esc, sizeof esc, "\\u%04x", c);
        } else if ((k = utf8_len(u + i, n - i)) != 0) {
            out = (const char *)u + i;
            w = k;
        } else {
            out = "\\ufffd"; /* not UTF-8: U+REPLACEMENT CHARACTER */
            w = 6;
            k = 1;
        }
        if (l->len + w > room)
            break;
        memcpy(l->p + l->len, out, w);
        l->len += w;
        i += k;
    }
    l->p[l->len++] = '"';
}

/* Starts the member `key` (a plain name) if the line has room for it and a
 * value of up to 32 bytes; returns whether it did. */
static bool json_key(struct line *l, const char *key)
{
    size_t k = strlen(key);
    if (l->len + k + 4 + 32 > l->cap)
        return false;
    l->p[l->len++] = ',';
    l->p[l->len++] = '"';
    memcpy(l->p + l->len, key, k);
    l->len += k;
    l->p[l->len++] = '"';
    l->p[l->len++] = ':';
    return true;
}

/* A field's value as JSON (strings quoted and escaped). */
static void json_value(struct line *l, const ps_log_field *f)
{
    char num[40];
    switch (f->type) {
    case PS_LOG_FSTR:
        if (f->v.s == NULL)
            puts_(l, "null");
        else
            json_string(l, f->v.s);
        return;
    case PS_LOG_FINT:
        snprintf(num, sizeof num, "%" PRId64, f->v.i);
        break;
    case PS_LOG_FUINT:
        snprintf(num, sizeof num, "%" PRIu64, f->v.u);
        break;
    case PS_LOG_FNUM:
        if (isfinite(f->v.d))
            snprintf(num, sizeof num, "%.15g", f->v.d);
        else
            snprintf(num, sizeof num, "null");
        break;
    case PS_LOG_FBOOL:
        snprintf(num, sizeof num, "%s", f->v.b ? "true" : "false");
        break;
    default:
        snprintf(num, sizeof num, "null");
        break;
    }
    puts_(l, num);
}

/* A field's value in a text line: strings bare unless they hold a space, a
 * quote, '=' or nothing, then in double quotes. */
static void text_value(struct line *l, const ps_log_field *f)
{
    if (f->type != PS_LOG_FSTR) {
        char tmp[64];
        struct line t = {tmp, 0, sizeof tmp - 1};
        json_value(&t, f);
        put(l, tmp, t.len);
        return;
    }
    const char *s = f->v.s != NULL ? f->v.s : "(null)";
    if (s[0] != '\0' && strpbrk(s, " \"=\t") == NULL) {
        size_t n = strlen(s);
        put(l, s, n <= l->cap - l->len ? n : l->cap - l->len);
        return;
    }
    if (l->len + 2 <= l->cap)
        json_string(l, s);
}

/* ---- the two formats ---------------------------------------------------- */

struct event {
    enum ps_log_level level;
    int err;
    const ps_log_field *fields;
    size_t nfields;
    const char *msg;
    char time[64]; /* RFC 3339, UTC, milliseconds */
};

static void text_line(struct line *l, const struct event *e)
{
    char head[128];
    snprintf(head, sizeof head, "%s %s[%d] %s ", e->time, log_progname,
             (int)getpid(), level_names[e->level]);
    puts_(l, head);
    size_t n = strlen(e->msg);
    put(l, e->msg, n <= l->cap - l->len ? n : l->cap - l->len);
    if (e->err != 0) {
        char tail[256];
        snprintf(tail, sizeof tail, ": %s", ps_strerror(e->err));
        put(l, tail, strlen(tail) <= l->cap - l->len ? strlen(tail)
                                                     : l->cap - l->len);
    }
    for (size_t i = 0; i < e->nfields; i++) {
        const ps_log_field *f = &e->fields[i];
        if (l->len + strlen(f->key) + 4 > l->cap)
            break;
        put(l, " ", 1);
        puts_(l, f->key);
        put(l, "=", 1);
        text_value(l, f);
    }
}

static void json_line(struct line *l, const struct event *e)
{
    char head[160], task[sizeof log_task];
    pthread_mutex_lock(&task_mu);
    memcpy(task, log_task, sizeof task);
    pthread_mutex_unlock(&task_mu);
    snprintf(head, sizeof head, "{\"time\":\"%s\",\"level\":\"%s\"", e->time,
             level_json[e->level]);
    puts_(l, head);
    /* Room for the daemon's name is kept by json_key. */
    if (json_key(l, "daemon"))
        json_string(l, log_progname);
    if (json_key(l, "pid")) {
        snprintf(head, sizeof head, "%d", (int)getpid());
        puts_(l, head);
    }
    if (task[0] != '\0' && json_key(l, "task"))
        json_string(l, task);
    /* The error before the fields, the event last of the fixed members:
     * a message too long for the line is cut, never what names it. */
    if (e->err != 0 && json_key(l, "error"))
        json_string(l, ps_strerror(e->err));
    if (json_key(l, "event"))
        json_string(l, e->msg);
    for (size_t i = 0; i < e->nfields; i++) {
        if (!json_key(l, e->fields[i].key))
            break;
        json_value(l, &e->fields[i]);
    }
}

static void log_vwrite(enum ps_log_level level, int err, const ps_log_field *fields,
                       size_t nfields, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));
static void log_vwrite(enum ps_log_level level, int err, const ps_log_field *fields,
                       size_t nfields, const char *fmt, va_list ap)
{
    struct event e = {.level = level <= PS_LOG_DEBUG ? level : PS_LOG_DEBUG,
                      .err = err, .fields = fields, .nfields = nfields};
    char msg[2048], buf[8192];
    vsnprintf(msg, sizeof msg, fmt, ap);
    e.msg = msg;
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    snprintf(e.time, sizeof e.time, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000));
    struct line l = {buf, 0, sizeof buf - 2};
    if (log_format == PS_LOG_JSON) {
        json_line(&l, &e);
        buf[l.len++] = '}';
    } else {
        text_line(&l, &e);
    }
    buf[l.len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, l.len);
    (void)w;
}

void ps_log_write(enum ps_log_level level, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, err, NULL, 0, fmt, ap);
    va_end(ap);
}

void ps_log_event(enum ps_log_level level, int err, const ps_log_field *fields,
                  size_t nfields, const char *fmt, ...)
{
    if (!ps_log_enabled(level))
        return;
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, err, fields, nfields, fmt, ap);
    va_end(ap);
}
