"""Device-to-device copy kernels: the ceilings ``baracuda-numba demo`` compares its rows with (``cli._copy_gbs``).

A grid-stride copy of uint64 pairs in 16-byte loads and stores, :data:`PAIRS_IN_FLIGHT` loads issued before their
stores, written like the ops' own loops, so that the demo's ceiling is a kernel's and not only the driver's copy
(which an H200's elementwise kernels outrun by 4-7%); and the same loop reading two arrays and writing one
(:func:`combine_pairs`), the traffic of the backward ops (gradient and input in, one result out), which outrun a
copy by 2-5% on an H100 because HBM reads cost less than writes.
"""

from __future__ import annotations

import functools
from typing import Any

from numba import cuda

from .device import load_u64x2, store_u64x2

__all__ = ["PAIRS_IN_FLIGHT", "SIGNATURE", "COMBINE_SIGNATURE", "copy_pairs", "copy_kernel", "combine_pairs",
           "combine_kernel"]

PAIRS_IN_FLIGHT = 4  # 64 bytes in flight per thread
SIGNATURE = "void(uint64[::1], uint64[::1], int64)"
COMBINE_SIGNATURE = "void(uint64[::1], uint64[::1], uint64[::1], int64)"


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


def combine_pairs(dst, a, b, pairs):
    """``dst[2i], dst[2i + 1] = a[2i] ^ b[2i], a[2i + 1] ^ b[2i + 1]`` for every pair ``i < pairs``: two arrays
    read, one written."""
    stride = cuda.gridsize(1)
    i = cuda.grid(1)
    while i + (PAIRS_IN_FLIGHT - 1) * stride < pairs:
        a0, a1 = load_u64x2(a, i)
        a2, a3 = load_u64x2(a, i + stride)
        a4, a5 = load_u64x2(a, i + 2 * stride)
        a6, a7 = load_u64x2(a, i + 3 * stride)
        b0, b1 = load_u64x2(b, i)
        b2, b3 = load_u64x2(b, i + stride)
        b4, b5 = load_u64x2(b, i + 2 * stride)
        b6, b7 = load_u64x2(b, i + 3 * stride)
        store_u64x2(dst, i, a0 ^ b0, a1 ^ b1)
        store_u64x2(dst, i + stride, a2 ^ b2, a3 ^ b3)
        store_u64x2(dst, i + 2 * stride, a4 ^ b4, a5 ^ b5)
        store_u64x2(dst, i + 3 * stride, a6 ^ b6, a7 ^ b7)
        i += PAIRS_IN_FLIGHT * stride
    while i < pairs:
        a0, a1 = load_u64x2(a, i)
        b0, b1 = load_u64x2(b, i)
        store_u64x2(dst, i, a0 ^ b0, a1 ^ b1)
        i += stride


@functools.cache
def combine_kernel() -> Any:
    """:func:`combine_pairs` compiled for :data:`COMBINE_SIGNATURE` (once per process)."""
    return cuda.jit(COMBINE_SIGNATURE)(combine_pairs)
