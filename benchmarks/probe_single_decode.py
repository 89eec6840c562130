"""The bench's single-call decode rows (a busy wait queued first, the same weight every call) with the
fused kernel's one-wave shape and its dependent launch switched on and off, in one process."""

import torch

import baracuda_numba as bn
from baracuda_numba.bench import device_ms
from baracuda_numba.plans import linear as plans

settings = {"shipped": (True, 0), "no one-wave": (False, 0), "one-wave, plain at K < 8192": (True, 8192),
            "session 25 (neither)": (False, 8192)}
for rep in range(2):
    for nk in (4096, 8192):
        x = torch.randn(1, nk, device="cuda", dtype=torch.bfloat16)
        w = torch.randint(-128, 128, (nk, nk), device="cuda", dtype=torch.int8)
        ws = torch.rand(nk, device="cuda") * 0.01
        out = torch.empty_like(w)
        copy_gbs = 2 * w.numel() / device_ms(lambda out=out, w=w: out.copy_(w), 100) / 1e6
        row = []
        for label, (one_wave, min_k) in settings.items():
            plans.ONE_WAVE_SHAPE, plans.FUSED_DEPENDENT_MIN_K = one_wave, min_k
            bn.clear_plan_cache()
            ms = device_ms(lambda x=x, w=w, ws=ws: bn.quantized_linear(x, w, ws), 200)
            row.append(f"{label}: {100 * w.numel() / ms / 1e6 / copy_gbs:.1f}%")
        print(f"rep {rep} {nk}^2 M = 1 (copy {copy_gbs:.0f} GB/s): " + "; ".join(row), flush=True)
