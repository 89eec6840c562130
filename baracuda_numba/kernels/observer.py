"""The observer update of quantization-aware training in one kernel: a batch's extremes folded into the running
range and the scale and zero point recomputed, one thread per channel.

With ``lo, hi`` the batch's extremes of channel ``c`` (in their element, read exactly as float32) and ``m, M``
the running range (float32), in float32 with each operation rounded on its own:

- min-max observer: ``m = min(m, lo)``, ``M = max(M, hi)``;
- moving average: ``m = lo, M = hi`` while ``m`` is infinite (no batch yet), else ``m = m + a * (lo - m)`` and
  ``M = M + a * (hi - M)``, ``a`` the averaging constant as float32;
- ``low = min(m, 0)``, ``high = max(M, 0)``; symmetric: ``scale = max(-low, high) * inv``, ``zero_point`` the
  given constant; affine: ``scale = (high - low) * inv``, ``zero_point = int(clamp(q_min - rint(low / scale),
  q_min, q_max))``; ``scale = max(scale, eps)`` first. ``inv`` is the float32 reciprocal of the divisor
  (``(q_max - q_min) / 2`` symmetric, ``q_max - q_min`` affine): PyTorch divides a CUDA tensor by a Python
  number as a multiplication by the number's float32 reciprocal.

Every min and max propagates NaN, and a NaN zero point becomes 0 (CUDA's conversion): the bits of
:class:`~baracuda_numba.torch.FakeQuantize`'s observer written as PyTorch operations on CUDA tensors
(``tests/test_torch_gpu.py``), and of ``torch.ao``'s observers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import cuda

from ..vocabulary import ElementKind, MathPrecision
from . import device
from .codecs import codec
from .device import device_function
from .elementwise import ElementwiseKernel, uint_name

__all__ = ["ObserverConfig", "observer_kernel", "OBSERVER_THREADS", "RANGE_ELEMENTS"]

OBSERVER_THREADS = 128
RANGE_ELEMENTS = (ElementKind.F32, ElementKind.BF16, ElementKind.F16)
_F32 = np.float32


@dataclass(frozen=True)
class ObserverConfig:
    """``range_element``: the element of the batch's extremes (the observed tensor's; float32 for float64
    data); the observer and the quantization's kind."""

    range_element: ElementKind
    moving_average: bool
    symmetric: bool

    @property
    def name(self) -> str:
        return (f"observe_{self.range_element.short}_{'average' if self.moving_average else 'minmax'}_"
                f"{'symmetric' if self.symmetric else 'affine'}")


@device_function
def nan_min(a, b):
    """``min(a, b)``, NaN if either is (``torch.minimum``, ``torch.clamp``)."""
    if a != a:
        return a
    if b != b:
        return b
    return b if b < a else a


@device_function
def nan_max(a, b):
    """``max(a, b)``, NaN if either is (``torch.maximum``, ``torch.clamp``)."""
    if a != a:
        return a
    if b != b:
        return b
    return b if b > a else a


@functools.cache
def observer_kernel(config: ObserverConfig) -> ElementwiseKernel:
    """The update kernel of ``config``: ``kernel(low, high, min_val, max_val, scale, zero_point, count, averaging,
    inv, q_min, q_max, zero_point_symmetric, eps)``, ``low`` / ``high`` the extremes' bits (unsigned integers of
    their element), the running range and the scale float32, the zero points int32, ``count`` channels."""
    if config.range_element not in RANGE_ELEMENTS:
        raise ValueError(f"observer_kernel: range_element expected one of {RANGE_ELEMENTS}, got "
                         f"{config.range_element}")
    decode = codec(config.range_element, MathPrecision.F32).decode
    moving_average, symmetric = config.moving_average, config.symmetric
    zero, u64 = _F32(0.0), np.uint64
    add_rn, rint = device.add_rn, device.rint

    def kernel(low, high, min_val, max_val, scale, zero_point, count, averaging, inv, q_min, q_max,
               zero_point_symmetric, eps):
        c = cuda.grid(1)
        if c >= count:
            return
        lo, hi = decode(u64(low[c])), decode(u64(high[c]))
        m, big = min_val[c], max_val[c]
        if moving_average:
            if math.isinf(m):  # no batch observed yet (torch.isinf of the running minimum)
                m, big = lo, hi
            else:
                m = add_rn(m, averaging * (lo - m))
                big = add_rn(big, averaging * (hi - big))
        else:
            m, big = nan_min(m, lo), nan_max(big, hi)
        min_val[c], max_val[c] = m, big
        low_0, high_0 = nan_min(m, zero), nan_max(big, zero)
        if symmetric:
            s = nan_max(-low_0, high_0) * inv
        else:
            s = (high_0 - low_0) * inv
        s = nan_max(s, eps)
        scale[c] = s
        if symmetric:
            zero_point[c] = zero_point_symmetric
        else:
            z = nan_min(nan_max(q_min - rint(low_0 / s), q_min), q_max)
            zero_point[c] = 0 if z != z else np.int32(z)

    kernel.__name__ = kernel.__qualname__ = config.name
    bits = uint_name(config.range_element.itemsize)
    signature = (f"void({bits}[::1], {bits}[::1], float32[::1], float32[::1], float32[::1], int32[::1], int64, "
                 "float32, float32, float32, float32, int32, float32)")
    return ElementwiseKernel(kernel, signature, config.range_element, None, ElementKind.F32, MathPrecision.F32, 1)
