"""workerd's PJRT backend on XLA's CPU plugin (PyPI xla-cpu-pjrt, installed
into build/venv-pjrt by the first part that runs and reused after):

  grad    the PJRT gradients equal the CPU backend's within 1e-5 relative on
          fixed batches, for softmax, the MLP and the CNN
          (tests/pjrt/pjrt_grad.c);
  train   one epoch of workerd --device pjrt:PLUGIN against a real psd
          reaches the CPU backend's test accuracy within half a point, for
          softmax and the MLP, with as many CPU replicas as the plugin has
          devices (the same global batch);
  refuse  a missing plugin, files that are not plugins, a plugin of another
          API major version, one without devices, one whose client fails,
          --device tpu without libtpu: each one line on stderr and exit 2,
          nothing pushed.

Each part skips (exit 77) with one line when PyPI cannot be reached or the
dataset is missing."""
import fcntl
import glob
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402

WORKERD = os.path.join(pstest.BUILD_ROOT, "worker", "workerd")
PSCTL = os.path.join(pstest.BUILD_ROOT, "tools", "psctl")
FM = "/usr/share/datasets/fashion-mnist"
VENV = os.path.join(pstest.BUILD_ROOT, "venv-pjrt")
MLP = "mlp:784-256-256-10"


def skip(why):
    print("skip: %s" % why)
    sys.exit(77)


def cpu_plugin():
    """The path of xla_cpu_pjrt.so in build/venv-pjrt, installing it once
    (under a lock: the parts run in parallel), or (None, why)."""
    os.makedirs(pstest.BUILD_ROOT, exist_ok=True)
    with open(VENV + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        py = os.path.join(VENV, "bin", "python")
        ready = os.path.join(VENV, ".xla-cpu-pjrt-installed")
        if not os.path.exists(ready):
            if not os.path.exists(py):
                v = subprocess.run([sys.executable, "-m", "venv", VENV],
                                   capture_output=True, text=True, timeout=300)
                if v.returncode != 0:
                    return None, "python3 -m venv %s failed: %s" % (
                        VENV, (v.stderr or v.stdout).strip().splitlines()[-1:])
            why = pstest.pip_install(py, "xla-cpu-pjrt", 15)
            if why is not None:
                return None, why
            open(ready, "w").close()
    found = glob.glob(os.path.join(VENV, "lib", "python3*", "site-packages",
                                   "xla_plugins", "xla_cpu_pjrt", "xla_cpu_pjrt.so"))
    if not found:
        return None, "xla-cpu-pjrt is installed in %s but has no xla_cpu_pjrt.so" % VENV
    return found[0], None


def plugin_or_skip():
    so, why = cpu_plugin()
    if so is None:
        skip(why)
    return so


def workerd(*args, env=None, timeout=600):
    return subprocess.run([WORKERD, *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def variables(addr):
    """psctl list's lines for the psd at addr."""
    p = subprocess.run([PSCTL, "--server", addr, "list"], capture_output=True,
                       text=True, timeout=60)
    return [l for l in p.stdout.splitlines() if l.strip() and not l.startswith("NAME")] \
        if p.returncode == 0 else ["psctl list failed: %s" % p.stderr.strip()]


def part_grad(r):
    so = plugin_or_skip()
    grad = os.environ.get("PS_PJRT_GRAD") or os.path.join(
        pstest.BUILD_ROOT, "tests", "pjrt", "pjrt_grad")
    for spec, image, batches in (("softmax", "28x28x1", ["64", "7"]),
                                 (MLP, "28x28x1", ["128", "37", "1"]),
                                 ("cnn", "28x28x1", ["8", "3"]),
                                 ("cnn:4-5-6", "9x11x3", ["5"])):
        p = subprocess.run([grad, "--image", image, so, spec, *batches],
                           capture_output=True, text=True, timeout=600)
        rows = [l for l in p.stdout.splitlines() if l.startswith("batch")]
        worst = max((float(l.split(" rel ")[1].split()[0]) for l in rows
                     if " rel " in l), default=-1)
        r.check(p.returncode == 0 and rows and all(l.endswith(" ok") for l in rows),
                "%s on %s, batches %s: PJRT gradients and loss equal the CPU "
                "backend's within 1e-5 relative (worst %.2e over %d rows)%s" % (
                    spec, image, "/".join(batches), worst, len(rows),
                    "" if p.returncode == 0 else ": " + (p.stderr.strip()[-300:] or
                                                         "\n".join(rows))))


def part_train(r):
    so = plugin_or_skip()
    if not os.path.exists(os.path.join(FM, "train-images-idx3-ubyte.gz")):
        skip("%s is missing (apt-get install dataset-fashion-mnist)" % FM)
    # --batch 16 per replica: at a global batch of 64, one epoch of the MLP
    # is past the steep part of its curve, where float rounding alone (the
    # CPU backend with 1 or 2 BLAS threads) moves the accuracy by 0.3 points.
    for model in ("softmax", MLP):
        common = ["--epochs", "1", "--json", "--seed", "3", "--model", model,
                  "--batch", "16"]
        d = pstest.start_psd(pstest.tmpdir())
        pj = workerd("--ps", d.address, "--device", "pjrt:" + so, *common)
        d.stop()
        sp = pstest.json_summary(pj)
        nrep = sp.get("replicas", 1)
        d = pstest.start_psd(pstest.tmpdir())
        cpu = workerd("--ps", d.address, "--device", "cpu", "--replicas", str(nrep),
                      *common)
        d.stop()
        sc = pstest.json_summary(cpu)
        a, b = sp.get("test_accuracy", -1), sc.get("test_accuracy", -1)
        r.check(pj.returncode == 0 and cpu.returncode == 0 and a > 0.7 and
                abs(a - b) <= 0.005 and sp.get("steps") == sc.get("steps"),
                "%s, one epoch on %d PJRT device(s): test accuracy %.4f vs the CPU "
                "backend's %.4f (%s steps; %.0f vs %.0f examples/s)%s" % (
                    model, nrep, a, b, sp.get("steps"),
                    sp.get("examples_per_second", 0), sc.get("examples_per_second", 0),
                    "" if pj.returncode == 0 and cpu.returncode == 0 else
                    ": " + (pj.stderr + cpu.stderr).strip()[-400:]))


    # --local on the plugin: the same steps on the device, not on the CPU
    # (the plugin compiles its step), ending with the CPU's loss.
    common = ["--local", "--steps", "100", "--epochs", "0", "--limit", "6400", "--json",
              "--seed", "3"]
    pj = workerd("--device", "pjrt:" + so, "--log-level", "info", *common)
    cpu = workerd("--device", "cpu", *common)
    sp, sc = pstest.json_summary(pj), pstest.json_summary(cpu)
    r.check(pj.returncode == 0 and "pjrt: compiled the dense step" in pj.stderr and
            sp.get("replicas") == 1 and sp.get("steps") == 100 and
            abs(sp.get("final_loss", -1) - sc.get("final_loss", 1)) < 1e-3,
            "--local --device pjrt: trains on the plugin (loss %s, the CPU's %s)%s" % (
                sp.get("final_loss"), sc.get("final_loss"),
                "" if pj.returncode == 0 else ": " + pj.stderr.strip()[-300:]))


def refused(r, what, device, words, env=None, extra=()):
    d = pstest.start_psd(pstest.tmpdir())
    p = workerd("--ps", d.address, "--device", device, "--epochs", "1", *extra,
                env=env, timeout=120)
    left = variables(d.address)
    d.stop()
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    ok = p.returncode == 2 and len(lines) == 1 and lines[0].startswith("workerd: ") \
        and all(w in lines[0] for w in words) and not left
    r.check(ok, "%s: exit %d, %s, %d variable(s) on psd" % (
        what, p.returncode, lines if len(lines) != 1 else repr(lines[0]), len(left)))


def part_refuse(r):
    tmp = pstest.tmpdir("pjrt-test-")
    fake = os.environ.get("PS_PJRT_FAKE") or os.path.join(
        pstest.BUILD_ROOT, "tests", "pjrt", "libfake_pjrt.so")
    text = os.path.join(tmp, "plugin.so")
    with open(text, "w") as f:
        f.write("not a shared library\n")
    libm = glob.glob("/lib/x86_64-linux-gnu/libm.so.6") or glob.glob("/lib*/libm.so.6")
    env = dict(os.environ)
    refused(r, "a missing plugin", "pjrt:" + os.path.join(tmp, "nope.so"),
            ["nope.so", "No such file"])
    refused(r, "an executable (/bin/true)", "pjrt:/bin/true",
            ["/bin/true is not a loadable PJRT plugin"])
    refused(r, "a text file", "pjrt:" + text, ["is not a loadable PJRT plugin"])
    if libm:
        refused(r, "a library without GetPjrtApi (libm)", "pjrt:" + libm[0],
                ["is not a PJRT plugin", "GetPjrtApi"])
    refused(r, "a plugin of PJRT C API 1.0", "pjrt:" + fake,
            ["speaks PJRT C API 1.0", "needs major version 0"],
            env=dict(env, PS_FAKE_PJRT_VERSION="1.0"))
    refused(r, "a plugin without devices", "pjrt:" + fake,
            ["has no addressable device"])
    refused(r, "a plugin whose client fails", "pjrt:" + fake,
            ["PJRT_Client_Create: fake plugin: no TPU chips found"],
            env=dict(env, PS_FAKE_PJRT_FAIL="1"))
    notpu = {k: v for k, v in env.items() if k not in ("TPU_LIBRARY_PATH", "VIRTUAL_ENV")}
    notpu["HOME"] = tmp
    if not glob.glob("/usr/lib/python3*/*-packages/libtpu/libtpu.so") + \
            glob.glob("/usr/local/lib/python3*/dist-packages/libtpu/libtpu.so"):
        refused(r, "--device tpu without libtpu", "tpu", ["no libtpu.so", "pip install libtpu"],
                env=notpu)
    refused(r, "--device tpu with TPU_LIBRARY_PATH on a plugin without devices", "tpu",
            ["has no addressable device"], env=dict(notpu, TPU_LIBRARY_PATH=fake))
    # pip install --user libtpu: ~/.local/lib/python3.X/site-packages/libtpu.
    site = os.path.join(tmp, ".local", "lib", "python3.11", "site-packages", "libtpu")
    os.makedirs(site)
    os.symlink(fake, os.path.join(site, "libtpu.so"))
    refused(r, "--device tpu finds ~/.local's libtpu/libtpu.so (here a plugin without "
            "devices)", "tpu", [os.path.join(site, "libtpu.so"), "has no addressable device"],
            env=notpu)
    # Under the systemd units (PS_LIBTPU_SYSTEM_ONLY=1): neither ~/.local's
    # nor a virtualenv's libtpu is loaded; an explicit path still is.
    if not glob.glob("/usr/lib/python3*/*-packages/libtpu/libtpu.so") + \
            glob.glob("/usr/local/lib/python3*/dist-packages/libtpu/libtpu.so"):
        venv = os.path.join(tmp, "venv")
        vsite = os.path.join(venv, "lib", "python3.11", "site-packages", "libtpu")
        os.makedirs(vsite)
        os.symlink(fake, os.path.join(vsite, "libtpu.so"))
        refused(r, "PS_LIBTPU_SYSTEM_ONLY=1: ~/.local's and a virtualenv's libtpu not loaded",
                "tpu", ["no libtpu.so in the system's site-packages", "PS_LIBTPU_SYSTEM_ONLY"],
                env=dict(notpu, VIRTUAL_ENV=venv, PS_LIBTPU_SYSTEM_ONLY="1"))
    refused(r, "PS_LIBTPU_SYSTEM_ONLY=1 with TPU_LIBRARY_PATH (an explicit path) loads it",
            "tpu", ["has no addressable device"],
            env=dict(notpu, TPU_LIBRARY_PATH=fake, PS_LIBTPU_SYSTEM_ONLY="1"))


def main():
    part = sys.argv[1] if len(sys.argv) > 1 else ""
    parts = {"grad": part_grad, "train": part_train, "refuse": part_refuse}
    if part not in parts:
        print("usage: test_pjrt.py grad|train|refuse")
        sys.exit(2)
    r = pstest.Results("pjrt-" + part)
    parts[part](r)
    r.finish()


if __name__ == "__main__":
    main()
