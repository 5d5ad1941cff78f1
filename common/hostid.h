/*
 * hostid.h - which tasks of a job share a host closely enough for shared
 * memory, and the unix socket that reaches a psd there.
 *
 * A psd started with --local-socket tells pscoord, at registration, its
 * socket ("unix:/absolute/path") and its host id; pscoord publishes both in
 * the cluster state (TaskInfo.local_address, host_id). A worker whose own
 * host id equals a shard's, and that may connect to the shard's socket,
 * reaches that shard through the socket and moves its tensors through
 * shared memory (shm.h); every other shard over TCP as before.
 *
 * The host id is "<boot_id>:<pid namespace inode>": the kernel's boot id
 * (/proc/sys/kernel/random/boot_id: the same for every process of one boot
 * of one kernel, containers included, and different on every other host or
 * boot) and the inode of /proc/self/ns/pid. The pid namespace is the part
 * shared memory needs: psd opens the caller's /proc/PID/fd/FD and takes a
 * reference only from the pid the kernel names as the caller, so a worker
 * and a psd in different pid namespaces (separate containers, as Docker and
 * Kubernetes make them by default) could not share memory even if they
 * shared the socket: their ids differ and they use TCP. The mount
 * namespace is deliberately not part of it: systemd's sandboxing
 * (PrivateTmp=, ProtectSystem=) gives every unit its own, while psd's
 * socket under /run stays visible to all of them. Where the filesystems
 * differ, the second check decides: the socket path must name, in the
 * worker's own filesystem, a socket it may connect to (write permission);
 * otherwise TCP. The environment variable PS_HOST_ID, when set and not
 * empty, replaces the computed id (tests; or to keep tasks apart, or put
 * them together, by hand).
 *
 * Threads and lifetime: the functions are pure apart from reading /proc and
 * the environment, and may be called from any thread.
 */
#ifndef PS_HOSTID_H
#define PS_HOSTID_H

#include <stdbool.h>
#include <stddef.h>

#define PS_HOST_ID_MAX 128 /* including the NUL; longer ids are refused */

/* This process's host id into buf (len >= PS_HOST_ID_MAX). Returns 0, or
 * -errno with buf "" when neither /proc file can be read (such a task
 * matches no other). */
int ps_host_id(char *buf, size_t len);

/* "unix:" and the absolute path of the socket file at path (relative paths
 * are taken from the current directory) into out. Returns 0, -ENAMETOOLONG,
 * or -errno of getcwd. */
int ps_host_local_address(const char *path, char *out, size_t len);

/* Whether to reach a psd through its unix socket: mine and theirs are equal
 * and not empty, and local_address is "unix:/PATH" naming a socket this
 * process may connect to. When not, why says which check failed ("another
 * host", "no local socket", "unix:/p: No such file or directory"). */
bool ps_host_use_local(const char *mine, const char *theirs,
                       const char *local_address, char *why, size_t whylen);

#endif
