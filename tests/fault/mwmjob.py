"""A multi_worker_mirrored job of real processes for the tests: one pscoord
and N workerd --strategy multi_worker_mirrored, each worker's stdout in a
log file, and the parsing of what they print (groups formed, failures,
checksums, the final JSON line)."""
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import pstest  # noqa: E402

FORMED = re.compile(r"worker (\d+): generation (\d+) formed: (\d+) worker\(s\), rank (\d+), "
                    r"step (\d+), ([0-9.]+) s after (.*)$")
CHECKSUM = re.compile(r"worker (\d+): step (\d+) generation (\d+) checksum ([0-9a-f]+)$")
FAILED = re.compile(r"worker (\d+): generation (\d+) failed at step (\d+) after ([0-9.]+) s")


def build_path(*parts):
    return os.path.join(pstest.BUILD_ROOT, *parts)


class Job:
    def __init__(self, name, heartbeat_timeout="3s", wrapper=None, listen="127.0.0.1:0",
                 extra=()):
        self.root = pstest.tmpdir("mwm-%s-" % name)
        self.coord_argv = list(wrapper or []) + [
            build_path("coordinator", "pscoord"), "--state-dir",
            os.path.join(self.root, "coord"), "--listen", listen,
            "--heartbeat-timeout", heartbeat_timeout, "--metrics-listen", "off",
            "--log-level", "info"] + list(extra)
        if not listen.startswith("127."):
            # The namespaces' test network: plaintext there is on purpose
            # (the loopback rule wants TLS or --insecure said aloud).
            self.coord_argv.append("--insecure")
        self.coord_log = open(os.path.join(self.root, "pscoord.log"), "a")
        self.coord = pstest.Daemon(self.coord_argv, stderr=self.coord_log)
        self.workers = {}   # index -> list of (Popen, log path)

    def restart_coord(self):
        """Stops pscoord (SIGTERM) and starts it again on the same state
        directory (a new port)."""
        self.coord.stop()
        self.coord = pstest.Daemon(self.coord_argv, stderr=self.coord_log)

    def coord_addr(self, host="127.0.0.1"):
        return "%s:%d" % (host, self.coord.port)

    def start(self, i, args, wrapper=None, coord_host="127.0.0.1"):
        n = len(self.workers.get(i, []))
        path = os.path.join(self.root, "worker%d-%d.log" % (i, n))
        argv = list(wrapper or []) + [
            build_path("worker", "workerd"), "--strategy", "multi_worker_mirrored",
            "--coordinator", self.coord_addr(coord_host), "--task-index", str(i),
            "--metrics-listen", "off", "--json"] + list(args)
        with open(path, "w") as log:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.workers.setdefault(i, []).append((p, path))
        return p

    def proc(self, i):
        return self.workers[i][-1][0]

    def log(self, i, n=-1):
        return open(self.workers[i][n][1]).read()

    def wait(self, timeout):
        """Waits for every worker process; returns {index: exit status of its
        last process}; kills what is still running at the deadline."""
        deadline = time.monotonic() + timeout
        for runs in self.workers.values():
            for p, _ in runs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        return {i: runs[-1][0].returncode for i, runs in self.workers.items()}

    def kill9(self, i):
        self.proc(i).send_signal(signal.SIGKILL)
        self.proc(i).wait()

    def close(self):
        for runs in self.workers.values():
            for p, _ in runs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        self.coord.kill()
        self.coord_log.close()

    def dump(self):
        """Every log's tail, for a failure."""
        for i, runs in sorted(self.workers.items()):
            for n, (p, path) in enumerate(runs):
                tail = open(path).read().splitlines()[-8:]
                print("worker %d run %d (exit %s):\n  %s" % (i, n, p.poll(), "\n  ".join(tail)))
        tail = open(os.path.join(self.root, "pscoord.log")).read().splitlines()[-15:]
        print("pscoord:\n  " + "\n  ".join(tail))


def parse(text):
    """What one worker process printed."""
    out = {"formed": [], "checksums": {}, "failed": [], "final": None, "left_out": False}
    for line in text.splitlines():
        m = FORMED.match(line)
        if m:
            out["formed"].append({"gen": int(m.group(2)), "size": int(m.group(3)),
                                  "rank": int(m.group(4)), "step": int(m.group(5)),
                                  "seconds": float(m.group(6)), "after": m.group(7)})
        m = CHECKSUM.match(line)
        if m:
            out["checksums"][int(m.group(2))] = m.group(4)
        m = FAILED.match(line)
        if m:
            out["failed"].append(int(m.group(3)))
            out["detect"] = float(m.group(4))
        if line.startswith("{"):
            out["final"] = json.loads(line)
        if "while this worker was out of its group" in line:
            out["left_out"] = True
    return out
