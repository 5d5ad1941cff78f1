"""systemd's notify protocol and the JSON log lines, against real daemons.

The test plays the service manager: a unix datagram socket in a temporary
directory, NOTIFY_SOCKET naming it and WATCHDOG_USEC=400000 (keep-alives
every 200 ms), and checks for psd, pscoord and workerd that READY=1 comes
once the daemon answers gRPC with its state loaded, that STATUS= lines say
where it is and follow what it does, that WATCHDOG=1 comes at the rate
asked, stops while the process is SIGSTOPped and resumes after SIGCONT,
and that SIGTERM brings STOPPING=1. Then `--log-format json`: every line
of psd, pscoord and workerd parses with python's json; text stays the
default. Last, `systemd-analyze verify` on deploy/systemd when the machine
has it (no systemd runs here: it only parses and checks the units)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402

import numpy as np  # noqa: E402

PSD = os.path.join(pstest.BUILD_ROOT, "server", "psd")
PSCOORD = os.path.join(pstest.BUILD_ROOT, "coordinator", "pscoord")
WORKERD = os.path.join(pstest.BUILD_ROOT, "worker", "workerd")
PSCTL = os.path.join(pstest.BUILD_ROOT, "tools", "psctl")
FM = "/usr/share/datasets/fashion-mnist"
WATCHDOG_USEC = 400000
KEEPALIVE = WATCHDOG_USEC / 2e6  # seconds between keep-alives asked for

pb, pbg, hpb, hpbg = pstest.generate_stubs()
r = pstest.Results("notify")


class NotifySocket:
    """The service manager's end of sd_notify(3): a datagram socket that
    keeps every message as (monotonic time, {assignment: value})."""

    def __init__(self, root, name):
        self.path = os.path.join(root, name + ".notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def env(self):
        e = dict(os.environ, NOTIFY_SOCKET=self.path,
                 WATCHDOG_USEC=str(WATCHDOG_USEC))
        e.pop("WATCHDOG_PID", None)
        return e

    def recv(self, timeout):
        """One message within timeout, as (time, dict), or None."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(65536)
        except (socket.timeout, BlockingIOError):
            return None
        fields = dict(line.split("=", 1) for line in
                      data.decode("utf-8", "replace").split("\n") if "=" in line)
        return time.monotonic(), fields

    def wait(self, key, timeout, pred=lambda v: True):
        """The first message within timeout that sets key to a value pred
        accepts: (time, dict), or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.recv(deadline - time.monotonic())
            if m is not None and key in m[1] and pred(m[1][key]):
                return m
        return None

    def collect(self, seconds):
        """Every message within seconds."""
        out, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = self.recv(deadline - time.monotonic())
            if m is not None:
                out.append(m)
        return out

    def close(self):
        self.sock.close()


def keepalives(msgs):
    return [t for t, m in msgs if m.get("WATCHDOG") == "1"]


def check_watchdog(name, ns, proc, lo=0.6, hi=1.4):
    """WATCHDOG=1 at the rate asked (within lo..hi of one per KEEPALIVE),
    none while the process is stopped, again after SIGCONT."""
    ns.collect(0.3)  # what is queued from before
    span = 2.0
    ts = keepalives(ns.collect(span))
    want = span / KEEPALIVE
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    r.check(want * lo <= len(ts) <= want * hi and gaps and
            max(gaps) < 2 * KEEPALIVE,
            "%s: %d keep-alives in %.1f s (%.0f asked for), longest gap %.0f ms "
            "(< the %.0f ms watchdog)" % (name, len(ts), span, want,
                                          1000 * max(gaps or [0]),
                                          WATCHDOG_USEC / 1000))
    os.kill(proc.pid, signal.SIGSTOP)
    ns.collect(0.3)
    stopped = keepalives(ns.collect(1.2))
    os.kill(proc.pid, signal.SIGCONT)
    back = ns.wait("WATCHDOG", 1.0)
    r.check(not stopped and back is not None,
            "%s: no keep-alive in 1.2 s while SIGSTOPped (%d), one again "
            "after SIGCONT" % (name, len(stopped)))


def check_stopping(name, ns, proc):
    proc.send_signal(signal.SIGTERM)
    m = ns.wait("STOPPING", 10, lambda v: v == "1")
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    r.check(m is not None and rc == 0,
            "%s: SIGTERM brings STOPPING=1 (STATUS=%s), exit %s"
            % (name, m[1].get("STATUS") if m else None, rc))


def status_num(status, pattern):
    m = re.search(pattern, status or "")
    return int(m.group(1)) if m else None


def loaded_store(root):
    """A data dir holding variable w at version 3, from a psd now gone."""
    data = os.path.join(root, "psd-data")
    d = pstest.start_psd(data)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    stub.CreateVariable(pb.CreateVariableRequest(
        spec=pstest.spec(pb, "w", [4, 3])), timeout=10)
    for i in range(3):
        stub.Push(pb.PushRequest(worker=0, step=i, grads=[
            pstest.grad(pb, "w", np.ones((4, 3)))]), timeout=10)
    ch.close()
    d.stop()
    return data


def test_psd(root):
    data = loaded_store(root)
    ns = NotifySocket(root, "psd")
    log = open(os.path.join(root, "psd-notify.log"), "w")
    d = pstest.Daemon([PSD, "--data-dir", data, "--listen", "127.0.0.1:0",
                       "--log-level", "warn"], env=ns.env(), stderr=log)
    ready = ns.wait("READY", 10, lambda v: v == "1")
    ok, names = False, []
    if ready is not None:
        ch = pstest.channel(d.address)
        try:
            h = hpbg.HealthStub(ch).Check(hpb.HealthCheckRequest(), timeout=2)
            names = [v.spec.name for v in pbg.ParameterServerStub(ch).ListVariables(
                pb.ListVariablesRequest(), timeout=2).variables]
            ok = h.status == hpb.HealthCheckResponse.SERVING
        except Exception as e:  # noqa: BLE001: reported below
            names = [str(e)]
        ch.close()
    status = ready[1].get("STATUS") if ready else None
    r.check(ok and names == ["w"],
            "psd: at READY=1 it answers at once: Health SERVING, its loaded "
            "variables %s" % names)
    r.check(status_num(status, r"(\d+) variables?") == 1 and
            status_num(status, r"version (\d+)") == 3 and
            "no checkpoint yet" in status,
            "psd: READY=1 comes with the loaded store's STATUS=%s" % status)

    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    stub.Push(pb.PushRequest(worker=0, step=3, grads=[
        pstest.grad(pb, "w", np.ones((4, 3)))]), timeout=10)
    m = ns.wait("STATUS", 5, lambda v: status_num(v, r"version (\d+)") == 4)
    r.check(m is not None and status_num(m[1]["STATUS"], r"(\d+) updates") == 1,
            "psd: a push shows in STATUS= within 5 s: %s"
            % (m[1]["STATUS"] if m else None))
    stub.Checkpoint(pb.CheckpointRequest(step=0), timeout=30)
    m = ns.wait("STATUS", 5, lambda v: "last checkpoint at step 4" in v)
    r.check(m is not None, "psd: a checkpoint shows in STATUS=: %s"
            % (m[1]["STATUS"] if m else None))
    ch.close()

    check_watchdog("psd", ns, d.proc)
    check_stopping("psd", ns, d.proc)
    ns.close()
    log.close()


WORKER_ADDR = "127.0.0.1:%d" % pstest.free_port()


def coord_spec(root):
    """A static cluster of one ps and one worker (neither runs)."""
    path = os.path.join(root, "cluster.json")
    with open(path, "w") as f:
        json.dump({"cluster": {"ps": ["127.0.0.1:%d" % pstest.free_port()],
                               "worker": [WORKER_ADDR]},
                   "job_id": "notify"}, f)
    return path


def coord_argv(state, spec):
    return [PSCOORD, "--state-dir", state, "--listen", "127.0.0.1:0",
            "--cluster", spec, "--heartbeat-timeout", "30s",
            "--log-level", "error"]


WORKER_SECRET = [""]  # the task secret worker[0] was given, kept as workerd does


def register_worker(address, step):
    ch = pstest.channel(address)
    s = pbg.CoordinatorStub(ch)
    reg = s.RegisterTask(pb.RegisterRequest(
        job_id="notify", role=pb.WORKER, index=0, address=WORKER_ADDR,
        task_secret=WORKER_SECRET[0]), timeout=5)
    WORKER_SECRET[0] = reg.task_secret
    s.Heartbeat(pb.HeartbeatRequest(
        job_id="notify", role=pb.WORKER, index=0,
        incarnation=reg.incarnation, step=step, task_secret=reg.task_secret),
        timeout=5)
    ch.close()


def test_pscoord(root):
    state, spec = os.path.join(root, "coord-state"), coord_spec(root)
    # A state to load: a global step of 77, saved at the first run's end.
    c = pstest.Daemon(coord_argv(state, spec), stderr=subprocess.DEVNULL)
    register_worker(c.address, 77)
    c.stop()

    ns = NotifySocket(root, "pscoord")
    c = pstest.Daemon(coord_argv(state, spec), env=ns.env(),
                      stderr=subprocess.DEVNULL)
    ready = ns.wait("READY", 10, lambda v: v == "1")
    job = None
    if ready is not None:
        ch = pstest.channel(c.address)
        try:
            job = pbg.CoordinatorStub(ch).GetCluster(
                pb.GetClusterRequest(), timeout=2).job_id
        except Exception as e:  # noqa: BLE001: reported below
            job = str(e)
        ch.close()
    status = ready[1].get("STATUS") if ready else None
    r.check(job == "notify", "pscoord: at READY=1 GetCluster answers at once "
            "(job %s)" % job)
    r.check(status is not None and "global step 77" in status and
            "0/1 workers live" in status and "no job checkpoint yet" in status,
            "pscoord: READY=1 comes with the loaded state's STATUS=%s" % status)
    register_worker(c.address, 90)
    m = ns.wait("STATUS", 5, lambda v: "1/1 workers live" in v and
                "global step 90" in v)
    r.check(m is not None, "pscoord: a worker's heartbeat shows in STATUS=: %s"
            % (m[1]["STATUS"] if m else None))
    check_watchdog("pscoord", ns, c.proc)
    check_stopping("pscoord", ns, c.proc)
    ns.close()


def test_workerd(root):
    if not os.path.exists(os.path.join(FM, "train-images-idx3-ubyte.gz")):
        print("skip: workerd's part: %s is missing (dataset-fashion-mnist)" % FM)
        return
    d = pstest.start_psd(os.path.join(root, "wd-data"))
    ns = NotifySocket(root, "workerd")
    logp = os.path.join(root, "workerd-json.log")
    log = open(logp, "w")
    w = subprocess.Popen([WORKERD, "--ps", d.address, "--epochs", "0", "--steps",
                          "10000000", "--limit", "2560", "--evaluate=false",
                          "--progress", "0", "--log-level", "warn",
                          "--log-format", "json"],
                         env=ns.env(), stdout=subprocess.DEVNULL, stderr=log)
    try:
        ready = ns.wait("READY", 60, lambda v: v == "1")
        pulls = pushes = 0
        if ready is not None:
            # READY=1 comes after the first step's compute, with its first
            # pull done; the step's push goes out on a comm thread beside
            # it, so psd sees it a moment later.
            ch = pstest.channel(d.address)
            stub = pbg.ParameterServerStub(ch)
            pulls = stub.Stats(pb.StatsRequest(), timeout=5).pulls
            pstest.wait_until(lambda: stub.Stats(pb.StatsRequest(), timeout=5).pushes >= 1, 10)
            pushes = stub.Stats(pb.StatsRequest(), timeout=5).pushes
            ch.close()
        status = ready[1].get("STATUS") if ready else None
        r.check(ready is not None and pulls >= 1 and pushes >= 1 and
                status_num(status, r"step (\d+)") is not None,
                "workerd: READY=1 after its first step (psd had answered %d pulls, then "
                "saw %d pushes), STATUS=%s" % (pulls, pushes, status))
        m = ns.wait("STATUS", 5, lambda v: (status_num(v, r"step (\d+)") or 0) >
                    (status_num(status, r"step (\d+)") or 0))
        r.check(m is not None and "examples/s" in m[1]["STATUS"],
                "workerd: STATUS= follows its steps: %s"
                % (m[1]["STATUS"] if m else None))
        # Keep-alives come with steps, at most every quarter interval.
        check_watchdog("workerd", ns, w, lo=0.6, hi=2.2)
        check_stopping("workerd", ns, w)
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
        log.close()
        ns.close()
        d.stop()
    objs = json_lines(open(logp).read(), "workerd", "workerd", "worker0")
    r.check(any(o["level"] == "warn" and "stopped by a signal" in o["event"]
                for o in objs),
            "workerd --log-format json: its SIGTERM line is there")


def json_lines(text, name, daemon, task):
    """Every line of text parses as one JSON object of daemon (and task)."""
    lines = [l for l in text.splitlines() if l.strip()]
    bad = []
    for l in lines:
        try:
            o = json.loads(l)
            if not (isinstance(o, dict) and o.get("daemon") == daemon and
                    re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$",
                             o.get("time", "")) and
                    o.get("level") in ("error", "warn", "info", "debug") and
                    isinstance(o.get("event"), str) and o.get("task") == task):
                bad.append(l)
        except ValueError:
            bad.append(l)
    r.check(lines and not bad, "%s --log-format json: %d lines, each one JSON "
            "object with time, level, daemon %s, task %s, event %s"
            % (name, len(lines), daemon, task, bad[:1] or ""))
    return [json.loads(l) for l in lines if l not in bad]


def test_log_format(root):
    # psd: a variable with a quote and a newline in its name is refused
    # with a line that names it; the line stays JSON.
    logp = os.path.join(root, "psd-json.log")
    with open(logp, "w") as log:
        d = pstest.Daemon([PSD, "--data-dir", os.path.join(root, "json-data"),
                           "--listen", "127.0.0.1:0", "--log-level", "debug",
                           "--task-index", "0", "--log-format", "json"],
                          stderr=log)
        ch = pstest.channel(d.address)
        stub = pbg.ParameterServerStub(ch)
        stub.CreateVariable(pb.CreateVariableRequest(
            spec=pstest.spec(pb, "w", [2, 2])), timeout=10)
        try:
            stub.CreateVariable(pb.CreateVariableRequest(
                spec=pstest.spec(pb, "bad\"name\n\u00e9", [0, 2])), timeout=10)
        except Exception:  # noqa: BLE001: a refusal is expected
            pass
        ch.close()
        rc = d.stop()
    objs = json_lines(open(logp).read(), "psd", "psd", "ps0")
    r.check(rc == 0 and any("serving" in o["event"] for o in objs) and
            any(o["event"] == "stopped cleanly" for o in objs),
            "psd --log-format json: the serving and the stopped lines are there")

    state, spec = os.path.join(root, "json-coord"), coord_spec(root)
    logp = os.path.join(root, "pscoord-json.log")
    with open(logp, "w") as log:
        argv = coord_argv(state, spec)
        argv[argv.index("--log-level") + 1] = "info"
        c = pstest.Daemon(argv + ["--log-format", "json"], stderr=log)
        c.stop()
    json_lines(open(logp).read(), "pscoord", "pscoord", "chief")

    p = subprocess.run([PSCTL, "--log-format", "json", "--server",
                        "127.0.0.1:1", "--rpc-timeout", "200ms", "health"],
                       capture_output=True, text=True, timeout=30)
    r.check(p.returncode == 1, "psctl --log-format json is accepted (health "
            "of nothing fails: %s)" % p.stderr.strip()[-120:])

    p = subprocess.run([PSD, "--data-dir", root, "--log-format", "xml"],
                       capture_output=True, text=True, timeout=30)
    lines = p.stderr.strip().splitlines()
    r.check(p.returncode == 2 and len(lines) == 1 and "--log-format" in lines[0],
            "psd --log-format xml: exit 2, one line: %s" % lines)

    logp = os.path.join(root, "psd-text.log")
    with open(logp, "w") as log:
        d = pstest.Daemon([PSD, "--data-dir", os.path.join(root, "text-data"),
                           "--listen", "127.0.0.1:0", "--log-level", "info"],
                          stderr=log)
        d.stop()
    lines = open(logp).read().splitlines()
    r.check(lines and all(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "
                                   r"psd\[\d+\] (ERROR|WARN|INFO|DEBUG) \S", l)
                          for l in lines),
            "psd without --log-format: today's text lines (%d)" % len(lines))


def test_units(root):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        print("skip: systemd-analyze is not installed: the units are not verified")
        return
    # The units name /usr/local/bin: point them at the build, which verify
    # checks is executable; the templates are verified as instance 0.
    units = os.path.join(pstest.SOURCE_ROOT, "deploy", "systemd")
    out = os.path.join(root, "units")
    os.mkdir(out)
    bins = {"psd": PSD, "pscoord": PSCOORD, "workerd": WORKERD}
    paths = []
    for name in sorted(n for n in os.listdir(units) if n.endswith(".service")):
        text = open(os.path.join(units, name)).read()
        for b, path in bins.items():
            text = text.replace("/usr/local/bin/%s " % b, path + " ")
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
        paths.append(os.path.join(out, name.replace("@.", "@0.")))
        r.check("Type=notify" in text and "WatchdogSec=" in text and
                "NotifyAccess=main" in text,
                "%s: Type=notify, NotifyAccess=main, WatchdogSec=" % name)
    # verify only warns (exit 0) about an unknown key or a bad value:
    # anything it says fails the check.
    p = subprocess.run([analyze, "verify", "--man=no"] + paths,
                       capture_output=True, text=True, timeout=60)
    said = (p.stderr + p.stdout).strip()
    r.check(p.returncode == 0 and not said,
            "systemd-analyze verify accepts the units without a word%s"
            % ("" if not said else ": " + said))


def main():
    root = pstest.tmpdir("notify-")
    test_psd(root)
    test_pscoord(root)
    test_workerd(root)
    test_log_format(root)
    test_units(root)
    r.finish()


if __name__ == "__main__":
    main()
