"""Shared memory between a client and psd on one host (ps.v1.ShmRef), from
Python: a gradient read from a sealed memfd, values written into it (Pull
into, Push value_into), the same numbers as the inline path, and every way
a reference can be wrong refused with a clear status and nothing changed."""
import fcntl
import mmap
import os
import time
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

N = 300 * 1000  # floats: 1.2 MB, a realistic layer


class Region:
    """A memfd as common/shm.c makes one: named ps-<16 hex>, size sealed."""

    def __init__(self, size, seal=True, tag=None):
        self.tag = tag or os.urandom(8).hex()
        self.fd = os.memfd_create("ps-" + self.tag, os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        if seal:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        self.mm = mmap.mmap(self.fd, size)
        self.f = np.frombuffer(self.mm, dtype="<f4")
        self.name = "memfd:%d:%d:ps-%s" % (os.getpid(), self.fd, self.tag)

    def ref(self, pb, off_floats, n, name=None):
        return pb.ShmRef(name=name or self.name, offset=4 * off_floats, length=4 * n)


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-shm")
    # Shared memory goes only over psd's unix socket (issue 13 a).
    tmp = pstest.tmpdir()
    d, sock = pstest.start_psd_local(tmp)
    stub = pbg.ParameterServerStub(pstest.channel("unix:" + sock))
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal(N).astype("<f4")
    for name in ("a", "b"):
        stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
            pb, name, (N,), lr=0.5)), timeout=10)
    # Same start for both: a = b = w0 (SGD, lr 0.5, gradient -2 w0, from 0).
    for name in ("a", "b"):
        stub.Push(pb.PushRequest(grads=[pstest.grad(pb, name, -2 * w0)]), timeout=10)

    reg = Region(4 * N * 4)
    g = rng.standard_normal(N).astype("<f4")
    reg.f[:N] = g

    # A gradient by reference and one inline give the same bits.
    resp = stub.Push(pb.PushRequest(grads=[pb.Gradient(name="a", grad=pb.Tensor(
        dtype=pb.DTYPE_FLOAT32, shape=[N], shm=reg.ref(pb, 0, N)))]), timeout=10)
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "b", g)]), timeout=10)
    va = pstest.value(stub.Pull(pb.PullRequest(items=[pb.PullItem(name="a")])).values[0])
    vb = pstest.value(stub.Pull(pb.PullRequest(items=[pb.PullItem(name="b")])).values[0])
    want = w0 - np.float32(0.5) * g
    r.check(list(resp.versions) == [2] and va.tobytes() == vb.tobytes() and
            np.array_equal(va, want),
            "a gradient read from shared memory applies as the same bytes inline "
            "do (version %s, %d of %d elements differ)"
            % (list(resp.versions), int(np.sum(va != vb)), N))

    # Pull into shared memory: the value lands there, not in the response.
    got = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="a", into=reg.ref(pb, N, N))]),
                    timeout=10)
    v = got.values[0]
    r.check(len(v.value.data) == 0 and v.value.shm.name == reg.name and
            v.value.shm.offset == 4 * N and list(v.value.shape) == [N] and
            np.array_equal(reg.f[N:2 * N], va),
            "Pull into shared memory writes the value there (%d bytes inline, "
            "shm offset %d)" % (len(v.value.data), v.value.shm.offset))

    # Push with return_values and value_into: gradient and value both by
    # reference, the response a few hundred bytes.
    reg.f[:N] = -g
    call = stub.Push.with_call(pb.PushRequest(return_values=True, grads=[pb.Gradient(
        name="a", grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shm=reg.ref(pb, 0, N)),
        value_into=reg.ref(pb, 2 * N, N))]), timeout=10)
    resp = call[0]
    r.check(list(resp.versions) == [3] and len(resp.values[0].value.data) == 0 and
            np.array_equal(reg.f[2 * N:3 * N], va + np.float32(0.5) * g) and
            resp.ByteSize() < 300,
            "Push with value_into: version %s, the value in shared memory, a "
            "%d-byte response" % (list(resp.versions), resp.ByteSize()))
    st = stub.Stats(pb.StatsRequest(), timeout=5)
    r.check(st.shm_regions == 1 and st.shm_bytes == 4 * 4 * N,
            "Stats: %d region mapped, %d bytes through shared memory (%d expected)"
            % (st.shm_regions, st.shm_bytes, 16 * N))

    # Bad references: the right status, a message that names the problem,
    # and nothing stored changes.
    def snapshot():
        got = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="a")]), timeout=10)
        return got.values[0].version, got.values[0].value.data

    before = snapshot()
    C = grpc.StatusCode

    def expect(what, req, code, *words, pull=False):
        try:
            (stub.Pull if pull else stub.Push)(req, timeout=10)
            r.check(False, "%s: refused (it was accepted)" % what)
            return
        except grpc.RpcError as e:
            msg = e.details() or ""
            r.check(e.code() == code and all(w in msg for w in words),
                    "%s -> %s %r" % (what, e.code().name, msg))
        r.check(snapshot() == before, "%s: nothing stored changed" % what)

    def push_ref(ref):
        return pb.PushRequest(grads=[pb.Gradient(name="a", grad=pb.Tensor(
            dtype=pb.DTYPE_FLOAT32, shm=ref))])

    unsealed = Region(N * 4, seal=False)
    other_tag = "memfd:%d:%d:ps-%s" % (os.getpid(), reg.fd, "0" * 16)
    expect("a name not of the memfd form", push_ref(reg.ref(pb, 0, N, name="/dev/shm/x")),
           C.INVALID_ARGUMENT, "shared memory", "/dev/shm/x")
    expect("a process that does not exist (not the caller)",
           push_ref(reg.ref(pb, 0, N, name="memfd:999999999:3:ps-" + reg.tag)),
           C.PERMISSION_DENIED, "shared memory", "its own memory")
    expect("an fd that does not exist",
           push_ref(reg.ref(pb, 0, N, name="memfd:%d:999999:ps-%s" % (os.getpid(), reg.tag))),
           C.FAILED_PRECONDITION, "shared memory", "cannot open")
    expect("an fd that is another memfd (wrong tag)", push_ref(reg.ref(pb, 0, N, name=other_tag)),
           C.FAILED_PRECONDITION, "shared memory", "not the memfd named")
    expect("a memfd whose size is not sealed", push_ref(unsealed.ref(pb, 0, N)),
           C.FAILED_PRECONDITION, "shared memory", "F_SEAL_SHRINK")
    expect("a range past the region's end", push_ref(reg.ref(pb, 3 * N + 1, N)),
           C.INVALID_ARGUMENT, "shared memory", "past its end")
    expect("an offset not a multiple of 4",
           push_ref(pb.ShmRef(name=reg.name, offset=2, length=4 * N)),
           C.INVALID_ARGUMENT, "multiple of 4")
    expect("a gradient of the wrong length", push_ref(reg.ref(pb, 0, N - 1)),
           C.INVALID_ARGUMENT, "variable 'a'", "%d elements" % (N - 1))
    expect("both data and shm", pb.PushRequest(grads=[pb.Gradient(name="a", grad=pb.Tensor(
        dtype=pb.DTYPE_FLOAT32, data=g.tobytes(), shm=reg.ref(pb, 0, N)))]),
           C.INVALID_ARGUMENT, "both data and shm")
    expect("value_into without return_values", pb.PushRequest(grads=[pb.Gradient(
        name="a", grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shm=reg.ref(pb, 0, N)),
        value_into=reg.ref(pb, N, N))]), C.INVALID_ARGUMENT, "value_into")
    expect("value_into of the wrong size", pb.PushRequest(return_values=True, grads=[
        pb.Gradient(name="a", grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shm=reg.ref(pb, 0, N)),
                    value_into=reg.ref(pb, N, 10))]),
           C.INVALID_ARGUMENT, "variable 'a'", "40 bytes")
    expect("Pull into memory that cannot be mapped",
           pb.PullRequest(items=[pb.PullItem(name="a", into=unsealed.ref(pb, 0, N))]),
           C.FAILED_PRECONDITION, "shared memory", "F_SEAL_SHRINK", pull=True)

    # A big value pulled into shared memory while pushes update it, on a
    # psd serving on several threads (so that they run at once): each pull
    # is one consistent snapshot, the value of the version it reports (the
    # value is the number of pushes: 0, then +1 per push of -1s).
    import threading
    d4, sock4 = pstest.start_psd_local(tmp, "--threads", "4", suffix="4")
    stub4 = pbg.ParameterServerStub(pstest.channel("unix:" + sock4))
    # The pushes on a connection of their own, as another worker's would be.
    push4 = pbg.ParameterServerStub(grpc.insecure_channel(
        "unix:" + sock4,
        options=pstest.CHANNEL_OPTIONS + [("grpc.use_local_subchannel_pool", 1)]))
    BIG = 16 << 20  # floats: 64 MiB
    stub4.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "big", (BIG,), lr=1.0)), timeout=30)
    gbig = Region(BIG * 4)
    gbig.f[:] = -1.0
    vbig = Region(BIG * 4)
    stop = threading.Event()
    pushed = []

    def pusher():
        while not stop.is_set():
            rr = push4.Push(pb.PushRequest(grads=[pb.Gradient(name="big", grad=pb.Tensor(
                dtype=pb.DTYPE_FLOAT32, shm=gbig.ref(pb, 0, BIG)))]), timeout=30)
            pushed.append(rr.versions[0])

    th = threading.Thread(target=pusher)
    th.start()
    bad, pulls = [], 0
    # At least 12 pulls, and on until 2 pushes have landed among them (a
    # loaded machine may schedule the pusher late), for at most 60 s.
    deadline = time.monotonic() + 60
    try:
        while (pulls < 12 or len(pushed) < 2) and time.monotonic() < deadline:
            got = stub4.Pull(pb.PullRequest(items=[pb.PullItem(
                name="big", into=vbig.ref(pb, 0, BIG))]), timeout=30)
            ver = got.values[0].version
            lo, hi = float(vbig.f.min()), float(vbig.f.max())
            pulls += 1
            if lo != hi or lo != float(ver):
                bad.append((ver, lo, hi))
    finally:
        stop.set()
        th.join(60)
    r.check(not bad and pulls >= 12 and len(pushed) >= 2,
            "64 MiB pulled into shared memory during %d pushes: each of %d pulls "
            "is the value of its version (%s)" % (len(pushed), pulls, bad[:3] or "all"))
    d4.stop()

    # The inline path still works beside it, and psd stops cleanly.
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "a", np.zeros(N))]), timeout=10)
    r.check(d.stop() == 0, "psd stops cleanly with a region mapped")
    r.finish()


if __name__ == "__main__":
    main()
