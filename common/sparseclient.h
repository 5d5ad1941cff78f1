/*
 * sparseclient.h - SparsePull and SparsePush over a sparse table whose rows
 * are spread over several psd shards by a hash of the id (doc/sparse.md,
 * "Sharding").
 *
 * The shard of an id: h = splitmix64's finalizer of the id (a fixed 64-bit
 * bijective mix, so ids that are sequential or share low bits still spread),
 * then Lamping and Veach's jump consistent hash of h over the shard count.
 * Jump hash is why the rule leaves room for re-sharding: going from n to
 * n + 1 shards moves only about 1/(n + 1) of the ids, all of them onto the
 * new shard, and none between the old ones, so a later re-shard can stream
 * just those rows; the rule needs no table and is the same in every client.
 *
 * A call takes one or more tables (each with its ids in any order, repeats
 * allowed), splits each table's ids per shard, sends one request to each
 * shard that has ids (all tables of that shard together), and merges the
 * answers back into the caller's rows in request order. Shards are called
 * one after the other from the caller's thread.
 *
 * Threads and lifetime: stateless; the ps_client handles follow psclient.h
 * (one thread at a time each). Every call returns 0, PS_ERPC with *st
 * filled (st may be NULL; its message names the shard), PS_EPARSE,
 * PS_ESHAPE (a shard answered rows of another size), PS_EINVAL_ARG (no
 * shard, no table or more than PS_SPARSE_MAX_TABLES) or
 * -ENOMEM.
 */
#ifndef PS_SPARSECLIENT_H
#define PS_SPARSECLIENT_H

#include "common/psclient.h"

#include <stddef.h>
#include <stdint.h>

/* The shard of id among nshards >= 1 (0 when nshards <= 1). */
uint32_t ps_sparse_shard_of(int64_t id, uint32_t nshards);

/* splitmix64's finalizer: the 64-bit mix the shard rule starts from. */
uint64_t ps_sparse_mix64(uint64_t x);

/* The most tables one call takes. */
#define PS_SPARSE_MAX_TABLES 16

/* One table of a call: n ids and n * dim floats (pull: written, the rows in
 * the order of ids, widened from float16 or bfloat16 when that is the
 * table's row dtype, which is what travels; push: read, row i the gradient
 * of ids[i], sent as float32). A call may say the ids of its next call of
 * the same kind on the table, next_ids[0..next_n) (NULL, 0: none): each
 * shard gets those it holds (SparsePullItem.next_ids,
 * SparseGradient.next_ids) and starts reading them from disk ahead, so
 * that the next call finds them in memory; a hint, which changes no answer
 * and nothing a push applies. A pull sends a shard its share of the hint
 * even when none of the table's ids of this pull are its; a push sends it
 * with the shard's gradient of the table only (a shard with none of this
 * push's ids of the table does not hear of them). */
typedef struct ps_sparse_item {
    const char *name;
    const int64_t *ids;
    size_t n;
    int dim;
    float *rows;
    uint64_t version;     /* out: the highest version a shard answered */
    const int64_t *next_ids;
    size_t next_n;
} ps_sparse_item;

/* SparsePull of items[0..n) from the table shards shards[0..nshards). */
int ps_client_sparse_pull(ps_client *const *shards, int nshards,
                          ps_sparse_item *items, size_t n, int deadline_ms,
                          ps_rpc_status *st);

/* SparsePush of the gradients items[0..n) (worker and step as
 * SparsePushRequest); with return_values, each item's rows are then
 * overwritten by the updated rows (in the order of its ids). */
int ps_client_sparse_push(ps_client *const *shards, int nshards, uint32_t worker,
                          uint64_t step, ps_sparse_item *items, size_t n,
                          bool return_values, int deadline_ms, ps_rpc_status *st);

#endif
