"""bench/train: training throughput and accuracy on Fashion-MNIST, workerd
against psd beside PyTorch at one thread, all measured in the same run.

Model MLP 784-256-256-10, SGD, learning rate 0.1, batch 64 and 256, one
compute thread everywhere:
  local  workerd --local: the same model and batches with no psd (the
         compute-only ceiling that communication overlap is judged by)
  (a)    one workerd against one psd on this host, given --ps 127.0.0.1:PORT
         as a user runs it: psd advertises its unix socket (psd.sock in its
         data directory) in Stats, and workerd switches to it and moves the
         tensors through shared memory (--shm auto); again with --shm off
         over TCP, and with --shm off over psd's unix socket (workerd --ps
         unix:PATH)
  (b)    one psd and two workerd (each half of the data)
  (c)    PyTorch (Debian's python3-torch), torch and OpenBLAS at 1 thread
  (e)    the PJRT backend (workerd --device pjrt:PLUGIN, XLA's CPU plugin
         from build/venv-pjrt, made by the pjrt tests, or --pjrt PATH): one
         workerd against one psd, the same model and global batch split
         over the plugin's devices (the plugin runs its own thread pool:
         it is not held to one thread), and the training step alone on one
         device beside the CPU backend's (tests/pjrt/pjrt_grad --time), with
         the step's compile time, once
  (d)    TensorFlow's ParameterServerStrategy, only with --tensorflow:
         one ps and one worker task and the coordinator on this host
         (bench/tf_ps.py, run by the python of the virtualenv named by
         --tf-python, tensorflow-cpu from PyPI: make bench-tf-venv)
  (f)    the strategies with 2 workers at one global batch (2 x --batch),
         --strategies: parameter-server sync and async (one psd) and
         multi_worker_mirrored (pscoord as rendezvous, Gloo's halving-
         doubling all-reduce over 127.0.0.1, no psd), beside one workerd (and psd)
         alone at the global batch (the accuracy to match); --only-strategies
         runs (f) alone
  (g)    half precision on the wire, --wire: one workerd against one psd
         over TCP (--shm off: shared memory is float32), float32, bf16 with
         error feedback, bf16 without it (the ablation) and fp16 with it,
         the same seed; test accuracy after --epochs, and the gap to float32
         in points (target: bf16 with feedback within 0.3); --only-wire
         runs (g) alone
  (h)    sparse rows in half precision, --sparse-dtype: the wide-and-deep
         model (workerd --model widedeep) against one psd, its tables'
         rows float32, then fp16 (--sparse-row-dtype), the same seed; test
         accuracy after --epochs and the gap in points (target: fp16 within
         0.3 of float32); --only-sparse-dtype runs (h) alone
Prints examples/s, ratios to PyTorch, the overlap gap to local, and test
accuracy after 1 and 5 epochs; --json prints one object per measurement.

Usage: /usr/bin/python3 bench/train.py BUILD_DIR [--quick] [--json]
                                       [--tensorflow [--only-tf]]
                                       [--strategies [--only-strategies]]
                                       [--wire [--only-wire]]
                                       [--sparse-dtype [--only-sparse-dtype]]
"""
import argparse
import glob
import json
import re
import os
import subprocess
import sys
import tempfile
import time

from idx import load_idx

HERE = os.path.dirname(os.path.abspath(__file__))
FM = "/usr/share/datasets/fashion-mnist"


def start_psd(build, data, unix=False):
    """psd on 127.0.0.1 port 0, or with unix=True on a unix socket in data
    (psd's --local-socket: what a worker on the same host uses, with
    shared memory unless --shm off)."""
    sock = "%s/psd.sock" % data
    extra = ["--local-socket", sock] if unix else []
    p = subprocess.Popen([os.path.join(build, "server", "psd"), "--data-dir", data,
                          "--listen", "127.0.0.1:0", "--log-level", "warn"] + extra,
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("PORT "):
        p.kill()
        raise RuntimeError("psd did not start")
    return p, "unix:" + sock if unix else "127.0.0.1:%s" % line.split()[1]


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def workerd(build, args, env=None):
    argv = [os.path.join(build, "worker", "workerd"), "--json", "--blas-threads", "1"] + args
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode != 0:
        raise RuntimeError("workerd %s failed: %s" % (" ".join(args), r.stderr.strip()))
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_ps(build, nworkers, batch, epochs, seed=1, extra=(), unix=False):
    with tempfile.TemporaryDirectory(prefix="bench-train-") as data:
        psd, addr = start_psd(build, data, unix)
        try:
            t0 = time.monotonic()
            procs = [subprocess.Popen(
                [os.path.join(build, "worker", "workerd"), "--json", "--blas-threads", "1",
                 "--ps", addr, "--batch", str(batch), "--epochs", str(epochs),
                 "--lr", "0.1", "--workers", str(nworkers), "--task-index", str(i),
                 "--seed", str(seed), "--progress", "0"] + list(extra),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(nworkers)]
            outs = [p.communicate(timeout=1800) for p in procs]
            compile_s = sum(float(x) for _, e in outs for x in
                            re.findall(r"pjrt: compiled .* in ([0-9.]+) s", e))
            wall = time.monotonic() - t0
            for p, (o, e) in zip(procs, outs):
                if p.returncode != 0:
                    raise RuntimeError("workerd failed: %s" % e.strip())
            res = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
        finally:
            stop(psd)
    ex = sum(r["examples"] for r in res)
    train_s = max(r["seconds"] for r in res)
    return {"examples_per_second": ex / train_s, "wall_seconds": wall,
            "test_accuracy": min(r["test_accuracy"] for r in res),
            "comm_wait_seconds": sum(r["comm_wait_seconds"] for r in res),
            "compute_seconds": sum(r["compute_seconds"] for r in res),
            "shm": all(r.get("shm_shards", 0) > 0 for r in res),
            "replicas": res[0].get("replicas", 1), "compile_seconds": compile_s}


def run_mwm(build, nworkers, batch, epochs, seed=1, extra=()):
    """(f) multi_worker_mirrored: a pscoord on 127.0.0.1:0 for the
    rendezvous and nworkers workerd; no psd."""
    with tempfile.TemporaryDirectory(prefix="bench-mwm-") as root:
        coord = subprocess.Popen(
            [os.path.join(build, "coordinator", "pscoord"), "--state-dir",
             os.path.join(root, "coord"), "--listen", "127.0.0.1:0", "--metrics-listen",
             "off", "--log-level", "warn"], stdout=subprocess.PIPE, text=True)
        line = coord.stdout.readline()
        if not line.startswith("PORT "):
            coord.kill()
            raise RuntimeError("pscoord did not start")
        try:
            t0 = time.monotonic()
            procs = [subprocess.Popen(
                [os.path.join(build, "worker", "workerd"), "--json", "--blas-threads", "1",
                 "--strategy", "multi_worker_mirrored", "--coordinator",
                 "127.0.0.1:%s" % line.split()[1], "--batch", str(batch), "--epochs",
                 str(epochs), "--lr", "0.1", "--workers", str(nworkers),
                 "--task-index", str(i), "--seed", str(seed), "--progress", "0",
                 "--metrics-listen", "off"] + list(extra),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(nworkers)]
            outs = [p.communicate(timeout=1800) for p in procs]
            wall = time.monotonic() - t0
            for p, (o, e) in zip(procs, outs):
                if p.returncode != 0:
                    raise RuntimeError("workerd (multi_worker_mirrored) failed: %s"
                                       % e.strip()[-500:])
            res = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
        finally:
            stop(coord)
    ex = sum(r["examples"] for r in res)
    return {"examples_per_second": ex / max(r["seconds"] for r in res),
            "wall_seconds": wall,
            "test_accuracy": min(r["test_accuracy"] for r in res)}


def run_strategies(build, batch, epochs, env1):
    """(f): 2 workers at global batch 2 x batch, by strategy, and one
    worker alone at that global batch."""
    one = run_ps(build, 1, 2 * batch, epochs)  # --local does not evaluate
    sync = run_ps(build, 2, batch, epochs, extra=["--consistency", "sync"])
    # The same over psd's unix socket and shared memory: the fastest a
    # parameter-server sync job gets, and only with psd on the workers' host.
    shm = run_ps(build, 2, batch, epochs, extra=["--consistency", "sync"], unix=True)
    if not shm["shm"]:
        raise RuntimeError("(f): the workers did not take shared memory with psd")
    asyn = run_ps(build, 2, batch, epochs)
    mwm = run_mwm(build, 2, batch, epochs)
    row = {"f_global_batch": 2 * batch, "f_epochs": epochs}
    for k, r in (("one", one), ("ps_sync", sync), ("ps_sync_shm", shm), ("ps_async", asyn),
                 ("mwm", mwm)):
        row["f_%s_examples_per_second" % k] = r["examples_per_second"]
        row["f_%s_test_accuracy" % k] = r["test_accuracy"]
    row["f_mwm_vs_ps_sync"] = mwm["examples_per_second"] / sync["examples_per_second"]
    row["f_mwm_vs_ps_sync_shm"] = mwm["examples_per_second"] / shm["examples_per_second"]
    row["f_mwm_accuracy_gap"] = mwm["test_accuracy"] - one["test_accuracy"]
    return row


def print_strategies(r):
    g, e = r["f_global_batch"], r["f_epochs"]
    print("(f) strategies, global batch %d (2 workers x %d), %d epoch(s), MLP "
          "784-256-256-10, SGD lr 0.1, one thread per worker" % (g, g // 2, e))
    print("    %-44s %12s %10s" % ("configuration", "examples/s", "acc@%d" % e))
    for k, name in (("one", "1 workerd + 1 psd alone, batch %d" % g),
                    ("ps_sync", "parameter_server sync: 2 workerd + 1 psd"),
                    ("ps_sync_shm", "  the same, shared memory (psd on their host)"),
                    ("ps_async", "parameter_server async: 2 workerd + 1 psd"),
                    ("mwm", "multi_worker_mirrored: 2 workerd, Gloo h-d")):
        print("    %-44s %12.0f %10.4f" % (name, r["f_%s_examples_per_second" % k],
                                           r["f_%s_test_accuracy" % k]))
    print("    multi_worker_mirrored / ps sync: %.2fx examples/s (target >= 1; %.2fx of "
          "ps sync through shared memory); accuracy %+.2f points from one worker "
          "(target within 1)" % (r["f_mwm_vs_ps_sync"], r["f_mwm_vs_ps_sync_shm"],
                                 100 * r["f_mwm_accuracy_gap"]), flush=True)


def run_variants(build, batch, epochs, tag, variants, common=()):
    """One workerd and one psd per (key, workerd flags) of variants, the
    same seed: examples/s and test accuracy as TAG_KEY_..., and each one's
    gap to the first's accuracy in points (TAG_KEY_gap_points)."""
    row = {"%s_batch" % tag: batch, "%s_epochs" % tag: epochs}
    for k, extra in variants:
        r = run_ps(build, 1, batch, epochs, extra=list(common) + extra)
        row["%s_%s_examples_per_second" % (tag, k)] = r["examples_per_second"]
        row["%s_%s_test_accuracy" % (tag, k)] = r["test_accuracy"]
    base = row["%s_%s_test_accuracy" % (tag, variants[0][0])]
    for k, _ in variants[1:]:
        row["%s_%s_gap_points" % (tag, k)] = 100 * (row["%s_%s_test_accuracy" % (tag, k)] -
                                                    base)
    return row


def print_variants(r, tag, title, names, target):
    """run_variants' row: title (with the batch and epochs), one line per
    (key, name), then whether target (key, name) is within 0.3 points."""
    e = r["%s_epochs" % tag]
    print(title % (r["%s_batch" % tag], e))
    print("    %-40s %12s %10s %12s" % ("configuration", "examples/s", "acc@%d" % e,
                                        "vs f32"))
    for k, name in names:
        gap = r.get("%s_%s_gap_points" % (tag, k))
        print("    %-40s %12.0f %10.4f %12s" % (
            name, r["%s_%s_examples_per_second" % (tag, k)],
            r["%s_%s_test_accuracy" % (tag, k)], "-" if gap is None else "%+.2f pt" % gap))
    gap = r["%s_%s_gap_points" % (tag, target[0])]
    print("    %s: %+.2f points from float32 (target within 0.3): %s"
          % (target[1], gap, "MET" if abs(gap) <= 0.3 else "MISSED"), flush=True)


def run_wire(build, batch, epochs):
    """(g): the MLP over TCP with each wire dtype, one worker, one psd."""
    return run_variants(build, batch, epochs, "g", [
        ("f32", []), ("bf16_ef", ["--wire-dtype", "bf16"]),
        ("bf16_no_ef", ["--wire-dtype", "bf16", "--no-error-feedback"]),
        ("fp16_ef", ["--wire-dtype", "fp16"])], common=["--shm", "off"])


def print_wire(r):
    print_variants(r, "g", "(g) half precision on the wire, MLP 784-256-256-10, SGD lr 0.1, "
                   "batch %d, %d epoch(s), 1 workerd + 1 psd over TCP (--shm off)",
                   (("f32", "float32"), ("bf16_ef", "bf16, error feedback"),
                    ("bf16_no_ef", "bf16, no error feedback (ablation)"),
                    ("fp16_ef", "fp16, error feedback")),
                   ("bf16_ef", "bf16 with error feedback"))


def run_sparse_dtype(build, batch, epochs):
    """(h): wide-and-deep with float32, then fp16 sparse rows."""
    return run_variants(build, batch, epochs, "h", [
        (k, ["--model", "widedeep", "--sparse-row-dtype", k]) for k in ("f32", "fp16")])


def print_sparse_dtype(r):
    print_variants(r, "h", "(h) sparse rows in half precision, widedeep (E 16, H 64), "
                   "batch %d, %d epoch(s), 1 workerd + 1 psd",
                   (("f32", "float32 rows"), ("fp16", "fp16 rows (--sparse-row-dtype fp16)")),
                   ("fp16", "fp16 rows"))


def pjrt_plugin(build, given):
    """The PJRT plugin to bench: --pjrt, else the CPU plugin in
    build/venv-pjrt; None for --pjrt none or when there is none."""
    if given:
        return None if given == "none" else given
    found = glob.glob(os.path.join(build, "venv-pjrt", "lib", "python3*", "site-packages",
                                   "xla_plugins", "xla_cpu_pjrt", "xla_cpu_pjrt.so"))
    return found[0] if found else None


def run_pjrt(build, so, batch, env):
    """(e): workerd on the plugin against psd (the same global batch over its
    devices), and the step alone on one device beside the CPU backend's."""
    probe = run_ps(build, 1, batch, 1, extra=["--device", "pjrt:" + so, "--steps", "1"])
    ndev = probe["replicas"]
    per = max(1, batch // ndev)
    e2e = run_ps(build, 1, per, 1, extra=["--device", "pjrt:" + so, "--log-level", "info"])
    grad = os.path.join(build, "tests", "pjrt", "pjrt_grad")
    r = subprocess.run([grad, "--time", "200", so, "mlp:784-256-256-10", str(batch)],
                       capture_output=True, text=True, timeout=1800, env=env)
    step = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
    return {"e_devices": ndev, "e_batch_per_device": per,
            "e_examples_per_second": e2e["examples_per_second"],
            "e_test_accuracy_1": e2e["test_accuracy"],
            "e_compile_seconds": e2e["compile_seconds"],
            "e_step_examples_per_second": step.get("pjrt_examples_per_s"),
            "e_step_compile_seconds": step.get("pjrt_compile_s"),
            "cpu_step_examples_per_second": step.get("cpu_examples_per_s")}


def run_torch(batch, epochs):
    """Returns (examples/s over the first epoch, accuracy after 1 and after
    `epochs` epochs)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import numpy as np
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(1)
    x = torch.from_numpy((load_idx(os.path.join(FM, "train-images-idx3-ubyte.gz"))
                          .reshape(-1, 784) / np.float32(255)).astype(np.float32))
    y = torch.from_numpy(load_idx(os.path.join(FM, "train-labels-idx1-ubyte.gz"))
                         .astype(np.int64))
    xt = torch.from_numpy((load_idx(os.path.join(FM, "t10k-images-idx3-ubyte.gz"))
                           .reshape(-1, 784) / np.float32(255)).astype(np.float32))
    yt = torch.from_numpy(load_idx(os.path.join(FM, "t10k-labels-idx1-ubyte.gz"))
                          .astype(np.int64))
    m = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 10))
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.xavier_uniform_(layer.weight)
            torch.nn.init.zeros_(layer.bias)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    lossf = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)

    def accuracy():
        with torch.no_grad():
            return float((m(xt).argmax(1) == yt).float().mean())

    rate, acc1 = None, None
    steps = len(x) // batch
    for epoch in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        t0 = time.perf_counter()
        for i in range(steps):
            idx = perm[i * batch:(i + 1) * batch]
            opt.zero_grad()
            loss = lossf(m(x[idx]), y[idx])
            loss.backward()
            opt.step()
        dt = time.perf_counter() - t0
        if epoch == 0:
            rate = steps * batch / dt
            acc1 = accuracy()
    return rate, acc1, accuracy()


def run_tf(tf_python, batch, epochs, env):
    """(d): bench/tf_ps.py under the TensorFlow virtualenv; its JSON object."""
    r = subprocess.run([tf_python, os.path.join(HERE, "tf_ps.py"), "--batch", str(batch),
                        "--epochs", str(epochs), "--data", FM, "--timeout", "1700"],
                       capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode != 0 or not r.stdout.strip():
        err = [l for l in r.stderr.splitlines()
               if l.strip() and not l.startswith(("I0000 ", "WARNING: All log"))]
        raise RuntimeError("bench/tf_ps.py --batch %d failed (rc %d): %s"
                           % (batch, r.returncode, "\n".join(err[-15:])))
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--quick", action="store_true", help="batch 64 only, 1 epoch")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--cnn", action="store_true",
                    help="also train the CNN (Adam, lr 0.001, 5 epochs, ~2.5 min) "
                         "against one psd and report its test accuracy")
    ap.add_argument("--pjrt", default="",
                    help="PJRT plugin for (e) (default: XLA's CPU plugin in BUILD/venv-pjrt, "
                         "made by `meson test --suite pjrt`; none: skip (e))")
    ap.add_argument("--tensorflow", action="store_true",
                    help="also run TensorFlow's ParameterServerStrategy (d)")
    ap.add_argument("--tf-python", default=os.path.join(HERE, "..", ".venv-tf", "bin", "python"),
                    help="python of the virtualenv with tensorflow-cpu (default .venv-tf, "
                         "made by make bench-tf-venv)")
    ap.add_argument("--only-tf", action="store_true",
                    help="with --tensorflow: run (d) alone, none of local/(a)/(b)/(c)")
    ap.add_argument("--strategies", action="store_true",
                    help="also run (f): PS sync, PS async and multi_worker_mirrored with "
                         "2 workers at global batch 2 x 64, and one worker alone")
    ap.add_argument("--only-strategies", action="store_true",
                    help="run (f) alone")
    ap.add_argument("--wire", action="store_true",
                    help="also run (g): float32, bf16 with and without error feedback "
                         "and fp16 on the wire, batch 64, --epochs")
    ap.add_argument("--only-wire", action="store_true", help="run (g) alone")
    ap.add_argument("--sparse-dtype", action="store_true",
                    help="also run (h): wide-and-deep with float32 and fp16 sparse rows, "
                         "batch 64, --epochs")
    ap.add_argument("--only-sparse-dtype", action="store_true", help="run (h) alone")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    if not os.path.exists(os.path.join(FM, "train-images-idx3-ubyte.gz")):
        print("bench/train: %s is missing (apt-get install dataset-fashion-mnist)" % FM)
        return 1
    if a.only_tf and not a.tensorflow:
        ap.error("--only-tf needs --tensorflow")
    if a.tensorflow and not os.access(a.tf_python, os.X_OK):
        print("bench/train: --tensorflow needs tensorflow-cpu in a virtualenv, and %s is "
              "missing: run `make bench-tf-venv` (or pass --tf-python)"
              % os.path.normpath(a.tf_python))
        return 1
    epochs = 1 if a.quick else a.epochs
    batches = [64] if a.quick else [64, 256]
    env1 = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    for on, only, run, show in ((a.sparse_dtype, a.only_sparse_dtype, run_sparse_dtype,
                                 print_sparse_dtype),
                                (a.wire, a.only_wire, run_wire, print_wire)):
        if on or only:
            row = run(build, 64, epochs)
            if a.json:
                print(json.dumps(row), flush=True)
            else:
                show(row)
            if only:
                return 0
    if a.strategies or a.only_strategies:
        f = run_strategies(build, 64, epochs, env1)
        if a.json:
            print(json.dumps(f), flush=True)
        else:
            print_strategies(f)
        if a.only_strategies:
            return 0
    rows = []
    for batch in batches:
        if a.only_tf:
            row = {"batch": batch}
            add_tf(row, run_tf(a.tf_python, batch, epochs, env1), epochs)
            rows.append(row)
            if a.json:
                print(json.dumps(row), flush=True)
            continue
        local = workerd(build, ["--local", "--batch", str(batch), "--epochs", "1",
                                "--progress", "0"], env1)
        a1 = run_ps(build, 1, batch, 1)
        at = run_ps(build, 1, batch, 1, extra=["--shm", "off"])
        au = run_ps(build, 1, batch, 1, unix=True, extra=["--shm", "off"])
        ac = run_ps(build, 1, batch, 1, extra=["--concurrent-pull"])
        asu = run_ps(build, 1, batch, 1, extra=["--self-update", "off"])
        a5 = run_ps(build, 1, batch, epochs) if epochs > 1 else a1
        b1 = run_ps(build, 2, batch, 1)
        try:
            t_rate, t_acc1, t_acc5 = run_torch(batch, epochs)
        except ImportError:
            t_rate = t_acc1 = t_acc5 = None
        row = {"batch": batch,
               "local_examples_per_second": local["examples_per_second"],
               "a_examples_per_second": a1["examples_per_second"],
               "a_test_accuracy_1": a1["test_accuracy"],
               "a_test_accuracy_%d" % epochs: a5["test_accuracy"],
               "a_overlap_gap": 1 - a1["examples_per_second"] / local["examples_per_second"],
               "a_shared_memory": a1["shm"],
               "a_tcp_examples_per_second": at["examples_per_second"],
               "a_tcp_test_accuracy_1": at["test_accuracy"],
               "a_tcp_overlap_gap": 1 - at["examples_per_second"] / local["examples_per_second"],
               "a_unix_examples_per_second": au["examples_per_second"],
               "a_unix_test_accuracy_1": au["test_accuracy"],
               "a_unix_overlap_gap": 1 - au["examples_per_second"] / local["examples_per_second"],
               "a_concurrent_pull_examples_per_second": ac["examples_per_second"],
               "a_concurrent_pull_test_accuracy_1": ac["test_accuracy"],
               "a_stale_examples_per_second": asu["examples_per_second"],
               "a_stale_test_accuracy_1": asu["test_accuracy"],
               "b_examples_per_second": b1["examples_per_second"],
               "b_test_accuracy_1": b1["test_accuracy"],
               "torch_examples_per_second": t_rate,
               "torch_test_accuracy_1": t_acc1,
               "torch_test_accuracy_%d" % epochs: t_acc5}
        if t_rate:
            row["a_vs_torch"] = a1["examples_per_second"] / t_rate
            row["a_unix_vs_torch"] = au["examples_per_second"] / t_rate
            row["a_tcp_vs_torch"] = at["examples_per_second"] / t_rate
            row["b_vs_torch"] = b1["examples_per_second"] / t_rate
        so = pjrt_plugin(build, a.pjrt)
        if so:
            row.update(run_pjrt(build, so, batch, env1))
        if a.tensorflow:
            add_tf(row, run_tf(a.tf_python, batch, epochs, env1), epochs)
        rows.append(row)
        if a.json:
            print(json.dumps(row), flush=True)
    if a.cnn:
        with tempfile.TemporaryDirectory(prefix="bench-cnn-") as data:
            psd, addr = start_psd(build, data)
            try:
                cnn = workerd(build, ["--ps", addr, "--model", "cnn", "--epochs", "5",
                                      "--optimizer", "adam", "--lr", "0.001",
                                      "--progress", "0"], env1)
            finally:
                stop(psd)
        print("bench/train: CNN (conv32-pool-conv64-pool-dense128-dense10), Adam "
              "lr 0.001, batch 64, 5 epochs against one psd: %.0f examples/s, test "
              "accuracy %.4f (target >= 0.90)" % (cnn["examples_per_second"],
                                                   cnn["test_accuracy"]), flush=True)
    if a.json:
        return 0
    print("bench/train: MLP 784-256-256-10, SGD lr 0.1, one compute thread, "
          "Fashion-MNIST (60000 train, 10000 test)")
    if a.tensorflow and rows:
        print("(d): TensorFlow %s, one ps and one worker task and the coordinator on "
              "127.0.0.1; its examples/s over all %d epoch(s) less the first step"
              % (rows[0]["d_tensorflow_version"], epochs))
    print("%-6s %-34s %12s %10s %9s %9s" % ("batch", "configuration", "examples/s",
                                           "vs torch", "acc@1", "acc@%d" % epochs))
    for r in rows:
        t = r.get("torch_examples_per_second")
        def vs(v):
            return "%.2fx" % (v / t) if t else "-"
        if a.only_tf:
            print_tf(r, epochs, vs)
            continue
        print("%-6d %-34s %12.0f %10s %9s %9s" % (r["batch"], "workerd --local (no psd)",
              r["local_examples_per_second"], vs(r["local_examples_per_second"]), "-", "-"))
        print("%-6d %-34s %12.0f %10s %9.4f %9.4f" % (
              r["batch"], "(a) 1 workerd + 1 psd" +
              (" (shared mem)" if r["a_shared_memory"] else " (NO shm!)"),
              r["a_examples_per_second"], vs(r["a_examples_per_second"]),
              r["a_test_accuracy_1"], r["a_test_accuracy_%d" % epochs]))
        print("%-6d %-34s %12.0f %10s %9.4f %9s" % (r["batch"], "(a) ... --shm off: loopback TCP",
              r["a_tcp_examples_per_second"], vs(r["a_tcp_examples_per_second"]),
              r["a_tcp_test_accuracy_1"], "-"))
        print("%-6d %-34s %12.0f %10s %9.4f %9s" % (r["batch"], "(a) ... --shm off: unix socket",
              r["a_unix_examples_per_second"], vs(r["a_unix_examples_per_second"]),
              r["a_unix_test_accuracy_1"], "-"))
        print("%-6d %-34s %12.0f %10s %9.4f %9s" % (r["batch"], "(a) ... --self-update off",
              r["a_stale_examples_per_second"],
              vs(r["a_stale_examples_per_second"]),
              r["a_stale_test_accuracy_1"], "-"))
        print("%-6d %-34s %12.0f %10s %9.4f %9s" % (r["batch"], "(a) ... with --concurrent-pull",
              r["a_concurrent_pull_examples_per_second"],
              vs(r["a_concurrent_pull_examples_per_second"]),
              r["a_concurrent_pull_test_accuracy_1"], "-"))
        print("%-6d %-34s %12.0f %10s %9.4f %9s" % (r["batch"], "(b) 2 workerd + 1 psd",
              r["b_examples_per_second"], vs(r["b_examples_per_second"]),
              r["b_test_accuracy_1"], "-"))
        if t:
            print("%-6d %-34s %12.0f %10s %9.4f %9.4f" % (r["batch"], "(c) PyTorch, 1 thread", t,
                  "1.00x", r["torch_test_accuracy_1"], r["torch_test_accuracy_%d" % epochs]))
        else:
            print("%-6d %-34s %12s" % (r["batch"], "(c) PyTorch", "not installed"))
        if r.get("e_devices"):
            print("%-6d %-34s %12.0f %10s %9.4f %9s" % (
                  r["batch"], "(e) ... --device pjrt, %d dev x %d" % (
                      r["e_devices"], r["e_batch_per_device"]),
                  r["e_examples_per_second"], vs(r["e_examples_per_second"]),
                  r["e_test_accuracy_1"], "-"))
            if r.get("e_step_examples_per_second"):
                print("%-6d %-34s %12.0f %10s %9s %9s" % (
                      r["batch"], "(e) step alone: CPU backend",
                      r["cpu_step_examples_per_second"],
                      vs(r["cpu_step_examples_per_second"]), "-", "-"))
                print("%-6d %-34s %12.0f %10s %9s %9s" % (
                      r["batch"], "(e) step alone: PJRT, 1 device",
                      r["e_step_examples_per_second"],
                      vs(r["e_step_examples_per_second"]), "-", "-"))
            print("%-6s (e) the step's compile time, once: %.2f s for batch %d (step "
                  "alone); %.2f s in workerd (batch %d and the last, smaller one)"
                  % ("", r.get("e_step_compile_seconds") or 0, r["batch"],
                     r["e_compile_seconds"], r["e_batch_per_device"]))
        else:
            print("%-6d %-34s %12s" % (r["batch"], "(e) --device pjrt",
                                       "no plugin (run the pjrt tests, or --pjrt)"))
        if a.tensorflow:
            print_tf(r, epochs, vs)
        print("%-6s overlap gap of (a) to local: %.1f%% (target < 15%%); with --shm off "
              "%.1f%% over TCP, %.1f%% over the unix socket"
              % ("", 100 * r["a_overlap_gap"], 100 * r["a_tcp_overlap_gap"],
                 100 * r["a_unix_overlap_gap"]))
        if a.tensorflow:
            print("%-6s (a) ahead of (d): %.2fx (examples/s of (a) over (d))"
                  % ("", r["a_vs_d"]))
    return 0


def add_tf(row, d, epochs):
    row["d_examples_per_second"] = d["examples_per_second"]
    row["d_first_epoch_examples_per_second"] = d["first_epoch_examples_per_second"]
    row["d_test_accuracy_1"] = d["test_accuracy_1"]
    row["d_test_accuracy_%d" % epochs] = d["test_accuracy_%d" % epochs]
    row["d_tensorflow_version"] = d["tensorflow"]
    if row.get("a_examples_per_second"):
        row["a_vs_d"] = row["a_examples_per_second"] / d["examples_per_second"]
    if row.get("torch_examples_per_second"):
        row["d_vs_torch"] = d["examples_per_second"] / row["torch_examples_per_second"]


def print_tf(r, epochs, vs):
    print("%-6d %-34s %12.0f %10s %9.4f %9.4f" % (
        r["batch"], "(d) TF ParameterServerStrategy", r["d_examples_per_second"],
        vs(r["d_examples_per_second"]), r["d_test_accuracy_1"],
        r["d_test_accuracy_%d" % epochs]))


if __name__ == "__main__":
    sys.exit(main())
