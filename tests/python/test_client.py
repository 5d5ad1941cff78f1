"""psclient, the Python package, against real psd and pscoord on 127.0.0.1:0
with temporary directories:

  place     the placement the package computes equals pscoord's (the C rule
            of common/place.c) for the same model and threshold, and a
            Client given the coordinator creates the parts where it says;
  values    pull and push with return values over two shards with a split
            variable: the numbers numpy computes for SGD, the versions; a
            split Glorot variable drawn from the whole variable's range;
  badinput  a gradient of the wrong dtype or shape, or an unknown name, is
            refused before it is sent (psd's push count unchanged) naming
            the variable; psd's refusals come back as PsError with the gRPC
            code and psd's message;
  sync      two workers in lock-step: each step's values are the average
            update; a worker that is behind rejoins at the variables' step;
  restart   a push while psd is killed and restarted on the same port and
            data directory succeeds after retries; a budget that runs out
            raises UNAVAILABLE naming the attempts;
  shm       over psd's unix socket with shm=True, tensors go through shared
            memory (psd's shm_bytes) with the same numbers as inline;
  tls       over mutual TLS (CA, server and client certificates made with
            openssl); a plaintext client and one without a certificate
            cannot connect;
  tokens    a worker token works, no token is UNAUTHENTICATED, a reader's
            push PERMISSION_DENIED and changes nothing. tls and tokens skip
            with one line each where psd lacks --tls-cert or --tokens.

Prints ok/FAIL per check and "python-client: N passed, N failed".
"""
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pyenv  # noqa: E402

pyenv.reexec()

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import pstest  # noqa: E402
import psclient  # noqa: E402
from psclient import (Client, Initializer, Optimizer, PsError, Retry, TLS,  # noqa: E402
                      Variable, place)

PSCOORD = os.path.join(pstest.BUILD_ROOT, "coordinator", "pscoord")
r = pstest.Results("python-client")

MODEL = [("emb", (100, 8)), ("w", (8, 16)), ("b", (16,)), ("c", (4,)),
         ("odd", (7, 40)), ("big1", (1, 300)), ("s", ())]


def psd(*args, port=0, data=None):
    data = data or pstest.tmpdir()
    d = pstest.Daemon([pstest.psd_path(), "--data-dir", data, "--listen",
                       "127.0.0.1:%d" % port, "--log-level", "warn"] + list(args))
    d.data = data
    return d


def test_place():
    state = pstest.tmpdir("pyc-coord-")
    coord = pstest.Daemon([PSCOORD, "--state-dir", state, "--listen", "127.0.0.1:0",
                           "--job-id", "py", "--split-threshold", "1K",
                           "--log-level", "warn"])
    shards = [psd("--coordinator", coord.address, "--job-id", "py", "--task-index", str(i))
              for i in range(2)]
    c = Client(coordinator=coord.address, register="worker", wait_for_shards=20)
    r.check(sorted(c.addresses) == sorted(s.address for s in shards) and c.job_id == "py"
            and c.worker == 0,
            "place: the client registers as worker 0 and learns both shards and the job "
            "from pscoord (%s)" % c.addresses)
    c.progress(41, 0.5)
    deadline = time.monotonic() + 10
    seen = None
    while time.monotonic() < deadline:
        seen = [t for t in c.cluster().tasks if t.role == 2 and t.index == 0]
        if seen and seen[0].step == 41 and seen[0].alive:
            break
        time.sleep(0.2)
    r.check(bool(seen) and seen[0].step == 41 and abs(seen[0].loss - 0.5) < 1e-9,
            "place: its heartbeats carry the step and loss it reports (%s)"
            % (seen[0].step if seen else None))
    got = c.create_variables([Variable(n, s, Initializer.constant(1.0)) for n, s in MODEL])
    mine = {p.name: p for p in place(MODEL, 2, 1024)}
    r.check(all(got[n].parts == mine[n].parts for n, _ in MODEL),
            "place: the package's placement equals pscoord's for 7 variables "
            "(emb %s, odd %s)" % ([(p.name, p.shard, p.row_begin, p.row_end)
                                   for p in got["emb"].parts],
                                  [(p.shard, p.row_begin, p.row_end) for p in got["odd"].parts]))
    on = {}
    for i, s in enumerate(shards):
        st = pstest.channel(s.address)
        from psclient._proto import pb
        resp = st.unary_unary("/ps.v1.ParameterServer/ListVariables",
                              request_serializer=pb.ListVariablesRequest.SerializeToString,
                              response_deserializer=pb.ListVariablesResponse.FromString)(
            pb.ListVariablesRequest(), timeout=10)
        for v in resp.variables:
            on[v.spec.name] = (i, list(v.spec.shape))
        st.close()
    want = {p.name: (p.shard, [p.row_end - p.row_begin] + list(got[n].shape[1:])
                     if got[n].shape else [])
            for n, _ in MODEL for p in got[n].parts}
    r.check(on == want, "place: each part lives on its shard with its rows (%d parts)"
            % len(on))
    # Reverse order, three shards, other thresholds: the rule's invariants.
    rev = {p.name: p for p in place(list(reversed(MODEL)), 2, 1024)}
    r.check(all(rev[n].parts == mine[n].parts for n, _ in MODEL),
            "place: the proposal's order does not change the placement")
    three = {p.name: p for p in place(MODEL, 3, 1024)}
    r.check([(p.row_begin, p.row_end) for p in three["odd"].parts] == [(0, 3), (3, 5), (5, 7)]
            and len(three["big1"].parts) == 1,
            "place: 7 rows over 3 shards split 3+2+2; one row is never split")
    v = c.pull(["emb", "s"])
    r.check(np.all(v["emb"] == 1) and v["emb"].shape == (100, 8) and v["s"].shape == (),
            "place: a pull through the coordinator's placement gives whole values")
    reader = Client(coordinator=coord.address)
    reader.attach([Variable(n, s) for n, s in MODEL[:3]])
    r.check(reader.variables["emb"].parts == got["emb"].parts,
            "place: a second client takes the job's placement for part of the model")
    rv = reader.pull(["emb", "w"])
    r.check(np.all(rv["emb"] == 1) and rv["w"].shape == (8, 16) and
            sum(st.variables for st in reader.stats()) == len(on),
            "place: a reader that attaches (creates nothing) pulls through the same placement")
    reader.close()
    c.close()
    for s in shards:
        s.stop()
    coord.stop()


def test_values():
    shards = [psd() for _ in range(2)]
    c = Client([s.address for s in shards], split_threshold=1024, worker=3)
    w0 = np.arange(100 * 8, dtype=np.float32).reshape(100, 8) / 100
    c.create_variables([Variable("emb", (100, 8), Initializer.constant(2.0)),
                        Variable("b", (8,), Initializer.constant(-1.0),
                                 optimizer=Optimizer.sgd(1.0))],
                       optimizer=Optimizer.sgd(0.5))
    v = c.pull()
    r.check(np.all(v["emb"] == 2) and np.all(v["b"] == -1) and v.versions == {"emb": 0, "b": 0},
            "values: a fresh pull is the initializers' values at version 0")
    res = c.push({"emb": w0, "b": np.ones(8, np.float32)}, return_values=True)
    want = np.float32(2) - np.float32(0.5) * w0
    r.check(np.array_equal(res.values["emb"], want) and
            np.array_equal(res.values["b"], np.full(8, -2, np.float32)) and
            res.versions == {"emb": 1, "b": 1} and res.step == 0,
            "values: push with return values gives SGD's numbers (per-variable lr), "
            "version 1, over both parts of a split variable")
    res2 = c.push({"b": np.ones(8, np.float32)})
    r.check(res2.values is None and res2.versions == {"b": 2} and res2.step == 1 and
            np.array_equal(c.pull(["b"])["b"], np.full(8, -3, np.float32)),
            "values: a push without return values; the async step counts up")
    r.check(c.health() == ["SERVING", "SERVING"], "values: both shards answer the "
            "health check SERVING (%s)" % c.health())
    st = c.stats()
    r.check(st[0].pushes == 2 and st[1].pushes == 1,
            "values: one Push per shard per push (%s)" % [s.pushes for s in st])
    # A split Glorot variable: each part drawn from the whole one's range.
    g = c.create_variables([Variable("g", (400, 100), Initializer.glorot_uniform(seed=9))])
    limit = np.sqrt(6.0 / 500.0)
    gv = c.pull(["g"])["g"]
    top = [float(np.abs(gv[p.row_begin:p.row_end]).max()) for p in g["g"].parts]
    r.check(len(g["g"].parts) == 2 and all(0.98 * limit < t <= limit * 1.0001 for t in top)
            and abs(float(gv.std()) - limit / np.sqrt(3)) < 0.01 * limit,
            "values: a split Glorot variable's parts span the whole variable's limit "
            "%.4f (max |w| per part %s)" % (limit, ["%.4f" % t for t in top]))
    c.close()
    for s in shards:
        s.stop()


def expect(what, fn, exc, *words):
    try:
        fn()
        r.check(False, "%s is refused" % what)
    except exc as e:
        r.check(all(w in str(e) for w in words), "%s: %s" % (what, e))


def test_badinput():
    s = psd()
    c = Client([s.address])
    c.create_variables([Variable("w", (3, 4))])
    expect("badinput: a float64 gradient", lambda: c.push({"w": np.zeros((3, 4))}),
           TypeError, "variable 'w'", "float64")
    expect("badinput: a gradient of shape [4, 3]",
           lambda: c.push({"w": np.zeros((4, 3), np.float32)}), ValueError,
           "variable 'w'", "[4, 3]", "[3, 4]")
    expect("badinput: an unknown variable", lambda: c.push({"x": np.zeros(1, np.float32)}),
           KeyError, "'x'")
    r.check(c.stats()[0].pushes == 0, "badinput: nothing reached psd")
    other = Client([s.address])
    try:
        other.create_variables([Variable("w", (3, 5))])
        r.check(False, "badinput: another shape under a taken name is refused")
    except PsError as e:
        r.check(e.code == grpc.StatusCode.ALREADY_EXISTS and "'w'" in e.details and
                e.address == s.address and e.method == "CreateVariable",
                "badinput: a taken name with another shape is PsError ALREADY_EXISTS with "
                "psd's message (%s)" % e)
    try:
        c.pull(["w"], min_version=5, timeout=0.5)
        r.check(False, "badinput: a pull waiting past its deadline fails")
    except PsError as e:
        r.check(e.code == grpc.StatusCode.DEADLINE_EXCEEDED,
                "badinput: a pull for a version not reached is DEADLINE_EXCEEDED (%s)" % e)
    expect("badinput: a learning rate of 0", lambda: Optimizer.sgd(0.0), ValueError,
           "learning_rate")
    expect("badinput: addresses and a coordinator",
           lambda: Client(["a:1"], coordinator="b:2"), ValueError, "not both")
    c.close()
    other.close()
    s.stop()


def test_sync():
    s = psd()
    lr = np.float32(0.5)
    cs = [Client([s.address], worker=i) for i in range(2)]
    for c in cs:
        c.create_variables([Variable("w", (1000,), Initializer.constant(1.0))],
                           optimizer=Optimizer.sgd(float(lr)), consistency="sync",
                           num_workers=2)
    rng = np.random.default_rng(3)
    grads = rng.standard_normal((3, 2, 1000)).astype(np.float32)
    out = [[None] * 3 for _ in range(2)]

    def run(i):
        for k in range(3):
            out[i][k] = cs[i].push({"w": grads[k, i]}, return_values=True)
    errors = pstest.in_threads(run, 2, 60)
    w = np.ones(1000, np.float32)
    ok = not errors
    for k in range(3):
        w = w - lr * ((grads[k, 0] + grads[k, 1]) / np.float32(2))
        for i in range(2):
            res = out[i][k]
            ok = ok and res is not None and res.versions["w"] == k + 1 and \
                np.allclose(res.values["w"], w, atol=1e-6)
    r.check(ok, "sync: 3 lock-step steps of 2 workers: each push returns the averaged "
            "update at version k+1 (%s)" % (errors or "no errors"))
    late = Client([s.address], worker=1)
    late.create_variables([Variable("w", (1000,), Initializer.constant(1.0))],
                          optimizer=Optimizer.sgd(float(lr)), consistency="sync",
                          num_workers=2)
    # Behind at step 0: refused as stale, it rejoins at step 3 and sends
    # the gradient again at it, which worker 0's push of step 3 completes.
    got = {}

    def late_push():
        try:
            got["late"] = late.push({"w": grads[0, 0]})
        except Exception as e:  # noqa: BLE001 - reported as a check below
            got["error"] = e
    t = threading.Thread(target=late_push)
    t.start()
    time.sleep(0.3)
    on_time = cs[0].push({"w": grads[1, 0]}, return_values=True)
    t.join(30)
    res = got.get("late")
    w = w - lr * ((grads[1, 0] + grads[0, 0]) / np.float32(2))
    r.check(res is not None and res.stale and res.versions["w"] == 4 and
            np.allclose(res.values["w"], w, atol=1e-6) and
            np.allclose(on_time.values["w"], w, atol=1e-6) and
            late.shards[0].sync_step == 4,
            "sync: a worker that is behind is refused as stale, rejoins at step 3 "
            "and its gradient counts in step 3 with worker 0's (%s)"
            % got.get("error", "no error"))
    for c in cs + [late]:
        c.close()
    s.stop()


def test_restart():
    port = pstest.free_port()
    s = psd("--durable", port=port)
    c = Client([s.address], retry=Retry(initial=0.05, maximum=0.5, budget=30))
    c.create_variables([Variable("w", (4,), Initializer.constant(1.0))],
                       optimizer=Optimizer.sgd(1.0))
    c.push({"w": np.ones(4, np.float32)})
    s.stop(signal.SIGKILL)
    box = {}

    def restart():
        time.sleep(1.5)
        box["d"] = psd("--durable", port=port, data=s.data)
        box["up"] = time.monotonic()
    t = threading.Thread(target=restart)
    t.start()
    t0 = time.monotonic()
    try:
        res = c.push({"w": np.ones(4, np.float32)}, return_values=True)
        took = time.monotonic() - t0
        r.check(np.array_equal(res.values["w"], np.full(4, -1, np.float32)) and
                res.versions["w"] == 2 and took >= 1.0,
                "restart: a push while psd is down succeeds once it is back (%.1f s, psd "
                "up at %.1f s), "
                "and the acknowledged push before the kill was kept (%s, version %d)"
                % (took, box["up"] - t0, res.values["w"], res.versions["w"]))
    except PsError as e:
        r.check(False, "restart: the push across a restart: %s" % e)
    t.join()
    box["d"].stop()
    short = Client([box["d"].address], retry=Retry(initial=0.05, maximum=0.2, budget=1))
    short.attach([Variable("w", (4,))])
    t0 = time.monotonic()
    try:
        short.pull(["w"])
        r.check(False, "restart: a pull with nothing listening fails after the budget")
    except PsError as e:
        took = time.monotonic() - t0
        r.check(e.code == grpc.StatusCode.UNAVAILABLE and e.attempts > 2 and
                "gave up after" in e.details and took < 5,
                "restart: past the 1 s budget the client raises UNAVAILABLE after %d "
                "attempts in %.1f s" % (e.attempts, took))
    c.close()
    short.close()


def test_shm():
    sock = os.path.join(pstest.tmpdir("pyc-sock-"), "psd.sock")
    s = psd("--local-socket", sock)
    n = 300 * 1000
    g = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    res = {}
    for mode, addr, shm in (("inline", s.address, False), ("shm", "unix:" + sock, True)):
        c = Client([addr], shm=shm)
        c.create_variables([Variable(mode, (n,), Initializer.constant(1.0))],
                           optimizer=Optimizer.sgd(0.25))
        before = c.stats()[0].shm_bytes
        p = c.push({mode: g}, return_values=True)
        v = c.pull([mode])
        res[mode] = (p.values[mode], v[mode], c.stats()[0].shm_bytes - before)
        c.close()
    want = np.float32(1) - np.float32(0.25) * g
    r.check(np.array_equal(res["shm"][0], want) and np.array_equal(res["shm"][1], want) and
            np.array_equal(res["inline"][0], want),
            "shm: push and pull through shared memory give the bytes the inline path does")
    r.check(res["shm"][2] >= 3 * 4 * n and res["inline"][2] == 0,
            "shm: over the unix socket the tensors went through shared memory (%d bytes), "
            "over TCP none did" % res["shm"][2])
    s.stop()


def psd_has(flag):
    out = subprocess.run([pstest.psd_path(), "--help"], capture_output=True, text=True).stdout
    return flag in out


def make_certs(d):
    """A CA, a server certificate for localhost/127.0.0.1 and a client
    certificate, with the openssl command."""
    def ossl(*a):
        subprocess.run(["openssl"] + list(a), check=True, capture_output=True, cwd=d)
    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
         "ca.pem", "-days", "2", "-subj", "/CN=psclient test CA")
    with open(os.path.join(d, "ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for who in ("server", "client"):
        ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", who + ".key", "-out",
             who + ".csr", "-subj", "/CN=localhost")
        ossl("x509", "-req", "-in", who + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", who + ".pem", "-days", "2", "-extfile", "ext")
    return {k: os.path.join(d, k) for k in ("ca.pem", "server.pem", "server.key",
                                            "client.pem", "client.key")}


def refused_with(what, fn, code, *words):
    try:
        fn()
        r.check(False, "%s is refused" % what)
    except PsError as e:
        r.check(e.code == code and all(w in e.details for w in words),
                "%s is %s (%s)" % (what, code.name, e.details[:120]))


def test_tls():
    if not psd_has("--tls-cert"):
        print("skip: tls: psd has no --tls-cert (issue 13)", flush=True)
        return
    certs = make_certs(pstest.tmpdir("pyc-tls-"))
    s = psd("--tls-cert", certs["server.pem"], "--tls-key", certs["server.key"],
            "--tls-ca", certs["ca.pem"])
    c = Client([s.address], tls=TLS(ca_file=certs["ca.pem"], cert_file=certs["client.pem"],
                                    key_file=certs["client.key"]))
    c.create_variables([Variable("t", (4,), Initializer.constant(3.0))])
    r.check(np.all(c.pull()["t"] == 3),
            "tls: the client creates and pulls over mutual TLS")
    for what, tls in (("a plaintext client", None),
                      ("a TLS client without a certificate", TLS(ca_file=certs["ca.pem"]))):
        other = Client([s.address], tls=tls, retry=Retry(budget=0))
        other.attach([Variable("t", (4,))])
        try:
            other.pull(timeout=5)
            r.check(False, "tls: %s is refused" % what)
        except PsError as e:
            r.check(e.code == grpc.StatusCode.UNAVAILABLE,
                    "tls: %s cannot connect (%s)" % (what, e.code.name))
        other.close()
    c.close()
    s.stop()


def test_tokens():
    if not psd_has("--tokens"):
        print("skip: tokens: psd has no --tokens (issue 13)", flush=True)
        return
    d = pstest.tmpdir("pyc-tok-")
    toks = {"worker": os.urandom(16).hex(), "reader": os.urandom(16).hex()}
    path = os.path.join(d, "tokens")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, "".join("%s %s\n" % kv for kv in toks.items()).encode())
    os.close(fd)
    files = {}
    for role, tok in toks.items():
        files[role] = os.path.join(d, role + ".token")
        with open(files[role], "w") as f:
            f.write(tok + "\n")
    s = psd("--tokens", path)
    w = Client([s.address], token_file=files["worker"])
    w.create_variables([Variable("k", (4,), Initializer.constant(1.0))],
                       optimizer=Optimizer.sgd(1.0))
    res = w.push({"k": np.ones(4, np.float32)}, return_values=True)
    r.check(np.all(res.values["k"] == 0),
            "tokens: a worker token creates, pushes and gets the values back")
    anon = Client([s.address], retry=Retry(budget=0))
    anon.attach([Variable("k", (4,))])
    refused_with("tokens: a pull without a token", lambda: anon.pull(),
                 grpc.StatusCode.UNAUTHENTICATED)
    reader = Client([s.address], token_file=files["reader"])
    reader.attach([Variable("k", (4,))])
    refused_with("tokens: a push with a reader token",
                 lambda: reader.push({"k": np.ones(4, np.float32)}),
                 grpc.StatusCode.PERMISSION_DENIED, "reader")
    r.check(np.all(w.pull()["k"] == 0), "tokens: the refused push changed nothing")
    for c in (w, anon, reader):
        c.close()
    s.stop()


def main():
    print("psclient %s from %s" % (psclient.__version__, os.path.dirname(psclient.__file__)),
          flush=True)
    r.run((test_place, test_values, test_badinput, test_sync, test_restart, test_shm,
           test_tls, test_tokens))
    r.finish()


if __name__ == "__main__":
    main()
