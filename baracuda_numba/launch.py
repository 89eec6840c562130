"""Kernel launches with the least host work, and stream resolution.

On a GPU a compiled kernel is launched with one ``cuLaunchKernel`` call, made from numba-compiled
CPU code (:func:`~baracuda_numba._launch_jit.launch_record`, cached on disk by numba): it copies a parameter
buffer packed at plan selection (numba's
array ABI: ``meminfo, parent, nitems, itemsize, data, shape, strides`` for each 1-D array, then the
scalars), writes the pointers and scalars of the call into it and hands it to the driver through
``extra``. That skips numba's per-call typing and argument wrapping (~45 us per launch) and Python's
per-parameter work. The handle launched is the kernel's ``CUfunction`` in the device's context, resolved
once. The frame the driver reads lives on the compiled function's stack. Each launcher
calls that compiled function through the entry point numba compiled for its argument types,
and two launches that always go together (the W8A8 linear's quantizer and GEMM) are made by one compiled call
(:class:`LaunchPair`). Under the simulator the
numba dispatcher is called with NumPy arrays wrapped so that aliasing views are not copied apart.
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

from .cache import kernel_function
from .errors import BaracudaError, InvalidOperand, problem_message
from .platform import SIMULATOR

__all__ = ["ArrayArg", "KernelLauncher", "LaunchPair", "ParameterBlock", "DriverLaunches", "array_values",
           "function_address", "record_bytes", "stream_handle", "synchronize", "torch_current_stream", "zero_words",
           "fill_words", "driver_memory"]

# Each kernel parameter's struct code and size; parameters sit at their natural alignment, as in the
# kernel's .param space (what cuLaunchKernel's CU_LAUNCH_PARAM_BUFFER_POINTER takes).
_PARAM_FORMAT = {np.int64: ("q", 8), np.int32: ("i", 4), np.float32: ("f", 4), np.float64: ("d", 8),
                 np.bool_: ("?", 1)}
_ARRAY_SLOTS = 7  # numba's 1-D array: meminfo, parent, nitems, itemsize, data, shape[0], strides[0]
_DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a kernel may use without opting in
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
# A launch record (int64 words): the header, the patched int64 parameters' word indices, the patched
# floats' indices (in units of the float), then the packed parameter buffer. _DEPENDENT: launched with
# programmatic stream serialization (cuLaunchKernelEx).
_SHARED, _SIZE, _FLOAT32, _N_INTS, _N_FLOATS, _BUFFER_AT, _DEPENDENT = range(7)
_HEADER = 7
# cuLaunchKernelEx's CUlaunchConfig (7 words: grid, block, shared bytes, stream, attrs, numAttrs) followed
# by one CUlaunchAttribute (id, then a 64-byte value): CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_CONFIG_WORDS, _ATTRIBUTE_WORDS = 7, 9
_CONFIG_AT = 6  # in a launch's frame: `extra` (5 words), the buffer size, the config, the parameters
_FRAME_WORDS = _CONFIG_AT + _CONFIG_WORDS + _ATTRIBUTE_WORDS
_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_STACK_FRAME_WORDS = 512  # a launch frame up to this many words lives on the compiled launch's stack
_NO_FLOATS = (0.0,)  # the floats of a launch that patches none (the record says how many it reads)
_NO_INTS = (0,)
# Every launch takes the CUfunction of the current context (cuKernelGetFunction, resolved once per device) rather
# than the context-independent CUkernel that numba's library load gives, which the driver must map to the
# current context's function at each launch: about 1 us less a launch on an H100 host. And each launcher calls
# the compiled launch through the entry point numba compiled for the call's argument types, resolved once per
# launcher, rather than through its dispatcher, which types every argument and looks the overload up at each call
# (about 1 us a launch on an H100 host). docs/design-linear.md, "The launch path", has the measurements.


class ArrayArg(tuple):
    """A flat array argument ``(ptr, nitems, itemsize, host)``; ``host`` is the NumPy view used
    under the simulator (None on a GPU)."""

    __slots__ = ()

    def __new__(cls, ptr: int, nitems: int, itemsize: int, host: np.ndarray | None = None):
        return tuple.__new__(cls, (ptr, nitems, itemsize, host))


class ParameterBlock:
    """A kernel's parameters packed in numba's kernel ABI (each 1-D array as seven int64 words,
    then the scalars), at their natural alignment: the buffer ``cuLaunchKernel`` takes through
    ``extra`` (one copy, no pointer per parameter).

    ``set_template`` packs a full set of values once and names the parameters every call rewrites:
    int64 ones (pointers, grid steps) and scalars of one float type. :attr:`record` is then the
    launch record of :func:`~baracuda_numba._launch_jit.launch_record`, which copies the buffer and patches those
    parameters.
    """

    def __init__(self, n_arrays: int, scalar_types: Sequence[type]) -> None:
        types = (np.int64,) * (_ARRAY_SLOTS * n_arrays) + tuple(scalar_types)
        layout, offset, offsets = "<", 0, []
        for t in types:
            code, size = _PARAM_FORMAT[t]
            pad = -offset % size
            layout += "x" * pad + code
            offsets.append(offset + pad)
            offset += pad + size
        self._packer = struct.Struct(layout)
        self.offsets = tuple(offsets)
        self.size = offset
        self.n_params = len(types)
        self.record: np.ndarray | None = None

    def pack(self, values: Sequence[Any]) -> bytes:
        """Every parameter from the flat ``values``, packed (``size`` bytes)."""
        return self._packer.pack(*values)

    def record_of(self, values: Sequence[Any], int_params: Sequence[int] = (), float_params: Sequence[int] = (),
                  float_type: type = np.float32, shared_bytes: int = 0, dependent: bool = False) -> np.ndarray:
        """The launch record of ``values``, the calls patching the int64 parameters ``int_params`` and the
        ``float_type`` parameters ``float_params`` (indices in parameter order); ``dependent``: launched
        as a programmatic dependent of the previous kernel on the stream."""
        float_size = np.dtype(float_type).itemsize
        for i in int_params:
            if self.offsets[i] % 8:
                raise ValueError(f"parameter {i} is not an 8-byte aligned int64")
        header = [shared_bytes, self.size, int(float_size == 4), len(int_params), len(float_params), 0,
                  int(dependent)]
        header += [self.offsets[i] // 8 for i in int_params]
        header += [self.offsets[i] // float_size for i in float_params]
        header[_BUFFER_AT] = len(header)
        packed = self.pack(values)
        words = np.frombuffer(packed + bytes(-len(packed) % 8), np.int64)
        return np.concatenate((np.array(header, np.int64), words))

    def set_template(self, values: Sequence[Any], int_params: Sequence[int | slice], float_params: range,
                     float_type: type, shared_bytes: int = 0, dependent: bool = False) -> None:
        """Keep ``values`` packed as :attr:`record`, with the int64 parameters ``int_params`` (indices or
        slices of them) and the ``float_type`` ``float_params`` rewritten by every patched launch."""
        flat: list[int] = []
        for where in int_params:
            flat += range(self.n_params)[where] if isinstance(where, slice) else [where]
        self.record = self.record_of(values, flat, list(float_params), float_type, shared_bytes, dependent)


def record_bytes(record: np.ndarray, ints: Sequence[int] = (), floats: Sequence[float] = ()) -> bytes:
    """The parameter bytes a launch of ``record`` patched with ``ints`` and ``floats`` hands the driver
    (what :func:`~baracuda_numba._launch_jit.launch_record` builds, in Python: for tests and tools)."""
    block = record[record[_BUFFER_AT]:].copy()
    n_ints, n_floats = int(record[_N_INTS]), int(record[_N_FLOATS])
    int_at = record[_HEADER:_HEADER + n_ints]
    float_at = record[_HEADER + n_ints:_HEADER + n_ints + n_floats]
    if len(ints) < n_ints or len(floats) < n_floats:
        raise ValueError(f"the record patches {n_ints} ints and {n_floats} floats, given {len(ints)} and {len(floats)}")
    block[int_at] = ints[:n_ints]
    block.view(np.float32 if record[_FLOAT32] else np.float64)[float_at] = floats[:n_floats]
    return block.tobytes()[:record[_SIZE]]


@functools.cache
def _jit() -> Any:
    """The compiled launches (:mod:`baracuda_numba._launch_jit`, imported on the first GPU launch)."""
    from . import _launch_jit

    return _launch_jit


class DriverLaunches:
    """The compiled launches over a driver's entry points (:attr:`entry_points`: the addresses of
    ``cuLaunchKernel``, ``cuLaunchKernelEx`` and ``cuCtxGetDevice``, uint64): ``launch_record(function, device,
    blocks, threads, stream, record, ints, floats) -> status`` (:func:`~baracuda_numba._launch_jit.launch_record`:
    checks that ``device``'s context is current, skipped for ``device < 0``; copies the record's parameter buffer,
    patches ``ints`` and ``floats`` in, and launches it through ``extra`` on a 1-D grid, a dependent record with
    programmatic stream serialization; status the CUresult, or -1 when another device's context is current) and
    ``launch_pair(device, stream, function, blocks, threads, record, ints, floats, function2, ...)`` (two of them
    from one call). Through numba's dispatcher: the hot paths call the entry points numba compiled for their
    argument types (:func:`compiled_entry`), with :attr:`entry_points` first."""

    entry_points: np.ndarray

    def launch_record(self, *args: Any) -> int:
        return _jit().launch_record(self.entry_points, *args)

    def launch_pair(self, *args: Any) -> int:
        return _jit().launch_pair(self.entry_points, *args)


def function_address(function: Any) -> int:
    """The address of a ctypes function (a driver entry point, or a test's callback)."""
    return ctypes.cast(function, ctypes.c_void_p).value or 0


def compiled_entry(dispatcher: Any, args: Sequence[Any]) -> Any:
    """``dispatcher``'s compiled entry point for arguments of the types of ``args`` (compiled on first use). The
    entry point converts each argument to its compiled type without checking it; a tuple of another length
    raises."""
    from numba import typeof

    return dispatcher.compile(tuple(typeof(value) for value in args))


class KernelLauncher:
    """Launches one compiled kernel given ``n_arrays`` 1-D arrays then scalars of ``scalar_types``,
    with ``shared_bytes`` of dynamic shared memory per block (above 48 KiB the kernel is opted in);
    ``dependent``: as a programmatic dependent of the previous kernel on the stream (the kernel calls
    :func:`~baracuda_numba.kernels.memory.grid_dependency_wait` before it reads that kernel's results)."""

    def __init__(self, compile_dispatcher: Callable[[], Any], n_arrays: int, scalar_types: Sequence[type],
                 shared_bytes: int = 0, dependent: bool = False) -> None:
        self._compile = compile_dispatcher
        self._shared_bytes = shared_bytes
        self.dependent = dependent
        self._n_arrays = n_arrays
        self._scalar_types = tuple(scalar_types)
        self._lock = threading.Lock()
        self._functions: dict[int, int] = {}  # raw handles, per device
        self._entry: Any = None  # the compiled launch's entry point for launch_patched's arguments ...
        self._entry_of: Any = None  # ... and the compiled launch it belongs to
        if not SIMULATOR:
            self.params = ParameterBlock(n_arrays, self._scalar_types)

    def set_template(self, values: Sequence[Any], int_params: Sequence[int | slice], float_params: range,
                     float_type: type) -> None:
        """See :meth:`ParameterBlock.set_template`; :meth:`launch_patched` then launches it."""
        self.params.set_template(values, int_params, float_params, float_type, self._shared_bytes, self.dependent)

    def _function(self, device_id: int) -> int:
        """The kernel's raw handle on ``device_id`` (compiled and loaded on first use)."""
        function = self._functions.get(device_id)
        if function is None:
            from numba import cuda

            with self._lock, cuda.gpus[device_id]:
                # from the disk cache where it holds the kernel, else compiled (and stored): baracuda_numba.cache
                function, static = kernel_function(self._compile)
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
                function = _driver().context_function(function)
                self._functions[device_id] = function
        return function

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
        record = self.params.record_of(values, shared_bytes=self._shared_bytes, dependent=self.dependent)
        self._launch(blocks, threads, stream, device_id, record, _NO_INTS, _NO_FLOATS)

    def launch_patched(self, blocks: int, threads: int, stream: int, ints: tuple, floats: tuple,
                       device_id: int = 0) -> None:
        """Launch the template (:meth:`set_template`) with its patched int64 parameters set to ``ints``
        and its floats to ``floats`` (tuples, each of one type). The hot path of every fast call: one
        compiled call (:func:`~baracuda_numba._launch_jit.launch_record`) when the kernel is loaded and its device
        current."""
        function = self._functions.get(device_id)
        floats = floats or _NO_FLOATS
        if function is not None:
            driver = _driver()
            entry = self._entry
            if self._entry_of is not driver:
                entry = self._entry = compiled_entry(_jit().launch_record, (
                    driver.entry_points, function, device_id, blocks, threads, stream, self.params.record, ints,
                    floats))
                self._entry_of = driver
            status = entry(driver.entry_points, function, device_id, blocks, threads, stream, self.params.record,
                           ints, floats)
            if status == 0:
                return
            if status > 0:
                raise _launch_error(status)
        self._launch(blocks, threads, stream, device_id, self.params.record, ints, floats)

    def _launch(self, blocks: int, threads: int, stream: int, device_id: int, record: np.ndarray, ints: tuple,
                floats: tuple) -> None:
        function = self._function(device_id)
        driver = _driver()
        current = driver.current_device()
        if current != device_id:
            from numba import cuda

            if current == -1 and device_id == 0:
                cuda.current_context()  # a thread with no context yet: make device 0's current for good
            else:  # another device's context is current: switch for this launch only
                with cuda.gpus[device_id]:
                    status = driver.launch_record(function, -1, blocks, threads, stream, record, ints, floats)
                if status:
                    raise _launch_error(status)
                return
        status = driver.launch_record(function, -1, blocks, threads, stream, record, ints, floats)
        if status:
            raise _launch_error(status)

    def _launch_simulated(self, blocks, threads, arrays, scalars) -> None:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        dispatcher = self._compile()
        args = [FakeCUDAArray(a[3]) for a in arrays]
        args += [t(v) for t, v in zip(self._scalar_types, scalars, strict=True)]
        dispatcher[blocks, threads, 0, self._shared_bytes](*args)


class LaunchPair:
    """Two patched launches (:meth:`KernelLauncher.launch_patched`) on one stream, ``first`` then ``second``, made
    from one compiled call (:func:`~baracuda_numba._launch_jit.launch_pair`) when both kernels are loaded and the
    device's context is
    current: one entry from Python instead of two (0.3 us less host time for the W8A8 linear's quantizer and GEMM
    on an H100 host). Each call passes each launch's arguments of the same types as the first call did."""

    def __init__(self, first: KernelLauncher, second: KernelLauncher) -> None:
        self.first, self.second = first, second
        self._entry: Any = None
        self._entry_of: Any = None

    def launch(self, stream: int, device_id: int, blocks: int, threads: int, ints: tuple, floats: tuple,
               blocks2: int, threads2: int, ints2: tuple, floats2: tuple) -> None:
        """``first`` on ``blocks x threads`` patched with ``ints`` / ``floats``, then ``second`` with the
        ``2`` arguments, on ``stream`` of ``device_id``."""
        first, second = self.first, self.second
        function, function2 = first._functions.get(device_id), second._functions.get(device_id)
        floats, floats2 = floats or _NO_FLOATS, floats2 or _NO_FLOATS
        if function is not None and function2 is not None:
            driver = _driver()
            args = (driver.entry_points, device_id, stream, function, blocks, threads, first.params.record, ints,
                    floats, function2, blocks2, threads2, second.params.record, ints2, floats2)
            if self._entry_of is not driver:
                self._entry, self._entry_of = compiled_entry(_jit().launch_pair, args), driver
            status = self._entry(*args)
            if status == 0:
                return
            if status > 0:
                raise _launch_error(status)
        first.launch_patched(blocks, threads, stream, ints, floats, device_id)
        second.launch_patched(blocks2, threads2, stream, ints2, floats2, device_id)


def _launch_error(status: int) -> BaracudaError:
    return BaracudaError(f"cuLaunchKernel failed with CUresult {status}")


def array_values(ptr: int, nitems: int, itemsize: int) -> tuple[int, ...]:
    """The seven parameter values of a flat C-contiguous array in numba's kernel ABI."""
    return (0, 0, nitems, itemsize, ptr, nitems, itemsize)


class _Driver(DriverLaunches):
    """The driver entry points, through ctypes (loaded on first use). Launches go through
    :func:`~baracuda_numba._launch_jit.launch_record`, which calls ``cuLaunchKernel`` from compiled code: 5.9 us a
    launch on an H100 host, against 7.8 us for a Python-level patch and a cuda.bindings call, and 5.0-5.5 us for
    cuda.bindings' call alone.
    """

    def __init__(self) -> None:
        libcuda = ctypes.CDLL("libcuda.so.1")
        self._entries = (_entry_point(libcuda, "cuLaunchKernel", _LAUNCH_KERNEL),
                         _entry_point(libcuda, "cuLaunchKernelEx", _LAUNCH_KERNEL_EX),
                         _entry_point(libcuda, "cuCtxGetDevice", _CTX_GET_DEVICE))
        self.entry_points = np.array([function_address(f) for f in self._entries], np.uint64)
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
        self._kernel_get_function = libcuda.cuKernelGetFunction
        self._kernel_get_function.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self._kernel_get_function.restype = ctypes.c_int
        self._kernel_set_attribute = libcuda.cuKernelSetAttribute
        self._kernel_set_attribute.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        self._kernel_set_attribute.restype = ctypes.c_int
        self.memset_d32_async = libcuda.cuMemsetD32Async
        self.memset_d32_async.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
        self.memset_d32_async.restype = ctypes.c_int
        self.mem_alloc = libcuda.cuMemAlloc_v2
        self.mem_alloc.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.mem_alloc.restype = ctypes.c_int
        self.mem_free = libcuda.cuMemFree_v2
        self.mem_free.argtypes = [ctypes.c_uint64]
        self.mem_free.restype = ctypes.c_int
        self.memset_d32 = libcuda.cuMemsetD32_v2
        self.memset_d32.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t]
        self.memset_d32.restype = ctypes.c_int
        self.ctx_synchronize = libcuda.cuCtxSynchronize
        self.ctx_synchronize.restype = ctypes.c_int

    def set_max_dynamic_shared(self, function: int, nbytes: int, device_id: int) -> int:
        """Let ``function`` launch with up to ``nbytes`` of dynamic shared memory (a CUresult). numba
        loads modules as libraries, whose handles are ``CUkernel`` (cuKernelSetAttribute, per
        device); a ``CUfunction`` takes cuFuncSetAttribute."""
        error = self._kernel_set_attribute(_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes, function, device_id)
        if error:
            error = self._func_set_attribute(function, _MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        return error

    def context_function(self, kernel: int) -> int:
        """The ``CUfunction`` of the ``CUkernel`` ``kernel`` in the current context (loaded into it if it
        is not yet), or ``kernel`` itself where the driver cannot resolve it (a handle that already is a
        ``CUfunction``)."""
        function = ctypes.c_void_p()
        if self._kernel_get_function(ctypes.byref(function), kernel) or not function.value:
            return kernel
        return function.value

    def current_device(self) -> int:
        """Ordinal of the current context's device, or -1 when no context is current."""
        if self._ctx_get_device(self._device_ref):
            return -1
        return self._device.value


# The driver signatures the compiled launch calls, every handle and pointer as a 64-bit integer.
_LAUNCH_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, *[ctypes.c_uint] * 7, ctypes.c_uint64,
                                  ctypes.c_uint64, ctypes.c_uint64)
_LAUNCH_KERNEL_EX = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_uint64] * 4)
_CTX_GET_DEVICE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64)
_PROC_ADDRESS_VERSION = 12000  # the CUDA version whose flavour of each entry point is asked for


def _entry_point(libcuda: ctypes.CDLL, name: str, prototype: Any) -> Any:
    """``name`` as a ctypes function of ``prototype``: the pointer ``cuGetProcAddress`` gives (what
    cuda.bindings calls), else the exported symbol. On an H100 host the exported ``cuLaunchKernel``
    took 7.2 us a launch through ctypes where cuda.bindings' call took 4.6-4.9 us. (On driver 580, CUDA 13.0, the
    ``cuLaunchKernel`` pointers for CUDA 12.0 to 13.0 and the exported one are one function.)"""
    address = ctypes.c_void_p()
    for symbol, extra in (("cuGetProcAddress_v2", (None,)), ("cuGetProcAddress", ())):
        try:
            get_proc_address = libcuda[symbol]
        except AttributeError:
            continue
        get_proc_address.restype = ctypes.c_int
        get_proc_address.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                     ctypes.c_uint64] + [ctypes.c_void_p] * len(extra)
        if get_proc_address(name.encode(), ctypes.byref(address), _PROC_ADDRESS_VERSION, 0, *extra) == 0 \
                and address.value:
            return prototype(address.value)
    return prototype((name, libcuda))


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


def zero_words(ptr: int, count: int, stream: int) -> None:
    """Zero ``count`` 32-bit words of device memory at ``ptr``, in order on ``stream`` (a raw handle)."""
    fill_words(ptr, 0, count, stream)


def fill_words(ptr: int, value: int, count: int, stream: int) -> None:
    """Set ``count`` 32-bit words of device memory at ``ptr`` to ``value`` (their bits), in order on
    ``stream`` (a raw handle)."""
    error = _driver().memset_d32_async(ptr, value, count, stream)
    if error:
        raise BaracudaError(f"cuMemsetD32Async failed with CUresult {error}")


def _in_context(device: int, call: Callable[[], Any]) -> Any:
    """``call()`` with ``device``'s (primary) context current."""
    if _driver().current_device() == device:
        return call()
    from numba import cuda

    with cuda.gpus[device]:
        return call()


def _checked(status: int, what: str) -> None:
    if status:
        raise BaracudaError(f"{what} failed with CUresult {status}")


def driver_memory() -> Any:
    """:class:`~baracuda_numba.workspace.DeviceMemory` through the driver: ``cuMemAlloc`` (then zeroed),
    ``cuMemFree``, ``cuStreamSynchronize`` and ``cuCtxSynchronize``, each in the device's context."""
    from .workspace import DeviceMemory

    def allocate(device: int, nbytes: int) -> int:
        def call() -> int:
            driver, pointer = _driver(), ctypes.c_uint64()
            _checked(driver.mem_alloc(ctypes.byref(pointer), nbytes), f"cuMemAlloc({nbytes})")
            _checked(driver.memset_d32(pointer.value, 0, nbytes // 4), "cuMemsetD32")
            # the memset runs on the legacy stream, which a non-blocking stream does not wait for: done before any
            # kernel on the caller's stream may write the buffer
            _checked(driver.ctx_synchronize(), "cuCtxSynchronize")
            return pointer.value

        return _in_context(device, call)

    def free(device: int, pointer: int) -> None:
        _in_context(device, lambda: _checked(_driver().mem_free(pointer), "cuMemFree"))

    def synchronize_stream(device: int, stream: int) -> None:
        _in_context(device, lambda: synchronize(stream))

    def synchronize_device(device: int) -> None:
        _in_context(device, lambda: _checked(_driver().ctx_synchronize(), "cuCtxSynchronize"))

    return DeviceMemory(allocate, free, synchronize_stream, synchronize_device)


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
