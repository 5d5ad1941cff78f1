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
_OPT_KINDS = {"sgd": 0, "momentum": 1, "adagrad": 2, "adam": 3}
_CONSISTENCY = {"default": 0, "async": 1, "sync": 2, "bounded_staleness": 3}


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

    def to_pb(self) -> Any:
        return pb.Optimizer(kind=_OPT_KINDS[self.kind], learning_rate=self.learning_rate,
                            momentum=self.momentum, nesterov=self.nesterov,
                            initial_accumulator=self.initial_accumulator,
                            beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon)


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


def consistency_pb(name: str) -> int:
    if name not in _CONSISTENCY:
        raise ValueError("consistency %r: expected one of %s"
                         % (name, ", ".join(_CONSISTENCY)))
    return _CONSISTENCY[name]
