"""What a launch costs the host beyond the driver's own call, on the GPU:
``python3 -m benchmarks.probe_launch_overhead``.

The package's launches go through one numba-compiled CPU function (:func:`baracuda_numba.launch.make_record_launch`),
compiled with ``nogil=True``: it releases the GIL around the driver call. This probe times, alternating so that a
slow stretch of the host shows in every mode:

- the compiled launch with and without the GIL released;
- cuda.bindings' ``cuLaunchKernel`` of the same kernel and parameter bytes (a pointer per parameter), the floor
  a Python caller reaches without compiled code;
- the plain and the programmatic-dependent launch (``cuLaunchKernelEx``) of the same record;
- ``QuantizePerTensorPlan.run``, ``quantize_per_tensor()``, the two-launch and fused ``QuantizedLinearPlan.run``
  and ``quantized_linear()`` with each compiled launch installed;
- PyTorch ops in the same loop shape.

Each mode's output is checked against PyTorch before it is timed.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import torch

import baracuda_numba as bn
from baracuda_numba import launch
from baracuda_numba.bench import host_us

from .host_floor import per_tensor_launch
from .probe_launch_handle import linear_problems

ROUNDS = 3


def main() -> None:
    print("device:", torch.cuda.get_device_name(0), "threads:", [t.name for t in threading.enumerate()], flush=True)
    x = torch.randn(4096, device="cuda")
    q = torch.empty(4096, device="cuda", dtype=torch.int8)
    other = torch.empty_like(x)
    parts = per_tensor_launch(x, q)
    plan, args, function, record, stream = parts.plan, parts.args, parts.function, parts.record, parts.stream
    blocks, threads, ints, scalars, pointers = parts.blocks, parts.threads, parts.ints, parts.scalars, parts.pointers
    dependent_record = record.copy()
    dependent_record[launch._DEPENDENT] = 1
    linear = linear_problems()
    x16, x1, w, ws, out16, out1 = linear.x16, linear.x1, linear.w, linear.ws, linear.out16, linear.out1
    linear16, linear1, args16, args1 = linear.linear16, linear.linear1, linear.args16, linear.args1
    workspace16, workspace1 = linear.workspace16, linear.workspace1

    driver = launch._driver()
    libcuda = ctypes.CDLL("libcuda.so.1")
    compiled = {"gil released": driver.launch_record,
                "gil held": launch.make_record_launch(
                    launch._entry_point(libcuda, "cuLaunchKernel", launch._LAUNCH_KERNEL),
                    launch._entry_point(libcuda, "cuLaunchKernelEx", launch._LAUNCH_KERNEL_EX),
                    launch._entry_point(libcuda, "cuCtxGetDevice", launch._CTX_GET_DEVICE), release_gil=False)}
    expected = torch.clamp(torch.round(x * torch.tensor(1 / 0.02)) + 3, -128, 127).to(torch.int8)
    reference16 = bn.quantized_linear(x16, w, ws)
    reference1 = bn.quantized_linear(x1, w, ws)
    torch.cuda.synchronize()
    for mode, fn in compiled.items():
        q.zero_()
        assert fn(function, 0, blocks, threads, stream, record, ints, scalars) == 0
        torch.cuda.synchronize()
        driver.launch_record = fn
        out16.zero_()
        out1.zero_()
        linear16.run(args16, workspace16)
        linear1.run(args1, workspace1)
        torch.cuda.synchronize()
        print(f"{mode}: quantize equals torch {torch.equal(q, expected)}, linear M=16 / 1 equal the function's "
              f"{torch.equal(out16, reference16)} / {torch.equal(out1, reference1)}", flush=True)
    driver.launch_record = compiled["gil released"]

    rows: dict[str, list[float]] = {}
    cases = []
    try:
        from cuda.bindings import driver as cuda_driver

        cu_function, cu_stream = cuda_driver.CUfunction(function), cuda_driver.CUstream(stream)
        cases.append(("cuda.bindings cuLaunchKernel (a pointer per parameter)", None,
                      lambda: cuda_driver.cuLaunchKernel(cu_function, blocks, 1, 1, threads, 1, 1, 0, cu_stream,
                                                         ctypes.addressof(pointers), 0)))
    except Exception as error:  # report, keep measuring
        print("cuda.bindings unavailable:", error)
    for mode, fn in compiled.items():
        cases += [
            (f"compiled launch, {mode}", None,
             lambda fn=fn: fn(function, 0, blocks, threads, stream, record, ints, scalars)),
            (f"compiled launch, programmatic dependent (cuLaunchKernelEx), {mode}", None,
             lambda fn=fn: fn(function, 0, blocks, threads, stream, dependent_record, ints, scalars)),
            (f"QuantizePerTensorPlan.run 4096 f32, {mode}", fn, lambda: plan.run(args)),
            (f"quantize_per_tensor() 4096 f32, {mode}", fn, lambda: bn.quantize_per_tensor(x, 0.02, 3)),
            (f"QuantizedLinearPlan.run 16 x 4096 @ 4096^2 (two launches), {mode}", fn,
             lambda: linear16.run(args16, workspace16)),
            (f"QuantizedLinearPlan.run 1 x 4096 @ 4096^2 (fused), {mode}", fn, lambda: linear1.run(args1, workspace1)),
            (f"quantized_linear() 16 x 4096 @ 4096^2, {mode}", fn, lambda: bn.quantized_linear(x16, w, ws)),
        ]
    cases += [
        ("torch.neg(out=) 4096 f32", None, lambda: torch.neg(x, out=other)),
        ("torch.quantize_per_tensor 4096 f32", None, lambda: torch.quantize_per_tensor(x, 0.02, 3, torch.qint8)),
    ]
    w16 = w.to(torch.bfloat16)
    cases.append(("F.linear 16 x 4096 @ 4096^2 bf16", None, lambda: torch.nn.functional.linear(x16, w16)))
    for _ in range(ROUNDS):
        for label, install, fn in cases:
            if install is not None:
                driver.launch_record = install
            rows.setdefault(label, []).append(host_us(fn))
            driver.launch_record = compiled["gil released"]
    for label, values in rows.items():
        print(f"{label}: {min(values):.2f} us (rounds {' / '.join(f'{v:.2f}' for v in values)})", flush=True)
    print("threads at the end:", [t.name for t in threading.enumerate()], np.__version__)


if __name__ == "__main__":
    main()
