"""Importing the package has no process-wide side effects (baracuda_numba/platform.py's docstring): the
environment stays as the user left it, and the CUDA driver is not initialized until an op needs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from baracuda_numba import platform

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, **env: str | None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter that imports this checkout, with ``env`` over the current
    environment (None removes a variable)."""
    environ = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    environ["PYTHONPATH"] = ROOT + os.pathsep + environ.get("PYTHONPATH", "")
    for name, value in env.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    with tempfile.TemporaryDirectory() as scratch:  # a script file, so that warnings can quote its lines
        script = os.path.join(scratch, "user.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(code))
        done = subprocess.run([sys.executable, script], capture_output=True, text=True, env=environ, timeout=300,
                              cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done


def test_import_leaves_the_environment_as_it_was_and_children_decide_for_themselves():
    done = _python("""
        import json, os, subprocess, sys
        before = dict(os.environ)
        import baracuda_numba
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('NUMBA_ENABLE_CUDASIM'))"],
                               capture_output=True, text=True).stdout.strip()
        print(json.dumps({"same": dict(os.environ) == before, "child": child,
                          "simulator": baracuda_numba.platform.SIMULATOR}))
    """)
    result = json.loads(done.stdout)
    assert result["same"] and result["child"] == "None"
    assert result["simulator"] == (platform.probe() is not None)


def test_import_without_a_gpu_warns_nothing_and_the_first_op_warns_once_at_the_callers_line():
    if platform.probe() is None:
        pytest.skip("a GPU is present: no simulator warning")
    done = _python("""
        import numpy as np
        import baracuda_numba as bn
        print("imported")
        bn.quantize_per_tensor(np.ones(4, np.float32), 0.5)  # the caller's line
        bn.quantize_per_tensor(np.ones(4, np.float32), 0.5)
    """)
    assert done.stdout.split() == ["imported"]
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    assert "user.py:5: RuntimeWarning: baracuda_numba: no CUDA GPU found (" in lines[0]
    assert lines[1].strip() == "bn.quantize_per_tensor(np.ones(4, np.float32), 0.5)  # the caller's line"


def test_numba_cuda_sim_set_by_the_user_is_followed_silently():
    done = _python("""
        import numpy as np
        import baracuda_numba as bn
        bn.quantize_per_tensor(np.ones(4, np.float32), 0.5)
        print(bn.platform.SIMULATOR)
    """, NUMBA_ENABLE_CUDASIM="1")
    assert done.stdout.split() == ["True"] and done.stderr == ""


# A stand-in for a machine with a driver and two GPUs: libcuda.so.1 loads but records every function
# looked up in it; NVML reports two devices.
_FAKE_GPU_MACHINE = """
    import ctypes
    real_cdll, touched = ctypes.CDLL, []

    class FakeLibcuda:
        def __getattr__(self, name):
            touched.append(name)
            raise AttributeError(name)

    class FakeNvml:
        def nvmlInit_v2(self):
            return 0

        def nvmlDeviceGetCount_v2(self, count):
            count._obj.value = 2
            return 0

        def nvmlShutdown(self):
            return 0

    def cdll(name, *args, **kwargs):
        if name == "libcuda.so.1":
            return FakeLibcuda()
        if name == "libnvidia-ml.so.1":
            return FakeNvml()
        return real_cdll(name, *args, **kwargs)

    ctypes.CDLL = cdll
"""


def test_the_probe_reads_nvml_and_never_calls_into_the_driver():
    done = _python(textwrap.dedent(_FAKE_GPU_MACHINE) + textwrap.dedent("""
        import json, os
        before = dict(os.environ)
        import baracuda_numba
        from baracuda_numba import platform
        print(json.dumps({"simulator": platform.SIMULATOR, "touched": touched, "same": dict(os.environ) == before,
                          "hidden": platform.probe({"CUDA_VISIBLE_DEVICES": ""}),
                          "second": platform.probe({"CUDA_VISIBLE_DEVICES": "1"}),
                          "out_of_range": platform.probe({"CUDA_VISIBLE_DEVICES": "2,0"})}))
    """))
    result = json.loads(done.stdout)
    assert result["simulator"] is False and result["same"]
    assert result["touched"] == []  # no cuInit, no cuDeviceGetCount: nothing looked up in libcuda
    assert result["second"] is None
    assert "hides every GPU" in result["hidden"] and "hides every GPU" in result["out_of_range"]


def test_importing_the_package_on_the_gpu_path_does_not_initialize_numbas_driver():
    # numba.cuda imported first (real driver API, rule 1 of platform.py): our import must not make numba
    # initialize its driver (cuInit), which would break fork-based worker pools.
    done = _python("""
        from numba.cuda.cudadrv import driver
        calls = []
        original = driver.Driver.ensure_initialized
        driver.Driver.ensure_initialized = lambda self: calls.append(1) or original(self)
        import baracuda_numba
        print(baracuda_numba.platform.SIMULATOR, len(calls))
    """, NUMBA_ENABLE_CUDASIM="0")
    assert done.stdout.split() == ["False", "0"]


@pytest.mark.parametrize(("devices", "visible", "count"), [
    (2, None, 2), (2, "", 0), (2, "0", 1), (2, "1,0", 2), (2, "0,5,1", 1), (2, "-1", 0), (2, "GPU-abc", 1),
    (1, "0,1", 1), (2, "x", 0)])
def test_cuda_visible_devices_is_read_as_the_runtime_reads_it(devices, visible, count):
    assert platform._visible_count(devices, visible) == count


_DRIVER_STATE = """
    import numpy as np
    from cuda.bindings import driver

    def context_state():
        error, context = driver.cuCtxGetCurrent()
        return error.name, bool(int(context)) if error == driver.CUresult.CUDA_SUCCESS else False
"""


@pytest.mark.gpu
@pytest.mark.skipif(platform.SIMULATOR, reason="needs a real GPU: the CUDA driver's state is what is checked")
def test_on_a_gpu_import_leaves_the_driver_uninitialized_until_the_first_op_and_fork_works():
    done = _python(textwrap.dedent(_DRIVER_STATE) + textwrap.dedent("""
        import os
        import baracuda_numba as bn
        print("after import", *context_state())
        pid = os.fork()
        if pid == 0:  # a forked worker: CUDA works in it only if the parent never initialized the driver
            q = bn.quantize_per_tensor(np.array([0.5, -1.0], np.float32), 0.25)
            os._exit(0 if q.tolist() == [2, -4] else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        bn.quantize_per_tensor(np.ones(4, np.float32), 0.5)
        print("after op", *context_state())
    """))
    assert done.stdout.splitlines() == ["after import CUDA_ERROR_NOT_INITIALIZED False", "child 0",
                                        "after op CUDA_SUCCESS True"]
