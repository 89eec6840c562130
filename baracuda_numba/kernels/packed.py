"""Packed 4-bit integers (S4 / U4): two elements per byte, the element of even index in the low nibble.

Layout: a tensor ``[..., D]`` of 4-bit elements is stored as ``uint8 [..., D / 2]``; byte ``b`` holds
element ``2b`` in bits 0-3 and element ``2b + 1`` in bits 4-7 (S4 as a 4-bit two's complement).
Scales (and U4 zero points) are per group of ``group_size`` consecutive elements along the last
axis, ``group_size`` even so that no byte straddles two groups.

The math is the elementwise family's (:func:`.elementwise.op_functions`, integer grid) and, for
dynamic range, the per-segment rule of :mod:`.dynamic`: these kernels only change what one thread
reads and writes, not the arithmetic.

Memory access (the kernels are bound by DRAM bandwidth on an H100): a chunk is 16 bytes of the
float operand (``G`` elements) and its ``G / 2`` packed bytes. A thread issues ``unroll`` chunk loads
(and their scale loads) before it computes any of them, chunks ``c, c + grid, ...`` so that every
load and store of a warp is one contiguous span (a dequantize that loaded 16 packed bytes per thread
and stored that thread's four chunks in a row ran at 40% of copy on an H100: every store half-filled
its sectors); the group of a chunk is a shift when the chunks per group are a power of two (a 64-bit
division otherwise).

- ``quantize_kernel``: float -> packed; ``dequantize_kernel``: packed -> float.
- ``dynamic_kernel``: dynamic-range per group in one pass: the ``cpg`` chunks of a group are held by
  ``lanes`` lanes of one warp (``per_lane`` chunks each, in registers), the lanes reduce the group's
  range with butterfly shuffles, lane 0 writes the scale (and zero point), and every lane quantizes,
  packs and stores what it holds. ``x`` is read once.
- ``pack_kernel``: int8 values already in the 4-bit range -> packed (the second step of the two-pass
  dynamic-range path, kept for groups that are not a whole number of chunks and misaligned operands).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from ..vocabulary import ElementKind, MathPrecision
from . import device
from .codecs import codec, math_type
from .device import device_function
from .elementwise import (
    CHUNK_BYTES,
    ElementwiseKernel,
    ElementwiseOp,
    chunk_io,
    op_functions,
    quantize_int,
    uint_name,
)
from .ranges import chunk_range_function, range_functions

__all__ = ["PACKED_ELEMENTS", "chunk_elements", "group_shift", "dynamic_layout", "groups_per_pass",
           "quantize_kernel", "dequantize_kernel", "dynamic_kernel", "pack_kernel"]

PACKED_ELEMENTS = (ElementKind.S4, ElementKind.U4)
_NIBBLE = np.uint64(0xF)
_FOUR = np.uint64(4)


def _math_name(precision: MathPrecision) -> str:
    return "float64" if precision is MathPrecision.F64 else "float32"


def chunk_elements(element: ElementKind) -> int:
    """Elements per chunk: 16 bytes of the float operand (their nibbles: ``G / 2`` packed bytes)."""
    return CHUNK_BYTES // element.itemsize


def group_shift(chunks_per_group: int) -> int:
    """``log2(chunks_per_group)`` when it is a power of two (the group of chunk ``c`` is ``c >> shift``), else -1."""
    if chunks_per_group > 0 and chunks_per_group & (chunks_per_group - 1) == 0:
        return chunks_per_group.bit_length() - 1
    return -1


def dynamic_layout(chunks_per_group: int, max_lanes: int, max_per_lane: int) -> tuple[int, int] | None:
    """``(lanes, per_lane)`` of the one-pass dynamic kernel for groups of ``chunks_per_group`` chunks:
    ``lanes`` the largest power of two <= ``max_lanes`` dividing it, or more (up to 32) while a lane would
    hold more than ``max_per_lane`` chunks; ``per_lane = chunks_per_group / lanes``; None when a lane would
    still hold more than ``max_per_lane`` chunks (such groups take the two-pass path)."""
    if chunks_per_group <= 0:
        return None
    lanes = 1
    while lanes < 32 and chunks_per_group % (2 * lanes) == 0 and (
            lanes < max_lanes or chunks_per_group // lanes > max_per_lane):
        lanes *= 2
    per_lane = chunks_per_group // lanes
    return (lanes, per_lane) if per_lane <= max_per_lane else None


def groups_per_pass(per_lane: int, slots: int) -> int:
    """Groups a team of the dynamic kernel takes per pass: as many as ``slots`` chunks per lane hold."""
    return max(1, slots // per_lane)


@device_function
def _group_of(c, shift, chunks_per_group):
    return (c >> shift) if shift >= 0 else c // chunks_per_group


@functools.cache
def _nibble_packer(element: ElementKind, packed: ElementKind, precision: MathPrecision):
    """``pack(lo, hi, inv, scale, zp, q_min, q_max)``: the ``G`` floats of a chunk (two uint64 words)
    quantized (the elementwise ``quantize``) and packed into ``G / 2`` bytes, element 0 lowest: one
    ``cvt.pack.sat`` per byte, chained from the highest byte down. ``quantize_int`` has clamped each
    value into ``[q_min, q_max]``, inside the 4-bit range, so the saturation never changes one."""
    G = chunk_elements(element)
    decode = codec(element, precision).decode
    bits = 8 * element.itemsize
    u64 = np.uint64
    nibble_pair = device.pack_s4_pair if packed is ElementKind.S4 else device.pack_u4_pair

    @device_function
    def nibble(x, inv, sc, zp, q_min, q_max):
        return u64(quantize_int(x, inv, zp, q_min, q_max)) & _NIBBLE

    @device_function
    def value(lo, hi, j, inv, zp, q_min, q_max):
        bit = j * bits
        return quantize_int(decode((lo if bit < 64 else hi) >> u64(bit % 64)), inv, zp, q_min, q_max)

    @device_function
    def pack(lo, hi, inv, sc, zp, q_min, q_max):
        word = u64(0)
        for k in range(G // 2 - 1, -1, -1):
            word = nibble_pair(value(lo, hi, 2 * k + 1, inv, zp, q_min, q_max),
                               value(lo, hi, 2 * k, inv, zp, q_min, q_max), word)
        return word

    return nibble, pack


@functools.cache
def quantize_kernel(element: ElementKind, packed: ElementKind, precision: MathPrecision,
                    unroll: int) -> ElementwiseKernel:
    """``q[b] = nibble(quantize(x[2b])) | nibble(quantize(x[2b + 1])) << 4``.

    Arguments: ``x_chunks (uint64 pairs), x_elems, q_chunks (G / 2 bytes each), q_bytes, scales,
    zero_points, nchunks, nbytes, group_size, shift, q_min, q_max`` (``shift``: :func:`group_shift` of
    the chunks per group). Each thread loads ``unroll`` chunks and their scales before quantizing them;
    every chunk lies inside one group (the plan passes ``nchunks = 0`` unless ``group_size % G == 0`` and the
    operands are aligned); the bytes past the chunks go one per thread. Zero points are read for U4 only (S4
    is symmetric: zero point 0).
    """
    M = math_type(precision)
    G = chunk_elements(element)
    decode = codec(element, precision).decode
    nibble, pack = _nibble_packer(element, packed, precision)
    load, _ = chunk_io(CHUNK_BYTES)
    reads_zero_points = packed is ElementKind.U4
    zero = M(0.0)
    u64 = np.uint64
    reciprocal = device.reciprocal

    @device_function
    def zero_point(zero_points, s):
        return M(zero_points[s]) if reads_zero_points else zero

    @device_function
    def inverse(sc):
        return reciprocal(sc) if sc != zero else zero

    def kernel(xw, x, qw, q, scales, zero_points, nchunks, nbytes, group_size, shift, q_min, q_max):
        start, stride = cuda.grid(1), cuda.gridsize(1)
        x_lo = cuda.local.array(unroll, np.uint64)
        x_hi = cuda.local.array(unroll, np.uint64)
        k_scale = cuda.local.array(unroll, M)
        k_zp = cuda.local.array(unroll, M)
        cpg = group_size // G
        c = start
        while c + (unroll - 1) * stride < nchunks:  # all unroll chunks exist: loads first, then the math
            for k in range(unroll):
                ck = c + k * stride
                x_lo[k], x_hi[k] = load(xw, ck)
                s = _group_of(ck, shift, cpg)
                k_scale[k] = scales[s]
                k_zp[k] = zero_point(zero_points, s)
            for k in range(unroll):
                sc = k_scale[k]
                qw[c + k * stride] = pack(x_lo[k], x_hi[k], inverse(sc), sc, k_zp[k], q_min, q_max)
            c += unroll * stride
        while c < nchunks:
            lo, hi = load(xw, c)
            s = _group_of(c, shift, cpg)
            sc = scales[s]
            qw[c] = pack(lo, hi, inverse(sc), sc, zero_point(zero_points, s), q_min, q_max)
            c += stride
        # a while loop: range() divides for its trip count (docs/design.md, "Instructions per byte")
        b = nchunks * (G // 2) + start
        while b < nbytes:
            s = (2 * b) // group_size
            sc = scales[s]
            inv, zp = inverse(sc), zero_point(zero_points, s)
            lo = nibble(decode(u64(x[2 * b])), inv, sc, zp, q_min, q_max)
            hi = nibble(decode(u64(x[2 * b + 1])), inv, sc, zp, q_min, q_max)
            q[b] = lo | (hi << _FOUR)
            b += stride

    m = _math_name(precision)
    signature = (f"void(uint64[::1], {uint_name(element.itemsize)}[::1], {uint_name(G // 2)}[::1], uint8[::1], "
                 f"{m}[::1], int32[::1], int64, int64, int64, int64, {m}, {m})")
    kernel.__name__ = kernel.__qualname__ = f"quantize_packed_{element.short}_{packed.short}_u{unroll}"
    return ElementwiseKernel(kernel, signature, element, None, packed, precision, G, (), unroll)


@functools.cache
def dequantize_kernel(element: ElementKind, packed: ElementKind, precision: MathPrecision,
                      unroll: int) -> ElementwiseKernel:
    """``x[2b + k] = (nibble_k(q[b]) - zero_point) * scale`` (S4 nibbles sign-extended).

    Arguments: ``q_chunks, q_bytes, x_chunks, x_elems, scales, zero_points, nchunks, nbytes,
    group_size, shift``; chunks as in :func:`quantize_kernel` (``G / 2``-byte loads, 16-byte stores).
    A nibble becomes a float through the float adder (``2**23 + n`` has ``n`` as its mantissa), not
    the quarter-rate conversion unit: the same exact small integer.
    """
    M = math_type(precision)
    G = chunk_elements(element)
    dequantize = op_functions(precision)[ElementwiseOp.DEQUANTIZE]
    encode, encode_pair = codec(element, precision).encode, codec(element, precision).encode_pair
    pairs = encode_pair is not None
    step = 2 if pairs else 1
    _, store = chunk_io(CHUNK_BYTES)
    bits = 8 * element.itemsize
    signed = packed is ElementKind.S4
    reads_zero_points = not signed
    zero = M(0.0)
    u64 = np.uint64
    # S4: (n ^ 8) is the value + 8 (offset binary), so 2**23 + (n ^ 8) - (2**23 + 8) is the value.
    flip = u64(8 if signed else 0)
    exponent = u64(0x4B000000)  # the float32 bits of 2**23
    offset = np.float32(2.0**23 + (8 if signed else 0))
    bits_to_f32 = device.bits_to_f32

    @device_function
    def real(nibble, sc, zp):
        v = M(bits_to_f32((nibble ^ flip) | exponent) - offset)
        return dequantize(v, zero, zero, sc, zp, zero, zero)

    @device_function
    def value(nibble, sc, zp):
        return encode(real(nibble, sc, zp))

    @device_function
    def zero_point(zero_points, s):
        return M(zero_points[s]) if reads_zero_points else zero

    @device_function
    def unpack(word, sc, zp):
        lo, hi = u64(0), u64(0)
        for j in range(0, G, step):
            if pairs:  # 16-bit floats two per conversion
                e = encode_pair(real((word >> u64(4 * j)) & _NIBBLE, sc, zp),
                                real((word >> u64(4 * j + 4)) & _NIBBLE, sc, zp))
            else:
                e = value((word >> u64(4 * j)) & _NIBBLE, sc, zp)
            bit = j * bits
            if bit < 64:
                lo |= e << u64(bit)
            else:
                hi |= e << u64(bit - 64)
        return lo, hi

    def kernel(qw, q, xw, x, scales, zero_points, nchunks, nbytes, group_size, shift):
        start, stride = cuda.grid(1), cuda.gridsize(1)
        k_word = cuda.local.array(unroll, np.uint64)
        k_scale = cuda.local.array(unroll, M)
        k_zp = cuda.local.array(unroll, M)
        cpg = group_size // G
        c = start
        while c + (unroll - 1) * stride < nchunks:
            for k in range(unroll):
                ck = c + k * stride
                k_word[k] = u64(qw[ck])
                s = _group_of(ck, shift, cpg)
                k_scale[k] = scales[s]
                k_zp[k] = zero_point(zero_points, s)
            for k in range(unroll):
                lo, hi = unpack(k_word[k], k_scale[k], k_zp[k])
                store(xw, c + k * stride, lo, hi)
            c += unroll * stride
        while c < nchunks:
            s = _group_of(c, shift, cpg)
            lo, hi = unpack(u64(qw[c]), scales[s], zero_point(zero_points, s))
            store(xw, c, lo, hi)
            c += stride
        # a while loop: range() divides for its trip count (docs/design.md, "Instructions per byte")
        b = nchunks * (G // 2) + start
        while b < nbytes:
            s = (2 * b) // group_size
            sc, zp = scales[s], zero_point(zero_points, s)
            byte = u64(q[b])
            x[2 * b] = value(byte & _NIBBLE, sc, zp)
            x[2 * b + 1] = value(byte >> _FOUR, sc, zp)
            b += stride

    signature = (f"void({uint_name(G // 2)}[::1], uint8[::1], uint64[::1], {uint_name(element.itemsize)}[::1], "
                 f"{_math_name(precision)}[::1], int32[::1], int64, int64, int64, int64)")
    kernel.__name__ = kernel.__qualname__ = f"dequantize_packed_{packed.short}_{element.short}_u{unroll}"
    return ElementwiseKernel(kernel, signature, packed, None, element, precision, G, (), unroll)


@functools.cache
def dynamic_kernel(element: ElementKind, packed: ElementKind, precision: MathPrecision, symmetric: bool,
                   per_lane: int, slots: int, threads: int, fixed_lanes: int = 0) -> ElementwiseKernel:
    """Dynamic-range quantize per group to packed nibbles in one pass (read ``x`` once).

    Arguments: ``x_chunks (uint64 pairs), q_chunks (G / 2 bytes each), scales, zero_points, ngroups,
    lanes, q_min, q_max, zp_sym``. A group is ``lanes * per_lane`` chunks (``lanes`` a power of two
    <= 32, :func:`dynamic_layout`); team ``t`` (``lanes`` consecutive threads) takes groups ``t, t +
    teams, ...``, ``max(1, slots // per_lane)`` of them per pass with all their loads issued first;
    lane ``l`` holds chunks ``l, l + lanes, ...`` of its group. The butterfly over the team gives
    every lane the range; lane 0 writes the scale and, when ``zero_points`` is not empty, the zero
    point. Every thread of a block runs the same number of passes (the shuffles need the whole warp;
    the simulator's need the whole block). ``threads`` per block is baked in for the simulator's shuffle
    scratch. ``fixed_lanes`` (a power of two) bakes ``lanes``
    in, so that the butterfly is unrolled and a team's index is a shift; the ``lanes`` argument must
    then equal it.
    """
    M = math_type(precision)
    G = chunk_elements(element)
    tpb = threads
    per_pass = groups_per_pass(per_lane, slots)
    held = per_pass * per_lane
    _, pack = _nibble_packer(element, packed, precision)
    _, combine, range_params = range_functions(precision, symmetric)
    load, _ = chunk_io(CHUNK_BYTES)
    shuffle_xor = device.shuffle_xor
    zero = M(0.0)
    i32 = np.int32

    chunk_range = chunk_range_function(element, precision, symmetric)

    def kernel(xw, qw, scales, zero_points, ngroups, lanes_arg, q_min, q_max, zp_sym):
        tid = cuda.threadIdx.x
        lanes = fixed_lanes if fixed_lanes else lanes_arg
        scratch_hi = cuda.shared.array(tpb, M)  # used only by the simulator's shuffles
        scratch_lo = cuda.shared.array(tpb, M)
        w_lo = cuda.local.array(held, np.uint64)
        w_hi = cuda.local.array(held, np.uint64)
        team = tid // lanes
        lane = tid - team * lanes
        teams_per_block = cuda.blockDim.x // lanes
        teams = cuda.gridDim.x * teams_per_block
        cpg = lanes * per_lane
        writes_zero_points = len(zero_points) > 0
        first = cuda.blockIdx.x * teams_per_block  # this block's first group: the loop is block-uniform
        while first < ngroups:
            for u in range(per_pass):
                g = first + team + u * teams
                if g < ngroups:
                    for r in range(per_lane):
                        w_lo[u * per_lane + r], w_hi[u * per_lane + r] = load(xw, g * cpg + lane + r * lanes)
            for u in range(per_pass):
                g = first + team + u * teams
                hi, lo = zero, zero
                if g < ngroups:
                    for r in range(per_lane):
                        hi, lo = chunk_range(hi, lo, w_lo[u * per_lane + r], w_hi[u * per_lane + r])
                offset = lanes // 2
                while offset > 0:
                    other_hi = shuffle_xor(hi, offset, scratch_hi, tid)
                    other_lo = lo
                    if not symmetric:
                        other_lo = shuffle_xor(lo, offset, scratch_lo, tid)
                    hi, lo = combine(hi, lo, other_hi, other_lo)
                    offset //= 2
                if g < ngroups:
                    inv, sc, zp = range_params(hi, lo, q_min, q_max, zp_sym)
                    if lane == 0:
                        scales[g] = sc
                        if writes_zero_points:
                            zero_points[g] = i32(zp)
                    for r in range(per_lane):
                        qw[g * cpg + lane + r * lanes] = pack(w_lo[u * per_lane + r], w_hi[u * per_lane + r], inv,
                                                              sc, zp, q_min, q_max)
            first += per_pass * teams

    m = _math_name(precision)
    signature = f"void(uint64[::1], {uint_name(G // 2)}[::1], {m}[::1], int32[::1], int64, int64, {m}, {m}, {m})"
    tag = f"{'sym' if symmetric else 'asym'}_{element.short}_{packed.short}_r{per_lane}_s{slots}_t{tpb}"
    if fixed_lanes:
        tag += f"_l{fixed_lanes}"
    kernel.__name__ = kernel.__qualname__ = f"dynamic_packed_{tag}"
    return ElementwiseKernel(kernel, signature, element, None, packed, precision, G)


@functools.cache
def pack_kernel() -> ElementwiseKernel:
    """``q[b] = (v[2b] & 0xF) | (v[2b + 1] & 0xF) << 4`` over bytes ``v`` holding 4-bit values.

    Arguments: ``values (uint8 bytes), q_bytes, nbytes``.
    """
    def kernel(values, q, nbytes):
        for b in range(cuda.grid(1), nbytes, cuda.gridsize(1)):
            q[b] = (np.uint64(values[2 * b]) & _NIBBLE) | ((np.uint64(values[2 * b + 1]) & _NIBBLE) << _FOUR)

    kernel.__name__ = kernel.__qualname__ = "pack_nibbles"
    return ElementwiseKernel(kernel, "void(uint8[::1], uint8[::1], int64)", ElementKind.U8, None, ElementKind.U8,
                             MathPrecision.F32, 2)
