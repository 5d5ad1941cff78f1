"""Fashion-MNIST (Debian's dataset-fashion-mnist, IDX gzip) for the
framework adapters' training tests, and the comparison both tests make.

The comparison: the same model from the same first values, trained for the
same epochs with the same batch size and learning rate (plain SGD) on the
same subset, once by the framework alone and once through psd by 2
processes that each take half of the subset and push asynchronously. One
run's test accuracy moves by +-1 point with the order of the examples alone
(plain SGD, 3 epochs: 0.826 to 0.847 over 5 shuffles), so each side is run
with SEEDS shuffles and first values, and the means of the test accuracies
(full test set) must lie within one point.
"""
import gzip
import json
import os
import subprocess
import sys
import time

import numpy as np

FM = "/usr/share/datasets/fashion-mnist"
N_TRAIN = 25600
EPOCHS = 3
BATCH = 32
LR = 0.1
HIDDEN = 64
WORKERS = 2
SEEDS = 3


def available():
    return os.path.exists(os.path.join(FM, "train-images-idx3-ubyte.gz"))


def _idx(name):
    with gzip.open(os.path.join(FM, name)) as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load():
    """(x_train, y_train, x_test, y_test): the first N_TRAIN training
    images and the whole test set, as float32 in [0, 1] of 784 and int64."""
    xs = _idx("train-images-idx3-ubyte.gz")[:N_TRAIN].reshape(-1, 784)
    ys = _idx("train-labels-idx1-ubyte.gz")[:N_TRAIN]
    xt = _idx("t10k-images-idx3-ubyte.gz").reshape(-1, 784)
    yt = _idx("t10k-labels-idx1-ubyte.gz")
    return (xs.astype(np.float32) / 255, ys.astype(np.int64),
            xt.astype(np.float32) / 255, yt.astype(np.int64))


def batches(n, worker, workers, epoch, seed=0):
    """Index batches of worker's share (every workers-th example) for one
    epoch, shuffled by (seed, epoch); a short last batch is dropped."""
    share = np.arange(worker, n, workers)
    rng = np.random.default_rng(seed * 1000 + epoch * 10 + worker)
    share = share[rng.permutation(len(share))]
    for k in range(len(share) // BATCH):
        yield share[k * BATCH:(k + 1) * BATCH]


def entry(worker_main, main):
    """A training test's entry: `--worker I ADDRESS SEED` runs one of
    run_workers' processes, anything else the test."""
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker_main(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        main()


def run_workers(script, address, seed, timeout):
    """Starts WORKERS processes of `script --worker I ADDRESS SEED` and
    returns the JSON each printed last; raises if one failed."""
    procs = [subprocess.Popen([sys.executable, script, "--worker", str(i), address,
                               str(seed)], stdout=subprocess.PIPE, text=True)
             for i in range(WORKERS)]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs.append(json.loads(out.strip().splitlines()[-1]) if p.returncode == 0 else None)
    if None in outs:
        raise RuntimeError("a worker process failed (%s)" % outs)
    return outs


def through_psd(script, address, seed, model, optimizer_class, snapshot, accuracy, test,
                timeout):
    """The psd side of one seed: model's variables made on psd by
    optimizer_class (the framework's PSOptimizer), WORKERS processes of
    script trained through it, then model pulled. Returns (snapshot(model)
    of the first values, the workers' outputs, accuracy(model, *test), the
    pushes psd counted)."""
    import psclient
    with psclient.Client([address], worker=0) as c:
        before = c.stats()[0].pushes
        opt = optimizer_class(model, c, optimizer=psclient.Optimizer.sgd(LR),
                              prefix="s%d/" % seed, seed=seed)
        init = snapshot(model)
        outs = run_workers(script, address, seed, timeout)
        opt.pull()
        acc_ps = accuracy(model, *test)
        pushes = c.stats()[0].pushes - before
    return init, outs, acc_ps, pushes


def check_train(r, framework, run_seed, address):
    """The comparison above over SEEDS seeds: run_seed(address, seed, data)
    returns (acc_ps, acc_alone, outs, pushes, steps_alone)."""
    data = load()
    ps, alone = [], []
    t0 = time.time()
    for seed in range(SEEDS):
        acc_ps, acc_alone, outs, pushes, s_alone = run_seed(address, seed, data)
        ps.append(acc_ps)
        alone.append(acc_alone)
        steps = sum(o["steps"] for o in outs)
        overlap = min(o["end"] for o in outs) - max(o["start"] for o in outs)
        r.check(overlap > 0 and pushes == steps and s_alone == steps,
                "train: seed %d: 2 processes pushed %d steps asynchronously (overlapping "
                "%.1f s of %.1f s), as many as %s alone takes (%d)" %
                (seed, steps, overlap, max(o["end"] for o in outs) -
                 min(o["start"] for o in outs), framework, s_alone))
    mp, ma = float(np.mean(ps)), float(np.mean(alone))
    r.check(abs(mp - ma) <= 0.01 and ma > 0.75,
            "train: mean test accuracy through psd %.4f %s, %s alone %.4f %s: within "
            "one point (%.0f s)" % (mp, ["%.4f" % a for a in ps], framework, ma,
                                    ["%.4f" % a for a in alone], time.time() - t0))
