"""A clean stop of psd after a burst of new sparse rows, and the next open:
pushes ROWS new rows (dim 64, SGD) in pushes of 4096, closes the client's
channel, sends SIGTERM and times it to psd's exit, then starts psd again on
the same directory and times it to its "PORT" line (the open replays what the
stop left of the catalog), and checks every row by pulls. Prints the times
and psd's log lines about the row log and the catalog.

Run: /usr/bin/python3 bench/sparse_stop.py [--psd PATH] [--rows N]
[--memory-limit SIZE] (defaults: build/server/psd, 1048576, 512M); the data
goes in a temporary directory under /var/tmp, removed after."""
import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "interop"))
import numpy as np  # noqa: E402

import pstest  # noqa: E402

pb, pbg, _, _ = pstest.generate_stubs()
DIM, BATCH = 64, 4096


def start(psd, data, log, memory_limit):
    """psd on data, its log in log: (Daemon, seconds to serving)."""
    argv = [psd, "--data-dir", data, "--listen", "127.0.0.1:0", "--log-level", "info",
            "--memory-limit", memory_limit]
    t0 = time.monotonic()
    with open(log, "w") as f:
        d = pstest.Daemon(argv, stderr=f)
    return d, time.monotonic() - t0


def said(log, *words):
    with open(log) as f:
        return [line.split(" INFO ", 1)[-1].strip() for line in f
                if any(w in line for w in words)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--psd", default=os.path.join(ROOT, "build", "server", "psd"))
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--memory-limit", default="512M")
    a = ap.parse_args()
    data = tempfile.mkdtemp(prefix="psd-stop-", dir="/var/tmp")
    logs = [os.path.join(data, "..", os.path.basename(data) + ".log%d" % i) for i in (1, 2)]
    try:
        d, _ = start(a.psd, data, logs[0], a.memory_limit)
        ch = pstest.channel(d.address)
        stub = pbg.ParameterServerStub(ch)
        spec = pstest.spec(pb, "e", (DIM,), opt=pb.Optimizer(kind=pb.Optimizer.SGD,
                                                            learning_rate=1.0), sparse=True)
        stub.CreateVariable(pb.CreateVariableRequest(spec=spec), timeout=10)
        g = pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[BATCH, DIM],
                      data=np.ones((BATCH, DIM), np.float32).tobytes())
        t0 = time.monotonic()
        for k in range(0, a.rows, BATCH):
            stub.SparsePush(pb.SparsePushRequest(step=k, grads=[pb.SparseGradient(
                name="e", ids=list(range(k, k + BATCH)), grad=g)]), timeout=120)
        pushed = time.monotonic() - t0
        st = stub.Stats(pb.StatsRequest(), timeout=10)
        ch.close()
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        status = d.proc.wait(timeout=600)
        stop = time.monotonic() - t0
        d, opened = start(a.psd, data, logs[1], a.memory_limit)
        ch = pstest.channel(d.address)
        stub = pbg.ParameterServerStub(ch)
        n = -(-a.rows // BATCH) * BATCH
        ok = all(bool(np.all(pstest.sparse_pull(pb, stub, "e", range(k, min(k + 65536, n)),
                                                DIM) == -1)) for k in range(0, n, 65536))
        ch.close()
        d.stop()
        print("rows %d pushed in %.1f s; at SIGTERM %d catalog entries queued, %d bytes of "
              "row log; stop %.2f s (exit %d); next open %.2f s; every row -1: %s"
              % (n, pushed, st.sparse_catalog_queued, st.sparse_log_bytes, stop, status,
                 opened, ok))
        for line in said(logs[0], "row log", "catalog", "stopped") + \
                said(logs[1], "catalog"):
            print("  " + line)
    finally:
        shutil.rmtree(data, True)
        for f in logs:
            if os.path.exists(f):
                os.remove(f)


if __name__ == "__main__":
    main()
