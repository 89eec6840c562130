"""Choose between a real GPU and Numba's CUDA simulator, once, before ``numba.cuda`` is imported.

With ``NUMBA_ENABLE_CUDASIM`` unset, the CUDA driver is probed; when it is missing or sees no device
the simulator is switched on, with a warning, so that the package still imports and runs (slowly)
on CPU-only machines. ``NUMBA_ENABLE_CUDASIM=0`` forbids the fallback: the package still imports,
and the first thing that needs the GPU raises :class:`~baracuda_numba.errors.DeviceUnavailable` in one
line (see :func:`require_device`) instead of a CUDA-driver traceback from inside numba.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings

__all__ = ["SIMULATOR", "UNAVAILABLE", "backend_name", "require_device"]


def _missing_gpu() -> str | None:
    """Why the CUDA driver cannot run kernels here, or None when it sees a GPU."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver (libcuda.so.1 not found)"
    error = libcuda.cuInit(0)
    if error != 0:
        return f"a CUDA driver that failed to initialise (cuInit returned CUresult {error})"
    count = ctypes.c_int(0)
    if libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return "a CUDA driver that sees no device"
    return None


def _choose_simulator() -> tuple[bool, str | None]:
    """``(simulate, why the GPU is unavailable)``; the reason is set only when the simulator is forbidden."""
    if "numba.cuda" in sys.modules:  # too late to choose: follow what numba already decided
        from numba.cuda.core import config

        return bool(config.ENABLE_CUDASIM), None
    requested = os.environ.get("NUMBA_ENABLE_CUDASIM", "").strip()
    if requested:
        return (True, None) if requested != "0" else (False, _missing_gpu())
    if _missing_gpu() is None:
        return False, None
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    warnings.warn(
        "baracuda_numba: no CUDA GPU found; running on Numba's CUDA simulator (slow, CPU only). "
        "Set NUMBA_ENABLE_CUDASIM=1 to choose it without this warning, or NUMBA_ENABLE_CUDASIM=0 to raise "
        "DeviceUnavailable instead.",
        RuntimeWarning,
        stacklevel=3,
    )
    return True, None


SIMULATOR, UNAVAILABLE = _choose_simulator()


def require_device(where: str) -> None:
    """Raise :class:`~baracuda_numba.errors.DeviceUnavailable` (one line, naming ``where``) when the
    simulator is forbidden (``NUMBA_ENABLE_CUDASIM=0``) and the driver has no GPU to run on."""
    if UNAVAILABLE is not None:
        from .errors import DeviceUnavailable, problem_message

        raise DeviceUnavailable(problem_message(
            where, "device", "a CUDA GPU (NUMBA_ENABLE_CUDASIM=0 forbids the simulator)", UNAVAILABLE))


def backend_name() -> str:
    """``"simulator"`` or the name of the current CUDA device."""
    if SIMULATOR:
        return "simulator"
    require_device("backend_name")
    from numba import cuda

    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)
