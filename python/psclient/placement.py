"""Where a model's variables live over a job's psd shards: the same rule as
common/place.c, so that a Python client without a coordinator places a
model exactly as workerd (and pscoord) would.

The rule: variables are taken largest first (ties by name), each onto the
shard holding the fewest bytes so far (ties by the lower index); a variable
of more than `split_threshold` bytes with more than one row is split over
all shards by rows of its first dimension, as evenly as possible (the first
rows % n parts get one row more): part k is named "<name>/part<k>", lives on
shard k and holds rows [row_begin, row_end). One shard never splits.

Threads and lifetime: pure functions; the results are plain data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

#: pscoord's --split-threshold default, and what a worker without one uses.
SPLIT_DEFAULT = 512 << 10
MAX_DIMS = 8
_MAX_ELEMENTS = 1 << 40

Shape = Tuple[int, ...]


@dataclass(frozen=True)
class Part:
    """One row range of a variable, as one variable on one shard."""
    name: str        # the name on its shard
    shard: int
    row_begin: int   # rows [row_begin, row_end) of dimension 0
    row_end: int


@dataclass(frozen=True)
class Placement:
    """A whole variable and its parts (one unless it is split)."""
    name: str
    shape: Shape
    parts: Tuple[Part, ...] = field(default_factory=tuple)

    @property
    def split(self) -> bool:
        return len(self.parts) > 1


def elements(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def check(variables: Sequence[Tuple[str, Sequence[int]]]) -> None:
    """Refuses what common/place.c refuses, with the same words: raises
    ValueError naming the variable."""
    if not variables:
        raise ValueError("the proposal holds no variables; give each variable's "
                         "name and shape")
    seen: Dict[str, int] = {}
    for i, (name, shape) in enumerate(variables):
        n = len(name.encode("utf-8"))
        if n == 0 or n > 255 or "\0" in name:
            raise ValueError("variable #%d: a name must be 1 to 255 bytes without "
                             "NUL, got %d" % (i, n))
        if len(shape) > MAX_DIMS:
            raise ValueError("variable '%s': %d dimensions, at most %d"
                             % (name, len(shape), MAX_DIMS))
        e = 1
        for d, s in enumerate(shape):
            if int(s) < 1:
                raise ValueError("variable '%s': dimension %d is %d, each must be "
                                 ">= 1" % (name, d, int(s)))
            e *= int(s)
            if e > _MAX_ELEMENTS:
                raise ValueError("variable '%s': more than 2^40 elements" % name)
        if name in seen:
            raise ValueError("variable '%s' is named twice (#%d and #%d)"
                             % (name, seen[name], i))
        seen[name] = i


def place(variables: Sequence[Tuple[str, Sequence[int]]], num_shards: int,
          split_threshold: int = SPLIT_DEFAULT) -> List[Placement]:
    """Places (name, shape) pairs over num_shards >= 1 shards; the result
    keeps the proposal's order."""
    check(variables)
    if num_shards < 1:
        raise ValueError("need at least one shard, got %d" % num_shards)
    load = [0] * num_shards
    order = sorted(range(len(variables)),
                   key=lambda i: (-4 * elements(variables[i][1]),
                                  variables[i][0].encode("utf-8")))
    out: Dict[int, Placement] = {}
    for i in order:
        name, shape = variables[i][0], tuple(int(s) for s in variables[i][1])
        nbytes = 4 * elements(shape)
        rows = shape[0] if shape else 1
        if num_shards > 1 and nbytes > split_threshold and rows > 1:
            nparts = min(rows, num_shards)
            base, extra = divmod(rows, nparts)
            parts, at = [], 0
            row_bytes = nbytes // rows
            for k in range(nparts):
                take = base + (1 if k < extra else 0)
                parts.append(Part("%s/part%d" % (name, k), k, at, at + take))
                load[k] += row_bytes * take
                at += take
            out[i] = Placement(name, shape, tuple(parts))
            continue
        best = min(range(num_shards), key=lambda s: (load[s], s))
        out[i] = Placement(name, shape, (Part(name, best, 0, rows),))
        load[best] += nbytes
    return [out[i] for i in range(len(variables))]
