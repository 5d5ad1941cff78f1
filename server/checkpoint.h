/*
 * checkpoint.h - checkpoints of psd's store under <data_dir>/checkpoints/.
 *
 * A checkpoint is a directory <data_dir>/checkpoints/<step>/ holding
 * data.mdb, a compacted copy of the store taken from one read transaction
 * (so pushes and commits go on while it is written), and MANIFEST.json:
 *
 *   {"format": 2, "step": 1200, "sequence": 7, "variables": 3, "bytes": 81920,
 *    "created_unix": 1767225600, "data_file": "data.mdb", "crc32": 305419896}
 *
 * where bytes and crc32 (zlib's) describe data.mdb, and sequence is one
 * more than that of every checkpoint present when it was written (format 1
 * manifests have none and count as 0). Retention and "latest" follow the
 * sequence, the order of creation, not the step: the step is the caller's
 * word, and ordered by it a few checkpoints at forged steps far ahead would
 * outrank every honest one to come (ps.proto's CheckpointRequest). It is built in
 * checkpoints/<step>.tmp-<pid>/, fsync'ed file by file, with the manifest
 * written last and renamed into place, and only then renamed to
 * checkpoints/<step>/. So a directory named by a bare step number either
 * holds a whole checkpoint or is not taken for one: a crash at any point
 * leaves at worst a *.tmp-* directory, which every reader ignores and
 * psd_ckpt_prune removes once its writer is dead.
 *
 * "Complete" below means: the manifest parses, names this step, and
 * data.mdb has the size it records. "Valid" adds that the crc32 matches,
 * which costs a read of the whole data file.
 *
 * Threads and lifetime: the functions keep no state. psd_ckpt_write may run
 * in its own thread beside the thread that commits to the store; two writes
 * for the same step must not run at once. Nothing returned points into the
 * library.
 */
#ifndef PSD_CHECKPOINT_H
#define PSD_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

/* store.h; declared here so that the shard reaches the store only through
 * persist.c. */
typedef struct psd_store psd_store;

/* Writes the checkpoint for step, replacing an existing one for the same
 * step only once the new one is whole (with renameat2 RENAME_EXCHANGE where
 * the file system has it; otherwise the old one is renamed aside first).
 * nvars is recorded in the manifest. On success the checkpoint's directory
 * is written to path_out (when not NULL) and data.mdb's size to bytes_out
 * (when not NULL). Returns 0, PS_EINVAL_ARG (step or nvars above INT64_MAX,
 * path_out too short), PS_EFULL (no space, quota, or file size limit),
 * -errno, or a psd_store_copy error. On failure the temporary directory is
 * removed and every earlier checkpoint is left as it was. */
int psd_ckpt_write(psd_store *s, const char *data_dir, uint64_t step, uint64_t nvars,
                   char *path_out, size_t pathlen, uint64_t *bytes_out);
/* The same, calling complete(ctx, dir) on the copy (a store directory not
 * yet checksummed nor in place) before it is sealed: psd adds the row
 * log's batches of the copied moment. Its failure is the write's. */
int psd_ckpt_write_with(psd_store *s, const char *data_dir, uint64_t step, uint64_t nvars,
                        int (*complete)(void *ctx, const char *dir), void *ctx,
                        char *path_out, size_t pathlen, uint64_t *bytes_out);

/* The step of the newest created checkpoint that is valid; newer ones that
 * are not are skipped with a warning. Returns 0, PS_ENOTFOUND if there is none, or
 * -errno if the checkpoints directory cannot be read. */
int psd_ckpt_latest(const char *data_dir, uint64_t *step_out);

/* Writes the directory of step's checkpoint to out after checking it is
 * valid. Returns 0, PS_ENOTFOUND (no such directory or no manifest),
 * PS_ECORRUPT (a manifest that does not parse or does not match, a data
 * file of the wrong size, a crc32 mismatch: logged), PS_EINVAL_ARG (out too
 * short) or -errno. */
int psd_ckpt_path(const char *data_dir, uint64_t step, char *out, size_t len);

/* The steps of all complete checkpoints, ascending: the first min(cap,
 * count) are written to steps, and *count is set to how many there are.
 * Returns 0 (count 0 without a checkpoints directory) or -errno. */
int psd_ckpt_list(const char *data_dir, uint64_t *steps, size_t cap, size_t *count);

/* Removes complete checkpoints created before the newest keep_last, never
 * the one psd_ckpt_latest picks, and *.tmp-* directories whose writer process is
 * gone. Directories that are not complete checkpoints are left alone.
 * Returns 0 or the first error; it goes on past errors. */
int psd_ckpt_prune(const char *data_dir, size_t keep_last);
/* psd_ckpt_prune that never removes the checkpoint of step spare either
 * (the one just written: a checkpoint is not deleted by its own call). */
int psd_ckpt_prune_sparing(const char *data_dir, size_t keep_last, uint64_t spare);

#endif
