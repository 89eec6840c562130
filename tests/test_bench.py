"""The benchmark's report without a GPU: the tables it writes from measured rows."""

from __future__ import annotations

from baracuda_numba import bench


def test_markdown_has_the_copy_the_rows_and_the_host_time_table_against_pytorch():
    b = bench.Bench(repeats=1)
    b.copy_gbs = 3000.0
    b.rows.append({"family": "per_tensor", "op": "quantize", "dtype": "f32", "ms": 1.0, "GB/s": 2700.0,
                   "pct_copy": 90.0, "torch_op": "torch.quantize_per_tensor", "torch_GB/s": 1350.0, "ratio": 2.0})
    pairs = [{"family": "per_tensor", "call": "quantize_per_tensor()", "us": 8.0,
              "torch_op": "torch.quantize_per_tensor", "torch_us": 12.0}]
    text = bench.markdown(b, pairs, {"quantized_linear()": 30.0}, "GPU", 1 << 28)
    assert "device-to-device copy: 3000 GB/s" in text
    assert "| per_tensor | quantize | f32 | 2700 | 90.0% | torch.quantize_per_tensor | 1350 | 2.00x |" in text
    assert "| per_tensor | quantize_per_tensor() | 8.0 | torch.quantize_per_tensor | 12.0 | 1.50x |" in text
    assert "| quantized_linear() | 30.0 |" in text


def test_a_row_that_must_move_more_bytes_shows_both_percentages():
    b = bench.Bench(repeats=1)
    b.copy_gbs = 3000.0
    n = 1 << 28
    b.rows.append({"family": "dynamic", "op": "tensor[symmetric]", "dtype": "bf16", "ms": 1.0, "GB/s": 1740.0,
                   "pct_copy": 58.0, "bytes": 3 * n, "moved_bytes": 5 * n, "pct_copy_moved": 96.7})
    text = bench.markdown(b, [], {}, "GPU", n)
    assert "| dynamic | tensor[symmetric] | bf16 | 1740 | 58.0% (on the 5n bytes it must move: 96.7%) |" in text


def test_the_linear_rows_get_a_prefill_table_with_both_pytorch_anchors_and_a_decode_table_in_gpu_time():
    b = bench.Bench(repeats=1)
    b.copy_gbs = 3000.0
    b.rows.append({"family": "linear", "op": "quantized_linear 2048x11008x4096", "dtype": "bf16", "ms": 0.1,
                   "TOPS": 900.0, "torch_op": "torch._int_mm + dequant", "torch_TOPS": 360.0, "ratio": 2.5,
                   "raw_op": "torch._int_mm", "raw_TOPS": 750.0, "raw_ratio": 1.2})
    b.rows.append({"family": "linear", "op": "decode M=4 11008x4096", "dtype": "bf16", "decode": True, "m": 4,
                   "n": 11008, "k": 4096, "ms": 0.0188, "GB/s": 2398.3, "pct_copy": 79.94, "torch_op": "F.linear",
                   "torch_ms": 0.0321, "torch_GB/s": 2809.2, "speedup": 1.707})
    text = bench.markdown(b, [], {}, "GPU", 1 << 28)
    assert "| 2048x11008x4096 | 900 | 360 | 2.50x | 750 | 1.20x |" in text
    assert "| 4 | 11008x4096 | 18.8 | 2398 | 79.9% | 32.1 | 2809 | 1.71x |" in text
    # neither row lands in the memory-bound table, whose rows name their family first
    assert "| linear |" not in text


def test_bench_counts_every_linear_row_it_times():
    assert bench.FAMILIES["linear"].rows(["f32"]) == len(bench.PREFILL_SHAPES) + 15
    assert {(4096, 4096), (8192, 8192), (11008, 4096)} <= set(bench.DECODE_WEIGHTS)
    assert set(bench.DECODE_TOKENS) == {1, 2, 4, 8, 16}
    assert {(2048, 4096, 4096), (2048, 11008, 4096), (2048, 4096, 11008), (4096, 4096, 4096)} <= set(
        bench.PREFILL_SHAPES)


def test_host_time_is_timed_in_batches_queued_behind_a_gpu_wait(monkeypatch):
    """Every timed call sits behind a busy wait queued since the last synchronize, at most HOST_BATCH of them."""
    from types import SimpleNamespace

    events: list[str] = []
    fake_cuda = SimpleNamespace(_sleep=lambda cycles: events.append("wait"),
                                synchronize=lambda: events.append("sync"))
    monkeypatch.setattr(bench, "torch", SimpleNamespace(cuda=fake_cuda))
    us = bench.host_us(lambda: events.append("call"), calls=45)
    assert us >= 0.0
    timed = events[events.index("sync") + 1:]  # past the warm-up's calls and its synchronize
    assert timed.count("call") == 5 * 45
    batch: int | None = None
    for event in timed:
        if event == "wait":
            assert batch is None, "a second wait queued before the first batch was synchronized"
            batch = 0
        elif event == "call":
            assert batch is not None, "a call timed with no wait queued ahead of it"
            batch += 1
            assert batch <= bench.HOST_BATCH
        else:
            batch = None


def test_every_family_counts_its_rows_for_the_dtypes_asked():
    assert list(bench.FAMILIES) == ["per_tensor", "per_channel", "per_token", "per_group", "host", "dynamic", "lowbit",
                                    "linear", "qat", "model"]
    # the PyTorch layer's benchmarks run only when named
    assert [name for name, family in bench.FAMILIES.items() if not family.default] == ["qat", "model"]
    assert bench.FAMILIES["per_tensor"].rows(["f32", "bf16", "f16"]) == 18
    assert bench.FAMILIES["per_channel"].rows(["f32", "bf16", "f16", "f64"]) == 16  # f32 and bf16 only
    assert bench.FAMILIES["host"].rows(["f32"]) == 0


def test_importing_the_benchmark_does_not_import_pytorch():
    import subprocess
    import sys

    code = "import sys, baracuda_numba.bench, baracuda_numba.cli; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["False"], done.stderr
