/*
 * fuzz_seeds - writes the starting corpus of a fuzz target into a
 * directory: one well-formed request of each kind, built with protobuf-c
 * from proto/ps.proto so that the seeds never drift from the schema (and
 * no binary file is kept in the repository).
 *
 *   fuzz_seeds decode DIR     bare request messages (fuzz_decode)
 *   fuzz_seeds handlers DIR   the same, each after its method byte
 *                             (fuzz_handlers; see fuzz_common.h)
 *
 * The pushes and pulls name the variables fuzz_handlers creates at
 * start-up, with the right sizes, so that the fuzzer starts from requests
 * that reach the optimizer and the sync and wait paths.
 */
#include "tests/fuzz/fuzz_common.h"
#include "proto/health.pb-c.h"
#include "proto/ps.pb-c.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dir;
static bool with_method;
static int nseeds;

static void write_seed(int method, const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(n + 1);
    if (buf == NULL) {
        fprintf(stderr, "fuzz_seeds: out of memory\n");
        exit(1);
    }
    size_t off = 0;
    if (with_method)
        buf[off++] = (uint8_t)method;
    protobuf_c_message_pack(msg, buf + off);
    char path[4096];
    snprintf(path, sizeof path, "%s/seed-%02d", dir, nseeds++);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(buf, 1, n + off, f) != n + off || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    free(buf);
}

static void seed_creates(void)
{
    for (size_t i = 0; i < FUZZ_NVARS; i++) {
        struct fuzz_create c;
        fuzz_create_request(i, &c);
        /* The identical spec (created: false), then a new name. */
        write_seed(FUZZ_CREATE_VARIABLE, &c.req.base);
        c.spec.name = i % 2 ? "n" : "x";
        write_seed(FUZZ_CREATE_VARIABLE, &c.req.base);
        /* The same name with another spec: ALREADY_EXISTS. */
        c.spec.name = (char *)fuzz_vars[i].name;
        c.opt.learning_rate = 0.5f;
        write_seed(FUZZ_CREATE_VARIABLE, &c.req.base);
    }
}

static void seed_pulls(void)
{
    Ps__V1__PullItem items[FUZZ_NVARS];
    Ps__V1__PullItem *pitems[FUZZ_NVARS];
    for (size_t i = 0; i < FUZZ_NVARS; i++) {
        ps__v1__pull_item__init(&items[i]);
        items[i].name = (char *)fuzz_vars[i].name;
        pitems[i] = &items[i];
    }
    Ps__V1__PullRequest req = PS__V1__PULL_REQUEST__INIT;
    req.items = pitems;
    req.n_items = 1;
    write_seed(FUZZ_PULL, &req.base);
    req.n_items = FUZZ_NVARS;
    write_seed(FUZZ_PULL, &req.base);
    /* A version not reached yet: waits until the deadline. */
    items[0].min_version = 3;
    req.n_items = 1;
    write_seed(FUZZ_PULL, &req.base);
    /* Into shared memory (see seed_pushes). */
    Ps__V1__ShmRef into = PS__V1__SHM_REF__INIT;
    into.name = (char *)"memfd:2147483646:3:ps-0123456789abcdef";
    into.length = 16;
    items[0].min_version = 0;
    items[0].into = &into;
    write_seed(FUZZ_PULL, &req.base);
}

static void seed_pushes(void)
{
    Ps__V1__Tensor ts[FUZZ_NVARS];
    Ps__V1__Gradient gs[FUZZ_NVARS];
    Ps__V1__Gradient *pgs[FUZZ_NVARS];
    int64_t shapes[FUZZ_NVARS][2];
    float vals[FUZZ_NVARS][8];
    for (size_t i = 0; i < FUZZ_NVARS; i++) {
        const struct fuzz_var *v = &fuzz_vars[i];
        size_t n = 1;
        for (size_t d = 0; d < v->ndim; d++) {
            shapes[i][d] = v->shape[d];
            n *= (size_t)v->shape[d];
        }
        for (size_t k = 0; k < n; k++)
            vals[i][k] = 0.25f * (float)(k + 1);
        ps__v1__tensor__init(&ts[i]);
        ts[i].dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
        ts[i].n_shape = v->ndim;
        ts[i].shape = shapes[i];
        ts[i].data.data = (uint8_t *)vals[i];
        ts[i].data.len = n * sizeof(float);
        ps__v1__gradient__init(&gs[i]);
        gs[i].name = (char *)v->name;
        gs[i].grad = &ts[i];
        pgs[i] = &gs[i];
    }
    Ps__V1__PushRequest req = PS__V1__PUSH_REQUEST__INIT;
    /* Each variable alone: "s" is SYNC, so workers 0 and 1 at step 0. */
    for (size_t i = 0; i < FUZZ_NVARS; i++) {
        req.grads = &pgs[i];
        req.n_grads = 1;
        write_seed(FUZZ_PUSH, &req.base);
        if (fuzz_vars[i].consistency == PS__V1__CONSISTENCY__SYNC) {
            req.worker = 1;
            write_seed(FUZZ_PUSH, &req.base);
            req.worker = 0;
        }
    }
    /* All at once, without shapes (accepted: the element count decides). */
    for (size_t i = 0; i < FUZZ_NVARS; i++)
        ts[i].n_shape = 0;
    req.grads = pgs;
    req.n_grads = FUZZ_NVARS;
    write_seed(FUZZ_PUSH, &req.base);
    /* By shared-memory reference (ShmRef), with the values asked into it:
     * a well-formed name of a process that does not exist, so that psd's
     * map is driven to its refusals. */
    Ps__V1__ShmRef ref = PS__V1__SHM_REF__INIT, into = PS__V1__SHM_REF__INIT;
    ref.name = (char *)"memfd:2147483646:3:ps-0123456789abcdef";
    ref.offset = 4096;
    ref.length = ts[0].data.len;
    into = ref;
    into.offset = 8192;
    ts[0].data.len = 0;
    ts[0].shm = &ref;
    gs[0].value_into = &into;
    req.grads = pgs;
    req.n_grads = 1;
    req.return_values = 1;
    write_seed(FUZZ_PUSH, &req.base);
}

/* A SparsePullRequest with the hint of the next pull (fuzz_decode's
 * ps_wire_sparse_decode; the handlers have no sparse table, so it goes to
 * an unknown method there): negative ids are ten-byte varints. */
static int64_t seed_ids[] = {3, 1, 4, 1, 5}, seed_next[] = {9, -2, 6, INT64_MIN, INT64_MAX};

/* A sparse item's name, ids and next_ids (a pull item's or a gradient's). */
static void seed_sparse_ids(char **name, int64_t **ids, size_t *n_ids, int64_t **next,
                            size_t *n_next)
{
    *name = (char *)"emb";
    *ids = seed_ids;
    *n_ids = sizeof seed_ids / sizeof *seed_ids;
    *next = seed_next;
    *n_next = sizeof seed_next / sizeof *seed_next;
}

static void seed_sparse_pull(void)
{
    Ps__V1__SparsePullItem it = PS__V1__SPARSE_PULL_ITEM__INIT, *pit = &it;
    seed_sparse_ids(&it.name, &it.ids, &it.n_ids, &it.next_ids, &it.n_next_ids);
    Ps__V1__SparsePullRequest req = PS__V1__SPARSE_PULL_REQUEST__INIT;
    req.items = &pit;
    req.n_items = 1;
    write_seed(FUZZ_UNKNOWN, &req.base);
}

/* A SparsePushRequest with the hint of the next push, the same way. */
static void seed_sparse_push(void)
{
    float g[10] = {0.5f, -1.0f, 2.0f, 0.25f, 0.0f, -3.0f, 1.0f, 1.5f, -0.5f, 4.0f};
    int64_t shape[2] = {5, 2};
    Ps__V1__Tensor t = PS__V1__TENSOR__INIT;
    t.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    t.shape = shape;
    t.n_shape = 2;
    t.data.data = (uint8_t *)g;
    t.data.len = sizeof g;
    Ps__V1__SparseGradient gr = PS__V1__SPARSE_GRADIENT__INIT, *pg = &gr;
    seed_sparse_ids(&gr.name, &gr.ids, &gr.n_ids, &gr.next_ids, &gr.n_next_ids);
    gr.grad = &t;
    Ps__V1__SparsePushRequest req = PS__V1__SPARSE_PUSH_REQUEST__INIT;
    req.step = 7;
    req.grads = &pg;
    req.n_grads = 1;
    write_seed(FUZZ_UNKNOWN, &req.base);
}

static void seed_rest(void)
{
    Ps__V1__ListVariablesRequest lr = PS__V1__LIST_VARIABLES_REQUEST__INIT;
    write_seed(FUZZ_LIST_VARIABLES, &lr.base);
    Ps__V1__StatsRequest sr = PS__V1__STATS_REQUEST__INIT;
    write_seed(FUZZ_STATS, &sr.base);
    Ps__V1__CheckpointRequest cr = PS__V1__CHECKPOINT_REQUEST__INIT;
    write_seed(FUZZ_CHECKPOINT, &cr.base);
    cr.step = 7;
    write_seed(FUZZ_CHECKPOINT, &cr.base);
    Ps__V1__RestoreRequest rr = PS__V1__RESTORE_REQUEST__INIT;
    write_seed(FUZZ_RESTORE, &rr.base);
    rr.step = 7;
    write_seed(FUZZ_RESTORE, &rr.base);
    Grpc__Health__V1__HealthCheckRequest hr =
        GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    hr.service = "ps.v1.ParameterServer";
    write_seed(FUZZ_UNKNOWN, &hr.base);
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "decode") != 0 &&
                      strcmp(argv[1], "handlers") != 0)) {
        fprintf(stderr, "usage: fuzz_seeds decode|handlers DIR\n");
        return 2;
    }
    with_method = strcmp(argv[1], "handlers") == 0;
    dir = argv[2];
    seed_creates();
    seed_pulls();
    seed_pushes();
    seed_sparse_pull();
    seed_sparse_push();
    seed_rest();
    return 0;
}
