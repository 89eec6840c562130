"""Shared test configuration. The suite runs unchanged under the CUDA simulator and on a GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import baracuda_numba as bn
from baracuda_numba import platform

SIMULATOR = platform.SIMULATOR

# The simulator runs one Python thread per CUDA thread: fewer, smaller examples there.
settings.register_profile("simulator", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("gpu", max_examples=400, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
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
