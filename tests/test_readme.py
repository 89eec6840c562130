"""README.md and docs/ are true as written: every ```python block of the README runs as pasted (a fresh
namespace each, on the simulator without a GPU) and its ``assert`` lines hold; every relative link points
to a file of the repository; every test named as evidence (docs/semantics.md) exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

_FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _python_blocks() -> list[str]:
    return _FENCE.findall(README.read_text())


def _block_id(index: int) -> str:
    """``block<index>-<the prose line just above the block>``, for readable test ids."""
    text = README.read_text()
    start = list(_FENCE.finditer(text))[index].start()
    above = [line for line in text[:start].splitlines() if line.strip()][-1]
    return f"block{index}-{re.sub(r'[^a-z0-9]+', '_', above.lower()).strip('_')[:40]}"


def test_readme_has_python_blocks_and_at_most_300_lines():
    assert len(_python_blocks()) >= 3
    assert len(README.read_text().splitlines()) <= 300


@pytest.mark.parametrize("index", range(len(_python_blocks())), ids=_block_id)
def test_python_block_runs_as_pasted(index):
    code = _python_blocks()[index]
    if re.search(r"^\s*(import torch|from torch\b|from baracuda_numba\.torch\b)", code, re.M):
        pytest.importorskip("torch", reason="this README block needs PyTorch (the [test-torch] extra)")
    namespace = {"__name__": "__readme__"}
    exec(compile(code, f"README.md python block {index}", "exec"), namespace)


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files(path):
    targets = [t for t in _LINK.findall(path.read_text()) if "://" not in t]
    missing = [t for t in targets if not (path.parent / t).exists()]
    assert not missing, f"{path.name} links to {missing}"


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_tests_named_as_evidence_exist(path):
    # `tests/<file>.py::<test>`, and `::<test>` for another test of the file named last
    current, missing = None, []
    for match in re.finditer(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`", path.read_text()):
        current = match.group(1) or current
        name = match.group(2)
        if current is None or not (ROOT / current).exists():
            missing += [current] if match.group(1) else []
        elif name and not re.search(rf"^\s*def {name}\(", (ROOT / current).read_text(), re.M):
            missing.append(f"{current}::{name}")
    assert not missing, f"{path.name} names tests that do not exist: {missing}"
