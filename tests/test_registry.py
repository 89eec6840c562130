"""The registry and its generated catalogue."""

from __future__ import annotations

from pathlib import Path

import pytest

import baracuda_numba as bn
from baracuda_numba import catalog, registry
from baracuda_numba.vocabulary import ElementKind as E
from baracuda_numba.vocabulary import MathPrecision
from baracuda_numba.vocabulary import QuantizeKind as K

ROOT = Path(__file__).resolve().parents[1]


def test_entries_are_unique_and_consistent():
    entries = registry.entries()
    assert len({e.key for e in entries}) == len(entries)
    for e in entries:
        assert e.sku.op is e.kind and e.sku.element is e.input_element
        guarantee = e.sku.precision_guarantee
        if isinstance(e, registry.LinearEntry):
            # The GEMM multiplies int8 by int8 into int32 whatever the activation dtype.
            assert guarantee.math_precision is MathPrecision.INT32 and guarantee.accumulator is E.I32
        else:
            assert guarantee.math_precision is e.input_element.math_precision
        assert registry.lookup(*e.key) is e


def test_lookup_unsupported_names_the_caller_and_lists_pairs():
    with pytest.raises(bn.Unsupported) as info:
        registry.lookup(K.PER_TENSOR, E.S8, E.F32, where="MyPlan")
    assert str(info.value).startswith("MyPlan: (input_element, output_element) expected one of [")
    assert "got s8->f32" in str(info.value)


def test_catalogue_is_up_to_date():
    for name, text in (("catalog.json", catalog.render_json()), ("README.md", catalog.render_markdown())):
        path = ROOT / "registry" / name
        assert path.exists(), f"{path} missing: run `baracuda-numba catalog`"
        assert path.read_text() == text, f"{path} is stale: run `baracuda-numba catalog`"


def test_catalogue_lists_every_entry():
    records = catalog.catalog_records()
    assert len(records) == len(registry.entries())
    assert {r["sku"] for r in records} == {str(e.sku) for e in registry.entries()}
