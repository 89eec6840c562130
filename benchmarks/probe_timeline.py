"""A timeline of the shipped decode GEMM inside a CUDA graph of back-to-back calls, weights rotating past L2.

Every plan selected here builds its aligned skinny GEMM as the profiling build (``linear_kernel(...,
trace=True)``): thread 0 of each block stamps ``%globaltimer`` when the block starts, when its wait for the kernel
before returns, when its weight stream ends and after its stores. The stamps land in the bias slot, which without a
bias is the call's ``weight_scale``; every call has its own scale vector, so each call's stamps survive the replay
(the outputs are garbage, the timing is the shipped kernel's, plus four stores a block).

Parts, as ``benchmarks.probe_decode_knobs`` names them: ``linear`` (``quantized_linear``: the per-token quantizer,
then the GEMM as its programmatic dependent), ``gemm`` (the same GEMM on pre-quantized rows, each waiting on the GEMM
before it: the chain without a quantizer) and ``sq`` (SmoothQuant's GEMM waiting first on the kernel before it).

Printed per shape and part, in microseconds from the end of the previous call's GEMM (its last block's last stamp),
medians over the graph's calls after the first two: the blocks' first / median / last start, their waits' median /
last return, their weight streams' median / last end, the last block's end (the call's period) and the period as %
of the eager copy on the weight's bytes.

    python3 -m benchmarks.probe_timeline --out DIR [--nk 4096x4096 11008x4096] [--m 4 8 16]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import baracuda_numba as bn
from baracuda_numba.ops.common import clear_plan_cache
from baracuda_numba.plans import linear as plans

from .tune_linear import LOG, decode_problem, gemm_runner, say, start_probe

COLUMNS = ("start first", "start median", "start last", "wait median", "wait last", "stream median", "stream last",
           "period")


def traced_builds() -> None:
    """Make every aligned unfused skinny GEMM the plans build from now on the profiling build."""
    shipped = plans.linear_kernel

    def build(out, has_bias, per_tensor_rows, skinny=False, *args, **kwargs):
        if skinny and kwargs.get("vector_only") and not has_bias:
            kwargs["trace"] = True
        return shipped(out, has_bias, per_tensor_rows, skinny, *args, **kwargs)

    plans.linear_kernel = build
    clear_plan_cache()


def timeline(calls_of, scales: list[torch.Tensor], blocks: int) -> np.ndarray:
    """Replay ``calls_of`` (one closure a call, the i-th stamping into ``scales[i]``) captured in one graph and
    return the medians of :data:`COLUMNS` over calls 2 onwards, in us from the previous call's GEMM end."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls_of[:2]:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls_of:
            call()
    rows = []
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        stamps = np.stack([s[:4 * blocks].view(torch.int32).cpu().numpy().astype(np.int64) & 0xFFFFFFFF
                           for s in scales]).reshape(len(scales), blocks, 4)
        for i in range(2, len(scales)):
            origin = stamps[i - 1, :, 3].max()
            start, wait, stream_end, end = (((stamps[i] - origin + (1 << 31)) % (1 << 32) - (1 << 31)) / 1e3).T
            rows.append([start.min(), np.median(start), start.max(), np.median(wait), wait.max(),
                         np.median(stream_end), stream_end.max(), end.max()])
    return np.median(np.array(rows), axis=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/probe_timeline")
    parser.add_argument("--nk", nargs="*", default=["4096x4096", "11008x4096"])
    parser.add_argument("--m", nargs="*", type=int, default=[4, 8, 16])
    parser.add_argument("--parts", nargs="*", default=["gemm", "linear", "sq"])
    args = parser.parse_args()
    out, copy = start_probe(args.out)
    traced_builds()
    say("us from the previous call's GEMM end: " + " | ".join(COLUMNS) + " | % of copy")
    rows = []
    for nk in args.nk:
        n, k = map(int, nk.split("x"))
        for m in args.m:
            x, _, ws, _, weights, xq, sx, gemm_out = decode_problem(m, n, k, seed=m + n)
            act = torch.clamp(torch.round(x.float() * 50), -127, 127).to(torch.int8)
            selected = {
                "gemm": bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16")),
                "sq": bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(m, n, k, "bf16")),
            }
            selected["linear"] = selected["gemm"]
            scales = [ws.clone() for _ in weights]
            pairs = list(zip(weights, scales, strict=True))
            parts = {
                "gemm": [gemm_runner(xq, sx, w, s, None, gemm_out) for w, s in pairs],
                "linear": [lambda w=w, s=s, x=x: bn.quantized_linear(x, w, s) for w, s in pairs],
                "sq": [lambda w=w, s=s, act=act: bn.smoothquant_linear(act, w, s, 0.02, dtype="bfloat16")
                       for w, s in pairs],
            }
            for part in args.parts:
                variant = selected[part]._aligned_variant
                blocks = selected[part]._variants[variant][2]
                if variant != "skinny_vector" or 4 * blocks > n:
                    say(f"M={m} {n}x{k} {part}: {variant}, {blocks} blocks (no profiling build, or its stamps "
                        f"do not fit {n} scales); skipped")
                    continue
                r = timeline(parts[part], scales, blocks)
                pct = 100 * n * k / (r[-1] * 1e3) / copy
                row = {"shape": f"M={m} {n}x{k}", "part": part, "blocks": blocks,
                       **{c: round(float(v), 2) for c, v in zip(COLUMNS, r, strict=True)}, "pct_copy": round(pct, 1)}
                rows.append(row)
                say(f"M={m:2d} {n}x{k} {part:6s} " + " | ".join(f"{v:6.2f}" for v in r) + f" | {pct:5.1f}")
            (out / "probe_timeline.log").write_text("\n".join(LOG))
    (out / "probe_timeline.json").write_text(json.dumps({"copy_GBs": copy, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
