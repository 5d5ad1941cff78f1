"""kill -9 of psd while it compacts the segment files of a sparse table
(doc/sparse.md, "Segment files: compaction and checkpoints").

psd runs with 256 KiB segments and a compaction of 2 MiB/s, so that a
compaction spans seconds. The table: ROWS rows of DIM floats, row id
holding -(id % 1000) / 8 after its first push (SGD, learning rate 1, zeros);
then the even rows get a gradient of ones, so that every sealed segment is
half dead and compacted. psd is killed with SIGKILL at random times while
it compacts (psd_sparse_compacted_bytes_total above 0 before the kill),
and restarted: after each restart every row reads back its exact value. At the
end compaction has removed the first segment files and the dead bytes have
fallen."""
import glob
import os
import random
import signal
import sys
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402

DIM = 64
ROWS = 12_000            # x (32 + 16 + 256) bytes: ~3.5 MiB of records
BATCH = 4096
RECORD = 32 + 16 + 4 * DIM
ROUNDS = 4
ARGS = ("--segment-size", "256K", "--compact-rate", "2M")
pb, pbg, _, _ = pstest.generate_stubs()
R = pstest.Results("psd-compaction-kill")
IDS = 3 + 7 * np.arange(ROWS, dtype=np.int64)


def first(ids):
    return ((np.asarray(ids) % 1000) / 8.0).astype(np.float32)


def push(stub, ids, g):
    for k in range(0, len(ids), BATCH):
        b = ids[k:k + BATCH]
        gb = np.ascontiguousarray(g[k:k + BATCH], np.float32)
        stub.SparsePush(pb.SparsePushRequest(grads=[pb.SparseGradient(
            name="emb", ids=[int(i) for i in b], grad=pb.Tensor(
                dtype=pb.DTYPE_FLOAT32, shape=list(gb.shape), data=gb.tobytes()))]),
            timeout=60)


def pull(stub, ids):
    return pstest.sparse_pull(pb, stub, "emb", ids, DIM, BATCH)


def segments(data):
    return set(os.path.basename(p) for p in glob.glob(os.path.join(data, "seg-*.psg")))


def start(data):
    """psd with its /metrics; returns the daemon and the metrics port."""
    d = pstest.start_psd(data, *ARGS, "--metrics-listen", "127.0.0.1:0")
    line = d.proc.stdout.readline()
    return d, int(line.split()[1]) if line.startswith("METRICS_PORT ") else 0


def copied(mport):
    """psd_sparse_compacted_bytes_total: relocations committed since start."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=10) as f:
        for ln in f.read().decode().splitlines():
            if ln.startswith("psd_sparse_compacted_bytes_total "):
                return float(ln.split()[1])
    return -1


def stats(stub):
    return stub.Stats(pb.StatsRequest(), timeout=10)


def run():
    data = pstest.tmpdir()
    d, mport = start(data)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "emb", (DIM,), lr=1.0, sparse=True)), timeout=10)
    push(stub, IDS, np.repeat(first(IDS)[:, None], DIM, axis=1))
    # In the segments before the next push (an apply writes a row once,
    # however often it changed).
    R.check(pstest.wait_until(lambda: stats(stub).sparse_segment_live_bytes >= ROWS * RECORD,
                              timeout=30), "the first version of every row is in the segments")
    even = IDS[IDS % 2 == 0]
    push(stub, even, np.ones((len(even), DIM)))
    want = -first(IDS) - (IDS % 2 == 0)
    # The applier writes the pushes to the segments within seconds; the
    # first records of the even rows are then dead.
    dead = pstest.wait_until(lambda: stats(stub).sparse_segment_dead_bytes > (1 << 20),
                             timeout=30)
    st = stats(stub)
    R.check(dead, "%d rows in %d segment files, %d KiB of them dead"
            % (ROWS, len(segments(data)), st.sparse_segment_dead_bytes >> 10))
    peak = st.sparse_segment_dead_bytes
    ch.close()
    rng = random.Random(26)
    first_files = segments(data)
    moved = []
    for rnd in range(ROUNDS):
        time.sleep(rng.uniform(0.5, 2.0))
        moved.append(copied(mport))
        alive = d.proc.poll() is None
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        d, mport = start(data)
        ch = pstest.channel(d.address)
        stub = pbg.ParameterServerStub(ch)
        v = pull(stub, IDS)
        ok = bool(np.all(v == want[:, None]))
        R.check(alive and ok, "round %d: killed %d KiB of relocations into a compaction; all "
                "%d rows exact after the restart (%d wrong)"
                % (rnd, int(moved[-1]) >> 10, ROWS,
                   int(np.count_nonzero(np.any(v != want[:, None], 1)))))
        ch.close()
    R.check(sum(1 for m in moved if m > 0) >= 2, "at least two of the kills came with "
            "relocations committed since the start (%s bytes)" % [int(m) for m in moved])
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    low = pstest.wait_until(lambda: stats(stub).sparse_segment_dead_bytes < peak // 3,
                            timeout=60)
    st = stats(stub)
    v = pull(stub, IDS)
    gone = sorted(first_files - segments(data))
    R.check(low and gone and bool(np.all(v == want[:, None])),
            "compaction went on after the kills: %s removed, dead bytes %d KiB -> %d KiB, "
            "every row exact" % (", ".join(gone) or "no file", peak >> 10,
                                 st.sparse_segment_dead_bytes >> 10))
    ch.close()
    R.check(d.stop() == 0, "psd stops cleanly on SIGTERM")



def main():
    R.run([run])
    R.finish()


if __name__ == "__main__":
    main()
