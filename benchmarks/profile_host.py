"""Where the host time of plan.run and of the op functions goes, on a GPU: python benchmarks/profile_host.py

Prints cProfile of plan.run (fast path), then per-call costs of its parts (the raw cuLaunchKernel,
cuCtxGetDevice, torch attribute reads, torch.empty) next to the whole calls and a torch op.
"""

import cProfile
import pstats
import time

import torch

import baracuda_numba as bn
from baracuda_numba import launch

x = torch.randn(4096, device="cuda")
q = torch.empty(4096, device="cuda", dtype=torch.int8)
plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(4096, -128, 127, "f32", "s8"))
args = bn.QuantizePerTensorArgs(x, 0.02, 3, q)
for _ in range(100):
    plan.run(args)
torch.cuda.synchronize()
profile = cProfile.Profile()
profile.enable()
for _ in range(2000):
    plan.run(args)
profile.disable()
torch.cuda.synchronize()
pstats.Stats(profile).sort_stats("tottime").print_stats(12)
driver = launch._driver()
launcher = plan._launcher
function = launcher._launchable[0]
params = launcher.params.params_address
stream = launch.torch_current_stream(0)


def raw_launch():
    driver.launch(function, 1, 512, 0, stream, params)


for label, fn in (("raw cuLaunchKernel (ctypes)", raw_launch),
                  ("cuCtxGetDevice (ctypes)", driver.current_device),
                  ("torch stream getter", lambda: launch.torch_current_stream(0)),
                  ("x.data_ptr() + is_cuda + numel + is_contiguous + dtype + get_device",
                   lambda: (x.data_ptr(), x.is_cuda, x.numel(), x.is_contiguous(), x.dtype, x.get_device())),
                  ("torch.empty(4096, int8, cuda)", lambda: torch.empty(x.shape, dtype=torch.int8, device=x.device)),
                  ("plan.run", lambda: plan.run(args)),
                  ("bn.quantize_per_tensor", lambda: bn.quantize_per_tensor(x, 0.02, 3)),
                  ("torch.quantize_per_tensor", lambda: torch.quantize_per_tensor(x, 0.02, 3, torch.qint8))):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5000):
        fn()
    print(f"{label}: {(time.perf_counter() - start) / 5000 * 1e6:.2f} us per call")
    torch.cuda.synchronize()
