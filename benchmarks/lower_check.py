"""Type and lower kernels for the CUDA target (sm_90) to LLVM IR, without a GPU and without NVVM.

Catches what the simulator cannot: numba typing errors (signed / unsigned mixing, unsupported
casts) in kernel code that only ever ran as Python. Usage:

    python benchmarks/lower_check.py [fp8|int4|all]
"""

from __future__ import annotations

import os
import sys

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

from numba.core import sigutils
from numba.cuda import compiler

from baracuda_numba import registry


def kernels(which: str) -> list:
    out = []
    for e in registry.entries():
        fp8 = e.output_element.is_fp8
        packed = e.output_element in registry.PACKED_ELEMENTS
        if which != "all" and not ((which == "fp8" and fp8) or (which == "int4" and packed)):
            continue
        if isinstance(e, registry.RegistryEntry):
            out += [e.kernel(True), e.kernel(False)]
        elif isinstance(e, registry.PackedEntry):
            out.append(e.kernel())
            if e.kind is registry.QuantizeKind.DYNAMIC_RANGE:  # the one-pass kernels, every chunks-per-lane shape
                for symmetric in (True,) if e.output_element is registry.ElementKind.S4 else (True, False):
                    out += [e.dynamic_kernel(symmetric, per_lane) for per_lane in (1, 2, 3, 8)]
        elif isinstance(e, registry.DynamicRangeEntry):
            for symmetric in (True,) if fp8 else (True, False):
                k = e.kernels(symmetric)
                out += [k.segment, k.resident, k.staged, k.partial, k.tensor_quantize, k.column_partial,
                        k.channel_finalize, k.column_quantize]
    unique = {(k.py_func.__name__, k.signature): k for k in out}
    return list(unique.values())


def main(which: str = "all") -> int:
    failed = 0
    todo = kernels(which)
    for k in todo:
        args, ret = sigutils.normalize_signature(k.signature)
        try:
            compiler.compile_cuda(k.py_func, ret, args, cc=(9, 0)).library.get_llvm_str()
        except Exception as exc:  # report every failure, not only the first
            failed += 1
            print(f"{k.py_func.__name__}: {type(exc).__name__}: {str(exc)[:400]}")
    print(f"{len(todo) - failed} of {len(todo)} kernels typed and lowered for sm_90")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "all"))
