"""Transport security against real daemons on 127.0.0.1:0: certificates
made with tools/pscerts (checked with `openssl verify`), psd with mutual
TLS pushed to and pulled from by Python's grpcio, refused clients (another
CA, no client certificate, plaintext), workerd and psctl over TLS, a
certificate reload on SIGHUP (a new CA; a bad file keeps the old one), the
loopback rule and --insecure, pscoord with TLS, a psd and a workerd
against it, and one-way TLS (a server certificate without a CA) from
grpcio, psctl and workerd.

Prints ok/FAIL per check and "tls: N passed, N failed".
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import pstest  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402

PSCERTS = os.path.join(pstest.BUILD_ROOT, "tools", "pscerts")
PSCTL = os.path.join(pstest.BUILD_ROOT, "tools", "psctl")
WORKERD = os.path.join(pstest.BUILD_ROOT, "worker", "workerd")
PSCOORD = os.path.join(pstest.BUILD_ROOT, "coordinator", "pscoord")
LOCAL = "localhost,127.0.0.1"


def pscerts(out, *names):
    return subprocess.run([PSCERTS, "--out", out, *names], capture_output=True,
                          text=True, timeout=60)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def tls_channel(address, ca, cert=None, key=None):
    creds = grpc.ssl_channel_credentials(read(ca), read(key) if key else None,
                                         read(cert) if cert else None)
    return grpc.secure_channel(address, creds, options=pstest.CHANNEL_OPTIONS)


def stats(pb, pbg, ch):
    return pbg.ParameterServerStub(ch).Stats(pb.StatsRequest(), timeout=5)


def refused(pb, pbg, ch):
    """The gRPC code a Stats call on ch ends with (OK when it works)."""
    try:
        stats(pb, pbg, ch)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()
    finally:
        ch.close()


def tls_flags(d, name, ca="ca.pem"):
    return ["--tls-cert", os.path.join(d, name + ".pem"),
            "--tls-key", os.path.join(d, name + ".key"),
            "--tls-ca", os.path.join(d, ca)]


class Logged(pstest.Daemon):
    """A daemon whose stderr goes to a file the test reads."""

    def __init__(self, argv):
        self.log_path = os.path.join(pstest.tmpdir("tls-log-"), "stderr")
        self.log = open(self.log_path, "w")
        super().__init__(argv, stderr=self.log)

    def stderr(self):
        with open(self.log_path) as f:
            return f.read()


def check_certs(r):
    a = pstest.tmpdir("tls-certs-")
    p = pscerts(a, "psd=" + LOCAL, "client", "pscoord=" + LOCAL, "worker0")
    r.check(p.returncode == 0, "pscerts makes a CA and four certificates (%s)"
            % (p.stderr.strip() or "exit 0"))
    v = subprocess.run(["openssl", "verify", "-CAfile", os.path.join(a, "ca.pem")] +
                       [os.path.join(a, n + ".pem") for n in ("psd", "client", "pscoord")],
                       capture_output=True, text=True, timeout=30)
    r.check(v.returncode == 0 and v.stdout.count(": OK") == 3,
            "openssl verify: each certificate chains to the CA (%s)" % v.stdout.strip())
    x = subprocess.run(["openssl", "x509", "-in", os.path.join(a, "psd.pem"), "-noout",
                        "-ext", "subjectAltName,extendedKeyUsage"],
                       capture_output=True, text=True, timeout=30).stdout
    r.check("DNS:psd" in x and "DNS:localhost" in x and "IP Address:127.0.0.1" in x and
            "Server Authentication" in x and "Client Authentication" in x,
            "psd's certificate names psd, localhost, 127.0.0.1, serves and calls")
    mode = os.stat(os.path.join(a, "psd.key")).st_mode & 0o777
    r.check(mode == 0o600, "private keys are mode 0600 (%o)" % mode)
    ca_before = read(os.path.join(a, "ca.pem"))
    p = pscerts(a, "ps1")
    r.check(p.returncode == 0 and read(os.path.join(a, "ca.pem")) == ca_before,
            "a second run reuses the CA for a new task")
    t = pstest.tmpdir("tls-tokens-")
    p = pscerts(t, "--tokens", "x")
    tok = os.path.join(t, "tokens")
    lines = read(os.path.join(tok, "server")).decode().split("\n")
    roles = [l.split()[0] for l in lines if l.strip()]
    modes = {f: os.stat(os.path.join(tok, f)).st_mode & 0o777 for f in os.listdir(tok)}
    r.check(p.returncode == 0 and roles == ["reader", "worker", "operator"] and
            all(read(os.path.join(tok, x)).decode().strip() in lines for x in roles) and
            set(modes.values()) == {0o600},
            "pscerts --tokens: a token per role and the servers' table, mode 0600 (%s)"
            % modes)
    before = read(os.path.join(tok, "server"))
    pscerts(t, "--tokens", "y")
    r.check(read(os.path.join(tok, "server")) == before,
            "pscerts --tokens keeps the tokens already made")
    p = pscerts(a, "../evil")
    r.check(p.returncode == 2 and "not a task name" in p.stderr,
            "a name with a slash is refused, exit 2 (%s)" % p.stderr.strip())
    b = pstest.tmpdir("tls-other-")
    pscerts(b, "client", "psd=" + LOCAL)
    v = subprocess.run(["openssl", "verify", "-CAfile", os.path.join(a, "ca.pem"),
                        os.path.join(b, "client.pem")], capture_output=True, text=True,
                       timeout=30)
    r.check(v.returncode != 0, "openssl: the other CA's client does not chain to the first")
    return a, b


def check_mtls(r, pb, pbg, a, b):
    """psd with mutual TLS; returns it (still running) and its live cert dir."""
    live = pstest.tmpdir("tls-live-")
    for n in ("psd.pem", "psd.key", "ca.pem"):
        shutil.copy(os.path.join(a, n), os.path.join(live, n))
    d = Logged([pstest.psd_path(), "--data-dir", pstest.tmpdir(), "--listen", "127.0.0.1:0",
                "--metrics-listen", "off", "--log-level", "info"] + tls_flags(live, "psd"))
    ch = tls_channel(d.address, os.path.join(a, "ca.pem"), os.path.join(a, "client.pem"),
                     os.path.join(a, "client.key"))
    stub = pbg.ParameterServerStub(ch)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "w", (4,), lr=0.5)),
                        timeout=10)
    g = np.array([1, 2, 3, 4], dtype=np.float32)
    stub.Push(pb.PushRequest(worker=0, step=1, grads=[pstest.grad(pb, "w", g)]), timeout=10)
    got = pstest.value(stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]),
                                 timeout=10).values[0])
    r.check(np.array_equal(got, -0.5 * g), "grpcio with a client certificate pushes and "
            "pulls over mutual TLS: %s" % got)
    st = stats(pb, pbg, ch)
    r.check(st.transport_security == "mtls" and not st.insecure,
            "Stats: transport_security=%r, insecure=%s" % (st.transport_security, st.insecure))
    ch.close()
    code = refused(pb, pbg, tls_channel(d.address, os.path.join(a, "ca.pem"),
                                        os.path.join(b, "client.pem"),
                                        os.path.join(b, "client.key")))
    r.check(code == grpc.StatusCode.UNAVAILABLE,
            "a client whose certificate comes from another CA cannot connect (%s)" % code)
    code = refused(pb, pbg, tls_channel(d.address, os.path.join(a, "ca.pem")))
    r.check(code == grpc.StatusCode.UNAVAILABLE,
            "a TLS client without a certificate cannot connect (%s)" % code)
    code = refused(pb, pbg, pstest.channel(d.address))
    r.check(code == grpc.StatusCode.UNAVAILABLE, "a plaintext client cannot connect (%s)"
            % code)
    code = refused(pb, pbg, tls_channel(d.address, os.path.join(b, "ca.pem"),
                                        os.path.join(a, "client.pem"),
                                        os.path.join(a, "client.key")))
    r.check(code == grpc.StatusCode.UNAVAILABLE,
            "a client that trusts another CA does not accept psd (%s)" % code)
    return d, live


def check_tools(r, pb, pbg, d, a):
    flags = ["--tls-ca", os.path.join(a, "ca.pem"), "--tls-cert",
             os.path.join(a, "client.pem"), "--tls-key", os.path.join(a, "client.key")]
    p = subprocess.run([PSCTL, "--server", d.address] + flags + ["stats"],
                       capture_output=True, text=True, timeout=30)
    r.check(p.returncode == 0 and re.search(r"transport\s+mtls", p.stdout),
            "psctl stats over mutual TLS shows the transport (%s)"
            % (p.stderr.strip() or "exit 0"))
    p = subprocess.run([PSCTL, "--server", d.address, "stats"], capture_output=True,
                       text=True, timeout=30)
    r.check(p.returncode == 1 and "cannot reach psd" in p.stderr,
            "psctl in plaintext cannot reach it: %s" % p.stderr.strip())
    ch = tls_channel(d.address, os.path.join(a, "ca.pem"), os.path.join(a, "client.pem"),
                     os.path.join(a, "client.key"))
    before = stats(pb, pbg, ch).pushes
    p = subprocess.run([WORKERD, "--ps", d.address, "--steps", "30", "--epochs", "0",
                        "--limit", "4000", "--evaluate=false", "--shm", "off",
                        "--model", "softmax"] + flags,
                       capture_output=True, text=True, timeout=240)
    after = stats(pb, pbg, ch).pushes
    ch.close()
    r.check(p.returncode == 0 and after - before >= 30,
            "workerd trains over mutual TLS: %d pushes (%s)"
            % (after - before, p.stderr.strip()[-200:] or "exit 0"))
    p = subprocess.run([WORKERD, "--ps", d.address, "--steps", "1", "--epochs", "0",
                        "--limit", "100", "--evaluate=false", "--retry-budget", "2s",
                        "--model", "softmax", "--rpc-timeout", "2s"],
                       capture_output=True, text=True, timeout=120)
    r.check(p.returncode != 0, "workerd in plaintext fails (exit %d)" % p.returncode)
    p = subprocess.run([PSCTL, "--server", d.address, "--tls-ca", "/nonexistent/ca.pem",
                        "stats"], capture_output=True, text=True, timeout=30)
    err = p.stderr.strip().splitlines()
    r.check(p.returncode == 2 and len(err) == 1 and "/nonexistent/ca.pem" in err[0],
            "psctl: a CA file that is missing is named in one line, exit 2: %s" % err)
    p = subprocess.run([PSCTL, "--server", d.address, "--tls-ca", os.path.join(a, "ca.pem"),
                        "--tls-cert", os.path.join(a, "client.pem"),
                        "--tls-key", os.path.join(a, "worker0.key"), "stats"],
                       capture_output=True, text=True, timeout=30)
    err = p.stderr.strip().splitlines()
    r.check(p.returncode == 2 and len(err) == 1 and "worker0.key is not the key of" in err[0],
            "psctl: a key that is not its certificate's is named in one line, exit 2: %s"
            % err)


def check_reload(r, pb, pbg, d, live, a):
    c = pstest.tmpdir("tls-new-")
    pscerts(c, "psd=" + LOCAL, "client")

    def new_client():
        return tls_channel(d.address, os.path.join(c, "ca.pem"),
                           os.path.join(c, "client.pem"), os.path.join(c, "client.key"))

    code = refused(pb, pbg, new_client())
    r.check(code == grpc.StatusCode.UNAVAILABLE,
            "before the reload, a client of the new CA is refused (%s)" % code)
    for n in ("psd.pem", "psd.key", "ca.pem"):
        shutil.copy(os.path.join(c, n), os.path.join(live, n) + ".tmp")
        os.replace(os.path.join(live, n) + ".tmp", os.path.join(live, n))
    d.proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    ch = new_client()
    try:
        got = pstest.value(pbg.ParameterServerStub(ch).Pull(
            pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=10).values[0])
        ok = np.array_equal(got, np.array([-0.5, -1, -1.5, -2], dtype=np.float32))
    except grpc.RpcError as e:
        ok, got = False, e.details()
    ch.close()
    r.check(ok and d.proc.poll() is None, "after SIGHUP a client trusting only the new "
            "CA connects, and psd kept its variable: %s" % (got,))
    code = refused(pb, pbg, tls_channel(d.address, os.path.join(a, "ca.pem"),
                                        os.path.join(a, "client.pem"),
                                        os.path.join(a, "client.key")))
    r.check(code == grpc.StatusCode.UNAVAILABLE,
            "a client of the old CA is refused after the reload (%s)" % code)
    with open(os.path.join(live, "psd.pem"), "w") as f:
        f.write("not a certificate\n")
    d.proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    code = refused(pb, pbg, new_client())
    lines = [l for l in d.stderr().splitlines() if "reload" in l and "keeping" in l]
    r.check(code == grpc.StatusCode.OK and d.proc.poll() is None and len(lines) == 1 and
            "psd.pem" in lines[0],
            "a bad certificate file on reload keeps the old ones, one line: %s"
            % (lines[-1:] or code))
    # A good certificate with another certificate's key: gRPC would take the
    # pair and fail every handshake after; psd keeps the pair in use.
    shutil.copy(os.path.join(c, "psd.pem"), os.path.join(live, "psd.pem"))
    shutil.copy(os.path.join(a, "psd.key"), os.path.join(live, "psd.key"))
    d.proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    code = refused(pb, pbg, new_client())
    lines = [l for l in d.stderr().splitlines() if "is not the key of" in l]
    r.check(code == grpc.StatusCode.OK and d.proc.poll() is None and len(lines) == 1 and
            "psd.key" in lines[0] and "keeping" in lines[0],
            "a key that is not the certificate's keeps the old pair, one line: %s"
            % (lines[-1:] or code))


def check_loopback_rule(r, pb, pbg, a):
    data = pstest.tmpdir()
    p = subprocess.run([pstest.psd_path(), "--data-dir", data, "--listen", "0.0.0.0:0",
                        "--metrics-listen", "off"], capture_output=True, text=True,
                       timeout=30)
    err = p.stderr.strip().splitlines()
    r.check(p.returncode == 2 and len(err) == 1 and "0.0.0.0:0" in err[0] and
            "--tls-cert" in err[0] and "--insecure" in err[0],
            "psd --listen 0.0.0.0:0 without TLS exits 2 with one line: %s" % err)
    d = Logged([pstest.psd_path(), "--data-dir", data, "--listen", "0.0.0.0:0",
                "--metrics-listen", "off", "--insecure"])
    st = stats(pb, pbg, pstest.channel(d.address))
    r.check(st.insecure and st.transport_security == "plaintext",
            "with --insecure it serves; Stats: insecure=%s, %s"
            % (st.insecure, st.transport_security))
    p = subprocess.run([PSCTL, "--server", d.address, "stats"], capture_output=True,
                       text=True, timeout=30)
    r.check("--insecure" in p.stdout, "psctl stats shows --insecure")
    r.check("--insecure" in d.stderr() and "WARN" in d.stderr(), "--insecure logs a warning")
    d.stop()
    coord = Logged([PSCOORD, "--state-dir", pstest.tmpdir(), "--listen", "127.0.0.1:0",
                    "--metrics-listen", "off", "--job-id", "plain"])
    d = Logged([pstest.psd_path(), "--data-dir", data, "--listen", "0.0.0.0:0",
                "--metrics-listen", "off", "--insecure", "--coordinator", coord.address,
                "--job-id", "plain", "--task-index", "0"])
    p = subprocess.run([PSCTL, "status", "--coordinator", coord.address],
                       capture_output=True, text=True, timeout=30)
    t = [l for l in p.stdout.splitlines() if l.startswith("transport ")]
    r.check(p.returncode == 0 and t and t[0].split(None, 1)[1] == "ps[0] plaintext (--insecure)",
            "psctl status shows the shard served with --insecure: %s" % (t or p.stderr.strip()))
    d.stop()
    coord.stop()
    # worker0's certificate names only "worker0": a client that calls
    # 127.0.0.1 must be told the name to expect.
    d = Logged([pstest.psd_path(), "--data-dir", data, "--listen", "0.0.0.0:0",
                "--metrics-listen", "off"] + tls_flags(a, "worker0"))
    r.check(d.port is not None, "psd --listen 0.0.0.0:0 with TLS needs no --insecure")
    flags = ["--tls-ca", os.path.join(a, "ca.pem"), "--tls-cert",
             os.path.join(a, "client.pem"), "--tls-key", os.path.join(a, "client.key")]
    p = subprocess.run([PSCTL, "--server", d.address] + flags + ["health"],
                       capture_output=True, text=True, timeout=30)
    q = subprocess.run([PSCTL, "--server", d.address, "--tls-target-name", "worker0"] +
                       flags + ["health"], capture_output=True, text=True, timeout=30)
    r.check(p.returncode == 1 and q.returncode == 0,
            "a certificate without the address's name is refused, and accepted with "
            "--tls-target-name (exit %d, then %d)" % (p.returncode, q.returncode))
    d.stop()
    p = subprocess.run([pstest.psd_path(), "--data-dir", data, "--listen", "127.0.0.1:0",
                        "--tls-cert", "/nonexistent/psd.pem", "--tls-key",
                        os.path.join(a, "psd.key"), "--metrics-listen", "off"],
                       capture_output=True, text=True, timeout=30)
    err = p.stderr.strip().splitlines()
    r.check(p.returncode == 2 and len(err) == 1 and "/nonexistent/psd.pem" in err[0],
            "psd: a missing certificate file is named in one line, exit 2: %s" % err)
    p = subprocess.run([pstest.psd_path(), "--data-dir", data, "--listen", "127.0.0.1:0",
                        "--tls-cert", os.path.join(a, "psd.pem"), "--metrics-listen", "off"],
                       capture_output=True, text=True, timeout=30)
    r.check(p.returncode == 2 and "--tls-cert is given without --tls-key" in p.stderr,
            "psd: a certificate without its key exits 2: %s" % p.stderr.strip())
    p = subprocess.run([PSCOORD, "--state-dir", pstest.tmpdir(), "--listen", "0.0.0.0:0",
                        "--metrics-listen", "off"], capture_output=True, text=True,
                       timeout=30)
    r.check(p.returncode == 2 and "--insecure" in p.stderr,
            "pscoord --listen 0.0.0.0:0 without TLS exits 2: %s" % p.stderr.strip())


def check_pscoord(r, pb, pbg, a):
    coord = Logged([PSCOORD, "--state-dir", pstest.tmpdir(), "--listen", "127.0.0.1:0",
                    "--metrics-listen", "off", "--job-id", "tls", "--log-level", "info"] +
                   tls_flags(a, "pscoord"))
    ps = Logged([pstest.psd_path(), "--data-dir", pstest.tmpdir(), "--listen",
                 "127.0.0.1:0", "--metrics-listen", "off", "--coordinator", coord.address,
                 "--job-id", "tls", "--task-index", "0"] + tls_flags(a, "psd"))
    r.check(ps.port is not None, "psd registers with pscoord over mutual TLS")
    flags = ["--tls-ca", os.path.join(a, "ca.pem"), "--tls-cert",
             os.path.join(a, "client.pem"), "--tls-key", os.path.join(a, "client.key")]
    p = subprocess.run([PSCTL] + flags + ["status", "--coordinator", coord.address],
                       capture_output=True, text=True, timeout=30)
    t = [l for l in p.stdout.splitlines() if l.startswith("transport ")]
    r.check(p.returncode == 0 and t and t[0].split(None, 1)[1] == "ps[0] mtls",
            "psctl status over mutual TLS names each shard's transport: %s"
            % (t or p.stderr.strip()))
    p = subprocess.run([WORKERD, "--coordinator", coord.address, "--job-id", "tls",
                        "--task-index", "0", "--steps", "20", "--epochs", "0",
                        "--limit", "2000", "--evaluate=false", "--model", "softmax"] +
                       tls_flags(a, "worker0"), capture_output=True, text=True, timeout=240)
    r.check(p.returncode == 0, "workerd trains through pscoord and psd over mutual TLS (%s)"
            % (p.stderr.strip()[-300:] or "exit 0"))
    ch = tls_channel(coord.address, os.path.join(a, "ca.pem"),
                     os.path.join(a, "client.pem"), os.path.join(a, "client.key"))
    try:
        cs = pbg.CoordinatorStub(ch).GetCluster(pb.GetClusterRequest(job_id="tls"),
                                                timeout=5)
        ps_live = [t.address for t in cs.tasks if t.role == pb.PS and t.alive]
        ok = ps_live == [ps.address]
    except grpc.RpcError as e:
        ok, ps_live = False, e.details()
    ch.close()
    r.check(ok, "grpcio reads pscoord's cluster over mutual TLS: live ps %s" % (ps_live,))
    ps.stop()
    coord.stop()


def check_one_way(r, pb, pbg, a):
    """Server-only TLS: psd and pscoord with a certificate and key but no
    CA. Clients verify the server and present no certificate; tokens give
    the identity. (gRPC 1.51 aborted at start in this mode before.)"""
    import secrets
    tok = {role: secrets.token_urlsafe(32) for role in ("worker", "operator", "reader")}
    t = pstest.tmpdir("tls-oneway-tok-")
    table = os.path.join(t, "tokens")
    with open(table, "w") as f:
        f.write("".join("%s %s\n" % kv for kv in tok.items()))
    files = {}
    for role, v in tok.items():
        files[role] = os.path.join(t, role + ".tok")
        with open(files[role], "w") as f:
            f.write(v + "\n")
    for path in [table] + list(files.values()):
        os.chmod(path, 0o600)
    flags = ["--tls-cert", os.path.join(a, "psd.pem"), "--tls-key", os.path.join(a, "psd.key")]
    d = Logged([pstest.psd_path(), "--data-dir", pstest.tmpdir(), "--listen", "127.0.0.1:0",
                "--metrics-listen", "off", "--tokens", table] + flags)
    r.check(d.port is not None and d.proc.poll() is None,
            "psd with --tls-cert and --tls-key but no --tls-ca serves (one-way TLS)")
    ca = os.path.join(a, "ca.pem")
    ch = tls_channel(d.address, ca)
    stub = pbg.ParameterServerStub(ch)
    w = [("authorization", "Bearer " + tok["worker"])]
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "w", (4,), lr=0.5)),
                        timeout=10, metadata=w)
    g = np.array([1, 2, 3, 4], dtype=np.float32)
    stub.Push(pb.PushRequest(worker=0, step=1, grads=[pstest.grad(pb, "w", g)]), timeout=10,
              metadata=w)
    got = pstest.value(stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=10,
                                 metadata=w).values[0])
    r.check(np.array_equal(got, -0.5 * g),
            "grpcio without a client certificate pushes and pulls over one-way TLS: %s" % got)
    st = stub.Stats(pb.StatsRequest(), timeout=5,
                    metadata=[("authorization", "Bearer " + tok["reader"])])
    r.check(st.transport_security == "tls", "Stats: transport_security=%r"
            % st.transport_security)
    try:
        stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=5)
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
    r.check(code == grpc.StatusCode.UNAUTHENTICATED,
            "one-way TLS without a token is refused: the token is the identity (%s)" % code)
    ch.close()
    code = refused(pb, pbg, pstest.channel(d.address))
    r.check(code == grpc.StatusCode.UNAVAILABLE,
            "a plaintext client cannot connect to one-way TLS (%s)" % code)
    b = pstest.tmpdir("tls-oneway-other-")
    pscerts(b, "client")
    code = refused(pb, pbg, tls_channel(d.address, os.path.join(b, "ca.pem")))
    r.check(code == grpc.StatusCode.UNAVAILABLE,
            "a client that trusts another CA does not accept the one-way server (%s)" % code)
    p = subprocess.run([PSCTL, "--server", d.address, "--tls-ca", ca, "--token-file",
                        files["reader"], "stats"], capture_output=True, text=True, timeout=30)
    r.check(p.returncode == 0 and re.search(r"transport\s+tls\b", p.stdout),
            "psctl --tls-ca stats over one-way TLS shows the transport (%s)"
            % (p.stderr.strip() or "exit 0"))
    before = st.pushes
    p = subprocess.run([WORKERD, "--ps", d.address, "--steps", "20", "--epochs", "0",
                        "--limit", "2000", "--evaluate=false", "--shm", "off",
                        "--model", "softmax", "--tls-ca", ca, "--token-file", files["worker"]],
                       capture_output=True, text=True, timeout=240)
    ch = tls_channel(d.address, ca)
    after = pbg.ParameterServerStub(ch).Stats(
        pb.StatsRequest(), timeout=5,
        metadata=[("authorization", "Bearer " + tok["reader"])]).pushes
    ch.close()
    r.check(p.returncode == 0 and after - before >= 20,
            "workerd with --tls-ca only trains over one-way TLS: %d pushes (%s)"
            % (after - before, p.stderr.strip()[-200:] or "exit 0"))
    d.stop()
    coord = Logged([PSCOORD, "--state-dir", pstest.tmpdir(), "--listen", "127.0.0.1:0",
                    "--metrics-listen", "off", "--job-id", "oneway"] +
                   ["--tls-cert", os.path.join(a, "pscoord.pem"),
                    "--tls-key", os.path.join(a, "pscoord.key")])
    r.check(coord.port is not None and coord.proc.poll() is None,
            "pscoord with --tls-cert and --tls-key but no --tls-ca serves")
    ch = tls_channel(coord.address, ca)
    try:
        cs = pbg.CoordinatorStub(ch).GetCluster(pb.GetClusterRequest(job_id="oneway"),
                                                timeout=5)
        ok, what = True, "%d tasks" % len(cs.tasks)
    except grpc.RpcError as e:
        ok, what = False, e.details()
    ch.close()
    r.check(ok, "grpcio reads pscoord's cluster over one-way TLS (%s)" % what)
    p = subprocess.run([PSCTL, "--tls-ca", ca, "status", "--coordinator", coord.address],
                       capture_output=True, text=True, timeout=30)
    r.check(p.returncode == 0, "psctl status --tls-ca over one-way TLS (%s)"
            % (p.stderr.strip() or "exit 0"))
    coord.stop()


def expired_cert(d):
    """A self-signed certificate for localhost valid only on 2020-01-01
    (openssl ca can backdate; req and x509 cannot), and its key."""
    with open(os.path.join(d, "cnf"), "w") as f:
        f.write("[ ca ]\ndefault_ca = d\n[ d ]\ndatabase = %s/index.txt\n"
                "new_certs_dir = %s\nserial = %s/serial\ndefault_md = sha256\n"
                "policy = p\n[ p ]\ncommonName = supplied\n" % (d, d, d))
    open(os.path.join(d, "index.txt"), "w").close()
    with open(os.path.join(d, "serial"), "w") as f:
        f.write("01\n")
    key, csr, pem = (os.path.join(d, n) for n in ("old.key", "old.csr", "old.pem"))
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
                    "-subj", "/CN=localhost"], check=True, capture_output=True, timeout=30)
    subprocess.run(["openssl", "ca", "-batch", "-config", os.path.join(d, "cnf"),
                    "-selfsign", "-keyfile", key, "-in", csr, "-out", pem, "-startdate",
                    "20200101000000Z", "-enddate", "20200102000000Z"], check=True,
                   capture_output=True, timeout=30)
    return pem, key


def check_cert_warnings(r, pb, pbg):
    """A server certificate that expired or expires within 7 days, and a
    private key others may read, are logged as warnings at start and again
    at a reload."""
    d = pstest.tmpdir("tls-expiry-")
    pem, key = expired_cert(d)
    os.chmod(key, 0o644)
    ps = Logged([pstest.psd_path(), "--data-dir", pstest.tmpdir(), "--listen",
                 "127.0.0.1:0", "--metrics-listen", "off", "--tls-cert", pem,
                 "--tls-key", key])
    time.sleep(0.3)
    err = ps.stderr()
    lines = [l for l in err.splitlines() if "expired on 2020-01-02" in l]
    r.check(ps.proc.poll() is None and len(lines) == 1 and "WARN" in lines[0] and
            pem in lines[0], "psd warns once about its expired certificate: %s" % lines)
    lines = [l for l in err.splitlines() if "may be read by others" in l]
    r.check(len(lines) == 1 and key in lines[0] and "644" in lines[0],
            "psd warns about a private key others may read: %s" % lines)
    ps.stop()
    b = pstest.tmpdir("tls-soon-")
    pscerts(b, "--days", "3", "psd=" + LOCAL)
    coord = Logged([PSCOORD, "--state-dir", pstest.tmpdir(), "--listen", "127.0.0.1:0",
                    "--metrics-listen", "off", "--tls-cert", os.path.join(b, "psd.pem"),
                    "--tls-key", os.path.join(b, "psd.key")])
    time.sleep(0.3)
    soon = [l for l in coord.stderr().splitlines() if "expires on" in l]
    r.check(len(soon) == 1 and "in 3.0 days" in soon[0] and "WARN" in soon[0],
            "pscoord warns about a certificate that expires within 7 days: %s" % soon)
    r.check("may be read by others" not in coord.stderr(),
            "no warning for a key of mode 0600")
    coord.proc.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    ch = tls_channel(coord.address, os.path.join(b, "ca.pem"))
    try:
        pbg.CoordinatorStub(ch).GetCluster(pb.GetClusterRequest(), timeout=5)
    except grpc.RpcError:
        pass
    ch.close()
    soon = [l for l in coord.stderr().splitlines() if "expires on" in l]
    r.check(len(soon) == 2, "... and again after the reload SIGHUP asks for (%d lines)"
            % len(soon))
    coord.stop()


def main():
    r = pstest.Results("tls")
    pb, pbg, _, _ = pstest.generate_stubs()
    a, b = check_certs(r)
    d, live = check_mtls(r, pb, pbg, a, b)
    check_tools(r, pb, pbg, d, a)
    check_reload(r, pb, pbg, d, live, a)
    d.stop()
    check_loopback_rule(r, pb, pbg, a)
    check_pscoord(r, pb, pbg, a)
    check_one_way(r, pb, pbg, a)
    check_cert_warnings(r, pb, pbg)
    r.finish()


if __name__ == "__main__":
    main()
