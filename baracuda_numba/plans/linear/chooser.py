"""Which W8A8 kernels run for a problem: a pure function of the descriptor, the device's properties, the
tuning value and the caller's preference (``docs/design-linear.md``, "How a kernel is chosen").

:func:`choose` returns a :class:`LaunchSpec`: every kernel variant the plan may launch (its configuration,
block geometry, dynamic shared memory and whether it launches as a programmatic dependent), which one runs
on 16-byte aligned operands and which on others, and the workspace. It reads no global state and touches no
device, so it is tested on a CPU with any device and tuning values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...errors import Unsupported, problem_message
from ...kernels.linear import (
    SKINNY_M,
    SKINNY_MAX_M,
    SKINNY_N,
    SKINNY_THREADS,
    TILE_M,
    TILE_N,
    TILE_THREADS,
    FusedConfig,
    GemmConfig,
    Output,
    PipelinedConfig,
    PipelineShape,
    SkinnyConfig,
    StaticQuantizerConfig,
    TiledConfig,
    WarpgroupConfig,
    WgmmaShape,
    fused_shared_bytes,
)
from ...vocabulary import BackendKind, ElementKind, PlanPreference
from .problem import QuantizedLinearDescriptor, SmoothQuantLinearDescriptor
from .tuning import DeviceProperties, LinearTuning

__all__ = ["KernelLaunch", "StaticQuantizerLaunch", "LaunchSpec", "choose", "pipeline_shape", "wgmma_shape",
           "streamed_rows", "skinny_tiles", "fixed_prologue", "fused_x_loads", "dependent_prefetch", "workspace_layout"]


@dataclass(frozen=True)
class KernelLaunch:
    """One GEMM variant: its kernel ``config``, ``rows x cols`` outputs per block of ``threads``, ``shared_bytes``
    of dynamic shared memory, launched as a programmatic dependent of the kernel before it or not."""

    config: GemmConfig
    rows: int
    cols: int
    threads: int
    shared_bytes: int = 0
    dependent: bool = False

    def tiles_m(self, m: int) -> int:
        """Row tiles of an ``m``-row output (the grid numbers them fastest)."""
        return -(-m // self.rows)

    def blocks(self, m: int, n: int) -> int:
        """Blocks of the 1-D grid for an ``m x n`` output."""
        return self.tiles_m(m) * -(-n // self.cols)


@dataclass(frozen=True)
class StaticQuantizerLaunch:
    """The static quantizer of ``quantized_linear(..., act_scale=)``: ``blocks x threads``, a programmatic
    dependent of the kernel before or not."""

    config: StaticQuantizerConfig
    blocks: int
    threads: int
    dependent: bool


@dataclass(frozen=True)
class LaunchSpec:
    """What a W8A8 plan launches (see :func:`choose`).

    ``variants``: ``(name, launch)`` of every GEMM variant; ``aligned``: the one run on 16-byte aligned operands
    with ``K % 16 == 0`` (the plan's SKU), ``other``: the one for other operands (None where the workspace the
    caller allows holds no quantized activations: then only the fused kernel runs); ``fused``: ``aligned`` is the
    fused kernel; ``capture_unfused``: under graph capture the two launches run instead of the fused kernel
    chosen for host time alone; ``quantizer_dependent``: the per-token quantizer's fast launch is a programmatic
    dependent; ``static_quantizer``: the static-activation quantizer's launch (None: none, or the per-tensor plan
    and a fill); ``workspace_bytes``: ``run``'s workspace."""

    variants: tuple[tuple[str, KernelLaunch], ...]
    aligned: str
    other: str | None
    fused: bool = False
    capture_unfused: bool = False
    quantizer_dependent: bool = False
    static_quantizer: StaticQuantizerLaunch | None = None
    workspace_bytes: int = 0

    def variant(self, name: str) -> KernelLaunch:
        for found, launch in self.variants:
            if found == name:
                return launch
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.variants)


@dataclass(frozen=True)
class _Problem:
    """A descriptor of either plan, as the choice reads it (``x`` is S8 for SmoothQuant)."""

    m: int
    n: int
    k: int
    x: ElementKind
    out: ElementKind
    has_bias: bool
    static_weight: bool
    static_activation: bool

    @property
    def smoothquant(self) -> bool:
        return self.x is ElementKind.S8


def _problem(desc: Any) -> _Problem:
    if isinstance(desc, SmoothQuantLinearDescriptor):
        return _Problem(desc.m, desc.n, desc.k, ElementKind.S8, desc.output_element, desc.has_bias,
                        desc.static_weight, False)
    if isinstance(desc, QuantizedLinearDescriptor):
        return _Problem(desc.m, desc.n, desc.k, desc.input_element, desc.output_element, desc.has_bias,
                        desc.static_weight, desc.static_activation)
    raise TypeError(f"choose: a W8A8 linear descriptor, not {type(desc).__name__}")


_NO_PREFERENCE = PlanPreference()


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# -- prefill geometry -----------------------------------------------------------------------------------------


def pipeline_shape(t: LinearTuning, m: int, n: int, multiprocessors: int) -> PipelineShape:
    """The pipelined kernel's shape for an ``m x n`` output: ``t.pipeline_large`` when its last wave of blocks is
    at least 90 % full (one block per multiprocessor), else ``t.pipeline``."""
    large = t.pipeline_large
    if large is not None:
        tiles = _ceil(m, large.tile_m) * _ceil(n, large.tile_n)
        waves = _ceil(tiles, multiprocessors)
        if tiles >= 0.9 * waves * multiprocessors:
            return large
    return t.pipeline


def streamed_rows(shape: WgmmaShape, m: int, n: int, multiprocessors: int) -> int:
    """Rows of operands (each ``K`` bytes) the busiest multiprocessor copies for an ``m x n`` output in
    ``shape``: its waves of blocks (one block per multiprocessor) times a block's live activation rows plus
    its weight rows. Rows past ``M`` are zero-filled without a read."""
    blocks = _ceil(m, shape.tile_m) * _ceil(n, shape.tile_n)
    return _ceil(blocks, multiprocessors) * (min(shape.tile_m, m) + shape.tile_n)


def wgmma_shape(t: LinearTuning, m: int, n: int, multiprocessors: int) -> WgmmaShape:
    """The warpgroup kernel's shape for an ``m x n`` output: between the two large tiles, the one whose waves
    of blocks end first (a narrow block taking ``t.narrow_tile_time`` of a wide one); then a small shape of
    ``t.wgmma_small`` (the first of the fewest) where it makes the busiest multiprocessor copy fewer operand rows
    than the large tiles both would (:func:`streamed_rows`): a block streams its operands at about the same bytes
    per second whatever its tile, so where the large tiles leave multiprocessors idle the smaller ones finish
    first."""
    narrow, wide = t.wgmma_narrow, t.wgmma_wide
    large = wide
    if narrow is not None:

        def waves(shape: WgmmaShape) -> int:
            return _ceil(_ceil(m, shape.tile_m) * _ceil(n, shape.tile_n), multiprocessors)

        large = narrow if t.narrow_tile_time * waves(narrow) < waves(wide) else wide
    bound = min(streamed_rows(shape, m, n, multiprocessors) for shape in (wide, narrow or wide))
    small = min(t.wgmma_small, key=lambda shape: streamed_rows(shape, m, n, multiprocessors), default=None)
    if small is not None and streamed_rows(small, m, n, multiprocessors) < bound:
        return small
    return large


# -- decode geometry ------------------------------------------------------------------------------------------


def skinny_tiles(t: LinearTuning, k: int) -> int:
    """Column tiles per decode block: ``t.skinny_tiles``, else 4 from K = 8192 and 2 below."""
    if t.skinny_tiles is not None:
        return t.skinny_tiles
    return 4 if k >= 8192 else 2


def _skinny_chunks(t: LinearTuning, dependent: bool, n_tiles: int, blocks: int, multiprocessors: int) -> int:
    """Weight chunks per buffer of the aligned decode GEMM: ``t.dependent_chunks`` (dependent, when set), else
    ``t.multi_wave_wide_chunks`` with 4 column tiles past one block per SM, else ``t.vector_chunks``."""
    if dependent and t.dependent_chunks is not None:
        return t.dependent_chunks
    return t.multi_wave_wide_chunks if n_tiles >= 4 and blocks > multiprocessors else t.vector_chunks


def _dependent_min_blocks(t: LinearTuning, n_tiles: int) -> int:
    if t.dependent_min_blocks is not None:
        return t.dependent_min_blocks
    return 2 if n_tiles == 2 else 0


def dependent_prefetch(t: LinearTuning, m: int, n: int, k: int, one_wave: bool = False) -> int:
    """Main-loop iterations of weight the dependent decode GEMM asks L2 for before it waits: ``t.dependent_prefetch_l2``
    when set; at ``K >= 8192`` where its blocks fit one wave at two per SM (``one_wave``) one, two from
    ``t.one_wave_deep_prefetch_min_m`` tokens on weights of more than 4096 rows; else one for weights of at most
    4096 rows with long rows (``K >= 8192``) or up to 4 tokens (few blocks: the prefetch keeps HBM busy while the
    quantizer runs)."""
    if t.dependent_prefetch_l2 is not None:
        return t.dependent_prefetch_l2
    if k >= 8192 and one_wave:
        return 2 if m >= t.one_wave_deep_prefetch_min_m and n > 4096 else 1
    return 1 if n <= 4096 and (k >= 8192 or m <= 4) else 0


def _fused_min_blocks(t: LinearTuning, tiles: int, x: ElementKind) -> int:
    """The fused kernel's launch bounds: ``t.fused_min_blocks`` with at most 2 column tiles and 16- or 32-bit
    ``x`` (no spills there under the register cap), else none."""
    return t.fused_min_blocks if tiles <= 2 and x.itemsize <= 4 else 0


def fused_x_loads(t: LinearTuning, m: int, k: int, x: ElementKind, min_blocks: int) -> int:
    """The fused kernel's pieces of ``x`` per thread in flight: ``t.absmax_loads`` under launch bounds of 3 or
    more blocks (or none); under 2, every piece of the thread's ``min(m, SKINNY_M)`` rows up to
    ``t.wide_x_loads_max``, a multiple of ``t.absmax_loads``."""
    if t.wide_x_loads_max is None or min_blocks == 0 or min_blocks > 2:
        return t.absmax_loads
    per_row = _ceil(k * x.itemsize // 16, SKINNY_THREADS)
    pieces = _ceil(min(m, SKINNY_M) * per_row, t.absmax_loads) * t.absmax_loads
    return max(t.absmax_loads, min(pieces, t.wide_x_loads_max))


def fixed_prologue(m: int, k: int, x: ElementKind, x_loads: int) -> tuple[int, int] | None:
    """``(rows, pieces per row per thread)`` of a fused prologue compiled for one shape (``m <= SKINNY_M``, one
    row tile; every piece of the thread's rows in flight at once: at most ``x_loads``), else None."""
    per_row = _ceil(k * x.itemsize // 16, SKINNY_THREADS)
    return (m, per_row) if 0 < m <= SKINNY_M and m * per_row <= x_loads else None


class _Rules:
    """The choice's rules for one problem on one device with one tuning value (each method one rule of
    ``docs/design-linear.md``, "How a kernel is chosen")."""

    def __init__(self, p: _Problem, device: DeviceProperties, t: LinearTuning, pref: PlanPreference) -> None:
        self.p, self.t, self.sms = p, t, device.multiprocessors
        self.warpgroup = t.warpgroup and device.sm90a and pref.allow_sm90a

    def waits_first(self) -> bool:
        """SmoothQuant's dependent GEMM waits first thing unless the weight is static (the kernel before may be
        anyone's)."""
        return self.p.smoothquant and not self.p.static_weight

    def static_weight(self) -> bool:
        """The fused kernel's static-weight promise (quantized_linear's descriptor)."""
        return not self.p.smoothquant and self.p.static_weight

    def warpgroup_batch(self) -> bool:
        """Batches past ``warpgroup_min_m`` tokens (up to ``SKINNY_MAX_M``) take the warpgroup kernel's small tiles."""
        p = self.p
        return p.m > self.t.warpgroup_min_m and p.k % 16 == 0 and self.warpgroup

    def wgmma_dependent(self) -> bool:
        p, t = self.p, self.t
        if p.smoothquant:
            return t.dependent_gemm and p.m <= t.smoothquant_wgmma_dependent_max_m
        return p.m <= t.wgmma_dependent_max_m

    def one_wave(self, tiles: int) -> bool:
        """The fused kernel's blocks (``tiles`` column tiles each) fit one wave at two per SM."""
        return tiles == 2 and _ceil(self.p.n, SKINNY_N * tiles) <= 2 * self.sms

    def weight_hint(self) -> str:
        """The decode weight loads' cache operators: skip L1 (with 256-byte L2 fills) for long rows, 16 tokens
        or large weights, plain loads elsewhere."""
        p, t = self.p, self.t
        if t.weight_load_hint is not None:
            return t.weight_load_hint
        if p.k >= t.weight_no_l1_min_k or p.m >= t.weight_no_l1_min_m or p.n * p.k >= t.weight_no_l1_min_bytes:
            return f"na_l2_{t.weight_l2_prefetch_bytes}" if t.weight_l2_prefetch_bytes else "na"
        return ""

    def wide_tiles(self, tiles: int) -> int:
        """Column tiles per block of the dependent decode GEMM: ``tiles``, or the fewest up to ``wide_tiles_max``
        whose blocks fit one wave at two per SM (only from 2 tiles and one row tile, with the default chunks)."""
        p, t, sms = self.p, self.t, self.sms
        if not t.wide_tiles or tiles != 2 or p.m > SKINNY_M or t.skinny_tiles is not None \
                or t.dependent_chunks is not None:
            return tiles
        blocks = _ceil(p.n, SKINNY_N * tiles)
        if blocks <= 2 * sms:
            return tiles
        most = t.wide_tiles_max
        if p.smoothquant and not self.waits_first():  # the static promise
            wanted = t.static_smoothquant_wide
            if p.m < t.wide_tiles_min_m:
                most = t.wide_tiles_max_few_tokens
        elif blocks <= 3 * sms:  # one wave at three per SM (three_per_sm_chunks)
            wanted = p.smoothquant or p.m < t.wide_tiles_min_m
        else:  # quantized_linear's, and SmoothQuant's waiting first
            few = t.smoothquant_few_tokens_wide_min_m if p.smoothquant else t.few_tokens_wide_min_m
            wanted = p.m >= min(t.wide_tiles_min_m, few)
            if p.m < t.wide_tiles_min_m:
                most = t.wide_tiles_max_few_tokens
        if wanted:
            for wide in range(tiles + 1, most + 1):
                if _ceil(p.n, SKINNY_N * wide) <= 2 * sms:
                    return wide
        return tiles

    def fused_shape(self, tiles: int) -> tuple[int, int, int, int, tuple[int, int] | None]:
        """The fused kernel's ``(chunks, launch bounds, L2 prefetch, x_loads, fixed prologue)`` with ``tiles``
        column tiles: the one-wave shape (more chunks in flight under bounds of 2) where its blocks fit one wave
        at two per SM."""
        p, t = self.p, self.t
        chunks, min_blocks = t.one_launch_chunks, _fused_min_blocks(t, tiles, p.x)
        prefetch = t.fused_prefetch_l2
        if (self.static_weight() or t.one_wave_shape) and self.one_wave(tiles):
            chunks, min_blocks = t.static_one_wave_chunks, t.static_one_wave_min_blocks
            prefetch = t.static_one_wave_prefetch_l2 if self.static_weight() else t.one_wave_prefetch_l2
        x_loads = fused_x_loads(t, p.m, p.k, p.x, min_blocks)
        fixed = fixed_prologue(p.m, p.k, p.x, x_loads) if t.fixed_prologue else None
        return chunks, min_blocks, prefetch, x_loads, fixed

    def fused_on_gpu_time(self) -> bool:
        """The fused kernel is the faster on the GPU (not only on the host): few tokens with long rows against
        wide weights, a few more where its blocks fit one wave at two per SM, and the ``wide_fused`` rules."""
        p, t = self.p, self.t
        tiles = skinny_tiles(t, p.k)
        one_wave = (p.static_weight or t.one_wave_shape) and self.one_wave(tiles)
        one_wave_tokens = t.static_fused_max_m if p.static_weight else t.one_wave_fused_max_m
        return ((p.k >= t.fused_min_k and p.n >= t.fused_min_n and p.m <= min(t.fused_max_m, t.long_rows_fused_max_m))
                or (one_wave and p.m <= one_wave_tokens) or self.wide_fused())

    def wide_fused(self) -> bool:
        """With 2 column tiles and up to ``wide_fused_max_n`` rows: up to ``wide_fused_max_m`` tokens where the fused
        blocks do not make more than one and at most ``wide_fused_skip_waves`` waves at their launch bounds, up to
        ``wide_one_wave_fused_max_m`` where they make at most one there but more than one at two per SM; not where
        the two launches take wide blocks (past three blocks per SM)."""
        p, t = self.p, self.t
        tiles = skinny_tiles(t, p.k)
        min_blocks = _fused_min_blocks(t, tiles, p.x)
        if (p.m > max(t.wide_fused_max_m, t.wide_one_wave_fused_max_m) or tiles != 2 or p.n > t.wide_fused_max_n
                or not min_blocks):
            return False
        blocks = _ceil(p.n, SKINNY_N * tiles)
        if blocks > 3 * self.sms and self.wide_tiles(tiles) != tiles:
            return False
        slots = min_blocks * self.sms
        waves = blocks / slots if slots else math.inf
        if p.m > t.wide_fused_max_m:
            return waves <= 1 and not self.one_wave(tiles)
        return not 1 < waves <= t.wide_fused_skip_waves

    def fuses_quantize(self) -> bool:
        """quantized_linear's aligned decode takes the fused kernel: one token on any weight up to
        ``fused_any_shape_max_weight`` (host time), or where it is the faster on the GPU, within the rows and
        shared memory it was measured with."""
        p, t = self.p, self.t
        host = p.m <= t.fused_any_shape_max_m and p.n * p.k <= t.fused_any_shape_max_weight
        static_wave = p.static_weight and self.one_wave(skinny_tiles(t, p.k))
        gpu = self.fused_on_gpu_time() and p.m <= (t.static_fused_max_m if static_wave else t.fused_max_m)
        max_n = t.wide_fused_max_n if self.wide_fused() else t.fused_max_n
        return ((host or gpu) and p.n <= max_n and p.k % 16 == 0
                and fused_shared_bytes(p.m, p.k) <= t.fused_max_shared)


def _decode_variants(r: _Rules, out: Output) -> tuple[dict[str, KernelLaunch], str, str, bool]:
    """The decode variants (``M <= SKINNY_MAX_M`` outside the warpgroup's batches): the byte-path skinny kernel,
    the aligned one (a programmatic dependent with ``dependent_gemm``), and quantized_linear's fused kernel."""
    p, t, sms = r.p, r.t, r.sms
    variants: dict[str, KernelLaunch] = {}
    tiles = skinny_tiles(t, p.k)
    variants["skinny"] = KernelLaunch(SkinnyConfig(out, t.skinny_chunks, tiles), SKINNY_M, SKINNY_N * tiles,
                                      SKINNY_THREADS)
    dependent = t.dependent_gemm
    wide = r.wide_tiles(tiles) if dependent else tiles
    blocks = _ceil(p.m, SKINNY_M) * _ceil(p.n, SKINNY_N * wide)
    chunks = _skinny_chunks(t, dependent, wide, blocks, sms)
    if dependent and wide == 2 and t.dependent_chunks is None and 2 * sms < blocks <= 3 * sms:
        chunks = t.three_per_sm_chunks
    waits_first = dependent and r.waits_first()
    static_smoothquant = p.smoothquant and dependent and not r.waits_first()
    one_wave = ((not p.smoothquant or (t.static_smoothquant_one_wave_prefetch and static_smoothquant))
                and blocks <= 2 * sms)
    prefetch = dependent_prefetch(t, p.m, p.n, p.k, one_wave) if dependent else 0
    wide_min_m = t.wide_tiles_min_m if p.smoothquant else min(t.wide_tiles_min_m, t.few_tokens_wide_min_m)
    if (wide != tiles and (not p.smoothquant or static_smoothquant) and p.m >= wide_min_m
            and _ceil(p.n, SKINNY_N * tiles) > 3 * sms and t.dependent_prefetch_l2 is None):
        prefetch = t.wide_tiles_prefetch_l2
    config = SkinnyConfig(out, chunks, wide, double_buffer=True, vector_only=True,
                          preload=t.dependent_preload if dependent else 0, wait_first=waits_first,
                          prefetch_l2=prefetch,
                          early_l2=t.wait_first_early_l2 if waits_first and blocks <= 2 * sms else 0,
                          min_blocks=(2 if wide != tiles else _dependent_min_blocks(t, tiles)) if dependent else 0,
                          max_registers=t.dependent_max_registers if dependent else 0, weight_hint=r.weight_hint())
    variants["skinny_vector"] = KernelLaunch(config, SKINNY_M, SKINNY_N * wide, SKINNY_THREADS, 0, dependent)
    if p.smoothquant:
        return variants, "skinny_vector", "skinny", False
    chunks, min_blocks, prefetch, x_loads, fixed = r.fused_shape(tiles)
    if not r.fuses_quantize() or (p.static_activation and fixed is None):
        return variants, "skinny_vector", "skinny", False
    static = r.static_weight()
    early = p.k >= t.fused_dependent_min_k or static  # a dependent: weight read before its wait
    registers = static and (t.static_early_registers_everywhere or r.one_wave(tiles))
    config = FusedConfig(Output(p.out, p.has_bias, False), p.x, chunks, tiles, prefetch, min_blocks,
                         early_l2=t.fused_early_l2 if early and not registers else 0,
                         early_registers=early and registers, x_loads=x_loads, fixed=fixed,
                         static_scale=p.static_activation, weight_hint=r.weight_hint())
    variants["fused"] = KernelLaunch(config, SKINNY_M, SKINNY_N * tiles, SKINNY_THREADS,
                                     fused_shared_bytes(p.m, p.k), early)
    return variants, "fused", "skinny", True


def _prefill_variants(r: _Rules, out: Output) -> tuple[dict[str, KernelLaunch], str, str]:
    """The prefill variants: the pipelined kernel (aligned, ``K % 16 == 0``) and the tiled one (others); on
    sm_90a the warpgroup kernel for aligned operands, and the skinny byte path for misaligned batches."""
    p, t, sms = r.p, r.t, r.sms
    shape = pipeline_shape(t, p.m, p.n, sms)
    variants = {"pipelined": KernelLaunch(PipelinedConfig(out, shape), shape.tile_m, shape.tile_n, shape.threads,
                                          shape.shared_bytes),
                "tiled": KernelLaunch(TiledConfig(out), TILE_M, TILE_N, TILE_THREADS)}
    aligned = "pipelined" if p.k % 16 == 0 else "tiled"
    if p.k % 16 == 0 and r.warpgroup:
        wide = wgmma_shape(t, p.m, p.n, sms)
        dependent = r.wgmma_dependent()
        config = WarpgroupConfig(out, wide, dependent, dependent and r.waits_first())
        variants["wgmma"] = KernelLaunch(config, wide.tile_m, wide.tile_n, wide.threads, wide.shared_bytes, dependent)
        aligned = "wgmma"
    other = "tiled"
    if r.warpgroup_batch():
        # misaligned operands of a batch keep the skinny kernel's byte path (2-4x the tiled kernel there)
        tiles = skinny_tiles(t, p.k)
        variants["skinny"] = KernelLaunch(SkinnyConfig(out, t.skinny_chunks, tiles), SKINNY_M, SKINNY_N * tiles,
                                          SKINNY_THREADS)
        other = "skinny"
    return variants, aligned, other


def workspace_layout(m: int, k: int, x: ElementKind, quantizer_workspace: int = 0) -> tuple[int, int, int]:
    """quantized_linear's workspace: ``(row scales' offset, the quantizer's scratch offset, total bytes)`` after
    the quantized activations ``[m, k]`` int8; the row scales are float32 (float64 for f64 ``x``), each part
    256-byte aligned."""
    scale_bytes = 8 if x is ElementKind.F64 else 4
    scale_offset = _align(m * k)
    quantizer_offset = scale_offset + _align(scale_bytes * m)
    return scale_offset, quantizer_offset, quantizer_offset + _align(quantizer_workspace)


def _align(n: int) -> int:
    return -(-n // 256) * 256


def choose(desc: QuantizedLinearDescriptor | SmoothQuantLinearDescriptor, device: DeviceProperties,
           tuning: LinearTuning, pref: PlanPreference = _NO_PREFERENCE, quantizer_workspace: int = 0,
           where: str = "choose") -> LaunchSpec:
    """The launch spec of ``desc`` on ``device`` with ``tuning`` under ``pref`` (see :class:`LaunchSpec`).

    ``pref.allow_sm90a=False`` leaves out the warpgroup kernel (the ``mma.sync`` kernels give the same bits);
    ``pref.prefer_backend`` other than ``BESPOKE`` (or None) is :class:`~baracuda_numba.errors.Unsupported` (every
    kernel here is bespoke); ``pref.max_workspace_bytes`` below quantized_linear's workspace leaves only the fused
    kernel (no workspace; aligned operands only), else :class:`~baracuda_numba.errors.Unsupported`.
    ``quantizer_workspace``: the per-token quantizer's scratch bytes (part of quantized_linear's workspace);
    ``where``: the plan named in errors."""
    if pref.prefer_backend not in (None, BackendKind.BESPOKE):
        raise Unsupported(problem_message(where, "pref.prefer_backend", "None or BESPOKE (every W8A8 kernel is "
                                          "bespoke)", pref.prefer_backend.name))
    p = _problem(desc)
    r = _Rules(p, device, tuning, pref)
    out = Output(p.out, p.has_bias, p.smoothquant)
    fused = False
    if p.m <= SKINNY_MAX_M and not r.warpgroup_batch():
        variants, aligned, other, fused = _decode_variants(r, out)
    else:
        variants, aligned, other = _prefill_variants(r, out)
    if p.smoothquant:
        return LaunchSpec(tuple(variants.items()), aligned, other)
    workspace = workspace_layout(p.m, p.k, p.x, quantizer_workspace)[2]
    capture_unfused = fused and tuning.capture_unfused and not r.fused_on_gpu_time()
    limit = pref.max_workspace_bytes
    if limit is not None and workspace > limit:
        if not fused:
            raise Unsupported(problem_message(where, "pref.max_workspace_bytes", f">= {workspace} (the quantized "
                                              "activations; only the fused decode kernel needs none)", limit))
        other, workspace, capture_unfused = None, 0, False
    static = None
    if p.static_activation and tuning.static_quantizer:
        pieces = p.m * p.k * p.x.itemsize // 16
        threads = tuning.static_quantizer_threads
        blocks = max(1, min(_ceil(pieces, threads), tuning.static_quantizer_blocks_per_sm * device.multiprocessors))
        static = StaticQuantizerLaunch(StaticQuantizerConfig(p.x), blocks, threads, tuning.static_quantizer_dependent)
    return LaunchSpec(tuple(variants.items()), aligned, other, fused, capture_unfused,
                      p.n * p.k >= tuning.quantizer_dependent_min_weight, static, workspace)
