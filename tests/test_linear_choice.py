"""The W8A8 choice on a CPU: which kernels :func:`~baracuda_numba.plans.linear.choose` picks for a descriptor, a
device and a tuning value (no kernel is built or run here), and which tuning value a card's properties select.
The rules are ``docs/design-linear.md``'s, "How a kernel is chosen"; the kernels they name are run against the
reference in ``test_linear_kernels.py``."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from linear_helpers import device, forced

import baracuda_numba as bn
from baracuda_numba.kernels.linear import FusedConfig, PipelineShape, SkinnyConfig, WgmmaShape
from baracuda_numba.plans.linear import (
    H100_SXM,
    H100_TUNING,
    H200_SXM,
    H200_TUNING,
    SIMULATED,
    DeviceProperties,
    choose,
    current_tuning,
    device_properties,
    tuning_for,
)
from baracuda_numba.plans.linear.chooser import (
    dependent_prefetch,
    fixed_prologue,
    fused_x_loads,
    pipeline_shape,
    skinny_tiles,
    streamed_rows,
    wgmma_shape,
)
from baracuda_numba.platform import SIMULATOR
from baracuda_numba.vocabulary import ElementKind, PlanPreference

E = ElementKind
H100 = device(132)
HOPPER = device(132, sm90a=True)


NO_PREFERENCE = PlanPreference()


def ql_spec(m, n, k, dtype=E.F32, static_weight=False, static_activation=False, tuning=H100_TUNING, dev=H100,
            pref=NO_PREFERENCE):
    return choose(bn.QuantizedLinearDescriptor(m, n, k, dtype, dtype, False, static_weight, static_activation), dev,
                  tuning, pref)


def sq_spec(m, n, k, static_weight=False, tuning=H100_TUNING, dev=H100):
    return choose(bn.SmoothQuantLinearDescriptor(m, n, k, E.BF16, False, static_weight), dev, tuning)


# -- the tuning value of a card ------------------------------------------------------------------------------


def test_each_cards_properties_select_its_tuning():
    """An H100 (3.35 TB/s) selects the H100 values, an H200 (4.9 TB/s, the same 132 SMs) the H200's; other
    cards, and the simulator, the H100's (the only card measured)."""
    assert H100_SXM.multiprocessors == H200_SXM.multiprocessors == 132
    assert 3.3e12 < H100_SXM.memory_bandwidth < 3.4e12 and 4.8e12 < H200_SXM.memory_bandwidth < 5.0e12
    assert tuning_for(H100_SXM) is H100_TUNING and tuning_for(H200_SXM) is H200_TUNING
    assert tuning_for(DeviceProperties((8, 0), 108, 2.0e12, False)) is H100_TUNING
    assert tuning_for(DeviceProperties((10, 0), 148, 8.0e12, False)) is H100_TUNING
    assert tuning_for(SIMULATED) is H100_TUNING
    here = device_properties()  # the simulator's stand-in, or the GPU's measured properties
    assert here == SIMULATED if SIMULATOR else here.compute_capability >= (7, 0) and here.multiprocessors > 0
    assert current_tuning() is tuning_for(here)
    assert H100_TUNING.card == "h100" and H200_TUNING.card == "h200" and H100_TUNING != H200_TUNING
    # the H200's values are the H100's until a measurement on an H200 moves one
    assert replace(H200_TUNING, card="h100") == H100_TUNING


# The values the H100 was tuned to (docs/design-linear.md, "Tuning values"): a field that moves must move with a
# measurement and this table together.
_H100 = dict(
    pipeline=PipelineShape(stages=4), pipeline_large=PipelineShape(2, 4, 4, 8, 3), warpgroup=True,
    wgmma_wide=WgmmaShape(), wgmma_narrow=WgmmaShape(tile_n=128, stages=5), narrow_tile_time=0.62,
    wgmma_small=(WgmmaShape(tile_n=64, stages=6), WgmmaShape(tile_n=64, stages=8, warpgroups=1),
                 WgmmaShape(tile_n=32, stages=10, warpgroups=1)),
    warpgroup_min_m=16, wgmma_dependent_max_m=128, smoothquant_wgmma_dependent_max_m=256, skinny_chunks=2,
    skinny_tiles=None, vector_chunks=2, multi_wave_wide_chunks=1, dependent_gemm=True, dependent_preload=1,
    dependent_chunks=None, dependent_min_blocks=None, dependent_max_registers=0, dependent_prefetch_l2=None,
    one_wave_deep_prefetch_min_m=4, wait_first_early_l2=2, three_per_sm_chunks=1, wide_tiles=True, wide_tiles_max=7,
    wide_tiles_min_m=16, wide_tiles_prefetch_l2=1, few_tokens_wide_min_m=1, smoothquant_few_tokens_wide_min_m=1,
    static_smoothquant_wide=True, wide_tiles_max_few_tokens=7, static_smoothquant_one_wave_prefetch=True,
    weight_load_hint=None, weight_no_l1_min_k=8192, weight_no_l1_min_m=16, weight_no_l1_min_bytes=32 << 20,
    weight_l2_prefetch_bytes=256, quantizer_dependent_min_weight=(16 << 20) + 1, one_launch_chunks=1,
    fused_min_blocks=3, absmax_loads=4, wide_x_loads_max=8, fixed_prologue=True, fused_prefetch_l2=0,
    fused_early_l2=2, fused_max_m=2, long_rows_fused_max_m=1, fused_dependent_min_k=0, fused_any_shape_max_m=1,
    fused_any_shape_max_weight=32 << 20, wide_fused_max_m=1, wide_one_wave_fused_max_m=2, wide_fused_max_n=14336,
    wide_fused_skip_waves=1.5, capture_unfused=True, static_one_wave_chunks=2, static_one_wave_min_blocks=2,
    static_early_registers_everywhere=False, one_wave_shape=True, one_wave_fused_max_m=2, one_wave_prefetch_l2=0,
    static_fused_max_m=4, static_one_wave_prefetch_l2=1, fused_min_k=8192, fused_min_n=8192, fused_max_n=11008,
    fused_max_shared=160 * 1024, static_quantizer=True, static_quantizer_threads=128,
    static_quantizer_blocks_per_sm=8, static_quantizer_dependent=True)


def test_the_h100_values_are_the_measured_ones():
    assert {f.name for f in fields(H100_TUNING)} == {"card", *_H100}
    for name, value in _H100.items():
        assert getattr(H100_TUNING, name) == value, name


def test_choose_is_pure():
    """The same inputs give an equal spec, whatever was chosen in between; frozen values all the way down."""
    first = ql_spec(16, 11008, 4096)
    ql_spec(16, 11008, 4096, tuning=forced("fused"))
    assert ql_spec(16, 11008, 4096) == first and hash(first) == hash(ql_spec(16, 11008, 4096))
    with pytest.raises(AttributeError):
        first.aligned = "tiled"


# -- prefill ------------------------------------------------------------------------------------------------


def test_pipeline_shape_fills_waves():
    t = H100_TUNING
    # 4096 x 4096: 512 large tiles on 132 multiprocessors, 4 waves 97 % full
    assert pipeline_shape(t, 4096, 4096, 132) == t.pipeline_large
    assert pipeline_shape(t, 2048, 11008, 132) == t.pipeline  # 688 large tiles: 6 waves, 87 %
    assert pipeline_shape(t, 300, 264, 132) == t.pipeline  # a few tiles: the small ones spread wider
    assert pipeline_shape(replace(t, pipeline_large=None), 4096, 4096, 132) == t.pipeline
    assert skinny_tiles(t, 4096) == 2 and skinny_tiles(t, 8192) == 4
    assert skinny_tiles(replace(t, skinny_tiles=3), 8) == 3


def test_wgmma_shape_reproduces_the_faster_measured_shape():
    """The warpgroup kernel's shape rule picks the faster shape of each H100 measurement."""
    t = H100_TUNING
    wide, narrow = t.wgmma_wide, t.wgmma_narrow
    wide_n, one_group_64, one_group_32 = t.wgmma_small
    expected = {wide: ((4096, 4096), (2048, 4096), (2048, 11008), (1024, 4096), (256, 11008)),
                narrow: ((384, 4096), (512, 4096), (512, 11008), (128, 11008)),
                wide_n: ((192, 4096), (256, 4096)), one_group_64: ((96, 4096), (128, 4096)),
                one_group_32: ((32, 4096), (64, 4096))}
    for shape, problems in expected.items():
        for m, n in problems:
            assert wgmma_shape(t, m, n, 132) == shape, (m, n)
    assert (wide_n.tile_m, wide_n.tile_n, one_group_64.tile_m, one_group_64.tile_n) == (128, 64, 64, 64)
    assert (one_group_32.tile_m, one_group_32.tile_n, one_group_32.threads) == (64, 32, 128)
    # rows streamed by the busiest multiprocessor: waves of blocks x (live activation rows + weight rows)
    assert streamed_rows(narrow, 128, 4096, 132) == 128 + 128  # 32 blocks, one wave
    assert streamed_rows(one_group_64, 128, 4096, 132) == 64 + 64  # 128 blocks
    assert streamed_rows(one_group_32, 128, 4096, 132) == 2 * (64 + 32)  # 256 blocks, two waves
    assert streamed_rows(one_group_32, 17, 4096, 132) == 17 + 32  # rows past M are not read
    assert wgmma_shape(replace(t, wgmma_narrow=None, wgmma_small=()), 384, 4096, 132) == wide
    from baracuda_numba.kernels.linear import EPILOGUE_PAD, SLOT_ALIGNMENT

    for shape in (wide, narrow, *t.wgmma_small):
        assert shape.shared_bytes <= 227 * 1024 and shape.threads == 128 * shape.warpgroups
        assert shape.shared_bytes - SLOT_ALIGNMENT >= 4 * shape.tile_m * (shape.tile_n + EPILOGUE_PAD)


def test_the_warpgroup_kernel_needs_sm90a_and_the_preference():
    """Prefill (and batches past ``warpgroup_min_m``) take the wgmma kernel only on an sm_90a device whose caller
    allows it; elsewhere the pipelined kernel (aligned) or the tiled one (K % 16 != 0), and the decode path for
    batches up to 64 tokens. The wgmma kernel is a dependent up to 128 tokens (quantized_linear's) / 256
    (SmoothQuant's, waiting first without the static promise)."""
    for m in (300, 48):
        assert ql_spec(m, 4096, 4096, dev=HOPPER).aligned == "wgmma"
        assert ql_spec(m, 4096, 4096).aligned == ("pipelined" if m > 64 else "skinny_vector")
        no = ql_spec(m, 4096, 4096, dev=HOPPER, pref=PlanPreference(allow_sm90a=False))
        assert no == ql_spec(m, 4096, 4096) and "wgmma" not in no.names
        assert ql_spec(m, 4096, 4096, dev=HOPPER, tuning=replace(H100_TUNING, warpgroup=False)) == no
    assert ql_spec(300, 4096, 4104, dev=HOPPER).aligned == "tiled"  # K % 16 != 0
    # misaligned operands past warpgroup_min_m tokens (prefill too) take the skinny kernel's byte path on sm_90a
    assert ql_spec(48, 4096, 4096, dev=HOPPER).other == ql_spec(300, 4096, 4096, dev=HOPPER).other == "skinny"
    assert ql_spec(300, 4096, 4096).other == "tiled"
    for m, dependent in ((128, True), (129, False)):
        assert ql_spec(m, 4096, 4096, dev=HOPPER).variant("wgmma").dependent == dependent
    for m, static, dependent, wait_first in ((256, False, True, True), (256, True, True, False),
                                             (257, False, False, False)):
        config = sq_spec(m, 4096, 4096, static, dev=HOPPER).variant("wgmma")
        assert config.dependent == dependent and config.config.wait_first == wait_first


# -- decode -------------------------------------------------------------------------------------------------


# The unfused decode GEMM's chunks, column tiles and launch bounds by shape (quantized_linear's, SmoothQuant's
# waiting first, SmoothQuant's under the static promise; None: the first with `_w_e2_` spliced in): with 4 column
# tiles (K >= 8192) one chunk where its blocks outnumber the SMs, two where they fit one wave; with 2 tiles the
# dependent kernel runs under launch bounds of 2 blocks, with one chunk where its blocks make one wave at three per
# SM but not at two. Where blocks of 2 tiles make more than one wave at two per SM, wider blocks that make one.
# Weight loads skip L1 with 256-byte L2 fills at K >= 8192, 16 tokens or 32 MiB of weight.
@pytest.mark.parametrize(("m", "n", "k", "name", "waiting", "static"), [
    (1, 8192, 8192, "skinny1x4_db_v_dep1_l2p1_hna_l2_256_", "skinny1x4_db_v_dep1_w_e2_hna_l2_256_", None),
    (16, 8192, 8192, "skinny1x4_db_v_dep1_l2p2_hna_l2_256_", "skinny1x4_db_v_dep1_w_e2_hna_l2_256_", None),
    (1, 4096, 11008, "skinny2x4_db_v_dep1_l2p1_hna_l2_256_", None, None),
    (1, 4096, 4096, "skinny2x2_db_v_dep1_l2p1_b2_", None, None),
    (1, 11008, 4096, "skinny1x6_db_v_dep1_l2p1_b2_hna_l2_256_", "skinny1x6_db_v_dep1_w_e2_b2_hna_l2_256_",
     "skinny1x6_db_v_dep1_b2_hna_l2_256_"),
    (8, 11008, 4096, "skinny1x6_db_v_dep1_l2p1_b2_hna_l2_256_", "skinny1x6_db_v_dep1_w_e2_b2_hna_l2_256_",
     "skinny1x6_db_v_dep1_b2_hna_l2_256_"),
    (8, 8192, 4096, "skinny1x4_db_v_dep1_l2p1_b2_hna_l2_256_", "skinny1x4_db_v_dep1_w_e2_b2_hna_l2_256_",
     "skinny1x4_db_v_dep1_b2_hna_l2_256_"),
    (16, 11008, 4096, "skinny1x6_db_v_dep1_l2p1_b2_hna_l2_256_", "skinny1x6_db_v_dep1_w_e2_b2_hna_l2_256_", None),
    (8, 14336, 4096, "skinny1x7_db_v_dep1_l2p1_b2_hna_l2_256_", "skinny1x7_db_v_dep1_w_e2_b2_hna_l2_256_",
     "skinny1x7_db_v_dep1_b2_hna_l2_256_"),
    (16, 14336, 4096, "skinny1x7_db_v_dep1_l2p1_b2_hna_l2_256_", "skinny1x7_db_v_dep1_w_e2_b2_hna_l2_256_", None),
    # no 7 tiles fit
    (16, 28672, 4096, "skinny2x2_db_v_dep1_b2_hna_l2_256_", "skinny2x2_db_v_dep1_w_b2_hna_l2_256_", None),
    (16, 6144, 4096, "skinny1x2_db_v_dep1_b2_hna_l2_256_", "skinny2x3_db_v_dep1_w_e2_b2_hna_l2_256_",
     "skinny2x3_db_v_dep1_b2_hna_l2_256_"),
    (2, 4240, 4096, "skinny2x3_db_v_dep1_b2_", "skinny2x3_db_v_dep1_w_e2_b2_", None)])
def test_decode_gemm_chunks_and_bounds_by_shape(m, n, k, name, waiting, static):
    two = forced("two_launch")
    assert ql_spec(m, n, k, E.BF16, tuning=two).variant("skinny_vector").config.name == f"w8a8_gemm_{name}bf16_token"
    waiting = waiting or name.replace("_dep1_", f"_dep1_w_e{two.wait_first_early_l2}_")
    for promise, expected in ((False, waiting), (True, static or name)):
        config = sq_spec(m, n, k, promise, tuning=two).variant("skinny_vector").config
        assert config.name == f"w8a8_gemm_{expected}bf16_tensor"
    # the static promise's blocks of 2 tiles again, and no one-wave prefetch
    plain = replace(two, static_smoothquant_wide=False, static_smoothquant_one_wave_prefetch=False)
    config = sq_spec(m, n, k, True, tuning=plain).variant("skinny_vector").config
    if k < 8192:
        assert config.tiles == 2
    elif n > 4096:
        assert config.prefetch_l2 == 0
    if k < 8192:  # 2 tiles below K = 8192 again
        narrow = ql_spec(m, n, k, E.BF16, tuning=replace(two, wide_tiles=False))
        assert narrow.variant("skinny_vector").config.tiles == 2


@pytest.mark.parametrize(("m", "n", "k", "skips_l1"), [
    (1, 8192, 8192, True), (2, 8192, 8192, True), (1, 4096, 4096, False), (1, 11008, 4096, True),
    (1, 8192, 4096, True), (4, 6144, 4096, False), (16, 4096, 4096, True), (8, 4096, 4096, False)])
def test_decode_weight_loads_skip_l1_by_shape(m, n, k, skips_l1):
    """The fused kernel and both dependent GEMMs (quantized_linear's, SmoothQuant's, with and without the static
    promise) load the weight with ld.global.L1::no_allocate.L2::256B at K >= 8192, 16 tokens or 32 MiB of weight,
    plainly elsewhere; ``weight_l2_prefetch_bytes = 0`` keeps L2's default fill; ``weight_load_hint``, when set,
    is every plan's."""

    def hints(**tuning):
        found = []
        for static in (False, True):
            for variant in ("fused", "two_launch"):
                spec = ql_spec(m, n, k, E.BF16, static, tuning=forced(variant, **tuning))
                found.append(spec.variant("fused" if variant == "fused" else "skinny_vector").config.weight_hint)
            found.append(sq_spec(m, n, k, static, tuning=replace(H100_TUNING, **tuning))
                         .variant("skinny_vector").config.weight_hint)
        return found

    assert hints() == ["na_l2_256" if skips_l1 else ""] * 6
    assert hints(weight_l2_prefetch_bytes=0) == ["na" if skips_l1 else ""] * 6
    assert hints(weight_load_hint="") == [""] * 6 and hints(weight_load_hint="ef") == ["ef"] * 6


def test_decode_selection_fuses_few_tokens_on_long_rows_and_launches_the_rest_dependent():
    """One token with K >= 8192 against 8192 .. 11008 weight rows, and one token against any weight up to 11008 rows
    and 32 MiB, take the fused kernel; two tokens where its blocks fit one wave at two per SM; with 2 column tiles
    past 32 MiB one token outside (1, 1.5] waves at three per SM unless the two launches take wide blocks, two
    where the blocks make one wave at three but not at two. Every other decode shape (up to 64 tokens; 16 where the
    warpgroup kernel runs) the quantizer, then the skinny GEMM as its programmatic dependent."""
    cases = [(1, 8, 64, "fused"), (1, 8192, 8192, "fused"), (1, 11008, 8192, "fused"),
             (1, 14336 + 16, 64, "skinny_vector"), (2, 8192, 8192, "skinny_vector"),
             (1, 8192, 8192 - 16, "skinny_vector"), (1, 8192 - 16, 8192, "skinny_vector"),
             (16, 8192, 8192, "skinny_vector"), (1, 11008 + 16, 8192, "skinny_vector"), (64, 8, 64, "skinny_vector"),
             (2, 4096, 4096, "fused"), (2, 4224, 4096, "fused"), (2, 4240, 4096, "fused"),
             (3, 4096, 4096, "skinny_vector"), (2, 4096, 8192, "skinny_vector"),
             (1, 4096, 4096, "fused"), (1, 8192, 4096, "fused"),
             # past 32 MiB at K = 4096: 8208 rows are 1.30 waves of fused blocks at 3 per SM, 9504 1.50; from 9520
             # rows the two launches take wide blocks (up to 7 tiles: 14784 rows)
             (1, 8208, 4096, "skinny_vector"), (1, 9504, 4096, "skinny_vector"), (1, 9520, 4096, "skinny_vector"),
             (1, 11008, 4096, "skinny_vector"), (1, 14336, 4096, "skinny_vector"), (1, 14352, 4096, "skinny_vector"),
             (2, 11008, 4096, "skinny_vector"), (1, 4096, 11008, "skinny_vector"),
             (2, 6144, 4096, "fused"), (2, 6336, 4096, "fused"), (2, 6352, 4096, "skinny_vector"),
             (4, 6144, 4096, "skinny_vector")]
    for m, n, k, variant in cases:
        spec = ql_spec(m, n, k)
        assert spec.aligned == variant, (m, n, k)
        assert spec.variant("skinny_vector").dependent and spec.other == "skinny"
        assert spec.fused == (variant == "fused")
    assert ql_spec(64, 8, 64, dev=HOPPER).aligned == "wgmma"
    # a static weight: up to 4 tokens in the one-wave shape, elsewhere the rules above; under capture the two
    # launches where only host time fuses (8192 x 4096, one token)
    for m, n, k, variant, captured_two in [(4, 4096, 4096, "fused", False), (5, 4096, 4096, "skinny_vector", False),
                                           (2, 6144, 4096, "fused", False), (4, 6144, 4096, "skinny_vector", False),
                                           (1, 8192, 4096, "fused", True), (2, 8192, 4096, "skinny_vector", False),
                                           (1, 11008, 4096, "skinny_vector", False),
                                           (1, 14336, 4096, "skinny_vector", False)]:
        spec = ql_spec(m, n, k, static_weight=True)
        assert spec.aligned == variant and spec.capture_unfused == captured_two, (m, n, k)


@pytest.mark.parametrize(("m", "n", "k", "sms", "two_launches"), [
    (1, 64, 64, 1, True), (1, 24, 64, 132, False), (2, 24, 64, 132, False), (1, 88, 64, 1, True),
    (1, 104, 64, 1, True), (1, 120, 64, 1, False), (1, 32, 128, 1, False), (2, 40, 128, 1, False),
    (1, 8192, 4096, 132, True), (1, 4096, 4096, 132, False), (1, 8192, 8192, 132, False)])
def test_capture_launches_two_kernels_where_fusing_only_saves_host_time(m, n, k, sms, two_launches):
    """A call captured into a CUDA graph (no host time at replay) launches the quantizer and the GEMM where the
    fused kernel is chosen for host time alone (its blocks not in one wave at two per SM and (1, 1.5] waves at
    three, or past three per SM where the two launches take wide blocks: 88 and 104 rows on one SM), and keeps the
    fused kernel where it is the faster on the GPU too (one wave; one token past 1.5 waves: 120 rows); long rows
    (K = 128 here) fuse on GPU time."""
    small = replace(H100_TUNING, fused_min_k=128, fused_min_n=32)  # in place of 8192 x 8192, small to simulate
    tuning = small if k < 4096 else H100_TUNING
    spec = ql_spec(m, n, k, tuning=tuning, dev=device(sms))
    assert spec.fused and spec.capture_unfused == two_launches
    assert not ql_spec(m, n, k, tuning=replace(tuning, capture_unfused=False), dev=device(sms)).capture_unfused


def test_dependent_gemm_prefetches_one_iteration_into_l2_for_narrow_weights_with_long_rows_or_few_tokens():
    """The dependent decode GEMM asks L2 for one more iteration of weight before its wait on weights of at most
    4096 rows with K >= 8192 or up to 4 tokens, and (quantized_linear's, ``one_wave``) at K >= 8192 where its blocks
    fit one wave at two per SM (two there from 4 tokens on wider weights), none elsewhere; a tuning value's
    ``dependent_prefetch_l2`` overrides the rule."""
    t = H100_TUNING
    cases = [((1, 4096, 4096), 1), ((4, 4096, 4096), 1), ((5, 4096, 4096), 0), ((16, 4096, 11008), 1),
             ((16, 4096, 8192), 1), ((1, 4104, 4096), 0), ((1, 8192, 8192), 0), ((16, 11008, 4096), 0)]
    for (m, n, k), prefetch in cases:
        assert dependent_prefetch(t, m, n, k) == prefetch, (m, n, k)
    for (m, n, k), prefetch in [((1, 8192, 8192), 1), ((3, 8192, 8192), 1), ((4, 8192, 8192), 2),
                                ((16, 8192, 8192), 2), ((16, 4096, 8192), 1), ((16, 11008, 4096), 0)]:
        assert dependent_prefetch(t, m, n, k, one_wave=True) == prefetch, (m, n, k)
    for forced_prefetch in (None, 2):
        two = forced("two_launch", dependent_prefetch_l2=forced_prefetch)
        for (m, n, k), prefetch in cases[:3]:
            config = ql_spec(m, n, k, tuning=two).variant("skinny_vector").config
            assert config.prefetch_l2 == (prefetch if forced_prefetch is None else forced_prefetch)
            assert (f"_l2p{config.prefetch_l2}_" in config.name) == (config.prefetch_l2 > 0)


def test_fused_kernel_shapes():
    """The fused kernel's prologue: ``x_loads`` pieces of x in flight (every piece of the thread's rows, up to 8,
    under launch bounds of 2; 4 under 3), compiled for the plan's M and K where they all fit at once; the one-wave
    shape (2 chunks, bounds of 2) where its blocks fit one wave at two per SM, with or without the static promise."""
    t = H100_TUNING
    assert fused_x_loads(t, 4, 4096, E.F16, 2) == 8 and fused_x_loads(t, 2, 4096, E.F16, 2) == 4
    assert fused_x_loads(t, 16, 208, E.F32, 2) == 8 and fused_x_loads(t, 3, 1040, E.F64, 3) == 4
    assert fixed_prologue(1, 1040, E.F16, 4) == (1, 1) and fixed_prologue(1, 2064, E.F32, 4) == (1, 3)
    assert fixed_prologue(4, 4096, E.F16, 8) == (4, 2) and fixed_prologue(16, 208, E.F32, 4) is None
    assert fixed_prologue(0, 4096, E.F16, 8) is None
    wave = ql_spec(1, 4096, 4096, E.BF16).variant("fused").config
    assert isinstance(wave, FusedConfig) and (wave.chunks, wave.min_blocks, wave.fixed) == (2, 2, (1, 2))
    assert wave.early_l2 == 2 and not wave.early_registers and wave.prefetch_l2 == 0
    static = ql_spec(1, 4096, 4096, E.BF16, static_weight=True).variant("fused").config
    assert static.early_registers and static.early_l2 == 0 and static.prefetch_l2 == 1
    past = ql_spec(1, 8192, 4096, E.BF16).variant("fused").config  # past one wave: bounds of 3, one chunk
    assert (past.chunks, past.min_blocks, past.x_loads) == (1, 3, 4)
    activation = ql_spec(1, 4096, 4096, E.BF16, static_activation=True)
    assert activation.variant("fused").config.static_scale and activation.static_quantizer is not None
    # x_loads of 4 leave a 16-row prologue too wide to fix: a static activation scale then takes the quantizer
    assert ql_spec(16, 24, 208, tuning=forced("fused"), static_activation=True).aligned == "skinny_vector"


def test_static_quantizer_and_quantizer_launches():
    """The static quantizer runs ``min(pieces / threads, 8 per SM)`` blocks of 128 as a programmatic dependent; the
    per-token quantizer's fast launch is a dependent past 16 MiB of weight."""
    spec = ql_spec(16, 4096, 4096, E.BF16, static_activation=True)
    static = spec.static_quantizer
    assert (static.blocks, static.threads, static.dependent) == (64, 128, True)  # 8192 pieces of 16 bytes
    assert ql_spec(4096, 4096, 4096, E.BF16, static_activation=True).static_quantizer.blocks == 8 * 132
    assert ql_spec(16, 4096, 4096, E.BF16, static_activation=True,
                   tuning=replace(H100_TUNING, static_quantizer=False)).static_quantizer is None
    assert not ql_spec(16, 4096, 4096).quantizer_dependent and ql_spec(16, 4096, 4097 + 16).quantizer_dependent


def test_the_preference_in_the_choice():
    assert "wgmma" not in ql_spec(300, 264, 512, dev=HOPPER, pref=PlanPreference(allow_sm90a=False)).names
    limited = ql_spec(1, 24, 64, pref=PlanPreference(max_workspace_bytes=0))
    assert limited.fused and limited.other is None and limited.workspace_bytes == 0 and not limited.capture_unfused
    with pytest.raises(bn.Unsupported, match=r"choose: pref\.max_workspace_bytes"):
        ql_spec(8, 24, 64, pref=PlanPreference(max_workspace_bytes=0))
    with pytest.raises(bn.Unsupported, match=r"choose: pref\.prefer_backend"):
        ql_spec(8, 24, 64, pref=PlanPreference(prefer_backend=bn.BackendKind.LIBRARY))


def test_configurations_refuse_what_no_kernel_does():
    """A configuration that names no kernel is refused when it is made."""
    from baracuda_numba.kernels.linear import Output

    out = Output(E.F32)
    with pytest.raises(ValueError, match="preloads 1 or 2 buffers"):
        SkinnyConfig(out, preload=1)
    with pytest.raises(ValueError, match="only the dependent one prefetches"):
        SkinnyConfig(out, prefetch_l2=1)
    with pytest.raises(ValueError, match="weight's cache operators take vector loads"):
        SkinnyConfig(out, weight_hint="na")
    with pytest.raises(ValueError, match="a fixed prologue is"):
        FusedConfig(out, E.F32, fixed=(17, 1))
    with pytest.raises(ValueError, match="a static activation scale needs a fixed prologue"):
        FusedConfig(out, E.F32, static_scale=True)
    with pytest.raises(ValueError, match="quantizes x per token"):
        FusedConfig(Output(E.F32, per_tensor_rows=True), E.F32)
