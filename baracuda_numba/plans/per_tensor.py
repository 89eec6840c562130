"""The six per-tensor plans: quantize, dequantize and fake-quantize, forward and backward.

One scalar ``scale`` (float, > 0) and ``zero_point`` (int) for the whole tensor; operands are any
shape with ``numel`` elements, C-contiguous. ``input_element`` is the float element and
``output_element`` the integer element for every plan of the family (as in baracuda-kernels).
The math is in :mod:`baracuda_numba.kernels.elementwise`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import InvalidProblem, Unsupported, problem_message
from ..kernels.elementwise import ElementwiseOp
from ..vocabulary import ElementKind, KernelSku, MathPrecision, PrecisionGuarantee, QuantizeKind
from .base import ElementwisePlan, check_no_zero_point, check_numel, checked_scale, checked_zero_point

__all__ = [
    "QuantizePerTensorDescriptor", "QuantizePerTensorArgs", "QuantizePerTensorPlan",
    "QuantizePerTensorBackwardDescriptor", "QuantizePerTensorBackwardArgs", "QuantizePerTensorBackwardPlan",
    "DequantizePerTensorDescriptor", "DequantizePerTensorArgs", "DequantizePerTensorPlan",
    "DequantizePerTensorBackwardDescriptor", "DequantizePerTensorBackwardArgs", "DequantizePerTensorBackwardPlan",
    "FakeQuantizeDescriptor", "FakeQuantizeArgs", "FakeQuantizePlan",
    "FakeQuantizeBackwardDescriptor", "FakeQuantizeBackwardArgs", "FakeQuantizeBackwardPlan",
    "FAKE_QUANTIZE_Q_LIMIT",
]

_PLAIN = (int, float, type(None))  # hashable scalars whose validated parameters a plan may cache

# Fake-quantize ranges stay within +-2**24 so every grid point is exact in float32.
FAKE_QUANTIZE_Q_LIMIT = 2**24


@dataclass(frozen=True)
class QuantizePerTensorDescriptor:
    """``q = clamp(round(x / scale) + zero_point, q_min, q_max)`` over ``numel`` elements."""

    numel: int
    q_min: int
    q_max: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass
class QuantizePerTensorArgs:
    input: Any  # float [numel]
    scale: float
    zero_point: int
    output: Any  # int [numel]


@dataclass(frozen=True)
class QuantizePerTensorBackwardDescriptor:
    """STE gradient of quantize: ``dx = dy / scale * [q_min <= round(x / scale) + zp <= q_max]``."""

    numel: int
    q_min: int
    q_max: int
    input_element: ElementKind
    output_element: ElementKind  # the forward's int element; the gradient is float


@dataclass
class QuantizePerTensorBackwardArgs:
    input: Any  # saved forward input, float [numel]
    scale: float
    zero_point: int
    d_output: Any  # float [numel]
    d_input: Any  # float [numel]


@dataclass(frozen=True)
class DequantizePerTensorDescriptor:
    """``x = (q - zero_point) * scale``; ``input_element`` is the float result, ``output_element`` q's."""

    numel: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass
class DequantizePerTensorArgs:
    input: Any  # int [numel]
    scale: float
    zero_point: int
    output: Any  # float [numel]


@dataclass(frozen=True)
class DequantizePerTensorBackwardDescriptor:
    """``dq = dy * scale`` (the gradient reaching the int operand, as float)."""

    numel: int
    input_element: ElementKind
    output_element: ElementKind  # the forward's int element


@dataclass
class DequantizePerTensorBackwardArgs:
    scale: float
    d_output: Any  # float [numel]
    d_input: Any  # float [numel]


@dataclass(frozen=True)
class FakeQuantizeDescriptor:
    """``y = (clamp(round(x * (1/scale)) + zp, q_min, q_max) - zp) * scale`` in the input's dtype.

    ``grid_element``: an FP8 element to round to instead of the integers
    (``y = fp8_round(clamp(x * (1/scale), q_min, q_max)) * scale``, no zero point); None: integers.
    ``torch_compat`` (float64 data only; the other dtypes already agree with PyTorch) computes as
    ``torch.fake_quantize_per_tensor_affine`` does: the scale and its reciprocal in float32, the grid
    point ``round(x * (1/scale))`` in float64, the product ``(q - zp) * scale`` in float32.
    """

    numel: int
    q_min: int
    q_max: int
    input_element: ElementKind
    grid_element: ElementKind | None = None
    torch_compat: bool = False


@dataclass
class FakeQuantizeArgs:
    input: Any
    scale: float
    zero_point: int
    output: Any


@dataclass(frozen=True)
class FakeQuantizeBackwardDescriptor:
    """``dx = dy * [q_min <= round(x * (1/scale)) + zp <= q_max]`` (FP8 ``grid_element``:
    ``[q_min <= x * (1/scale) <= q_max]``); ``torch_compat`` as in :class:`FakeQuantizeDescriptor`
    (the reciprocal in float32 for float64 data)."""

    numel: int
    q_min: int
    q_max: int
    input_element: ElementKind
    grid_element: ElementKind | None = None
    torch_compat: bool = False


@dataclass
class FakeQuantizeBackwardArgs:
    input: Any
    scale: float
    zero_point: int
    d_output: Any
    d_input: Any


class _PerTensorPlan(ElementwisePlan):
    """One scalar scale and zero point for the whole tensor."""

    @classmethod
    def _validate_shape(cls, desc: Any) -> None:
        check_numel(cls.__name__, desc.numel)

    def _zero_point_range(self) -> tuple[int, int]:
        if self.HAS_Q_RANGE:
            return self.desc.q_min, self.desc.q_max
        return self.desc.output_element.int_range

    def _scalars(self, args: Any) -> tuple:
        key = (args.scale, getattr(args, "zero_point", 0))
        cached = self._scalar_cache.get(key) if type(key[0]) in _PLAIN and type(key[1]) in _PLAIN else None
        if cached is None:
            cached = self._checked_scalars(args)
            if type(key[0]) in _PLAIN and type(key[1]) in _PLAIN:
                if len(self._scalar_cache) > 64:
                    self._scalar_cache.clear()
                self._scalar_cache[key] = cached
        return cached

    def _checked_scalars(self, args: Any) -> tuple:
        """``(inv, scale, zero_point, q_min, q_max)`` in the math precision, validated."""
        M = self._math
        inv, scale = checked_scale(self.name, args.scale, M)
        if self._grid_element is not None:
            check_no_zero_point(self.name, args.zero_point, self._grid_element)
            q_min, q_max = (self.desc.q_min, self.desc.q_max) if self.HAS_Q_RANGE else (0, 0)
            return inv, scale, M(0), M(q_min), M(q_max)
        zero_point = checked_zero_point(self.name, args.zero_point, *self._zero_point_range())
        if self.HAS_Q_RANGE:
            return inv, scale, M(zero_point), M(self.desc.q_min), M(self.desc.q_max)
        return inv, scale, M(zero_point), M(0), M(0)

    def _prepare(self) -> None:
        super()._prepare()
        self._scalar_cache: dict = {}


class QuantizePerTensorPlan(_PerTensorPlan):
    """Quantize with one scale and zero point: float ``input`` -> int ``output``."""

    KIND = QuantizeKind.PER_TENSOR
    Descriptor = QuantizePerTensorDescriptor
    Args = QuantizePerTensorArgs
    A_FIELD, OUT_FIELD = "input", "output"


class QuantizePerTensorBackwardPlan(_PerTensorPlan):
    """Straight-through gradient of :class:`QuantizePerTensorPlan` (with the ``1/scale`` factor)."""

    KIND = QuantizeKind.PER_TENSOR_BACKWARD
    Descriptor = QuantizePerTensorBackwardDescriptor
    Args = QuantizePerTensorBackwardArgs
    A_FIELD, B_FIELD, OUT_FIELD = "d_output", "input", "d_input"


class DequantizePerTensorPlan(_PerTensorPlan):
    """Dequantize with one scale and zero point: int ``input`` -> float ``output``."""

    KIND = QuantizeKind.DEQUANTIZE_PER_TENSOR
    Descriptor = DequantizePerTensorDescriptor
    Args = DequantizePerTensorArgs
    A_FIELD, OUT_FIELD = "input", "output"
    HAS_Q_RANGE = False


class DequantizePerTensorBackwardPlan(_PerTensorPlan):
    """Gradient of :class:`DequantizePerTensorPlan` with respect to its int input."""

    KIND = QuantizeKind.DEQUANTIZE_PER_TENSOR_BACKWARD
    Descriptor = DequantizePerTensorBackwardDescriptor
    Args = DequantizePerTensorBackwardArgs
    A_FIELD, OUT_FIELD = "d_output", "d_input"
    HAS_Q_RANGE = False

    def _checked_scalars(self, args: Any) -> tuple:
        M = self._math
        inv, scale = checked_scale(self.name, args.scale, M)
        return inv, scale, M(0), M(0), M(0)


class FakeQuantizePlan(_PerTensorPlan):
    """Quantize then dequantize in one pass, in the input's float dtype."""

    KIND = QuantizeKind.FAKE_QUANTIZE
    Descriptor = FakeQuantizeDescriptor
    Args = FakeQuantizeArgs
    A_FIELD, OUT_FIELD = "input", "output"

    @classmethod
    def _registry_elements(cls, desc: Any) -> tuple[ElementKind, ElementKind]:
        return desc.input_element, desc.grid_element or desc.input_element

    @classmethod
    def _grid(cls, desc: Any) -> ElementKind | None:
        grid = desc.grid_element
        if grid is not None and not grid.is_fp8:
            raise Unsupported(problem_message(cls.__name__, "grid_element", "an FP8 element or None (4-bit grids: "
                                              "FakeQuantizePerGroupPlan)", grid.short))
        return grid

    @classmethod
    def _q_limits(cls, desc: Any) -> tuple[int, int]:
        if cls._grid(desc) is not None:
            return desc.grid_element.q_range
        return -FAKE_QUANTIZE_Q_LIMIT, FAKE_QUANTIZE_Q_LIMIT

    @classmethod
    def _validate_shape(cls, desc: Any) -> None:
        super()._validate_shape(desc)
        if not isinstance(desc.torch_compat, (bool, np.bool_)):
            raise InvalidProblem(problem_message(cls.__name__, "torch_compat", "a bool", repr(desc.torch_compat)))

    @property
    def _torch_float64(self) -> bool:
        """PyTorch's float64 contract applies (it differs from ours only for float64 data)."""
        return (bool(self.desc.torch_compat) and self.desc.input_element is ElementKind.F64
                and self.desc.grid_element is None)

    def _kernel_op(self) -> ElementwiseOp | None:
        return ElementwiseOp.FAKE_QUANTIZE_F32_PRODUCT if self._torch_float64 else None

    def _checked_scalars(self, args: Any) -> tuple:
        scalars = super()._checked_scalars(args)
        if not self._torch_float64:
            return scalars
        inv, scale = checked_scale(self.name, args.scale, np.float32)
        return (np.float64(inv), np.float64(scale), *scalars[2:])

    def precision_guarantee(self) -> PrecisionGuarantee:
        """With ``torch_compat`` on float64 data the scale, its reciprocal and the product are float32."""
        guarantee = super().precision_guarantee()
        if self._torch_float64:
            return replace(guarantee, math_precision=MathPrecision.F32, accumulator=ElementKind.F32)
        return guarantee

    def sku(self) -> KernelSku:
        return replace(super().sku(), precision_guarantee=self.precision_guarantee())


class FakeQuantizeBackwardPlan(FakeQuantizePlan):
    """Straight-through gradient of :class:`FakeQuantizePlan`: ``dy`` where ``x`` was in range."""

    KIND = QuantizeKind.FAKE_QUANTIZE_BACKWARD
    Descriptor = FakeQuantizeBackwardDescriptor
    Args = FakeQuantizeBackwardArgs
    A_FIELD, B_FIELD, OUT_FIELD = "d_output", "input", "d_input"

    def _kernel_op(self) -> ElementwiseOp | None:
        return None  # the mask needs only the float32 reciprocal, passed as a scalar
