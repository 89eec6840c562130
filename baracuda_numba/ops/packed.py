"""Packed 4-bit dispatch functions (``"int4"`` = S4, ``"uint4"`` = U4): per-group quantize,
dequantize, dynamic-range quantize. (Fake quantize per group onto a 4-bit grid, float to float, and its
straight-through backward are in :mod:`.fake`, imported here too.)

Packing: two values per byte along the last axis, the even-indexed value in the low nibble
(``byte = (v[2k] & 0xF) | (v[2k + 1] & 0xF) << 4``; S4 as 4-bit two's complement). A float tensor
``[..., D]`` packs to ``uint8 [..., D / 2]``. This is PyTorch's ``torch.quint4x2`` order and, read
as little-endian int32 words, GPTQ's sequential packing (value ``i`` in bits ``4i .. 4i + 3``);
AWQ's int32 words interleave the order (0, 2, 4, 6, 1, 3, 5, 7) and torchao's CPU ``uint4`` packer
puts the first value in the high nibble: repack for those.

Scales per group of ``group_size`` (even) consecutive elements along the last axis, float32
(float64 for float64 data), shape ``[..., D / group_size]``; zero points int32 of the same shape
for ``uint4`` (None: zeros) and none for ``int4`` (symmetric: pass None). ``D`` odd is an
:class:`InvalidProblem` naming ``x`` (or ``q``), an odd ``group_size`` one naming ``group_size``.

Checks of ``scales`` and ``zero_points`` as in :mod:`.per_axis` (:mod:`.checks`): scales finite and >= 0
(and invertible where > 0, except for dequantize), zero points in ``[q_min, q_max]`` (dequantize: the
4-bit range); host arrays always, device arrays with ``validate="device"`` (one host synchronization).
"""

from __future__ import annotations

from typing import Any

from ..arrays import allocate_like
from ..errors import InvalidProblem, problem_message
from ..plans.dynamic import DynamicRangeMode
from ..plans.packed import (
    DequantizePackedPerGroupPlan,
    DynamicRangePackedArgs,
    DynamicRangePackedDescriptor,
    DynamicRangePackedPlan,
    PackedArgs,
    PackedDequantizePerGroupDescriptor,
    PackedPerGroupDescriptor,
    QuantizePackedPerGroupPlan,
    outer_size,
    packed_shape,
)
from ..vocabulary import ElementKind
from .checks import check_validate
from .common import default_q_range, operand, output_operand, resolve_dtype, scale_operands, select_plan
from .fake import fake_quantize_per_group, fake_quantize_per_group_backward  # noqa: F401  (the fake family's)

__all__ = ["quantize_per_group_packed", "dequantize_per_group_packed", "dynamic_range_quantize_packed"]

_PACKED = (ElementKind.S4, ElementKind.U4)


def _packed_element(dtype: Any, where: str, argument: str = "dtype") -> ElementKind:
    element = resolve_dtype(dtype, where, argument)
    if element not in _PACKED:
        raise InvalidProblem(problem_message(where, argument, "'int4' or 'uint4'", element.short))
    return element


def _last_dim(shape: tuple[int, ...], where: str, argument: str) -> int:
    if not shape or shape[-1] % 2:
        raise InvalidProblem(problem_message(where, argument, "an even last dimension (two 4-bit values per byte)",
                                             f"shape {shape}"))
    return shape[-1]


def _groups(shape: tuple[int, ...], group_size: int) -> int:
    return outer_size(shape) * (shape[-1] // group_size) if group_size > 0 else 0


def _params(scales, zero_points, count, float_element, element, like, where, validate, reciprocal, q_range, stream):
    """Scales coerced; U4 zero points coerced (None: zeros); S4 zero points passed through for the plan;
    both checked as ``validate`` says."""
    check_validate(validate, where)
    checks = {"validate": validate, "reciprocal": reciprocal, "q_range": q_range, "stream": stream}
    if element is ElementKind.S4:
        scale, _ = scale_operands(scales, None, count, float_element, like, where, **checks)
        return scale, zero_points
    return scale_operands(scales, zero_points, count, float_element, like, where, **checks)


def quantize_per_group_packed(x: Any, scales: Any, zero_points: Any = None, group_size: int = 128, *,
                              dtype: Any = "int4", q_min: int | None = None, q_max: int | None = None,
                              out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``q = clamp(rint(x * (1/scales[.., g])) + zero_points[.., g], q_min, q_max)``, packed two per byte.

    Returns ``uint8 [..., D / 2]`` of ``x``'s kind; ``q_min, q_max`` default to [-8, 7] (int4) or
    [0, 15] (uint4). Checks: ``scales`` finite, >= 0 and invertible where > 0, ``zero_points`` in
    ``[q_min, q_max]`` (module docstring).
    """
    where = "quantize_per_group_packed"
    xo = operand(x, where, "x")
    element = _packed_element(dtype, where)
    d = _last_dim(xo.shape, where, "x")
    q_min, q_max = default_q_range(element, q_min, q_max)
    plan = select_plan(QuantizePackedPerGroupPlan, PackedPerGroupDescriptor(
        outer_size(xo.shape), d, group_size, q_min, q_max, xo.element, element))
    scale, zero_point = _params(scales, zero_points, _groups(xo.shape, group_size), xo.element, element, xo, where,
                                validate, True, (q_min, q_max), stream)
    result = output_operand(out, xo, packed_shape(xo.shape), ElementKind.U8, where)
    plan.run(PackedArgs(xo, scale, zero_point, result), stream=stream)
    return result.obj


def dequantize_per_group_packed(q: Any, scales: Any, zero_points: Any = None, group_size: int = 128, *,
                                q_dtype: Any = "int4", dtype: Any = "float32", out: Any = None,
                                stream: Any = None, validate: str = "host") -> Any:
    """``x = (q - zero_points[.., g]) * scales[.., g]`` from packed ``uint8 [..., D / 2]`` of ``q_dtype``
    (``"int4"`` / ``"uint4"``), in ``dtype``; returns ``[..., D]``. Checks: ``scales`` finite and >= 0,
    ``zero_points`` in the 4-bit range (module docstring)."""
    where = "dequantize_per_group_packed"
    qo = operand(q, where, "q")
    element = _packed_element(q_dtype, where, "q_dtype")
    if qo.element is not ElementKind.U8:
        raise InvalidProblem(problem_message(where, "q", "packed uint8 bytes", qo.element.short))
    if not qo.shape:
        raise InvalidProblem(problem_message(where, "q", "an array of rank >= 1", "a 0-d array"))
    float_element = resolve_dtype(dtype, where)
    shape = (*qo.shape[:-1], 2 * qo.shape[-1])
    plan = select_plan(DequantizePackedPerGroupPlan, PackedDequantizePerGroupDescriptor(
        outer_size(shape), shape[-1], group_size, float_element, element))
    scale, zero_point = _params(scales, zero_points, _groups(shape, group_size), float_element, element, qo, where,
                                validate, False, element.int_range, stream)
    result = output_operand(out, qo, shape, float_element, where)
    plan.run(PackedArgs(qo, scale, zero_point, result), stream=stream)
    return result.obj


def dynamic_range_quantize_packed(x: Any, *, group_size: int = 128, dtype: Any = "int4", mode: Any = None,
                                  q_min: int | None = None, q_max: int | None = None, out: Any = None,
                                  stream: Any = None):
    """Per-group dynamic range into packed 4-bit: ``Quantized(q uint8 [..., D/2], scale, zero_point)``.

    int4: symmetric, ``scale = max|x| / 7`` over the group's finite values (range [-7, 7] by
    default, so that -x quantizes to -q); uint4: asymmetric by default (torchao's ASYMMETRIC rule,
    ``scale = (max(x, 0) - min(x, 0)) / 15``, int32 zero points). Same scales, zero points and
    values as :func:`dynamic_range_quantize` with ``dtype="int8"`` / ``"uint8"`` and the 4-bit range.
    """
    from .dynamic import Quantized

    where = "dynamic_range_quantize_packed"
    xo = operand(x, where, "x")
    element = _packed_element(dtype, where)
    d = _last_dim(xo.shape, where, "x")
    mode_ = DynamicRangeMode(mode) if mode is not None else (
        DynamicRangeMode.SYMMETRIC if element is ElementKind.S4 else DynamicRangeMode.ASYMMETRIC)
    low, high = element.int_range
    if mode_ is DynamicRangeMode.SYMMETRIC and low < 0:
        low = -high
    q_min = low if q_min is None else q_min
    q_max = high if q_max is None else q_max
    plan = select_plan(DynamicRangePackedPlan, DynamicRangePackedDescriptor(
        outer_size(xo.shape), d, group_size, mode_, q_min, q_max, xo.element, element))
    q = output_operand(out, xo, packed_shape(xo.shape), ElementKind.U8, where)
    scale_shape = (*xo.shape[:-1], d // group_size)
    scale = allocate_like(xo, scale_shape, ElementKind.F64 if xo.element is ElementKind.F64 else ElementKind.F32)
    symmetric = mode_ is DynamicRangeMode.SYMMETRIC
    zero_point = None if symmetric else allocate_like(xo, scale_shape, ElementKind.I32)
    plan.run(DynamicRangePackedArgs(xo, q, scale, zero_point), stream=stream)
    zp = None if symmetric and q_min < 0 else ((q_min + q_max + 1) // 2 if symmetric else zero_point.obj)
    return Quantized(q.obj, scale.obj, zp)
