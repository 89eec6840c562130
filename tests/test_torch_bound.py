"""The PyTorch layer's lean entries (:mod:`baracuda_numba.ops.linear_bound`) on a machine without a GPU: CPU tensors
posing as CUDA ones, the W8A8 plans rebuilt for the GPU launch path over a recording libcuda stand-in. An eager
:class:`W8A8Linear` call launches its remembered plan without the custom op; the op's implementation (what
``torch.compile`` calls) does the same from its tensors; both hand the driver the bytes of the checked path."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch layer needs torch (the [torch] extra)")

from linear_helpers import forced  # noqa: E402
from test_linear_fast import _gpu_linear_plan  # noqa: E402
from test_workspace import Memory  # noqa: E402

import baracuda_numba as bn  # noqa: E402
from baracuda_numba.ops import linear_bound  # noqa: E402
from baracuda_numba.plans.linear import quantized  # noqa: E402
from baracuda_numba.torch import W8A8Linear  # noqa: E402
from baracuda_numba.workspace import StreamWorkspaces  # noqa: E402
from tests.conftest import SIMULATOR  # noqa: E402

VARIANTS = {"two launches": ("dynamic", "two"), "fused": ("dynamic", "fused"), "static": ("static", "two"),
            "static fused": ("static", "fused")}


@pytest.fixture
def fake_cuda(monkeypatch):
    """CPU tensors report CUDA device ``fake_device`` (0 unless set; -1: the CPU)."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: getattr(t, "fake_device", 0) >= 0))
    monkeypatch.setattr(torch.Tensor, "get_device", lambda t: getattr(t, "fake_device", 0))
    linear_bound.clear_bound_launches()
    yield monkeypatch
    linear_bound.clear_bound_launches()


def _setup(monkeypatch, activation, variant, m=2, n=48, k=64, bias=True):
    """A layer, its plan on the recording driver (selected for every call), and the full way's calls recorded."""
    layer = W8A8Linear(k, n, bias, activation=activation, act_scale=0.02 if activation == "static" else None)
    desc = bn.QuantizedLinearDescriptor(m, n, k, "bf16", "bf16", bias, True, activation == "static")
    plan = bn.QuantizedLinearPlan.select(desc, tuning=forced(variant))
    assert plan.spec.fused is (variant == "fused")
    driver = _gpu_linear_plan(monkeypatch, plan)
    workspaces = StreamWorkspaces(Memory().memory())  # the stream's buffer: driver memory on a GPU
    monkeypatch.setattr(quantized, "stream_workspaces", lambda: workspaces)
    full = []

    class NoFastPath:  # the plan of another problem (another dtype): the full way every call
        _fast_path = staticmethod(lambda: None)

    def selected(plan_type, got):
        return plan if got == desc else NoFastPath()

    def full_way(x, weight_q, weight_scale, *, bias, static_weight, act_scale, out=None):
        full.append((x, weight_q, bias, static_weight, act_scale))
        return x.new_empty((*x.shape[:-1], weight_q.shape[0])) if out is None else out

    monkeypatch.setattr(linear_bound, "_select", selected)
    monkeypatch.setattr(linear_bound, "quantized_linear", full_way)
    workspace = bn.arrays.Operand(None, "torch", bn.ElementKind.U8, (plan.workspace_size(),),
                                  workspaces.pointer(0, 0x77, plan.workspace_size()), True)
    plan.checked = lambda args: plan.run(args, workspace=workspace, stream=0x77)  # the same workspace
    return layer, plan, driver, full


@pytest.mark.parametrize("name", VARIANTS)
def test_eager_layer_calls_launch_the_remembered_plan_without_the_custom_op(fake_cuda, name):
    activation, variant = VARIANTS[name]
    layer, plan, driver, full = _setup(fake_cuda, activation, variant)
    through_op = []
    op_forward = W8A8Linear._op_forward
    fake_cuda.setattr(W8A8Linear, "_op_forward", lambda self, x: through_op.append(x) or op_forward(self, x))
    x = torch.empty(2, 64, dtype=torch.bfloat16)
    launches = 1 if plan.spec.fused else 2
    with torch.no_grad():
        layer(x)  # the full way (the custom op), which remembers the plan's launch
        assert len(through_op) == len(full) == 1 and driver.calls == []
        assert full[0][3] is True and full[0][4] == layer._act_scale  # static_weight, the static scale
        y = layer(x)
        assert len(through_op) == 1 and len(full) == 1 and len(driver.calls) == launches
        assert y.shape == (2, 48) and y.dtype == torch.bfloat16
        fast = list(driver.calls)
        driver.calls.clear()
        plan.checked(bn.QuantizedLinearArgs(x, layer.weight_q, layer.weight_scale, y, layer.bias, layer._act_scale))
        assert driver.calls == fast  # the checked path's bytes, launch by launch
        driver.calls.clear()

        layer.weight_q = torch.zeros(48, 64, dtype=torch.int8)  # a buffer replaced: bound again, its first call
        layer(x)  # through the op, whose implementation launches the launch remembered for the shape
        assert len(through_op) == 2 and len(full) == 1 and len(driver.calls) == launches
        layer(x)
        assert len(through_op) == 2 and len(driver.calls) == 2 * launches
        assert (layer.weight_q.data_ptr()).to_bytes(8, "little") in driver.calls[-1][1]

        for other in (torch.empty(2, 128, dtype=torch.bfloat16)[:, ::2],  # strided: the op makes it contiguous
                      torch.empty(2, 64, dtype=torch.float32),  # another dtype: another plan (the full way)
                      torch.empty(2 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 64)):  # off 16 bytes
            before = len(through_op)
            layer(other)
            assert len(through_op) == before + 1, other.dtype
    x_grad = x.clone().requires_grad_()
    layer(x_grad)  # autograd: the op, as before
    assert len(through_op) == 6
    with pytest.raises(bn.InvalidProblem, match="W8A8Linear: x expected"):
        layer(torch.empty(2, 32, dtype=torch.bfloat16))


@pytest.mark.parametrize("name", VARIANTS)
def test_the_ops_implementation_launches_the_remembered_plan_from_its_tensors(fake_cuda, name):
    """``baracuda::quantized_linear`` (every call under ``torch.compile``): a repeat call launches the remembered
    plan, checking each tensor in one frame; whatever the launch cannot take goes the full way."""
    activation, variant = VARIANTS[name]
    layer, plan, driver, full = _setup(fake_cuda, activation, variant)
    op = torch.ops.baracuda.quantized_linear.default
    x = torch.empty(2, 64, dtype=torch.bfloat16)
    w, s, b, a = layer.weight_q, layer.weight_scale, layer.bias, layer._act_scale
    launches = 1 if plan.spec.fused else 2
    op(x, w, s, b, True, a)
    assert len(full) == 1 and driver.calls == []
    y = op(x, w, s, b, True, a)
    assert len(full) == 1 and len(driver.calls) == launches
    fast = list(driver.calls)
    driver.calls.clear()
    plan.checked(bn.QuantizedLinearArgs(x, w, s, y, b, a))
    assert driver.calls == fast
    driver.calls.clear()

    def other(tensor, **set_):
        for attribute, value in set_.items():
            setattr(tensor, attribute, value)
        return tensor

    declined = [
        (torch.empty(2 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 64), w, s, b),  # x off 16 bytes
        (x, w, s, b.double()),
        (x, w, other(s.clone(), fake_device=1), b),  # scales on another device
        (x, w, s, b.half()),
        (x.float(), w, s, b),  # another problem: another key
    ]
    for count, args in enumerate(declined, start=2):
        op(*args, True, a)
        assert len(full) == count and driver.calls == [], count
    op(x, torch.nn.Parameter(w, requires_grad=False), s, b, True, a)  # parameters are tensors as well
    assert len(full) == len(declined) + 1 and len(driver.calls) == launches
    driver.calls.clear()

    # the out-variant (what the layer calls under torch.compile): the same launch into the buffer given
    into = torch.empty_like(y)
    torch.ops.baracuda.quantized_linear_out.default(x, w, s, b, True, a, into)
    assert len(full) == len(declined) + 1 and len(driver.calls) == launches
    fast = list(driver.calls)
    driver.calls.clear()
    plan.checked(bn.QuantizedLinearArgs(x, w, s, into, b, a))
    assert driver.calls == fast and into.data_ptr().to_bytes(8, "little") in fast[-1][1]
    driver.calls.clear()
    for bad in (torch.empty(2, 48, dtype=torch.float32), torch.empty(2, 96, dtype=torch.bfloat16)[:, ::2],
                torch.empty(3, 48, dtype=torch.bfloat16)):  # another dtype, strided, another shape: the full way
        before = len(full)
        torch.ops.baracuda.quantized_linear_out.default(x, w, s, b, True, a, bad)
        assert len(full) == before + 1 and driver.calls == []
    if activation == "static":
        with pytest.raises(bn.InvalidProblem, match="act_scale"):
            op(x, w, s, b, True, float("inf"))


@pytest.mark.parametrize("name", ["two launches", "fused"])
def test_op_calls_with_bound_weights_check_only_the_input_and_output(fake_cuda, name):
    """Compiled code calls the op with the same weight tensors every step: once a call launched with them, a repeat
    call checks only ``x`` and ``out`` (no key of every tensor, ``_launch_key``), with the checked path's bytes;
    another tensor object (a replaced buffer) is checked again, and the binding holds no weight alive."""
    import gc
    import weakref

    activation, variant = VARIANTS[name]
    layer, plan, driver, full = _setup(fake_cuda, activation, variant)
    out_op = torch.ops.baracuda.quantized_linear_out.default
    x = torch.empty(2, 64, dtype=torch.bfloat16)
    w, s, b, a = layer.weight_q, layer.weight_scale, layer.bias, layer._act_scale
    into = torch.empty(2, 48, dtype=torch.bfloat16)
    keyed = []
    launch_key = linear_bound._launch_key
    fake_cuda.setattr(linear_bound, "_launch_key", lambda *args: keyed.append(1) or launch_key(*args))
    launches = 1 if plan.spec.fused else 2
    out_op(x, w, s, b, True, a, into)  # the full way
    out_op(x, w, s, b, True, a, into)  # the remembered launch, which binds the weights
    assert len(full) == 1 and len(driver.calls) == launches
    keyed.clear()
    driver.calls.clear()
    for _ in range(3):
        out_op(x, w, s, b, True, a, into)
    assert keyed == [] and len(driver.calls) == 3 * launches and len(full) == 1
    fast = driver.calls[-launches:]
    driver.calls.clear()
    plan.checked(bn.QuantizedLinearArgs(x, w, s, into, b, a))
    assert driver.calls == fast
    driver.calls.clear()
    for bad in (torch.empty(2, 48, dtype=torch.float32), torch.empty(3, 48, dtype=torch.bfloat16),
                torch.empty(2, 96, dtype=torch.bfloat16)[:, ::2]):  # the bound path declines: the full way
        out_op(x, w, s, b, True, a, bad)
        assert len(full) == 2 and driver.calls == []
        full.clear()
        full.append(None)
    keyed.clear()
    w2 = w.clone()  # another tensor: checked again (the key), then bound
    out_op(x, w2, s, b, True, a, into)
    assert keyed == [1] and len(driver.calls) == launches
    assert w2.data_ptr().to_bytes(8, "little") in driver.calls[-1][1]
    dead = weakref.ref(w2)
    del w2
    gc.collect()
    assert dead() is None  # the binding held it weakly


def test_an_eager_layer_call_is_a_few_python_frames(fake_cuda):
    """The Python functions a repeat eager call runs (host time at decode is the model's speed): the module's
    call and forward, ``torch.compiler.is_compiling``, the bound call, the plan's launch and its stream workspace;
    ``nn.Linear`` runs three (its module call, forward and a parameter lookup; ``F.linear`` is C). The stand-ins
    of this test (C functions on a GPU: the tensors' device, the current stream, the driver) are not counted."""
    layer, _, driver, _ = _setup(fake_cuda, "dynamic", "two")
    x = torch.empty(2, 64, dtype=torch.bfloat16)
    linear = torch.nn.Linear(64, 48, dtype=torch.bfloat16)
    here = __file__.rsplit("/", 1)[0]

    def frames(call):
        names = []

        def profile(frame, event, arg):
            if event == "call" and not frame.f_code.co_filename.startswith(here) \
                    and frame.f_code.co_name != "string_at":
                names.append(frame.f_code.co_qualname)

        sys.setprofile(profile)
        try:
            call()
        finally:
            sys.setprofile(None)
        return names

    with torch.no_grad():
        for _ in range(3):  # the full way, then the first launches (the launch pair compiled, the kernels loaded)
            layer(x)
        ours, theirs = frames(lambda: layer(x)), frames(lambda: linear(x))
    print(f"\nPython frames of a repeat call: W8A8Linear {len(ours)} {ours}\nnn.Linear {len(theirs)} {theirs}")
    assert len(theirs) <= 5
    assert len(ours) <= 12, ours
    assert not any("ops" in name or "quantized_linear" in name for name in ours), ours
    assert len(driver.calls) == 2 * 3  # every call after the first launched its two kernels


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="needs a real GPU: CUDA tensors, the compiled launches")
@pytest.mark.parametrize("activation", ["dynamic", "static"])
def test_gpu_bound_calls_and_op_calls_give_the_bits_of_the_full_way(activation):
    """On CUDA tensors: a layer's repeat eager calls (its bound plan), the op's repeat calls (what compiled code
    runs) and the op functions' full way give the same bits, at decode and prefill shapes, with and without a
    bias, on the default stream and on a side stream."""
    import baracuda_numba as bn

    g = torch.Generator(device="cuda").manual_seed(2)
    op, out_op = torch.ops.baracuda.quantized_linear.default, torch.ops.baracuda.quantized_linear_out.default
    for n, k, bias in ((512, 512, True), (1024, 512, False), (512, 1024, True)):
        linear = torch.nn.Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16)
        layer = W8A8Linear.from_float(linear, activation=activation, act_scale=0.05)
        a = layer._act_scale
        for m in (1, 4, 64, 300):
            x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
            expected = bn.quantized_linear(x, layer.weight_q, layer.weight_scale, bias=layer.bias,
                                           static_weight=True, act_scale=a)
            stream = torch.cuda.Stream()
            with torch.no_grad():
                for _ in range(3):
                    assert torch.equal(layer(x), expected), (n, k, m)
                    assert torch.equal(op(x, layer.weight_q, layer.weight_scale, layer.bias, True, a), expected)
                    into = torch.full_like(expected, float("nan"))
                    out_op(x, layer.weight_q, layer.weight_scale, layer.bias, True, a, into)
                    assert torch.equal(into, expected), (n, k, m, "out-variant")
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    got = layer(x)
                torch.cuda.current_stream().wait_stream(stream)
                assert torch.equal(got, expected), (n, k, m, "side stream")
