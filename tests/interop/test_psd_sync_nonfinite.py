"""A synchronous step whose aggregate is non-finite (issue 13 e), against a
real psd: two workers push finite gradients (3e38 each) whose sum overflows
float32. psd refuses the step as it refuses a non-finite async update:
INVALID_ARGUMENT to both pushes, the value and version unchanged, and the
next step goes on; with --allow-nonfinite the old behaviour (Inf applied).
numpy's float32 arithmetic is the oracle for the overflow."""
import os
import sys
import threading

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

F32 = np.float32


def two_pushes(pb, stub, step, g0, g1):
    """Pushes step from workers 0 and 1 at once; returns [(code, msg)]."""
    out = [None, None]

    def one(w, g):
        try:
            stub.Push(pb.PushRequest(worker=w, step=step, grads=[
                pstest.grad(pb, "w", g)]), timeout=10)
            out[w] = (grpc.StatusCode.OK, "")
        except grpc.RpcError as e:
            out[w] = (e.code(), e.details() or "")
    ts = [threading.Thread(target=one, args=(w, g)) for w, g in ((0, g0), (1, g1))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    return out


def pull(pb, stub):
    v = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=5).values[0]
    return v.version, pstest.value(v).copy()


def run(pb, pbg, r, allow):
    args = ["--consistency", "sync", "--workers", "2"]
    if allow:
        args.append("--allow-nonfinite")
    d = pstest.start_psd(pstest.tmpdir(), *args)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "w", (4,), lr=1.0)), timeout=5)
    big = np.array([3e38, 1.0, -3e38, 2.0], F32)
    with np.errstate(over="ignore"):
        total = big + big
    assert np.isfinite(big).all() and not np.isfinite(total).all()
    before = pull(pb, stub)
    got = two_pushes(pb, stub, 0, big, big)
    after = pull(pb, stub)
    tag = "--allow-nonfinite" if allow else "default"
    if not allow:
        r.check(all(c == grpc.StatusCode.INVALID_ARGUMENT and "non-finite" in m and
                    "variable 'w'" in m for c, m in got),
                "%s: both pushes of a step whose sum overflows are INVALID_ARGUMENT "
                "(%r)" % (tag, got))
        r.check(after[0] == before[0] and np.array_equal(after[1], before[1]),
                "%s: the value and version are unchanged (version %d -> %d, %s)"
                % (tag, before[0], after[0], after[1]))
        # The step is over: the next one is taken and applied (mean of 1 and 3).
        got = two_pushes(pb, stub, 1, np.ones(4, F32), np.full(4, 3, F32))
        nxt = pull(pb, stub)
        r.check(all(c == grpc.StatusCode.OK for c, _ in got) and
                nxt[0] == before[0] + 1 and np.array_equal(nxt[1], np.full(4, -2, F32)),
                "%s: the next step applies as usual (%r, version %d, %s)"
                % (tag, got, nxt[0], nxt[1]))
        st = stub.Stats(pb.StatsRequest(), timeout=5)
        r.check(st.nonfinite_refused >= 1,
                "%s: Stats counts the refusal" % tag)
    else:
        r.check(all(c == grpc.StatusCode.OK for c, _ in got) and
                after[0] == before[0] + 1 and not np.isfinite(after[1]).all(),
                "%s: the overflowing step is applied (%r, version %d, %s)"
                % (tag, got, after[0], after[1]))
    ch.close()
    r.check(d.stop() == 0, "%s: psd stops cleanly" % tag)


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-sync-nonfinite")
    run(pb, pbg, r, allow=False)
    run(pb, pbg, r, allow=True)
    r.finish()


if __name__ == "__main__":
    main()
