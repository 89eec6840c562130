"""Choose between a real GPU and Numba's CUDA simulator, once, before ``numba.cuda`` is imported.

With ``NUMBA_ENABLE_CUDASIM`` unset, the CUDA driver is probed; when it is missing or sees no device
the simulator is switched on, with a warning, so that the package still imports and runs (slowly)
on CPU-only machines. Set ``NUMBA_ENABLE_CUDASIM=0`` to forbid the fallback.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings

__all__ = ["SIMULATOR", "backend_name"]


def _driver_sees_a_gpu() -> bool:
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0:
        return False
    return libcuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


def _choose_simulator() -> bool:
    if "numba.cuda" in sys.modules:  # too late to choose: follow what numba already decided
        from numba.cuda.core import config

        return bool(config.ENABLE_CUDASIM)
    requested = os.environ.get("NUMBA_ENABLE_CUDASIM", "").strip()
    if requested:
        return requested != "0"
    if _driver_sees_a_gpu():
        return False
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    warnings.warn(
        "baracuda_numba: no CUDA GPU found; running on Numba's CUDA simulator (slow, CPU only). "
        "Set NUMBA_ENABLE_CUDASIM=0 to make this an error instead.",
        RuntimeWarning,
        stacklevel=3,
    )
    return True


SIMULATOR: bool = _choose_simulator()


def backend_name() -> str:
    """``"simulator"`` or the name of the current CUDA device."""
    if SIMULATOR:
        return "simulator"
    from numba import cuda

    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)
