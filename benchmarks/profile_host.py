"""Where the host time of the fast calls goes, by Python function, on a GPU: ``python benchmarks/profile_host.py``.

cProfile of ``plan.run`` (the fast path), ``quantize_per_tensor()``, ``quantize_per_token()`` (with and
without zero points), ``dynamic_range_quantize()`` and ``quantized_linear()`` on small CUDA torch tensors.
"""

import cProfile
import pstats

import torch

import baracuda_numba as bn

x = torch.randn(4096, device="cuda")
q = torch.empty(4096, device="cuda", dtype=torch.int8)
plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(4096, -128, 127, "f32", "s8"))
args = bn.QuantizePerTensorArgs(x, 0.02, 3, q)
x16 = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
weight = torch.randint(-127, 128, (4096, 4096), device="cuda", dtype=torch.int8)
weight_scale = torch.rand(4096, device="cuda") * 0.01
token_scales = torch.rand(16, device="cuda") * 0.01 + 0.001
token_zero_points = torch.zeros(16, device="cuda", dtype=torch.int32)
for label, fn in (("plan.run", lambda: plan.run(args)),
                  ("quantize_per_tensor()", lambda: bn.quantize_per_tensor(x, 0.02, 3)),
                  ("quantize_per_token() without zero points", lambda: bn.quantize_per_token(x16, token_scales)),
                  ("quantize_per_token() with zero points",
                   lambda: bn.quantize_per_token(x16, token_scales, token_zero_points)),
                  ("dynamic_range_quantize()", lambda: bn.dynamic_range_quantize(x16)),
                  ("quantized_linear()", lambda: bn.quantized_linear(x16, weight, weight_scale))):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        fn()
    profile.disable()
    torch.cuda.synchronize()
    print(f"== {label}")
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)
