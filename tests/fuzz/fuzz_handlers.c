/*
 * fuzz_handlers - libFuzzer target: arbitrary bytes as the request of every
 * ParameterServer method, sent through the real gRPC client to the real
 * handlers (server/shard.h) on a real rpc server (common/rpc.h) over a
 * shard whose LMDB lives in a temporary directory: the path a request from
 * the network takes in psd, with nothing replaced.
 *
 * An input's first byte picks the method (fuzz_common.h: the eleven
 * ParameterServer methods and one path that nothing serves); the rest is
 * the request message, sent as is. Start-up creates dense variables and
 * sparse tables of every row and slot dtype, one of them with max_rows and
 * a TTL so that the sweep evicts (fuzz_common.h). Every status is an
 * acceptable answer. A finding is a crash, a sanitizer report, a call that
 * hangs past libFuzzer's -timeout, or one of these broken promises (abort):
 * - an OK answer parses as the method's response message;
 * - a failure the server sends says what was wrong (a non-empty message);
 * - the variables created at start-up stay listed. DeleteVariable may
 *   delete one (psd lets an operator delete any variable): after every OK
 *   DeleteVariable the harness creates the start-up variables again
 *   (CreateVariable is idempotent for the identical spec, so only the one
 *   deleted is new), and that must succeed; every checkpoint Restore can
 *   load holds them all, as every input ends with them all present;
 * - a SparsePull answered OK holds, for each item of the request (as
 *   protobuf-c reads it), a row block of that table's name with shape
 *   [len(ids), dim] and len(ids) x dim values of the dtype asked for (the
 *   table's row_dtype when unset);
 * - a SparsePush answered OK has a version per gradient and, with
 *   return_values, such a row block per gradient in the table's row_dtype;
 * - a SparsePush refused by the server (not the client's deadline) changed
 *   nothing: a SparsePull of the start-up tables that the sweep leaves
 *   alone, of a few fixed ids and the first ids the push named, answers
 *   the same bytes (values and versions) before and after it. The first
 *   pull waits until the server holds no call of an earlier input (one
 *   the client gave up at its deadline may still apply).
 *
 * Start-up runs once, in LLVMFuzzerInitialize. An atexit handler stops the
 * shard, drains and destroys the server, closes the shard and removes the
 * directory in the order psd.c shuts down, so LeakSanitizer's check at exit
 * sees only memory that is really lost.
 *
 * Calls use a 100 ms deadline: a Pull for a version not yet reached and a
 * push to the SYNC variable (two workers) wait that long, everything else
 * answers at once. The shard's limits keep an input cheap: messages (so
 * variables) of at most 1 MiB, a 32 MiB LMDB map (a full one answers
 * RESOURCE_EXHAUSTED, which is fine), two checkpoints kept.
 *
 * FUZZ_LOG_LEVEL (error, warn, info, debug; default error) sets psd's log
 * level: at debug every refused request is logged.
 */
#include "common/buf.h"
#include "common/errors.h"
#include "tests/fuzz/fuzz_common.h"
#include "common/log.h"
#include "proto/ps.pb-c.h"
#include "common/rpc.h"
#include "server/shard.h"

#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEADLINE_MS 100
#define MAX_MESSAGE ((size_t)1 << 20)
#define MAP_SIZE ((uint64_t)32 << 20)

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "fuzz_handlers: %s:%d: invariant broken: %s: ", \
                    __FILE__, __LINE__, #cond);                           \
            fprintf(stderr, __VA_ARGS__);                                 \
            fputc('\n', stderr);                                          \
            abort();                                                      \
        }                                                                 \
    } while (0)

#define DIE(...)                                                          \
    do {                                                                  \
        fprintf(stderr, "fuzz_handlers: " __VA_ARGS__);                   \
        fputc('\n', stderr);                                              \
        exit(2);                                                          \
    } while (0)

static struct {
    char dir[4096];
    psd_shard *shard;
    ps_rpc_server *srv;
    ps_rpc_client *cli;
    ps_buf resp;
    ps_buf before, after; /* a refused SparsePush's spot check */
    unsigned long spot_checks; /* refused SparsePushes compared */
    bool up;
} F;

/* The response type of each method, to check that OK answers parse. */
static const ProtobufCMessageDescriptor *const resp_desc[FUZZ_NMETHODS] = {
    &ps__v1__create_variable_response__descriptor,
    &ps__v1__pull_response__descriptor,
    &ps__v1__push_response__descriptor,
    &ps__v1__list_variables_response__descriptor,
    &ps__v1__stats_response__descriptor,
    &ps__v1__checkpoint_response__descriptor,
    &ps__v1__restore_response__descriptor,
    &ps__v1__set_sync_workers_response__descriptor,
    &ps__v1__delete_variable_response__descriptor,
    &ps__v1__sparse_pull_response__descriptor,
    &ps__v1__sparse_push_response__descriptor,
    NULL,
};

static int rm_entry(const char *path, const struct stat *sb, int flag,
                    struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void teardown(void)
{
    if (!F.up)
        return;
    F.up = false;
    fprintf(stderr, "fuzz_handlers: %lu refused SparsePush(es) left the rows pulled "
            "around them unchanged\n", F.spot_checks);
    ps_rpc_client_destroy(F.cli);
    psd_shard_stop(F.shard);
    ps_rpc_server_shutdown(F.srv, 2000);
    ps_rpc_server_destroy(F.srv);
    int rc = psd_shard_close(F.shard);
    if (rc != 0)
        fprintf(stderr, "fuzz_handlers: the shard's final flush failed: %s\n",
                ps_strerror(rc));
    ps_buf_free(&F.resp);
    ps_buf_free(&F.before);
    ps_buf_free(&F.after);
    nftw(F.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Creates fuzz_vars[i] (or finds it there with the identical spec).
 * Returns the call's result, st filled on failure. */
static int create_var(size_t i, int deadline_ms, ps_rpc_status *st)
{
    struct fuzz_create c;
    fuzz_create_request(i, &c);
    void *resp = NULL;
    int rc = ps_rpc_invoke_pb(F.cli, fuzz_methods[FUZZ_CREATE_VARIABLE], &c.req,
                              &ps__v1__create_variable_response__descriptor,
                              &resp, deadline_ms, st);
    if (rc == 0)
        protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static void create_vars(void)
{
    for (size_t i = 0; i < FUZZ_NVARS; i++) {
        ps_rpc_status st;
        /* A long deadline: the first call also connects. */
        if (create_var(i, 10000, &st) != 0)
            DIE("cannot create variable '%s': %s: %s", fuzz_vars[i].name,
                ps_rpc_code_name(st.code), st.message);
    }
}

/* After an OK DeleteVariable: the start-up variable it deleted, if it was
 * one, is created again, so that the invariants that name them keep
 * meaning something. A second's deadline: a creation commits nothing
 * before it answers, but the sanitizers slow everything. */
static void recreate_vars(void)
{
    for (size_t i = 0; i < FUZZ_NVARS; i++) {
        ps_rpc_status st;
        int rc = create_var(i, 1000, &st);
        CHECK(rc == 0, "variable '%s' cannot be created again after a DeleteVariable: "
              "%s: %s", fuzz_vars[i].name, ps_rpc_code_name(st.code), st.message);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    enum ps_log_level level = PS_LOG_ERROR;
    const char *lv = getenv("FUZZ_LOG_LEVEL");
    if (lv != NULL && ps_log_level_parse(lv, &level) != 0)
        DIE("FUZZ_LOG_LEVEL=%s: expected error, warn, info or debug", lv);
    ps_log_init("fuzz_handlers", level);

    const char *tmp = getenv("TMPDIR");
    snprintf(F.dir, sizeof F.dir, "%s/psd-fuzz-XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(F.dir) == NULL)
        DIE("mkdtemp %s failed", F.dir);

    psd_shard_opts so = {
        .data_dir = F.dir,
        .map_size = MAP_SIZE,
        .consistency = PSD_ASYNC,
        .workers = 1,
        .commit_interval_ms = 5,
        .max_message_bytes = MAX_MESSAGE,
        .checkpoint_keep = 2,
    };
    int rc = psd_shard_open(&so, &F.shard);
    if (rc != 0)
        DIE("psd_shard_open %s: %s", F.dir, ps_strerror(rc));
    ps_rpc_server_opts ro = {.listen = "127.0.0.1:0", .threads = 2,
                             .max_message_bytes = MAX_MESSAGE};
    int port = 0;
    if ((rc = ps_rpc_server_create(&ro, &F.srv)) != 0 ||
        (rc = psd_shard_register(F.shard, F.srv)) != 0 ||
        (rc = ps_rpc_server_start(F.srv, &port)) != 0)
        DIE("cannot start the rpc server: %s", ps_strerror(rc));
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    ps_rpc_client_opts co = {.deadline_ms = DEADLINE_MS,
                             .max_attempts = 1,
                             .max_message_bytes = MAX_MESSAGE};
    if ((rc = ps_rpc_client_create(target, &co, &F.cli)) != 0)
        DIE("cannot create the client for %s: %s", target, ps_strerror(rc));
    F.up = true;
    atexit(teardown);
    create_vars();
    return 0;
}

static void check_listed(const Ps__V1__ListVariablesResponse *r)
{
    for (size_t i = 0; i < FUZZ_NVARS; i++) {
        bool found = false;
        for (size_t j = 0; j < r->n_variables && !found; j++)
            found = r->variables[j]->spec != NULL &&
                    strcmp(r->variables[j]->spec->name, fuzz_vars[i].name) == 0;
        CHECK(found, "variable '%s' is missing from ListVariables (%zu listed)",
              fuzz_vars[i].name, r->n_variables);
    }
}

/* The start-up table named name, or NULL (another, or a dense variable). */
static const struct fuzz_var *startup_table(const char *name)
{
    for (size_t i = 0; i < FUZZ_NVARS; i++)
        if (fuzz_vars[i].sparse && strcmp(fuzz_vars[i].name, name) == 0)
            return &fuzz_vars[i];
    return NULL;
}

static size_t dtype_size(int dt)
{
    return dt == PS__V1__DTYPE__DTYPE_FLOAT16 || dt == PS__V1__DTYPE__DTYPE_BFLOAT16 ? 2 : 4;
}

/* Checks one row block of an OK answer: table name, n_ids rows of the
 * table's dim (when it is a start-up table) in dtype want (0: any). */
static void check_rows(const char *method, const char *name, size_t n_ids, int want,
                       const Ps__V1__SparseRows *rows)
{
    CHECK(strcmp(rows->name, name) == 0, "%s answered rows of '%s' for table '%s'",
          method, rows->name, name);
    const Ps__V1__Tensor *t = rows->values;
    CHECK(t != NULL, "%s answered table '%s' with no values", method, name);
    CHECK(t->n_shape == 2 && t->shape[0] >= 0 && (size_t)t->shape[0] == n_ids &&
              t->shape[1] >= 1,
          "%s answered table '%s' (%zu ids) with a tensor of %zu dims, first %lld",
          method, name, n_ids, t->n_shape, t->n_shape ? (long long)t->shape[0] : -1LL);
    const struct fuzz_var *v = startup_table(name);
    CHECK(v == NULL || t->shape[1] == v->shape[0],
          "%s answered table '%s' with rows of %lld values, its dim is %lld", method, name,
          (long long)t->shape[1], v ? (long long)v->shape[0] : 0LL);
    CHECK(want == 0 || (int)t->dtype == want, "%s answered table '%s' in dtype %d, not %d",
          method, name, (int)t->dtype, want);
    size_t n = n_ids * (size_t)t->shape[1] * dtype_size(t->dtype);
    CHECK(t->data.len == n, "%s answered table '%s' with %zu bytes for %zu ids x %lld "
          "values of dtype %d (%zu bytes)", method, name, t->data.len, n_ids,
          (long long)t->shape[1], (int)t->dtype, n);
}

/* The dtype a start-up table's rows are answered in by default (0 for
 * another table: not known here). */
static int row_dtype(const char *name)
{
    const struct fuzz_var *v = startup_table(name);
    if (v == NULL)
        return 0;
    return v->row_dtype != 0 ? (int)v->row_dtype : PS__V1__DTYPE__DTYPE_FLOAT32;
}

/* An OK SparsePull: a row block per item of the request. */
static void check_sparse_pull(const Ps__V1__SparsePullRequest *q,
                              const Ps__V1__SparsePullResponse *r)
{
    CHECK(r->n_rows == q->n_items, "SparsePull answered %zu row blocks for %zu items",
          r->n_rows, q->n_items);
    for (size_t i = 0; i < q->n_items; i++) {
        const Ps__V1__SparsePullItem *it = q->items[i];
        int want = it->dtype != 0 ? (int)it->dtype : row_dtype(it->name);
        check_rows("SparsePull", it->name, it->n_ids, want, r->rows[i]);
    }
}

/* An OK SparsePush: a version per gradient, and with return_values a row
 * block per gradient in its table's row_dtype. */
static void check_sparse_push(const Ps__V1__SparsePushRequest *q,
                              const Ps__V1__SparsePushResponse *r)
{
    CHECK(r->n_versions == q->n_grads, "SparsePush answered %zu versions for %zu grads",
          r->n_versions, q->n_grads);
    CHECK(r->n_values == (q->return_values ? q->n_grads : 0),
          "SparsePush answered %zu row blocks for %zu grads, return_values %d",
          r->n_values, q->n_grads, (int)q->return_values);
    for (size_t i = 0; i < r->n_values; i++)
        check_rows("SparsePush", q->grads[i]->name, q->grads[i]->n_ids,
                   row_dtype(q->grads[i]->name), r->values[i]);
}

/* An OK answer r of SparsePull or SparsePush (method m) against its
 * request as protobuf-c reads it. psd's in-place decoder skips a field of
 * the wrong wire type, which protobuf-c refuses: then there is nothing to
 * compare with. */
static void check_sparse(int m, const uint8_t *req, size_t len, const ProtobufCMessage *r)
{
    bool pull = m == FUZZ_SPARSE_PULL;
    ProtobufCMessage *q = protobuf_c_message_unpack(
        pull ? &ps__v1__sparse_pull_request__descriptor
             : &ps__v1__sparse_push_request__descriptor,
        NULL, len, req);
    if (q == NULL)
        return;
    if (pull)
        check_sparse_pull((const Ps__V1__SparsePullRequest *)q,
                          (const Ps__V1__SparsePullResponse *)r);
    else
        check_sparse_push((const Ps__V1__SparsePushRequest *)q,
                          (const Ps__V1__SparsePushResponse *)r);
    protobuf_c_message_free_unpacked(q, NULL);
}

/* The ids a refused push's spot check pulls of a table: a few fixed ones,
 * then the first ones the push named for it. */
#define SPOT_FIXED 4
#define SPOT_IDS (SPOT_FIXED + 8)

/* Pulls the spot check's rows of the start-up tables the sweep leaves
 * alone (no max_rows, no TTL: "r"'s rows may be evicted at any time, and
 * an evicted row pulls as its initial row), into out (the answer's
 * bytes). False when the pull fails (then there is nothing to compare). */
static bool spot_pull(const Ps__V1__SparsePushRequest *q, ps_buf *out)
{
    static const int64_t fixed[SPOT_FIXED] = {0, 1, 2, -7};
    Ps__V1__SparsePullItem items[FUZZ_NVARS], *pitems[FUZZ_NVARS];
    int64_t ids[FUZZ_NVARS][SPOT_IDS];
    size_t n = 0;
    for (size_t i = 0; i < FUZZ_NVARS; i++) {
        const struct fuzz_var *v = &fuzz_vars[i];
        if (!v->sparse || v->max_rows != 0 || v->ttl_steps != 0)
            continue;
        size_t k = SPOT_FIXED;
        memcpy(ids[n], fixed, sizeof fixed);
        for (size_t g = 0; q != NULL && g < q->n_grads; g++) {
            if (strcmp(q->grads[g]->name, v->name) != 0)
                continue;
            for (size_t j = 0; j < q->grads[g]->n_ids && k < SPOT_IDS; j++)
                ids[n][k++] = q->grads[g]->ids[j];
        }
        ps__v1__sparse_pull_item__init(&items[n]);
        items[n].name = (char *)v->name;
        items[n].ids = ids[n];
        items[n].n_ids = k;
        pitems[n] = &items[n];
        n++;
    }
    Ps__V1__SparsePullRequest pr = PS__V1__SPARSE_PULL_REQUEST__INIT;
    pr.items = pitems;
    pr.n_items = n;
    uint8_t buf[1024];
    size_t len = ps__v1__sparse_pull_request__get_packed_size(&pr);
    CHECK(len <= sizeof buf, "the spot check's pull is %zu bytes", len);
    ps__v1__sparse_pull_request__pack(&pr, buf);
    ps_rpc_status st;
    return ps_rpc_invoke(F.cli, fuzz_methods[FUZZ_SPARSE_PULL], buf, len, out, 1000,
                         &st) == 0;
}

/* Where the spot check's two answers differ, for the report: the table,
 * its versions and the first value byte that differs. */
static void spot_diff(char *out, size_t outlen)
{
    Ps__V1__SparsePullResponse *a =
        ps__v1__sparse_pull_response__unpack(NULL, F.before.len, F.before.data);
    Ps__V1__SparsePullResponse *b =
        ps__v1__sparse_pull_response__unpack(NULL, F.after.len, F.after.data);
    snprintf(out, outlen, "answers of %zu and %zu bytes", F.before.len, F.after.len);
    for (size_t i = 0; a != NULL && b != NULL && i < a->n_rows && i < b->n_rows; i++) {
        const Ps__V1__SparseRows *x = a->rows[i], *y = b->rows[i];
        if (x->values == NULL || y->values == NULL)
            continue;
        const ProtobufCBinaryData *dx = &x->values->data, *dy = &y->values->data;
        size_t k = 0;
        while (k < dx->len && k < dy->len && dx->data[k] == dy->data[k])
            k++;
        if (x->version == y->version && k == dx->len && k == dy->len)
            continue;
        snprintf(out, outlen, "table '%s': version %llu then %llu, values differ from "
                 "byte %zu of %zu", x->name, (unsigned long long)x->version,
                 (unsigned long long)y->version, k, dx->len);
        break;
    }
    if (a != NULL)
        ps__v1__sparse_pull_response__free_unpacked(a, NULL);
    if (b != NULL)
        ps__v1__sparse_pull_response__free_unpacked(b, NULL);
}

/* Waits until no call is in the server's hands, at most 2 s: a call of an
 * earlier input that the client gave up at its deadline (a Restore, a slow
 * push under the sanitizers) may still change rows. False if one still
 * is (then the spot check is skipped). */
static bool quiesce(void)
{
    for (int i = 0; i < 2000; i++) {
        if (ps_rpc_server_calls_in_flight(F.srv) == 0)
            return true;
        usleep(1000);
    }
    return false;
}

/* A SparsePush, with the spot check around it when it is refused. */
static int sparse_push(const uint8_t *req, size_t len, ps_rpc_status *st)
{
    Ps__V1__SparsePushRequest *q = ps__v1__sparse_push_request__unpack(NULL, len, req);
    bool spot = quiesce() && spot_pull(q, &F.before);
    int rc = ps_rpc_invoke(F.cli, fuzz_methods[FUZZ_SPARSE_PUSH], req, len, &F.resp,
                           DEADLINE_MS, st);
    /* The client's deadline says nothing of what the server did. */
    bool compared = rc != 0 && spot && st->code != PS_RPC_DEADLINE_EXCEEDED &&
                    st->code != PS_RPC_CANCELLED && spot_pull(q, &F.after);
    if (compared && (F.after.len != F.before.len ||
                     memcmp(F.after.data, F.before.data, F.before.len) != 0)) {
        char diff[256];
        spot_diff(diff, sizeof diff);
        CHECK(false, "SparsePush refused (%s: %s) but the rows pulled before it changed: %s",
              ps_rpc_code_name(st->code), st->message, diff);
    }
    F.spot_checks += compared;
    if (q != NULL)
        ps__v1__sparse_push_request__free_unpacked(q, NULL);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int m = data[0] % FUZZ_NMETHODS;
    ps_rpc_status st;
    int rc = m == FUZZ_SPARSE_PUSH
                 ? sparse_push(data + 1, size - 1, &st)
                 : ps_rpc_invoke(F.cli, fuzz_methods[m], data + 1, size - 1, &F.resp,
                                 DEADLINE_MS, &st);
    if (rc != 0) {
        /* Deadline and cancellation statuses may be the client's own. */
        CHECK(st.code == PS_RPC_DEADLINE_EXCEEDED || st.code == PS_RPC_CANCELLED ||
                  st.message[0] != '\0',
              "%s answered %s with no message", fuzz_methods[m],
              ps_rpc_code_name(st.code));
        CHECK(m != FUZZ_UNKNOWN || st.code == PS_RPC_UNIMPLEMENTED ||
                  st.code == PS_RPC_DEADLINE_EXCEEDED,
              "%s answered %s: %s", fuzz_methods[m], ps_rpc_code_name(st.code),
              st.message);
        return 0;
    }
    CHECK(resp_desc[m] != NULL, "%s answered OK", fuzz_methods[m]);
    ProtobufCMessage *r =
        protobuf_c_message_unpack(resp_desc[m], NULL, F.resp.len, F.resp.data);
    CHECK(r != NULL, "%s answered OK with %zu bytes that are not a %s",
          fuzz_methods[m], F.resp.len, resp_desc[m]->name);
    if (m == FUZZ_LIST_VARIABLES)
        check_listed((const Ps__V1__ListVariablesResponse *)r);
    else if (m == FUZZ_SPARSE_PULL || m == FUZZ_SPARSE_PUSH)
        check_sparse(m, data + 1, size - 1, r);
    else if (m == FUZZ_DELETE_VARIABLE)
        recreate_vars();
    protobuf_c_message_free_unpacked(r, NULL);
    return 0;
}
