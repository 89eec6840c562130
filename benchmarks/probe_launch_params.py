"""How a launch reaches the driver, and what each way costs the host, on the GPU:
``python3 -m benchmarks.probe_launch_params``.

- The package's compiled launch (:func:`baracuda_numba.launch.make_record_launch`) hands ``cuLaunchKernel`` one
  packed buffer through ``extra``. The same record is launched from compiled code in the other ways the driver
  takes: a pointer per parameter (``kernelParams``), and ``cuLaunchKernelEx`` with no attributes (either way),
  for ``QuantizePerTensorPlan``'s kernel (67 parameters) and a one-parameter kernel; and without the device check.
- Every package launch through numba's dispatcher, or through the entry point each launcher resolves once
  (``launch.ENTRY_POINTS``); the W8A8 linear's two launches as two ``launch_patched`` calls or one
  :class:`~baracuda_numba.launch.LaunchPair`; the plans and functions in each mode.
- cuda.bindings' ``cuLaunchKernel`` and PyTorch ops in the same loop shape.

The cases run interleaved, round after round, so that a slow stretch of the host shows in all of them; each case's
best and median round are printed. Outputs of every launch mode are checked against PyTorch before timing.
"""

from __future__ import annotations

import ctypes
import statistics

import numpy as np
import torch
from numba import njit

import baracuda_numba as bn
from baracuda_numba import launch
from baracuda_numba.bench import host_us
from baracuda_numba.plans.linear import QUANTIZER_DEPENDENT_MIN_WEIGHT

from .host_floor import one_parameter, per_tensor_launch
from .probe_launch_handle import linear_problems

ROUNDS = 7
PARAMS, PARAMS_EX, EXTRA_EX = range(3)  # the modes of the probe's launch


def make_params_launch(launch_kernel, launch_kernel_ex):
    """``launch(function, blocks, threads, stream, record, offsets, ints, floats, mode) -> CUresult``: the record
    copied and patched as the package's launch does, then handed over by ``mode``: ``PARAMS`` (``cuLaunchKernel``
    with a pointer per parameter, ``offsets`` their byte offsets in the buffer), ``PARAMS_EX`` (the same through
    ``cuLaunchKernelEx``, no attributes) or ``EXTRA_EX`` (the buffer through ``extra``, ``cuLaunchKernelEx``)."""

    @njit(nogil=True)
    def run(function, blocks, threads, stream, record, offsets, ints, floats, mode):  # pragma: no cover
        n_params = offsets.size
        head = n_params + 6 + 7  # pointers, `extra` and the size, the launch config
        buffer_at = record[launch._BUFFER_AT]
        frame = np.empty(head + record.size - buffer_at, np.uint64)
        block = frame[head:]
        block[:] = record[buffer_at:]
        n_ints = record[launch._N_INTS]
        for k in range(n_ints):
            block[record[launch._HEADER + k]] = ints[k]
        as_float32 = block.view(np.float32)
        for k in range(record[launch._N_FLOATS]):
            as_float32[record[launch._HEADER + n_ints + k]] = floats[k]
        base = frame.ctypes.data
        block_base = base + 8 * head
        for i in range(n_params):
            frame[i] = block_base + offsets[i]
        extra = frame[n_params:n_params + 6]
        extra[0], extra[1], extra[2], extra[3], extra[4] = 1, block_base, 2, base + 8 * (n_params + 5), 0
        extra[5] = record[launch._SIZE]
        if mode == PARAMS:
            status = launch_kernel(function, blocks, 1, 1, threads, 1, 1, record[launch._SHARED], stream, base, 0)
        else:
            config = frame[n_params + 6:head]
            config[:] = 0
            words = config.view(np.uint32)
            words[0], words[1], words[2] = blocks, 1, 1
            words[3], words[4], words[5] = threads, 1, 1
            words[6] = record[launch._SHARED]
            config[4] = stream
            if mode == PARAMS_EX:
                status = launch_kernel_ex(base + 8 * (n_params + 6), function, base, 0)
            else:
                status = launch_kernel_ex(base + 8 * (n_params + 6), function, 0, base + 8 * n_params)
        return status if frame[head] == record[buffer_at] or block.size == 0 else -2

    return run


def main() -> None:
    print("device:", torch.cuda.get_device_name(0), flush=True)
    x = torch.randn(4096, device="cuda")
    q = torch.empty(4096, device="cuda", dtype=torch.int8)
    other = torch.empty_like(x)
    parts = per_tensor_launch(x, q)
    plan, args, function, record, stream = parts.plan, parts.args, parts.function, parts.record, parts.stream
    blocks, threads, ints, scalars = parts.blocks, parts.threads, parts.ints, parts.scalars
    offsets = np.array(parts.launcher.params.offsets, np.int64)

    one_parameter[1, 32](1)
    torch.cuda.synchronize()
    one_block = launch.ParameterBlock(0, (np.int64,))
    one_block.set_template((1,), (), range(0), np.float32)
    one_record, one_offsets = one_block.record, np.array(one_block.offsets, np.int64)
    one = int(next(iter(one_parameter.overloads.values()))._codelibrary.get_cufunc().handle)
    one = launch._driver().context_function(one)

    libcuda = ctypes.CDLL("libcuda.so.1")
    probe = make_params_launch(launch._entry_point(libcuda, "cuLaunchKernel", launch._LAUNCH_KERNEL),
                               launch._entry_point(libcuda, "cuLaunchKernelEx", launch._LAUNCH_KERNEL_EX))
    compiled = launch._driver().launch_record
    expected = torch.clamp(torch.round(x * torch.tensor(1 / 0.02)) + 3, -128, 127).to(torch.int8)
    for mode, name in ((PARAMS, "kernelParams"), (PARAMS_EX, "kernelParams, Ex"), (EXTRA_EX, "extra, Ex")):
        q.zero_()
        status = probe(function, blocks, threads, stream, record, offsets, ints, scalars, mode)
        torch.cuda.synchronize()
        print(f"{name}: status {status}, output equals torch {torch.equal(q, expected)}", flush=True)

    driver = launch._driver()
    linear = linear_problems()
    expected16 = bn.quantized_linear(linear.x16, linear.w, linear.ws)
    w16 = linear.w.to(torch.bfloat16)
    # the two modes of every package launch: the compiled launch through its dispatcher, or through the entry
    # point each launcher resolves (launch.ENTRY_POINTS); each mode has compiled launches of its own, so that
    # every launcher resolves again when the mode changes
    modes = {"dispatcher": (False, launch.make_record_launch(
                 launch._entry_point(libcuda, "cuLaunchKernel", launch._LAUNCH_KERNEL),
                 launch._entry_point(libcuda, "cuLaunchKernelEx", launch._LAUNCH_KERNEL_EX),
                 launch._entry_point(libcuda, "cuCtxGetDevice", launch._CTX_GET_DEVICE))),
             "entry points": (True, driver.launch_record)}
    modes = {name: (flag, record_launch, launch.make_pair_launch(record_launch))
             for name, (flag, record_launch) in modes.items()}

    def install(mode: str) -> None:
        launch.ENTRY_POINTS, driver.launch_record, driver.launch_pair = modes[mode]

    # the two-launch plan's pair, called directly, and its two launches one after the other
    plan16 = linear.linear16
    pointers, _ = plan16._fast_pointers(linear.args16)
    ws_ptr = linear.workspace16.data_ptr()
    scale_ptr = ws_ptr + plan16._scale_offset
    q_launcher, q_blocks, q_threads, q_ints = plan16._quantizer.segment_launch_fast(
        pointers[0], ws_ptr, scale_ptr, ws_ptr + plan16._quantizer_offset,
        plan16.desc.n * plan16.desc.k >= QUANTIZER_DEPENDENT_MIN_WEIGHT)
    g_launcher, g_blocks, g_threads, g_ints = plan16._fast_gemm(list(pointers), ws_ptr, scale_ptr)
    pair = launch.LaunchPair(q_launcher, g_launcher)
    zero = np.float32(0)

    cases = []
    for mode in modes:
        install(mode)
        q.zero_()
        linear.out16.zero_()
        plan.run(args)
        plan16.run(linear.args16, linear.workspace16)
        torch.cuda.synchronize()
        print(f"{mode}: quantize equals torch {torch.equal(q, expected)}, linear M=16 equals the function's "
              f"{torch.equal(linear.out16, expected16)}", flush=True)
        cases += [
            (f"launch_patched, plan kernel, {mode}", mode,
             lambda: parts.launcher.launch_patched(blocks, threads, stream, ints, scalars, 0)),
            (f"QuantizePerTensorPlan.run 4096 f32, {mode}", mode, lambda: plan.run(args)),
            (f"quantize_per_tensor() 4096 f32, {mode}", mode, lambda: bn.quantize_per_tensor(x, 0.02, 3)),
            (f"linear M=16's two launches as two launch_patched, {mode}", mode,
             lambda: (q_launcher.launch_patched(q_blocks, q_threads, stream, q_ints, (), 0),
                      g_launcher.launch_patched(g_blocks, g_threads, stream, g_ints, (zero,), 0))),
            (f"linear M=16's two launches as a LaunchPair, {mode}", mode,
             lambda: pair.launch(stream, 0, q_blocks, q_threads, q_ints, (), g_blocks, g_threads, g_ints, (zero,))),
            (f"QuantizedLinearPlan.run 16 x 4096 @ 4096^2 (two launches), {mode}", mode,
             lambda: plan16.run(linear.args16, linear.workspace16)),
            (f"quantized_linear() 16 x 4096 @ 4096^2, {mode}", mode,
             lambda: bn.quantized_linear(linear.x16, linear.w, linear.ws)),
        ]
    install("entry points")
    compiled = driver.launch_record
    cases += [(label, None, fn) for label, fn in [
        ("compiled launch, plan kernel (extra, device check) [shipped]",
         lambda: compiled(function, 0, blocks, threads, stream, record, ints, scalars)),
        ("compiled launch, plan kernel (extra, no device check)",
         lambda: compiled(function, -1, blocks, threads, stream, record, ints, scalars)),
        ("probe launch, plan kernel, kernelParams",
         lambda: probe(function, blocks, threads, stream, record, offsets, ints, scalars, PARAMS)),
        ("probe launch, plan kernel, kernelParams, Ex",
         lambda: probe(function, blocks, threads, stream, record, offsets, ints, scalars, PARAMS_EX)),
        ("probe launch, plan kernel, extra, Ex",
         lambda: probe(function, blocks, threads, stream, record, offsets, ints, scalars, EXTRA_EX)),
        ("compiled launch, 1-parameter kernel (extra, device check)",
         lambda: compiled(one, 0, 1, 32, stream, one_record, (0,), (0.0,))),
        ("probe launch, 1-parameter kernel, kernelParams",
         lambda: probe(one, 1, 32, stream, one_record, one_offsets, (0,), (0.0,), PARAMS)),
        ("plan._fast_pointers(args)", lambda: plan._fast_pointers(args)),
        ("plan._scalars(args)", lambda: plan._scalars(args)),
        ("QuantizePerTensorPlan.run 4096 f32", lambda: plan.run(args)),
        ("quantize_per_tensor() 4096 f32", lambda: bn.quantize_per_tensor(x, 0.02, 3)),
        ("torch.neg(out=) 4096 f32", lambda: torch.neg(x, out=other)),
        ("torch.quantize_per_tensor 4096 f32", lambda: torch.quantize_per_tensor(x, 0.02, 3, torch.qint8)),
        ("QuantizedLinearPlan.run 16 x 4096 @ 4096^2 (two launches)",
         lambda: linear.linear16.run(linear.args16, linear.workspace16)),
        ("quantized_linear() 16 x 4096 @ 4096^2", lambda: bn.quantized_linear(linear.x16, linear.w, linear.ws)),
        ("F.linear 16 x 4096 @ 4096^2 bf16", lambda: torch.nn.functional.linear(linear.x16, w16)),
    ]]
    try:
        from cuda.bindings import driver as cuda_driver

        cu_function, cu_stream = cuda_driver.CUfunction(function), cuda_driver.CUstream(stream)
        import cuda.bindings

        print("cuda.bindings", getattr(cuda.bindings, "__version__", "?"), flush=True)
        size = ctypes.c_uint64(len(parts.packed))
        extra = (ctypes.c_uint64 * 5)(1, ctypes.addressof(parts.buffer), 2, ctypes.addressof(size), 0)
        cu_one = cuda_driver.CUfunction(one)
        one_value = ctypes.c_int64(1)
        one_pointers = (ctypes.c_uint64 * 1)(ctypes.addressof(one_value))
        cases += [(label, None, fn) for label, fn in [
            ("cuda.bindings cuLaunchKernel, plan kernel, a pointer per parameter",
             lambda: cuda_driver.cuLaunchKernel(cu_function, blocks, 1, 1, threads, 1, 1, 0, cu_stream,
                                                ctypes.addressof(parts.pointers), 0)),
            ("cuda.bindings cuLaunchKernel, plan kernel, extra",
             lambda: cuda_driver.cuLaunchKernel(cu_function, blocks, 1, 1, threads, 1, 1, 0, cu_stream, 0,
                                                ctypes.addressof(extra))),
            ("cuda.bindings cuLaunchKernel, 1-parameter kernel",
             lambda: cuda_driver.cuLaunchKernel(cu_one, 1, 1, 1, 32, 1, 1, 0, cu_stream,
                                                ctypes.addressof(one_pointers), 0)),
        ]]
    except Exception as error:  # report, keep measuring
        print("cuda.bindings unavailable:", error)
    rows: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for label, mode, fn in cases:
            install(mode or "entry points")
            rows.setdefault(label, []).append(host_us(fn, calls=1000))
    for label, values in rows.items():
        print(f"{label}: best {min(values):.2f} us, median {statistics.median(values):.2f} "
              f"(rounds {' / '.join(f'{v:.2f}' for v in values)})", flush=True)


if __name__ == "__main__":
    main()
