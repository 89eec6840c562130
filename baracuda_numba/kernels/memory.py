"""Device primitives that move data: asynchronous copies into shared memory, ldmatrix, L2 prefetch, streaming
stores, programmatic dependent launch and the global timer (:mod:`.device` has the arithmetic and conversions,
and the plain 16-byte loads and stores).

On the GPU each is an LLVM intrinsic or one inline-PTX instruction; under Numba's CUDA simulator the same names
are Python functions with the same effect on memory (hints and waits do nothing there).

- ``cp_async_16(stage, c, words, s, valid)``: start copying words ``2s, 2s + 1`` of the global uint64
  array ``words`` into words ``2c, 2c + 1`` of the shared array ``stage`` without passing through
  registers (``cp.async.cg.shared.global``, 16 bytes, sm_80+); zeros instead when ``valid`` is false
  (the source address must still be inside ``words``). ``cp_async_commit()`` closes the group of
  copies this thread started since the last commit; ``cp_async_wait_group(n)`` returns the device
  function waiting until at most ``n`` of this thread's groups are still in flight (``n`` is baked
  into the instruction). Other threads' copies are visible only after a barrier. The simulator
  copies at once and waits for nothing.
- ``streaming_store(chunk_bytes)``: ``store(view, c, lo, hi)`` of one chunk of 8, 4 or 2 bytes (item ``c``
  of a uint64 / uint32 / uint16 view gets ``lo``'s bits; ``hi`` is ignored, as in ``elementwise.chunk_io``)
  with the ``.cs`` (streaming, evict-first) cache operator: the stored lines leave L2 before the lines
  a kernel still reads. The simulator stores plainly.
- ``prefetch_l2(words, c)``: ``prefetch.L2`` of the line holding pair ``c`` of the global uint64 array
  ``words`` (a hint: no register, nothing to wait for; ``c`` must be inside ``words``). The simulator
  does nothing.
- ``grid_dependency_wait()`` / ``launch_dependents()``: programmatic dependent launch (sm_90,
  ``griddepcontrol.wait`` / ``.launch_dependents``). A kernel launched with programmatic stream
  serialization (:class:`~baracuda_numba.launch.KernelLauncher` ``dependent=True``) may start while
  the kernel before it on the stream still runs: ``grid_dependency_wait()`` blocks until that kernel
  has completed and its memory is visible (returns at once in a kernel launched the usual way), so a
  dependent kernel calls it before its first access to what the previous kernel writes.
  ``launch_dependents()`` lets the dependent kernel start once every block of this one has called it
  (or exited); it orders nothing. The simulator runs launches in order: both do nothing there.
- ``global_timer()``: ``%globaltimer`` as uint64 nanoseconds, one clock for every SM (the profiling
  hooks' stamps). The simulator returns 0.
- ``shared_address(stage)`` / ``global_address(words)``: the address of a shared / global uint64 array's
  first element, as the 32-bit ``.shared`` window offset / the 64-bit global address. The ``*_at``
  functions below take addresses made from these plus byte offsets, so a kernel computes them once and
  adds constants in its loop (no 64-bit generic-to-shared conversion per access). The simulator
  returns 0 for both, and its ``*_at`` functions read the addresses as byte offsets into the arrays.
- ``cp_async_16_at(stage, dst, words, src, valid)``: ``cp.async.cg.shared.global`` of the 16 bytes at
  global address ``src`` (inside ``words``) to shared address ``dst`` (inside ``stage``); zeros instead
  when ``valid`` is false (``src`` must still point into ``words``).
- ``ldmatrix_x4_at(stage, address, scratch, tid)``: the warp-wide
  ``ldmatrix.sync.aligned.m8n8.x4.shared.b16``: lanes ``8i .. 8i + 7`` give the shared addresses (inside
  ``stage``, 16-byte aligned) of the eight 16-byte rows of matrix ``i``; lane ``4g + t`` receives word
  ``t`` of row ``g`` of each of the four matrices (uint32). For int8 those are exactly the
  ``m16n8k32`` fragments of :func:`mma_s8`. The simulator exchanges the addresses through ``scratch``
  (every thread alike).
"""

from __future__ import annotations

import functools

import numpy as np

from ..platform import SIMULATOR

__all__ = [
    "cp_async_16",
    "cp_async_commit",
    "cp_async_wait_group",
    "prefetch_l2",
    "streaming_store",
    "grid_dependency_wait",
    "launch_dependents",
    "global_timer",
    "shared_address",
    "global_address",
    "cp_async_16_at",
    "ldmatrix_x4_at",
    "asm_statement",
]

if SIMULATOR:
    from numba import cuda

    _M32 = 0xFFFFFFFF
else:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    from .device import _I32, _I64, _to_i64

if SIMULATOR:

    def cp_async_16(stage, c, words, s, valid):
        if valid:
            stage[2 * c], stage[2 * c + 1] = words[2 * s], words[2 * s + 1]
        else:
            stage[2 * c], stage[2 * c + 1] = 0, 0

    def cp_async_commit():
        pass

    def cp_async_wait_group(n: int):
        def cp_async_wait():
            pass

        return cp_async_wait

    def prefetch_l2(words, c):
        pass  # a cache hint: nothing to simulate

    def grid_dependency_wait():
        pass  # the simulator runs launches one after another

    def launch_dependents():
        pass

    def global_timer():
        return np.uint64(0)

    @functools.cache
    def streaming_store(chunk_bytes: int):
        if chunk_bytes not in (8, 4, 2):
            raise ValueError(f"streaming_store: chunks of 8, 4 or 2 bytes, not {chunk_bytes}")

        def store(view, c, lo, hi):
            view[c] = lo

        return store

else:
    # the shared destination as a state-space address; src-size 0 makes the copy write zeros
    _CP_ASYNC = ("{ .reg .u64 dst; cvta.to.shared.u64 dst, $0; "
                 "cp.async.cg.shared.global [dst], [$1], 16, $2; }")

    @intrinsic
    def cp_async_16(typingctx, stage, c, words, s, valid):
        arrays = (stage, words)
        if not (all(isinstance(a, types.Array) and a.dtype == types.uint64 for a in arrays)
                and isinstance(c, types.Integer) and isinstance(s, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            stage_value, chunk, words_value, source, flag = args
            pointers = []
            for ty, value, index, index_ty in ((stage, stage_value, chunk, c), (words, words_value, source, s)):
                data = context.make_array(ty)(context, builder, value).data
                offset = builder.mul(_to_i64(builder, index, index_ty), ir.Constant(_I64, 2))
                pointers.append(builder.ptrtoint(builder.gep(data, [offset]), _I64))
            flag_bool = context.cast(builder, flag, sig.args[4], types.boolean)
            size = builder.select(flag_bool, ir.Constant(_I32, 16), ir.Constant(_I32, 0))
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I64, _I64, _I32]), _CP_ASYNC, "l,l,r,~{memory}",
                               side_effect=True)
            builder.call(asm, [*pointers, size])
            return context.get_dummy_value()

        return types.void(stage, c, words, s, valid), codegen

    def asm_statement(text: str):
        """An intrinsic issuing the PTX statement ``text`` with no operands (ordered as a memory access)."""

        @intrinsic
        def statement(typingctx):
            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True)
                builder.call(asm, [])
                return context.get_dummy_value()

            return types.void(), codegen

        return statement

    cp_async_commit = asm_statement("cp.async.commit_group;")

    def cp_async_wait_group(n: int):
        return asm_statement(f"cp.async.wait_group {int(n)};")

    grid_dependency_wait = asm_statement("griddepcontrol.wait;")

    @intrinsic
    def global_timer(typingctx):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(_I64, []), "mov.u64 $0, %globaltimer;", "=l", side_effect=True)
            return builder.call(asm, [])

        return types.uint64(), codegen
    launch_dependents = asm_statement("griddepcontrol.launch_dependents;")

    @intrinsic
    def prefetch_l2(typingctx, words, c):
        """Ask L2 for the line holding 16-byte pair ``c`` of ``words`` (no register, no completion to
        wait for: a hint that the loads of the pair will follow)."""
        if not (isinstance(words, types.Array) and words.dtype == types.uint64 and isinstance(c, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            array, chunk = args
            data = context.make_array(words)(context, builder, array).data
            index = builder.mul(_to_i64(builder, chunk, c), ir.Constant(_I64, 2))
            pointer = builder.ptrtoint(builder.gep(data, [index]), _I64)
            # a generic address (no state space): numba's array pointers are generic
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I64]), "prefetch.L2 [$0];", "l", side_effect=True)
            builder.call(asm, [pointer])
            return context.get_dummy_value()

        return types.void(words, c), codegen

    @functools.cache
    def streaming_store(chunk_bytes: int):
        if chunk_bytes not in (8, 4, 2):
            raise ValueError(f"streaming_store: chunks of 8, 4 or 2 bytes, not {chunk_bytes}")
        bits = 8 * chunk_bytes
        text = f"st.cs.u{bits} [$0], $1;"
        value_type = ir.IntType(bits)
        constraint = {64: "l", 32: "r", 16: "h"}[bits]

        @intrinsic
        def store(typingctx, view, c, lo, hi):
            if not (isinstance(view, types.Array) and isinstance(view.dtype, types.Integer)
                    and view.dtype.bitwidth == bits and isinstance(c, types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                array, chunk, low, _ = args
                data = context.make_array(view)(context, builder, array).data
                # a generic address (no state space), as numba's array pointers are
                pointer = builder.ptrtoint(builder.gep(data, [_to_i64(builder, chunk, c)]), _I64)
                value = _to_i64(builder, low, lo)
                if bits < 64:
                    value = builder.trunc(value, value_type)
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I64, value_type]), text,
                                   f"l,{constraint},~{{memory}}", side_effect=True)
                builder.call(asm, [pointer, value])
                return context.get_dummy_value()

            return types.void(view, c, lo, hi), codegen

        return store


if SIMULATOR:

    def shared_address(stage):
        return 0

    def global_address(words):
        return 0

    def cp_async_16_at(stage, dst, words, src, valid):
        cp_async_16(stage, int(dst) // 16, words, int(src) // 16, valid)

    @cuda.jit(device=True)  # simulated: the warp's row addresses meet in shared memory
    def ldmatrix_x4_at(stage, address, scratch, tid):
        scratch[tid, 0] = int(address) // 16
        cuda.syncthreads()
        warp, lane = tid - tid % 32, tid % 32
        words = []
        for i in range(4):
            pair = int(scratch[warp + 8 * i + lane // 4, 0])
            word = int(stage[2 * pair + (lane % 4) // 2]) >> (32 * (lane % 2))
            words.append(np.uint32(word & _M32))
        cuda.syncthreads()
        return words[0], words[1], words[2], words[3]

else:

    def _is_words(array) -> bool:
        return isinstance(array, types.Array) and array.dtype == types.uint64

    def _to_i32(builder, value, ty):
        return builder.trunc(_to_i64(builder, value, ty), _I32)

    @intrinsic
    def shared_address(typingctx, stage):
        if not _is_words(stage):
            return None

        def codegen(context, builder, sig, args):
            data = context.make_array(stage)(context, builder, args[0]).data
            generic = builder.ptrtoint(data, _I64)
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_I64]),
                               "{ .reg .u64 window; cvta.to.shared.u64 window, $1; cvt.u32.u64 $0, window; }",
                               "=r,l")
            return builder.call(asm, [generic])

        return types.uint32(stage), codegen

    @intrinsic
    def global_address(typingctx, words):
        if not _is_words(words):
            return None

        def codegen(context, builder, sig, args):
            return builder.ptrtoint(context.make_array(words)(context, builder, args[0]).data, _I64)

        return types.uint64(words), codegen

    @intrinsic
    def cp_async_16_at(typingctx, stage, dst, words, src, valid):
        if not (_is_words(stage) and _is_words(words) and isinstance(dst, types.Integer)
                and isinstance(src, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            size = builder.select(context.cast(builder, args[4], sig.args[4], types.boolean),
                                  ir.Constant(_I32, 16), ir.Constant(_I32, 0))
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I32, _I64, _I32]),
                               "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}", side_effect=True)
            builder.call(asm, [_to_i32(builder, args[1], dst), _to_i64(builder, args[3], src), size])
            return context.get_dummy_value()

        return types.void(stage, dst, words, src, valid), codegen

    @intrinsic
    def ldmatrix_x4_at(typingctx, stage, address, scratch, tid):
        if not (_is_words(stage) and isinstance(address, types.Integer)):
            return None
        result = types.UniTuple(types.uint32, 4)

        def codegen(context, builder, sig, args):
            struct = ir.LiteralStructType([_I32] * 4)
            asm = ir.InlineAsm(ir.FunctionType(struct, [_I32]),
                               "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];",
                               "=r,=r,=r,=r,r,~{memory}", side_effect=True)
            out = builder.call(asm, [_to_i32(builder, args[1], address)])
            return context.make_tuple(builder, result, [builder.extract_value(out, i) for i in range(4)])

        return result(stage, address, scratch, tid), codegen
