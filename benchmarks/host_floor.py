"""Where a selected plan's host time goes, layer by layer, on the GPU: ``python3 benchmarks/host_floor.py``.

From the bottom: ``cuLaunchKernel`` of a one-parameter kernel and of the plan's kernel (8 numba arrays
and 11 scalars: 67 parameters) through cuda.bindings and ctypes, with a pointer per parameter or one
packed buffer (``extra``); the package's compiled launch (:func:`baracuda_numba.launch.make_record_launch`:
device check, buffer copy and patch, ``cuLaunchKernel``); the launcher's ``launch_patched``; the pieces
of ``plan.run``'s fast path (torch attribute reads, the scalar memo, the stream); ``plan.run`` on torch
tensors; the public functions; and small PyTorch ops timed in the same loop shape.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import torch
from numba import cuda

import baracuda_numba as bn
from baracuda_numba import launch
from baracuda_numba.bench import host_us
from baracuda_numba.ops import common
from baracuda_numba.plans.base import trusted_pointers


@cuda.jit("void(int64)")
def one_parameter(n):
    pass


def per_tensor_launch(x: torch.Tensor, q: torch.Tensor) -> SimpleNamespace:
    """``QuantizePerTensorPlan`` on 4096 float32 ``x`` into int8 ``q`` (scale 0.02, zero point 3), run once, and
    the pieces of its launch: the plan and args, its launcher, ``CUfunction``, record, stream, grid, the patched
    ints and scalars, and the packed parameter bytes in ``buffer`` with a pointer per parameter in ``pointers``."""
    plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(4096, -128, 127, "f32", "s8"))
    args = bn.QuantizePerTensorArgs(x, 0.02, 3, q)
    plan.run(args)
    torch.cuda.synchronize()
    launcher = plan._launcher
    blocks, step_q, step_r, _ = plan._geometry(4096 // plan._chunk, 0)
    ptr, qptr = x.data_ptr(), q.data_ptr()
    scalars = plan._scalars(args)
    ints = (ptr, ptr, ptr, ptr, qptr, qptr, 0, 0, step_q, step_r)
    packed = launch.record_bytes(launcher.params.record, ints, scalars)
    buffer = ctypes.create_string_buffer(packed, len(packed))
    pointers = (ctypes.c_uint64 * launcher.params.n_params)(*(ctypes.addressof(buffer) + offset
                                                              for offset in launcher.params.offsets))
    return SimpleNamespace(plan=plan, args=args, launcher=launcher, function=launcher._functions[0],
                           record=launcher.params.record, stream=launch.torch_current_stream(0), blocks=blocks,
                           threads=plan.entry.policy.threads_per_block, ints=ints, scalars=scalars, packed=packed,
                           buffer=buffer, pointers=pointers)


def main() -> None:
    small = torch.randn(4096, device="cuda")
    small_q = torch.empty(4096, device="cuda", dtype=torch.int8)
    other = torch.empty_like(small)
    parts = per_tensor_launch(small, small_q)
    plan, args, launcher, function, record, stream = (parts.plan, parts.args, parts.launcher, parts.function,
                                                      parts.record, parts.stream)
    blocks, threads, ints, scalars = parts.blocks, parts.threads, parts.ints, parts.scalars
    packed, buffer, pointers = parts.packed, parts.buffer, parts.pointers
    size = ctypes.c_uint64(len(packed))
    extra = (ctypes.c_uint64 * 5)(1, ctypes.addressof(buffer), 2, ctypes.addressof(size), 0)

    libcuda = ctypes.CDLL("libcuda.so.1")
    cu_launch = libcuda.cuLaunchKernel
    cu_launch.argtypes = [ctypes.c_uint64] + [ctypes.c_uint] * 7 + [ctypes.c_uint64] * 3
    cu_launch.restype = ctypes.c_int
    one_parameter[1, 32](1)
    torch.cuda.synchronize()
    one = int(next(iter(one_parameter.overloads.values()))._codelibrary.get_cufunc().handle)
    one_value = ctypes.c_int64(1)
    one_params = (ctypes.c_uint64 * 1)(ctypes.addressof(one_value))
    proc_launch = launch._entry_point(libcuda, "cuLaunchKernel", launch._LAUNCH_KERNEL)
    driver = launch._driver()
    compiled = driver.launch_record

    small_q.zero_()
    assert compiled(function, 0, blocks, threads, stream, record, ints, scalars) == 0
    torch.cuda.synchronize()
    expected = torch.clamp(torch.round(small * torch.tensor(1 / 0.02, dtype=torch.float32)) + 3, -128, 127)
    print("compiled launch output equals the reference:", torch.equal(small_q, expected.to(torch.int8)), flush=True)

    cases = [("empty Python call", lambda: None)]
    try:
        from cuda.bindings import driver as cuda_driver

        cu_function, cu_stream, cu_one = (cuda_driver.CUfunction(function), cuda_driver.CUstream(stream),
                                          cuda_driver.CUfunction(one))
        cases += [
            ("cuda.bindings cuLaunchKernel, 1-parameter kernel",
             lambda: cuda_driver.cuLaunchKernel(cu_one, 1, 1, 1, 32, 1, 1, 0, cu_stream, ctypes.addressof(one_params),
                                                0)),
            ("cuda.bindings cuLaunchKernel, plan kernel (67 parameters), a pointer per parameter",
             lambda: cuda_driver.cuLaunchKernel(cu_function, blocks, 1, 1, threads, 1, 1, 0, cu_stream,
                                                ctypes.addressof(pointers), 0)),
        ]
    except Exception as error:  # report, keep measuring
        print("cuda.bindings unavailable:", error)
    cases += [
        ("ctypes cuLaunchKernel, 1-parameter kernel",
         lambda: cu_launch(one, 1, 1, 1, 32, 1, 1, 0, stream, ctypes.addressof(one_params), 0)),
        ("ctypes cuLaunchKernel, plan kernel, a pointer per parameter",
         lambda: cu_launch(function, blocks, 1, 1, threads, 1, 1, 0, stream, ctypes.addressof(pointers), 0)),
        ("ctypes cuLaunchKernel, plan kernel, one packed buffer (extra)",
         lambda: cu_launch(function, blocks, 1, 1, threads, 1, 1, 0, stream, 0, ctypes.addressof(extra))),
        ("ctypes, cuLaunchKernel from cuGetProcAddress, extra",
         lambda: proc_launch(function, blocks, 1, 1, threads, 1, 1, 0, stream, 0, ctypes.addressof(extra))),
        ("compiled launch (device check, buffer copy and patch, cuLaunchKernel)",
         lambda: compiled(function, 0, blocks, threads, stream, record, ints, scalars)),
        ("launcher.launch_patched", lambda: launcher.launch_patched(blocks, threads, stream, ints, scalars, 0)),
        ("driver.current_device() (ctypes cuCtxGetDevice)", driver.current_device),
        ("plan._fast_pointers(args)", lambda: plan._fast_pointers(args)),
        ("plan._scalars(args)", lambda: plan._scalars(args)),
        ("plan._geometry", lambda: plan._geometry(4096 // plan._chunk, 0)),
        ("torch._C._cuda_getCurrentRawStream(0)", lambda: launch.torch_current_stream(0)),
        ("tensor.data_ptr()", small.data_ptr),
        ("tensor.get_device()", small.get_device),
        ("tensor.is_contiguous()", small.is_contiguous),
        ("tensor.numel()", small.numel),
        ("tensor.dtype", lambda: small.dtype),
        ("tensor.is_cuda", lambda: small.is_cuda),
        ("QuantizePerTensorPlan.run (4096 f32)", lambda: plan.run(args)),
        ("quantize_per_tensor() (4096 f32)", lambda: bn.quantize_per_tensor(small, 0.02, 3)),
        ("quantize_per_tensor(out=) (4096 f32)", lambda: bn.quantize_per_tensor(small, 0.02, 3, out=small_q)),
        ("torch.neg(out=) 4096 f32", lambda: torch.neg(small, out=other)),
        ("torch.quantize_per_tensor 4096 f32", lambda: torch.quantize_per_tensor(small, 0.02, 3, torch.qint8)),
        ("torch.empty(4096, int8)", lambda: torch.empty(4096, device="cuda", dtype=torch.int8)),
    ]
    x16 = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    token_scales = torch.rand(16, device="cuda") * 0.05 + 0.01
    cases += [
        ("quantize_per_token() 16x4096 bf16", lambda: bn.quantize_per_token(x16, token_scales)),
        ("dynamic_range_quantize() 16x4096 bf16", lambda: bn.dynamic_range_quantize(x16)),
    ]
    # the pieces of quantize_per_token()'s remembered call, in its order
    bn.quantize_per_token(x16, token_scales)
    key = common.fast_key("quantize_per_token", (x16, token_scales), None, None, "int8", None, None)
    token_plan, dtype, device, index = common.remembered(key)
    zeros = token_plan.default_zero_points(device)
    token_q = torch.empty(x16.shape, dtype=dtype, device=device)
    token_args = bn.QuantizePerTokenArgs(x16, token_scales, zeros, token_q)
    cases += [
        ("  fast_key (2 tensors)", lambda: common.fast_key("quantize_per_token", (x16, token_scales), None, None,
                                                           "int8", None, None)),
        ("  remembered(key)", lambda: common.remembered(key)),
        ("  plan.default_zero_points(device)", lambda: token_plan.default_zero_points(device)),
        ("  torch.empty(x.shape, dtype=, device=)", lambda: torch.empty(x16.shape, dtype=dtype, device=device)),
        ("  torch.empty(x.shape, dtype=, device=index)", lambda: torch.empty(x16.shape, dtype=dtype, device=index)),
        ("  torch.empty_like(x, dtype=)", lambda: torch.empty_like(x16, dtype=dtype)),
        ("  x.new_empty(x.shape, dtype=)", lambda: x16.new_empty(x16.shape, dtype=dtype)),
        ("  x.new_empty((16, 1), dtype=float32)", lambda: x16.new_empty((16, 1), dtype=torch.float32)),
        ("  torch.empty((16, 1), dtype=float32, device=)",
         lambda: torch.empty((16, 1), dtype=torch.float32, device=device)),
        ("  torch.empty(16, 4096, dtype=, device='cuda')", lambda: torch.empty(16, 4096, dtype=dtype, device="cuda")),
        ("  QuantizePerTokenArgs(...)", lambda: bn.QuantizePerTokenArgs(x16, token_scales, zeros, token_q)),
        ("  plan.run_trusted(args, index)", lambda: token_plan.run_trusted(token_args, index)),
        ("  trusted_pointers", lambda: trusted_pointers(token_plan._fast, token_args)),
        ("  plan._scalars(args)", lambda: token_plan._scalars(token_args)),
    ]
    for label, fn in cases:
        print(f"{label}: {host_us(fn):.2f} us", flush=True)


if __name__ == "__main__":
    main()
