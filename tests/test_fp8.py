"""FP8 (E4M3fn, E5M2) outputs: the codec over every f16 / bf16 input and random f32 against PyTorch and
ml_dtypes, every op and granularity against PyTorch's ``(x * inv).clamp(-max, max).to(float8)`` and
the NumPy reference, the boundaries, dynamic range (vLLM's scale rule), and every bad input."""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np
import pytest
from conftest import FLOAT_DTYPES, SIMULATOR, requires_gpu
from hypothesis import given, settings
from hypothesis import strategies as st
from tuned import CARDS, dynamic, per_axis, planned

import baracuda_numba as bn
from baracuda_numba import registry
from baracuda_numba.errors import InvalidProblem, Unsupported
from baracuda_numba.kernels.codecs import fp8_bits_codec
from baracuda_numba.reference import elementwise as ref
from baracuda_numba.reference import fp8 as ref8
from baracuda_numba.vocabulary import ElementKind as E
from baracuda_numba.vocabulary import MathPrecision
from baracuda_numba.vocabulary import QuantizeKind as K

torch = pytest.importorskip("torch")

FP8 = (E.FP8_E4M3, E.FP8_E5M2)
TORCH_FP8 = {E.FP8_E4M3: torch.float8_e4m3fn, E.FP8_E5M2: torch.float8_e5m2}
FAMILIES = ("tensor", "channel", "token", "group")


def fp8_id(element) -> str:
    return element.short


def torch_fp8_bits(scaled: np.ndarray, element, q_min=None, q_max=None) -> np.ndarray:
    """PyTorch's ``scaled.clamp(q_min, q_max).to(float8)`` as bytes (``scaled`` float32 or float64)."""
    top = element.fp8_max
    low = -top if q_min is None else q_min
    high = top if q_max is None else q_max
    t = torch.from_numpy(np.ascontiguousarray(scaled)).clamp(low, high).to(TORCH_FP8[element])
    return t.view(torch.uint8).numpy()


def bits(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.contiguous().view(torch.uint8).numpy()
    return np.asarray(a).view(np.uint8)


def assert_fp8_same(got, reference) -> None:
    """Same bits as an ml_dtypes reference, except NaN: ml_dtypes writes E5M2 NaN as 0x7E, PyTorch and we
    0x7F (with the NaN's sign); there only the NaN class is compared."""
    got_bits, want_bits = bits(got), bits(reference)
    nan = np.isnan(np.asarray(reference).astype(np.float32))
    np.testing.assert_array_equal(got_bits[~nan], want_bits[~nan])
    np.testing.assert_array_equal(got_bits[nan] & 0x7F, 0x7F)


def finite_fp8_values(element) -> np.ndarray:
    """Every finite non-negative value of the format, ascending (float64)."""
    values = np.arange(256, dtype=np.uint8).view(element.numpy_dtype).astype(np.float64)
    return np.unique(values[np.isfinite(values) & (values >= 0)])


# -- the codec -------------------------------------------------------------------------------------


@functools.cache
def _codec_kernel(fn):
    from numba import cuda

    @cuda.jit
    def apply(words, out):
        i = cuda.grid(1)
        if i < words.size:
            out[i] = fn(words[i])

    return apply


def _apply_codec(fn, words) -> np.ndarray:
    """A codec device function over ``words`` (uint64): called directly on the simulator, where device
    functions are Python; on the GPU in a one-thread-per-word kernel."""
    words = np.ascontiguousarray(words, np.uint64)
    if SIMULATOR:
        return np.array([int(fn(np.uint64(w))) for w in words], np.uint64)
    from numba import cuda

    out = cuda.device_array(words.size, np.uint64)
    _codec_kernel(fn)[max(1, -(-words.size // 256)), 256](cuda.to_device(words), out)
    return out.copy_to_host()


def nan_class(fp8_bits, element) -> np.ndarray:
    """FP8 bytes with every NaN written as 0x7F: the sign of a NaN is whatever the arithmetic before the
    encoder left (the GPU's multiply returns the canonical, positive NaN; NumPy keeps the sign)."""
    b = np.asarray(fp8_bits, np.uint8)
    nan = (b & 0x7F) == 0x7F if element is E.FP8_E4M3 else (b & 0x7F) > 0x7C
    return np.where(nan, np.uint8(0x7F), b)


@pytest.mark.parametrize("element", FP8, ids=fp8_id)
def test_decode_is_exact_for_all_256_patterns(element):
    decode, _ = fp8_bits_codec(element)
    got = _apply_codec(decode, np.arange(256)).astype(np.uint32).view(np.float32)
    want = np.arange(256, dtype=np.uint8).view(element.numpy_dtype).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def _encode_all(element, f32: np.ndarray) -> np.ndarray:
    _, encode = fp8_bits_codec(element)
    return _apply_codec(encode, f32.view(np.uint32)).astype(np.uint8)


@pytest.mark.parametrize("source", ["f16", "bf16"])
@pytest.mark.parametrize("element", FP8, ids=fp8_id)
def test_encode_every_16_bit_input_matches_torch_and_ml_dtypes(element, source):
    """All 2**16 f16 / bf16 patterns: +-inf and out-of-range values saturate, NaN stays NaN."""
    storage = np.arange(2**16, dtype=np.uint16).view(FLOAT_DTYPES[source])
    f32 = storage.astype(np.float32)
    got = _encode_all(element, f32)
    np.testing.assert_array_equal(got, torch_fp8_bits(f32, element))
    # ml_dtypes agrees on every non-NaN value (it writes E5M2 NaN as 0x7E, PyTorch and we 0x7F).
    top = element.fp8_max
    with np.errstate(invalid="ignore"):
        want = np.clip(f32, -top, top).astype(element.numpy_dtype).view(np.uint8)
    nan = np.isnan(f32)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    np.testing.assert_array_equal(got[nan] & 0x7F, 0x7F)


@pytest.mark.parametrize("element", FP8, ids=fp8_id)
def test_encode_random_f32_and_every_tie(element):
    rng = np.random.default_rng(15)
    random_bits = rng.integers(0, 2**32, 40_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = finite_fp8_values(element)
    mids = ((values[1:] + values[:-1]) / 2).astype(np.float32)  # exact: the ties between neighbours
    around = np.concatenate([mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))])
    scaled = np.concatenate([random_bits, around, -around, values.astype(np.float32) * np.float32(1.0000001)])
    np.testing.assert_array_equal(_encode_all(element, scaled), torch_fp8_bits(scaled, element))


@pytest.mark.parametrize(("element", "cases"), [
    (E.FP8_E4M3, [(448.0, 0x7E), (464.0, 0x7E), (464.5, 0x7E), (1e30, 0x7E), (np.inf, 0x7E), (-np.inf, 0xFE),
                  (np.nan, 0x7F), (-np.nan, 0xFF), (2.0**-9, 0x01), (2.0**-10, 0x00), (-(2.0**-10), 0x80),
                  (1.5 * 2.0**-10, 0x01), (3 * 2.0**-10, 0x02), (2.0**-6, 0x08), (7 * 2.0**-9, 0x07),
                  (7.5 * 2.0**-9, 0x08), (1.0625, 0x38), (1.1875, 0x3A), (-0.0, 0x80), (0.0, 0x00)]),
    (E.FP8_E5M2, [(57344.0, 0x7B), (61440.0, 0x7B), (1e30, 0x7B), (np.inf, 0x7B), (-np.inf, 0xFB),
                  (np.nan, 0x7F), (2.0**-16, 0x01), (2.0**-17, 0x00), (3 * 2.0**-17, 0x02), (2.0**-14, 0x04),
                  (1.125, 0x3C), (1.375, 0x3E), (-0.0, 0x80)]),
], ids=["e4m3", "e5m2"])
def test_boundaries_largest_finite_smallest_subnormal_ties_specials(element, cases):
    """Hand-derived encodings: saturation, tie-to-even at the top and among subnormals, signed zero."""
    x = np.array([c[0] for c in cases], np.float32)
    q = bn.quantize_per_tensor(x, 1.0, dtype=element)
    assert q.dtype == element.numpy_dtype
    np.testing.assert_array_equal(nan_class(bits(q), element), nan_class([c[1] for c in cases], element))


@pytest.mark.parametrize("source", ["f16", "bf16"])
@pytest.mark.parametrize("element", FP8, ids=fp8_id)
def test_quantize_every_16_bit_input_through_the_kernel(element, source):
    x = np.arange(2**16, dtype=np.uint16).view(FLOAT_DTYPES[source])
    for scale in (1.0, 0.125, 3.0):
        inv = np.float32(1) / np.float32(scale)
        with np.errstate(invalid="ignore", over="ignore"):
            scaled = x.astype(np.float32) * inv
        np.testing.assert_array_equal(nan_class(bits(bn.quantize_per_tensor(x, scale, dtype=element)), element),
                                      nan_class(torch_fp8_bits(scaled, element), element))


# -- every op, every granularity -------------------------------------------------------------------


def make_values(rng, shape, dtype, scale, top) -> np.ndarray:
    """Ordinary values, values near the largest finite one, subnormal-sized ones and specials."""
    n = math.prod(shape)
    kinds = rng.integers(0, 5, n)
    normal = rng.standard_normal(n) * top / 8 * scale
    edge = rng.choice([-1, 1], n) * top * rng.choice([0.9, 1.0, 1.03, 1.07, 2.0], n) * scale
    small = rng.standard_normal(n) * 2.0**-8 * scale
    specials = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]), n)
    values = np.choose(kinds, [normal, edge, small, specials, normal / 64])
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(np.float32).astype(dtype).reshape(shape)


@st.composite
def problems(draw, family):
    rank = draw(st.integers(1, 3))
    shape = list(draw(st.lists(st.integers(0, 6), min_size=rank, max_size=rank)))
    axis = draw(st.integers(-rank, rank - 1)) if family == "channel" else None
    group_size = None
    if family == "group":
        group_size = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
        shape[-1] = group_size * draw(st.integers(0, 3))
    if draw(st.booleans()):
        shape[-1] = draw(st.sampled_from([16, 32, 33])) if family != "group" else shape[-1]
    return dict(shape=tuple(shape), axis=axis, group_size=group_size, seed=draw(st.integers(0, 2**32 - 1)),
                zero_scale=draw(st.booleans()))


def segment_count(family, shape, axis, group_size) -> int:
    if family == "tensor":
        return 1
    if family == "channel":
        return shape[axis]
    rows = math.prod(shape[:-1])
    return rows if family == "token" else rows * (shape[-1] // group_size)


def expand(family, values, shape, axis, group_size):
    if family == "tensor":
        return np.broadcast_to(values.reshape(()), shape)
    if family == "channel":
        return ref.expand_channels(values, shape, axis)
    if family == "token":
        return ref.expand_tokens(values, shape)
    return ref.expand_groups(values, shape, group_size)


def call(op, family, *arrays, scales, axis, group_size, **kw):
    """The dispatch function of ``op`` for ``family`` (no zero points)."""
    function = getattr(bn, f"{op.removesuffix('_backward')}_per_{family}" + ("_backward" if op.endswith("_backward")
                                                                             else ""))
    if family == "tensor":
        return function(*arrays, float(scales.reshape(())), **kw)
    extra = {"channel": (axis,), "token": (), "group": (group_size,)}[family]
    zp = () if op == "dequantize_backward" else (None,)
    return function(*arrays, scales, *zp, *extra, **kw)


@pytest.mark.parametrize("element", FP8, ids=fp8_id)
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "f64"])
@pytest.mark.parametrize("family", FAMILIES)
def test_ops_match_torch_and_reference(family, dtype, element):
    f = FLOAT_DTYPES[dtype]
    math_t = np.float64 if dtype == "f64" else np.float32

    @settings(max_examples=8)
    @given(problems(family))
    def check(p):
        rng = np.random.default_rng(p["seed"])
        shape, axis, group_size = p["shape"], p["axis"], p["group_size"]
        count = segment_count(family, shape, axis, group_size)
        scales = rng.choice([1.0, 0.5, 2.0**-6, 0.013, 3.7], count).astype(math_t)
        if p["zero_scale"] and count and family != "tensor":
            scales[rng.integers(0, count)] = 0
        full = expand(family, scales, shape, axis, group_size)
        x = make_values(rng, shape, f, float(np.median(scales)) if count else 1.0, element.fp8_max)
        dy = (rng.standard_normal(shape) * 4).astype(np.float32).astype(f)
        kw = dict(scales=scales, axis=axis, group_size=group_size)

        q = call("quantize", family, x, dtype=element, **kw)
        assert q.dtype == element.numpy_dtype and q.shape == x.shape
        # PyTorch on the same scaled values (inv rounded to the math precision, as everywhere).
        inv, _ = ref.reciprocal(full, np.dtype(math_t))
        with np.errstate(invalid="ignore", over="ignore"):
            scaled = (x.astype(math_t) * inv.astype(math_t)).astype(math_t)
        scaled = np.where(inv == 0, 0, scaled).astype(math_t)
        np.testing.assert_array_equal(bits(q), torch_fp8_bits(scaled, element))
        assert_fp8_same(q, ref8.fp8_quantize(x, full, element.numpy_dtype))

        d = call("dequantize", family, q, dtype=f, **kw)
        assert_same(d, ref8.fp8_dequantize(q, full, f))
        g = call("quantize_backward", family, dy, x, dtype=element, **kw)
        assert_same(g, ref8.fp8_quantize_backward(dy, x, full, element.numpy_dtype))
        dq = call("dequantize_backward", family, dy, dtype=element, **kw)
        assert_same(dq, ref.dequantize_backward(dy, full))

    check()


def assert_same(got, expected) -> None:
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64))


@pytest.mark.parametrize("tuning", CARDS)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_card_tuning_matches_reference(family, dtype, tuning):
    """Each card's tuning value (tests/tuned.py) through the plans: E4M3 quantize and dequantize per tensor
    (the FP8 quantize grid, the narrow-input dequantize), per token and per group of a power-of-two number of
    chunks (the shift kernels), per channel along the first axis, against the reference."""
    element, f = E.FP8_E4M3, FLOAT_DTYPES[dtype]
    math_t = np.float32
    rng = np.random.default_rng(len(family))
    shape, axis, group_size = (24, 512), (0 if family == "channel" else None), (128 if family == "group" else None)
    count = segment_count(family, shape, axis, group_size)
    scales = rng.choice([1.0, 0.5, 2.0**-6, 0.013, 3.7], count).astype(math_t)
    full = expand(family, scales, shape, axis, group_size)
    x = make_values(rng, shape, f, float(np.median(scales)), element.fp8_max)
    if family == "tensor":
        n, scale = x.size, float(scales[0])
        q = np.empty(shape, element.numpy_dtype)
        planned(bn.QuantizePerTensorPlan, bn.QuantizePerTensorDescriptor(n, -448, 448, dtype, element), tuning,
                bn.QuantizePerTensorArgs(x, scale, None, q))
        d = np.empty(shape, f)
        planned(bn.DequantizePerTensorPlan, bn.DequantizePerTensorDescriptor(n, dtype, element), tuning,
                bn.DequantizePerTensorArgs(q, scale, None, d))
    else:
        layout = dict(scales=scales, axis=axis, group_size=group_size, out=element.short)
        q = per_axis("quantize", family, tuning, x=x, **layout)
        d = per_axis("dequantize", family, tuning, q=q, dtype=dtype, **layout)
    assert_fp8_same(q, ref8.fp8_quantize(x, full, element.numpy_dtype))
    assert_same(d, ref8.fp8_dequantize(q, full, f))


@pytest.mark.parametrize("element", FP8, ids=fp8_id)
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "f64"])
def test_fake_quantize_and_its_gradient(dtype, element):
    f = FLOAT_DTYPES[dtype]

    @settings(max_examples=10)
    @given(st.integers(0, 300), st.sampled_from([1.0, 0.25, 0.013, 7.0]), st.integers(0, 2**32 - 1))
    def check(n, scale, seed):
        rng = np.random.default_rng(seed)
        x = make_values(rng, (n,), f, scale, element.fp8_max)
        dy = (rng.standard_normal(n) * 4).astype(np.float32).astype(f)
        y = bn.fake_quantize(x, scale, dtype=element)
        assert_same(y, ref8.fp8_fake_quantize(x, scale, element.numpy_dtype))
        # PyTorch's composition: (x * inv).clamp(-max, max).to(fp8).to(math) * scale, then to x's dtype.
        math_t = torch.float64 if dtype == "f64" else torch.float32
        xt = torch.from_numpy(x.astype(np.float64 if dtype == "f64" else np.float32))
        inv = torch.tensor(1.0, dtype=math_t) / torch.tensor(scale, dtype=math_t)
        top = element.fp8_max
        yt = ((xt * inv).clamp(-top, top).to(TORCH_FP8[element]).to(math_t) * torch.tensor(scale, dtype=math_t))
        np.testing.assert_array_equal(np.asarray(y).astype(np.float64), yt.numpy().astype(f).astype(np.float64))
        g = bn.fake_quantize_backward(dy, x, scale, dtype=element)
        assert_same(g, ref8.fp8_fake_quantize_backward(dy, x, scale, element.numpy_dtype))
        # The mask is autograd of the clamp: PyTorch's gradient of (x * inv).clamp(-max, max) w.r.t. x * inv.
        v = (xt * inv).requires_grad_()
        v.clamp(-top, top).backward(torch.ones_like(v))
        np.testing.assert_array_equal(ref8.fp8_ste_mask(x, scale, element.numpy_dtype),
                                      (v.grad.numpy() == 1) & ~np.isnan(v.detach().numpy()))

    check()


def test_nan_stays_nan_and_zero_scale_gives_zero():
    x = np.array([[np.nan, -np.nan, 1.0, np.inf], [np.nan, 1.0, -np.inf, 2.0]], np.float32)
    q = bn.quantize_per_token(x, np.array([0.5, 0.0], np.float32), None, dtype="float8_e4m3fn")
    np.testing.assert_array_equal(nan_class(bits(q), E.FP8_E4M3), [[0x7F, 0x7F, 0x40, 0x7E], [0, 0, 0, 0]])
    dx = bn.quantize_per_token_backward(np.ones_like(x), x, np.array([0.5, 0.0], np.float32), None,
                                        dtype="float8_e4m3fn")
    np.testing.assert_array_equal(dx, [[0, 0, 2, 0], [0, 0, 0, 0]])
    y = bn.fake_quantize(x[0], 0.5, dtype="float8_e5m2")
    assert np.isnan(y[0]) and np.isnan(y[1]) and y[2] == 1.0 and y[3] == 57344.0 * 0.5


def test_narrow_clamp_range_and_empty_tensors():
    x = np.array([-300.0, -10.0, 0.3, 250.0, 1e9], np.float32)
    q = bn.quantize_per_tensor(x, 1.0, dtype="float8_e4m3fn", q_min=-240, q_max=240)
    np.testing.assert_array_equal(np.asarray(q).astype(np.float32), [-240, -10, 0.3125, 240, 240])
    empty = np.zeros((0, 8), np.float32)
    assert bn.quantize_per_token(empty, np.zeros(0, np.float32), dtype="float8_e5m2").shape == (0, 8)
    assert bn.dequantize_per_group(np.zeros((3, 0), ml_dtypes.float8_e4m3fn), np.zeros((3, 0), np.float32),
                                   None, 4).shape == (3, 0)


# -- arrays of every kind ------------------------------------------------------------------------


def test_torch_and_ml_dtypes_float8_arrays_in_and_out():
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((4, 32)).astype(np.float32)).to(torch.bfloat16)
    scales = torch.full((4,), 0.01)
    q = bn.quantize_per_token(x, scales, dtype=torch.float8_e4m3fn)
    assert isinstance(q, torch.Tensor) and q.dtype == torch.float8_e4m3fn
    want = (x.float() * (torch.tensor(1.0) / scales[:, None])).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8))
    back = bn.dequantize_per_token(q, scales, dtype=torch.bfloat16)
    assert back.dtype == torch.bfloat16
    assert torch.equal(back, (q.float() * scales[:, None]).to(torch.bfloat16))
    q_np = bn.quantize_per_token(x.float().numpy(), scales.numpy(), dtype=ml_dtypes.float8_e5m2)
    assert q_np.dtype == np.dtype(ml_dtypes.float8_e5m2)
    assert bn.dequantize_per_token(q_np, scales.numpy()).dtype == np.float32


# -- dynamic range -------------------------------------------------------------------------------


@pytest.mark.parametrize("element", FP8, ids=fp8_id)
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "f64"])
@pytest.mark.parametrize("scope", ["tensor", "token", "group", "channel0", "channel1"])
def test_dynamic_range_matches_reference_and_vllm_rule(scope, dtype, element):
    f = FLOAT_DTYPES[dtype]
    rng = np.random.default_rng(len(scope) * 7 + len(dtype))
    x = (rng.standard_normal((6, 64)) * rng.choice([1e-3, 1.0, 300.0], (6, 1))).astype(np.float32).astype(f)
    x[1] = 0  # an all-zero row: the minimum scale
    x[2, 5], x[3, 7], x[4, 9] = np.nan, np.inf, -np.inf  # left out of the range
    kw = {"tensor": {"scope": "tensor"}, "token": {"scope": "token"}, "group": {"scope": "group", "group_size": 16},
          "channel0": {"scope": "channel", "axis": 0}, "channel1": {"scope": "channel", "axis": 1}}[scope]
    r = bn.dynamic_range_quantize(x, dtype=element, **kw)
    assert r.zero_point is None and r.q.dtype == element.numpy_dtype
    name = kw["scope"]
    want_scale = ref8.fp8_dynamic_scale(x, element.numpy_dtype, name, kw.get("axis"), kw.get("group_size"))
    np.testing.assert_array_equal(np.asarray(r.scale).reshape(-1), want_scale)
    if name == "tensor":
        full = np.broadcast_to(want_scale.reshape(()), x.shape)
    elif name == "token":
        full = ref.expand_tokens(want_scale, x.shape)
    elif name == "group":
        full = ref.expand_groups(want_scale, x.shape, 16)
    else:
        full = ref.expand_channels(want_scale, x.shape, kw["axis"])
    assert_fp8_same(r.q, ref8.fp8_quantize(x, full, element.numpy_dtype))


@pytest.mark.parametrize("element", FP8, ids=fp8_id)
@pytest.mark.parametrize(("shape", "dtype"), [((3, 512), "f32"), ((2, 1024), "f16")] if SIMULATOR
                         else [((1, 4096), "bf16"), ((16, 4096), "f16"), ((7, 8192), "bf16"), ((12, 2048), "f32")])
@pytest.mark.parametrize("tuning", CARDS)
def test_dynamic_per_token_few_rows_in_the_fixed_kernel(monkeypatch, shape, dtype, element, tuning):
    """Few rows of exactly one quantizer block's chunks (the W8A8 decode's) take the fixed resident kernel
    (``kernels.dynamic`` ``fixed``) with FP8 outputs too, under each card's tuning value: the reference's scales
    and bits, NaN and inf left out of the range."""
    from baracuda_numba.plans import dynamic as plans_dynamic

    if SIMULATOR:  # the simulator's one SM and 32-thread blocks: rows of 32 x 4 chunks, as many SMs as rows
        monkeypatch.setattr(plans_dynamic, "sm_count", lambda device=0: 64)
    f = FLOAT_DTYPES[dtype]
    rng = np.random.default_rng(shape[0])
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 300.0], (shape[0], 1))).astype(np.float32).astype(f)
    x[0, 5], x[-1, 7], x[-1, 9] = np.nan, np.inf, -np.inf
    if shape[0] > 2:
        x[1] = 0  # an all-zero row: the minimum scale
    plan = bn.DynamicRangeQuantizePlan.select(bn.DynamicRangeQuantizeDescriptor(
        shape, plans_dynamic.DynamicRangeMode.SYMMETRIC, plans_dynamic.DynamicRangeScope.token(), -int(element.fp8_max),
        int(element.fp8_max), dtype, element), tuning=tuning)
    assert plan._segment_kernels[0].py_func.__name__.startswith("dynamic_fixed_"), plan._segment_kernels[0]
    q, scale, _ = dynamic(tuning, x, out=element.short)
    want_scale = ref8.fp8_dynamic_scale(x, element.numpy_dtype, "token", None, None)
    np.testing.assert_array_equal(scale.reshape(-1), want_scale)
    assert_fp8_same(q, ref8.fp8_quantize(x, ref.expand_tokens(want_scale, x.shape), element.numpy_dtype))


def test_dynamic_per_token_equals_vllm_composition_in_torch():
    """vLLM's dynamic per-token FP8: scale = max(amax / 448, 1 / (448 * 512)); q = (x / scale) clamped, cast.
    We multiply by the correctly rounded reciprocal instead of dividing: compared where both agree, and
    the scales bit for bit."""
    rng = np.random.default_rng(1)
    x = torch.from_numpy((rng.standard_normal((8, 128)) * 5).astype(np.float32))
    x[3] = 0
    r = bn.dynamic_range_quantize(x, dtype=torch.float8_e4m3fn, scope="token")
    amax = x.abs().amax(dim=-1)
    scale = (amax / 448.0).clamp(min=1.0 / (448.0 * 512.0))
    assert torch.equal(r.scale, scale)
    inv = 1.0 / scale[:, None]
    want = (x * inv).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(r.q.view(torch.uint8), want.view(torch.uint8))


# -- registry and errors ---------------------------------------------------------------------------


def test_registry_holds_every_fp8_key():
    keys = {e.key for e in registry.entries()}
    elementwise = [k for k in K if k not in (K.DYNAMIC_RANGE, K.QUANTIZED_LINEAR)]
    for kind in elementwise:
        for f in registry.FLOAT_ELEMENTS:
            for g in FP8:
                assert (kind, f, g) in keys
                entry = registry.lookup(kind, f, g)
                assert entry.grid is g and g.short in str(entry.sku)
    for f in registry.FLOAT_ELEMENTS:
        for g in FP8:
            assert (K.DYNAMIC_RANGE, f, g) in keys
    assert sum(1 for e in registry.entries() if e.output_element.is_fp8) == len(elementwise) * 4 * 2 + 4 * 2


def test_dtype_names_normalise():
    for name in ("float8_e4m3fn", "fp8_e4m3", "e4m3", torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn):
        assert bn.element_kind(name) is E.FP8_E4M3
    for name in ("float8_e5m2", "fp8_e5m2", torch.float8_e5m2, ml_dtypes.float8_e5m2):
        assert bn.element_kind(name) is E.FP8_E5M2
    assert E.FP8_E4M3.fp8_max == 448.0 and E.FP8_E5M2.fp8_max == 57344.0
    assert E.FP8_E4M3.q_range == (-448, 448)


@pytest.mark.parametrize(("call_", "argument"), [
    (lambda x: bn.quantize_per_tensor(x, 0.5, 0, dtype="float8_e4m3fn"), "zero_point"),
    (lambda x: bn.quantize_per_tensor(x, 0.5, 3, dtype="float8_e5m2"), "zero_point"),
    (lambda x: bn.dequantize_per_tensor(x.astype(ml_dtypes.float8_e4m3fn), 0.5, 1), "zero_point"),
    (lambda x: bn.quantize_per_token(x.reshape(2, 4), np.ones(2, np.float32), np.zeros(2, np.int32),
                                     dtype="float8_e4m3fn"), "zero_point"),
    (lambda x: bn.dequantize_per_group(x.reshape(2, 4).astype(ml_dtypes.float8_e5m2), np.ones((2, 2), np.float32),
                                       np.zeros((2, 2), np.int32), 2), "zero_point"),
    (lambda x: bn.fake_quantize(x, 0.5, 1, dtype="float8_e4m3fn"), "zero_point"),
    (lambda x: bn.quantize_per_tensor(x, 0.5, dtype="float8_e4m3fn", q_max=449), "(q_min, q_max)"),
    (lambda x: bn.quantize_per_tensor(x, 0.5, dtype="float8_e4m3fn", q_max=300), "q_max"),
    (lambda x: bn.quantize_per_tensor(x, 0.0, dtype="float8_e4m3fn"), "scale"),
    (lambda x: bn.dynamic_range_quantize(x, mode="asymmetric", dtype="float8_e4m3fn"), "mode"),
    (lambda x: bn.dynamic_range_quantize(x, dtype="float8_e5m2", q_min=-57344, q_max=100), "q_max"),
], ids=["zp0", "zp3", "dequant-zp", "token-zps", "group-zps", "fake-zp", "range", "unrepresentable", "scale0",
        "asymmetric", "dyn-unrepresentable"])
def test_bad_inputs_are_typed_and_name_the_argument(call_, argument):
    x = np.linspace(-2, 2, 8).astype(np.float32)
    with pytest.raises(InvalidProblem) as info:
        call_(x)
    assert f": {argument} expected" in str(info.value)


def test_fp8_input_to_quantize_is_unsupported():
    x = np.zeros(4, ml_dtypes.float8_e4m3fn)
    with pytest.raises((Unsupported, InvalidProblem)):
        bn.quantize_per_tensor(x, 1.0, dtype="float8_e4m3fn")


# -- GPU: bit for bit with torch CUDA ---------------------------------------------------------------


def assert_torch_bits(got, want) -> None:
    """The same bytes; where PyTorch's result is NaN only the NaN class (its CUDA cast may drop the sign)."""
    got_bits, want_bits = got.view(torch.uint8), want.view(torch.uint8)
    nan = (want_bits & 0x7F) == 0x7F
    assert torch.equal(got_bits[~nan], want_bits[~nan])
    assert bool(((got_bits[nan] & 0x7F) == 0x7F).all())


@functools.cache
def _kernel_encoder(element):
    """The FP8 encoder the kernels use (on the GPU the conversion instruction), over float32 bits."""
    from baracuda_numba.kernels import device
    from baracuda_numba.kernels.codecs import codec

    encode = codec(element, MathPrecision.F32).encode

    @device.device_function
    def encode_f32_bits(w):
        return encode(device.bits_to_f32(w))

    return encode_f32_bits


@requires_gpu
@pytest.mark.parametrize("element", FP8, ids=fp8_id)
def test_gpu_conversion_instruction_equals_the_integer_model(element):
    """The kernels' encoder (``cvt.rn.satfinite``) against the integer model the simulator runs, over
    every f16 / bf16 value, random f32 bit patterns and every tie of the format."""
    rng = np.random.default_rng(16)
    values = finite_fp8_values(element)
    mids = ((values[1:] + values[:-1]) / 2).astype(np.float32)
    x = np.concatenate([
        np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32),
        (np.arange(2**16, dtype=np.uint32) << 16).view(np.float32),
        rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32),
        mids, -mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0)),
    ])
    encoded = _apply_codec(_kernel_encoder(element), x.view(np.uint32)).astype(np.uint8)
    np.testing.assert_array_equal(encoded, _encode_all(element, x))


@requires_gpu
@pytest.mark.parametrize("element", FP8, ids=fp8_id)
def test_gpu_every_16_bit_input_and_random_f32_match_torch_cuda(element):
    fp8 = TORCH_FP8[element]
    top = element.fp8_max
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.arange(2**16, dtype=torch.int32).to(torch.int16).view(dtype).cuda()
        for scale in (1.0, 0.125, 3.0):
            inv = torch.tensor(1.0, device="cuda") / torch.tensor(scale, device="cuda")
            want = (x.float() * inv).clamp(-top, top).to(fp8)
            got = bn.quantize_per_tensor(x, scale, dtype=fp8)
            assert_torch_bits(got, want)
    gen = torch.Generator(device="cuda").manual_seed(15)
    x = torch.randint(-(2**31), 2**31 - 1, (1 << 22,), device="cuda", dtype=torch.int32, generator=gen)
    x = x.view(torch.float32)
    want = x.clamp(-top, top).to(fp8)
    got = bn.quantize_per_tensor(x, 1.0, dtype=fp8)
    assert_torch_bits(got, want)
    back, exact = bn.dequantize_per_tensor(got, 1.0), got.float()
    assert torch.equal(back.isnan(), exact.isnan()) and torch.equal(back[~exact.isnan()], exact[~exact.isnan()])


@requires_gpu
@pytest.mark.parametrize("element", FP8, ids=fp8_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_granularities_and_dynamic_match_torch_cuda(dtype, element):
    fp8 = TORCH_FP8[element]
    top = element.fp8_max
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = (torch.randn(512, 1024, device="cuda", generator=gen) * 40).to(dtype)
    x[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
    rows = torch.rand(512, device="cuda", generator=gen) + 0.01
    cols = torch.rand(1024, device="cuda", generator=gen) + 0.01
    groups = torch.rand(512, 8, device="cuda", generator=gen) + 0.01

    def want(full_scale):
        inv = 1.0 / full_scale
        return (x.float() * inv).clamp(-top, top).to(fp8)

    assert_torch_bits(bn.quantize_per_token(x, rows, dtype=fp8), want(rows[:, None]))
    assert_torch_bits(bn.quantize_per_channel(x, cols, None, 1, dtype=fp8), want(cols[None, :]))
    assert_torch_bits(bn.quantize_per_group(x, groups, None, 128, dtype=fp8),
                      want(groups.repeat_interleave(128, dim=1)))
    q = bn.quantize_per_token(x, rows, dtype=fp8)
    back, expected = bn.dequantize_per_token(q, rows, dtype=dtype), (q.float() * rows[:, None]).to(dtype)
    assert torch.equal(back.isnan(), expected.isnan()) and torch.equal(back[~back.isnan()], expected[~back.isnan()])
    r = bn.dynamic_range_quantize(x, dtype=fp8, scope="token")
    finite = torch.where(torch.isfinite(x.float()), x.float(), torch.zeros((), device="cuda"))
    # a true division, correctly rounded (torch divides by a Python scalar as a multiply by its reciprocal)
    scale = (finite.abs().amax(-1).double() / top).float().clamp(min=1.0 / (top * 512.0))
    assert torch.equal(r.scale, scale)
    assert_torch_bits(r.q, want(scale[:, None]))


def test_dynamic_fp8_range_must_be_symmetric():
    with pytest.raises(InvalidProblem, match=r"\(q_min, q_max\) expected a symmetric range"):
        bn.dynamic_range_quantize(np.ones((2, 4), np.float32), dtype="float8_e4m3fn", q_min=-224, q_max=448)
