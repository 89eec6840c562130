"""The pure-PyTorch W8A8 emulation (the reference of the model-level tests) against the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")

from baracuda_numba import reference  # noqa: E402
from baracuda_numba.platform import SIMULATOR  # noqa: E402
from baracuda_numba.torch import W8A8Linear  # noqa: E402
from baracuda_numba.torch.emulate import quantize_activation, quantize_weight, w8a8_linear  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
DEVICES = ["cpu"] + (["cuda"] if not SIMULATOR and torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_scales_are_true_quotients_on_every_device(device):
    """The weight scales (``W8A8Linear.quantize_weight``, the emulation's) and the emulation's per-token scales are
    ``max / 127`` rounded once (docs/semantics.md), on CUDA as on the CPU. PyTorch's CUDA kernels divide by a Python
    number as a product with its rounded reciprocal, an ulp off for some of these values: the emulation's per-token
    scales then differed from the kernels' on SmolLM2, and a layer quantized on the GPU from one quantized on the
    CPU."""
    amax = np.random.default_rng(0).uniform(0.01, 10, 4096).astype(np.float32)
    expected = amax / np.float32(127)
    assert (amax * (np.float32(1) / np.float32(127)) != expected).any()  # the values tell the two roundings apart
    w = torch.from_numpy(np.stack([amax, -amax / 2], axis=1)).to(device)
    for scale in (quantize_weight(w)[1], W8A8Linear.quantize_weight(w)[1], quantize_activation(w)[1][:, 0]):
        assert np.array_equal(scale.cpu().numpy(), expected)


@given(m=st.integers(1, 17), k=st.integers(1, 33), n=st.integers(1, 17), seed=st.integers(0, 2**16),
       log_scale=st.floats(-6, 4), dtype=st.sampled_from(sorted(DTYPES)), static=st.booleans(),
       clip=st.floats(0.1, 1.5), bias=st.booleans(), zero_row=st.booleans())
def test_emulation_matches_the_numpy_reference(m, k, n, seed, log_scale, dtype, static, clip, bias, zero_row):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 10.0**log_scale).to(DTYPES[dtype])
    if zero_row:
        x[0] = 0
    w = torch.randn(n, k, generator=g) * 0.05
    wq, ws = quantize_weight(w)
    b = torch.randn(n, generator=g) if bias else None
    act_scale = max(float(x.float().abs().max()) * clip / 127, 1e-30) if static else None
    got = w8a8_linear(x, wq, ws, b, act_scale)
    assert got.dtype == x.dtype and got.shape == (m, n)
    xs = x.float().numpy()  # the reference takes the values exactly (bf16 / f16 widen to float32 exactly)
    expected = reference.linear.quantized_linear(xs, wq.numpy(), ws.numpy(), None if b is None else b.numpy(),
                                                 act_scale)
    assert np.array_equal(got.float().numpy(), torch.from_numpy(expected).to(x.dtype).float().numpy())


@given(n=st.integers(1, 9), k=st.integers(1, 40), seed=st.integers(0, 2**16), log_scale=st.floats(-30, 30))
def test_weight_quantization_matches_the_numpy_reference(n, k, seed, log_scale):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 10.0**log_scale
    wq, ws = quantize_weight(w)
    expected_scale = np.maximum(np.abs(w.numpy()).max(axis=1) / np.float32(127), np.finfo(np.float32).tiny)
    assert np.array_equal(ws.numpy(), expected_scale.astype(np.float32))
    expected = reference.elementwise.quantize(w.numpy(), ws.numpy()[:, None], 0, -127, 127)
    assert np.array_equal(wq.numpy(), expected)


def test_activation_quantization_edge_cases():
    x = torch.tensor([[0.0, 0.0, 0.0], [1.0, float("nan"), -2.0], [float("inf"), 1.0, -1.0], [-127.0, 63.5, 0.5]])
    xq, scale = quantize_activation(x)
    assert scale[:, 0].tolist() == [1.0, np.float32(2 / 127), np.float32(1 / 127), 1.0]
    assert xq[0].tolist() == [0, 0, 0]
    assert xq[1].tolist() == [64, 0, -127]     # NaN quantizes to 0, the range ignores it
    assert xq[2].tolist() == [127, 127, -127]  # +inf saturates and is left out of the range
    assert xq[3].tolist() == [-127, 64, 0]     # ties round half to even
    xq, scale = quantize_activation(torch.tensor([[300.0, -0.3]]), 1.0)
    assert xq.tolist() == [[127, -0]] and float(scale) == 1.0
