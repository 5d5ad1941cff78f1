"""Sync consistency on a real psd: the pushes of N workers for one step are
averaged into one update; a push for an applied step is refused with
FAILED_PRECONDITION and counted; Pull with min_version waits for the step;
a worker that pushes a step twice is not counted twice."""
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
    r = pstest.Results("psd-sync")
    d = pstest.start_psd(pstest.tmpdir(), "--consistency", "sync", "--workers", "3")
    stubs = [pbg.ParameterServerStub(pstest.channel(d.address)) for _ in range(4)]
    s0 = stubs[0]
    resp = s0.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "w", (5,), lr=1.0)), timeout=5)
    lv = s0.ListVariables(pb.ListVariablesRequest(), timeout=5)
    r.check(lv.variables[0].spec.consistency == pb.SYNC and
            lv.variables[0].spec.num_workers == 3,
            "the server default makes the variable SYNC over 3 workers")

    def push(worker, step, g, out):
        try:
            out[worker] = stubs[worker].Push(pb.PushRequest(
                worker=worker, step=step,
                grads=[pstest.grad(pb, "w", np.full(5, g))]), timeout=10).versions[0]
        except grpc.RpcError as e:
            out[worker] = e

    for step in range(3):
        out = {}
        threads = []
        for w in range(3):
            t = threading.Thread(target=push, args=(w, step, float(w + 1), out))
            t.start()
            threads.append(t)
            if w < 2:
                time.sleep(0.05)
                # Until every worker pushed, nothing is applied.
                got = s0.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=5)
                if step == 0 and w == 1:
                    r.check(got.values[0].version == 0,
                            "two of three pushes apply nothing (version %d)"
                            % got.values[0].version)
        for t in threads:
            t.join()
        r.check(all(out[w] == step + 1 for w in range(3)),
                "step %d: all three pushes answered with version %d (%s)"
                % (step, step + 1, [out[w] for w in range(3)]))
    got = s0.Pull(pb.PullRequest(items=[pb.PullItem(name="w", min_version=3)]), timeout=5)
    v = pstest.value(got.values[0])
    # Each step averages 1, 2, 3 -> 2; SGD lr 1 over 3 steps: 0 - 3*2 = -6.
    r.check(np.allclose(v, -6.0), "three averaged updates give -6 (%s)" % v)

    def push_step(step):
        return lambda: s0.Push(pb.PushRequest(
            worker=0, step=step, grads=[pstest.grad(pb, "w", np.ones(5))]), timeout=5)

    r.refused("a push for an applied step", push_step(1),
              grpc.StatusCode.FAILED_PRECONDITION, "already applied")
    r.refused("a push ahead of the step", push_step(9),
              grpc.StatusCode.FAILED_PRECONDITION, "ahead")
    st = s0.Stats(pb.StatsRequest(), timeout=5)
    r.check(st.stale_pushes_refused == 1, "Stats counts the stale push (%d)"
            % st.stale_pushes_refused)

    # A pull waiting for step 3's update is answered when it is applied.
    waited = {}

    def waiter():
        t0 = time.monotonic()
        g = stubs[3].Pull(pb.PullRequest(items=[pb.PullItem(name="w", min_version=4)]),
                          timeout=10)
        waited["version"] = g.values[0].version
        waited["after"] = time.monotonic() - t0

    wt = threading.Thread(target=waiter)
    wt.start()
    time.sleep(0.2)
    # Worker 0 pushes step 3 twice (a retry after its deadline): still counted once.
    try:
        s0.Push(pb.PushRequest(worker=0, step=3,
                               grads=[pstest.grad(pb, "w", np.full(5, 3.0))]), timeout=0.3)
    except grpc.RpcError as e:
        r.check(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED,
                "a sync push whose step is incomplete waits until its deadline")
    out = {}
    threads = [threading.Thread(target=push, args=(w, 3, 3.0, out)) for w in range(3)]
    threads[0].start()
    time.sleep(0.1)
    got = s0.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=5)
    r.check(got.values[0].version == 3, "a retried push is not counted twice")
    threads[1].start()
    threads[2].start()
    for t in threads:
        t.join()
    wt.join()
    r.check(waited.get("version") == 4 and waited.get("after", 0) > 0.15,
            "Pull with min_version waited for the step (%.2fs)" % waited.get("after", -1))
    got = s0.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=5)
    r.check(np.allclose(pstest.value(got.values[0]), -9.0), "step 3 averaged to 3: -9")
    # The step's aggregate (allocated at the first sync push) is slot bytes
    # for Stats and for ListVariables alike.
    st = s0.Stats(pb.StatsRequest(), timeout=5)
    lv = s0.ListVariables(pb.ListVariablesRequest(), timeout=5)
    listed = sum(v.slot_bytes for v in lv.variables)
    r.check(st.slot_bytes == listed == 5 * 4,
            "slot_bytes: Stats %d, the sum over ListVariables %d (the aggregate's 20)"
            % (st.slot_bytes, listed))
    r.check(d.stop() == 0, "psd exits 0 on SIGTERM")
    r.finish()


if __name__ == "__main__":
    main()
