"""The registry and its generated catalogue."""

from __future__ import annotations

from pathlib import Path

import pytest

import baracuda_numba as bn
from baracuda_numba import catalog, registry
from baracuda_numba.vocabulary import ArchSku, MathPrecision
from baracuda_numba.vocabulary import ElementKind as E
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


def _skus(entry):
    """The SKUs an entry registers: its variants' where it has several kernels, else its own."""
    return [v.sku for v in getattr(entry, "variants", ())] or [entry.sku]


def test_catalogue_lists_every_entry():
    records = catalog.catalog_records()
    assert len(records) == sum(len(_skus(e)) for e in registry.entries())
    assert [r["sku"] for r in records] == [str(sku) for e in registry.entries() for sku in _skus(e)]
    assert len({r["sku"] for r in records}) == len(records)


def test_the_linear_entries_list_their_kernels():
    """Every W8A8 entry lists the GEMM's kernels with their architecture (the warpgroup kernel sm_90a, the decode
    kernels launched as programmatic dependents sm_90, the mma.sync ones sm_80) and their name as the SKU's last
    part; SmoothQuant's (int8 activations) have no fused quantizing kernel."""
    arch = {"tiled": ArchSku.SM80, "pipelined": ArchSku.SM80, "wgmma": ArchSku.SM90A, "skinny": ArchSku.SM80,
            "skinny_vector": ArchSku.SM90, "fused": ArchSku.SM90}
    linear = [e for e in registry.entries() if isinstance(e, registry.LinearEntry)]
    assert len(linear) == 8
    for entry in linear:
        names = [v.name for v in entry.variants]
        expected = [n for n in arch if n != "fused" or entry.input_element is not E.S8]
        assert names == expected
        for variant in entry.variants:
            assert variant.sku.arch is arch[variant.name] and str(variant.sku).endswith("/" + variant.name)
            assert variant.sku.precision_guarantee == entry.sku.precision_guarantee
            assert entry.variant_sku(variant.name) is variant.sku
