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
