/*
 * shardcall.h - the coordinator's calls to ps shards, as a client: the RPC
 * edge on that side (schedule.c decides when to call; this file speaks
 * ps.v1.ParameterServer). Each call is one attempt on a client of its own,
 * made and destroyed inside the call.
 *
 * Every function returns 0 with the answer filled, or PS_ERPC (a call
 * that failed or did not parse) with st filled; a local failure (no client
 * could be made) is reported as UNAVAILABLE.
 *
 * Threads and lifetime: one piece of state, the token sent with every call
 * (set once at start, before any call); any thread may call, each call
 * blocks until its answer or deadline.
 */
#ifndef COORD_SHARDCALL_H
#define COORD_SHARDCALL_H

#include "common/rpc.h"

#include <stddef.h>
#include <stdint.h>

/* The token every later call sends (pscoord --token-file: an operator's,
 * since the coordinator checkpoints, restores and sets sync counts), copied;
 * NULL or "": none. Call before any thread calls. */
void coord_call_set_token(const char *token);

/* SetSyncWorkers(workers): *previous is the count the shard had. */
int coord_call_set_sync(const char *addr, uint32_t workers, int deadline_ms,
                        uint32_t *previous, ps_rpc_status *st);

/* What a shard answers to Checkpoint. */
struct coord_ckpt_answer {
    uint64_t step;      /* the step it checkpointed */
    uint64_t bytes;
    char path[1024];    /* its checkpoint directory */
};

/* Checkpoint(step, keep_at_least). */
int coord_call_checkpoint(const char *addr, uint64_t step,
                          uint32_t keep_at_least, int deadline_ms,
                          struct coord_ckpt_answer *out, ps_rpc_status *st);

/* What a shard answers to Stats, of what the coordinator asks. */
struct coord_stats_answer {
    uint64_t variables;    /* how many variables it holds */
    double uptime_seconds; /* how long its process has run */
};

/* Stats. */
int coord_call_stats(const char *addr, int deadline_ms,
                     struct coord_stats_answer *out, ps_rpc_status *st);

/* Restore(step): *restored is the step loaded, *variables how many. */
int coord_call_restore(const char *addr, uint64_t step, int deadline_ms,
                       uint64_t *restored, uint64_t *variables,
                       ps_rpc_status *st);

#endif
