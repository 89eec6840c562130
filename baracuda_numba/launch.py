"""Kernel launches with the least host work, and stream resolution.

On a GPU a compiled kernel is launched through ``cuda.core.launch`` with its parameters packed
directly (numba's array ABI: ``meminfo, parent, nitems, itemsize, data, shape, strides``), skipping
numba's per-call typing and argument wrapping (~45 us). Under the simulator the numba dispatcher
is called with NumPy arrays wrapped so that aliasing views are not copied apart.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import InvalidOperand, problem_message
from .platform import SIMULATOR

__all__ = ["ArrayArg", "KernelLauncher", "stream_handle"]

_SCALAR_CTYPES = {np.int64: ctypes.c_int64, np.int32: ctypes.c_int32,
                  np.float32: ctypes.c_float, np.float64: ctypes.c_double}


class ArrayArg:
    """A flat array argument: device address and length, or the host view under the simulator."""

    __slots__ = ("host", "itemsize", "nitems", "ptr")

    def __init__(self, ptr: int, nitems: int, itemsize: int, host: np.ndarray | None = None):
        self.ptr, self.nitems, self.itemsize, self.host = ptr, nitems, itemsize, host


class KernelLauncher:
    """Launches ``dispatcher`` (compiled for one signature) given array and scalar arguments.

    ``scalar_types`` are the NumPy types of the scalar parameters, in order, after the arrays.
    """

    def __init__(self, compile_dispatcher, scalar_types: Sequence[type]) -> None:
        self._compile = compile_dispatcher
        self._scalar_types = tuple(scalar_types)
        self._ctypes = tuple(_SCALAR_CTYPES[t] for t in self._scalar_types)
        self._kernels: dict[int, Any] = {}
        self._configs: dict[tuple[int, int], Any] = {}
        self._lock = threading.Lock()

    def _core_kernel(self, device_id: int):
        kernel = self._kernels.get(device_id)
        if kernel is None:
            with self._lock:
                dispatcher = self._compile()
                overload = next(iter(dispatcher.overloads.values()))
                kernel = overload._codelibrary.get_cufunc().kernel
                self._kernels[device_id] = kernel
        return kernel

    def launch(self, blocks: int, threads: int, stream: int, arrays: Sequence[ArrayArg],
               scalars: Sequence[Any], device_id: int = 0) -> None:
        if SIMULATOR:
            self._launch_simulated(blocks, threads, arrays, scalars)
            return
        from cuda.core import LaunchConfig, launch

        params: list[Any] = []
        for a in arrays:
            params += (0, 0, a.nitems, a.itemsize, a.ptr, a.nitems, a.itemsize)
        params += [c(v) for c, v in zip(self._ctypes, scalars, strict=True)]
        config = self._configs.get((blocks, threads))
        if config is None:
            config = self._configs[(blocks, threads)] = LaunchConfig(grid=blocks, block=threads)
        launch(_core_stream(stream), config, self._core_kernel(device_id), *params)

    def _launch_simulated(self, blocks, threads, arrays, scalars) -> None:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        dispatcher = self._compile()
        args = [FakeCUDAArray(a.host) for a in arrays]
        args += [t(v) for t, v in zip(self._scalar_types, scalars, strict=True)]
        dispatcher[blocks, threads](*args)


_CORE_STREAMS: dict[int, Any] = {}


def _core_stream(handle: int):
    stream = _CORE_STREAMS.get(handle)
    if stream is None:
        from cuda.core import Stream

        stream = _CORE_STREAMS[handle] = Stream.from_handle(handle)
    return stream


def stream_handle(stream: Any, operands: Sequence[Any], where: str) -> int:
    """The raw ``CUstream`` handle to launch on.

    ``stream`` may be None (the current PyTorch / CuPy stream when an operand comes from that
    framework, else the legacy default stream), an integer handle, or any object implementing
    ``__cuda_stream__`` (numba and cuda.core streams), a ``torch.cuda.Stream`` or a CuPy stream.
    """
    if stream is None:
        for op in operands:
            if op.origin == "torch":
                return sys.modules["torch"].cuda.current_stream(op.device_id).cuda_stream
            if op.origin == "cupy":
                return sys.modules["cupy"].cuda.get_current_stream().ptr
        return 0
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool):
        return int(stream)
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        handle = protocol() if callable(protocol) else protocol
        return int(handle[1])
    for attribute in ("cuda_stream", "ptr", "handle"):  # torch, CuPy, numba
        value = getattr(stream, attribute, None)
        if value is not None:
            return int(getattr(value, "value", value) or 0)
    raise InvalidOperand(problem_message(where, "stream", "None, an int handle or a CUDA stream object",
                                         type(stream).__name__))
