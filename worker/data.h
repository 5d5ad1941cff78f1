/*
 * data.h - training data for workerd: loaders, sharding, shuffling, batches.
 *
 * Two formats are read. IDX files (the MNIST family, e.g. Debian's
 * dataset-fashion-mnist under /usr/share/datasets/fashion-mnist) come in an
 * images/labels pair, gzip-compressed or plain (told apart by their first
 * bytes), and become a dense dataset: float32 pixels scaled to [0, 1] and
 * int32 labels. libsvm text files ("label idx:val idx:val ...", 1-based
 * ascending indices) become a sparse dataset in CSR arrays.
 *
 * A worker's share of the data is cut as tf.data's AutoShardPolicy.AUTO cuts
 * it: by file when there are at least as many files as workers, otherwise by
 * example (worker i of n takes examples i, i + n, i + 2n, ...). Unlike
 * TensorFlow, which fails when 1 < files < workers, this falls back to
 * sharding by example, so every worker always gets data. Either way every
 * example lands in exactly one shard.
 *
 * A ps_batcher walks one shard in batches, in an order that is a function of
 * (seed, epoch) only: the same seed and epoch give the same order on every
 * host and after a restart, and different epochs give different orders.
 *
 * Loaders that fail return a negative code (see each function) and, when err
 * is not NULL, write one line into err naming the file and the problem
 * ("train.svm:12: expected idx:val, got 'abc'"). They never abort.
 *
 * Threads and lifetime: nothing here keeps global state; distinct objects
 * may be used from distinct threads. A dataset owns its arrays until
 * ps_dataset_close / ps_sparse_dataset_close; a ps_batcher owns its index
 * array until ps_batcher_close. Pointers returned by ps_batcher_next stay
 * valid until the next call on the same batcher.
 */
#ifndef PS_WORKER_DATA_H
#define PS_WORKER_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A dense labelled dataset, examples stored row after row. */
struct ps_dataset {
    int64_t n;    /* examples */
    int h, w, c;  /* shape of one example; IDX images are (rows, cols, 1) */
    int64_t dim;  /* h * w * c floats per example */
    int nclasses; /* 1 + the largest label seen */
    float *x;     /* (n, h, w, c), values in [0, 1] */
    int32_t *y;   /* (n) */
};

/* A sparse labelled dataset in compressed sparse rows. */
struct ps_sparse_dataset {
    int64_t n;        /* examples (rows) */
    int64_t nnz;      /* stored features in all rows */
    int64_t dim;      /* 1 + the largest 0-based feature index seen */
    float *y;         /* (n) the labels as written (+1/-1, class ids, targets) */
    int64_t *indptr;  /* (n + 1) row r is entries [indptr[r], indptr[r + 1]) */
    int32_t *indices; /* (nnz) 0-based feature indices, ascending in a row */
    float *values;    /* (nnz) */
};

/*
 * Reads an IDX images file (magic 0x00000803: count, rows, cols of uint8) and
 * its IDX labels file (magic 0x00000801: count of uint8) into ds. Either file
 * may be gzip-compressed or plain. limit > 0 reads only the first `limit`
 * examples (the rest of each file is not read, so not checked); 0 reads all.
 * Returns 0; -errno when a file cannot be opened or read (-ENOENT when
 * missing); PS_EPARSE for a wrong magic number or dtype; PS_ECORRUPT when a
 * file is shorter than its header says or its gzip stream is damaged;
 * PS_ESHAPE when the two files hold different numbers of examples; -ENOMEM.
 * On failure ds is left zeroed and needs no close.
 */
int ps_dataset_load_idx(const char *images_path, const char *labels_path,
                        int64_t limit, struct ps_dataset *ds, char *err,
                        size_t errlen);

/* Frees the arrays of a dataset filled by a loader and zeroes it. NULL or a
 * zeroed dataset is fine. */
void ps_dataset_close(struct ps_dataset *ds);

/*
 * Copies examples idx[0..n) of ds into x (n, ds->dim) and y (n), in that
 * order, for one batch. Indices must be in [0, ds->n).
 */
void ps_dataset_gather(const struct ps_dataset *ds, const int64_t *idx, int n,
                       float *x, int32_t *y);

/*
 * Reads a libsvm text file, gzip-compressed or plain. Blank lines and lines
 * starting with '#' are skipped, a "qid:N" token is skipped, and anything
 * after a '#' inside a line is a comment. Returns 0; -errno when the file
 * cannot be opened or read; PS_EPARSE for a malformed line (the message
 * names the line number): a bad label, a token that is not idx:val, an index
 * below 1 or above 2^31 - 1, indices not strictly ascending; PS_ENONFINITE
 * for a NaN or infinite value or label; PS_ECORRUPT for a damaged gzip
 * stream; -ENOMEM. On failure ds is left zeroed and needs no close.
 */
int ps_sparse_load_libsvm(const char *path, struct ps_sparse_dataset *ds,
                          char *err, size_t errlen);

void ps_sparse_dataset_close(struct ps_sparse_dataset *ds);

/*
 * Densifies rows idx[0..n) of ds into x (n, dim), zero-filled, and their
 * labels into y (n). Returns 0, or PS_ESHAPE when a row has a feature index
 * >= dim (x is then only partly written).
 */
int ps_sparse_gather_dense(const struct ps_sparse_dataset *ds,
                           const int64_t *idx, int n, int64_t dim, float *x,
                           float *y);

enum ps_shard_policy {
    PS_SHARD_BY_FILE,    /* worker i reads files i, i + n, i + 2n, ... */
    PS_SHARD_BY_EXAMPLE, /* every worker reads all files, takes every n-th example */
};

/*
 * Picks the files worker `worker` of `nworkers` reads, out of nfiles files
 * listed in the same order on every worker. files_out (room for nfiles) gets
 * the chosen positions in the list, *nout their count and *policy how the
 * examples must then be cut: under PS_SHARD_BY_EXAMPLE all files are chosen
 * and the caller passes (worker, nworkers) on to ps_batcher_init; under
 * PS_SHARD_BY_FILE it passes (0, 1). Returns 0, or PS_EINVAL_ARG when
 * nfiles is 0 or worker is not in [0, nworkers).
 */
int ps_shard_files(size_t nfiles, int worker, int nworkers, size_t *files_out,
                   size_t *nout, enum ps_shard_policy *policy);

/* The number of examples worker `worker` of `nworkers` takes out of n when
 * sharding by example: those whose index is worker modulo nworkers. */
int64_t ps_shard_count(int64_t n, int worker, int nworkers);

/*
 * Global batch = per-replica batch x replicas (tf.distribute's convention).
 * Both return 0, or PS_EINVAL_ARG when an argument is < 1, the product
 * overflows an int, or global is not a multiple of replicas.
 */
int ps_batch_global(int per_replica, int replicas, int *global);
int ps_batch_per_replica(int global, int replicas, int *per_replica);

/*
 * Puts a permutation of idx[0..n) that depends only on (seed, epoch) and on
 * the incoming order (Fisher-Yates driven by a splitmix64 stream).
 */
void ps_shuffle(int64_t *idx, int64_t n, uint64_t seed, uint64_t epoch);

enum ps_batcher_flags {
    PS_BATCH_SHUFFLE = 1 << 0,        /* reshuffle the shard every epoch */
    PS_BATCH_DROP_REMAINDER = 1 << 1, /* skip a last batch smaller than batch */
};

/* Walks one worker's share of a dataset in batches. Caller-allocated. */
struct ps_batcher {
    int64_t *order;  /* (count) example indices of this shard, this epoch's order */
    int64_t count;   /* examples in this shard */
    int64_t pos;     /* next position in order */
    int batch;
    unsigned flags;
    uint64_t seed;
    uint64_t epoch;  /* the epoch being walked */
    int worker;      /* this shard: examples worker, worker + nworkers, ... */
    int nworkers;
};

/*
 * Prepares b to walk worker `worker`'s share (by example) of nexamples
 * examples in batches of `batch`, and starts epoch 0. Pass worker 0 of 1
 * when the data was already sharded by file. Returns 0; PS_EINVAL_ARG for
 * batch < 1, nexamples < 0 or a worker outside [0, nworkers); -ENOMEM.
 * A worker whose shard is empty gets no batches.
 */
int ps_batcher_init(struct ps_batcher *b, int64_t nexamples, int worker,
                    int nworkers, int batch, unsigned flags, uint64_t seed);

/* Rewinds to the start of `epoch`, reshuffling under PS_BATCH_SHUFFLE. The
 * order depends only on (seed, epoch), not on the epochs walked before. */
void ps_batcher_start_epoch(struct ps_batcher *b, uint64_t epoch);

/*
 * Points *idx at the example indices of the next batch of this epoch and
 * returns how many there are (at most b->batch); returns 0 at the end of the
 * epoch. *idx stays valid until the next call on b.
 */
int ps_batcher_next(struct ps_batcher *b, const int64_t **idx);

/* Batches per epoch, honouring PS_BATCH_DROP_REMAINDER. */
int64_t ps_batcher_steps(const struct ps_batcher *b);

void ps_batcher_close(struct ps_batcher *b);

#endif
