"""Tokens with roles (psd and pscoord --tokens, the clients' --token-file)
and the fixes of issue 13 h, against real daemons on 127.0.0.1:0 with
temporary directories; the client is Debian's python3-grpcio.

  psd        no token: UNAUTHENTICATED (the message says so, never the
             token); a token not in the file: UNAUTHENTICATED; worker:
             create, push, pull, but Restore, Checkpoint, DeleteVariable,
             SetSyncWorkers are PERMISSION_DENIED naming role and method;
             reader: Stats (tokens_required true), ListVariables, Health,
             not Push; operator: Checkpoint, Restore, DeleteVariable; a
             `ROLE sha256:HEX` entry admits its token; a method not in the
             table is refused to every role; SIGHUP reloads the file.
  pscoord    no token: UNAUTHENTICATED; reader: GetCluster, not RegisterTask.
  job        workerd --token-file trains against psd and pscoord with
             tokens (pscoord calls psd with an operator token).
  psctl      --token-file works; without it one line and a non-zero exit.
  secrecy    no token in any daemon's argv (ps -o args) or log.
  files      a token file missing, malformed (one line naming file and
             line), or holding plain tokens readable by others: exit 2.
  fixh       (no tokens: these fail on the code before issue 13 h)
             SetSyncWorkers above the job's worker count is refused and
             changes nothing; Place needs a registered worker's task secret
             (operator token with tokens on); ReportMetrics with accuracy
             1e300, -0.5 or a loss of 1e300 is refused and changes nothing;
             RegisterTask needs a worker token when tokens are on.

Prints ok/FAIL per check and "auth: N passed, N failed". With an argument
(psd, pscoord, job, psctl, secrecy, files, fixh) runs only those parts.
"""
import hashlib
import os
import secrets
import signal
import subprocess
import sys
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import pstest  # noqa: E402

PSD = pstest.psd_path()
PSCOORD = os.path.join(pstest.BUILD_ROOT, "coordinator", "pscoord")
WORKERD = os.path.join(pstest.BUILD_ROOT, "worker", "workerd")
PSCTL = os.path.join(pstest.BUILD_ROOT, "tools", "psctl")
FM = "/usr/share/datasets/fashion-mnist"

pb = pbg = hpb = hpbg = None
r = pstest.Results("auth")
LIVE = []

T = {role: secrets.token_urlsafe(32) for role in ("worker", "operator", "reader")}
T_HASHED = secrets.token_urlsafe(32)  # a reader listed only by its hash
T_NEW = secrets.token_urlsafe(32)     # added by the SIGHUP reload
ALL_TOKENS = list(T.values()) + [T_HASHED, T_NEW]
U = grpc.StatusCode.UNAUTHENTICATED
D = grpc.StatusCode.PERMISSION_DENIED


def write(path, text, mode=0o600):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def tokens_file(d, extra=""):
    return write(os.path.join(d, "tokens"),
                 "# role token\n" + "".join("%s %s\n" % (k, v) for k, v in T.items()) +
                 "reader sha256:%s  # by hash\n" % hashlib.sha256(T_HASHED.encode()).hexdigest()
                 + extra)


def token_files(d):
    """One client file per role: the worker's holds the token alone, the
    others the 'ROLE TOKEN' line of the server's file."""
    out = {"worker": write(os.path.join(d, "worker.tok"), T["worker"] + "\n")}
    for role in ("operator", "reader"):
        out[role] = write(os.path.join(d, role + ".tok"), "%s %s\n" % (role, T[role]))
    return out


def md(token):
    return [("authorization", "Bearer " + token)] if token else None


def outcome(fn):
    """(code, details) of a call; code OK when it succeeded."""
    try:
        fn()
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details()


def expect(what, fn, code, *words):
    c, det = outcome(fn)
    leak = any(t in det for t in ALL_TOKENS)
    r.check(c == code and all(w in det for w in words) and not leak,
            "%s: %s (%s)" % (what, code.name, det if c != grpc.StatusCode.OK else "OK"))
    return c == code


class Proc(pstest.Daemon):
    """A daemon with its stderr in a file."""

    def __init__(self, argv):
        self.log_path = os.path.join(pstest.tmpdir("auth-log-"), "stderr")
        self.logf = open(self.log_path, "w")
        self.argv = argv
        super().__init__(argv, stderr=self.logf)
        LIVE.append(self)

    def log(self):
        with open(self.log_path) as f:
            return f.read()


def start_psd(*args):
    d = pstest.tmpdir("auth-psd-")
    return Proc([PSD, "--data-dir", d, "--listen", "127.0.0.1:0",
                 "--log-level", "debug"] + list(args))


def start_coord(*args):
    d = pstest.tmpdir("auth-coord-")
    return Proc([PSCOORD, "--state-dir", d, "--listen", "127.0.0.1:0",
                 "--log-level", "debug", "--heartbeat-interval", "100ms"] + list(args))


def ps_stub(p):
    return pbg.ParameterServerStub(pstest.channel(p.address))


def co_stub(p):
    return pbg.CoordinatorStub(pstest.channel(p.address))


def health_stub(p):
    return hpbg.HealthStub(pstest.channel(p.address))


def var(name, shape=(4,), **kw):
    return pb.CreateVariableRequest(spec=pstest.spec(pb, name, shape, **kw))


# ---- psd ---------------------------------------------------------------------

def test_psd(d):
    p = start_psd("--tokens", tokens_file(d))
    s = ps_stub(p)
    w, o, rd = md(T["worker"]), md(T["operator"]), md(T["reader"])
    expect("psd: Stats without a token", lambda: s.Stats(pb.StatsRequest(), timeout=5),
           U, "requires a token", "sent none")
    expect("psd: Push without a token",
           lambda: s.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", [1, 2, 3, 4])]),
                          timeout=5), U, "requires a token")
    expect("psd: a token not in the file",
           lambda: s.Stats(pb.StatsRequest(), timeout=5,
                           metadata=md(secrets.token_urlsafe(32))),
           U, "not one of this server's")
    expect("psd: 'authorization' that is not Bearer",
           lambda: s.Stats(pb.StatsRequest(), timeout=5,
                           metadata=[("authorization", "Basic " + T["reader"])]),
           U, "not 'Bearer TOKEN'")
    expect("psd: worker creates", lambda: s.CreateVariable(var("w"), timeout=5,
                                                          metadata=w), grpc.StatusCode.OK)
    expect("psd: worker pushes", lambda: s.Push(pb.PushRequest(grads=[pstest.grad(
        pb, "w", [1.0, 2.0, 3.0, 4.0])]), timeout=5, metadata=w), grpc.StatusCode.OK)
    got = s.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=5, metadata=w)
    r.check(max(abs(a - b) for a, b in zip(pstest.value(got.values[0]),
                                           [-0.1, -0.2, -0.3, -0.4])) < 1e-6,
            "psd: worker pulls the pushed value")
    for method, call in [
            ("Restore", lambda m: s.Restore(pb.RestoreRequest(), timeout=5, metadata=m)),
            ("Checkpoint", lambda m: s.Checkpoint(pb.CheckpointRequest(), timeout=30,
                                                  metadata=m)),
            ("DeleteVariable", lambda m: s.DeleteVariable(
                pb.DeleteVariableRequest(name="w"), timeout=5, metadata=m)),
            ("SetSyncWorkers", lambda m: s.SetSyncWorkers(
                pb.SetSyncWorkersRequest(workers=1), timeout=5, metadata=m))]:
        expect("psd: worker %s" % method, lambda: call(w), D, "role 'worker'",
               "/ps.v1.ParameterServer/" + method, "operator")
    expect("psd: worker Stats", lambda: s.Stats(pb.StatsRequest(), timeout=5, metadata=w),
           D, "role 'worker'", "Stats")
    st = s.Stats(pb.StatsRequest(), timeout=5, metadata=rd)
    r.check(st.tokens_required and st.variables == 1,
            "psd: reader Stats shows tokens_required (%s)" % st.tokens_required)
    expect("psd: reader ListVariables",
           lambda: s.ListVariables(pb.ListVariablesRequest(), timeout=5, metadata=rd),
           grpc.StatusCode.OK)
    expect("psd: reader by its sha256 entry",
           lambda: s.Stats(pb.StatsRequest(), timeout=5, metadata=md(T_HASHED)),
           grpc.StatusCode.OK)
    expect("psd: reader Push", lambda: s.Push(pb.PushRequest(grads=[pstest.grad(
        pb, "w", [1.0, 1.0, 1.0, 1.0])]), timeout=5, metadata=rd), D, "role 'reader'", "Push")
    h = health_stub(p)
    expect("psd: Health without a token",
           lambda: h.Check(hpb.HealthCheckRequest(), timeout=5), U)
    expect("psd: reader Health", lambda: h.Check(hpb.HealthCheckRequest(), timeout=5,
                                                 metadata=rd), grpc.StatusCode.OK)
    expect("psd: a method not in the table, operator",
           lambda: pstest.channel(p.address).unary_unary("/ps.v1.ParameterServer/Nope")(
               b"", timeout=5, metadata=o), D, "not in the role table")
    ck = s.Checkpoint(pb.CheckpointRequest(), timeout=30, metadata=o)
    s.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", [1.0, 1.0, 1.0, 1.0])]), timeout=5,
           metadata=w)
    rs = s.Restore(pb.RestoreRequest(step=ck.step), timeout=30, metadata=o)
    got = s.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=5, metadata=w)
    r.check(rs.variables == 1 and abs(pstest.value(got.values[0])[0] + 0.1) < 1e-6,
            "psd: operator Checkpoint and Restore bring the value back")
    expect("psd: operator SetSyncWorkers", lambda: s.SetSyncWorkers(
        pb.SetSyncWorkersRequest(workers=1), timeout=5, metadata=o), grpc.StatusCode.OK)
    expect("psd: operator DeleteVariable", lambda: s.DeleteVariable(
        pb.DeleteVariableRequest(name="w"), timeout=5, metadata=o), grpc.StatusCode.OK)
    expect("psd: operator Stats", lambda: s.Stats(pb.StatsRequest(), timeout=5, metadata=o),
           grpc.StatusCode.OK)

    # SIGHUP: a new file (T_NEW as worker, the old worker token gone).
    write(os.path.join(d, "tokens"), "worker %s\noperator %s\n" % (T_NEW, T["operator"]))
    p.proc.send_signal(signal.SIGHUP)
    ok = False
    deadline = time.monotonic() + 5
    while not ok and time.monotonic() < deadline:
        ok = outcome(lambda: s.CreateVariable(var("n"), timeout=5, metadata=md(T_NEW)))[0] \
            == grpc.StatusCode.OK
        time.sleep(0.05)
    r.check(ok and p.proc.poll() is None,
            "psd: SIGHUP reloads the token file (a new token works, psd runs on)")
    expect("psd: after the reload the removed token",
           lambda: s.Stats(pb.StatsRequest(), timeout=5, metadata=rd), U)
    write(os.path.join(d, "tokens"), "wrker %s\n" % T_NEW)
    p.proc.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    r.check(p.proc.poll() is None and "tokens not reloaded" in p.log() and
            outcome(lambda: s.CreateVariable(var("n"), timeout=5,
                                             metadata=md(T_NEW)))[0] == grpc.StatusCode.OK,
            "psd: a bad file at SIGHUP is logged and the old tokens stay")

    q = start_psd()
    st = ps_stub(q).Stats(pb.StatsRequest(), timeout=5)
    r.check(not st.tokens_required, "psd: without --tokens Stats says no tokens required")
    q.stop()
    return p


# ---- pscoord -------------------------------------------------------------------

def test_pscoord(d):
    c = start_coord("--tokens", tokens_file(d))
    s = co_stub(c)
    expect("pscoord: GetCluster without a token",
           lambda: s.GetCluster(pb.GetClusterRequest(), timeout=5), U, "requires a token")
    expect("pscoord: reader GetCluster",
           lambda: s.GetCluster(pb.GetClusterRequest(), timeout=5,
                                metadata=md(T["reader"])), grpc.StatusCode.OK)
    expect("pscoord: reader RegisterTask",
           lambda: s.RegisterTask(pb.RegisterRequest(job_id="job", role=pb.WORKER,
                                                     index=-1), timeout=5,
                                  metadata=md(T["reader"])),
           D, "role 'reader'", "/ps.v1.Coordinator/RegisterTask")
    expect("pscoord: RegisterTask without a token",
           lambda: s.RegisterTask(pb.RegisterRequest(job_id="job", role=pb.WORKER,
                                                     index=-1), timeout=5), U)
    # Place: an operator may propose without a task secret.
    s.RegisterTask(pb.RegisterRequest(job_id="job", role=pb.PS, index=-1,
                                      address="127.0.0.1:1"), timeout=5,
                   metadata=md(T["worker"]))
    prop = pb.PlaceRequest(job_id="job", variables=[pb.VariablePlacement(name="w", shape=[4])])
    expect("pscoord: worker token, Place without a task secret",
           lambda: s.Place(prop, timeout=5, metadata=md(T["worker"])), D, "task_secret")
    expect("pscoord: operator Place", lambda: s.Place(prop, timeout=5,
                                                      metadata=md(T["operator"])),
           grpc.StatusCode.OK)
    c.stop()


# ---- a job with tokens -----------------------------------------------------------

def test_job(d, files):
    if not os.path.isdir(FM):
        print("skip job: no %s" % FM)
        return []
    tf = tokens_file(d)
    coord = start_coord("--tokens", tf, "--token-file", files["operator"],
                        "--job-id", "tok")
    psd = start_psd("--tokens", tf, "--token-file", files["worker"], "--coordinator",
                    coord.address, "--job-id", "tok")
    w = subprocess.run([WORKERD, "--coordinator", coord.address, "--job-id", "tok",
                        "--token-file", files["worker"], "--model", "mlp:784-32-10",
                        "--epochs", "0", "--steps", "30", "--no-evaluate",
                        "--progress", "0", "--log-level", "info"],
                       capture_output=True, text=True, timeout=120)
    st = ps_stub(psd).Stats(pb.StatsRequest(), timeout=5, metadata=md(T["reader"]))
    r.check(w.returncode == 0 and st.pushes >= 30,
            "job: workerd --token-file trains against psd and pscoord with tokens "
            "(exit %d, %d pushes)%s" % (w.returncode, st.pushes,
                                        "" if w.returncode == 0 else ": " + w.stderr[-300:]))
    r.check(not any(t in w.stderr + w.stdout for t in ALL_TOKENS),
            "job: workerd's output holds no token")
    # pscoord sets the count from its schedule thread, which may come after
    # a 30-step worker has finished: wait for the line (bounded).
    deadline = time.monotonic() + 10
    log = coord.log()
    while "sync steps wait for 1 worker" not in log and time.monotonic() < deadline:
        time.sleep(0.1)
        log = coord.log()
    r.check("sync steps wait for 1 worker" in log and "UNAUTHENTICATED" not in log
            and "PERMISSION_DENIED" not in log,
            "job: pscoord's operator token sets the psd's sync count (SetSyncWorkers, "
            "an operator's method; no refusal in its log)")
    nw = subprocess.run([WORKERD, "--ps", psd.address, "--model", "mlp:784-32-10",
                         "--epochs", "0", "--steps", "5", "--no-evaluate",
                         "--retry-budget", "0", "--progress", "0"],
                        capture_output=True, text=True, timeout=60)
    r.check(nw.returncode != 0 and "UNAUTHENTICATED" in nw.stderr,
            "job: workerd without a token is refused (exit %d: %s)"
            % (nw.returncode, nw.stderr.strip().splitlines()[-1:]))
    return [coord, psd]


# ---- psctl -------------------------------------------------------------------------

def test_psctl(p, files):
    ok = subprocess.run([PSCTL, "--server", p.address, "--token-file", files["reader"],
                         "stats"], capture_output=True, text=True, timeout=30)
    r.check(ok.returncode == 0 and "variables" in ok.stdout.lower(),
            "psctl: --token-file (reader) stats works (exit %d)" % ok.returncode)
    no = subprocess.run([PSCTL, "--server", p.address, "stats"], capture_output=True,
                        text=True, timeout=30)
    lines = no.stderr.strip().splitlines()
    r.check(no.returncode != 0 and len(lines) == 1 and "UNAUTHENTICATED" in lines[0],
            "psctl: without a token one line and exit %d (%s)" % (no.returncode, lines))
    den = subprocess.run([PSCTL, "--server", p.address, "--token-file", files["worker"],
                          "checkpoint"], capture_output=True, text=True, timeout=30)
    lines = den.stderr.strip().splitlines()
    r.check(den.returncode != 0 and len(lines) == 1 and "PERMISSION_DENIED" in lines[0]
            and "role 'worker'" in lines[0],
            "psctl: a worker's checkpoint is one line PERMISSION_DENIED (%s)" % lines)
    tok = subprocess.run([PSCTL, "token", "reader"], capture_output=True, text=True,
                         timeout=10)
    parts = tok.stdout.split()
    r.check(tok.returncode == 0 and len(parts) == 2 and parts[0] == "reader" and
            len(parts[1]) >= 43, "psctl token: 'reader TOKEN' (%d characters)"
            % (len(parts[1]) if len(parts) == 2 else 0))


# ---- secrecy -------------------------------------------------------------------------

def test_secrecy(procs):
    for p in procs:
        if p.proc.poll() is not None:
            continue
        args = subprocess.run(["ps", "-o", "args=", "-p", str(p.proc.pid)],
                              capture_output=True, text=True).stdout
        name = os.path.basename(p.argv[0])
        r.check(args.strip() != "" and not any(t in args for t in ALL_TOKENS),
                "secrecy: no token in %s's argv" % name)
        log = p.log()
        r.check(not any(t in log for t in ALL_TOKENS),
                "secrecy: no token in %s's log (%d bytes, debug level)" % (name, len(log)))


# ---- token files -----------------------------------------------------------------------

def run_to_exit(argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    return p.returncode, [l for l in p.stderr.splitlines() if l.strip()]


def test_files(d):
    missing = os.path.join(d, "no-such-tokens")
    bad = write(os.path.join(d, "bad"), "# tokens\nworker %s\nwrker %s\n"
                % (T["worker"], T["reader"]))
    short = write(os.path.join(d, "short"), "reader abc\n")
    loose = write(os.path.join(d, "loose"), "worker %s\n" % T["worker"], mode=0o644)
    hashed_loose = write(os.path.join(d, "hashed"), "worker sha256:%s\n"
                         % hashlib.sha256(b"x" * 20).hexdigest(), mode=0o644)
    base = {"psd": [PSD, "--data-dir", pstest.tmpdir(), "--listen", "127.0.0.1:0"],
            "pscoord": [PSCOORD, "--state-dir", pstest.tmpdir(), "--listen", "127.0.0.1:0"]}
    for name, argv in base.items():
        rc, lines = run_to_exit(argv + ["--tokens", missing])
        r.check(rc == 2 and len(lines) == 1 and missing in lines[0],
                "files: %s --tokens of a missing file: exit %d, one line (%s)"
                % (name, rc, lines))
        rc, lines = run_to_exit(argv + ["--tokens", bad])
        r.check(rc == 2 and len(lines) == 1 and bad + ":3:" in lines[0] and
                "wrker" in lines[0] and T["reader"] not in lines[0],
                "files: %s --tokens with a bad role on line 3: exit %d (%s)"
                % (name, rc, lines))
        rc, lines = run_to_exit(argv + ["--tokens", short])
        r.check(rc == 2 and len(lines) == 1 and short + ":1:" in lines[0] and
                "shorter than 16" in lines[0],
                "files: %s --tokens with a short token: exit %d (%s)" % (name, rc, lines))
        rc, lines = run_to_exit(argv + ["--tokens", loose])
        r.check(rc == 2 and len(lines) == 1 and "others may read" in lines[0],
                "files: %s --tokens readable by others: exit %d (%s)" % (name, rc, lines))
        rc, lines = run_to_exit(argv + ["--token-file", missing])
        r.check(rc == 2 and len(lines) == 1 and missing in lines[0],
                "files: %s --token-file of a missing file: exit %d (%s)" % (name, rc, lines))
    p = start_psd("--tokens", hashed_loose)
    r.check(p.proc.poll() is None, "files: hashes only, readable by others: psd serves")
    p.stop()
    # As ssh treats keys: a group that may read clear tokens, or anyone but
    # the owner who may write the file, is refused in one line.
    group_r = write(os.path.join(d, "group-r"), "worker %s\n" % T["worker"], mode=0o640)
    group_w = write(os.path.join(d, "group-w"), "worker %s\n" % T["worker"], mode=0o620)
    hashed_w = write(os.path.join(d, "hashed-w"), "worker sha256:%s\n"
                     % hashlib.sha256(b"x" * 20).hexdigest(), mode=0o664)
    for name, argv in base.items():
        for path, mode, words in [(group_r, "640", "group or others may read"),
                                  (group_w, "620", "group or others may write"),
                                  (hashed_w, "664", "group or others may write")]:
            rc, lines = run_to_exit(argv + ["--tokens", path])
            r.check(rc == 2 and len(lines) == 1 and words in lines[0] and mode in lines[0]
                    and T["worker"] not in lines[0],
                    "files: %s --tokens of mode %s: exit %d, one line (%s)"
                    % (name, mode, rc, lines))
    client_r = write(os.path.join(d, "client-r"), "%s\n" % T["reader"], mode=0o640)
    client_w = write(os.path.join(d, "client-w"), "%s\n" % T["reader"], mode=0o602)
    for path, mode in [(client_r, "640"), (client_w, "602")]:
        for argv in ([PSCTL, "--token-file", path, "stats"],
                     [WORKERD, "--token-file", path, "--steps", "1"]):
            rc, lines = run_to_exit(argv)
            r.check(rc == 2 and len(lines) == 1 and "group or others may read or write"
                    in lines[0] and path in lines[0],
                    "files: %s --token-file of mode %s: exit %d, one line (%s)"
                    % (os.path.basename(argv[0]), mode, rc, lines))
    empty = write(os.path.join(d, "empty"), "# nothing\n\n")
    rc, lines = run_to_exit([PSCTL, "--token-file", empty, "stats"])
    r.check(rc == 2 and len(lines) == 1 and "holds no token" in lines[0],
            "files: psctl --token-file without a token: exit %d (%s)" % (rc, lines))
    rc, lines = run_to_exit([WORKERD, "--token-file", bad + "x", "--steps", "1"])
    r.check(rc == 2 and len(lines) == 1 and bad + "x" in lines[0],
            "files: workerd --token-file of a missing file: exit %d (%s)" % (rc, lines))


# ---- issue 13 h -----------------------------------------------------------------------

def test_fixh(d):
    # SetSyncWorkers: at most the workers the job's SYNC variables are made for.
    p = start_psd()
    s = ps_stub(p)
    # ... and those are bounded by the server: a spec of 65536 workers
    # raised the cap for any caller that may create a variable.
    expect("fixh: a SYNC variable for 65536 workers",
           lambda: s.CreateVariable(var("big", consistency=pb.SYNC, num_workers=65536),
                                    timeout=5),
           grpc.StatusCode.INVALID_ARGUMENT, "--max-sync-workers", "1024", "65536")
    expect("fixh: ... so SetSyncWorkers(65536) stays refused",
           lambda: s.SetSyncWorkers(pb.SetSyncWorkersRequest(workers=65536), timeout=5),
           grpc.StatusCode.INVALID_ARGUMENT)
    s.CreateVariable(var("sv", consistency=pb.SYNC, num_workers=2), timeout=5)
    expect("fixh: SetSyncWorkers(65536) for a job of 2 workers",
           lambda: s.SetSyncWorkers(pb.SetSyncWorkersRequest(workers=65536), timeout=5),
           grpc.StatusCode.INVALID_ARGUMENT, "at most 2")
    expect("fixh: SetSyncWorkers(3) for a job of 2 workers",
           lambda: s.SetSyncWorkers(pb.SetSyncWorkersRequest(workers=3), timeout=5),
           grpc.StatusCode.INVALID_ARGUMENT)
    prev = s.SetSyncWorkers(pb.SetSyncWorkersRequest(workers=1), timeout=5).previous
    r.check(prev == 2, "fixh: the refused counts changed nothing (previous %d, 2)" % prev)
    expect("fixh: SetSyncWorkers(2), the job's own count",
           lambda: s.SetSyncWorkers(pb.SetSyncWorkersRequest(workers=2), timeout=5),
           grpc.StatusCode.OK)
    p.stop()

    # Place: only a registered worker (or chief, evaluator) with its secret.
    c = start_coord("--job-id", "h")
    cs = co_stub(c)
    cs.RegisterTask(pb.RegisterRequest(job_id="h", role=pb.PS, index=-1,
                                       address="127.0.0.1:1"), timeout=5)
    psr = cs.RegisterTask(pb.RegisterRequest(job_id="h", role=pb.PS, index=-1,
                                             address="127.0.0.1:2"), timeout=5)
    prop = [pb.VariablePlacement(name="w", shape=[8, 4]), pb.VariablePlacement(
        name="b", shape=[4])]
    expect("fixh: Place without a task secret",
           lambda: cs.Place(pb.PlaceRequest(job_id="h", variables=prop), timeout=5),
           D, "no task_secret")
    expect("fixh: Place with a made-up task secret",
           lambda: cs.Place(pb.PlaceRequest(job_id="h", variables=prop,
                                            task_secret="0" * 32), timeout=5), D)
    expect("fixh: Place with a ps's task secret",
           lambda: cs.Place(pb.PlaceRequest(job_id="h", variables=prop,
                                            task_secret=psr.task_secret), timeout=5), D)
    r.check(len(cs.GetCluster(pb.GetClusterRequest(), timeout=5).placement) == 0,
            "fixh: the refused proposals placed nothing")
    wk = cs.RegisterTask(pb.RegisterRequest(job_id="h", role=pb.WORKER, index=-1), timeout=5)
    got = cs.Place(pb.PlaceRequest(job_id="h", variables=prop,
                                   task_secret=wk.task_secret), timeout=5)
    r.check(len(got.placement) == 2, "fixh: a registered worker with its secret places")

    # ReportMetrics: a registered evaluator, finite but impossible numbers.
    ev = cs.RegisterTask(pb.RegisterRequest(job_id="h", role=pb.EVALUATOR, index=-1),
                         timeout=5)

    def report(acc, loss, secret=ev.task_secret, index=ev.index):
        return lambda: cs.ReportMetrics(pb.ReportMetricsRequest(
            job_id="h", role=pb.EVALUATOR, index=index, step=1, loss=loss,
            accuracy=acc, task_secret=secret), timeout=5)

    expect("fixh: ReportMetrics accuracy 1e300", report(1e300, 0.5),
           grpc.StatusCode.INVALID_ARGUMENT, "accuracy", "[0, 1]")
    expect("fixh: ReportMetrics accuracy -0.5", report(-0.5, 0.5),
           grpc.StatusCode.INVALID_ARGUMENT, "accuracy")
    expect("fixh: ReportMetrics loss 1e300", report(0.5, 1e300),
           grpc.StatusCode.INVALID_ARGUMENT, "loss")
    expect("fixh: ReportMetrics NaN accuracy", report(float("nan"), 0.5),
           grpc.StatusCode.INVALID_ARGUMENT)
    expect("fixh: ReportMetrics from an unregistered evaluator",
           report(0.5, 0.5, secret="", index=7), D, "has not registered")
    st = cs.GetCluster(pb.GetClusterRequest(), timeout=5)
    r.check(st.eval_accuracy == 0 and st.eval_step == 0,
            "fixh: the refused reports changed nothing (accuracy %g)" % st.eval_accuracy)
    expect("fixh: ReportMetrics accuracy 0.75", report(0.75, 0.5), grpc.StatusCode.OK)
    c.stop()

    # RegisterTask with tokens on: a worker's token.
    c = start_coord("--tokens", tokens_file(d), "--job-id", "h")
    cs = co_stub(c)
    expect("fixh: RegisterTask without a token, tokens on",
           lambda: cs.RegisterTask(pb.RegisterRequest(job_id="h", role=pb.WORKER,
                                                      index=-1), timeout=5), U)
    expect("fixh: RegisterTask with a worker token",
           lambda: cs.RegisterTask(pb.RegisterRequest(job_id="h", role=pb.WORKER, index=-1),
                                   timeout=5, metadata=md(T["worker"])), grpc.StatusCode.OK)
    c.stop()


def main():
    global pb, pbg, hpb, hpbg
    pb, pbg, hpb, hpbg = pstest.generate_stubs()
    parts = set(sys.argv[1:]) or {"psd", "pscoord", "job", "psctl", "secrecy", "files",
                                  "fixh"}
    d = pstest.tmpdir("auth-")
    files = token_files(d)
    try:
        p = None
        procs = []
        if parts & {"psd", "psctl", "secrecy"}:
            p = test_psd(d)
            procs.append(p)
        if "pscoord" in parts:
            test_pscoord(pstest.tmpdir("auth-c-"))
        if "job" in parts or "secrecy" in parts:
            procs += test_job(pstest.tmpdir("auth-j-"), files)
        if "psctl" in parts:
            # The psd of test_psd holds T_NEW and the operator now: a fresh one.
            q = start_psd("--tokens", tokens_file(pstest.tmpdir("auth-t-")))
            test_psctl(q, files)
            procs.append(q)
        if "secrecy" in parts:
            test_secrecy(procs)
        if "files" in parts:
            test_files(pstest.tmpdir("auth-f-"))
        if "fixh" in parts:
            test_fixh(pstest.tmpdir("auth-h-"))
    finally:
        pstest.stop_all(LIVE, kill=True)
    r.finish()


if __name__ == "__main__":
    main()
