/*
 * sparse_split - drives sparseclient.h's split path against real psd
 * processes for test_sparse_shard.py: creates table "t" (dim 4, SGD, a
 * uniform initializer) on a reference psd and on every shard, pushes the
 * same gradients (ids with repeats) through the split path (naming the
 * next push's ids, next_ids) and to the reference alone, then pulls a permutation with repeats both ways (the
 * split pull naming half of them as its next pull's ids, next_ids, which
 * changes no row), and compares the rows bit for bit. Writes the distinct ids, one a line, to
 * IDS_FILE (the test hashes them itself).
 *
 *   sparse_split IDS_FILE REF_ADDR SHARD_ADDR...
 *
 * Prints "same: N rows" and exits 0, or one line on stderr and exits 1.
 */
#include "common/errors.h"
#include "common/psclient.h"
#include "common/sparseclient.h"
#include "proto/ps.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM 4
#define NIDS 3000

static uint64_t rng = 12345;

static uint64_t next(void)
{
    rng += 0x9e3779b97f4a7c15ULL;
    return ps_sparse_mix64(rng);
}

static int die(const char *what, int rc, const ps_rpc_status *st)
{
    fprintf(stderr, "sparse_split: %s: %s: %s\n", what, ps_strerror(rc),
            st ? st->message : "");
    return 1;
}

static int create(ps_client *c)
{
    Ps__V1__VariableSpec spec = PS__V1__VARIABLE_SPEC__INIT;
    Ps__V1__Initializer init = PS__V1__INITIALIZER__INIT;
    Ps__V1__Optimizer opt = PS__V1__OPTIMIZER__INIT;
    int64_t shape[1] = {DIM};
    spec.name = "t";
    spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    spec.n_shape = 1;
    spec.shape = shape;
    spec.sparse = true;
    init.kind = PS__V1__INITIALIZER__KIND__UNIFORM;
    init.minval = -1;
    init.maxval = 1;
    init.seed = 7;
    opt.learning_rate = 0.5f;
    spec.initializer = &init;
    spec.optimizer = &opt;
    ps_rpc_status st = {0};
    int rc = ps_client_create_variable(c, &spec, NULL, NULL, 10000, &st);
    return rc ? die("CreateVariable", rc, &st) : 0;
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc - 3 > 64) {
        fprintf(stderr, "usage: sparse_split IDS_FILE REF_ADDR SHARD_ADDR...\n");
        return 2;
    }
    int ns = argc - 3;
    ps_client *ref, *sh[64];
    ps_rpc_client_opts co = {.deadline_ms = 10000};
    if (ps_client_create(argv[2], &co, &ref) != 0)
        return die("client", 1, NULL);
    for (int i = 0; i < ns; i++)
        if (ps_client_create(argv[3 + i], &co, &sh[i]) != 0)
            return die("client", 1, NULL);
    if (create(ref))
        return 1;
    for (int i = 0; i < ns; i++)
        if (create(sh[i]))
            return 1;
    /* Ids: random 64-bit ones, small sequential ones, and repeats. */
    static int64_t ids[NIDS], pull_ids[2 * NIDS];
    static float g[NIDS * DIM], a[NIDS * DIM], b[NIDS * DIM];
    static float pa[2 * NIDS * DIM], pb[2 * NIDS * DIM];
    for (int i = 0; i < NIDS; i++) {
        ids[i] = i % 3 == 0 ? (int64_t)(next() >> 1) : i % 3 == 1 ? i : ids[next() % (uint64_t)(i)];
        for (int d = 0; d < DIM; d++)
            g[i * DIM + d] = (float)(int64_t)(next() % 2001 - 1000) / 1000.0f;
    }
    ps_rpc_status st = {0};
    for (int step = 1; step <= 3; step++) {
        memcpy(a, g, sizeof g);
        memcpy(b, g, sizeof g);
        /* The split push names its next push's ids (the same ids: the
         * next step's), which changes nothing it applies or answers. */
        ps_sparse_item ia = {.name = "t", .ids = ids, .n = NIDS, .dim = DIM, .rows = a,
                             .next_ids = step < 3 ? ids : NULL, .next_n = NIDS};
        ps_sparse_item ib = {.name = "t", .ids = ids, .n = NIDS, .dim = DIM, .rows = b};
        int rc = ps_client_sparse_push(sh, ns, 0, (uint64_t)step, &ia, 1, true, 10000, &st);
        if (rc)
            return die("split SparsePush", rc, &st);
        if ((rc = ps_client_sparse_push(&ref, 1, 0, (uint64_t)step, &ib, 1, true, 10000, &st)))
            return die("reference SparsePush", rc, &st);
        if (memcmp(a, b, sizeof a) != 0) {
            fprintf(stderr, "sparse_split: step %d: the split push's returned rows "
                    "differ from the reference's\n", step);
            return 1;
        }
    }
    /* Pull: the ids backwards, then each again, plus never-pushed ids. */
    for (int i = 0; i < NIDS; i++) {
        pull_ids[i] = ids[NIDS - 1 - i];
        pull_ids[NIDS + i] = i % 2 ? ids[i] : (int64_t)(next() >> 1);
    }
    ps_sparse_item ia = {.name = "t", .ids = pull_ids, .n = 2 * NIDS, .dim = DIM, .rows = pa,
                         .next_ids = pull_ids + NIDS, .next_n = NIDS};
    ps_sparse_item ib = {.name = "t", .ids = pull_ids, .n = 2 * NIDS, .dim = DIM, .rows = pb};
    int rc = ps_client_sparse_pull(sh, ns, &ia, 1, 10000, &st);
    if (rc)
        return die("split SparsePull", rc, &st);
    if ((rc = ps_client_sparse_pull(&ref, 1, &ib, 1, 10000, &st)))
        return die("reference SparsePull", rc, &st);
    if (memcmp(pa, pb, sizeof pa) != 0) {
        fprintf(stderr, "sparse_split: the split pull differs from the reference's\n");
        return 1;
    }
    FILE *f = fopen(argv[1], "w");
    if (!f)
        return die("IDS_FILE", 1, NULL);
    for (int i = 0; i < NIDS; i++)
        fprintf(f, "%lld\n", (long long)ids[i]);
    fclose(f);
    printf("same: %d rows pulled, %d pushed\n", 2 * NIDS, NIDS);
    for (int i = 0; i < ns; i++)
        ps_client_destroy(sh[i]);
    ps_client_destroy(ref);
    return 0;
}
