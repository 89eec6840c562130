"""The W8A8 decode's per-token quantizer under ``DynamicTuning`` variants (the general resident kernel, the
fixed one, split across blocks), GPU time.

For each decode shape: ``quantized_linear`` back to back (graph replay, weights rotating past L2) under each
variant, the static-activation call (no reduction: the quantizer's floor) and the per-token quantizer
alone, as % of the eager device-to-device copy on the weight's bytes (the quantizer alone in us). Every
variant's output is bit-compared with the first variant's.

    python -m benchmarks.probe_decode_quantizer --out DIR [--nk 4096x4096 ...] [--m 8 16] [--variants ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json

import baracuda_numba as bn
from baracuda_numba.ops.common import clear_plan_cache
from baracuda_numba.plans import dynamic as plans_dynamic

from .tune_linear import LOG, bit_equal, decode_problem, graph_ms, say, start_probe

SHIPPED = plans_dynamic.TUNING
VARIANTS = {"general": dict(fixed_segments=False), "fixed": dict(fixed_segments=True),
            "fixed_k2": dict(fixed_segments=True, fixed_keep=2), "fixed_k1": dict(fixed_segments=True, fixed_keep=1),
            "fixed_split2": dict(fixed_segments=True, segment_split=2),
            # fewer, longer lanes: 16 chunks a lane is one warp a row at K = 4096 (no barrier), two at 8192
            "fixed_k8": dict(fixed_segments=True, fixed_keep=8), "fixed_k16": dict(fixed_segments=True, fixed_keep=16)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/probe_decode_quantizer")
    parser.add_argument("--nk", nargs="*", default=["4096x4096", "11008x4096", "8192x8192"])
    parser.add_argument("--m", nargs="*", type=int, default=[1, 8, 16])
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS)[:4])
    args = parser.parse_args()
    out, copy = start_probe(args.out)
    rows = []
    for nk, m in itertools.product(args.nk, args.m):
        n, k = map(int, nk.split("x"))
        x, w, ws, _, weights, _, _, _ = decode_problem(m, n, k, seed=m + n)
        row = {"shape": f"M={m} {n}x{k}"}
        outputs = {}
        for label in args.variants:
            plans_dynamic.TUNING = dataclasses.replace(SHIPPED, **VARIANTS[label])
            clear_plan_cache()
            plan = bn.DynamicRangeQuantizePlan.select(bn.DynamicRangeQuantizeDescriptor(
                (m, k), plans_dynamic.DynamicRangeMode.SYMMETRIC, plans_dynamic.DynamicRangeScope.token(), -127, 127,
                "bf16", "s8"))
            row[f"{label}_kernel"] = f"{plan._segment_kernels[0].py_func.__name__} x {plan._segment_blocks}"
            outputs[label] = bn.quantized_linear(x, w, ws)
            calls = itertools.cycle(weights)
            ms = graph_ms(lambda calls=calls, x=x, ws=ws: bn.quantized_linear(x, next(calls), ws),
                          calls=10 * len(weights))
            row[f"{label}_pct"] = 100 * n * k / ms / 1e6 / copy
            ms = graph_ms(lambda x=x: bn.dynamic_range_quantize(x), calls=50)
            row[f"{label}_quantizer_us"] = 1e3 * ms
        plans_dynamic.TUNING = SHIPPED
        clear_plan_cache()
        calls = itertools.cycle(weights)
        ms = graph_ms(lambda calls=calls, x=x, ws=ws: bn.quantized_linear(x, next(calls), ws, act_scale=0.02),
                      calls=10 * len(weights))
        row["static_act_pct"] = 100 * n * k / ms / 1e6 / copy
        first = outputs[args.variants[0]]
        row["all equal"] = all(bit_equal(first, v) for v in outputs.values())
        say(json.dumps(row, default=lambda v: round(v, 1)))
        rows.append(row)
        (out / "probe_decode_quantizer.log").write_text("\n".join(LOG))
    summary = json.dumps({"copy_GBs": copy, "rows": rows}, indent=1, default=str)
    (out / "probe_decode_quantizer.json").write_text(summary)


if __name__ == "__main__":
    main()
