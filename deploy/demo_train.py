"""The demo's trainer until workerd lands: softmax regression on
Fashion-MNIST, trained by asynchronous workers (threads, each with its own
channel and data shard) through Push and Pull against a running psd.

Usage: demo_train.py PSD_ADDRESS [--epochs N] [--workers K]
"""
import argparse
import gzip
import os
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "interop"))
import pstest  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def load_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.1)
    a = ap.parse_args()

    pb, pbg, _, _ = pstest.generate_stubs()
    x = load_idx(os.path.join(DATA, "train-images-idx3-ubyte.gz")).reshape(-1, 784) / np.float32(255)
    y = load_idx(os.path.join(DATA, "train-labels-idx1-ubyte.gz")).astype(np.int64)
    xt = load_idx(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")).reshape(-1, 784) / np.float32(255)
    yt = load_idx(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
    x, xt = x.astype(np.float32), xt.astype(np.float32)

    ch = pstest.channel(a.address)
    stub = pbg.ParameterServerStub(ch)
    for name, shape in (("softmax/w", (784, 10)), ("softmax/b", (10,))):
        stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
            pb, name, shape, lr=a.lr)), timeout=10)
    items = [pb.PullItem(name="softmax/w"), pb.PullItem(name="softmax/b")]
    progress = {"examples": 0, "loss": 0.0}
    lock = threading.Lock()

    def worker(index):
        wch = pstest.channel(a.address)
        ws = pbg.ParameterServerStub(wch)
        xs, ys = x[index::a.workers], y[index::a.workers]
        rng = np.random.default_rng(index)
        step = 0
        for _ in range(a.epochs):
            order = rng.permutation(len(xs))
            for lo in range(0, len(xs) - a.batch + 1, a.batch):
                idx = order[lo:lo + a.batch]
                got = ws.Pull(pb.PullRequest(items=items), timeout=10)
                w, b = pstest.value(got.values[0]), pstest.value(got.values[1])
                logits = xs[idx] @ w + b
                logits -= logits.max(axis=1, keepdims=True)
                p = np.exp(logits)
                p /= p.sum(axis=1, keepdims=True)
                loss = -np.log(p[np.arange(len(idx)), ys[idx]] + 1e-12).mean()
                p[np.arange(len(idx)), ys[idx]] -= 1
                p /= len(idx)
                ws.Push(pb.PushRequest(worker=index, step=step, grads=[
                    pstest.grad(pb, "softmax/w", xs[idx].T @ p),
                    pstest.grad(pb, "softmax/b", p.sum(axis=0))]), timeout=10)
                step += 1
                with lock:
                    progress["examples"] += len(idx)
                    progress["loss"] = 0.9 * progress["loss"] + 0.1 * loss if progress["loss"] else loss
        wch.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True)
               for i in range(a.workers)]
    for t in threads:
        t.start()
    total = a.epochs * len(x)
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        with lock:
            ex, loss = progress["examples"], progress["loss"]
        el = time.monotonic() - t0
        print("epoch %.2f  examples %6d/%d  %6.0f examples/s  loss %.4f"
              % (ex / len(x), ex, total, ex / el, loss), flush=True)
    got = stub.Pull(pb.PullRequest(items=items), timeout=10)
    w, b = pstest.value(got.values[0]), pstest.value(got.values[1])
    acc = float(((xt @ w + b).argmax(axis=1) == yt).mean())
    el = time.monotonic() - t0
    print("done: %d examples in %.1f s (%.0f examples/s), %d updates, test accuracy %.4f"
          % (progress["examples"], el, progress["examples"] / el,
             got.values[0].version, acc), flush=True)
    ch.close()


if __name__ == "__main__":
    main()
