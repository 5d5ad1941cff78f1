"""The shared-memory attacks of issue 13 a, against a real psd, each of which
worked before the fix:

- a wrong ShmRef's error quoted readlink's target of /proc/PID/fd/FD: the
  secret name of another process's memfd, or the path of a file it holds;
- a client that knew a region's name read another process's gradient from
  it and wrote values into it (over TCP too);
- a ShmRef over TCP was served at all;
- a gradient was checked, then read again to apply it: a process rewriting
  it in between got NaNs past the check (--allow-nonfinite off).

The victim is another process (a child python that makes its memfd and a
secret file, and prints their names), so that the pids differ as they would
between two workers. numpy is the oracle for the values."""
import fcntl
import mmap
import os
import subprocess
import sys
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

C = grpc.StatusCode
N = 262144  # the variable: 1 MiB of float32

VICTIM = r"""
import fcntl, mmap, os, sys, time
tag = os.urandom(8).hex()
fd = os.memfd_create("ps-" + tag, os.MFD_ALLOW_SEALING)
os.ftruncate(fd, 4 * %d)
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
m = mmap.mmap(fd, 4 * %d)
m[:] = b"\x00\x00\x80\x3f" * %d  # 1.0 everywhere: the victim's gradient
secret = open(sys.argv[1], "w")
print(os.getpid(), fd, tag, secret.fileno(), flush=True)
sys.stdin.read()  # until the test closes it
""" % (N, N, N)


class Region:
    """A memfd of this process, as common/shm.c makes one."""

    def __init__(self, n):
        self.tag = os.urandom(8).hex()
        self.fd = os.memfd_create("ps-" + self.tag, os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, 4 * n)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        self.mm = mmap.mmap(self.fd, 4 * n)
        self.f = np.frombuffer(self.mm, dtype="<f4")
        self.name = "memfd:%d:%d:ps-%s" % (os.getpid(), self.fd, self.tag)


def refusal(fn):
    try:
        fn()
        return None, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-shm-attack")
    tmp = pstest.tmpdir()
    d, sock = pstest.start_psd_local(tmp)
    tcp = pbg.ParameterServerStub(pstest.channel(d.address))
    unix = pbg.ParameterServerStub(pstest.channel("unix:" + sock))
    for name in ("w", "x"):
        tcp.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
            pb, name, (N,), lr=0.5)), timeout=10)

    def snapshot():
        v = tcp.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=10).values[0]
        return v.version, v.value.data

    def ref(name, n=N):
        return pb.ShmRef(name=name, offset=0, length=4 * n)

    def push_ref(stub, name):
        return lambda: stub.Push(pb.PushRequest(grads=[pb.Gradient(name="w", grad=pb.Tensor(
            dtype=pb.DTYPE_FLOAT32, shm=ref(name)))]), timeout=10)

    def pull_into(stub, name):
        return lambda: stub.Pull(pb.PullRequest(items=[pb.PullItem(
            name="w", into=ref(name))]), timeout=10)

    secret_path = os.path.join(tmp, "victims-secret-file-%s" % os.urandom(4).hex())
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, secret_path],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    vpid, vfd, vtag, vfile = victim.stdout.readline().split()
    vname = "memfd:%s:%s:ps-%s" % (vpid, vfd, vtag)
    before = snapshot()

    # 1. The quoted target: names that point at the victim's memfd (with a
    # guessed tag) and at its secret file. No answer may hold the secret
    # tag or the file's path, over either socket.
    leaks = []
    for stub, via in ((tcp, "TCP"), (unix, "unix socket")):
        for guess in ("memfd:%s:%s:ps-%s" % (vpid, vfd, "0" * 16),
                      "memfd:%s:%s:ps-%s" % (vpid, vfile, "0" * 16)):
            for call in (push_ref(stub, guess), pull_into(stub, guess)):
                code, msg = refusal(call)
                if code is None or vtag in msg or "victims-secret-file" in msg or \
                        "memfd:ps-" in msg:
                    leaks.append((via, guess, code and code.name, msg))
    r.check(not leaks, "wrong names for the victim's memfd and file are refused and "
            "no answer quotes what they point at (%s)" % (leaks[:2] or "none leaked"))

    # 2. Another process's region, by its full name: not read (push), not
    # written (pull into), over the unix socket or TCP.
    vm = mmap.mmap(os.open("/proc/%s/fd/%s" % (vpid, vfd), os.O_RDWR), 4 * N)
    vview = np.frombuffer(vm, dtype="<f4")
    for stub, via, want in ((unix, "unix socket", C.PERMISSION_DENIED),
                            (tcp, "TCP", C.FAILED_PRECONDITION)):
        code, msg = refusal(push_ref(stub, vname))
        r.check(code == want and "shared memory" in msg,
                "over the %s, a push naming another process's region is %s (%s %r)"
                % (via, want.name, code and code.name, msg))
        code, msg = refusal(pull_into(stub, vname))
        r.check(code == want and np.all(vview == 1.0),
                "over the %s, a pull into another process's region is %s and it is "
                "not written (%s %r)" % (via, want.name, code and code.name, msg))
    r.check(snapshot() == before, "nothing stored changed under the attacks")

    # 3. Our own region over TCP: refused, naming the unix socket; over the
    # unix socket: served.
    own = Region(N)
    own.f[:] = 0.25
    code, msg = refusal(push_ref(tcp, own.name))
    r.check(code == C.FAILED_PRECONDITION and "unix socket" in msg,
            "a ShmRef over TCP, even the caller's own, is FAILED_PRECONDITION naming "
            "the unix socket (%s %r)" % (code and code.name, msg))
    code, msg = refusal(push_ref(unix, own.name))
    v1 = snapshot()
    r.check(code is None and v1[0] == before[0] + 1 and np.allclose(
        np.frombuffer(v1[1], "<f4"), np.frombuffer(before[1], "<f4") - 0.125),
            "the owner's ShmRef over the unix socket is applied (%s, version %d)"
            % (code and code.name, v1[0]))
    victim.stdin.close()
    victim.wait(10)

    # 4. The rewrite race: a thread of this process flips its gradient
    # between finite and NaN while pushes of it run; every push is either
    # applied (finite) or refused, and the value never holds a NaN.
    race = Region(N)
    race.f[:] = 1e-3
    stop = threading.Event()
    nan = np.full(N, np.nan, np.float32)
    fine = np.full(N, 1e-3, np.float32)

    def flipper():
        # Mostly finite, NaN for the time of one write now and then: some
        # pushes see it whole (applied), some catch the NaN (refused), and
        # before the fix some caught it between the check and the apply.
        while not stop.is_set():
            race.f[:] = nan
            race.f[:] = fine
            time.sleep(0.0005)
    threads = [threading.Thread(target=flipper)]
    threads[0].start()
    counts = {"ok": 0, "refused": 0, "other": []}
    deadline = time.monotonic() + 8
    try:
        while time.monotonic() < deadline and counts["ok"] + counts["refused"] < 600:
            try:
                unix.Push(pb.PushRequest(grads=[pb.Gradient(name="x", grad=pb.Tensor(
                    dtype=pb.DTYPE_FLOAT32, shm=ref(race.name)))]), timeout=10)
                counts["ok"] += 1
            except grpc.RpcError as e:
                if e.code() == C.INVALID_ARGUMENT and "NaN" in (e.details() or ""):
                    counts["refused"] += 1
                else:
                    counts["other"].append((e.code().name, e.details()))
    finally:
        stop.set()
        threads[0].join(10)
    xv = pstest.value(tcp.Pull(pb.PullRequest(items=[pb.PullItem(name="x")]),
                               timeout=10).values[0])
    bad = int(np.sum(~np.isfinite(xv)))
    r.check(bad == 0 and not counts["other"] and counts["ok"] > 0,
            "a gradient rewritten to NaN during %d pushes (%d applied, %d refused): "
            "%d of %d elements non-finite (%s)" % (counts["ok"] + counts["refused"],
                                                  counts["ok"], counts["refused"], bad,
                                                  N, counts["other"][:1] or "no other error"))

    # 5. Another uid on the unix socket: the socket file's mode decides (by
    # default only psd's own user, and root, may connect).
    if os.geteuid() == 0:
        probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
                 "try:\n s.connect(sys.argv[1]); print('connected')\n"
                 "except OSError as e: print(e.errno)\n")
        p = subprocess.run([sys.executable, "-c", probe, sock], capture_output=True,
                           text=True, timeout=20, user=65534, group=65534)
        r.check(p.stdout.strip() == "13",
                "a process of another uid (65534) cannot connect to the unix socket "
                "(%r)" % (p.stdout.strip() or p.stderr.strip()[-200:]))
    else:
        print("skip another uid: the test does not run as root")
    r.check(d.stop() == 0, "psd stops cleanly")
    r.check(not os.path.exists(sock), "the unix socket file is removed at exit")

    # 6. With tokens on, the uid the unix socket names stands in for a
    # worker's token (auth.h's trusted transport): this process (psd's own
    # uid) pushes without one there, but may not Restore; over TCP a call
    # without a token is UNAUTHENTICATED.
    tok = os.path.join(tmp, "tokens")
    with open(tok, "w") as f:
        f.write("operator %s\n" % os.urandom(16).hex())
    os.chmod(tok, 0o600)
    d2, sock2 = pstest.start_psd_local(tmp, "--tokens", tok, suffix="2")
    u2 = pbg.ParameterServerStub(pstest.channel("unix:" + sock2))
    t2 = pbg.ParameterServerStub(pstest.channel(d2.address))
    code, msg = refusal(lambda: u2.CreateVariable(pb.CreateVariableRequest(
        spec=pstest.spec(pb, "w", (4,))), timeout=10))
    r.check(code is None, "tokens on: over the unix socket psd's own uid is a worker "
            "without a token (CreateVariable: %s %r)" % (code and code.name, msg))
    code, msg = refusal(lambda: u2.Restore(pb.RestoreRequest(), timeout=10))
    r.check(code == C.PERMISSION_DENIED, "... but not an operator (Restore: %s %r)"
            % (code and code.name, msg))
    code, msg = refusal(lambda: t2.Stats(pb.StatsRequest(), timeout=10))
    r.check(code == C.UNAUTHENTICATED, "over TCP a call without a token is "
            "UNAUTHENTICATED (%s)" % (code and code.name))
    r.check(d2.stop() == 0, "the psd with tokens stops cleanly")
    r.finish()


if __name__ == "__main__":
    main()
