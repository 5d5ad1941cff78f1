"""psclient: the Python client of psd, the parameter server.

A Client speaks to a whole job (a list of psd addresses, or pscoord):
it places the model's variables over the shards as workerd does, splits big
ones by rows, takes and gives numpy arrays, pushes gradients with the values
back in one round trip, follows sync steps and retries across a psd
restart. psclient.torch and psclient.keras make psd the parameter server of
a PyTorch or Keras training loop. Sparse embedding tables (SparseTable,
Client.sparse_pull / sparse_push) are hash-partitioned over the shards.
"""
from ._rpc import PsError, Retry, TLS, read_token
from .client import (Checkpoint, Client, PushResult, Restored, ShardStats, Values,
                     VariableInfo)
from .placement import Part, Placement, SPLIT_DEFAULT, place
from .sparse import SparsePushResult, SparseValues, shard_of
from .specs import Initializer, Optimizer, SparseTable, Variable

__all__ = ["Client", "PushResult", "Values", "Checkpoint", "Restored", "ShardStats",
           "VariableInfo", "PsError", "Retry", "TLS", "read_token",
           "Part", "Placement", "SPLIT_DEFAULT", "place", "Initializer", "Optimizer",
           "Variable", "SparseTable", "SparseValues", "SparsePushResult", "shard_of"]


def _version() -> str:
    """The project's version, written into the package when it was built."""
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_generated", "VERSION")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


__version__ = _version()
