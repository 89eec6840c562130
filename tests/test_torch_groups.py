"""Projection groups (:mod:`baracuda_numba.torch.groups`): sibling W8A8 layers that read one input computed as one
GEMM over their weights laid end to end. On a machine without a GPU: CPU tensors posing as CUDA ones and the W8A8
plan rebuilt for the GPU launch path over a recording libcuda stand-in (as ``test_torch_bound.py``); on a GPU: each
member's columns against the member's own call, bit for bit, in eager mode, under ``torch.compile`` and in a CUDA
graph."""

from __future__ import annotations

import copy
import io

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")

from linear_helpers import forced  # noqa: E402
from test_linear_fast import _gpu_linear_plan  # noqa: E402
from test_workspace import Memory  # noqa: E402

import baracuda_numba as bn  # noqa: E402
from baracuda_numba.ops import linear_bound  # noqa: E402
from baracuda_numba.plans.linear import quantized  # noqa: E402
from baracuda_numba.torch import W8A8Linear, group_projections  # noqa: E402
from baracuda_numba.workspace import StreamWorkspaces  # noqa: E402
from tests.conftest import SIMULATOR  # noqa: E402


class Attention(torch.nn.Module):
    """Three projections of one input (a grouped-query attention's shapes: k and v narrower than q)."""

    def __init__(self, k: int, widths: tuple[int, int, int], bias: bool, device: str = "cpu", activation="dynamic",
                 act_scale=None):
        super().__init__()
        for name, n in zip(("q_proj", "k_proj", "v_proj"), widths, strict=True):
            linear = torch.nn.Linear(k, n, bias=bias, device=device)
            setattr(self, name, W8A8Linear.from_float(linear, activation=activation, act_scale=act_scale) if
                    device == "cuda" else _cpu_layer(linear, activation, act_scale))

    def forward(self, x):
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)


def _cpu_layer(linear, activation, act_scale):
    """A W8A8 layer with random int8 weights and scales, no kernel involved (CPU)."""
    g = torch.Generator().manual_seed(linear.out_features)
    layer = W8A8Linear(linear.in_features, linear.out_features, linear.bias is not None, activation=activation,
                       act_scale=act_scale)
    layer.weight_q.copy_(torch.randint(-127, 128, layer.weight_q.shape, generator=g, dtype=torch.int8))
    layer.weight_scale.copy_(torch.rand(linear.out_features, generator=g) + 0.01)
    if layer.bias is not None:
        layer.bias.copy_(torch.randn(linear.out_features, generator=g))
    return layer


@pytest.fixture
def fake_cuda(monkeypatch):
    """CPU tensors report CUDA device 0."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    monkeypatch.setattr(torch.Tensor, "get_device", lambda t: 0)
    linear_bound.clear_bound_launches()
    yield monkeypatch
    linear_bound.clear_bound_launches()


def test_grouping_lays_the_buffers_end_to_end_as_tensors_of_their_own(fake_cuda):
    module = Attention(64, (32, 16, 16), bias=True)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    assert group_projections(module) == 1
    assert group_projections(module) == 0  # grouped already
    after = module.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    q, k, v = module.q_proj, module.k_proj, module.v_proj
    for buffer, itemsize in (("weight_q", 64), ("weight_scale", 4), ("bias", 4)):
        first, second, third = (getattr(m, buffer) for m in (q, k, v))
        assert second.data_ptr() == first.data_ptr() + 32 * itemsize
        assert third.data_ptr() == second.data_ptr() + 16 * itemsize
        storages = {t.untyped_storage().data_ptr() for t in (first, second, third)}
        assert len(storages) == 3  # what safetensors and save_pretrained look at: no shared storage
    saved = io.BytesIO()
    torch.save(module.state_dict(), saved)
    saved.seek(0)
    loaded = torch.load(saved)
    assert all(torch.equal(loaded[k], before[k]) for k in before)
    clone = copy.deepcopy(module)  # a copy's buffers are its own: no group
    assert clone.q_proj._group is None and q._group is not None


def test_a_group_off_the_gpu_is_inactive_until_its_model_is_moved(monkeypatch):
    """Grouped on the CPU (a model loaded there): inactive, nothing laid out; moving the model to a CUDA device
    (here: CPU tensors posing as device 0, ``_apply`` as ``.to()`` calls it) lays the copies out end to end."""
    module = Attention(64, (32, 16, 16), bias=True)
    assert group_projections(module) == 1
    group = module.q_proj._group
    assert not group.active and not group._end_to_end()
    monkeypatch.setattr(torch.Tensor, "get_device", lambda t: 0)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    module._apply(lambda t: t.clone())  # a move: every buffer a copy, one member after the other
    assert group.active and group._end_to_end()
    assert all(torch.equal(module.state_dict()[k], before[k]) for k in before)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda t: -1)  # back on the CPU: inactive
    module._apply(lambda t: t)
    assert not group.active
    assert group.output(0, torch.empty(2, 64)) is None


def test_layers_that_cannot_share_a_gemm_stay_alone(fake_cuda):
    mixed = Attention(64, (32, 16, 16), bias=True)
    mixed.v_proj = _cpu_layer(torch.nn.Linear(64, 16, bias=False), "dynamic", None)  # one without a bias
    static = Attention(64, (32, 16, 16), bias=False, activation="static", act_scale=0.5)
    static.k_proj = _cpu_layer(torch.nn.Linear(64, 16, bias=False), "static", 0.25)  # another static scale
    other_k = Attention(64, (32, 16, 16), bias=False)
    other_k.v_proj = _cpu_layer(torch.nn.Linear(32, 16, bias=False), "dynamic", None)  # another input size
    for module in (mixed, static, other_k):
        assert group_projections(module) == 0
        assert module.q_proj._group is None


def _recording_plan(monkeypatch, m, n, k, variant):
    """The plan of ``(m, n, k)`` on the recording driver, selected for that problem (no plan for any other)."""
    desc = bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16", False, True, False)
    plan = bn.QuantizedLinearPlan.select(desc, tuning=forced(variant))
    driver = _gpu_linear_plan(monkeypatch, plan)
    workspaces = StreamWorkspaces(Memory().memory())
    monkeypatch.setattr(quantized, "stream_workspaces", lambda: workspaces)

    class NoFastPath:
        _fast_path = staticmethod(lambda: None)

    monkeypatch.setattr(linear_bound, "_select", lambda plan_type, got: plan if got == desc else NoFastPath())
    return plan, driver


@pytest.mark.parametrize("variant", ["two", "fused"])
def test_the_first_member_launches_the_groups_gemm_and_the_others_take_their_columns(fake_cuda, variant):
    module = Attention(64, (32, 16, 16), bias=False)
    group_projections(module)
    plan, driver = _recording_plan(fake_cuda, 2, 64, 64, variant)
    launches = 1 if plan.spec.fused else 2
    x = torch.empty(2, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        q, k, v = module(x)
    assert len(driver.calls) == launches  # one GEMM (with its quantizer) for the three
    q_ptr = module.q_proj.weight_q.data_ptr()
    assert q_ptr.to_bytes(8, "little") in driver.calls[-1][1]  # the weights read in place, from the first row
    assert (q.shape, k.shape, v.shape) == ((2, 32), (2, 16), (2, 16))
    assert k.data_ptr() == q.data_ptr() + 32 * 2 and v.data_ptr() == k.data_ptr() + 16 * 2  # columns of one output
    assert q.untyped_storage().data_ptr().to_bytes(8, "little") in driver.calls[-1][1]
    assert module.q_proj._group._pending is None  # the last member let the output go

    with torch.no_grad():
        module(x)
        assert len(driver.calls) == 2 * launches
        x.add_(1)  # the same object, changed: the group's output is not reused
        module.q_proj(x)
        x.add_(1)
        module.k_proj(x)
        assert len(driver.calls) == 4 * launches
        module.v_proj(torch.empty(2, 64, dtype=torch.bfloat16))  # another x: computed again
        assert len(driver.calls) == 5 * launches


def _layers_alone(monkeypatch) -> list:
    """The layers that go the full way on their own (their op forward), recorded; the full way returns zeros."""
    calls = []
    real = W8A8Linear._op_forward
    monkeypatch.setattr(W8A8Linear, "_op_forward", lambda self, x: calls.append(self) or real(self, x))
    monkeypatch.setattr(linear_bound, "quantized_linear",
                        lambda x, w, s, *, bias, static_weight, act_scale, out=None: x.new_zeros((*x.shape[:-1],
                                                                                                  w.shape[0])))
    return calls


def test_past_the_decode_sizes_each_member_runs_alone(fake_cuda):
    """More than ``MAX_GROUPED_TOKENS`` rows (a prefill), or none: no group launch, each layer its own call."""
    from baracuda_numba.torch.groups import MAX_GROUPED_TOKENS

    module = Attention(64, (32, 16, 16), bias=False)
    group_projections(module)
    _, driver = _recording_plan(fake_cuda, MAX_GROUPED_TOKENS + 1, 64, 64, "two")
    calls = _layers_alone(fake_cuda)
    with torch.no_grad():
        for rows in (MAX_GROUPED_TOKENS + 1, 0):
            calls.clear()
            q, k, v = module(torch.empty(rows, 64, dtype=torch.bfloat16))
            assert driver.calls == [] and len(calls) == 3, rows
            assert (q.shape, k.shape, v.shape) == ((rows, 32), (rows, 16), (rows, 16))


def test_a_group_whose_buffers_were_replaced_steps_aside(fake_cuda):
    module = Attention(64, (32, 16, 16), bias=False)
    group_projections(module)
    _, driver = _recording_plan(fake_cuda, 2, 64, 64, "two")
    module.k_proj.weight_q = module.k_proj.weight_q.clone()  # no longer end to end
    calls = _layers_alone(fake_cuda)
    x = torch.empty(2, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        module(x)
    assert driver.calls == [] and len(calls) == 3  # each layer alone, the full way


# -- on a GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="needs a real GPU: CUDA tensors, the compiled launches")
@pytest.mark.parametrize("activation,bias", [("dynamic", False), ("dynamic", True), ("static", True)])
def test_gpu_group_columns_are_each_members_own_bits(activation, bias):
    """Eager, ``torch.compile`` and a CUDA graph: each member's columns equal its own call's bits, at decode and
    prefill shapes (one token takes the fused kernel where the group's weight is small enough)."""
    torch.manual_seed(0)
    module = Attention(512, (512, 128, 128), bias, device="cuda", activation=activation, act_scale=0.03)
    alone = copy.deepcopy(module)  # the same weights, not grouped
    assert group_projections(module) == 1 and alone.q_proj._group is None
    compiled = torch.compile(module, fullgraph=True)
    for m in (1, 4, 16, 64, 300):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            expected = alone(x)
            for got in (module(x), module(x), compiled(x), compiled(x)):
                assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), m
    static_x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        module(static_x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = module(static_x)
        static_x.copy_(torch.randn(4, 512, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(captured, alone(static_x), strict=True))


def test_the_group_op_writes_each_layers_own_result_into_its_columns():
    """``baracuda::quantized_linear_group_out`` on layers that are not end to end (here: CPU tensors, or the
    simulator): each layer's ``quantized_linear`` into its columns."""
    g = torch.Generator().manual_seed(3)
    device = "cpu" if SIMULATOR else "cuda"
    x = torch.randn(3, 32, generator=g).to(device)
    weights = [torch.randint(-127, 128, (n, 32), generator=g, dtype=torch.int8).to(device) for n in (8, 4)]
    scales = [(torch.rand(n, generator=g) * 0.1 + 0.01).to(device) for n in (8, 4)]
    biases = [torch.randn(n, generator=g).to(device) for n in (8, 4)]
    out = torch.full((3, 12), float("nan"), device=device)
    torch.ops.baracuda.quantized_linear_group_out.default(x, weights, scales, biases, True, None, out)
    expected = torch.cat([bn.quantized_linear(x, w, s, bias=b) for w, s, b in zip(weights, scales, biases,
                                                                                   strict=True)], dim=-1)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("case,pattern", [
    ("no_weights", r"quantized_linear_group_out: weights_q expected one or more"),
    ("scales_short", r"quantized_linear_group_out: weight_scales expected 2 scale vectors"),
    ("biases_short", r"quantized_linear_group_out: biases expected none or 2"),
    ("out_shape", r"quantized_linear_group_out: out expected \[3, 12\]"),
])
def test_the_group_op_names_the_list_that_does_not_fit(case, pattern):
    x = torch.zeros(3, 32)
    weights = [torch.zeros(8, 32, dtype=torch.int8), torch.zeros(4, 32, dtype=torch.int8)]
    scales, biases, out = [torch.ones(8), torch.ones(4)], [], torch.empty(3, 12)
    if case == "no_weights":
        weights = []
    elif case == "scales_short":
        scales = scales[:1]
    elif case == "biases_short":
        biases = [torch.zeros(8)]
    else:
        out = torch.empty(3, 11)
    with pytest.raises(bn.InvalidProblem, match=pattern):
        torch.ops.baracuda.quantized_linear_group_out.default(x, weights, scales, biases, True, None, out)
