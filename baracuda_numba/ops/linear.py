"""W8A8 linear layers and the offline side of SmoothQuant.

- :func:`quantized_linear`: ``x`` quantized per token (symmetric int8, [-127, 127]) in the same call,
  then ``y = scale_x[m] * weight_scale[n] * sum_k xq[m, k] * wq[n, k] (+ bias[n])`` on tensor cores.
- :func:`smoothquant_linear`: the same GEMM on pre-quantized activations with a static scale.
- :func:`activation_absmax`, :func:`weight_absmax`, :func:`smoothing_scales`, :func:`smooth_weight`,
  :func:`smooth_activation`: SmoothQuant calibration, ``s_j = max|X_j|^alpha / max|W_j|^(1-alpha)``
  (both maxima clamped to >= 1e-5 as the reference implementation does), ``W * s`` and ``X / s``.
  They run in the framework of their inputs (NumPy, PyTorch, CuPy).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from ..errors import InvalidProblem, problem_message
from ..plans.base import DEFAULT_PREFERENCE
from ..plans.linear import (
    QuantizedLinearArgs,
    QuantizedLinearDescriptor,
    QuantizedLinearPlan,
    SmoothQuantLinearArgs,
    SmoothQuantLinearDescriptor,
    SmoothQuantLinearPlan,
)
from ..plans.linear.plan import check_weight_scale
from ..plans.linear.tuning import device_properties, tuning_for
from ..vocabulary import ElementKind
from .common import (
    coerced,
    fast_key,
    fast_run,
    operand,
    output_operand,
    remember_fast,
    remembered_plan,
    resolve_dtype,
    select_plan,
)

__all__ = ["quantized_linear", "smoothquant_linear", "activation_absmax", "weight_absmax", "smoothing_scales",
           "smooth_weight", "smooth_activation"]


def _linear_shapes(x_shape: tuple[int, ...], w_shape: tuple[int, ...], where: str) -> tuple[int, int, int]:
    if not x_shape:
        raise InvalidProblem(problem_message(where, "x", "an array of rank >= 1 ([..., K])", "a 0-d array"))
    if len(w_shape) != 2:
        raise InvalidProblem(problem_message(where, "weight_q", "an [N, K] array", f"shape {w_shape}"))
    k = x_shape[-1]
    if w_shape[1] != k:
        raise InvalidProblem(problem_message(where, "weight_q", f"[N, {k}] (K of x)", f"shape {w_shape}"))
    return math.prod(x_shape[:-1]), w_shape[0], k


def _vectors(where: str, weight_scale: Any, bias: Any, n: int):
    scale = coerced(weight_scale, ElementKind.F32, n, where, "weight_scale")
    check_weight_scale(where, scale)
    return scale, (None if bias is None else coerced(bias, ElementKind.F32, n, where, "bias"))


def _select(plan_type: type, desc: Any) -> Any:
    """The plan of ``desc`` for the current device, cached on the descriptor, the device's properties and its
    tuning value."""
    device = device_properties()
    return select_plan(plan_type, desc, DEFAULT_PREFERENCE, tuning_for(device), device)


def quantized_linear(x: Any, weight_q: Any, weight_scale: Any, *, bias: Any = None, out: Any = None,
                     stream: Any = None, static_weight: bool = False, act_scale: float | None = None) -> Any:
    """W8A8 ``nn.Linear``: ``x [..., K]`` (f16 / bf16 / f32 / f64) -> ``[..., N]`` in ``x``'s dtype.

    ``x`` is quantized per token (symmetric int8, [-127, 127]); ``weight_q`` is ``[N, K]`` int8 with
    per-output-channel ``weight_scale [N]``. Accumulation is exact in int32 (``K <= 132104``), the
    epilogue ``(acc * scale_x[m]) * weight_scale[n] + bias[n]`` in float32.

    ``weight_scale`` must be finite and > 0. A host (NumPy) array is checked here: a negative, zero, NaN or
    infinite element raises :class:`~baracuda_numba.errors.InvalidProblem` naming the first bad index. A device
    array is not read (that would synchronise every call): scales on the GPU are checked where the weight is
    prepared (the PyTorch layer's ``W8A8Linear.from_float`` and state-dict load).

    ``static_weight=True`` promises that ``weight_q``, ``weight_scale`` and ``bias`` are not written by
    the kernel launched just before this call on the stream (a model's weights, written at load). The
    one-launch decode kernel then starts loading the weight while that kernel finishes (faster decode,
    the same bits); a weight that kernel does write could then be read before it is written.

    ``act_scale``: a static per-tensor activation scale (SmoothQuant's static W8A8) instead of the
    per-token quantize: ``y = (quantize_per_tensor(x, act_scale, 0, int8, -127, 127) @ weight_q.T) *
    act_scale * weight_scale (+ bias)``, the bits of that quantize followed by
    :func:`smoothquant_linear` (f16, bf16 or f32 ``x``). At decode one kernel does both for a few tokens;
    for more, a static quantizer (no reduction) and the GEMM as its programmatic dependent.
    """
    where = "quantized_linear"
    if not isinstance(static_weight, bool):
        raise InvalidProblem(problem_message(where, "static_weight", "a bool", repr(static_weight)))
    key = fast_key(where, _tensors(x, weight_q, weight_scale, bias, out), bias is None, static_weight,
                   act_scale is None)
    if key is not None:  # a repeat call on plain CUDA torch tensors: the remembered plan, unadapted
        if out is None:
            result = fast_run(key, x, lambda y: QuantizedLinearArgs(x, weight_q, weight_scale, y, bias, act_scale),
                              stream, new_shape=True)
            if result is not None:
                return result
        elif _remembered(key, lambda plan: plan.run(QuantizedLinearArgs(x, weight_q, weight_scale, out, bias,
                                                                        act_scale), stream=stream)):
            return out
    xo, wo = operand(x, where, "x"), operand(weight_q, where, "weight_q")
    m, n, k = _linear_shapes(xo.shape, wo.shape, where)
    if wo.element is not ElementKind.S8:
        raise InvalidProblem(problem_message(where, "weight_q", "int8 elements", wo.element.short))
    scale, bias_op = _vectors(where, weight_scale, bias, n)
    plan = _select(QuantizedLinearPlan, QuantizedLinearDescriptor(m, n, k, xo.element, xo.element, bias is not None,
                                                                  static_weight, act_scale is not None))
    result = output_operand(out, xo, (*xo.shape[:-1], n), xo.element, where)
    plan.run(QuantizedLinearArgs(xo, wo, scale, result, bias_op, act_scale), stream=stream)
    if scale.obj is weight_scale and (bias is None or bias_op.obj is bias):  # no conversion: repeatable raw
        remember_fast(key, plan, result.obj)
    return result.obj


def smoothquant_linear(act_q: Any, weight_q: Any, weight_scale: Any, act_scale: float, *, bias: Any = None,
                       dtype: Any = "float32", out: Any = None, stream: Any = None,
                       static_weight: bool = False) -> Any:
    """SmoothQuant W8A8 linear: ``act_q [..., K]`` int8 quantized with the static per-tensor
    ``act_scale``; ``y = (acc * act_scale) * weight_scale[n] (+ bias[n])`` in ``dtype``.

    ``weight_scale`` must be finite and > 0, checked as :func:`quantized_linear` checks it (host arrays here,
    device arrays where the weight is prepared); ``act_scale`` must be finite and > 0 (``InvalidProblem``).

    ``static_weight=True`` promises what :func:`quantized_linear`'s does. The decode GEMM then starts
    loading the weight while the kernel before it (the quantize of ``act_q``) finishes, and reads
    ``act_q`` once that kernel is complete (the same bits).
    """
    where = "smoothquant_linear"
    if not isinstance(static_weight, bool):
        raise InvalidProblem(problem_message(where, "static_weight", "a bool", repr(static_weight)))
    key = fast_key(where, _tensors(act_q, weight_q, weight_scale, bias, out), bias is None, dtype, static_weight)
    if key is not None:  # a repeat call on plain CUDA torch tensors: the remembered plan, unadapted
        if out is None:
            result = fast_run(key, act_q,
                              lambda y: SmoothQuantLinearArgs(act_q, weight_q, weight_scale, act_scale, y, bias),
                              stream, new_shape=True)
            if result is not None:
                return result
        elif _remembered(key, lambda plan: plan.run(SmoothQuantLinearArgs(act_q, weight_q, weight_scale, act_scale,
                                                                           out, bias), stream=stream)):
            return out
    ao, wo = operand(act_q, where, "act_q"), operand(weight_q, where, "weight_q")
    m, n, k = _linear_shapes(ao.shape, wo.shape, where)
    for name, op in (("act_q", ao), ("weight_q", wo)):
        if op.element is not ElementKind.S8:
            raise InvalidProblem(problem_message(where, name, "int8 elements", op.element.short))
    element = resolve_dtype(dtype, where)
    scale, bias_op = _vectors(where, weight_scale, bias, n)
    plan = _select(SmoothQuantLinearPlan, SmoothQuantLinearDescriptor(m, n, k, element, bias is not None,
                                                                      static_weight))
    result = output_operand(out, ao, (*ao.shape[:-1], n), element, where)
    plan.run(SmoothQuantLinearArgs(ao, wo, scale, act_scale, result, bias_op), stream=stream)
    if scale.obj is weight_scale and (bias is None or bias_op.obj is bias):  # no conversion: repeatable raw
        remember_fast(key, plan, result.obj)
    return result.obj


def _tensors(x: Any, weight_q: Any, weight_scale: Any, bias: Any, out: Any) -> tuple:
    """The array arguments of a call, the absent optional ones (None) left out."""
    if bias is None and out is None:  # the common call, without a generator
        return x, weight_q, weight_scale
    return tuple(a for a in (x, weight_q, weight_scale, bias, out) if a is not None)


def _remembered(key: tuple, run: Any) -> bool:
    """Run the plan remembered under ``key`` (an ``out=`` call); False when none is."""
    plan = remembered_plan(key)
    if plan is None:
        return False
    run(plan)
    return True


# -- SmoothQuant calibration (host-side compositions in the inputs' framework) -----------------------


def _is_torch(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _xp(value: Any):
    if type(value).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def activation_absmax(x: Any, running: Any = None) -> Any:
    """Per-channel ``max |x|`` over every axis but the last (``[K]``), folded into ``running``."""
    if _is_torch(x):
        current = x.detach().abs().reshape(-1, x.shape[-1]).amax(dim=0).float()
        return current if running is None else running.maximum(current)
    xp = _xp(x)
    current = xp.abs(xp.asarray(x)).reshape(-1, x.shape[-1]).max(axis=0).astype(np.float32)
    return current if running is None else xp.maximum(running, current)


def weight_absmax(weight: Any) -> Any:
    """Per-input-channel ``max |W[:, j]|`` of an ``[N, K]`` weight (``[K]``)."""
    if _is_torch(weight):
        return weight.detach().abs().amax(dim=0).float()
    xp = _xp(weight)
    return xp.abs(xp.asarray(weight)).max(axis=0).astype(np.float32)


def smoothing_scales(act_absmax: Any, weight_absmax_: Any, alpha: float = 0.5) -> Any:
    """``s_j = max(|X_j|, 1e-5)^alpha / max(|W_j|, 1e-5)^(1 - alpha)``."""
    if not 0.0 <= alpha <= 1.0:
        raise InvalidProblem(problem_message("smoothing_scales", "alpha", "a value in [0, 1]", alpha))
    if _is_torch(act_absmax):
        return act_absmax.clamp(min=1e-5).pow(alpha) / weight_absmax_.clamp(min=1e-5).pow(1 - alpha)
    xp = _xp(act_absmax)
    a = xp.maximum(xp.asarray(act_absmax, dtype=np.float32), np.float32(1e-5))
    w = xp.maximum(xp.asarray(weight_absmax_, dtype=np.float32), np.float32(1e-5))
    return (a ** np.float32(alpha) / w ** np.float32(1 - alpha)).astype(np.float32)


def smooth_weight(weight: Any, scales: Any) -> Any:
    """``W * s``: each input channel ``j`` of an ``[N, K]`` weight multiplied by ``s_j``."""
    return weight * scales[None, :]


def smooth_activation(x: Any, scales: Any) -> Any:
    """``X / s``: each channel (last axis) of the activations divided by ``s_j``."""
    return x / scales
