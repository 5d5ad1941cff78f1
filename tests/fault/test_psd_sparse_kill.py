"""Durability of sparse tables: SIGKILL psd while clients push sparse rows,
restart it on the same data directory, and check that the rows are back at
counts the promise allows (doc/operating.md, "Durability"): write-behind
loses at most the pushes acknowledged in the last 100 ms, --durable none.

Thread i pushes ids [i, 1000 + i, 1000 + i] with gradients of ones under
SGD (learning rate 1, zeros): row i must be exactly -n and row 1000 + i
exactly -2n (the repeated id summed) for the n pushes applied; anything
else is a torn or half-applied push. A bulk thread meanwhile pushes the
same BULK rows again and again (ones): after the restart every one of them
must hold the same -n, a commit holding a push whole or not at all however
many rows wait, and n must cover its pushes acknowledged before the bound.
"""
import os
import random
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402

PROMISE_MS = 100
DIM = 16
THREADS = 3
BULK = 6000
BULK_IDS = [100000 + 7 * j for j in range(BULK)]
pb, pbg, _, _ = pstest.generate_stubs()
R = pstest.Results("psd-sparse-kill")


def push_req(i):
    g = np.ones((3, DIM), np.float32)
    return pb.SparsePushRequest(grads=[pb.SparseGradient(
        name="emb", ids=[i, 1000 + i, 1000 + i],
        grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[3, DIM], data=g.tobytes()))])


def bulk_req():
    g = np.ones((BULK, DIM), np.float32)
    return pb.SparsePushRequest(grads=[pb.SparseGradient(
        name="emb", ids=BULK_IDS,
        grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[BULK, DIM], data=g.tobytes()))])


def bulk_count(address):
    """The bulk rows' common count, or None when they differ (torn)."""
    ch = pstest.channel(address)
    r = pbg.ParameterServerStub(ch).SparsePull(pb.SparsePullRequest(items=[
        pb.SparsePullItem(name="emb", ids=BULK_IDS)]), timeout=30).rows[0]
    ch.close()
    v = np.frombuffer(r.values.data, dtype="<f4")
    return int(-v[0]) if np.all(v == v[0]) else None


def pushers(address):
    """The THREADS small pushers and the bulk one."""
    reqs = [push_req(i) for i in range(THREADS)] + [bulk_req()]
    return pstest.Pushers(address, [lambda r=r: r for r in reqs], timeout=2)


def counts(address):
    """Pushes applied per thread, or None for a row that is not whole."""
    ch = pstest.channel(address)
    stub = pbg.ParameterServerStub(ch)
    ids = list(range(THREADS)) + [1000 + i for i in range(THREADS)]
    r = stub.SparsePull(pb.SparsePullRequest(items=[pb.SparsePullItem(
        name="emb", ids=ids)]), timeout=10).rows[0]
    ch.close()
    v = np.frombuffer(r.values.data, dtype="<f4").reshape(len(ids), DIM)
    out = []
    for i in range(THREADS):
        a, b = v[i], v[THREADS + i]
        whole = np.all(a == a[0]) and np.all(b == b[0]) and b[0] == 2 * a[0]
        out.append(int(-a[0]) if whole else None)
    return out


def main():
    replays = 0
    for durable, mode, data, extra in pstest.durability_modes():
        d = pstest.start_psd(data, *extra)
        ch = pstest.channel(d.address)
        pbg.ParameterServerStub(ch).CreateVariable(pb.CreateVariableRequest(
            spec=pstest.spec(pb, "emb", (DIM,), lr=1.0, sparse=True)), timeout=5)
        ch.close()
        rng = random.Random(7 + durable)
        for rnd in range(3):
            base = counts(d.address)
            bbase = bulk_count(d.address)
            ch = pstest.channel(d.address)
            stub = pbg.ParameterServerStub(ch)
            stub.Stats(pb.StatsRequest(), timeout=10)  # connected before the kill
            p = pushers(d.address)
            time.sleep(rng.uniform(0.3, 1.0))
            mark, lag = pstest.lag_mark(pb, stub)
            t_kill = time.monotonic()
            bound = t_kill if durable else min(t_kill - PROMISE_MS / 1000.0, mark)
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
            ch.close()
            p.join()
            logs = [os.path.join(data, "rows.log.%d" % k) for k in (0, 1)]
            logged = sum(os.path.getsize(f) for f in logs if os.path.exists(f))
            replays += logged > 0
            if rnd == 2 and not durable:
                # The tail of a batch whose write a crash cut short: it was
                # never acknowledged, and psd must start past it.
                with open(max(logs, key=os.path.getsize), "ab") as f:
                    f.write(b"PSRL" + bytes(range(27)))
            d = pstest.start_psd(data, *extra)
            got = counts(d.address)
            ok = all(g is not None for g in got)
            lost = []
            for i in range(THREADS):
                if got[i] is None:
                    continue
                n = got[i] - base[i]
                must = sum(1 for t in p.acks[i] if t <= bound)
                ok = ok and must <= n <= p.sent[i]
                lost.append(len(p.acks[i]) - n)
            R.check(ok, "%s round %d: rows whole, %s pushes acked, %s lost (bound: "
                    "those of the last %d ms; psd's write-behind lag %s ms)"
                    % (mode, rnd, [len(a) for a in p.acks[:THREADS]], lost,
                       (t_kill - bound) * 1000, lag))
            bn = bulk_count(d.address)
            must = sum(1 for t in p.acks[THREADS] if t <= bound)
            bok = bn is not None and bbase is not None and \
                must <= bn - bbase <= p.sent[THREADS]
            R.check(bok, "%s round %d: the %d bulk rows hold one count (%s), %d pushes "
                    "of them acked, %s applied, %d acked before the bound"
                    % (mode, rnd, BULK, "torn" if bn is None else "whole",
                       len(p.acks[THREADS]), None if bn is None or bbase is None
                       else bn - bbase, must))
        d.stop()
    R.check(replays > 0, "the row log held acknowledged rows not yet in LMDB at %d of 6 "
            "kills (replayed when psd started again)" % replays)
    R.finish()


if __name__ == "__main__":
    main()
