"""The decode kernels whose targets are missed, one launch each between cudaProfilerStart / Stop, for
Nsight Compute (``--profile-from-start off``; ncu flushes the caches before each pass, so the weight
streams from HBM as it does with weights rotating past L2):

    ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section WarpStateStats --section Occupancy --section LaunchStats python3 -m benchmarks.profile_decode_ncu

In order: ``smoothquant_linear(..., static_weight=True)`` (the GEMM alone) at 4096^2 with M = 1 and 16,
then ``quantized_linear(..., static_weight=True)`` (the fused kernel) at 4096^2, M = 1.
"""

from __future__ import annotations

import torch

import baracuda_numba as bn


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randint(-128, 128, (4096, 4096), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(4096, device="cuda", generator=g) * 0.01 + 0.001
    calls = []
    for m in (1, 16):
        act = torch.randint(-127, 128, (m, 4096), device="cuda", generator=g, dtype=torch.int8)
        calls.append(lambda act=act: bn.smoothquant_linear(act, w, ws, 0.02, dtype="bfloat16", static_weight=True))
    x = torch.randn(1, 4096, device="cuda", generator=g, dtype=torch.bfloat16)
    calls.append(lambda: bn.quantized_linear(x, w, ws, static_weight=True))
    for call in calls:  # compile, select, remember
        call()
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
