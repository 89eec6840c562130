"""The ``skinny`` decode GEMM (``M <= 64``): the weight streamed once by warps that split ``K``
(:mod:`.decode`), on quantized activations.

Two uses: the byte path (any alignment, any ``K``: ``vector_only`` off) and, on 16-byte aligned operands
with ``K % 16 == 0``, the double-buffered kernel that the plans launch as a programmatic dependent of the
kernel before it (``preload`` > 0, ``docs/design-linear.md``, "Programmatic dependent launch"): it may start
while the activation quantizer runs, loads its column parameters and ``preload`` buffers of weight
fragments (which the quantizer does not write), asks L2 for the next ``prefetch_l2`` iterations' pieces,
then waits for the quantizer's grid (:func:`~baracuda_numba.kernels.memory.grid_dependency_wait`) before it
reads ``a`` and the row scales. With ``wait_first`` it waits for the kernel before it first thing (after at
most ``early_l2`` iterations of L2 prefetches, which hold no data), for callers whose kernel before may
write the weight.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda

from ...vocabulary import ElementKind, MathPrecision
from .. import memory
from ..device import LOAD_HINTS
from ..elementwise import ElementwiseKernel
from .common import (
    ABSMAX_LOADS,
    CHUNK_K,
    DYNAMIC_STAGE_DTYPE,
    SKINNY_M,
    SKINNY_N,
    SKINNY_THREADS,
    SKINNY_WARPS,
    STAGE_ALIGNMENT,
    Output,
    epilogue,
    gemm_signature,
)
from .decode import DecodeParts, decode_parts

__all__ = ["SkinnyConfig", "skinny_kernel"]


@dataclass(frozen=True)
class SkinnyConfig:
    """The unfused decode kernel writing ``output``.

    ``chunks``: 64-byte weight chunks each warp has in flight per buffer and main-loop iteration; ``tiles``:
    8-column tiles per block sharing each activation fragment; ``double_buffer``: the next iteration's weight
    loads issued before the current mmas; ``vector_only``: operands known to be 16-byte aligned with
    ``K % 16 == 0`` (no byte path); ``preload`` > 0: a programmatic dependent that loads that many buffers
    (1 or 2) of weight before its wait (double-buffered, ``vector_only``); ``wait_first``: as a dependent,
    it waits before it reads anything; ``prefetch_l2``: main-loop iterations after the preloaded ones asked
    of L2 before the wait; ``early_l2`` (with ``wait_first``): iterations asked of L2 before that wait;
    ``min_blocks`` > 0: launch bounds of that many blocks per multiprocessor; ``max_registers`` > 0: compiled
    to at most that many registers per thread; ``weight_hint`` (``vector_only``): the cache operators of the
    weight's loads (a key of :data:`~baracuda_numba.kernels.device.LOAD_HINTS`)."""

    output: Output
    chunks: int = 2
    tiles: int = 2
    double_buffer: bool = False
    vector_only: bool = False
    preload: int = 0
    wait_first: bool = False
    prefetch_l2: int = 0
    early_l2: int = 0
    min_blocks: int = 0
    max_registers: int = 0
    weight_hint: str = ""

    def __post_init__(self) -> None:
        if self.preload and not (self.double_buffer and self.vector_only and self.preload in (1, 2)):
            raise ValueError("a dependent skinny kernel preloads 1 or 2 buffers, double-buffered on aligned operands")
        if self.prefetch_l2 and not self.preload:
            raise ValueError("of the unfused skinny kernels, only the dependent one prefetches")
        if (self.wait_first or self.early_l2) and not self.preload:
            raise ValueError("only a dependent skinny kernel waits first")
        if self.early_l2 and not self.wait_first:
            raise ValueError("only the dependent kernel waiting first asks L2 for weight before its wait")
        if self.weight_hint and not self.vector_only:
            raise ValueError("the weight's cache operators take vector loads: vector_only=True")
        if self.weight_hint not in LOAD_HINTS:
            raise ValueError(f"weight_hint: one of {sorted(LOAD_HINTS)}, not {self.weight_hint!r}")

    @property
    def threads(self) -> int:
        return SKINNY_THREADS

    @property
    def name(self) -> str:
        return (f"w8a8_gemm_skinny{self.chunks}x{self.tiles}{'_db' if self.double_buffer else ''}"
                f"{'_v' if self.vector_only else ''}{f'_dep{self.preload}' if self.preload else ''}"
                f"{'_w' if self.wait_first else ''}{f'_e{self.early_l2}' if self.early_l2 else ''}"
                f"{f'_l2p{self.prefetch_l2}' if self.prefetch_l2 else ''}"
                f"{f'_b{self.min_blocks}' if self.min_blocks else ''}"
                f"{f'_r{self.max_registers}' if self.max_registers else ''}"
                f"{f'_h{self.weight_hint}' if self.weight_hint else ''}_{self.output.suffix}")


def _kernel(config: SkinnyConfig, parts: DecodeParts):
    """The kernel body: one function, because numba compiles a kernel from one Python function and its
    shared and local arrays must be declared in it."""
    dependent, wait_first = config.preload, config.wait_first
    early_l2, prefetch_l2 = config.early_l2, config.prefetch_l2
    n_tiles, slots, w_words, outputs, step = config.tiles, parts.slots, parts.w_words, parts.outputs, parts.step
    load_weights, prefetch_weights, stream_weights = parts.load_weights, parts.prefetch_weights, parts.stream_weights
    load_epilogue, reduce_and_store = parts.load_epilogue, parts.reduce_and_store
    S = np.float32
    # Flags passed to the inlined device functions as expressions evaluated in the kernel, not as literals:
    # numba prunes an inlined function's branches on literal arguments, which reorders the generated code
    # against the measured kernels' (docs/design-linear.md, "Same code").
    fused = False

    def kernel(a_bytes, a_pairs, w_bytes, w_pairs, row_scale, col_scale, bias, out_elems,
               M, N, K, tiles_m, aligned, tensor_scale):
        tid = cuda.threadIdx.x
        if dependent:
            if wait_first:
                # a prefetch holds no data: the weight is still read after the wait
                for ahead in range(early_l2):
                    prefetch_weights(w_pairs, (cuda.blockIdx.x // tiles_m) * (SKINNY_N * n_tiles), tid % 32 // 4, N,
                                     CHUNK_K * (ahead * step + tid // 32) + 16 * (tid % 4), K)
                memory.grid_dependency_wait()  # nothing is read before the kernel before it is complete
            # the next kernel, if launched as a programmatic dependent (the next call's quantizer), may
            # start now: it waits for this grid before it touches memory
            memory.launch_dependents()
        scratch = cuda.shared.array((SKINNY_THREADS, 6), np.int32)  # used only by the simulator's mma
        partial = cuda.shared.array((SKINNY_WARPS, slots, 32), np.int32)
        # The fused kernel's row scales, row maxima, shuffle scratch and views of its quantized rows, and (below) its
        # local pieces of x: declared here too, so that both decode kernels take the same static shared memory (the
        # occupancy their measured launch bounds assume) and compile to the code that was measured.
        scales = cuda.shared.array(SKINNY_M, S)
        cuda.shared.array((SKINNY_WARPS, SKINNY_M), S)
        cuda.shared.array(SKINNY_THREADS, S)
        cuda.shared.array(0, DYNAMIC_STAGE_DTYPE, alignment=STAGE_ALIGNMENT)
        cuda.shared.array(0, DYNAMIC_STAGE_DTYPE, alignment=STAGE_ALIGNMENT)
        cuda.local.array(ABSMAX_LOADS, np.uint64)
        cuda.local.array(ABSMAX_LOADS, np.uint64)
        acc = cuda.local.array(slots, np.int32)
        w_frag = cuda.local.array(w_words, np.uint64)
        w_next = cuda.local.array(w_words, np.uint64)
        cuda.local.array(1, np.uint64)
        col_pre = cuda.local.array(outputs, np.float32)
        bias_pre = cuda.local.array(outputs, np.float32)
        row_pre = cuda.local.array(outputs, np.float32)
        warp, lane = tid // 32, tid % 32
        group, t = lane // 4, lane % 4
        # row tiles fastest: the blocks sharing a weight slice run together and share it through L2
        n_tile = cuda.blockIdx.x // tiles_m
        m_block = (cuda.blockIdx.x - n_tile * tiles_m) * SKINNY_M
        n_block = n_tile * (SKINNY_N * n_tiles)
        load_epilogue(col_pre, bias_pre, row_pre, row_scale, col_scale, bias, M, N, m_block, n_block,
                      tensor_scale, True, not dependent, tid)
        if dependent:
            first_k = CHUNK_K * warp + 16 * t
            load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, first_k, K, aligned)
            if dependent > 1:
                load_weights(w_next, w_bytes, w_pairs, n_block, group, N, first_k + CHUNK_K * step, K, aligned)
            for ahead in range(dependent, dependent + prefetch_l2):
                prefetch_weights(w_pairs, n_block, group, N, CHUNK_K * (ahead * step + warp) + 16 * t, K)
            memory.grid_dependency_wait()  # the quantizer's rows and scales are complete past this
            load_epilogue(col_pre, bias_pre, row_pre, row_scale, col_scale, bias, M, N, m_block, n_block,
                          tensor_scale, False, True, tid)
            stream_weights(acc, w_frag, w_next, scratch, a_bytes, a_pairs, w_bytes, w_pairs, M, N, K, m_block,
                           n_block, aligned, dependent, 0, tid)
        else:
            stream_weights(acc, w_frag, w_next, scratch, a_bytes, a_pairs, w_bytes, w_pairs, M, N, K, m_block, n_block,
                           aligned, 0, 0, tid)
        reduce_and_store(acc, partial, scales, row_scale, col_pre, bias_pre, row_pre, out_elems, M, N, m_block,
                         n_block, tensor_scale, not fused, tid)

    return kernel


@functools.cache
def skinny_kernel(config: SkinnyConfig) -> ElementwiseKernel:
    """The unfused decode GEMM + epilogue of ``config`` (cached on it): ``SKINNY_THREADS`` threads per block,
    one block per ``SKINNY_M x 8 tiles`` output tile (row tiles fastest), the family's arguments."""
    parts = decode_parts(epilogue(config.output), config.chunks, config.tiles, config.double_buffer,
                         config.vector_only, config.weight_hint, False)
    kernel = _kernel(config, parts)
    kernel.__name__ = kernel.__qualname__ = config.name
    options: tuple = ()
    if config.min_blocks:
        options = (("launch_bounds", (SKINNY_THREADS, config.min_blocks)),)
    if config.max_registers:
        options += (("max_registers", config.max_registers),)
    return ElementwiseKernel(kernel, gemm_signature(config.output), ElementKind.S8, ElementKind.S8,
                             config.output.element, MathPrecision.F32, CHUNK_K, options)
