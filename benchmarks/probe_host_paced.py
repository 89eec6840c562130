"""Host time per call two ways, on the GPU: a tight loop (what ``bench.host_us`` did up to session 42, which reads
``max(host, GPU)`` once the launch queue fills) and ``bench.host_us`` (batches queued behind a GPU busy wait).

    python3 -m benchmarks.probe_host_paced"""

from __future__ import annotations

import time

import torch

import baracuda_numba as bn
from baracuda_numba.bench import device_ms, host_us


def tight_loop_us(fn, calls: int = 200) -> float:
    """Session 42's ``host_us``: best of five tight loops, no wait queued ahead."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main() -> None:
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randint(-128, 128, (4096, 4096), device="cuda", dtype=torch.int8)
    ws = torch.rand(4096, device="cuda") * 0.01
    w16 = w.to(torch.bfloat16)
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(16, 4096, 4096, "bf16", "bf16", False))
    args = bn.QuantizedLinearArgs(x, w, ws, torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16))
    workspace = torch.empty(plan.workspace_size(), device="cuda", dtype=torch.uint8)
    small = torch.randn(64, 64, device="cuda")
    cases = [("QuantizedLinearPlan.run 16x4096 @ 4096^2", lambda: plan.run(args, workspace)),
             ("quantized_linear() 16x4096 @ 4096^2", lambda: bn.quantized_linear(x, w, ws)),
             ("F.linear 16x4096 @ 4096^2 bf16", lambda: torch.nn.functional.linear(x, w16)),
             ("torch.mm 64x64 f32", lambda: torch.mm(small, small))]
    print(torch.cuda.get_device_name())
    for label, fn in cases:
        print(f"{label}: tight loop {tight_loop_us(fn):.1f} us, behind a wait {host_us(fn, 1000):.1f} us, "
              f"GPU {1e3 * device_ms(fn, 20):.1f} us (eager, one call)", flush=True)


if __name__ == "__main__":
    main()
