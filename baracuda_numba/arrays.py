"""Array adaptation: whatever the caller passes, as a flat device operand a kernel can read.

Accepted: numba device arrays, anything with ``__cuda_array_interface__`` (CuPy, numba) or
``__dlpack__`` (PyTorch tensors, bfloat16 included, JAX...), PyTorch tensors directly (fast path),
and host NumPy arrays (``ml_dtypes.bfloat16`` included) or CPU tensors, which are staged through
device memory. A numba ``uint16`` array holding bfloat16 bits is marked with :func:`bfloat16_view`,
never guessed. Results take the kind of the primary input: NumPy in, NumPy out; torch in, torch
out; CuPy in, CuPy out; numba in, numba out.

Under the CUDA simulator device memory is host memory, so every operand is a NumPy array.
"""

from __future__ import annotations

import ctypes
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidOperand, InvalidProblem, MisalignedOperand, problem_message
from .platform import SIMULATOR, require_device
from .vocabulary import ElementKind, element_kind

__all__ = ["Operand", "Bfloat16Array", "bfloat16_view", "adapt", "allocate_like", "scalar_value"]

_ACCEPTED = ("a numba device array, a torch tensor, a CuPy array, an object with "
             "__cuda_array_interface__ or __dlpack__, or a NumPy array")


@dataclass(frozen=True)
class Bfloat16Array:
    """A device array of ``uint16`` that holds bfloat16 bit patterns (a tagged view, not a copy)."""

    storage: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.storage.shape)

    @property
    def dtype(self) -> str:
        return "bfloat16"

    def copy_to_host(self) -> np.ndarray:
        """The values as a host ``ml_dtypes.bfloat16`` array."""
        return np.asarray(self.storage.copy_to_host()).view(ElementKind.BF16.numpy_dtype)


def bfloat16_view(storage: Any) -> Bfloat16Array:
    """Mark a ``uint16`` device array (numba, CuPy) as holding bfloat16 values."""
    dtype = np.dtype(getattr(storage, "dtype", None))
    if dtype != np.uint16:
        raise InvalidOperand(problem_message("bfloat16_view", "storage", "a uint16 array", dtype))
    return Bfloat16Array(storage)


class Operand:
    """One array argument, resolved: element kind, shape, and where its bytes are.

    ``ptr`` is a device address (0 under the simulator), ``host`` the flat host storage when the
    bytes live on the host (simulator, or a NumPy input staged to the device), ``device_copy`` the
    numba device array staging a host operand on a GPU.
    """

    __slots__ = (
        "contiguous",
        "device_copy",
        "device_id",
        "element",
        "host",
        "keepalive",
        "obj",
        "on_host",
        "origin",
        "ptr",
        "shape",
        "size",
    )

    def __init__(self, obj, origin, element, shape, ptr, contiguous, host=None,
                 device_copy=None, device_id=0, keepalive=None):
        self.obj = obj
        self.origin = origin  # "numpy", "torch", "torch_cpu", "cupy", "numba", "cai", "dlpack"
        self.element = element
        self.shape = shape
        self.size = math.prod(shape)
        self.ptr = ptr
        self.contiguous = contiguous
        self.host = host
        self.device_copy = device_copy
        self.device_id = device_id
        self.keepalive = keepalive
        self.on_host = origin in ("numpy", "torch_cpu")  # bytes staged from the host: copied back after

    def __repr__(self) -> str:
        return f"Operand({self.origin}, {self.element.short}, shape={self.shape})"


def _c_contiguous(shape, strides, itemsize) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides), strict=True):
        if dim == 0:
            return True
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _element_from_numpy(dtype: np.dtype, where: str, argument: str) -> ElementKind:
    try:
        return element_kind(dtype)
    except TypeError:
        hint = " (mark bfloat16 bits with baracuda_numba.bfloat16_view)" if dtype == np.uint16 else ""
        raise InvalidOperand(problem_message(where, argument, "a supported dtype" + hint, dtype)) from None


def _from_host(array: np.ndarray, obj, origin, where, argument, element=None, copy=True) -> Operand:
    """A host array; ``element`` is given when ``array`` holds another dtype's bits (torch bf16).

    On a GPU the bytes are staged in device memory: copied there, or only allocated (``copy=False``)
    for an output the kernel overwrites.
    """
    if element is None:
        element = _element_from_numpy(array.dtype, where, argument)
    shape = tuple(array.shape)
    if not array.flags.c_contiguous:
        return Operand(obj, origin, element, shape, 0, False)
    flat = array.reshape(-1).view(element.storage_dtype)
    if SIMULATOR:
        return Operand(obj, origin, element, shape, 0, True, host=flat)
    require_device(where)
    from numba import cuda

    staged = cuda.to_device(flat) if copy else cuda.device_array(flat.shape, flat.dtype)
    return Operand(obj, origin, element, shape, staged.device_ctypes_pointer.value or 0, True,
                   host=flat, device_copy=staged)


_TORCH_ELEMENTS: dict[Any, ElementKind] = {}


def _from_torch(tensor, where, argument) -> Operand:
    dtype = tensor.dtype
    element = _TORCH_ELEMENTS.get(dtype)
    if element is None:
        try:
            element = _TORCH_ELEMENTS[dtype] = element_kind(dtype)
        except TypeError:
            raise InvalidOperand(problem_message(where, argument, "a supported dtype", dtype)) from None
    shape = tuple(tensor.shape)
    contiguous = tensor.is_contiguous()
    if not tensor.is_cuda or SIMULATOR:
        if tensor.is_cuda:
            raise InvalidOperand(problem_message(where, argument, "a CPU tensor under the simulator", "a CUDA tensor"))
        if not contiguous:
            return Operand(tensor, "torch_cpu", element, shape, 0, False)
        return _from_host(_numpy_storage(tensor, element), tensor, "torch_cpu", where, argument, element)
    return Operand(tensor, "torch", element, shape, tensor.data_ptr(), contiguous,
                   device_id=tensor.get_device())


def _from_cai(obj, cai, origin, where, argument, element=None) -> Operand:
    typestr = cai["typestr"]
    if element is None:
        element = _element_from_numpy(np.dtype(typestr), where, argument)
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    ptr = cai["data"][0] or 0
    contiguous = _c_contiguous(shape, strides, np.dtype(typestr).itemsize)
    if SIMULATOR:
        raise InvalidOperand(problem_message(where, argument, "host arrays under the simulator", type(obj).__name__))
    return Operand(obj, origin, element, shape, ptr, contiguous)


# DLPack structures (dlpack.h v0.8), read with ctypes so no framework import is needed.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CODES = {(0, 8): ElementKind.S8, (1, 8): ElementKind.U8, (0, 32): ElementKind.I32,
             (2, 16): ElementKind.F16, (2, 32): ElementKind.F32, (2, 64): ElementKind.F64,
             (4, 16): ElementKind.BF16}
_DL_CUDA = 2
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj, where, argument) -> Operand:
    device_type, device_id = obj.__dlpack_device__()
    if device_type != _DL_CUDA or SIMULATOR:
        return _from_host(np.from_dlpack(obj), obj, "numpy", where, argument)
    capsule = obj.__dlpack__()
    tensor = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    code = (tensor.dtype.code, tensor.dtype.bits)
    element = _DL_CODES.get(code)
    if element is None or tensor.dtype.lanes != 1:
        raise InvalidOperand(problem_message(where, argument, "a supported dtype", f"DLPack dtype {code}"))
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = (tuple(tensor.strides[i] * element.itemsize for i in range(tensor.ndim))
               if tensor.strides else None)
    ptr = (tensor.data or 0) + tensor.byte_offset
    contiguous = _c_contiguous(shape, strides, element.itemsize)
    # The capsule keeps the producer's memory alive; its destructor releases it.
    return Operand(obj, "dlpack", element, shape, ptr, contiguous, device_id=device_id,
                   keepalive=capsule)


def adapt(obj: Any, where: str, argument: str) -> Operand:
    """Resolve ``obj`` to an :class:`Operand`; ``where`` and ``argument`` name it in errors."""
    if isinstance(obj, Operand):
        return obj
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):  # first: the hot path of most callers
        return _from_torch(obj, where, argument)
    if isinstance(obj, np.ndarray):
        return _from_host(obj, obj, "numpy", where, argument)
    if isinstance(obj, Bfloat16Array):
        storage = obj.storage
        if SIMULATOR:
            host = np.asarray(storage._ary).reshape(-1)
            return Operand(obj, "numba", ElementKind.BF16, tuple(storage.shape), 0,
                           storage._ary.flags.c_contiguous, host=host)
        op = _from_cai(obj, storage.__cuda_array_interface__, "numba", where, argument, ElementKind.BF16)
        return op
    if SIMULATOR and hasattr(obj, "_ary") and getattr(obj, "__cuda_ndarray__", False):
        array = obj._ary
        element = _element_from_numpy(array.dtype, where, argument)
        host = array.reshape(-1).view(element.storage_dtype) if array.flags.c_contiguous else None
        return Operand(obj, "numba", element, tuple(array.shape), 0, array.flags.c_contiguous, host=host)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        module = type(obj).__module__
        origin = "cupy" if module.startswith("cupy") else "numba" if module.startswith("numba") else "cai"
        return _from_cai(obj, cai, origin, where, argument)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, where, argument)
    if isinstance(obj, np.generic):
        return _from_host(np.asarray(obj), obj, "numpy", where, argument)
    raise InvalidOperand(problem_message(where, argument, _ACCEPTED, type(obj).__name__))


def require_contiguous(op: Operand, where: str, argument: str) -> None:
    if not op.contiguous:
        raise InvalidProblem(problem_message(where, argument, "a C-contiguous array",
                                             f"a non-contiguous array of shape {op.shape}"))
    if not SIMULATOR and op.ptr % op.element.itemsize:
        raise MisalignedOperand(problem_message(
            where, argument, f"an address aligned to {op.element.itemsize} bytes", hex(op.ptr)))


def _torch_dtype(element: ElementKind):
    import torch

    return {ElementKind.F16: torch.float16, ElementKind.BF16: torch.bfloat16, ElementKind.F32: torch.float32,
            ElementKind.F64: torch.float64, ElementKind.S8: torch.int8, ElementKind.U8: torch.uint8,
            ElementKind.I32: torch.int32, ElementKind.FP8_E4M3: torch.float8_e4m3fn,
            ElementKind.FP8_E5M2: torch.float8_e5m2}[element]


def _numpy_storage(tensor: Any, element: ElementKind) -> np.ndarray:
    """A CPU tensor as a NumPy array of its bits where NumPy lacks the dtype (bf16, float8)."""
    import torch

    if element is ElementKind.BF16:
        return tensor.view(torch.int16).numpy()
    if element.is_fp8:
        return tensor.view(torch.uint8).numpy()
    return tensor.numpy()


def allocate_like(like: Operand, shape: tuple[int, ...], element: ElementKind) -> Operand:
    """A new C-contiguous output with the kind (and device) of ``like``."""
    origin = like.origin
    if origin == "torch":
        import torch

        return adapt(torch.empty(shape, dtype=_torch_dtype(element), device=like.obj.device), "allocate", "out")
    if origin == "torch_cpu":
        import torch

        tensor = torch.empty(shape, dtype=_torch_dtype(element))
        return _from_host(_numpy_storage(tensor, element), tensor, "torch_cpu", "allocate", "out", element,
                          copy=False)
    if origin == "numpy" or (SIMULATOR and origin != "numba"):
        array = np.empty(shape, element.numpy_dtype)
        return _from_host(array, array, "numpy", "allocate", "out", copy=False)
    if origin == "cupy" and element is not ElementKind.BF16 and not element.is_fp8:
        import cupy

        with cupy.cuda.Device(like.device_id):
            return adapt(cupy.empty(shape, dtype=element.numpy_dtype), "allocate", "out")
    from numba import cuda

    storage = cuda.device_array(shape, dtype=element.storage_dtype)
    op = adapt(bfloat16_view(storage) if element is ElementKind.BF16 else storage, "allocate", "out")
    if element.is_fp8:  # numba has no float8 dtype: the result is a uint8 device array of FP8 bits
        op.element = element
    return op


def finish(op: Operand) -> Any:
    """Bring a written output back to its caller's world and return the caller-facing object.

    The caller has synchronised the launch stream when ``op`` is staged from the host.
    """
    if op.device_copy is not None:
        op.device_copy.copy_to_host(op.host)
    return op.obj


def scalar_value(value: Any, where: str, argument: str) -> float:
    """A Python float from a number, a NumPy scalar or a one-element array (device arrays are read)."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return value
    size = getattr(value, "size", None)
    if callable(size):  # torch.Tensor.size()
        size = value.numel()
    if size == 1:
        if hasattr(value, "item"):
            return value.item()
        if hasattr(value, "copy_to_host"):
            return value.copy_to_host().reshape(-1)[0].item()
    raise InvalidProblem(problem_message(where, argument, "a real number or a one-element array",
                                         type(value).__name__))


def sub_operand(base: Operand, offset: int, element: ElementKind, shape: tuple[int, ...]) -> Operand:
    """A C-contiguous view of ``base``'s bytes from ``offset`` (a slice of a plan's workspace)."""
    nbytes = math.prod(shape) * element.itemsize
    host = None
    if base.host is not None:
        host = base.host.view(np.uint8)[offset: offset + nbytes].view(element.storage_dtype)
    origin = "numpy" if SIMULATOR else "cai"
    return Operand(host, origin, element, shape, base.ptr + offset if base.ptr else 0, True, host=host,
                   device_id=base.device_id)
