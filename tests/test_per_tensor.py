"""Per-tensor family against the independent NumPy reference (README, "Semantics"), every registered
dtype pair, plus the plan surface and every error path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import FLOAT_DTYPES
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda
from tuned import CARDS, planned

import baracuda_numba as bn
from baracuda_numba import reference as ref
from baracuda_numba import registry
from baracuda_numba.kernels.elementwise import ScaleMode
from baracuda_numba.vocabulary import QuantizeKind as K

PER_TENSOR_KINDS = (K.PER_TENSOR, K.PER_TENSOR_BACKWARD, K.DEQUANTIZE_PER_TENSOR,
                    K.DEQUANTIZE_PER_TENSOR_BACKWARD, K.FAKE_QUANTIZE, K.FAKE_QUANTIZE_BACKWARD)
# int8 / uint8 (FP8: test_fp8.py, 4-bit: test_int4.py; fake quantize with array scales: test_fake_per_axis.py)
ENTRIES = [e for e in registry.entries() if e.kind in PER_TENSOR_KINDS and isinstance(e, registry.RegistryEntry)
           and e.grid is None and e.output_element not in registry.PACKED_ELEMENTS and e.mode is ScaleMode.SCALAR]


def entry_id(entry) -> str:
    return f"{entry.kind.name.lower()}-{entry.input_element.short}-{entry.output_element.short}"


def as_f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def assert_same(got, expected) -> None:
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(as_f64(got), as_f64(expected))


def make_values(rng, n, dtype, scale, zero_point, q_min, q_max) -> np.ndarray:
    """A mix that hits ties, both clamp boundaries, specials and ordinary values."""
    span = max(q_max - q_min, 1)
    kinds = rng.integers(0, 5, n)
    normal = rng.standard_normal(n) * scale * span / 2
    ties = (rng.integers(-span, span, n) + 0.5) * scale
    edges = (rng.choice([q_min, q_max], n) - zero_point + rng.choice([-0.5, 0.5, -1, 1, 0], n)) * scale
    specials = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30]), n)
    values = np.choose(kinds, [normal, ties, edges, specials, normal * 100])
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(np.float32).astype(dtype)


@st.composite
def problems(draw, entry):
    int_kind = entry.output_element if entry.output_element.is_integer else bn.ElementKind.S8
    low, high = int_kind.int_range
    q_min = draw(st.integers(low, high))
    q_max = draw(st.integers(q_min, high))
    zero_point = draw(st.integers(q_min, q_max))
    scale = draw(st.one_of(st.sampled_from([1.0, 0.5, 2.0**-7, 0.1, 0.00214854861]),
                           st.floats(1e-3, 1e2, allow_nan=False)))
    n = draw(st.one_of(st.integers(0, 40), st.integers(41, 600)))
    seed = draw(st.integers(0, 2**32 - 1))
    return dict(n=n, scale=scale, zero_point=zero_point, q_min=q_min, q_max=q_max, seed=seed)


def run_entry(entry, p):
    """(result of the dispatch function, reference) for one registered entry and problem."""
    rng = np.random.default_rng(p["seed"])
    f = entry.input_element.numpy_dtype
    scale, zp, q_min, q_max = p["scale"], p["zero_point"], p["q_min"], p["q_max"]
    x = make_values(rng, p["n"], f, scale, zp, q_min, q_max)
    dy = (rng.standard_normal(p["n"]) * 4).astype(np.float32).astype(f)
    i = entry.output_element
    kind = entry.kind
    if kind is K.PER_TENSOR:
        return (bn.quantize_per_tensor(x, scale, zp, dtype=i, q_min=q_min, q_max=q_max),
                ref.quantize(x, scale, zp, q_min, q_max, i.numpy_dtype))
    if kind is K.PER_TENSOR_BACKWARD:
        return (bn.quantize_per_tensor_backward(dy, x, scale, zp, dtype=i, q_min=q_min, q_max=q_max),
                ref.quantize_backward(dy, x, scale, zp, q_min, q_max))
    if kind is K.DEQUANTIZE_PER_TENSOR:
        low, high = i.int_range
        q = rng.integers(low, high + 1, p["n"]).astype(i.numpy_dtype)
        return bn.dequantize_per_tensor(q, scale, zp, dtype=f), ref.dequantize(q, scale, zp, f)
    if kind is K.DEQUANTIZE_PER_TENSOR_BACKWARD:
        return bn.dequantize_per_tensor_backward(dy, scale, dtype=i), ref.dequantize_backward(dy, scale)
    if kind is K.FAKE_QUANTIZE:
        return bn.fake_quantize(x, scale, zp, q_min, q_max), ref.fake_quantize(x, scale, zp, q_min, q_max)
    if kind is K.FAKE_QUANTIZE_BACKWARD:
        return (bn.fake_quantize_backward(dy, x, scale, zp, q_min, q_max),
                ref.fake_quantize_backward(dy, x, scale, zp, q_min, q_max))
    raise AssertionError(kind)


def test_every_per_tensor_kind_is_registered_for_every_dtype_pair():
    pairs = {(e.kind, e.input_element.short, e.output_element.short) for e in ENTRIES}
    for kind in PER_TENSOR_KINDS:
        for f in ("f32", "f64", "f16", "bf16"):
            outs = (f,) if kind in (K.FAKE_QUANTIZE, K.FAKE_QUANTIZE_BACKWARD) else ("s8", "u8")
            for o in outs:
                assert (kind, f, o) in pairs


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_id)
def test_matches_reference(entry):
    @given(problems(entry))
    def check(p):
        got, expected = run_entry(entry, p)
        assert_same(got, expected)

    check()


def run_plan(entry, p, tuning):
    """(result of the entry's plan under ``tuning``, reference) for one problem: the plans the dispatch functions
    select, NumPy in and out."""
    rng = np.random.default_rng(p["seed"])
    f, i, kind, n = entry.input_element, entry.output_element, entry.kind, p["n"]
    scale, zp, q_min, q_max = p["scale"], p["zero_point"], p["q_min"], p["q_max"]
    x = make_values(rng, n, f.numpy_dtype, scale, zp, q_min, q_max)
    dy = (rng.standard_normal(n) * 4).astype(np.float32).astype(f.numpy_dtype)
    out = np.empty(n, (i if kind is K.PER_TENSOR else f).numpy_dtype)
    if kind is K.PER_TENSOR:
        planned(bn.QuantizePerTensorPlan, bn.QuantizePerTensorDescriptor(n, q_min, q_max, f, i), tuning,
                bn.QuantizePerTensorArgs(x, scale, zp, out))
        return out, ref.quantize(x, scale, zp, q_min, q_max, i.numpy_dtype)
    if kind is K.PER_TENSOR_BACKWARD:
        planned(bn.QuantizePerTensorBackwardPlan, bn.QuantizePerTensorBackwardDescriptor(n, q_min, q_max, f, i),
                tuning, bn.QuantizePerTensorBackwardArgs(x, scale, zp, dy, out))
        return out, ref.quantize_backward(dy, x, scale, zp, q_min, q_max)
    if kind is K.DEQUANTIZE_PER_TENSOR:
        low, high = i.int_range
        q = rng.integers(low, high + 1, n).astype(i.numpy_dtype)
        planned(bn.DequantizePerTensorPlan, bn.DequantizePerTensorDescriptor(n, f, i), tuning,
                bn.DequantizePerTensorArgs(q, scale, zp, out))
        return out, ref.dequantize(q, scale, zp, f.numpy_dtype)
    if kind is K.DEQUANTIZE_PER_TENSOR_BACKWARD:
        planned(bn.DequantizePerTensorBackwardPlan, bn.DequantizePerTensorBackwardDescriptor(n, f, i), tuning,
                bn.DequantizePerTensorBackwardArgs(scale, dy, out))
        return out, ref.dequantize_backward(dy, scale)
    if kind is K.FAKE_QUANTIZE:
        planned(bn.FakeQuantizePlan, bn.FakeQuantizeDescriptor(n, q_min, q_max, f), tuning,
                bn.FakeQuantizeArgs(x, scale, zp, out))
        return out, ref.fake_quantize(x, scale, zp, q_min, q_max)
    planned(bn.FakeQuantizeBackwardPlan, bn.FakeQuantizeBackwardDescriptor(n, q_min, q_max, f), tuning,
            bn.FakeQuantizeBackwardArgs(x, scale, zp, dy, out))
    return out, ref.fake_quantize_backward(dy, x, scale, zp, q_min, q_max)


@pytest.mark.parametrize("tuning", CARDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=entry_id)
def test_every_card_tuning_matches_reference(entry, tuning):
    """Each card's tuning value (its chunks in flight, launch bounds and grids; tests/tuned.py) gives the
    reference's bits through the plans, on whatever device runs the test."""
    @settings(max_examples=10)
    @given(problems(entry))
    def check(p):
        got, expected = run_plan(entry, p, tuning)
        assert_same(got, expected)

    check()


def test_pytorch_tie_example_quint8_gives_128():
    # README, "Semantics": PyTorch's CPU quantize_per_tensor gives 128 here (x * (1/scale) is a tie
    # only after rounding the reciprocal to float32).
    x = np.array([0.273939937], np.float32)
    assert bn.quantize_per_tensor(x, 0.00214854861, 0, dtype="uint8")[0] == 128
    assert ref.quantize(x, 0.00214854861, 0, 0, 255, np.uint8)[0] == 128


@pytest.mark.parametrize("name", FLOAT_DTYPES)
def test_round_half_to_even(name):
    x = np.array([0.25, 0.75, 1.25, -0.25, -0.75, -1.25, 1.75], np.float32).astype(FLOAT_DTYPES[name])
    # x / 0.5 = 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5 -> half to even
    np.testing.assert_array_equal(bn.quantize_per_tensor(x, 0.5), [0, 2, 2, 0, -2, -2, 4])
    np.testing.assert_array_equal(as_f64(bn.fake_quantize(x, 0.5)), [0, 1, 1, 0, -1, -1, 2])


@pytest.mark.parametrize("name", FLOAT_DTYPES)
def test_non_finite_inputs(name):
    f = FLOAT_DTYPES[name]
    x = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32).astype(f)
    np.testing.assert_array_equal(bn.quantize_per_tensor(x, 0.1, 3), [127, -128, 3, 13])
    np.testing.assert_array_equal(bn.quantize_per_tensor(x, 0.1, 7, q_min=5, q_max=9), [9, 5, 7, 9])
    np.testing.assert_array_equal(bn.quantize_per_tensor(x, 0.1, 10, dtype="uint8"), [255, 0, 10, 20])
    y = as_f64(bn.fake_quantize(x, 0.5, 0, -4, 4))
    assert y[0] == 2.0 and y[1] == -2.0 and math.isnan(y[2]) and y[3] == 1.0
    dy = np.ones(4, np.float32).astype(f)
    np.testing.assert_array_equal(as_f64(bn.fake_quantize_backward(dy, x, 0.5, 0, -4, 4)), [0, 0, 0, 1])
    np.testing.assert_array_equal(as_f64(bn.quantize_per_tensor_backward(dy, x, 0.5, 0)), [0, 0, 0, 2])


def test_backward_mask_is_inclusive_at_both_ends():
    x = np.array([-129, -128, -127, 126, 127, 128], np.float32)
    dy = np.ones_like(x)
    np.testing.assert_array_equal(bn.fake_quantize_backward(dy, x, 1.0, 0, -128, 127), [0, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(bn.quantize_per_tensor_backward(dy, x, 0.5, 0), np.zeros(6))
    np.testing.assert_array_equal(bn.quantize_per_tensor_backward(dy, x / 2, 0.5, 0), [0, 2, 2, 2, 2, 0])


def test_forward_and_backward_agree_at_ties():
    # A tie that rounds into range (127.5 -> 128 is out, 126.5 -> 126 is in): the mask follows
    # exactly the forward's rounding.
    x = np.array([127.5, 126.5, -128.5, -127.5], np.float32) * 0.25
    dy = np.ones_like(x)
    q = bn.quantize_per_tensor(x, 0.25)
    mask = bn.fake_quantize_backward(dy, x, 0.25)
    np.testing.assert_array_equal(q, [127, 126, -128, -128])
    np.testing.assert_array_equal(mask, [0, 1, 1, 1])


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1031])
def test_sizes_around_pack_and_block_boundaries(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    assert_same(bn.quantize_per_tensor(x, 0.03, -2), ref.quantize(x, 0.03, -2, -128, 127, np.int8))
    q = bn.quantize_per_tensor(x, 0.03, -2)
    assert_same(bn.dequantize_per_tensor(q, 0.03, -2, dtype="bfloat16"),
                ref.dequantize(q, 0.03, -2, FLOAT_DTYPES["bf16"]))


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_unaligned_views_use_the_element_path(offset):
    rng = np.random.default_rng(offset)
    base = (rng.standard_normal(100) * 3).astype(np.float32)
    x = base[offset:]  # contiguous, but not 8-byte aligned for odd offsets
    out_base = np.zeros(100, np.int8)
    out = out_base[offset:]
    bn.quantize_per_tensor(x, 0.05, out=out)
    assert_same(out, ref.quantize(x, 0.05, 0, -128, 127, np.int8))
    assert (out_base[:offset] == 0).all()


@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0, 2)])
def test_empty_tensors(shape):
    x = np.zeros(shape, np.float32)
    q = bn.quantize_per_tensor(x, 0.1)
    assert q.shape == shape and q.dtype == np.int8
    assert bn.dequantize_per_tensor(q, 0.1, dtype="float16").shape == shape
    assert bn.fake_quantize(x, 0.1).shape == shape
    assert bn.fake_quantize_backward(x, x, 0.1).shape == shape
    assert bn.quantize_per_tensor_backward(x, x, 0.1).shape == shape
    assert bn.dequantize_per_tensor_backward(x, 0.1).dtype == np.float32


def test_shape_and_dtype_follow_the_input():
    x = np.linspace(-2, 2, 60, dtype=np.float32).reshape(3, 4, 5)
    q = bn.quantize_per_tensor(x, 0.02, 10, dtype="uint8")
    assert q.shape == (3, 4, 5) and q.dtype == np.uint8
    y = bn.dequantize_per_tensor(q, 0.02, 10, dtype=np.float64)
    assert y.dtype == np.float64 and y.shape == (3, 4, 5)
    assert_same(q, ref.quantize(x, 0.02, 10, 0, 255, np.uint8))


def test_zero_point_at_range_edges_and_narrow_range():
    x = np.linspace(-3, 3, 41, dtype=np.float32)
    for zp, lo, hi in [(-128, -128, 127), (127, -128, 127), (0, -1, 1), (5, 5, 5)]:
        assert_same(bn.quantize_per_tensor(x, 0.1, zp, q_min=lo, q_max=hi), ref.quantize(x, 0.1, zp, lo, hi, np.int8))


def test_float64_math_is_float64():
    # Near-ties of x * (1/0.1) land on different sides in float32 and float64 math.
    x = (np.arange(-100, 100) + 0.5) * 0.1
    q = bn.quantize_per_tensor(x, 0.1)
    np.testing.assert_array_equal(q, np.clip(np.rint(x * (1 / 0.1)), -128, 127))
    as_float32_math = np.rint(x.astype(np.float32) * (np.float32(1) / np.float32(0.1)))
    assert (q != as_float32_math).sum() > 10
    plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(2, -128, 127, "f64", "s8"))
    assert plan.precision_guarantee().math_precision is bn.MathPrecision.F64
    plan32 = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(2, -128, 127, "f32", "s8"))
    assert plan32.precision_guarantee().math_precision is bn.MathPrecision.F32


# -- Plan surface ----------------------------------------------------------------------------------


def test_plan_select_run_and_reuse():
    desc = bn.QuantizePerTensorDescriptor(numel=50, q_min=-100, q_max=100, input_element="float32",
                                          output_element=bn.ElementKind.S8)
    plan = bn.QuantizePerTensorPlan.select(desc)
    assert plan.workspace_size() == 0
    sku = plan.sku()
    assert sku.op is K.PER_TENSOR and sku.element is bn.ElementKind.F32 and sku.aux_element is bn.ElementKind.S8
    assert hash(sku) == hash(registry.lookup(K.PER_TENSOR, bn.ElementKind.F32, bn.ElementKind.S8).sku)
    assert plan.precision_guarantee().deterministic
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(50).astype(np.float32) * 3
        q = np.empty(50, np.int8)
        args = bn.QuantizePerTensorArgs(input=x, scale=0.02, zero_point=seed, output=q)
        assert plan.can_implement(args)
        plan.run(args)
        assert_same(q, ref.quantize(x, 0.02, seed, -100, 100, np.int8))


def test_plan_accepts_numba_device_arrays():
    x = np.random.default_rng(1).standard_normal(77).astype(np.float32)
    d_x, d_q = cuda.to_device(x), cuda.device_array(77, np.int8)
    plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(77, -128, 127, "f32", "s8"))
    plan.run(bn.QuantizePerTensorArgs(d_x, 0.01, 0, d_q))
    assert_same(d_q.copy_to_host(), ref.quantize(x, 0.01, 0, -128, 127, np.int8))
    result = bn.quantize_per_tensor(d_x, 0.01)
    assert not isinstance(result, np.ndarray)
    assert_same(result.copy_to_host(), ref.quantize(x, 0.01, 0, -128, 127, np.int8))


def test_every_plan_runs_through_the_plan_layer():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(33).astype(np.float16)
    dy = rng.standard_normal(33).astype(np.float16)
    q = rng.integers(0, 256, 33).astype(np.uint8)
    out = np.empty(33, np.float16)
    cases = [
        (bn.QuantizePerTensorBackwardPlan, bn.QuantizePerTensorBackwardDescriptor(33, 0, 255, "f16", "u8"),
         bn.QuantizePerTensorBackwardArgs(x, 0.01, 128, dy, out), ref.quantize_backward(dy, x, 0.01, 128, 0, 255)),
        (bn.DequantizePerTensorPlan, bn.DequantizePerTensorDescriptor(33, "f16", "u8"),
         bn.DequantizePerTensorArgs(q, 0.01, 128, out), ref.dequantize(q, 0.01, 128, np.float16)),
        (bn.DequantizePerTensorBackwardPlan, bn.DequantizePerTensorBackwardDescriptor(33, "f16", "u8"),
         bn.DequantizePerTensorBackwardArgs(0.01, dy, out), ref.dequantize_backward(dy, 0.01)),
        (bn.FakeQuantizePlan, bn.FakeQuantizeDescriptor(33, 0, 255, "f16"),
         bn.FakeQuantizeArgs(x, 0.01, 128, out), ref.fake_quantize(x, 0.01, 128, 0, 255)),
        (bn.FakeQuantizeBackwardPlan, bn.FakeQuantizeBackwardDescriptor(33, 0, 255, "f16"),
         bn.FakeQuantizeBackwardArgs(x, 0.01, 128, dy, out), ref.fake_quantize_backward(dy, x, 0.01, 128, 0, 255)),
    ]
    for plan_type, desc, args, expected in cases:
        plan_type.select(desc).run(args)
        assert_same(out, expected)


@pytest.mark.parametrize(("change", "needle"), [
    (dict(input=np.zeros(49, np.float32)), "input expected 50 elements, got 49"),
    (dict(input=np.zeros(50, np.float64)), "input expected elements of f32, got f64"),
    (dict(output=np.zeros(50, np.uint8)), "output expected elements of s8, got u8"),
    (dict(input=np.zeros(100, np.float32)[::2]), "input expected a C-contiguous array"),
    (dict(output=np.zeros((10, 10), np.int8).T[:5]), "output expected a C-contiguous array"),
    (dict(scale=0.0), "scale expected a finite value > 0"),
    (dict(scale=-1.0), "scale expected a finite value > 0"),
    (dict(scale=float("nan")), "scale expected a finite value > 0"),
    (dict(scale=float("inf")), "scale expected a finite value > 0"),
    (dict(scale=1e-50), "scale expected a finite value > 0 with a finite reciprocal in float32"),
    (dict(scale=1e-39), "with a finite reciprocal in float32"),
    (dict(zero_point=101), "zero_point expected an integer in [-100, 100], got 101"),
    (dict(zero_point=1.5), "zero_point expected an integer, got 1.5"),
    (dict(input=[0.0] * 50), "input expected a numba device array"),
])
def test_can_implement_and_run_give_the_same_reason(change, needle):
    plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(50, -100, 100, "f32", "s8"))
    fields = dict(input=np.zeros(50, np.float32), scale=0.1, zero_point=0, output=np.zeros(50, np.int8))
    fields.update(change)
    args = bn.QuantizePerTensorArgs(**fields)
    verdict = plan.can_implement(args)
    assert not verdict and needle in verdict.reason and verdict.reason.startswith("QuantizePerTensorPlan: ")
    with pytest.raises(verdict.error) as info:
        plan.run(args)
    assert str(info.value) == verdict.reason
    assert (fields["output"] == 0).all() if isinstance(fields["output"], np.ndarray) else True


@pytest.mark.parametrize(("desc", "error", "needle"), [
    (bn.QuantizePerTensorDescriptor(10, 5, 4, "f32", "s8"), bn.InvalidProblem, "q_min expected <= q_max (4), got 5"),
    (bn.QuantizePerTensorDescriptor(10, -129, 127, "f32", "s8"), bn.InvalidProblem, "within [-128, 127]"),
    (bn.QuantizePerTensorDescriptor(10, 0, 256, "f32", "u8"), bn.InvalidProblem, "within [0, 255]"),
    (bn.QuantizePerTensorDescriptor(-1, 0, 1, "f32", "s8"), bn.InvalidProblem, "numel expected >= 0, got -1"),
    (bn.QuantizePerTensorDescriptor(10, 0, 1, "s8", "s8"), bn.Unsupported, "f32->s8"),
    (bn.QuantizePerTensorDescriptor(10, 0, 1, "f32", "i32"), bn.Unsupported, "got f32->i32"),
    (bn.QuantizePerTensorDescriptor(10, 0, 1, "f32", "int16"), bn.InvalidProblem, "output_element expected"),
    (bn.QuantizePerTensorDescriptor(10.5, 0, 1, "f32", "s8"), bn.InvalidProblem, "numel expected an integer"),
    (bn.FakeQuantizeDescriptor(10, 0, 2**25, "f32"), bn.InvalidProblem, "within [-16777216, 16777216]"),
    (bn.DequantizePerTensorDescriptor(10, "s8", "f32"), bn.Unsupported, "DequantizePerTensorPlan"),
])
def test_select_rejects_bad_descriptors(desc, error, needle):
    plan_type = {bn.QuantizePerTensorDescriptor: bn.QuantizePerTensorPlan,
                 bn.FakeQuantizeDescriptor: bn.FakeQuantizePlan,
                 bn.DequantizePerTensorDescriptor: bn.DequantizePerTensorPlan}[type(desc)]
    with pytest.raises(error) as info:
        plan_type.select(desc)
    assert needle in str(info.value)
    assert str(info.value).startswith(plan_type.__name__)


def test_select_rejects_a_descriptor_of_another_plan():
    with pytest.raises(bn.InvalidProblem, match="desc expected QuantizePerTensorDescriptor"):
        bn.QuantizePerTensorPlan.select(bn.FakeQuantizeDescriptor(1, 0, 1, "f32"))


def test_unsupported_lists_what_is_registered():
    with pytest.raises(bn.Unsupported) as info:
        bn.quantize_per_tensor(np.zeros(4, np.int8), 0.1)
    message = str(info.value)
    for pair in ("f32->s8", "f32->u8", "f64->s8", "f16->u8", "bf16->s8"):
        assert pair in message
    assert isinstance(info.value, NotImplementedError)


def test_dispatch_errors_name_the_argument():
    x = np.zeros(8, np.float32)
    with pytest.raises(bn.InvalidProblem, match="out expected shape"):
        bn.quantize_per_tensor(x, 0.1, out=np.zeros(9, np.int8))
    with pytest.raises(bn.InvalidProblem, match="out expected dtype s8, got u8"):
        bn.quantize_per_tensor(x, 0.1, out=np.zeros(8, np.uint8))
    with pytest.raises(bn.InvalidProblem, match="dtype expected"):
        bn.quantize_per_tensor(x, 0.1, dtype="int7")
    with pytest.raises(bn.InvalidOperand, match="quantize_per_tensor: x expected"):
        bn.quantize_per_tensor([1.0, 2.0], 0.1)
    with pytest.raises(bn.InvalidProblem, match=r"d_output expected elements of f32, got f64"):
        bn.fake_quantize_backward(np.zeros(8, np.float64), x, 0.1)
    with pytest.raises(bn.Unsupported):
        bn.quantize_per_tensor(x, 0.1, dtype="float32")
    with pytest.raises(bn.InvalidProblem, match="scale expected a real number"):
        bn.quantize_per_tensor(x, "0.1")


def test_scale_and_zero_point_accept_numpy_scalars_and_one_element_arrays():
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    expected = ref.quantize(x, 0.01, 4, -128, 127, np.int8)
    assert_same(bn.quantize_per_tensor(x, np.float32(0.01), np.int64(4)), expected)
    assert_same(bn.quantize_per_tensor(x, np.array([0.01], np.float32), np.array([4])), expected)
