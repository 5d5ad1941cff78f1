"""splitmix64's finalizer over numpy arrays: the hash under the shard of a
sparse id (sparse.py) and under hash_salt (embedding.py).

It imports numpy alone, not the rest of psclient, so that
examples/dlrm_data.py can load this file by its path and make the same
hashes without a built client.

Threads and lifetime: a pure function.
"""
from typing import Any

import numpy as np

_M1 = np.uint64(0xbf58476d1ce4e5b9)
_M2 = np.uint64(0x94d049bb133111eb)


def mix64(x: Any) -> np.ndarray:
    """splitmix64's finalizer of each element (uint64, wrapping); int64
    input is read as its two's-complement bits."""
    a = np.asarray(x)
    x = a.astype(np.uint64) if a.dtype == np.uint64 else a.astype(np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
    return x
