"""The stream-K decode GEMM (``linear_kernel(..., stream_k=True)``) against the shipped one, GPU time.

The shipped decode GEMM gives each block one column tile's whole K; where the blocks make a fraction of a
wave more than a whole number (11008 x 4096: 688 blocks, 2.6 waves at two per SM), the last wave runs on a
fraction of the slots. The stream-K kernel splits the main-loop iterations evenly over a one-wave grid,
crossing column tiles with its loads in flight, and adds the split tiles' int32 sums through a zeroed
workspace. Measured here, CUDA-graph replay of back-to-back calls with the weights rotating past L2, % of
the eager copy on the weight's bytes, three ways:

- ``gemm``: the GEMM alone on pre-quantized activations (the shipped one through its plan);
- ``ql``: ``quantized_linear``'s two launches (the per-token quantizer, then the GEMM as its programmatic
  dependent), against the shipped ``quantized_linear``;
- ``sq``: SmoothQuant's GEMM (waiting first thing), against the shipped ``smoothquant_linear``.

Every stream-K output is compared bit for bit with the shipped one.

    python3 -m benchmarks.probe_stream_k [--shapes 11008x4096 ...] [--m 1 8 16]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

import baracuda_numba as bn
from baracuda_numba.kernels import linear as gemm
from baracuda_numba.launch import ArrayArg, KernelLauncher
from baracuda_numba.plans import linear as plans
from baracuda_numba.vocabulary import ElementKind
from benchmarks.tune_linear import bit_equal, copy_gbs, decode_problem, gemm_runner, graph_ms

SCALARS = plans._SCALARS
# (label, chunks in flight, blocks per SM (launch bounds and grid), L2 prefetch before the wait; SmoothQuant's:
# before its wait, which comes first). Session 31 call 1 also timed c1b2 (slower than c2b2 everywhere).
VARIANTS = [("c2b2", 2, 2, 0), ("c2b2p1", 2, 2, 1), ("c2b2p2", 2, 2, 2), ("c1b3p1", 1, 3, 1)]
SQ_VARIANTS = [("c2b2", 2, 2, 0), ("c2b2e1", 2, 2, 1), ("c2b2e2", 2, 2, 2), ("c1b3e2", 1, 3, 2)]


def stream_launch(m, n, k, chunks, blocks_per_sm, prefetch, token, hint, early=0):
    """``(launch(a_ptr, row_ptr, w_ptr, s_ptr, out_ptr, tensor_scale), zero)``: the stream-K GEMM on one grid
    wave, its workspace allocated zeroed here."""
    kernel = gemm.linear_kernel(ElementKind.BF16, False, not token, True, None, chunks, 2,
                                fused_prefetch=prefetch if token else 0, fused_min_blocks=blocks_per_sm,
                                double_buffer=True, vector_only=True, dependent=1, wait_first=not token,
                                early_l2=early, weight_hint=hint, stream_k=True)
    launcher = KernelLauncher(kernel.compiled, 10, SCALARS, 0, dependent=True)
    tiles = -(-n // (gemm.SKINNY_N * 2))
    chunk_count = -(-k // gemm.CHUNK_K)
    per_tile = -(-chunk_count // (chunks * gemm.SKINNY_WARPS))
    grid = min(blocks_per_sm * plans._multiprocessors(), tiles * per_tile)
    partials = torch.zeros(tiles * 32 * 8, dtype=torch.int32, device="cuda")
    counters = torch.zeros(tiles, dtype=torch.int32, device="cuda")

    def launch(a_ptr, row_ptr, w_ptr, s_ptr, out_ptr, tensor_scale=0.0):
        arrays = (ArrayArg(a_ptr, m * k, 1), ArrayArg(a_ptr, m * k // 8, 8), ArrayArg(w_ptr, n * k, 1),
                  ArrayArg(w_ptr, n * k // 8, 8), ArrayArg(row_ptr, m if token else n, 4), ArrayArg(s_ptr, n, 4),
                  ArrayArg(s_ptr, n, 4), ArrayArg(out_ptr, m * n, 2), ArrayArg(partials.data_ptr(), tiles * 256, 4),
                  ArrayArg(counters.data_ptr(), tiles, 4))
        launcher.launch(grid, gemm.SKINNY_THREADS, torch.cuda.current_stream().cuda_stream, arrays,
                        (m, n, k, 1, True, tensor_scale), torch.cuda.current_device())

    return launch, (partials, counters), grid


def hint_for(m, k):
    return "na" if k >= plans.WEIGHT_NO_L1_MIN_K or m >= plans.WEIGHT_NO_L1_MIN_M else ""


def measure(m, n, k, copy):
    x, w, ws, _, weights, xq, sx, out = decode_problem(m, n, k, seed=m + n)
    pct = lambda ms: round(100 * n * k / ms / 1e6 / copy, 1)  # noqa: E731
    row = {"shape": f"M={m} {n}x{k}", "blocks": -(-n // 16)}
    hint = hint_for(m, k)
    # the GEMM alone
    runners = itertools.cycle([gemm_runner(xq, sx, wi, ws, None, out) for wi in weights])
    row["gemm_shipped"] = pct(graph_ms(lambda: next(runners)(), calls=10 * len(weights)))
    gemm_runner(xq, sx, w, ws, None, out)()
    expected = out.clone()
    equal = True
    for label, chunks, per_sm, prefetch in VARIANTS:
        launch, workspace, grid = stream_launch(m, n, k, chunks, per_sm, prefetch, True, hint)
        out.zero_()
        launch(xq.data_ptr(), sx.data_ptr(), w.data_ptr(), ws.data_ptr(), out.data_ptr())
        torch.cuda.synchronize()
        equal &= bit_equal(out, expected) and not any(bool(t.any()) for t in workspace)
        calls = itertools.cycle(weights)
        ms = graph_ms(lambda launch=launch, calls=calls: launch(xq.data_ptr(), sx.data_ptr(), next(calls).data_ptr(),
                                                                ws.data_ptr(), out.data_ptr()), calls=10 * len(weights))
        row[f"gemm_sk_{label}"] = pct(ms)
        row["grid_" + label] = grid
    # quantized_linear: the shipped call, and the quantizer then the stream-K GEMM
    calls = itertools.cycle(weights)
    row["ql_shipped"] = pct(graph_ms(lambda: bn.quantized_linear(x, next(calls), ws), calls=10 * len(weights)))
    expected = bn.quantized_linear(x, w, ws)
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16"))
    space = torch.zeros(plan.workspace_size(), dtype=torch.uint8, device="cuda")
    ws_ptr = space.data_ptr()
    scale_ptr = ws_ptr + plan._scale_offset
    device = torch.cuda.current_device()
    for label, chunks, per_sm, prefetch in VARIANTS:
        launch, workspace, _ = stream_launch(m, n, k, chunks, per_sm, prefetch, True, hint)

        def step(wi, launch=launch):
            q_launcher, q_blocks, q_threads, q_ints = plan._quantizer.segment_launch_fast(
                x.data_ptr(), ws_ptr, scale_ptr, ws_ptr + plan._quantizer_offset,
                n * k >= plans.QUANTIZER_DEPENDENT_MIN_WEIGHT)
            q_launcher.launch_patched(q_blocks, q_threads, torch.cuda.current_stream().cuda_stream, q_ints, (), device)
            launch(ws_ptr, scale_ptr, wi.data_ptr(), ws.data_ptr(), out.data_ptr())

        out.zero_()
        step(w)
        torch.cuda.synchronize()
        equal &= bit_equal(out, expected)
        calls = itertools.cycle(weights)
        row[f"ql_sk_{label}"] = pct(graph_ms(lambda step=step, calls=calls: step(next(calls)), calls=10 * len(weights)))
    # SmoothQuant's GEMM
    act = torch.clamp(torch.round(x.float() * 50), -127, 127).to(torch.int8)
    calls = itertools.cycle(weights)
    row["sq_shipped"] = pct(graph_ms(lambda: bn.smoothquant_linear(act, next(calls), ws, 0.02, dtype="bfloat16"),
                                     calls=10 * len(weights)))
    expected = bn.smoothquant_linear(act, w, ws, 0.02, dtype="bfloat16")
    for label, chunks, per_sm, early in SQ_VARIANTS:
        launch, workspace, _ = stream_launch(m, n, k, chunks, per_sm, 0, False, hint, early)
        out.zero_()
        launch(act.data_ptr(), ws.data_ptr(), w.data_ptr(), ws.data_ptr(), out.data_ptr(), 0.02)
        torch.cuda.synchronize()
        equal &= bit_equal(out, expected)
        calls = itertools.cycle(weights)
        row[f"sq_sk_{label}"] = pct(graph_ms(lambda launch=launch, calls=calls: launch(
            act.data_ptr(), ws.data_ptr(), next(calls).data_ptr(), ws.data_ptr(), out.data_ptr(), 0.02),
            calls=10 * len(weights)))
    row["all bit-equal, workspace left zero"] = equal
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="*", default=["11008x4096", "14336x4096", "6144x4096", "4096x11008"])
    parser.add_argument("--m", nargs="*", type=int, default=[1, 8, 16])
    args = parser.parse_args()
    copy = copy_gbs()
    print(json.dumps({"copy_GBs": round(copy)}), flush=True)
    for shape in args.shapes:
        n, k = map(int, shape.split("x"))
        for m in args.m:
            print(json.dumps(measure(m, n, k, copy)), flush=True)


if __name__ == "__main__":
    main()
