"""The static-weight fused decode kernel (``quantized_linear(..., static_weight=True)``) at N = K = 4096,
one call per M, for Nsight Compute; ``--m`` picks the token counts and ``--fuse-up-to`` raises
``plans.linear.STATIC_FUSED_MAX_M`` so that every M takes the fused kernel:

    ncu --clock-control none --kernel-name regex:fused --section SpeedOfLight --section WarpStateStats \\
        --section MemoryWorkloadAnalysis python3 benchmarks/probe_static_fused.py --m 1 2 4 8

Each M runs twice (the first call compiles and selects); profile the second with ``--launch-skip``.
"""

from __future__ import annotations

import argparse

import torch

import baracuda_numba as bn
from baracuda_numba.plans import linear as plans


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", nargs="*", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--fuse-up-to", type=int, default=16)
    args = parser.parse_args()
    plans.STATIC_FUSED_MAX_M = args.fuse_up_to
    w = torch.randint(-127, 128, (args.n, args.k), device="cuda", dtype=torch.int8)
    ws = torch.rand(args.n, device="cuda") * 0.01
    for m in args.m:
        x = torch.randn(m, args.k, device="cuda", dtype=torch.bfloat16)
        for _ in range(2):
            bn.quantized_linear(x, w, ws, static_weight=True)
        torch.cuda.synchronize()
        plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, args.n, args.k, "bf16", "bf16", False,
                                                                          True))
        print(m, plan.kernel_variant(bn.QuantizedLinearArgs(x, w, ws, torch.empty(m, args.n, device="cuda",
                                                                                     dtype=torch.bfloat16))))


if __name__ == "__main__":
    main()
