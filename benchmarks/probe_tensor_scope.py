"""The dynamic per-tensor quantize on bf16 [65536, 4096] (512 MiB) next to torch.compile's composition:
GPU time of each (median, a busy wait queued first) for each tail of x kept in L2 between the passes
(MiB, the arguments), and with ``--ncu`` one call of each after warming
up, for ``ncu --cache-control none`` to count the DRAM bytes each kernel moves (the L2 kept between the
range pass and the quantize pass).

    ncu --cache-control none --kernel-name regex:'partial|tensor_quantize|triton' \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python benchmarks/probe_tensor_scope.py --ncu
"""

import dataclasses
import sys

import torch

import baracuda_numba as bn
from baracuda_numba.bench import device_ms, torch_dynamic_tensor
from baracuda_numba.plans import dynamic as plans_dynamic

x = torch.randn(65536, 4096, device="cuda", dtype=torch.bfloat16)
compiled = torch.compile(torch_dynamic_tensor)
ours = bn.dynamic_range_quantize(x, scope="tensor")
theirs = compiled(x)
assert torch.equal(ours.q, theirs[0]), "ours and torch.compile's differ"
torch.cuda.synchronize()
if "--ncu" in sys.argv:
    tail = [int(t) for t in sys.argv[1:] if t.isdigit()]
    if tail:
        plans_dynamic.TUNING = dataclasses.replace(plans_dynamic.TUNING, tensor_l2_tail_bytes=tail[0] << 20)
        bn.clear_plan_cache()
    for _ in range(2):
        bn.dynamic_range_quantize(x, scope="tensor")
        compiled(x)
    torch.cuda.synchronize()
    sys.exit(0)
out = torch.empty_like(x)
n = x.numel()
tails = [int(t) for t in sys.argv[1:] if t.isdigit()] or [plans_dynamic.TUNING.tensor_l2_tail_bytes >> 20]
shipped = plans_dynamic.TUNING
for rep in range(2):
    copy_ms = device_ms(lambda: out.copy_(x), 50)
    theirs_ms = device_ms(lambda: compiled(x), 50)
    print(f"rep {rep}: copy {4 * n / copy_ms / 1e6:.0f} GB/s ({copy_ms * 1e3:.1f} us); torch.compile "
          f"{theirs_ms * 1e3:.1f} us", flush=True)
    for tail in tails:  # MiB of x kept in L2 between the passes
        plans_dynamic.TUNING = dataclasses.replace(shipped, tensor_l2_tail_bytes=tail << 20)
        bn.clear_plan_cache()
        ours_ms = device_ms(lambda: bn.dynamic_range_quantize(x, scope="tensor"), 50)
        assert torch.equal(bn.dynamic_range_quantize(x, scope="tensor").q, theirs[0])
        print(f"  tail {tail} MiB: ours {ours_ms * 1e3:.1f} us ({5 * n / ours_ms / 1e6:.0f} GB/s on 5n), "
              f"torch.compile / ours {theirs_ms / ours_ms:.4f}", flush=True)
    plans_dynamic.TUNING = shipped
