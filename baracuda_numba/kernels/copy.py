"""Streaming kernels: the ceilings ``baracuda-numba demo`` compares its rows with (``cli._stream_gbs``).

One loop of 16-byte loads and stores (uint64 pairs), :data:`PAIRS_IN_FLIGHT` loads issued before their stores, in
the two launch layouts the ops themselves use, so that the demo's ceiling is the fastest of these loops (and of the
driver's copy) and not a slower loop than the ops' own (an H200's elementwise rows read 104-107% of the driver's copy
and of a resident copy kernel alone):

- ``"resident"``: a grid-stride loop over a grid that stays resident (the ops' resident policies);
- ``"covering"``: short-lived blocks, each thread :data:`PAIRS_IN_FLIGHT` pairs one block width apart, a grid
  covering the arrays (the ops' stream and covering policies, PyTorch's elementwise launch).

Each reads one array (a copy) or two (their XOR: the traffic of the backward ops, gradient and input in, one result
out, which outrun a copy by 2-5% on an H100 because HBM reads cost less than writes).
"""

from __future__ import annotations

import functools
from typing import Any

from numba import cuda

from .device import load_u64x2, store_u64x2

__all__ = ["PAIRS_IN_FLIGHT", "LAYOUTS", "SIGNATURE", "streaming_kernel", "covering_blocks", "copy_kernel",
           "combine_kernel"]

PAIRS_IN_FLIGHT = 4  # 64 bytes in flight per thread and input
LAYOUTS = ("resident", "covering")
SIGNATURE = "void(uint64[::1], uint64[::1], uint64[::1], int64)"  # (dst, a, b, pairs); b unread by a copy


@functools.cache
def streaming_kernel(inputs: int, layout: str) -> Any:
    """``kernel(dst, a, b, pairs)``: ``dst[2i], dst[2i + 1] = a[2i], a[2i + 1]`` (``inputs=1``; ``b`` is not read)
    or ``a ^ b`` (``inputs=2``) for every pair ``i < pairs``, in ``layout`` (see the module docstring), compiled once
    per process. A ``"covering"`` launch takes :func:`covering_blocks` blocks."""
    if inputs not in (1, 2) or layout not in LAYOUTS:
        raise ValueError(f"streaming_kernel: inputs 1 or 2 and a layout of {LAYOUTS}, got {inputs}, {layout!r}")
    two, covering = inputs == 2, layout == "covering"

    def kernel(dst, a, b, pairs):
        if covering:  # this block's PAIRS_IN_FLIGHT block widths, once
            stride = cuda.blockDim.x
            i = cuda.blockIdx.x * stride * PAIRS_IN_FLIGHT + cuda.threadIdx.x
            end = min(pairs, i + PAIRS_IN_FLIGHT * stride)
        else:
            stride = cuda.gridsize(1)
            i = cuda.grid(1)
            end = pairs
        while i + (PAIRS_IN_FLIGHT - 1) * stride < end:
            a0, a1 = load_u64x2(a, i)
            a2, a3 = load_u64x2(a, i + stride)
            a4, a5 = load_u64x2(a, i + 2 * stride)
            a6, a7 = load_u64x2(a, i + 3 * stride)
            if two:
                b0, b1 = load_u64x2(b, i)
                b2, b3 = load_u64x2(b, i + stride)
                b4, b5 = load_u64x2(b, i + 2 * stride)
                b6, b7 = load_u64x2(b, i + 3 * stride)
                a0, a1, a2, a3, a4, a5, a6, a7 = a0 ^ b0, a1 ^ b1, a2 ^ b2, a3 ^ b3, a4 ^ b4, a5 ^ b5, a6 ^ b6, a7 ^ b7
            store_u64x2(dst, i, a0, a1)
            store_u64x2(dst, i + stride, a2, a3)
            store_u64x2(dst, i + 2 * stride, a4, a5)
            store_u64x2(dst, i + 3 * stride, a6, a7)
            i += PAIRS_IN_FLIGHT * stride
        while i < end:
            a0, a1 = load_u64x2(a, i)
            if two:
                b0, b1 = load_u64x2(b, i)
                a0, a1 = a0 ^ b0, a1 ^ b1
            store_u64x2(dst, i, a0, a1)
            i += stride

    return cuda.jit(SIGNATURE)(kernel)


def covering_blocks(pairs: int, threads: int) -> int:
    """Blocks of ``threads`` a ``"covering"`` launch over ``pairs`` pairs takes (at least one)."""
    return max(1, -(-pairs // (threads * PAIRS_IN_FLIGHT)))


def copy_kernel() -> Any:
    """The resident copy: ``streaming_kernel(1, "resident")``."""
    return streaming_kernel(1, "resident")


def combine_kernel() -> Any:
    """The resident two-input loop: ``streaming_kernel(2, "resident")``."""
    return streaming_kernel(2, "resident")
