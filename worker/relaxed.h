/*
 * relaxed.h - workerd's relaxed consistency modes beside async and sync:
 *
 *   bounded staleness (--consistency bounded --staleness S): variables are
 *   BOUNDED_STALENESS; each step pushes, then pulls with this worker's
 *   clock (steps pushed), which psd holds until the slowest live worker is
 *   within S steps (PullRequest.step); the next step waits for that pull.
 *
 *   local SGD (--local-steps K, PaddlePaddle's GEO mode): the worker applies
 *   SGD to its own copy for K steps, then pushes the change of its
 *   parameters since the last exchange as a delta (PushRequest.delta,
 *   psd adds it), and takes psd's values back in the same round trip.
 *
 * --step-delay slows a worker on purpose (the staleness tests).
 *
 * Threads and lifetime: called from the training loop's thread only, while
 * no comm job runs (wd_local_step posts its exchange and waits for it). A
 * wd_local is the loop's; wd_local_close frees it.
 */
#ifndef PS_WORKER_RELAXED_H
#define PS_WORKER_RELAXED_H

#include "worker/train_internal.h"

#include <stdbool.h>
#include <stdint.h>

/* workerd's consistency codes in wd_train_opts.consistency. */
enum { WD_ASYNC = 1, WD_SYNC = 2, WD_BOUNDED = 3 };

/* Sleeps o->step_delay_ms (0: returns at once). */
void wd_step_delay(const struct wd_train_opts *o);

/* Local SGD's state: the parameters as of the last exchange. */
struct wd_local {
    float *anchor;  /* (nparams); NULL: local SGD is off */
    int since;      /* local steps since that exchange */
    int64_t exchanges;
};

/* Starts local SGD on an open session whose values were just pulled:
 * remembers them and makes every client's pushes deltas. Needs one replica
 * that computes on the host block (PS_EINVAL_ARG with err otherwise), or
 * -ENOMEM. */
int wd_local_open(struct session *s, struct wd_local *l, char *err, size_t errlen);

/* One local step after compute_step: w -= lr * g on the replica's own
 * values; every K-th step (or with force, if any step is unexchanged) the
 * exchange: push w - anchor, take psd's values, anchor them. Returns 0 or
 * the comm error (its text in s->fail_msg). */
int wd_local_step(struct session *s, struct wd_local *l, uint64_t step, bool force);

/* The last exchange at the end of training, if any step is unexchanged. */
int wd_local_finish(struct session *s, struct wd_local *l, uint64_t step);

void wd_local_close(struct wd_local *l);

#endif
