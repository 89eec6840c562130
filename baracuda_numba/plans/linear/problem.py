"""The W8A8 linear's descriptors and argument bundles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...vocabulary import ElementKind

__all__ = ["QuantizedLinearDescriptor", "QuantizedLinearArgs", "SmoothQuantLinearDescriptor", "SmoothQuantLinearArgs"]


@dataclass(frozen=True)
class QuantizedLinearDescriptor:
    """``x [m, k]`` float, ``weight [n, k]`` int8; the output has ``x``'s element.

    ``static_weight``: the caller promises that the weight, its scales and the bias are not written by
    the kernel launched just before the call on its stream (true of a model's weights, written once
    at load). The one-launch decode kernel then loads its first weight before it waits for that kernel
    (a programmatic dependent launch), so its weight stream starts under that kernel's tail.

    ``static_activation``: ``x`` is quantized with one given per-tensor scale (``QuantizedLinearArgs.act_scale``,
    SmoothQuant's static W8A8: ``clamp(rint(x / act_scale), -127, 127)``, as
    :class:`~baracuda_numba.plans.per_tensor.QuantizePerTensorPlan` with zero point 0) instead of per token;
    16- or 32-bit ``x``. At decode, where the fused prologue is compiled for the shape, one kernel quantizes
    and multiplies; elsewhere the static quantizer (:mod:`baracuda_numba.kernels.linear.static_quantizer`)
    runs first, or, where ``x`` is not whole 16-byte pieces at a 16-byte address, the per-tensor plan and a
    fill of the row scales.
    """

    m: int
    n: int
    k: int
    input_element: ElementKind
    output_element: ElementKind
    has_bias: bool = False
    static_weight: bool = False
    static_activation: bool = False


@dataclass
class QuantizedLinearArgs:
    """The arrays of one call: ``input [m, k]`` float, ``weight [n, k]`` int8, ``weight_scale [n]`` float32
    (finite and > 0; checked on host arrays, see :func:`baracuda_numba.quantized_linear`), ``output [m, n]``,
    ``bias [n]`` float32 or None, ``act_scale`` the static per-tensor activation scale (``static_activation``
    only)."""

    input: Any
    weight: Any
    weight_scale: Any
    output: Any
    bias: Any = None
    act_scale: Any = None


@dataclass(frozen=True)
class SmoothQuantLinearDescriptor:
    """``act_q [m, k]`` int8 with one static scale, ``weight [n, k]`` int8.

    The decode GEMM is launched as a programmatic dependent of the kernel before it (the activations'
    quantizer, say), and waits for it before it reads anything. ``static_weight``: as
    :class:`QuantizedLinearDescriptor`'s; the GEMM then loads its column parameters and first weight
    before that wait, and reads ``act_q`` after it.
    """

    m: int
    n: int
    k: int
    output_element: ElementKind
    has_bias: bool = False
    static_weight: bool = False


@dataclass
class SmoothQuantLinearArgs:
    """The arrays of one call: ``input [m, k]`` int8 (smoothed and quantized), ``weight [n, k]`` int8,
    ``weight_scale [n]`` float32, ``act_scale`` the static per-tensor activation scale, ``output [m, n]``,
    ``bias [n]`` float32 or None."""

    input: Any
    weight: Any
    weight_scale: Any
    act_scale: float
    output: Any
    bias: Any = None
