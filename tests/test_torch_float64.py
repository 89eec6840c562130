"""Where float64 data differs from PyTorch, and why (README, "Semantics": PyTorch and float64).

PyTorch holds a per-tensor or per-channel scale as float32 and takes its reciprocal in float32
(``inv = 1.0f / scale``). For float64 tensors it then computes ``round(x * inv)`` in float64 with that
float32 ``inv``; ``fake_quantize_per_tensor_affine`` multiplies back in float32 (``(q - zp) * scale`` rounded
to float32, then widened), ``fake_quantize_per_channel_affine`` in float64 with the float32 scale. Our
float64 kernels (``MathPrecision.F64``) take ``scale`` and ``1/scale`` in float64 throughout. The two agree
exactly when ``scale`` and ``1/scale`` are exact in float32 (powers of two); for a scale like 0.02 the
forward results differ in most elements (by float32 rounding) and, rarely, by one grid step. These tests
pin both sides down: ours against the NumPy float64 reference, PyTorch against the formula above (so the
README's description of PyTorch is checked, not assumed), and the size of the gap, per tensor (forward
and backward) and per channel. ``fake_quantize(..., torch_compat=True)``, which reproduces the per-tensor
contract, is tested in ``test_torch_compat.py``; there is no per-channel ``torch_compat``, and the
per-channel test below shows that widening PyTorch's float32 scales is not enough to match it at ties.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SIMULATOR, requires_gpu

import baracuda_numba as bn
from baracuda_numba import reference as ref

torch = pytest.importorskip("torch")

F32, F64 = np.float32, np.float64
NOT_EXACT_IN_F32 = (0.02, 0.0213, 0.1, 0.00214854861)


def torch_float64_formula(x: np.ndarray, scale, zero_point, q_min: int, q_max: int, per_channel: bool):
    """PyTorch's float64 fake quantize: float32 scale and reciprocal, ``round(x * inv)`` in float64; the
    product back in float32 (per tensor) or float64 (per channel)."""
    s32 = np.asarray(scale, F32)
    inv = (F32(1) / s32).astype(F64)
    q = np.clip(np.rint(x * inv) + zero_point, q_min, q_max)
    if per_channel:
        return (q - zero_point) * s32.astype(F64), q
    return ((q - zero_point).astype(F32) * s32).astype(F64), q


def _data(n: int, scale: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 1.5
    # and values within float32 rounding of a rounding tie and of the clamp edge, where the reciprocals differ
    k = rng.integers(-140, 140, n // 4)
    x[: n // 4] = (k + 0.5) * scale * (1 + rng.standard_normal(n // 4) * 1e-8)
    return x


def _sizes():
    return 2048 if SIMULATOR else 1 << 20


@pytest.mark.parametrize("scale", NOT_EXACT_IN_F32)
@pytest.mark.parametrize("zero_point", [0, 3])
def test_float64_fake_quantize_per_tensor_is_float64_and_torch_is_float32(scale, zero_point):
    x = _data(_sizes(), scale, 1)
    ours = bn.fake_quantize(x, scale, zero_point)
    np.testing.assert_array_equal(ours, ref.fake_quantize(x, scale, zero_point, -128, 127))
    theirs = torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), scale, zero_point, -128, 127).numpy()
    expected_theirs, _ = torch_float64_formula(x, scale, zero_point, -128, 127, per_channel=False)
    np.testing.assert_array_equal(theirs, expected_theirs)
    differ = ours != theirs
    assert differ.mean() > 0.3  # the float32 rounding of the product: most elements
    # every torch value is a float32 number; ours differ from it by float32 rounding or one grid step
    assert np.array_equal(theirs.astype(F32).astype(F64), theirs)
    # (the float32 scale itself is off by a relative 2**-24 at most: 1e-6 of the value covers it)
    assert np.all(np.abs(ours - theirs) <= scale * (1 + 1e-5) + 1e-6 * np.abs(theirs))


@pytest.mark.parametrize("scale", [0.5, 2.0**-7, 4.0])
def test_float64_fake_quantize_agrees_with_torch_when_the_scale_is_exact_in_float32(scale):
    x = _data(_sizes(), scale, 2)
    theirs = torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), scale, 3, -128, 127).numpy()
    np.testing.assert_array_equal(bn.fake_quantize(x, scale, 3), theirs)


@pytest.mark.parametrize("scale", NOT_EXACT_IN_F32)
def test_float64_backward_masks_differ_from_torch_only_at_the_clamp_edge(scale):
    n = _sizes()
    rng = np.random.default_rng(3)
    x = rng.standard_normal(n) * 1.5
    edge = np.array([127.5, -128.5])[rng.integers(0, 2, n // 4)]  # where round(x / scale) leaves the range
    x[: n // 4] = edge * scale * (1 + rng.standard_normal(n // 4) * 1e-8)
    dy = np.ones(n)
    ours = bn.fake_quantize_backward(dy, x, scale, 0)
    np.testing.assert_array_equal(ours, ref.fake_quantize_backward(dy, x, scale, 0, -128, 127))
    xt = torch.from_numpy(x.copy()).requires_grad_()
    torch.fake_quantize_per_tensor_affine(xt, scale, 0, -128, 127).backward(torch.ones(n, dtype=torch.float64))
    _, q_unclamped = torch_float64_formula(x, scale, 0, -(2**40), 2**40, per_channel=False)
    np.testing.assert_array_equal(xt.grad.numpy(), ((q_unclamped >= -128) & (q_unclamped <= 127)).astype(F64))
    differ = ours != xt.grad.numpy()
    assert not differ[n // 4:].any()  # away from the edge: identical masks
    assert np.all(np.abs(np.abs(x[differ] / scale) - 128) < 1)  # differences only at the clamp edge


@pytest.mark.parametrize("scale", [0.02, 0.0213])
def test_float64_fake_quantize_per_channel_against_torch(scale):
    x = _data(_sizes(), scale, 4).reshape(4, -1)
    scales32 = np.array([scale, scale * 1.5, scale / 3, scale * 7], F32)
    k = np.arange(x.shape[1] // 4) % 250 - 125
    x[0, : x.shape[1] // 4] = (k + 0.5) * scales32[0].astype(F64)  # exact ties of channel 0's float32 scale
    theirs = torch.fake_quantize_per_channel_affine(torch.from_numpy(x), torch.from_numpy(scales32),
                                                    torch.zeros(4, dtype=torch.int32), 0, -128, 127).numpy()
    expected_theirs, _ = torch_float64_formula(x, scales32[:, None], 0, -128, 127, per_channel=True)
    np.testing.assert_array_equal(theirs, expected_theirs)
    # ours with the same (float32) scales widened: the products are the same float64 numbers, but
    # round(x * inv) is not: PyTorch's inv is float32's 1/scale, ours float64's, so values within float32
    # rounding of a tie round differently. Not "the same with those scales": equal away from ties only.
    q = bn.quantize_per_channel(x, scales32.astype(F64), None, 0, q_min=-128, q_max=127, dtype="int8")
    ours = bn.dequantize_per_channel(q, scales32.astype(F64), None, 0, dtype="float64")
    np.testing.assert_array_equal(q, ref.quantize(x, ref.expand_channels(scales32.astype(F64), x.shape, 0), 0,
                                                  -128, 127, np.int8))
    differ = ours != theirs
    near_tie = np.abs(np.abs(x / scales32.astype(F64)[:, None]) % 1 - 0.5) < 1e-4
    assert differ[0, : x.shape[1] // 4].any()  # channel 0 holds values at its ties: some round differently
    assert not (differ & ~near_tie).any()
    assert np.all(np.abs(ours - theirs)[differ] <= scales32.max() * (1 + 1e-6))


@requires_gpu
@pytest.mark.parametrize("scale", NOT_EXACT_IN_F32)
def test_float64_fake_quantize_against_torch_cuda(scale):
    x = _data(1 << 22, scale, 5)
    xt = torch.from_numpy(x).cuda().requires_grad_()
    theirs = torch.fake_quantize_per_tensor_affine(xt, scale, 3, -128, 127)
    theirs.backward(torch.ones_like(theirs))
    ours = bn.fake_quantize(xt.detach(), scale, 3)
    np.testing.assert_array_equal(ours.cpu().numpy(), ref.fake_quantize(x, scale, 3, -128, 127))
    expected_theirs, _ = torch_float64_formula(x, scale, 3, -128, 127, per_channel=False)
    # torch CUDA computes like torch CPU (if this fails, the README's description of PyTorch is wrong on CUDA)
    np.testing.assert_array_equal(theirs.detach().cpu().numpy(), expected_theirs)
    assert (ours.cpu().numpy() != expected_theirs).mean() > 0.3
    dx = bn.fake_quantize_backward(torch.ones_like(xt.detach()), xt.detach(), scale, 3).cpu().numpy()
    np.testing.assert_array_equal(dx, ref.fake_quantize_backward(np.ones_like(x), x, scale, 3, -128, 127))
    differ = dx != xt.grad.cpu().numpy()
    t = x[differ] / scale + 3
    assert np.all((np.abs(t - 127.5) < 1e-3) | (np.abs(t + 128.5) < 1e-3))  # only at the clamp edges
