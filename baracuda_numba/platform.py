"""Choose between a real GPU and Numba's CUDA simulator, once, before ``numba.cuda`` is imported.

With ``NUMBA_ENABLE_CUDASIM`` unset, the CUDA driver is probed; when it is missing or sees no device
the simulator is switched on, with a warning, so that the package still imports and runs (slowly)
on CPU-only machines. Set ``NUMBA_ENABLE_CUDASIM=0`` to forbid the fallback: the package still
imports, and every plan selection (hence every op) and the command line then raise
:class:`~baracuda_numba.errors.DeviceUnavailable` (one line) instead of numba's driver traceback.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings

from .errors import DeviceUnavailable

__all__ = ["SIMULATOR", "UNAVAILABLE", "backend_name", "require_device"]


def _why_no_gpu() -> str | None:
    """None when the CUDA driver sees a device, else why not (one line)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver (libcuda.so.1 not found)"
    count = ctypes.c_int(0)
    status = libcuda.cuInit(0)
    if status != 0:
        return f"the CUDA driver failed to initialise (cuInit error {status})"
    if libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "the CUDA driver sees no device"
    return None


def _choose_backend() -> tuple[bool, str | None]:
    """``(simulator?, why the GPU that was required is unusable or None)``."""
    if "numba.cuda" in sys.modules:  # too late to choose: follow what numba already decided
        from numba.cuda.core import config

        return bool(config.ENABLE_CUDASIM), None
    requested = os.environ.get("NUMBA_ENABLE_CUDASIM", "").strip()
    if requested and requested != "0":
        return True, None
    why = _why_no_gpu()
    if requested:  # "0": the simulator is refused; remember why the GPU cannot be used
        return False, why
    if why is None:
        return False, None
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    warnings.warn(
        f"baracuda_numba: {why}; running on Numba's CUDA simulator (slow, CPU only). "
        "Set NUMBA_ENABLE_CUDASIM=0 to refuse the simulator: ops then raise baracuda_numba.DeviceUnavailable.",
        RuntimeWarning,
        stacklevel=3,
    )
    return True, None


SIMULATOR, UNAVAILABLE = _choose_backend()
"""``SIMULATOR``: kernels run on Numba's CUDA simulator. ``UNAVAILABLE``: why the GPU demanded by
``NUMBA_ENABLE_CUDASIM=0`` cannot be used (None when it can, or when the simulator runs)."""


def require_device() -> None:
    """Raise :class:`DeviceUnavailable` when ``NUMBA_ENABLE_CUDASIM=0`` was set and there is no usable GPU."""
    if UNAVAILABLE is not None:
        raise DeviceUnavailable(f"baracuda_numba: NUMBA_ENABLE_CUDASIM=0 requires a CUDA GPU, but {UNAVAILABLE}; "
                                "unset NUMBA_ENABLE_CUDASIM to run on the (slow) simulator")


def backend_name() -> str:
    """``"simulator"`` or the name of the current CUDA device."""
    if SIMULATOR:
        return "simulator"
    require_device()
    from numba import cuda

    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)
