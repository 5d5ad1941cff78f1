#include "server/assist.h"

#include "common/thread.h"

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
    int rc = ps_thread_start(&a->th, &a->mu, &a->cv, assist_main, a);
    if (rc == 0)
        *out = a;
    else
        free(a);
    return rc;
}

void psd_assist_stop(psd_assist *a)
{
    if (a == NULL)
        return;
    ps_thread_stop(a->th, &a->mu, &a->cv, &a->quit);
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
