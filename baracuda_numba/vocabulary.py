"""The vocabulary shared by every layer (mirrors ``baracuda-kernels-types``).

Element kinds, quantize kinds, SKUs, precision guarantees and plan preferences are frozen,
hashable values: they key the registry and the plan caches.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "ElementKind",
    "QuantizeKind",
    "MathPrecision",
    "ArchSku",
    "BackendKind",
    "OpCategory",
    "PrecisionGuarantee",
    "KernelSku",
    "PlanPreference",
    "element_kind",
]


class ElementKind(enum.Enum):
    """Storage element of an operand. The value is the short name used in SKU strings."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    S8 = "s8"
    U8 = "u8"
    I32 = "i32"
    # Packed two per byte (low nibble first); ``itemsize`` 0: arrays hold them as uint8 bytes.
    S4 = "s4"
    U4 = "u4"
    # OCP 8-bit floats: E4M3 is the ``fn`` variant (no infinities, NaN = S.1111.111, max 448),
    # E5M2 the IEEE-like one (infinities, max 57344).
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"

    @property
    def short(self) -> str:
        return self.value

    # is_float, is_integer, is_fp8 and itemsize are plain attributes, set below: they sit on the launch path.
    is_float: bool
    is_integer: bool
    is_fp8: bool
    itemsize: int

    @property
    def fp8_max(self) -> float:
        """Largest finite value of an FP8 element (448 for E4M3, 57344 for E5M2)."""
        try:
            return _FP8_MAX[self]
        except KeyError:
            raise ValueError(f"ElementKind.{self.name} is not an FP8 element") from None

    @property
    def q_range(self) -> tuple[int, int]:
        """Inclusive clamp range of a quantized element: the integer range, or ``+-fp8_max``."""
        if self in _FP8_MAX:
            return -int(_FP8_MAX[self]), int(_FP8_MAX[self])
        return self.int_range

    @property
    def numpy_dtype(self) -> np.dtype:
        """Host dtype holding this element (``ml_dtypes.bfloat16`` for BF16)."""
        try:
            return _NUMPY[self]
        except KeyError:
            raise ValueError(f"ElementKind.{self.name} has no host storage dtype") from None

    @property
    def storage_dtype(self) -> np.dtype:
        """Dtype a kernel sees for this element: BF16 travels as its uint16 bit pattern, FP8 as uint8
        (numba knows neither ``ml_dtypes`` type)."""
        if self is ElementKind.BF16:
            return np.dtype(np.uint16)
        return np.dtype(np.uint8) if self.is_fp8 else self.numpy_dtype

    @property
    def int_range(self) -> tuple[int, int]:
        """Inclusive value range of an integer element."""
        try:
            return _INT_RANGES[self]
        except KeyError:
            raise ValueError(f"ElementKind.{self.name} is not an integer element") from None

    @property
    def math_precision(self) -> MathPrecision:
        """Precision the quantize kernels compute in for this float element."""
        return MathPrecision.F64 if self is ElementKind.F64 else MathPrecision.F32

    def __repr__(self) -> str:
        return f"ElementKind.{self.name}"


_FLOATS = frozenset(
    {ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64,
     ElementKind.FP8_E4M3, ElementKind.FP8_E5M2}
)
_INT_RANGES = {
    ElementKind.S8: (-128, 127),
    ElementKind.U8: (0, 255),
    ElementKind.I32: (-(2**31), 2**31 - 1),
    ElementKind.S4: (-8, 7),
    ElementKind.U4: (0, 15),
}
_FP8_MAX = {ElementKind.FP8_E4M3: 448.0, ElementKind.FP8_E5M2: 57344.0}
_ITEMSIZE = {
    ElementKind.F16: 2, ElementKind.BF16: 2, ElementKind.F32: 4, ElementKind.F64: 8,
    ElementKind.S8: 1, ElementKind.U8: 1, ElementKind.I32: 4,
    ElementKind.FP8_E4M3: 1, ElementKind.FP8_E5M2: 1,
}
_NUMPY = {
    ElementKind.F16: np.dtype(np.float16),
    ElementKind.BF16: np.dtype(ml_dtypes.bfloat16),
    ElementKind.F32: np.dtype(np.float32),
    ElementKind.F64: np.dtype(np.float64),
    ElementKind.S8: np.dtype(np.int8),
    ElementKind.U8: np.dtype(np.uint8),
    ElementKind.I32: np.dtype(np.int32),
    ElementKind.FP8_E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    ElementKind.FP8_E5M2: np.dtype(ml_dtypes.float8_e5m2),
}
_BY_NUMPY = {dt: kind for kind, dt in _NUMPY.items()}
# ml_dtypes' int4 / uint4 name the element (one per byte there); packed storage is uint8.
_BY_NUMPY.update({np.dtype(ml_dtypes.int4): ElementKind.S4, np.dtype(ml_dtypes.uint4): ElementKind.U4})
for _kind in ElementKind:
    _kind.is_float = _kind in _FLOATS
    _kind.is_integer = _kind in _INT_RANGES
    _kind.is_fp8 = _kind in _FP8_MAX
    _kind.itemsize = _ITEMSIZE.get(_kind, 0)  # 0: sub-byte (S4 / U4)
del _kind
_BY_NAME = {
    **{kind.value: kind for kind in ElementKind},
    **{kind.name.lower(): kind for kind in ElementKind},
    "float16": ElementKind.F16, "half": ElementKind.F16,
    "bfloat16": ElementKind.BF16,
    "float32": ElementKind.F32, "float": ElementKind.F32,
    "float64": ElementKind.F64, "double": ElementKind.F64,
    "int8": ElementKind.S8, "qint8": ElementKind.S8,
    "uint8": ElementKind.U8, "quint8": ElementKind.U8,
    "int32": ElementKind.I32, "qint32": ElementKind.I32,
    "float8_e4m3fn": ElementKind.FP8_E4M3, "float8_e5m2": ElementKind.FP8_E5M2,
    "e4m3": ElementKind.FP8_E4M3, "e5m2": ElementKind.FP8_E5M2,
    "int4": ElementKind.S4, "uint4": ElementKind.U4, "quint4x2": ElementKind.U4,
}


def element_kind(dtype: Any) -> ElementKind:
    """Normalise a dtype-like to an :class:`ElementKind`.

    Accepts an ``ElementKind``, a name (``"int8"``, ``"bfloat16"``, ``"f32"``, ``"bf16"``...), a NumPy
    dtype or scalar type (``ml_dtypes.bfloat16`` included), a torch dtype or a numba type.
    Raises :class:`TypeError` naming the value when it is none of these.
    """
    if isinstance(dtype, ElementKind):
        return dtype
    if isinstance(dtype, str):
        kind = _BY_NAME.get(dtype.strip().lower())
        if kind is None:
            raise TypeError(f"dtype expected one of {sorted(_BY_NAME)}, got {dtype!r}")
        return kind
    module = type(dtype).__module__
    if module.startswith("torch"):  # torch.dtype prints as "torch.float32"
        return element_kind(str(dtype).rsplit(".", 1)[-1])
    if module.startswith("numba"):  # numba types print as "float32", "int8"...
        return element_kind(str(dtype))
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype expected a dtype-like, got {dtype!r}") from None
    kind = _BY_NUMPY.get(np_dtype)
    if kind is None:
        raise TypeError(f"dtype expected one of {sorted(k.value for k in _BY_NUMPY.values())}, got {np_dtype}")
    return kind


class QuantizeKind(enum.IntEnum):
    """Op identity of a quantization plan (same integer values as the Rust enum)."""

    PER_TENSOR = 0
    PER_TENSOR_BACKWARD = 1
    DEQUANTIZE_PER_TENSOR = 2
    DEQUANTIZE_PER_TENSOR_BACKWARD = 3
    PER_CHANNEL = 4
    PER_CHANNEL_BACKWARD = 5
    DEQUANTIZE_PER_CHANNEL = 6
    DEQUANTIZE_PER_CHANNEL_BACKWARD = 7
    FAKE_QUANTIZE = 8
    FAKE_QUANTIZE_BACKWARD = 9
    PER_TOKEN = 16
    PER_TOKEN_BACKWARD = 17
    PER_GROUP = 18
    PER_GROUP_BACKWARD = 19
    DYNAMIC_RANGE = 20
    DEQUANTIZE_PER_TOKEN = 21
    DEQUANTIZE_PER_TOKEN_BACKWARD = 22
    DEQUANTIZE_PER_GROUP = 23
    DEQUANTIZE_PER_GROUP_BACKWARD = 24
    QUANTIZED_LINEAR = 25


class MathPrecision(enum.Enum):
    """Precision of the arithmetic inside a kernel."""

    F16 = "f16"
    BF16 = "bf16"
    TF32 = "tf32"
    F32 = "f32"
    F64 = "f64"
    INT32 = "i32"


class ArchSku(enum.Enum):
    """Minimum architecture a kernel is built for (``SM90``: it uses programmatic dependent launch,
    ``griddepcontrol``; ``SM90A``: Hopper-specific instructions such as ``wgmma``)."""

    SM80 = "sm80"
    SM89 = "sm89"
    SM90 = "sm90"
    SM90A = "sm90a"


class BackendKind(enum.Enum):
    """Where a kernel comes from."""

    BESPOKE = "bespoke"
    CUTLASS = "cutlass"
    LIBRARY = "library"


class OpCategory(enum.Enum):
    QUANTIZATION = "quantization"


@dataclass(frozen=True)
class PrecisionGuarantee:
    """Numerical contract of a kernel.

    ``math_precision`` is the precision of the arithmetic (F64 means float64 throughout),
    ``accumulator`` the element of any accumulation, ``bit_stable_on_same_hardware`` that reruns on
    the same GPU give the same bits, ``deterministic`` that results do not depend on scheduling.
    """

    math_precision: MathPrecision
    accumulator: ElementKind
    bit_stable_on_same_hardware: bool
    deterministic: bool


@dataclass(frozen=True)
class KernelSku:
    """Identity of a registered kernel: what it computes, on what, and how precisely; ``variant`` names one
    kernel of a family that has several for the same key (the W8A8 GEMM's ``tiled``, ``wgmma``, ...)."""

    category: OpCategory
    op: QuantizeKind
    element: ElementKind
    aux_element: ElementKind | None
    layout: str | None
    epilogue: str | None
    arch: ArchSku
    backend: BackendKind
    precision_guarantee: PrecisionGuarantee
    variant: str | None = None

    def __str__(self) -> str:
        pair = self.element.short + (f"->{self.aux_element.short}" if self.aux_element else "")
        parts = [self.category.value, self.op.name.lower(), pair, self.arch.value, self.backend.value]
        if self.layout:
            parts.append(self.layout)
        if self.epilogue:
            parts.append(self.epilogue)
        if self.variant:
            parts.append(self.variant)
        return "/".join(parts)


@dataclass(frozen=True)
class PlanPreference:
    """What the caller allows a plan to use (mirrors the Rust ``PlanPreference``).

    ``max_workspace_bytes``: plans consider only kernels whose workspace fits (None: no limit), else
    :class:`~baracuda_numba.errors.Unsupported`; ``allow_sm90a``: Hopper-specific (sm_90a) kernels may be chosen
    (False: the portable ones, with the same bits); ``prefer_backend``: the backend the plan must take (None: its
    own choice), :class:`~baracuda_numba.errors.Unsupported` where it has no kernel of that backend. The W8A8 plans
    read all three; ``plan.sku()`` names what was chosen.
    """

    max_workspace_bytes: int | None = None
    allow_sm90a: bool = True
    prefer_backend: BackendKind | None = None
