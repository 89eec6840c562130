"""The host side of a launch: the kernel parameter block (template + patched slots must be the
bytes a full pack writes) and the memo of validated scalar scales. Pure host code: the same on
the simulator and on a GPU."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from recording_driver import recording_driver

import baracuda_numba as bn
from baracuda_numba import launch
from baracuda_numba.launch import ParameterBlock
from baracuda_numba.plans.base import _PATCHED_INT_SLOTS, checked_scale

POINTERS = st.integers(0, 2**63 - 1)


def _plans():
    yield bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(1000, -128, 127, "f32", "s8"))
    yield bn.FakeQuantizePlan.select(bn.FakeQuantizeDescriptor(77, -128, 127, "f64"))
    yield bn.QuantizePerTokenPlan.select(bn.QuantizePerTokenDescriptor(8, 96, -128, 127, "bf16", "s8"))


@pytest.mark.parametrize("plan", list(_plans()), ids=lambda p: p.name)
def test_patched_template_is_the_full_pack(plan):
    """The compiled launch (and its Python twin ``record_bytes``) hands the driver the template with
    the call's pointers, steps and scalars written in: the bytes a full pack of the call writes."""
    math_type = plan._math
    types = (np.int64,) * 6 + (math_type,) * 5
    template = plan._values((0, 0, 0, 0, 0), plan._n // plan._chunk, (0, 0), (math_type(0),) * 5)
    driver = recording_driver()

    @given(st.tuples(*[POINTERS] * 5), st.integers(0, 2**40), st.integers(0, 2**40),
           st.tuples(*[st.floats(width=32, allow_nan=False)] * 5))
    def check(pointers, step_q, step_r, scalars):
        scalars = tuple(math_type(v) for v in scalars)
        block = ParameterBlock(8, types)
        block.set_template(template, _PATCHED_INT_SLOTS, range(62, 67), math_type)
        a, b, out, s, z = pointers
        ints = (a, a, b, b, out, out, s, z, step_q, step_r)
        full = block.pack(plan._values(pointers, plan._n // plan._chunk, (step_q, step_r), scalars))
        assert launch.record_bytes(block.record, ints, scalars) == full
        driver.calls.clear()
        assert driver.launch_record(0xF00, 0, 2, 64, 0x5, block.record, ints, scalars) == 0
        assert driver.calls == [((0xF00, 2, 1, 1, 64, 1, 1, 0, 0x5), full)]

    check()


def test_dependent_launch_goes_through_launch_kernel_ex_with_the_same_grid_and_bytes():
    """A dependent template (programmatic stream serialization) is launched through ``cuLaunchKernelEx``
    with the attribute set, the grid, block, shared bytes, stream and parameter bytes of the plain launch
    of the same template; a plain template never is."""
    types = (np.int64, np.float32)  # after one array's seven words
    values = (0, 0, 64, 4, 0, 64, 4, 9, 0.5)
    driver = recording_driver()
    records = []
    for dependent in (False, True):
        block = ParameterBlock(1, types)
        block.set_template(values, (4,), range(8, 9), np.float32, shared_bytes=1536, dependent=dependent)
        records.append(block.record)
    for record in records:
        assert driver.launch_record(0xF00, 0, 3, 256, 0x77, record, (0xABC0,), (2.0,)) == 0
    (plain_config, plain_bytes), (dependent_config, dependent_bytes) = driver.calls
    assert driver.dependent == [False, True]
    assert plain_config == dependent_config == (0xF00, 3, 1, 1, 256, 1, 1, 1536, 0x77)
    assert plain_bytes == dependent_bytes == launch.record_bytes(records[0], (0xABC0,), (2.0,))
    assert struct.unpack_from("<q", plain_bytes, 32)[0] == 0xABC0


@pytest.mark.parametrize("arrays", [1, 60, 72, 200])
@pytest.mark.parametrize("dependent", [False, True])
def test_compiled_launch_frames_on_the_stack_or_the_heap_hand_the_driver_the_same_bytes(arrays, dependent):
    """The compiled launch builds its frame (``extra``, the launch config, the parameter buffer) on its stack up to
    ``_STACK_FRAME_WORDS`` words and on the heap past them; either way the driver gets the patched block, the
    grid and the stream (72 arrays: 504 parameter words, just past the stack frame with the frame's own words)."""
    values = (*range(7 * arrays), 0.5)
    block = ParameterBlock(arrays, (np.float32,))
    block.set_template(values, (slice(4, 7 * arrays, 7),), range(7 * arrays, 7 * arrays + 1), np.float32,
                       dependent=dependent)
    words = launch._FRAME_WORDS + block.record.size - int(block.record[launch._BUFFER_AT])
    assert (words <= launch._STACK_FRAME_WORDS) == (arrays < 72)
    ints = tuple(0x1000 * (i + 1) for i in range(arrays))
    driver = recording_driver()
    assert driver.launch_record(0xF00, 0, 5, 128, 0x77, block.record, ints, (3.0,)) == 0
    expected = block.pack((*(ints[i // 7] if i % 7 == 4 else i for i in range(7 * arrays)), 3.0))
    assert driver.calls == [((0xF00, 5, 1, 1, 128, 1, 1, 0, 0x77), expected)]
    assert driver.dependent == [dependent]


def test_parameter_block_lays_parameters_out_at_their_natural_alignment():
    block = ParameterBlock(1, (np.int64, np.float32, np.float64, np.bool_, np.int32, np.float32))
    assert block.offsets == (*range(0, 56, 8), 56, 64, 72, 80, 84, 88)
    assert block.size == 92


def test_record_bytes_rejects_a_patch_of_the_wrong_length():
    block = ParameterBlock(1, (np.int64, np.float32))
    block.set_template((0,) * 7 + (0, np.float32(0)), (slice(4, 8, 3),), range(8, 9), np.float32)
    with pytest.raises(ValueError):
        launch.record_bytes(block.record, (1,), (np.float32(1),))


def test_record_rejects_a_patched_int_off_its_8_byte_word():
    block = ParameterBlock(0, (np.float32, np.int32, np.int64))
    with pytest.raises(ValueError, match="parameter 1"):
        block.set_template((np.float32(0), 0, 0), (1,), range(0, 1), np.float32)


def test_compiled_launch_reports_a_context_of_another_device_and_launches_nothing():
    block = ParameterBlock(1, (np.int64,))
    block.set_template((0,) * 8, (4,), range(0), np.float32)
    driver = recording_driver()
    driver.device = 1
    assert driver.launch_record(0xF00, 0, 1, 32, 0, block.record, (7,), (0.0,)) == -1
    assert driver.launch_record(0xF00, -1, 1, 32, 0, block.record, (7,), (0.0,)) == 0  # unchecked
    assert len(driver.calls) == 1


@pytest.mark.parametrize("math_type", [np.float32, np.float64])
def test_scale_memo_returns_what_a_fresh_check_computes(math_type):
    for scale in (0.02, 1.0, 3e-7, 1234.5):
        first = checked_scale("P", scale, math_type)
        again = checked_scale("P", scale, math_type)
        assert first == again == (math_type(1) / math_type(scale), math_type(scale))
        assert type(again[0]) is math_type


@pytest.mark.parametrize("bad", [0.0, -0.0, -1.0, math.nan, math.inf, 1e-45, 1e300])
def test_scale_memo_never_admits_an_invalid_scale(bad):
    for _ in range(2):  # the second call must not find it remembered
        with pytest.raises(bn.InvalidProblem, match="scale expected a finite value > 0"):
            checked_scale("P", bad, np.float32)


def _gpu_launcher(monkeypatch, n_arrays, scalar_types):
    monkeypatch.setattr(launch, "SIMULATOR", False)
    launcher = launch.KernelLauncher(lambda: None, n_arrays, scalar_types)
    driver = recording_driver()
    monkeypatch.setattr(launch, "_driver", lambda: driver)
    launcher._functions[0] = 0xF00  # compiled and loaded: the hot path
    return launcher, driver


def test_gpu_launch_path_hands_the_driver_the_packed_block(monkeypatch):
    types = (np.int64, np.float32)
    launcher, driver = _gpu_launcher(monkeypatch, 1, types)
    launcher.set_template((0, 0, 16, 1, 0, 16, 1, 7, np.float32(0)), (slice(4, 5),), range(8, 9), np.float32)
    launcher.launch_patched(3, 128, 0x5, (0xABC,), (np.float32(2.5),))
    launcher.launch_values(4, 64, 0, (0, 0, 16, 1, 0xDEF, 16, 1, 9, np.float32(-1)))
    launcher.launch_patched(3, 128, 0x5, (0x123,), (np.float32(0.5),))
    expected = ParameterBlock(1, types)
    raws = [expected.pack(values) for values in ((0, 0, 16, 1, 0xABC, 16, 1, 7, np.float32(2.5)),
                                                 (0, 0, 16, 1, 0xDEF, 16, 1, 9, np.float32(-1)),
                                                 (0, 0, 16, 1, 0x123, 16, 1, 7, np.float32(0.5)))]
    assert [call[0] for call in driver.calls] == [(0xF00, 3, 1, 1, 128, 1, 1, 0, 0x5), (0xF00, 4, 1, 1, 64, 1, 1, 0, 0),
                                                  (0xF00, 3, 1, 1, 128, 1, 1, 0, 0x5)]
    assert [call[1] for call in driver.calls] == raws


def test_launch_pair_hands_the_driver_the_two_launches_of_launch_patched(monkeypatch):
    """One compiled call of a :class:`LaunchPair` makes the launches, bytes and dependencies that the two
    ``launch_patched`` calls make, first then second, through the compiled entry point."""
    first, driver = _gpu_launcher(monkeypatch, 1, (np.int64,))
    first.set_template((0, 0, 8, 1, 0, 8, 1, 3), (slice(4, 5),), range(0), np.float32)
    second = launch.KernelLauncher(lambda: None, 1, (np.int64, np.float32), dependent=True)
    second._functions[0] = 0xF01
    second.set_template((0, 0, 16, 4, 0, 16, 4, 7, np.float32(0)), (slice(4, 5),), range(8, 9), np.float32)
    pair = launch.LaunchPair(first, second)
    for a, b, scale in ((0x100, 0x200, 2.5), (0x300, 0x400, -0.75)):
        pair.launch(0x5, 0, 2, 64, (a,), (), 9, 128, (b,), (np.float32(scale),))
        first.launch_patched(2, 64, 0x5, (a,), ())
        second.launch_patched(9, 128, 0x5, (b,), (np.float32(scale),))
    assert len(driver.calls) == 8
    assert driver.calls[0:2] == driver.calls[2:4] and driver.calls[4:6] == driver.calls[6:8]
    assert driver.dependent == [False, True] * 4
    assert driver.calls[0][0] == (0xF00, 2, 1, 1, 64, 1, 1, 0, 0x5)
    assert driver.calls[1][0] == (0xF01, 9, 1, 1, 128, 1, 1, 0, 0x5)
    assert driver.calls[5][1] == ParameterBlock(1, (np.int64, np.float32)).pack(
        (0, 0, 16, 4, 0x400, 16, 4, 7, np.float32(-0.75)))


def test_launch_pair_on_another_devices_context_launches_nothing():
    block = ParameterBlock(1, (np.int64,))
    block.set_template((0,) * 8, (4,), range(0), np.float32)
    driver = recording_driver()
    driver.device = 1
    args = (0, 0x5, 0xF00, 1, 32, block.record, (7,), (0.0,), 0xF01, 1, 32, block.record, (8,), (0.0,))
    assert driver.launch_pair(*args) == -1 and driver.calls == []
    assert driver.launch_pair(1, *args[1:]) == 0 and len(driver.calls) == 2


def test_gpu_launch_failure_is_reported_with_its_cuda_result(monkeypatch):
    launcher, driver = _gpu_launcher(monkeypatch, 1, (np.int64,))
    launcher.set_template((0,) * 8, (4,), range(0), np.float32)
    driver.status = 700  # CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(bn.BaracudaError, match="CUresult 700"):
        launcher.launch_patched(1, 32, 0, (1,), ())
    with pytest.raises(bn.BaracudaError, match="CUresult 700"):
        launcher.launch_values(1, 32, 0, (0,) * 8)


@given(st.integers(0, 2**62), st.integers(0, 2**40), st.integers(-(2**62), 2**62),
       st.floats(width=32, allow_nan=False), st.floats(allow_nan=False), st.booleans())
def test_gpu_launch_hands_the_driver_numbas_array_abi_and_scalar_slots(ptr, nitems, count, f32, f64, flag):
    with pytest.MonkeyPatch.context() as monkeypatch:
        launcher, driver = _gpu_launcher(monkeypatch, 2, (np.int64, np.float32, np.float64, np.bool_))
        arrays = (launch.ArrayArg(ptr, nitems, 4), launch.ArrayArg(ptr + 16, 3, 1))
        launcher.launch(7, 256, 0x5, arrays, (count, np.float32(f32), f64, flag))
    (config, raw), = driver.calls
    assert config == (0xF00, 7, 1, 1, 256, 1, 1, 0, 0x5)
    # numba's 1-D array: meminfo, parent, nitems, itemsize, data, shape[0], strides[0] (int64 each); the
    # scalars at their natural alignment, as in the kernel's parameter space
    assert struct.unpack_from("<7q", raw, 0) == (0, 0, nitems, 4, ptr, nitems, 4)
    assert struct.unpack_from("<7q", raw, 56) == (0, 0, 3, 1, ptr + 16, 3, 1)
    assert struct.unpack_from("<q", raw, 112)[0] == count
    assert struct.unpack_from("<f", raw, 120)[0] == np.float32(f32)
    assert struct.unpack_from("<d", raw, 128)[0] == f64
    assert raw[136] == int(flag) and len(raw) == 137


def test_plan_template_puts_pointers_where_the_kernel_reads_them():
    # the slots ElementwisePlan._launch rewrites in its packed template: each array struct's data
    # pointer (slot 4 of 7) for the chunk and element views of a, b, out, then scales, zero points
    plan = bn.QuantizePerTokenPlan.select(bn.QuantizePerTokenDescriptor(8, 96, -128, 127, "bf16", "s8"))
    values = plan._values((101, 202, 303, 404, 505), plan._n // plan._chunk, (6, 7), (8, 9, 10, 11, 12))
    assert [values[i] for i in (4, 11, 18, 25, 32, 39, 46, 53, 60, 61)] == [101, 101, 202, 202, 303, 303, 404, 505,
                                                                             6, 7]
    assert values[62:67] == [8, 9, 10, 11, 12] and len(values) == 67


@pytest.mark.filterwarnings("error")  # an overflowing scale is reported as the error, not as a warning
@pytest.mark.parametrize("bad", [0.0, -0.0, -1.0, math.nan, math.inf, 1e-45, 1e300])
def test_checked_scale_rejects_what_has_no_finite_float32_reciprocal(bad):
    with pytest.raises(bn.InvalidProblem, match="scale expected a finite value > 0"):
        checked_scale("P", bad, np.float32)


def _gpu_plan(monkeypatch, plan):
    """``plan`` rebuilt for the GPU launch path with a recording driver (no GPU needed)."""
    from baracuda_numba.plans import base

    monkeypatch.setattr(launch, "SIMULATOR", False)
    monkeypatch.setattr(base, "SIMULATOR", False)
    monkeypatch.setitem(base._DEVICE_ATTRIBUTES, (0, "MULTIPROCESSOR_COUNT"), 132)
    for name, function in (("_launcher", 0xF00), ("_stationary_launcher", 0xF01)):
        old = getattr(plan, name, None)
        if old is not None:
            rebuilt = launch.KernelLauncher(old._compile, old._n_arrays, old._scalar_types)
            rebuilt._functions[0] = function  # compiled and loaded: the hot path
            setattr(plan, name, rebuilt)
    plan._geometry_cache.clear()
    plan._install_fast()
    driver = recording_driver()
    monkeypatch.setattr(launch, "_driver", lambda: driver)
    monkeypatch.setattr(launch, "_torch_stream_getter", lambda: (lambda device_id: 0x77))
    return driver


def _torch_operand(element, shape, ptr):
    return bn.arrays.Operand(None, "torch", element, shape, ptr, True)


@pytest.mark.parametrize("case", ["per_tensor", "per_token_backward", "per_channel_last"])
def test_fast_path_launches_what_the_checked_path_launches(case):
    E = bn.ElementKind
    if case == "per_tensor":
        plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(4096, -128, 127, "bf16", "s8"))
        fields = {"input": (E.BF16, 0x10000), "output": (E.S8, 0x20000)}
        make = lambda ops: bn.QuantizePerTensorArgs(ops["input"], 0.02, 3, ops["output"])  # noqa: E731
    elif case == "per_token_backward":
        plan = bn.QuantizePerTokenBackwardPlan.select(bn.QuantizePerTokenBackwardDescriptor(16, 256, -128, 127,
                                                                                            "f32", "s8"))
        fields = {"input": (E.F32, 0x10000), "scale": (E.F32, 0x30000), "zero_point": (E.I32, 0x40000),
                  "d_output": (E.F32, 0x50000), "d_input": (E.F32, 0x60000)}
        make = lambda ops: bn.QuantizePerTokenBackwardArgs(**ops)  # noqa: E731
    else:
        plan = bn.DequantizePerChannelPlan.select(bn.DequantizePerChannelDescriptor((64, 48), 1, "f16", "s8"))
        fields = {"input": (E.S8, 0x10000), "scale": (E.F32, 0x30000), "zero_point": (E.I32, 0x40000),
                  "output": (E.F16, 0x60000)}
        make = lambda ops: bn.DequantizePerChannelArgs(**ops)  # noqa: E731
    with pytest.MonkeyPatch.context() as monkeypatch:
        driver = _gpu_plan(monkeypatch, plan)
        counts = {"scale": plan._segment_count(), "zero_point": plan._segment_count()}
        ops = {f: _torch_operand(e, (counts.get(f, plan._n),), ptr) for f, (e, ptr) in fields.items()}
        args = make(ops)
        assert plan._fast_pointers(args) is not None
        plan.run(args)  # fast path
        bn.plans.base.Plan.run(plan, args)  # the checked path
        ops["input"] = _torch_operand(fields["input"][0], (plan._n,), fields["input"][1] + 2)  # off its chunk
        misaligned = make(ops)
        assert plan._fast_pointers(misaligned) is None
    (fast_config, fast_raw), (checked_config, checked_raw) = driver.calls
    assert fast_config == checked_config and fast_config[8] == 0x77
    assert fast_raw == checked_raw


_CACHE_CHILD = r"""
import json, sys, warnings
sys.path.insert(0, "tests")
import numpy as np
from recording_driver import RecordingDriver
from baracuda_numba.launch import ParameterBlock, _jit, compiled_entry

warnings.simplefilter("error")  # numba warns where it cannot cache a function
driver = RecordingDriver()
block = ParameterBlock(1, (np.int64, np.float32))
block.set_template((0,) * 7 + (3, np.float32(0)), (slice(4, 5),), range(8, 9), np.float32)
launch = compiled_entry(_jit().launch_record, (driver.entry_points, 0xF00, 0, 1, 32, 0x77, block.record, (5,),
                                               (np.float32(1.0),)))
pair = compiled_entry(_jit().linear_pair_launch, (driver.entry_points, 0, 0x77, 1, 2, 3, 4, 5, 6,
                                                  np.zeros(8, np.int64), block.record, block.record))
assert launch(driver.entry_points, 0xF00, 0, 1, 32, 0x77, block.record, (5,), (np.float32(1.0),)) == 0
stats = {name: (sum(f.stats.cache_hits.values()), sum(f.stats.cache_misses.values()))
         for name, f in (("record", _jit().launch_record), ("linear", _jit().linear_pair_launch))}
print(json.dumps({"stats": stats, "calls": len(driver.calls)}))
"""


def test_compiled_launches_are_cached_on_disk_for_the_next_process(tmp_path):
    """The compiled launches hold no address of their process (the driver's entry points are an argument), so
    numba keeps them on disk: a second process loads each signature instead of compiling it."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    environ = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path),
                   PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    runs = []
    for _ in range(2):
        child = subprocess.run([sys.executable, "-c", _CACHE_CHILD], capture_output=True, text=True, env=environ,
                               cwd=root, timeout=600)
        assert child.returncode == 0, child.stderr[-3000:]
        runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["calls"] == second["calls"] == 1
    assert all(hits == 0 and misses > 0 for hits, misses in first["stats"].values()), first
    assert all(hits > 0 and misses == 0 for hits, misses in second["stats"].values()), second
