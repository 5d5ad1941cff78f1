"""psclient's sparse tables, FTRL, bounded staleness and delta pushes against
real psd on 127.0.0.1:0 with temporary directories, numpy as the oracle:

  adagrad   a table on 2 shards, Adagrad: pushes with repeated ids in any
            order give numpy's update of each id's summed gradient; pulls
            (any order, repeats) and return_values come back in request
            order;
  shards    each shard's Stats sparse_rows equals the count of ids
            psclient.shard_of puts there, and (3 shards) every pushed id's
            row is on exactly the shard shard_of names, asked shard by shard;
  ftrl      Optimizer.ftrl: each push on a dense variable and on a sparse
            row has the bits of tests/interop's FtrlRef (TF's kernel in
            numpy), with l1, l2, l2_shrinkage, beta, and TF's lr_power 0;
  stale     pull(step=, worker=) of a bounded-staleness variable is held
            while the other worker is too far behind (DEADLINE_EXCEEDED
            naming it) and answered once it moves on;
  delta     push(delta=True) adds the change with no optimizer (Adam) and
            the version rises by one; badinput: float ids, wrong row shapes
            and unknown tables (ids or next_ids) are refused before anything
            is sent. Pulls with next_ids (the next pull's, split by shard)
            answer what pulls without them answer, and a push with next_ids
            (the next push's) applies numpy's update.

Prints ok/FAIL per check and "python-sparse: N passed, N failed".
"""
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pyenv  # noqa: E402

pyenv.reexec()

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import pstest  # noqa: E402
from psclient import (Client, Initializer, Optimizer, PsError, SparseTable,  # noqa: E402
                      Variable, shard_of)
from psclient._proto import pb  # noqa: E402
from test_psd_ftrl import FtrlRef  # noqa: E402  (tests/interop, on pyenv's path)

F32 = np.float32
r = pstest.Results("python-sparse")


def psd(*args):
    return pstest.Daemon([pstest.psd_path(), "--data-dir", pstest.tmpdir("pysp-"),
                          "--listen", "127.0.0.1:0", "--log-level", "warn"] + list(args))


def test_adagrad(c):
    dim, lr, acc0, eps = 8, 0.1, 0.1, 1e-7
    c.create_sparse_tables([SparseTable("emb", dim, Initializer.constant(0.5))],
                           optimizer=Optimizer.adagrad(lr, acc0, eps))
    rng = np.random.default_rng(3)
    universe = rng.integers(-2 ** 62, 2 ** 62, 200)
    w = {int(i): np.full(dim, 0.5, F32) for i in universe}
    a = {int(i): np.full(dim, acc0, F32) for i in universe}
    ok = True
    pushed = set()
    for step in range(5):
        ids = rng.choice(universe, 300)            # repeats, any order
        pushed.update(ids.tolist())
        g = rng.standard_normal((300, dim)).astype(F32)
        res = c.sparse_push({"emb": (ids, g)}, return_values=True)
        summed = {}
        for i, row in zip(ids.tolist(), g):        # psd sums in request order
            summed[i] = summed[i] + row if i in summed else row.copy()
        for i, s in summed.items():
            a[i] = a[i] + s * s
            w[i] = w[i] - F32(lr) * s / (np.sqrt(a[i]) + F32(eps))
        want = np.stack([w[i] for i in ids.tolist()])
        ok &= bool(np.allclose(res.values["emb"], want, rtol=1e-6, atol=1e-7))
    r.check(ok, "adagrad: 5 pushes of 300 repeated ids over 2 shards give numpy's update "
            "of each id's summed gradient (return_values in request order)")
    q = rng.choice(universe, 500)
    got = c.sparse_pull({"emb": q})
    want = np.stack([w[int(i)] for i in q])
    r.check(got["emb"].shape == (500, dim) and got["emb"].dtype == F32
            and np.allclose(got["emb"], want, rtol=1e-6, atol=1e-7)
            and got.versions["emb"] >= 1,
            "adagrad: a pull of 500 ids (repeats, any order) answers numpy's rows in request "
            "order (version %d)" % got.versions["emb"])
    # A push's next_ids: the next push's ids, split by shard; the same
    # update and answer as a push without them (the hint's ids on both
    # shards, some never pushed).
    ids = rng.choice(universe, 300)
    pushed.update(ids.tolist())
    g = rng.standard_normal((300, dim)).astype(F32)
    hint = np.concatenate([rng.choice(universe, 200), np.array([-1, 2 ** 63 - 1])])
    res = c.sparse_push({"emb": (ids, g)}, return_values=True, next_ids={"emb": hint})
    summed = {}
    for i, row in zip(ids.tolist(), g):
        summed[i] = summed[i] + row if i in summed else row.copy()
    for i, s in summed.items():
        a[i] = a[i] + s * s
        w[i] = w[i] - F32(lr) * s / (np.sqrt(a[i]) + F32(eps))
    want = np.stack([w[i] for i in ids.tolist()])
    r.check(np.allclose(res.values["emb"], want, rtol=1e-6, atol=1e-7),
            "adagrad: a push with next_ids (on both shards) gives numpy's update")
    got = c.sparse_pull({"emb": q})
    want = np.stack([w[int(i)] for i in q])
    # next_ids: a hint of the next pull, split by shard as the ids are; the
    # ids here all on shard 0, the hint on both (shard 1 gets an item with
    # next ids only).
    on0 = q[shard_of(q, 2) == 0]
    hinted = c.sparse_pull({"emb": on0}, next_ids={"emb": q})
    r.check(np.array_equal(hinted["emb"], got["emb"][shard_of(q, 2) == 0])
            and np.array_equal(c.sparse_pull({"emb": q}, next_ids={"emb": []})["emb"],
                               got["emb"]),
            "adagrad: pulls with next_ids (on both shards, or empty) answer what pulls "
            "without them answer")
    new = c.sparse_pull({"emb": np.array([7, 7], np.int64)})["emb"]
    r.check(np.all(new == 0.5), "adagrad: an id never pushed answers its initial row")
    return np.array(sorted(pushed), np.int64)


def test_shards(c, universe):
    counts = np.bincount(shard_of(universe, 2), minlength=2)
    got = [s.sparse_rows for s in c.stats()]
    r.check(list(got) == counts.tolist() and min(counts) > 0,
            "shards: each shard's Stats sparse_rows %s equals the Python hash's count %s"
            % (got, counts.tolist()))


def test_membership(addrs):
    c = Client(addrs)
    c.create_sparse_tables([SparseTable("m3", 2)], optimizer=Optimizer.sgd(1.0))
    ids = np.concatenate([np.arange(-50, 250), np.array([2 ** 63 - 1, -2 ** 63])]).astype(np.int64)
    c.sparse_push({"m3": (ids, np.ones((len(ids), 2), F32))})
    where = shard_of(ids, 3)
    ok = True
    for s, sh in enumerate(c.shards):
        resp = sh.call("SparsePull", pb.SparsePullRequest(
            items=[pb.SparsePullItem(name="m3", ids=ids.tolist())]), pb.SparsePullResponse)
        rows = np.frombuffer(resp.rows[0].values.data, "<f4").reshape(len(ids), 2)
        ok &= bool(np.array_equal(rows[:, 0] == -1, where == s))
    r.check(ok and len(set(where.tolist())) == 3,
            "shards: with 3 shards each of %d pushed ids is stored on the shard shard_of "
            "names and no other" % len(ids))
    c.close()


def test_ftrl(c):
    n, lr = 33, 0.1
    rng = np.random.default_rng(5)
    for label, kw, ref_kw in (
            ("l1, l2, l2_shrinkage, beta", dict(l1=0.01, l2=0.05, l2_shrinkage=0.1, beta=0.5,
                                                initial_accumulator=0.3),
             dict(l1=0.01, l2=0.05, l2_shrinkage=0.1, beta=0.5, initial_accumulator=0.3)),
            ("TF's lr_power 0", dict(learning_rate_power=0.0, l1=0.01),
             dict(lr_power=0.0, l1=0.01))):
        name = "f%d" % len(label)
        c.create_variables([Variable(name, (n,), Initializer.constant(0.25))],
                           optimizer=Optimizer.ftrl(lr, **kw))
        c.create_sparse_tables([SparseTable(name + "s", n, Initializer.constant(0.25))],
                               optimizer=Optimizer.ftrl(lr, **kw))
        ref = FtrlRef(np.full(n, 0.25, F32), lr, **ref_kw)
        same = 0
        for _ in range(3):
            g = rng.standard_normal(n).astype(F32)
            ref.step(g)
            dense = c.push({name: g}, return_values=True).values[name]
            row = c.sparse_push({name + "s": (np.array([42]), g[None, :])},
                                return_values=True).values[name + "s"][0]
            same += int(np.array_equal(dense, ref.w) and np.array_equal(row, ref.w))
        r.check(same == 3, "ftrl (%s): each of 3 pushes on a dense variable and on a sparse "
                "row has FtrlRef's bits" % label)


def test_stale(addr):
    a = Client([addr], worker=0)
    b = Client([addr], worker=1)
    a.create_variables([Variable("bs", (4,))], consistency="bounded_staleness", staleness=1)
    b.attach([Variable("bs", (4,))], consistency="bounded_staleness")
    a.pull(step=1)
    b.pull(step=1)
    b.pull(step=2)
    t0 = time.monotonic()
    try:
        b.pull(step=3, timeout=10)    # psd's --max-pull-wait answers
        r.check(False, "stale: worker 1 at clock 3 is held while worker 0 is at 1")
    except PsError as e:
        r.check(e.code == grpc.StatusCode.DEADLINE_EXCEEDED and "worker 0" in e.details,
                "stale: worker 1 at clock 3 is held while worker 0 is at 1 (staleness 1): "
                "%s after %.1f s" % (e.code.name, time.monotonic() - t0))
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("v", b.pull(step=3, timeout=10)))
    th.start()
    time.sleep(0.3)
    held = th.is_alive()
    a.pull(step=2)
    th.join(10)
    r.check(held and "v" in got, "stale: the held pull is answered once worker 0 pulls at 2")
    t0 = time.monotonic()
    a.pull()
    r.check(time.monotonic() - t0 < 0.5, "stale: a pull without step is never held")
    a.close()
    b.close()


def test_delta(c):
    c.create_variables([Variable("dl", (6,), Initializer.constant(1.0))],
                       optimizer=Optimizer.adam(0.1))
    d = np.arange(6, dtype=F32) / 4
    res = c.push({"dl": d}, delta=True, return_values=True)
    r.check(np.array_equal(res.values["dl"], F32(1) + d) and res.versions["dl"] == 1,
            "delta: push(delta=True) adds the change with no optimizer (Adam), version 1")


def refused(what, fn, exc):
    try:
        fn()
        r.check(False, "badinput: %s is refused" % what)
    except exc as e:
        r.check("'emb'" in str(e) or "'nope'" in str(e), "badinput: %s: %s" % (what, e))


def test_badinput(c):
    pushes = [s.sparse_rows_pushed for s in c.stats()]
    refused("float ids", lambda: c.sparse_pull({"emb": np.array([1.5])}), TypeError)
    refused("rows of dim 7", lambda: c.sparse_push(
        {"emb": (np.array([1, 2]), np.ones((2, 7), F32))}), ValueError)
    refused("float64 rows", lambda: c.sparse_push(
        {"emb": (np.array([1, 2]), np.ones((2, 8)))}), TypeError)
    refused("an unknown table", lambda: c.sparse_pull({"nope": np.array([1])}), KeyError)
    refused("float next_ids", lambda: c.sparse_pull({"emb": np.array([1])},
                                                    next_ids={"emb": np.array([1.5])}),
            TypeError)
    refused("next_ids of an unknown table",
            lambda: c.sparse_pull({"emb": np.array([1])}, next_ids={"nope": [1]}), KeyError)
    one = (np.array([1]), np.ones((1, 8), F32))
    refused("a push's float next_ids",
            lambda: c.sparse_push({"emb": one}, next_ids={"emb": np.array([1.5])}), TypeError)
    refused("a push's next_ids of an unknown table",
            lambda: c.sparse_push({"emb": one}, next_ids={"nope": [1]}), KeyError)
    refused("a push's next_ids of a table it does not push (test_ftrl's f15s pushed)",
            lambda: c.sparse_push({"f15s": (np.array([1]), np.ones((1, 33), F32))},
                                  next_ids={"emb": [1]}), ValueError)
    r.check([s.sparse_rows_pushed for s in c.stats()] == pushes,
            "badinput: nothing was pushed")


def main():
    ds = [psd("--worker-timeout", "5s", "--max-pull-wait", "1500ms") for _ in range(3)]
    c = Client([ds[0].address, ds[1].address])
    r.run((lambda: test_shards(c, test_adagrad(c)),
           lambda: test_membership([d.address for d in ds]),
           lambda: test_ftrl(c), lambda: test_badinput(c),
           lambda: test_stale(ds[2].address), lambda: test_delta(c)))
    c.close()
    pstest.stop_all(ds)
    r.finish()


if __name__ == "__main__":
    main()
