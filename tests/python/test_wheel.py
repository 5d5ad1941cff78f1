"""The psclient wheel, as a new user gets it, against a real psd on
127.0.0.1:0:

  build     `pip wheel ./python` (offline: --no-build-isolation --no-index,
            Debian's setuptools and python3-grpc-tools compile proto/) makes
            one wheel holding the proto descriptors, versioned as
            meson.build's project; with PyPI reachable, the plain isolated
            `pip wheel ./python` (setuptools and grpcio-tools from PyPI) as
            well, else one line saying it was skipped;
  install   the wheel installs with --no-index into a fresh venv under
            build/ (--system-site-packages: Debian's grpcio, protobuf and
            numpy satisfy its dependencies), and from a directory outside
            the source tree psclient imports from the venv, reports the
            project's version, and trains two steps against psd (the
            values numpy's SGD gives) and one step of a ShardedEmbeddingBag
            when torch is there.

Prints ok/FAIL per check and "python-wheel: N passed, N failed".
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import pstest  # noqa: E402

r = pstest.Results("python-wheel")
PKG = os.path.join(pstest.SOURCE_ROOT, "python")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

TRAIN = r'''
import os, sys, numpy as np, psclient
from psclient import Client, Variable, Initializer, Optimizer, SparseTable
assert os.path.realpath(psclient.__file__).startswith(os.path.realpath(sys.prefix)), \
    psclient.__file__
print("version", psclient.__version__)
with Client([sys.argv[1]]) as c:
    c.create_variables([Variable("wheel_w", (3, 2), Initializer.constant(1.0))],
                       optimizer=Optimizer.sgd(0.5))
    g = np.arange(6, dtype=np.float32).reshape(3, 2)
    c.push({"wheel_w": g})
    v = c.push({"wheel_w": g}, return_values=True).values["wheel_w"]
    assert np.array_equal(v, np.float32(1) - np.float32(0.5) * g * 2), v
    print("steps ok")
    try:
        import torch
    except ImportError:
        print("no torch")
        sys.exit(0)
    from psclient.torch import ShardedEmbeddingBag
    emb = ShardedEmbeddingBag(c, SparseTable("wheel_t", 4, Initializer.constant(0.5)),
                              mode="sum", optimizer=Optimizer.sgd(1.0))
    emb(torch.tensor([[1, 2], [2, 3]])).sum().backward()
    rows = c.sparse_pull({"wheel_t": np.array([1, 2, 3])})["wheel_t"]
    assert np.array_equal(rows[:, 0], np.array([-0.5, -1.5, -0.5], np.float32)), rows
    print("embedding ok")
'''


def meson_version():
    with open(os.path.join(pstest.SOURCE_ROOT, "meson.build")) as f:
        return re.search(r"project\([^)]*?version:\s*'([^']+)'", f.read(), re.S).group(1)


def pip_wheel(out, offline, pkg=PKG):
    args = [PY, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
            "-w", out, pkg]
    if offline:
        args[4:4] = ["--no-build-isolation", "--no-index"]
    else:
        args[4:4] = ["--timeout", "15", "--retries", "1"]
    return subprocess.run(args, capture_output=True, text=True, timeout=600,
                          cwd=tempfile.gettempdir())


def check_wheel(out, how, want=None):
    """The one wheel in out: its descriptor set and version."""
    whl = glob.glob(os.path.join(out, "psclient-*.whl"))
    if len(whl) != 1:
        r.check(False, "build (%s): one wheel, got %s" % (how, whl))
        return None
    want = want or meson_version()
    with zipfile.ZipFile(whl[0]) as z:
        names = z.namelist()
        meta = next((z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA")), "")
        ver = z.read("psclient/_generated/VERSION").decode().strip() \
            if "psclient/_generated/VERSION" in names else ""
    r.check("psclient/_generated/ps.desc" in names and "Version: %s\n" % want in meta
            and ver == want and os.path.basename(whl[0]).startswith("psclient-%s-" % want),
            "build (%s): %s holds the proto descriptors and version %s (meson.build's)"
            % (how, os.path.basename(whl[0]), want))
    return whl[0]


def main():
    work = os.path.join(pstest.BUILD_ROOT, "wheel-test")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = os.path.join(work, "dist")
    p = pip_wheel(out, offline=True)
    if p.returncode != 0:
        r.check(False, "build: pip wheel ./python failed: %s" % (p.stderr or p.stdout)[-2000:])
        r.finish()
    whl = check_wheel(out, "offline")

    # The version follows meson.build's: a copy of the tree at another one.
    tree = os.path.join(work, "tree")
    shutil.copytree(PKG, os.path.join(tree, "python"),
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "_generated",
                                                  "__pycache__"))
    shutil.copytree(os.path.join(pstest.SOURCE_ROOT, "proto"), os.path.join(tree, "proto"))
    with open(os.path.join(pstest.SOURCE_ROOT, "meson.build")) as f:
        meson = f.read()
    with open(os.path.join(tree, "meson.build"), "w") as f:
        f.write(meson.replace("version: '%s'" % meson_version(), "version: '9.8.7'", 1))
    p = pip_wheel(os.path.join(work, "dist-987"), True, os.path.join(tree, "python"))
    if p.returncode != 0:
        r.check(False, "build: a tree at version 9.8.7: %s" % (p.stderr or p.stdout)[-500:])
    else:
        check_wheel(os.path.join(work, "dist-987"), "a copy with meson.build at 9.8.7", "9.8.7")

    iso = os.path.join(work, "dist-isolated")
    p = pip_wheel(iso, offline=False)
    if p.returncode == 0:
        check_wheel(iso, "isolated, PyPI's setuptools and grpcio-tools")
    else:
        last = (p.stderr or p.stdout).strip().splitlines()
        print("skip: build: the isolated `pip wheel ./python` needs PyPI, unreachable (%s)"
              % (last[-1] if last else "exit %d" % p.returncode), flush=True)

    venv = os.path.join(work, "venv")
    subprocess.run([PY, "-m", "venv", "--system-site-packages", venv], check=True, timeout=300)
    vpy = os.path.join(venv, "bin", "python")
    p = subprocess.run([vpy, "-m", "pip", "install", "--no-index", "--no-deps",
                        "--disable-pip-version-check", whl],
                       capture_output=True, text=True, timeout=600, cwd=work)
    r.check(p.returncode == 0, "install: pip install --no-index of the wheel into a fresh venv"
            "%s" % ("" if p.returncode == 0 else ": " + p.stderr[-500:]))
    psd = pstest.Daemon([pstest.psd_path(), "--data-dir", pstest.tmpdir("pywheel-"),
                         "--listen", "127.0.0.1:0", "--log-level", "warn"])
    away = tempfile.mkdtemp(prefix="pywheel-cwd-")
    try:
        t = subprocess.run([vpy, "-c", TRAIN, psd.address], capture_output=True, text=True,
                           timeout=300, cwd=away)
    finally:
        shutil.rmtree(away, ignore_errors=True)
        psd.stop()
    said = t.stdout.split("\n")
    r.check(t.returncode == 0 and "version %s" % meson_version() in said and "steps ok" in said,
            "install: from outside the source tree the venv's psclient %s trains two steps "
            "against psd%s" % (meson_version(), "" if t.returncode == 0 else ": " +
                               (t.stderr.strip().splitlines() or ["?"])[-1]))
    if "no torch" in said:
        print("skip: install: no torch for the embedding step", flush=True)
    else:
        r.check("embedding ok" in said, "install: a ShardedEmbeddingBag step through the wheel")
    r.finish()


if __name__ == "__main__":
    main()
