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

from ..platform import SIMULATOR
from ..vocabulary import ElementKind, MathPrecision
from . import device
from .device import device_function

__all__ = ["Codec", "codec", "math_type", "Fp8Format", "fp8_format", "fp8_bits_codec"]

_BYTE = np.uint64(0xFF)


@dataclass(frozen=True)
class Fp8Format:
    """Bit layout of an 8-bit float: 1 sign, ``exponent_bits``, ``mantissa_bits``, biased exponent.

    ``max_bits`` is the largest finite magnitude's encoding (0x7E for E4M3fn: S.1111.111 is NaN;
    0x7B for E5M2: S.11111.00 is infinity).
    """

    mantissa_bits: int
    exponent_bias: int
    max_bits: int
    infinities: bool


_FP8 = {
    ElementKind.FP8_E4M3: Fp8Format(3, 7, 0x7E, False),
    ElementKind.FP8_E5M2: Fp8Format(2, 15, 0x7B, True),
}


def fp8_format(element: ElementKind) -> Fp8Format:
    """The :class:`Fp8Format` of an FP8 element."""
    return _FP8[element]


@functools.cache
def fp8_bits_codec(element: ElementKind):
    """``(decode, encode)`` device functions between FP8 bits and float32 *bits* (both uint64).

    ``encode(f32 bits)``: round to nearest even with subnormals (one rounding from float32), finite
    values beyond the largest finite one and +-inf saturate to ``+-max`` (E5M2 too: saturating,
    as a quantizer must), NaN -> ``0x7F`` with the NaN's sign (PyTorch's encoding in both formats).
    Integer arithmetic only: the same on the GPU and the simulator, no ``cvt.e4m3`` needed.
    ``decode(fp8 bits)``: exact (every FP8 value is a float32), NaN -> quiet NaN, +-inf for E5M2.
    """
    fmt = _FP8[element]
    u64 = np.uint64
    m = fmt.mantissa_bits
    shift = u64(23 - m)  # float32 mantissa bits dropped
    rebias = u64((127 - fmt.exponent_bias) << 23)  # float32 -> FP8 exponent bias, in place
    # A float32 whose biased exponent is below this is subnormal (or zero) in FP8.
    min_normal_exponent = u64(127 - fmt.exponent_bias + 1)
    sub_shift_base = u64(23 - m + 127 - fmt.exponent_bias + 1)  # shift = base - exponent
    max_bits, nan_bits = u64(fmt.max_bits), u64(0x7F)
    sign_bit, abs_mask, f32_inf = u64(0x80000000), u64(0x7FFFFFFF), u64(0x7F800000)
    implicit, mantissa_mask = u64(0x800000), u64(0x7FFFFF)
    one, zero, sign_shift = u64(1), u64(0), u64(24)
    round_bias = (one << (shift - one)) - one
    exp_mask = u64((1 << (7 - m)) - 1)
    fp8_mantissa_mask = u64((1 << m) - 1)
    top_exponent = exp_mask
    has_inf = fmt.infinities
    f32_nan = u64(0x7FC00000)

    @device_function
    def encode(bits):
        sign = (bits & sign_bit) >> sign_shift
        a = bits & abs_mask
        if a > f32_inf:
            return sign | nan_bits
        exponent = a >> u64(23)
        if exponent >= min_normal_exponent:
            r = a - rebias
            r = (r + round_bias + ((r >> shift) & one)) >> shift
        else:
            r = zero
            s = sub_shift_base - exponent
            if exponent > zero and s <= u64(24):
                mant = (a & mantissa_mask) | implicit
                q = mant >> s
                rem = mant & ((one << s) - one)
                half = one << (s - one)
                if rem > half or (rem == half and (q & one) == one):
                    q += one
                r = q
        if r > max_bits:
            r = max_bits
        return sign | r

    @device_function
    def decode(w):
        b = w & _BYTE
        sign = (b & u64(0x80)) << sign_shift
        e = (b >> u64(m)) & exp_mask
        mant = b & fp8_mantissa_mask
        if e == top_exponent and (has_inf or mant == fp8_mantissa_mask):
            if has_inf and mant == zero:
                return sign | f32_inf
            return sign | f32_nan
        if e == zero:
            if mant == zero:
                return sign
            # Subnormal: shift the mantissa up to its leading one (k places), into a float32 normal.
            k = one
            mant <<= one
            while (mant & (one << u64(m))) == zero:
                mant <<= one
                k += one
            return sign | ((min_normal_exponent - k) << u64(23)) | ((mant & fp8_mantissa_mask) << shift)
        return sign | ((e + min_normal_exponent - one) << u64(23)) | (mant << shift)

    return decode, encode


def _fp8_codec(element: ElementKind, M: type):
    """``(decode, encode)`` between FP8 bits and the math type ``M``.

    On the GPU one conversion instruction each way (``cvt.rn.satfinite.{e4m3,e5m2}x2.f32``, sm_89+;
    E4M3 decodes through ``cvt.rn.f16x2.e4m3x2``, E5M2 bits are the top byte of a float16), with the
    NaN's sign put back (the instruction gives the canonical NaN, PyTorch keeps the sign). The
    simulator runs :func:`fp8_bits_codec`, the integer model of the same conversion: both are held
    to PyTorch's ``x.to(float8)`` bit for bit (tests/test_fp8.py).
    """
    if SIMULATOR:
        fp8_decode, fp8_encode = fp8_bits_codec(element)

        @device_function
        def decode_model(w):
            return M(device.bits_to_f32(fp8_decode(w)))

        @device_function
        def encode_model(x):
            return fp8_encode(device.f32_to_bits(np.float32(x)))

        return decode_model, encode_model

    e4m3 = element is ElementKind.FP8_E4M3
    to_fp8 = device.f32_to_e4m3_bits if e4m3 else device.f32_to_e5m2_bits
    from_e4m3 = device.e4m3_bits_to_f32 if e4m3 else None
    nan_bits, sign_shift, sign_bit = np.uint64(0x7F), np.uint64(24), np.uint64(0x80)
    eight = np.uint64(8)

    @device_function
    def encode_hardware(x):
        f = np.float32(x)
        if f != f:
            return ((device.f32_to_bits(f) >> sign_shift) & sign_bit) | nan_bits
        return to_fp8(f)

    if e4m3:
        @device_function
        def decode_hardware(w):
            return M(from_e4m3(w))
    else:
        @device_function
        def decode_hardware(w):
            return M(device.f16_bits_to_f32((w & _BYTE) << eight))

    return decode_hardware, encode_hardware


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
    elif element.is_fp8:
        # FP8 through float32. Float64 math values are rounded to float32 first, as PyTorch's
        # conversion does (``Float8_e4m3fn(float)``); the scaled values are clamped to the finite
        # range before this, so that double rounding only touches ties below float32 precision.
        decode_fp8, encode_fp8 = _fp8_codec(element, M)
        return Codec(element, decode_fp8, encode_fp8, 8)
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
