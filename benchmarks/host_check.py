"""Host microseconds per call of the dynamic-range and W8A8 ops (their remembered-plan fast paths),
next to a small torch op, on the GPU: ``python3 benchmarks/host_check.py``."""

import torch

import baracuda_numba as bn
from baracuda_numba.bench import host_us

x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
x1 = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randint(-128, 128, (4096, 4096), device="cuda", dtype=torch.int8)
ws = torch.rand(4096, device="cuda")
w_tall = torch.randint(-128, 128, (11008, 4096), device="cuda", dtype=torch.int8)
ws_tall = torch.rand(11008, device="cuda")
a = torch.randn(64, 64, device="cuda")
CASES = [
    ("dynamic_range_quantize() 16x4096 bf16", lambda: bn.dynamic_range_quantize(x)),
    ("dynamic_range_quantize() 1x4096 bf16", lambda: bn.dynamic_range_quantize(x1)),
    ("dynamic_range_quantize() 16x4096 group128", lambda: bn.dynamic_range_quantize(x, scope="group", group_size=128)),
    ("quantized_linear() 16x4096 @ 4096^2", lambda: bn.quantized_linear(x, w, ws)),
    ("quantized_linear() 1x4096 @ 4096^2 (fused)", lambda: bn.quantized_linear(x1, w, ws)),
    ("quantized_linear() 1x4096 @ 11008x4096 (two launches)", lambda: bn.quantized_linear(x1, w_tall, ws_tall)),
    ("torch.empty_like(x) 16x4096 bf16", lambda: torch.empty_like(x)),
    ("torch.mm 64x64 f32", lambda: torch.mm(a, a)),
]
# Twice over the list, the second pass printed: the first case of a cold process read up to 8 us slower
# than the same fast path with other arguments (session 16: token 25.5 us, group 128 17.2 us).
for round_ in range(2):
    for label, fn in CASES:
        us = host_us(fn)
        if round_:
            print(f"{label}: {us:.1f} us", flush=True)
