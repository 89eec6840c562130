"""The command line: exit codes and output."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from baracuda_numba import cli, platform


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
    monkeypatch.setattr(reference, "quantize", lambda x, *args: np.full(np.shape(x), 99))
    assert cli.main(["demo", "--size", "128", "--dtype", "float32"]) == 1
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("quantize_per_tensor"))
    assert row[2] == "128"


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
