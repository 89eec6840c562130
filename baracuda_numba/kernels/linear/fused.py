"""The ``fused`` decode kernel: every block quantizes its rows of ``x`` per token into shared memory, then
streams the weight against them (:mod:`.decode`): the bits of the per-token quantizer followed by the
unfused kernel, in one launch (16-byte aligned ``x`` and weight, ``K % 16 == 0``, ``M <= 16``).

The prologue (each row's absmax over the block, then the quantize) waits on ``x`` and two barriers while
the weight stream has not started. So each thread first issues its loads of the main loop's first
iteration (kept in registers for it) and, with ``prefetch_l2``, L2 prefetches of the next ``prefetch_l2``
iterations; the prologue then runs under their DRAM latency. The prologue itself: every thread takes
``x_loads`` 16-byte pieces of the rows at a time (row, then slot within the row, stepped without
divisions), reduces each row with warp shuffles when its last slot is reached (the same step for all
threads) and once across warps through shared memory; when all of a thread's pieces fit in one batch they
stay in registers for the quantize, else they are read again from L2. Each piece's quantized bytes go out
as one store. The per-token scales stay in shared memory (``row_scale`` is not read).

The kernel is launched as a programmatic dependent of the kernel before it (which may write ``x``): it
waits for that kernel first thing, unless ``early_l2`` / ``early_registers``: then each thread first asks
L2 for its pieces of the first ``early_l2`` main-loop iterations / loads the first iteration's into
registers (and its column parameters), so that the weight stream starts under the tail of that kernel
(``docs/design-linear.md``, "Static weights").

``fixed`` (``(rows, per_row)``: the launch's ``M`` and ``ceil(K / (per_pair * SKINNY_THREADS))``): the
prologue compiled for that shape. Every loop is then unrolled: the rows' loads, their warp reductions and
their quantizes interleave instead of following one another row by row, with no row / slot bookkeeping.
The same maxima, scales and bytes. ``static_scale`` (with ``fixed``): every row quantized with
``tensor_scale`` instead (no reduction).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ...platform import SIMULATOR
from ...vocabulary import ElementKind, MathPrecision
from .. import device, memory
from ..codecs import math_type
from ..device import LOAD_HINTS, device_function
from ..elementwise import ElementwiseKernel, uint_name
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
    cuda,
    epilogue,
    gemm_signature,
)
from .decode import DecodeParts, decode_parts

__all__ = ["ABSMAX_LOADS", "FusedConfig", "fused_kernel", "fused_shared_bytes", "row_quantizer"]



@dataclass(frozen=True)
class FusedConfig:
    """The fused decode kernel writing ``output`` (per-token rows) from ``x`` of ``x_element``.

    ``chunks`` / ``tiles`` / ``weight_hint``: as :class:`~.skinny.SkinnyConfig`'s; ``prefetch_l2``: main-loop
    iterations of weight asked of L2 (after the first, loaded into registers) before the prologue;
    ``min_blocks`` > 0: launch bounds of that many blocks per multiprocessor; ``early_l2`` /
    ``early_registers``: weight asked of L2 / loaded before the wait (see the module doc); ``x_loads``:
    16-byte pieces of ``x`` each thread has in flight in the prologue; ``fixed``: the prologue compiled for
    ``(rows, pieces per row per thread)``; ``static_scale``: rows quantized with ``tensor_scale`` (needs
    ``fixed`` and 16- or 32-bit ``x``)."""

    output: Output
    x_element: ElementKind
    chunks: int = 1
    tiles: int = 2
    prefetch_l2: int = 0
    min_blocks: int = 0
    early_l2: int = 0
    early_registers: bool = False
    x_loads: int = ABSMAX_LOADS
    fixed: tuple[int, int] | None = None
    static_scale: bool = False
    weight_hint: str = ""
    double_buffer: bool = True

    def __post_init__(self) -> None:
        if self.output.per_tensor_rows:
            raise ValueError("the fused kernel quantizes x per token: Output(per_tensor_rows=False)")
        fixed = self.fixed
        if fixed and not (0 < fixed[0] <= SKINNY_M and 0 < fixed[0] * fixed[1] <= self.x_loads):
            raise ValueError(f"a fixed prologue is 1 .. {SKINNY_M} rows of at most x_loads = {self.x_loads} pieces "
                             f"in all, not {fixed}")
        if self.static_scale and (fixed is None or self.x_element.itemsize > 4):
            raise ValueError("a static activation scale needs a fixed prologue and 16- or 32-bit x")
        if self.weight_hint not in LOAD_HINTS:
            raise ValueError(f"weight_hint: one of {sorted(LOAD_HINTS)}, not {self.weight_hint!r}")

    @property
    def threads(self) -> int:
        return SKINNY_THREADS

    @property
    def name(self) -> str:
        fixed = self.fixed
        return (f"w8a8_gemm_skinny{self.chunks}x{self.tiles}_fused_{self.x_element.short}"
                f"{f'_x{self.x_loads}' if self.x_loads != ABSMAX_LOADS else ''}"
                f"{f'_p{fixed[0]}x{fixed[1]}' if fixed else ''}{'_sa' if self.static_scale else ''}"
                f"{f'_e{self.early_l2}' if self.early_l2 else ''}{'_er' if self.early_registers else ''}"
                f"{f'_l2p{self.prefetch_l2}' if self.prefetch_l2 else ''}"
                f"{f'_b{self.min_blocks}' if self.min_blocks else ''}{'_db' if self.double_buffer else ''}"
                f"{f'_h{self.weight_hint}' if self.weight_hint else ''}_{self.output.suffix}")


def fused_shared_bytes(m: int, k: int) -> int:
    """Dynamic shared memory of the fused kernel: ``min(m, SKINNY_M)`` quantized rows of ``k + 16`` bytes."""
    return min(m, SKINNY_M) * (k + 16)


@functools.cache
def row_quantizer(x_element: ElementKind):
    """Device functions quantizing rows of ``x`` per token exactly as
    :class:`~baracuda_numba.plans.dynamic.DynamicRangeQuantizePlan` does for the linear plans
    (symmetric, [-127, 127], the math precision of ``x``'s dynamic quantizer), with its kernels' own
    chunk functions: ``(S, per_pair, piece_absmax, row_params, quantized_piece)``: the math type, the
    elements of ``x`` in one 16-byte piece, ``piece_absmax`` (``hi`` raised to the finite ``max |x|`` of a
    16-byte piece; for 16-bit floats on the bits, two lanes an instruction), ``row_params`` (``scale``,
    ``1 / scale``) and ``quantized_piece`` (a piece's elements quantized, byte ``j`` of the returned word
    holding element ``j``; on the integer side, :func:`.elementwise.quantize_int`). The fused prologue
    repeats this work in every block, so its instruction count is the prologue's cost."""
    from ..ranges import chunk_range_function, int_chunk_quantizer

    precision = MathPrecision.F64 if x_element is ElementKind.F64 else MathPrecision.F32
    M = math_type(precision)
    zero, one, tiny = M(0.0), M(1.0), M(np.finfo(M).tiny)
    q_min, q_max = M(-127), M(127)
    chunk_range = chunk_range_function(x_element, precision, True)
    quantize_chunk = int_chunk_quantizer(x_element, precision)
    per_pair = 16 // x_element.itemsize  # elements of x in one 16-byte load

    @device_function
    def piece_absmax(lo_word, hi_word, hi):
        return chunk_range(hi, hi, lo_word, hi_word)[0]

    @device_function
    def row_params(hi):
        """``(scale, 1 / scale)`` of a row whose finite absmax is ``hi``."""
        scale = hi / (q_max - zero) if hi > zero else one
        if scale < tiny:
            scale = tiny
        return scale, device.reciprocal(scale)

    @device_function
    def quantized_piece(lo_word, hi_word, inv):
        return quantize_chunk(lo_word, hi_word, inv, zero, q_min, q_max)[0]

    return M, per_pair, piece_absmax, row_params, quantized_piece


def _piece_word(x_element: ElementKind):
    """The unsigned type holding one 16-byte piece of ``x`` quantized (one byte per element)."""
    return {2: np.uint16, 4: np.uint32, 8: np.uint64}[16 // x_element.itemsize]


def _general_prologue(x_element: ElementKind, x_loads: int):
    """``quantize_rows``: the prologue for any ``M <= SKINNY_M`` and ``K``, ``x_loads`` pieces in flight."""
    S, per_pair, piece_absmax, row_params, quantized_piece = row_quantizer(x_element)
    word_type = _piece_word(x_element)

    @device_function
    def next_piece(r, s, per_row):
        """Row and slot of the piece after slot ``s`` of row ``r`` (``per_row`` slots per row)."""
        s += 1
        if s == per_row:
            return r + 1, 0
        return r, s

    @device_function
    def load_pieces(x_pairs, piece_lo, piece_hi, r, s, row0, row_step, live, per_row, pieces, tid):
        """This thread's ``x_loads`` pieces from slot ``s`` of local row ``r`` on (local row ``r`` is
        row ``row0 + r * row_step`` of ``x``; slot ``s`` of a row is its piece ``tid + s * SKINNY_THREADS``),
        all loads issued together."""
        for u in range(x_loads):
            p = tid + SKINNY_THREADS * s
            if r < live and p < pieces:
                piece_lo[u], piece_hi[u] = device.load_u64x2(x_pairs, (row0 + r * row_step) * pieces + p)
            r, s = next_piece(r, s, per_row)

    @device_function
    def warp_reduce_max(hi, shuffle_scratch, tid):
        """The largest ``hi`` of the warp, in every lane (max is exact: any order gives the same bits)."""
        for i in range(5):
            other = device.shuffle_xor(hi, 16 >> i, shuffle_scratch, tid)
            hi = other if other > hi else hi
        return hi

    @device_function
    def quantize_rows(x_pairs, row0, row_step, live, K, xq_words, out_row0, row_words, scales_out,
                      piece_lo, piece_hi, warp_max, shuffle_scratch, tid):
        """Quantize ``live`` rows of ``x`` (``row0 + r * row_step``) per token with the whole block:
        row ``r``'s bytes to ``xq_words`` from word ``(out_row0 + r * row_step) * row_words`` on and
        its scale to ``scales_out[out_row0 + r * row_step]``. Ends before the stores are fenced."""
        warp, lane = tid // 32, tid % 32
        pieces = K // per_pair
        per_row = (pieces + SKINNY_THREADS - 1) // SKINNY_THREADS
        batch = live * per_row  # pieces per thread, taken x_loads at a time
        # the absmax pass: a row's last slot is the same step of the same batch for every thread,
        # so the warp reduction there is uniform
        hi = S(0)
        r0, s0 = 0, 0
        for _ in range(0, batch, x_loads):
            load_pieces(x_pairs, piece_lo, piece_hi, r0, s0, row0, row_step, live, per_row, pieces, tid)
            for u in range(x_loads):
                if r0 < live:
                    if tid + SKINNY_THREADS * s0 < pieces:
                        hi = piece_absmax(piece_lo[u], piece_hi[u], hi)
                    if s0 == per_row - 1:
                        hi = warp_reduce_max(hi, shuffle_scratch, tid)
                        if lane == 0:
                            warp_max[warp, r0] = hi
                        hi = S(0)
                r0, s0 = next_piece(r0, s0, per_row)
        cuda.syncthreads()
        # the quantize pass: every thread derives the scales of the rows it meets from the warp
        # maxima (no second barrier); the pieces are still in registers when one batch held them
        current = -1
        scale = inv = S(1)
        r0, s0 = 0, 0
        for _ in range(0, batch, x_loads):
            if batch > x_loads:
                load_pieces(x_pairs, piece_lo, piece_hi, r0, s0, row0, row_step, live, per_row, pieces, tid)
            for u in range(x_loads):
                p = tid + SKINNY_THREADS * s0
                if r0 < live:
                    out_row = out_row0 + r0 * row_step
                    if r0 != current:
                        top = S(0)
                        for other_warp in range(SKINNY_WARPS):
                            top = max(top, warp_max[other_warp, r0])
                        scale, inv = row_params(top)
                        current = r0
                        if tid == 0:
                            scales_out[out_row] = scale
                    if p < pieces:
                        xq_words[out_row * row_words + p] = word_type(quantized_piece(piece_lo[u], piece_hi[u], inv))
                r0, s0 = next_piece(r0, s0, per_row)

    return quantize_rows


def _fixed_prologue(x_element: ElementKind, fixed: tuple[int, int], static_scale: bool):
    """``quantize_fixed_rows``: the prologue compiled for ``fixed`` (see the module doc)."""
    S, per_pair, piece_absmax, row_params, quantized_piece = row_quantizer(x_element)
    word_type = _piece_word(x_element)
    fixed_rows, fixed_slots = fixed

    @device_function
    def quantize_fixed_rows(x_pairs, K, xq_words, row_words, scales_out, piece_lo, piece_hi, warp_max,
                            shuffle_scratch, tensor_scale, tid):
        """The general prologue's work on the block's ``fixed_rows`` rows (one row tile), ``fixed_slots``
        pieces a row per thread, all loaded at once. Ends before the stores are fenced. ``static_scale``:
        every row quantized with ``tensor_scale`` instead (no reduction)."""
        warp, lane = tid // 32, tid % 32
        pieces = K // per_pair
        for r in range(fixed_rows):
            for s in range(fixed_slots):
                p = tid + SKINNY_THREADS * s
                if p < pieces:
                    piece_lo[r * fixed_slots + s], piece_hi[r * fixed_slots + s] = device.load_u64x2(
                        x_pairs, r * pieces + p)
        if static_scale:
            scale = S(tensor_scale)
            inv = S(1) / scale  # what the per-tensor plan computes on the host
            if tid < fixed_rows:  # the thread that set the row's placeholder scale: no barrier needed
                scales_out[tid] = scale
            for r in range(fixed_rows):
                for s in range(fixed_slots):
                    p = tid + SKINNY_THREADS * s
                    if p < pieces:
                        xq_words[r * row_words + p] = word_type(
                            quantized_piece(piece_lo[r * fixed_slots + s], piece_hi[r * fixed_slots + s], inv))
            return
        row_max = cuda.local.array(fixed_rows, S)
        for r in range(fixed_rows):
            hi = S(0)
            for s in range(fixed_slots):
                if tid + SKINNY_THREADS * s < pieces:
                    hi = piece_absmax(piece_lo[r * fixed_slots + s], piece_hi[r * fixed_slots + s], hi)
            row_max[r] = hi
        for i in range(5):  # the rows' shuffles side by side: one chain's latency
            for r in range(fixed_rows):
                other = device.shuffle_xor(row_max[r], 16 >> i, shuffle_scratch, tid)
                row_max[r] = other if other > row_max[r] else row_max[r]
        if lane == 0:
            for r in range(fixed_rows):
                warp_max[warp, r] = row_max[r]
        cuda.syncthreads()
        for r in range(fixed_rows):
            top = S(0)
            for other_warp in range(SKINNY_WARPS):
                top = max(top, warp_max[other_warp, r])
            scale, inv = row_params(top)
            if tid == 0:
                scales_out[r] = scale
            for s in range(fixed_slots):
                p = tid + SKINNY_THREADS * s
                if p < pieces:
                    xq_words[r * row_words + p] = word_type(
                        quantized_piece(piece_lo[r * fixed_slots + s], piece_hi[r * fixed_slots + s], inv))

    return quantize_fixed_rows


def _kernel(config: FusedConfig, parts: DecodeParts, quantize_rows, quantize_fixed_rows):
    """The kernel body: one function, because numba compiles a kernel from one Python function and its
    shared and local arrays must be declared in it."""
    S, per_pair = row_quantizer(config.x_element)[:2]
    word_type = _piece_word(config.x_element)
    word_dtype = np.dtype(word_type) if SIMULATOR else word_type
    n_tiles, slots, w_words, outputs, step = config.tiles, parts.slots, parts.w_words, parts.outputs, parts.step
    load_weights, prefetch_weights, stream_weights = parts.load_weights, parts.prefetch_weights, parts.stream_weights
    load_epilogue, reduce_and_store = parts.load_epilogue, parts.reduce_and_store
    early_l2, early_registers, prefetch_l2, x_loads = (config.early_l2, config.early_registers, config.prefetch_l2,
                                                       config.x_loads)
    early = bool(early_l2 or early_registers)
    fixes = config.fixed is not None  # a bool: numba types `if None` through a device-compiled overload
    # Flags passed to the inlined device functions as expressions evaluated in the kernel, not as literals (see
    # the skinny kernel's body): this kernel is fused, and no quantizer's dependent.
    fused, dependent = True, 0

    def kernel(x_elems, x_pairs, w_bytes, w_pairs, row_scale, col_scale, bias, out_elems,
               M, N, K, tiles_m, aligned, tensor_scale):
        tid = cuda.threadIdx.x
        if not early:
            # launched as a programmatic dependent: wait for the kernel before (which writes x) before
            # anything, then let the next kernel start
            memory.grid_dependency_wait()
            memory.launch_dependents()
        scratch = cuda.shared.array((SKINNY_THREADS, 6), np.int32)  # used only by the simulator's mma
        partial = cuda.shared.array((SKINNY_WARPS, slots, 32), np.int32)
        scales = cuda.shared.array(SKINNY_M, S)  # the block's per-token scales (epilogue)
        warp_max = cuda.shared.array((SKINNY_WARPS, SKINNY_M), S)  # each warp's row maxima
        shuffle_scratch = cuda.shared.array(SKINNY_THREADS, S)  # used only by the simulator's shuffles
        # the block's quantized rows, `K + 16` bytes apart (the pad skews rows across banks); sized by the
        # launch (fused_shared_bytes), both views of the same dynamic shared memory
        xq_words = cuda.shared.array(0, word_dtype, alignment=STAGE_ALIGNMENT)
        xq_pairs = cuda.shared.array(0, DYNAMIC_STAGE_DTYPE, alignment=STAGE_ALIGNMENT)
        piece_lo = cuda.local.array(x_loads, np.uint64)
        piece_hi = cuda.local.array(x_loads, np.uint64)
        acc = cuda.local.array(slots, np.int32)
        w_frag = cuda.local.array(w_words, np.uint64)
        w_next = cuda.local.array(w_words, np.uint64)
        col_pre = cuda.local.array(outputs, np.float32)
        bias_pre = cuda.local.array(outputs, np.float32)
        row_pre = cuda.local.array(outputs, np.float32)
        warp, lane = tid // 32, tid % 32
        group, t = lane // 4, lane % 4
        n_tile = cuda.blockIdx.x // tiles_m
        m_block = (cuda.blockIdx.x - n_tile * tiles_m) * SKINNY_M
        n_block = n_tile * (SKINNY_N * n_tiles)
        if early:
            for ahead in range(early_l2):
                prefetch_weights(w_pairs, n_block, group, N, CHUNK_K * (ahead * step + warp) + 16 * t, K)
            if early_registers:
                load_epilogue(col_pre, bias_pre, row_pre, row_scale, col_scale, bias, M, N, m_block, n_block,
                              tensor_scale, True, False, tid)
                load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, CHUNK_K * warp + 16 * t, K, aligned)
            memory.grid_dependency_wait()  # x (and, past early_registers, nothing else) is read from here on
            memory.launch_dependents()
        if not early_registers:
            load_epilogue(col_pre, bias_pre, row_pre, row_scale, col_scale, bias, M, N, m_block, n_block,
                          tensor_scale, True, not fused and not dependent, tid)
        # the first iteration's weight into registers, and L2 prefetches of the ones after, before the
        # prologue, so that HBM works while x is reduced and quantized
        if not early_registers:
            load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, CHUNK_K * warp + 16 * t, K, aligned)
        for ahead in range(1, prefetch_l2 + 1):
            prefetch_weights(w_pairs, n_block, group, N, CHUNK_K * (ahead * step + warp) + 16 * t, K)
        if tid < SKINNY_M:
            scales[tid] = S(1)  # rows past M: never stored, but read by the epilogue
        if fixes:
            quantize_fixed_rows(x_pairs, K, xq_words, (K + 16) // per_pair, scales, piece_lo, piece_hi, warp_max,
                     shuffle_scratch, tensor_scale, tid)
        else:
            quantize_rows(x_pairs, m_block, 1, min(SKINNY_M, M - m_block), K, xq_words, 0, (K + 16) // per_pair,
                     scales, piece_lo, piece_hi, warp_max, shuffle_scratch, tid)
        cuda.syncthreads()
        stream_weights(acc, w_frag, w_next, scratch, x_elems, xq_pairs, w_bytes, w_pairs, M, N, K, m_block,
                       n_block, aligned, 1, 0, tid)
        reduce_and_store(acc, partial, scales, row_scale, col_pre, bias_pre, row_pre, out_elems, M, N, m_block,
                         n_block, tensor_scale, not fused, tid)

    return kernel


@functools.cache
def fused_kernel(config: FusedConfig) -> ElementwiseKernel:
    """The fused decode kernel of ``config`` (cached on it): ``SKINNY_THREADS`` threads and
    ``fused_shared_bytes(M, K)`` of dynamic shared memory per block, one block per ``SKINNY_M x 8 tiles`` output
    tile; the family's arguments with ``x``'s elements and 16-byte pairs as the first two (``row_scale`` is not
    read)."""
    parts = decode_parts(epilogue(config.output), config.chunks, config.tiles, config.double_buffer, True,
                         config.weight_hint, True)
    # both prologues, the one `fixed` does not pick pruned as a constant branch
    kernel = _kernel(config, parts, _general_prologue(config.x_element, config.x_loads),
                     _fixed_prologue(config.x_element, config.fixed or (1, 1), config.static_scale))
    kernel.__name__ = kernel.__qualname__ = config.name
    options = (("launch_bounds", (SKINNY_THREADS, config.min_blocks)),) if config.min_blocks else ()
    return ElementwiseKernel(kernel, gemm_signature(config.output, uint_name(config.x_element.itemsize)),
                             ElementKind.S8, ElementKind.S8, config.output.element, MathPrecision.F32, CHUNK_K, options)
