"""float64 against PyTorch: our default computes in float64; ``torch_compat=True`` reproduces
``torch.fake_quantize_per_tensor_affine``'s float64 contract (float32 scale and reciprocal, float32
product) bit for bit. PyTorch's CPU op is the oracle here (simulator); tests/test_torch_gpu.py checks
the CUDA op on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import baracuda_numba as bn
from baracuda_numba import reference as ref

torch = pytest.importorskip("torch")

SCALES = [0.02, 0.0213, 0.00214854861, 3.7]  # none exact in float32


def _data(scale: float, n: int = 1024, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 60 * scale
    # values just around the ties of the float64 and the float32 grids, and the clamp edges
    ties = (np.arange(-140, 140) + 0.5) * scale
    x[: ties.size] = ties
    x[ties.size: 2 * ties.size] = np.nextafter(ties, np.inf)
    x[2 * ties.size: 2 * ties.size + 3] = [np.inf, -np.inf, 0.0]
    return x


def _torch_forward_and_grad(x: np.ndarray, dy: np.ndarray, scale: float, zp: int, q_min: int, q_max: int):
    xt = torch.from_numpy(x).requires_grad_(True)
    y = torch.fake_quantize_per_tensor_affine(xt, scale, zp, q_min, q_max)
    y.backward(torch.from_numpy(dy))
    return y.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize(("q_min", "q_max", "zp"), [(-128, 127, 0), (0, 255, 128), (-8, 7, -3)])
def test_torch_compat_float64_is_pytorch_bit_for_bit(scale, q_min, q_max, zp):
    x = _data(scale)
    dy = np.random.default_rng(1).standard_normal(x.size)
    expected, expected_grad = _torch_forward_and_grad(x, dy, scale, zp, q_min, q_max)
    got = bn.fake_quantize(x, scale, zp, q_min, q_max, torch_compat=True)
    np.testing.assert_array_equal(got.view(np.uint64), expected.view(np.uint64))
    grad = bn.fake_quantize_backward(dy, x, scale, zp, q_min, q_max, torch_compat=True)
    np.testing.assert_array_equal(grad.view(np.uint64), expected_grad.view(np.uint64))


@pytest.mark.parametrize("scale", SCALES)
def test_default_float64_is_float64_math_and_differs_from_pytorch(scale):
    x = _data(scale, seed=3)
    got = bn.fake_quantize(x, scale, 0, -128, 127)
    np.testing.assert_array_equal(got, ref.fake_quantize(x, scale, 0, -128, 127))
    expected, _ = _torch_forward_and_grad(x, np.ones_like(x), scale, 0, -128, 127)
    # PyTorch's result is a float32 value widened; ours keeps float64 precision
    finite = np.isfinite(expected)
    assert np.array_equal(expected[finite], expected[finite].astype(np.float32).astype(np.float64))
    assert (got[finite] != expected[finite]).mean() > 0.5


@pytest.mark.parametrize("name", ["float32", "float16"])
def test_torch_compat_is_a_no_op_below_float64(name):
    x = _data(0.0213).astype(name)
    np.testing.assert_array_equal(bn.fake_quantize(x, 0.0213, torch_compat=True), bn.fake_quantize(x, 0.0213))
    expected = torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), 0.0213, 0, -128, 127).numpy()
    np.testing.assert_array_equal(bn.fake_quantize(x, 0.0213), expected)


def test_torch_compat_sku_says_float32_math():
    desc = bn.FakeQuantizeDescriptor(numel=16, q_min=-128, q_max=127, input_element="f64", torch_compat=True)
    plan = bn.FakeQuantizePlan.select(desc)
    assert plan.precision_guarantee().math_precision is bn.MathPrecision.F32
    assert plan.sku().precision_guarantee.math_precision is bn.MathPrecision.F32
    default = bn.FakeQuantizePlan.select(bn.FakeQuantizeDescriptor(16, -128, 127, "f64"))
    assert default.precision_guarantee().math_precision is bn.MathPrecision.F64
    with pytest.raises(bn.InvalidProblem, match="FakeQuantizePlan: torch_compat expected a bool"):
        bn.FakeQuantizePlan.select(bn.FakeQuantizeDescriptor(16, -128, 127, "f64", torch_compat="yes"))


def test_the_readme_example():
    # README: scale 0.02 gives 2.5399999618530273 in PyTorch where we give 2.54
    x = np.array([2.54])
    assert bn.fake_quantize(x, 0.02)[0] == 2.54
    assert bn.fake_quantize(x, 0.02, torch_compat=True)[0] == 2.5399999618530273
    assert torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), 0.02, 0, -128, 127).item() == 2.5399999618530273
