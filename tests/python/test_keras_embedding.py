"""psclient.keras.ShardedEmbedding and PSOptimizer under model.fit and in
a tf.GradientTape loop, against a real psd on 127.0.0.1:0 (2 shards), in
the TensorFlow venv that python-keras uses (PyPI's tensorflow-cpu; skipped
with one line when PyPI cannot be reached). Keras's own Embedding and SGD
are the oracle, the reference table starting from the rows psd answers:

  fit       Input(int64 ids) -> ShardedEmbedding -> Dense under model.fit
            with Keras's SGD: the Dense weights, the predictions and every
            row equal keras.layers.Embedding's model to float32 rounding;
  tape      the same layer in a GradientTape loop with PSOptimizer for the
            Dense (its update on psd too): the same;
  hybrid    model.fit with PSOptimizer as the model's optimizer and the
            table on psd: the same, and psd holds the model's Dense values;
  badinput  float ids are a TypeError naming the dtype with nothing sent;
            a table of another dim is one line naming both.

Prints ok/FAIL per check and "python-keras-embedding: N passed, N failed".
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pyenv  # noqa: E402
import pstest  # noqa: E402

pyenv.reexec_tf("keras")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from psclient import Client, Initializer, Optimizer, SparseTable  # noqa: E402
from psclient.keras import PSOptimizer, ShardedEmbedding  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
keras = tf.keras
r = pstest.Results("python-keras-embedding")
DIM, F, N, BATCH = 4, 3, 64, 16


def close(a, b, rtol=1e-5, atol=1e-6):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol))


def data(seed):
    rng = np.random.default_rng(seed)
    u = np.unique(rng.integers(-2 ** 63, 2 ** 63 - 1, 30, dtype=np.int64))
    x = rng.choice(u, (N, F))
    y = rng.standard_normal((N, 1)).astype(np.float32)
    return u, x, y


def dense_out():
    return keras.layers.Dense(1, name="out",
                              kernel_initializer=keras.initializers.GlorotUniform(seed=1))


def ps_model(c, table):
    ids = keras.Input((F,), dtype="int64")
    vec = ShardedEmbedding(c, table, name="emb")(ids)
    return keras.Model(ids, dense_out()(keras.layers.Flatten()(vec)))


def ref_model(u, rows, model):
    """keras.layers.Embedding over u's rows (indices: searchsorted in u),
    with the psd model's Dense weights."""
    idx = keras.Input((F,), dtype="int64")
    emb = keras.layers.Embedding(len(u), DIM, name="emb")
    out = dense_out()
    m = keras.Model(idx, out(keras.layers.Flatten()(emb(idx))))
    emb.set_weights([rows])
    out.set_weights(model.get_layer("out").get_weights())
    return m, emb


def pair(c, table, k, seed, dense=False):
    """Data set k, a psd model over a new sparse table (uniform rows from
    seed, psd's SGD 0.1) and its Keras Embedding reference from the same rows
    and Dense weights: (u, x, y, model, ref, emb, opt). With dense, opt is a
    PSOptimizer (SGD 0.1) for the Dense, made first: the reference starts
    from psd's Dense values."""
    u, x, y = data(k)
    t = SparseTable(table, DIM, Initializer.uniform(-0.5, 0.5, seed=seed),
                    optimizer=Optimizer.sgd(0.1))
    model = ps_model(c, t)
    opt = (PSOptimizer(model, c, optimizer=Optimizer.sgd(0.1), prefix=table + "/")
           if dense else None)
    ref, emb = ref_model(u, c.sparse_pull({table: u})[table], model)
    return u, x, y, model, ref, emb, opt


def compare(label, c, table, u, x, model, ref, emb):
    idx = np.searchsorted(u, x)
    got_rows = c.sparse_pull({table: u})[table]
    diff = float(np.max(np.abs(got_rows - emb.get_weights()[0])))
    ok = (close(model.get_layer("out").get_weights()[0], ref.get_layer("out").get_weights()[0])
          and close(model.predict(x, verbose=0), ref.predict(idx, verbose=0))
          and close(got_rows, emb.get_weights()[0]))
    r.check(ok, "%s: the Dense weights, predictions and %d rows equal Keras's Embedding "
            "model's (max row diff %.2g)" % (label, len(u), diff))


def test_fit(c):
    u, x, y, model, ref, emb, _ = pair(c, "kfit", 1, 3)
    for m in (model, ref):
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    ref.fit(np.searchsorted(u, x), y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    compare("fit (Keras SGD, %d steps)" % (2 * N // BATCH), c, "kfit", u, x, model, ref, emb)


def test_tape(c):
    u, x, y, model, ref, emb, opt = pair(c, "ktape", 2, 4, dense=True)
    ropt = keras.optimizers.SGD(0.1)
    mse = keras.losses.MeanSquaredError()
    for k in range(0, N, BATCH):
        xb, yb = x[k:k + BATCH], y[k:k + BATCH]
        with tf.GradientTape() as tape:
            loss = mse(yb, model(xb, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        with tf.GradientTape() as tape:
            loss = mse(yb, ref(np.searchsorted(u, xb), training=True))
        ropt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables),
                                 ref.trainable_variables))
    compare("tape (PSOptimizer for the Dense)", c, "ktape", u, x, model, ref, emb)


def test_hybrid(c):
    u, x, y, model, ref, emb, opt = pair(c, "khyb", 3, 5, dense=True)
    model.compile(optimizer=opt, loss="mse")
    ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    ref.fit(np.searchsorted(u, x), y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    compare("hybrid (model.fit with PSOptimizer)", c, "khyb", u, x, model, ref, emb)
    on_psd = c.pull(opt.names)
    mine = {n: v.numpy() for n, v in zip(opt.names, opt.model_variables)}
    r.check(sorted(on_psd) == sorted(mine) and all(close(on_psd[n], mine[n]) for n in mine)
            and len(opt.names) == 2 and opt.last is not None,
            "hybrid: psd holds the model's Dense values %s (the layer's trigger is not "
            "on psd)" % opt.names)


def test_badinput(c):
    layer = ShardedEmbedding(c, SparseTable("kbad", DIM), name="kbad")
    pulled = [s.sparse_rows_pulled for s in c.stats()]
    try:
        layer(tf.constant([[1.0, 2.0]]))
        r.check(False, "badinput: float ids are refused")
    except TypeError as e:
        r.check("float32" in str(e) and "'kbad'" in str(e),
                "badinput: float ids are a TypeError: %s" % e)
    r.check([s.sparse_rows_pulled for s in c.stats()] == pulled,
            "badinput: nothing was sent for them")
    try:
        ShardedEmbedding(c, SparseTable("kbad", DIM + 1))
        r.check(False, "badinput: a layer of another dim than its table is refused")
    except ValueError as e:
        m = str(e)
        r.check("\n" not in m and "dim %d" % DIM in m and "dim is %d" % (DIM + 1) in m,
                "badinput: a layer of another dim than its table: %s" % m)


def main():
    ds = [pstest.Daemon([pstest.psd_path(), "--data-dir", pstest.tmpdir("pykemb-"),
                         "--listen", "127.0.0.1:0", "--log-level", "warn"]) for _ in range(2)]
    c = Client([d.address for d in ds])
    r.run((test_fit, test_tape, test_hybrid, test_badinput), c)
    c.close()
    pstest.stop_all(ds)
    r.finish()


if __name__ == "__main__":
    main()
