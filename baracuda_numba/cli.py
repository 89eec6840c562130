"""Command line: baracuda-numba demo | run | list | catalog | info | bench.

Exit codes: 0 success, 1 a check failed (mismatches against the reference, stale catalogue),
2 bad arguments or an unusable environment (printed as one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .recipes import RUNNABLE, Case, check_problem, make_case

__all__ = ["main", "DEMO_OPS", "RUNNABLE"]

PROG = "baracuda-numba"


def _backend_line() -> str:
    from . import platform

    if platform.SIMULATOR:
        return (f"CUDA simulator, no GPU ({platform.REASON}): slow, small sizes; NUMBA_ENABLE_CUDASIM=0 "
                "requires a GPU instead")
    return f"GPU: {platform.backend_name()}"


# -- timing ---------------------------------------------------------------------------------------

# Calls between one pair of events: the host work of one call (argument checks, the launch) overlaps the
# GPU work of the calls queued before it, so only the first call's host time is counted, once in this many.
_BATCH = 10


def _device_ms(fn: Callable[[], object], rounds: int) -> float:
    """Median GPU milliseconds per call of ``fn`` (on the legacy default stream): after a warm-up call
    (compilation, module load), ``rounds`` batches of ``_BATCH`` back-to-back calls between CUDA events.
    The copy bandwidth and every op of the demo are timed by this one function."""
    from numba import cuda

    fn()
    cuda.synchronize()
    samples = []
    for _ in range(rounds):
        begin, end = cuda.event(), cuda.event()
        begin.record()
        for _ in range(_BATCH):
            fn()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) / _BATCH)
    return statistics.median(samples)


def _wall_ms(fn: Callable[[], object]) -> float:
    """Milliseconds of one call on the host clock (the simulator: the call is the whole work)."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _device(storage: Any, dtype: np.dtype) -> Any:
    """``storage`` (a numba device array of ``dtype``'s storage) as the ops read it: bf16 through its tagged
    view, FP8 (which numba has no dtype for) as an operand tagged with its element."""
    from .arrays import adapt, bfloat16_view
    from .vocabulary import ElementKind, element_kind

    element = element_kind(dtype)
    if element is ElementKind.BF16:
        return bfloat16_view(storage)
    if element.is_fp8:
        operand = adapt(storage, "demo", "array")
        operand.element = element
        return operand
    return storage


def _place(a: np.ndarray) -> Any:
    """A device copy of host array ``a``."""
    from numba import cuda

    from .vocabulary import element_kind

    return _device(cuda.to_device(a.view(element_kind(a.dtype).storage_dtype)), a.dtype)


def _device_out(case: Case) -> Any:
    """A preallocated device result for ``case`` (so that timing leaves out the allocation)."""
    from numba import cuda

    from .vocabulary import element_kind

    return _device(cuda.device_array(case.out_shape, element_kind(case.out_dtype).storage_dtype), case.out_dtype)


def _release() -> None:
    """Free the device memory of the arrays dropped so far (numba defers it; the simulator has none to free)."""
    from numba import cuda

    deallocations = getattr(cuda.current_context(), "deallocations", None)
    if deallocations is not None:
        deallocations.clear()


def _timed_on_device(case: Case, rounds: int) -> float:
    """Median GPU milliseconds of ``case`` on device copies of its operands, into a preallocated result."""
    arrays = {name: _place(a) for name, a in case.operands.items()}
    out = _device_out(case)
    ms = _device_ms(lambda: case.call(arrays, out), rounds)
    arrays = out = None  # the timed call's arrays, freed before the next op allocates its own
    _release()
    return ms


# The ceilings' launches: (layout, pairs in flight a thread, threads a block, blocks per SM at most; 0: covering). With
# them, every grid-stride policy of the current card's elementwise tuning (:func:`_ceiling_launches`).
_CEILING_LAUNCHES = (("resident", 4, 256, 8), ("resident", 2, 128, 1024), ("covering", 1, 128, 0),
                     ("covering", 2, 128, 0), ("covering", 4, 128, 0))


def _ceiling_launches(tuning: Any = None) -> tuple[tuple[str, int, int, int], ...]:
    """:data:`_CEILING_LAUNCHES` and the ops' own grids: each launch policy of the elementwise tuning of ``tuning``
    (a :class:`~baracuda_numba.plans.tuning.MemoryTuning`; default: the current card's) as a resident loop of its
    threads, its cap per SM and its chunks in flight (the tuning's ``unroll`` where it names none). On an H200 the
    backward ops' resident 512-thread grid read 101% of the two-input ceiling before it was one of them."""
    from dataclasses import fields

    from .plans.tuning import current_tuning
    from .registry import LaunchPolicy

    elementwise = (tuning or current_tuning()).elementwise
    policies = [getattr(elementwise, f.name) for f in fields(elementwise) if f.name.endswith("_policy")]
    own = {("resident", p.unroll or elementwise.unroll, p.threads_per_block, p.blocks_per_sm)
           for p in policies if isinstance(p, LaunchPolicy)}
    return _CEILING_LAUNCHES + tuple(sorted(own - set(_CEILING_LAUNCHES)))


def _stream_gbs(inputs: int, nbytes: int, rounds: int) -> float:
    """GB/s (bytes read + written) of the fastest loop reading ``inputs`` arrays of ``nbytes`` (1, 2 or 4) and writing
    one, timed as the ops are: the streaming kernels of :mod:`~baracuda_numba.kernels.copy` in the ops' launch shapes
    (:func:`_ceiling_launches`: resident grids, the stream policy's capped grid of short blocks, covering grids of 1,
    2 and 4 pairs a thread, and every grid of the card's elementwise tuning) and, for a copy, the driver's
    (``cuMemcpyDtoD``). One input: the memory-bound ceiling; two and four: the ceilings of the ops that read two or
    four bytes a byte they write (:func:`_ceiling_inputs`)."""
    from numba import cuda

    from .kernels.copy import covering_blocks, streaming_kernel
    from .plans.base import sm_count

    arrays = [cuda.device_array(nbytes // 8, np.uint64) for _ in range(inputs)]
    a, b, c, d = (arrays + [arrays[0]] * 3)[:4]  # the arrays a kernel does not read: `a` again
    dst = cuda.device_array_like(a)
    pairs = nbytes // 16
    sms = sm_count(cuda.get_current_device().id)
    times = []
    for layout, depth, threads, per_sm in _ceiling_launches():
        kernel = streaming_kernel(inputs, layout, depth)
        blocks = covering_blocks(pairs, threads, depth)
        if per_sm:
            blocks = min(blocks, sms * per_sm)
        times.append(_device_ms(lambda k=kernel, g=blocks, t=threads: k[g, t](dst, a, b, c, d, pairs), rounds))
    if inputs == 1:
        times.append(_device_ms(lambda: dst.copy_to_device(a), rounds))
    arrays = a = b = c = d = dst = None
    _release()
    return (inputs + 1) * (pairs * 16) / min(times) / 1e6


def _ceiling_inputs(case: Any) -> int:
    """The streaming loop whose traffic bounds ``case``'s: the fewest arrays read a written one (1, 2 or 4) that read
    at least the bytes the op reads a byte it writes (a float32 -> int8 quantize reads 4, a backward op 2, a
    dequantize a quarter: the copy)."""
    from .kernels.copy import INPUTS

    largest = max(a.size for a in case.operands.values())
    read = sum(a.nbytes for a in case.operands.values() if a.size == largest)  # the scales and zero points aside
    written = math.prod(case.out_shape) * case.out_dtype.itemsize
    return next((k for k in INPUTS if k * written >= read), INPUTS[-1])


def _compare(got: np.ndarray, expected: np.ndarray) -> tuple[int, float]:
    """``(mismatches, max |diff|)``: elements whose value differs (NaN equals NaN)."""
    g, e = np.asarray(got).astype(np.float64), np.asarray(expected).astype(np.float64)
    if g.shape != e.shape:
        return max(g.size, e.size), math.inf
    same = (g == e) | (np.isnan(g) & np.isnan(e))
    with np.errstate(invalid="ignore"):
        diff = np.abs(g - e)
    finite = diff[np.isfinite(diff)]
    return int(same.size - same.sum()), (float(finite.max()) if finite.size else 0.0)


# -- demo -----------------------------------------------------------------------------------------

# One op of each family; the per-tensor ops are all shown.
DEMO_OPS = ("quantize_per_tensor", "dequantize_per_tensor", "fake_quantize", "quantize_per_tensor_backward",
            "fake_quantize_backward", "dequantize_per_tensor_backward", "quantize_per_channel",
            "dequantize_per_channel", "quantize_per_token", "quantize_per_group", "dequantize_per_group",
            "dynamic_range_quantize", "quantized_linear")
# The demo's problems are rows of this many columns (fewer on the simulator, which is slow).
DEMO_COLUMNS, SIMULATED_COLUMNS = 4096, 128
# Elements the GPU demo times each memory-bound op on, and the copy it compares with: 512 MiB of f32,
# ten times a Hopper L2, so that every op streams from memory (the bf16 quantize moves 384 MiB).
TIMED_ELEMENTS = 1 << 27
LINEAR_TIMED = 4096  # the W8A8 linear is timed at M = N = K = this


def _demo_shape(size: int, columns: int) -> tuple[int, int]:
    return -(-size // columns), columns


def _check_demo_args(args: argparse.Namespace, columns: int) -> list:
    from .errors import InvalidProblem, problem_message
    from .vocabulary import element_kind

    where = f"{PROG} demo"
    if args.size is not None and args.size < 1:
        raise InvalidProblem(problem_message(where, "--size", "a positive number of elements", args.size))
    if args.group_size < 1 or columns % args.group_size:
        raise InvalidProblem(problem_message(where, "--group-size", f"a positive divisor of the row length "
                                             f"({columns})", args.group_size))
    kinds = []
    for name in args.dtype:
        try:
            kind = element_kind(name)
        except TypeError:
            kind = None
        if kind is None or not kind.is_float or kind.is_fp8:
            raise InvalidProblem(problem_message(where, "--dtype", "float dtypes (float16, bfloat16, float32, "
                                                 "float64)", name))
        kinds.append(kind)
    return kinds


def _demo(args: argparse.Namespace) -> int:
    from . import platform
    from .vocabulary import ElementKind

    simulated = platform.SIMULATOR
    columns = SIMULATED_COLUMNS if simulated else DEMO_COLUMNS
    kinds = _check_demo_args(args, columns)
    size = args.size or (2048 if simulated else 1 << 20)
    shape = _demo_shape(size, columns)
    rounds = 5
    print(f"baracuda-numba demo on the {_backend_line()}")
    print(f"checked against the NumPy float64 reference on {shape[0]} x {shape[1]} elements"
          + (f" (--size {size} rounded up to whole rows of {columns})" if size % columns else "")
          + ("" if simulated else f"; timed on {TIMED_ELEMENTS // DEMO_COLUMNS} x {DEMO_COLUMNS}"))
    ceilings: dict[int, float] = {}
    if not simulated:
        mib = 4 * TIMED_ELEMENTS >> 20
        ceilings = {inputs: _stream_gbs(inputs, 4 * TIMED_ELEMENTS, rounds) for inputs in (1, 2, 4)}
        print(f"device-to-device copy of {mib} MiB (bytes read + written): {ceilings[1]:.0f} GB/s, the memory-bound "
              "ceiling")
        print(f"two {mib} MiB arrays read, one written: {ceilings[2]:.0f} GB/s, the ceiling of the ops that read two "
              "bytes a byte they write (the backward ops, bf16 -> int8)")
        print(f"four {mib} MiB arrays read, one written: {ceilings[4]:.0f} GB/s, the ceiling of the ops that read four "
              "(f32 -> int8)")
    header = (f"{'op':<32}{'dtypes':<11}{'mismatches':>11}{'max|diff|':>11}{'quant RMSE':>12}{'ms':>10}"
              f"{'GB/s':>8}{'% copy':>8}{'TOPS':>8}")
    print(header)
    print("-" * len(header))
    failures = 0
    for kind in kinds:
        for op in DEMO_OPS:
            linear = op.endswith("linear")
            op_shape = (4, 32) if linear and simulated else ((256, 1024) if linear else shape)
            case = make_case(op, kind, ElementKind.S8, op_shape, args.group_size if op.endswith("group") else None,
                             np.random.default_rng(0))
            began = time.perf_counter()
            got = np.asarray(case.call(case.operands, None))
            elapsed_ms = (time.perf_counter() - began) * 1e3
            mismatches, max_diff = _compare(got, case.expected())
            failures += mismatches > 0
            rmse = ""
            if case.exact is not None:  # the error quantization itself introduces
                rmse = f"{np.sqrt(np.mean((got.astype(np.float64) - case.exact) ** 2)):.2e}"
            ms_text = gbps = pct = tops = ""
            if simulated:
                ms_text = f"{elapsed_ms:.2f}"  # one simulated call is slow enough to time alone
            elif linear:
                m = n = k = LINEAR_TIMED
                timed = make_case(op, kind, ElementKind.S8, (m, k), None, np.random.default_rng(0))
                ms = _timed_on_device(timed, rounds)
                ms_text, tops = f"{ms:.3f}", f"{2 * m * n * k / ms / 1e9:.0f}"
            else:
                timed = make_case(op, kind, ElementKind.S8, _demo_shape(TIMED_ELEMENTS, DEMO_COLUMNS),
                                  args.group_size if op.endswith("group") else None, np.random.default_rng(0))
                ms = _timed_on_device(timed, rounds)
                rate = timed.bytes_moved / ms / 1e6
                inputs = _ceiling_inputs(timed)
                # The ceiling measured again next to the row, the best kept: on one H200 the copy read 4064 and
                # 4147 GB/s in two runs minutes apart, and a row timed in a fast moment read 101% of a slow one.
                ceilings[inputs] = ceiling = max(ceilings[inputs], _stream_gbs(inputs, 4 * TIMED_ELEMENTS, rounds))
                ms_text, gbps, pct = f"{ms:.3f}", f"{rate:.0f}", f"{100 * rate / ceiling:.0f}%"
            print(f"{op:<32}{case.label:<11}{mismatches:>11}{max_diff:>11.2e}{rmse:>12}{ms_text:>10}{gbps:>8}"
                  f"{pct:>8}{tops:>8}")
    note = ("simulator: host arrays, one call timed on the host clock, simulation included" if simulated else
            f"ms: median over {rounds} batches of {_BATCH} back-to-back calls between CUDA events, on device "
            "arrays into a preallocated output, timed as the copy is; GB/s counts bytes read + written once, "
            "% copy against the streaming loop of the row's read:write mix (the copy; two or four arrays read a "
            "written one for ops that read two or four bytes a byte they write), the best of its measurements "
            "above and next to each row so far; "
            f"quantized_linear is timed at M = N = K = {LINEAR_TIMED} (activation quantize + GEMM)")
    if ceilings:
        print(f"\nbest ceilings measured: copy {ceilings[1]:.0f} GB/s, two arrays read {ceilings[2]:.0f} GB/s, four "
              f"{ceilings[4]:.0f} GB/s")
    print(f"\n{note}. mismatches: elements differing from the NumPy float64 reference (README, Semantics); "
          "quant RMSE: error of the quantized result against unquantized float64 math.")
    return 1 if failures else 0


# -- run ------------------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    from . import platform

    where = f"{PROG} run"
    kind, q = _option_kind(args.dtype, "--dtype", where), _option_kind(args.out_dtype, "--out-dtype", where)
    linear = args.op.endswith("linear")
    shape = tuple(args.shape) if args.shape else (((4, 32) if linear else (16, 128)) if platform.SIMULATOR
                                                   else (4096, 4096))
    if args.repeats < 1:
        from .errors import InvalidProblem, problem_message

        raise InvalidProblem(problem_message(where, "--repeats", ">= 1", args.repeats))
    group_size = check_problem(args.op, kind, q, shape, args.group_size, where)
    case = make_case(args.op, kind, q, shape, group_size, np.random.default_rng(0))
    got = np.asarray(case.call(case.operands, None))
    mismatches, max_diff = _compare(got, case.expected())
    if platform.SIMULATOR:
        ms, how = _wall_ms(lambda: case.call(case.operands, None)), "one call on the host clock, simulated"
    else:
        ms = _timed_on_device(case, args.repeats)
        how = f"median of {args.repeats} batches of {_BATCH} calls on device arrays into a preallocated output"
    grid = "" if q.short in case.label else f" (quantized element {q.short})"
    groups = f", group_size={group_size}" if group_size else ""
    print(f"{args.op} {case.label}{grid} shape={shape}{groups} on the {_backend_line()}")
    print(f"mismatches against the NumPy reference: {mismatches} of {got.size}; max |diff| {max_diff:.3e}")
    rate = "" if platform.SIMULATOR or linear else f", {case.bytes_moved / ms / 1e6:.0f} GB/s"
    print(f"time: {ms:.3f} ms ({how}){rate}")
    return 1 if mismatches else 0


def _option_kind(name: str, option: str, where: str):
    from .errors import InvalidProblem, problem_message
    from .vocabulary import element_kind

    try:
        return element_kind(name)
    except TypeError:
        raise InvalidProblem(problem_message(where, option, "a dtype name (float32, bfloat16, int8, "
                                             "float8_e4m3fn, int4, ...)", name)) from None


# -- list, catalog, info, bench -------------------------------------------------------------------


def _bench(args: argparse.Namespace) -> int:
    from . import bench

    return bench.run(args)


def _list(args: argparse.Namespace) -> int:
    from . import registry

    rows = [e for e in registry.entries() if not args.kind or e.kind.name.lower() == args.kind.lower()]
    if not rows:
        kinds = sorted({e.kind.name.lower() for e in registry.entries()})
        print(f"{PROG} list: --kind expected one of {kinds}, got {args.kind!r}", file=sys.stderr)
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
            print(f"{PROG} catalog: {', '.join(stale)} in {directory} are stale; run `{PROG} catalog`",
                  file=sys.stderr)
            return 1
        print(f"{directory}: up to date")
        return 0
    for path in catalog.write_catalog(directory):
        print(f"wrote {path}")
    return 0


def _info(args: argparse.Namespace) -> int:
    import numba

    from . import __version__, registry

    print(f"baracuda-numba {__version__}")
    print(f"backend: {_backend_line()}")
    print(f"numba {numba.__version__}, numba-cuda {_dist_version('numba-cuda')}, cuda-bindings "
          f"{_dist_version('cuda-bindings')}, numpy {np.__version__}")
    print(f"registry: {len(registry.entries())} kernels")
    return 0


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


# -- the parser -----------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line on stderr, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    from . import bench

    parser = _Parser(prog=PROG, description="Quantization kernels for NVIDIA GPUs in numba-cuda: check and time "
                     "them from the command line.", epilog="Exit codes: 0 success, 1 a check failed, 2 bad "
                     "arguments or no usable device (one line on stderr).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="every per-tensor op and one op of each other family against the "
                          "reference, timed", description="Run every per-tensor op and one op of each other family "
                          "(per channel, per token, per group, dynamic range, the W8A8 linear) on generated data, "
                          "check each against the NumPy float64 reference and time it. On a GPU each memory-bound "
                          f"op is timed on {TIMED_ELEMENTS >> 20} Mi elements next to a device-to-device copy timed "
                          "the same way; without a GPU it runs on the CUDA simulator with small sizes.")
    demo.add_argument("--size", type=int, default=None, help="elements checked against the reference, rounded up "
                      f"to whole rows of {DEMO_COLUMNS} ({SIMULATED_COLUMNS} on the simulator); default 2^20 on a "
                      "GPU, 2048 on the simulator")
    demo.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], metavar="DTYPE",
                      help="float dtypes to run (default: float32 bfloat16)")
    demo.add_argument("--group-size", type=int, default=32, help="group size of the per-group ops (default 32)")
    demo.set_defaults(func=_demo)
    run = sub.add_parser("run", help="one op on generated data against the reference, timed",
                         description="Run one op on generated data, count its mismatches against the NumPy "
                         "reference and time it (exit 1 on a mismatch).")
    run.add_argument("op", choices=RUNNABLE, metavar="OP", help="one of: " + ", ".join(RUNNABLE))
    run.add_argument("--dtype", default="float32", help="the float dtype (default float32)")
    run.add_argument("--out-dtype", default="int8", help="the quantized dtype the op produces, reads, simulates or "
                     "differentiates: int8, uint8, float8_e4m3fn, float8_e5m2, or int4 / uint4 for the per-group, "
                     "fake-quantize and dynamic-range ops (default int8)")
    run.add_argument("--shape", type=int, nargs="+", default=None, metavar="DIM",
                     help="the data's shape (M K for the linear ops); default 4096 4096 (16 128 on the simulator)")
    run.add_argument("--group-size", type=int, default=None, help="group size of the per-group and 4-bit ops "
                     "(default 32); refused by ops without groups")
    run.add_argument("--repeats", type=int, default=20, help="timed batches on a GPU, median kept (default 20)")
    run.set_defaults(func=_run)
    lst = sub.add_parser("list", help="the registry as a table", description="Print the kernel registry.")
    lst.add_argument("--kind", default=None, help="only this QuantizeKind (for example per_tensor)")
    lst.set_defaults(func=_list)
    cat = sub.add_parser("catalog", help="write registry/catalog.json and registry/README.md",
                         description="Write (or with --check, compare) the generated registry catalogue.")
    cat.add_argument("--output", default="registry", help="directory (default: registry)")
    cat.add_argument("--check", action="store_true", help="exit 1 if the files there are stale")
    cat.set_defaults(func=_catalog)
    info = sub.add_parser("info", help="backend, versions and registry size",
                          description="Print the backend (GPU or simulator), versions and registry size.")
    info.set_defaults(func=_info)
    bench_parser = sub.add_parser("bench", help="the GPU benchmark suite against PyTorch (needs a GPU and PyTorch)",
                                  description=" ".join(bench.__doc__.split("\n\n")[0].split()))
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(func=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or an argument error (2, already printed)
        return int(exc.code or 0)
    from . import platform
    from .errors import BaracudaError

    with warnings.catch_warnings():
        # Each command names its backend in its output (_backend_line): the library's no-GPU warning would
        # only repeat it, quoting a line of this package.
        warnings.filterwarnings("ignore", message=platform.SIMULATOR_WARNING, category=RuntimeWarning)
        try:
            return args.func(args)
        except (BaracudaError, TypeError, ValueError) as exc:
            prefix, message = f"{PROG} {args.command}", " ".join(str(exc).split())  # one line
            print(message if message.startswith(prefix) else f"{prefix}: {message}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
