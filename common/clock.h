/*
 * clock.h - the process's time: milliseconds on CLOCK_MONOTONIC for
 * durations and deadlines, and absolute times for pthread_cond_timedwait.
 *
 * Threads and lifetime: both functions are pure reads of the system clock,
 * safe from any thread.
 */
#ifndef PS_CLOCK_H
#define PS_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Milliseconds on CLOCK_MONOTONIC. */
int64_t ps_now_ms(void);

/* The time ms from now on `clock`, for pthread_cond_timedwait (whose
 * condition variables here use the default CLOCK_REALTIME, unless made
 * otherwise). */
struct timespec ps_time_after_ms(clockid_t clock, int64_t ms);

#endif
