"""Packed 4-bit integers (S4 / U4): two elements per byte, the element of even index in the low nibble.

Layout: a tensor ``[..., D]`` of 4-bit elements is stored as ``uint8 [..., D / 2]``; byte ``b`` holds
element ``2b`` in bits 0-3 and element ``2b + 1`` in bits 4-7 (S4 as a 4-bit two's complement).
Scales (and U4 zero points) are per group of ``group_size`` consecutive elements along the last
axis, ``group_size`` even so that no byte straddles two groups.

The math is the elementwise family's (:func:`.elementwise.op_functions`, integer grid): these
kernels only change what one thread reads and writes (a byte: two elements), not the arithmetic.
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
from .elementwise import ElementwiseKernel, ElementwiseOp, op_functions, uint_name

__all__ = ["PACKED_ELEMENTS", "quantize_kernel", "dequantize_kernel", "pack_kernel"]

PACKED_ELEMENTS = (ElementKind.S4, ElementKind.U4)
_NIBBLE = np.uint64(0xF)
_FOUR = np.uint64(4)


def _math_name(precision: MathPrecision) -> str:
    return "float64" if precision is MathPrecision.F64 else "float32"


@functools.cache
def quantize_kernel(element: ElementKind, packed: ElementKind, precision: MathPrecision) -> ElementwiseKernel:
    """``q[b] = nibble(quantize(x[2b])) | nibble(quantize(x[2b + 1])) << 4``.

    Arguments: ``x_elems, q_bytes, scales, zero_points, nbytes, group_size, q_min, q_max``; zero
    points are read for U4 only (S4 is symmetric: zero point 0).
    """
    M = math_type(precision)
    quantize = op_functions(precision)[ElementwiseOp.QUANTIZE]
    decode = codec(element, precision).decode
    encode = codec(ElementKind.S8, precision).encode  # two's complement low byte; its low nibble is the 4-bit value
    reads_zero_points = packed is ElementKind.U4
    zero, none = M(0.0), M(0.0)
    u64 = np.uint64
    reciprocal = device.reciprocal

    @device_function
    def params(scales, zero_points, s):
        sc = scales[s]
        inv = reciprocal(sc) if sc != zero else zero
        return inv, sc, (M(zero_points[s]) if reads_zero_points else zero)

    def kernel(x, q, scales, zero_points, nbytes, group_size, q_min, q_max):
        for b in range(cuda.grid(1), nbytes, cuda.gridsize(1)):
            inv, sc, zp = params(scales, zero_points, (2 * b) // group_size)
            lo = encode(quantize(decode(u64(x[2 * b])), none, inv, sc, zp, q_min, q_max)) & _NIBBLE
            hi = encode(quantize(decode(u64(x[2 * b + 1])), none, inv, sc, zp, q_min, q_max)) & _NIBBLE
            q[b] = lo | (hi << _FOUR)

    m = _math_name(precision)
    signature = f"void({uint_name(element.itemsize)}[::1], uint8[::1], {m}[::1], int32[::1], int64, int64, {m}, {m})"
    kernel.__name__ = kernel.__qualname__ = f"quantize_packed_{element.short}_{packed.short}"
    return ElementwiseKernel(kernel, signature, element, None, packed, precision, 2)


@functools.cache
def dequantize_kernel(element: ElementKind, packed: ElementKind, precision: MathPrecision) -> ElementwiseKernel:
    """``x[2b + k] = (nibble_k(q[b]) - zero_point) * scale`` (S4 nibbles sign-extended).

    Arguments: ``q_bytes, x_elems, scales, zero_points, nbytes, group_size``.
    """
    M = math_type(precision)
    dequantize = op_functions(precision)[ElementwiseOp.DEQUANTIZE]
    encode = codec(element, precision).encode
    signed = packed is ElementKind.S4
    reads_zero_points = not signed
    zero = M(0.0)
    eight, sixteen = M(8.0), M(16.0)

    @device_function
    def value(nibble):
        v = M(nibble)
        if signed and v >= eight:
            v -= sixteen
        return v

    def kernel(q, x, scales, zero_points, nbytes, group_size):
        for b in range(cuda.grid(1), nbytes, cuda.gridsize(1)):
            s = (2 * b) // group_size
            sc = scales[s]
            zp = M(zero_points[s]) if reads_zero_points else zero
            byte = np.uint64(q[b])
            x[2 * b] = encode(dequantize(value(byte & _NIBBLE), zero, zero, sc, zp, zero, zero))
            x[2 * b + 1] = encode(dequantize(value(byte >> _FOUR), zero, zero, sc, zp, zero, zero))

    signature = (f"void(uint8[::1], {uint_name(element.itemsize)}[::1], {_math_name(precision)}[::1], int32[::1], "
                 "int64, int64)")
    kernel.__name__ = kernel.__qualname__ = f"dequantize_packed_{packed.short}_{element.short}"
    return ElementwiseKernel(kernel, signature, packed, None, element, precision, 2)


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
