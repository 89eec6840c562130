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


def _on_device(a: np.ndarray, kind):
    """``a`` as a device array of ``kind`` (unchanged under the simulator, where ops stage host arrays)."""
    from numba import cuda

    from . import platform

    if platform.SIMULATOR:
        return a
    if kind.short == "bf16":
        from .arrays import bfloat16_view

        return bfloat16_view(cuda.to_device(a.view(kind.storage_dtype)))
    return cuda.to_device(a)


class _Case:
    """One demo row: the op on host arrays (checked against ``expected``), the same op on device arrays
    (timed on a GPU), the bytes it must move (GB/s) or the operations it does (TOPS), and the arrays
    whose quantization error the row reports (``error_of(got)`` -> RMSE)."""

    def __init__(self, op: str, dtypes: str, run_host, expected, run_device=None, nbytes: int = 0,
                 ops: int = 0, error_of=None) -> None:
        self.op, self.dtypes, self.run_host, self.expected = op, dtypes, run_host, expected
        self.run_device, self.nbytes, self.ops, self.error_of = run_device, nbytes, ops, error_of


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    return float(np.sqrt(np.mean(d[np.isfinite(d)] ** 2))) if d.size else 0.0


def _per_tensor_cases(kind, x, dy, q, scale: float, zero_point: int) -> list[_Case]:
    """The six per-tensor ops on the flat ``x``."""
    from . import ops, reference

    q_range, n, f = (-128, 127), x.size, kind.itemsize
    x_dev = _on_device(x, kind)
    return [
        _Case("quantize_per_tensor", f"{kind.short}->s8", lambda: ops.quantize_per_tensor(x, scale, zero_point),
              reference.quantize(x, scale, zero_point, *q_range, np.int8),
              lambda: ops.quantize_per_tensor(x_dev, scale, zero_point), (f + 1) * n,
              error_of=lambda got: _rmse(reference.dequantize(got, scale, zero_point, np.float64), x)),
        _Case("dequantize_per_tensor", f"s8->{kind.short}",
              lambda: ops.dequantize_per_tensor(q, scale, zero_point, dtype=kind),
              reference.dequantize(q, scale, zero_point, kind.numpy_dtype)),
        _Case("fake_quantize", kind.short, lambda: ops.fake_quantize(x, scale, zero_point),
              reference.fake_quantize(x, scale, zero_point, *q_range),
              lambda: ops.fake_quantize(x_dev, scale, zero_point), 2 * f * n, error_of=lambda got: _rmse(got, x)),
        _Case("quantize_per_tensor_backward", kind.short,
              lambda: ops.quantize_per_tensor_backward(dy, x, scale, zero_point),
              reference.quantize_backward(dy, x, scale, zero_point, *q_range)),
        _Case("fake_quantize_backward", kind.short, lambda: ops.fake_quantize_backward(dy, x, scale, zero_point),
              reference.fake_quantize_backward(dy, x, scale, zero_point, *q_range)),
        _Case("dequantize_per_tensor_backward", kind.short, lambda: ops.dequantize_per_tensor_backward(dy, scale),
              reference.dequantize_backward(dy, scale)),
    ]


DEMO_COLUMNS = 64  # the row length of the matrix the per-axis, dynamic and linear rows use
DEMO_GROUP = 32


def _linear_problem(kind, m: int, k: int, n: int) -> tuple:
    """``x [m, k]``, an int8 weight ``[n, k]`` with absmax per-channel scales, the float result of the
    first rows (without activation rounding) and how many rows are checked against the reference
    (at most 16: the int64 NumPy matmul of a large GEMM would dominate the demo; rows are independent)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((m, k)).astype(kind.numpy_dtype)
    w_float = rng.standard_normal((n, k))
    w_scale = (np.abs(w_float).max(axis=1) / 127).astype(np.float32)
    w_q = np.rint(w_float / w_scale[:, None].astype(np.float64)).clip(-127, 127).astype(np.int8)
    checked = min(m, 16)
    y_float = x[:checked].astype(np.float64) @ (w_q.astype(np.float64) * w_scale[:, None]).T
    return x, w_q, w_scale, y_float, checked


def _family_cases(kind, x2: np.ndarray, linear: tuple[int, int, int]) -> list[_Case]:
    """One op of each other family on the ``[rows, DEMO_COLUMNS]`` matrix ``x2`` with absmax scales, and
    the W8A8 linear of shape ``linear = (M, K, N)``."""
    from . import ops, reference
    from .reference import dynamic as dynamic_ref
    from .reference import linear as linear_ref

    rows = x2.shape[0]
    n, f = x2.size, kind.itemsize
    m = np.float64 if kind.short == "f64" else np.float32  # scales in the math precision
    wide = x2.astype(np.float64)
    channel_scales = (np.abs(wide).max(axis=0) / 127).astype(m)  # one per column: axis 1
    token_scales = (np.abs(wide).max(axis=1) / 127).astype(m)
    group_scales = (np.abs(wide.reshape(rows, -1, DEMO_GROUP)).max(axis=2) / 127).astype(m).reshape(-1)
    expand = {"channel": reference.expand_channels(channel_scales, x2.shape, 1),
              "token": reference.expand_tokens(token_scales, x2.shape),
              "group": reference.expand_groups(group_scales, x2.shape, DEMO_GROUP)}
    x_dev = _on_device(x2, kind)
    dev = {name: _plain_device(v)
           for name, v in (("channel", channel_scales), ("token", token_scales), ("group", group_scales))}

    def quantize_error(scales):
        return lambda got: _rmse(reference.dequantize(got, scales, 0, np.float64), wide)

    xm, w_q, w_scale, y_float, checked = _linear_problem(kind, *linear)
    xm_dev, wq_dev, ws_dev = _on_device(xm, kind), _plain_device(w_q), _plain_device(w_scale)
    lm, lk, ln = linear
    return [
        _Case("quantize_per_channel", f"{kind.short}->s8",
              lambda: ops.quantize_per_channel(x2, channel_scales, None, 1),
              reference.quantize(x2, expand["channel"], 0, -128, 127, np.int8),
              lambda: ops.quantize_per_channel(x_dev, dev["channel"], None, 1), (f + 1) * n,
              error_of=quantize_error(expand["channel"])),
        _Case("quantize_per_token", f"{kind.short}->s8", lambda: ops.quantize_per_token(x2, token_scales),
              reference.quantize(x2, expand["token"], 0, -128, 127, np.int8),
              lambda: ops.quantize_per_token(x_dev, dev["token"]), (f + 1) * n,
              error_of=quantize_error(expand["token"])),
        _Case(f"quantize_per_group (g={DEMO_GROUP})", f"{kind.short}->s8",
              lambda: ops.quantize_per_group(x2, group_scales, None, DEMO_GROUP),
              reference.quantize(x2, expand["group"], 0, -128, 127, np.int8),
              lambda: ops.quantize_per_group(x_dev, dev["group"], None, DEMO_GROUP), (f + 1) * n,
              error_of=quantize_error(expand["group"])),
        _Case("dynamic_range_quantize", f"{kind.short}->s8", lambda: ops.dynamic_range_quantize(x2).q,
              dynamic_ref.dynamic_range_quantize(x2, "symmetric", "token", -127, 127, np.int8)[0],
              lambda: ops.dynamic_range_quantize(x_dev), (f + 1) * n,
              error_of=lambda got: _rmse(reference.dequantize(
                  got, reference.expand_tokens(dynamic_ref.dynamic_range_params(
                      x2, "symmetric", "token", -127, 127)[0], x2.shape), 0, np.float64), wide)),
        _Case(f"quantized_linear {lm}x{lk}x{ln}", f"{kind.short}.s8",
              lambda: np.asarray(ops.quantized_linear(xm, w_q, w_scale))[:checked],
              linear_ref.quantized_linear(xm[:checked], w_q, w_scale),
              lambda: ops.quantized_linear(xm_dev, wq_dev, ws_dev), ops=2 * lm * lk * ln,
              error_of=lambda got: _rmse(got, y_float)),
    ]


def _plain_device(a: np.ndarray):
    from numba import cuda

    from . import platform

    return a if platform.SIMULATOR else cuda.to_device(a)


def _copy_bandwidth(nbytes: int, repeats: int) -> float:
    """GB/s of a device-to-device copy of ``nbytes`` (read + write), timed like the ops."""
    from numba import cuda

    src = cuda.device_array(nbytes // 4, np.float32)
    dst = cuda.device_array(nbytes // 4, np.float32)
    ms = _time_call(lambda: dst.copy_to_device(src), repeats)
    return 2 * (nbytes // 4) * 4 / ms / 1e6


def _demo(args: argparse.Namespace) -> int:
    from . import ops, platform
    from .vocabulary import element_kind

    size = args.size or (2048 if platform.SIMULATOR else 1 << 24)
    repeats = 0 if platform.SIMULATOR else 20
    rows = max(1, size // DEMO_COLUMNS)
    linear = (4, 32, 32) if platform.SIMULATOR else (4096, 4096, 4096)  # the simulated mma is slow: tiny there
    rng = np.random.default_rng(0)
    print(f"baracuda-numba demo: {size} elements ({rows} x {DEMO_COLUMNS} for the per-axis and dynamic rows), "
          f"on the {_backend_line()}")
    copy = None if platform.SIMULATOR else _copy_bandwidth(4 * size, repeats)
    if copy is not None:
        print(f"copy bandwidth (device-to-device, {4 * size / 1e6:.0f} MB, this run): {copy:.0f} GB/s")
    header = (f"{'op':<36}{'dtypes':<10}{'mismatches':>11}{'max|diff|':>11}{'quant RMSE':>12}{'ms':>10}"
              f"{'GB/s|TOPS':>11}{'% copy':>8}")
    print(header)
    print("-" * len(header))
    failures = 0
    scale, zero_point = 0.02, 3
    for name in args.dtype:
        kind = element_kind(name)
        if not kind.is_float:
            raise ValueError(f"--dtype expected a float dtype, got {name}")
        x = (rng.standard_normal(size) * 1.5).astype(kind.numpy_dtype)
        dy = rng.standard_normal(size).astype(kind.numpy_dtype)
        q = ops.quantize_per_tensor(x, scale, zero_point)
        x2 = (rng.standard_normal((rows, DEMO_COLUMNS)) * np.linspace(0.5, 4, DEMO_COLUMNS)).astype(kind.numpy_dtype)
        for case in (*_per_tensor_cases(kind, x, dy, q, scale, zero_point), *_family_cases(kind, x2, linear)):
            start = time.perf_counter()
            got = np.asarray(case.run_host())
            host_ms = (time.perf_counter() - start) * 1e3
            g, e = got.astype(np.float64), np.asarray(case.expected).astype(np.float64)
            same = (g == e) | (np.isnan(g) & np.isnan(e))
            mismatches = int(same.size - same.sum())
            failures += mismatches > 0
            diff = np.abs(g - e)
            max_diff = float(np.nanmax(diff)) if diff.size else 0.0
            rmse = f"{case.error_of(got):.3e}" if case.error_of else ""
            ms = host_ms if platform.SIMULATOR else _time_call(case.run_device or case.run_host, repeats)
            rate = share = ""
            if case.run_device is not None and not platform.SIMULATOR:
                if case.ops:
                    rate = f"{case.ops / ms / 1e9:.0f} T"
                else:
                    rate = f"{case.nbytes / ms / 1e6:.0f}"
                    share = f"{100 * case.nbytes / ms / 1e6 / copy:.0f}%"
            print(f"{case.op:<36}{case.dtypes:<10}{mismatches:>11}{max_diff:>11.2e}{rmse:>12}{ms:>10.3f}"
                  f"{rate:>11}{share:>8}")
    if platform.SIMULATOR:
        note = "ms: host arrays on the simulator (includes staging; not a speed measurement)"
    else:
        note = ("ms: median of device arrays where a rate is shown (GB/s: the bytes the op must read and write; "
                "T: tera int8 ops/s), else host round trips")
    print(f"\n{note}.\nmismatches: elements differing from the NumPy float64 reference (baracuda_numba.reference; "
          "semantics in the README's \"Semantics\" section). quant RMSE: the dequantized result against the float "
          "input (linear: against the float matmul with the dequantized weight).")
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
    demo = sub.add_parser("demo", help="one op of every family and the W8A8 linear on generated data, "
                                       "against the reference")
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
