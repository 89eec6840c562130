"""Host time per call with the two kernel handles a launch can name, on the GPU:
``python3 -m benchmarks.probe_launch_handle``.

numba-cuda 0.30 loads every module as a library, so the handle it gives is a ``CUkernel``; the launcher
can instead name the ``CUfunction`` that ``cuKernelGetFunction`` resolves for the current context once
(``launch.CONTEXT_FUNCTIONS``). One process loads every kernel with the CUkernel handles, then every
launcher's handle is swapped between the two, alternating (``kernel``, ``function``, ``kernel``,
``function``), so that a slow stretch of the host shows in both. Outputs are checked against PyTorch in
each mode before it is timed.
"""

from __future__ import annotations

import gc
from types import SimpleNamespace

import torch

import baracuda_numba as bn
from baracuda_numba import launch
from baracuda_numba.bench import host_us

MODES = ("kernel", "function")


def linear_problems() -> SimpleNamespace:
    """``quantized_linear``'s host-time problems: 16 and 1 bf16 tokens (``x16``, ``x1``) against a 4096^2 int8 weight
    ``w`` with column scales ``ws``, their outputs, selected plans, args and workspaces."""
    x16 = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    x1 = x16[:1].contiguous()
    w = torch.randint(-128, 128, (4096, 4096), device="cuda", dtype=torch.int8)
    ws = torch.rand(4096, device="cuda") * 0.01 + 0.001
    out16 = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)
    out1 = torch.empty(1, 4096, device="cuda", dtype=torch.bfloat16)
    linear16 = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(16, 4096, 4096, "bf16", "bf16"))
    linear1 = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(1, 4096, 4096, "bf16", "bf16"))
    return SimpleNamespace(
        x16=x16, x1=x1, w=w, ws=ws, out16=out16, out1=out1, linear16=linear16, linear1=linear1,
        args16=bn.QuantizedLinearArgs(x16, w, ws, out16), args1=bn.QuantizedLinearArgs(x1, w, ws, out1),
        workspace16=torch.empty(max(linear16.workspace_size(), 1), device="cuda", dtype=torch.uint8),
        workspace1=torch.empty(max(linear1.workspace_size(), 1), device="cuda", dtype=torch.uint8))


def main() -> None:
    launch.CONTEXT_FUNCTIONS = False
    x = torch.randn(4096, device="cuda")
    q = torch.empty(4096, device="cuda", dtype=torch.int8)
    other = torch.empty_like(x)
    plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(4096, -128, 127, "f32", "s8"))
    args = bn.QuantizePerTensorArgs(x, 0.02, 3, q)
    linear = linear_problems()
    x16, x1, w, ws, out16, out1 = linear.x16, linear.x1, linear.w, linear.ws, linear.out16, linear.out1
    linear16, linear1, args16, args1 = linear.linear16, linear.linear1, linear.args16, linear.args1
    workspace16, workspace1 = linear.workspace16, linear.workspace1
    w_tall = torch.randint(-128, 128, (11008, 4096), device="cuda", dtype=torch.int8)
    ws_tall = torch.rand(11008, device="cuda") * 0.01 + 0.001
    token_scales = torch.rand(16, device="cuda") * 0.05 + 0.01
    w16 = w.to(torch.bfloat16)

    expected = torch.clamp(torch.round(x * torch.tensor(1 / 0.02)) + 3, -128, 127).to(torch.int8)
    xq = (x16.float() / (x16.float().abs().amax(1, keepdim=True) / 127)).round()  # close to the exact path
    approx = ((xq @ w.float().T) * (x16.float().abs().amax(1, keepdim=True) / 127) * ws).to(torch.bfloat16)
    reference = bn.quantized_linear(x16, w, ws)
    torch.cuda.synchronize()
    print("quantized_linear() near the float composition:",
          torch.allclose(reference.float(), approx.float(), rtol=0.05, atol=0.05 * approx.float().abs().max().item()))

    def check(mode: str) -> None:
        q.zero_()
        out16.zero_()
        out1.zero_()
        plan.run(args)
        linear16.run(args16, workspace16)
        linear1.run(args1, workspace1)
        again = bn.quantized_linear(x16, w, ws)
        torch.cuda.synchronize()
        print(f"[{mode}] per tensor == torch: {torch.equal(q, expected)}; linear plans and quantized_linear() == "
              f"the first call: {torch.equal(out16, reference)}, {torch.equal(out1, reference[:1])}, "
              f"{torch.equal(again, reference)}", flush=True)

    cases = [
        ("QuantizePerTensorPlan.run (4096 f32)", lambda: plan.run(args)),
        ("quantize_per_tensor() (4096 f32)", lambda: bn.quantize_per_tensor(x, 0.02, 3)),
        ("quantize_per_token() 16x4096 bf16", lambda: bn.quantize_per_token(x16, token_scales)),
        ("dynamic_range_quantize() 16x4096 bf16", lambda: bn.dynamic_range_quantize(x16)),
        ("QuantizedLinearPlan.run 16x4096 @ 4096^2 (two launches)", lambda: linear16.run(args16, workspace16)),
        ("QuantizedLinearPlan.run 1x4096 @ 4096^2", lambda: linear1.run(args1, workspace1)),
        ("quantized_linear() 16x4096 @ 4096^2", lambda: bn.quantized_linear(x16, w, ws)),
        ("quantized_linear() 1x4096 @ 4096^2", lambda: bn.quantized_linear(x1, w, ws)),
        ("quantized_linear() 1x4096 @ 11008x4096 (two launches)", lambda: bn.quantized_linear(x1, w_tall, ws_tall)),
        ("torch.neg(out=) 4096 f32", lambda: torch.neg(x, out=other)),
        ("torch.quantize_per_tensor 4096 f32", lambda: torch.quantize_per_tensor(x, 0.02, 3, torch.qint8)),
        ("torch.nn.functional.linear 16x4096 @ 4096^2 bf16",
         lambda: torch.nn.functional.linear(x16, w16)),
    ]
    for _, fn in cases:  # warm every path up (every kernel loaded)
        host_us(fn, 200)
    launchers = [o for o in gc.get_objects() if isinstance(o, launch.KernelLauncher) and 0 in o._functions]
    handles = {"kernel": [o._functions[0] for o in launchers]}
    handles["function"] = [launch._driver().context_function(h) for h in handles["kernel"]]
    print(f"{len(launchers)} launchers; CUkernel -> CUfunction resolved for "
          f"{sum(a != b for a, b in zip(handles['kernel'], handles['function'], strict=True))}", flush=True)
    results: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    for mode in MODES + MODES:
        for launcher, handle in zip(launchers, handles[mode], strict=True):
            launcher._functions[0] = handle
        check(mode)
        for label, fn in cases:
            results[mode].setdefault(label, []).append(host_us(fn, 1000))
    print("| call | CUkernel (us) | CUfunction (us) |\n|---|---:|---:|")
    for label, _ in cases:
        print(f"| {label} | " + " | ".join(" / ".join(f"{us:.2f}" for us in results[m][label]) for m in MODES) + " |")


if __name__ == "__main__":
    main()
