"""W8A8 tuning values on the GPU: variants of the card's :class:`~baracuda_numba.plans.linear.LinearTuning`
against it, bit for bit and in GPU time, in one run (``docs/design-linear.md``, "Tuning values").

    python -m benchmarks.tune_linear --out DIR [--variant NAME:FIELD=VALUE[;FIELD=VALUE...] ...]
                                     [--only prefill decode smoothquant] [--shapes MxNxK ...]

A variant is the current card's tuning value with fields replaced; a value is a Python literal or a
``PipelineShape(...)`` / ``WgmmaShape(...)`` (for example ``--variant "one chunk:vector_chunks=1"`` or
``--variant "narrow:wgmma_narrow=WgmmaShape(tile_n=128, stages=6)"``). For the shipped value and each variant, at
every shape: the kernels chosen (their configuration names), the output against the shipped value's bit for bit,
and the GPU time of back-to-back calls replayed from a CUDA graph, each call on the next of several weight copies
(past L2): TOPS for prefill, % of the device-to-device copy bandwidth (measured in the same run) on the weight's
bytes for decode. Writes ``tune_linear.json`` and ``tune_linear.md`` into ``DIR``.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
from dataclasses import fields, replace
from pathlib import Path

import torch

import baracuda_numba as bn
from baracuda_numba import bench
from baracuda_numba.bench import device_ms, graph_ms
from baracuda_numba.kernels.linear import PipelineShape, WgmmaShape
from baracuda_numba.plans.linear import LinearTuning, current_tuning

PREFILL = [(4096, 4096, 4096), (2048, 4096, 4096), (2048, 11008, 4096), (2048, 4096, 11008), (128, 4096, 4096)]
DECODE = [(m, n, k) for n, k in ((4096, 4096), (8192, 8192), (11008, 4096)) for m in (1, 2, 4, 8, 16)]
ROTATION_BYTES = 512 << 20  # weight copies per shape: past the L2 of every card
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float64: torch.int64}


def parse_variant(text: str, base: LinearTuning) -> tuple[str, LinearTuning]:
    """``NAME:FIELD=VALUE[;FIELD=VALUE...]`` as ``(NAME, base with those fields)``."""
    name, _, assignments = text.partition(":")
    known = {f.name for f in fields(LinearTuning)}
    changes = {}
    for assignment in filter(None, assignments.split(";")):
        field, _, value = assignment.partition("=")
        field = field.strip()
        if field not in known:
            raise SystemExit(f"tune_linear: --variant {text!r}: no tuning field {field!r}")
        changes[field] = _value(value.strip())
    return name, replace(base, **changes)


def _value(text: str):
    """A literal, or a pipeline / warpgroup shape (or a tuple of them)."""
    tree = ast.parse(text, mode="eval")
    names = {"PipelineShape": PipelineShape, "WgmmaShape": WgmmaShape, "None": None, "True": True, "False": False}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in names:
            raise SystemExit(f"tune_linear: {text!r}: only literals, PipelineShape and WgmmaShape")
    return eval(compile(tree, "<variant>", "eval"), {"__builtins__": {}}, names)  # only the names above


def copy_gbs() -> float:
    """GB/s (read plus written) of an eager device-to-device copy of 1 GiB: the ceiling of the decode rows."""
    src = torch.ones(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    return 2 * (1 << 30) / device_ms(lambda: dst.copy_(src), 20) / 1e6


def _plan(m, n, k, tuning, smoothquant):
    if smoothquant:
        return bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(m, n, k, "bf16"), tuning=tuning)
    return bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16"), tuning=tuning)


def _call(plan, x, w, ws, out):
    if isinstance(plan, bn.SmoothQuantLinearPlan):
        plan.run(bn.SmoothQuantLinearArgs(x, w, ws, 0.0173, out))
    else:
        plan.run(bn.QuantizedLinearArgs(x, w, ws, out))


def measure(m: int, n: int, k: int, tunings: dict[str, LinearTuning], smoothquant: bool) -> dict[str, dict]:
    """Each tuning value's plan at ``m x n x k``: kernels, bits against the first value's, GPU ms per call."""
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    if smoothquant:
        x = torch.randint(-127, 128, (m, k), device="cuda", generator=g, dtype=torch.int8)
    else:
        x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
    copies = max(1, -(-ROTATION_BYTES // (n * k)))
    weights = [torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8) for _ in range(copies)]
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    rows, reference = {}, None
    for name, tuning in tunings.items():
        plan = _plan(m, n, k, tuning, smoothquant)
        _call(plan, x, weights[0], ws, out)
        torch.cuda.synchronize()
        result = out.clone()
        reference = result if reference is None else reference
        rotation = itertools.cycle(weights)
        ms = graph_ms(lambda plan=plan, rotation=rotation: _call(plan, x, next(rotation), ws, out), 2 * copies)
        aligned = plan.spec.variant(plan.spec.aligned)
        bits = BITS[result.dtype]
        rows[name] = {"kernel": aligned.config.name, "blocks": aligned.blocks(m, n), "ms": ms,
                      "same_bits": bool(torch.equal(result.view(bits), reference.view(bits))),
                      "TOPS": 2 * m * n * k / ms / 1e9, "GB/s": n * k / ms / 1e6}
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--variant", action="append", default=[], help="NAME:FIELD=VALUE[;FIELD=VALUE...]")
    parser.add_argument("--only", nargs="+", choices=("prefill", "decode", "smoothquant"),
                        default=["prefill", "decode", "smoothquant"])
    parser.add_argument("--shapes", nargs="+", default=None, help="MxNxK (in place of the built-in lists)")
    args = parser.parse_args(argv)
    bench._import_torch()  # the shared timers read the module's torch
    base = current_tuning()
    tunings = {"shipped": base, **dict(parse_variant(text, base) for text in args.variant)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    copy = copy_gbs()
    report = {"device": torch.cuda.get_device_name(), "tuning": base.card, "copy_gbs": copy, "rows": []}
    print(f"{report['device']} ({base.card} tuning); device-to-device copy {copy:.0f} GB/s", flush=True)
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes] if args.shapes else None
    sections = [("prefill", shapes or PREFILL, False), ("decode", shapes or DECODE, False),
                ("smoothquant", shapes or DECODE, True)]
    lines = [f"# W8A8 tuning variants on {report['device']}", "", f"Copy {copy:.0f} GB/s; tuning {base.card}.", "",
             "| section | M x N x K | variant | kernel | blocks | same bits | TOPS | % of copy |",
             "|---|---|---|---|---|---|---|---|"]
    for section, problems, smoothquant in sections:
        if section not in args.only:
            continue
        for m, n, k in problems:
            for name, row in measure(m, n, k, tunings, smoothquant).items():
                row |= {"section": section, "shape": f"{m}x{n}x{k}", "variant": name,
                        "pct_copy": 100 * row["GB/s"] / copy}
                report["rows"].append(row)
                print(f"{section} {row['shape']} {name}: {row['kernel']} x{row['blocks']}, {row['TOPS']:.0f} TOPS, "
                      f"{row['pct_copy']:.1f}% of copy{'' if row['same_bits'] else ', BITS DIFFER'}", flush=True)
                lines.append(f"| {section} | {row['shape']} | {name} | `{row['kernel']}` | {row['blocks']} | "
                             f"{'yes' if row['same_bits'] else '**no**'} | {row['TOPS']:.0f} | {row['pct_copy']:.1f} |")
    (out / "tune_linear.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "tune_linear.md").write_text("\n".join(lines) + "\n")
    return 0 if all(row["same_bits"] for row in report["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
