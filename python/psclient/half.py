"""Dense tensors in half precision on the wire (ps.v1 DTYPE_FLOAT16,
DTYPE_BFLOAT16), as psd converts them (common/half.h): round to nearest,
ties to even; float16's finite overflow clamped to +-65504; and the error
feedback a worker pushes with: each variable keeps the residual of its
rounding, added to its next gradient, so that the sum of what was sent
plus the residual equals the sum of the gradients.

Threads and lifetime: the functions are pure; an ErrorFeedback belongs to
one client and is used under its calls.
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from ._proto import pb

# What psd appends to the message of a push it refused at grads[i] after
# applying the gradients before it (common/wire.h PS_WIRE_APPLIED_BEFORE).
APPLIED_BEFORE = "; the gradients before grads["

NAMES = {"f32": 1, "float32": 1, "fp16": 2, "float16": 2, "bf16": 3, "bfloat16": 3}
F16_MAX = 65504.0


def wire_dtype(name: str) -> int:
    """"bf16", "fp16" or "f32" as a ps.v1.DType value."""
    try:
        return NAMES[name]
    except KeyError:
        raise ValueError("wire_dtype: '%s' is not bf16, fp16 or f32" % name) from None


def to_half(a: np.ndarray, dtype: int) -> Tuple[np.ndarray, int]:
    """float32 a as uint16 bits of dtype, and how many values were clamped."""
    a = np.ascontiguousarray(a, dtype="<f4").reshape(-1)
    if dtype == pb.DTYPE_BFLOAT16:
        u = a.view("<u4").astype(np.uint64)
        nan = np.isnan(a)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
        r[nan] = ((u[nan] >> 16) | 0x40).astype("<u2")
        return r, 0
    over = np.isfinite(a) & (np.abs(a) >= 65520.0)
    clamped = int(over.sum())
    if clamped:
        a = np.where(over, np.copysign(np.float32(F16_MAX), a), a).astype("<f4")
    with np.errstate(over="ignore"):
        return a.astype("<f2").view("<u2"), clamped


def from_half(bits: np.ndarray, dtype: int) -> np.ndarray:
    """uint16 bits of dtype as float32 (exact)."""
    bits = np.ascontiguousarray(bits, dtype="<u2").reshape(-1)
    if dtype == pb.DTYPE_BFLOAT16:
        return (bits.astype("<u4") << 16).view("<f4")
    return bits.view("<f2").astype("<f4")


def applied_before(details: str) -> int:
    """How many gradients of a refused push psd applied before the one it
    refused, as its message says; 0 when it does not say."""
    at = details.find(APPLIED_BEFORE)
    if at < 0:
        return 0
    digits = details[at + len(APPLIED_BEFORE):].split("]", 1)[0]
    return int(digits) if digits.isdigit() else 0


class ErrorFeedback:
    """Per variable part: the residual of the last rounding (float32)."""

    def __init__(self) -> None:
        self.residual: Dict[str, np.ndarray] = {}

    def encode(self, name: str, g: np.ndarray, dtype: int) -> np.ndarray:
        """half(g + r), keeping r = (g + r) - float(sent)."""
        flat = np.ascontiguousarray(g, dtype="<f4").reshape(-1)
        r = self.residual.get(name)
        t = flat + r if r is not None and r.shape == flat.shape else flat.copy()
        h, _ = to_half(t, dtype)
        self.residual[name] = t - from_half(h, dtype)
        return h

    def give_back(self, name: str, h: np.ndarray, dtype: int) -> None:
        """After a push that did not deliver h (encode's): r += float(h),
        which is exactly the g + r that encode started from, so that the
        next push sends it."""
        r = self.residual.get(name)
        if r is not None and r.shape == h.shape:
            self.residual[name] = r + from_half(h, dtype)
