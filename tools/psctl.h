/*
 * psctl.h - what psctl's files share: the command table's row, the exit
 * statuses, psctl's own options, the parsing of a command's options and
 * positionals, the session with the server a command talks to, and the
 * formatting of numbers.
 *
 *   psctl.c        the command table, usage, argument parsing, main
 *   session.c      connecting to psd or pscoord, the first probe, calls and
 *                  how their failures are reported
 *   format.c       bytes, durations, shapes, optimizer and consistency labels
 *   pbjson.c       -o json: a reply as JSON, by its descriptor; totals
 *   cmd_var.c      list, show, pull, create, delete (one variable or all of
 *                  them)
 *   cmd_server.c   checkpoint, restore, stats, health (the server as a whole)
 *   cmd_cluster.c  cluster validate, status (the job)
 *   cmd_top.c      top (a live view of the job)
 *   cmd_token.c    token (a fresh token for a role)
 *
 * Threads and lifetime: one thread. psctl_global is set once by main before
 * a command runs; commands only read it. A session is opened and closed by
 * the command that uses it.
 */
#ifndef PSCTL_H
#define PSCTL_H

#include "common/auth.h"
#include "common/conf.h"
#include "proto/ps.pb-c.h"
#include "common/rpc.h"
#include "common/tls.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

/* Where psctl looks for psd when neither --server nor $PSD_ADDR says. */
#define DEFAULT_SERVER "127.0.0.1:7070"
/* Where status looks for pscoord when neither --coordinator nor
 * $PSCOORD_ADDR says. */
#define DEFAULT_COORDINATOR "127.0.0.1:7071"
/* The first contact's deadline (or --rpc-timeout, if shorter): long enough for
 * a loaded server, or one under valgrind, to answer a health check; short
 * enough that a mistyped address is reported while the operator waits. */
#define PROBE_MS 3000

#define PS_METHOD(m) "/ps.v1.ParameterServer/" m
#define COORD_METHOD(m) "/ps.v1.Coordinator/" m

struct one_call;
struct fan_cmd;

struct command {
    const char *words; /* the command, space-separated: "cluster validate" */
    const char *args;  /* what follows it, for the usage line */
    const char *help;
    int (*run)(const struct command *self, int argc, char **argv);
    const struct one_call *call; /* run is NULL: one call (run_one_call) */
    const struct fan_cmd *fan;   /* run and call NULL: a fanned-out call (run_fan) */
};

/* The commands, each in the file of its subject: those that are one call
 * as a row, the others as a function. */
extern const struct one_call checkpoint_call, restore_call;
extern const struct fan_cmd list_fan, stats_fan;
int cmd_show(const struct command *self, int argc, char **argv);
int cmd_pull(const struct command *self, int argc, char **argv);
int cmd_create(const struct command *self, int argc, char **argv);
int cmd_delete(const struct command *self, int argc, char **argv);
int cmd_health(const struct command *self, int argc, char **argv);
int cmd_cluster_validate(const struct command *self, int argc, char **argv);
int cmd_status(const struct command *self, int argc, char **argv);
int cmd_top(const struct command *self, int argc, char **argv);
int cmd_token(const struct command *self, int argc, char **argv);

/* Options that come before the command. */
struct global_cfg {
    int log_level;      /* an enum ps_log_level */
    int log_format;     /* an enum ps_log_format */
    char *server;       /* NULL until main resolves $PSD_ADDR or the default */
    int64_t timeout_ms; /* each call's deadline */
    ps_tls_conf tls;    /* TLS of every call (the process default) */
    char *token_file;   /* --token-file */
    char token[PS_AUTH_TOKEN_MAX + 1]; /* what it holds (sent with every
                                          call), or "" */
};

extern struct global_cfg psctl_global;

/* The connection options every server command also takes after its name;
 * zero values mean "as psctl's own --server and --rpc-timeout say". */
struct conn_cfg {
    char *server;
    int64_t timeout_ms;
};

#define CONN_OPTS(type)                                                     \
    {"server", PS_OPT_STRING, offsetof(type, conn.server), NULL,            \
     "psd to talk to, HOST:PORT (default: $PSD_ADDR, else " DEFAULT_SERVER  \
     ")", 0, 0, NULL},                                                      \
    {"rpc-timeout", PS_OPT_DURATION_MS, offsetof(type, conn.timeout_ms),    \
     NULL, "deadline of each call to psd (default: 10s)", 1, 3600000, NULL, \
     "timeout"}

/* --coordinator and --rpc-timeout of a command that asks pscoord: type has
 * members coordinator and timeout_ms; timeout_help says what the deadline
 * bounds. */
#define COORD_OPTS(type, timeout_help)                                      \
    {"coordinator", PS_OPT_STRING, offsetof(type, coordinator), NULL,       \
     "pscoord to ask, HOST:PORT (default: $PSCOORD_ADDR, else "             \
     DEFAULT_COORDINATOR ")", 0, 0, NULL},                                  \
    {"rpc-timeout", PS_OPT_DURATION_MS, offsetof(type, timeout_ms), NULL,   \
     timeout_help, 1, 3600000, NULL, "timeout"}

/* A command with no options of its own: it still gets --help. */
extern const ps_opt no_opts[];

/* list, show, stats: the connection options only. */
struct conn_only_cfg {
    struct conn_cfg conn;
};

extern const ps_opt conn_opts[];

/* checkpoint, restore: the connection options and --step. */
struct step_cfg {
    struct conn_cfg conn;
    uint64_t step; /* 0: the server chooses */
    int row_dtype; /* restore: keep, f32, bf16, fp16 (row_dtype_choices' order) */
    int slot_dtype; /* restore: the same choices, for the optimizer slots */
};

/* -o/--output of the read commands (list, stats, status, top --once,
 * cluster validate): text for people, json for scripts (the fields are
 * listed in doc/psctl.md and kept stable). */
enum { OUTPUT_TEXT, OUTPUT_JSON };
extern const char *const output_formats[];
#define OUTPUT_OPT(type)                                                    \
    {"output", PS_OPT_ENUM, offsetof(type, output), "text",                 \
     "text (for people) or json (one object for scripts); -o for short",    \
     0, 0, output_formats}

/* list and stats: the connection options, --coordinator (ask every shard
 * of the job) and --output. */
struct fan_cfg {
    struct conn_cfg conn;
    char *coordinator;
    int output;
};

extern const ps_opt fan_opts[];

/* ---- psctl.c: parsing a command's arguments ---------------------------- */

/* Parses a command's own options. Returns -1 to go on, or the exit status
 * (after printing the command's help or its one-line error). */
int command_options(const struct command *cmd, const ps_opt *opts, void *cfg,
                    int argc, char **argv, int *first);

/* Parses a command's options wherever they stand among its positional
 * arguments, then checks that there are between min_pos and max_pos
 * positionals ("-o" is read as "--output" when the command has that
 * option). On success returns -1 with pos[0..] set (pointers into argv) and
 * *npos; otherwise the exit status, after the help or one line on stderr.
 * `what` names the positionals for "missing ...". */
int parse_command(const struct command *cmd, const ps_opt *opts, void *cfg,
                  int argc, char **argv, const char *what, int min_pos,
                  int max_pos, char **pos, int *npos);

/* ---- session.c: talking to psd (or pscoord) ---------------------------- */

/* One command's connection to one psd (or, for status, to pscoord). */
struct session {
    const struct command *cmd;
    const char *peer;   /* "psd" or "pscoord", for messages */
    const char *target; /* borrowed from the options */
    int timeout_ms;
    ps_rpc_client *client;
};

/* Makes the client for target ("--server" or "--coordinator", flag says
 * which, for the message); nothing is sent yet. Returns -1 to go on, or
 * the exit status after one line on stderr. */
int session_open_at(struct session *s, const struct command *cmd,
                    const char *peer, const char *flag, const char *target,
                    int timeout_ms);
/* session_open_at for psd: the command's options, else psctl's. */
int session_open(struct session *s, const struct command *cmd,
                 const struct conn_cfg *cc);
void session_close(struct session *s);
int probe_ms(const struct session *s);
/* The first contact: a health check with a short deadline. Returns -1 when
 * something answered, else EXIT_FAIL after "cannot reach". */
int session_probe(struct session *s);
/* session_open, then session_probe; the session is closed again unless
 * -1 (go on) is returned. */
int session_start(struct session *s, const struct command *cmd,
                  const struct conn_cfg *cc);
/* True when a failed first contact means nothing answered at the address. */
bool unreachable(const ps_rpc_status *st);
void report_unreachable(const struct session *s, ps_rpc_status *st);
void report_status(const struct session *s, ps_rpc_status *st);
/* After UNIMPLEMENTED for method: when the other daemon's service answers
 * at the address (pscoord's for a psd call, psd's for a pscoord call),
 * prints one line naming the mismatch and returns true (exit status 2);
 * false when it does not (report the status as it is). */
bool report_mismatch(const struct session *s, const char *method);
/* One unary call with the session's deadline. Returns 0 with *resp set
 * (free it with protobuf_c_message_free_unpacked), or EXIT_FAIL after the
 * one-line report of the status. */
int session_call(struct session *s, const char *method, const void *req,
                 const ProtobufCMessageDescriptor *desc, void **resp);
/* Parses options and positionals, opens the session and probes the server:
 * the start every server command shares. Returns -1 to go on (the session
 * is then open), or the exit status. */
int server_command(const struct command *cmd, const ps_opt *opts, void *cfg,
                   const struct conn_cfg *conn, int argc, char **argv,
                   const char *what, int min_pos, int max_pos, char **pos,
                   struct session *s);
/* A server command without positionals that is one unary call. Its
 * options are parsed into a zeroed struct conn_only_cfg, or a struct
 * step_cfg when step_at is not 0: then --step goes to the request's uint64
 * at that offset. The request is otherwise empty; print prints the answer
 * and returns the exit status. */
struct one_call {
    const ps_opt *opts;
    const char *method;
    const ProtobufCMessageDescriptor *req_desc;
    size_t step_at;
    const ProtobufCMessageDescriptor *resp_desc;
    int (*print)(const void *resp);
    size_t row_dtype_at; /* where step_cfg.row_dtype goes as a DType; 0: nowhere */
    size_t slot_dtype_at; /* the same for step_cfg.slot_dtype */
};

/* Parses the options, opens and probes the session, makes the call, prints
 * the answer, closes. Returns the exit status. */
int run_one_call(const struct command *self, int argc, char **argv,
                 const struct one_call *call);

/* One psd that a fanned-out command asks: shard index (UINT32_MAX when
 * named by --server rather than by the coordinator) and address. */
struct shard {
    uint32_t index;
    char address[256];
};

/* The answers of one call made to each psd that cfg names: the one psd of
 * --server, or with --coordinator every ps task of the job (asked of
 * pscoord, in shard order). Returns -1 with resps[0..*n) (free each with
 * protobuf_c_message_free_unpacked, then the arrays), *shards and, for a
 * job, job_id filled; otherwise the exit status after one line on stderr
 * (nothing to free). */
int fan_call(const struct command *cmd, const struct fan_cfg *cfg,
             const char *method, const void *req,
             const ProtobufCMessageDescriptor *resp_desc, void ***resps,
             struct shard **shards, size_t *n, char *job_id, size_t joblen);
/* Frees what fan_call returned. */
void fan_free(void **resps, struct shard *shards, size_t n);
/* A command that is one call fanned out, as a row: method with an empty
 * request of req_desc. json builds the document of --output json (printed
 * by pbjson_print); print writes the text, job_wide with --coordinator,
 * and returns the exit status. */
struct fan_cmd {
    const char *method;
    const ProtobufCMessageDescriptor *req_desc, *resp_desc;
    json_t *(*json)(void **resps, const struct shard *sh, size_t n, const char *job);
    int (*print)(void **resps, const struct shard *sh, size_t n, const char *job,
                 bool job_wide);
};
/* Parses fan_opts, makes the call with fan_call, shows the answers, frees.
 * Returns the exit status. */
int run_fan(const struct command *self, int argc, char **argv, const struct fan_cmd *f);
/* The shard's identity in JSON: "shard" (null for --server) and "server". */
void shard_json(json_t *obj, const struct shard *sh);

/* ---- pbjson.c: -o json -------------------------------------------------- */

/* m as a JSON object, a key per field by its name in the .proto (NULL when
 * out of memory). */
json_t *pbjson_message(const ProtobufCMessage *m);
/* The totals over a list of objects of the same keys: integers and
 * doubles summed (those named in lowest: the smallest), booleans or-ed, a
 * string kept when all agree, else "mixed"; lists and objects left out. */
json_t *pbjson_total(const json_t *objects, const char *const *lowest);
/* Prints j (indented, in key order) and a newline on stdout and drops it.
 * Returns EXIT_OK, or EXIT_FAIL when j is NULL (out of memory). */
int pbjson_print(const struct command *cmd, json_t *j);

/* ---- cmd_cluster.c: what status and top share ------------------------- */

/* The cluster state as JSON for status and top --once: ClusterState's
 * fields, each task with "state" (alive, dead, unseen, unknown) and, for
 * a worker or chief that reported a step, "lag" behind the global step. */
json_t *cluster_json(const Ps__V1__ClusterState *c);
/* "chief", "worker", "ps", "evaluator"; "unknown" for any other value. */
const char *role_label(Ps__V1__Role r);
/* The coordinator to ask: the command's --coordinator (flag, may be NULL),
 * else $PSCOORD_ADDR, else DEFAULT_COORDINATOR. */
const char *coordinator_target(const char *flag);

/* ---- format.c ---------------------------------------------------------- */

/* "512 B", "784.0 KiB", "2.3 MiB": bytes as an operator reads them. */
const char *human_bytes(uint64_t n, char *buf, size_t len);
/* "42.1 s", "3m 07s", "5h 03m 07s", "2d 05h 03m". */
const char *human_duration(double seconds, char *buf, size_t len);
/* "(784, 256)"; "(9 dimensions)" beyond what a tensor holds. */
const char *shape_text(const int64_t *shape, size_t n, char *buf, size_t len);
/* The names psctl create takes: "sgd", "nesterov"... */
const char *optimizer_label(const Ps__V1__Optimizer *o);
/* "default", "async", "sync(4)", "bounded(2)". */
const char *consistency_label(const Ps__V1__VariableSpec *sp, char *buf,
                              size_t len);

#endif
