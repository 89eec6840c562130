"""Packed int4 kernels on a GPU: every variant checked bit for bit against a torch CUDA reference, timed
next to the device-to-device copy of the same run. ``python benchmarks/tune_int4.py [--log2n 28]
[--api-only]``

Variants: chunks in flight per thread (``packed.UNROLL``) x launch policy (threads per block, blocks
per SM, one resident wave or many) for dequantize, next to the write-only
floor of its output (``zero_``); lanes per group (``packed.DYNAMIC_MAX_LANES``) x chunk slots per lane
x blocks per SM for the one-pass dynamic kernel; the elementwise fake-quantize per group through the
tracking kernel and the shift kernels at ``elementwise.POW2_UNROLL`` 1, 2, 4. ``--ptxas``: only the
registers per thread of every variant, compiled for sm_90 without a GPU. ``--sections`` picks the
sweeps, ``--only`` the public-API rows; ``--api-only`` times the public functions only (what an older
checkout has too: run it with that checkout on ``PYTHONPATH`` to time the old kernels on the same
machine).

Bytes counted: bf16 in + nibbles out (2.5 bytes per element) for quantize / dequantize / dynamic (plus
the scales and zero points the op writes or reads), 4 bytes per element for fake quantize (bf16 in and
out). Times: median of 15 samples, each the mean of 5 back-to-back calls between two device events
(the host's dispatch is hidden behind the previous call, as in a model's stream).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if "--ptxas" in sys.argv:  # compile for sm_90 without a GPU: the real CUDA target, not the simulator
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

import torch

import baracuda_numba as bn
from baracuda_numba.vocabulary import ElementKind as E
from baracuda_numba.vocabulary import MathPrecision as P

COLS = 4096
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run on the simulator
GROUP = 128


def device_ms(fn, samples: int = 15, inner: int = 5) -> float:
    if DEVICE == "cpu":  # a smoke run of the script on the simulator: one call, host time
        begin = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - begin)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / inner)
    return statistics.median(times)


def copy_gbs(n: int) -> float:
    buffers = [torch.randn(n, device=DEVICE), torch.empty(n, device=DEVICE)]
    gbs = 8 * n / device_ms(lambda: buffers[1].copy_(buffers[0])) / 1e6
    buffers.clear()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return gbs


def pack(v: torch.Tensor) -> torch.Tensor:
    v = v.to(torch.int32)
    return ((v[..., 0::2] & 0xF) | ((v[..., 1::2] & 0xF) << 4)).to(torch.uint8)


def unpack(q: torch.Tensor, signed: bool) -> torch.Tensor:
    q = q.to(torch.int32)
    v = torch.stack([q & 0xF, q >> 4], dim=-1).flatten(-2)
    return torch.where(v >= 8, v - 16, v) if signed else v


def by_group(t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return g.repeat_interleave(GROUP, dim=-1) if g.shape != t.shape else g


def quantize_ref(x, scales, zps, low, high, nan_to_zp=True):
    """``clamp(rint(x * (1 / s)) + zp, low, high)``, NaN -> zp (fake quantize: NaN kept): the README's
    rule, in torch float32."""
    inv = torch.where(scales != 0, 1.0 / scales, torch.zeros_like(scales))
    zp = torch.zeros_like(scales) if zps is None else zps.float()
    t = torch.round(x.float() * by_group(x, inv)) + by_group(x, zp)
    if nan_to_zp:
        t = torch.where(torch.isnan(t), by_group(x, zp), t)
    return t.clamp(low, high)


def dynamic_ref(x, symmetric: bool, low: int, high: int):
    """Per-group dynamic range (kernels/dynamic.py's rule) in torch float32: scales, zero points, values."""
    g = x.float().view(x.shape[0], -1, GROUP)
    finite = torch.isfinite(g)
    tiny = torch.finfo(torch.float32).tiny
    if symmetric:
        hi = torch.where(finite, g.abs(), torch.zeros_like(g)).amax(-1)
        # a tensor divisor: torch's CUDA division by a Python scalar multiplies by its reciprocal
        scale = torch.where(hi > 0, hi / torch.full_like(hi, high), torch.ones_like(hi))
        zp = torch.zeros_like(scale)
    else:
        hi = torch.where(finite, g, torch.zeros_like(g)).amax(-1).clamp(min=0)
        lo = torch.where(finite, g, torch.zeros_like(g)).amin(-1).clamp(max=0)
        span = hi - lo
        scale = torch.where(span > 0, span / torch.full_like(span, high - low), torch.ones_like(span))
    scale = scale.clamp(min=tiny)
    if not symmetric:
        zp = (low - torch.round(lo / scale)).clamp(low, high)
    return scale, zp, quantize_ref(x, scale, zp.to(torch.int32), low, high)


def problem(n: int):
    rows = n // COLS
    gen = torch.Generator(device=DEVICE).manual_seed(15)
    x = torch.randn(rows, COLS, device=DEVICE, generator=gen).to(torch.bfloat16)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    x[1, :GROUP] = 0  # a zero group
    scales = torch.rand(rows, COLS // GROUP, device=DEVICE, generator=gen) * 0.3 + 0.05
    zps = torch.randint(0, 16, (rows, COLS // GROUP), device=DEVICE, generator=gen, dtype=torch.int32)
    return x, scales, zps


def api_cases(x, scales, zps):
    """(label, bytes, call, expected) of the public functions, with their torch references."""
    n = x.numel()
    groups = n // GROUP
    nibbles = 2 * n + n // 2
    out = []
    for name, signed, zp in (("int4", True, None), ("uint4", False, zps)):
        low, high = (-8, 7) if signed else (0, 15)
        values = quantize_ref(x, scales, zp, low, high)
        want_q = pack(values)
        zpf = torch.zeros_like(scales) if zp is None else zp.float()
        want_d = ((values - by_group(x, zpf)) * by_group(x, scales)).to(torch.bfloat16)
        extra = groups * (8 if zp is not None else 4)
        out.append((f"quantize {name}", nibbles + extra,
                    lambda name=name, zp=zp: bn.quantize_per_group_packed(x, scales, zp, GROUP, dtype=name), want_q))
        out.append((f"dequantize {name}", nibbles + extra,
                    lambda name=name, zp=zp, q=want_q: bn.dequantize_per_group_packed(
                        q, scales, zp, GROUP, q_dtype=name, dtype=torch.bfloat16), want_d))
        sym = signed
        d_scale, d_zp, d_values = dynamic_ref(x, sym, -7 if signed else 0, 7 if signed else 15)
        out.append((f"dynamic {name}", nibbles + extra,
                    lambda name=name: bn.dynamic_range_quantize_packed(x, group_size=GROUP, dtype=name),
                    (pack(d_values), d_scale, None if sym else d_zp.to(torch.int32))))
        grid = quantize_ref(x, scales, zp, low, high, nan_to_zp=False)
        fq = ((grid - by_group(x, zpf)) * by_group(x, scales)).to(torch.bfloat16)
        out.append((f"fake_quantize {name}", 4 * n + extra,
                    lambda name=name, zp=zp: bn.fake_quantize_per_group(x, scales, zp, GROUP, dtype=name), fq))
    return out


def same(got, want) -> bool:
    if isinstance(want, tuple):  # dynamic: (q, scale, zero_point)
        q, scale, zp = want
        ok = torch.equal(got.q, q) and torch.equal(got.scale.view(scale.shape), scale)
        return ok and (zp is None or torch.equal(got.zero_point.view(zp.shape), zp))
    if want.is_floating_point():  # NaN compared by class: torch writes bf16 NaN as 0x7FC0, the codec keeps the
        nan = torch.isnan(want)  # payload's top bits of the GPU's canonical NaN (0x7FFF)
        return torch.equal(nan, torch.isnan(got)) and torch.equal(got[~nan].view(torch.uint8),
                                                                   want[~nan].view(torch.uint8))
    return torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def regs() -> dict[str, int]:
    """Registers per thread of the kernels the sweep kept."""
    out = {}
    for kernel in _compiled:
        get = getattr(kernel.compiled(), "get_regs_per_thread", None)
        if get is None:  # the simulator
            continue
        r = get()
        out[kernel.py_func.__name__] = r if isinstance(r, int) else max(r.values())
    return out


_compiled: list = []
_POW2 = None  # the shipped ElementwisePlan._pow2_segments, set in main


def run(label: str, nbytes: int, fn, want, copy: float, rows: list, inner: int = 5) -> None:
    got = fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    ok = "same" if same(got, want) else "DIFFERS"
    del got
    ms = device_ms(fn, inner=inner)
    gbs = nbytes / ms / 1e6
    rows.append((label, gbs, 100 * gbs / copy, ok))
    print(f"{label:<58} {gbs:7.0f} GB/s {100 * gbs / copy:6.1f}% of copy  {ok}", flush=True)


def tune(x, scales, zps, copy: float, rows: list, sections: tuple[str, ...]) -> None:
    from baracuda_numba import registry
    from baracuda_numba.kernels import elementwise, packed
    from baracuda_numba.plans import base

    cases = {label: (b, fn, want) for label, b, fn, want in api_cases(x, scales, zps)}
    entries = [e for e in registry.entries() if isinstance(e, registry.PackedEntry)]

    def policy(threads: int, bps: int, name: str = "", one_wave: bool = True) -> None:
        """The launch policy of the packed entries whose kernel name starts with ``name`` (chunks in flight:
        the module's ``packed.UNROLL``)."""
        for e in entries:
            if e.kernel_name.startswith(name):
                object.__setattr__(e, "policy", registry.LaunchPolicy(threads, bps, 0, one_wave))

    def reset() -> None:
        packed.quantize_kernel.cache_clear()
        packed.dequantize_kernel.cache_clear()
        packed.dynamic_kernel.cache_clear()
        bn.clear_plan_cache()

    shipped = {e.key: e.policy for e in entries}

    def restore() -> None:
        for e in entries:
            object.__setattr__(e, "policy", shipped[e.key])

    if "dequantize" in sections:
        # the write-only floor of this op's output (bf16, 2 bytes per element), timed as the copy is
        out = torch.empty(x.numel(), dtype=torch.bfloat16, device=DEVICE)
        ms = device_ms(lambda: out.zero_())
        rows.append(("bf16 output alone: zero_() (2 bytes per element written)", 2 * x.numel() / ms / 1e6,
                     100 * 2 * x.numel() / ms / 1e6 / copy, "-"))
        print(f"zero_ of the bf16 output: {rows[-1][2]:.1f}% of copy", flush=True)
        del out
        # chunks in flight per thread x grid: one resident wave of policy blocks per SM (shipped), or blocks
        # that come and go (waves: the grid capped at bps blocks per SM, not at what one SM holds)
        shipped_unroll = packed.UNROLL
        sweep = ((4, 256, 4, False), (1, 128, 1024, True), (2, 128, 1024, True), (4, 128, 1024, True),
                 (1, 256, 1024, True), (2, 256, 32, True), (4, 512, 32, True))
        for unroll, threads, bps, waves in sweep + sweep[::-1]:  # twice, in both orders: the spread shows
            packed.UNROLL = unroll
            reset()
            policy(threads, bps, "dequantize", not waves)
            bn.clear_plan_cache()
            for label in ("dequantize int4", "dequantize uint4"):
                run(f"{label} unroll {unroll} threads {threads} bps<={bps}{' waves' if waves else ''}",
                    *cases[label], copy, rows)
            _compiled.append(packed.dequantize_kernel(E.BF16, E.S4, P.F32))
        packed.UNROLL = shipped_unroll
        restore()
        reset()
    if "dynamic" not in sections:
        return
    # one-pass dynamic: lanes per group (chunks per lane = 16 / lanes for g128 bf16) x chunk slots x grid
    shipped_lanes, shipped_slots = packed.DYNAMIC_MAX_LANES, packed.DYNAMIC_SLOTS
    for max_lanes in (16, 8, 4):
        for slots in (4, 8):
            if slots < 16 // max_lanes:
                continue
            packed.DYNAMIC_MAX_LANES, packed.DYNAMIC_SLOTS = max_lanes, slots
            reset()
            for bps in (4, 8):
                policy(registry.PACKED_POLICY.threads_per_block, bps, "dynamic")
                bn.clear_plan_cache()
                for label in ("dynamic int4", "dynamic uint4"):
                    run(f"{label} lanes {max_lanes} slots {slots} bps<={bps}", *cases[label], copy, rows)
            _compiled.append(packed.dynamic_kernel(E.BF16, E.S4, P.F32, True, 16 // max_lanes,
                                                   fixed_lanes=max_lanes))
    packed.DYNAMIC_MAX_LANES, packed.DYNAMIC_SLOTS = shipped_lanes, shipped_slots
    restore()
    reset()
    if "fake" not in sections:
        return
    # fake quantize: the elementwise kernel; groups of 128 are a power of two chunks (segment by shift)
    shipped_pow2 = elementwise.POW2_UNROLL
    for pow2_unroll in (0, 1, 2, 4):
        elementwise.POW2_UNROLL = pow2_unroll or shipped_pow2
        base.ElementwisePlan._pow2_segments = (lambda self: False) if pow2_unroll == 0 else _POW2
        elementwise.elementwise_kernel.cache_clear()
        bn.clear_plan_cache()
        for label in ("fake_quantize int4", "fake_quantize uint4"):
            run(f"{label} (elementwise) pow2 unroll {pow2_unroll} (0: tracked)", *cases[label], copy, rows)
    elementwise.POW2_UNROLL = shipped_pow2
    base.ElementwisePlan._pow2_segments = _POW2
    elementwise.elementwise_kernel.cache_clear()
    bn.clear_plan_cache()


def ptxas_registers() -> None:
    """Registers per thread of every packed kernel variant, compiled for sm_90 here (no GPU needed:
    NVVM, then ``ptxas -v`` from PATH; the PTX version line is lowered to what that ptxas reads)."""
    import re
    import subprocess
    import tempfile

    from numba import cuda
    from numba.cuda.cudadrv import nvrtc

    from baracuda_numba.kernels import packed

    try:
        nvrtc.get_arch_option(9, 0)
    except Exception:  # no NVRTC library: NVVM alone compiles, it only needs the arch name
        nvrtc.get_arch_option = lambda major, minor: f"compute_{major}{minor}"
    def assemble(ptx: str) -> str:
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(ptx)
            f.flush()
            return subprocess.run(["ptxas", "-arch=sm_90", "-v", f.name, "-o", os.devnull], capture_output=True,
                                  text=True).stderr

    def registers(kernel) -> str:
        ptx, _ = cuda.compile_ptx(kernel.py_func, kernel.signature, cc=(9, 0))
        log = assemble(ptx)
        older = re.search(r"current version is '([\d.]+)'", log)
        if older:  # NVVM newer than this ptxas: the kernels use nothing the older PTX version lacks
            log = assemble(re.sub(r"^\.version [\d.]+", f".version {older.group(1)}", ptx, flags=re.M))
        found = re.search(r"Used (\d+) registers", log)
        return found.group(1) if found else log.strip()[-200:]

    for unroll in (2, 4, 8):
        for p in (E.S4, E.U4):
            for builder in (packed.quantize_kernel, packed.dequantize_kernel):
                k = builder(E.BF16, p, P.F32, unroll)
                print(f"registers {k.py_func.__name__}: {registers(k)}", flush=True)
    for slots in (2, 4, 8):
        for symmetric, p in ((True, E.S4), (False, E.U4)):
            for per_lane in (1, 2, 8):
                k = packed.dynamic_kernel(E.BF16, p, P.F32, symmetric, per_lane, slots, 256)
                print(f"registers {k.py_func.__name__}: {registers(k)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log2n", type=int, default=28)
    parser.add_argument("--api-only", action="store_true")
    parser.add_argument("--sections", nargs="+", default=["dequantize", "dynamic", "fake"],
                        help="which sweeps to run: dequantize, dynamic, fake")
    parser.add_argument("--only", default="", help="public-API rows: only the labels containing this")
    parser.add_argument("--ptxas", action="store_true", help="only print the sm_90 register counts (no GPU)")
    args = parser.parse_args()
    if args.ptxas:
        ptxas_registers()
        return
    n = 1 << args.log2n
    copy = copy_gbs(n)
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (simulator smoke run)"
    print(f"{device}: copy {copy:.0f} GB/s, n = 2^{args.log2n} bf16, group {GROUP}, "
          f"package {bn.__file__}", flush=True)
    x, scales, zps = problem(n)
    rows: list = []
    for label, nbytes, fn, want in api_cases(x, scales, zps):
        if args.only not in label:
            continue
        run(f"{label} (public API, defaults)", nbytes, fn, want, copy, rows)
        # bench.py's timing: one call between the events, the host's dispatch inside the window
        run(f"{label} (public API, one call per sample)", nbytes, fn, want, copy, rows, inner=1)
    if not args.api_only:
        global _POW2
        from baracuda_numba.plans import base

        _POW2 = base.ElementwisePlan._pow2_segments
        tune(x, scales, zps, copy, rows, tuple(args.sections))
        for name, r in regs().items():
            print(f"registers {name}: {r}")
    copy_end = copy_gbs(n)
    print(f"copy at the end: {copy_end:.0f} GB/s")
    print("\n| case | GB/s | % of copy | bits |\n|---|---:|---:|---|")
    for label, gbs, pct, ok in rows:
        print(f"| {label} | {gbs:.0f} | {pct:.1f}% | {ok} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
