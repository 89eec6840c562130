"""Choose between a real GPU and Numba's CUDA simulator, once, when the package is imported, without
initializing the CUDA driver and without touching the process environment.

How the choice is made (the first rule that applies):

1. ``numba.cuda`` is already imported: follow what numba chose (``numba.core.config.ENABLE_CUDASIM``).
2. ``NUMBA_ENABLE_CUDASIM`` is set: any value but ``0`` chooses the simulator (silently); ``0`` forbids
   it, and when the probe below finds no GPU the first thing that needs one raises
   :class:`~baracuda_numba.errors.DeviceUnavailable` in one line (:func:`require_device`).
3. Otherwise the probe decides: no GPU means the simulator, with a ``RuntimeWarning`` the first time
   an op needs the device (:func:`require_device`), pointing at the caller's line.

The probe (:func:`probe`) never calls ``cuInit``: initializing the driver in the importing process
would make every later ``fork`` (DataLoader workers, vLLM's worker pools, ``multiprocessing``)
unusable for CUDA in the children. It reads, in order:

- whether ``libcuda.so.1`` can be loaded (``dlopen`` alone runs no driver initialization): without
  it there is no GPU;
- the device count from NVML (``libnvidia-ml.so.1``: ``nvmlInit`` / ``nvmlDeviceGetCount`` /
  ``nvmlShutdown``), which talks to the kernel driver without creating a CUDA context (PyTorch's
  ``PYTORCH_NVML_BASED_CUDA_CHECK`` relies on the same property for fork safety), narrowed by
  ``CUDA_VISIBLE_DEVICES`` as the CUDA runtime reads it (entries up to the first invalid one);
- when NVML cannot be loaded but the driver can, a GPU is assumed, and numba reports the driver's
  own error at the first launch if there is none.

Alternatives weighed: ``cuInit`` in-process (accurate, but the side effect to avoid); a child process
that calls ``cuInit`` (accurate and fork-safe, but a Python start-up and a driver initialization at
every import, and a process spawned by an import); ``/proc/driver/nvidia/gpus`` (Linux only, no WSL,
blind to ``CUDA_VISIBLE_DEVICES``).

The simulator is switched on by setting numba's configuration attribute ``ENABLE_CUDASIM`` in this
process before ``numba.cuda`` is first imported, never ``os.environ``: child processes see the
environment the user left and decide for themselves. numba keeps an attribute set this way until
a ``NUMBA_*`` environment variable changes and its compiler re-reads the environment; a program
without a GPU that changes one after import should set ``NUMBA_ENABLE_CUDASIM=1`` itself.
Nothing here creates a CUDA context: the first op that runs on the GPU does (through numba).
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings

__all__ = ["SIMULATOR", "UNAVAILABLE", "REASON", "probe", "backend_name", "require_device"]

_NVML_SUCCESS = 0


def _visible_count(devices: int, visible: str | None) -> int:
    """How many of ``devices`` GPUs ``CUDA_VISIBLE_DEVICES=visible`` leaves: its entries up to the
    first invalid one (an index out of range, a negative one, or text that is no ``GPU-`` / ``MIG-``
    identifier), as the CUDA runtime reads the variable; unset: all."""
    if visible is None:
        return devices
    count = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if entry.startswith(("GPU-", "MIG-")):
            count += 1
            continue
        try:
            index = int(entry)
        except ValueError:
            break
        if not 0 <= index < devices:
            break
        count += 1
    return min(count, devices)


def _nvml_device_count() -> int | None:
    """The GPUs NVML sees, or None when NVML cannot be loaded or initialized."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    init = getattr(nvml, "nvmlInit_v2", None) or getattr(nvml, "nvmlInit", None)
    get_count = getattr(nvml, "nvmlDeviceGetCount_v2", None) or getattr(nvml, "nvmlDeviceGetCount", None)
    if init is None or get_count is None or init() != _NVML_SUCCESS:
        return None
    try:
        count = ctypes.c_uint(0)
        return count.value if get_count(ctypes.byref(count)) == _NVML_SUCCESS else None
    finally:
        nvml.nvmlShutdown()


def probe(environ: dict[str, str] | None = None) -> str | None:
    """Why this machine has no usable GPU, or None when it has one (or may have one: NVML missing
    where the driver is present). Never initializes the CUDA driver (see the module docstring).
    ``environ`` (default ``os.environ``) supplies ``CUDA_VISIBLE_DEVICES``."""
    environ = os.environ if environ is None else environ
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver (libcuda.so.1 not found)"
    devices = _nvml_device_count()
    if devices is None:
        return None
    if devices == 0:
        return "a CUDA driver whose NVML sees no GPU"
    if _visible_count(devices, environ.get("CUDA_VISIBLE_DEVICES")) == 0:
        return f"CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES')!r} hides every GPU"
    return None


def _choose() -> tuple[bool, str | None, str]:
    """``(simulate, why the GPU is unavailable when the simulator is forbidden, why the simulator)``."""
    if "numba.cuda" in sys.modules:  # too late to choose: follow what numba already decided
        from numba.core import config

        return bool(config.ENABLE_CUDASIM), None, "numba.cuda was imported with the simulator on"
    requested = os.environ.get("NUMBA_ENABLE_CUDASIM", "").strip()
    if requested == "0":
        return False, probe(), ""
    if requested:
        return True, None, f"NUMBA_ENABLE_CUDASIM={requested}"
    missing = probe()
    if missing is None:
        return False, None, ""
    from numba.core import config  # numba-cuda's config is this module (numba.cuda.core.config aliases it)

    config.ENABLE_CUDASIM = 1
    return True, None, missing


SIMULATOR, UNAVAILABLE, REASON = _choose()
# Whether the no-GPU warning is still to be given (once, at the first op: see require_device).
_warn_pending = SIMULATOR and not os.environ.get("NUMBA_ENABLE_CUDASIM", "").strip()

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _outside_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by this module's caller point at the first frame
    outside the package (the user's line), counting frames as :func:`warnings.warn` does (it skips
    the import machinery's)."""
    level, frame = 1, sys._getframe(1)  # level 1: the frame that calls warnings.warn
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        while frame is not None and _import_machinery(frame.f_code.co_filename):
            frame = frame.f_back
        level += 1
    return level


def _import_machinery(filename: str) -> bool:
    return "importlib" in filename and "_bootstrap" in filename


SIMULATOR_WARNING = "baracuda_numba: no CUDA GPU found"


def _warn_simulator() -> None:
    global _warn_pending
    _warn_pending = False
    message = (f"{SIMULATOR_WARNING} ({REASON}); running on Numba's CUDA simulator (slow, CPU only). Set "
               "NUMBA_ENABLE_CUDASIM=1 to choose it without this warning, or NUMBA_ENABLE_CUDASIM=0 to raise "
               "DeviceUnavailable instead.")
    if sys.version_info >= (3, 12):
        warnings.warn(message, RuntimeWarning, skip_file_prefixes=(_PACKAGE_DIR,))
    else:
        warnings.warn(message, RuntimeWarning, stacklevel=_outside_stacklevel())


def require_device(where: str) -> None:
    """Raise :class:`~baracuda_numba.errors.DeviceUnavailable` (one line, naming ``where``) when the
    simulator is forbidden (``NUMBA_ENABLE_CUDASIM=0``) and the probe found no GPU; on the simulator
    chosen for want of a GPU, warn once (``RuntimeWarning``, at the caller's line)."""
    if _warn_pending:
        _warn_simulator()
    if UNAVAILABLE is not None:
        from .errors import DeviceUnavailable, problem_message

        raise DeviceUnavailable(problem_message(
            where, "device", "a CUDA GPU (NUMBA_ENABLE_CUDASIM=0 forbids the simulator)", UNAVAILABLE))


def backend_name() -> str:
    """``"simulator"`` or the name of the current CUDA device (this initializes the driver)."""
    if SIMULATOR:
        return "simulator"
    require_device("backend_name")
    from numba import cuda

    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)
