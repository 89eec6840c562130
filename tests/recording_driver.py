"""A libcuda stand-in for the GPU launch path on a machine without a GPU.

Launches go through the package's own compiled launch (:func:`baracuda_numba._launch_jit.launch_record`),
with ``cuLaunchKernel``, ``cuLaunchKernelEx`` and ``cuCtxGetDevice`` replaced by ctypes callbacks (their
addresses its entry points): each
launch records its configuration and the parameter bytes handed over through ``extra``, and whether it
allowed programmatic stream serialization (``dependent``).
"""

from __future__ import annotations

import ctypes

import numpy as np

from baracuda_numba.launch import DriverLaunches, function_address

_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, *[ctypes.c_uint] * 7, ctypes.c_uint64, ctypes.c_uint64,
                           ctypes.c_uint64)
_LAUNCH_EX = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_uint64] * 4)
_GET_DEVICE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64)
_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class RecordingDriver(DriverLaunches):
    """Records ``((function, grid x, y, z, block x, y, z, shared bytes, stream), parameter bytes)`` per launch
    in ``calls``, and in ``dependent`` whether it went through ``cuLaunchKernelEx`` allowing programmatic
    stream serialization."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], bytes]] = []
        self.dependent: list[bool] = []
        self.memsets: list[tuple[int, int, int, int]] = []  # (pointer, value, 32-bit words, stream)
        self.device = 0
        self.status = 0

        def launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            words = (ctypes.c_uint64 * 5).from_address(extra)
            assert params == 0 and (words[0], words[2], words[4]) == (1, 2, 0)
            size = ctypes.c_uint64.from_address(words[3]).value
            self.calls.append(((function, gx, gy, gz, bx, by, bz, shared, stream), ctypes.string_at(words[1], size)))
            self.dependent.append(False)
            return self.status

        def launch_kernel_ex(config, function, params, extra):
            # CUlaunchConfig: six uint32 dims, uint32 shared bytes (padded), stream, attrs, numAttrs
            dims = (ctypes.c_uint32 * 7).from_address(config)
            stream, attrs, count = (ctypes.c_uint64 * 3).from_address(config + 32)
            serialized = False
            for i in range(count & 0xFFFFFFFF):  # CUlaunchAttribute: id (padded to 8), 64-byte value
                at = attrs + 72 * i
                if ctypes.c_uint32.from_address(at).value == _PROGRAMMATIC_STREAM_SERIALIZATION:
                    serialized = ctypes.c_int32.from_address(at + 8).value == 1
            status = launch_kernel(function, *dims, stream, params, extra)
            self.dependent[-1] = serialized
            return status

        def ctx_get_device(address):
            ctypes.c_int.from_address(address).value = self.device
            return 0

        self._callbacks = (_LAUNCH(launch_kernel), _LAUNCH_EX(launch_kernel_ex), _GET_DEVICE(ctx_get_device))
        self.entry_points = np.array([function_address(f) for f in self._callbacks], np.uint64)

    def memset_d32_async(self, ptr: int, value: int, count: int, stream: int) -> int:
        self.memsets.append((ptr, value, count, stream))
        return self.status

    def reset(self) -> RecordingDriver:
        self.calls.clear()
        self.dependent.clear()
        self.memsets.clear()
        self.device = 0
        self.status = 0
        return self

    def current_device(self) -> int:
        return self.device


_SHARED: RecordingDriver | None = None


def recording_driver() -> RecordingDriver:
    """The one recording driver (its compiled launch is built once per process), emptied."""
    global _SHARED
    if _SHARED is None:
        _SHARED = RecordingDriver()
    return _SHARED.reset()
