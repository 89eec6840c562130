"""baracuda-numba: quantization kernels for NVIDIA GPUs, written with numba-cuda.

Two layers over one typed kernel registry:

- plans (``QuantizePerTensorPlan.select(desc).run(args)``), mirroring baracuda-kernels;
- dispatch functions (``quantize_per_tensor(x, scale, zero_point, dtype="int8")``) on numba,
  PyTorch, CuPy or NumPy arrays.

On a machine without a GPU the package runs on numba's CUDA simulator (the first op warns once).
Importing it sets no environment variable and does not initialize the CUDA driver: see
:mod:`baracuda_numba.platform` for how the choice is made.
"""

from . import platform  # noqa: I001  (decides GPU or simulator before numba.cuda is imported)
from . import registry, reference
from .arrays import Bfloat16Array, bfloat16_view
from .errors import (
    BaracudaError,
    DeviceUnavailable,
    InvalidOperand,
    InvalidProblem,
    MisalignedOperand,
    Unsupported,
    WorkspaceTooSmall,
)
from .ops import *  # noqa: F403
from .ops import __all__ as _ops
from .plans import *  # noqa: F403
from .plans import __all__ as _plans
from .vocabulary import (
    ArchSku,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    QuantizeKind,
    element_kind,
)

__version__ = "0.1.0"

__all__ = [
    "platform", "registry", "reference", "Bfloat16Array", "bfloat16_view",
    "BaracudaError", "DeviceUnavailable", "InvalidOperand", "InvalidProblem", "MisalignedOperand", "Unsupported",
    "WorkspaceTooSmall", "ArchSku", "BackendKind", "ElementKind", "KernelSku", "MathPrecision",
    "OpCategory", "PlanPreference", "PrecisionGuarantee", "QuantizeKind", "element_kind",
    *_ops, *_plans,
]
