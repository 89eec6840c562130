"""The ``pipelined`` GEMM: ``mma.sync`` fed by a ring of ``cp.async`` stages (16-byte aligned operands,
``K % 16 == 0``; the prefill path where the warpgroup kernel does not run).

``stages`` 64-k chunks of both operand tiles are in flight through shared memory; fragments are loaded
with ``ldmatrix`` from 32-bit shared addresses computed once per thread, the staged rows swizzled so
that the eight rows an ``ldmatrix`` phase reads fall in distinct banks. The epilogue is the ``tiled``
kernel's (bands of parked accumulators, coalesced stores).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda

from ...vocabulary import ElementKind, MathPrecision
from .. import device, memory
from ..device import device_function
from ..elementwise import ElementwiseKernel
from .common import CHUNK_K, DYNAMIC_STAGE_DTYPE, LOW32, STAGE_ALIGNMENT, U64, Output, epilogue, gemm_signature

__all__ = ["PipelineShape", "PipelinedConfig", "pipelined_kernel"]


@dataclass(frozen=True)
class PipelineShape:
    """Geometry of the ``pipelined`` kernel: ``warps_m x warps_n`` warps, each ``mt x nt`` mma tiles
    (16 rows x 8 columns each), ``stages`` 64-k chunks of both operand tiles in flight through
    shared memory (``shared_bytes`` of dynamic shared memory)."""

    warps_m: int = 2
    warps_n: int = 4
    mt: int = 4
    nt: int = 4
    stages: int = 3

    @property
    def tile_m(self) -> int:
        return 16 * self.mt * self.warps_m

    @property
    def tile_n(self) -> int:
        return 8 * self.nt * self.warps_n

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def stage_pairs(self) -> int:
        """16-byte pairs of one stage: both tiles' rows, 64 bytes (4 pairs) each."""
        return 4 * (self.tile_m + self.tile_n)

    @property
    def shared_bytes(self) -> int:
        return 16 * self.stages * self.stage_pairs

    @property
    def name(self) -> str:
        return f"{self.tile_m}x{self.tile_n}_w{self.warps_m}x{self.warps_n}_s{self.stages}"


@dataclass(frozen=True)
class PipelinedConfig:
    """The ``pipelined`` kernel writing ``output`` in ``shape``."""

    output: Output
    shape: PipelineShape = PipelineShape()

    @property
    def name(self) -> str:
        return f"w8a8_gemm_pipelined_{self.shape.name}_{self.output.suffix}"


@device_function
def swizzled(row, piece):
    """The 16-byte pair of shared memory holding 16-byte ``piece`` (0 .. 3) of staged 64-byte row
    ``row``: pieces rotate by ``row / 2`` so that the eight rows an ``ldmatrix`` phase reads (one
    piece each) fall in distinct banks."""
    return 4 * row + (piece ^ ((row >> 1) & 3))


def _copiers(rows_per_copy: int):
    """The device functions that compute a thread's source addresses and start its copies of a chunk."""

    @device_function
    def row_sources(sources, pairs_view, origin, row0, rows, k_pairs, piece, tid, copies):
        """Global addresses of this thread's pieces of chunk 0 (``origin`` for rows past ``rows``)."""
        for i in range(copies):
            row = row0 + tid // 4 + i * rows_per_copy
            sources[i] = origin + U64(16) * U64(row * k_pairs + piece) if row < rows else origin

    @device_function
    def start_copies(stage, at, pairs_view, sources, origin, row0, rows, k_ok, chunk_bytes, tid, copies):
        """Start this thread's copies of one chunk into the stage rows at shared address ``at`` (the
        rows' swizzled pieces); zeros for rows past ``rows`` and ``k`` past ``K``."""
        for i in range(copies):
            local_row = tid // 4 + i * rows_per_copy
            valid = k_ok and row0 + local_row < rows
            source = sources[i] + U64(chunk_bytes) if valid else origin
            memory.cp_async_16_at(stage, at + 16 * swizzled(local_row, tid % 4), pairs_view, source, valid)

    return row_sources, start_copies


def _kernel(store, shape: PipelineShape):
    tile_m, tile_n, threads, stages = shape.tile_m, shape.tile_n, shape.threads, shape.stages
    mt, nt, warps_m = shape.mt, shape.nt, shape.warps_m
    slots, w_words = 4 * mt * nt, 2 * nt  # local array lengths must be compile-time constants
    assert nt % 2 == 0, "one ldmatrix.x4 brings the weight fragments of two column tiles"
    stage_bytes, w_offset = 16 * shape.stage_pairs, 64 * tile_m  # a stage: [a rows | w rows], 64 bytes a row
    ring_bytes = stages * stage_bytes
    a_copies, w_copies = 4 * tile_m // threads, 4 * tile_n // threads
    assert a_copies * threads == 4 * tile_m and w_copies * threads == 4 * tile_n
    rows_per_copy = threads // 4  # a thread's copies are 16-byte piece `tid % 4` of rows `tid / 4 + i * this`
    half_rows = tile_m // warps_m  # the epilogue stages the output tile in warps_m horizontal bands
    band_words = half_rows * tile_n // 2  # int32 accumulators, two per uint64
    assert band_words <= 2 * stages * shape.stage_pairs, "an output band must fit in the staging buffer"
    wait_previous = memory.cp_async_wait_group(stages - 2)
    wait_all = memory.cp_async_wait_group(0)
    row_sources, start_copies = _copiers(rows_per_copy)

    def kernel(a_bytes, a_pairs, w_bytes, w_pairs, row_scale, col_scale, bias, out_elems,
               M, N, K, tiles_m, aligned, tensor_scale):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array((threads, 6), np.int32)  # used only by the simulator's mma
        stage = cuda.shared.array(0, DYNAMIC_STAGE_DTYPE, alignment=STAGE_ALIGNMENT)  # dynamic: shape.shared_bytes
        acc = cuda.local.array(slots, np.int32)
        w_frag = cuda.local.array(w_words, np.uint32)
        a_sources = cuda.local.array(a_copies, np.uint64)
        w_sources = cuda.local.array(w_copies, np.uint64)
        warp, lane = tid // 32, tid % 32
        group, t = lane // 4, lane % 4
        tile_n_index = cuda.blockIdx.x // tiles_m
        tile_m_index = cuda.blockIdx.x - tile_n_index * tiles_m
        m_block, n_block = tile_m_index * tile_m, tile_n_index * tile_n
        band = warp % warps_m
        m_warp = band * (16 * mt)
        n_warp = (warp // warps_m) * (8 * nt)
        # Every shared address is the stage's 32-bit window address plus byte offsets: what varies per
        # lane is computed here once, the loop adds the ring slot and constants (16 rows = 1024 bytes
        # keep their swizzle, so the mma tiles of a warp differ by constants).
        base = memory.shared_address(stage)
        a_origin, w_origin = memory.global_address(a_pairs), memory.global_address(w_pairs)
        # ldmatrix rows this lane addresses: for `a`, matrices (rows 0-7 | 8-15) x (k 0-15 | 16-31) of
        # a 16-row tile, the mma's a0 .. a3; for `w`, (k 0-15 | 16-31) x (column tile 2p | 2p + 1);
        # index [half] is k 0-31 / 32-63 of the chunk
        a_row = m_warp + lane % 8 + 8 * ((lane // 8) % 2)
        w_row = n_warp + lane % 8 + 8 * (lane // 16)
        a_lo = 16 * swizzled(a_row, lane // 16)
        a_hi = 16 * swizzled(a_row, 2 + lane // 16)
        w_lo = w_offset + 16 * swizzled(w_row, (lane // 8) % 2)
        w_hi = w_offset + 16 * swizzled(w_row, 2 + (lane // 8) % 2)
        for i in range(slots):
            acc[i] = 0
        k_pairs = K // 16  # this kernel runs only for K % 16 == 0 and 16-byte aligned operands
        piece = tid % 4
        row_sources(a_sources, a_pairs, a_origin, m_block, M, k_pairs, piece, tid, a_copies)
        row_sources(w_sources, w_pairs, w_origin, n_block, N, k_pairs, piece, tid, w_copies)
        steps = (K + CHUNK_K - 1) // CHUNK_K
        # chunks 0 .. stages - 2 in flight before the first mma; one commit group per chunk (empty
        # or zero-filled past K, so that the group count stays in step)
        for chunk in range(stages - 1):
            at = base + chunk * stage_bytes
            k_ok = 4 * chunk + piece < k_pairs
            start_copies(stage, at, a_pairs, a_sources, a_origin, m_block, M, k_ok, 64 * chunk, tid, a_copies)
            start_copies(stage, at + w_offset, w_pairs, w_sources, w_origin, n_block, N, k_ok, 64 * chunk, tid,
                         w_copies)
            memory.cp_async_commit()
        read_slot, write_slot = 0, (stages - 1) * stage_bytes
        for step in range(steps):
            # this thread's copies of chunk `step` have landed; after the barrier everyone's have,
            # and every warp is done reading the stage the next copies overwrite (chunk step - 1's)
            wait_previous()
            cuda.syncthreads()
            chunk = step + stages - 1
            at = base + write_slot
            k_ok = 4 * chunk + piece < k_pairs
            start_copies(stage, at, a_pairs, a_sources, a_origin, m_block, M, k_ok, 64 * chunk, tid, a_copies)
            start_copies(stage, at + w_offset, w_pairs, w_sources, w_origin, n_block, N, k_ok, 64 * chunk, tid,
                         w_copies)
            memory.cp_async_commit()
            current = base + read_slot
            for half in range(2):  # k 0-31, 32-63 of the chunk: one m16n8k32 each
                a_at = current + (a_lo if half == 0 else a_hi)
                w_at = current + (w_lo if half == 0 else w_hi)
                for p in range(nt // 2):
                    (w_frag[4 * p], w_frag[4 * p + 1], w_frag[4 * p + 2],
                     w_frag[4 * p + 3]) = memory.ldmatrix_x4_at(stage, w_at + 1024 * p, scratch, tid)
                for mi in range(mt):
                    a0, a1, a2, a3 = memory.ldmatrix_x4_at(stage, a_at + 1024 * mi, scratch, tid)
                    for ni in range(nt):
                        slot = 4 * (mi * nt + ni)
                        c0, c1, c2, c3 = device.mma_s8(a0, a1, a2, a3, w_frag[2 * ni], w_frag[2 * ni + 1],
                                                       acc[slot], acc[slot + 1], acc[slot + 2], acc[slot + 3],
                                                       scratch, tid)
                        acc[slot], acc[slot + 1], acc[slot + 2], acc[slot + 3] = c0, c1, c2, c3
            read_slot = read_slot + stage_bytes if read_slot + stage_bytes < ring_bytes else 0
            write_slot = write_slot + stage_bytes if write_slot + stage_bytes < ring_bytes else 0
        # the zero-filled copies past K may still be landing: drain them before reusing the stages
        wait_all()
        cuda.syncthreads()
        for current_band in range(warps_m):
            if band == current_band:
                for mi in range(mt):
                    for ni in range(nt):
                        slot = 4 * (mi * nt + ni)
                        word = (16 * mi + group) * (tile_n // 2) + (n_warp + 8 * ni) // 2 + t
                        stage[word] = (U64(acc[slot]) & LOW32) | (U64(acc[slot + 1]) << U64(32))
                        stage[word + 4 * tile_n] = (U64(acc[slot + 2]) & LOW32) | (U64(acc[slot + 3]) << U64(32))
            cuda.syncthreads()
            for index in range(tid, 2 * band_words, threads):
                r, c = index // tile_n, index % tile_n
                word = stage[r * (tile_n // 2) + c // 2]
                value = np.int64((word >> U64(32 * (c % 2))) & LOW32)
                if value >= 2**31:  # back to the signed accumulator
                    value -= 2**32
                store(value, m_block + current_band * half_rows + r, n_block + c, M, N, row_scale, col_scale, bias,
                      out_elems, tensor_scale)
            cuda.syncthreads()

    return kernel


@functools.cache
def pipelined_kernel(config: PipelinedConfig) -> ElementwiseKernel:
    """The ``pipelined`` GEMM + epilogue of ``config`` (cached on it): ``shape.threads`` threads and
    ``shape.shared_bytes`` of dynamic shared memory per block, one block per ``tile_m x tile_n`` output tile
    (row tiles fastest), the family's arguments; 16-byte aligned operands with ``K % 16 == 0`` only."""
    kernel = _kernel(epilogue(config.output).store, config.shape)
    kernel.__name__ = kernel.__qualname__ = config.name
    return ElementwiseKernel(kernel, gemm_signature(config.output), ElementKind.S8, ElementKind.S8,
                             config.output.element, MathPrecision.F32, CHUNK_K)
