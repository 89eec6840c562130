"""Dynamic-range quantization: the fused per-segment, whole-tensor and per-channel kernels.

The range of a segment and the scale and zero point from it: :mod:`.ranges`. Kernels (``keep`` chunks per thread
kept in registers / loads in flight, ``threads`` per block, optional ``min_blocks`` launch bound that caps registers
so that many blocks share an SM):

- ``resident``: contiguous segments (per token, per group, per channel when the channel axis is the
  first) of at most ``keep * tps`` chunks, ``tps`` lanes per segment (a power of two up to the
  block): each chunk loaded once (all of a lane's 16-byte loads before the range pass), kept as raw
  words, quantized from the registers. Lanes meet by warp shuffles, warps in shared memory. Once a
  row's loads are issued, the lanes ask L2 for the row the block takes next (``resident_prefetch_rows``),
  so HBM keeps streaming through the reduce and the quantize. Built with ``streaming``, the segment
  kernels store evict-first (for outputs past L2).
- ``fixed``: the resident kernel compiled for aligned segments of exactly ``keep * threads`` chunks, one
  segment per block (or per ``split`` blocks, each quantizing its share of the segment it reduces whole):
  the W8A8 decode's quantizer, whose few rows the GEMM waits for. Its code is a fraction of the general
  kernel's: no loop over segments, no element path, no bounds, no prefetch.
- ``segment``: longer segments, ``tps <= 32`` lanes: the first ``keep * tps`` chunks kept, the rest
  streamed in rounds of ``keep`` chunks and read again by the quantize pass.
- ``partial`` + ``tensor_quantize``: the whole tensor in two launches: one partial range per block,
  then a quantize pass whose blocks each combine the partials first (block 0 writes the scale).
- ``column_partial`` + ``channel_finalize`` + ``column_quantize``: channels of an ``[outer, C, inner]``
  view: each thread owns the ``G`` columns of a 16-byte chunk (or one column when the rows are not
  chunk-aligned) over a slice of rows; a block finalizes ``WARP`` channels at a time; the quantize
  pass reads each thread's ``G`` channel parameters once.

Array parameters come first in every kernel (the launcher's convention). Every kernel quantizes
with ``inv = rcp.rn(scale)`` and the elementwise rule of :mod:`.elementwise`, computed where it is
cheapest on an H100 (whose integer pipe bounded these kernels, ncu 2026-11-23): integer outputs
through ``elementwise.quantize_int`` (one rounding conversion, int32 clamps), FP8 two elements per
conversion with NaN-keeping clamps; column kernels and element paths through ``quantize`` itself. The
static per-token / per-channel / per-tensor quantize of the same scales, bit for bit (GPU tests).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda

from ..platform import SIMULATOR
from ..vocabulary import ElementKind, MathPrecision
from . import device, memory
from .codecs import codec, math_type
from .device import device_function
from .elementwise import (
    ElementwiseKernel,
    ElementwiseOp,
    chunk_elements,
    chunk_io,
    chunk_view_itemsize,
    op_functions,
    uint_name,
)
from .ranges import chunk_range_function, int_chunk_quantizer, range_functions

__all__ = ["WARP", "DynamicKernelTuning", "DynamicKernels", "dynamic_kernels"]

WARP = 32
LINE_CHUNKS = 8  # 16-byte chunks per 128-byte cache line


@dataclass(frozen=True)
class DynamicKernelTuning:
    """What the dynamic-range kernels compile in besides their shape (``keep``, ``threads``, launch bounds), for
    one card (part of each kernel's key). The values, and the measurement behind each, are the plans' tuning
    values (``baracuda_numba/plans/tuning.py``, :class:`~baracuda_numba.plans.tuning.DynamicTuning`)."""

    # rows ahead (in the resident kernel's grid-stride order) whose chunks each block asks L2 for once its row's
    # loads are issued (``prefetch.L2``, one per 128-byte line, no register held; 0: none)
    resident_prefetch_rows: int
    tensor_streaming_stores: bool  # the tensor scope's quantize pass stores evict-first
    load_hint: bool  # x read through the read-only path with 256-byte L2 fills


@dataclass(frozen=True)
class DynamicKernels:
    """The kernels of one (input, output, precision, mode) combination, compiled on first use."""

    segment: ElementwiseKernel
    resident: ElementwiseKernel
    fixed: ElementwiseKernel  # the resident kernel for segments of exactly keep * threads chunks
    staged: ElementwiseKernel
    partial: ElementwiseKernel
    tensor_quantize: ElementwiseKernel
    column_partial: ElementwiseKernel
    channel_finalize: ElementwiseKernel
    column_quantize: ElementwiseKernel
    chunk: int
    keep: int  # chunks per lane the segment kernel holds between its passes
    threads: int  # threads per block of every kernel here


@functools.cache
def dynamic_kernels(a: ElementKind, out: ElementKind, precision: MathPrecision, symmetric: bool, keep: int,
                    threads: int, min_blocks: int = 0, streaming: bool = False, split: int = 1, *,
                    tuning: DynamicKernelTuning) -> DynamicKernels:
    """The kernels for one combination: ``keep`` chunks per lane, ``threads`` per block; ``min_blocks`` > 0
    compiles with ``launch_bounds=(threads, min_blocks)``; ``streaming``: the segment kernels (token, group,
    channel rows) store with the streaming (evict-first) cache operator, for outputs that L2 would not keep
    anyway; ``split`` (a divisor of ``keep``): blocks per segment of the ``fixed`` kernel; ``tuning``: what
    they compile in besides (:class:`DynamicKernelTuning`).

    One long function on purpose: numba compiles a kernel's closure variables as constants, so the
    kernels of one combination are closures over its constants (element codecs, chunk sizes, tuning), defined here
    together with the device functions they share; split across functions they would take those constants as
    kernel arguments (registers and loads in every kernel) or need generated modules."""
    M = math_type(precision)
    G = chunk_elements(a, out)
    zero = M(0.0)
    fp8 = out.is_fp8
    u64 = np.uint64
    word_zero = u64(0)
    a_decode = codec(a, precision).decode
    o_encode = codec(out, precision).encode
    a_bits, o_bits = 8 * a.itemsize, 8 * out.itemsize
    a_load, _ = chunk_io(G * a.itemsize)
    if tuning.load_hint and G * a.itemsize == 16:
        a_load = device.load_u64x2_streaming
    _, o_store = chunk_io(G * out.itemsize)
    evict_first_store = memory.streaming_store(G * out.itemsize)
    segment_store = evict_first_store if streaming else o_store
    tensor_store = evict_first_store if tuning.tensor_streaming_stores else o_store
    quantize = op_functions(precision, out if fp8 else None)[ElementwiseOp.QUANTIZE]
    reciprocal, shuffle_xor = device.reciprocal, device.shuffle_xor
    tpb = threads
    nwarps = max(1, tpb // WARP)
    warp_slots = 2 * nwarps  # shared-array sizes must be compile-time constants, not expressions
    stage_words = 2 * 2 * keep * tpb  # staged kernel: two rounds of keep 16-byte chunks per thread
    wait_previous, wait_all = memory.cp_async_wait_group(1), memory.cp_async_wait_group(0)
    # (prefetch_l2 takes 16-byte pairs of a uint64 array)
    prefetch_rows = tuning.resident_prefetch_rows if G * a.itemsize == 16 else 0
    prefetch_l2 = memory.prefetch_l2

    accumulate, combine, range_params = range_functions(precision, symmetric, out.fp8_max if fp8 else None)

    @device_function
    def lane(lo_word, hi_word, bit):
        return (lo_word if bit < 64 else hi_word) >> u64(bit % 64)

    chunk_range = chunk_range_function(a, precision, symmetric, out.fp8_max if fp8 else None)

    @device_function
    def place(o_lo, o_hi, e, j):
        """Output element ``j`` of a chunk placed in the chunk's words."""
        bit = j * o_bits
        if bit < 64:
            o_lo |= e << u64(bit)
        else:
            o_hi |= e << u64(bit - 64)
        return o_lo, o_hi

    @device_function
    def quantize_chunk_fp8(w_lo, w_hi, inv, sc, zp, q_min, q_max):
        """The ``G`` elements of one chunk quantized with one segment's parameters."""
        o_lo, o_hi = word_zero, word_zero
        for j in range(G):
            e = o_encode(quantize(a_decode(lane(w_lo, w_hi, j * a_bits)), zero, inv, sc, zp, q_min, q_max))
            o_lo, o_hi = place(o_lo, o_hi, e, j)
        return o_lo, o_hi

    quantize_int_chunk = int_chunk_quantizer(a, precision)

    @device_function
    def quantize_chunk_int(w_lo, w_hi, inv, sc, zp, q_min, q_max):
        return quantize_int_chunk(w_lo, w_hi, inv, zp, q_min, q_max)

    if fp8 and M is np.float32 and G % 2 == 0:
        # Dynamic FP8 scales are never 0 (at least 1 / (fp8_max * 512)), so 1 / scale is finite and
        # nonzero: the elementwise FP8 quantize reduces to x * inv clamped with NaN kept, rounded by
        # the conversion unit; two elements per conversion, and NaN-keeping min / max instead of
        # compares and selects. The same bits as quantize + encode.
        clamp_nan = device.clamp_nan_f32
        if SIMULATOR:
            @device_function
            def fp8_pair(hi, lo):
                return o_encode(lo) | (o_encode(hi) << u64(8))
        else:
            fp8_pair = device.f32x2_to_e4m3x2_bits if out is ElementKind.FP8_E4M3 else device.f32x2_to_e5m2x2_bits

        @device_function
        def quantize_chunk(w_lo, w_hi, inv, sc, zp, q_min, q_max):
            o_lo, o_hi = word_zero, word_zero
            for j in range(0, G, 2):
                lo = clamp_nan(a_decode(lane(w_lo, w_hi, j * a_bits)) * inv, q_min, q_max)
                hi = clamp_nan(a_decode(lane(w_lo, w_hi, (j + 1) * a_bits)) * inv, q_min, q_max)
                pair = fp8_pair(hi, lo)
                if j < 8:
                    o_lo |= pair << u64(8 * j)
                else:
                    o_hi |= pair << u64(8 * j - 64)
            return o_lo, o_hi
    else:
        quantize_chunk = quantize_chunk_fp8 if fp8 else quantize_chunk_int

    @device_function
    def warp_range(hi, lo, width, scratch_hi, scratch_lo, tid):
        """Butterfly over aligned groups of ``width`` lanes (a power of two <= 32): every lane ends
        with its group's range."""
        offset = width // 2
        while offset > 0:
            other_hi = shuffle_xor(hi, offset, scratch_hi, tid)
            other_lo = shuffle_xor(lo, offset, scratch_lo, tid)
            hi, lo = combine(hi, lo, other_hi, other_lo)
            offset //= 2
        return hi, lo

    @device_function
    def warps_range(hi, lo, warp_hi, warp_lo, slot, first, count, tid):
        """The range over warps ``first .. first + count - 1`` in every thread of them (each lane holding
        its warp's): lane 0 of each warp posts it in ``warp_*[slot + warp]``, one barrier, every lane
        combines them (the slots are free again only after the caller's next barrier)."""
        if tid % WARP == 0:
            warp_hi[slot + tid // WARP] = hi
            warp_lo[slot + tid // WARP] = lo
        cuda.syncthreads()
        for w in range(first, first + count):
            hi, lo = combine(hi, lo, warp_hi[slot + w], warp_lo[slot + w])
        return hi, lo

    @device_function
    def block_range(hi, lo, sh_hi, sh_lo, scratch_hi, scratch_lo, tid):
        """The range over the whole block, in every thread (one barrier after the warp butterflies;
        ``sh_*`` hold ``tpb // WARP`` slots and are free again only after the caller's next barrier)."""
        hi, lo = warp_range(hi, lo, WARP, scratch_hi, scratch_lo, tid)
        return warps_range(hi, lo, sh_hi, sh_lo, 0, 0, nwarps, tid)

    def segment_kernel(xw, xe, qw, qe, scales, zero_points, nseg, seg_len, cps, tps, q_min, q_max, zp_sym):
        # Launched as a programmatic dependent (DynamicTuning.dependent_segments_max), this kernel may start
        # while the kernel before it runs: nothing is read or written before that kernel is complete.
        # Then a kernel launched as dependent on this one (the W8A8 linear's GEMM) may start its loads
        # of what this one does not write: it waits for this grid before reading the results. (Its
        # trigger comes after the wait, so that its early loads also see the kernel before this one.)
        memory.grid_dependency_wait()
        memory.launch_dependents()
        tid = cuda.threadIdx.x
        scratch_hi = cuda.shared.array(tpb, M)  # used only by the simulator's shuffles
        scratch_lo = cuda.shared.array(tpb, M)
        keep_lo = cuda.local.array(keep, np.uint64)
        keep_hi = cuda.local.array(keep, np.uint64)
        buf_lo = cuda.local.array(keep, np.uint64)
        buf_hi = cuda.local.array(keep, np.uint64)
        spb = tpb // tps
        sub = tid // tps
        lane_id = tid - sub * tps
        for first in range(cuda.blockIdx.x * spb, nseg, cuda.gridDim.x * spb):
            s = first + sub
            live = s < nseg
            hi, lo = zero, zero
            # pass 1: the segment's first keep * tps chunks stay in registers; the rest streams in
            # rounds of keep chunks per lane, all loads of a round issued before their first use
            for k in range(keep):
                cc = lane_id + k * tps
                if live and cc < cps:
                    keep_lo[k], keep_hi[k] = a_load(xw, s * cps + cc)
            for k in range(keep):
                if live and lane_id + k * tps < cps:
                    hi, lo = chunk_range(hi, lo, keep_lo[k], keep_hi[k])
            if live:
                round_start = keep * tps
                while round_start < cps:
                    for k in range(keep):
                        cc = round_start + lane_id + k * tps
                        if cc < cps:
                            buf_lo[k], buf_hi[k] = a_load(xw, s * cps + cc)
                    for k in range(keep):
                        if round_start + lane_id + k * tps < cps:
                            hi, lo = chunk_range(hi, lo, buf_lo[k], buf_hi[k])
                    round_start += keep * tps
                e = cps * G + lane_id
                while e < seg_len:
                    hi, lo = accumulate(hi, lo, a_decode(u64(xe[s * seg_len + e])))
                    e += tps
            # butterfly over the tps lanes of the segment: every lane ends with the segment's range
            hi, lo = warp_range(hi, lo, tps, scratch_hi, scratch_lo, tid)
            if live:
                inv, sc, zp = range_params(hi, lo, q_min, q_max, zp_sym)
                if lane_id == 0:
                    scales[s] = sc
                    zero_points[s] = np.int32(zp)
                # pass 2: quantize
                for k in range(keep):
                    cc = lane_id + k * tps
                    if cc < cps:
                        o_lo, o_hi = quantize_chunk(keep_lo[k], keep_hi[k], inv, sc, zp, q_min, q_max)
                        segment_store(qw, s * cps + cc, o_lo, o_hi)
                round_start = keep * tps
                while round_start < cps:
                    for k in range(keep):
                        cc = round_start + lane_id + k * tps
                        if cc < cps:
                            buf_lo[k], buf_hi[k] = a_load(xw, s * cps + cc)
                    for k in range(keep):
                        cc = round_start + lane_id + k * tps
                        if cc < cps:
                            o_lo, o_hi = quantize_chunk(buf_lo[k], buf_hi[k], inv, sc, zp, q_min, q_max)
                            segment_store(qw, s * cps + cc, o_lo, o_hi)
                    round_start += keep * tps
                e = cps * G + lane_id
                while e < seg_len:
                    i = s * seg_len + e
                    qe[i] = o_encode(quantize(a_decode(u64(xe[i])), zero, inv, sc, zp, q_min, q_max))
                    e += tps

    @device_function
    def stage_round(stage, buf, xw, s, lane_id, tid, nseg, cps, tps):
        """Start copying this thread's ``keep`` chunks of segment ``s`` into buffer ``buf`` of ``stage``
        (zeros where there is no chunk: past the segment or past the last segment)."""
        for k in range(keep):
            cc = lane_id + k * tps
            valid = s < nseg and cc < cps
            memory.cp_async_16(stage, (buf * keep + k) * tpb + tid, xw, s * cps + cc if valid else 0, valid)

    def segment_in_registers(staged: bool):
        """The resident kernel; ``staged``: each round's chunks were copied into shared memory by
        ``cp.async`` during the previous round (aligned segments only), so the loads of the next
        segments are in flight while this one is reduced and quantized, whatever the registers allow."""
        stage_size = stage_words if staged else 2  # the resident kernel keeps its shared memory free

        def kernel(xw, xe, qw, qe, scales, zero_points, nseg, seg_len, cps, tps, q_min, q_max, zp_sym):
            memory.grid_dependency_wait()  # as in segment_kernel
            memory.launch_dependents()
            tid = cuda.threadIdx.x
            scratch_hi = cuda.shared.array(tpb, M)  # used only by the simulator's shuffles
            scratch_lo = cuda.shared.array(tpb, M)
            warp_hi = cuda.shared.array(warp_slots, M)
            warp_lo = cuda.shared.array(warp_slots, M)
            stage = cuda.shared.array(stage_size, np.uint64)
            words_lo = cuda.local.array(keep, np.uint64)
            words_hi = cuda.local.array(keep, np.uint64)
            spb = tpb // tps
            sub = tid // tps
            lane_id = tid - sub * tps
            wps = tps // WARP
            slot = 0
            step = cuda.gridDim.x * spb
            if staged:  # round 0 into buffer 0
                stage_round(stage, 0, xw, cuda.blockIdx.x * spb + sub, lane_id, tid, nseg, cps, tps)
                memory.cp_async_commit()
            buf = 0
            for first in range(cuda.blockIdx.x * spb, nseg, step):
                s = first + sub
                live = s < nseg
                base = s * cps
                if staged:
                    # a thread reads back only the copies it started itself: its wait suffices, no barrier
                    stage_round(stage, 1 - buf, xw, s + step, lane_id, tid, nseg, cps, tps)
                    memory.cp_async_commit()
                    wait_previous()
                    for k in range(keep):
                        c = 2 * ((buf * keep + k) * tpb + tid)
                        words_lo[k], words_hi[k] = stage[c], stage[c + 1]
                    buf = 1 - buf
                else:
                    for k in range(keep):
                        cc = lane_id + k * tps
                        if live and cc < cps:
                            words_lo[k], words_hi[k] = a_load(xw, base + cc)
                    if prefetch_rows and lane_id % LINE_CHUNKS == 0:
                        ahead = s + prefetch_rows * step
                        if ahead < nseg:
                            for k in range(keep):
                                cc = lane_id + k * tps
                                if cc < cps:
                                    prefetch_l2(xw, ahead * cps + cc)
                hi, lo = zero, zero
                for k in range(keep):
                    if live and lane_id + k * tps < cps:
                        hi, lo = chunk_range(hi, lo, words_lo[k], words_hi[k])
                if live and cps == 0:  # unaligned segments: the element path (read twice)
                    e = lane_id
                    while e < seg_len:
                        hi, lo = accumulate(hi, lo, a_decode(u64(xe[s * seg_len + e])))
                        e += tps
                hi, lo = warp_range(hi, lo, min(tps, WARP), scratch_hi, scratch_lo, tid)
                if wps > 1:
                    hi, lo = warps_range(hi, lo, warp_hi, warp_lo, slot, sub * wps, wps, tid)
                    slot = nwarps - slot
                if live:
                    inv, sc, zp = range_params(hi, lo, q_min, q_max, zp_sym)
                    if lane_id == 0:
                        scales[s] = sc
                        zero_points[s] = np.int32(zp)
                    for k in range(keep):
                        cc = lane_id + k * tps
                        if cc < cps:
                            o_lo, o_hi = quantize_chunk(words_lo[k], words_hi[k], inv, sc, zp, q_min, q_max)
                            segment_store(qw, base + cc, o_lo, o_hi)
                    if cps == 0:
                        e = lane_id
                        while e < seg_len:
                            i = s * seg_len + e
                            qe[i] = o_encode(quantize(a_decode(u64(xe[i])), zero, inv, sc, zp, q_min, q_max))
                            e += tps
            if staged:
                wait_all()  # no copy into shared memory outlives the block

        return kernel

    resident_kernel, staged_kernel = segment_in_registers(False), segment_in_registers(True)
    per_part = keep // split
    fixed_cps = keep * tpb

    @device_function
    def rotated(k, shift):
        """``(k + shift) % keep`` for ``0 <= k, shift < keep``."""
        g = k + shift
        return g - keep if g >= keep else g

    def fixed_kernel(xw, xe, qw, qe, scales, zero_points, nseg, seg_len, cps, tps, q_min, q_max, zp_sym):
        # The resident kernel compiled for aligned segments of exactly keep * tpb chunks (cps, tps and
        # seg_len are these constants), one segment per `split` blocks: no loop, no element path, no bounds.
        # Block `part` of a segment reduces all of it but quantizes only lane chunks part * per_part ..
        # (held in register slots 0 .. per_part - 1: a range is the same in any order).
        memory.grid_dependency_wait()  # as in segment_kernel
        memory.launch_dependents()
        tid = cuda.threadIdx.x
        scratch_hi = cuda.shared.array(tpb, M)  # used only by the simulator's shuffles
        scratch_lo = cuda.shared.array(tpb, M)
        warp_hi = cuda.shared.array(warp_slots, M)
        warp_lo = cuda.shared.array(warp_slots, M)
        words_lo = cuda.local.array(keep, np.uint64)
        words_hi = cuda.local.array(keep, np.uint64)
        s = cuda.blockIdx.x // split
        part = cuda.blockIdx.x - s * split
        shift = part * per_part
        if s < nseg:
            base = s * fixed_cps + tid
            for k in range(keep):
                words_lo[k], words_hi[k] = a_load(xw, base + rotated(k, shift) * tpb)
            hi, lo = zero, zero
            for k in range(keep):
                hi, lo = chunk_range(hi, lo, words_lo[k], words_hi[k])
            hi, lo = warp_range(hi, lo, min(tpb, WARP), scratch_hi, scratch_lo, tid)
            if nwarps > 1:
                hi, lo = warps_range(hi, lo, warp_hi, warp_lo, 0, 0, nwarps, tid)
            inv, sc, zp = range_params(hi, lo, q_min, q_max, zp_sym)
            if tid == 0 and part == 0:
                scales[s] = sc
                zero_points[s] = np.int32(zp)
            for k in range(per_part):
                o_lo, o_hi = quantize_chunk(words_lo[k], words_hi[k], inv, sc, zp, q_min, q_max)
                segment_store(qw, base + (k + shift) * tpb, o_lo, o_hi)

    def partial_kernel(xw, xe, partials, n, nchunks):
        # One partial range per block: rounds of keep loads in flight per thread, then the block's range.
        tid = cuda.threadIdx.x
        scratch_hi = cuda.shared.array(tpb, M)
        scratch_lo = cuda.shared.array(tpb, M)
        sh_hi = cuda.shared.array(nwarps, M)
        sh_lo = cuda.shared.array(nwarps, M)
        start, stride = cuda.grid(1), cuda.gridsize(1)
        buf_lo = cuda.local.array(keep, np.uint64)
        buf_hi = cuda.local.array(keep, np.uint64)
        hi, lo = zero, zero
        base = start
        while base < nchunks:
            for k in range(keep):
                c = base + k * stride
                if c < nchunks:
                    buf_lo[k], buf_hi[k] = a_load(xw, c)
            for k in range(keep):
                if base + k * stride < nchunks:
                    hi, lo = chunk_range(hi, lo, buf_lo[k], buf_hi[k])
            base += keep * stride
        i = nchunks * G + start
        while i < n:
            hi, lo = accumulate(hi, lo, a_decode(u64(xe[i])))
            i += stride
        hi, lo = block_range(hi, lo, sh_hi, sh_lo, scratch_hi, scratch_lo, tid)
        if tid == 0:
            partials[2 * cuda.blockIdx.x] = hi
            partials[2 * cuda.blockIdx.x + 1] = lo

    def tensor_quantize_kernel(xw, xe, qw, qe, partials, scales, zero_points, n, nchunks, nparts, q_min, q_max,
                               zp_sym):
        # Every block combines the partials itself (a few hundred, each thread's loads issued
        # together), so the scale needs no launch of its own; block 0 writes it.
        tid = cuda.threadIdx.x
        scratch_hi = cuda.shared.array(tpb, M)
        scratch_lo = cuda.shared.array(tpb, M)
        sh_hi = cuda.shared.array(nwarps, M)
        sh_lo = cuda.shared.array(nwarps, M)
        hi, lo = zero, zero
        for p in range(tid, nparts, tpb):
            hi, lo = combine(hi, lo, partials[2 * p], partials[2 * p + 1])
        hi, lo = block_range(hi, lo, sh_hi, sh_lo, scratch_hi, scratch_lo, tid)
        inv, sc, zp = range_params(hi, lo, q_min, q_max, zp_sym)
        if cuda.blockIdx.x == 0 and tid == 0:
            scales[0] = sc
            zero_points[0] = np.int32(zp)
        start, stride = cuda.grid(1), cuda.gridsize(1)
        buf_lo = cuda.local.array(keep, np.uint64)
        buf_hi = cuda.local.array(keep, np.uint64)
        # From the last chunk back: the partial pass read the tensor front to back, so its last few
        # tens of MB (what the L2 holds) are read again from the L2 instead of DRAM.
        last = nchunks - 1
        base = start
        while base < nchunks:
            for k in range(keep):
                c = base + k * stride
                if c < nchunks:
                    buf_lo[k], buf_hi[k] = a_load(xw, last - c)
            for k in range(keep):
                c = base + k * stride
                if c < nchunks:
                    o_lo, o_hi = quantize_chunk(buf_lo[k], buf_hi[k], inv, sc, zp, q_min, q_max)
                    tensor_store(qw, last - c, o_lo, o_hi)
            base += keep * stride
        i = nchunks * G + start
        while i < n:
            qe[i] = o_encode(quantize(a_decode(u64(xe[i])), zero, inv, sc, zp, q_min, q_max))
            i += stride

    def column_partial_kernel(xw, xe, partials, outer, width, cwidth, parts, rows_per_part):
        # Columns of an [outer, width] view, a slice of rows_per_part rows per thread. Chunked
        # (cwidth = width / G > 0): a thread owns the G adjacent columns of one 16-byte chunk, a warp
        # reads 32 consecutive chunks of a row; else one column per thread, element loads.
        # Partial ranges: partials[2 * (part * width + column) + (0: hi, 1: lo)].
        col_hi = cuda.local.array(G, M)
        col_lo = cuda.local.array(G, M)
        buf_lo = cuda.local.array(keep, np.uint64)
        buf_hi = cuda.local.array(keep, np.uint64)
        per_part = cwidth if cwidth > 0 else width
        for t in range(cuda.grid(1), parts * per_part, cuda.gridsize(1)):
            part = t // per_part
            cc = t - part * per_part
            o = part * rows_per_part
            end = min(outer, o + rows_per_part)
            for j in range(G):
                col_hi[j], col_lo[j] = zero, zero
            if cwidth > 0:
                while o < end:  # keep rows' loads in flight before their first use
                    for k in range(keep):
                        if o + k < end:
                            buf_lo[k], buf_hi[k] = a_load(xw, (o + k) * cwidth + cc)
                    for k in range(keep):
                        if o + k < end:
                            for j in range(G):
                                col_hi[j], col_lo[j] = accumulate(col_hi[j], col_lo[j],
                                                                  a_decode(lane(buf_lo[k], buf_hi[k], j * a_bits)))
                    o += keep
                for j in range(G):
                    p = 2 * (part * width + cc * G + j)
                    partials[p] = col_hi[j]
                    partials[p + 1] = col_lo[j]
            else:
                hi, lo = zero, zero
                while o < end:
                    for k in range(keep):
                        if o + k < end:
                            buf_lo[k] = u64(xe[(o + k) * width + cc])
                    for k in range(keep):
                        if o + k < end:
                            hi, lo = accumulate(hi, lo, a_decode(buf_lo[k]))
                    o += keep
                partials[2 * (part * width + cc)] = hi
                partials[2 * (part * width + cc) + 1] = lo

    def channel_finalize_kernel(partials, scales, zero_points, parts, channels, inner, q_min, q_max, zp_sym):
        # WARP channels per block round: lane l takes channel base + l, warp w the parts w, w + nwarps, ...
        # (for inner == 1 a warp reads 32 adjacent partials), then the warps meet in shared memory.
        tid = cuda.threadIdx.x
        sh_hi = cuda.shared.array(tpb, M)
        sh_lo = cuda.shared.array(tpb, M)
        buf_hi = cuda.local.array(keep, M)
        buf_lo = cuda.local.array(keep, M)
        lane_id = tid % WARP
        warp = tid // WARP
        width = channels * inner
        for first in range(cuda.blockIdx.x * WARP, channels, cuda.gridDim.x * WARP):
            c = first + lane_id
            hi, lo = zero, zero
            if c < channels:
                for j in range(inner):
                    part = warp
                    while part < parts:  # keep parts' loads in flight before their first use
                        for k in range(keep):
                            if part + k * nwarps < parts:
                                t = 2 * ((part + k * nwarps) * width + c * inner + j)
                                buf_hi[k], buf_lo[k] = partials[t], partials[t + 1]
                        for k in range(keep):
                            if part + k * nwarps < parts:
                                hi, lo = combine(hi, lo, buf_hi[k], buf_lo[k])
                        part += keep * nwarps
            sh_hi[tid] = hi
            sh_lo[tid] = lo
            cuda.syncthreads()
            if warp == 0 and c < channels:
                for w in range(1, nwarps):
                    hi, lo = combine(hi, lo, sh_hi[w * WARP + lane_id], sh_lo[w * WARP + lane_id])
                _, sc, zp = range_params(hi, lo, q_min, q_max, zp_sym)
                scales[c] = sc
                zero_points[c] = np.int32(zp)
            cuda.syncthreads()

    def column_quantize_kernel(xw, xe, qw, qe, scales, zero_points, outer, width, cwidth, inner, parts,
                               rows_per_part, q_min, q_max):
        # The decomposition of column_partial_kernel; a thread's G channel parameters are read
        # (and inverted, as the static per-channel quantize does) once, then its rows stream through.
        e_inv = cuda.local.array(G, M)
        e_scale = cuda.local.array(G, M)
        e_zp = cuda.local.array(G, M)
        buf_lo = cuda.local.array(keep, np.uint64)
        buf_hi = cuda.local.array(keep, np.uint64)
        per_part = cwidth if cwidth > 0 else width
        for t in range(cuda.grid(1), parts * per_part, cuda.gridsize(1)):
            part = t // per_part
            cc = t - part * per_part
            o = part * rows_per_part
            end = min(outer, o + rows_per_part)
            if cwidth > 0:
                for j in range(G):
                    ch = (cc * G + j) // inner
                    e_scale[j] = scales[ch]
                    e_inv[j] = reciprocal(e_scale[j])
                    e_zp[j] = M(zero_points[ch])
                while o < end:
                    for k in range(keep):
                        if o + k < end:
                            buf_lo[k], buf_hi[k] = a_load(xw, (o + k) * cwidth + cc)
                    for k in range(keep):
                        if o + k < end:
                            o_lo, o_hi = word_zero, word_zero
                            for j in range(G):
                                x = a_decode(lane(buf_lo[k], buf_hi[k], j * a_bits))
                                e = o_encode(quantize(x, zero, e_inv[j], e_scale[j], e_zp[j], q_min, q_max))
                                o_lo, o_hi = place(o_lo, o_hi, e, j)
                            o_store(qw, (o + k) * cwidth + cc, o_lo, o_hi)
                    o += keep
            else:
                ch = cc // inner
                sc = scales[ch]
                inv = reciprocal(sc)
                zp = M(zero_points[ch])
                while o < end:
                    i = o * width + cc
                    qe[i] = o_encode(quantize(a_decode(u64(xe[i])), zero, inv, sc, zp, q_min, q_max))
                    o += 1

    m = "float64" if precision is MathPrecision.F64 else "float32"
    x_views = f"{uint_name(chunk_view_itemsize(G * a.itemsize))}[::1], {uint_name(a.itemsize)}[::1]"
    q_views = f"{uint_name(chunk_view_itemsize(G * out.itemsize))}[::1], {uint_name(out.itemsize)}[::1]"
    bounds = f"_b{min_blocks}" if min_blocks else ""
    tag = f"{'sym' if symmetric else 'asym'}_{a.short}_{out.short}_k{keep}_t{tpb}{bounds}{'_cs' if streaming else ''}"
    # what an H100's values leave untagged (1 row prefetched, streaming tensor stores, plain loads)
    tag += (f"_pf{tuning.resident_prefetch_rows}" if tuning.resident_prefetch_rows != 1 else "") + (
        "" if tuning.tensor_streaming_stores else "_ts0") + ("_lh" if tuning.load_hint else "")
    options = (("launch_bounds", (tpb, min_blocks)),) if min_blocks else ()

    def make(py_func, name: str, signature: str) -> ElementwiseKernel:
        py_func.__name__ = py_func.__qualname__ = f"dynamic_{name}_{tag}"
        return ElementwiseKernel(py_func, signature, a, None, out, precision, G, options)

    segment_args = f"{x_views}, {q_views}, {m}[::1], int32[::1], int64, int64, int64, int64, {m}, {m}, {m}"
    return DynamicKernels(
        segment=make(segment_kernel, "segment", f"void({segment_args})"),
        resident=make(resident_kernel, "resident", f"void({segment_args})"),
        fixed=make(fixed_kernel, f"fixed{split}" if split > 1 else "fixed", f"void({segment_args})"),
        staged=make(staged_kernel, "staged", f"void({segment_args})"),
        partial=make(partial_kernel, "partial", f"void({x_views}, {m}[::1], int64, int64)"),
        tensor_quantize=make(tensor_quantize_kernel, "tensor_quantize",
                             f"void({x_views}, {q_views}, {m}[::1], {m}[::1], int32[::1], int64, int64, int64, "
                             f"{m}, {m}, {m})"),
        column_partial=make(column_partial_kernel, "columns",
                            f"void({x_views}, {m}[::1], int64, int64, int64, int64, int64)"),
        channel_finalize=make(channel_finalize_kernel, "channels",
                              f"void({m}[::1], {m}[::1], int32[::1], int64, int64, int64, {m}, {m}, {m})"),
        column_quantize=make(column_quantize_kernel, "column_quantize",
                             f"void({x_views}, {q_views}, {m}[::1], int32[::1], int64, int64, int64, int64, int64, "
                             f"int64, {m}, {m})"),
        chunk=G,
        keep=keep,
        threads=tpb,
    )
