#include "common/thread.h"

#include <errno.h>
#include <stdlib.h>

int ps_thread_start(pthread_t *th, pthread_mutex_t *mu, pthread_cond_t *cv,
                    void *(*fn)(void *), void *arg)
{
    pthread_mutex_init(mu, NULL);
    pthread_cond_init(cv, NULL);
    if (pthread_create(th, NULL, fn, arg) != 0) {
        pthread_cond_destroy(cv);
        pthread_mutex_destroy(mu);
        return -EAGAIN;
    }
    return 0;
}

void ps_thread_stop(pthread_t th, pthread_mutex_t *mu, pthread_cond_t *cv, bool *quit)
{
    ps_cond_raise(mu, cv, quit);
    pthread_join(th, NULL);
    pthread_cond_destroy(cv);
    pthread_mutex_destroy(mu);
}

void *ps_thread_slot_get(ps_thread_slot *s)
{
    if (!atomic_load_explicit(&s->made, memory_order_acquire)) {
        pthread_mutex_lock(&s->mu);
        bool ok = atomic_load_explicit(&s->made, memory_order_relaxed) ||
                  pthread_key_create(&s->key, s->destroy) == 0;
        if (ok)
            atomic_store_explicit(&s->made, true, memory_order_release);
        pthread_mutex_unlock(&s->mu);
        if (!ok)
            return NULL;
    }
    void *b = pthread_getspecific(s->key);
    if (b == NULL) {
        b = calloc(1, s->size);
        if (b != NULL && pthread_setspecific(s->key, b) != 0) {
            free(b);
            b = NULL;
        }
    }
    return b;
}

void ps_cond_raise(pthread_mutex_t *mu, pthread_cond_t *cv, bool *flag)
{
    pthread_mutex_lock(mu);
    if (flag != NULL)
        *flag = true;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
}
