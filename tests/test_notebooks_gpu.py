"""The notebooks' code, top to bottom at full size, on the GPU (no Jupyter needed: the .ipynb is JSON)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import requires_gpu

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
pytestmark = requires_gpu


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_code_runs_at_full_size_on_the_gpu(path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("BARACUDA_NOTEBOOK_SMALL", "0")
    cells = json.loads(path.read_text())["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for module in ("torch", "transformers"):  # notebook 06 needs the [test-torch] extra
        if re.search(rf"^import {module}$", source, re.M):
            pytest.importorskip(module, reason=f"{path.name} needs {module}")
    exec(compile(source, str(path), "exec"), {"__name__": "__notebook__"})
