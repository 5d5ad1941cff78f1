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
- a pull may carry the ids of the next pull (SparsePullItem.next_ids):
  psd reads those on disk ahead, and the next pull finds them in memory
  (no reads of its own); a hint never followed, of ids with no row
  (never pushed, negative, the int64 bounds) or empty changes no answer
  and reads nothing for the ids with no row; a hint longer than one pull
  can answer is refused (INVALID_ARGUMENT naming next_ids) and changes
  nothing. Two batches are read ahead at once (a pull submits its hint's
  before it takes the last pull's): a pull without a hint takes a batch
  in flight that holds its rows, and a chain broken by a pull of other
  ids drops the batch it did not follow and answers every row. The
  one-moment check runs again with every pull hinting the
  blocks it will ask next, which the pusher then changes while their reads
  ahead are in flight. (Rows read ahead put in the tier without checking
  that the row had not entered it meanwhile failed this.)
- a push may carry the ids of the next push (SparseGradient.next_ids), read
  ahead the same way: the next push reads almost nothing itself; a hint
  never followed, of ids with no row, or empty changes no answer and no
  stored row; one longer than a push can carry is refused
  (INVALID_ARGUMENT naming next_ids) with nothing applied. Pushes naming
  their next batch, raced by a pusher on another connection that adds 2
  to half of the batch being read ahead, answer and store exactly what
  the same pushes without hints do: each row ends at its base less 1 and
  2 per racing push of it.
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


def push_req(ids, g, next_ids=None, ret=False):
    return pb.SparsePushRequest(return_values=ret, grads=[pb.SparseGradient(
        name="emb", ids=list(ids), next_ids=[] if next_ids is None else list(next_ids),
        grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[len(ids), DIM],
                       data=np.ascontiguousarray(g, "<f4").tobytes()))])


def push(stub, ids, g, next_ids=None, ret=False):
    return stub.SparsePush(push_req(ids, g, next_ids, ret), timeout=60)


def push_rows(stub, ids, g, next_ids=None):
    """A push with return_values: the rows as updated."""
    r = push(stub, ids, g, next_ids, ret=True).values[0]
    return np.frombuffer(r.values.data, "<f4").reshape(len(ids), DIM)


def pull(stub, ids, next_ids=None):
    r = stub.SparsePull(pb.SparsePullRequest(items=[pb.SparsePullItem(
        name="emb", ids=list(ids),
        next_ids=[] if next_ids is None else list(next_ids))]), timeout=60).rows[0]
    return np.frombuffer(r.values.data, "<f4").reshape(len(ids), DIM)


def grad_of(ids):
    """Each row's fill gradient: its value is minus this (SGD, lr 1,
    zeros), exact in float32."""
    ids = np.asarray(ids, np.int64)
    return (ids % 1009)[:, None].astype(np.float32) + np.arange(DIM, dtype=np.float32) / 32


def fill(stub):
    for lo in range(0, ROWS, 10000):  # within the 1 MiB message limit
        ids = np.arange(lo, min(ROWS, lo + 10000))
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


def expected(ids):
    """What a pull of ids answers once fill ran (values() pushes nothing):
    rows of [0, ROWS) minus their gradient, the rest (hot rows, never
    pushed) 0."""
    ids = np.asarray(ids, np.int64)
    want = -grad_of(ids)
    want[(ids < 0) | (ids >= ROWS)] = 0.0
    return want


def hints(stub):
    """Pulls with next_ids: a followed hint's rows are read ahead; junk
    hints change no answer and read nothing; an oversized one is refused."""
    rng = np.random.default_rng(11)
    # Rows pushed first (the last pushed are still in the tier); values()
    # pulled some. A pull of x alone, then one of x2 naming y as next (y
    # within a batch's cap here: buffers of a sixteenth of the 16 MiB
    # budget, 1024 reads of records of 112 bytes).
    ids = rng.choice(np.arange(0, 100000), 7000, replace=False)
    x, x2, y = ids[:3000], ids[3000:6000], ids[6000:]
    r0 = cold_reads(stub)
    got = pull(stub, x)
    r1 = cold_reads(stub)
    got2 = pull(stub, x2, next_ids=y)
    r2 = cold_reads(stub)
    R.check(np.array_equal(got, expected(x)) and np.array_equal(got2, expected(x2)),
            "a pull with a hint answers its rows")
    time.sleep(0.2)  # the reads ahead complete
    got = pull(stub, y)
    r3 = cold_reads(stub)
    R.check(np.array_equal(got, expected(y)), "the hinted pull answers its rows")
    R.check(r2 - r1 >= (r1 - r0) + 0.6 * len(y) and r3 - r2 <= 0.1 * (r1 - r0),
            "the hint's rows were read ahead: a pull of 3000 rows read %d rows, one "
            "naming 1000 more as next %d, then the pull of those %d" %
            (r1 - r0, r2 - r1, r3 - r2))
    # A hint never followed, and one never pushed: no answer changes.
    z = rng.choice(np.arange(0, 200000), 3000, replace=False)
    before = pull(stub, HOT)
    got = pull(stub, HOT, next_ids=z)
    R.check(np.array_equal(got, before), "a hint never followed changes no answer")
    junk = [-1, -2 ** 63, 2 ** 63 - 1, ROWS, ROWS + 1, 10 ** 12, 5000000] * 100
    # A push of zeros (SGD: no value changes) keeps the hot rows in the RAM
    # tier until its batch is applied, so that the calls below read none of
    # their own rows whatever the clock dropped meanwhile: what they read is
    # the hint's.
    push(stub, HOT, np.zeros((len(HOT), DIM), np.float32))
    r3 = cold_reads(stub)
    got = pull(stub, HOT + [ROWS + 7], next_ids=junk)
    got_empty = pull(stub, HOT + [ROWS + 7], next_ids=[])
    r4 = cold_reads(stub)
    R.check(np.array_equal(got, got_empty) and np.array_equal(got, expected(HOT + [ROWS + 7])),
            "a hint of ids with no row, or an empty one, changes no answer")
    R.check(r4 - r3 == 0, "a hint of ids with no row reads nothing (%d reads)" % (r4 - r3))
    # The ids of z, pulled now, answer what they hold.
    got = pull(stub, z)
    R.check(np.array_equal(got, expected(z)), "rows read ahead and pulled later answer "
            "their stored values")
    # More ids than one pull can answer in the message limit (1 MiB here).
    try:
        pull(stub, x[:10], next_ids=list(range(20000)))
        R.check(False, "a hint of 20000 ids is refused under a 1 MiB message limit")
    except grpc.RpcError as e:
        R.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "next_ids" in e.details()
                and "20000" in e.details(),
                "a hint longer than one pull can answer: INVALID_ARGUMENT naming next_ids "
                "(%s: %s)" % (e.code(), e.details()))
    R.check(np.array_equal(pull(stub, x), expected(x)), "the refused pull changed nothing")


def push_hints(stub):
    """Pushes with next_ids (rows of [170000, 200000), on disk, untouched
    so far): a followed hint's rows are read ahead; junk hints change
    nothing; an oversized one is refused with nothing applied."""
    rng = np.random.default_rng(13)
    # y within a batch's cap (a sixteenth of the 16 MiB budget in reads of
    # 1 KiB: 1024).
    ids = rng.choice(np.arange(170000, 200000), 5000, replace=False)
    x, y, z = ids[:3000], ids[3000:4000], ids[4000:]
    one = np.ones((len(x), DIM), np.float32)
    r0 = cold_reads(stub)
    got = push_rows(stub, x, one, next_ids=y)
    r1 = cold_reads(stub)
    R.check(np.array_equal(got, expected(x) - 1), "a push with a hint answers its rows "
            "updated")
    time.sleep(0.2)  # the reads ahead complete
    got = push_rows(stub, y, one[:len(y)])
    r2 = cold_reads(stub)
    R.check(np.array_equal(got, expected(y) - 1), "the hinted push updates its rows")
    got = push_rows(stub, z, one[:len(z)])
    r3 = cold_reads(stub)
    R.check(np.array_equal(got, expected(z) - 1), "a push without a hint updates its rows")
    R.check(r1 - r0 >= 0.6 * (len(x) + len(y)) and r2 - r1 <= 0.1 * (r3 - r2)
            and r3 - r2 >= 0.6 * len(z),
            "the hint's rows were read ahead: a push of 3000 rows naming 1000 as next "
            "read %d rows, the push of those %d, a push of 1000 others without a hint %d"
            % (r1 - r0, r2 - r1, r3 - r2))
    R.check(np.array_equal(pull(stub, np.concatenate([x, y, z])),
                           expected(np.concatenate([x, y, z])) - 1),
            "the rows of the three pushes are stored updated once")
    # A hint never followed, one of ids with no row, an empty one: the
    # same answers and stored rows as no hint.
    w = rng.choice(np.arange(0, 100000), 3000, replace=False)
    before = pull(stub, w)
    junk = [-1, -2 ** 63, 2 ** 63 - 1, ROWS, ROWS + 1, 10 ** 12] * 100
    zero = np.zeros((len(HOT), DIM), np.float32)
    push(stub, HOT, zero)  # the hot rows held in the tier (above)
    r4 = cold_reads(stub)
    a = push_rows(stub, HOT, zero, next_ids=junk)
    b = push_rows(stub, HOT, zero, next_ids=[])
    r5 = cold_reads(stub)
    c = push_rows(stub, HOT, zero, next_ids=w)
    R.check(np.array_equal(a, b) and np.array_equal(a, c) and
            np.array_equal(a, pull(stub, HOT)),
            "a hint of ids with no row, an empty one or one never followed changes no "
            "answer of a push")
    R.check(r5 - r4 == 0, "a push's hint of ids with no row reads nothing (%d reads)"
            % (r5 - r4))
    R.check(np.array_equal(pull(stub, w), before), "rows read ahead and never pushed "
            "keep their stored values")
    # More ids than one push can carry in the message limit (1 MiB: 16 floats
    # a row): refused whole.
    try:
        push(stub, x[:10], one[:10], next_ids=list(range(20000)))
        R.check(False, "a push's hint of 20000 ids is refused under a 1 MiB message limit")
    except grpc.RpcError as e:
        R.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "next_ids" in e.details()
                and "20000" in e.details() and "nothing applied" in e.details(),
                "a push's hint longer than one push can carry: INVALID_ARGUMENT naming "
                "next_ids (%s: %s)" % (e.code(), e.details()))
    R.check(np.array_equal(pull(stub, x), expected(x) - 1), "the refused push changed "
            "nothing")


def push_race(stub, address, hint, first, batches=40):
    """Pushes of consecutive blocks of rows on disk, each adding 1, with
    (hint) or without the next block as next_ids, while a pusher on its own
    connection adds 2 to a random half of the block after the one being
    pushed (the one read ahead) as often as it can. Returns the number of
    racing pushes that landed in a block before its own push."""
    def block(b):
        return np.arange(first + b * BLOCK, first + (b + 1) * BLOCK)

    at = [0]
    stop = threading.Event()
    errors = []
    racer = np.zeros(batches * BLOCK, np.int64)  # racing pushes of each row
    ch = grpc.insecure_channel(address, options=pstest.CHANNEL_OPTIONS + [
        ("grpc.use_local_subchannel_pool", 1)])
    rstub = pbg.ParameterServerStub(ch)

    def race():
        rng = np.random.default_rng(first)
        two = np.full((BLOCK // 2, DIM), 2.0, np.float32)
        try:
            while not stop.is_set():
                b = at[0] + 1
                if b >= batches:
                    time.sleep(0.001)
                    continue
                ids = rng.choice(block(b), BLOCK // 2, replace=False)
                racer[ids - first] += 1  # before: a push may see it as it lands
                rstub.SparsePush(push_req(ids, two), timeout=60)
        except grpc.RpcError as e:
            errors.append(e)

    t = threading.Thread(target=race)
    base = expected(np.arange(first, first + batches * BLOCK))
    one = np.ones((BLOCK, DIM), np.float32)
    bad = 0
    t.start()
    try:
        for b in range(batches):
            at[0] = b
            nxt = block(b + 1) if hint and b + 1 < batches else None
            got = push_rows(stub, block(b), one, next_ids=nxt)
            # Its answer: the base less 1, and 2 per racing push before it.
            lo = b * BLOCK
            k = (base[lo:lo + BLOCK] - 1 - got) / 2
            bad += int(np.sum(np.any((k != np.round(k)) | (k < 0) |
                                     (k > racer[lo:lo + BLOCK, None]), axis=1)))
            time.sleep(0.002)  # the racer's turn
    finally:
        stop.set()
        t.join(60)
        ch.close()
    how = "with" if hint else "without"
    final = pull(stub, np.arange(first, first + batches * BLOCK))
    want = base - 1 - 2 * racer[:, None].astype(np.float32)
    R.check(not errors, "the racing pushes succeeded: %s" % errors[:1])
    R.check(bad == 0, "pushes %s hints answer each row as its base less 1 and 2 per "
            "racing push (%d rows did not)" % (how, bad))
    R.check(np.array_equal(final, want), "pushes %s hints raced by another pusher store "
            "each row exactly (%d rows wrong, %d racing pushes)"
            % (how, int(np.sum(np.any(final != want, axis=1))), int(racer.sum())))
    return int(racer.sum())


def chain(stub):
    """Two batches in flight: a pull's hint is read while the batch the
    last pull named is still being taken. A pull that follows its hint
    without one of its own, or a chain broken by a pull asking other ids,
    answers its rows and reads (almost) nothing that a batch holds."""
    rng = np.random.default_rng(13)
    ids = rng.choice(np.arange(100000, 200000), 7 * 1000, replace=False)
    a, b, c, d, e, f, g = (ids[k * 1000:(k + 1) * 1000] for k in range(7))
    bad = 0
    r0 = cold_reads(stub)
    bad += not np.array_equal(pull(stub, a, next_ids=b), expected(a))
    bad += not np.array_equal(pull(stub, b, next_ids=c), expected(b))
    r1 = cold_reads(stub)
    time.sleep(0.2)  # the reads ahead complete
    bad += not np.array_equal(pull(stub, c), expected(c))
    r2 = cold_reads(stub)
    R.check(r1 - r0 >= 1.5 * 0.6 * len(a) and r2 - r1 <= 0.1 * len(c),
            "a pull without a hint takes the rows of the batch in flight: a chain of "
            "two hinted pulls read %d rows, the pull of the second's hint %d" %
            (r1 - r0, r2 - r1))
    # d names e, f does not follow it and names g: e's batch is dropped,
    # g's is taken by the pull of g, and e's rows are read when asked.
    bad += not np.array_equal(pull(stub, d, next_ids=e), expected(d))
    bad += not np.array_equal(pull(stub, f, next_ids=g), expected(f))
    r3 = cold_reads(stub)
    bad += not np.array_equal(pull(stub, g, next_ids=[]), expected(g))
    r4 = cold_reads(stub)
    bad += not np.array_equal(pull(stub, e), expected(e))
    R.check(r4 - r3 <= 0.1 * len(g), "a hint not followed leaves the next one's batch "
            "to its pull (which read %d rows of %d)" % (r4 - r3, len(g)))
    R.check(bad == 0, "every pull of a chain of hints answers its rows (%d did not)" % bad)


def one_moment(stub, address, hint=False, first=100000):
    """The pusher adds 1 to the hot rows and to block b at its push b, its
    requests built beforehand so that pushes follow each other closely;
    the puller asks the hot rows and the next AHEAD blocks from the one the
    pusher is at, which are on disk until their push: pushes land while
    the pull's reads are in flight. With hint, each pull names the blocks
    of the pull after it as next_ids (AHEAD more from where the pusher will
    be), read ahead while the pusher changes them."""
    at = [0]
    stop = threading.Event()
    errors = []

    def block(b):
        return np.arange(first + b * BLOCK, first + (b + 1) * BLOCK)

    hot0 = int(round(-float(pull(stub, HOT)[0, 0])))  # an earlier round's pushes

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
    base = -grad_of(np.arange(first, first + (BLOCKS + AHEAD + 1) * BLOCK))
    checked = torn = raced = 0
    t0 = time.time()
    t.start()
    try:
        while t.is_alive() and time.time() - t0 < 20:
            b = at[0]
            ids = np.concatenate([HOT] + [block(b + j) for j in range(AHEAD)])
            nxt = None
            if hint:
                nxt = np.concatenate([block(b + 1 + j) for j in range(AHEAD)]).tolist()
            got = pull(stub, ids, next_ids=nxt)
            hot = got[:len(HOT)]
            n = int(round(-float(hot[0, 0]))) - hot0  # pushes the hot rows count
            if not np.all(hot == -float(n + hot0)):
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
    how = " (pulls with hints)" if hint else ""
    R.check(not errors, "the pusher's pushes succeeded%s: %s" % (how, errors[:1]))
    R.check(raced >= 10, "%d pulls raced the pusher, %d of them saw pushes sent after "
            "them%s" % (checked, raced, how))
    R.check(torn == 0, "every pull showed one moment of the table: a block pushed "
            "exactly when the hot rows count its push (%d of %d did not)%s"
            % (torn, checked, how))


def main():
    # A tier of 16 MiB (a quarter of 64M) with the index of 300,000 rows:
    # about a tenth of the table's rows fit in it. Calls run at once on
    # several threads (one, the default, serves them one after another).
    d = pstest.start_psd(pstest.tmpdir(), "--memory-limit", "64M", "--threads", "3",
                         "--max-message", "1M")
    try:
        stub = pbg.ParameterServerStub(pstest.channel(d.address))
        stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
            pb, "emb", (DIM,), lr=1.0, sparse=True)), timeout=10)
        fill(stub)
        values(stub)
        hints(stub)
        chain(stub)
        one_moment(stub, d.address)
        one_moment(stub, d.address, hint=True, first=ROWS - (BLOCKS + AHEAD + 1) * BLOCK)
        push_hints(stub)
        raced = push_race(stub, d.address, False, 200000)
        raced += push_race(stub, d.address, True, 220000)
        R.check(raced >= 20, "the racer's pushes landed (%d)" % raced)
    finally:
        d.stop()
    R.finish()


if __name__ == "__main__":
    main()
