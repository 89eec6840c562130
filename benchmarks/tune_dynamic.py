"""Try segment-kernel variants of dynamic-range quantize on a GPU: chunks kept per lane (``keep``) and
threads per block. ``python benchmarks/tune_dynamic.py``; prints GB/s per variant and case."""

import torch

import baracuda_numba as bn
from baracuda_numba.bench import device_ms

x = torch.randn(65536, 4096, device="cuda", dtype=torch.bfloat16)
buffers = [torch.randn(1 << 28, device="cuda"), torch.empty(1 << 28, device="cuda")]
copy = 8 * (1 << 28) / device_ms(lambda: buffers[1].copy_(buffers[0]), 10) / 1e6
buffers.clear()
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
