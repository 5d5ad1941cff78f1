#include "common/log.h"

#include "common/errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int ps_log_level_current = PS_LOG_INFO;
static const char *log_progname = "ps";

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

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

void ps_log_write(enum ps_log_level level, int err, const char *fmt, ...)
{
    char line[2048];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof line,
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s[%d] %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000),
                     log_progname, (int)getpid(),
                     level_names[level <= PS_LOG_DEBUG ? level : PS_LOG_DEBUG]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m > 0 ? (size_t)m : 0);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    if (err != 0) {
        int k = snprintf(line + len, sizeof line - len, ": %s",
                         ps_strerror(err));
        len += k > 0 ? (size_t)k : 0;
        if (len > sizeof line - 2)
            len = sizeof line - 2;
    }
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
