"""The FP8 decoders on the GPU: the exact rescale (integer and float adder work) against the conversion
unit (``cvt.rn.f16x2.e4m3x2``, ``cvt.f32.f16``), each in its own process (kernels are built once per
process), through the benchmark's FP8 / int4 rows (``bench --only lowbit``).

    python3 -m benchmarks.tune_fp8 --out DIR
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

_RUN = """
import sys
from baracuda_numba.kernels import codecs
codecs.FP8_DECODE_BY_CONVERSION = {flag}
from baracuda_numba.bench import main
sys.exit(main(["--only", "lowbit", "--repeats", "{repeats}", "--out", "{out}"]))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results/tune_fp8")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    status = 0
    for label, flag in (("rescale", False), ("conversion", True)):
        out = Path(args.out) / label
        print(f"== FP8 decode by {label}", flush=True)
        code = _RUN.format(flag=flag, repeats=args.repeats, out=out)
        status |= subprocess.run([sys.executable, "-c", code], check=False).returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
