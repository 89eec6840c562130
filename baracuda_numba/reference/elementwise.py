"""NumPy reference of the README's "Semantics" section for the elementwise family, written independently of the
kernels: float64 arithmetic with an explicit rounding to the math precision after each operation
(float64 holds every float32 product and quotient exactly enough for that rounding to be the
correctly rounded float32 result).

``scale`` and ``zero_point`` broadcast against ``x``: a scalar (per tensor) or an array shaped to
broadcast (per channel / token / group). The math precision is float64 when the float operand is
float64, else float32.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "math_dtype",
    "reciprocal",
    "quantize",
    "dequantize",
    "fake_quantize",
    "quantize_backward",
    "fake_quantize_backward",
    "dequantize_backward",
    "ste_mask",
    "scaled_masked_gradient",
    "expand_channels",
    "expand_tokens",
    "expand_groups",
]


def math_dtype(float_dtype: Any) -> np.dtype:
    """float64 for float64 data, float32 for f16 / bf16 / f32 data."""
    return np.dtype(np.float64) if np.dtype(float_dtype) == np.float64 else np.dtype(np.float32)


def _f64(values: Any) -> np.ndarray:
    return np.asarray(values).astype(np.float64)


def _round(values: np.ndarray, math: np.dtype) -> np.ndarray:
    """Round float64 values to the math precision (kept in float64)."""
    return values.astype(math).astype(np.float64)


def _store(values: np.ndarray, dtype: Any) -> np.ndarray:
    """Round once from the math precision to the storage dtype (float32 first: exact here)."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return values.astype(np.float64)
    return values.astype(np.float32).astype(dtype)


def reciprocal(scale: Any, math: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(inv, scale)`` rounded to ``math``; ``inv`` is 0 where ``scale`` is 0."""
    s = _round(_f64(scale), math)
    with np.errstate(divide="ignore"):
        inv = np.where(s == 0, 0.0, _round(1.0 / np.where(s == 0, 1.0, s), math))
    return inv, s


def _unclamped(x: Any, scale: Any, zero_point: Any, math: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(t, inv)`` with ``t = rint(x * inv) + zero_point`` (NaN stays NaN)."""
    inv, _ = reciprocal(scale, math)
    with np.errstate(invalid="ignore"):
        t = np.rint(_round(_f64(x) * inv, math)) + _f64(zero_point)
    return t, inv


def quantize(x: Any, scale: Any, zero_point: Any, q_min: int, q_max: int, dtype: Any = np.int8) -> np.ndarray:
    """``clamp(rint(x * inv) + zero_point, q_min, q_max)``; NaN -> ``clamp(zero_point)``."""
    math = math_dtype(np.asarray(x).dtype)
    t, _ = _unclamped(x, scale, zero_point, math)
    zp = np.broadcast_to(_f64(zero_point), t.shape)
    t = np.where(np.isnan(t), zp, t)
    return np.clip(t, q_min, q_max).astype(dtype)


def dequantize(q: Any, scale: Any, zero_point: Any, dtype: Any = np.float32) -> np.ndarray:
    """``(q - zero_point) * scale`` in the math precision of ``dtype``, rounded once to ``dtype``."""
    math = math_dtype(dtype)
    _, s = reciprocal(scale, math)
    return _store(_round((_f64(q) - _f64(zero_point)) * s, math), dtype)


def fake_quantize(x: Any, scale: Any, zero_point: Any, q_min: int, q_max: int) -> np.ndarray:
    """``(clamp(rint(x * inv) + zp, q_min, q_max) - zp) * scale`` in ``x``'s dtype; NaN propagates."""
    x = np.asarray(x)
    math = math_dtype(x.dtype)
    t, _ = _unclamped(x, scale, zero_point, math)
    _, s = reciprocal(scale, math)
    with np.errstate(invalid="ignore"):
        y = _round((np.clip(t, q_min, q_max) - _f64(zero_point)) * s, math)
    return _store(y, x.dtype)


def ste_mask(x: Any, scale: Any, zero_point: Any, q_min: int, q_max: int) -> np.ndarray:
    """``q_min <= rint(x * inv) + zp <= q_max``; false for NaN and where ``scale == 0``."""
    math = math_dtype(np.asarray(x).dtype)
    t, inv = _unclamped(x, scale, zero_point, math)
    with np.errstate(invalid="ignore"):
        return (q_min <= t) & (t <= q_max) & (inv != 0)


def quantize_backward(dy: Any, x: Any, scale: Any, zero_point: Any, q_min: int, q_max: int) -> np.ndarray:
    """``dy * inv * mask`` in ``x``'s dtype."""
    return scaled_masked_gradient(dy, x, scale, ste_mask(x, scale, zero_point, q_min, q_max))


def scaled_masked_gradient(dy: Any, x: Any, scale: Any, mask: np.ndarray) -> np.ndarray:
    """``dy * inv * mask`` in ``x``'s dtype, each product rounded to the math precision (the quantize
    backward of every grid, given its straight-through ``mask``)."""
    x = np.asarray(x)
    math = math_dtype(x.dtype)
    inv, _ = reciprocal(scale, math)
    with np.errstate(invalid="ignore"):
        return _store(_round(_round(_f64(dy) * inv, math) * mask.astype(np.float64), math), x.dtype)


def fake_quantize_backward(dy: Any, x: Any, scale: Any, zero_point: Any, q_min: int, q_max: int) -> np.ndarray:
    """``dy * mask`` in ``x``'s dtype."""
    x = np.asarray(x)
    mask = ste_mask(x, scale, zero_point, q_min, q_max).astype(np.float64)
    with np.errstate(invalid="ignore"):
        return _store(_f64(dy) * mask, x.dtype)


def dequantize_backward(dy: Any, scale: Any) -> np.ndarray:
    """``dy * scale`` in ``dy``'s dtype."""
    dy = np.asarray(dy)
    math = math_dtype(dy.dtype)
    _, s = reciprocal(scale, math)
    return _store(_round(_f64(dy) * s, math), dy.dtype)


def expand_channels(values: Any, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """Per-channel ``values[shape[axis]]`` expanded to ``shape``."""
    axis %= len(shape)
    values = np.asarray(values).reshape((-1,) + (1,) * (len(shape) - axis - 1))
    return np.broadcast_to(values, shape)


def expand_tokens(values: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Per-row ``values`` (one per index of ``shape[:-1]``) expanded to ``shape``."""
    return np.broadcast_to(np.asarray(values).reshape((*tuple(shape[:-1]), 1)), shape)


def expand_groups(values: Any, shape: tuple[int, ...], group_size: int) -> np.ndarray:
    """Per-group ``values`` (``[*shape[:-1], shape[-1] // group_size]``) expanded to ``shape``."""
    groups = np.asarray(values).reshape((*tuple(shape[:-1]), shape[-1] // group_size))
    return np.repeat(groups, group_size, axis=-1).reshape(shape)


BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
