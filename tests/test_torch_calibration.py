"""Calibration levers (``baracuda_numba.torch.calibration``): smoothing groups and linear pairs, the per-group
alpha search, static scale clipping, the static fallback, and ``QuantizeConfig``'s checks. Everything here runs
on the pure-PyTorch emulation (``backend="emulation"``): these are properties of the recipe, not of a kernel."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")
transformers = pytest.importorskip("transformers", reason="the model tests need transformers")

from torch import nn  # noqa: E402

from baracuda_numba import InvalidProblem, smoothing_scales  # noqa: E402
from baracuda_numba.torch import QuantizeConfig, W8A8Linear, calibrate, quantize_model, smooth  # noqa: E402
from baracuda_numba.torch.calibration import layer_error, smoothing_groups  # noqa: E402

EMULATED = {"backend": "emulation", "progress": False}


def _llama(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith("layernorm"):
                module.weight[[3, 17]] = 20.0
            if name.endswith("up_proj"):
                module.weight[5] *= 30.0  # an outlier channel of down_proj's input
    return model


def _batches(count=3, length=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 64, (1, length), generator=g)} for _ in range(count)]


def test_smoothing_groups_are_the_norms_and_the_mlp_pair():
    model = _llama()
    config = QuantizeConfig(smooth=True, alpha=None, **EMULATED)
    calibration = calibrate(model, _batches(), config)
    groups = {(g.source, g.kind, g.consumers) for g in smoothing_groups(model, calibration, config)}
    for i in range(2):
        p = f"model.layers.{i}"
        assert (f"{p}.input_layernorm", "norm",
                (f"{p}.self_attn.q_proj", f"{p}.self_attn.k_proj", f"{p}.self_attn.v_proj")) in groups
        assert (f"{p}.post_attention_layernorm", "norm", (f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj")) in groups
        assert (f"{p}.mlp.up_proj", "linear", (f"{p}.mlp.down_proj",)) in groups
    assert len(groups) == 6
    # q, k and v read one tensor: one shared sample
    p = "model.layers.0.self_attn"
    assert calibration.samples[f"{p}.q_proj"] is calibration.samples[f"{p}.v_proj"]
    assert calibration.samples[f"{p}.q_proj"].shape == (min(config.search_tokens, 36), 32)
    without_pairs = smoothing_groups(model, calibration, replace(config, smooth_pairs=()))
    assert all(g.kind == "norm" for g in without_pairs) and len(without_pairs) == 4


@pytest.mark.parametrize("alpha", [0.5, None])
def test_smoothing_with_the_pair_keeps_the_function(alpha):
    model = _llama()
    ids = _batches(1, 10, seed=4)[0]["input_ids"]
    with torch.no_grad():
        before = model(ids).logits
    config = QuantizeConfig(smooth=True, alpha=alpha, **EMULATED)
    calibration = calibrate(model, _batches(), config)
    spread = float(calibration.act_absmax["model.layers.0.mlp.down_proj"].max()
                   / calibration.act_absmax["model.layers.0.mlp.down_proj"].median())
    scales = smooth(model, calibration, alpha, config)
    assert "model.layers.0.mlp.up_proj" in scales and "model.layers.1.input_layernorm" in scales
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-4, atol=1e-4)
    after = calibration.act_absmax["model.layers.0.mlp.down_proj"]
    assert float(after.max() / after.median()) < spread


def test_alpha_search_picks_the_grid_value_with_the_smallest_error():
    model = _llama()
    config = QuantizeConfig(activation="static", smooth=True, alpha=None, alpha_grid=(0.0, 0.25, 0.5, 0.75, 1.0),
                            **EMULATED)
    calibration = calibrate(model, _batches(), config)
    down = "model.layers.1.mlp.down_proj"
    x, act = calibration.samples[down].clone(), calibration.act_absmax[down].clone()
    weight = model.get_submodule(down).weight.detach().float().clone()  # smooth() scales it in place

    def error(alpha):  # the static W8A8 error of down_proj after smoothing with alpha, recomputed here
        s = smoothing_scales(act, weight.abs().amax(dim=0), alpha)
        return layer_error(x / s, weight * s, float((act / s).max()) / 127)

    errors = {alpha: error(alpha) for alpha in config.alpha_grid}
    scales = smooth(model, calibration, None, config)
    best = min(errors, key=errors.get)
    torch.testing.assert_close(scales["model.layers.1.mlp.up_proj"],
                               smoothing_scales(act, weight.abs().amax(dim=0), best), rtol=0, atol=0)
    assert errors[best] < errors[0.0]  # smoothing this outlier channel helps


def test_clip_search_takes_the_grid_scale_with_the_smallest_error():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 16, bias=False))
    x = torch.rand(1024, 32) * 2 - 1
    x[0, 0] = 2.0  # one value twice the others' range: clipping it buys resolution for all the others
    config = QuantizeConfig(activation="static", exclude=[], search_tokens=1024, **EMULATED)  # every row
    minmax = quantize_model(copy.deepcopy(net), [x], config)
    clipped = quantize_model(copy.deepcopy(net), [x], replace(config, act_clip="search"))
    assert minmax[0]._act_scale == pytest.approx(2.0 / 127, rel=1e-6)
    errors = {c: layer_error(x, net[0].weight, c * 2.0 / 127) for c in config.clip_grid}
    best = min(errors, key=errors.get)
    assert best < 1.0 and clipped[0]._act_scale == pytest.approx(best * 2.0 / 127, rel=1e-6)
    assert errors[best] < errors[1.0]


def test_static_fallback_keeps_per_token_scales_where_no_single_scale_serves():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 16, bias=False), nn.Tanh(), nn.Linear(16, 16, bias=False))
    x = torch.randn(64, 16)
    x[0] *= 1000.0  # the first layer sees one token far out of the others' range...
    batches = [x]
    config = QuantizeConfig(activation="static", exclude=[], static_fallback=10.0, **EMULATED)
    model = quantize_model(copy.deepcopy(net), batches, config)
    assert model[0].activation == "dynamic"
    assert model[2].activation == "static"  # ...the second one range (tanh)
    assert quantize_model(copy.deepcopy(net), batches, replace(config, static_fallback=None))[0].activation == "static"


def test_dynamic_layers_and_the_saved_modes():
    model = quantize_model(_llama(), _batches(), QuantizeConfig(activation="static", smooth=True,
                                                                dynamic_layers=["*.down_proj"], **EMULATED))
    modes = {n: m.activation for n, m in model.named_modules() if isinstance(m, W8A8Linear)}
    assert {n for n, mode in modes.items() if mode == "dynamic"} == {f"model.layers.{i}.mlp.down_proj" for i in (0, 1)}
    assert model.config.quantization_config.layers == modes


@pytest.mark.parametrize("field,value,pattern", [
    ("activation", "int4", r"config\.activation expected 'dynamic' or 'static'"),
    ("alpha", 1.5, r"config\.alpha expected None or a value in \[0, 1\]"),
    ("alpha_grid", (), r"config\.alpha_grid expected values in \[0, 1\]"),
    ("act_clip", "percentile", r"config\.act_clip expected 'minmax' or 'search'"),
    ("clip_grid", (0.0,), r"config\.clip_grid expected values in \(0, 1\]"),
    ("static_fallback", 0.5, r"config\.static_fallback expected None or >= 1"),
    ("search_tokens", 0, r"config\.search_tokens expected > 0"),
    ("backend", "cuda", r"config\.backend expected 'kernels' or 'emulation'"),
])
def test_config_values_outside_their_domain_name_the_field(field, value, pattern):
    with pytest.raises(InvalidProblem, match=r"quantize_model: " + pattern):
        quantize_model(_llama(), _batches(1), replace(QuantizeConfig(**EMULATED), **{field: value}))
