/*
 * clock.h - the process's time: milliseconds (or seconds) on CLOCK_MONOTONIC
 * for durations and deadlines, and absolute times for pthread_cond_timedwait.
 *
 * Threads and lifetime: the time functions are pure reads of the system
 * clock, safe from any thread; ps_cond_init_monotonic is pthread_cond_init.
 */
#ifndef PS_CLOCK_H
#define PS_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* Milliseconds on CLOCK_MONOTONIC. */
int64_t ps_now_ms(void);

/* Seconds on CLOCK_MONOTONIC at full resolution, for timing what may take
 * less than a millisecond (a step, a benchmark's call). */
double ps_now_s(void);

/* The time ms from now on `clock`, for pthread_cond_timedwait (whose
 * condition variables here use the default CLOCK_REALTIME, unless made
 * otherwise). */
struct timespec ps_time_after_ms(clockid_t clock, int64_t ms);

/* Initialises cond to time its waits on CLOCK_MONOTONIC, so deadlines from
 * ps_time_after_ms(CLOCK_MONOTONIC, ...) do not move with the wall clock. */
void ps_cond_init_monotonic(pthread_cond_t *cond);

#endif
