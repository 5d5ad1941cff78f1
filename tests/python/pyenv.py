"""The Python package's test set-up: installs python/ (psclient) into a
virtualenv under the build directory, build/venv-py, made with
--system-site-packages so that Debian's grpcio, protobuf, numpy and torch
are the ones used, and re-executes the calling test under it.

The install is `pip install --no-deps --no-build-isolation --no-index`: it
compiles proto/ with Debian's python3-grpc-tools and needs no network. It is
redone only when a file under python/ or proto/ changed (a hash is kept in
the venv), under a lock so that tests started together install once.
"""
import fcntl
import hashlib
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import pstest  # noqa: E402

VENV = os.path.join(pstest.BUILD_ROOT, "venv-py")
PKG = os.path.join(pstest.SOURCE_ROOT, "python")


def _tree_hash():
    h = hashlib.sha256()
    for root in (os.path.join(PKG, "psclient"), os.path.join(pstest.SOURCE_ROOT, "proto")):
        for dirpath, dirnames, files in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in ("_generated", "__pycache__"))
            for f in sorted(files):
                if f.endswith((".py", ".proto", ".typed")):
                    p = os.path.join(dirpath, f)
                    h.update(p.encode())
                    with open(p, "rb") as fh:
                        h.update(fh.read())
    for f in ("setup.py", "pyproject.toml", os.path.join("..", "meson.build")):
        with open(os.path.join(PKG, f), "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def install(venv=VENV, extra_pip=(), system_site=True):
    """Makes venv (once) and installs psclient into it when the sources
    changed; returns the venv's python."""
    py = os.path.join(venv, "bin", "python")
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(py):
            args = [sys.executable, "-m", "venv", venv]
            if system_site:
                args.insert(3, "--system-site-packages")
            subprocess.run(args, check=True, timeout=300)
        stamp = os.path.join(venv, ".psclient-hash")
        want = _tree_hash()
        have = open(stamp).read() if os.path.exists(stamp) else ""
        if have != want:
            r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-deps",
                                "--disable-pip-version-check", "--no-build-isolation",
                                "--no-index"] + list(extra_pip) + [PKG],
                               capture_output=True, text=True, timeout=600, cwd=venv)
            if r.returncode != 0:
                sys.exit("pip install python/ into %s failed:\n%s%s"
                         % (venv, r.stdout, r.stderr))
            with open(stamp, "w") as f:
                f.write(want)
    return py


def reexec():
    """Runs the calling script again under build/venv-py's python (with
    psclient installed), unless it already runs there."""
    py = install()
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(py, [py] + sys.argv)


def reexec_tf(what, need=None):
    """Runs the calling script again under tf_python(), unless it already
    runs there; exits 77 (skip) naming `what` when there is none, or when
    need() gives a reason to skip. Under TensorFlow, quiets its C++ log."""
    if os.environ.get("PSCLIENT_TF_VENV") != "1":
        why = need() if need is not None else None
        if why is not None:
            print("skip: %s" % why)
            sys.exit(77)
        py, why = tf_python()
        if py is None:
            print("skip: %s: %s" % (what, why))
            sys.exit(77)
        os.environ["PSCLIENT_TF_VENV"] = "1"
        os.execv(py, [py] + sys.argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def import_torch():
    """Debian's torch, or exit 77 (skip) saying which package to install."""
    try:
        import torch
    except ImportError:
        print("skip: python3-torch is not installed (apt-get install python3-torch)")
        sys.exit(77)
    return torch


def tf_version():
    """The tensorflow-cpu version the Makefile's bench-tf-venv pins."""
    import re
    with open(os.path.join(pstest.SOURCE_ROOT, "Makefile")) as f:
        m = re.search(r"^TF_VERSION \?= (\S+)", f.read(), re.M)
    return m.group(1) if m else "2.21.0"


def _has_tf(py, version):
    try:
        return subprocess.run([py, "-c", "import sys, tensorflow as tf; "
                               "sys.exit(tf.__version__ != %r)" % version],
                              capture_output=True, timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def tf_python():
    """A python with PyPI's tensorflow-cpu (the Makefile's pinned version)
    and psclient: the repository's .venv-tf when `make bench-tf-venv` made
    it, else build/venv-tf, made once (about 1.6 GB) and reused. Returns
    (python, None) or (None, why) when PyPI cannot be reached."""
    version = tf_version()
    shared = os.path.join(pstest.SOURCE_ROOT, ".venv-tf")
    venv = os.path.join(pstest.BUILD_ROOT, "venv-tf")
    for v in (shared, venv):
        py = os.path.join(v, "bin", "python")
        if os.path.exists(py) and _has_tf(py, version):
            return _with_psclient(v, py)
    py = os.path.join(venv, "bin", "python")
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(py):
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
        if not _has_tf(py, version):
            why = pstest.pip_install(py, "tensorflow-cpu==" + version, 30)
            if why is not None:
                return None, why
    return _with_psclient(venv, py)


def _with_psclient(venv, py):
    """Installs psclient into a TensorFlow venv (its own grpcio, protobuf
    and numpy stay; the build fetches setuptools and grpcio-tools)."""
    stamp = os.path.join(venv, ".psclient-hash")
    want = _tree_hash()
    with open(venv + ".psclient.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        have = open(stamp).read() if os.path.exists(stamp) else ""
        if have != want:
            r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-deps",
                                "--disable-pip-version-check", PKG],
                               capture_output=True, text=True, timeout=900, cwd=venv)
            if r.returncode != 0:
                last = (r.stderr or r.stdout).strip().splitlines()
                return None, "pip install python/ into %s failed: %s" % (
                    venv, last[-1] if last else "exit %d" % r.returncode)
            with open(stamp, "w") as f:
                f.write(want)
    return py, None
