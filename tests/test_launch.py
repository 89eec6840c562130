"""The host side of a launch, which the simulator never runs: the parameter block a GPU launch
hands ``cuLaunchKernel`` (checked with a recording stand-in for libcuda), and scalar scale checks."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import baracuda_numba as bn
from baracuda_numba import launch
from baracuda_numba.plans.base import checked_scale


class _RecordingDriver:
    """Stands in for libcuda: records each cuLaunchKernel call and the parameter bytes it points at."""

    def __init__(self, launcher: launch.KernelLauncher) -> None:
        self.launcher, self.calls = launcher, []

    def current_device(self) -> int:
        return 0

    def launch_kernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params_address, extra):
        assert params_address == self.launcher._params_address and extra is None
        self.calls.append(((function, gx, gy, gz, bx, by, bz, shared, stream), self.launcher._buffer.raw))
        return 0


def _gpu_launcher(monkeypatch, n_arrays, scalar_types):
    monkeypatch.setattr(launch, "SIMULATOR", False)
    launcher = launch.KernelLauncher(lambda: None, n_arrays, scalar_types)
    driver = _RecordingDriver(launcher)
    monkeypatch.setattr(launch, "_driver", lambda: driver)
    monkeypatch.setattr(launcher, "_function", lambda device_id: 0xF00)
    return launcher, driver


@given(st.integers(0, 2**62), st.integers(0, 2**40), st.integers(-(2**62), 2**62),
       st.floats(width=32, allow_nan=False), st.floats(allow_nan=False), st.booleans())
def test_gpu_launch_hands_the_driver_numbas_array_abi_and_scalar_slots(ptr, nitems, count, f32, f64, flag):
    with pytest.MonkeyPatch.context() as monkeypatch:
        launcher, driver = _gpu_launcher(monkeypatch, 2, (np.int64, np.float32, np.float64, np.bool_))
        arrays = (launch.ArrayArg(ptr, nitems, 4), launch.ArrayArg(ptr + 16, 3, 1))
        launcher.launch(7, 256, 0x5, arrays, (count, np.float32(f32), f64, flag))
    (config, raw), = driver.calls
    assert config == (0xF00, 7, 1, 1, 256, 1, 1, 0, 0x5)
    # numba's 1-D array: meminfo, parent, nitems, itemsize, data, shape[0], strides[0]; one 8-byte slot
    # per scalar, a float32 in the first four bytes of its slot
    slots = [raw[8 * i: 8 * i + 8] for i in range(len(raw) // 8)]
    assert struct.unpack("<7q", b"".join(slots[:7])) == (0, 0, nitems, 4, ptr, nitems, 4)
    assert struct.unpack("<7q", b"".join(slots[7:14])) == (0, 0, 3, 1, ptr + 16, 3, 1)
    assert struct.unpack("<q", slots[14])[0] == count
    assert struct.unpack("<f", slots[15][:4])[0] == np.float32(f32)
    assert struct.unpack("<d", slots[16])[0] == f64
    assert slots[17][0] == int(flag)


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
