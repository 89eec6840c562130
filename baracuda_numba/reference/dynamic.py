"""NumPy reference of dynamic-range quantization (the README's "Semantics" section, torchao ASYMMETRIC), independent of
the kernels: float64 arithmetic rounded to the math precision after each operation."""

from __future__ import annotations

from typing import Any

import numpy as np

from .elementwise import math_dtype, quantize

__all__ = ["dynamic_range_params", "dynamic_range_quantize", "segments_view"]


def segments_view(x: np.ndarray, scope: str, axis: int | None = None, group_size: int | None = None) -> np.ndarray:
    """``x`` as ``[segments, elements]`` for a scope (channel: the channel axis moved first)."""
    if scope == "tensor":
        return x.reshape(1, -1)
    if scope == "token":
        return x.reshape(-1, x.shape[-1])
    if scope == "group":
        return x.reshape(-1, group_size)
    return np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)


def _natural_shape(shape, scope, axis, group_size):
    if scope == "tensor":
        return ()
    if scope == "token":
        return shape[:-1]
    if scope == "channel":
        return (shape[axis],)
    return (*shape[:-1], shape[-1] // group_size)


def dynamic_range_params(x: Any, mode: str, scope: str, q_min: int, q_max: int, axis: int | None = None,
                         group_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, zero_point)`` in their natural shape (scale in the math precision, zp int32)."""
    x = np.asarray(x)
    math = math_dtype(x.dtype)
    values = x.astype(np.float64)
    values = np.where(np.isfinite(values), values, 0.0)  # the range ignores NaN and +-inf
    seg = segments_view(values, scope, axis, group_size)
    width = seg.shape[1] if seg.size else 0

    def rounded(v):
        return np.asarray(v, np.float64).astype(math).astype(np.float64)

    tiny = float(np.finfo(math).tiny)
    if mode == "symmetric":
        zp = 0 if q_min < 0 else (q_min + q_max + 1) // 2
        hi = np.abs(seg).max(axis=1) if width else np.zeros(seg.shape[0])
        scale = np.where(hi > 0, rounded(hi / (q_max - zp)), 1.0)
        zero_point = np.full(scale.shape, zp, np.float64)
    else:
        hi = np.maximum(seg.max(axis=1), 0) if width else np.zeros(seg.shape[0])
        lo = np.minimum(seg.min(axis=1), 0) if width else np.zeros(seg.shape[0])
        span = rounded(hi - lo)
        scale = np.where(span > 0, rounded(span / (q_max - q_min)), 1.0)
    scale = np.maximum(scale, tiny)
    if mode != "symmetric":
        zero_point = np.clip(q_min - np.rint(rounded(lo / scale)), q_min, q_max)
    shape = _natural_shape(x.shape, scope, axis, group_size)
    return scale.astype(math).reshape(shape), zero_point.astype(np.int32).reshape(shape)


def dynamic_range_quantize(x: Any, mode: str, scope: str, q_min: int, q_max: int, dtype: Any = np.int8,
                           axis: int | None = None, group_size: int | None = None):
    """``(q, scale, zero_point)``: the parameters above, then the elementwise quantize."""
    x = np.asarray(x)
    scale, zero_point = dynamic_range_params(x, mode, scope, q_min, q_max, axis, group_size)
    if scope == "tensor":
        full_s, full_z = scale, zero_point
    elif scope == "token":
        full_s, full_z = scale[..., None], zero_point[..., None]
    elif scope == "group":
        full_s = np.repeat(scale, group_size, axis=-1).reshape(x.shape)
        full_z = np.repeat(zero_point, group_size, axis=-1).reshape(x.shape)
    else:
        shape = [1] * x.ndim
        shape[axis] = -1
        full_s, full_z = scale.reshape(shape), zero_point.reshape(shape)
    return quantize(x, full_s, full_z, q_min, q_max, dtype), scale, zero_point
