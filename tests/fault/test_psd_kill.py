"""Durability of psd, as a number: SIGKILL it at random moments while
clients push, restart it on the same data directory, and check that every
variable is back, uncorrupted, at a version the promise allows.

The promise (doc/operating.md, "Durability"): with write-behind commits
every 20 ms, a kill -9 loses at most the pushes acknowledged in the last
100 ms (PROMISE_MS: the commit interval plus one commit), or since the
oldest update psd reported not yet durable just before the kill
(Stats.write_behind_lag_ms) when a commit ran longer; with --durable
it loses nothing acknowledged; SIGTERM loses nothing.

Every push is a gradient of ones under SGD with learning rate 1 on a
variable initialized to zeros, so a variable at version v must hold exactly
-v everywhere: any torn or mixed write shows as a value that is not.
"""
import os
import random
import signal
import sys
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402

PROMISE_MS = 100
SIZES = {"small": (16,), "mid": (1000,), "big": (256, 1024)}


class Pusher:
    """Threads that push ones to random variables and log each ack."""

    def __init__(self, pb, pbg, address, nthreads=3):
        self.pb, self.pbg, self.address = pb, pbg, address
        self.acks = {name: [] for name in SIZES}   # (monotonic time, version)
        self.sent = {name: 0 for name in SIZES}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,))
                        for i in range(nthreads)]
        for t in self.threads:
            t.start()

    def run(self, i):
        ch = pstest.channel(self.address)
        stub = self.pbg.ParameterServerStub(ch)
        rng = random.Random(i)
        grads = {n: pstest.grad(self.pb, n, np.ones(s, np.float32))
                 for n, s in SIZES.items()}
        while not self.stop.is_set():
            name = rng.choice(list(SIZES))
            with self.lock:
                self.sent[name] += 1
            try:
                resp = stub.Push(self.pb.PushRequest(worker=i, grads=[grads[name]]),
                                 timeout=2)
            except grpc.RpcError:
                break  # the server died: this thread is done
            with self.lock:
                self.acks[name].append((time.monotonic(), resp.versions[0]))
        ch.close()

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def pull_all(pb, pbg, address):
    ch = pstest.channel(address)
    stub = pbg.ParameterServerStub(ch)
    got = stub.Pull(pb.PullRequest(items=[pb.PullItem(name=n) for n in SIZES]),
                    timeout=10)
    ch.close()
    return {v.name: (v.version, pstest.value(v)) for v in got.values}


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-kill")
    rounds = int(os.environ.get("PSD_KILL_ROUNDS", "6"))

    for durable, mode, data, extra in pstest.durability_modes():
        d = pstest.start_psd(data, *extra)
        ch = pstest.channel(d.address)
        stub = pbg.ParameterServerStub(ch)
        for name, shape in SIZES.items():
            stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
                pb, name, shape, lr=1.0)), timeout=10)
        ch.close()
        worst_ms = 0.0
        rng = random.Random(42 + durable)
        base = {n: 0 for n in SIZES}
        for k in range(rounds):
            ch = pstest.channel(d.address)
            stub = pbg.ParameterServerStub(ch)
            stub.Stats(pb.StatsRequest(), timeout=10)  # connected before the kill
            p = Pusher(pb, pbg, d.address)
            time.sleep(rng.uniform(0.3, 1.2))
            mark, lag = pstest.lag_mark(pb, stub)
            killed_at = time.monotonic()
            bound = min(killed_at - PROMISE_MS / 1000.0, mark)
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
            ch.close()
            p.join()
            d = pstest.start_psd(data, *extra)
            back = pull_all(pb, pbg, d.address)
            r.check(set(back) == set(SIZES),
                    "%s kill %d: every variable is back" % (mode, k))
            for name in SIZES:
                ver, val = back[name]
                r.check(bool(np.all(val == -float(ver))),
                        "%s kill %d: '%s' at version %d holds exactly -%d (uncorrupted)"
                        % (mode, k, name, ver, ver))
                acked = [v for (t, v) in p.acks[name]]
                last = max(acked, default=0)
                # Never ahead of what was sent.
                r.check(ver <= base[name] + p.sent[name],
                        "%s kill %d: '%s' version %d <= %d pushes sent (no phantom "
                        "update)" % (mode, k, name, ver, base[name] + p.sent[name]))
                base[name] = ver
                lost = [t for (t, v) in p.acks[name] if v > ver]
                if lost:
                    worst_ms = max(worst_ms, (killed_at - min(lost)) * 1000)
                if durable:
                    r.check(ver >= last, "%s kill %d: '%s' keeps every acknowledged "
                            "push (%d >= %d)" % (mode, k, name, ver, last))
                else:
                    must = max((v for (t, v) in p.acks[name] if t <= bound), default=0)
                    r.check(ver >= must, "%s kill %d: '%s' keeps every push acknowledged "
                            "more than %d ms before the kill (%d >= %d; psd's write-behind "
                            "lag %s ms)" % (mode, k, name, (killed_at - bound) * 1000, ver,
                                            must, lag))
        print("%s: the oldest acknowledged push lost was acknowledged %.1f ms "
              "before the kill" % (mode, worst_ms), flush=True)

        # SIGTERM loses nothing acknowledged.
        p = Pusher(pb, pbg, d.address)
        time.sleep(0.5)
        p.stop.set()
        p.join()
        last = {n: max((v for (t, v) in p.acks[n]), default=0) for n in SIZES}
        r.check(d.stop() == 0, "%s: psd exits 0 on SIGTERM" % mode)
        d = pstest.start_psd(data, *extra)
        back = pull_all(pb, pbg, d.address)
        r.check(all(back[n][0] >= last[n] for n in SIZES),
                "%s: SIGTERM lost nothing acknowledged (%s vs %s)"
                % (mode, {n: back[n][0] for n in SIZES}, last))
        d.stop()
    r.finish()


if __name__ == "__main__":
    main()
