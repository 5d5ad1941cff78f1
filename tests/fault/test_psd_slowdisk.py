"""psd on a disk slower than the pushes: psd in a cgroup v1 blkio group
whose writes to the data directory's disk are throttled (RATE bytes a
second), its listener probed every second. Pushes of new sparse rows then
wait for the flusher's commits on psd's gRPC thread, for seconds each,
which is backpressure, not a dead listener: psd must stay up and say that
it did not count the probes, answer every push once the disk is fast
again, and have every row.

gRPC accepts connections on the same threads that run the handlers, so
while every one of them waits in a push, a probe's connection waits in the
accept queue; psd used to count that as a listener that stopped accepting,
exit after two probes, and lose the pushes in flight to a restart.

Needs root and a writable /sys/fs/cgroup/blkio; skips with one line
otherwise."""
import os
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import pstest  # noqa: E402

BLKIO = "/sys/fs/cgroup/blkio"
RATE = 256 << 10
DIM = 64
BATCH = 16384
PUSHES = 6
SLOW_S = 12


def skip(why):
    print("SKIP psd-slowdisk: %s" % why)
    sys.exit(77)


def disk_of(path):
    """MAJ:MIN of the whole disk under path's file system (blkio throttles
    disks, not partitions)."""
    st = os.stat(path)
    dev = "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
    sysdir = os.path.realpath("/sys/dev/block/" + dev)
    if not os.path.isdir(sysdir):
        return None
    if os.path.exists(os.path.join(sysdir, "partition")):
        with open(os.path.join(os.path.dirname(sysdir), "dev")) as f:
            return f.read().strip()
    return dev


def grads(ids):
    return np.repeat(((ids % 1000) / 8.0).astype(np.float32)[:, None], DIM, axis=1)


def push(pb, stub, k, ids):
    g = grads(ids)
    stub.SparsePush(pb.SparsePushRequest(step=k, grads=[pb.SparseGradient(
        name="emb", ids=ids.tolist(), grad=pb.Tensor(
            dtype=pb.DTYPE_FLOAT32, shape=list(g.shape), data=g.tobytes()))]), timeout=300)


def main():
    if os.geteuid() != 0:
        skip("not root: cannot make a blkio cgroup")
    if not os.access(BLKIO, os.W_OK) or not os.path.exists(
            os.path.join(BLKIO, "blkio.throttle.write_bps_device")):
        skip("no writable cgroup v1 blkio controller with throttling at %s" % BLKIO)
    tmp = pstest.tmpdir()
    disk = disk_of(tmp)
    if disk is None:
        skip("the disk under %s is not a block device blkio can throttle" % tmp)
    cg = os.path.join(BLKIO, "psd-slowdisk-%d" % os.getpid())
    os.mkdir(cg)
    try:
        run(cg, disk, tmp)
    finally:
        pstest.rmdir_soon(cg)


def throttle(cg, disk, rate):
    with open(os.path.join(cg, "blkio.throttle.write_bps_device"), "w") as f:
        f.write("%s %d\n" % (disk, rate))


def run(cg, disk, tmp):
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-slowdisk")
    errpath = os.path.join(tmp, "psd.err")
    err = open(errpath, "w")
    argv = pstest.cgroup_wrapper(cg) + [
        pstest.psd_path(), "--data-dir", os.path.join(tmp, "data"), "--listen", "127.0.0.1:0",
        "--log-level", "warn", "--probe-interval", "1s"]
    d = pstest.Daemon(argv, stderr=err)
    try:
        ch = pstest.channel(d.address)
        stub = pbg.ParameterServerStub(ch)
        stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
            pb, "emb", (DIM,), lr=1.0, sparse=True)), timeout=10)
        throttle(cg, disk, RATE)
        ids = np.arange(PUSHES * BATCH, dtype=np.int64) * 7919
        done = []
        failed = []

        def pushes():
            try:
                for k in range(PUSHES):
                    push(pb, stub, k, ids[k * BATCH:(k + 1) * BATCH])
                    done.append(time.monotonic())
            except Exception as e:  # noqa: BLE001 - reported below
                failed.append(e)

        t0 = time.monotonic()
        th = threading.Thread(target=pushes)
        th.start()
        th.join(SLOW_S)
        alive = d.proc.poll() is None
        r.check(alive, "psd is up after %d s of pushes on a disk written at %d KiB/s "
                "(%d of %d pushes answered by then)" % (SLOW_S, RATE >> 10, len(done), PUSHES))
        throttle(cg, disk, 0)
        th.join(300)
        r.check(not th.is_alive() and not failed and len(done) == PUSHES,
                "every push answered once the disk is fast again (%s, %.1f s)"
                % (failed[0] if failed else "%d of %d" % (len(done), PUSHES),
                   time.monotonic() - t0))
        with open(errpath) as f:
            log = f.read()
        busy = [ln for ln in log.splitlines() if "not counted" in ln]
        r.check(alive and busy, "psd logged probes not counted while its gRPC thread was in a "
                "push (%d), e.g. %s" % (len(busy), busy[0][:160] if busy else "none"))
        if not failed and len(done) == PUSHES:
            got = pstest.sparse_pull(pb, stub, "emb", ids, DIM)
            bad = int(np.count_nonzero(np.any(got != -grads(ids), axis=1)))
            r.check(bad == 0, "every one of %d rows read back (%d wrong)" % (len(ids), bad))
        ch.close()
        r.check(d.stop() == 0, "psd stops cleanly on SIGTERM")
    finally:
        throttle(cg, disk, 0)
        if d.proc.poll() is None:
            d.kill()
        err.close()
    r.finish()


if __name__ == "__main__":
    main()
