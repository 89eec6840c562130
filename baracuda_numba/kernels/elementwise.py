"""The elementwise quantize family: one kernel definition for every quantize / dequantize /
fake-quantize / backward op, every dtype pair and every scale granularity.

Math (SPEC section 5), with ``inv = 1 / scale`` in the math precision (0 where ``scale == 0``) and
``t = rint(x * inv) + zero_point`` (round half to even):

- ``quantize``:              ``q = clamp(t, q_min, q_max)``, NaN -> ``clamp(zero_point)``
- ``dequantize``:            ``x = (q - zero_point) * scale``
- ``fake_quantize``:         ``y = (clamp(t, q_min, q_max) - zero_point) * scale`` (NaN propagates)
- ``quantize_backward``:     ``dx = dy * inv * mask``
- ``fake_quantize_backward``: ``dx = dy * mask``
- ``dequantize_backward``:   ``dq = dy * scale``

with ``mask = q_min <= t <= q_max`` (false for NaN, and false where ``scale == 0``).

Layout: operands are flat and C-contiguous. Each thread handles packs of ``PACK`` consecutive
elements, moving them as ``uint64`` words (a pack of s8 is one word, of f32 four), in a grid-stride
loop; the ``n % PACK`` tail, or everything when an operand is not 8-byte aligned, goes through the
element path. Scales are a scalar (per tensor) or arrays indexed by a segment: ``i // seg_len``
(per token / per group) or ``(i // seg_len) % channels`` (per channel).
"""

from __future__ import annotations

import enum
import functools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import cuda

from ..vocabulary import ElementKind, MathPrecision
from . import device
from .codecs import codec, math_type

__all__ = ["PACK", "ElementwiseOp", "ScaleMode", "ElementwiseKernel", "elementwise_kernel"]

PACK = 8


class ElementwiseOp(enum.Enum):
    """What an elementwise kernel computes; the value is its arity (number of array inputs)."""

    QUANTIZE = "quantize"
    DEQUANTIZE = "dequantize"
    FAKE_QUANTIZE = "fake_quantize"
    QUANTIZE_BACKWARD = "quantize_backward"
    FAKE_QUANTIZE_BACKWARD = "fake_quantize_backward"
    DEQUANTIZE_BACKWARD = "dequantize_backward"

    @property
    def reads_saved_input(self) -> bool:
        """Backward ops that recompute the mask read the forward input next to ``d_output``."""
        return self in (ElementwiseOp.QUANTIZE_BACKWARD, ElementwiseOp.FAKE_QUANTIZE_BACKWARD)


class ScaleMode(enum.Enum):
    SCALAR = "scalar"
    ROWS = "rows"  # segment = i // seg_len
    CHANNELS = "channels"  # segment = (i // seg_len) % channels


@functools.cache
def _op_functions(precision: MathPrecision) -> dict[ElementwiseOp, Any]:
    """The per-element math of every op, as device functions in one math precision."""
    M = math_type(precision)
    one, zero = M(1.0), M(0.0)
    rint = device.rint

    @cuda.jit(device=True, inline="always")
    def quantize(x, _unused, inv, scale, zp, q_min, q_max):
        t = rint(x * inv) + zp
        if t != t:
            t = zp
        if t < q_min:
            t = q_min
        if t > q_max:
            t = q_max
        return t

    @cuda.jit(device=True, inline="always")
    def dequantize(q, _unused, inv, scale, zp, q_min, q_max):
        return (q - zp) * scale

    @cuda.jit(device=True, inline="always")
    def fake_quantize(x, _unused, inv, scale, zp, q_min, q_max):
        t = rint(x * inv) + zp
        if t < q_min:
            t = q_min
        if t > q_max:
            t = q_max
        return (t - zp) * scale

    @cuda.jit(device=True, inline="always")
    def mask(x, inv, zp, q_min, q_max):
        t = rint(x * inv) + zp
        return one if (q_min <= t and t <= q_max and inv != zero) else zero

    @cuda.jit(device=True, inline="always")
    def quantize_backward(dy, x, inv, scale, zp, q_min, q_max):
        return dy * inv * mask(x, inv, zp, q_min, q_max)

    @cuda.jit(device=True, inline="always")
    def fake_quantize_backward(dy, x, inv, scale, zp, q_min, q_max):
        return dy * mask(x, inv, zp, q_min, q_max)

    @cuda.jit(device=True, inline="always")
    def dequantize_backward(dy, _unused, inv, scale, zp, q_min, q_max):
        return dy * scale

    return {
        ElementwiseOp.QUANTIZE: quantize,
        ElementwiseOp.DEQUANTIZE: dequantize,
        ElementwiseOp.FAKE_QUANTIZE: fake_quantize,
        ElementwiseOp.QUANTIZE_BACKWARD: quantize_backward,
        ElementwiseOp.FAKE_QUANTIZE_BACKWARD: fake_quantize_backward,
        ElementwiseOp.DEQUANTIZE_BACKWARD: dequantize_backward,
    }


@dataclass(frozen=True)
class ElementwiseKernel:
    """An elementwise kernel specialised for one key, and what a launcher must know about it.

    Argument order: ``a_words, a_elems, b_words, b_elems, out_words, out_elems, scales, zero_points,
    n, npacks, seg_len, channels, inv, scale, zero_point, q_min, q_max``.
    """

    py_func: Any
    signature: str
    a: ElementKind
    b: ElementKind | None
    out: ElementKind
    precision: MathPrecision
    _compiled: dict = field(default_factory=dict, compare=False, repr=False)

    def compiled(self) -> Any:
        """The ``numba.cuda`` dispatcher, compiled for ``signature`` on first use."""
        dispatcher = self._compiled.get("dispatcher")
        if dispatcher is None:
            with _COMPILE_LOCK:
                dispatcher = self._compiled.get("dispatcher")
                if dispatcher is None:
                    dispatcher = cuda.jit(self.signature)(self.py_func)
                    self._compiled["dispatcher"] = dispatcher
        return dispatcher


_COMPILE_LOCK = threading.RLock()


def _uint(itemsize: int) -> str:
    return f"uint{8 * itemsize}"


@functools.cache
def elementwise_kernel(
    op: ElementwiseOp,
    a: ElementKind,
    b: ElementKind | None,
    out: ElementKind,
    precision: MathPrecision,
    mode: ScaleMode = ScaleMode.SCALAR,
    uniform_pack: bool = True,
) -> ElementwiseKernel:
    """Compile (once per key) the kernel for ``op`` reading ``a`` (and ``b``), writing ``out``.

    ``uniform_pack`` says every pack of ``PACK`` elements lies in one scale segment
    (``seg_len % PACK == 0``), so scales are read once per pack.
    """
    M = math_type(precision)
    compute = _op_functions(precision)[op]
    a_codec, out_codec = codec(a, precision), codec(out, precision)
    b_codec = codec(b, precision) if b is not None else a_codec
    has_b = b is not None
    a_lanes, b_lanes, o_lanes = a_codec.lanes, b_codec.lanes, out_codec.lanes
    a_words, b_words, o_words = PACK // a_lanes, PACK // b_lanes, PACK // o_lanes
    a_bits, b_bits, o_bits = 64 // a_lanes, 64 // b_lanes, 64 // o_lanes
    a_decode, b_decode, o_encode = a_codec.decode, b_codec.decode, out_codec.encode
    scalar = mode is ScaleMode.SCALAR
    channels_mode = mode is ScaleMode.CHANNELS
    per_element_params = not scalar and not uniform_pack
    one, zero = M(1.0), M(0.0)
    word_zero = np.uint64(0)
    u64 = np.uint64

    @cuda.jit(device=True, inline="always")
    def segment_params(scales, zero_points, s):
        sc = scales[s]
        inv = one / sc if sc != zero else zero
        return inv, sc, M(zero_points[s])

    @cuda.jit(device=True, inline="always")
    def segment_of(i, seg_len, channels):
        s = i // seg_len
        pos = i - s * seg_len
        if channels_mode:
            s = s % channels
        return s, pos

    def kernel(aw, ae, bw, be, ow, oe, scales, zero_points, n, npacks, seg_len, channels,
               inv0, scale0, zp0, q_min, q_max):
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        abuf = cuda.local.array(a_words, np.uint64)
        bbuf = cuda.local.array(b_words, np.uint64)
        obuf = cuda.local.array(o_words, np.uint64)
        inv, sc, zp = inv0, scale0, zp0
        for p in range(start, npacks, stride):
            for k in range(a_words):
                abuf[k] = aw[p * a_words + k]
            if has_b:
                for k in range(b_words):
                    bbuf[k] = bw[p * b_words + k]
            for k in range(o_words):
                obuf[k] = word_zero
            s, pos = 0, 0
            if not scalar:
                s, pos = segment_of(p * PACK, seg_len, channels)
                inv, sc, zp = segment_params(scales, zero_points, s)
            for j in range(PACK):
                if per_element_params and j > 0:
                    pos += 1
                    if pos == seg_len:
                        pos = 0
                        s += 1
                        if channels_mode and s == channels:
                            s = 0
                    inv, sc, zp = segment_params(scales, zero_points, s)
                x = a_decode(abuf[j // a_lanes] >> u64(a_bits * (j % a_lanes)))
                y = zero
                if has_b:
                    y = b_decode(bbuf[j // b_lanes] >> u64(b_bits * (j % b_lanes)))
                r = compute(x, y, inv, sc, zp, q_min, q_max)
                obuf[j // o_lanes] |= o_encode(r) << u64(o_bits * (j % o_lanes))
            for k in range(o_words):
                ow[p * o_words + k] = obuf[k]
        for i in range(npacks * PACK + start, n, stride):
            if not scalar:
                s, pos = segment_of(i, seg_len, channels)
                inv, sc, zp = segment_params(scales, zero_points, s)
            x = a_decode(u64(ae[i]))
            y = zero
            if has_b:
                y = b_decode(u64(be[i]))
            oe[i] = o_encode(compute(x, y, inv, sc, zp, q_min, q_max))

    m = "float64" if precision is MathPrecision.F64 else "float32"
    b_elem = _uint((b or a).itemsize)
    signature = (
        f"void(uint64[::1], {_uint(a.itemsize)}[::1], uint64[::1], {b_elem}[::1], "
        f"uint64[::1], {_uint(out.itemsize)}[::1], {m}[::1], int32[::1], "
        f"int64, int64, int64, int64, {m}, {m}, {m}, {m}, {m})"
    )
    kernel.__name__ = f"{op.value}_{a.short}_{(b or a).short}_{out.short}_{mode.value}"
    kernel.__qualname__ = kernel.__name__
    return ElementwiseKernel(kernel, signature, a, b, out, precision)
