"""The command line: exit codes and output."""

from __future__ import annotations

import pytest
from conftest import requires_gpu

from baracuda_numba import cli

DEMO_ROWS = ("quantize_per_tensor", "dequantize_per_tensor", "fake_quantize", "quantize_per_tensor_backward",
             "fake_quantize_backward", "dequantize_per_tensor_backward", "quantize_per_channel", "quantize_per_token",
             "quantize_per_group (g=32)", "dynamic_range_quantize", "quantized_linear")


def _demo_table(out: str) -> list[tuple[str, str, list[str]]]:
    """``(op, dtypes, [mismatches, max|diff|, ...])`` of every row of the demo's table."""
    rows = []
    for line in out.splitlines():
        if line[:36].strip().startswith(DEMO_ROWS) and len(line) > 46:
            rows.append((line[:36].strip(), line[36:46].strip(), line[46:].split()))
    return rows


def test_demo_shows_every_family_and_finds_no_mismatch(capsys):
    assert cli.main(["demo", "--size", "257", "--dtype", "float32", "float16"]) == 0
    out = capsys.readouterr().out
    table = _demo_table(out)
    assert len(table) == 2 * len(DEMO_ROWS)
    for expected, (op, dtypes, cells) in zip(DEMO_ROWS * 2, table, strict=True):
        assert op.startswith(expected)
        assert cells[0] == "0" and float(cells[1]) == 0.0, (op, dtypes, cells)  # mismatches, max|diff|
    assert [d for _, d, _ in table[:len(DEMO_ROWS)]][-1] == "f32.s8"
    # quantization error: fake quantize's RMSE is that of a uniform grid of step 0.02 (0.02 / sqrt(12)), plus
    # the clipped tails of N(0, 1.5); per-axis absmax scales are much finer than 0.02 here
    fq = float(dict((op, c) for op, _, c in table[:len(DEMO_ROWS)])["fake_quantize"][2])
    assert 0.02 / 12 ** 0.5 * 0.8 < fq < 1.0
    assert "SPEC" not in out and "README" in out


def test_demo_rejects_an_integer_dtype_in_one_line(capsys):
    assert cli.main(["demo", "--size", "8", "--dtype", "int8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "float dtype" in err


@requires_gpu
def test_demo_on_a_gpu_shows_rates_next_to_the_copy_bandwidth(capsys):
    assert cli.main(["demo", "--size", str(1 << 22), "--dtype", "float32", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "copy bandwidth (device-to-device" in out
    table = _demo_table(out)
    rated = [cells for op, _, cells in table if op.startswith(("quantize_per_tensor", "fake_quantize", "dynamic"))
             and not op.endswith("backward")]
    assert rated and all(cells[-1].endswith("%") for cells in rated)
    assert all(cells[-1] == "T" for op, _, cells in table if op.startswith("quantized_linear"))


def test_no_user_facing_text_points_to_the_unshipped_spec():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [*root.joinpath("baracuda_numba").rglob("*.py"), *root.joinpath("notebooks").glob("*.ipynb"),
             root / "README.md"]
    assert not [str(f) for f in files if "SPEC" in f.read_text()]


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
    assert cli.main(["run", op, "--dtype", "bfloat16", "--shape", str(rows), str(cols), "--group-size", "32",
                     "--repeats", "1"]) == 0
    assert f"mismatches against the NumPy reference: 0 of {rows * cols}" in capsys.readouterr().out


def test_run_rejects_bad_arguments_in_one_line(capsys):
    assert cli.main(["run", "quantize_per_tensor", "--dtype", "int8"]) == 2
    assert "--dtype expected a float dtype" in capsys.readouterr().err
    assert cli.main(["run", "quantize_per_group", "--shape", "4", "30", "--group-size", "32"]) == 2


def test_info_and_bench_without_a_gpu(capsys):
    from baracuda_numba import platform

    assert cli.main(["info"]) == 0
    assert "registry:" in capsys.readouterr().out
    if platform.SIMULATOR:
        assert cli.main(["bench"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def _without_a_driver() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


@pytest.mark.skipif(not _without_a_driver(), reason="needs a machine without a CUDA driver")
@pytest.mark.parametrize("code", [
    "import numpy as np, baracuda_numba as bn; bn.fake_quantize(np.ones(3, np.float32), 0.1)",
    "import numpy as np, baracuda_numba as bn; bn.quantized_linear(np.ones((2, 16), np.float32), "
    "np.ones((16, 16), np.int8), np.ones(16, np.float32))",
    "import baracuda_numba as bn; bn.FakeQuantizePlan.select(bn.FakeQuantizeDescriptor(4, -128, 127, 'float32'))",
])
def test_refused_simulator_without_a_gpu_is_one_typed_error(code):
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-c", code + "\nprint('unreachable')"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "unreachable" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("baracuda_numba.errors.DeviceUnavailable: ") and "no CUDA driver" in last
    assert "CudaSupportError" not in done.stderr and "numba/cuda" not in done.stderr


@pytest.mark.skipif(not _without_a_driver(), reason="needs a machine without a CUDA driver")
@pytest.mark.parametrize("command", [["demo"], ["run", "fake_quantize"], ["info"]])
def test_cli_with_refused_simulator_without_a_gpu(command):
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-m", "baracuda_numba", *command], env=env,
                          capture_output=True, text=True, timeout=300)
    if command == ["info"]:  # info reports the situation and succeeds
        assert done.returncode == 0 and "simulator refused by NUMBA_ENABLE_CUDASIM=0" in done.stdout
        return
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "NUMBA_ENABLE_CUDASIM=0 requires a CUDA GPU" in done.stderr


@pytest.mark.skipif(not _without_a_driver(), reason="needs a machine without a CUDA driver")
def test_fallback_warning_says_what_the_variable_does():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-W", "always", "-c", "import baracuda_numba"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0
    assert "running on Numba's CUDA simulator" in done.stderr and "DeviceUnavailable" in done.stderr


def test_hypothesis_profile_is_reproducible_under_load():
    from hypothesis import HealthCheck, settings

    current = settings()
    assert current.derandomize and current.database is None and current.deadline is None
    assert set(current.suppress_health_check) == set(HealthCheck)
