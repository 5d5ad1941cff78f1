"""pscoord against real clients and real psd shards, all on 127.0.0.1:0 with
temporary state and data directories:

  static     a TF_CONFIG-shaped spec (file and $TF_CONFIG): registration,
             and each refusal (job id, role not in the spec, index out of
             range, a task held by a live process, a ps address that is not
             the spec's), REREGISTER for stale incarnations, "never seen"
             tasks and their warning;
  dynamic    tasks registering with index -1 get 0, 1, 2; liveness: a task
             that stops heartbeating is dead after the timeout;
  addresses  one of 255 bytes is kept whole through GetCluster and a
             restart; a longer one in a spec, a registration or the state
             file is refused;
  sync       real psd shards registered as ps tasks: when a worker dies the
             coordinator's SetSyncWorkers lets a pending SYNC step complete
             with one push, and the count rises again when it comes back;
  place      determinism, balance, the split of a big variable into row
             ranges over both shards, a different model refused;
  ckpt       the schedule over two real psd shards: job-<G>.json with both
             shard paths, --checkpoint-keep prunes, a failing shard keeps
             the previous checkpoint the latest; --checkpoint-every takes
             one only while the global step advances;
  restore    a psd started on a fresh data directory with the same
             --checkpoint-root registers empty and is restored;
  identity   the task secret: a RegisterTask in a live psd's name (its
             address, empty=true) without it or with a wrong one is refused
             and the psd untouched; heartbeats and metrics without it or
             with a wrong one are refused; a step of 2^63-1 is refused and
             takes no checkpoint; a ps that registers empty but whose Stats
             shows variables is not restored;
  restart    kill -9 and restart on the same state directory: tasks,
             placement and checkpoints are still there; a state directory of
             another job is refused;
  watch      WatchCluster pushes on change and ends at shutdown;
  psctl      status shows roles and alive/dead/never seen; --watch; errors.

Prints ok/FAIL per check and "pscoord: N passed, N failed".
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import pstest  # noqa: E402

PSCOORD = os.path.join(pstest.BUILD_ROOT, "coordinator", "pscoord")
PSCTL = os.path.join(pstest.BUILD_ROOT, "tools", "psctl")

pb = pbg = None
r = None


free_port = pstest.free_port


class Coord(pstest.Daemon):
    """A real pscoord on 127.0.0.1:0, its stderr kept in a file to read."""

    def __init__(self, state_dir, *args, env=None):
        self.state_dir = state_dir
        self.args = list(args)
        self.log_path = os.path.join(pstest.tmpdir("pscoord-log-"), "stderr")
        self.log = open(self.log_path, "w")
        argv = [PSCOORD, "--state-dir", state_dir, "--listen", "127.0.0.1:0",
                "--log-level", "info"] + self.args
        super().__init__(argv, env=env, stderr=self.log)
        self.channel = pstest.channel(self.address)
        self.stub = pbg.CoordinatorStub(self.channel)

    def port_error(self, argv):
        return "pscoord did not report its port: %s" % self.stderr()

    def stderr(self):
        with open(self.log_path) as f:
            return f.read()

    def wait_log(self, text, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.stderr():
                return True
            time.sleep(0.05)
        return False

    def cluster(self):
        return self.stub.GetCluster(pb.GetClusterRequest(), timeout=5)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        finally:
            self.channel.close()
            self.log.close()


LIVE = []  # every Coord and psd started, killed at exit


def start_coord(state_dir, *args, env=None):
    c = Coord(state_dir, *args, env=env)
    LIVE.append(c)
    return c


def start_psd(data_dir, *args):
    d = pstest.start_psd(data_dir, *args)
    LIVE.append(d)
    return d


def refused(fn, code, *words):
    """Calls fn; True when it fails with code and every word in details."""
    try:
        fn()
    except grpc.RpcError as e:
        ok = e.code() == code and all(w in e.details() for w in words)
        return ok, "%s: %s" % (e.code().name, e.details())
    return False, "accepted"


SECRETS = {}  # (job, role, index) -> the task secret its registration got


def reg(stub, job, role, index=-1, address="", empty=False, secret=None):
    """RegisterTask; by default with the secret of the slot named by an
    explicit role and index, as the task itself would send it."""
    if secret is None:
        secret = SECRETS.get((job, role, index), "") if index >= 0 else ""
    resp = stub.RegisterTask(pb.RegisterRequest(
        job_id=job, role=role, index=index, address=address, empty=empty,
        task_secret=secret), timeout=5)
    SECRETS[(job, resp.role, resp.index)] = resp.task_secret
    return resp


def hb(stub, job, role, index, inc, step=0, eps=0.0, loss=0.0, secret=None):
    if secret is None:
        secret = SECRETS.get((job, role, index), "")
    return stub.Heartbeat(pb.HeartbeatRequest(
        job_id=job, role=role, index=index, incarnation=inc, step=step,
        examples_per_second=eps, loss=loss, task_secret=secret), timeout=5)


def metrics(stub, job, role, index, step, loss, accuracy, secret=None):
    if secret is None:
        secret = SECRETS.get((job, role, index), "")
    return stub.ReportMetrics(pb.ReportMetricsRequest(
        job_id=job, role=role, index=index, step=step, loss=loss,
        accuracy=accuracy, task_secret=secret), timeout=5)


def task(state, role, index):
    for t in state.tasks:
        if t.role == role and t.index == index:
            return t
    return None


wait_until = pstest.wait_until


class Beater:
    """Heartbeats on behalf of registered tasks, every 100 ms, until told to
    stop (per task or all)."""

    def __init__(self, stub, job):
        self.stub, self.job = stub, job
        self.tasks = {}  # (role, index) -> [incarnation, step]
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.reregister = set()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def add(self, role, index, inc, step=0):
        with self.lock:
            self.tasks[(role, index)] = [inc, step]

    def drop(self, role, index):
        with self.lock:
            self.tasks.pop((role, index), None)

    def step(self, role, index, step):
        with self.lock:
            self.tasks[(role, index)][1] = step

    def run(self):
        while not self.stopped.wait(0.1):
            with self.lock:
                items = list(self.tasks.items())
            for (role, index), (inc, step) in items:
                try:
                    resp = hb(self.stub, self.job, role, index, inc, step,
                              eps=100.0 + index, loss=0.5)
                    if any(d.kind == pb.Directive.REREGISTER
                           for d in resp.directives):
                        self.reregister.add((role, index))
                except (grpc.RpcError, ValueError):
                    pass  # the coordinator is down or being replaced

    def stop(self):
        self.stopped.set()
        self.th.join(timeout=5)


def label(out, name):
    """The value psctl status prints after a label ("workers" -> "1/2 live")."""
    for line in out.splitlines():
        if line.startswith(name + " ") and line[:16].strip() == name:
            return line[16:].strip()
    return None


def psctl(*args, env=None, timeout=30):
    e = dict(os.environ)
    e.pop("PSCOORD_ADDR", None)
    e.update(env or {})
    return subprocess.run([PSCTL, *args], capture_output=True, text=True,
                          timeout=timeout, env=e)


# ---- static spec ---------------------------------------------------------

def test_static():
    W, PS, EV, CH = pb.WORKER, pb.PS, pb.EVALUATOR, pb.CHIEF
    addrs = {"chief": ["127.0.0.1:%d" % free_port()],
             "worker": ["127.0.0.1:%d" % free_port() for _ in range(2)],
             "ps": ["127.0.0.1:%d" % free_port() for _ in range(2)]}
    spec = {"cluster": addrs, "job_id": "jobA",
            "task": {"type": "worker", "index": 0}}
    root = pstest.tmpdir("pscoord-static-")
    path = os.path.join(root, "cluster.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    c = start_coord(os.path.join(root, "state"), "--cluster", path,
                    "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s",
                    "--register-warn-after", "1s")
    s = c.stub
    resp = reg(s, "jobA", W, 0, addrs["worker"][0])
    st = resp.cluster
    r.check(resp.role == W and resp.index == 0 and resp.incarnation == 1 and
            resp.heartbeat_interval_ms == 200 and st.job_id == "jobA" and
            len(st.tasks) == 5 and st.num_ps == 2 and st.num_workers == 2 and
            st.live_workers == 1,
            "static: worker[0] registers: incarnation 1, heartbeat 200 ms, a "
            "cluster of 5 tasks, 2 ps, 1/2 workers live")
    ok, why = refused(lambda: reg(s, "other", W, 1), grpc.StatusCode.FAILED_PRECONDITION,
                      "job 'other': this coordinator runs job 'jobA'")
    r.check(ok, "static: another job id is FAILED_PRECONDITION (%s)" % why)
    # TensorFlow keeps the evaluator out of the training cluster (TFJob's
    # TF_CONFIG lists none): a spec without evaluators admits them.
    ev = reg(s, "jobA", EV, 0)
    r.check(ev.index == 0 and ev.incarnation == 1,
            "static: an evaluator the spec does not list is admitted (evaluator[%d])" % ev.index)
    ok, why = refused(lambda: reg(s, "jobA", W, 5), grpc.StatusCode.INVALID_ARGUMENT,
                      "worker[5]", "2 worker tasks")
    r.check(ok, "static: an index out of range is INVALID_ARGUMENT (%s)" % why)
    ok, why = refused(lambda: reg(s, "jobA", W, 0, "127.0.0.1:9", secret=""),
                      grpc.StatusCode.ALREADY_EXISTS,
                      "worker[0] is held by a live task at %s, heard" % addrs["worker"][0])
    r.check(ok, "static: a second claim on a live task is ALREADY_EXISTS (%s)" % why)
    ok, why = refused(lambda: reg(s, "jobA", W, 0, addrs["worker"][0], secret=""),
                      grpc.StatusCode.PERMISSION_DENIED, "worker[0] is held by a live",
                      "task_secret", "none was sent")
    r.check(ok and SECRETS[("jobA", W, 0)] not in why,
            "static: a claim from the holder's address without its secret is "
            "PERMISSION_DENIED, the secret not echoed (%s)" % why)
    ok, why = refused(lambda: reg(s, "jobA", PS, 1, "127.0.0.1:1"),
                      grpc.StatusCode.INVALID_ARGUMENT, "ps[1]", "127.0.0.1:1",
                      addrs["ps"][1])
    r.check(ok, "static: a ps address that is not the spec's is INVALID_ARGUMENT (%s)" % why)
    log = c.stderr()
    r.check(log.count("refused: ") >= 4,
            "static: each refusal is logged (%d lines)" % log.count("refused: "))

    again = reg(s, "jobA", W, 0, addrs["worker"][0])
    r.check(again.incarnation == 2 and again.index == 0 and
            again.task_secret == resp.task_secret and len(resp.task_secret) == 32,
            "static: a registration with the holder's secret is a restart "
            "(incarnation 2, the same 32-hex-digit secret)")
    d = hb(s, "jobA", W, 0, 1, step=3)
    r.check([x.kind for x in d.directives] == [pb.Directive.REREGISTER],
            "static: a heartbeat with the old incarnation is told REREGISTER")
    d = hb(s, "jobA", W, 1, 0)
    r.check([x.kind for x in d.directives] == [pb.Directive.REREGISTER],
            "static: a heartbeat from a task that never registered is told REREGISTER")
    d = hb(s, "jobA", W, 0, 2, step=7)
    r.check(len(d.directives) == 0 and d.generation == c.cluster().generation,
            "static: a current heartbeat gets no directive and the generation")
    beat = Beater(s, "jobA")
    beat.add(W, 0, 2, step=7)
    ps0 = reg(s, "jobA", PS, -1, addrs["ps"][0])
    chief = reg(s, "jobA", pb.ROLE_UNSPECIFIED, -1, addrs["chief"][0])
    r.check(ps0.index == 0 and ps0.role == PS and chief.role == CH and chief.index == 0,
            "static: index -1 (and no role) find the spec's task by address")
    st = c.cluster()
    w1 = task(st, W, 1)
    r.check(w1 is not None and not w1.alive and w1.incarnation == 0 and
            task(st, W, 0).step == 7 and st.global_step == 7,
            "static: worker[1] is never seen; worker[0] reported step 7 = global step")
    r.check(c.wait_log("ps[1] at %s has not registered after 1 s" % addrs["ps"][1], 5),
            "static: a task that never registered is logged once after the "
            "registration window")
    r.check(c.stderr().count("ps[1] at %s has not registered" % addrs["ps"][1]) == 1,
            "static: ... and only once")
    p = psctl("status", "--coordinator", c.address)
    rows = [l.split() for l in p.stdout.splitlines()]
    r.check(p.returncode == 0 and "jobA" in p.stdout and
            any(x[:2] == ["worker", "1"] and "never" in x for x in rows) and
            any(x[:2] == ["worker", "0"] and "alive" in x for x in rows) and
            label(p.stdout, "workers") == "1/2 live",
            "psctl status: job, 1/2 workers live, worker[0] alive, worker[1] never seen")
    if p.returncode != 0 or "never" not in p.stdout:
        print(p.stdout, p.stderr)
    w1 = reg(s, "jobA", W, 1)
    r.check(w1.index == 1 and task(c.cluster(), W, 1).address == addrs["worker"][1],
            "static: a worker that gives no address is shown at the spec's")
    ok, why = refused(lambda: reg(s, "jobA", W, 1, secret=""),
                      grpc.StatusCode.ALREADY_EXISTS,
                      "worker[1] is held by a live task")
    r.check(ok, "static: ... and a second addressless claim on it is refused (%s)" % why)
    # worker[0] stops: dead after the 1 s timeout.
    beat.stop()
    r.check(c.wait_log("worker[0] at %s is dead: no heartbeat for" % addrs["worker"][0], 5),
            "static: a silent worker is dead after the timeout, logged with its address")
    p = psctl("status", env={"PSCOORD_ADDR": c.address})
    rows = [l.split() for l in p.stdout.splitlines()]
    r.check(p.returncode == 0 and any(x[:2] == ["worker", "0"] and "dead" in x for x in rows),
            "psctl status ($PSCOORD_ADDR): worker[0] dead")
    rc = c.stop()
    summary = json.load(open(os.path.join(c.state_dir, "summary.json")))
    r.check(rc == 0 and summary["job_id"] == "jobA" and len(summary["tasks"]) == 6 and
            summary["global_step"] == 7,
            "static: SIGTERM exits 0 and writes summary.json (job, 5 tasks and the "
            "evaluator, step 7)")

    # The same spec from $TF_CONFIG; --job-id that differs is refused.
    env = dict(os.environ, TF_CONFIG=json.dumps(spec))
    c = start_coord(pstest.tmpdir("pscoord-tfc-"), env=env)
    st = c.cluster()
    r.check(st.job_id == "jobA" and len(st.tasks) == 5,
            "static: the spec and job id come from $TF_CONFIG")
    c.stop()
    p = subprocess.run([PSCOORD, "--state-dir", pstest.tmpdir(), "--listen", "127.0.0.1:0",
                        "--job-id", "jobB"], env=env, capture_output=True, text=True,
                       timeout=20)
    lines = p.stderr.strip().splitlines()
    r.check(p.returncode == 2 and len(lines) == 1 and "jobB" in lines[0] and
            "jobA" in lines[0],
            "static: a --job-id unlike the spec's is refused with one line (%s)"
            % (lines[:1],))


# ---- dynamic membership and liveness -----------------------------------------

def test_dynamic():
    W = pb.WORKER
    c = start_coord(pstest.tmpdir("pscoord-dyn-"), "--job-id", "dyn",
                    "--heartbeat-interval", "100ms", "--heartbeat-timeout", "1s")
    s = c.stub
    got = [reg(s, "dyn", W) for _ in range(3)]
    r.check([g.index for g in got] == [0, 1, 2] and all(g.incarnation == 1 for g in got),
            "dynamic: three workers registering with index -1 get 0, 1, 2")
    ok, why = refused(lambda: s.Place(pb.PlaceRequest(job_id="dyn", variables=[
        pb.VariablePlacement(name="w", shape=[4])],
        task_secret=got[0].task_secret), timeout=5),
        grpc.StatusCode.UNAVAILABLE, "no ps task has registered yet")
    r.check(ok, "dynamic: Place before any ps is UNAVAILABLE (%s)" % why)
    st = c.cluster()
    r.check(st.num_workers == 3 and st.live_workers == 3,
            "dynamic: 3 workers, 3 live")
    # protobuf-c would cut "dyn\0x" to "dyn" and register a fourth worker.
    ok, why = refused(lambda: reg(s, "dyn\0x", W), grpc.StatusCode.INVALID_ARGUMENT,
                      "job_id has a NUL byte at 3")
    st = c.cluster()
    r.check(ok and st.num_workers == 3,
            "dynamic: a job id with a NUL byte is INVALID_ARGUMENT and registers "
            "nothing (%s; %d workers)" % (why, st.num_workers))
    beat = Beater(s, "dyn")
    for g in got:
        beat.add(W, g.index, g.incarnation)
    time.sleep(0.3)
    beat.drop(W, 1)
    t0 = time.monotonic()
    dead = wait_until(lambda: not task(c.cluster(), W, 1).alive, 5)
    took = time.monotonic() - t0
    st = c.cluster()
    r.check(dead and 0.7 < took < 2.5 and st.live_workers == 2 and
            task(st, W, 0).alive and task(st, W, 2).alive,
            "dynamic: the worker that stops heartbeating is dead after ~1 s "
            "(%.1f s), the others alive" % took)
    r.check(c.wait_log("worker[1] at (no address) is dead: no heartbeat for", 2),
            "dynamic: the death is logged")
    again = reg(s, "dyn", W)
    r.check(again.index == 1 and again.incarnation == 2,
            "dynamic: the next registration takes the dead worker's slot (index 1, "
            "incarnation 2)")
    beat.stop()
    c.stop()



def test_addresses():
    """A task's address is at most 255 bytes wherever it comes from: a spec,
    a registration, the state file; one of 255 is kept whole."""
    W = pb.WORKER
    root = pstest.tmpdir("pscoord-addr-")
    long_ps = "h" * 253 + ":22222"
    path = os.path.join(root, "cluster.json")
    with open(path, "w") as f:
        json.dump({"cluster": {"ps": [long_ps], "worker": ["127.0.0.1:1"]},
                   "job_id": "addr"}, f)
    p = subprocess.run([PSCOORD, "--state-dir", os.path.join(root, "spec"), "--listen",
                        "127.0.0.1:0", "--cluster", path], capture_output=True,
                       text=True, timeout=20)
    lines = p.stderr.strip().splitlines()
    r.check(p.returncode == 1 and len(lines) == 1 and
            "ps[0]: an address of 259 bytes; at most 255" in lines[0],
            "addresses: a spec address of 259 bytes is refused at start with one "
            "line (%s)" % lines[:1])
    state = os.path.join(root, "state")
    c = start_coord(state, "--job-id", "addr")
    s = c.stub
    ok, why = refused(lambda: reg(s, "addr", W, address="h" * 300 + ":1"),
                      grpc.StatusCode.INVALID_ARGUMENT, "an address of 302 bytes; at most 255")
    r.check(ok and len(c.cluster().tasks) == 0,
            "addresses: a registration with 302 bytes is INVALID_ARGUMENT and "
            "registers nothing (%s)" % why)
    edge = "h" * 250 + ":2222"
    reg(s, "addr", W, address=edge)
    r.check([t.address for t in c.cluster().tasks] == [edge],
            "addresses: one of 255 bytes registers and GetCluster shows it whole")
    c.stop()
    c = start_coord(state, "--job-id", "addr")
    got = [t.address for t in c.cluster().tasks]
    c.stop()
    r.check(got == [edge], "addresses: it comes back whole from the state file")
    with open(os.path.join(state, "state.json")) as f:
        saved = json.load(f)
    saved["tasks"][0]["address"] = "h" * 251 + ":2222"
    with open(os.path.join(state, "state.json"), "w") as f:
        json.dump(saved, f)
    p = subprocess.run([PSCOORD, "--state-dir", state, "--listen", "127.0.0.1:0",
                        "--job-id", "addr"], capture_output=True, text=True, timeout=20)
    lines = p.stderr.strip().splitlines()
    r.check(p.returncode == 1 and len(lines) == 1 and
            "state.json: a task's address has more than 255 bytes" in lines[0],
            "addresses: a state file with a 256-byte address is refused with one "
            "line (%s)" % lines[:1])

# ---- SetSyncWorkers reaches real psd shards ----------------------------------

def test_sync():
    W, PS = pb.WORKER, pb.PS
    d = start_psd(pstest.tmpdir())
    ch = pstest.channel(d.address)
    ps = pbg.ParameterServerStub(ch)
    ps.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "s", (4,), lr=1.0, consistency=pb.SYNC, num_workers=3)), timeout=10)
    c = start_coord(pstest.tmpdir("pscoord-sync-"), "--job-id", "sync",
                    "--heartbeat-interval", "100ms", "--heartbeat-timeout", "1s")
    s = c.stub
    p0 = reg(s, "sync", PS, -1, d.address)
    beat = Beater(s, "sync")
    beat.add(PS, 0, p0.incarnation)
    ws = [reg(s, "sync", W) for _ in range(2)]
    for w in ws:
        beat.add(W, w.index, w.incarnation)
    r.check(c.wait_log("ps[0] at %s: sync steps wait for 2 workers" % d.address, 5),
            "sync: the coordinator tells the psd that 2 workers are alive")

    result = {}

    def push(worker, step, key):
        try:
            resp = ps.Push(pb.PushRequest(worker=worker, step=step, grads=[
                pstest.grad(pb, "s", np.ones(4))]), timeout=20)
            result[key] = list(resp.versions)
        except grpc.RpcError as e:
            result[key] = e.code().name

    t = threading.Thread(target=push, args=(0, 0, "a"))
    t.start()
    time.sleep(0.5)
    r.check("a" not in result, "sync: worker[0]'s push for step 0 waits for the "
            "second worker")
    beat.drop(W, 1)
    t0 = time.monotonic()
    t.join(timeout=10)
    took = time.monotonic() - t0
    r.check(result.get("a") == [1] and took < 5,
            "sync: worker[1] dies; SetSyncWorkers(1) lets the step complete with "
            "one push (version %s after %.1f s)" % (result.get("a"), took))
    r.check(c.wait_log("worker[1] at (no address) is dead", 1) and
            c.wait_log("sync steps wait for 1 worker (was 2)", 2),
            "sync: the death and the new count are logged")
    back = reg(s, "sync", W, 1)
    beat.add(W, 1, back.incarnation)
    r.check(c.wait_log("sync steps wait for 2 workers (was 1)", 5),
            "sync: worker[1] comes back and the count rises to 2 again")
    t = threading.Thread(target=push, args=(0, 1, "b"))
    t.start()
    time.sleep(0.5)
    waited = "b" not in result
    push(1, 1, "c")
    t.join(timeout=10)
    r.check(waited and result.get("b") == [2] and result.get("c") == [2],
            "sync: step 1 again waits for both workers' pushes (%s, %s)"
            % (result.get("b"), result.get("c")))
    beat.stop()
    ch.close()
    c.stop()
    d.stop()


# ---- placement, checkpoints, restore, restart, watch, psctl --------------------

MODEL = [("emb", [100, 8]), ("odd", [7, 100]), ("big1", [1, 600]),
         ("w", [8, 16]), ("b", [16]), ("c", [4, 4])]


def proposal(model):
    """A worker's proposal, with worker[0]'s secret (pscoord places only for
    a registered task)."""
    return pb.PlaceRequest(job_id="ck", variables=[
        pb.VariablePlacement(name=n, shape=s) for n, s in model],
        task_secret=SECRETS.get(("ck", pb.WORKER, 0), ""))


def placement_map(pl):
    return {v.name: [(p.name, p.shard, p.row_begin, p.row_end) for p in v.parts]
            for v in pl}


def test_job():
    W, PS, EV = pb.WORKER, pb.PS, pb.EVALUATOR
    roots = [pstest.tmpdir("pscoord-ckroot-") for _ in range(2)]
    shards = [start_psd(pstest.tmpdir(), "--checkpoint-root", roots[i]) for i in range(2)]
    state = pstest.tmpdir("pscoord-job-")
    args = ["--job-id", "ck", "--heartbeat-interval", "100ms",
            "--heartbeat-timeout", "1500ms", "--checkpoint-every-steps", "10",
            "--checkpoint-keep", "2", "--split-threshold", "1K"]
    c = start_coord(state, *args)
    s = c.stub
    beat = Beater(s, "ck")
    for i in range(2):
        p = reg(s, "ck", PS, -1, shards[i].address, empty=True)
        r.check(p.index == i, "ckpt: ps registering with index -1 gets %d" % i)
        beat.add(PS, p.index, p.incarnation)
    r.check(c.wait_log("ps[1] registered empty; there is no job checkpoint", 1),
            "ckpt: an empty ps with no job checkpoint yet is only logged")

    # Placement, proposed by a registered worker.
    wk = reg(s, "ck", W)
    beat.add(W, wk.index, wk.incarnation, step=5)
    first = s.Place(proposal(MODEL), timeout=5).placement
    m = placement_map(first)
    r.check(m["emb"] == [("emb/part0", 0, 0, 50), ("emb/part1", 1, 50, 100)],
            "place: emb (3200 B > 1K) is split over both shards by rows: %s" % m["emb"])
    r.check(m["odd"] == [("odd/part0", 0, 0, 4), ("odd/part1", 1, 4, 7)],
            "place: odd (7 rows) splits 4 + 3: %s" % m["odd"])
    r.check(m["big1"] == [("big1", 1, 0, 1)],
            "place: a one-row variable above the threshold is not split, and "
            "goes to the lighter shard 1: %s" % m["big1"])
    r.check(m["w"] == [("w", 0, 0, 8)] and m["b"] == [("b", 0, 0, 16)] and
            m["c"] == [("c", 0, 0, 4)],
            "place: the small ones go largest first onto the least-loaded shard 0")
    r.check([v.name for v in first] == [n for n, _ in MODEL],
            "place: the answer keeps the proposal's order")
    again = s.Place(proposal(list(reversed(MODEL))), timeout=5).placement
    r.check(placement_map(again) == m,
            "place: the same model in another order gets the same placement")
    other = [(n, (sh if n != "w" else [8, 17])) for n, sh in MODEL]
    ok, why = refused(lambda: s.Place(proposal(other), timeout=5),
                      grpc.StatusCode.FAILED_PRECONDITION,
                      "variable 'w' has shape [8, 17], the placed model's has [8, 16]")
    r.check(ok, "place: a different model is FAILED_PRECONDITION naming the "
            "difference (%s)" % why)
    # "w\0x" cut short would be the placed model's "w", and answered.
    nul = [(n if n != "w" else "w\0x", sh) for n, sh in MODEL]
    ok, why = refused(lambda: s.Place(proposal(nul), timeout=5),
                      grpc.StatusCode.INVALID_ARGUMENT,
                      "variables[3].name has a NUL byte at 1")
    r.check(ok, "place: a variable name with a NUL byte is INVALID_ARGUMENT (%s)" % why)
    ok, why = refused(lambda: s.Place(proposal(MODEL[:-1]), timeout=5),
                      grpc.StatusCode.FAILED_PRECONDITION, "'c' is missing")
    r.check(ok, "place: a model missing a variable is refused (%s)" % why)
    r.check(c.cluster().num_ps == 2 and len(c.cluster().placement) == len(MODEL),
            "place: the cluster state carries the placement over 2 ps")
    ok, why = refused(lambda: reg(s, "ck", PS, 2, "127.0.0.1:1"),
                      grpc.StatusCode.FAILED_PRECONDITION,
                      "the job has 2 ps shards; a shard count that changes under "
                      "a running job is refused")
    r.check(ok, "place: a third ps once placement is set is refused (%s)" % why)

    # Variables on the shards, per the placement: constant 1, SGD lr 1.
    stubs = [pbg.ParameterServerStub(pstest.channel(x.address)) for x in shards]
    parts = {}
    for v in first:
        for p in v.parts:
            shape = [p.row_end - p.row_begin] + list(v.shape[1:])
            stubs[p.shard].CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
                pb, p.name, shape, lr=1.0,
                init=pb.Initializer(kind=pb.Initializer.CONSTANT, value=1.0))), timeout=10)
            parts[p.name] = (p.shard, shape)

    def push_all():
        for name, (shard, shape) in parts.items():
            stubs[shard].Push(pb.PushRequest(grads=[pstest.grad(pb, name, np.ones(shape))]),
                              timeout=10)

    push_all()  # every value 0, version 1

    # Checkpoint schedule: every 10 steps, keep 2.
    ckdir = os.path.join(state, "checkpoints")

    def manifests():
        return sorted(int(f[4:-5]) for f in os.listdir(ckdir)
                      if f.startswith("job-") and f.endswith(".json"))

    time.sleep(0.6)
    r.check(manifests() == [], "ckpt: no checkpoint before global step 10")
    beat.step(W, wk.index, 12)
    got = wait_until(lambda: manifests() == [12], 10)
    r.check(got, "ckpt: global step 12 crosses 10: job-12.json appears (%s)" % manifests())
    man = json.load(open(os.path.join(ckdir, "job-12.json"))) if got else {}
    sh = man.get("shards", [])
    r.check(man.get("format") == 1 and man.get("job_id") == "ck" and man.get("step") == 12
            and [x["index"] for x in sh] == [0, 1] and
            [x["address"] for x in sh] == [x.address for x in shards] and
            all(os.path.isdir(x["path"]) and x["path"].startswith(roots[i]) and
                x["bytes"] > 0 for i, x in enumerate(sh)),
            "ckpt: the manifest names both shards with their checkpoint paths and bytes")
    st = c.cluster()
    r.check(st.last_checkpoint_step == 12 and
            st.last_checkpoint_path == os.path.join(ckdir, "job-12.json"),
            "ckpt: the cluster state names the last checkpoint and its manifest")
    beat.step(W, wk.index, 25)
    wait_until(lambda: manifests() == [12, 25], 10)
    beat.step(W, wk.index, 31)
    got = wait_until(lambda: manifests() == [25, 31], 10)
    r.check(got, "ckpt: steps 25 and 31 are taken and --checkpoint-keep 2 prunes "
            "job-12 (%s)" % manifests())
    push_all()  # every value -1, version 2: after the checkpoint at 31

    # A shard that fails its Checkpoint: the previous checkpoint stays.
    shards[1].kill()
    beat.step(W, wk.index, 40)
    r.check(c.wait_log("job checkpoint at step 40 failed on ps[1] at %s" % shards[1].address, 10)
            and c.wait_log("the latest job checkpoint stays step 31", 1),
            "ckpt: a shard that does not answer fails the round, logged with the "
            "shard and reason")
    r.check(manifests() == [25, 31] and c.cluster().last_checkpoint_step == 31,
            "ckpt: no job-40.json; step 31 stays the latest")

    # Restore: a fresh psd with the same --checkpoint-root registers empty.
    beat.drop(PS, 1)
    wait_until(lambda: not task(c.cluster(), PS, 1).alive, 5)
    fresh = start_psd(pstest.tmpdir(), "--checkpoint-root", roots[1])
    p = reg(s, "ck", PS, -1, fresh.address, empty=True)
    beat.add(PS, p.index, p.incarnation)
    r.check(p.index == 1 and p.incarnation == 2,
            "restore: the fresh psd takes the dead shard's index 1 (incarnation 2)")
    r.check(c.wait_log("restored ps[1] at %s from job checkpoint 31" % fresh.address, 20),
            "restore: the coordinator restores it from job checkpoint 31")
    fstub = pbg.ParameterServerStub(pstest.channel(fresh.address))
    names = sorted(n for n, (shard, _) in parts.items() if shard == 1)
    vals = fstub.Pull(pb.PullRequest(items=[pb.PullItem(name=n) for n in names]),
                      timeout=10).values
    r.check(len(vals) == len(names) and
            all(v.version == 1 and np.all(pstest.value(v) == 0.0) for v in vals),
            "restore: Pull shows the checkpoint's values on the fresh psd (%d "
            "variables at version 1, all 0)" % len(vals))
    st_json = json.load(open(os.path.join(state, "state.json")))
    rs = st_json.get("restores", [])
    r.check(rs and rs[-1]["index"] == 1 and rs[-1]["step"] == 31 and rs[-1]["ok"],
            "restore: state.json records it")

    # WatchCluster: a state now, and one when the generation changes.
    msgs = []
    stream = s.WatchCluster(pb.GetClusterRequest(job_id="ck"))

    def reader():
        try:
            for m_ in stream:
                msgs.append(m_)
        except grpc.RpcError as e:
            msgs.append(e.code())

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    wait_until(lambda: len(msgs) >= 1, 5)
    e0 = msgs[0].generation if msgs else 0
    ev = reg(s, "ck", EV)
    beat.add(EV, ev.index, ev.incarnation)
    metrics(s, "ck", EV, 0, 31, 0.3, 0.875)
    got = wait_until(lambda: any(not isinstance(x, grpc.StatusCode) and x.generation > e0
                                 for x in msgs), 5)
    r.check(msgs and got, "watch: the state comes at once (generation %d) and again when "
            "the generation rises" % e0)
    got = wait_until(lambda: any(not isinstance(x, grpc.StatusCode) and
                                 x.eval_accuracy == 0.875 for x in msgs), 5)
    r.check(got, "watch: progress without a generation change (an evaluation) is sent "
            "within the interval")
    stream.cancel()
    th.join(timeout=5)
    st = c.cluster()
    r.check(abs(st.eval_accuracy - 0.875) < 1e-9 and st.eval_step == 31,
            "metrics: the evaluator's accuracy and step are in the cluster state")
    time.sleep(0.35)  # three of the Beater's heartbeats, each with loss 0
    et = task(c.cluster(), EV, 0)
    r.check(et is not None and abs(et.loss - 0.3) < 1e-9 and abs(et.accuracy - 0.875) < 1e-9,
            "metrics: the evaluator's own loss and accuracy outlast its heartbeats "
            "(%r)" % ((et and (et.loss, et.accuracy)),))

    # psctl status against the live job, then --watch.
    p = psctl("status", "--coordinator", c.address)
    rows = [l.split() for l in p.stdout.splitlines()]
    r.check(p.returncode == 0 and "step 31: %s" % os.path.join(ckdir, "job-31.json") in p.stdout
            and "accuracy 0.8750, loss 0.3000 at step 31" in p.stdout and
            any(x[:2] == ["ps", "1"] and "alive" in x for x in rows) and
            any(x[:2] == ["worker", "0"] and "alive" in x and "40" in x for x in rows) and
            any(x[:2] == ["evaluator", "0"] for x in rows),
            "psctl status: last checkpoint, evaluation, and a row per task")
    if p.returncode != 0:
        print(p.stdout, p.stderr)
    w = subprocess.Popen([PSCTL, "status", "--watch", "--coordinator", c.address],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    w.send_signal(signal.SIGINT)
    out, _ = w.communicate(timeout=10)
    r.check(label(out, "job") == "ck" and "ROLE" in out,
            "psctl status --watch prints a block per state it is sent")

    # kill -9 and restart on the same state directory.
    c.stop(signal.SIGKILL)
    beat.drop(EV, 0)
    before = json.load(open(os.path.join(state, "state.json")))
    c = start_coord(state, *args)
    s = c.stub
    beat.stub = s
    st = c.cluster()
    ev0 = task(st, EV, 0)
    r.check(ev0 is not None and not ev0.alive and ev0.incarnation == 1 and
            ev0.last_heartbeat_age_seconds < 0,
            "restart: a task not heard from since the restart is unknown, not dead")
    incs = {(t.role, t.index): t.incarnation for t in st.tasks}
    r.check(incs.get((PS, 1)) == 2 and incs.get((PS, 0)) == 1 and
            incs.get((W, 0)) == 1 and incs.get((EV, 0)) == 1,
            "restart: tasks and incarnations are recovered (%s)" % sorted(incs.items()))
    r.check(placement_map(st.placement) == m and st.num_ps == 2,
            "restart: the placement is recovered")
    r.check(st.last_checkpoint_step in (31, 40) and st.global_step >= 31 and
            abs(st.eval_accuracy - 0.875) < 1e-9,
            "restart: the last checkpoint, global step and evaluation are recovered")
    r.check(before["job_id"] == "ck" and len(before["tasks"]) == 4,
            "restart: state.json held the job and its 4 tasks")
    mode = os.stat(os.path.join(state, "state.json")).st_mode & 0o777
    r.check(mode == 0o600 and before["tasks"][0].get("secret"),
            "restart: state.json keeps the task secrets, mode %o (0600)" % mode)
    again = s.Place(proposal(MODEL), timeout=5).placement
    r.check(placement_map(again) == m, "restart: Place answers the kept placement")
    # The beater still heartbeats with the old incarnations: accepted, alive.
    alive = wait_until(lambda: task(c.cluster(), W, 0).alive and task(c.cluster(), PS, 1).alive, 5)
    r.check(alive and not beat.reregister,
            "restart: tasks heartbeating with their incarnation and secret are "
            "alive again, no REREGISTER")
    got = wait_until(lambda: manifests() == [31, 40], 10)
    r.check(got and c.cluster().last_checkpoint_step == 40,
            "restart: the round that failed at step 40 runs once both shards are "
            "heard from again (%s)" % manifests())
    d = hb(s, "ck", W, 5, 1)
    r.check([x.kind for x in d.directives] == [pb.Directive.REREGISTER],
            "restart: a task the coordinator does not know is told REREGISTER")
    r.check(c.wait_log("evaluator[0] at (no address) is dead: not heard from since the "
                       "coordinator restarted", 5),
            "restart: ... and dead after one timeout of grace")
    p = psctl("status", "--coordinator", c.address)
    rows = [l.split() for l in p.stdout.splitlines()]
    r.check(p.returncode == 0 and any(x[:2] == ["evaluator", "0"] and "dead" in x for x in rows)
            and any(x[:2] == ["worker", "0"] and "alive" in x for x in rows),
            "psctl status after the restart: evaluator dead, worker alive")

    # A second coordinator on this state directory, while it is in use, is
    # refused by the directory's lock, naming the holder.
    p = subprocess.run([PSCOORD, "--state-dir", state, "--listen", "127.0.0.1:0",
                        "--job-id", "ck"], capture_output=True, text=True, timeout=20)
    lines = p.stderr.strip().splitlines()
    r.check(p.returncode == 1 and len(lines) == 1 and
            "in use by pid %d" % c.proc.pid in lines[0],
            "restart: a second pscoord on a state directory in use is refused with "
            "one line naming the holder (%s)" % lines[:1])

    # Shutdown ends an open watch with UNAVAILABLE and writes the summary.
    msgs = []
    stream = s.WatchCluster(pb.GetClusterRequest())
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    wait_until(lambda: len(msgs) >= 1, 5)
    beat.stop()
    rc = c.stop()
    th.join(timeout=10)
    r.check(rc == 0 and msgs and msgs[-1] == grpc.StatusCode.UNAVAILABLE,
            "shutdown: exit 0, and an open watch ends UNAVAILABLE (%s)"
            % (msgs[-1] if msgs else None))
    summ = json.load(open(os.path.join(state, "summary.json")))
    r.check(summ["job_id"] == "ck" and summ["last_checkpoint"]["step"] == 40 and
            summ["last_eval"]["accuracy"] == 0.875 and len(summ["tasks"]) == 4,
            "shutdown: summary.json has the tasks, last checkpoint and evaluation")

    # A coordinator of another job on this (now free) state directory.
    p = subprocess.run([PSCOORD, "--state-dir", state, "--listen", "127.0.0.1:0",
                        "--job-id", "other"], capture_output=True, text=True, timeout=20)
    lines = p.stderr.strip().splitlines()
    r.check(p.returncode == 1 and len(lines) == 1 and "holds the state of job 'ck'" in lines[0],
            "restart: a state directory of another job is refused with one line (%s)"
            % lines[:1])
    r.check(all("answered twice" not in x.stderr() for x in LIVE if isinstance(x, Coord)),
            "no call was answered twice")
    for x in shards + [fresh]:
        x.kill()


def test_timed():
    W, PS = pb.WORKER, pb.PS
    d = start_psd(pstest.tmpdir())
    state = pstest.tmpdir("pscoord-timed-")
    c = start_coord(state, "--job-id", "t", "--heartbeat-interval", "100ms",
                    "--heartbeat-timeout", "2s", "--checkpoint-every", "300ms")
    s = c.stub
    beat = Beater(s, "t")
    p = reg(s, "t", PS, -1, d.address)
    beat.add(PS, 0, p.incarnation)
    w = reg(s, "t", W)
    beat.add(W, 0, w.incarnation, step=3)
    ckdir = os.path.join(state, "checkpoints")
    got = wait_until(lambda: os.listdir(ckdir) == ["job-3.json"], 5)
    r.check(got, "timed: --checkpoint-every 300ms takes job-3.json (%s)" % os.listdir(ckdir))
    time.sleep(1.0)
    r.check(os.listdir(ckdir) == ["job-3.json"],
            "timed: no new checkpoint while the global step stands still")
    beat.step(W, 0, 4)
    got = wait_until(lambda: sorted(os.listdir(ckdir)) == ["job-3.json", "job-4.json"], 5)
    r.check(got, "timed: the next one once the step advances (%s)" % os.listdir(ckdir))
    beat.stop()
    c.stop()
    d.stop()


# ---- identity: the task secret, the shard's own word, bounded steps -----------

def checkpointing_job(job, heartbeat_timeout):
    """A psd with a checkpoint root of its own and a pscoord for `job` that
    takes a job checkpoint every 10 steps (heartbeats every 100 ms, a task
    lost after heartbeat_timeout), the psd registered as ps 0 and beating.
    Returns (root, psd, its stub, pscoord's state dir, pscoord, the Beater,
    the psd's registration)."""
    root = pstest.tmpdir("pscoord-%sroot-" % job)
    d = start_psd(pstest.tmpdir(), "--checkpoint-root", root)
    ps = pbg.ParameterServerStub(pstest.channel(d.address))
    state = pstest.tmpdir("pscoord-%s-" % job)
    c = start_coord(state, "--job-id", job, "--heartbeat-interval", "100ms",
                    "--heartbeat-timeout", heartbeat_timeout, "--checkpoint-every-steps", "10")
    beat = Beater(c.stub, job)
    p = reg(c.stub, job, pb.PS, -1, d.address, empty=True)
    beat.add(pb.PS, 0, p.incarnation)
    return root, d, ps, state, c, beat, p


def test_identity():
    W, PS, EV = pb.WORKER, pb.PS, pb.EVALUATOR
    root, d, ps, state, c, beat, p = checkpointing_job("id", "1s")
    s = c.stub
    ps.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "v", (4,), lr=1.0,
        init=pb.Initializer(kind=pb.Initializer.CONSTANT, value=1.0))), timeout=10)
    w = reg(s, "id", W)
    beat.add(W, 0, w.incarnation, step=10)
    ckdir = os.path.join(state, "checkpoints")
    got = wait_until(lambda: os.listdir(ckdir) == ["job-10.json"], 10)
    r.check(got, "identity: a job checkpoint at step 10 (%s)" % os.listdir(ckdir))
    for _ in range(5):  # version 5: after the checkpoint (version 0)
        ps.Push(pb.PushRequest(grads=[pstest.grad(pb, "v", np.ones(4))]), timeout=10)

    def version():
        v = ps.Pull(pb.PullRequest(items=[pb.PullItem(name="v")]), timeout=10).values[0]
        return v.version, list(pstest.value(v))

    before = version()
    # The audit's attack: the real psd's address (GetCluster publishes it),
    # empty=true, no secret.
    addr = task(c.cluster(), PS, 0).address
    ok, why = refused(lambda: reg(s, "id", PS, 0, addr, empty=True, secret=""),
                      grpc.StatusCode.PERMISSION_DENIED, "ps[0]", "task_secret",
                      "none was sent")
    r.check(ok and p.task_secret not in why,
            "identity: RegisterTask(PS, 0, the psd's address, empty) without the "
            "secret is PERMISSION_DENIED (%s)" % why)
    ok, why = refused(lambda: reg(s, "id", PS, 0, addr, empty=True, secret="0" * 32),
                      grpc.StatusCode.PERMISSION_DENIED, "ps[0]", "not it")
    r.check(ok and p.task_secret not in why,
            "identity: ... and with a wrong secret (%s)" % why)
    time.sleep(0.5)
    r.check(version() == before and before[0] == 5 and "restoring it" not in c.stderr(),
            "identity: the real psd's variable is untouched (version %s)" % (version()[0],))
    r.check(task(c.cluster(), PS, 0).incarnation == p.incarnation,
            "identity: the holder keeps its incarnation")

    # Heartbeats and metrics without or with a wrong secret.
    ok, why = refused(lambda: hb(s, "id", W, 0, w.incarnation, step=11, secret=""),
                      grpc.StatusCode.PERMISSION_DENIED, "no task_secret")
    r.check(ok, "identity: a heartbeat without the secret is PERMISSION_DENIED (%s)" % why)
    ok, why = refused(lambda: hb(s, "id", W, 0, w.incarnation, step=11, secret="ab" * 16),
                      grpc.StatusCode.PERMISSION_DENIED, "is not worker[0]'s")
    r.check(ok and "ab" * 16 not in why,
            "identity: a heartbeat with a wrong secret is PERMISSION_DENIED (%s)" % why)
    ok, why = refused(lambda: metrics(s, "id", W, 0, 10, 0.1, 0.5, secret=""),
                      grpc.StatusCode.PERMISSION_DENIED, "no task_secret")
    r.check(ok, "identity: ReportMetrics without the secret is PERMISSION_DENIED (%s)" % why)
    ok, why = refused(lambda: metrics(s, "id", EV, 0, 10, 0.1, 1e300),
                      grpc.StatusCode.PERMISSION_DENIED, "evaluator[0] has not registered")
    r.check(ok, "identity: ReportMetrics from a task never registered is "
            "PERMISSION_DENIED (%s)" % why)

    # A step of 2^63-1 is refused and drives no checkpoint.
    big = 2 ** 63 - 1
    ok, why = refused(lambda: hb(s, "id", W, 0, w.incarnation, step=big),
                      grpc.StatusCode.INVALID_ARGUMENT, "step %d" % big,
                      "global step 10")
    r.check(ok, "identity: a heartbeat with step 2^63-1 is INVALID_ARGUMENT (%s)" % why)
    ok, why = refused(lambda: metrics(s, "id", W, 0, big, 0.1, 0.5),
                      grpc.StatusCode.INVALID_ARGUMENT, "step %d" % big)
    r.check(ok, "identity: ... and a metrics report with it (%s)" % why)
    time.sleep(0.6)
    r.check(c.cluster().global_step == 10 and os.listdir(ckdir) == ["job-10.json"],
            "identity: the global step stays 10 and no checkpoint is taken at "
            "2^63-1 (%s)" % os.listdir(ckdir))

    # The slot freed (the holder silent past the timeout): a registration
    # that says empty for a psd that is not is not restored, on the shard's
    # own word.
    beat.drop(PS, 0)
    wait_until(lambda: not task(c.cluster(), PS, 0).alive, 5)
    q = reg(s, "id", PS, 0, addr, empty=True, secret="")
    r.check(q.incarnation == p.incarnation + 1 and q.task_secret != p.task_secret,
            "identity: a dead holder's slot goes to a new registration, with a new secret")
    r.check(c.wait_log("not restored: it registered empty, but its Stats answers 1 "
                       "variable", 10) and version() == before,
            "identity: a ps that registers empty but holds variables is not "
            "restored (version %s)" % (version()[0],))

    # A psd restarted at the same address has lost its secret, yet takes its
    # slot back at once while the old holder still counts as alive: its own
    # Stats shows a process started after the holder registered.
    beat.add(PS, 0, q.incarnation)
    time.sleep(0.3)
    d.kill()
    d2 = start_psd(pstest.tmpdir(), "--checkpoint-root", root, "--listen", addr)
    held = task(c.cluster(), PS, 0).alive
    t0 = time.monotonic()
    n = reg(s, "id", PS, 0, addr, empty=True, secret="")
    r.check(held and n.incarnation == q.incarnation + 1 and
            n.task_secret not in ("", q.task_secret) and time.monotonic() - t0 < 2,
            "identity: a psd restarted at the holder's address takes the live "
            "slot back at once, with a new secret (incarnation %d)" % n.incarnation)
    r.check(c.wait_log("restored ps[0] at %s from job checkpoint 10" % addr, 20),
            "identity: ... and, empty, is restored from the job checkpoint")
    beat.stop()
    c.stop()
    d2.stop()


def test_rogue_steps():
    """A worker that lies about its step: heartbeats at 2^40+10 .. 2^40+3000
    once drove the global step there, and every job checkpoint after failed
    (psd refused the step as far ahead of its versions). Its steps are held
    to a pace, and the global step is the lower median of the live workers'
    steps: the honest two keep the checkpoints going."""
    W = pb.WORKER
    _, d, ps, state, c, beat, _ = checkpointing_job("rogue", "2s")
    s = c.stub
    ps.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "v", (4,), lr=1.0)),
                      timeout=10)
    honest = [reg(s, "rogue", W) for _ in range(2)]
    for h in honest:
        beat.add(W, h.index, h.incarnation, step=5)
    wait_until(lambda: c.cluster().global_step == 5, 5)
    liar = reg(s, "rogue", W)
    t0 = time.monotonic()
    taken, others = 0, set()
    for k in range(5, 3001, 10):
        try:
            hb(s, "rogue", W, liar.index, liar.incarnation, step=2 ** 40 + k)
            taken += 1
        except grpc.RpcError as e:
            others.add(e.code())  # more than 2^40 past the global step
    beat.add(W, liar.index, liar.incarnation, step=2 ** 40 + 5)
    elapsed = time.monotonic() - t0 + 1.0
    time.sleep(0.3)
    st = c.cluster()
    held = task(st, W, liar.index).step
    r.check(taken >= 1 and others <= {grpc.StatusCode.INVALID_ARGUMENT} and
            held <= 5 + 100000 + 1000000 * elapsed,
            "rogue: heartbeats at 2^40+5..2^40+2995 leave the liar's step held to "
            "the pace: %d (%d taken, the others %s)" % (held, taken, others))
    r.check(st.global_step == 5, "rogue: the global step is the honest workers' 5, "
            "not the liar's (%d)" % st.global_step)
    r.check(c.stderr().count("is past its pace; held to") == 1,
            "rogue: the held step is logged once per incarnation")
    ckdir = os.path.join(state, "checkpoints")
    for h in honest:
        beat.step(W, h.index, 12)
    got = wait_until(lambda: "job-12.json" in os.listdir(ckdir), 10)
    r.check(got, "rogue: the honest workers at step 12 make a job checkpoint at 12 (%s)"
            % os.listdir(ckdir))
    for h in honest:
        beat.step(W, h.index, 23)
    got = wait_until(lambda: "job-23.json" in os.listdir(ckdir), 10)
    r.check(got and "checkpoint" not in "".join(
        l for l in c.stderr().splitlines() if "failed" in l),
            "rogue: ... and the next at 23, none failed (%s)" % sorted(os.listdir(ckdir)))
    beat.stop()
    c.stop()
    d.stop()


def test_psctl_errors():
    port = free_port()
    p = psctl("status", "--coordinator", "127.0.0.1:%d" % port, "--rpc-timeout", "2s")
    lines = p.stderr.strip().splitlines()
    r.check(p.returncode == 1 and len(lines) == 1 and
            lines[0].startswith("psctl: cannot reach pscoord at 127.0.0.1:%d" % port),
            "psctl status: an address where nothing answers is one line, exit 1 (%s)"
            % lines[:1])
    p = psctl("status", "--coordinator", "nonsense")
    lines = p.stderr.strip().splitlines()
    r.check(p.returncode == 2 and len(lines) == 1 and "--coordinator" in lines[0],
            "psctl status: a bad --coordinator is a usage error (%s)" % lines[:1])


def main():
    global pb, pbg, r
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("pscoord")
    try:
        # One broken case must not hide the others.
        r.run((test_static, test_dynamic, test_addresses, test_sync, test_job, test_timed,
               test_identity, test_rogue_steps, test_psctl_errors))
    finally:
        pstest.stop_all(LIVE, kill=True)
    r.finish()


if __name__ == "__main__":
    main()
