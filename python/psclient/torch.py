"""psd as the optimizer of a PyTorch module: each step() pushes every
parameter's gradient and loads the values psd returns (in the same round
trip) into the module, so that several processes train one model through
psd, asynchronously or in lock-step, with the update applied on the server.

    import torch, psclient
    from psclient.torch import PSOptimizer

    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    client = psclient.Client(["127.0.0.1:7070"], worker=0)
    opt = PSOptimizer(model, client, optimizer=psclient.Optimizer.sgd(0.05))
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

The variables are named after model.named_parameters() (with `prefix`),
placed over the job's shards by the client, and created if missing (every
process creates the same ones; that is idempotent). Their first values are
psd's: Glorot uniform with the parameter's own fans for weights of two or
more dimensions, zeros for the rest (pass `initializers` to choose), drawn
from a seed derived from the name so that every process asks for the same;
the constructor loads them into the module.

ShardedEmbedding and ShardedEmbeddingBag are nn.Embedding and
nn.EmbeddingBag over psd's sparse tables (ids of any int64 value, rows
pulled per batch and updated on the server in backward), to train beside
dense parameters that torch.distributed all-reduces.

Threads and lifetime: as the Client it wraps (one thread); the module's
parameters must stay float32 and on one device.
"""
from __future__ import annotations

import warnings
import zlib
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple, Union

import numpy as np
import torch

from .client import Client, PushResult
from .specs import Initializer, Optimizer, Variable


def torch_fans(shape: Tuple[int, ...]) -> Tuple[int, int]:
    """PyTorch's fans of a weight: (in x receptive field, out x receptive
    field), the layout being (out, in, *kernel)."""
    receptive = 1
    for d in shape[2:]:
        receptive *= int(d)
    return int(shape[1]) * receptive, int(shape[0]) * receptive


def default_initializer(name: str, shape: Tuple[int, ...], seed: int) -> Initializer:
    """Glorot uniform with PyTorch's fans for a weight of 2+ dimensions,
    zeros otherwise; the seed mixes in the name."""
    if len(shape) >= 2:
        fi, fo = torch_fans(shape)
        s = (seed * 1000003 + zlib.crc32(name.encode("utf-8"))) & ((1 << 63) - 1)
        return Initializer.glorot_uniform(seed=s, fan_in=fi, fan_out=fo)
    return Initializer.zeros()


class PSOptimizer(torch.optim.Optimizer):
    """An optimizer whose update runs on psd.

    module: the model (or an iterable of (name, parameter) pairs). client:
    a psclient.Client of the job. optimizer, consistency, num_workers: the
    variables' spec (see Client.create_variables). initializers: by variable
    name, instead of default_initializer. prefix: put before every name, to
    keep several models in one job apart. seed: for the default
    initializers.
    """

    def __init__(self, module: Union[torch.nn.Module, Iterable[Tuple[str, torch.nn.Parameter]]],
                 client: Client, *, optimizer: Optimizer = Optimizer.sgd(0.01),
                 consistency: str = "async", num_workers: int = 0,
                 initializers: Optional[Mapping[str, Initializer]] = None,
                 prefix: str = "", seed: int = 0) -> None:
        named = list(module.named_parameters() if isinstance(module, torch.nn.Module)
                     else module)
        if not named:
            raise ValueError("PSOptimizer: the module has no parameters")
        self.client = client
        self.named: Dict[str, torch.nn.Parameter] = {}
        for name, p in named:
            if p.dtype != torch.float32:
                raise TypeError("parameter '%s' is %s; psd holds float32" % (name, p.dtype))
            self.named[prefix + name] = p
        super().__init__([p for _, p in named], {"lr": optimizer.learning_rate})
        inits = dict(initializers or {})
        variables = [Variable(n, tuple(p.shape),
                              inits.get(n) or default_initializer(n, tuple(p.shape), seed))
                     for n, p in self.named.items()]
        client.create_variables(variables, optimizer=optimizer, consistency=consistency,
                                num_workers=num_workers)
        self.last: Optional[PushResult] = None
        self.pull()

    def _load(self, values: Mapping[str, np.ndarray]) -> None:
        # The arrays may be read-only views of the response's bytes; torch
        # warns about wrapping those, but copy_ only reads them.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for name, v in values.items():
                p = self.named[name]
                p.copy_(torch.from_numpy(np.asarray(v)).to(p.device).view_as(p))

    def pull(self) -> None:
        """Loads psd's current values into the module (e.g. before an
        evaluation, or to catch up with the other workers)."""
        self._load(self.client.pull(list(self.named)))

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Pushes each parameter's gradient (those without one are left
        out) and loads the values psd returns into the module. With a
        closure, calls it first (with gradients enabled) and returns its
        loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = {n: p.grad.detach().to("cpu", torch.float32).numpy()
                 for n, p in self.named.items() if p.grad is not None}
        if not grads:
            return loss
        self.last = self.client.push(grads, return_values=True)
        assert self.last.values is not None
        self._load(self.last.values)
        return loss


# ---- embeddings on psd's sparse tables ------------------------------------

_ID_DTYPES = (torch.int64, torch.int32)


def _check_ids(layer: str, t: Any) -> torch.Tensor:
    """ids as a tensor of int64 or int32; anything else (floats above all)
    is a TypeError naming the layer, before anything is sent."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: ids must be a torch.Tensor of int64, got %s"
                        % (layer, type(t).__name__))
    if t.dtype not in _ID_DTYPES:
        raise TypeError("%s: ids dtype is %s, expected torch.int64 (or torch.int32)"
                        % (layer, t.dtype))
    return t


class _Rows(torch.autograd.Function):
    """The rows of a batch's unique keys as a [U (+1 zero row for padding),
    dim] tensor whose backward pushes its gradient to psd: each key's
    gradient arrives summed over its uses by autograd and is pushed once;
    the zero row of the padding id is never pushed."""

    @staticmethod
    def forward(ctx: Any, trigger: torch.Tensor, rows: torch.Tensor,  # type: ignore[override]
                lookup: Any, keys: Any) -> torch.Tensor:
        ctx.lookup = lookup
        ctx.keys = keys
        return rows

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        keys = ctx.keys
        g = grad[:len(keys)].detach().to("cpu", torch.float32).contiguous().numpy()
        ctx.lookup.push(keys, g)
        return None, None, None, None


class _Sharded(torch.nn.Module):
    """What ShardedEmbedding and ShardedEmbeddingBag share: the Lookup, the
    pull of a batch's rows and the autograd hook of its push."""

    def __init__(self, kind: str, client: Client, table: Any, dim: Optional[int], *,
                 padding_idx: Optional[int], offset: Any, hash_salt: Any,
                 optimizer: Optional[Optimizer], create: bool, seed: int,
                 row_dtype: Optional[str], slot_dtype: Optional[str]) -> None:
        super().__init__()
        from . import embedding as _emb
        self.lookup = _emb.layer_lookup(kind, client, table, dim, padding_idx=padding_idx,
                                         offset=offset, hash_salt=hash_salt,
                                         optimizer=optimizer, create=create, seed=seed,
                                         row_dtype=row_dtype, slot_dtype=slot_dtype)
        layer = self.lookup.layer
        self.embedding_dim = self.lookup.dim
        self.padding_idx = padding_idx
        self.layer = layer
        # Makes the rows' node part of the graph so that backward reaches
        # it; not a Parameter, so no dense optimizer or all-reduce sees it.
        self._trigger = torch.zeros(0, requires_grad=True)

    def _weight(self, ids: torch.Tensor, device: torch.device) -> Tuple[torch.Tensor,
                                                                          torch.Tensor, int]:
        """(rows [U(+1), dim] with the push in backward, inverse ids of the
        input's shape, padding row index or -1)."""
        b = self.lookup.batch(ids.detach().cpu().numpy())
        rows = self.lookup.rows(b)
        if self.padding_idx is not None:
            rows = np.concatenate([rows, np.zeros((1, self.embedding_dim), np.float32)])
        w = torch.from_numpy(rows).to(device)
        if torch.is_grad_enabled():
            w = _Rows.apply(self._trigger, w, self.lookup, b.keys)
        inv = torch.from_numpy(b.inverse).to(device)
        return w, inv, (len(b.keys) if self.padding_idx is not None else -1)

    def prefetch(self, ids: torch.Tensor) -> None:
        """Starts pulling the rows of the next batch's ids now, on a thread
        of the layer's own, while the current step computes; the forward of
        those ids then uses them (rows pushed in between are pulled again,
        so that a single worker sees exactly what it would without)."""
        self.lookup.prefetch(_check_ids(self.layer, ids).detach().cpu().numpy())

    def close(self) -> None:
        """Ends the prefetch thread (the Client stays the caller's)."""
        self.lookup.close()

    def extra_repr(self) -> str:
        return "table=%r, dim=%d" % (self.lookup.name, self.embedding_dim)


class ShardedEmbedding(_Sharded):
    """nn.Embedding over a psd sparse table: any shape of int64 ids of any
    range in, [*ids.shape, dim] out.

    Forward pulls the batch's unique ids once (deduplicated here) from
    their shards in parallel; backward pushes each id's gradient, summed
    over its uses, once, and psd applies the table's optimizer to the rows
    (no dense gradient of the table is formed, and no torch optimizer
    holds it). table: a psclient.SparseTable (created if missing) or a
    name (created with `dim` and rows uniform in +-1/sqrt(dim) from `seed`,
    or with create=False attached as it is). optimizer: the table's when
    it has none of its own (default SGD 0.01). padding_idx: an id whose
    output is zeros and that is never updated. offset / hash_salt: map ids
    onto the table's keys (psclient.embedding.table_keys) so that features
    share one table; one value, or one per feature along the ids' last axis.
    row_dtype: "fp16" or "bf16" store the table's rows in half precision on
    psd (half the bytes in its memory, on disk and on the wire; the layer
    still computes in float32), "f32" float32; None: the SparseTable's, or
    f32 for a table given by name. slot_dtype: the same for the table's
    optimizer slots ("fp16" is refused with Adam).

        emb = ShardedEmbedding(client, SparseTable("item", 16,
                               optimizer=Optimizer.adagrad(0.05)))
        vec = emb(torch.tensor([[3, 2**40], [7, 3]]))    # (2, 2, 16)
    """

    def __init__(self, client: Client, table: Any, dim: Optional[int] = None, *,
                 padding_idx: Optional[int] = None, offset: Any = 0, hash_salt: Any = None,
                 optimizer: Optional[Optimizer] = None, create: bool = True,
                 seed: int = 0, row_dtype: Optional[str] = None,
                 slot_dtype: Optional[str] = None) -> None:
        super().__init__("ShardedEmbedding", client, table, dim, padding_idx=padding_idx,
                         offset=offset, hash_salt=hash_salt, optimizer=optimizer,
                         create=create, seed=seed, row_dtype=row_dtype, slot_dtype=slot_dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = _check_ids(self.layer, ids)
        w, inv, _ = self._weight(ids, ids.device)
        return torch.nn.functional.embedding(inv, w)


class ShardedEmbeddingBag(_Sharded):
    """nn.EmbeddingBag over a psd sparse table: bags of int64 ids (2-D
    [bags, n], or 1-D with offsets) reduced by mode "sum" or "mean", with
    per_sample_weights (mode "sum"), as torch's; pulls and pushes as
    ShardedEmbedding (which gives the arguments). padding_idx: an id left
    out of its bag (and of a mean's count), as torch's."""

    def __init__(self, client: Client, table: Any, dim: Optional[int] = None, *,
                 mode: str = "mean", padding_idx: Optional[int] = None, offset: Any = 0,
                 hash_salt: Any = None, optimizer: Optional[Optimizer] = None,
                 create: bool = True, seed: int = 0, row_dtype: Optional[str] = None,
                 slot_dtype: Optional[str] = None) -> None:
        if mode not in ("sum", "mean"):
            raise ValueError("ShardedEmbeddingBag: mode %r, expected 'sum' or 'mean'" % mode)
        super().__init__("ShardedEmbeddingBag", client, table, dim, padding_idx=padding_idx,
                         offset=offset, hash_salt=hash_salt, optimizer=optimizer,
                         create=create, seed=seed, row_dtype=row_dtype, slot_dtype=slot_dtype)
        self.mode = mode

    def forward(self, ids: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        ids = _check_ids(self.layer, ids)
        if ids.dim() not in (1, 2):
            raise ValueError("%s: ids must be 2-D [bags, n] or 1-D with offsets, got shape %s"
                             % (self.layer, list(ids.shape)))
        if (ids.dim() == 1) != (offsets is not None):
            raise ValueError("%s: 1-D ids need offsets, 2-D ids take none" % self.layer)
        w, inv, pad = self._weight(ids, ids.device)
        return torch.nn.functional.embedding_bag(
            inv, w, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
            padding_idx=pad if pad >= 0 else None)
