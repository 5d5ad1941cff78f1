"""An outside client trains a model: linear regression with numpy, through
Push and Pull against a real psd, using stubs generated from proto/ at test
time. Proves the wire contract from outside C.

Two workers (threads, each its own channel and data shard) push
asynchronously; the model must converge to the true weights.
"""
import os
import sys
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-linreg")
    d = pstest.start_psd(pstest.tmpdir())
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)

    rng = np.random.default_rng(7)
    n_features, n = 20, 4000
    w_true = rng.normal(size=(n_features, 1)).astype(np.float32)
    b_true = np.float32(0.5)
    x = rng.normal(size=(n, n_features)).astype(np.float32)
    y = x @ w_true + b_true + 0.01 * rng.normal(size=(n, 1)).astype(np.float32)

    for name, shape in (("linreg/w", (n_features, 1)), ("linreg/b", (1,))):
        resp = stub.CreateVariable(pb.CreateVariableRequest(
            spec=pstest.spec(pb, name, shape, lr=0.05)), timeout=10)
        r.check(resp.created, "created %s" % name)

    def worker(index, steps, batch, losses):
        wch = pstest.channel(d.address)
        ws = pbg.ParameterServerStub(wch)
        xs, ys = x[index::2], y[index::2]
        for step in range(steps):
            got = ws.Pull(pb.PullRequest(items=[pb.PullItem(name="linreg/w"),
                                                pb.PullItem(name="linreg/b")]),
                          timeout=10)
            w, b = pstest.value(got.values[0]), pstest.value(got.values[1])
            lo = (step * batch) % len(xs)
            xb, yb = xs[lo:lo + batch], ys[lo:lo + batch]
            err = xb @ w + b - yb
            losses.append(float(np.mean(err ** 2)))
            gw = 2 * xb.T @ err / len(xb)
            gb = np.array([2 * err.mean()], dtype=np.float32)
            ws.Push(pb.PushRequest(worker=index, step=step, grads=[
                pstest.grad(pb, "linreg/w", gw), pstest.grad(pb, "linreg/b", gb)]),
                timeout=10)
        wch.close()

    losses = [[], []]
    threads = [threading.Thread(target=worker, args=(i, 150, 64, losses[i]))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    got = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="linreg/w"),
                                          pb.PullItem(name="linreg/b")]), timeout=10)
    w, b = pstest.value(got.values[0]), pstest.value(got.values[1])
    err_w = float(np.max(np.abs(w - w_true)))
    r.check(err_w < 0.05, "weights converge (max error %.4f < 0.05)" % err_w)
    r.check(abs(float(b[0]) - 0.5) < 0.05, "bias converges (%.4f vs 0.5)" % b[0])
    r.check(np.mean(losses[0][-10:]) < 0.01 * np.mean(losses[0][:3]),
            "loss falls 100x (%.4g -> %.4g)" % (np.mean(losses[0][:3]),
                                                  np.mean(losses[0][-10:])))
    r.check(got.values[0].version == 300,
            "every push applied once: version %d == 300" % got.values[0].version)
    st = stub.Stats(pb.StatsRequest(), timeout=10)
    r.check(st.pushes == 300 and st.variables == 2,
            "Stats counts 300 pushes over 2 variables (%d, %d)" % (st.pushes, st.variables))

    # Big tensors take psd's zero-copy paths: the push is applied where gRPC
    # received it (in two halves, on two threads) and the pull is sent from
    # the value in place. The bits must be numpy's float32 SGD, exactly,
    # and a NaN anywhere (here in the second half) must change nothing.
    shape = (3, 350001)  # 4.2 MB, an odd element count
    lr = np.float32(0.125)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "big/w", shape, lr=float(lr),
        init=pb.Initializer(kind=pb.Initializer.NORMAL, seed=3))), timeout=10)
    start = pstest.value(stub.Pull(pb.PullRequest(items=[pb.PullItem(name="big/w")]),
                                   timeout=10).values[0])
    want = start.copy()
    for k in range(3):
        g = rng.normal(size=shape).astype(np.float32)
        # The last push asks for the value back (return_values): one round
        # trip for a worker's push and its next pull.
        resp = stub.Push(pb.PushRequest(worker=0, step=k, return_values=k == 2,
                                        grads=[pstest.grad(pb, "big/w", g)]),
                         timeout=30)
        want = want - lr * g
    r.check(list(resp.versions) == [3] and len(resp.values) == 1 and
            resp.values[0].name == "big/w" and resp.values[0].version == 3 and
            np.array_equal(pstest.value(resp.values[0]), want),
            "Push with return_values answers the value it produced (version %s, "
            "%d values)" % (list(resp.versions), len(resp.values)))
    bad = rng.normal(size=shape).astype(np.float32)
    bad[2, 350000] = np.nan
    try:
        stub.Push(pb.PushRequest(worker=0, step=3, grads=[pstest.grad(pb, "big/w", bad)]),
                  timeout=30)
        r.check(False, "a NaN at a big gradient's end is refused")
    except grpc.RpcError as e:
        r.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT,
                "a NaN at a big gradient's end is refused (%s)" % e.code())
    got = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="big/w")]), timeout=30)
    v = got.values[0]
    r.check(v.version == 3 and tuple(v.value.shape) == shape,
            "big variable at version 3, shape %s (%d, %s)" % (shape, v.version,
                                                             tuple(v.value.shape)))
    r.check(np.array_equal(pstest.value(v), want),
            "big variable: 3 pushes give numpy's float32 SGD bit for bit "
            "(%d of %d elements differ)" % (int(np.sum(pstest.value(v) != want)),
                                            want.size))
    # The channel stays open, idle: psd closes it once no call is in flight
    # rather than wait for the client to act on the GOAWAY (4.5 s here).
    t0 = time.monotonic()
    r.check(d.stop() == 0, "psd exits 0 on SIGTERM")
    took = time.monotonic() - t0
    r.check(took < 2.5, "a client connected and idle does not hold psd's stop: %.2f s"
            % took)
    ch.close()
    r.finish()


if __name__ == "__main__":
    main()
