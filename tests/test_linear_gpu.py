"""The W8A8 linear on a GPU: bit for bit against torch's ops, CUDA graphs, programmatic dependent launches read
what the kernel before them wrote (queued calls, chained layers, weights quantized just before a call), the
warpgroup kernel against the mma.sync kernels; and, on any machine with NVVM, the warpgroup kernel's sm_90a PTX."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import requires_gpu
from linear_helpers import (
    chain,
    check_queued_calls,
    forced,
    gpu_linear_problem,
    op_plan,
    plan_call,
    requantized,
    sq_call,
    torch_w8a8,
    unfused,
)

import baracuda_numba as bn
from baracuda_numba.kernels.linear import SKINNY_MAX_M, hopper_available
from baracuda_numba.launch import LaunchPair
from baracuda_numba.plans.linear import current_tuning, device_properties
from baracuda_numba.vocabulary import ElementKind, PlanPreference


@requires_gpu
@pytest.mark.parametrize(("m", "n", "k"), [
    (1, 4096, 4096), (16, 264, 8192), (64, 1000, 528),  # skinny, 2 and 4 column tiles per block
    (65, 264, 512), (333, 1000, 4096), (2048, 4096, 512), (2048, 11008, 256),  # pipelined, both tile shapes
    (300, 264, 520),  # K % 16 != 0: the register-staged tiled kernel
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_gpu_bit_identical_to_torch_ops(m, n, k, dtype):
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    x, w, ws, bias, _ = gpu_linear_problem(torch, m, n, k, tdtype)
    y = bn.quantized_linear(x, w, ws, bias=bias)
    bits = torch.int32 if dtype == "float32" else torch.int16
    assert torch.equal(y.view(bits), torch_w8a8(torch, x, w, ws, bias).view(bits))


@requires_gpu
@pytest.mark.parametrize(("m", "n", "k"), [(1, 4096, 4096), (16, 4096, 4096), (5, 11008, 4096), (32, 4096, 4096),
                                           (300, 1000, 512), (2048, 4096, 512)])
def test_gpu_cuda_graph_replay_equals_eager(m, n, k):
    """The whole call (quantize, GEMM, output allocated outside) is capturable in a CUDA graph, and replays
    again."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    bias = torch.randn(n, device="cuda", generator=g)
    eager = bn.quantized_linear(x, w, ws, bias=bias)
    out = torch.empty_like(eager)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        bn.quantized_linear(x, w, ws, bias=bias, out=out)  # warm up (plan selection, workspace pool)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bn.quantized_linear(x, w, ws, bias=bias, out=out)
    out.zero_()
    x.mul_(-1.0)  # new inputs in the captured buffers: the replay must recompute, not replay old results
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, bn.quantized_linear(x, w, ws, bias=bias))
    assert not torch.equal(out, eager)
    x.mul_(0.5)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, bn.quantized_linear(x, w, ws, bias=bias))


@requires_gpu
@pytest.mark.parametrize(("n", "k", "two_launches"), [(8192, 4096, True), (4096, 4096, False), (8192, 8192, False)])
@pytest.mark.parametrize("static", [False, True])
def test_gpu_captured_decode_launches_two_kernels_where_fusing_only_saves_host_time(n, k, two_launches, static):
    """One token: eager calls fuse (8192 x 4096: for host time; 4096^2, one wave, and 8192^2: the faster on the GPU
    too); a call captured into a CUDA graph launches the quantizer and the GEMM at 8192 x 4096 only, with a static
    weight too. The replay equals the eager call and torch, bit for bit, on new inputs in the captured buffers."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(1, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
    bn.quantized_linear(x, w, ws, out=out, static_weight=static)  # selects (and caches) the plan the calls below use
    plan = op_plan(bn.QuantizedLinearPlan, bn.QuantizedLinearDescriptor(1, n, k, ElementKind.BF16, ElementKind.BF16,
                                                                         False, static))
    assert plan.spec.fused and plan.spec.capture_unfused == two_launches
    quantized = []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with pytest.MonkeyPatch.context() as monkeypatch:
        run = plan._quantizer.run
        monkeypatch.setattr(plan._quantizer, "run", lambda *a, **kw: (quantized.append(1), run(*a, **kw)))
        with torch.cuda.stream(side):
            bn.quantized_linear(x, w, ws, out=out, static_weight=static)
        torch.cuda.current_stream().wait_stream(side)
        assert not quantized  # eager: fused
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            bn.quantized_linear(x, w, ws, out=out, static_weight=static)
    assert bool(quantized) == two_launches
    for factor in (-1.0, 0.5):
        x.mul_(factor)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, bn.quantized_linear(x, w, ws, static_weight=static))
        assert torch.equal(out.view(torch.int16), torch_w8a8(torch, x, w, ws, None).view(torch.int16))


@requires_gpu
@pytest.mark.parametrize(("m", "n", "k", "prefetch"), [
    (1, 4096, 4096, 0), (16, 4096, 4096, 2), (9, 11008, 4096, 1), (64, 264, 8192, 4), (3, 520, 2064, 9),
    (2, 4096, 11008, None), (4, 8192, 8192, None)])
def test_gpu_dependent_gemm_reads_each_calls_own_activations(m, n, k, prefetch):
    """The two-launch path's GEMM starts as the quantizer's programmatic dependent and loads weight (and asks L2
    for ``prefetch`` more iterations of it, some past K; None: the shipped rule) before the quantizer is done (at
    K = 11008 one block of 256 threads x 8 chunks per row). Calls queued back to back on one stream (no host sync
    between them, the plan's one workspace reused) with a new ``x`` each must each give their own ``x``'s result,
    bit for bit against torch: a GEMM reading the workspace before its quantizer finished would see the previous
    call's rows."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(m + n)
    w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    xs = [(torch.randn(m, k, device="cuda", generator=g) * (1 + i)).to(torch.bfloat16) for i in range(24)]
    # 64 rows: the skinny kernel on sm_90 too
    tuning = unfused(replace(current_tuning(), warpgroup_min_m=SKINNY_MAX_M, dependent_prefetch_l2=prefetch))
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16"), tuning=tuning)
    check_queued_calls(torch, plan, xs, w, ws, "skinny_vector")


@requires_gpu
@pytest.mark.parametrize(("m", "n", "k"), [(17, 4096, 4096), (32, 4096, 4096), (64, 4096, 4096), (48, 264, 8192),
                                           (64, 11008, 4096), (128, 4096, 4096), (100, 520, 2064)])
def test_gpu_dependent_warpgroup_gemm_reads_each_calls_own_activations(m, n, k):
    """On an sm_90 device a batch's warpgroup GEMM (up to ``wgmma_dependent_max_m`` tokens, 128 here) starts as the
    quantizer's programmatic dependent and copies its first steps of weight before its wait. Queued calls with no
    sync, the plan's one workspace reused: each with a new ``x`` gives its own ``x``'s result (bit for bit against
    torch); a weight quantized by the kernel just before each call is the one read; and at N = K, layers chained on
    one stream (each ``x`` the previous output) equal the same chain synchronized op by op."""
    torch = pytest.importorskip("torch")
    if not hopper_available():
        pytest.skip("wgmma needs compute capability 9.0")
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    w_float = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    xs = [(torch.randn(m, k, device="cuda", generator=g) * (1 + i)).to(torch.bfloat16) for i in range(24)]
    tuning = current_tuning()
    tuning = replace(tuning, wgmma_dependent_max_m=max(tuning.wgmma_dependent_max_m, 128))
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16"), tuning=tuning)
    check_queued_calls(torch, plan, xs, w, ws, "wgmma")

    def fresh_weights(sync: bool):
        found = []
        for i in range(6):
            q = requantized(w_float, i)
            if sync:
                torch.cuda.synchronize()
            found.append(plan_call(torch, plan, xs[i], q.q, q.scale.reshape(-1)))
        torch.cuda.synchronize()
        return found

    stepped = fresh_weights(True)
    assert all(torch.equal(a, b) for a, b in zip(fresh_weights(False), stepped, strict=True))
    q = bn.dynamic_range_quantize(-w_float, scope="token")
    assert torch.equal(stepped[0].view(torch.int16), torch_w8a8(torch, xs[0], q.q, q.scale.reshape(-1), None)
                       .view(torch.int16))
    if n == k:
        layers = [w, torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)]
        scales = [ws * 0.1, ws * 0.2]

        def chained(sync: bool):
            return chain(torch, xs[0], lambda x, i: plan_call(torch, plan, x, layers[i % 2], scales[i % 2]), sync)

        synchronized = chained(True)
        assert all(torch.equal(a, b) for a, b in zip(chained(False), synchronized, strict=True))


@requires_gpu
@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize(("m", "n", "k"), [(17, 4096, 4096), (64, 11008, 4096), (128, 4096, 4096), (100, 520, 2064),
                                           (48, 264, 8192)])
def test_gpu_smoothquant_warpgroup_gemm_waits_for_the_kernel_before(m, n, k, static):
    """SmoothQuant's warpgroup GEMM for a batch (up to ``smoothquant_wgmma_dependent_max_m`` tokens) starts as a
    programmatic dependent of whatever kernel comes before it. ``static``: under the static-weight promise it copies
    its first steps of weight before its wait; without it it waits first thing, so that a weight written by the
    kernel just before the call is the one read. 24 calls queued with no sync, each after a torch kernel that writes
    its activations into the one buffer the calls read (and, without the promise, its weight into the one weight
    buffer): each output is its own operands' result, bit for bit against torch's ops."""
    torch = pytest.importorskip("torch")
    if not hopper_available():
        pytest.skip("wgmma needs compute capability 9.0")
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    weights = [torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8) for _ in range(3)]
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    acts = [torch.randint(-127, 128, (m, k), device="cuda", generator=g, dtype=torch.int8) for _ in range(24)]
    act, w = torch.empty_like(acts[0]), weights[0].clone()
    plan = bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(m, n, k, "bf16", False, static))
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in acts]
    args = bn.SmoothQuantLinearArgs(act, w, ws, 0.0173, outs[0])
    launch = plan.spec.variant("wgmma")
    assert plan.kernel_variant(args) == "wgmma" and launch.dependent
    assert launch.config.wait_first == (not static)
    torch.cuda.synchronize()
    for i, (a, out) in enumerate(zip(acts, outs, strict=True)):
        act.copy_(a)
        if not static:
            w.copy_(weights[i % 3])
        plan.run(bn.SmoothQuantLinearArgs(act, w, ws, 0.0173, out))
    torch.cuda.synchronize()
    for i, (a, out) in enumerate(zip(acts, outs, strict=True)):
        acc = (a.double() @ weights[0 if static else i % 3].double().t()).to(torch.int32)
        y = (acc.float() * torch.tensor(0.0173, device="cuda")) * ws[None, :]
        assert torch.equal(out.view(torch.int16), y.to(torch.bfloat16).view(torch.int16)), i


@requires_gpu
@pytest.mark.parametrize(("m", "k", "variant", "static"), [
    (1, 4096, "fused", False), (2, 4096, "fused", False), (2, 8192, "fused", False), (1, 4096, "two_launch", False),
    (4, 4096, "two_launch", False), (8, 4096, "two_launch", False), (16, 4096, "two_launch", False),
    (16, 8192, "two_launch", False), (1, 4096, "fused", True), (2, 4096, "fused", True), (1, 8192, "fused", True),
    (2, 8192, "shipped", False)])
def test_gpu_chained_calls_read_the_previous_calls_output(m, k, variant, static):
    """Layers chained on one stream with no sync: each call's ``x`` is the previous call's output (or a torch
    kernel's result from it), so a quantizer or fused kernel launched as a programmatic dependent that read ``x``
    (or wrote the shared workspace) before the kernel before it completed would differ. Bit for bit against the same
    chain run one synchronized op at a time. ``static``: the weights are declared static, so the fused kernel loads
    them before its wait."""
    torch = pytest.importorskip("torch")
    from baracuda_numba.plans import tuning as memory_tuning

    tuning = current_tuning() if variant == "shipped" else forced(variant, current_tuning())
    # the quantizer is a dependent by its own rule (up to 64 rows), and its always-dependent launcher (the fast
    # path's past quantizer_dependent_min_weight) is counted below; the fused kernel is a dependent at both K
    assert tuning.fused_dependent_min_k <= 4096 and m <= memory_tuning.current_tuning().dynamic.dependent_segments_max
    assert (k * k >= tuning.quantizer_dependent_min_weight) == (k == 8192)
    g = torch.Generator(device="cuda").manual_seed(m)
    weights = [torch.randint(-128, 128, (k, k), device="cuda", generator=g, dtype=torch.int8) for _ in range(3)]
    scales = [torch.rand(k, device="cuda", generator=g) * 1e-3 + 1e-4 for _ in range(3)]
    x0 = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, k, k, "bf16", "bf16", False, static),
                                         tuning=tuning)

    def chained(sync: bool):
        return chain(torch, x0, lambda x, i: plan_call(torch, plan, x, weights[i % 3], scales[i % 3]), sync)

    # "shipped": the selection as shipped (two tokens on long rows: the two launches)
    two_launch = variant in ("two_launch", "shipped")
    out = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    assert plan.kernel_variant(bn.QuantizedLinearArgs(x0, weights[0], scales[0], out)) == (
        "skinny_vector" if two_launch else "fused")
    forced_launches = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        if two_launch:  # count the quantizer's launches forced to be programmatic dependents, alone
            launcher = plan._quantizer._launchers["segment_dependent"]  # or the first of the fast path's pair
            launch = launcher.launch_patched
            monkeypatch.setattr(launcher, "launch_patched",
                                lambda *a, **kw: (forced_launches.append(1), launch(*a, **kw)))
            launch_pair = LaunchPair.launch
            monkeypatch.setattr(LaunchPair, "launch", lambda pair, *a, **kw: (
                pair.first is launcher and forced_launches.append(1), launch_pair(pair, *a, **kw)))
        queued, stepped = chained(False), chained(True)
        assert bool(forced_launches) == (two_launch and k * k >= tuning.quantizer_dependent_min_weight)
        for _ in range(3):
            assert all(torch.equal(a, b) for a, b in zip(chained(False), stepped, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(queued, stepped, strict=True))
    # and the first layer against torch ops
    reference = torch_w8a8(torch, x0, weights[0], scales[0], None)
    assert torch.equal(stepped[0].view(torch.int16), reference.view(torch.int16))


@requires_gpu
@pytest.mark.parametrize("one_call", [False, True])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize(("m", "k"), [(1, 4096), (2, 4096), (16, 4096), (1, 8192), (4, 8192), (32, 4096)])
def test_gpu_smoothquant_chain_reads_each_quantize_after_the_wait(m, k, static, one_call):
    """W8A8Linear's static-activation step chained on one stream with no sync: ``quantize_per_tensor`` of the
    previous output, then ``smoothquant_linear``, whose GEMM (a programmatic dependent) waits for that quantize
    first thing, or with ``static_weight=True`` after loading its weight; ``one_call``:
    ``quantized_linear(..., act_scale=)``, one fused kernel at decode. Reading the activations before the kernel
    before completed would differ from the two-call chain synchronized after every op; the first layer also equals
    torch's ops bit for bit."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(m + k)
    weights = [torch.randint(-128, 128, (k, k), device="cuda", generator=g, dtype=torch.int8) for _ in range(3)]
    scales = [torch.rand(k, device="cuda", generator=g) * 1e-3 + 1e-4 for _ in range(3)]
    x0 = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    act_scale = 0.0237  # not exact in float32

    def two_calls(x, i):
        act = bn.quantize_per_tensor(x, act_scale, q_min=-127, q_max=127)
        return bn.smoothquant_linear(act, weights[i % 3], scales[i % 3], act_scale, dtype="bfloat16",
                                     static_weight=static)

    def one(x, i):
        return bn.quantized_linear(x, weights[i % 3], scales[i % 3], static_weight=static, act_scale=act_scale)

    plan = bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(m, k, k, ElementKind.BF16, False, static))
    args = bn.SmoothQuantLinearArgs(torch.zeros(m, k, device="cuda", dtype=torch.int8), weights[0], scales[0],
                                    act_scale, torch.empty(m, k, device="cuda", dtype=torch.bfloat16))
    variant = plan.spec.aligned  # (wgmma past 16 tokens on an H100)
    assert plan.kernel_variant(args) == variant
    tuning = current_tuning()
    assert plan.spec.variant(variant).dependent == (variant == "skinny_vector"
                                                    or m <= tuning.smoothquant_wgmma_dependent_max_m)
    fused = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, k, k, ElementKind.BF16, ElementKind.BF16,
                                                                       False, static, True))
    assert fused.spec.fused == (m == 1 or (k == 4096 and (m <= 2 or (static and m <= 4))))
    stepped = chain(torch, x0, two_calls, True)
    for _ in range(3):
        queued = chain(torch, x0, one if one_call else two_calls, False)
        assert all(torch.equal(a, b) for a, b in zip(queued, stepped, strict=True))
    act = torch.clamp(torch.round(x0.float() * (1 / torch.tensor(act_scale))), -127, 127).to(torch.int8)
    acc = (act.double() @ weights[0].double().t()).to(torch.int32)
    reference = ((acc.float() * torch.tensor(act_scale, device="cuda")) * scales[0][None, :]).to(torch.bfloat16)
    assert torch.equal(stepped[0].view(torch.int16), reference.view(torch.int16))


@requires_gpu
@pytest.mark.parametrize(("m", "n", "tiles", "sq_tiles", "static_tiles"), [
    (16, 11008, 6, 6, 6), (16, 14336, 7, 7, 7), (2, 6144, 3, 3, 3), (16, 6144, 2, 3, 3), (8, 11008, 6, 6, 6),
    (1, 11008, 6, 6, 6), (2, 8192, 4, 4, 4), (8, 14336, 7, 7, 7)])
def test_gpu_wide_decode_gemm_reads_each_calls_own_activations(m, n, tiles, sq_tiles, static_tiles):
    """The dependent decode GEMM in wider blocks (``tiles`` column tiles for quantized_linear's GEMM, ``sq_tiles`` for
    SmoothQuant's waiting first, ``static_tiles`` for SmoothQuant's under the static promise, its activations copied
    by a torch kernel just before each call), 24 calls queued back to back with no sync and a new ``x`` / ``act``
    each: every output equals torch's ops bit for bit (a GEMM reading the activations before the kernel before it
    finished would see the previous call's)."""
    torch = pytest.importorskip("torch")
    k, tuning = 4096, unfused(current_tuning())
    g = torch.Generator(device="cuda").manual_seed(m + n)
    w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    bias = torch.randn(n, device="cuda", generator=g)
    xs = [(torch.randn(m, k, device="cuda", generator=g) * (1 + i)).to(torch.bfloat16) for i in range(24)]
    acts = [torch.randint(-127, 128, (m, k), device="cuda", generator=g, dtype=torch.int8) for _ in range(24)]
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16", True), tuning=tuning)
    assert plan.spec.variant("skinny_vector").config.tiles == tiles
    sq = bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(m, n, k, "bf16", True), tuning=tuning)
    assert sq.spec.variant("skinny_vector").config.tiles == sq_tiles
    static = bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(m, n, k, "bf16", True, True),
                                             tuning=tuning)
    assert static.spec.variant("skinny_vector").config.tiles == static_tiles
    outs = [plan_call(torch, plan, x, w, ws, bias) for x in xs]
    sq_outs = [sq_call(torch, sq, a, w, ws, 0.0173, bias) for a in acts]
    static_outs = [sq_call(torch, static, a.clone(), w, ws, 0.0173, bias) for a in acts]
    torch.cuda.synchronize()
    for x, out in zip(xs, outs, strict=True):
        assert torch.equal(out.view(torch.int16), torch_w8a8(torch, x, w, ws, bias).view(torch.int16))
    for a, out, static_out in zip(acts, sq_outs, static_outs, strict=True):
        assert torch.equal(static_out.view(torch.int16), out.view(torch.int16))
        acc = (a.double() @ w.double().t()).to(torch.int32)
        y = (acc.float() * torch.tensor(0.0173, device="cuda")) * ws[None, :] + bias[None, :]
        assert torch.equal(out.view(torch.int16), y.to(torch.bfloat16).view(torch.int16))


@requires_gpu
@pytest.mark.parametrize("k", [8192, 4096])
def test_gpu_weight_quantized_just_before_the_call_is_read_after_the_wait(k):
    """Without the static-weight promise the fused kernel (a programmatic dependent; at 4096^2 in its one-wave
    shape) only asks L2 for weight before its wait, and SmoothQuant's GEMM waits first thing: a weight that the
    kernel before it (the per-token quantizer, which lets its dependents start early) writes is read whole. Queued
    calls against the same calls synchronized."""
    torch = pytest.importorskip("torch")
    n = k
    plan = op_plan(bn.QuantizedLinearPlan, bn.QuantizedLinearDescriptor(1, n, k, ElementKind.BF16, ElementKind.BF16))
    fused = plan.spec.variant("fused")
    assert plan.spec.fused and fused.dependent and not fused.config.early_registers
    assert (fused.config.min_blocks == 2) == (k == 4096)
    g = torch.Generator(device="cuda").manual_seed(7)
    w_float = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16)
    x = torch.randn(1, k, device="cuda", generator=g, dtype=torch.bfloat16)
    act = torch.randint(-127, 128, (1, k), device="cuda", generator=g, dtype=torch.int8)

    def calls(sync: bool):
        outs = []
        for i in range(6):
            q = requantized(w_float, i)
            if sync:
                torch.cuda.synchronize()
            outs.append(bn.quantized_linear(x, q.q, q.scale.reshape(-1)))
            q = requantized(w_float, i, 2)
            if sync:
                torch.cuda.synchronize()
            outs.append(bn.smoothquant_linear(act, q.q, q.scale.reshape(-1), 0.013, dtype="bfloat16"))
            if sync:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        return outs

    stepped = calls(True)
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(calls(False), stepped, strict=True))
    q = bn.dynamic_range_quantize(-w_float, scope="token")
    reference = torch_w8a8(torch, x, q.q, q.scale.reshape(-1), None)
    assert torch.equal(stepped[0].view(torch.int16), reference.view(torch.int16))
    acc = (act.double() @ q.q.double().t()).to(torch.int32)
    reference = ((acc.float() * torch.tensor(0.013, device="cuda")) * q.scale.reshape(1, -1)).to(torch.bfloat16)
    assert torch.equal(stepped[1].view(torch.int16), reference.view(torch.int16))


@requires_gpu
@pytest.mark.parametrize(("m", "n", "k"), [(1, 4096, 4096), (7, 264, 8192), (16, 11008, 4096), (16, 40, 144)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("static", [False, True])
def test_gpu_fused_decode_equals_two_launches_and_torch(m, n, k, dtype, static):
    """One launch (x quantized inside the GEMM) gives the two-launch path's bits and torch's; ``static``: the fused
    kernel of a static weight (its first weight loaded before its wait where its blocks fit one wave)."""
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(m * n + k)
    x = (torch.randn(m, k, device="cuda", generator=g) * 3).to(tdtype)
    x[0, :3] = torch.tensor([float("inf"), float("nan"), -float("inf")], dtype=tdtype)
    if m > 1:
        x[1] = 0
    w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    bias = torch.randn(n, device="cuda", generator=g) if m % 2 else None
    desc = bn.QuantizedLinearDescriptor(m, n, k, dtype, dtype, bias is not None, static)
    plan = bn.QuantizedLinearPlan.select(desc, tuning=forced("fused", current_tuning()))
    fused = torch.empty(m, n, device="cuda", dtype=tdtype)
    args = bn.QuantizedLinearArgs(x, w, ws, fused, bias)
    assert plan.kernel_variant(args) == "fused" and plan._fast_pointers(args) is not None
    one_wave = k < 8192 and -(-n // 16) <= 2 * device_properties().multiprocessors
    assert plan.spec.variant("fused").config.early_registers == (static and one_wave)
    plan.run(args)  # the fast path
    checked = torch.empty_like(fused)
    plan.run(bn.QuantizedLinearArgs(x, w, ws, checked, bias), stream=torch.cuda.current_stream())
    two_launch = bn.QuantizedLinearPlan.select(desc, tuning=unfused(current_tuning()))
    unfused_out = plan_call(torch, two_launch, x, w, ws, bias)
    bits = {torch.float32: torch.int32, torch.float64: torch.int64}.get(tdtype, torch.int16)
    assert torch.equal(fused.view(bits), unfused_out.view(bits)) and torch.equal(checked.view(bits), fused.view(bits))
    if dtype != "float64":  # torch's separately rounded float32 ops; f64 has a float64 quantizer
        assert torch.equal(fused.view(bits), torch_w8a8(torch, x, w, ws, bias).view(bits))


@requires_gpu
def test_gpu_plans_sharing_a_kernel_with_different_shared_memory():
    """Plans of several M launch the same fused kernel with different dynamic shared memory, some past 48 KiB with
    the kernel's static shared memory: each launch works, in any order (the opt-in belongs to the kernel, so a later
    plan must not lower it under an earlier one's)."""
    torch = pytest.importorskip("torch")
    n, k, tuning = 264, 8192, forced("fused", current_tuning())
    g = torch.Generator(device="cuda").manual_seed(11)
    w = torch.randint(-128, 128, (n, k), device="cuda", generator=g, dtype=torch.int8)
    ws = torch.rand(n, device="cuda", generator=g) * 0.01 + 0.001
    cases = [(m, (torch.randn(m, k, device="cuda", generator=g) * 3).to(torch.bfloat16)) for m in (16, 4, 7, 2, 16)]
    plans = {m: bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16"), tuning=tuning)
             for m in (16, 4, 7, 2)}
    assert len({plan.spec.variant("fused").config for plan in plans.values()}) == 1
    fused = [plan_call(torch, plans[m], x, w, ws) for m, x in cases]
    fused += [plan_call(torch, plans[m], x, w, ws) for m, x in cases]  # again, every plan already built
    for (m, x), got, again in zip(cases, fused[:len(cases)], fused[len(cases):], strict=True):
        want = torch_w8a8(torch, x, w, ws, None)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), m
        assert torch.equal(again.view(torch.int16), want.view(torch.int16)), m


@requires_gpu
@pytest.mark.parametrize(("m", "n", "k"), [
    (65, 264, 512), (200, 336, 144), (129, 520, 4096),  # ragged: M, N past the tiles, K % 128 != 0
    (257, 4096, 11008), (2048, 4096, 4096),  # the wide tile, several K steps
    (17, 4096, 4096), (48, 264, 528),  # batches past warpgroup_min_m: 64 x 32 tiles, one live row / 48 in 64
    (100, 4096, 4096), (200, 4096, 4096), (64, 11008, 4096),  # 64 x 64, 128 x 64, the narrow tile half live
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_gpu_warpgroup_gemm_equals_the_portable_kernels_and_torch(m, n, k, dtype):
    """On an sm_90 device prefill, and batches past ``warpgroup_min_m`` tokens, take the wgmma kernel (in the tile
    its rule picks: every shape above is among these cases); its output is the one ``allow_sm90a=False`` gives (the
    mma.sync kernels: the pipeline, or the skinny kernel up to 64 tokens), bit for bit, for every output dtype, bias
    or not, per-token and per-tensor activation scales; and, but for float64, torch's ``_int_mm`` followed by the
    separately rounded epilogue."""
    torch = pytest.importorskip("torch")
    if not hopper_available():
        pytest.skip("wgmma needs compute capability 9.0")
    tdtype = getattr(torch, dtype)
    x, w, ws, bias, act = gpu_linear_problem(torch, m, n, k, tdtype)
    element = bn.element_kind(dtype)

    def outputs(pref):
        ql = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, element, element, bias is not None),
                                           pref)
        sq = bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(m, n, k, element, bias is not None), pref)
        y, s = plan_call(torch, ql, x, w, ws, bias), sq_call(torch, sq, act, w, ws, 0.0123, bias, tdtype)
        torch.cuda.synchronize()
        return ql, y, s

    plan, y, s = outputs(PlanPreference())
    assert plan.kernel_variant(bn.QuantizedLinearArgs(x, w, ws, y, bias)) == "wgmma"
    assert plan.spec.variant("wgmma").dependent == (m <= plan.tuning.wgmma_dependent_max_m)
    assert plan.sku().arch is bn.ArchSku.SM90A
    portable, y_portable, s_portable = outputs(PlanPreference(allow_sm90a=False))
    assert "wgmma" not in portable.spec.names and portable.sku().arch is not bn.ArchSku.SM90A
    bits = {torch.float32: torch.int32, torch.float64: torch.int64}.get(tdtype, torch.int16)
    assert torch.equal(y.view(bits), y_portable.view(bits)) and torch.equal(s.view(bits), s_portable.view(bits))
    if dtype != "float64":  # torch's epilogue rounds in float32 before the float64 cast
        assert torch.equal(y.view(bits), torch_w8a8(torch, x, w, ws, bias).view(bits))
        acc = torch._int_mm(act, w.t()) if m > 16 else (act.double() @ w.double().t()).to(torch.int32)
        expected = (acc.float() * torch.tensor(0.0123, device="cuda")) * ws[None, :]
        expected = (expected + bias[None, :] if bias is not None else expected).to(tdtype)
        assert torch.equal(s.view(bits), expected.view(bits))


@requires_gpu
@pytest.mark.parametrize(("m", "n", "k"), [(17, 4096, 4096), (48, 264, 528), (64, 520, 4096)])
def test_gpu_misaligned_batch_operands_take_the_skinny_byte_path(m, n, k):
    """A batch past ``warpgroup_min_m`` tokens whose weight (or SmoothQuant's activation) sits off its 16-byte
    alignment takes the skinny kernel's byte path on an sm_90 device (the warpgroup GEMM needs aligned operands;
    the tiled kernel was 2.5-4x slower there), with the bits of the aligned call and of torch."""
    torch = pytest.importorskip("torch")
    x, w, ws, bias, act = gpu_linear_problem(torch, m, n, k, torch.bfloat16)

    def off_by_one(t):
        flat = torch.empty(t.numel() + 1, device="cuda", dtype=t.dtype)
        view = flat[1:].view(t.shape)
        view.copy_(t)
        return view

    w_off, act_off = off_by_one(w), off_by_one(act)
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16", bias is not None))
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    aligned_kernel = "wgmma" if hopper_available() else "skinny_vector"
    assert plan.kernel_variant(bn.QuantizedLinearArgs(x, w, ws, out, bias)) == aligned_kernel
    assert plan.kernel_variant(bn.QuantizedLinearArgs(x, w_off, ws, out, bias)) == "skinny"
    y = bn.quantized_linear(x, w, ws, bias=bias)
    y_off = bn.quantized_linear(x, w_off, ws, bias=bias)
    s = bn.smoothquant_linear(act, w, ws, 0.0123, bias=bias, dtype="bfloat16")
    s_off = bn.smoothquant_linear(act_off, w, ws, 0.0123, bias=bias, dtype="bfloat16")
    torch.cuda.synchronize()
    assert torch.equal(y_off.view(torch.int16), y.view(torch.int16))
    assert torch.equal(s_off.view(torch.int16), s.view(torch.int16))
    assert torch.equal(y.view(torch.int16), torch_w8a8(torch, x, w, ws, bias).view(torch.int16))


_HOPPER_PTX = """
import os, sys
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
os.environ["NUMBA_FORCE_CUDA_CC"] = "9.0"
import numba.cuda.cuda_paths as paths
paths._get_nvrtc_path = lambda: ("stub", None)  # numba asks for NVRTC even when only NVVM compiles
from baracuda_numba.kernels.linear import Output, WarpgroupConfig, warpgroup_kernel
from baracuda_numba.plans.linear import H100_TUNING as t
from baracuda_numba.vocabulary import ElementKind
try:
    for shape in (t.wgmma_wide, t.wgmma_narrow, *t.wgmma_small):
        for out, bias in ((ElementKind.BF16, True), (ElementKind.F32, False)):
            path = os.path.join(sys.argv[1], f"{shape.name}_{out.short}.ptx")
            open(path, "w").write(warpgroup_kernel(WarpgroupConfig(Output(out, bias), shape)).ptx())
        path = os.path.join(sys.argv[1], f"{shape.name}_dep.ptx")
        open(path, "w").write(warpgroup_kernel(WarpgroupConfig(Output(ElementKind.BF16), shape, True)).ptx())
        path = os.path.join(sys.argv[1], f"{shape.name}_depw.ptx")
        config = WarpgroupConfig(Output(ElementKind.BF16, False, True), shape, True, True)
        open(path, "w").write(warpgroup_kernel(config).ptx())
except Exception as error:  # no NVVM on this machine
    if "nvvm" in repr(error).lower() or "NotFound" in type(error).__name__:
        sys.exit(77)
    raise
"""


def test_warpgroup_kernel_compiles_to_sm_90a_ptx(tmp_path):
    """Without a GPU the simulator never runs the wgmma kernel, so its definition is compiled to PTX here (where
    NVVM is installed), in every shape the rule may pick (one warpgroup or two): retargeted to sm_90a, four
    ``m64n{tile_n}k32`` wgmma per 128-byte k step, the accumulators in registers (no local memory), the async-proxy
    fence, and for 16-bit outputs the vector epilogue's 16-byte shared loads and global stores; the dependent form
    copies its first steps of weight before its wait and nothing else, and the waiting-first form reads nothing
    before it."""
    import os
    import subprocess
    import sys

    from baracuda_numba.plans.linear import H100_TUNING

    t = H100_TUNING
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-c", _HOPPER_PTX, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode == 77:
        pytest.skip("no NVVM here to compile PTX with")
    assert done.returncode == 0, done.stderr[-2000:]
    for shape in (t.wgmma_wide, t.wgmma_narrow, *t.wgmma_small):
        for out in ("bf16", "f32"):
            ptx = (tmp_path / f"{shape.name}_{out}.ptx").read_text()
            assert "\n.target sm_90a\n" in ptx
            assert ptx.count(f"wgmma.mma_async.sync.aligned.m64n{shape.tile_n}k32.s32.s8.s8") == 4
            assert "fence.proxy.async.shared::cta" in ptx and "wgmma.wait_group.sync.aligned 1" in ptx
            assert ".local" not in ptx
            assert ("st.global.v2.u64" in ptx and "ld.shared.v4.u32" in ptx) == (out == "bf16")
            assert "griddepcontrol" not in ptx
        # the programmatic dependent: its first stages - 2 steps of weight copied, then the wait, then the rest
        ptx = (tmp_path / f"{shape.name}_dep.ptx").read_text()
        before, after = ptx.split("griddepcontrol.wait;")
        assert "griddepcontrol.launch_dependents;" in after and "griddepcontrol.wait" not in after
        weight_copies = (shape.stages - 2) * shape.tile_n // (shape.threads // 8)
        assert before.count("cp.async.cg.shared.global") == weight_copies, (shape.name, weight_copies)
        # waiting first (SmoothQuant's GEMM after any kernel): nothing read before the wait
        before, after = (tmp_path / f"{shape.name}_depw.ptx").read_text().split("griddepcontrol.wait;")
        assert "griddepcontrol.launch_dependents;" in after and "griddepcontrol.wait" not in after
        assert "ld.global" not in before and "cp.async" not in before and "ld.param" in before
