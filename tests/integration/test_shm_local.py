"""Shared memory in a pscoord job (common/hostid.h): a psd with
--local-socket tells pscoord its socket and host id, and a workerd on the
same host reaches that shard through the socket, with shared memory. All
real processes on 127.0.0.1:0 (and a socket) in temporary directories, with
tokens on psd and pscoord:

  publish    GetCluster's ps TaskInfo carries local_address "unix:" and
             the socket's absolute path, and host_id: this host's boot id
             and pid namespace, read here from /proc (the oracle);
  shm        the job: workerd logs "ps[0]: unix:..." and ends with
             shm_shards 1; psd's Stats shows shm_bytes > 0, shm_regions > 0;
  tcp        the same job with the worker given another host id
             (PS_HOST_ID): "over TCP (another host)", shm_shards 0, Stats
             shm_bytes 0; the test accuracy equals the shm job's;
  off        --shm off: TCP ("--shm off"), shm 0;
  gone       the socket file removed (psd still serves its descriptor): the
             worker sees no socket at the path and uses TCP;
  refuse     RegisterTask with a local_address that is not unix:/ABSOLUTE,
             or a host_id over 127 bytes: INVALID_ARGUMENT naming it, and
             nothing registered;
  persist    pscoord restarted on its state directory still publishes both;
  python     the Python client (python/psclient) given the coordinator and
             shm=True reaches the shard on its socket and pushes through
             shared memory; with another PS_HOST_ID over TCP.

Runs under build/venv-py (tests/python/pyenv.py), where psclient is
installed.

Prints ok/FAIL per check and "shm-local: N passed, N failed".
"""
import os
import secrets
import signal
import subprocess
import sys

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import pyenv  # noqa: E402

pyenv.reexec()

import pstest  # noqa: E402

PSCOORD = os.path.join(pstest.BUILD_ROOT, "coordinator", "pscoord")
pb = pbg = None
r = pstest.Results("shm-local")


def write_private(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


class Tokens:
    """A table of three tokens (the servers' --tokens) and one file each."""

    def __init__(self, root):
        self.tok = {role: secrets.token_hex(20) for role in
                    ("reader", "worker", "operator")}
        self.server = os.path.join(root, "tokens")
        write_private(self.server, "".join("%s %s\n" % kv for kv in self.tok.items()))
        for role, t in self.tok.items():
            write_private(os.path.join(root, role + ".tok"), "%s %s\n" % (role, t))
        self.root = root

    def file(self, role):
        return os.path.join(self.root, role + ".tok")

    def md(self, role):
        return [("authorization", "Bearer " + self.tok[role])]


class Job:
    """pscoord and one psd with --local-socket, registered with it."""

    def __init__(self, tokens, name):
        self.root = pstest.tmpdir("shm-local-%s-" % name)
        self.tokens = tokens
        self.sock = os.path.join(self.root, "ps0.sock")
        self.state = os.path.join(self.root, "state")
        self.start_coord()
        self.psd = pstest.start_psd(
            os.path.join(self.root, "data"), "--coordinator", self.coord.address,
            "--local-socket", self.sock, "--tokens", tokens.server,
            "--token-file", tokens.file("worker"))
        self.psd_ch = pstest.channel(self.psd.address)
        self.psd_stub = pbg.ParameterServerStub(self.psd_ch)

    def start_coord(self):
        self.coord = pstest.Daemon([PSCOORD, "--state-dir", self.state, "--listen",
                                    "127.0.0.1:0", "--job-id", "job", "--tokens",
                                    self.tokens.server, "--token-file",
                                    self.tokens.file("operator")],
                                   stderr=subprocess.DEVNULL)
        self.coord_ch = pstest.channel(self.coord.address)
        self.coord_stub = pbg.CoordinatorStub(self.coord_ch)

    def cluster(self):
        return self.coord_stub.GetCluster(pb.GetClusterRequest(job_id="job"), timeout=5,
                                          metadata=self.tokens.md("reader"))

    def ps_task(self):
        return [t for t in self.cluster().tasks if t.role == pb.PS][0]

    def stats(self):
        return self.psd_stub.Stats(pb.StatsRequest(), timeout=5,
                                   metadata=self.tokens.md("reader"))

    def train(self, *extra, env=None):
        """One worker, one epoch of 20000 examples; (exit status, JSON
        summary or None, stderr)."""
        return pstest.run_workerd(["--coordinator", self.coord.address, "--job-id",
                                   "job", "--epochs", "1", "--limit", "20000", "--batch",
                                   "64", "--json", "--progress", "0",
                                   "--token-file", self.tokens.file("worker"),
                                   "--log-level", "info", *extra], env)

    def stop(self):
        self.psd_ch.close()
        self.coord_ch.close()
        self.psd.stop()
        self.coord.stop()


def route_line(err):
    return [ln for ln in err.splitlines() if "ps[0]:" in ln]


def check_publish(job):
    t = job.ps_task()
    r.check(t.local_address == "unix:" + job.sock,
            "publish: TaskInfo.local_address is unix: and the socket's path (%r)"
            % t.local_address)
    r.check(t.host_id == pstest.host_id_oracle(),
            "publish: TaskInfo.host_id is boot id:pid namespace (%r)" % t.host_id)


def check_shm(job):
    rc, s, err = job.train()
    st = job.stats()
    lines = route_line(err)
    r.check(rc == 0 and s is not None, "shm: the worker trains (exit %d)" % rc)
    r.check(len(lines) == 1 and "unix:" + job.sock in lines[0] and
            "shared memory" in lines[0], "shm: one line says ps[0] is reached on "
            "its unix socket (%s)" % lines)
    r.check(s is not None and s["shm_shards"] == 1, "shm: shm_shards 1")
    r.check(st.shm_bytes > 0 and st.shm_regions > 0,
            "shm: psd Stats shm_bytes %d > 0, shm_regions %d > 0"
            % (st.shm_bytes, st.shm_regions))
    return s


def check_tcp(job, ref):
    rc, s, err = job.train(env={"PS_HOST_ID": "another-host"})
    st = job.stats()
    lines = route_line(err)
    r.check(rc == 0 and s is not None, "tcp: the worker trains (exit %d)" % rc)
    r.check(len(lines) == 1 and "%s over TCP (another host)" % job.psd.address
            in lines[0], "tcp: one line says ps[0] is reached over TCP (%s)" % lines)
    r.check(s is not None and s["shm_shards"] == 0 and st.shm_bytes == 0 and
            st.shm_regions == 0, "tcp: no shared memory (shm_shards %s, Stats "
            "shm_bytes %d)" % (s and s["shm_shards"], st.shm_bytes))
    if s is not None and ref is not None:
        r.check(abs(s["test_accuracy"] - ref["test_accuracy"]) < 0.005 and
                s["test_accuracy"] > 0.75,
                "tcp: test accuracy %.4f, through shared memory %.4f"
                % (s["test_accuracy"], ref["test_accuracy"]))


def check_off_and_gone(job):
    rc, s, err = job.train("--shm", "off")
    lines = route_line(err)
    r.check(rc == 0 and s is not None and s["shm_shards"] == 0 and
            len(lines) == 1 and "over TCP (--shm off)" in lines[0] and
            job.stats().shm_bytes == 0, "off: --shm off goes over TCP (%s)" % lines)
    os.unlink(job.sock)
    rc, s, err = job.train()
    lines = route_line(err)
    r.check(rc == 0 and s is not None and s["shm_shards"] == 0 and
            len(lines) == 1 and "No such file" in lines[0],
            "gone: no socket at the path: TCP (%s)" % lines)


def check_refuse(job):
    def reg(**kw):
        return job.coord_stub.RegisterTask(
            pb.RegisterRequest(job_id="job", role=pb.PS, index=-1,
                               address="127.0.0.1:1", **kw),
            timeout=5, metadata=job.tokens.md("worker"))
    before = len(job.cluster().tasks)
    r.refused("refuse: local_address tcp:127.0.0.1:1",
              lambda: reg(local_address="tcp:127.0.0.1:1"),
              grpc.StatusCode.INVALID_ARGUMENT, "local_address")
    r.refused("refuse: local_address unix:relative",
              lambda: reg(local_address="unix:relative.sock"),
              grpc.StatusCode.INVALID_ARGUMENT, "local_address")
    r.refused("refuse: a host_id of 200 bytes", lambda: reg(host_id="h" * 200),
              grpc.StatusCode.INVALID_ARGUMENT, "host_id")
    r.check(len(job.cluster().tasks) == before, "refuse: nothing registered")


def check_persist(job):
    job.coord_ch.close()
    job.coord.stop()
    job.start_coord()
    t = job.ps_task()
    r.check(t.local_address == "unix:" + job.sock and t.host_id == pstest.host_id_oracle(),
            "persist: a restarted pscoord still publishes them (%r)" % t.local_address)


def check_python(job):
    from psclient import Client

    def client():
        return Client(coordinator=job.coord.address, job_id="job", shm=True,
                      token=job.tokens.tok["operator"])
    pstest.check_client_shm(r, "Client(coordinator, shm=True)", client, job.stats,
                            "unix:" + job.sock, job.psd.address)


def main():
    global pb, pbg
    pb, pbg, _, _ = pstest.generate_stubs()
    tokens = Tokens(pstest.tmpdir("shm-local-tok-"))
    job = Job(tokens, "a")
    try:
        check_publish(job)
        ref = check_shm(job)
    finally:
        job.stop()
    # A fresh psd, so that its Stats count this job alone.
    job = Job(tokens, "b")
    try:
        check_tcp(job, ref)
        check_off_and_gone(job)
        check_refuse(job)
        check_persist(job)
    finally:
        job.stop()
    job = Job(tokens, "c")
    try:
        check_python(job)
    finally:
        job.stop()
    r.finish()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    main()
