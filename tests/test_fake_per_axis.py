"""Fused fake quantize with array scales (per channel, per token, per group; forward and straight-through
backward, one kernel each) against the NumPy reference, every registered int8 / uint8 entry; the kernel
variants (shift, tracking, thread-stationary, one segment); the plan surface and the error paths."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_per_axis import expand, segments
from test_per_tensor import assert_same, make_values
from tuned import CARDS, fake_per_axis

import baracuda_numba as bn
from baracuda_numba import reference as ref
from baracuda_numba import registry
from baracuda_numba.errors import InvalidProblem
from baracuda_numba.kernels.elementwise import ScaleMode
from baracuda_numba.launch import KernelLauncher
from baracuda_numba.vocabulary import ElementKind as E
from baracuda_numba.vocabulary import QuantizeKind as K

FAKE_KINDS = (K.FAKE_QUANTIZE, K.FAKE_QUANTIZE_BACKWARD)
ENTRIES = [e for e in registry.entries() if e.kind in FAKE_KINDS and e.output_element in registry.INT_ELEMENTS]
NAMES = {"channel": "per_channel", "token": "per_token", "group": "per_group"}
PLANS = {
    ("channel", False): (bn.FakeQuantizePerChannelPlan, bn.FakeQuantizePerChannelDescriptor),
    ("channel", True): (bn.FakeQuantizePerChannelBackwardPlan, bn.FakeQuantizePerChannelBackwardDescriptor),
    ("token", False): (bn.FakeQuantizePerTokenPlan, bn.FakeQuantizePerTokenDescriptor),
    ("token", True): (bn.FakeQuantizePerTokenBackwardPlan, bn.FakeQuantizePerTokenBackwardDescriptor),
    ("group", False): (bn.FakeQuantizePerGroupPlan, bn.FakeQuantizePerGroupDescriptor),
    ("group", True): (bn.FakeQuantizePerGroupBackwardPlan, bn.FakeQuantizePerGroupBackwardDescriptor),
}


def entry_id(entry) -> str:
    return f"{entry.kind.name.lower()}-{entry.input_element.short}-{entry.output_element.short}"


def test_every_float_and_int_grid_is_registered_in_channel_mode():
    keys = {e.key: e for e in ENTRIES}
    for kind in FAKE_KINDS:
        for f in registry.FLOAT_ELEMENTS:
            for i in registry.INT_ELEMENTS:
                entry = keys[(kind, f, i)]
                assert entry.mode is ScaleMode.CHANNELS and entry.a is f and entry.out is f
                assert (entry.b is f) == (kind is K.FAKE_QUANTIZE_BACKWARD)


@st.composite
def problems(draw):
    family = draw(st.sampled_from(sorted(NAMES)))
    rank = draw(st.integers(1, 4)) if family == "channel" else draw(st.integers(1, 3))
    shape = list(draw(st.lists(st.integers(0, 6), min_size=rank, max_size=rank)))
    axis = draw(st.integers(-rank, rank - 1)) if family == "channel" else None
    group_size = None
    if family == "group":
        group_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32]))
        shape[-1] = group_size * draw(st.integers(0, 4))
    if family != "group" and draw(st.booleans()):  # rows of whole chunks, several of them
        shape[-1] = draw(st.sampled_from([1, 3, 8, 16, 33, 64]))
    return dict(family=family, shape=tuple(shape), axis=axis, group_size=group_size,
                q_range=draw(st.sampled_from([(-128, 127), (0, 255), (-127, 127), (-8, 7), (0, 15), (3, 3)])),
                seed=draw(st.integers(0, 2**32 - 1)), zero_scales=draw(st.booleans()))


def run_entry(entry, p):
    """(dispatch function's result, reference) for one entry and problem: ties, both clamp edges, +-inf,
    NaN, signed zeros and huge values among ordinary ones; zero scales in some segments."""
    family, shape, axis, group_size = p["family"], p["shape"], p["axis"], p["group_size"]
    rng = np.random.default_rng(p["seed"])
    f, i = entry.input_element.numpy_dtype, entry.output_element
    low, high = i.int_range
    q_min, q_max = (min(max(v, low), high) for v in p["q_range"])
    count = segments(family, shape, axis, group_size)
    scales = rng.choice([0.5, 2.0**-6, 0.013, 0.1, 1.7, 0.00214854861], count).astype(
        np.float64 if f == np.float64 else np.float32)
    if p["zero_scales"] and count:
        scales[rng.integers(0, count)] = 0
    zero_points = rng.integers(q_min, q_max + 1, count).astype(np.int32)
    full_s, full_z = (expand(family, v, shape, axis, group_size) for v in (scales, zero_points))
    x = make_values(rng, math.prod(shape), f, float(np.median(scales)) if count else 0.1, 0, q_min,
                    q_max).reshape(shape)
    layout = {"channel": (axis,), "token": (), "group": (group_size,)}[family]
    options = {"dtype": i, "q_min": q_min, "q_max": q_max}
    if entry.kind is K.FAKE_QUANTIZE:
        got = getattr(bn, f"fake_quantize_{NAMES[family]}")(x, scales, zero_points, *layout, **options)
        return got, ref.fake_quantize(x, full_s, full_z, q_min, q_max)
    dy = (rng.standard_normal(shape) * 4).astype(np.float32).astype(f)
    got = getattr(bn, f"fake_quantize_{NAMES[family]}_backward")(dy, x, scales, zero_points, *layout, **options)
    return got, ref.fake_quantize_backward(dy, x, full_s, full_z, q_min, q_max)


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_id)
def test_matches_reference(entry):
    @given(problems())
    def check(p):
        got, expected = run_entry(entry, p)
        assert_same(got, expected)

    check()


@pytest.mark.parametrize("tuning", CARDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize(("family", "shape", "axis", "group_size", "variant"), [
    ("channel", (24, 512), 0, None, "shift"), ("channel", (24, 40), 0, None, "tracking"),
    ("channel", (9, 16), 1, None, "stationary"), ("channel", (7, 24), 1, None, "tracking"),
    ("token", (24, 256), None, None, "shift"), ("token", (24, 96), None, None, "tracking"),
    ("group", (24, 512), None, 128, "shift"), ("group", (24, 288), None, 48, "tracking"),
    ("channel", (1, 1003), 0, None, "one segment"), ("token", (1, 1003), None, None, "one segment"),
])
def test_kernel_variants_match_reference(family, shape, axis, group_size, variant, dtype, tuning):
    # Segments of a power-of-two number of chunks take the shift kernel; others track their segment; channels
    # along the last axis whose period divides the simulator's 2 x 32-thread stride take the thread-stationary
    # kernel. A tensor of one segment is one scale whatever its length: chunks never straddle segments. Every
    # card's tuning value.
    rng = np.random.default_rng(sum(shape))
    f = bn.element_kind(dtype).numpy_dtype
    count = segments(family, shape, axis, group_size)
    scales = rng.choice([0.5, 2.0**-6, 0.013, 0.1, 1.7], count).astype(np.float64 if dtype == "float64"
                                                                       else np.float32)
    scales[rng.integers(0, count)] = 0 if count > 1 else scales[0]
    zps = rng.integers(-6, 6, count).astype(np.int32)
    full_s, full_z = (expand(family, v, shape, axis, group_size) for v in (scales, zps))
    x = make_values(rng, math.prod(shape), f, 0.1, 0, -128, 127).reshape(shape)
    dy = rng.standard_normal(shape).astype(np.float32).astype(f)
    layout = dict(axis=axis, group_size=group_size)
    assert_same(fake_per_axis(family, False, tuning, x, scales, zps, **layout),
                ref.fake_quantize(x, full_s, full_z, -128, 127))
    assert_same(fake_per_axis(family, True, tuning, x, scales, zps, dy=dy, **layout),
                ref.fake_quantize_backward(dy, x, full_s, full_z, -128, 127))
    plan = _plan(family, False, shape, axis, group_size, dtype, tuning=tuning)
    if variant == "shift":
        assert plan._pow2_segments() and plan._uniform
    elif variant == "one segment":  # 1003 elements: a segment of whole chunks
        assert plan._uniform and plan._segments() == (-(-1003 // plan._chunk) * plan._chunk, 1)
    elif variant == "stationary":
        launcher = plan._geometry(plan._n // plan._chunk, 0)[3]
        assert not plan._uniform and launcher is plan._stationary_launcher
    else:
        assert not plan._pow2_segments()


def _plan(family, backward, shape, axis, group_size, dtype, grid="s8", q=(-128, 127), tuning=None):
    plan_type, descriptor = PLANS[(family, backward)]
    fields = {"channel": (shape, axis), "token": (math.prod(shape[:-1]), shape[-1]),
              "group": (math.prod(shape[:-1]), shape[-1], group_size)}[family]
    return plan_type.select(descriptor(*fields, *q, dtype, grid), tuning=tuning)


def test_zero_scale_gives_zero_with_zero_gradient_and_nan_propagates():
    x = np.array([[1.0, -2.0, np.nan, 0.26], [1.0, np.nan, 300.0, -1.0]], np.float32)
    scales = np.array([0.0, 0.5], np.float32)
    zps = np.array([3, 1], np.int32)
    y = bn.fake_quantize_per_token(x, scales, zps, q_min=-2, q_max=3)
    # row 0: (clamp(3) - 3) * 0 = 0 (NaN stays NaN); row 1: rint(x / 0.5) + 1 clamped to [-2, 3]
    np.testing.assert_array_equal(y, [[0, 0, np.nan, 0], [1.0, np.nan, 1.0, -1.0]])
    dx = bn.fake_quantize_per_token_backward(np.full_like(x, 2.0), x, scales, zps, q_min=-2, q_max=3)
    np.testing.assert_array_equal(dx, [[0, 0, 0, 0], [2, 0, 0, 2]])
    with pytest.raises(InvalidProblem, match=r"zero_points.*\[-2, 3\].*5 at index 0"):
        bn.fake_quantize_per_token(x, scales, np.array([5, 1], np.int32), q_min=-2, q_max=3)


def test_ties_round_to_even_and_the_mask_is_inclusive():
    x = (np.arange(-130, 130, dtype=np.float32) * 0.5 + 0.25).reshape(2, 130)  # x / 0.5 = k + 0.5: ties
    dy = np.ones_like(x)
    per_tensor = bn.fake_quantize(x, 0.5), bn.fake_quantize_backward(dy, x, 0.5)
    for y, dx in ((bn.fake_quantize_per_channel(x, np.full(130, 0.5, np.float32), None, 1),
                   bn.fake_quantize_per_channel_backward(dy, x, np.full(130, 0.5, np.float32), None, 1)),
                  (bn.fake_quantize_per_token(x, np.full(2, 0.5, np.float32)),
                   bn.fake_quantize_per_token_backward(dy, x, np.full(2, 0.5, np.float32))),
                  (bn.fake_quantize_per_group(x, np.full((2, 2), 0.5, np.float32), None, 65, dtype="int8"),
                   bn.fake_quantize_per_group_backward(dy, x, np.full((2, 2), 0.5, np.float32), None, 65,
                                                       dtype="int8"))):
        np.testing.assert_array_equal(y, per_tensor[0])
        np.testing.assert_array_equal(dx, per_tensor[1])
    # x / 0.5 = -129.5 -> -130 (even) is outside; -128.5 -> -128 and -127.5 -> -128 are inside (inclusive);
    # at the top 126.5 -> 126 is inside and 127.5 -> 128 outside
    np.testing.assert_array_equal(per_tensor[0][0, :3], [-64.0, -64.0, -64.0])
    np.testing.assert_array_equal(per_tensor[1][0, :3], [0, 1, 1])
    np.testing.assert_array_equal(per_tensor[1][1, 126:128], [1, 0])


def test_one_launch_per_call(monkeypatch):
    launches = []
    for method in ("launch", "launch_patched", "launch_values"):  # the simulator's, the GPU's, misaligned operands'
        original = getattr(KernelLauncher, method)
        monkeypatch.setattr(KernelLauncher, method, (lambda fn: lambda self, *a, **k: launches.append(fn.__name__)
                                                     or fn(self, *a, **k))(original))
    x = np.linspace(-2, 2, 96, dtype=np.float32).reshape(12, 8)
    s = np.full(12, 0.05, np.float32)
    bn.fake_quantize_per_channel(x, s, None, 0)
    assert len(launches) == 1
    bn.fake_quantize_per_channel_backward(np.ones_like(x), x, s, None, 0)
    assert len(launches) == 2


def test_plan_surface():
    plan = _plan("channel", False, (4, 256), 0, None, "bf16", "u8", (0, 255))
    assert plan.sku().op is K.FAKE_QUANTIZE and str(plan.sku()) == "quantization/fake_quantize/bf16->u8/sm80/bespoke"
    assert plan.workspace_size() == 0 and plan.precision_guarantee().deterministic
    x = np.linspace(-1, 1, 1024).astype(E.BF16.numpy_dtype).reshape(4, 256)
    out = np.zeros_like(x)
    good = bn.FakeQuantizePerChannelArgs(x, np.full(4, 0.01, np.float32), np.full(4, 128, np.int32), out)
    assert plan.can_implement(good)
    plan.run(good)
    assert_same(out, ref.fake_quantize(x, 0.01, 128, 0, 255))
    bad = bn.FakeQuantizePerChannelArgs(x, np.full(5, 0.01, np.float32), np.full(4, 128, np.int32), out)
    verdict = plan.can_implement(bad)
    assert not verdict and "scale expected 4 elements" in verdict.reason
    with pytest.raises(bn.InvalidProblem, match="scale expected 4 elements"):
        plan.run(bad)
    backward = _plan("group", True, (2, 16), None, 8, "f32", "int4", (-8, 7))
    assert str(backward.sku()) == "quantization/fake_quantize_backward/f32->s4/sm80/bespoke"


@pytest.mark.parametrize(("call", "error", "needle"), [
    (lambda x: bn.fake_quantize_per_channel(x, np.ones(3, np.float32), None, 2), bn.InvalidProblem, "axis expected"),
    (lambda x: bn.fake_quantize_per_channel(x, np.ones(5, np.float32), None, 0), bn.InvalidProblem,
     "scales expected 4 elements"),
    (lambda x: bn.fake_quantize_per_channel(x, np.ones(4, np.float32), None, 0, q_max=300), bn.InvalidProblem,
     "(q_min, q_max) expected within [-128, 127]"),
    (lambda x: bn.fake_quantize_per_channel(x, np.ones(4, np.float32), None, 0, dtype="float8_e4m3fn"),
     bn.Unsupported, "output_element expected s8 or u8"),
    (lambda x: bn.fake_quantize_per_token(x, np.ones(4, np.float32), dtype="int4"), bn.Unsupported,
     "output_element expected s8 or u8"),
    (lambda x: bn.fake_quantize_per_group(x, np.ones((4, 2), np.float32), None, 4, dtype="int8"), bn.InvalidProblem,
     "group_size expected a divisor"),
    (lambda x: bn.fake_quantize_per_group(x, np.ones((4, 2), np.float32), np.zeros((4, 2), np.int32), 3),
     bn.InvalidProblem, "zero_points expected None"),
    (lambda x: bn.fake_quantize_per_token(x[0, 0], np.ones(1, np.float32)), bn.InvalidProblem,
     "x expected an array of rank >= 1"),
], ids=["axis", "scale-count", "range", "fp8-grid", "token-int4", "group-size", "int4-zero-points", "0-d"])
def test_bad_inputs_are_typed_and_named(call, error, needle):
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    with pytest.raises(error) as info:
        call(x)
    assert needle in str(info.value)
    assert str(info.value).startswith("fake_quantize_per_") or str(info.value).startswith("FakeQuantizePer")


def test_empty_tensors():
    for shape in ((0, 5), (3, 0)):
        x = np.zeros(shape, np.float32)
        assert bn.fake_quantize_per_channel(x, np.ones(shape[0], np.float32), None, 0).shape == shape
        assert bn.fake_quantize_per_token_backward(x, x, np.ones(shape[0], np.float32)).shape == shape
    assert bn.fake_quantize_per_group(np.zeros((2, 0), np.float32), np.ones((2, 0), np.float32), None, 8,
                                      dtype="uint8").shape == (2, 0)
