"""What ``validate="device"`` costs (baracuda_numba/ops/checks.py): wall time per call of array-scale ops on
CUDA torch tensors with ``validate="host"`` (device arrays unchecked, no host sync) and ``"device"`` (one
reduction kernel on the call's stream and a 16-byte read back), back-to-back calls, synchronized at the end.

    python -m benchmarks.validate_cost [--calls 200]

Needs a CUDA GPU and PyTorch. Prints one line per problem: both times per call and the difference.
"""

from __future__ import annotations

import argparse
import time

import baracuda_numba as bn


def per_call_us(fn, calls: int) -> float:
    """Wall microseconds per call of ``calls`` back-to-back calls (after 20 warm-up calls), the GPU drained
    before and after: what a loop of such calls takes, host work and waits included."""
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    cuda = torch.device("cuda")
    big = torch.randn(4096, 4096, device=cuda, dtype=torch.bfloat16)
    decode = torch.randn(16, 4096, device=cuda, dtype=torch.bfloat16)
    problems = {
        "quantize_per_channel 4096x4096 bf16, 4096 scales": lambda validate: bn.quantize_per_channel(
            big, channel, None, 0, validate=validate),
        "quantize_per_token 16x4096 bf16, 16 scales + zero points": lambda validate: bn.quantize_per_token(
            decode, token, token_zp, validate=validate),
        "quantize_per_group 4096x4096 bf16 g128, 131072 scales": lambda validate: bn.quantize_per_group(
            big, group, None, 128, validate=validate),
        "dequantize_per_group 16x4096 s8 g128, 512 scales + zero points": lambda validate: bn.dequantize_per_group(
            decode_q, decode_group, decode_group_zp, 128, dtype=torch.bfloat16, validate=validate),
    }
    channel = torch.rand(4096, device=cuda) * 0.01 + 0.001
    token = torch.rand(16, device=cuda) * 0.01 + 0.001
    token_zp = torch.randint(-5, 5, (16,), device=cuda, dtype=torch.int32)
    group = torch.rand(4096, 32, device=cuda) * 0.01 + 0.001
    decode_q = torch.randint(-128, 128, (16, 4096), device=cuda, dtype=torch.int8)
    decode_group = torch.rand(16, 32, device=cuda) * 0.01 + 0.001
    decode_group_zp = torch.randint(-5, 5, (16, 32), device=cuda, dtype=torch.int32)
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}, baracuda-numba {bn.__version__}; "
          f"{args.calls} back-to-back calls each")
    for label, call in problems.items():
        host = per_call_us(lambda call=call: call("host"), args.calls)
        device = per_call_us(lambda call=call: call("device"), args.calls)
        print(f"{label}: validate='host' {host:.1f} us/call, validate='device' {device:.1f} us/call "
              f"(+{device - host:.1f} us)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
