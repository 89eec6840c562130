"""Per-channel, per-token and per-group plans: the per-tensor ops with one ``(scale, zero_point)``
pair per segment of the tensor.

- per channel: any rank, ``scale`` / ``zero_point`` of length ``shape[axis]``;
- per token: ``input [n, d]``, one pair per row (``[n]``);
- per group: ``input [outer_size, axis_size]``, groups of ``group_size`` consecutive elements along
  the last axis, ``scale`` / ``zero_point`` ``[outer_size, axis_size // group_size]``.

Every plan of a family shares its shape fields; ``input_element`` is the float element and
``output_element`` the integer element (as in baracuda-kernels). The math is the README's
"Semantics" section (and :mod:`baracuda_numba.kernels.elementwise`), the
same for every family (one inclusive STE mask, one reciprocal convention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import InvalidProblem, problem_message
from ..vocabulary import ElementKind, QuantizeKind
from .base import ArrayScalePlan

__all__ = [
    "QuantizeArrayArgs", "QuantizeBackwardArrayArgs", "DequantizeArrayArgs", "DequantizeBackwardArrayArgs",
    "QuantizePerChannelDescriptor", "QuantizePerChannelBackwardDescriptor",
    "DequantizePerChannelDescriptor", "DequantizePerChannelBackwardDescriptor",
    "QuantizePerChannelArgs", "QuantizePerChannelBackwardArgs", "DequantizePerChannelArgs",
    "DequantizePerChannelBackwardArgs",
    "QuantizePerChannelPlan", "QuantizePerChannelBackwardPlan", "DequantizePerChannelPlan",
    "DequantizePerChannelBackwardPlan",
    "QuantizePerTokenDescriptor", "QuantizePerTokenBackwardDescriptor", "DequantizePerTokenDescriptor",
    "DequantizePerTokenBackwardDescriptor",
    "QuantizePerTokenArgs", "QuantizePerTokenBackwardArgs", "DequantizePerTokenArgs", "DequantizePerTokenBackwardArgs",
    "QuantizePerTokenPlan", "QuantizePerTokenBackwardPlan", "DequantizePerTokenPlan", "DequantizePerTokenBackwardPlan",
    "QuantizePerGroupDescriptor", "QuantizePerGroupBackwardDescriptor", "DequantizePerGroupDescriptor",
    "DequantizePerGroupBackwardDescriptor",
    "QuantizePerGroupArgs", "QuantizePerGroupBackwardArgs", "DequantizePerGroupArgs", "DequantizePerGroupBackwardArgs",
    "QuantizePerGroupPlan", "QuantizePerGroupBackwardPlan", "DequantizePerGroupPlan", "DequantizePerGroupBackwardPlan",
]


# -- Args: the same four layouts for every family -------------------------------------------------


@dataclass
class QuantizeArrayArgs:
    input: Any  # float
    scale: Any  # float32 (float64 for f64 input), one per segment
    zero_point: Any  # int32, one per segment
    output: Any  # int


@dataclass
class QuantizeBackwardArrayArgs:
    input: Any  # saved forward input
    scale: Any
    zero_point: Any
    d_output: Any
    d_input: Any


@dataclass
class DequantizeArrayArgs:
    input: Any  # int
    scale: Any
    zero_point: Any
    output: Any  # float


@dataclass
class DequantizeBackwardArrayArgs:
    scale: Any
    d_output: Any
    d_input: Any


# -- the four ops, as roles over the Args fields --------------------------------------------------


class _CheckedScales(ArrayScalePlan):
    """Scales and zero points whose bytes are on the host are checked when the arguments are bound (so
    ``can_implement`` reports them too): scales finite and >= 0, invertible where > 0 when the op multiplies
    by the reciprocal, zero points in the q range (``baracuda_numba/ops/checks.py``). Device arrays are
    the caller's to check (``check_scales``, or the dispatch functions' ``validate="device"``): a plan's
    ``run`` never waits for the GPU."""

    RECIPROCAL: ClassVar[bool] = True

    def _scale_operands(self, args: Any) -> tuple[Any, Any]:
        scale, zero_point = super()._scale_operands(args)
        if scale.host is not None or (zero_point is not None and zero_point.host is not None):
            from ..ops.checks import check_operands  # ops imports plans: bound here, not at import

            element = self.desc.output_element
            q_range = ((self.desc.q_min, self.desc.q_max) if self.HAS_Q_RANGE
                       else element.int_range if element.is_integer else None)
            check_operands(scale, zero_point, self.name, "host", self.RECIPROCAL, q_range,
                           names=("scale", "zero_point"))
        return scale, zero_point


class _Quantize(_CheckedScales):
    A_FIELD, OUT_FIELD = "input", "output"


class _QuantizeBackward(_CheckedScales):
    A_FIELD, B_FIELD, OUT_FIELD = "d_output", "input", "d_input"


class _Dequantize(_CheckedScales):
    A_FIELD, OUT_FIELD = "input", "output"
    HAS_Q_RANGE = False
    RECIPROCAL = False


class _DequantizeBackward(_CheckedScales):
    A_FIELD, OUT_FIELD = "d_output", "d_input"
    HAS_Q_RANGE = False
    READS_ZERO_POINT = False
    RECIPROCAL = False


def _non_negative(plan: str, name: str, value: int) -> None:
    if value < 0:
        raise InvalidProblem(problem_message(plan, name, ">= 0", value))


# -- per channel ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DequantizePerChannelDescriptor:
    """``shape`` of the tensor (any rank) and the ``axis`` whose index selects the scale."""

    shape: tuple[int, ...]
    axis: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass(frozen=True)
class DequantizePerChannelBackwardDescriptor(DequantizePerChannelDescriptor):
    pass


@dataclass(frozen=True)
class QuantizePerChannelDescriptor:
    """``shape`` of the tensor (any rank), the channel ``axis`` and the clamp range."""

    shape: tuple[int, ...]
    axis: int
    q_min: int
    q_max: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass(frozen=True)
class QuantizePerChannelBackwardDescriptor(QuantizePerChannelDescriptor):
    pass


class _PerChannel:
    """``segment = (i // prod(shape[axis+1:])) % shape[axis]``."""

    @classmethod
    def _validate_shape(cls, desc: Any) -> None:
        name = cls.__name__
        try:
            shape = tuple(int(d) for d in desc.shape)
        except (TypeError, ValueError):
            raise InvalidProblem(problem_message(name, "shape", "a tuple of integers", repr(desc.shape))) from None
        for d in shape:
            _non_negative(name, "shape", d)
        rank = len(shape)
        if not -rank <= desc.axis < rank:
            raise InvalidProblem(problem_message(name, "axis", f"in [{-rank}, {rank}) for shape {shape}", desc.axis))
        object.__setattr__(desc, "shape", shape)
        object.__setattr__(desc, "axis", desc.axis % rank)

    def _numel(self) -> int:
        return math.prod(self.desc.shape)

    def _segments(self) -> tuple[int, int]:
        return max(1, math.prod(self.desc.shape[self.desc.axis + 1:])), max(1, self.desc.shape[self.desc.axis])

    def _segment_count(self) -> int:
        return self.desc.shape[self.desc.axis]


class QuantizePerChannelArgs(QuantizeArrayArgs):
    pass


class QuantizePerChannelBackwardArgs(QuantizeBackwardArrayArgs):
    pass


class DequantizePerChannelArgs(DequantizeArrayArgs):
    pass


class DequantizePerChannelBackwardArgs(DequantizeBackwardArrayArgs):
    pass


class QuantizePerChannelPlan(_PerChannel, _Quantize):
    """``q[..., c, ...] = clamp(round(x[..., c, ...] / scale[c]) + zero_point[c], q_min, q_max)``."""

    KIND, Descriptor, Args = QuantizeKind.PER_CHANNEL, QuantizePerChannelDescriptor, QuantizePerChannelArgs


class QuantizePerChannelBackwardPlan(_PerChannel, _QuantizeBackward):
    """``dx = dy / scale[c] * mask``."""

    KIND, Descriptor, Args = (QuantizeKind.PER_CHANNEL_BACKWARD, QuantizePerChannelBackwardDescriptor,
                              QuantizePerChannelBackwardArgs)


class DequantizePerChannelPlan(_PerChannel, _Dequantize):
    """``x[..., c, ...] = (q[..., c, ...] - zero_point[c]) * scale[c]``."""

    KIND, Descriptor, Args = (QuantizeKind.DEQUANTIZE_PER_CHANNEL, DequantizePerChannelDescriptor,
                              DequantizePerChannelArgs)


class DequantizePerChannelBackwardPlan(_PerChannel, _DequantizeBackward):
    """``dq = dy * scale[c]``."""

    KIND, Descriptor, Args = (QuantizeKind.DEQUANTIZE_PER_CHANNEL_BACKWARD, DequantizePerChannelBackwardDescriptor,
                              DequantizePerChannelBackwardArgs)


# -- per token ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DequantizePerTokenDescriptor:
    """``input [n, d]``: ``n`` token rows of ``d`` features."""

    n: int
    d: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass(frozen=True)
class DequantizePerTokenBackwardDescriptor(DequantizePerTokenDescriptor):
    pass


@dataclass(frozen=True)
class QuantizePerTokenDescriptor:
    """``input [n, d]`` and the clamp range."""

    n: int
    d: int
    q_min: int
    q_max: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass(frozen=True)
class QuantizePerTokenBackwardDescriptor(QuantizePerTokenDescriptor):
    pass


class _PerToken:
    """``segment = i // d`` (the row)."""

    @classmethod
    def _validate_shape(cls, desc: Any) -> None:
        _non_negative(cls.__name__, "n", desc.n)
        _non_negative(cls.__name__, "d", desc.d)

    def _numel(self) -> int:
        return self.desc.n * self.desc.d

    def _segments(self) -> tuple[int, int]:
        return max(1, self.desc.d), 1

    def _segment_count(self) -> int:
        return self.desc.n


class QuantizePerTokenArgs(QuantizeArrayArgs):
    pass


class QuantizePerTokenBackwardArgs(QuantizeBackwardArrayArgs):
    pass


class DequantizePerTokenArgs(DequantizeArrayArgs):
    pass


class DequantizePerTokenBackwardArgs(DequantizeBackwardArrayArgs):
    pass


class QuantizePerTokenPlan(_PerToken, _Quantize):
    """``q[t, :] = clamp(round(x[t, :] / scale[t]) + zero_point[t], q_min, q_max)``."""

    KIND, Descriptor, Args = QuantizeKind.PER_TOKEN, QuantizePerTokenDescriptor, QuantizePerTokenArgs


class QuantizePerTokenBackwardPlan(_PerToken, _QuantizeBackward):
    """``dx = dy / scale[t] * mask`` (inclusive mask, unlike baracuda-kernels' strict one)."""

    KIND, Descriptor, Args = (QuantizeKind.PER_TOKEN_BACKWARD, QuantizePerTokenBackwardDescriptor,
                              QuantizePerTokenBackwardArgs)


class DequantizePerTokenPlan(_PerToken, _Dequantize):
    """``x[t, :] = (q[t, :] - zero_point[t]) * scale[t]``."""

    KIND, Descriptor, Args = QuantizeKind.DEQUANTIZE_PER_TOKEN, DequantizePerTokenDescriptor, DequantizePerTokenArgs


class DequantizePerTokenBackwardPlan(_PerToken, _DequantizeBackward):
    """``dq = dy * scale[t]``."""

    KIND, Descriptor, Args = (QuantizeKind.DEQUANTIZE_PER_TOKEN_BACKWARD, DequantizePerTokenBackwardDescriptor,
                              DequantizePerTokenBackwardArgs)


# -- per group ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DequantizePerGroupDescriptor:
    """``input [outer_size, axis_size]`` in groups of ``group_size`` along the last axis."""

    outer_size: int
    axis_size: int
    group_size: int
    input_element: ElementKind
    output_element: ElementKind

    @property
    def num_groups(self) -> int:
        return self.axis_size // self.group_size if self.group_size > 0 else 0


@dataclass(frozen=True)
class DequantizePerGroupBackwardDescriptor(DequantizePerGroupDescriptor):
    pass


@dataclass(frozen=True)
class QuantizePerGroupDescriptor:
    """``input [outer_size, axis_size]`` in groups of ``group_size``, and the clamp range."""

    outer_size: int
    axis_size: int
    group_size: int
    q_min: int
    q_max: int
    input_element: ElementKind
    output_element: ElementKind

    @property
    def num_groups(self) -> int:
        return self.axis_size // self.group_size if self.group_size > 0 else 0


@dataclass(frozen=True)
class QuantizePerGroupBackwardDescriptor(QuantizePerGroupDescriptor):
    pass


class _PerGroup:
    """``segment = i // group_size`` (row-major ``[outer_size, num_groups]``)."""

    @classmethod
    def _validate_shape(cls, desc: Any) -> None:
        name = cls.__name__
        _non_negative(name, "outer_size", desc.outer_size)
        _non_negative(name, "axis_size", desc.axis_size)
        if desc.group_size <= 0:
            raise InvalidProblem(problem_message(name, "group_size", "> 0", desc.group_size))
        if desc.axis_size % desc.group_size:
            raise InvalidProblem(problem_message(
                name, "group_size", f"a divisor of axis_size ({desc.axis_size})", desc.group_size))

    def _numel(self) -> int:
        return self.desc.outer_size * self.desc.axis_size

    def _segments(self) -> tuple[int, int]:
        return self.desc.group_size, 1

    def _segment_count(self) -> int:
        return self.desc.outer_size * self.desc.num_groups


class QuantizePerGroupArgs(QuantizeArrayArgs):
    pass


class QuantizePerGroupBackwardArgs(QuantizeBackwardArrayArgs):
    pass


class DequantizePerGroupArgs(DequantizeArrayArgs):
    pass


class DequantizePerGroupBackwardArgs(DequantizeBackwardArrayArgs):
    pass


class QuantizePerGroupPlan(_PerGroup, _Quantize):
    """``q[o, g*G + k] = clamp(round(x / scale[o, g]) + zero_point[o, g], q_min, q_max)``."""

    KIND, Descriptor, Args = QuantizeKind.PER_GROUP, QuantizePerGroupDescriptor, QuantizePerGroupArgs


class QuantizePerGroupBackwardPlan(_PerGroup, _QuantizeBackward):
    """``dx = dy / scale[o, g] * mask`` (inclusive mask, unlike baracuda-kernels' strict one)."""

    KIND, Descriptor, Args = (QuantizeKind.PER_GROUP_BACKWARD, QuantizePerGroupBackwardDescriptor,
                              QuantizePerGroupBackwardArgs)


class DequantizePerGroupPlan(_PerGroup, _Dequantize):
    """``x[o, g*G + k] = (q - zero_point[o, g]) * scale[o, g]``."""

    KIND, Descriptor, Args = QuantizeKind.DEQUANTIZE_PER_GROUP, DequantizePerGroupDescriptor, DequantizePerGroupArgs


class DequantizePerGroupBackwardPlan(_PerGroup, _DequantizeBackward):
    """``dq = dy * scale[o, g]``."""

    KIND, Descriptor, Args = (QuantizeKind.DEQUANTIZE_PER_GROUP_BACKWARD, DequantizePerGroupBackwardDescriptor,
                              DequantizePerGroupBackwardArgs)

