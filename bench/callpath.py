"""Which of psd's source files one Push and one SparsePush run through,
from the socket to LMDB, counted by execution rather than by reading.

    /usr/bin/python3 bench/callpath.py [BUILD_DIR] [--functions]

psd runs under valgrind's callgrind (a 1 GiB map: valgrind cannot reserve
psd's default 64 GiB) with instrumentation off. One dense variable of 1024
floats and one sparse table of dim 16 (Adagrad both) are created, and each
path is taken once untimed, so that first-use set-up is not counted. Then
windows of 3 s are collected one at a time: three with no call (psd's
timers, sweeps and probes), one around one Push of the variable, one around
one SparsePush of 1000 new ids. Each window holds the call and what it
makes psd do after its answer (the flusher's commit, the row log's apply).
A function counts for a call when it ran in the call's window and in none
of the idle ones; the call's files are those functions' files (psd's own:
server/, common/, and their inline headers). Prints each call's files and
their count; with --functions, each file's functions too.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
if ARGS:
    os.environ["PS_BUILD_ROOT"] = os.path.abspath(ARGS[0])
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import pyenv  # noqa: E402

pyenv.reexec()

import numpy as np  # noqa: E402

import pstest  # noqa: E402
from psclient import Client, Initializer, Optimizer, SparseTable, Variable  # noqa: E402

WINDOW_S = 3.0
IDLE_WINDOWS = 3


def functions(dump):
    """The (file, function) pairs of psd's own code that ran in a dump."""
    out = subprocess.run(["callgrind_annotate", "--threshold=100", "--inclusive=no", dump],
                         capture_output=True, text=True, check=True).stdout
    src = os.path.join(ROOT, "")
    found = set()
    for line in out.splitlines():
        for word in line.split():
            path, _, fn = word.rpartition(":")
            if not path or not fn:
                continue
            path = os.path.normpath(os.path.join(pstest.BUILD_ROOT, path)
                                    if not os.path.isabs(path) else path)
            if path.startswith(src) and path[len(src):].split("/")[0] in ("server", "common"):
                found.add((path[len(src):], fn))
    return found


def main():
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            print("callpath: %s not found (apt-get install valgrind)" % tool, file=sys.stderr)
            return 1
    out = tempfile.mkdtemp(prefix="callpath-")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
           "--callgrind-out-file=%s/cg.%%p" % out, pstest.psd_path(),
           "--data-dir", os.path.join(out, "data"), "--listen", "127.0.0.1:%d" % port,
           "--log-level", "warn", "--map-size", "1G", "--map-size-max", "1G",
           "--memory-limit", "2G"]
    psd = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        c = Client(["127.0.0.1:%d" % port], wait_for_shards=120, timeout=120)
        opt = Optimizer.adagrad(0.1, 0.1, 1e-7)
        c.create_variables([Variable("w", (1024,))], optimizer=opt)
        c.create_sparse_tables([SparseTable("emb", 16, Initializer.constant(0.5))],
                               optimizer=opt)
        g = np.ones(1024, np.float32)
        rows = np.ones((1000, 16), np.float32)
        c.push({"w": g})
        c.sparse_push({"emb": (np.arange(1000, dtype=np.int64), rows)})
        time.sleep(2 * WINDOW_S)

        def window(name, fn):
            subprocess.run(["callgrind_control", "-i", "on", str(psd.pid)], check=True,
                           capture_output=True)
            fn()
            time.sleep(WINDOW_S)
            subprocess.run(["callgrind_control", "-i", "off", str(psd.pid)], check=True,
                           capture_output=True)
            subprocess.run(["callgrind_control", "-d", name, str(psd.pid)], check=True,
                           capture_output=True)

        names = []
        for i in range(IDLE_WINDOWS):
            window("idle%d" % i, lambda: None)
            names.append("idle")
        window("push", lambda: c.push({"w": g}))
        names.append("Push")
        ids = np.arange(5000, 6000, dtype=np.int64)
        window("spush", lambda: c.sparse_push({"emb": (ids, rows)}))
        names.append("SparsePush")
        c.close()
    finally:
        psd.terminate()
        try:
            psd.wait(120)
        except subprocess.TimeoutExpired:
            psd.kill()
            psd.wait()
    dumps = sorted((f for f in os.listdir(out) if f.startswith("cg.") and f.count(".") == 2),
                   key=lambda f: int(f.rsplit(".", 1)[1]))
    if len(dumps) != len(names):
        print("callpath: %d dumps for %d windows" % (len(dumps), len(names)), file=sys.stderr)
        return 1
    idle = set()
    calls = {}
    for name, dump in zip(names, dumps):
        fns = functions(os.path.join(out, dump))
        if name == "idle":
            idle |= fns
        else:
            calls[name] = fns
    for name, fns in calls.items():
        files = sorted({f for f, _ in fns - idle})
        print("%s: %d files: %s" % (name, len(files), " ".join(files)))
        if "--functions" in sys.argv[1:]:
            for f in files:
                print("  %s: %s" % (f, " ".join(sorted(fn for ff, fn in fns - idle if ff == f))))
    subprocess.run(["rm", "-rf", out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
