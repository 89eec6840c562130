"""GPU benchmark of every memory-bound op: GB/s against the device-to-device copy measured in the
same run and against the matching PyTorch op; the W8A8 linear (prefill TOPS, decode GPU time); host
time per call of small problems.

    baracuda-numba bench [--only per_tensor per_channel ...] [--dtypes f32 bf16] [--log2n 28] [--out DIR]
    python -m benchmarks ...   (the same, from a checkout)

Needs a CUDA GPU and PyTorch (the reference ops and the timers). Prints the card first, then one line
per measured row.

Timing: CUDA events around each call after a warm-up, median of ``--repeats``; 2^28 elements
(1 GiB of f32) dwarf the 50 MB L2, so no buffer rotation is needed. Bytes are the fewest the op
must move (each input read once, each output written once). The linear's decode rows are graph
replays over rotating weights instead (:func:`graph_ms`). Writes ``bench.json``, ``bench.md``
and ``bench.png`` (percent of copy per op) into ``--out``.

The families ``--only`` selects are the entries of :data:`FAMILIES`: a new family is one function of a
:class:`Context` and one entry there.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import baracuda_numba as bn

# PyTorch, imported by run() (None until then): building the command line's parser, or importing this
# module, must not pay for importing PyTorch.
torch: Any = None
TORCH: dict[str, Any] = {}


def _import_torch() -> bool:
    """Import PyTorch into this module (``torch``, ``TORCH``); False when it is not installed."""
    global torch
    if torch is None:
        try:
            import torch as module
        except ImportError:
            return False
        torch = module
        TORCH.update({"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64})
    return True


# GPU cycles of the busy wait queued before each timed call (about 1 ms): longer than any call's host
# time, so the call is queued while the GPU still waits and the events hold GPU work only.
_QUEUE_AHEAD_CYCLES = 2_000_000


def device_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median GPU milliseconds of ``fn``'s work. A busy wait is queued first, so that ``fn``'s host
    side (argument checks, allocation, the launch calls) runs while the GPU is still waiting: with
    an idle GPU the begin event would fire at once and the host time would be counted too (tens of
    microseconds against a few hundred of GPU time at the default size)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(_QUEUE_AHEAD_CYCLES)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end))
    return statistics.median(samples)


def graph_ms(fn: Callable[[], object], calls: int = 10, replays: int = 15) -> float:
    """Median GPU milliseconds per call of ``fn``: ``calls`` calls captured in one CUDA graph (after two on a
    side stream, which compile and warm up), the graph replayed ``replays`` times between device events. The
    replay launches nothing from the host, so back-to-back calls show GPU time alone: kernel boundaries, waits
    between programmatic dependents and launch gaps included, argument handling excluded."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) / calls)
    return statistics.median(samples)


# Calls per timed batch of host_us: each batch waits in the launch queue behind one busy wait, so the batch's host
# time must stay below the wait's (about 1 ms: 50 us a call) and its launches must fit the queue.
HOST_BATCH = 20


def host_us(fn: Callable[[], object], calls: int = 2000) -> float:
    """Host microseconds per call of ``fn``: best of five rounds of ``calls`` calls, each round timed in batches of
    ``HOST_BATCH`` calls queued behind a GPU busy wait (synchronized between batches, untimed).

    A tight loop measures ``max(host time, GPU time)`` per call once the GPU falls behind and the launch queue fills.
    Behind the wait every launch only enters the queue, so what is timed is the host's own work (argument checks,
    plan lookup, the launch calls) even where a call's GPU time is longer. (On an H100, for calls of 5.5-12.1 us of
    GPU time, a tight loop of 200 calls read the same as this within 1.1 us: the queue had absorbed the loop.)"""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        elapsed, done = 0.0, 0
        while done < calls:
            batch = min(HOST_BATCH, calls - done)
            torch.cuda._sleep(_QUEUE_AHEAD_CYCLES)
            start = time.perf_counter()
            for _ in range(batch):
                fn()
            elapsed += time.perf_counter() - start
            done += batch
            torch.cuda.synchronize()
        best = min(best, elapsed / calls * 1e6)
    return best


class Bench:
    def __init__(self, repeats: int, total: int = 0) -> None:
        self.repeats = repeats
        self.rows: list[dict] = []
        self.copy_gbs = 0.0
        self.total = total

    def progress(self) -> str:
        done = len(self.rows)
        if not self.total:
            return f"[{done}]"
        filled = int(20 * min(done, self.total) / self.total)
        return f"[{'#' * filled}{'.' * (20 - filled)}] {done}/{self.total}"

    def copy(self, n: int) -> None:
        src = torch.randn(n, device="cuda")
        dst = torch.empty_like(src)
        ms = device_ms(lambda: dst.copy_(src), self.repeats)
        self.copy_gbs = 8 * n / ms / 1e6

    def add(self, family: str, op: str, dtype: str, nbytes: int, ours: Callable, theirs: Callable | None = None,
            torch_name: str = "", torch_bytes: int | None = None, moved: int | None = None) -> None:
        """Time ``ours`` (and ``theirs``); ``nbytes`` is what the op reads and writes once each,
        ``moved`` (when larger) what it must move: a whole-tensor range read twice, say."""
        ms = device_ms(ours, self.repeats)
        row = {"family": family, "op": op, "dtype": dtype, "ms": ms, "GB/s": nbytes / ms / 1e6}
        row["pct_copy"] = 100 * row["GB/s"] / self.copy_gbs
        if moved:
            row.update({"bytes": nbytes, "moved_bytes": moved,
                        "pct_copy_moved": 100 * moved / ms / 1e6 / self.copy_gbs})
        if theirs is not None:
            torch_ms = device_ms(theirs, self.repeats)
            row.update({"torch_op": torch_name, "torch_GB/s": (torch_bytes or nbytes) / torch_ms / 1e6})
            row["ratio"] = row["GB/s"] / row["torch_GB/s"]
        self.rows.append(row)
        print(f"{self.progress()} {family:<11}{op:<26}{dtype:<6}{row['GB/s']:7.0f} GB/s {row['pct_copy']:5.1f}%"
              + (f" ({row['pct_copy_moved']:.1f}% on the bytes moved)" if moved else "")
              + (f"   torch {row['torch_GB/s']:6.0f} GB/s  x{row['ratio']:.2f}" if theirs else ""), flush=True)


def per_tensor(bench: Bench, n: int, dtypes: list[str]) -> None:
    scale, zp = 0.0213, 3
    for name in dtypes:
        size = torch.tensor([], dtype=TORCH[name]).element_size()
        x = (torch.randn(n, device="cuda") * 3).to(TORCH[name])
        dy = torch.randn(n, device="cuda").to(TORCH[name])
        q = torch.empty(n, device="cuda", dtype=torch.int8)
        y = torch.empty_like(x)
        cases = [
            ("quantize", bn.QuantizePerTensorPlan, bn.QuantizePerTensorDescriptor(n, -128, 127, name, "s8"),
             bn.QuantizePerTensorArgs(x, scale, zp, q), size + 1),
            ("dequantize", bn.DequantizePerTensorPlan, bn.DequantizePerTensorDescriptor(n, name, "s8"),
             bn.DequantizePerTensorArgs(q, scale, zp, y), size + 1),
            ("fake_quantize", bn.FakeQuantizePlan, bn.FakeQuantizeDescriptor(n, -128, 127, name),
             bn.FakeQuantizeArgs(x, scale, zp, y), 2 * size),
            ("quantize_backward", bn.QuantizePerTensorBackwardPlan,
             bn.QuantizePerTensorBackwardDescriptor(n, -128, 127, name, "s8"),
             bn.QuantizePerTensorBackwardArgs(x, scale, zp, dy, y), 3 * size),
            ("fake_quantize_backward", bn.FakeQuantizeBackwardPlan, bn.FakeQuantizeBackwardDescriptor(
                n, -128, 127, name), bn.FakeQuantizeBackwardArgs(x, scale, zp, dy, y), 3 * size),
            ("dequantize_backward", bn.DequantizePerTensorBackwardPlan,
             bn.DequantizePerTensorBackwardDescriptor(n, name, "s8"),
             bn.DequantizePerTensorBackwardArgs(scale, dy, y), 2 * size),
        ]
        for op, plan_type, desc, args, per_element in cases:
            plan = plan_type.select(desc)
            theirs, torch_name = None, ""
            if op == "quantize" and name == "f32":
                theirs, torch_name = (lambda x=x: torch.quantize_per_tensor(x, scale, zp, torch.qint8),
                                      "torch.quantize_per_tensor")
            elif op == "dequantize" and name == "f32":
                tq = torch.quantize_per_tensor(x, scale, zp, torch.qint8)
                theirs, torch_name = tq.dequantize, "Tensor.dequantize"
            elif op == "fake_quantize":
                theirs, torch_name = (lambda x=x: torch.fake_quantize_per_tensor_affine(x, scale, zp, -128, 127),
                                      "fake_quantize_per_tensor_affine")
            bench.add("per_tensor", op, name, per_element * n, lambda p=plan, a=args: p.run(a), theirs, torch_name)
        del x, dy, q, y
        torch.cuda.empty_cache()


def per_segment(bench: Bench, family: str, n: int, dtypes: list[str]) -> None:
    """Per-channel (axis 0 and last), per-token and per-group (128) on [rows, 4096]-shaped data."""
    cols = 4096
    rows = n // cols
    layouts = {"per_channel": [("axis0", 0), ("axis1", 1)], "per_token": [("", None)],
               "per_group": [("g128", 128)]}[family]
    for name in dtypes:
        dtype = TORCH[name]
        size = torch.tensor([], dtype=dtype).element_size()
        x = (torch.randn(rows, cols, device="cuda") * 3).to(dtype)
        dy = torch.randn(rows, cols, device="cuda").to(dtype)
        q = torch.empty(rows, cols, device="cuda", dtype=torch.int8)
        y = torch.empty_like(x)
        scale_dtype = torch.float64 if name == "f64" else torch.float32
        for label, parameter in layouts:
            count = {"per_channel": (rows, cols)[parameter or 0] if family == "per_channel" else 0,
                     "per_token": rows, "per_group": rows * cols // (parameter or 1)}[family]
            scales = (torch.rand(count, device="cuda") * 0.05 + 0.01).to(scale_dtype)
            zps = torch.randint(-5, 5, (count,), device="cuda", dtype=torch.int32)
            fields = {"per_channel": ((rows, cols), parameter), "per_token": (rows, cols),
                      "per_group": (rows, cols, parameter)}[family]
            stem = {"per_channel": "PerChannel", "per_token": "PerToken", "per_group": "PerGroup"}[family]
            cases = [
                ("quantize", f"Quantize{stem}", (*fields, -128, 127, name, "s8"), (x, scales, zps, q), size + 1),
                ("dequantize", f"Dequantize{stem}", (*fields, name, "s8"), (q, scales, zps, y), size + 1),
                ("quantize_backward", f"Quantize{stem}Backward", (*fields, -128, 127, name, "s8"),
                 (x, scales, zps, dy, y), 3 * size),
                ("dequantize_backward", f"Dequantize{stem}Backward", (*fields, name, "s8"), (scales, dy, y),
                 2 * size),
            ]
            for op, stem_name, desc_fields, arg_values, per_element in cases:
                plan = getattr(bn, f"{stem_name}Plan").select(getattr(bn, f"{stem_name}Descriptor")(*desc_fields))
                args = getattr(bn, f"{stem_name}Args")(*arg_values)
                theirs, torch_name, torch_bytes = None, "", None
                if family == "per_channel" and op == "quantize" and name == "f32":
                    s64, z64 = scales.double(), zps.long()
                    theirs, torch_name = (lambda x=x, a=parameter, s=s64, z=z64: torch.quantize_per_channel(
                        x, s, z, a, torch.qint8)), "torch.quantize_per_channel"
                if family == "per_channel" and op == "dequantize" and name in ("f32", "bf16", "f16"):
                    theirs, torch_name = (lambda x=x, a=parameter, s=scales, z=zps:
                                          torch.fake_quantize_per_channel_affine(x, s, z, a, -128, 127),
                                          "fake_quantize_per_channel_affine (2x bytes)")
                    torch_bytes = 2 * size * n
                bench.add(family, f"{op}[{label}]" if label else op, name, per_element * n,
                          lambda p=plan, a=args: p.run(a), theirs, torch_name, torch_bytes)
        del x, dy, q, y
        torch.cuda.empty_cache()


def torch_dynamic_token(x):
    """Dynamic per-token int8 in PyTorch ops: the composition the benchmark compiles and compares."""
    scale = x.float().abs().amax(dim=1, keepdim=True) / 127
    return torch.clamp(torch.round(x.float() / scale), -127, 127).to(torch.int8), scale


def torch_dynamic_tensor(x):
    """Dynamic per-tensor int8 in PyTorch ops."""
    scale = x.float().abs().amax() / 127
    return torch.clamp(torch.round(x.float() / scale), -127, 127).to(torch.int8), scale


def dynamic(bench: Bench, n: int, pairs: list[dict]) -> None:
    """Dynamic-range quantize against eager and compiled PyTorch compositions."""
    cols = 4096
    rows = n // cols
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)

    torch_token, torch_tensor = torch_dynamic_token, torch_dynamic_tensor

    compiled_token = torch.compile(torch_token)
    compiled_tensor = torch.compile(torch_tensor)
    nbytes = 3 * n  # bf16 in, int8 out
    bench.add("dynamic", "token[symmetric]", "bf16", nbytes, lambda: bn.dynamic_range_quantize(x),
              lambda: compiled_token(x), "torch.compile(amax/round/clamp)")
    bench.add("dynamic", "token[symmetric]", "bf16", nbytes, lambda: bn.dynamic_range_quantize(x),
              lambda: torch_token(x), "eager amax/round/clamp")
    bench.add("dynamic", "token[asymmetric]", "bf16", nbytes,
              lambda: bn.dynamic_range_quantize(x, mode="asymmetric"))
    bench.add("dynamic", "group128[symmetric]", "bf16", nbytes,
              lambda: bn.dynamic_range_quantize(x, scope="group", group_size=128))
    # A range over the whole tensor (or a whole column) is known only after all of x is read, and 512 MiB
    # of x is ten times what the chip holds (L2, registers and shared memory): x is read twice, 5n bytes.
    bench.add("dynamic", "tensor[symmetric]", "bf16", nbytes, lambda: bn.dynamic_range_quantize(x, scope="tensor"),
              lambda: compiled_tensor(x), "torch.compile(amax/round/clamp)", moved=5 * n)
    bench.add("dynamic", "channel0[symmetric]", "bf16", nbytes,
              lambda: bn.dynamic_range_quantize(x, scope="channel", axis=1), moved=5 * n)
    x = None  # free the 512 MiB before the small problems
    torch.cuda.empty_cache()
    for tokens in (1, 16):
        small = torch.randn(tokens, cols, device="cuda", dtype=torch.bfloat16)
        ours = host_us(lambda s=small: bn.dynamic_range_quantize(s), 500)
        for label, fn in (("torch.compile composition", compiled_token), ("eager composition", torch_token)):
            pairs.append({"family": "dynamic", "call": f"dynamic_range_quantize() ({tokens}x4096 bf16)", "us": ours,
                          "torch_op": label, "torch_us": host_us(lambda s=small, fn=fn: fn(s), 500)})


def lowbit(bench: Bench, n: int) -> None:
    """FP8 (E4M3fn, E5M2) and packed int4 next to the PyTorch compositions they replace: the cast
    ``(x * inv).clamp(-max, max).to(float8)`` after scaling (eager), and vLLM-style dynamic FP8
    (amax, scale clamp, cast) and int4 group packing composed in ``torch.compile``."""
    cols = 4096
    rows = n // cols
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    e4m3, top = torch.float8_e4m3fn, 448.0
    inv = torch.tensor(1.0 / 0.02, device="cuda")
    token_scales = torch.full((rows,), 0.02, device="cuda")

    def torch_cast(x, fp8=e4m3, top=top):
        return (x.float() * inv).clamp(-top, top).to(fp8)

    def torch_dynamic_token(x):  # vLLM's dynamic per-token FP8: scale = max(amax / 448, 1 / (448 * 512))
        scale = (x.float().abs().amax(dim=1, keepdim=True) / top).clamp(min=1.0 / (top * 512.0))
        return (x.float() / scale).clamp(-top, top).to(e4m3), scale

    def torch_dynamic_tensor(x):
        scale = (x.float().abs().amax() / top).clamp(min=1.0 / (top * 512.0))
        return (x.float() / scale).clamp(-top, top).to(e4m3), scale

    def torch_int4_group(x, scales):  # symmetric int4 per group of 128, packed low nibble first
        q = (x.float().view(rows, -1, 128) / scales[..., None]).round().clamp(-8, 7).to(torch.int8).view(rows, cols)
        return ((q[:, 0::2] & 0xF) | (q[:, 1::2] << 4)).to(torch.uint8)

    def torch_token_cast(x):
        return (x.float() * inv_token).clamp(-top, top).to(e4m3)

    compiled_token, compiled_tensor = torch.compile(torch_dynamic_token), torch.compile(torch_dynamic_tensor)
    compiled_int4 = torch.compile(torch_int4_group)
    # The same casts fused by Inductor: one kernel, what a user who compiles the expression gets (the anchor of FP8
    # quantize in docs/performance.md); the eager casts read x three times.
    compiled_cast, compiled_token_cast = torch.compile(torch_cast), torch.compile(torch_token_cast)
    inv_token = (1.0 / token_scales)[:, None]
    cast = "(x*inv).clamp().to(e4m3fn)"
    for label, theirs in ((f"torch.compile {cast}", lambda: compiled_cast(x)), (cast, lambda: torch_cast(x))):
        bench.add("fp8", "quantize_per_tensor e4m3", "bf16", 3 * n,
                  lambda: bn.quantize_per_tensor(x, 0.02, dtype=e4m3), theirs, label)
    bench.add("fp8", "quantize_per_tensor e5m2", "bf16", 3 * n,
              lambda: bn.quantize_per_tensor(x, 0.02, dtype=torch.float8_e5m2),
              lambda: torch_cast(x, torch.float8_e5m2, 57344.0), "(x*inv).clamp().to(e5m2)")
    bench.add("fp8", "quantize_per_token e4m3", "bf16", 3 * n,
              lambda: bn.quantize_per_token(x, token_scales, dtype=e4m3), lambda: compiled_token_cast(x),
              "torch.compile (x*inv[:,None]).clamp().to(e4m3fn)")
    q = bn.quantize_per_tensor(x, 0.02, dtype=e4m3)
    bench.add("fp8", "dequantize_per_tensor e4m3", "bf16", 3 * n,
              lambda: bn.dequantize_per_tensor(q, 0.02, dtype=torch.bfloat16),
              lambda: (q.float() * 0.02).to(torch.bfloat16), "(q.float()*s).to(bf16)")
    bench.add("fp8", "fake_quantize e4m3", "bf16", 4 * n, lambda: bn.fake_quantize(x, 0.02, dtype=e4m3),
              lambda: (torch_cast(x).float() * 0.02).to(torch.bfloat16), "cast round trip")
    bench.add("fp8", "dynamic token e4m3", "bf16", 3 * n, lambda: bn.dynamic_range_quantize(x, dtype=e4m3),
              lambda: compiled_token(x), "torch.compile(vLLM-style)")
    bench.add("fp8", "dynamic tensor e4m3", "bf16", 3 * n,
              lambda: bn.dynamic_range_quantize(x, scope="tensor", dtype=e4m3),
              lambda: compiled_tensor(x), "torch.compile(vLLM-style)", moved=5 * n)  # x read twice
    scales = torch.full((rows, cols // 128), 0.3, device="cuda")
    nbytes = 2 * n + n // 2
    bench.add("int4", "quantize_per_group_packed", "bf16", nbytes,
              lambda: bn.quantize_per_group_packed(x, scales, None, 128),
              lambda: compiled_int4(x, scales), "torch.compile(round/clamp/pack)")
    packed = bn.quantize_per_group_packed(x, scales, None, 128)
    bench.add("int4", "dequantize_per_group_packed", "bf16", nbytes,
              lambda: bn.dequantize_per_group_packed(packed, scales, None, 128, dtype=torch.bfloat16))
    bench.add("int4", "dynamic group128 int4", "bf16", nbytes,
              lambda: bn.dynamic_range_quantize_packed(x, group_size=128))
    bench.add("int4", "fake_quantize_per_group int4", "bf16", 4 * n,
              lambda: bn.fake_quantize_per_group(x, scales, None, 128, dtype="int4"))
    x = q = packed = None  # free the device memory before the next family
    torch.cuda.empty_cache()


# W8A8 linear shapes: prefill (M x N x K; 4096^3, the Llama-7B projections at 2048 tokens, smaller batches) and
# decode (N x K of the weight, times every token count)
PREFILL_SHAPES = ((4096, 4096, 4096), (2048, 4096, 4096), (2048, 11008, 4096), (2048, 4096, 11008),
                  (256, 4096, 4096), (128, 4096, 4096), (32, 4096, 4096))
DECODE_WEIGHTS = ((4096, 4096), (8192, 8192), (11008, 4096))
DECODE_TOKENS = (1, 2, 4, 8, 16)
# each decode shape's weight copies together exceed this (four times the H100's 50 MB L2), and the timed calls
# rotate through them, so every call streams its weight from HBM as a model's layers do
ROTATION_BYTES = 200_000_000


def linear(bench: Bench, host: dict[str, float]) -> None:
    """W8A8 linear, per-token activations quantized in the call, bf16 out.

    Prefill: TOPS of ``quantized_linear`` (eager, device events) next to ``torch._int_mm`` (weight column-major)
    followed by its dequant epilogue ``(acc.float() * sx[:, None] * ws[None, :]).to(bf16)``, and next to
    ``torch._int_mm`` alone on the already quantized rows.

    Decode: GPU time per call of back-to-back ``quantized_linear`` calls replayed from a CUDA graph, each call on
    the next of several weight copies (:data:`ROTATION_BYTES`, past L2), as GB/s on the int8 weight's bytes and %
    of the copy; next to ``F.linear`` on bf16 weights timed the same way (``torch._int_mm`` refuses 16 rows or
    fewer). Host time per call is timed apart (:func:`host_us`)."""
    for m, n, k in PREFILL_SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8)
        ws = torch.rand(n, device="cuda") * 0.01
        r = bn.dynamic_range_quantize(x)
        ms = device_ms(lambda x=x, w=w, ws=ws: bn.quantized_linear(x, w, ws), bench.repeats)
        torch_ms = device_ms(lambda r=r, w=w, ws=ws: (torch._int_mm(r.q, w.t()).float() * r.scale[:, None]
                                                      * ws[None, :]).to(torch.bfloat16), bench.repeats)
        raw_ms = device_ms(lambda r=r, w=w: torch._int_mm(r.q, w.t()), bench.repeats)
        tops, torch_tops, raw_tops = (2 * m * n * k / t / 1e9 for t in (ms, torch_ms, raw_ms))
        bench.rows.append({"family": "linear", "op": f"quantized_linear {m}x{n}x{k}", "dtype": "bf16", "ms": ms,
                           "TOPS": tops, "torch_op": "torch._int_mm + dequant", "torch_TOPS": torch_tops,
                           "ratio": tops / torch_tops, "raw_op": "torch._int_mm", "raw_TOPS": raw_tops,
                           "raw_ratio": tops / raw_tops})
        print(f"{bench.progress()} linear {m}x{n}x{k}: {tops:.0f} TOPS, torch._int_mm + dequant {torch_tops:.0f} "
              f"TOPS (x{tops / torch_tops:.2f}), torch._int_mm alone {raw_tops:.0f} TOPS (x{tops / raw_tops:.2f})",
              flush=True)
    x = w = r = None
    for n, k in DECODE_WEIGHTS:
        weights = [torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8)
                   for _ in range(-(-ROTATION_BYTES // (n * k)))]
        dense = [w.to(torch.bfloat16) for w in weights[:-(-ROTATION_BYTES // (2 * n * k))]]
        ws = torch.rand(n, device="cuda") * 0.01
        for m in DECODE_TOKENS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ours, theirs = itertools.cycle(weights), itertools.cycle(dense)
            ms = graph_ms(lambda x=x, ws=ws, ours=ours: bn.quantized_linear(x, next(ours), ws), 10 * len(weights))
            torch_ms = graph_ms(lambda x=x, theirs=theirs: torch.nn.functional.linear(x, next(theirs)),
                                10 * len(dense))
            row = {"family": "linear", "op": f"decode M={m} {n}x{k}", "dtype": "bf16", "decode": True, "m": m,
                   "n": n, "k": k, "ms": ms, "GB/s": n * k / ms / 1e6, "torch_op": "F.linear, bf16 weight",
                   "torch_ms": torch_ms, "torch_GB/s": 2 * n * k / torch_ms / 1e6, "speedup": torch_ms / ms}
            row["pct_copy"] = 100 * row["GB/s"] / bench.copy_gbs
            bench.rows.append(row)
            print(f"{bench.progress()} linear decode M={m} {n}x{k}: {1e3 * ms:.1f} us, {row['GB/s']:.0f} GB/s "
                  f"({row['pct_copy']:.1f}% of copy); F.linear bf16 {1e3 * torch_ms:.1f} us (x{row['speedup']:.2f})",
                  flush=True)
        weights = dense = None
        torch.cuda.empty_cache()
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randint(-128, 128, (4096, 4096), device="cuda", dtype=torch.int8)
    ws = torch.rand(4096, device="cuda") * 0.01
    host["quantized_linear() (16x4096 @ 4096x4096)"] = host_us(lambda: bn.quantized_linear(x, w, ws), 200)
    for m in (16, 1):  # two launches at M = 16 (the per-token quantizer, its dependent GEMM), one fused at M = 1
        plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, 4096, 4096, "bf16", "bf16", False))
        args = bn.QuantizedLinearArgs(x[:m], w, ws, torch.empty(m, 4096, device="cuda", dtype=torch.bfloat16))
        workspace = torch.empty(plan.workspace_size(), device="cuda", dtype=torch.uint8)
        host[f"QuantizedLinearPlan.run ({m}x4096 @ 4096x4096, {plan.kernel_variant(args)})"] = host_us(
            lambda plan=plan, args=args, workspace=workspace: plan.run(args, workspace), 200)
    w16 = w.to(torch.bfloat16)
    host["torch.nn.functional.linear (16x4096 @ 4096x4096 bf16)"] = host_us(
        lambda: torch.nn.functional.linear(x, w16), 200)


def host_pairs() -> list[dict]:
    """Host time per call on small problems, each family's call next to the nearest PyTorch op
    (timed in the same loop shape): what a serving or training step pays per launch."""
    small = torch.randn(4096, device="cuda")
    small_q = torch.empty(4096, device="cuda", dtype=torch.int8)
    plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(4096, -128, 127, "f32", "s8"))
    args = bn.QuantizePerTensorArgs(small, 0.02, 3, small_q)
    tq = torch.quantize_per_tensor(small, 0.02, 3, torch.qint8)
    rows, cols = 16, 256
    tokens = torch.randn(rows, cols, device="cuda")
    scales = torch.full((rows,), 0.02, device="cuda")
    zps = torch.zeros(rows, device="cuda", dtype=torch.int32)
    scales64, zps64 = scales.double(), zps.long()
    col_scales, col_zps = torch.full((cols,), 0.02, device="cuda"), torch.zeros(cols, device="cuda", dtype=torch.int32)
    col_scales64, col_zps64 = col_scales.double(), col_zps.long()
    token_plan = bn.QuantizePerTokenPlan.select(bn.QuantizePerTokenDescriptor(rows, cols, -128, 127, "f32", "s8"))
    token_args = bn.QuantizePerTokenArgs(tokens, scales, zps, torch.empty(rows, cols, device="cuda",
                                                                          dtype=torch.int8))
    group_scales = torch.full((rows, cols // 128), 0.02, device="cuda")
    group_zps = torch.zeros(rows, cols // 128, device="cuda", dtype=torch.int32)

    def torch_group():  # no grouped quantize op in PyTorch: the eager composition
        y = torch.round(tokens.view(rows, -1, 128) / group_scales[..., None]) + group_zps[..., None]
        return torch.clamp(y, -128, 127).to(torch.int8)

    cases = [
        ("per_tensor", "QuantizePerTensorPlan.run (4096 f32)", lambda: plan.run(args),
         "torch.quantize_per_tensor", lambda: torch.quantize_per_tensor(small, 0.02, 3, torch.qint8)),
        ("per_tensor", "quantize_per_tensor() (4096 f32)", lambda: bn.quantize_per_tensor(small, 0.02, 3),
         "torch.quantize_per_tensor", lambda: torch.quantize_per_tensor(small, 0.02, 3, torch.qint8)),
        ("per_tensor", "dequantize_per_tensor() (4096 s8)", lambda: bn.dequantize_per_tensor(small_q, 0.02, 3),
         "Tensor.dequantize", tq.dequantize),
        ("per_tensor", "fake_quantize() (4096 f32)", lambda: bn.fake_quantize(small, 0.02, 3),
         "torch.fake_quantize_per_tensor_affine",
         lambda: torch.fake_quantize_per_tensor_affine(small, 0.02, 3, -128, 127)),
        ("per_channel", "quantize_per_channel() (16x256 f32, axis 1)",
         lambda: bn.quantize_per_channel(tokens, col_scales, col_zps, 1),
         "torch.quantize_per_channel", lambda: torch.quantize_per_channel(tokens, col_scales64, col_zps64, 1,
                                                                          torch.qint8)),
        ("per_token", "QuantizePerTokenPlan.run (16x256 f32)", lambda: token_plan.run(token_args),
         "torch.quantize_per_channel (axis 0)",
         lambda: torch.quantize_per_channel(tokens, scales64, zps64, 0, torch.qint8)),
        ("per_token", "quantize_per_token() (16x256 f32)", lambda: bn.quantize_per_token(tokens, scales, zps),
         "torch.quantize_per_channel (axis 0)",
         lambda: torch.quantize_per_channel(tokens, scales64, zps64, 0, torch.qint8)),
        ("per_group", "quantize_per_group() (16x256 f32, g128)",
         lambda: bn.quantize_per_group(tokens, group_scales, group_zps, 128),
         "eager round/clamp composition", torch_group),
    ]
    return [{"family": family, "call": label, "us": host_us(ours), "torch_op": torch_label,
             "torch_us": host_us(theirs)} for family, label, ours, torch_label, theirs in cases]


def markdown(bench: Bench, pairs: list[dict], host: dict[str, float], device: str, n: int) -> str:
    lines = [f"device: {device}; n = {n} elements; device-to-device copy: {bench.copy_gbs:.0f} GB/s", "",
             "| family | op | dtype | GB/s | % of copy | PyTorch op | PyTorch GB/s | ratio |",
             "|---|---|---|---:|---:|---|---:|---:|"]
    prefill = [r for r in bench.rows if "TOPS" in r]
    decode = [r for r in bench.rows if r.get("decode")]
    for r in bench.rows:
        if "TOPS" in r or r.get("decode"):
            continue
        torch_cols = (f"{r['torch_op']} | {r['torch_GB/s']:.0f} | {r['ratio']:.2f}x" if "torch_op" in r else " | | ")
        moved = (f" (on the {r['moved_bytes'] / n:g}n bytes it must move: {r['pct_copy_moved']:.1f}%)"
                 if "moved_bytes" in r else "")
        lines.append(f"| {r['family']} | {r['op']} | {r['dtype']} | {r['GB/s']:.0f} | {r['pct_copy']:.1f}%{moved} | "
                     f"{torch_cols} |")
    if prefill:
        lines += ["", "W8A8 linear, prefill (bf16 out; ours includes the per-token quantize of x; TOPS on 2MNK):", "",
                  "| M x N x K | ours TOPS | torch._int_mm + dequant TOPS | ratio | torch._int_mm alone TOPS | ratio |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['op'].split()[-1]} | {r['TOPS']:.0f} | {r['torch_TOPS']:.0f} | {r['ratio']:.2f}x | "
                  f"{r['raw_TOPS']:.0f} | {r['raw_ratio']:.2f}x |" for r in prefill]
    if decode:
        lines += ["", "W8A8 linear, decode (GPU time per call, CUDA graph replay of back-to-back calls, weights "
                  "rotating past L2; GB/s and % of copy on the int8 weight's bytes; F.linear streams a bf16 weight, "
                  "twice the bytes):", "",
                  "| tokens | N x K | ours us | GB/s | % of copy | F.linear bf16 us | its GB/s | speedup |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['m']} | {r['n']}x{r['k']} | {1e3 * r['ms']:.1f} | {r['GB/s']:.0f} | {r['pct_copy']:.1f}% | "
                  f"{1e3 * r['torch_ms']:.1f} | {r['torch_GB/s']:.0f} | {r['speedup']:.2f}x |" for r in decode]
    if pairs:
        lines += ["", "| family | host time per call | us | PyTorch op | us | PyTorch / ours |",
                  "|---|---|---:|---|---:|---:|"]
        lines += [f"| {p['family']} | {p['call']} | {p['us']:.1f} | {p['torch_op']} | {p['torch_us']:.1f} | "
                  f"{p['torch_us'] / p['us']:.2f}x |" for p in pairs]
    if host:
        lines += ["", "| host time per call | us |", "|---|---:|"] + [f"| {k} | {v:.1f} |" for k, v in host.items()]
    return "\n".join(lines) + "\n"


def chart(bench: Bench, path: Path) -> bool:
    """A bar chart of percent of copy bandwidth per op; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in bench.rows if "TOPS" not in r]
    labels = [f"{r['family']} {r['op']} {r['dtype']}" for r in rows]
    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.22 * len(labels))))
    ax.barh(labels, [r["pct_copy"] for r in rows], color="tab:blue")
    ax.axvline(90, color="tab:red", ls="--", label="90% target")
    ax.set_xlabel(f"% of device-to-device copy ({bench.copy_gbs:.0f} GB/s)")
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


@dataclass
class Context:
    """What a family's benchmark reads and adds to: the rows (``bench``), the problem size ``n``, the dtypes
    asked for, host-time pairs against PyTorch and plain host times."""

    bench: Bench
    n: int
    dtypes: list[str]
    pairs: list[dict] = field(default_factory=list)
    host: dict[str, float] = field(default_factory=dict)
    sections: dict[str, tuple[list[dict], str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    """One ``--only`` choice: its benchmark and the number of rows it adds for the dtypes asked."""

    run: Callable[[Context], None]
    rows: Callable[[list[str]], int]
    help: str
    default: bool = True  # part of a bare ``bench``; the PyTorch layer's benchmarks are asked for by name


def _torch_section(name: str) -> Callable[[Context], None]:
    """A family whose rows come from a PyTorch-layer benchmark module (``baracuda_numba.torch.benchmark_<name>``),
    written as its own section of the report."""

    def run_section(context: Context) -> None:
        import importlib

        module = importlib.import_module(f"baracuda_numba.torch.benchmark_{name}")
        rows = module.run(copy_gbs=context.bench.copy_gbs) if name == "qat" else module.run()
        context.sections[name] = (rows, module.markdown(rows))

    return run_section


def _segment_dtypes(dtypes: list[str]) -> list[str]:
    return [d for d in dtypes if d in ("f32", "bf16")]


FAMILIES: dict[str, Family] = {
    "per_tensor": Family(lambda c: per_tensor(c.bench, c.n, c.dtypes), lambda d: 6 * len(d),
                         "the six per-tensor ops, every dtype"),
    **{family: Family(lambda c, family=family: per_segment(c.bench, family, c.n, _segment_dtypes(c.dtypes)),
                      lambda d, rows=rows: rows * len(_segment_dtypes(d)), f"the {family} ops (f32, bf16)")
       for family, rows in (("per_channel", 8), ("per_token", 4), ("per_group", 4))},
    "host": Family(lambda c: c.pairs.extend(host_pairs()), lambda d: 0,
                   "host time per call of small problems, next to PyTorch"),
    "dynamic": Family(lambda c: dynamic(c.bench, c.n, c.pairs), lambda d: 6,
                      "dynamic-range quantize against eager and compiled PyTorch"),
    "lowbit": Family(lambda c: lowbit(c.bench, c.n), lambda d: 10, "FP8 and packed int4"),
    "linear": Family(lambda c: linear(c.bench, c.host),
                     lambda d: len(PREFILL_SHAPES) + len(DECODE_WEIGHTS) * len(DECODE_TOKENS),
                     "the W8A8 linear: prefill TOPS and decode GPU time"),
    "qat": Family(_torch_section("qat"), lambda d: 0,
                  "FakeQuantize forward + backward against torch.ao (not in the default)", default=False),
    "model": Family(_torch_section("model"), lambda d: 0,
                    "a Llama in bf16 and W8A8: eager, torch.compile, CUDA graphs (not in the default)", default=False),
}
DTYPES = ("f32", "bf16", "f16", "f64")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options, on ``parser`` (the command line's ``bench`` and ``python -m benchmarks``)."""
    parser.add_argument("--only", nargs="+", choices=list(FAMILIES),
                        default=[name for name, family in FAMILIES.items() if family.default], metavar="FAMILY",
                        help="families to run (default: all but qat and model): " + "; ".join(
                            f"{name}: {family.help}" for name, family in FAMILIES.items()))
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES), metavar="DTYPE",
                        help="float dtypes of the memory-bound ops: f32 bf16 f16 f64 (default: all)")
    parser.add_argument("--log2n", type=int, default=28, help="elements of the memory-bound problems, as a power "
                        "of two (default 28: 1 GiB of f32)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per row, median kept (default 20)")
    parser.add_argument("--out", default="benchmarks/results", metavar="DIR",
                        help="directory for bench.json, bench.md and bench.png (default benchmarks/results)")


def card() -> str:
    """The GPU the benchmark runs on, in one line."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return (f"{props.name}, compute capability {props.major}.{props.minor}, {props.multi_processor_count} SMs, "
            f"{props.total_memory / 2**30:.0f} GiB; PyTorch {torch.__version__}, baracuda-numba {bn.__version__}")


def run(args: argparse.Namespace) -> int:
    """Run the families ``args.only`` asks for and write the reports; 2 without a GPU or PyTorch."""
    if not 10 <= args.log2n <= 34 or args.repeats < 1:
        print(f"baracuda-numba bench: --log2n expected 10..34 and --repeats >= 1, got {args.log2n} and "
              f"{args.repeats}", file=sys.stderr)
        return 2
    if not _import_torch() or not torch.cuda.is_available():
        print("baracuda-numba bench: needs a CUDA GPU and PyTorch with CUDA", file=sys.stderr)
        return 2
    n = 1 << args.log2n
    total = sum(FAMILIES[name].rows(args.dtypes) for name in args.only)
    context = Context(Bench(args.repeats, total), n, list(args.dtypes))
    device = torch.cuda.get_device_name()
    print(f"card: {card()}", flush=True)
    context.bench.copy(n)
    print(f"device-to-device copy: {context.bench.copy_gbs:.0f} GB/s (n = 2^{args.log2n})", flush=True)
    for name, family in FAMILIES.items():  # in the table's order, whatever the order asked
        if name in args.only:
            family.run(context)
    text = markdown(context.bench, context.pairs, context.host, device, n)
    text += "".join(f"\n{section}" for _, section in context.sections.values())
    print("\n" + text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(text)
    (out / "bench.json").write_text(json.dumps({"device": device, "card": card(), "n": n,
                                                "copy_GB/s": context.bench.copy_gbs, "rows": context.bench.rows,
                                                "host_pairs": context.pairs, "host_us": context.host,
                                                **{name: rows for name, (rows, _) in context.sections.items()}},
                                               indent=1))
    if not chart(context.bench, out / "bench.png"):
        print("matplotlib not installed: no bench.png")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baracuda-numba bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
