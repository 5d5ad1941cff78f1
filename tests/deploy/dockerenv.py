"""A Docker engine for the deploy suite, and the images it runs.

Engine: the dockerd at $PS_DOCKER_HOST when that is set; else the one
this suite keeps under BUILD/docker (its socket there answers: a run
before left it up, or one runs beside); else a dockerd of Debian's
docker.io started here with its own data root (BUILD/docker/data, which
keeps the images and the build cache between runs), exec root and socket,
stopped at the end by its pid. It never touches a system dockerd.

Base image: the Dockerfile's FROM (debian:12), made once with
`debootstrap --variant=minbase bookworm` from the apt mirror this machine
uses, kept as BUILD/docker-base/bookworm.tar and imported with
`docker import`.
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import pstest  # noqa: E402

SKIP = 77  # meson's exit status for a skipped test
BASE_IMAGE = "debian:12"
RELEASE = "bookworm"
IMAGE = "psd:local"
PROMETHEUS_IMAGE = "psd-prometheus:local"


def docker_cli():
    """Debian's docker CLI (the engine's own version) when installed."""
    return "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"


def skip(why):
    print("SKIP %s" % why, flush=True)
    sys.exit(SKIP)


class Engine:
    def __init__(self):
        self.pid = None
        self.exec_root = None
        self.dir = os.path.join(pstest.BUILD_ROOT, "docker")
        self.env = dict(os.environ, DOCKER_BUILDKIT="0")
        host = os.environ.get("PS_DOCKER_HOST")
        if host:
            self.env["DOCKER_HOST"] = host
            if not self.answers():
                skip("PS_DOCKER_HOST=%s does not answer" % host)
            return
        self.env["DOCKER_HOST"] = "unix://" + os.path.join(self.dir, "docker.sock")
        if not self.answers():
            self.start()

    def docker(self, *args, timeout=120, check=True, **kw):
        p = subprocess.run([docker_cli()] + list(args), env=self.env, capture_output=True,
                           text=True, timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise RuntimeError("docker %s: %s" % (" ".join(args[:3]),
                                                  (p.stderr.strip() or p.stdout.strip())))
        return p

    def answers(self):
        try:
            return self.docker("version", "--format", "{{.Server.Version}}",
                               timeout=20, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def start(self):
        dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
        if not os.path.exists(dockerd):
            skip("dockerd is not installed (Debian's docker.io)")
        os.makedirs(self.dir, exist_ok=True)
        sock = os.path.join(self.dir, "docker.sock")
        if os.path.exists(sock):
            os.unlink(sock)  # left by a dockerd that is gone
        # The exec root holds containerd's socket: a short path under /tmp
        # (a socket path has at most 107 bytes).
        self.exec_root = tempfile.mkdtemp(prefix="psd-dockerd-")
        log = open(os.path.join(self.dir, "dockerd.log"), "ab")
        proc = subprocess.Popen(
            [dockerd, "--data-root", os.path.join(self.dir, "data"),
             "--exec-root", self.exec_root, "--pidfile", os.path.join(self.dir, "dockerd.pid"),
             "-H", "unix://" + sock, "--bridge", "none", "--log-level", "warn"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = proc.pid
        self.proc = proc
        if not pstest.wait_until(lambda: proc.poll() is not None or self.answers(),
                                 timeout=60, every=0.5) or proc.poll() is not None:
            tail = open(os.path.join(self.dir, "dockerd.log"), errors="replace").read()
            last = [ln for ln in tail.splitlines() if ln.strip()][-1:] or ["no output"]
            self.stop()
            skip("dockerd could not start (%s)" % last[0][-200:])

    def stop(self):
        """Stops the dockerd started here, by its pid (its containerd and
        shims follow it)."""
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        self.pid = None
        if self.exec_root:
            # dockerd leaves its default network namespace's bind mount
            # (EXEC_ROOT/netns/default) behind: unmounted here, deepest first.
            mounts = [ln.split()[1] for ln in open("/proc/self/mounts")]
            for m in sorted((m for m in mounts if m.startswith(self.exec_root + "/")),
                            key=len, reverse=True):
                subprocess.run(["umount", m], capture_output=True, timeout=30)
            shutil.rmtree(self.exec_root, ignore_errors=True)

    def has_image(self, name):
        return self.docker("image", "inspect", name, check=False).returncode == 0

    def base_image(self):
        """Imports the Debian base image once, from the cached tarball
        (made here with debootstrap when missing). Returns what was done."""
        if self.has_image(BASE_IMAGE):
            return "cached in the engine"
        cache = os.path.join(pstest.BUILD_ROOT, "docker-base", RELEASE + ".tar")
        made = "cached tarball %s" % cache
        if not os.path.exists(cache):
            make_base_tarball(cache)
            made = "debootstrap into %s" % cache
        with open(cache, "rb") as f:
            p = subprocess.run([docker_cli(), "import", "-", BASE_IMAGE], stdin=f,
                               env=self.env, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError("docker import: %s" % p.stderr.strip())
        return made

    def build(self, target=None, tag=IMAGE, timeout=3000):
        """docker build --network host of deploy/Dockerfile (the legacy
        builder of dockerd 20.10, which reaches apt's mirror on the host's
        network)."""
        args = ["build", "--network", "host", "-f",
                os.path.join(pstest.SOURCE_ROOT, "deploy", "Dockerfile"), "-t", tag]
        if target:
            args += ["--target", target]
        p = self.docker(*(args + [pstest.SOURCE_ROOT]), timeout=timeout, check=False)
        if p.returncode != 0:
            sys.stdout.write(p.stdout[-4000:] + p.stderr[-2000:])
            raise RuntimeError("docker build of %s failed" % tag)
        return p.stdout


def apt_mirror():
    """The Debian mirror of this machine's apt sources (not security)."""
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*")):
        try:
            text = open(path).read()
        except OSError:
            continue
        for m in re.finditer(r"^(?:deb\s+(?:\[[^\]]*\]\s+)?|URIs:\s*)(\S+)", text, re.M):
            uri = m.group(1)
            if "debian" in uri and "security" not in uri:
                return uri
    return "http://deb.debian.org/debian"


def make_base_tarball(cache):
    if not shutil.which("debootstrap"):
        raise RuntimeError("debootstrap is missing (apt-get install debootstrap)")
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    root = tempfile.mkdtemp(prefix="psd-debootstrap-", dir=os.path.dirname(cache))
    try:
        p = subprocess.run(["debootstrap", "--variant=minbase", RELEASE, root, apt_mirror()],
                           capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            raise RuntimeError("debootstrap: %s" % (p.stderr.strip() or p.stdout.strip())[-500:])
        tmp = cache + ".tmp"
        subprocess.run(["tar", "-C", root, "-cf", tmp, "."], check=True, timeout=600)
        os.replace(tmp, cache)
    finally:
        shutil.rmtree(root, ignore_errors=True)
