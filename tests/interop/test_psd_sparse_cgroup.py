"""A sparse table larger than psd's memory: psd runs in a cgroup v1 memory
cgroup of LIMIT bytes with --memory-limit LIMIT, takes pushes of ROWS rows
(about 1.6x LIMIT in its segment files), and must answer every row back correct without
being killed by the cgroup (memory.failcnt may rise: the kernel reclaims
LMDB's page cache, which is charged to the cgroup, and that is the point).
Then a checkpoint of the table, a third of its rows changed, and a Restore:
every row is the checkpoint's again, still inside the cgroup.

Needs root and a writable /sys/fs/cgroup/memory; skips with one line
otherwise."""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

CG_ROOT = "/sys/fs/cgroup/memory"
LIMIT = 96 << 20
DIM = 64
ROWS = 600_000   # 600k rows x (16 + 256 bytes + key) in LMDB: ~160 MiB
BATCH = 4096


def skip(why):
    print("SKIP psd-sparse-cgroup: %s" % why)
    sys.exit(77)


def grads(ids):
    """Row of id: (id % 1000) / 8 in every element, exact in float32."""
    return np.repeat(((ids % 1000) / 8.0).astype(np.float32)[:, None], DIM, axis=1)


def main():
    if os.geteuid() != 0:
        skip("not root: cannot make a memory cgroup")
    if not os.access(CG_ROOT, os.W_OK):
        skip("no writable cgroup v1 memory controller at %s" % CG_ROOT)
    cg = os.path.join(CG_ROOT, "psd-sparse-test-%d" % os.getpid())
    os.mkdir(cg)
    try:
        run(cg)
    finally:
        pstest.rmdir_soon(cg)


def pull_all(pb, stub, ids):
    out = []
    for k in range(0, len(ids), BATCH):
        b = ids[k:k + BATCH]
        rows = stub.SparsePull(pb.SparsePullRequest(items=[pb.SparsePullItem(
            name="big", ids=b.tolist())]), timeout=120).rows[0]
        out.append(np.frombuffer(rows.values.data, dtype="<f4").reshape(len(b), DIM))
    return np.concatenate(out)


def restore_larger_than_memory(r, pb, stub, ids):
    """Checkpoint the table, change a third of its rows, restore: every row
    is the checkpoint's again, in the same cgroup."""
    t0 = time.monotonic()
    ck = stub.Checkpoint(pb.CheckpointRequest(step=1), timeout=600)
    t_ck = time.monotonic() - t0
    r.check(ck.bytes > LIMIT, "a checkpoint of %d MiB, larger than the cgroup's %d MiB, "
            "in %.1f s" % (ck.bytes >> 20, LIMIT >> 20, t_ck))
    changed = ids[::3]
    for k in range(0, len(changed), BATCH):
        b = changed[k:k + BATCH]
        g = np.ones((len(b), DIM), dtype=np.float32)
        stub.SparsePush(pb.SparsePushRequest(step=ROWS + k, grads=[pb.SparseGradient(
            name="big", ids=b.tolist(), grad=pb.Tensor(
                dtype=pb.DTYPE_FLOAT32, shape=list(g.shape), data=g.tobytes()))]),
            timeout=60)
    t0 = time.monotonic()
    rs = stub.Restore(pb.RestoreRequest(step=1), timeout=600)
    t_rs = time.monotonic() - t0
    got = pull_all(pb, stub, ids)
    bad = int(np.count_nonzero(np.any(got != -grads(ids), axis=1)))
    r.check(rs.step == 1 and bad == 0, "after Restore (%.1f s) every one of %d rows is the "
            "checkpoint's again, the %d changed since included (%d wrong)"
            % (t_rs, len(ids), len(changed), bad))


def read(cg, name):
    with open(os.path.join(cg, name)) as f:
        return f.read()


def run(cg):
    with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
        f.write(str(LIMIT))
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-sparse-cgroup")
    wrapper = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cg]
    d = pstest.start_psd(pstest.tmpdir(), "--memory-limit", str(LIMIT), wrapper=wrapper)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "big", (DIM,), lr=1.0, sparse=True)), timeout=10)
    # New ids arrive in blocks (a batch shuffled within its block of the id
    # space), as first-seen ids of a stream do: a batch dirties a few hundred
    # LMDB pages. Fully random ids over a table 2x the page cache make every
    # row a disk read: correct too, but minutes long (bench/sparse measures
    # that regime).
    rng = np.random.default_rng(5)
    ids = np.concatenate([rng.permutation(np.arange(k, min(k + BATCH, ROWS)))
                          for k in range(0, ROWS, BATCH)]).astype(np.int64) * 7919
    t0 = time.monotonic()
    for k in range(0, ROWS, BATCH):
        b = ids[k:k + BATCH]
        g = grads(b)
        stub.SparsePush(pb.SparsePushRequest(step=k, grads=[pb.SparseGradient(
            name="big", ids=b.tolist(), grad=pb.Tensor(
                dtype=pb.DTYPE_FLOAT32, shape=list(g.shape), data=g.tobytes()))]),
            timeout=60)
    t_push = time.monotonic() - t0
    st = stub.Stats(pb.StatsRequest(), timeout=10)
    r.check(st.sparse_rows == ROWS, "%d rows stored (Stats: %d, %d MiB on disk, "
            "RAM tier %d MiB) in %.1f s" % (ROWS, st.sparse_rows,
                                            st.sparse_disk_bytes >> 20,
                                            st.sparse_ram_bytes >> 20, t_push))
    on_disk = st.sparse_disk_bytes + st.sparse_segment_bytes
    r.check(on_disk > LIMIT, "the table (%d MiB: LMDB and segments) is larger than the "
            "cgroup's limit (%d MiB)" % (on_disk >> 20, LIMIT >> 20))
    bad = 0
    for k in range(0, ROWS, BATCH):
        b = ids[k:k + BATCH]
        rows = stub.SparsePull(pb.SparsePullRequest(items=[pb.SparsePullItem(
            name="big", ids=b.tolist())]), timeout=60).rows[0]
        got = np.frombuffer(rows.values.data, dtype="<f4").reshape(len(b), DIM)
        bad += int(np.count_nonzero(np.any(got != -grads(b), axis=1)))
    r.check(bad == 0, "every row read back equals -gradient (%d wrong)" % bad)
    restore_larger_than_memory(r, pb, stub, ids)
    peak = int(read(cg, "memory.max_usage_in_bytes"))
    stat = dict(line.split() for line in read(cg, "memory.stat").splitlines())
    r.check(d.proc.poll() is None, "psd is alive (peak charge %d MiB of %d, "
            "anonymous now %d MiB)" % (peak >> 20, LIMIT >> 20,
                                       int(stat.get("rss", 0)) >> 20))
    oom = read(cg, "memory.oom_control")
    r.check("oom_kill 0" in oom or "oom_kill" not in oom,
            "the cgroup killed nothing (%s)" % " ".join(oom.split()))
    ch.close()
    r.check(d.stop() == 0, "psd stops cleanly on SIGTERM")
    r.finish()


if __name__ == "__main__":
    main()
