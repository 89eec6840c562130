"""Try segment-kernel variants of dynamic-range quantize on a GPU: chunks kept per lane (``keep``) and
threads per block. ``python benchmarks/tune_dynamic.py``; prints GB/s per variant and case."""

import torch

import baracuda_numba as bn
from baracuda_numba.bench import device_ms
from baracuda_numba.plans import dynamic as plans_dynamic

x = torch.randn(65536, 4096, device="cuda", dtype=torch.bfloat16)
src = torch.randn(1 << 28, device="cuda")
dst = torch.empty_like(src)
copy = 8 * (1 << 28) / device_ms(lambda: dst.copy_(src), 10) / 1e6
del src, dst
print(f"copy {copy:.0f} GB/s")
original = bn.registry.DynamicRangeEntry.kernels
for keep in (2, 4, 8):
    for threads in (128, 256):
        bn.registry.DynamicRangeEntry.kernels = (
            lambda self, symmetric, keep=keep, threads=threads: original(self, symmetric, keep, threads))
        bn.clear_plan_cache()
        row = []
        for label, kwargs in (("token", {}), ("group128", dict(scope="group", group_size=128)),
                              ("tensor", dict(scope="tensor"))):
            ms = device_ms(lambda kwargs=kwargs: bn.dynamic_range_quantize(x, **kwargs), 10)
            row.append(f"{label} {3 * x.numel() / ms / 1e6:6.0f}")
        print(f"keep {keep} threads {threads}: " + "  ".join(row), flush=True)
bn.registry.DynamicRangeEntry.kernels = original
_ = plans_dynamic
