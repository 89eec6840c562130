"""The int8 GEMM of the W8A8 linear layers, on tensor cores.

``y[m, n] = f32(acc[m, n]) * row_scale[m] * col_scale[n] (+ bias[n])`` with
``acc[m, n] = sum_k a[m, k] * w[n, k]`` accumulated exactly in int32 by
``mma.sync.m16n8k32.s8`` (:func:`baracuda_numba.kernels.device.mma_s8`), ``a`` ``[M, K]`` int8
row-major (quantized activations), ``w`` ``[N, K]`` int8 row-major (``nn.Linear.weight``), the
epilogue in float32 and the result stored in the output element. The row scale is per token
(``row_scale[m]``) or one static per-tensor value (SmoothQuant).

Layout: a block of ``WARPS_M x WARPS_N`` warps computes a ``BLOCK_M x BLOCK_N`` tile; each warp
``MT x NT`` mma tiles (``16 MT x 8 NT`` outputs). Fragments are 4-byte words read straight from
global memory (each is four consecutive ``k`` of one row, which is how the mma lays its operands
out); rows and ``k`` past the edges read as zero. With ``K % 4 != 0`` the words are assembled from
bytes. Tiles are numbered along ``M`` fastest on a 1-D grid, so ``M`` has no 65535-row limit.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from ..vocabulary import ElementKind, MathPrecision
from . import device
from .codecs import codec
from .device import device_function
from .elementwise import ElementwiseKernel, uint_name

__all__ = ["MT", "NT", "WARPS_M", "WARPS_N", "BLOCK_M", "BLOCK_N", "THREADS", "MAX_EXACT_K", "linear_kernel"]

MT, NT = 2, 4  # mma tiles per warp along M (16 rows each) and N (8 columns each)
WARPS_M, WARPS_N = 2, 2
BLOCK_M, BLOCK_N = 16 * MT * WARPS_M, 8 * NT * WARPS_N
THREADS = 32 * WARPS_M * WARPS_N
# |acc| <= K * 127 * 128 (activations in [-127, 127], weights in [-128, 127]) must stay below 2**31.
MAX_EXACT_K = (2**31 - 1) // (127 * 128)


@functools.cache
def linear_kernel(out: ElementKind, has_bias: bool, per_tensor_rows: bool) -> ElementwiseKernel:
    """The GEMM + epilogue kernel writing ``out`` (f32 / f64 / f16 / bf16). With ``per_tensor_rows``
    the row scale is the scalar ``tensor_scale`` (SmoothQuant's static activation scale), else
    ``row_scale[m]`` (per-token activation scales)."""
    encode = codec(out, MathPrecision.F32).encode
    mma = device.mma_s8
    u32 = np.uint32
    f32 = np.float32
    acc_len, a_len, b_len = 4 * MT * NT, 4 * MT, 2 * NT  # constants for the local arrays

    @device_function
    def word(bytes_view, words_view, row, rows, k, K, aligned):
        """Bytes ``k .. k + 3`` of row ``row`` as a little-endian word; zeros past the edges."""
        if row >= rows or k >= K:
            return u32(0)
        if aligned and k + 4 <= K:
            return u32(words_view[(row * K + k) // 4])
        value = u32(0)
        for i in range(4):
            if k + i < K:
                value |= u32(bytes_view[row * K + k + i]) << u32(8 * i)
        return value

    def kernel(a_bytes, a_words, w_bytes, w_words, row_scale, col_scale, bias, out_elems,
               M, N, K, tiles_m, aligned, tensor_scale):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array((THREADS, 6), np.int32)  # used only by the simulator's mma
        acc = cuda.local.array(acc_len, np.int32)
        a_frag = cuda.local.array(a_len, np.uint32)
        b_frag = cuda.local.array(b_len, np.uint32)
        warp, lane = tid // 32, tid % 32
        group, t = lane // 4, lane % 4
        tile = cuda.blockIdx.x
        tile_n = tile // tiles_m
        tile_m = tile - tile_n * tiles_m
        m0 = tile_m * BLOCK_M + (warp % WARPS_M) * (16 * MT)
        n0 = tile_n * BLOCK_N + (warp // WARPS_M) * (8 * NT)
        for i in range(acc_len):
            acc[i] = 0
        for k0 in range(0, K, 32):
            k_lo = k0 + 4 * t
            for mi in range(MT):
                row = m0 + 16 * mi + group
                a_frag[4 * mi] = word(a_bytes, a_words, row, M, k_lo, K, aligned)
                a_frag[4 * mi + 1] = word(a_bytes, a_words, row + 8, M, k_lo, K, aligned)
                a_frag[4 * mi + 2] = word(a_bytes, a_words, row, M, k_lo + 16, K, aligned)
                a_frag[4 * mi + 3] = word(a_bytes, a_words, row + 8, M, k_lo + 16, K, aligned)
            for ni in range(NT):
                col = n0 + 8 * ni + group
                b_frag[2 * ni] = word(w_bytes, w_words, col, N, k_lo, K, aligned)
                b_frag[2 * ni + 1] = word(w_bytes, w_words, col, N, k_lo + 16, K, aligned)
            for mi in range(MT):
                for ni in range(NT):
                    base = 4 * (mi * NT + ni)
                    acc[base], acc[base + 1], acc[base + 2], acc[base + 3] = mma(
                        a_frag[4 * mi], a_frag[4 * mi + 1], a_frag[4 * mi + 2], a_frag[4 * mi + 3],
                        b_frag[2 * ni], b_frag[2 * ni + 1],
                        acc[base], acc[base + 1], acc[base + 2], acc[base + 3], scratch, tid)
        for mi in range(MT):
            for ni in range(NT):
                base = 4 * (mi * NT + ni)
                for slot in range(4):
                    m = m0 + 16 * mi + group + (8 if slot >= 2 else 0)
                    n = n0 + 8 * ni + 2 * t + slot % 2
                    if m < M and n < N:
                        rs = tensor_scale if per_tensor_rows else f32(row_scale[m])
                        value = f32(acc[base + slot]) * rs * col_scale[n]
                        if has_bias:
                            value = value + bias[n]
                        out_elems[m * N + n] = encode(value)

    # per-token scales come from the dynamic quantizer: float64 for float64 activations
    row = "float64" if out is ElementKind.F64 and not per_tensor_rows else "float32"
    signature = (f"void(uint8[::1], uint32[::1], uint8[::1], uint32[::1], {row}[::1], float32[::1], float32[::1], "
                 f"{uint_name(out.itemsize)}[::1], int64, int64, int64, int64, boolean, float32)")
    kernel.__name__ = kernel.__qualname__ = (f"w8a8_gemm_{out.short}{'_bias' if has_bias else ''}"
                                             f"{'_tensor' if per_tensor_rows else '_token'}")
    return ElementwiseKernel(kernel, signature, ElementKind.S8, ElementKind.S8, out, MathPrecision.F32, 32)

