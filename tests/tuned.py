"""The memory-bound plans run under a given card's tuning value, NumPy in and NumPy out, for the tests that hold
every card's kernels to the reference on whatever device runs them (``plans/tuning.py``: each card's value as
this platform launches it, :func:`~baracuda_numba.plans.tuning.launchable`).

:data:`CARDS` parametrizes a test over the registered cards' values, one per distinct value: a card whose values
equal another's but for its name compiles the same kernels, and runs once.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import baracuda_numba as bn
from baracuda_numba.plans.tuning import TUNINGS, MemoryTuning, launchable


def _distinct() -> list[tuple[str, MemoryTuning]]:
    found: dict[MemoryTuning, tuple[str, MemoryTuning]] = {}
    for card, tuning in TUNINGS.items():
        found.setdefault(replace(tuning, card=""), (card, launchable(tuning)))
    return list(found.values())


CARDS = [pytest.param(tuning, id=card) for card, tuning in _distinct()]
STEMS = {"channel": "PerChannel", "token": "PerToken", "group": "PerGroup"}


def planned(plan_type: type, desc: Any, tuning: MemoryTuning, args: Any) -> Any:
    """``plan_type`` selected for ``desc`` under ``tuning``, run on ``args``; the plan."""
    plan = plan_type.select(desc, tuning=tuning)
    plan.run(args)
    return plan


def _fields(family: str, shape: tuple[int, ...], axis: int | None, group_size: int | None) -> tuple:
    return {"channel": lambda: (tuple(shape), axis), "token": lambda: (math.prod(shape[:-1]), shape[-1]),
            "group": lambda: (math.prod(shape[:-1]), shape[-1], group_size)}[family]()


def _element(dtype: Any) -> bn.ElementKind:
    return bn.element_kind(dtype)


def per_axis(op: str, family: str, tuning: MemoryTuning, *, x=None, q=None, dy=None, scales, zero_points=None,
             axis: int | None = None, group_size: int | None = None, dtype: Any = None, out: str = "s8",
             q_range: tuple[int, int] | None = None) -> np.ndarray:
    """``quantize`` / ``dequantize`` / ``quantize_backward`` / ``dequantize_backward`` per channel, token or group
    through its plan under ``tuning`` (as ``bn.<op>_per_<family>`` computes it)."""
    stem, fields = STEMS[family], _fields(family, (x if x is not None else q if q is not None else dy).shape, axis,
                                              group_size)
    out_element = bn.element_kind(out)
    low, high = q_range or out_element.q_range
    if zero_points is None and not out_element.is_fp8 and op != "dequantize_backward":
        zero_points = np.zeros(scales.size, np.int32)
    if op == "quantize":
        result = np.empty(x.shape, out_element.numpy_dtype)
        args = getattr(bn, f"Quantize{stem}Args")(x, scales, zero_points, result)
        desc = getattr(bn, f"Quantize{stem}Descriptor")(*fields, low, high, _element(x.dtype), out_element)
        planned(getattr(bn, f"Quantize{stem}Plan"), desc, tuning, args)
    elif op == "dequantize":
        element = bn.element_kind(dtype)
        result = np.empty(q.shape, element.numpy_dtype)
        args = getattr(bn, f"Dequantize{stem}Args")(q, scales, zero_points, result)
        desc = getattr(bn, f"Dequantize{stem}Descriptor")(*fields, element, _element(q.dtype))
        planned(getattr(bn, f"Dequantize{stem}Plan"), desc, tuning, args)
    elif op == "quantize_backward":
        result = np.empty_like(dy)
        args = getattr(bn, f"Quantize{stem}BackwardArgs")(x, scales, zero_points, dy, result)
        desc = getattr(bn, f"Quantize{stem}BackwardDescriptor")(*fields, low, high, _element(x.dtype), out_element)
        planned(getattr(bn, f"Quantize{stem}BackwardPlan"), desc, tuning, args)
    else:
        result = np.empty_like(dy)
        args = getattr(bn, f"Dequantize{stem}BackwardArgs")(scales, dy, result)
        desc = getattr(bn, f"Dequantize{stem}BackwardDescriptor")(*fields, _element(dy.dtype), out_element)
        planned(getattr(bn, f"Dequantize{stem}BackwardPlan"), desc, tuning, args)
    return result


def fake_per_axis(family: str, backward: bool, tuning: MemoryTuning, x: np.ndarray, scales, zero_points, *,
                  dy=None, axis: int | None = None, group_size: int | None = None, grid: str = "s8",
                  q_range: tuple[int, int] = (-128, 127)) -> np.ndarray:
    """Fake quantize (``backward``: its straight-through gradient) per channel, token or group on an int8 /
    uint8 grid through its plan under ``tuning``."""
    stem = STEMS[family] + ("Backward" if backward else "")
    desc = getattr(bn, f"FakeQuantize{stem}Descriptor")(*_fields(family, x.shape, axis, group_size), *q_range,
                                                         _element(x.dtype), bn.element_kind(grid))
    result = np.empty_like(x)
    args_type = getattr(bn, f"FakeQuantize{stem}Args")
    args = args_type(x, scales, zero_points, dy, result) if backward else args_type(x, scales, zero_points, result)
    planned(getattr(bn, f"FakeQuantize{stem}Plan"), desc, tuning, args)
    return result


def dynamic(tuning: MemoryTuning, x: np.ndarray, mode: str = "symmetric", scope: str = "token",
            axis: int | None = None, group_size: int | None = None, out: str = "s8",
            q_range: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``dynamic_range_quantize`` through its plan under ``tuning``: ``(q, scale, zero_point)``, the scales and
    zero points in the plan's scale shape (the zero points written in either mode, none for FP8)."""
    from baracuda_numba.plans.dynamic import DynamicRangeMode, DynamicRangeScope, default_dynamic_q_range

    element = bn.element_kind(out)
    mode_ = DynamicRangeMode(mode)
    scope_ = {"token": DynamicRangeScope.token, "tensor": DynamicRangeScope.tensor,
              "channel": lambda: DynamicRangeScope.channel(axis),
              "group": lambda: DynamicRangeScope.group(group_size)}[scope]()
    low, high = q_range or default_dynamic_q_range(mode_, element)
    plan = bn.DynamicRangeQuantizePlan.select(bn.DynamicRangeQuantizeDescriptor(
        x.shape, mode_, scope_, low, high, _element(x.dtype), element), tuning=tuning)
    q = np.empty(x.shape, element.numpy_dtype)
    scale = np.empty(plan.scale_count(), np.float64 if x.dtype == np.float64 else np.float32)
    zero_point = np.empty(plan.scale_count(), np.int32)
    plan.run(bn.DynamicRangeQuantizeArgs(x, q, scale, None if element.is_fp8 else zero_point))
    shape = plan.scale_shape()
    return q, scale.reshape(shape), None if element.is_fp8 else zero_point.reshape(shape)


def packed_quantize(tuning: MemoryTuning, x: np.ndarray, scales, zero_points, group_size: int,
                    element: bn.ElementKind) -> np.ndarray:
    """``quantize_per_group_packed`` (S4 / U4, the element's full range) through its plan under ``tuning``."""
    outer, axis_size = math.prod(x.shape[:-1]), x.shape[-1]
    packed = np.empty((*x.shape[:-1], axis_size // 2), np.uint8)
    low, high = element.int_range
    planned(bn.QuantizePackedPerGroupPlan, bn.PackedPerGroupDescriptor(outer, axis_size, group_size, low, high,
                                                                       _element(x.dtype), element), tuning,
            bn.PackedArgs(x, scales, zero_points, packed))
    return packed


def packed_dequantize(tuning: MemoryTuning, packed: np.ndarray, scales, zero_points, group_size: int,
                      element: bn.ElementKind, dtype: Any) -> np.ndarray:
    """``dequantize_per_group_packed`` through its plan under ``tuning``."""
    outer, axis_size = math.prod(packed.shape[:-1]), 2 * packed.shape[-1]
    out_element = bn.element_kind(dtype)
    x = np.empty((*packed.shape[:-1], axis_size), out_element.numpy_dtype)
    planned(bn.DequantizePackedPerGroupPlan, bn.PackedDequantizePerGroupDescriptor(outer, axis_size, group_size,
                                                                                   out_element, element), tuning,
            bn.PackedArgs(packed, scales, zero_points, x))
    return x


def packed_dynamic(tuning: MemoryTuning, x: np.ndarray, group_size: int, element: bn.ElementKind, mode: str,
                   q_range: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``dynamic_range_quantize_packed`` through its plan under ``tuning``: ``(packed, scale, zero_point)`` (no
    zero points in symmetric mode)."""
    from baracuda_numba.plans.dynamic import DynamicRangeMode

    outer, axis_size = math.prod(x.shape[:-1]), x.shape[-1]
    packed = np.empty((*x.shape[:-1], axis_size // 2), np.uint8)
    groups = (outer, axis_size // group_size)
    scale = np.empty(groups, np.float64 if x.dtype == np.float64 else np.float32)
    zero_point = np.empty(groups, np.int32) if mode == "asymmetric" else None
    planned(bn.DynamicRangePackedPlan, bn.DynamicRangePackedDescriptor(outer, axis_size, group_size,
                                                                       DynamicRangeMode(mode), *q_range,
                                                                       _element(x.dtype), element), tuning,
            bn.DynamicRangePackedArgs(x, packed, scale, zero_point))
    return packed, scale, zero_point
