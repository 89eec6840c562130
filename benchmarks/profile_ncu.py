"""The memory-bound kernels below their targets, each launched once on bf16 [16384, 4096] (128 MiB, past
the L2), for Nsight Compute; ``--cases`` picks a subset by name.

    ncu --clock-control none --kernel-name regex:<name> --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section SchedulerStats \\
        python3 benchmarks/profile_ncu.py [--cases dyn_token,int4_deq]

Name the kernels to profile by a regex of their names (``dequantize_s8_s8_f32_channels``, say), so
the torch kernels that build the inputs are not profiled. Every op compiles on its first call, which
launches nothing else.
"""

from __future__ import annotations

import argparse

import torch

import baracuda_numba as bn

ROWS, COLS = 16384, 4096


def cases() -> dict:
    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    e4m3 = torch.float8_e4m3fn
    group_scales = torch.full((ROWS, COLS // 128), 0.3, device="cuda")
    packed = bn.quantize_per_group_packed(x, group_scales, None, 128)
    channel_scales = torch.rand(COLS, device="cuda") * 0.05 + 0.01
    channel_zps = torch.zeros(COLS, device="cuda", dtype=torch.int32)
    g_scales = torch.rand(ROWS * COLS // 128, device="cuda") * 0.05 + 0.01
    g_zps = torch.zeros(ROWS * COLS // 128, device="cuda", dtype=torch.int32)
    token_scales = torch.full((ROWS,), 0.02, device="cuda")
    row_scales = torch.rand(ROWS, device="cuda") * 0.05 + 0.01
    row_zps = torch.zeros(ROWS, device="cuda", dtype=torch.int32)
    q8 = torch.randint(-128, 128, (ROWS, COLS), device="cuda", dtype=torch.int8)
    x1 = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    x16 = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randint(-128, 128, (4096, 4096), device="cuda", dtype=torch.int8)
    ws = torch.rand(4096, device="cuda")
    torch.cuda.synchronize()
    return {
        "dyn_token": lambda: bn.dynamic_range_quantize(x),
        "dyn_token_asym": lambda: bn.dynamic_range_quantize(x, mode="asymmetric"),
        "dyn_group128": lambda: bn.dynamic_range_quantize(x, scope="group", group_size=128),
        "dyn_tensor": lambda: bn.dynamic_range_quantize(x, scope="tensor"),
        "dyn_channel": lambda: bn.dynamic_range_quantize(x, scope="channel", axis=1),
        "dyn_token_e4m3": lambda: bn.dynamic_range_quantize(x, dtype=e4m3),
        "fp8_token": lambda: bn.quantize_per_token(x, token_scales, dtype=e4m3),
        "int4_quant": lambda: bn.quantize_per_group_packed(x, group_scales, None, 128),
        "int4_deq": lambda: bn.dequantize_per_group_packed(packed, group_scales, None, 128, dtype=torch.bfloat16),
        "int4_fake": lambda: bn.fake_quantize_per_group(x, group_scales, None, 128, dtype="int4"),
        "int4_dyn": lambda: bn.dynamic_range_quantize_packed(x, group_size=128),
        "channel_axis1": lambda: bn.quantize_per_channel(x, channel_scales, channel_zps, 1),
        "channel_axis1_deq": lambda: bn.dequantize_per_channel(q8, channel_scales, channel_zps, 1,
                                                               dtype=torch.bfloat16),
        "channel_axis1_deq_f32": lambda: bn.dequantize_per_channel(q8, channel_scales, channel_zps, 1),
        "tensor_deq_f32": lambda: bn.dequantize_per_tensor(q8, 0.02, 3),
        "channel_axis1_qbw": lambda: bn.quantize_per_channel_backward(x, x, channel_scales, channel_zps, 1),
        "channel_axis0": lambda: bn.quantize_per_channel(x, row_scales, row_zps, 0),
        "group_quant": lambda: bn.quantize_per_group(x, g_scales.view(ROWS, -1), g_zps.view(ROWS, -1), 128),
        "decode_m1": lambda: bn.quantized_linear(x1, w, ws),
        "decode_m16": lambda: bn.quantized_linear(x16, w, ws),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="")
    args = parser.parse_args()
    table = cases()
    names = args.cases.split(",") if args.cases else list(table)
    for name in names:
        table[name]()
        torch.cuda.synchronize()
        print("ran", name, flush=True)


if __name__ == "__main__":
    main()
