"""Per-channel, per-token and per-group dispatch functions.

Same math as the per-tensor functions (:mod:`baracuda_numba.ops.per_tensor`) with one ``(scale, zero_point)`` pair per
segment: the channel ``x[..., c, ...]`` (``scales[shape[axis]]``), the token row ``x[t, :]`` (``x`` of
any rank, rows over the leading dimensions, ``scales`` one per row) or the group
``x[..., g*group_size:(g+1)*group_size]`` along the last axis (``scales[..., shape[-1] // group_size]``).

``scales`` are used in the math precision (float32; float64 for float64 data) and ``zero_points`` as
int32, converted by their own framework when given otherwise; ``zero_points=None`` means zeros. An
element scale of 0 quantizes its segment to ``clamp(zero_point)`` with zero gradient. The result has
the kind of the input.

FP8 dtypes (``"float8_e4m3fn"``, ``"float8_e5m2"``): ``q = fp8_rne(clamp(x * (1/scales[s]), -max, max))``,
no zero points (pass None), NaN kept, a zero scale gives 0; the STE mask is ``-max <= x / scale <= max``.
``dtype="int4"`` / ``"uint4"`` in :func:`quantize_per_group` packs two values per byte (see
:mod:`.packed`).

Checks of ``scales`` and ``zero_points`` (:mod:`.checks`; :class:`InvalidProblem` naming the function,
the argument, the first bad index and its value): every scale finite and >= 0, and where > 0 with a
finite reciprocal in the math precision for the ops that multiply by it (quantize and its backward);
given zero points in ``[q_min, q_max]`` (dequantize: the range of ``q``'s dtype). ``validate="host"``
(default) checks arrays whose bytes are on the host (NumPy, CPU tensors) and passes device arrays
unchecked, so that a call never waits for the GPU; ``validate="device"`` checks device arrays too, with a
reduction kernel on the call's stream and one host synchronization.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from ..errors import InvalidProblem, problem_message
from ..plans import per_axis as p
from ..vocabulary import ElementKind
from .checks import check_validate
from .common import (
    default_q_range,
    fast_key,
    operand,
    output_operand,
    remember_fast,
    remembered,
    resolve_dtype,
    scale_operands,
    select_plan,
)

__all__ = [
    "quantize_per_channel", "dequantize_per_channel", "quantize_per_channel_backward",
    "dequantize_per_channel_backward",
    "quantize_per_token", "dequantize_per_token", "quantize_per_token_backward", "dequantize_per_token_backward",
    "quantize_per_group", "dequantize_per_group", "quantize_per_group_backward", "dequantize_per_group_backward",
]


def _token_shape(shape: tuple[int, ...], where: str) -> tuple[int, int]:
    if not shape:
        raise InvalidProblem(problem_message(where, "x", "an array of rank >= 1", "a 0-d array"))
    return math.prod(shape[:-1]), shape[-1]


def _family_fields(family: str, shape: tuple[int, ...], where: str, axis: Any, group_size: Any) -> tuple:
    """The descriptor's leading shape fields for ``family``."""
    if family == "channel":
        return (shape, axis)
    n, d = _token_shape(shape, where)
    return (n, d) if family == "token" else (n, d, group_size)


_PLANS = {
    (family, op): (getattr(p, f"{prefix}Per{family.capitalize()}{suffix}Plan"),
                   getattr(p, f"{prefix}Per{family.capitalize()}{suffix}Descriptor"),
                   getattr(p, f"{prefix}Per{family.capitalize()}{suffix}Args"))
    for family in ("channel", "token", "group")
    for op, (prefix, suffix) in {"quantize": ("Quantize", ""), "quantize_backward": ("Quantize", "Backward"),
                                 "dequantize": ("Dequantize", ""),
                                 "dequantize_backward": ("Dequantize", "Backward")}.items()
}


def _quantize(family, op, where, x, scales, zero_points, axis, group_size, dtype, q_min, q_max, grad_output,
              out, stream, validate):
    """quantize (``grad_output`` None) or its backward, for one family."""
    plan_type, descriptor, args_type = _PLANS[(family, op)]
    key = None
    if grad_output is None and out is None and check_validate(validate, where) == "host":
        key = fast_key(where, _given(x, scales, zero_points), axis, group_size, dtype, q_min, q_max)
        fast = _run_remembered(key, x, zero_points, lambda zps, result: args_type(x, scales, zps, result), stream)
        if fast is not None:
            return fast
    xo = operand(x, where, "x")
    element = resolve_dtype(dtype, where)
    if element in (ElementKind.S4, ElementKind.U4) and family == "group" and op == "quantize":
        from .packed import quantize_per_group_packed  # int4 / uint4: packed two per byte

        return quantize_per_group_packed(xo, scales, zero_points, group_size, dtype=element, q_min=q_min,
                                         q_max=q_max, out=out, stream=stream, validate=validate)
    q_min, q_max = default_q_range(element, q_min, q_max)
    fields = _family_fields(family, xo.shape, where, axis, group_size)
    plan = select_plan(plan_type, descriptor(*fields, q_min, q_max, xo.element, element))
    scale, zero_point = scale_operands(scales, zero_points, plan._segment_count(), xo.element, xo, where, element,
                                       validate=validate, q_range=(q_min, q_max), stream=stream)
    if grad_output is None:
        result = output_operand(out, xo, xo.shape, element, where)
        plan.run(args_type(xo, scale, zero_point, result), stream=stream)
        if _used_as_given(scale, zero_point, scales, zero_points):
            remember_fast(key, plan, result.obj)
    else:
        go = operand(grad_output, where, "grad_output")
        result = output_operand(out, xo, xo.shape, xo.element, where)
        plan.run(args_type(xo, scale, zero_point, go, result), stream=stream)
    return result.obj


def _used_as_given(scale, zero_point, scales, zero_points) -> bool:
    """The plan read the caller's arrays themselves, not converted copies (FP8 reads no zero points;
    ``zero_points=None`` reads zeros): only then may a repeat call replay the remembered plan on the
    caller's arrays."""
    return scale.obj is scales and (zero_points is None or zero_point.obj is zero_points)


def _given(like: Any, scales: Any, zero_points: Any) -> tuple:
    """The arrays of a call that its memo key covers (``zero_points=None`` adds none: the key holds
    one array fewer, so it differs from any call that passes them)."""
    return (like, scales) if zero_points is None else (like, scales, zero_points)


def _run_remembered(key: tuple | None, like: Any, zero_points: Any, make_args: Any, stream: Any) -> Any:
    """A new tensor shaped like ``like`` written by the plan remembered under ``key`` with
    ``make_args(zero_points, result)`` (``zero_points=None``: the plan's zeros), or None when none is."""
    found = remembered(key)
    if found is None:
        return None
    plan, dtype, device, index = found
    if zero_points is None:
        zero_points = plan.default_zero_points(device)
    result = sys.modules["torch"].empty_like(like, dtype=dtype)  # contiguous, on `device` (the key says so)
    args = make_args(zero_points, result)
    if stream is not None or not plan.run_trusted(args, index):
        plan.run(args, stream=stream)
    return result


def _dequantize(family, where, q, scales, zero_points, axis, group_size, dtype, out, stream, validate):
    plan_type, descriptor, args_type = _PLANS[(family, "dequantize")]
    fast = out is None and check_validate(validate, where) == "host"
    key = fast_key(where, _given(q, scales, zero_points), axis, group_size, dtype) if fast else None
    fast = _run_remembered(key, q, zero_points, lambda zps, result: args_type(q, scales, zps, result), stream)
    if fast is not None:
        return fast
    qo = operand(q, where, "q")
    element = resolve_dtype(dtype, where)
    fields = _family_fields(family, qo.shape, where, axis, group_size)
    plan = select_plan(plan_type, descriptor(*fields, element, qo.element))
    scale, zero_point = scale_operands(scales, zero_points, plan._segment_count(), element, qo, where, qo.element,
                                       validate=validate, reciprocal=False, stream=stream)
    result = output_operand(out, qo, qo.shape, element, where)
    plan.run(args_type(qo, scale, zero_point, result), stream=stream)
    if _used_as_given(scale, zero_point, scales, zero_points):
        remember_fast(key, plan, result.obj)
    return result.obj


def _dequantize_backward(family, where, grad_output, scales, axis, group_size, dtype, out, stream, validate):
    plan_type, descriptor, args_type = _PLANS[(family, "dequantize_backward")]
    check_validate(validate, where)
    go = operand(grad_output, where, "grad_output")
    element = resolve_dtype(dtype, where)
    fields = _family_fields(family, go.shape, where, axis, group_size)
    plan = select_plan(plan_type, descriptor(*fields, go.element, element))
    scale, _ = scale_operands(scales, None, plan._segment_count(), go.element, go, where, validate=validate,
                              reciprocal=False, stream=stream)
    result = output_operand(out, go, go.shape, go.element, where)
    plan.run(args_type(scale, go, result), stream=stream)
    return result.obj


# -- per channel ----------------------------------------------------------------------------------


def quantize_per_channel(x: Any, scales: Any, zero_points: Any, axis: int, *, dtype: Any = "int8",
                         q_min: int | None = None, q_max: int | None = None, out: Any = None,
                         stream: Any = None, validate: str = "host") -> Any:
    """``q[..., c, ...] = clamp(round(x[..., c, ...] * (1/scales[c])) + zero_points[c], q_min, q_max)``.

    ``x`` of any rank; ``scales`` / ``zero_points`` of length ``x.shape[axis]``. With integer zero
    points, ``dequantize_per_channel(quantize_per_channel(x))`` equals
    ``torch.fake_quantize_per_channel_affine`` bit for bit.

    Checks (module docstring): ``scales`` finite, >= 0 and invertible where > 0; ``zero_points`` in
    ``[q_min, q_max]``; host arrays always, device arrays with ``validate="device"``.
    """
    return _quantize("channel", "quantize", "quantize_per_channel", x, scales, zero_points, axis, None, dtype,
                     q_min, q_max, None, out, stream, validate)


def dequantize_per_channel(q: Any, scales: Any, zero_points: Any, axis: int, *, dtype: Any = "float32",
                           out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``x[..., c, ...] = (q[..., c, ...] - zero_points[c]) * scales[c]`` in ``dtype``.

    Checks (module docstring): ``scales`` finite and >= 0; ``zero_points`` in the range of ``q``'s dtype;
    host arrays always, device arrays with ``validate="device"``.
    """
    return _dequantize("channel", "dequantize_per_channel", q, scales, zero_points, axis, None, dtype, out,
                       stream, validate)


def quantize_per_channel_backward(grad_output: Any, x: Any, scales: Any, zero_points: Any, axis: int, *,
                                  dtype: Any = "int8", q_min: int | None = None, q_max: int | None = None,
                                  out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``dx = grad_output * (1/scales[c]) * [q_min <= round(x * (1/scales[c])) + zero_points[c] <= q_max]``.

    Checks (module docstring): ``scales`` finite, >= 0 and invertible where > 0; ``zero_points`` in
    ``[q_min, q_max]``; host arrays always, device arrays with ``validate="device"``.
    """
    return _quantize("channel", "quantize_backward", "quantize_per_channel_backward", x, scales, zero_points, axis,
                     None, dtype, q_min, q_max, grad_output, out, stream, validate)


def dequantize_per_channel_backward(grad_output: Any, scales: Any, axis: int, *, dtype: Any = "int8",
                                    out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``dq = grad_output * scales[c]`` in ``grad_output``'s dtype (``dtype``: the forward's int dtype).

    Checks (module docstring): ``scales`` finite and >= 0; host arrays always, device arrays with
    ``validate="device"``.
    """
    return _dequantize_backward("channel", "dequantize_per_channel_backward", grad_output, scales, axis, None,
                                dtype, out, stream, validate)


# -- per token ------------------------------------------------------------------------------------


def quantize_per_token(x: Any, scales: Any, zero_points: Any = None, *, dtype: Any = "int8",
                       q_min: int | None = None, q_max: int | None = None, out: Any = None,
                       stream: Any = None, validate: str = "host") -> Any:
    """``q[t, :] = clamp(round(x[t, :] * (1/scales[t])) + zero_points[t], q_min, q_max)``.

    ``x`` is ``[N, D]`` (or any rank: rows over the leading dimensions), ``scales`` one per row.

    Checks (module docstring): ``scales`` finite, >= 0 and invertible where > 0; ``zero_points`` in
    ``[q_min, q_max]``; host arrays always, device arrays with ``validate="device"``.
    """
    return _quantize("token", "quantize", "quantize_per_token", x, scales, zero_points, None, None, dtype,
                     q_min, q_max, None, out, stream, validate)


def dequantize_per_token(q: Any, scales: Any, zero_points: Any = None, *, dtype: Any = "float32",
                         out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``x[t, :] = (q[t, :] - zero_points[t]) * scales[t]`` in ``dtype``.

    Checks (module docstring): ``scales`` finite and >= 0; ``zero_points`` in the range of ``q``'s dtype;
    host arrays always, device arrays with ``validate="device"``.
    """
    return _dequantize("token", "dequantize_per_token", q, scales, zero_points, None, None, dtype, out,
                       stream, validate)


def quantize_per_token_backward(grad_output: Any, x: Any, scales: Any, zero_points: Any = None, *,
                                dtype: Any = "int8", q_min: int | None = None, q_max: int | None = None,
                                out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``dx = grad_output * (1/scales[t]) * mask`` with the inclusive STE mask.

    Checks (module docstring): ``scales`` finite, >= 0 and invertible where > 0; ``zero_points`` in
    ``[q_min, q_max]``; host arrays always, device arrays with ``validate="device"``.
    """
    return _quantize("token", "quantize_backward", "quantize_per_token_backward", x, scales, zero_points, None,
                     None, dtype, q_min, q_max, grad_output, out, stream, validate)


def dequantize_per_token_backward(grad_output: Any, scales: Any, *, dtype: Any = "int8", out: Any = None,
                                  stream: Any = None, validate: str = "host") -> Any:
    """``dq = grad_output * scales[t]``.

    Checks (module docstring): ``scales`` finite and >= 0; host arrays always, device arrays with
    ``validate="device"``.
    """
    return _dequantize_backward("token", "dequantize_per_token_backward", grad_output, scales, None, None, dtype,
                                out, stream, validate)


# -- per group ------------------------------------------------------------------------------------


def quantize_per_group(x: Any, scales: Any, zero_points: Any, group_size: int, *, dtype: Any = "int8",
                       q_min: int | None = None, q_max: int | None = None, out: Any = None,
                       stream: Any = None, validate: str = "host") -> Any:
    """``q = clamp(round(x * (1/scales[o, g])) + zero_points[o, g], q_min, q_max)`` for groups of
    ``group_size`` consecutive elements along the last axis (``x`` ``[outer, axis]``; scales
    ``[outer, axis // group_size]``).

    Checks (module docstring): ``scales`` finite, >= 0 and invertible where > 0; ``zero_points`` in
    ``[q_min, q_max]``; host arrays always, device arrays with ``validate="device"``.
    """
    return _quantize("group", "quantize", "quantize_per_group", x, scales, zero_points, None, group_size, dtype,
                     q_min, q_max, None, out, stream, validate)


def dequantize_per_group(q: Any, scales: Any, zero_points: Any, group_size: int, *, dtype: Any = "float32",
                         out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``x = (q - zero_points[o, g]) * scales[o, g]`` in ``dtype``.

    Checks (module docstring): ``scales`` finite and >= 0; ``zero_points`` in the range of ``q``'s dtype;
    host arrays always, device arrays with ``validate="device"``.
    """
    return _dequantize("group", "dequantize_per_group", q, scales, zero_points, None, group_size, dtype, out,
                       stream, validate)


def quantize_per_group_backward(grad_output: Any, x: Any, scales: Any, zero_points: Any, group_size: int, *,
                                dtype: Any = "int8", q_min: int | None = None, q_max: int | None = None,
                                out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``dx = grad_output * (1/scales[o, g]) * mask`` with the inclusive STE mask.

    Checks (module docstring): ``scales`` finite, >= 0 and invertible where > 0; ``zero_points`` in
    ``[q_min, q_max]``; host arrays always, device arrays with ``validate="device"``.
    """
    return _quantize("group", "quantize_backward", "quantize_per_group_backward", x, scales, zero_points, None,
                     group_size, dtype, q_min, q_max, grad_output, out, stream, validate)


def dequantize_per_group_backward(grad_output: Any, scales: Any, group_size: int, *, dtype: Any = "int8",
                                  out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``dq = grad_output * scales[o, g]``.

    Checks (module docstring): ``scales`` finite and >= 0; host arrays always, device arrays with
    ``validate="device"``.
    """
    return _dequantize_backward("group", "dequantize_per_group_backward", grad_output, scales, None, group_size,
                                dtype, out, stream, validate)
