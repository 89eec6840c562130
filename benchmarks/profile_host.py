"""Where the host time of plan.run goes (cProfile), on a GPU: python benchmarks/profile_host.py"""

import cProfile
import pstats
import time

import torch

import baracuda_numba as bn

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
pstats.Stats(profile).sort_stats("tottime").print_stats(14)
for label, fn in (("plan.run", lambda: plan.run(args)),
                  ("torch.quantize_per_tensor", lambda: torch.quantize_per_tensor(x, 0.02, 3, torch.qint8)),
                  ("bn.quantize_per_tensor", lambda: bn.quantize_per_tensor(x, 0.02, 3))):
    start = time.perf_counter()
    for _ in range(5000):
        fn()
    print(f"{label}: {(time.perf_counter() - start) / 5000 * 1e6:.1f} us per call")
    torch.cuda.synchronize()
