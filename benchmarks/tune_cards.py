"""Per-card tuning on a GPU, in one run: variants of this card's tuning values, timed next to the device-to-device
copy of the same run and checked bit for bit against the shipped values, then the best variant of each family as
the value to paste (``plans/tuning.py`` for the memory-bound families, ``plans/linear/tuning.py`` for the W8A8
decode).

    python -m benchmarks.tune_cards [--out DIR] [--only FAMILY ...] [--budget SECONDS] [--min-gain POINTS]
                                    [--log2n 28] [--smoke] [--shipped-only]

Families (``--only``): ``tensor_dequantize``, ``axis_dequantize``, ``axis_quantize``, ``fp8``, ``dynamic``, ``int4``,
``decode``. Each runs its cases (2^28 elements in rows of 4096, as ``baracuda-numba bench``; the W8A8 decode in CUDA
graph replay with the weights rotating past L2, as the bench's decode rows) under the shipped value (this card's,
:func:`~baracuda_numba.plans.tuning.current_tuning`) and under each variant: a few fields of the family's part of it
replaced (the variant lists below). A plan is selected with each value (``select(..., tuning=...)``), so a variant
compiles only the kernels it changes. Printed: the number of kernels to compile (at most), then per family a table
of variant, GB/s and % of copy per case and whether every output is the shipped value's bit for bit, then the best
variant per family (the highest geometric mean of % of copy over its cases, same bits everywhere, at least
``MIN_GAIN`` points over the shipped value), the fields of the best variants merged into one value and timed again
on every case (``combined``), and that value as Python to paste (fields as in ``dataclasses.replace``: the class
defaults are the H100's). A variant that fails prints its error and the run goes on; past ``--budget`` seconds the
remaining variants are skipped (named, to run with ``--only``). ``--out`` writes ``tune_cards.json``,
``tune_cards.md`` and ``tuned_values.py``. ``--smoke`` runs the same code on the simulator at toy sizes (a check of
this script, not a measurement).

Each family's inputs are made after ``torch.manual_seed(0)``, and each table ends with a digest of the shipped
value's outputs. ``--shipped-only`` times the shipped value alone: a kernel change's before / after is this script
run by the checkout before it and by the one after, one after the other on one card (the same digests: the same
bits; ``docs/performance.md``, "Instructions per byte").
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import baracuda_numba as bn
from baracuda_numba import bench
from baracuda_numba.plans import linear
from baracuda_numba.plans.tuning import MemoryTuning, current_tuning
from baracuda_numba.registry import LaunchPolicy
from baracuda_numba.vocabulary import ElementKind as E

MIN_GAIN = 0.5  # points of % of copy a variant must gain over the shipped value to be chosen (run-to-run spread)
COLS = 4096
DECODE = ((4096, 4096), (8192, 8192), (11008, 4096))
DECODE_TOKENS = (1, 16)
torch: Any = None
SMOKE = False


@dataclass
class Case:
    """One op of a family: ``make(value)`` selects its plan(s) with a tuning value and returns ``(call, outputs)``;
    ``nbytes``: the bytes the op must move (% of copy counts them); ``graph``: timed in CUDA graph replay."""

    label: str
    nbytes: int
    make: Callable[[Any], tuple[Callable[[], Any], tuple]]
    graph: int = 0  # calls per captured graph (0: eager, device events)


@dataclass
class Family:
    """A family's cases and its variants: ``section`` names the part of the tuning value they change
    (``elementwise``, ``dynamic``, ``packed``; ``linear``: the W8A8 ``LinearTuning`` itself)."""

    name: str
    section: str
    cases: Callable[[int], list[Case]]
    count: int  # its cases (without building them)
    variants: dict[str, dict[str, Any]]
    kernels_per_case: int = 1  # at most, per variant and case (what the count printed first adds up)


def policy(threads: int, blocks_per_sm: int, unroll: int = 0, one_wave: bool = False) -> LaunchPolicy:
    return LaunchPolicy(threads, blocks_per_sm, unroll, one_wave)


# -- the variants: more bytes in flight per SM, each a few fields of one family's tuning ----------------------------

FAMILY_VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    # int8 -> f32 chunks read 4 bytes each: more chunks in flight, by the input's bytes or by the policy's unroll
    "tensor_dequantize": {
        "narrow 16 B": dict(narrow_input_bytes=16),
        "narrow 32 B": dict(narrow_input_bytes=32),
        "2 chunks": dict(tensor_dequantize_policy=policy(128, 4096, 2)),
        "4 chunks": dict(tensor_dequantize_policy=policy(128, 4096, 4)),
        "256 x 4 chunks": dict(tensor_dequantize_policy=policy(256, 2048, 4)),
        "resident 512 x 32, 4 chunks": dict(tensor_dequantize_policy=policy(512, 32, 4)),
    },
    "axis_dequantize": {
        "narrow 16 B": dict(narrow_input_bytes=16),
        "narrow 32 B": dict(narrow_input_bytes=32),
        "stream 2 chunks": dict(stream_policy=policy(128, 1024, 2)),
        "shift 2 chunks": dict(pow2_unroll=2),
        "shift 2 chunks, 3 blocks": dict(pow2_unroll=2, pow2_launch_bounds=(512, 3)),
        "tiles of 2 chunks": dict(pow2_tiled_unroll=2),
        "tiles of 4 chunks": dict(pow2_tiled_unroll=4),
        "tiles of 2 chunks, shift 2 chunks": dict(pow2_tiled_unroll=2, pow2_unroll=2),
        "stationary 64 B": dict(stationary_input_bytes=64),
    },
    "axis_quantize": {
        "shift 2 chunks": dict(pow2_unroll=2),
        "shift 2 chunks, 3 blocks": dict(pow2_unroll=2, pow2_launch_bounds=(512, 3)),
        "tiles of 2 chunks": dict(pow2_tiled_unroll=2),
        "tiles of 4 chunks": dict(pow2_tiled_unroll=4),
        "tiles of 2 chunks, shift 2 chunks": dict(pow2_tiled_unroll=2, pow2_unroll=2),
        "shift L2 prefetch 1": dict(pow2_prefetch=1),
        "shift L2 prefetch 2": dict(pow2_prefetch=2),
        "segments 512 x 64": dict(segment_quantize_policy=policy(512, 64)),
        "stationary 3 blocks": dict(stationary_launch_bounds=(512, 3)),
    },
    "fp8": {
        "short blocks": dict(fp8_quantize_policy=policy(128, 1024)),
        "256 x 128": dict(fp8_quantize_policy=policy(256, 128)),
        "resident 4 chunks": dict(fp8_quantize_policy=policy(512, 32, 4)),
        "512 x 64": dict(fp8_quantize_policy=policy(512, 64)),
        "narrow 16 B": dict(narrow_input_bytes=16),
        "shift 2 chunks": dict(pow2_unroll=2),
        "shift 2 chunks, 3 blocks": dict(pow2_unroll=2, pow2_launch_bounds=(512, 3)),
        "tiles of 2 chunks": dict(pow2_tiled_unroll=2),
        "tiles of 4 chunks": dict(pow2_tiled_unroll=4),
        "tiles of 2 chunks, shift 2 chunks": dict(pow2_tiled_unroll=2, pow2_unroll=2),
    },
    "dynamic": {
        "8 chunks per lane": dict(resident_keep=8),
        "256 threads": dict(resident_threads=256),
        "prefetch 2 rows": dict(resident_prefetch_rows=2),
        "no row prefetch": dict(resident_prefetch_rows=0),
        "64 blocks / SM": dict(resident_blocks_per_sm=64),
        "columns 8 chunks, 4096 / SM": dict(keep=8, column_threads_per_sm=4096),
    },
    "int4": {
        "dequantize 4 chunks": dict(dequantize_policy=policy(128, 1024, 4)),
        "dequantize 256 x 2": dict(dequantize_policy=policy(256, 1024, 2)),
        "quantize 8 chunks": dict(unroll=8),
        "quantize 8 blocks": dict(quantize_policy=policy(256, 8, one_wave=True)),
        "dynamic 8 lanes": dict(dynamic_max_lanes=8),
        "dynamic 8 slots": dict(dynamic_slots=8),
    },
    "decode": {
        "L2 prefetch 2": dict(dependent_prefetch_l2=2),
        "256 B L2 fills everywhere": dict(weight_no_l1_min_k=0),
        "4 chunks": dict(vector_chunks=4),
    },
}


# -- the cases ---------------------------------------------------------------------------------------------------


def _empty(shape, dtype):
    return torch.empty(shape, dtype=dtype, device=DEVICE)


def _plan_case(label: str, nbytes: int, plan_type: type, desc: Any, args: Callable[[], Any], outputs: tuple) -> Case:
    """A case whose call is ``plan.run(args, workspace)`` of ``plan_type`` selected for ``desc`` with the value."""
    def make(tuning):
        plan = plan_type.select(desc, tuning=tuning)
        a = args()
        ws = _empty((plan.workspace_size(),), torch.uint8) if plan.workspace_size() else None
        return (lambda: plan.run(a, ws)), outputs

    return Case(label, nbytes, make)


def tensor_dequantize_cases(n: int) -> list[Case]:
    q = torch.randint(-128, 128, (n,), dtype=torch.int8, device=DEVICE)
    cases = []
    for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        y = _empty((n,), dtype)
        cases.append(_plan_case(f"dequantize_per_tensor s8 -> {name}", (1 + y.element_size()) * n,
                                bn.DequantizePerTensorPlan, bn.DequantizePerTensorDescriptor(n, E(name), E.S8),
                                lambda y=y: bn.DequantizePerTensorArgs(q, 0.0213, 3, y), (y,)))
    return cases


def _rows(n: int) -> tuple[int, int]:
    return max(n // COLS, 1), COLS if n >= COLS else n


def _scales(count: int, dtype=None):
    scale = torch.rand(count, device=DEVICE) * 0.05 + 0.01
    return scale.to(dtype) if dtype is not None else scale, torch.randint(-5, 5, (count,), dtype=torch.int32,
                                                                          device=DEVICE)


def axis_dequantize_cases(n: int) -> list[Case]:
    rows, cols = _rows(n)
    q = torch.randint(-128, 128, (rows, cols), dtype=torch.int8, device=DEVICE)
    y = _empty((rows, cols), torch.bfloat16)
    nbytes = 3 * rows * cols
    token, group, channel = _scales(rows), _scales(rows * cols // 128), _scales(cols)
    return [
        _plan_case("dequantize_per_token s8 -> bf16", nbytes, bn.DequantizePerTokenPlan,
                   bn.DequantizePerTokenDescriptor(rows, cols, E.BF16, E.S8),
                   lambda: bn.DequantizePerTokenArgs(q, *token, y), (y,)),
        _plan_case("dequantize_per_group g128 s8 -> bf16", nbytes, bn.DequantizePerGroupPlan,
                   bn.DequantizePerGroupDescriptor(rows, cols, 128, E.BF16, E.S8),
                   lambda: bn.DequantizePerGroupArgs(q, *group, y), (y,)),
        _plan_case("dequantize_per_channel last axis s8 -> bf16", nbytes, bn.DequantizePerChannelPlan,
                   bn.DequantizePerChannelDescriptor((rows, cols), 1, E.BF16, E.S8),
                   lambda: bn.DequantizePerChannelArgs(q, *channel, y), (y,)),
    ]


def axis_quantize_cases(n: int) -> list[Case]:
    rows, cols = _rows(n)
    x = (torch.randn(rows, cols, device=DEVICE) * 3).to(torch.bfloat16)
    q = _empty((rows, cols), torch.int8)
    nbytes = 3 * rows * cols
    token, group, channel0, channel1 = _scales(rows), _scales(rows * cols // 128), _scales(rows), _scales(cols)
    return [
        _plan_case("quantize_per_token bf16 -> s8", nbytes, bn.QuantizePerTokenPlan,
                   bn.QuantizePerTokenDescriptor(rows, cols, -128, 127, E.BF16, E.S8),
                   lambda: bn.QuantizePerTokenArgs(x, *token, q), (q,)),
        _plan_case("quantize_per_group g128 bf16 -> s8", nbytes, bn.QuantizePerGroupPlan,
                   bn.QuantizePerGroupDescriptor(rows, cols, 128, -128, 127, E.BF16, E.S8),
                   lambda: bn.QuantizePerGroupArgs(x, *group, q), (q,)),
        _plan_case("quantize_per_channel axis 0 bf16 -> s8", nbytes, bn.QuantizePerChannelPlan,
                   bn.QuantizePerChannelDescriptor((rows, cols), 0, -128, 127, E.BF16, E.S8),
                   lambda: bn.QuantizePerChannelArgs(x, *channel0, q), (q,)),
        _plan_case("quantize_per_channel last axis bf16 -> s8", nbytes, bn.QuantizePerChannelPlan,
                   bn.QuantizePerChannelDescriptor((rows, cols), 1, -128, 127, E.BF16, E.S8),
                   lambda: bn.QuantizePerChannelArgs(x, *channel1, q), (q,)),
    ]


def fp8_cases(n: int) -> list[Case]:
    rows, cols = _rows(n)
    x = torch.randn(rows, cols, device=DEVICE).to(torch.bfloat16)
    q = _empty((rows, cols), torch.uint8)  # e4m3 bytes (the plans take the element from the descriptor)
    q_token = _empty((rows, cols), torch.uint8)
    y = _empty((rows, cols), torch.bfloat16)
    source = _empty((rows, cols), torch.uint8).copy_(torch.randint(0, 256, (rows, cols), device=DEVICE)
                                                     .to(torch.uint8) & 0x77)  # finite e4m3 patterns
    token_scales = torch.full((rows,), 0.02, device=DEVICE)
    nbytes, e4m3 = 3 * rows * cols, E.FP8_E4M3
    fp8 = torch.float8_e4m3fn
    return [
        _plan_case("quantize_per_tensor bf16 -> e4m3", nbytes, bn.QuantizePerTensorPlan,
                   bn.QuantizePerTensorDescriptor(rows * cols, -448, 448, E.BF16, e4m3),
                   lambda: bn.QuantizePerTensorArgs(x, 0.02, None, q.view(fp8)), (q,)),
        _plan_case("quantize_per_token bf16 -> e4m3", nbytes, bn.QuantizePerTokenPlan,
                   bn.QuantizePerTokenDescriptor(rows, cols, -448, 448, E.BF16, e4m3),
                   lambda: bn.QuantizePerTokenArgs(x, token_scales, None, q_token.view(fp8)), (q_token,)),
        _plan_case("dequantize_per_tensor e4m3 -> bf16", nbytes, bn.DequantizePerTensorPlan,
                   bn.DequantizePerTensorDescriptor(rows * cols, E.BF16, e4m3),
                   lambda: bn.DequantizePerTensorArgs(source.view(fp8), 0.02, None, y), (y,)),
    ]


def dynamic_cases(n: int) -> list[Case]:
    rows, cols = _rows(n)
    x = torch.randn(rows, cols, device=DEVICE).to(torch.bfloat16)
    cases = []
    for label, mode, scope, count, moved in (
            ("token symmetric", "symmetric", bn.DynamicRangeScope.token(), rows, 3),
            ("token asymmetric", "asymmetric", bn.DynamicRangeScope.token(), rows, 3),
            ("group128 symmetric", "symmetric", bn.DynamicRangeScope.group(128), rows * cols // 128, 3),
            ("channel (columns) symmetric, on the 5n bytes moved", "symmetric", bn.DynamicRangeScope.channel(1),
             cols, 5)):
        q = _empty((rows, cols), torch.int8)
        scale, zero_point = _empty((count,), torch.float32), _empty((count,), torch.int32)
        mode_ = bn.DynamicRangeMode(mode)
        low, high = bn.plans.dynamic.default_dynamic_q_range(mode_, E.S8)
        cases.append(_plan_case(f"dynamic_range_quantize {label} bf16", moved * rows * cols,
                                bn.DynamicRangeQuantizePlan,
                                bn.DynamicRangeQuantizeDescriptor((rows, cols), mode_, scope, low, high, E.BF16, E.S8),
                                lambda q=q, s=scale, z=zero_point: bn.DynamicRangeQuantizeArgs(x, q, s, z),
                                (q, scale, zero_point)))
    return cases


def int4_cases(n: int) -> list[Case]:
    rows, cols = _rows(n)
    x = torch.randn(rows, cols, device=DEVICE).to(torch.bfloat16)
    scales = torch.full((rows, cols // 128), 0.3, device=DEVICE)
    packed = _empty((rows, cols // 2), torch.uint8)
    source = torch.randint(0, 256, (rows, cols // 2), device=DEVICE).to(torch.uint8)
    y = _empty((rows, cols), torch.bfloat16)
    dyn_packed, dyn_scale = _empty((rows, cols // 2), torch.uint8), _empty((rows, cols // 128), torch.float32)
    nbytes = 2 * rows * cols + rows * cols // 2
    return [
        _plan_case("quantize_per_group_packed g128 bf16 -> int4", nbytes, bn.QuantizePackedPerGroupPlan,
                   bn.PackedPerGroupDescriptor(rows, cols, 128, -8, 7, E.BF16, E.S4),
                   lambda: bn.PackedArgs(x, scales, None, packed), (packed,)),
        _plan_case("dequantize_per_group_packed g128 int4 -> bf16", nbytes, bn.DequantizePackedPerGroupPlan,
                   bn.PackedDequantizePerGroupDescriptor(rows, cols, 128, E.BF16, E.S4),
                   lambda: bn.PackedArgs(source, scales, None, y), (y,)),
        _plan_case("dynamic_range_quantize_packed g128 bf16 -> int4", nbytes, bn.DynamicRangePackedPlan,
                   bn.DynamicRangePackedDescriptor(rows, cols, 128, bn.DynamicRangeMode.SYMMETRIC, -7, 7, E.BF16,
                                                   E.S4),
                   lambda: bn.DynamicRangePackedArgs(x, dyn_packed, dyn_scale, None), (dyn_packed, dyn_scale)),
    ]


def decode_cases(n: int) -> list[Case]:
    """quantized_linear bf16 at M = 1 and 16 on the decode weights, back-to-back calls replayed from a CUDA graph,
    each call on the next of several weight copies past L2 (``bench.ROTATION_BYTES``); GB/s on the weight's bytes."""
    shapes = ((64, 64),) if SMOKE else DECODE
    cases = []
    for (rows, k), m in itertools.product(shapes, (1,) if SMOKE else DECODE_TOKENS):
        copies = 1 if SMOKE else -(-bench.ROTATION_BYTES // (rows * k))
        weights = [torch.randint(-128, 128, (rows, k), dtype=torch.int8, device=DEVICE) for _ in range(copies)]
        ws = torch.rand(rows, device=DEVICE) * 0.01 + 0.001
        x = torch.randn(m, k, device=DEVICE).to(torch.bfloat16)
        out = _empty((m, rows), torch.bfloat16)

        def make(tuning, m=m, rows=rows, k=k, weights=weights, ws=ws, x=x, out=out):
            plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, rows, k, E.BF16, E.BF16),
                                                 tuning=tuning)
            rotation = itertools.cycle(weights)
            first = weights[0]

            def call():
                plan.run(bn.QuantizedLinearArgs(x, next(rotation), ws, out))

            def check():  # the bits on the first weight, outside the graph
                plan.run(bn.QuantizedLinearArgs(x, first, ws, out))

            return (call, check), (out,)

        cases.append(Case(f"quantized_linear decode M={m} {rows}x{k}", rows * k, make, 10 * copies))
    return cases


FAMILIES = [
    Family("tensor_dequantize", "elementwise", tensor_dequantize_cases, 2, FAMILY_VARIANTS["tensor_dequantize"]),
    Family("axis_dequantize", "elementwise", axis_dequantize_cases, 3, FAMILY_VARIANTS["axis_dequantize"], 2),
    Family("axis_quantize", "elementwise", axis_quantize_cases, 4, FAMILY_VARIANTS["axis_quantize"], 2),
    Family("fp8", "elementwise", fp8_cases, 3, FAMILY_VARIANTS["fp8"]),
    Family("dynamic", "dynamic", dynamic_cases, 4, FAMILY_VARIANTS["dynamic"], 3),
    Family("int4", "packed", int4_cases, 3, FAMILY_VARIANTS["int4"], 3),
    Family("decode", "linear", decode_cases, len(DECODE) * len(DECODE_TOKENS), FAMILY_VARIANTS["decode"], 3),
]
SECTION = {f.name: f.section for f in FAMILIES}
DEVICE = "cuda"


# -- running -------------------------------------------------------------------------------------------------------


# Fields that change only a launch's grid, not what a kernel compiles: a variant of these alone compiles nothing.
GRID_ONLY = frozenset({"stationary_waves", "resident_blocks_per_sm", "tensor_partial_blocks_per_sm",
                       "tensor_quantize_blocks_per_sm", "column_threads_per_sm", "segment_blocks_per_sm",
                       "dependent_segments_max"})


def compiles(base: Any, changes: dict) -> bool:
    """Whether a variant builds kernels of its own: a field other than a grid's, or a launch policy whose chunks in
    flight (``unroll``) differ from ``base``'s (its threads and grid cap are the launch's)."""
    for name, value in changes.items():
        if isinstance(value, LaunchPolicy):
            if value.unroll != getattr(base, name).unroll:
                return True
        elif name not in GRID_ONLY:
            return True
    return False


def kernel_estimate(families: list[Family], memory: MemoryTuning, linear_tuning: Any) -> tuple[int, int]:
    """``(about, at most)`` kernels a run compiles: the shipped value's and those of the variants that compile
    (:func:`compiles`), ``kernels_per_case`` per case at most; about: one per case."""
    about = most = 0
    for f in families:
        base = linear_tuning if f.section == "linear" else getattr(memory, f.section)
        values = 1 + sum(compiles(base, changes) for changes in f.variants.values())
        about += f.count * values
        most += f.kernels_per_case * f.count * values
    return about, most


def with_changes(memory: MemoryTuning, linear_tuning: Any, section: str, changes: dict) -> tuple[MemoryTuning, Any]:
    """The two tuning values with ``changes`` applied to ``section``."""
    if section == "linear":
        return memory, replace(linear_tuning, **changes)
    return replace(memory, **{section: replace(getattr(memory, section), **changes)}), linear_tuning


def time_ms(case: Case, call: Callable[[], Any], repeats: int) -> float:
    if SMOKE:  # the simulator: one call, host time (a check of this script)
        begin = time.perf_counter()
        call()
        return 1e3 * (time.perf_counter() - begin)
    if case.graph:
        return bench.graph_ms(call, case.graph)
    return bench.device_ms(call, repeats)


def digest(outputs: tuple) -> str:
    """The first 12 hex digits of the SHA-1 of the outputs' bytes: the same inputs (every family's cases are built
    after ``torch.manual_seed(0)``) give the same digest in two checkouts exactly when their bits are equal."""
    sha = hashlib.sha1()
    for o in outputs:
        sha.update(o.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return sha.hexdigest()[:12]


def same_bits(got: tuple, want: tuple) -> bool:
    return all(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
               for a, b in zip(got, want, strict=True))


@dataclass
class Result:
    family: str
    variant: str
    changes: dict
    rows: dict = field(default_factory=dict)  # case label -> {"GB/s", "pct", "same"} or {"error"}

    def ok(self) -> bool:
        return bool(self.rows) and all("error" not in r and r["same"] for r in self.rows.values())

    def score(self) -> float:
        """Geometric mean of % of copy over the cases (0 unless every case ran with the shipped bits)."""
        if not self.ok():
            return 0.0
        return math.exp(sum(math.log(r["pct"]) for r in self.rows.values()) / len(self.rows))


def run_variant(family: Family, cases: list[Case], name: str, changes: dict, values: tuple, copy: float,
                reference: dict, repeats: int) -> Result:
    result = Result(family.name, name, changes)
    memory, linear_tuning = values
    for case in cases:
        try:
            made, outputs = case.make(linear_tuning if family.section == "linear" else memory)
            call, check = made if isinstance(made, tuple) else (made, made)
            check()
            if not SMOKE:
                torch.cuda.synchronize()
            got = tuple(o.clone() for o in outputs)
            row: dict[str, Any] = {}
            if case.label not in reference:
                reference[case.label] = got
                row["digest"] = digest(got)
            same = same_bits(got, reference[case.label])
            ms = time_ms(case, call, repeats)
            gbs = case.nbytes / ms / 1e6
            result.rows[case.label] = row | {"GB/s": gbs, "pct": 100 * gbs / copy, "same": same}
        except Exception as error:  # a variant that fails is reported, and the run goes on
            message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            result.rows[case.label] = {"error": message}
            print(f"    {case.label}: {name} FAILED: {message}", flush=True)
            if "--traceback" in sys.argv:
                traceback.print_exc()
    return result


def print_table(family: Family, results: list[Result]) -> list[str]:
    labels = list(results[0].rows) if results else []
    lines = [f"### {family.name} ({family.section})", "",
             "| variant | " + " | ".join(labels) + " | geomean % | same bits |",
             "|---|" + "---:|" * len(labels) + "---:|---|"]
    for r in results:
        cells = []
        for label in labels:
            row = r.rows.get(label, {"error": "not run"})
            cells.append(f"ERROR {row['error']}" if "error" in row else f"{row['GB/s']:.0f} GB/s {row['pct']:.1f}%")
        lines.append(f"| {r.variant} | " + " | ".join(cells) + f" | {r.score():.1f} | {'yes' if r.ok() else 'NO'} |")
    digests = [f"{label} {row['digest']}" for label, row in (results[0].rows.items() if results else ())
               if "digest" in row]
    if digests:
        lines += ["", "Digests of the shipped value's outputs (the bits): " + "; ".join(digests) + "."]
    print("\n".join(lines) + "\n", flush=True)
    return [*lines, ""]


def merged(best: list[tuple[Result, float]]) -> tuple[dict[str, dict], list[str]]:
    """The best variants' fields per section; where two families chose different values of one field, the one
    whose family gained more keeps it (reported)."""
    chosen: dict[str, dict[str, tuple[Any, float, str]]] = {}
    notes = []
    for r, gain in best:
        for name, value in r.changes.items():
            section = chosen.setdefault(SECTION[r.family], {})
            if name in section and section[name][0] != value:
                keep = section[name] if section[name][1] >= gain else (value, gain, r.family)
                notes.append(f"{name}: {section[name][2]} chose {section[name][0]!r}, {r.family} {value!r}; "
                             f"kept {keep[2]}'s")
                section[name] = keep
            else:
                section[name] = (value, gain, r.family)
    return {s: {k: v[0] for k, v in fields_.items()} for s, fields_ in chosen.items()}, notes


def _python(value: Any) -> str:
    """``value`` as Python source (launch policies by position, strings in double quotes)."""
    if isinstance(value, LaunchPolicy):
        extra = (f", {value.unroll}" if value.unroll or value.one_wave else "") + (
            ", one_wave=True" if value.one_wave else "")
        return f"LaunchPolicy({value.threads_per_block}, {value.blocks_per_sm}{extra})"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def literal(memory: MemoryTuning, linear_tuning: Any) -> str:
    """The two values as Python to paste: each field that differs from its class default (the H100's value), one
    per line."""
    def diff(value, default) -> dict:
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                if f.name != "card" and getattr(value, f.name) != getattr(default, f.name)}

    name = f"{memory.card.upper()}_TUNING"
    parts = []
    for section in ("elementwise", "dynamic", "packed"):
        value = getattr(memory, section)
        changed = diff(value, type(value)())
        if changed:
            fields_ = "".join(f"        {k}={_python(v)},\n" for k, v in changed.items())
            parts.append(f"    {section}={type(value).__name__}(\n{fields_}    ),\n")
    memory_text = f"{name} = MemoryTuning(\n    card={_python(memory.card)},\n{''.join(parts)})"
    linear_fields = "".join(f"    {k}={_python(v)},\n" for k, v in diff(linear_tuning, type(linear_tuning)()).items())
    linear_text = f"{name} = LinearTuning(\n    card={_python(linear_tuning.card)},\n{linear_fields})"
    return (f"# baracuda_numba/plans/tuning.py\n{memory_text}\n\n# baracuda_numba/plans/linear/tuning.py\n"
            f"{linear_text}\n")


def copy_gbs(n: int, repeats: int) -> float:
    if SMOKE:
        return 1e-4  # toy sizes on the simulator: any positive figure (the percentages mean nothing there)
    src = torch.randn(n, device=DEVICE)
    dst = torch.empty_like(src)
    return 8 * n / bench.device_ms(lambda: dst.copy_(src), repeats) / 1e6


def main(argv: list[str] | None = None) -> int:
    global torch, SMOKE, DEVICE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write tune_cards.json / .md and tuned_values.py")
    parser.add_argument("--only", nargs="+", choices=[f.name for f in FAMILIES], default=None)
    parser.add_argument("--budget", type=float, default=450.0, help="seconds after which variants are skipped")
    parser.add_argument("--log2n", type=int, default=28)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--min-gain", type=float, default=MIN_GAIN,
                        help="points of %% of copy a variant must gain to be chosen")
    parser.add_argument("--smoke", action="store_true", help="the simulator at toy sizes: a check of this script")
    parser.add_argument("--shipped-only", action="store_true",
                        help="the shipped value alone, no variants: one side of a before / after of two checkouts, "
                             "each run by its own (digests equal: the same bits)")
    parser.add_argument("--traceback", action="store_true", help="print a failing variant's traceback")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    SMOKE = args.smoke
    bench._import_torch()
    torch = bench.torch
    DEVICE = "cpu" if SMOKE else "cuda"
    n = 1 << (12 if SMOKE else args.log2n)
    families = [f for f in FAMILIES if args.only is None or f.name in args.only]
    base_memory, base_linear = current_tuning(), linear.current_tuning()
    device = "simulator" if SMOKE else torch.cuda.get_device_name()
    about, most = kernel_estimate(families, base_memory, base_linear)
    print(f"{device}: tuning values {base_memory.card} (memory-bound) / {base_linear.card} (W8A8); n = {n}; "
          f"about {about} kernels to compile, at most {most} (1-3 s each); budget {args.budget:.0f} s", flush=True)
    copy = copy_gbs(n, args.repeats)
    print(f"device-to-device copy {copy:.0f} GB/s", flush=True)
    report: dict[str, Any] = {"device": device, "copy_gbs": copy, "card": base_memory.card, "families": {}}
    lines = [f"# Per-card tuning variants on {device}", "", f"Copy {copy:.0f} GB/s; tuning values {base_memory.card}; "
             f"n = {n}.", ""]
    best: list[tuple[Result, float]] = []
    skipped: list[str] = []
    all_cases: dict[str, tuple[Family, list[Case], dict]] = {}
    for family in families:
        if time.perf_counter() - start > args.budget:
            skipped.append(family.name)
            continue
        torch.manual_seed(0)  # the same inputs in every run: digests compare across checkouts
        cases = family.cases(n)
        reference: dict = {}
        all_cases[family.name] = (family, cases, reference)
        print(f"== {family.name}: {len(cases)} cases x {1 + (0 if args.shipped_only else len(family.variants))} "
              "values", flush=True)
        results = [run_variant(family, cases, "shipped", {}, (base_memory, base_linear), copy, reference,
                               args.repeats)]
        for name, changes in ({} if args.shipped_only else family.variants).items():
            if time.perf_counter() - start > args.budget:
                skipped.append(f"{family.name}: {name}")
                continue
            values = with_changes(base_memory, base_linear, family.section, changes)
            results.append(run_variant(family, cases, name, changes, values, copy, reference, args.repeats))
            print(f"  {name}: geomean {results[-1].score():.1f}% ({'same bits' if results[-1].ok() else 'NOT OK'})"
                  f" at {time.perf_counter() - start:.0f} s", flush=True)
        lines += print_table(family, results)
        shipped = results[0].score()
        winner = max(results[1:], key=Result.score, default=None)
        if winner is not None and winner.ok() and winner.score() >= shipped + args.min_gain:
            best.append((winner, winner.score() - shipped))
            print(f"  best: {winner.variant} ({winner.score():.1f}% against {shipped:.1f}%)\n", flush=True)
        else:
            print(f"  best: the shipped value ({shipped:.1f}%)\n", flush=True)
        report["families"][family.name] = [dataclasses.asdict(r) | {"score": r.score(), "ok": r.ok()}
                                           for r in results]
    sections, notes = merged(best)
    memory, linear_tuning = base_memory, base_linear
    for section, changes in sections.items():
        memory, linear_tuning = with_changes(memory, linear_tuning, section, changes)
    if notes:
        print("conflicts between families' best variants:\n  " + "\n  ".join(notes), flush=True)
    if sections and time.perf_counter() - start <= args.budget + 60:
        print("== combined: every family's best fields at once", flush=True)
        for name, (family, cases, reference) in all_cases.items():
            combined = run_variant(family, cases, "combined", {}, (memory, linear_tuning), copy, reference,
                                   args.repeats)
            lines += print_table(family, [combined])
            if not combined.ok():
                print(f"  combined value NOT OK on {name}: check before pasting", flush=True)
    elif sections:
        skipped.append("combined")
    text = literal(memory if sections else base_memory, linear_tuning)
    print("The value to paste (fields differing from the class defaults, the H100's):\n\n" + text, flush=True)
    if skipped:
        print("Skipped past the budget: " + "; ".join(skipped) + "\n(run them with --only)", flush=True)
    report.update({"paste": text, "skipped": skipped, "conflicts": notes,
                   "best": {r.family: {"variant": r.variant, "changes": repr(r.changes), "gain": g} for r, g in best}})
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tune_cards.json").write_text(json.dumps(report, indent=1, default=repr) + "\n")
        (args.out / "tune_cards.md").write_text("\n".join(lines) + "\n```python\n" + text + "```\n")
        (args.out / "tuned_values.py").write_text(text)
    print(f"done in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
