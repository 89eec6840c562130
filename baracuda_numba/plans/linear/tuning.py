"""The W8A8 linear's tuning: the measured device properties and a frozen tuning value per card.

:func:`device_properties` reads what the choice depends on from the driver (compute capability,
multiprocessors, memory bandwidth as ``2 x memory clock x bus width``; :mod:`..device`, shared with the
memory-bound families); :func:`tuning_for` picks the tuning value of that card by the rule there
(:func:`~..device.card_of`). Each field of :class:`LinearTuning` says in one line why it has
its value; the measurements behind them are in ``docs/design-linear.md``, "Tuning values". A value is part
of the plan cache key: tests and the tuning tool pass their own (``dataclasses.replace(H100_TUNING, ...)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...kernels.linear import PipelineShape, WgmmaShape
from ..device import H100_SXM, H200_SXM, SIMULATED, DeviceProperties, card_of, device_properties

__all__ = ["DeviceProperties", "LinearTuning", "H100_TUNING", "H200_TUNING", "H100_SXM", "H200_SXM", "SIMULATED",
           "device_properties", "tuning_for", "current_tuning"]


# The shapes the H100 values name (module constants: a dataclass default is one shared, frozen value).
_PIPELINE, _PIPELINE_LARGE = PipelineShape(stages=4), PipelineShape(2, 4, 4, 8, 3)
_WGMMA_WIDE, _WGMMA_NARROW = WgmmaShape(), WgmmaShape(tile_n=128, stages=5)
_WGMMA_SMALL = (WgmmaShape(tile_n=64, stages=6), WgmmaShape(tile_n=64, stages=8, warpgroups=1),
                WgmmaShape(tile_n=32, stages=10, warpgroups=1))


@dataclass(frozen=True)
class LinearTuning:
    """Every value the W8A8 choice (:func:`~.chooser.choose`) reads, for one card (``docs/design-linear.md``,
    "Tuning values", has the measurement behind each)."""

    card: str = "h100"  # the card these values were measured on (part of the plan cache key)
    # -- prefill ------------------------------------------------------------------------------------------
    # the pipelined kernel's tile: 128 x 128 with 4 stages was the fastest everywhere ...
    pipeline: PipelineShape = _PIPELINE
    # ... and 128 x 256 with 3 stages 4-13 % faster where its tiles fill their last wave to 90 % (None: never)
    pipeline_large: PipelineShape | None = _PIPELINE_LARGE
    warpgroup: bool = True  # prefill on sm_90a runs the wgmma kernel: 1.3-1.6x the pipelined one's TOPS
    wgmma_wide: WgmmaShape = _WGMMA_WIDE  # 128 x 256 in 4 stages: the fastest for large M
    # 128 x 128 in 5 stages where its waves end first (None: the wide tile only) ...
    wgmma_narrow: WgmmaShape | None = _WGMMA_NARROW
    narrow_tile_time: float = 0.62  # ... a narrow block taking this share of a wide block's time
    # 128 x 64 and one warpgroup of 64 x 64 / 64 x 32, deeper rings, where they stream fewer rows per SM
    wgmma_small: tuple[WgmmaShape, ...] = _WGMMA_SMALL
    warpgroup_min_m: int = 16  # past this many tokens wgmma's small tiles beat the skinny kernel
    wgmma_dependent_max_m: int = 128  # quantized_linear's wgmma is the quantizer's dependent up to here
    smoothquant_wgmma_dependent_max_m: int = 256  # SmoothQuant's wgmma is a dependent up to here
    # -- decode: the skinny kernel -----------------------------------------------------------------------
    skinny_chunks: int = 2  # the byte path's weight chunks in flight per warp
    skinny_tiles: int | None = None  # column tiles per block (None: 4 from K = 8192, else 2: measured best)
    vector_chunks: int = 2  # the aligned kernel's chunks per buffer: 76-85 % of copy against 66-82 with 1
    multi_wave_wide_chunks: int = 1  # 4 tiles past one wave: 1 chunk keeps 128 registers, two blocks per SM
    dependent_gemm: bool = True  # the decode GEMM is a programmatic dependent (its weight under the quantizer)
    dependent_preload: int = 1  # buffers loaded before the wait: a second slowed the main loop
    dependent_chunks: int | None = None  # chunks of the dependent GEMM (None: the rules above)
    dependent_min_blocks: int | None = None  # its launch bounds (None: 2 with 2 tiles, none with 4: spills)
    dependent_max_registers: int = 0  # its register cap (0: ptxas's choice)
    dependent_prefetch_l2: int | None = None  # iterations asked of L2 before the wait (None: the rule)
    one_wave_deep_prefetch_min_m: int = 4  # from this M the one-wave GEMM at K >= 8192 asks for two
    wait_first_early_l2: int = 2  # SmoothQuant's GEMM waiting first asks L2 for two iterations (one wave)
    three_per_sm_chunks: int = 1  # 1 chunk (72 registers) where three 2-tile blocks per SM make one wave
    wide_tiles: bool = True  # past one wave at two per SM, wider blocks that make one: less L2 traffic
    wide_tiles_max: int = 7  # the widest block (7 tiles spill 24 bytes and still win)
    wide_tiles_min_m: int = 16  # tokens from which the wide blocks ask L2 for an iteration before the wait
    wide_tiles_prefetch_l2: int = 1  # ... that one iteration
    few_tokens_wide_min_m: int = 1  # quantized_linear's GEMM takes wide blocks from one token
    smoothquant_few_tokens_wide_min_m: int = 1  # so does SmoothQuant's waiting first
    static_smoothquant_wide: bool = True  # SmoothQuant under the static promise takes them at every M
    wide_tiles_max_few_tokens: int = 7  # the widest block below wide_tiles_min_m tokens
    static_smoothquant_one_wave_prefetch: bool = True  # static SmoothQuant asks L2 as quantized_linear does
    # the decode weight loads' cache operators for every shape (None: the rule of the next four fields)
    weight_load_hint: str | None = None
    weight_no_l1_min_k: int = 8192  # weights this long skip L1 (read once; L1 keeps the activations) ...
    weight_no_l1_min_m: int = 16  # ... as do the loads for this many tokens ...
    weight_no_l1_min_bytes: int = 32 << 20  # ... and of weights this large
    weight_l2_prefetch_bytes: int = 256  # where they skip L1, a miss fills 256 bytes of L2 (0: the default)
    quantizer_dependent_min_weight: int = (16 << 20) + 1  # past this weight the quantizer is a dependent
    # -- decode: the fused kernel --------------------------------------------------------------------------
    one_launch_chunks: int = 1  # the fused kernel's chunks: 2 spill under its launch bounds
    fused_min_blocks: int = 3  # its launch bounds with 2 tiles and 16/32-bit x (as many blocks as unfused)
    absmax_loads: int = 4  # pieces of x per thread in flight in its general prologue (8 spill)
    wide_x_loads_max: int | None = 8  # under bounds of 2, every piece up to this many (one L2 round trip)
    fixed_prologue: bool = True  # the prologue compiled for the plan's M and K: 2-3x fewer instructions
    fused_prefetch_l2: int = 0  # iterations asked of L2 before the prologue (none measured faster)
    fused_early_l2: int = 2  # iterations asked of L2 before its wait: 2 was the fastest of 0-8
    fused_max_m: int = 2  # the most tokens fused on GPU time (with long rows, one wave)
    long_rows_fused_max_m: int = 1  # long rows (K >= fused_min_k) fuse one token; two chain faster
    fused_dependent_min_k: int = 0  # the fused kernel is a dependent at every K
    fused_any_shape_max_m: int = 1  # one token fuses on any weight up to ...
    fused_any_shape_max_weight: int = 32 << 20  # ... 32 MiB: one launch saves more host time than GPU time
    wide_fused_max_m: int = 1  # K < 8192, past one wave: one token fuses up to wide_fused_max_n rows ...
    wide_one_wave_fused_max_m: int = 2  # ... two where the blocks make one wave at three per SM
    wide_fused_max_n: int = 14336  # the widest weight measured fused
    wide_fused_skip_waves: float = 1.5  # but not between 1 and 1.5 waves, where the last wave pays the prologue
    capture_unfused: bool = True  # under graph capture, shapes fused for host time launch the two kernels
    static_one_wave_chunks: int = 2  # the one-wave fused kernel keeps 2 chunks in flight ...
    static_one_wave_min_blocks: int = 2  # ... under launch bounds of 2
    static_early_registers_everywhere: bool = False  # a static weight loads registers early in one wave only
    one_wave_shape: bool = True  # the fused kernel without the promise takes the one-wave shape too
    one_wave_fused_max_m: int = 2  # ... and fuses up to 2 tokens there
    one_wave_prefetch_l2: int = 0  # ... asking L2 for nothing more after its wait
    static_fused_max_m: int = 4  # with a static weight, one wave: up to 4 tokens (the fixed prologue)
    static_one_wave_prefetch_l2: int = 1  # ... asking L2 for one more iteration after its wait
    fused_min_k: int = 8192  # long rows: from this K ...
    fused_min_n: int = 8192  # ... and this many weight rows (fewer make fewer blocks than SMs)
    fused_max_n: int = 11008  # wider weights fused are unmeasured (but by the wide_fused_* rule)
    fused_max_shared: int = 160 * 1024  # the quantized rows must fit this much shared memory
    # -- the static quantizer (quantized_linear with act_scale) --------------------------------------------
    static_quantizer: bool = True  # no reduction: its own kernel, not the per-tensor plan and a fill
    static_quantizer_threads: int = 128  # threads per block
    static_quantizer_blocks_per_sm: int = 8  # blocks per SM at most
    static_quantizer_dependent: bool = True  # a programmatic dependent of the kernel before


H100_TUNING = LinearTuning()
# The H200 (132 SMs like the H100, about 4.8 TB/s): the H100's values. No measurement on an H200 has
# changed one yet; ``benchmarks/tune_cards.py`` run on an H200 prints the value to put here (the fields where
# a variant was faster, bit for bit), and each changed field gets its measurement in docs/design-linear.md.
H200_TUNING = LinearTuning(card="h200")


def tuning_for(device: DeviceProperties) -> LinearTuning:
    """The tuning value of ``device``: the H200's for an H200-class card (:func:`~..device.card_of`: compute
    capability 9.0 with at least 4 TB/s of DRAM bandwidth), else the H100's (the card every value was measured on;
    the rules scale with the SM count)."""
    return H200_TUNING if card_of(device) == "h200" else H100_TUNING


def current_tuning() -> LinearTuning:
    """The tuning value of the current device (:func:`tuning_for` of :func:`device_properties`)."""
    return tuning_for(device_properties())
