/*
 * fuzz_handlers - libFuzzer target: arbitrary bytes as the request of every
 * ParameterServer method, sent through the real gRPC client to the real
 * handlers (server/shard.h) on a real rpc server (common/rpc.h) over a
 * shard whose LMDB lives in a temporary directory: the path a request from
 * the network takes in psd, with nothing replaced.
 *
 * An input's first byte picks the method (fuzz_common.h: the seven
 * ParameterServer methods and one path that nothing serves); the rest is
 * the request message, sent as is. Every status is an acceptable answer.
 * A finding is a crash, a sanitizer report, a call that hangs past
 * libFuzzer's -timeout, or one of these broken promises (abort):
 * - an OK answer parses as the method's response message;
 * - a failure the server sends says what was wrong (a non-empty message);
 * - the variables created at start-up stay listed: nothing deletes a
 *   variable, and every checkpoint Restore can load holds them.
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
    ps_rpc_client_destroy(F.cli);
    psd_shard_stop(F.shard);
    ps_rpc_server_shutdown(F.srv, 2000);
    ps_rpc_server_destroy(F.srv);
    int rc = psd_shard_close(F.shard);
    if (rc != 0)
        fprintf(stderr, "fuzz_handlers: the shard's final flush failed: %s\n",
                ps_strerror(rc));
    ps_buf_free(&F.resp);
    nftw(F.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void create_vars(void)
{
    for (size_t i = 0; i < FUZZ_NVARS; i++) {
        struct fuzz_create c;
        fuzz_create_request(i, &c);
        void *resp = NULL;
        ps_rpc_status st;
        /* A long deadline: the first call also connects. */
        int rc = ps_rpc_invoke_pb(F.cli, fuzz_methods[FUZZ_CREATE_VARIABLE], &c.req,
                                  &ps__v1__create_variable_response__descriptor,
                                  &resp, 10000, &st);
        if (rc != 0)
            DIE("cannot create variable '%s': %s: %s", fuzz_vars[i].name,
                ps_rpc_code_name(st.code), st.message);
        protobuf_c_message_free_unpacked(resp, NULL);
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int m = data[0] % FUZZ_NMETHODS;
    ps_rpc_status st;
    int rc = ps_rpc_invoke(F.cli, fuzz_methods[m], data + 1, size - 1, &F.resp,
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
    protobuf_c_message_free_unpacked(r, NULL);
    return 0;
}
