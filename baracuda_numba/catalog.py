"""The registry catalogue (``registry/catalog.json`` and ``registry/README.md``), generated from the
live registry by ``baracuda-numba catalog`` and checked for staleness by the tests."""

from __future__ import annotations

import json
from pathlib import Path

from . import registry

__all__ = ["catalog_records", "render_json", "render_markdown", "write_catalog"]


def catalog_records() -> list[dict]:
    """One JSON-ready record per registered SKU, in registration order: one per entry, and one per kernel
    variant of an entry that has several (the W8A8 GEMM's)."""
    records = []
    for entry in registry.entries():
        variants = getattr(entry, "variants", ())
        for kernel, sku in ([(v.name, v.sku) for v in variants] or [(entry.kernel_name, entry.sku)]):
            guarantee = sku.precision_guarantee
            records.append({
                "kind": entry.kind.name,
                "kind_value": int(entry.kind),
                "input_element": entry.input_element.short,
                "output_element": entry.output_element.short,
                "sku": str(sku),
                "kernel": kernel,
                "scale_mode": entry.scales,
                "math_precision": guarantee.math_precision.value,
                "accumulator": guarantee.accumulator.short,
                "bit_stable_on_same_hardware": guarantee.bit_stable_on_same_hardware,
                "deterministic": guarantee.deterministic,
                "arch": sku.arch.value,
                "backend": sku.backend.value,
            })
    return records


def render_json() -> str:
    return json.dumps({"generated_by": "baracuda-numba catalog", "entries": catalog_records()}, indent=1) + "\n"


def render_markdown() -> str:
    records = catalog_records()
    lines = [
        "# Registered kernels",
        "",
        "Generated from the live registry by `baracuda-numba catalog`; a test fails when it is stale.",
        f"{len(records)} SKUs. For the quantize family `input` is the float element and `output` the",
        "integer element, whichever way the op moves data (as in baracuda-kernels).",
        "",
        "| kind | value | input | output | kernel | scales | math | deterministic | SKU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['kind']} | {r['kind_value']} | {r['input_element']} | {r['output_element']} | {r['kernel']} | "
            f"{r['scale_mode']} | {r['math_precision']} | {'yes' if r['deterministic'] else 'no'} | `{r['sku']}` |"
        )
    return "\n".join(lines) + "\n"


def write_catalog(directory: str | Path) -> list[Path]:
    """Write ``catalog.json`` and ``README.md`` into ``directory``; return their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "catalog.json", directory / "README.md"]
    paths[0].write_text(render_json())
    paths[1].write_text(render_markdown())
    return paths
