"""What the W8A8 linear tests share: problems, tuning values that force a decode path, the devices to choose
for, and the GPU checks (queued calls, chains) against torch's ops."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

import baracuda_numba as bn
from baracuda_numba.kernels.linear import SKINNY_MAX_M
from baracuda_numba.plans.linear import H100_TUNING, SIMULATED, DeviceProperties, LinearTuning


def weights(rng, n, k):
    """A random int8 weight ``[n, k]`` and per-row scales in [0.005, 0.02]."""
    return rng.integers(-128, 128, (n, k)).astype(np.int8), rng.uniform(0.005, 0.02, n).astype(np.float32)


def special_rows(x):
    """Rows that stress the per-token quantizer: zeros, +-inf and NaN (left out of the range), and
    exact ties of ``x / scale`` (absmax 127: scale 1, so n + 0.5 rounds to even)."""
    k = x.shape[1]
    if x.shape[0] > 1:
        x[1] = 0
    x[0, 0], x[0, 1 % k] = np.inf, np.nan
    if x.shape[0] > 2:
        x[2] = (np.arange(k) % 9 - 4 + 0.5).astype(x.dtype)
        x[2, 0] = 127
    if x.shape[0] > 3:
        x[3, :] = -np.inf
    return x


def device(sms: int = 132, sm90a: bool = False) -> DeviceProperties:
    """An H100-like device with ``sms`` multiprocessors (sm_90a only on a real GPU)."""
    return replace(SIMULATED, multiprocessors=sms, sm90a=sm90a)


def forced(variant: str, base: LinearTuning = H100_TUNING, **fields) -> LinearTuning:
    """A tuning value under which decode plans (m <= 16, K % 16 == 0) take ``variant`` (``fused`` or
    ``two_launch``) at every shape, and batches up to ``SKINNY_MAX_M`` tokens keep the skinny kernel on an sm_90
    device too; ``fields``: more fields replaced."""
    fuse = 16 if variant == "fused" else 0
    return replace(base, warpgroup_min_m=SKINNY_MAX_M, fused_max_m=fuse, fused_any_shape_max_m=fuse,
                   static_fused_max_m=fuse, fused_min_k=0, fused_min_n=0, fused_max_n=1 << 30,
                   fused_any_shape_max_weight=1 << 62, **fields)


def unfused(base: LinearTuning = H100_TUNING, **fields) -> LinearTuning:
    """``base`` with the fused kernel never chosen (the quantizer, then the GEMM)."""
    return replace(base, fused_max_m=0, fused_any_shape_max_m=0, wide_fused_max_m=0, wide_one_wave_fused_max_m=0,
                   **fields)


def kernel_name(plan, variant: str) -> str:
    """The kernel name of ``plan``'s ``variant``."""
    return plan.spec.variant(variant).config.name


def ql(m, n, k, dtype="f32", bias=False, static_weight=False, static_activation=False, **select):
    """A selected ``QuantizedLinearPlan`` (``select``: ``tuning=``, ``device=``, ``pref=``)."""
    desc = bn.QuantizedLinearDescriptor(m, n, k, dtype, dtype, bias, static_weight, static_activation)
    return bn.QuantizedLinearPlan.select(desc, **select)


def sq(m, n, k, dtype="f32", bias=False, static_weight=False, **select):
    """A selected ``SmoothQuantLinearPlan``."""
    return bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(m, n, k, dtype, bias, static_weight),
                                           **select)


def run_ql(plan, x, w, ws, bias=None, act_scale=None):
    """``plan`` on host arrays: its output."""
    out = np.zeros((x.shape[0], w.shape[0]), x.dtype)
    plan.run(bn.QuantizedLinearArgs(x, w, ws, out, bias, act_scale))
    return out


def run_sq(plan, act, w, ws, act_scale, bias=None, dtype=np.float32):
    out = np.zeros((act.shape[0], w.shape[0]), dtype)
    plan.run(bn.SmoothQuantLinearArgs(act, w, ws, act_scale, out, bias))
    return out


# -- on the GPU -------------------------------------------------------------------------------------------


def gpu_linear_problem(torch, m, n, k, tdtype):
    """Random CUDA operands of an ``m x n x k`` linear (seeded by the shape): ``x`` in ``tdtype``, an int8
    weight, its scales, a bias for odd ``m`` (else None) and an int8 activation for SmoothQuant."""
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda", generator=g).to(tdtype)
    w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    bias = torch.randn(n, device="cuda", generator=g) if m % 2 else None
    act = torch.randint(-127, 128, (m, k), device="cuda", generator=g, dtype=torch.int8)
    return x, w, ws, bias, act


def torch_w8a8(torch, x, w, ws, bias):
    """``quantized_linear`` in torch ops, each rounded on its own: per-token quantize (our dynamic
    quantizer, itself tested against torch), exact int32 products, then the float32 epilogue."""
    r = bn.dynamic_range_quantize(x)
    m, k = x.shape
    if m > 16 and k % 8 == 0 and w.shape[0] % 8 == 0:
        acc = torch._int_mm(r.q, w.t())
    else:
        acc = (r.q.double() @ w.double().t()).to(torch.int32)
    y = (acc.float() * r.scale.float()[:, None]) * ws[None, :]
    return (y + bias[None, :] if bias is not None else y).to(x.dtype)


def plan_call(torch, plan, x, w, ws, bias=None, act_scale=None):
    """``plan`` run on CUDA tensors into a new output (the op functions' fast path: the plan's)."""
    out = torch.empty(x.shape[0], w.shape[0], device="cuda", dtype=x.dtype)
    plan.run(bn.QuantizedLinearArgs(x, w, ws, out, bias, act_scale))
    return out


def requantized(w_float, i: int, shift: int = 1):
    """The ``i``-th weight of a stream of weights quantized per row just before the calls that read them."""
    return bn.dynamic_range_quantize(w_float * (i + shift) if i % 2 else -w_float, scope="token")


def check_queued_calls(torch, plan, xs, w, ws, variant: str) -> None:
    """Calls of ``plan`` queued back to back on one stream (no host sync between them, the plan's one workspace
    reused) with a new ``x`` each: ``variant`` launched as a programmatic dependent, and each output its own
    ``x``'s result, bit for bit against torch."""
    m, n = xs[0].shape[0], w.shape[0]
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in xs]
    args = [bn.QuantizedLinearArgs(x, w, ws, out) for x, out in zip(xs, outs, strict=True)]
    assert plan.kernel_variant(args[0]) == variant and plan.spec.variant(variant).dependent
    for a in args:
        plan.run(a)
    torch.cuda.synchronize()
    for x, out in zip(xs, outs, strict=True):
        assert torch.equal(out.view(torch.int16), torch_w8a8(torch, x, w, ws, None).view(torch.int16))


def chain(torch, x0, layer, sync: bool, layers: int = 12) -> list:
    """``layers`` calls ``layer(x, i)`` queued on one stream, each ``x`` the previous call's output (every
    other one through a torch kernel first); ``sync``: synchronized after every call."""
    x, outs = x0, []
    for i in range(layers):
        y = layer(x, i)
        outs.append(y)
        x = y * 2.0 if i % 2 else y
        if sync:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return outs


def op_plan(plan_type, desc):
    """The plan the op functions select (and cache) for ``desc`` on the current device."""
    from baracuda_numba.ops.linear import _select

    return _select(plan_type, desc)


def sq_call(torch, plan, act, w, ws, act_scale, bias=None, dtype=None):
    """SmoothQuant ``plan`` run on CUDA tensors into a new output of ``dtype`` (bf16 by default)."""
    out = torch.empty(act.shape[0], w.shape[0], device="cuda", dtype=dtype or torch.bfloat16)
    plan.run(bn.SmoothQuantLinearArgs(act, w, ws, act_scale, out, bias))
    return out
