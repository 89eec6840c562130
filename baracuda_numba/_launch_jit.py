"""The compiled host side of every GPU launch (numba, for the CPU), cached on disk by numba (``cache=True``).

Each function takes the driver's entry points as its first argument, ``entry``: a uint64 array of the addresses
of ``cuLaunchKernel``, ``cuLaunchKernelEx`` and ``cuCtxGetDevice`` (:attr:`baracuda_numba.launch._Driver.
entry_points`; a test's stand-in passes its callbacks'). The compiled code calls them through those addresses, so
it holds no address of this process and numba can keep it on disk: a process after the first loads it instead
of compiling it again (a few seconds a signature on a CPU host; ``docs/design-linear.md``, "The launch path").
Imported on first use (GPU launches only); the layout of the records and frames is :mod:`baracuda_numba.launch`'s.

- :func:`launch_record` ``(entry, function, device, blocks, threads, stream, record, ints, floats) -> status``;
- :func:`launch_pair` two of them from one call;
- :func:`linear_pair_launch` the W8A8 linear's quantizer and GEMM, their pointers derived from the operands.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .launch import (
    _BUFFER_AT,
    _CONFIG_AT,
    _CONFIG_WORDS,
    _DEPENDENT,
    _FLOAT32,
    _FRAME_WORDS,
    _HEADER,
    _N_FLOATS,
    _N_INTS,
    _PROGRAMMATIC_STREAM_SERIALIZATION,
    _SHARED,
    _SIZE,
    _STACK_FRAME_WORDS,
)

__all__ = ["launch_record", "launch_pair", "linear_pair_launch", "LAUNCH_KERNEL", "LAUNCH_KERNEL_EX",
           "CTX_GET_DEVICE"]

LAUNCH_KERNEL, LAUNCH_KERNEL_EX, CTX_GET_DEVICE = range(3)  # the entry points' order in `entry`

_I32, _I64 = ir.IntType(32), ir.IntType(64)


def _stack(count: int):
    @intrinsic
    def stack_words(typingctx):  # pragma: no cover (typing)
        def codegen(context, builder, signature, args):
            return cgutils.alloca_once(builder, _I64, size=count)

        return types.CPointer(types.uint64)(), codegen

    return stack_words


_stack_frame = _stack(_STACK_FRAME_WORDS)  # the launch's frame, in the calling function's entry block
_stack_word = _stack(1)


def _pointer_call(arguments: tuple[ir.IntType, ...]):
    """An intrinsic ``call(address, *values) -> int32``: the C function at ``address`` (an integer) called with
    ``values`` as the integer types ``arguments`` (truncated or extended from their int64 / uint64)."""

    @intrinsic
    def call(typingctx, address, values):  # pragma: no cover (typing)
        if not (isinstance(address, types.Integer) and isinstance(values, types.BaseTuple)
                and len(values) == len(arguments) and all(isinstance(v, types.Integer) for v in values)):
            return None

        def codegen(context, builder, signature, args):
            function_type = ir.FunctionType(_I32, list(arguments))
            address_value = context.cast(builder, args[0], signature.args[0], types.uint64)
            function = builder.inttoptr(address_value, function_type.as_pointer())
            given = cgutils.unpack_tuple(builder, args[1], len(arguments))
            converted = []
            for value, value_type, wanted in zip(given, signature.args[1], arguments, strict=True):
                wide = context.cast(builder, value, value_type, types.uint64)
                converted.append(builder.trunc(wide, wanted) if wanted.width < 64 else wide)
            return builder.call(function, converted)

        return types.int32(address, values), codegen

    return call


# cuLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, sharedMemBytes, stream, kernelParams, extra)
_call_launch_kernel = _pointer_call((_I64, _I32, _I32, _I32, _I32, _I32, _I32, _I32, _I64, _I64, _I64))
_call_launch_kernel_ex = _pointer_call((_I64, _I64, _I64, _I64))  # (config, f, kernelParams, extra)
_call_ctx_get_device = _pointer_call((_I64,))  # (int *device)


@njit(nogil=True, cache=True)
def launch_record(entry, function, device, blocks, threads, stream, record, ints, floats):  # pragma: no cover
    """Check that ``device``'s context is current (skipped for ``device < 0``), copy the record's parameter
    buffer, write ``ints`` and ``floats`` into the parameters the record names, and call ``cuLaunchKernel`` with
    the buffer through ``extra`` on a 1-D grid; a dependent record goes through ``cuLaunchKernelEx`` with
    programmatic stream serialization allowed. Status: the CUresult, or -1 when ``device``'s context is not
    current (nothing launched). Everything lives in locals, so threads need no lock."""
    if device >= 0:
        current = carray(_stack_word(), 1).view(np.int32)  # the device ordinal lands in word 0
        if _call_ctx_get_device(entry[2], (current.ctypes.data,)) != 0 or current[0] != device:
            return -1
    n_ints = record[_N_INTS]
    n_floats = record[_N_FLOATS]
    # One block of words holds everything the driver reads: `extra`, the buffer size, the launch config, then the
    # parameter buffer; on the stack where it fits (a heap array and its release cost a launch pair 0.12 us on a
    # CPU host). A heap frame is used again after the call, so that numba does not free it (after the last use of
    # its variable) before the driver has read it.
    buffer_at = record[_BUFFER_AT]
    words = _FRAME_WORDS + record.size - buffer_at
    frame = carray(_stack_frame(), words) if words <= _STACK_FRAME_WORDS else np.empty(words, np.uint64)
    block = frame[_FRAME_WORDS:]
    block[:] = record[buffer_at:]
    for k in range(n_ints):
        block[record[_HEADER + k]] = ints[k]
    float_at = _HEADER + n_ints
    if record[_FLOAT32]:
        as_float32 = block.view(np.float32)
        for k in range(n_floats):
            as_float32[record[float_at + k]] = floats[k]
    else:
        as_float64 = block.view(np.float64)
        for k in range(n_floats):
            as_float64[record[float_at + k]] = floats[k]
    base = frame.ctypes.data
    frame[0] = 1  # CU_LAUNCH_PARAM_BUFFER_POINTER
    frame[1] = base + 8 * _FRAME_WORDS
    frame[2] = 2  # CU_LAUNCH_PARAM_BUFFER_SIZE
    frame[3] = base + 8 * 5  # the size, word 5
    frame[4] = 0  # CU_LAUNCH_PARAM_END
    frame[5] = record[_SIZE]
    if record[_DEPENDENT]:
        config = frame[_CONFIG_AT:_FRAME_WORDS]
        config[:] = 0
        words = config.view(np.uint32)  # little-endian: word 2i is the low half of uint64 i
        words[0], words[1], words[2] = blocks, 1, 1  # grid
        words[3], words[4], words[5] = threads, 1, 1  # block
        words[6] = record[_SHARED]
        config[4] = stream
        config[5] = base + 8 * (_CONFIG_AT + _CONFIG_WORDS)  # the attribute that follows
        config[6] = 1
        words[2 * _CONFIG_WORDS] = _PROGRAMMATIC_STREAM_SERIALIZATION
        words[2 * _CONFIG_WORDS + 2] = 1  # programmaticStreamSerializationAllowed
        status = _call_launch_kernel_ex(entry[1], (base + 8 * _CONFIG_AT, function, 0, base))
    else:
        status = _call_launch_kernel(entry[0], (function, blocks, 1, 1, threads, 1, 1, record[_SHARED], stream, 0,
                                                base))
    return status if frame[0] == 1 else -2  # (frame[0] stays 1: the use keeps `frame` alive)


@njit(nogil=True, cache=True)
def launch_pair(entry, device, stream, function, blocks, threads, record, ints, floats, function2, blocks2, threads2,
                record2, ints2, floats2):  # pragma: no cover (compiled)
    """Two :func:`launch_record` launches on one stream, the second after the first; the device check is the
    first's. Status: the first's when it is not 0 (nothing launched), else the second's."""
    status = launch_record(entry, function, device, blocks, threads, stream, record, ints, floats)
    if status != 0:
        return status
    return launch_record(entry, function2, -1, blocks2, threads2, stream, record2, ints2, floats2)


@njit(nogil=True, cache=True)
def linear_pair_launch(entry, device, stream, x, workspace, weight, weight_scale, bias, out, layout, q_record,
                       record):  # pragma: no cover (compiled)
    """The W8A8 linear's two launches (the per-token quantizer, then the GEMM) from one call, the kernels'
    pointers derived from the operands: ``layout`` (int64) holds the quantizer's function, blocks and threads,
    the GEMM's, then the offsets of the row scales and of the zero point in the workspace."""
    scales = workspace + layout[6]
    return launch_pair(entry, device, stream, layout[0], layout[1], layout[2], q_record,
                       (x, x, workspace, workspace, scales, workspace + layout[7]), (0.0,),
                       layout[3], layout[4], layout[5], record,
                       (workspace, workspace, weight, weight, scales, weight_scale, bias, out), (np.float32(0.0),))
