"""The command line: exit codes and output."""

from __future__ import annotations

import pytest

from baracuda_numba import cli


def test_demo_runs_and_finds_no_mismatch(capsys):
    assert cli.main(["demo", "--size", "257", "--dtype", "float32", "float16"]) == 0
    out = capsys.readouterr().out
    assert "quantize_per_tensor" in out and "fake_quantize_backward" in out
    for line in out.splitlines():
        if line.startswith(("quantize", "dequantize", "fake")):
            assert line.split()[2] == "0", line


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
