"""BOUNDED_STALENESS on a real psd, with two Python clients as the workers:
a pull at clock k waits until the slowest live worker's clock is at least
k - staleness; psd gives up with DEADLINE_EXCEEDED naming the slow worker;
a worker silent for --worker-timeout stops holding the others back; a pull
without a clock (a reader) is never held."""
import os
import sys
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

C = grpc.StatusCode
S = 2              # staleness
WORKER_TIMEOUT = 1.5
MAX_PULL_WAIT = 0.7


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-staleness")
    d = pstest.start_psd(pstest.tmpdir(), "--worker-timeout",
                         "%dms" % (WORKER_TIMEOUT * 1000), "--max-pull-wait",
                         "%dms" % (MAX_PULL_WAIT * 1000))
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)

    def create(name, staleness, consistency=pb.BOUNDED_STALENESS):
        return stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
            pb, name, (4,), consistency=consistency, staleness=staleness)),
            timeout=5)

    def pull(worker, step, timeout=5.0, name="w"):
        return stub.Pull(pb.PullRequest(items=[pb.PullItem(name=name)],
                                        worker=worker, step=step),
                         timeout=timeout)

    r.refused("staleness 2000000", lambda: create("huge", 2000000),
              C.INVALID_ARGUMENT, "'huge'", "staleness in [0, 1000000]")
    create("w", S)
    info = stub.ListVariables(pb.ListVariablesRequest(), timeout=5).variables[0]
    r.check(info.spec.consistency == pb.BOUNDED_STALENESS
            and info.spec.staleness == S,
            "the spec keeps BOUNDED_STALENESS and staleness %d" % S)

    # Worker 1 (slow) is at clock 1; worker 0 may reach 1 + S at once.
    pull(1, 1)
    t0 = time.monotonic()
    for k in range(1, S + 2):
        pull(0, k)
    r.check(time.monotonic() - t0 < 0.5,
            "worker 0 pulls clocks 1..%d at once while worker 1 is at 1" % (S + 1))

    # One more is held, and psd gives up after --max-pull-wait.
    t0 = time.monotonic()
    pull(1, 1)  # worker 1 stays live
    r.refused("worker 0's pull at clock %d" % (S + 2), lambda: pull(0, S + 2),
              C.DEADLINE_EXCEEDED, "worker 0 at step %d" % (S + 2),
              "at most %d steps ahead" % S, "worker 1 at step 1")
    waited = time.monotonic() - t0
    r.check(MAX_PULL_WAIT - 0.05 <= waited < MAX_PULL_WAIT + 1.0,
            "... after about --max-pull-wait (%.2f s)" % waited)

    # A pull without a clock is never held.
    t0 = time.monotonic()
    stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=5)
    r.check(time.monotonic() - t0 < 0.3, "a pull with step 0 is answered at once")

    # The held pull is answered once worker 1 moves on.
    got = {}

    def fast():
        t = time.monotonic()
        try:
            pull(0, S + 2)
            got["ok"] = time.monotonic() - t
        except grpc.RpcError as e:
            got["err"] = e.details()
    th = threading.Thread(target=fast)
    th.start()
    time.sleep(0.3)
    pull(1, 2)
    th.join()
    r.check("ok" in got and got["ok"] >= 0.25,
            "worker 0's pull at clock %d returns once worker 1 reaches 2 "
            "(after %.2f s; %s)" % (S + 2, got.get("ok", -1), got.get("err", "")))

    # Worker 1 dies (stops pulling): worker 0 goes on after --worker-timeout.
    last = time.monotonic()
    pull(1, 2)
    first_ok = None
    attempts = 0
    while time.monotonic() - last < WORKER_TIMEOUT + 3:
        attempts += 1
        try:
            pull(0, 10)
            first_ok = time.monotonic() - last
            break
        except grpc.RpcError as e:
            if e.code() != C.DEADLINE_EXCEEDED:
                break
    r.check(first_ok is not None and WORKER_TIMEOUT - 0.1 <= first_ok
            <= WORKER_TIMEOUT + 1.0,
            "with worker 1 silent, worker 0 at clock 10 goes on %.2f s after "
            "worker 1's last pull (--worker-timeout %.1f s, %d tries)"
            % (first_ok or -1, WORKER_TIMEOUT, attempts))
    # ... and back: worker 1 pulls again, and counts again.
    pull(1, 3)
    r.refused("worker 0 at clock 11 once worker 1 is back at 3",
              lambda: pull(0, 11), C.DEADLINE_EXCEEDED, "worker 1 at step 3")

    # Pushes to a bounded variable are applied on arrival, as async.
    stub.Push(pb.PushRequest(worker=0, step=5, grads=[
        pstest.grad(pb, "w", np.ones(4, np.float32))]), timeout=5)
    v = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=5).values[0]
    r.check(v.version == 1 and np.allclose(pstest.value(v), -0.1),
            "a push is applied on arrival (version %d)" % v.version)

    # An async variable in the same pull is not bounded; a bounded one is.
    create("a", 0, pb.ASYNC)
    t0 = time.monotonic()
    pull(0, 50, name="a")
    r.check(time.monotonic() - t0 < 0.3, "an ASYNC variable's pull is never held")
    ch.close()
    r.check(d.stop() == 0, "psd exits 0 on SIGTERM")
    r.finish()


if __name__ == "__main__":
    main()
