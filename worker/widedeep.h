/*
 * widedeep.h - the wide-and-deep model (Cheng et al. 2016) on images, and
 * its training loop against psd's sparse tables (doc/sparse.md, "Wide
 * and deep").
 *
 * Spec "widedeep" or "widedeep:E-H" (embedding dim E, default 16; hidden
 * width H, default 64). Each pixel is quantized to 4 levels (v * 4, 0..3).
 *   wide: hashed crossed features, each the splitmix64 mix of (kind,
 *         position, code) cut to a 2^40 id space: every 2x2 patch (stride 1,
 *         its four 4-level buckets) and every 3x3 patch at stride 3 (its
 *         nine 3-level buckets), all-zero patches left out; logits_wide =
 *         the sum of the ids' rows of table "wide/cross" (dim = classes,
 *         FTRL, zeros);
 *   deep: the ids (pixel * 4 + level) of the non-zero pixels; their rows of
 *         "deep/embed" (dim E, Adagrad, uniform +-0.05) averaged (an
 *         embedding bag, mean), then dense E->H, ReLU, dense H->classes;
 *   logits = wide + deep, softmax cross-entropy.
 * Each step pulls the batch's distinct ids of both tables (SparsePull, split
 * over every shard by sparseclient.h's hash) and the four dense variables
 * (Pull), and pushes the tables' gradients by distinct id (SparsePush) and
 * the dense ones (Push). Everything is asynchronous (ASYNC variables).
 *
 * Threads and lifetime: wd_train_widedeep and wd_evaluate_widedeep run on
 * the caller's thread and own everything they make.
 */
#ifndef PS_WORKER_WIDEDEEP_H
#define PS_WORKER_WIDEDEEP_H

#include "worker/train.h"

#include <stdbool.h>

/* Whether spec names the wide-and-deep model. */
bool wd_is_widedeep(const char *spec);

/* Checks the spec and that the data are images of at least 3x3 with
 * nclasses classes. Returns 0 or PS_EINVAL_ARG with one line in err. */
int wd_widedeep_check(const char *spec, int h, int w, int c, int nclasses,
                      char *err, size_t errlen);

/* The variables to propose to the coordinator: dense ones with their
 * shape; the two tables with shape [dim] and *sparse set. Fills up to cap
 * entries and returns how many there are. */
struct wd_widedeep_var {
    char name[64];
    int64_t shape[2];
    int ndim;
    bool sparse;
};
int wd_widedeep_vars(const char *spec, int nclasses, struct wd_widedeep_var *out,
                     int cap);

/* As wd_train and wd_evaluate for this model. */
int wd_train_widedeep(const struct wd_train_opts *o, const struct ps_dataset *train,
                      struct wd_train_result *res, char *err, size_t errlen);
int wd_evaluate_widedeep(const struct wd_train_opts *o, const struct ps_dataset *test,
                         float *loss, float *accuracy, uint64_t *version, char *err,
                         size_t errlen);

#endif
