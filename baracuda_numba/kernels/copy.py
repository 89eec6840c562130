"""Streaming kernels: the ceilings ``baracuda-numba demo`` compares its rows with (``cli._stream_gbs``).

One loop of 16-byte loads and stores (uint64 pairs), ``depth`` loads a thread issued before their stores, in the
launch shapes the ops themselves use, so that the demo's ceiling is the fastest of these loops (and of the driver's
copy) and not a slower loop than the ops' own (an H200's elementwise rows read 104-107% of the driver's copy and of a
resident copy kernel alone, and up to 104% of these loops with 4 pairs a thread):

- ``"resident"``: a grid-stride loop; launched over a resident grid (the ops' resident policies) or over a grid of
  short 128-thread blocks capped per SM (their stream policy);
- ``"covering"``: short-lived blocks, each thread ``depth`` pairs one block width apart, a grid covering the arrays
  (the ops' covering policies, PyTorch's elementwise launch).

Each reads one array (a copy), two or four (their XOR) and writes one: the read:write mixes of the ops, since HBM
reads cost less than writes and a read-heavy op outruns a copy. Two inputs are the backward ops' traffic (gradient and
input in, one result out: 2-5% past a copy on an H100), four a float32 -> int8 quantize's (4 bytes read a byte
written: 100.5% of the copy on an H200).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numba import cuda

from .device import load_u64x2, store_u64x2

__all__ = ["PAIRS_IN_FLIGHT", "LAYOUTS", "INPUTS", "SIGNATURE", "streaming_kernel", "covering_blocks"]

PAIRS_IN_FLIGHT = 4  # the default depth: 64 bytes in flight per thread and input
LAYOUTS = ("resident", "covering")
INPUTS = (1, 2, 4)  # arrays read per array written
# (dst, a, b, c, d, pairs): the inputs a kernel does not read may be any array (the callers pass a)
SIGNATURE = "void(uint64[::1], uint64[::1], uint64[::1], uint64[::1], uint64[::1], int64)"


@functools.cache
def streaming_kernel(inputs: int, layout: str, depth: int = PAIRS_IN_FLIGHT) -> Any:
    """``kernel(dst, a, b, c, d, pairs)``: ``dst[2i], dst[2i + 1] = a[2i], a[2i + 1]`` (``inputs=1``), ``a ^ b``
    (``inputs=2``) or ``a ^ b ^ c ^ d`` (``inputs=4``) for every pair ``i < pairs``, in ``layout`` (see the module
    docstring), ``depth`` pairs of each input in flight per thread (their loads issued before their stores), compiled
    once per process. A ``"covering"`` launch takes :func:`covering_blocks` blocks."""
    if inputs not in INPUTS or layout not in LAYOUTS or depth < 1:
        raise ValueError(f"streaming_kernel: inputs of {INPUTS}, a layout of {LAYOUTS} and depth >= 1, got {inputs}, "
                         f"{layout!r}, {depth}")
    covering = layout == "covering"
    words = 2 * depth  # a compile-time constant for the local array's size

    def kernel(dst, a, b, c, d, pairs):
        held = cuda.local.array(words, np.uint64)
        if covering:  # this block's `depth` block widths, once
            stride = cuda.blockDim.x
            i = cuda.blockIdx.x * stride * depth + cuda.threadIdx.x
            end = min(pairs, i + depth * stride)
        else:
            stride = cuda.gridsize(1)
            i = cuda.grid(1)
            end = pairs
        while i + (depth - 1) * stride < end:
            for j in range(depth):
                held[2 * j], held[2 * j + 1] = load_u64x2(a, i + j * stride)
            if inputs >= 2:
                for j in range(depth):
                    lo, hi = load_u64x2(b, i + j * stride)
                    held[2 * j], held[2 * j + 1] = held[2 * j] ^ lo, held[2 * j + 1] ^ hi
            if inputs == 4:
                for j in range(depth):
                    lo, hi = load_u64x2(c, i + j * stride)
                    lo2, hi2 = load_u64x2(d, i + j * stride)
                    held[2 * j], held[2 * j + 1] = held[2 * j] ^ lo ^ lo2, held[2 * j + 1] ^ hi ^ hi2
            for j in range(depth):
                store_u64x2(dst, i + j * stride, held[2 * j], held[2 * j + 1])
            i += depth * stride
        while i < end:
            lo, hi = load_u64x2(a, i)
            if inputs >= 2:
                b_lo, b_hi = load_u64x2(b, i)
                lo, hi = lo ^ b_lo, hi ^ b_hi
            if inputs == 4:
                c_lo, c_hi = load_u64x2(c, i)
                d_lo, d_hi = load_u64x2(d, i)
                lo, hi = lo ^ c_lo ^ d_lo, hi ^ c_hi ^ d_hi
            store_u64x2(dst, i, lo, hi)
            i += stride

    return cuda.jit(SIGNATURE)(kernel)


def covering_blocks(pairs: int, threads: int, depth: int = PAIRS_IN_FLIGHT) -> int:
    """Blocks of ``threads`` a ``"covering"`` launch over ``pairs`` pairs with ``depth`` pairs a thread takes (at
    least one)."""
    return max(1, -(-pairs // (threads * depth)))

