"""Quantization modules: :class:`FakeQuantize` for QAT and :class:`W8A8Linear` for int8 inference."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from ..errors import InvalidProblem, problem_message
from ..kernels.observer import ObserverConfig
from ..ops.linear_bound import BoundQuantizedLinear, bind_quantized_linear
from . import ops as _ops  # registers torch.ops.baracuda
from .observer import RANGE_DTYPES, ObserverUpdate


def true_quotient(values: torch.Tensor, divisor: float) -> torch.Tensor:
    """``values / divisor`` rounded once, on any device: PyTorch's CUDA kernels divide by a Python number as a
    multiplication by its rounded reciprocal, which differs from the quotient in the last bit for some values
    (``tests/test_torch_emulate.py::test_scales_are_true_quotients_on_every_device``), so the divisor is a tensor
    on ``values``' device."""
    return values / torch.full((), divisor, dtype=values.dtype, device=values.device)

__all__ = ["FakeQuantize", "W8A8Linear", "StateDictMismatch", "w8a8_state_dict_spec", "check_w8a8_scales",
           "check_w8a8_entries"]

_baracuda = torch.ops.baracuda
_RANGES = {torch.int8: (-128, 127), torch.uint8: (0, 255)}


def _check(where: str, argument: str, ok: bool, expected: str, given) -> None:
    if not ok:
        raise InvalidProblem(problem_message(where, argument, expected, given))


class FakeQuantize(nn.Module):
    """Quantize-dequantize in the forward pass with an observer, as ``torch.ao.quantization.FakeQuantize``.

    While the observer is enabled (and the module is training), each forward folds ``x``'s range into
    ``min_val`` / ``max_val`` (``observer="minmax"``: running min / max; ``"moving_average"``:
    ``v += averaging_constant * (batch_v - v)`` after the first batch) and recomputes ``scale`` /
    ``zero_point`` the way PyTorch's observers do:

    - symmetric: ``scale = max(-min, max) / ((q_max - q_min) / 2)``, ``zero_point = 0`` (int8) or
      128 (uint8; ``(q_min + q_max) // 2`` for a custom range, as torch.ao does);
    - affine: ``scale = (max - min) / (q_max - q_min)``, ``zero_point = clamp(q_min - round(min / scale))``;

    with ``min <= 0 <= max`` and ``scale >= eps`` (float32 epsilon). While fake quantization is enabled
    the output is ``(clamp(round(x / scale) + zp, q_min, q_max) - zp) * scale``, one kernel per channel
    or for the whole tensor (:func:`baracuda_numba.fake_quantize_per_channel`), differentiated straight
    through by one kernel (``dx = dy * mask``, the inclusive mask): the bits of torch.ao's module on
    finite inputs.

    The range is reduced in ``x``'s own dtype (one ``torch.aminmax``, no float32 copy of ``x``: the
    extremes of bf16 / f16 values are exact in float32) and no step reads a device value on the host,
    so a training step is never synchronised by this module. Switch the observer and the fake
    quantization with :meth:`enable_observer` / :meth:`enable_fake_quant` (and the ``disable_*``
    methods); the ``observer_enabled`` / ``fake_quant_enabled`` buffers record the switches for state
    dicts and are read back by ``load_state_dict``.

    Parameters
    ----------
    dtype : ``torch.int8`` or ``torch.uint8``; ``q_min`` / ``q_max`` default to its range.
    granularity : ``"per_tensor"`` or ``"per_channel"`` (with ``ch_axis``).
    observer : ``"minmax"`` or ``"moving_average"``.
    symmetric : symmetric (default) or affine quantization.
    """

    def __init__(self, *, dtype: torch.dtype = torch.int8, granularity: Literal["per_tensor", "per_channel"] =
                 "per_tensor", ch_axis: int = 0, observer: Literal["minmax", "moving_average"] = "moving_average",
                 averaging_constant: float = 0.01, symmetric: bool = True, q_min: int | None = None,
                 q_max: int | None = None, num_channels: int | None = None) -> None:
        super().__init__()
        where = "FakeQuantize"
        _check(where, "dtype", dtype in _RANGES, "torch.int8 or torch.uint8", dtype)
        _check(where, "granularity", granularity in ("per_tensor", "per_channel"), "'per_tensor' or 'per_channel'",
               repr(granularity))
        _check(where, "observer", observer in ("minmax", "moving_average"), "'minmax' or 'moving_average'",
               repr(observer))
        _check(where, "averaging_constant", 0.0 < averaging_constant <= 1.0, "a value in (0, 1]",
               averaging_constant)
        low, high = _RANGES[dtype]
        self.q_min, self.q_max = (low if q_min is None else q_min), (high if q_max is None else q_max)
        # torch.ao's rule: uint8 symmetric centres on 128, or on the midpoint of a custom range.
        custom_range = q_min is not None or q_max is not None
        self._symmetric_zero_point = 0 if dtype == torch.int8 else (
            (self.q_min + self.q_max) // 2 if custom_range else 128)
        _check(where, "q_min, q_max", low <= self.q_min < self.q_max <= high, f"{low} <= q_min < q_max <= {high}",
               (self.q_min, self.q_max))
        self.dtype, self.granularity, self.ch_axis = dtype, granularity, ch_axis
        self.observer, self.averaging_constant, self.symmetric = observer, averaging_constant, symmetric
        count = 1 if granularity == "per_tensor" else (num_channels or 1)
        self.register_buffer("scale", torch.ones(count))
        self.register_buffer("zero_point", torch.zeros(count, dtype=torch.int32))
        self.register_buffer("min_val", torch.full((count,), float("inf")))
        self.register_buffer("max_val", torch.full((count,), float("-inf")))
        self.register_buffer("fake_quant_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("observer_enabled", torch.tensor([1], dtype=torch.uint8))
        # The switches as host values: forward never reads a device buffer (a synchronisation each call).
        self._observing = self._fake_quantizing = True
        self._update: ObserverUpdate | None = None  # the observer's one-launch update on CUDA tensors

    def enable_observer(self, enabled: bool = True) -> FakeQuantize:
        self.observer_enabled[0] = int(enabled)
        self._observing = bool(enabled)
        return self

    def disable_observer(self) -> FakeQuantize:
        return self.enable_observer(False)

    def enable_fake_quant(self, enabled: bool = True) -> FakeQuantize:
        self.fake_quant_enabled[0] = int(enabled)
        self._fake_quantizing = bool(enabled)
        return self

    def disable_fake_quant(self) -> FakeQuantize:
        return self.enable_fake_quant(False)

    def _batch_range(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(min, max)`` of ``x`` (per channel: of each channel), shaped like ``min_val``, in ``x``'s dtype
        (float32 for float64 data, as torch.ao rounds ``x`` to float32 first: the same extremes)."""
        x = x.detach()
        if self.granularity == "per_tensor":
            low, high = torch.aminmax(x)
            low, high = low.reshape(1), high.reshape(1)
        else:
            rows = x.movedim(self.ch_axis, 0).reshape(x.shape[self.ch_axis], -1)  # a view for ch_axis 0
            low, high = torch.aminmax(rows, dim=1)
        if low.dtype == torch.float64:
            low, high = low.float(), high.float()
        return low, high

    @torch.no_grad()
    def observe(self, x: torch.Tensor) -> None:
        """Fold ``x``'s range into ``min_val`` / ``max_val`` and recompute ``scale`` / ``zero_point``
        (in place; the batch extremes are promoted to float32 by each operation, exactly)."""
        if x.numel() == 0:  # no range to fold (as torch.ao's observers)
            return
        low, high = self._batch_range(x)
        if self.min_val.shape != low.shape:  # first per-channel batch: size the buffers
            for name in ("scale", "zero_point", "min_val", "max_val"):
                old = getattr(self, name)
                setattr(self, name, old.new_empty(low.shape).fill_(old.flatten()[0]))
        update = self._fused_update(low, high)
        if update is not None:  # CUDA tensors: one launch (torch.observer)
            update.update(low, high, self.min_val, self.max_val, self.scale, self.zero_point)
            return
        if self.observer == "minmax":
            torch.minimum(self.min_val, low, out=self.min_val)
            torch.maximum(self.max_val, high, out=self.max_val)
        else:
            c = self.averaging_constant
            first = torch.isinf(self.min_val)
            torch.where(first, low, self.min_val + c * (low - self.min_val), out=self.min_val)
            torch.where(first, high, self.max_val + c * (high - self.max_val), out=self.max_val)
        self._qparams(self.scale, self.zero_point)

    def _fused_update(self, low: torch.Tensor, high: torch.Tensor) -> ObserverUpdate | None:
        """The one-launch update for these extremes and buffers
        (:class:`~baracuda_numba.torch.observer.ObserverUpdate`), or None where the PyTorch operations below run:
        CPU tensors (whose division by a number differs from CUDA's), buffers no longer float32 / int32, and while
        ``torch.compile`` traces."""
        if not low.is_cuda or torch.compiler.is_compiling() or low.dtype not in RANGE_DTYPES:
            return None
        device = low.device
        for buffer, dtype in ((self.min_val, torch.float32), (self.max_val, torch.float32),
                              (self.scale, torch.float32), (self.zero_point, torch.int32)):
            if buffer.dtype != dtype or buffer.device != device or not buffer.is_contiguous():
                return None
        count = low.numel()
        found = self._update
        if found is None or found.count != count or found.config.range_element is not RANGE_DTYPES[low.dtype]:
            config = ObserverConfig(RANGE_DTYPES[low.dtype], self.observer == "moving_average", self.symmetric)
            divisor = (self.q_max - self.q_min) / 2 if self.symmetric else float(self.q_max - self.q_min)
            found = self._update = ObserverUpdate(config, count, self.averaging_constant, divisor, self.q_min,
                                                  self.q_max, self._symmetric_zero_point,
                                                  torch.finfo(torch.float32).eps)
        return found

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)`` from ``min_val`` / ``max_val`` (see the class docstring)."""
        scale, zero_point = torch.empty_like(self.scale), torch.empty_like(self.zero_point)
        self._qparams(scale, zero_point)
        return scale, zero_point

    def _qparams(self, scale: torch.Tensor, zero_point: torch.Tensor) -> None:
        """Write the parameters of the observed range into ``scale`` / ``zero_point`` (float32 / int32)."""
        low = torch.clamp(self.min_val, max=0.0)
        high = torch.clamp(self.max_val, min=0.0)
        eps = torch.finfo(torch.float32).eps
        if self.symmetric:
            torch.div(torch.maximum(-low, high), (self.q_max - self.q_min) / 2, out=scale)
            scale.clamp_(min=eps)
            zero_point.fill_(self._symmetric_zero_point)
        else:
            torch.div(high - low, float(self.q_max - self.q_min), out=scale)
            scale.clamp_(min=eps)
            zero_point.copy_(torch.clamp(self.q_min - torch.round(low / scale), self.q_min, self.q_max))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buffers = self._buffers  # one lookup each (a QAT step is host-bound: docs/performance.md)
        scale, zero_point = buffers["scale"], buffers["zero_point"]
        if x.device != scale.device:  # as torch.ao's FakeQuantize, the buffers must be where x is
            raise InvalidProblem(problem_message("FakeQuantize", "x", f"a tensor on {scale.device} (where the "
                                                 "module's buffers are: move the module with .to(device))",
                                                 f"a tensor on {x.device}"))
        if self.training and self._observing:
            self.observe(x)
            scale, zero_point = buffers["scale"], buffers["zero_point"]  # resized by a first per-channel batch
        if not self._fake_quantizing:
            return x
        if self.granularity == "per_tensor":
            return _ops.fake_quantize_tensor_with_grad(x, scale, zero_point, self.q_min, self.q_max)
        return _ops.fake_quantize_with_grad("channel", x, scale, zero_point, self.ch_axis % x.dim(), self.q_min,
                                            self.q_max)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_update"] = None  # rebuilt by the next observed batch (it holds a kernel launcher)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("_update", None)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Per-channel buffers take the saved size (they are sized on the first observed batch).
        for name in ("scale", "zero_point", "min_val", "max_val"):
            saved = state_dict.get(prefix + name)
            if saved is not None and saved.shape != getattr(self, name).shape:
                setattr(self, name, torch.empty_like(saved))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._observing = bool(self.observer_enabled[0])
        self._fake_quantizing = bool(self.fake_quant_enabled[0])

    def extra_repr(self) -> str:
        return (f"dtype={self.dtype}, granularity={self.granularity!r}, observer={self.observer!r}, "
                f"symmetric={self.symmetric}, q_range=({self.q_min}, {self.q_max})")


class StateDictMismatch(InvalidProblem):
    """A state dict or checkpoint that does not fit the quantized module it is loaded into: a key of the
    other activation mode, a missing key, a wrong shape or dtype, or scales that cannot be right. The
    message names the key (``"{layer}: {key} expected ..., got ..."``)."""


_FLOAT32_BUFFERS = ("weight_scale", "bias", "act_scale")


def w8a8_state_dict_spec(in_features: int, out_features: int, bias: bool,
                         activation: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The state dict of a :class:`W8A8Linear`: ``{key: (shape, dtype)}``.

    ``weight_q`` int8 ``[N, K]`` (``nn.Linear.weight``'s layout), ``weight_scale`` float32 ``[N]``,
    ``bias`` float32 ``[N]`` when the layer has one, ``act_scale`` float32 ``[]`` for static activations
    only: a dynamic layer has no activation scale, so a state dict of the other mode cannot load.
    """
    spec = {"weight_q": ((out_features, in_features), torch.int8), "weight_scale": ((out_features,), torch.float32)}
    if bias:
        spec["bias"] = ((out_features,), torch.float32)
    if activation == "static":
        spec["act_scale"] = ((), torch.float32)
    return spec


def check_w8a8_scales(where: str, prefix: str, weight_q: torch.Tensor, weight_scale: torch.Tensor,
                      act_scale: torch.Tensor | None, names: tuple[str, str] = ("weight_scale", "act_scale")) -> None:
    """Raise :class:`StateDictMismatch` unless every weight scale is finite and ``>= 0``, ``> 0`` on each
    row of ``weight_q`` holding a nonzero value, and ``act_scale`` (static) is finite and ``> 0``.

    Checked once per weight, where it is loaded (``from_float``, ``load_state_dict``, checkpoints),
    so that the GEMM can take the device arrays as they are. ``names``: the keys the error names (a
    checkpoint of another format calls them otherwise).
    """
    if weight_scale.is_meta or weight_q.is_meta:
        return
    scale = weight_scale.detach().float()
    bad = ~torch.isfinite(scale) | (scale < 0) | ((scale == 0) & (weight_q != 0).any(dim=1))
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise StateDictMismatch(problem_message(
            where, prefix + names[0], "finite scales, > 0 on rows with nonzero weights",
            f"{float(scale[row])} at row {row} ({int(bad.sum())} such rows)"))
    if act_scale is not None and not act_scale.is_meta:
        value = float(act_scale)
        if not 0.0 < value < float("inf"):
            raise StateDictMismatch(problem_message(where, prefix + names[1], "a finite scale > 0", value))


def check_w8a8_entries(where: str, prefix: str, spec: dict[str, tuple[tuple[int, ...], torch.dtype]],
                       entries: dict[str, tuple[tuple[int, ...], torch.dtype]], activation: str) -> None:
    """Compare the ``{key: (shape, dtype)}`` found for one layer (keys without ``prefix``) with its ``spec``
    (:func:`w8a8_state_dict_spec`); raise :class:`StateDictMismatch` naming ``prefix + key`` at the first
    key missing, of another shape or dtype, or present though the layer has no such buffer (``act_scale`` of
    a static layer loaded into a dynamic one, a bias into a layer without one, a float ``weight``)."""
    for key, (shape, dtype) in spec.items():
        if key not in entries:
            expected = ("a static layer's activation scale" if key == "act_scale" else
                        f"{tuple(shape)} {str(dtype).removeprefix('torch.')}")
            raise StateDictMismatch(problem_message(where, prefix + key, expected, "no such key"))
        got_shape, got_dtype = entries[key]
        if tuple(got_shape) != tuple(shape) or got_dtype != dtype:
            raise StateDictMismatch(problem_message(
                where, prefix + key, f"{tuple(shape)} {str(dtype).removeprefix('torch.')}",
                f"{tuple(got_shape)} {str(got_dtype).removeprefix('torch.')}"))
    for key in entries:
        if key not in spec:
            expected = (f"no act_scale ({activation} activations)" if key == "act_scale" else
                        "no bias (the layer has none)" if key == "bias" else
                        f"only {', '.join(spec)} (a W8A8 layer)")
            raise StateDictMismatch(problem_message(where, prefix + key, expected, "that key"))


class W8A8Linear(nn.Module):
    """``nn.Linear`` with int8 weights (per output channel, symmetric [-127, 127]) and int8 activations.

    ``activation="dynamic"``: activations quantized per token in the GEMM call
    (``baracuda::quantized_linear``). ``activation="static"``: one calibrated per-tensor scale
    (SmoothQuant's static W8A8): ``x`` quantized with ``act_scale`` and multiplied in one call
    (``baracuda::quantized_linear`` with ``act_scale``; float64 ``x``: ``baracuda::quantize_per_tensor`` then
    ``baracuda::smoothquant_linear``): one kernel at decode for a few tokens, else the static quantizer and the
    GEMM as its programmatic dependent.
    ``y = scale_x * weight_scale[n] * sum_k xq[k] * wq[n, k] + bias[n]`` in ``x``'s dtype. The buffers
    are written only at load (``from_float``, ``load_state_dict``), so both paths call their op with
    ``static_weight=True``: the decode kernel loads the weight before it waits for the kernel before it
    (:func:`baracuda_numba.quantized_linear`, :func:`baracuda_numba.smoothquant_linear`). A copy into the
    buffers (``copy_``, ``load_state_dict``) right before a forward is safe: copies let no dependent start
    before they end.

    State dict (:func:`w8a8_state_dict_spec`): ``weight_q`` int8 ``[N, K]``, ``weight_scale`` float32
    ``[N]``, ``bias`` float32 ``[N]`` (if any), ``act_scale`` float32 ``[]`` (static only). Loading checks
    every key, shape and dtype and the scales (:func:`check_w8a8_scales`) and raises
    :class:`StateDictMismatch` naming the key, whatever ``strict`` says. The scales and the bias stay
    float32 (the epilogue's precision) when the model is cast with ``.to(dtype)`` / ``.half()``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 activation: Literal["dynamic", "static"] = "dynamic", act_scale: float | None = None,
                 name: str = "W8A8Linear") -> None:
        super().__init__()
        _check(name, "activation", activation in ("dynamic", "static"), "'dynamic' or 'static'", repr(activation))
        if activation == "static":
            _check(name, "act_scale", act_scale is not None and 0.0 < float(act_scale) < float("inf"),
                   "a finite positive scale for static activations", act_scale)
        self.in_features, self.out_features, self.activation, self.name = in_features, out_features, activation, name
        f32 = torch.float32  # explicit: transformers builds models under another default dtype
        self.register_buffer("weight_q", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=f32))
        self.register_buffer("bias", torch.zeros(out_features, dtype=f32) if bias else None)
        self.register_buffer("act_scale", torch.tensor(float(act_scale), dtype=f32) if activation == "static" else None)
        self._act_scale = float(act_scale) if activation == "static" else None  # a constant for torch.compile
        self._bound: BoundQuantizedLinear | None = None  # the eager call over the buffers (forward)
        self._group: Any = None  # the torch.groups.ProjectionGroup computing this layer with its siblings
        self._group_index = 0

    @staticmethod
    def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(wq, s)``: ``s[n] = max(max_k |W[n, k]| / 127, tiny)`` (float32) and
        ``wq = clamp(round(W * (1/s)), -127, 127)`` (int8), on ``weight``'s device by the project's kernel."""
        weight = weight.detach().float().contiguous()
        scale = true_quotient(weight.abs().amax(dim=1), 127.0).clamp(min=torch.finfo(torch.float32).tiny)
        zeros = torch.zeros(weight.shape[0], dtype=torch.int32, device=weight.device)
        return _baracuda.quantize_per_channel(weight, scale, zeros, 0, torch.int8, -127, 127), scale

    @classmethod
    @torch.no_grad()
    def from_float(cls, linear: nn.Linear, *, activation: Literal["dynamic", "static"] = "dynamic",
                   act_scale: float | None = None, name: str = "W8A8Linear") -> W8A8Linear:
        """Quantize ``linear``'s weight per output channel (:meth:`quantize_weight`)."""
        _check(name, "linear", isinstance(linear, nn.Linear), "an nn.Linear", type(linear).__name__)
        weight = linear.weight.detach()
        _check(name, "linear.weight", bool(torch.isfinite(weight).all()), "finite weights", "inf or NaN")
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, activation=activation,
                     act_scale=act_scale, name=name).to(weight.device)
        weight_q, scale = cls.quantize_weight(weight)
        module.weight_q.copy_(weight_q)
        module.weight_scale.copy_(scale)
        if linear.bias is not None:
            module.bias.copy_(linear.bias.detach().float())
        check_w8a8_scales(name, "", module.weight_q, module.weight_scale, module.act_scale)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self._group
        if group is not None:  # one GEMM with the siblings that read this x (torch.groups)
            y = group.output(self._group_index, x)
            if y is not None:
                return y
        if (not torch.compiler.is_compiling() and type(x) is torch.Tensor
                and not (x.requires_grad and torch.is_grad_enabled())):
            # eager: the bound call, no custom-op dispatch (ops.linear_bound); rebound where a buffer was replaced
            buffers, bound = self._buffers, self._bound
            if (bound is None or bound.weight_q is not buffers["weight_q"]
                    or bound.weight_scale is not buffers["weight_scale"] or bound.bias is not buffers["bias"]):
                bound = self._bind()
            return bound(x)
        return self._op_forward(x)

    def _op_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The forward through the custom ops (what ``torch.compile`` traces, and the full way of an eager call)."""
        if x.shape[-1] != self.in_features:
            raise InvalidProblem(problem_message(self.name, "x", f"[..., {self.in_features}]", tuple(x.shape)))
        if self.activation == "dynamic" or x.dtype != torch.float64:
            # static_weight: the buffers are written at load and by from_float, never by the kernel before a forward;
            # a static scale: the quantize and the GEMM in one call (one kernel at decode)
            act_scale = None if self.activation == "dynamic" else self._act_scale
            if torch.compiler.is_compiling():  # into a buffer of Inductor's (ops.py, the W8A8 linear ops)
                out = x.new_empty((*x.shape[:-1], self.out_features))
                _ops.quantized_linear_out(x, self.weight_q, self.weight_scale, self.bias, True, act_scale, out)
                return out
            return _ops.quantized_linear(x, self.weight_q, self.weight_scale, self.bias, True, act_scale)
        act_q = _baracuda.quantize_per_tensor(x, self._act_scale, 0, torch.int8, -127, 127)
        return _ops.smoothquant_linear(act_q, self.weight_q, self.weight_scale, self._act_scale, self.bias, x.dtype,
                                       True)

    def _bind(self) -> BoundQuantizedLinear:
        """The layer's eager call over its current buffers
        (:func:`~baracuda_numba.ops.linear_bound.bind_quantized_linear`: a shape seen before launches its
        remembered plan; any other call goes through :meth:`_op_forward`)."""
        bound = bind_quantized_linear(self.weight_q, self.weight_scale, self.bias, static_weight=True,
                                      act_scale=self._act_scale, fallback=self._op_forward, name=self.name)
        self._bound = bound
        return bound

    def state_dict_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """``{key: (shape, dtype)}`` of this layer's state dict (:func:`w8a8_state_dict_spec`)."""
        return w8a8_state_dict_spec(self.in_features, self.out_features, self.bias is not None, self.activation)

    def check_state_dict(self, state_dict: dict[str, torch.Tensor], prefix: str = "") -> None:
        """Raise :class:`StateDictMismatch` naming the first key of ``state_dict`` under ``prefix`` that is
        missing, unexpected (the other activation mode's) or of another shape or dtype
        (:func:`check_w8a8_entries`); then check the scales (:func:`check_w8a8_scales`)."""
        entries = {key[len(prefix):]: (tuple(value.shape), value.dtype) for key, value in state_dict.items()
                   if key.startswith(prefix) and "." not in key[len(prefix):]}
        check_w8a8_entries(self.name, prefix, self.state_dict_spec(), entries, self.activation)
        check_w8a8_scales(self.name, prefix, state_dict[prefix + "weight_q"], state_dict[prefix + "weight_scale"],
                          state_dict.get(prefix + "act_scale"))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self.check_state_dict(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.refresh()

    def refresh(self) -> None:
        """Re-read the static activation scale into the Python float the forward passes to the op
        (after the buffers were written other than through ``load_state_dict``, e.g. by a checkpoint loader)."""
        if self.act_scale is not None and not self.act_scale.is_meta:
            self._act_scale = float(self.act_scale)
        self._bound = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_bound"] = None  # rebuilt by the first forward (it holds compiled launches)
        state["_group"] = None  # a copy's buffers are its own, not end to end (torch.groups.group_projections)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("_bound", None)
        self.__dict__.setdefault("_group", None)
        self.__dict__.setdefault("_group_index", 0)

    def _apply(self, fn, recurse=True):
        # `.to(dtype)` / `.half()` move the float32 scales and bias but keep their dtype: the epilogue is
        # float32 (docs: README "W8A8 linear"), and a bf16 scale would change the numerics silently.
        kept = {name: self._buffers[name] for name in _FLOAT32_BUFFERS if self._buffers.get(name) is not None}
        super()._apply(fn, recurse)
        for name, old in kept.items():
            new = self._buffers[name]
            if new.dtype != old.dtype:
                self._buffers[name] = (torch.empty_like(old, device=new.device) if old.is_meta and not new.is_meta
                                       else old.to(new.device))
        if self._group is not None:  # moved copies are laid out end to end again (torch.groups)
            self._group.update_layout()
        return self

    def extra_repr(self) -> str:
        scale = f", act_scale={self._act_scale:.6g}" if self.activation == "static" else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activation={self.activation!r}{scale}")
