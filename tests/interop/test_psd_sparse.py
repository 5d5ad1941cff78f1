"""Sparse embedding tables (issue 12) against real psd processes, with
python grpcio as the client and numpy's float32 arithmetic as the oracle:
pull order and repeats, deterministic initial rows (two processes, a
restart, a restore), insert_on_pull, repeated ids summed before one update
for SGD, Adagrad and lazy Adam (a step count per row), return_values,
admission, ttl eviction, max_rows, bad input refused with nothing
applied, and a clean stop bounded after many new rows."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

C = grpc.StatusCode
F32 = np.float32
pb, pbg, _, _ = pstest.generate_stubs()
R = pstest.Results("psd-sparse")
DIM = 8


class Psd:
    def __init__(self, *args, data=None):
        self.data = data or pstest.tmpdir()
        self.args = args
        self.start()

    def start(self):
        self.d = pstest.start_psd(self.data, *self.args)
        self.ch = pstest.channel(self.d.address)
        self.stub = pbg.ParameterServerStub(self.ch)

    def stop(self, sig=signal.SIGTERM):
        self.ch.close()
        return self.d.stop(sig)

    def restart(self, sig=signal.SIGTERM):
        self.stop(sig)
        self.start()

    def create(self, name, opt=None, init=None, dim=DIM, **kw):
        s = pstest.spec(pb, name, (dim,), opt=opt, init=init, sparse=True, **kw)
        return self.stub.CreateVariable(pb.CreateVariableRequest(spec=s), timeout=5)

    def pull(self, name, ids):
        r = self.stub.SparsePull(pb.SparsePullRequest(items=[
            pb.SparsePullItem(name=name, ids=list(ids))]), timeout=10).rows[0]
        return rows(r)

    def push(self, name, ids, g, step=0, ret=False, shape=None):
        g = np.ascontiguousarray(g, dtype="<f4")
        t = pb.Tensor(dtype=pb.DTYPE_FLOAT32, data=g.tobytes(),
                      shape=list(shape if shape is not None else g.shape))
        r = self.stub.SparsePush(pb.SparsePushRequest(step=step, return_values=ret, grads=[
            pb.SparseGradient(name=name, ids=list(ids), grad=t)]), timeout=10)
        return rows(r.values[0]) if ret else r.versions[0]

    def stats(self):
        return self.stub.Stats(pb.StatsRequest(), timeout=5)


def rows(r):
    return np.frombuffer(r.values.data, dtype="<f4").reshape(tuple(r.values.shape)).copy()


def uniform(seed=42):
    return pb.Initializer(kind=pb.Initializer.UNIFORM, minval=-1, maxval=1, seed=seed)


def sgd(lr=0.5):
    return pb.Optimizer(kind=pb.Optimizer.SGD, learning_rate=lr)


def summed(ids, g):
    """{id: the float32 sum of its rows of g, in request order}."""
    out = {}
    for i, gi in zip(ids, g):
        out[i] = out[i] + gi if i in out else F32(0) + gi
    return out


def wait_for(cond, seconds=6.0):
    return pstest.wait_until(cond, seconds, 0.1)


def test_pull_and_init(a, b):
    a.create("e", opt=sgd(), init=uniform())
    b.create("e", opt=sgd(), init=uniform())
    ids = [5, -3, 5, 1 << 40, 7]
    ra = a.pull("e", ids)
    R.check(ra.shape == (5, DIM), "pull answers [len(ids), dim]")
    R.check(np.array_equal(ra[0], ra[2]), "a repeated id answers the same row twice")
    R.check(not np.array_equal(ra[0], ra[1]), "different ids get different rows")
    R.check(bool(np.all((ra >= -1) & (ra < 1))), "UNIFORM rows lie in [minval, maxval)")
    R.check(np.array_equal(ra[[1, 0]], a.pull("e", [-3, 5])),
            "rows come back in request order")
    R.check(np.array_equal(ra, b.pull("e", ids)),
            "another psd process draws the same bits for the same (seed, id)")
    R.check(a.stats().sparse_rows == 0, "a pull of never-pushed ids stores no row")
    b.create("f", opt=sgd(), init=uniform(seed=43))
    R.check(not np.array_equal(ra, b.pull("f", ids)), "another seed, other rows")
    return ra


def test_sgd(a, ra):
    ids = [5, 9, 5, -3]
    g = np.random.default_rng(1).standard_normal((4, DIM)).astype(F32)
    init = dict(zip([5, 9, -3], a.pull("e", [5, 9, -3])))
    got = a.push("e", ids, g, step=1, ret=True)
    want = {i: init[i] - F32(0.5) * s for i, s in summed(ids, g).items()}
    R.check(all(np.array_equal(got[k], want[i]) for k, i in enumerate(ids)),
            "SGD: repeated ids summed, one update each, returned in request order")
    R.check(np.array_equal(a.pull("e", [9, 5, -3]), np.stack([want[9], want[5], want[-3]])),
            "a pull after the push answers the updated rows")
    R.check(a.stats().sparse_rows == 3, "three distinct pushed ids: three rows stored")
    out = subprocess.run([os.path.join(pstest.BUILD_ROOT, "tools", "psctl"), "--server",
                          a.d.address, "stats"], capture_output=True, text=True,
                         timeout=30).stdout
    line = [l for l in out.splitlines() if l.startswith("sparse rows")]
    R.check(len(line) == 1 and re.match(r"sparse rows\s+3 \(\d+ not yet committed\)$",
                                        line[0]) is not None,
            "psctl stats shows the sparse rows: %s" % (line or out[-200:]))
    out = subprocess.run([os.path.join(pstest.BUILD_ROOT, "tools", "psctl"), "--server",
                          a.d.address, "list"], capture_output=True, text=True,
                         timeout=30).stdout
    line = [l for l in out.splitlines() if l.startswith("e ")]
    row = 16 + DIM * 4  # SGD: a head and the value
    want_re = r"3 rows x %d +float32 +sgd .* %d B disk, [0-9.]+ [KMG]?i?B RAM$" % (DIM, 3 * row)
    R.check(len(line) == 1 and re.search(want_re, line[0]) is not None,
            "psctl list shows the table's rows, dim, optimizer, bytes on disk and in RAM: %s"
            % (line or out[-300:]))
    return want


def test_adagrad(a):
    a.create("ada", opt=pb.Optimizer(kind=pb.Optimizer.ADAGRAD, learning_rate=0.1),
             init=uniform(7))
    lr, eps, a0 = F32(0.1), F32(1e-7), F32(0.1)
    ids = [[1, 2, 1], [2, 3]]
    rng = np.random.default_rng(2)
    state = {i: (r, np.full(DIM, a0, F32)) for i, r in zip([1, 2, 3], a.pull("ada", [1, 2, 3]))}
    for step, batch in enumerate(ids):
        g = rng.standard_normal((len(batch), DIM)).astype(F32)
        a.push("ada", batch, g, step=step)
        for i, gi in summed(batch, g).items():
            w, acc = state[i]
            acc = acc + gi * gi
            state[i] = (w - lr * gi / (np.sqrt(acc) + eps), acc)
    got = a.pull("ada", [1, 2, 3])
    R.check(all(np.array_equal(got[k], state[i][0]) for k, i in enumerate([1, 2, 3])),
            "Adagrad rows equal numpy's float32 update, bit for bit")


def test_lazy_adam(a):
    a.create("adam", opt=pb.Optimizer(kind=pb.Optimizer.ADAM, learning_rate=0.01),
             init=uniform(9))
    lr, b1, b2, eps = F32(0.01), F32(0.9), F32(0.999), F32(1e-7)
    rng = np.random.default_rng(3)
    st = {i: [r, np.zeros(DIM, F32), np.zeros(DIM, F32), 0]
          for i, r in zip([1, 2], a.pull("adam", [1, 2]))}
    for step, batch in enumerate([[1], [1, 2, 2], [1]]):
        g = rng.standard_normal((len(batch), DIM)).astype(F32)
        a.push("adam", batch, g, step=step)
        for i, gi in summed(batch, g).items():
            w, m, v, t = st[i]
            t += 1
            lr_t = F32(float(lr) * np.sqrt(1 - float(b2) ** t) / (1 - float(b1) ** t))
            m = b1 * m + (F32(1) - b1) * gi
            v = b2 * v + (F32(1) - b2) * gi * gi
            st[i] = [w - lr_t * m / (np.sqrt(v) + eps), m, v, t]
    got = a.pull("adam", [1, 2])
    R.check(np.array_equal(got[0], st[1][0]) and np.array_equal(got[1], st[2][0]),
            "lazy Adam: each row's bias correction counts its own updates (3 and 1)")


def test_ftrl(a):
    """FTRL-Proximal on rows (the wide part of a wide-and-deep model), each
    row against test_psd_ftrl.py's numpy copy of TensorFlow's kernel, with
    l1 (exact zeros), l2 and beta, repeated ids summed first."""
    from test_psd_ftrl import FtrlRef
    kw = dict(lr=0.05, lr_power=-0.5, l1=0.01, l2=0.001, beta=0.1)
    a.create("ftrl", opt=pb.Optimizer(kind=pb.Optimizer.FTRL, learning_rate=0.05,
                                       learning_rate_power=-0.5, l1=0.01, l2=0.001,
                                       beta=0.1), init=uniform(11))
    refs = {i: FtrlRef(r, **kw) for i, r in zip([5, 6, 7], a.pull("ftrl", [5, 6, 7]))}
    rng = np.random.default_rng(5)
    for step, batch in enumerate([[5, 6, 5], [7], [6, 7, 7, 5]]):
        g = (0.5 * rng.standard_normal((len(batch), DIM))).astype(F32)
        a.push("ftrl", batch, g, step=step)
        for i, gi in summed(batch, g).items():
            refs[i].step(gi)
    got = a.pull("ftrl", [5, 6, 7])
    diff = max(float(np.max(np.abs(got[k] - refs[i].w))) for k, i in enumerate([5, 6, 7]))
    zeros = int(sum(np.count_nonzero(refs[i].w == 0) for i in refs))
    R.check(diff <= 1e-6 and all(np.array_equal(got[k] == 0, refs[i].w == 0)
                                  for k, i in enumerate([5, 6, 7])),
            "FTRL rows (l1, l2, beta; repeated ids summed) equal numpy's TF formula "
            "(max diff %.2g, %d exact zeros from l1)" % (diff, zeros))


def test_insert_on_pull(a):
    a.create("iop", opt=sgd(), init=uniform(), insert_on_pull=True)
    before = a.stats().sparse_rows
    a.pull("iop", [1, 2, 2, 3])
    R.check(a.stats().sparse_rows == before + 3, "insert_on_pull: a pull stores its rows")


def test_admission(a):
    a.create("adm", opt=sgd(), init=uniform(), admit_after=3)
    init = a.pull("adm", [100])[0]
    g = np.ones((1, DIM), F32)
    before = a.stats()
    a.push("adm", [100], g, step=1)
    a.push("adm", [100, 100], np.vstack([g, g]), step=2)
    s = a.stats()
    R.check(s.sparse_rows == before.sparse_rows and
            np.array_equal(a.pull("adm", [100])[0], init),
            "admit_after 3: after two pushes no row is stored and none applied")
    R.check(s.sparse_not_admitted - before.sparse_not_admitted == 2,
            "Stats counts the pushes not admitted")
    a.push("adm", [100], g, step=3)
    R.check(a.stats().sparse_rows == before.sparse_rows + 1 and
            np.array_equal(a.pull("adm", [100])[0], init - F32(0.5) * g[0]),
            "the third push stores the row and applies that push alone")


def test_ttl(a):
    a.create("ttl", opt=sgd(), init=uniform(), ttl_steps=5)
    g = np.ones((1, DIM), F32)
    init = a.pull("ttl", [1, 2])
    before = a.stats()
    a.push("ttl", [1], g, step=1)
    a.push("ttl", [2], g, step=10)
    ok = wait_for(lambda: a.stats().sparse_evicted > before.sparse_evicted)
    got = a.pull("ttl", [1, 2])
    R.check(ok and np.array_equal(got[0], init[0]) and
            np.array_equal(got[1], init[1] - F32(0.5)),
            "ttl_steps 5: a row last updated at step 1 is evicted at step 10, "
            "the one updated at 10 kept")


def test_max_rows(a):
    a.create("cap", opt=sgd(), init=uniform(), max_rows=3)
    init = a.pull("cap", [1, 2, 3, 4, 5])
    before = a.stats()
    for i in range(1, 6):
        a.push("cap", [i], np.ones((1, DIM), F32), step=i)
    ok = wait_for(lambda: a.stats().sparse_evicted - before.sparse_evicted >= 2)
    got = a.pull("cap", [1, 2, 3, 4, 5])
    changed = [not np.array_equal(got[k], init[k]) for k in range(5)]
    R.check(ok and changed == [False, False, True, True, True],
            "max_rows 3: the two least recently updated rows are evicted")


def test_bad_input(a):
    before = a.pull("e", [5, 9])
    g = np.ones((2, DIM), F32)
    R.refused("a gradient of the wrong dim", lambda: a.push("e", [5, 9], np.ones((2, 3), F32)),
              C.INVALID_ARGUMENT, "'e'", "shape")
    R.refused("ids and rows of different counts", lambda: a.push("e", [5], g),
              C.INVALID_ARGUMENT, "'e'", "shape")
    bad = g.copy()
    bad[1, 2] = np.nan
    R.refused("a NaN in a sparse gradient", lambda: a.push("e", [5, 9], bad),
              C.INVALID_ARGUMENT, "'e'", "NaN")
    R.refused("an unknown table", lambda: a.pull("nope", [1]), C.NOT_FOUND, "'nope'")
    R.refused("a push to an unknown table", lambda: a.push("nope", [1], g[:1]),
              C.NOT_FOUND, "'nope'")
    a.stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "dense", (4,))))
    R.refused("a dense variable addressed by SparsePull", lambda: a.pull("dense", [1]),
              C.INVALID_ARGUMENT, "'dense'", "dense")
    R.refused("a dense variable addressed by SparsePush",
              lambda: a.push("dense", [1], np.ones((1, 4), F32)),
              C.INVALID_ARGUMENT, "'dense'", "dense")
    R.refused("a sparse table addressed by Pull", lambda: a.stub.Pull(
        pb.PullRequest(items=[pb.PullItem(name="e")])), C.INVALID_ARGUMENT, "'e'", "sparse")
    R.refused("a sparse table of shape [2, 3]", lambda: a.stub.CreateVariable(
        pb.CreateVariableRequest(spec=pstest.spec(pb, "s2", (2, 3), sparse=True))),
        C.INVALID_ARGUMENT, "'s2'", "dim")
    R.refused("a sparse table of dim 0", lambda: a.stub.CreateVariable(
        pb.CreateVariableRequest(spec=pstest.spec(pb, "s0", (0,), sparse=True))),
        C.INVALID_ARGUMENT, "'s0'")
    R.refused("a sparse table of dim 10^6", lambda: a.stub.CreateVariable(
        pb.CreateVariableRequest(spec=pstest.spec(pb, "sbig", (10 ** 6,), sparse=True))),
        C.INVALID_ARGUMENT, "'sbig'", "dim")
    big = np.full((2, DIM), 3e38, F32)
    R.refused("a repeated id whose summed gradient overflows",
              lambda: a.push("e", [9, 5, 5], np.vstack([g[:1], big])),
              C.INVALID_ARGUMENT, "'e'", "row 5", "non-finite")
    R.check(np.array_equal(a.pull("e", [5, 9]), before),
            "after every refusal the rows are unchanged")


def test_restart_and_restore(a, want):
    g = np.ones((1, DIM), F32)
    fresh = a.pull("e", [12345])
    ck = a.stub.Checkpoint(pb.CheckpointRequest(step=100), timeout=30)
    at_ck = a.pull("e", [5, 9, -3])
    a.push("e", [5, 777], np.vstack([g, g]), step=50)
    a.restart()
    R.check(np.array_equal(a.pull("e", [12345]), fresh),
            "after a restart a never-pushed id draws the same initial row")
    R.check(not np.array_equal(a.pull("e", [5]), at_ck[:1]),
            "a push acknowledged before SIGTERM survives the restart")
    rows_now = a.stats().sparse_rows
    r = a.stub.Restore(pb.RestoreRequest(step=ck.step), timeout=30)
    R.check(r.step == 100 and np.array_equal(a.pull("e", [5, 9, -3]), at_ck),
            "Restore brings back the rows of the checkpoint")
    R.check(a.stats().sparse_rows == rows_now - 1,
            "and forgets the row created after it (id 777)")


def fill(c, name, limit):
    """Pushes 4096 new rows of ones at a time (SGD lr 1: each row becomes
    -1) until limit rows or an error; returns (rows acknowledged, error)."""
    g = np.ones((4096, 64), F32)
    k, err = 0, None
    while k < limit and err is None:
        try:
            c.push(name, range(k, k + 4096), g, step=k)
            k += 4096
        except grpc.RpcError as e:
            err = e
    return k, err


def all_rows(c, name, k):
    return all(bool(np.all(c.pull(name, range(i, min(i + 8192, k))) == -1))
               for i in range(0, k, 8192))


def test_map_grows():
    """A full LMDB map grows: pushes far beyond --map-size 4M succeed (LMDB
    holds the rows' catalog, ~60 bytes a row), the file grows past it, and
    every row reads back, also after a restart."""
    c = Psd("--map-size", "4M", "--memory-limit", "64M")
    c.create("grow", opt=sgd(1.0), dim=64)
    c.push("grow", range(-64, 0), np.ones((64, 64), F32))
    stop, bad = threading.Event(), []

    def reader():  # pulls all along: a growth waits for their transactions
        while not stop.is_set():
            try:
                if not np.all(c.pull("grow", range(-64, 0)) == -1):
                    bad.append("wrong values")
            except grpc.RpcError as e:
                bad.append(e.details())
    th = threading.Thread(target=reader)
    th.start()
    k, err = fill(c, "grow", 200_000)
    stop.set()
    th.join()
    R.check(not bad, "pulls while the map grows all succeed: %s" % bad[:1])
    R.check(err is None, "pushes of %d rows (~60 MB) with --map-size 4M succeed: %s"
            % (k, err and err.details()))
    until = time.time() + 20
    while c.stats().sparse_disk_bytes <= 4 << 20 and time.time() < until:
        time.sleep(0.1)
    disk = c.stats().sparse_disk_bytes
    R.check(disk > 4 << 20, "Stats' disk bytes grew past the 4M map: %d" % disk)
    R.check(all_rows(c, "grow", k), "every row reads back")
    c.restart()
    R.check(all_rows(c, "grow", k), "and after a restart (the grown file reopens)")
    c.stop()


def test_stop_bounded():
    """A clean stop writes the sparse catalog for a second at most, and not
    at all when its queue was dropped (doc/sparse.md): 622k new rows with
    --memory-limit 256M (a queue of ~94k entries), the row log applied
    and the catalog not yet written. Writing it whole at the stop took
    ~2.5 s here; psd exits within the second plus a margin, and the next
    open replays the records: every row reads back its last value."""
    c = Psd("--memory-limit", "256M")
    c.create("stop", opt=sgd(1.0))
    step = 1 << 15
    n = 19 * step
    for k in range(0, n, step):
        c.push("stop", range(k, k + step), np.ones((step, DIM), F32), step=k)
    c.push("stop", range(step), np.ones((step, DIM), F32), step=n)  # a later record: -2
    applied = wait_for(lambda: c.stats().sparse_log_bytes == 0, 10)
    queued = c.stats().sparse_catalog_queued
    R.check(applied and queued >= n,
            "the row log applied, %d entries not in the catalog yet" % queued)
    t0 = time.monotonic()
    status = c.stop()
    took = time.monotonic() - t0
    R.check(status == 0 and took < 1.0 + 0.6,
            "SIGTERM: psd exits 0 within the catalog's 1 s and a 0.6 s margin (%.2f s)" % took)
    c.start()
    s = c.stats()
    R.check(s.sparse_rows == n and s.sparse_catalog_queued == 0,
            "the next open replayed the records: %d rows, %d entries queued"
            % (s.sparse_rows, s.sparse_catalog_queued))
    got = np.concatenate([c.pull("stop", range(k, min(k + 4 * step, n)))
                          for k in range(0, n, 4 * step)])
    want = np.where(np.arange(n) < step, F32(-2), F32(-1))
    R.check(got.shape == (n, DIM) and np.array_equal(got[:, 0], want) and
            bool(np.all(got == got[:, :1])), "every row reads back its last value")
    c.stop()


def refused(c, name, why):
    """Fills table name until refused; checks the refusal and that nothing
    acknowledged is lost."""
    k, err = fill(c, name, 600_000)
    R.check(err is not None and err.code() == C.RESOURCE_EXHAUSTED and
            "nothing applied" in err.details() and why in err.details(),
            "%s: the push is refused, naming it: %s" % (why, err and err.details()))
    R.check(c.d.proc.poll() is None and all_rows(c, name, k),
            "psd is alive and all %d rows acknowledged before are there" % k)


def test_map_cap():
    """A map that may not grow further: RESOURCE_EXHAUSTED naming the cap."""
    c = Psd("--map-size", "4M", "--map-size-max", "12M", "--memory-limit", "64M")
    c.create("cap", opt=sgd(1.0), dim=64)
    refused(c, "cap", "--map-size-max")
    c.stop()


def test_disk_full():
    """A full disk (a 48 MiB tmpfs): RESOURCE_EXHAUSTED naming it."""
    if os.geteuid() != 0:
        print("skip disk full: mounting a small tmpfs needs root", flush=True)
        return
    d = pstest.tmpdir()
    if os.system("mount -t tmpfs -o size=48m psd-test %s" % d) != 0:
        print("skip disk full: mount -t tmpfs failed", flush=True)
        return
    try:
        c = Psd("--map-size", "16M", "--memory-limit", "64M", data=d)
        c.create("disk", opt=sgd(1.0), dim=64)
        refused(c, "disk", "the disk is full")
        c.stop()
    finally:
        os.system("umount %s" % d)


def main():
    a = Psd()
    b = Psd()
    ra = test_pull_and_init(a, b)
    b.stop()
    want = test_sgd(a, ra)
    test_adagrad(a)
    test_lazy_adam(a)
    test_ftrl(a)
    test_insert_on_pull(a)
    test_admission(a)
    test_ttl(a)
    test_max_rows(a)
    test_bad_input(a)
    test_restart_and_restore(a, want)
    a.stop()
    test_map_grows()
    test_stop_bounded()
    test_map_cap()
    test_disk_full()
    R.finish()


if __name__ == "__main__":
    main()
