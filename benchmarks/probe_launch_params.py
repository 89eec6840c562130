"""How the driver takes a launch's parameters, and what that costs the host, on the GPU:
``python3 -m benchmarks.probe_launch_params``.

The package's compiled launch (:func:`baracuda_numba.launch.make_record_launch`) hands ``cuLaunchKernel`` one
packed buffer through ``extra``. This probe launches the same record, from compiled code, in the other ways the
driver takes: a pointer per parameter (``kernelParams``), and ``cuLaunchKernelEx`` with no attributes (either
way), for ``QuantizePerTensorPlan``'s kernel (67 parameters) and a one-parameter kernel; without the device
check; and the pieces of ``plan.run``'s Python around it. The cases run interleaved, round after round, so that a
slow stretch of the host shows in all of them; each case's best and median round are printed. The outputs of
every launch mode are checked against PyTorch before timing.
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

from .host_floor import one_parameter, per_tensor_launch

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

    cases = [
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
    ]
    try:
        from cuda.bindings import driver as cuda_driver

        cu_function, cu_stream = cuda_driver.CUfunction(function), cuda_driver.CUstream(stream)
        cases.append(("cuda.bindings cuLaunchKernel, plan kernel, a pointer per parameter",
                      lambda: cuda_driver.cuLaunchKernel(cu_function, blocks, 1, 1, threads, 1, 1, 0, cu_stream,
                                                         ctypes.addressof(parts.pointers), 0)))
    except Exception as error:  # report, keep measuring
        print("cuda.bindings unavailable:", error)
    rows: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for label, fn in cases:
            rows.setdefault(label, []).append(host_us(fn, calls=1000))
    for label, values in rows.items():
        print(f"{label}: best {min(values):.2f} us, median {statistics.median(values):.2f} "
              f"(rounds {' / '.join(f'{v:.2f}' for v in values)})", flush=True)


if __name__ == "__main__":
    main()
