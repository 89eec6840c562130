"""Packed 4-bit plans (S4 / U4, two elements per byte, even index in the low nibble): per-group
quantize, dequantize and dynamic-range quantize. (Fake quantize per group onto a 4-bit grid, float to
float, is :class:`~baracuda_numba.plans.fake.FakeQuantizePerGroupPlan`, imported here too.)

Shapes: the float tensor is ``[outer_size, axis_size]`` (any leading dimensions flattened), the
packed one ``uint8 [outer_size, axis_size / 2]``; ``axis_size`` and ``group_size`` even (no byte
straddles two groups). ``scale`` (float32; float64 for f64 data) ``[outer_size, axis_size /
group_size]``; ``zero_point`` int32 of the same shape for U4, None for S4 (symmetric).

The math is the integer elementwise family's (the README's "Semantics" section) with the 4-bit range as the default
clamp: ``q = clamp(rint(x / scale) + zp, q_min, q_max)``, ``x = (q - zp) * scale``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .. import registry
from ..arrays import Operand, adapt, allocate_like, finish
from ..errors import InvalidProblem, problem_message
from ..kernels.codecs import math_type
from ..kernels.packed import chunk_elements, dynamic_layout, group_shift, groups_per_pass
from ..launch import ArrayArg, KernelLauncher, stream_handle, synchronize
from ..platform import SIMULATOR
from ..vocabulary import ElementKind, QuantizeKind
from .base import (
    Plan,
    check_no_zero_point,
    check_q_range,
    checked_operand,
    sm_count,
    typed_view,
)
from .dynamic import (
    DynamicRangeMode,
    DynamicRangeQuantizeArgs,
    DynamicRangeQuantizeDescriptor,
    DynamicRangeQuantizePlan,
    DynamicRangeScope,
    symmetric_zero_point,
)
from .fake import (  # noqa: F401  (the per-group fake quantize, 4-bit grids included, lives with its family)
    FakeQuantizePerGroupArgs,
    FakeQuantizePerGroupBackwardArgs,
    FakeQuantizePerGroupBackwardDescriptor,
    FakeQuantizePerGroupBackwardPlan,
    FakeQuantizePerGroupDescriptor,
    FakeQuantizePerGroupPlan,
)

__all__ = [
    "PackedPerGroupDescriptor", "PackedDequantizePerGroupDescriptor", "PackedArgs",
    "QuantizePackedPerGroupPlan", "DequantizePackedPerGroupPlan",
    "DynamicRangePackedDescriptor", "DynamicRangePackedArgs", "DynamicRangePackedPlan", "UNPACKED",
]

UNPACKED = {ElementKind.S4: ElementKind.S8, ElementKind.U4: ElementKind.U8}  # one 4-bit value per byte


def check_packed_shape(plan: str, axis_size: int, group_size: int, outer_size: int = 0) -> None:
    """``axis_size`` even, ``group_size`` an even divisor of it: else :class:`InvalidProblem`."""
    if outer_size < 0:
        raise InvalidProblem(problem_message(plan, "outer_size", ">= 0", outer_size))
    if axis_size < 0 or axis_size % 2:
        raise InvalidProblem(problem_message(plan, "axis_size", "an even size (two 4-bit values per byte)",
                                             axis_size))
    if group_size <= 0 or group_size % 2:
        raise InvalidProblem(problem_message(plan, "group_size", "an even size > 0 (no byte across two groups)",
                                             group_size))
    if axis_size % group_size:
        raise InvalidProblem(problem_message(plan, "group_size", f"a divisor of axis_size ({axis_size})",
                                             group_size))


@dataclass(frozen=True)
class PackedPerGroupDescriptor:
    """Quantize ``[outer_size, axis_size]`` floats to packed ``output_element`` (S4 / U4)."""

    outer_size: int
    axis_size: int
    group_size: int
    q_min: int
    q_max: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass(frozen=True)
class PackedDequantizePerGroupDescriptor:
    """Dequantize packed ``output_element`` (S4 / U4) to ``[outer_size, axis_size]`` ``input_element``."""

    outer_size: int
    axis_size: int
    group_size: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass
class PackedArgs:
    input: Any  # quantize: float [outer, axis]; dequantize: uint8 [outer, axis / 2]
    scale: Any
    zero_point: Any  # int32 for U4; None for S4
    output: Any


class _PackedPlan(Plan):
    ENTRY = registry.PackedEntry
    QUANTIZE: ClassVar[bool]

    @classmethod
    def _validate(cls, desc: Any) -> None:
        check_packed_shape(cls.__name__, desc.axis_size, desc.group_size, desc.outer_size)
        if cls.QUANTIZE and desc.output_element in UNPACKED:
            check_q_range(cls.__name__, desc.q_min, desc.q_max, *desc.output_element.int_range)

    def _prepare(self) -> None:
        desc, entry, tuning = self.desc, self.entry, self.tuning.packed
        policy = tuning.quantize_policy if self.QUANTIZE else tuning.dequantize_policy
        kernel = entry.kernel(policy.unroll or tuning.unroll)
        M = self._math = math_type(kernel.precision)
        self._n = desc.outer_size * desc.axis_size
        self._groups = desc.outer_size * (desc.axis_size // desc.group_size)
        sizes = (np.int64,) * 4
        self._launcher = KernelLauncher(kernel.compiled, 6, (*sizes, M, M) if self.QUANTIZE else sizes)
        self._chunk = G = kernel.chunk
        self._chunked = desc.group_size % G == 0  # every chunk inside one group
        self._shift = group_shift(desc.group_size // G)
        self._unroll = kernel.unroll  # chunks a thread takes per step
        self._threads = policy.threads_per_block
        self._blocks_per_sm = resident_blocks(kernel, self._threads, policy.blocks_per_sm) if policy.one_wave \
            else policy.blocks_per_sm
        self._scale_element = ElementKind.F64 if M is np.float64 else ElementKind.F32
        if not self.QUANTIZE:
            return
        self._q = (M(desc.q_min), M(desc.q_max))

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        """Launch on ``stream``; host (NumPy) outputs are complete when it returns."""
        x, packed, scale, zero_point = self._bind(args)
        if self._n == 0:
            return
        element, G = self.desc.input_element, self._chunk
        nbytes = self._n // 2
        aligned = self._chunked and _address(x) % 16 == 0 and _address(packed) % (G // 2) == 0
        nchunks = self._n // G if aligned else 0
        # Chunk views (16 bytes of floats, G / 2 packed bytes) and element views (the kernels take bits).
        floats = (typed_view(x, np.uint64, 2 * nchunks), typed_view(x, np.dtype(f"u{element.itemsize}")))
        bytes_ = (typed_view(packed, np.dtype(f"u{G // 2}"), nchunks), typed_view(packed, np.uint8))
        zps = typed_view(zero_point, np.int32) if zero_point is not None else ArrayArg(0, 0, 4, np.zeros(0, np.int32))
        arrays = (*floats, *bytes_) if self.QUANTIZE else (*bytes_, *floats)
        sizes = (nchunks, nbytes, self.desc.group_size, self._shift)
        scalars = (*sizes, *self._q) if self.QUANTIZE else sizes
        handle = stream_handle(stream, (x, packed), self.name)
        work = max(-(-nchunks // self._unroll), nbytes - nchunks * (G // 2))
        blocks = max(1, min(-(-work // self._threads), self._blocks_per_sm * sm_count(x.device_id)))
        self._launcher.launch(blocks, self._threads, handle,
                              (*arrays, typed_view(scale, self._math), zps), scalars, x.device_id)
        out = packed if self.QUANTIZE else x
        if any(op is not None and op.on_host for op in (x, packed, scale, zero_point)):
            synchronize(handle)
            finish(out)

    def _bind(self, args: Any) -> tuple[Operand, Operand, Operand, Operand | None]:
        if not isinstance(args, self.Args):
            raise InvalidProblem(problem_message(self.name, "args", self.Args.__name__, type(args).__name__))
        desc, name = self.desc, self.name
        float_field, packed_field = ("input", "output") if self.QUANTIZE else ("output", "input")
        x = checked_operand(name, getattr(args, float_field), float_field, desc.input_element, self._n)
        packed = checked_operand(name, getattr(args, packed_field), packed_field, ElementKind.U8, self._n // 2)
        scale = checked_operand(name, args.scale, "scale", self._scale_element, self._groups)
        if desc.output_element is ElementKind.S4:
            check_no_zero_point(name, args.zero_point, desc.output_element)
            zero_point = None
        elif args.zero_point is None:
            raise InvalidProblem(problem_message(name, "zero_point", "an int32 array (U4 has zero points)", None))
        else:
            zero_point = checked_operand(name, args.zero_point, "zero_point", ElementKind.I32, self._groups)
        self._check_host_parameters(scale, zero_point)
        return x, packed, scale, zero_point

    def _check_host_parameters(self, scale: Operand, zero_point: Operand | None) -> None:
        """Host scales and zero points checked as in ``baracuda_numba/ops/checks.py`` (device ones are the
        caller's: the dispatch functions' ``validate="device"``)."""
        if scale.host is None and (zero_point is None or zero_point.host is None):
            return
        from ..ops.checks import check_operands  # ops imports plans: bound here, not at import

        q_range = (self.desc.q_min, self.desc.q_max) if self.QUANTIZE else self.desc.output_element.int_range
        check_operands(scale, zero_point, self.name, "host", self.QUANTIZE, q_range, names=("scale", "zero_point"))


class QuantizePackedPerGroupPlan(_PackedPlan):
    """``q = clamp(rint(x / scale[o, g]) + zp[o, g], q_min, q_max)``, packed two per byte (low nibble first)."""

    KIND, Descriptor, Args = QuantizeKind.PER_GROUP, PackedPerGroupDescriptor, PackedArgs
    QUANTIZE = True


class DequantizePackedPerGroupPlan(_PackedPlan):
    """``x = (q - zp[o, g]) * scale[o, g]`` from packed S4 / U4."""

    KIND, Descriptor, Args = QuantizeKind.DEQUANTIZE_PER_GROUP, PackedDequantizePerGroupDescriptor, PackedArgs
    QUANTIZE = False


# -- dynamic range per group ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DynamicRangePackedDescriptor:
    """Dynamic-range quantize ``[outer_size, axis_size]`` per group to packed S4 (symmetric) / U4."""

    outer_size: int
    axis_size: int
    group_size: int
    mode: DynamicRangeMode
    q_min: int
    q_max: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass
class DynamicRangePackedArgs:
    input: Any  # float [outer, axis]
    output: Any  # uint8 [outer, axis / 2]
    scale: Any  # written: [outer, axis / group_size]
    zero_point: Any = None  # written (U4 asymmetric); None for symmetric


class DynamicRangePackedPlan(Plan):
    """Dynamic-range quantize per group straight to nibbles: one pass over ``x`` (the kernel of
    :func:`..kernels.packed.dynamic_kernel`: a group's lanes reduce its range with shuffles, then
    quantize and pack what they hold), with the scales and zero points of the per-group dynamic plan
    bit for bit. Groups that are not a whole number of 16-byte chunks (or hold more than the tuning's
    ``dynamic_max_per_lane`` chunks per lane) and misaligned operands take the two-pass path: the
    per-group dynamic plan into one 4-bit value per byte, then the nibble packer."""

    KIND, Descriptor, Args = QuantizeKind.DYNAMIC_RANGE, DynamicRangePackedDescriptor, DynamicRangePackedArgs
    ENTRY = registry.PackedEntry

    @classmethod
    def _validate(cls, desc: Any) -> None:
        check_packed_shape(cls.__name__, desc.axis_size, desc.group_size, desc.outer_size)
        if desc.output_element is ElementKind.S4 and desc.mode is not DynamicRangeMode.SYMMETRIC:
            raise InvalidProblem(problem_message(cls.__name__, "mode", "symmetric (S4 has no zero point)",
                                                 desc.mode.value))

    def _prepare(self) -> None:
        desc, tuning = self.desc, self.tuning.packed
        self._n = desc.outer_size * desc.axis_size
        self._ngroups = self._n // desc.group_size
        self._symmetric = desc.mode is DynamicRangeMode.SYMMETRIC
        # The unpacked plan validates the range (as it did when it was the only path) and is the fallback.
        self._unpacked = DynamicRangeQuantizePlan.select(DynamicRangeQuantizeDescriptor(
            (desc.outer_size, desc.axis_size), desc.mode, DynamicRangeScope.group(desc.group_size), desc.q_min,
            desc.q_max, desc.input_element, UNPACKED[desc.output_element]), tuning=self.tuning)
        self._pack = KernelLauncher(self.entry.kernel().compiled, 2, (np.int64,))
        self._pack_policy = tuning.quantize_policy
        G = self._chunk = chunk_elements(desc.input_element)
        self._slots = tuning.dynamic_slots
        self._layout = (dynamic_layout(desc.group_size // G, tuning.dynamic_max_lanes, tuning.dynamic_max_per_lane)
                        if desc.group_size % G == 0 else None)
        if self._layout is not None:
            M = math_type(self.entry.sku.precision_guarantee.math_precision)
            self._scale_element = ElementKind.F64 if M is np.float64 else ElementKind.F32
            zp_sym = symmetric_zero_point(desc.q_min, desc.q_max) if self._symmetric else 0
            self._q_scalars = (M(desc.q_min), M(desc.q_max), M(zp_sym))
            self._threads = tuning.dynamic_threads
            kernel = self.entry.dynamic_kernel(self._symmetric, self._layout[1], self._slots, self._threads,
                                               self._layout[0])
            self._one_pass = KernelLauncher(kernel.compiled, 4, (np.int64, np.int64, M, M, M))
            self._blocks_per_sm = resident_blocks(kernel, self._threads, tuning.quantize_policy.blocks_per_sm)
            self._scale_math = M

    def scale_shape(self) -> tuple[int, ...]:
        return (self.desc.outer_size, self.desc.axis_size // self.desc.group_size)

    def workspace_size(self) -> int:
        """What the two-pass path needs (the one-pass path needs none)."""
        return self._n + self._unpacked.workspace_size()

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        if not isinstance(args, self.Args):
            raise InvalidProblem(problem_message(self.name, "args", self.Args.__name__, type(args).__name__))
        x = checked_operand(self.name, args.input, "input", self.desc.input_element, self._n)
        packed = checked_operand(self.name, args.output, "output", ElementKind.U8, self._n // 2)
        if self._n == 0:
            return
        handle = stream_handle(stream, (x, packed), self.name)
        G = self._chunk
        if self._layout is not None and _address(x) % 16 == 0 and _address(packed) % (G // 2) == 0:
            self._run_one_pass(x, packed, args, handle)
        else:
            self._run_two_pass(x, packed, args, workspace, handle)
        if x.on_host or packed.on_host:
            synchronize(handle)
            finish(packed)

    def _run_one_pass(self, x: Operand, packed: Operand, args: Any, handle: Any) -> None:
        name, count = self.name, self._ngroups
        scale = checked_operand(name, args.scale, "scale", self._scale_element, count)
        zero_point = None
        if args.zero_point is None:
            if not self._symmetric:
                raise InvalidProblem(problem_message(name, "zero_point", "an int32 array in asymmetric mode", None))
            zps = ArrayArg(0, 0, 4, np.zeros(0, np.int32))
        else:
            zero_point = checked_operand(name, args.zero_point, "zero_point", ElementKind.I32, count)
            zps = typed_view(zero_point, np.int32)
        zero_point_on_host = zero_point is not None and zero_point.on_host
        lanes, per_lane = self._layout
        G = self._chunk
        nchunks = self._n // G
        threads = self._threads
        groups_per_block = (threads // lanes) * groups_per_pass(per_lane, self._slots)
        blocks = max(1, min(-(-count // groups_per_block), self._blocks_per_sm * sm_count(x.device_id)))
        arrays = (typed_view(x, np.uint64, 2 * nchunks), typed_view(packed, np.dtype(f"u{G // 2}"), nchunks),
                  typed_view(scale, self._scale_math), zps)
        self._one_pass.launch(blocks, threads, handle, arrays, (count, lanes, *self._q_scalars), x.device_id)
        if scale.on_host or zero_point_on_host:
            synchronize(handle)
            finish(scale)
            if zero_point is not None:
                finish(zero_point)

    def _run_two_pass(self, x: Operand, packed: Operand, args: Any, workspace: Any, handle: Any) -> None:
        values = allocate_like(x, (self._n,), ElementKind.U8) if workspace is None else adapt(
            workspace, self.name, "workspace")
        # The 4-bit values, one per byte, as the unpacked element (the bytes are reinterpreted).
        unpacked = Operand(values.obj, values.origin, UNPACKED[self.desc.output_element], (self._n,), values.ptr,
                           True, host=None if values.host is None else values.host[: self._n].view(
                               UNPACKED[self.desc.output_element].numpy_dtype),
                           device_id=values.device_id)
        self._unpacked.run(DynamicRangeQuantizeArgs(x, unpacked, args.scale, args.zero_point), stream=handle)
        nbytes = self._n // 2
        blocks = self._pack_policy.blocks(nbytes, sm_count(x.device_id))
        self._pack.launch(blocks, self._pack_policy.threads_per_block, handle,
                          (typed_view(values, np.uint8, self._n), typed_view(packed, np.uint8)), (nbytes,),
                          x.device_id)


def resident_blocks(kernel: Any, threads: int, cap: int) -> int:
    """Blocks of ``threads`` one SM holds at once given the kernel's registers (at most ``cap``): a
    grid-stride grid larger than one resident wave runs a second, partial wave that costs a whole one.
    64K registers per SM, allocated per warp in units of 256, at most 64 warps (sm_70 - sm_90)."""
    if SIMULATOR:
        return cap
    counts = kernel.compiled().get_regs_per_thread()
    regs = max(counts.values()) if isinstance(counts, dict) else int(counts)
    warps = max(1, threads // 32)
    per_warp = -(-regs * 32 // 256) * 256
    return max(1, min(cap, (65536 // per_warp) // warps, 64 // warps))


def _address(op: Operand) -> int:
    return op.host.ctypes.data if op.ptr == 0 and op.host is not None else op.ptr


def packed_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The uint8 shape holding a 4-bit tensor of ``shape`` (last dimension halved)."""
    return (*shape[:-1], shape[-1] // 2)


def outer_size(shape: tuple[int, ...]) -> int:
    return math.prod(shape[:-1])
