"""The command line: exit codes and output."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from baracuda_numba import cli, platform
from baracuda_numba.plans.tuning import TUNINGS


def test_demo_shows_every_family_and_finds_no_mismatch(capsys):
    assert cli.main(["demo", "--size", "256", "--dtype", "float32", "float16"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] and
            line.split()[0] in cli.DEMO_OPS]
    assert [row[0] for row in rows] == list(cli.DEMO_OPS) * 2
    assert {"quantize_per_channel", "quantize_per_token", "quantize_per_group", "dynamic_range_quantize",
            "quantized_linear"} <= set(cli.DEMO_OPS)
    assert [row for row in rows if row[2] != "0"] == []  # mismatches against the reference
    assert [row[1] for row in rows[:2]] == ["f32->s8", "s8->f32"]


def test_demo_reports_mismatches(monkeypatch, capsys):
    from baracuda_numba import reference

    # a wrong reference: every element of quantize_per_tensor is reported, and the exit code is 1
    monkeypatch.setattr(reference, "quantize", lambda x, *args: np.full(np.shape(x), 1000))  # no int8 value
    assert cli.main(["demo", "--size", "128", "--dtype", "float32"]) == 1
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("quantize_per_tensor"))
    from baracuda_numba import platform

    rows, columns = cli._demo_shape(128, cli.SIMULATED_COLUMNS if platform.SIMULATOR else cli.DEMO_COLUMNS)
    assert row[2] == str(rows * columns)  # --size rounded up to whole rows


def test_demo_says_where_it_runs(capsys):
    from baracuda_numba import platform

    cli.main(["demo", "--size", "16", "--dtype", "float64"])
    out = capsys.readouterr().out
    assert ("simulator" in out) == platform.SIMULATOR


def test_list_and_unknown_kind(capsys):
    assert cli.main(["list", "--kind", "per_tensor"]) == 0
    assert "quantization/per_tensor/bf16->u8" in capsys.readouterr().out
    assert cli.main(["list", "--kind", "nope"]) == 2


def test_catalog_check_detects_staleness(tmp_path, capsys):
    assert cli.main(["catalog", "--output", str(tmp_path)]) == 0
    assert cli.main(["catalog", "--output", str(tmp_path), "--check"]) == 0
    (tmp_path / "README.md").write_text("old\n")
    assert cli.main(["catalog", "--output", str(tmp_path), "--check"]) == 1


def test_bad_dtype_is_one_line_exit_2(capsys):
    assert cli.main(["demo", "--size", "8", "--dtype", "int7"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "int7" in err


@pytest.mark.parametrize("op", cli.RUNNABLE)
def test_run_every_op_against_the_reference(op, capsys):
    rows, cols = (4, 32) if op.endswith("linear") else (8, 64)  # the simulated mma is slow
    assert cli.main(["run", op, "--dtype", "bfloat16", "--shape", str(rows), str(cols), "--repeats", "1"]) == 0
    assert f"mismatches against the NumPy reference: 0 of {rows * cols}" in capsys.readouterr().out


@pytest.mark.parametrize("op", ["quantize_per_tensor", "dequantize_per_channel", "quantize_per_token"])
def test_run_an_op_without_groups_on_a_row_no_group_divides(op, capsys):
    # the group size's default (32) concerns the per-group ops only: 100 columns are fine for the others
    assert cli.main(["run", op, "--shape", "16", "100", "--repeats", "1"]) == 0
    assert "mismatches against the NumPy reference: 0 of 1600" in capsys.readouterr().out


def _role(op: str) -> str:
    if op.startswith("dequantize") and not op.endswith("backward"):
        return "dequantize"
    if op.endswith("backward") or op.startswith("fake"):
        return "float"
    return "quantize"


# Every (op, quantized element) pair the registry holds, FP8 and packed 4-bit included.
_QUANTIZED = {"int8": "s8", "uint8": "u8", "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2", "int4": "s4",
              "uint4": "u4"}
_GROUPED_4BIT = {"quantize_per_group", "dequantize_per_group", "quantize_per_group_backward",
                 "dequantize_per_group_backward", "fake_quantize", "fake_quantize_backward", "dynamic_range_quantize"}
_PAIRS = [(op, name) for op in cli.RUNNABLE if not op.endswith("linear") for name in _QUANTIZED
          if not (name in ("int4", "uint4") and op not in _GROUPED_4BIT)]


@pytest.mark.parametrize(("op", "out_dtype"), _PAIRS)
def test_run_every_op_and_quantized_element_with_its_dtype_label(op, out_dtype, capsys):
    assert cli.main(["run", op, "--dtype", "float16", "--out-dtype", out_dtype, "--shape", "4", "64",
                     "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "mismatches against the NumPy reference: 0 of " in out
    q = _QUANTIZED[out_dtype] + (" (packed)" if out_dtype in ("int4", "uint4") else "")
    label = out.split()[1]
    if _role(op) == "quantize":
        assert out.startswith(f"{op} f16->{q} shape=")
    elif _role(op) == "dequantize":
        assert out.startswith(f"{op} {q}->f16 shape=")
    else:  # fake quantize and every backward: float in, float out, the quantized element named apart
        assert label == "f16->f16" and f"(quantized element {_QUANTIZED[out_dtype]})" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "quantize_per_tensor", "--dtype", "int8"], "--dtype expected a float dtype"),
    (["run", "quantize_per_tensor", "--dtype", "float8_e4m3fn"], "--dtype expected a float dtype"),
    (["run", "quantize_per_tensor", "--dtype", "nope"], "--dtype expected a dtype name"),
    (["run", "quantize_per_tensor", "--shape", "16", "-3"], "--shape expected positive dimensions, got 16 -3"),
    (["run", "quantize_per_tensor", "--shape", "0"], "--shape expected positive dimensions, got 0"),
    (["run", "quantize_per_tensor", "--group-size", "32"], "--group-size expected nothing (quantize_per_tensor has "
                                                           "no groups), got 32"),
    (["run", "quantize_per_group", "--shape", "4", "30"], "--group-size expected a positive divisor of the last "
                                                          "dimension (30), got 32"),
    (["run", "quantize_per_group", "--shape", "4", "32", "--group-size", "0"], "a positive divisor"),
    (["run", "quantize_per_group", "--shape", "4", "30", "--out-dtype", "int4", "--group-size", "15"],
     "a positive even divisor"),
    (["run", "quantize_per_group", "--shape", "4", "31", "--out-dtype", "int4"], "an even last dimension"),
    (["run", "quantize_per_tensor", "--out-dtype", "int4"], "--out-dtype expected one of int8, uint8, "
                                                            "float8_e4m3fn, float8_e5m2 for quantize_per_tensor"),
    (["run", "quantized_linear", "--out-dtype", "float8_e4m3fn"], "--out-dtype expected int8"),
    (["run", "quantized_linear", "--shape", "4", "8", "16"], "--shape expected two dimensions M K"),
    (["run", "quantize_per_tensor", "--repeats", "0"], "--repeats expected >= 1"),
    (["run", "nope"], "invalid choice"),
    (["demo", "--size", "0"], "--size expected a positive number of elements, got 0"),
    (["demo", "--size", "-4"], "--size expected a positive number of elements, got -4"),
    (["demo", "--group-size", "48"], "--group-size expected a positive divisor of the row length"),
    (["demo", "--size", "x"], "invalid int value"),
    (["bench", "--only", "nope"], "invalid choice"),
    (["frob"], "invalid choice"),
])
def test_bad_arguments_are_one_line_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert err.startswith("baracuda-numba")


def test_demo_rounds_a_small_size_up_to_a_whole_row(capsys):
    assert cli.main(["demo", "--size", "5", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    columns = cli.SIMULATED_COLUMNS if platform.SIMULATOR else cli.DEMO_COLUMNS
    assert f"on 1 x {columns} elements (--size 5 rounded up to whole rows of {columns})" in out


@pytest.mark.parametrize("command", ["demo", "run", "list", "catalog", "info", "bench", None])
def test_every_command_has_a_help_without_markup(command, capsys):
    assert cli.main([command, "--help"] if command else ["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: baracuda-numba")
    assert "``" not in out and ":func:" not in out and ":mod:" not in out


def test_bench_takes_its_documented_options():
    from baracuda_numba import bench

    args = cli._parser().parse_args(["bench", "--only", "per_tensor", "dynamic", "linear", "--out", "somewhere",
                                     "--dtypes", "f32", "bf16", "--log2n", "24", "--repeats", "3"])
    assert (args.only, args.out, args.dtypes, args.log2n, args.repeats) == (
        ["per_tensor", "dynamic", "linear"], "somewhere", ["f32", "bf16"], 24, 3)
    assert args.func is cli._bench
    assert cli._parser().parse_args(["bench"]).only == [n for n, f in bench.FAMILIES.items() if f.default]
    assert cli._parser().parse_args(["bench", "--only", "model"]).only == ["model"]


def test_the_cli_quotes_no_source_line_and_names_the_simulator():
    # A fresh process with no NUMBA_ENABLE_CUDASIM: the library's no-GPU warning is the command's to replace.
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-m", "baracuda_numba", "run", "quantize_per_tensor", "--shape", "4", "8"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert ("on the CUDA simulator, no GPU (" in done.stdout) == platform.SIMULATOR


@pytest.mark.gpu
@pytest.mark.skipif(platform.SIMULATOR, reason="needs a real GPU: the demo times ops only there")
def test_demo_on_a_gpu_reads_no_row_above_the_copy(capsys):
    assert cli.main(["demo", "--dtype", "float32", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "device-to-device copy of 512 MiB" in out and "two 512 MiB arrays read, one written" in out
    assert "four 512 MiB arrays read, one written" in out and "best ceilings measured: copy" in out
    percents = [float(word[:-1]) for line in out.splitlines() if line.split()[:1] and line.split()[0] in cli.DEMO_OPS
                for word in line.split() if word.endswith("%")]
    assert len(percents) == 2 * (len(cli.DEMO_OPS) - 1)  # every memory-bound row, both dtypes
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        # other test processes share the GPU: the copy and the rows are timed under different loads (the copy read
        # 2626 GB/s on an H200 beside 7 workers, the rows up to 153% of it), so the bound holds only for a run alone
        # (pytest -p no:xdist tests/test_cli.py -k demo_on_a_gpu)
        return
    # Each row's ceiling is measured again next to it and the best kept (one H200's copy read 4064 and 4147 GB/s in two
    # runs minutes apart, and fake_quantize f32 101% of the slower one).
    # Timed as the copy is (the fastest of the driver's copy and the copy loops in the ops' own grids: cli._stream_gbs;
    # the two-input rows against the same loops reading two arrays), so a row above it is a timing error: allocations
    # timed with the op read 116-130%; against the driver's copy alone an H200's elementwise rows read 104-107%, against
    # the copy an H100's backward ops (two arrays in, one out) 102-105%, and an H200's backward ops 101% of loops
    # without their own 512-thread resident grid. The rows print whole percents: 100 is at most 100.49%.
    assert max(percents) <= 100, out


@pytest.mark.parametrize(("op", "out_dtype", "dtype"), [
    ("quantize_per_tensor", "float8_e4m3fn", "bfloat16"), ("dequantize_per_token", "float8_e5m2", "float32"),
    ("quantize_per_group", "int4", "bfloat16"), ("dequantize_per_group", "uint4", "float16"),
    ("fake_quantize_backward", "int8", "bfloat16"), ("dynamic_range_quantize", "float8_e4m3fn", "float32"),
    ("quantized_linear", "int8", "bfloat16")])
def test_the_timed_path_writes_the_reference_into_its_preallocated_device_output(op, out_dtype, dtype):
    # What demo and run time on a GPU: device copies of the operands, a preallocated result (bf16 and FP8 as
    # tagged views), the same call. Under the simulator the device arrays are simulated ones.
    from baracuda_numba import recipes
    from baracuda_numba.arrays import Operand
    from baracuda_numba.vocabulary import element_kind

    kind, q = element_kind(dtype), element_kind(out_dtype)
    shape = (4, 32) if op.endswith("linear") else (4, 64)
    case = recipes.make_case(op, kind, q, shape, recipes.check_problem(op, kind, q, shape, None),
                             np.random.default_rng(0))
    arrays = {name: cli._place(a) for name, a in case.operands.items()}
    out = cli._device_out(case)
    case.call(arrays, out)
    storage = out.obj if isinstance(out, Operand) else getattr(out, "storage", out)
    assert cli._compare(storage.copy_to_host().view(case.out_dtype), case.expected()) == (0, 0.0)
    assert isinstance(cli._timed_on_device(case, 1), float)


def test_info_and_bench_without_a_gpu(capsys):
    assert cli.main(["info"]) == 0
    assert "registry:" in capsys.readouterr().out
    if platform.SIMULATOR:
        assert cli.main(["bench", "--only", "linear"]) == 2
        assert capsys.readouterr().err == "baracuda-numba bench: needs a CUDA GPU and PyTorch with CUDA\n"


def _forbid_simulator(*command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, timeout=300)


needs_no_gpu = pytest.mark.skipif(platform.probe() is None,
                                  reason="a GPU is present: NUMBA_ENABLE_CUDASIM=0 runs on it")


@needs_no_gpu
@pytest.mark.parametrize("command", [["demo"], ["info"], ["run", "quantize_per_tensor"]])
def test_cli_without_a_gpu_and_the_simulator_forbidden_is_one_line_exit_2(command):
    done = _forbid_simulator("-m", "baracuda_numba", *command)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "NUMBA_ENABLE_CUDASIM=0 forbids the simulator" in done.stderr


@needs_no_gpu
def test_library_without_a_gpu_raises_device_unavailable():
    code = """
import numpy as np, baracuda_numba as bn
for call in (lambda: bn.quantize_per_tensor(np.zeros(4, np.float32), 0.1),
             lambda: bn.FakeQuantizePlan.select(bn.FakeQuantizeDescriptor(
                 numel=4, q_min=-128, q_max=127, input_element="f32"))):
    try:
        call()
    except bn.DeviceUnavailable as exc:
        assert isinstance(exc, RuntimeError) and "device expected a CUDA GPU" in str(exc), exc
        print("raised", str(exc).split(":")[0])
    else:
        raise SystemExit("no DeviceUnavailable")
"""
    done = _forbid_simulator("-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["raised", "quantize_per_tensor", "raised", "FakeQuantizePlan"]
    assert "Traceback" not in done.stderr


def test_no_user_facing_text_points_to_the_unshipped_spec():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [*root.joinpath("baracuda_numba").rglob("*.py"), *root.joinpath("notebooks").glob("*.ipynb"),
             root / "README.md"]
    assert not [str(f.relative_to(root)) for f in files if "SPEC" in f.read_text()]


@pytest.mark.parametrize("pairs", [0, 5, 37, 64])
@pytest.mark.parametrize(("layout", "depth"), sorted({launch[:2] for tuning in TUNINGS.values()
                                                     for launch in cli._ceiling_launches(tuning)}))
@pytest.mark.parametrize("inputs", [1, 2, 4])
def test_the_demo_ceiling_kernels_stream_every_pair(inputs, layout, depth, pairs):
    # the demo's ceilings (cli._stream_gbs) time these kernels: in each layout and depth the unrolled loop and its
    # tail together write every pair, from every array read (and never past the last pair)
    from numba import cuda

    from baracuda_numba.kernels.copy import covering_blocks, streaming_kernel

    sources = [np.arange(2 * pairs, dtype=np.uint64) * np.uint64(0x0101010101 + 0x7000000003 * k) + np.uint64(k + 1)
               for k in range(4)]
    a, b, c, d = (cuda.to_device(x) for x in sources)
    d_dst = cuda.to_device(np.full(2 * pairs + 2, 7, dtype=np.uint64))  # a pair past the end stays untouched
    blocks = covering_blocks(pairs, 4, depth) if layout == "covering" else 2
    streaming_kernel(inputs, layout, depth)[blocks, 4](d_dst, a, b, c, d, pairs)
    expected = np.bitwise_xor.reduce(sources[:inputs], axis=0) if pairs else sources[0]
    expected = np.concatenate([expected, np.full(2, 7, dtype=np.uint64)])
    np.testing.assert_array_equal(d_dst.copy_to_host(), expected)


@pytest.mark.parametrize("card", sorted(TUNINGS))
def test_the_demo_ceilings_time_every_grid_of_the_cards_elementwise_tuning(card):
    # a row timed in a grid of its own that the ceilings lack can read above 100% (the H200's backward ops, 101%)
    elementwise = TUNINGS[card].elementwise
    launches = cli._ceiling_launches(TUNINGS[card])
    assert set(cli._CEILING_LAUNCHES) <= set(launches)
    for policy in (elementwise.elementwise_policy, elementwise.fp8_quantize_policy, elementwise.stream_policy,
                   elementwise.tensor_dequantize_policy, elementwise.segment_quantize_policy,
                   elementwise.channel_vector_policy):
        assert ("resident", policy.unroll or elementwise.unroll, policy.threads_per_block,
                policy.blocks_per_sm) in launches, policy


@pytest.mark.parametrize(("op", "kind", "inputs"), [
    ("quantize_per_tensor", "f32", 4), ("quantize_per_channel", "f32", 4), ("dynamic_range_quantize", "f32", 4),
    ("quantize_per_tensor", "bf16", 2), ("quantize_per_token", "bf16", 2), ("quantize_per_tensor_backward", "f32", 2),
    ("fake_quantize_backward", "bf16", 2), ("fake_quantize", "f32", 1), ("dequantize_per_tensor", "f32", 1),
    ("dequantize_per_group", "bf16", 1), ("dequantize_per_tensor_backward", "f32", 1)])
def test_each_demo_row_is_bounded_by_the_loop_of_its_read_write_mix(op, kind, inputs):
    # HBM reads cost less than writes: a row reading four bytes a byte it writes outruns a copy (an H200's f32 -> int8
    # quantize read 100.5% of it), so each row's ceiling is the loop reading at least as many bytes a byte written
    from baracuda_numba.recipes import make_case
    from baracuda_numba.vocabulary import ElementKind, element_kind

    case = make_case(op, element_kind(kind), ElementKind.S8, (8, 64), 32 if op.endswith("group") else None,
                     np.random.default_rng(0))
    assert cli._ceiling_inputs(case) == inputs
