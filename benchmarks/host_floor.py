"""Where a selected plan's host time goes, layer by layer, on the GPU: ``python3 benchmarks/host_floor.py``.

From the bottom: the ctypes ``cuLaunchKernel`` of the plan's compiled kernel with its parameter block
already packed (the floor of any launch from Python through ctypes), the launcher's patched launch
(``KernelLauncher.launch_patched``: patch the pointers and scalars, then launch), ``plan.run`` on
torch tensors (the fast path: pointer lookup, stream, geometry), the public function, and small
PyTorch ops timed in the same loop shape.
"""

import ctypes

import torch

import baracuda_numba as bn
from baracuda_numba import launch
from baracuda_numba.bench import host_us

small = torch.randn(4096, device="cuda")
small_q = torch.empty(4096, device="cuda", dtype=torch.int8)
other = torch.empty_like(small)
plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(4096, -128, 127, "f32", "s8"))
args = bn.QuantizePerTensorArgs(small, 0.02, 3, small_q)
plan.run(args)
torch.cuda.synchronize()
launcher = plan._launcher
driver = launch._driver()
function = launcher._functions[0]
_ctypes_launch = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
_ctypes_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
_ctypes_launch.restype = ctypes.c_int
stream = launch.torch_current_stream(0)
blocks, step_q, step_r = plan._geometry(4096 // plan._chunk, 0)
threads = plan.entry.policy.threads_per_block
ptr, qptr = small.data_ptr(), small_q.data_ptr()
groups = ((ptr, ptr, ptr, ptr, qptr, qptr, 0, 0), (step_q, step_r))
scalars = plan._scalars(args)
params = launcher.params.params_address


def raw_launch():
    _ctypes_launch(function, blocks, 1, 1, threads, 1, 1, 0, stream, params, None)


# The same launch through other call mechanisms: ctypes without argtypes on pre-built ctypes values
# (no per-argument conversion), and cuda.bindings' Cython wrapper with its handle objects built once.
_bare = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
_bare.restype = ctypes.c_int
_prebuilt = (ctypes.c_void_p(function), *(ctypes.c_uint(v) for v in (blocks, 1, 1, threads, 1, 1, 0)),
             ctypes.c_void_p(stream), ctypes.c_void_p(params), ctypes.c_void_p(0))


def prebuilt_launch():
    _bare(*_prebuilt)


def null_call():
    pass


try:
    from cuda.bindings import driver as cuda_driver

    _cu_function, _cu_stream = cuda_driver.CUfunction(function), cuda_driver.CUstream(stream)

    def bindings_launch():
        cuda_driver.cuLaunchKernel(_cu_function, blocks, 1, 1, threads, 1, 1, 0, _cu_stream, params, 0)
except Exception as error:  # report any import or construction failure, keep measuring
    print("cuda.bindings unavailable:", error)
    bindings_launch = None

x16 = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
CASES = [
    ("empty Python call", null_call),
    ("ctypes cuLaunchKernel, parameters packed", raw_launch),
    ("ctypes cuLaunchKernel, pre-built ctypes values, no argtypes", prebuilt_launch),
    *([("cuda.bindings cuLaunchKernel, handles built once", bindings_launch)] if bindings_launch else []),
    ("driver.launch (the package's launch: cuda.bindings, stream object cached)",
     lambda: driver.launch(launcher._launchable[0], blocks, threads, 0, stream, params)),
    ("driver.current_device() (ctypes cuCtxGetDevice)", driver.current_device),
    ("torch._C._cuda_getCurrentRawStream(0)", lambda: launch.torch_current_stream(0)),
    ("launcher.launch_patched", lambda: launcher.launch_patched(blocks, threads, stream, groups, scalars, 0)),
    ("plan._fast_pointers(args)", lambda: plan._fast_pointers(args)),
    ("QuantizePerTensorPlan.run (4096 f32)", lambda: plan.run(args)),
    ("quantize_per_tensor() (4096 f32)", lambda: bn.quantize_per_tensor(small, 0.02, 3)),
    ("quantize_per_tensor(out=) (4096 f32)", lambda: bn.quantize_per_tensor(small, 0.02, 3, out=small_q)),
    ("dynamic_range_quantize() 16x4096 bf16", lambda: bn.dynamic_range_quantize(x16)),
    ("torch.neg(out=) 4096 f32", lambda: torch.neg(small, out=other)),
    ("torch.quantize_per_tensor 4096 f32", lambda: torch.quantize_per_tensor(small, 0.02, 3, torch.qint8)),
    ("torch.empty(4096, int8)", lambda: torch.empty(4096, device="cuda", dtype=torch.int8)),
]
for label, fn in CASES:
    print(f"{label}: {host_us(fn):.2f} us", flush=True)
