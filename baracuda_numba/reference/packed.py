"""NumPy reference of the packed 4-bit layout: two values per byte along the last axis, the
even-indexed value in the low nibble (S4 as 4-bit two's complement)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["pack_nibbles", "unpack_nibbles"]


def pack_nibbles(values: Any) -> np.ndarray:
    """Integer values in a 4-bit range, ``[..., D]`` (D even) -> ``uint8 [..., D / 2]``."""
    v = np.asarray(values).astype(np.int64) & 0xF
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed: Any, signed: bool) -> np.ndarray:
    """``uint8 [..., D / 2]`` -> int8 values ``[..., D]`` (sign-extended when ``signed``)."""
    b = np.asarray(packed).astype(np.int64)
    v = np.stack([b & 0xF, b >> 4], axis=-1).reshape(*b.shape[:-1], 2 * b.shape[-1])
    if signed:
        v = np.where(v >= 8, v - 16, v)
    return v.astype(np.int8)
