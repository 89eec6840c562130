"""Dynamic-range quantize on a GPU: launch-shape variants of :data:`baracuda_numba.plans.dynamic.TUNING`
next to the kernels of another checkout (``--old-root``, run in a subprocess), the device copy of the
same run and ``torch.compile`` of the PyTorch compositions.

Every variant is checked bit for bit: the sha256 of ``(q, scale, zero_point)`` of each case must equal
the other checkout's (the kernels on main) and every other variant's; the token and tensor scales are
also checked against the torch composition (true division by ``q_max``), and ``q`` against the static
quantize of the returned scales. Times: device events, median of ``--repeats``. Registers: the
compiled kernels' ``get_regs_per_thread()``.

    python benchmarks/tune_dynamic.py --old-root ../.. --json $OUT/tune.json

``--smoke`` runs the same code on the CPU (Numba's simulator, torch CPU tensors, small f32 shapes, host
timers, no torch.compile): a check of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import baracuda_numba as bn
from baracuda_numba.kernels import dynamic as kernels_dynamic
from baracuda_numba.plans import dynamic as plans_dynamic

SMOKE = "--smoke" in sys.argv
DEVICE = "cpu" if SMOKE else "cuda"
SHAPE = (8, 64) if SMOKE else (65536, 4096)
INPUT = torch.float32 if SMOKE else torch.bfloat16  # the simulator has no bf16

TIMED = {  # case -> keyword arguments of dynamic_range_quantize, on the [65536, 4096] bf16 input
    "token": {},
    "token_asym": dict(mode="asymmetric"),
    "group128": dict(scope="group", group_size=128),
    "tensor": dict(scope="tensor"),
    "channel0": dict(scope="channel", axis=1),
    "channel0_asym": dict(scope="channel", axis=1, mode="asymmetric"),
    "token_e4m3": dict(dtype=torch.float8_e4m3fn),
}
if SMOKE:
    TIMED["group128"] = dict(scope="group", group_size=16)
CHECKED = {  # extra shapes checked bit for bit, not timed: odd sizes, element paths, other dtypes
    "odd_token": ((999, 4104), torch.bfloat16, {}),
    "odd_token_asym_u8": ((999, 4104), torch.bfloat16, dict(mode="asymmetric", dtype="uint8")),
    "odd_group8": ((999, 4104), torch.bfloat16, dict(scope="group", group_size=8)),
    "odd_tensor": ((999, 4103), torch.bfloat16, dict(scope="tensor")),
    "odd_channel": ((999, 4104), torch.bfloat16, dict(scope="channel", axis=1, mode="asymmetric")),
    "odd_channel_elem": ((999, 4103), torch.bfloat16, dict(scope="channel", axis=1)),
    "inner_channel": ((37, 100, 24), torch.bfloat16, dict(scope="channel", axis=1)),
    "long_rows": ((64, 100_000), torch.bfloat16, {}),
    "f32_token": ((2048, 4096), torch.float32, {}),
    "f16_group32": ((2048, 4096), torch.float16, dict(scope="group", group_size=32, mode="asymmetric")),
    "f32_tensor_e4m3": ((2048, 4096), torch.float32, dict(scope="tensor", dtype=torch.float8_e4m3fn)),
}
if SMOKE:  # the same paths at simulator sizes
    CHECKED = {"odd_token": ((5, 48), torch.float32, {}),
               "odd_tensor": ((5, 47), torch.float32, dict(scope="tensor")),
               "odd_channel": ((5, 48), torch.float16, dict(scope="channel", axis=1, mode="asymmetric")),
               "odd_channel_elem": ((5, 47), torch.float32, dict(scope="channel", axis=1)),
               "inner_channel": ((3, 5, 8), torch.float32, dict(scope="channel", axis=1)),
               "long_rows": ((2, 1000), torch.float32, {})}
VARIANTS = {  # name -> TUNING fields (the rest default); staged last: the riskiest kernel runs after the rest
    "default": {},
    "res k2 t256": dict(resident_keep=2, resident_threads=256),
    "res k8 t128": dict(resident_keep=8, resident_threads=128),
    "res k2 t256 lb5": dict(resident_keep=2, resident_threads=256, resident_min_blocks=5),
    "res k4 t128 lb10": dict(resident_keep=4, resident_threads=128, resident_min_blocks=10),
    # the resident grid's cap: at 72 registers 7 blocks of 128 threads fit an SM, so 7 / SM is one wave
    # with no tail (32 / SM makes 4.6 waves, by ncu)
    "res 7/SM": dict(resident_blocks_per_sm=7),
    "res 14/SM": dict(resident_blocks_per_sm=14),
    "res 21/SM": dict(resident_blocks_per_sm=21),
    "tensor 2/8": dict(tensor_partial_blocks_per_sm=2, tensor_quantize_blocks_per_sm=8),
    "tensor 8/8": dict(tensor_partial_blocks_per_sm=8, tensor_quantize_blocks_per_sm=8),
    "tensor 4/16": dict(tensor_partial_blocks_per_sm=4, tensor_quantize_blocks_per_sm=16),
    "tensor 4/4": dict(tensor_partial_blocks_per_sm=4, tensor_quantize_blocks_per_sm=4),
    "columns 1024/SM": dict(column_threads_per_sm=1024),
    "columns 4096/SM": dict(column_threads_per_sm=4096),
    "stg k2 t256 4/SM": dict(resident_keep=2, resident_threads=256, resident_staged=True, resident_blocks_per_sm=4),
    "stg k2 t256 lb4": dict(resident_keep=2, resident_threads=256, resident_staged=True, resident_blocks_per_sm=4,
                            resident_min_blocks=4),
    "stg k4 t128 lb8": dict(resident_keep=4, resident_threads=128, resident_staged=True, resident_blocks_per_sm=8,
                            resident_min_blocks=8),
    "stg k1 t512 lb2": dict(resident_keep=1, resident_threads=512, resident_staged=True, resident_blocks_per_sm=2,
                            resident_min_blocks=2),
}
# the resident grid's cap, its stores (streaming past L2 as shipped) and its next-row prefetch
VARIANTS.update({
    "plain 32/SM": dict(resident_blocks_per_sm=32, segment_streaming_stores=False),  # with "no prefetch" below
    "32/SM": dict(resident_blocks_per_sm=32),
    "64/SM": dict(resident_blocks_per_sm=64),
    "96/SM": dict(resident_blocks_per_sm=96),
    "192/SM": dict(resident_blocks_per_sm=192),
    "512/SM": dict(resident_blocks_per_sm=512),
    "cached stores": dict(segment_streaming_stores=False),
    "lb8": dict(resident_min_blocks=8),  # 64 registers (12 bytes spilled, ptxas 13) against 72: 8 blocks / SM
})
# variants that set module constants of kernels.dynamic instead (its kernels rebuilt under them); they may
# also set TUNING fields above
MODULE_VARIANTS = {"tensor cached stores": {"TENSOR_STREAMING_STORES": False},
                   "load hint": {"LOAD_HINT": True},
                   "plain 32/SM": {"RESIDENT_PREFETCH_ROWS": 0},
                   "no prefetch": {"RESIDENT_PREFETCH_ROWS": 0},
                   "prefetch 2": {"RESIDENT_PREFETCH_ROWS": 2}}
for name in MODULE_VARIANTS:
    VARIANTS.setdefault(name, {})
SEGMENT_CASES = ("token", "token_asym", "group128", "token_e4m3")
FAMILY_CASES = {"res": SEGMENT_CASES, "stg": SEGMENT_CASES, "plain": SEGMENT_CASES, "cached": SEGMENT_CASES,
                "lb8": SEGMENT_CASES, "no": SEGMENT_CASES, "prefetch": SEGMENT_CASES, "tensor": ("tensor",),
                "columns": ("channel0", "channel0_asym")}  # what each variant family changes


def family_cases(name: str) -> tuple:
    """The timed cases variant ``name`` changes (the segment cases for a bare grid cap, ``"64/SM"``)."""
    return FAMILY_CASES.get(name.split()[0], SEGMENT_CASES if name.endswith("/SM") else tuple(TIMED))


# variants that also run the CHECKED shapes
CHECKED_IN = ("default", "res k2 t256", "res k8 t128", "stg k2 t256 lb4",
              "res 7/SM", "res 14/SM", "res 21/SM", "no prefetch", "cached stores")


def special_input(shape, dtype, seed: int) -> torch.Tensor:
    """Normal data with an all-zero row and column, NaN, +-inf and a 1e-3-scaled row (same bits in every process)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(shape, device=DEVICE, generator=g).to(dtype)
    flat = x.view(-1, shape[-1])
    rows, cols = flat.shape
    flat[1 % rows].zero_()
    flat[:, 2 % cols].zero_()
    flat[3 % rows, 5 % cols], flat[4 % rows, 7 % cols] = float("nan"), float("inf")
    flat[5 % rows, 9 % cols] = float("-inf")
    flat[6 % rows] *= 1e-3
    return x


def digest(result) -> str:
    h = hashlib.sha256()
    for t in (result.q, result.scale, result.zero_point):
        if isinstance(t, torch.Tensor):
            h.update(t.reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes())
        else:
            h.update(repr(t).encode())
    return h.hexdigest()[:16]


def device_ms(fn, repeats: int) -> float:
    """Median milliseconds of ``fn``: device events on the GPU, the host clock in ``--smoke``."""
    if not SMOKE:
        from baracuda_numba.bench import device_ms as events_ms

        return events_ms(fn, repeats)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def copy_gbs() -> float:
    count = 1 << (16 if SMOKE else 28)
    buffers = [torch.randn(count, device=DEVICE), torch.empty(count, device=DEVICE)]
    gbs = 8 * count / device_ms(lambda: buffers[1].copy_(buffers[0]), 10) / 1e6
    buffers.clear()
    return gbs


def run_cases(x: torch.Tensor, repeats: int, only: tuple = tuple(TIMED), checked: bool = True) -> dict:
    """``case -> {digest, ms}`` for the timed cases ``only`` and (``checked``) the checked shapes."""
    out = {}
    for case in only:
        kwargs = TIMED[case]
        out[case] = {"digest": digest(bn.dynamic_range_quantize(x, **kwargs))}
        out[case]["ms"] = device_ms(lambda kwargs=kwargs: bn.dynamic_range_quantize(x, **kwargs), repeats)
    for case, (shape, dtype, kwargs) in (CHECKED.items() if checked else ()):
        out[case] = {"digest": digest(bn.dynamic_range_quantize(special_input(shape, dtype, 7), **kwargs))}
    return out


def registers(kernel_sets) -> dict:
    """Registers per thread of every compiled kernel of ``kernel_sets`` (kernel name -> count)."""
    regs = {}
    for kernels in kernel_sets:
        for f in dataclasses.fields(kernels):
            kernel = getattr(kernels, f.name)
            dispatcher = getattr(kernel, "_compiled", {}).get("dispatcher")
            if dispatcher is not None and hasattr(dispatcher, "overloads"):  # the simulator has none
                for overload in dispatcher.overloads.values():
                    regs[kernel.py_func.__name__] = overload.regs_per_thread
    return regs


def checks_against_torch(x: torch.Tensor) -> list[str]:
    """Independent checks: scales against the torch composition, q against the static quantize."""
    failures = []
    r = bn.dynamic_range_quantize(x)
    finite = torch.where(x.isfinite(), x, torch.zeros((), dtype=x.dtype, device=x.device)).float()
    amax = finite.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / torch.tensor(127.0, device=DEVICE), torch.ones((), device=DEVICE))
    if not torch.equal(r.scale, scale):
        failures.append("token scale != torch amax / 127")
    if not torch.equal(r.q, bn.quantize_per_token(x, r.scale, torch.zeros_like(r.scale, dtype=torch.int32),
                                                  dtype="int8", q_min=-127, q_max=127)):
        failures.append("token q != quantize_per_token(x, scale)")
    t = bn.dynamic_range_quantize(x, scope="tensor")
    if not torch.equal(t.scale.reshape(()), finite.abs().amax() / torch.tensor(127.0, device=DEVICE)):
        failures.append("tensor scale != torch amax / 127")
    if not torch.equal(t.q, bn.quantize_per_tensor(x, float(t.scale), 0, dtype="int8", q_min=-127, q_max=127)):
        failures.append("tensor q != quantize_per_tensor(x, scale)")
    c = bn.dynamic_range_quantize(x, scope="channel", axis=1, mode="asymmetric")
    if not torch.equal(c.q, bn.quantize_per_channel(x, c.scale, c.zero_point, 1, dtype="int8", q_min=-128,
                                                    q_max=127)):
        failures.append("channel q != quantize_per_channel(x, scale, zero_point)")
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-root", help="another checkout whose kernels run in a subprocess for comparison")
    parser.add_argument("--emit", help="(subprocess mode) write this checkout's digests and times to this file")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--variants", default="", help="comma-separated subset of the variant names")
    parser.add_argument("--smoke", action="store_true", help="check this script on the CPU (see the docstring)")
    args = parser.parse_args()
    x = special_input(SHAPE, INPUT, 0)
    if args.emit:
        result = {"copy_gbs": copy_gbs(), "cases": run_cases(x, args.repeats), "package": bn.__file__}
        with open(args.emit, "w") as f:
            json.dump(result, f)
        return
    nbytes = 3 * x.numel()
    report: dict = {"device": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(), "shape": list(x.shape),
                    "variants": {}}
    copy = report["copy_gbs"] = copy_gbs()
    print(f"device {report['device']}; copy {copy:.0f} GB/s; % of copy on 3n bytes (bf16 in, int8 out)"
          " unless marked 5n", flush=True)
    old = None
    if args.old_root:
        path = f"/tmp/tune_dynamic_old_{os.getpid()}.json"
        # The other checkout first: this checkout's root is usually on PYTHONPATH too, and whichever
        # comes first is imported (else this checkout would be compared with itself).
        here = os.path.abspath(os.path.dirname(os.path.dirname(__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.abspath(args.old_root)]
            + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
               if p and "stage" not in p and os.path.abspath(p) != here]))
        subprocess.run([sys.executable, __file__, "--emit", path, "--repeats", str(args.repeats)]
                       + (["--smoke"] if SMOKE else []), env=env,
                       check=True, cwd=os.path.abspath(args.old_root))
        with open(path) as f:
            old = report["old"] = json.load(f)
        print(f"old checkout {old.get('package')} (copy {old['copy_gbs']:.0f} GB/s in its process):", flush=True)
        print("  " + "  ".join(f"{c} {100 * nbytes / v['ms'] / 1e6 / copy:.1f}%" for c, v in old["cases"].items()
                               if "ms" in v), flush=True)
    # torch.compile of the bench's compositions
    from baracuda_numba.bench import torch_dynamic_tensor as torch_tensor
    from baracuda_numba.bench import torch_dynamic_token as torch_token

    if not SMOKE:
        xs = torch.randn(65536, 4096, device="cuda", dtype=torch.bfloat16)  # finite: the composition is not NaN-safe
        compiled = {"token": torch.compile(torch_token), "tensor": torch.compile(torch_tensor)}
        report["torch_compile_ms"] = {k: device_ms(lambda fn=fn: fn(xs), args.repeats) for k, fn in compiled.items()}
        ours_same_input = {"token": device_ms(lambda: bn.dynamic_range_quantize(xs), args.repeats),
                           "tensor": device_ms(lambda: bn.dynamic_range_quantize(xs, scope="tensor"), args.repeats)}
        xs = None  # free the 512 MiB
        print("torch.compile: " + "  ".join(f"{k} {v * 1e3:.1f} us" for k, v in report["torch_compile_ms"].items()),
              flush=True)
        report["ours_vs_compile_ms"] = ours_same_input
        for k, v in ours_same_input.items():
            tc = report["torch_compile_ms"][k]
            print(f"{k}: ours {v * 1e3:.1f} us, torch.compile {tc * 1e3:.1f} us: {tc / v:.2f}x (finite input, default"
                  " tuning)", flush=True)
    failures = checks_against_torch(x)
    if failures:
        print("FAILED against torch: " + "; ".join(failures), flush=True)
    report["torch_check_failures"] = failures
    names = [n for n in VARIANTS if not args.variants or n in args.variants.split(",")]
    reference: dict = {}
    entry = next(e for e in bn.registry.entries() if isinstance(e, bn.registry.DynamicRangeEntry)
                 and e.input_element is bn.ElementKind.BF16 and e.output_element is bn.ElementKind.S8)
    for name in names:
        plans_dynamic.TUNING = dataclasses.replace(plans_dynamic.DynamicTuning(), **VARIANTS[name])
        knobs = MODULE_VARIANTS.get(name, {})
        shipped_knobs = {knob: getattr(kernels_dynamic, knob) for knob in knobs}
        for knob, value in knobs.items():
            setattr(kernels_dynamic, knob, value)
        kernels_dynamic.dynamic_kernels.cache_clear()
        bn.clear_plan_cache()
        cases = run_cases(x, args.repeats, family_cases(name), name in CHECKED_IN)
        digests = {c: v["digest"] for c, v in cases.items()}
        mismatch = [c for c in digests if (c in reference and reference[c] != digests[c])
                    or (old and old["cases"][c]["digest"] != digests[c])]
        reference = {**digests, **reference}
        tuning = plans_dynamic.TUNING
        regs = registers([entry.kernels(sym, *options) for sym in (True, False) for options in (
            (), (tuning.resident_keep, tuning.resident_threads, tuning.resident_min_blocks))])
        row = {"cases": cases, "mismatch": mismatch, "registers": regs}
        report["variants"][name] = row
        pct = "  ".join(f"{c} {100 * nbytes / v['ms'] / 1e6 / copy:.1f}%" + (
            f" ({100 * 5 * x.numel() / v['ms'] / 1e6 / copy:.1f}% 5n)" if c == "tensor" else "")
            for c, v in cases.items() if "ms" in v)
        reg_text = " ".join(f"{k.split('_')[1]}{'/a' if '_asym_' in k else ''}={v}" for k, v in sorted(regs.items())
                            if "_bf16_s8_" in k)
        print(f"{name:18s} {pct}  {'BITS OK' if not mismatch else 'MISMATCH ' + ','.join(mismatch)}  regs {reg_text}",
              flush=True)
        for knob, value in shipped_knobs.items():
            setattr(kernels_dynamic, knob, value)
        if args.json:  # after every variant: a later crash keeps what was measured
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    plans_dynamic.TUNING = plans_dynamic.DynamicTuning()
    bn.clear_plan_cache()
    if old:
        differ = [c for c, v in old["cases"].items() if c in reference and reference[c] != v["digest"]]
        report["differs_from_old"] = differ
        print("bits against the old checkout: " + ("ALL SAME" if not differ else "DIFFER " + ",".join(differ)),
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
