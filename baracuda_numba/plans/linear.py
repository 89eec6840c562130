"""W8A8 linear layers on tensor cores: ``QuantizedLinearPlan`` (activations quantized per token in the
same call) and ``SmoothQuantLinearPlan`` (pre-quantized activations with a static per-tensor scale).

``y[m, n] = scale_x[m] * weight_scale[n] * sum_k xq[m, k] * wq[n, k] (+ bias[n])``: int8 operands,
exact int32 accumulation (``k <= MAX_EXACT_K``), the epilogue in float32 as
``(f32(acc) * scale_x[m]) * weight_scale[n] + bias[n]``, stored in the output element. The weight
is ``[N, K]`` int8 row-major (``nn.Linear.weight``), ``weight_scale`` ``[N]`` float32, ``bias``
``[N]`` float32. Activations are quantized symmetric int8 in [-127, 127] per row
(:class:`~baracuda_numba.plans.dynamic.DynamicRangeQuantizePlan`) into the plan's workspace.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arrays import Operand, adapt, allocate_like, finish, sub_operand
from ..errors import InvalidProblem, Unsupported, problem_message
from ..kernels import hopper
from ..kernels import linear as gemm
from ..kernels.linear import (
    MAX_EXACT_K,
    SKINNY_M,
    SKINNY_MAX_M,
    SKINNY_N,
    SKINNY_THREADS,
    TILE_M,
    TILE_N,
    TILE_THREADS,
    linear_kernel,
)
from ..launch import (
    ArrayArg,
    KernelLauncher,
    LaunchPair,
    array_values,
    fill_words,
    stream_handle,
    synchronize,
    torch_current_stream,
    zero_words,
)
from ..platform import SIMULATOR
from ..vocabulary import ElementKind, QuantizeKind
from .base import (
    _TORCH_DTYPES,
    Plan,
    _torch_tensor_type,
    checked_operand,
    checked_scale,
    fast_pointers,
    trusted_pointers,
)
from .dynamic import (
    DynamicRangeMode,
    DynamicRangeQuantizeArgs,
    DynamicRangeQuantizeDescriptor,
    DynamicRangeQuantizePlan,
    DynamicRangeScope,
)
from .per_tensor import QuantizePerTensorArgs, QuantizePerTensorDescriptor, QuantizePerTensorPlan

__all__ = ["QuantizedLinearDescriptor", "QuantizedLinearArgs", "QuantizedLinearPlan",
           "SmoothQuantLinearDescriptor", "SmoothQuantLinearArgs", "SmoothQuantLinearPlan"]


@dataclass(frozen=True)
class QuantizedLinearDescriptor:
    """``x [m, k]`` float, ``weight [n, k]`` int8; the output has ``x``'s element.

    ``static_weight``: the caller promises that the weight, its scales and the bias are not written by
    the kernel launched just before the call on its stream (true of a model's weights, written once
    at load). The one-launch decode kernel then loads its first weight before it waits for that kernel
    (a programmatic dependent launch), so its weight stream starts under that kernel's tail.

    ``static_activation``: ``x`` is quantized with one given per-tensor scale (``QuantizedLinearArgs.act_scale``,
    SmoothQuant's static W8A8: ``clamp(rint(x / act_scale), -127, 127)``, as :class:`QuantizePerTensorPlan`
    with zero point 0) instead of per token; 16- or 32-bit ``x``. At decode, where the fused prologue is
    compiled for the shape, one kernel quantizes and multiplies; elsewhere the static quantizer
    (``kernels.linear.static_quantizer_kernel``) runs first, or, where ``x`` is not whole 16-byte pieces at a
    16-byte address, the per-tensor plan and a fill of the row scales.
    """

    m: int
    n: int
    k: int
    input_element: ElementKind
    output_element: ElementKind
    has_bias: bool = False
    static_weight: bool = False
    static_activation: bool = False


@dataclass
class QuantizedLinearArgs:
    input: Any  # [m, k] float
    weight: Any  # [n, k] int8
    weight_scale: Any  # [n] float32
    output: Any  # [m, n]
    bias: Any = None  # [n] float32
    act_scale: Any = None  # the static per-tensor activation scale (static_activation only)


@dataclass(frozen=True)
class SmoothQuantLinearDescriptor:
    """``act_q [m, k]`` int8 with one static scale, ``weight [n, k]`` int8.

    The decode GEMM is launched as a programmatic dependent of the kernel before it (the activations'
    quantizer, say), and waits for it before it reads anything. ``static_weight``: as
    :class:`QuantizedLinearDescriptor`'s; the GEMM then loads its column parameters and first weight
    before that wait, and reads ``act_q`` after it.
    """

    m: int
    n: int
    k: int
    output_element: ElementKind
    has_bias: bool = False
    static_weight: bool = False


@dataclass
class SmoothQuantLinearArgs:
    input: Any  # [m, k] int8 (already smoothed and quantized)
    weight: Any  # [n, k] int8 (smoothed weight)
    weight_scale: Any  # [n] float32
    act_scale: float  # the static per-tensor activation scale
    output: Any  # [m, n]
    bias: Any = None  # [n] float32


# Decode speeds quoted in this module's comments through session 24 are % of a device-to-device copy
# captured in a CUDA graph (a memcpy node, about 2430 GB/s on the H100); from session 25 on, % of an
# eager copy (about 3008 GB/s, the bench's ceiling; benchmarks/probe_copy.py). Multiply the former by
# 0.81 to compare.
# Decode (M <= 64) with aligned operands runs the activation quantizer, then the skinny GEMM launched as
# its programmatic dependent (cuLaunchKernelEx, programmatic stream serialization; sm_90): the GEMM's
# blocks start while the quantizer runs, load their column parameters and first iteration of weight, and
# wait for the quantizer's grid (griddepcontrol.wait) before they read its rows and scales. SmoothQuant's
# decode GEMM is launched the same way after whatever kernel precedes it, and waits for it first thing
# unless the weight is static. False: both GEMMs are plain launches.
DEPENDENT_GEMM = True
# SmoothQuant's decode GEMM without the static promise (waiting first thing) asks L2 for this many main-loop
# iterations of weight before its wait where its blocks fit one wave at two per SM, as the fused kernel does (a
# prefetch holds no data). Session 26 (call 10, graph replay, % of the eager copy, M = 1 / 16, none -> 1 / 2 / 4
# iterations): 4096^2 71.8 / 64.1 -> 74.3 / 67.2, 72.9 / 70.1, 64.8 / 64.3; 8192^2 82.7 / 77.7 -> 83.8 / 79.1,
# 85.8 / 80.5, 86.2 / 81.7; but 11008 x 4096 (688 blocks, several waves) 78.2 / 71.1 -> 76.2 / 69.0, 75.0 /
# 67.6, 68.2 / 63.9.
WAIT_FIRST_EARLY_L2 = 2
# The dependent decode GEMM (quantized_linear's second launch, SmoothQuant's) keeps this many chunks in flight (in
# place of kernels.linear.VECTOR_CHUNKS) where, with 2 column tiles, its blocks make more than one wave at two per
# SM and at most one at three: 1 chunk takes 72 registers (2 chunks 96; local ptxas, every output dtype), so
# three blocks fit an SM. Session 27 (H100, graph replay, % of the eager copy, 2 chunks -> 1; blocks of 16 rows):
# - SmoothQuant, M = 1 / 16 (calls 7-10): 5120 x 4096 (320 blocks) 62.4 / 54.2 -> 70.4 / 66.4, 6144 x 4096 (384)
#   67.6-69.1 / 60.6-62.6 -> 74.5-75.8 / 70.1-71.2; more blocks: 11008 x 4096 77.7-78.1 / 70.5-71.0 -> 77.3-78.0
#   / 72.1-72.4, 14336 x 4096 80.0 / 73.4 -> 75.4 / 70.3; at 4096^2 (256, one wave at two) 72.1 / 69.7 -> 59.2
#   / 56.0;
# - quantized_linear's two launches, M = 1 / 2 / 4 / 16 (call 10): 5120 x 4096 52.1 / 52.0 / 50.7 / 47.7 -> 59.7
#   / 58.8 / 58.6 / 55.4, 6144 x 4096 59.7 / 58.1 / 57.2 / 55.2 -> 64.6 / 64.2 / 63.7 / 59.2 (the GEMM alone
#   69.0 -> 80.7 at M = 1); 11008 x 4096 70.5 / 65.1 -> 70.1 / 64.6 under launch bounds of 3 (call 7).
THREE_PER_SM_CHUNKS = 1
# Where those blocks of 2 column tiles (K < 8192) make more than one wave at two per SM, the dependent decode GEMM
# takes wider blocks instead: the fewest column tiles, up to WIDE_TILES_MAX, whose blocks fit one wave at two per SM
# (launch bounds of 2; 1 chunk from 4 tiles, by kernels.linear.skinny_chunks). Each block then reads the activations
# once for more columns: at M = 16 their L2 traffic was as large as the weight's. Where the 2-tile blocks make more
# than one wave at three per SM, from WIDE_TILES_MIN_M tokens; where they make one there (THREE_PER_SM_CHUNKS), for
# fewer tokens in quantized_linear's GEMM and for every M in SmoothQuant's waiting first (with the static promise:
# STATIC_SMOOTHQUANT_WIDE). Session 31 (call 5, tune-linear-2026-11-26-s31-call5-tiles-*.log,
# H100, graph replay, weights rotating past L2, % of the eager copy, M = 1 / 8 / 16, shipped -> wide):
# - 11008 x 4096, 6 tiles (230 blocks; 688 of 2 tiles): the GEMM alone 78.6 / 74.8 / 72.5 -> 79.8 / 78.0 / 78.5, and
#   87.2 at M = 16 asking L2 for one iteration before its wait (WIDE_TILES_PREFETCH_L2); quantized_linear's two
#   launches 70.4 / 67.5 / 65.4 -> 70.7 / 68.2 / 66.7, 69.5 at M = 16 with the prefetch; SmoothQuant 77.9 / 74.3 /
#   71.1 -> 74.9 / 73.7 / 74.2;
# - 14336 x 4096, 7 tiles (256 blocks; 24 bytes spilled): the two launches 72.3 / 70.4 / 68.1 -> 68.4 / 69.5 / 71.1
#   (M = 16 with the prefetch); SmoothQuant 80.1 / 76.5 / 72.9 -> 69.5 / 69.0 / 78.5;
# - 6144 x 4096, 3 tiles (256 blocks, 2 chunks; 384 of 1 chunk at three per SM): the two launches 64.6 / 60.6 / 57.0
#   -> 66.6 / 63.1 / 53.9; SmoothQuant 74.7 / 73.0 / 70.6 -> 78.8 / 76.1 / 73.7;
# - 5120 x 4096, 3 tiles: the two launches 58.7 / 58.0 / 55.6 -> 62.6 / 60.7 / 57.3; SmoothQuant 70.1 / 67.9 / 65.4
#   -> 70.9 / 69.9 / 68.0.
# (One token at these shapes takes the fused kernel.) False: 2 tiles everywhere below K = 8192.
WIDE_TILES = True
WIDE_TILES_MAX = 7
WIDE_TILES_MIN_M = 16
WIDE_TILES_PREFETCH_L2 = 1  # quantized_linear's GEMM in wide blocks from WIDE_TILES_MIN_M tokens
# quantized_linear's GEMM past three 2-tile blocks per SM takes the wide blocks from FEW_TOKENS_WIDE_MIN_M tokens (at
# most WIDE_TILES_MAX_FEW_TOKENS tiles below WIDE_TILES_MIN_M), asking L2 for WIDE_TILES_PREFETCH_L2 iterations before
# its wait, and one token there takes these two launches rather than the fused kernel (_wide_fused). With the weight
# loads' 256-byte L2 fills (WEIGHT_L2_PREFETCH_BYTES) the wide blocks won below 16 tokens too. Session 40 (call 6,
# probe-decode-knobs-2026-11-27-s40-call6-11008-wide.log, H100, graph replay, weights rotating past L2, % of the
# eager copy, 11008 x 4096, quantized_linear / static weight, 688 blocks of 2 tiles -> 230 of 6): M = 8 70.8 / 70.3
# -> 77.5 / 77.4; M = 2 72.6 / 72.4 -> 79.1 / 79.2; M = 1 fused 76.2 / 76.5 -> two launches 79.7 / 79.7. Session 32
# had 12 tokens slower with the old loads (65.9 -> 64.7). WIDE_TILES_MIN_M: the old rule.
FEW_TOKENS_WIDE_MIN_M = 1
# SmoothQuant's GEMM waiting first (no static promise) takes the same wide blocks past three 2-tile blocks per SM from
# SMOOTHQUANT_FEW_TOKENS_WIDE_MIN_M tokens (at most WIDE_TILES_MAX_FEW_TOKENS tiles below WIDE_TILES_MIN_M); its
# blocks then fit one wave, so it also asks L2 for WAIT_FIRST_EARLY_L2 iterations before its wait. Session 41 (call 1,
# probe-decode-knobs-2026-11-27-s41-call1-sq-wide.log, H100, graph replay, weights rotating past L2, % of the eager
# copy, 11008 x 4096, 688 blocks of 2 tiles -> 230 of 6): M = 2 78.3 -> 80.8; M = 8 76.6 -> 81.4.
# WIDE_TILES_MIN_M: the rule before.
SMOOTHQUANT_FEW_TOKENS_WIDE_MIN_M = 1
# SmoothQuant's GEMM under the static promise (its weight loaded before its wait, as quantized_linear's GEMM) takes
# the wide blocks at every M; below WIDE_TILES_MIN_M tokens at most WIDE_TILES_MAX_FEW_TOKENS tiles; past three
# 2-tile blocks per SM, from WIDE_TILES_MIN_M tokens, it asks L2 for WIDE_TILES_PREFETCH_L2 iterations before its wait.
# Session 32 (call 2, tune-linear-2026-11-26-s32-call2-static-sq-wide.log, H100, graph
# replay, weights rotating past L2, % of the eager copy, M = 1 / 8 / 16, 2 tiles -> wide, with the prefetch at 16):
# 11008 x 4096 (6 tiles) 80.1 / 76.5 / 73.0 -> 82.3 / 80.1 / 87.8 (79.2 at 16 without the prefetch); 14336 x 4096
# (7) 81.6 / 77.5 / 74.0 -> 77.6 / 76.8 / 87.2; 6144 x 4096 (3) 82.7 / 79.3 / 73.8 -> 86.2 / 85.3 / 81.3.
STATIC_SMOOTHQUANT_WIDE = True
# At most this many tiles below WIDE_TILES_MIN_M tokens (those rules). Session 41 (call 2,
# probe-decode-knobs-2026-11-27-s41-call2-14336-seven.log, same measure) lifted it from 6 to 7 (24 bytes spilled):
# 14336 x 4096 (896 blocks of 2 tiles -> 256 of 7), quantized_linear / SmoothQuant waiting first, M = 2 74.8 / 80.7
# -> 79.6 / 81.7, M = 8 73.4 / 78.6 -> 78.9 / 81.8. Call 3 (-call3-14336-seven.log; 6 -> 7): one token there takes
# the two launches, not the fused kernel (_wide_fused), quantized_linear 75.3 -> 80.7, with the static promise 74.7 ->
# 79.9; SmoothQuant under the static promise, M = 1 / 2 / 8, 83.1 / 82.3 / 79.5 -> 83.3 / 83.3 / 83.2. Session 32
# had found 7 tiles slower there with the old loads (81.6 / 77.5 -> 77.6 / 76.8 at M = 1 / 8).
WIDE_TILES_MAX_FEW_TOKENS = 7
# SmoothQuant's GEMM under the static promise asks L2 for weight before its wait as quantized_linear's does where
# K >= 8192 and its blocks fit one wave (kernels.linear.dependent_prefetch's one_wave rule: 1 iteration, 2 from 4
# tokens past 4096 rows). Session 32 (call 6, tune-linear-2026-11-26-s32-call6-static-sq-prefetch.log, % of the
# eager copy, none -> the prefetch): 8192^2 M = 1 / 4 / 8 / 16 87.1 / 86.1 / 85.1 / 83.2 -> 93.3 / 93.3 / 92.2 /
# 91.2 (SmoothQuant waiting first 90.9 / 90.2 / 89.1 / 87.9); 8192 x 28672 M = 1 / 16 91.8 / 86.3 -> 93.0 / 88.6.
STATIC_SMOOTHQUANT_ONE_WAVE_PREFETCH = True
# Up to FUSED_MAX_M tokens, with K of at least FUSED_MIN_K and FUSED_MIN_N .. FUSED_MAX_N weight rows, and
# up to FUSED_ANY_SHAPE_MAX_M tokens against any weight up to FUSED_MAX_N rows and FUSED_ANY_SHAPE_MAX_WEIGHT
# bytes (the quantized rows within
# FUSED_MAX_SHARED bytes of shared memory), every block of the skinny GEMM quantizes the rows itself (one
# launch, `fused`): a prologue per block, which pays where each block streams a long K and the blocks
# fill the SMs. One token keeps the fused kernel where the two launches are at most 4 % faster on the GPU:
# one launch is 6-8 us less host time per call (9.2 against 15.2-17.3 us per plan.run, session 15), the
# whole step of an eager decode. H100, CUDA-graph replay, weights rotating past L2, % of copy on the
# weight's bytes (session 15, notes/gemm.md, tune-linear-2026-11-25-s15-call3.log), fused / two launches
# (dependent GEMM) / cooperative, N x K:
#   M = 1: 4096^2 63.8 / 65.6 / 47.1, 8192^2 93.3 / 83.5 / 83.3, 11008 x 4096 80.2 / 83.5 / 70.8,
#          4096 x 11008 72.7 / 73.1 / 58.6;
#   M = 2: 4096^2 57.8 / 65.1 / 47.5, 8192^2 86.3 / 83.2 / 83.1, 11008 x 4096 72.6 / 83.8 / 70.3,
#          4096 x 11008 66.1 / 74.0 / 58.8;
#   M = 4: 4096^2 46.6 / 65.2 / 47.1, 8192^2 73.5 / 83.8 / 83.1, 11008 x 4096 54.6 / 82.9 / 69.5;
#   M = 16: 4096^2 20.3 / 61.2 / 46.3, 8192^2 27.1 / 81.7 / 80.4, 11008 x 4096 21.4 / 78.0 / 66.7.
# Past 32 MiB of weight one token takes the two launches too: the weight's stream (over 13 us) outlasts
# their host time, so an eager decode waits on the GPU, where they are faster (session 16, call 8,
# fused / two launches: 11008 x 4096 79.9 / 84.1, 4096 x 11008 71.2 / 76.0; 4096^2 64.0 / 65.8).
FUSED_MAX_M = 2
# Of those, the rule of long rows (K >= FUSED_MIN_K, FUSED_MIN_N .. FUSED_MAX_N rows) fuses up to
# LONG_ROWS_FUSED_MAX_M tokens. Two tokens there take the two launches since session 39: the dependent chain
# (quantizer and GEMM as programmatic dependents, the fixed quantizer, the one-wave prefetch) has overtaken the
# fused kernel there.
# Graph replay, weights rotating past L2, % of the eager copy (3008-3010 GB/s), M = 2, fused -> two launches,
# `quantized_linear` / under the static promise (probe-decode-knobs-2026-11-27-s39-call{1,2}-*.log): 8192^2
# 78.3 / 78.4 -> 82.3 / 81.7, 8192 x 11008 76.9 / 76.9 -> 82.4 / 82.1, 11008 x 8192 65.9 / 65.9 -> 71.9 / 72.0.
# Those weights (64 MiB and more) stream for over 20 us a call, longer than either path's host time, so an eager
# decode waits on the GPU too. (The same run at K = 4096, where ONE_WAVE_FUSED_MAX_M and WIDE_ONE_WAVE_FUSED_MAX_M
# keep two tokens fused: 4096^2 63.0 / 67.7 -> 63.7 / 63.6, 6144 x 4096 69.1 / 69.0 -> 68.7 / 68.3.)
LONG_ROWS_FUSED_MAX_M = 1
# With K of at least FUSED_DEPENDENT_MIN_K the fused kernel launches as a programmatic dependent of the
# kernel before it (it waits for that kernel first thing, then lets its own dependents start): its launch
# overlaps that kernel's run. Session 17 (back to back, plain -> dependent, % of copy): M = 1 / 2 at
# 8192^2 94.9 / 86.2 -> 97.1 / 87.6, 11008 x 4096 (K = 4096) 80.2 -> 82.4, but 4096^2 63.9 / 58.3 -> 62.8
# / 56.6. Session 26: with L2 asked for its first iterations before its wait (kernels.linear.FUSED_EARLY_L2) and
# in the one-wave shape (ONE_WAVE_SHAPE), K = 4096 gains too (4096^2 M = 1 / 2, % of the eager copy: plain
# 56.7 / 53.3 -> dependent 62.7 / 59.0; the two launches 56.9 / 56.4), so it is a dependent at every K.
FUSED_DEPENDENT_MIN_K = 0
FUSED_ANY_SHAPE_MAX_M = 1
FUSED_ANY_SHAPE_MAX_WEIGHT = 32 << 20
# One token with K < FUSED_MIN_K (2 column tiles), up to WIDE_FUSED_MAX_N rows, takes the fused kernel (a
# programmatic dependent) past FUSED_ANY_SHAPE_MAX_WEIGHT too, and keeps it under capture: it is the faster
# on the GPU, unless its blocks make more than one wave and at most WIDE_FUSED_SKIP_WAVES at its launch bounds
# (3 per SM), where the few blocks of the last wave each pay the prologue. Session 27 (H100, graph replay of
# back-to-back calls, weights rotating past L2, % of the eager copy, fused / two launches, waves):
# 6144 x 4096 74.3 / 59.2 (0.97), 8192 x 4096 63.7 / 67.3 (1.29), 11008 x 4096 74.3-74.5 / 70.5-70.9 (1.74),
# 14336 x 4096 74.9 / 72.5 (2.26); at K = 11008 (4 tiles) 4096 x 11008 60.6 / 63.2. Two tokens at 11008 x 4096:
# 68.9 / 69.2 (session 26). Up to WIDE_ONE_WAVE_FUSED_MAX_M tokens fuse where those blocks make at most one
# wave, and more than one at two per SM (fewer: ONE_WAVE_SHAPE's rule): M = 2 / 4 (call 10; the two launches
# with THREE_PER_SM_CHUNKS) 5120 x 4096 62.2 / 45.5 against 58.8 / 58.6, 6144 x 4096 68.7 / 49.7 against
# 64.2 / 63.7.
WIDE_FUSED_MAX_M = 1
WIDE_ONE_WAVE_FUSED_MAX_M = 2
WIDE_FUSED_MAX_N = 14336
WIDE_FUSED_SKIP_WAVES = 1.5
# A call captured into a CUDA graph costs no host time at replay, so there the shapes that fuse only for
# host time (FUSED_ANY_SHAPE_MAX_M: weights under FUSED_MIN_K x FUSED_MIN_N) launch the two kernels, the
# faster on the GPU: M = 1 at 4096^2, fused 63.8 against 71.0% of copy (session 21, call 1). False: the
# fused kernel under capture too.
CAPTURE_UNFUSED = True
# The decode kernels' weight loads skip L1 (ld.global.L1::no_allocate, kernels.linear.WEIGHT_LOAD_HINT "na")
# against weights at least WEIGHT_NO_L1_MIN_K long or for at least WEIGHT_NO_L1_MIN_M tokens. Every weight line
# is read once, and a plain load keeps it in L1, where the activation rows that every warp re-reads live too.
# Session 28 (H100, call 2, tune-linear-2026-11-26-s28-call2-weight-hint.log, graph replay, % of the eager copy,
# plain -> no_allocate): 8192^2 M = 1 / 16 SmoothQuant 85.6 / 78.6 -> 90.6 / 87.9, fused (M = 1) 85.8 -> 89.9,
# two launches 76.5 / 70.2 -> 77.1 / 71.4; 4096^2 M = 16 two launches 49.2 -> 51.4, static weight 49.4 -> 53.2;
# 11008 x 4096 M = 16 +0.4 .. +1.0. One token at K = 4096 moved -1.6 .. +0.6 (4096^2 SmoothQuant 72.4 -> 70.8):
# plain loads there. The read-only path with no L1 allocation (nc_na) was no faster and the static fused
# kernel lost 5 points with it.
WEIGHT_NO_L1_MIN_K = 8192
WEIGHT_NO_L1_MIN_M = 16
# ... and against weights of at least WEIGHT_NO_L1_MIN_BYTES (with the 256-byte fills below; session 40, call 3,
# probe-decode-knobs-2026-11-27-s40-call3-c.log, M = 1, quantized_linear / static promise, plain -> na_l2_256:
# 8192 x 4096 68.5 / 68.9 -> 70.6 / 70.4, 11008 x 4096 74.2 / 74.1 -> 76.3 / 76.1, 14336 x 4096 73.8 / 73.7 ->
# 75.3 / 75.0; 4096^2 stays plain, 0.6 points slower with it in call 2).
WEIGHT_NO_L1_MIN_BYTES = 32 << 20
# Where they skip L1, a miss also asks L2 for the line's 256-byte neighbourhood (ld.global.L1::no_allocate.L2::256B,
# "na_l2_256"): each warp's load takes 64 bytes of 8 rows and the block's other warps take the rest of those rows'
# 512-byte spans within the iteration, so the whole fill is read. Session 40 (H100, call 2,
# probe-decode-knobs-2026-11-27-s40-call2-*.log, graph replay, % of the eager copy, quantized_linear, na -> na_l2_256):
# 8192^2 M = 1 / 8 / 16 89.9 / 82.1 / 77.0 -> 93.3 / 82.5 / 81.4; 11008 x 4096 M = 16 73.4 -> 76.3; 4096^2 M = 16
# 56.3 -> 56.7; call 3 (-call3-{a,b}.log): 8192^2 M = 16 quantized_linear / static promise 76.1 / 76.2 -> 83.4 /
# 80.2 (128 bytes: 81.2 / 81.6), SmoothQuant / static 87.6 / 90.9 -> 91.7 / 94.6, M = 1 91.0 / 93.8 -> 96.0 / 97.8;
# 11008 x 4096 M = 16 73.4 / 73.4 -> 76.1 / 76.5. Without the L1 part (L2::256B alone) 8192^2 M = 16 fell (GEMM
# alone 89.6 -> 82.5, call 1); at 4096^2 with fewer than 16 tokens (plain loads) na_l2_256 was 0.6-1.2 points
# slower. 0: "na" alone.
WEIGHT_L2_PREFETCH_BYTES = 256
# With a static weight (QuantizedLinearDescriptor.static_weight) the fused kernel is a programmatic dependent at every
# K. Where its blocks fit one wave at two per SM (2 column tiles), it loads its first iteration of weight (and its
# column scales and bias) before its wait, not only L2 prefetches (kernels.linear.FUSED_EARLY_L2; elsewhere see
# STATIC_EARLY_REGISTERS_EVERYWHERE), and keeps STATIC_ONE_WAVE_CHUNKS chunks in flight under launch bounds of
# STATIC_ONE_WAVE_MIN_BLOCKS; it then fuses up to STATIC_FUSED_MAX_M tokens, under capture too (elsewhere it fuses as
# the fused kernel without the promise does: at 6144 x 4096, M = 4, session 27, call 11, it gave 52.2% against 63.4
# for the two launches; at 8192 x 4096, M = 1, 64.6 against 67.3, call 4). Session 22 (H100, back-to-back calls in
# graph replay, % of copy, M = 1 / 2): 4096^2 fused 63.6 / 57.0, static 80.0 / 73.7, two launches 70.9 / 67.1 (1 chunk
# under 3 blocks, static: 66.5 / 59.9); 8192^2 fused (2 iterations asked of L2) 100.0 / 88.6, static 101.5 / 92.0;
# 11008 x 4096 static 85.4, two launches 85.3 (M = 1, more than one wave: 1 chunk, 3 blocks).
STATIC_ONE_WAVE_CHUNKS = 2
STATIC_ONE_WAVE_MIN_BLOCKS = 2
# Whether the static fused kernel loads its first iteration into registers before its wait outside the one-wave shape
# too (False: there it asks L2 for kernels.linear.FUSED_EARLY_L2 iterations before its wait, as without the promise;
# it stays a dependent at every K). Session 22 had the two alike at 8192^2 (M = 1 / 2 101.5 / 92.0 against 100.0 /
# 88.6 under the old ceiling); the L2 form has since become the faster there (which later change did it was not
# traced). Session 38 (H100, graph replay, weights rotating past L2, % of the eager
# copy, quantized_linear under the static promise, registers -> L2; probe-decode-knobs-2026-11-27-s38-call3-*.log):
# 8192^2 M = 1 / 2 84.7 / 76.9 -> 90.2 / 78.2 (call 2: 84.8 against 90.2 without the promise); 11008 x 4096 M = 1 / 2
# 74.5 / 69.8 -> 74.1 / 69.8.
STATIC_EARLY_REGISTERS_EVERYWHERE = False
# The fused kernel without the static promise takes that one-wave shape too (False: only with it). It reads
# nothing before its wait; only the chunks in flight and the launch bounds change. Session 26 (H100, graph
# replay, % of the eager copy, 4096^2 M = 1 / 2, launched as a dependent): 59.0 / 54.3 (1 chunk, bounds of 3)
# -> 62.7 / 59.0; the two launches 56.9 / 56.4. There it fuses up to ONE_WAVE_FUSED_MAX_M tokens, and
# keeps the fused kernel under capture: it is the faster on the GPU too.
ONE_WAVE_SHAPE = True
ONE_WAVE_FUSED_MAX_M = 2
# ... where, without the static promise, it asks L2 for this many iterations of weight after its wait (in place
# of STATIC_ONE_WAVE_PREFETCH_L2; kernels.linear.FUSED_EARLY_L2 before it). Session 26 (same measure, 4096^2
# M = 1 / 2, iterations before / after the wait; calls 4 and 5): 2 / 1 62.6-62.7 / 59.2-59.3, 2 / 0
# 66.5-66.6 / 63.0-63.1, 1 / 1 65.7-65.8 / 62.2-62.3, 1 / 0 65.2 / 62.1, 3 / 0 65.5 / 61.8, 4 / 1 61.1 /
# 56.4, 0 / 0 60.6 / 57.7.
ONE_WAVE_PREFETCH_L2 = 0
# Session 24: with the prologue compiled for the plan's shape (kernels.linear.FIXED_PROLOGUE) the static
# fused kernel at 4096^2 M = 4 gives 72.7-72.8% against 67.7-68.1 for the two launches (M = 8 does not fit
# the fixed prologue: 16 pieces a thread), so it takes up to 4 tokens (2 before).
STATIC_FUSED_MAX_M = 4
# ... and asks L2 for this many more iterations of weight after its wait, before its prologue (HBM would idle
# while the prologue runs). Session 23 (same measure, M = 1 / 2 / 4 fused): 4096^2 none 83.9 / 76.4 / 63.1,
# one 84.6 / 77.6 / 63.6, two 81.1 / 74.8, three 73.9 / 68.4; 8192^2 (4 tiles, not one wave) one is 2-3
# points slower, so only the one-wave kernel asks. M = 4 stays on the two launches (67.1-67.9).
STATIC_ONE_WAVE_PREFETCH_L2 = 1
# Past this many bytes of weight the fast path launches the decode quantizer as a programmatic dependent
# at every M (plans.dynamic.DEPENDENT_SEGMENTS_MAX takes up to 16 rows everywhere). Session 17, call 9, M =
# 16, plain -> dependent quantizer, % of copy: 11008 x 4096 78.3 -> 80.0 (80.2 in call 7), 4096 x 11008
# 74.0 -> 74.8, 8192^2 81.8 -> 82.0, but 4096^2 (16 MiB) 61.5 -> 56.6 (session 33: no longer, up to 16 rows).
QUANTIZER_DEPENDENT_MIN_WEIGHT = (16 << 20) + 1
# quantized_linear with a static activation scale, where the fused kernel does not run, quantizes x with the static
# quantizer (kernels.linear.static_quantizer_kernel: no reduction, one 16-byte piece per thread per step) in blocks
# of STATIC_QUANTIZER_THREADS, at most STATIC_QUANTIZER_BLOCKS_PER_SM per SM, launched as a programmatic dependent
# of the kernel before (STATIC_QUANTIZER_DEPENDENT), and the GEMM as its dependent. Before session 33 it took the
# per-tensor plan, a fill of the row scales and the GEMM (three plain launches, the checked path every call).
# False: the three launches (for measuring against them).
STATIC_QUANTIZER = True
STATIC_QUANTIZER_THREADS = 128
STATIC_QUANTIZER_BLOCKS_PER_SM = 8
STATIC_QUANTIZER_DEPENDENT = True
FUSED_MIN_K = 8192
FUSED_MIN_N = 8192  # 4096 rows at K = 11008: 128 blocks of 4 column tiles, fewer than the SMs
FUSED_MAX_N = 11008  # wider weights (more waves of blocks, each paying the prologue) are unmeasured
FUSED_MAX_SHARED = 160 * 1024
# The cooperative one-launch kernel (M blocks quantize a row each into the workspace for all the others,
# kernels/linear.py `_skinny`) trails the dependent two launches at every shape above (0.5-19 points), so
# no decode shape selects it (0 tokens); it stays selectable here (up to SKINNY_M tokens) and tested.
COOPERATIVE_MAX_M = 0
# Prefill (M > SKINNY_MAX_M) with aligned operands on an sm_90 device runs the warpgroup GEMM
# (kernels/hopper.py: wgmma from shared memory, sm_90a PTX loaded outside numba's dispatcher) instead of
# the mma.sync pipeline. False: the pipelined kernel everywhere.
HOPPER_GEMM = True
# Past HOPPER_MIN_M tokens the batches the skinny decode kernel would take (up to SKINNY_MAX_M) take the warpgroup
# GEMM too, in the small tiles of kernels.hopper.WGMMA_SMALL: the skinny kernel streams the weight once per 16 rows.
# Session 35 (tune-wgmma-2026-11-26-s35-call2-mid.log, H100, GPU TOPS, one weight, bf16 out; skinny -> 64 x 32
# warpgroup tiles): M = 32 / 64 at 4096^2 87 / 105 -> 112 / 222, M = 64 at 11008 x 4096 106 -> 209-267, at
# 4096 x 11008 132 -> 267. With the weights rotating past L2 (probe-decode-knobs-2026-11-26-s35-call3-batches.log,
# graph replay, % of the eager copy on the weight's bytes, M = 17 / 32 at 4096^2, skinny -> warpgroup): the GEMM
# alone 49.2 / 43.2 -> 55.3 / 55.4, quantized_linear 42.9 / 40.9 -> 45.2 / 45.4, SmoothQuant 49.4 / 44.4 -> 55.4 /
# 55.9, the outputs bit-equal. (Up to 16 tokens the skinny kernel is the decode path: one row tile, the quantizer's
# programmatic dependent.)
HOPPER_MIN_M = 16
# quantized_linear's warpgroup GEMM up to this many tokens is a programmatic dependent of the quantizer, copying its
# first steps of weight while the quantizer runs (kernels.hopper.wgmma_kernel's `dependent`). 0: plain launches.
# Session 36 (probe-decode-knobs-2026-11-26-s36-call8-wgmma-dependent.log, H100, graph replay, weights rotating past
# L2, % of the eager copy on the weight's bytes, plain -> dependent, bit-equal), M = 17 / 32 / 64 / 128: 4096^2
# 45.6 / 44.9 / 44.3 / 40.2 -> 46.4 / 46.0 / 45.2 / 41.6; 11008 x 4096 58.3 / 57.2 / 55.2 / 51.8 -> 63.7 / 62.9 /
# 60.6 / 56.4. Session 37 (probe-decode-knobs-2026-11-26-s37-call1-batches.log, same measure, 128 -> 512): M = 256
# 4096^2 30.1 -> 31.7, 11008 x 4096 37.8 -> 38.9, 4096 x 11008 30.9 -> 29.2; M = 512 23.3 -> 23.5, 24.3 -> 24.3,
# 25.0 -> 21.6 (the same run's repeat of unchanged settings moved up to 4 points), so 128 stays.
WGMMA_DEPENDENT_MAX_M = 128
# SmoothQuant's warpgroup GEMM up to this many tokens is a programmatic dependent of whatever kernel comes before it:
# under the static-weight promise it copies its first steps of weight before its wait, as quantized_linear's does;
# without it it waits first thing (kernels.hopper.wgmma_kernel's `wait_first`), so only its launch overlaps.
# Session 37 (call 1, the same log; plain -> dependent, static promise / waiting first, outputs bit-equal):
# - 4096^2, M = 17 / 32 / 64 / 128 / 256: 55.0 / 55.4 / 54.0 / 51.6 / 40.5 -> 61.0 / 61.3 / 60.5 / 56.8 / 44.2 and
#   55.1 / 55.6 / 54.3 / 51.7 / 40.4 -> 59.5 / 59.7 / 59.5 / 55.3 / 42.7;
# - 11008 x 4096: 65.8 / 65.9 / 64.6 / 61.8 / 46.3 -> 69.7 / 69.2 / 68.2 / 64.7 / 48.1 and 66.0 / 65.9 / 64.6 / 61.8
#   / 46.4 -> 68.8 / 68.5 / 67.3 / 64.0 / 47.4;
# - 4096 x 11008: 72.0 / 71.3 / 69.9 / 63.6 / 48.8 -> 74.0 / 73.5 / 72.2 / 66.0 / 50.6 and 71.9 / 71.7 / 70.4 / 63.5 /
#   48.7 -> 74.4 / 74.0 / 72.7 / 65.0 / 49.9;
# - M = 512: 32.0 -> 33.9 and 31.9 -> 32.7; 28.6 -> 29.2 and 28.6 -> 28.9; 38.3 -> 38.2 and 37.3 -> 35.4. So 256.
SMOOTHQUANT_WGMMA_DEPENDENT_MAX_M = 256
# A selected plan compiles its aligned kernel at once on a GPU, so that the first (timed, captured) call does not.
# Tests of the selection alone turn it off: they name kernels, and each compile takes seconds.
COMPILE_AT_SELECT = True
_STREAM_WORKSPACES = 16  # per plan: the streams whose workspace a QuantizedLinearPlan keeps

def _pointer_slots(arrays: int) -> slice:
    """The parameter slots a fast launch rewrites: the data pointer of each of ``arrays`` array structs."""
    return slice(4, 7 * arrays, 7)


def _tensor_scale_slot(arrays: int) -> range:
    """... and the float32 tensor_scale (after M, N, K, tiles_m, aligned)."""
    return range(7 * arrays + 5, 7 * arrays + 6)


def _align(n: int) -> int:
    return -(-n // 256) * 256


class _LinearPlan(Plan):
    KIND = QuantizeKind.QUANTIZED_LINEAR

    @classmethod
    def _validate(cls, desc: Any) -> None:
        name = cls.__name__
        for field in ("m", "n", "k"):
            if getattr(desc, field) < 0:
                raise InvalidProblem(problem_message(name, field, ">= 0", getattr(desc, field)))
        if desc.k > MAX_EXACT_K:
            raise InvalidProblem(problem_message(
                name, "k", f"<= {MAX_EXACT_K} (|int8 x int8| sums stay exact in int32)", desc.k))
        if not isinstance(desc.has_bias, bool):
            raise InvalidProblem(problem_message(name, "has_bias", "a bool", repr(desc.has_bias)))
        if not isinstance(getattr(desc, "static_weight", False), bool):
            raise InvalidProblem(problem_message(name, "static_weight", "a bool", repr(desc.static_weight)))
        if not isinstance(getattr(desc, "static_activation", False), bool):
            raise InvalidProblem(problem_message(name, "static_activation", "a bool", repr(desc.static_activation)))
        if getattr(desc, "static_activation", False) and desc.input_element is ElementKind.F64:
            raise Unsupported(problem_message(name, "input_element", "f16, bf16 or f32 with a static activation "
                                              "scale (float64 quantizes in float64 math)", "f64"))

    def _prepare(self) -> None:
        desc = self.desc
        out, per_tensor_rows = self.entry.output_element, self.entry.input_element is ElementKind.S8
        # the kernel variants this plan may launch: (launcher, row tiles, blocks, threads)
        self._variants: dict[str, tuple[KernelLauncher, int, int, int]] = {}
        compiles: dict[str, Any] = {}

        def variant(name: str, kernel: Any, rows: int, cols: int, threads: int, shared_bytes: int = 0,
                    arrays: int = 8, dependent: bool = False) -> None:
            tiles_m = -(-desc.m // rows)
            launcher = KernelLauncher(kernel.compiled, arrays, _SCALARS, shared_bytes, dependent)
            self._variants[name] = (launcher, tiles_m, tiles_m * -(-desc.n // cols), threads)
            compiles[name] = kernel.compiled

        self._fused = self._cooperative = False
        if desc.m <= SKINNY_MAX_M and not self._warpgroup_batch():
            # decode-like shapes stream the weight once through the skinny kernel (any alignment)
            tiles = gemm.skinny_tiles(desc.k)
            kernel = linear_kernel(out, desc.has_bias, per_tensor_rows, True, None, gemm.SKINNY_CHUNKS, tiles)
            variant("skinny", kernel, SKINNY_M, SKINNY_N * tiles, SKINNY_THREADS)
            dependent = self._dependent_gemm()
            wide = self._wide_tiles(tiles) if dependent else tiles  # the dependent GEMM's column tiles
            blocks = -(-desc.m // SKINNY_M) * -(-desc.n // (SKINNY_N * wide))
            chunks = gemm.skinny_chunks(False, dependent, wide, blocks, _multiprocessors())
            if (dependent and wide == 2 and gemm.DEPENDENT_CHUNKS is None
                    and 2 * _multiprocessors() < blocks <= 3 * _multiprocessors()):
                chunks = THREE_PER_SM_CHUNKS
            staged = gemm.dependent_staged(desc.m, desc.n, desc.k, chunks, wide) if dependent else 0
            # the one-wave prefetch at K >= 8192: quantized_linear's GEMM, and SmoothQuant's under the static promise
            # (STATIC_SMOOTHQUANT_ONE_WAVE_PREFETCH); SmoothQuant's waiting first asks L2 by WAIT_FIRST_EARLY_L2
            static_smoothquant = per_tensor_rows and dependent and not self._dependent_waits_first()
            one_wave = ((not per_tensor_rows or (STATIC_SMOOTHQUANT_ONE_WAVE_PREFETCH and static_smoothquant))
                        and blocks <= 2 * _multiprocessors())
            prefetch = gemm.dependent_prefetch(desc.m, desc.n, desc.k, one_wave) if dependent else 0
            # (past three blocks per SM: quantized_linear's GEMM is wide from FEW_TOKENS_WIDE_MIN_M tokens,
            # SmoothQuant's static one asks L2 from WIDE_TILES_MIN_M)
            wide_min_m = WIDE_TILES_MIN_M if per_tensor_rows else min(WIDE_TILES_MIN_M, FEW_TOKENS_WIDE_MIN_M)
            if (wide != tiles and (not per_tensor_rows or static_smoothquant)
                    and desc.m >= wide_min_m and -(-desc.n // (SKINNY_N * tiles)) > 3 * _multiprocessors()
                    and gemm.DEPENDENT_PREFETCH_L2 is None):
                prefetch = WIDE_TILES_PREFETCH_L2
            kernel = linear_kernel(out, desc.has_bias, per_tensor_rows, True, None, chunks, wide,
                                   double_buffer=True, vector_only=True, fused_prefetch=prefetch,
                                   fused_min_blocks=(2 if wide != tiles else gemm.dependent_min_blocks(tiles))
                                   if dependent else 0,
                                   dependent=gemm.DEPENDENT_PRELOAD if dependent else 0, staged=staged,
                                   max_registers=gemm.DEPENDENT_MAX_REGISTERS if dependent else 0,
                                   wait_first=dependent and self._dependent_waits_first(),
                                   early_l2=WAIT_FIRST_EARLY_L2 if dependent and self._dependent_waits_first()
                                   and blocks <= 2 * _multiprocessors() else 0,
                                   weight_hint=self._weight_hint())
            variant("skinny_vector", kernel, SKINNY_M, SKINNY_N * wide, SKINNY_THREADS,
                    staged * gemm.staged_iteration_bytes(chunks, wide), dependent=dependent)
            self._aligned_variant, self._other_variant = "skinny_vector", "skinny"
            chunks = gemm.skinny_chunks(one_launch=True)
            fused_shape = self._fused_shape(tiles)
            if self._fuses_quantize() and (not self._static_activation() or fused_shape[4] is not None):
                static = self._static_weight()
                chunks, min_blocks, prefetch, x_loads, fixed = fused_shape
                staged = gemm.one_launch_staged(desc.m, desc.n, desc.k, chunks, tiles, False)
                fused_dependent = desc.k >= FUSED_DEPENDENT_MIN_K or static
                early = fused_dependent and not staged  # weight read before the wait (staged: after it)
                # the static weight's first iteration into registers before the wait, else asked of L2
                registers = static and (STATIC_EARLY_REGISTERS_EVERYWHERE or self._one_wave(tiles))
                kernel = linear_kernel(out, desc.has_bias, False, True, None, chunks, tiles,
                                       fused_input=self.entry.input_element, fused_prefetch=prefetch,
                                       fused_min_blocks=min_blocks, double_buffer=True, staged=staged,
                                       early_l2=gemm.FUSED_EARLY_L2 if early and not registers else 0,
                                       early_registers=early and registers, x_loads=x_loads, fixed=fixed,
                                       static_scale=self._static_activation(), weight_hint=self._weight_hint())
                variant("fused", kernel, SKINNY_M, SKINNY_N * tiles, SKINNY_THREADS,
                        gemm.fused_shared_bytes(desc.m, desc.k) + staged * gemm.staged_iteration_bytes(chunks, tiles),
                        dependent=fused_dependent)
                self._aligned_variant, self._fused = "fused", True
            elif self._cooperates():
                staged = gemm.one_launch_staged(desc.m, desc.n, desc.k, chunks, tiles, True)
                kernel = linear_kernel(out, desc.has_bias, False, True, None, chunks, tiles,
                                       fused_input=self.entry.input_element,
                                       fused_prefetch=gemm.COOPERATIVE_PREFETCH_L2, cooperative=True,
                                       fused_min_blocks=gemm.fused_min_blocks(tiles, self.entry.input_element, True),
                                       double_buffer=True, staged=staged)
                variant("cooperative", kernel, SKINNY_M, SKINNY_N * tiles, SKINNY_THREADS,
                        staged * gemm.staged_iteration_bytes(chunks, tiles), arrays=11)
                self._aligned_variant, self._cooperative = "cooperative", True
        else:
            # 16-byte aligned operands with K % 16 == 0 go through the cp.async pipeline; others
            # through the register-staged tiled kernel, which assembles unaligned chunks from bytes
            shape = gemm.pipeline_shape(desc.m, desc.n, _multiprocessors())
            variant("pipelined", linear_kernel(out, desc.has_bias, per_tensor_rows, False, shape),
                    shape.tile_m, shape.tile_n, shape.threads, shape.shared_bytes)
            variant("tiled", linear_kernel(out, desc.has_bias, per_tensor_rows), TILE_M, TILE_N, TILE_THREADS)
            self._aligned_variant = "pipelined" if desc.k % 16 == 0 else "tiled"
            if desc.k % 16 == 0 and HOPPER_GEMM and hopper.hopper_available():
                wide = hopper.wgmma_shape(desc.m, desc.n, _multiprocessors())
                dependent = self._wgmma_dependent()
                kernel = hopper.wgmma_kernel(out, desc.has_bias, per_tensor_rows, wide, dependent,
                                             self._dependent_waits_first())
                variant("wgmma", kernel, wide.tile_m, wide.tile_n, wide.threads, wide.shared_bytes,
                        dependent=dependent)
                self._aligned_variant = "wgmma"
            self._other_variant = "tiled"
            if self._warpgroup_batch():
                # Misaligned operands of a batch keep the skinny kernel's byte path: session 36
                # (tune-wgmma-2026-11-26-s36-call5-rows.log, H100, TOPS, tiled -> skinny) 32 x 4096^2 17 -> 66,
                # 64 x 4096^2 32 -> 78, 32 x 11008 x 4096 41 -> 75 (64 x 14336 x 4096 98 -> 82, the one loss).
                kernel = linear_kernel(out, desc.has_bias, per_tensor_rows, True, None, gemm.SKINNY_CHUNKS,
                                       gemm.skinny_tiles(desc.k))
                variant("skinny", kernel, SKINNY_M, SKINNY_N * gemm.skinny_tiles(desc.k), SKINNY_THREADS)
                self._other_variant = "skinny"
        self._fast_specs: tuple | None = None
        self._fast_pairs: dict[KernelLauncher, LaunchPair] = {}  # per quantizer launcher: it, then the GEMM
        if not SIMULATOR:
            if COMPILE_AT_SELECT:
                compiles[self._aligned_variant]()
            self._install_fast_template()

    def _wgmma_dependent(self) -> bool:
        """Whether the warpgroup GEMM launches as a programmatic dependent of the kernel before it: the plan's own
        quantizer, or for SmoothQuant whatever kernel comes before (waiting for it first thing unless the weight
        is static)."""
        return False

    def _warpgroup_batch(self) -> bool:
        """Whether a batch of at most ``SKINNY_MAX_M`` tokens takes the warpgroup GEMM (past ``HOPPER_MIN_M``
        tokens, ``K % 16 == 0``, on an sm_90 device) rather than the skinny kernel."""
        d = self.desc
        return d.m > HOPPER_MIN_M and d.k % 16 == 0 and HOPPER_GEMM and hopper.hopper_available()

    def _fuses_quantize(self) -> bool:
        """Whether aligned operands take the skinny kernel that quantizes ``x`` itself."""
        return False

    def _static_weight(self) -> bool:
        """Whether the descriptor promises a weight the kernel before the call does not write."""
        return False

    def _static_activation(self) -> bool:
        """Whether ``x`` is quantized with one given per-tensor scale rather than per token."""
        return False

    def _weight_hint(self) -> str:
        """The cache operators of the decode kernels' weight loads (``kernels.linear.WEIGHT_LOAD_HINT`` when
        set, else the ``WEIGHT_NO_L1_*`` rule)."""
        if gemm.WEIGHT_LOAD_HINT is not None:
            return gemm.WEIGHT_LOAD_HINT
        d = self.desc
        if d.k >= WEIGHT_NO_L1_MIN_K or d.m >= WEIGHT_NO_L1_MIN_M or d.n * d.k >= WEIGHT_NO_L1_MIN_BYTES:
            return f"na_l2_{WEIGHT_L2_PREFETCH_BYTES}" if WEIGHT_L2_PREFETCH_BYTES else "na"
        return ""

    def _wide_tiles(self, tiles: int) -> int:
        """Column tiles per block of the dependent decode GEMM: ``tiles``, or the fewest up to ``WIDE_TILES_MAX``
        whose blocks fit one wave at two per SM, by the ``WIDE_TILES`` rule (not with ``kernels.linear``'s
        ``SKINNY_TILES`` or ``DEPENDENT_CHUNKS`` set, nor for more than one row tile)."""
        d, sms = self.desc, _multiprocessors()
        if (not WIDE_TILES or tiles != 2 or d.m > SKINNY_M or gemm.SKINNY_TILES is not None
                or gemm.DEPENDENT_CHUNKS is not None):
            return tiles
        blocks = -(-d.n // (SKINNY_N * tiles))
        if blocks <= 2 * sms:
            return tiles
        smoothquant = self.entry.input_element is ElementKind.S8
        most = WIDE_TILES_MAX
        if smoothquant and not self._dependent_waits_first():  # the static promise
            wanted = STATIC_SMOOTHQUANT_WIDE
            if d.m < WIDE_TILES_MIN_M:
                most = WIDE_TILES_MAX_FEW_TOKENS
        elif blocks <= 3 * sms:  # one wave at three per SM (THREE_PER_SM_CHUNKS)
            wanted = smoothquant or d.m < WIDE_TILES_MIN_M
        else:  # quantized_linear's, and SmoothQuant's waiting first (SMOOTHQUANT_FEW_TOKENS_WIDE_MIN_M)
            wanted = d.m >= min(WIDE_TILES_MIN_M,
                                SMOOTHQUANT_FEW_TOKENS_WIDE_MIN_M if smoothquant else FEW_TOKENS_WIDE_MIN_M)
            if d.m < WIDE_TILES_MIN_M:
                most = WIDE_TILES_MAX_FEW_TOKENS
        if wanted:
            for wide in range(tiles + 1, most + 1):
                if -(-d.n // (SKINNY_N * wide)) <= 2 * sms:
                    return wide
        return tiles

    def _fused_shape(self, tiles: int) -> tuple[int, int, int, int, tuple[int, int] | None]:
        """The fused kernel's ``(chunks, launch bounds, L2 prefetch, x_loads, fixed prologue)`` at this plan's
        shape with ``tiles`` column tiles (the fixed prologue None where the general one runs)."""
        d, x_element = self.desc, self.entry.input_element
        chunks, min_blocks = gemm.skinny_chunks(one_launch=True), gemm.fused_min_blocks(tiles, x_element)
        prefetch = gemm.FUSED_PREFETCH_L2
        if (self._static_weight() or ONE_WAVE_SHAPE) and self._one_wave(tiles):
            chunks, min_blocks = STATIC_ONE_WAVE_CHUNKS, STATIC_ONE_WAVE_MIN_BLOCKS
            prefetch = STATIC_ONE_WAVE_PREFETCH_L2 if self._static_weight() else ONE_WAVE_PREFETCH_L2
        x_loads = gemm.fused_x_loads(d.m, d.k, x_element, min_blocks)
        fixed = gemm.fixed_prologue(d.m, d.k, x_element, x_loads) if gemm.FIXED_PROLOGUE else None
        return chunks, min_blocks, prefetch, x_loads, fixed

    def _one_wave(self, tiles: int) -> bool:
        """Whether the fused kernel's blocks (``tiles`` column tiles each) fit one wave at two per SM."""
        return tiles == 2 and -(-self.desc.n // (SKINNY_N * tiles)) <= 2 * _multiprocessors()

    def _dependent_gemm(self) -> bool:
        """Whether the aligned skinny GEMM is launched as a programmatic dependent of the kernel before
        it (the activation quantizer), see ``DEPENDENT_GEMM``."""
        return False

    def _dependent_waits_first(self) -> bool:
        """Whether the dependent GEMM waits for the kernel before it before it reads anything (that kernel
        may be anyone's), rather than after its weight preload."""
        return False

    def _cooperates(self) -> bool:
        """Whether aligned operands the fused kernel does not take go through the cooperative one."""
        return False

    # -- fast path: plain CUDA torch tensors, pointers patched into a pre-packed parameter block --

    def _fast_arrays(self, pointers: tuple[int, ...]) -> tuple[ArrayArg, ...]:
        """The kernel arrays of the aligned variant for operands at ``pointers`` (GEMM input, weight,
        weight_scale, bias or weight_scale, output, row scales, workspace), as :meth:`_gemm` builds them."""
        d = self.desc
        a_ptr, w_ptr, s_ptr, b_ptr, o_ptr, row_ptr, ws_ptr = pointers
        if self._fused or self._cooperative:
            itemsize = self.entry.input_element.itemsize
            a_views = (ArrayArg(a_ptr, d.m * d.k, itemsize), ArrayArg(a_ptr, d.m * d.k * itemsize // 8, 8))
        else:
            a_views = (ArrayArg(a_ptr, d.m * d.k, 1), ArrayArg(a_ptr, d.m * d.k // 8, 8))
        if self._fused:
            row = ArrayArg(0, 0, 8 if self.entry.input_element is ElementKind.F64 else 4)
        else:
            row = self._fast_row_vector(row_ptr)
        arrays = (*a_views, ArrayArg(w_ptr, d.n * d.k, 1), ArrayArg(w_ptr, d.n * d.k // 8, 8), row,
                  ArrayArg(s_ptr, d.n, 4), ArrayArg(b_ptr, d.n, 4),
                  ArrayArg(o_ptr, d.m * d.n, d.output_element.itemsize))
        return arrays + self._cooperative_arrays(ws_ptr) if self._cooperative else arrays

    def _cooperative_arrays(self, ws_ptr: int) -> tuple[ArrayArg, ...]:
        """The cooperative kernel's three workspace arrays (see :meth:`QuantizedLinearPlan._cooperative_arrays`)."""
        return ()

    def _fast_row_vector(self, ptr: int) -> ArrayArg:
        """The row-scale array of the unfused GEMM (SmoothQuant: the weight scales, unread)."""
        return ArrayArg(ptr, self.desc.n, 4)

    def _install_fast_template(self) -> None:
        """Pack the aligned variant's parameter block once; the fast path patches the 8 pointers and
        the tensor scale."""
        d = self.desc
        launcher, tiles_m, _, _ = self._variants[self._aligned_variant]
        if d.m == 0 or d.n == 0 or d.k == 0 or d.k % 16:
            return
        values: list = []
        arrays = self._fast_arrays((0,) * 7)
        for ptr, nitems, itemsize, _ in arrays:
            values += (0, 0, nitems, itemsize, ptr, nitems, itemsize)
        values += (d.m, d.n, d.k, tiles_m, True, 0.0)
        launcher.set_template(values, (_pointer_slots(len(arrays)),), _tensor_scale_slot(len(arrays)), np.float32)
        self._direct, self._direct_built = None, False  # rebuilt on the next fast call, over this template's launchers
        specs = [("input", self._fast_input_element(), d.m * d.k, 16), ("weight", ElementKind.S8, d.n * d.k, 16),
                 ("weight_scale", ElementKind.F32, d.n, 4)]
        if d.has_bias:
            specs.append(("bias", ElementKind.F32, d.n, 4))
        specs.append(("output", d.output_element, d.m * d.n, d.output_element.itemsize))
        self._fast_specs = tuple(specs)

    def _fast_input_element(self) -> ElementKind:
        return ElementKind.S8

    def _fast_pointers(self, args: Any) -> tuple[list[int], int] | None:
        """Pointers and device of ``args`` for the aligned variant (see :func:`.base.fast_pointers`)."""
        return fast_pointers(self._fast_specs, args)

    def _launch_fast(self, pointers: list[int], device: int, tensor_scale: Any, stream: int,
                     a_ptr: int | None = None, row_ptr: int = 0, ws_ptr: int = 0) -> None:
        """The aligned GEMM variant on ``pointers`` (input, weight, weight_scale, [bias,] output);
        ``a_ptr`` / ``row_ptr``: quantized activations and their scales in place of the input;
        ``ws_ptr``: the cooperative kernel's workspace (``row_ptr`` its scales)."""
        launcher, blocks, threads, ints = self._fast_gemm(pointers, a_ptr, row_ptr, ws_ptr)
        launcher.launch_patched(blocks, threads, stream, ints, (tensor_scale,), device)

    def _fast_gemm(self, pointers: list[int], a_ptr: int | None = None, row_ptr: int = 0,
                   ws_ptr: int = 0) -> tuple[KernelLauncher, int, int, tuple[int, ...]]:
        """``(launcher, blocks, threads, ints)`` of :meth:`_launch_fast` (its floats: the tensor scale)."""
        if not self.desc.has_bias:
            pointers.insert(3, pointers[2])  # the unused bias slot points at weight_scale
        in_ptr, w_ptr, s_ptr, b_ptr, o_ptr = pointers
        if a_ptr is None:
            a_ptr, row_ptr = in_ptr, (row_ptr if self._cooperative else 0 if self._fused else s_ptr)
        launcher, _, blocks, threads = self._variants[self._aligned_variant]
        ints = (a_ptr, a_ptr, w_ptr, w_ptr, row_ptr, s_ptr, b_ptr, o_ptr)
        if self._cooperative:
            ints += (ws_ptr, ws_ptr, ws_ptr + self._counter_offset)
        return launcher, blocks, threads, ints

    def _common(self, args: Any) -> tuple[Operand, Operand, Operand | None, Operand]:
        d, name = self.desc, self.name
        weight = checked_operand(name, args.weight, "weight", ElementKind.S8, d.n * d.k)
        weight_scale = checked_operand(name, args.weight_scale, "weight_scale", ElementKind.F32, d.n)
        if d.has_bias:
            if args.bias is None:
                raise InvalidProblem(problem_message(name, "bias", "an [n] float32 array (has_bias=True)", None))
            bias = checked_operand(name, args.bias, "bias", ElementKind.F32, d.n)
        elif args.bias is not None:
            raise InvalidProblem(problem_message(name, "bias", "None (has_bias=False)", type(args.bias).__name__))
        else:
            bias = None
        output = checked_operand(name, args.output, "output", d.output_element, d.m * d.n)
        return weight, weight_scale, bias, output

    def _gemm(self, a: Operand, weight: Operand, row_scale: Operand | None, weight_scale: Operand,
              bias: Operand | None, output: Operand, tensor_scale: float, handle: int, unfused: bool = False,
              workspace: Operand | None = None) -> None:
        """Launch the GEMM variant ``a``'s and the weight's alignment select (``unfused``: ``a`` is
        already quantized); the cooperative variant takes ``x`` as ``a``, quantizes it into
        ``workspace`` (its counters zeroed) and its scales into ``row_scale``."""
        d = self.desc
        aligned = d.k % 16 == 0 and _address(a) % 16 == 0 and _address(weight) % 16 == 0
        name = self._aligned_variant if aligned else self._other_variant
        if unfused and name in ("fused", "cooperative"):
            name = "skinny_vector"  # `a` is already quantized (and aligned: this is the aligned variant)
        launcher, tiles_m, blocks, threads = self._variants[name]
        extra: tuple[ArrayArg, ...] = ()
        if name in ("fused", "cooperative"):  # `a` is x itself
            a_views = (_element_view(a, d.m * d.k), _pair_view(a, d.m * d.k * a.element.itemsize))
        else:
            a_views = _byte_views(a, d.m * d.k)
        if name == "fused":  # the scales stay in the kernel's shared memory
            row_vector = ArrayArg(0, 0, a.element.itemsize if a.element is ElementKind.F64 else 4,
                                  None if not SIMULATOR else np.zeros(0, np.float64 if a.element is ElementKind.F64
                                                                      else np.float32))
        else:
            row_vector = _vector(row_scale if row_scale is not None else weight_scale)
        if name == "cooperative":
            word = 16 // a.element.itemsize  # bytes of one 16-byte piece of x, quantized
            extra = (_word_view(workspace, 0, d.m * d.k, word), _pair_view(workspace, d.m * d.k),
                     _word_view(workspace, self._counter_offset, 12, 4))
        arrays = (*a_views, *_byte_views(weight, d.n * d.k), row_vector,
                  _vector(weight_scale), _vector(bias if bias is not None else weight_scale),
                  _element_view(output, d.m * d.n), *extra)
        launcher.launch(blocks, threads, handle, arrays, (d.m, d.n, d.k, tiles_m, aligned, tensor_scale),
                        a.device_id)

    def kernel_variant(self, args: Any) -> str:
        """Which GEMM kernel ``run(args)`` launches: ``fused`` / ``cooperative`` (skinny kernels quantizing
        ``x`` themselves), ``skinny_vector`` (the skinny kernel on aligned operands), ``skinny``,
        ``wgmma`` (prefill on an sm_90 device), ``pipelined`` or ``tiled``."""
        operands = self._bind(args)
        aligned = self.desc.k % 16 == 0 and _address(operands[1]) % 16 == 0
        if isinstance(self, QuantizedLinearPlan) and not (self._fused or self._cooperative):
            return self._aligned_variant if aligned else self._other_variant  # xq lives in the workspace
        if aligned and (self._fused or self._cooperative):
            # x unaligned: quantized into the (aligned) workspace first
            return self._aligned_variant if _address(operands[0]) % 16 == 0 else "skinny_vector"
        return self._aligned_variant if aligned and _address(operands[0]) % 16 == 0 else self._other_variant


_SCALARS = (np.int64,) * 4 + (np.bool_, np.float32)
_COUNTERS = 3  # the cooperative kernel's uint32 counters: tickets, rows quantized, blocks done
_ZERO_F32 = np.float32(0.0)


@functools.cache
def _linear_launch(pair_launch: Any) -> Any:
    """The W8A8 linear's two launches (the per-token quantizer, then the GEMM, as
    :meth:`QuantizedLinearPlan._launch_found` makes them) as one compiled call through ``pair_launch``
    (:func:`~baracuda_numba.launch.make_pair_launch` of a driver), the kernels' pointers derived from the
    operands' in compiled code: ``launch(device, stream, x, workspace, weight, weight_scale, bias, out, layout,
    q_record, record) -> status`` (``pair_launch``'s). ``layout`` (int64): the quantizer's function, blocks and
    threads, the GEMM's, then the offsets of the row scales and of the zero point in the workspace; the records:
    the two kernels' launch records."""
    from numba import njit

    @njit(nogil=True)
    def launch(device, stream, x, workspace, weight, weight_scale, bias, out, layout, q_record,
               record):  # pragma: no cover (compiled)
        scales = workspace + layout[6]
        return pair_launch(device, stream, layout[0], layout[1], layout[2], q_record,
                           (x, x, workspace, workspace, scales, workspace + layout[7]), (0.0,),
                           layout[3], layout[4], layout[5], record,
                           (workspace, workspace, weight, weight, scales, weight_scale, bias, out), (np.float32(0.0),))

    return launch


def _capturing(stream: int) -> bool:
    """Whether a launch on ``stream`` (a raw handle) is being captured into a graph, as far as PyTorch's
    current stream tells (False without torch, or without its CUDA build). The legacy default stream
    (0) cannot be captured: eager calls there ask nothing (the query is a runtime call)."""
    torch = sys.modules.get("torch")
    return stream != 0 and torch is not None and _capture_query(torch)()


@functools.cache
def _capture_query(torch: Any) -> Any:
    if SIMULATOR or not torch.cuda.is_available():
        return lambda: False
    return getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)


def _multiprocessors() -> int:
    """Multiprocessors of the current device (an H100's 132 under the simulator)."""
    if SIMULATOR:
        return 132
    from numba import cuda

    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def _address(op: Operand) -> int:
    return op.host.ctypes.data if SIMULATOR else op.ptr


def _byte_views(op: Operand, nbytes: int) -> tuple[ArrayArg, ArrayArg]:
    if SIMULATOR:
        return ArrayArg(0, nbytes, 1, op.host.view(np.uint8)), _pair_view(op, nbytes)
    return ArrayArg(op.ptr, nbytes, 1), ArrayArg(op.ptr, nbytes // 8, 8)


def _vector(op: Operand) -> ArrayArg:
    return ArrayArg(op.ptr, op.size, op.element.itemsize, op.host)


def _element_view(op: Operand, count: int) -> ArrayArg:
    itemsize = op.element.itemsize
    return ArrayArg(op.ptr, count, itemsize, None if op.host is None else op.host.view(f"u{itemsize}"))


def _word_view(op: Operand, offset: int, nbytes: int, itemsize: int) -> ArrayArg:
    """``nbytes`` of ``op`` from byte ``offset`` as unsigned integers of ``itemsize`` bytes."""
    if SIMULATOR:
        return ArrayArg(0, nbytes // itemsize, itemsize,
                        op.host.view(np.uint8)[offset: offset + nbytes].view(f"u{itemsize}"))
    return ArrayArg(op.ptr + offset, nbytes // itemsize, itemsize)


def _pair_view(op: Operand, nbytes: int) -> ArrayArg:
    """``nbytes`` of ``op`` as uint64 (16-byte aligned: read as pairs)."""
    if SIMULATOR:
        return ArrayArg(0, nbytes // 8, 8, op.host.view(np.uint8)[: nbytes // 8 * 8].view(np.uint64))
    return ArrayArg(op.ptr, nbytes // 8, 8)


class QuantizedLinearPlan(_LinearPlan):
    """``y = (quantize_per_token(x) @ weight.T) * scale_x * weight_scale (+ bias)`` in ``x``'s dtype; with
    ``static_activation``, ``quantize_per_tensor(x, act_scale)`` and ``scale_x = act_scale``."""

    Descriptor = QuantizedLinearDescriptor
    Args = QuantizedLinearArgs

    def _prepare(self) -> None:
        # set before the base prepares: on a GPU it installs the fast template, which reads them
        d = self.desc
        self._quantizer = DynamicRangeQuantizePlan.select(DynamicRangeQuantizeDescriptor(
            (d.m, d.k), DynamicRangeMode.SYMMETRIC, DynamicRangeScope.token(), -127, 127, d.input_element,
            ElementKind.S8))
        self._scale_element = ElementKind.F64 if d.input_element is ElementKind.F64 else ElementKind.F32
        self._scale_offset = _align(d.m * d.k)
        self._quantizer_offset = self._scale_offset + _align(self._scale_element.itemsize * d.m)
        self._counter_offset = self._quantizer_offset + _align(self._quantizer.workspace_size())
        self._workspaces: dict[tuple[int, int], Any] = {}
        self._direct: tuple | None = None  # the two-launch fast path's closures (_build_direct), built on first use
        self._direct_built = False
        # static_activation, where the fused kernel does not run: x quantized with the given scale by the static
        # quantizer (x as whole 16-byte pieces), the GEMM its programmatic dependent as after the per-token one;
        # else by the per-tensor plan, then a fill of the row scales
        self._tensor_quantizer = QuantizePerTensorPlan.select(QuantizePerTensorDescriptor(
            d.m * d.k, -127, 127, d.input_element, ElementKind.S8)) if d.static_activation else None
        self._static_quantizer: KernelLauncher | None = None
        self._static_pieces = self._static_blocks = 0
        if d.static_activation and STATIC_QUANTIZER:
            self._static_pieces = d.m * d.k * d.input_element.itemsize // 16
            self._static_quantizer = KernelLauncher(gemm.static_quantizer_kernel(d.input_element).compiled, 3,
                                                    (np.int64, np.int64, np.float32),
                                                    dependent=STATIC_QUANTIZER_DEPENDENT)
            self._static_blocks = max(1, min(-(-self._static_pieces // STATIC_QUANTIZER_THREADS),
                                             STATIC_QUANTIZER_BLOCKS_PER_SM * _multiprocessors()))
        super()._prepare()
        # a call captured into a CUDA graph launches the two kernels where the fused kernel is chosen for
        # host time alone (CAPTURE_UNFUSED); compiled now, not while a graph is captured
        self._capture_choice = self._fused and CAPTURE_UNFUSED and not self._fused_on_gpu_time()
        if self._capture_choice and not SIMULATOR:
            from numba import cuda

            self._variants["skinny_vector"][0]._function(cuda.get_current_device().id)

    def _static_activation(self) -> bool:
        return self.desc.static_activation

    def _install_fast_template(self) -> None:
        super()._install_fast_template()
        if self._static_quantizer is not None and self._fast_specs is not None:
            d, per_pair = self.desc, 16 // self.desc.input_element.itemsize
            values = [*array_values(0, 2 * self._static_pieces, 8), *array_values(0, self._static_pieces, per_pair),
                      *array_values(0, d.m, 4), self._static_pieces, d.m, 0.0]
            self._static_quantizer.set_template(values, (_pointer_slots(3),), range(7 * 3 + 2, 7 * 3 + 3), np.float32)

    def _static_quantize(self, x: Operand, workspace: Operand, scale_x: Operand, act_scale: np.float32,
                         handle: int) -> bool:
        """The checked path's launch of the static quantizer (``x`` into the workspace's rows, ``act_scale`` into
        ``scale_x``); False (nothing launched) where ``x`` is not whole 16-byte pieces at a 16-byte address."""
        d = self.desc
        if self._static_quantizer is None or _address(x) % 16 or d.m * d.k * d.input_element.itemsize % 16:
            return False
        per_pair = 16 // d.input_element.itemsize
        arrays = (_pair_view(x, 16 * self._static_pieces), _word_view(workspace, 0, d.m * d.k, per_pair),
                  _vector(scale_x))
        self._static_quantizer.launch(self._static_blocks, STATIC_QUANTIZER_THREADS, handle, arrays,
                                      (self._static_pieces, d.m, act_scale), x.device_id)
        return True

    def _wgmma_dependent(self) -> bool:
        return self.desc.m <= WGMMA_DEPENDENT_MAX_M

    def _fuses_quantize(self) -> bool:
        d = self.desc
        # FUSED_ANY_SHAPE_MAX_M: one launch for its host time where the fused kernel is not the faster on the GPU
        host = d.m <= FUSED_ANY_SHAPE_MAX_M and d.n * d.k <= FUSED_ANY_SHAPE_MAX_WEIGHT
        # no more tokens than FUSED_MAX_M (STATIC_FUSED_MAX_M in the static one-wave shape) either way
        static_wave = d.static_weight and self._one_wave(gemm.skinny_tiles(d.k))
        gpu = self._fused_on_gpu_time() and d.m <= (STATIC_FUSED_MAX_M if static_wave else FUSED_MAX_M)
        max_n = WIDE_FUSED_MAX_N if self._wide_fused() else FUSED_MAX_N
        return ((host or gpu) and d.n <= max_n and d.k % 16 == 0
                and gemm.fused_shared_bytes(d.m, d.k) <= FUSED_MAX_SHARED)

    def _static_weight(self) -> bool:
        return self.desc.static_weight

    def _fused_on_gpu_time(self) -> bool:
        """Whether the fused kernel is the faster one on the GPU at this shape (not only on the host): up to
        LONG_ROWS_FUSED_MAX_M tokens with long rows against wide weights, up to ONE_WAVE_FUSED_MAX_M (with a
        static weight STATIC_FUSED_MAX_M) where its blocks fit one wave at two per SM, and by the WIDE_FUSED_*
        rules."""
        d = self.desc
        tiles = gemm.skinny_tiles(d.k)
        one_wave = (d.static_weight or ONE_WAVE_SHAPE) and self._one_wave(tiles)
        one_wave_tokens = STATIC_FUSED_MAX_M if d.static_weight else ONE_WAVE_FUSED_MAX_M
        return ((d.k >= FUSED_MIN_K and d.n >= FUSED_MIN_N and d.m <= min(FUSED_MAX_M, LONG_ROWS_FUSED_MAX_M))
                or (one_wave and d.m <= one_wave_tokens) or self._wide_fused())

    def _wide_fused(self) -> bool:
        """Whether the fused kernel is the faster on the GPU by the WIDE_FUSED_* rules: with 2 column tiles and
        up to WIDE_FUSED_MAX_N rows, up to WIDE_FUSED_MAX_M tokens where its blocks do not make more than one
        and at most WIDE_FUSED_SKIP_WAVES waves at its launch bounds, up to WIDE_ONE_WAVE_FUSED_MAX_M where
        they make at most one there but more than one at two per SM."""
        d = self.desc
        tiles = gemm.skinny_tiles(d.k)
        min_blocks = gemm.fused_min_blocks(tiles, self.entry.input_element)
        if (d.m > max(WIDE_FUSED_MAX_M, WIDE_ONE_WAVE_FUSED_MAX_M) or tiles != 2 or d.n > WIDE_FUSED_MAX_N
                or not min_blocks):
            return False
        blocks = -(-d.n // (SKINNY_N * tiles))
        if blocks > 3 * _multiprocessors() and self._wide_tiles(tiles) != tiles:
            return False  # the two launches in wide blocks are the faster there (FEW_TOKENS_WIDE_MIN_M)
        slots = min_blocks * _multiprocessors()
        waves = blocks / slots if slots else math.inf
        if d.m > WIDE_FUSED_MAX_M:  # (fewer blocks: the one-wave shape's, ONE_WAVE_FUSED_MAX_M)
            return waves <= 1 and not self._one_wave(tiles)
        return not 1 < waves <= WIDE_FUSED_SKIP_WAVES

    def _cooperates(self) -> bool:
        d = self.desc
        return d.m <= COOPERATIVE_MAX_M and d.k % 16 == 0 and not d.static_activation

    def _dependent_gemm(self) -> bool:
        return DEPENDENT_GEMM

    def _cooperative_arrays(self, ws_ptr: int) -> tuple[ArrayArg, ...]:
        """The quantized rows as one word per 16-byte piece of ``x`` and as 16-byte pairs, then the
        three uint32 counters."""
        d, word = self.desc, 16 // self.entry.input_element.itemsize
        return (ArrayArg(ws_ptr, d.m * d.k // word, word), ArrayArg(ws_ptr, d.m * d.k // 8, 8),
                ArrayArg(ws_ptr + self._counter_offset, 3, 4))

    def _fast_input_element(self) -> ElementKind:
        return self.desc.input_element

    def _fast_workspace(self, workspace: Any, device: int) -> int | None:
        """The address of a workspace the fast path takes unchecked (a contiguous, 16-byte aligned CUDA
        tensor, or an operand adapted from one, of at least ``workspace_size()`` bytes on ``device``),
        else None."""
        kind = type(workspace)
        if kind is _torch_tensor_type():
            if (not workspace.is_cuda or workspace.get_device() != device or not workspace.is_contiguous()
                    or workspace.numel() * workspace.element_size() < self.workspace_size()):
                return None
            ptr = workspace.data_ptr()
        elif kind is Operand:
            if (workspace.origin != "torch" or workspace.device_id != device or not workspace.contiguous
                    or workspace.size * workspace.element.itemsize < self.workspace_size()):
                return None
            ptr = workspace.ptr
        else:
            return None
        return None if ptr % 16 else ptr

    def _fast_row_vector(self, ptr: int) -> ArrayArg:
        return ArrayArg(ptr, self.desc.m, self._scale_element.itemsize)

    def run_trusted(self, args: Any, device: int) -> bool:
        direct = self._direct if self._direct_built else self._build_direct()
        if direct is not None:
            return direct[1](args, device)
        pointers = trusted_pointers(self._fast_specs, args)
        return pointers is not None and self._launch_found(pointers, device, None, self._activation_scale(args))

    def _build_direct(self) -> tuple[Callable[[Any, Any], bool], Callable[[Any, int], bool]] | None:
        """The fast path of :meth:`_launch_found` (the quantizer, then the dependent GEMM; or the fused kernel) as
        two closures over everything the plan fixed at selection, for ``torch.Tensor`` operands:
        ``checked(args, workspace)`` tests each tensor (exact type, dtype, CUDA, size, contiguity, one device,
        alignment) and the workspace as :func:`.base.fast_pointers` and :meth:`_fast_workspace` do;
        ``trusted(args, device)`` only the alignments (:meth:`run_trusted`). Each returns False, having launched
        nothing, where the general path must decide. Once both of the two launches' kernels are loaded, they are
        one compiled call (:func:`_linear_launch`; with a static activation scale, the static quantizer and the GEMM
        through their :class:`~baracuda_numba.launch.LaunchPair`). None (built once) for the cooperative kernel, off
        the GPU, or before torch is imported. Flattened because the call is host-bound at decode: one frame and
        local names instead of the generic loop over field specs and five method calls. Session 30 (H100 host,
        best / median of 7 interleaved rounds, two-launch ``Plan.run`` at 16 x 4096 @ 4096^2,
        ``benchmarks/probe_host_direct.py``): 11.58 / 11.97 -> 9.26 / 9.70 us; with a null driver (the host's own
        share) 5.84 -> 3.75."""
        self._direct_built = True
        torch = sys.modules.get("torch")
        d = self.desc
        if (torch is None or self._fast_specs is None or self._cooperative or _torch_tensor_type() is None
                or (d.static_activation and not self._fused and self._static_quantizer is None)):
            return None
        dtypes = {element: dtype for dtype, element in _TORCH_DTYPES.items()}
        tensor, x_dtype, out_dtype = torch.Tensor, dtypes[d.input_element], dtypes[d.output_element]
        int8, float32 = torch.int8, torch.float32
        x_count, w_count, o_count, n = d.m * d.k, d.n * d.k, d.m * d.n, d.n
        out_align, has_bias, static_activation = d.output_element.itemsize, d.has_bias, d.static_activation
        launcher, _, blocks, threads = self._variants[self._aligned_variant]
        scale_offset, zero_point_offset, ws_bytes = self._scale_offset, self._quantizer_offset, self.workspace_size()
        capture_choice, activation_scale = self._capture_choice, self._activation_scale
        from .. import launch as launching  # its stream getter now (the recording tests replace it)

        stream_of, stream_workspace = launching._torch_stream_getter(), self._stream_workspace

        def given_workspace(workspace: Any, device: int) -> int | None:
            if (type(workspace) is tensor and workspace.is_cuda and workspace.get_device() == device
                    and workspace.is_contiguous() and workspace.nbytes >= ws_bytes):
                ptr = workspace.data_ptr()
                return None if ptr & 15 else ptr
            return None

        def stream_and_workspace(device: int, workspace: Any) -> tuple[int, int | None]:
            """The current stream, and the address of ``workspace`` (None where it does not qualify) or else of the
            plan's own for that stream."""
            stream = stream_of(device)
            return stream, stream_workspace(device, stream) if workspace is None else given_workspace(workspace, device)

        def launch_fused(x_ptr: int, w_ptr: int, s_ptr: int, b_ptr: int, o_ptr: int, device: int, workspace: Any,
                         act_scale: Any) -> bool:
            stream = stream_of(device)
            if workspace is not None and given_workspace(workspace, device) is None:
                return False
            if capture_choice and _capturing(stream):
                return False  # the checked path launches the two kernels
            launcher.launch_patched(blocks, threads, stream, (x_ptr, x_ptr, w_ptr, w_ptr, 0, s_ptr, b_ptr, o_ptr),
                                    (act_scale,), device)
            return True

        if self._fused:
            launch_found = launch_fused
        elif static_activation:  # the static quantizer, then the GEMM: one LaunchPair call
            static_pair = LaunchPair(self._static_quantizer, launcher)
            static_blocks, gemm_floats = self._static_blocks, (_ZERO_F32,)

            def launch_found(x_ptr: int, w_ptr: int, s_ptr: int, b_ptr: int, o_ptr: int, device: int, workspace: Any,
                             act_scale: Any) -> bool:
                stream, ws_ptr = stream_and_workspace(device, workspace)
                if ws_ptr is None:
                    return False
                scale_ptr = ws_ptr + scale_offset
                gemm_ints = (ws_ptr, ws_ptr, w_ptr, w_ptr, scale_ptr, s_ptr, b_ptr, o_ptr)
                static_pair.launch(stream, device, static_blocks, STATIC_QUANTIZER_THREADS, (x_ptr, ws_ptr, scale_ptr),
                                   (act_scale,), blocks, threads, gemm_ints, gemm_floats)
                return True
        else:
            q_launcher, q_blocks, q_threads, _ = self._quantizer.segment_launch_fast(
                0, 0, 0, 0, d.n * d.k >= QUANTIZER_DEPENDENT_MIN_WEIGHT)
            pair = LaunchPair(q_launcher, launcher)
            gemm_floats = (_ZERO_F32,)
            q_functions, q_params, functions, params = (q_launcher._functions, q_launcher.params, launcher._functions,
                                                        launcher.params)
            layouts: dict[int, np.ndarray] = {}  # per device: _linear_launch's layout, once both kernels are loaded
            compiled: list = [None, None]  # _linear_launch's entry point, and the driver's pair launch it calls

            def launch_found(x_ptr: int, w_ptr: int, s_ptr: int, b_ptr: int, o_ptr: int, device: int, workspace: Any,
                             act_scale: Any) -> bool:
                stream, ws_ptr = stream_and_workspace(device, workspace)
                if ws_ptr is None:
                    return False
                layout = layouts.get(device)
                if layout is not None:
                    pair_launch = launching._driver().launch_pair
                    if compiled[1] is not pair_launch:
                        compiled[0] = launching.compiled_entry(_linear_launch(pair_launch), (
                            device, stream, x_ptr, ws_ptr, w_ptr, s_ptr, b_ptr, o_ptr, layout, q_params.record,
                            params.record))
                        compiled[1] = pair_launch
                    status = compiled[0](device, stream, x_ptr, ws_ptr, w_ptr, s_ptr, b_ptr, o_ptr, layout,
                                         q_params.record, params.record)
                    if status == 0:
                        return True
                    if status > 0:
                        raise launching._launch_error(status)
                scale_ptr = ws_ptr + scale_offset
                q_ints = (x_ptr, x_ptr, ws_ptr, ws_ptr, scale_ptr, ws_ptr + zero_point_offset)
                ints = (ws_ptr, ws_ptr, w_ptr, w_ptr, scale_ptr, s_ptr, b_ptr, o_ptr)
                pair.launch(stream, device, q_blocks, q_threads, q_ints, (), blocks, threads, ints, gemm_floats)
                q_function, function = q_functions.get(device), functions.get(device)
                if q_function is not None and function is not None:  # loaded: the next call is one compiled call
                    layouts[device] = np.array((q_function, q_blocks, q_threads, function, blocks, threads,
                                                scale_offset, zero_point_offset), np.int64)
                return True

        def scale_of(args: Any) -> Any:
            """The kernel's activation scale (0 without a static one), or None where ``act_scale`` is given to a
            plan without one (the general path raises)."""
            if static_activation:
                return activation_scale(args)  # InvalidProblem, as the general path, unless finite and > 0
            return None if args.act_scale is not None else _ZERO_F32

        def checked(args: Any, workspace: Any) -> bool:
            x, w, s, o, b = args.input, args.weight, args.weight_scale, args.output, args.bias
            if (type(x) is not tensor or type(w) is not tensor or type(s) is not tensor or type(o) is not tensor
                    or x.dtype is not x_dtype or w.dtype is not int8 or s.dtype is not float32
                    or o.dtype is not out_dtype or not x.is_cuda or not w.is_cuda or not s.is_cuda or not o.is_cuda
                    or x.numel() != x_count or w.numel() != w_count or s.numel() != n or o.numel() != o_count
                    or not x.is_contiguous() or not w.is_contiguous() or not s.is_contiguous()
                    or not o.is_contiguous()):
                return False
            device = x.get_device()
            if w.get_device() != device or s.get_device() != device or o.get_device() != device:
                return False
            if has_bias:
                if (type(b) is not tensor or b.dtype is not float32 or not b.is_cuda or b.numel() != n
                        or not b.is_contiguous() or b.get_device() != device):
                    return False
                b_ptr = b.data_ptr()
            elif b is None:
                b_ptr = 0
            else:
                return False
            x_ptr, w_ptr, s_ptr, o_ptr = x.data_ptr(), w.data_ptr(), s.data_ptr(), o.data_ptr()
            if not has_bias:
                b_ptr = s_ptr  # the unused bias slot points at weight_scale
            act_scale = scale_of(args)
            if (x_ptr | w_ptr) & 15 or (s_ptr | b_ptr) & 3 or o_ptr % out_align or act_scale is None:
                return False
            return launch_found(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, device, workspace, act_scale)

        def trusted(args: Any, device: int) -> bool:
            x_ptr, w_ptr, s_ptr, o_ptr = (args.input.data_ptr(), args.weight.data_ptr(), args.weight_scale.data_ptr(),
                                          args.output.data_ptr())
            b_ptr = args.bias.data_ptr() if has_bias else s_ptr
            act_scale = scale_of(args)
            if (x_ptr | w_ptr) & 15 or (s_ptr | b_ptr) & 3 or o_ptr % out_align or act_scale is None:
                return False
            return launch_found(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, device, None, act_scale)

        self._direct = (checked, trusted)
        return self._direct

    def _activation_scale(self, args: Any) -> np.float32:
        """The static activation scale of ``args`` as float32 (0 without ``static_activation``, where
        ``args.act_scale`` must be None); :class:`InvalidProblem` unless finite, > 0 and invertible."""
        if not self.desc.static_activation:
            if args.act_scale is not None:
                raise InvalidProblem(problem_message(self.name, "act_scale", "None (static_activation=False)",
                                                     repr(args.act_scale)))
            return _ZERO_F32
        return checked_scale(self.name, args.act_scale, np.float32, "act_scale")[1]

    def _launch_found(self, pointers: list[int], device: int, workspace: Any, act_scale: np.float32) -> bool:
        """The fast launch(es) on checked ``pointers`` (``_fast_specs`` order) on ``device``'s current
        PyTorch stream; ``workspace`` None: the plan's own for that stream. False (nothing launched)
        when a given workspace does not qualify (see :meth:`_fast_workspace`). The quantizer is the per-token one,
        or with ``static_activation`` the static one (``kernels.linear.static_quantizer_kernel``)."""
        stream = torch_current_stream(device)
        if self._fused:
            if workspace is not None and self._fast_workspace(workspace, device) is None:
                return False
            if self._capture_choice and _capturing(stream):
                return False  # the checked path launches the two kernels
            self._launch_fast(pointers, device, act_scale, stream)
            return True
        ws_ptr = self._stream_workspace(device, stream) if workspace is None else self._fast_workspace(workspace,
                                                                                                        device)
        if ws_ptr is None:
            return False
        scale_ptr = ws_ptr + self._scale_offset
        if self._cooperative:
            if workspace is not None:  # the plan's own workspaces stay zeroed between launches
                zero_words(ws_ptr + self._counter_offset, _COUNTERS, stream)
            self._launch_fast(pointers, device, _ZERO_F32, stream, None, scale_ptr, ws_ptr)
            return True
        q_floats: tuple = ()
        if self.desc.static_activation:
            if self._static_quantizer is None:
                return False  # the checked path's three launches
            q_launcher, q_blocks, q_threads = self._static_quantizer, self._static_blocks, STATIC_QUANTIZER_THREADS
            q_ints, q_floats = (pointers[0], ws_ptr, scale_ptr), (act_scale,)
        else:
            q_launcher, q_blocks, q_threads, q_ints = self._quantizer.segment_launch_fast(
                pointers[0], ws_ptr, scale_ptr, ws_ptr + self._quantizer_offset,
                self.desc.n * self.desc.k >= QUANTIZER_DEPENDENT_MIN_WEIGHT)
        launcher, blocks, threads, ints = self._fast_gemm(pointers, ws_ptr, scale_ptr)
        pair = self._fast_pairs.get(q_launcher)
        if pair is None or pair.second is not launcher:
            pair = self._fast_pairs[q_launcher] = LaunchPair(q_launcher, launcher)
        pair.launch(stream, device, q_blocks, q_threads, q_ints, q_floats, blocks, threads, ints, (_ZERO_F32,))
        return True

    def _stream_workspace(self, device: int, stream: int) -> int:
        """The address of the plan's workspace for ``stream`` on ``device``, allocated (as a torch tensor,
        on that stream) on first use and kept: launches on one stream run in order, so every eager call
        on it may reuse the bytes. A call being captured into a CUDA graph gets bytes of its own from
        the graph's pool (a graph may replay on another stream, next to eager calls on this one)."""
        torch = sys.modules["torch"]
        # zeroed: the cooperative kernel's counters start at zero and every launch leaves them so
        if _capturing(stream):
            # the caching allocator keeps a captured allocation's block for the graph's replays; only the
            # cooperative kernel reads bytes it did not write (a fill kernel more in the graph otherwise)
            allocate = torch.zeros if self._cooperative else torch.empty
            return allocate(self.workspace_size(), dtype=torch.uint8, device=torch.device("cuda", device)).data_ptr()
        workspace = self._workspaces.get((device, stream))
        if workspace is None:
            workspace = torch.zeros(self.workspace_size(), dtype=torch.uint8, device=torch.device("cuda", device))
            if len(self._workspaces) >= _STREAM_WORKSPACES:
                self._workspaces.clear()  # freed blocks go back to their own stream's pool: still ordered
            self._workspaces[(device, stream)] = workspace
        return workspace.data_ptr()

    def workspace_size(self) -> int:
        """Quantized activations ``[m, k]`` int8, their scales ``[m]`` (float32; float64 for f64 input),
        the quantizer's scratch, the cooperative kernel's three uint32 counters (zeroed by the plan
        before each launch on a workspace it was given). (The fused decode kernel, ``m <= FUSED_MAX_M``, uses none
        of it when ``x`` is 16-byte aligned.)"""
        return self._counter_offset + 4 * _COUNTERS

    def _bind(self, args: Any) -> tuple:
        if not isinstance(args, self.Args):
            raise InvalidProblem(problem_message(self.name, "args", self.Args.__name__, type(args).__name__))
        d = self.desc
        x = checked_operand(self.name, args.input, "input", d.input_element, d.m * d.k)
        return (x, *self._common(args))

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        """Quantize ``args.input`` per token into the workspace, then the int8 GEMM and epilogue.

        ``workspace``: at least ``workspace_size()`` bytes, or None to let the plan allocate it
        (the fused kernel needs none; the fast path below keeps one per stream).

        At ``m <= LONG_ROWS_FUSED_MAX_M``, ``FUSED_MIN_K <= k``, ``FUSED_MIN_N <= n <= FUSED_MAX_N`` (and at
        ``m <= FUSED_ANY_SHAPE_MAX_M`` for any ``n <= FUSED_MAX_N`` with ``n * k <= FUSED_ANY_SHAPE_MAX_WEIGHT``,
        and at ``m <= WIDE_FUSED_MAX_M`` with ``k < FUSED_MIN_K`` up to ``WIDE_FUSED_MAX_N`` rows outside a
        window of waves, ``WIDE_FUSED_SKIP_WAVES``, or ``m <= WIDE_ONE_WAVE_FUSED_MAX_M`` where the blocks make
        one wave at three per SM but not at two), ``K % 16 == 0``, with 16-byte aligned ``x``
        and weight, one kernel does both (``fused``); other decode shapes
        (``m <= 64``) launch the skinny GEMM as the quantizer's programmatic dependent (``DEPENDENT_GEMM``),
        sm_90. When, in addition,
        every array is a contiguous CUDA ``torch.Tensor`` of the expected dtype on one device and
        ``stream`` is None, the plan patches their pointers into its pre-packed parameter block and
        launches (no operand adaptation).
        """
        if self._fast_specs is not None and stream is None and type(args) is QuantizedLinearArgs:
            direct = self._direct if self._direct_built else self._build_direct()
            if direct is not None and direct[0](args, workspace):
                return
            found = self._fast_pointers(args)
            if found is not None and self._launch_found(*found, workspace, self._activation_scale(args)):
                return
        x, weight, weight_scale, bias, output = self._bind(args)
        act_scale = self._activation_scale(args)
        d = self.desc
        if d.m == 0 or d.n == 0:
            return
        handle = stream_handle(stream, (x, output), self.name)
        one_launch = d.k and _address(x) % 16 == 0 and _address(weight) % 16 == 0
        if self._fused and one_launch and not (self._capture_choice and _capturing(handle)):
            if workspace is not None:
                self._check_workspace(workspace)
            self._gemm(x, weight, None, weight_scale, bias, output, act_scale, handle)
            if output.on_host or x.on_host:
                synchronize(handle)
                finish(output)
            return
        if workspace is None:
            workspace = allocate_like(x, (self.workspace_size(),), ElementKind.U8)
        else:
            self._check_workspace(workspace)
        ws = adapt(workspace, self.name, "workspace")
        scale_x = sub_operand(ws, self._scale_offset, self._scale_element, (d.m,))
        if self._cooperative and one_launch:
            if SIMULATOR:
                ws.host.view(np.uint8)[self._counter_offset: self._counter_offset + 4 * _COUNTERS] = 0
            else:
                zero_words(ws.ptr + self._counter_offset, _COUNTERS, handle)
            self._gemm(x, weight, scale_x, weight_scale, bias, output, 0.0, handle, workspace=ws)
        else:
            xq = sub_operand(ws, 0, ElementKind.S8, (d.m, d.k))
            if d.static_activation:  # x per tensor, every row's scale the given one
                if not (d.k and self._static_quantize(x, ws, scale_x, act_scale, handle)):
                    if d.k:
                        self._tensor_quantizer.run(QuantizePerTensorArgs(x, args.act_scale, 0, xq), stream=handle)
                    if SIMULATOR:
                        scale_x.host[...] = act_scale
                    else:
                        fill_words(scale_x.ptr, int(act_scale.view(np.uint32)), d.m, handle)
            elif d.k:
                scratch = sub_operand(ws, self._quantizer_offset, ElementKind.U8, (self._quantizer.workspace_size(),))
                self._quantizer.run(DynamicRangeQuantizeArgs(x, xq, scale_x, None), workspace=scratch, stream=handle)
            elif SIMULATOR:  # K = 0: no quantizer runs, and the epilogue's (0 * scale) must not read a stale NaN
                scale_x.host[...] = 0
            else:
                zero_words(scale_x.ptr, d.m * self._scale_element.itemsize // 4, handle)
            self._gemm(xq, weight, scale_x, weight_scale, bias, output, 0.0, handle, unfused=True)
        if output.on_host or x.on_host:
            synchronize(handle)
            finish(output)


class SmoothQuantLinearPlan(_LinearPlan):
    """``y = (act_q @ weight.T) * act_scale * weight_scale (+ bias)`` with a static activation scale."""

    Descriptor = SmoothQuantLinearDescriptor
    Args = SmoothQuantLinearArgs

    @classmethod
    def _registry_elements(cls, desc: Any) -> tuple[ElementKind, ElementKind]:
        return ElementKind.S8, desc.output_element

    def _dependent_gemm(self) -> bool:
        return DEPENDENT_GEMM

    def _dependent_waits_first(self) -> bool:
        # The kernel before may be anyone's: only under the static-weight promise are the weight and
        # column parameters read before the wait.
        return not self.desc.static_weight

    def _wgmma_dependent(self) -> bool:
        return DEPENDENT_GEMM and self.desc.m <= SMOOTHQUANT_WGMMA_DEPENDENT_MAX_M

    def run_trusted(self, args: Any, device: int) -> bool:
        pointers = trusted_pointers(self._fast_specs, args)
        if pointers is None:
            return False
        self._launch_found(args, pointers, device)
        return True

    def _launch_found(self, args: Any, pointers: list[int], device: int) -> None:
        _, act_scale = checked_scale(self.name, args.act_scale, np.float32, "act_scale")
        self._launch_fast(pointers, device, act_scale, torch_current_stream(device))

    def _bind(self, args: Any) -> tuple:
        if not isinstance(args, self.Args):
            raise InvalidProblem(problem_message(self.name, "args", self.Args.__name__, type(args).__name__))
        d = self.desc
        act = checked_operand(self.name, args.input, "input", ElementKind.S8, d.m * d.k)
        _, act_scale = checked_scale(self.name, args.act_scale, np.float32, "act_scale")
        return (act, *self._common(args), act_scale)

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        """The int8 GEMM and epilogue on pre-quantized activations (no workspace).

        Contiguous CUDA ``torch.Tensor`` arrays of the expected dtypes on one device, 16-byte aligned
        ``act`` and weight, ``K % 16 == 0`` and ``stream=None`` take a fast path: their pointers are
        patched into the plan's pre-packed parameter block."""
        if self._fast_specs is not None and stream is None and type(args) is SmoothQuantLinearArgs:
            found = self._fast_pointers(args)
            if found is not None:
                self._launch_found(args, *found)
                return
        act, weight, weight_scale, bias, output, act_scale = self._bind(args)
        d = self.desc
        if d.m == 0 or d.n == 0:
            return
        handle = stream_handle(stream, (act, output), self.name)
        self._gemm(act, weight, None, weight_scale, bias, output, act_scale, handle)
        if output.on_host or act.on_host:
            synchronize(handle)
            finish(output)
