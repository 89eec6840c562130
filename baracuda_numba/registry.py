"""The typed kernel registry: ``(QuantizeKind, input element, output element) -> RegistryEntry``.

Element roles follow ``baracuda-kernels``: for the whole quantize family ``input_element`` is the
float element (the forward quantize's input) and ``output_element`` the integer element, whichever
way the op moves data; fake-quantize has the float element on both sides (its FP8 / 4-bit entries,
and the int8 / uint8 ones with array scales, are keyed by the simulated element). FP8 entries carry
their element as ``grid``; packed S4 / U4 quantize, dequantize and dynamic range are
:class:`PackedEntry` (two values per byte). Each entry holds its kernel specialisation(s) (compiled on
first use), its launch role (the grid a card's tuning value gives it: ``plans/tuning.py``) and its
:class:`KernelSku`.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import Unsupported
from .kernels.dynamic import DynamicKernels, DynamicKernelTuning, dynamic_kernels
from .kernels.elementwise import (
    ElementwiseKernel,
    ElementwiseKernelTuning,
    ElementwiseOp,
    ScaleMode,
    elementwise_kernel,
)
from .kernels.linear import TILE_THREADS
from .kernels.packed import PACKED_ELEMENTS, dequantize_kernel, dynamic_kernel, pack_kernel, quantize_kernel
from .vocabulary import (
    ArchSku,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    OpCategory,
    PrecisionGuarantee,
    QuantizeKind,
)

__all__ = ["LaunchPolicy", "LaunchRole", "Entry", "RegistryEntry", "DynamicRangeEntry", "LinearEntry", "LinearVariant",
           "PackedEntry", "lookup",
           "entries", "FLOAT_ELEMENTS", "INT_ELEMENTS", "FP8_ELEMENTS", "PACKED_ELEMENTS"]

FLOAT_ELEMENTS = (ElementKind.F32, ElementKind.F64, ElementKind.F16, ElementKind.BF16)
INT_ELEMENTS = (ElementKind.S8, ElementKind.U8)
FP8_ELEMENTS = (ElementKind.FP8_E4M3, ElementKind.FP8_E5M2)


@dataclass(frozen=True)
class LaunchPolicy:
    """Threads per block and the cap on blocks (a multiple of the SM count) of a grid-stride kernel;
    ``unroll``: the chunks a thread has in flight (0: the kernel family's default); ``one_wave``: the
    grid also capped at what the SMs hold at once given the kernel's registers (a second, partial
    wave of a grid-stride kernel costs a whole one)."""

    threads_per_block: int
    blocks_per_sm: int
    unroll: int = 0
    one_wave: bool = False

    def blocks(self, work_items: int, sm_count: int) -> int:
        needed = -(-work_items // self.threads_per_block)
        return max(1, min(needed, self.blocks_per_sm * sm_count))


class LaunchRole(enum.Enum):
    """Which grid an elementwise entry launches with: the value names the field of a card's tuning value
    (``plans/tuning.py``, ``ElementwiseTuning.<role>_policy``) that holds it, and why."""

    ELEMENTWISE = "elementwise"  # a resident grid-stride grid
    FP8_QUANTIZE = "fp8_quantize"  # FP8 quantize per tensor, token and group
    STREAM = "stream"  # short-lived blocks
    TENSOR_DEQUANTIZE = "tensor_dequantize"  # per-tensor dequantize
    SEGMENT_QUANTIZE = "segment_quantize"  # per-token and per-group integer quantize
    CHANNEL_VECTOR = "channel_vector"  # the channel-vector kernels (not an entry's own: the plan's choice)


# Per-channel dequantize and quantize backward along the last axis, chunks of at most four elements (f32, f64)
# and a channel count the chunk divides, read each chunk's scales and zero points as vectors next to it
# (LaunchRole.CHANNEL_VECTOR); not bf16 data (8 channels per chunk: 64 bytes of parameters per 24 of data:
# dequantize 90.1% -> 77.0% of copy on an H100), nor quantize, whose stationary threads invert their scales once
# (f32 98.7% -> 71.0-84.7%).
CHANNEL_VECTOR_OPS: frozenset[ElementwiseOp] = frozenset({ElementwiseOp.DEQUANTIZE, ElementwiseOp.QUANTIZE_BACKWARD})
CHANNEL_VECTOR_MAX_CHUNK = 4  # elements per chunk
LINEAR_POLICY = LaunchPolicy(TILE_THREADS, 0)  # one block per output tile (tiled and skinny alike): no grid-stride cap


@dataclass(frozen=True)
class Entry:
    """What every registered entry has: its key ``(kind, input element, output element)`` and SKU."""

    kind: QuantizeKind
    input_element: ElementKind
    output_element: ElementKind
    sku: KernelSku

    @property
    def key(self) -> tuple[QuantizeKind, ElementKind, ElementKind]:
        return (self.kind, self.input_element, self.output_element)


@dataclass(frozen=True)
class RegistryEntry(Entry):
    """One registered kernel family member: its key, its SKU and how to build and launch it."""

    op: ElementwiseOp
    a: ElementKind
    b: ElementKind | None
    out: ElementKind
    mode: ScaleMode
    launch: LaunchRole
    grid: ElementKind | None = None  # the FP8 element of an FP8 op (its rounding and range)

    @property
    def kernel_name(self) -> str:
        return self.op.value

    @property
    def scales(self) -> str:
        return self.mode.value

    def kernel(self, tuning: ElementwiseKernelTuning, uniform_chunk: bool = True, op: ElementwiseOp | None = None,
               pow2_segments: bool = False, stationary: bool = False, channel_vectors: bool = False,
               unroll: int = 0, tiled: bool = False) -> ElementwiseKernel:
        """The kernel specialisation under a card's ``tuning`` (built once per key; compiled on first launch);
        ``op`` replaces the entry's op by a variant over the same operands (PyTorch's float64 fake quantize);
        ``pow2_segments``: segments of a power-of-two number of chunks; ``stationary`` / ``channel_vectors``: the
        thread-stationary or channel-vector channel kernel; ``unroll``: its launch policy's chunks in flight (0:
        the tuning's); ``tiled``: the tiled shift kernel, each segment shared by consecutive threads (see
        :func:`~baracuda_numba.kernels.elementwise.elementwise_kernel`)."""
        uniform = uniform_chunk or self.mode is ScaleMode.SCALAR
        return elementwise_kernel(op or self.op, self.a, self.b, self.out, self.sku.precision_guarantee.math_precision,
                                  self.mode, uniform, self.grid,
                                  pow2_segments and uniform and self.mode is not ScaleMode.SCALAR, unroll or None,
                                  stationary, channel_vectors, tuning=tuning, tiled=tiled)


@dataclass(frozen=True)
class DynamicRangeEntry(Entry):
    """Dynamic-range quantize: range reductions (``kernels``) then the elementwise ``quantize``
    kernel of the matching granularity (``quantizer``)."""

    kernel_name: str = "dynamic_range"
    scales: str = "runtime"

    def kernels(self, symmetric: bool, keep: int, threads: int, min_blocks: int = 0, streaming: bool = False,
                split: int = 1, *, tuning: DynamicKernelTuning) -> DynamicKernels:
        """The kernels of ``keep`` chunks per lane and ``threads`` per block under a card's ``tuning`` (see
        :func:`~baracuda_numba.kernels.dynamic.dynamic_kernels`)."""
        return dynamic_kernels(self.input_element, self.output_element,
                               self.sku.precision_guarantee.math_precision, symmetric, keep, threads, min_blocks,
                               streaming, split, tuning=tuning)


@dataclass(frozen=True)
class LinearVariant:
    """One kernel of the W8A8 GEMM family (``docs/design-linear.md``): its ``name`` in the plans
    (:meth:`~baracuda_numba.plans.linear.LinearPlan.kernel_variant`), what it is, and its SKU."""

    name: str
    description: str
    sku: KernelSku


@dataclass(frozen=True)
class LinearEntry(Entry):
    """W8A8 linear: the tensor-core int8 GEMM with its float32 epilogue. Keyed ``(QUANTIZED_LINEAR, x element,
    output element)`` for the dynamic per-token form and ``(QUANTIZED_LINEAR, s8, output element)`` for
    SmoothQuant's pre-quantized activations; ``variants`` lists its kernels (which one runs is the plans' choice,
    :func:`~baracuda_numba.plans.linear.choose`), the entry's own SKU is the portable family's."""

    policy: LaunchPolicy
    kernel_name: str = "w8a8_gemm"
    scales: str = "token x channel"
    variants: tuple[LinearVariant, ...] = ()

    def variant(self, name: str) -> LinearVariant:
        """The variant called ``name``; :class:`Unsupported` listing them when there is none."""
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise Unsupported(f"{self.kind.name}: variant expected one of [{', '.join(v.name for v in self.variants)}], "
                          f"got {name}")

    def variant_sku(self, name: str) -> KernelSku:
        return self.variant(name).sku


@dataclass(frozen=True)
class PackedEntry(Entry):
    """Packed 4-bit (S4 / U4) per-group quantize, dequantize or dynamic-range quantize
    (:mod:`baracuda_numba.kernels.packed`): ``input_element`` the float, ``output_element`` S4 / U4."""

    kernel_name: str = "quantize_packed"
    scales: str = "rows"

    def kernel(self, unroll: int = 0) -> ElementwiseKernel:
        """The packing kernel of this entry's direction, ``unroll`` chunks in flight per thread (dynamic range:
        the two-pass path's nibble packer, which has none)."""
        precision = self.sku.precision_guarantee.math_precision
        if self.kernel_name == "quantize_packed":
            return quantize_kernel(self.input_element, self.output_element, precision, unroll)
        if self.kernel_name == "dequantize_packed":
            return dequantize_kernel(self.input_element, self.output_element, precision, unroll)
        return pack_kernel()

    def dynamic_kernel(self, symmetric: bool, per_lane: int, slots: int, threads: int,
                       lanes: int = 0) -> ElementwiseKernel:
        """The one-pass dynamic-range kernel for groups held ``per_lane`` chunks per lane by ``lanes`` lanes (0: a
        runtime argument), ``slots`` chunks per lane per pass, ``threads`` per block."""
        return dynamic_kernel(self.input_element, self.output_element, self.sku.precision_guarantee.math_precision,
                              symmetric, per_lane, slots, threads, fixed_lanes=lanes)


def _packed_entries() -> Iterator[Entry]:
    """S4 / U4: packed quantize / dequantize / dynamic range per group; the float-only ops (backward,
    fake-quantize per group) are elementwise entries with the 4-bit range."""
    for f in FLOAT_ELEMENTS:
        for p in PACKED_ELEMENTS:
            for kind, name, scales in ((QuantizeKind.PER_GROUP, "quantize_packed", "rows"),
                                       (QuantizeKind.DEQUANTIZE_PER_GROUP, "dequantize_packed", "rows"),
                                       (QuantizeKind.DYNAMIC_RANGE, "dynamic_range_packed", "runtime")):
                yield PackedEntry(kind, f, p, _sku(kind, f, p), name, scales)
            for kind, op in ((QuantizeKind.PER_GROUP_BACKWARD, ElementwiseOp.QUANTIZE_BACKWARD),
                             (QuantizeKind.DEQUANTIZE_PER_GROUP_BACKWARD, ElementwiseOp.DEQUANTIZE_BACKWARD),
                             (QuantizeKind.FAKE_QUANTIZE, ElementwiseOp.FAKE_QUANTIZE),
                             (QuantizeKind.FAKE_QUANTIZE_BACKWARD, ElementwiseOp.FAKE_QUANTIZE_BACKWARD)):
                b = f if op.reads_saved_input else None
                yield RegistryEntry(kind, f, p, _sku(kind, f, p), op, f, b, f, ScaleMode.ROWS, LaunchRole.ELEMENTWISE)


# The W8A8 GEMM's kernels: (name, what it is, the architecture it is built for: mma.sync and cp.async need
# sm_80; the decode kernels that launch as programmatic dependents use griddepcontrol, sm_90; wgmma is sm_90a).
_LINEAR_VARIANTS = (
    ("tiled", "register-staged tiles, any alignment and K", ArchSku.SM80),
    ("pipelined", "cp.async stages and ldmatrix, aligned operands", ArchSku.SM80),
    ("wgmma", "Hopper warpgroup MMA from a swizzled shared-memory ring, aligned operands", ArchSku.SM90A),
    ("skinny", "decode: the weight streamed once, any alignment", ArchSku.SM80),
    ("skinny_vector", "decode: the weight streamed once, aligned operands, a programmatic dependent", ArchSku.SM90),
    ("fused", "decode: x quantized per token by every block, then the weight streamed once", ArchSku.SM90),
)


def _linear_sku(input_element: ElementKind, output_element: ElementKind, arch: ArchSku = ArchSku.SM80,
                variant: str | None = None) -> KernelSku:
    guarantee = PrecisionGuarantee(MathPrecision.INT32, ElementKind.I32, True, True)
    return KernelSku(OpCategory.QUANTIZATION, QuantizeKind.QUANTIZED_LINEAR, input_element, output_element,
                     "row.col", "scale_bias_f32", arch, BackendKind.BESPOKE, guarantee, variant)


def _linear_entry(input_element: ElementKind, output_element: ElementKind, scales: str) -> LinearEntry:
    variants = tuple(LinearVariant(name, description, _linear_sku(input_element, output_element, arch, name))
                     for name, description, arch in _LINEAR_VARIANTS
                     if name != "fused" or input_element is not ElementKind.S8)
    return LinearEntry(QuantizeKind.QUANTIZED_LINEAR, input_element, output_element,
                       _linear_sku(input_element, output_element), LINEAR_POLICY, scales=scales, variants=variants)


def _linear_entries() -> Iterator[LinearEntry]:
    for f in FLOAT_ELEMENTS:
        yield _linear_entry(f, f, "token x channel")
    for f in FLOAT_ELEMENTS:
        yield _linear_entry(ElementKind.S8, f, "tensor x channel")


def _sku(kind: QuantizeKind, element: ElementKind, aux: ElementKind | None) -> KernelSku:
    precision = element.math_precision
    guarantee = PrecisionGuarantee(
        math_precision=precision,
        accumulator=ElementKind.F64 if element is ElementKind.F64 else ElementKind.F32,
        bit_stable_on_same_hardware=True,
        deterministic=True,
    )
    return KernelSku(OpCategory.QUANTIZATION, kind, element, aux, None, None, ArchSku.SM80,
                     BackendKind.BESPOKE, guarantee)


# kind -> (op, scale mode, operand roles). Roles: "f" the float element, "i" the int element.
_ELEMENTWISE_KINDS = {
    QuantizeKind.PER_TENSOR: (ElementwiseOp.QUANTIZE, ScaleMode.SCALAR, "f", None, "i"),
    QuantizeKind.PER_TENSOR_BACKWARD: (ElementwiseOp.QUANTIZE_BACKWARD, ScaleMode.SCALAR, "f", "f", "f"),
    QuantizeKind.DEQUANTIZE_PER_TENSOR: (ElementwiseOp.DEQUANTIZE, ScaleMode.SCALAR, "i", None, "f"),
    QuantizeKind.DEQUANTIZE_PER_TENSOR_BACKWARD: (ElementwiseOp.DEQUANTIZE_BACKWARD, ScaleMode.SCALAR, "f", None, "f"),
    QuantizeKind.FAKE_QUANTIZE: (ElementwiseOp.FAKE_QUANTIZE, ScaleMode.SCALAR, "f", None, "f"),
    QuantizeKind.FAKE_QUANTIZE_BACKWARD: (ElementwiseOp.FAKE_QUANTIZE_BACKWARD, ScaleMode.SCALAR, "f", "f", "f"),
}
# Per-channel, per-token and per-group: the same four ops with array scales.
for _mode, _kinds in (
    (ScaleMode.CHANNELS, (QuantizeKind.PER_CHANNEL, QuantizeKind.PER_CHANNEL_BACKWARD,
                          QuantizeKind.DEQUANTIZE_PER_CHANNEL, QuantizeKind.DEQUANTIZE_PER_CHANNEL_BACKWARD)),
    (ScaleMode.ROWS, (QuantizeKind.PER_TOKEN, QuantizeKind.PER_TOKEN_BACKWARD,
                      QuantizeKind.DEQUANTIZE_PER_TOKEN, QuantizeKind.DEQUANTIZE_PER_TOKEN_BACKWARD)),
    (ScaleMode.ROWS, (QuantizeKind.PER_GROUP, QuantizeKind.PER_GROUP_BACKWARD,
                      QuantizeKind.DEQUANTIZE_PER_GROUP, QuantizeKind.DEQUANTIZE_PER_GROUP_BACKWARD)),
):
    for _kind, _like in zip(_kinds, (QuantizeKind.PER_TENSOR, QuantizeKind.PER_TENSOR_BACKWARD,
                                     QuantizeKind.DEQUANTIZE_PER_TENSOR,
                                     QuantizeKind.DEQUANTIZE_PER_TENSOR_BACKWARD), strict=True):
        _op, _, _a, _b, _out = _ELEMENTWISE_KINDS[_like]
        _ELEMENTWISE_KINDS[_kind] = (_op, _mode, _a, _b, _out)
_FAKE = (QuantizeKind.FAKE_QUANTIZE, QuantizeKind.FAKE_QUANTIZE_BACKWARD)
_STREAM_KINDS = frozenset({kind for kind, spec in _ELEMENTWISE_KINDS.items() if spec[1] is ScaleMode.SCALAR} | {
    QuantizeKind.PER_GROUP, QuantizeKind.DEQUANTIZE_PER_GROUP, QuantizeKind.DEQUANTIZE_PER_TOKEN})


def _launch_role(kind: QuantizeKind, out: ElementKind) -> LaunchRole:
    if kind is QuantizeKind.DEQUANTIZE_PER_TENSOR:
        return LaunchRole.TENSOR_DEQUANTIZE
    if out.is_fp8 and kind in (QuantizeKind.PER_TENSOR, QuantizeKind.PER_TOKEN, QuantizeKind.PER_GROUP):
        return LaunchRole.FP8_QUANTIZE
    if kind in (QuantizeKind.PER_TOKEN, QuantizeKind.PER_GROUP):
        return LaunchRole.SEGMENT_QUANTIZE
    return LaunchRole.STREAM if kind in _STREAM_KINDS else LaunchRole.ELEMENTWISE


def _elementwise_entries() -> Iterator[RegistryEntry]:
    for kind, (op, mode, a, b, out) in _ELEMENTWISE_KINDS.items():
        for f in FLOAT_ELEMENTS:
            for i in ((f,) if kind in _FAKE else INT_ELEMENTS):
                role = {"f": f, "i": i, None: None}
                yield RegistryEntry(kind, f, i, _sku(kind, f, None if kind in _FAKE else i), op,
                                    role[a], role[b], role[out], mode, _launch_role(kind, role[out]))
    # FP8: keyed (kind, float element, FP8 element), fake-quantize included (its FP8 element names
    # the grid; its operands are both float).
    for kind, (op, mode, a, b, out) in _ELEMENTWISE_KINDS.items():
        for f in FLOAT_ELEMENTS:
            for g in FP8_ELEMENTS:
                role = {"f": f, "i": f if kind in _FAKE else g, None: None}
                yield RegistryEntry(kind, f, g, _sku(kind, f, g), op, role[a], role[b], role[out], mode,
                                    _launch_role(kind, role[out]), g)


def _fake_array_entries() -> Iterator[RegistryEntry]:
    """Fake quantize and its straight-through backward with array scales on an int8 / uint8 grid, keyed by the
    simulated element (as the 4-bit ones): per channel, per token and per group alike, since each is the segment
    ``(i // seg_len) % channels`` of the flat tensor (:mod:`baracuda_numba.plans.fake`). Launched as the
    per-channel quantize is (``LaunchRole.ELEMENTWISE``: blocks within its thread-stationary kernel's launch
    bounds)."""
    for kind, op in ((QuantizeKind.FAKE_QUANTIZE, ElementwiseOp.FAKE_QUANTIZE),
                     (QuantizeKind.FAKE_QUANTIZE_BACKWARD, ElementwiseOp.FAKE_QUANTIZE_BACKWARD)):
        for f in FLOAT_ELEMENTS:
            for i in INT_ELEMENTS:
                b = f if op.reads_saved_input else None
                yield RegistryEntry(kind, f, i, _sku(kind, f, i), op, f, b, f, ScaleMode.CHANNELS,
                                    LaunchRole.ELEMENTWISE)


def _dynamic_entries() -> Iterator[DynamicRangeEntry]:
    for f in FLOAT_ELEMENTS:
        for i in (*INT_ELEMENTS, *FP8_ELEMENTS):
            yield DynamicRangeEntry(QuantizeKind.DYNAMIC_RANGE, f, i, _sku(QuantizeKind.DYNAMIC_RANGE, f, i))


@functools.cache
def _table() -> dict[tuple[QuantizeKind, ElementKind, ElementKind], Entry]:
    return {entry.key: entry for entry in (*_elementwise_entries(), *_dynamic_entries(), *_linear_entries(),
                                           *_packed_entries(), *_fake_array_entries())}


def entries() -> tuple[Entry, ...]:
    """Every registered entry, in registration order."""
    return tuple(_table().values())


def lookup(kind: QuantizeKind, input_element: ElementKind, output_element: ElementKind,
           where: str | None = None) -> Entry:
    """The entry for this key, or :class:`Unsupported` listing what ``kind`` has.

    ``where`` names the caller (a plan) in the error message.
    """
    entry = _table().get((kind, input_element, output_element))
    if entry is None:
        available = sorted(f"{e.input_element.short}->{e.output_element.short}"
                           for e in entries() if e.kind is kind)
        raise Unsupported(
            f"{where or kind.name}: (input_element, output_element) expected one of "
            f"[{', '.join(available) or 'nothing registered'}], "
            f"got {input_element.short}->{output_element.short}"
        )
    return entry
