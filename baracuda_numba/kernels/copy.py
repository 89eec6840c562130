"""A device-to-device copy kernel: the ceiling ``baracuda-numba demo`` compares its rows with (``cli._copy_gbs``).

A grid-stride copy of uint64 pairs in 16-byte loads and stores, :data:`PAIRS_IN_FLIGHT` loads issued before their
stores, written like the ops' own loops, so that the demo's ceiling is a kernel's and not only the driver's copy
(which an H200's elementwise kernels outrun by 4-7%).
"""

from __future__ import annotations

import functools
from typing import Any

from numba import cuda

from .device import load_u64x2, store_u64x2

__all__ = ["PAIRS_IN_FLIGHT", "SIGNATURE", "copy_pairs", "copy_kernel"]

PAIRS_IN_FLIGHT = 4  # 64 bytes in flight per thread
SIGNATURE = "void(uint64[::1], uint64[::1], int64)"


def copy_pairs(dst, src, pairs):
    """``dst[2i], dst[2i + 1] = src[2i], src[2i + 1]`` for every pair ``i < pairs``."""
    stride = cuda.gridsize(1)
    i = cuda.grid(1)
    while i + (PAIRS_IN_FLIGHT - 1) * stride < pairs:
        lo0, hi0 = load_u64x2(src, i)
        lo1, hi1 = load_u64x2(src, i + stride)
        lo2, hi2 = load_u64x2(src, i + 2 * stride)
        lo3, hi3 = load_u64x2(src, i + 3 * stride)
        store_u64x2(dst, i, lo0, hi0)
        store_u64x2(dst, i + stride, lo1, hi1)
        store_u64x2(dst, i + 2 * stride, lo2, hi2)
        store_u64x2(dst, i + 3 * stride, lo3, hi3)
        i += PAIRS_IN_FLIGHT * stride
    while i < pairs:
        lo, hi = load_u64x2(src, i)
        store_u64x2(dst, i, lo, hi)
        i += stride


@functools.cache
def copy_kernel() -> Any:
    """:func:`copy_pairs` compiled for :data:`SIGNATURE` (once per process)."""
    return cuda.jit(SIGNATURE)(copy_pairs)
