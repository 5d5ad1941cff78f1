/*
 * clock.c - see clock.h.
 */
#include "common/clock.h"

int64_t ps_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double ps_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct timespec ps_time_after_ms(clockid_t clock, int64_t ms)
{
    struct timespec t;
    clock_gettime(clock, &t);
    int64_t ns = t.tv_nsec + (ms % 1000) * 1000000L;
    t.tv_sec += (time_t)(ms / 1000 + ns / 1000000000L);
    t.tv_nsec = (long)(ns % 1000000000L);
    return t;
}

void ps_cond_init_monotonic(pthread_cond_t *cond)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cond, &ca);
    pthread_condattr_destroy(&ca);
}
