"""W8A8 linear layers on tensor cores: :class:`QuantizedLinearPlan` (activations quantized per token in the
same call) and :class:`SmoothQuantLinearPlan` (pre-quantized activations with a static per-tensor scale).

``y[m, n] = scale_x[m] * weight_scale[n] * sum_k xq[m, k] * wq[n, k] (+ bias[n])``: int8 operands,
exact int32 accumulation (``k <= MAX_EXACT_K``), the epilogue in float32 as
``(f32(acc) * scale_x[m]) * weight_scale[n] + bias[n]``, stored in the output element. The weight
is ``[N, K]`` int8 row-major (``nn.Linear.weight``), ``weight_scale`` ``[N]`` float32, ``bias``
``[N]`` float32. Activations are quantized symmetric int8 in [-127, 127] per row
(:class:`~baracuda_numba.plans.dynamic.DynamicRangeQuantizePlan`) into the plan's workspace.

The layers (``docs/design-linear.md``): :mod:`.tuning` (the device's properties and a frozen tuning value per
card), :mod:`.chooser` (the pure choice of kernels), :mod:`.plan` and :mod:`.quantized` (the plans), :mod:`.fast`
(the one fast launch path).
"""

from .chooser import KernelLaunch as KernelLaunch
from .chooser import LaunchSpec as LaunchSpec
from .chooser import StaticQuantizerLaunch as StaticQuantizerLaunch
from .chooser import choose as choose
from .plan import LinearPlan as LinearPlan
from .plan import SmoothQuantLinearPlan
from .problem import (
    QuantizedLinearArgs,
    QuantizedLinearDescriptor,
    SmoothQuantLinearArgs,
    SmoothQuantLinearDescriptor,
)
from .quantized import QuantizedLinearPlan
from .tuning import H100_SXM as H100_SXM
from .tuning import H100_TUNING, H200_TUNING, DeviceProperties, LinearTuning
from .tuning import H200_SXM as H200_SXM
from .tuning import SIMULATED as SIMULATED
from .tuning import current_tuning as current_tuning
from .tuning import device_properties as device_properties
from .tuning import tuning_for as tuning_for

__all__ = ["QuantizedLinearDescriptor", "QuantizedLinearArgs", "QuantizedLinearPlan",
           "SmoothQuantLinearDescriptor", "SmoothQuantLinearArgs", "SmoothQuantLinearPlan",
           "LinearTuning", "DeviceProperties", "H100_TUNING", "H200_TUNING"]
