"""Per-element codecs: an element's bit pattern (low bits of a ``uint64``) to and from the math type.

Kernels move memory as ``uint64`` words (8 bytes, several elements each) and as unsigned elements
of the storage width, so a codec is all a kernel needs to know about a dtype. One codec per
(element, math precision); each is a pair of device functions built once and cached.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..vocabulary import ElementKind, MathPrecision
from . import device
from .device import device_function

__all__ = ["Codec", "codec", "math_type"]

_BYTE = np.uint64(0xFF)


def math_type(precision: MathPrecision) -> type:
    """NumPy scalar type used as the cast to the math precision (works in kernels and on the host)."""
    return np.float64 if precision is MathPrecision.F64 else np.float32


@dataclass(frozen=True)
class Codec:
    """``decode(bits) -> math value`` and ``encode(math value) -> bits`` for one element kind."""

    element: ElementKind
    decode: Any
    encode: Any
    lanes: int  # elements per uint64 word


@functools.cache
def codec(element: ElementKind, precision: MathPrecision) -> Codec:
    M = math_type(precision)
    if element is ElementKind.F32:
        decode_bits, encode_bits = device.bits_to_f32, device.f32_to_bits
    elif element is ElementKind.F64:
        decode_bits, encode_bits = device.bits_to_f64, device.f64_to_bits
    elif element is ElementKind.F16:
        decode_bits, encode_bits = device.f16_bits_to_f32, device.f32_to_f16_bits
    elif element is ElementKind.BF16:
        decode_bits, encode_bits = device.bf16_bits_to_f32, device.f32_to_bf16_bits
    elif element in (ElementKind.S8, ElementKind.U8):
        # Integer <-> float through the float adder instead of the (quarter-rate) conversion unit:
        # for an integral |q| < 2**22, the low mantissa bits of q + 1.5 * 2**23 are q's two's
        # complement, and 2**23 + byte has the byte as its mantissa.
        if precision is MathPrecision.F64:
            magic, to_bits = np.float64(1.5 * 2.0**52), device.f64_to_bits
        else:
            magic, to_bits = np.float32(1.5 * 2.0**23), device.f32_to_bits
        signed = element is ElementKind.S8
        offset = np.float32(2.0**23 + (128 if signed else 0))
        flip = np.uint64(0x80 if signed else 0)
        exponent = np.uint64(0x4B000000)  # the float32 bits of 2**23

        @device_function
        def decode_int(w):
            return M(device.bits_to_f32(((w & _BYTE) ^ flip) | exponent) - offset)

        @device_function
        def encode_int(q):
            return to_bits(q + magic) & _BYTE

        return Codec(element, decode_int, encode_int, 8)
    else:
        raise ValueError(f"no codec for {element!r}")

    # f16/bf16/f32 convert through float32 (rounding once to the element), f64 through float64.
    wide = np.float64 if element is ElementKind.F64 else np.float32

    @device_function
    def decode_float(w):
        return M(decode_bits(w))

    @device_function
    def encode_float(x):
        return encode_bits(wide(x))

    return Codec(element, decode_float, encode_float, 8 // element.itemsize)
