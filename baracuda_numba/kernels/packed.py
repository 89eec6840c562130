"""Packed 4-bit integers (S4 / U4): two elements per byte, the element of even index in the low nibble.

Layout: a tensor ``[..., D]`` of 4-bit elements is stored as ``uint8 [..., D / 2]``; byte ``b`` holds
element ``2b`` in bits 0-3 and element ``2b + 1`` in bits 4-7 (S4 as a 4-bit two's complement).
Scales (and U4 zero points) are per group of ``group_size`` consecutive elements along the last
axis, ``group_size`` even so that no byte straddles two groups.

The math is the elementwise family's (:func:`.elementwise.op_functions`, integer grid): these
kernels only change what one thread reads and writes (a 16-byte chunk of floats and its ``G / 2``
packed bytes, or one byte at the tail), not the arithmetic.
``quantize_kernel``: float -> packed; ``dequantize_kernel``: packed -> float; ``pack_kernel``: int8
values already in the 4-bit range -> packed (the second step of dynamic-range quantization).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from ..vocabulary import ElementKind, MathPrecision
from . import device
from .codecs import codec, math_type
from .device import device_function
from .elementwise import CHUNK_BYTES, ElementwiseKernel, ElementwiseOp, chunk_io, op_functions, uint_name

__all__ = ["PACKED_ELEMENTS", "chunk_elements", "quantize_kernel", "dequantize_kernel", "pack_kernel"]

PACKED_ELEMENTS = (ElementKind.S4, ElementKind.U4)
_NIBBLE = np.uint64(0xF)
_FOUR = np.uint64(4)


def _math_name(precision: MathPrecision) -> str:
    return "float64" if precision is MathPrecision.F64 else "float32"


def chunk_elements(element: ElementKind) -> int:
    """Elements per chunk: 16 bytes of the float operand (their nibbles: ``G / 2`` packed bytes)."""
    return CHUNK_BYTES // element.itemsize


@functools.cache
def quantize_kernel(element: ElementKind, packed: ElementKind, precision: MathPrecision) -> ElementwiseKernel:
    """``q[b] = nibble(quantize(x[2b])) | nibble(quantize(x[2b + 1])) << 4``.

    Arguments: ``x_chunks (uint64 pairs), x_elems, q_chunks (G / 2 bytes each), q_bytes, scales,
    zero_points, nchunks, nbytes, group_size, q_min, q_max``. Thread ``t`` takes chunks ``t, t +
    grid, ...`` (16-byte loads, ``G / 2``-byte stores: coalesced), every chunk inside one group
    (the plan passes ``nchunks = 0`` unless ``group_size % G == 0`` and the operands are aligned);
    the bytes past the chunks go one per thread. Zero points are read for U4 only (S4 is
    symmetric: zero point 0).
    """
    M = math_type(precision)
    G = chunk_elements(element)
    quantize = op_functions(precision)[ElementwiseOp.QUANTIZE]
    decode = codec(element, precision).decode
    encode = codec(ElementKind.S8, precision).encode  # two's complement low byte; its low nibble is the 4-bit value
    load, _ = chunk_io(CHUNK_BYTES)
    bits = 8 * element.itemsize
    reads_zero_points = packed is ElementKind.U4
    zero = M(0.0)
    u64 = np.uint64
    reciprocal = device.reciprocal

    @device_function
    def params(scales, zero_points, s):
        sc = scales[s]
        inv = reciprocal(sc) if sc != zero else zero
        return inv, sc, (M(zero_points[s]) if reads_zero_points else zero)

    @device_function
    def nibble(x, inv, sc, zp, q_min, q_max):
        return encode(quantize(x, zero, inv, sc, zp, q_min, q_max)) & _NIBBLE

    def kernel(xw, x, qw, q, scales, zero_points, nchunks, nbytes, group_size, q_min, q_max):
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for c in range(start, nchunks, stride):
            lo, hi = load(xw, c)
            inv, sc, zp = params(scales, zero_points, (c * G) // group_size)
            word = u64(0)
            for j in range(G):
                bit = j * bits
                w = (lo if bit < 64 else hi) >> u64(bit % 64)
                word |= nibble(decode(w), inv, sc, zp, q_min, q_max) << u64(4 * j)
            qw[c] = word
        for b in range(nchunks * (G // 2) + start, nbytes, stride):
            inv, sc, zp = params(scales, zero_points, (2 * b) // group_size)
            lo = nibble(decode(u64(x[2 * b])), inv, sc, zp, q_min, q_max)
            hi = nibble(decode(u64(x[2 * b + 1])), inv, sc, zp, q_min, q_max)
            q[b] = lo | (hi << _FOUR)

    m = _math_name(precision)
    signature = (f"void(uint64[::1], {uint_name(element.itemsize)}[::1], {uint_name(G // 2)}[::1], uint8[::1], "
                 f"{m}[::1], int32[::1], int64, int64, int64, {m}, {m})")
    kernel.__name__ = kernel.__qualname__ = f"quantize_packed_{element.short}_{packed.short}"
    return ElementwiseKernel(kernel, signature, element, None, packed, precision, G)


@functools.cache
def dequantize_kernel(element: ElementKind, packed: ElementKind, precision: MathPrecision) -> ElementwiseKernel:
    """``x[2b + k] = (nibble_k(q[b]) - zero_point) * scale`` (S4 nibbles sign-extended).

    Arguments: ``q_chunks, q_bytes, x_chunks, x_elems, scales, zero_points, nchunks, nbytes,
    group_size``; chunks as in :func:`quantize_kernel` (``G / 2``-byte loads, 16-byte stores).
    """
    M = math_type(precision)
    G = chunk_elements(element)
    dequantize = op_functions(precision)[ElementwiseOp.DEQUANTIZE]
    encode = codec(element, precision).encode
    _, store = chunk_io(CHUNK_BYTES)
    bits = 8 * element.itemsize
    signed = packed is ElementKind.S4
    reads_zero_points = not signed
    zero = M(0.0)
    eight, sixteen = M(8.0), M(16.0)
    u64 = np.uint64

    @device_function
    def value(nibble, sc, zp):
        v = M(nibble)
        if signed and v >= eight:
            v -= sixteen
        return encode(dequantize(v, zero, zero, sc, zp, zero, zero))

    @device_function
    def params(scales, zero_points, s):
        return scales[s], (M(zero_points[s]) if reads_zero_points else zero)

    def kernel(qw, q, xw, x, scales, zero_points, nchunks, nbytes, group_size):
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for c in range(start, nchunks, stride):
            word = u64(qw[c])
            sc, zp = params(scales, zero_points, (c * G) // group_size)
            lo, hi = u64(0), u64(0)
            for j in range(G):
                e = value((word >> u64(4 * j)) & _NIBBLE, sc, zp)
                bit = j * bits
                if bit < 64:
                    lo |= e << u64(bit)
                else:
                    hi |= e << u64(bit - 64)
            store(xw, c, lo, hi)
        for b in range(nchunks * (G // 2) + start, nbytes, stride):
            sc, zp = params(scales, zero_points, (2 * b) // group_size)
            byte = u64(q[b])
            x[2 * b] = value(byte & _NIBBLE, sc, zp)
            x[2 * b + 1] = value(byte >> _FOUR, sc, zp)

    signature = (f"void({uint_name(G // 2)}[::1], uint8[::1], uint64[::1], {uint_name(element.itemsize)}[::1], "
                 f"{_math_name(precision)}[::1], int32[::1], int64, int64, int64)")
    kernel.__name__ = kernel.__qualname__ = f"dequantize_packed_{packed.short}_{element.short}"
    return ElementwiseKernel(kernel, signature, packed, None, element, precision, G)


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
