"""Per-tensor dispatch functions: one call per op on any supported array kind.

Semantics (the README's "Semantics" section), with ``inv = 1/scale`` taken in the math precision (float32 for
f16/bf16/f32 data, float64 for f64) and round half to even:

- quantize: ``q = clamp(round(x * inv) + zero_point, q_min, q_max)``; +-inf saturate, NaN -> ``clamp(zero_point)``
- dequantize: ``x = (q - zero_point) * scale``
- fake quantize: ``(clamp(round(x * inv) + zero_point, q_min, q_max) - zero_point) * scale``; NaN propagates
- backward (straight-through): ``mask = q_min <= round(x * inv) + zero_point <= q_max``;
  quantize: ``dx = dy * inv * mask``; fake quantize: ``dx = dy * mask``; dequantize: ``dq = dy * scale``

The result has the kind of the input (NumPy, torch, CuPy or numba) and ``x``'s shape. Device
results are asynchronous on ``stream`` (default: the current torch / CuPy stream for their tensors,
else the legacy default stream).
"""

from __future__ import annotations

from typing import Any

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
from .common import default_q_range, operand, output_operand, resolve_dtype, select_plan

__all__ = [
    "quantize_per_tensor",
    "dequantize_per_tensor",
    "quantize_per_tensor_backward",
    "dequantize_per_tensor_backward",
    "fake_quantize",
    "fake_quantize_backward",
]


def quantize_per_tensor(x: Any, scale: float, zero_point: int = 0, *, dtype: Any = "int8",
                        q_min: int | None = None, q_max: int | None = None, out: Any = None,
                        stream: Any = None) -> Any:
    """Quantize ``x`` with one scale and zero point.

    ``q = clamp(round_half_even(x * (1/scale)) + zero_point, q_min, q_max)``.

    Parameters
    ----------
    x : float array (f16, bf16, f32, f64), any shape, C-contiguous.
    scale : float > 0, finite, with a finite reciprocal in the math precision.
    zero_point : int in ``[q_min, q_max]``.
    dtype : ``"int8"`` or ``"uint8"`` (or a NumPy / torch dtype or :class:`ElementKind`).
    q_min, q_max : the clamp range, by default ``dtype``'s full range.

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
    xo = operand(x, where, "x")
    element = resolve_dtype(dtype, where)
    q_min, q_max = default_q_range(element, q_min, q_max)
    plan = select_plan(QuantizePerTensorPlan, QuantizePerTensorDescriptor(xo.size, q_min, q_max, xo.element, element))
    result = output_operand(out, xo, xo.shape, element, where)
    plan.run(QuantizePerTensorArgs(xo, scale, zero_point, result), stream=stream)
    return result.obj


def dequantize_per_tensor(q: Any, scale: float, zero_point: int = 0, *, dtype: Any = "float32",
                          out: Any = None, stream: Any = None) -> Any:
    """Dequantize ``q`` (int8 / uint8): ``x = (q - zero_point) * scale`` in ``dtype`` (a float).

    Computed in float32 (float64 for a float64 result) and rounded once to ``dtype``.
    """
    where = "dequantize_per_tensor"
    qo = operand(q, where, "q")
    element = resolve_dtype(dtype, where)
    plan = select_plan(DequantizePerTensorPlan, DequantizePerTensorDescriptor(qo.size, element, qo.element))
    result = output_operand(out, qo, qo.shape, element, where)
    plan.run(DequantizePerTensorArgs(qo, scale, zero_point, result), stream=stream)
    return result.obj


def quantize_per_tensor_backward(grad_output: Any, x: Any, scale: float, zero_point: int = 0, *,
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
    plan.run(QuantizePerTensorBackwardArgs(xo, scale, zero_point, go, result), stream=stream)
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


def fake_quantize(x: Any, scale: float, zero_point: int = 0, q_min: int = -128, q_max: int = 127, *,
                  out: Any = None, stream: Any = None) -> Any:
    """Quantize and dequantize in one pass, in ``x``'s dtype.

    ``y = (clamp(round(x * (1/scale)) + zero_point, q_min, q_max) - zero_point) * scale``,
    computed in the math precision and rounded once; for f16/bf16/f32 ``x`` it matches
    ``torch.fake_quantize_per_tensor_affine`` bit for bit. For f64 ``x`` it is float64 throughout, while
    PyTorch uses a float32 scale, reciprocal and product (see the README, "PyTorch and float64").
    NaN propagates.
    """
    where = "fake_quantize"
    xo = operand(x, where, "x")
    plan = select_plan(FakeQuantizePlan, FakeQuantizeDescriptor(xo.size, q_min, q_max, xo.element))
    result = output_operand(out, xo, xo.shape, xo.element, where)
    plan.run(FakeQuantizeArgs(xo, scale, zero_point, result), stream=stream)
    return result.obj


def fake_quantize_backward(grad_output: Any, x: Any, scale: float, zero_point: int = 0, q_min: int = -128,
                           q_max: int = 127, *, out: Any = None, stream: Any = None) -> Any:
    """Straight-through gradient of :func:`fake_quantize`:
    ``dx = grad_output * [q_min <= round(x * (1/scale)) + zero_point <= q_max]``."""
    where = "fake_quantize_backward"
    go, xo = operand(grad_output, where, "grad_output"), operand(x, where, "x")
    plan = select_plan(FakeQuantizeBackwardPlan, FakeQuantizeBackwardDescriptor(xo.size, q_min, q_max, xo.element))
    result = output_operand(out, xo, xo.shape, xo.element, where)
    plan.run(FakeQuantizeBackwardArgs(xo, scale, zero_point, go, result), stream=stream)
    return result.obj
