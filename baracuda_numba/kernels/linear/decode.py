"""The weight stream of the decode kernels (``skinny`` and ``fused``), shared by both.

Decode (``M <= 64``) is bandwidth-bound on the weight. A block owns 16 rows x ``8 tiles`` output columns;
its 8 warps split ``K`` and reduce through shared memory, so even ``N = 4096`` gives thousands of warps
of independent 16-byte weight loads. The row tiles of one column slice are neighbouring blocks: the weight
comes from HBM once and from L2 for the other (at most three) row tiles.

Warps take 64-byte chunks of ``K`` round robin, ``chunks`` per main-loop iteration, all of an iteration's
weight loads first (each activation fragment then feeds the block's ``tiles`` column tiles). Every warp runs
the same number of iterations (chunks past ``K`` read as zeros) because the simulated mma synchronises the
block. Double-buffered (``double_buffer``), the next iteration's weight loads are issued before the current
iteration's mmas.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .. import device, memory
from ..device import device_function
from .common import (
    CHUNK_K,
    SKINNY_N,
    SKINNY_THREADS,
    SKINNY_WARPS,
    U64,
    Epilogue,
    cuda,
    load_chunk,
    load_vector_chunk,
    mma_chunk,
    vector_chunk_loader,
)

__all__ = ["DecodeParts", "decode_parts"]


class DecodeParts(NamedTuple):
    """The device functions a decode kernel body calls (see :func:`decode_parts`)."""

    load_weights: Any
    prefetch_weights: Any
    stream_weights: Any
    load_epilogue: Any
    reduce_and_store: Any
    slots: int  # int32 accumulators per lane: 4 per column tile
    w_words: int  # uint64 words of one buffer of weight fragments
    outputs: int  # outputs each thread stores
    step: int  # chunks of K the block takes per main-loop iteration


def _weight_loaders(chunks: int, tiles: int, vector_only: bool, weight_hint: str):
    """``(load_weights, prefetch_weights)`` of one main-loop iteration's weight pieces."""
    load_weight_vector = vector_chunk_loader(weight_hint if vector_only else "")

    @device_function
    def load_weight_chunk(bytes_view, pairs_view, row, rows, k, K, aligned):
        """The weight's 16 bytes (see :func:`~.common.load_chunk`); ``vector_only``: one vector load with
        ``weight_hint``'s cache operators, no byte path (``aligned`` holds)."""
        if vector_only:
            return load_weight_vector(pairs_view, row, rows, k, K)
        return load_chunk(bytes_view, pairs_view, row, rows, k, K, aligned)

    @device_function
    def load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, k, K, aligned):
        """One main-loop iteration's weight pieces of this lane, all loads issued together: chunk ``c``
        (``k + c * 512`` on), column tile ``j``."""
        for c in range(chunks):
            for j in range(tiles):
                w = 2 * (c * tiles + j)
                w_frag[w], w_frag[w + 1] = load_weight_chunk(w_bytes, w_pairs, n_block + SKINNY_N * j + group, N,
                                                             k + c * CHUNK_K * SKINNY_WARPS, K, aligned)

    @device_function
    def prefetch_weights(w_pairs, n_block, group, N, k, K):
        """Aligned weight, ``K % 16 == 0``: L2 prefetches of the pieces ``load_weights`` would load from ``k``
        on (a prefetch holds no data: whatever a kernel before writes is still read after its wait)."""
        for c in range(chunks):
            for j in range(tiles):
                row, kc = n_block + SKINNY_N * j + group, k + c * CHUNK_K * SKINNY_WARPS
                if row < N and kc < K:
                    memory.prefetch_l2(w_pairs, (row * K + kc) // 16)

    return load_weights, prefetch_weights


def _activation_loader(vector_only: bool, fused: bool):
    """``load_activations``: this lane's 16 bytes of its two activation rows."""

    @device_function
    def load_operand_chunk(bytes_view, pairs_view, row, rows, k, K, aligned):
        """An operand's 16 bytes (see :func:`~.common.load_chunk`); ``vector_only``: no byte path."""
        if vector_only:
            return load_vector_chunk(pairs_view, row, rows, k, K)
        return load_chunk(bytes_view, pairs_view, row, rows, k, K, aligned)

    @device_function
    def load_activations(a_bytes, a_pairs, M, K, m_block, kc, aligned, tid):
        """This lane's 16 bytes at ``kc`` of its two activation rows (``group`` and ``group + 8`` of the
        block's tile): the fused kernel's quantized rows, ``(K + 16) // 16`` pairs apart in shared memory,
        else ``a``'s rows."""
        group = tid % 32 // 4
        row_pairs = (K + 16) // 16
        if fused:  # rows past M and k past K read as zeros, as load_chunk's do
            x0 = x1 = y0 = y1 = U64(0)
            if kc < K:
                if m_block + group < M:
                    x0, x1 = device.load_u64x2(a_pairs, group * row_pairs + kc // 16)
                if m_block + group + 8 < M:
                    y0, y1 = device.load_u64x2(a_pairs, (group + 8) * row_pairs + kc // 16)
        else:
            x0, x1 = load_operand_chunk(a_bytes, a_pairs, m_block + group, M, kc, K, aligned)
            y0, y1 = load_operand_chunk(a_bytes, a_pairs, m_block + group + 8, M, kc, K, aligned)
        return x0, x1, y0, y1

    return load_activations


def _weight_stream(chunks: int, tiles: int, double_buffer: bool, load_weights, load_activations):
    """``stream_weights``: the block's share of its tile over its warps' chunks of ``K``."""
    slots, step = 4 * tiles, chunks * SKINNY_WARPS

    @device_function
    def mma_weights(acc, w_frag, scratch, a_bytes, a_pairs, M, K, m_block, k, aligned, tid):
        """``acc +=`` one main-loop iteration: the activation chunks matching ``w_frag``'s weight pieces
        (from ``k`` on, see ``load_weights``) against them, every column tile."""
        for c in range(chunks):
            kc = k + c * CHUNK_K * SKINNY_WARPS
            x0, x1, y0, y1 = load_activations(a_bytes, a_pairs, M, K, m_block, kc, aligned, tid)
            for j in range(tiles):
                w = 2 * (c * tiles + j)
                mma_chunk(acc, 4 * j, x0, x1, y0, y1, w_frag[w], w_frag[w + 1], scratch, tid)

    @device_function
    def stream_weights(acc, w_frag, w_next, scratch, a_bytes, a_pairs, w_bytes, w_pairs, M, N, K, m_block, n_block,
                       aligned, preloaded, first_chunk, tid):
        """``acc`` = this lane's share of the block's 16 x ``8 tiles`` tile over its warp's chunks of ``K``;
        ``preloaded``: ``w_frag`` already holds (1) the first iteration's weight, and ``w_next`` (2) the
        second's. With ``double_buffer`` the next iteration's weight loads (into ``w_next``, then back into
        ``w_frag``) are issued before the current iteration's mmas, so a warp's loads are in flight while it
        computes. From chunk ``first_chunk`` on (a multiple of the iteration's chunks): past 0, ``acc``
        already holds the earlier chunks' sums."""
        warp, lane = tid // 32, tid % 32
        group, t = lane // 4, lane % 4
        if first_chunk == 0:
            for i in range(slots):
                acc[i] = 0
        n_chunks = (K + CHUNK_K - 1) // CHUNK_K
        if double_buffer:
            if preloaded == 0:
                load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, CHUNK_K * (first_chunk + warp) + 16 * t, K,
                             aligned)
            for first in range(first_chunk, n_chunks, 2 * step):
                k = CHUNK_K * (first + warp) + 16 * t
                if preloaded < 2 or first > first_chunk:
                    load_weights(w_next, w_bytes, w_pairs, n_block, group, N, k + CHUNK_K * step, K, aligned)
                mma_weights(acc, w_frag, scratch, a_bytes, a_pairs, M, K, m_block, k, aligned, tid)
                if first + step < n_chunks:  # the same for every warp
                    load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, k + 2 * CHUNK_K * step, K, aligned)
                    mma_weights(acc, w_next, scratch, a_bytes, a_pairs, M, K, m_block, k + CHUNK_K * step,
                                aligned, tid)
            return
        for first in range(first_chunk, n_chunks, step):
            k = CHUNK_K * (first + warp) + 16 * t
            if preloaded == 0 or first > first_chunk:
                load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, k, K, aligned)
            mma_weights(acc, w_frag, scratch, a_bytes, a_pairs, M, K, m_block, k, aligned, tid)

    return stream_weights


def _block_epilogue(epilogue: Epilogue, tiles: int, fused: bool):
    """``(load_epilogue, reduce_and_store)``: the block's column and row parameters, and its outputs."""
    _, row_param, column_params, store_with, _ = epilogue
    slots = 4 * tiles
    outputs = -(-32 * slots // SKINNY_THREADS)  # outputs per thread (1 tile: half the threads store none)

    @device_function
    def output_of(index, n_block):
        """The output that thread slot ``index`` (below ``32 * slots``) stores: fragment slot ``slot`` of
        lane ``source`` (summed over warps), at local row ``local`` and column ``n``."""
        slot, source = index // 32, index % 32
        local = source // 4 + (8 if slot % 4 >= 2 else 0)
        return slot, source, local, n_block + SKINNY_N * (slot // 4) + 2 * (source % 4) + slot % 2

    @device_function
    def load_epilogue(col_pre, bias_pre, row_pre, row_scale, col_scale, bias, M, N, m_block, n_block,
                      tensor_scale, columns, rows, tid):
        """This thread's outputs' column scales and biases (``columns``) and row scales (``rows``), loaded
        before the weight stream so that their latency hides under it."""
        for o in range(outputs):
            index = tid + o * SKINNY_THREADS
            if index < 32 * slots:
                _, _, local, n = output_of(index, n_block)
                if columns:
                    col_pre[o], bias_pre[o] = column_params(n, N, col_scale, bias)
                if rows and m_block + local < M:
                    row_pre[o] = row_param(m_block + local, row_scale, tensor_scale)

    @device_function
    def reduce_and_store(acc, partial, scales, row_scale, col_pre, bias_pre, row_pre, out_elems, M, N, m_block,
                         n_block, tensor_scale, rows_ready, tid):
        """Sum the warps' accumulators through shared memory and store the block's outputs through the
        epilogue, with the column parameters of ``load_epilogue`` and the row scales it loaded
        (``rows_ready``), else the fused kernel's in shared ``scales``, else ``row_scale``'s."""
        warp, lane = tid // 32, tid % 32
        for i in range(slots):
            partial[warp, i, lane] = acc[i]
        cuda.syncthreads()
        for o in range(outputs):
            index = tid + o * SKINNY_THREADS
            if index < 32 * slots:
                slot, source, local, n = output_of(index, n_block)
                total = 0
                for other in range(SKINNY_WARPS):
                    total += partial[other, slot, source]
                m = m_block + local
                if m < M and n < N:
                    if rows_ready:
                        rs = row_pre[o]
                    elif fused:
                        rs = np.float32(scales[local])
                    else:
                        rs = row_param(m, row_scale, tensor_scale)
                    store_with(total, rs, col_pre[o], bias_pre[o], m, n, M, N, out_elems)

    return load_epilogue, reduce_and_store, outputs


def decode_parts(epilogue: Epilogue, chunks: int, tiles: int, double_buffer: bool, vector_only: bool,
                 weight_hint: str, fused: bool) -> DecodeParts:
    """The device functions of a decode kernel streaming ``chunks`` 64-byte weight chunks per warp and main-loop
    iteration into ``tiles`` column tiles; ``vector_only``: operands known to be 16-byte aligned with
    ``K % 16 == 0`` (no byte path; the weight's loads with ``weight_hint``'s cache operators); ``fused``: the
    activations are the fused kernel's quantized rows in shared memory and its row scales in shared ``scales``."""
    load_weights, prefetch_weights = _weight_loaders(chunks, tiles, vector_only, weight_hint)
    stream_weights = _weight_stream(chunks, tiles, double_buffer, load_weights, _activation_loader(vector_only, fused))
    load_epilogue, reduce_and_store, outputs = _block_epilogue(epilogue, tiles, fused)
    return DecodeParts(load_weights, prefetch_weights, stream_weights, load_epilogue, reduce_and_store,
                       4 * tiles, 2 * chunks * tiles, outputs, chunks * SKINNY_WARPS)
