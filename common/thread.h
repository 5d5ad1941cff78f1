/*
 * thread.h - the start and stop of a helper thread that sleeps on a
 * condition variable until it has work or is told to quit; and a thread's
 * own buffers behind a pthread key.
 *
 * The idiom these functions write once: the thread waits on cv under mu
 * for its work or for a quit flag; to stop it, the owner sets the flag
 * under mu, wakes the thread and joins it. ps_thread_start and
 * ps_thread_stop are a pair: mu and cv live exactly as long as the thread.
 * ps_cond_raise is the same wake-up without the join, for flags that other
 * threads act on and for waking a thread to look again.
 *
 * Threads and lifetime: mu, cv and the flag belong to the caller (usually
 * embedded in the struct the thread works on); these functions keep no
 * state. ps_thread_stop must be called once, from a thread other than th.
 */
#ifndef PS_THREAD_H
#define PS_THREAD_H

#include <pthread.h>
#include <stdbool.h>

/* Initializes mu and cv (default attributes) and starts fn(arg) on *th.
 * Returns 0, or -EAGAIN when the thread cannot be created, with mu and cv
 * destroyed again (nothing for the caller to undo). */
int ps_thread_start(pthread_t *th, pthread_mutex_t *mu, pthread_cond_t *cv,
                    void *(*fn)(void *), void *arg);

/* Stops a thread ps_thread_start started: sets *quit under mu, wakes every
 * thread waiting on cv, joins th, then destroys cv and mu. */
void ps_thread_stop(pthread_t th, pthread_mutex_t *mu, pthread_cond_t *cv, bool *quit);

/* Sets *flag under mu (no flag when NULL) and wakes every thread waiting
 * on cv. */
void ps_cond_raise(pthread_mutex_t *mu, pthread_cond_t *cv, bool *flag);

/* The calling thread's value of key: on its first call, a zeroed block of
 * size bytes set as that value (the key's destructor frees it when the
 * thread exits). NULL when it cannot be allocated. */
void *ps_thread_specific(pthread_key_t key, size_t size);

#endif
