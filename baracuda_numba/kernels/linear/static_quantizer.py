"""The static-activation linear's quantizer: ``x`` quantized with one given per-tensor scale for the GEMM.

``xq = clamp(rint(x * (1 / tensor_scale)), -127, 127)`` (NaN -> 0) by the fused kernel's own piece
function, so the bits of :class:`~baracuda_numba.plans.per_tensor.QuantizePerTensorPlan` with zero point 0,
and ``tensor_scale`` stored as each of the ``rows`` row scales that the per-token GEMM's epilogue reads.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda

from ...vocabulary import ElementKind, MathPrecision
from .. import device, memory
from ..elementwise import ElementwiseKernel, uint_name
from .fused import row_quantizer

__all__ = ["StaticQuantizerConfig", "static_quantizer_kernel"]


@dataclass(frozen=True)
class StaticQuantizerConfig:
    """The static quantizer of ``x_element`` (16- or 32-bit floats)."""

    x_element: ElementKind

    def __post_init__(self) -> None:
        if self.x_element.itemsize not in (2, 4) or not self.x_element.is_float:
            raise ValueError(f"the static quantizer takes 16- or 32-bit floats, not {self.x_element.short}")

    @property
    def name(self) -> str:
        return f"w8a8_static_quantize_{self.x_element.short}"


@functools.cache
def static_quantizer_kernel(config: StaticQuantizerConfig) -> ElementwiseKernel:
    """The quantizer of ``config`` (cached on it).

    ``kernel(x_pairs, xq_words, row_scale, pieces, rows, tensor_scale)``: ``x_pairs`` uint64 (two per piece),
    ``xq_words`` one word of ``16 / itemsize`` bytes per piece, ``row_scale`` float32. A grid-stride loop over
    the pieces, one load per step. It waits for the kernel before it (which may write ``x``) before it reads
    anything, then lets its own programmatic dependent (the GEMM) start: no reduction stands between its load
    and its store, which is the whole of what it shortens against the per-token quantizer."""
    S, per_pair, _, _, quantized_piece = row_quantizer(config.x_element)
    word_type = {4: np.uint32, 8: np.uint64}[per_pair]  # one byte per element of a 16-byte piece

    def kernel(x_pairs, xq_words, row_scale, pieces, rows, tensor_scale):
        memory.grid_dependency_wait()  # x may be the kernel before's output
        memory.launch_dependents()  # the GEMM's weight loads may start: it waits for this grid to read xq
        scale = S(tensor_scale)
        inv = S(1) / scale  # what the per-tensor plan computes on the host
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < rows:
            row_scale[i] = scale
        step = cuda.gridDim.x * cuda.blockDim.x
        while i < pieces:
            lo, hi = device.load_u64x2(x_pairs, i)
            xq_words[i] = word_type(quantized_piece(lo, hi, inv))
            i += step

    kernel.__name__ = kernel.__qualname__ = config.name
    signature = f"void(uint64[::1], {uint_name(per_pair)}[::1], float32[::1], int64, int64, float32)"
    return ElementwiseKernel(kernel, signature, config.x_element, None, ElementKind.S8, MathPrecision.F32, per_pair)
