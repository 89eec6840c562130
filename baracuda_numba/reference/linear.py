"""NumPy reference of the W8A8 linear layers: per-token symmetric activation quantization (the
dynamic-range reference), exact int64 matmul, the float32 epilogue in the kernels' order."""

from __future__ import annotations

from typing import Any

import numpy as np

from .dynamic import dynamic_range_quantize
from .elementwise import quantize

__all__ = ["int8_matmul", "quantized_linear", "smoothquant_linear"]


def int8_matmul(a: Any, w: Any) -> np.ndarray:
    """``a [M, K] @ w[N, K].T`` exactly (int64)."""
    return np.asarray(a).astype(np.int64) @ np.asarray(w).astype(np.int64).T


def _epilogue(acc: np.ndarray, row_scale: Any, weight_scale: Any, bias: Any, dtype: Any) -> np.ndarray:
    f32 = np.float32
    y = (acc.astype(f32) * np.asarray(row_scale, f32)) * np.asarray(weight_scale, f32)[None, :]
    if bias is not None:
        y = y + np.asarray(bias, f32)[None, :]
    return y.astype(dtype)


def quantized_linear(x: Any, weight_q: Any, weight_scale: Any, bias: Any = None,
                     act_scale: float | None = None) -> np.ndarray:
    """Per token, or with ``act_scale`` per tensor (the elementwise quantize reference, zero point 0)."""
    x = np.asarray(x)
    rows = x.reshape(-1, x.shape[-1])
    if act_scale is None:
        xq, scale, _ = dynamic_range_quantize(rows, "symmetric", "token", -127, 127)
        scale = scale[:, None]
    else:
        xq, scale = quantize(rows, act_scale, 0, -127, 127), np.float32(act_scale)
    y = _epilogue(int8_matmul(xq, weight_q), scale, weight_scale, bias, x.dtype)
    return y.reshape(*x.shape[:-1], -1)


def smoothquant_linear(act_q: Any, weight_q: Any, weight_scale: Any, act_scale: float, bias: Any = None,
                       dtype: Any = np.float32) -> np.ndarray:
    act_q = np.asarray(act_q)
    rows = act_q.reshape(-1, act_q.shape[-1])
    y = _epilogue(int8_matmul(rows, weight_q), np.float32(act_scale), weight_scale, bias, dtype)
    return y.reshape(*act_q.shape[:-1], -1)
