/*
 * place.h - where a model's variables live: the placement of float32
 * variables over a job's ps shards. pscoord applies it once per job; a
 * workerd given --ps and no coordinator applies the same rule itself, so a
 * model's variables are the same with or without one.
 *
 * The rule, applied once per job (the coordinator keeps the result):
 *   - variables are taken largest first (ties by name, so the proposal's
 *     order does not matter), each onto the shard holding the fewest bytes so
 *     far (ties by the lower shard index);
 *   - a variable of more than `split_threshold` bytes with more than one row
 *     is split over ALL shards by rows of its first dimension, as evenly as
 *     possible (the first rows % n parts get one row more): part k is named
 *     "<name>/part<k>", lives on shard k and holds rows [row_begin, row_end).
 *     With fewer rows than shards, there is one part per row. A job with one
 *     shard never splits.
 *   - a hash-partitioned variable (a sparse table, shape [dim]) has one part
 *     per shard, each named as the table, rows [0, 0): an id's row lives on
 *     the shard sparseclient.h's hash gives it. It counts for no shard's load
 *     (its size is not known when placed).
 *
 * Threads and lifetime: pure functions over caller-owned data. A
 * ps_placement owns all its strings and arrays; ps_placement_free
 * releases them and leaves it empty.
 */
#ifndef PS_PLACE_H
#define PS_PLACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PS_PLACE_MAX_DIMS 8
/* pscoord's --split-threshold default, and what a worker without one uses. */
#define PS_PLACE_SPLIT_DEFAULT ((uint64_t)512 << 10)

struct ps_place_part {
    char *name;        /* the name on its shard */
    uint32_t shard;
    int64_t row_begin; /* rows [row_begin, row_end) of dimension 0 */
    int64_t row_end;
};

struct ps_place_var {
    char *name;
    int64_t shape[PS_PLACE_MAX_DIMS];
    int ndims;                /* 0 = scalar */
    struct ps_place_part *parts; /* empty in a proposal */
    int nparts;
    bool hash_partitioned;    /* a sparse table: rows over all shards by a
                                 hash of the id (common/sparseclient.h) */
};

struct ps_placement {
    struct ps_place_var *vars; /* in the order the first proposal gave them */
    int nvars;
    uint32_t num_ps;        /* the shard count it was made for */
};

/* Bytes of a float32 variable of that shape (a scalar is 4). */
uint64_t ps_place_var_bytes(const struct ps_place_var *v);

/* Checks a proposal: at least one variable; names of 1 to 255 bytes, no
 * NUL, each once; at most PS_PLACE_MAX_DIMS dimensions, each >= 1; at most
 * 2^40 elements per variable. Returns 0, or PS_EINVAL_ARG with one line in
 * why naming the variable and the problem. */
int ps_place_check(const struct ps_place_var *vars, int n, char *why,
                   size_t whylen);

/* Places a checked proposal over num_ps >= 1 shards into *out (which the
 * caller frees with ps_placement_free). Returns 0, PS_EINVAL_ARG when
 * num_ps is 0, -ENOMEM. */
int ps_place_compute(const struct ps_place_var *vars, int n, uint32_t num_ps,
                     uint64_t split_threshold, struct ps_placement *out);

/* Compares a proposal with a kept placement, by names and shapes (in any
 * order). Returns 0 when they are the same model, else PS_ECONFLICT with the
 * first difference in why, e.g. "variable 'w1' has shape [784, 64], the
 * placed model's has [784, 128]". */
int ps_place_same(const struct ps_placement *p,
                  const struct ps_place_var *vars, int n, char *why,
                  size_t whylen);

/* Copies src into *dst (deep). Returns 0 or -ENOMEM (dst then empty). */
int ps_placement_copy(const struct ps_placement *src,
                      struct ps_placement *dst);

void ps_placement_free(struct ps_placement *p);

/* "[784, 128]", "[]" for a scalar. */
const char *ps_place_shape_str(const int64_t *shape, int ndims, char *buf,
                               size_t len);

#endif
