"""kill -9 of psd during pushes to a sparse table larger than its memory,
psd in a cgroup v1 memory group (doc/sparse.md, "Layout on disk"): the
rows are in segment files, read back with O_DIRECT, and the RAM tier
churns. After each restart (in the same group) every push acknowledged
before the bound (write-behind: all but the last 100 ms, or psd's own
write-behind lag just before the kill if a commit ran longer) is there, no row
is torn, and the cgroup never killed psd. The catalog lags: while pushes
run psd writes it only past 1 GiB of records, so the first restart
replays every record since the fill began (its queue long dropped), and
each restart the records past the catalog's last write (psd's log says
how many, and how long it took).

The table: ROWS rows of DIM floats, row id holding -(id % 1000) / 8 after
its first push (SGD, learning rate 1, zeros); later pushes add gradients
of ones, so a whole row has every element equal and -(id % 1000) / 8 - n
for an integer n >= 0. Thread i pushes ids [i, i + 1, i + 1] (ids below
the table's) as psd-sparse-kill does; a bulk thread pushes the same BULK
ids spread over the table, which must hold one count; a cold thread pushes
ones to random batches of the table.

Needs root and a writable /sys/fs/cgroup/memory; skips with one line
otherwise."""
import os
import random
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402

LIMIT = 96 << 20
DIM = 64
ROWS = 500_000           # x (32 + 16 + 256) bytes: ~145 MiB of records
BATCH = 4096
BASE = 10_000_000        # the table's ids: BASE + k * 7
THREADS = 2
BULK = 3000
BULK_IDS = [BASE + 7 * (j * (ROWS // BULK)) for j in range(BULK)]
PROMISE_MS = 100
pb, pbg, _, _ = pstest.generate_stubs()
R = pstest.Results("psd-segments-kill")


def table_id(k):
    return BASE + 7 * np.asarray(k, np.int64)


def first(ids):
    return ((np.asarray(ids) % 1000) / 8.0).astype(np.float32)


def req(ids, g):
    g = np.ascontiguousarray(g, np.float32)
    return pb.SparsePushRequest(grads=[pb.SparseGradient(
        name="emb", ids=[int(i) for i in ids], grad=pb.Tensor(
            dtype=pb.DTYPE_FLOAT32, shape=list(g.shape), data=g.tobytes()))])


def pull(stub, ids):
    return pstest.sparse_pull(pb, stub, "emb", ids, DIM, BATCH)


def requests(seed):
    """The request makers of the THREADS small pushers, the bulk one and the
    cold one."""
    rng = np.random.default_rng(seed)
    small = [req([10 * i, 10 * i + 1, 10 * i + 1], np.ones((3, DIM))) for i in range(THREADS)]
    bulk = req(BULK_IDS, np.ones((BULK, DIM)))

    def cold():
        k = rng.integers(0, ROWS - 1, BATCH)
        k[k % (ROWS // BULK) == 0] += 1  # never a bulk row: those hold one count
        return req(table_id(k), np.ones((BATCH, DIM)))
    return [lambda r=r: r for r in small] + [lambda: bulk, cold]


def small_counts(stub):
    ids = [10 * i + k for i in range(THREADS) for k in (0, 1)]
    v = pull(stub, ids)
    out = []
    for i in range(THREADS):
        a, b = v[2 * i], v[2 * i + 1]
        whole = np.all(a == a[0]) and np.all(b == b[0]) and b[0] == 2 * a[0]
        out.append(int(-a[0]) if whole else None)
    return out


def bulk_count(stub):
    v = pull(stub, BULK_IDS) + first(BULK_IDS)[:, None]
    return int(-v[0, 0]) if np.all(v == v[0, 0]) else None


def start(data, cg, log=None):
    """psd in the group; with log, its info lines go to that file."""
    if log is None:
        return pstest.start_psd(data, "--memory-limit", str(LIMIT),
                                wrapper=pstest.cgroup_wrapper(cg))
    argv = [pstest.psd_path(), "--data-dir", data, "--listen", "127.0.0.1:0",
            "--log-level", "info", "--memory-limit", str(LIMIT)]
    with open(log, "w") as f:
        return pstest.Daemon(pstest.cgroup_wrapper(cg) + argv, stderr=f)


def replayed(log):
    """The records psd replayed into its catalog at open, as it logged, and
    the MiB and ms that took."""
    with open(log) as f:
        for line in f:
            if "catalog: replayed" in line:
                w = line.split("catalog: replayed ")[1].split()
                timed = w[-1] == "ms" and w[2].startswith("(")
                return (int(w[0]), int(w[2].lstrip("(")) if timed else 0,
                        int(w[-2]) if timed else 0)
    return 0, 0, 0


def run(cg):
    data = pstest.tmpdir()
    d = start(data, cg)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "emb", (DIM,), lr=1.0, sparse=True)), timeout=10)
    t0 = time.monotonic()
    for k in range(0, ROWS, BATCH):
        b = table_id(np.arange(k, min(k + BATCH, ROWS)))
        stub.SparsePush(req(b, np.repeat(first(b)[:, None], DIM, axis=1)), timeout=60)
    st = stub.Stats(pb.StatsRequest(), timeout=10)
    table = st.sparse_rows * (32 + 16 + 4 * DIM)
    R.check(table > LIMIT, "a table of %d rows, %d MiB of records (%d in the segments "
            "yet) over a %d MiB cgroup, in %.1f s"
            % (st.sparse_rows, table >> 20, st.sparse_segment_bytes >> 20, LIMIT >> 20,
               time.monotonic() - t0))
    ch.close()
    rng = random.Random(11)
    replays = []
    for rnd in range(3):
        ch = pstest.channel(d.address)
        stub = pbg.ParameterServerStub(ch)
        base, bbase = small_counts(stub), bulk_count(stub)
        p = pstest.Pushers(d.address, requests(100 * rnd))
        time.sleep(rng.uniform(1.0, 2.5))
        alive = d.proc.poll() is None
        mark, lag = pstest.lag_mark(pb, stub)
        t_kill = time.monotonic()
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        ch.close()
        p.join()
        R.check(alive, "round %d: psd alive until the kill (%d cold pushes acked)"
                % (rnd, len(p.acks[THREADS + 1])))
        log = os.path.join(pstest.tmpdir(), "psd.log")
        d = start(data, cg, log)
        replays.append(replayed(log))
        ch = pstest.channel(d.address)
        stub = pbg.ParameterServerStub(ch)
        bound = min(t_kill - PROMISE_MS / 1000.0, mark)
        got = small_counts(stub)
        ok = all(g is not None for g in got) and base is not None
        for i in range(THREADS):
            if ok:
                n = got[i] - base[i]
                must = sum(1 for t in p.acks[i] if t <= bound)
                ok = must <= n <= p.sent[i]
        R.check(ok, "round %d: small rows whole, %s pushes acked, counts %s -> %s (bound: "
                "the last %d ms; psd's write-behind lag %s ms)"
                % (rnd, [len(a) for a in p.acks[:THREADS]], base, got,
                   (t_kill - bound) * 1000, lag))
        bn = bulk_count(stub)
        must = sum(1 for t in p.acks[THREADS] if t <= bound)
        R.check(bn is not None and bbase is not None and
                must <= bn - bbase <= p.sent[THREADS],
                "round %d: the %d bulk rows hold one count (%s -> %s, %d acked before "
                "the bound)" % (rnd, BULK, bbase, bn, must))
        ch.close()
    # The applier commits records with the segments' end and writes the
    # catalog behind, lazily: while pushes run, only past 1 GiB of records
    # (the fill's queue was dropped, and not written either). The first
    # restart replays every record since the fill began; the later ones
    # those pushed since the open before them wrote the catalog whole.
    R.check(replays[0][0] >= ROWS, "the first restart replayed the fill's %d records and "
            "more into the catalog: %d records, %d MiB in %d ms"
            % (ROWS, replays[0][0], replays[0][1], replays[0][2]))
    R.check(all(n > 0 for n, _, _ in replays), "after each kill psd replayed into its "
            "catalog the records applied past its last write: %s (records, MiB, ms)"
            % replays)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    ids = table_id(np.arange(ROWS))
    v = pull(stub, ids) + first(ids)[:, None]
    whole = np.all(v == v[:, :1], axis=1) & (v[:, 0] <= 0) & (v[:, 0] == np.round(v[:, 0]))
    st = stub.Stats(pb.StatsRequest(), timeout=10)
    R.check(bool(np.all(whole)), "every one of %d rows is whole after 3 kills (%d torn; "
            "%d rows read from the segments since the last start)"
            % (ROWS, int(np.count_nonzero(~whole)), st.sparse_segment_reads))
    ch.close()
    oom = pstest.cgroup_read(cg, "memory.oom_control")
    R.check(d.proc.poll() is None and ("oom_kill 0" in oom or "oom_kill" not in oom),
            "the cgroup killed nothing (%s; peak %d MiB of %d)"
            % (" ".join(oom.split()),
               int(pstest.cgroup_read(cg, "memory.max_usage_in_bytes")) >> 20,
               LIMIT >> 20))
    R.check(d.stop() == 0, "psd stops cleanly on SIGTERM")


def main():
    cg = pstest.memory_cgroup("psd-segments-kill", LIMIT)
    R.run([lambda: run(cg)])
    R.finish()


if __name__ == "__main__":
    main()
