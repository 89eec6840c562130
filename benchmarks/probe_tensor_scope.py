"""The dynamic per-tensor quantize on bf16 [65536, 4096] (512 MiB) next to torch.compile's composition:
GPU time of each (median, a busy wait queued first) at the launch shapes given as arguments
("partial:quantize" blocks per SM of the two passes; the shipped shape first), and with ``--ncu`` one
call of each (at the first shape given) after warming up, for ``ncu --cache-control none`` to count the
DRAM bytes each kernel moves (the L2 kept between the range pass and the quantize pass).

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

shipped = plans_dynamic.TUNING
shapes = [tuple(int(v) for v in a.split(":")) for a in sys.argv[1:] if ":" in a]


def use_shape(partial: int, quantize: int) -> None:
    plans_dynamic.TUNING = dataclasses.replace(shipped, tensor_partial_blocks_per_sm=partial,
                                               tensor_quantize_blocks_per_sm=quantize)
    bn.clear_plan_cache()


x = torch.randn(65536, 4096, device="cuda", dtype=torch.bfloat16)
compiled = torch.compile(torch_dynamic_tensor)
theirs = compiled(x)
torch.cuda.synchronize()
if "--ncu" in sys.argv:
    if shapes:
        use_shape(*shapes[0])
    for _ in range(2):
        bn.dynamic_range_quantize(x, scope="tensor")
        compiled(x)
    torch.cuda.synchronize()
    sys.exit(0)
out = torch.empty_like(x)
n = x.numel()
shapes.insert(0, (shipped.tensor_partial_blocks_per_sm, shipped.tensor_quantize_blocks_per_sm))
for rep in range(2):
    copy_ms = device_ms(lambda: out.copy_(x), 50)
    theirs_ms = device_ms(lambda: compiled(x), 50)
    amax_ms = device_ms(lambda: x.abs().amax(), 50)
    print(f"rep {rep}: copy {4 * n / copy_ms / 1e6:.0f} GB/s ({copy_ms * 1e3:.1f} us); torch.compile "
          f"{theirs_ms * 1e3:.1f} us; eager abs().amax() {amax_ms * 1e3:.1f} us ({2 * n / amax_ms / 1e6:.0f} GB/s)",
          flush=True)
    for partial, quantize in shapes:
        use_shape(partial, quantize)
        ours_ms = device_ms(lambda: bn.dynamic_range_quantize(x, scope="tensor"), 50)
        assert torch.equal(bn.dynamic_range_quantize(x, scope="tensor").q, theirs[0]), "ours and torch's differ"
        print(f"  {partial}:{quantize} blocks per SM: ours {ours_ms * 1e3:.1f} us ({5 * n / ours_ms / 1e6:.0f} GB/s "
              f"on 5n), torch.compile / ours {theirs_ms / ours_ms:.4f}", flush=True)
    plans_dynamic.TUNING = shipped
