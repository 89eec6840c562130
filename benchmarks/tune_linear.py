"""W8A8 GEMM variants on the GPU: bit-exactness, GPU time, host time, SASS mix. One run, one log.

    python -m benchmarks.tune_linear --out DIR [--only SECTION ...] [--old-root DIR]

For every kernel variant (pipeline shapes of :class:`~baracuda_numba.kernels.linear.PipelineShape`,
skinny chunks in flight) on random data at ragged and full shapes:

- exactness: the output against ``torch._int_mm`` followed by the epilogue as separately rounded
  float32 operations (``(acc * sx) * ws + bias``), and against the register-staged ``tiled``
  kernel, bit for bit;
- GPU time: ten calls captured in a CUDA graph and replayed (no host time), device events, median
  of the replays; ``torch._int_mm`` alone and with its dequant epilogue captured the same way;
  the device-to-device copy bandwidth in the same run;
- host time of ``QuantizedLinearPlan.run`` and ``quantized_linear()`` with torch tensors (``host_calls``:
  every entry point, fused and two-launch, next to torch ops);
- ``fused``: decode GPU time of the fused quantize + GEMM against the two-launch path;
- ``fused_ab``: the fused decode kernel at M = 1 (``quantized_linear``, bf16, weights rotating past L2)
  of this checkout, in its variants, against another checkout's (``--old-root DIR``: a directory holding
  that checkout's ``baracuda_numba``, timed in a subprocess of the same run), with the GEMM alone and the
  copy bandwidth measured before and after; outputs compared bit for bit across the two checkouts;
- graph replay equals eager;
- ``cuobjdump -sass`` instruction mix and ptxas registers of each compiled variant.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import os
import pstats
import re
import subprocess
import sys
import traceback
from collections import Counter
from pathlib import Path

import torch

import baracuda_numba as bn
from baracuda_numba.arrays import adapt
from baracuda_numba.bench import device_ms, graph_ms, host_us
from baracuda_numba.kernels import linear as gemm
from baracuda_numba.ops.common import clear_plan_cache
from baracuda_numba.vocabulary import ElementKind

SHAPES = [gemm.PipelineShape(2, 4, 4, 4, 4), gemm.PipelineShape(2, 4, 4, 8, 3), gemm.PipelineShape(4, 2, 4, 8, 3)]
if os.environ.get("TUNE_LINEAR_MORE_SHAPES"):  # more stages
    SHAPES += [gemm.PipelineShape(2, 4, 4, 4, 5), gemm.PipelineShape(4, 2, 4, 8, 4)]
SKINNY = [(2, 1), (2, 2), (2, 4), (4, 1), (4, 2)]  # (chunks in flight, column tiles per block)
PREFILL = [(4096, 4096, 4096), (2048, 4096, 4096), (2048, 11008, 4096), (2048, 4096, 11008)]
DECODE = [(m, n, k) for m in (1, 16) for n, k in ((4096, 4096), (8192, 8192), (11008, 4096))]
TDTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
ELEMENT = {torch.float32: ElementKind.F32, torch.bfloat16: ElementKind.BF16, torch.float16: ElementKind.F16,
           torch.float64: ElementKind.F64}
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float64: torch.int64}
LOG: list[str] = []


def bit_equal(a, b) -> bool:
    return bool(torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype])))


def say(text: str) -> None:
    print(text, flush=True)
    LOG.append(text)


def copy_gbs() -> float:
    """The ceiling: GB/s (read plus written) of an eager device-to-device copy of 2^28 float32, queued
    behind a busy wait, device events, median (``baracuda_numba.bench``'s measure). Sessions 13-24 timed
    a 1 GiB copy captured in a CUDA graph instead, which runs as a memcpy node at about 2430 GB/s where
    the eager copy gives about 3000 (``benchmarks/probe_copy.py``): their % of copy are ~1.23x these.
    That figure is logged too, as ``graph copy``."""
    src = torch.ones(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    graph = 2 * (1 << 30) / graph_ms(lambda: dst.copy_(src), calls=5, replays=10) / 1e6
    say(f"graph copy (the sessions 13-24 ceiling) {graph:.0f} GB/s")
    return 2 * (1 << 30) / device_ms(lambda: dst.copy_(src), 20) / 1e6


def start_probe(out: str) -> tuple[Path, float]:
    """A probe's output directory (created) and the eager copy's GB/s (the ceiling), with the device logged."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    say(torch.cuda.get_device_name())
    copy = copy_gbs()
    say(f"device-to-device copy {copy:.0f} GB/s")
    return path, copy


def use(shape: gemm.PipelineShape | None = None, skinny: tuple[int, int] | None = None) -> None:
    """Make newly selected plans use this pipeline shape / skinny (chunks in flight, column tiles)."""
    if shape is not None:
        gemm.PIPELINE, gemm.PIPELINE_LARGE = shape, None
    if skinny is not None:
        gemm.SKINNY_CHUNKS, gemm.SKINNY_TILES = skinny
    clear_plan_cache()


SHIPPED = (gemm.PIPELINE, gemm.PIPELINE_LARGE, gemm.SKINNY_CHUNKS, gemm.SKINNY_TILES)


def shipped() -> None:
    """Back to the library's own choices (pipeline shape by waves, skinny tiles by K)."""
    gemm.PIPELINE, gemm.PIPELINE_LARGE, gemm.SKINNY_CHUNKS, gemm.SKINNY_TILES = SHIPPED
    clear_plan_cache()


def skinny_name(skinny: tuple[int, int]) -> str:
    return f"skinny{skinny[0]}x{skinny[1]}"


def problem(m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    bias = torch.randn(n, device="cuda", generator=g)
    return x, w, ws, bias


def gemm_runner(xq, sx, w, ws, bias, out, variant: str | None = None, dependent: bool | None = None):
    """A closure launching only the GEMM + epilogue of a selected QuantizedLinearPlan (per-token
    scales ``sx``) on ``xq``; ``variant`` forces ``tiled`` / ``pipelined``; ``dependent`` False launches
    the dependent skinny kernel (``plans.DEPENDENT_GEMM``) without programmatic stream serialization."""
    m, k = xq.shape
    n = w.shape[0]
    element = ELEMENT[out.dtype]
    desc = bn.QuantizedLinearDescriptor(m, n, k, element, element, bias is not None)
    plan = bn.QuantizedLinearPlan.select(desc)
    if variant is not None:
        plan._aligned_variant = variant
    if dependent is not None:
        plan._variants[plan._aligned_variant][0].dependent = dependent
    ops = [adapt(t, "tune", "t") for t in (xq, w, sx, ws)]
    b = adapt(bias, "tune", "bias") if bias is not None else None
    o = adapt(out, "tune", "out")

    def run():
        plan._gemm(ops[0], ops[1], ops[2], ops[3], b, o, 0.0, torch.cuda.current_stream().cuda_stream,
                   unfused=True)

    return run


def decode_problem(m: int, n: int, k: int, seed: int = 0):
    """A decode problem (see :func:`problem`) with the weight's copies to rotate through (> 200 MB, past
    L2), ``x`` quantized per token (``xq``, ``sx``) and a bf16 output buffer."""
    x, w, ws, bias = problem(m, n, k, seed)
    weights = [w] + [torch.randint_like(w, -128, 128) for _ in range(-(-200_000_000 // (n * k)))]
    r = bn.dynamic_range_quantize(x)
    return x, w, ws, bias, weights, r.q, r.scale.float(), torch.empty(m, n, device="cuda", dtype=torch.bfloat16)


def expected_output(xq, sx, w, ws, bias, dtype):
    m, k = xq.shape
    if m > 16 and k % 8 == 0 and w.shape[0] % 8 == 0:
        acc = torch._int_mm(xq, w.t())
    else:
        acc = (xq.double() @ w.double().t()).to(torch.int32)
    y = (acc.float() * sx[:, None]) * ws[None, :]
    if bias is not None:
        y = y + bias[None, :]
    return y.to(dtype)


def exactness(out_dir: Path) -> list[dict]:
    rows = []
    ragged = [(65, 264, 512), (333, 264, 512), (200, 333, 208), (4096, 4096, 4096), (257, 4096, 11008),
              (17, 264, 512), (1, 4096, 4096), (64, 264, 4096)]
    variants = [("pipelined", s, None) for s in SHAPES] + [("skinny", None, c) for c in SKINNY]
    for kind, shape, chunks in variants:
        use(shape, chunks)
        for m, n, k in ragged:
            if (kind == "skinny") != (m <= gemm.SKINNY_MAX_M):
                continue
            for dtype, with_bias in (("bf16", False), ("f32", True)):  # each pair is a kernel to compile
                tdt = TDTYPE[dtype]
                for _ in range(1):
                    x, w, ws, bias = problem(m, n, k, seed=m + n + k)
                    r = bn.dynamic_range_quantize(x.to(torch.float32))
                    sx = r.scale.to(torch.float64) if dtype == "f64" else r.scale.float()
                    b = bias if with_bias else None
                    out = torch.empty(m, n, device="cuda", dtype=tdt)
                    gemm_runner(r.q, sx, w, ws, b, out)()
                    ref = out.clone()
                    if kind == "pipelined":
                        gemm_runner(r.q, sx, w, ws, b, ref, "tiled")()
                    torch.cuda.synchronize()
                    same_tiled = bit_equal(out, ref)
                    if dtype == "f64":
                        same_torch = None  # float64 epilogue rounds differently from torch's f32 ops
                    else:
                        exp = expected_output(r.q, sx.float(), w, ws, b, tdt)
                        same_torch = bit_equal(out, exp)
                    name = shape.name if shape else skinny_name(chunks)
                    ok = same_tiled and same_torch is not False
                    rows.append({"variant": name, "m": m, "n": n, "k": k, "dtype": dtype, "bias": with_bias,
                                 "equal_tiled": same_tiled, "equal_torch": same_torch})
                    if not ok:
                        say(f"MISMATCH {name} {m}x{n}x{k} {dtype} bias={with_bias}: "
                            f"tiled {same_tiled} torch {same_torch}")
        name = shape.name if shape else skinny_name(chunks)
        mine = [r for r in rows if r["variant"] == name]
        good = sum(r["equal_tiled"] and r["equal_torch"] is not False for r in mine)
        say(f"exactness {name}: {good}/{len(mine)} bit-identical")
    return rows


def prefill_problem(m: int, n: int, k: int):
    """A prefill problem (see :func:`problem`) with ``x`` quantized per token, and the anchors' TOPS in GPU
    time: ``(xq, sx, w, ws, torch._int_mm alone, torch._int_mm + its dequant epilogue to bf16)``."""
    x, w, ws, _ = problem(m, n, k)
    r = bn.dynamic_range_quantize(x)
    xq, sx = r.q, r.scale.float()
    flops = 2 * m * n * k
    raw_ms = graph_ms(lambda: torch._int_mm(xq, w.t()))
    epi_ms = graph_ms(lambda: (torch._int_mm(xq, w.t()).float() * sx[:, None] * ws[None, :]).to(torch.bfloat16))
    return xq, sx, w, ws, flops / raw_ms / 1e9, flops / epi_ms / 1e9


def prefill(copy: float) -> list[dict]:
    rows = []
    for m, n, k in PREFILL:
        xq, sx, w, ws, raw_tops, epi_tops = prefill_problem(m, n, k)
        flops = 2 * m * n * k
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        tiled_ms = graph_ms(gemm_runner(xq, sx, w, ws, None, out, "tiled"))
        row = {"shape": f"{m}x{n}x{k}", "int_mm_TOPS": raw_tops, "int_mm_epi_TOPS": epi_tops,
               "tiled_TOPS": flops / tiled_ms / 1e9}
        for shape in SHAPES:
            use(shape)
            try:
                ms = graph_ms(gemm_runner(xq, sx, w, ws, None, out))
                row[shape.name] = flops / ms / 1e9
            except Exception as exc:
                row[shape.name] = repr(exc)[:80]
        shipped()
        ms = graph_ms(gemm_runner(xq, sx, w, ws, None, out))
        row["shipped_TOPS"] = flops / ms / 1e9
        row["shipped_vs_int_mm_epi"] = row["shipped_TOPS"] / row["int_mm_epi_TOPS"]
        row["shipped_vs_int_mm"] = row["shipped_TOPS"] / row["int_mm_TOPS"]
        say(json.dumps(row, default=lambda v: round(v, 1)))
        rows.append(row)
    return rows


def decode(copy: float) -> list[dict]:
    """Weights rotate through enough copies (> 200 MB) that each call streams its weight from HBM,
    as the layers of a model do, rather than from the 50 MB L2."""
    rows = []
    for m, n, k in DECODE:
        x, _, ws, _, weights, xq, sx, out = decode_problem(m, n, k)
        row = {"shape": f"M={m} {n}x{k}", "copy_GBs": copy, "weights": len(weights)}
        for skinny in SKINNY:
            use(skinny=skinny)
            runners = itertools.cycle([gemm_runner(xq, sx, wi, ws, None, out) for wi in weights])
            ms = graph_ms(lambda runners=runners: next(runners)(), calls=10 * len(weights))
            row[f"{skinny_name(skinny)}_GBs"] = n * k / ms / 1e6
            row[f"{skinny_name(skinny)}_pct"] = 100 * n * k / ms / 1e6 / copy
            calls = itertools.cycle(weights)
            full_ms = graph_ms(lambda calls=calls, x=x, ws=ws: bn.quantized_linear(x, next(calls), ws),
                               calls=10 * len(weights))
            row[f"quantized_linear {skinny_name(skinny)}_GBs"] = n * k / full_ms / 1e6
        shipped()
        runners = itertools.cycle([gemm_runner(xq, sx, wi, ws, None, out) for wi in weights])
        ms = graph_ms(lambda runners=runners: next(runners)(), calls=10 * len(weights))
        row["shipped_GBs"], row["shipped_pct"] = n * k / ms / 1e6, 100 * n * k / ms / 1e6 / copy
        calls = itertools.cycle(weights)
        full_ms = graph_ms(lambda calls=calls, x=x, ws=ws: bn.quantized_linear(x, next(calls), ws),
                           calls=10 * len(weights))
        row["shipped quantized_linear_GBs"] = n * k / full_ms / 1e6
        row["shipped quantized_linear_pct"] = 100 * n * k / full_ms / 1e6 / copy
        say(json.dumps(row, default=lambda v: round(v, 1)))
        rows.append(row)
    return rows


# the cooperative kernel's launch bounds timed (blocks per multiprocessor; session 12: L2 prefetch
# depths 1, 3 and 7 were slower than none; session 15: slower than the dependent two launches at every
# shape, no longer timed)
COOPERATIVE_BLOCKS: tuple[int, ...] = ()
# L2 prefetch depths of the dependent GEMM timed (main-loop iterations asked of L2 before the wait)
DEPENDENT_PREFETCHES: tuple = ()  # None: kernels.linear.dependent_prefetch's rule (session 16: None, 0, 1, 2)
# iterations of weight the dependent GEMM stages in shared memory before the wait, timed (as far as
# kernels.linear.DEPENDENT_STAGE_BYTES holds them)
DEPENDENT_STAGES: tuple[int, ...] = ()  # session 17: 1-4 slower than none at nearly every shape
# ... and by the one-launch kernels before their prologue (fused, cooperative; session 17: slower)
ONE_LAUNCH_STAGES: tuple[int, ...] = ()
# register caps of the dependent GEMM timed (0: ptxas's choice)
DEPENDENT_REGISTERS: tuple[int, ...] = ()  # session 17: 104 / 96 / 88 no faster (co-residency with the quantizer)
FUSED_VARIANT = True  # time the fused kernel too
# the fused kernel launched as a programmatic dependent at every K, asking L2 for this many iterations of
# weight before its wait (fused_e<i>; session 22: 2 ships where it is a dependent, K >= 8192)
FUSED_EARLY: list[int] = []
FUSED_EARLY_MAX_M = 4
# more fused variants, as dependents at every K: label -> knobs (kernels.linear's; plans.linear's under
# "plans."). Session 22 timed 4 column tiles, 2 chunks and launch bounds with and without the first weight
# loaded before the wait (now QuantizedLinearDescriptor.static_weight): notes/gemm.md.
# Session 26 (tune-linear-2026-11-26-s26-call3-default-fused.log) timed the fused kernel without the static
# promise as a programmatic dependent at K = 4096 too and in the static kernel's one-wave shape (2 chunks,
# launch bounds of 2), both now shipped: {"fused_dep": {"plans.FUSED_DEPENDENT_MIN_K": 0}, "fused_wave":
# {"plans.ONE_WAVE_SHAPE": True}, "fused_dep_wave": both} against FUSED_DEPENDENT_MIN_K = 8192 and
# ONE_WAVE_SHAPE = False.
# Calls 4-5 (-call4-one-wave.log, -call5-one-wave-l2.log): iterations asked of L2 before / after the wait in
# that shape (FUSED_EARLY_L2 / plans.ONE_WAVE_PREFETCH_L2: 2 / 0 shipped), {f"fused_e{e}_pf{p}": ... for e, p
# in ((2, 1), (1, 1), (1, 0), (0, 0), (3, 0), (4, 1))}.
FUSED_EXTRA: dict[str, dict] = {
    "fused_before": {"plans.FUSED_DEPENDENT_MIN_K": 8192, "plans.ONE_WAVE_SHAPE": False}}
# knobs of the two-launch decode GEMM timed both alone (gemm_only_<label>) and after the quantizer
# (two_launch_<label>): label -> knobs (as FUSED_EXTRA's). Session 25: with 4 column tiles (K >= 8192) and 2
# chunks the dependent GEMM takes 140 registers, one block of 256 threads per SM (local ptxas); launch bounds
# of 2 give 128 with 40 bytes spilled, 1 chunk 128 with none. Call 2 timed {"b2": {"DEPENDENT_MIN_BLOCKS":
# 2}, "c1": {"DEPENDENT_CHUNKS": 1}} against none (kernels.linear.MULTI_WAVE_WIDE_CHUNKS and
# dependent_min_blocks() ship what won); {"b0": {"DEPENDENT_MIN_BLOCKS": 0}, "c2": {"DEPENDENT_CHUNKS": 2}}
# timed the kernels before them (session 26, call 7: 79.6-79.9 / 83.2-84.4 against 80.9-84.5 shipped at 4096^2).
GEMM_EXTRA: dict[str, dict] = {}
# time the shipped selection with static_weight=True too (the fused kernel's weight loads before its wait)
STATIC_VARIANT = True
# more static_weight=True variants: label -> knobs (as FUSED_EXTRA's). Session 23: the static fused kernel at
# every M (x_loads of 4 / 8 measured alike at M <= 2, 8 better at M = 4; 16 spills and is slower), and asking
# L2 for 1-3 more iterations of weight after its wait, before its prologue (FUSED_PREFETCH_L2).
# Session 24: the prologue compiled for the plan's M and K (kernels.linear.FIXED_PROLOGUE) against the
# general one, fusing up to 4 tokens ({"static_fixed": {"plans.STATIC_FUSED_MAX_M": 4}, "static_general":
# {"plans.STATIC_FUSED_MAX_M": 4, "FIXED_PROLOGUE": False}}). Next: the fixed prologue at M = 8 (16 pieces a
# thread: 119 registers, no spill, local ptxas; M > 8 would take the general prologue at 16, which spills).
# Session 25 (tune-linear-2026-11-26-s25-call1-ceiling.log, % of the eager copy): {"static_fixed8":
# {"WIDE_X_LOADS_MAX": 16, "plans.STATIC_FUSED_MAX_M": 8}} at 4096^2 M = 8: 45.1% against 55.8 for the two
# launches; not shipped.
STATIC_EXTRA: dict[str, dict] = {}
# SmoothQuant's GEMM alone without the static promise with these knobs too: label -> knobs. Session 26:
# without the L2 prefetch before its wait (plans.WAIT_FIRST_EARLY_L2).
SMOOTHQUANT_EXTRA: dict[str, dict] = {"e0": {"plans.WAIT_FIRST_EARLY_L2": 0}}
# the same for SmoothQuant's GEMM under the static promise (smoothquant_static_<label>)
STATIC_SMOOTHQUANT_EXTRA: dict[str, dict] = {}
# quantized_linear with a static activation scale (W8A8Linear's static step in one call, static weight) with these
# knobs too (static_act_<label>). Session 33: the static quantizer's launch against the three launches before it
# ({"three": {"plans.STATIC_QUANTIZER": False}}) and plain ({"plain": {"plans.STATIC_QUANTIZER_DEPENDENT": False}});
# the two launches where the fused kernel runs ({"two": {name: 0 for name in the fused kernel's token limits}}).
STATIC_ACT_EXTRA: dict[str, dict] = {}
# Session 23's (-call3-prefetch.log): {"static_fused": {"plans.STATIC_FUSED_MAX_M": 4}, **{f"static_pf{p}":
# {"plans.STATIC_FUSED_MAX_M": 4, "FUSED_PREFETCH_L2": p} for p in (1, 2, 3)}}
# the knobs the variants override (each restored after): kernels.linear's, and plans.dynamic's /
# plans.linear's under a "dynamic." / "plans." prefix
GEMM_KNOBS = ("DEPENDENT_PRELOAD", "DEPENDENT_CHUNKS", "DEPENDENT_MIN_BLOCKS", "DEPENDENT_PREFETCH_L2",
              "DEPENDENT_STAGED", "DEPENDENT_MAX_REGISTERS", "FUSED_STAGED", "COOPERATIVE_STAGED",
              "COOPERATIVE_MIN_BLOCKS", "SKINNY_TILES", "ONE_LAUNCH_CHUNKS", "FUSED_MIN_BLOCKS", "FUSED_EARLY_L2",
              "WIDE_X_LOADS_MAX", "FUSED_PREFETCH_L2", "FIXED_PROLOGUE", "plans.STATIC_FUSED_MAX_M",
              "dynamic.DEPENDENT_SEGMENTS_MAX", "dynamic.TUNING",
              "plans.FUSED_DEPENDENT_MIN_K", "plans.ONE_WAVE_SHAPE", "plans.STATIC_ONE_WAVE_PREFETCH_L2",
              "plans.ONE_WAVE_PREFETCH_L2", "plans.WAIT_FIRST_EARLY_L2",
              "plans.QUANTIZER_DEPENDENT_MIN_WEIGHT", "WEIGHT_LOAD_HINT", "plans.WIDE_TILES",
              "plans.WIDE_TILES_MIN_M", "plans.STATIC_SMOOTHQUANT_WIDE", "plans.WIDE_TILES_MAX_FEW_TOKENS",
              "plans.STATIC_SMOOTHQUANT_ONE_WAVE_PREFETCH", "plans.STATIC_QUANTIZER",
              "plans.STATIC_QUANTIZER_DEPENDENT", "plans.STATIC_QUANTIZER_THREADS",
              "plans.STATIC_QUANTIZER_BLOCKS_PER_SM", "plans.FUSED_MAX_M", "plans.FUSED_ANY_SHAPE_MAX_M",
              "plans.ONE_WAVE_FUSED_MAX_M", "plans.WIDE_FUSED_MAX_M", "plans.WIDE_ONE_WAVE_FUSED_MAX_M")
# launch variants timed: the quantizer and the fused kernel launched plainly (not as programmatic
# dependents of the kernel before them)
PLAIN_LAUNCH_VARIANTS = False  # session 17's table has them


def knob_module(name: str):
    """The module a GEMM_KNOBS name lives in, and the attribute."""
    from baracuda_numba.plans import dynamic as plans_dynamic
    from baracuda_numba.plans import linear as plans_linear

    prefix, _, attribute = name.rpartition(".")
    return {"": gemm, "dynamic": plans_dynamic, "plans": plans_linear}[prefix], attribute
FUSED_DECODE = [(m, n, k) for n, k in ((4096, 4096), (8192, 8192), (11008, 4096), (4096, 11008), (8192, 4096))
                for m in (1, 2, 4, 8, 16)]


def fused_decode(copy: float) -> list[dict]:
    """``quantized_linear`` at decode, GPU time: the fused kernel (x quantized inside the skinny GEMM by
    every block, one launch), the cooperative one (x quantized by M blocks for all, one launch) and the
    two-launch path (dynamic quantizer, then the skinny GEMM), against the GEMM alone on pre-quantized
    activations and a device-to-device copy of the weight's bytes, at every M (whatever ``FUSED_MAX_M``
    / ``COOPERATIVE_MAX_M`` ship). Weights rotate past L2 as in :func:`decode`; every output is checked
    bit for bit against the two-launch one."""
    from baracuda_numba.plans import linear as plans

    shipped_limits = (plans.FUSED_MAX_M, plans.FUSED_MAX_N, plans.COOPERATIVE_MAX_M, plans.DEPENDENT_GEMM,
                      plans.FUSED_MIN_K, plans.FUSED_MIN_N, plans.FUSED_ANY_SHAPE_MAX_M,
                      plans.FUSED_ANY_SHAPE_MAX_WEIGHT)
    rows = []
    for m, n, k in FUSED_DECODE:
        x, w, ws, bias, weights, xq, sx, out = decode_problem(m, n, k, seed=m + n)
        row = {"shape": f"M={m} {n}x{k}", "copy_GBs": copy}
        shipped()
        # the GEMM alone: the dependent kernel (launched as such / as a plain kernel) and the plain one
        for label, dependent_gemm, launch_dependent in (("", True, None), ("_plain", False, None)):
            plans.DEPENDENT_GEMM = dependent_gemm
            clear_plan_cache()
            runners = itertools.cycle([gemm_runner(xq, sx, wi, ws, None, out, dependent=launch_dependent)
                                       for wi in weights])
            ms = graph_ms(lambda runners=runners: next(runners)(), calls=10 * len(weights))
            row[f"gemm_only{label}_pct"] = 100 * n * k / ms / 1e6 / copy
        plans.DEPENDENT_GEMM = shipped_limits[3]
        saved_knobs = {name: getattr(*knob_module(name)) for name in GEMM_KNOBS}
        for label, knobs in GEMM_EXTRA.items():
            for name, value in knobs.items():
                setattr(*knob_module(name), value)
            clear_plan_cache()
            runners = itertools.cycle([gemm_runner(xq, sx, wi, ws, None, out) for wi in weights])
            ms = graph_ms(lambda runners=runners: next(runners)(), calls=10 * len(weights))
            row[f"gemm_only_{label}_pct"] = 100 * n * k / ms / 1e6 / copy
            for name, value in saved_knobs.items():
                setattr(*knob_module(name), value)
        if m == 1:  # the weight's bytes copied (read and written), sources and targets rotated past L2
            pairs = itertools.cycle([(wi, torch.empty_like(wi)) for wi in weights])
            ms = graph_ms(lambda pairs=pairs: (lambda src, dst: dst.copy_(src))(*next(pairs)), calls=10 * len(weights))
            row["copy_of_weight_pct"] = 100 * 2 * n * k / ms / 1e6 / copy
        # two_launch: the GEMM as the quantizer's programmatic dependent, as shipped; the other variants
        # override knobs of kernels.linear (GEMM_KNOBS): _l2p<i>: i iterations asked of L2 before the
        # wait; _st<i>: i iterations staged in shared memory; _r<i>: compiled to i registers; fused /
        # cooperative: the one-launch kernels (_b<i>: launch bounds, _st<i>: staged)
        variants = [("two_launch", 0, 0, True, {})]
        variants += [(f"two_launch_{label}", 0, 0, True, knobs) for label, knobs in GEMM_EXTRA.items()]
        variants += [(f"two_launch_l2p{p}", 0, 0, True, {"DEPENDENT_PREFETCH_L2": p}) for p in DEPENDENT_PREFETCHES
                     if p != gemm.DEPENDENT_PREFETCH_L2]
        variants += [(f"two_launch_st{st}", 0, 0, True, {"DEPENDENT_STAGED": st}) for st in DEPENDENT_STAGES
                     if st != gemm.DEPENDENT_STAGED]
        variants += [(f"two_launch_r{r}", 0, 0, True, {"DEPENDENT_MAX_REGISTERS": r}) for r in DEPENDENT_REGISTERS
                     if r != gemm.DEPENDENT_MAX_REGISTERS]
        variants += [("two_launch_qplain", 0, 0, True, {"dynamic.DEPENDENT_SEGMENTS_MAX": 0,
                                                         "plans.QUANTIZER_DEPENDENT_MIN_WEIGHT": 1 << 62}),
                     ("two_launch_qdep", 0, 0, True, {"dynamic.DEPENDENT_SEGMENTS_MAX": 64})
                     ] if PLAIN_LAUNCH_VARIANTS else []
        variants += [("fused", 16, 0, True, {})] if FUSED_VARIANT else []
        variants += [("fused_plain", 16, 0, True, {"plans.FUSED_DEPENDENT_MIN_K": 1 << 30}),
                     ("fused_dep", 16, 0, True, {"plans.FUSED_DEPENDENT_MIN_K": 0})
                     ] if FUSED_VARIANT and PLAIN_LAUNCH_VARIANTS else []
        variants += [(f"fused_st{st}", 16, 0, True, {"FUSED_STAGED": st}) for st in ONE_LAUNCH_STAGES]
        variants += [(f"fused_e{e}", 16, 0, True, {"FUSED_EARLY_L2": e, "plans.FUSED_DEPENDENT_MIN_K": 0})
                     for e in FUSED_EARLY if m <= FUSED_EARLY_MAX_M]
        variants += [(f"cooperative_b{b}", 0, 16, True, {"COOPERATIVE_MIN_BLOCKS": b}) for b in COOPERATIVE_BLOCKS]
        variants += [(f"cooperative_st{st}", 0, 16, True, {"COOPERATIVE_STAGED": st, "COOPERATIVE_MIN_BLOCKS": 0})
                     for st in ONE_LAUNCH_STAGES]
        variants += [(label, 16, 0, True, knobs) for label, knobs in FUSED_EXTRA.items() if m <= FUSED_EARLY_MAX_M]
        outputs = {}
        for label, fused_max_m, cooperative_max_m, dependent, knobs in variants:
            plans.FUSED_MAX_M, plans.FUSED_MAX_N, plans.COOPERATIVE_MAX_M = fused_max_m, 1 << 30, cooperative_max_m
            plans.DEPENDENT_GEMM, plans.FUSED_MIN_K, plans.FUSED_MIN_N = dependent, 0, 0
            plans.FUSED_ANY_SHAPE_MAX_M, plans.FUSED_ANY_SHAPE_MAX_WEIGHT = fused_max_m, 1 << 62
            for name, value in {**saved_knobs, **knobs}.items():
                setattr(*knob_module(name), value)
            clear_plan_cache()
            outputs[label] = bn.quantized_linear(x, w, ws, bias=bias)
            calls = itertools.cycle(weights)
            ms = graph_ms(lambda calls=calls, x=x, ws=ws: bn.quantized_linear(x, next(calls), ws),
                          calls=10 * len(weights))
            row[f"{label}_us"] = 1e3 * ms
            row[f"{label}_pct"] = 100 * n * k / ms / 1e6 / copy
        (plans.FUSED_MAX_M, plans.FUSED_MAX_N, plans.COOPERATIVE_MAX_M, plans.DEPENDENT_GEMM, plans.FUSED_MIN_K,
         plans.FUSED_MIN_N, plans.FUSED_ANY_SHAPE_MAX_M, plans.FUSED_ANY_SHAPE_MAX_WEIGHT) = shipped_limits
        for name, value in saved_knobs.items():
            setattr(*knob_module(name), value)
        shipped()
        clear_plan_cache()
        plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16"))
        row["shipped"] = plan.kernel_variant(bn.QuantizedLinearArgs(x, w, ws, out))
        for label, static in (("shipped", False), ("static", True)) if STATIC_VARIANT else ():
            outputs[label] = bn.quantized_linear(x, w, ws, bias=bias, static_weight=static)
            calls = itertools.cycle(weights)
            ms = graph_ms(lambda calls=calls, x=x, ws=ws, static=static:
                          bn.quantized_linear(x, next(calls), ws, static_weight=static), calls=10 * len(weights))
            row[f"{label}_us"], row[f"{label}_pct"] = 1e3 * ms, 100 * n * k / ms / 1e6 / copy
        plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16", False, True))
        row["static"] = plan.kernel_variant(bn.QuantizedLinearArgs(x, w, ws, out))
        for label, knobs in STATIC_EXTRA.items() if STATIC_VARIANT else ():
            for name, value in knobs.items():
                setattr(*knob_module(name), value)
            clear_plan_cache()
            outputs[label] = bn.quantized_linear(x, w, ws, bias=bias, static_weight=True)
            calls = itertools.cycle(weights)
            ms = graph_ms(lambda calls=calls, x=x, ws=ws:
                          bn.quantized_linear(x, next(calls), ws, static_weight=True), calls=10 * len(weights))
            row[f"{label}_us"], row[f"{label}_pct"] = 1e3 * ms, 100 * n * k / ms / 1e6 / copy
            for name, value in saved_knobs.items():
                setattr(*knob_module(name), value)
            clear_plan_cache()
        # SmoothQuant (int8 activations, one static scale): the GEMM alone, plain / with a static weight
        # (a programmatic dependent loading its weight before its wait), W8A8Linear's static step as two
        # calls (quantize_per_tensor of x, then the static GEMM) and as one (quantized_linear with act_scale)
        act = torch.clamp(torch.round(x.float() * 50), -127, 127).to(torch.int8)
        sq_outputs = []
        sq_variants = [("smoothquant", False, False, {}), ("smoothquant_static", True, False, {}),
                       ("sq_step_static", True, True, {}), ("static_act", True, None, {}),
                       ("static_act_dw", False, None, {})]
        sq_variants += [(f"static_act_{extra}", True, None, knobs) for extra, knobs in STATIC_ACT_EXTRA.items()]
        sq_variants += [(f"smoothquant_{extra}", False, False, knobs) for extra, knobs in SMOOTHQUANT_EXTRA.items()]
        sq_variants += [(f"smoothquant_static_{extra}", True, False, knobs)
                        for extra, knobs in STATIC_SMOOTHQUANT_EXTRA.items()]
        for label, static, quantize, knobs in sq_variants:
            for name, value in {**saved_knobs, **knobs}.items():
                setattr(*knob_module(name), value)
            clear_plan_cache()
            def step(calls, static=static, quantize=quantize, x=x, act=act, ws=ws):
                if quantize is None:
                    return bn.quantized_linear(x, next(calls), ws, static_weight=static, act_scale=0.02)
                a = bn.quantize_per_tensor(x, 0.02, q_min=-127, q_max=127) if quantize else act
                return bn.smoothquant_linear(a, next(calls), ws, 0.02, dtype="bfloat16", static_weight=static)
            sq_outputs.append(step(iter([w])))
            calls = itertools.cycle(weights)
            ms = graph_ms(lambda calls=calls, step=step: step(calls), calls=10 * len(weights))
            row[f"{label}_us"], row[f"{label}_pct"] = 1e3 * ms, 100 * n * k / ms / 1e6 / copy
        for name, value in saved_knobs.items():
            setattr(*knob_module(name), value)
        clear_plan_cache()
        row["smoothquant variants == plain"] = all(bit_equal(sq_outputs[0], v) for i, v in enumerate(sq_outputs)
                                                   if sq_variants[i][2] is False)
        row["smoothquant static == plain"] = bit_equal(sq_outputs[0], sq_outputs[1])
        row["static_act == sq_step"] = all(bit_equal(sq_outputs[2], v) for i, v in enumerate(sq_outputs)
                                           if sq_variants[i][2] is None)
        row["all == two_launch"] = all(bit_equal(outputs["two_launch"], v) for v in outputs.values())
        say(json.dumps(row, default=lambda v: round(v, 1)))
        rows.append(row)
    return rows


# skinny-kernel knobs of kernels.linear timed against the shipped ones (double-buffered weight
# fragments, launch bounds, column tiles, chunks in flight). Session 14 also timed bulk L2 prefetches
# of each block's weight rows (cp.async.bulk.prefetch.L2, 1 KiB to whole rows ahead): 3-24 points
# slower at 8192^2 and 11008 x 4096, +1-4 at 4096^2 only (notes/gemm.md); removed.
KNOBS = [("shipped", {}), ("gemm_c1", {"VECTOR_CHUNKS": 1}), ("one_launch_c2", {"ONE_LAUNCH_CHUNKS": 2})]
KNOB_DECODE = [(m, n, k) for n, k in ((4096, 4096), (8192, 8192), (11008, 4096)) for m in (1, 2, 4, 16)]


def knob_decode(copy: float) -> list[dict]:
    """Decode GPU time under each of ``KNOBS``: the GEMM alone on pre-quantized activations and
    ``quantized_linear`` as shipped (fused / cooperative), weights rotating past L2 as in :func:`decode`;
    every output bit-compared with the shipped knobs' one."""
    names = {name for _, knobs in KNOBS for name in knobs}
    shipped_knobs = {name: getattr(gemm, name) for name in names}
    rows = []
    for m, n, k in KNOB_DECODE:
        x, w, ws, _, weights, xq, sx, out = decode_problem(m, n, k, seed=m + n)
        row = {"shape": f"M={m} {n}x{k}", "copy_GBs": copy}
        first: dict = {}
        for label, knobs in KNOBS:
            for name, value in {**shipped_knobs, **knobs}.items():
                setattr(gemm, name, value)
            clear_plan_cache()
            gemm_runner(xq, sx, w, ws, None, out)()
            outputs = {"gemm": out.clone(), "full": bn.quantized_linear(x, w, ws)}
            first = first or outputs
            row[f"{label} equal"] = all(bit_equal(first[key], v) for key, v in outputs.items())
            runners = itertools.cycle([gemm_runner(xq, sx, wi, ws, None, out) for wi in weights])
            ms = graph_ms(lambda runners=runners: next(runners)(), calls=10 * len(weights))
            row[f"gemm {label}_pct"] = 100 * n * k / ms / 1e6 / copy
            calls = itertools.cycle(weights)
            ms = graph_ms(lambda calls=calls, x=x, ws=ws: bn.quantized_linear(x, next(calls), ws),
                          calls=10 * len(weights))
            row[f"linear {label}_pct"] = 100 * n * k / ms / 1e6 / copy
        for name, value in shipped_knobs.items():
            setattr(gemm, name, value)
        clear_plan_cache()
        say(json.dumps(row, default=lambda v: round(v, 1)))
        rows.append(row)
    return rows


def profile_decode() -> None:
    """One launch each of the decode kernels at N = K = 4096 (GEMM alone, quantized_linear as shipped)
    under every ``KNOBS`` variant, for Nsight Compute (``ncu -k regex:w8a8``)."""
    names = {name for _, knobs in KNOBS for name in knobs}
    shipped_knobs = {name: getattr(gemm, name) for name in names}
    for m in (1, 16):
        x, w, ws, _ = problem(m, 4096, 4096)
        r = bn.dynamic_range_quantize(x)
        out = torch.empty(m, 4096, device="cuda", dtype=torch.bfloat16)
        for _, knobs in KNOBS:
            for name, value in {**shipped_knobs, **knobs}.items():
                setattr(gemm, name, value)
            clear_plan_cache()
            gemm_runner(r.q, r.scale.float(), w, ws, None, out)()
            bn.quantized_linear(x, w, ws)
            torch.cuda.synchronize()
    for name, value in shipped_knobs.items():
        setattr(gemm, name, value)
    clear_plan_cache()


AB_DECODE = [(1, 4096, 4096), (1, 8192, 8192), (1, 11008, 4096)]


def fused_variants() -> list[tuple[str, dict]]:
    """The fused kernel's variants in this checkout: (name, module attributes of ``kernels.linear``);
    the first is the shipped one. A checkout without these knobs has only ``shipped``."""
    if not hasattr(gemm, "FUSED_PREFETCH_L2"):
        return [("shipped", {})]
    base = {"FUSED_PREFETCH_L2": gemm.FUSED_PREFETCH_L2, "FUSED_MIN_BLOCKS": gemm.FUSED_MIN_BLOCKS}
    other_blocks = 0 if base["FUSED_MIN_BLOCKS"] else 3
    return [("shipped", base), ("l2_prefetch_1", {**base, "FUSED_PREFETCH_L2": 1}),
            ("l2_prefetch_2", {**base, "FUSED_PREFETCH_L2": 2}),
            (f"min_blocks_{other_blocks}", {**base, "FUSED_MIN_BLOCKS": other_blocks})]


def fused_side(side: str, copy: float, save: Path | None, only: list[str] | None = None) -> list[dict]:
    """GPU time of ``quantized_linear`` at M = 1 on the fused kernel (every variant of this checkout),
    of the GEMM alone on pre-quantized rows, and host time of the shipped call; one JSON row per
    (variant, shape), printed with an ``AB`` prefix. ``save``: the shipped outputs (first weight),
    for the bit comparison across checkouts. ``only``: these variants (the shipped one always)."""
    from baracuda_numba.plans import linear as plans

    rows, outputs = [], {}
    variants = [v for v in fused_variants() if v[0] == "shipped" or not only or v[0] in only]
    for m, n, k in AB_DECODE:
        x, w, ws, bias = problem(m, n, k, seed=m + n)
        weights = [w] + [torch.randint_like(w, -128, 128) for _ in range(-(-200_000_000 // (n * k)))]
        shipped()
        r = bn.dynamic_range_quantize(x)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        runners = itertools.cycle([gemm_runner(r.q, r.scale.float(), wi, ws, None, out) for wi in weights])
        gemm_ms = graph_ms(lambda runners=runners: next(runners)(), calls=10 * len(weights))
        for name, knobs in variants:
            for attr, value in knobs.items():
                setattr(gemm, attr, value)
            clear_plan_cache()
            plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16"))
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            args = bn.QuantizedLinearArgs(x, w, ws, y)
            variant = plan.kernel_variant(args)
            got = bn.quantized_linear(x, w, ws, bias=bias)
            calls = itertools.cycle(weights)
            ms = graph_ms(lambda calls=calls, x=x, ws=ws: bn.quantized_linear(x, next(calls), ws),
                          calls=10 * len(weights))
            row = {"side": side, "variant": name, "shape": f"M={m} {n}x{k}", "kernel": variant,
                   "fused_us": 1e3 * ms, "fused_GBs": n * k / ms / 1e6, "fused_pct_copy": 100 * n * k / ms / 1e6 / copy,
                   "gemm_only_us": 1e3 * gemm_ms, "gemm_only_pct_copy": 100 * n * k / gemm_ms / 1e6 / copy}
            if name == "shipped":
                outputs[f"{m}x{n}x{k}"] = got.cpu()
                fused_max_m = plans.FUSED_MAX_M, plans.FUSED_ANY_SHAPE_MAX_M
                plans.FUSED_MAX_M = plans.FUSED_ANY_SHAPE_MAX_M = 0  # the two-launch path
                clear_plan_cache()
                two = bn.quantized_linear(x, w, ws, bias=bias)
                plans.FUSED_MAX_M, plans.FUSED_ANY_SHAPE_MAX_M = fused_max_m
                clear_plan_cache()
                row["fused == two_launch"] = bit_equal(got, two)
                row["host quantized_linear() us"] = host_us(lambda x=x, w=w, ws=ws: bn.quantized_linear(x, w, ws),
                                                            calls=500)
            else:
                row["== shipped"] = bit_equal(got, outputs[f"{m}x{n}x{k}"].cuda())
            print("AB " + json.dumps(row), flush=True)
            rows.append(row)
        shipped()
        for attr, value in variants[0][1].items():
            setattr(gemm, attr, value)
        clear_plan_cache()
        del weights
        torch.cuda.empty_cache()
    if save is not None:
        torch.save(outputs, save)
    return rows


def fused_ab(copy: float, out_dir: Path, old_root: str | None, only: list[str] | None = None) -> dict:
    """:func:`fused_side` of another checkout (``old_root``, in a subprocess: its own ``baracuda_numba``
    first on the path) and of this one, the copy bandwidth again after both, and the ratios."""
    rows, same = [], None
    if old_root:
        old_save = out_dir / "fused_ab_old.pt"
        # old_root first, then the rest of PYTHONPATH (the GPU machine's NumPy 2.4 lives there) without
        # this checkout's root: session 6's old side imported NumPy 2.5 and numba-cuda failed
        here = Path(__file__).resolve().parent.parent
        kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != here]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(old_root).resolve()), *kept])}
        # run as a script from old_root: neither this checkout's root nor its package on sys.path
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--side", "old", "--copy", str(copy),
                               "--save", str(old_save)], cwd=old_root, env=env, capture_output=True, text=True,
                              timeout=400)
        for line in proc.stdout.splitlines():
            if line.startswith("AB "):
                rows.append(json.loads(line[3:]))
            else:
                say(f"[old] {line}")
        if proc.returncode:
            say(f"[old] exit {proc.returncode}\n{proc.stderr[-3000:]}")
    new_save = out_dir / "fused_ab_new.pt"
    rows += fused_side("new", copy, new_save, only)
    if old_root and (out_dir / "fused_ab_old.pt").exists():
        old, new = torch.load(out_dir / "fused_ab_old.pt"), torch.load(new_save)
        same = {key: bit_equal(old[key], new[key]) for key in new if key in old}
    copy_after = copy_gbs()
    say(f"device-to-device copy {copy_after:.0f} GB/s after (before {copy:.0f}); percentages against before")
    for row in rows:
        say(json.dumps(row, default=lambda v: round(v, 2) if isinstance(v, float) else v))
    say(f"old == new outputs (bit for bit, shipped variants): {same}")
    say("| shape | side | variant | fused us | fused GB/s | % of copy | GEMM alone % | new / old |")
    say("|---|---|---|---|---|---|---|---|")
    for row in rows:
        old = next((r for r in rows if r["side"] == "old" and r["shape"] == row["shape"]), None)
        ratio = f"{old['fused_us'] / row['fused_us']:.2f}x" if old and row["side"] == "new" else ""
        say(f"| {row['shape']} | {row['side']} | {row['variant']} | {row['fused_us']:.2f} | {row['fused_GBs']:.0f} | "
            f"{row['fused_pct_copy']:.1f} | {row['gemm_only_pct_copy']:.1f} | {ratio} |")
    return {"rows": rows, "old_equals_new": same, "copy_after_GBs": copy_after}


def write_profile(call, calls: int, top: int, path: Path) -> None:
    """cProfile of ``calls`` runs of ``call``, its ``top`` functions by own time, into ``path``."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    path.write_text(text.getvalue())


def host_calls(out_dir: Path) -> dict:
    """Host microseconds per call (best of 5 x 1000, torch CUDA tensors, 16 x 4096 @ 4096 x 4096 bf16),
    a torch op timed the same way, and the profile of ``quantized_linear()``."""
    shipped()
    x, w, ws, bias = problem(16, 4096, 4096)
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(16, 4096, 4096, "bf16", "bf16"))
    out = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)
    workspace = torch.empty(plan.workspace_size(), device="cuda", dtype=torch.uint8)
    args = bn.QuantizedLinearArgs(x, w, ws, out)
    act = torch.randint(-127, 128, (16, 4096), device="cuda", dtype=torch.int8)
    sq_plan = bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(16, 4096, 4096, "bf16"))
    sq_args = bn.SmoothQuantLinearArgs(act, w, ws, 0.02, out)
    small = torch.randn(64, 64, device="cuda")
    x1 = x[:1].clone()
    plan1 = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(1, 4096, 4096, "bf16", "bf16"))
    args1 = bn.QuantizedLinearArgs(x1, w, ws, out[:1])
    result = {"variant": plan.kernel_variant(args),
              "QuantizedLinearPlan.run (workspace given) us": host_us(lambda: plan.run(args, workspace)),
              "QuantizedLinearPlan.run (no workspace) us": host_us(lambda: plan.run(args)),
              "quantized_linear() us": host_us(lambda: bn.quantized_linear(x, w, ws)),
              "M=1 variant": plan1.kernel_variant(args1),
              "M=1 QuantizedLinearPlan.run us": host_us(lambda: plan1.run(args1)),
              "M=1 quantized_linear() us": host_us(lambda: bn.quantized_linear(x1, w, ws)),
              "quantized_linear(out=) us": host_us(lambda: bn.quantized_linear(x, w, ws, out=out)),
              "quantized_linear(bias=) us": host_us(lambda: bn.quantized_linear(x, w, ws, bias=bias)),
              "static quantized_linear(act_scale=) us": host_us(
                  lambda: bn.quantized_linear(x, w, ws, static_weight=True, act_scale=0.02)),
              "SmoothQuantLinearPlan.run us": host_us(lambda: sq_plan.run(sq_args)),
              "smoothquant_linear() us": host_us(lambda: bn.smoothquant_linear(act, w, ws, 0.02, dtype="bfloat16")),
              "torch.mm 64x64 f32 us": host_us(lambda: torch.mm(small, small)),
              "torch.empty(4096, int8) us": host_us(lambda: torch.empty(4096, dtype=torch.int8, device="cuda"))}
    from baracuda_numba.plans import linear as plans

    shipped_max_m, shipped_cooperative = (plans.FUSED_MAX_M, plans.FUSED_ANY_SHAPE_MAX_M), plans.COOPERATIVE_MAX_M
    plans.FUSED_MAX_M = plans.FUSED_ANY_SHAPE_MAX_M = plans.COOPERATIVE_MAX_M = 0
    clear_plan_cache()
    two = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(16, 4096, 4096, "bf16", "bf16"))
    result["two-launch QuantizedLinearPlan.run (workspace given) us"] = host_us(lambda: two.run(args, workspace))
    result["two-launch quantized_linear() us"] = host_us(lambda: bn.quantized_linear(x, w, ws))
    shipped_min = plans.FUSED_MIN_K, plans.FUSED_MIN_N
    plans.FUSED_MAX_M, plans.FUSED_MIN_K, plans.FUSED_MIN_N = 16, 0, 0
    plans.FUSED_ANY_SHAPE_MAX_M = 16
    clear_plan_cache()
    fused16 = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(16, 4096, 4096, "bf16", "bf16"))
    result["fused M=16 QuantizedLinearPlan.run us"] = host_us(lambda: fused16.run(args))
    (plans.FUSED_MAX_M, plans.FUSED_ANY_SHAPE_MAX_M), plans.COOPERATIVE_MAX_M = shipped_max_m, shipped_cooperative
    plans.FUSED_MIN_K, plans.FUSED_MIN_N = shipped_min
    clear_plan_cache()
    write_profile(lambda: bn.quantized_linear(x, w, ws), 2000, 15, out_dir / "host_profile.txt")
    say(json.dumps(result, default=lambda v: round(v, 2) if isinstance(v, float) else v))
    return result


def host_and_graph(out_dir: Path) -> dict:
    shipped()
    x, w, ws, bias = problem(16, 4096, 4096)
    result = {}
    desc = bn.QuantizedLinearDescriptor(16, 4096, 4096, "bf16", "bf16")
    plan = bn.QuantizedLinearPlan.select(desc)
    out = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)
    workspace = torch.empty(plan.workspace_size(), device="cuda", dtype=torch.uint8)
    args = bn.QuantizedLinearArgs(x, w, ws, out)
    result["plan.run us"] = host_us(lambda: plan.run(args, workspace))
    result["quantized_linear() us"] = host_us(lambda: bn.quantized_linear(x, w, ws))
    result["torch.mm bf16 us"] = host_us(lambda: torch.mm(x, x.t()))
    write_profile(lambda: bn.quantized_linear(x, w, ws), 300, 25, out_dir / "host_profile.txt")
    # graph capture: replay equals eager, both kernels and the quantize
    for m, n, k in ((16, 4096, 4096), (300, 1000, 512)):
        x, w, ws, bias = problem(m, n, k, seed=7)
        eager = bn.quantized_linear(x, w, ws, bias=bias)
        static_out = torch.empty_like(eager)
        bn.quantized_linear(x, w, ws, bias=bias, out=static_out)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            bn.quantized_linear(x, w, ws, bias=bias, out=static_out)
        static_out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        result[f"graph replay == eager {m}x{n}x{k}"] = bool(torch.equal(static_out, eager))
    say(json.dumps(result))
    return result


def sass(out_dir: Path) -> list[dict]:
    rows = []
    kernels = [(s.name, gemm.linear_kernel(ElementKind.BF16, False, False, False, s)) for s in SHAPES]
    kernels += [(skinny_name(c), gemm.linear_kernel(ElementKind.BF16, False, False, True, None, *c)) for c in SKINNY]
    kernels.append(("tiled", gemm.linear_kernel(ElementKind.BF16, False, False)))
    vector = gemm.linear_kernel(ElementKind.BF16, False, False, True, None, gemm.skinny_chunks(), 2,
                                double_buffer=True, vector_only=True)
    kernels.append(("skinny_vector", vector))
    # the dependent decode GEMMs as shipped: 2 tiles under launch bounds of 2 (4096^2, after the quantizer),
    # 1 chunk of 4 tiles (8192^2), 1 chunk of 2 tiles (three blocks per SM: 4240-6336 rows at K < 8192), and
    # SmoothQuant's waiting first (per-tensor rows)
    for name, chunks, tiles, wait_first in (("dependent_2x2", 2, 2, False), ("dependent_1x4", 1, 4, False),
                                            ("dependent_1x2", 1, 2, False),
                                            ("smoothquant_dependent_w_2x2", 2, 2, True)):
        kernels.append((name, gemm.linear_kernel(ElementKind.BF16, False, wait_first, True, None, chunks, tiles,
                                                 double_buffer=True, vector_only=True, dependent=1,
                                                 fused_min_blocks=gemm.dependent_min_blocks(tiles),
                                                 wait_first=wait_first)))
    for cooperative in (False, True):  # the one-launch decode kernels as shipped (bf16 x, 2 column tiles)
        kernel = gemm.linear_kernel(ElementKind.BF16, False, False, True, None, gemm.skinny_chunks(True), 2,
                                    fused_input=ElementKind.BF16,
                                    fused_prefetch=(gemm.COOPERATIVE_PREFETCH_L2 if cooperative
                                                    else gemm.FUSED_PREFETCH_L2),
                                    fused_min_blocks=gemm.fused_min_blocks(2, ElementKind.BF16, cooperative),
                                    cooperative=cooperative, double_buffer=True)
        kernels.append(("cooperative" if cooperative else "fused", kernel))
    for name, kernel in kernels:
        dispatcher = kernel.compiled()
        overload = next(iter(dispatcher.overloads.values()))
        cubin = overload._codelibrary.get_cubin(cc=(9, 0))
        path = Path("/tmp") / f"{name}.cubin"
        path.write_bytes(bytes(getattr(cubin, "code", cubin)))
        text = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True).stdout
        # the shipped kernels' listings come back
        if name in (SHIPPED[0].name, SHIPPED[1].name, "skinny_vector", "fused", "cooperative") or "dependent" in name:
            (out_dir / f"{name}.sass").write_text(text)
        ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*(?:\.[A-Z0-9_]+)*)", text)
        mix = Counter(op.split(".")[0] for op in ops)
        # the main loop: from the first to the last tensor-core instruction
        idx = [i for i, op in enumerate(ops) if op.startswith(("IMMA", "HMMA", "HGMMA"))]
        loop = Counter(op.split(".")[0] for op in ops[idx[0]: idx[-1] + 1]) if idx else Counter()
        keep = ("IMMA", "HMMA", "HGMMA", "LDGSTS", "LDSM", "LDS", "STS", "LDG", "STG", "BAR", "DEPBAR", "LDGDEPBAR")
        row = {"kernel": name, "registers": overload.regs_per_thread if hasattr(overload, "regs_per_thread") else None,
               "all": {k: mix[k] for k in keep if mix[k]}, "mma_span": {k: loop[k] for k in keep if loop[k]},
               "instructions": len(ops)}
        try:
            row["registers"] = dispatcher.get_regs_per_thread()
            row["local_bytes"] = dispatcher.get_local_mem_per_thread()
        except Exception:
            pass
        say(json.dumps(row))
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/tune")
    parser.add_argument("--only", nargs="*", default=["sass", "exact", "prefill", "decode", "host", "fused",
                                                       "host_calls"])
    parser.add_argument("--decode-m", nargs="*", type=int,
                        help="fused: only these M (default: 1, 2, 4, 8, 16; with --decode-nk any)")
    parser.add_argument("--decode-nk", nargs="*", help="fused: these N x K (as 4096x4096) instead")
    parser.add_argument("--early", nargs="*", type=int, help="fused: these FUSED_EARLY_L2 variants (default: 1 2 4 8)")
    parser.add_argument("--old-root", help="fused_ab: a directory holding another checkout's baracuda_numba")
    parser.add_argument("--variants", nargs="*", help="fused_ab: this checkout's variants besides the shipped one "
                        "(default: all of fused_variants())")
    # internal: fused_ab's subprocess timing one checkout (its copy bandwidth given, its outputs saved)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--copy", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only == ["profile_decode"]:  # under ncu: no copy, no log
        profile_decode()
        return
    if args.side:
        fused_side(args.side, args.copy, Path(args.save) if args.save else None)
        return
    if args.decode_nk:  # any N x K, at the M of FUSED_DECODE (or --decode-m, any of 1 .. 16)
        ms = args.decode_m or sorted({shape[0] for shape in FUSED_DECODE})
        FUSED_DECODE[:] = [(m, *map(int, nk.split("x"))) for nk in args.decode_nk for m in ms]
    elif args.decode_m:
        FUSED_DECODE[:] = [shape for shape in FUSED_DECODE if shape[0] in args.decode_m]
    if args.early is not None:
        FUSED_EARLY[:] = args.early
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"{torch.cuda.get_device_name()}; baracuda_numba from {Path(bn.__file__).parent}")
    copy = copy_gbs()
    say(f"device-to-device copy {copy:.0f} GB/s")
    results: dict = {"copy_GBs": copy}
    for section, fn in (("sass", lambda: sass(out_dir)), ("exact", lambda: exactness(out_dir)),
                        ("prefill", lambda: prefill(copy)), ("decode", lambda: decode(copy)),
                        ("host", lambda: host_and_graph(out_dir)), ("fused", lambda: fused_decode(copy)),
                        ("fused_ab", lambda: fused_ab(copy, out_dir, args.old_root, args.variants)),
                        ("host_calls", lambda: host_calls(out_dir)), ("knobs", lambda: knob_decode(copy))):
        if section not in args.only:
            continue
        try:
            results[section] = fn()
        except Exception:
            say(f"{section} FAILED\n{traceback.format_exc()}")
        (out_dir / "tune_linear.json").write_text(json.dumps(results, indent=1, default=str))
        (out_dir / "tune_linear.log").write_text("\n".join(LOG))


if __name__ == "__main__":
    main()
