"""The int8 GEMM of the W8A8 linear layers, on tensor cores.

``y[m, n] = f32(acc[m, n]) * row_scale[m] * col_scale[n] (+ bias[n])`` with
``acc[m, n] = sum_k a[m, k] * w[n, k]`` accumulated exactly in int32 by
``mma.sync.m16n8k32.s8`` (:func:`baracuda_numba.kernels.device.mma_s8`), ``a`` ``[M, K]`` int8
row-major (quantized activations), ``w`` ``[N, K]`` int8 row-major (``nn.Linear.weight``), the
epilogue in float32 and the result stored in the output element. The row scale is per token
(``row_scale[m]``) or one static per-tensor value (SmoothQuant).

Both kernels walk ``K`` in 64-byte chunks. Each lane brings 16 contiguous bytes of a row
(``k = 16 t .. 16 t + 15`` for lane ``4 g + t``) and feeds them to two mmas: words 0, 1 to the first,
words 2, 3 to the second. That permutes ``k`` inside the chunk relative to the mma's own operand
layout, identically for ``a`` and ``w``, so the dot products are unchanged while every access is a
16-byte vector. Rows and ``k`` past the edges read as zero; when ``K % 16 != 0`` or an operand is not
16-byte aligned the chunks are assembled from bytes.

- ``tiled``: a ``128 x 128`` output tile per block of 8 warps (``2 x 4``, each ``64 x 32``), ``a`` and
  ``w`` chunks staged through double-buffered shared memory (one barrier per 64 ``k``), the next
  chunk's global loads issued before the current chunk's mmas. The epilogue parks the accumulators
  in the staging buffer one 64-row band at a time and stores consecutive columns per thread
  (coalesced; ``acc`` is indexed only by constants, so it never leaves registers). Tiles are
  numbered along ``M`` fastest on a 1-D grid, so ``M`` has no 65535-row limit.
- ``skinny`` (``M <= 64``, decode): bandwidth-bound on the weight. A block owns 16 rows x 8 output
  columns; its 8 warps split ``K`` and reduce through shared memory, so even ``N = 4096`` gives 4096
  warps of independent 16-byte weight loads. The row tiles of one column slice are neighbouring
  blocks: the weight comes from HBM once and from L2 for the other (at most three) row tiles.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numba import cuda

from ..platform import SIMULATOR
from ..vocabulary import ElementKind, MathPrecision
from . import device
from .codecs import codec, math_type
from .device import device_function
from .elementwise import ElementwiseKernel, uint_name

__all__ = ["TILE_M", "TILE_N", "TILE_THREADS", "SKINNY_MAX_M", "SKINNY_M", "SKINNY_N", "SKINNY_THREADS", "MAX_EXACT_K",
           "CHUNK_K", "PipelineShape", "PIPELINE", "PIPELINE_LARGE", "SKINNY_CHUNKS", "SKINNY_TILES", "linear_kernel",
           "pipeline_shape", "skinny_chunks", "skinny_tiles"]

# Decode speeds quoted in this module's comments through session 24 are % of a device-to-device copy
# captured in a CUDA graph (a memcpy node, about 2430 GB/s on the H100); from session 25 on, % of an
# eager copy (about 3008 GB/s, the bench's ceiling; benchmarks/probe_copy.py). Multiply the former by
# 0.81 to compare.
CHUNK_K = 64  # k per step: 16 bytes per lane, 4 lanes per row
# tiled: warps arranged WARPS_M x WARPS_N, each MT x NT mma tiles (16 rows x 8 columns each)
WARPS_M, WARPS_N, MT, NT = 2, 4, 4, 4
TILE_M, TILE_N = 16 * MT * WARPS_M, 8 * NT * WARPS_N
TILE_THREADS = 32 * WARPS_M * WARPS_N
STAGE_WORDS_A = 2 * TILE_M * CHUNK_K // 8  # two stages of activation rows, as uint64
STAGE_WORDS = STAGE_WORDS_A + 2 * TILE_N * CHUNK_K // 8  # and two of weight rows
assert TILE_M == TILE_N == 2 * (TILE_THREADS // 4), "each thread stages two rows of each tile"
# skinny (M <= SKINNY_MAX_M): SKINNY_WARPS warps split K for one 16 x 8 mma tile per block
SKINNY_MAX_M, SKINNY_M, SKINNY_N, SKINNY_WARPS = 64, 16, 8, 8
SKINNY_THREADS = 32 * SKINNY_WARPS
SKINNY_CHUNKS = 2  # byte-path skinny kernel: 64-byte weight chunks each warp has in flight per iteration
SKINNY_TILES: int | None = None  # 8-column tiles per block sharing each activation fragment; None: skinny_tiles(k)
# the cache operators of the decode kernels' weight loads on aligned operands, for every plan (device.LOAD_HINTS;
# "": plain ld.global); None: each plan's rule (plans.linear.WEIGHT_NO_L1_*)
WEIGHT_LOAD_HINT: str | None = None
# fused skinny: 16-byte pieces of x each thread has in flight in the scale pass (and keeps for the
# quantize when they are all its pieces: M = 1 up to K = 8192 for 16-bit x). 8 spills at 80 registers.
ABSMAX_LOADS = 4
# ... and under launch bounds of 2 blocks (the static one-wave fused kernel), where registers are to spare:
# every piece a thread has for up to this many (one round trip to L2 for the rows, none for the quantize);
# None: ABSMAX_LOADS there too
WIDE_X_LOADS_MAX: int | None = 8
# fused skinny: the prologue compiled for the plan's M and K where all of a thread's pieces are in flight
# at once (fixed_prologue), its loops unrolled so that the rows' latency chains overlap. Session 24 (H100,
# graph replay, % of copy, general -> fixed): static 4096^2 M = 1 / 2 / 4 84.5 / 77.4 / 63.4 -> 88.2 / 83.4
# / 72.7; the default fused kernel 4096^2 M = 1 / 2 65.7-66.2 / 61.8-62.2 -> 68.1-68.5 / 64.9-65.2 (other
# runs); 8192^2 M = 1 101.8-102.0 -> 106.1. PTX between the wait and the first mma (static, bf16): 2273 ->
# 563 / 854 / 1426 instructions at M = 1 / 2 / 4, 128 -> 90-92 registers.
FIXED_PROLOGUE = True
# fused skinny: main-loop iterations of weight prefetched into L2 while x is quantized (0: only the
# first iteration, into registers); not yet measured on a GPU, see benchmarks/tune_linear.py --only fused
FUSED_PREFETCH_L2 = 0
# fused skinny with 2 column tiles: launch bounds of 3 blocks per multiprocessor (80 registers, as many
# blocks as the unfused kernel's 70; ptxas reports no spill for 16- and 32-bit x, a little for float64)
FUSED_MIN_BLOCKS = 3
# fused skinny launched as a programmatic dependent (plans.linear.FUSED_DEPENDENT_MIN_K): main-loop
# iterations of weight it asks L2 for before it waits for the kernel before it (0: it waits first thing).
# A prefetch holds no data, so whatever that kernel writes is read after the wait all the same. Session 22
# (H100, back-to-back quantized_linear in graph replay, % of copy, 0 -> 1 / 2 / 4 / 8 iterations):
# 8192^2 M = 1 96.1 -> 82.1 / 99.7 / 97.2 / 92.5 (100.0 with 2 in a second run), M = 2 86.3 -> 72.5 / 87.9
# / 84.4 / 82.7 (88.6); K = 4096 (launched plainly as shipped, measured as dependents) 63.1 -> 65.2 at
# 4096^2, 78.3 -> 82.5 at 11008 x 4096, where the two launches stay faster.
FUSED_EARLY_L2 = 2
# cooperative skinny: main-loop iterations of weight prefetched into L2 while the rows are quantized
# (after the first, loaded into registers), and the pause between polls of the quantizers' counter
COOPERATIVE_PREFETCH_L2 = 0
SPIN_NANOSECONDS = 128
# skinny kernels on aligned operands (``vector_only``: no byte path) double-buffer their weight
# fragments (the next iteration's loads issued before the current mmas): single-buffered, ptxas
# issues them late (54-73 % of copy, ncu: 14 cycles of long-scoreboard stall per instruction).
# Chunks in flight per buffer, measured in session 14 (H100, GPU time, weights rotating past L2,
# % of copy at 4096^2 / 8192^2 / 11008 x 4096, notes/gemm.md): the GEMM alone 2 (M = 16: 76.4 /
# 85.2 / 84.9, against 66.4 / 81.8 / 71.4 with 1); the one-launch kernels 1 (2 spills under their
# launch bounds: fused M = 1 at 63.6 / 83.1 / 74.5 against 64.0 / 94.0 / 80.1 with 1).
VECTOR_CHUNKS = 2
ONE_LAUNCH_CHUNKS = 1
# With 4 column tiles (K >= 8192) the unfused kernel at 2 chunks takes 140 registers: one block of 256
# threads per multiprocessor. Where its blocks outnumber the multiprocessors (more than one wave at one
# per SM) it keeps this many chunks instead: 128 registers, two blocks per SM, one wave. Session 25 (H100,
# graph replay, % of the eager copy; the GEMM alone / the two launches at M = 1 / 4 / 16): 8192^2 2 chunks
# 76.4 / 75.7 / 73.3 and 68.3 / 68.4 / 66.2, 1 chunk 84.4 / 84.4 / 80.4 and 76.7 / 75.2 / 70.4; at 4096 x
# 11008 (128 blocks: one wave either way) 1 chunk is 2.6-5.1 points slower.
MULTI_WAVE_WIDE_CHUNKS = 1
# the two-launch decode GEMM, launched as the quantizer's programmatic dependent (plans.linear.DEPENDENT_GEMM):
# buffers of weight fragments each warp loads before it waits for the quantizer, chunks per buffer and
# launch bounds (blocks per multiprocessor, 0: none). Session 15 (H100, GPU time of quantized_linear, %
# of copy, M = 1 / 16 at 4096^2, 11008 x 4096): 1 buffer 65.7 / 60.7, 84.2 / 77.1; 2 buffers 62.3 / 57.0,
# 78.0 / 71.1 (equal at 8192^2): the second buffer's loads make the kernel's main loop slower (the GEMM
# alone at 4096^2, M = 1: 75.7 against 80.0 for the kernel without them).
DEPENDENT_PRELOAD = 1
DEPENDENT_CHUNKS: int | None = None  # None: skinny_chunks()'s rule
# launch bounds of the dependent kernel (blocks per multiprocessor, 0: none; None: dependent_min_blocks()'s
# rule: 2 with 2 column tiles, where ptxas's own choice is already 128 registers). Session 25 (the GEMM alone /
# the two launches, % of the eager copy, M = 1 / 4 / 16, none -> 2): 4096^2 80.0 / 77.0 / 72.3 -> 84.3 /
# 80.3 / 72.6 and 56.2 / 55.9 / 49.0 -> 56.2 / 55.5 / 49.0; 11008 x 4096 79.5 / 77.1 / 72.0 -> 79.4 / 77.0 /
# 73.2 and 70.6 / 68.8 / 64.7 -> 71.7 / 69.0 / 65.8. With 4 tiles, 2 blocks spill (40 bytes) and are slower.
DEPENDENT_MIN_BLOCKS: int | None = None
# registers per thread the dependent GEMM is compiled to (0: ptxas's choice, 128 with 2 column tiles).
# Two blocks of 128 take a multiprocessor's whole register file, so where a quantizer block runs (99
# registers x 128 threads at K = 4096) one GEMM block cannot start until the quantizer is done.
DEPENDENT_MAX_REGISTERS = 0
# main-loop iterations after the preloaded ones that each thread asks L2 for (``prefetch.L2``, no
# registers held) before it waits for the quantizer, where dependent_prefetch() asks for them (None:
# its rule, else this many at every shape)
DEPENDENT_PREFETCH_L2: int | None = None
# main-loop iterations of weight the dependent GEMM copies into shared memory (``cp.async``, no register
# held, one commit group each) before it waits for the quantizer, where dependent_staged() stages them
# (None: its rule, else this many at every shape, as far as DEPENDENT_STAGE_BYTES allow)
DEPENDENT_STAGED: int | None = None
# the same for the one-launch kernels, before their prologue (fused: past its quantized rows) / before
# their quantize and wait (cooperative)
FUSED_STAGED = 0
COOPERATIVE_STAGED = 0
# dynamic shared bytes per block the staging kernels may take (two blocks of 256 threads and up to 128
# registers per multiprocessor: STAGED_MIN_BLOCKS)
DEPENDENT_STAGE_BYTES = 96 * 1024
STAGED_MIN_BLOCKS = 2  # launch bounds of the staging kernel (ptxas takes 130-136 registers without them)
STAGED_MAX = 8  # commit groups a thread can count down (cp.async.wait_group takes a constant)
# (Loading both buffers before the one-launch prologue, 2 iterations in flight while x is quantized,
# was 0.4-2.9 points slower at every shape: notes/gemm.md.)
# cooperative skinny with 2 column tiles: 91 registers (2 blocks per multiprocessor, where the unfused
# kernel's 70 fit 3): launch bounds of this many blocks (80 registers, 20 bytes spilled)
COOPERATIVE_MIN_BLOCKS = 3
# |acc| <= K * 127 * 128 (activations in [-127, 127], weights in [-128, 127]) must stay below 2**31.
MAX_EXACT_K = (2**31 - 1) // (127 * 128)

# 16-byte vector accesses need 16-byte aligned staging (the simulator takes no alignment argument)
STAGE_ALIGNMENT = None if SIMULATOR else 16
# the simulator sizes a dynamic shared array by its dtype's itemsize: it needs a dtype instance there
_DYNAMIC_STAGE_DTYPE = np.dtype(np.uint64) if SIMULATOR else np.uint64
_DYNAMIC_BYTE_DTYPE = np.dtype(np.uint8) if SIMULATOR else np.uint8
_U64 = np.uint64
_LOW32 = _U64(0xFFFFFFFF)


@dataclass(frozen=True)
class PipelineShape:
    """Geometry of the ``pipelined`` kernel: ``warps_m x warps_n`` warps, each ``mt x nt`` mma tiles
    (16 rows x 8 columns each), ``stages`` 64-k chunks of both operand tiles in flight through
    shared memory (``shared_bytes`` of dynamic shared memory)."""

    warps_m: int = 2
    warps_n: int = 4
    mt: int = 4
    nt: int = 4
    stages: int = 3

    @property
    def tile_m(self) -> int:
        return 16 * self.mt * self.warps_m

    @property
    def tile_n(self) -> int:
        return 8 * self.nt * self.warps_n

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def stage_pairs(self) -> int:
        """16-byte pairs of one stage: both tiles' rows, 64 bytes (4 pairs) each."""
        return 4 * (self.tile_m + self.tile_n)

    @property
    def shared_bytes(self) -> int:
        return 16 * self.stages * self.stage_pairs

    @property
    def name(self) -> str:
        return f"{self.tile_m}x{self.tile_n}_w{self.warps_m}x{self.warps_n}_s{self.stages}"


# Measured on an H100 (benchmarks/tune_linear.py, notes/gemm.md): 128 x 128 with 4 stages everywhere;
# 128 x 256 (64 x 64 per warp, 3 stages, spills a little) is 4-13 % faster where its tiles fill the SMs'
# waves, and 0-4 % faster than 256 x 128 at every shape measured.
PIPELINE = PipelineShape(stages=4)
PIPELINE_LARGE: PipelineShape | None = PipelineShape(2, 4, 4, 8, 3)


def pipeline_shape(m: int, n: int, multiprocessors: int) -> PipelineShape:
    """The pipelined kernel's shape for an ``m x n`` output: the large tile when its last wave of
    blocks is at least 90 % full (one block per multiprocessor), else the 128 x 128 one."""
    large = PIPELINE_LARGE
    if large is not None:
        tiles = -(-m // large.tile_m) * -(-n // large.tile_n)
        waves = -(-tiles // multiprocessors)
        if tiles >= 0.9 * waves * multiprocessors:
            return large
    return PIPELINE


def fused_shared_bytes(m: int, k: int) -> int:
    """Dynamic shared memory of the fused skinny kernel: ``m`` quantized rows of ``k + 16`` bytes."""
    return min(m, SKINNY_M) * (k + 16)


def fused_min_blocks(tiles: int, x_element: ElementKind, cooperative: bool = False) -> int:
    """The fused (or ``cooperative``) skinny kernel's ``fused_min_blocks`` (see :func:`linear_kernel`):
    ``FUSED_MIN_BLOCKS`` (``COOPERATIVE_MIN_BLOCKS``) with at most 2 column tiles and 16- or 32-bit
    ``x`` (no spills, or a few bytes, there under its register cap), else 0."""
    blocks = COOPERATIVE_MIN_BLOCKS if cooperative else FUSED_MIN_BLOCKS
    return blocks if tiles <= 2 and x_element.itemsize <= 4 else 0


def fused_x_loads(m: int, k: int, x_element: ElementKind, min_blocks: int) -> int:
    """The fused kernel's ``x_loads`` (16-byte pieces of ``x`` each thread has in flight in its prologue):
    ``ABSMAX_LOADS`` under launch bounds of 3 or more blocks (or none); under 2, every piece of the
    thread's ``min(m, SKINNY_M)`` rows up to ``WIDE_X_LOADS_MAX``, a multiple of ``ABSMAX_LOADS``."""
    if WIDE_X_LOADS_MAX is None or min_blocks == 0 or min_blocks > 2:
        return ABSMAX_LOADS
    per_row = -(-(k * x_element.itemsize // 16) // SKINNY_THREADS)
    pieces = -(-min(m, SKINNY_M) * per_row // ABSMAX_LOADS) * ABSMAX_LOADS
    return max(ABSMAX_LOADS, min(pieces, WIDE_X_LOADS_MAX))


def fixed_prologue(m: int, k: int, x_element: ElementKind, x_loads: int) -> tuple[int, int] | None:
    """``(rows, pieces per row per thread)`` of a fused prologue compiled for one shape (``m <= SKINNY_M``,
    one row tile; every piece of the thread's rows in flight at once: at most ``x_loads``), else None."""
    per_row = -(-(k * x_element.itemsize // 16) // SKINNY_THREADS)
    return (m, per_row) if 0 < m <= SKINNY_M and m * per_row <= x_loads else None


ONE_WAVE_DEEP_PREFETCH_MIN_M = 4  # tokens from which the one-wave dependent GEMM asks L2 for two iterations


def dependent_prefetch(m: int, n: int, k: int, one_wave: bool = False) -> int:
    """Main-loop iterations of weight the dependent decode GEMM asks L2 for before it waits for the
    quantizer (``DEPENDENT_PREFETCH_L2`` when set). One, for weights of at most 4096 rows with long
    rows (K >= 8192) or up to 4 tokens: there the blocks are few, and the prefetch keeps HBM busy while
    the quantizer runs. Session 16 (H100, GPU time of ``quantized_linear``, % of copy, M = 1 / 2 / 4 /
    8 / 16, none -> one iteration): 4096 x 11008 73.5 / 74.3 / 74.2 / 73.4 / 72.1 -> 76.0 / 76.6 / 76.6 /
    75.5 / 73.4; 4096^2 65.5 / 65.1 / 65.4 -> 66.5 / 67.0 / 67.2 (M = 8 / 16: 1.2-1.7 points slower);
    8192^2 and 11008 x 4096: 0.4-2.5 points slower at every M, and 2 or 4 iterations slower still.

    One also at K >= 8192 where the blocks fit one wave at two per SM (``one_wave``), whose weight loads skip
    L1 there (``plans.linear.WEIGHT_NO_L1_MIN_K``), and two there from ``ONE_WAVE_DEEP_PREFETCH_MIN_M`` tokens on
    weights of more than 4096 rows.
    Session 28 (call 5, two launches, % of the eager copy, 8192^2 M = 1 / 16, none -> 1 / 2 iterations): 76.9 /
    71.3 -> 82.2 / 75.7 and 80.9 / 77.2; 4096^2 M = 16 (K < 8192) 51.8 -> 49.9 / 48.5. Session 29 (call 2,
    8192^2 M = 4 / 8 / 16, 1 -> 2 iterations): 79.0 / 77.9 / 76.0 -> 80.8 / 79.5 / 77.3."""
    if DEPENDENT_PREFETCH_L2 is not None:
        return DEPENDENT_PREFETCH_L2
    if k >= 8192 and one_wave:
        return 2 if m >= ONE_WAVE_DEEP_PREFETCH_MIN_M and n > 4096 else 1
    return 1 if n <= 4096 and (k >= 8192 or m <= 4) else 0


def staged_iteration_bytes(chunks_in_flight: int, n_tiles: int) -> int:
    """Shared bytes one staged main-loop iteration of the skinny kernel takes: every thread's
    ``chunks_in_flight x n_tiles`` 16-byte weight pieces."""
    return 16 * chunks_in_flight * n_tiles * SKINNY_THREADS


def staged_iterations(wanted: int, k: int, chunks_in_flight: int, n_tiles: int, other_bytes: int = 0) -> int:
    """``wanted`` staged iterations of the skinny kernel, at most the iterations ``k`` has, ``STAGED_MAX``
    and what ``DEPENDENT_STAGE_BYTES`` holds next to ``other_bytes`` of dynamic shared memory."""
    iterations = -(-k // (CHUNK_K * chunks_in_flight * SKINNY_WARPS))
    fits = (DEPENDENT_STAGE_BYTES - other_bytes) // staged_iteration_bytes(chunks_in_flight, n_tiles)
    return max(0, min(wanted, iterations, fits, STAGED_MAX))


def dependent_staged(m: int, n: int, k: int, chunks_in_flight: int, n_tiles: int) -> int:
    """Main-loop iterations of weight the dependent decode GEMM stages in shared memory before it waits
    for the quantizer: ``DEPENDENT_STAGED`` when set, else the rule, within :func:`staged_iterations`."""
    wanted = DEPENDENT_STAGED if DEPENDENT_STAGED is not None else 0
    return staged_iterations(wanted, k, chunks_in_flight, n_tiles)


def one_launch_staged(m: int, n: int, k: int, chunks_in_flight: int, n_tiles: int, cooperative: bool) -> int:
    """Main-loop iterations of weight the fused (next to its quantized rows) or ``cooperative`` kernel
    stages in shared memory before its prologue: ``FUSED_STAGED`` / ``COOPERATIVE_STAGED`` within
    :func:`staged_iterations`."""
    if cooperative:
        return staged_iterations(COOPERATIVE_STAGED, k, chunks_in_flight, n_tiles)
    return staged_iterations(FUSED_STAGED, k, chunks_in_flight, n_tiles, fused_shared_bytes(m, k))


def skinny_chunks(one_launch: bool = False, dependent: bool = False, n_tiles: int = 2, blocks: int = 0,
                  multiprocessors: int = 0) -> int:
    """Weight chunks in flight per buffer of the double-buffered skinny kernels (``one_launch``: the
    fused and cooperative ones; ``dependent``: the quantizer's programmatic dependent): ``VECTOR_CHUNKS``
    for the unfused ones, but ``MULTI_WAVE_WIDE_CHUNKS`` with 4 column tiles where ``blocks`` outnumber
    the ``multiprocessors`` (``DEPENDENT_CHUNKS``, when set, for the dependent one)."""
    if dependent and DEPENDENT_CHUNKS is not None:
        return DEPENDENT_CHUNKS
    if one_launch:
        return ONE_LAUNCH_CHUNKS
    return MULTI_WAVE_WIDE_CHUNKS if n_tiles >= 4 and blocks > multiprocessors else VECTOR_CHUNKS


def dependent_min_blocks(n_tiles: int) -> int:
    """Launch bounds (blocks per multiprocessor) of the dependent skinny kernel: ``DEPENDENT_MIN_BLOCKS``
    when set, else 2 with 2 column tiles (the 128 registers ptxas takes anyway), none with 4."""
    if DEPENDENT_MIN_BLOCKS is not None:
        return DEPENDENT_MIN_BLOCKS
    return 2 if n_tiles == 2 else 0


def skinny_tiles(k: int) -> int:
    """Column tiles per skinny block: measured best with 4 for K >= 8192, 2 below (rotating weights
    past L2, M = 1 and 16)."""
    if SKINNY_TILES is not None:
        return SKINNY_TILES
    return 4 if k >= 8192 else 2


@device_function
def load_chunk(bytes_view, pairs_view, row, rows, k, K, aligned):
    """Bytes ``k .. k + 15`` of row ``row`` of a ``[rows, K]`` int8 matrix as two little-endian
    uint64; zeros past the edges."""
    lo = _U64(0)
    hi = _U64(0)
    if row < rows and k < K:
        start = row * K + k
        if aligned and k + 16 <= K:
            lo, hi = device.load_u64x2(pairs_view, start // 16)
        else:
            # a runtime-length loop keeps this rare path small where it is inlined
            for i in range(min(K - k, 16)):
                byte = _U64(bytes_view[start + i])
                if i < 8:
                    lo |= byte << _U64(8 * i)
                else:
                    hi |= byte << _U64(8 * i - 64)
    return lo, hi


@functools.cache
def vector_chunk_loader(hint: str = ""):
    """``load_vector_chunk(pairs_view, row, rows, k, K)``: :func:`load_chunk` of a matrix known to be
    16-byte aligned with ``K % 16 == 0`` (``k`` a multiple of 16), one vector load (with the cache
    operators of ``hint``, see :func:`~baracuda_numba.kernels.device.hinted_load_u64x2`) or zeros, no
    byte path."""
    load_pair = device.hinted_load_u64x2(hint)

    @device_function
    def load_vector_chunk(pairs_view, row, rows, k, K):
        lo = _U64(0)
        hi = _U64(0)
        if row < rows and k < K:
            lo, hi = load_pair(pairs_view, (row * K + k) >> 4)  # a shift: row * K + k >= 0
        return lo, hi

    return load_vector_chunk


load_vector_chunk = vector_chunk_loader()


@device_function
def mma_chunk(acc, base, x0, x1, y0, y1, w0, w1, scratch, tid):
    """``acc[base .. base + 3] +=`` one 16 x 8 tile over a 64-k chunk: rows ``g`` / ``g + 8`` of ``a`` as
    ``(x0, x1)`` / ``(y0, y1)``, column ``g`` of ``w`` as ``(w0, w1)`` (two mmas, see the module doc)."""
    c0, c1, c2, c3 = device.mma_s8(x0 & _LOW32, y0 & _LOW32, x0 >> _U64(32), y0 >> _U64(32),
                                   w0 & _LOW32, w0 >> _U64(32),
                                   acc[base], acc[base + 1], acc[base + 2], acc[base + 3], scratch, tid)
    c0, c1, c2, c3 = device.mma_s8(x1 & _LOW32, y1 & _LOW32, x1 >> _U64(32), y1 >> _U64(32),
                                   w1 & _LOW32, w1 >> _U64(32), c0, c1, c2, c3, scratch, tid)
    acc[base] = c0
    acc[base + 1] = c1
    acc[base + 2] = c2
    acc[base + 3] = c3


class Epilogue(NamedTuple):
    """The device functions of one output's epilogue (see :func:`_epilogue`)."""

    store: Any
    row_param: Any
    column_params: Any
    store_with: Any
    encoded: Any


def _epilogue(out: ElementKind, has_bias: bool, per_tensor_rows: bool) -> Epilogue:
    encode = codec(out, MathPrecision.F32).encode
    f32 = np.float32

    @device_function
    def column_params(n, N, col_scale, bias):
        """``(col_scale[n], bias[n])`` (zeros past ``N``, bias 0 without one)."""
        cs = b = f32(0)
        if n < N:
            cs = col_scale[n]
            if has_bias:
                b = bias[n]
        return cs, b

    @device_function
    def encoded(acc_value, rs, cs, b):
        """The output element's bits of ``(f32(acc) * rs) * cs (+ b)``."""
        value = f32(acc_value) * rs * cs
        if has_bias:
            value = device.add_rn(value, b)
        return encode(value)

    @device_function
    def store_with(acc_value, rs, cs, b, m, n, M, N, out_elems):
        """``out[m, n] = (f32(acc) * rs) * cs (+ b)`` inside the matrix."""
        if m < M and n < N:
            out_elems[m * N + n] = encoded(acc_value, rs, cs, b)

    @device_function
    def row_param(m, row_scale, tensor_scale):
        """Row ``m``'s activation scale (``m < M``)."""
        return tensor_scale if per_tensor_rows else f32(row_scale[m])

    @device_function
    def store(acc_value, m, n, M, N, row_scale, col_scale, bias, out_elems, tensor_scale):
        """``out[m, n] = (f32(acc) * row scale) * col_scale[n] (+ bias[n])`` inside the matrix."""
        if m < M and n < N:
            cs, b = column_params(n, N, col_scale, bias)
            store_with(acc_value, row_param(m, row_scale, tensor_scale), cs, b, m, n, M, N, out_elems)

    return Epilogue(store, row_param, column_params, store_with, encoded)


def _tiled(store):
    slots, w_words = 4 * MT * NT, 2 * NT  # local array lengths must be compile-time constants
    w_offset = STAGE_WORDS_A // 2  # the weight stages follow the activation stages (in 16-byte pairs)
    half_rows = TILE_M // WARPS_M  # the epilogue stages the output tile in WARPS_M horizontal bands
    band_words = half_rows * TILE_N // 2  # int32 accumulators, two per uint64
    assert band_words <= STAGE_WORDS, "an output band must fit in the staging buffer"

    def kernel(a_bytes, a_pairs, w_bytes, w_pairs, row_scale, col_scale, bias, out_elems,
               M, N, K, tiles_m, aligned, tensor_scale):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array((TILE_THREADS, 6), np.int32)  # used only by the simulator's mma
        # [activation stage 0, 1 | weight stage 0, 1], each [rows, 64 bytes]; then the output bands
        stage = cuda.shared.array(STAGE_WORDS, np.uint64, alignment=STAGE_ALIGNMENT)
        acc = cuda.local.array(slots, np.int32)
        w_frag = cuda.local.array(w_words, np.uint64)
        warp, lane = tid // 32, tid % 32
        group, t = lane // 4, lane % 4
        tile_n = cuda.blockIdx.x // tiles_m
        tile_m = cuda.blockIdx.x - tile_n * tiles_m
        m_block, n_block = tile_m * TILE_M, tile_n * TILE_N
        band = warp % WARPS_M
        m_warp = band * (16 * MT)
        n_warp = (warp // WARPS_M) * (8 * NT)
        for i in range(slots):
            acc[i] = 0
        # this thread stages rows `row` and `row + TILE_THREADS // 4` of both tiles, 16 bytes each
        row, part = tid // 4, tid % 4
        far = row + TILE_THREADS // 4
        steps = (K + CHUNK_K - 1) // CHUNK_K
        # step -1 only stages chunk 0; every later step loads the next chunk's rows before this
        # chunk's mmas (zeros past K) and stages them once its own stage has been read
        for step in range(-1, steps):
            k_next = CHUNK_K * (step + 1) + 16 * part
            a0, a1 = load_chunk(a_bytes, a_pairs, m_block + row, M, k_next, K, aligned)
            a2, a3 = load_chunk(a_bytes, a_pairs, m_block + far, M, k_next, K, aligned)
            w0, w1 = load_chunk(w_bytes, w_pairs, n_block + row, N, k_next, K, aligned)
            w2, w3 = load_chunk(w_bytes, w_pairs, n_block + far, N, k_next, K, aligned)
            if step >= 0:
                a_base = 4 * ((step % 2) * TILE_M + m_warp + group) + t
                w_base = w_offset + 4 * ((step % 2) * TILE_N + n_warp + group) + t
                for ni in range(NT):
                    w_frag[2 * ni], w_frag[2 * ni + 1] = device.load_u64x2(stage, w_base + 32 * ni)
                for mi in range(MT):
                    x0, x1 = device.load_u64x2(stage, a_base + 64 * mi)
                    y0, y1 = device.load_u64x2(stage, a_base + 64 * mi + 32)
                    for ni in range(NT):
                        mma_chunk(acc, 4 * (mi * NT + ni), x0, x1, y0, y1, w_frag[2 * ni], w_frag[2 * ni + 1],
                                  scratch, tid)
            # the other stage was last read before the previous barrier
            other = (step + 1) % 2
            device.store_u64x2(stage, 4 * (other * TILE_M + row) + part, a0, a1)
            device.store_u64x2(stage, 4 * (other * TILE_M + far) + part, a2, a3)
            device.store_u64x2(stage, w_offset + 4 * (other * TILE_N + row) + part, w0, w1)
            device.store_u64x2(stage, w_offset + 4 * (other * TILE_N + far) + part, w2, w3)
            cuda.syncthreads()
        # Epilogue, one band of rows at a time: the band's warps park their accumulators in shared
        # memory (constant indices into `acc`, so it stays in registers), then every thread stores
        # consecutive columns (coalesced) through the epilogue.
        for current in range(WARPS_M):
            if band == current:
                for mi in range(MT):
                    for ni in range(NT):
                        base = 4 * (mi * NT + ni)
                        word = (16 * mi + group) * (TILE_N // 2) + (n_warp + 8 * ni) // 2 + t
                        stage[word] = (_U64(acc[base]) & _LOW32) | (_U64(acc[base + 1]) << _U64(32))
                        stage[word + 4 * TILE_N] = (_U64(acc[base + 2]) & _LOW32) | (_U64(acc[base + 3]) << _U64(32))
            cuda.syncthreads()
            for index in range(tid, 2 * band_words, TILE_THREADS):
                r, c = index // TILE_N, index % TILE_N
                word = stage[r * (TILE_N // 2) + c // 2]
                value = np.int64((word >> _U64(32 * (c % 2))) & _LOW32)
                if value >= 2**31:  # back to the signed accumulator
                    value -= 2**32
                store(value, m_block + current * half_rows + r, n_block + c, M, N, row_scale, col_scale, bias,
                      out_elems, tensor_scale)
            cuda.syncthreads()

    return kernel


@device_function
def swizzled(row, piece):
    """The 16-byte pair of shared memory holding 16-byte ``piece`` (0 .. 3) of staged 64-byte row
    ``row``: pieces rotate by ``row / 2`` so that the eight rows an ``ldmatrix`` phase reads (one
    piece each) fall in distinct banks."""
    return 4 * row + (piece ^ ((row >> 1) & 3))


def _pipelined(store, shape: PipelineShape):
    tile_m, tile_n, threads, stages = shape.tile_m, shape.tile_n, shape.threads, shape.stages
    mt, nt, warps_m = shape.mt, shape.nt, shape.warps_m
    slots, w_words = 4 * mt * nt, 2 * nt  # local array lengths must be compile-time constants
    assert nt % 2 == 0, "one ldmatrix.x4 brings the weight fragments of two column tiles"
    stage_bytes, w_offset = 16 * shape.stage_pairs, 64 * tile_m  # a stage: [a rows | w rows], 64 bytes a row
    ring_bytes = stages * stage_bytes
    a_copies, w_copies = 4 * tile_m // threads, 4 * tile_n // threads
    assert a_copies * threads == 4 * tile_m and w_copies * threads == 4 * tile_n
    rows_per_copy = threads // 4  # a thread's copies are 16-byte piece `tid % 4` of rows `tid / 4 + i * this`
    half_rows = tile_m // warps_m  # the epilogue stages the output tile in warps_m horizontal bands
    band_words = half_rows * tile_n // 2  # int32 accumulators, two per uint64
    assert band_words <= 2 * stages * shape.stage_pairs, "an output band must fit in the staging buffer"
    wait_previous = device.cp_async_wait_group(stages - 2)
    wait_all = device.cp_async_wait_group(0)

    @device_function
    def row_sources(sources, pairs_view, origin, row0, rows, k_pairs, piece, tid, copies):
        """Global addresses of this thread's pieces of chunk 0 (``origin`` for rows past ``rows``)."""
        for i in range(copies):
            row = row0 + tid // 4 + i * rows_per_copy
            sources[i] = origin + _U64(16) * _U64(row * k_pairs + piece) if row < rows else origin

    @device_function
    def start_copies(stage, at, pairs_view, sources, origin, row0, rows, k_ok, chunk_bytes, tid, copies):
        """Start this thread's copies of one chunk into the stage rows at shared address ``at`` (the
        rows' swizzled pieces); zeros for rows past ``rows`` and ``k`` past ``K``."""
        for i in range(copies):
            local_row = tid // 4 + i * rows_per_copy
            valid = k_ok and row0 + local_row < rows
            source = sources[i] + _U64(chunk_bytes) if valid else origin
            device.cp_async_16_at(stage, at + 16 * swizzled(local_row, tid % 4), pairs_view, source, valid)

    def kernel(a_bytes, a_pairs, w_bytes, w_pairs, row_scale, col_scale, bias, out_elems,
               M, N, K, tiles_m, aligned, tensor_scale):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array((threads, 6), np.int32)  # used only by the simulator's mma
        stage = cuda.shared.array(0, _DYNAMIC_STAGE_DTYPE, alignment=STAGE_ALIGNMENT)  # dynamic: shape.shared_bytes
        acc = cuda.local.array(slots, np.int32)
        w_frag = cuda.local.array(w_words, np.uint32)
        a_sources = cuda.local.array(a_copies, np.uint64)
        w_sources = cuda.local.array(w_copies, np.uint64)
        warp, lane = tid // 32, tid % 32
        group, t = lane // 4, lane % 4
        tile_n_index = cuda.blockIdx.x // tiles_m
        tile_m_index = cuda.blockIdx.x - tile_n_index * tiles_m
        m_block, n_block = tile_m_index * tile_m, tile_n_index * tile_n
        band = warp % warps_m
        m_warp = band * (16 * mt)
        n_warp = (warp // warps_m) * (8 * nt)
        # Every shared address is the stage's 32-bit window address plus byte offsets: what varies per
        # lane is computed here once, the loop adds the ring slot and constants (16 rows = 1024 bytes
        # keep their swizzle, so the mma tiles of a warp differ by constants).
        base = device.shared_address(stage)
        a_origin, w_origin = device.global_address(a_pairs), device.global_address(w_pairs)
        # ldmatrix rows this lane addresses: for `a`, matrices (rows 0-7 | 8-15) x (k 0-15 | 16-31) of
        # a 16-row tile, the mma's a0 .. a3; for `w`, (k 0-15 | 16-31) x (column tile 2p | 2p + 1);
        # index [half] is k 0-31 / 32-63 of the chunk
        a_row = m_warp + lane % 8 + 8 * ((lane // 8) % 2)
        w_row = n_warp + lane % 8 + 8 * (lane // 16)
        a_lo = 16 * swizzled(a_row, lane // 16)
        a_hi = 16 * swizzled(a_row, 2 + lane // 16)
        w_lo = w_offset + 16 * swizzled(w_row, (lane // 8) % 2)
        w_hi = w_offset + 16 * swizzled(w_row, 2 + (lane // 8) % 2)
        for i in range(slots):
            acc[i] = 0
        k_pairs = K // 16  # this kernel runs only for K % 16 == 0 and 16-byte aligned operands
        piece = tid % 4
        row_sources(a_sources, a_pairs, a_origin, m_block, M, k_pairs, piece, tid, a_copies)
        row_sources(w_sources, w_pairs, w_origin, n_block, N, k_pairs, piece, tid, w_copies)
        steps = (K + CHUNK_K - 1) // CHUNK_K
        # chunks 0 .. stages - 2 in flight before the first mma; one commit group per chunk (empty
        # or zero-filled past K, so that the group count stays in step)
        for chunk in range(stages - 1):
            at = base + chunk * stage_bytes
            k_ok = 4 * chunk + piece < k_pairs
            start_copies(stage, at, a_pairs, a_sources, a_origin, m_block, M, k_ok, 64 * chunk, tid, a_copies)
            start_copies(stage, at + w_offset, w_pairs, w_sources, w_origin, n_block, N, k_ok, 64 * chunk, tid,
                         w_copies)
            device.cp_async_commit()
        read_slot, write_slot = 0, (stages - 1) * stage_bytes
        for step in range(steps):
            # this thread's copies of chunk `step` have landed; after the barrier everyone's have,
            # and every warp is done reading the stage the next copies overwrite (chunk step - 1's)
            wait_previous()
            cuda.syncthreads()
            chunk = step + stages - 1
            at = base + write_slot
            k_ok = 4 * chunk + piece < k_pairs
            start_copies(stage, at, a_pairs, a_sources, a_origin, m_block, M, k_ok, 64 * chunk, tid, a_copies)
            start_copies(stage, at + w_offset, w_pairs, w_sources, w_origin, n_block, N, k_ok, 64 * chunk, tid,
                         w_copies)
            device.cp_async_commit()
            current = base + read_slot
            for half in range(2):  # k 0-31, 32-63 of the chunk: one m16n8k32 each
                a_at = current + (a_lo if half == 0 else a_hi)
                w_at = current + (w_lo if half == 0 else w_hi)
                for p in range(nt // 2):
                    (w_frag[4 * p], w_frag[4 * p + 1], w_frag[4 * p + 2],
                     w_frag[4 * p + 3]) = device.ldmatrix_x4_at(stage, w_at + 1024 * p, scratch, tid)
                for mi in range(mt):
                    a0, a1, a2, a3 = device.ldmatrix_x4_at(stage, a_at + 1024 * mi, scratch, tid)
                    for ni in range(nt):
                        slot = 4 * (mi * nt + ni)
                        c0, c1, c2, c3 = device.mma_s8(a0, a1, a2, a3, w_frag[2 * ni], w_frag[2 * ni + 1],
                                                       acc[slot], acc[slot + 1], acc[slot + 2], acc[slot + 3],
                                                       scratch, tid)
                        acc[slot], acc[slot + 1], acc[slot + 2], acc[slot + 3] = c0, c1, c2, c3
            read_slot = read_slot + stage_bytes if read_slot + stage_bytes < ring_bytes else 0
            write_slot = write_slot + stage_bytes if write_slot + stage_bytes < ring_bytes else 0
        # the zero-filled copies past K may still be landing: drain them before reusing the stages
        wait_all()
        cuda.syncthreads()
        for current_band in range(warps_m):
            if band == current_band:
                for mi in range(mt):
                    for ni in range(nt):
                        slot = 4 * (mi * nt + ni)
                        word = (16 * mi + group) * (tile_n // 2) + (n_warp + 8 * ni) // 2 + t
                        stage[word] = (_U64(acc[slot]) & _LOW32) | (_U64(acc[slot + 1]) << _U64(32))
                        stage[word + 4 * tile_n] = (_U64(acc[slot + 2]) & _LOW32) | (_U64(acc[slot + 3]) << _U64(32))
            cuda.syncthreads()
            for index in range(tid, 2 * band_words, threads):
                r, c = index // tile_n, index % tile_n
                word = stage[r * (tile_n // 2) + c // 2]
                value = np.int64((word >> _U64(32 * (c % 2))) & _LOW32)
                if value >= 2**31:  # back to the signed accumulator
                    value -= 2**32
                store(value, m_block + current_band * half_rows + r, n_block + c, M, N, row_scale, col_scale, bias,
                      out_elems, tensor_scale)
            cuda.syncthreads()

    return kernel


def _fused_quantizer(x_element: ElementKind):
    """Device functions quantizing rows of ``x`` per token exactly as
    :class:`~baracuda_numba.plans.dynamic.DynamicRangeQuantizePlan` does for the linear plans
    (symmetric, [-127, 127], the math precision of ``x``'s dynamic quantizer), with its kernels' own
    chunk functions: ``piece_absmax`` (``hi`` raised to the finite ``max |x|`` of a 16-byte piece; for
    16-bit floats on the bits, two lanes an instruction), ``row_params`` (``scale``, ``1 / scale``) and
    ``quantized_piece`` (a piece's elements quantized, byte ``j`` of the returned word holding element
    ``j``; on the integer side, :func:`.elementwise.quantize_int`). The fused prologue repeats this work
    in every block, so its instruction count is the prologue's cost."""
    from .dynamic import chunk_range_function, int_chunk_quantizer

    precision = MathPrecision.F64 if x_element is ElementKind.F64 else MathPrecision.F32
    M = math_type(precision)
    zero, one, tiny = M(0.0), M(1.0), M(np.finfo(M).tiny)
    q_min, q_max = M(-127), M(127)
    chunk_range = chunk_range_function(x_element, precision, True)
    quantize_chunk = int_chunk_quantizer(x_element, precision)
    per_pair = 16 // x_element.itemsize  # elements of x in one 16-byte load

    @device_function
    def piece_absmax(lo_word, hi_word, hi):
        return chunk_range(hi, hi, lo_word, hi_word)[0]

    @device_function
    def row_params(hi):
        """``(scale, 1 / scale)`` of a row whose finite absmax is ``hi``."""
        scale = hi / (q_max - zero) if hi > zero else one
        if scale < tiny:
            scale = tiny
        return scale, device.reciprocal(scale)

    @device_function
    def quantized_piece(lo_word, hi_word, inv):
        return quantize_chunk(lo_word, hi_word, inv, zero, q_min, q_max)[0]

    return M, per_pair, piece_absmax, row_params, quantized_piece


def _skinny(epilogue: Epilogue, chunks_in_flight: int, n_tiles: int, x_element: ElementKind | None = None,
            prefetch_l2: int = 0, cooperative: bool = False, double_buffer: bool = False, vector_only: bool = False,
            dependent: int = 0, staged: int = 0, trace: bool = False, early_l2: int = 0,
            early_registers: bool = False, x_loads: int = ABSMAX_LOADS, fixed: tuple[int, int] | None = None,
            wait_first: bool = False, static_scale: bool = False, weight_hint: str = ""):
    """The decode kernel. With ``x_element`` it takes ``x`` itself (elements and 16-byte pairs in
    place of ``a``'s bytes and pairs) and quantizes its rows per token (the same bits as the quantizer
    followed by the unfused kernel, in one launch):

    - ``fused``: every block quantizes its live rows into shared memory (``fused_shared_bytes``)
      before streaming the weight against them; the per-token scales stay in shared memory
      (``row_scale`` is not read).
    - ``cooperative`` (``M <= 16``): the first ``Q = min(M, blocks)`` blocks to start (a ticket from
      ``counters[0]``) quantize rows ``ticket, ticket + Q, ...`` into global ``xq_words`` /
      ``row_scale`` (the plan's workspace) and count themselves done in ``counters[1]``; every block
      streams the weight once they all are. The quantizing blocks wait on nothing before they count,
      and a ticket is only drawn by a running block, so the wait cannot deadlock whatever order the
      hardware starts blocks in. The last block out (``counters[2]``) zeroes the three counters for
      the next launch on the workspace. The simulator runs blocks one after another: there the first
      block quantizes every row.

    The prologue (each row's absmax over the block, then the quantize) waits on ``x`` and two
    barriers while the weight stream has not started. So each thread first issues its loads of the
    main loop's first iteration (kept in registers for it) and, with ``prefetch_l2``, L2 prefetches
    of the next ``prefetch_l2`` iterations; the prologue then runs under their DRAM latency. The
    prologue itself: every thread takes ``x_loads`` 16-byte pieces of the rows at a time (row,
    then slot within the row, stepped without divisions), reduces each row with warp shuffles when its
    last slot is reached (the same step for all threads) and once across warps through shared memory;
    when all of a thread's pieces fit in one batch they stay in registers for the quantize, else they
    are read again from L2. Each piece's quantized bytes go out as one store.

    ``dependent`` > 0 (the unfused, double-buffered kernel): launched as a programmatic dependent of
    the activation quantizer (:class:`~baracuda_numba.launch.KernelLauncher` ``dependent=True``), it
    may start while the quantizer runs. Each warp loads its column parameters and ``dependent`` (1 or 2)
    buffers of weight fragments (which the quantizer does not write) and asks L2 for the next
    ``prefetch_l2`` iterations' pieces, then waits for the quantizer's
    grid (:func:`~baracuda_numba.kernels.device.grid_dependency_wait`) before it reads ``a`` and the row
    scales. The launch gap and the quantizer's run then overlap those iterations' loads. With ``staged``
    (at most ``STAGED_MAX``) it first copies the main loop's first ``staged`` iterations of weight into
    the dynamic shared memory (``cp.async``, ``staged_iteration_bytes`` each, one commit group per
    iteration; each thread's own pieces, at slot ``((iteration * chunks + chunk) * tiles + tile) *
    threads + thread``, so no barrier is needed to read them back), and the ``dependent`` buffers
    preloaded into registers are the iterations after those: with the whole weight staged, its stream
    runs under the quantizer. ``wait_first`` (with ``dependent``): it waits for the kernel before it
    first thing, before it reads anything (a launch that overlaps that kernel's tail, for callers whose
    kernel before may write the weight); the rest is the same.

    ``early_l2`` / ``early_registers`` (the fused kernel, launched as a programmatic dependent): before it
    waits for the kernel before it, each thread asks L2 for its pieces of the first ``early_l2`` main-loop
    iterations / loads the first iteration's into registers (and its column parameters), so that the
    weight stream starts under the tail of that kernel; otherwise it waits first thing.

    ``fixed`` (the fused kernel: ``(rows, per_row)`` of :func:`fixed_prologue`, the launch's ``M`` and
    ``ceil(K / (per_pair * SKINNY_THREADS))``): the prologue compiled for that shape. Every loop is then
    unrolled: the rows' loads, their warp reductions and their quantizes interleave instead of following
    one another row by row, with no row / slot bookkeeping. The same maxima, scales and bytes.

    ``trace`` (the unfused kernel without bias, a profiling build): thread 0 of block ``b`` stores the
    low 32 bits of ``%globaltimer`` (as float32 bit patterns) into ``bias[4b .. 4b + 3]`` when the block
    starts, when its wait returns (dependent; else again at the start), when its weight stream ends and
    after its stores.

    ``weight_hint`` (aligned operands, ``vector_only``): the cache operators of the weight's loads (see
    :func:`~baracuda_numba.kernels.device.hinted_load_u64x2`); the activations' keep the default."""
    w_words, slots = 2 * chunks_in_flight * n_tiles, 4 * n_tiles  # local array lengths: constants
    # staged, activations in global memory: both rows' pieces of every staged chunk
    x_words = max(4 * chunks_in_flight * staged, 1) if x_element is None or cooperative else 1
    outputs = -(-32 * slots // SKINNY_THREADS)  # outputs per thread (1 tile: half the threads store none)
    _, row_param, column_params, store_with, _ = epilogue
    vector_only = vector_only or x_element is not None  # the one-launch kernels take aligned operands only

    @device_function
    def load_operand_chunk(bytes_view, pairs_view, row, rows, k, K, aligned):
        """An operand's 16 bytes (see :func:`load_chunk`); ``vector_only``: no byte path (``aligned`` holds)."""
        if vector_only:
            return load_vector_chunk(pairs_view, row, rows, k, K)
        return load_chunk(bytes_view, pairs_view, row, rows, k, K, aligned)

    load_weight_vector = vector_chunk_loader(weight_hint if vector_only else "")

    @device_function
    def load_weight_chunk(bytes_view, pairs_view, row, rows, k, K, aligned):
        """The weight's 16 bytes, as :func:`load_operand_chunk` with ``weight_hint``'s loads."""
        if vector_only:
            return load_weight_vector(pairs_view, row, rows, k, K)
        return load_chunk(bytes_view, pairs_view, row, rows, k, K, aligned)
    quantizes = x_element is not None
    fused = quantizes and not cooperative  # the quantized rows live in shared memory
    if quantizes:
        S, per_pair, piece_absmax, row_params, quantized_piece = _fused_quantizer(x_element)
    else:
        S, per_pair = np.float32, 1
        piece_absmax = row_params = quantized_piece = None
    # the quantized bytes of one 16-byte piece of x (one per element) as one store
    word_type = {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(per_pair, np.uint64)
    word_dtype = np.dtype(word_type) if SIMULATOR else word_type
    step = chunks_in_flight * SKINNY_WARPS  # chunks of K the block takes per main-loop iteration
    fused_early = x_element is not None and not cooperative and not staged
    if (early_registers and not fused_early) or (early_l2 and not (fused_early or (dependent and wait_first))):
        raise ValueError("only the fused kernel without staging loads weight before its wait, and only it and the "
                         "dependent kernel waiting first ask L2 for weight before it")
    early = bool(early_l2 or early_registers) and fused_early
    # cooperative: rows quantized per block (the simulator's one block at a time takes them all)
    quantizer_rows = SKINNY_M if SIMULATOR else 1

    @device_function
    def load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, k, K, aligned):
        """One main-loop iteration's weight pieces of this lane, all loads issued together: chunk ``c``
        (``k + c * 512`` on), column tile ``j``."""
        for c in range(chunks_in_flight):
            for j in range(n_tiles):
                w = 2 * (c * n_tiles + j)
                w_frag[w], w_frag[w + 1] = load_weight_chunk(w_bytes, w_pairs, n_block + SKINNY_N * j + group, N,
                                                             k + c * CHUNK_K * SKINNY_WARPS, K, aligned)

    @device_function
    def prefetch_weights(w_pairs, n_block, group, N, k, K):
        """Fused (aligned weight, ``K % 16 == 0``): L2 prefetches of the pieces ``load_weights`` would
        load from ``k`` on."""
        for c in range(chunks_in_flight):
            for j in range(n_tiles):
                row, kc = n_block + SKINNY_N * j + group, k + c * CHUNK_K * SKINNY_WARPS
                if row < N and kc < K:
                    device.prefetch_l2(w_pairs, (row * K + kc) // 16)

    waits = [device.cp_async_wait_group(pending) for pending in range(STAGED_MAX)]
    wait0, wait1, wait2, wait3, wait4, wait5, wait6, wait7 = waits

    @device_function
    def wait_staged(pending):
        """Wait until at most ``pending`` of this thread's staged iterations are still in flight."""
        if pending <= 0:
            wait0()
        elif pending == 1:
            wait1()
        elif pending == 2:
            wait2()
        elif pending == 3:
            wait3()
        elif pending == 4:
            wait4()
        elif pending == 5:
            wait5()
        elif pending == 6:
            wait6()
        else:
            wait7()

    @device_function
    def staged_slot(base, it, c, j, tid):
        """The stage's pair holding piece ``(c, j)`` of iteration ``it`` for thread ``tid`` (the stage
        starts at pair ``base`` of the dynamic shared memory)."""
        return base + ((it * chunks_in_flight + c) * n_tiles + j) * SKINNY_THREADS + tid

    @device_function
    def stage_weights(stage, base, w_pairs, n_block, group, N, K, first_k, chunks, tid):
        """Start copying the pieces ``load_weights`` would load for the first ``staged`` iterations
        (from ``first_k`` on) into ``stage``, one commit group per iteration (empty past ``chunks``)."""
        for it in range(staged):
            if it * step < chunks:
                for c in range(chunks_in_flight):
                    for j in range(n_tiles):
                        row, kc = n_block + SKINNY_N * j + group, first_k + CHUNK_K * (it * step + c * SKINNY_WARPS)
                        valid = row < N and kc < K
                        device.cp_async_16(stage, staged_slot(base, it, c, j, tid), w_pairs,
                                           (row * K + kc) >> 4 if valid else 0, valid)
            device.cp_async_commit()

    @device_function
    def mma_staged(acc, x_frag, stage, base, scratch, a_bytes, a_pairs, M, K, m_block, first_k, chunks, aligned,
                   tid):
        """``acc`` = the staged iterations' share of the block's tile: each iteration's weight pieces read
        back from ``stage`` once its group has landed. Activations in global memory are all loaded at
        once first into ``x_frag`` (one L2 round trip, not one per iteration); the fused kernel's, in
        shared memory, as each iteration needs them."""
        for i in range(slots):
            acc[i] = 0
        if not fused:
            for it in range(staged):
                for c in range(chunks_in_flight):
                    kc, x = first_k + CHUNK_K * (it * step + c * SKINNY_WARPS), 4 * (it * chunks_in_flight + c)
                    x_frag[x], x_frag[x + 1], x_frag[x + 2], x_frag[x + 3] = load_activations(
                        a_bytes, a_pairs, M, K, m_block, kc, aligned, tid)
        for it in range(staged):
            if it * step < chunks:  # the same for every warp
                wait_staged(staged - 1 - it)
                for c in range(chunks_in_flight):
                    kc, x = first_k + CHUNK_K * (it * step + c * SKINNY_WARPS), 4 * (it * chunks_in_flight + c)
                    if fused:
                        x0, x1, y0, y1 = load_activations(a_bytes, a_pairs, M, K, m_block, kc, aligned, tid)
                    else:
                        x0, x1, y0, y1 = x_frag[x], x_frag[x + 1], x_frag[x + 2], x_frag[x + 3]
                    for j in range(n_tiles):
                        slot = staged_slot(base, it, c, j, tid)
                        mma_chunk(acc, 4 * j, x0, x1, y0, y1, stage[2 * slot], stage[2 * slot + 1], scratch, tid)

    @device_function
    def stamp(trace_out, slot, tid):
        """A profiling build's timestamp ``slot`` of this block (see ``trace``)."""
        if trace and tid == 0:
            trace_out[4 * cuda.blockIdx.x + slot] = device.bits_to_f32(device.global_timer())

    @device_function
    def next_piece(r, s, per_row):
        """Row and slot of the piece after slot ``s`` of row ``r`` (``per_row`` slots per row)."""
        s += 1
        if s == per_row:
            return r + 1, 0
        return r, s

    @device_function
    def load_pieces(x_pairs, piece_lo, piece_hi, r, s, row0, row_step, live, per_row, pieces, tid):
        """This thread's ``x_loads`` pieces from slot ``s`` of local row ``r`` on (local row ``r`` is
        row ``row0 + r * row_step`` of ``x``; slot ``s`` of a row is its piece ``tid + s * SKINNY_THREADS``),
        all loads issued together."""
        for u in range(x_loads):
            p = tid + SKINNY_THREADS * s
            if r < live and p < pieces:
                piece_lo[u], piece_hi[u] = device.load_u64x2(x_pairs, (row0 + r * row_step) * pieces + p)
            r, s = next_piece(r, s, per_row)

    @device_function
    def warp_reduce_max(hi, shuffle_scratch, tid):
        """The largest ``hi`` of the warp, in every lane (max is exact: any order gives the same bits)."""
        for i in range(5):
            other = device.shuffle_xor(hi, 16 >> i, shuffle_scratch, tid)
            hi = other if other > hi else hi
        return hi

    @device_function
    def quantize_rows(x_pairs, row0, row_step, live, K, xq_words, out_row0, row_words, scales_out,
                      piece_lo, piece_hi, warp_max, shuffle_scratch, tid):
        """Quantize ``live`` rows of ``x`` (``row0 + r * row_step``) per token with the whole block:
        row ``r``'s bytes to ``xq_words`` from word ``(out_row0 + r * row_step) * row_words`` on and
        its scale to ``scales_out[out_row0 + r * row_step]``. Ends before the stores are fenced."""
        warp, lane = tid // 32, tid % 32
        pieces = K // per_pair
        per_row = (pieces + SKINNY_THREADS - 1) // SKINNY_THREADS
        batch = live * per_row  # pieces per thread, taken x_loads at a time
        # the absmax pass: a row's last slot is the same step of the same batch for every thread,
        # so the warp reduction there is uniform
        hi = S(0)
        r0, s0 = 0, 0
        for _ in range(0, batch, x_loads):
            load_pieces(x_pairs, piece_lo, piece_hi, r0, s0, row0, row_step, live, per_row, pieces, tid)
            for u in range(x_loads):
                if r0 < live:
                    if tid + SKINNY_THREADS * s0 < pieces:
                        hi = piece_absmax(piece_lo[u], piece_hi[u], hi)
                    if s0 == per_row - 1:
                        hi = warp_reduce_max(hi, shuffle_scratch, tid)
                        if lane == 0:
                            warp_max[warp, r0] = hi
                        hi = S(0)
                r0, s0 = next_piece(r0, s0, per_row)
        cuda.syncthreads()
        # the quantize pass: every thread derives the scales of the rows it meets from the warp
        # maxima (no second barrier); the pieces are still in registers when one batch held them
        current = -1
        scale = inv = S(1)
        r0, s0 = 0, 0
        for _ in range(0, batch, x_loads):
            if batch > x_loads:
                load_pieces(x_pairs, piece_lo, piece_hi, r0, s0, row0, row_step, live, per_row, pieces, tid)
            for u in range(x_loads):
                p = tid + SKINNY_THREADS * s0
                if r0 < live:
                    out_row = out_row0 + r0 * row_step
                    if r0 != current:
                        top = S(0)
                        for other_warp in range(SKINNY_WARPS):
                            top = max(top, warp_max[other_warp, r0])
                        scale, inv = row_params(top)
                        current = r0
                        if tid == 0:
                            scales_out[out_row] = scale
                    if p < pieces:
                        xq_words[out_row * row_words + p] = word_type(quantized_piece(piece_lo[u], piece_hi[u], inv))
                r0, s0 = next_piece(r0, s0, per_row)

    fixes = fixed is not None  # a bool: numba types `if None` through a device-compiled overload
    fixed_rows, fixed_slots = fixed or (1, 1)

    @device_function
    def quantize_fixed_rows(x_pairs, K, xq_words, row_words, scales_out, piece_lo, piece_hi, warp_max,
                            shuffle_scratch, tensor_scale, tid):
        """:func:`quantize_rows` of the block's ``fixed_rows`` rows (one row tile), ``fixed_slots`` pieces
        a row per thread (``fixed``), all loaded at once. Ends before the stores are fenced.
        ``static_scale``: every row quantized with ``tensor_scale`` instead (no reduction)."""
        warp, lane = tid // 32, tid % 32
        pieces = K // per_pair
        for r in range(fixed_rows):
            for s in range(fixed_slots):
                p = tid + SKINNY_THREADS * s
                if p < pieces:
                    piece_lo[r * fixed_slots + s], piece_hi[r * fixed_slots + s] = device.load_u64x2(
                        x_pairs, r * pieces + p)
        if static_scale:
            scale = S(tensor_scale)
            inv = S(1) / scale  # what the per-tensor plan computes on the host
            if tid < fixed_rows:  # the thread that set the row's placeholder scale: no barrier needed
                scales_out[tid] = scale
            for r in range(fixed_rows):
                for s in range(fixed_slots):
                    p = tid + SKINNY_THREADS * s
                    if p < pieces:
                        xq_words[r * row_words + p] = word_type(
                            quantized_piece(piece_lo[r * fixed_slots + s], piece_hi[r * fixed_slots + s], inv))
            return
        row_max = cuda.local.array(fixed_rows, S)
        for r in range(fixed_rows):
            hi = S(0)
            for s in range(fixed_slots):
                if tid + SKINNY_THREADS * s < pieces:
                    hi = piece_absmax(piece_lo[r * fixed_slots + s], piece_hi[r * fixed_slots + s], hi)
            row_max[r] = hi
        for i in range(5):  # the rows' shuffles side by side: one chain's latency
            for r in range(fixed_rows):
                other = device.shuffle_xor(row_max[r], 16 >> i, shuffle_scratch, tid)
                row_max[r] = other if other > row_max[r] else row_max[r]
        if lane == 0:
            for r in range(fixed_rows):
                warp_max[warp, r] = row_max[r]
        cuda.syncthreads()
        for r in range(fixed_rows):
            top = S(0)
            for other_warp in range(SKINNY_WARPS):
                top = max(top, warp_max[other_warp, r])
            scale, inv = row_params(top)
            if tid == 0:
                scales_out[r] = scale
            for s in range(fixed_slots):
                p = tid + SKINNY_THREADS * s
                if p < pieces:
                    xq_words[r * row_words + p] = word_type(
                        quantized_piece(piece_lo[r * fixed_slots + s], piece_hi[r * fixed_slots + s], inv))

    @device_function
    def load_activations(a_bytes, a_pairs, M, K, m_block, kc, aligned, tid):
        """This lane's 16 bytes at ``kc`` of its two activation rows (``group`` and ``group + 8`` of the
        block's tile): quantized rows ``(K + 16) // 16`` pairs apart in shared memory when fused, ``K /
        16`` apart in global memory when cooperative, else ``a``'s rows."""
        group = tid % 32 // 4
        row_pairs = (K + 16) // 16 if fused else K // 16
        if quantizes:  # rows past M and k past K read as zeros, as load_chunk's do
            x0 = x1 = y0 = y1 = _U64(0)
            if kc < K:
                if m_block + group < M:
                    x0, x1 = device.load_u64x2(a_pairs, group * row_pairs + kc // 16)
                if m_block + group + 8 < M:
                    y0, y1 = device.load_u64x2(a_pairs, (group + 8) * row_pairs + kc // 16)
        else:
            x0, x1 = load_operand_chunk(a_bytes, a_pairs, m_block + group, M, kc, K, aligned)
            y0, y1 = load_operand_chunk(a_bytes, a_pairs, m_block + group + 8, M, kc, K, aligned)
        return x0, x1, y0, y1

    @device_function
    def mma_weights(acc, w_frag, scratch, a_bytes, a_pairs, M, K, m_block, k, aligned, tid):
        """``acc +=`` one main-loop iteration: the activation chunks matching ``w_frag``'s weight pieces
        (from ``k`` on, see :func:`load_weights`) against them, every column tile."""
        for c in range(chunks_in_flight):
            kc = k + c * CHUNK_K * SKINNY_WARPS
            x0, x1, y0, y1 = load_activations(a_bytes, a_pairs, M, K, m_block, kc, aligned, tid)
            for j in range(n_tiles):
                w = 2 * (c * n_tiles + j)
                mma_chunk(acc, 4 * j, x0, x1, y0, y1, w_frag[w], w_frag[w + 1], scratch, tid)

    @device_function
    def stream_weights(acc, w_frag, w_next, scratch, a_bytes, a_pairs, w_bytes, w_pairs, M, N, K, m_block, n_block,
                       aligned, preloaded, first_chunk, tid):
        """``acc`` = this lane's share of the block's 16 x ``8 n_tiles`` tile over its warp's chunks of
        ``K``; the activations from ``a_bytes`` / ``a_pairs`` (quantized rows ``(K + 16) // 16`` pairs
        apart in shared memory when fused, ``K / 16`` apart in global memory when cooperative);
        ``preloaded``: ``w_frag`` already holds (1) the first iteration's weight, and ``w_next`` (2) the
        second's. With ``double_buffer`` the next iteration's weight loads (into ``w_next``, then back
        into ``w_frag``) are issued before the current iteration's mmas, so a warp's loads are in flight
        while it computes. From chunk ``first_chunk`` on (a multiple of the iteration's chunks): past 0,
        ``acc`` already holds the earlier chunks' sums."""
        warp, lane = tid // 32, tid % 32
        group, t = lane // 4, lane % 4
        if first_chunk == 0:
            for i in range(slots):
                acc[i] = 0
        chunks = (K + CHUNK_K - 1) // CHUNK_K
        # warps take chunks round robin, `chunks_in_flight` per iteration, all weight loads first
        # (each activation fragment then feeds the block's `n_tiles` column tiles); every warp runs
        # the same number of iterations (chunks past K read as zeros) because the simulated mma
        # synchronises the block
        if double_buffer:
            if preloaded == 0:
                load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, CHUNK_K * (first_chunk + warp) + 16 * t, K,
                             aligned)
            for first in range(first_chunk, chunks, 2 * step):
                k = CHUNK_K * (first + warp) + 16 * t
                if preloaded < 2 or first > first_chunk:
                    load_weights(w_next, w_bytes, w_pairs, n_block, group, N, k + CHUNK_K * step, K, aligned)
                mma_weights(acc, w_frag, scratch, a_bytes, a_pairs, M, K, m_block, k, aligned, tid)
                if first + step < chunks:  # the same for every warp
                    load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, k + 2 * CHUNK_K * step, K, aligned)
                    mma_weights(acc, w_next, scratch, a_bytes, a_pairs, M, K, m_block, k + CHUNK_K * step,
                                aligned, tid)
            return
        for first in range(first_chunk, chunks, step):
            k = CHUNK_K * (first + warp) + 16 * t
            if preloaded == 0 or first > first_chunk:
                load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, k, K, aligned)
            mma_weights(acc, w_frag, scratch, a_bytes, a_pairs, M, K, m_block, k, aligned, tid)

    @device_function
    def output_of(index, n_block):
        """The output that thread slot ``index`` (below ``32 * slots``) stores: fragment slot ``slot`` of
        lane ``source`` (summed over warps), at local row ``local`` and column ``n``."""
        slot, source = index // 32, index % 32
        local = source // 4 + (8 if slot % 4 >= 2 else 0)
        return slot, source, local, n_block + SKINNY_N * (slot // 4) + 2 * (source % 4) + slot % 2

    @device_function
    def load_epilogue(col_pre, bias_pre, row_pre, row_scale, col_scale, bias, M, N, m_block, n_block,
                      tensor_scale, columns, rows, tid):
        """This thread's outputs' column scales and biases (``columns``) and row scales (``rows``), loaded
        before the weight stream so that their latency hides under it."""
        for o in range(outputs):
            index = tid + o * SKINNY_THREADS
            if index < 32 * slots:
                _, _, local, n = output_of(index, n_block)
                if columns:
                    col_pre[o], bias_pre[o] = column_params(n, N, col_scale, bias)
                if rows and m_block + local < M:
                    row_pre[o] = row_param(m_block + local, row_scale, tensor_scale)

    @device_function
    def reduce_and_store(acc, partial, scales, row_scale, col_pre, bias_pre, row_pre, out_elems, M, N, m_block,
                         n_block, tensor_scale, rows_ready, tid):
        """Sum the warps' accumulators through shared memory and store the block's outputs through the
        epilogue, with the column parameters of :func:`load_epilogue` and the row scales it loaded
        (``rows_ready``), else the fused kernel's in shared ``scales``, else ``row_scale``'s."""
        warp, lane = tid // 32, tid % 32
        for i in range(slots):
            partial[warp, i, lane] = acc[i]
        cuda.syncthreads()
        for o in range(outputs):
            index = tid + o * SKINNY_THREADS
            if index < 32 * slots:
                slot, source, local, n = output_of(index, n_block)
                total = 0
                for other in range(SKINNY_WARPS):
                    total += partial[other, slot, source]
                m = m_block + local
                if m < M and n < N:
                    if rows_ready:
                        rs = row_pre[o]
                    elif fused:
                        rs = np.float32(scales[local])
                    else:
                        rs = row_param(m, row_scale, tensor_scale)
                    store_with(total, rs, col_pre[o], bias_pre[o], m, n, M, N, out_elems)

    def kernel(a_bytes, a_pairs, w_bytes, w_pairs, row_scale, col_scale, bias, out_elems,
               M, N, K, tiles_m, aligned, tensor_scale):
        tid = cuda.threadIdx.x
        stamp(bias, 0, tid)
        if dependent:
            if wait_first:
                # a prefetch holds no data: the weight is still read after the wait
                for ahead in range(early_l2):
                    prefetch_weights(w_pairs, (cuda.blockIdx.x // tiles_m) * (SKINNY_N * n_tiles), tid % 32 // 4, N,
                                     CHUNK_K * (ahead * step + tid // 32) + 16 * (tid % 4), K)
                device.grid_dependency_wait()  # nothing is read before the kernel before it is complete
            # the next kernel, if launched as a programmatic dependent (the next call's quantizer), may
            # start now: it waits for this grid before it touches memory
            device.launch_dependents()
        elif fused and not early:
            # launched as a programmatic dependent (plans.linear.FUSED_DEPENDENT_MIN_K): wait for the kernel
            # before (which writes x) before anything, then let the next kernel start
            device.grid_dependency_wait()
            device.launch_dependents()
        scratch = cuda.shared.array((SKINNY_THREADS, 6), np.int32)  # used only by the simulator's mma
        partial = cuda.shared.array((SKINNY_WARPS, slots, 32), np.int32)
        scales = cuda.shared.array(SKINNY_M, S)  # fused: the block's per-token scales (epilogue)
        warp_max = cuda.shared.array((SKINNY_WARPS, SKINNY_M), S)  # fused: each warp's row maxima
        shuffle_scratch = cuda.shared.array(SKINNY_THREADS, S)  # used only by the simulator's shuffles
        # fused: the block's quantized rows, `K + 16` bytes apart (the pad skews rows across banks);
        # sized by the launch (fused_shared_bytes), both views of the same dynamic shared memory
        xq_words = cuda.shared.array(0, word_dtype, alignment=STAGE_ALIGNMENT)
        xq_pairs = cuda.shared.array(0, _DYNAMIC_STAGE_DTYPE, alignment=STAGE_ALIGNMENT)
        piece_lo = cuda.local.array(x_loads, np.uint64)
        piece_hi = cuda.local.array(x_loads, np.uint64)
        acc = cuda.local.array(slots, np.int32)
        w_frag = cuda.local.array(w_words, np.uint64)
        w_next = cuda.local.array(w_words, np.uint64)
        x_stage = cuda.local.array(x_words, np.uint64)  # staged: their activations
        col_pre = cuda.local.array(outputs, np.float32)
        bias_pre = cuda.local.array(outputs, np.float32)
        row_pre = cuda.local.array(outputs, np.float32)
        warp, lane = tid // 32, tid % 32
        group, t = lane // 4, lane % 4
        # row tiles fastest: the blocks sharing a weight slice run together and share it through L2
        n_tile = cuda.blockIdx.x // tiles_m
        m_block = (cuda.blockIdx.x - n_tile * tiles_m) * SKINNY_M
        n_block = n_tile * (SKINNY_N * n_tiles)
        if early:
            for ahead in range(early_l2):
                prefetch_weights(w_pairs, n_block, group, N, CHUNK_K * (ahead * step + warp) + 16 * t, K)
            if early_registers:
                load_epilogue(col_pre, bias_pre, row_pre, row_scale, col_scale, bias, M, N, m_block, n_block,
                              tensor_scale, True, False, tid)
                load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, CHUNK_K * warp + 16 * t, K, aligned)
            device.grid_dependency_wait()  # x (and, past early_registers, nothing else) is read from here on
            device.launch_dependents()
        if not early_registers:
            load_epilogue(col_pre, bias_pre, row_pre, row_scale, col_scale, bias, M, N, m_block, n_block,
                          tensor_scale, True, not fused and not dependent, tid)
        first_k = CHUNK_K * warp + 16 * t
        chunks = (K + CHUNK_K - 1) // CHUNK_K
        rest = staged * step  # the first chunk the registers take
        if fused:
            # the first iterations' weight (staged ones into shared memory past the quantized rows, the
            # next into registers, and L2 prefetches of the ones after) before the prologue, so that HBM
            # works while x is reduced and quantized
            base = min(M, SKINNY_M) * ((K + 16) // 16)
            if staged:
                stage_weights(xq_pairs, base, w_pairs, n_block, group, N, K, first_k, chunks, tid)
            if (not staged or rest < chunks) and not early_registers:
                load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, first_k + CHUNK_K * rest, K, aligned)
            for ahead in range(staged + 1, staged + prefetch_l2 + 1):
                prefetch_weights(w_pairs, n_block, group, N, CHUNK_K * (ahead * step + warp) + 16 * t, K)
            if tid < SKINNY_M:
                scales[tid] = S(1)  # rows past M: never stored, but read by the epilogue
            if fixes:
                quantize_fixed_rows(a_pairs, K, xq_words, (K + 16) // per_pair, scales, piece_lo, piece_hi, warp_max,
                                    shuffle_scratch, tensor_scale, tid)
            else:
                quantize_rows(a_pairs, m_block, 1, min(SKINNY_M, M - m_block), K, xq_words, 0, (K + 16) // per_pair,
                              scales, piece_lo, piece_hi, warp_max, shuffle_scratch, tid)
            cuda.syncthreads()
            if staged:
                mma_staged(acc, x_stage, xq_pairs, base, scratch, a_bytes, xq_pairs, M, K, m_block, first_k, chunks,
                           aligned, tid)
            if not staged or rest < chunks:
                stream_weights(acc, w_frag, w_next, scratch, a_bytes, xq_pairs, w_bytes, w_pairs, M, N, K, m_block,
                               n_block, aligned, 1, rest, tid)
        elif dependent:
            if staged:
                stage_weights(xq_pairs, 0, w_pairs, n_block, group, N, K, first_k, chunks, tid)
            if not staged or rest < chunks:
                load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, first_k + CHUNK_K * rest, K, aligned)
                if dependent > 1:
                    load_weights(w_next, w_bytes, w_pairs, n_block, group, N, first_k + CHUNK_K * (rest + step), K,
                                 aligned)
            for ahead in range(staged + dependent, staged + dependent + prefetch_l2):
                prefetch_weights(w_pairs, n_block, group, N, CHUNK_K * (ahead * step + warp) + 16 * t, K)
            device.grid_dependency_wait()  # the quantizer's rows and scales are complete past this
            stamp(bias, 1, tid)
            load_epilogue(col_pre, bias_pre, row_pre, row_scale, col_scale, bias, M, N, m_block, n_block,
                          tensor_scale, False, True, tid)
            if staged:
                mma_staged(acc, x_stage, xq_pairs, 0, scratch, a_bytes, a_pairs, M, K, m_block, first_k, chunks,
                           aligned, tid)
            if not staged or rest < chunks:
                stream_weights(acc, w_frag, w_next, scratch, a_bytes, a_pairs, w_bytes, w_pairs, M, N, K, m_block,
                               n_block, aligned, dependent, rest, tid)
        else:
            stamp(bias, 1, tid)
            stream_weights(acc, w_frag, w_next, scratch, a_bytes, a_pairs, w_bytes, w_pairs, M, N, K, m_block, n_block,
                           aligned, 0, 0, tid)
        stamp(bias, 2, tid)
        reduce_and_store(acc, partial, scales, row_scale, col_pre, bias_pre, row_pre, out_elems, M, N, m_block,
                         n_block, tensor_scale, not fused, tid)
        stamp(bias, 3, tid)

    def cooperative_kernel(x_elems, x_pairs, w_bytes, w_pairs, row_scale, col_scale, bias, out_elems,
                           xq_words, xq_pairs, counters, M, N, K, tiles_m, aligned, tensor_scale):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array((SKINNY_THREADS, 6), np.int32)  # used only by the simulator's mma
        partial = cuda.shared.array((SKINNY_WARPS, slots, 32), np.int32)
        warp_max = cuda.shared.array((SKINNY_WARPS, SKINNY_M), S)
        shuffle_scratch = cuda.shared.array(SKINNY_THREADS, S)  # used only by the simulator's shuffles
        ticket = cuda.shared.array(1, np.uint32)
        stage = cuda.shared.array(0, _DYNAMIC_STAGE_DTYPE, alignment=STAGE_ALIGNMENT)  # staged weight (launch-sized)
        x_stage = cuda.local.array(x_words, np.uint64)
        piece_lo = cuda.local.array(x_loads, np.uint64)
        piece_hi = cuda.local.array(x_loads, np.uint64)
        acc = cuda.local.array(slots, np.int32)
        w_frag = cuda.local.array(w_words, np.uint64)
        w_next = cuda.local.array(w_words, np.uint64)
        col_pre = cuda.local.array(outputs, np.float32)
        bias_pre = cuda.local.array(outputs, np.float32)
        warp, lane = tid // 32, tid % 32
        group, t = lane // 4, lane % 4
        n_block = cuda.blockIdx.x * (SKINNY_N * n_tiles)  # M <= 16: one row tile
        # the first iterations' weight is in flight while the rows are quantized and awaited (the staged
        # ones into shared memory, the next into registers), and with `prefetch_l2` the next iterations'
        # are on their way into L2
        first_k = CHUNK_K * warp + 16 * t
        chunks = (K + CHUNK_K - 1) // CHUNK_K
        rest = staged * step  # the first chunk the registers take
        if staged:
            stage_weights(stage, 0, w_pairs, n_block, group, N, K, first_k, chunks, tid)
        if not staged or rest < chunks:
            load_weights(w_frag, w_bytes, w_pairs, n_block, group, N, first_k + CHUNK_K * rest, K, aligned)
        for ahead in range(staged + 1, staged + prefetch_l2 + 1):
            prefetch_weights(w_pairs, n_block, group, N, CHUNK_K * (ahead * step + warp) + 16 * t, K)
        # the row scales are the quantizers' results: read after the wait
        load_epilogue(col_pre, bias_pre, col_pre, row_scale, col_scale, bias, M, N, 0, n_block, tensor_scale,
                      True, False, tid)
        if tid == 0:
            ticket[0] = cuda.atomic.add(counters, 0, 1)
        cuda.syncthreads()
        # no more quantizers than blocks: a grid narrower than M has each quantize several rows
        quantizers = min((M + quantizer_rows - 1) // quantizer_rows, cuda.gridDim.x)
        mine = ticket[0]
        if mine < quantizers:
            quantize_rows(x_pairs, mine, quantizers, (M - mine + quantizers - 1) // quantizers, K, xq_words,
                          mine, K // per_pair, row_scale, piece_lo, piece_hi, warp_max, shuffle_scratch, tid)
            cuda.threadfence()  # every thread's stores, before the block counts itself done
            cuda.syncthreads()
            if tid == 0:
                cuda.atomic.add(counters, 1, 1)
        if tid == 0:
            while cuda.atomic.add(counters, 1, 0) < quantizers:
                if not SIMULATOR:
                    cuda.nanosleep(SPIN_NANOSECONDS)  # fewer polls of the counter the quantizers add to
            cuda.threadfence()
        cuda.syncthreads()
        if staged:
            mma_staged(acc, x_stage, stage, 0, scratch, x_elems, xq_pairs, M, K, 0, first_k, chunks, aligned, tid)
        if not staged or rest < chunks:
            stream_weights(acc, w_frag, w_next, scratch, x_elems, xq_pairs, w_bytes, w_pairs, M, N, K, 0, n_block,
                           aligned, 1, rest, tid)
        reduce_and_store(acc, partial, row_scale, row_scale, col_pre, bias_pre, col_pre, out_elems, M, N, 0,
                         n_block, tensor_scale, False, tid)
        if tid == 0 and cuda.atomic.add(counters, 2, 1) == cuda.gridDim.x - 1:
            counters[0] = 0
            counters[1] = 0
            counters[2] = 0

    return cooperative_kernel if cooperative else kernel


@functools.cache
@functools.cache
def static_quantizer_kernel(x_element: ElementKind) -> ElementwiseKernel:
    """The static-activation linear's quantizer (``QuantizedLinearPlan`` with ``static_activation``): ``x``'s
    16-byte pieces (16- or 32-bit floats) quantized with one given scale, ``clamp(rint(x * (1 / tensor_scale)),
    -127, 127)`` (NaN -> 0) by the fused kernel's own piece function, so the bits of
    :class:`~baracuda_numba.plans.per_tensor.QuantizePerTensorPlan` with zero point 0; and ``tensor_scale``
    stored as each of the ``rows`` row scales that the per-token GEMM's epilogue reads.

    ``kernel(x_pairs, xq_words, row_scale, pieces, rows, tensor_scale)``: ``x_pairs`` uint64 (two per piece),
    ``xq_words`` one word of ``16 / itemsize`` bytes per piece, ``row_scale`` float32. A grid-stride loop over
    the pieces, one load per step. It waits for the kernel before it (which may write ``x``) before it reads
    anything, then lets its own programmatic dependent (the GEMM) start: no reduction stands between its load
    and its store, which is the whole of what it shortens against the per-token quantizer."""
    if x_element.itemsize not in (2, 4) or not x_element.is_float:
        raise ValueError(f"the static quantizer takes 16- or 32-bit floats, not {x_element.short}")
    S, per_pair, _, _, quantized_piece = _fused_quantizer(x_element)
    word_type = {4: np.uint32, 8: np.uint64}[per_pair]  # one byte per element of a 16-byte piece

    def kernel(x_pairs, xq_words, row_scale, pieces, rows, tensor_scale):
        device.grid_dependency_wait()  # x may be the kernel before's output
        device.launch_dependents()  # the GEMM's weight loads may start: it waits for this grid to read xq
        scale = S(tensor_scale)
        inv = S(1) / scale  # what the per-tensor plan computes on the host
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < rows:
            row_scale[i] = scale
        step = cuda.gridDim.x * cuda.blockDim.x
        while i < pieces:
            lo, hi = device.load_u64x2(x_pairs, i)
            xq_words[i] = word_type(quantized_piece(lo, hi, inv))
            i += step

    kernel.__name__ = kernel.__qualname__ = f"w8a8_static_quantize_{x_element.short}"
    signature = f"void(uint64[::1], {uint_name(per_pair)}[::1], float32[::1], int64, int64, float32)"
    return ElementwiseKernel(kernel, signature, x_element, None, ElementKind.S8, MathPrecision.F32, per_pair)


def linear_kernel(out: ElementKind, has_bias: bool, per_tensor_rows: bool, skinny: bool = False,
                  pipeline: PipelineShape | None = None, skinny_chunks: int = SKINNY_CHUNKS,
                  skinny_tiles: int = 2, fused_input: ElementKind | None = None,
                  fused_prefetch: int = 0, fused_min_blocks: int = 0, cooperative: bool = False,
                  double_buffer: bool = False, vector_only: bool = False, dependent: int = 0,
                  staged: int = 0, max_registers: int = 0, trace: bool = False, early_l2: int = 0,
                  early_registers: bool = False, x_loads: int = ABSMAX_LOADS,
                  fixed: tuple[int, int] | None = None, wait_first: bool = False,
                  static_scale: bool = False, weight_hint: str = "") -> ElementwiseKernel:
    """The GEMM + epilogue kernel writing ``out`` (f32 / f64 / f16 / bf16): ``skinny``, else
    ``pipelined`` with ``pipeline``'s shape (16-byte aligned operands, ``K % 16 == 0``), else ``tiled``.
    With ``per_tensor_rows`` the row scale is the scalar ``tensor_scale`` (SmoothQuant's static
    activation scale), else ``row_scale[m]`` (per-token activation scales). ``fused_input``: the
    skinny kernel quantizing ``x`` of that element per token itself (16-byte aligned ``x`` and
    weight, ``K % 16 == 0``); its first two arrays are ``x``'s elements and 16-byte pairs, and it
    keeps the per-token scales in shared memory (``row_scale`` is not read); ``fused_prefetch``: main-loop
    iterations of weight it asks L2 for before quantizing ``x`` (after the first, loaded into registers),
    or, for the ``dependent`` kernel, before it waits for the quantizer (after the preloaded ones);
    ``fused_min_blocks`` > 0 (any skinny kernel): compiled with ``launch_bounds=(SKINNY_THREADS,
    fused_min_blocks)`` (registers capped so that many blocks fit on a multiprocessor).
    ``cooperative`` (with ``fused_input``, ``M <= 16``): the blocks quantize ``x`` into the workspace for
    each other (see :func:`_skinny`); three more arrays follow the eight: the quantized rows as one word
    per 16-byte piece of ``x``, the same bytes as uint64 pairs, and three zeroed uint32 counters;
    ``row_scale`` receives the per-token scales.
    ``double_buffer`` (skinny kernels): each warp's next weight loads issued before its current mmas;
    ``vector_only`` (skinny): operands known to be 16-byte aligned with ``K % 16 == 0`` (no byte path;
    always so for ``fused_input``); ``dependent`` > 0 (skinny, double-buffered): launched as a
    programmatic dependent of the kernel before it (the activation quantizer), it waits for it after
    loading that many buffers of weight (see :func:`_skinny`); with ``wait_first`` it waits before it
    reads anything. ``staged`` (the dependent, fused and cooperative kernels): that many main-loop
    iterations of weight copied into dynamic shared memory first (``staged *
    staged_iteration_bytes(skinny_chunks, skinny_tiles)`` bytes, the fused kernel's past its quantized
    rows), under launch bounds of ``STAGED_MIN_BLOCKS`` blocks per multiprocessor. ``max_registers`` (the
    unfused skinny kernels): compiled to at most that many registers per thread. ``trace`` (the unfused
    skinny kernel, ``has_bias`` False): the profiling build of :func:`_skinny` (timestamps into ``bias``).
    ``early_l2`` / ``early_registers`` (the fused kernel): weight asked of L2 / loaded before its wait (see
    :func:`_skinny`); ``x_loads`` (the fused kernel): pieces of ``x`` per thread in flight in its prologue
    (:func:`fused_x_loads`); ``fixed`` (the fused kernel): its prologue compiled for one shape
    (:func:`fixed_prologue`; the plan's ``M`` and ``K`` only); ``weight_hint`` (the skinny kernels on aligned
    operands): the cache operators of the weight's loads (:func:`~baracuda_numba.kernels.device.hinted_load_u64x2`)."""
    epilogue = _epilogue(out, has_bias, per_tensor_rows)
    hint_suffix = f"_h{weight_hint}" if weight_hint else ""
    options: tuple = ()
    extra = ""
    if fused_input is not None:
        if staged and not (double_buffer and 0 < staged <= STAGED_MAX):
            raise ValueError(f"the one-launch kernels stage weight double-buffered, 1 .. {STAGED_MAX} iterations, "
                             f"not {staged}")
        if staged:
            fused_min_blocks = STAGED_MIN_BLOCKS  # the registers of the blocks DEPENDENT_STAGE_BYTES is sized for
        if fixed and (cooperative or not 0 < fixed[0] <= SKINNY_M or not 0 < fixed[0] * fixed[1] <= x_loads):
            raise ValueError(f"a fixed prologue is the fused kernel's, 1 .. {SKINNY_M} rows of at most x_loads = "
                             f"{x_loads} pieces in all, not {fixed}")
        if static_scale and (fixed is None or fused_input.itemsize > 4):
            raise ValueError("a static activation scale needs a fixed prologue and 16- or 32-bit x")
        kernel = _skinny(epilogue, skinny_chunks, skinny_tiles, fused_input, fused_prefetch, cooperative,
                         double_buffer, staged=staged, early_l2=early_l2, early_registers=early_registers,
                         x_loads=x_loads, fixed=fixed, static_scale=static_scale, weight_hint=weight_hint)
        shape = f"skinny{skinny_chunks}x{skinny_tiles}_{'cooperative' if cooperative else 'fused'}_{fused_input.short}"
        shape += f"_x{x_loads}" if x_loads != ABSMAX_LOADS else ""
        shape += f"_p{fixed[0]}x{fixed[1]}" if fixed else ""
        shape += "_sa" if static_scale else ""
        shape += f"_e{early_l2}" if early_l2 else ""
        shape += "_er" if early_registers else ""
        shape += f"_st{staged}" if staged else ""
        shape += f"_l2p{fused_prefetch}" if fused_prefetch else ""
        shape += f"_b{fused_min_blocks}" if fused_min_blocks else ""
        shape += "_db" if double_buffer else ""
        shape += hint_suffix
        if fused_min_blocks:
            options = (("launch_bounds", (SKINNY_THREADS, fused_min_blocks)),)
        if cooperative:
            extra = f"{uint_name(min(16 // fused_input.itemsize, 8))}[::1], uint64[::1], uint32[::1], "
    elif skinny:
        if dependent and not double_buffer:
            raise ValueError("the dependent skinny kernel is double-buffered: double_buffer=True")
        if fused_prefetch and not (dependent and vector_only):
            raise ValueError("of the unfused skinny kernels, only the dependent one on aligned operands prefetches")
        if trace and has_bias:
            raise ValueError("the profiling build stores its timestamps where the bias would be: has_bias=False")
        if wait_first and not dependent:
            raise ValueError("only a dependent skinny kernel waits first: dependent > 0")
        if staged and not (dependent and vector_only and 0 < staged <= STAGED_MAX):
            raise ValueError(f"only the dependent skinny kernel on aligned operands stages weight (1 .. {STAGED_MAX} "
                             f"iterations), not {staged}")
        if staged and not fused_min_blocks:
            fused_min_blocks = STAGED_MIN_BLOCKS  # the registers of the blocks DEPENDENT_STAGE_BYTES is sized for
        kernel = _skinny(epilogue, skinny_chunks, skinny_tiles, prefetch_l2=fused_prefetch, double_buffer=double_buffer,
                         vector_only=vector_only, dependent=dependent, staged=staged, trace=trace,
                         wait_first=wait_first, early_l2=early_l2, weight_hint=weight_hint if vector_only else "")
        shape = (f"skinny{skinny_chunks}x{skinny_tiles}{'_db' if double_buffer else ''}{'_v' if vector_only else ''}"
                 f"{f'_dep{dependent}' if dependent else ''}{'_w' if wait_first else ''}"
                 f"{f'_e{early_l2}' if early_l2 else ''}"
                 f"{f'_st{staged}' if staged else ''}"
                 f"{f'_l2p{fused_prefetch}' if fused_prefetch else ''}"
                 f"{f'_b{fused_min_blocks}' if fused_min_blocks else ''}{f'_r{max_registers}' if max_registers else ''}"
                 f"{'_trace' if trace else ''}{hint_suffix if vector_only else ''}")
        if fused_min_blocks:
            options = (("launch_bounds", (SKINNY_THREADS, fused_min_blocks)),)
        if max_registers:
            options += (("max_registers", max_registers),)
    elif pipeline is not None:
        kernel, shape = _pipelined(epilogue.store, pipeline), f"pipelined_{pipeline.name}"
    else:
        kernel, shape = _tiled(epilogue.store), "tiled"
    # per-token scales come from the dynamic quantizer: float64 for float64 activations
    row = "float64" if out is ElementKind.F64 and not per_tensor_rows else "float32"
    a_view = "uint8" if fused_input is None else uint_name(fused_input.itemsize)
    signature = (f"void({a_view}[::1], uint64[::1], uint8[::1], uint64[::1], {row}[::1], float32[::1], float32[::1], "
                 f"{uint_name(out.itemsize)}[::1], {extra}int64, int64, int64, int64, boolean, float32)")
    kernel.__name__ = kernel.__qualname__ = (f"w8a8_gemm_{shape}_{out.short}{'_bias' if has_bias else ''}"
                                             f"{'_tensor' if per_tensor_rows else '_token'}")
    return ElementwiseKernel(kernel, signature, ElementKind.S8, ElementKind.S8, out, MathPrecision.F32, CHUNK_K,
                             options)
