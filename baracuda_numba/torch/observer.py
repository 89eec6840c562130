""":class:`~baracuda_numba.torch.FakeQuantize`'s observer update on CUDA tensors in one launch
(:mod:`baracuda_numba.kernels.observer`): the running range, the scale and the zero point from a batch's extremes,
where PyTorch operations take about fifteen launches (host time that a QAT step otherwise spends per fake
quantizer)."""

from __future__ import annotations

import numpy as np
import torch

from ..kernels.observer import OBSERVER_THREADS, ObserverConfig, observer_kernel
from ..launch import KernelLauncher, array_values, torch_current_stream
from ..platform import SIMULATOR
from ..vocabulary import ElementKind

__all__ = ["ObserverUpdate", "RANGE_DTYPES"]

RANGE_DTYPES = {torch.float32: ElementKind.F32, torch.bfloat16: ElementKind.BF16, torch.float16: ElementKind.F16}
_SCALARS = (np.int64, np.float32, np.float32, np.float32, np.float32, np.int32, np.float32)
_POINTERS = slice(4, 7 * 6, 7)  # each array's data pointer in numba's kernel ABI


class ObserverUpdate:
    """One fake quantizer's update: ``update(low, high, min_val, max_val, scale, zero_point)`` launches the
    kernel of ``config`` on the current stream over ``count`` channels (float32 ranges and scales, int32 zero
    points, the extremes of a dtype of :data:`RANGE_DTYPES`, contiguous, on one CUDA device).

    The constants (``averaging``, the divisor's float32 reciprocal, ``q_min``, ``q_max``, the symmetric zero
    point, ``eps``) and ``count`` are packed once; a call patches the six pointers."""

    def __init__(self, config: ObserverConfig, count: int, averaging: float, divisor: float, q_min: int,
                 q_max: int, zero_point_symmetric: int, eps: float) -> None:
        self.config, self.count = config, count
        self.scalars = (count, np.float32(averaging), np.float32(1.0) / np.float32(divisor), np.float32(q_min),
                        np.float32(q_max), np.int32(zero_point_symmetric), np.float32(eps))
        self.blocks = max(1, -(-count // OBSERVER_THREADS))
        self._launcher = KernelLauncher(observer_kernel(config).compiled, 6, _SCALARS)
        if not SIMULATOR:
            itemsize = config.range_element.itemsize
            values = [*array_values(0, count, itemsize), *array_values(0, count, itemsize)]
            for _ in range(4):
                values += array_values(0, count, 4)
            self._launcher.set_template([*values, *self.scalars], (_POINTERS,), range(0), np.float32)

    def update(self, low: torch.Tensor, high: torch.Tensor, min_val: torch.Tensor, max_val: torch.Tensor,
               scale: torch.Tensor, zero_point: torch.Tensor) -> None:
        device = low.get_device()
        if SIMULATOR:  # the tensors' host views (tests of the kernel on CPU tensors)
            from ..launch import ArrayArg

            itemsize = self.config.range_element.itemsize
            signed, bits = (torch.int16, "u2") if itemsize == 2 else (torch.int32, "u4")
            arrays = [ArrayArg(0, self.count, itemsize, t.view(signed).numpy().view(bits)) for t in (low, high)]
            arrays += [ArrayArg(0, self.count, 4, t.numpy()) for t in (min_val, max_val, scale, zero_point)]
            self._launcher.launch(self.blocks, OBSERVER_THREADS, 0, arrays, self.scalars)
            return
        self._launcher.launch_patched(self.blocks, OBSERVER_THREADS, torch_current_stream(device),
                                      (low.data_ptr(), high.data_ptr(), min_val.data_ptr(), max_val.data_ptr(),
                                       scale.data_ptr(), zero_point.data_ptr()), (), device)
