"""Tuning values per card (``plans/device.py``, ``plans/tuning.py``): each card's measured properties select its
values, for the memory-bound families and the W8A8 linear alike; a value is part of each plan's key and reaches
the kernels; the simulator's launch shapes keep what the kernels compile in; every variant knob gives the
reference's bits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_fp8 import assert_fp8_same
from test_per_tensor import assert_same
from tuned import per_axis, planned

import baracuda_numba as bn
from baracuda_numba import reference as ref
from baracuda_numba import registry
from baracuda_numba.kernels.dynamic import DynamicKernelTuning
from baracuda_numba.kernels.elementwise import ElementwiseKernelTuning
from baracuda_numba.ops.common import select_plan
from baracuda_numba.plans import linear
from baracuda_numba.plans.base import DEFAULT_PREFERENCE
from baracuda_numba.plans.device import H100_SXM, H200_SXM, SIMULATED, DeviceProperties, card_of, device_properties
from baracuda_numba.plans.tuning import (
    H100_TUNING,
    H200_TUNING,
    TUNINGS,
    current_tuning,
    launchable,
    simulated,
    tuning_for,
)
from baracuda_numba.platform import SIMULATOR
from baracuda_numba.reference import fp8 as ref8


@pytest.mark.parametrize(("device", "card"), [
    (H100_SXM, "h100"), (H200_SXM, "h200"), (SIMULATED, "h100"),
    (dataclasses.replace(H100_SXM, memory_bandwidth=3.99e12), "h100"),  # a faster H100 part: still H100-class
    (dataclasses.replace(H100_SXM, memory_bandwidth=4.0e12), "h200"),  # the rule's threshold
    (dataclasses.replace(H200_SXM, compute_capability=(8, 0)), "h100"),  # not sm_90: the H100's values
    (dataclasses.replace(H200_SXM, multiprocessors=66, sm90a=False), "h200"),  # the rule reads no SM count ...
])
def test_each_cards_properties_select_its_values(device, card):
    """The card comes from the measured properties (compute capability, DRAM bandwidth), never a name; both
    families' values follow it."""
    assert card_of(device) == card
    assert tuning_for(device) is TUNINGS[card] and tuning_for(device).card == card
    assert linear.tuning_for(device).card == card


def test_the_named_cards_take_their_own_values():
    assert tuning_for(H100_SXM) is H100_TUNING and tuning_for(H200_SXM) is H200_TUNING
    assert linear.tuning_for(H100_SXM) is linear.H100_TUNING and linear.tuning_for(H200_SXM) is linear.H200_TUNING
    assert set(TUNINGS) == {"h100", "h200"} and all(t.card == card for card, t in TUNINGS.items())


def test_device_properties_are_one_home():
    """The linear family reads the same properties and rule as the memory-bound ones."""
    assert linear.DeviceProperties is DeviceProperties and linear.device_properties is device_properties
    assert linear.H200_SXM is H200_SXM and linear.SIMULATED is SIMULATED
    if SIMULATOR:
        assert device_properties() == SIMULATED and current_tuning() == simulated(H100_TUNING)
    else:
        assert current_tuning() is tuning_for(device_properties())


def test_the_kernels_read_every_kernel_field():
    """The kernel-side configurations are projections of the plan-side values: same field names, same values."""
    e, d = H100_TUNING.elementwise, H100_TUNING.dynamic
    for kernel, plan in ((e.kernel, e), (d.kernel, d)):
        for field in dataclasses.fields(kernel):
            assert getattr(kernel, field.name) == getattr(plan, field.name), field.name
    assert isinstance(e.kernel, ElementwiseKernelTuning) and isinstance(d.kernel, DynamicKernelTuning)
    for role in registry.LaunchRole:  # every launch role has its grid in the value
        assert isinstance(e.policy(role), registry.LaunchPolicy)


def test_simulated_shapes_keep_the_kernels():
    """The simulator's value has 32-thread blocks, two per SM, and every field the kernels compile in."""
    for tuning in TUNINGS.values():
        small = simulated(tuning)
        assert small.card == tuning.card and simulated(small) == small
        assert small.elementwise.kernel == tuning.elementwise.kernel
        assert small.dynamic.kernel == tuning.dynamic.kernel
        for role in registry.LaunchRole:
            policy, original = small.elementwise.policy(role), tuning.elementwise.policy(role)
            assert (policy.threads_per_block, policy.blocks_per_sm) == (32, 2)
            assert (policy.unroll, policy.one_wave) == (original.unroll, original.one_wave)
        assert small.dynamic.resident_keep == tuning.dynamic.resident_keep
        assert small.packed.unroll == tuning.packed.unroll and small.packed.dynamic_threads == 32
    assert launchable(H100_TUNING) == (simulated(H100_TUNING) if SIMULATOR else H100_TUNING)


def test_the_tuning_is_part_of_the_plan_key():
    """The op functions cache plans on the tuning value too: the default is the current device's, another value
    selects another plan, and a plan keeps the value it was selected with."""
    desc = bn.QuantizePerTensorDescriptor(64, -128, 127, bn.ElementKind.F32, bn.ElementKind.S8)
    other = dataclasses.replace(current_tuning(), card="other")
    plan = select_plan(bn.QuantizePerTensorPlan, desc)
    assert plan is select_plan(bn.QuantizePerTensorPlan, desc, DEFAULT_PREFERENCE, current_tuning())
    assert plan.tuning == current_tuning() and "tuning=" in repr(plan)
    assert select_plan(bn.QuantizePerTensorPlan, desc, DEFAULT_PREFERENCE, other).tuning is other
    assert bn.QuantizePerTensorPlan.select(desc).tuning == current_tuning()


def test_kernels_are_shared_where_a_tuning_changes_nothing_they_compile():
    """Two values that differ only in a knob a kernel does not read build that kernel once."""
    entry = registry.lookup(bn.QuantizeKind.PER_TENSOR, bn.ElementKind.F32, bn.ElementKind.S8)
    base = H100_TUNING.elementwise
    other = dataclasses.replace(base, pow2_unroll=4, pow2_prefetch=2)
    assert entry.kernel(base.kernel) is entry.kernel(other.kernel)
    token = registry.lookup(bn.QuantizeKind.PER_TOKEN, bn.ElementKind.F32, bn.ElementKind.S8)
    assert token.kernel(base.kernel, True, pow2_segments=True) is not token.kernel(other.kernel, True,
                                                                                   pow2_segments=True)
    assert "_pow2_u4_pf2" in token.kernel(other.kernel, True, pow2_segments=True).py_func.__name__


def _with(**fields):
    base = current_tuning()
    return dataclasses.replace(base, elementwise=dataclasses.replace(base.elementwise, **fields))


def test_narrow_input_bytes_raise_the_dequantize_chunks_in_flight():
    """Input bytes in flight per thread of narrow-input kernels (dequantize): int8 -> f32 chunks read 4 bytes, so
    16 bytes keep 4 in flight; quantize (16-byte input chunks), the stationary kernel and the shift kernels
    (power-of-two segments: one chunk, measured best on both cards, kernels/elementwise.py) keep theirs."""
    tuning = _with(narrow_input_bytes=16)
    deq = bn.DequantizePerTensorPlan.select(bn.DequantizePerTensorDescriptor(64, "f32", "s8"), tuning=tuning)
    assert deq._unroll == 4
    deq16 = bn.DequantizePerTensorPlan.select(bn.DequantizePerTensorDescriptor(64, "bf16", "s8"), tuning=tuning)
    assert deq16._unroll == 2
    quant = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(64, -128, 127, "f32", "s8"),
                                            tuning=tuning)
    assert quant._unroll == max(tuning.elementwise.stream_policy.unroll or tuning.elementwise.unroll, 1)
    token = bn.DequantizePerTokenPlan.select(bn.DequantizePerTokenDescriptor(4, 256, "f32", "s8"), tuning=tuning)
    # a tiled shift kernel's chunks are its tiles' (pow2_tiled_unroll), an untiled one's pow2_unroll: not raised
    e = tuning.elementwise
    assert token._pow2_segments() and token._unroll == (e.pow2_tiled_unroll if token._tiled else e.pow2_unroll)
    assert not token._tiled or e.pow2_tiled_unroll > 1


# Knobs of the H200 candidates (benchmarks/tune_cards.py), each against the float64 reference bit for bit: more
# chunks in flight, L2 prefetches, launch bounds, grids. (The simulator ignores launch bounds; the GPU run of this
# test compiles them.)
KNOB_VARIANTS = [
    dict(narrow_input_bytes=16), dict(narrow_input_bytes=32), dict(unroll=4), dict(pow2_unroll=2),
    dict(pow2_tiled_unroll=2), dict(pow2_tiled_unroll=4, pow2_unroll=2),
    dict(pow2_unroll=4, pow2_prefetch=1), dict(pow2_prefetch=2, pow2_launch_bounds=None),
    dict(general_launch_bounds=(512, 4)), dict(stationary_input_bytes=64, stationary_launch_bounds=(512, 3)),
    dict(channel_launch_bounds=None),
]


@pytest.mark.parametrize("fields", KNOB_VARIANTS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_knob_variants_match_reference(fields, dtype):
    tuning = _with(**fields)
    rng = np.random.default_rng(len(fields))
    f = bn.element_kind(dtype).numpy_dtype
    shape = (24, 512)
    x = (rng.standard_normal(shape) * 3).astype(np.float32).astype(f)
    x[0, :3] = np.nan, np.inf, -np.inf
    q = rng.integers(-128, 128, shape).astype(np.int8)
    n = x.size
    out = np.empty(shape, np.int8)
    planned(bn.QuantizePerTensorPlan, bn.QuantizePerTensorDescriptor(n, -128, 127, dtype, "s8"), tuning,
            bn.QuantizePerTensorArgs(x, 0.02, 3, out))
    assert_same(out, ref.quantize(x, 0.02, 3, -128, 127, np.int8))
    y = np.empty(shape, f)
    planned(bn.DequantizePerTensorPlan, bn.DequantizePerTensorDescriptor(n, dtype, "s8"), tuning,
            bn.DequantizePerTensorArgs(q, 0.02, 3, y))
    assert_same(y, ref.dequantize(q, 0.02, 3, f))
    for family, count, layout in (("token", 24, {}), ("group", 24 * 4, dict(group_size=128)),
                                  ("channel", 512, dict(axis=1)), ("channel", 24, dict(axis=0))):
        scales = rng.choice([0.5, 2.0**-6, 0.013, 0.1], count).astype(np.float32)
        zps = rng.integers(-6, 6, count).astype(np.int32)
        full_s = _expand(family, scales, shape, layout)
        full_z = _expand(family, zps, shape, layout)
        got = per_axis("quantize", family, tuning, x=x, scales=scales, zero_points=zps, **layout)
        assert_same(got, ref.quantize(x, full_s, full_z, -128, 127, np.int8))
        assert_same(per_axis("dequantize", family, tuning, q=q, scales=scales, zero_points=zps, dtype=dtype, **layout),
                    ref.dequantize(q, full_s, full_z, f))


@pytest.mark.parametrize("tiled_unroll", [2, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiled_shift_kernels_match_reference(tiled_unroll, dtype):
    """Tiled shift kernels (``pow2_tiled_unroll`` chunks of one segment a thread, segments of at least eight threads'
    worth): per-token, group-2048 and group-128 quantize and dequantize, integer and FP8, NaN, infinities and values
    past the range throughout, bit for bit against the float64 reference; which plans take the tiles."""
    tuning = _with(pow2_tiled_unroll=tiled_unroll)
    rng = np.random.default_rng(tiled_unroll)
    f = bn.element_kind(dtype).numpy_dtype
    shape = (3, 4096)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x[:, ::61] = 1e6
    x[:, 7::97] = np.nan
    x[:, 11::89] = -np.inf
    x[:, 13::83] = np.inf
    x = x.astype(f)
    q = rng.integers(-128, 128, shape).astype(np.int8)
    for family, count, layout in (("token", 3, {}), ("group", 3 * 2, dict(group_size=2048)),
                                  ("group", 3 * 32, dict(group_size=128)), ("group", 3 * 128, dict(group_size=32))):
        scales = rng.choice([0.5, 2.0**-6, 0.013, 0.1], count).astype(np.float32)
        zps = rng.integers(-6, 6, count).astype(np.int32)
        full_s = _expand(family, scales, shape, layout)
        full_z = _expand(family, zps, shape, layout)
        assert_same(per_axis("quantize", family, tuning, x=x, scales=scales, zero_points=zps, **layout),
                    ref.quantize(x, full_s, full_z, -128, 127, np.int8))
        assert_same(per_axis("dequantize", family, tuning, q=q, scales=scales, zero_points=zps, dtype=dtype,
                             **layout), ref.dequantize(q, full_s, full_z, f))
        assert_fp8_same(per_axis("quantize", family, tuning, x=x, scales=scales, out="fp8_e4m3", **layout),
                        ref8.fp8_quantize(x, full_s, bn.ElementKind.FP8_E4M3.numpy_dtype))
    chunk = 16 // np.dtype(f).itemsize
    for group_size in (4096, 128, 32):
        desc = bn.QuantizePerGroupDescriptor(3, 4096, group_size, -128, 127, dtype, "s8")
        plan = bn.QuantizePerGroupPlan.select(desc, tuning=tuning)
        assert plan._tiled == (group_size // chunk >= 8 * tiled_unroll)
        assert plan._unroll == (tiled_unroll if plan._tiled else tuning.elementwise.pow2_unroll)
        assert not bn.QuantizePerGroupPlan.select(desc, tuning=_with(pow2_tiled_unroll=1))._tiled


def _expand(family, values, shape, layout):
    if family == "token":
        return ref.expand_tokens(values, shape)
    if family == "group":
        return ref.expand_groups(values, shape, layout["group_size"])
    return ref.expand_channels(values, shape, layout["axis"])


def test_the_tuning_tool_varies_fields_that_exist_and_prints_what_it_found():
    """benchmarks/tune_cards.py: every variant names fields of its family's part of the value; the best variants
    merge (a field two families set differently goes to the larger gain); the printed value, executed, is the
    value (the fields that differ from the H100's, which are the class defaults)."""
    from benchmarks import tune_cards as tool

    for family in tool.FAMILIES:
        section = linear.LinearTuning() if family.section == "linear" else getattr(H100_TUNING, family.section)
        names = {f.name for f in dataclasses.fields(section)}
        assert family.variants and all(set(changes) <= names for changes in family.variants.values()), family.name
        memory, linear_tuning = tool.with_changes(H100_TUNING, linear.H100_TUNING, family.section,
                                                  next(iter(family.variants.values())))
        assert (memory, linear_tuning) != (H100_TUNING, linear.H100_TUNING)

    a = tool.Result("fp8", "a", {"narrow_input_bytes": 16, "unroll": 4})
    b = tool.Result("tensor_dequantize", "b", {"narrow_input_bytes": 32})
    c = tool.Result("dynamic", "c", {"resident_keep": 8})
    sections, notes = tool.merged([(a, 1.0), (b, 3.0), (c, 2.0)])
    assert sections == {"elementwise": {"narrow_input_bytes": 32, "unroll": 4}, "dynamic": {"resident_keep": 8}}
    assert len(notes) == 1 and "narrow_input_bytes" in notes[0]

    memory = dataclasses.replace(
        H200_TUNING, elementwise=dataclasses.replace(H200_TUNING.elementwise, narrow_input_bytes=16,
                                                     tensor_dequantize_policy=registry.LaunchPolicy(128, 4096, 4)),
        packed=dataclasses.replace(H200_TUNING.packed, quantize_policy=registry.LaunchPolicy(256, 8, one_wave=True)))
    linear_tuning = dataclasses.replace(linear.H200_TUNING, vector_chunks=4)
    text = tool.literal(memory, linear_tuning)
    assert all(len(line) <= 120 for line in text.splitlines())
    memory_part, linear_part = text.split("# baracuda_numba/plans/linear/tuning.py")
    found: dict = {}
    exec("from baracuda_numba.plans.tuning import *\nfrom baracuda_numba.registry import LaunchPolicy\n"
         + memory_part, found)
    assert found["H200_TUNING"] == memory
    exec("from baracuda_numba.plans.linear.tuning import LinearTuning\n" + linear_part, found)
    assert found["H200_TUNING"] == linear_tuning
    assert tool.literal(H100_TUNING, linear.H100_TUNING).count("=") == 4  # nothing but the names and cards


def test_the_tuning_tools_digest_is_the_outputs_bits(monkeypatch):
    """benchmarks/tune_cards.py's digest (a before / after of two checkouts compares them): equal bits give equal
    digests, one changed element or a NaN of another payload a different one, and -0.0 is not 0.0."""
    torch = pytest.importorskip("torch")
    from benchmarks import tune_cards as tool

    monkeypatch.setattr(tool, "torch", torch)
    x = torch.arange(64, dtype=torch.float32).to(torch.bfloat16)
    q = torch.arange(-32, 32, dtype=torch.int8)
    assert tool.digest((x, q)) == tool.digest((x.clone(), q.clone()))
    one, zero = torch.tensor([7]), torch.tensor([0])
    for changed in (x.clone().index_fill_(0, one, 7.5), x.clone().index_fill_(0, zero, -0.0)):
        assert tool.digest((changed, q)) != tool.digest((x, q))
    nan_a = torch.tensor([0x7FC0], dtype=torch.int16).view(torch.bfloat16)
    nan_b = torch.tensor([0x7FC1], dtype=torch.int16).view(torch.bfloat16)
    assert tool.digest((nan_a,)) != tool.digest((nan_b,))
