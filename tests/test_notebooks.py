"""Every notebook runs top to bottom (small sizes under the simulator) and is committed either without
outputs or with the outputs of one clean run, top to bottom (a GPU run, for readers browsing them)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook support is in the [test] extra")
nbclient = pytest.importorskip("nbclient", reason="notebook support is in the [test] extra")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_outputs_are_from_one_clean_run(path):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    counts = [cell.execution_count for cell in code]
    # committed with the outputs of one run, top to bottom, on a GPU (a reader browsing them sees results)
    assert counts == list(range(1, len(code) + 1)), f"{path.name}: outputs of one run, top to bottom, expected"
    text = " ".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", "")) for cell in code
                    for o in cell.outputs)
    assert "NVIDIA" in text, f"{path.name}: outputs of a run on a GPU (the device printed) expected"
    errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: committed with an error output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("BARACUDA_NOTEBOOK_SMALL", os.environ.get("BARACUDA_NOTEBOOK_SMALL", "1"))
    notebook = nbformat.read(path, as_version=4)
    for module in ("torch", "transformers"):  # notebook 06 needs the [test-torch] extra
        if any(re.search(rf"^import {module}$", c.source, re.M) for c in notebook.cells if c.cell_type == "code"):
            pytest.importorskip(module, reason=f"{path.name} needs {module}")
    # generous timeouts: a loaded 2-core CI machine starts kernels and simulates cells slowly
    client = nbclient.NotebookClient(notebook, timeout=1200, startup_timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
