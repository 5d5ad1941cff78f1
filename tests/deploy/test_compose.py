"""The compose cluster, run for real: deploy/Dockerfile built into an image,
deploy/docker-compose.yml brought up on a subnet named here (certificates,
pscoord, two psd, two workers, an evaluator, Prometheus), the job trained
to the demo's accuracy while one psd container is killed mid-training,
psd's metrics read back from the cluster's Prometheus, each container's
secrets checked from inside two of them, and `down -v` leaving no
container, network or volume behind.

Needs a Docker engine (tests/deploy/dockerenv.py starts Debian's dockerd
under build/docker when none runs; the test is skipped, with one line,
only when it cannot start) and docker-compose. The first run makes the
Debian base image with debootstrap and builds the image (minutes); later
runs find both cached.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import dockerenv  # noqa: E402
import pstest  # noqa: E402

COMPOSE_FILE = os.path.join(pstest.SOURCE_ROOT, "deploy", "docker-compose.yml")
PROJECT = "psdtest"
# The cluster's network: a /24 of 172.28.0.0/16, a private range no other
# test here uses, picked by the build directory's path, so that two
# checkouts testing at once on one host do not take the same one. Override
# with PS_TEST_SUBNET when it collides with a network of this host.
SUBNET = os.environ.get("PS_TEST_SUBNET", "172.28.%d.0/24" % (
    zlib.crc32(os.path.realpath(pstest.BUILD_ROOT).encode()) % 256))
EPOCHS = os.environ.get("PS_TEST_EPOCHS", "5")
ACCURACY = 0.85  # deploy/demo.py's bar
TRAIN_TIMEOUT = 480


class Cluster:
    def __init__(self, engine, prom_port):
        self.engine = engine
        self.env = dict(engine.env, PS_SUBNET=SUBNET, PS_EPOCHS=EPOCHS,
                        PS_PROMETHEUS_PORT=str(prom_port), COMPOSE_HTTP_TIMEOUT="300")
        self.prom = "http://127.0.0.1:%d" % prom_port

    def compose(self, *args, timeout=300, check=True):
        p = subprocess.run(["docker-compose", "-p", PROJECT, "-f", COMPOSE_FILE] + list(args),
                           env=self.env, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise RuntimeError("docker-compose %s: %s" % (" ".join(args[:2]),
                                                         p.stderr.strip()[-1500:]))
        return p

    def container(self, service):
        return "%s_%s_1" % (PROJECT, service)

    def inspect(self, service, fmt):
        p = self.engine.docker("inspect", "-f", fmt, self.container(service), check=False)
        return p.stdout.strip() if p.returncode == 0 else None

    def exec(self, service, script):
        return self.engine.docker("exec", self.container(service), "sh", "-c", script,
                                  check=False, timeout=60)

    def query(self, expr):
        """Prometheus' instant query: [(labels, float value)]."""
        url = self.prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
        except (OSError, ValueError):
            return []
        return [(s["metric"], float(s["value"][1])) for s in body["data"]["result"]]

    def value(self, expr):
        v = self.query(expr)
        return v[0][1] if v else None

    def leftovers(self):
        label = "label=com.docker.compose.project=%s" % PROJECT
        out = []
        for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
            p = self.engine.docker(*(kind + ["-q", "--filter", label]), check=False)
            out += ["%s %s" % (kind[0], x) for x in p.stdout.split()]
        return out


def check_secrets(r, c):
    """Each container holds its own key and certificate, the CA's
    certificate and its own role's token; only the one-shot certs service
    ever held the CA's key (its volume, which no task mounts)."""
    p = c.compose("run", "--rm", "--no-deps", "--entrypoint", "cat", "certs",
                  "/var/lib/pscerts/tokens/operator", "/var/lib/pscerts/tokens/worker",
                  check=False)
    secrets = dict(ln.split() for ln in p.stdout.splitlines() if len(ln.split()) == 2)
    r.check(set(secrets) == {"operator", "worker"},
            "the CA's volume holds the role tokens (%s)" % (
                sorted(secrets) if secrets else p.stderr.strip()[-200:]))
    for service, role, files in (("ps0", "worker", "ca.pem tls.key tls.pem token tokens"),
                                 ("worker0", "worker", "ca.pem tls.key tls.pem token")):
        p = c.exec(service, "id -u; ls -A /etc/psd/tls | tr '\\n' ' '; echo;"
                   " openssl x509 -noout -subject -in /etc/psd/tls/tls.pem;"
                   " openssl x509 -noout -pubkey -in /etc/psd/tls/tls.pem | sha256sum;"
                   " openssl pkey -pubout -in /etc/psd/tls/tls.key | sha256sum;"
                   " cut -d' ' -f1 /etc/psd/tls/token;"
                   " find / \\( -path /proc -o -path /sys \\) -prune -o -type f -name '*.key'"
                   " -print 2>/dev/null | grep -v '^/etc/psd/tls/tls.key$' | tr '\\n' ' ';"
                   " echo;"
                   " echo done")
        lines = p.stdout.splitlines()
        r.check(p.returncode == 0 and len(lines) >= 8 and lines[-1] == "done",
                "%s: the probe ran inside the container (%s)" % (service, p.stderr.strip()[-200:]))
        if len(lines) < 8:
            continue
        uid, listing, subject, certkey, key, tokrole, keys = lines[:7]
        r.check(uid == "10001", "%s runs as uid 10001, not root (%s)" % (service, uid))
        r.check(listing.split() == files.split(),
                "%s's /etc/psd/tls holds only its own files: %s" % (service, listing.strip()))
        r.check(subject.replace(" ", "").endswith("CN=" + service),
                "%s's certificate is its own (%s)" % (service, subject))
        r.check(certkey == key, "%s's key is its certificate's" % service)
        r.check(tokrole == role, "%s's token is its role's, %s (%s)" % (service, role, tokrole))
        r.check(keys.strip() == "", "%s holds no other private key, no CA key (%s)"
                % (service, keys.strip() or "none"))
        # No other role's secret: grep every file the task can read for the
        # operator token (and, in a worker, for nothing but its own).
        if secrets:
            g = c.exec(service, "grep -rlF -e '%s' /etc /var/lib /run /tmp 2>/dev/null; true"
                       % secrets["operator"])
            r.check(g.stdout.strip() == "", "%s holds no operator token (%s)"
                    % (service, g.stdout.strip() or "none found"))
    t = c.exec("ps0", "cat /etc/psd/tls/tokens")
    rows = [ln.split() for ln in t.stdout.splitlines() if ln.strip()]
    r.check(len(rows) == 3 and all(x[1].startswith("sha256:") for x in rows),
            "ps0's role table holds hashes only (%s)" % [x[0] for x in rows])


def check_bad_input(r, engine):
    """A task whose certificate or token file is missing exits non-zero
    at once with one line naming the file (no silent restart loop)."""
    cases = [("psd", ["psd", "--data-dir", "/tmp/d", "--listen", "0.0.0.0:7070",
                      "--tls-cert", "/etc/psd/tls/tls.pem", "--tls-key", "/etc/psd/tls/tls.key",
                      "--tls-ca", "/etc/psd/tls/ca.pem"], "/etc/psd/tls/tls.pem"),
             ("workerd", ["workerd", "--coordinator", "pscoord:7071",
                          "--token-file", "/etc/psd/tls/token"], "/etc/psd/tls/token")]
    for what, argv, path in cases:
        t0 = time.monotonic()
        p = engine.docker("run", "--rm", "--network", "none", dockerenv.IMAGE, *argv,
                          check=False, timeout=60)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        r.check(p.returncode not in (0, 125, 126, 127) and len(lines) == 1 and path in lines[0]
                and time.monotonic() - t0 < 30,
                "%s with %s missing: exit %d, one line naming it (%s)"
                % (what, path, p.returncode, " | ".join(lines)[-300:]))


def wait_step(c, what, pred, timeout):
    t0 = time.monotonic()
    v = pstest.wait_until(pred, timeout=timeout, every=2)
    print("     (%s after %.0f s)" % (what, time.monotonic() - t0), flush=True)
    return v


def run(r, engine):
    t0 = time.monotonic()
    print("base image: %s" % engine.base_image(), flush=True)
    engine.build()
    engine.build(target="prometheus", tag=dockerenv.PROMETHEUS_IMAGE)
    print("images built in %.0f s" % (time.monotonic() - t0), flush=True)
    r.check(engine.has_image(dockerenv.IMAGE), "deploy/Dockerfile builds %s" % dockerenv.IMAGE)
    user = engine.docker("image", "inspect", "-f", "{{.Config.User}} {{json .Config.Healthcheck}}"
                         " {{json .Config.ExposedPorts}}", dockerenv.IMAGE).stdout.strip()
    r.check(user.startswith("10001:10001 ") and "ps-healthcheck" in user and "7070/tcp" in user,
            "the image runs as 10001, has a HEALTHCHECK and EXPOSEs its ports (%s)" % user)
    check_bad_input(r, engine)

    print("network %s" % SUBNET, flush=True)
    c = Cluster(engine, pstest.free_port())
    if c.leftovers():  # a run that was interrupted
        c.compose("down", "-v", "--remove-orphans", check=False)
    try:
        t1 = time.monotonic()
        c.compose("up", "-d", "--no-build", timeout=600)
        masq = "com.docker.network.bridge.enable_ip_masquerade"
        net = engine.docker("network", "inspect", "-f",
                            "{{range .IPAM.Config}}{{.Subnet}}{{end}} {{index .Options \"%s\"}}"
                            % masq, PROJECT + "_psnet", check=False).stdout.strip()
        r.check(net == SUBNET + " false", "the cluster's network is %s, not masqueraded (%s)"
                % (SUBNET, net))
        r.check(c.inspect("certs", "{{.State.ExitCode}}") == "0", "the certs service made the "
                "certificates and exited 0")
        check_secrets(r, c)
        healthy = wait_step(c, "health", lambda: all(
            c.inspect(s, "{{.State.Health.Status}}") == "healthy"
            for s in ("pscoord", "ps0", "ps1")), 90)
        # The operator's psctl, with the operator's bundle only.
        p = c.compose("--profile", "tools", "run", "--rm", "--no-deps", "psctl",
                      "--server", "ps0:7070", "stats", check=False, timeout=120)
        r.check(p.returncode == 0 and "variables" in p.stdout,
                "psctl (the operator's bundle) reads ps0's stats over mutual TLS (%s)"
                % (p.stdout.strip().splitlines()[:1] or p.stderr.strip()[-300:]))
        r.check(healthy, "pscoord, ps0 and ps1 are healthy by their grpc.health.v1 "
                "HEALTHCHECK (%s)" % [c.inspect(s, "{{.State.Health.Status}}")
                                      for s in ("pscoord", "ps0", "ps1")])
        # Mid-training: after the first job checkpoint, kill ps1's process
        # (SIGKILL by its host pid: a crash, which its restart policy
        # answers; `docker kill` would count as a stop).
        ck = wait_step(c, "first checkpoint", lambda: (
            c.value("pscoord_job_checkpoint_last_step") or 0) > 0, TRAIN_TIMEOUT / 2)
        step = c.value("pscoord_global_step")
        r.check(ck, "the job trains and pscoord checkpoints it (global step %s)" % step)
        pid = int(c.inspect("ps1", "{{.State.Pid}}") or 0)
        running = all(c.inspect(s, "{{.State.Status}}") == "running"
                      for s in ("worker0", "worker1"))
        if pid > 0:
            os.kill(pid, signal.SIGKILL)
        r.check(pid > 0 and running, "ps1 killed (pid %d) mid-training, at global step %s, "
                "the workers running" % (pid, step))
        back = wait_step(c, "ps1 back", lambda: c.inspect("ps1", "{{.RestartCount}}") not in
                         (None, "0") and c.inspect("ps1", "{{.State.Status}}") == "running", 60)
        r.check(back, "ps1 restarts (restart count %s)" % c.inspect("ps1", "{{.RestartCount}}"))
        done = wait_step(c, "workers done", lambda: all(
            c.inspect(s, "{{.State.Status}}") == "exited" for s in ("worker0", "worker1")),
            TRAIN_TIMEOUT)
        for s in ("worker0", "worker1"):
            code = c.inspect(s, "{{.State.ExitCode}}")
            logs = engine.docker("logs", c.container(s), check=False)
            summary = {}
            for ln in logs.stdout.splitlines():
                if ln.startswith("{"):
                    try:
                        summary = json.loads(ln)
                    except ValueError:
                        pass
            acc = summary.get("test_accuracy", -1)
            r.check(done and code == "0" and acc >= ACCURACY,
                    "%s finished (exit %s) at test accuracy %.4f >= %.2f"
                    % (s, code, acc, ACCURACY))
            if not (done and code == "0"):
                print(logs.stderr[-2000:])
        final = c.value("pscoord_global_step")
        r.check(final is not None and step is not None and final > step,
                "the job went on after the kill: global step %s -> %s" % (step, final))
        print("cluster trained in %.0f s" % (time.monotonic() - t1), flush=True)
        # psd's metrics, from the cluster's own Prometheus. ps1's counter
        # began again at 0 when it restarted, and its last scrape may
        # predate the workers' pushes to the new process: the highest
        # value each server's series took over the job is the one to ask.
        up = wait_step(c, "scrape", lambda: sorted(
            m["instance"] for m, v in c.query('up{job="psd"}') if v == 1) ==
            ["ps0:9480", "ps1:9481"], 30)
        r.check(up, "Prometheus scrapes both psd (%s)" % c.query('up{job="psd"}'))
        most = "max by (instance) (max_over_time(psd_pushes_total[15m]))"
        wait_step(c, "pushes scraped", lambda: [v > 0 for _, v in c.query(most)] ==
                  [True, True], 30)
        pushes = c.query(most)
        r.check(len(pushes) == 2 and all(v > 0 for _, v in pushes),
                "psd_pushes_total from Prometheus: %s" % [(m.get("instance"), v)
                                                         for m, v in pushes])
    finally:
        p = c.compose("--profile", "tools", "down", "-v", "--remove-orphans", check=False)
        r.check(p.returncode == 0, "docker-compose down -v%s" % (
            "" if p.returncode == 0 else " (%s)" % p.stderr.strip()[-300:]))
        left = c.leftovers()
        r.check(not left, "down -v leaves no container, network or volume %s" % (left or ""))


def main():
    if not shutil.which("docker-compose"):
        print("FAIL docker-compose is missing (apt-get install docker-compose)")
        sys.exit(1)
    t0 = time.monotonic()
    engine = dockerenv.Engine()
    r = pstest.Results("compose")
    try:
        run(r, engine)
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        r.check(False, "the deploy run: %s" % e)
    finally:
        engine.stop()
    print("compose: %.0f s in all" % (time.monotonic() - t0))
    r.finish()


if __name__ == "__main__":
    main()
