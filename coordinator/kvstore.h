/*
 * kvstore.h - pscoord's key/value store with wait, the rendezvous of
 * multi_worker_mirrored jobs (as PyTorch's TCPStore serves Gloo).
 *
 * Workers keep there what their all-reduce group needs to form: each rank's
 * address (Gloo's connectFullMesh writes and reads them through
 * worker/collective_gloo.cc's Store), NCCL's unique id, each worker's model
 * description. KvGet waits, up to its timeout, until every key it names is
 * set; a waiting call holds no server thread (it is answered later from
 * this module's thread or from the KvSet that completes it).
 *
 * Generations. Once any worker has used the store, this module watches the
 * set of live workers (coord_snapshot) every KV_TICK_MS. Whenever that set
 * changes, or a member sets "gen/<G>/failed" for the current generation G,
 * the generation rises to G+1 and the store gets "gen/<G+1>/members" (the
 * worker indices, comma-separated, ascending) and "generation" ("<G+1>").
 * Keys under "gen/<g>/" of generations two or more behind are dropped.
 * The store lives in memory only: the first generation is numbered from
 * the clock (milliseconds since 1970), so that after a pscoord restart the
 * numbers still rise past those the workers have seen, and the workers
 * write their keys again when they next form a group.
 * GetCluster reports the generation and its members (ClusterState fields
 * 16 and 17).
 *
 * Who may write what. Every call names a registered worker and carries
 * its task secret (coord_check_worker; an operator token stands in on
 * KvGet). Each key has one writer (ps.proto lists them above the Kv
 * calls): "generation" and "gen/<G>/members" are this module's alone,
 * "model/<i>" worker i's, a generation's rank keys (Gloo's "<r>" and
 * "rank_<r>", also under "sync/", and NCCL's id as rank 0's) the worker at
 * that rank of gen/<G>/members, for one of the last three generations; a
 * generation's rank keys are read only by its members. So a worker token
 * holder cannot put its own address in another rank's place, nor learn the
 * addresses of a group it is not in. One pscoord serves one job, so the
 * keys are the job's.
 *
 * Caps: keys of 1..256 bytes (INVALID_ARGUMENT), values of at most 1 MiB,
 * 4096 keys, 32 MiB of keys and values, 1024 waiting calls; past them
 * RESOURCE_EXHAUSTED naming the cap.
 *
 * Threads and lifetime: every function may be called from any thread (one
 * mutex). coord_kv_create starts the module's thread; coord_kv_stop fails
 * the calls still waiting (UNAVAILABLE); coord_kv_destroy joins and frees. The
 * coordinator passed in must outlive the store.
 */
#ifndef COORD_KVSTORE_H
#define COORD_KVSTORE_H

#include "common/rpc.h"
#include "coordinator/coord.h"

#include <stddef.h>
#include <stdint.h>

typedef struct coord_kv coord_kv;

int coord_kv_create(coord *c, coord_kv **out);
/* Fails the calls still waiting (UNAVAILABLE) and refuses new waits; the
 * edge calls it before the server shuts down. Idempotent. */
void coord_kv_stop(coord_kv *kv);
void coord_kv_destroy(coord_kv *kv);

/* The handlers of KvSet and KvGet: req is the parsed Ps__V1__KvSetRequest
 * or Ps__V1__KvGetRequest (borrowed for the call only). */
void coord_kv_on_set(coord_kv *kv, ps_rpc_call *call, const void *req);
void coord_kv_on_get(coord_kv *kv, ps_rpc_call *call, const void *req);

/* The current generation (0: none yet) and, when members is not NULL, a
 * malloc'd copy of its members' worker indices (*n of them). */
uint64_t coord_kv_generation(coord_kv *kv, uint32_t **members, size_t *n);

#endif
