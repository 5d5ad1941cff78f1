"""Half precision on the wire (PushRequest.wire_dtype, PullItem.wire_dtype;
common/half.h, server/wirehalf.c, python/psclient/half.py), against numpy
and a real psd on 127.0.0.1:0 in a temporary directory:

  convert   libpsclient's conversions (ctypes; the dispatched kernels and
            the portable C) equal numpy's float16 (with float16's finite
            overflow clamped to 65504, and counted) and a bfloat16 rounding
            written in numpy (round to nearest even on float32's bits), on
            random values at many scales and the edges; psclient.half
            equals the same oracle;
  feedback  error feedback's invariant, in C (ps_half_encode_ef) and in
            psclient.half.ErrorFeedback: after 300 steps the sum of what
            was sent plus the residual equals the sum of the true gradients
            (within float32 rounding), while rounding alone drifts;
  pull      psd's values pulled as FLOAT16 and BFLOAT16 are numpy's
            conversions of the float32 value, bit for bit; a value beyond
            float16 comes as 65504 and Stats.wire_clamped counts it;
  push      a BFLOAT16 and a FLOAT16 gradient (SGD, lr 0.5) leave the
            value numpy computes from the widened gradient;
  bad       a Tensor dtype that is not the push's wire_dtype, a half
            gradient to a float32_only variable, NaN or Inf in half, a
            Pull mixing wire dtypes: INVALID_ARGUMENT naming the variable,
            the value and version unchanged;
  client    psclient.Client(wire_dtype="bf16") trains a least-squares model
            to the float32 client's loss; Stats.half_pushes counts;
  failed    a bf16 push psd refuses (after applying its first gradient; for
            a NaN, applying none) leaves in the residuals what psd did not
            apply: on a grid where the arithmetic is exact, psd's change
            plus the residual equals the sum of the gradients bit for bit,
            and the next push sends what the failed one owed;
  workerd   workerd --wire-dtype bf16 --shm off (libpsclient's half push
            and pull, error feedback) on a fresh psd: every push and pull
            in half (Stats), the model learns (test accuracy > 0.75); with
            shared memory (psd's default socket) the wire stays float32.

Prints ok/FAIL per check and "half: N passed, N failed".
"""
import ctypes
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pyenv  # noqa: E402

pyenv.reexec()

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import pstest  # noqa: E402
from psclient import Client, Initializer, Optimizer, PsError, Variable  # noqa: E402
from psclient import half as phalf  # noqa: E402

r = pstest.Results("half")
pb = pbg = None
F16, BF16 = 2, 3


def oracle(a, dtype):
    """numpy's float16 (finite overflow clamped) or bfloat16 rounding."""
    a = np.ascontiguousarray(a, dtype="<f4")
    if dtype == F16:
        over = np.isfinite(a) & (np.abs(a) >= 65520)
        c = np.where(over, np.copysign(np.float32(65504), a), a).astype("<f4")
        with np.errstate(over="ignore"):
            return c.astype("<f2").view("<u2"), int(over.sum())
    u = a.view("<u4").astype(np.uint64)
    out = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    nan = np.isnan(a)
    out[nan] = ((u[nan] >> 16) | 0x40).astype("<u2")
    return out, 0


def oracle_back(bits, dtype):
    if dtype == F16:
        return bits.view("<f2").astype("<f4")
    return (bits.astype("<u4") << 16).view("<f4")


def sample(n, seed=1):
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.integers(-9, 6, n)
    a = (rng.standard_normal(n) * scales).astype("<f4")
    a[: n // 5] = rng.integers(0, 2 ** 32, n // 5, dtype=np.uint64).astype("<u4").view("<f4")
    edges = np.array([0, -0.0, np.inf, -np.inf, 65504, 65519.99, 65520, -7e4, 1e9,
                      6e-8, 3e-8, 2.98e-8, 6.1e-5, 1.00048828125, 3.4e38, 1.1754e-38,
                      1 + 2 ** -8, 1 + 3 * 2 ** -8], dtype="<f4")
    a[: len(edges)] = edges
    return a


def lib():
    path = os.path.join(pstest.BUILD_ROOT, "client", "libpsclient.so")
    so = ctypes.CDLL(path)
    p = ctypes.c_void_p
    for name in ("ps_half_from_f32", "ps_half_from_f32_portable"):
        getattr(so, name).argtypes = [ctypes.c_int, p, p, ctypes.c_size_t]
        getattr(so, name).restype = ctypes.c_size_t
    so.ps_half_to_f32.argtypes = [ctypes.c_int, p, p, ctypes.c_size_t]
    so.ps_half_encode_ef.argtypes = [ctypes.c_int, p, p, p, ctypes.c_size_t]
    so.ps_half_encode_ef.restype = ctypes.c_size_t
    so.ps_half_kernel.argtypes = [ctypes.c_int, ctypes.c_bool]
    so.ps_half_kernel.restype = ctypes.c_char_p
    return so


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def same_bits(got, want, a, dtype):
    """Bit equality; a NaN only needs to stay a NaN; AVX512-BF16 reads
    float32 subnormals as zero (common/half.h)."""
    ok = got == want
    back_g, back_w = oracle_back(got, dtype), oracle_back(want, dtype)
    ok |= np.isnan(back_g) & np.isnan(back_w)
    if dtype == BF16:
        sub = (a != 0) & (np.abs(a) < np.float32(1.17549435e-38))
        ok |= sub & ((got & 0x7FFF) == 0)
    return bool(ok.all()), int((~ok).sum())


def check_convert(so):
    a = sample(200003)
    for dtype, nm in ((F16, "float16"), (BF16, "bfloat16")):
        want, wclamp = oracle(a, dtype)
        for fn in ("ps_half_from_f32", "ps_half_from_f32_portable"):
            out = np.zeros(a.size, "<u2")
            c = getattr(so, fn)(dtype, ptr(a), ptr(out), a.size)
            ok, bad = same_bits(out, want, a, dtype)
            kern = so.ps_half_kernel(dtype, False).decode() if fn == "ps_half_from_f32" \
                else "portable"
            r.check(ok and c == wclamp, "convert: %s %s equals numpy on %d values (%d "
                    "differ; clamped %d, numpy's %d)" % (nm, kern, a.size, bad, c, wclamp))
        back = np.zeros(a.size, "<f4")
        so.ps_half_to_f32(dtype, ptr(want), ptr(back), a.size)
        wb = oracle_back(want, dtype)
        r.check(bool(((back == wb) | (np.isnan(back) & np.isnan(wb))).all()),
                "convert: %s -> float32 (%s) equals numpy"
                % (nm, so.ps_half_kernel(dtype, True).decode()))
        py, pc = phalf.to_half(a, dtype)
        ok, bad = same_bits(py, want, np.zeros_like(a), dtype)
        r.check(ok and pc == wclamp, "convert: psclient.half %s equals numpy (%d differ)"
                % (nm, bad))


def check_feedback(so):
    rng = np.random.default_rng(7)
    n, steps = 4096, 300
    for dtype, nm in ((F16, "float16"), (BF16, "bfloat16")):
        res = np.zeros(n, "<f4")
        ef = phalf.ErrorFeedback()
        sum_g = np.zeros(n)
        sent_c = np.zeros(n)
        sent_py = np.zeros(n)
        plain = np.zeros(n)
        for _ in range(steps):
            g = (rng.standard_normal(n) * 1e-3).astype("<f4")
            sum_g += g
            out = np.zeros(n, "<u2")
            so.ps_half_encode_ef(dtype, ptr(g), ptr(res), ptr(out), n)
            sent_c += oracle_back(out, dtype)
            sent_py += oracle_back(ef.encode("v", g, dtype), dtype)
            plain += oracle_back(oracle(g, dtype)[0], dtype)
        tol = steps * 4e-3 * 2.0 ** -23
        err_c = np.abs(sent_c + res - sum_g).max()
        err_py = np.abs(sent_py + ef.residual["v"] - sum_g).max()
        err_plain = np.abs(plain - sum_g).max()
        r.check(err_c < tol and err_py < tol,
                "feedback: %s sent + residual == sum of gradients (C %.2e, Python %.2e, "
                "tolerance %.2e)" % (nm, err_c, err_py, tol))
        r.check(err_plain > 100 * max(err_c, err_py),
                "feedback: %s rounding alone drifts %.2e" % (nm, err_plain))


class Psd:
    def __init__(self):
        self.d = pstest.start_psd(pstest.tmpdir("half-"))
        self.ch = pstest.channel(self.d.address)
        self.stub = pbg.ParameterServerStub(self.ch)

    def create(self, name, n, init=None, lr=0.5, **kw):
        spec = pb.VariableSpec(name=name, dtype=pb.DTYPE_FLOAT32, shape=[n],
                               optimizer=pb.Optimizer(kind=pb.Optimizer.SGD,
                                                      learning_rate=lr), **kw)
        self.stub.CreateVariable(pb.CreateVariableRequest(spec=spec), timeout=10)
        if init is not None:
            self.delta(name, init)

    def delta(self, name, d):
        self.stub.Push(pb.PushRequest(grads=[pb.Gradient(name=name, grad=pb.Tensor(
            dtype=pb.DTYPE_FLOAT32, shape=[d.size], data=d.astype("<f4").tobytes()))],
            delta=True), timeout=10)

    def pull(self, name, wire=0):
        v = self.stub.Pull(pb.PullRequest(items=[pb.PullItem(name=name, wire_dtype=wire)]),
                           timeout=10).values[0]
        dt = "<f4" if v.value.dtype == pb.DTYPE_FLOAT32 else "<u2"
        return np.frombuffer(v.value.data, dtype=dt), v.value.dtype, v.version

    def push_half(self, name, bits, dtype, tensor_dtype=None):
        return self.stub.Push(pb.PushRequest(grads=[pb.Gradient(name=name, grad=pb.Tensor(
            dtype=tensor_dtype or dtype, shape=[bits.size], data=bits.tobytes()))],
            wire_dtype=dtype), timeout=10)

    def stats(self):
        return self.stub.Stats(pb.StatsRequest(), timeout=10)

    def stop(self):
        self.ch.close()
        self.d.stop()


def check_pull_push(p):
    rng = np.random.default_rng(3)
    w0 = (rng.standard_normal(10000) * 10.0 ** rng.integers(-6, 4, 10000)).astype("<f4")
    p.create("w", w0.size, w0)
    f32, _, _ = p.pull("w")
    for dtype, nm in ((F16, "FLOAT16"), (BF16, "BFLOAT16")):
        bits, got_dt, _ = p.pull("w", dtype)
        want, _ = oracle(f32, dtype)
        r.check(got_dt == dtype and np.array_equal(bits, want),
                "pull: %s is numpy's conversion of the float32 value (%d differ)"
                % (nm, int((bits != want).sum()) if bits.size == want.size else -1))
    before = p.stats().wire_clamped
    p.create("big", 4, np.array([1e5, -7e4, 3.0, 65504], "<f4"))
    bits, _, _ = p.pull("big", F16)
    back = oracle_back(bits, F16)
    r.check(back.tolist() == [65504.0, -65504.0, 3.0, 65504.0] and
            p.stats().wire_clamped == before + 2,
            "pull: 1e5 and -7e4 in FLOAT16 are +-65504, wire_clamped +2 (%s)" % back)
    for dtype, nm in ((BF16, "BFLOAT16"), (F16, "FLOAT16")):
        name = "g" + nm
        p.create(name, 5000, w0[:5000])
        base, _, _ = p.pull(name)
        g = (rng.standard_normal(5000) * 1e-2).astype("<f4")
        bits, _ = oracle(g, dtype)
        p.push_half(name, bits, dtype)
        got, _, ver = p.pull(name)
        want = base - np.float32(0.5) * oracle_back(bits, dtype)
        r.check(ver == 2 and np.array_equal(got, want.astype("<f4")),
                "push: a %s gradient is widened and applied (max diff %.3g)"
                % (nm, float(np.abs(got - want).max())))


def check_bad(p):
    p.create("f32only", 8, np.ones(8, "<f4"), float32_only=True)
    p.create("v", 8, np.ones(8, "<f4"))
    ok_bits, _ = oracle(np.full(8, 0.25, "<f4"), BF16)
    cases = [
        ("a BFLOAT16 tensor in a FLOAT16 push", "v",
         lambda: p.push_half("v", ok_bits, F16, tensor_dtype=BF16), ["'v'", "BFLOAT16",
                                                                      "declares FLOAT16"]),
        ("a FLOAT32 tensor in a BFLOAT16 push", "v",
         lambda: p.push_half("v", np.ones(8, "<f4"), BF16,
                             tensor_dtype=pb.DTYPE_FLOAT32), ["'v'", "FLOAT32"]),
        ("a half gradient to a float32_only variable", "f32only",
         lambda: p.push_half("f32only", ok_bits, BF16), ["'f32only'", "float32_only"]),
    ]
    for dtype, special, nm in ((F16, 0x7C00, "Inf"), (F16, 0x7E00, "NaN"),
                               (BF16, 0x7FC0, "NaN"), (BF16, 0xFF80, "-Inf")):
        bits = ok_bits.copy() if dtype == BF16 else oracle(np.full(8, 0.25, "<f4"), F16)[0]
        bits[5] = special
        cases.append(("%s in a %s gradient" % (nm, "FLOAT16" if dtype == F16 else
                                               "BFLOAT16"), "v",
                      (lambda b=bits, d=dtype: p.push_half("v", b, d)),
                      ["'v'", "NaN or Inf"]))
    for what, name, call, words in cases:
        before = p.pull(name)
        r.refused("bad: " + what, call, grpc.StatusCode.INVALID_ARGUMENT, *words)
        after = p.pull(name)
        r.check(np.array_equal(before[0], after[0]) and before[2] == after[2],
                "bad: %s: nothing applied (version %d)" % (what, after[2]))
    r.refused("bad: a Pull mixing wire dtypes", lambda: p.stub.Pull(pb.PullRequest(items=[
        pb.PullItem(name="v", wire_dtype=BF16), pb.PullItem(name="f32only")]), timeout=10),
        grpc.StatusCode.INVALID_ARGUMENT, "'f32only'", "one wire dtype")
    bits, _, _ = p.pull("f32only", BF16)
    r.check(bits.size == 8, "bad: a float32_only variable may still be pulled in BFLOAT16")


def check_client(p):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((256, 32)).astype("<f4")
    wt = rng.standard_normal(32).astype("<f4")
    y = x @ wt
    losses = {}
    for wire, ef in (("f32", True), ("bf16", True), ("fp16", True)):
        name = "lsq_%s" % wire
        c = Client([p.d.address], wire_dtype=wire, error_feedback=ef)
        try:
            c.create_variables([Variable(name, (32,), Initializer.constant(0.0))],
                               optimizer=Optimizer.sgd(0.05))
            for _ in range(200):
                w = c.pull([name])[name]
                g = (x.T @ (x @ w - y) / len(x)).astype("<f4")
                c.push({name: g})
            w = c.pull([name])[name]
            losses[wire] = float(np.mean((x @ w - y) ** 2))
        finally:
            c.close()
    r.check(losses["bf16"] < 1e-3 and losses["fp16"] < 1e-3 and
            abs(losses["bf16"] - losses["f32"]) < 1e-3,
            "client: least squares to loss f32 %.2e, bf16 %.2e, fp16 %.2e"
            % (losses["f32"], losses["bf16"], losses["fp16"]))
    st = p.stats()
    r.check(st.half_pushes >= 400 and st.half_pulls >= 400,
            "client: Stats half_pushes %d, half_pulls %d" % (st.half_pushes, st.half_pulls))


def check_failed(p):
    names = ("ef_a", "ef_b")
    c = Client([p.d.address], wire_dtype="bf16")
    try:
        c.create_variables([Variable(n, (1000,), Initializer.constant(0.0)) for n in names],
                           optimizer=Optimizer.sgd(1.0))
        rng = np.random.default_rng(5)
        sums = {n: np.zeros(1000, dtype="<f4") for n in names}
        keep = np.arange(1000) != 5  # ef_b's element 5 goes beyond the grid
        big = {0: 3e38, 1: 3e38, 2: -3e38, 3: np.nan}
        want = {0: "OK", 1: "INVALID_ARGUMENT after ef_a", 2: "OK", 3: "INVALID_ARGUMENT"}
        for step in range(4):
            gs = {n: (rng.integers(-2047, 2048, 1000) / 4096.0).astype("<f4") for n in names}
            gs["ef_b"][5] = big[step]
            for n in names:
                sums[n] += gs[n]
            try:
                c.push(gs)
                got = "OK"
            except PsError as e:
                got = e.code.name + (" after ef_a" if "grads[1] in this push were applied"
                                     in e.details else "")
            exact = []
            for n in names:
                w = p.pull(n)[0]
                res = c.feedback.residual[n]
                exact.append(np.array_equal((-w + res)[keep], sums[n][keep]))
            r.check(got == want[step] and all(exact),
                    "failed: push %d: %s (want %s); applied + residual == sum of the "
                    "gradients bit for bit: %s" % (step, got, want[step], exact))
            if step == 2:
                worst = max(float(np.abs(c.feedback.residual[n][keep]).max()) for n in names)
                r.check(worst <= 1 / 128.0, "failed: the push after a refused one sent what "
                        "it owed (largest residual %g)" % worst)
    finally:
        c.close()


def check_workerd():
    import json
    import subprocess
    workerd = os.path.join(pstest.BUILD_ROOT, "worker", "workerd")
    for extra, want_half in ((["--shm", "off"], True), ([], False)):
        p = Psd()
        try:
            out = subprocess.run([workerd, "--ps", p.d.address, "--epochs", "1",
                                  "--limit", "12800", "--batch", "64", "--json",
                                  "--progress", "0", "--wire-dtype", "bf16"] + extra,
                                 capture_output=True, text=True, timeout=240)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            s = json.loads(lines[-1]) if lines else None
            st = p.stats()
            if want_half:
                r.check(out.returncode == 0 and s is not None and
                        s["wire_dtype"] == "bf16" and s["shm_shards"] == 0 and
                        st.half_pushes >= s["steps"] and st.half_pulls >= 1 and
                        s["test_accuracy"] > 0.75,
                        "workerd: --wire-dtype bf16 --shm off: %s half pushes, %s half "
                        "pulls, accuracy %s" % (st.half_pushes, st.half_pulls,
                                                s and s["test_accuracy"]))
            else:
                r.check(out.returncode == 0 and s is not None and s["shm_shards"] == 1 and
                        st.half_pushes == 0 and st.shm_bytes > 0,
                        "workerd: --wire-dtype bf16 through shared memory stays float32 "
                        "(half pushes %d, shm_bytes %d)" % (st.half_pushes, st.shm_bytes))
        finally:
            p.stop()


def main():
    global pb, pbg
    pb, pbg, _, _ = pstest.generate_stubs()
    so = lib()
    check_convert(so)
    check_feedback(so)
    p = Psd()
    try:
        check_pull_push(p)
        check_bad(p)
        check_client(p)
        check_failed(p)
    finally:
        p.stop()
    check_workerd()
    r.finish()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    main()
