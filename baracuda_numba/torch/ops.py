"""Every dispatch function as a ``torch.library`` custom op in the ``baracuda`` namespace.

Each op has a fake (meta) implementation giving the output's shape and dtype, so
``torch.compile(model, fullgraph=True)`` traces through it, and runs the project's plan on the
current torch stream (the dispatch functions' default for torch tensors). Ops always return fresh
tensors (no aliasing of inputs), as ``torch.library`` requires. Inputs are made contiguous first.

The fake-quantize ops are one kernel each way (:mod:`baracuda_numba.ops.fake`) and carry autograd
formulas through the project's straight-through backward kernels: ``dx = grad_output * mask`` with the
inclusive mask ``q_min <= round(x * (1/scale)) + zero_point <= q_max`` (what
``torch.fake_quantize_per_tensor_affine`` and ``torch.fake_quantize_per_channel_affine`` differentiate
to); :func:`fake_quantize_with_grad` runs the same kernels without custom-op dispatch in eager mode.
Integer tensors carry no gradient in
PyTorch, so ``quantize_*`` / ``dequantize_*`` are differentiated through their fake-quantize
composition; their backward kernels are exposed as ops of their own.
"""

from __future__ import annotations

import torch

import baracuda_numba as bn

from ..errors import InvalidProblem, problem_message
from ..ops.linear_bound import launch_grouped, launch_remembered, quantized_linear_tensors

NAMESPACE = "baracuda"

__all__ = ["NAMESPACE", "OPS", "quantize_per_tensor", "dequantize_per_tensor", "fake_quantize_per_tensor",
           "quantize_per_channel", "dequantize_per_channel", "fake_quantize_per_channel",
           "quantize_per_token", "dequantize_per_token", "fake_quantize_per_token",
           "quantize_per_group", "dequantize_per_group", "fake_quantize_per_group",
           "dynamic_range_quantize", "quantized_linear", "quantized_linear_out", "smoothquant_linear",
           "fake_quantize_with_grad"]


def _c(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous()


def _like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype if dtype is None else dtype, device=x.device)


def _range(dtype: torch.dtype, q_min: int | None, q_max: int | None) -> tuple[int, int]:
    info = torch.iinfo(dtype)
    return (info.min if q_min is None else q_min), (info.max if q_max is None else q_max)


def _op(name: str):
    return torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=())


# -- per tensor -----------------------------------------------------------------------------------


@_op("quantize_per_tensor")
def quantize_per_tensor(x: torch.Tensor, scale: float, zero_point: int, dtype: torch.dtype,
                        q_min: int | None, q_max: int | None) -> torch.Tensor:
    """``clamp(round(x * (1/scale)) + zero_point, q_min, q_max)`` as ``dtype`` (int8 / uint8)."""
    return bn.quantize_per_tensor(_c(x), scale, zero_point, dtype=dtype, q_min=q_min, q_max=q_max)


@_op("dequantize_per_tensor")
def dequantize_per_tensor(q: torch.Tensor, scale: float, zero_point: int, dtype: torch.dtype) -> torch.Tensor:
    """``(q - zero_point) * scale`` in ``dtype``."""
    return bn.dequantize_per_tensor(_c(q), scale, zero_point, dtype=dtype)


@_op("quantize_per_tensor_backward")
def quantize_per_tensor_backward(grad_output: torch.Tensor, x: torch.Tensor, scale: float, zero_point: int,
                                 dtype: torch.dtype, q_min: int | None, q_max: int | None) -> torch.Tensor:
    """``grad_output * (1/scale) * mask``."""
    return bn.quantize_per_tensor_backward(_c(grad_output), _c(x), scale, zero_point, dtype=dtype, q_min=q_min,
                                           q_max=q_max)


@_op("dequantize_per_tensor_backward")
def dequantize_per_tensor_backward(grad_output: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``grad_output * scale``."""
    return bn.dequantize_per_tensor_backward(_c(grad_output), scale, dtype=dtype)


@_op("fake_quantize_per_tensor")
def fake_quantize_per_tensor(x: torch.Tensor, scale: float, zero_point: int, q_min: int, q_max: int) -> torch.Tensor:
    """``(clamp(round(x * (1/scale)) + zero_point, q_min, q_max) - zero_point) * scale`` in ``x``'s dtype."""
    return bn.fake_quantize(_c(x), scale, zero_point, q_min, q_max)


@_op("fake_quantize_per_tensor_backward")
def fake_quantize_per_tensor_backward(grad_output: torch.Tensor, x: torch.Tensor, scale: float, zero_point: int,
                                      q_min: int, q_max: int) -> torch.Tensor:
    """``grad_output * mask``."""
    return bn.fake_quantize_backward(_c(grad_output), _c(x), scale, zero_point, q_min, q_max)


@quantize_per_tensor.register_fake
def _(x, scale, zero_point, dtype, q_min, q_max):
    return _like(x, dtype)


@dequantize_per_tensor.register_fake
def _(q, scale, zero_point, dtype):
    return _like(q, dtype)


@quantize_per_tensor_backward.register_fake
def _(grad_output, x, scale, zero_point, dtype, q_min, q_max):
    return _like(x)


@dequantize_per_tensor_backward.register_fake
def _(grad_output, scale, dtype):
    return _like(grad_output)


@fake_quantize_per_tensor.register_fake
def _(x, scale, zero_point, q_min, q_max):
    return _like(x)


@fake_quantize_per_tensor_backward.register_fake
def _(grad_output, x, scale, zero_point, q_min, q_max):
    return _like(x)


def _setup_per_tensor(ctx, inputs, output):
    x, scale, zero_point, q_min, q_max = inputs
    ctx.save_for_backward(x)
    ctx.params = (scale, zero_point, q_min, q_max)


def _backward_per_tensor(ctx, grad):
    (x,) = ctx.saved_tensors
    return fake_quantize_per_tensor_backward(grad, x, *ctx.params), None, None, None, None


fake_quantize_per_tensor.register_autograd(_backward_per_tensor, setup_context=_setup_per_tensor)


# -- per channel / token / group --------------------------------------------------------------------
# One definition per family. ``layout`` is the family's layout argument (``axis`` for channels,
# ``group_size`` for groups); per-token ops have none in their schema.

_SCHEMAS = {
    "quantize": "(Tensor x, Tensor scales, Tensor? zero_points, {layout}ScalarType dtype, int? q_min, int? q_max)",
    "dequantize": "(Tensor q, Tensor scales, Tensor? zero_points, {layout}ScalarType dtype)",
    "quantize_backward": "(Tensor grad_output, Tensor x, Tensor scales, Tensor? zero_points, {layout}"
                         "ScalarType dtype, int? q_min, int? q_max)",
    "dequantize_backward": "(Tensor grad_output, Tensor scales, {layout}ScalarType dtype)",
    "fake_quantize": "(Tensor x, Tensor scales, Tensor? zero_points, {layout}int q_min, int q_max)",
    "fake_quantize_backward": "(Tensor grad_output, Tensor x, Tensor scales, Tensor? zero_points, {layout}"
                              "int q_min, int q_max)",
}
# Where the layout argument sits in each op's argument list (after the tensors).
_LAYOUT_INDEX = {"quantize": 3, "dequantize": 3, "quantize_backward": 4, "dequantize_backward": 2,
                 "fake_quantize": 3, "fake_quantize_backward": 4}


def _int_dtype(q_min: int) -> torch.dtype:
    return torch.int8 if q_min < 0 else torch.uint8


# family -> (fake quantize, its straight-through backward): one kernel each (:mod:`baracuda_numba.ops.fake`).
_FAKE = {family: (getattr(bn, f"fake_quantize_per_{family}"), getattr(bn, f"fake_quantize_per_{family}_backward"))
         for family in ("channel", "token", "group")}


def _family_ops(family: str, layout_name: str | None) -> dict:
    """Register quantize / dequantize / their backwards / fake-quantize (+ backward) for one family."""
    quantize_fn = getattr(bn, f"quantize_per_{family}")
    dequantize_fn = getattr(bn, f"dequantize_per_{family}")
    quantize_bw_fn = getattr(bn, f"quantize_per_{family}_backward")
    dequantize_bw_fn = getattr(bn, f"dequantize_per_{family}_backward")

    def lay(layout):
        return () if layout_name is None else (layout,)

    def zp(zero_points):
        return None if zero_points is None else _c(zero_points)

    def quantize(x, scales, zero_points, layout, dtype, q_min, q_max):
        return quantize_fn(_c(x), _c(scales), zp(zero_points), *lay(layout), dtype=dtype, q_min=q_min, q_max=q_max)

    def dequantize(q, scales, zero_points, layout, dtype):
        return dequantize_fn(_c(q), _c(scales), zp(zero_points), *lay(layout), dtype=dtype)

    def quantize_backward(grad_output, x, scales, zero_points, layout, dtype, q_min, q_max):
        return quantize_bw_fn(_c(grad_output), _c(x), _c(scales), zp(zero_points), *lay(layout), dtype=dtype,
                              q_min=q_min, q_max=q_max)

    def dequantize_backward(grad_output, scales, layout, dtype):
        return dequantize_bw_fn(_c(grad_output), _c(scales), *lay(layout), dtype=dtype)

    fake_fn, fake_backward_fn = _FAKE[family]

    def fake_quantize(x, scales, zero_points, layout, q_min, q_max):
        return fake_fn(_c(x), _c(scales), zp(zero_points), *lay(layout), dtype=_int_dtype(q_min), q_min=q_min,
                       q_max=q_max)

    def fake_quantize_backward(grad_output, x, scales, zero_points, layout, q_min, q_max):
        return fake_backward_fn(_c(grad_output), _c(x), _c(scales), zp(zero_points), *lay(layout),
                                dtype=_int_dtype(q_min), q_min=q_min, q_max=q_max)

    fakes = {
        "quantize": lambda x, s, z, lay_, d, lo, hi: _like(x, d),
        "dequantize": lambda q, s, z, lay_, d: _like(q, d),
        "quantize_backward": lambda g, x, s, z, lay_, d, lo, hi: _like(x),
        "dequantize_backward": lambda g, s, lay_, d: _like(g),
        "fake_quantize": lambda x, s, z, lay_, lo, hi: _like(x),
        "fake_quantize_backward": lambda g, x, s, z, lay_, lo, hi: _like(x),
    }
    impls = {"quantize": quantize, "dequantize": dequantize, "quantize_backward": quantize_backward,
             "dequantize_backward": dequantize_backward, "fake_quantize": fake_quantize,
             "fake_quantize_backward": fake_quantize_backward}
    ops = {}
    for name, impl in impls.items():
        qualified = f"{NAMESPACE}::{name.replace('quantize', f'quantize_per_{family}', 1)}"
        schema = _SCHEMAS[name].format(layout=f"int {layout_name}, " if layout_name else "") + " -> Tensor"
        ops[name] = torch.library.custom_op(qualified, _with_layout(impl, name, layout_name), mutates_args=(),
                                            schema=schema)
        ops[name].register_fake(_with_layout(fakes[name], name, layout_name))

    backward_op = ops["fake_quantize_backward"]

    def setup(ctx, inputs, output):
        x, scales, zero_points, *rest = inputs
        ctx.save_for_backward(x, scales, zero_points)
        ctx.rest = rest

    def backward(ctx, grad):
        x, scales, zero_points = ctx.saved_tensors
        return (backward_op(grad, x, scales, zero_points, *ctx.rest), None, None, *([None] * len(ctx.rest)))

    ops["fake_quantize"].register_autograd(backward, setup_context=setup)
    return ops


def _with_layout(fn, name: str, layout_name: str | None):
    """``fn`` as called by its schema: per-token schemas lack the layout argument, passed as None."""
    if layout_name is not None:
        return fn
    index = _LAYOUT_INDEX[name]
    return lambda *args: fn(*args[:index], None, *args[index:])


_CHANNEL = _family_ops("channel", "axis")
_TOKEN = _family_ops("token", None)
_GROUP = _family_ops("group", "group_size")

_FAMILIES = {"channel": _CHANNEL, "token": _TOKEN, "group": _GROUP}

quantize_per_channel = _CHANNEL["quantize"]
dequantize_per_channel = _CHANNEL["dequantize"]
fake_quantize_per_channel = _CHANNEL["fake_quantize"]
quantize_per_token = _TOKEN["quantize"]
dequantize_per_token = _TOKEN["dequantize"]
fake_quantize_per_token = _TOKEN["fake_quantize"]
quantize_per_group = _GROUP["quantize"]
dequantize_per_group = _GROUP["dequantize"]
fake_quantize_per_group = _GROUP["fake_quantize"]


class _EagerFakeQuantize(torch.autograd.Function):
    """The fake-quantize kernels of one family with their straight-through backward, called without
    custom-op dispatch (what :func:`fake_quantize_with_grad` runs outside ``torch.compile``); ``flat``: the whole
    tensor as the one channel of ``[1, numel]``, reshaped inside (no view nodes in the graph)."""

    @staticmethod
    def forward(ctx, x, scales, zero_points, family, layout, q_min, q_max, flat):
        shape = tuple(x.shape)  # a tuple: view() parses a torch.Size about 1 us slower
        x, scales = _c(x), _c(scales)
        if flat:
            x = x.reshape(1, -1)
        zero_points = None if zero_points is None else _c(zero_points)
        ctx.save_for_backward(x, scales, zero_points)
        ctx.params = (family, layout, q_min, q_max, shape if flat else None)
        layout_args = () if family == "token" else (layout,)
        y = _FAKE[family][0](x, scales, zero_points, *layout_args, dtype=_int_dtype(q_min), q_min=q_min, q_max=q_max)
        # detached: a view made inside a Function could not be modified in place, and this output may be
        return y.view(shape).detach() if flat else y

    @staticmethod
    def backward(ctx, grad):
        x, scales, zero_points = ctx.saved_tensors
        family, layout, q_min, q_max, shape = ctx.params
        layout_args = () if family == "token" else (layout,)
        grad = _c(grad) if shape is None else _c(grad).reshape(1, -1)
        dx = _FAKE[family][1](grad, x, scales, zero_points, *layout_args, dtype=_int_dtype(q_min), q_min=q_min,
                              q_max=q_max)
        return (dx if shape is None else dx.view(shape)), None, None, None, None, None, None, None


def fake_quantize_with_grad(family: str, x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                            layout: int | None, q_min: int, q_max: int) -> torch.Tensor:
    """``baracuda::fake_quantize_per_<family>`` (``family``: ``"channel"``, ``"token"`` or ``"group"``;
    ``layout``: the axis, None or the group size) with its straight-through gradient.

    While ``torch.compile`` traces, the custom op (opaque to the graph, with its fake implementation);
    in eager mode the same two kernels through a ``torch.autograd.Function``, which skips the custom-op
    dispatch: with torch 2.13 a forward and backward through an empty custom op with autograd took 140 us
    of host time against 52 us through an ``autograd.Function`` (CPU tensors). Same bits either way
    (``tests/test_torch_ops.py::test_eager_function_and_custom_op_give_the_same_bits``).
    """
    if torch.compiler.is_compiling():
        op = _FAMILIES[family]["fake_quantize"]
        return op(x, scales, zero_points, q_min, q_max) if family == "token" else op(x, scales, zero_points, layout,
                                                                                     q_min, q_max)
    return _EagerFakeQuantize.apply(x, scales, zero_points, family, layout, q_min, q_max, False)


def fake_quantize_tensor_with_grad(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, q_min: int,
                                   q_max: int) -> torch.Tensor:
    """Per-tensor fake quantize with one scale and zero point in tensors (``[1]``), with its straight-through
    gradient: the per-channel kernels on ``x`` as the one channel of ``[1, numel]``. A tensor scale keeps
    ``torch.compile`` from specialising on (and recompiling for) every new scale value. In eager mode the
    reshapes happen inside the ``torch.autograd.Function``, so the autograd graph holds no view nodes around it
    (``docs/performance.md``, "The PyTorch layer on a model", says what that is worth)."""
    if torch.compiler.is_compiling():
        return _CHANNEL["fake_quantize"](x.reshape(1, -1), scale, zero_point, 0, q_min, q_max).reshape(x.shape)
    return _EagerFakeQuantize.apply(x, scale, zero_point, "channel", 0, q_min, q_max, True)


# -- dynamic range, linear --------------------------------------------------------------------------


def _scale_shape(shape, scope, axis, group_size):
    if scope == "tensor":
        return ()
    if scope == "channel":
        return (shape[axis],)
    if scope == "token":
        return tuple(shape[:-1])
    if scope == "group":
        return (*shape[:-1], shape[-1] // group_size)
    raise InvalidProblem(problem_message("baracuda::dynamic_range_quantize", "scope",
                                         "'tensor', 'channel', 'token' or 'group'", repr(scope)))


@_op("dynamic_range_quantize")
def dynamic_range_quantize(x: torch.Tensor, symmetric: bool, scope: str, dtype: torch.dtype, axis: int | None,
                           group_size: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, scale, zero_point)``: scales (and zero points) from ``x``'s own range, then quantize.

    ``zero_point`` is always an int32 tensor of the scales' shape (the symmetric one filled with its
    constant), so the op has one signature.
    """
    result = bn.dynamic_range_quantize(_c(x), mode="symmetric" if symmetric else "asymmetric", scope=scope,
                                       dtype=dtype, axis=axis, group_size=group_size)
    zero_point = result.zero_point
    if not isinstance(zero_point, torch.Tensor):
        zero_point = torch.full(result.scale.shape, zero_point or 0, dtype=torch.int32, device=x.device)
    return result.q, result.scale, zero_point


@dynamic_range_quantize.register_fake
def _(x, symmetric, scope, dtype, axis, group_size):
    shape = _scale_shape(x.shape, scope, axis, group_size)
    scale_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (_like(x, dtype), x.new_empty(shape, dtype=scale_dtype), x.new_empty(shape, dtype=torch.int32))


# The W8A8 linear ops are defined on a library of their own, their implementations registered for the CUDA and CPU
# dispatch keys: under torch.compile every layer call goes through an op, and a ``torch.library.custom_op`` adds its
# Python autograd and aliasing wrappers to each call (13 us against 3 us for the dispatch alone, torch 2.13 on a CPU
# host). They have no autograd formula: an input that requires grad gets none back, as before. The layer calls the
# out-variant under torch.compile: Inductor allocates (or reuses) the output buffer in its own wrapper code, and the
# implementation only launches (``docs/design-linear.md``, "The launch path").
_LINEAR = torch.library.Library(NAMESPACE, "FRAGMENT")
_LINEAR.define("quantized_linear(Tensor x, Tensor weight_q, Tensor weight_scale, Tensor? bias, "
               "bool static_weight=False, float? act_scale=None) -> Tensor")
_LINEAR.define("quantized_linear_out(Tensor x, Tensor weight_q, Tensor weight_scale, Tensor? bias, "
               "bool static_weight, float? act_scale, Tensor(a!) out) -> ()")
_LINEAR.define("quantized_linear_group_out(Tensor x, Tensor[] weights_q, Tensor[] weight_scales, Tensor[] biases, "
               "bool static_weight, float? act_scale, Tensor(a!) out) -> ()")
_LINEAR.define("smoothquant_linear(Tensor act_q, Tensor weight_q, Tensor weight_scale, float act_scale, Tensor? bias, "
               "ScalarType dtype, bool static_weight=False) -> Tensor")


def _linear_into(x: torch.Tensor, weight_q: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 static_weight: bool, act_scale: float | None, out: torch.Tensor | None) -> torch.Tensor:
    if not (x.requires_grad and torch.is_grad_enabled()):  # a remembered launch takes contiguous operands only
        result = launch_remembered(x, weight_q, weight_scale, bias, static_weight, act_scale, out)
        if result is not None:
            return result
    with torch.no_grad():  # no autograd formula: the kernels see data
        return quantized_linear_tensors(_c(x), _c(weight_q), _c(weight_scale), None if bias is None else _c(bias),
                                        static_weight, act_scale, out)


def _quantized_linear(x: torch.Tensor, weight_q: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                      static_weight: bool = False, act_scale: float | None = None) -> torch.Tensor:
    return _linear_into(x, weight_q, weight_scale, bias, static_weight, act_scale, None)


def _quantized_linear_out(x: torch.Tensor, weight_q: torch.Tensor, weight_scale: torch.Tensor,
                          bias: torch.Tensor | None, static_weight: bool, act_scale: float | None,
                          out: torch.Tensor) -> None:
    _linear_into(x, weight_q, weight_scale, bias, static_weight, act_scale, out)


def _quantized_linear_group_out(x: torch.Tensor, weights_q: list[torch.Tensor], weight_scales: list[torch.Tensor],
                                biases: list[torch.Tensor], static_weight: bool, act_scale: float | None,
                                out: torch.Tensor) -> None:
    if (weights_q and len(weight_scales) == len(weights_q) and not (x.requires_grad and torch.is_grad_enabled())
            and launch_grouped(x, weights_q, weight_scales, biases or None, static_weight, act_scale, out)
            is not None):
        return
    _check_group_operands(x, weights_q, weight_scales, biases, out)
    start = 0  # not end to end, or a call the group's launch does not take: each layer into its columns
    for i, weight_q in enumerate(weights_q):
        end = start + weight_q.shape[0]
        out[..., start:end] = _linear_into(x, weight_q, weight_scales[i], biases[i] if biases else None,
                                           static_weight, act_scale, None)
        start = end


def _check_group_operands(x: torch.Tensor, weights_q: list[torch.Tensor], weight_scales: list[torch.Tensor],
                          biases: list[torch.Tensor], out: torch.Tensor) -> None:
    """Raise :class:`InvalidProblem` naming the first list or ``out`` that does not fit the others (each layer's
    own operands are checked by its call)."""
    where = "quantized_linear_group_out"
    count = len(weights_q)
    checks = [
        ("weights_q", count >= 1 and all(w.dim() == 2 for w in weights_q), "one or more [N_i, K] weights",
         [tuple(w.shape) for w in weights_q]),
        ("weight_scales", len(weight_scales) == count, f"{count} scale vectors, one per weight", len(weight_scales)),
        ("biases", len(biases) in (0, count), f"none or {count}, one per weight", len(biases)),
    ]
    for argument, ok, expected, given in checks:
        if not ok:
            raise InvalidProblem(problem_message(where, argument, expected, given))
    shape = (*x.shape[:-1], sum(w.shape[0] for w in weights_q))
    if tuple(out.shape) != shape or out.dtype != x.dtype:
        raise InvalidProblem(problem_message(where, "out", f"{list(shape)} {x.dtype}",
                                             f"{list(out.shape)} {out.dtype}"))


def _smoothquant_linear(act_q: torch.Tensor, weight_q: torch.Tensor, weight_scale: torch.Tensor, act_scale: float,
                        bias: torch.Tensor | None, dtype: torch.dtype, static_weight: bool = False) -> torch.Tensor:
    with torch.no_grad():
        return bn.smoothquant_linear(_c(act_q), _c(weight_q), _c(weight_scale), act_scale,
                                     bias=None if bias is None else _c(bias), dtype=dtype, static_weight=static_weight)


for _key in ("CUDA", "CPU"):
    _LINEAR.impl("quantized_linear", _quantized_linear, _key)
    _LINEAR.impl("quantized_linear_out", _quantized_linear_out, _key)
    _LINEAR.impl("quantized_linear_group_out", _quantized_linear_group_out, _key)
    _LINEAR.impl("smoothquant_linear", _smoothquant_linear, _key)


@torch.library.register_fake(f"{NAMESPACE}::quantized_linear", lib=_LINEAR)
def _(x, weight_q, weight_scale, bias, static_weight=False, act_scale=None):
    return x.new_empty((*x.shape[:-1], weight_q.shape[0]))


@torch.library.register_fake(f"{NAMESPACE}::quantized_linear_out", lib=_LINEAR)
def _(x, weight_q, weight_scale, bias, static_weight, act_scale, out):
    return None


@torch.library.register_fake(f"{NAMESPACE}::quantized_linear_group_out", lib=_LINEAR)
def _(x, weights_q, weight_scales, biases, static_weight, act_scale, out):
    return None


@torch.library.register_fake(f"{NAMESPACE}::smoothquant_linear", lib=_LINEAR)
def _(act_q, weight_q, weight_scale, act_scale, bias, dtype, static_weight=False):
    return act_q.new_empty((*act_q.shape[:-1], weight_q.shape[0]), dtype=dtype)


quantized_linear = torch.ops.baracuda.quantized_linear.default
"""``baracuda::quantized_linear(x, weight_q, weight_scale, bias, static_weight=False, act_scale=None)``: W8A8 linear,
activations quantized per token in the call (or with the static per-tensor ``act_scale``): ``[..., K] -> [..., N]``
in ``x``'s dtype (see :func:`baracuda_numba.quantized_linear`)."""

quantized_linear_out = torch.ops.baracuda.quantized_linear_out.default
"""``baracuda::quantized_linear_out(x, weight_q, weight_scale, bias, static_weight, act_scale, out)``:
:data:`quantized_linear` written into ``out`` (``[..., N]`` in ``x``'s dtype), what the PyTorch layer calls under
``torch.compile``."""

quantized_linear_group_out = torch.ops.baracuda.quantized_linear_group_out.default
"""``baracuda::quantized_linear_group_out(x, weights_q, weight_scales, biases, static_weight, act_scale, out)``: the
W8A8 linear of several layers at once into ``out`` ``[..., N_1 + ... + N_g]`` (layer ``i`` in its columns), one GEMM
where their tensors lie end to end in memory
(:func:`~baracuda_numba.ops.linear_bound.launch_grouped`), else one per layer; what a projection group
(:mod:`baracuda_numba.torch.groups`) calls under ``torch.compile``. ``biases``: empty for none."""

smoothquant_linear = torch.ops.baracuda.smoothquant_linear.default
"""``baracuda::smoothquant_linear(act_q, weight_q, weight_scale, act_scale, bias, dtype, static_weight=False)``: W8A8
linear on int8 activations quantized with the static per-tensor ``act_scale`` (see
:func:`baracuda_numba.smoothquant_linear`)."""


OPS = {name: getattr(torch.ops.baracuda, name) for name in (
    "quantize_per_tensor", "dequantize_per_tensor", "quantize_per_tensor_backward",
    "dequantize_per_tensor_backward", "fake_quantize_per_tensor", "fake_quantize_per_tensor_backward",
    *(f"{op}_per_{family}{suffix}" for family in ("channel", "token", "group")
      for op, suffix in (("quantize", ""), ("dequantize", ""), ("quantize", "_backward"),
                         ("dequantize", "_backward"), ("fake_quantize", ""), ("fake_quantize", "_backward"))),
    "dynamic_range_quantize", "quantized_linear", "quantized_linear_out", "quantized_linear_group_out",
    "smoothquant_linear")}
"""Every registered op by name: ``torch.ops.baracuda.<name>``."""

