"""Where the two-launch decode's time goes: the per-token quantizer alone (under each
``DynamicTuning.wide_segment_keep`` of ``WIDE_KEEPS``), a trivial torch kernel (the per-node floor),
the GEMM alone, both launches (the GEMM as the quantizer's programmatic dependent, and plain) and the
fused kernel; CUDA-graph replay with weights rotating past L2, as in ``tune_linear``.

    python3 -m benchmarks.probe_decode"""

from __future__ import annotations

import dataclasses
import itertools
import json

import torch

import baracuda_numba as bn
from baracuda_numba.ops.common import clear_plan_cache
from baracuda_numba.plans import dynamic as plans_dynamic
from baracuda_numba.plans import linear as plans
from benchmarks.tune_linear import copy_gbs, decode_problem, gemm_runner, graph_ms

SHAPES = [(m, n, k) for n, k in ((4096, 4096), (8192, 8192), (4096, 11008)) for m in (1, 16)]
# DynamicTuning.wide_segment_keep timed (chunks per thread of the quantizer's block for rows longer than
# the resident block's 128 threads x 4 chunks: bf16 K > 4096)
WIDE_KEEPS = (4, 8, 16)


def two_launch(x, weights, ws, dependent: bool):
    """``quantized_linear`` through the two launches (the fused and cooperative kernels off), weights
    rotating."""
    plans.FUSED_MAX_M = plans.FUSED_ANY_SHAPE_MAX_M = plans.COOPERATIVE_MAX_M = 0
    plans.DEPENDENT_GEMM = dependent
    clear_plan_cache()
    calls = itertools.cycle(weights)
    return lambda: bn.quantized_linear(x, next(calls), ws)


def main() -> None:
    saved = (plans.FUSED_MAX_M, plans.FUSED_ANY_SHAPE_MAX_M, plans.FUSED_MIN_K, plans.FUSED_MIN_N,
             plans.LONG_ROWS_FUSED_MAX_M)
    copy = copy_gbs()
    print(f"copy {copy:.0f} GB/s")
    for m, n, k in SHAPES:
        x, _, ws, _, weights, xq, sx, out = decode_problem(m, n, k)
        row = {"shape": f"M={m} {n}x{k}"}
        row["empty_like_us"] = 1e3 * graph_ms(lambda x=x: torch.empty_like(x).fill_(0), calls=20)
        plans.DEPENDENT_GEMM = True
        clear_plan_cache()
        runners = itertools.cycle([gemm_runner(xq, sx, wi, ws, None, out, dependent=False) for wi in weights])
        row["gemm_us"] = 1e3 * graph_ms(lambda r=runners: next(r)(), calls=10 * len(weights))
        shipped = plans_dynamic.TUNING
        for keep in WIDE_KEEPS:
            plans_dynamic.TUNING = dataclasses.replace(shipped, wide_segment_keep=keep)
            clear_plan_cache()
            row[f"quantizer_k{keep}_us"] = 1e3 * graph_ms(lambda x=x: bn.dynamic_range_quantize(x), calls=20)
            for dependent in (True, False) if keep == WIDE_KEEPS[0] else (True,):
                row[f"two_launch{'' if dependent else '_plain'}_k{keep}_us"] = 1e3 * graph_ms(
                    two_launch(x, weights, ws, dependent), calls=10 * len(weights))
        plans_dynamic.TUNING = shipped
        plans.FUSED_MAX_M = plans.FUSED_ANY_SHAPE_MAX_M = plans.LONG_ROWS_FUSED_MAX_M = 16
        plans.FUSED_MIN_K = plans.FUSED_MIN_N = 0
        clear_plan_cache()
        calls = itertools.cycle(weights)
        row["fused_us"] = 1e3 * graph_ms(lambda c=calls, x=x, ws=ws: bn.quantized_linear(x, next(c), ws),
                                         calls=10 * len(weights))
        (plans.FUSED_MAX_M, plans.FUSED_ANY_SHAPE_MAX_M, plans.FUSED_MIN_K, plans.FUSED_MIN_N,
         plans.LONG_ROWS_FUSED_MAX_M) = saved
        row["stream_us"] = n * k / copy / 1e3
        pct = {key[:-3]: round(100 * row["stream_us"] / v, 1) for key, v in row.items()
               if key.startswith(("two_launch", "fused", "gemm"))}
        print(json.dumps({key: round(v, 2) if isinstance(v, float) else v for key, v in row.items()}), flush=True)
        print("  % of copy:", json.dumps(pct), flush=True)


if __name__ == "__main__":
    main()
