"""Array adaptation: every accepted kind in, the same kind out; bad arrays rejected by name."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import requires_gpu
from numba import cuda

import baracuda_numba as bn
from baracuda_numba import reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_numpy_bfloat16_in_and_out():
    x = np.linspace(-3, 3, 101).astype(BF16)
    q = bn.quantize_per_tensor(x, 0.05)
    np.testing.assert_array_equal(q, ref.quantize(x, 0.05, 0, -128, 127, np.int8))
    y = bn.dequantize_per_tensor(q, 0.05, dtype="bfloat16")
    assert y.dtype == BF16
    np.testing.assert_array_equal(y.astype(np.float64), ref.dequantize(q, 0.05, 0, BF16).astype(np.float64))
    z = bn.fake_quantize(x, 0.05)
    assert z.dtype == BF16


def test_numba_device_arrays_in_numba_out():
    x = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    q = bn.quantize_per_tensor(cuda.to_device(x), 0.02, dtype="uint8", q_min=0, q_max=255)
    assert hasattr(q, "copy_to_host") and not isinstance(q, np.ndarray)
    np.testing.assert_array_equal(q.copy_to_host(), ref.quantize(x, 0.02, 0, 0, 255, np.uint8))


def test_bfloat16_view_marks_uint16_device_storage():
    x = np.linspace(-1, 1, 40).astype(BF16)
    tagged = bn.bfloat16_view(cuda.to_device(x.view(np.uint16)))
    q = bn.quantize_per_tensor(tagged, 0.01)
    np.testing.assert_array_equal(q.copy_to_host(), ref.quantize(x, 0.01, 0, -128, 127, np.int8))
    back = bn.dequantize_per_tensor(q, 0.01, dtype="bfloat16")
    assert isinstance(back, bn.Bfloat16Array) and back.copy_to_host().dtype == BF16
    with pytest.raises(bn.InvalidOperand, match="bfloat16_view"):
        bn.quantize_per_tensor(cuda.to_device(x.view(np.uint16)), 0.01)
    with pytest.raises(bn.InvalidOperand, match="storage expected a uint16 array"):
        bn.bfloat16_view(cuda.to_device(np.zeros(4, np.float32)))


@pytest.mark.parametrize("bad", [[1.0, 2.0], "abc", None, 3.0])
def test_non_arrays_are_rejected_by_name(bad):
    with pytest.raises(bn.InvalidOperand, match="fake_quantize: x expected"):
        bn.fake_quantize(bad, 0.1)


def test_non_contiguous_and_negative_stride_views_are_rejected():
    x = np.zeros((8, 8), np.float32)
    for view in (x.T, x[:, ::2], x[::-1]):
        with pytest.raises(bn.InvalidProblem, match="x expected a C-contiguous array"):
            bn.quantize_per_tensor(view, 0.1)


def test_unsupported_storage_dtype_is_named():
    with pytest.raises(bn.InvalidOperand, match="int16"):
        bn.quantize_per_tensor(np.zeros(4, np.int16), 0.1)


def test_out_is_written_in_place_and_returned():
    x = np.linspace(-1, 1, 20, dtype=np.float32)
    out = np.full(20, 99, np.int8)
    result = bn.quantize_per_tensor(x, 0.01, out=out)
    assert result is out
    np.testing.assert_array_equal(out, ref.quantize(x, 0.01, 0, -128, 127, np.int8))


def test_torch_cpu_tensors_in_torch_out():
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.linspace(-2, 2, 33, dtype=dtype)
        q = bn.quantize_per_tensor(x, 0.05)
        assert isinstance(q, torch.Tensor) and q.dtype == torch.int8 and q.device.type == "cpu"
        expected = ref.quantize(x.float().numpy().astype(bn.element_kind(dtype).numpy_dtype), 0.05, 0, -128, 127)
        np.testing.assert_array_equal(q.numpy(), expected)
        y = bn.dequantize_per_tensor(q, 0.05, dtype=dtype)
        assert y.dtype == dtype


@requires_gpu
def test_torch_cuda_bfloat16_in_place_and_dlpack():
    torch = pytest.importorskip("torch")
    x = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
    q = bn.quantize_per_tensor(x, 0.02)
    assert q.is_cuda and q.dtype == torch.int8
    expected = ref.quantize(x.float().cpu().numpy().astype(BF16), 0.02, 0, -128, 127)
    np.testing.assert_array_equal(q.cpu().numpy(), expected)

    class DLPackOnly:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            return self.t.__dlpack__()

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    q2 = bn.quantize_per_tensor(DLPackOnly(x), 0.02)
    np.testing.assert_array_equal(q2.copy_to_host(), expected)


@requires_gpu
def test_cupy_in_cupy_out():
    cupy = pytest.importorskip("cupy")
    x = cupy.linspace(-1, 1, 257, dtype=cupy.float32)
    q = bn.quantize_per_tensor(x, 0.01)
    assert isinstance(q, cupy.ndarray)
    np.testing.assert_array_equal(q.get(), ref.quantize(x.get(), 0.01, 0, -128, 127))
