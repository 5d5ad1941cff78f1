"""Sparse tables with rows in float16 and bfloat16 (VariableSpec.row_dtype;
server/sparse.c, sparse_rpc.c, python/psclient/sparse.py) against numpy and
a real psd on 127.0.0.1:0 in a temporary directory:

  train    psclient.Client pushes to an fp16 and a bf16 table (Adagrad):
           each row is numpy's update of the summed, half-rounded gradient
           computed in float32, its value rounded to nearest even (numpy's
           float16, a bfloat16 rounding written in numpy), within one step
           of the row dtype and mostly bit for bit;
  wire     SparsePull answers the stored bits (FLOAT16, 2 bytes a value)
           unless FLOAT32 is asked (the same values widened); a float32
           gradient is taken too; Stats counts half pulls and pushes;
           ListVariables shows row_dtype and rows of fewer bytes;
  bad      a gradient whose dtype is not the declared one, a half gradient
           of another dtype than the rows', NaN or Inf in half, a pull of
           a half dtype that is not the rows': INVALID_ARGUMENT naming the
           table, no row changed;
  restore  a checkpoint keeps the rows' dtype and bits (after a restart
           too); Restore with sparse_row_dtype (and psctl restore
           --sparse-row-dtype) converts each table of another dtype (counted
           in the answer) and its rows equal numpy's conversion of the
           checkpoint's;
  layer    psclient.embedding.layer_lookup(row_dtype="bf16") (what the
           torch and Keras layers call) creates the table with bf16 rows.

Prints ok/FAIL per check and "python-sparse-half: N passed, N failed".
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pyenv  # noqa: E402
pyenv.reexec()  # Debian's python3 and the package in build/venv-py

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import pstest  # noqa: E402
from psclient import Client, Initializer, Optimizer, SparseTable  # noqa: E402
from psclient import embedding as pemb  # noqa: E402

F32 = np.float32
F16, BF16 = 2, 3
DIM, LR, ACC0, EPS = 8, 0.05, 0.1, 1e-7
r = pstest.Results("python-sparse-half")
pb = pbg = None   # pstest's stubs, made in main


def to_bits(a, dtype):
    """numpy's float16 (finite overflow clamped) or bfloat16 rounding."""
    a = np.ascontiguousarray(a, dtype="<f4")
    if dtype == F16:
        a = np.where(np.isfinite(a) & (np.abs(a) >= 65520), np.copysign(F32(65504), a), a)
        return a.astype("<f4").astype("<f2").view("<u2")
    u = a.view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def from_bits(bits, dtype):
    bits = np.ascontiguousarray(bits, dtype="<u2")
    if dtype == F16:
        return bits.view("<f2").astype("<f4")
    return (bits.astype("<u4") << 16).view("<f4")


def rnd(a, dtype):
    return from_bits(to_bits(a, dtype), dtype).reshape(np.shape(a))


def ulp(a, dtype):
    """One step of dtype at |a| (float16: 2^-10 of the binade, bfloat16 2^-7)."""
    e = np.floor(np.log2(np.maximum(np.abs(a), 1e-30)))
    return np.exp2(e - (10 if dtype == F16 else 7)).astype(F32)


class Model:
    """numpy's Adagrad on rows of one dtype: float32 arithmetic, the value
    rounded after each update."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.w, self.a = {}, {}

    def row(self, i):
        if i not in self.w:
            self.w[i] = rnd(np.full(DIM, 0.1, F32), self.dtype)
            self.a[i] = np.full(DIM, ACC0, F32)
        return self.w[i]

    def push(self, ids, g):
        summed = {}
        for i, row in zip(ids.tolist(), g):
            summed[i] = summed[i] + row if i in summed else row.astype(F32)
        for i, s in summed.items():
            self.row(i)
            self.a[i] = self.a[i] + s * s
            self.w[i] = rnd(self.w[i] - F32(LR) * s / (np.sqrt(self.a[i]) + F32(EPS)),
                            self.dtype)

    def rows(self, ids):
        return np.stack([self.row(int(i)) for i in ids])


def close(got, want, dtype):
    """(every value within one step of dtype, the share equal bit for bit)."""
    near = bool(np.all(np.abs(got - want) <= ulp(want, dtype)))
    return near, float(np.mean(got == want))


def raw_pull(stub, name, ids, dtype=0):
    resp = stub.SparsePull(pb.SparsePullRequest(items=[pb.SparsePullItem(
        name=name, ids=list(ids), dtype=dtype)]), timeout=10)
    return resp.rows[0].values


def stats(stub):
    return stub.Stats(pb.StatsRequest(), timeout=10)


def test_train(c, models, rng):
    universe = rng.integers(-2 ** 40, 2 ** 40, 100)
    for step in range(6):
        ids = rng.choice(universe, 200)
        g = (rng.standard_normal((200, DIM)) * 0.5).astype(F32)
        for name, m in models.items():
            # The client sends a half table's gradient in its dtype.
            m.push(ids, rnd(g, m.dtype))
            c.sparse_push({name: (ids, g)})
    for name, m in models.items():
        got = c.sparse_pull({name: universe})[name]
        near, same = close(got, m.rows(universe), m.dtype)
        r.check(got.dtype == F32 and near and same > 0.9,
                "train: %s rows after 6 pushes of 200 repeated ids: numpy's float32 "
                "Adagrad rounded to the row dtype (within one step, %.1f%% bit for bit)"
                % (name, 100 * same))
    return universe


def test_wire(c, stub, models, universe):
    m = models["h16"]
    ids = universe[:20]
    t = raw_pull(stub, "h16", ids)
    want = m.rows(ids)
    bits = np.frombuffer(t.data, "<u2").reshape(len(ids), DIM)
    r.check(t.dtype == pb.DTYPE_FLOAT16 and len(t.data) == 2 * len(ids) * DIM
            and list(t.shape) == [len(ids), DIM]
            and close(from_bits(bits, F16).reshape(want.shape), want, F16)[0],
            "wire: SparsePull answers an fp16 table's rows as FLOAT16, 2 bytes a value")
    t32 = raw_pull(stub, "h16", ids, pb.DTYPE_FLOAT32)
    r.check(t32.dtype == pb.DTYPE_FLOAT32 and np.array_equal(
        np.frombuffer(t32.data, "<f4").reshape(len(ids), DIM),
        from_bits(bits, F16).reshape(len(ids), DIM)),
            "wire: asked FLOAT32, the same rows widened exactly")
    before = stats(stub)
    g = (np.arange(2 * DIM, dtype=F32).reshape(2, DIM) - 5) / 7
    two = np.array([int(ids[0]), int(ids[1])])
    stub.SparsePush(pb.SparsePushRequest(step=50, grads=[pb.SparseGradient(
        name="h16", ids=two.tolist(), grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2, DIM],
                                                     data=g.tobytes()))]), timeout=10)
    m.push(two, g)
    after = stats(stub)
    got = c.sparse_pull({"h16": two})["h16"]
    r.check(close(got, m.rows(two), F16)[0] and after.half_pushes == before.half_pushes,
            "wire: a FLOAT32 gradient to an fp16 table is applied unrounded "
            "(half_pushes unchanged)")
    c.sparse_push({"h16": (two, g)})
    m.push(two, rnd(g, F16))
    r.check(stats(stub).half_pushes == after.half_pushes + 1 and after.half_pulls > 0,
            "wire: Stats counts the client's FLOAT16 push (%d) and the half pulls (%d)"
            % (stats(stub).half_pushes, after.half_pulls))
    info = {v.spec.name: v for v in c.list_variables()}
    r.check(info["h16"].spec.row_dtype == pb.DTYPE_FLOAT16
            and info["hb"].spec.row_dtype == pb.DTYPE_BFLOAT16
            and info["h16"].sparse_disk_bytes == info["h16"].sparse_rows * (16 + 16 + 32),
            "wire: ListVariables shows row_dtype, and %d rows of 64 bytes (16 head, 8 fp16 "
            "values, 8 float32 Adagrad slots): %d bytes"
            % (info["h16"].sparse_rows, info["h16"].sparse_disk_bytes))


def test_bad(c, stub, models, universe):
    ids = [int(universe[0]), int(universe[1])]
    before = raw_pull(stub, "h16", ids).data
    pushed = stats(stub).sparse_rows_pushed

    def push(dtype, bits, wire=0, name="h16"):
        return lambda: stub.SparsePush(pb.SparsePushRequest(wire_dtype=wire, grads=[
            pb.SparseGradient(name=name, ids=ids, grad=pb.Tensor(
                dtype=dtype, shape=[2, DIM], data=bits.tobytes()))]), timeout=10)
    ok16 = np.full(2 * DIM, 0x3c00, "<u2")           # 1.0
    nan = ok16.copy()
    nan[3] = 0x7e00
    inf = ok16.copy()
    inf[5] = 0xfc00                                  # -Inf
    code = grpc.StatusCode.INVALID_ARGUMENT
    r.refused("bad: a FLOAT16 gradient the push declares FLOAT32",
              push(pb.DTYPE_FLOAT16, ok16), code, "'h16'", "declares FLOAT32")
    r.refused("bad: a BFLOAT16 gradient to fp16 rows", push(pb.DTYPE_BFLOAT16, ok16,
              pb.DTYPE_BFLOAT16), code, "'h16'", "rows are FLOAT16")
    r.refused("bad: NaN in a FLOAT16 gradient", push(pb.DTYPE_FLOAT16, nan, pb.DTYPE_FLOAT16),
              code, "'h16'", "NaN or Inf")
    r.refused("bad: -Inf in a FLOAT16 gradient", push(pb.DTYPE_FLOAT16, inf, pb.DTYPE_FLOAT16),
              code, "'h16'", "NaN or Inf")
    r.refused("bad: a FLOAT16 gradient of the wrong size",
              push(pb.DTYPE_FLOAT16, ok16[:-1], pb.DTYPE_FLOAT16), code, "'h16'", "bytes")
    r.refused("bad: a BFLOAT16 pull of fp16 rows",
              lambda: raw_pull(stub, "h16", ids, pb.DTYPE_BFLOAT16), code, "'h16'",
              "rows are FLOAT16")
    spec = pb.VariableSpec.FromString(   # psclient's class, as this test's stubs'
        SparseTable("d16", 4).to_pb(Optimizer.sgd(0.1)).SerializeToString())
    spec.sparse = False
    spec.row_dtype = pb.DTYPE_FLOAT16
    r.refused("bad: row_dtype on a dense variable", lambda: stub.CreateVariable(
        pb.CreateVariableRequest(spec=spec), timeout=10), code, "'d16'", "row_dtype")
    r.check(raw_pull(stub, "h16", ids).data == before
            and stats(stub).sparse_rows_pushed == pushed,
            "bad: no row changed, nothing counted as pushed")


def test_restore(c, stub, models, universe, data):
    m16 = models["h16"]
    c.checkpoint(step=100)
    saved = {n: c.sparse_pull({n: universe})[n] for n in ("h16", "hb")}
    c.sparse_push({"h16": (universe[:10], np.ones((10, DIM), F32)),
                   "hb": (universe[:10], np.ones((10, DIM), F32))})
    back = c.restore(100)
    now = {n: c.sparse_pull({n: universe})[n] for n in ("h16", "hb")}
    r.check(all(np.array_equal(now[n], saved[n]) for n in saved) and back[0].step == 100,
            "restore: the checkpoint's fp16 and bf16 rows come back bit for bit")
    resp = stub.Restore(pb.RestoreRequest(step=100, sparse_row_dtype=pb.DTYPE_FLOAT32),
                        timeout=60)
    info = {v.spec.name: v for v in c.list_variables()}
    t32 = raw_pull(stub, "h16", universe)
    r.check(resp.sparse_tables_converted == 2
            and resp.sparse_rows_converted == info["h16"].sparse_rows + info["hb"].sparse_rows
            and info["h16"].spec.row_dtype == 0 and t32.dtype == pb.DTYPE_FLOAT32
            and np.array_equal(np.frombuffer(t32.data, "<f4").reshape(-1, DIM), saved["h16"]),
            "restore: into float32 converts both tables (%d tables, %d rows said), exactly"
            % (resp.sparse_tables_converted, resp.sparse_rows_converted))
    resp = stub.Restore(pb.RestoreRequest(step=100, sparse_row_dtype=pb.DTYPE_BFLOAT16),
                        timeout=60)
    tb = raw_pull(stub, "h16", universe)
    want = to_bits(saved["h16"].reshape(-1), BF16)
    r.check(resp.sparse_tables_converted == 1 and tb.dtype == pb.DTYPE_BFLOAT16
            and np.array_equal(np.frombuffer(tb.data, "<u2"), want),
            "restore: into bf16 converts the fp16 table only (%d), its rows numpy's "
            "bfloat16 rounding of the checkpoint's" % resp.sparse_tables_converted)
    r.refused("restore: sparse_row_dtype 7", lambda: stub.Restore(pb.RestoreRequest(
        step=100, sparse_row_dtype=7), timeout=10), grpc.StatusCode.INVALID_ARGUMENT,
        "sparse_row_dtype")
    ids = universe[:5]
    g = np.full((5, DIM), 0.25, F32)
    c.attach_sparse([SparseTable("h16", DIM, row_dtype="bf16")])
    mbh = Model(BF16)
    mbh.w = {int(i): from_bits(to_bits(saved["h16"][k], BF16), BF16)
             for k, i in enumerate(universe)}
    mbh.a = dict(m16.a)
    c.sparse_push({"h16": (ids, g)})
    mbh.push(ids, rnd(g, BF16))
    r.check(close(c.sparse_pull({"h16": ids})["h16"], mbh.rows(ids), BF16)[0],
            "restore: the converted table trains on, in bf16")
    psctl = os.path.join(pstest.BUILD_ROOT, "tools", "psctl")
    p = subprocess.run([psctl, "restore", "--server", c.shards[0].conn.address, "--step",
                        "100", "--sparse-row-dtype", "bf16"], capture_output=True, text=True,
                       timeout=60)
    r.check(p.returncode == 0 and "(1 sparse table(s), %d rows converted"
            % info["h16"].sparse_rows in p.stdout and np.array_equal(
                np.frombuffer(raw_pull(stub, "h16", universe).data, "<u2"), want),
            "restore: psctl restore --sparse-row-dtype bf16 converts the fp16 table: %r"
            % (p.stdout.strip() or p.stderr.strip()))


def test_restart(data, universe):
    d = pstest.Daemon([pstest.psd_path(), "--data-dir", data, "--listen", "127.0.0.1:0",
                       "--log-level", "warn"])
    c = Client([d.address])
    c.attach_sparse([SparseTable("hb", DIM, row_dtype="bf16")])
    before = c.sparse_pull({"hb": universe})["hb"]
    c.close()
    d.stop()
    d = pstest.Daemon([pstest.psd_path(), "--data-dir", data, "--listen", "127.0.0.1:0",
                       "--log-level", "warn"])
    c = Client([d.address])
    c.attach_sparse([SparseTable("hb", DIM, row_dtype="bf16")])
    after = c.sparse_pull({"hb": universe})["hb"]
    info = {v.spec.name: v for v in c.list_variables()}
    r.check(np.array_equal(before, after) and info["hb"].spec.row_dtype == pb.DTYPE_BFLOAT16,
            "restart: bf16 rows and their dtype are the same after psd restarts")
    lk = pemb.layer_lookup("ShardedEmbedding", c, "lay", 4, padding_idx=None, offset=0,
                           hash_salt=None, optimizer=None, create=True, seed=1,
                           row_dtype="bf16")
    info = {v.spec.name: v for v in c.list_variables()}
    r.check(info["lay"].spec.row_dtype == pb.DTYPE_BFLOAT16
            and c.sparse_pull({"lay": np.array([3])})["lay"].shape == (1, 4),
            "layer: layer_lookup(row_dtype='bf16') creates the table with bf16 rows")
    lk.close()
    c.close()
    d.stop()


def main():
    global pb, pbg
    pb, pbg, _, _ = pstest.generate_stubs()
    data = pstest.tmpdir("pyhalf-")
    d = pstest.Daemon([pstest.psd_path(), "--data-dir", data, "--listen", "127.0.0.1:0",
                       "--log-level", "warn"])
    c = Client([d.address])
    stub = pbg.ParameterServerStub(pstest.channel(d.address))
    c.create_sparse_tables(
        [SparseTable("h16", DIM, Initializer.constant(0.1), row_dtype="fp16"),
         SparseTable("hb", DIM, Initializer.constant(0.1), row_dtype="bf16")],
        optimizer=Optimizer.adagrad(LR, ACC0, EPS))
    models = {"h16": Model(F16), "hb": Model(BF16)}
    rng = np.random.default_rng(5)
    universe = test_train(c, models, rng)
    r.run((lambda: test_wire(c, stub, models, universe),
           lambda: test_bad(c, stub, models, universe),
           lambda: test_restore(c, stub, models, universe, data)))
    c.close()
    d.stop()
    r.run((lambda: test_restart(data, universe),))
    r.finish()


if __name__ == "__main__":
    main()
