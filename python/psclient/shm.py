"""Shared memory with a psd on this host (ps.v1.ShmRef, common/shm.h): a
sealed memfd named "ps-<16 hex digits>" that psd maps through
/proc/PID/fd/FD, so that a push names its gradient by reference and psd
writes the values back into the same region; the call is a few hundred
bytes whatever the tensors' size.

The client uses it only when asked (Client(shm=True)) and only with a psd
reached over its unix socket: "unix:PATH", a TCP address whose psd
advertises its socket in Stats with this host's id (psd opens one in its
data directory by default), or with a coordinator each shard of the same
host id, whose socket it may connect to (local_route, as workerd); where
psd refuses ("shared memory ..."), the client warns once and sends inline
from then on.

Threads and lifetime: a Region belongs to one shard connection and is used
by one call at a time; it lives until close() (or the process's exit).
"""
from __future__ import annotations

import fcntl
import mmap
import os
import stat

import numpy as np


def host_id() -> str:
    """This host's id as common/hostid.h defines it: PS_HOST_ID if set, else
    the kernel's boot id and this process's pid namespace ("" if unknown)."""
    env = os.environ.get("PS_HOST_ID", "")
    if env:
        return env
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return "%s:%d" % (boot, os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def local_route(local_address: str, their_host_id: str) -> str:
    """Why a psd with this unix socket and host id (pscoord's TaskInfo) is
    not to be reached through that socket, or "" when it is: the same host
    id, and a socket at the path this process may connect to."""
    mine = host_id()
    if not mine or mine != their_host_id:
        return "another host" if their_host_id else "its host is not known"
    if not local_address.startswith("unix:/"):
        return "it has no local socket (psd --local-socket)"
    path = local_address[5:]
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return "%s is not a socket" % local_address
    except OSError as e:
        return "%s: %s" % (local_address, e.strerror)
    if not os.access(path, os.W_OK):
        return "%s: not writable" % local_address
    return ""


class Region:
    """One sealed memfd, mapped, with a float32 view of all of it."""

    def __init__(self, nbytes: int) -> None:
        size = max(mmap.PAGESIZE, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
        tag = os.urandom(8).hex()
        self.fd = os.memfd_create("ps-" + tag, os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size
        self.floats = np.frombuffer(self.mm, dtype="<f4")
        self.name = "memfd:%d:%d:ps-%s" % (os.getpid(), self.fd, tag)

    def close(self) -> None:
        if self.fd >= 0:
            del self.floats
            try:
                self.mm.close()
            except BufferError:
                pass  # a caller still holds a view; the mapping goes at exit
            os.close(self.fd)
            self.fd = -1


def is_local_socket(address: str) -> bool:
    """Whether a gRPC target is a unix socket (the only way to psd that the
    client uses shared memory on)."""
    return address.startswith("unix:") or address.startswith("unix-abstract:")
