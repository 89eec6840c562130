"""The warpgroup (``wgmma``, sm_90a) prefill GEMM on the GPU: its shapes against the ``mma.sync``
pipeline and ``torch._int_mm``, bit for bit and in GPU time. One run, one log.

    python -m benchmarks.tune_wgmma [--shapes 256x4,128x5,64x8w1 ...] [--sass DIR] [--mid] [--rows MxNxK,...]
                                    [--unaligned]

- exactness: every shape's output against the pipelined kernel's and against ``torch._int_mm`` followed
  by the epilogue as separately rounded float32 operations, bit for bit, at ragged shapes (``M``, ``N``
  not multiples of the tile, ``K`` not a multiple of 128), bf16 / f16 / f32 outputs, with and without
  bias, per-token and per-tensor activation scales;
- GPU time at the prefill shapes of issue 11: ten calls in a CUDA graph, median of the replays, the
  same for ``torch._int_mm`` alone and with its dequant epilogue, and the device copy in the same run;
- ``--mid``: the batch sizes between decode and prefill instead (M = 32 .. 512), where the selected plan's
  kernel (the skinny one up to ``SKINNY_MAX_M``) is timed beside every shape forced on;
- ``--rows``: those problems only; ``--unaligned``: for batches up to ``SKINNY_MAX_M`` also the kernel that
  misaligned operands take (the tiled one past ``HOPPER_MIN_M``) beside the skinny kernel's byte path;
- ``--sass DIR``: ``cuobjdump -sass`` of each shape's cubin (compiled by ptxas from the same PTX) and its
  main-loop instruction mix.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import traceback
from collections import Counter
from pathlib import Path

import torch

import baracuda_numba as bn
from baracuda_numba.kernels import hopper
from baracuda_numba.ops.common import clear_plan_cache
from benchmarks.tune_linear import (
    PREFILL,
    bit_equal,
    copy_gbs,
    expected_output,
    gemm_runner,
    graph_ms,
    prefill_problem,
    problem,
)

SMALL = [(128, 4096, 4096), (256, 4096, 4096), (512, 4096, 4096), (1024, 4096, 4096), (512, 11008, 4096)]
MID = [(m, 4096, 4096) for m in (32, 64, 96, 128, 192, 256, 384, 512)] + [
    (m, 11008, 4096) for m in (64, 128, 256)] + [(m, 4096, 11008) for m in (64, 128, 256)]
RAGGED = [(33, 200, 4096), (65, 264, 512), (333, 264, 208), (200, 336, 4096), (257, 4096, 11008), (129, 520, 144),
          (4096, 4096, 4096)]


SHIPPED = (hopper.WGMMA, hopper.WGMMA_NARROW, hopper.WGMMA_SMALL)


def use(shape: hopper.WgmmaShape | str | None) -> None:
    """Newly selected plans take ``shape`` everywhere, at every M (None: the mma.sync pipeline; "selected":
    the library's own choices, the skinny kernel up to ``SKINNY_MAX_M`` included)."""
    import baracuda_numba.plans.linear as plans_linear
    from baracuda_numba.kernels.linear import SKINNY_MAX_M

    plans_linear.SKINNY_MAX_M = SKINNY_MAX_M if shape == "selected" else 0
    plans_linear.HOPPER_GEMM = shape is not None
    hopper.WGMMA, hopper.WGMMA_NARROW, hopper.WGMMA_SMALL = (SHIPPED if shape in (None, "selected")
                                                            else (shape, None, ()))
    clear_plan_cache()


def parse(text: str) -> hopper.WgmmaShape:
    """``NxS[bB][wW]``: tile_n N, S stages, launch bounds of B blocks per multiprocessor, W warpgroups (64 rows
    each; 2 unless given)."""
    match = re.fullmatch(r"(\d+)x(\d+)(?:b(\d+))?(?:w(\d+))?", text)
    if match is None:
        raise SystemExit(f"--shapes: {text!r} is not NxS[bB][wW]")
    n, stages, blocks, warpgroups = match.groups()
    return hopper.WgmmaShape(tile_n=int(n), stages=int(stages), min_blocks=int(blocks or 1),
                             warpgroups=int(warpgroups or 2))


def exactness(shapes) -> bool:
    ok = True
    for shape in shapes:
        good = total = 0
        for m, n, k in RAGGED:
            for dtype, with_bias, tensor_rows in ((torch.bfloat16, False, False), (torch.float32, True, False),
                                                  (torch.float16, True, True)):
                try:
                    x, w, ws, bias = problem(m, n, k, seed=m + n + k)
                    r = bn.dynamic_range_quantize(x.to(torch.float32))
                    sx = r.scale.float()
                    if tensor_rows:  # one activation scale for every row, not exact in binary
                        sx = torch.full_like(sx, 0.0123)
                    b = bias if with_bias else None
                    out = torch.empty(m, n, device="cuda", dtype=dtype)
                    ref = torch.empty_like(out)
                    use(shape)
                    gemm_runner(r.q, sx, w, ws, b, out)()
                    use(None)
                    gemm_runner(r.q, sx, w, ws, b, ref)()
                    torch.cuda.synchronize()
                    same = bit_equal(out, ref) and bit_equal(out, expected_output(r.q, sx, w, ws, b, dtype))
                except Exception:
                    traceback.print_exc()
                    same = False
                total += 1
                good += same
                if not same:
                    print(f"MISMATCH {shape.name} {m}x{n}x{k} {dtype} bias={with_bias} constant_scale={tensor_rows}",
                          flush=True)
        print(f"exactness wgmma {shape.name}: {good}/{total} bit-identical to pipelined and torch", flush=True)
        ok &= good == total
    return ok


def diagnose(shape: hopper.WgmmaShape) -> None:
    """Raw accumulators (f32 output, unit scales: exact below 2**24) of one block's tile against
    ``torch._int_mm``; on a mismatch, where a few of our values sit in the reference (layout debugging)."""
    use(shape)
    for k in (32, 128, 256):
        m, n = 128, shape.tile_n
        g = torch.Generator(device="cuda").manual_seed(k)
        xq = torch.randint(-128, 128, (m, k), device="cuda", generator=g, dtype=torch.int8)
        w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
        ones_m, ones_n = torch.ones(m, device="cuda"), torch.ones(n, device="cuda")
        out = torch.empty(m, n, device="cuda", dtype=torch.float32)
        try:
            gemm_runner(xq, ones_m, w, ones_n, None, out)()
            torch.cuda.synchronize()
        except Exception:
            traceback.print_exc()
            continue
        ref = (xq.double() @ w.double().t()).float()
        bad = (out != ref)
        print(f"diagnose {shape.name} K={k}: {int(bad.sum())} of {bad.numel()} differ", flush=True)
        if bad.any():
            ours, theirs = out.cpu().numpy(), ref.cpu().numpy()
            for r, c in [(0, 0), (0, 1), (0, 2), (0, 8), (1, 0), (8, 0), (16, 0), (64, 0), (0, 64), (0, 128),
                         (5, 19)]:
                if c >= n:
                    continue
                where = list(zip(*(theirs == ours[r, c]).nonzero(), strict=False))[:3]
                print(f"  ours[{r},{c}] = {ours[r, c]:.0f} (ref {theirs[r, c]:.0f}) found in ref at {where}",
                      flush=True)


def unaligned_timing(row: dict, m: int, n: int, k: int, xq, sx, w, ws, out) -> None:
    """Misaligned operands past ``HOPPER_MIN_M`` tokens: the tiled kernel the selection falls back to beside the
    skinny kernel's byte path (what the same batch took before session 35), both forced on aligned operands."""
    import baracuda_numba.plans.linear as plans_linear
    from baracuda_numba.kernels.linear import SKINNY_MAX_M

    if m > SKINNY_MAX_M:
        return
    flops = 2 * m * n * k
    use("selected")
    row["tiled"] = flops / graph_ms(gemm_runner(xq, sx, w, ws, None, out, variant="tiled")) / 1e9
    saved, plans_linear.HOPPER_MIN_M = plans_linear.HOPPER_MIN_M, SKINNY_MAX_M
    clear_plan_cache()
    try:
        row["skinny_bytes"] = flops / graph_ms(gemm_runner(xq, sx, w, ws, None, out, variant="skinny")) / 1e9
    finally:
        plans_linear.HOPPER_MIN_M = saved
        clear_plan_cache()


def timing(shapes, copy: float, problems=PREFILL + SMALL, unaligned: bool = False) -> list[dict]:
    rows = []
    for m, n, k in problems:
        xq, sx, w, ws, raw_tops, epi_tops = prefill_problem(m, n, k)
        flops = 2 * m * n * k
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        row = {"shape": f"{m}x{n}x{k}", "int_mm": raw_tops, "int_mm_epi": epi_tops}
        use("selected")
        row["selected"] = flops / graph_ms(gemm_runner(xq, sx, w, ws, None, out)) / 1e9
        use(None)
        row["pipelined"] = flops / graph_ms(gemm_runner(xq, sx, w, ws, None, out)) / 1e9
        for shape in shapes:
            use(shape)
            try:
                row[shape.name] = flops / graph_ms(gemm_runner(xq, sx, w, ws, None, out)) / 1e9
            except Exception as exc:
                row[shape.name] = repr(exc)[:120]
        best = max((v for key, v in row.items() if key not in ("shape", "int_mm", "int_mm_epi", "pipelined", "selected")
                    and isinstance(v, float)), default=0.0)
        if unaligned:
            unaligned_timing(row, m, n, k, xq, sx, w, ws, out)
        row["best_vs_int_mm_epi"] = best / row["int_mm_epi"]
        row["best_vs_int_mm"] = best / row["int_mm"]
        print(json.dumps(row, default=lambda v: round(v, 2)), flush=True)
        rows.append(row)
    use("selected")
    return rows


def sass(shapes, out_dir: Path) -> None:
    from baracuda_numba.vocabulary import ElementKind

    out_dir.mkdir(parents=True, exist_ok=True)
    for shape in shapes:
        kernel = hopper.wgmma_kernel(ElementKind.BF16, False, False, shape)
        ptx_path = out_dir / f"wgmma_{shape.name}.ptx"
        ptx_path.write_text(kernel.ptx())
        cubin = out_dir / f"wgmma_{shape.name}.cubin"
        info = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(ptx_path), "-o", str(cubin)],
                              capture_output=True, text=True)
        print(f"ptxas {shape.name}: " + " | ".join(line.strip() for line in info.stderr.splitlines()
                                                  if "Used" in line or "spill" in line or "arn" in line), flush=True)
        text = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True).stdout
        (out_dir / f"wgmma_{shape.name}.sass").write_text(text)
        print(f"sass {shape.name}: kernel {mix_of(instructions(text))}; main loop {main_loop(text)}", flush=True)


def instructions(text: str) -> list[tuple[int, str]]:
    """``(address, instruction)`` of every SASS line (predicate dropped)."""
    found = []
    for line in text.splitlines():
        match = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if match:
            words = match.group(2).split()
            if words and words[0].startswith("@"):
                words = words[1:]
            if words:
                found.append((int(match.group(1), 16), " ".join(words)))
    return found


def mix_of(body: list[tuple[int, str]]) -> dict:
    ops = Counter(op.split()[0].split(".")[0] for _, op in body)
    keep = ("HGMMA", "IGMMA", "IMMA", "LDGSTS", "LDSM", "BAR", "WARPGROUP", "DEPBAR", "LDG", "STG", "STS", "LDS")
    return {op: ops[op] for op in keep if ops.get(op)} | {"instructions": len(body)}


def main_loop(text: str) -> dict:
    """The mix of the innermost backward branch's body that holds the IGMMAs (the k loop)."""
    code = instructions(text)
    best = None
    for address, op in code:
        match = re.match(r"BRA (?:\S+ )?0x([0-9a-f]+)", op)
        if match and int(match.group(1), 16) < address:
            body = [(a, o) for a, o in code if int(match.group(1), 16) <= a <= address]
            if any(o.startswith("IGMMA") for _, o in body) and (best is None or len(body) < len(best)):
                best = body
    return mix_of(best) if best else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="256x4,128x5,128x4,256x3", help="tile_n x stages, comma-separated")
    parser.add_argument("--sass", type=Path, default=None)
    parser.add_argument("--skip-exact", action="store_true")
    parser.add_argument("--mid", action="store_true", help="time the batch sizes between decode and prefill")
    parser.add_argument("--rows", default=None, help="MxNxK problems to time instead, comma-separated")
    parser.add_argument("--unaligned", action="store_true",
                        help="also time the misaligned-operand kernels of batches up to SKINNY_MAX_M")
    args = parser.parse_args()
    shapes = [parse(s) for s in args.shapes.split(",")]
    print(f"device {torch.cuda.get_device_name()}", flush=True)
    if args.sass is not None:
        sass(shapes, args.sass)
    diagnose(shapes[0])
    if not args.skip_exact:
        exactness(shapes)
    copy = copy_gbs()
    print(f"copy {copy:.0f} GB/s", flush=True)
    problems = MID if args.mid else PREFILL + SMALL
    if args.rows:
        problems = [tuple(int(v) for v in row.split("x")) for row in args.rows.split(",")]
    timing(shapes, copy, problems, args.unaligned)


if __name__ == "__main__":
    main()
