"""Per-channel, per-token and per-group families against the NumPy reference, every registered dtype
pair; shapes, axes, group sizes, zero scales; the plan surface and the error paths."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import requires_gpu
from hypothesis import given
from hypothesis import strategies as st
from test_per_tensor import assert_same, make_values
from tuned import CARDS, per_axis

import baracuda_numba as bn
from baracuda_numba import reference as ref
from baracuda_numba import registry
from baracuda_numba.platform import SIMULATOR
from baracuda_numba.vocabulary import QuantizeKind as K

FAMILIES = {
    "channel": (K.PER_CHANNEL, K.PER_CHANNEL_BACKWARD, K.DEQUANTIZE_PER_CHANNEL, K.DEQUANTIZE_PER_CHANNEL_BACKWARD),
    "token": (K.PER_TOKEN, K.PER_TOKEN_BACKWARD, K.DEQUANTIZE_PER_TOKEN, K.DEQUANTIZE_PER_TOKEN_BACKWARD),
    "group": (K.PER_GROUP, K.PER_GROUP_BACKWARD, K.DEQUANTIZE_PER_GROUP, K.DEQUANTIZE_PER_GROUP_BACKWARD),
}
FAMILY_OF = {kind: family for family, kinds in FAMILIES.items() for kind in kinds}
# int8 / uint8 (FP8: test_fp8.py, 4-bit: test_int4.py)
ENTRIES = [e for e in registry.entries() if e.kind in FAMILY_OF and isinstance(e, registry.RegistryEntry)
           and e.grid is None and e.output_element not in registry.PACKED_ELEMENTS]


def entry_id(entry) -> str:
    return f"{entry.kind.name.lower()}-{entry.input_element.short}-{entry.output_element.short}"


def test_every_family_kind_is_registered_for_every_dtype_pair():
    keys = {e.key for e in ENTRIES}
    for kind in FAMILY_OF:
        for f in registry.FLOAT_ELEMENTS:
            for i in registry.INT_ELEMENTS:
                assert (kind, f, i) in keys


@st.composite
def problems(draw, family):
    rank = draw(st.integers(1, 4)) if family == "channel" else draw(st.integers(1, 3))
    shape = list(draw(st.lists(st.integers(0, 6), min_size=rank, max_size=rank)))
    axis = draw(st.integers(-rank, rank - 1)) if family == "channel" else None
    group_size = None
    if family == "group":
        group_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32]))
        shape[-1] = group_size * draw(st.integers(0, 4))
    if family == "token" and draw(st.booleans()):
        shape[-1] = draw(st.sampled_from([1, 3, 4, 8, 16, 33]))
    low, high = draw(st.sampled_from([(-128, 127), (0, 255), (-8, 7), (0, 15)]))
    return dict(shape=tuple(shape), axis=axis, group_size=group_size, q_range=(low, high),
                seed=draw(st.integers(0, 2**32 - 1)), zero_scales=draw(st.booleans()))


def segments(family, shape, axis, group_size) -> int:
    if family == "channel":
        return shape[axis]
    rows = math.prod(shape[:-1])
    return rows if family == "token" else rows * (shape[-1] // group_size)


def expand(family, values, shape, axis, group_size):
    if family == "channel":
        return ref.expand_channels(values, shape, axis)
    if family == "token":
        return ref.expand_tokens(values, shape)
    return ref.expand_groups(values, shape, group_size)


def run_entry(entry, p):
    family = FAMILY_OF[entry.kind]
    rng = np.random.default_rng(p["seed"])
    f, i = entry.input_element.numpy_dtype, entry.output_element
    shape, axis, group_size = p["shape"], p["axis"], p["group_size"]
    low, high = i.int_range
    q_min, q_max = (min(max(v, low), high) for v in p["q_range"])
    count = segments(family, shape, axis, group_size)
    scale_dtype = np.float64 if f == np.float64 else np.float32
    scales = rng.choice([0.5, 2.0**-6, 0.013, 0.1, 1.7], count).astype(scale_dtype)
    if p["zero_scales"] and count:
        scales[rng.integers(0, count)] = 0
    zero_points = rng.integers(q_min, q_max + 1, count).astype(np.int32)
    full_scale = expand(family, scales, shape, axis, group_size)
    full_zp = expand(family, zero_points, shape, axis, group_size)
    flat_scale = float(np.median(scales)) if count else 0.1
    x = make_values(rng, math.prod(shape), f, max(flat_scale, 1e-3), 0, q_min, q_max).reshape(shape)
    dy = (rng.standard_normal(shape) * 4).astype(np.float32).astype(f)
    extra = {"channel": (axis,), "token": (), "group": (group_size,)}[family]
    kind = entry.kind
    name = {"channel": "per_channel", "token": "per_token", "group": "per_group"}[family]
    if kind in (K.PER_CHANNEL, K.PER_TOKEN, K.PER_GROUP):
        got = getattr(bn, f"quantize_{name}")(x, scales, zero_points, *extra, dtype=i, q_min=q_min, q_max=q_max)
        return got, ref.quantize(x, full_scale, full_zp, q_min, q_max, i.numpy_dtype)
    if kind in (K.PER_CHANNEL_BACKWARD, K.PER_TOKEN_BACKWARD, K.PER_GROUP_BACKWARD):
        got = getattr(bn, f"quantize_{name}_backward")(dy, x, scales, zero_points, *extra, dtype=i, q_min=q_min,
                                                        q_max=q_max)
        return got, ref.quantize_backward(dy, x, full_scale, full_zp, q_min, q_max)
    if kind in (K.DEQUANTIZE_PER_CHANNEL, K.DEQUANTIZE_PER_TOKEN, K.DEQUANTIZE_PER_GROUP):
        low, high = i.int_range
        q = rng.integers(low, high + 1, shape).astype(i.numpy_dtype)
        got = getattr(bn, f"dequantize_{name}")(q, scales, zero_points, *extra, dtype=f)
        return got, ref.dequantize(q, full_scale, full_zp, f)
    got = getattr(bn, f"dequantize_{name}_backward")(dy, scales, *extra, dtype=i)
    return got, ref.dequantize_backward(dy, full_scale)


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_id)
def test_matches_reference(entry):
    @given(problems(FAMILY_OF[entry.kind]))
    def check(p):
        got, expected = run_entry(entry, p)
        assert_same(got, expected)

    check()


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_llm_group_sizes(group_size, dtype):
    rng = np.random.default_rng(group_size)
    f = bn.element_kind(dtype).numpy_dtype
    x = rng.standard_normal((3, 4 * group_size)).astype(np.float32).astype(f)
    scale_dtype = np.float64 if dtype == "float64" else np.float32
    scales = (np.abs(rng.standard_normal((3, 4))) * 0.05 + 0.01).astype(scale_dtype)
    zps = rng.integers(-4, 4, (3, 4)).astype(np.int32)
    q = bn.quantize_per_group(x, scales, zps, group_size)
    full_s, full_z = ref.expand_groups(scales, x.shape, group_size), ref.expand_groups(zps, x.shape, group_size)
    assert_same(q, ref.quantize(x, full_s, full_z, -128, 127, np.int8))
    assert_same(bn.dequantize_per_group(q, scales, zps, group_size, dtype=dtype), ref.dequantize(q, full_s, full_z, f))


def test_zero_scale_quantizes_to_clamped_zero_point_with_zero_gradient():
    x = np.array([[1.0, -2.0, np.inf, np.nan], [1.0, 2.0, 3.0, 4.0]], np.float32)
    scales = np.array([0.0, 0.5], np.float32)
    zps = np.array([3, 0], np.int32)
    q = bn.quantize_per_token(x, scales, zps, q_min=-2, q_max=3)
    np.testing.assert_array_equal(q, [[3, 3, 3, 3], [2, 3, 3, 3]])
    dx = bn.quantize_per_token_backward(np.ones_like(x), x, scales, zps, q_min=-2, q_max=3)
    np.testing.assert_array_equal(dx, [[0, 0, 0, 0], [2, 0, 0, 0]])
    # a zero point outside [q_min, q_max] is refused (tests/test_validation.py), as PyTorch refuses it
    with pytest.raises(bn.InvalidProblem, match=r"zero_points expected integers in \[-2, 3\], got 5 at index 0"):
        bn.quantize_per_token(x, scales, np.array([5, 0], np.int32), q_min=-2, q_max=3)


def test_inclusive_mask_matches_per_tensor_for_every_family():
    x = (np.arange(-130, 130, dtype=np.float32) * 0.5).reshape(2, 130)
    dy = np.ones_like(x)
    per_tensor = bn.quantize_per_tensor_backward(dy, x, 0.5)
    np.testing.assert_array_equal(bn.quantize_per_token_backward(dy, x, np.full(2, 0.5, np.float32)), per_tensor)
    np.testing.assert_array_equal(
        bn.quantize_per_group_backward(dy, x, np.full((2, 1), 0.5, np.float32), None, 130), per_tensor)
    np.testing.assert_array_equal(
        bn.quantize_per_channel_backward(dy, x, np.full(130, 0.5, np.float32), None, 1), per_tensor)
    assert per_tensor[0, 2] == 2 and per_tensor[1, 127] == 2  # q = -128 and q = 127 are inside
    assert per_tensor[0, 1] == 0 and per_tensor[1, 128] == 0


def test_dequantize_of_quantize_is_fake_quantize_per_segment():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 8, 3)).astype(np.float32)
    scales = rng.uniform(0.01, 0.2, 8).astype(np.float32)
    zps = rng.integers(-10, 10, 8).astype(np.int32)
    y = bn.dequantize_per_channel(bn.quantize_per_channel(x, scales, zps, 1), scales, zps, 1)
    for c in range(8):
        np.testing.assert_array_equal(y[:, c], bn.fake_quantize(np.ascontiguousarray(x[:, c]), float(scales[c]),
                                                                int(zps[c])))


def test_scales_and_zero_points_are_converted_from_other_dtypes():
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    expected = bn.quantize_per_token(x, np.full(4, 0.01, np.float32), np.array([1, 2, 3, 4], np.int32))
    np.testing.assert_array_equal(bn.quantize_per_token(x, [0.01] * 4, np.array([1, 2, 3, 4], np.int64)), expected)
    np.testing.assert_array_equal(bn.quantize_per_token(x, np.full(4, 0.01), [1, 2, 3, 4]), expected)
    torch = pytest.importorskip("torch")
    got = bn.quantize_per_token(torch.from_numpy(x), torch.full((4,), 0.01, dtype=torch.float64),
                                torch.tensor([1, 2, 3, 4]))
    np.testing.assert_array_equal(got.numpy(), expected)


def test_any_rank_token_rows():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    scales = rng.uniform(0.01, 0.1, (2, 3)).astype(np.float32)
    q = bn.quantize_per_token(x, scales)
    assert q.shape == (2, 3, 8)
    assert_same(q, ref.quantize(x, ref.expand_tokens(scales, x.shape), 0, -128, 127, np.int8))


def test_plan_surface():
    desc = bn.QuantizePerGroupDescriptor(outer_size=4, axis_size=256, group_size=128, q_min=-8, q_max=7,
                                         input_element="bf16", output_element="s8")
    plan = bn.QuantizePerGroupPlan.select(desc)
    assert plan.sku().op is K.PER_GROUP and plan.workspace_size() == 0 and desc.num_groups == 2
    x = np.linspace(-1, 1, 1024).astype(bn.ElementKind.BF16.numpy_dtype).reshape(4, 256)
    out = np.zeros((4, 256), np.int8)
    good = bn.QuantizePerGroupArgs(x, np.full((4, 2), 0.1, np.float32), np.zeros((4, 2), np.int32), out)
    assert plan.can_implement(good)
    bad = bn.QuantizePerGroupArgs(x, np.full((4, 3), 0.1, np.float32), np.zeros((4, 2), np.int32), out)
    verdict = plan.can_implement(bad)
    assert not verdict and verdict.reason == "QuantizePerGroupPlan: scale expected 8 elements, got 12 (shape (4, 3))"
    wrong_type = bn.QuantizePerGroupArgs(x, np.full((4, 2), 0.1, np.float16), np.zeros((4, 2), np.int32), out)
    assert "scale expected elements of f32, got f16" in plan.can_implement(wrong_type).reason
    plan.run(good)
    np.testing.assert_array_equal(out, bn.quantize_per_group(x, np.full((4, 2), 0.1), None, 128, q_min=-8, q_max=7))
    with pytest.raises(bn.InvalidProblem, match="args expected QuantizePerGroupArgs, got QuantizePerTokenArgs"):
        plan.run(bn.QuantizePerTokenArgs(x, None, None, out))


@pytest.mark.parametrize(("call", "error", "needle"), [
    (lambda x: bn.quantize_per_channel(x, np.ones(3, np.float32), None, 2), bn.InvalidProblem,
     "axis expected in [-2, 2) for shape (4, 6), got 2"),
    (lambda x: bn.quantize_per_channel(x, np.ones(3, np.float32), None, 1), bn.InvalidProblem,
     "scales expected 6 elements, got 3"),
    (lambda x: bn.quantize_per_channel(x, np.ones(6, np.float32), np.ones(5, np.int32), 1), bn.InvalidProblem,
     "zero_points expected 6 elements, got 5"),
    (lambda x: bn.quantize_per_channel(x, np.ones(6, np.float32), np.ones(6, np.float32) * 0.5, 1),
     bn.InvalidProblem, "zero_points expected integer zero points, got f32"),
    (lambda x: bn.quantize_per_group(x, np.ones((4, 2), np.float32), None, 4), bn.InvalidProblem,
     "group_size expected a divisor of axis_size (6), got 4"),
    (lambda x: bn.quantize_per_group(x, np.ones((4, 2), np.float32), None, 0), bn.InvalidProblem,
     "group_size expected > 0, got 0"),
    (lambda x: bn.quantize_per_group(x, np.ones((4, 2), np.float32), None, -3), bn.InvalidProblem,
     "group_size expected > 0, got -3"),
    (lambda x: bn.quantize_per_token(x, np.ones(4, np.float32), None, q_min=3, q_max=2), bn.InvalidProblem,
     "q_min expected <= q_max (2), got 3"),
    (lambda x: bn.quantize_per_token(x, np.ones(4, np.float32), None, dtype="uint8", q_min=-1), bn.InvalidProblem,
     "within [0, 255]"),
    (lambda x: bn.quantize_per_token(x.T, np.ones(6, np.float32)), bn.InvalidProblem,
     "x expected a C-contiguous array"),
    (lambda x: bn.quantize_per_token(x, np.ones(8, np.float32)[::2]), bn.InvalidProblem,
     "scales expected a C-contiguous array"),
    (lambda x: bn.quantize_per_token(x.astype(np.int8), np.ones(4, np.float32)), bn.Unsupported, "f32->s8"),
    (lambda x: bn.quantize_per_token(np.float32(1.0), np.ones(1, np.float32)), bn.InvalidProblem,
     "x expected an array of rank >= 1"),
    (lambda x: bn.dequantize_per_token(np.zeros((4, 6), np.int8), "abc", None), bn.InvalidProblem,
     "scales expected f32 elements"),
])
def test_bad_inputs_are_named(call, error, needle):
    x = np.zeros((4, 6), np.float32)
    with pytest.raises(error) as info:
        call(x)
    assert needle in str(info.value)


def test_empty_and_degenerate_shapes():
    assert bn.quantize_per_channel(np.zeros((0, 3), np.float32), np.ones(3, np.float32), None, 1).shape == (0, 3)
    assert bn.quantize_per_channel(np.zeros((3, 0), np.float32), np.ones(3, np.float32), None, 0).shape == (3, 0)
    assert bn.quantize_per_token(np.zeros((0, 5), np.float32), np.ones(0, np.float32)).shape == (0, 5)
    assert bn.quantize_per_group(np.zeros((2, 0), np.float32), np.ones((2, 0), np.float32), None, 8).shape == (2, 0)


@pytest.mark.parametrize("tuning", CARDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("shape", [(5, 2, 8), (9, 16), (7, 24), (4, 3, 5), (40, 16), (3, 65, 8), (72, 16)])
def test_last_axis_channels_thread_stationary_and_not(shape, dtype, tuning):
    # channels along the last axes: one grid stride is a whole number of channel periods (each thread
    # loads its chunk's parameters once) for 8 / 16 channels, and not for 24 or 15 elements per period
    # on the simulator's 2 x 32-thread grid (40 x 16 and 3 x 65 x 8: several chunks per thread; 72 x 16:
    # enough for the stationary loop's 2, 4 or 8 chunks in flight and some left over); every op against
    # the reference either way, under every card's tuning value
    rng = np.random.default_rng(len(shape) * 100 + shape[-1])
    f = bn.element_kind(dtype).numpy_dtype
    scale_dtype = np.float64 if dtype == "float64" else np.float32
    for axis in (len(shape) - 1, len(shape) - 2):
        count = shape[axis]
        scales = rng.choice([0.5, 2.0**-6, 0.013, 0.1, 1.7], count).astype(scale_dtype)
        scales[rng.integers(0, count)] = 0
        zps = rng.integers(-6, 6, count).astype(np.int32)
        full_s, full_z = ref.expand_channels(scales, shape, axis), ref.expand_channels(zps, shape, axis)
        x = (rng.standard_normal(shape) * 2).astype(np.float32).astype(f)
        dy = rng.standard_normal(shape).astype(np.float32).astype(f)
        common = dict(scales=scales, axis=axis)
        q = per_axis("quantize", "channel", tuning, x=x, zero_points=zps, **common)
        assert_same(q, ref.quantize(x, full_s, full_z, -128, 127, np.int8))
        assert_same(per_axis("dequantize", "channel", tuning, q=q, zero_points=zps, dtype=dtype, **common),
                    ref.dequantize(q, full_s, full_z, f))
        assert_same(per_axis("quantize_backward", "channel", tuning, x=x, dy=dy, zero_points=zps, **common),
                    ref.quantize_backward(dy, x, full_s, full_z, -128, 127))
        assert_same(per_axis("dequantize_backward", "channel", tuning, dy=dy, **common),
                    ref.dequantize_backward(dy, full_s))
    desc = bn.QuantizePerChannelDescriptor(shape, len(shape) - 1, -128, 127, bn.element_kind(dtype), "s8")
    plan = bn.QuantizePerChannelPlan.select(desc, tuning=tuning)
    if not plan._uniform:
        period = shape[-1]
        blocks, step_q, step_r, launcher = plan._geometry(plan._n // plan._chunk, 0)
        stride = blocks * plan._policy.threads_per_block * plan._chunk
        assert (step_q == step_r == 0) == (stride % period == 0)
        # the thread-stationary kernel (no general loop) exactly where the stride is whole periods
        assert (launcher is plan._stationary_launcher) == (step_q == step_r == 0)
        assert launcher in (plan._launcher, plan._stationary_launcher)
        if SIMULATOR and tuning.elementwise.elementwise_policy.blocks_per_sm == 2:
            # a 2-block grid: stationary exactly where 8 or 16 divide the 32-thread stride
            assert (step_q == step_r == 0) == (period in (8, 16))


@requires_gpu
def test_gpu_stationary_grid_over_several_waves_matches_reference():
    # bf16 along the last of 4096 channels: the thread-stationary kernel over more blocks than one resident
    # wave (the tuning's stationary_waves), each thread's parameters loaded once per block; every op
    # against the float64 reference, the zero scale and +-inf / NaN included
    from baracuda_numba.plans.base import sm_count
    from baracuda_numba.plans.tuning import H100_TUNING

    rng = np.random.default_rng(4096)
    shape = (2048, 4096)
    f = bn.element_kind("bfloat16").numpy_dtype
    scales = rng.choice([0.5, 2.0**-6, 0.013, 0.1, 1.7], 4096).astype(np.float32)
    scales[17] = 0
    zps = rng.integers(-6, 6, 4096).astype(np.int32)
    full_s, full_z = ref.expand_channels(scales, shape, 1), ref.expand_channels(zps, shape, 1)
    x = (rng.standard_normal(shape) * 2).astype(np.float32).astype(f)
    x[3, :3] = np.inf, -np.inf, np.nan
    dy = rng.standard_normal(shape).astype(np.float32).astype(f)
    q = bn.quantize_per_channel(x, scales, zps, 1)
    assert_same(q, ref.quantize(x, full_s, full_z, -128, 127, np.int8))
    assert_same(bn.dequantize_per_channel(q, scales, zps, 1, dtype="bfloat16"), ref.dequantize(q, full_s, full_z, f))
    assert_same(bn.quantize_per_channel_backward(dy, x, scales, zps, 1),
                ref.quantize_backward(dy, x, full_s, full_z, -128, 127))
    assert H100_TUNING.elementwise.waves(2) > 1
    for plan in (bn.QuantizePerChannelPlan.select(bn.QuantizePerChannelDescriptor(shape, 1, -128, 127, "bf16", "s8"),
                                                  tuning=H100_TUNING),
                 bn.DequantizePerChannelPlan.select(bn.DequantizePerChannelDescriptor(shape, 1, "bf16", "s8"),
                                                    tuning=H100_TUNING)):
        blocks, step_q, step_r, launcher = plan._geometry(plan._n // plan._chunk, 0)
        assert launcher is plan._stationary_launcher and step_q == step_r == 0
        assert blocks > plan._resident_blocks * sm_count(0)


@pytest.mark.parametrize("tuning", CARDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("cols", [8, 24, 4096, 6, 5])
def test_last_axis_channel_vectors_and_their_alignment(cols, dtype, tuning):
    # dequantize and quantize backward of f32 / f64 data along the last axis read each chunk's scales and
    # zero points as vectors where the chunk (4 / 2 elements) divides the channel count; bf16 data (8 per
    # chunk), other counts and quantize keep the per-element kernels. Scale and zero-point views off their
    # vector alignment take the element path. Every result against the float64 reference, under every card's
    # tuning value.
    rng = np.random.default_rng(cols)
    f = bn.element_kind(dtype).numpy_dtype
    scale_dtype = np.float64 if dtype == "float64" else np.float32
    shape = (9, cols)
    chunk = 16 // max(np.dtype(f).itemsize, 1)
    vectors = dtype != "bfloat16" and cols % chunk == 0
    element = bn.element_kind(dtype)
    deq = bn.DequantizePerChannelPlan.select(bn.DequantizePerChannelDescriptor(shape, 1, element, bn.ElementKind.S8),
                                             tuning=tuning)
    back = bn.QuantizePerChannelBackwardPlan.select(
        bn.QuantizePerChannelBackwardDescriptor(shape, 1, -128, 127, element, bn.ElementKind.S8), tuning=tuning)
    quant = bn.QuantizePerChannelPlan.select(bn.QuantizePerChannelDescriptor(shape, 1, -128, 127, element,
                                                                             bn.ElementKind.S8), tuning=tuning)
    assert deq._channel_vectors() == back._channel_vectors() == vectors
    assert not quant._channel_vectors()
    if vectors:
        assert deq._stationary_launcher is None and deq._policy == tuning.elementwise.channel_vector_policy
    scale_buffer = rng.choice([0.5, 2.0**-6, 0.013, 0.1, 1.7, 0.0], cols + 1).astype(scale_dtype)
    zp_buffer = rng.integers(-6, 6, cols + 1).astype(np.int32)
    q = rng.integers(-128, 128, shape).astype(np.int8)
    x = (rng.standard_normal(shape) * 2).astype(np.float32).astype(f)
    dy = rng.standard_normal(shape).astype(np.float32).astype(f)
    for offset in (0, 1):  # 1: the views start 4 (8) bytes into their buffers
        scales, zps = scale_buffer[offset:offset + cols], zp_buffer[offset:offset + cols]
        full_s, full_z = ref.expand_channels(scales, shape, 1), ref.expand_channels(zps, shape, 1)
        assert_same(per_axis("dequantize", "channel", tuning, q=q, scales=scales, zero_points=zps, axis=1, dtype=dtype),
                    ref.dequantize(q, full_s, full_z, f))
        assert_same(per_axis("quantize_backward", "channel", tuning, x=x, dy=dy, scales=scales, zero_points=zps,
                             axis=1), ref.quantize_backward(dy, x, full_s, full_z, -128, 127))


@pytest.mark.parametrize("tuning", CARDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize(("family", "cols", "group_size"), [
    ("group", 512, 128), ("group", 384, 64), ("group", 288, 48), ("token", 256, None), ("token", 96, None),
    ("channel", 512, None), ("channel", 40, None)])
def test_power_of_two_segments_shift_and_tracking_agree_with_reference(family, cols, group_size, dtype, tuning):
    # Segments of a power-of-two number of chunks (group 128 / 64, rows of 256 / 512) take the
    # kernel that finds a chunk's segment by a shift; 48-element groups and rows of 96 / 40 elements
    # track it incrementally. Many more chunks than the grid's threads, so each thread strides. Every
    # card's tuning value.
    rng = np.random.default_rng(cols)
    f = bn.element_kind(dtype).numpy_dtype
    shape = (24, cols)
    scale_dtype = np.float64 if dtype == "float64" else np.float32
    axis = 0 if family == "channel" else None
    count = segments(family, shape, axis, group_size)
    scales = rng.choice([0.5, 2.0**-6, 0.013, 0.1, 1.7], count).astype(scale_dtype)
    scales[rng.integers(0, count)] = 0
    zps = rng.integers(-6, 6, count).astype(np.int32)
    full_s, full_z = (expand(family, v, shape, axis, group_size) for v in (scales, zps))
    x = (rng.standard_normal(shape) * 3).astype(np.float32).astype(f)
    layout = dict(scales=scales, zero_points=zps, axis=axis, group_size=group_size)
    q = per_axis("quantize", family, tuning, x=x, **layout)
    assert_same(q, ref.quantize(x, full_s, full_z, -128, 127, np.int8))
    assert_same(per_axis("dequantize", family, tuning, q=q, dtype=dtype, **layout),
                ref.dequantize(q, full_s, full_z, f))
    dy = rng.standard_normal(shape).astype(np.float32).astype(f)
    assert_same(per_axis("quantize_backward", family, tuning, x=x, dy=dy, **layout),
                ref.quantize_backward(dy, x, full_s, full_z, -128, 127))
    seg_len = group_size or cols
    chunks = seg_len // (16 // np.dtype(f).itemsize)
    descriptor = {"group": lambda: bn.QuantizePerGroupDescriptor(*shape, group_size, -128, 127, dtype, "s8"),
                  "token": lambda: bn.QuantizePerTokenDescriptor(*shape, -128, 127, dtype, "s8"),
                  "channel": lambda: bn.QuantizePerChannelDescriptor(shape, 0, -128, 127, dtype, "s8")}[family]()
    plan = {"group": bn.QuantizePerGroupPlan, "token": bn.QuantizePerTokenPlan,
            "channel": bn.QuantizePerChannelPlan}[family].select(descriptor, tuning=tuning)
    pow2 = seg_len % (16 // np.dtype(f).itemsize) == 0 and chunks & (chunks - 1) == 0
    assert plan._pow2_segments() == pow2
    kernel = plan.entry.kernel(tuning.elementwise.kernel, plan._uniform, None, pow2)
    assert ("_pow2_" in kernel.py_func.__name__) == pow2


@requires_gpu
def test_zero_points_of_device_arrays_are_made_once(monkeypatch):
    """``zero_points=None`` on numba device arrays reads zeros made once per size and device: a new array per call
    cost a device allocation and a synchronous copy (``baracuda-numba demo`` read per-group ops at 3-9% of the copy)."""
    from numba import cuda

    x = cuda.device_array((64, 256), np.float32)
    x.copy_to_device(np.linspace(-3, 3, 64 * 256, dtype=np.float32).reshape(64, 256))
    scales = cuda.device_array((64, 2), np.float32)
    scales.copy_to_device(np.full((64, 2), 0.05, np.float32))
    # the reference from host arrays first: on a GPU the host call stages its scales and zeros (128 elements each)
    expected = bn.quantize_per_group(x.copy_to_host(), scales.copy_to_host(), None, 128)
    made = []
    to_device = cuda.to_device
    monkeypatch.setattr(cuda, "to_device", lambda *args, **kwargs: made.append(args[0].size) or to_device(*args,
                                                                                                          **kwargs))
    results = [bn.quantize_per_group(x, scales, None, 128).copy_to_host() for _ in range(3)]
    assert made.count(128) <= 1
    assert all(np.array_equal(r, expected) for r in results)
