"""``quantized_linear`` in a chain, each call's ``x`` the previous call's output (as a model's layers hand their
activations on), against the tune's fixed ``x`` read again by every call: GPU time of a captured CUDA graph,
weights rotating past L2, % of the eager device-to-device copy on the weight's bytes.

In the tune (``tune_linear.fused_decode``) every call quantizes the same ``x``, which the weights streaming past
L2 between two calls may evict: the quantizer then reads it from HBM. In a model, ``x`` was written by the kernel
just before and is read from L2. N = K shapes chain directly; 11008 x 4096 runs as an MLP pair (up 11008 x 4096,
then down 4096 x 11008, the pair's bytes counted). Weight scales keep the chain's values near 1 (each output is
about as large as its input). Usage (GPU): ``python -m benchmarks.probe_chain``.
"""

from __future__ import annotations

import itertools
import json
import math

import torch

import baracuda_numba as bn
from benchmarks.tune_linear import copy_gbs, graph_ms, say


def _weights(n: int, k: int, g: torch.Generator) -> list[torch.Tensor]:
    """Copies of an ``n x k`` int8 weight past 200 MB (rotated through, so none stays in L2)."""
    return [torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
            for _ in range(-(-200_000_000 // (n * k)))]


def _scales(n: int, k: int) -> torch.Tensor:
    # |x q_w| sums ~ 127 * 73 * sqrt(k) per unit of x's absmax / 127: this scale keeps |y| ~ |x|
    return torch.full((n,), 1.0 / (73.0 * math.sqrt(k)), device="cuda")


def square(m: int, n: int, copy: float, g: torch.Generator) -> dict:
    weights, ws = _weights(n, n, g), _scales(n, n)
    x = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
    row = {"shape": f"M={m} {n}x{n}"}
    calls = itertools.cycle(weights)
    ms = graph_ms(lambda: bn.quantized_linear(x, next(calls), ws), calls=10 * len(weights))
    row["fixed_x_us"], row["fixed_x_pct"] = 1e3 * ms, 100 * n * n / ms / 1e6 / copy
    state = [x]

    def step() -> None:
        state[0] = bn.quantized_linear(state[0], next(calls), ws)

    ms = graph_ms(step, calls=10 * len(weights))
    row["chained_us"], row["chained_pct"] = 1e3 * ms, 100 * n * n / ms / 1e6 / copy
    row["finite"] = bool(torch.isfinite(state[0].float()).all())
    return row


def mlp_pair(m: int, wide: int, k: int, copy: float, g: torch.Generator) -> dict:
    ups, downs = _weights(wide, k, g), _weights(k, wide, g)
    s_up, s_down = _scales(wide, k), _scales(k, wide)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    h = torch.randn(m, wide, device="cuda", generator=g).to(torch.bfloat16)
    pair_bytes = 2 * wide * k
    row = {"shape": f"M={m} {wide}x{k} + {k}x{wide}"}
    up_calls, down_calls = itertools.cycle(ups), itertools.cycle(downs)

    def fixed() -> None:
        bn.quantized_linear(x, next(up_calls), s_up)
        bn.quantized_linear(h, next(down_calls), s_down)

    ms = graph_ms(fixed, calls=10 * len(ups))
    row["fixed_x_us"], row["fixed_x_pct"] = 1e3 * ms, 100 * pair_bytes / ms / 1e6 / copy
    state = [x]

    def chained() -> None:
        state[0] = bn.quantized_linear(bn.quantized_linear(state[0], next(up_calls), s_up), next(down_calls), s_down)

    ms = graph_ms(chained, calls=10 * len(ups))
    row["chained_us"], row["chained_pct"] = 1e3 * ms, 100 * pair_bytes / ms / 1e6 / copy
    row["finite"] = bool(torch.isfinite(state[0].float()).all())
    return row


def main() -> None:
    say(torch.cuda.get_device_name())
    copy = copy_gbs()
    say(f"device-to-device copy {copy:.0f} GB/s")
    g = torch.Generator(device="cuda").manual_seed(0)
    for m in (1, 8, 16):
        for row in (square(m, 4096, copy, g), square(m, 8192, copy, g), mlp_pair(m, 11008, 4096, copy, g)):
            row["copy_GBs"] = copy
            say(json.dumps(row, default=lambda v: round(v, 2)))


if __name__ == "__main__":
    main()
