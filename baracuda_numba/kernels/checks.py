"""The device side of ``validate="device"`` (:mod:`baracuda_numba.ops.checks`): one grid-stride kernel that
finds the first invalid scale and the first out-of-range zero point of device arrays, and the host call
that launches it on the op's stream and reads its answer back (one synchronization).

Per element ``i`` of ``scales`` (float32 or float64): bad unless ``0 <= s <= max finite`` and not
``0 < s < limit`` (``limit``: the smallest scale with a finite reciprocal, 0 when the op does not invert);
NaN fails the first comparison. Per element of ``zero_points`` (int32): bad unless ``low <= z <= high``.
``result[0]`` / ``result[1]`` end as the smallest bad index of each (``atomic.min``), or the array's size.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numba import cuda

__all__ = ["scan_kernel", "first_bad_on_device"]

_THREADS = 256
_MAX_BLOCKS = 1024  # a few waves on any card: the arrays checked are scales, thousands of elements


@functools.cache
def scan_kernel() -> Any:
    """The compiled-on-first-use scan (one dispatcher; numba specialises it per scale dtype)."""

    @cuda.jit
    def scan(scales, top, limit, zero_points, low, high, result):
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for i in range(start, scales.size, stride):
            s = scales[i]
            if not (s >= 0 and s <= top) or (s > 0 and s < limit):
                cuda.atomic.min(result, 0, i)
        for i in range(start, zero_points.size, stride):
            z = zero_points[i]
            if z < low or z > high:
                cuda.atomic.min(result, 1, i)

    return scan


def first_bad_on_device(scales: Any, limit: float, zero_points: Any, low: int, high: int,
                        stream: int) -> tuple[tuple[int, float] | None, tuple[int, int] | None]:
    """``((index, value) of the first bad scale or None, (index, value) of the first bad zero point or
    None)`` for device arrays (anything with ``__cuda_array_interface__``; None: not checked), computed on
    raw stream handle ``stream`` and copied back (this waits for the stream)."""
    from numba import cuda as numba_cuda

    s = (numba_cuda.as_cuda_array(scales).reshape(-1) if scales is not None
         else numba_cuda.device_array(0, np.float32))
    z = (numba_cuda.as_cuda_array(zero_points).reshape(-1) if zero_points is not None
         else numba_cuda.device_array(0, np.int32))
    top = float(np.finfo(s.dtype).max)
    sized = max(s.size, z.size)
    result = numba_cuda.to_device(np.array([s.size, z.size], np.int64))
    on = numba_cuda.external_stream(stream) if stream else numba_cuda.default_stream()
    blocks = max(1, min(_MAX_BLOCKS, -(-sized // _THREADS)))
    scan_kernel()[blocks, _THREADS, on](s, top, limit, z, low, high, result)
    first = result.copy_to_host(stream=on)
    on.synchronize()
    bad_scale = bad_zp = None
    if first[0] < s.size:
        bad_scale = (int(first[0]), s[int(first[0]):int(first[0]) + 1].copy_to_host(stream=on)[0])
    if first[1] < z.size:
        bad_zp = (int(first[1]), z[int(first[1]):int(first[1]) + 1].copy_to_host(stream=on)[0])
    on.synchronize()
    return bad_scale, bad_zp
