"""Fingerprints of the generated PTX, per kernel family, compiled for sm_90 (sm_90a for the warpgroup kernel)
without a GPU. Needs NVVM (the cu12 / cu13 extra), not a driver:

    NUMBA_ENABLE_CUDASIM=0 python -m benchmarks.ptx_fingerprint [--families linear ...] [--full] [--dump DIR]

Two checkouts with the same fingerprint for a family generate the same device code for it, so a host-side
change or a refactoring can be shown not to touch kernels that passed on the GPU. Kernel names (and the mangled
names numba derives from their module) and numba's shared-array numbering are normalised away: the bodies are
compared. The W8A8 family's kernels are the configurations :func:`~baracuda_numba.plans.linear.choose` picks on an
H100 (with and without sm_90a, and with 114 and 66 SMs) over a grid of shapes, dtypes and flags; by default one
configuration per kernel body (the output element, bias and row scale varied on one body per kind), ``--full``
every one (hours of compiling). The memory-bound families' kernels are compiled with a card's tuning value
(``--tuning``, by default the H100's; ``plans/tuning.py``): the registry's default kernels (``elementwise``,
``dynamic``, ...) and, in the ``*_plans`` and ``packed`` families, the kernels the plans pick besides (shift,
thread-stationary and channel-vector kernels, the dynamic plans' resident / wide / fixed segment kernels, the
packed 4-bit kernels). ``--dump DIR`` writes each kernel's normalised PTX there, named by the kernel, for a diff
between checkouts.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")

from numba import cuda

from baracuda_numba import registry
from baracuda_numba.kernels.elementwise import ElementwiseOp, ScaleMode, chunk_elements
from baracuda_numba.kernels.linear import Output, WarpgroupConfig, gemm_kernel
from baracuda_numba.kernels.packed import chunk_elements as packed_chunk_elements
from baracuda_numba.kernels.packed import dynamic_layout
from baracuda_numba.plans.linear import H100_SXM, H100_TUNING, choose
from baracuda_numba.plans.tuning import TUNINGS, MemoryTuning
from baracuda_numba.vocabulary import ElementKind, QuantizeKind

FLOATS = (ElementKind.F32, ElementKind.F64, ElementKind.F16, ElementKind.BF16)
MS = (1, 2, 3, 4, 5, 8, 12, 16, 17, 32, 48, 64, 65, 128, 256, 2048, 4096)
NS = (8, 40, 264, 4096, 4224, 5120, 6144, 8192, 9520, 11008, 14336, 28672)
KS = (100, 144, 1040, 2064, 4096, 8192, 11008)


def normalise(ptx: str) -> str:
    """``ptx`` with mangled names and shared-array numbers replaced by their order of appearance."""
    names: dict[str, str] = {}
    ptx = re.sub(r"_ZN\w+", lambda m: names.setdefault(m.group(0), f"NAME{len(names)}"), ptx)
    arrays: dict[str, str] = {}
    return re.sub(r"_cudapy_smem_\d+", lambda m: arrays.setdefault(m.group(0), f"SMEM{len(arrays)}"), ptx)


def ptx_of(kernel) -> str:
    if hasattr(kernel, "ptx"):  # the warpgroup kernel: sm_90a
        return kernel.ptx()
    ptx, _ = cuda.compile_ptx(kernel.py_func, kernel.signature, cc=(9, 0), **dict(getattr(kernel, "options", ())))
    return ptx


def linear_configs(full: bool = False) -> list:
    """The W8A8 kernel configurations the chooser picks over the grid, in a fixed order; without ``full`` one per
    kernel body, plus every output of one body of each kind."""
    import baracuda_numba as bn

    devices = [H100_SXM, replace(H100_SXM, sm90a=False), replace(H100_SXM, multiprocessors=114),
               replace(H100_SXM, multiprocessors=66, sm90a=False)]
    found: dict = {}
    for device, m, n, k in itertools.product(devices, MS, NS, KS):
        if m > 64 and (n, k) not in ((264, 144), (4096, 4096), (11008, 4096), (4096, 11008)):
            continue
        descs = [bn.SmoothQuantLinearDescriptor(m, n, k, out, bool(m % 2), static)
                 for out in FLOATS for static in (False, True)]
        descs += [bn.QuantizedLinearDescriptor(m, n, k, x, x, bool(k % 2), static, act)
                  for x in FLOATS for static in (False, True) for act in (False, True) if not (act and x.itemsize > 4)]
        for desc in descs:
            spec = choose(desc, device, H100_TUNING)
            for _, launch in spec.variants:
                found.setdefault(launch.config.name, launch.config)
            if spec.static_quantizer is not None:
                found.setdefault(spec.static_quantizer.config.name, spec.static_quantizer.config)
    configs = [found[name] for name in sorted(found)]
    if full:
        return configs
    bodies: dict = {}
    outputs: dict = {}
    for config in configs:
        output = getattr(config, "output", None)
        body = replace(config, output=Output(ElementKind.F32)) if output is not None else config
        if isinstance(config, WarpgroupConfig) and config.dependent:
            body = replace(body, output=Output(ElementKind.F32, per_tensor_rows=config.wait_first))
        bodies.setdefault(body, config)
        outputs.setdefault((type(config).__name__, output), config)
    return sorted({c.name: c for c in (*bodies.values(), *outputs.values())}.values(), key=lambda c: c.name)


def registered_kernels(tuning: MemoryTuning):
    """``(family, name, kernel)`` of every registered non-linear kernel under ``tuning``, in registration order."""
    e, d = tuning.elementwise, tuning.dynamic
    for entry in registry.entries():
        # FP8 kernels are families of their own, so the integer families' hashes stay comparable.
        if isinstance(entry, registry.RegistryEntry):
            for uniform in (True, False):
                kernel = entry.kernel(e.kernel, uniform, unroll=e.policy(entry.launch).unroll)
                yield "elementwise" + ("_fp8" if entry.grid else ""), kernel.py_func.__name__, kernel
        elif isinstance(entry, registry.DynamicRangeEntry):
            fp8 = entry.output_element.is_fp8
            for symmetric in (True,) if fp8 else (True, False):
                kernels = entry.kernels(symmetric, d.keep, d.threads, tuning=d.kernel)
                for name in sorted(vars(kernels)):
                    kernel = getattr(kernels, name)
                    if hasattr(kernel, "py_func") and hasattr(kernel, "signature"):
                        yield "dynamic" + ("_fp8" if fp8 else ""), kernel.py_func.__name__, kernel


# The dynamic plans' segment kernels beyond the defaults, as ``(keep, threads, min_blocks, streaming, split,
# kernel)`` on an H100: the defaults storing evict-first (tensors past L2), the wide resident blocks of few
# long rows (keep and threads doubled up to 8 x 1024, a launch bound of one block), and the fixed kernel of
# the W8A8 decode's rows (K = 4096 and 8192 of 16-bit floats, 2048 of f32).
DYNAMIC_SHAPES = ((4, 128, 0, True, 1, "segment"), (4, 128, 0, True, 1, "resident"),
                  (4, 256, 1, False, 1, "resident"), (8, 256, 1, False, 1, "resident"),
                  (8, 512, 1, False, 1, "resident"), (8, 1024, 1, False, 1, "resident"),
                  (4, 128, 0, False, 1, "fixed"), (4, 256, 0, False, 1, "fixed"))
PACKED_GROUPS = (16, 32, 64, 128, 256, 512, 1024)  # group sizes whose one-pass dynamic layouts are compiled


def plan_kernels(tuning: MemoryTuning):
    """``(family, name, kernel)`` of the memory-bound kernels the plans pick besides the registry's defaults under
    ``tuning``: the elementwise family's shift, thread-stationary and channel-vector kernels (and PyTorch's float64
    fake quantize), each with the unroll of its launch policy; the dynamic plans' kernels of
    :data:`DYNAMIC_SHAPES`; the packed 4-bit kernels."""
    e, d, p = tuning.elementwise, tuning.dynamic, tuning.packed
    vector_unroll = e.policy(registry.LaunchRole.CHANNEL_VECTOR).unroll
    for entry in registry.entries():
        if isinstance(entry, registry.RegistryEntry):
            family = "elementwise_fp8_plans" if entry.grid else "elementwise_plans"
            ops = (None,)
            if (entry.op is ElementwiseOp.FAKE_QUANTIZE and entry.mode is ScaleMode.SCALAR
                    and entry.a is ElementKind.F64):
                ops = (None, ElementwiseOp.FAKE_QUANTIZE_F32_PRODUCT)
            unroll = e.policy(entry.launch).unroll
            for op in ops:
                kernels = [entry.kernel(e.kernel, True, op, unroll=unroll)] if op else []
                if entry.mode is not ScaleMode.SCALAR:
                    kernels.append(entry.kernel(e.kernel, True, op, True, unroll=unroll))
                if entry.mode is ScaleMode.CHANNELS:
                    kernels.append(entry.kernel(e.kernel, False, op, stationary=True, unroll=unroll))
                    if (entry.op in registry.CHANNEL_VECTOR_OPS
                            and chunk_elements(entry.a, entry.b, entry.out) <= registry.CHANNEL_VECTOR_MAX_CHUNK):
                        kernels.append(entry.kernel(e.kernel, False, op, channel_vectors=True, unroll=vector_unroll))
                for kernel in kernels:
                    yield family, kernel.py_func.__name__, kernel
        elif isinstance(entry, registry.DynamicRangeEntry):
            for symmetric in (True,) if entry.output_element.is_fp8 else (True, False):
                for keep, threads, bound, streaming, split, name in DYNAMIC_SHAPES:
                    kernel = getattr(entry.kernels(symmetric, keep, threads, bound, streaming, split,
                                                   tuning=d.kernel), name)
                    yield "dynamic_plans", kernel.py_func.__name__, kernel
        elif isinstance(entry, registry.PackedEntry):
            if entry.kind is not QuantizeKind.DYNAMIC_RANGE:
                policy = p.dequantize_policy if entry.kind is QuantizeKind.DEQUANTIZE_PER_GROUP else p.quantize_policy
                kernel = entry.kernel(policy.unroll or p.unroll)
                yield "packed", kernel.py_func.__name__, kernel
                continue
            G = packed_chunk_elements(entry.input_element)
            layouts = sorted({dynamic_layout(g // G, p.dynamic_max_lanes, p.dynamic_max_per_lane)
                              for g in PACKED_GROUPS if g % G == 0} - {None})
            for symmetric in (True,) if entry.output_element is ElementKind.S4 else (True, False):
                for lanes, per_lane in layouts:
                    kernel = entry.dynamic_kernel(symmetric, per_lane, p.dynamic_slots, p.dynamic_threads, lanes)
                    yield "packed", kernel.py_func.__name__, kernel
    packer = registry.lookup(QuantizeKind.DYNAMIC_RANGE, ElementKind.F32, ElementKind.S4).kernel()
    yield "packed", "pack_nibbles", packer


def fingerprints(families: set[str] | None = None, full: bool = False, dump: Path | None = None,
                 tuning: MemoryTuning = TUNINGS["h100"]):
    """``family -> (kernel count, sha256 of their normalised PTX in order)``, the memory-bound families compiled
    under ``tuning``."""
    digests: dict[str, hashlib._Hash] = {}
    counts: dict[str, int] = {}

    def kernels():
        yield from registered_kernels(tuning)
        yield from plan_kernels(tuning)
        if families is None or "linear" in families:
            for config in linear_configs(full):
                yield "linear", config.name, gemm_kernel(config)

    compiled: dict[int, str] = {}  # a kernel object met again (several entries share one) is not compiled again
    for family, name, kernel in kernels():
        if families is not None and family not in families:
            continue
        ptx = compiled.get(id(kernel))
        if ptx is None:
            try:
                ptx = compiled[id(kernel)] = normalise(ptx_of(kernel))
            except Exception as error:
                raise RuntimeError(f"{family} kernel {counts.get(family, 0)} ({name}) did not compile: {error}") \
                    from error
        if dump is not None:
            (dump / f"{family}-{name}.ptx").write_text(ptx)
        digests.setdefault(family, hashlib.sha256()).update(ptx.encode())
        counts[family] = counts.get(family, 0) + 1
    return {family: (counts[family], digest.hexdigest()) for family, digest in digests.items()}


FAMILIES = ("elementwise", "elementwise_fp8", "dynamic", "dynamic_fp8", "elementwise_plans", "elementwise_fp8_plans",
            "dynamic_plans", "packed", "linear")


def _each_family_in_its_own_process(argv: list[str]) -> int:
    """Every family's fingerprint from a child process of its own, so that a family's result does not depend on the
    kernels compiled before it: NVVM has rejected (``ERROR_INVALID_IR``) kernels that compile alone after hundreds
    of others in one process (the W8A8 family alone still meets it, at its 197th configuration)."""
    status = 0
    for family in FAMILIES:
        done = subprocess.run([sys.executable, "-m", "benchmarks.ptx_fingerprint", *argv, "--families", family],
                              check=False)
        status = status or done.returncode
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=None,
                        help=", ".join(FAMILIES) + " (default: all, each compiled in a process of its own)")
    parser.add_argument("--full", action="store_true", help="every W8A8 configuration chosen, not one per body")
    parser.add_argument("--dump", type=Path, default=None, help="write each kernel's normalised PTX here")
    parser.add_argument("--list", action="store_true", help="only list the W8A8 configurations")
    parser.add_argument("--tuning", choices=sorted(TUNINGS), default="h100",
                        help="the card whose memory-bound tuning value compiles those families")
    args = parser.parse_args(argv)
    if args.list:
        for config in linear_configs(args.full):
            print(config.name)
        return 0
    if args.families is None:
        return _each_family_in_its_own_process(sys.argv[1:] if argv is None else list(argv))
    if args.dump is not None:
        args.dump.mkdir(parents=True, exist_ok=True)
    for family, (count, digest) in fingerprints(set(args.families) if args.families else None, args.full,
                                                args.dump, TUNINGS[args.tuning]).items():
        print(f"{family:16s} {count:4d} kernels  {digest}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
