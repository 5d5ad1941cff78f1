"""Sparse embedding tables over a job's shards: the shard of an id (the
rule of common/sparseclient.c, ps_sparse_shard_of, bit for bit), and
SparsePull / SparsePush split per shard and merged back in request order.

A table lives on every shard under its own name; the row of id lives on
shard jump(mix64(id), nshards): mix64 is splitmix64's finalizer, jump is
Lamping and Veach's jump consistent hash. Client.sparse_pull and
Client.sparse_push use this module; shard_of is public so that a test or a
tool can tell where a row is.

Threads and lifetime: pure functions and plain values; the split of one
call lives as long as the call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._proto import pb
from .half import from_half, to_half
from .splitmix import mix64

_JUMP = np.uint64(2862933555777941757)


def shard_of(ids: Any, nshards: int) -> np.ndarray:
    """The shard (int64 array, ids' shape) of each int64 id among nshards:
    ps_sparse_shard_of's jump(mix64(id), nshards), in float64 as C's
    double."""
    ids = np.asarray(ids, dtype=np.int64)
    if nshards <= 1:
        return np.zeros(ids.shape, dtype=np.int64)
    key = mix64(ids.reshape(-1))
    b = np.full(key.shape, -1, dtype=np.int64)
    j = np.zeros(key.shape, dtype=np.int64)
    live = j < nshards
    with np.errstate(over="ignore"):
        while live.any():
            b[live] = j[live]
            key[live] = key[live] * _JUMP + np.uint64(1)
            den = (key[live] >> np.uint64(33)).astype(np.float64) + 1.0
            j[live] = ((b[live] + 1).astype(np.float64) * (float(1 << 31) / den)) \
                .astype(np.int64)
            live = j < nshards
    return b.reshape(ids.shape)


class Versioned(Dict[str, np.ndarray]):
    """Arrays by name, each with the version it was read at (`versions`,
    by the same names): what a pull answers, dense (client.Values) or
    sparse (SparseValues)."""
    versions: Dict[str, int]

    def __init__(self) -> None:
        super().__init__()
        self.versions = {}


class SparseValues(Versioned):
    """Rows by table name (float32 [len(ids), dim], in request order), with
    each table's version (`versions`: the highest a shard answered; a table
    counts the SparsePush calls each shard applied; 0 if no shard was
    asked)."""


@dataclass
class SparsePushResult:
    """What a sparse push did: each table's version after it (the highest
    of its shards'), the updated rows when asked for (return_values; an id
    not admitted yet answers its initial row), and the step it was pushed
    as."""
    versions: Dict[str, int]
    values: Optional[SparseValues]
    step: int


def check_ids(name: str, ids: Any) -> np.ndarray:
    """ids as a 1-D int64 array; refuses non-integers and uint64 above
    int64's range, naming the table."""
    a = np.asarray(ids)
    if a.dtype.kind not in "iu" and not (a.size == 0 and a.dtype.kind == "f"):
        raise TypeError("sparse table '%s': ids dtype is %s, expected integers"
                        % (name, a.dtype))
    if a.ndim != 1:
        raise ValueError("sparse table '%s': ids must be 1-D, got shape %s"
                         % (name, list(a.shape)))
    if a.dtype == np.uint64 and a.size and int(a.max()) >= 1 << 63:
        raise ValueError("sparse table '%s': id %d does not fit int64" % (name, int(a.max())))
    return a.astype(np.int64)


def check_rows(name: str, rows: Any, n: int, dim: int) -> np.ndarray:
    """A gradient as C-ordered little-endian float32 [n, dim], refused
    before it is sent when its dtype or shape is not that."""
    a = np.asarray(rows)
    if a.dtype != np.float32:
        raise TypeError("sparse table '%s': gradient dtype is %s, rows are float32"
                        % (name, a.dtype))
    if tuple(a.shape) != (n, dim):
        raise ValueError("sparse table '%s': gradient shape is %s, expected [%d, %d] "
                         "(len(ids), dim)" % (name, list(a.shape), n, dim))
    return np.ascontiguousarray(a, dtype="<f4")


Split = Dict[int, List[Tuple[str, np.ndarray]]]   # shard -> [(table, positions)]


def split(ids: Mapping[str, np.ndarray], nshards: int) -> Split:
    """Per shard, each table's positions (into its ids, ascending) that go
    there; a shard with none of a table's ids is left out."""
    out: Split = {}
    for name, a in ids.items():
        sh = shard_of(a, nshards)
        for s in np.unique(sh):
            out.setdefault(int(s), []).append((name, np.flatnonzero(sh == s)))
    return out


def merge(name: str, rows: Any, pos: np.ndarray, into: np.ndarray, shard: int) -> None:
    """Copies one shard's SparseRows (the rows of ids[pos]) into `into`,
    widened to float32 when the table's rows are float16 or bfloat16 (they
    travel as stored)."""
    t = rows.values
    dim = into.shape[1]
    half = t.dtype in (pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16)
    if len(t.data) != (2 if half else 4) * len(pos) * dim:
        raise ValueError("shard %d answered %d bytes for table '%s', expected %d rows of "
                         "dim %d" % (shard, len(t.data), name, len(pos), dim))
    if half:
        got = from_half(np.frombuffer(t.data, dtype="<u2"), t.dtype)
    else:
        got = np.frombuffer(t.data, dtype="<f4")
    into[pos] = got.reshape(len(pos), dim)


def pull(call: Callable[[int, str, Any, Any], Any],
         each: Callable[[Sequence[int], Callable[[int], Any]], Dict[int, Any]],
         nshards: int, dims: Mapping[str, int], ids: Mapping[str, np.ndarray],
         next_ids: Optional[Mapping[str, np.ndarray]] = None) -> SparseValues:
    """SparsePull of each table's ids: one request per shard that holds
    some, in parallel (each), merged in request order. next_ids: each
    table's ids of the next pull, sent to the shards that hold them
    (SparsePullItem.next_ids), which read them ahead; a shard with next
    ids of a table and none now gets an item with no ids."""
    out = SparseValues()
    for name, a in ids.items():
        out[name] = np.empty((len(a), dims[name]), dtype=np.float32)
        out.versions[name] = 0
    by = split(ids, nshards)
    nids = next_ids or {}
    nx = split(nids, nshards)
    empty = np.zeros(0, dtype=np.int64)
    for s, parts in nx.items():
        have = {n for n, _ in by.get(s, [])}
        by.setdefault(s, []).extend((n, empty) for n, _ in parts if n not in have)
    hint = {s: {n: nids[n][pos] for n, pos in parts} for s, parts in nx.items()}

    def one(s: int) -> Any:
        h = hint.get(s, {})
        req = pb.SparsePullRequest(items=[pb.SparsePullItem(
            name=n, ids=ids[n][pos].tolist() if n in ids else [],
            next_ids=h[n].tolist() if n in h else []) for n, pos in by[s]])
        return call(s, "SparsePull", req, pb.SparsePullResponse)
    for s, resp in each(sorted(by), one).items():
        for (name, pos), rows in zip(by[s], resp.rows):
            if name in out:
                merge(name, rows, pos, out[name], s)
                out.versions[name] = max(out.versions[name], int(rows.version))
    return out


def push(call: Callable[[int, str, Any, Any], Any],
         each: Callable[[Sequence[int], Callable[[int], Any]], Dict[int, Any]],
         nshards: int, worker: int, step: int,
         grads: Mapping[str, Tuple[np.ndarray, np.ndarray]],
         return_values: bool, row_dtypes: Mapping[str, int],
         next_ids: Optional[Mapping[str, np.ndarray]] = None) -> SparsePushResult:
    """SparsePush of each table's (ids, rows): one request per shard with
    the rows of its ids, in parallel; versions (and with return_values the
    updated rows) merged back. A request whose tables all have half rows of
    one dtype (row_dtypes) sends its gradients in it, half the bytes.
    next_ids: each table's ids of the next push, split by shard; a shard
    gets its share with its gradient of the table (SparseGradient.next_ids),
    and none when it has no ids of the table in this push."""
    ids = {n: g[0] for n, g in grads.items()}
    by = split(ids, nshards)
    nids = next_ids or {}
    hint = {s: {n: nids[n][pos] for n, pos in parts}
            for s, parts in split(nids, nshards).items()}

    def one(s: int) -> Any:
        kinds = {row_dtypes.get(n, pb.DTYPE_FLOAT32) for n, _ in by[s]}
        wire = kinds.pop() if len(kinds) == 1 else pb.DTYPE_FLOAT32
        gs = []
        for n, pos in by[s]:
            r = grads[n][1][pos]
            data = r.tobytes() if wire == pb.DTYPE_FLOAT32 else to_half(r, wire)[0].tobytes()
            h = hint.get(s, {})
            gs.append(pb.SparseGradient(name=n, ids=ids[n][pos].tolist(), grad=pb.Tensor(
                dtype=wire, shape=list(r.shape), data=data),
                next_ids=h[n].tolist() if n in h else []))
        req = pb.SparsePushRequest(worker=worker, step=step, grads=gs,
                                   return_values=return_values,
                                   wire_dtype=0 if wire == pb.DTYPE_FLOAT32 else wire)
        return call(s, "SparsePush", req, pb.SparsePushResponse)
    versions = {n: 0 for n in grads}
    values: Optional[SparseValues] = None
    if return_values:
        values = SparseValues()
        for n, (a, g) in grads.items():
            values[n] = np.empty((len(a), g.shape[1]), dtype=np.float32)
    for s, resp in each(sorted(by), one).items():
        for k, (name, pos) in enumerate(by[s]):
            versions[name] = max(versions[name], int(resp.versions[k]))
            if values is not None:
                merge(name, resp.values[k], pos, values[name], s)
    if values is not None:
        values.versions = dict(versions)
    return SparsePushResult(versions, values, step)
