"""baracuda_numba.torch modules and model conversion, against PyTorch (torch.ao FakeQuantize, nn.Linear)."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")

from torch import nn  # noqa: E402
from torch.ao.quantization import FakeQuantize as TorchFakeQuantize  # noqa: E402
from torch.ao.quantization.observer import (  # noqa: E402
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
)

from baracuda_numba import InvalidProblem  # noqa: E402
from baracuda_numba.torch import (  # noqa: E402
    EmulatedW8A8Linear,
    FakeQuantize,
    QuantizeConfig,
    StateDictMismatch,
    W8A8Linear,
    calibrate,
    quantize_model,
    smooth,
)
from tests.conftest import SIMULATOR  # noqa: E402

DEVICE = "cpu" if SIMULATOR else "cuda"


def _batches(count, shape, seed=0, outlier=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        x = torch.randn(shape, generator=g) * (1 + i)
        if outlier is not None:
            x[..., outlier] *= 30  # an activation outlier channel, as in LLMs
        out.append(x.to(DEVICE))
    return out


# -- FakeQuantize against torch.ao.quantization.FakeQuantize ----------------------------------------


@pytest.mark.parametrize("observer,torch_observer,granularity,symmetric,dtype", [
    ("minmax", MinMaxObserver, "per_tensor", True, torch.int8),
    ("moving_average", MovingAverageMinMaxObserver, "per_tensor", False, torch.uint8),
    ("moving_average", MovingAverageMinMaxObserver, "per_tensor", True, torch.uint8),
    ("moving_average", MovingAverageMinMaxObserver, "per_tensor", True, "uint8-default-range"),
    ("minmax", PerChannelMinMaxObserver, "per_channel", False, torch.int8),
    ("moving_average", MovingAveragePerChannelMinMaxObserver, "per_channel", True, torch.int8),
])
def test_fake_quantize_module_matches_torch_ao(observer, torch_observer, granularity, symmetric, dtype):
    qscheme = {("per_tensor", True): torch.per_tensor_symmetric, ("per_tensor", False): torch.per_tensor_affine,
               ("per_channel", True): torch.per_channel_symmetric,
               ("per_channel", False): torch.per_channel_affine}[granularity, symmetric]
    default_range = dtype == "uint8-default-range"
    dtype = torch.uint8 if default_range else dtype
    low, high = (-128, 127) if dtype == torch.int8 else (0, 255)
    extra = {"ch_axis": 1} if granularity == "per_channel" else {}
    if default_range:  # torch.ao centres a symmetric quint8 on 128 only for its default range
        extra["quant_min"] = extra["quant_max"] = None
    kwargs = {"quant_min": low, "quant_max": high, "dtype": torch.qint8 if dtype == torch.int8 else torch.quint8,
              "qscheme": qscheme, **extra}
    if "moving" in observer:
        kwargs["averaging_constant"] = 0.1
    theirs = TorchFakeQuantize(observer=torch_observer, **kwargs)
    custom = {} if default_range else {"q_min": low, "q_max": high}
    ours = FakeQuantize(dtype=dtype, granularity=granularity, ch_axis=1, observer=observer, averaging_constant=0.1,
                        symmetric=symmetric, **custom).to(DEVICE)
    theirs.to(DEVICE)
    for x in _batches(3, (4, 6), seed=3):
        x = x + 0.5  # an asymmetric range
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), theirs(xb)
        torch.testing.assert_close(ours.scale, theirs.scale.float(), rtol=0, atol=0)
        assert torch.equal(ours.zero_point, theirs.zero_point.to(torch.int32))
        assert torch.equal(ya, yb)
        ya.sum().backward()
        yb.sum().backward()
        assert torch.equal(xa.grad, xb.grad)


def test_fake_quantize_switches_and_state_dict_round_trip():
    fq = FakeQuantize(granularity="per_channel", ch_axis=0).to(DEVICE)
    x = _batches(1, (3, 5))[0]
    fq(x)
    fq.disable_observer()
    before = fq.scale.clone()
    fq(x * 10)
    assert torch.equal(fq.scale, before)  # observer off: parameters frozen
    fq.disable_fake_quant()
    assert torch.equal(fq(x), x)
    buffer = io.BytesIO()
    torch.save(fq.state_dict(), buffer)
    buffer.seek(0)
    fresh = FakeQuantize(granularity="per_channel", ch_axis=0).to(DEVICE)
    fresh.load_state_dict(torch.load(buffer))
    for name in ("scale", "zero_point", "min_val", "max_val", "fake_quant_enabled", "observer_enabled"):
        assert torch.equal(getattr(fresh, name), getattr(fq, name)), name


def test_fake_quantize_errors_name_the_argument():
    with pytest.raises(InvalidProblem, match=r"FakeQuantize: observer expected"):
        FakeQuantize(observer="histogram")
    with pytest.raises(InvalidProblem, match=r"FakeQuantize: dtype expected"):
        FakeQuantize(dtype=torch.int32)


# -- W8A8Linear ------------------------------------------------------------------------------------


def _linear(k=32, n=8, seed=0, bias=True):
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=bias).to(DEVICE)


def _w8a8_reference(x, linear, act_scale=None):
    """float64 model of W8A8: symmetric per-channel int8 weight, per-token (or static) int8 activations."""
    w = linear.weight.detach().double()
    ws = (w.abs().amax(dim=1) / 127).float().double()
    wq = torch.clamp(torch.round(w * (1 / ws.float()).double()[:, None]), -127, 127)
    xd = x.double()
    if act_scale is None:
        xs = (xd.abs().amax(dim=-1, keepdim=True) / 127).float().double()
    else:
        xs = torch.tensor(act_scale, dtype=torch.float64)
    xq = torch.clamp(torch.round(xd * (1 / xs.float()).double()), -127, 127)
    y = (xq @ wq.T) * xs * ws
    return y + linear.bias.detach().double() if linear.bias is not None else y


@pytest.mark.parametrize("activation", ["dynamic", "static"])
def test_w8a8_linear_matches_a_float64_model_and_nn_linear(activation):
    linear = _linear()
    x = _batches(1, (3, 32), seed=4)[0]
    act_scale = float(x.abs().max()) / 127 if activation == "static" else None
    module = W8A8Linear.from_float(linear, activation=activation, act_scale=act_scale)
    y = module(x)
    assert y.shape == (3, 8) and y.dtype == x.dtype
    torch.testing.assert_close(y.double(), _w8a8_reference(x, linear, act_scale), rtol=2e-6, atol=2e-6)
    reference = linear(x).detach()
    assert float((y - reference).norm() / reference.norm()) < 0.05


def test_w8a8_linear_weights_against_torch_per_channel_quantize():
    linear = _linear(bias=False)
    module = W8A8Linear.from_float(linear)
    w = linear.weight.detach()
    scale = (w.abs().amax(dim=1) / 127)
    theirs = torch.quantize_per_channel(w.cpu(), scale.double().cpu(), torch.zeros(8, dtype=torch.long), 0,
                                        torch.qint8).int_repr()
    assert torch.equal(module.weight_q.cpu(), theirs)
    assert module.bias is None


def test_w8a8_linear_state_dict_round_trip():
    module = W8A8Linear.from_float(_linear(), activation="static", act_scale=0.02)
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    fresh = W8A8Linear(32, 8, activation="static", act_scale=1.0).to(DEVICE)
    fresh.load_state_dict(torch.load(buffer))
    x = _batches(1, (2, 32))[0]
    assert fresh._act_scale == pytest.approx(0.02, rel=1e-7)
    assert torch.equal(fresh(x), module(x))


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


# The state dicts below come from EmulatedW8A8Linear.from_float: the same buffers as W8A8Linear's, bit for bit
# (test_emulated_w8a8_linear_is_the_kernel_bit_for_bit), without a simulated kernel per test.


def test_w8a8_state_dict_keys_follow_the_activation_mode():
    dynamic = EmulatedW8A8Linear.from_float(_linear(), name="fc")
    static = EmulatedW8A8Linear.from_float(_linear(), activation="static", act_scale=0.02, name="fc")
    assert set(dynamic.state_dict()) == {"weight_q", "weight_scale", "bias"}
    assert set(static.state_dict()) == {"weight_q", "weight_scale", "bias", "act_scale"}
    assert {k: v.dtype for k, v in static.state_dict().items()} == {
        "weight_q": torch.int8, "weight_scale": torch.float32, "bias": torch.float32, "act_scale": torch.float32}
    with pytest.raises(StateDictMismatch, match=r"fc: act_scale expected no act_scale \(dynamic activations\)"):
        W8A8Linear(32, 8, name="fc").load_state_dict(_state(static))
    with pytest.raises(StateDictMismatch, match=r"fc: act_scale expected a static layer's activation scale, got no"):
        W8A8Linear(32, 8, activation="static", act_scale=1.0, name="fc").load_state_dict(_state(dynamic))
    # strict=False does not make a mismatch load silently
    with pytest.raises(StateDictMismatch, match=r"act_scale"):
        W8A8Linear(32, 8, name="fc").load_state_dict(_state(static), strict=False)


def _perturb(state, kind):
    """One way a state dict can fail to fit; returns the key the error must name."""
    if kind == "shape":
        state["weight_q"] = state["weight_q"][:, :-1].contiguous()
        return "weight_q"
    if kind == "rows":
        state["weight_scale"] = state["weight_scale"][:-1].clone()
        return "weight_scale"
    if kind == "weight_dtype":
        state["weight_q"] = state["weight_q"].to(torch.int32)
        return "weight_q"
    if kind == "scale_dtype":
        state["weight_scale"] = state["weight_scale"].half()
        return "weight_scale"
    if kind == "missing_bias":
        del state["bias"]
        return "bias"
    if kind == "float_weight":
        state["weight"] = state["weight_q"].float()
        return "weight"
    if kind in ("nan_scale", "zero_scale", "negative_scale"):
        state["weight_scale"][1] = {"nan_scale": float("nan"), "zero_scale": 0.0, "negative_scale": -0.5}[kind]
        return "weight_scale"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["shape", "rows", "weight_dtype", "scale_dtype", "missing_bias", "float_weight",
                                  "nan_scale", "zero_scale", "negative_scale"])
@pytest.mark.parametrize("activation", ["dynamic", "static"])
def test_w8a8_state_dict_mismatch_names_the_key(kind, activation):
    act_scale = 0.02 if activation == "static" else None
    module = EmulatedW8A8Linear.from_float(_linear(), activation=activation, act_scale=act_scale, name="layers.0.fc")
    state = _state(module)
    key = _perturb(state, kind)
    fresh = W8A8Linear(32, 8, activation=activation, act_scale=act_scale and 1.0, name="layers.0.fc").to(DEVICE)
    before = _state(fresh)
    with pytest.raises(StateDictMismatch, match=rf"layers\.0\.fc: {key} expected"):
        fresh.load_state_dict(state)
    for name, value in before.items():  # nothing was loaded
        assert torch.equal(fresh.state_dict()[name], value), name
    # one level down, the error names the prefixed key
    parent = nn.Sequential(W8A8Linear(32, 8, activation=activation, act_scale=act_scale and 1.0, name="0"))
    with pytest.raises(StateDictMismatch, match=rf"0: 0\.{key} expected"):
        parent.load_state_dict({f"0.{k}": v for k, v in state.items()})


def test_w8a8_zero_scale_is_fine_on_an_all_zero_row():
    module = EmulatedW8A8Linear.from_float(_linear(), name="fc")
    state = _state(module)
    state["weight_q"][2] = 0
    state["weight_scale"][2] = 0.0
    fresh = W8A8Linear(32, 8, name="fc").to(DEVICE)
    fresh.load_state_dict(state)
    assert float(fresh.weight_scale[2]) == 0.0


def test_w8a8_bad_static_scale_in_a_state_dict_names_the_key():
    module = EmulatedW8A8Linear.from_float(_linear(), activation="static", act_scale=0.02, name="fc")
    for bad in (0.0, float("inf"), float("nan")):
        state = _state(module)
        state["act_scale"].fill_(bad)
        with pytest.raises(StateDictMismatch, match=r"fc: act_scale expected a finite scale > 0"):
            W8A8Linear(32, 8, activation="static", act_scale=1.0, name="fc").load_state_dict(state)


def test_w8a8_scales_stay_float32_when_the_model_is_cast():
    linear = _linear()
    module = W8A8Linear.from_float(linear, activation="static", act_scale=0.02)
    x = _batches(1, (2, 32))[0]
    expected = module(x.to(torch.bfloat16)) if not SIMULATOR else None
    module.to(torch.bfloat16)
    for name in ("weight_scale", "bias", "act_scale"):
        assert getattr(module, name).dtype == torch.float32, name
    assert module.weight_q.dtype == torch.int8
    if expected is not None:
        assert torch.equal(module(x.to(torch.bfloat16)), expected)
    module.half()
    assert module.weight_scale.dtype == torch.float32


def test_emulated_w8a8_linear_is_the_kernel_bit_for_bit():
    # the pure-PyTorch emulation (the reference of the model-level tests) against the project's kernels
    linear = _linear(k=48, n=24, seed=3)
    x = _batches(1, (5, 48), seed=6, outlier=7)[0]
    for activation, act_scale in (("dynamic", None), ("static", float(x.abs().max()) / 127 * 0.5)):
        ours = W8A8Linear.from_float(linear, activation=activation, act_scale=act_scale)
        emulated = EmulatedW8A8Linear.from_float(linear, activation=activation, act_scale=act_scale)
        assert torch.equal(ours.weight_q, emulated.weight_q)
        assert torch.equal(ours.weight_scale, emulated.weight_scale)
        assert torch.equal(ours(x), emulated(x)), activation
        torch.testing.assert_close(emulated(x).double(), _w8a8_reference(x, linear, act_scale), rtol=2e-6, atol=2e-6)


def test_w8a8_linear_errors_name_the_layer():
    with pytest.raises(InvalidProblem, match=r"layers.0.fc: act_scale expected"):
        W8A8Linear.from_float(_linear(), activation="static", name="layers.0.fc")
    module = W8A8Linear.from_float(_linear(), name="layers.0.fc")
    with pytest.raises(InvalidProblem, match=r"layers.0.fc: x expected \[\.\.\., 32\]"):
        module(torch.zeros(2, 16, device=DEVICE))


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0, 0.0])
def test_from_float_refuses_a_bad_weight_or_static_scale(bad):
    # checked once where the weight is prepared (a device array is not read at each call)
    linear = _linear()
    with torch.no_grad():
        linear.weight[3, 5] = bad
    if bad == bad and abs(bad) != float("inf"):  # -1 and 0 are fine weights
        W8A8Linear.from_float(linear, name="layers.0.fc")
    else:
        with pytest.raises(InvalidProblem, match=r"layers.0.fc: linear.weight expected finite weights"):
            W8A8Linear.from_float(linear, name="layers.0.fc")
    with pytest.raises(InvalidProblem, match=r"layers.0.fc: act_scale expected"):
        W8A8Linear.from_float(_linear(), activation="static", act_scale=bad, name="layers.0.fc")


# -- model level -----------------------------------------------------------------------------------


class _Block(nn.Module):
    """LayerNorm feeding two linears (like q / k), then a linear fed by something else."""

    def __init__(self, d=16, norm=nn.LayerNorm):
        super().__init__()
        self.norm = norm(d)
        self.q = nn.Linear(d, 8)
        self.k = nn.Linear(d, 8)
        self.out = nn.Linear(16, d)
        self.lm_head = nn.Linear(d, 4)

    def forward(self, x):
        h = self.norm(x)
        y = self.out(torch.cat([self.q(h), self.k(h)], dim=-1))
        return self.lm_head(y + x)


def _block(norm=nn.LayerNorm):
    torch.manual_seed(0)
    block = _Block(norm=norm).to(DEVICE)
    with torch.no_grad():
        block.norm.weight.uniform_(0.5, 1.5)
        if getattr(block.norm, "bias", None) is not None:
            block.norm.bias.uniform_(-0.1, 0.1)
    return block


@pytest.mark.parametrize("norm", [nn.LayerNorm, getattr(nn, "RMSNorm", nn.LayerNorm)])
def test_smoothing_keeps_the_function_and_flattens_the_outlier(norm):
    block = _block(norm)
    batches = _batches(2, (3, 16), outlier=5)
    expected = block(batches[0])
    calibration = calibrate(block, batches, QuantizeConfig(progress=False))
    assert calibration.norm_consumers == {"norm": ["q", "k"]}
    assert set(calibration.act_absmax) == {"q", "k", "out", "lm_head"}  # every linear is observed
    h = block.norm(torch.cat(batches))
    torch.testing.assert_close(calibration.act_absmax["q"], h.abs().amax(dim=0), rtol=0, atol=0)
    spread_before = float(calibration.act_absmax["q"].max() / calibration.act_absmax["q"].median())
    scales = smooth(block, calibration, alpha=0.5)
    assert set(scales) == {"norm"}
    torch.testing.assert_close(block(batches[0]), expected, rtol=1e-5, atol=1e-5)
    spread_after = float(calibration.act_absmax["q"].max() / calibration.act_absmax["q"].median())
    assert spread_after < spread_before


@pytest.mark.parametrize("config", [QuantizeConfig(progress=False),
                                    QuantizeConfig(activation="static", smooth=True, alpha=0.8, progress=False)],
                         ids=["dynamic", "static-smooth"])
def test_quantize_model_swaps_selected_linears(config):
    block = _block()
    batches = _batches(2, (3, 16), outlier=5)
    expected = block(batches[0]).detach()
    seen = []
    quantize_model(block, batches, config, on_layer=lambda name, layer: seen.append(name))
    assert seen == ["q", "k", "out"]
    assert isinstance(block.q, W8A8Linear) and isinstance(block.lm_head, nn.Linear)
    got = block(batches[0])
    assert float((got.detach() - expected).norm() / expected.norm()) < 0.05


def test_smoothing_skips_a_norm_with_an_unselected_consumer():
    block = _block()
    batches = _batches(2, (3, 16), outlier=5)
    expected = block(batches[0]).detach()
    calibration = calibrate(block, batches, QuantizeConfig(progress=False))
    norm_weight = block.norm.weight.detach().clone()
    assert smooth(block, calibration, 0.5, QuantizeConfig(include=["q"])) == {}
    assert torch.equal(block.norm.weight, norm_weight)
    torch.testing.assert_close(block(batches[0]), expected, rtol=0, atol=0)


def test_quantize_model_errors_name_the_argument():
    with pytest.raises(InvalidProblem, match=r"quantize_model: batches expected"):
        quantize_model(_block(), None, QuantizeConfig(smooth=True))
    with pytest.raises(InvalidProblem, match=r"calibrate: config.include expected"):
        calibrate(_block(), _batches(1, (2, 16)), QuantizeConfig(include=["nothing*"], progress=False))


def test_calibration_shows_progress(capsys):
    calibrate(_block(), _batches(2, (2, 16)), QuantizeConfig(progress=True))
    captured = capsys.readouterr()
    assert "2/2" in captured.err


def test_fake_quantize_on_another_device_than_its_buffers_is_refused_by_name():
    # torch.ao's FakeQuantize needs .to(device) too; ours says so instead of failing inside an observer op
    fq = FakeQuantize(observer="minmax")
    with pytest.raises(InvalidProblem, match=r"FakeQuantize: x expected a tensor on cpu .*got a tensor on meta"):
        fq(torch.empty(4, 8, device="meta"))


def test_per_tensor_fake_quantize_output_takes_in_place_ops_and_keeps_its_gradient():
    """The per-tensor output is not a view made inside the autograd Function (its reshapes happen there): an in-place
    op on it is allowed, as on torch.ao's, and the gradient stays the masked one."""
    theirs = TorchFakeQuantize(observer=MinMaxObserver, quant_min=-128, quant_max=127, dtype=torch.qint8,
                               qscheme=torch.per_tensor_symmetric).to(DEVICE)
    ours = FakeQuantize(dtype=torch.int8, granularity="per_tensor", observer="minmax", q_min=-128, q_max=127).to(DEVICE)
    x = _batches(1, (3, 4, 5), seed=7)[0]
    for module in (ours, theirs):
        module(x)
        module.disable_observer()
    xa, xb = (x * 3).requires_grad_(), (x * 3).requires_grad_()  # past the observed range: a partial mask
    ya, yb = ours(xa), theirs(xb)
    assert ya.shape == x.shape and torch.equal(ya, yb)
    ya.mul_(2)
    yb.mul_(2)
    ya.sum().backward()
    yb.sum().backward()
    assert torch.equal(xa.grad, xb.grad) and 0 < int((xa.grad == 0).sum()) < x.numel()
