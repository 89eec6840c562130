"""Kernel launches with the least host work, and stream resolution.

On a GPU a compiled kernel is launched with one ``cuLaunchKernel`` call whose parameters were
packed by one ``struct.pack_into`` into a buffer built at plan selection (numba's array ABI:
``meminfo, parent, nitems, itemsize, data, shape, strides`` for each 1-D array), skipping numba's
per-call typing and argument wrapping (~45 us per launch). Under the simulator the numba dispatcher
is called with NumPy arrays wrapped so that aliasing views are not copied apart.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import BaracudaError, InvalidOperand, problem_message
from .platform import SIMULATOR

__all__ = ["ArrayArg", "KernelLauncher", "ParameterBlock", "array_values", "stream_handle", "synchronize",
           "torch_current_stream"]

# One 8-byte parameter slot per kernel parameter; a float32 occupies the first 4 bytes of its slot.
_SLOT_FORMAT = {np.int64: "q", np.int32: "ixxxx", np.float32: "fxxxx", np.float64: "d", np.bool_: "?xxxxxxx"}
_ARRAY_FORMAT = "qqqqqqq"  # meminfo, parent, nitems, itemsize, data, shape[0], strides[0]
_DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a kernel may use without opting in
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_STREAM_OBJECTS = 64  # CUstream objects the launcher keeps (one per raw stream handle seen)


class ArrayArg(tuple):
    """A flat array argument ``(ptr, nitems, itemsize, host)``; ``host`` is the NumPy view used
    under the simulator (None on a GPU)."""

    __slots__ = ()

    def __new__(cls, ptr: int, nitems: int, itemsize: int, host: np.ndarray | None = None):
        return tuple.__new__(cls, (ptr, nitems, itemsize, host))


class ParameterBlock:
    """The kernel parameter block: one 8-byte slot per parameter, in numba's kernel ABI, and the
    array of pointers to the slots that ``cuLaunchKernel`` takes.

    ``pack`` writes every slot; ``set_template`` stores a full block once so that ``patch`` then
    rewrites only the slots that change between calls (pointers, steps, scalars) with three slice
    assignments: 0.5 us against 1.4 us for copying and packing all 67 values (on a 2-core x86 host).
    """

    def __init__(self, n_arrays: int, scalar_types: Sequence[type]) -> None:
        layout = "<" + _ARRAY_FORMAT * n_arrays + "".join(_SLOT_FORMAT[t] for t in scalar_types)
        self._packer = struct.Struct(layout)
        self.n_params = 7 * n_arrays + len(scalar_types)
        self.buffer = ctypes.create_string_buffer(8 * self.n_params)
        base = ctypes.addressof(self.buffer)
        self._param_pointers = (ctypes.c_void_p * self.n_params)(*(base + 8 * i for i in range(self.n_params)))
        self.params_address = ctypes.addressof(self._param_pointers)
        self._int64 = (ctypes.c_int64 * self.n_params).from_buffer(self.buffer)
        self._template: bytes | None = None
        self._holds_template = False

    def pack(self, values: Sequence[Any]) -> None:
        """Write every slot from the flat parameter values."""
        self._packer.pack_into(self.buffer, 0, *values)
        self._holds_template = False

    def set_template(self, values: Sequence[Any], int_slots: Sequence[slice], scalar_slots: range,
                     scalar_type: type) -> None:
        """Keep ``values`` packed; ``patch`` then writes groups of int64 slots (each group a
        ``slice`` of slot indices: one C-level slice assignment per group, not one Python store per
        slot) and the ``scalar_type`` (float32 / float64) ``scalar_slots``."""
        self._template = self._packer.pack(*values)
        self._int_slots = tuple(int_slots)
        if np.dtype(scalar_type) == np.float32:  # a float32 sits in the first 4 bytes of its slot
            self._scalars = (ctypes.c_float * (2 * self.n_params)).from_buffer(self.buffer)
            self._scalar_slice = slice(2 * scalar_slots.start, 2 * scalar_slots.stop, 2 * scalar_slots.step)
        else:
            self._scalars = (ctypes.c_double * self.n_params).from_buffer(self.buffer)
            self._scalar_slice = slice(scalar_slots.start, scalar_slots.stop, scalar_slots.step)
        self._holds_template = False

    def patch(self, int_groups: Sequence[Sequence[int]], scalars: Sequence[Any]) -> None:
        """The template with each group of ints and the scalars in their slots (``ValueError`` when a
        group's length is not its slice's)."""
        if not self._holds_template:
            ctypes.memmove(self.buffer, self._template, len(self._template))
            self._holds_template = True
        slots = self._int64
        for where, values in zip(self._int_slots, int_groups, strict=True):
            slots[where] = values
        self._scalars[self._scalar_slice] = scalars

    def raw(self) -> bytes:
        return self.buffer.raw


class KernelLauncher:
    """Launches one compiled kernel given ``n_arrays`` 1-D arrays then scalars of ``scalar_types``,
    with ``shared_bytes`` of dynamic shared memory per block (above 48 KiB the kernel is opted in)."""

    def __init__(self, compile_dispatcher: Callable[[], Any], n_arrays: int, scalar_types: Sequence[type],
                 shared_bytes: int = 0) -> None:
        self._compile = compile_dispatcher
        self._shared_bytes = shared_bytes
        self._n_arrays = n_arrays
        self._scalar_types = tuple(scalar_types)
        self._lock = threading.Lock()
        self._functions: dict[int, int] = {}  # raw handles
        self._launchable: dict[int, Any] = {}  # the same as _Driver.function objects
        if not SIMULATOR:
            self.params = ParameterBlock(n_arrays, self._scalar_types)

    def _function(self, device_id: int) -> Any:
        """The kernel's handle on ``device_id`` as the launch takes it (compiled and loaded on first use)."""
        function = self._functions.get(device_id)
        if function is None:
            from numba import cuda

            with cuda.gpus[device_id]:
                dispatcher = self._compile()
                overload = next(iter(dispatcher.overloads.values()))
                function = int(overload._codelibrary.get_cufunc().handle)
                static = overload.shared_mem_per_block
                if self._shared_bytes and static + self._shared_bytes > _DEFAULT_SHARED_LIMIT:
                    # The attribute belongs to the function, which several launchers (plans of other
                    # shapes) share: allow all the device can give, not this launcher's bytes, so
                    # that no launcher lowers it under another's.
                    allowed = cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN - static
                    if self._shared_bytes > allowed:
                        raise BaracudaError(f"{self._shared_bytes} bytes of dynamic shared memory asked, the "
                                            f"device allows {allowed} next to the kernel's {static} static")
                    error = _driver().set_max_dynamic_shared(function, allowed, device_id)
                    if error:
                        raise BaracudaError(f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, "
                                            f"{allowed}) failed with CUresult {error}")
                self._functions[device_id] = function
                self._launchable[device_id] = _driver().function(function)
        return self._launchable[device_id]

    def launch(self, blocks: int, threads: int, stream: int, arrays: Sequence[ArrayArg],
               scalars: Sequence[Any], device_id: int = 0) -> None:
        if SIMULATOR:
            self._launch_simulated(blocks, threads, arrays, scalars)
            return
        values: list[Any] = []
        for ptr, nitems, itemsize, _ in arrays:
            values += (0, 0, nitems, itemsize, ptr, nitems, itemsize)
        values += scalars
        self.launch_values(blocks, threads, stream, values, device_id)

    def launch_values(self, blocks: int, threads: int, stream: int, values: Sequence[Any], device_id: int = 0) -> None:
        """Launch with the flat parameter values (see :func:`array_values`) already in order."""
        self._launch(blocks, threads, stream, device_id, self.params.pack, values)

    def launch_patched(self, blocks: int, threads: int, stream: int, int_groups: Sequence[Sequence[int]],
                       scalars: Sequence[Any], device_id: int = 0) -> None:
        """Launch with the template (:meth:`ParameterBlock.set_template`) patched by ``int_groups`` and
        ``scalars``. The hot path of every elementwise call: written out flat, no per-call closures."""
        function = self._launchable.get(device_id)
        driver = _driver()
        if function is None or driver.current_device() != device_id:
            self._launch(blocks, threads, stream, device_id, self.params.patch, int_groups, scalars)
            return
        params = self.params
        with self._lock:  # the parameter block is shared by the threads launching this kernel
            params.patch(int_groups, scalars)
            driver.launch(function, blocks, threads, self._shared_bytes, stream, params.params_address)

    def _launch(self, blocks: int, threads: int, stream: int, device_id: int, fill: Callable, *fill_args: Any) -> None:
        function = self._function(device_id)
        driver = _driver()
        current = driver.current_device()
        if current != device_id:
            from numba import cuda

            if current == -1 and device_id == 0:
                cuda.current_context()  # a thread with no context yet: make device 0's current for good
            else:  # another device's context is current: switch for this launch only
                with cuda.gpus[device_id]:
                    self._launch_locked(driver, function, blocks, threads, stream, fill, fill_args)
                return
        self._launch_locked(driver, function, blocks, threads, stream, fill, fill_args)

    def _launch_locked(self, driver, function, blocks, threads, stream, fill, fill_args) -> None:
        with self._lock:  # the parameter block is shared by the threads launching this kernel
            fill(*fill_args)
            driver.launch(function, blocks, threads, self._shared_bytes, stream, self.params.params_address)

    def _launch_simulated(self, blocks, threads, arrays, scalars) -> None:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        dispatcher = self._compile()
        args = [FakeCUDAArray(a[3]) for a in arrays]
        args += [t(v) for t, v in zip(self._scalar_types, scalars, strict=True)]
        dispatcher[blocks, threads, 0, self._shared_bytes](*args)


def array_values(ptr: int, nitems: int, itemsize: int) -> tuple[int, ...]:
    """The seven parameter values of a flat C-contiguous array in numba's kernel ABI."""
    return (0, 0, nitems, itemsize, ptr, nitems, itemsize)


class _Driver:
    """The driver entry points of the hot path, loaded on first use.

    The launch goes through cuda.bindings' Cython wrapper with the function and stream handle
    objects built once (``CUfunction`` per kernel, ``CUstream`` per raw stream): 7.5 us a launch
    on an H100 host against 9.6 us through ctypes with ``argtypes`` conversion (``host_floor.py``,
    2026-11-23). The rest stays on ctypes, which needs no handle objects.
    """

    def __init__(self) -> None:
        from cuda.bindings import driver as cuda_driver

        libcuda = ctypes.CDLL("libcuda.so.1")
        self._cuda = cuda_driver
        self._launch_kernel = cuda_driver.cuLaunchKernel
        self._success = cuda_driver.CUresult.CUDA_SUCCESS
        self._streams: dict[int, Any] = {}
        self.stream_synchronize = libcuda.cuStreamSynchronize
        self.stream_synchronize.argtypes = [ctypes.c_void_p]
        self.stream_synchronize.restype = ctypes.c_int
        self._ctx_get_device = libcuda.cuCtxGetDevice
        self._ctx_get_device.argtypes = [ctypes.POINTER(ctypes.c_int)]
        self._ctx_get_device.restype = ctypes.c_int
        self._device = ctypes.c_int(0)
        self._device_ref = ctypes.pointer(self._device)  # built once: byref per call is a third of the call
        self._func_set_attribute = libcuda.cuFuncSetAttribute
        self._func_set_attribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self._func_set_attribute.restype = ctypes.c_int
        self._kernel_set_attribute = libcuda.cuKernelSetAttribute
        self._kernel_set_attribute.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        self._kernel_set_attribute.restype = ctypes.c_int

    def function(self, handle: int) -> Any:
        """The ``CUfunction`` object of a raw function (or library kernel) handle, for :meth:`launch`."""
        return self._cuda.CUfunction(handle)

    def launch(self, function: Any, blocks: int, threads: int, shared_bytes: int, stream: int,
               params_address: int) -> None:
        """``cuLaunchKernel`` of ``function`` (from :meth:`function`) on a 1-D grid, the parameters
        at ``params_address`` (an array of pointers to the slots); ``BaracudaError`` on failure."""
        handle = self._streams.get(stream)
        if handle is None:
            if len(self._streams) >= _STREAM_OBJECTS:  # handles of destroyed streams are never looked up again
                self._streams.clear()
            handle = self._streams[stream] = self._cuda.CUstream(stream)
        error = self._launch_kernel(function, blocks, 1, 1, threads, 1, 1, shared_bytes, handle, params_address,
                                    0)[0]
        if error is not self._success:
            raise BaracudaError(f"cuLaunchKernel failed with CUresult {int(error)} ({error.name})")

    def set_max_dynamic_shared(self, function: int, nbytes: int, device_id: int) -> int:
        """Let ``function`` launch with up to ``nbytes`` of dynamic shared memory (a CUresult). numba
        loads modules as libraries, whose handles are ``CUkernel`` (cuKernelSetAttribute, per
        device); a ``CUfunction`` takes cuFuncSetAttribute."""
        error = self._kernel_set_attribute(_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes, function, device_id)
        if error:
            error = self._func_set_attribute(function, _MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        return error

    def current_device(self) -> int:
        """Ordinal of the current context's device, or -1 when no context is current."""
        if self._ctx_get_device(self._device_ref):
            return -1
        return self._device.value


@functools.cache
def _driver() -> _Driver:
    return _Driver()


def synchronize(stream: int) -> None:
    """Wait for ``stream`` (a raw handle) on the host."""
    if SIMULATOR:
        return
    error = _driver().stream_synchronize(stream)
    if error:
        raise BaracudaError(f"cuStreamSynchronize failed with CUresult {error}")


@functools.cache
def _torch_stream_getter() -> Callable[[int], int]:
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # one C call, no Stream object
    if raw is not None:
        return raw
    return lambda device_id: torch.cuda.current_stream(device_id).cuda_stream


def torch_current_stream(device_id: int) -> int:
    """The raw handle of PyTorch's current stream on ``device_id``."""
    return _torch_stream_getter()(device_id)


def stream_handle(stream: Any, operands: Sequence[Any], where: str) -> int:
    """The raw ``CUstream`` handle to launch on.

    ``stream`` may be None (the current PyTorch / CuPy stream when an operand comes from that
    framework, else the legacy default stream), an integer handle, or any object implementing
    ``__cuda_stream__`` (numba and cuda.core streams), a ``torch.cuda.Stream`` or a CuPy stream.
    """
    if stream is None:
        for op in operands:
            if op.origin == "torch":
                return torch_current_stream(op.device_id)
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
