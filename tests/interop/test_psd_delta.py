"""Delta pushes (PushRequest.delta, local SGD's exchange) on a real psd:
w += d exactly with no optimizer and the slots untouched, the version rising
by one; refused for SYNC variables and when the sum would not be finite.
numpy float32 is the oracle."""
import os
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

C = grpc.StatusCode
F32 = np.float32


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-delta")
    psd = pstest.DensePsd(pb, pbg, "--workers", "2")
    stub = psd.stub
    n = 1000
    rng = np.random.default_rng(5)
    w0 = rng.standard_normal(n).astype(F32)

    def push(name, a, delta, **kw):
        return stub.Push(pb.PushRequest(grads=[pstest.grad(pb, name, a)],
                                        delta=delta, **kw), timeout=5)

    def pull(name):
        v = stub.Pull(pb.PullRequest(items=[pb.PullItem(name=name)]),
                      timeout=5).values[0]
        return v.version, pstest.value(v).copy()

    # Momentum, so that a slot exists: a delta must leave it alone.
    lr, mu = F32(0.01), F32(0.9)
    mom = pb.Optimizer(kind=pb.Optimizer.MOMENTUM, learning_rate=0.01,
                       momentum=0.9)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "a", (n,), opt=mom, consistency=pb.ASYNC,
        init=pb.Initializer(kind=pb.Initializer.ZEROS))), timeout=5)
    push("a", w0, True)  # zeros + w0
    g = rng.standard_normal(n).astype(F32)
    delta = (rng.standard_normal(n) * 0.01).astype(F32)
    push("a", g, False)
    ver, before = pull("a")
    push("a", delta, True)
    ver2, after = pull("a")
    r.check(ver2 == ver + 1 and np.array_equal(after, before + delta),
            "a delta push adds exactly (w + d in float32) and the version "
            "rises by one (%d -> %d)" % (ver, ver2))
    push("a", g, False)
    _, got = pull("a")
    w = np.zeros(n, F32) + w0
    v = g.copy()                 # first momentum step: v = 0 * mu + g
    w = w - lr * v
    w = w + delta
    v = mu * v + g
    w = w - lr * v
    r.check(np.array_equal(got, w),
            "the momentum slot is untouched by a delta: the next update has "
            "numpy's bits")

    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "s", (4,), consistency=pb.SYNC, num_workers=2)), timeout=5)
    r.refused("a delta push to a SYNC variable",
              lambda: push("s", np.ones(4, F32), True, step=0),
              C.INVALID_ARGUMENT, "'s'", "delta", "SYNC")
    big = np.zeros(n, F32)
    big[7] = 3.4e38
    push("a", np.where(np.arange(n) == 7, 3.4e38, 0).astype(F32), True)
    v0 = pull("a")
    r.refused("a delta that overflows element 7", lambda: push("a", big, True),
              C.INVALID_ARGUMENT, "'a'", "element 7", "non-finite")
    v1 = pull("a")
    r.check(v0[0] == v1[0] and np.array_equal(v0[1], v1[1]),
            "... and nothing of it was applied")
    r.check(psd.stop() == 0, "psd exits 0 on SIGTERM")
    r.finish()


if __name__ == "__main__":
    main()
