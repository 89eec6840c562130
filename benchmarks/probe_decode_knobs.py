"""The W8A8 decode under knob variants of ``kernels.linear`` / ``plans.linear`` / ``plans.dynamic``, GPU time.

For each decode shape and variant: the GEMM alone on pre-quantized rows (the dependent kernel back to back),
``quantized_linear`` (per-token activations; under the static-weight promise, as ``W8A8Linear`` calls it:
`static_linear`), SmoothQuant's GEMM under the static promise (`static_sq`) and without it
(`sq`) and the static-activation
``quantized_linear``, each back to back in graph replay with the weights rotating past L2, as % of the eager
device-to-device copy on the weight's bytes. Every output is bit-compared with the first variant's.

    python -m benchmarks.probe_decode_knobs --out DIR [--nk 4096x4096 ...] [--m 8 16] \
        --variants shipped: t4c2:SKINNY_TILES=4,DEPENDENT_CHUNKS=2,DEPENDENT_MIN_BLOCKS=0

A variant is ``label:`` followed by comma-separated ``NAME=value`` (Python literals); names as
``tune_linear.knob_module`` reads them (``plans.`` / ``dynamic.`` prefixes).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import re

import torch

import baracuda_numba as bn
from baracuda_numba.ops.common import clear_plan_cache

from .tune_linear import LOG, bit_equal, decode_problem, gemm_runner, graph_ms, knob_module, say, start_probe


def parse_variant(text: str) -> tuple[str, dict]:
    label, _, body = text.partition(":")
    knobs = {}
    for item in filter(None, re.split(r",(?![^()]*\))", body)):  # commas inside a tuple stay
        name, _, value = item.partition("=")
        knobs[name] = ast.literal_eval(value)
    return label, knobs


def runners_of(x, xq, sx, ws, act, gemm_out) -> dict:
    """Per part, a function of the weight giving the call to time."""
    return {
        "gemm": lambda wi: gemm_runner(xq, sx, wi, ws, None, gemm_out),
        "linear": lambda wi: (lambda: bn.quantized_linear(x, wi, ws)),
        "static_sq": lambda wi: (lambda: bn.smoothquant_linear(act, wi, ws, 0.02, dtype="bfloat16",
                                                                static_weight=True)),
        "sq": lambda wi: (lambda: bn.smoothquant_linear(act, wi, ws, 0.02, dtype="bfloat16")),
        "static_act": lambda wi: (lambda: bn.quantized_linear(x, wi, ws, static_weight=True, act_scale=0.02)),
        "static_linear": lambda wi: (lambda: bn.quantized_linear(x, wi, ws, static_weight=True)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/probe_decode_knobs")
    parser.add_argument("--nk", nargs="*", default=["4096x4096", "8192x8192"])
    parser.add_argument("--m", nargs="*", type=int, default=[8, 16])
    parser.add_argument("--variants", nargs="*", default=["shipped:"])
    parser.add_argument("--parts", nargs="*", default=["gemm", "linear", "static_sq", "static_act"])
    args = parser.parse_args()
    variants = [parse_variant(v) for v in args.variants]
    names = {name for _, knobs in variants for name in knobs}
    saved = {name: getattr(*knob_module(name)) for name in names}
    out, copy = start_probe(args.out)
    rows = []
    for nk, m in itertools.product(args.nk, args.m):
        n, k = map(int, nk.split("x"))
        x, w, ws, _, weights, xq, sx, gemm_out = decode_problem(m, n, k, seed=m + n)
        act = torch.clamp(torch.round(x.float() * 50), -127, 127).to(torch.int8)
        row = {"shape": f"M={m} {n}x{k}"}
        outputs: dict[str, list] = {}
        for label, knobs in variants:
            for name, value in {**saved, **knobs}.items():
                setattr(*knob_module(name), value)
            clear_plan_cache()
            plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16"))
            _, _, blocks, threads = plan._variants[plan._aligned_variant]
            row[f"{label}_gemm_grid"] = f"{blocks} x {threads}"
            got = []
            runs = runners_of(x, xq, sx, ws, act, gemm_out)
            for part in args.parts:
                result = runs[part](w)()
                got.append((gemm_out if part == "gemm" else result).clone())
                runners = itertools.cycle([runs[part](wi) for wi in weights])
                ms = graph_ms(lambda runners=runners: next(runners)(), calls=10 * len(weights))
                row[f"{label}_{part}"] = 100 * n * k / ms / 1e6 / copy
            outputs[label] = got
        for name, value in saved.items():
            setattr(*knob_module(name), value)
        clear_plan_cache()
        first = outputs[variants[0][0]]
        row["all equal"] = all(bit_equal(a, b) for got in outputs.values() for a, b in zip(first, got, strict=True))
        say(json.dumps(row, default=lambda v: round(v, 1)))
        rows.append(row)
        (out / "probe_decode_knobs.log").write_text("\n".join(LOG))
    (out / "probe_decode_knobs.json").write_text(json.dumps({"copy_GBs": copy, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
