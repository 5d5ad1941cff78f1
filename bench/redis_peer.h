/*
 * redis_peer.h - bench/sparse's peer: Debian's redis-server holding a
 * sparse table the way TensorFlow Recommenders-Addons' Redis backend does:
 * one key per row ("v" + the id's 8 bytes, the row's dim float32 as the
 * value) and one per row of each optimizer slot ("a" + id: Adagrad's
 * accumulator), pulls as pipelined MGETs, and an update as GET then SET
 * with the optimizer applied by the client, since Redis has none.
 *
 * The only file that includes hiredis is redis_peer.c (-DPS_OWNS_HIREDIS).
 *
 * Threads and lifetime: one rpeer is used by one thread. rpeer_start forks
 * redis-server on a free 127.0.0.1 port; rpeer_stop kills it (SIGTERM,
 * then waits) and frees everything, its directory included.
 */
#ifndef BENCH_REDIS_PEER_H
#define BENCH_REDIS_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct rpeer rpeer;

/* Starts redis-server (the binary server; NULL: "redis-server" on PATH),
 * with no persistence, or with aof its append-only file fsynced every
 * second (appendfsync everysec: a kill -9 of redis loses nothing it
 * acknowledged, a power cut about the last second) in a temporary
 * directory. Returns 0, or -1 after a line on stderr. */
int rpeer_start(const char *server, long dim, bool aof, rpeer **out);
void rpeer_stop(rpeer *r);
/* redis-server's pid, and its directory ("" without aof): what a signal
 * handler thread kills and removes when the bench is stopped. */
pid_t rpeer_pid(const rpeer *r);
const char *rpeer_dir(const rpeer *r);
/* Writes n rows: values (n * dim) and accumulators all init_acc. */
int rpeer_fill(rpeer *r, const int64_t *ids, size_t n, const float *values, float init_acc);
/* Reads the rows of ids into out (n * dim), in order; a missing row is 0. */
int rpeer_pull(rpeer *r, const int64_t *ids, size_t n, float *out);
/* Adagrad (lr, the accumulator summing squared gradients): the gradients
 * of repeated ids summed first, then each distinct row read (GET), updated
 * and written (SET). out (n * dim, may be NULL) gets the updated rows. */
int rpeer_push(rpeer *r, const int64_t *ids, size_t n, const float *g, float lr, float *out);
/* Bytes of memory redis uses (INFO memory's used_memory). */
uint64_t rpeer_used_memory(rpeer *r);

#endif
