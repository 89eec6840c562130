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

ROUNDS = 3


def main() -> None:
    print("device:", torch.cuda.get_device_name(0), "threads:", [t.name for t in threading.enumerate()], flush=True)
    x = torch.randn(4096, device="cuda")
    q = torch.empty(4096, device="cuda", dtype=torch.int8)
    other = torch.empty_like(x)
    plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(4096, -128, 127, "f32", "s8"))
    args = bn.QuantizePerTensorArgs(x, 0.02, 3, q)
    plan.run(args)
    torch.cuda.synchronize()
    x16 = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    x1 = x16[:1].contiguous()
    w = torch.randint(-128, 128, (4096, 4096), device="cuda", dtype=torch.int8)
    ws = torch.rand(4096, device="cuda") * 0.01 + 0.001
    out16 = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)
    out1 = torch.empty(1, 4096, device="cuda", dtype=torch.bfloat16)
    linear16 = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(16, 4096, 4096, "bf16", "bf16"))
    linear1 = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(1, 4096, 4096, "bf16", "bf16"))
    args16 = bn.QuantizedLinearArgs(x16, w, ws, out16)
    args1 = bn.QuantizedLinearArgs(x1, w, ws, out1)
    workspace16 = torch.empty(max(linear16.workspace_size(), 1), device="cuda", dtype=torch.uint8)
    workspace1 = torch.empty(max(linear1.workspace_size(), 1), device="cuda", dtype=torch.uint8)

    launcher = plan._launcher
    function = launcher._functions[0]
    record = launcher.params.record
    dependent_record = record.copy()
    dependent_record[launch._DEPENDENT] = 1
    stream = launch.torch_current_stream(0)
    blocks, step_q, step_r, _ = plan._geometry(4096 // plan._chunk, 0)
    threads = plan.entry.policy.threads_per_block
    ptr, qptr = x.data_ptr(), q.data_ptr()
    scalars = plan._scalars(args)
    ints = (ptr, ptr, ptr, ptr, qptr, qptr, 0, 0, step_q, step_r)
    packed = launch.record_bytes(record, ints, scalars)
    buffer = ctypes.create_string_buffer(packed, len(packed))
    pointers = (ctypes.c_uint64 * launcher.params.n_params)(*(ctypes.addressof(buffer) + offset
                                                              for offset in launcher.params.offsets))

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
