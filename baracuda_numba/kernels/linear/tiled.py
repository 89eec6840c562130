"""The register-staged ``tiled`` GEMM: any alignment, any ``K`` (the prefill path for operands that are not
16-byte aligned or have ``K % 16 != 0``).

A ``128 x 128`` output tile per block of 8 warps (``2 x 4``, each ``64 x 32``), ``a`` and ``w`` chunks
staged through double-buffered shared memory (one barrier per 64 ``k``), the next chunk's global loads
issued before the current chunk's mmas. The epilogue parks the accumulators in the staging buffer one
64-row band at a time and stores consecutive columns per thread (coalesced; ``acc`` is indexed only by
constants, so it never leaves registers). Tiles are numbered along ``M`` fastest on a 1-D grid, so ``M``
has no 65535-row limit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda

from ...vocabulary import ElementKind, MathPrecision
from .. import device
from ..elementwise import ElementwiseKernel
from .common import CHUNK_K, LOW32, STAGE_ALIGNMENT, U64, Output, epilogue, gemm_signature, load_chunk, mma_chunk

__all__ = ["TILE_M", "TILE_N", "TILE_THREADS", "TiledConfig", "tiled_kernel"]

# warps arranged WARPS_M x WARPS_N, each MT x NT mma tiles (16 rows x 8 columns each)
WARPS_M, WARPS_N, MT, NT = 2, 4, 4, 4
TILE_M, TILE_N = 16 * MT * WARPS_M, 8 * NT * WARPS_N
TILE_THREADS = 32 * WARPS_M * WARPS_N
STAGE_WORDS_A = 2 * TILE_M * CHUNK_K // 8  # two stages of activation rows, as uint64
STAGE_WORDS = STAGE_WORDS_A + 2 * TILE_N * CHUNK_K // 8  # and two of weight rows
assert TILE_M == TILE_N == 2 * (TILE_THREADS // 4), "each thread stages two rows of each tile"


@dataclass(frozen=True)
class TiledConfig:
    """The ``tiled`` kernel writing ``output`` (its geometry is fixed: ``TILE_M x TILE_N`` per block of
    ``TILE_THREADS``)."""

    output: Output

    @property
    def name(self) -> str:
        return f"w8a8_gemm_tiled_{self.output.suffix}"


def _kernel(store):
    slots, w_words = 4 * MT * NT, 2 * NT  # local array lengths must be compile-time constants
    w_offset = STAGE_WORDS_A // 2  # the weight stages follow the activation stages (in 16-byte pairs)
    half_rows = TILE_M // WARPS_M  # the epilogue stages the output tile in WARPS_M horizontal bands
    band_words = half_rows * TILE_N // 2  # int32 accumulators, two per uint64
    assert band_words <= STAGE_WORDS, "an output band must fit in the staging buffer"

    def kernel(a_bytes, a_pairs, w_bytes, w_pairs, row_scale, col_scale, bias, out_elems,
               M, N, K, tiles_m, aligned, tensor_scale):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array((TILE_THREADS, 6), np.int32)  # used only by the simulator's mma
        # [activation stage 0, 1 | weight stage 0, 1], each [rows, 64 bytes]; then the output bands
        stage = cuda.shared.array(STAGE_WORDS, np.uint64, alignment=STAGE_ALIGNMENT)
        acc = cuda.local.array(slots, np.int32)
        w_frag = cuda.local.array(w_words, np.uint64)
        warp, lane = tid // 32, tid % 32
        group, t = lane // 4, lane % 4
        tile_n = cuda.blockIdx.x // tiles_m
        tile_m = cuda.blockIdx.x - tile_n * tiles_m
        m_block, n_block = tile_m * TILE_M, tile_n * TILE_N
        band = warp % WARPS_M
        m_warp = band * (16 * MT)
        n_warp = (warp // WARPS_M) * (8 * NT)
        for i in range(slots):
            acc[i] = 0
        # this thread stages rows `row` and `row + TILE_THREADS // 4` of both tiles, 16 bytes each
        row, part = tid // 4, tid % 4
        far = row + TILE_THREADS // 4
        steps = (K + CHUNK_K - 1) // CHUNK_K
        # step -1 only stages chunk 0; every later step loads the next chunk's rows before this
        # chunk's mmas (zeros past K) and stages them once its own stage has been read
        for step in range(-1, steps):
            k_next = CHUNK_K * (step + 1) + 16 * part
            a0, a1 = load_chunk(a_bytes, a_pairs, m_block + row, M, k_next, K, aligned)
            a2, a3 = load_chunk(a_bytes, a_pairs, m_block + far, M, k_next, K, aligned)
            w0, w1 = load_chunk(w_bytes, w_pairs, n_block + row, N, k_next, K, aligned)
            w2, w3 = load_chunk(w_bytes, w_pairs, n_block + far, N, k_next, K, aligned)
            if step >= 0:
                a_base = 4 * ((step % 2) * TILE_M + m_warp + group) + t
                w_base = w_offset + 4 * ((step % 2) * TILE_N + n_warp + group) + t
                for ni in range(NT):
                    w_frag[2 * ni], w_frag[2 * ni + 1] = device.load_u64x2(stage, w_base + 32 * ni)
                for mi in range(MT):
                    x0, x1 = device.load_u64x2(stage, a_base + 64 * mi)
                    y0, y1 = device.load_u64x2(stage, a_base + 64 * mi + 32)
                    for ni in range(NT):
                        mma_chunk(acc, 4 * (mi * NT + ni), x0, x1, y0, y1, w_frag[2 * ni], w_frag[2 * ni + 1],
                                  scratch, tid)
            # the other stage was last read before the previous barrier
            other = (step + 1) % 2
            device.store_u64x2(stage, 4 * (other * TILE_M + row) + part, a0, a1)
            device.store_u64x2(stage, 4 * (other * TILE_M + far) + part, a2, a3)
            device.store_u64x2(stage, w_offset + 4 * (other * TILE_N + row) + part, w0, w1)
            device.store_u64x2(stage, w_offset + 4 * (other * TILE_N + far) + part, w2, w3)
            cuda.syncthreads()
        # Epilogue, one band of rows at a time: the band's warps park their accumulators in shared
        # memory (constant indices into `acc`, so it stays in registers), then every thread stores
        # consecutive columns (coalesced) through the epilogue.
        for current in range(WARPS_M):
            if band == current:
                for mi in range(MT):
                    for ni in range(NT):
                        base = 4 * (mi * NT + ni)
                        word = (16 * mi + group) * (TILE_N // 2) + (n_warp + 8 * ni) // 2 + t
                        stage[word] = (U64(acc[base]) & LOW32) | (U64(acc[base + 1]) << U64(32))
                        stage[word + 4 * TILE_N] = (U64(acc[base + 2]) & LOW32) | (U64(acc[base + 3]) << U64(32))
            cuda.syncthreads()
            for index in range(tid, 2 * band_words, TILE_THREADS):
                r, c = index // TILE_N, index % TILE_N
                word = stage[r * (TILE_N // 2) + c // 2]
                value = np.int64((word >> U64(32 * (c % 2))) & LOW32)
                if value >= 2**31:  # back to the signed accumulator
                    value -= 2**32
                store(value, m_block + current * half_rows + r, n_block + c, M, N, row_scale, col_scale, bias,
                      out_elems, tensor_scale)
            cuda.syncthreads()

    return kernel


@functools.cache
def tiled_kernel(config: TiledConfig) -> ElementwiseKernel:
    """The ``tiled`` GEMM + epilogue of ``config`` (cached on it): ``TILE_THREADS`` threads per block, one
    block per ``TILE_M x TILE_N`` output tile (row tiles fastest), the family's arguments."""
    kernel = _kernel(epilogue(config.output).store)
    kernel.__name__ = kernel.__qualname__ = config.name
    return ElementwiseKernel(kernel, gemm_signature(config.output), ElementKind.S8, ElementKind.S8,
                             config.output.element, MathPrecision.F32, CHUNK_K)
