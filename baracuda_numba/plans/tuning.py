"""The memory-bound families' tuning: a frozen tuning value per card.

Every quantize / dequantize / fake-quantize / backward plan, the dynamic-range plans and the packed 4-bit plans
read their launch shapes and what their kernels keep in flight from one :class:`MemoryTuning` (``card``, and one
value per family: :class:`ElementwiseTuning`, :class:`DynamicTuning`, :class:`PackedTuning`). A plan's ``select``
takes it (default: :func:`current_tuning`, the current device's) and it is part of the key the op functions cache
plans under; the kernel factories take the part their kernels compile in (``.kernel``). :func:`tuning_for` picks a
card's value from the device's measured properties (:func:`~.device.card_of`), never from its name.

Each field's default is the H100's value, with one line of why and, where one was measured, the measurement behind
it (an H100 SXM, 132 SMs, 2^28 elements unless said, % of the device-to-device copy of the same run; the tools are
``benchmarks/tune_cards.py`` and the family scripts it grew from). :data:`H200_TUNING` takes the fields
``benchmarks/tune_cards.py`` finds faster on an H200 (it prints the value to put here); tests run every value of
:data:`TUNINGS` on whatever device is present (:func:`launchable`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

from ..kernels.dynamic import DynamicKernelTuning
from ..kernels.elementwise import ElementwiseKernelTuning
from ..platform import SIMULATOR
from ..registry import LaunchPolicy, LaunchRole
from .device import DeviceProperties, card_of, device_properties

__all__ = ["ElementwiseTuning", "DynamicTuning", "PackedTuning", "MemoryTuning", "H100_TUNING", "H200_TUNING",
           "TUNINGS", "tuning_for", "current_tuning", "simulated", "launchable"]

# The launch policies the H100 values name (module constants: a dataclass default is one shared, frozen value):
# threads per block, the grid's cap in blocks per SM, chunks in flight per thread (0: the tuning's own), one wave.
_RESIDENT, _STREAM, _COVERING = LaunchPolicy(512, 32), LaunchPolicy(128, 1024), LaunchPolicy(128, 4096, 1)
_SEGMENTS, _VECTORS = LaunchPolicy(256, 128), LaunchPolicy(128, 512, 4)
_PACKED, _PACKED_DEQUANTIZE = LaunchPolicy(256, 4, one_wave=True), LaunchPolicy(128, 1024, 2)


@dataclass(frozen=True)
class ElementwiseTuning:
    """The elementwise family (per tensor / channel / token / group, fake quantize, FP8): what its kernels keep in
    flight, their launch bounds, and the grid of each launch role (:class:`~baracuda_numba.registry.LaunchRole`)."""

    # -- compiled into the kernels (ElementwiseKernelTuning) ---------------------------------------------------
    unroll: int = 2  # chunks in flight of the general kernels whose launch policy says none
    # Dequantize: input bytes in flight per thread, its chunks in flight raised to cover them (0: as its policy
    # says). Off on an H100, whose dequantize kernels reach 91-98% of copy on their policies' chunks alone.
    narrow_input_bytes: int = 0
    # The general kernels' launch bounds (threads at least every policy's); none on an H100, whose values were
    # measured with NVVM's own register counts.
    general_launch_bounds: tuple[int, int] | None = None
    # The shift kernels (power-of-two segments) keep one chunk in flight: group-128 quantize bf16 82.7% of copy at
    # 1, 70.5% at 2, 69.7% at 4 (the tracking kernel 70.0%); per token 87.1 / 75.2 / 74.5%; dequantize within 0.3%.
    pow2_unroll: int = 1
    # Tiled shift kernels: each thread takes this many chunks of one segment (segments of at least 8 threads'
    # worth), one parameter load and reciprocal for all of them (1: no tiles). Unmeasured on an H100.
    pow2_tiled_unroll: int = 1
    # No L2 prefetch ahead of the shift kernels' loads: one or two grid strides ahead were slower (74.4-85.3%).
    pow2_prefetch: int = 0
    # Four 512-thread blocks per SM at 32 registers (NVVM gave bf16 -> s8 34, three per SM); per-token quantize bf16
    # / f32 87.1 / 85.8% -> 94.0 / 94.3%, axis-0 channels 87.1 / 85.6 -> 93.9 / 94.3, group 128 83.2 / 85.7 -> 90.0
    # / 93.3; float64 math keeps NVVM's count (it spills at 32).
    pow2_launch_bounds: tuple[int, int] | None = (512, 4)
    # The channel kernels whose chunks span channels: 74 registers (one block per SM, DRAM 62% in ncu) capped at 64,
    # two blocks: bf16 quantize 79.4 -> 84.8%, dequantize 81.4 -> 90.4, f32 quantize 80.2 -> 97.5.
    channel_launch_bounds: tuple[int, int] | None = (512, 2)
    # The thread-stationary loop keeps max(2, this / input bytes per chunk) chunks in flight: bf16 dequantize
    # 89.8 / 90.0% at 8 or 16 bytes, 90.4 / 90.7 at 32, 90.4 at 64 (where bf16 quantize fell 92.2 -> 90.2).
    stationary_input_bytes: int = 32
    # Two blocks per SM of the stationary kernel (its grid one wave of them): 3 or 4 at 40 or 32 registers gave
    # 70-90% against 90-98% at 2.
    stationary_launch_bounds: tuple[int, int] = (512, 2)
    # -- the grids -------------------------------------------------------------------------------------------------
    # Waves of the stationary grid by the widest element's bytes (1 elsewhere): shorter-lived blocks, each thread
    # loading its parameters once per block. Along the last of 4096 channels, bf16 quantize / dequantize / backward
    # 91.6 / 89.1 / 95.2% at 1 wave, 95.4 / 89.7 / 95.6 at 4, 94.9 / 90.4 / 96.8 at 8; f32 quantize 98.7 at 1.
    stationary_waves: tuple[tuple[int, int], ...] = ((2, 8),)
    # A resident grid-stride grid (per-channel quantize, backward ops, FP8 per channel, dynamic's elementwise part).
    elementwise_policy: LaunchPolicy = _RESIDENT
    # FP8 quantize per tensor / token / group: bf16 per tensor 97.3% of copy on the resident grid, 89.6 in short
    # blocks.
    fp8_quantize_policy: LaunchPolicy = _RESIDENT
    # Short-lived 128-thread blocks, a chunk or two per thread (PyTorch's elementwise launch): per-tensor dequantize
    # f32 90.8 -> 94.3%, bf16 93.6 -> 97.0; group-128 dequantize bf16 91.6 -> 93.6, f32 90.7 -> 93.3.
    stream_policy: LaunchPolicy = _STREAM
    # Per-tensor dequantize: one chunk per thread, a grid covering the tensor: f32 94.1 -> 96.9% (Tensor.dequantize
    # 96.5), bf16 97.2 both ways.
    tensor_dequantize_policy: LaunchPolicy = _COVERING
    # Per-token / per-group integer quantize: 512 x 32 / 128 x 1024 -> 256 x 128 blocks, group 128 bf16 90.4 / 90.0
    # -> 92.7%, f32 91.0 / 93.2 -> 94.3, token bf16 93.9 / 89.1 -> 95.2.
    segment_quantize_policy: LaunchPolicy = _SEGMENTS
    # Channel vectors (last-axis dequantize and quantize backward, f32 / f64): short blocks, 4 chunks in flight,
    # against the stationary kernel: dequantize f32 88.8 -> 92.8%, quantize_backward f32 96.3 -> 100.1.
    channel_vector_policy: LaunchPolicy = _VECTORS

    @property
    def kernel(self) -> ElementwiseKernelTuning:
        """The part the kernels compile in."""
        return ElementwiseKernelTuning(**{f.name: getattr(self, f.name) for f in fields(ElementwiseKernelTuning)})

    def policy(self, role: LaunchRole) -> LaunchPolicy:
        """The grid of a launch role."""
        return getattr(self, f"{role.value}_policy")

    def waves(self, itemsize: int) -> int:
        """Waves of the stationary grid for an op whose widest element has ``itemsize`` bytes."""
        return dict(self.stationary_waves).get(itemsize, 1)


@dataclass(frozen=True)
class DynamicTuning:
    """The dynamic-range family's launch shapes (per-SM counts scale with the device's SMs) and what its kernels
    compile in (``% of copy on 3n bytes``: [65536, 4096] bf16 in, int8 out, token / group 128)."""

    threads: int = 128  # threads per block of the streaming, tensor and column kernels
    keep: int = 4  # their chunks per lane kept in registers, and loads in flight per round
    resident_threads: int = 128  # threads per block of resident segments
    resident_keep: int = 4  # chunks per thread of a resident segment (segments up to keep * threads chunks)
    resident_min_blocks: int = 0  # a launch bound: blocks per SM the registers must allow (0: none)
    # Grid cap of the resident kernel: more, shorter-lived blocks hide each row's reduce-then-store bubble (with the
    # next-row prefetch and streaming stores): 32 / SM 94.0 / 92.2% (neither), 64 95.3 / 93.7, 96 98.3 / 95.0,
    # 128 98.6 / 96.5; one row per block (512) 81.1 / 88.6 without them.
    resident_blocks_per_sm: int = 128
    resident_staged: bool = False  # the next round's chunks staged by cp.async: measured no faster
    # The next row asked of L2 once a row's loads are issued: with streaming stores, 128 blocks per SM, 96.1 /
    # 96.4 -> 98.6 / 96.5%; 2 rows ahead fell to 79; on 32 blocks per SM 1 row was slower (91.1 against 93.8).
    resident_prefetch_rows: int = 1
    segment_blocks_per_sm: int = 16  # grid cap of the streaming kernel (rows past keep * 32 lanes)
    # The tensor scope's range pass and quantize pass, blocks per SM (range : quantize, GPU us against
    # torch.compile's 455.5-457.8): 8 : 8 451.0-452.3, 16 : 8 451.9-453.0, 8 : 5 446.8-446.9, 8 : 4 447.8-449.6,
    # 8 : 6 448.7-450.1, 8 : 12 482.3-483.0, 4 : 8 456.7-457.0, 2 : 8 501.7.
    tensor_partial_blocks_per_sm: int = 8
    tensor_quantize_blocks_per_sm: int = 5
    # The quantize pass stores evict-first, so that its output leaves L2 before the tail of x the range pass left
    # there, which it reads first.
    tensor_streaming_stores: bool = True
    load_hint: bool = False  # x through the read-only path with 256-byte L2 fills: slower everywhere measured
    column_threads_per_sm: int = 2048  # threads of the column passes (rows split into that many slices)
    # Segments too long for a resident block, no more of them than SMs: one block of up to this many threads per
    # segment (every chunk in registers, one round of loads), where the streaming kernel's one warp per segment
    # would take rounds one after another (the W8A8 decode's quantizer: rows of 8192 bf16 at M <= 16).
    wide_segment_threads: int = 1024
    # The wide block grows to this many threads, then its chunks per thread up to wide_segment_keep, then its
    # threads again: one bf16 row in graph replay, threads x chunks, K = 8192 256 x 4 3.7 us, 128 x 8 4.2, 512 x 2
    # 4.7, 1024 x 1 7.2; K = 11008 256 x 8 4.4, 512 x 4 5.0, 128 x 16 5.2; K = 4096 128 x 4 3.3, 512 x 1 4.2.
    wide_segment_base_threads: int = 256
    wide_segment_keep: int = 8
    # At most one aligned segment per SM of exactly one resident block's chunks (the decode's rows of K = 4096 /
    # 8192 bf16) takes the resident kernel compiled for that length: 559 PTX instructions and 32 registers against
    # 1212 and 72; the quantizer alone 2.74-2.84 -> 1.65-1.84 us, quantized_linear M = 8 / 16 at 4096^2 54.7 / 52.0
    # -> 58.4 / 55.0% of copy, 11008 x 4096 66.9 / 69.4 -> 67.4 / 73.6.
    fixed_segments: bool = True
    # Chunks per lane of the fixed kernel (0: the resident shape's); 2 or 1 were no better within a run's spread.
    fixed_keep: int = 0
    # Blocks per fixed segment where one per segment leaves SMs idle (each reduces all of it, quantizes its share);
    # 2 or 4 were no better (4096^2 M = 16 49.4 / 49.2 against 54.9%).
    segment_split: int = 1
    # A split kernel's register cap: 80 lets a block of 128 threads stay beside two 256-thread decode GEMM blocks.
    segment_split_registers: int = 80
    # The segment kernels' stores: evict-first when x and q together exceed the L2 (None), which keeps the lines the
    # next-row prefetch brought in; smaller outputs stay cached for the decode GEMM. Token / asymmetric / FP8:
    # 93.8 / 86.2 / 91.1 -> 94.3 / 87.8 / 92.6%.
    segment_streaming_stores: bool | None = None
    # Up to this many segments (the decode quantizer's rows) the segment kernels launch as programmatic dependents
    # of the kernel before them, whose launch gap then disappears: quantized_linear at 4096^2, M = 1 / 2 / 4 / 8
    # 66.4 / 66.8 / 67.0 / 64.5 -> 71.3 / 68.2 / 68.4 / 67.5%; M = 17 / 32 / 64 46.0 / 46.2 / 45.2 -> 52.0 / 48.8 /
    # 47.5, M = 128 41.5 -> 37.3 (0: plain launches).
    dependent_segments_max: int = 64

    @property
    def kernel(self) -> DynamicKernelTuning:
        """The part the kernels compile in."""
        return DynamicKernelTuning(**{f.name: getattr(self, f.name) for f in fields(DynamicKernelTuning)})


@dataclass(frozen=True)
class PackedTuning:
    """The packed 4-bit family (S4 / U4 quantize, dequantize and one-pass dynamic range per group)."""

    # Quantize (and the two-pass path's packer): `unroll` chunks per thread, a grid resident in one wave (a second,
    # partial wave of a grid-stride kernel costs a whole one).
    quantize_policy: LaunchPolicy = _PACKED
    # Dequantize: 2 chunks per thread in short-lived 128-thread blocks, not one resident wave of 4 x 256 per SM:
    # int4 / uint4 82.9 / 82.6% -> 89.9 / 91.9.
    dequantize_policy: LaunchPolicy = _PACKED_DEQUANTIZE
    unroll: int = 4  # chunks each thread loads before computing, where the policy says none
    dynamic_threads: int = 256  # threads per block of the one-pass dynamic kernel
    dynamic_slots: int = 4  # chunks a lane holds per pass (several groups when they are small)
    dynamic_max_per_lane: int = 8  # groups needing more chunks per lane take the two-pass path
    # Lanes a group spreads over (more only to stay within dynamic_max_per_lane): bf16 groups of 128, int4 / uint4
    # 16 lanes 86.8 / 66.0%, 8 lanes 89.8 / 82.8, 4 lanes 89.5 / 85.3.
    dynamic_max_lanes: int = 4


@dataclass(frozen=True)
class MemoryTuning:
    """Every value the memory-bound plans read, for one card (``card``: the card they were measured on)."""

    card: str = "h100"
    elementwise: ElementwiseTuning = ElementwiseTuning()
    dynamic: DynamicTuning = DynamicTuning()
    packed: PackedTuning = PackedTuning()


H100_TUNING = MemoryTuning()
# The H200 (132 SMs like the H100, about 1.4x its DRAM bandwidth): the H100's values except the fields
# benchmarks/tune_cards.py found faster there, bit for bit (an H200, copy 4264 GB/s, 2^28 elements; the tables are
# in docs/performance.md, "NVIDIA H200"). Each needs more input bytes in flight per thread than on the H100.
H200_TUNING = MemoryTuning(
    card="h200",
    elementwise=ElementwiseTuning(
        # Tiled shift kernels, two chunks of one segment a thread (rows of 4096 bf16): quantize per token 87.5 ->
        # 99.0% of copy, group 128 83.7 -> 96.6, axis-0 channels 86.0 -> 97.2, FP8 per token 79.9 -> 81.7;
        # dequantize per token 90.7 -> 95.7, group 128 89.8 -> 92.9. Four chunks spill at the 32 registers of the
        # shift kernels' bounds (per token 68.5%); under bounds of three blocks they read 99.7 / 84.0 / 98.0 / 83.9
        # and 95.1 / 89.6.
        pow2_tiled_unroll=2,
        # FP8 dequantize e4m3 -> bf16 79.9 -> 95.6% of copy (the quantize rows within 0.6 points).
        narrow_input_bytes=16,
        # Dequantize along the last axis, bf16 83.5 -> 88.0%.
        stationary_input_bytes=64,
        # Per-tensor dequantize, two chunks per thread in a covering grid: s8 -> f32 76.6 -> 94.9%, -> bf16 78.2 ->
        # 93.9.
        tensor_dequantize_policy=LaunchPolicy(128, 4096, 2),
    ),
    # Dynamic range with no next-row prefetch: token symmetric 70.8 -> 73.1%, group 128 80.7 -> 82.9.
    dynamic=DynamicTuning(resident_prefetch_rows=0),
    # Packed 4-bit dequantize with four chunks per thread: 88.1 -> 91.0%.
    packed=PackedTuning(dequantize_policy=LaunchPolicy(128, 1024, 4)),
)
TUNINGS: dict[str, MemoryTuning] = {"h100": H100_TUNING, "h200": H200_TUNING}


def tuning_for(device: DeviceProperties) -> MemoryTuning:
    """The tuning value of ``device``: the one of :func:`~.device.card_of`'s card."""
    return TUNINGS[card_of(device)]


def _small(policy: LaunchPolicy) -> LaunchPolicy:
    return replace(policy, threads_per_block=32, blocks_per_sm=2)


@functools.cache
def simulated(tuning: MemoryTuning) -> MemoryTuning:
    """``tuning`` with the launch shapes of the simulator, which runs a Python thread per CUDA thread: blocks of 32
    threads, two per SM (the dynamic family's caps as small), and everything the kernels compile in kept (chunks
    in flight, prefetches, chunks per lane), so that the simulator runs each card's kernels."""
    e, d, p = tuning.elementwise, tuning.dynamic, tuning.packed
    small = {f.name: _small(getattr(e, f.name)) for f in fields(e) if f.name.endswith("_policy")}
    return replace(
        tuning,
        elementwise=replace(e, **small),
        dynamic=replace(d, threads=32, resident_threads=32, resident_blocks_per_sm=2, tensor_partial_blocks_per_sm=2,
                        tensor_quantize_blocks_per_sm=2, column_threads_per_sm=64,
                        wide_segment_threads=min(d.wide_segment_threads, 128)),
        packed=replace(p, quantize_policy=_small(p.quantize_policy), dequantize_policy=_small(p.dequantize_policy),
                       dynamic_threads=32))


def launchable(tuning: MemoryTuning) -> MemoryTuning:
    """``tuning`` as this platform launches it: :func:`simulated` under the simulator, else itself."""
    return simulated(tuning) if SIMULATOR else tuning


def current_tuning() -> MemoryTuning:
    """The tuning value of the current device (:func:`tuning_for` of :func:`~.device.device_properties`), as this
    platform launches it."""
    return launchable(tuning_for(device_properties()))
