"""Shared test configuration. The suite runs unchanged under the CUDA simulator and on a GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import baracuda_numba as bn
from baracuda_numba import platform

SIMULATOR = platform.SIMULATOR

# The suite must give the same verdict on every run of a commit, however loaded the machine:
# - derandomize: the examples are a function of the test alone (no random seed, no example database
#   replaying a failure found on another run), so a failure reproduces and a pass stays a pass;
# - deadline=None and every health check off: the checks that time a test or count its generated data
#   (too_slow, data_too_large, filter_too_much, large_base_example) judge the machine's load, not the code.
#   Test-local @settings(max_examples=...) inherit these (they are created after this profile is loaded).
# The simulator runs one Python thread per CUDA thread: fewer examples there. BARACUDA_HYPOTHESIS_PROFILE=explore
# searches with fresh random examples (and a database) when hunting for new failures on purpose.
_STABLE = dict(deadline=None, derandomize=True, database=None, print_blob=True, suppress_health_check=list(HealthCheck))
settings.register_profile("simulator", max_examples=40, **_STABLE)
settings.register_profile("gpu", max_examples=400, **_STABLE)
settings.register_profile("explore", max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("BARACUDA_HYPOTHESIS_PROFILE", "simulator" if SIMULATOR else "gpu"))

FLOAT_DTYPES = {
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f16": np.dtype(np.float16),
    "bf16": bn.ElementKind.BF16.numpy_dtype,
}

requires_gpu = pytest.mark.skipif(SIMULATOR, reason="needs a real GPU: the simulator has no bf16, "
                                                    "no torch CUDA tensors and different NaN/int conversion")


def pytest_report_header(config):
    return f"baracuda-numba backend: {platform.backend_name()}"
