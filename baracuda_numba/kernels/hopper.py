"""The W8A8 prefill GEMM on Hopper's warpgroup tensor cores (``wgmma``, sm_90a).

``y[m, n] = f32(acc[m, n]) * row_scale[m] * col_scale[n] (+ bias[n])``, the same product, exact int32
sums and epilogue as :mod:`.linear` (whose ``pipelined`` kernel it replaces on an H100 where it is
faster), with ``acc`` accumulated by ``wgmma.mma_async.m64n{tile_n}k32.s32.s8.s8``: one warpgroup (4
warps) multiplies a 64-row slice of the block's activation tile by the whole weight tile, both read by
the tensor cores straight from shared memory.

Layout. A block of two warpgroups owns a ``128 x tile_n`` output tile. ``K`` is walked in 128-byte
steps. Each step's activation rows (``128 x 128`` bytes) and weight rows (``tile_n x 128``) are copied
into a ring of ``stages`` shared-memory slots by ``cp.async`` (16 bytes per copy, zeros past ``M``,
``N`` and ``K``), in the 128-byte swizzle the tensor cores read: 16-byte piece ``p`` of row ``r`` is
stored at piece ``p ^ (r % 8)`` of that row, each slot 1024-byte aligned. A ``wgmma`` reads a 32-byte
slice of ``k`` of every row through a matrix descriptor (start address, 1024 bytes between groups of
8 rows, 128-byte swizzle); the four slices of a step differ by 32 bytes of start address. Both
operands are K-major, which is what ``nn.Linear`` stores (``x [M, K]``, ``w [N, K]`` row-major) and
the only layout ``wgmma`` takes for 8-bit integers.

Pipeline. The copies of step ``s + stages - 2`` are issued before the multiplies of step ``s``, and
each warpgroup keeps one batch of ``wgmma`` in flight (``wgmma.wait_group 1``), so the slot a new
copy overwrites was read by a batch that every warpgroup has finished before the barrier of that
step. Copies land through the generic proxy and the tensor cores read through the async proxy:
``fence.proxy.async`` between the two.

Epilogue. The accumulators of thread ``4 g + t`` of warp ``w`` of warpgroup ``q`` are rows
``64 q + 16 w + g (+ 8)``, columns ``8 j + 2 t (+ 1)`` (register ``4 j + 2 i + b``: row half ``i``,
column ``b``), parked in the drained ring (rows padded by 8 words against bank conflicts) and stored
by consecutive threads along ``n``, through :func:`.linear._epilogue`'s store, so every output bit
is the pipelined kernel's.

Compilation. ``cuda.jit`` dispatchers compile for the device's plain ``sm_90``, where ``wgmma`` does
not exist. The kernel is therefore compiled by ``cuda.compile_ptx``, its PTX target set to
``sm_90a``, and loaded through the driver by :class:`HopperKernel`, whose handle the package's own
launcher (:mod:`baracuda_numba.launch`) launches like any other. GPU only: the simulator has no
warpgroup, so plans select this kernel only on a real sm_90 device.
"""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from ..platform import SIMULATOR
from ..vocabulary import ElementKind
from . import device
from .device import device_function
from .elementwise import uint_name
from .linear import _epilogue

__all__ = ["WgmmaShape", "WGMMA", "WGMMA_NARROW", "WGMMA_SMALL", "NARROW_TILE_TIME", "streamed_rows",
           "HopperKernel", "wgmma_kernel", "wgmma_shape", "hopper_available"]

ROW_BYTES = 128  # k bytes of one staged row per step: the width of the 128-byte swizzle
WARPGROUP_ROWS = 64
SLOT_ALIGNMENT = 1024  # the swizzle's period (8 rows x 128 bytes): slots start on it
EPILOGUE_PAD = 8  # int32 words added to each parked output row
_U64 = np.uint64


@dataclass(frozen=True)
class WgmmaShape:
    """Geometry of the ``wgmma`` kernel: ``warpgroups`` x 64 output rows by ``tile_n`` columns per
    block, ``stages`` ring slots of one 128-byte ``k`` step of both operand tiles."""

    tile_n: int = 256
    stages: int = 4
    warpgroups: int = 2
    min_blocks: int = 1  # launch bounds: blocks per multiprocessor the registers must allow

    @property
    def tile_m(self) -> int:
        return WARPGROUP_ROWS * self.warpgroups

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @property
    def slot_bytes(self) -> int:
        return ROW_BYTES * (self.tile_m + self.tile_n)

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: the ring (or the parked output tile, if larger), plus the slack
        that lets the kernel align its first slot."""
        parked = 4 * self.tile_m * (self.tile_n + EPILOGUE_PAD)
        return max(self.stages * self.slot_bytes, parked) + SLOT_ALIGNMENT

    @property
    def name(self) -> str:
        return f"{self.tile_m}x{self.tile_n}_s{self.stages}" + (f"_b{self.min_blocks}" if self.min_blocks > 1 else "")


WGMMA = WgmmaShape()
WGMMA_NARROW: WgmmaShape | None = WgmmaShape(tile_n=128, stages=5)
# A narrow block's run against a wide one's: half the tile at 921 against 1138 TOPS per SM at 4096^3
# (H100, session 19, benchmarks/tune_wgmma.py call 5), so 0.5 * 1138 / 921.
NARROW_TILE_TIME = 0.62
# Smaller tiles for the batch sizes between decode and prefill, where the 128-row tiles leave most
# multiprocessors idle: 128 x 64, one warpgroup of 64 x 64 and of 64 x 32, with more stages (the same ~96 KiB
# of copies in flight per block as the 128 x 128 tile's three). Taken where they stream fewer operand bytes per
# multiprocessor than the large tiles (see :func:`wgmma_shape`). H100, session 35 (tune-wgmma-2026-11-26-s35-
# call2-mid.log, GPU TOPS, one weight, bf16 out; large tile -> best small, torch._int_mm alone in brackets):
# M = 96 / 128 at 4096^2 189 / 243 -> 305 / 407 (64 x 64; 290 / 382), M = 192 / 256 367 / 490 -> 465 / 612
# (128 x 64; 444 / 584), M = 128 / 256 at 4096 x 11008 299 / 597 -> 474 (64 x 64) / 739 (128 x 64; 426 / 451);
# M = 32 / 64 at 4096^2 (the skinny kernel 87 / 105) 112 / 222 (64 x 32; 98 / 194). ()  : the large tiles only.
WGMMA_SMALL: tuple[WgmmaShape, ...] = (WgmmaShape(tile_n=64, stages=6), WgmmaShape(tile_n=64, stages=8, warpgroups=1),
                                       WgmmaShape(tile_n=32, stages=10, warpgroups=1))


def streamed_rows(shape: WgmmaShape, m: int, n: int, multiprocessors: int) -> int:
    """Rows of operands (each ``K`` bytes) the busiest multiprocessor copies for an ``m x n`` output in
    ``shape``: its waves of blocks (one block per multiprocessor) times a block's live activation rows plus
    its weight rows. Rows past ``M`` are zero-filled without a read."""
    blocks = -(-m // shape.tile_m) * -(-n // shape.tile_n)
    return -(-blocks // multiprocessors) * (min(shape.tile_m, m) + shape.tile_n)


def wgmma_shape(m: int, n: int, multiprocessors: int) -> WgmmaShape:
    """The ``wgmma`` kernel's shape for an ``m x n`` output.

    Between the two large tiles: the one whose waves of blocks (one block per multiprocessor) end first, a
    narrow block taking ``NARROW_TILE_TIME`` of a wide one. Measured on an H100 (TOPS wide / narrow, K = 4096,
    call 5): M = 128, 256, 512 at N = 4096 135 / 220, 287 / 488, 602 / 960, M = 512 at N = 11008 734 / 820:
    narrow; M = 1024 at 4096 1165 / 944, M = 2048 at 4096 and 11008 1132 / 924 and 1076 / 942, 4096^2 1138 /
    921: wide.

    Then a shape of ``WGMMA_SMALL`` (the first of the fewest) where it makes the busiest multiprocessor copy
    fewer operand rows than the large tiles both would (:func:`streamed_rows`): a block streams its operands
    at about the same bytes per second whatever its tile (session 35: 50-58 GB/s per multiprocessor from
    M = 128 to 4096^3), so where the large tiles leave multiprocessors idle the smaller ones finish first."""
    narrow = WGMMA_NARROW
    large = WGMMA
    if narrow is not None:

        def waves(shape: WgmmaShape) -> int:
            return -(-(-(-m // shape.tile_m) * -(-n // shape.tile_n)) // multiprocessors)

        large = narrow if NARROW_TILE_TIME * waves(narrow) < waves(WGMMA) else WGMMA
    bound = min(streamed_rows(shape, m, n, multiprocessors) for shape in (WGMMA, narrow or WGMMA))
    small = min(WGMMA_SMALL, key=lambda shape: streamed_rows(shape, m, n, multiprocessors), default=None)
    if small is not None and streamed_rows(small, m, n, multiprocessors) < bound:
        return small
    return large


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

    wgmma_fence = device.asm_statement("wgmma.fence.sync.aligned;")
    wgmma_commit = device.asm_statement("wgmma.commit_group.sync.aligned;")
    fence_proxy_async = device.asm_statement("fence.proxy.async.shared::cta;")

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
            return device.asm_statement(text)
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


@functools.cache
def _copier(copies: int, rows_per_pass: int):
    """The device function starting a thread's ``copies`` 16-byte copies of one ``k`` step."""

    @device_function
    def start_copies(stage, slot, pairs, origin, first, row_stride, live_copies, step, k_ok):
        """Copy ``i`` from global address ``first + i * row_stride`` (the thread's rows are ``rows_per_pass``
        apart) plus the step's 128 bytes, into shared address ``slot`` plus ``i`` passes of rows; zeros for
        copies past ``live_copies`` (rows past the matrix) and where ``k_ok`` is false (the piece past ``K``)."""
        offset = _U64(ROW_BYTES) * _U64(step)
        for i in range(copies):
            valid = k_ok and i < live_copies
            source = first + _U64(i) * row_stride + offset if valid else origin
            device.cp_async_16_at(stage, slot + i * (ROW_BYTES * rows_per_pass), pairs, source, valid)

    return start_copies


def _wgmma_gemm(epilogue, out: ElementKind, shape: WgmmaShape, dependent: bool, wait_first: bool):
    early_weight = dependent and not wait_first  # the weight's first steps copied before the grid's wait
    tile_m, tile_n, threads, stages = shape.tile_m, shape.tile_n, shape.threads, shape.stages
    slot_bytes, count = shape.slot_bytes, tile_n // 2
    pieces = ROW_BYTES // 16  # 16-byte copies per staged row
    rows_per_pass = threads // pieces  # rows one pass of every thread's copies covers
    a_copies, w_copies = tile_m // rows_per_pass, tile_n // rows_per_pass
    assert a_copies * rows_per_pass == tile_m and w_copies * rows_per_pass == tile_n
    assert rows_per_pass % 8 == 0, "a thread's rows keep one swizzle phase"
    parked_row = tile_n + EPILOGUE_PAD
    store, row_param, column_params, encoded = (epilogue.store, epilogue.row_param, epilogue.column_params,
                                                epilogue.encoded)
    # 16-bit outputs: a thread stores 8 consecutive columns as one 16-byte vector
    vector_columns = 8 if out.itemsize == 2 else 0
    column_groups = tile_n // 8
    rows_per_vector_pass = threads // column_groups
    mma, wait_one, wait_done = wgmma_s8(tile_n), wgmma_wait(1), wgmma_wait(0, count)
    wait_copies, wait_all = device.cp_async_wait_group(stages - 3), device.cp_async_wait_group(0)
    w_offset = ROW_BYTES * tile_m  # the weight rows follow the activation rows in a slot

    @device_function
    def encoded4(a0, a1, a2, a3, rs, cs, bs, j):
        """Four 16-bit outputs of columns ``j .. j + 3`` of a thread's group packed in a word, lowest first."""
        return (encoded(a0, rs, cs[j], bs[j]) | (encoded(a1, rs, cs[j + 1], bs[j + 1]) << _U64(16))
                | (encoded(a2, rs, cs[j + 2], bs[j + 2]) << _U64(32))
                | (encoded(a3, rs, cs[j + 3], bs[j + 3]) << _U64(48)))

    start_a, start_w = _copier(a_copies, rows_per_pass), _copier(w_copies, rows_per_pass)

    def kernel(a_bytes, a_pairs, w_bytes, w_pairs, row_scale, col_scale, bias, out_elems,
               M, N, K, tiles_m, aligned, tensor_scale):
        tid = cuda.threadIdx.x
        stage = cuda.shared.array(0, np.uint64, alignment=16)  # dynamic: shape.shared_bytes
        parked = cuda.shared.array(0, np.int32, alignment=16)  # the same bytes, for the epilogue
        acc = cuda.local.array(count, np.int32)
        tile_n_index = cuda.blockIdx.x // tiles_m
        tile_m_index = cuda.blockIdx.x - tile_n_index * tiles_m
        m_block, n_block = tile_m_index * tile_m, tile_n_index * tile_n
        raw = device.shared_address(stage)
        base = (raw + (SLOT_ALIGNMENT - 1)) & ~np.uint32(SLOT_ALIGNMENT - 1)
        a_origin, w_origin = device.global_address(a_pairs), device.global_address(w_pairs)
        piece, row_in = tid % pieces, tid // pieces
        # what a thread's copies add to a slot's address, and where its first rows start in global memory
        into_slot = ROW_BYTES * row_in + 16 * (piece ^ (row_in % 8))
        row_stride = _U64(rows_per_pass) * _U64(K)
        a_first = a_origin + _U64(m_block + row_in) * _U64(K) + _U64(16 * piece)
        w_first = w_origin + _U64(n_block + row_in) * _U64(K) + _U64(16 * piece)
        a_live = (M - m_block - row_in + rows_per_pass - 1) // rows_per_pass
        w_live = (N - n_block - row_in + rows_per_pass - 1) // rows_per_pass
        warpgroup = tid // 128
        k_pairs = K // 16  # this kernel runs only for K % 16 == 0 and 16-byte aligned operands
        steps = (K + ROW_BYTES - 1) // ROW_BYTES
        for i in range(count):
            acc[i] = 0
        if early_weight:
            # A programmatic dependent of the quantizer, which triggers only after its own wait (or of any kernel,
            # under SmoothQuant's static-weight promise): the kernel that could write the weight is complete, so
            # the weight's first steps are copied while the kernel before runs. The activations and row scales
            # are read after this grid's wait. The weight's copies join the first commit group, so the groups
            # stay in step.
            for step in range(stages - 2):
                slot = base + step * slot_bytes + into_slot
                k_ok = pieces * step + piece < k_pairs
                start_w(stage, slot + w_offset, w_pairs, w_origin, w_first, row_stride, w_live, step, k_ok)
        if dependent:
            # (waiting first: only the launch overlaps the kernel before, which may write anything read here)
            device.grid_dependency_wait()
            device.launch_dependents()
        # steps 0 .. stages - 3 in flight before the first multiply; one commit group per step, empty
        # or zero-filled past K, so that the group count stays in step
        for step in range(stages - 2):
            slot = base + step * slot_bytes + into_slot
            k_ok = pieces * step + piece < k_pairs
            start_a(stage, slot, a_pairs, a_origin, a_first, row_stride, a_live, step, k_ok)
            if not early_weight:
                start_w(stage, slot + w_offset, w_pairs, w_origin, w_first, row_stride, w_live, step, k_ok)
            device.cp_async_commit()
        for step in range(steps):
            # this thread's copies of `step` have landed (fenced for the tensor cores' reads); after
            # the barrier everyone's have, and every warpgroup has finished the batch of step - 2,
            # the one that read the slot the next copies overwrite
            wait_copies()
            fence_proxy_async()
            cuda.syncthreads()
            ahead = step + stages - 2
            slot = base + (ahead % stages) * slot_bytes + into_slot
            k_ok = pieces * ahead + piece < k_pairs
            start_a(stage, slot, a_pairs, a_origin, a_first, row_stride, a_live, ahead, k_ok)
            start_w(stage, slot + w_offset, w_pairs, w_origin, w_first, row_stride, w_live, ahead, k_ok)
            device.cp_async_commit()
            current = base + (step % stages) * slot_bytes
            desc_a = descriptor(current + ROW_BYTES * WARPGROUP_ROWS * warpgroup)
            desc_b = descriptor(current + w_offset)
            wgmma_fence()
            for kk in range(ROW_BYTES // 32):  # 32 bytes of k per wgmma: 2 in the descriptor's units
                mma(acc, desc_a + _U64(2 * kk), desc_b + _U64(2 * kk))
            wgmma_commit()
            wait_one()
        wait_done(acc)
        wait_all()  # the zero-filled copies past K may still be landing
        cuda.syncthreads()
        lane = tid % 32
        group, t = lane // 4, lane % 4
        row0 = WARPGROUP_ROWS * warpgroup + 16 * ((tid // 32) % 4) + group
        first = (base - raw) // 4  # int32 index of the aligned ring
        for j in range(tile_n // 8):
            for i in range(2):
                at = first + (row0 + 8 * i) * parked_row + 8 * j + 2 * t
                parked[at] = acc[4 * j + 2 * i]
                parked[at + 1] = acc[4 * j + 2 * i + 1]
        cuda.syncthreads()
        if vector_columns and N % 8 == 0 and array_address(out_elems) % 16 == 0:
            # each thread keeps one group of 8 columns: their parameters are loaded once
            group_index = tid % column_groups
            n0 = n_block + 8 * group_index
            cs = cuda.local.array(8, np.float32)
            bs = cuda.local.array(8, np.float32)
            for j in range(8):
                cs[j], bs[j] = column_params(n0 + j, N, col_scale, bias)
            if n0 < N:  # then all 8 are (N % 8 == 0)
                for r in range(tid // column_groups, tile_m, rows_per_vector_pass):
                    m = m_block + r
                    if m < M:
                        rs = row_param(m, row_scale, tensor_scale)
                        at = first + r * parked_row + 8 * group_index
                        a0, a1, a2, a3 = load_s32x4(parked, at)
                        a4, a5, a6, a7 = load_s32x4(parked, at + 4)
                        store_16_bytes(out_elems, m * N + n0, encoded4(a0, a1, a2, a3, rs, cs, bs, 0),
                                       encoded4(a4, a5, a6, a7, rs, cs, bs, 4))
        else:
            for index in range(tid, tile_m * tile_n, threads):
                r, c = index // tile_n, index % tile_n
                store(np.int64(parked[first + r * parked_row + c]), m_block + r, n_block + c, M, N, row_scale,
                      col_scale, bias, out_elems, tensor_scale)

    return kernel


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
        function = module.get_function(_PTX_ENTRY.search(ptx).group(1))
        return int(function.handle), 0


@functools.cache
def wgmma_kernel(out: ElementKind, has_bias: bool, per_tensor_rows: bool, shape: WgmmaShape = WGMMA,
                 dependent: bool = False, wait_first: bool = False) -> HopperKernel:
    """The ``wgmma`` GEMM + epilogue writing ``out``; the arguments and grid of
    :func:`.linear.linear_kernel`'s ``pipelined`` kernel (16-byte aligned operands, ``K % 16 == 0``),
    ``shape.threads`` threads and ``shape.shared_bytes`` of dynamic shared memory per block. ``dependent``: launched
    as a programmatic dependent of a kernel that triggers only after its own wait (the quantizer); it copies its
    first steps of weight, then waits for that kernel before it reads the activations or their scales;
    ``wait_first`` (with ``dependent``): it waits before it reads anything, so that any kernel may come before it."""
    epilogue = _epilogue(out, has_bias, per_tensor_rows)
    kernel = _wgmma_gemm(epilogue, out, shape, dependent, dependent and wait_first)
    row = "float64" if out is ElementKind.F64 and not per_tensor_rows else "float32"
    signature = (f"void(uint8[::1], uint64[::1], uint8[::1], uint64[::1], {row}[::1], float32[::1], float32[::1], "
                 f"{uint_name(out.itemsize)}[::1], int64, int64, int64, int64, boolean, float32)")
    rows, dep = "_tensor" if per_tensor_rows else "_token", ("_depw" if wait_first else "_dep") if dependent else ""
    kernel.__name__ = kernel.__qualname__ = (f"w8a8_gemm_wgmma_{shape.name}_{out.short}{'_bias' if has_bias else ''}"
                                             f"{rows}{dep}")
    return HopperKernel(kernel, signature, (("launch_bounds", (shape.threads, shape.min_blocks)),))

