"""make demo: a local cluster on loopback trains the MLP 784-256-256-10 on
Fashion-MNIST: pscoord, two psd shards, two workerd workers and one
evaluator, with a live progress line and a closing summary. Ctrl-C stops
every process.

The chief (worker 0) and the evaluator write TensorBoard event files into
the run's directory (tensorboard/); the demo prints the tensorboard command
for the run at its start (to watch it live) and at its end. Without --keep
the run's directory is removed at the end, but its event files are kept in
BUILD_DIR/tensorboard/demo-<time>, one run of TensorBoard per demo.

The workers reach the shards through their unix sockets and move the
tensors through shared memory (the closing "data path" line, from psd's
Stats); --tcp runs the same job over TCP.

Usage: demo.py BUILD_DIR [--epochs N] [--keep DIR] [--plaintext] [--tcp]
"""
import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--epochs", type=int, default=int(os.environ.get("DEMO_EPOCHS", "5")))
    ap.add_argument("--keep", help="keep the cluster's files in this directory")
    ap.add_argument("--plaintext", action="store_true",
                    help="no TLS and no tokens (by default every task uses mutual "
                         "TLS, and every call carries its role's token)")
    ap.add_argument("--tcp", action="store_true",
                    help="no psd --local-socket: the workers reach the shards over "
                         "TCP, as from another host (by default they use each "
                         "shard's unix socket and shared memory)")
    a = ap.parse_args()
    root = a.keep or tempfile.mkdtemp(prefix="psd-demo-")
    os.makedirs(root, exist_ok=True)
    logdir = os.path.join(os.path.abspath(root), "tensorboard")
    cluster = LocalCluster(a.build, root, num_ps=2, num_workers=2, evaluator=True,
                           epochs=a.epochs, checkpoint_every="5s", logdir=logdir,
                           tls=not a.plaintext, local_socket=not a.tcp)
    interrupted = False

    def on_signal(sig, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    t0 = time.monotonic()
    try:
        print("demo: starting pscoord, 2 psd shards, 1 evaluator and 2 workerd "
              "in %s" % root, flush=True)
        cluster.start()
        print("demo: coordinator at %s (%s); training MLP 784-256-256-10 for %d epochs"
              % (cluster.coord_addr, "plaintext" if a.plaintext else
                 "mutual TLS and tokens, certificates in %s, tokens in %s"
                 % (cluster.certs, cluster.token_dir), a.epochs), flush=True)
        print("demo: TensorBoard, live: %s" % tensorboard_command(a.build, logdir),
              flush=True)
        last = None
        while any(t.alive() for t in cluster.workers()):
            time.sleep(1.0)
            try:
                cs = cluster.cluster_state()
            except Exception:  # the coordinator is busy or restarting
                continue
            ws = [t for t in cs.tasks if t.role == 2]
            exps = sum(t.examples_per_second for t in ws if t.alive)
            loss = [t.loss for t in ws if t.alive and t.loss > 0]
            # A worker reports its rate once its first window has passed.
            line = ("step %6d  workers %d/%d  %7s examples/s  loss %s  test accuracy %s"
                    "  checkpoint %s" % (
                        cs.global_step, sum(1 for t in ws if t.alive), len(ws),
                        "%.0f" % exps if exps > 0 else "-",
                        "%.4f" % (sum(loss) / len(loss)) if loss else "  -   ",
                        "%.4f" % cs.eval_accuracy if cs.eval_step else "  -   ",
                        cs.last_checkpoint_step or "-"))
            if line != last:
                print(line, flush=True)
                last = line
        results = cluster.wait_workers()
        wall = time.monotonic() - t0
        # One more evaluation of the final parameters, then the state.
        time.sleep(1.5)
        cs = cluster.cluster_state()
        path = data_path(cluster, results)
    except KeyboardInterrupt:
        interrupted = True
        print("\ndemo: interrupted; stopping every process", flush=True)
        results, cs, wall, path = {}, None, time.monotonic() - t0, None
    finally:
        cluster.stop()
    if interrupted:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
        return 130
    bad = [i for i, (rc, s) in results.items() if rc != 0 or s is None]
    if bad:
        print("demo: worker(s) %s failed; logs in %s" % (bad, os.path.join(root, "logs")))
        return 1
    ex = sum(s["examples"] for _, s in results.values())
    acc = min(s["test_accuracy"] for _, s in results.values())
    print("demo: done in %.1f s: %d examples (%.0f examples/s over 2 workers), "
          "final test accuracy %.4f" % (wall, ex, ex / wall, acc))
    if path:
        print("demo: data path: %s" % path)
    if cs is not None and cs.last_checkpoint_step:
        print("demo: last checkpoint at step %d: %s" % (cs.last_checkpoint_step,
                                                       cs.last_checkpoint_path))
    if not a.keep:
        logdir = keep_events(a.build, logdir)
    print("demo: TensorBoard: %s" % tensorboard_command(a.build, logdir))
    if not a.keep:
        print("demo: (the cluster's files were in %s and are removed; pass --keep DIR "
              "to keep them)" % root)
        shutil.rmtree(root, ignore_errors=True)
    return 0 if acc >= 0.85 else 1


def data_path(cluster, results):
    """How the tensors went, from each psd's Stats: "shared memory (...)"
    when the workers reached the shards on their unix sockets (same host:
    localcluster gives each psd --local-socket), else "TCP"."""
    try:
        stats = [cluster.ps_stats(i) for i in range(cluster.num_ps)]
    except Exception as e:  # noqa: BLE001 - the line is informative only
        return "unknown (psd Stats: %s)" % e
    shards = sum(s.get("shm_shards", 0) for _, s in results.values() if s)
    moved = sum(s.shm_bytes for s in stats)
    if moved == 0:
        return "TCP (no psd received shared memory)"
    return ("shared memory: %.1f GB of gradients and values through it (%s), "
            "%d worker-shard pairs on a unix socket" % (
                moved / 1e9, ", ".join("ps%d %.1f GB" % (i, s.shm_bytes / 1e9)
                                       for i, s in enumerate(stats)), shards))


def tensorboard_command(build, logdir):
    """The command that shows logdir: the tensorboard of the build's
    virtualenv (made by the TensorBoard test) when it is there."""
    venv = os.path.join(os.path.abspath(build), "venv-tb", "bin", "tensorboard")
    return "%s --logdir %s" % (venv if os.path.exists(venv) else "tensorboard", logdir)


def keep_events(build, logdir):
    """Moves the run's event files out of its directory, which is about to
    be removed, into BUILD/tensorboard/demo-<time>; returns the directory
    that holds every demo's runs (TensorBoard shows each as its own run)."""
    runs = os.path.join(os.path.abspath(build), "tensorboard")
    os.makedirs(runs, exist_ok=True)
    dest = os.path.join(runs, time.strftime("demo-%Y%m%d-%H%M%S"))
    try:
        shutil.move(logdir, dest)
    except OSError as e:
        print("demo: the event files stay in %s: %s" % (logdir, e))
        return logdir
    return runs


if __name__ == "__main__":
    sys.exit(main())
