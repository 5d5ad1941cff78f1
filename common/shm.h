/*
 * shm.h - shared memory between a client and a psd on the same host.
 *
 * A worker beside its psd moves each step's gradient and values through
 * shared memory instead of a socket: the gradient is written once (by the
 * model) and read once (by psd's optimizer), the values are written once
 * (by psd) and read in place (by the model). gRPC still carries the call,
 * but a call names its tensors by reference (ps.v1.ShmRef) and is a few
 * hundred bytes.
 *
 * The memory is a sealed memfd (it cannot shrink under psd's mapping, and it
 * vanishes with the last process that maps it, so nothing leaks into
 * /dev/shm when a worker dies). Its name is
 * "memfd:PID:FD:ps-<16 hex digits>": psd opens /proc/PID/fd/FD, and maps it
 * only if that is a memfd named ps-<the same digits> with its size sealed.
 * The random digits make a name that only the creator (or whoever may read
 * its /proc entries anyway) can know. psd takes a reference only over its
 * unix socket and only from process PID itself (SO_PEERCRED: server/
 * shmmap.h). Where it will not or cannot (TCP, another host, another pid
 * namespace, another user), it answers FAILED_PRECONDITION or
 * PERMISSION_DENIED "shared memory ..." and the client goes on without.
 *
 * Threads and lifetime: a ps_shm is immutable once made; any thread may
 * use its memory under the caller's own rules.
 */
#ifndef PS_SHM_H
#define PS_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PS_SHM_NAME_MAX 64 /* including the NUL */

typedef struct ps_shm ps_shm;

/* Creates, sizes (rounded up to pages), seals and maps a region of at least
 * bytes, zero-filled. Returns 0, or -errno. */
int ps_shm_create(size_t bytes, ps_shm **out);
void ps_shm_destroy(ps_shm *s);
void *ps_shm_base(const ps_shm *s);
size_t ps_shm_size(const ps_shm *s);
const char *ps_shm_name(const ps_shm *s);
/* Whether [p, p + len) lies inside s; *off is then its offset. */
bool ps_shm_contains(const ps_shm *s, const void *p, size_t len, uint64_t *off);

/* Parses a region name into the /proc path to open and the memfd name it
 * must have. Returns 0, or -EINVAL for a name not of the form above. */
int ps_shm_parse_name(const char *name, char *path, size_t pathlen,
                      char *memfd_name, size_t memfd_len, int *pid);

/* Whether a gRPC target is a server on this host: a unix socket, a
 * loopback address, or a name or address of one of this host's interfaces
 * ("10.0.0.5:7070" on the host that has 10.0.0.5). Resolves names (may
 * block on DNS). Where it is, a client may try shared memory with it. */
bool ps_shm_target_is_local(const char *target);

#endif
