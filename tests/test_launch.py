"""The host side of a launch: the kernel parameter block (template + patched slots must be the
bytes a full pack writes), the driver call, scalar scale checks. Pure host code: the same on the
simulator and on a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import baracuda_numba as bn
from baracuda_numba.launch import ParameterBlock
from baracuda_numba.plans.base import _PATCHED_INT_SLOTS, checked_scale

POINTERS = st.integers(0, 2**63 - 1)


def _plans():
    yield bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(1000, -128, 127, "f32", "s8"))
    yield bn.FakeQuantizePlan.select(bn.FakeQuantizeDescriptor(77, -128, 127, "f64"))
    yield bn.QuantizePerTokenPlan.select(bn.QuantizePerTokenDescriptor(8, 96, -128, 127, "bf16", "s8"))


@pytest.mark.parametrize("plan", list(_plans()), ids=lambda p: p.name)
def test_patched_template_is_the_full_pack(plan):
    math_type = plan._math
    types = (np.int64,) * 6 + (math_type,) * 5
    template = plan._values((0, 0, 0, 0, 0), plan._n // plan._chunk, (0, 0), (math_type(0),) * 5)

    @given(st.tuples(*[POINTERS] * 5), st.integers(0, 2**40), st.integers(0, 2**40),
           st.tuples(*[st.floats(width=32, allow_nan=False)] * 5), st.booleans())
    def check(pointers, step_q, step_r, scalars, dirty):
        scalars = tuple(math_type(v) for v in scalars)
        block, full = ParameterBlock(8, types), ParameterBlock(8, types)
        block.set_template(template, _PATCHED_INT_SLOTS, range(62, 67), math_type)
        if dirty:  # a full pack in between (the misaligned path) must not leak into the next patch
            block.pack(plan._values(pointers, 0, (1, 2), scalars))
        a, b, out, s, z = pointers
        block.patch((a, a, b, b, out, out, s, z, step_q, step_r), scalars)
        full.pack(plan._values(pointers, plan._n // plan._chunk, (step_q, step_r), scalars))
        assert block.raw() == full.raw()

    check()


def test_parameter_block_rejects_a_patch_of_the_wrong_length():
    block = ParameterBlock(1, (np.int64, np.float32))
    block.set_template((0,) * 7 + (0, np.float32(0)), (4, 7), (8,), np.float32)
    with pytest.raises(ValueError):
        block.patch((1,), (np.float32(1),))


@pytest.mark.parametrize("bad", [0.0, -0.0, -1.0, math.nan, math.inf, 1e-45, 1e300])
@pytest.mark.filterwarnings("error")  # an overflowing scale is reported as the error, not as a warning
def test_checked_scale_rejects_what_has_no_finite_float32_reciprocal(bad):
    with pytest.raises(bn.InvalidProblem, match="scale expected a finite value > 0"):
        checked_scale("P", bad, np.float32)


class _RecordingDriver:
    """Stands in for libcuda: records what cuLaunchKernel was given (the parameter bytes it points at)."""

    def __init__(self, params: ParameterBlock) -> None:
        self.params, self.calls = params, []

    def current_device(self) -> int:
        return 0

    def launch_kernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params_address, extra):
        assert params_address == self.params.params_address and extra is None
        self.calls.append(((function, gx, gy, gz, bx, by, bz, shared, stream), self.params.raw()))
        return 0


def test_gpu_launch_path_hands_the_driver_the_packed_block(monkeypatch):
    from baracuda_numba import launch

    monkeypatch.setattr(launch, "SIMULATOR", False)
    types = (np.int64, np.float32)
    launcher = launch.KernelLauncher(lambda: None, 1, types)
    driver = _RecordingDriver(launcher.params)
    monkeypatch.setattr(launch, "_driver", lambda: driver)
    monkeypatch.setattr(launcher, "_function", lambda device_id: 0xF00)
    launcher.params.set_template((0, 0, 16, 1, 0, 16, 1, 7, np.float32(0)), (4,), (8,), np.float32)
    launcher.launch_patched(3, 128, 0x5, (0xABC,), (np.float32(2.5),))
    launcher.launch_values(4, 64, 0, (0, 0, 16, 1, 0xDEF, 16, 1, 9, np.float32(-1)))
    launcher.launch_patched(3, 128, 0x5, (0x123,), (np.float32(0.5),))
    expected = ParameterBlock(1, types)
    raws = []
    for values in ((0, 0, 16, 1, 0xABC, 16, 1, 7, np.float32(2.5)), (0, 0, 16, 1, 0xDEF, 16, 1, 9, np.float32(-1)),
                   (0, 0, 16, 1, 0x123, 16, 1, 7, np.float32(0.5))):
        expected.pack(values)
        raws.append(expected.raw())
    assert [call[0] for call in driver.calls] == [(0xF00, 3, 1, 1, 128, 1, 1, 0, 0x5), (0xF00, 4, 1, 1, 64, 1, 1, 0, 0),
                                                  (0xF00, 3, 1, 1, 128, 1, 1, 0, 0x5)]
    assert [call[1] for call in driver.calls] == raws
