"""W8A8 and SmoothQuant linear: exact int32 accumulation and the float32 epilogue against the NumPy
reference (simulated tensor-core mma), the plan surface, error paths and bad scales, the preference, the
calibration helpers; on the GPU against ``torch._int_mm``. The choice of kernels is tested in
``test_linear_choice.py``, each kernel variant in ``test_linear_kernels.py``, the fast launch path in
``test_linear_fast.py``, the GPU-only behaviour in ``test_linear_gpu.py``."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FLOAT_DTYPES, SIMULATOR, requires_gpu, simulator_keeps
from hypothesis import given, settings
from hypothesis import strategies as st
from linear_helpers import device, ql, run_ql, run_sq, special_rows, sq, unfused, weights

import baracuda_numba as bn
from baracuda_numba import reference as ref
from baracuda_numba import registry
from baracuda_numba.plans.linear import H100_TUNING
from baracuda_numba.vocabulary import ArchSku, BackendKind, PlanPreference
from baracuda_numba.vocabulary import QuantizeKind as K

BF16 = bn.ElementKind.BF16.numpy_dtype


def test_registered_for_every_float_output():
    keys = {e.key for e in registry.entries() if e.kind is K.QUANTIZED_LINEAR}
    for f in registry.FLOAT_ELEMENTS:
        assert (K.QUANTIZED_LINEAR, f, f) in keys and (K.QUANTIZED_LINEAR, bn.ElementKind.S8, f) in keys


# Both kernels (skinny for M <= 64, tiled above) on ragged shapes: M, N not multiples of their tiles,
# K not a multiple of the 64-byte chunk, K % 16 != 0 (byte-assembled chunks) and == 0 (16-byte loads),
# several row / column tiles and several K steps, one row, bias or not, every float dtype. The
# simulator runs the mma through shared memory: small shapes only.
CASES = [((5, 40), 12, "float32", True), ((1, 37), 9, "float64", False), ((3, 2, 64), 70, "bfloat16", True),
         ((40, 208), 17, "float16", True), ((66, 33), 8, "float16", False), ((65, 80), 9, "float32", True),
         ((129, 16), 130, "bfloat16", False)]


@pytest.mark.parametrize(("x_shape", "n", "dtype", "with_bias"), CASES)
def test_quantized_linear_matches_reference(x_shape, n, dtype, with_bias):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(x_shape) * 2).astype(bn.element_kind(dtype).numpy_dtype)
    w, ws = weights(rng, n, x_shape[-1])
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    y = bn.quantized_linear(x, w, ws, bias=bias)
    expected = ref.linear.quantized_linear(x, w, ws, bias)
    assert y.shape == (*x_shape[:-1], n) and y.dtype == x.dtype
    np.testing.assert_array_equal(y.astype(np.float64), expected.astype(np.float64))


# The simulator emulates every mma in Python: a handful of skinny shapes there, both kernels on the GPU.
_MAX_M, _MAX_N, _MAX_K = (20, 20, 140) if SIMULATOR else (300, 300, 700)


@st.composite
def linear_problems(draw):
    m, n, k = (draw(st.integers(1, _MAX_M)), draw(st.integers(1, _MAX_N)), draw(st.integers(1, _MAX_K)))
    dtype = draw(st.sampled_from(sorted(FLOAT_DTYPES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    magnitude = 10.0 ** draw(st.integers(-6, 4))
    x = rng.standard_normal((m, k)) * magnitude
    x[rng.random((m, k)) < draw(st.sampled_from([0.0, 0.5]))] = 0.0  # sparse rows, now and then all zero
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    ws = (rng.uniform(0.5, 2.0, n) * 10.0 ** draw(st.integers(-6, 1))).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if draw(st.booleans()) else None
    return x.astype(FLOAT_DTYPES[dtype]), w, ws, bias, float(draw(st.floats(1e-6, 1e3)))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # f16 outputs saturate to inf
# On a GPU most examples select plans of their own shape and compile their kernels (several seconds each): more
# than 24 examples outlast a GPU test shard's time limit.
@settings(max_examples=6 if SIMULATOR else 24)
@given(linear_problems())
def test_linear_ops_match_reference_on_random_problems(problem):
    x, w, ws, bias, act_scale = problem
    y = bn.quantized_linear(x, w, ws, bias=bias)
    np.testing.assert_array_equal(y.astype(np.float64), ref.linear.quantized_linear(x, w, ws, bias).astype(np.float64))
    act = np.clip(np.rint(x.astype(np.float64) * 50), -127, 127).astype(np.int8)
    y = bn.smoothquant_linear(act, w, ws, act_scale, bias=bias, dtype=x.dtype)
    expected = ref.linear.smoothquant_linear(act, w, ws, act_scale, bias, x.dtype)
    np.testing.assert_array_equal(y.astype(np.float64), expected.astype(np.float64))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smoothquant_linear_matches_reference(dtype):
    rng = np.random.default_rng(3)
    act = rng.integers(-127, 128, (7, 50)).astype(np.int8)
    w, ws = weights(rng, 11, 50)
    bias = rng.standard_normal(11).astype(np.float32)
    y = bn.smoothquant_linear(act, w, ws, 0.037, bias=bias, dtype=dtype)
    expected = ref.linear.smoothquant_linear(act, w, ws, 0.037, bias, bn.element_kind(dtype).numpy_dtype)
    np.testing.assert_array_equal(y.astype(np.float64), expected.astype(np.float64))


def test_plan_surface_and_workspace():
    desc = bn.QuantizedLinearDescriptor(m=4, n=8, k=32, input_element="f32", output_element="f32")
    plan = bn.QuantizedLinearPlan.select(desc)
    assert plan.sku().precision_guarantee.math_precision is bn.MathPrecision.INT32
    assert plan.workspace_size() >= 4 * 32 + 4 * 4
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    w, ws = weights(rng, 8, 32)
    out = np.zeros((4, 8), np.float32)
    args = bn.QuantizedLinearArgs(x, w, ws, out)
    assert plan.can_implement(args)
    plan.run(args, workspace=np.zeros(plan.workspace_size(), np.uint8))
    np.testing.assert_array_equal(out, ref.linear.quantized_linear(x, w, ws))
    with pytest.raises(bn.WorkspaceTooSmall):
        plan.run(args, workspace=np.zeros(8, np.uint8))


@pytest.mark.parametrize(("call", "error", "needle"), [
    (lambda x, w, s: bn.quantized_linear(x, np.ascontiguousarray(w[:, :20]), s), bn.InvalidProblem,
     "weight_q expected [N, 32] (K of x)"),
    (lambda x, w, s: bn.quantized_linear(x, w.astype(np.float32), s), bn.InvalidProblem,
     "weight_q expected int8 elements, got f32"),
    (lambda x, w, s: bn.quantized_linear(x, w, s[:5]), bn.InvalidProblem, "weight_scale expected 8 elements, got 5"),
    (lambda x, w, s: bn.quantized_linear(x, w, s, bias=np.zeros(3, np.float32)), bn.InvalidProblem,
     "bias expected 8 elements, got 3"),
    (lambda x, w, s: bn.quantized_linear(x, w[None], s), bn.InvalidProblem, "weight_q expected an [N, K] array"),
    (lambda x, w, s: bn.quantized_linear(x.astype(np.int8), w, s), bn.Unsupported, "QuantizedLinearPlan"),
    (lambda x, w, s: bn.smoothquant_linear(x, w, s, 0.1), bn.InvalidProblem, "act_q expected int8 elements"),
    (lambda x, w, s: bn.smoothquant_linear(x.astype(np.int8), w, s, 0.0), bn.InvalidProblem,
     "act_scale expected a finite value > 0"),
    (lambda x, w, s: bn.smoothquant_linear(x.astype(np.int8), w, s, 0.1, dtype="int8"), bn.Unsupported,
     "SmoothQuantLinearPlan"),
])
def test_bad_inputs(call, error, needle):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    w, ws = weights(rng, 8, 32)
    with pytest.raises(error) as info:
        call(x, w, ws)
    assert needle in str(info.value)


def test_k_bound_keeps_int32_exact():
    assert 132104 * 127 * 128 < 2**31 <= 132105 * 127 * 128
    with pytest.raises(bn.InvalidProblem, match="k expected <= 132104"):
        bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(1, 1, 132105, "f32", "f32"))


def test_smoothquant_calibration_helpers():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 16)).astype(np.float32)
    x[..., 5] *= 50
    w = rng.standard_normal((8, 16)).astype(np.float32)
    act = bn.activation_absmax(x)
    np.testing.assert_array_equal(act, np.abs(x).reshape(-1, 16).max(axis=0))
    running = bn.activation_absmax(x * 2, act)
    np.testing.assert_array_equal(running, 2 * act)
    s = bn.smoothing_scales(act, bn.weight_absmax(w), alpha=0.5)
    expected = np.sqrt(np.maximum(act, 1e-5)) / np.sqrt(np.maximum(np.abs(w).max(axis=0), 1e-5))
    np.testing.assert_allclose(s, expected, rtol=1e-6)
    # smoothing moves the outlier from the activations to the weights, the product is unchanged
    np.testing.assert_allclose(bn.smooth_activation(x, s) @ bn.smooth_weight(w, s).T, x @ w.T, rtol=1e-4, atol=1e-4)
    assert np.abs(bn.smooth_activation(x, s)).max() < np.abs(x).max()
    with pytest.raises(bn.InvalidProblem, match="alpha expected a value in"):
        bn.smoothing_scales(act, act, alpha=1.5)



@requires_gpu
@pytest.mark.parametrize("k", [520, 512])  # byte-assembled and 16-byte chunks
@pytest.mark.parametrize("m", [1, 17, 64, 65, 333, 70_000])  # skinny up to 64 rows, tiled above
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_gpu_against_torch_int_mm(m, k, dtype):
    torch = pytest.importorskip("torch")
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
              "float64": torch.float64}[dtype]
    n = 264
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", generator=g).to(tdtype)
    w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    bias = torch.randn(n, device="cuda", generator=g)
    y = bn.quantized_linear(x, w, ws, bias=bias)
    r = bn.dynamic_range_quantize(x)
    xq = r.q
    if m > 16:
        acc = torch._int_mm(xq, w.t())
    else:
        acc = (xq.double() @ w.double().t()).to(torch.int32)
    expected = (acc.float() * r.scale[:, None]) * ws[None, :] + bias[None, :]
    error = ((y.double() - expected.double()).norm() / expected.double().norm()).item()
    assert y.dtype == tdtype and error <= (1e-6 if dtype in ("float32", "float64") else 1e-2), error


def test_empty_problems():
    ws, bias = np.full(5, 0.5, np.float32), np.arange(5, dtype=np.float32)
    # K = 0: every dot product is empty, the output is the bias (or zero)
    y = bn.quantized_linear(np.zeros((3, 0), np.float32), np.zeros((5, 0), np.int8), ws, bias=bias)
    np.testing.assert_array_equal(y, np.broadcast_to(bias, (3, 5)))
    # ... whatever the workspace held before (all-ones bytes: NaN scales), float32 and float64 scales
    for dtype in (np.float32, np.float64):
        plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(3, 5, 0, dtype.__name__, dtype.__name__,
                                                                          True))
        out = np.full((3, 5), 7, dtype)
        plan.run(bn.QuantizedLinearArgs(np.zeros((3, 0), dtype), np.zeros((5, 0), np.int8), ws, out, bias),
                 workspace=np.full(plan.workspace_size(), 0xFF, np.uint8))
        np.testing.assert_array_equal(out, np.broadcast_to(bias, (3, 5)).astype(dtype))
    y = bn.smoothquant_linear(np.zeros((2, 0), np.int8), np.zeros((5, 0), np.int8), ws, 0.1)
    np.testing.assert_array_equal(y, np.zeros((2, 5), np.float32))
    # M = 0 or N = 0: nothing to compute, shapes still right
    assert bn.quantized_linear(np.zeros((0, 4), np.float32), np.zeros((5, 4), np.int8), ws).shape == (0, 5)
    assert bn.quantized_linear(np.ones((2, 4), np.float32), np.zeros((0, 4), np.int8), ws[:0]).shape == (2, 0)


# Each GEMM variant the plans may pick, on the simulator: the cp.async pipeline through more K chunks
# than it has stages (its ring of stages wraps; zero-filled chunks past K), the skinny kernel with
# several column tiles per block (ragged N) and several chunks in flight, and its double-buffered
# aligned form through an odd number of main-loop iterations (the last pair's second half empty);

def test_static_weight_must_be_a_bool():
    x, (w, ws) = np.ones((1, 16), np.float32), weights(np.random.default_rng(0), 4, 16)
    with pytest.raises(bn.InvalidProblem, match="quantized_linear: static_weight expected a bool, got 'yes'"):
        bn.quantized_linear(x, w, ws, static_weight="yes")
    with pytest.raises(bn.InvalidProblem, match="QuantizedLinearPlan: static_weight expected a bool, got 1"):
        bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(1, 4, 16, "f32", "f32", False, 1))
    with pytest.raises(bn.InvalidProblem, match="smoothquant_linear: static_weight expected a bool, got 1"):
        bn.smoothquant_linear(np.ones((1, 16), np.int8), w, ws, 0.5, static_weight=1)
    with pytest.raises(bn.InvalidProblem, match="SmoothQuantLinearPlan: static_weight expected a bool, got 'no'"):
        bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(1, 4, 16, "f32", False, "no"))


# quantized_linear with a static per-tensor activation scale (SmoothQuant's static W8A8 in one call): the
# bits of quantize_per_tensor followed by smoothquant_linear. Fused at decode where the prologue is fixed
# (one token, two where the blocks fit one wave, or up to 4 with a static weight); elsewhere the static

# the rows of exact ties; +-inf, NaN and zero rows.
@pytest.mark.parametrize(("m", "n", "k", "dtype", "static", "act_scale", "fused"), simulator_keeps([
    (1, 24, 1040, "f32", False, 0.0237, True), (2, 40, 528, "f16", True, 0.0237, True),
    (4, 24, 1040, "f32", True, 1.0, True), (2, 24, 1040, "f32", False, 0.0237, True),
    (3, 24, 1040, "f32", False, 0.0237, False),
    (8, 24, 528, "f16", True, 0.0237, False), (4, 16, 4096, "f32", True, 0.0237, False),
    (70, 24, 64, "f32", False, 0.0237, False), (3, 16, 50, "f32", False, 1.0, False),
    (5, 24, 1040, "f32", False, 1.0, False), (16, 40, 528, "f16", False, 0.0237, False)], 0, 1, 2, 4, 7))
def test_static_activation_scale_matches_quantize_then_smoothquant(m, n, k, dtype, static, act_scale, fused):
    rng = np.random.default_rng(m * n + k)
    x = (rng.standard_normal((m, k)) * 2).astype({"f16": np.float16, "f32": np.float32}[dtype])
    special_rows(x)
    w, ws = weights(rng, n, k)
    bias = rng.standard_normal(n).astype(np.float32) if m % 2 else None
    expected = ref.linear.quantized_linear(x, w, ws, bias, act_scale)
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, dtype, dtype, bias is not None, static,
                                                                      True))
    args = bn.QuantizedLinearArgs(x, w, ws, np.zeros((m, n), x.dtype), bias, act_scale)
    assert (plan.kernel_variant(args) == "fused") == fused
    if fused:
        assert plan.spec.variant("fused").config.static_scale
    static_quantize, launched = plan._static_quantize, []
    plan._static_quantize = lambda *a: launched.append(static_quantize(*a)) or launched[-1]
    plan.run(args)
    # unfused, x as whole 16-byte pieces: the static quantizer (else the per-tensor plan and a fill of the scales)
    assert launched == ([] if fused else [m * k * x.itemsize % 16 == 0])
    np.testing.assert_array_equal(args.output, expected)
    y = bn.quantized_linear(x, w, ws, bias=bias, static_weight=static, act_scale=act_scale)
    np.testing.assert_array_equal(y, expected)
    act = bn.quantize_per_tensor(x, act_scale, q_min=-127, q_max=127)
    np.testing.assert_array_equal(y, bn.smoothquant_linear(act, w, ws, act_scale, bias=bias, dtype=x.dtype))


def test_static_activation_scale_errors():
    rng = np.random.default_rng(1)
    x, (w, ws) = rng.standard_normal((1, 32)).astype(np.float32), weights(rng, 8, 32)
    with pytest.raises(bn.Unsupported, match="QuantizedLinearPlan: input_element expected f16, bf16 or f32 with a "
                                             "static activation scale"):
        bn.quantized_linear(x.astype(np.float64), w, ws, act_scale=0.5)
    for bad in (0.0, float("inf"), float("nan"), -1.0):
        with pytest.raises(bn.InvalidProblem, match="QuantizedLinearPlan: act_scale expected a finite value > 0"):
            bn.quantized_linear(x, w, ws, act_scale=bad)
    static = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(1, 8, 32, "f32", "f32", False, False, True))
    with pytest.raises(bn.InvalidProblem, match="QuantizedLinearPlan: act_scale expected a real number or a "
                                                "one-element array, got NoneType"):
        static.run(bn.QuantizedLinearArgs(x, w, ws, np.zeros((1, 8), np.float32)))
    dynamic = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(1, 8, 32, "f32", "f32"))
    with pytest.raises(bn.InvalidProblem, match=r"QuantizedLinearPlan: act_scale expected None \(static_activation="
                                                r"False\), got 0.5"):
        dynamic.run(bn.QuantizedLinearArgs(x, w, ws, np.zeros((1, 8), np.float32), None, 0.5))
    with pytest.raises(bn.InvalidProblem, match="QuantizedLinearPlan: static_activation expected a bool, got 1"):
        bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(1, 8, 32, "f32", "f32", False, False, 1))

# SmoothQuant's decode GEMM is a programmatic dependent; it loads its weight and column parameters before
# its wait only under the static-weight promise (the kernel before it may be anyone's), else it waits
# first thing. The bits do not move.
@pytest.mark.parametrize(("m", "n", "k", "dtype", "bias"), [
    (1, 24, 1040, "float32", True), (3, 40, 528, "bfloat16", False), (16, 9, 144, "float64", True)])
def test_static_smoothquant_decode_is_a_dependent_launch(m, n, k, dtype, bias):
    rng = np.random.default_rng(m * n + k)
    act = rng.integers(-127, 128, (m, k)).astype(np.int8)
    w, ws = weights(rng, n, k)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    expected = ref.linear.smoothquant_linear(act, w, ws, 0.0173, b, bn.element_kind(dtype).numpy_dtype)
    for static in (False, True):
        plan = bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(m, n, k, dtype, bias, static))
        args = bn.SmoothQuantLinearArgs(act, w, ws, 0.0173, np.zeros((m, n), expected.dtype), b)
        assert plan.kernel_variant(args) == "skinny_vector"
        config = plan.spec.variant("skinny_vector").config
        assert plan.spec.variant("skinny_vector").dependent and config.preload == 1
        assert config.wait_first == (not static)
        plan.run(args)
        np.testing.assert_array_equal(args.output, expected)
        y = bn.smoothquant_linear(act, w, ws, 0.0173, bias=b, dtype=dtype, static_weight=static)
        np.testing.assert_array_equal(y, expected)


def test_fused_decode_falls_back_for_unaligned_x_and_ragged_k():
    rng = np.random.default_rng(5)
    w, ws = weights(rng, 9, 64)
    buffer = rng.standard_normal(2 * 64 + 1).astype(np.float32)
    x = buffer[1:].reshape(2, 64)  # 4 bytes past a 16-byte boundary
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(2, 9, 64, "f32", "f32"))
    args = bn.QuantizedLinearArgs(x, w, ws, np.zeros((2, 9), np.float32))
    if SIMULATOR:  # on a GPU a host array is first copied into an (aligned) device buffer
        assert plan.kernel_variant(args) == "skinny_vector"  # x quantized into the aligned workspace first
    plan.run(args)
    np.testing.assert_array_equal(args.output, ref.linear.quantized_linear(x, w, ws))
    ragged = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(2, 9, 56, "f32", "f32"))
    xr = np.ascontiguousarray(x[:, :56])
    args = bn.QuantizedLinearArgs(xr, w[:, :56].copy(), ws, np.zeros((2, 9), np.float32))
    assert ragged.kernel_variant(args) == "skinny"


# -- the host fast path: pointers patched into a pre-packed parameter block -----------------------

@requires_gpu
def test_gpu_op_fast_path_repeats_and_falls_back():
    """Repeat ``quantized_linear`` / ``smoothquant_linear`` calls (the remembered plan, fast path)
    equal the first; a misaligned or non-contiguous ``x`` and a float64 weight scale still work."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(16, 4096, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randint(-128, 128, (512, 4096), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(512, device="cuda", generator=g) * 0.01 + 0.001
    bias = torch.randn(512, device="cuda", generator=g)
    first = bn.quantized_linear(x, w, ws, bias=bias)
    assert torch.equal(bn.quantized_linear(x, w, ws, bias=bias), first)
    out = torch.empty_like(first)
    bn.quantized_linear(x, w, ws, bias=bias, out=out)
    assert torch.equal(out, first)
    flat = torch.empty(16 * 4096 + 1, device="cuda", dtype=torch.bfloat16)
    shifted = flat[1:].view(16, 4096)
    shifted.copy_(x)
    assert torch.equal(bn.quantized_linear(shifted, w, ws, bias=bias), first)
    assert torch.equal(bn.quantized_linear(shifted, w, ws.double(), bias=bias), first)
    wide = torch.empty(16, 8192, device="cuda", dtype=torch.bfloat16)
    wide[:, ::2] = x
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(16, 512, 4096, "bf16", "bf16", True))
    strided = bn.QuantizedLinearArgs(wide[:, ::2], w, ws, out, bias)
    assert plan._fast_pointers(strided) is None
    with pytest.raises(bn.InvalidProblem, match="C-contiguous"):
        plan.run(strided)
    act = torch.randint(-127, 128, (16, 4096), device="cuda", generator=g, dtype=torch.int8)
    y = bn.smoothquant_linear(act, w, ws, 0.02, bias=bias, dtype="bfloat16")
    assert torch.equal(bn.smoothquant_linear(act, w, ws, 0.02, bias=bias, dtype="bfloat16"), y)
    act_scale = torch.tensor(0.02, dtype=torch.float32, device="cuda")
    acc = (act.double() @ w.double().t()).to(torch.int32)
    expected = ((acc.float() * act_scale) * ws[None, :] + bias).to(torch.bfloat16)
    assert torch.equal(y, expected)
    with pytest.raises(bn.InvalidProblem, match="act_scale"):
        bn.smoothquant_linear(act, w, ws, 0.0, bias=bias, dtype="bfloat16")



# -- bad scales, the preference, the SKU --------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-0.5, 0.0, float("nan"), float("inf"), -float("inf")])
def test_bad_weight_scale_names_the_argument_and_the_first_bad_index(bad):
    """A host ``weight_scale`` that is not finite and > 0 is an error naming it and its first bad element, in the op
    functions and in the plans (``can_implement`` says so); device arrays are checked where the weight is prepared."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 32)).astype(np.float32)
    w, ws = weights(rng, 8, 32)
    ws[3] = ws[6] = bad
    shown = "nan" if bad != bad else repr(np.float32(bad).item())
    with pytest.raises(bn.InvalidProblem, match=rf"quantized_linear: weight_scale expected finite values > 0, got "
                                                rf"{shown} at index 3"):
        bn.quantized_linear(x, w, ws)
    with pytest.raises(bn.InvalidProblem, match=r"smoothquant_linear: weight_scale expected .* at index 3"):
        bn.smoothquant_linear(np.ones((2, 32), np.int8), w, ws, 0.5)
    plan = ql(2, 8, 32)
    verdict = plan.can_implement(bn.QuantizedLinearArgs(x, w, ws, np.zeros((2, 8), np.float32)))
    assert not verdict and verdict.error is bn.InvalidProblem and "QuantizedLinearPlan: weight_scale" in verdict.reason
    with pytest.raises(bn.InvalidProblem, match="SmoothQuantLinearPlan: weight_scale expected finite values > 0"):
        run_sq(sq(2, 8, 32), np.ones((2, 32), np.int8), w, ws, 0.5)
    for act_scale in (bad, -1.0):
        with pytest.raises(bn.InvalidProblem, match=r"smoothquant_linear|SmoothQuantLinearPlan: act_scale"):
            bn.smoothquant_linear(np.ones((2, 32), np.int8), w, np.ones(8, np.float32), act_scale)


def test_prefer_backend_takes_bespoke_or_raises():
    """Every W8A8 kernel is bespoke: ``prefer_backend=BESPOKE`` (or None) selects as before, another backend is
    Unsupported naming the preference."""
    assert ql(4, 8, 32, pref=PlanPreference(prefer_backend=BackendKind.BESPOKE)).sku().backend is BackendKind.BESPOKE
    for plan_of in (ql, sq):
        with pytest.raises(bn.Unsupported, match=r"pref.prefer_backend expected None or BESPOKE .* got CUTLASS"):
            plan_of(4, 8, 32, pref=PlanPreference(prefer_backend=BackendKind.CUTLASS))


def test_max_workspace_bytes_leaves_the_fused_kernel_or_raises():
    """Under a workspace limit below the quantized activations' bytes, quantized_linear keeps only the fused decode
    kernel (no workspace: 16-byte aligned x and weight, else MisalignedOperand) and raises Unsupported where that
    kernel does not run; SmoothQuant needs none; a limit that holds the workspace changes nothing."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    w, ws = weights(rng, 24, 64)
    free = ql(1, 24, 64, pref=PlanPreference(max_workspace_bytes=0))
    assert free.workspace_size() == 0 and free.spec.fused and free.spec.other is None
    np.testing.assert_array_equal(run_ql(free, x, w, ws), ref.linear.quantized_linear(x, w, ws))
    shifted = np.zeros(x.size + 1, np.float32)[1:].reshape(x.shape)  # 4 bytes past a 16-byte boundary
    shifted[...] = x
    if SIMULATOR:  # on a GPU a host array is staged in an aligned device buffer
        with pytest.raises(bn.MisalignedOperand, match="QuantizedLinearPlan: input expected a 16-byte aligned"):
            run_ql(free, shifted, w, ws)
    full = ql(1, 24, 64)
    assert ql(1, 24, 64, pref=PlanPreference(max_workspace_bytes=full.workspace_size())).spec == full.spec
    with pytest.raises(bn.Unsupported, match=r"QuantizedLinearPlan: pref.max_workspace_bytes expected >= \d+ "
                                             r".*got 100"):
        ql(8, 24, 64, pref=PlanPreference(max_workspace_bytes=100))
    assert sq(8, 24, 64, pref=PlanPreference(max_workspace_bytes=0)).workspace_size() == 0


def test_no_sm90a_takes_the_portable_kernels_with_the_same_bits():
    """``allow_sm90a=False`` on an sm_90a device: prefill and batches take the mma.sync kernels (the warpgroup
    kernel is never among the variants), whose SKU says sm80, with the reference's bits."""
    hopper = device(sm90a=True)
    rng = np.random.default_rng(9)
    for m in (70, 40):  # prefill, and a batch past warpgroup_min_m
        x = rng.standard_normal((m, 64)).astype(np.float32)
        w, ws = weights(rng, 24, 64)
        plan = ql(m, 24, 64, pref=PlanPreference(allow_sm90a=False), device=hopper)
        assert "wgmma" not in plan.spec.names and plan.sku().arch is not ArchSku.SM90A
        np.testing.assert_array_equal(run_ql(plan, x, w, ws), ref.linear.quantized_linear(x, w, ws))


def test_sku_names_the_variant_that_runs():
    """``plan.sku()`` is the registry's SKU of the variant that runs on aligned operands: its name is the SKU's last
    part, its architecture the registry's (sm_90a for the warpgroup kernel, sm_90 for the decode kernels that
    launch as programmatic dependents, sm_80 for the others)."""
    arch = {"tiled": ArchSku.SM80, "pipelined": ArchSku.SM80, "wgmma": ArchSku.SM90A, "skinny": ArchSku.SM80,
            "skinny_vector": ArchSku.SM90, "fused": ArchSku.SM90}
    for plan in (ql(1, 24, 64), ql(8, 24, 64), ql(70, 24, 64), ql(70, 24, 60), sq(8, 24, 64), sq(70, 24, 64)):
        sku = plan.sku()
        assert sku.variant == plan.spec.aligned and str(sku).endswith("/" + plan.spec.aligned)
        assert sku.arch is arch[plan.spec.aligned] and sku.op is K.QUANTIZED_LINEAR
        assert sku == plan.entry.variant(plan.spec.aligned).sku
    entry = registry.lookup(K.QUANTIZED_LINEAR, bn.ElementKind.BF16, bn.ElementKind.BF16)
    assert entry.variant_sku("wgmma").arch is ArchSku.SM90A
    with pytest.raises(bn.Unsupported, match="variant expected one of"):
        entry.variant("cooperative")


def test_tuning_is_part_of_the_plan():
    """A plan keeps the tuning value and device it was chosen with; two values select two plans in the op
    functions' cache (the key holds the tuning), each with its own choice."""
    from baracuda_numba.ops.common import select_plan
    from baracuda_numba.plans.base import DEFAULT_PREFERENCE

    desc = bn.QuantizedLinearDescriptor(1, 24, 64, bn.ElementKind.F32, bn.ElementKind.F32)  # as the ops pass it
    two = unfused()
    shipped = select_plan(bn.QuantizedLinearPlan, desc, DEFAULT_PREFERENCE, H100_TUNING, device())
    other = select_plan(bn.QuantizedLinearPlan, desc, DEFAULT_PREFERENCE, two, device())
    assert shipped is select_plan(bn.QuantizedLinearPlan, desc, DEFAULT_PREFERENCE, H100_TUNING, device())
    assert shipped.tuning is H100_TUNING and other.tuning is two and other is not shipped
    assert shipped.spec.fused and not other.spec.fused
