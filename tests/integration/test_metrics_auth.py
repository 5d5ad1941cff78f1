"""/metrics with basic auth and HTTPS (--metrics-auth, --metrics-tls-cert,
--metrics-tls-key) on a real psd and a real pscoord on 127.0.0.1:0, and the
per-request deadline:

  https      a certificate made with openssl; urllib verifying it: no
             credentials and a wrong password are 401 with
             WWW-Authenticate, the right ones 200 with the page; plain HTTP
             to the port gets no page. pscoord the same, with a file of
             'USER:sha256:HEX' lines that others may read.
  files      each bad file or pair is a non-zero exit with one line naming
             the flag and file: passwords in the clear readable by others,
             a file others may write, a bad line, a missing file, a
             certificate without its key, a key that is not the
             certificate's.
  deadline   a client that sends its request line a byte every 0.4 s (the
             idle timeout never fires) is cut within the 5 s deadline.
  prometheus Debian's prometheus scrapes psd over HTTPS with basic_auth and
             tls_config from a generated prometheus.yml (promtool check
             config passes on it): that target is up, one with a wrong
             password is down with a 401 (skipped without prometheus).

Prints ok/FAIL per check and "metrics-auth: N passed, N failed".
"""
import base64
import hashlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import pstest  # noqa: E402

PSCOORD = os.path.join(pstest.BUILD_ROOT, "coordinator", "pscoord")
USER, PASSWORD = "prom", "a-scrape-password-1"
r = None
TMP = None


def write(path, text, mode):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def make_cert(name):
    cert, key = os.path.join(TMP, name + ".pem"), os.path.join(TMP, name + ".key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    return cert, key


class Served(pstest.Daemon):
    """psd or pscoord with /metrics; metrics_port read after PORT."""

    def __init__(self, argv):
        self.log_path = os.path.join(pstest.tmpdir("mauth-log-"), "stderr")
        self.log = open(self.log_path, "w")
        super().__init__(argv, stderr=self.log)
        line = self.proc.stdout.readline()
        if not line.startswith("METRICS_PORT "):
            raise RuntimeError("%s printed %r after PORT" % (argv[0], line))
        self.metrics_port = int(line.split()[1])


def psd(*args):
    return Served([pstest.psd_path(), "--data-dir", pstest.tmpdir(), "--listen",
                   "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                   "--log-level", "warn"] + list(args))


def pscoord(*args):
    return Served([PSCOORD, "--state-dir", pstest.tmpdir(), "--listen", "127.0.0.1:0",
                   "--metrics-listen", "127.0.0.1:0", "--log-level", "warn"] + list(args))


def get(port, ca, user=None, password=None, scheme="https"):
    """(status, headers, body) of GET /metrics; status None when no HTTP
    answer came."""
    req = urllib.request.Request("%s://127.0.0.1:%d/metrics" % (scheme, port))
    if user is not None:
        tok = base64.b64encode(("%s:%s" % (user, password)).encode()).decode()
        req.add_header("Authorization", "Basic " + tok)
    ctx = ssl.create_default_context(cafile=ca) if scheme == "https" else None
    try:
        with urllib.request.urlopen(req, timeout=5, context=ctx) as f:
            return f.status, dict(f.headers), f.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()
    except (OSError, ssl.SSLError, urllib.error.URLError):
        return None, {}, ""


def check_https(cert, key, auth):
    d = psd("--metrics-auth", auth, "--metrics-tls-cert", cert, "--metrics-tls-key", key)
    p = d.metrics_port
    st, hd, body = get(p, cert)
    r.check(st == 401 and hd.get("WWW-Authenticate", "").startswith("Basic") and
            "--metrics-auth" in body,
            "https: no credentials: 401 with WWW-Authenticate (%s, %r)" % (st, body.strip()))
    st, _, _ = get(p, cert, USER, "wrong")
    r.check(st == 401, "https: a wrong password: 401 (%s)" % st)
    st, _, _ = get(p, cert, "nobody", PASSWORD)
    r.check(st == 401, "https: an unknown user with the password: 401 (%s)" % st)
    st, _, body = get(p, cert, USER, PASSWORD)
    r.check(st == 200 and "psd_uptime_seconds" in body,
            "https: the right user and password over verified TLS: 200, the page (%s)" % st)
    st, _, body = get(p, cert, USER, PASSWORD, scheme="http")
    r.check(st != 200 and "psd_" not in body,
            "https: plain HTTP to the port gets no page (%s)" % st)
    r.check(d.stop() == 0, "https: psd exits 0")
    digest = hashlib.sha256(PASSWORD.encode()).hexdigest()
    hashed = write(os.path.join(TMP, "hashed"), "# scrapers\n%s:sha256:%s\n" % (USER, digest),
                   0o644)
    c = pscoord("--metrics-auth", hashed, "--metrics-tls-cert", cert, "--metrics-tls-key", key)
    st, _, body = get(c.metrics_port, cert, USER, PASSWORD)
    st2, _, _ = get(c.metrics_port, cert)
    r.check(st == 200 and "pscoord_" in body and st2 == 401,
            "https: pscoord with USER:sha256:HEX in a file of mode 644: 200 with the "
            "password, 401 without (%s, %s)" % (st, st2))
    r.check(c.stop() == 0, "https: pscoord exits 0")


def refused_start(prog, args, *words):
    """Starts prog with args; (ok, line): exit non-zero, one stderr line
    holding every word."""
    base = ([pstest.psd_path(), "--data-dir", pstest.tmpdir()] if prog == "psd" else
            [PSCOORD, "--state-dir", pstest.tmpdir()])
    p = subprocess.run(base + ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                               "--log-level", "warn"] + list(args),
                       capture_output=True, text=True, timeout=30)
    lines = p.stderr.strip().splitlines()
    ok = p.returncode != 0 and len(lines) == 1 and all(w in lines[0] for w in words)
    return ok, "exit %d, %s" % (p.returncode, lines)


def check_files(cert, key):
    other_cert, other_key = make_cert("other")
    clear = write(os.path.join(TMP, "clear644"), "%s:%s\n" % (USER, PASSWORD), 0o644)
    digest = hashlib.sha256(b"x").hexdigest()
    gw = write(os.path.join(TMP, "gw"), "u:sha256:%s\n" % digest, 0o664)
    badline = write(os.path.join(TMP, "badline"), "no-colon-here\n", 0o600)
    badhex = write(os.path.join(TMP, "badhex"), "u:sha256:1234\n", 0o600)
    empty = write(os.path.join(TMP, "empty"), "# nobody\n", 0o600)
    cases = [
        ("psd", ["--metrics-auth", clear], ["--metrics-auth", clear, "chmod 600"],
         "passwords in the clear, mode 644"),
        ("pscoord", ["--metrics-auth", clear], ["--metrics-auth", clear, "chmod 600"],
         "pscoord: passwords in the clear, mode 644"),
        ("psd", ["--metrics-auth", gw], ["--metrics-auth", gw, "chmod go-w"],
         "a file the group may write"),
        ("psd", ["--metrics-auth", badline], ["--metrics-auth", badline + ":1", "USER"],
         "a line without USER:"),
        ("psd", ["--metrics-auth", badhex], [badhex + ":1", "64 hex digits"],
         "sha256: of 4 digits"),
        ("psd", ["--metrics-auth", empty], [empty, "no users"], "a file of no users"),
        ("psd", ["--metrics-auth", os.path.join(TMP, "missing")], ["missing"],
         "a missing file"),
        ("psd", ["--metrics-tls-cert", cert],
         ["--metrics-tls-cert is given without --metrics-tls-key"], "a certificate alone"),
        ("pscoord", ["--metrics-tls-cert", cert, "--metrics-tls-key", other_key],
         ["--metrics-tls-key", other_key, "is not the key of"], "pscoord: another key"),
    ]
    for prog, args, words, what in cases:
        ok, why = refused_start(prog, args, *words)
        r.check(ok, "files: %s: refused in one line (%s)" % (what, why))


def check_deadline():
    d = psd()
    s = socket.create_connection(("127.0.0.1", d.metrics_port), timeout=1)
    line = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-a: " + b"a" * 40
    t0 = time.monotonic()
    closed_at = None
    for b in line:
        try:
            s.sendall(bytes([b]))
            s.settimeout(0.4)
            if s.recv(1) == b"":
                closed_at = time.monotonic() - t0
                break
        except socket.timeout:
            continue
        except OSError:
            closed_at = time.monotonic() - t0
            break
        if time.monotonic() - t0 > 12:
            break
    s.close()
    r.check(closed_at is not None and closed_at < 7.5,
            "deadline: a request line trickled a byte every 0.4 s is cut after %s s "
            "(deadline 5 s)" % ("%.1f" % closed_at if closed_at else "more than 12"))
    st, _, body = get(d.metrics_port, None, scheme="http")
    r.check(st == 200 and "psd_" in body, "deadline: a scrape is answered after it")
    r.check(d.stop() == 0, "deadline: psd exits 0")


def targets(web):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/targets" % web,
                                    timeout=5) as f:
            got = json.load(f)
    except OSError:
        return {}
    return {t["labels"]["job"]: (t["health"], t.get("lastError", ""))
            for t in got["data"]["activeTargets"]}


def check_prometheus(cert, key, auth):
    import shutil
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        print("skip prometheus: not installed (apt-get install prometheus)")
        return
    d = psd("--metrics-auth", auth, "--metrics-tls-cert", cert, "--metrics-tls-key", key)
    good = write(os.path.join(TMP, "prom-pass"), PASSWORD + "\n", 0o600)
    bad = write(os.path.join(TMP, "prom-bad"), "not-the-password\n", 0o600)
    cfg = os.path.join(TMP, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\nscrape_configs:\n")
        for job, pw in (("psd_ok", good), ("psd_bad", bad)):
            f.write("  - job_name: %s\n    scheme: https\n"
                    "    basic_auth:\n      username: %s\n      password_file: %s\n"
                    "    tls_config:\n      ca_file: %s\n"
                    "    static_configs:\n      - targets: ['127.0.0.1:%d']\n"
                    % (job, USER, pw, cert, d.metrics_port))
    p = subprocess.run([promtool, "check", "config", cfg], capture_output=True, text=True,
                       timeout=60)
    r.check(p.returncode == 0, "prometheus: promtool check config passes on the scrape "
            "config with basic_auth and tls_config (%s)"
            % (p.stdout + p.stderr).strip().splitlines()[-1:])
    web = pstest.free_port()
    log = open(os.path.join(TMP, "prometheus.log"), "w")
    prom = subprocess.Popen([prometheus, "--config.file", cfg, "--storage.tsdb.path",
                             os.path.join(TMP, "tsdb"), "--web.listen-address",
                             "127.0.0.1:%d" % web, "--log.level", "warn"],
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        got = pstest.wait_until(lambda: (lambda t: t if t.get("psd_ok", ("",))[0] == "up"
                                         and t.get("psd_bad", ("",))[0] == "down" else None)(
                                             targets(web)), 60, 0.5)
        got = got or targets(web)
        r.check(got.get("psd_ok", ("",))[0] == "up",
                "prometheus: scrapes psd over HTTPS with basic_auth: up (%s)"
                % (got.get("psd_ok"),))
        r.check(got.get("psd_bad", ("",))[0] == "down" and "401" in got["psd_bad"][1],
                "prometheus: with a wrong password the target is down with a 401 (%s)"
                % (got.get("psd_bad"),))
    finally:
        if prom.poll() is None:
            os.killpg(prom.pid, signal.SIGTERM)
            try:
                prom.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(prom.pid, signal.SIGKILL)
                prom.wait()
        log.close()
    r.check(d.stop() == 0, "prometheus: psd exits 0")


def main():
    global r, TMP
    r = pstest.Results("metrics-auth")
    TMP = pstest.tmpdir("mauth-")
    cert, key = make_cert("server")
    auth = write(os.path.join(TMP, "users"), "# user:password\n%s:%s\n" % (USER, PASSWORD),
                 0o600)
    r.run([lambda: check_https(cert, key, auth), lambda: check_files(cert, key),
           check_deadline, lambda: check_prometheus(cert, key, auth)])
    r.finish()


if __name__ == "__main__":
    main()
