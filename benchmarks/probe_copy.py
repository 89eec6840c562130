"""Which device-to-device copy is the ceiling: the same bytes copied in the ways the scripts time them.

    python -m benchmarks.probe_copy [--out DIR]

``baracuda_numba.bench`` times an eager ``copy_`` of 2^28 float32 (queued behind a busy wait, device
events, median); ``benchmarks.tune_linear`` timed a 1 GiB ``uint8`` ``copy_`` captured in a CUDA graph.
A memcpy captured in a graph becomes a memcpy node, which the driver may run differently from the
eager call. This prints each way's GB/s (bytes read plus bytes written) side by side, with an
elementwise kernel's copy (``torch.mul(src, 1, out=dst)``, a kernel on the SMs either way) and a
read-only reduction (``torch.sum``, bytes read), eager and in a graph.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from baracuda_numba.bench import device_ms
from benchmarks.tune_linear import graph_ms


def large(dtype: torch.dtype) -> list[tuple[str, float]]:
    """GB/s of 1 GiB of ``dtype`` copied (and, for float32, multiplied by one and summed) both ways."""
    gib = 1 << 30
    src = torch.ones(gib // torch.tensor([], dtype=dtype).element_size(), dtype=dtype, device="cuda")
    dst = torch.empty_like(src)
    name = str(dtype).replace("torch.", "")
    ways = [(f"copy_ 1 GiB {name}", 2, lambda: dst.copy_(src))]
    if dtype is torch.float32:
        ways += [("mul(src, 1, out=dst) 1 GiB float32", 2, lambda: torch.mul(src, 1.0, out=dst)),
                 ("sum 1 GiB float32 (bytes read)", 1, src.sum)]
    rows = []
    for label, passes, fn in ways:
        rows.append((f"{label}, eager", passes * gib / device_ms(fn, 20) / 1e6))
        rows.append((f"{label}, graph (5 calls)", passes * gib / graph_ms(fn, 5, 10) / 1e6))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/probe_copy")
    args = parser.parse_args()
    rows = large(torch.float32) + large(torch.uint8)
    torch.cuda.empty_cache()
    # the decode weights' size: 16 MiB, eight buffers rotating past L2 (as tune_linear's decode rows)
    size = 16 << 20
    pairs = [(torch.ones(size, dtype=torch.uint8, device="cuda"), torch.empty(size, dtype=torch.uint8, device="cuda"))
             for _ in range(8)]
    turn = iter(range(1 << 62))

    def copy_next() -> None:
        src, dst = pairs[next(turn) % len(pairs)]
        dst.copy_(src)

    rows.append(("copy_ 16 MiB uint8 x 8 rotating, graph (80 calls)", 2 * size / graph_ms(copy_next, 80, 15) / 1e6))
    width = max(len(label) for label, _ in rows)
    print(torch.cuda.get_device_name())
    for label, gbs in rows:
        print(f"{label:<{width}}  {gbs:7.0f} GB/s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_copy.json").write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                     "GB/s": dict(rows)}, indent=1))


if __name__ == "__main__":
    main()
