#include "common/errors.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

const char *ps_strerror(int err)
{
    if (err == 0)
        return "success";
    switch (err) {
#define PS_ERRNO_TEXT(name, value, text) case name: return text;
        PS_ERRNO_MAP(PS_ERRNO_TEXT)
#undef PS_ERRNO_TEXT
    default:
        break;
    }
    /* strerror's text for a known errno is static in glibc; the
     * "Unknown error N" text it builds for others is not, so refuse those. */
    if (err < 0 && err > -4096 && strerrorname_np(-err) != NULL)
        return strerror(-err);
    return "unknown error";
}

const char *ps_errname(int err)
{
    if (err == 0)
        return "OK";
    switch (err) {
#define PS_ERRNO_NAME(name, value, text) case name: return #name;
        PS_ERRNO_MAP(PS_ERRNO_NAME)
#undef PS_ERRNO_NAME
    default:
        break;
    }
    if (err < 0 && err > -4096) {
        const char *n = strerrorname_np(-err);
        if (n != NULL)
            return n;
    }
    return "UNKNOWN";
}

int ps_verrf(int rc, char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err != NULL && errlen > 0)
        vsnprintf(err, errlen, fmt, ap);
    return rc;
}

int ps_errf(int rc, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ps_verrf(rc, err, errlen, fmt, ap);
    va_end(ap);
    return rc;
}
