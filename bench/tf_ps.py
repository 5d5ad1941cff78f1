"""bench/tf_ps: case (d) of bench/train.py, TensorFlow's own
ParameterServerStrategy on the same benchmark.

Run under the tensorflow-cpu virtualenv (make bench-tf-venv), not Debian's
python. Starts on 127.0.0.1, on free ports, one ps task and one worker task
as separate processes (tf.distribute.Server each), and the coordinator
(chief) here with tf.distribute.experimental.ParameterServerStrategy and
tf.distribute.coordinator.ClusterCoordinator. It trains the MLP
784-256-256-10 (softmax cross-entropy from logits, plain SGD lr 0.1, Xavier
uniform weights and zero biases as the PyTorch case) on Fashion-MNIST with a
tf.function step scheduled through the coordinator, reading a per-worker
dataset (pixels / 255 as float32, reshuffled each epoch, the last partial
batch dropped). One compute thread: TF intra-op threads 1 in every process,
inter-op threads 1 in the coordinator and the ps and 2 in the worker (see
INTER_OP), the worker pinned to one CPU, tf.data's private pool 1,
OMP/OpenBLAS 1.

Prints one JSON object on stdout: examples_per_second (all training steps
but the first, which carries the tracing and the dataset's start, with the
evaluation after epoch 1 left out), first_epoch_examples_per_second,
test_accuracy_1, test_accuracy_N (after the last epoch, the 10k test set,
computed here from the variables read back from the ps), steps, seconds,
tensorflow. The ps and worker processes are always ended, on error too.

Usage: .venv-tf/bin/python bench/tf_ps.py [--batch 64] [--epochs 5]
       [--data DIR] [--seed 1] [--worker-cpu N] [--timeout 1800]
"""
import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from idx import load_idx

FM = "/usr/share/datasets/fashion-mnist"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
              "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
os.environ.update(ONE_THREAD)


# Inter-op threads per process. The worker needs 2: with one, the function
# the coordinator sends it waits forever, as a function call op holds the
# only inter-op thread while its body waits for one (TensorFlow issue
# 38969). Each op still runs on one thread (intra-op 1), and the worker is
# pinned to one CPU (--worker-cpu), so it computes on one core at a time.
INTER_OP = {"chief": 1, "ps": 1, "worker": 2}


def one_thread_tf(role):
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(INTER_OP[role])
    return tf


def serve(cluster, job, index, cpu):
    """A ps or worker task: an in-process tf.distribute.Server until killed."""
    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})
    tf = one_thread_tf(job)
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                      inter_op_parallelism_threads=INTER_OP[job])
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job,
                                  task_index=index, protocol="grpc", config=config,
                                  start=True)
    print("READY", flush=True)
    server.join()


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def die_with_parent():
    # SIGKILL this child when the process that started it dies, however it dies.
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Cluster:
    """The ps and worker processes; stop() ends them within a few seconds."""

    def __init__(self, logdir, worker_cpu):
        ps, worker = free_ports(2)
        self.spec = {"ps": ["127.0.0.1:%d" % ps], "worker": ["127.0.0.1:%d" % worker]}
        self.procs = []
        self.logs = []
        for job in ("ps", "worker"):
            log = open(os.path.join(logdir, job + ".log"), "w+")
            self.logs.append((job, log))
            self.procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--serve", job, "0",
                 "--cluster", json.dumps(self.spec),
                 "--worker-cpu", str(worker_cpu if job == "worker" else -1)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                text=True, env=dict(os.environ, TF_NUM_INTEROP_THREADS=str(INTER_OP[job])),
                preexec_fn=die_with_parent))

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        for (job, _), p in zip(self.logs, self.procs):
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError("%s task did not start in %ds%s" % (job, timeout, self.tail()))
                r, _, _ = select.select([p.stdout], [], [], min(left, 1.0))
                if r:
                    line = p.stdout.readline()
                    if line.strip() == "READY":
                        break
                    if not line:
                        raise RuntimeError("%s task exited (rc %s)%s" % (job, p.wait(), self.tail()))

    def tail(self):
        out = []
        for job, log in self.logs:
            log.flush()
            log.seek(0)
            lines = [l for l in log.read().splitlines()
                     if l.strip() and not l.startswith(("I0000 ", "WARNING: All log"))][-5:]
            out.extend("\n  [%s] %s" % (job, l) for l in lines)
        return "".join(out)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


def train(a, cluster):
    import numpy as np
    tf = one_thread_tf("chief")

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.spec), rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    # The model as the PyTorch case: Xavier uniform weights, zero biases.
    rng = np.random.RandomState(a.seed)
    sizes = [784, 256, 256, 10]
    with strategy.scope():
        params = []
        for i, o in zip(sizes[:-1], sizes[1:]):
            lim = np.sqrt(6.0 / (i + o))
            params.append(tf.Variable(rng.uniform(-lim, lim, (i, o)).astype(np.float32)))
            params.append(tf.Variable(np.zeros(o, np.float32)))

    # The data set is read and decoded on the worker itself: the gzip IDX
    # files through tf.io, so no 47 MB constant travels in the graph.
    train_images = os.path.join(a.data, "train-images-idx3-ubyte.gz")
    train_labels = os.path.join(a.data, "train-labels-idx1-ubyte.gz")
    batch, seed = a.batch, a.seed

    def dataset_fn():
        def idx(path, header, shape):
            raw = tf.io.decode_compressed(tf.io.read_file(path), "GZIP")
            return tf.reshape(tf.io.decode_raw(tf.strings.substr(raw, header, -1), tf.uint8),
                              shape)
        x = idx(train_images, 16, [-1, 784])
        y = idx(train_labels, 8, [-1])
        ds = (tf.data.Dataset.from_tensor_slices((x, y))
              .shuffle(60000, seed=seed, reshuffle_each_iteration=True)
              .batch(batch, drop_remainder=True)
              .map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, tf.cast(y, tf.int32)))
              .repeat())
        opts = tf.data.Options()
        opts.threading.private_threadpool_size = 1
        opts.threading.max_intra_op_parallelism = 1
        opts.autotune.enabled = False
        return ds.with_options(opts)

    per_worker = iter(coordinator.create_per_worker_dataset(dataset_fn))
    lr = tf.constant(0.1, tf.float32)

    def forward(x):
        w1, b1, w2, b2, w3, b3 = params
        h = tf.nn.relu(tf.matmul(x, w1) + b1)
        h = tf.nn.relu(tf.matmul(h, w2) + b2)
        return tf.matmul(h, w3) + b3

    @tf.function
    def train_step(iterator):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=forward(x)))
            for v, g in zip(params, tape.gradient(loss, params)):
                v.assign_sub(lr * g)
            return loss
        x, y = next(iterator)
        return strategy.run(step_fn, args=(x, y))

    xt = (load_idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz")).reshape(-1, 784)
          / np.float32(255)).astype(np.float32)
    yt = load_idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)

    def accuracy():
        w1, b1, w2, b2, w3, b3 = [v.numpy() for v in params]
        h = np.maximum(xt @ w1 + b1, 0)
        h = np.maximum(h @ w2 + b2, 0)
        return float(((h @ w3 + b3).argmax(1) == yt).mean())

    steps = 60000 // a.batch
    # The first step carries the tracing and the dataset's start: run it
    # alone, then time every step after it.
    loss = coordinator.schedule(train_step, args=(per_worker,)).fetch()
    train_s = 0.0
    acc1 = None
    first_epoch_rate = None
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        for _ in range(steps - 1 if epoch == 0 else steps):
            last = coordinator.schedule(train_step, args=(per_worker,))
        coordinator.join()
        dt = time.perf_counter() - t0
        train_s += dt
        loss = last.fetch()
        if epoch == 0:
            first_epoch_rate = (steps - 1) * a.batch / dt
            acc1 = accuracy()
    timed = a.epochs * steps - 1
    return {"batch": a.batch, "epochs": a.epochs, "steps": a.epochs * steps,
            "examples_per_second": timed * a.batch / train_s,
            "first_epoch_examples_per_second": first_epoch_rate,
            "seconds": train_s, "test_accuracy_1": acc1,
            "test_accuracy_%d" % a.epochs: accuracy(),
            "final_loss": float(loss), "tensorflow": tf.__version__}


def main():
    ap = argparse.ArgumentParser(description="(d) of bench/train.py: TensorFlow's "
                                 "ParameterServerStrategy, one ps + one worker on loopback")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=FM, help="Fashion-MNIST IDX .gz directory")
    ap.add_argument("--timeout", type=float, default=1800,
                    help="seconds before everything is ended (default 1800)")
    ap.add_argument("--worker-cpu", type=int, default=min(os.sched_getaffinity(0)),
                    help="pin the worker task to this CPU, -1 for none (default: the "
                         "first CPU this process may use)")
    ap.add_argument("--serve", nargs=2, metavar=("JOB", "INDEX"), help=argparse.SUPPRESS)
    ap.add_argument("--cluster", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(json.loads(a.cluster), a.serve[0], int(a.serve[1]), a.worker_cpu)
        return 0

    try:
        import tensorflow  # noqa: F401  (the tasks import it too; fail here first)
    except ImportError as e:
        print("tf_ps: %s under %s: run `make bench-tf-venv` and use .venv-tf/bin/python"
              % (e, sys.executable), file=sys.stderr)
        return 2
    a.data = os.path.abspath(a.data)
    for f in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
              "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        if not os.path.exists(os.path.join(a.data, f)):
            print("tf_ps: %s is missing" % os.path.join(a.data, f), file=sys.stderr)
            return 2
    # SIGTERM ends like Ctrl-C, so the cluster below is stopped.
    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    rc = 1
    with tempfile.TemporaryDirectory(prefix="bench-tf-ps-") as logdir:
        cluster = Cluster(logdir, a.worker_cpu)

        def watchdog():
            print("tf_ps: over the %ds timeout, ending" % a.timeout, file=sys.stderr, flush=True)
            cluster.stop()
            os._exit(3)
        timer = threading.Timer(a.timeout, watchdog)
        timer.daemon = True
        timer.start()
        try:
            cluster.wait_ready()
            res = train(a, cluster)
            print(json.dumps(res), flush=True)
            rc = 0
        except KeyboardInterrupt:
            print("tf_ps: interrupted", file=sys.stderr, flush=True)
            rc = 130
        except Exception:
            traceback.print_exc()
            print("tf_ps: failed%s" % cluster.tail(), file=sys.stderr, flush=True)
        finally:
            timer.cancel()
            cluster.stop()
    sys.stdout.flush()
    sys.stderr.flush()
    # The coordinator's threads can keep the interpreter from exiting once
    # the cluster is gone: leave at once.
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
