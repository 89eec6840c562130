"""Range reductions and chunk quantizers: the device functions the dynamic-range kernels (:mod:`.dynamic`), the
packed 4-bit kernels (:mod:`.packed`) and the W8A8 decode's fused prologue (:mod:`.linear.fused`) share.

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
Quantization itself follows the elementwise ``quantize`` of :mod:`.elementwise`, bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

from ..vocabulary import ElementKind, MathPrecision
from . import device
from .codecs import codec, math_type
from .device import device_function
from .elementwise import CHUNK_BYTES, quantize_int

__all__ = ["range_functions", "chunk_range_function", "int_chunk_quantizer"]


@functools.cache
def range_functions(precision: MathPrecision, symmetric: bool, fp8_max: float | None = None):
    """``accumulate(hi, lo, x)``, ``combine(hi, lo, other_hi, other_lo)`` and ``range_params(hi, lo,
    q_min, q_max, zp_sym) -> (1 / scale, scale, zero_point)`` of dynamic-range quantization (the
    rule of the module docstring), shared by every kernel that computes a range, the packed 4-bit
    ones included. ``fp8_max``: an FP8 output, whose scale comes from any amax (zero included) and
    is at least vLLM's ``1 / (fp8_max * 512)`` (its per-token quantizer's ``min_scaling_factor``);
    otherwise the smallest scale is the math precision's smallest normal (1 / scale stays finite)."""
    M = math_type(precision)
    zero, one, inf = M(0.0), M(1.0), M(np.inf)
    fp8 = fp8_max is not None
    min_scale = M(1.0 / (fp8_max * 512.0)) if fp8 else M(np.finfo(M).tiny)
    rint, reciprocal = device.rint, device.reciprocal

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

    return accumulate, combine, range_params


@functools.cache
def chunk_range_function(a: ElementKind, precision: MathPrecision, symmetric: bool, fp8_max: float | None = None):
    """``chunk_range(hi, lo, w_lo, w_hi)``: the range so far (:func:`range_functions`' rule) extended by
    the elements of one 16-byte chunk of ``a`` held in two uint64 words, element 0 lowest.

    Symmetric ranges of 16-bit floats work on the bits: ``|x|`` is the bits without the sign, ordered
    as integers; adding a bias maps the finite magnitudes to ``bias .. 0x7FFF`` and inf / NaN (0x7F80
    and up for bf16, 0x7C00 for f16) past 0x7FFF, negative as int16, so a signed maximum
    (``max.s16x2``, two lanes an instruction) leaves them out: about 2 integer instructions per
    element against 5 through floats (the integer pipe is what limits these kernels on an H100).
    The same maximum, hence the same bits."""
    G = CHUNK_BYTES // a.itemsize
    a_bits = 8 * a.itemsize
    a_decode = codec(a, precision).decode
    accumulate = range_functions(precision, symmetric, fp8_max)[0]
    u64 = np.uint64

    @device_function
    def chunk_range_elements(hi, lo, w_lo, w_hi):
        for j in range(G):
            bit = j * a_bits
            hi, lo = accumulate(hi, lo, a_decode((w_lo if bit < 64 else w_hi) >> u64(bit % 64)))
        return hi, lo

    if a not in (ElementKind.BF16, ElementKind.F16):
        return chunk_range_elements
    half_bias = u64(0x0080 if a is ElementKind.BF16 else 0x0400)
    bias_pair, magnitude_pair, low_half = half_bias | (half_bias << u64(16)), u64(0x7FFF7FFF), u64(0xFFFFFFFF)
    max_s16x2, half_mask, sixteen, thirty_two = device.max_s16x2, u64(0xFFFF), u64(16), u64(32)
    if not symmetric:
        return _asymmetric_chunk_range(a, a_decode, bias_pair, magnitude_pair)

    @device_function
    def biased_pair(word):
        return (word & magnitude_pair) + bias_pair

    @device_function
    def chunk_range_bits(hi, lo, w_lo, w_hi):
        m = max_s16x2(max_s16x2(biased_pair(w_lo & low_half), biased_pair(w_lo >> thirty_two)),
                      max_s16x2(biased_pair(w_hi & low_half), biased_pair(w_hi >> thirty_two)))
        m = max_s16x2(max_s16x2(m, m >> sixteen), bias_pair)  # low lane: the chunk's largest, at least 0
        largest = a_decode((m & half_mask) - half_bias)
        return (largest if largest > hi else hi), lo

    return chunk_range_bits


def _asymmetric_chunk_range(a: ElementKind, a_decode, bias_pair, magnitude_pair):
    """``chunk_range`` of an asymmetric range of 16-bit floats, two elements per instruction: the
    non-finite lanes (biased magnitude negative as int16, as in the symmetric rule) become +0, the
    neutral element of a range that starts at 0, then ``max`` / ``min`` on the pairs as floats
    (``max.bf16x2`` ...). The extremes are exact, so the same range; a -0.0 minimum is 0 below."""
    u64 = np.uint64
    bf16 = a is ElementKind.BF16
    pair_max = device.max_bf16x2 if bf16 else device.max_f16x2
    pair_min = device.min_bf16x2 if bf16 else device.min_f16x2
    low_half, half_mask, sixteen, thirty_two = u64(0xFFFFFFFF), u64(0xFFFF), u64(16), u64(32)
    signs, lane_ones, lane_all = u64(0x80008000), u64(15), u64(0xFFFF)

    @device_function
    def finite_pair(word):
        nonfinite = (((word & magnitude_pair) + bias_pair) & signs) >> lane_ones  # 1 per non-finite lane
        return word & ~(nonfinite * lane_all) & low_half

    @device_function
    def chunk_range_pairs(hi, lo, w_lo, w_hi):
        p0, p1 = finite_pair(w_lo & low_half), finite_pair(w_lo >> thirty_two)
        p2, p3 = finite_pair(w_hi & low_half), finite_pair(w_hi >> thirty_two)
        top = pair_max(pair_max(p0, p1), pair_max(p2, p3))
        bottom = pair_min(pair_min(p0, p1), pair_min(p2, p3))
        largest = a_decode(pair_max(top, top >> sixteen) & half_mask)
        smallest = a_decode(pair_min(bottom, bottom >> sixteen) & half_mask)
        return (largest if largest > hi else hi), (smallest if smallest < lo else lo)

    return chunk_range_pairs


@functools.cache
def int_chunk_quantizer(a: ElementKind, precision: MathPrecision):
    """``quantize_chunk(w_lo, w_hi, inv, zp, q_min, q_max) -> (o_lo, o_hi)``: the elements of one 16-byte
    chunk of ``a`` (in two uint64 words, element 0 lowest) quantized to 8-bit integers with one set of
    parameters by :func:`.elementwise.quantize_int` (the integer side of the elementwise rule), byte ``j``
    of the output words holding element ``j``; 16-bit floats four to a packed word."""
    G = CHUNK_BYTES // a.itemsize
    a_bits = 8 * a.itemsize
    a_decode = codec(a, precision).decode
    u64 = np.uint64
    word_zero, byte = u64(0), u64(0xFF)
    pack_bytes4 = device.pack_bytes4

    @device_function
    def element(w_lo, w_hi, j):
        bit = j * a_bits
        return a_decode((w_lo if bit < 64 else w_hi) >> u64(bit % 64))

    @device_function
    def quantize_four(w_lo, w_hi, first, inv, zp, q_min, q_max):
        """Elements ``first .. first + 3`` of a chunk quantized, their bytes packed in a 32-bit word."""
        return pack_bytes4(quantize_int(element(w_lo, w_hi, first), inv, zp, q_min, q_max),
                           quantize_int(element(w_lo, w_hi, first + 1), inv, zp, q_min, q_max),
                           quantize_int(element(w_lo, w_hi, first + 2), inv, zp, q_min, q_max),
                           quantize_int(element(w_lo, w_hi, first + 3), inv, zp, q_min, q_max))

    @device_function
    def quantize_chunk(w_lo, w_hi, inv, zp, q_min, q_max):
        o_lo, o_hi = word_zero, word_zero
        if G % 4:  # float64: two elements, placed one by one
            for j in range(G):
                o_lo |= (u64(quantize_int(element(w_lo, w_hi, j), inv, zp, q_min, q_max)) & byte) << u64(8 * j)
        else:
            for f in range(0, G, 4):
                word = quantize_four(w_lo, w_hi, f, inv, zp, q_min, q_max)
                if f < 8:
                    o_lo |= word << u64(8 * f)
                else:
                    o_hi |= word << u64(8 * f - 64)
        return o_lo, o_hi

    return quantize_chunk
