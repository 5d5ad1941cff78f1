"""psclient.torch.PSOptimizer against a real psd on 127.0.0.1:0, with
Debian's python3-torch:

  step      one step through psd equals torch.optim.SGD's on the same batch
            from the same values, for every parameter; psd's first values
            are loaded into the module; a float64 module is refused naming
            the parameter;
  sync      2 workers in lock-step (threads): after 3 steps both modules
            hold SGD on the averaged gradients, as PyTorch computes it;
  train     an MLP 784-64-10 on 25,600 Fashion-MNIST images, 3 epochs,
            batch 32, SGD 0.1: 2 processes each with half the images
            pushing asynchronously through psd (their steps overlap in
            time) reach a mean test accuracy (3 seeds) within one point of
            the same model trained by PyTorch alone from the same first
            values (fmnist.py says why means).

Prints ok/FAIL per check and "python-torch: N passed, N failed"; exits 77
(skip) with one line where torch or the data set is missing.
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pyenv  # noqa: E402

pyenv.reexec()

import numpy as np  # noqa: E402

import fmnist  # noqa: E402
import pstest  # noqa: E402

torch = pyenv.import_torch()

import psclient  # noqa: E402
from psclient.torch import PSOptimizer  # noqa: E402


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(784, fmnist.HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(fmnist.HIDDEN, 10))


def accuracy(model, x, y):
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def train(model, opt, x, y, worker, workers, seed):
    """EPOCHS over worker's share; returns (steps, start, end)."""
    t0, steps = time.time(), 0
    for epoch in range(fmnist.EPOCHS):
        for idx in fmnist.batches(len(x), worker, workers, epoch, seed):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x[idx])),
                                                     torch.from_numpy(y[idx]))
            loss.backward()
            opt.step()
            steps += 1
    return steps, t0, time.time()


def test_sync(r, address):
    """2 workers in lock-step (consistency sync): after each step both
    modules hold the update of the averaged gradients, as computed here."""
    torch.manual_seed(2)
    xs = torch.rand(3, 2, 16, 784)
    ys = torch.randint(0, 10, (3, 2, 16))
    models = [make_model() for _ in range(2)]
    clients = [psclient.Client([address], worker=i) for i in range(2)]
    opts = [PSOptimizer(models[i], clients[i], optimizer=psclient.Optimizer.sgd(0.1),
                        consistency="sync", num_workers=2, prefix="sync/") for i in range(2)]
    ref = make_model()
    ref.load_state_dict(models[0].state_dict())

    def run(i):
        for k in range(3):
            opts[i].zero_grad()
            torch.nn.functional.cross_entropy(models[i](xs[k, i]), ys[k, i]).backward()
            opts[i].step()
    errors = pstest.in_threads(run, 2, 120)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.1)
    for k in range(3):
        sgd.zero_grad()
        loss = sum(torch.nn.functional.cross_entropy(ref(xs[k, i]), ys[k, i]) for i in range(2))
        (loss / 2).backward()
        sgd.step()
    diff = max(float((a - b).abs().max()) for m in models
               for a, b in zip(m.parameters(), ref.parameters()))
    r.check(not errors and diff < 1e-5 and
            all(o.last.versions["sync/0.weight"] == 3 for o in opts),
            "sync: 2 workers in lock-step, 3 steps: both modules hold SGD on the averaged "
            "gradients (max diff %.2g, %s)" % (diff, errors or "no errors"))
    for c in clients:
        c.close()


def worker_main(i, address, seed):
    """One of the 2 training processes (run by the test as a subprocess)."""
    torch.set_num_threads(1)
    x, y, _, _ = fmnist.load()
    model = make_model()
    with psclient.Client([address], worker=i) as c:
        opt = PSOptimizer(model, c, optimizer=psclient.Optimizer.sgd(fmnist.LR),
                          prefix="s%d/" % seed, seed=seed)
        steps, t0, t1 = train(model, opt, x, y, i, fmnist.WORKERS, seed)
    print(json.dumps({"steps": steps, "start": t0, "end": t1}), flush=True)


def test_step(r, address):
    torch.manual_seed(1)
    m = make_model()
    with psclient.Client([address]) as c:
        opt = PSOptimizer(m, c, optimizer=psclient.Optimizer.sgd(0.1), prefix="exact/")
        first = {n: v.copy() for n, v in c.pull().items()}
        loaded = all(np.array_equal(p.detach().numpy(), first["exact/" + n])
                     for n, p in m.named_parameters())
        w = first["exact/0.weight"]
        lim = np.sqrt(6.0 / (784 + fmnist.HIDDEN))
        r.check(loaded and 0.95 * lim < np.abs(w).max() <= lim and
                np.all(first["exact/0.bias"] == 0),
                "step: psd's first values (Glorot with the layer's fans, zero biases) "
                "are loaded into the module")
        ref = make_model()
        ref.load_state_dict(m.state_dict())
        sgd = torch.optim.SGD(ref.parameters(), lr=0.1)
        x = torch.rand(16, 784)
        y = torch.randint(0, 10, (16,))
        for model, o in ((m, opt), (ref, sgd)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            o.step()
        diff = max(float((a - b).abs().max()) for a, b in
                   zip(m.parameters(), ref.parameters()))
        r.check(diff <= 1e-6 and opt.last.versions["exact/0.weight"] == 1,
                "step: one step through psd equals torch.optim.SGD's (max diff %.2g)" % diff)
        try:
            PSOptimizer(make_model().double(), c)
            r.check(False, "step: a float64 module is refused")
        except TypeError as e:
            r.check("'0.weight'" in str(e) and "float64" in str(e),
                    "step: a float64 module is refused naming the parameter (%s)" % e)


def run_seed(address, seed, data):
    """One seed: 2 processes through psd, then PyTorch alone from the same
    first values. Returns (acc_ps, acc_alone, outs, pushes, steps_alone)."""
    x, y, xt, yt = data
    init, outs, acc_ps, pushes = fmnist.through_psd(
        __file__, address, seed, make_model(), PSOptimizer,
        lambda m: {k: v.clone() for k, v in m.state_dict().items()}, accuracy, (xt, yt), 600)
    alone = make_model()
    alone.load_state_dict(init)
    torch.set_num_threads(1)
    s_alone, _, _ = train(alone, torch.optim.SGD(alone.parameters(), lr=fmnist.LR), x, y,
                          0, 1, seed)
    return acc_ps, accuracy(alone, xt, yt), outs, pushes, s_alone


def test_train(r, address):
    fmnist.check_train(r, "PyTorch", run_seed, address)


def main():
    if not fmnist.available():
        print("skip: %s is missing (apt-get install dataset-fashion-mnist)" % fmnist.FM)
        sys.exit(77)
    r = pstest.Results("python-torch")
    d = pstest.start_psd(pstest.tmpdir())
    r.run((lambda: test_step(r, d.address), lambda: test_sync(r, d.address),
           lambda: test_train(r, d.address)))
    d.stop()
    r.finish()


if __name__ == "__main__":
    fmnist.entry(worker_main, main)
