"""Command line: ``baracuda-numba demo | list | catalog | info``.

Exit codes: 0 success, 1 a check failed (demo mismatches, stale catalogue), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

__all__ = ["main"]


def _backend_line() -> str:
    from . import platform

    if platform.SIMULATOR:
        return "CUDA simulator (no GPU found: slow, small sizes; set NUMBA_ENABLE_CUDASIM=0 to require a GPU)"
    return f"GPU: {platform.backend_name()}"


def _time_call(fn: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of ``fn`` (CUDA events on a GPU, wall clock under the simulator)."""
    from numba import cuda

    from . import platform

    fn()  # warm-up: compilation and module load stay out of the numbers
    samples = []
    for _ in range(repeats):
        if platform.SIMULATOR:
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        else:
            begin, end = cuda.event(), cuda.event()
            begin.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(cuda.event_elapsed_time(begin, end))
    return statistics.median(samples)


def _demo_cases(kind, x_host, x_dev, dy_host, q_host, scale, zero_point) -> list:
    """``(op, dtypes, host call, reference, device call or None, bytes per element)`` per op."""
    from . import ops, reference

    q_range = (-128, 127)
    return [
        ("quantize_per_tensor", f"{kind.short}->s8", lambda: ops.quantize_per_tensor(x_host, scale, zero_point),
         reference.quantize(x_host, scale, zero_point, *q_range, np.int8),
         lambda: ops.quantize_per_tensor(x_dev, scale, zero_point), kind.itemsize + 1),
        ("dequantize_per_tensor", f"s8->{kind.short}",
         lambda: ops.dequantize_per_tensor(q_host, scale, zero_point, dtype=kind),
         reference.dequantize(q_host, scale, zero_point, kind.numpy_dtype), None, kind.itemsize + 1),
        ("fake_quantize", kind.short, lambda: ops.fake_quantize(x_host, scale, zero_point),
         reference.fake_quantize(x_host, scale, zero_point, *q_range),
         lambda: ops.fake_quantize(x_dev, scale, zero_point), 2 * kind.itemsize),
        ("quantize_per_tensor_backward", kind.short,
         lambda: ops.quantize_per_tensor_backward(dy_host, x_host, scale, zero_point),
         reference.quantize_backward(dy_host, x_host, scale, zero_point, *q_range), None, 3 * kind.itemsize),
        ("fake_quantize_backward", kind.short, lambda: ops.fake_quantize_backward(dy_host, x_host, scale, zero_point),
         reference.fake_quantize_backward(dy_host, x_host, scale, zero_point, *q_range), None, 3 * kind.itemsize),
        ("dequantize_per_tensor_backward", kind.short, lambda: ops.dequantize_per_tensor_backward(dy_host, scale),
         reference.dequantize_backward(dy_host, scale), None, 2 * kind.itemsize),
    ]


def _demo(args: argparse.Namespace) -> int:
    from numba import cuda

    from . import ops, platform
    from .vocabulary import element_kind

    size = args.size or (4096 if platform.SIMULATOR else 1 << 24)
    repeats = 1 if platform.SIMULATOR else 20
    rng = np.random.default_rng(0)
    print(f"baracuda-numba demo: {size} elements, on the {_backend_line()}")
    header = f"{'op':<32}{'dtypes':<10}{'mismatches':>11}{'max|diff|':>11}{'quant RMSE':>12}{'ms':>10}{'GB/s':>9}"
    print(header)
    print("-" * len(header))
    failures = 0
    scale, zero_point = 0.02, 3
    for name in args.dtype:
        kind = element_kind(name)
        x_host = (rng.standard_normal(size) * 1.5).astype(kind.numpy_dtype)
        dy_host = rng.standard_normal(size).astype(kind.numpy_dtype)
        q_host = ops.quantize_per_tensor(x_host, scale, zero_point)
        x_dev = x_host if platform.SIMULATOR else cuda.to_device(x_host.view(kind.storage_dtype))
        if kind.short == "bf16" and not platform.SIMULATOR:
            from .arrays import bfloat16_view

            x_dev = bfloat16_view(x_dev)
        cases = _demo_cases(kind, x_host, x_dev, dy_host, q_host, scale, zero_point)
        for op_name, dtypes, run_host, expected, run_device, bytes_per_element in cases:
            got = np.asarray(run_host())
            diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
            same = (got.astype(np.float64) == expected.astype(np.float64)) | (np.isnan(diff) & np.isnan(
                expected.astype(np.float64)))
            mismatches = int(size - same.sum())
            failures += mismatches > 0
            rmse = ""
            if op_name == "fake_quantize":
                err = got.astype(np.float64) - x_host.astype(np.float64)
                rmse = f"{np.sqrt(np.mean(err ** 2)):.3e}"
            ms = _time_call(run_device or run_host, repeats)
            gbps = "" if run_device is None or platform.SIMULATOR else f"{bytes_per_element * size / ms / 1e6:.0f}"
            max_diff = float(np.nanmax(diff)) if diff.size else 0.0
            print(f"{op_name:<32}{dtypes:<10}{mismatches:>11}{max_diff:>11.2e}{rmse:>12}{ms:>10.3f}{gbps:>9}")
    note = "host arrays (times include transfers)" if platform.SIMULATOR else \
        "ms: median of device arrays where GB/s is shown, else host round trips"
    print(f"\n{note}. mismatches: elements differing from the NumPy reference of SPEC section 5.")
    return 1 if failures else 0


def _list(args: argparse.Namespace) -> int:
    from . import registry

    rows = [e for e in registry.entries() if not args.kind or e.kind.name.lower() == args.kind.lower()]
    if not rows:
        kinds = sorted({e.kind.name.lower() for e in registry.entries()})
        print(f"baracuda-numba list: --kind expected one of {kinds}, got {args.kind!r}", file=sys.stderr)
        return 2
    print(f"{'kind':<34}{'input':<7}{'output':<8}{'math':<6}sku")
    for e in rows:
        print(f"{e.kind.name:<34}{e.input_element.short:<7}{e.output_element.short:<8}"
              f"{e.sku.precision_guarantee.math_precision.value:<6}{e.sku}")
    print(f"{len(rows)} entries")
    return 0


def _catalog(args: argparse.Namespace) -> int:
    from . import catalog

    directory = Path(args.output)
    if args.check:
        expected = (("catalog.json", catalog.render_json()), ("README.md", catalog.render_markdown()))
        stale = [name for name, text in expected
                 if not (directory / name).exists() or (directory / name).read_text() != text]
        if stale:
            print(f"baracuda-numba catalog: {', '.join(stale)} in {directory} are stale; run `baracuda-numba catalog`",
                  file=sys.stderr)
            return 1
        print(f"{directory}: up to date")
        return 0
    for path in catalog.write_catalog(directory):
        print(f"wrote {path}")
    return 0


def _info(args: argparse.Namespace) -> int:
    import numba
    from numba import cuda

    from . import __version__, registry

    print(f"baracuda-numba {__version__}")
    print(f"backend: {_backend_line()}")
    print(f"numba {numba.__version__}, numba-cuda {getattr(cuda, '__version__', _dist_version('numba-cuda'))}, "
          f"numpy {np.__version__}")
    print(f"registry: {len(registry.entries())} kernels")
    return 0


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baracuda-numba", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run every per-tensor op on generated data against the reference")
    demo.add_argument("--size", type=int, default=None, help="elements (default 2^24 on a GPU, 4096 simulated)")
    demo.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], help="float dtypes to run")
    demo.set_defaults(func=_demo)
    lst = sub.add_parser("list", help="the registry as a table")
    lst.add_argument("--kind", default=None, help="only this QuantizeKind (e.g. per_tensor)")
    lst.set_defaults(func=_list)
    cat = sub.add_parser("catalog", help="write registry/catalog.json and registry/README.md")
    cat.add_argument("--output", default="registry", help="directory (default: registry)")
    cat.add_argument("--check", action="store_true", help="exit 1 if the files there are stale")
    cat.set_defaults(func=_catalog)
    info = sub.add_parser("info", help="backend, versions and registry size")
    info.set_defaults(func=_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from .errors import BaracudaError

    try:
        return args.func(args)
    except (BaracudaError, TypeError, ValueError) as exc:
        print(f"baracuda-numba {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
