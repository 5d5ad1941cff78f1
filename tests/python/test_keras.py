"""psclient.keras.PSOptimizer against a real psd on 127.0.0.1:0, with PyPI's
tensorflow-cpu (the Makefile's pinned version) in a virtualenv: the
repository's .venv-tf when `make bench-tf-venv` made it, else build/venv-tf,
made by the first run and reused. Skipped with one line when PyPI cannot be
reached.

  step      one step through psd equals Keras's SGD on the same batch from
            the same values; psd's first values are assigned to the model;
  train     an MLP 784-64-10 on 25,600 Fashion-MNIST images, 3 epochs,
            batch 32, SGD 0.1, in a tf.GradientTape loop: 2 processes each
            with half the images pushing asynchronously through psd reach a
            mean test accuracy (3 seeds) within one point of the same model
            trained by Keras alone from the same first values.

Prints ok/FAIL per check and "python-keras: N passed, N failed".
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pyenv  # noqa: E402
import fmnist  # noqa: E402
import pstest  # noqa: E402

pyenv.reexec_tf("keras", lambda: None if fmnist.available() else
                "%s is missing (apt-get install dataset-fashion-mnist)" % fmnist.FM)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import psclient  # noqa: E402
from psclient.keras import PSOptimizer  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_model():
    # Named: Keras numbers unnamed layers per process (dense, dense_1, ...),
    # and the variables' paths name them on psd.
    return tf.keras.Sequential([tf.keras.Input((784,)),
                                tf.keras.layers.Dense(fmnist.HIDDEN, activation="relu",
                                                      name="hidden"),
                                tf.keras.layers.Dense(10, name="out")], name="mlp")


def grad_fn(model):
    @tf.function
    def grads(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)
    return grads


def accuracy(model, x, y):
    return float((np.argmax(model(x, training=False).numpy(), 1) == y).mean())


def train(model, apply, x, y, worker, workers, seed):
    """EPOCHS over worker's share; apply(grads) updates. Returns (steps,
    start, end)."""
    g = grad_fn(model)
    t0, steps = time.time(), 0
    for epoch in range(fmnist.EPOCHS):
        for idx in fmnist.batches(len(x), worker, workers, epoch, seed):
            apply(g(x[idx], y[idx]))
            steps += 1
    return steps, t0, time.time()


def keras_sgd(model):
    opt = tf.keras.optimizers.SGD(learning_rate=fmnist.LR)
    return lambda grads: opt.apply_gradients(zip(grads, model.trainable_variables))


def worker_main(i, address, seed):
    x, y, _, _ = fmnist.load()
    model = make_model()
    with psclient.Client([address], worker=i) as c:
        opt = PSOptimizer(model, c, optimizer=psclient.Optimizer.sgd(fmnist.LR),
                          prefix="s%d/" % seed, seed=seed)
        steps, t0, t1 = train(model, opt.apply_gradients, x, y, i, fmnist.WORKERS, seed)
    print(json.dumps({"steps": steps, "start": t0, "end": t1}), flush=True)


def test_step(r, address):
    m = make_model()
    with psclient.Client([address]) as c:
        opt = PSOptimizer(m, c, optimizer=psclient.Optimizer.sgd(0.1), prefix="exact/")
        first = c.pull()
        lim = np.sqrt(6.0 / (784 + fmnist.HIDDEN))
        k = first[opt.names[0]]
        r.check(all(np.array_equal(v.numpy(), first[n]) for n, v in
                    zip(opt.names, m.trainable_variables)) and
                0.95 * lim < np.abs(k).max() <= lim and np.all(first[opt.names[1]] == 0),
                "step: psd's first values (Glorot, zero biases) are assigned to the model "
                "(%s)" % ", ".join(opt.names))
        ref = make_model()
        ref.set_weights(m.get_weights())
        x = np.random.default_rng(1).random((16, 784), dtype=np.float32)
        y = np.arange(16) % 10
        opt.apply_gradients(grad_fn(m)(x, y))
        keras_sgd(ref)(grad_fn(ref)(x, y))
        diff = max(float(np.abs(a - b).max()) for a, b in zip(m.get_weights(),
                                                               ref.get_weights()))
        r.check(diff <= 1e-6 and opt.last.versions[opt.names[0]] == 1,
                "step: one step through psd equals Keras's SGD (max diff %.2g)" % diff)


def run_seed(address, seed, data):
    x, y, xt, yt = data
    init, outs, acc_ps, pushes = fmnist.through_psd(
        __file__, address, seed, make_model(), PSOptimizer, lambda m: m.get_weights(),
        accuracy, (xt, yt), 900)
    alone = make_model()
    alone.set_weights(init)
    s_alone, _, _ = train(alone, keras_sgd(alone), x, y, 0, 1, seed)
    return acc_ps, accuracy(alone, xt, yt), outs, pushes, s_alone


def test_train(r, address):
    fmnist.check_train(r, "Keras", run_seed, address)


def main():
    r = pstest.Results("python-keras")
    print("tensorflow %s, keras %s" % (tf.__version__, tf.keras.__version__
                                       if hasattr(tf.keras, "__version__") else "?"),
          flush=True)
    d = pstest.start_psd(pstest.tmpdir())
    r.run((lambda: test_step(r, d.address), lambda: test_train(r, d.address)))
    d.stop()
    r.finish()


if __name__ == "__main__":
    fmnist.entry(worker_main, main)
