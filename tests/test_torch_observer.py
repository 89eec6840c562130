"""FakeQuantize's one-launch observer update (:mod:`baracuda_numba.kernels.observer`, :mod:`baracuda_numba.torch.
observer`): on the simulator against a NumPy float32 model of PyTorch's operations on CUDA tensors (a division by a
number is a multiplication by its float32 reciprocal there); on a GPU against the module's PyTorch path and
torch.ao, bit for bit, over training steps."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from baracuda_numba.kernels.observer import ObserverConfig  # noqa: E402
from baracuda_numba.torch import FakeQuantize  # noqa: E402
from baracuda_numba.torch.observer import RANGE_DTYPES, ObserverUpdate  # noqa: E402
from tests.conftest import SIMULATOR, requires_gpu  # noqa: E402

F32 = np.float32
EPS = float(np.finfo(np.float32).eps)


def reference(lo, hi, m, big, moving_average, symmetric, averaging, divisor, q_min, q_max, zp_symmetric):
    """The update as PyTorch's CUDA operations compute it (FakeQuantize.observe's PyTorch path), in NumPy
    float32: ``(min_val, max_val, scale, zero_point)``."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lo, hi, m, big = (np.asarray(v, F32) for v in (lo, hi, m, big))
        if moving_average:
            first = np.isinf(m)
            a = F32(averaging)
            m, big = np.where(first, lo, m + a * (lo - m)), np.where(first, hi, big + a * (hi - big))
        else:
            m, big = np.minimum(m, lo), np.maximum(big, hi)
        low, high = np.minimum(m, F32(0)), np.maximum(big, F32(0))
        inv = F32(1) / F32(divisor)
        scale = (np.maximum(-low, high) if symmetric else high - low) * inv
        scale = np.maximum(scale, F32(EPS))
        if symmetric:
            zero_point = np.full(m.shape, zp_symmetric, np.int32)
        else:
            z = np.minimum(np.maximum(F32(q_min) - np.rint(low / scale), F32(q_min)), F32(q_max))
            zero_point = np.where(np.isnan(z), 0, z).astype(np.int32)
    return m.astype(F32), big.astype(F32), scale.astype(F32), zero_point


def _values(count, draw_seed):
    rng = np.random.default_rng(draw_seed)
    values = (rng.standard_normal(count) * 10.0 ** rng.integers(-3, 3, count)).astype(F32)
    specials = np.array([0.0, -0.0, 1e-30, -1e-30, 3e38, -3e38, 0.5, -0.5], F32)
    values[: min(count, 8)] = specials[: min(count, 8)]
    return values


@pytest.mark.skipif(not SIMULATOR, reason="the CUDA-tensor path is held to torch itself on a GPU (below)")
@given(count=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), moving_average=st.booleans(),
       symmetric=st.booleans(), dtype=st.sampled_from(sorted(RANGE_DTYPES, key=str)),
       averaging=st.sampled_from([0.01, 0.1, 0.3333, 1.0]),
       q_range=st.sampled_from([(-128, 127, 0), (-127, 127, 0), (0, 255, 128), (0, 15, 7), (-8, 7, 0)]),
       first=st.booleans())
def test_kernel_is_pytorchs_cuda_operations(count, seed, moving_average, symmetric, dtype, averaging, q_range,
                                            first):
    q_min, q_max, zp_symmetric = q_range
    lo_values, hi_values = _values(count, seed), _values(count, seed + 1)
    lo = torch.from_numpy(np.minimum(lo_values, hi_values)).to(dtype)
    hi = torch.from_numpy(np.maximum(lo_values, hi_values)).to(dtype)
    if first:
        m, big = np.full(count, np.inf, F32), np.full(count, -np.inf, F32)
    else:
        m, big = _values(count, seed + 2), _values(count, seed + 3)
        m, big = np.minimum(m, big), np.maximum(m, big)
    divisor = (q_max - q_min) / 2 if symmetric else float(q_max - q_min)
    expected = reference(lo.float().numpy(), hi.float().numpy(), m, big, moving_average, symmetric, averaging,
                         divisor, q_min, q_max, zp_symmetric)
    state = [torch.from_numpy(m.copy()), torch.from_numpy(big.copy()), torch.empty(count),
             torch.empty(count, dtype=torch.int32)]
    update = ObserverUpdate(ObserverConfig(RANGE_DTYPES[dtype], moving_average, symmetric), count, averaging, divisor,
                            q_min, q_max, zp_symmetric, EPS)
    update.update(lo, hi, *state)
    for got, want, name in zip(state, expected, ("min_val", "max_val", "scale", "zero_point"), strict=True):
        np.testing.assert_array_equal(got.numpy(), want, err_msg=name)


@pytest.mark.skipif(not SIMULATOR, reason="the CUDA-tensor path is held to torch itself on a GPU (below)")
def test_nan_extremes_propagate_and_their_zero_point_is_zero():
    lo = torch.tensor([float("nan"), -1.0, 2.0])
    hi = torch.tensor([1.0, float("nan"), 3.0])
    m = np.array([-2.0, -2.0, np.nan], F32)
    big = np.array([2.0, 2.0, 1.0], F32)
    for moving_average in (False, True):
        state = [torch.from_numpy(m.copy()), torch.from_numpy(big.copy()), torch.empty(3),
                 torch.empty(3, dtype=torch.int32)]
        ObserverUpdate(ObserverConfig(RANGE_DTYPES[torch.float32], moving_average, False), 3, 0.01, 255.0, 0, 255,
                       128, EPS).update(lo, hi, *state)
        expected = reference(lo.numpy(), hi.numpy(), m, big, moving_average, False, 0.01, 255.0, 0, 255, 128)
        for got, want in zip(state, expected, strict=True):
            np.testing.assert_array_equal(got.numpy(), want)
        nan = np.isnan(state[2].numpy())
        assert nan.any() and (state[3].numpy()[nan] == 0).all()


def test_fake_quantize_pickles_and_copies_without_its_launcher():
    module = FakeQuantize(granularity="per_channel", num_channels=4)
    module._update = ObserverUpdate(ObserverConfig(RANGE_DTYPES[torch.float32], True, True), 4, 0.01, 127.5, -128,
                                    127, 0, EPS)
    for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert other._update is None and torch.equal(other.scale, module.scale)


# -- on a GPU: the module's one-launch observer against its PyTorch operations and torch.ao ---------


CASES = {"per channel average symmetric int8": ("per_channel", "moving_average", True, torch.int8),
         "per channel minmax affine int8": ("per_channel", "minmax", False, torch.int8),
         "per tensor average affine uint8": ("per_tensor", "moving_average", False, torch.uint8),
         "per tensor minmax symmetric int8": ("per_tensor", "minmax", True, torch.int8),
         "per tensor average symmetric uint8": ("per_tensor", "moving_average", True, torch.uint8)}


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("name", CASES)
def test_gpu_one_launch_observer_is_the_pytorch_operations(name, dtype, monkeypatch):
    """Over training steps of changing batches (the first one, growing and shrinking ranges, an all-zero batch),
    the fused update leaves the running range, scale and zero point and the outputs and gradients of the module
    written as PyTorch operations on the same CUDA tensors, bit for bit."""
    granularity, observer, symmetric, int_dtype = CASES[name]
    fused = FakeQuantize(dtype=int_dtype, granularity=granularity, observer=observer, symmetric=symmetric).cuda()
    plain = copy.deepcopy(fused)
    monkeypatch.setattr(plain, "_fused_update", lambda low, high: None)
    g = torch.Generator(device="cuda").manual_seed(3)
    for step in range(8):
        x = torch.randn(64, 256, device="cuda", generator=g) * (0.1 + step % 3)
        if step == 5:
            x.zero_()
        x = x.to(dtype)
        outputs = []
        for module in (fused, plain):
            xi = x.clone().requires_grad_()
            y = module(xi)
            y.backward(torch.ones_like(y))
            outputs.append((y.detach(), xi.grad))
        assert fused._update is not None  # the one-launch update ran (float64 data: on its float32 extremes)
        for buffer in ("min_val", "max_val", "scale", "zero_point"):
            assert torch.equal(getattr(fused, buffer), getattr(plain, buffer)), (step, buffer)
        assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1]), step
