"""Fingerprint of the generated PTX, per kernel family, compiled for sm_90 without a GPU.

Two checkouts with the same fingerprint for a family run byte-identical device code, so a host-side
or refactoring change can be shown not to touch kernels that passed on the GPU. Needs NVVM (the
cu12 / cu13 extra), not a driver:

    NUMBA_ENABLE_CUDASIM=0 python benchmarks/ptx_fingerprint.py
"""

from __future__ import annotations

import hashlib
import itertools
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")

from numba import cuda

from baracuda_numba import registry
from baracuda_numba.kernels.linear import linear_kernel


def _ptx(kernel) -> bytes:
    ptx, _ = cuda.compile_ptx(kernel.py_func, kernel.signature, cc=(9, 0))
    return ptx.encode()


def fingerprints() -> dict[str, tuple[int, str]]:
    """``family -> (kernel count, sha256 of their PTX in registration order)``."""
    digests: dict[str, hashlib._Hash] = {}
    counts: dict[str, int] = {}

    def add(family: str, ptx: bytes) -> None:
        digests.setdefault(family, hashlib.sha256()).update(ptx)
        counts[family] = counts.get(family, 0) + 1

    for entry in registry.entries():
        # FP8 kernels are families of their own, so the integer families' hashes stay comparable.
        if isinstance(entry, registry.RegistryEntry):
            for uniform in (True, False):
                add("elementwise" + ("_fp8" if entry.grid else ""), _ptx(entry.kernel(uniform)))
        elif isinstance(entry, registry.DynamicRangeEntry):
            fp8 = entry.output_element.is_fp8
            for symmetric in (True,) if fp8 else (True, False):
                kernels = entry.kernels(symmetric)
                for name in sorted(vars(kernels)):
                    kernel = getattr(kernels, name)
                    if hasattr(kernel, "py_func") and hasattr(kernel, "signature"):
                        add("dynamic" + ("_fp8" if fp8 else ""), _ptx(kernel))
    for variant in itertools.product(registry.FLOAT_ELEMENTS, (False, True), (False, True), (False, True)):
        add("linear", _ptx(linear_kernel(*variant)))  # output, bias, per-tensor rows, skinny
    return {family: (counts[family], digest.hexdigest()) for family, digest in digests.items()}


if __name__ == "__main__":
    for family, (count, digest) in fingerprints().items():
        print(f"{family:12s} {count:4d} kernels  {digest}")
