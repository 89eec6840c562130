"""Bit-for-bit agreement with PyTorch on the GPU (skipped, with the reason, under the simulator)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import requires_gpu

import baracuda_numba as bn

torch = pytest.importorskip("torch")
pytestmark = [requires_gpu, pytest.mark.gpu]

TORCH_FLOATS = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}


def scales_for(name):
    # torch computes with a float32 scale and reciprocal, and float32 math even for float64 input:
    # for f64 only power-of-two scales make the two contracts coincide.
    return [2.0**-5, 0.5, 1.0] if name == "f64" else [0.0213, 2.0**-5, 0.1, 0.00214854861, 3.7]


def inputs(dtype, n=1 << 16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, device="cuda", generator=g, dtype=torch.float32) * 4
    x[:8] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, float("inf"), float("-inf"), 0.0])
    return x.to(dtype)


@pytest.mark.parametrize("name", TORCH_FLOATS)
@pytest.mark.parametrize(("q_min", "q_max", "zp"), [(-128, 127, 0), (0, 255, 128), (-8, 7, -3)])
def test_fake_quantize_forward_and_autograd_backward(name, q_min, q_max, zp):
    dtype = TORCH_FLOATS[name]
    for i, scale in enumerate(scales_for(name)):
        x = inputs(dtype, seed=i).requires_grad_(True)
        expected = torch.fake_quantize_per_tensor_affine(x, scale, zp, q_min, q_max)
        dy = torch.randn_like(x)
        expected.backward(dy)
        got = bn.fake_quantize(x.detach(), scale, zp, q_min, q_max)
        assert got.dtype == dtype and torch.equal(got, expected.detach()), (name, scale)
        grad = bn.fake_quantize_backward(dy, x.detach(), scale, zp, q_min, q_max)
        assert torch.equal(grad, x.grad), (name, scale)
        # quantize backward = fake-quantize gradient times 1/scale (float32 reciprocal)
        if name == "f32":
            inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(scale, dtype=torch.float32)
            dq = bn.quantize_per_tensor_backward(dy, x.detach(), scale, zp, q_min=q_min, q_max=q_max,
                                                  dtype="int8" if q_min < 0 else "uint8")
            assert torch.equal(dq, x.grad * inv.cuda())


@pytest.mark.parametrize(("torch_dtype", "dtype", "zp"), [("qint8", "int8", 0), ("qint8", "int8", -7),
                                                          ("quint8", "uint8", 128)])
def test_quantize_and_dequantize_match_torch(torch_dtype, dtype, zp):
    for i, scale in enumerate(scales_for("f32")):
        x = inputs(torch.float32, seed=10 + i)
        tq = torch.quantize_per_tensor(x, scale, zp, getattr(torch, torch_dtype))
        q = bn.quantize_per_tensor(x, scale, zp, dtype=dtype)
        assert torch.equal(q, tq.int_repr()), scale
        y = bn.dequantize_per_tensor(q, scale, zp)
        # README, "Semantics": float32 math with a float32 scale (as fake_quantize_per_tensor_affine); torch's
        # Tensor.dequantize multiplies by the float64 scale, so the two agree where scale is exact.
        assert torch.equal(y, (q.float() - zp) * torch.tensor(scale, dtype=torch.float32, device="cuda"))
        if scale == 2.0**-5:
            assert torch.equal(y, tq.dequantize())
        # dequantize(quantize(x)) is fake_quantize(x), bit for bit
        q_min, q_max = (-128, 127) if dtype == "int8" else (0, 255)
        assert torch.equal(y, torch.fake_quantize_per_tensor_affine(x, scale, zp, q_min, q_max))


def test_runs_on_the_current_torch_stream():
    x = inputs(torch.float32, n=1 << 22)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = bn.fake_quantize(x, 0.05)
        z = y * 2  # ordered after our kernel only if it ran on `side`
    side.synchronize()
    assert torch.equal(z, torch.fake_quantize_per_tensor_affine(x, 0.05, 0, -128, 127) * 2)


def test_large_tensor_far_end_is_written():
    n = (1 << 31) + 24 + 5  # past 2**31 elements, with a tail
    x = torch.empty(n, dtype=torch.int8, device="cuda")
    x.fill_(3)
    y = bn.dequantize_per_tensor(x, 0.5, 1, dtype="float16")
    assert y[-1].item() == 1.0 and y[(1 << 31) + 3].item() == 1.0 and y[0].item() == 1.0
    del y
    q = bn.quantize_per_tensor_backward(torch.ones(8, device="cuda"), torch.zeros(8, device="cuda"), 0.5)
    assert torch.equal(q, torch.full((8,), 2.0, device="cuda"))
    np.testing.assert_equal(int((x == 3).sum().item()), n)


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_per_channel_matches_fake_quantize_per_channel_affine(name, axis):
    dtype = TORCH_FLOATS[name]
    g = torch.Generator(device="cuda").manual_seed(axis)
    x = (torch.randn(8, 16, 33, device="cuda", generator=g) * 3).to(dtype)
    channels = x.shape[axis]
    scales = torch.rand(channels, device="cuda", generator=g) * 0.1 + 0.01
    zero_points = torch.randint(-10, 10, (channels,), device="cuda", generator=g, dtype=torch.int32)
    x.requires_grad_(True)
    expected = torch.fake_quantize_per_channel_affine(x, scales, zero_points, axis, -128, 127)
    dy = torch.randn_like(x)
    expected.backward(dy)
    q = bn.quantize_per_channel(x.detach(), scales, zero_points, axis)
    assert torch.equal(bn.dequantize_per_channel(q, scales, zero_points, axis, dtype=dtype), expected.detach())
    dx = bn.quantize_per_channel_backward(dy, x.detach(), scales, zero_points, axis)
    shape = [1] * 3
    shape[axis] = channels
    inv = (1.0 / scales).view(shape)  # float32 reciprocal, as the kernel takes it
    assert torch.equal(dx, (x.grad.float() * inv).to(dtype))


def test_per_token_matches_a_torch_composition():
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    scales = (x.float().abs().amax(dim=1) / 127).clamp_min(1e-8)
    q = bn.quantize_per_token(x, scales)
    expected = torch.clamp(torch.round(x.float() * (1.0 / scales)[:, None]), -128, 127).to(torch.int8)
    assert torch.equal(q, expected)


def test_repeat_calls_through_the_remembered_plan_match_torch():
    # the first call of a (dtypes, shapes, options) combination takes the full path and remembers the
    # plan; the repeats (new data and scales, same layout) and the variants (another dtype argument,
    # float64 scales the op must convert) must give torch's bits too
    bn.clear_plan_cache()
    g = torch.Generator(device="cuda").manual_seed(7)
    for i in range(3):
        x = (torch.randn(48, 4096, device="cuda", generator=g) * 3).to(torch.bfloat16)
        scales = torch.rand(4096, device="cuda", generator=g) * 0.05 + 0.01
        zps = torch.randint(-9, 9, (4096,), device="cuda", generator=g, dtype=torch.int32)
        fake = torch.fake_quantize_per_channel_affine(x.float(), scales, zps, 1, -128, 127)
        for scale_arg in (scales, scales.double()):
            q = bn.quantize_per_channel(x, scale_arg, zps, 1)
            assert q.dtype == torch.int8
            assert torch.equal(bn.dequantize_per_channel(q, scales, zps, 1), fake), i
        rows = torch.rand(48, device="cuda", generator=g) * 0.05 + 0.01
        expected = torch.clamp(torch.round(x.float() * (1.0 / rows)[:, None]), -128, 127).to(torch.int8)
        assert torch.equal(bn.quantize_per_token(x, rows, torch.zeros(48, device="cuda", dtype=torch.int32)),
                           expected), i
        scale = 0.0213 * (i + 1)
        for dtype, torch_dtype in (("int8", torch.qint8), ("uint8", torch.quint8)):
            zp = 0 if dtype == "int8" else 128
            got = bn.quantize_per_tensor(x.float(), scale, zp, dtype=dtype)
            assert torch.equal(got, torch.quantize_per_tensor(x.float(), scale, zp, torch_dtype).int_repr()), i
            f32_scale = torch.tensor(scale, dtype=torch.float32, device="cuda")  # README: a float32 scale
            assert torch.equal(bn.dequantize_per_tensor(got, scale, zp), (got.float() - zp) * f32_scale), i


@pytest.mark.parametrize("scale", [0.02, 0.0213, 0.00214854861, 3.7])
@pytest.mark.parametrize(("q_min", "q_max", "zp"), [(-128, 127, 0), (0, 255, 128)])
def test_float64_default_differs_and_torch_compat_matches_cuda(scale, q_min, q_max, zp):
    x = inputs(torch.float64, seed=21).requires_grad_(True)
    expected = torch.fake_quantize_per_tensor_affine(x, scale, zp, q_min, q_max)
    dy = torch.randn_like(x)
    expected.backward(dy)
    got = bn.fake_quantize(x.detach(), scale, zp, q_min, q_max, torch_compat=True)
    assert torch.equal(got, expected.detach()), scale
    grad = bn.fake_quantize_backward(dy, x.detach(), scale, zp, q_min, q_max, torch_compat=True)
    assert torch.equal(grad, x.grad), scale
    default = bn.fake_quantize(x.detach(), scale, zp, q_min, q_max)
    finite = torch.isfinite(expected)
    assert (default != expected.detach())[finite].float().mean() > 0.5  # float64 math, on purpose


def test_remembered_calls_launch_without_rechecking_and_fall_back_when_misaligned(monkeypatch):
    """Repeat calls run the remembered plan through ``run_trusted`` (no ``plan.run``): per tensor with
    and without ``out=``, per token without zero points (int8: the plan's zeros; FP8: none) and per
    channel. Their bits are torch's; a view off its 16-byte chunk falls back to ``plan.run``."""
    from baracuda_numba.ops.common import clear_plan_cache
    from baracuda_numba.plans import base

    clear_plan_cache()
    g = torch.Generator(device="cuda").manual_seed(11)
    x = (torch.randn(64, 4096, device="cuda", generator=g) * 3).to(torch.bfloat16)
    rows = torch.rand(64, device="cuda", generator=g) * 0.05 + 0.01
    cols = torch.rand(4096, device="cuda", generator=g) * 0.05 + 0.01
    col_zps = torch.randint(-9, 9, (4096,), device="cuda", generator=g, dtype=torch.int32)
    xf = x.float()
    token = torch.clamp(torch.round(xf * (1.0 / rows)[:, None]), -128, 127).to(torch.int8)
    e4m3 = (xf * (1.0 / rows)[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    channel = torch.fake_quantize_per_channel_affine(xf, cols, col_zps, 1, -128, 127)
    tensor = torch.quantize_per_tensor(xf, 0.0213, 3, torch.qint8).int_repr()
    out = torch.empty(64, 4096, device="cuda", dtype=torch.int8)
    calls = {
        "tensor": (lambda v: bn.quantize_per_tensor(v.float(), 0.0213, 3), tensor),
        "tensor out=": (lambda v: bn.quantize_per_tensor(v.float(), 0.0213, 3, out=out), tensor),
        "token int8": (lambda v: bn.quantize_per_token(v, rows), token),
        "token e4m3": (lambda v: bn.quantize_per_token(v, rows, dtype="float8_e4m3fn").view(torch.uint8),
                       e4m3.view(torch.uint8)),
        "channel": (lambda v: bn.dequantize_per_channel(bn.quantize_per_channel(v, cols, col_zps, 1), cols,
                                                        col_zps, 1), channel),
    }
    for label, (call, expected) in calls.items():
        assert torch.equal(call(x), expected), label  # the full path, remembered
    checked = []
    for cls in (base.Plan, base.ElementwisePlan):  # record every plan.run, then run it
        monkeypatch.setattr(cls, "run", (lambda run: lambda self, *a, **k: checked.append(self.name)
                                         or run(self, *a, **k))(cls.__dict__["run"]))
    for label, (call, expected) in calls.items():
        assert torch.equal(call(x), expected), label
    assert checked == [], checked
    padded = torch.empty(64 * 4096 + 1, device="cuda", dtype=torch.bfloat16)
    shifted = padded[1:].view(64, 4096)
    shifted.copy_(x)
    for label, (call, expected) in calls.items():
        assert torch.equal(call(shifted), expected), label
    assert any("Token" in name for name in checked) and any("Channel" in name for name in checked), checked


def test_linear_workspaces_per_stream_keep_concurrent_streams_apart():
    """The two-launch W8A8 path keeps one workspace per stream: calls queued on two streams at once
    each give the result of a call alone."""
    g = torch.Generator(device="cuda").manual_seed(5)
    w = torch.randint(-128, 128, (4096, 4096), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(4096, device="cuda", generator=g) * 0.01 + 0.001
    xs = [torch.randn(16, 4096, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2)]
    alone = [bn.quantized_linear(x, w, ws) for x in xs]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    results = [[], []]
    for _ in range(20):
        for i, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                results[i].append(bn.quantized_linear(xs[i], w, ws))
    torch.cuda.synchronize()
    for i in range(2):
        for got in results[i]:
            assert torch.equal(got, alone[i]), i


def test_channel_vector_kernels_with_parameter_views_off_their_vector_alignment():
    """The last-axis dequantize and quantize backward of f32 read each chunk's four scales and zero points
    as 16-byte vectors; views starting 4 bytes into their buffers take the element path. Torch's bits
    either way, on the first (checked) and the remembered call."""
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randint(-128, 128, (64, 4096), device="cuda", dtype=torch.int8, generator=g)
    x = torch.randn(64, 4096, device="cuda", generator=g) * 3
    dy = torch.randn(64, 4096, device="cuda", generator=g)
    scale_buffer = torch.rand(4097, device="cuda", generator=g) * 0.05 + 0.01
    zp_buffer = torch.randint(-9, 9, (4097,), device="cuda", dtype=torch.int32, generator=g)
    for offset in (0, 1):
        scales, zps = scale_buffer[offset:offset + 4096], zp_buffer[offset:offset + 4096]
        expected = (q.float() - zps.float()) * scales
        inv = 1.0 / scales
        t = torch.round(x * inv) + zps
        expected_grad = dy * inv * ((t >= -128) & (t <= 127)).float()
        for _ in range(2):
            assert torch.equal(bn.dequantize_per_channel(q, scales, zps, 1), expected), offset
            assert torch.equal(bn.quantize_per_channel_backward(dy, x, scales, zps, 1), expected_grad), offset


def _fake_inputs(shape, dtype, seed):
    """Random values with ties (k + 0.5 steps of 0.01), signed zeros and large values past the range."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=g) * 3
    flat = x.view(-1)
    ties = (torch.randint(-200, 200, (flat.numel() // 7,), device="cuda", generator=g) + 0.5) * 0.01
    flat[: ties.numel()] = ties
    flat[-4:] = torch.tensor([0.0, -0.0, 1e4, -1e4], device="cuda")
    return x.to(dtype)


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
@pytest.mark.parametrize(("shape", "axis"), [((4096, 4096), 0), ((512, 11008), 0), ((64, 4096), 1),
                                             ((8, 16, 33), 1), ((3, 7, 5), 2), ((1, 1 << 20), 0), ((1, 4099), 0)])
def test_fused_fake_quantize_per_channel_matches_torch_forward_and_autograd(name, shape, axis):
    """One kernel forward, one backward (shift, tracking, thread-stationary and one-segment kernels across
    the shapes): the bits of torch.fake_quantize_per_channel_affine and of its autograd, on CUDA."""
    from baracuda_numba.torch import ops

    dtype = TORCH_FLOATS[name]
    x = _fake_inputs(shape, dtype, seed=sum(shape) + axis)
    g = torch.Generator(device="cuda").manual_seed(axis)
    channels = shape[axis]
    scales = torch.rand(channels, device="cuda", generator=g) * 0.05 + 0.01
    scales[0] = 0.01  # the ties' step
    for q_min, q_max in ((-128, 127), (0, 255), (-127, 127)):
        zps = torch.randint(q_min, min(q_max, q_min + 20), (channels,), device="cuda", generator=g,
                            dtype=torch.int32)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        expected = torch.fake_quantize_per_channel_affine(xb, scales, zps, axis, q_min, q_max)
        dy = torch.randn_like(expected)
        expected.backward(dy)
        got = ops.fake_quantize_with_grad("channel", xa, scales, zps, axis, q_min, q_max)
        got.backward(dy)
        assert torch.equal(got, expected), (name, shape, q_min)
        assert torch.equal(xa.grad, xb.grad), (name, shape, q_min)
        op = torch.ops.baracuda.fake_quantize_per_channel(x, scales, zps, axis, q_min, q_max)
        assert torch.equal(op, expected)


@pytest.mark.parametrize("name", ["f32", "bf16"])
def test_fused_fake_quantize_per_token_and_group_match_torch(name):
    dtype = TORCH_FLOATS[name]
    x = _fake_inputs((64, 4096), dtype, seed=3)
    g = torch.Generator(device="cuda").manual_seed(3)
    rows = torch.rand(64, device="cuda", generator=g) * 0.05 + 0.01
    zps = torch.randint(-9, 9, (64,), device="cuda", generator=g, dtype=torch.int32)
    expected = torch.fake_quantize_per_channel_affine(x, rows, zps, 0, -128, 127)
    assert torch.equal(bn.fake_quantize_per_token(x, rows, zps), expected)
    groups = torch.rand(64 * 32, device="cuda", generator=g) * 0.05 + 0.01
    gzps = torch.randint(-9, 9, (64 * 32,), device="cuda", generator=g, dtype=torch.int32)
    expected = torch.fake_quantize_per_channel_affine(x.reshape(-1, 128), groups, gzps, 0, -128, 127).reshape(64, -1)
    got = bn.fake_quantize_per_group(x, groups.reshape(64, 32), gzps.reshape(64, 32), 128, dtype="int8")
    assert torch.equal(got, expected)
    dy = torch.randn_like(x)
    xr = x.clone().requires_grad_()
    torch.fake_quantize_per_channel_affine(xr.reshape(-1, 128), groups, gzps, 0, -128, 127).backward(
        dy.reshape(-1, 128))
    grad = bn.fake_quantize_per_group_backward(dy, x, groups.reshape(64, 32), gzps.reshape(64, 32), 128,
                                               dtype="int8")
    assert torch.equal(grad, xr.grad)


def test_fused_fake_quantize_saturates_infinities_and_propagates_nan_on_cuda():
    # torch's CUDA kernel converts NaN to an integer: the README's semantics (NaN propagates, its mask is
    # false; +-inf saturate with a true mask) are checked against the reference instead
    from baracuda_numba import reference as ref

    x = torch.tensor([[float("inf"), float("-inf"), float("nan"), 0.26, 1e30, -1e30]] * 3, device="cuda")
    scales = torch.tensor([0.1, 0.0, 0.5], device="cuda")
    zps = torch.tensor([3, 5, -2], device="cuda", dtype=torch.int32)
    dy = torch.full_like(x, 2.0)
    host = x.cpu().numpy()
    full_s = ref.expand_channels(scales.cpu().numpy(), host.shape, 0)
    full_z = ref.expand_channels(zps.cpu().numpy(), host.shape, 0)
    np.testing.assert_array_equal(bn.fake_quantize_per_channel(x, scales, zps, 0).cpu().numpy(),
                                  ref.fake_quantize(host, full_s, full_z, -128, 127))
    np.testing.assert_array_equal(bn.fake_quantize_per_channel_backward(dy, x, scales, zps, 0).cpu().numpy(),
                                  ref.fake_quantize_backward(dy.cpu().numpy(), host, full_s, full_z, -128, 127))


@pytest.mark.parametrize("shape,name", [((4096, 4096), "bf16"), ((256, 1024), "f16"), ((256, 1024), "f32")])
@pytest.mark.parametrize("case", ["channel-symmetric-ma", "channel-affine-minmax", "tensor-affine-ma",
                                  "tensor-symmetric-minmax"])
def test_fake_quantize_module_matches_torch_ao_on_cuda(shape, name, case):
    """The QAT module against torch.ao's FakeQuantize on CUDA over a few training steps: the observed
    scales and zero points, the output and the gradient, bit for bit."""
    from torch.ao.quantization import FakeQuantize as TorchFakeQuantize
    from torch.ao.quantization import observer as obs

    from baracuda_numba.torch import FakeQuantize

    granularity, scheme, observer = case.split("-")
    per_channel, symmetric, moving = granularity == "channel", scheme == "symmetric", observer == "ma"
    torch_observer = {(True, True): obs.MovingAveragePerChannelMinMaxObserver,
                      (True, False): obs.PerChannelMinMaxObserver,
                      (False, True): obs.MovingAverageMinMaxObserver,
                      (False, False): obs.MinMaxObserver}[per_channel, moving]
    qscheme = {(True, True): torch.per_channel_symmetric, (True, False): torch.per_channel_affine,
               (False, True): torch.per_tensor_symmetric, (False, False): torch.per_tensor_affine}[
        per_channel, symmetric]
    int8 = symmetric
    low, high = (-128, 127) if int8 else (0, 255)
    kwargs = {"quant_min": low, "quant_max": high, "dtype": torch.qint8 if int8 else torch.quint8,
              "qscheme": qscheme}
    if per_channel:
        kwargs["ch_axis"] = 0
    if moving:
        kwargs["averaging_constant"] = 0.1
    theirs = TorchFakeQuantize(observer=torch_observer, **kwargs).cuda()
    ours = FakeQuantize(dtype=torch.int8 if int8 else torch.uint8, granularity=f"per_{granularity}", ch_axis=0,
                        observer="moving_average" if moving else "minmax", averaging_constant=0.1,
                        symmetric=symmetric, q_min=low, q_max=high).cuda()
    dtype = TORCH_FLOATS[name]
    for step in range(3):
        w = _fake_inputs(shape, dtype, seed=step) + 0.3 * step
        wa, wb = w.clone().requires_grad_(), w.clone().requires_grad_()
        ya, yb = ours(wa), theirs(wb)
        dy = torch.randn_like(ya)
        ya.backward(dy)
        yb.backward(dy)
        assert torch.equal(ours.scale, theirs.scale.float()), step
        assert torch.equal(ours.zero_point, theirs.zero_point.to(torch.int32)), step
        assert torch.equal(ya, yb), step
        assert torch.equal(wa.grad, wb.grad), step
