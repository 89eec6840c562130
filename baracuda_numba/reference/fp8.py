"""NumPy reference of the FP8 ops (E4M3fn, E5M2), independent of the kernels: float64 arithmetic
rounded to the math precision after each operation (as :mod:`.elementwise`), FP8 encoding and
decoding by ``ml_dtypes``.

- quantize: ``q = fp8(clamp(x * inv, q_min, q_max))`` (``q_min, q_max`` default ``-+fp8_max``),
  one rounding to nearest even from float32 (float64 math values go through float32 first, as
  PyTorch's conversion does); NaN stays NaN; where ``scale == 0``, ``q = 0``;
- dequantize: ``x = float(q) * scale`` (no zero point);
- fake quantize: ``y = float(fp8(clamp(x * inv))) * scale`` (NaN propagates);
- straight-through mask: ``q_min <= x * inv <= q_max`` (false for NaN and where ``scale == 0``);
  quantize backward ``dy * inv * mask``, fake-quantize backward ``dy * mask``;
- dynamic range (symmetric): ``scale = max(amax / fp8_max, 1 / (fp8_max * 512))`` over the finite
  elements of each segment (vLLM's dynamic FP8 scale).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .dynamic import segments_view
from .elementwise import _f64, _round, _store, math_dtype, reciprocal, scaled_masked_gradient

__all__ = ["FP8_DTYPES", "fp8_max", "fp8_quantize", "fp8_dequantize", "fp8_fake_quantize", "fp8_ste_mask",
           "fp8_quantize_backward", "fp8_fake_quantize_backward", "fp8_dynamic_scale"]

FP8_DTYPES = {"fp8_e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "fp8_e5m2": np.dtype(ml_dtypes.float8_e5m2)}


def fp8_max(fp8: Any) -> float:
    """Largest finite value of an FP8 dtype."""
    return float(ml_dtypes.finfo(np.dtype(fp8)).max)


def _bounds(fp8: Any, q_min: float | None, q_max: float | None) -> tuple[float, float]:
    top = fp8_max(fp8)
    return (-top if q_min is None else q_min), (top if q_max is None else q_max)


def _scaled(x: Any, scale: Any, math: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(x * inv, inv)`` in the math precision."""
    inv, _ = reciprocal(scale, math)
    with np.errstate(invalid="ignore", over="ignore"):
        return _round(_f64(x) * inv, math), inv


def _encode(values: np.ndarray, fp8: Any) -> np.ndarray:
    """float64 values (already within the finite range, or NaN) to FP8, through float32."""
    with np.errstate(invalid="ignore", over="ignore"):
        return values.astype(np.float32).astype(np.dtype(fp8))


def fp8_quantize(x: Any, scale: Any, fp8: Any, q_min: float | None = None, q_max: float | None = None) -> np.ndarray:
    """``fp8(clamp(x * inv, q_min, q_max))`` as an ``ml_dtypes`` float8 array (0 where scale is 0)."""
    math = math_dtype(np.asarray(x).dtype)
    v, inv = _scaled(x, scale, math)
    v = np.where(inv == 0, 0.0, v)
    return _encode(np.clip(v, *_bounds(fp8, q_min, q_max)), fp8)


def fp8_dequantize(q: Any, scale: Any, dtype: Any = np.float32) -> np.ndarray:
    """``float(q) * scale`` in the math precision of ``dtype``, rounded once to ``dtype``."""
    math = math_dtype(dtype)
    _, s = reciprocal(scale, math)
    with np.errstate(invalid="ignore"):
        return _store(_round(np.asarray(q).astype(np.float64) * s, math), dtype)


def fp8_fake_quantize(x: Any, scale: Any, fp8: Any, q_min: float | None = None,
                      q_max: float | None = None) -> np.ndarray:
    """``float(fp8(clamp(x * inv))) * scale`` in ``x``'s dtype; NaN propagates."""
    x = np.asarray(x)
    math = math_dtype(x.dtype)
    v, _ = _scaled(x, scale, math)
    grid = _encode(np.clip(v, *_bounds(fp8, q_min, q_max)), fp8).astype(np.float64)
    _, s = reciprocal(scale, math)
    with np.errstate(invalid="ignore"):
        return _store(_round(grid * s, math), x.dtype)


def fp8_ste_mask(x: Any, scale: Any, fp8: Any, q_min: float | None = None, q_max: float | None = None) -> np.ndarray:
    """``q_min <= x * inv <= q_max``; false for NaN and where ``scale == 0``."""
    math = math_dtype(np.asarray(x).dtype)
    v, inv = _scaled(x, scale, math)
    low, high = _bounds(fp8, q_min, q_max)
    with np.errstate(invalid="ignore"):
        return (low <= v) & (v <= high) & (inv != 0)


def fp8_quantize_backward(dy: Any, x: Any, scale: Any, fp8: Any, q_min: float | None = None,
                          q_max: float | None = None) -> np.ndarray:
    """``dy * inv * mask`` in ``x``'s dtype."""
    return scaled_masked_gradient(dy, x, scale, fp8_ste_mask(x, scale, fp8, q_min, q_max))


def fp8_fake_quantize_backward(dy: Any, x: Any, scale: Any, fp8: Any, q_min: float | None = None,
                               q_max: float | None = None) -> np.ndarray:
    """``dy * mask`` in ``x``'s dtype."""
    x = np.asarray(x)
    mask = fp8_ste_mask(x, scale, fp8, q_min, q_max).astype(np.float64)
    with np.errstate(invalid="ignore"):
        return _store(_f64(dy) * mask, x.dtype)


def fp8_dynamic_scale(x: Any, fp8: Any, scope: str, axis: int | None = None,
                      group_size: int | None = None) -> np.ndarray:
    """Per-segment ``max(amax / fp8_max, 1 / (fp8_max * 512))`` (math precision), flat."""
    x = np.asarray(x)
    math = math_dtype(x.dtype)
    values = x.astype(np.float64)
    values = np.where(np.isfinite(values), values, 0.0)
    seg = segments_view(values, scope, axis, group_size)
    amax = np.abs(seg).max(axis=1) if seg.shape[1] else np.zeros(seg.shape[0])
    top = fp8_max(fp8)
    scale = _round(amax / top, math)
    return np.maximum(scale, _round(np.float64(1.0 / (top * 512.0)), math)).astype(math)
