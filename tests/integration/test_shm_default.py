"""Shared memory by default on one host, with no coordinator and no flag:
psd opens a unix socket in its data directory, advertises it in Stats with
its host id, and a worker given psd's plain TCP address switches to it. All
real processes on 127.0.0.1:0 in temporary directories:

  stats      a psd started with no --local-socket: Stats.local_address is
             "unix:" + <data dir>/psd.sock (a socket file there), host_id
             this host's boot id and pid namespace, read here from /proc;
  switch     workerd --ps 127.0.0.1:PORT: one line says ps[0] is reached
             through its unix socket, the summary has shm_shards 1, and
             psd's Stats shm_bytes > 0 (the tensors went through shared
             memory, which psd takes over its unix socket only);
  tcp        the same worker with another PS_HOST_ID: "over TCP (another
             host)", shm_shards 0, shm_bytes unchanged; both runs learn
             (test accuracy > 0.75);
  off        psd --local-socket off: Stats advertises no socket, no
             psd.sock in the data directory, the worker goes over TCP;
  file       a regular file where the socket would go: psd starts, serves
             TCP alone and advertises no socket;
  python     psclient.Client(["127.0.0.1:PORT"], shm=True) reaches the
             socket (Client.addresses) and pushes through shared memory;
             with another PS_HOST_ID it stays on TCP.

Prints ok/FAIL per check and "shm-default: N passed, N failed".
"""
import os
import signal
import stat
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import pyenv  # noqa: E402

pyenv.reexec()

import pstest  # noqa: E402

pb = pbg = None
r = pstest.Results("shm-default")


class Psd:
    def __init__(self, *args):
        self.data = os.path.join(pstest.tmpdir("shm-default-"), "data")
        self.d = pstest.start_psd(self.data, *args)
        self.ch = pstest.channel(self.d.address)
        self.stub = pbg.ParameterServerStub(self.ch)

    def stats(self):
        return self.stub.Stats(pb.StatsRequest(), timeout=5)

    def train(self, env=None):
        """One worker, 20000 examples: (exit status, JSON summary, stderr)."""
        return pstest.run_workerd(["--ps", self.d.address, "--epochs", "1",
                                   "--limit", "20000", "--batch", "64", "--json",
                                   "--progress", "0", "--log-level", "info"], env)

    def stop(self):
        self.ch.close()
        self.d.stop()


def route_lines(err):
    return [ln for ln in err.splitlines() if "ps[0]:" in ln]


def check_default(p):
    sock = os.path.join(os.path.abspath(p.data), "psd.sock")
    st = p.stats()
    r.check(st.local_address == "unix:" + sock and
            stat.S_ISSOCK(os.stat(sock).st_mode),
            "stats: local_address is the socket in the data dir (%r)" % st.local_address)
    r.check(st.host_id == pstest.host_id_oracle(), "stats: host_id is boot id:pid "
            "namespace (%r)" % st.host_id)
    rc, s, err = p.train()
    lines = route_lines(err)
    after = p.stats().shm_bytes
    r.check(rc == 0 and s is not None, "switch: the worker trains (exit %d)" % rc)
    r.check(len(lines) == 1 and "through its unix socket unix:" + sock in lines[0],
            "switch: --ps %s goes through the unix socket (%s)" % (p.d.address, lines))
    r.check(s is not None and s["shm_shards"] == 1 and after > 0,
            "switch: shared memory (shm_shards %s, Stats shm_bytes %d)"
            % (s and s["shm_shards"], after))
    rc, t, err = p.train(env={"PS_HOST_ID": "another-host"})
    lines = route_lines(err)
    r.check(rc == 0 and t is not None and t["shm_shards"] == 0 and
            p.stats().shm_bytes == after and len(lines) == 1 and
            "over TCP (another host)" in lines[0],
            "tcp: another host id goes over TCP (%s)" % lines)
    if s is not None and t is not None:
        # The second run goes on from the first's parameters: both learn.
        r.check(s["test_accuracy"] > 0.75 and t["test_accuracy"] > 0.75,
                "tcp: test accuracy %.4f, through shared memory %.4f"
                % (t["test_accuracy"], s["test_accuracy"]))


def check_off():
    p = Psd("--local-socket", "off")
    try:
        st = p.stats()
        r.check(st.local_address == "" and
                not os.path.exists(os.path.join(p.data, "psd.sock")),
                "off: no socket advertised nor made (%r)" % st.local_address)
        rc, s, err = p.train()
        lines = route_lines(err)
        r.check(rc == 0 and s is not None and s["shm_shards"] == 0 and
                len(lines) == 1 and "over TCP (psd advertises no local socket" in lines[0],
                "off: the worker goes over TCP (%s)" % lines)
    finally:
        p.stop()


def check_not_a_socket():
    """A regular file where the default socket would go: psd still starts,
    advertises no socket, and leaves the file alone."""
    root = pstest.tmpdir("shm-default-file-")
    data = os.path.join(root, "data")
    os.makedirs(data)
    with open(os.path.join(data, "psd.sock"), "w") as f:
        f.write("not a socket")
    d = pstest.start_psd(data)
    ch = pstest.channel(d.address)
    try:
        st = pbg.ParameterServerStub(ch).Stats(pb.StatsRequest(), timeout=5)
        with open(os.path.join(data, "psd.sock")) as f:
            kept = f.read() == "not a socket"
        r.check(st.local_address == "" and kept, "file: a file at psd.sock: psd serves TCP "
                "alone (local_address %r), the file kept" % st.local_address)
    finally:
        ch.close()
        d.stop()


def check_python(p):
    from psclient import Client
    sock = "unix:" + os.path.join(os.path.abspath(p.data), "psd.sock")

    def client():
        return Client([p.d.address], shm=True)
    pstest.check_client_shm(r, "Client(['%s'], shm=True)" % p.d.address, client, p.stats,
                            sock, p.d.address)


def main():
    global pb, pbg
    pb, pbg, _, _ = pstest.generate_stubs()
    p = Psd()
    try:
        check_default(p)
        check_python(p)
    finally:
        p.stop()
    check_off()
    check_not_a_socket()
    r.finish()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    main()
