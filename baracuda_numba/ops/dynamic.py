"""``dynamic_range_quantize``: quantize with scales computed from the data, in one call."""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

from ..arrays import allocate_like
from ..errors import InvalidProblem, problem_message
from ..launch import torch_current_stream
from ..plans.dynamic import (
    ZERO_POINT_ARRAY,
    DynamicRangeMode,
    DynamicRangeQuantizeArgs,
    DynamicRangeQuantizeDescriptor,
    DynamicRangeQuantizePlan,
    DynamicRangeScope,
    default_dynamic_q_range,
    symmetric_zero_point,
)
from ..vocabulary import ElementKind
from .common import fast_key, operand, output_operand, remember_fast, remembered, resolve_dtype, select_plan

__all__ = ["Quantized", "dynamic_range_quantize"]


class Quantized(NamedTuple):
    """A quantized array with the parameters that dequantize it."""

    q: Any
    scale: Any
    zero_point: Any  # int32 array; None in symmetric mode (0), or an int (uint8 symmetric: mid-range)


_SCOPES = {"tensor": DynamicRangeScope.tensor, "token": DynamicRangeScope.token}


def _scope(scope: Any, axis: Any, group_size: Any, where: str) -> DynamicRangeScope:
    if isinstance(scope, DynamicRangeScope):
        return scope
    name = str(scope).lower()
    if name in _SCOPES:
        return _SCOPES[name]()
    if name == "channel":
        if axis is None:
            raise InvalidProblem(problem_message(where, "axis", "an integer for scope='channel'", None))
        return DynamicRangeScope.channel(axis)
    if name == "group":
        if group_size is None:
            raise InvalidProblem(problem_message(where, "group_size", "an integer for scope='group'", None))
        return DynamicRangeScope.group(group_size)
    raise InvalidProblem(problem_message(where, "scope", "one of 'tensor', 'channel', 'token', 'group'", repr(scope)))


def _mode(mode: Any, where: str) -> DynamicRangeMode:
    if isinstance(mode, DynamicRangeMode):
        return mode
    try:
        return DynamicRangeMode(str(mode).lower())
    except ValueError:
        raise InvalidProblem(problem_message(where, "mode", "'symmetric' or 'asymmetric'", repr(mode))) from None


def dynamic_range_quantize(x: Any, *, mode: Any = "symmetric", scope: Any = "token", dtype: Any = "int8",
                           axis: int | None = None, group_size: int | None = None, q_min: int | None = None,
                           q_max: int | None = None, out: Any = None, stream: Any = None) -> Quantized:
    """Quantize ``x`` with scales (and zero points) computed from its own range, in one call.

    Symmetric: ``scale = max|x| / (q_max - zp)`` with ``zp = 0`` for a signed range (default int8
    range [-127, 127]) or the mid-range point for an unsigned one (128 for uint8); asymmetric
    (torchao ASYMMETRIC): ``scale = (max(max x, 0) - min(min x, 0)) / (q_max - q_min)``,
    ``zp = clamp(q_min - round(min(min x, 0) / scale))``. An all-zero segment gets scale 1; a scale
    below the smallest normal float is raised to it. The range ignores NaN and +-inf, which then
    quantize as usual (+-inf saturate, NaN -> the zero point). Scales are float32 (float64 for
    float64 input).

    ``scope``: ``"tensor"``, ``"channel"`` (with ``axis``), ``"token"`` (rows over the last axis) or
    ``"group"`` (``group_size`` consecutive elements along the last axis).

    Returns ``Quantized(q, scale, zero_point)``; ``q`` equals what ``quantize_per_token`` /
    ``_per_channel`` / ``_per_group`` / ``_per_tensor`` give for the returned scales and zero points.
    """
    where = "dynamic_range_quantize"
    key = None
    if out is None and stream is None:  # a repeat call on a plain CUDA torch tensor: the remembered plan
        key = fast_key(where, (x,), mode, scope, dtype, axis, group_size, q_min, q_max)
        found = remembered(key)
        if found is not None:
            result = _run_remembered(*found, x)
            if result is not None:
                return result
    xo = operand(x, where, "x")
    element = resolve_dtype(dtype, where)
    mode_ = _mode(mode, where)
    low, high = default_dynamic_q_range(mode_, element)
    q_min = low if q_min is None else q_min
    q_max = high if q_max is None else q_max
    desc = DynamicRangeQuantizeDescriptor(xo.shape, mode_, _scope(scope, axis, group_size, where), q_min, q_max,
                                          xo.element, element)
    plan = select_plan(DynamicRangeQuantizePlan, desc)
    q = output_operand(out, xo, xo.shape, element, where)
    scale_element = ElementKind.F64 if xo.element is ElementKind.F64 else ElementKind.F32
    scale = allocate_like(xo, plan.scale_shape(), scale_element)
    symmetric = mode_ is DynamicRangeMode.SYMMETRIC
    zero_point = None if symmetric else allocate_like(xo, plan.scale_shape(), ElementKind.I32)
    plan.run(DynamicRangeQuantizeArgs(xo, q, scale, zero_point), stream=stream)
    if key is not None and plan.fast_alignment() is not None:
        remember_fast(key, plan, q.obj)
    if symmetric:
        zp = symmetric_zero_point(q_min, q_max)
        return Quantized(q.obj, scale.obj, None if zp == 0 else zp)
    return Quantized(q.obj, scale.obj, zero_point.obj)


def _run_remembered(plan: DynamicRangeQuantizePlan, q_dtype: Any, device: Any, index: int,
                    x: Any) -> Quantized | None:
    """The remembered plan's pre-packed launch on new torch outputs (None when ``x`` is not aligned
    for it: the full path decides). ``fast_key`` checked ``x``'s type, dtype, shape and device."""
    alignment, scale_shape, scale_dtype, zero_point_value = plan.fast_outputs()
    x_ptr = x.data_ptr()
    if alignment is None or x_ptr % alignment:
        return None
    torch = sys.modules["torch"]
    q = torch.empty_like(x, dtype=q_dtype)  # contiguous, on `device` (the key says so)
    scale = torch.empty(scale_shape, dtype=scale_dtype, device=device)
    if zero_point_value is ZERO_POINT_ARRAY:
        zero_point = torch.empty(scale_shape, dtype=torch.int32, device=device)
        zp_ptr = zero_point.data_ptr()
    else:  # symmetric: the constant zero point is returned, the kernel writes it to the plan's scratch
        zero_point = zero_point_value
        zp_ptr = plan.zero_point_scratch(device).data_ptr()
    plan.launch_segments_fast(x_ptr, q.data_ptr(), scale.data_ptr(), zp_ptr, torch_current_stream(index), index)
    return Quantized(q, scale, zero_point)
