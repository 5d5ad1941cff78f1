/*
 * rpc_local.h - the server's unix socket, accepted by us rather than by
 * gRPC, so that each connection's peer is known (issue 13 a). Internal to
 * the RPC module: only rpc_server.c includes it.
 *
 * gRPC's own unix listener tells a call nothing about who connected. Here
 * a thread of ours listens on the socket, accepts each connection, reads
 * the connecting process's credentials from the kernel (SO_PEERCRED: pid,
 * uid, gid as of connect()) and the process's start time (/proc/PID/stat,
 * so that a pid reused later is not taken for the same process), and hands
 * the connected socket to gRPC (grpc_server_add_channel_from_fd). gRPC
 * names such a connection "fd:N" (grpc_call_get_peer), so a call is mapped
 * back to its connection's credentials by that number; an entry is trusted
 * only while descriptor N is still the same socket (its inode), since
 * descriptor numbers are reused once gRPC closes a connection.
 *
 * Which uids may connect is decided by the socket file's mode and its
 * directory's (psd creates it under its umask: 0755 & ~umask, so only its
 * own user, and root, may connect by default; systemd's UMask=0077 keeps it
 * so): connections of any uid that gets through are accepted and their uid
 * is recorded for the layers above (ps_rpc_call_peer_cred).
 *
 * At most max_conns connections are open at once: one beyond is accepted
 * and closed at once (counted). A connection is handed to gRPC only once
 * its HTTP/2 preface has come; one that has not sent it within
 * handshake_ms is closed (counted), as gRPC's handshake timeout does on
 * TCP, which it does not apply to a connection given by descriptor. A descriptor limit reached (EMFILE) is
 * survived, unlike gRPC 1.51's own listener (grpc/grpc#20418): a spare
 * descriptor is let go to accept and close the connection, and accepting
 * goes on.
 *
 * Threads and lifetime: rpc_local_listen binds (before the server starts),
 * rpc_local_start starts the accepting thread (after grpc_server_start),
 * rpc_local_stop stops it, closes the listener and removes the socket file
 * (as the server shuts down), rpc_local_free frees it once the gRPC server
 * is gone. rpc_local_lookup may be called from any thread until then.
 */
#ifndef PS_RPC_LOCAL_H
#define PS_RPC_LOCAL_H

#include "common/rpc.h"

#include <grpc/grpc.h>
#include <stdint.h>

typedef struct rpc_local rpc_local;

/* Binds and listens on the unix socket at path (a stale socket file there
 * is replaced). Returns 0, -errno (-EADDRINUSE when psd cannot bind), or
 * -ENAMETOOLONG. */
int rpc_local_listen(const char *path, int max_conns, int handshake_ms, rpc_local **out);

/* Starts accepting into server. Returns 0 or -errno. */
int rpc_local_start(rpc_local *l, grpc_server *server);

/* Stops accepting and removes the socket file; lookups still answer (calls
 * in flight drain after it). Idempotent; NULL: nothing. */
void rpc_local_stop(rpc_local *l);
/* Stops if needed and frees, once no call can look up any more. */
void rpc_local_free(rpc_local *l);

/* The credentials of the connection gRPC calls peer ("fd:N"): 0 with *out,
 * or -ENOENT when peer is not one of ours (a TCP call, or a connection that
 * has since closed). */
int rpc_local_lookup(rpc_local *l, const char *peer, ps_rpc_peer_cred *out);

/* Connections open now, and refused so far (over the cap, or at the
 * descriptor limit). */
int rpc_local_open(rpc_local *l);
uint64_t rpc_local_refused(const rpc_local *l);

#endif
