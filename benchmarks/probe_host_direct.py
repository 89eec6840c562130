"""The W8A8 linear's host time before and after session 30's changes, on the GPU:
``python3 -m benchmarks.probe_host_direct [null-driver.so]``.

Two modes, interleaved round after round so that a slow stretch of the host shows in both:

- ``before``: ``QuantizedLinearPlan``'s generic fast path (``fast_pointers`` over field specs, then
  ``_launch_found``) and every launch frame on the heap (``make_record_launch(stack_words=0)``);
- ``after``: the flattened two-launch path (``QuantizedLinearPlan._build_direct``) and launch frames on the stack
  (as shipped).

With a null driver (a shared library whose ``launch`` / ``launch_ex`` / ``get_device`` return 0 at once, the
signatures of ``cuLaunchKernel`` / ``cuLaunchKernelEx`` / ``cuCtxGetDevice``), each case also runs with no driver
work: the host's own share of the call. Outputs are checked against the checked path before timing.
"""

from __future__ import annotations

import ctypes
import statistics
import sys

import torch

import baracuda_numba as bn
from baracuda_numba import launch
from baracuda_numba.bench import host_us
from baracuda_numba.ops import common

from .probe_launch_handle import linear_problems

ROUNDS = 7


class _Drivers:
    """The real driver's compiled launches, heap-framed twins of them, and (given a null driver) both again over
    the null entry points."""

    def __init__(self, null_path: str | None) -> None:
        self.driver = launch._driver()
        libcuda = ctypes.CDLL("libcuda.so.1")
        real = (launch._entry_point(libcuda, "cuLaunchKernel", launch._LAUNCH_KERNEL),
                launch._entry_point(libcuda, "cuLaunchKernelEx", launch._LAUNCH_KERNEL_EX),
                launch._entry_point(libcuda, "cuCtxGetDevice", launch._CTX_GET_DEVICE))
        sources = {"": real}
        if null_path:
            null = ctypes.CDLL(null_path)
            kinds = ((launch._LAUNCH_KERNEL, "launch"), (launch._LAUNCH_KERNEL_EX, "launch_ex"),
                     (launch._CTX_GET_DEVICE, "get_device"))
            sources[", null driver"] = tuple(kind(ctypes.cast(getattr(null, name), ctypes.c_void_p).value)
                                             for kind, name in kinds)
        self.modes = {}
        for suffix, entry_points in sources.items():
            for mode, stack_words in (("before", 0), ("after", launch._STACK_FRAME_WORDS)):
                record = launch.make_record_launch(*entry_points, stack_words=stack_words)
                self.modes[mode + suffix] = (mode == "after", record, launch.make_pair_launch(record))

    def install(self, mode: str, plans: list) -> None:
        direct, self.driver.launch_record, self.driver.launch_pair = self.modes[mode]
        for plan in plans:
            plan._direct_built, plan._direct = (False, None) if direct else (True, None)


def main() -> None:
    null_path = sys.argv[1] if len(sys.argv) > 1 else None
    print("device:", torch.cuda.get_device_name(0), "null driver:", null_path, flush=True)
    linear = linear_problems()
    x = torch.randn(4096, device="cuda")
    q = torch.empty(4096, device="cuda", dtype=torch.int8)
    per_tensor = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(4096, -128, 127, "f32", "s8"))
    per_tensor_args = bn.QuantizePerTensorArgs(x, 0.02, 3, q)
    drivers = _Drivers(null_path)
    expected = bn.quantized_linear(linear.x16, linear.w, linear.ws)
    expected1 = bn.quantized_linear(linear.x1, linear.w, linear.ws)
    plans = [linear.linear16, linear.linear1]
    for mode in drivers.modes:
        if "null" in mode:
            continue
        drivers.install(mode, plans)
        linear.out16.zero_()
        linear.out1.zero_()
        linear.linear16.run(linear.args16, linear.workspace16)
        linear.linear1.run(linear.args1, linear.workspace1)
        got = bn.quantized_linear(linear.x16, linear.w, linear.ws)
        got1 = bn.quantized_linear(linear.x1, linear.w, linear.ws)
        torch.cuda.synchronize()
        print(f"{mode}: Plan.run equals quantized_linear {torch.equal(linear.out16, expected)} / "
              f"{torch.equal(linear.out1, expected1)} (16 / 1 tokens), quantized_linear equals its first call "
              f"{torch.equal(got, expected)} / {torch.equal(got1, expected1)}, direct paths built "
              f"{linear.linear16._direct is not None} / {linear.linear1._direct is not None}", flush=True)
        plans += [found[0] for found in common._FAST_PLANS.values() if isinstance(found[0], bn.QuantizedLinearPlan)]
    w16 = linear.w.to(torch.bfloat16)
    cases = []
    for mode in drivers.modes:
        cases += [
            (f"QuantizedLinearPlan.run 16 x 4096 @ 4096^2 (two launches), {mode}", mode,
             lambda: linear.linear16.run(linear.args16, linear.workspace16)),
            (f"quantized_linear() 16 x 4096 @ 4096^2, {mode}", mode,
             lambda: bn.quantized_linear(linear.x16, linear.w, linear.ws)),
            (f"QuantizedLinearPlan.run 1 x 4096 @ 4096^2 (fused), {mode}", mode,
             lambda: linear.linear1.run(linear.args1, linear.workspace1)),
            (f"quantized_linear() 1 x 4096 @ 4096^2, {mode}", mode,
             lambda: bn.quantized_linear(linear.x1, linear.w, linear.ws)),
            (f"QuantizePerTensorPlan.run 4096 f32, {mode}", mode, lambda: per_tensor.run(per_tensor_args)),
        ]
    cases += [("F.linear 16 x 4096 @ 4096^2 bf16", None, lambda: torch.nn.functional.linear(linear.x16, w16)),
              ("torch.quantize_per_tensor 4096 f32", None, lambda: torch.quantize_per_tensor(x, 0.02, 3, torch.qint8))]
    rows: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for label, mode, fn in cases:
            drivers.install(mode or "after", plans)
            rows.setdefault(label, []).append(host_us(fn, calls=1000))
    drivers.install("after", plans)
    for label, values in rows.items():
        print(f"{label}: best {min(values):.2f} us, median {statistics.median(values):.2f} "
              f"(rounds {' / '.join(f'{v:.2f}' for v in values)})", flush=True)


if __name__ == "__main__":
    main()
