"""The W8A8 plans' one fast launch path (``docs/design-linear.md``, "The launch path") on a machine without a
GPU: the plans rebuilt for the GPU launch path over a recording libcuda stand-in, whose launches give the
parameter bytes, grids, streams and programmatic-dependent flags that reach the driver."""

from __future__ import annotations

import sys

import pytest
from linear_helpers import forced
from recording_driver import recording_driver

import baracuda_numba as bn


def _gpu_linear_plan(monkeypatch, plan):
    """``plan`` rebuilt for the GPU launch path with a recording libcuda stand-in (no GPU needed)."""
    from baracuda_numba import arrays, launch
    from baracuda_numba.plans import base
    from baracuda_numba.plans import dynamic as dynamic_plans
    from baracuda_numba.plans.linear import fast, quantized
    from baracuda_numba.plans.linear import plan as plan_module

    for module in (arrays, launch, base, dynamic_plans, fast, plan_module, quantized):
        monkeypatch.setattr(module, "SIMULATOR", False)

    def gpu_launcher(old, function):
        launcher = launch.KernelLauncher(old._compile, old._n_arrays, old._scalar_types, old._shared_bytes,
                                         old.dependent)
        launcher._functions[0] = function  # compiled and loaded: the hot path
        return launcher

    for i, name in enumerate(list(plan._launchers)):
        plan._launchers[name] = gpu_launcher(plan._launchers[name], 0xF00 + i)
    quantizer = getattr(plan, "_quantizer", None)
    if quantizer is not None:
        for name in ("segment", "segment_dependent"):  # the plain / always-dependent launches of one kernel
            quantizer._launchers[name] = gpu_launcher(quantizer._launchers[name], 0xE00)
        quantizer._install_segment_template()
    if getattr(plan, "_static_quantizer", None) is not None:
        plan._static_quantizer = gpu_launcher(plan._static_quantizer, 0xD00)
    plan._install_fast_template()
    driver = recording_driver()
    monkeypatch.setattr(launch, "_driver", lambda: driver)
    monkeypatch.setattr(launch, "_torch_stream_getter", lambda: (lambda device_id: 0x77))
    return driver


def _torch_operand(element, shape, ptr, contiguous=True):
    return bn.arrays.Operand(None, "torch", element, shape, ptr, contiguous)


@pytest.mark.parametrize("case", ["fused_bf16_bias", "fused_f64", "two_launch_skinny", "two_launch_pipelined_f16",
                                  "smoothquant_skinny", "smoothquant_pipelined"])
def test_fast_path_launches_what_the_checked_path_launches(case):
    """The fast path (pointers patched into pre-packed blocks) hands the driver the bytes and grid of the checked
    path, launch by launch; it declines misaligned, strided and wrongly typed operands."""
    pytest.importorskip("torch")  # operands adapted from torch tensors: the fast path is built once torch is imported
    E = bn.ElementKind
    m, n, k = {"smoothquant_pipelined": (300, 264, 512), "two_launch_skinny": (32, 4096, 4096),
               "two_launch_pipelined_f16": (300, 264, 512), "smoothquant_skinny": (16, 4096, 4096)}.get(case,
                                                                                                       (1, 4096, 4096))
    bias = case in ("fused_bf16_bias", "smoothquant_pipelined", "two_launch_skinny")
    launches = 2 if case.startswith("two_launch") else 1
    if not case.startswith("smoothquant"):
        element = {"fused_f64": E.F64, "two_launch_pipelined_f16": E.F16}.get(case, E.BF16)
        desc = bn.QuantizedLinearDescriptor(m, n, k, element, element, bias)
        plan = bn.QuantizedLinearPlan.select(desc, tuning=forced("fused" if case.startswith("fused") else "two"))
        assert plan.spec.fused is case.startswith("fused")
        fields = {"input": (element, (m, k), 0x100000), "output": (element, (m, n), 0x600000)}
        workspace = _torch_operand(E.U8, (plan.workspace_size(),), 0x7000000)
        make = lambda ops: bn.QuantizedLinearArgs(**ops)  # noqa: E731
        run = lambda args: plan.run(args, workspace=workspace)  # noqa: E731
        checked = lambda args: plan.run(args, workspace=workspace, stream=0x77)  # noqa: E731
    else:
        plan = bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(m, n, k, "bf16", bias))
        fields = {"input": (E.S8, (m, k), 0x100000), "output": (E.BF16, (m, n), 0x600000)}
        make = lambda ops: bn.SmoothQuantLinearArgs(**ops, act_scale=0.0125)  # noqa: E731
        run = plan.run
        checked = lambda args: plan.run(args, stream=0x77)  # noqa: E731
    fields |= {"weight": (E.S8, (n, k), 0x200000), "weight_scale": (E.F32, (n,), 0x300000)}
    if bias:
        fields["bias"] = (E.F32, (n,), 0x400000)
    with pytest.MonkeyPatch.context() as monkeypatch:
        driver = _gpu_linear_plan(monkeypatch, plan)
        ops = {f: _torch_operand(e, shape, ptr) for f, (e, shape, ptr) in fields.items()}
        args = make(ops)
        assert plan._fast_pointers(args) is not None
        run(args)  # fast path
        checked(args)
        run(make(ops | {"weight": _torch_operand(E.S8, (n, k), 0x200000 + 0x40)}))  # another weight, fast
        checked(make(ops | {"weight": _torch_operand(E.S8, (n, k), 0x200000 + 0x40)}))
        # the fast path declines what the checked path must look at
        element, shape, ptr = fields["input"]
        for bad in (_torch_operand(element, shape, ptr + 8),  # misaligned
                    _torch_operand(element, shape, ptr, contiguous=False),
                    _torch_operand(E.F16 if element is not E.F16 else E.F32, shape, ptr)):  # wrong dtype
            assert plan._fast_pointers(make(ops | {"input": bad})) is None
        assert plan._fast_pointers(make(ops | {"weight_scale": _torch_operand(E.F64, (n,), 0x300000)})) is None
        if case.startswith("two_launch"):  # no workspace: the plan's own for the current stream
            asked = []
            monkeypatch.setattr(plan, "_stream_workspace", lambda device, stream: asked.append((device, stream))
                                or 0x7000000)
            before = len(driver.calls)
            plan.run(args)
            assert asked == [(0, 0x77)] and driver.calls[before:] == driver.calls[:launches]
            del driver.calls[before:], driver.dependent[before:]
    calls = driver.calls
    assert len(calls) == 4 * launches
    fast, checked_calls, fast_again, checked_again = (calls[i: i + launches] for i in range(0, 4 * launches, launches))
    assert fast == checked_calls and fast_again == checked_again and fast[-1] != fast_again[-1]
    assert all(config[8] == 0x77 for config, _ in calls)
    # the skinny GEMM after the quantizer, SmoothQuant's and the fused kernel after whatever kernel, start as
    # programmatic dependents, fast path or not; so does the quantizer of up to 64 rows
    from baracuda_numba.plans import tuning as memory_tuning

    assert memory_tuning.current_tuning().dynamic.dependent_segments_max >= 32
    expected = {"two_launch_skinny": [True, True] * 4, "smoothquant_skinny": [True] * 4, "fused_bf16_bias": [True] * 4,
                "fused_f64": [True] * 4}.get(case, [False] * len(calls))
    assert driver.dependent == expected


def test_a_plan_run_before_torch_is_imported_takes_the_checked_launch(monkeypatch):
    """A W8A8 plan run on a GPU before PyTorch is imported (NumPy, CuPy or numba operands) has no fast path (its
    entries take torch tensors and launch on PyTorch's stream): the checked path launches on the operands' stream,
    and the fast path is built once torch is imported. Before, such a first call raised ``KeyError: 'torch'``
    (notebooks/05 on a GPU)."""
    from baracuda_numba import launch

    E = bn.ElementKind
    plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(1, 4096, 4096, E.BF16, E.BF16),
                                         tuning=forced("fused"))
    uncached = launch._torch_stream_getter.__wrapped__  # as in a fresh process that never imported torch
    driver = _gpu_linear_plan(monkeypatch, plan)
    monkeypatch.setattr(launch, "_torch_stream_getter", uncached)
    torch_module = sys.modules.get("torch")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    fields = {"input": (E.BF16, (1, 4096), 0x100000), "weight": (E.S8, (4096, 4096), 0x200000),
              "weight_scale": (E.F32, (4096,), 0x300000), "output": (E.BF16, (1, 4096), 0x600000)}
    args = bn.QuantizedLinearArgs(**{f: bn.arrays.Operand(None, "numba", e, shape, ptr, True)
                                     for f, (e, shape, ptr) in fields.items()})
    plan.run(args)
    assert len(driver.calls) == 1 and driver.calls[0][0][8] == 0  # the legacy default stream of numba operands
    assert plan._fast_path() is None and not plan._fast_built
    if torch_module is not None:
        monkeypatch.setitem(sys.modules, "torch", torch_module)
        assert plan._fast_path() is not None and plan._fast_built


@pytest.mark.parametrize(("variant", "m", "n", "k", "bias", "dtype"), [
    ("two_launch", 16, 4096, 4096, False, "bfloat16"), ("two_launch", 5, 264, 8192, True, "float16"),
    ("two_launch", 3, 40, 144, False, "float32"), ("fused", 1, 4096, 4096, True, "bfloat16"),
    ("fused", 2, 264, 8192, False, "float64"), ("static_activation", 1, 4096, 4096, False, "float16"),
    ("static_two_launch", 16, 4096, 4096, True, "bfloat16"), ("static_two_launch", 3, 40, 144, False, "float32"),
    ("smoothquant", 16, 4096, 4096, True, "bfloat16")])
def test_tensors_and_operands_take_the_one_fast_launch(variant, m, n, k, bias, dtype):
    """``torch.Tensor`` operands (``plan.run``'s flattened checks: CPU tensors posing as CUDA ones here), operands
    adapted from tensors (what the op functions pass on a first call) and ``run_trusted`` (their remembered calls)
    end in the one fast launch: the same bytes, grids and order at the same pointers, the two launches through the
    LaunchPair first and one compiled call after (``_launch_jit.linear_pair_launch``), or the one kernel. The tensor
    path declines, launching nothing, every operand the checked path must look at, and a fused call being captured
    where the two launches are the faster on the GPU."""
    torch = pytest.importorskip("torch")
    from baracuda_numba.plans.linear import fast

    E = bn.ElementKind
    tdtype = getattr(torch, dtype)
    static = variant.startswith("static")
    smoothquant = variant == "smoothquant"
    if smoothquant:
        plan = bn.SmoothQuantLinearPlan.select(bn.SmoothQuantLinearDescriptor(m, n, k, dtype, bias))
        launches, x_dtype, Args = 1, torch.int8, bn.SmoothQuantLinearArgs
    else:
        two_launch = variant in ("two_launch", "static_two_launch")
        plan = bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, n, k, dtype, dtype, bias,
                                                                          static_activation=static),
                                             tuning=forced("two" if two_launch else "fused"))
        assert plan.spec.fused is not two_launch
        launches, x_dtype, Args = 1 if plan.spec.fused else 2, tdtype, bn.QuantizedLinearArgs
    with pytest.MonkeyPatch.context() as monkeypatch:
        driver = _gpu_linear_plan(monkeypatch, plan)
        # a tensor's device: `fake_device` (CUDA 0 unless set; -1: the CPU)
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: getattr(t, "fake_device", 0) >= 0))
        monkeypatch.setattr(torch.Tensor, "get_device", lambda t: getattr(t, "fake_device", 0))
        x, w = torch.empty(m, k, dtype=x_dtype), torch.empty(n, k, dtype=torch.int8)
        scales, out = torch.empty(n), torch.empty(m, n, dtype=tdtype)
        b = torch.empty(n) if bias else None
        workspace = torch.empty(plan.workspace_size() + 16, dtype=torch.uint8)
        own = torch.empty(max(plan.workspace_size(), 16), dtype=torch.uint8)  # the plan's own for the stream
        monkeypatch.setattr(plan, "_stream_workspace", lambda device, stream: own.data_ptr())
        act_scale = 0.0237 if static or smoothquant else None

        def make(scale=act_scale, **change):
            return Args(act_scale=scale, **({"input": x, "weight": w, "weight_scale": scales, "output": out,
                                             "bias": b} | change))

        args = make()
        given = None if smoothquant else workspace
        plan.run(args, workspace=given)  # the first call launches through LaunchPair, loading the kernels
        assert plan.run_trusted(args, 0)
        plan.run(args, workspace=given)  # then one compiled call
        assert len(driver.calls) == 3 * launches
        if launches == 2:
            assert driver.dependent[1::2] == [True] * 3  # the GEMM as the quantizer's programmatic dependent
        tensors, dependent = list(driver.calls), list(driver.dependent)
        driver.calls[:], driver.dependent[:] = [], []
        # operands adapted from tensors at the same pointers
        elements = {"input": E.S8 if smoothquant else bn.element_kind(dtype), "weight": E.S8, "weight_scale": E.F32,
                    "output": bn.element_kind(dtype), "bias": E.F32}
        ops = {f: _torch_operand(elements[f], tuple(t.shape), t.data_ptr())
               for f, t in (("input", x), ("weight", w), ("weight_scale", scales), ("output", out), ("bias", b))
               if t is not None}
        for ws in (given, None, given):
            ws_op = None if ws is None else _torch_operand(E.U8, (ws.numel(),), ws.data_ptr())
            plan.run(Args(**ops, act_scale=act_scale), workspace=ws_op)
        assert tensors == driver.calls and dependent == driver.dependent
        assert [config[8] for config, _ in tensors] == [0x77] * 3 * launches
        if launches == 2:
            assert tensors[0][1] != tensors[1][1]  # the quantizer, then the GEMM
        path = plan._fast_path()
        driver.calls.clear()

        def other(tensor, **set_):
            for name, value in set_.items():
                setattr(tensor, name, value)
            return tensor

        declined = [
            {"input": torch.empty(m * k + 1, dtype=x_dtype)[1:].view(m, k)},  # misaligned
            {"input": torch.empty(m, 2 * k, dtype=x_dtype)[:, ::2]},  # strided
            {"input": x.to(torch.float16 if x_dtype != torch.float16 else torch.float32)},  # another dtype
            {"input": other(torch.empty(m, k, dtype=x_dtype), fake_device=-1)},  # on the CPU
            {"weight": torch.empty(n, k + 16, dtype=torch.int8)},  # another size
            {"weight": torch.nn.Parameter(w, requires_grad=False)},  # a subclass
            {"weight_scale": scales.double()},
            {"output": other(torch.empty(m, n, dtype=tdtype), fake_device=1)},  # another device
            {"bias": None if bias else torch.empty(n)},
        ]
        for change in declined:
            assert not path.checked(make(**change), given), change
        if not static and not smoothquant:  # a scale given to a plan without a static one: the checked path raises
            assert not path.checked(make(0.5), given) and not path.trusted(make(0.5), 0)
        if not smoothquant:
            for ws in (torch.empty(plan.workspace_size() - 1, dtype=torch.uint8), workspace[1:],
                       other(torch.empty(plan.workspace_size(), dtype=torch.uint8), fake_device=1), own.numpy()):
                assert not path.checked(args, ws)
        assert not path.trusted(make(**declined[0]), 0)
        if static or smoothquant:  # a bad scale raises what the checked path raises
            with pytest.raises(bn.InvalidProblem, match="act_scale"):
                path.checked(make(float("inf")), given)
        if plan.spec.capture_unfused:  # under capture the fused plan declines (the checked path launches two kernels)
            monkeypatch.setattr(fast, "capturing", lambda stream: True)
            assert not path.checked(args, given) and not path.trusted(args, 0)
        assert driver.calls == []


def test_capture_query_is_skipped_on_the_legacy_default_stream(monkeypatch):
    """Eager calls on the legacy default stream (which no graph can capture) never ask whether a capture
    is under way (a runtime call per launch); other streams ask PyTorch."""
    pytest.importorskip("torch")
    from baracuda_numba.plans.linear import fast

    asked = []
    monkeypatch.setattr(fast, "_capture_query", lambda t: lambda: asked.append(1) or True)
    assert not fast.capturing(0) and not asked
    assert fast.capturing(0x7F00) and asked == [1]
    monkeypatch.delitem(sys.modules, "torch")
    assert not fast.capturing(0x7F00) and asked == [1]


def test_eager_calls_share_their_streams_driver_buffer_and_captured_calls_keep_no_torch_memory():
    """Where a W8A8 call's scratch memory comes from (``docs/design-linear.md``, "Graph capture"): eager calls on a
    stream take that stream's buffer of :mod:`baracuda_numba.workspace` (driver memory, one for every plan on the
    stream, never torch's caching allocator, whose blocks a warm-up under ``torch.compile(mode="reduce-overhead")``
    puts in the graph's pool); a call being captured takes bytes of torch's allocator (the graph's pool) and keeps
    no reference to them once it returns. The launches read the pointer of the buffer each was given."""
    import gc
    import struct
    import weakref

    torch = pytest.importorskip("torch")
    from test_workspace import Memory

    from baracuda_numba.plans.linear import quantized
    from baracuda_numba.workspace import StreamWorkspaces

    plans = [bn.QuantizedLinearPlan.select(bn.QuantizedLinearDescriptor(m, 4096, 4096, "bf16", "bf16", False, True),
                                           tuning=forced("two")) for m in (16, 4)]
    memory = Memory()
    workspaces = StreamWorkspaces(memory.memory())
    with pytest.MonkeyPatch.context() as monkeypatch:
        for plan in plans:
            driver = _gpu_linear_plan(monkeypatch, plan)
        monkeypatch.setattr(quantized, "stream_workspaces", lambda: workspaces)
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
        monkeypatch.setattr(torch.Tensor, "get_device", lambda t: 0)
        w, scales = torch.empty(4096, 4096, dtype=torch.int8), torch.empty(4096)
        args = [bn.QuantizedLinearArgs(torch.empty(m, 4096, dtype=torch.bfloat16), w, scales,
                                       torch.empty(m, 4096, dtype=torch.bfloat16)) for m in (16, 4)]

        def launched_with(pointer):
            return [struct.pack("<Q", pointer) in params for _, params in driver.calls]

        for _ in range(2):
            for plan, a in zip(plans, args, strict=True):
                plan.run(a)
        assert [e[0] for e in memory.events] == ["allocate"]  # one buffer, for the stream, both plans on it
        buffer = memory.events[0][2]
        assert all(launched_with(buffer)) and len(driver.calls) == 8
        assert workspaces.held() == {(0, 0x77): 128 * 1024}

        driver.calls.clear()
        kept = []
        real_empty = torch.empty

        def graph_pool_bytes(*shape, **kwargs):  # the bytes a capture takes from torch's allocator
            kwargs.pop("device")
            tensor = real_empty(*shape, **kwargs)
            kept.append(weakref.ref(tensor))
            return tensor

        monkeypatch.setattr(quantized, "capturing", lambda stream: True)
        monkeypatch.setattr(torch, "empty", graph_pool_bytes)
        plans[0].run(args[0])
        gc.collect()
        assert len(kept) == 1 and kept[0]() is None  # nothing of the graph's pool outlives the call
        assert len(driver.calls) == 2 and not any(launched_with(buffer))
        assert [e[0] for e in memory.events] == ["allocate"]  # the stream's buffer untouched
