"""Each dynamic-range strategy once on bf16 [16384, 4096], for ``ncu`` to profile; ``--staged`` also runs
the per-token case with the staged resident kernel (k2 t256, launch bound 4 blocks per SM);
``--token-only`` leaves out the other scopes.

    ncu --kernel-name regex:dynamic_ --section SpeedOfLight --section WarpStateStats \\
        --section Occupancy --section LaunchStats python benchmarks/profile_dynamic_ncu.py --staged
"""

import dataclasses
import sys

import torch

import baracuda_numba as bn
from baracuda_numba.plans import dynamic as plans_dynamic

x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
runs = [({}, {}), ({}, dict(mode="asymmetric")), ({}, dict(scope="group", group_size=128)),
        ({}, dict(scope="tensor")), ({}, dict(scope="channel", axis=1))]
if "--token-only" in sys.argv:
    runs = runs[:1]
if "--staged" in sys.argv:
    runs.append((dict(resident_keep=2, resident_threads=256, resident_staged=True, resident_blocks_per_sm=4,
                      resident_min_blocks=4), {}))
for tuning, kwargs in runs:
    plans_dynamic.TUNING = dataclasses.replace(plans_dynamic.DynamicTuning(), **tuning)
    bn.clear_plan_cache()
    bn.dynamic_range_quantize(x, **kwargs)
    torch.cuda.synchronize()
    print("ran", tuning, kwargs, flush=True)
