"""Fake-quantize plans with array scales: per channel, per token and per group, forward and
straight-through backward, each one kernel of the elementwise family.

Forward ``y = (clamp(rint(x * inv[s]) + zp[s], q_min, q_max) - zp[s]) * scale[s]`` in the math
precision (float32; float64 for f64 data), rounded once to ``x``'s dtype, with ``inv = 1 / scale``
(0 where ``scale == 0``: the segment gives ``(clamp(zp) - zp) * 0``); NaN propagates, +-inf
saturate. Backward ``dx = dy * mask`` with the inclusive mask ``q_min <= rint(x * inv[s]) + zp[s] <=
q_max`` (false for NaN and where ``scale == 0``). The README's "Semantics" section; for f32 / f16 / bf16
data the bits of ``torch.fake_quantize_per_channel_affine`` and its autograd on finite inputs.

``output_element`` names the simulated grid: its range is the default and the bound of ``q_min`` /
``q_max``. Per channel and per token take int8 / uint8 grids; per group takes those and the 4-bit ones
(S4 / U4, which have no zero points for S4). The segment of flat element ``i`` is ``(i // seg_len) %
segments``: ``seg_len = prod(shape[axis + 1:])`` per channel, a row per token, ``group_size`` per group.
Scales are float32 (float64 for f64 data) and zero points int32, one per segment, C-contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import Unsupported, problem_message
from ..kernels.elementwise import chunk_elements
from ..vocabulary import ElementKind, QuantizeKind
from .per_axis import (
    QuantizeArrayArgs,
    QuantizeBackwardArrayArgs,
    _PerChannel,
    _PerGroup,
    _PerToken,
    _Quantize,
    _QuantizeBackward,
)

__all__ = [
    "FakeQuantizePerChannelDescriptor", "FakeQuantizePerChannelArgs", "FakeQuantizePerChannelPlan",
    "FakeQuantizePerChannelBackwardDescriptor", "FakeQuantizePerChannelBackwardArgs",
    "FakeQuantizePerChannelBackwardPlan",
    "FakeQuantizePerTokenDescriptor", "FakeQuantizePerTokenArgs", "FakeQuantizePerTokenPlan",
    "FakeQuantizePerTokenBackwardDescriptor", "FakeQuantizePerTokenBackwardArgs", "FakeQuantizePerTokenBackwardPlan",
    "FakeQuantizePerGroupDescriptor", "FakeQuantizePerGroupArgs", "FakeQuantizePerGroupPlan",
    "FakeQuantizePerGroupBackwardDescriptor", "FakeQuantizePerGroupBackwardArgs", "FakeQuantizePerGroupBackwardPlan",
]

INT_GRIDS = (ElementKind.S8, ElementKind.U8)
GROUP_GRIDS = (*INT_GRIDS, ElementKind.S4, ElementKind.U4)


class _FakeArrayPlan:
    """What the fake-quantize plans with array scales share (listed first among their bases): the grids
    they accept (``GRIDS``) and segments counted as ``(seg_len, number of segments)``, which index the
    flat tensor in either scale mode of their registry entries (4-bit entries index rows, int8 / uint8
    ones channels)."""

    GRIDS: ClassVar[tuple[ElementKind, ...]] = INT_GRIDS

    @classmethod
    def _validate_shape(cls, desc: Any) -> None:
        super()._validate_shape(desc)
        if desc.output_element not in cls.GRIDS:
            expected = " or ".join(e.short for e in cls.GRIDS)
            raise Unsupported(problem_message(cls.__name__, "output_element", f"{expected} (the simulated grid)",
                                              desc.output_element.short))

    def _segments(self) -> tuple[int, int]:
        seg_len, _ = super()._segments()
        count = max(1, self._segment_count())
        if count == 1:
            # One segment (one channel, one row, one group): any segment length past the tensor indexes
            # it, and a whole number of chunks keeps every chunk on one scale (no per-element lookups).
            G = chunk_elements(self.entry.a, self.entry.b, self.entry.out)
            seg_len = max(seg_len, -(-self._numel() // G) * G, 1)
        return seg_len, count


# -- per channel ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeQuantizePerChannelDescriptor:
    """``shape`` of the tensor (any rank), the channel ``axis``, the clamp range and the simulated
    ``output_element`` (s8 / u8)."""

    shape: tuple[int, ...]
    axis: int
    q_min: int
    q_max: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass(frozen=True)
class FakeQuantizePerChannelBackwardDescriptor(FakeQuantizePerChannelDescriptor):
    pass


class FakeQuantizePerChannelArgs(QuantizeArrayArgs):
    """``input`` float, ``scale`` / ``zero_point`` ``[shape[axis]]``, ``output`` float (``input``'s dtype)."""


class FakeQuantizePerChannelBackwardArgs(QuantizeBackwardArrayArgs):
    """``input`` the forward's input, ``d_output`` its gradient, ``d_input`` written."""


class FakeQuantizePerChannelPlan(_FakeArrayPlan, _PerChannel, _Quantize):
    """``y[..., c, ...] = (clamp(rint(x * inv[c]) + zp[c], q_min, q_max) - zp[c]) * scale[c]`` in one pass."""

    KIND, Descriptor, Args = QuantizeKind.FAKE_QUANTIZE, FakeQuantizePerChannelDescriptor, FakeQuantizePerChannelArgs


class FakeQuantizePerChannelBackwardPlan(_FakeArrayPlan, _PerChannel, _QuantizeBackward):
    """``dx[..., c, ...] = dy * [q_min <= rint(x * inv[c]) + zp[c] <= q_max]`` in one pass."""

    KIND, Descriptor, Args = (QuantizeKind.FAKE_QUANTIZE_BACKWARD, FakeQuantizePerChannelBackwardDescriptor,
                              FakeQuantizePerChannelBackwardArgs)


# -- per token ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeQuantizePerTokenDescriptor:
    """``input [n, d]`` (``n`` rows of ``d``), the clamp range and the simulated ``output_element``."""

    n: int
    d: int
    q_min: int
    q_max: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass(frozen=True)
class FakeQuantizePerTokenBackwardDescriptor(FakeQuantizePerTokenDescriptor):
    pass


class FakeQuantizePerTokenArgs(QuantizeArrayArgs):
    """``input`` float ``[n, d]``, ``scale`` / ``zero_point`` ``[n]``, ``output`` float."""


class FakeQuantizePerTokenBackwardArgs(QuantizeBackwardArrayArgs):
    """``input`` the forward's input, ``d_output`` its gradient, ``d_input`` written."""


class FakeQuantizePerTokenPlan(_FakeArrayPlan, _PerToken, _Quantize):
    """``y[t, :] = (clamp(rint(x[t, :] * inv[t]) + zp[t], q_min, q_max) - zp[t]) * scale[t]`` in one pass."""

    KIND, Descriptor, Args = QuantizeKind.FAKE_QUANTIZE, FakeQuantizePerTokenDescriptor, FakeQuantizePerTokenArgs


class FakeQuantizePerTokenBackwardPlan(_FakeArrayPlan, _PerToken, _QuantizeBackward):
    """``dx[t, :] = dy * [q_min <= rint(x[t, :] * inv[t]) + zp[t] <= q_max]`` in one pass."""

    KIND, Descriptor, Args = (QuantizeKind.FAKE_QUANTIZE_BACKWARD, FakeQuantizePerTokenBackwardDescriptor,
                              FakeQuantizePerTokenBackwardArgs)


# -- per group ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeQuantizePerGroupDescriptor:
    """``y = (clamp(rint(x / scale[o, g]) + zp[o, g], q_min, q_max) - zp[o, g]) * scale[o, g]`` over
    ``[outer_size, axis_size]`` in groups of ``group_size``; ``output_element`` names the simulated grid
    (s8 / u8, or the 4-bit S4 / U4) and the default range."""

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
class FakeQuantizePerGroupBackwardDescriptor(FakeQuantizePerGroupDescriptor):
    """``dx = dy * [q_min <= rint(x / scale[o, g]) + zp[o, g] <= q_max]`` (the straight-through estimator)."""


class FakeQuantizePerGroupArgs(QuantizeArrayArgs):
    """``input`` float ``[outer, axis]``, ``scale`` / ``zero_point`` ``[outer, axis / group_size]``, ``output``."""


class FakeQuantizePerGroupBackwardArgs(QuantizeBackwardArrayArgs):
    """``input`` the forward's input, ``d_output`` its gradient, ``d_input`` written."""


class FakeQuantizePerGroupPlan(_FakeArrayPlan, _PerGroup, _Quantize):
    """Fake-quantize per group, in the input's dtype (QAT of grouped int8 or 4-bit weights)."""

    KIND, Descriptor, Args = QuantizeKind.FAKE_QUANTIZE, FakeQuantizePerGroupDescriptor, FakeQuantizePerGroupArgs
    GRIDS = GROUP_GRIDS


class FakeQuantizePerGroupBackwardPlan(_FakeArrayPlan, _PerGroup, _QuantizeBackward):
    """Straight-through gradient of :class:`FakeQuantizePerGroupPlan`: ``dy`` where ``x`` was in range."""

    KIND, Descriptor, Args = (QuantizeKind.FAKE_QUANTIZE_BACKWARD, FakeQuantizePerGroupBackwardDescriptor,
                              FakeQuantizePerGroupBackwardArgs)
    GRIDS = GROUP_GRIDS
