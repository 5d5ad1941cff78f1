"""FTRL-Proximal on a real psd, checked push by push against numpy computing
TensorFlow's kernel (ApplyFtrl / ApplyFtrlV2 in core/kernels/training_ops.cc,
as Keras' Ftrl calls it) in float32: with and without l1, l2, l2_shrinkage
and beta, at learning_rate_power -0.5 (the default, the kernel's sqrt
case), -0.25 and TF's 0 (sent as -1e-38). Then bad specs, a push that would
overflow, and the two slots through a checkpoint, a restore and a restart."""
import os
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

C = grpc.StatusCode
F32 = np.float32
N = 257  # odd: the vector loops' tails run too
STEPS = 20


class FtrlRef:
    """TF's FTRL in numpy float32, the kernel's operations in its order."""

    def __init__(self, w, lr, lr_power=-0.5, l1=0.0, l2=0.0, l2_shrinkage=0.0,
                 beta=0.0, initial_accumulator=0.1):
        self.w = np.array(w, F32)
        self.n = np.full(len(w), initial_accumulator, F32)
        self.z = np.zeros(len(w), F32)
        self.lr, self.p = F32(lr), F32(lr_power)
        self.l1, self.l2s = F32(l1), F32(l2_shrinkage)
        # Keras: l2 + beta / (2 * lr), in float32, passed as the kernel's l2.
        self.l2 = F32(l2) + F32(beta) / (F32(2) * self.lr)

    def step(self, g):
        g = np.asarray(g, F32)
        w, n, lr = self.w, self.n, self.lr
        # Keras calls ApplyFtrl (no shrinkage) unless l2_shrinkage > 0.
        gs = g + F32(2) * self.l2s * w if self.l2s > 0 else g
        new_n = n + g * g
        if self.p == F32(-0.5):
            pn, po = np.sqrt(new_n), np.sqrt(n)
        else:
            pn, po = np.power(new_n, -self.p), np.power(n, -self.p)
        self.z = self.z + (gs - (pn - po) / lr * w)
        x = self.l1 * np.sign(self.z) - self.z
        y = pn / lr + F32(2) * self.l2
        self.w = np.where(np.abs(self.z) > self.l1, x / y, F32(0)).astype(F32)
        self.n = n + g * g


class Psd(pstest.DensePsd):
    def __init__(self, pb, pbg, data_dir=None):
        super().__init__(pb, pbg, data_dir=data_dir)

    def create(self, name, opt, init_value=0.0):
        init = self.pb.Initializer(kind=self.pb.Initializer.CONSTANT,
                                   value=init_value)
        return self.stub.CreateVariable(self.pb.CreateVariableRequest(
            spec=pstest.spec(self.pb, name, (N,), opt=opt, init=init)),
            timeout=5)


# Each case: the proto's fields, and the reference's (None: same as proto).
CASES = [
    ("defaults", dict(), dict()),
    ("l1", dict(l1=0.05), dict(l1=0.05)),
    ("l2", dict(l2=0.5), dict(l2=0.5)),
    ("l1+l2", dict(l1=0.02, l2=0.1), dict(l1=0.02, l2=0.1)),
    ("l2_shrinkage", dict(l2_shrinkage=0.2), dict(l2_shrinkage=0.2)),
    ("beta", dict(beta=1.0), dict(beta=1.0)),
    ("all", dict(l1=0.01, l2=0.05, l2_shrinkage=0.1, beta=0.5,
                 initial_accumulator=0.3),
     dict(l1=0.01, l2=0.05, l2_shrinkage=0.1, beta=0.5,
          initial_accumulator=0.3)),
    ("lr_power -0.25", dict(learning_rate_power=-0.25, l1=0.01),
     dict(lr_power=-0.25, l1=0.01)),
    ("lr_power -1 + shrinkage", dict(learning_rate_power=-1.0,
                                     l2_shrinkage=0.05),
     dict(lr_power=-1.0, l2_shrinkage=0.05)),
    # TF's lr_power 0 (a fixed step size): the proto's 0 means -0.5, so it
    # is sent as -1e-38; the oracle runs the kernel at exactly 0.
    ("lr_power 0", dict(learning_rate_power=-1e-38, l1=0.01),
     dict(lr_power=0.0, l1=0.01)),
]


def ulps(a, b):
    """The largest distance in units of the last place between two float32
    arrays of finite values."""
    ia = a.view(np.int32).astype(np.int64)
    ib = b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7fffffff), ia)
    ib = np.where(ib < 0, -(ib & 0x7fffffff), ib)
    return int(np.max(np.abs(ia - ib))) if len(a) else 0


def against_numpy(r, pb, p):
    rng = np.random.default_rng(7)
    for i, (label, fields, ref_fields) in enumerate(CASES):
        name = "ftrl%d" % i
        lr = 0.1
        p.create(name, pb.Optimizer(kind=pb.Optimizer.FTRL, learning_rate=lr,
                                    **fields), init_value=0.25)
        ref = FtrlRef(np.full(N, 0.25, F32), lr, **ref_fields)
        # sqrt, x^1 and x^0 are exact in both; numpy's float32 power is not
        # glibc's powf (1 ulp apart in 15% of cases, as Eigen's own pow is
        # from both), and n'^p - n^p cancels, so other powers get a bound.
        exact = ref_fields.get("lr_power", -0.5) in (-0.5, -1.0, 0.0)
        worst, zeros, steps_ok, rel = 0, 0, 0, 0.0
        for step in range(STEPS):
            g = rng.standard_normal(N).astype(F32)
            g[rng.random(N) < 0.1] = 0
            p.push(name, g)
            ref.step(g)
            version, got = p.pull(name)
            d = ulps(got, ref.w)
            worst = max(worst, d)
            rel = max(rel, float(np.max(np.abs(got - ref.w)))
                      / max(float(np.max(np.abs(ref.w))), 1e-30))
            steps_ok += (d == 0 if exact else rel <= 1e-5) and version == step + 1
            zeros = int(np.sum(got == 0))
        r.check(steps_ok == STEPS,
                "FTRL %s: every one of %d updates %s (worst %d ulp, %.2g of the "
                "largest weight; %d of %d weights exactly 0 at the end)"
                % (label, STEPS, "has numpy's bits" if exact else
                   "within 1e-5 of the largest weight of numpy's", worst, rel,
                   zeros, N))


def bad_specs(r, pb, p):
    def create(name, **kw):
        return lambda: p.create(name, pb.Optimizer(kind=pb.Optimizer.FTRL,
                                                   learning_rate=0.1, **kw))
    r.refused("FTRL with learning_rate_power 0.5", create("b1", learning_rate_power=0.5),
              C.INVALID_ARGUMENT, "'b1'", "learning_rate_power", "[-10, 0]", "0.5")
    r.refused("FTRL with l1 -1", create("b2", l1=-1.0),
              C.INVALID_ARGUMENT, "'b2'", "l1 must be in [0, 1e+30]", "-1")
    r.refused("FTRL with l2_shrinkage NaN", create("b3", l2_shrinkage=float("nan")),
              C.INVALID_ARGUMENT, "'b3'", "l2_shrinkage")
    r.refused("FTRL with beta -2", create("b4", beta=-2.0),
              C.INVALID_ARGUMENT, "'b4'", "beta")
    r.refused("FTRL with initial_accumulator -1", create("b5", initial_accumulator=-1.0),
              C.INVALID_ARGUMENT, "'b5'", "initial_accumulator")
    r.refused("optimizer kind 5", lambda: p.create("b6", pb.Optimizer(kind=5)),
              C.INVALID_ARGUMENT, "'b6'", "unknown optimizer kind 5")
    # Unset fields take their defaults, so an explicit -0.5 is the same spec.
    p.create("same", pb.Optimizer(kind=pb.Optimizer.FTRL, learning_rate=0.1))
    resp = p.create("same", pb.Optimizer(kind=pb.Optimizer.FTRL, learning_rate=0.1,
                                         learning_rate_power=-0.5,
                                         initial_accumulator=0.1))
    r.check(not resp.created, "an FTRL spec spelling out the defaults is the "
            "same variable")
    r.refused("the same name with l1 0.5", create("same", l1=0.5),
              C.ALREADY_EXISTS, "'same'")
    info = [v for v in p.stub.ListVariables(pb.ListVariablesRequest(), timeout=5).variables
            if v.spec.name == "same"][0]
    o = info.spec.optimizer
    r.check(info.slot_bytes == 2 * N * 4 and abs(o.learning_rate_power + 0.5) < 1e-9
            and abs(o.initial_accumulator - 0.1) < 1e-7,
            "ListVariables: two slots of %d floats (%d bytes), learning_rate_power "
            "%g, initial_accumulator %g" % (N, info.slot_bytes, o.learning_rate_power,
                                            o.initial_accumulator))


def nonfinite(r, pb, p):
    p.create("big", pb.Optimizer(kind=pb.Optimizer.FTRL, learning_rate=0.1))
    p.push("big", np.ones(N, F32))
    before = p.pull("big")
    g = np.ones(N, F32)
    g[3] = 3e38  # its square overflows the accumulator
    try:
        p.push("big", g)
        code, msg = None, ""
    except grpc.RpcError as e:
        code, msg = e.code(), e.details()
    after = p.pull("big")
    r.check(code == C.INVALID_ARGUMENT and "'big'" in msg and "element 3" in msg,
            "FTRL: a push whose accumulator would overflow is INVALID_ARGUMENT "
            "naming element 3 (%s %r)" % (code and code.name, msg))
    r.check(after[0] == before[0] and np.array_equal(after[1], before[1]),
            "FTRL: nothing of it applied (version %d)" % after[0])
    ref = FtrlRef(np.zeros(N, F32), 0.1)
    ref.step(np.ones(N, F32))
    ref.step(np.ones(N, F32))
    p.push("big", np.ones(N, F32))
    r.check(np.array_equal(p.pull("big")[1], ref.w),
            "FTRL: the slots were not touched either: the next push matches numpy")


def slots_survive(r, pb, pbg):
    """Checkpoint after 5 pushes, 5 more, restore, the same 5 again: the
    same bits both times (so both slots came back); then a restart."""
    p = Psd(pb, pbg)
    opt = pb.Optimizer(kind=pb.Optimizer.FTRL, learning_rate=0.2, l1=0.01,
                       l2_shrinkage=0.05, learning_rate_power=-1.0)
    p.create("v", opt, init_value=0.5)
    ref = FtrlRef(np.full(N, 0.5, F32), 0.2, l1=0.01, l2_shrinkage=0.05,
                  lr_power=-1.0)
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(N).astype(F32) for _ in range(15)]
    for g in grads[:5]:
        p.push("v", g)
        ref.step(g)
    ck = p.stub.Checkpoint(pb.CheckpointRequest(step=0), timeout=30)
    for g in grads[5:10]:
        p.push("v", g)
        ref.step(g)
    first = p.pull("v")[1]
    p.stub.Restore(pb.RestoreRequest(step=ck.step), timeout=30)
    for g in grads[5:10]:
        p.push("v", g)
    again = p.pull("v")
    r.check(np.array_equal(first, again[1]) and np.array_equal(again[1], ref.w)
            and again[0] == 10,
            "FTRL after Restore: the same 5 pushes give the same bits as before "
            "it and as numpy (accumulator and linear restored; version %d)"
            % again[0])
    rc = p.stop()
    p = Psd(pb, pbg, p.dir)
    for g in grads[10:]:
        p.push("v", g)
        ref.step(g)
    v = p.pull("v")
    r.check(rc == 0 and np.array_equal(v[1], ref.w) and v[0] == 15,
            "FTRL after a restart of psd: 5 more pushes match numpy (version %d)"
            % v[0])
    p.stop()


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-ftrl")
    p = Psd(pb, pbg)
    against_numpy(r, pb, p)
    bad_specs(r, pb, p)
    nonfinite(r, pb, p)
    r.check(p.stop() == 0, "psd exits 0 on SIGTERM")
    slots_survive(r, pb, pbg)
    r.finish()


if __name__ == "__main__":
    main()
