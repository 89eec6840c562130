"""Shared test configuration. The suite runs unchanged under the CUDA simulator and on a GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import baracuda_numba as bn
from baracuda_numba import platform

SIMULATOR = platform.SIMULATOR

# The simulator runs one Python thread per CUDA thread: fewer, smaller examples there. It is the CI
# profile, so it is also derandomized (the same examples on every run: a run's result depends on the
# commit, never on the draw or on the machine's load) and keeps no example database between runs;
# no deadline and no speed health check, so a loaded 2-core machine cannot fail a test by slowness.
# The GPU profile keeps exploring: many more random examples per run.
_NOT_SPEED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("simulator", max_examples=40, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_NOT_SPEED)
settings.register_profile("gpu", max_examples=400, deadline=None, suppress_health_check=_NOT_SPEED)
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


def pytest_collection_modifyitems(config, items):
    """``BARACUDA_TEST_SHARD=i/n`` keeps every n-th collected test from the i-th (0-based).

    Where a GPU run has a wall-clock limit, the suite runs in shards (one per GPU, or one after another), each
    short enough to print its own summary. Interleaving spreads each file's slow cases over the shards.
    """
    shard = os.environ.get("BARACUDA_TEST_SHARD")
    if not shard:
        return
    index, count = (int(part) for part in shard.split("/"))
    config.hook.pytest_deselected(items=[item for position, item in enumerate(items) if position % count != index])
    items[:] = [item for position, item in enumerate(items) if position % count == index]


def simulator_keeps(cases: list, *keep: int) -> list:
    """``cases`` (parametrize values) with every case but those at the indices ``keep`` skipped on the simulator.

    For kernel-variant tables whose every case compiles and runs a kernel of its own: each case costs tens of
    seconds of a Python thread per CUDA thread there, and the CI machine's suite must stay within its time. The
    kept cases cover each kind in the table (the comment at the call says which); the GPU runs every case.
    """
    skip = pytest.mark.skipif(SIMULATOR, reason="one case of each kind on the simulator; the GPU runs every case")
    out = []
    for index, case in enumerate(cases):
        values = case if isinstance(case, tuple) else (case,)
        out.append(case if index in keep else pytest.param(*values, marks=skip))
    return out
