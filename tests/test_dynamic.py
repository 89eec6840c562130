"""Dynamic-range quantize: every mode x scope x dtype pair against the NumPy reference, the identity
with the static plans, special values, determinism, bad inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import SIMULATOR, requires_gpu
from hypothesis import given, settings
from hypothesis import strategies as st
from test_per_tensor import assert_same
from tuned import CARDS, dynamic

import baracuda_numba as bn
from baracuda_numba import registry
from baracuda_numba.plans.tuning import current_tuning
from baracuda_numba.reference import dynamic as ref_dynamic

# int8 / uint8 (FP8: test_fp8.py, packed int4: test_int4.py)
ENTRIES = [e for e in registry.entries()
           if isinstance(e, registry.DynamicRangeEntry) and e.output_element in registry.INT_ELEMENTS]
SCOPES = ["tensor", "channel", "token", "group"]
MODES = ["symmetric", "asymmetric"]


def entry_id(entry) -> str:
    return f"{entry.input_element.short}-{entry.output_element.short}"


def test_every_dtype_pair_is_registered():
    assert {(e.input_element, e.output_element) for e in ENTRIES} == {
        (f, i) for f in registry.FLOAT_ELEMENTS for i in registry.INT_ELEMENTS}


@st.composite
def problems(draw, scope):
    rank = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank))
    axis = draw(st.integers(-rank, rank - 1)) if scope == "channel" else None
    group_size = None
    if scope == "group":
        group_size = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
        shape[-1] = group_size * draw(st.integers(1, 3))
    return dict(shape=tuple(shape), axis=axis, group_size=group_size, seed=draw(st.integers(0, 2**32 - 1)),
                zero_rows=draw(st.booleans()), specials=draw(st.booleans()), spread=draw(st.sampled_from(
                    [1e-3, 1.0, 300.0])))


def data(p, dtype):
    rng = np.random.default_rng(p["seed"])
    x = rng.standard_normal(p["shape"]) * p["spread"] + rng.uniform(-1, 1) * p["spread"]
    flat = x.reshape(-1)
    if p["zero_rows"]:
        flat[: max(1, flat.size // 3)] = 0.0
    if p["specials"]:
        flat[rng.integers(0, flat.size, 3)] = [np.nan, np.inf, -np.inf]
    return x.astype(np.float32).astype(dtype)


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("entry", ENTRIES, ids=entry_id)
def test_matches_reference(entry, mode, scope):
    f, i = entry.input_element, entry.output_element

    @settings(max_examples=6 if SIMULATOR else 25)
    @given(problems(scope))
    def check(p):
        x = data(p, f.numpy_dtype)
        q_min, q_max = bn.plans.dynamic.default_dynamic_q_range(bn.plans.dynamic.DynamicRangeMode(mode), i)
        result = bn.dynamic_range_quantize(x, mode=mode, scope=scope, dtype=i, axis=p["axis"],
                                           group_size=p["group_size"])
        axis = None if p["axis"] is None else p["axis"] % len(p["shape"])
        q, scale, zero_point = ref_dynamic.dynamic_range_quantize(x, mode, scope, q_min, q_max, i.numpy_dtype,
                                                                  axis, p["group_size"])
        assert_same(result.scale, scale)
        assert_same(result.q, q)
        if mode == "asymmetric":
            assert_same(result.zero_point, zero_point)
        else:
            assert result.zero_point == (None if i is bn.ElementKind.S8 else 128)

    check()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_identity_with_the_static_plans(mode, dtype):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((6, 32)) * 2 + 0.3).astype(bn.element_kind(dtype).numpy_dtype)
    for out in ("int8", "uint8"):
        token = bn.dynamic_range_quantize(x, mode=mode, dtype=out)
        zp = token.zero_point if mode == "asymmetric" else np.full(6, token.zero_point or 0, np.int32)
        assert_same(bn.quantize_per_token(x, token.scale, zp, dtype=out, q_min=_qmin(mode, out), q_max=255 if
                                          out == "uint8" else 127), token.q)
        group = bn.dynamic_range_quantize(x, mode=mode, scope="group", group_size=8, dtype=out)
        zp = group.zero_point if mode == "asymmetric" else np.full((6, 4), group.zero_point or 0, np.int32)
        assert_same(bn.quantize_per_group(x, group.scale, zp, 8, dtype=out, q_min=_qmin(mode, out),
                                          q_max=255 if out == "uint8" else 127), group.q)
        for axis in (0, 1):
            channel = bn.dynamic_range_quantize(x, mode=mode, scope="channel", axis=axis, dtype=out)
            count = x.shape[axis]
            zp = channel.zero_point if mode == "asymmetric" else np.full(count, channel.zero_point or 0, np.int32)
            assert_same(bn.quantize_per_channel(x, channel.scale, zp, axis, dtype=out, q_min=_qmin(mode, out),
                                                q_max=255 if out == "uint8" else 127), channel.q)
        tensor = bn.dynamic_range_quantize(x, mode=mode, scope="tensor", dtype=out)
        zp = int(tensor.zero_point) if mode == "asymmetric" else (tensor.zero_point or 0)
        assert_same(bn.quantize_per_tensor(x, float(tensor.scale), zp, dtype=out, q_min=_qmin(mode, out),
                                           q_max=255 if out == "uint8" else 127), tensor.q)


def _qmin(mode: str, out: str) -> int:
    return 0 if out == "uint8" else (-127 if mode == "symmetric" else -128)


def test_defaults_and_special_segments():
    x = np.array([[0.0, 0.0, 0.0, 0.0], [1.0, -2.0, np.nan, np.inf], [127.0, -127.0, 63.5, 0.5]], np.float32)
    r = bn.dynamic_range_quantize(x)
    np.testing.assert_array_equal(r.scale, np.float32([1.0, 2.0 / 127, 1.0]))  # all-zero row: scale 1
    np.testing.assert_array_equal(r.q[0], [0, 0, 0, 0])
    np.testing.assert_array_equal(r.q[1], [64, -127, 0, 127])  # NaN -> zp, inf saturates; range ignores them
    np.testing.assert_array_equal(r.q[2], [127, -127, 64, 0])  # 63.5 and 0.5 are ties: half to even
    a = bn.dynamic_range_quantize(np.array([[1.0, 2.0, 3.0]], np.float32), mode="asymmetric", dtype="uint8")
    assert a.zero_point[0] == 0 and a.scale[0] == np.float32(np.float32(3.0) / np.float32(255))
    u = bn.dynamic_range_quantize(np.array([[-1.0, 1.0]], np.float32), dtype="uint8")
    assert u.zero_point == 128
    np.testing.assert_array_equal(u.q, [[1, 255]])


def test_tiny_ranges_keep_a_finite_reciprocal():
    x = np.array([[1e-44, -1e-45]], np.float32)  # subnormal: max / 127 underflows
    r = bn.dynamic_range_quantize(x)
    assert r.scale[0] == np.finfo(np.float32).tiny
    assert np.isfinite(np.float32(1) / r.scale[0])


def test_many_rows_small_simulated_grid():
    x = np.random.default_rng(0).standard_normal((3000, 3)).astype(np.float32)
    r = bn.dynamic_range_quantize(x)
    q, scale, _ = ref_dynamic.dynamic_range_quantize(x, "symmetric", "token", -127, 127)
    assert_same(r.scale, scale)
    assert_same(r.q, q)


@pytest.mark.parametrize(("kwargs", "error", "needle"), [
    (dict(mode="sym"), bn.InvalidProblem, "mode expected 'symmetric' or 'asymmetric', got 'sym'"),
    (dict(scope="rows"), bn.InvalidProblem, "scope expected one of"),
    (dict(scope="channel"), bn.InvalidProblem, "axis expected an integer for scope='channel'"),
    (dict(scope="channel", axis=2), bn.InvalidProblem, "scope.axis expected in [-2, 2), got 2"),
    (dict(scope="group"), bn.InvalidProblem, "group_size expected an integer"),
    (dict(scope="group", group_size=5), bn.InvalidProblem, "a divisor of the last dimension (8)"),
    (dict(scope="group", group_size=0), bn.InvalidProblem, "scope.group_size expected an integer > 0"),
    (dict(q_min=0, q_max=0), bn.InvalidProblem, "room above the symmetric zero point"),
    (dict(mode="asymmetric", q_min=3, q_max=3), bn.InvalidProblem, "q_max > q_min"),
    (dict(q_min=-200), bn.InvalidProblem, "within [-128, 127]"),
    (dict(dtype="float32"), bn.Unsupported, "DynamicRangeQuantizePlan: (input_element, output_element)"),
])
def test_bad_arguments(kwargs, error, needle):
    with pytest.raises(error) as info:
        bn.dynamic_range_quantize(np.zeros((4, 8), np.float32), **kwargs)
    assert needle in str(info.value)


def test_plan_surface_and_workspace():
    desc = bn.DynamicRangeQuantizeDescriptor((4, 8), bn.DynamicRangeMode.ASYMMETRIC,
                                             bn.DynamicRangeScope.channel(1), -128, 127, "f32", "s8")
    plan = bn.DynamicRangeQuantizePlan.select(desc)
    assert plan.scale_count() == 8 and plan.scale_shape() == (8,) and plan.workspace_size() > 0
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    q, scale, zp = np.empty((4, 8), np.int8), np.empty(8, np.float32), np.empty(8, np.int32)
    args = bn.DynamicRangeQuantizeArgs(x, q, scale, zp)
    assert plan.can_implement(args)
    plan.run(args, workspace=np.zeros(plan.workspace_size(), np.uint8))
    expected = ref_dynamic.dynamic_range_quantize(x, "asymmetric", "channel", -128, 127, axis=1)
    assert_same(q, expected[0])
    assert_same(scale, expected[1])
    with pytest.raises(bn.WorkspaceTooSmall):
        plan.run(args, workspace=np.zeros(4, np.uint8))
    verdict = plan.can_implement(bn.DynamicRangeQuantizeArgs(x, q, scale, None))
    assert not verdict and "zero_point expected an int32 array in asymmetric mode" in verdict.reason


@requires_gpu
def test_gpu_many_rows_deterministic_and_torch_composition():
    torch = pytest.importorskip("torch")
    x = torch.randn(131_072, 64, device="cuda", dtype=torch.bfloat16)
    first = bn.dynamic_range_quantize(x)
    second = bn.dynamic_range_quantize(x)
    assert torch.equal(first.q, second.q) and torch.equal(first.scale, second.scale)
    # true division (a Python-scalar divisor makes torch multiply by its reciprocal instead)
    scale = x.float().abs().amax(dim=1) / torch.tensor(127.0, device="cuda")
    assert torch.equal(first.scale, scale)
    expected = torch.clamp(torch.round(x.float() * (1.0 / scale)[:, None]), -127, 127).to(torch.int8)
    assert torch.equal(first.q, expected)
    tensor = bn.dynamic_range_quantize(x, scope="tensor")
    assert torch.equal(tensor.scale, x.float().abs().amax() / torch.tensor(127.0, device="cuda"))
    asym = bn.dynamic_range_quantize(x, mode="asymmetric", scope="group", group_size=32)
    g = x.float().view(-1, 32)
    lo, hi = g.amin(1).clamp(max=0), g.amax(1).clamp(min=0)
    s = (hi - lo) / torch.tensor(255.0, device="cuda")
    assert torch.equal(asym.scale.view(-1), s)
    zp = torch.clamp(-128 - torch.round(lo / s), -128, 127).to(torch.int32)
    assert torch.equal(asym.zero_point.view(-1), zp)


@requires_gpu
@pytest.mark.parametrize(("shape", "dtype"), [((4096, 4096), "bfloat16"), ((999, 4103), "float32")])
def test_gpu_tensor_scope_calls_queued_back_to_back_each_see_their_own_range(shape, dtype):
    """The tensor scope's two launches share one workspace of partial ranges. Calls queued with no sync
    between them, each with a range of its own, must each get ``amax / 127`` of their own ``x`` and its
    quantize, bit for bit against torch."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(shape[1])
    xs = [(torch.randn(shape, device="cuda", generator=g) * (1 + 3 * i)).to(getattr(torch, dtype)) for i in range(8)]
    plan = bn.DynamicRangeQuantizePlan.select(bn.DynamicRangeQuantizeDescriptor(
        shape, bn.DynamicRangeMode.SYMMETRIC, bn.DynamicRangeScope.tensor(), -127, 127, bn.ElementKind(
            {"bfloat16": "bf16", "float32": "f32"}[dtype]), bn.ElementKind.S8))
    workspace = torch.empty(plan.workspace_size(), device="cuda", dtype=torch.uint8)
    outs = [(torch.empty(shape, device="cuda", dtype=torch.int8), torch.empty(1, device="cuda"),
             torch.empty(1, device="cuda", dtype=torch.int32)) for _ in xs]
    for x, (q, scale, zero_point) in zip(xs, outs, strict=True):
        plan.run(bn.DynamicRangeQuantizeArgs(x, q, scale, zero_point), workspace=workspace)
    torch.cuda.synchronize()
    for x, (q, scale, _) in zip(xs, outs, strict=True):
        expected_scale = x.float().abs().amax() / torch.tensor(127.0, device="cuda")
        assert torch.equal(scale[0], expected_scale)
        expected = torch.clamp(torch.round(x.float() * (1.0 / expected_scale)), -127, 127).to(torch.int8)
        assert torch.equal(q, expected)


def with_dynamic(base=None, **fields):
    """``base`` (default: the current device's tuning value) with these dynamic-range fields replaced."""
    base = base or current_tuning()
    return dataclasses.replace(base, dynamic=dataclasses.replace(base.dynamic, **fields))


def _special(shape, dtype, seed=5, offset=0):
    """Normal data with an all-zero row and column (when 2-D), NaN, +-inf and a tiny row; ``offset``
    elements into a larger buffer (so that the operand is not 16-byte aligned when ``offset`` > 0)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    x = (rng.standard_normal(n + offset) * 3).astype(np.float32)
    rows = x[offset:].reshape(-1, shape[-1])
    rows[0] = 0.0
    rows[:, min(2, shape[-1] - 1)] = 0.0
    rows[-1] *= 1e-3
    flat = x[offset:]
    flat[rng.integers(0, n, 3)] = [np.nan, np.inf, -np.inf]
    return x.astype(dtype)[offset:].reshape(shape)


# (tuning, shape, scope kwargs, offset): every kernel path of the plan, with odd sizes and tails
KERNEL_PATHS = [
    # resident segments: lanes of two warps meeting in shared memory (64 threads, tps 64), rows of a
    # chunk count that is not a multiple of the lanes, rows that need all keep chunks
    (dict(resident_threads=64, resident_keep=2), (5, 1000), {}, 0),
    (dict(resident_threads=64, resident_keep=1), (3, 504), dict(mode="asymmetric"), 0),
    (dict(resident_threads=64, resident_keep=2), (7, 96), dict(scope="group", group_size=24), 0),
    # resident, unaligned rows (element path) and a misaligned operand
    (dict(resident_threads=64, resident_keep=2), (4, 333), {}, 0),
    (dict(resident_threads=32, resident_keep=2), (6, 64), {}, 1),
    # staged resident segments (cp.async into shared memory a round ahead): blocks of several rounds,
    # several segments per block, the last round partly past the last segment; unaligned: resident
    (dict(resident_threads=64, resident_keep=2, resident_staged=True, resident_blocks_per_sm=2), (9, 512), {}, 0),
    (dict(resident_threads=64, resident_keep=1, resident_staged=True, resident_blocks_per_sm=1), (7, 128),
     dict(scope="group", group_size=64, mode="asymmetric"), 0),
    (dict(resident_threads=32, resident_keep=2, resident_staged=True), (5, 70), {}, 1),
    # streaming segments (longer than keep * threads chunks)
    (dict(resident_threads=32, resident_keep=1), (2, 1000), dict(mode="asymmetric"), 0),
    # as many segments as SMs (the simulator's 1), too long for the resident block: one wider block each
    # (f32 250 chunks over 128 threads x 2, f16 125 over 64 x 2; f32 over 32 x 8, f16 over 32 x 4), or
    # streaming when even the widest is too narrow
    (dict(resident_threads=32, resident_keep=2, wide_segment_threads=128, wide_segment_keep=2), (1, 1000), {}, 0),
    (dict(resident_threads=32, resident_keep=2, wide_segment_threads=128, wide_segment_base_threads=32), (1, 1000),
     {}, 0),
    (dict(resident_threads=32, resident_keep=2, wide_segment_threads=64, wide_segment_keep=2), (1, 2000),
     dict(mode="asymmetric"), 0),
    # tensor: partials per block, odd size (element tail), misaligned
    (dict(tensor_partial_blocks_per_sm=3, tensor_quantize_blocks_per_sm=2), (37, 41), dict(scope="tensor"), 0),
    (dict(), (9, 40), dict(scope="tensor", mode="asymmetric"), 3),
    # columns: chunked (width % G == 0), with inner elements, element path (odd width), misaligned
    (dict(column_threads_per_sm=64), (23, 48), dict(scope="channel", axis=1), 0),
    (dict(column_threads_per_sm=64), (9, 6, 8), dict(scope="channel", axis=1, mode="asymmetric"), 0),
    (dict(column_threads_per_sm=32), (11, 5, 3), dict(scope="channel", axis=1), 0),
    (dict(column_threads_per_sm=64), (13, 3, 16), dict(scope="channel", axis=0), 0),
    (dict(column_threads_per_sm=64), (10, 16), dict(scope="channel", axis=1, mode="asymmetric"), 1),
]


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize(("fields", "shape", "kwargs", "offset"), KERNEL_PATHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_every_kernel_path(fields, shape, kwargs, offset, dtype, card):
    """Each path under each card's tuning value (tests/tuned.py) with the path's launch shape in it."""
    tuning = with_dynamic(card, **fields)
    x = _special(shape, dtype, offset=offset)
    mode = kwargs.get("mode", "symmetric")
    scope = kwargs.get("scope", "token")
    axis = kwargs.get("axis")
    for out in ("int8", "uint8"):
        q_min, q_max = bn.plans.dynamic.default_dynamic_q_range(bn.plans.dynamic.DynamicRangeMode(mode),
                                                                bn.element_kind(out))
        got_q, got_scale, got_zero_point = dynamic(tuning, x, out=out, **kwargs)
        q, scale, zero_point = ref_dynamic.dynamic_range_quantize(x, mode, scope, q_min, q_max, np.dtype(out),
                                                                  axis, kwargs.get("group_size"))
        assert_same(got_scale, scale)
        assert_same(got_q, q)
        if mode == "asymmetric":
            assert_same(got_zero_point, zero_point)


@pytest.mark.parametrize("tuning", CARDS)
@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(3, 64), (70, 40), (2, 1000)])
def test_every_card_tuning_matches_reference(shape, mode, scope, tuning):
    """Each card's tuning value as it is (its launch shapes, chunks per lane, prefetches; tests/tuned.py) gives
    the reference's bits in every scope, f16 in, int8 out, on whatever device runs the test."""
    x = _special(shape, np.float16)
    axis, group_size = (1 if scope == "channel" else None), (8 if scope == "group" else None)
    q_min, q_max = bn.plans.dynamic.default_dynamic_q_range(bn.plans.dynamic.DynamicRangeMode(mode), bn.ElementKind.S8)
    got_q, got_scale, got_zero_point = dynamic(tuning, x, mode, scope, axis, group_size)
    q, scale, zero_point = ref_dynamic.dynamic_range_quantize(x, mode, scope, q_min, q_max, np.int8, axis, group_size)
    assert_same(got_scale, scale)
    assert_same(got_q, q)
    if mode == "asymmetric":
        assert_same(got_zero_point, zero_point)


@pytest.mark.parametrize("forced", [None, True, False])
def test_segment_stores_stream_only_past_l2(forced):
    """The segment kernels store evict-first when ``x`` and ``q`` together exceed the device's L2 (the
    simulator reports 4 KiB; ``segment_streaming_stores`` None), else cached; forced either way by the
    tuning. Both kernels give the reference's bits."""
    from baracuda_numba.plans.base import l2_bytes

    tuning = with_dynamic(segment_streaming_stores=forced)
    for shape in ((4, 64), (40, 64)):  # 1280 and 12800 bytes of f32 x and int8 q
        x = _special(shape, np.float32)
        desc = bn.DynamicRangeQuantizeDescriptor(shape, bn.DynamicRangeMode.SYMMETRIC, bn.DynamicRangeScope.token(),
                                                 -127, 127, bn.ElementKind.F32, bn.ElementKind.S8)
        plan = bn.DynamicRangeQuantizePlan.select(desc, tuning=tuning)
        past_l2 = x.size * 5 > l2_bytes(0)
        assert plan._streaming is (past_l2 if forced is None else forced)
        # the kernel's tag names its streaming stores ("_cs"); a card's other values may follow it ("_pf0")
        assert all(("_cs_" in k.py_func.__name__ + "_") is plan._streaming for k in plan._segment_kernels)
        got_q, got_scale, _ = dynamic(tuning, x)
        q, scale, _ = ref_dynamic.dynamic_range_quantize(x, "symmetric", "token", -127, 127, np.dtype(np.int8))
        assert_same(got_scale, scale)
        assert_same(got_q, q)


@requires_gpu
def test_gpu_streaming_stores_and_next_row_prefetch_match_reference():
    """On the GPU, a token quantize past L2 ([8192, 4096] bf16: 96 MiB of x and q) runs the resident
    kernel with streaming stores and the next-row L2 prefetch on its grid of many blocks per SM; a
    decode-sized one ([16, 4096]) keeps cached stores. NaN / +-inf, an all-zero row and a tiny row,
    symmetric and asymmetric, against the float64 reference bit for bit."""
    torch = pytest.importorskip("torch")
    from baracuda_numba.plans.base import l2_bytes

    for shape, streaming in (((8192, 4096), True), ((16, 4096), False)):
        assert (shape[0] * shape[1] * 3 > l2_bytes(0)) is streaming
        x = torch.from_numpy(_special(shape, np.float32)).to("cuda").to(torch.bfloat16)
        x_ref = x.float().cpu().numpy().astype(bn.element_kind("bfloat16").numpy_dtype)
        for mode in ("symmetric", "asymmetric"):
            desc = bn.DynamicRangeQuantizeDescriptor(shape, bn.DynamicRangeMode(mode), bn.DynamicRangeScope.token(),
                                                     *bn.plans.dynamic.default_dynamic_q_range(
                                                         bn.DynamicRangeMode(mode), bn.ElementKind.S8),
                                                     bn.ElementKind.BF16, bn.ElementKind.S8)
            assert bn.DynamicRangeQuantizePlan.select(desc)._streaming is streaming
            r = bn.dynamic_range_quantize(x, mode=mode)
            q_min, q_max = desc.q_min, desc.q_max
            q, scale, zero_point = ref_dynamic.dynamic_range_quantize(x_ref, mode, "token", q_min, q_max,
                                                                      np.dtype(np.int8))
            assert_same(r.scale.cpu().numpy(), scale)
            assert_same(r.q.cpu().numpy(), q)
            if mode == "asymmetric":
                assert_same(r.zero_point.cpu().numpy(), zero_point)


def test_few_segments_launch_as_programmatic_dependents():
    """Up to the tuning's ``dependent_segments_max`` segments (the decode quantizer's rows) the segment kernels
    launch as programmatic dependents of the kernel before them; more, or with the knob at 0, plainly. The
    results are the reference's either way."""
    limit = current_tuning().dynamic.dependent_segments_max
    assert limit >= 1
    for rows, knob, dependent in ((1, limit, True), (limit, limit, True), (limit + 1, limit, False), (1, 0, False)):
        tuning = with_dynamic(dependent_segments_max=knob)
        plan = bn.DynamicRangeQuantizePlan.select(bn.DynamicRangeQuantizeDescriptor(
            (rows, 96), bn.plans.dynamic.DynamicRangeMode.SYMMETRIC, bn.plans.dynamic.DynamicRangeScope.token(),
            -127, 127, "f32", "s8"), tuning=tuning)
        assert plan._launchers["segment"].dependent is dependent, rows
        assert plan._launchers["unaligned"].dependent is dependent, rows
        x = _special((rows, 96), np.float32)
        got_q, got_scale, _ = dynamic(tuning, x)
        q, scale, _ = ref_dynamic.dynamic_range_quantize(x, "symmetric", "token", -127, 127, np.dtype(np.int8))
        assert_same(got_scale, scale)
        assert_same(got_q, q)


# (threads, keep, split asked, shape, scope kwargs, offset, dtype, (kernel, split) expected): few aligned
# segments of exactly keep * threads chunks take the fixed resident kernel, one segment per block or per
# `split` blocks (each reducing all of it, quantizing its share); a misaligned operand its one-block element
# path; other lengths, more segments than SMs (64 here), or lanes shared by segments the general kernel.
FIXED_CASES = [
    (32, 4, 1, (3, 512), {}, 0, np.float32, ("fixed", 1)),
    (32, 4, 4, (3, 512), {}, 0, np.float32, ("fixed", 4)),
    (32, 4, 2, (5, 512), dict(mode="asymmetric"), 0, np.float32, ("fixed", 2)),
    (64, 2, 4, (2, 512), dict(mode="asymmetric"), 0, np.float32, ("fixed", 2)),
    (32, 2, 2, (2, 512), dict(scope="group", group_size=256), 0, np.float32, ("fixed", 2)),
    (32, 4, 4, (17, 512), {}, 0, np.float32, ("fixed", 2)),
    (32, 4, 4, (2, 512), {}, 1, np.float32, ("fixed", 4)),
    (32, 4, 1, (3, 1024), {}, 0, np.float16, ("fixed", 1)),
    (32, 4, 4, (2, 1024), dict(mode="asymmetric"), 0, np.float16, ("fixed", 4)),
    (32, 4, 4, (3, 500), {}, 0, np.float32, ("resident", 1)),
    # fixed_keep: the fixed kernel's own shape (f32 512: 128 chunks over 64 lanes of 2, 128 of 1)
    (32, 4, 1, (3, 512), dict(fixed_keep=2), 0, np.float32, ("fixed", 1)),
    (32, 4, 1, (2, 512), dict(fixed_keep=1, mode="asymmetric"), 0, np.float32, ("fixed", 1)),
    (32, 4, 2, (2, 512), dict(fixed_keep=2), 0, np.float32, ("fixed", 2)),
    (32, 4, 1, (2, 500), dict(fixed_keep=1), 0, np.float32, ("resident", 1)),
    (32, 4, 4, (65, 512), {}, 0, np.float32, ("resident", 1)),
    (32, 4, 4, (3, 200), {}, 0, np.float32, ("resident", 1)),
]


@pytest.mark.parametrize(("threads", "keep", "most", "shape", "kwargs", "offset", "dtype", "expected"), FIXED_CASES)
def test_few_segments_of_one_block_take_the_fixed_kernel(monkeypatch, threads, keep, most, shape, kwargs, offset,
                                                         dtype, expected):
    """The fixed resident kernel (``DynamicTuning.fixed_segments``) and its split across blocks
    (``segment_split`` the most; ``nseg * split`` blocks within the SMs): the reference's bits, scales and
    zero points; the grid ``nseg * split``. Misaligned operands take the one-block element path and its
    grid."""
    from baracuda_numba.plans import dynamic as plans_dynamic

    monkeypatch.setattr(plans_dynamic, "sm_count", lambda device=0: 64)
    tuning = with_dynamic(resident_threads=threads, resident_keep=keep, segment_split=most,
                          fixed_keep=kwargs.get("fixed_keep", 0))
    mode = plans_dynamic.DynamicRangeMode(kwargs.get("mode", "symmetric"))
    scope, group = kwargs.get("scope", "token"), kwargs.get("group_size")
    q_min, q_max = plans_dynamic.default_dynamic_q_range(mode, bn.ElementKind.S8)
    plan = bn.DynamicRangeQuantizePlan.select(bn.DynamicRangeQuantizeDescriptor(
        shape, mode, plans_dynamic.DynamicRangeScope.group(group) if group else plans_dynamic.DynamicRangeScope.token(),
        q_min, q_max, "f32" if dtype == np.float32 else "f16", "s8"), tuning=tuning)
    kind, split = expected
    name = plan._segment_kernels[0].py_func.__name__
    assert name.startswith(f"dynamic_{kind}{split if split > 1 else ''}_"), name
    if kind == "fixed":
        lanes = (group or shape[1]) // (16 // np.dtype(dtype).itemsize) // (kwargs.get("fixed_keep") or keep)
        assert plan._segment_threads == lanes and f"_t{lanes}" in name, name
    segments = shape[0] * shape[1] // (group or shape[1])
    assert plan._segment_blocks == (segments * split if kind == "fixed" else plan._unaligned_blocks)
    x = _special(shape, dtype, offset=offset)
    got_q, got_scale, got_zero_point = dynamic(tuning, x, mode.value, scope, group_size=group)
    q, scale, zero_point = ref_dynamic.dynamic_range_quantize(x, mode.value, scope, q_min, q_max, np.int8, None, group)
    assert_same(got_scale, scale)
    assert_same(got_q, q)
    if mode is plans_dynamic.DynamicRangeMode.ASYMMETRIC:
        assert_same(got_zero_point, zero_point)


@requires_gpu
@pytest.mark.parametrize(("shape", "dtype", "mode"), [((1, 4096), np.float16, "symmetric"),
                                                      ((16, 4096), np.float16, "symmetric"),
                                                      ((16, 2048), np.float32, "asymmetric"),
                                                      ((7, 8192), np.float16, "symmetric"),
                                                      ((5, 8192), np.float16, "asymmetric")])
def test_gpu_decode_rows_take_the_fixed_kernel(shape, dtype, mode):
    """The W8A8 decode's rows (K = 4096 / 8192 16-bit, 2048 f32; at most one per SM) in the shipped tuning:
    the fixed resident kernel, one block per row, with the reference's bits, scales and zero points."""
    bn.clear_plan_cache()
    q_min, q_max = bn.plans.dynamic.default_dynamic_q_range(bn.plans.dynamic.DynamicRangeMode(mode), bn.ElementKind.S8)
    plan = bn.DynamicRangeQuantizePlan.select(bn.DynamicRangeQuantizeDescriptor(
        shape, bn.plans.dynamic.DynamicRangeMode(mode), bn.plans.dynamic.DynamicRangeScope.token(), q_min, q_max,
        "f32" if dtype == np.float32 else "f16", "s8"))
    assert plan._segment_kernels[0].py_func.__name__.startswith("dynamic_fixed_"), plan._segment_kernels[0]
    assert plan._segment_blocks == shape[0] * current_tuning().dynamic.segment_split
    x = _special(shape, dtype)
    r = bn.dynamic_range_quantize(x, mode=mode)
    q, scale, zero_point = ref_dynamic.dynamic_range_quantize(x, mode, "token", q_min, q_max, np.int8)
    assert_same(r.scale, scale)
    assert_same(r.q, q)
    if mode == "asymmetric":
        assert_same(r.zero_point, zero_point)


@pytest.mark.parametrize("wide_keep", [2, 8])
def test_few_long_segments_take_one_wide_resident_block_each(wide_keep):
    """Segments longer than the resident block holds, no more of them than SMs: one block per segment,
    every chunk in registers, its threads doubled up to ``wide_segment_base_threads``, then its chunks
    per thread up to ``wide_segment_keep``, then its threads up to ``wide_segment_threads``; past all
    three (or with more segments than SMs) the streaming kernel."""
    from baracuda_numba.plans.base import sm_count

    tuning = with_dynamic(resident_threads=32, resident_keep=2, wide_segment_threads=128,
                          wide_segment_base_threads=64, wide_segment_keep=wide_keep)
    tpb = tuning.dynamic.threads
    sms = sm_count(0)
    # (shape, threads, chunks per thread or None for the streaming kernel); f32: 4 elements per chunk.
    # The streaming kernel runs blocks of the tuning's `threads` (its segments one warp each at most).
    wide = wide_keep == 8
    cases = [((sms, 1000), 64 if wide else 128, 4 if wide else 2), ((sms + 1, 1000), tpb, None),
             ((sms, 2200), 128 if wide else tpb, 8 if wide else None), ((sms, 5000), tpb, None),
             ((sms, 400), 64, 2), ((sms, 200), 32, 2)]
    for shape, threads, keep in cases:
        plan = bn.DynamicRangeQuantizePlan.select(bn.DynamicRangeQuantizeDescriptor(
            shape, bn.plans.dynamic.DynamicRangeMode.SYMMETRIC, bn.plans.dynamic.DynamicRangeScope.token(), -127, 127,
            "f32", "s8"), tuning=tuning)
        assert plan._threads == threads, shape
        name = plan._segment_kernels[0].py_func.__name__
        assert name.startswith("dynamic_segment_" if keep is None else "dynamic_resident_"), shape
        if keep is not None:
            assert f"_k{keep}_t{threads}" in name, (shape, name)
        x = _special(shape, np.float32)
        got_q, got_scale, _ = dynamic(tuning, x)
        q, scale, _ = ref_dynamic.dynamic_range_quantize(x, "symmetric", "token", -127, 127, np.dtype(np.int8))
        assert_same(got_scale, scale)
        assert_same(got_q, q)


def test_all_zero_and_nonfinite_segments():
    tuning = with_dynamic(resident_threads=64, resident_keep=2, column_threads_per_sm=64)
    x = np.zeros((4, 64), np.float32)
    x[1, 3], x[2, :] = np.nan, np.inf
    x[3, 0] = -np.inf
    for mode, q_min in (("symmetric", -127), ("asymmetric", -128)):
        for scope, axis in (("token", None), ("tensor", None), ("channel", 1)):
            got_q, got_scale, _ = dynamic(tuning, x, mode, scope, axis=axis)
            assert np.all(got_scale == 1.0)  # no finite nonzero element anywhere: scale 1
            zp = 0 if mode == "symmetric" else q_min  # q_min - rint(0 / 1)
            expected = np.where(np.isposinf(x), 127, np.where(np.isneginf(x), q_min, zp))
            assert_same(got_q, expected.astype(np.int8))


@settings(max_examples=20 if SIMULATOR else 40)
@given(threads=st.sampled_from([32, 64]), keep=st.sampled_from([1, 2, 4]), staged=st.booleans(),
       min_blocks=st.sampled_from([0, 2]),
       blocks_per_sm=st.sampled_from([1, 2, 32]), rows=st.integers(1, 7), chunks=st.integers(1, 40),
       groups=st.sampled_from([None, 2, 4]), mode=st.sampled_from(MODES), seed=st.integers(0, 2**32 - 1))
def test_segment_launch_shapes_match_reference(threads, keep, staged, min_blocks, blocks_per_sm, rows, chunks,
                                               groups, mode, seed):
    """Any launch shape of the segment kernels (resident, staged, streaming when the row is longer than
    keep * threads chunks; a launch bound, which only the GPU compiler sees) gives the reference's bits:
    tokens or groups of f32 rows of ``4 * chunks``."""
    tuning = with_dynamic(resident_threads=threads, resident_keep=keep, resident_staged=staged,
                          resident_blocks_per_sm=blocks_per_sm, resident_min_blocks=min_blocks)
    cols = 4 * chunks * (groups or 1)
    x = _special((rows, cols), np.float32, seed=seed % 1000)
    scope, group_size = ("group", cols // groups) if groups else ("token", None)
    q_min, q_max = bn.plans.dynamic.default_dynamic_q_range(bn.plans.dynamic.DynamicRangeMode(mode),
                                                            bn.ElementKind.S8)
    got_q, got_scale, got_zero_point = dynamic(tuning, x, mode, scope, group_size=group_size)
    q, scale, zero_point = ref_dynamic.dynamic_range_quantize(x, mode, scope, q_min, q_max, np.int8, None,
                                                              group_size)
    assert_same(got_scale, scale)
    assert_same(got_q, q)
    if mode == "asymmetric":
        assert_same(got_zero_point, zero_point)


@requires_gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float64"])
@pytest.mark.parametrize(("kwargs", "shape"), [
    ({}, (16, 4096)),
    ({"mode": "asymmetric"}, (7, 264)),
    ({"scope": "group", "group_size": 128}, (3, 1024)),
    ({"scope": "group", "group_size": 32, "mode": "asymmetric", "dtype": "uint8"}, (5, 96)),
    ({"dtype": "uint8"}, (4, 64)),
    ({"dtype": "float8_e4m3fn"}, (9, 512)),
    ({"scope": "channel", "axis": 0}, (6, 40)),
    ({"scope": "tensor"}, (8, 64)),
    ({}, (0, 64)),
])
def test_gpu_repeat_calls_take_the_remembered_launch(kwargs, shape, dtype):
    """A repeat call on a CUDA torch tensor (the remembered plan's pre-packed launch) gives the bits of
    the first, full-path call (itself held to torch and the reference by the tests above); a
    misaligned view and a given stream go the full way and agree too."""
    torch = pytest.importorskip("torch")
    from baracuda_numba.ops.common import clear_plan_cache

    if dtype == "float64" and kwargs.get("dtype") == "float8_e4m3fn":
        pytest.skip("FP8 dynamic quantize takes f32 / f16 / bf16")
    clear_plan_cache()
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    x = (torch.randn(shape, device="cuda", generator=g) * 3).to(getattr(torch, dtype))
    if x.numel():
        x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -2.0])
    calls = [bn.dynamic_range_quantize(x, **kwargs) for _ in range(3)]
    padded = torch.empty(x.numel() + 1, device="cuda", dtype=x.dtype)
    shifted = padded[1:].view(shape)
    shifted.copy_(x)
    calls.append(bn.dynamic_range_quantize(shifted, **kwargs))
    calls.append(bn.dynamic_range_quantize(x, stream=torch.cuda.current_stream(), **kwargs))
    first = calls[0]
    for other in calls[1:]:
        assert torch.equal(other.q.view(torch.uint8), first.q.view(torch.uint8))
        assert torch.equal(other.scale, first.scale)
        assert (other.zero_point is None) == (first.zero_point is None)
        if isinstance(first.zero_point, torch.Tensor):
            assert torch.equal(other.zero_point, first.zero_point)
        else:
            assert other.zero_point == first.zero_point
    clear_plan_cache()


@pytest.mark.parametrize(("mode", "scope", "shape", "element"), [
    ("asymmetric", bn.DynamicRangeScope.token(), (16, 4096), "bf16"),
    ("asymmetric", bn.DynamicRangeScope.group(32), (6, 96), "f32"),
    ("symmetric", bn.DynamicRangeScope.token(), (3, 64), "f64"),
])
def test_remembered_launch_hands_the_driver_what_the_checked_path_does(mode, scope, shape, element):
    """The op's repeat-call launch (pre-packed parameters, six pointers patched) gives the driver the
    bytes and grid of ``plan.run`` on the same operands; checked on the simulator with a recording
    libcuda stand-in, as the W8A8 fast path is in test_linear."""
    from recording_driver import recording_driver
    from test_linear_fast import _torch_operand

    from baracuda_numba import arrays, launch
    from baracuda_numba.plans import base
    from baracuda_numba.plans import dynamic as dynamic_plans

    E = bn.ElementKind
    x_element = E(element) if not isinstance(element, E) else element
    symmetric = mode == "symmetric"
    desc = bn.DynamicRangeQuantizeDescriptor(shape, bn.DynamicRangeMode(mode), scope, -127 if symmetric else -128,
                                             127, x_element, E.S8)
    plan = bn.DynamicRangeQuantizePlan.select(desc)
    count = plan.scale_count()
    scale_element = E.F64 if x_element is E.F64 else E.F32
    with pytest.MonkeyPatch.context() as monkeypatch:
        for module in (arrays, launch, base, dynamic_plans):
            monkeypatch.setattr(module, "SIMULATOR", False)
        for name in ("segment", "segment_dependent"):  # the plain / always-dependent launches of one kernel
            old = plan._launchers[name]
            gpu = launch.KernelLauncher(old._compile, old._n_arrays, old._scalar_types, old._shared_bytes)
            gpu._functions[0] = 0xD00
            plan._launchers[name] = gpu
        plan._install_segment_template()
        assert plan.fast_alignment() == 16
        driver = recording_driver()
        monkeypatch.setattr(launch, "_driver", lambda: driver)
        pointers = (0x100000, 0x500000, 0x900000, 0xA00000)
        ops = bn.DynamicRangeQuantizeArgs(_torch_operand(x_element, shape, pointers[0]),
                                          _torch_operand(E.S8, shape, pointers[1]),
                                          _torch_operand(scale_element, (count,), pointers[2]),
                                          _torch_operand(E.I32, (count,), pointers[3]))
        plan.launch_segments_fast(*pointers, 0x77, 0)
        plan.run(ops, workspace=_torch_operand(E.U8, (plan.workspace_size(),), 0xB00000), stream=0x77)
        plan.launch_segments_fast(pointers[0] + 0x1000, *pointers[1:], 0x77, 0)
    fast, checked, moved = driver.calls
    assert fast == checked and moved[0] == fast[0] and moved[1] != fast[1]
