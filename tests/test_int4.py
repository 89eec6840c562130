"""Packed int4 / uint4 per group: the layout (low nibble first), every op against the NumPy reference
(hypothesis over shapes, group sizes, dtypes, scales, zero points), dynamic range, and every bad input."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from conftest import FLOAT_DTYPES, requires_gpu
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda
from tuned import CARDS, packed_dequantize, packed_dynamic, packed_quantize

import baracuda_numba as bn
from baracuda_numba import registry
from baracuda_numba.errors import InvalidProblem, Unsupported
from baracuda_numba.platform import SIMULATOR
from baracuda_numba.reference import dynamic as ref_dynamic
from baracuda_numba.reference import elementwise as ref
from baracuda_numba.reference.packed import pack_nibbles, unpack_nibbles
from baracuda_numba.vocabulary import ElementKind as E
from baracuda_numba.vocabulary import QuantizeKind as K

PACKED = {"int4": E.S4, "uint4": E.U4}


def assert_same(got, expected) -> None:
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, expected.dtype, got.shape)
    np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64))


def test_layout_low_nibble_first_and_gptq_word_order():
    x = np.array([[1, -2, 7, -8, 0, 3, -1, 5]], np.float32)
    q = bn.quantize_per_group_packed(x, np.ones((1, 1), np.float32), None, 8)
    np.testing.assert_array_equal(q, [[0xE1, 0x87, 0x30, 0x5F]])
    # Read as one little-endian int32 word, value i sits in bits 4i .. 4i + 3 (GPTQ's sequential order).
    word = int(np.frombuffer(q.tobytes(), "<u4")[0])
    assert [((word >> (4 * i)) & 0xF) for i in range(8)] == [v & 0xF for v in (1, -2, 7, -8, 0, 3, -1, 5)]
    # ml_dtypes agrees on the values of the nibbles.
    values = unpack_nibbles(q, signed=True)
    np.testing.assert_array_equal(values.astype(ml_dtypes.int4).astype(np.int8), x.astype(np.int8))


@st.composite
def problems(draw):
    rank = draw(st.integers(1, 3))
    group_size = draw(st.sampled_from([2, 4, 8, 16, 32, 128]))
    lead = draw(st.lists(st.integers(0, 4), min_size=rank - 1, max_size=rank - 1))
    groups = draw(st.integers(0, 3))
    return dict(shape=(*lead, group_size * groups), group_size=group_size, seed=draw(st.integers(0, 2**32 - 1)),
                zero_scale=draw(st.booleans()))


@pytest.mark.parametrize("name", ["int4", "uint4"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "f64"])
def test_every_op_matches_reference(dtype, name):
    element = PACKED[name]
    f = FLOAT_DTYPES[dtype]
    math_t = np.float64 if dtype == "f64" else np.float32
    low, high = element.int_range

    @settings(max_examples=12)
    @given(problems())
    def check(p):
        rng = np.random.default_rng(p["seed"])
        shape, g = p["shape"], p["group_size"]
        gshape = (*shape[:-1], shape[-1] // g)
        count = math.prod(gshape)
        scales = rng.choice([0.5, 0.013, 0.1, 2.0**-5, 1.7], count).astype(math_t).reshape(gshape)
        if p["zero_scale"] and count:
            scales.reshape(-1)[rng.integers(0, count)] = 0
        zps = rng.integers(low, high + 1, gshape).astype(np.int32) if element is E.U4 else None
        zp_full = ref.expand_groups(zps if zps is not None else np.zeros(gshape, np.int32), shape, g)
        s_full = ref.expand_groups(scales, shape, g)
        x = (rng.standard_normal(shape) * rng.choice([0.05, 0.5, 3.0], shape)).astype(np.float32)
        specials = rng.random(shape) < 0.05
        x[specials] = rng.choice([np.nan, np.inf, -np.inf, 0.0], int(specials.sum()))
        x = x.astype(f)
        dy = (rng.standard_normal(shape) * 4).astype(np.float32).astype(f)

        q = bn.quantize_per_group_packed(x, scales, zps, g, dtype=name)
        want_values = ref.quantize(x, s_full, zp_full, low, high, np.int8)
        assert_same(q, pack_nibbles(want_values))
        np.testing.assert_array_equal(unpack_nibbles(q, element is E.S4), want_values)
        assert_same(bn.dequantize_per_group_packed(q, scales, zps, g, q_dtype=name, dtype=f),
                    ref.dequantize(want_values, s_full, zp_full, f))
        assert_same(bn.fake_quantize_per_group(x, scales, zps, g, dtype=name),
                    ref.fake_quantize(x, s_full, zp_full, low, high))
        assert_same(bn.fake_quantize_per_group_backward(dy, x, scales, zps, g, dtype=name),
                    ref.fake_quantize_backward(dy, x, s_full, zp_full, low, high))
        zp_arg = zps if zps is not None else np.zeros(gshape, np.int32)
        assert_same(bn.quantize_per_group_backward(dy, x, scales, zp_arg, g, dtype=name),
                    ref.quantize_backward(dy, x, s_full, zp_full, low, high))
        assert_same(bn.dequantize_per_group_backward(dy, scales, g, dtype=name), ref.dequantize_backward(dy, s_full))

    check()


def test_quantize_per_group_with_int4_dtype_returns_packed_bytes():
    x = np.linspace(-1, 1, 32).astype(np.float32).reshape(2, 16)
    scales = np.full((2, 2), 0.125, np.float32)
    q = bn.quantize_per_group(x, scales, None, 8, dtype="int4")
    assert q.dtype == np.uint8 and q.shape == (2, 8)
    assert_same(q, bn.quantize_per_group_packed(x, scales, None, 8))


@pytest.mark.parametrize("name", ["int4", "uint4"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_dynamic_range_per_group_matches_reference(dtype, name):
    element = PACKED[name]
    f = FLOAT_DTYPES[dtype]
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((5, 64)) * rng.choice([1e-3, 1.0, 40.0], (5, 1))).astype(np.float32)
    x[1, :16] = 0
    x[2, 3], x[3, 4] = np.nan, np.inf
    x = x.astype(f)
    r = bn.dynamic_range_quantize_packed(x, group_size=16, dtype=name)
    mode = "symmetric" if element is E.S4 else "asymmetric"
    low, high = element.int_range
    if mode == "symmetric":
        low = -high
    q, scale, zp = ref_dynamic.dynamic_range_quantize(x, mode, "group", low, high, np.int8, group_size=16)
    assert_same(r.q, pack_nibbles(q))
    np.testing.assert_array_equal(r.scale, scale)
    if element is E.U4:
        np.testing.assert_array_equal(r.zero_point, zp)
    else:
        assert r.zero_point is None


def test_registry_holds_every_packed_key():
    keys = {e.key: e for e in registry.entries()}
    for f in registry.FLOAT_ELEMENTS:
        for p in (E.S4, E.U4):
            for kind in (K.PER_GROUP, K.DEQUANTIZE_PER_GROUP, K.DYNAMIC_RANGE):
                assert isinstance(keys[(kind, f, p)], registry.PackedEntry)
            for kind in (K.PER_GROUP_BACKWARD, K.DEQUANTIZE_PER_GROUP_BACKWARD, K.FAKE_QUANTIZE,
                         K.FAKE_QUANTIZE_BACKWARD):
                assert isinstance(keys[(kind, f, p)], registry.RegistryEntry)


def test_dtype_names():
    assert bn.element_kind("int4") is E.S4 and bn.element_kind("uint4") is E.U4
    assert bn.element_kind(ml_dtypes.int4) is E.S4 and bn.element_kind(ml_dtypes.uint4) is E.U4


@pytest.mark.parametrize(("call", "argument"), [
    (lambda x: bn.quantize_per_group_packed(x[:, :15], np.ones((2, 1), np.float32), None, 15), "x"),
    (lambda x: bn.quantize_per_group_packed(x, np.ones((2, 4), np.float32), None, 3), "group_size"),
    (lambda x: bn.quantize_per_group_packed(x, np.ones((2, 2), np.float32), None, 5), "group_size"),
    (lambda x: bn.quantize_per_group_packed(x, np.ones((2, 2), np.float32), np.zeros((2, 2), np.int32), 8),
     "zero_point"),
    (lambda x: bn.quantize_per_group_packed(x, np.ones((2, 2), np.float32), None, 8, dtype="int8"), "dtype"),
    (lambda x: bn.quantize_per_group_packed(x, np.ones((2, 2), np.float32), None, 8, q_max=9), "(q_min, q_max)"),
    (lambda x: bn.dequantize_per_group_packed(x, np.ones((2, 2), np.float32), None, 8), "q"),
    (lambda x: bn.dequantize_per_group_packed(np.zeros((2, 8), np.uint8), np.ones((2, 2), np.float32), None, 8,
                                              q_dtype="int8"), "q_dtype"),
    (lambda x: bn.dynamic_range_quantize_packed(x[:, :15], group_size=5), "x"),
    (lambda x: bn.dynamic_range_quantize_packed(x, group_size=8, mode="asymmetric"), "mode"),
    (lambda x: bn.fake_quantize_per_group(x, np.ones((2, 2), np.float32), np.zeros((2, 2), np.int32), 8),
     "zero_points"),
], ids=["odd-last-dim", "odd-group", "group-not-divisor", "s4-zero-point", "not-4-bit", "range", "q-not-bytes",
        "q-dtype", "dynamic-odd", "s4-asymmetric", "fake-s4-zero-points"])
def test_bad_inputs_are_typed_and_name_the_argument(call, argument):
    x = np.linspace(-1, 1, 32).astype(np.float32).reshape(2, 16)
    with pytest.raises(InvalidProblem) as info:
        call(x)
    assert f": {argument} expected" in str(info.value)


def test_unpacked_plans_refuse_packed_entries():
    desc = bn.QuantizePerGroupDescriptor(2, 16, 8, -8, 7, "f32", "int4")
    with pytest.raises(Unsupported, match="output_element"):
        bn.QuantizePerGroupPlan.select(desc)


def test_torch_tensors_round_trip():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    r = bn.dynamic_range_quantize_packed(x, group_size=128)
    assert isinstance(r.q, torch.Tensor) and r.q.dtype == torch.uint8 and r.q.shape == (4, 128)
    back = bn.dequantize_per_group_packed(r.q, r.scale, None, 128, dtype=torch.bfloat16)
    assert back.shape == x.shape and back.dtype == torch.bfloat16
    assert float((back.float() - x.float()).abs().max()) <= float(r.scale.max()) / 2 + 1e-2


@requires_gpu
@pytest.mark.parametrize("name", ["int4", "uint4"])
def test_gpu_packed_ops_match_reference(name):
    torch = pytest.importorskip("torch")
    element = PACKED[name]
    low, high = element.int_range
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(256, 4096, device="cuda", generator=gen, dtype=torch.float32).to(torch.bfloat16)
    scales = torch.rand(256, 32, device="cuda", generator=gen) * 0.1 + 0.01
    zps = torch.randint(low, high + 1, (256, 32), device="cuda", generator=gen, dtype=torch.int32) \
        if element is E.U4 else None
    q = bn.quantize_per_group_packed(x, scales, zps, 128, dtype=name)
    xs = x.float().cpu().numpy().astype(ml_dtypes.bfloat16)
    s_full = ref.expand_groups(scales.cpu().numpy(), xs.shape, 128)
    z_full = ref.expand_groups(zps.cpu().numpy() if zps is not None else np.zeros((256, 32), np.int32), xs.shape,
                               128)
    values = ref.quantize(xs, s_full, z_full, low, high, np.int8)
    np.testing.assert_array_equal(q.cpu().numpy(), pack_nibbles(values))
    d = bn.dequantize_per_group_packed(q, scales, zps, 128, q_dtype=name, dtype=torch.bfloat16)
    np.testing.assert_array_equal(d.float().cpu().numpy(),
                                  ref.dequantize(values, s_full, z_full, ml_dtypes.bfloat16).astype(np.float32))
    r = bn.dynamic_range_quantize_packed(x, group_size=128, dtype=name)
    mode = "symmetric" if element is E.S4 else "asymmetric"
    qv, scale, zp = ref_dynamic.dynamic_range_quantize(xs, mode, "group", -high if mode == "symmetric" else low,
                                                       high, np.int8, group_size=128)
    np.testing.assert_array_equal(r.q.cpu().numpy(), pack_nibbles(qv))
    np.testing.assert_array_equal(r.scale.cpu().numpy(), scale)
    if element is E.U4:
        np.testing.assert_array_equal(r.zero_point.cpu().numpy(), zp)


def test_per_tensor_fake_quantize_simulates_int4_range():
    x = np.linspace(-3, 3, 25).astype(np.float32)
    assert_same(bn.fake_quantize(x, 0.25, dtype="int4"), ref.fake_quantize(x, 0.25, 0, -8, 7))
    assert_same(bn.fake_quantize_backward(np.ones_like(x), x, 0.25, 8, dtype="uint4"),
                ref.fake_quantize_backward(np.ones_like(x), x, 0.25, 8, 0, 15))
    with pytest.raises(Unsupported, match="grid_element"):
        bn.FakeQuantizePlan.select(bn.FakeQuantizeDescriptor(4, -8, 7, "f32", "int4"))
    with pytest.raises(InvalidProblem, match="dtype expected"):
        bn.fake_quantize(x, 0.25, dtype="float32")


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
@pytest.mark.parametrize("offset", [0, 1])
def test_chunked_and_byte_paths_agree(dtype, offset):
    """16-byte chunks (aligned, group_size a multiple of the chunk) and the byte path (misaligned) give
    the same bytes, and the same floats back."""
    f = FLOAT_DTYPES[dtype]
    rng = np.random.default_rng(offset)
    buffer = (rng.standard_normal(4 * 64 + offset) * 2).astype(np.float32).astype(f)
    x = buffer[offset:].reshape(4, 64)
    math_t = np.float64 if dtype == "f64" else np.float32
    scales = (rng.random((4, 2)) * 0.5 + 0.05).astype(math_t)
    zps = rng.integers(0, 16, (4, 2)).astype(np.int32)
    q = bn.quantize_per_group_packed(x, scales, zps, 32, dtype="uint4")
    s_full, z_full = ref.expand_groups(scales, x.shape, 32), ref.expand_groups(zps, x.shape, 32)
    values = ref.quantize(x, s_full, z_full, 0, 15, np.int8)
    assert_same(q, pack_nibbles(values))
    out = np.empty(4 * 64 + offset, f)[offset:].reshape(4, 64)
    bn.dequantize_per_group_packed(q, scales, zps, 32, q_dtype="uint4", dtype=f, out=out)
    assert_same(out, ref.dequantize(values, s_full, z_full, f))


# -- the bandwidth paths: several chunks in flight per thread, and the one-pass dynamic kernel ---------


def test_dynamic_layout_lanes_and_chunks_per_lane():
    from baracuda_numba.kernels.packed import dynamic_layout, group_shift

    # lanes: the largest power of two <= 4 (max_lanes) dividing the chunks per group, more (a power of two
    # <= 32 dividing it) while a lane would hold more than 8 (max_per_lane); other limits the same way
    assert [dynamic_layout(c, 4, 8) for c in (1, 2, 3, 12, 16, 32, 64, 96, 256)] == [
        (1, 1), (2, 1), (1, 3), (4, 3), (4, 4), (4, 8), (8, 8), (16, 6), (32, 8)]
    assert dynamic_layout(32 * 9, 4, 8) is None and dynamic_layout(0, 4, 8) is None
    assert [dynamic_layout(c, 8, 4) for c in (1, 16, 64, 96)] == [(1, 1), (8, 2), (16, 4), (32, 3)]
    assert dynamic_layout(32 * 5, 8, 4) is None
    assert [group_shift(c) for c in (1, 2, 16, 3, 12)] == [0, 1, 4, -1, -1]


def _dynamic_input(rng, shape, group_size, f):
    """Normal values at per-row magnitudes, with the groups that decide the scale rule: all zero, all
    negative, one huge value, subnormal-only (the scale clamps to the smallest normal), and NaN / +-inf
    (left out of the range)."""
    x = rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 40.0], (shape[0], 1))
    flat = x.reshape(-1, group_size)
    groups = flat.shape[0]
    flat[0] = 0
    flat[1 % groups] = -np.abs(flat[1 % groups]) - 0.5
    flat[2 % groups, 1] = 3e4
    flat[3 % groups] = 1e-41 if f is np.float32 else 0.0
    flat[4 % groups, :3] = [np.nan, np.inf, -np.inf]
    return x.astype(f)


@pytest.mark.parametrize("tuning", CARDS)
@pytest.mark.parametrize("name", ["int4", "uint4"])
@pytest.mark.parametrize(("dtype", "group_size"), [
    ("f32", 4), ("f32", 8), ("f32", 12), ("f32", 24), ("f32", 128), ("f32", 256), ("f32", 1024),
    ("bf16", 40), ("bf16", 128), ("f16", 16), ("f64", 6), ("f64", 64),
    ("f32", 2048),  # 16 chunks per lane: the two-pass path
    ("f32", 6),  # not a whole number of chunks: the two-pass path
])
def test_dynamic_one_pass_matches_reference(dtype, group_size, name, tuning):
    """Every lane layout of the one-pass kernel (one lane per group, several groups per pass, whole
    warps per group, several chunks per lane) and the two-pass fallback give the reference's scales,
    zero points and nibbles, under each card's tuning value (tests/tuned.py)."""
    element = PACKED[name]
    f = FLOAT_DTYPES[dtype]
    cols = max(group_size, 1024 if group_size <= 256 else group_size)
    cols -= cols % group_size
    x = _dynamic_input(np.random.default_rng(group_size), (3, cols), group_size, f)
    mode = "symmetric" if element is E.S4 else "asymmetric"
    low, high = element.int_range
    q_range = (-high if element is E.S4 else low, high)
    packed, got_scale, got_zero_point = packed_dynamic(tuning, x, group_size, element, mode, q_range)
    q, scale, zp = ref_dynamic.dynamic_range_quantize(x, mode, "group", *q_range, np.int8, group_size=group_size)
    assert_same(packed, pack_nibbles(q))
    np.testing.assert_array_equal(got_scale, scale)
    if element is E.U4:
        np.testing.assert_array_equal(got_zero_point, zp)


@pytest.mark.parametrize("offset", [0, 1])
def test_dynamic_uint4_symmetric_and_misaligned(offset):
    """uint4 in symmetric mode (zero point 8, none written) and a misaligned input (the two-pass path)
    agree with the reference."""
    rng = np.random.default_rng(offset)
    buffer = rng.standard_normal(2 * 256 + offset).astype(np.float32)
    x = buffer[offset:].reshape(2, 256)
    r = bn.dynamic_range_quantize_packed(x, group_size=32, dtype="uint4", mode="symmetric")
    q, scale, _ = ref_dynamic.dynamic_range_quantize(x, "symmetric", "group", 0, 15, np.int8, group_size=32)
    assert_same(r.q, pack_nibbles(q))
    np.testing.assert_array_equal(r.scale, scale)
    assert r.zero_point == 8


@pytest.mark.parametrize("tuning", CARDS)
@pytest.mark.parametrize("name", ["int4", "uint4"])
@pytest.mark.parametrize(("dtype", "group_size"), [("f32", 8), ("f32", 24), ("bf16", 40), ("f64", 6), ("f32", 32),
                                                    ("bf16", 64), ("f64", 96)])
def test_many_chunks_per_thread_match_reference(dtype, group_size, name, tuning):
    """Enough chunks that every thread runs full unrolled steps and a remainder, with the group index
    by shift (chunks per group a power of two: 8, 32, 64 elements) and by division (24 / 40 / 6 / 96), under
    each card's tuning value."""
    element = PACKED[name]
    f = FLOAT_DTYPES[dtype]
    math_t = np.float64 if dtype == "f64" else np.float32
    low, high = element.int_range
    rng = np.random.default_rng(group_size)
    cols = group_size * (1200 // group_size)
    x = (rng.standard_normal((5, cols)) * 2).astype(np.float32)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    x = x.astype(f)
    gshape = (5, cols // group_size)
    scales = (rng.random(gshape) * 0.5 + 0.05).astype(math_t)
    scales[0, 1] = 0
    zps = rng.integers(low, high + 1, gshape).astype(np.int32) if element is E.U4 else None
    s_full = ref.expand_groups(scales, x.shape, group_size)
    z_full = ref.expand_groups(zps if zps is not None else np.zeros(gshape, np.int32), x.shape, group_size)
    values = ref.quantize(x, s_full, z_full, low, high, np.int8)
    q = packed_quantize(tuning, x, scales, zps, group_size, element)
    assert_same(q, pack_nibbles(values))
    assert_same(packed_dequantize(tuning, q, scales, zps, group_size, element, f),
                ref.dequantize(values, s_full, z_full, f))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
@pytest.mark.parametrize("name", ["int4", "uint4"])
def test_dequantize_packed_bytes_at_any_chunk_alignment(dtype, name):
    """The same packed bytes at a 16-byte aligned address and at one that is a multiple of 4 but not
    of 16 (every chunk of G / 2 bytes still aligned): both dequantize to the reference."""
    element, f = PACKED[name], FLOAT_DTYPES[dtype]
    math_t = np.float64 if dtype == "f64" else np.float32
    low, high = element.int_range
    rng = np.random.default_rng(7)
    shape, gshape = (6, 512), (6, 4)
    values = rng.integers(low, high + 1, shape).astype(np.int8)
    scales = (rng.random(gshape) * 0.5 + 0.05).astype(math_t)
    zps = rng.integers(low, high + 1, gshape).astype(np.int32) if element is E.U4 else None
    z_full = ref.expand_groups(zps if zps is not None else np.zeros(gshape, np.int32), shape, 128)
    want = ref.dequantize(values, ref.expand_groups(scales, shape, 128), z_full, f)
    packed = pack_nibbles(values)
    for offset in (0, 4):
        buffer = np.zeros(packed.size + 32, np.uint8)
        start = (-buffer.ctypes.data) % 16 + offset  # on the GPU the device copy starts 256-byte aligned
        if not SIMULATOR:
            start = offset
        buffer[start:start + packed.size] = packed.ravel()
        if not SIMULATOR:  # a device array, so that the offset reaches the kernel
            buffer = cuda.to_device(buffer)
        q = buffer[start:start + packed.size].reshape(packed.shape)
        got = bn.dequantize_per_group_packed(q, scales, zps, 128, q_dtype=name, dtype=f)
        assert_same(got if SIMULATOR else got.copy_to_host(), want)
