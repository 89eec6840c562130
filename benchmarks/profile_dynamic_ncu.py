"""Each dynamic-range strategy once on bf16 [16384, 4096], for ``ncu`` to profile."""

import torch

import baracuda_numba as bn

x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
for kwargs in ({}, dict(mode="asymmetric"), dict(scope="group", group_size=128), dict(scope="tensor"),
               dict(scope="channel", axis=1)):
    bn.dynamic_range_quantize(x, **kwargs)
    torch.cuda.synchronize()
    print("ran", kwargs, flush=True)
