"""Each W8A8 kernel variant run against the NumPy reference, bit for bit, chosen through tuning values and device
properties passed to ``select`` (the simulator runs every mma in Python: small shapes with the geometry of the
large ones). Which variant a shape takes on an H100 is tested in ``test_linear_choice.py``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import FLOAT_DTYPES, SIMULATOR, simulator_keeps
from hypothesis import given, settings
from hypothesis import strategies as st
from linear_helpers import device, forced, kernel_name, ql, run_ql, run_sq, special_rows, sq, unfused, weights

import baracuda_numba as bn
from baracuda_numba import reference as ref
from baracuda_numba.kernels import device as device_functions
from baracuda_numba.kernels.linear import hopper_available
from baracuda_numba.plans.linear import H100_TUNING, current_tuning, device_properties


def _f32_problem(m: int, n: int, k: int, seed: int):
    """Random ``x``, weight, scales and bias of an f32 problem."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w, ws = weights(rng, n, k)
    return x, w, ws, rng.standard_normal(n).astype(np.float32)


# Each GEMM variant the plans may pick: the cp.async pipeline through more K chunks than it has stages (its ring
# of stages wraps; zero-filled chunks past K), the skinny kernel with several column tiles per block (ragged N)
# and several chunks in flight, and its double-buffered aligned form through an odd number of main-loop
# iterations (the last pair's second half empty); which kernel ran is checked.
@pytest.mark.parametrize(("m", "n", "k", "chunks", "tiles", "variant"), simulator_keeps([
    (70, 9, 272, 2, 1, "pipelined"),
    (70, 9, 272, 2, 1, "wgmma"),  # sm_90 devices only
    (70, 9, 200, 2, 1, "tiled"),
    (17, 20, 208, 2, 2, "skinny_vector"),
    (1, 24, 2064, 2, 2, "skinny_vector"),  # 33 chunks: 3 iterations of 16
    (5, 13, 1040, 1, 4, "skinny_vector"),  # 17 chunks: 3 iterations of 8, 4 column tiles for 13 columns
    (3, 37, 200, 4, 4, "skinny"),
], 0, 1, 2, 3, 6))
def test_gemm_variants_match_reference(m, n, k, chunks, tiles, variant):
    if variant == "wgmma" and not hopper_available():
        pytest.skip("wgmma needs a compute capability 9.0 GPU")
    # the GEMM kernels themselves (x quantized first); the mma.sync kernels on a GPU too, unless wgmma is asked
    tuning = unfused(replace(current_tuning(), warpgroup=variant == "wgmma", skinny_chunks=chunks,
                             vector_chunks=chunks, skinny_tiles=tiles))
    x, w, ws, bias = _f32_problem(m, n, k, m * n + k)
    plan = ql(m, n, k, bias=True, tuning=tuning)
    args = bn.QuantizedLinearArgs(x, w, ws, np.zeros((m, n), np.float32), bias)
    assert plan.kernel_variant(args) == variant
    plan.run(args)
    np.testing.assert_array_equal(args.output, ref.linear.quantized_linear(x, w, ws, bias))


@pytest.mark.parametrize(("static", "tiles"), simulator_keeps([(False, 4), (True, 4), (False, 2)], 0, 1))
def test_decode_gemm_with_one_chunk_matches_reference(static, tiles):
    """The 1-chunk kernels at a small shape on one SM: quantized_linear's dependent GEMM and SmoothQuant's (waiting
    first, or loading its weight first with a static one), with 4 tiles (more blocks than SMs) and with 2 (one wave
    at three per SM, not at two); 3 column blocks, the last one partial, K past the warps' 8 x 64 bytes."""
    tuning, one = forced("two_launch", skinny_tiles=tiles), device(1)
    rng = np.random.default_rng(5)
    m, n, k = 3, 72 if tiles == 4 else 40, 1040
    x = rng.standard_normal((m, k)).astype(np.float32)
    act = rng.integers(-127, 128, (m, k)).astype(np.int8)
    w, ws = weights(rng, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    plan = ql(m, n, k, bias=True, static_weight=static, tuning=tuning, device=one)
    assert kernel_name(plan, "skinny_vector").startswith(f"w8a8_gemm_skinny1x{tiles}_db_v_dep1")
    np.testing.assert_array_equal(run_ql(plan, x, w, ws, bias), ref.linear.quantized_linear(x, w, ws, bias))
    plan = sq(m, n, k, bias=True, static_weight=static, tuning=tuning, device=one)
    assert kernel_name(plan, "skinny_vector").startswith(f"w8a8_gemm_skinny1x{tiles}_db_v_dep1"
                                                         + ("_l2p" if static else "_w_"))
    np.testing.assert_array_equal(run_sq(plan, act, w, ws, 0.021, bias),
                                  ref.linear.smoothquant_linear(act, w, ws, 0.021, bias, np.float32))


@pytest.mark.parametrize("m", simulator_keeps([1, 2, 15], 1))
def test_few_token_wide_decode_gemm_matches_reference(m):
    """Below 16 tokens past three 2-tile blocks per SM, quantized_linear's GEMM takes blocks of up to
    ``wide_tiles_max_few_tokens`` tiles that fit one wave at two per SM, asking L2 for an iteration before its wait,
    and one token there fuses for host time only (under capture the two launches); SmoothQuant's waiting GEMM takes
    the same blocks, asking L2 for two iterations before its wait: 72 rows on one SM (5 blocks of 2 tiles) in 2
    blocks of 5. Bit for bit against the reference (the last block partial, rows past M zero), and with 2 tiles
    (``few_tokens_wide_min_m`` = 16)."""
    one, n, k = device(1), 72, 1040
    shipped = ql(m, n, k, bias=True, device=one).spec
    assert (shipped.fused, shipped.capture_unfused) == ((m == 1), (m == 1))
    two = forced("two_launch")
    rng = np.random.default_rng(m + n)
    x = special_rows(rng.standard_normal((m, k)).astype(np.float32) * 3)
    w, ws = weights(rng, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    act = rng.integers(-127, 128, (m, k)).astype(np.int8)
    expected, expected_sq = (ref.linear.quantized_linear(x, w, ws, bias),
                             ref.linear.smoothquant_linear(act, w, ws, 0.021, bias, np.float32))
    for tuning, tiles in ((two, 5), (replace(two, few_tokens_wide_min_m=16, smoothquant_few_tokens_wide_min_m=16), 2)):
        plan = ql(m, n, k, bias=True, tuning=tuning, device=one)
        name = kernel_name(plan, "skinny_vector")
        assert name == "w8a8_gemm_skinny1x5_db_v_dep1_l2p1_b2_f32_bias_token" if tiles == 5 else "_skinny2x2_" in name
        assert plan.spec.variant("skinny_vector").blocks(m, n) == (2 if tiles == 5 else 5)
        np.testing.assert_array_equal(run_ql(plan, x, w, ws, bias), expected)
        plan = sq(m, n, k, bias=True, tuning=tuning, device=one)
        chunks = 1 if tiles == 5 else 2
        assert kernel_name(plan, "skinny_vector").startswith(f"w8a8_gemm_skinny{chunks}x{tiles}_db_v_dep1_w_")
        np.testing.assert_array_equal(run_sq(plan, act, w, ws, 0.021, bias), expected_sq)


@pytest.mark.parametrize(("m", "n", "name"), simulator_keeps([(3, 40, "skinny2x3_db_v_dep1_l2p1_b2_"),
                                              (16, 72, "skinny1x5_db_v_dep1_l2p1_b2_hna_l2_256_")], 0))
def test_wide_decode_gemm_matches_reference(m, n, name):
    """Wider column tiles where blocks of 2 make more than one wave at two per SM, on one SM: 3 blocks of 2 tiles
    (one wave at three per SM) become 2 of 3 tiles, 2 chunks, for 3 tokens; 5 blocks become 2 of 5 tiles, 1 chunk,
    for 16 tokens (quantized_linear's GEMM asking L2 for an iteration before its wait, the weight's loads skipping
    L1). quantized_linear's and SmoothQuant's GEMM (waiting first, and under the static promise in the same blocks)
    against the reference, bit for bit; the last block partial, K past the warps' 8 x 64 bytes."""
    tuning, one, k = forced("two_launch"), device(1), 1040
    rng = np.random.default_rng(m + n)
    x = special_rows(rng.standard_normal((m, k)).astype(np.float32) * 3)
    act = rng.integers(-127, 128, (m, k)).astype(np.int8)
    w, ws = weights(rng, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    plan = ql(m, n, k, bias=True, tuning=tuning, device=one)
    assert kernel_name(plan, "skinny_vector") == f"w8a8_gemm_{name}f32_bias_token"
    assert plan.spec.variant("skinny_vector").blocks(m, n) == 2  # one wave at two per SM
    np.testing.assert_array_equal(run_ql(plan, x, w, ws, bias), ref.linear.quantized_linear(x, w, ws, bias))
    expected = ref.linear.smoothquant_linear(act, w, ws, 0.021, bias, np.float32)
    tiles = name.split("_")[0]
    for static in (False, True):
        plan = sq(m, n, k, bias=True, static_weight=static, tuning=tuning, device=one)
        config = plan.spec.variant("skinny_vector").config
        assert config.name.startswith(f"w8a8_gemm_{tiles}_db_v_dep1_") and config.wait_first == (not static)
        assert config.early_l2 == (0 if static else tuning.wait_first_early_l2)
        np.testing.assert_array_equal(run_sq(plan, act, w, ws, 0.021, bias), expected)


def test_weight_load_hints_keep_the_bits():
    """Every cache operator of the weight's loads gives the same outputs (the simulator loads plainly; on the GPU
    the linear tests run the shipped rule's hints), and an unknown one is refused."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 528)).astype(np.float32)
    w, ws = weights(rng, 40, 528)
    expected = ref.linear.quantized_linear(x, w, ws, None)
    # the simulator loads plainly whatever the hint: two of them there (the plan still records each), all on a GPU
    hints = ["", "na_l2_256"] if SIMULATOR else list(device_functions.LOAD_HINTS)
    for hint in hints:
        for variant in ("fused", "two_launch"):
            plan = ql(2, 40, 528, tuning=forced(variant, weight_load_hint=hint))
            assert plan.spec.variant(plan.spec.aligned).config.weight_hint == hint
            np.testing.assert_array_equal(run_ql(plan, x, w, ws), expected)
    with pytest.raises(ValueError, match="hinted_load_u64x2: a hint of"):
        device_functions.hinted_load_u64x2("L2")
    with pytest.raises(ValueError, match="weight_hint: one of"):
        ql(2, 40, 528, tuning=forced("fused", weight_load_hint="L2"))


@pytest.mark.parametrize(("m", "n", "k", "sms", "two_launches"), simulator_keeps([
    (1, 64, 64, 1, True), (1, 24, 64, 132, False), (1, 88, 64, 1, True), (1, 120, 64, 1, False)], 0, 1))
def test_captured_calls_launch_two_kernels_where_fusing_only_saves_host_time(monkeypatch, m, n, k, sms, two_launches):
    """A fused plan whose fusing only saves host time runs the quantizer and the GEMM while its stream is being
    captured into a CUDA graph, the fused kernel otherwise; bit for bit against the reference either way."""
    from baracuda_numba.plans.linear import quantized

    x, w, ws, _ = _f32_problem(m, n, k, m + n + k)
    plan = ql(m, n, k, tuning=replace(H100_TUNING, fused_min_k=128, fused_min_n=32), device=device(sms))
    assert plan.spec.fused and plan.spec.capture_unfused == two_launches
    quantized_calls = []
    run = plan._quantizer.run
    monkeypatch.setattr(plan._quantizer, "run", lambda *a, **kw: (quantized_calls.append(1), run(*a, **kw)))
    expected = ref.linear.quantized_linear(x, w, ws)
    for capturing in (False, True):
        monkeypatch.setattr(quantized, "capturing", lambda stream, capturing=capturing: capturing)
        quantized_calls.clear()
        np.testing.assert_array_equal(run_ql(plan, x, w, ws), expected)
        assert bool(quantized_calls) == (capturing and two_launches), capturing


# A static weight (the caller's promise that the kernel before the call does not write it): the fused kernel is a
# programmatic dependent at every K; where its blocks fit one wave at two per SM it loads its first weight before its
# wait, keeps two chunks in flight under launch bounds of two blocks, and fuses up to static_fused_max_m tokens;
# elsewhere it asks L2 for weight before its wait (40 columns on one SM: 3 blocks, not one wave). Without the promise
# it only asks L2 for weight before its wait, and only where it is a dependent (K >= fused_dependent_min_k, raised
# here); it takes the one-wave shape where one_wave_shape says so, and then fuses up to one_wave_fused_max_m tokens.
@pytest.mark.parametrize(("m", "n", "k", "dtype", "static", "one_wave", "sms"), simulator_keeps([
    (1, 24, 1040, "f32", True, True, 132), (2, 40, 528, "f16", True, False, 132), (1, 9, 144, "f64", True, True, 132),
    (1, 40, 1040, "f32", True, True, 1), (2, 24, 1040, "f32", False, True, 132), (2, 40, 528, "f16", False, False, 132),
    (1, 24, 144, "f32", False, False, 132),
], 0, 1))
def test_static_weight_loads_the_weight_before_the_wait(m, n, k, dtype, static, one_wave, sms):
    # only the any-shape rule fuses (1 token, or 2 with a static weight)
    tuning = replace(H100_TUNING, fused_dependent_min_k=512, one_wave_shape=one_wave, fused_min_k=1 << 20)
    rng = np.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k)).astype({"f16": np.float16, "f32": np.float32, "f64": np.float64}[dtype])
    w, ws = weights(rng, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    plan = ql(m, n, k, dtype, True, static, tuning=tuning, device=device(sms))
    args = bn.QuantizedLinearArgs(x, w, ws, np.zeros((m, n), x.dtype), bias)
    fuses = static or m <= (tuning.one_wave_fused_max_m if one_wave else tuning.fused_any_shape_max_m)
    assert plan.kernel_variant(args) == ("fused" if fuses else "skinny_vector")
    fits = -(-n // 16) <= 2 * sms  # the blocks fit one wave at two per SM
    wave = fits and (static or one_wave)
    if fuses:
        launch = plan.spec.variant("fused")
        config = launch.config
        dependent = static or k >= tuning.fused_dependent_min_k
        registers = static and fits
        assert launch.dependent == dependent and config.early_registers == registers
        assert config.early_l2 == (tuning.fused_early_l2 if dependent and not registers else 0)
        assert (config.chunks, config.min_blocks == 2) == ((2, True) if wave else (1, False)), config.name
        prefetch = (tuning.static_one_wave_prefetch_l2 if static else tuning.one_wave_prefetch_l2) if wave else 0
        assert config.prefetch_l2 == prefetch
        assert not plan.spec.capture_unfused or not static
    plan.run(args)
    np.testing.assert_array_equal(args.output, ref.linear.quantized_linear(x, w, ws, bias))


# -- the fused decode kernel (m <= 16: x quantized per token inside the skinny GEMM) ------------------------------


def _check_fused_decode(m, n, k, dtype, with_bias, seed, last_max=False, static=False, tuning=None, x_loads=None,
                        fixed=None):
    """The fused plan (``tuning``: one that fuses any m <= 16) against the two-launch plan and the reference, bit
    for bit; ``last_max``: row 0's largest finite ``|x|`` in its last element (the last slot's piece); ``static``:
    the descriptor's ``static_weight``; ``x_loads`` / ``fixed``: the fused kernel's, when given."""
    rng = np.random.default_rng(seed)
    element = bn.element_kind(dtype)
    x = special_rows((rng.standard_normal((m, k)) * rng.uniform(0.01, 50)).astype(element.numpy_dtype))
    if last_max:
        x[0, -1] = -2 * np.abs(x[0, 2:-1]).max()
    w, ws = weights(rng, n, k)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    plan = ql(m, n, k, element, with_bias, static, tuning=tuning or forced("fused"))
    args = bn.QuantizedLinearArgs(x, w, ws, np.zeros((m, n), x.dtype), bias)
    assert plan.kernel_variant(args) == "fused"
    config = plan.spec.variant("fused").config
    assert x_loads is None or config.x_loads == x_loads, config.name
    assert fixed is None or config.fixed == fixed, config.name
    plan.run(args)
    two_launch = ql(m, n, k, element, with_bias, tuning=unfused())
    two_launch_out = run_ql(two_launch, x, w, ws, bias)
    assert two_launch.kernel_variant(bn.QuantizedLinearArgs(x, w, ws, two_launch_out, bias)) == "skinny_vector"
    np.testing.assert_array_equal(args.output.view(f"u{x.itemsize}"), two_launch_out.view(f"u{x.itemsize}"))
    expected = ref.linear.quantized_linear(x, w, ws, bias)
    np.testing.assert_array_equal(args.output.astype(np.float64), expected.astype(np.float64))


@settings(max_examples=3 if SIMULATOR else 12)  # most examples compile a kernel of their own
@given(st.integers(1, 16), st.integers(1, 40), st.sampled_from([16, 64, 144, 208]),
       st.sampled_from(sorted(FLOAT_DTYPES)), st.booleans(), st.integers(0, 2**32 - 1))
def test_fused_decode_equals_two_launches_and_reference(m, n, k, dtype, with_bias, seed):
    """The one-launch kernel gives the bits of the quantizer + unfused GEMM, and the reference's."""
    _check_fused_decode(m, n, k, dtype, with_bias, seed)


@pytest.mark.parametrize(("m", "n", "k", "dtype"), simulator_keeps([
    (1, 9, 4096, "bfloat16"),  # 2 pieces of x per thread: one batch, kept in registers for the quantize
    (2, 8, 4096, "float16"),  # two rows in one batch
    (1, 8, 2064, "float32"),  # 3 pieces, the last past K for most threads
    (3, 8, 1040, "float64"),  # 3 pieces per row, 9 per thread: batches end inside rows, x read again
], 0, 1))
def test_fused_decode_rows_of_several_pieces_per_thread(m, n, k, dtype):
    """K past one 16-byte piece per thread: the general prologue's row / slot stepping, its per-row warp reductions
    at a row's last slot, and the resident and re-read quantize passes."""
    _check_fused_decode(m, n, k, dtype, m % 2 == 1, m * k, last_max=True,
                        tuning=forced("fused", fixed_prologue=False))


@pytest.mark.parametrize(("m", "n", "k", "dtype", "loads"), simulator_keeps([
    (4, 9, 4096, "float16", 8),  # 2 pieces per row: a thread's 8 in one batch, kept in registers for the quantize
    (3, 8, 1040, "float64", 8),  # 3 pieces per row, 9 per thread: batches of 8 end inside a row, x read again
    (16, 24, 208, "float32", 8),  # 1 piece per row, 16 rows: two batches of 8
    (2, 8, 4096, "float16", 4),  # 4 pieces: the narrow batch
], 0, 1))
def test_static_fused_prologue_takes_more_pieces_of_x_at_once(m, n, k, dtype, loads):
    """The static one-wave fused kernel (launch bounds of 2: registers to spare) has up to ``wide_x_loads_max``
    pieces of x per thread in flight: the same bits."""
    _check_fused_decode(m, n, k, dtype, m % 2 == 1, m * k, last_max=True, static=True, x_loads=loads,
                        tuning=forced("fused", fixed_prologue=False))


# The fused prologue compiled for the plan's M and K where all of a thread's pieces of x are in flight at once: one
# piece a row, a partial last slot (516 pieces of f32: 3 slots, the third for 4 threads), the wide static prologue
# (4 rows of 2), f64 at 8 pieces; 16 rows of the narrow prologue do not fit and keep the general one. Rows of zeros,
# +-inf, NaN and exact ties; the same bits as the two launches and the reference.
@pytest.mark.parametrize(("m", "n", "k", "dtype", "static", "fixed"), simulator_keeps([
    (1, 24, 1040, "float16", False, (1, 1)), (1, 40, 2064, "float32", False, (1, 3)),
    (4, 9, 4096, "float16", True, (4, 2)), (2, 16, 2048, "float32", True, (2, 2)),
    (1, 16, 4096, "float64", True, (1, 8)), (16, 24, 208, "float32", False, None),
], 0, 1, 2))
def test_fused_prologue_compiled_for_the_plans_shape(m, n, k, dtype, static, fixed):
    # without the static promise, the narrow prologue (launch bounds of 3) of weights past one wave
    tuning = forced("fused", one_wave_shape=False)
    _check_fused_decode(m, n, k, dtype, m % 2 == 1, m * n + k, last_max=True, static=static, tuning=tuning,
                        fixed=fixed)
    if fixed is None:
        assert ql(m, n, k, dtype, tuning=tuning).spec.variant("fused").config.fixed is None


def test_device_properties_are_the_simulators_here():
    """(The simulator chooses for an H100's 132 SMs without sm_90a, so that these tests run the kernels an H100
    runs; on a GPU the device's own properties.)"""
    if SIMULATOR:
        assert device_properties().multiprocessors == 132 and not device_properties().sm90a
    else:
        assert device_properties().multiprocessors > 0
