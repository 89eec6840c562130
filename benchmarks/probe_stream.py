"""How fast can a decode GEMM's weight stream be read, by access pattern? A GPU probe, no GEMM.

    python -m benchmarks.probe_stream [profile]

(``profile``: one launch of each pattern at 4096 x 4096, for Nsight Compute.)

Each block reads a ``rows x K`` int8 slice of an ``[N, K]`` weight (as the skinny kernel's blocks do)
with 16-byte loads and folds them into one word per thread, so only the read is timed. A warp's load
instruction covers ``32 / lanes`` rows with ``16 * lanes`` contiguous bytes of each (the skinny
kernel's mma layout is ``lanes = 4``: 8 rows x 64 bytes); every thread keeps ``loads`` of them in
flight per iteration. GPU time by CUDA-graph replay with the weights rotating past L2, against a
copy of the same bytes and the 1 GiB copy, as in ``tune_linear``.
"""

from __future__ import annotations

import functools
import itertools
import json
import sys

import numpy as np
import torch
from numba import cuda

from baracuda_numba.kernels import device

from .tune_linear import copy_gbs, graph_ms

SHAPES = [(4096, 4096), (8192, 8192), (11008, 4096)]
# (lanes per row, loads in flight per thread, rows per block, threads per block)
PATTERNS = [(4, 4, 16, 256), (4, 8, 16, 256), (8, 4, 16, 256), (32, 4, 16, 256), (32, 8, 16, 256),
            (4, 4, 32, 256), (32, 4, 32, 256), (4, 4, 8, 128), (32, 4, 8, 128)]


@functools.cache
def reader(lanes: int, loads: int, rows: int, threads: int):
    rows_per_load = 32 // lanes
    groups = rows // rows_per_load  # row groups of the block's slice
    warps = threads // 32

    @cuda.jit("void(uint64[::1], uint64[::1], int64, int64)")
    def kernel(w_pairs, out, N, K):
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        r, p = lane // lanes, lane % lanes
        row0 = cuda.blockIdx.x * rows
        segments = K // (16 * lanes)
        units = groups * segments
        acc = np.uint64(0)
        lo = cuda.local.array(8, np.uint64)
        hi = cuda.local.array(8, np.uint64)
        # unit u: row group u % groups, segment u // groups (every row group of a segment together)
        for first in range(0, units, loads * warps):
            for j in range(loads):
                u = first + j * warps + warp
                lo[j] = hi[j] = np.uint64(0)
                if u < units:
                    row = row0 + (u % groups) * rows_per_load + r
                    k = (u // groups) * 16 * lanes + 16 * p
                    if row < N:
                        lo[j], hi[j] = device.load_u64x2(w_pairs, (row * K + k) // 16)
            for j in range(loads):
                acc ^= lo[j] + hi[j]
        out[cuda.blockIdx.x * threads + tid] = acc

    return kernel


def launch(kernel, blocks: int, threads: int, views, sink, n: int, k: int) -> None:
    """One read of the next weight in ``views`` on torch's current stream (graph capture included)."""
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    kernel[blocks, threads, stream](next(views), sink, n, k)


def profile() -> None:
    w = torch.randint(-128, 128, (4096, 4096), device="cuda", dtype=torch.int8)
    view = cuda.as_cuda_array(w.view(torch.int64).view(-1)).view(np.uint64)
    for lanes, loads, rows, threads in PATTERNS:
        sink = cuda.device_array(-(-4096 // rows) * threads, np.uint64)
        reader(lanes, loads, rows, threads)[-(-4096 // rows), threads](view, sink, 4096, 4096)
    cuda.synchronize()


def main() -> None:
    if sys.argv[1:] == ["profile"]:
        profile()
        return
    copy = copy_gbs()
    print(f"{torch.cuda.get_device_name()}: device-to-device copy {copy:.0f} GB/s", flush=True)
    for n, k in SHAPES:
        count = -(-200_000_000 // (n * k)) + 1
        weights = [torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8) for _ in range(count)]
        row: dict = {"shape": f"{n}x{k}"}
        pairs = itertools.cycle([(w, torch.empty_like(w)) for w in weights])
        ms = graph_ms(lambda pairs=pairs: (lambda s, d: d.copy_(s))(*next(pairs)), calls=10 * count)
        row["copy_of_weight_pct"] = 100 * 2 * n * k / ms / 1e6 / copy
        for lanes, loads, rows, threads in PATTERNS:
            kernel = reader(lanes, loads, rows, threads)
            blocks = -(-n // rows)
            out = torch.empty(blocks * threads, device="cuda", dtype=torch.int64)
            views = itertools.cycle([cuda.as_cuda_array(w.view(torch.int64).view(-1)).view(np.uint64)
                                     for w in weights])
            sink = cuda.as_cuda_array(out).view(np.uint64)
            ms = graph_ms(functools.partial(launch, kernel, blocks, threads, views, sink, n, k), calls=10 * count)
            row[f"l{lanes}_x{loads}_r{rows}_t{threads}_pct"] = 100 * n * k / ms / 1e6 / copy
        print(json.dumps(row, default=lambda v: round(v, 1)), flush=True)
        del weights


if __name__ == "__main__":
    main()
