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
    Integer arithmetic only: the simulator's model of ``cvt.rn.satfinite`` (the GPU runs the instruction).
    ``decode(fp8 bits)``: exact (every FP8 value is a float32), NaN -> quiet NaN, +-inf for E5M2; one
    float multiply, on the GPU and the simulator alike.
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

    # Decoding scales the FP8 magnitude bits, placed as float32 bits, by 2**(127 - bias): exact (a
    # power-of-two product into the normal range; the FP8 subnormals are float32 subnormals before
    # it), with no conversion instruction; the patterns past the largest finite one are put back.
    place = shift
    rescale = np.float32(2.0 ** (127 - fmt.exponent_bias))
    magnitude_mask = u64(0x7F)
    first_special = u64(0x7C) if has_inf else u64(0x7F)  # E5M2: 0x7C infinity, above it NaN

    @device_function
    def decode(w):
        magnitude = w & magnitude_mask
        value = device.f32_to_bits(device.bits_to_f32(magnitude << place) * rescale)
        if magnitude >= first_special:
            value = f32_inf if has_inf and magnitude == first_special else f32_nan
        return ((w & u64(0x80)) << sign_shift) | value

    return decode, encode


def _fp8_codec(element: ElementKind, M: type):
    """``(decode, encode, encode_pair)`` between FP8 bits and the math type ``M`` (``encode_pair(lo, hi)``: two
    values in 16 bits, ``lo`` in bits 0-7, the bits of two ``encode``; on the GPU one conversion for both: the
    FP8 quantize kernels are issue-bound, and an element costs one conversion instead of two).

    Encoding on the GPU is one conversion instruction (``cvt.rn.satfinite.{e4m3,e5m2}x2.f32``, sm_89+)
    with the NaN's sign put back (the instruction gives the canonical NaN, PyTorch keeps the sign);
    the simulator runs :func:`fp8_bits_codec`'s integer model of it. Both are held to PyTorch's
    ``x.to(float8)`` bit for bit (tests/test_fp8.py). Decoding on the GPU goes through the conversion
    unit as well (``cvt.rn.f16x2.e4m3x2``, E5M2 as a float16's top byte, then ``cvt.f32.f16``), on the
    simulator through :func:`fp8_bits_codec`'s exact rescale (integer and float work): the same bits, and on an
    H100 (bf16, 2^28 elements) fake quantize at 78% of copy by conversion against 57% by rescale, dequantize 79%
    against 73%. The GPU tests hold both to ml_dtypes' values.
    """
    fp8_decode, fp8_encode = fp8_bits_codec(element)

    if not SIMULATOR:
        if element is ElementKind.FP8_E4M3:
            @device_function
            def decode_fp8(w):
                return M(device.e4m3_bits_to_f32(w))
        else:
            @device_function
            def decode_fp8(w):
                return M(device.f16_bits_to_f32((w & _BYTE) << np.uint64(8)))  # E5M2 is a float16's top byte
    else:
        @device_function
        def decode_fp8(w):
            return M(device.bits_to_f32(fp8_decode(w)))

    if SIMULATOR:
        @device_function
        def encode_model(x):
            return fp8_encode(device.f32_to_bits(np.float32(x)))

        @device_function
        def encode_pair_model(lo, hi):
            return (encode_model(hi) << np.uint64(8)) | encode_model(lo)

        return decode_fp8, encode_model, encode_pair_model

    to_fp8 = device.f32_to_e4m3_bits if element is ElementKind.FP8_E4M3 else device.f32_to_e5m2_bits
    sign_shift, sign_bit = np.uint64(24), np.uint64(0x80)

    @device_function
    def encode_hardware(x):
        # The instruction keeps the sign of every non-NaN input; OR-ing it in again only changes its
        # canonical NaN (0x7F) into the NaN with the input's sign, without a branch.
        f = np.float32(x)
        return to_fp8(f) | ((device.f32_to_bits(f) >> sign_shift) & sign_bit)

    to_fp8x2 = device.f32x2_to_e4m3x2_bits if element is ElementKind.FP8_E4M3 else device.f32x2_to_e5m2x2_bits

    @device_function
    def encode_pair_hardware(lo, hi):
        return to_fp8x2(np.float32(hi), np.float32(lo))  # each NaN's sign put back as encode_hardware's

    return decode_fp8, encode_hardware, encode_pair_hardware


def math_type(precision: MathPrecision) -> type:
    """NumPy scalar type used as the cast to the math precision (works in kernels and on the host)."""
    return np.float64 if precision is MathPrecision.F64 else np.float32


@dataclass(frozen=True)
class Codec:
    """``decode(bits) -> math value`` and ``encode(math value) -> bits`` for one element kind;
    ``encode_pair(lo, hi) -> bits`` two values in one instruction (``lo`` in the low half), for the
    16-bit floats in float32 math and for FP8 (None otherwise)."""

    element: ElementKind
    decode: Any
    encode: Any
    lanes: int  # elements per uint64 word
    encode_pair: Any = None


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
        decode_fp8, encode_fp8, encode_fp8_pair = _fp8_codec(element, M)
        return Codec(element, decode_fp8, encode_fp8, 8, encode_fp8_pair)
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

    encode_pair = None
    if precision is MathPrecision.F32 and element in (ElementKind.BF16, ElementKind.F16):
        encode_pair = device.f32x2_to_bf16x2_bits if element is ElementKind.BF16 else device.f32x2_to_f16x2_bits
    return Codec(element, decode_float, encode_float, 8 // element.itemsize, encode_pair)
