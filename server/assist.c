#include "server/assist.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

enum state { IDLE, POSTED, DONE };

struct psd_assist {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    enum state state;
    bool quit;
    void (*fn)(void *);
    void *arg;
};

static void *assist_main(void *p)
{
    psd_assist *a = p;
    pthread_setname_np(pthread_self(), "psd-assist");
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->quit && a->state != POSTED)
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->quit)
            break;
        pthread_mutex_unlock(&a->mu);
        a->fn(a->arg);
        pthread_mutex_lock(&a->mu);
        a->state = DONE;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

int psd_assist_start(psd_assist **out)
{
    psd_assist *a = calloc(1, sizeof *a);
    if (a == NULL)
        return -ENOMEM;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->th, NULL, assist_main, a) != 0) {
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
        free(a);
        return -EAGAIN;
    }
    *out = a;
    return 0;
}

void psd_assist_stop(psd_assist *a)
{
    if (a == NULL)
        return;
    pthread_mutex_lock(&a->mu);
    a->quit = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->th, NULL);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

bool psd_assist_try(psd_assist *a, void (*fn)(void *), void *arg)
{
    if (a == NULL || pthread_mutex_trylock(&a->mu) != 0)
        return false;
    bool ok = a->state == IDLE && !a->quit;
    if (ok) {
        a->fn = fn;
        a->arg = arg;
        a->state = POSTED;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return ok;
}

void psd_assist_join(psd_assist *a)
{
    pthread_mutex_lock(&a->mu);
    while (a->state != DONE)
        pthread_cond_wait(&a->cv, &a->mu);
    a->state = IDLE;
    pthread_mutex_unlock(&a->mu);
}
