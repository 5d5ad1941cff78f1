"""A sparse table filled as fast as one client can push, by psd in a
cgroup v1 memory group of LIMIT bytes (--memory-limit the same) large
enough that the row log's file the applier takes (a quarter of the RAM
tier's budget) is several times the page cache psd leaves itself: every
push is answered, psd stays up with its listener probed every 2 s, every
row reads back right, and psd reads its log back in its order (less
than 3x the rows' bytes read from the disk).

The applier used to append a file's records in key order, each a fault
at a random place of the log's mapping; with the log larger than the page
cache every record was a read from the disk, the applier fell behind, the
RAM tier filled with rows pinned until applied, and a push waited for room
on psd's only gRPC thread until the listener probe found nothing accepted
and psd exited.

Needs root and a writable /sys/fs/cgroup/memory; skips with one line
otherwise."""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

LIMIT = 400 << 20
DIM = 128
ROWS = 1_500_000  # ~530 bytes a row in the log: ~760 MiB, the applier's file ~80 MiB
BATCH = 4096
SAMPLE = 100_000


def grads(ids):
    """Row of id: (id % 1000) / 8 in every element, exact in float32."""
    return np.repeat(((ids % 1000) / 8.0).astype(np.float32)[:, None], DIM, axis=1)


def proc_io(pid):
    with open("/proc/%d/io" % pid) as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f if ": " in line)}


def main():
    cg = pstest.memory_cgroup("psd-sparse-ingest", LIMIT)
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-sparse-ingest")
    d = pstest.start_psd(pstest.tmpdir(), "--memory-limit", str(LIMIT),
                         "--probe-interval", "2000", wrapper=pstest.cgroup_wrapper(cg))
    try:
        run(r, pb, pbg, d, cg)
    finally:
        if d.proc.poll() is None:
            d.kill()
    r.finish()


def run(r, pb, pbg, d, cg):
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "big", (DIM,), lr=1.0, sparse=True)), timeout=10)
    # Scattered over 10^9 ids, as bench/sparse's table (rank * 1000003 + 12345).
    ids = (np.arange(ROWS, dtype=np.int64) * 1000003 + 12345) % 1_000_000_000
    t0 = time.monotonic()
    slowest = 0.0
    failed = None
    for k in range(0, ROWS, BATCH):
        b = ids[k:k + BATCH]
        g = grads(b)
        a = time.monotonic()
        try:
            stub.SparsePush(pb.SparsePushRequest(step=k, grads=[pb.SparseGradient(
                name="big", ids=b.tolist(), grad=pb.Tensor(
                    dtype=pb.DTYPE_FLOAT32, shape=list(g.shape), data=g.tobytes()))]),
                timeout=60)
        except Exception as e:  # noqa: BLE001 - the check below names it
            failed = "push of rows %d.. failed: %s" % (k, e)
            break
        slowest = max(slowest, time.monotonic() - a)
    t_push = time.monotonic() - t0
    r.check(failed is None, "%d rows pushed in %.1f s, every push answered (the slowest "
            "%.2f s)%s" % (ROWS, t_push, slowest, "" if failed is None else ": " + failed))
    if failed is not None:
        return
    st = stub.Stats(pb.StatsRequest(), timeout=30)
    r.check(st.sparse_rows == ROWS, "Stats: %d rows (%d MiB of segments, RAM tier %d MiB, "
            "row log %d MiB)" % (st.sparse_rows, st.sparse_segment_bytes >> 20,
                                 st.sparse_ram_bytes >> 20, st.sparse_log_bytes >> 20))
    io = proc_io(d.proc.pid)
    log_bytes = ROWS * (DIM * 4 + 16)
    r.check(io["read_bytes"] < 3 * log_bytes,
            "psd read %d MiB from the disk while it logged and applied ~%d MiB of rows "
            "(less than 3x: the applier reads the log in its order, a pass to check it "
            "and one to copy it)" % (io["read_bytes"] >> 20, log_bytes >> 20))
    rng = np.random.default_rng(11)
    pick = ids[rng.choice(ROWS, SAMPLE, replace=False)]
    got = pstest.sparse_pull(pb, stub, "big", pick, DIM)
    bad = int(np.count_nonzero(np.any(got != -grads(pick), axis=1)))
    r.check(bad == 0, "%d rows drawn at random read back equal to -gradient (%d wrong)"
            % (SAMPLE, bad))
    r.check(d.proc.poll() is None, "psd is alive (memory.failcnt %s)"
            % pstest.cgroup_read(cg, "memory.failcnt").strip())
    ch.close()
    r.check(d.stop() == 0, "psd stops cleanly on SIGTERM")


if __name__ == "__main__":
    main()
