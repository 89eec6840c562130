"""Bad array scales and zero points never pass silently (baracuda_numba/ops/checks.py): negative, NaN and
+-inf scales, positive scales too small to invert, and zero points outside [q_min, q_max] raise
InvalidProblem naming the function, the argument, the first bad index and its value; a zero scale stays
defined behaviour."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import SIMULATOR
from hypothesis import given
from hypothesis import strategies as st

import baracuda_numba as bn
from baracuda_numba import reference as ref
from baracuda_numba.ops import checks

X = np.linspace(-2, 2, 4 * 8, dtype=np.float32).reshape(4, 8)
Q = np.arange(-16, 16, dtype=np.int8).reshape(4, 8)
U = np.arange(0, 32, dtype=np.uint8).reshape(4, 8)


def _calls(scales, zero_points=None):
    """Every array-scale function, on [4, 8] data: channel scales [4] (axis 0), token scales [4], group
    scales [4, 2] (groups of 4); ``scales`` / ``zero_points`` are [4]-element arrays reshaped as needed."""
    s, z = np.asarray(scales), None if zero_points is None else np.asarray(zero_points)
    g = np.repeat(s[:, None], 2, axis=1)
    gz = None if z is None else np.repeat(z[:, None], 2, axis=1)
    return {
        "quantize_per_channel": lambda: bn.quantize_per_channel(X, s, z, 0),
        "quantize_per_channel_backward": lambda: bn.quantize_per_channel_backward(X, X, s, z, 0),
        "dequantize_per_channel": lambda: bn.dequantize_per_channel(Q, s, z, 0),
        "quantize_per_token": lambda: bn.quantize_per_token(X, s, z),
        "quantize_per_token_backward": lambda: bn.quantize_per_token_backward(X, X, s, z),
        "dequantize_per_token": lambda: bn.dequantize_per_token(Q, s, z),
        "quantize_per_group": lambda: bn.quantize_per_group(X, g, gz, 4),
        "quantize_per_group_backward": lambda: bn.quantize_per_group_backward(X, X, g, gz, 4),
        "dequantize_per_group": lambda: bn.dequantize_per_group(Q, g, gz, 4),
    }


_SCALES_ONLY = {
    "dequantize_per_channel_backward": lambda s: bn.dequantize_per_channel_backward(X, s, 0),
    "dequantize_per_token_backward": lambda s: bn.dequantize_per_token_backward(X, s),
    "dequantize_per_group_backward": lambda s: bn.dequantize_per_group_backward(X, np.repeat(s[:, None], 2, 1), 4),
    "quantize_per_group_packed": lambda s: bn.quantize_per_group_packed(X, np.repeat(s[:, None], 2, 1), None, 4),
    "dequantize_per_group_packed": lambda s: bn.dequantize_per_group_packed(
        np.ascontiguousarray(U[:, :4]), np.repeat(s[:, None], 2, 1), None, 4),
    "fake_quantize_per_group": lambda s: bn.fake_quantize_per_group(X, np.repeat(s[:, None], 2, 1), None, 4),
    "fake_quantize_per_group_backward": lambda s: bn.fake_quantize_per_group_backward(
        X, X, np.repeat(s[:, None], 2, 1), None, 4),
}
_ALL = sorted([*_calls([1.0] * 4), *_SCALES_ONLY])


def _call(name, scales, zero_points=None):
    if name in _SCALES_ONLY:
        return _SCALES_ONLY[name](np.asarray(scales, np.float32))
    return _calls(np.asarray(scales, np.float32), zero_points)[name]()


def _index(name: str, flat_row: int) -> str:
    """How the message writes the index of row ``flat_row``'s first scale: 2-d group scales give a tuple."""
    return f"({flat_row}, 0)" if "group" in name else str(flat_row)


@pytest.mark.parametrize("bad", [-0.5, math.nan, math.inf, -math.inf, -0.0 - 1e-30])
@pytest.mark.parametrize("name", _ALL)
def test_a_bad_scale_names_the_function_the_argument_the_index_and_the_value(name, bad):
    scales = [0.1, 0.2, bad, 0.1]
    with pytest.raises(bn.InvalidProblem) as info:
        _call(name, scales)
    message = str(info.value)
    assert message.startswith(f"{name}: scales expected finite values >= 0"), message
    assert f"got {np.float32(bad)!s} at index {_index(name, 2)}" in message, message


@pytest.mark.parametrize("name", _ALL)
def test_a_zero_scale_is_defined_behaviour(name):
    _call(name, [0.1, 0.0, 0.2, 0.1])  # no error (README, Semantics: zero-scale segments)


def test_a_zero_scale_quantizes_its_segment_to_the_clamped_zero_point_with_zero_gradient():
    scales, zps = np.array([0.1, 0.0, 0.2, 0.1], np.float32), np.array([0, 5, 0, -3], np.int32)
    q = bn.quantize_per_token(X, scales, zps)
    assert (q[1] == 5).all()
    np.testing.assert_array_equal(q, ref.quantize(X, scales[:, None], zps[:, None], -128, 127))
    dx = bn.quantize_per_token_backward(X, X, scales, zps)
    assert (dx[1] == 0).all()


@pytest.mark.parametrize("name", [n for n in _ALL if n.startswith(("quantize", "fake"))])
def test_a_scale_whose_reciprocal_overflows_is_refused_where_the_op_inverts_it(name):
    with pytest.raises(bn.InvalidProblem, match=r"scales expected finite values >= 0 with a finite float32 "
                                                r"reciprocal where > 0, got 1e-40 at index"):
        _call(name, [0.1, 0.1, 0.1, 1e-40])


@pytest.mark.parametrize("name", [n for n in _ALL if n.startswith("dequantize")])
def test_dequantize_multiplies_by_the_scale_so_a_tiny_one_is_fine(name):
    _call(name, [0.1, 0.1, 0.1, 1e-40])


@pytest.mark.parametrize("name", [n for n in _calls([1.0] * 4)])
@pytest.mark.parametrize("bad", [200, -129])
def test_a_zero_point_outside_the_range_names_the_index(name, bad):
    with pytest.raises(bn.InvalidProblem) as info:
        _call(name, [0.1] * 4, np.array([0, 0, 0, bad], np.int32))
    assert str(info.value).startswith(f"{name}: zero_points expected integers in [-128, 127], got {bad} at index "
                                      f"{_index(name, 3)}")


def test_zero_point_ranges_follow_q_min_q_max_and_the_dtype():
    scales = np.full(4, 0.1, np.float32)
    with pytest.raises(bn.InvalidProblem, match=r"zero_points expected integers in \[-10, 10\], got 11 at index 0"):
        bn.quantize_per_token(X, scales, np.array([11, 0, 0, 0]), q_min=-10, q_max=10)
    bn.quantize_per_token(X, scales, np.array([10, 0, 0, 0]), q_min=-10, q_max=10)
    with pytest.raises(bn.InvalidProblem, match=r"zero_points expected integers in \[0, 255\], got -1 at index 1"):
        bn.dequantize_per_token(U, scales, np.array([0, -1, 0, 0]))
    with pytest.raises(bn.InvalidProblem, match=r"quantize_per_group_packed: zero_points expected integers in "
                                                r"\[0, 15\], got 16 at index \(2, 1\)"):
        bn.quantize_per_group_packed(X, np.full((4, 2), 0.1), np.array([[0, 0], [0, 0], [0, 16], [0, 0]]), 4,
                                     dtype="uint4")


def test_the_plans_check_host_arrays_when_binding_and_can_implement_says_why():
    plan = bn.QuantizePerChannelPlan.select(bn.QuantizePerChannelDescriptor((4, 8), 0, -128, 127, "f32", "s8"))
    args = bn.QuantizePerChannelArgs(X, np.array([0.1, 0.1, -1, 0.1], np.float32), np.zeros(4, np.int32),
                                     np.empty((4, 8), np.int8))
    verdict = plan.can_implement(args)
    assert not verdict and verdict.error is bn.InvalidProblem
    assert verdict.reason == "QuantizePerChannelPlan: scale expected finite values >= 0 with a finite float32 " \
                             "reciprocal where > 0, got -1.0 at index 2"
    with pytest.raises(bn.InvalidProblem, match="QuantizePerChannelPlan: zero_point expected integers in"):
        plan.run(bn.QuantizePerChannelArgs(X, np.full(4, 0.1, np.float32), np.array([0, 0, 0, 128], np.int32),
                                           np.empty((4, 8), np.int8)))


def test_validate_takes_host_or_device():
    with pytest.raises(bn.InvalidProblem, match="quantize_per_token: validate expected 'host' or 'device', got 'no'"):
        bn.quantize_per_token(X, np.full(4, 0.1), validate="no")
    np.testing.assert_array_equal(bn.quantize_per_token(X, np.full(4, 0.1), validate="device"),
                                  bn.quantize_per_token(X, np.full(4, 0.1)))


def test_cpu_torch_tensors_are_host_arrays_and_checked():
    torch = pytest.importorskip("torch")
    with pytest.raises(bn.InvalidProblem, match=r"quantize_per_channel: scales expected .* got -0.5 at index 3"):
        bn.quantize_per_channel(torch.from_numpy(X), torch.tensor([0.1, 0.1, 0.1, -0.5]), None, 0)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=40),
       st.booleans())
def test_the_host_check_agrees_with_a_plain_definition(values, reciprocal):
    v = np.array(values, np.float32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        good = [math.isfinite(a) and a >= 0 and not (reciprocal and a > 0 and not np.isfinite(np.float32(1) / a))
                for a in v]
    expected = next((i for i, ok in enumerate(good) if not ok), None)
    assert checks.first_bad_scale(v, reciprocal) == expected


def test_the_device_scan_finds_the_first_bad_element():
    # The reduction kernel of validate="device", run on host arrays under the simulator (on a GPU: device arrays).
    from numba import cuda

    from baracuda_numba.kernels.checks import scan_kernel

    scales = np.array([0.1, 0.0, 0.2, -1.0, np.nan, 1e-40, 0.3], np.float32)
    zero_points = np.array([0, 3, -129, 200, 5], np.int32)
    limit = checks._SMALLEST[np.dtype(np.float32)]
    for s, z, lim, expected in [(scales, zero_points, limit, [3, 2]), (scales[:3], zero_points[:2], limit, [3, 2]),
                                (scales[4:], zero_points, 0.0, [0, 2]), (scales[5:], zero_points[:2], limit, [0, 2]),
                                (scales[5:], zero_points[:2], 0.0, [2, 2])]:
        result = np.array([s.size, z.size], np.int64)
        d_result = cuda.to_device(result)
        scan_kernel()[2, 32](cuda.to_device(s), float(np.finfo(np.float32).max), lim, cuda.to_device(z), -128, 127,
                             d_result)
        assert d_result.copy_to_host().tolist() == expected


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="needs a real GPU: device arrays are checked only with validate='device'")
def test_device_arrays_pass_unchecked_by_default_and_are_checked_with_validate_device():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    x = torch.from_numpy(X).cuda()
    scales = torch.tensor([0.1, 0.1, -0.5, 0.1], device="cuda")
    bn.quantize_per_channel(x, scales, None, 0)  # validate="host": no host sync, no check
    with pytest.raises(bn.InvalidProblem, match=r"quantize_per_channel: scales expected .* got -0.5 at index 2"):
        bn.quantize_per_channel(x, scales, None, 0, validate="device")
    zps = torch.tensor([[0, 0], [0, 0], [0, 0], [0, 300]], device="cuda", dtype=torch.int32)
    with pytest.raises(bn.InvalidProblem, match=r"zero_points expected integers in \[-128, 127\], got 300 at "
                                                r"index \(3, 1\)"):
        bn.quantize_per_group(x, torch.full((4, 2), 0.1, device="cuda"), zps, 4, validate="device")
    good = bn.quantize_per_channel(x, torch.full((4,), 0.1, device="cuda"), None, 0, validate="device")
    assert torch.equal(good.cpu(), torch.from_numpy(ref.quantize(X, np.float32(0.1), 0, -128, 127)))
