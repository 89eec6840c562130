"""A timeline of the decode GEMM's blocks inside a CUDA graph: the profiling build of the skinny kernel
(``linear_kernel(..., trace=True)``) stamps ``%globaltimer`` per block when it starts, when its wait for
the quantizer returns, when its weight stream ends and after its stores. Each call is a spin of 0 ns
(its end is the origin), then either the GEMM alone (on pre-quantized rows), or the per-token quantizer
and the GEMM as its programmatic dependent, or the two as plain launches; weights rotate past L2.
Printed per mode: microseconds from the origin (medians over the graph's last calls) of the blocks'
first / median / last start, their waits' median / last return, their streams' median / last end and
the last block's end.

    python3 -m benchmarks.probe_timeline"""

from __future__ import annotations

import itertools

import numpy as np
import torch

import baracuda_numba as bn
from baracuda_numba.arrays import adapt
from baracuda_numba.kernels import linear as gemm
from baracuda_numba.launch import ArrayArg, KernelLauncher
from baracuda_numba.ops.common import clear_plan_cache
from baracuda_numba.plans import linear as plans
from benchmarks.probe_pdl import spin
from benchmarks.tune_linear import decode_problem

CALLS = 8  # per graph; the last half are reported


def traced_plan(m: int, n: int, k: int, dependent: bool):
    """A selected two-launch plan whose aligned GEMM is the profiling build (launched as a programmatic
    dependent or plainly)."""
    plans.FUSED_MAX_M = plans.FUSED_ANY_SHAPE_MAX_M = plans.COOPERATIVE_MAX_M = 0
    plans.DEPENDENT_GEMM = True
    clear_plan_cache()
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16"))
    tiles = gemm.skinny_tiles(k)
    kernel = gemm.linear_kernel(bn.ElementKind.BF16, False, False, True, None, gemm.skinny_chunks(False, True), tiles,
                                fused_prefetch=gemm.dependent_prefetch(m, n, k), double_buffer=True,
                                vector_only=True, dependent=gemm.DEPENDENT_PRELOAD, trace=True)
    _, tiles_m, blocks, threads = plan._variants["skinny_vector"]
    plan._variants["skinny_vector"] = (KernelLauncher(kernel.compiled, 8, plans._SCALARS, 0, dependent), tiles_m,
                                       blocks, threads)
    return plan, blocks


def timeline(m: int, n: int, k: int, mode: str, problem, spinner: KernelLauncher) -> np.ndarray:
    """The medians of :func:`main`'s columns for one shape and mode."""
    x, _, ws, _, weights, xq, sx, out = problem
    plan, blocks = traced_plan(m, n, k, mode == "two_launch_pdl")
    marks = [torch.zeros(2, dtype=torch.int64, device="cuda") for _ in range(CALLS)]
    traces = [torch.zeros(4 * blocks, dtype=torch.float32, device="cuda") for _ in range(CALLS)]
    ops = [adapt(t, "probe", "t") for t in (xq, sx, ws, out)]
    wops = itertools.cycle([adapt(w, "probe", "w") for w in weights])
    tops = [adapt(t, "probe", "trace") for t in traces]
    calls = [(i, next(wops)) for i in range(CALLS)]

    def run():
        for i, wop in calls:
            stream = torch.cuda.current_stream().cuda_stream
            spinner.launch(1, 32, stream, [ArrayArg(marks[i].data_ptr(), 2, 8)], [0])
            if mode != "gemm_alone":
                bn.dynamic_range_quantize(x)
            plan._gemm(ops[0], wop, ops[1], ops[2], tops[i], ops[3], 0.0, stream, unfused=True)

    run()  # compile and warm up
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    rows = []
    for i in range(CALLS // 2, CALLS):
        origin = int(marks[i][1].item()) & 0xFFFFFFFF
        stamps = traces[i].view(torch.int32).cpu().numpy().astype(np.int64) & 0xFFFFFFFF
        rel = ((stamps - origin) % (1 << 32)).reshape(blocks, 4) / 1e3
        rel[rel > 1e6] -= (1 << 32) / 1e3  # stamps before the origin
        start, wait, stream_end, end = rel.T
        rows.append([start.min(), np.median(start), start.max(), np.median(wait), wait.max(),
                     np.median(stream_end), stream_end.max(), end.max()])
    return np.median(np.array(rows), axis=0)


def main() -> None:
    spinner = KernelLauncher(lambda: spin, 1, (np.int64,))
    for m, n, k in ((1, 4096, 4096), (16, 4096, 4096), (1, 11008, 4096)):
        problem = decode_problem(m, n, k)
        for mode in ("gemm_alone", "two_launch_pdl", "two_launch_plain"):
            r = timeline(m, n, k, mode, problem, spinner)
            print(f"M={m:2d} {n}x{k} {mode:17s} start {r[0]:5.2f} / {r[1]:5.2f} / {r[2]:5.2f}  "
                  f"wait {r[3]:5.2f} / {r[4]:5.2f}  stream end {r[5]:5.2f} / {r[6]:5.2f}  end {r[7]:5.2f} us",
                  flush=True)


if __name__ == "__main__":
    main()
