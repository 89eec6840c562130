"""Hugging Face transformers both ways: quantize on load, save_pretrained / from_pretrained of quantized
models (in a fresh process, bit-identical logits), and checkpoints that do not fit their config.

A tiny Llama built from a config (random weights, no download). On the simulator the quantize-on-load test
quantizes one projection (each toy GEMM is simulated in Python, seconds a call) and the round trips compute on the
emulation (the kernels' bits); on a GPU every linear but lm_head, on the kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")
transformers = pytest.importorskip("transformers", reason="the Hugging Face tests need transformers")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="checkpoints are safetensors files")

from baracuda_numba import InvalidProblem  # noqa: E402
from baracuda_numba.torch import (  # noqa: E402
    BaracudaConfig,
    EmulatedW8A8Linear,
    QuantizeConfig,
    StateDictMismatch,
    W8A8Linear,
    quantize_model,
)
from tests.conftest import SIMULATOR  # noqa: E402
from tests.test_torch_e2e import DEVICE, _tokens, tiny_llama  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
UP = "model.layers.0.mlp.up_proj"
# On the simulator the round trips compute on the emulation (:func:`emulate`); every linear is quantized.
ALL = ["*"]


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _load(path, **kwargs):
    return transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs).to(DEVICE).eval()


def emulate(model):
    """On the simulator, run the W8A8 layers on the emulation (each simulated GEMM takes seconds): the same
    buffers, the kernels' bits (``tests/test_torch_modules.py::test_emulated_w8a8_linear_is_the_kernel_bit_for_bit``,
    ``tests/test_torch_real_model.py``)."""
    for module in model.modules():
        if type(module) is W8A8Linear:
            module.__class__ = EmulatedW8A8Linear
    return model


def _in_a_fresh_process(path: Path, ids: torch.Tensor, tmp_path: Path) -> tuple[torch.Tensor, str]:
    """Load ``path`` with ``from_pretrained`` in a new interpreter (only ``import baracuda_numba.torch``
    registers the quantizer) and return its logits on ``ids`` and the class of the up projection."""
    torch.save(ids.cpu(), tmp_path / "ids.pt")
    script = f"""
import torch, transformers
from baracuda_numba.torch import EmulatedW8A8Linear, W8A8Linear
model = transformers.AutoModelForCausalLM.from_pretrained({str(path)!r}).to({DEVICE!r}).eval()
for module in model.modules():  # emulate(), as in the parent
    if {SIMULATOR!r} and type(module) is W8A8Linear:
        module.__class__ = EmulatedW8A8Linear
ids = torch.load({str(tmp_path / "ids.pt")!r}).to({DEVICE!r})
with torch.no_grad():
    torch.save(model(ids).logits.cpu(), {str(tmp_path / "logits.pt")!r})
print("UP", type(model.get_submodule({UP!r})).__name__, model.get_submodule({UP!r}).extra_repr())
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("UP "))
    return torch.load(tmp_path / "logits.pt"), line


@pytest.mark.parametrize("config", [
    QuantizeConfig(include=ALL, progress=False),
    QuantizeConfig(include=ALL, activation="static", smooth=True, progress=False),
], ids=["dynamic", "static-smooth"])
def test_save_pretrained_then_from_pretrained_in_a_fresh_process(config, tmp_path):
    model = tiny_llama()
    ids = _tokens(1, 6, seed=3)[0]
    # on the simulator quantized by the emulation too: the same bits as the kernels (see emulate())
    quantize_model(model, [{"input_ids": t} for t in _tokens(2, 8)],
                   replace(config, backend="emulation") if SIMULATOR else config)
    expected = _logits(model, ids)
    model.save_pretrained(tmp_path / "quantized")
    saved = json.loads((tmp_path / "quantized" / "config.json").read_text())["quantization_config"]
    assert saved["quant_method"] == "baracuda"
    assert saved["layers"] == {name: config.mode_of(name) for name, m in model.named_modules()
                               if isinstance(m, W8A8Linear)}
    got, up = _in_a_fresh_process(tmp_path / "quantized", ids, tmp_path)
    expected_class = "EmulatedW8A8Linear" if SIMULATOR else "W8A8Linear"
    assert up.startswith(f"UP {expected_class} ") and f"activation={config.activation!r}" in up, up
    assert torch.equal(got, expected.cpu())


def test_quantize_on_load_dynamic_needs_no_data(tmp_path):
    float_model = tiny_llama()
    float_model.save_pretrained(tmp_path / "float")
    include = ["*.mlp.up_proj"] if SIMULATOR else ["*"]
    loaded = _load(tmp_path / "float", quantization_config=BaracudaConfig(include=include))
    up = loaded.get_submodule(UP)
    assert isinstance(up, W8A8Linear) and up.activation == "dynamic"
    assert isinstance(loaded.lm_head, torch.nn.Linear)
    expected = W8A8Linear.from_float(float_model.get_submodule(UP))
    assert torch.equal(up.weight_q, expected.weight_q) and torch.equal(up.weight_scale, expected.weight_scale)
    ids = _tokens(1, 5, seed=4)[0]
    reference = quantize_model(tiny_llama(), None, QuantizeConfig(include=include, progress=False))
    assert torch.equal(_logits(loaded, ids), _logits(reference, ids))
    assert loaded.config.quantization_config.layers[UP] == "dynamic"


def test_quantize_on_load_refuses_static_without_data(tmp_path):
    tiny_llama().save_pretrained(tmp_path / "float")
    with pytest.raises(InvalidProblem, match=r"quantization_config.activation expected 'dynamic' when quantizing"):
        _load(tmp_path / "float", quantization_config=BaracudaConfig(activation="static"))


def test_config_round_trips_and_refuses_bad_values():
    config = BaracudaConfig(include=["*.mlp.*"], layers={UP: "static"})
    again = BaracudaConfig.from_dict(json.loads(config.to_json_string()))
    assert again.to_dict() == config.to_dict()
    with pytest.raises(InvalidProblem, match=r"BaracudaConfig: layers\['x'\] expected 'dynamic' or 'static'"):
        BaracudaConfig(layers={"x": "int4"})
    with pytest.raises(InvalidProblem, match=r"BaracudaConfig: format_version expected 1"):
        BaracudaConfig(format_version=2)


# -- checkpoints that do not fit their config ------------------------------------------------------------


@pytest.fixture(scope="module")
def static_checkpoint(tmp_path_factory):
    """A saved model whose up projection is static W8A8 (the rest float): no forward through a kernel."""
    path = tmp_path_factory.mktemp("static") / "model"
    model = tiny_llama()
    quantize_model(model, [{"input_ids": t} for t in _tokens(1, 8)],
                   QuantizeConfig(include=["*.mlp.up_proj"], activation="static", progress=False))
    model.save_pretrained(path)
    return path


def _copy(source: Path, target: Path) -> Path:
    target.mkdir()
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    return target


def _edit_config(path: Path, edit) -> None:
    config = json.loads((path / "config.json").read_text())
    edit(config["quantization_config"])
    (path / "config.json").write_text(json.dumps(config))


def _edit_tensors(path: Path, edit) -> None:
    file = path / "model.safetensors"
    tensors = safetensors_torch.load_file(str(file))
    edit(tensors)
    safetensors_torch.save_file(tensors, str(file), metadata={"format": "pt"})


def _quantized_gate(tensors):
    """The gate projection stored quantized (the up projection's tensors stand in for it)."""
    gate = "model.layers.0.mlp.gate_proj"
    del tensors[f"{gate}.weight"]
    tensors[f"{gate}.weight_q"] = tensors[f"{UP}.weight_q"].clone()
    tensors[f"{gate}.weight_scale"] = tensors[f"{UP}.weight_scale"].clone()


@pytest.mark.parametrize("case,pattern", [
    ("dynamic_in_config", rf"{UP}: {UP}\.act_scale expected no act_scale \(dynamic activations\), got that key"),
    ("unquantized_layer_in_config", r"model\.layers\.0\.mlp\.gate_proj: model\.layers\.0\.mlp\.gate_proj\.weight_q "
                                    r"expected \(64, 32\) int8, got no such key"),
    ("layer_left_out_of_config", rf"BaracudaHfQuantizer: {UP}\.(weight_q|act_scale) expected a layer named in"),
    ("no_such_module", r"BaracudaHfQuantizer: layers\['model\.nothing'\] expected a module of the model"),
    ("scale_dtype", rf"{UP}: {UP}\.weight_scale expected \(64,\) float32, got \(64,\) float16"),
    ("weight_shape", rf"{UP}: {UP}\.weight_q expected \(64, 32\) int8, got \(64, 31\) int8"),
    ("nan_scale", rf"{UP}: {UP}\.weight_scale expected finite scales"),
    ("zero_act_scale", rf"{UP}: {UP}\.act_scale expected a finite scale > 0"),
])
def test_a_checkpoint_that_does_not_fit_its_config_names_the_key(static_checkpoint, tmp_path, case, pattern):
    path = _copy(static_checkpoint, tmp_path / "model")
    edits = {
        "dynamic_in_config": lambda: _edit_config(path, lambda q: q["layers"].update({UP: "dynamic"})),
        "unquantized_layer_in_config": lambda: _edit_config(
            path, lambda q: q["layers"].update({"model.layers.0.mlp.gate_proj": "static"})),
        "layer_left_out_of_config": lambda: _edit_config(
            path, lambda q: q.update(layers={"model.layers.0.mlp.gate_proj": "dynamic"})) or _edit_tensors(
            path, _quantized_gate),
        "no_such_module": lambda: _edit_config(path, lambda q: q["layers"].update({"model.nothing": "dynamic"})),
        "scale_dtype": lambda: _edit_tensors(path, lambda t: t.update({f"{UP}.weight_scale":
                                                                       t[f"{UP}.weight_scale"].half()})),
        "weight_shape": lambda: _edit_tensors(path, lambda t: t.update({f"{UP}.weight_q":
                                                                        t[f"{UP}.weight_q"][:, :31].contiguous()})),
        "nan_scale": lambda: _edit_tensors(path, lambda t: t[f"{UP}.weight_scale"].__setitem__(3, float("nan"))),
        "zero_act_scale": lambda: _edit_tensors(path, lambda t: t[f"{UP}.act_scale"].fill_(0.0)),
    }
    edits[case]()
    with pytest.raises(StateDictMismatch, match=pattern):
        _load(path)


def test_the_untouched_checkpoint_loads(static_checkpoint):
    model = _load(static_checkpoint)
    up = model.get_submodule(UP)
    assert isinstance(up, W8A8Linear) and up.activation == "static" and up._act_scale == float(up.act_scale) > 0
