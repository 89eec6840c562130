"""The claims the documentation makes about PyTorch, pinned by the cases where they hold and where they do not.

1. ``quantize_per_tensor`` (float32) against ``torch.quantize_per_tensor``: we compute
   ``clamp(rint(fl32(x * inv)) + zero_point)``. PyTorch's CPU kernel depends on its build and the CPU: one
   seen (torch 2.13, fbgemm on an AVX2 x86 CPU) computes ``clamp(rint(fl32(x * inv + zero_point)))``, one
   float32 rounding of the exact product plus the zero point, then round half to even; another (torch 2.11 on
   the GPU machine's CPU) rounds first, as we do. Both agree with us whenever ``zero_point == 0``; the first
   differs by one where adding the zero point in float32 moves the value across or onto a rounding tie. PyTorch's
   CUDA kernel rounds ``x / scale`` computed in float64 and adds the zero point after rounding: it agrees with us
   except where ``fl32(x * inv)`` and the float64 quotient round to different integers (within about an ulp of a
   tie). ``fake_quantize_per_tensor_affine`` computes exactly what we do.
2. Symmetric scales: ``baracuda_numba.torch.FakeQuantize`` follows torch.ao's observers,
   ``scale = max(-min, max) / ((q_max - q_min) / 2)`` (``amax / 127.5`` for int8), while
   ``dynamic_range_quantize(mode="symmetric")`` uses ``amax / q_max`` on [-127, 127] (``amax / 127``).
"""

from __future__ import annotations

import platform as host_platform

import numpy as np
import pytest
from conftest import SIMULATOR

import baracuda_numba as bn
from baracuda_numba import reference as ref

torch = pytest.importorskip("torch")

SCALES = [0.02, 0.0213, 0.00214854861, 0.5, 3.7]
ZERO_POINTS = [0, 1, 2, 3, -5, 100, -128, 127]


def _data(scale: float, seed: int = 0) -> np.ndarray:
    """float32 values at the exact float32 ties of ``x * (1/scale)``, one ulp either side, and random ones."""
    inv = np.float32(1) / np.float32(scale)
    ties = ((np.arange(-300, 300) + 0.5) / inv).astype(np.float32)
    random = (np.random.default_rng(seed).standard_normal(20000) * 60 * scale).astype(np.float32)
    return np.concatenate([ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf)),
                           random]).astype(np.float32)


def _exact_ties(x: np.ndarray, scale: float) -> np.ndarray:
    """Where ``x * (1/scale)`` (float32 operands, the product exact in float64) is exactly ``k + 1/2``."""
    return (x.astype(np.float64) * np.float64(np.float32(1) / np.float32(scale))) % 1 == 0.5


def _zero_point_added_before_rounding(x: np.ndarray, scale: float, zp: int, q_min: int, q_max: int) -> np.ndarray:
    """PyTorch's CPU rule: ``rint(fl32(x * inv + zp))`` (the product exact in float64, one rounding to float32)."""
    inv = np.float32(1) / np.float32(scale)
    return np.clip(np.rint((x.astype(np.float64) * np.float64(inv) + zp).astype(np.float32)), q_min, q_max)


def _torch_cpu(x: np.ndarray, scale: float, zp: int, unsigned: bool) -> np.ndarray:
    dtype = torch.quint8 if unsigned else torch.qint8
    return torch.quantize_per_tensor(torch.from_numpy(x), scale, zp, dtype).int_repr().numpy().astype(np.int64)


cpu_kernel = pytest.mark.skipif(host_platform.machine() not in ("x86_64", "AMD64"),
                                reason="PyTorch's CPU quantize kernel described here is fbgemm's (x86)")


def _rounds_first(x: np.ndarray, scale: float, zp: int, q_min: int, q_max: int) -> np.ndarray:
    """Our rule: ``rint(fl32(x * inv)) + zp``."""
    inv = np.float32(1) / np.float32(scale)
    return np.clip(np.rint(x * inv) + zp, q_min, q_max)


def _cpu_rule() -> str:
    """Which rule this PyTorch's CPU kernel follows: ``"before"`` (the zero point added before rounding) or
    ``"after"`` (rounded first, as we do), told apart by one exact tie with an odd zero point."""
    return "before" if _torch_cpu(np.array([0.25], np.float32), 0.5, 3, False)[0] == 4 else "after"


@cpu_kernel
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("zp", ZERO_POINTS)
@pytest.mark.parametrize("unsigned", [False, True])
def test_pytorch_cpu_follows_one_of_the_two_rules_exactly(scale, zp, unsigned):
    zp, (q_min, q_max) = (zp + 128, (0, 255)) if unsigned else (zp, (-128, 127))
    x = _data(scale)
    rule = _zero_point_added_before_rounding if _cpu_rule() == "before" else _rounds_first
    np.testing.assert_array_equal(_torch_cpu(x, scale, zp, unsigned), rule(x, scale, zp, q_min, q_max))


@cpu_kernel
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("unsigned", [False, True])
def test_with_a_zero_point_of_zero_we_match_pytorch_cpu_bit_for_bit(scale, unsigned):
    x = _data(scale, seed=1)
    got = bn.quantize_per_tensor(x, scale, 0, dtype="uint8" if unsigned else "int8")
    np.testing.assert_array_equal(got.astype(np.int64), _torch_cpu(x, scale, 0, unsigned))


@cpu_kernel
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("zp", [z for z in ZERO_POINTS if z != 0])
def test_with_another_zero_point_we_round_first_and_differ_exactly_where_the_rules_do(scale, zp):
    x = _data(scale, seed=2)
    ours = bn.quantize_per_tensor(x, scale, zp).astype(np.int64)
    np.testing.assert_array_equal(ours, ref.quantize(x, scale, zp, -128, 127, np.int8))
    np.testing.assert_array_equal(ours, _rounds_first(x, scale, zp, -128, 127))
    theirs = _torch_cpu(x, scale, zp, False)
    if _cpu_rule() == "after":
        np.testing.assert_array_equal(ours, theirs)
        return
    before = _zero_point_added_before_rounding(x, scale, zp, -128, 127)
    differ = ours != theirs
    np.testing.assert_array_equal(differ, ours != before)
    assert (np.abs(ours - theirs) <= 1).all()
    inside = (ours > -128) & (ours < 127)  # off the clamp bounds, where a difference of one can show
    assert (_exact_ties(x, scale) & inside).any() or scale not in (0.02, 0.5)  # 24 and 600 exact ties there
    if zp % 2:  # an odd zero point flips the parity of every exact tie: all of them differ
        assert differ[_exact_ties(x, scale) & inside].all()
    else:  # an even one keeps it: exact ties agree (the differences are near-ties, product not exactly k + 1/2)
        assert not differ[_exact_ties(x, scale)].any()


@cpu_kernel
def test_the_two_rules_on_one_example_each():
    # an exact tie: x * inv = 0.5; the zero point's parity decides
    assert bn.quantize_per_tensor(np.array([0.25], np.float32), 0.5, 3)[0] == 3  # rint(0.5) + 3
    assert _torch_cpu(np.array([0.25], np.float32), 0.5, 3, False)[0] == (4 if _cpu_rule() == "before" else 3)
    assert bn.quantize_per_tensor(np.array([0.25], np.float32), 0.5, 2)[0] == _torch_cpu(
        np.array([0.25], np.float32), 0.5, 2, False)[0] == 2
    # a near-tie: x * inv = 0.4999999888 exactly, which float32 keeps below 1/2 but not above 3
    assert bn.quantize_per_tensor(np.array([0.01], np.float32), 0.02, 3)[0] == 3
    assert _torch_cpu(np.array([0.01], np.float32), 0.02, 3, False)[0] == (4 if _cpu_rule() == "before" else 3)
    # the documented example, zero point 0: PyTorch's CPU op and ours agree
    x = np.array([0.273939937], np.float32)
    assert bn.quantize_per_tensor(x, 0.00214854861, dtype="uint8")[0] == _torch_cpu(x, 0.00214854861, 0, True)[0] == 128


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("zp", [3, -5, 100])
def test_pytorch_fake_quantize_adds_the_zero_point_after_rounding_as_we_do(scale, zp):
    x = _data(scale, seed=3)
    expected = torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), scale, zp, -128, 127).numpy()
    np.testing.assert_array_equal(bn.fake_quantize(x, scale, zp), expected)
    np.testing.assert_array_equal(bn.dequantize_per_tensor(bn.quantize_per_tensor(x, scale, zp), scale, zp), expected)


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="needs a real GPU: PyTorch's CUDA kernel is the one compared")
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("zp", ZERO_POINTS)
def test_pytorch_cuda_rounds_the_float64_quotient_and_differs_from_us_only_near_ties(scale, zp):
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    x = _data(scale, seed=4)
    quotient = np.rint(x.astype(np.float64) / np.float64(scale))  # PyTorch's CUDA kernel: raw_val / (double) scale
    for dtype, name, offset, (q_min, q_max) in ((torch.qint8, "int8", 0, (-128, 127)),
                                                 (torch.quint8, "uint8", 128, (0, 255))):
        theirs = torch.quantize_per_tensor(torch.from_numpy(x).cuda(), scale, zp + offset, dtype).int_repr()
        theirs = theirs.cpu().numpy().astype(np.int64)
        np.testing.assert_array_equal(theirs, np.clip(quotient + zp + offset, q_min, q_max))
        ours = bn.quantize_per_tensor(torch.from_numpy(x).cuda(), scale, zp + offset, dtype=name)
        ours = ours.cpu().numpy().astype(np.int64)
        np.testing.assert_array_equal(ours, _rounds_first(x, scale, zp + offset, q_min, q_max))
        differ = ours != theirs
        assert (np.abs(ours - theirs) <= 1).all()
        random = np.zeros_like(differ)
        random[1800:] = True  # the random values (the first 1800 sit on or one ulp from a tie)
        assert not differ[random].any()


# -- symmetric scales: 127.5 (FakeQuantize, torch.ao) against 127 (dynamic range) ---------------------------


def test_fake_quantize_symmetric_scale_is_torch_aos():
    ao = pytest.importorskip("torch.ao.quantization")
    from baracuda_numba.torch import FakeQuantize

    x = torch.from_numpy(np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32) * 3)
    ours = FakeQuantize(observer="minmax", symmetric=True).train()
    ours(x)
    observer = ao.MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    observer(x)
    scale, zero_point = observer.calculate_qparams()
    assert torch.equal(ours.scale, scale.float()) and int(ours.zero_point) == int(zero_point) == 0
    amax = float(x.abs().max())
    assert float(ours.scale) == pytest.approx(amax / 127.5, rel=1e-6)  # (q_max - q_min) / 2 = 127.5


def test_dynamic_range_symmetric_scale_is_amax_over_q_max():
    x = np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32) * 3
    result = bn.dynamic_range_quantize(x, scope="tensor")
    scale, _ = ref.dynamic_range_params(x, "symmetric", "tensor", -127, 127)
    np.testing.assert_array_equal(np.asarray(result.scale).reshape(-1), np.asarray(scale).reshape(-1))
    amax = float(np.abs(x).max())
    assert float(np.asarray(result.scale).reshape(-1)[0]) == pytest.approx(amax / 127, rel=1e-6)
    assert result.zero_point is None and int(np.asarray(result.q).min()) >= -127  # -x quantizes to -q
    np.testing.assert_array_equal(bn.dynamic_range_quantize(-x, scope="tensor").q, -np.asarray(result.q))
