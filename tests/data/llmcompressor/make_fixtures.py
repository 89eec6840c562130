"""Regenerate the llm-compressor W8A8 int8 checkpoints that ``tests/test_torch_compressed_tensors.py`` loads.

llm-compressor pins its own transformers (0.14: 5.15-5.17) and brings datasets, pyarrow and auto-round, so
it is not part of the test extra; the tests load what it wrote. Run from the repository root:

    python -m venv /tmp/llmc && /tmp/llmc/bin/pip install "llmcompressor==0.14.0.1" "torch==2.13.0"
    /tmp/llmc/bin/python tests/data/llmcompressor/make_fixtures.py

For each recipe it builds a tiny Llama from a config (random weights, a few RMSNorm channels scaled up as
LLM activation outliers are), quantizes it on the CPU with ``llmcompressor.oneshot`` (SmoothQuant, then
int8 weights per output channel and int8 activations: per token dynamic, or one static per-tensor scale),
records llm-compressor's own fake-quantized logits on fixed tokens (``expected.safetensors``) and saves
the compressed checkpoint (``save_compressed=True``: int8 ``weight``, ``weight_scale``, ``input_scale``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
VOCAB, SEQUENCE, SAMPLES = 128, 16, 16


def tiny_llama(dtype: torch.dtype) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith("layernorm"):
                module.weight[[3, 40]] = 12.0
    return model.to(dtype)


def tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer over the tiny vocabulary: oneshot wants one, the data is already token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t1",
                                                eos_token="t2", bos_token="t3")


def scheme(static: bool) -> QuantizationScheme:
    weights = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel", dynamic=False)
    activations = QuantizationArgs(num_bits=8, type="int", symmetric=True, dynamic=not static,
                                   strategy="tensor" if static else "token")
    return QuantizationScheme(targets=["Linear"], weights=weights, input_activations=activations)


def make(name: str, static: bool, dtype: torch.dtype) -> None:
    with tempfile.TemporaryDirectory() as scratch:  # oneshot re-reads the config from the model's path
        tiny_llama(dtype).save_pretrained(scratch)
        tokenizer().save_pretrained(scratch)
        model = transformers.AutoModelForCausalLM.from_pretrained(scratch, dtype=dtype)
        _quantize_and_save(model, name, static, scratch)


def _quantize_and_save(model: transformers.PreTrainedModel, name: str, static: bool, scratch: str) -> None:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (SAMPLES, SEQUENCE), generator=g)
    data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()})
    recipe = [SmoothQuantModifier(smoothing_strength=0.8),
              QuantizationModifier(config_groups={"group_0": scheme(static)}, ignore=["lm_head"])]
    oneshot(model=model, tokenizer=scratch, dataset=data, recipe=recipe, num_calibration_samples=SAMPLES,
            max_seq_length=SEQUENCE, pipeline="basic")
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = model(tokens).logits.float()
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, save_compressed=True)
    save_file({"input_ids": tokens, "logits": logits.contiguous()}, str(out / "expected.safetensors"))
    config = json.loads((out / "config.json").read_text())
    print(name, json.dumps(config["quantization_config"], indent=1)[:1500])


if __name__ == "__main__":
    make("w8a8_dynamic", static=False, dtype=torch.bfloat16)
    make("w8a8_static", static=True, dtype=torch.float32)
