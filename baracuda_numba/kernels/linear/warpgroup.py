"""The W8A8 prefill GEMM on Hopper's warpgroup tensor cores (``wgmma``, sm_90a).

``y[m, n] = f32(acc[m, n]) * row_scale[m] * col_scale[n] (+ bias[n])``, the same product, exact int32
sums and epilogue as :mod:`.common` (the ``pipelined`` kernel's replacement on sm_90 devices, where it is
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
by consecutive threads along ``n``, through :func:`.common.epilogue`'s store, so every output bit
is the pipelined kernel's.

Compilation: :mod:`.sm90a` (sm_90a PTX loaded through the driver; GPU only, the simulator has no
warpgroup, so plans choose this kernel only on a real sm_90 device).
"""


from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda

from ...vocabulary import ElementKind
from .. import memory
from ..device import device_function
from . import sm90a
from .common import Epilogue, Output, epilogue, gemm_signature
from .sm90a import ROW_BYTES, HopperKernel, descriptor

__all__ = ["WgmmaShape", "WarpgroupConfig", "warpgroup_kernel", "WARPGROUP_ROWS", "SLOT_ALIGNMENT", "EPILOGUE_PAD"]

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


@dataclass(frozen=True)
class WarpgroupConfig:
    """The ``wgmma`` kernel writing ``output`` in ``shape``. ``dependent``: launched as a programmatic
    dependent of a kernel that triggers only after its own wait (the quantizer); it copies its first steps of
    weight, then waits for that kernel before it reads the activations or their scales; ``wait_first`` (with
    ``dependent``): it waits before it reads anything, so that any kernel may come before it."""

    output: Output
    shape: WgmmaShape = WgmmaShape()
    dependent: bool = False
    wait_first: bool = False

    def __post_init__(self) -> None:
        if self.wait_first and not self.dependent:
            raise ValueError("only a dependent warpgroup kernel waits first: dependent=True")

    @property
    def threads(self) -> int:
        return self.shape.threads

    @property
    def name(self) -> str:
        dep = ("_depw" if self.wait_first else "_dep") if self.dependent else ""
        return f"w8a8_gemm_wgmma_{self.shape.name}_{self.output.suffix}{dep}"


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
            memory.cp_async_16_at(stage, slot + i * (ROW_BYTES * rows_per_pass), pairs, source, valid)

    return start_copies


def _kernel(epilogue: Epilogue, out: ElementKind, shape: WgmmaShape, dependent: bool, wait_first: bool):
    """The kernel body: one function, because numba compiles a kernel from one Python function and its
    shared and local arrays must be declared in it."""
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
    mma, wait_one, wait_done = sm90a.wgmma_s8(tile_n), sm90a.wgmma_wait(1), sm90a.wgmma_wait(0, count)
    wait_copies, wait_all = memory.cp_async_wait_group(stages - 3), memory.cp_async_wait_group(0)
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
        raw = memory.shared_address(stage)
        base = (raw + (SLOT_ALIGNMENT - 1)) & ~np.uint32(SLOT_ALIGNMENT - 1)
        a_origin, w_origin = memory.global_address(a_pairs), memory.global_address(w_pairs)
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
            memory.grid_dependency_wait()
            memory.launch_dependents()
        # steps 0 .. stages - 3 in flight before the first multiply; one commit group per step, empty
        # or zero-filled past K, so that the group count stays in step
        for step in range(stages - 2):
            slot = base + step * slot_bytes + into_slot
            k_ok = pieces * step + piece < k_pairs
            start_a(stage, slot, a_pairs, a_origin, a_first, row_stride, a_live, step, k_ok)
            if not early_weight:
                start_w(stage, slot + w_offset, w_pairs, w_origin, w_first, row_stride, w_live, step, k_ok)
            memory.cp_async_commit()
        for step in range(steps):
            # this thread's copies of `step` have landed (fenced for the tensor cores' reads); after
            # the barrier everyone's have, and every warpgroup has finished the batch of step - 2,
            # the one that read the slot the next copies overwrite
            wait_copies()
            sm90a.fence_proxy_async()
            cuda.syncthreads()
            ahead = step + stages - 2
            slot = base + (ahead % stages) * slot_bytes + into_slot
            k_ok = pieces * ahead + piece < k_pairs
            start_a(stage, slot, a_pairs, a_origin, a_first, row_stride, a_live, ahead, k_ok)
            start_w(stage, slot + w_offset, w_pairs, w_origin, w_first, row_stride, w_live, ahead, k_ok)
            memory.cp_async_commit()
            current = base + (step % stages) * slot_bytes
            desc_a = descriptor(current + ROW_BYTES * WARPGROUP_ROWS * warpgroup)
            desc_b = descriptor(current + w_offset)
            sm90a.wgmma_fence()
            for kk in range(ROW_BYTES // 32):  # 32 bytes of k per wgmma: 2 in the descriptor's units
                mma(acc, desc_a + _U64(2 * kk), desc_b + _U64(2 * kk))
            sm90a.wgmma_commit()
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
        if vector_columns and N % 8 == 0 and sm90a.array_address(out_elems) % 16 == 0:
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
                        a0, a1, a2, a3 = sm90a.load_s32x4(parked, at)
                        a4, a5, a6, a7 = sm90a.load_s32x4(parked, at + 4)
                        sm90a.store_16_bytes(out_elems, m * N + n0, encoded4(a0, a1, a2, a3, rs, cs, bs, 0),
                                       encoded4(a4, a5, a6, a7, rs, cs, bs, 4))
        else:
            for index in range(tid, tile_m * tile_n, threads):
                r, c = index // tile_n, index % tile_n
                store(np.int64(parked[first + r * parked_row + c]), m_block + r, n_block + c, M, N, row_scale,
                      col_scale, bias, out_elems, tensor_scale)

    return kernel


@functools.cache
def warpgroup_kernel(config: WarpgroupConfig) -> HopperKernel:
    """The ``wgmma`` GEMM + epilogue of ``config`` (cached on it), compiled to sm_90a PTX on first use: the
    family's arguments and grid (one block per ``tile_m x tile_n`` output tile, row tiles fastest; 16-byte
    aligned operands, ``K % 16 == 0``), ``shape.threads`` threads and ``shape.shared_bytes`` of dynamic shared
    memory per block, launch bounds of ``shape.min_blocks``."""
    out = config.output.element
    kernel = _kernel(epilogue(config.output), out, config.shape, config.dependent, config.wait_first)
    kernel.__name__ = kernel.__qualname__ = config.name
    return HopperKernel(kernel, gemm_signature(config.output),
                        (("launch_bounds", (config.shape.threads, config.shape.min_blocks)),))
