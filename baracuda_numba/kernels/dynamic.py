"""Dynamic-range quantization: range reductions and the fused per-segment kernel.

The range of a segment is ``hi = max(0, max x)`` and ``lo = min(0, min x)`` (asymmetric) or
``hi = max |x|`` (symmetric), over the finite elements only (NaN and +-inf are left out of the
range and then quantized by the usual rules). Min and max are exact, so every reduction order
gives the same bits: the kernels are deterministic without atomics.

Parameters from the range (math precision ``M``, ``tiny`` its smallest normal number):

- symmetric: ``scale = hi / (q_max - zp)`` (1 when ``hi == 0``), ``zp = zp_sym`` (0 for a signed
  range, the mid-range point for an unsigned one);
- asymmetric (torchao ASYMMETRIC): ``scale = (hi - lo) / (q_max - q_min)`` (1 when 0),
  ``zp = clamp(q_min - rint(lo / scale), q_min, q_max)``;

then ``scale = max(scale, tiny)`` so that ``1 / scale`` stays finite. FP8 outputs (symmetric only):
``scale = max(hi / fp8_max, 1 / (fp8_max * 512))``, vLLM's dynamic FP8 rule (``hi == 0`` included).
Quantization itself is the elementwise ``quantize`` of :mod:`.elementwise`, bit for bit.

Kernels:

- ``segment_kernel``: contiguous segments (per token, per group, per channel when the channel axis
  is the first): ``tps`` lanes of a warp per segment (``tps`` a power of two <= 32), the segment's
  first ``KEEP_CHUNKS * tps`` chunks kept in registers; a butterfly of warp shuffles gives every
  lane the range, lane 0 writes the scale / zero point, and the lanes quantize what they hold.
Array parameters come first in every kernel (the launcher's convention).

- ``partial_kernel`` + ``finalize_kernel``: the whole tensor (one partial range per warp, then one block).
- ``column_partial_kernel`` + ``channel_finalize_kernel``: channels of a ``[outer, C, inner]`` view.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda

from ..platform import SIMULATOR
from ..vocabulary import ElementKind, MathPrecision
from . import device
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

__all__ = ["TPB", "WARP", "KEEP_CHUNKS", "PARTIALS_PER_BLOCK", "DynamicKernels", "dynamic_kernels"]

TPB = 32 if SIMULATOR else 128  # threads per block of the reduction kernels (tuned on an H100)
WARP = 32
KEEP_CHUNKS = 4  # chunks per lane in registers: kept between the passes, and loads in flight per round
PARTIALS_PER_BLOCK = TPB // WARP


@dataclass(frozen=True)
class DynamicKernels:
    """The kernels of one (input, output, precision, mode) combination, compiled on first use."""

    segment: ElementwiseKernel
    partial: ElementwiseKernel
    finalize: ElementwiseKernel
    column_partial: ElementwiseKernel
    channel_finalize: ElementwiseKernel
    chunk: int
    keep: int  # chunks per lane the segment kernel holds between its passes
    threads: int  # threads per block of every kernel here


def _kernel(py_func, name: str, signature: str, a: ElementKind, out: ElementKind, precision: MathPrecision,
            chunk: int) -> ElementwiseKernel:
    py_func.__name__ = py_func.__qualname__ = name
    return ElementwiseKernel(py_func, signature, a, None, out, precision, chunk)


@functools.cache
def dynamic_kernels(a: ElementKind, out: ElementKind, precision: MathPrecision, symmetric: bool,
                    keep: int | None = None, threads: int | None = None) -> DynamicKernels:
    """The kernels for one combination; ``keep`` / ``threads`` default to ``KEEP_CHUNKS`` / ``TPB``."""
    M = math_type(precision)
    G = chunk_elements(a, out)
    zero, one = M(0.0), M(1.0)
    inf = M(np.inf)
    fp8 = out.is_fp8
    # The smallest scale: the math precision's smallest normal (1 / scale stays finite), or for FP8
    # vLLM's ``1 / (fp8_max * 512)`` (its dynamic per-token quantizer's ``min_scaling_factor``).
    min_scale = M(1.0 / (out.fp8_max * 512.0)) if fp8 else M(np.finfo(M).tiny)
    u64 = np.uint64
    word_zero = u64(0)
    a_decode = codec(a, precision).decode
    o_encode = codec(out, precision).encode
    a_bits, o_bits = 8 * a.itemsize, 8 * out.itemsize
    a_load, _ = chunk_io(G * a.itemsize)
    _, o_store = chunk_io(G * out.itemsize)
    quantize = op_functions(precision, out if fp8 else None)[ElementwiseOp.QUANTIZE]
    rint, reciprocal, shuffle_xor = device.rint, device.reciprocal, device.shuffle_xor
    tpb = threads or TPB
    keep = keep or KEEP_CHUNKS

    @device_function
    def accumulate(hi, lo, x):
        if symmetric:
            m = abs(x)
            if m < inf and m > hi:
                hi = m
        elif x > -inf and x < inf:
            if x > hi:
                hi = x
            if x < lo:
                lo = x
        return hi, lo

    @device_function
    def combine(hi, lo, other_hi, other_lo):
        return (other_hi if other_hi > hi else hi), (other_lo if other_lo < lo else lo)

    @device_function
    def range_params(hi, lo, q_min, q_max, zp_sym):
        """``(inv, scale, zero_point)`` of a segment whose range is ``[lo, hi]``."""
        if symmetric:
            scale = hi / (q_max - zp_sym) if (hi > zero or fp8) else one
        else:
            span = hi - lo
            scale = span / (q_max - q_min) if span > zero else one
        if scale < min_scale:
            scale = min_scale
        zp = zp_sym
        if not symmetric:
            zp = q_min - rint(lo / scale)
            if zp < q_min:
                zp = q_min
            if zp > q_max:
                zp = q_max
        return reciprocal(scale), scale, zp

    @device_function
    def lane(lo_word, hi_word, bit):
        return (lo_word if bit < 64 else hi_word) >> u64(bit % 64)

    @device_function
    def block_reduce(sh_hi, sh_lo, tid, lane_id, width_start):
        """Tree reduction of ``sh_*[tid - lane_id : tid - lane_id + 2 * width_start]`` into its first slot."""
        width = width_start
        while width > 0:
            if lane_id < width:
                sh_hi[tid], sh_lo[tid] = combine(sh_hi[tid], sh_lo[tid], sh_hi[tid + width], sh_lo[tid + width])
            cuda.syncthreads()
            width //= 2

    def segment_kernel(xw, xe, qw, qe, scales, zero_points, nseg, seg_len, cps, tps, q_min, q_max, zp_sym):
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
                    for j in range(G):
                        hi, lo = accumulate(hi, lo, a_decode(lane(keep_lo[k], keep_hi[k], j * a_bits)))
            if live:
                round_start = keep * tps
                while round_start < cps:
                    for k in range(keep):
                        cc = round_start + lane_id + k * tps
                        if cc < cps:
                            buf_lo[k], buf_hi[k] = a_load(xw, s * cps + cc)
                    for k in range(keep):
                        if round_start + lane_id + k * tps < cps:
                            for j in range(G):
                                hi, lo = accumulate(hi, lo, a_decode(lane(buf_lo[k], buf_hi[k], j * a_bits)))
                    round_start += keep * tps
                e = cps * G + lane_id
                while e < seg_len:
                    hi, lo = accumulate(hi, lo, a_decode(u64(xe[s * seg_len + e])))
                    e += tps
            # butterfly over the tps lanes of the segment: every lane ends with the segment's range
            offset = tps // 2
            while offset > 0:
                other_hi = shuffle_xor(hi, offset, scratch_hi, tid)
                other_lo = shuffle_xor(lo, offset, scratch_lo, tid)
                hi, lo = combine(hi, lo, other_hi, other_lo)
                offset //= 2
            if live:
                inv, sc, zp = range_params(hi, lo, q_min, q_max, zp_sym)
                if lane_id == 0:
                    scales[s] = sc
                    zero_points[s] = np.int32(zp)
                # pass 2: quantize
                for k in range(keep):
                    cc = lane_id + k * tps
                    if cc < cps:
                        o_lo, o_hi = word_zero, word_zero
                        for j in range(G):
                            e = o_encode(quantize(a_decode(lane(keep_lo[k], keep_hi[k], j * a_bits)), zero, inv,
                                                  sc, zp, q_min, q_max))
                            bit = j * o_bits
                            if bit < 64:
                                o_lo |= e << u64(bit)
                            else:
                                o_hi |= e << u64(bit - 64)
                        o_store(qw, s * cps + cc, o_lo, o_hi)
                round_start = keep * tps
                while round_start < cps:
                    for k in range(keep):
                        cc = round_start + lane_id + k * tps
                        if cc < cps:
                            buf_lo[k], buf_hi[k] = a_load(xw, s * cps + cc)
                    for k in range(keep):
                        cc = round_start + lane_id + k * tps
                        if cc < cps:
                            o_lo, o_hi = word_zero, word_zero
                            for j in range(G):
                                e = o_encode(quantize(a_decode(lane(buf_lo[k], buf_hi[k], j * a_bits)), zero, inv,
                                                      sc, zp, q_min, q_max))
                                bit = j * o_bits
                                if bit < 64:
                                    o_lo |= e << u64(bit)
                                else:
                                    o_hi |= e << u64(bit - 64)
                            o_store(qw, s * cps + cc, o_lo, o_hi)
                    round_start += keep * tps
                e = cps * G + lane_id
                while e < seg_len:
                    i = s * seg_len + e
                    qe[i] = o_encode(quantize(a_decode(u64(xe[i])), zero, inv, sc, zp, q_min, q_max))
                    e += tps

    def partial_kernel(xw, xe, partials, n, nchunks):
        tid = cuda.threadIdx.x
        scratch_hi = cuda.shared.array(tpb, M)
        scratch_lo = cuda.shared.array(tpb, M)
        start, stride = cuda.grid(1), cuda.gridsize(1)
        buf_lo = cuda.local.array(keep, np.uint64)
        buf_hi = cuda.local.array(keep, np.uint64)
        hi, lo = zero, zero
        base = start
        while base < nchunks:  # rounds of keep loads in flight per thread
            for k in range(keep):
                c = base + k * stride
                if c < nchunks:
                    buf_lo[k], buf_hi[k] = a_load(xw, c)
            for k in range(keep):
                if base + k * stride < nchunks:
                    for j in range(G):
                        hi, lo = accumulate(hi, lo, a_decode(lane(buf_lo[k], buf_hi[k], j * a_bits)))
            base += keep * stride
        i = nchunks * G + start
        while i < n:
            hi, lo = accumulate(hi, lo, a_decode(u64(xe[i])))
            i += stride
        offset = 16
        while offset > 0:
            other_hi = shuffle_xor(hi, offset, scratch_hi, tid)
            other_lo = shuffle_xor(lo, offset, scratch_lo, tid)
            hi, lo = combine(hi, lo, other_hi, other_lo)
            offset //= 2
        if tid % 32 == 0:  # one partial per warp
            p = cuda.blockIdx.x * (tpb // 32) + tid // 32
            partials[2 * p] = hi
            partials[2 * p + 1] = lo

    def finalize_kernel(partials, scales, zero_points, nparts, q_min, q_max, zp_sym):
        tid = cuda.threadIdx.x
        sh_hi = cuda.shared.array(tpb, M)
        sh_lo = cuda.shared.array(tpb, M)
        hi, lo = zero, zero
        for p in range(tid, nparts, tpb):
            hi, lo = combine(hi, lo, partials[2 * p], partials[2 * p + 1])
        sh_hi[tid] = hi
        sh_lo[tid] = lo
        cuda.syncthreads()
        block_reduce(sh_hi, sh_lo, tid, tid, tpb // 2)
        if tid == 0:
            _, sc, zp = range_params(sh_hi[0], sh_lo[0], q_min, q_max, zp_sym)
            scales[0] = sc
            zero_points[0] = np.int32(zp)

    def column_partial_kernel(xe, partials, outer, width, parts, rows_per_part):
        rows = cuda.local.array(keep, np.uint64)
        for t in range(cuda.grid(1), parts * width, cuda.gridsize(1)):
            part = t // width
            col = t - part * width
            hi, lo = zero, zero
            end = min(outer, (part + 1) * rows_per_part)
            o = part * rows_per_part
            while o < end:  # keep rows' loads in flight before their first use
                for k in range(keep):
                    if o + k < end:
                        rows[k] = u64(xe[(o + k) * width + col])
                for k in range(keep):
                    if o + k < end:
                        hi, lo = accumulate(hi, lo, a_decode(rows[k]))
                o += keep
            partials[2 * t] = hi
            partials[2 * t + 1] = lo

    def channel_finalize_kernel(partials, scales, zero_points, parts, channels, inner, q_min, q_max, zp_sym):
        width = channels * inner
        for c in range(cuda.grid(1), channels, cuda.gridsize(1)):
            hi, lo = zero, zero
            for part in range(parts):
                for j in range(inner):
                    t = part * width + c * inner + j
                    hi, lo = combine(hi, lo, partials[2 * t], partials[2 * t + 1])
            _, sc, zp = range_params(hi, lo, q_min, q_max, zp_sym)
            scales[c] = sc
            zero_points[c] = np.int32(zp)

    m = "float64" if precision is MathPrecision.F64 else "float32"
    x_views = f"{uint_name(chunk_view_itemsize(G * a.itemsize))}[::1], {uint_name(a.itemsize)}[::1]"
    q_views = f"{uint_name(chunk_view_itemsize(G * out.itemsize))}[::1], {uint_name(out.itemsize)}[::1]"
    tag = f"{'sym' if symmetric else 'asym'}_{a.short}_{out.short}_k{keep}_t{tpb}"
    return DynamicKernels(
        segment=_kernel(segment_kernel, f"dynamic_segment_{tag}",
                        f"void({x_views}, {q_views}, {m}[::1], int32[::1], int64, int64, int64, int64, {m}, {m}, {m})",
                        a, out, precision, G),
        partial=_kernel(partial_kernel, f"dynamic_partial_{tag}", f"void({x_views}, {m}[::1], int64, int64)",
                        a, out, precision, G),
        finalize=_kernel(finalize_kernel, f"dynamic_finalize_{tag}",
                         f"void({m}[::1], {m}[::1], int32[::1], int64, {m}, {m}, {m})", a, out, precision, G),
        column_partial=_kernel(column_partial_kernel, f"dynamic_columns_{tag}",
                               f"void({uint_name(a.itemsize)}[::1], {m}[::1], int64, int64, int64, int64)",
                               a, out, precision, G),
        channel_finalize=_kernel(channel_finalize_kernel, f"dynamic_channels_{tag}",
                                 f"void({m}[::1], {m}[::1], int32[::1], int64, int64, int64, {m}, {m}, {m})",
                                 a, out, precision, G),
        chunk=G,
        keep=keep,
        threads=tpb,
    )

