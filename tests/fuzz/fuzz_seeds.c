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
 * The pushes and pulls name the variables and sparse tables fuzz_handlers
 * creates at start-up, with the right sizes and dtypes, so that the fuzzer
 * starts from requests that reach the optimizers, the sync and wait paths
 * and the sparse tier's pull, push, read-ahead and eviction.
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
    size_t n = 0;
    for (size_t i = 0; i < FUZZ_NVARS; i++) {
        if (fuzz_vars[i].sparse)
            continue;
        ps__v1__pull_item__init(&items[n]);
        items[n].name = (char *)fuzz_vars[i].name;
        pitems[n] = &items[n];
        n++;
    }
    Ps__V1__PullRequest req = PS__V1__PULL_REQUEST__INIT;
    req.items = pitems;
    req.n_items = 1;
    write_seed(FUZZ_PULL, &req.base);
    req.n_items = n;
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
    size_t ndense = 0;
    for (size_t j = 0; j < FUZZ_NVARS; j++) {
        if (fuzz_vars[j].sparse)
            continue;
        size_t i = ndense++;
        const struct fuzz_var *v = &fuzz_vars[j];
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
    for (size_t i = 0; i < ndense; i++) {
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
    for (size_t i = 0; i < ndense; i++)
        ts[i].n_shape = 0;
    req.grads = pgs;
    req.n_grads = ndense;
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
 * ps_wire_sparse_decode; for the handlers a table that does not exist):
 * negative ids are ten-byte varints. */
static void seed_sparse_pull(void)
{
    int64_t ids[] = {3, 1, 4, 1, 5}, next[] = {9, -2, 6, INT64_MIN, INT64_MAX};
    Ps__V1__SparsePullItem it = PS__V1__SPARSE_PULL_ITEM__INIT, *pit = &it;
    it.name = (char *)"emb";
    it.ids = ids;
    it.n_ids = sizeof ids / sizeof *ids;
    it.next_ids = next;
    it.n_next_ids = sizeof next / sizeof *next;
    Ps__V1__SparsePullRequest req = PS__V1__SPARSE_PULL_REQUEST__INIT;
    req.items = &pit;
    req.n_items = 1;
    write_seed(FUZZ_SPARSE_PULL, &req.base);
}

/* 1.0 in half dtype dt (FLOAT16 or BFLOAT16), as its bits. */
static uint16_t half_one(Ps__V1__DType dt)
{
    return dt == PS__V1__DTYPE__DTYPE_FLOAT16 ? 0x3c00 : 0x3f80; /* 1.0 */
}

/* Pulls and pushes of each start-up sparse table: ids with a repeat and a
 * negative one, the next pull's ids, float32 answers of a half table;
 * pushes in float32 and in the table's half dtype, with and without
 * return_values and the next push's ids, at growing steps (so that "r"'s TTL evicts); then every
 * table in one pull and one push. */
static void seed_sparse(void)
{
    static int64_t ids[] = {1, 2, 1, -7}, next[] = {3, 4, 1};
    static float g32[4 * 8];
    static uint16_t g16[4 * 8];
    enum { NIDS = sizeof ids / sizeof *ids };
    Ps__V1__SparsePullItem items[FUZZ_NVARS], *pitems[FUZZ_NVARS];
    Ps__V1__SparseGradient grads[FUZZ_NVARS], *pgrads[FUZZ_NVARS];
    Ps__V1__Tensor ts[FUZZ_NVARS];
    int64_t shapes[FUZZ_NVARS][2];
    size_t n = 0;
    for (size_t k = 0; k < 4 * 8; k++)
        g32[k] = 0.125f * (float)(k % 5) - 0.25f;
    for (size_t i = 0; i < FUZZ_NVARS; i++) {
        const struct fuzz_var *v = &fuzz_vars[i];
        if (!v->sparse)
            continue;
        ps__v1__sparse_pull_item__init(&items[n]);
        items[n].name = (char *)v->name;
        items[n].ids = ids;
        items[n].n_ids = NIDS;
        pitems[n] = &items[n];
        Ps__V1__SparsePullRequest pr = PS__V1__SPARSE_PULL_REQUEST__INIT;
        pr.items = &pitems[n];
        pr.n_items = 1;
        write_seed(FUZZ_SPARSE_PULL, &pr.base);
        items[n].next_ids = next;
        items[n].n_next_ids = sizeof next / sizeof *next;
        if (v->row_dtype != PS__V1__DTYPE__DTYPE_UNSPECIFIED)
            items[n].dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
        write_seed(FUZZ_SPARSE_PULL, &pr.base);
        items[n].dtype = PS__V1__DTYPE__DTYPE_UNSPECIFIED;

        shapes[n][0] = NIDS;
        shapes[n][1] = v->shape[0];
        ps__v1__tensor__init(&ts[n]);
        ts[n].dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
        ts[n].n_shape = 2;
        ts[n].shape = shapes[n];
        ts[n].data.data = (uint8_t *)g32;
        ts[n].data.len = NIDS * (size_t)v->shape[0] * sizeof(float);
        ps__v1__sparse_gradient__init(&grads[n]);
        grads[n].name = (char *)v->name;
        grads[n].ids = ids;
        grads[n].n_ids = NIDS;
        grads[n].grad = &ts[n];
        pgrads[n] = &grads[n];
        Ps__V1__SparsePushRequest req = PS__V1__SPARSE_PUSH_REQUEST__INIT;
        req.grads = &pgrads[n];
        req.n_grads = 1;
        req.step = 1;
        write_seed(FUZZ_SPARSE_PUSH, &req.base);
        req.step = 9;
        req.return_values = 1;
        write_seed(FUZZ_SPARSE_PUSH, &req.base);
        grads[n].next_ids = next; /* the next push's ids, read ahead */
        grads[n].n_next_ids = sizeof next / sizeof *next;
        write_seed(FUZZ_SPARSE_PUSH, &req.base);
        if (v->row_dtype != PS__V1__DTYPE__DTYPE_UNSPECIFIED) {
            Ps__V1__Tensor t = ts[n];
            Ps__V1__SparseGradient g = grads[n], *pg = &g;
            for (size_t k = 0; k < 4 * 8; k++)
                g16[k] = half_one(v->row_dtype);
            t.dtype = v->row_dtype;
            t.data.data = (uint8_t *)g16;
            t.data.len = NIDS * (size_t)v->shape[0] * sizeof(uint16_t);
            g.grad = &t;
            req.grads = &pg;
            req.wire_dtype = v->row_dtype;
            write_seed(FUZZ_SPARSE_PUSH, &req.base);
        }
        n++;
    }
    Ps__V1__SparsePullRequest pr = PS__V1__SPARSE_PULL_REQUEST__INIT;
    pr.items = pitems;
    pr.n_items = n;
    write_seed(FUZZ_SPARSE_PULL, &pr.base);
    Ps__V1__SparsePushRequest req = PS__V1__SPARSE_PUSH_REQUEST__INIT;
    req.grads = pgrads;
    req.n_grads = n;
    req.worker = 1;
    req.step = 20;
    req.return_values = 1;
    write_seed(FUZZ_SPARSE_PUSH, &req.base);
}

/* SetSyncWorkers (0 is refused; 1 applies "s"'s waiting step at once), and
 * DeleteVariable of the scratch variables seed_creates makes, of a name
 * that does not exist and of a start-up table (which fuzz_handlers
 * creates again). */
static void seed_operator(void)
{
    Ps__V1__SetSyncWorkersRequest sw = PS__V1__SET_SYNC_WORKERS_REQUEST__INIT;
    for (uint32_t w = 0; w <= 2; w++) {
        sw.workers = w;
        write_seed(FUZZ_SET_SYNC_WORKERS, &sw.base);
    }
    static const char *const names[] = {"x", "n", "zz", "r"};
    Ps__V1__DeleteVariableRequest dr = PS__V1__DELETE_VARIABLE_REQUEST__INIT;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        dr.name = (char *)names[i];
        write_seed(FUZZ_DELETE_VARIABLE, &dr.base);
    }
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
    seed_sparse();
    seed_operator();
    seed_rest();
    return 0;
}
