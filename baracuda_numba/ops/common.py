"""What every dispatch function does: adapt inputs, resolve dtypes and q ranges, select a plan
(cached on its descriptor), allocate or check ``out=``."""

from __future__ import annotations

import functools
from typing import Any

from ..arrays import Operand, adapt, allocate_like, require_contiguous
from ..errors import InvalidProblem, problem_message
from ..plans.base import Plan
from ..vocabulary import ElementKind, element_kind

__all__ = ["operand", "select_plan", "resolve_dtype", "default_q_range", "output_operand", "clear_plan_cache"]


@functools.lru_cache(maxsize=1024)
def select_plan(plan_type: type[Plan], desc: Any) -> Plan:
    """``plan_type.select(desc)``, cached on the (frozen, hashable) descriptor."""
    return plan_type.select(desc)


def clear_plan_cache() -> None:
    """Forget every cached plan (compiled kernels stay cached in the registry)."""
    select_plan.cache_clear()


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


def default_q_range(element: ElementKind, q_min: int | None, q_max: int | None) -> tuple[int, int]:
    """``q_min`` / ``q_max``, defaulting to the integer element's full range."""
    low, high = element.int_range if element.is_integer else (0, 0)
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
