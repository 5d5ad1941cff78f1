"""Sparse tables with optimizer slots in float16 and bfloat16
(VariableSpec.slot_dtype; server/sparse.c, python/psclient/specs.py)
against numpy and a real psd on 127.0.0.1:0 in a temporary directory:

  train    psclient.Client pushes to tables of half slots (Adagrad with
           float32 rows and bf16 slots, with fp16 rows and slots; FTRL with
           bf16 rows and slots): each row equals, bit for bit, numpy's
           float32 update of the row widened from its stored dtypes with
           the value and the slots rounded to nearest even after each step
           (and the new row's slots rounded at the start); the same model
           without the slots' rounding does not match (the check can fail);
  size     ListVariables shows slot_dtype and rows of fewer bytes (48 for
           dim 8, fp16 rows and an fp16 accumulator, against 64); psctl
           list's DTYPE column says "float16, float16 slots";
  clamp    an fp16 accumulator past 65504 is stored as 65504 and counted
           in Stats.sparse_values_clamped;
  bad      slot_dtype on a dense variable, FLOAT16 slots with ADAM, slot
           dtype 7, another slot dtype for an existing table, a restore
           into FLOAT16 slots of a checkpoint with an ADAM table, and
           SparseTable(slot_dtype="f8"): refused naming the variable and the
           field, nothing changed;
  restore  a checkpoint keeps the slots' dtype and bits (the next update
           after a restore matches numpy's from the saved state);
           Restore with sparse_slot_dtype FLOAT32 converts each table of
           half slots (counted) and training goes on with float32 slots;
           psctl restore --sparse-slot-dtype bf16 converts them back;
  restart  the slots' dtype and bits are the same after psd restarts;
  layer    psclient.embedding.layer_lookup(slot_dtype="bf16") (what the torch
           and Keras layers call) creates the table with bf16 slots, and
           refuses one unlike a SparseTable's.

Prints ok/FAIL per check and "python-sparse-slots: N passed, N failed".
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
# numpy's float16 and a bfloat16 rounding written in numpy, test_sparse_half's
from test_sparse_half import from_bits, to_bits  # noqa: E402

F32 = np.float32
F32T, F16, BF16 = 1, 2, 3
DIM, LR, ACC0, EPS = 8, 0.05, 0.1, 1e-7
FLR, FL1, FL2 = 0.1, 0.01, 0.01   # FTRL's learning rate, l1 and l2
r = pstest.Results("python-sparse-slots")
pb = pbg = None   # pstest's stubs, made in main


def rnd(a, dtype):
    """a as stored in dtype (F32T: itself), widened back to float32."""
    a = np.asarray(a, F32)
    if dtype == F32T:
        return a.copy()
    return from_bits(to_bits(a, dtype), dtype).reshape(a.shape)


class Model:
    """numpy's Adagrad or FTRL on rows of one row dtype and one slot dtype,
    in float32 in the server's order of operations (server/optim.c), the
    value and (with round_slots) the slots rounded after each update."""

    def __init__(self, kind, row, slot, round_slots=True):
        self.kind, self.row_dt, self.slot_dt = kind, row, slot
        self.sr = slot if round_slots else F32T
        self.w, self.s = {}, {}   # id -> value; id -> [slot 0, slot 1]

    def copy(self, round_slots=True):
        m = Model(self.kind, self.row_dt, self.slot_dt, round_slots)
        m.w = {i: v.copy() for i, v in self.w.items()}
        m.s = {i: [x.copy() for x in v] for i, v in self.s.items()}
        return m

    def row(self, i):
        if i not in self.w:
            self.w[i] = rnd(np.full(DIM, 0.1, F32), self.row_dt)
            acc = rnd(np.full(DIM, ACC0, F32), self.sr)
            self.s[i] = [acc] if self.kind == "adagrad" else [acc, np.zeros(DIM, F32)]
        return self.w[i]

    def push(self, ids, g):
        for i, gi in zip(ids.tolist(), g.astype(F32)):   # distinct ids
            w = self.row(i)
            if self.kind == "adagrad":
                a = self.s[i][0] + gi * gi
                w = w - F32(LR) * gi / (np.sqrt(a) + F32(EPS))
                self.s[i] = [rnd(a, self.sr)]
            else:
                n, z = self.s[i]
                na = n + gi * gi
                pn, po = np.sqrt(na), np.sqrt(n)
                zi = z + (gi - (pn - po) / F32(FLR) * w)
                x = np.where(zi > 0, F32(FL1), F32(-FL1)) - zi
                y = pn / F32(FLR) + F32(2.0) * (F32(FL2) + F32(0.0) / (F32(2.0) * F32(FLR)))
                w = np.where(np.abs(zi) > F32(FL1), x / y, F32(0)).astype(F32)
                self.s[i] = [rnd(na, self.sr), rnd(zi, self.sr)]
            self.w[i] = rnd(w, self.row_dt)

    def rows(self, ids):
        """The rows of ids as a pull answers them, storing none."""
        return np.stack([self.w[int(i)] if int(i) in self.w
                         else rnd(np.full(DIM, 0.1, F32), self.row_dt) for i in ids])


TABLES = {   # name: (optimizer, row dtype, slot dtype)
    "a32b": ("adagrad", F32T, BF16),
    "a16h": ("adagrad", F16, F16),
    "fbb": ("ftrl", BF16, BF16),
}
NAMES = {F32T: "f32", F16: "fp16", BF16: "bf16"}


def table(name, slot=None):
    kind, row, sl = TABLES[name]
    opt = (Optimizer.adagrad(LR, ACC0, EPS) if kind == "adagrad"
           else Optimizer.ftrl(FLR, -0.5, ACC0, FL1, FL2))
    return SparseTable(name, DIM, Initializer.constant(0.1), opt, row_dtype=NAMES[row],
                       slot_dtype=NAMES[slot or sl])


def stats(stub):
    return stub.Stats(pb.StatsRequest(), timeout=10)


def info(c):
    return {v.spec.name: v for v in c.list_variables()}


def train(c, models, rng, universe, steps, tag):
    """steps pushes of 40 distinct ids to every table, each checked exactly
    against its model; returns whether the unrounded-slots models missed."""
    plain = {n: m.copy(round_slots=False) for n, m in models.items()}
    for _ in range(steps):
        ids = rng.choice(universe, 40, replace=False)
        g = (rng.standard_normal((40, DIM)) * 0.7).astype(F32)
        for name, m in models.items():
            # The client sends a half table's gradient in its row dtype.
            gg = rnd(g, m.row_dt)
            m.push(ids, gg)
            plain[name].push(ids, gg)
            c.sparse_push({name: (ids, g)})
    for name, m in models.items():
        got = c.sparse_pull({name: universe})[name]
        want = m.rows(universe)
        same = np.array_equal(got, want)
        r.check(same, "%s: %s (%s rows, %s slots, %s) equals numpy's float32 update with "
                "the slots rounded each step, bit for bit (%d of %d values differ)"
                % (tag, name, NAMES[m.row_dt], NAMES[m.slot_dt], m.kind,
                   int(np.sum(got != want)), got.size))
        if steps >= 4:
            r.check(not np.array_equal(got, plain[name].rows(universe)),
                    "%s: %s differs from the same model without the slots' rounding "
                    "(the check above can fail)" % (tag, name))


def test_size(c, d):
    i = info(c)
    r.check(i["a16h"].spec.slot_dtype == pb.DTYPE_FLOAT16
            and i["fbb"].spec.slot_dtype == pb.DTYPE_BFLOAT16
            and i["a16h"].sparse_disk_bytes == i["a16h"].sparse_rows * (16 + 16 + 16)
            and i["a32b"].sparse_disk_bytes == i["a32b"].sparse_rows * (16 + 32 + 16)
            and i["fbb"].sparse_disk_bytes == i["fbb"].sparse_rows * (16 + 16 + 32),
            "size: ListVariables shows slot_dtype; rows of 48 bytes (16 head, 8 fp16 values, "
            "8 fp16 accumulators; 64 with float32 slots): %d rows, %d bytes"
            % (i["a16h"].sparse_rows, i["a16h"].sparse_disk_bytes))
    psctl = os.path.join(pstest.BUILD_ROOT, "tools", "psctl")
    p = subprocess.run([psctl, "list", "--server", d.address], capture_output=True,
                       text=True, timeout=60)
    line = [x for x in p.stdout.splitlines() if x.startswith("a16h ")]
    r.check(p.returncode == 0 and len(line) == 1 and "float16, float16 slots" in line[0],
            "size: psctl list's DTYPE column: %r" % (line or p.stderr.strip()))


def test_clamp(c, stub):
    c.create_sparse_tables([SparseTable("clamp", DIM, slot_dtype="fp16")],
                           optimizer=Optimizer.adagrad(LR, ACC0, EPS))
    before = stats(stub).sparse_values_clamped
    ids = np.array([5])
    c.sparse_push({"clamp": (ids, np.full((1, DIM), 300.0, F32))})
    w1 = c.sparse_pull({"clamp": ids})["clamp"]
    c.sparse_push({"clamp": (ids, np.ones((1, DIM), F32))})
    w2 = c.sparse_pull({"clamp": ids})["clamp"]
    # The accumulator read back is 65504 (not 90000.1): the next step divides
    # by sqrt(65504 + 1).
    want = w1 - F32(LR) * F32(1) / (np.sqrt(F32(65504) + F32(1)) + F32(EPS))
    r.check(stats(stub).sparse_values_clamped == before + DIM and np.array_equal(w2, want),
            "clamp: an fp16 accumulator of 90000.1 is stored as 65504 and counted (%d)"
            % (stats(stub).sparse_values_clamped - before))
    # SGD has no slots: its rows are as without slot_dtype, and a restore into
    # another slot dtype leaves it alone (test_restore).
    c.create_sparse_tables([SparseTable("sgd", DIM, slot_dtype="bf16")],
                           optimizer=Optimizer.sgd(0.1))
    c.sparse_push({"sgd": (ids, np.ones((1, DIM), F32))})
    i = info(c)["sgd"]
    r.check(i.sparse_disk_bytes == 16 + DIM * 4 and np.array_equal(
        c.sparse_pull({"sgd": ids})["sgd"], np.full((1, DIM), -0.1, F32)),
            "clamp: an SGD table with slot_dtype bf16 stores 48-byte rows, no slots")


def test_bad(c, stub):
    code = grpc.StatusCode.INVALID_ARGUMENT
    before = c.sparse_pull({"a16h": np.arange(10)})["a16h"]
    spec = pb.VariableSpec.FromString(
        SparseTable("d16", 4).to_pb(Optimizer.sgd(0.1)).SerializeToString())
    spec.sparse = False
    spec.slot_dtype = pb.DTYPE_BFLOAT16
    r.refused("bad: slot_dtype on a dense variable", lambda: stub.CreateVariable(
        pb.CreateVariableRequest(spec=spec), timeout=10), code, "'d16'", "slot_dtype")
    adam = pb.VariableSpec.FromString(SparseTable("ad16", DIM, slot_dtype="fp16").to_pb(
        Optimizer.adam(0.01)).SerializeToString())
    r.refused("bad: FLOAT16 slots with ADAM", lambda: stub.CreateVariable(
        pb.CreateVariableRequest(spec=adam), timeout=10), code, "'ad16'", "slot_dtype",
        "ADAM")
    seven = pb.VariableSpec.FromString(SparseTable("s7", DIM).to_pb(
        Optimizer.sgd(0.1)).SerializeToString())
    seven.slot_dtype = 7
    r.refused("bad: slot_dtype 7", lambda: stub.CreateVariable(
        pb.CreateVariableRequest(spec=seven), timeout=10), grpc.StatusCode.UNIMPLEMENTED,
        "'s7'", "slot_dtype 7")
    other = pb.VariableSpec.FromString(table("a16h", BF16).to_pb(
        Optimizer.sgd()).SerializeToString())
    r.refused("bad: an existing table again with other slots", lambda: stub.CreateVariable(
        pb.CreateVariableRequest(spec=other), timeout=10), grpc.StatusCode.ALREADY_EXISTS,
        "'a16h'")
    try:
        SparseTable("x", 4, slot_dtype="f8")
        r.check(False, "bad: SparseTable(slot_dtype='f8') is refused")
    except ValueError as e:
        r.check("slot_dtype" in str(e), "bad: SparseTable(slot_dtype='f8'): %s" % e)
    names = {v.spec.name for v in c.list_variables()}
    r.check(np.array_equal(c.sparse_pull({"a16h": np.arange(10)})["a16h"], before)
            and not names & {"d16", "ad16", "s7"},
            "bad: nothing created, no row changed")


def test_restore(c, stub, d, models, rng, universe):
    c.checkpoint(step=100)
    base = {n: m.copy() for n, m in models.items()}
    train(c, models, rng, universe, 2, "before restore")
    back = c.restore(100)
    # From the checkpoint's state: the rows, and the slots, which the next
    # update reads.
    train(c, {n: m.copy() for n, m in base.items()}, np.random.default_rng(11), universe, 2,
          "restore")
    r.check(back[0].sparse_tables_converted == 0,
            "restore: as saved, nothing converted")
    c.restore(100)
    plain = {n: m.copy() for n, m in base.items()}
    resp = stub.Restore(pb.RestoreRequest(step=100, sparse_slot_dtype=pb.DTYPE_FLOAT32),
                        timeout=60)
    i = info(c)
    half = list(TABLES) + ["clamp"]   # every table of the checkpoint has half slots
    rows = sum(i[n].sparse_rows for n in half)
    r.check(resp.sparse_tables_converted == 4 and resp.sparse_rows_converted == rows
            and all(i[n].spec.slot_dtype == 0 for n in half)
            and i["a16h"].sparse_disk_bytes == i["a16h"].sparse_rows * 64,
            "restore: into float32 slots converts the 4 tables (%d said, %d rows of %d), "
            "not SGD's, which has no slots" % (resp.sparse_tables_converted,
                                               resp.sparse_rows_converted, rows))
    for m in plain.values():   # widened exactly; from now on float32 slots
        m.slot_dt = m.sr = F32T
    train(c, plain, np.random.default_rng(12), universe, 2, "restore f32")
    code = grpc.StatusCode.INVALID_ARGUMENT
    c.create_sparse_tables([SparseTable("adam", DIM, slot_dtype="bf16")],
                           optimizer=Optimizer.adam(0.01))
    c.sparse_push({"adam": (np.arange(4), np.ones((4, DIM), F32))})
    c.checkpoint(step=200)
    keep = c.sparse_pull({"adam": np.arange(4)})["adam"]
    r.refused("restore: FLOAT16 slots for a checkpoint with an ADAM table",
              lambda: stub.Restore(pb.RestoreRequest(step=200,
                                                     sparse_slot_dtype=pb.DTYPE_FLOAT16),
                                   timeout=60), code, "'adam'", "ADAM", "unchanged")
    r.refused("restore: sparse_slot_dtype 7", lambda: stub.Restore(pb.RestoreRequest(
        step=100, sparse_slot_dtype=7), timeout=10), code, "sparse_slot_dtype 7")
    r.check(np.array_equal(c.sparse_pull({"adam": np.arange(4)})["adam"], keep)
            and info(c)["adam"].spec.slot_dtype == pb.DTYPE_BFLOAT16,
            "restore: refused, the variables are unchanged")
    psctl = os.path.join(pstest.BUILD_ROOT, "tools", "psctl")
    p = subprocess.run([psctl, "restore", "--server", d.address, "--step", "100",
                        "--sparse-slot-dtype", "bf16"], capture_output=True, text=True,
                       timeout=60)
    i = info(c)
    # The fp16 tables of the checkpoint (a16h, clamp) convert, the bf16 ones not.
    r.check(p.returncode == 0 and "(2 sparse table(s), %d rows" % (
                i["a16h"].sparse_rows + i["clamp"].sparse_rows) in p.stdout
            and i["a16h"].spec.slot_dtype == pb.DTYPE_BFLOAT16
            and i["a16h"].sparse_disk_bytes == i["a16h"].sparse_rows * 48,
            "restore: psctl restore --sparse-slot-dtype bf16 converts the fp16 slots: %r"
            % (p.stdout.strip() or p.stderr.strip()))
    conv = {n: m.copy() for n, m in base.items()}
    for m in conv.values():   # the checkpoint's slots rounded to bfloat16 once
        m.slot_dt = m.sr = BF16
        m.s = {i: [rnd(x, BF16) for x in v] for i, v in m.s.items()}
    train(c, conv, np.random.default_rng(13), universe, 2, "restore bf16")
    return conv


def test_restart(data, universe, models):
    d = pstest.start_psd(data)
    c = Client([d.address])
    c.attach_sparse([table(n) for n in TABLES])
    i = info(c)
    r.check(i["a16h"].spec.slot_dtype == pb.DTYPE_BFLOAT16
            and i["a32b"].spec.slot_dtype == pb.DTYPE_BFLOAT16,
            "restart: the slots' dtype is kept")
    train(c, models, np.random.default_rng(14), universe, 2, "restart")
    lk = pemb.layer_lookup("ShardedEmbedding", c, "lay", 4, padding_idx=None, offset=0,
                           hash_salt=None, optimizer=Optimizer.adagrad(), create=True, seed=1,
                           slot_dtype="bf16")
    lk.close()
    r.check(info(c)["lay"].spec.slot_dtype == pb.DTYPE_BFLOAT16,
            "layer: layer_lookup(slot_dtype='bf16') creates the table with bf16 slots")
    try:
        pemb.layer_lookup("ShardedEmbedding", c, table("a16h"), None, padding_idx=None,
                          offset=0, hash_salt=None, optimizer=None, create=False, seed=0,
                          slot_dtype="f32")
        r.check(False, "layer: a slot_dtype unlike the SparseTable's is refused")
    except ValueError as e:
        r.check("slot_dtype" in str(e) and "a16h" in str(e),
                "layer: a slot_dtype unlike the SparseTable's is refused: %s" % e)
    c.close()
    pstest.stop_all([d])


def main():
    global pb, pbg
    data = pstest.tmpdir("pyslots-")
    pb, pbg, _, _ = pstest.generate_stubs()
    d = pstest.start_psd(data)
    c = Client([d.address])
    stub = pbg.ParameterServerStub(pstest.channel(d.address))
    c.create_sparse_tables([table(n) for n in TABLES])
    models = {n: Model(k, row, sl) for n, (k, row, sl) in TABLES.items()}
    rng = np.random.default_rng(5)
    universe = rng.choice(np.arange(-2 ** 40, 2 ** 40, 2 ** 33), 100, replace=False)
    r.run((lambda: train(c, models, rng, universe, 6, "train"),
           lambda: test_size(c, d),
           lambda: test_clamp(c, stub),
           lambda: test_bad(c, stub)))
    out = {}
    r.run((lambda: out.update(m=test_restore(c, stub, d, models, rng, universe)),))
    c.close()
    d.stop()
    if "m" in out:
        r.run((lambda: test_restart(data, universe, out["m"]),))
    r.finish()


if __name__ == "__main__":
    main()
