"""Fake-quantize dispatch functions with array scales: per channel, per token and per group, each
forward one kernel and each straight-through backward one kernel.

``y = (clamp(rint(x * (1/s)) + zp, q_min, q_max) - zp) * s`` with the segment's scale ``s`` and zero
point ``zp``, computed in the math precision (float32; float64 for float64 data) and rounded once to
``x``'s dtype; NaN propagates, +-inf saturate, an element scale of 0 gives ``(clamp(zp) - zp) * 0``.
The backward is ``dx = grad_output * mask``, ``mask = q_min <= rint(x * (1/s)) + zp <= q_max``
(inclusive; false for NaN and where ``s == 0``). For float32, float16 and bfloat16 data these are the
bits of ``torch.fake_quantize_per_channel_affine`` and its autograd on finite inputs (per token and per
group are per channel along axis 0 of ``[rows, D]`` and ``[groups, group_size]``).

``dtype`` names the simulated integer grid: ``"int8"`` / ``"uint8"`` (per group also ``"int4"`` /
``"uint4"``, whose default is kept for the 4-bit QAT it started with); ``q_min`` / ``q_max`` default to
its range. ``scales`` are used in the math precision and ``zero_points`` as int32 (converted by their
own framework when given otherwise) and checked as in :mod:`baracuda_numba.ops.per_axis` (``validate``:
host arrays always, device arrays with ``validate="device"``); ``zero_points=None`` means zeros (int4 is
symmetric: it takes
None only). Segments and shapes as in :mod:`baracuda_numba.ops.per_axis`. The result has the kind and
shape of ``x``.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidProblem, problem_message
from ..plans import fake as p
from ..plans.packed import outer_size
from ..vocabulary import ElementKind
from .checks import check_validate
from .common import (
    default_q_range,
    fast_key,
    operand,
    output_operand,
    remember_fast,
    resolve_dtype,
    scale_operands,
    select_plan,
)
from .per_axis import _given, _run_remembered, _used_as_given

__all__ = ["fake_quantize_per_channel", "fake_quantize_per_channel_backward", "fake_quantize_per_token",
           "fake_quantize_per_token_backward", "fake_quantize_per_group", "fake_quantize_per_group_backward"]

_PLANS = {
    (family, backward): (getattr(p, f"FakeQuantizePer{family.capitalize()}{suffix}Plan"),
                         getattr(p, f"FakeQuantizePer{family.capitalize()}{suffix}Descriptor"),
                         getattr(p, f"FakeQuantizePer{family.capitalize()}{suffix}Args"))
    for family in ("channel", "token", "group") for backward, suffix in ((False, ""), (True, "Backward"))
}


def _fields(family: str, shape: tuple[int, ...], where: str, layout: Any) -> tuple:
    """The descriptor's shape fields: ``(shape, axis)``, ``(n, d)`` or ``(outer, axis_size, group_size)``."""
    if family == "channel":
        return (shape, layout)
    if not shape:
        raise InvalidProblem(problem_message(where, "x", "an array of rank >= 1", "a 0-d array"))
    rows = outer_size(shape)
    return (rows, shape[-1]) if family == "token" else (rows, shape[-1], layout)


def _fake(family: str, where: str, x: Any, scales: Any, zero_points: Any, layout: Any, dtype: Any,
          q_min: int | None, q_max: int | None, grad_output: Any, out: Any, stream: Any, validate: str) -> Any:
    """The forward (``grad_output`` None) or the backward of one family. Repeat calls on CUDA torch
    tensors replay the plan remembered for their layout (see :func:`.common.fast_key`)."""
    backward = grad_output is not None
    plan_type, descriptor, args_type = _PLANS[(family, backward)]
    key = None
    if out is None and check_validate(validate, where) == "host":
        arrays = _given(x, scales, zero_points) + ((grad_output,) if backward else ())
        key = fast_key(where, arrays, layout, dtype, q_min, q_max)
        make = ((lambda zps, result: args_type(x, scales, zps, grad_output, result)) if backward
                else (lambda zps, result: args_type(x, scales, zps, result)))
        fast = _run_remembered(key, x, zero_points, make, stream)
        if fast is not None:
            return fast
    xo = operand(x, where, "x")
    element = resolve_dtype(dtype, where)
    if element is ElementKind.S4 and zero_points is not None:
        raise InvalidProblem(problem_message(where, "zero_points", "None (int4 is symmetric)",
                                             type(zero_points).__name__))
    q_min, q_max = default_q_range(element, q_min, q_max)
    plan = select_plan(plan_type, descriptor(*_fields(family, xo.shape, where, layout), q_min, q_max, xo.element,
                                             element))
    scale, zero_point = scale_operands(scales, zero_points, plan._segment_count(), xo.element, xo, where,
                                       validate=check_validate(validate, where), q_range=(q_min, q_max),
                                       stream=stream)
    result = output_operand(out, xo, xo.shape, xo.element, where)
    if backward:
        go = operand(grad_output, where, "grad_output")
        plan.run(args_type(xo, scale, zero_point, go, result), stream=stream)
    else:
        plan.run(args_type(xo, scale, zero_point, result), stream=stream)
    if _used_as_given(scale, zero_point, scales, zero_points):
        remember_fast(key, plan, result.obj)
    return result.obj


# -- per channel ----------------------------------------------------------------------------------


def fake_quantize_per_channel(x: Any, scales: Any, zero_points: Any, axis: int, *, dtype: Any = "int8",
                              q_min: int | None = None, q_max: int | None = None, out: Any = None,
                              stream: Any = None, validate: str = "host") -> Any:
    """``y[..., c, ...] = (clamp(rint(x * (1/scales[c])) + zero_points[c], q_min, q_max) - zero_points[c])
    * scales[c]`` in ``x``'s dtype, one kernel.

    Parameters
    ----------
    x : float array (f16, bf16, f32, f64) of any rank, C-contiguous.
    scales, zero_points : ``[x.shape[axis]]``; ``zero_points=None`` means zeros.
    axis : the channel axis (negative counts from the end).
    dtype : the simulated grid, ``"int8"`` or ``"uint8"``; ``q_min`` / ``q_max`` default to its range.

    Returns
    -------
    An array of ``x``'s kind, dtype and shape (``out`` when given).

    Raises
    ------
    InvalidProblem : a bad axis, a scale or zero-point count other than ``x.shape[axis]``, a range outside
        ``dtype``'s. Unsupported : a grid other than int8 / uint8.

    Examples
    --------
    >>> w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    >>> s = w.float().abs().amax(dim=1) / 127
    >>> y = fake_quantize_per_channel(w, s, None, 0, q_min=-127, q_max=127)
    """
    return _fake("channel", "fake_quantize_per_channel", x, scales, zero_points, axis, dtype, q_min, q_max, None,
                 out, stream, validate)


def fake_quantize_per_channel_backward(grad_output: Any, x: Any, scales: Any, zero_points: Any, axis: int, *,
                                       dtype: Any = "int8", q_min: int | None = None, q_max: int | None = None,
                                       out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``dx = grad_output * [q_min <= rint(x * (1/scales[c])) + zero_points[c] <= q_max]`` in ``x``'s dtype,
    one kernel (``grad_output`` of ``x``'s dtype and shape)."""
    return _fake("channel", "fake_quantize_per_channel_backward", x, scales, zero_points, axis, dtype, q_min, q_max,
                 grad_output, out, stream, validate)


# -- per token ------------------------------------------------------------------------------------


def fake_quantize_per_token(x: Any, scales: Any, zero_points: Any = None, *, dtype: Any = "int8",
                            q_min: int | None = None, q_max: int | None = None, out: Any = None,
                            stream: Any = None, validate: str = "host") -> Any:
    """``y[t, :] = (clamp(rint(x[t, :] * (1/scales[t])) + zero_points[t], q_min, q_max) - zero_points[t])
    * scales[t]``: rows over the leading dimensions of ``x``, one scale per row, one kernel."""
    return _fake("token", "fake_quantize_per_token", x, scales, zero_points, None, dtype, q_min, q_max, None, out,
                 stream, validate)


def fake_quantize_per_token_backward(grad_output: Any, x: Any, scales: Any, zero_points: Any = None, *,
                                     dtype: Any = "int8", q_min: int | None = None, q_max: int | None = None,
                                     out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``dx = grad_output * mask`` per row, the inclusive straight-through mask, one kernel."""
    return _fake("token", "fake_quantize_per_token_backward", x, scales, zero_points, None, dtype, q_min, q_max,
                 grad_output, out, stream, validate)


# -- per group ------------------------------------------------------------------------------------


def fake_quantize_per_group(x: Any, scales: Any, zero_points: Any = None, group_size: int = 128, *,
                            dtype: Any = "int4", q_min: int | None = None, q_max: int | None = None,
                            out: Any = None, stream: Any = None, validate: str = "host") -> Any:
    """``y = (clamp(rint(x * (1/s)) + zp, q_min, q_max) - zp) * s`` per group of ``group_size`` along the
    last axis (``scales`` ``[..., D / group_size]``), in ``x``'s dtype, one kernel; ``dtype`` ``"int4"`` /
    ``"uint4"`` (4-bit QAT) or ``"int8"`` / ``"uint8"``."""
    return _fake("group", "fake_quantize_per_group", x, scales, zero_points, group_size, dtype, q_min, q_max, None,
                 out, stream, validate)


def fake_quantize_per_group_backward(grad_output: Any, x: Any, scales: Any, zero_points: Any = None,
                                     group_size: int = 128, *, dtype: Any = "int4", q_min: int | None = None,
                                     q_max: int | None = None, out: Any = None, stream: Any = None,
                                     validate: str = "host") -> Any:
    """Straight-through gradient: ``dx = grad_output * [q_min <= rint(x / s) + zp <= q_max]`` (inclusive)."""
    return _fake("group", "fake_quantize_per_group_backward", x, scales, zero_points, group_size, dtype, q_min,
                 q_max, grad_output, out, stream, validate)
