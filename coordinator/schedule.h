/*
 * schedule.h - the coordinator's own threads, which make the calls to ps
 * shards that coord.c decides on:
 *
 *   liveness   every tick: coord_tick (silent tasks die, warnings);
 *   sync       tells live ps shards the sync worker count
 *              (ParameterServer/SetSyncWorkers) when it changes;
 *   checkpoint runs the job checkpoint schedule: Checkpoint(step = G) on
 *              every shard in parallel, then coord_checkpoint_done;
 *   restores   one thread per ps that registered empty: Restore(step),
 *              retried with backoff while it does not answer.
 *
 * Threads and lifetime: coord_sched_start starts them; coord_sched_stop
 * (after which no restore starts) wakes and joins them all, waiting for
 * calls in flight to end (their deadlines bound the wait: 60 s for a
 * checkpoint or restore, 2 s for a sync count). The coord must outlive the
 * scheduler.
 */
#ifndef COORD_SCHEDULE_H
#define COORD_SCHEDULE_H

#include "coordinator/coord.h"

typedef struct coord_sched coord_sched;

struct coord_sched_opts {
    int tick_ms;             /* liveness period; 0 = 100 */
    int checkpoint_deadline_ms; /* per shard; 0 = 60000 */
    int restore_deadline_ms; /* per attempt; 0 = 60000 */
    int sync_deadline_ms;    /* 0 = 2000 */
    int checkpoint_keep;     /* job checkpoints kept: each shard is asked to
                                keep at least as many of its own */
};

/* Returns 0, or -errno when a thread cannot be started (none is left
 * running then). */
int coord_sched_start(coord *c, const struct coord_sched_opts *o,
                      coord_sched **out);

/* Starts the restore of one empty ps. Returns 0; PS_ESHUTDOWN once
 * stopping; -errno when no thread can be started (the restore is then
 * recorded as failed). */
int coord_sched_restore(coord_sched *s, const struct coord_ps_call *call);

/* Stops and joins every thread. Idempotent. */
void coord_sched_stop(coord_sched *s);
void coord_sched_destroy(coord_sched *s);

#endif
