"""Command line: ``baracuda-numba demo | run | list | catalog | info | bench``.

Exit codes: 0 success, 1 a check failed (mismatches against the reference, stale catalogue),
2 bad arguments or an unusable environment (printed as one line, no traceback).
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
    if platform.UNAVAILABLE:
        return f"no usable GPU ({platform.UNAVAILABLE}) and the simulator refused by NUMBA_ENABLE_CUDASIM=0"
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


RUNNABLE = ("quantize_per_tensor", "dequantize_per_tensor", "fake_quantize", "quantize_per_tensor_backward",
            "fake_quantize_backward", "dequantize_per_tensor_backward", "quantize_per_channel",
            "dequantize_per_channel", "quantize_per_channel_backward", "dequantize_per_channel_backward",
            "quantize_per_token", "dequantize_per_token", "quantize_per_token_backward",
            "dequantize_per_token_backward", "quantize_per_group", "dequantize_per_group",
            "quantize_per_group_backward", "dequantize_per_group_backward", "dynamic_range_quantize",
            "quantized_linear", "smoothquant_linear")


def _recipe(op: str, x, q, kind, out_kind, shape, group_size: int):
    """``(call, reference)`` for ``op`` on the generated ``x`` (float) and ``q`` (int)."""
    from . import ops, reference

    scale, zp = 0.02, 3
    q_min, q_max = out_kind.int_range
    rows = int(np.prod(shape[:-1]))
    channel_scales = np.linspace(0.01, 0.05, shape[0]).astype(np.float64 if kind.short == "f64" else np.float32)
    token_scales = np.linspace(0.01, 0.05, rows).astype(channel_scales.dtype)
    group_scales = np.linspace(0.01, 0.05, rows * (shape[-1] // group_size)).astype(channel_scales.dtype)
    f = kind.numpy_dtype
    expand = {"channel": reference.expand_channels(channel_scales, shape, 0),
              "token": reference.expand_tokens(token_scales, shape),
              "group": reference.expand_groups(group_scales, shape, group_size)}
    # the linear ops: x [..., K] against a [K, K] int8 weight with per-output-channel scales
    k = shape[-1]
    weight = np.random.default_rng(1).integers(-128, 128, (k, k)).astype(np.int8)
    weight_scale = np.linspace(0.001, 0.01, k).astype(np.float32)
    act = q.astype(np.int8) if out_kind.short == "s8" else (q.astype(np.int16) - 128).astype(np.int8)
    table = {
        "quantize_per_tensor": (lambda: ops.quantize_per_tensor(x, scale, zp, dtype=out_kind),
                                lambda: reference.quantize(x, scale, zp, q_min, q_max, out_kind.numpy_dtype)),
        "dequantize_per_tensor": (lambda: ops.dequantize_per_tensor(q, scale, zp, dtype=kind),
                                  lambda: reference.dequantize(q, scale, zp, f)),
        "fake_quantize": (lambda: ops.fake_quantize(x, scale, zp),
                          lambda: reference.fake_quantize(x, scale, zp, -128, 127)),
        "quantize_per_tensor_backward": (lambda: ops.quantize_per_tensor_backward(x, x, scale, zp, dtype=out_kind),
                                         lambda: reference.quantize_backward(x, x, scale, zp, q_min, q_max)),
        "fake_quantize_backward": (lambda: ops.fake_quantize_backward(x, x, scale, zp),
                                   lambda: reference.fake_quantize_backward(x, x, scale, zp, -128, 127)),
        "dequantize_per_tensor_backward": (lambda: ops.dequantize_per_tensor_backward(x, scale, dtype=out_kind),
                                           lambda: reference.dequantize_backward(x, scale)),
        "quantize_per_channel": (lambda: ops.quantize_per_channel(x, channel_scales, None, 0, dtype=out_kind),
                                 lambda: reference.quantize(x, expand["channel"], 0, q_min, q_max,
                                                            out_kind.numpy_dtype)),
        "dequantize_per_channel": (lambda: ops.dequantize_per_channel(q, channel_scales, None, 0, dtype=kind),
                                   lambda: reference.dequantize(q, expand["channel"], 0, f)),
        "quantize_per_token": (lambda: ops.quantize_per_token(x, token_scales, dtype=out_kind),
                               lambda: reference.quantize(x, expand["token"], 0, q_min, q_max, out_kind.numpy_dtype)),
        "dequantize_per_token": (lambda: ops.dequantize_per_token(q, token_scales, dtype=kind),
                                 lambda: reference.dequantize(q, expand["token"], 0, f)),
        "quantize_per_group": (lambda: ops.quantize_per_group(x, group_scales, None, group_size, dtype=out_kind),
                               lambda: reference.quantize(x, expand["group"], 0, q_min, q_max, out_kind.numpy_dtype)),
        "dequantize_per_group": (lambda: ops.dequantize_per_group(q, group_scales, None, group_size, dtype=kind),
                                 lambda: reference.dequantize(q, expand["group"], 0, f)),
        "quantize_per_channel_backward": (
            lambda: ops.quantize_per_channel_backward(x, x, channel_scales, None, 0, dtype=out_kind),
            lambda: reference.quantize_backward(x, x, expand["channel"], 0, q_min, q_max)),
        "dequantize_per_channel_backward": (
            lambda: ops.dequantize_per_channel_backward(x, channel_scales, 0, dtype=out_kind),
            lambda: reference.dequantize_backward(x, expand["channel"])),
        "quantize_per_token_backward": (lambda: ops.quantize_per_token_backward(x, x, token_scales, dtype=out_kind),
                                        lambda: reference.quantize_backward(x, x, expand["token"], 0, q_min, q_max)),
        "dequantize_per_token_backward": (lambda: ops.dequantize_per_token_backward(x, token_scales, dtype=out_kind),
                                          lambda: reference.dequantize_backward(x, expand["token"])),
        "quantize_per_group_backward": (
            lambda: ops.quantize_per_group_backward(x, x, group_scales, None, group_size, dtype=out_kind),
            lambda: reference.quantize_backward(x, x, expand["group"], 0, q_min, q_max)),
        "dequantize_per_group_backward": (
            lambda: ops.dequantize_per_group_backward(x, group_scales, group_size, dtype=out_kind),
            lambda: reference.dequantize_backward(x, expand["group"])),
        "quantized_linear": (lambda: ops.quantized_linear(x, weight, weight_scale),
                             lambda: reference.linear.quantized_linear(x, weight, weight_scale)),
        "smoothquant_linear": (lambda: ops.smoothquant_linear(act, weight, weight_scale, scale, dtype=kind),
                               lambda: reference.linear.smoothquant_linear(act, weight, weight_scale, scale, None, f)),
        "dynamic_range_quantize": (lambda: ops.dynamic_range_quantize(x, dtype=out_kind).q,
                                   lambda: reference.dynamic.dynamic_range_quantize(
                                       x, "symmetric", "token", -127 if q_min < 0 else 0, q_max,
                                       out_kind.numpy_dtype)[0]),
    }
    return table[op]


def _run(args: argparse.Namespace) -> int:
    from . import platform
    from .vocabulary import element_kind

    kind, out_kind = element_kind(args.dtype), element_kind(args.out_dtype)
    if not kind.is_float or not out_kind.is_integer:
        print(f"baracuda-numba run: --dtype expected a float dtype and --out-dtype an integer one, got "
              f"{kind.short} / {out_kind.short}", file=sys.stderr)
        return 2
    shape = tuple(args.shape) if args.shape else ((16, 128) if platform.SIMULATOR else (4096, 4096))
    if shape[-1] % args.group_size:
        print(f"baracuda-numba run: --group-size expected a divisor of {shape[-1]}, got {args.group_size}",
              file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 1.5).astype(kind.numpy_dtype)
    low, high = out_kind.int_range
    q = rng.integers(low, high + 1, shape).astype(out_kind.numpy_dtype)
    call, expected_of = _recipe(args.op, x, q, kind, out_kind, shape, args.group_size)
    got = np.asarray(call())
    expected = np.asarray(expected_of())
    g, e = got.astype(np.float64), expected.astype(np.float64)
    same = (g == e) | (np.isnan(g) & np.isnan(e))
    mismatches = int(same.size - same.sum())
    ms = _time_call(call, 1 if platform.SIMULATOR else args.repeats)
    produced = kind if args.op.endswith("linear") else out_kind  # the linear ops return x's dtype
    print(f"{args.op} {kind.short}->{produced.short} shape={shape} on the {_backend_line()}")
    print(f"mismatches against the NumPy reference: {mismatches} of {same.size}; "
          f"max |diff| {float(np.nanmax(np.abs(g - e))) if g.size else 0.0:.3e}")
    print(f"time: {ms:.3f} ms (median, host arrays: includes transfers)")
    return 1 if mismatches else 0


def _bench(args: argparse.Namespace) -> int:
    from . import bench

    return bench.main(args.bench_args)


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
    run = sub.add_parser("run", help="run one op on generated data against the reference, and time it")
    run.add_argument("op", choices=RUNNABLE)
    run.add_argument("--dtype", default="float32", help="float dtype (default float32)")
    run.add_argument("--out-dtype", default="int8", help="integer dtype (default int8)")
    run.add_argument("--shape", type=int, nargs="+", default=None, help="default 4096 4096 (16 128 simulated)")
    run.add_argument("--group-size", type=int, default=32)
    run.add_argument("--repeats", type=int, default=20)
    run.set_defaults(func=_run)
    bench = sub.add_parser("bench", help="the GPU benchmark suite (needs PyTorch); options after --",
                           add_help=False)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from . import platform
    from .errors import BaracudaError

    try:
        if args.command in ("demo", "run", "bench"):
            platform.require_device()
        return args.func(args)
    except (BaracudaError, TypeError, ValueError) as exc:
        print(f"baracuda-numba {args.command}: {exc}".splitlines()[0], file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
