/*
 * assist.h - a helper thread that takes half of a big job when it is idle.
 *
 * Applying a 4 MiB gradient is a few passes over memory, and while psd does
 * it the client that pushed waits and its core idles: splitting the pass
 * over two cores cuts the push's latency. Under load every core is busy
 * anyway, so the helper is only borrowed when free: a caller that finds it
 * busy does the whole job itself.
 *
 * Threads and lifetime: any thread may psd_assist_try; the one that gets
 * true owns the helper until its psd_assist_join returns, and must call it
 * before touching what the job touches. psd_assist_stop joins the thread;
 * no try may run concurrently with it.
 */
#ifndef PSD_ASSIST_H
#define PSD_ASSIST_H

#include <stdbool.h>

typedef struct psd_assist psd_assist;

/* Starts the helper thread. Returns 0, -ENOMEM or -EAGAIN. */
int psd_assist_start(psd_assist **out);
/* Stops and frees it. NULL is a no-op. */
void psd_assist_stop(psd_assist *a);

/* Runs fn(arg) on the helper and returns true if it is idle (NULL: never);
 * false if it is busy, and then nothing runs. */
bool psd_assist_try(psd_assist *a, void (*fn)(void *arg), void *arg);
/* Waits until the job handed over by a successful try has run. */
void psd_assist_join(psd_assist *a);

#endif
