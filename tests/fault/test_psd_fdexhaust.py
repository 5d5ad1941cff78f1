"""psd out of file descriptors (issue 13 d), against a real psd under a
256-descriptor limit (prlimit):

- 300 idle TCP connections: gRPC 1.51's listener stops accepting for good
  once accept() fails with EMFILE (grpc/grpc#20418). Before the fix psd went
  on looking healthy and no new client ever connected again. Now its
  self-probe finds the listener dead and psd exits 1 with one line, within
  a bounded time, having flushed what it acknowledged; a restarted psd
  (what systemd's Restart= does) serves a new client, with the data.
- 300 idle connections on the unix socket, which psd accepts itself: the
  ones beyond --max-connections are closed at once and counted in Stats,
  and afterwards a new client is served by the same psd.
- Idle sockets that never speak HTTP/2 are closed after
  --handshake-timeout, on TCP and on the unix socket alike.
"""
import os
import resource
import socket
import sys
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import pstest  # noqa: E402

LIMIT = 256
IDLE = 300
LIMITED = ["prlimit", "--nofile=%d:%d" % (LIMIT, LIMIT), "--"]


class Psd(pstest.Daemon):
    """A psd whose stderr is kept, to read its last line."""

    def __init__(self, data, *args):
        self.errpath = os.path.join(os.path.dirname(data), "psd-%d.err" % time.monotonic_ns())
        self.err = open(self.errpath, "w")
        argv = LIMITED + [pstest.psd_path(), "--data-dir", data, "--listen", "127.0.0.1:0",
                          "--log-level", "warn"] + list(args)
        super().__init__(argv, stderr=self.err)

    def stderr(self):
        self.err.flush()
        return open(self.errpath).read()


def open_idle(connect, n):
    """n sockets that connect and then say nothing; those that could."""
    socks = []
    for _ in range(n):
        s = connect()
        if s is None:
            break
        socks.append(s)
    return socks


def tcp_to(port):
    def connect():
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            return None
    return connect


def unix_to(path):
    def connect():
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
            return None
    return connect


def served(pb, pbg, target, timeout=5):
    """Whether a fresh client at target is answered (Stats)."""
    ch = grpc.insecure_channel(target, options=pstest.CHANNEL_OPTIONS +
                               [("grpc.use_local_subchannel_pool", 1)])
    try:
        return pbg.ParameterServerStub(ch).Stats(pb.StatsRequest(), timeout=timeout)
    except grpc.RpcError:
        return None
    finally:
        ch.close()


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * IDLE:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * IDLE), hard))
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-fdexhaust")
    tmp = pstest.tmpdir()
    data = os.path.join(tmp, "data")
    sock = os.path.join(tmp, "psd.sock")
    flags = ["--local-socket", sock, "--max-connections", "100",
             "--handshake-timeout", "2s", "--probe-interval", "1s"]

    # The unix socket: capped, and still accepting after the flood.
    d = Psd(data, *flags)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "w", (8,), lr=1.0)),
                        timeout=5)
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", np.arange(8))]), timeout=5)
    t0 = time.monotonic()
    flood = open_idle(unix_to(sock), IDLE)
    time.sleep(0.5)
    st = served(pb, pbg, d.address)
    r.check(st is not None and st.connections_refused >= IDLE - 100 and
            st.local_connections <= 100 and 0 < st.open_files < LIMIT and
            st.max_open_files == LIMIT,
            "%d idle unix-socket connections: psd keeps at most 100 and closes the "
            "rest (Stats: %s refused, %s open, %s of %s descriptors)"
            % (len(flood), st and st.connections_refused, st and st.local_connections,
               st and st.open_files, st and st.max_open_files))
    for s in flood:
        s.close()
    # psd sees the closes on its acceptor's next turn; until then the cap
    # may still turn a newcomer away, as a client's retry would meet.
    deadline = time.monotonic() + 10
    st = served(pb, pbg, "unix:" + sock)
    while st is None and time.monotonic() < deadline:
        time.sleep(0.2)
        st = served(pb, pbg, "unix:" + sock)
    r.check(st is not None and d.proc.poll() is None,
            "afterwards a new client on the unix socket is served by the same psd "
            "(%.1f s)" % (time.monotonic() - t0))

    # Silent unix-socket connections time out like TCP ones: 100 of them
    # held every slot of --max-connections until the idle timeout (15 min)
    # before; now they are closed after --handshake-timeout 2s and a new
    # client is served.
    quiet = open_idle(unix_to(sock), 100)
    time.sleep(0.5)
    held = served(pb, pbg, d.address).local_connections
    time.sleep(3)
    after = served(pb, pbg, d.address).local_connections
    st = served(pb, pbg, "unix:" + sock)
    r.check(held >= 90 and after <= 5 and st is not None,
            "100 silent unix-socket connections are closed after --handshake-timeout "
            "2s (open %d -> %d) and a new client is served" % (held, after))
    for s in quiet:
        s.close()

    # Idle TCP sockets that never speak are closed after the handshake
    # timeout: psd's descriptors come back.
    few = open_idle(tcp_to(d.port), 50)
    time.sleep(0.5)
    held = served(pb, pbg, d.address).open_files
    time.sleep(3)
    after = served(pb, pbg, d.address).open_files
    r.check(held - after >= 40,
            "50 silent TCP connections are closed after --handshake-timeout 2s "
            "(descriptors %d -> %d)" % (held, after))
    for s in few:
        s.close()

    # 300 idle TCP connections under a 256-descriptor limit: gRPC's listener
    # dies; psd must notice and exit 1 with one line, promptly.
    # The flood goes at once: then psd has descriptors again, its probe
    # connects, and only the missing answer shows the listener is dead.
    t0 = time.monotonic()
    flood = open_idle(tcp_to(d.port), IDLE)
    time.sleep(0.3)
    for s in flood:
        s.close()
    status = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and status is None:
        status = d.proc.poll()
        time.sleep(0.2)
    took = time.monotonic() - t0
    if status is None:
        # psd is still up: it must then still serve a new client.
        st = served(pb, pbg, d.address)
        r.check(st is not None, "after %d idle TCP connections under a %d-descriptor "
                "limit psd stays up and serves a new client (%s)"
                % (len(flood), LIMIT, "served" if st else "not served: its listener "
                   "is dead and psd did not notice"))
        d.kill()
    else:
        err = d.stderr().strip().splitlines()
        line = [ln for ln in err if "stopped accepting" in ln]
        r.check(status == 1 and len(line) == 1 and line[0].startswith("psd: ") and
                "not answered" in line[0] and took < 30,
                "after %d idle TCP connections under a %d-descriptor limit psd exits "
                "1 in %.1f s with one line (%r)" % (len(flood), LIMIT, took,
                                                    line[0] if line else err[-1:]))
        # What systemd does (Restart=on-failure): start it again.
        d2 = Psd(data, *flags)
        st = served(pb, pbg, d2.address)
        v = pbg.ParameterServerStub(pstest.channel(d2.address)).Pull(
            pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=5).values[0]
        r.check(st is not None and v.version == 1 and
                np.array_equal(pstest.value(v), -np.arange(8, dtype=np.float32)),
                "a restarted psd serves a new client, the pushed value intact "
                "(version %d)" % v.version)
        r.check(d2.stop() == 0, "the restarted psd stops cleanly")
    ch.close()
    r.finish()


if __name__ == "__main__":
    main()
