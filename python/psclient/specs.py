"""What a variable is made of: its initializer and the optimizer psd applies
to it (proto/ps.proto's Initializer and Optimizer), as small immutable
values with constructors named after the kinds.

Threads and lifetime: immutable values.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence, Tuple

from ._proto import pb

_INIT_KINDS = {"zeros": 0, "constant": 1, "uniform": 2, "normal": 3,
               "truncated_normal": 4, "glorot_uniform": 5}
_OPT_KINDS = {"sgd": 0, "momentum": 1, "adagrad": 2, "adam": 3, "ftrl": 4}
_CONSISTENCY = {"default": 0, "async": 1, "sync": 2, "bounded_staleness": 3}
_ROW_DTYPES = {"f32": 1, "float32": 1, "fp16": 2, "float16": 2, "bf16": 3, "bfloat16": 3}


def row_dtype_pb(name: str, what: str = "row_dtype") -> int:
    """A sparse table's row (or slot) dtype ("f32", "fp16", "bf16") as a
    ps.v1.DType; what names the argument in the error."""
    try:
        return _ROW_DTYPES[name]
    except KeyError:
        raise ValueError("%s %r: expected f32, fp16 or bf16" % (what, name)) from None


def _spec_dtype(name: str, what: str) -> int:
    """A row or slot dtype as the spec carries it: float32 as unset."""
    d = row_dtype_pb(name, what)
    return 0 if d == 1 else d


@dataclass(frozen=True)
class Initializer:
    """How psd draws a variable's first value. The same kind, parameters,
    shape and seed give the same bits on every host."""
    kind: str = "zeros"
    value: float = 0.0
    minval: float = 0.0
    maxval: float = 0.0
    mean: float = 0.0
    stddev: float = 0.0
    seed: int = 0
    fan_in: int = 0   # glorot_uniform: 0 = from the shape (channels last)
    fan_out: int = 0

    def __post_init__(self) -> None:
        if self.kind not in _INIT_KINDS:
            raise ValueError("initializer kind %r: expected one of %s"
                             % (self.kind, ", ".join(_INIT_KINDS)))

    @staticmethod
    def zeros() -> "Initializer":
        return Initializer("zeros")

    @staticmethod
    def constant(value: float) -> "Initializer":
        return Initializer("constant", value=value)

    @staticmethod
    def uniform(minval: float, maxval: float, seed: int = 0) -> "Initializer":
        return Initializer("uniform", minval=minval, maxval=maxval, seed=seed)

    @staticmethod
    def normal(mean: float = 0.0, stddev: float = 1.0, seed: int = 0) -> "Initializer":
        return Initializer("normal", mean=mean, stddev=stddev, seed=seed)

    @staticmethod
    def truncated_normal(mean: float = 0.0, stddev: float = 1.0,
                         seed: int = 0) -> "Initializer":
        return Initializer("truncated_normal", mean=mean, stddev=stddev, seed=seed)

    @staticmethod
    def glorot_uniform(seed: int = 0, fan_in: int = 0, fan_out: int = 0) -> "Initializer":
        """Uniform on +-sqrt(6 / (fan_in + fan_out)); fans 0 = Keras's from
        the shape (the last two dimensions times the receptive field)."""
        return Initializer("glorot_uniform", seed=seed, fan_in=fan_in, fan_out=fan_out)

    def for_part(self, k: int, nparts: int, whole: Sequence[int]) -> "Initializer":
        """The initializer of part k of a variable of shape `whole` split in
        nparts: its own seed, and the whole variable's fans so that the part
        is drawn from the whole variable's distribution."""
        if nparts == 1:
            return self
        fi, fo = self.fan_in, self.fan_out
        if self.kind == "glorot_uniform" and (fi <= 0 or fo <= 0):
            fi, fo = keras_fans(whole)
        return replace(self, seed=self.seed + k, fan_in=fi, fan_out=fo)

    def to_pb(self) -> Any:
        return pb.Initializer(kind=_INIT_KINDS[self.kind], value=self.value,
                              minval=self.minval, maxval=self.maxval, mean=self.mean,
                              stddev=self.stddev, seed=self.seed, fan_in=self.fan_in,
                              fan_out=self.fan_out)


def keras_fans(shape: Sequence[int]) -> Tuple[int, int]:
    """Keras's compute_fans (channels last), as psd computes them."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return int(shape[0]), int(shape[0])
    receptive = 1
    for d in shape[:-2]:
        receptive *= int(d)
    return int(shape[-2]) * receptive, int(shape[-1]) * receptive


@dataclass(frozen=True)
class Optimizer:
    """The update psd applies to each pushed gradient; 0 for a parameter
    means psd's default (see proto/ps.proto)."""
    kind: str = "sgd"
    learning_rate: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    initial_accumulator: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0
    epsilon: float = 0.0
    # FTRL (psd's learning_rate_power 0 means -0.5; TF's 0 is sent as -1e-38).
    learning_rate_power: float = 0.0
    l1: float = 0.0
    l2: float = 0.0
    l2_shrinkage: float = 0.0
    beta: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in _OPT_KINDS:
            raise ValueError("optimizer kind %r: expected one of %s"
                             % (self.kind, ", ".join(_OPT_KINDS)))
        if not self.learning_rate > 0:
            raise ValueError("optimizer learning_rate must be > 0, got %r"
                             % self.learning_rate)

    @staticmethod
    def sgd(learning_rate: float = 0.01) -> "Optimizer":
        return Optimizer("sgd", learning_rate)

    @staticmethod
    def momentum_sgd(learning_rate: float = 0.01, momentum: float = 0.9,
                     nesterov: bool = False) -> "Optimizer":
        return Optimizer("momentum", learning_rate, momentum=momentum, nesterov=nesterov)

    @staticmethod
    def adagrad(learning_rate: float = 0.01, initial_accumulator: float = 0.1,
                epsilon: float = 1e-7) -> "Optimizer":
        return Optimizer("adagrad", learning_rate,
                         initial_accumulator=initial_accumulator, epsilon=epsilon)

    @staticmethod
    def adam(learning_rate: float = 0.001, beta1: float = 0.9, beta2: float = 0.999,
             epsilon: float = 1e-7) -> "Optimizer":
        return Optimizer("adam", learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon)

    @staticmethod
    def ftrl(learning_rate: float = 0.001, learning_rate_power: float = -0.5,
             initial_accumulator: float = 0.1, l1: float = 0.0, l2: float = 0.0,
             l2_shrinkage: float = 0.0, beta: float = 0.0) -> "Optimizer":
        """FTRL-Proximal as TensorFlow's ApplyFtrl(V2) and Keras' Ftrl
        (their defaults and meanings): learning_rate_power in [-10, 0], where
        0 is TF's fixed step size (sent as -1e-38, which gives the same
        bits); l1, l2, l2_shrinkage, beta >= 0 (beta adds beta / (2 lr) to
        l2, as Keras)."""
        if not -10.0 <= learning_rate_power <= 0.0:
            raise ValueError("ftrl learning_rate_power must be in [-10, 0], got %r"
                             % learning_rate_power)
        for k, v in (("initial_accumulator", initial_accumulator), ("l1", l1), ("l2", l2),
                     ("l2_shrinkage", l2_shrinkage), ("beta", beta)):
            if not 0.0 <= v <= 1e30:
                raise ValueError("ftrl %s must be in [0, 1e30], got %r" % (k, v))
        return Optimizer("ftrl", learning_rate, initial_accumulator=initial_accumulator,
                         learning_rate_power=learning_rate_power or -1e-38, l1=l1, l2=l2,
                         l2_shrinkage=l2_shrinkage, beta=beta)

    def to_pb(self) -> Any:
        return pb.Optimizer(kind=_OPT_KINDS[self.kind], learning_rate=self.learning_rate,
                            momentum=self.momentum, nesterov=self.nesterov,
                            initial_accumulator=self.initial_accumulator,
                            beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
                            learning_rate_power=self.learning_rate_power, l1=self.l1,
                            l2=self.l2, l2_shrinkage=self.l2_shrinkage, beta=self.beta)


@dataclass(frozen=True)
class Variable:
    """A dense float32 variable of the model: its name and shape, and how
    psd initializes it (None: zeros) and updates it (None: the optimizer
    given to Client.create_variables)."""
    name: str
    shape: Tuple[int, ...]
    initializer: Optional[Initializer] = None
    optimizer: Optional[Optimizer] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))


_SPARSE_INITS = ("zeros", "constant", "uniform", "normal", "truncated_normal")


@dataclass(frozen=True)
class SparseTable:
    """A sparse embedding table: rows of `dim` float32 keyed by int64 id,
    created on first push (doc/sparse.md). It lives on
    every shard of the job; an id's row on shard jump(splitmix64(id)).
    initializer (None: zeros; glorot_uniform is refused) draws each row from
    (seed, id) alone; optimizer None: the one given to
    Client.create_sparse_tables. admit_after: a new id is stored at its
    admit_after-th push (0, 1: the first); ttl_steps: rows not updated in
    that many steps are evicted (0: never); max_rows: per shard, the least
    recently updated beyond it are evicted (0: unbounded); insert_on_pull: a
    pull of an unknown id stores its initial row. row_dtype: "fp16" or
    "bf16" store the rows' values in half precision on psd (half the bytes
    in memory, on disk and on the wire; updates stay float32, each new
    value rounded to nearest even), "f32" float32.
    slot_dtype: the same for the optimizer's slots (MOMENTUM's velocity,
    ADAGRAD's accumulator, ADAM's moments, FTRL's n and z), widened for the
    update and rounded back each time; psd refuses "fp16" with ADAM (its
    second moment underflows float16). The client still hands out and takes
    float32 rows."""
    name: str
    dim: int
    initializer: Optional[Initializer] = None
    optimizer: Optional[Optimizer] = None
    admit_after: int = 0
    ttl_steps: int = 0
    max_rows: int = 0
    insert_on_pull: bool = False
    row_dtype: str = "f32"
    slot_dtype: str = "f32"

    def __post_init__(self) -> None:
        row_dtype_pb(self.row_dtype)
        row_dtype_pb(self.slot_dtype, "slot_dtype")
        if not 1 <= int(self.dim) <= 65536:
            raise ValueError("sparse table '%s': dim must be in [1, 65536], got %r"
                             % (self.name, self.dim))
        if self.initializer is not None and self.initializer.kind not in _SPARSE_INITS:
            raise ValueError("sparse table '%s': initializer %r; a row takes one of %s"
                             % (self.name, self.initializer.kind, ", ".join(_SPARSE_INITS)))
        for k in ("admit_after", "ttl_steps", "max_rows"):
            if int(getattr(self, k)) < 0:
                raise ValueError("sparse table '%s': %s must be >= 0" % (self.name, k))

    def to_pb(self, default_optimizer: Optimizer) -> Any:
        return pb.VariableSpec(
            name=self.name, dtype=pb.DTYPE_FLOAT32, shape=[int(self.dim)],
            initializer=(self.initializer or Initializer.zeros()).to_pb(),
            optimizer=(self.optimizer or default_optimizer).to_pb(),
            consistency=_CONSISTENCY["async"], sparse=True,
            admit_after=int(self.admit_after), ttl_steps=int(self.ttl_steps),
            max_rows=int(self.max_rows), insert_on_pull=bool(self.insert_on_pull),
            row_dtype=_spec_dtype(self.row_dtype, "row_dtype"),
            slot_dtype=_spec_dtype(self.slot_dtype, "slot_dtype"))


def consistency_pb(name: str) -> int:
    if name not in _CONSISTENCY:
        raise ValueError("consistency %r: expected one of %s"
                         % (name, ", ".join(_CONSISTENCY)))
    return _CONSISTENCY[name]
