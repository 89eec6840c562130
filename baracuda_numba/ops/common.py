"""What every dispatch function does: adapt inputs, resolve dtypes and q ranges, select a plan
(cached on its descriptor), allocate or check ``out=``."""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

from ..arrays import Operand, adapt, allocate_like, require_contiguous
from ..errors import InvalidOperand, InvalidProblem, problem_message
from ..plans.base import DEFAULT_PREFERENCE, Plan
from ..plans.tuning import current_tuning
from ..vocabulary import ElementKind, element_kind
from .checks import check_operands

__all__ = ["coerced", "operand", "scale_operands", "select_plan", "resolve_dtype", "default_q_range",
           "scalar_zero_point", "output_operand", "clear_plan_cache", "zeros_like_kind", "fast_key", "fast_run",
           "remember_fast", "remembered_plan"]


def select_plan(plan_type: type[Plan], desc: Any, *options: Any) -> Plan:
    """``plan_type.select(desc, *options)``, cached on the (frozen, hashable) descriptor and options (a
    preference, a tuning value); without options, the default preference and the current device's memory-bound
    tuning value (:func:`~baracuda_numba.plans.tuning.current_tuning`), so that the tuning is in the key."""
    return _select_plan(plan_type, desc, *(options or (DEFAULT_PREFERENCE, current_tuning())))


@functools.lru_cache(maxsize=1024)
def _select_plan(plan_type: type[Plan], desc: Any, *options: Any) -> Plan:
    return plan_type.select(desc, *options)


def clear_plan_cache() -> None:
    """Forget every cached plan (compiled kernels stay cached in the registry)."""
    _select_plan.cache_clear()
    _FAST_PLANS.clear()
    from .linear_bound import clear_bound_launches  # here: that module imports this one

    clear_bound_launches()


# Repeat calls on plain CUDA torch tensors skip adaptation, dtype resolution and plan lookup: the
# first call goes the full way and remembers (plan, result dtype, device, device index) under everything
# that decided them. A remembered call knows its tensors' types, dtypes, shapes, contiguity and device
# from its key, and its result is new: the plan launches it with only alignment checks (run_trusted).
_FAST_PLANS: dict[tuple, tuple[Plan, Any, Any, int]] = {}
_FAST_PLANS_LIMIT = 256


def fast_key(where: str, arrays: tuple, *options: Any) -> tuple | None:
    """The memo key of a call whose ``arrays`` are all contiguous CUDA ``torch.Tensor`` (exact type),
    else None. The key holds each array's dtype, shape and device and the call's ``options``; an
    unhashable option (a list for dtype, say) makes the lookups miss, and the full path decides."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    key: list = [where]
    tensor = torch.Tensor
    for a in arrays:
        if type(a) is not tensor or not a.is_cuda or not a.is_contiguous():
            return None
        key += (a.dtype, a.shape, a.get_device())
    key += options
    return tuple(key)


def _lookup(key: tuple | None) -> tuple[Plan, Any, Any, int, Any] | None:
    if key is None:
        return None
    try:
        return _FAST_PLANS.get(key)
    except TypeError:  # an unhashable option
        return None


def fast_run(key: tuple | None, like: Any, make_args: Any, stream: Any, new_shape: bool = False,
             out: Any = None) -> Any:
    """The result of a remembered call (None when ``key`` is not remembered): ``out``, or a new tensor
    shaped like ``like`` (``new_shape``: of the remembered result's shape, on ``like``'s device), written by the
    remembered plan with ``make_args(result)``. The key holds every input's shape, so a remembered result's
    shape is this call's."""
    found = _lookup(key)
    if found is None:
        return None
    plan, dtype, _, index, shape = found
    if out is not None:
        result = out
    elif new_shape:  # on the result's device (the key holds it): 4.7 against 5.5 us for torch.empty
        result = like.new_empty(shape, dtype=dtype)
    else:  # `like` is a contiguous tensor (the key says so): empty_like parses fewer arguments
        result = sys.modules["torch"].empty_like(like, dtype=dtype)
    args = make_args(result)
    if stream is not None or not plan.run_trusted(args, index):
        plan.run(args, stream=stream)
    return result


def remembered(key: tuple | None) -> tuple[Plan, Any, Any, int] | None:
    """``(plan, result dtype, result device, its index)`` remembered under ``key``, or None."""
    found = _lookup(key)
    return None if found is None else found[:4]


def remembered_plan(key: tuple | None) -> Plan | None:
    """The plan remembered under ``key`` (for calls that write into a given ``out=``), or None."""
    found = _lookup(key)
    return None if found is None else found[0]


def remember_fast(key: tuple | None, plan: Plan, result: Any) -> None:
    """Remember ``plan`` and ``result``'s dtype, device and shape under ``key`` (None or unhashable: nothing)."""
    if key is None:
        return
    try:
        hash(key)
    except TypeError:
        return
    if len(_FAST_PLANS) >= _FAST_PLANS_LIMIT:
        _FAST_PLANS.clear()
    _FAST_PLANS[key] = (plan, result.dtype, result.device, result.device.index, result.shape)


def operand(obj: Any, where: str, argument: str) -> Operand:
    """An input array, adapted and required C-contiguous, named ``argument`` in errors."""
    op = adapt(obj, where, argument)
    require_contiguous(op, where, argument)
    return op


def resolve_dtype(dtype: Any, where: str, argument: str = "dtype") -> ElementKind:
    try:
        return element_kind(dtype)
    except TypeError as exc:
        raise InvalidProblem(f"{where}: {exc}".replace("dtype expected", f"{argument} expected", 1)) from None


def scalar_zero_point(zero_point: Any, element: ElementKind) -> Any:
    """A per-tensor zero point: None means 0 for integers; FP8 takes none (the plan rejects others)."""
    return 0 if zero_point is None and not element.is_fp8 else zero_point


def default_q_range(element: ElementKind, q_min: int | None, q_max: int | None) -> tuple[int, int]:
    """``q_min`` / ``q_max``, defaulting to the integer element's full range (FP8: ``+-fp8_max``)."""
    low, high = element.q_range if (element.is_integer or element.is_fp8) else (0, 0)
    return (low if q_min is None else q_min), (high if q_max is None else q_max)


def output_operand(out: Any, like: Operand, shape: tuple[int, ...], element: ElementKind, where: str) -> Operand:
    """``out=`` adapted and checked against the expected shape and element, or a new array."""
    if out is None:
        return allocate_like(like, shape, element)
    op = operand(out, where, "out")
    if op.shape != shape:
        raise InvalidProblem(problem_message(where, "out", f"shape {shape}", op.shape))
    if op.element is not element:
        raise InvalidProblem(problem_message(where, "out", f"dtype {element.short}", op.element.short))
    return op


def _converted(obj: Any, element: ElementKind) -> Any:
    """``obj`` cast to ``element`` by its own framework (NumPy, torch, CuPy), or None if it cannot."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return obj.to({ElementKind.F32: torch.float32, ElementKind.F64: torch.float64,
                       ElementKind.I32: torch.int32}[element]).contiguous()
    if isinstance(obj, (list, tuple, np.ndarray, np.generic)):
        return np.ascontiguousarray(obj, dtype=element.numpy_dtype)
    if type(obj).__module__.startswith("cupy"):
        return obj.astype(element.numpy_dtype)
    return None


def coerced(obj: Any, element: ElementKind, count: int, where: str, argument: str) -> Operand:
    """``obj`` as ``count`` contiguous elements of ``element``, converted by its framework if needed."""
    try:
        op = adapt(obj, where, argument)
    except InvalidOperand:
        op = None
    if op is None or op.element is not element:
        converted = _converted(obj, element)
        if converted is None:
            given = op.element.short if op is not None else type(obj).__name__
            raise InvalidProblem(problem_message(where, argument, f"{element.short} elements", given))
        if element is ElementKind.I32 and op is not None and op.element.is_float:
            raise InvalidProblem(problem_message(where, argument, "integer zero points", op.element.short))
        op = adapt(converted, where, argument)
    require_contiguous(op, where, argument)
    if op.size != count:
        raise InvalidProblem(problem_message(where, argument, f"{count} elements", f"{op.size} (shape {op.shape})"))
    return op


def zeros_like_kind(like: Operand, count: int, element: ElementKind) -> Operand:
    """A zero-filled 1-D array of ``count`` elements, of the kind of ``like``."""
    torch = sys.modules.get("torch")
    if like.origin == "torch" and torch is not None:
        return adapt(torch.zeros(count, dtype=torch.int32, device=like.obj.device), "zeros", "zero_point")
    if like.origin == "cupy":
        import cupy

        return adapt(cupy.zeros(count, dtype=element.numpy_dtype), "zeros", "zero_point")
    if like.on_host or like.origin == "numpy":
        return adapt(np.zeros(count, element.numpy_dtype), "zeros", "zero_point")
    return adapt(_device_zeros(count, element, like.device_id), "zeros", "zero_point")


# numba device zeros by (count, element, device): the kernels only read zero points, and a new array per call
# cost a device allocation and a synchronous copy (a per-group call on numba arrays took 10x its GPU time)
_DEVICE_ZEROS: dict[tuple[int, ElementKind, int], Any] = {}
_DEVICE_ZEROS_LIMIT = 8


def _device_zeros(count: int, element: ElementKind, device_id: int) -> Any:
    key = (count, element, device_id)
    found = _DEVICE_ZEROS.get(key)
    if found is None:
        from numba import cuda

        if len(_DEVICE_ZEROS) >= _DEVICE_ZEROS_LIMIT:
            _DEVICE_ZEROS.clear()
        with cuda.gpus[device_id]:
            found = _DEVICE_ZEROS[key] = cuda.to_device(np.zeros(count, element.numpy_dtype))
    return found


def scale_operands(scales: Any, zero_points: Any, count: int, float_element: ElementKind, like: Operand,
                   where: str, quantized_element: ElementKind | None = None, *, validate: str = "host",
                   reciprocal: bool = True, q_range: tuple[int, int] | None = None,
                   stream: Any = None) -> tuple[Operand, Operand]:
    """``scales`` in the math precision of ``float_element`` and ``zero_points`` as int32, each of
    ``count`` elements; converted by their own framework when needed (``zero_points=None``: zeros).
    An FP8 ``quantized_element`` has no zero points: ``zero_points`` passes through untouched for
    the plan to accept (None) or reject.

    Both are checked as ``validate`` says (:mod:`.checks`): scales finite and >= 0 (with a finite
    reciprocal where > 0 when ``reciprocal``), given zero points within ``q_range`` (None: the
    quantized element's integer range)."""
    scale_element = ElementKind.F64 if float_element is ElementKind.F64 else ElementKind.F32
    scale = coerced(scales, scale_element, count, where, "scales")
    if quantized_element is not None and quantized_element.is_fp8:
        check_operands(scale, None, where, validate, reciprocal, None, stream=stream)
        return scale, zero_points
    if zero_points is None:
        check_operands(scale, None, where, validate, reciprocal, None, stream=stream)
        return scale, zeros_like_kind(like, count, ElementKind.I32)
    zero_point = coerced(zero_points, ElementKind.I32, count, where, "zero_points")
    if q_range is None and quantized_element is not None and quantized_element.is_integer:
        q_range = quantized_element.int_range
    check_operands(scale, zero_point, where, validate, reciprocal, q_range, stream=stream)
    return scale, zero_point
