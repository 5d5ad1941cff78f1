"""workerd's relaxed consistency against a real psd on 127.0.0.1:

bounded staleness: two workers with --consistency bounded --staleness S, one
slowed (--step-delay); while the slow one is stopped (SIGSTOP) the fast
one halts exactly S steps ahead of it, read from both workers' progress
lines; once the slow one is killed, the fast one goes on after psd's
--worker-timeout, not before, and finishes.

local SGD: two workers with --local-steps K and two async workers, one epoch
of Fashion-MNIST softmax each: both reach a reasonable test accuracy (the
evaluator's, on the final parameters), and the two figures are printed."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402

WORKERD = os.path.join(pstest.BUILD_ROOT, "worker", "workerd")
S = 3
WORKER_TIMEOUT = 2.0
STEP_RE = re.compile(r"^worker (\d+): epoch \d+ step (\d+) ")


class Worker:
    """A workerd whose progress lines are read as they come."""

    def __init__(self, *args):
        self.p = subprocess.Popen([WORKERD, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.steps = []  # (time, step)
        self.lines = []
        self.t = threading.Thread(target=self.read, daemon=True)
        self.t.start()

    def read(self):
        for line in self.p.stdout:
            self.lines.append(line)
            m = STEP_RE.match(line)
            if m:
                self.steps.append((time.monotonic(), int(m.group(2))))

    def last(self):
        return self.steps[-1][1] if self.steps else 0

    def wait_step(self, k, timeout=30):
        end = time.monotonic() + timeout
        while self.last() < k and time.monotonic() < end:
            time.sleep(0.01)
        return self.last() >= k


def bounded(r):
    d = pstest.start_psd(pstest.tmpdir(), "--worker-timeout",
                         "%dms" % (WORKER_TIMEOUT * 1000))
    common = ["--ps", d.address, "--workers", "2", "--model", "softmax",
              "--limit", "12800", "--epochs", "0", "--consistency", "bounded",
              "--staleness", str(S), "--progress", "1ms", "--evaluate=false",
              "--lr", "0.05"]
    # Every step of both takes more than --progress, so each prints a line.
    # The slow one starts first: psd counts a worker from its first pull.
    slow = Worker(*common, "--task-index", "1", "--steps", "1000",
                  "--step-delay", "60")
    slow.wait_step(1)
    fast = Worker(*common, "--task-index", "0", "--steps", "60",
                  "--step-delay", "5")
    try:
        # Under load the fast one may take a while to start: the bound is
        # shown only once it has caught up to it (no timing of its own).
        fast.wait_step(1)
        r.check(slow.wait_step(8), "the slow worker reaches step 8 (%d)" % slow.last())
        end = time.monotonic() + 30
        while fast.last() < slow.last() + S - 1 and time.monotonic() < end:
            time.sleep(0.01)
        slow.p.send_signal(signal.SIGSTOP)
        time.sleep(1.0)  # under --worker-timeout: it still counts
        f_stopped, l_stopped = fast.last(), slow.last()
        time.sleep(0.3)
        r.check(fast.last() == f_stopped,
                "the fast worker is held while the slow one is stopped "
                "(step %d, then %d)" % (f_stopped, fast.last()))
        slow.p.send_signal(signal.SIGCONT)
        r.check(slow.wait_step(l_stopped + 1, 10), "the slow worker goes on")
        # Its first line after SIGCONT is the step after the one it was in.
        actual = slow.steps[[s for _, s in slow.steps].index(l_stopped + 1)][1] - 1 \
            if l_stopped + 1 in [s for _, s in slow.steps] else l_stopped
        r.check(actual + S - 1 <= f_stopped <= actual + S,
                "with the slow worker stopped at step %d, the fast one halts "
                "at step %d: never more than --staleness %d ahead (and it "
                "did run ahead up to it)" % (actual, f_stopped, S))
        # Every line of the fast one: its step never passed slow's + S, the
        # slow one's step taken as its latest line at that time (a lower
        # bound of its true step, so this check is the strict one, up to one
        # step of the slow one's printing lag).
        worst = 0
        for t, k in fast.steps:
            before = [s for ts, s in slow.steps if ts <= t]
            worst = max(worst, k - (before[-1] if before else 0))
        r.check(worst <= S + 1, "over the whole run the fast worker's printed "
                "step is at most %d ahead of the slow one's last printed step "
                "(the slow one's line lags its step by at most one)" % worst)
        slow.p.kill()
        killed = time.monotonic()
        slow.p.wait()
        # Its last line may lag its last pull's clock by one step: beyond
        # that plus S, only --worker-timeout lets the fast one go.
        held = slow.last() + 1 + S
        rc = fast.p.wait(timeout=30)
        gone = [t for t, k in fast.steps if k > held]
        resumed = gone[0] - killed if gone else -1
        r.check(rc == 0 and fast.last() == 60,
                "the fast worker finishes its 60 steps once the slow one is "
                "killed (exit %d, step %d)" % (rc, fast.last()))
        r.check(WORKER_TIMEOUT - 0.5 <= resumed <= WORKER_TIMEOUT + 3.0,
                "... going past step %d %.2f s after the kill (psd "
                "--worker-timeout %.1f s after the slow one's last pull)"
                % (held, resumed, WORKER_TIMEOUT))
    finally:
        for w in (fast, slow):
            if w.p.poll() is None:
                w.p.kill()
                w.p.wait()
        d.stop()


def two_workers(extra):
    """Trains one epoch with two workers against a fresh psd, then asks an
    evaluator for the test accuracy of the final parameters. 3 ms per step
    makes the epoch last about 1.5 s, so that the two workers overlap (an
    undelayed softmax epoch takes 0.25 s, less than a worker's start-up, and
    the two would train one after the other)."""
    d = pstest.start_psd(pstest.tmpdir())
    procs = [subprocess.Popen([WORKERD, "--ps", d.address, "--workers", "2",
                               "--task-index", str(i), "--model", "softmax",
                               "--epochs", "1", "--json", "--evaluate=false",
                               "--lr", "0.1", "--step-delay", "3", *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    ok = all(p.returncode == 0 for p in procs)
    ev = subprocess.run([WORKERD, "--ps", d.address, "--role", "evaluator",
                         "--model", "softmax", "--eval-count", "1", "--json"],
                        capture_output=True, text=True, timeout=120)
    d.stop()
    lines = [json.loads(l) for l in ev.stdout.splitlines() if l.startswith("{")]
    res = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs] if ok else []
    acc = lines[-1]["test_accuracy"] if lines else None
    version = lines[-1]["version"] if lines else None
    return (ok and ev.returncode == 0, acc, version, res,
            [e for _, e in outs] + [ev.stderr])


def local_sgd(r):
    K = 8
    ok_a, acc_a, _, _, err_a = two_workers([])
    ok_l, acc_l, versions, res_l, err_l = two_workers(["--local-steps", str(K)])
    print("test accuracy after 1 epoch, 2 workers, softmax: async %s, local SGD "
          "(--local-steps %d) %s" % (acc_a, K, acc_l), flush=True)
    # One epoch of two overlapping workers lands anywhere in about
    # 0.75-0.82 for either mode, with the interleaving (chance is 0.10): the
    # bound says each trains, the printed figures compare them.
    r.check(ok_a and acc_a is not None and acc_a > 0.70,
            "async: 2 workers reach test accuracy %s > 0.70 (%s)" % (acc_a, err_a[-1][-200:]))
    r.check(ok_l and acc_l is not None and acc_l > 0.70,
            "local SGD: 2 workers reach test accuracy %s > 0.70 (%s)"
            % (acc_l, " | ".join(e[-200:] for e in err_l)))
    # Each exchange is one push (a last one for the steps left at the end).
    steps = sum(x["steps"] for x in res_l) if res_l else 0
    r.check(res_l and versions is not None and
            steps // K <= versions <= steps // K + 2,
            "local SGD pushes once every %d steps: %d steps, version %d"
            % (K, steps, versions))


def bad_flags(r):
    p = subprocess.run([WORKERD, "--local-steps", "4", "--optimizer", "adam"],
                       capture_output=True, text=True, timeout=30)
    r.check(p.returncode == 2 and "--local-steps needs async SGD" in p.stderr,
            "--local-steps with adam is refused: %s" % p.stderr.strip())
    p = subprocess.run([WORKERD, "--staleness", "4"], capture_output=True,
                       text=True, timeout=30)
    r.check(p.returncode == 2 and "--staleness applies to --consistency bounded"
            in p.stderr, "--staleness without bounded is refused: %s"
            % p.stderr.strip())


def main():
    pstest.run_all("relaxed", (bad_flags, bounded, local_sgd))


if __name__ == "__main__":
    main()
