/*
 * shmmap.h - psd's side of shared memory (common/shm.h): the regions of
 * co-located clients, mapped on first sight and kept while in use.
 *
 * A request names a region and a range in it (ps.v1.ShmRef); psd maps the
 * region once, by its name, and reads gradients from it and writes values
 * into it in place. A name is unique for the life of its region (it carries
 * 64 random bits), so a cached mapping never goes stale; one unused for a
 * minute is unmapped (its client has likely gone, and the memory goes with
 * the last mapping).
 *
 * Who may name a region (issue 13 a): only the process whose memory it is,
 * over psd's unix socket, where the kernel tells psd the caller's pid
 * (SO_PEERCRED, ps_rpc_call_peer_cred). A reference over TCP is refused
 * (FAILED_PRECONDITION), and one naming another process's pid is
 * PERMISSION_DENIED. A mapping is kept under its owner (pid and start
 * time) as well as its name, so a name is never resolved for anyone else.
 * No answer quotes anything of what /proc/PID/fd/FD points at.
 *
 * Threads: any thread. A caller resolves references between
 * psd_shmmap_enter and psd_shmmap_leave, and may use the pointers until it
 * leaves; psd_shmmap_sweep unmaps only while no caller is inside.
 */
#ifndef PSD_SHMMAP_H
#define PSD_SHMMAP_H

#include "common/rpc.h"
#include "common/shm.h"
#include "common/wire.h"

#include <stddef.h>
#include <stdint.h>

typedef struct psd_shmmap psd_shmmap;

/* A reference as a request gave it (common/wire.h). */
typedef ps_wire_shm_ref psd_shm_ref;

int psd_shmmap_create(psd_shmmap **out);
void psd_shmmap_destroy(psd_shmmap *m);

void psd_shmmap_enter(psd_shmmap *m);
void psd_shmmap_leave(psd_shmmap *m);

/* Resolves ref, sent by the process who (NULL: a call not over the unix
 * socket), to memory: 0 with *p, or a ps_rpc_code (INVALID_ARGUMENT for a
 * malformed name or range, FAILED_PRECONDITION when the call came over TCP
 * or the region cannot be mapped, PERMISSION_DENIED for a region of
 * another process, RESOURCE_EXHAUSTED past the region limit) with one line
 * in err that begins "shared memory". */
int psd_shmmap_get(psd_shmmap *m, const ps_rpc_peer_cred *who,
                   const psd_shm_ref *ref, void **p, char *err, size_t errlen);

/* Unmaps the regions unused for idle_ms, unless a caller is between enter
 * and leave (then nothing: it never waits); returns how many are mapped. */
size_t psd_shmmap_sweep(psd_shmmap *m, int64_t idle_ms);

/* Regions mapped now. */
size_t psd_shmmap_count(psd_shmmap *m);

#endif
