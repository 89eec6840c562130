"""compressed-tensors both ways, against the real tools.

``tests/data/llmcompressor/`` holds two checkpoints that llm-compressor 0.14 wrote (``make_fixtures.py``
regenerates them: llm-compressor pins an older transformers and brings datasets, pyarrow and auto-round,
so it is not installed for the tests): a tiny Llama after SmoothQuant and W8A8 int8 (per-channel
weights; per-token dynamic activations in bf16, one static per-tensor scale in float32), with
llm-compressor's own fake-quantized logits on fixed tokens. They load here; a model quantized here is
written in the format and read back by transformers' compressed-tensors support (the ``compressed-tensors``
package, in the test extra).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")
transformers = pytest.importorskip("transformers", reason="the checkpoint tests need transformers")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="checkpoints are safetensors files")

from baracuda_numba import Unsupported  # noqa: E402
from baracuda_numba.torch import (  # noqa: E402
    EmulatedW8A8Linear,
    QuantizeConfig,
    StateDictMismatch,
    W8A8Linear,
    compare_logits,
    quantize_model,
)
from baracuda_numba.torch.compressed_tensors import (  # noqa: E402
    compressed_tensors_config,
    load_compressed_tensors,
    save_compressed_tensors,
)
from tests.conftest import SIMULATOR  # noqa: E402
from tests.test_torch_e2e import _tokens, tiny_llama  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "data" / "llmcompressor"
RECIPES = {"w8a8_dynamic": "dynamic", "w8a8_static": "static"}


def _expected(name):
    return safetensors_torch.load_file(str(FIXTURES / name / "expected.safetensors"))


def llmcompressor_convention(module, x):
    """A W8A8 layer computed as compressed-tensors fake-quantizes: ``scale = max|x| / 127.5`` per token (or
    the stored input scale), ``clamp(round(x / scale), -128, 127) * scale`` in ``x``'s dtype, then
    ``F.linear`` with the dequantized weight ``q * weight_scale``."""
    scale = module.act_scale.to(x.dtype) if module.activation == "static" else (
        x.abs().amax(-1, keepdim=True) / 127.5).to(x.dtype)
    x = torch.clamp(torch.round(x / scale), -128, 127) * scale
    weight = module.weight_q.to(x.dtype) * module.weight_scale.to(x.dtype)[:, None]
    return torch.nn.functional.linear(x, weight, None if module.bias is None else module.bias.to(x.dtype))


def _with_llmcompressor_convention(model):
    for module in model.modules():
        if isinstance(module, W8A8Linear):
            module.forward = llmcompressor_convention.__get__(module)
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_an_llmcompressor_checkpoint_loads_into_our_modules(name):
    path = FIXTURES / name
    saved = safetensors_torch.load_file(str(path / "model.safetensors"))
    model = load_compressed_tensors(path, backend="emulation")
    layers = {n: m for n, m in model.named_modules() if isinstance(m, W8A8Linear)}
    assert len(layers) == 14 and isinstance(model.lm_head, torch.nn.Linear)  # 7 linears x 2 layers, lm_head ignored
    for layer_name, layer in layers.items():
        assert isinstance(layer, EmulatedW8A8Linear) and layer.activation == RECIPES[name]
        assert torch.equal(layer.weight_q, saved[f"{layer_name}.weight"])
        assert torch.equal(layer.weight_scale, saved[f"{layer_name}.weight_scale"].float().reshape(-1))
        if layer.activation == "static":
            assert layer._act_scale == float(saved[f"{layer_name}.input_scale"])
    expected = _expected(name)
    ours = _logits(model, expected["input_ids"])
    # the same tensors computed as llm-compressor does reproduce its logits bit for bit: everything it
    # quantized and smoothed was read as it meant it
    theirs = _logits(_with_llmcompressor_convention(model), expected["input_ids"])
    assert torch.equal(theirs, expected["logits"])
    # our recipe differs only in the activation convention (module docstring of .compressed_tensors)
    comparison = compare_logits(expected["logits"], ours)
    assert comparison["rel_error"] < 0.05 and comparison["top1_agreement"] >= 0.9, comparison


def test_the_kernels_backend_loads_the_same_bits():
    name = "w8a8_static"
    emulated = load_compressed_tensors(FIXTURES / name, backend="emulation")
    ours = load_compressed_tensors(FIXTURES / name)
    for (n, a), (_, b) in zip(emulated.named_modules(), ours.named_modules(), strict=True):
        if isinstance(a, W8A8Linear):
            assert type(b) is W8A8Linear, n
            for key, value in a.state_dict().items():
                assert torch.equal(b.state_dict()[key], value), (n, key)
    if not SIMULATOR:  # a full forward through 14 toy GEMMs is minutes on the simulator
        ids = _expected(name)["input_ids"]
        # both on the GPU: the loaded bits are compared above; the forwards agree up to what the bf16 / float32
        # PyTorch ops between the layers may round differently (tests/test_torch_real_model.py compares the layers)
        comparison = compare_logits(_logits(emulated.cuda(), ids.cuda()), _logits(ours.cuda(), ids.cuda()))
        assert comparison["rel_error"] < 0.01 and comparison["top1_agreement"] == 1.0, comparison


def _quantized_llama(config):
    model = tiny_llama(hidden=64, layers=2, vocab=64).float()
    return quantize_model(model, [{"input_ids": t} for t in _tokens(2, 12)], config)


EXPORTS = {
    "dynamic": QuantizeConfig(backend="emulation", progress=False),
    "static-smooth": QuantizeConfig(activation="static", smooth=True, backend="emulation", progress=False),
    "mixed": QuantizeConfig(activation="static", smooth=True, dynamic_layers=["*.down_proj"], backend="emulation",
                            progress=False),
}


@pytest.mark.parametrize("recipe", sorted(EXPORTS))
def test_our_export_loads_back_here_bit_for_bit(recipe, tmp_path):
    model = _quantized_llama(EXPORTS[recipe])
    save_compressed_tensors(model, tmp_path / "ct")
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert qc == compressed_tensors_config(model)
    assert qc["ignore"] == ["lm_head"]
    assert len(qc["config_groups"]) == (2 if recipe == "mixed" else 1)
    device = next(model.parameters()).device  # the GPU where one is (tiny_llama builds there)
    back = load_compressed_tensors(tmp_path / "ct", backend="emulation", device=device)
    for (n, a), (_, b) in zip(model.named_modules(), back.named_modules(), strict=True):
        if isinstance(a, W8A8Linear):
            assert b.activation == a.activation, n
            for key, value in a.state_dict().items():
                assert torch.equal(b.state_dict()[key], value), (n, key)
    ids = _tokens(1, 9, seed=5)[0]
    assert torch.equal(_logits(back, ids), _logits(model, ids))


@pytest.mark.parametrize("recipe", sorted(EXPORTS))
def test_our_export_loads_through_transformers_compressed_tensors(recipe, tmp_path):
    pytest.importorskip("compressed_tensors", reason="the compressed-tensors package is in the [test-torch] extra")
    model = _quantized_llama(EXPORTS[recipe])
    save_compressed_tensors(model, tmp_path / "ct")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ct").eval()
    ids = _tokens(1, 9, seed=5)[0]
    got = _logits(theirs, ids)
    # transformers' compressed-tensors model runs our tensors as compressed-tensors means them
    assert torch.equal(got, _logits(_with_llmcompressor_convention(model), ids))
    for name, module in model.named_modules():
        if isinstance(module, W8A8Linear):  # their weight is ours dequantized, exactly (a float32 model)
            expected = module.weight_q.float() * module.weight_scale[:, None]
            assert torch.equal(theirs.get_submodule(name).weight.float(), expected), name


# -- what we cannot run is refused, naming the tensor ------------------------------------------------------


def _edited_fixture(tmp_path, name="w8a8_static", config=None, tensors=None):
    path = tmp_path / name
    shutil.copytree(FIXTURES / name, path)
    if config is not None:
        data = json.loads((path / "config.json").read_text())
        config(data["quantization_config"])
        (path / "config.json").write_text(json.dumps(data))
    if tensors is not None:
        saved = safetensors_torch.load_file(str(path / "model.safetensors"))
        tensors(saved)
        safetensors_torch.save_file(saved, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _weights(field, value):
    return lambda qc: qc["config_groups"]["group_0"]["weights"].update({field: value})


def _activations(field, value):
    return lambda qc: qc["config_groups"]["group_0"]["input_activations"].update({field: value})


Q = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("edit,pattern", [
    (_weights("symmetric", False), rf"{Q}\.weight expected symmetric=True .*got symmetric=False"),
    (_weights("num_bits", 4), rf"{Q}\.weight expected num_bits=8 .*got num_bits=4"),
    (_weights("type", "float"), rf"{Q}\.weight expected type='int' .*got type='float'"),
    (_weights("strategy", "group"), rf"{Q}\.weight expected strategy='channel' .*got strategy='group'"),
    (_weights("group_size", 128), rf"{Q}\.weight expected no group_size .*got group_size=128"),
    (_activations("symmetric", False), rf"{Q}\.input_scale expected symmetric=True"),
    (_activations("strategy", "token"), rf"{Q}\.input_scale expected strategy='tensor'"),
    (_activations("num_bits", 16), rf"{Q}\.input_scale expected num_bits=8"),
    (lambda qc: qc["config_groups"]["group_0"].update(input_activations=None),
     rf"{Q}\.input_scale expected input_activations quantized as"),
    (lambda qc: qc.update(kv_cache_scheme={"num_bits": 8}), r"quantization_config\.kv_cache_scheme expected"),
    (lambda qc: qc.update(format="pack-quantized"), r"quantization_config\.format expected int-quantized"),
    (lambda qc: qc["config_groups"]["group_0"].update(targets=["Embedding"]),
     r"model\.embed_tokens\.weight expected a quantized nn\.Linear"),
])
def test_schemes_we_cannot_run_are_refused_naming_the_tensor(tmp_path, edit, pattern):
    with pytest.raises(Unsupported, match=pattern):
        load_compressed_tensors(_edited_fixture(tmp_path, config=edit), backend="emulation")


@pytest.mark.parametrize("edit,error,pattern", [
    (lambda t: t.update({f"{Q}.weight_zero_point": torch.ones(64, 1, dtype=torch.int8)}), Unsupported,
     rf"{Q}\.weight_zero_point expected zero points of 0"),
    (lambda t: t.update({f"{Q}.weight": t[f"{Q}.weight"].to(torch.int32)}), StateDictMismatch,
     rf"{Q}\.weight expected \(64, 64\) int8, got \(64, 64\) int32"),
    (lambda t: t.update({f"{Q}.weight_scale": t[f"{Q}.weight_scale"][:32]}), StateDictMismatch,
     rf"{Q}\.weight_scale expected \(64, 1\)"),
    (lambda t: t.pop(f"{Q}.input_scale"), StateDictMismatch, rf"{Q}\.input_scale expected \(1,\) .*no such tensor"),
    (lambda t: t[f"{Q}.weight_scale"].__setitem__(0, -1.0), StateDictMismatch,
     rf"load_compressed_tensors: {Q}\.weight_scale expected finite"),
    (lambda t: t[f"{Q}.input_scale"].fill_(float("inf")), StateDictMismatch,
     rf"load_compressed_tensors: {Q}\.input_scale expected a finite scale > 0"),
])
def test_tensors_that_do_not_fit_are_refused_naming_them(tmp_path, edit, error, pattern):
    with pytest.raises(error, match=pattern):
        load_compressed_tensors(_edited_fixture(tmp_path, tensors=edit), backend="emulation")
