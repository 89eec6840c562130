"""What every W8A8 GEMM kernel shares: the operand loaders, the ``mma`` step and the epilogue.

``y[m, n] = f32(acc[m, n]) * row_scale[m] * col_scale[n] (+ bias[n])`` with
``acc[m, n] = sum_k a[m, k] * w[n, k]`` accumulated exactly in int32 by
``mma.sync.m16n8k32.s8`` (:func:`baracuda_numba.kernels.device.mma_s8`), ``a`` ``[M, K]`` int8
row-major (quantized activations), ``w`` ``[N, K]`` int8 row-major (``nn.Linear.weight``), the
epilogue in float32 and the result stored in the output element. The row scale is per token
(``row_scale[m]``) or one static per-tensor value (SmoothQuant's ``tensor_scale``).

The ``mma.sync`` kernels walk ``K`` in 64-byte chunks. Each lane brings 16 contiguous bytes of a row
(``k = 16 t .. 16 t + 15`` for lane ``4 g + t``) and feeds them to two mmas: words 0, 1 to the first,
words 2, 3 to the second. That permutes ``k`` inside the chunk relative to the mma's own operand
layout, identically for ``a`` and ``w``, so the dot products are unchanged while every access is a
16-byte vector. Rows and ``k`` past the edges read as zero; when ``K % 16 != 0`` or an operand is not
16-byte aligned the chunks are assembled from bytes.

Every kernel of the family takes the same arguments (``docs/design-linear.md``, "Kernel arguments"):
``a_bytes, a_pairs, w_bytes, w_pairs, row_scale, col_scale, bias, out_elems, M, N, K, tiles_m, aligned,
tensor_scale``; the fused kernel's ``a`` is ``x`` itself (its elements and 16-byte pairs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ...platform import SIMULATOR
from ...vocabulary import ElementKind, MathPrecision
from .. import device
from ..codecs import codec
from ..device import device_function
from ..elementwise import uint_name

__all__ = ["cuda", "ABSMAX_LOADS", "CHUNK_K", "MAX_EXACT_K", "SKINNY_MAX_M", "SKINNY_M", "SKINNY_N", "SKINNY_WARPS",
           "SKINNY_THREADS", "Output", "Epilogue", "epilogue", "gemm_signature", "load_chunk", "vector_chunk_loader",
           "load_vector_chunk", "mma_chunk"]

CHUNK_K = 64  # k per step of the mma.sync kernels: 16 bytes per lane, 4 lanes per row
# The decode kernels (M <= SKINNY_MAX_M): SKINNY_WARPS warps split K for 16-row x 8-column mma tiles.
SKINNY_MAX_M, SKINNY_M, SKINNY_N, SKINNY_WARPS = 64, 16, 8, 8
SKINNY_THREADS = 32 * SKINNY_WARPS
# the fused kernel's general prologue: 16-byte pieces of x per thread in flight (8 spill at 80 registers); the
# unfused decode kernel declares the same local arrays (see its body)
ABSMAX_LOADS = 4
# |acc| <= K * 127 * 128 (activations in [-127, 127], weights in [-128, 127]) must stay below 2**31.
MAX_EXACT_K = (2**31 - 1) // (127 * 128)

if SIMULATOR:

    class _RunningKernelCuda:
        """Under the simulator, ``numba.cuda`` as the running kernel sees it. The simulator swaps its per-launch
        module into the kernel's own module only, and the decode kernels' device functions live in other
        modules (:mod:`.decode`, :mod:`.fused`), which import this in place of ``numba.cuda``."""

        def __getattr__(self, name: str) -> Any:
            from numba.cuda.simulator.kernel import _get_kernel_context

            return getattr(_get_kernel_context(), name)

    cuda: Any = _RunningKernelCuda()
else:
    from numba import cuda

# 16-byte vector accesses need 16-byte aligned staging (the simulator takes no alignment argument)
STAGE_ALIGNMENT = None if SIMULATOR else 16
# the simulator sizes a dynamic shared array by its dtype's itemsize: it needs a dtype instance there
DYNAMIC_STAGE_DTYPE = np.dtype(np.uint64) if SIMULATOR else np.uint64
U64 = np.uint64
LOW32 = U64(0xFFFFFFFF)


@dataclass(frozen=True)
class Output:
    """The epilogue's key: the output element, whether a bias is added, and whether the row scale is
    one per-tensor value (``tensor_scale``, SmoothQuant) rather than ``row_scale[m]`` (per token)."""

    element: ElementKind
    has_bias: bool = False
    per_tensor_rows: bool = False

    @property
    def suffix(self) -> str:
        """The kernel-name suffix: ``{element}[_bias]_{tensor|token}``."""
        rows = "_tensor" if self.per_tensor_rows else "_token"
        return f"{self.element.short}{'_bias' if self.has_bias else ''}{rows}"

    @property
    def row_type(self) -> str:
        """The numba type of ``row_scale``: per-token scales come from the dynamic quantizer, in float64 for
        float64 activations."""
        return "float64" if self.element is ElementKind.F64 and not self.per_tensor_rows else "float32"


def gemm_signature(output: Output, a_view: str = "uint8") -> str:
    """The family's kernel signature (see the module doc); ``a_view``: the element type of ``a_bytes``."""
    return (f"void({a_view}[::1], uint64[::1], uint8[::1], uint64[::1], {output.row_type}[::1], float32[::1], "
            f"float32[::1], {uint_name(output.element.itemsize)}[::1], int64, int64, int64, int64, boolean, float32)")


@device_function
def load_chunk(bytes_view, pairs_view, row, rows, k, K, aligned):
    """Bytes ``k .. k + 15`` of row ``row`` of a ``[rows, K]`` int8 matrix as two little-endian
    uint64; zeros past the edges."""
    lo = U64(0)
    hi = U64(0)
    if row < rows and k < K:
        start = row * K + k
        if aligned and k + 16 <= K:
            lo, hi = device.load_u64x2(pairs_view, start // 16)
        else:
            # a runtime-length loop keeps this rare path small where it is inlined
            for i in range(min(K - k, 16)):
                byte = U64(bytes_view[start + i])
                if i < 8:
                    lo |= byte << U64(8 * i)
                else:
                    hi |= byte << U64(8 * i - 64)
    return lo, hi


@functools.cache
def vector_chunk_loader(hint: str = ""):
    """``load_vector_chunk(pairs_view, row, rows, k, K)``: :func:`load_chunk` of a matrix known to be
    16-byte aligned with ``K % 16 == 0`` (``k`` a multiple of 16), one vector load (with the cache
    operators of ``hint``, see :func:`~baracuda_numba.kernels.device.hinted_load_u64x2`) or zeros, no
    byte path."""
    load_pair = device.hinted_load_u64x2(hint)

    @device_function
    def load_vector_chunk(pairs_view, row, rows, k, K):
        lo = U64(0)
        hi = U64(0)
        if row < rows and k < K:
            lo, hi = load_pair(pairs_view, (row * K + k) >> 4)  # a shift: row * K + k >= 0
        return lo, hi

    return load_vector_chunk


load_vector_chunk = vector_chunk_loader()


@device_function
def mma_chunk(acc, base, x0, x1, y0, y1, w0, w1, scratch, tid):
    """``acc[base .. base + 3] +=`` one 16 x 8 tile over a 64-k chunk: rows ``g`` / ``g + 8`` of ``a`` as
    ``(x0, x1)`` / ``(y0, y1)``, column ``g`` of ``w`` as ``(w0, w1)`` (two mmas, see the module doc)."""
    c0, c1, c2, c3 = device.mma_s8(x0 & LOW32, y0 & LOW32, x0 >> U64(32), y0 >> U64(32),
                                   w0 & LOW32, w0 >> U64(32),
                                   acc[base], acc[base + 1], acc[base + 2], acc[base + 3], scratch, tid)
    c0, c1, c2, c3 = device.mma_s8(x1 & LOW32, y1 & LOW32, x1 >> U64(32), y1 >> U64(32),
                                   w1 & LOW32, w1 >> U64(32), c0, c1, c2, c3, scratch, tid)
    acc[base] = c0
    acc[base + 1] = c1
    acc[base + 2] = c2
    acc[base + 3] = c3


class Epilogue(NamedTuple):
    """The device functions of one output's epilogue (see :func:`epilogue`)."""

    store: Any
    row_param: Any
    column_params: Any
    store_with: Any
    encoded: Any


def epilogue(output: Output) -> Epilogue:
    """The epilogue's device functions for ``output``: ``out[m, n] = (f32(acc) * row scale) * col_scale[n]
    (+ bias[n])``, rounded once to the output element (the one epilogue of every kernel of the family, so
    that every kernel gives the same bits)."""
    encode = codec(output.element, MathPrecision.F32).encode
    has_bias, per_tensor_rows = output.has_bias, output.per_tensor_rows
    f32 = np.float32

    @device_function
    def column_params(n, N, col_scale, bias):
        """``(col_scale[n], bias[n])`` (zeros past ``N``, bias 0 without one)."""
        cs = b = f32(0)
        if n < N:
            cs = col_scale[n]
            if has_bias:
                b = bias[n]
        return cs, b

    @device_function
    def encoded(acc_value, rs, cs, b):
        """The output element's bits of ``(f32(acc) * rs) * cs (+ b)``."""
        value = f32(acc_value) * rs * cs
        if has_bias:
            value = device.add_rn(value, b)
        return encode(value)

    @device_function
    def store_with(acc_value, rs, cs, b, m, n, M, N, out_elems):
        """``out[m, n] = (f32(acc) * rs) * cs (+ b)`` inside the matrix."""
        if m < M and n < N:
            out_elems[m * N + n] = encoded(acc_value, rs, cs, b)

    @device_function
    def row_param(m, row_scale, tensor_scale):
        """Row ``m``'s activation scale (``m < M``)."""
        return tensor_scale if per_tensor_rows else f32(row_scale[m])

    @device_function
    def store(acc_value, m, n, M, N, row_scale, col_scale, bias, out_elems, tensor_scale):
        """``out[m, n] = (f32(acc) * row scale) * col_scale[n] (+ bias[n])`` inside the matrix."""
        if m < M and n < N:
            cs, b = column_params(n, N, col_scale, bias)
            store_with(acc_value, row_param(m, row_scale, tensor_scale), cs, b, m, n, M, N, out_elems)

    return Epilogue(store, row_param, column_params, store_with, encoded)
