"""Per-tensor dispatch functions: one call per op on any supported array kind.

Semantics (the README's "Semantics" section), with ``inv = 1/scale`` taken in the math precision (float32 for
f16/bf16/f32 data, float64 for f64) and round half to even:

- quantize: ``q = clamp(round(x * inv) + zero_point, q_min, q_max)``; +-inf saturate, NaN -> ``clamp(zero_point)``
- dequantize: ``x = (q - zero_point) * scale``
- fake quantize: ``(clamp(round(x * inv) + zero_point, q_min, q_max) - zero_point) * scale``; NaN propagates
- backward (straight-through): ``mask = q_min <= round(x * inv) + zero_point <= q_max``;
  quantize: ``dx = dy * inv * mask``; fake quantize: ``dx = dy * mask``; dequantize: ``dq = dy * scale``

FP8 (``dtype="float8_e4m3fn"`` / ``"float8_e5m2"``): ``q = fp8_rne(clamp(x * inv, q_min, q_max))`` with
``q_min, q_max`` by default ``-+fp8_max`` (448 / 57344), bit for bit
``(x * inv).clamp(-max, max).to(torch.float8_e4m3fn)``; NaN stays NaN; no zero point (pass None);
``mask = q_min <= x * inv <= q_max``.

The result has the kind of the input (NumPy, torch, CuPy or numba) and ``x``'s shape. Device
results are asynchronous on ``stream`` (default: the current torch / CuPy stream for their tensors,
else the legacy default stream).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidProblem, problem_message
from ..plans.per_tensor import (
    DequantizePerTensorArgs,
    DequantizePerTensorBackwardArgs,
    DequantizePerTensorBackwardDescriptor,
    DequantizePerTensorBackwardPlan,
    DequantizePerTensorDescriptor,
    DequantizePerTensorPlan,
    FakeQuantizeArgs,
    FakeQuantizeBackwardArgs,
    FakeQuantizeBackwardDescriptor,
    FakeQuantizeBackwardPlan,
    FakeQuantizeDescriptor,
    FakeQuantizePlan,
    QuantizePerTensorArgs,
    QuantizePerTensorBackwardArgs,
    QuantizePerTensorBackwardDescriptor,
    QuantizePerTensorBackwardPlan,
    QuantizePerTensorDescriptor,
    QuantizePerTensorPlan,
)
from ..vocabulary import ElementKind
from .common import (
    default_q_range,
    fast_key,
    fast_run,
    operand,
    output_operand,
    remember_fast,
    resolve_dtype,
    scalar_zero_point,
    select_plan,
)

__all__ = [
    "quantize_per_tensor",
    "dequantize_per_tensor",
    "quantize_per_tensor_backward",
    "dequantize_per_tensor_backward",
    "fake_quantize",
    "fake_quantize_backward",
]


def quantize_per_tensor(x: Any, scale: float, zero_point: int | None = None, *, dtype: Any = "int8",
                        q_min: int | None = None, q_max: int | None = None, out: Any = None,
                        stream: Any = None) -> Any:
    """Quantize ``x`` with one scale and zero point.

    ``q = clamp(round_half_even(x * (1/scale)) + zero_point, q_min, q_max)``.

    Parameters
    ----------
    x : float array (f16, bf16, f32, f64), any shape, C-contiguous.
    scale : float > 0, finite, with a finite reciprocal in the math precision.
    zero_point : int in ``[q_min, q_max]`` (None: 0); must be None for FP8.
    dtype : ``"int8"``, ``"uint8"``, ``"float8_e4m3fn"`` or ``"float8_e5m2"`` (or a NumPy / torch
        dtype or :class:`ElementKind`).
    q_min, q_max : the clamp range, by default ``dtype``'s full (finite) range.

    Returns
    -------
    An integer array of ``x``'s shape, of ``x``'s kind.

    Raises
    ------
    InvalidProblem for a bad scale, zero point, range, layout or ``out``; Unsupported for a dtype
    pair the registry lacks.

    Examples
    --------
    >>> quantize_per_tensor(np.array([0.273939937], np.float32), 0.00214854861, dtype="uint8")
    array([128], dtype=uint8)
    """
    where = "quantize_per_tensor"
    key = fast_key(where, (x,) if out is None else (x, out), dtype, q_min, q_max)
    fast = fast_run(key, x, lambda result: QuantizePerTensorArgs(x, scale, zero_point, result), stream, out=out)
    if fast is not None:
        return fast
    xo = operand(x, where, "x")
    element = resolve_dtype(dtype, where)
    q_min, q_max = default_q_range(element, q_min, q_max)
    plan = select_plan(QuantizePerTensorPlan, QuantizePerTensorDescriptor(xo.size, q_min, q_max, xo.element, element))
    result = output_operand(out, xo, xo.shape, element, where)
    plan.run(QuantizePerTensorArgs(xo, scale, scalar_zero_point(zero_point, element), result), stream=stream)
    remember_fast(key, plan, result.obj)
    return result.obj


def dequantize_per_tensor(q: Any, scale: float, zero_point: int | None = None, *, dtype: Any = "float32",
                          out: Any = None, stream: Any = None) -> Any:
    """Dequantize ``q`` (int8 / uint8 / FP8): ``x = (q - zero_point) * scale`` in ``dtype`` (a float).

    Computed in float32 (float64 for a float64 result) and rounded once to ``dtype``.
    """
    where = "dequantize_per_tensor"
    key = fast_key(where, (q,) if out is None else (q, out), dtype)
    fast = fast_run(key, q, lambda result: DequantizePerTensorArgs(q, scale, zero_point, result), stream, out=out)
    if fast is not None:
        return fast
    qo = operand(q, where, "q")
    element = resolve_dtype(dtype, where)
    plan = select_plan(DequantizePerTensorPlan, DequantizePerTensorDescriptor(qo.size, element, qo.element))
    result = output_operand(out, qo, qo.shape, element, where)
    plan.run(DequantizePerTensorArgs(qo, scale, scalar_zero_point(zero_point, qo.element), result), stream=stream)
    remember_fast(key, plan, result.obj)
    return result.obj


def quantize_per_tensor_backward(grad_output: Any, x: Any, scale: float, zero_point: int | None = None, *,
                                 dtype: Any = "int8", q_min: int | None = None, q_max: int | None = None,
                                 out: Any = None, stream: Any = None) -> Any:
    """Straight-through gradient of :func:`quantize_per_tensor` with respect to ``x``.

    ``dx = grad_output * (1/scale) * [q_min <= round(x * (1/scale)) + zero_point <= q_max]``,
    in ``x``'s dtype (``grad_output`` must share it).
    """
    where = "quantize_per_tensor_backward"
    go, xo = operand(grad_output, where, "grad_output"), operand(x, where, "x")
    element = resolve_dtype(dtype, where)
    q_min, q_max = default_q_range(element, q_min, q_max)
    desc = QuantizePerTensorBackwardDescriptor(xo.size, q_min, q_max, xo.element, element)
    plan = select_plan(QuantizePerTensorBackwardPlan, desc)
    result = output_operand(out, xo, xo.shape, xo.element, where)
    plan.run(QuantizePerTensorBackwardArgs(xo, scale, scalar_zero_point(zero_point, element), go, result),
             stream=stream)
    return result.obj


def dequantize_per_tensor_backward(grad_output: Any, scale: float, *, dtype: Any = "int8",
                                   out: Any = None, stream: Any = None) -> Any:
    """Gradient of :func:`dequantize_per_tensor` with respect to ``q``: ``grad_output * scale``.

    ``dtype`` is the forward's integer dtype; the result has ``grad_output``'s float dtype.
    """
    where = "dequantize_per_tensor_backward"
    go = operand(grad_output, where, "grad_output")
    element = resolve_dtype(dtype, where)
    desc = DequantizePerTensorBackwardDescriptor(go.size, go.element, element)
    plan = select_plan(DequantizePerTensorBackwardPlan, desc)
    result = output_operand(out, go, go.shape, go.element, where)
    plan.run(DequantizePerTensorBackwardArgs(scale, go, result), stream=stream)
    return result.obj


def fake_quantize(x: Any, scale: float, zero_point: int | None = None, q_min: int | None = None,
                  q_max: int | None = None, *, dtype: Any = None, torch_compat: bool = False, out: Any = None,
                  stream: Any = None) -> Any:
    """Quantize and dequantize in one pass, in ``x``'s dtype.

    ``y = (clamp(round(x * (1/scale)) + zero_point, q_min, q_max) - zero_point) * scale``,
    computed in the math precision (float32; float64 for float64 data) and rounded once; ``q_min,
    q_max`` default to [-128, 127] (``dtype``'s range when an integer dtype is given). For f32, f16
    and bf16 data this is ``torch.fake_quantize_per_tensor_affine`` bit for bit. For float64 data
    PyTorch uses a float32 scale and reciprocal and multiplies back in float32 (its result is a
    float32 value widened); ``torch_compat=True`` reproduces that, the default stays float64
    throughout. NaN propagates.

    ``dtype="float8_e4m3fn"`` / ``"float8_e5m2"`` simulates FP8 instead:
    ``y = fp8_rne(clamp(x * (1/scale), q_min, q_max)) * scale`` (``q_min, q_max`` default
    ``-+fp8_max``; no zero point), i.e. ``(x * inv).clamp(...).to(fp8).to(x.dtype) * scale``.
    """
    where = "fake_quantize"
    key = fast_key(where, (x,) if out is None else (x, out), q_min, q_max, dtype, torch_compat)
    fast = fast_run(key, x, lambda result: FakeQuantizeArgs(x, scale, zero_point, result), stream, out=out)
    if fast is not None:
        return fast
    xo = operand(x, where, "x")
    simulated = _simulated(dtype, where)
    grid = simulated if simulated.is_fp8 else None
    q_min, q_max = default_q_range(simulated, q_min, q_max)
    desc = FakeQuantizeDescriptor(xo.size, q_min, q_max, xo.element, grid, torch_compat)
    plan = select_plan(FakeQuantizePlan, desc)
    result = output_operand(out, xo, xo.shape, xo.element, where)
    plan.run(FakeQuantizeArgs(xo, scale, _fake_zero_point(zero_point, grid), result), stream=stream)
    remember_fast(key, plan, result.obj)
    return result.obj


def fake_quantize_backward(grad_output: Any, x: Any, scale: float, zero_point: int | None = None,
                           q_min: int | None = None, q_max: int | None = None, *, dtype: Any = None,
                           torch_compat: bool = False, out: Any = None, stream: Any = None) -> Any:
    """Straight-through gradient of :func:`fake_quantize`:
    ``dx = grad_output * [q_min <= round(x * (1/scale)) + zero_point <= q_max]``
    (FP8 ``dtype``: ``[q_min <= x * (1/scale) <= q_max]``, false for NaN); ``torch_compat`` as in
    :func:`fake_quantize` (float64 data: the float32 reciprocal, as PyTorch's autograd)."""
    where = "fake_quantize_backward"
    go, xo = operand(grad_output, where, "grad_output"), operand(x, where, "x")
    simulated = _simulated(dtype, where)
    grid = simulated if simulated.is_fp8 else None
    q_min, q_max = default_q_range(simulated, q_min, q_max)
    desc = FakeQuantizeBackwardDescriptor(xo.size, q_min, q_max, xo.element, grid, torch_compat)
    plan = select_plan(FakeQuantizeBackwardPlan, desc)
    result = output_operand(out, xo, xo.shape, xo.element, where)
    plan.run(FakeQuantizeBackwardArgs(xo, scale, _fake_zero_point(zero_point, grid), go, result), stream=stream)
    return result.obj


def _simulated(dtype: Any, where: str) -> ElementKind:
    """The element fake-quantize simulates: an FP8 one, or an integer one (its range is the default
    ``q_min, q_max``; None: int8)."""
    element = ElementKind.S8 if dtype is None else resolve_dtype(dtype, where)
    if not (element.is_fp8 or element.is_integer):
        raise InvalidProblem(problem_message(where, "dtype", "an integer or FP8 dtype to simulate", element.short))
    return element


def _fake_zero_point(zero_point: Any, grid: ElementKind | None) -> Any:
    return scalar_zero_point(zero_point, grid or ElementKind.S8)
