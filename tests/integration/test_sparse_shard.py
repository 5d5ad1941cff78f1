"""Sparse tables over several psd shards (issue 12, items 5 and 7), against
real processes on 127.0.0.1:

- the C client's split path (common/sparseclient.c, driven by the
  sparse_split helper) answers pushes and pulls bit for bit as one
  reference psd holding the whole table does;
- each shard holds exactly the rows that the hash (splitmix64's finalizer,
  then jump consistent hash), computed here independently in Python, gives
  it (Stats.sparse_rows per shard);
- the wide-and-deep model trains through the local cluster (2 shards, one
  worker, 1 epoch on 12000 examples) to test accuracy > 0.75, both tables
  hold rows on both shards, and the coordinator's placement records the
  tables as hash-partitioned with one part per shard; the worker's
  --sparse-slot-dtype bf16 creates both tables with bfloat16 optimizer
  slots (ListVariables' slot_dtype on each shard)."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "deploy"))
import pstest  # noqa: E402
from localcluster import LocalCluster  # noqa: E402

M64 = (1 << 64) - 1
FM = "/usr/share/datasets/fashion-mnist"


def mix64(x):
    x &= M64
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & M64
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def jump(key, n):
    """Lamping & Veach's jump consistent hash, as the paper writes it."""
    b, j = -1, 0
    while j < n:
        b = j
        key = (key * 2862933555777941757 + 1) & M64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def shard_of(i, n):
    return jump(mix64(i & M64), n)


def stats(pb, pbg, addr):
    ch = pstest.channel(addr)
    try:
        return pbg.ParameterServerStub(ch).Stats(pb.StatsRequest(), timeout=10)
    finally:
        ch.close()


def split_path(r, pb, pbg):
    nshards = 3
    ref = pstest.start_psd(pstest.tmpdir())
    shards = [pstest.start_psd(pstest.tmpdir()) for _ in range(nshards)]
    ids_file = os.path.join(pstest.tmpdir(), "ids")
    helper = os.path.join(pstest.BUILD_ROOT, "tests", "integration", "sparse_split")
    p = subprocess.run([helper, ids_file, ref.address] + [s.address for s in shards],
                       capture_output=True, text=True, timeout=120)
    r.check(p.returncode == 0 and p.stdout.startswith("same:"),
            "3 shards: pushes (with returned rows) and pulls through the split path "
            "equal one reference psd's bit for bit (%s)"
            % (p.stdout.strip() or p.stderr.strip()))
    if p.returncode != 0:
        return
    ids = {int(l) for l in open(ids_file)}
    want = [0] * nshards
    for i in ids:
        want[shard_of(i, nshards)] += 1
    got = [stats(pb, pbg, s.address).sparse_rows for s in shards]
    r.check(got == want and sum(got) == len(ids),
            "rows land on the shard the hash says: sparse_rows per shard %s, "
            "Python's splitmix64 + jump hash says %s (%d distinct ids)"
            % (got, want, len(ids)))
    r.check(stats(pb, pbg, ref.address).sparse_rows == len(ids),
            "the reference holds every distinct id once")
    # Jump hash's promise: from 3 to 4 shards only ids bound for shard 3 move.
    moved = [i for i in ids if shard_of(i, 4) != shard_of(i, 3)]
    r.check(all(shard_of(i, 4) == 3 for i in moved) and len(moved) < len(ids) / 3,
            "re-sharding 3 -> 4 moves %d of %d ids, all onto the new shard"
            % (len(moved), len(ids)))
    for s in shards + [ref]:
        s.stop()


def widedeep(r, pb, pbg):
    if not os.path.exists(os.path.join(FM, "train-images-idx3-ubyte.gz")):
        print("skip widedeep: %s is missing" % FM)
        return
    root = pstest.tmpdir("widedeep-")
    c = LocalCluster(pstest.BUILD_ROOT, root, num_ps=2, num_workers=1, evaluator=False,
                     model="widedeep", epochs=1,
                     worker_args=["--limit", "12000", "--sparse-slot-dtype", "bf16"])
    try:
        c.start()
        res = c.wait_workers(timeout=400)
        rc, summary = res[0]
        acc = summary["test_accuracy"] if summary else -1
        r.check(rc == 0 and acc > 0.75,
                "widedeep, 2 shards, 1 epoch of 12000 examples: test accuracy "
                "%.4f > 0.75" % acc)
        rows = [stats(pb, pbg, "127.0.0.1:%d" % p).sparse_rows for p in c.ps_ports]
        r.check(all(n > 1000 for n in rows),
                "both shards hold table rows (sparse_rows %s)" % rows)
        pl = {v.name: v for v in c.cluster_state().placement}
        ok = all(n in pl and pl[n].hash_partitioned and
                 sorted(p.shard for p in pl[n].parts) == [0, 1]
                 for n in ("wide/cross", "deep/embed"))
        ok = ok and not pl["deep/dense0/kernel"].hash_partitioned
        r.check(ok, "the coordinator's placement records both tables as "
                "hash-partitioned over shards 0 and 1, the dense kernel not")
        slots = []
        for p in c.ps_ports:
            stub = pbg.ParameterServerStub(pstest.channel("127.0.0.1:%d" % p))
            vs = stub.ListVariables(pb.ListVariablesRequest(), timeout=10).variables
            slots += [v.spec.slot_dtype for v in vs if v.spec.sparse]
        r.check(len(slots) == 4 and all(d == pb.DTYPE_BFLOAT16 for d in slots),
                "workerd --sparse-slot-dtype bf16: both tables on both shards have "
                "bfloat16 slots (%s)" % slots)
    finally:
        c.stop()


def main():
    r = pstest.Results("sparse-shard")
    pb, pbg, _, _ = pstest.generate_stubs()
    split_path(r, pb, pbg)
    widedeep(r, pb, pbg)
    r.finish()


if __name__ == "__main__":
    main()
