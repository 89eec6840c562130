"""Packaging facts the README and CI rely on: bounded dependencies, none unused, licence files shipped, the test
extra complete, and .ci/run running the README's two commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DEMO = 'python -m pip install -e . && baracuda-numba demo'
TESTS = 'python -m pip install -e ".[test,test-torch]" && python -m pytest -q -n auto'


def _requirement(name: str, requirements: list[str]) -> str:
    found = [r for r in requirements if re.match(rf"{re.escape(name)}\s*[<>=!~\[;]", r) or r == name]
    assert len(found) == 1, (name, requirements)
    return found[0]


def test_dependencies_are_bounded_and_each_is_used():
    deps = PROJECT["dependencies"]
    assert _requirement("cuda-bindings", deps) == "cuda-bindings>=12.9.1,<14"  # numba-cuda 0.30 needs >= 12.9.1
    assert _requirement("numba", deps) == "numba>=0.61,<0.69"
    assert "<2.5" in _requirement("numpy", deps)
    # cuda-core is declared exactly when the package imports it (the kernel cache loads cubins through it).
    sources = [p.read_text() for p in (ROOT / "baracuda_numba").rglob("*.py")]
    imports_core = any(re.search(r"^\s*(import cuda\.core|from cuda\.core|from cuda import core)", s, re.M)
                       for s in sources)
    assert imports_core
    assert _requirement("cuda-core", deps) == "cuda-core>=0.5.1,<2"
    assert set(PROJECT["optional-dependencies"]) >= {"cu12", "cu13", "test", "test-torch", "torch", "notebooks"}
    assert _requirement("torch", PROJECT["optional-dependencies"]["torch"]) == "torch>=2.11"


def test_the_test_extra_holds_what_the_suite_imports():
    test = PROJECT["optional-dependencies"]["test"]
    for name in ("pytest", "pytest-xdist", "hypothesis", "ruff", "nbclient", "nbformat", "ipykernel", "matplotlib"):
        _requirement(name, test)


def test_licence_files_exist_and_are_declared_for_the_wheel():
    assert PROJECT["license"] == "MIT OR Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE-MIT", "LICENSE-APACHE"]
    assert (ROOT / "LICENSE-MIT").read_text().startswith("MIT License")
    apache = (ROOT / "LICENSE-APACHE").read_text().split()
    assert apache[:5] == ["Apache", "License", "Version", "2.0,", "January"] and "END OF TERMS AND CONDITIONS" in \
        " ".join(apache)
    assert any(c.startswith("Programming Language :: Python :: 3") for c in PROJECT["classifiers"])
    assert PROJECT["urls"]


def test_ci_runs_the_readmes_two_commands_in_a_fresh_environment():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv" in ci
    lines = [line.strip() for line in ci.splitlines()]
    assert DEMO in lines and TESTS in lines
    assert lines.index(DEMO) < lines.index(TESTS)
    assert '"$status" -eq 5' in ci  # pytest collecting nothing fails CI


def test_the_readmes_set_up_gives_the_two_commands_ci_runs_and_no_other_install():
    # the README's commands are the ones CI runs (the light install first): a README that went back to installing the
    # test extras for the demo, or to another test command, fails here
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    commands = [line.strip() for block in blocks for line in block.splitlines() if "pip install" in line]
    assert commands[:2] == [DEMO, TESTS], commands
