"""Per-tensor ops on the GPU: GB/s against the device-to-device copy measured in the same run and
against the matching PyTorch op; plus the host time of ``plan.run`` on a small problem.

    python benchmarks/bench_per_tensor.py [--log2n 28] [--json results.json] [--sweep]

Timing: CUDA events around each call, warm-up first, median of ``--repeats``; tensors of 2^28
elements (1 GiB of f32) dwarf the 50 MB L2, so no buffer rotation is needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

import baracuda_numba as bn
from baracuda_numba.registry import LaunchPolicy


def device_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end))
    return statistics.median(samples)


def host_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        best = min(best, elapsed / calls * 1e6)
    return best


TORCH = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2n", type=int, default=28)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dtypes", nargs="+", default=["f32", "bf16", "f16", "f64"])
    parser.add_argument("--json", default=None)
    parser.add_argument("--sweep", action="store_true", help="also try launch policies on f32->s8")
    args = parser.parse_args()
    n = 1 << args.log2n
    scale, zp = 0.0213, 3
    rows = []

    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = device_ms(lambda: dst.copy_(src), args.repeats)
    copy_gbs = 2 * 4 * n / copy_ms / 1e6
    dst = None
    print(f"device: {torch.cuda.get_device_name()}, n = 2^{args.log2n}; copy f32: {copy_gbs:.0f} GB/s")

    def add(op, dtype, bytes_moved, ms, torch_ms=None, torch_name=""):
        gbs = bytes_moved / ms / 1e6
        row = {"op": op, "dtype": dtype, "ms": ms, "GB/s": gbs, "pct_copy": 100 * gbs / copy_gbs}
        if torch_ms is not None:
            row.update({"torch_op": torch_name, "torch_GB/s": bytes_moved / torch_ms / 1e6, "ratio": torch_ms / ms})
        rows.append(row)

    for name in args.dtypes:
        dtype = TORCH[name]
        size = torch.tensor([], dtype=dtype).element_size()
        x = (src * 3).to(dtype)
        dy = torch.randn(n, device="cuda", dtype=dtype)
        q = torch.empty(n, device="cuda", dtype=torch.int8)
        y = torch.empty_like(x)
        plans = {
            "quantize": (bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(n, -128, 127, name, "s8")),
                         bn.QuantizePerTensorArgs(x, scale, zp, q), size + 1),
            "dequantize": (bn.DequantizePerTensorPlan.select(bn.DequantizePerTensorDescriptor(n, name, "s8")),
                           bn.DequantizePerTensorArgs(q, scale, zp, y), size + 1),
            "fake_quantize": (bn.FakeQuantizePlan.select(bn.FakeQuantizeDescriptor(n, -128, 127, name)),
                              bn.FakeQuantizeArgs(x, scale, zp, y), 2 * size),
            "quantize_backward": (bn.QuantizePerTensorBackwardPlan.select(
                bn.QuantizePerTensorBackwardDescriptor(n, -128, 127, name, "s8")),
                bn.QuantizePerTensorBackwardArgs(x, scale, zp, dy, y), 3 * size),
            "fake_quantize_backward": (bn.FakeQuantizeBackwardPlan.select(
                bn.FakeQuantizeBackwardDescriptor(n, -128, 127, name)),
                bn.FakeQuantizeBackwardArgs(x, scale, zp, dy, y), 3 * size),
            "dequantize_backward": (bn.DequantizePerTensorBackwardPlan.select(
                bn.DequantizePerTensorBackwardDescriptor(n, name, "s8")),
                bn.DequantizePerTensorBackwardArgs(scale, dy, y), 2 * size),
        }
        for op, (plan, plan_args, bytes_per_element) in plans.items():
            ms = device_ms(lambda p=plan, a=plan_args: p.run(a), args.repeats)
            torch_ms, torch_name = None, ""
            if op == "quantize" and name == "f32":
                torch_ms = device_ms(lambda x=x: torch.quantize_per_tensor(x, scale, zp, torch.qint8), args.repeats)
                torch_name = "torch.quantize_per_tensor"
            elif op == "dequantize" and name == "f32":
                tq = torch.quantize_per_tensor(x, scale, zp, torch.qint8)
                torch_ms = device_ms(lambda tq=tq: tq.dequantize(), args.repeats)
                torch_name = "Tensor.dequantize"
            elif op == "fake_quantize":
                torch_ms = device_ms(lambda x=x: torch.fake_quantize_per_tensor_affine(x, scale, zp, -128, 127),
                                     args.repeats)
                torch_name = "torch.fake_quantize_per_tensor_affine"
            add(op, name, bytes_per_element * n, ms, torch_ms, torch_name)
        del x, dy, q, y, plans
        torch.cuda.empty_cache()

    if args.sweep:
        x = src.clone()
        q = torch.empty(n, device="cuda", dtype=torch.int8)
        base = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(n, -128, 127, "f32", "s8"))
        for threads, per_sm in [(512, 16), (512, 4), (256, 8), (256, 32), (1024, 2), (512, 64), (128, 64)]:
            base.entry = dataclasses.replace(base.entry, policy=LaunchPolicy(threads, per_sm))
            ms = device_ms(lambda b=base: b.run(bn.QuantizePerTensorArgs(x, scale, zp, q)), args.repeats)
            add(f"quantize[{threads}x{per_sm}/SM]", "f32", 5 * n, ms)
        del x, q

    small = torch.randn(4096, device="cuda")
    small_q = torch.empty(4096, device="cuda", dtype=torch.int8)
    small_plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(4096, -128, 127, "f32", "s8"))
    small_args = bn.QuantizePerTensorArgs(small, scale, zp, small_q)
    host = {
        "plan.run (4096, torch tensors)": host_us(lambda: small_plan.run(small_args)),
        "quantize_per_tensor() (4096)": host_us(lambda: bn.quantize_per_tensor(small, scale, zp)),
        "torch.quantize_per_tensor (4096)": host_us(lambda: torch.quantize_per_tensor(small, scale, zp, torch.qint8)),
        "torch.fake_quantize_per_tensor_affine (4096)": host_us(
            lambda: torch.fake_quantize_per_tensor_affine(small, scale, zp, -128, 127)),
    }

    print(f"\n| op | dtype | GB/s | % of copy ({copy_gbs:.0f} GB/s) | PyTorch op | PyTorch GB/s | ratio |")
    print("|---|---|---:|---:|---|---:|---:|")
    for r in rows:
        torch_cols = (f"{r['torch_op']} | {r['torch_GB/s']:.0f} | {r['ratio']:.2f}x" if "torch_op" in r else " | | ")
        print(f"| {r['op']} | {r['dtype']} | {r['GB/s']:.0f} | {r['pct_copy']:.1f}% | {torch_cols} |")
    print("\n| host time per call | us |\n|---|---:|")
    for k, v in host.items():
        print(f"| {k} | {v:.1f} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "n": n, "copy_GB/s": copy_gbs, "rows": rows,
                       "host_us": host}, fh, indent=1)


if __name__ == "__main__":
    main()
