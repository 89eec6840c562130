"""The disk cache of compiled kernels on a GPU: a second process running the same W8A8 layers compiles no kernel,
loading every one from the cache (``baracuda_numba.cache``), and computes the same bits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import dataclasses, hashlib, json, time
start = time.perf_counter()
from numba.core import event

compiles = {"cuda": 0, "cpu": 0}


class Count(event.Listener):
    def on_start(self, ev):
        dispatcher = (ev.data or {}).get("dispatcher")
        compiles["cuda" if "CUDA" in type(dispatcher).__name__ else "cpu"] += 1

    def on_end(self, ev):
        pass


event.install_listener("numba:compile", Count())
import torch
from baracuda_numba.cache import kernel_cache
from baracuda_numba.torch import W8A8Linear

torch.manual_seed(0)
digest = hashlib.sha256()
with torch.no_grad():
    for n, k in ((512, 512), (1024, 512), (512, 1024)):
        linear = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
        for activation in ("dynamic", "static"):
            layer = W8A8Linear.from_float(linear, activation=activation, act_scale=0.02)
            for m in (1, 4, 64, 300):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                for _ in range(2):
                    y = layer(x)
                digest.update(y.float().cpu().numpy().tobytes())
torch.cuda.synchronize()
print(json.dumps({"stats": dataclasses.asdict(kernel_cache().stats), "compiles": compiles,
                  "seconds": time.perf_counter() - start, "digest": digest.hexdigest()}))
"""


def _run(directory: Path) -> dict:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # keeps the caller's NumPy
    environ = dict(os.environ, BARACUDA_CACHE_DIR=str(directory), PYTHONPATH=path)
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=environ, cwd=ROOT,
                           timeout=900)
    assert child.returncode == 0, child.stderr[-4000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_no_kernel(tmp_path):
    first = _run(tmp_path)
    second = _run(tmp_path)
    print(f"\nfirst process: {first}\nsecond process: {second}")
    assert first["stats"]["misses"] > 0 and first["stats"]["stores"] == first["stats"]["misses"]
    assert first["stats"]["uncacheable"] == 0
    assert second["stats"]["misses"] == 0 and second["stats"]["hits"] == first["stats"]["misses"]
    assert second["stats"]["corrupt"] == 0
    if first["compiles"]["cuda"]:  # numba reports its CUDA compiles as events: none in the second process
        assert second["compiles"]["cuda"] == 0
    assert second["digest"] == first["digest"]  # the cached kernels compute the same bits
    assert second["seconds"] < first["seconds"]
