"""Elementwise kernel variants on a GPU, timed next to the copy in one run and checked bit for bit
against the first variant (the shipped settings); ``--variants channel`` varies the channel kernels'
``launch_bounds`` and stationary grid, ``--variants unroll`` the chunks in flight of every kernel.
``python benchmarks/tune_elementwise.py [--log2n 28] [--cols 4096] [--group 128] [--only LABEL] [--variants SET]
[--ncu]``

``--cols`` / ``--group``: the rows' length and the group size (other than powers of two: the kernels that
track their segment instead of shifting).

``--ncu``: run each case of the chosen variant once at 2^26, for ``ncu`` to profile.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import torch

import baracuda_numba as bn
from baracuda_numba import registry
from baracuda_numba.bench import device_ms
from baracuda_numba.kernels import elementwise
from baracuda_numba.plans import base

COLS = 4096  # the rows' length (--cols)
GROUP = 128  # the per-group cases' group size (--group)
SHIPPED_POW2_UNROLL = elementwise.POW2_UNROLL
SHIPPED_POW2_BOUNDS = elementwise.POW2_LAUNCH_BOUNDS
SHIPPED_STATIONARY_BYTES = elementwise.STATIONARY_INPUT_BYTES
SHIPPED_WAVES = dict(base.STATIONARY_WAVES)
ORIGINAL_POW2 = base.ElementwisePlan._pow2_segments
_SHIPPED_POLICIES: dict = {}


def cases(n: int):
    rows = n // COLS
    data = {}
    for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        data[name] = ((torch.randn(rows, COLS, device="cuda") * 3).to(dtype),
                      torch.randn(rows, COLS, device="cuda").to(dtype))
    q = torch.randint(-128, 128, (rows, COLS), device="cuda", dtype=torch.int8)

    def scales(count):
        return (torch.rand(count, device="cuda") * 0.05 + 0.01,
                torch.randint(-5, 5, (count,), device="cuda", dtype=torch.int32))

    col_s, col_z = scales(COLS)
    row_s, row_z = scales(rows)
    grp_s, grp_z = scales(rows * COLS // GROUP)
    for name in ("bf16", "f32"):
        x, dy = data[name]
        size = x.element_size()
        yield f"channel[last] quantize {name}", size + 1, lambda x=x: bn.quantize_per_channel(x, col_s, col_z, 1)
        yield f"channel[last] dequantize {name}", size + 1, \
            lambda name=name: bn.dequantize_per_channel(q, col_s, col_z, 1, dtype=name)
        yield f"channel[last] quantize_backward {name}", 3 * size, \
            lambda x=x, dy=dy: bn.quantize_per_channel_backward(dy, x, col_s, col_z, 1)
        yield f"channel[0] quantize {name}", size + 1, lambda x=x: bn.quantize_per_channel(x, row_s, row_z, 0)
        yield f"token quantize {name}", size + 1, lambda x=x: bn.quantize_per_token(x, row_s, row_z)
        yield f"token dequantize {name}", size + 1, lambda name=name: bn.dequantize_per_token(q, row_s, row_z,
                                                                                             dtype=name)
        yield f"group{GROUP} quantize {name}", size + 1, lambda x=x: bn.quantize_per_group(x, grp_s, grp_z, GROUP)
        yield f"group{GROUP} dequantize {name}", size + 1, \
            lambda name=name: bn.dequantize_per_group(q, grp_s, grp_z, GROUP, dtype=name)
        yield f"tensor dequantize {name}", size + 1, lambda name=name: bn.dequantize_per_tensor(q, 0.02, 3,
                                                                                                dtype=name)
        yield f"tensor quantize {name}", size + 1, lambda x=x: bn.quantize_per_tensor(x, 0.02, 3)
        yield f"tensor quantize fp8 {name}", size + 1, lambda x=x: bn.quantize_per_tensor(x, 0.02, None,
                                                                                          dtype="float8_e4m3fn")
        yield f"tensor fake_quantize {name}", 2 * size, lambda x=x: bn.fake_quantize(x, 0.02, 3)
        yield f"tensor quantize_backward {name}", 3 * size, \
            lambda x=x, dy=dy: bn.quantize_per_tensor_backward(dy, x, 0.02, 3)


def use_policy(policy: tuple[int, int] | None) -> None:
    """Threads per block and the grid's cap in blocks per SM of every elementwise entry (None: as shipped,
    each entry's own)."""
    if not _SHIPPED_POLICIES:
        _SHIPPED_POLICIES.update({entry.key: entry.policy for entry in registry.entries()
                                  if isinstance(entry, registry.RegistryEntry)})
    for entry in registry.entries():
        if entry.key in _SHIPPED_POLICIES:
            chosen = registry.LaunchPolicy(*policy) if policy else _SHIPPED_POLICIES[entry.key]
            object.__setattr__(entry, "policy", chosen)


class Variant(NamedTuple):
    """One setting of every knob (``shipped``: as the package ships them)."""

    unroll: int  # chunks in flight of the general kernels
    stationary: bool  # the thread-stationary channel grid (False: the entry's own grid)
    bounds: tuple[int, int] | None  # launch_bounds of the channel kernels whose chunks span channels
    per_sm: int  # blocks per SM of the stationary kernel (its launch_bounds and one-wave grid)
    pow2: int | None  # chunks in flight of the shift kernels (0: segments tracked, no shift kernels)
    policy: tuple[int, int] | None  # (threads, blocks per SM cap) of every elementwise entry (None: shipped)
    prefetch: int  # L2 prefetch distance of the shift kernels (-1: none, without their launch_bounds)
    in_flight: int  # input bytes in flight per thread of the stationary loop
    vector_ops: frozenset  # ops whose last-axis channel kernels read their scales as vectors
    vector_policy: tuple[int, int, int]  # (threads, blocks per SM cap, unroll) of those
    waves: int | None = None  # waves of blocks of the stationary kernel's grid (None: plans.base.STATIONARY_WAVES)

    def label(self) -> str:
        vectors = "all" if self.vector_ops == ALL_OPS else ",".join(sorted(o.value for o in self.vector_ops)) or "none"
        return (f"unroll {self.unroll} (pow2 {self.pow2}), bounds {self.bounds}, {self.per_sm}/SM, policy "
                f"{self.policy or 'shipped'}, prefetch {self.prefetch}, stationary {self.in_flight} B, vectors "
                f"{vectors} {self.vector_policy}, {self.waves or 'shipped'} stationary waves")


ALL_OPS = frozenset(elementwise.ElementwiseOp)


def shipped_variant() -> Variant:
    return Variant(elementwise.UNROLL, True, elementwise.CHANNEL_LAUNCH_BOUNDS, elementwise.STATIONARY_LAUNCH_BOUNDS[1],
                   SHIPPED_POW2_UNROLL, None, elementwise.POW2_PREFETCH, SHIPPED_STATIONARY_BYTES,
                   registry.CHANNEL_VECTOR_OPS, (registry.CHANNEL_VECTOR_POLICY.threads_per_block,
                                                                  registry.CHANNEL_VECTOR_POLICY.blocks_per_sm,
                                                                  registry.CHANNEL_VECTOR_POLICY.unroll))


def use_variant(v: Variant, original=base.stationary_blocks) -> None:
    """Set every knob of ``v`` and drop the kernels and plans built under the previous one."""
    use_policy(v.policy)
    elementwise.POW2_PREFETCH = max(v.prefetch, 0)
    elementwise.POW2_LAUNCH_BOUNDS = None if v.prefetch < 0 else SHIPPED_POW2_BOUNDS
    elementwise.UNROLL = v.unroll
    elementwise.STATIONARY_INPUT_BYTES = v.in_flight
    elementwise.POW2_UNROLL = v.pow2 or SHIPPED_POW2_UNROLL
    # pow2 0: every row segment tracked incrementally, as before the shift kernels
    base.ElementwisePlan._pow2_segments = (lambda self: False) if v.pow2 == 0 else ORIGINAL_POW2
    elementwise.CHANNEL_LAUNCH_BOUNDS = v.bounds
    elementwise.STATIONARY_LAUNCH_BOUNDS = (512, v.per_sm)
    base.stationary_blocks = original if v.stationary else (lambda blocks, *_: blocks)
    base.STATIONARY_WAVES = SHIPPED_WAVES if v.waves is None else {size: v.waves for size in (1, 2, 4, 8)}
    registry.CHANNEL_VECTOR_OPS = v.vector_ops
    registry.CHANNEL_VECTOR_POLICY = registry.LaunchPolicy(*v.vector_policy)
    elementwise.elementwise_kernel.cache_clear()
    bn.clear_plan_cache()


def main() -> None:
    global COLS, GROUP
    parser = argparse.ArgumentParser()
    parser.add_argument("--log2n", type=int, default=28)
    parser.add_argument("--cols", type=int, default=COLS)
    parser.add_argument("--group", type=int, default=GROUP)
    parser.add_argument("--ncu", action="store_true")
    parser.add_argument("--only", nargs="+", default=[""], help="run only the cases whose label contains one of these")
    parser.add_argument("--variants", choices=("channel", "unroll", "pow2", "policy", "prefetch", "stationary",
                                                   "persistent", "vectors", "waves", "grid"),
                        default="channel",
                        help="the channel kernels' launch bounds and grid, the chunks in flight of every kernel, "
                             "those of the power-of-two segment kernels, the stationary loop's bytes in flight, "
                             "the channel-vector kernels' ops and grid, "
                             "or the block size and grid cap (with "
                             "the chunks in flight) of every elementwise kernel")
    args = parser.parse_args()
    COLS, GROUP = args.cols, args.group
    n = (1 << args.log2n) // COLS * COLS  # whole rows
    if args.ncu:
        for label, _, fn in cases(n):
            if not any(o in label for o in args.only):
                continue
            fn()
            torch.cuda.synchronize()
            print("ran", label, flush=True)
        return
    buffers = [torch.randn(n, device="cuda"), torch.empty(n, device="cuda")]
    copy = 8 * n / device_ms(lambda: buffers[1].copy_(buffers[0]), 20) / 1e6
    buffers.clear()
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s, n = 2^{args.log2n}", flush=True)
    if any(o in "tensor dequantize f32" for o in args.only):
        # PyTorch's op on the same bytes (int8 in, f32 out): the anchor of the per-tensor dequantize
        qt = torch.quantize_per_tensor(torch.randn(n, device="cuda"), 0.02, 3, torch.qint8)
        pct = 100 * 5 * n / device_ms(qt.dequantize, 20) / 1e6 / copy
        print(f"torch Tensor.dequantize (qint8 -> f32): {pct:5.1f}% of copy", flush=True)
        del qt
    shipped = shipped_variant()
    variants = [shipped] + {
        "channel": [shipped._replace(unroll=2, bounds=None, per_sm=4),
                    shipped._replace(unroll=4, bounds=(512, 2), per_sm=2),
                    shipped._replace(unroll=4, bounds=None, per_sm=4)],
        "unroll": [shipped._replace(unroll=u) for u in (4, 8)],
        "pow2": [shipped._replace(pow2=u, prefetch=0) for u in (0, 1, 2, 4, 8) if u != SHIPPED_POW2_UNROLL],
        # one chunk per thread in blocks that come and go (PyTorch's elementwise launch) to one resident wave
        "policy": [shipped._replace(unroll=u, policy=p, prefetch=0)
                   for u, p in ((2, (512, 32)), (1, (128, 4096)), (1, (64, 8192)), (2, (128, 1024)))],
        # L2 prefetches 1 or 2 grid strides ahead in the shift kernels, on the shipped grid and on one
        # resident wave (a stride small enough that what is prefetched stays in L2)
        # (prefetch -1: none, and the shift kernels without their launch_bounds)
        "prefetch": [shipped._replace(policy=p, prefetch=f) for p, f in (
            (None, 1), (None, 2), (None, -1), ((512, 4), 0), ((512, 4), 1), ((512, 4), 2), ((512, 4), 4))],
        # one resident wave of every kernel (a grid-stride loop, as the stationary kernel's grid)
        "persistent": [shipped._replace(unroll=2, policy=p, prefetch=0)
                       for p in ((512, 2), (512, 4), (1024, 2), (256, 8))],
        # the stationary kernel's launch bounds (512, blocks per SM, its one-wave grid) and input bytes in
        # flight per thread (chunks: max(2, bytes / chunk bytes)), every op on it
        "stationary": [shipped._replace(per_sm=p, in_flight=b, vector_ops=frozenset())
                       for p in (2, 3, 4) for b in (8, 16, 32)],
        # channel vectors for every op or none, in short blocks or on a resident grid
        # channel vectors for no op or every op (chunks of at most CHANNEL_VECTOR_MAX_CHUNK elements), in
        # short blocks or on a resident grid
        # the stationary kernel's grid over several waves of shorter-lived blocks (its threads reload their
        # parameters once per block), at its launch bounds' 2 and 3 blocks per SM
        "waves": [shipped._replace(waves=w, per_sm=p) for p in (2, 3) for w in (1, 2, 4, 8, 16)],
        # the resident grid-stride launch (512 threads, 32 blocks / SM cap) against caps of more, shorter-lived
        # blocks, and the short-block policy, for every elementwise entry
        "grid": [shipped._replace(policy=p) for p in ((512, 32), (512, 64), (512, 128), (256, 64), (256, 128),
                                                      (256, 256), (128, 1024))],
        "vectors": [shipped._replace(vector_ops=o, vector_policy=p) for o, p in (
            (frozenset(), shipped.vector_policy), (ALL_OPS, (128, 4096, 1)), (ALL_OPS, (128, 1024, 2)),
            (ALL_OPS, (128, 512, 4)), (ALL_OPS, (256, 1024, 2)), (ALL_OPS, (512, 32, 2)))],
    }[args.variants]
    baseline: dict[str, torch.Tensor] = {}
    table: dict[str, list[str]] = {}
    problems = [c for c in cases(n) if any(o in c[0] for o in args.only)]  # the same data for every variant
    for variant in variants:
        use_variant(variant)
        for label, per_element, fn in problems:
            out = fn()
            torch.cuda.synchronize()
            if label not in baseline:
                baseline[label] = out.clone()
                same = "base"
            else:
                same = "same" if torch.equal(baseline[label].view(torch.uint8), out.view(torch.uint8)) else "DIFFERS"
            del out
            ms = device_ms(fn, 20)
            pct = 100 * per_element * n / ms / 1e6 / copy
            table.setdefault(label, []).append(f"{pct:5.1f}% {same}")
            print(f"{variant.label()} {label:<34} {pct:5.1f}% of copy  {same}", flush=True)
    use_variant(shipped)
    print("\n| case | " + " | ".join(v.label() for v in variants) + " |")
    print("|---|" + "---|" * len(variants))
    for label, cells in table.items():
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
