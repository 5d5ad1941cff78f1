/*
 * retention.h - the one checkpoint-retention rule, for psd and pscoord.
 *
 * ps.proto states it beside CheckpointRequest.keep_at_least: a store keeps
 * its newest N complete checkpoints, N the larger of its own
 * --checkpoint-keep and what its caller asks to be kept (0 for its own
 * keeps them all), and deletes the older ones once a new checkpoint is
 * complete. psd applies it to checkpoints/<step>/ with the caller's
 * keep_at_least; pscoord applies it to its job manifests with nothing
 * asked, and asks every psd to keep as many, so that no manifest it still
 * lists loses a shard. "Newest" is by creation for psd (the step is its
 * caller's word: checkpoint.h), by step for pscoord's manifests (the step
 * is pscoord's own global step).
 *
 * Threads and lifetime: pure functions.
 */
#ifndef PS_RETENTION_H
#define PS_RETENTION_H

#include <stddef.h>

/* The most checkpoints a caller may ask a store to keep
 * (CheckpointRequest.keep_at_least, pscoord's --checkpoint-keep): a
 * caller asking for 10^6 would switch retention off for good. */
#define PS_RETENTION_MAX_KEEP 1000

/* How many checkpoints a store keeps: 0 (all) when own is 0, else the
 * larger of own and asked. */
static inline size_t ps_retention_keep(size_t own, size_t asked)
{
    if (own == 0)
        return 0;
    return own > asked ? own : asked;
}

/* How many of have checkpoints, the oldest first, a store deletes when it
 * keeps keep (from ps_retention_keep). */
static inline size_t ps_retention_drop(size_t have, size_t keep)
{
    return keep == 0 || have <= keep ? 0 : have - keep;
}

#endif
