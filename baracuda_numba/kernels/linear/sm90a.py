"""What the sm_90a kernels need beyond numba: Hopper's warpgroup instructions as inline PTX, and a loader.

``cuda.jit`` dispatchers compile for the device's plain ``sm_90``, where ``wgmma`` does not exist. A
kernel that uses it is therefore compiled by ``cuda.compile_ptx``, its PTX target set to ``sm_90a``, and
loaded through the driver by :class:`HopperKernel`, whose handle the package's own launcher
(:mod:`baracuda_numba.launch`) launches like any other. GPU only: the simulator has no warpgroup.

- ``wgmma_s8(tile_n)``: ``wgmma.mma_async.m64n{tile_n}k32.s32.s8.s8`` on a local int32 accumulator array;
  ``wgmma_wait(pending, count)``, ``wgmma_fence``, ``wgmma_commit``, ``fence_proxy_async``.
- ``descriptor(address)``: the matrix descriptor of a K-major operand in the 128-byte swizzle.
- ``array_address``, ``load_s32x4``, ``store_16_bytes``: an array's address, 16-byte loads and stores.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

import numpy as np
from numba import cuda

from ...platform import SIMULATOR
from .. import device, memory
from ..device import device_function

__all__ = ["ROW_BYTES", "HopperKernel", "descriptor", "hopper_available"]

ROW_BYTES = 128  # k bytes of one staged row per step: the width of the 128-byte swizzle
_U64 = np.uint64


def hopper_available() -> bool:
    """Whether the current device runs ``wgmma`` (compute capability 9.0, a real GPU)."""
    if SIMULATOR:
        return False
    return tuple(cuda.get_current_device().compute_capability) == (9, 0)


if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.core.extending import intrinsic

    _I32 = ir.IntType(32)
    _I64 = ir.IntType(64)

    wgmma_fence = memory.asm_statement("wgmma.fence.sync.aligned;")
    wgmma_commit = memory.asm_statement("wgmma.commit_group.sync.aligned;")
    fence_proxy_async = memory.asm_statement("fence.proxy.async.shared::cta;")

    def _through_accumulators(context, builder, sig, array, count, text, constraints, leading=()):
        """Call the inline PTX ``text`` on the ``count`` registers of the local int32 array ``array`` (tied
        outputs, after the ``leading`` operands) and store them back."""
        data = context.make_array(sig.args[0])(context, builder, array).data
        slots = [builder.gep(data, [ir.Constant(_I64, i)]) for i in range(count)]
        values = [builder.load(slot) for slot in slots]
        struct = ir.LiteralStructType([_I32] * count)
        asm = ir.InlineAsm(ir.FunctionType(struct, [v.type for v in leading] + [_I32] * count), text, constraints,
                           side_effect=True)
        out = builder.call(asm, [*leading, *values])
        for i, slot in enumerate(slots):
            builder.store(builder.extract_value(out, i), slot)

    @functools.cache
    def wgmma_s8(tile_n: int):
        """``wgmma_s8(acc, desc_a, desc_b)``: ``acc += a @ b.T`` for one ``m64n{tile_n}k32`` step, ``acc``
        a local int32 array of ``tile_n / 2`` (kept in registers: constant indices only)."""
        count = tile_n // 2
        registers = ", ".join(f"${i}" for i in range(count))
        text = (f"{{ .reg .pred p; setp.ne.b32 p, ${count + 2}, 0; wgmma.mma_async.sync.aligned.m64n{tile_n}k32"
                f".s32.s8.s8 {{{registers}}}, ${count}, ${count + 1}, p; }}")
        constraints = ",".join(["=r"] * count + ["l", "l", "r"] + [str(i) for i in range(count)])

        @intrinsic
        def mma(typingctx, acc, desc_a, desc_b):
            if not (isinstance(acc, types.Array) and acc.dtype == types.int32):
                return None

            def codegen(context, builder, sig, args):
                _through_accumulators(context, builder, sig, args[0], count, text, constraints,
                                      (args[1], args[2], ir.Constant(_I32, 1)))
                return context.get_dummy_value()

            return types.void(acc, desc_a, desc_b), codegen

        return mma

    @functools.cache
    def wgmma_wait(pending: int, count: int = 0):
        """``wgmma.wait_group pending``. With ``count`` > 0 it takes the local int32 accumulator array
        of that length and passes its registers through, so that no read of them moves above it."""
        text = f"wgmma.wait_group.sync.aligned {pending};"
        if not count:
            return memory.asm_statement(text)
        constraints = ",".join(["=r"] * count + [str(i) for i in range(count)]) + ",~{memory}"

        @intrinsic
        def wait(typingctx, acc):
            if not (isinstance(acc, types.Array) and acc.dtype == types.int32):
                return None

            def codegen(context, builder, sig, args):
                _through_accumulators(context, builder, sig, args[0], count, text, constraints)
                return context.get_dummy_value()

            return types.void(acc), codegen

        return wait

    @intrinsic
    def array_address(typingctx, array):
        """The address of element 0 of a 1-D array."""
        if not isinstance(array, types.Array):
            return None

        def codegen(context, builder, sig, args):
            return builder.ptrtoint(context.make_array(sig.args[0])(context, builder, args[0]).data, _I64)

        return types.uint64(array), codegen

    @intrinsic
    def load_s32x4(typingctx, array, index):
        """Elements ``index .. index + 3`` of an int32 array (16-byte aligned) as one vector load."""
        if not (isinstance(array, types.Array) and array.dtype == types.int32 and isinstance(index, types.Integer)):
            return None
        result = types.UniTuple(types.int32, 4)

        def codegen(context, builder, sig, args):
            at = context.cast(builder, args[1], sig.args[1], types.int64)
            pointer = device.element_pointer(context, builder, sig.args[0], args[0], at)
            vector = builder.load(builder.bitcast(pointer, ir.VectorType(_I32, 4).as_pointer()), align=16)
            items = [builder.extract_element(vector, ir.Constant(_I32, i)) for i in range(4)]
            return context.make_tuple(builder, result, items)

        return result(array, index), codegen

    @intrinsic
    def store_16_bytes(typingctx, array, index, lo, hi):
        """``lo`` then ``hi`` (uint64) stored as one 16-byte access at element ``index`` of a 1-D array
        (16-byte aligned there)."""
        if not (isinstance(array, types.Array) and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            at = context.cast(builder, args[1], sig.args[1], types.int64)
            pointer = device.element_pointer(context, builder, sig.args[0], args[0], at)
            device.store_pair(context, builder, pointer, args[2], sig.args[2], args[3], sig.args[3])
            return context.get_dummy_value()

        return types.void(array, index, lo, hi), codegen


# Matrix descriptor of a K-major operand in the 128-byte swizzle: start address / 16 in bits 0-13,
# leading byte offset 16 (unused by this layout) in bits 16-29, 1024 bytes between 8-row groups
# (/ 16) in bits 32-45, swizzle mode 1 (128 bytes) in bits 62-63.
_DESCRIPTOR_FIELDS = _U64((1 << 16) | ((8 * ROW_BYTES // 16) << 32) | (1 << 62))


@device_function
def descriptor(address):
    """The wgmma matrix descriptor of the operand whose first row starts at shared ``address``."""
    return ((_U64(address) & _U64(0x3FFFF)) >> _U64(4)) | _DESCRIPTOR_FIELDS


_PTX_TARGET = re.compile(r"^\.target sm_90a?$", re.MULTILINE)  # NVVM 7 ignores the "a", newer ones keep it
_PTX_ENTRY = re.compile(r"^\.visible \.entry (\S+)\(", re.MULTILINE)


class HopperKernel:
    """A kernel compiled by numba to PTX for ``sm_90a`` and loaded through the driver, outside numba's
    dispatcher (which compiles for ``sm_90``). ``compiled()`` returns the object itself: its
    :meth:`kernel_handle` gives :class:`~baracuda_numba.launch.KernelLauncher` the handle to launch."""

    def __init__(self, py_func: Any, signature: str, options: tuple = ()) -> None:
        self.py_func, self.signature, self.options = py_func, signature, options
        self._lock = threading.Lock()
        self._ptx: str | None = None
        self._modules: dict[int, Any] = {}  # per context handle: the loaded module (kept alive)

    def ptx(self) -> str:
        """The kernel's PTX for ``sm_90a`` (compiled once)."""
        with self._lock:
            if self._ptx is None:
                ptx, _ = cuda.compile_ptx(self.py_func, self.signature, cc=(9, 0, "a"), **dict(self.options))
                ptx, replaced = _PTX_TARGET.subn(".target sm_90a", ptx)
                if replaced != 1:
                    raise RuntimeError(f"{self.py_func.__name__}: no '.target sm_90(a)' line to retarget in its PTX")
                self._ptx = ptx
            return self._ptx

    def compiled(self) -> HopperKernel:
        """The kernel itself, its PTX compiled (what a launcher's ``compile_dispatcher`` returns)."""
        self.ptx()
        return self

    def kernel_handle(self) -> tuple[int, int]:
        """``(handle, static shared bytes)`` of the kernel loaded in the current context."""
        context = cuda.current_context()
        key = int(context.handle)
        ptx = self.ptx()
        with self._lock:
            module = self._modules.get(key)
            if module is None:
                module = context.create_module_ptx(ptx)
                self._modules[key] = module
        function = module.get_function(self.entry_name())
        return int(function.handle), 0

    def entry_name(self) -> str:
        """The name of the kernel's entry point in its PTX."""
        return _PTX_ENTRY.search(self.ptx()).group(1)
