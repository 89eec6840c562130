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


# One op of each family, as named in ``_recipe``; the per-tensor ops are all shown.
DEMO_OPS = ("quantize_per_tensor", "dequantize_per_tensor", "fake_quantize", "quantize_per_tensor_backward",
            "fake_quantize_backward", "dequantize_per_tensor_backward", "quantize_per_channel",
            "dequantize_per_channel", "quantize_per_token", "quantize_per_group", "dequantize_per_group",
            "dynamic_range_quantize", "quantized_linear")


def _device_placer():
    """``place(host array) -> device array`` (bf16 through a tagged uint16 view); identity under the
    simulator, where the ops take host arrays."""
    from numba import cuda

    from . import platform
    from .arrays import bfloat16_view
    from .vocabulary import ElementKind

    if platform.SIMULATOR:
        return lambda a: a

    def place(a):
        if a.dtype == ElementKind.BF16.numpy_dtype:
            return bfloat16_view(cuda.to_device(a.view(np.uint16)))
        return cuda.to_device(a)

    return place


def _copy_bandwidth(size_bytes: int, repeats: int) -> float:
    """GB/s of a device-to-device copy (bytes read + written): the ceiling of a memory-bound op."""
    from numba import cuda

    src = cuda.device_array(size_bytes // 4, np.float32)
    dst = cuda.device_array_like(src)
    ms = _time_call(lambda: dst.copy_to_device(src), repeats)
    return 2 * src.nbytes / ms / 1e6


def _compare(got: np.ndarray, expected: np.ndarray) -> tuple[int, float]:
    """``(mismatches, max |diff|)``: elements whose value differs (NaN equals NaN)."""
    g, e = got.astype(np.float64), expected.astype(np.float64)
    same = (g == e) | (np.isnan(g) & np.isnan(e))
    diff = np.abs(g - e)
    return int(same.size - same.sum()), (float(np.nanmax(diff)) if diff.size and not np.isnan(diff).all() else 0.0)


def _demo(args: argparse.Namespace) -> int:
    from . import platform
    from .vocabulary import element_kind

    simulated = platform.SIMULATOR
    cols = 128 if simulated else 4096
    size = args.size or (2048 if simulated else 1 << 24)
    shape = (max(1, -(-size // cols)), cols) if size >= cols else (1, size)
    # the linear row: checked on a small problem, timed (GPU) at 4096^3
    linear_shape = (4, 32) if simulated else (256, 1024)
    repeats = 1 if simulated else 20
    place = _device_placer()
    rng = np.random.default_rng(0)
    print(f"baracuda-numba demo: every per-tensor op and one op of each other family, {shape[0]} x {shape[1]} "
          f"elements, on the {_backend_line()}")
    copy = None
    if not simulated:
        copy = _copy_bandwidth(4 * shape[0] * shape[1], repeats)
        print(f"device-to-device copy (bytes read + written): {copy:.0f} GB/s, the memory-bound ceiling")
    header = (f"{'op':<32}{'dtypes':<11}{'mismatches':>11}{'max|diff|':>11}{'quant RMSE':>12}{'ms':>10}"
              f"{'GB/s':>8}{'% copy':>8}{'TOPS':>8}")
    print(header)
    print("-" * len(header))
    failures = 0
    for name in args.dtype:
        kind, out_kind = element_kind(name), element_kind("int8")
        if not kind.is_float:
            raise ValueError(f"--dtype expected float dtypes, got {name}")
        for op in DEMO_OPS:
            linear = op.endswith("linear")
            op_shape = linear_shape if linear else shape
            x = (rng.standard_normal(op_shape) * 1.5).astype(kind.numpy_dtype)
            q = rng.integers(-128, 128, op_shape).astype(np.int8)
            call, expected_of, reads = _recipe(op, x, q, kind, out_kind, op_shape, args.group_size)
            began = time.perf_counter()
            got = np.asarray(call())
            elapsed_ms = (time.perf_counter() - began) * 1e3
            mismatches, max_diff = _compare(got, np.asarray(expected_of()))
            failures += mismatches > 0
            rmse = ""
            if op in ("fake_quantize", "quantized_linear"):  # the error quantization itself introduces
                exact = x.astype(np.float64)
                if linear:
                    weight, weight_scale = _linear_weight(op_shape[-1])
                    exact = exact @ (weight.astype(np.float64) * weight_scale[:, None]).T
                rmse = f"{np.sqrt(np.mean((got.astype(np.float64) - exact) ** 2)):.2e}"
            dtypes = f"{element_kind(reads[0].dtype).short}->{element_kind(got.dtype).short}"
            ms_text = gbps = pct = tops = ""
            if simulated:
                ms_text = f"{elapsed_ms:.2f}"  # one simulated call is slow enough to time alone
            elif linear:
                m = n = k = 4096
                xd = place((rng.standard_normal((m, k))).astype(kind.numpy_dtype))
                weight, weight_scale = _linear_weight(k)
                from . import ops

                wd, sd = place(weight), place(weight_scale)
                ms = _time_call(lambda xd=xd, wd=wd, sd=sd: ops.quantized_linear(xd, wd, sd), repeats)
                ms_text, tops = f"{ms:.3f}", f"{2 * m * n * k / ms / 1e9:.0f}"
            else:
                device_call, _, _ = _recipe(op, x, q, kind, out_kind, op_shape, args.group_size, place)
                ms = _time_call(device_call, repeats)
                moved = sum(a.nbytes for a in reads) + got.nbytes
                rate = moved / ms / 1e6
                ms_text, gbps, pct = f"{ms:.3f}", f"{rate:.0f}", f"{100 * rate / copy:.0f}%"
            print(f"{op:<32}{dtypes:<11}{mismatches:>11}{max_diff:>11.2e}{rmse:>12}{ms_text:>10}{gbps:>8}"
                  f"{pct:>8}{tops:>8}")
    note = ("simulator: host arrays, times include the simulation" if simulated else
            "ms: median of CUDA-event timings on device arrays (the call with its output allocation); GB/s "
            "counts bytes read + written once; quantized_linear is timed at M = N = K = 4096 (activation "
            "quantize + GEMM)")
    print(f"\n{note}. mismatches: elements differing from the NumPy float64 reference (README, Semantics); "
          "quant RMSE: error of the quantized result against unquantized float64 math.")
    return 1 if failures else 0


def _linear_weight(k: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``[k, k]`` int8 weight and its per-output-channel scales (float32), always the same."""
    weight = np.random.default_rng(1).integers(-128, 128, (k, k)).astype(np.int8)
    return weight, np.linspace(0.001, 0.01, k).astype(np.float32)


RUNNABLE = ("quantize_per_tensor", "dequantize_per_tensor", "fake_quantize", "quantize_per_tensor_backward",
            "fake_quantize_backward", "dequantize_per_tensor_backward", "quantize_per_channel",
            "dequantize_per_channel", "quantize_per_channel_backward", "dequantize_per_channel_backward",
            "quantize_per_token", "dequantize_per_token", "quantize_per_token_backward",
            "dequantize_per_token_backward", "quantize_per_group", "dequantize_per_group",
            "quantize_per_group_backward", "dequantize_per_group_backward", "dynamic_range_quantize",
            "quantized_linear", "smoothquant_linear")


def _recipe(op: str, x, q, kind, out_kind, shape, group_size: int, place=None):
    """``(call, reference, arrays the op reads)`` for ``op`` on the generated ``x`` (float) and ``q``
    (int), all NumPy. With ``place`` (host array -> device array) the call runs on device copies of its
    operands, for timing; the reference and the listed arrays stay on the host."""
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
    weight, weight_scale = _linear_weight(shape[-1])
    act = q.astype(np.int8) if out_kind.short == "s8" else (q.astype(np.int16) - 128).astype(np.int8)
    named = {"x": x, "q": q, "channel": channel_scales, "token": token_scales, "group": group_scales,
             "weight": weight, "weight_scale": weight_scale, "act": act}
    hx, hq, hw, hws, hact = x, q, weight, weight_scale, act  # the reference reads host arrays
    if place is not None:  # the same calls on device copies of every operand
        x, q, channel_scales, token_scales, group_scales, weight, weight_scale, act = (
            place(a) for a in (x, q, channel_scales, token_scales, group_scales, weight, weight_scale, act))
    table = {
        "quantize_per_tensor": (lambda: ops.quantize_per_tensor(x, scale, zp, dtype=out_kind),
                                lambda: reference.quantize(hx, scale, zp, q_min, q_max, out_kind.numpy_dtype)),
        "dequantize_per_tensor": (lambda: ops.dequantize_per_tensor(q, scale, zp, dtype=kind),
                                  lambda: reference.dequantize(hq, scale, zp, f)),
        "fake_quantize": (lambda: ops.fake_quantize(x, scale, zp),
                          lambda: reference.fake_quantize(hx, scale, zp, -128, 127)),
        "quantize_per_tensor_backward": (lambda: ops.quantize_per_tensor_backward(x, x, scale, zp, dtype=out_kind),
                                         lambda: reference.quantize_backward(hx, hx, scale, zp, q_min, q_max)),
        "fake_quantize_backward": (lambda: ops.fake_quantize_backward(x, x, scale, zp),
                                   lambda: reference.fake_quantize_backward(hx, hx, scale, zp, -128, 127)),
        "dequantize_per_tensor_backward": (lambda: ops.dequantize_per_tensor_backward(x, scale, dtype=out_kind),
                                           lambda: reference.dequantize_backward(hx, scale)),
        "quantize_per_channel": (lambda: ops.quantize_per_channel(x, channel_scales, None, 0, dtype=out_kind),
                                 lambda: reference.quantize(hx, expand["channel"], 0, q_min, q_max,
                                                            out_kind.numpy_dtype)),
        "dequantize_per_channel": (lambda: ops.dequantize_per_channel(q, channel_scales, None, 0, dtype=kind),
                                   lambda: reference.dequantize(hq, expand["channel"], 0, f)),
        "quantize_per_token": (lambda: ops.quantize_per_token(x, token_scales, dtype=out_kind),
                               lambda: reference.quantize(hx, expand["token"], 0, q_min, q_max, out_kind.numpy_dtype)),
        "dequantize_per_token": (lambda: ops.dequantize_per_token(q, token_scales, dtype=kind),
                                 lambda: reference.dequantize(hq, expand["token"], 0, f)),
        "quantize_per_group": (lambda: ops.quantize_per_group(x, group_scales, None, group_size, dtype=out_kind),
                               lambda: reference.quantize(hx, expand["group"], 0, q_min, q_max, out_kind.numpy_dtype)),
        "dequantize_per_group": (lambda: ops.dequantize_per_group(q, group_scales, None, group_size, dtype=kind),
                                 lambda: reference.dequantize(hq, expand["group"], 0, f)),
        "quantize_per_channel_backward": (
            lambda: ops.quantize_per_channel_backward(x, x, channel_scales, None, 0, dtype=out_kind),
            lambda: reference.quantize_backward(hx, hx, expand["channel"], 0, q_min, q_max)),
        "dequantize_per_channel_backward": (
            lambda: ops.dequantize_per_channel_backward(x, channel_scales, 0, dtype=out_kind),
            lambda: reference.dequantize_backward(hx, expand["channel"])),
        "quantize_per_token_backward": (lambda: ops.quantize_per_token_backward(x, x, token_scales, dtype=out_kind),
                                        lambda: reference.quantize_backward(hx, hx, expand["token"], 0, q_min, q_max)),
        "dequantize_per_token_backward": (lambda: ops.dequantize_per_token_backward(x, token_scales, dtype=out_kind),
                                          lambda: reference.dequantize_backward(hx, expand["token"])),
        "quantize_per_group_backward": (
            lambda: ops.quantize_per_group_backward(x, x, group_scales, None, group_size, dtype=out_kind),
            lambda: reference.quantize_backward(hx, hx, expand["group"], 0, q_min, q_max)),
        "dequantize_per_group_backward": (
            lambda: ops.dequantize_per_group_backward(x, group_scales, group_size, dtype=out_kind),
            lambda: reference.dequantize_backward(hx, expand["group"])),
        "quantized_linear": (lambda: ops.quantized_linear(x, weight, weight_scale),
                             lambda: reference.linear.quantized_linear(hx, hw, hws)),
        "smoothquant_linear": (lambda: ops.smoothquant_linear(act, weight, weight_scale, scale, dtype=kind),
                               lambda: reference.linear.smoothquant_linear(hact, hw, hws, scale, None, f)),
        "dynamic_range_quantize": (lambda: ops.dynamic_range_quantize(x, dtype=out_kind).q,
                                   lambda: reference.dynamic.dynamic_range_quantize(
                                       hx, "symmetric", "token", -127 if q_min < 0 else 0, q_max,
                                       out_kind.numpy_dtype)[0]),
    }
    call, expected = table[op]
    return call, expected, [named[name] for name in _READS[op].split()]


_READS = {  # the generated arrays each op reads, for the bytes it moves
    "quantize_per_tensor": "x", "dequantize_per_tensor": "q", "fake_quantize": "x",
    "quantize_per_tensor_backward": "x x", "fake_quantize_backward": "x x", "dequantize_per_tensor_backward": "x",
    "quantize_per_channel": "x channel", "dequantize_per_channel": "q channel",
    "quantize_per_token": "x token", "dequantize_per_token": "q token",
    "quantize_per_group": "x group", "dequantize_per_group": "q group",
    "quantize_per_channel_backward": "x x channel", "dequantize_per_channel_backward": "x channel",
    "quantize_per_token_backward": "x x token", "dequantize_per_token_backward": "x token",
    "quantize_per_group_backward": "x x group", "dequantize_per_group_backward": "x group",
    "quantized_linear": "x weight weight_scale", "smoothquant_linear": "act weight weight_scale",
    "dynamic_range_quantize": "x",
}


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
    call, expected_of, _ = _recipe(args.op, x, q, kind, out_kind, shape, args.group_size)
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
    print(f"{'kind':<34}{'input':<7}{'output':<10}{'math':<6}sku")
    for e in rows:
        print(f"{e.kind.name:<34}{e.input_element.short:<7}{e.output_element.short:<10}"
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
    demo = sub.add_parser("demo", help="every per-tensor op and one op of each other family "
                          "(channel, token, group, dynamic, W8A8) against the reference, timed")
    demo.add_argument("--size", type=int, default=None, help="elements, as rows of 4096 (128 simulated); "
                      "default 2^24 on a GPU, 2048 simulated")
    demo.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], help="float dtypes to run")
    demo.add_argument("--group-size", type=int, default=32, help="per-group quantize group size (default 32)")
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
    # prefix_chars="+": every option after `bench` is passed to bench.main's own parser (argparse hands a
    # REMAINDER positional no argument that looks like an option of the parser holding it)
    bench = sub.add_parser("bench", help="the GPU benchmark suite (needs PyTorch): baracuda-numba bench --only "
                           "model --out DIR", add_help=False, prefix_chars="+")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)
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
