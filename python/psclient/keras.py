"""psd as the optimizer of a Keras model in a custom training loop
(tf.GradientTape): apply_gradients() pushes each trainable variable's
gradient and assigns the values psd returns (in the same round trip), so
that several processes train one model through psd with the update applied
on the server.

    import tensorflow as tf, psclient
    from psclient.keras import PSOptimizer

    model = tf.keras.Sequential([tf.keras.Input((784,)),
                                 tf.keras.layers.Dense(128, activation="relu", name="hidden"),
                                 tf.keras.layers.Dense(10, name="out")], name="mlp")
    client = psclient.Client(["127.0.0.1:7070"], worker=0)
    opt = PSOptimizer(model, client, optimizer=psclient.Optimizer.sgd(0.05))
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for x, y in dataset:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(tape.gradient(loss, model.trainable_variables))

The variables are named after each trainable variable's path (Keras 3;
its name in Keras 2), with `prefix`, placed over the job's shards by the
client and created if missing (idempotent, so every process does it).
Their first values are psd's: Glorot uniform (psd's fans are Keras's) for
variables of two or more dimensions, zeros for the rest, unless
`initializers` says otherwise; the constructor assigns them to the model.
The model must be built (its variables exist) and float32, and its layers
named (name="..."): Keras numbers unnamed ones per process (dense, dense_1,
...), so two processes could name the same layer differently.

Threads and lifetime: as the Client it wraps (one thread); eager mode.
"""
from __future__ import annotations

import zlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .client import Client, PushResult
from .specs import Initializer, Optimizer, Variable


def variable_name(v: Any) -> str:
    """A Keras variable's unique name: its path (Keras 3), else its name
    without the ":0" suffix (Keras 2)."""
    path = getattr(v, "path", None)
    if isinstance(path, str) and path:
        return path
    name = str(v.name)
    return name[:-2] if name.endswith(":0") else name


def default_initializer(name: str, shape: Tuple[int, ...], seed: int) -> Initializer:
    """Glorot uniform (Keras's fans, which are psd's) for 2+ dimensions,
    zeros otherwise; the seed mixes in the name."""
    if len(shape) >= 2:
        s = (seed * 1000003 + zlib.crc32(name.encode("utf-8"))) & ((1 << 63) - 1)
        return Initializer.glorot_uniform(seed=s)
    return Initializer.zeros()


class PSOptimizer:
    """An optimizer whose update runs on psd, for a Keras model.

    model: a built Keras model (or a list of its variables). client: a
    psclient.Client of the job. optimizer, consistency, num_workers: the
    variables' spec (Client.create_variables). initializers: by variable
    name. prefix: put before every name. seed: for the default
    initializers.
    """

    def __init__(self, model: Any, client: Client, *, optimizer: Optimizer = Optimizer.sgd(0.01),
                 consistency: str = "async", num_workers: int = 0,
                 initializers: Optional[Mapping[str, Initializer]] = None,
                 prefix: str = "", seed: int = 0) -> None:
        variables = list(getattr(model, "trainable_variables", model))
        if not variables:
            raise ValueError("PSOptimizer: the model has no trainable variables (build it "
                             "first, e.g. with an Input layer or by calling it once)")
        self.client = client
        self.variables: List[Any] = variables
        self.names: List[str] = []
        for v in variables:
            name = prefix + variable_name(v)
            dtype = str(getattr(v.dtype, "name", v.dtype))
            if dtype != "float32":
                raise TypeError("variable '%s' is %s; psd holds float32" % (name, dtype))
            if name in self.names:
                raise ValueError("two variables are named '%s'; give the layers distinct "
                                 "names" % name)
            self.names.append(name)
        inits = dict(initializers or {})
        specs = [Variable(n, tuple(int(d) for d in v.shape),
                          inits.get(n) or default_initializer(n, tuple(v.shape), seed))
                 for n, v in zip(self.names, variables)]
        client.create_variables(specs, optimizer=optimizer, consistency=consistency,
                                num_workers=num_workers)
        self.last: Optional[PushResult] = None
        self.pull()

    def _assign(self, values: Mapping[str, np.ndarray]) -> None:
        for name, v in zip(self.names, self.variables):
            if name in values:
                v.assign(values[name])

    def pull(self) -> None:
        """Assigns psd's current values to the model's variables."""
        self._assign(self.client.pull(self.names))

    def apply_gradients(self, grads: Sequence[Any]) -> PushResult:
        """Pushes the gradients (in the order of the model's trainable
        variables, as tape.gradient returns them; or (gradient, variable)
        pairs, as Keras optimizers take them) and assigns the values psd
        returns. A None gradient leaves its variable out."""
        pairs = list(grads)
        if pairs and isinstance(pairs[0], tuple):
            index = {id(v): i for i, v in enumerate(self.variables)}
            ordered: List[Any] = [None] * len(self.variables)
            for g, v in pairs:
                if id(v) not in index:
                    raise KeyError("a gradient for a variable this optimizer does not hold "
                                   "(%s)" % variable_name(v))
                ordered[index[id(v)]] = g
            pairs = ordered
        if len(pairs) != len(self.variables):
            raise ValueError("%d gradients for %d variables" % (len(pairs), len(self.variables)))
        out: Dict[str, np.ndarray] = {}
        for name, g in zip(self.names, pairs):
            if g is None:
                continue
            if hasattr(g, "indices"):  # tf.IndexedSlices: densify
                import tensorflow as tf
                g = tf.convert_to_tensor(g)
            out[name] = np.asarray(g.numpy() if hasattr(g, "numpy") else g)
        self.last = self.client.push(out, return_values=True)
        assert self.last.values is not None
        self._assign(self.last.values)
        return self.last
