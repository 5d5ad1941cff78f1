"""A sparse table several times its RAM tier, against a real psd: a pull
reads its misses from the segments and answers them with its rows in the
tier. Checked here from an outside client:

- every row of pulls that mix rows in the tier and rows on disk has its
  stored value (and an id never pushed its initial one), the same as
  when it is pulled alone;
- a pull is one moment of its table while pushes land during its reads:
  a pusher (on a connection of its own, psd with several gRPC threads)
  adds 1 to a few hot rows (always in the tier) and to a block of rows no
  push touched before (on disk), one push at a time; every answer that
  holds the hot rows and those blocks must show a block pushed exactly
  when the hot rows count its push. (A pull that answered its hot rows
  before its reads and the blocks after them, without answering them
  again, failed this: 44 torn answers of 40 pulls.)
"""
import os
import sys
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

pb, pbg, _, _ = pstest.generate_stubs()
R = pstest.Results("psd-sparse-cold")
DIM = 16
ROWS = 300000
BLOCK = 400
BLOCKS = 150
AHEAD = 8
HOT = list(range(5000000, 5000000 + 64))


def push(stub, ids, g):
    return stub.SparsePush(pb.SparsePushRequest(grads=[pb.SparseGradient(
        name="emb", ids=list(ids),
        grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[len(ids), DIM],
                       data=np.ascontiguousarray(g, "<f4").tobytes()))]), timeout=60)


def pull(stub, ids):
    r = stub.SparsePull(pb.SparsePullRequest(items=[pb.SparsePullItem(
        name="emb", ids=list(ids))]), timeout=60).rows[0]
    return np.frombuffer(r.values.data, "<f4").reshape(len(ids), DIM)


def grad_of(ids):
    """Each row's fill gradient: its value is minus this (SGD, lr 1,
    zeros), exact in float32."""
    ids = np.asarray(ids, np.int64)
    return (ids % 1009)[:, None].astype(np.float32) + np.arange(DIM, dtype=np.float32) / 32


def fill(stub):
    for lo in range(0, ROWS, 50000):
        ids = np.arange(lo, min(ROWS, lo + 50000))
        push(stub, ids, grad_of(ids))
    push(stub, HOT, np.zeros((len(HOT), DIM), np.float32))


def cold_reads(stub):
    return stub.Stats(pb.StatsRequest(), timeout=10).sparse_segment_reads


def values(stub):
    rng = np.random.default_rng(7)
    for _ in range(3):  # the hot rows stay in the tier
        pull(stub, HOT)
    before = cold_reads(stub)
    bad = 0
    for k in range(20):
        ids = np.concatenate([HOT, rng.integers(0, ROWS, 3000),
                              rng.integers(10 ** 7, 2 * 10 ** 7, 50)])
        got = pull(stub, ids)
        want = -grad_of(ids)
        want[:len(HOT)] = 0.0
        want[len(HOT) + 3000:] = 0.0  # never pushed: the initial value
        bad += int(np.sum(np.any(got != want, axis=1)))
        if k == 0:
            alone = np.concatenate([pull(stub, [i]) for i in ids[::97]])
            R.check(np.array_equal(alone, got[::97]),
                    "a mixed pull answers each row as a pull of it alone does")
    reads = cold_reads(stub) - before
    R.check(reads >= 20 * 1000, "the pulls read rows from disk (%d reads for 20 "
            "pulls of 3000 rows of %d)" % (reads, ROWS))
    R.check(bad == 0, "every row of 20 pulls mixing the RAM tier and the disk has "
            "its stored value (%d did not)" % bad)


def one_moment(stub, address):
    """The pusher adds 1 to the hot rows and to block b at its push b, its
    requests built beforehand so that pushes follow each other closely;
    the puller asks the hot rows and the next AHEAD blocks from the one the
    pusher is at, which are on disk until their push: pushes land while
    the pull's reads are in flight."""
    at = [0]
    stop = threading.Event()
    errors = []

    def block(b):
        return np.arange(100000 + b * BLOCK, 100000 + (b + 1) * BLOCK)

    reqs = []
    for b in range(BLOCKS):
        ids = np.concatenate([HOT, block(b)])
        reqs.append(pb.SparsePushRequest(grads=[pb.SparseGradient(
            name="emb", ids=list(ids), grad=pb.Tensor(
                dtype=pb.DTYPE_FLOAT32, shape=[len(ids), DIM],
                data=np.ones((len(ids), DIM), "<f4").tobytes()))]))

    # A connection of its own: gRPC gives a connection's calls to one
    # completion-queue thread, one after another.
    ch = grpc.insecure_channel(address, options=pstest.CHANNEL_OPTIONS + [
        ("grpc.use_local_subchannel_pool", 1)])
    pstub = pbg.ParameterServerStub(ch)

    def pusher():
        try:
            for b in range(BLOCKS):
                if stop.is_set():
                    break
                pstub.SparsePush(reqs[b], timeout=60)
                at[0] = b + 1
        except grpc.RpcError as e:
            errors.append(e)

    t = threading.Thread(target=pusher)
    base = -grad_of(np.arange(100000, 100000 + (BLOCKS + AHEAD) * BLOCK))
    checked = torn = raced = 0
    t0 = time.time()
    t.start()
    try:
        while t.is_alive() and time.time() - t0 < 20:
            b = at[0]
            ids = np.concatenate([HOT] + [block(b + j) for j in range(AHEAD)])
            got = pull(stub, ids)
            hot = got[:len(HOT)]
            n = int(round(-float(hot[0, 0])))  # pushes the hot rows count
            if not np.all(hot == -float(n)):
                torn += 1
                continue
            raced += n > b
            for j in range(AHEAD):
                rows = got[len(HOT) + j * BLOCK:len(HOT) + (j + 1) * BLOCK]
                lo = (b + j) * BLOCK
                want = base[lo:lo + BLOCK] - (1.0 if b + j < n else 0.0)
                torn += int(not np.array_equal(rows, want))
            checked += 1
    finally:
        stop.set()
        t.join(60)
        ch.close()
    R.check(not errors, "the pusher's pushes succeeded: %s" % errors[:1])
    R.check(raced >= 10, "%d pulls raced the pusher, %d of them saw pushes sent after them"
            % (checked, raced))
    R.check(torn == 0, "every pull showed one moment of the table: a block pushed "
            "exactly when the hot rows count its push (%d of %d did not)" % (torn, checked))


def main():
    # A tier of 16 MiB (a quarter of 64M) with the index of 300,000 rows:
    # about a tenth of the table's rows fit in it. Calls run at once on
    # several threads (one, the default, serves them one after another).
    d = pstest.start_psd(pstest.tmpdir(), "--memory-limit", "64M", "--threads", "3")
    try:
        stub = pbg.ParameterServerStub(pstest.channel(d.address))
        stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
            pb, "emb", (DIM,), lr=1.0, sparse=True)), timeout=10)
        fill(stub)
        values(stub)
        one_moment(stub, d.address)
    finally:
        d.stop()
    R.finish()


if __name__ == "__main__":
    main()
