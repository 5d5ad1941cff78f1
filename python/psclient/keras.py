"""psd as the optimizer of a Keras model, under model.fit or in a custom
training loop (tf.GradientTape), and embedding layers over psd's sparse
tables. PSOptimizer is a keras.optimizers.Optimizer whose
apply_gradients() pushes each trainable variable's gradient and assigns the
values psd returns (in the same round trip), so that several processes
train one model through psd with the update applied on the server.

    import tensorflow as tf, psclient
    from psclient.keras import PSOptimizer, ShardedEmbedding

    client = psclient.Client(["127.0.0.1:7070"], worker=0)
    ids = tf.keras.Input((3,), dtype="int64")
    vec = ShardedEmbedding(client, psclient.SparseTable("item", 16), name="item")(ids)
    out = tf.keras.layers.Dense(1, name="out")(tf.keras.layers.Flatten()(vec))
    model = tf.keras.Model(ids, out)
    model.compile(optimizer=PSOptimizer(model, client,
                                        optimizer=psclient.Optimizer.sgd(0.05)),
                  loss="mse")
    model.fit(x, y, batch_size=32)

PSOptimizer's variables are named after each trainable variable's path
(Keras 3; its name in Keras 2), with `prefix`, placed over the job's shards
by the client and created if missing (idempotent, so every process does
it). Their first values are psd's: Glorot uniform (psd's fans are Keras's)
for variables of two or more dimensions, zeros for the rest, unless
`initializers` says otherwise; the constructor assigns them to the model.
The model must be built (its variables exist) and float32, and its layers
named (name="..."): Keras numbers unnamed ones per process (dense, dense_1,
...), so two processes could name the same layer differently. Any Keras
optimizer serves as well beside ShardedEmbedding (the tables' update is
psd's either way).

Threads and lifetime: as the Client it wraps (one thread). Under model.fit
the calls to psd run inside the compiled step through tf.py_function, so
XLA (jit_compile) is off for a model with these layers.
"""
from __future__ import annotations

import zlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from . import embedding as _emb
from .client import Client, PushResult
from .specs import Initializer, Optimizer, Variable

_KerasOptimizer: Any = tf.keras.optimizers.Optimizer
_KerasLayer: Any = tf.keras.layers.Layer

# Variables ShardedEmbedding makes only so that backward reaches it: never
# on psd's dense side nor updated (their gradient is zero).
_TRIGGERS: Dict[int, Any] = {}


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


class _Held:
    """The model's variables PSOptimizer holds, out of the reach of Keras's
    optimizer-variable tracking (which would take them for its own)."""

    def __init__(self, variables: List[Any], names: List[str]) -> None:
        self.variables = variables
        self.names = names


class PSOptimizer(_KerasOptimizer):
    """An optimizer whose update runs on psd, for a Keras model: give it to
    model.compile(optimizer=...) for model.fit, or call apply_gradients in
    a tf.GradientTape loop.

    model: a built Keras model (or a list of its variables). client: a
    psclient.Client of the job. optimizer, consistency, num_workers: the
    variables' spec (Client.create_variables). initializers: by variable
    name. prefix: put before every name. seed: for the default
    initializers.
    """

    def __init__(self, model: Any, client: Client, *, optimizer: Optimizer = Optimizer.sgd(0.01),
                 consistency: str = "async", num_workers: int = 0,
                 initializers: Optional[Mapping[str, Initializer]] = None,
                 prefix: str = "", seed: int = 0, name: str = "ps_optimizer") -> None:
        super().__init__(learning_rate=optimizer.learning_rate, name=name)
        variables = [v for v in getattr(model, "trainable_variables", model)
                     if id(v) not in _TRIGGERS]
        if not variables:
            raise ValueError("PSOptimizer: the model has no trainable variables (build it "
                             "first, e.g. with an Input layer or by calling it once)")
        names: List[str] = []
        for v in variables:
            vname = prefix + variable_name(v)
            dtype = str(getattr(v.dtype, "name", v.dtype))
            if dtype != "float32":
                raise TypeError("variable '%s' is %s; psd holds float32" % (vname, dtype))
            if vname in names:
                raise ValueError("two variables are named '%s'; give the layers distinct "
                                 "names" % vname)
            names.append(vname)
        self._held = _Held(variables, names)
        self.client = client
        inits = dict(initializers or {})
        specs = [Variable(n, tuple(int(d) for d in v.shape),
                          inits.get(n) or default_initializer(n, tuple(v.shape), seed))
                 for n, v in zip(names, variables)]
        client.create_variables(specs, optimizer=optimizer, consistency=consistency,
                                num_workers=num_workers)
        self.last: Optional[PushResult] = None
        self.pull()

    @property
    def names(self) -> List[str]:
        """psd's names of the model's variables, in their order."""
        return list(self._held.names)

    @property
    def model_variables(self) -> List[Any]:
        return list(self._held.variables)

    def _assign(self, values: Mapping[str, np.ndarray]) -> None:
        for name, v in zip(self._held.names, self._held.variables):
            if name in values:
                v.assign(values[name])

    def pull(self) -> None:
        """Assigns psd's current values to the model's variables."""
        self._assign(self.client.pull(self._held.names))

    def build(self, variables: Any) -> None:
        """Keras builds an optimizer with the model's trainable variables
        before fit: psd holds the state, so there is nothing to make."""
        self.built = True

    def apply_gradients(self, grads_and_vars: Sequence[Any]) -> Any:
        """Pushes the gradients and assigns the values psd returns: (gradient,
        variable) pairs as model.fit and Keras optimizers give them, or the
        gradients alone in the order of the model's trainable variables (as
        tape.gradient returns them). A None gradient leaves its variable out.
        Eagerly or inside model.fit's compiled step (tf.py_function)."""
        pairs = list(grads_and_vars)
        held = self._held
        if pairs and isinstance(pairs[0], tuple):
            index = {id(v): i for i, v in enumerate(held.variables)}
            ordered: List[Any] = [None] * len(held.variables)
            for g, v in pairs:
                if id(v) in _TRIGGERS:
                    continue
                if id(v) not in index:
                    raise KeyError("a gradient for a variable this optimizer does not hold "
                                   "(%s)" % variable_name(v))
                ordered[index[id(v)]] = g
            pairs = ordered
        if len(pairs) != len(held.variables):
            raise ValueError("%d gradients for %d variables" % (len(pairs), len(held.variables)))
        names: List[str] = []
        tensors: List[Any] = []
        targets: List[Any] = []
        for name, v, g in zip(held.names, held.variables, pairs):
            if g is None:
                continue
            names.append(name)
            tensors.append(tf.convert_to_tensor(g))  # a tf.IndexedSlices densified
            targets.append(v)
        if not names:
            return self.iterations

        def push(*arrays: Any) -> List[np.ndarray]:
            self.last = self.client.push(
                {n: np.asarray(a.numpy() if hasattr(a, "numpy") else a, dtype=np.float32)
                 for n, a in zip(names, arrays)}, return_values=True)
            assert self.last.values is not None
            return [self.last.values[n] for n in names]
        if tf.executing_eagerly():
            for v, val in zip(targets, push(*tensors)):
                v.assign(val)
        else:
            outs = tf.py_function(push, tensors, [tf.float32] * len(tensors))
            for v, o in zip(targets, outs):
                v.assign(tf.reshape(o, v.shape))
        self.iterations.assign_add(1)
        return self.iterations


class ShardedEmbedding(_KerasLayer):
    """keras.layers.Embedding over a psd sparse table: int64 (or int32) ids
    of any shape and any value in, [*ids.shape, dim] float32 out, trainable
    under model.fit (with any optimizer: the table's update is psd's) and
    in a tf.GradientTape loop.

    The forward pulls the batch's unique ids once over the shards in
    parallel; the backward pushes each id's gradient, summed over its uses,
    once, and psd applies the table's optimizer (no dense gradient of the
    table is formed). table: a psclient.SparseTable (created if missing) or
    a name (created with `dim`, rows uniform in +-1/sqrt(dim) from `seed`;
    with create=False attached as it is). optimizer: the table's when it
    has none of its own (default SGD 0.01). padding_idx, offset, hash_salt,
    row_dtype, slot_dtype: as psclient.torch.ShardedEmbedding (row_dtype is
    the rows' dtype on psd; Keras' own `dtype` stays the layer's compute
    dtype). The
    layer has one trainable scalar, always zero, through which Keras's
    backward reaches the push.
    """

    def __init__(self, client: Client, table: Any, dim: Optional[int] = None, *,
                 padding_idx: Optional[int] = None, offset: Any = 0, hash_salt: Any = None,
                 optimizer: Optional[Optimizer] = None, create: bool = True, seed: int = 0,
                 row_dtype: Optional[str] = None, slot_dtype: Optional[str] = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lookup = _emb.layer_lookup("ShardedEmbedding", client, table, dim,
                                         padding_idx=padding_idx, offset=offset,
                                         hash_salt=hash_salt, optimizer=optimizer,
                                         create=create, seed=seed, row_dtype=row_dtype,
                                         slot_dtype=slot_dtype)
        layer = self.lookup.layer
        self.output_dim = self.lookup.dim
        self.padding_idx = padding_idx
        self.layer_label = layer
        self.supports_jit = False   # tf.py_function inside

    def build(self, input_shape: Any = None) -> None:
        self.trigger = self.add_weight(name="ps_trigger", shape=(), initializer="zeros",
                                       trainable=True)
        _TRIGGERS[id(self.trigger)] = self.trigger
        self.built = True

    def compute_output_shape(self, input_shape: Any) -> Any:
        return tuple(input_shape) + (self.output_dim,)

    def _pull(self, ids: Any) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        b = self.lookup.batch(ids.numpy())
        rows = self.lookup.rows(b)
        if self.padding_idx is not None:
            rows = np.concatenate([rows, np.zeros((1, self.output_dim), np.float32)])
        return rows, b.inverse, b.keys

    def _push(self, keys: Any, grad: Any) -> np.ndarray:
        k = keys.numpy()
        self.lookup.push(k, grad.numpy()[:len(k)])
        return np.zeros((), np.float32)

    def call(self, ids: Any) -> Any:
        ids = tf.convert_to_tensor(ids)
        if ids.dtype not in (tf.int64, tf.int32):
            raise TypeError("%s: ids dtype is %s, expected int64 (or int32); give the Input "
                            "dtype='int64'" % (self.layer_label, ids.dtype.name))
        rows, inv, keys = tf.py_function(self._pull, [ids], [tf.float32, tf.int64, tf.int64])
        rows.set_shape([None, self.output_dim])
        inv.set_shape(ids.shape)
        push = self._push

        @tf.custom_gradient
        def attach(rows: Any, trigger: Any) -> Any:
            def grad(dy: Any) -> Any:
                done = tf.py_function(push, [keys, tf.convert_to_tensor(dy)], tf.float32)
                return tf.zeros_like(rows), tf.zeros_like(trigger) * done
            return tf.identity(rows), grad
        w = attach(rows, tf.convert_to_tensor(self.trigger.value))
        return tf.gather(w, inv)

    def prefetch(self, ids: Any) -> None:
        """Starts pulling the next batch's rows now (eager loops), as
        psclient.torch.ShardedEmbedding.prefetch."""
        self.lookup.prefetch(np.asarray(ids.numpy() if hasattr(ids, "numpy") else ids))
