"""Host cost of the capture check on the one-token fused decode path (``plans.linear.CAPTURE_UNFUSED``):
``QuantizedLinearPlan.run`` and ``quantized_linear(out=)`` at 1 x 4096 @ 4096^2 with the check on and off,
alternated on one host, on the legacy default stream (no query) and on a side stream (one query of
PyTorch's capture state per call), and the query alone. Best of 7 x 2000 calls, us.

    python -m benchmarks.probe_capture_check
"""

from __future__ import annotations

import time

import torch

import baracuda_numba as bn
from baracuda_numba.ops.common import select_plan
from baracuda_numba.vocabulary import ElementKind


def best_us(fn, calls: int = 2000, repeats: int = 7) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - begin) / calls)
        torch.cuda.synchronize()
    return 1e6 * best


def main() -> None:
    print(f"torch._C._cuda_isCurrentStreamCapturing: {best_us(torch._C._cuda_isCurrentStreamCapturing):.2f} us")
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randint(-128, 128, (4096, 4096), device="cuda", dtype=torch.int8)
    ws = torch.rand(4096, device="cuda") * 0.01 + 0.001
    out = torch.empty(1, 4096, device="cuda", dtype=torch.bfloat16)
    bn.quantized_linear(x, w, ws, out=out)
    plan = select_plan(bn.QuantizedLinearPlan, bn.QuantizedLinearDescriptor(1, 4096, 4096, ElementKind.BF16,
                                                                              ElementKind.BF16, False))
    args = bn.QuantizedLinearArgs(x, w, ws, out)
    shipped = plan._capture_choice
    print(f"plan fused: {plan._fused}, capture choice: {shipped}")
    side = torch.cuda.Stream()
    for stream_name, stream in (("default stream", torch.cuda.default_stream()), ("side stream", side)):
        with torch.cuda.stream(stream):
            for round_ in range(2):
                for choice in (True, False):
                    plan._capture_choice = choice
                    run_us = best_us(lambda: plan.run(args))
                    op_us = best_us(lambda: bn.quantized_linear(x, w, ws, out=out))
                    check = "on " if choice else "off"
                    print(f"{stream_name} round {round_}, check {check}: plan.run {run_us:.2f} us, "
                          f"quantized_linear(out=) {op_us:.2f} us")
    plan._capture_choice = shipped
    torch_us = best_us(lambda: torch.quantize_per_tensor(ws, 0.1, 0, torch.qint8))
    print(f"torch.quantize_per_tensor (4096 f32): {torch_us:.2f} us")


if __name__ == "__main__":
    main()
