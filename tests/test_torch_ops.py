"""baracuda_numba.torch.ops: torch.library.opcheck per op, autograd against PyTorch's fake-quantize ops.

Runs on torch CPU tensors under the simulator (the dispatch functions stage them through the host)
and on CUDA tensors on a GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from baracuda_numba import InvalidProblem  # noqa: E402
from baracuda_numba.torch import ops  # noqa: E402
from tests.conftest import SIMULATOR  # noqa: E402

baracuda = torch.ops.baracuda
DEVICE = "cpu" if SIMULATOR else "cuda"
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def _x(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(dtype).to(DEVICE)


def _scales(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g) * 0.2 + 0.02).to(DEVICE)


def _zps(n, low=-5, high=5, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n,), generator=g, dtype=torch.int32).to(DEVICE)


def _samples():
    """One small sample per op: (name, args)."""
    x = _x((3, 8))
    g = _x((3, 8), seed=5)
    q = torch.randint(-128, 127, (3, 8), dtype=torch.int8, device=DEVICE)
    ch, tok, grp = (_scales(8), _zps(8)), (_scales(3), _zps(3)), (_scales(6).reshape(3, 2), _zps(6).reshape(3, 2))
    wq = torch.randint(-127, 127, (4, 8), dtype=torch.int8, device=DEVICE)
    return {
        "quantize_per_tensor": (x, 0.05, 3, torch.int8, None, None),
        "dequantize_per_tensor": (q, 0.05, 3, torch.float32),
        "quantize_per_tensor_backward": (g, x, 0.05, 3, torch.int8, None, None),
        "dequantize_per_tensor_backward": (g, 0.05, torch.int8),
        "fake_quantize_per_tensor": (x.clone().requires_grad_(), 0.05, 3, -128, 127),
        "fake_quantize_per_tensor_backward": (g, x, 0.05, 3, -128, 127),
        "quantize_per_channel": (x, *ch, 1, torch.int8, None, None),
        "dequantize_per_channel": (q, *ch, 1, torch.float32),
        "quantize_per_channel_backward": (g, x, *ch, 1, torch.int8, None, None),
        "dequantize_per_channel_backward": (g, ch[0], 1, torch.int8),
        "fake_quantize_per_channel": (x.clone().requires_grad_(), *ch, 1, -128, 127),
        "fake_quantize_per_channel_backward": (g, x, *ch, 1, -128, 127),
        "quantize_per_token": (x, *tok, torch.int8, None, None),
        "dequantize_per_token": (q, *tok, torch.float32),
        "quantize_per_token_backward": (g, x, *tok, torch.int8, None, None),
        "dequantize_per_token_backward": (g, tok[0], torch.int8),
        "fake_quantize_per_token": (x.clone().requires_grad_(), tok[0], None, -128, 127),
        "fake_quantize_per_token_backward": (g, x, *tok, -128, 127),
        "quantize_per_group": (x, *grp, 4, torch.int8, None, None),
        "dequantize_per_group": (q, *grp, 4, torch.float32),
        "quantize_per_group_backward": (g, x, *grp, 4, torch.int8, None, None),
        "dequantize_per_group_backward": (g, grp[0], 4, torch.int8),
        "fake_quantize_per_group": (x.clone().requires_grad_(), *grp, 4, -128, 127),
        "fake_quantize_per_group_backward": (g, x, *grp, 4, -128, 127),
        "dynamic_range_quantize": (x, True, "token", torch.int8, None, None),
        "quantized_linear": (x, wq, _scales(4), _scales(4, seed=9)),
        "quantized_linear_out": (x, wq, _scales(4), _scales(4, seed=9), True, 0.04, torch.empty(3, 4, device=DEVICE)),
        "quantized_linear_group_out": (x, [wq[:1], wq[1:]], [_scales(1), _scales(3, seed=4)],
                                       [_scales(1, seed=9), _scales(3, seed=5)], True, None,
                                       torch.empty(3, 4, device=DEVICE)),
        "smoothquant_linear": (q, wq, _scales(4), 0.03, None, torch.float32),
    }


def test_every_op_has_a_sample():
    assert set(_samples()) == set(ops.OPS)


@pytest.mark.parametrize("name", sorted(ops.OPS))
def test_opcheck(name):
    # test_schema, test_autograd_registration, test_faketensor, test_aot_dispatch_dynamic.
    torch.library.opcheck(ops.OPS[name], _samples()[name])


@pytest.mark.parametrize("scope,extra", [("tensor", {}), ("channel", {"axis": 0}), ("group", {"group_size": 4}),
                                         ("token", {})])
def test_dynamic_range_fake_shapes(scope, extra):
    x = _x((3, 8))
    real = baracuda.dynamic_range_quantize(x, False, scope, torch.int8, extra.get("axis"), extra.get("group_size"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = baracuda.dynamic_range_quantize(mode.from_tensor(x), False, scope, torch.int8, extra.get("axis"),
                                               extra.get("group_size"))
    assert [tuple(t.shape) for t in real] == [tuple(t.shape) for t in fake]
    assert [t.dtype for t in real] == [t.dtype for t in fake]


# -- autograd: bit for bit against PyTorch's fake-quantize ops ---------------------------------------


def _torch_oracle_ok(dtype):
    # f64: PyTorch computes in float32; compared only with power-of-two scales (exact either way).
    return dtype != torch.float64


def _pow2_scales(n, seed):
    g = torch.Generator().manual_seed(seed)
    return (2.0 ** torch.randint(-6, -1, (n,), generator=g)).float().to(DEVICE)


def _both_grads(ours, theirs, x, upstream):
    xa = x.clone().requires_grad_()
    xb = x.clone().requires_grad_()
    ya, yb = ours(xa), theirs(xb)
    ya.backward(upstream)
    yb.backward(upstream)
    return ya, yb, xa.grad, xb.grad


def _bits(t):
    return t.detach().cpu().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _special(x, infinities=True):
    """Saturation, signed zeros and (optionally) +-inf: values that exercise the inclusive mask."""
    flat = x.reshape(-1).clone()
    specials = torch.tensor([1e4, -1e4, 0.0, -0.0, *([float("inf"), float("-inf")] if infinities else [])],
                            dtype=x.dtype)
    flat[: min(len(specials), flat.numel())] = specials[: flat.numel()].to(flat.device)
    return flat.reshape(x.shape)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@given(data=st.data())
def test_fake_quantize_per_tensor_autograd_matches_torch(dtype, data):
    rows = data.draw(st.integers(1, 4))
    cols = data.draw(st.integers(1, 9))
    seed = data.draw(st.integers(0, 1000))
    q_min, q_max = data.draw(st.sampled_from([(-128, 127), (0, 255), (-127, 127), (0, 15)]))
    zero_point = data.draw(st.integers(q_min, q_max))
    scale = data.draw(st.sampled_from([0.1, 0.0625, 0.013, 1.0, 3.7]))
    if not _torch_oracle_ok(dtype):
        scale = 2.0 ** round(torch.log2(torch.tensor(scale)).item())
    x = _special(_x((rows, cols), dtype, seed))
    upstream = _x((rows, cols), dtype, seed + 1)
    ya, yb, ga, gb = _both_grads(
        lambda t: baracuda.fake_quantize_per_tensor(t, scale, zero_point, q_min, q_max),
        lambda t: torch.fake_quantize_per_tensor_affine(t, scale, zero_point, q_min, q_max), x, upstream)
    assert torch.equal(_bits(ya), _bits(yb))
    assert torch.equal(_bits(ga), _bits(gb))


def _per_channel_case(data, dtype):
    rows = data.draw(st.integers(1, 4))
    cols = data.draw(st.integers(1, 8))
    seed = data.draw(st.integers(0, 1000))
    q_min, q_max = data.draw(st.sampled_from([(-128, 127), (0, 255), (-127, 127)]))
    # No +-inf: PyTorch's CPU per-channel kernel converts +inf to q_min (an out-of-range float to
    # int conversion); the semantics saturate it, checked in test_infinities_saturate_per_channel.
    x = _special(_x((rows, cols), dtype, seed), infinities=False)
    upstream = _x((rows, cols), dtype, seed + 1)
    return x, upstream, q_min, q_max, seed


def _scales_for(dtype, n, seed):
    return _scales(n, seed) if _torch_oracle_ok(dtype) else _pow2_scales(n, seed)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@given(data=st.data())
def test_fake_quantize_per_channel_autograd_matches_torch(dtype, data):
    x, upstream, q_min, q_max, seed = _per_channel_case(data, dtype)
    axis = data.draw(st.integers(0, 1))
    n = x.shape[axis]
    scales, zps = _scales_for(dtype, n, seed), _zps(n, q_min, min(q_max, q_min + 10), seed)
    ya, yb, ga, gb = _both_grads(
        lambda t: baracuda.fake_quantize_per_channel(t, scales, zps, axis, q_min, q_max),
        lambda t: torch.fake_quantize_per_channel_affine(t, scales, zps, axis, q_min, q_max), x, upstream)
    assert torch.equal(_bits(ya), _bits(yb))
    assert torch.equal(_bits(ga), _bits(gb))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@given(data=st.data())
def test_fake_quantize_per_token_and_group_autograd_match_torch(dtype, data):
    # Per token is per channel along axis 0 of [tokens, D]; per group is per channel along axis 0
    # of [outer * groups, group_size]: PyTorch's per-channel op is the oracle for both.
    x, upstream, q_min, q_max, seed = _per_channel_case(data, dtype)
    rows, cols = x.shape
    scales, zps = _scales_for(dtype, rows, seed), _zps(rows, q_min, min(q_max, q_min + 10), seed)
    ya, yb, ga, gb = _both_grads(
        lambda t: baracuda.fake_quantize_per_token(t, scales, zps, q_min, q_max),
        lambda t: torch.fake_quantize_per_channel_affine(t, scales, zps, 0, q_min, q_max), x, upstream)
    assert torch.equal(_bits(ya), _bits(yb)) and torch.equal(_bits(ga), _bits(gb))

    group = data.draw(st.sampled_from([d for d in (1, 2, 4) if cols % d == 0]))
    count = rows * cols // group
    gscales, gzps = _scales_for(dtype, count, seed + 3), _zps(count, q_min, min(q_max, q_min + 10), seed + 3)
    ya, yb, ga, gb = _both_grads(
        lambda t: baracuda.fake_quantize_per_group(t, gscales.reshape(rows, -1), gzps.reshape(rows, -1), group,
                                                   q_min, q_max),
        lambda t: torch.fake_quantize_per_channel_affine(t.reshape(count, group), gscales, gzps, 0, q_min,
                                                         q_max).reshape(rows, cols), x, upstream)
    assert torch.equal(_bits(ya), _bits(yb)) and torch.equal(_bits(ga), _bits(gb))


@pytest.mark.parametrize("op", ["channel", "token", "group"])
def test_infinities_saturate_per_channel(op):
    # One segment: the per-tensor op (PyTorch's, which saturates) is the oracle for +-inf.
    x = torch.tensor([[float("inf"), float("-inf"), 1.0, 1e30]], device=DEVICE)
    scale, zp = torch.tensor([0.1], device=DEVICE), torch.tensor([3], dtype=torch.int32, device=DEVICE)
    call = {"channel": lambda t: baracuda.fake_quantize_per_channel(t, scale, zp, 0, -128, 127),
            "token": lambda t: baracuda.fake_quantize_per_token(t, scale, zp, -128, 127),
            "group": lambda t: baracuda.fake_quantize_per_group(t, scale[None], zp[None], 4, -128, 127)}[op]
    ya, yb, ga, gb = _both_grads(call, lambda t: torch.fake_quantize_per_tensor_affine(t, 0.1, 3, -128, 127), x,
                                 torch.ones_like(x))
    assert torch.equal(_bits(ya), _bits(yb)) and torch.equal(_bits(ga), _bits(gb))


def test_nan_propagates_with_a_zero_gradient():
    # The semantics (reference.elementwise): NaN propagates and its mask is false. PyTorch's CPU
    # kernel maps NaN to q_min instead, so it is the oracle only for the other elements.
    x = torch.tensor([[float("nan"), 1.0, -2.0]], device=DEVICE)
    upstream = torch.full_like(x, 0.5)
    ya, yb, ga, gb = _both_grads(lambda t: baracuda.fake_quantize_per_tensor(t, 0.1, 0, -128, 127),
                                 lambda t: torch.fake_quantize_per_tensor_affine(t, 0.1, 0, -128, 127), x, upstream)
    assert ya[0, 0].isnan() and ga[0, 0] == 0
    assert torch.equal(_bits(ya[:, 1:]), _bits(yb[:, 1:])) and torch.equal(_bits(ga[:, 1:]), _bits(gb[:, 1:]))


def test_empty_tensor_round_trips():
    x = torch.empty(0, 4, device=DEVICE)
    assert baracuda.quantize_per_tensor(x, 0.1, 0, torch.int8, None, None).shape == (0, 4)


def test_errors_are_typed_and_name_the_argument():
    with pytest.raises(InvalidProblem, match=r"quantize_per_channel.*scales"):
        baracuda.quantize_per_channel(_x((3, 8)), _scales(5), _zps(5), 1, torch.int8, None, None)


# -- torch.compile ---------------------------------------------------------------------------------


class _FakeQuantMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.register_buffer("scales", _scales(4).cpu())
        self.register_buffer("zps", torch.zeros(4, dtype=torch.int32))

    def forward(self, x):
        x = baracuda.fake_quantize_per_tensor(x, 0.05, 0, -128, 127)
        y = self.fc(x)
        return baracuda.fake_quantize_per_token(y, self.scales, None, -128, 127)


def test_torch_compile_fullgraph_traces_the_ops():
    # aot_eager: dynamo + AOTAutograd (fake tensors, functionalisation) without Inductor's C++ build.
    model = _FakeQuantMLP().to(DEVICE)
    x = _x((4, 8))
    expected = model(x)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), expected)
    xr = x.clone().requires_grad_()
    compiled(xr).sum().backward()
    assert xr.grad is not None and xr.grad.shape == x.shape


@pytest.mark.slow
def test_torch_compile_inductor_fullgraph():
    # Inductor on CPU compiles C++ for the surrounding graph (gcc); the custom ops stay opaque calls.
    model = _FakeQuantMLP().to(DEVICE)
    x = _x((4, 8))
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("activation", ["dynamic", "static"])
def test_a_compiled_w8a8_layer_writes_into_a_buffer_of_the_compiled_code_with_the_eager_bits(activation):
    """Under torch.compile the layer calls ``baracuda::quantized_linear_out`` into a buffer the compiled code
    allocates (Inductor reuses it; no output of ours to allocate per call), with the bits of an eager call."""
    from baracuda_numba.torch import W8A8Linear

    torch.manual_seed(3)
    layer = W8A8Linear.from_float(torch.nn.Linear(32, 16).to(DEVICE), activation=activation,
                                  act_scale=0.03 if activation == "static" else None)
    x = _x((2, 32))
    seen = []

    def recording(gm, example_inputs):
        seen.extend(node.target for node in gm.graph.nodes if node.op == "call_function")
        return gm

    with torch.no_grad():
        expected = layer(x)
        assert torch.equal(torch.compile(layer, fullgraph=True, backend=recording)(x), expected)
        torch._dynamo.reset()
        assert torch.equal(torch.compile(layer, fullgraph=True, backend="aot_eager")(x), expected)
    assert torch.ops.baracuda.quantized_linear_out.default in seen
    assert torch.ops.baracuda.quantized_linear.default not in seen


def test_the_package_imports_without_torch():
    # A fresh interpreter where `import torch` fails: baracuda_numba must import, and the PyTorch
    # layer must say what to install.
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "import baracuda_numba\n"
            "try:\n    import baracuda_numba.torch\nexcept ImportError as e:\n    print('ERR', e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "ERR baracuda_numba.torch needs PyTorch" in result.stdout


# -- the fused fake quantize in eager mode and under torch.compile ----------------------------------


def _launch_counter(monkeypatch):
    from baracuda_numba.launch import KernelLauncher

    launches = []
    for method in ("launch", "launch_patched", "launch_values"):
        original = getattr(KernelLauncher, method)
        monkeypatch.setattr(KernelLauncher, method, (lambda fn: lambda self, *a, **k: launches.append(fn.__name__)
                                                     or fn(self, *a, **k))(original))
    return launches


@pytest.mark.parametrize("family", ["channel", "token", "group"])
def test_eager_function_and_custom_op_give_the_same_bits(family):
    x = _special(_x((6, 8), torch.bfloat16, seed=4), infinities=False)
    upstream = _x((6, 8), torch.bfloat16, seed=5)
    count, layout = {"channel": (8, 1), "token": (6, None), "group": (12, 4)}[family]
    scales, zps = _scales(count, seed=6), _zps(count, seed=7)
    if family == "group":
        scales, zps = scales.reshape(6, 2), zps.reshape(6, 2)
    op = ops._FAMILIES[family]["fake_quantize"]
    args = (scales, zps, -128, 127) if family == "token" else (scales, zps, layout, -128, 127)
    ya, yb, ga, gb = _both_grads(lambda t: ops.fake_quantize_with_grad(family, t, scales, zps, layout, -128, 127),
                                 lambda t: op(t, *args), x, upstream)
    assert torch.equal(_bits(ya), _bits(yb)) and torch.equal(_bits(ga), _bits(gb))


def test_fake_quantize_module_is_one_kernel_forward_and_one_backward(monkeypatch):
    """The fake quantize is one kernel forward and one backward; observing adds the observer's one update
    launch on CUDA tensors (torch ops on the CPU)."""
    from baracuda_numba.torch import FakeQuantize

    launches = _launch_counter(monkeypatch)
    for granularity in ("per_channel", "per_tensor"):
        fq = FakeQuantize(granularity=granularity, ch_axis=0, observer="minmax").to(DEVICE)
        w = _x((16, 8), torch.float32).requires_grad_()
        observer = 1 if w.is_cuda else 0
        launches.clear()
        y = fq(w)
        assert len(launches) == 1 + observer, (granularity, launches)
        y.backward(torch.ones_like(y))
        assert len(launches) == 2 + observer, (granularity, launches)
        fq.disable_observer()
        launches.clear()
        y = fq(w)
        y.backward(torch.ones_like(y))
        assert len(launches) == 2, (granularity, launches)


def test_fake_quantize_module_compiles_fullgraph_and_matches_eager():
    # No host read of a device value in forward (the switches are host values): one graph, the
    # custom op inside it, the same bits and gradients as eager.
    from baracuda_numba.torch import FakeQuantize

    for granularity, observer in (("per_channel", "minmax"), ("per_tensor", "moving_average")):
        eager = FakeQuantize(granularity=granularity, ch_axis=1, observer=observer, symmetric=False).to(DEVICE)
        compiled_module = FakeQuantize(granularity=granularity, ch_axis=1, observer=observer,
                                       symmetric=False).to(DEVICE)
        compiled = torch.compile(compiled_module, fullgraph=True, backend="aot_eager")
        for step in range(3):
            x = _x((4, 6), seed=10 + step) + 0.5
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            ya, yb = eager(xa), compiled(xb)
            ya.backward(torch.ones_like(ya))
            yb.backward(torch.ones_like(yb))
            assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad), (granularity, step)
            assert torch.equal(eager.scale, compiled_module.scale)
            assert torch.equal(eager.zero_point, compiled_module.zero_point)
        compiled_module.disable_fake_quant()
        assert torch.equal(compiled(x), x)  # a switch recompiles (a guard on the host value)


@pytest.mark.parametrize("case", ["tensor-affine-moving_average", "channel-symmetric-minmax",
                                  "channel-affine-moving_average"])
def test_fake_quantize_module_on_bf16_matches_torch_ao(case):
    # The range reduced in bf16 (no float32 copy), promoted exactly into the float32 state: torch.ao's
    # scales, zero points, outputs and gradients over a few steps of a bf16 weight.
    from torch.ao.quantization import FakeQuantize as TorchFakeQuantize
    from torch.ao.quantization import observer as obs

    from baracuda_numba.torch import FakeQuantize

    granularity, scheme, observer = case.split("-")
    per_channel, symmetric, moving = granularity == "channel", scheme == "symmetric", observer == "moving_average"
    torch_observer = {(True, True): obs.MovingAveragePerChannelMinMaxObserver,
                      (True, False): obs.PerChannelMinMaxObserver, (False, True): obs.MovingAverageMinMaxObserver,
                      (False, False): obs.MinMaxObserver}[per_channel, moving]
    qscheme = {(True, True): torch.per_channel_symmetric, (True, False): torch.per_channel_affine,
               (False, True): torch.per_tensor_symmetric, (False, False): torch.per_tensor_affine}[
        per_channel, symmetric]
    low, high = (-128, 127) if symmetric else (0, 255)
    extra = {"ch_axis": 0} if per_channel else {}
    if moving:
        extra["averaging_constant"] = 0.1
    theirs = TorchFakeQuantize(observer=torch_observer, quant_min=low, quant_max=high, qscheme=qscheme,
                               dtype=torch.qint8 if symmetric else torch.quint8, **extra).to(DEVICE)
    ours = FakeQuantize(dtype=torch.int8 if symmetric else torch.uint8, granularity=f"per_{granularity}", ch_axis=0,
                        observer=observer, averaging_constant=0.1, symmetric=symmetric, q_min=low,
                        q_max=high).to(DEVICE)
    for step in range(3):
        w = (_x((8, 16), seed=20 + step) + 0.3 * step).to(torch.bfloat16)
        upstream = _x((8, 16), torch.bfloat16, seed=30 + step)
        wa, wb = w.clone().requires_grad_(), w.clone().requires_grad_()
        ya, yb = ours(wa), theirs(wb)
        ya.backward(upstream)
        yb.backward(upstream)
        assert torch.equal(ours.scale, theirs.scale.float()), step
        assert torch.equal(ours.zero_point, theirs.zero_point.to(torch.int32)), step
        assert torch.equal(_bits(ya), _bits(yb)) and torch.equal(_bits(wa.grad), _bits(wb.grad)), step
