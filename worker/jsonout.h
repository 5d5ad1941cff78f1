/*
 * jsonout.h - numbers in workerd's --json lines: a value that was not
 * measured (no evaluation, a loss that is not finite) is written as null,
 * never as a sentinel a script could take for a figure.
 *
 * Threads and lifetime: the text lives in the caller's buffer.
 */
#ifndef PS_WORKER_JSONOUT_H
#define PS_WORKER_JSONOUT_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>

/* v with `decimals` decimals into buf, or "null" when !have or v is not
 * finite. Returns buf. */
static inline const char *wd_json_num(char buf[40], bool have, double v, int decimals)
{
    if (!have || !isfinite(v))
        snprintf(buf, 40, "null");
    else
        snprintf(buf, 40, "%.*f", decimals, v);
    return buf;
}

#endif
