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
