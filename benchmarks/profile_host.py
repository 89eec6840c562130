"""Where the host time of plan.run goes (cProfile), on a GPU: python benchmarks/profile_host.py"""

import cProfile
import pstats

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
