"""The framework-neutral half of psd-backed embedding layers
(psclient.torch's ShardedEmbedding and ShardedEmbeddingBag): a feature's
ids turned into the keys of its table (an offset or a hash, so that
features can share a table), a batch's keys deduplicated, their rows pulled
once over the shards in parallel, each key's summed gradient pushed once,
and an optional prefetch of the next batch's rows.

A layer never holds or forms the whole table: a batch's rows are a
[unique ids, dim] array, and so is its gradient. The update is psd's: the
table's optimizer (SparseTable.optimizer) runs on the server when the
gradient is pushed, which the torch layers do in their backward pass.

Threads and lifetime: a Lookup is used by one thread (the training loop's);
a prefetch runs its pull on one thread of its own, through the same
Client (its calls to the shards are thread-safe; its sync step is not
touched by sparse calls).
"""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Union

import grpc
import numpy as np

from ._proto import pb
from ._rpc import PsError
from .client import Client
from .sparse import mix64
from .specs import Initializer, Optimizer, SparseTable, row_dtype_pb

IdMap = Union[int, Sequence[int], None]


def check_id_dtype(layer: str, dtype: Any) -> None:
    """Refuses ids that are not integers (a TypeError naming the layer and
    the dtype), before anything is sent."""
    kind = np.dtype(dtype).kind
    if kind not in "iu":
        raise TypeError("%s: ids dtype is %s, expected int64 (or int32) ids"
                        % (layer, np.dtype(dtype)))


def table_keys(ids: np.ndarray, offset: IdMap = 0, hash_salt: IdMap = None) -> np.ndarray:
    """The keys (int64, ids' shape) of ids in their table. offset: added to
    each id (wrapping in int64), one int for all, or one per feature along
    the last axis. hash_salt: instead, each key is splitmix64(id ^
    splitmix64(salt)), again one salt or one per feature; features with
    different salts share a table without sharing rows (collisions are as
    likely as in any 64-bit hash)."""
    a = np.asarray(ids).astype(np.int64)
    if hash_salt is not None:
        salt = mix64(np.asarray(hash_salt, dtype=np.int64))
        with np.errstate(over="ignore"):
            return mix64(a.view(np.uint64) ^ salt).view(np.int64)
    if offset is None or not np.any(np.asarray(offset) != 0):
        return a
    with np.errstate(over="ignore"):
        return (a.view(np.uint64) + np.asarray(offset, dtype=np.int64).view(np.uint64)) \
            .view(np.int64)


@dataclass
class Batch:
    """One batch's lookup: the unique keys (sorted) and, for each id of
    the input, the index of its key among them (the padding id: len(keys))."""
    keys: np.ndarray       # (U,) int64
    inverse: np.ndarray    # input's shape, int64 in [0, U]
    padded: bool           # some id is the padding id


@dataclass
class _Prefetch:
    batch: Batch
    future: "concurrent.futures.Future[np.ndarray]"
    pushed: List[np.ndarray] = field(default_factory=list)  # keys pushed since it began


class Lookup:
    """Pulls and pushes one sparse table's rows for a layer.

    client: the job's Client. table: a SparseTable (created if missing,
    idempotently as Client.create_sparse_tables), or its name with dim (it
    must exist). layer: the name used in errors. offset, hash_salt: see
    table_keys. padding_idx: an id (before offset or hash) whose row is
    zero, never pulled nor pushed."""

    def __init__(self, client: Client, table: Union[SparseTable, str], dim: Optional[int],
                 *, layer: str, offset: IdMap = 0, hash_salt: IdMap = None,
                 padding_idx: Optional[int] = None, create: bool = True,
                 optimizer: Optimizer = Optimizer()) -> None:
        if isinstance(table, SparseTable):
            if dim is not None and int(dim) != int(table.dim):
                raise ValueError("%s: dim %d differs from sparse table '%s''s dim %d"
                                 % (layer, int(dim), table.name, table.dim))
            spec = table
        else:
            if dim is None:
                raise ValueError("%s: give the table's dim (or a SparseTable)" % layer)
            spec = SparseTable(table, int(dim))
        if hash_salt is not None and offset is not None and np.any(np.asarray(offset) != 0):
            raise ValueError("%s: give offset or hash_salt, not both" % layer)
        self.client = client
        self.name = spec.name
        self.dim = int(spec.dim)
        self.layer = layer
        self.offset = offset
        self.hash_salt = hash_salt
        self.padding_idx = padding_idx
        self._check_dim()
        if create and isinstance(table, SparseTable):
            client.create_sparse_tables([spec], optimizer=optimizer)
        else:
            client.attach_sparse([spec])
        self._pending: Optional[_Prefetch] = None
        self._fetcher: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def _check_dim(self) -> None:
        """A table that exists with another dim: one line naming both.
        A worker's token may not list variables (psd --tokens): then psd's
        own refusal of the CreateVariable, or of the first pull, names the
        two."""
        sh = self.client.shards[0]
        try:
            info = sh.call("ListVariables", pb.ListVariablesRequest(), pb.ListVariablesResponse)
        except PsError as e:
            if e.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                return
            raise
        for v in info.variables:
            if v.spec.name != self.name:
                continue
            have = int(v.spec.shape[0]) if len(v.spec.shape) == 1 else -1
            if not v.spec.sparse:
                raise ValueError("%s: '%s' on psd at %s is a dense variable of shape %s, "
                                 "not a sparse table" % (self.layer, self.name,
                                                         sh.conn.address, list(v.spec.shape)))
            if have != self.dim:
                raise ValueError("%s: sparse table '%s' on psd at %s has dim %d; the layer's "
                                 "dim is %d" % (self.layer, self.name, sh.conn.address,
                                                have, self.dim))

    def batch(self, ids: np.ndarray) -> Batch:
        """Deduplicates the keys of ids (any shape)."""
        ids = np.asarray(ids)
        check_id_dtype(self.layer, ids.dtype)
        if ids.dtype == np.uint64 and ids.size and int(ids.max()) >= 1 << 63:
            raise ValueError("%s: id %d does not fit int64" % (self.layer, int(ids.max())))
        keys = table_keys(ids, self.offset, self.hash_salt)
        if self.padding_idx is None:
            u, inv = np.unique(keys.reshape(-1), return_inverse=True)
            return Batch(u, inv.reshape(ids.shape).astype(np.int64), False)
        pad = ids.astype(np.int64) == int(self.padding_idx)
        u, inv = np.unique(keys[~pad], return_inverse=True)
        full = np.full(ids.shape, len(u), dtype=np.int64)
        full[~pad] = inv
        return Batch(u, full, bool(pad.any()))

    def _pull(self, keys: np.ndarray) -> np.ndarray:
        if len(keys) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self.client.sparse_pull({self.name: keys})[self.name]

    def rows(self, b: Batch) -> np.ndarray:
        """The rows of b's keys, float32 [U, dim]: the prefetched ones when
        a prefetch of the same keys is pending (the keys pushed since it
        began pulled again), else one pull."""
        p, self._pending = self._pending, None
        if p is not None and np.array_equal(p.batch.keys, b.keys):
            got = np.array(p.future.result(), dtype=np.float32)
            if p.pushed:
                stale = np.flatnonzero(np.isin(b.keys, np.concatenate(p.pushed)))
                if len(stale):
                    got[stale] = self._pull(b.keys[stale])
            return got
        if p is not None:
            p.future.result()  # let it finish; its rows are not this batch's
        return np.array(self._pull(b.keys), dtype=np.float32)

    def prefetch(self, ids: np.ndarray) -> None:
        """Starts pulling the rows of the next batch's ids on a thread of
        its own; the next rows() of the same keys uses them."""
        b = self.batch(ids)
        if self._fetcher is None:
            self._fetcher = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="psclient-prefetch")
        if self._pending is not None:
            self._pending.future.result()
        self._pending = _Prefetch(b, self._fetcher.submit(self._pull, b.keys))

    def push(self, keys: np.ndarray, grad: np.ndarray) -> None:
        """Pushes each key's (already summed) gradient row once."""
        if len(keys) == 0:
            return
        g = np.ascontiguousarray(grad, dtype=np.float32)
        self.client.sparse_push({self.name: (keys, g)})
        if self._pending is not None:
            self._pending.pushed.append(keys)

    def close(self) -> None:
        """Waits for a pending prefetch and ends its thread."""
        if self._pending is not None:
            try:
                self._pending.future.result()
            except Exception:  # noqa: BLE001 - its rows are dropped anyway
                pass
            self._pending = None
        if self._fetcher is not None:
            self._fetcher.shutdown(wait=True)
            self._fetcher = None


def default_initializer(name: str, dim: int, seed: int = 0) -> Initializer:
    """nn.Embedding's N(0, 1) would make psd's rows far larger than a
    recommendation model wants; rows start uniform in +-1/sqrt(dim) as
    TorchRec's tables do, drawn from (seed, id) alone on every host."""
    import zlib
    s = (seed * 1000003 + zlib.crc32(name.encode("utf-8"))) & ((1 << 63) - 1)
    b = float(dim) ** -0.5
    return Initializer.uniform(-b, b, seed=s)



def layer_lookup(kind: str, client: Client, table: Any, dim: Optional[int], *,
                 padding_idx: Optional[int], offset: IdMap, hash_salt: IdMap,
                 optimizer: Optional[Optimizer], create: bool, seed: int,
                 row_dtype: Optional[str] = None,
                 slot_dtype: Optional[str] = None) -> Lookup:
    """The Lookup of a framework's embedding layer (kind names it in
    errors: "ShardedEmbedding 'NAME'"). A table given by name is created
    with default_initializer when create is set, which needs its dim.
    row_dtype, slot_dtype: the rows' and the optimizer slots' dtypes on psd
    (SparseTable's); None: the SparseTable's, or f32."""
    name = table.name if isinstance(table, SparseTable) else str(table)
    layer = "%s '%s'" % (kind, name)
    asked = {"row_dtype": row_dtype, "slot_dtype": slot_dtype}
    for field, want in asked.items():
        if isinstance(table, SparseTable) and want is not None and \
                row_dtype_pb(want, field) != row_dtype_pb(getattr(table, field)):
            raise ValueError("%s: %s %r differs from the SparseTable's %r"
                             % (layer, field, want, getattr(table, field)))
    if isinstance(table, str) and (create or row_dtype is not None or slot_dtype is not None):
        if dim is None:
            raise ValueError("%s: give the table's dim (or a SparseTable)" % layer)
        table = SparseTable(table, int(dim), default_initializer(table, int(dim), seed),
                            row_dtype=row_dtype or "f32", slot_dtype=slot_dtype or "f32")
    return Lookup(client, table, dim, layer=layer, offset=offset, hash_salt=hash_salt,
                  padding_idx=padding_idx, create=create,
                  optimizer=optimizer or Optimizer.sgd(0.01))
