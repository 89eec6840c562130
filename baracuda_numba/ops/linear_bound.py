""":func:`~baracuda_numba.ops.linear.quantized_linear` on PyTorch tensors with the least host work: the entries
of the PyTorch layer (``docs/design-linear.md``, "The launch path").

- :func:`bind_quantized_linear`: the function of ``x`` alone that a layer holds, its weight, scales, bias and
  options checked once; :class:`~baracuda_numba.torch.W8A8Linear` calls it in eager mode, without the torch
  custom-op dispatch (about 10 us a call on a CPU host, the whole of a decode GEMM's GPU time).
- :func:`quantized_linear_tensors`: what the ``baracuda::quantized_linear`` and ``baracuda::quantized_linear_out``
  ops run (under ``torch.compile`` every layer call goes through the out-variant, into a buffer Inductor
  allocates), each tensor checked in one frame.

Both end in the plan's one fast launch (:mod:`baracuda_numba.plans.linear.fast`), remembered per input shape,
dtype and device once a first call has gone the full way; whatever it declines (another layout, an operand off
its alignment, the fused kernel under graph capture, the simulator) goes the full way, with the same bits.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidProblem, problem_message
from ..plans.base import checked_scale
from ..plans.linear import QuantizedLinearDescriptor, QuantizedLinearPlan
from ..vocabulary import element_kind
from .linear import _select, quantized_linear

__all__ = ["bind_quantized_linear", "BoundQuantizedLinear", "quantized_linear_tensors", "launch_remembered",
           "launch_grouped", "clear_bound_launches"]

_ZERO_F32 = np.float32(0.0)
# (x shape, dtype, device, N, no bias, static weight, static scale or None) -> (launch, result shape, the scale as
# the launch takes it)
_LAUNCHES: dict[tuple, Any] = {}
_LAUNCHES_LIMIT = 512


class _OpBinding:
    """The op's remembered launches for one set of weight tensors (``weight_q``, ``weight_scale``, ``bias``), whose
    dtypes, shapes, contiguity and device were checked by the call that bound them: the tensors by identity (weak
    references: a freed model frees its weights), ``launches`` per input shape and dtype."""

    __slots__ = ("bias", "device", "launches", "tensor", "weight_q", "weight_scale")

    def __init__(self, weight_q: Any, weight_scale: Any, bias: Any, device: int, tensor: type) -> None:
        self.weight_q, self.weight_scale = weakref.ref(weight_q), weakref.ref(weight_scale)
        self.bias = None if bias is None else weakref.ref(bias)
        self.device, self.tensor = device, tensor
        self.launches: dict[tuple, Any] = {}


# (id(weight_q), id(weight_scale), id(bias), static_weight, act_scale) -> _OpBinding
_OP_BINDINGS: dict[tuple, _OpBinding] = {}


class _GroupBinding:
    """Weight tensors of several layers found laid out end to end (rows, scales and biases each in one run of
    memory): the tensors by identity (weak references), ``n`` their rows in all, ``launches`` per input shape and
    dtype."""

    __slots__ = ("device", "dtypes", "k", "launches", "n", "refs", "tensor")

    def __init__(self, tensors: tuple, n: int, k: int, device: int, torch: Any) -> None:
        self.refs = tuple(weakref.ref(t) for t in tensors)
        self.n, self.k, self.device, self.tensor = n, k, device, torch.Tensor
        self.dtypes = (torch.float16, torch.bfloat16, torch.float32)  # the inputs the W8A8 plans take
        self.launches: dict[tuple, Any] = {}  # (x shape, x dtype) -> the remembered launch, or None: none


# (id(first weight_q), static_weight, act_scale) -> _GroupBinding
_GROUP_BINDINGS: dict[tuple, _GroupBinding] = {}


def clear_bound_launches() -> None:
    """Forget every remembered launch (:func:`~baracuda_numba.ops.common.clear_plan_cache` calls it)."""
    _LAUNCHES.clear()
    _OP_BINDINGS.clear()
    _GROUP_BINDINGS.clear()


def _remember(key: tuple, x: Any) -> None:
    """Remember the fast launch of the plan a call of ``key`` selects, its result's shape and its checked static
    scale (nothing where the plan has no fast path: the simulator, ``K % 16 != 0``)."""
    shape = tuple(x.shape)
    n, no_bias, static_weight, act_scale = key[3:]
    plan = _select(QuantizedLinearPlan, QuantizedLinearDescriptor(
        int(np.prod(shape[:-1], dtype=np.int64)), n, shape[-1], element_kind(x.dtype), element_kind(x.dtype),
        not no_bias, static_weight, act_scale is not None))
    fast = plan._fast_path()
    if fast is None:
        return
    scale = _ZERO_F32 if act_scale is None else checked_scale("quantized_linear", act_scale, np.float32,
                                                                "act_scale")[1]
    if len(_LAUNCHES) >= _LAUNCHES_LIMIT:
        _LAUNCHES.clear()
    _LAUNCHES[key] = (fast.launch, (*shape[:-1], n), scale)


def _is_tensor(value: Any, torch: Any) -> bool:
    return type(value) is torch.Tensor or type(value) is torch.nn.Parameter


def _launch_key(x: Any, weight_q: Any, weight_scale: Any, bias: Any, static_weight: bool, act_scale: Any,
                torch: Any) -> tuple | None:
    """The key of a call the remembered launches may take: contiguous tensors of the dtypes the launch reads (a
    float or None ``act_scale``, a bool ``static_weight``); None for any other call."""
    if (type(x) is torch.Tensor and _is_tensor(weight_q, torch) and _is_tensor(weight_scale, torch)
            and (act_scale is None or type(act_scale) is float) and type(static_weight) is bool
            and x.dim() >= 1 and weight_q.dim() == 2 and weight_q.dtype is torch.int8
            and weight_scale.dtype is torch.float32 and x.is_contiguous() and weight_q.is_contiguous()
            and weight_scale.is_contiguous()):
        return (x.shape, x.dtype, x.get_device(), weight_q.shape[0], bias is None, static_weight, act_scale)
    return None


def _output(x: Any, out: Any, shape: tuple, tensor: type, device: int) -> Any:
    """The result a remembered launch writes: a new tensor of ``shape`` like ``x`` where ``out`` is None, else
    ``out`` where it is a contiguous ``tensor`` of ``shape``, ``x``'s dtype and ``device``; None otherwise."""
    if out is None:
        return x.new_empty(shape)
    if (type(out) is tensor and out.dtype is x.dtype and out.shape == shape and out.is_contiguous()
            and out.get_device() == device):
        return out
    return None


def _launched(x: Any, weight_q: Any, weight_scale: Any, bias: Any, out: Any, key: tuple, torch: Any) -> Any:
    """``out`` (a new tensor where None) written by the remembered launch of ``key``, or None where there is none
    or it declines the operands (nothing launched)."""
    found = _LAUNCHES.get(key)
    if found is None:
        return None
    device, n = key[2], key[3]
    if not (weight_q.get_device() == device and weight_scale.get_device() == device
            and weight_q.shape[1] == x.shape[-1] and weight_scale.numel() == n):
        return None
    s_ptr = weight_scale.data_ptr()
    b_ptr = s_ptr  # the unused bias slot points at weight_scale
    if bias is not None:
        if not (_is_tensor(bias, torch) and bias.dtype is torch.float32 and bias.is_contiguous()
                and bias.get_device() == device and bias.numel() == n):
            return None
        b_ptr = bias.data_ptr()
    launch, shape, scale = found
    out = _output(x, out, shape, torch.Tensor, device)
    if out is None:
        return None
    x_ptr, w_ptr = x.data_ptr(), weight_q.data_ptr()
    if (x_ptr | w_ptr) & 15 or (s_ptr | b_ptr) & 3 or not launch(x_ptr, w_ptr, s_ptr, b_ptr, out.data_ptr(), device,
                                                                 None, scale):
        return None
    return out


def launch_remembered(x: Any, weight_q: Any, weight_scale: Any, bias: Any = None, static_weight: bool = False,
                      act_scale: float | None = None, out: Any = None) -> Any:
    """The remembered launch of :func:`quantized_linear_tensors` alone: its result (``out``, or a new tensor), or None
    where the call is not one it takes (nothing launched; the caller goes the full way).

    What compiled code runs at every layer call (the op's implementation), so a call with the weight tensors of
    an earlier launched call checks only ``x`` and ``out``: the weights' dtypes, shapes, contiguity and device
    were checked when that call bound them (as a layer's eager bound call does), their pointers are read at each
    call. A tensor object changed in place past its data (``resize_``, ``set_``) is not seen; a buffer replaced
    by another tensor is (``tests/test_torch_bound.py``)."""
    binding = _OP_BINDINGS.get((id(weight_q), id(weight_scale), id(bias), static_weight, act_scale))
    if (binding is not None and binding.weight_q() is weight_q and binding.weight_scale() is weight_scale
            and (bias is None or binding.bias() is bias) and type(x) is binding.tensor):
        found = binding.launches.get((x.shape, x.dtype))
        device = binding.device
        if found is not None and x.is_contiguous() and x.get_device() == device:
            launch, shape, scale = found
            out = _output(x, out, shape, binding.tensor, device)
            if out is None:
                return None
            x_ptr, w_ptr, s_ptr = x.data_ptr(), weight_q.data_ptr(), weight_scale.data_ptr()
            b_ptr = s_ptr if bias is None else bias.data_ptr()  # the unused bias slot points at weight_scale
            if (x_ptr | w_ptr) & 15 or (s_ptr | b_ptr) & 3 or not launch(x_ptr, w_ptr, s_ptr, b_ptr, out.data_ptr(),
                                                                         device, None, scale):
                return None
            return out
    torch = sys.modules["torch"]
    key = _launch_key(x, weight_q, weight_scale, bias, static_weight, act_scale, torch)
    if key is None:
        return None
    result = _launched(x, weight_q, weight_scale, bias, out, key, torch)
    if result is not None:  # the weights passed every check: bound, with this input's launch
        _bind_op(weight_q, weight_scale, bias, static_weight, act_scale, key, torch)
    return result


def _bind_op(weight_q: Any, weight_scale: Any, bias: Any, static_weight: bool, act_scale: Any, key: tuple,
             torch: Any) -> None:
    """Remember the launch of ``key`` under the binding of these weight tensors (made where there is none)."""
    op_key = (id(weight_q), id(weight_scale), id(bias), static_weight, act_scale)
    binding = _OP_BINDINGS.get(op_key)
    if binding is None or binding.weight_q() is not weight_q or binding.weight_scale() is not weight_scale or (
            bias is not None and binding.bias() is not bias):
        if len(_OP_BINDINGS) >= _LAUNCHES_LIMIT:
            _OP_BINDINGS.clear()
        binding = _OP_BINDINGS[op_key] = _OpBinding(weight_q, weight_scale, bias, key[2], torch.Tensor)
    if len(binding.launches) >= _LAUNCHES_LIMIT:
        binding.launches.clear()
    binding.launches[(key[0], key[1])] = _LAUNCHES[key]


def launch_grouped(x: Any, weights_q: Any, weight_scales: Any, biases: Any, static_weight: bool = False,
                   act_scale: float | None = None, out: Any = None) -> Any:
    """``quantized_linear(x, W, S, B)`` of several layers' weights ``W = cat(weights_q)`` ``[N_1 + ... + N_g, K]``,
    ``S = cat(weight_scales)``, ``B = cat(biases)`` (None: no bias), where each list's tensors lie end to end in
    memory: the concatenation is read in place, one GEMM and one activation quantization for all. The result
    (``out``, or a new tensor) is ``[..., N_1 + ... + N_g]``, layer ``i``'s output in its columns, the bits of each
    layer's own call (the epilogue is per output element, the int32 sums exact: ``tests/test_torch_groups.py``).

    None (nothing launched) where the tensors are not end to end, or where the call is not one the remembered
    launch takes (CPU tensors, the simulator, an input other than a contiguous CUDA tensor): the caller runs each
    layer alone. As :func:`launch_remembered`, tensors are checked once, then known by identity."""
    binding = _GROUP_BINDINGS.get((id(weights_q[0]), static_weight, act_scale))
    tensors = (*weights_q, *weight_scales, *(biases or ()))
    if binding is None or len(binding.refs) != len(tensors) or not all(
            ref() is t for ref, t in zip(binding.refs, tensors, strict=True)):
        binding = _bind_group(weights_q, weight_scales, biases, static_weight, act_scale, tensors)
        if binding is None:
            return None
    device = binding.device
    if type(x) is not binding.tensor or not x.is_contiguous() or x.get_device() != device:
        return None
    found = binding.launches.get((x.shape, x.dtype), binding)  # the binding itself: not seen yet
    if found is binding:
        found = None
        if x.dtype in binding.dtypes and x.dim() >= 1 and x.shape[-1] == binding.k:
            key = (x.shape, x.dtype, device, binding.n, not biases, static_weight, act_scale)
            if key not in _LAUNCHES:
                _remember(key, x)
            found = _LAUNCHES.get(key)
        if len(binding.launches) >= _LAUNCHES_LIMIT:
            binding.launches.clear()
        binding.launches[(x.shape, x.dtype)] = found
    if found is None:
        return None
    launch, shape, scale = found
    out = _output(x, out, shape, binding.tensor, device)
    if out is None:
        return None
    x_ptr, w_ptr, s_ptr = x.data_ptr(), weights_q[0].data_ptr(), weight_scales[0].data_ptr()
    b_ptr = biases[0].data_ptr() if biases else s_ptr
    if (x_ptr | w_ptr) & 15 or (s_ptr | b_ptr) & 3:
        return None
    if launch(x_ptr, w_ptr, s_ptr, b_ptr, out.data_ptr(), device, None, scale):
        return out
    # declined (the fused kernel under graph capture): the full way, on tensors over the runs of memory
    spans = [_span(w_ptr, (binding.n, binding.k), "|i1", device), _span(s_ptr, (binding.n,), "<f4", device),
             _span(b_ptr, (binding.n,), "<f4", device) if biases else None]
    if spans[0] is None:
        return None
    return quantized_linear(x, spans[0], spans[1], bias=spans[2], out=out, static_weight=static_weight,
                            act_scale=act_scale)


class _Span:
    """A CUDA array over memory its caller keeps alive (``__cuda_array_interface__``, version 3)."""

    def __init__(self, pointer: int, shape: tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (pointer, False),
                                         "version": 3, "strides": None, "stream": None}


def _span(pointer: int, shape: tuple[int, ...], typestr: str, device: int) -> Any:
    """A torch tensor over ``pointer`` on CUDA device ``device``, no copy (None without CUDA)."""
    torch = sys.modules["torch"]
    if not torch.cuda.is_available():
        return None
    return torch.as_tensor(_Span(pointer, shape, typestr), device=torch.device("cuda", device))


def _bind_group(weights_q: Any, weight_scales: Any, biases: Any, static_weight: bool, act_scale: Any,
                tensors: tuple) -> _GroupBinding | None:
    """The binding of tensors that lie end to end (every check of :func:`_launch_key` and :func:`_launched` on each
    layer's, and each one starting where the one before ends), or None."""
    torch = sys.modules["torch"]
    if not (len(weights_q) == len(weight_scales) >= 1 and (not biases or len(biases) == len(weights_q))):
        return None
    if not all(_is_tensor(t, torch) and t.is_contiguous() for t in tensors):
        return None
    first = weights_q[0]
    if first.dim() != 2 or type(static_weight) is not bool or not (act_scale is None or type(act_scale) is float):
        return None
    k, device = first.shape[1], first.get_device()
    if device < 0:
        return None
    w_at, s_at, b_at = first.data_ptr(), weight_scales[0].data_ptr(), biases[0].data_ptr() if biases else 0
    n = 0
    for i, w in enumerate(weights_q):
        s, rows = weight_scales[i], w.shape[0] if w.dim() == 2 else -1
        if not (w.dtype is torch.int8 and w.dim() == 2 and w.shape[1] == k and w.get_device() == device
                and s.dtype is torch.float32 and s.numel() == rows and s.get_device() == device
                and w.data_ptr() == w_at and s.data_ptr() == s_at):
            return None
        w_at, s_at, n = w_at + rows * k, s_at + 4 * rows, n + rows
        if biases:
            b = biases[i]
            if not (b.dtype is torch.float32 and b.numel() == rows and b.get_device() == device
                    and b.data_ptr() == b_at):
                return None
            b_at += 4 * rows
    if len(_GROUP_BINDINGS) >= _LAUNCHES_LIMIT:
        _GROUP_BINDINGS.clear()
    binding = _GROUP_BINDINGS[(id(first), static_weight, act_scale)] = _GroupBinding(tensors, n, k, device, torch)
    return binding


def quantized_linear_tensors(x: Any, weight_q: Any, weight_scale: Any, bias: Any = None, static_weight: bool = False,
                             act_scale: float | None = None, out: Any = None) -> Any:
    """:func:`~baracuda_numba.ops.linear.quantized_linear` of torch tensors (the same result and errors), into
    ``out`` where given: a repeat call on contiguous CUDA tensors of the expected dtypes on one device launches the
    remembered plan with the tensors' pointers, every check in one frame; any other goes the full way and, on CUDA
    tensors, remembers its plan's launch."""
    torch = sys.modules["torch"]
    key = _launch_key(x, weight_q, weight_scale, bias, static_weight, act_scale, torch)
    if key is not None:
        result = _launched(x, weight_q, weight_scale, bias, out, key, torch)
        if result is not None:
            return result
    result = quantized_linear(x, weight_q, weight_scale, bias=bias, out=out, static_weight=static_weight,
                              act_scale=act_scale)
    if key is not None and key[2] >= 0 and key not in _LAUNCHES:
        _remember(key, x)
    return result


class BoundQuantizedLinear:
    """``quantized_linear(x, weight_q, weight_scale, bias=bias, static_weight=..., act_scale=...)`` as a function
    of ``x`` (see :func:`bind_quantized_linear`). :attr:`weight_q`, :attr:`weight_scale` and :attr:`bias` are the
    tensors bound; their pointers are read at each call."""

    __slots__ = ("_bound", "_device", "_fallback", "_k", "_launches", "_n", "_name", "_scale", "act_scale", "bias",
                 "static_weight", "weight_q", "weight_scale")

    def __init__(self, weight_q: Any, weight_scale: Any, bias: Any, static_weight: bool, act_scale: float | None,
                 fallback: Callable[[Any], Any] | None, name: str) -> None:
        torch = sys.modules["torch"]
        self.weight_q, self.weight_scale, self.bias = weight_q, weight_scale, bias
        self.static_weight, self.act_scale, self._name = static_weight, act_scale, name
        self._scale = _ZERO_F32 if act_scale is None else checked_scale(name, act_scale, np.float32, "act_scale")[1]
        self._n, self._k = (weight_q.shape[0], weight_q.shape[1]) if weight_q.dim() == 2 else (-1, -1)
        self._device = weight_q.get_device()
        self._launches: dict[tuple, Any] = {}
        self._fallback = fallback
        vectors = (weight_scale,) if bias is None else (weight_scale, bias)
        # what the fast launch takes unchecked at every call: checked once here
        self._bound = (self._device >= 0 and weight_q.dtype is torch.int8 and weight_q.dim() == 2
                       and weight_q.is_contiguous()
                       and all(v.dtype is torch.float32 and v.is_contiguous() and v.numel() == self._n
                               and v.get_device() == self._device for v in vectors))

    def __call__(self, x: Any) -> Any:
        if type(x) is sys.modules["torch"].Tensor and x.is_contiguous():
            found = self._launches.get((x.shape, x.dtype, x.get_device()))
            if found is not None:
                launch, shape, _ = found
                out = x.new_empty(shape)
                x_ptr, w_ptr, s_ptr = x.data_ptr(), self.weight_q.data_ptr(), self.weight_scale.data_ptr()
                b_ptr = s_ptr if self.bias is None else self.bias.data_ptr()
                if not ((x_ptr | w_ptr) & 15 or (s_ptr | b_ptr) & 3) and launch(
                        x_ptr, w_ptr, s_ptr, b_ptr, out.data_ptr(), self._device, None, self._scale):
                    return out
        return self._full(x)

    def _full(self, x: Any) -> Any:
        """The call the full way (the fallback, else :func:`quantized_linear`), then its launch remembered."""
        if x.shape[-1:] != (self._k,):
            raise InvalidProblem(problem_message(self._name, "x", f"[..., {self._k}]", tuple(x.shape)))
        if self._fallback is not None:
            out = self._fallback(x)
        else:
            out = quantized_linear(x, self.weight_q, self.weight_scale, bias=self.bias,
                                   static_weight=self.static_weight, act_scale=self.act_scale)
        torch = sys.modules["torch"]
        if (self._bound and type(x) is torch.Tensor and x.is_contiguous() and x.get_device() == self._device
                and x.dtype in (torch.float16, torch.bfloat16, torch.float32)):
            key = (x.shape, x.dtype, self._device)
            if key not in self._launches:
                shared = (*key, self._n, self.bias is None, self.static_weight, self.act_scale)
                if shared not in _LAUNCHES:
                    _remember(shared, x)
                found = _LAUNCHES.get(shared)
                if found is not None:
                    if len(self._launches) >= _LAUNCHES_LIMIT:
                        self._launches.clear()
                    self._launches[key] = found
        return out


def bind_quantized_linear(weight_q: Any, weight_scale: Any, bias: Any = None, *, static_weight: bool = False,
                          act_scale: float | None = None, fallback: Callable[[Any], Any] | None = None,
                          name: str = "quantized_linear") -> BoundQuantizedLinear:
    """``quantized_linear`` with everything but ``x`` bound: ``call(x)`` gives
    ``quantized_linear(x, weight_q, weight_scale, bias=bias, static_weight=static_weight, act_scale=act_scale)``,
    the same bits.

    For a layer whose buffers change only at load: ``weight_q`` ``[N, K]`` int8, ``weight_scale`` and ``bias``
    ``[N]`` float32, contiguous torch tensors on one CUDA device, are checked here once; a call on a contiguous
    ``x`` of a shape, dtype and device seen before launches the remembered plan with the pointers of ``x``, of a
    new output and of the bound tensors (read at the call). Other calls go the full way: ``fallback(x)`` where
    given (the layer's custom op), else :func:`quantized_linear`. ``act_scale`` is checked here (finite, > 0);
    an ``x`` whose last dimension is not ``K`` raises :class:`InvalidProblem` naming ``name``."""
    return BoundQuantizedLinear(weight_q, weight_scale, bias, static_weight, act_scale, fallback, name)
