"""Reliability: a bad-input matrix over every dispatch function (typed error, ``out=`` untouched),
determinism, concurrent first calls from threads; on the GPU: explicit streams, CUDA-graph capture
and a second device."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import SIMULATOR, requires_gpu

import baracuda_numba as bn
from baracuda_numba import reference as ref

F32, I8 = np.float32, np.int8
X = np.linspace(-2, 2, 48, dtype=F32).reshape(6, 8)
Q = np.arange(48, dtype=I8).reshape(6, 8)
S6, S8 = np.full(6, 0.02, F32), np.full(8, 0.02, F32)
S_GROUPS = np.full((6, 2), 0.02, F32)
W8 = (np.arange(64, dtype=np.int64) % 17 - 8).astype(I8).reshape(8, 8)


def per_function_calls():
    """(name, call(out) -> result, out template) for every dispatch function, valid as written."""
    return [
        ("quantize_per_tensor", lambda **k: bn.quantize_per_tensor(X, 0.02, 1, **k), np.zeros((6, 8), I8)),
        ("dequantize_per_tensor", lambda **k: bn.dequantize_per_tensor(Q, 0.02, 1, **k), np.zeros((6, 8), F32)),
        ("quantize_per_tensor_backward", lambda **k: bn.quantize_per_tensor_backward(X, X, 0.02, **k),
         np.zeros((6, 8), F32)),
        ("dequantize_per_tensor_backward", lambda **k: bn.dequantize_per_tensor_backward(X, 0.02, **k),
         np.zeros((6, 8), F32)),
        ("fake_quantize", lambda **k: bn.fake_quantize(X, 0.02, **k), np.zeros((6, 8), F32)),
        ("fake_quantize_backward", lambda **k: bn.fake_quantize_backward(X, X, 0.02, **k), np.zeros((6, 8), F32)),
        ("quantize_per_channel", lambda **k: bn.quantize_per_channel(X, S8, None, 1, **k), np.zeros((6, 8), I8)),
        ("dequantize_per_channel", lambda **k: bn.dequantize_per_channel(Q, S8, None, 1, **k),
         np.zeros((6, 8), F32)),
        ("quantize_per_channel_backward", lambda **k: bn.quantize_per_channel_backward(X, X, S8, None, 1, **k),
         np.zeros((6, 8), F32)),
        ("dequantize_per_channel_backward", lambda **k: bn.dequantize_per_channel_backward(X, S8, 1, **k),
         np.zeros((6, 8), F32)),
        ("quantize_per_token", lambda **k: bn.quantize_per_token(X, S6, **k), np.zeros((6, 8), I8)),
        ("dequantize_per_token", lambda **k: bn.dequantize_per_token(Q, S6, **k), np.zeros((6, 8), F32)),
        ("quantize_per_token_backward", lambda **k: bn.quantize_per_token_backward(X, X, S6, **k),
         np.zeros((6, 8), F32)),
        ("dequantize_per_token_backward", lambda **k: bn.dequantize_per_token_backward(X, S6, **k),
         np.zeros((6, 8), F32)),
        ("quantize_per_group", lambda **k: bn.quantize_per_group(X, S_GROUPS, None, 4, **k), np.zeros((6, 8), I8)),
        ("dequantize_per_group", lambda **k: bn.dequantize_per_group(Q, S_GROUPS, None, 4, **k),
         np.zeros((6, 8), F32)),
        ("quantize_per_group_backward", lambda **k: bn.quantize_per_group_backward(X, X, S_GROUPS, None, 4, **k),
         np.zeros((6, 8), F32)),
        ("dequantize_per_group_backward", lambda **k: bn.dequantize_per_group_backward(X, S_GROUPS, 4, **k),
         np.zeros((6, 8), F32)),
        ("dynamic_range_quantize", lambda **k: bn.dynamic_range_quantize(X, **k).q, np.zeros((6, 8), I8)),
        ("quantized_linear", lambda **k: bn.quantized_linear(X, W8, S8, **k), np.zeros((6, 8), F32)),
        ("smoothquant_linear", lambda **k: bn.smoothquant_linear(Q, W8, S8, 0.05, **k), np.zeros((6, 8), F32)),
    ]


CALLS = per_function_calls()


def bad_outs(template: np.ndarray):
    wrong_dtype = np.zeros(template.shape, np.int16 if template.dtype != np.int16 else np.int8)
    other = np.zeros(template.shape, np.float64 if template.dtype != np.float64 else np.float32)
    return [
        ("wrong shape", np.zeros((8, 6), template.dtype), bn.InvalidProblem),
        ("wrong element", other, bn.InvalidProblem),
        ("unsupported storage", wrong_dtype, bn.InvalidOperand),
        ("transposed view", np.zeros((8, 6), template.dtype).T, bn.InvalidProblem),
        ("negative strides", np.zeros((6, 8), template.dtype)[::-1], bn.InvalidProblem),
        ("not an array", [[0] * 8] * 6, bn.InvalidOperand),
    ]


@pytest.mark.parametrize(("name", "call", "template"), CALLS, ids=[c[0] for c in CALLS])
def test_valid_call_then_bad_out_leaves_out_untouched(name, call, template):
    result = np.asarray(call())
    assert result.shape == template.shape
    for label, out, error in bad_outs(template):
        sentinel = np.array(out, copy=True) if isinstance(out, np.ndarray) else None
        with pytest.raises(error) as info:
            call(out=out)
        assert "out" in str(info.value), (name, label, str(info.value))
        if sentinel is not None:
            np.testing.assert_array_equal(out, sentinel)


BAD_INPUTS = [
    ("int input to quantize", lambda: bn.quantize_per_tensor(Q, 0.1), bn.Unsupported),
    ("float input to dequantize", lambda: bn.dequantize_per_tensor(X, 0.1), bn.Unsupported),
    ("int16 output", lambda: bn.quantize_per_tensor(X, 0.1, dtype="int16"), bn.InvalidProblem),
    ("float8 with a zero point", lambda: bn.quantize_per_tensor(X, 0.1, 1, dtype="float8_e4m3fn"), bn.InvalidProblem),
    ("float8 input to quantize", lambda: bn.quantize_per_tensor(X.astype(bn.ElementKind.FP8_E4M3.numpy_dtype), 0.1),
     bn.Unsupported),
    ("int32 output", lambda: bn.quantize_per_tensor(X, 0.1, dtype="int32"), bn.Unsupported),
    ("negative stride input", lambda: bn.quantize_per_tensor(X[::-1], 0.1), bn.InvalidProblem),
    ("scale 0", lambda: bn.fake_quantize(X, 0.0), bn.InvalidProblem),
    ("scale negative", lambda: bn.fake_quantize(X, -0.1), bn.InvalidProblem),
    ("scale nan", lambda: bn.fake_quantize(X, float("nan")), bn.InvalidProblem),
    ("scale inf", lambda: bn.dequantize_per_tensor(Q, float("inf")), bn.InvalidProblem),
    ("zero point out of range", lambda: bn.quantize_per_tensor(X, 0.1, 300), bn.InvalidProblem),
    ("zero point below uint8", lambda: bn.quantize_per_tensor(X, 0.1, -1, dtype="uint8"), bn.InvalidProblem),
    ("inverted range", lambda: bn.fake_quantize(X, 0.1, 0, 5, -5), bn.InvalidProblem),
    ("range outside int8", lambda: bn.quantize_per_tensor(X, 0.1, q_min=-200), bn.InvalidProblem),
    ("scales too short", lambda: bn.quantize_per_channel(X, S6, None, 1), bn.InvalidProblem),
    ("zero points too long", lambda: bn.quantize_per_token(X, S6, np.zeros(7, np.int32)), bn.InvalidProblem),
    ("float zero points", lambda: bn.quantize_per_token(X, S6, np.full(6, 0.5)), bn.InvalidProblem),
    ("axis out of range", lambda: bn.quantize_per_channel(X, S8, None, 5), bn.InvalidProblem),
    ("axis below range", lambda: bn.quantize_per_channel(X, S8, None, -3), bn.InvalidProblem),
    ("group not dividing", lambda: bn.quantize_per_group(X, S_GROUPS, None, 3), bn.InvalidProblem),
    ("group zero", lambda: bn.quantize_per_group(X, S_GROUPS, None, 0), bn.InvalidProblem),
    ("grad dtype mismatch", lambda: bn.fake_quantize_backward(X.astype(np.float64), X, 0.1), bn.InvalidProblem),
    ("grad shape mismatch", lambda: bn.quantize_per_tensor_backward(X[:3], X, 0.1), bn.InvalidProblem),
    ("dynamic unknown mode", lambda: bn.dynamic_range_quantize(X, mode="log"), bn.InvalidProblem),
    ("dynamic unknown scope", lambda: bn.dynamic_range_quantize(X, scope="rows"), bn.InvalidProblem),
    ("dynamic no room", lambda: bn.dynamic_range_quantize(X, q_min=-1, q_max=0), bn.InvalidProblem),
    ("stream of a wrong type", lambda: bn.quantize_per_tensor(X, 0.1, stream="default"), bn.InvalidOperand),
]


@pytest.mark.parametrize(("label", "call", "error"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_raise_typed_errors(label, call, error):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert ": " in message and " expected " in message, message


def test_results_are_bit_identical_across_runs():
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((33, 64)) * 3).astype(F32)
    for run in (lambda: bn.quantize_per_tensor(x, 0.03, 2), lambda: bn.fake_quantize(x, 0.03, 2),
                lambda: bn.dynamic_range_quantize(x, mode="asymmetric").scale,
                lambda: bn.dynamic_range_quantize(x, scope="tensor").scale,
                lambda: bn.dynamic_range_quantize(x, scope="channel", axis=1).scale):
        first = np.asarray(run()).reshape(-1)
        for _ in range(3):
            np.testing.assert_array_equal(np.asarray(run()).reshape(-1).view(np.uint8), first.view(np.uint8))


@pytest.mark.skipif(SIMULATOR, reason="the simulator swaps module globals per launch and is not thread-safe")
def test_concurrent_first_calls_from_threads():
    bn.clear_plan_cache()
    rng = np.random.default_rng(4)
    jobs = []
    for i, dtype in enumerate(("float32", "float16", "bfloat16", "float64") * 2):
        x = (rng.standard_normal(4099) * 2).astype(bn.element_kind(dtype).numpy_dtype)
        jobs.append((x, 0.01 * (i + 1), i))
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def work(x, scale, i):
        try:
            results[i] = bn.quantize_per_tensor(x, scale, 1, dtype="uint8" if i % 2 else "int8")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors and not any(t.is_alive() for t in threads)
    for x, scale, i in jobs:
        q_min, q_max = (0, 255) if i % 2 else (-128, 127)
        np.testing.assert_array_equal(results[i], ref.quantize(x, scale, 1, q_min, q_max,
                                                               np.uint8 if i % 2 else np.int8))


@requires_gpu
def test_explicit_streams_numba_cuda_core_and_handles():
    from numba import cuda

    x = np.random.default_rng(1).standard_normal(1 << 20).astype(F32)
    expected = ref.fake_quantize(x, 0.05, 0, -128, 127)
    d_x = cuda.to_device(x)
    stream = cuda.stream()
    y = cuda.device_array_like(d_x)
    bn.fake_quantize(d_x, 0.05, out=y, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(y.copy_to_host(), expected)
    from cuda.core import Device

    device = Device()
    device.set_current()
    core_stream = device.create_stream()
    y2 = cuda.device_array_like(d_x)
    bn.fake_quantize(d_x, 0.05, out=y2, stream=core_stream)
    core_stream.sync()
    np.testing.assert_array_equal(y2.copy_to_host(), expected)
    y3 = cuda.device_array_like(d_x)
    bn.fake_quantize(d_x, 0.05, out=y3, stream=int(stream.handle.value if hasattr(stream.handle, "value")
                                                    else stream.handle))
    stream.synchronize()
    np.testing.assert_array_equal(y3.copy_to_host(), expected)


@requires_gpu
def test_cuda_graph_capture_and_replay():
    torch = pytest.importorskip("torch")
    x = torch.randn(1 << 16, device="cuda")
    q = torch.empty(1 << 16, device="cuda", dtype=torch.int8)
    plan = bn.QuantizePerTensorPlan.select(bn.QuantizePerTensorDescriptor(1 << 16, -128, 127, "f32", "s8"))
    args = bn.QuantizePerTensorArgs(x, 0.02, 0, q)
    plan.run(args)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(args)
    for _ in range(3):
        before = q.clone()
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        expected = bn.quantize_per_tensor(x, 0.02)  # the eager call: replay must give the same bits
        torch.cuda.synchronize()
        assert not torch.equal(q, before), "replay did not rewrite the output"
        assert torch.equal(q, expected), f"{int((q != expected).sum())} of {q.numel()} differ"


@requires_gpu
def test_second_gpu_results_stay_there():
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (run on nvidia-h200-x2)")
    x = torch.randn(100_000, device="cuda:1")
    q = bn.quantize_per_tensor(x, 0.02)
    assert q.device == torch.device("cuda:1")
    # the reference's bits (PyTorch's CUDA kernel rounds x / scale in float64: docs/semantics.md, "Per tensor")
    np.testing.assert_array_equal(q.cpu().numpy(), ref.quantize(x.cpu().numpy(), 0.02, 0, -128, 127, np.int8))
    # every family, on GPU 1 while GPU 0 stays current, equal to the same call on GPU 0
    torch.cuda.set_device(0)
    rows = torch.randn(300, 512, device="cuda:1", dtype=torch.bfloat16)
    w = torch.randint(-128, 128, (264, 512), device="cuda:1", dtype=torch.int8)
    ws = torch.rand(264, device="cuda:1") * 0.01 + 0.001
    calls = {
        "quantize_per_token": lambda r, w, ws: bn.quantize_per_token(r, r.float().abs().amax(1) / 127),
        "quantize_per_group": lambda r, w, ws: bn.quantize_per_group(r, torch.full((300, 4), 0.02, device=r.device),
                                                                     None, 128),
        "dynamic_range_quantize": lambda r, w, ws: bn.dynamic_range_quantize(r).q,
        "quantized_linear": lambda r, w, ws: bn.quantized_linear(r, w, ws),
        "quantized_linear (skinny)": lambda r, w, ws: bn.quantized_linear(r[:5], w, ws),
    }
    for name, call in calls.items():
        on_1 = call(rows, w, ws)
        torch.cuda.synchronize(1)
        assert on_1.device == torch.device("cuda:1"), name
        on_0 = call(rows.to("cuda:0"), w.to("cuda:0"), ws.to("cuda:0"))
        assert torch.equal(on_1.cpu(), on_0.cpu()), name
