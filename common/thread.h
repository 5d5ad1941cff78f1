/*
 * thread.h - the start and stop of a helper thread that sleeps on a
 * condition variable until it has work or is told to quit; and a block of
 * memory per thread (ps_thread_slot).
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
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

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

/* A block of memory each thread has its own of: zeroed when the thread
 * first asks for it, given to `destroy` when the thread exits. For the
 * buffers a handler reuses from call to call on its thread; defined
 * statically with PS_THREAD_SLOT(type of the block, destroy). */
typedef struct ps_thread_slot {
    pthread_mutex_t mu;     /* held while the key is made */
    atomic_bool made;
    pthread_key_t key;
    void (*destroy)(void *);
    size_t size;
} ps_thread_slot;
#define PS_THREAD_SLOT(type, destroy)                                     \
    {PTHREAD_MUTEX_INITIALIZER, false, 0, (destroy), sizeof(type)}

/* The calling thread's block of s, made on its first call. NULL when the
 * key or the block cannot be made. */
void *ps_thread_slot_get(ps_thread_slot *s);

#endif
