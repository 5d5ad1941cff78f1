/*
 * auth.h - tokens with roles: who may call which method of psd and pscoord.
 *
 * A server started with `--tokens FILE` admits a call only when its initial
 * metadata carries `authorization: Bearer TOKEN` with a token of the file,
 * and only to the methods that token's role may call (the table below,
 * ps_auth_method_roles). The check runs in gRPC's server auth metadata
 * processor (grpc_server_credentials_set_auth_metadata_processor), before
 * any handler: in gRPC 1.51 the processor runs for plaintext (insecure)
 * server credentials too, and sees the ":path" pseudo-header, so it both
 * authenticates and authorizes. A call without a valid token ends
 * UNAUTHENTICATED, a role that lacks the method PERMISSION_DENIED naming
 * the role and the method; neither message ever quotes the token. The
 * processor adds nothing to the auth context it is given: in gRPC 1.51
 * that context is the connection's, shared by all its calls (found by
 * experiment: properties added per call pile up on it). A handler that
 * needs the caller's role (pscoord's Place) asks ps_rpc_call_role (rpc.h),
 * which looks the call's authorization header up again.
 *
 * Roles (each includes nothing of another but operator, which may call
 * everything the other two may):
 *   reader    Stats, ListVariables, GetCluster, WatchCluster, Health
 *   worker    CreateVariable, Pull, Push, RegisterTask, Heartbeat,
 *             ReportMetrics, Place (pscoord asks a worker for its task
 *             secret too), GetCluster, WatchCluster, Health
 *   operator  all of the above, and Checkpoint, Restore, DeleteVariable,
 *             SetSyncWorkers
 * A method not in the table is refused to every role.
 *
 * The token file: one `ROLE TOKEN` or `ROLE sha256:HEX` per line (HEX the
 * 64 hex digits of the token's SHA-256), blank lines, and comments from a
 * `#` that starts a word (a token may hold a `#`).
 * Tokens are 16 to 512 printable ASCII characters without spaces. As ssh
 * treats private keys, a file with plain tokens that a group or others may
 * read is refused, and so is any token file they may write. Presented tokens are
 * hashed and compared with every entry in constant time.
 *
 * The processor refuses a call before its message is read (an
 * unauthenticated 1 GiB push costs its headers). common/rpc_server.c checks
 * every call again before its handler (ps_auth_decide): gRPC 1.51 does not
 * run the processor for a channel added from a file descriptor
 * (grpc_server_add_channel_from_fd; found by experiment, its calls arrive
 * unchecked), so for those that second check is the only one.
 *
 * Trusted transports: a connection whose peer was checked otherwise (psd's
 * unix socket, the peer's uid by SO_PEERCRED: the same uid as psd, or root)
 * may give a call without a token an implicit role (worker is the intended
 * one); a call that presents a token is checked as anywhere else. For a
 * channel added from a file descriptor (peer "fd:N") that role is
 * ps_rpc_server_opts.fd_channel_role (rpc.h); for credentials of a listener
 * of its own, ps_auth_attach's implicit_role.
 *
 * Threads and lifetime: a ps_auth is created before the server that uses it
 * and destroyed after that server; lookups (on gRPC's threads) and
 * ps_auth_reload (the control loop, on SIGHUP) may run at once: the table is
 * swapped under a lock. The other functions are pure.
 */
#ifndef PS_AUTH_H
#define PS_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Roles, as bits, so that a method's entry is the set of roles that may
 * call it. */
enum ps_auth_role {
    PS_AUTH_NONE = 0,
    PS_AUTH_READER = 1,
    PS_AUTH_WORKER = 2,
    PS_AUTH_OPERATOR = 4,
};

/* Bounds of a token's length, in characters. */
#define PS_AUTH_TOKEN_MIN 16
#define PS_AUTH_TOKEN_MAX 512

/* The roles that may call a method ("/ps.v1.ParameterServer/Push"): a set
 * of enum ps_auth_role bits, 0 for a method not in the table. */
unsigned ps_auth_method_roles(const char *path);

/* "reader", "worker", "operator", or "none". */
const char *ps_auth_role_name(int role);

/* The roles of a set as text, "worker, operator", into out. */
void ps_auth_roles_text(unsigned roles, char *out, size_t len);

typedef struct ps_auth ps_auth;

/* Reads a token file. Returns 0; PS_EPARSE with err "FILE:LINE: what is
 * wrong" for a bad line (or "FILE: no tokens"); PS_EINVAL_ARG when a group
 * or others may write the file, or read it and it holds plain tokens;
 * -errno when it cannot be
 * read (err names the file). */
int ps_auth_create(const char *path, ps_auth **out, char *err, size_t errlen);

/* Reads the file again and swaps the new table in if it loads; on failure
 * the old table stays and err says why (as ps_auth_create). */
int ps_auth_reload(ps_auth *a, char *err, size_t errlen);

/* NULL is a no-op. Only once no server uses it. */
void ps_auth_destroy(ps_auth *a);

/* Calls the processor refused with code (PS_RPC_UNAUTHENTICATED or
 * PS_RPC_PERMISSION_DENIED; 0 for any other): they never reach a handler,
 * and ps_rpc_server_failures adds them to its own counts. */
uint64_t ps_auth_refused(const ps_auth *a, int code);

/* How many tokens the table holds; the file it was read from. */
size_t ps_auth_count(const ps_auth *a);
const char *ps_auth_path(const ps_auth *a);

/* The role of a presented token (len bytes), PS_AUTH_NONE when it is none
 * of the table's. Constant time in the token's content. */
int ps_auth_lookup(const ps_auth *a, const char *token, size_t len);

/* The decision for one call: the method path, the value of its
 * authorization header (NULL: none) and the role a trusted transport gives
 * a call without a token (PS_AUTH_NONE: none). Returns 0 with *role set, or
 * the status code (PS_RPC_UNAUTHENTICATED, PS_RPC_PERMISSION_DENIED) with a
 * message in msg that names the method and role but never the token. */
int ps_auth_decide(const ps_auth *a, const char *path, const char *authz,
                   size_t authz_len, int implicit_role, int *role, char *msg,
                   size_t msglen);

/* Makes creds (a grpc_server_credentials *) check every call against a
 * (kept, not owned): the processor described above. implicit_role is as in
 * ps_auth_decide. Call before the credentials are used to add a port. */
struct grpc_server_credentials;
void ps_auth_attach(ps_auth *a, struct grpc_server_credentials *creds,
                    int implicit_role);

/* A daemon's --tokens: *out the table of path, or NULL when path is NULL
 * or "" (open: then, for a listen address that is not loopback, one warning
 * line naming it). Logs how many tokens were loaded. Returns 0, or as
 * ps_auth_create with err set. */
int ps_auth_server_setup(const char *path, const char *listen, ps_auth **out,
                         char *err, size_t errlen);

/* A SIGHUP reload (ps_proc_loop_on_hup's fn; ctx a ps_auth *, NULL: no
 * tokens): reads the file again and logs the outcome in one line. */
void ps_auth_reload_logged(void *ctx);

/* ---- Client side -------------------------------------------------------- */

/* Reads the token a client sends from a file: its first line that is not
 * blank or a comment, either the token alone or `ROLE TOKEN` as in a
 * server's file. Returns 0 with the token in out; PS_EINVAL_ARG when a
 * group or others may read or write the file; PS_EPARSE, or -errno, with
 * err naming the file (and line). */
int ps_auth_read_token(const char *path, char *out, size_t outlen, char *err,
                       size_t errlen);

/* True for an address only this host reaches: 127.0.0.0/8, [::1],
 * localhost, unix:PATH. For the warning a server logs when it listens
 * elsewhere without tokens. */
bool ps_auth_is_loopback(const char *listen);

/* --tokens, into a char * FIELD of a server's config: none by default,
 * open as before tokens existed, with a warning when the address is not
 * loopback. */
#define PS_TOKENS_OPT(TYPE, FIELD)                                                         \
    {"tokens", PS_OPT_STRING, offsetof(TYPE, FIELD), NULL,                                 \
     "file of 'ROLE TOKEN' lines (roles reader, worker, operator): every call then needs " \
     "a token whose role may call its method; reloaded on SIGHUP; default: none, any "     \
     "caller may call anything", 0, 0, NULL}

#endif
