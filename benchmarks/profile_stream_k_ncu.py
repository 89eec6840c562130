"""The shipped decode GEMM and the stream-K one (``benchmarks/probe_stream_k.py``), one launch each between
cudaProfilerStart / Stop, for Nsight Compute: SmoothQuant's GEMM (waiting first) at 11008 x 4096, M = 1, bf16.

    ncu --profile-from-start off --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        --section Occupancy --section LaunchStats --section InstructionStats python3 -m benchmarks.profile_stream_k_ncu
"""

from __future__ import annotations

import torch

import baracuda_numba as bn
from benchmarks.probe_stream_k import stream_launch


def main() -> None:
    m, n, k = 1, 11008, 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    act = torch.randint(-127, 128, (m, k), device="cuda", generator=g, dtype=torch.int8)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    launch, _, _ = stream_launch(m, n, k, 2, 2, 0, False, "", 2)
    calls = [lambda: bn.smoothquant_linear(act, w, ws, 0.02, dtype="bfloat16"),
             lambda: launch(act.data_ptr(), ws.data_ptr(), w.data_ptr(), ws.data_ptr(), out.data_ptr(), 0.02)]
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
