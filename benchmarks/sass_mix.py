"""Instruction mix of the memory-bound kernels' machine code (needs ``nvdisasm``, on the GPU machine):
``python3 benchmarks/sass_mix.py --out DIR [--tuning h200]`` (the kernels of a card's tuning value, by default
the device's). Per kernel: registers, the opcode counts of the
whole kernel (the main loops dominate), and the conversion-pipe opcodes (F2I, I2F, FRND, F2F), which
issue at a quarter of the FP32 rate on Hopper. The full SASS goes to ``DIR/<kernel>.sass``.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

from baracuda_numba import registry
from baracuda_numba.kernels import packed
from baracuda_numba.kernels.dynamic import dynamic_kernels
from baracuda_numba.plans.tuning import TUNINGS, MemoryTuning, current_tuning
from baracuda_numba.vocabulary import ElementKind, MathPrecision, QuantizeKind

BF16, S8, S4, F32 = ElementKind.BF16, ElementKind.S8, ElementKind.S4, MathPrecision.F32
CONVERSIONS = ("F2I", "I2F", "FRND", "F2F", "F2FP", "I2FP")
OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def kernels(tuning: MemoryTuning) -> dict:
    e, d, p = tuning.elementwise, tuning.dynamic, tuning.packed
    dyn = dynamic_kernels(BF16, S8, F32, True, d.keep, d.threads, tuning=d.kernel)
    static = next(e for e in registry.entries() if isinstance(e, registry.RegistryEntry)
                  and e.key == (QuantizeKind.PER_TENSOR, BF16, S8))
    token = next(e for e in registry.entries() if isinstance(e, registry.RegistryEntry)
                 and e.key == (QuantizeKind.PER_TOKEN, BF16, S8))
    return {
        "dynamic_resident_sym_bf16_s8": dyn.resident,
        "dynamic_partial_sym_bf16_s8": dyn.partial,
        "dynamic_tensor_quantize_sym_bf16_s8": dyn.tensor_quantize,
        "quantize_per_tensor_bf16_s8": static.kernel(e.kernel, True, unroll=e.policy(static.launch).unroll),
        "quantize_per_token_bf16_s8": token.kernel(e.kernel, False, unroll=e.policy(token.launch).unroll),
        "int4_quantize_bf16": packed.quantize_kernel(BF16, S4, F32, p.quantize_policy.unroll or p.unroll),
        "int4_dequantize_bf16": packed.dequantize_kernel(BF16, S4, F32, p.dequantize_policy.unroll or p.unroll),
        "int4_dynamic_bf16": packed.dynamic_kernel(BF16, S4, F32, True, 1, p.dynamic_slots, p.dynamic_threads),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/sass")
    parser.add_argument("--tuning", choices=sorted(TUNINGS), default=None, help="a card's tuning value")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, kernel in kernels(TUNINGS[args.tuning] if args.tuning else current_tuning()).items():
        dispatcher = kernel.compiled()
        sass = next(iter(dispatcher.inspect_sass().values()))
        regs = next(iter(dispatcher.overloads.values())).regs_per_thread
        (out / f"{name}.sass").write_text(sass)
        counts = collections.Counter(m.group(1).split(".")[0] for m in OPCODE.finditer(sass))
        conv = {k: v for k, v in counts.items() if k in CONVERSIONS}
        top = ", ".join(f"{k} {v}" for k, v in counts.most_common(14))
        print(f"{name}: {regs} regs, {sum(counts.values())} instructions; conversions {conv}; {top}", flush=True)


if __name__ == "__main__":
    main()
