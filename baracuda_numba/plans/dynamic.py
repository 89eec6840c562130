"""``DynamicRangeQuantizePlan``: scales and zero points from the run-time range, then quantize.

Both modes (symmetric, asymmetric after torchao's ASYMMETRIC mapping), four scopes (tensor,
channel(axis), token, group(group_size)), f16 / bf16 / f32 / f64 in, s8 / u8 out, any number of
rows, 64-bit sizes, deterministic. The math is in :mod:`baracuda_numba.kernels.dynamic`; the
quantization step is exactly the per-token / per-channel / per-group / per-tensor quantize of the
same scales, so the results can be dequantized with those plans.

Strategies: contiguous segments (token, group, and channel when nothing precedes the channel axis)
run in one fused kernel; the tensor scope reduces per block, finalizes in one block, then quantizes;
other channel axes reduce columns of the ``[outer, C, inner]`` view, finalize per channel, then
quantize per channel.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arrays import Operand, adapt, finish
from ..errors import InvalidProblem, problem_message
from ..kernels.codecs import math_type
from ..kernels.dynamic import WARP
from ..launch import ArrayArg, KernelLauncher, stream_handle, synchronize
from ..platform import SIMULATOR
from ..vocabulary import ElementKind, QuantizeKind
from .base import Plan, check_fp8_bounds, check_no_zero_point, checked_operand, chunk_views, sm_count, typed_view
from .per_axis import (
    QuantizePerChannelArgs,
    QuantizePerChannelDescriptor,
    QuantizePerChannelPlan,
    QuantizePerTokenArgs,
    QuantizePerTokenDescriptor,
    QuantizePerTokenPlan,
)

__all__ = ["DynamicRangeMode", "DynamicRangeScope", "ScopeKind", "DynamicRangeQuantizeDescriptor",
           "DynamicRangeQuantizeArgs", "DynamicRangeQuantizePlan", "default_dynamic_q_range"]


class DynamicRangeMode(enum.Enum):
    SYMMETRIC = "symmetric"
    ASYMMETRIC = "asymmetric"


class ScopeKind(enum.Enum):
    TENSOR = "tensor"
    CHANNEL = "channel"
    TOKEN = "token"
    GROUP = "group"


@dataclass(frozen=True)
class DynamicRangeScope:
    """Which elements share a scale: the whole tensor, a channel of ``axis``, a token row (the last
    axis), or a group of ``group_size`` consecutive elements along the last axis."""

    kind: ScopeKind
    axis: int | None = None
    group_size: int | None = None

    @classmethod
    def tensor(cls) -> DynamicRangeScope:
        return cls(ScopeKind.TENSOR)

    @classmethod
    def channel(cls, axis: int) -> DynamicRangeScope:
        return cls(ScopeKind.CHANNEL, axis=axis)

    @classmethod
    def token(cls) -> DynamicRangeScope:
        return cls(ScopeKind.TOKEN)

    @classmethod
    def group(cls, group_size: int) -> DynamicRangeScope:
        return cls(ScopeKind.GROUP, group_size=group_size)


def default_dynamic_q_range(mode: DynamicRangeMode, element: ElementKind) -> tuple[int, int]:
    """[-127, 127] for symmetric int8 (so that -x quantizes to -q), else the element's full range
    (``+-fp8_max`` for FP8)."""
    low, high = element.q_range if (element.is_integer or element.is_fp8) else (0, 0)
    if mode is DynamicRangeMode.SYMMETRIC and low < 0:
        low = -high
    return low, high


def symmetric_zero_point(q_min: int, q_max: int) -> int:
    """0 for a range holding negatives, else the mid-range point (128 for uint8 [0, 255])."""
    return 0 if q_min < 0 else (q_min + q_max + 1) // 2


@dataclass(frozen=True)
class DynamicRangeQuantizeDescriptor:
    shape: tuple[int, ...]
    mode: DynamicRangeMode
    scope: DynamicRangeScope
    q_min: int
    q_max: int
    input_element: ElementKind
    output_element: ElementKind


@dataclass
class DynamicRangeQuantizeArgs:
    input: Any  # float, ``shape``
    output: Any  # int, ``shape``
    scale: Any  # written: float32 (float64 for f64 input), ``plan.scale_count()`` elements
    zero_point: Any = None  # written: int32, same count; may be None in symmetric mode


class DynamicRangeQuantizePlan(Plan):
    """Quantize with scales computed from the data in the same call (see the module docstring)."""

    KIND = QuantizeKind.DYNAMIC_RANGE
    Descriptor = DynamicRangeQuantizeDescriptor
    Args = DynamicRangeQuantizeArgs

    # -- selection -------------------------------------------------------------------------------

    @classmethod
    def _validate(cls, desc: Any) -> None:
        name = cls.__name__
        try:
            shape = tuple(int(d) for d in desc.shape)
        except (TypeError, ValueError):
            raise InvalidProblem(problem_message(name, "shape", "a tuple of integers", repr(desc.shape))) from None
        if any(d < 0 for d in shape):
            raise InvalidProblem(problem_message(name, "shape", "non-negative sizes", shape))
        object.__setattr__(desc, "shape", shape)
        if not isinstance(desc.mode, DynamicRangeMode):
            raise InvalidProblem(problem_message(name, "mode", "a DynamicRangeMode", repr(desc.mode)))
        scope = desc.scope
        if not isinstance(scope, DynamicRangeScope):
            raise InvalidProblem(problem_message(name, "scope", "a DynamicRangeScope", repr(scope)))
        rank = len(shape)
        if scope.kind in (ScopeKind.TOKEN, ScopeKind.GROUP, ScopeKind.CHANNEL) and rank == 0:
            raise InvalidProblem(problem_message(name, "shape", f"rank >= 1 for the {scope.kind.value} scope", shape))
        if scope.kind is ScopeKind.CHANNEL:
            if not isinstance(scope.axis, (int, np.integer)) or not -rank <= scope.axis < rank:
                raise InvalidProblem(problem_message(name, "scope.axis", f"in [{-rank}, {rank})", scope.axis))
            object.__setattr__(desc, "scope", DynamicRangeScope.channel(int(scope.axis) % rank))
        if scope.kind is ScopeKind.GROUP:
            g = scope.group_size
            if not isinstance(g, (int, np.integer)) or g <= 0:
                raise InvalidProblem(problem_message(name, "scope.group_size", "an integer > 0", g))
            if shape[-1] % g:
                raise InvalidProblem(problem_message(name, "scope.group_size",
                                                     f"a divisor of the last dimension ({shape[-1]})", g))
        if desc.output_element.is_fp8:
            if desc.mode is not DynamicRangeMode.SYMMETRIC:
                raise InvalidProblem(problem_message(name, "mode", f"symmetric ({desc.output_element.short} has no "
                                                     "zero point)", desc.mode.value))
            check_fp8_bounds(name, desc.q_min, desc.q_max, desc.output_element)
            if desc.q_min != -desc.q_max:
                raise InvalidProblem(problem_message(name, "(q_min, q_max)", "a symmetric range [-m, m]",
                                                     f"[{desc.q_min}, {desc.q_max}]"))
        elif not desc.output_element.is_integer:
            return  # reported by the registry lookup
        low, high = desc.output_element.q_range
        if desc.q_min > desc.q_max or desc.q_min < low or desc.q_max > high:
            raise InvalidProblem(problem_message(name, "(q_min, q_max)", f"an ordered range within [{low}, {high}]",
                                                 f"[{desc.q_min}, {desc.q_max}]"))
        if desc.mode is DynamicRangeMode.SYMMETRIC:
            zp = symmetric_zero_point(desc.q_min, desc.q_max)
            if desc.q_max - zp <= 0:
                raise InvalidProblem(problem_message(name, "(q_min, q_max)",
                                                     f"room above the symmetric zero point {zp}",
                                                     f"[{desc.q_min}, {desc.q_max}]"))
        elif desc.q_max == desc.q_min:
            raise InvalidProblem(problem_message(name, "(q_min, q_max)", "q_max > q_min",
                                                 f"[{desc.q_min}, {desc.q_max}]"))

    def _prepare(self) -> None:
        desc, entry = self.desc, self.entry
        self._symmetric = desc.mode is DynamicRangeMode.SYMMETRIC
        self._kernels = kernels = entry.kernels(self._symmetric)
        self._threads = tpb = kernels.threads
        M = self._math = math_type(entry.sku.precision_guarantee.math_precision)
        self._scale_element = ElementKind.F64 if M is np.float64 else ElementKind.F32
        self._n = math.prod(desc.shape)
        self._zp_sym = symmetric_zero_point(desc.q_min, desc.q_max) if self._symmetric else 0
        self._q_scalars = (M(desc.q_min), M(desc.q_max), M(self._zp_sym))
        shape, scope = desc.shape, desc.scope
        sms = sm_count(0)
        self._quantizer: Plan | None = None
        if scope.kind is ScopeKind.TENSOR:
            self._strategy = "tensor"
            self._count = 1
            self._partial_blocks = max(1, min(-(-self._n // (tpb * kernels.chunk)), 8 * sms))
            self._workspace = 2 * (tpb // WARP) * self._partial_blocks * np.dtype(M).itemsize
            self._quantizer = QuantizePerTokenPlan.select(QuantizePerTokenDescriptor(
                1, self._n, desc.q_min, desc.q_max, desc.input_element, desc.output_element))
        elif scope.kind is ScopeKind.CHANNEL and math.prod(shape[:scope.axis]) > 1:
            self._strategy = "columns"
            outer, channels = math.prod(shape[:scope.axis]), shape[scope.axis]
            inner = math.prod(shape[scope.axis + 1:])
            width = channels * inner
            target = 2048 * sms  # threads that keep the machine busy
            parts = max(1, min(outer, -(-target // max(width, 1))))
            rows_per_part = -(-outer // parts)
            self._columns = (outer, channels, inner, width, -(-outer // rows_per_part), rows_per_part)
            self._count = channels
            self._workspace = 2 * self._columns[4] * width * np.dtype(M).itemsize
            self._quantizer = QuantizePerChannelPlan.select(QuantizePerChannelDescriptor(
                shape, scope.axis, desc.q_min, desc.q_max, desc.input_element, desc.output_element))
        else:
            self._strategy = "segments"
            if scope.kind is ScopeKind.CHANNEL:
                nseg, seg_len = shape[scope.axis], math.prod(shape[scope.axis + 1:])
            elif scope.kind is ScopeKind.TOKEN:
                nseg, seg_len = math.prod(shape[:-1]), shape[-1]
            else:
                nseg, seg_len = self._n // scope.group_size if scope.group_size else 0, scope.group_size
            self._segments = (nseg, seg_len)
            self._count = nseg
            self._workspace = 0
            G = kernels.chunk
            units = seg_len // G if seg_len % G == 0 else seg_len
            tps = 1  # lanes per segment: enough to keep every chunk in registers, at most a warp
            while (tps < WARP and tps * kernels.keep < units) or tps < min(units, 4):
                tps *= 2
            self._tps = min(tps, WARP)
            self._segment_blocks = max(1, min(-(-nseg // (tpb // self._tps)), 16 * sms))
        self._launchers = {
            "segment": KernelLauncher(kernels.segment.compiled, 6, (np.int64,) * 4 + (M,) * 3),
            "partial": KernelLauncher(kernels.partial.compiled, 3, (np.int64,) * 2),
            "finalize": KernelLauncher(kernels.finalize.compiled, 3, (np.int64,) + (M,) * 3),
            "column_partial": KernelLauncher(kernels.column_partial.compiled, 2, (np.int64,) * 4),
            "channel_finalize": KernelLauncher(kernels.channel_finalize.compiled, 3, (np.int64,) * 3 + (M,) * 3),
        }
        if not SIMULATOR:
            used = {"segments": ("segment",), "tensor": ("partial", "finalize"),
                    "columns": ("column_partial", "channel_finalize")}[self._strategy]
            for name in used:
                getattr(kernels, name).compiled()

    # -- queries ---------------------------------------------------------------------------------

    def scale_count(self) -> int:
        """Number of scales (and zero points) ``run`` writes."""
        return self._count

    def scale_shape(self) -> tuple[int, ...]:
        """Natural shape of the scales: ``()``, ``(C,)``, ``shape[:-1]`` or ``(*shape[:-1], groups)``."""
        shape, scope = self.desc.shape, self.desc.scope
        return {ScopeKind.TENSOR: (), ScopeKind.CHANNEL: (shape[scope.axis],) if scope.axis is not None else (),
                ScopeKind.TOKEN: shape[:-1],
                ScopeKind.GROUP: (*shape[:-1], shape[-1] // (scope.group_size or 1)) if shape else ()}[scope.kind]

    def zero_point_scratch_bytes(self) -> int:
        return 4 * self._count

    def workspace_size(self) -> int:
        """Reduction partials, plus room for zero points when ``args.zero_point`` is None."""
        return self._workspace + self.zero_point_scratch_bytes()

    # -- running ---------------------------------------------------------------------------------

    def _operand(self, value: Any, field: str, element: ElementKind, count: int) -> Operand:
        return checked_operand(self.name, value, field, element, count)

    def _bind(self, args: Any) -> tuple[Operand, ...]:
        if not isinstance(args, self.Args):
            raise InvalidProblem(problem_message(self.name, "args", self.Args.__name__, type(args).__name__))
        desc = self.desc
        x = self._operand(args.input, "input", desc.input_element, self._n)
        q = self._operand(args.output, "output", desc.output_element, self._n)
        scale = self._operand(args.scale, "scale", self._scale_element, self._count)
        if desc.output_element.is_fp8:
            check_no_zero_point(self.name, args.zero_point, desc.output_element)
            zero_point = None
        elif args.zero_point is None:
            if not self._symmetric:
                raise InvalidProblem(problem_message(self.name, "zero_point", "an int32 array in asymmetric mode",
                                                     None))
            zero_point = None
        else:
            zero_point = self._operand(args.zero_point, "zero_point", ElementKind.I32, self._count)
        return x, q, scale, zero_point

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        """Compute the scales (and zero points) of ``args.input``, write them and the quantized values.

        ``workspace``: at least ``workspace_size()`` bytes of device memory (any dtype), or None
        to let the plan allocate it.
        """
        x, q, scale, zero_point = self._bind(args)
        if self._n == 0:
            return
        if workspace is None:
            from .. import arrays

            workspace = arrays.allocate_like(x, (self.workspace_size(),), ElementKind.U8)
        else:
            self._check_workspace(workspace)
        ws = adapt(workspace, self.name, "workspace")
        handle = stream_handle(stream, (x, q), self.name)
        if zero_point is None:
            zp_view = typed_view(ws, np.int32, self._count) if self._workspace == 0 else _offset(
                typed_view(ws, np.uint8), self._workspace, np.int32, self._count)
        else:
            zp_view = typed_view(zero_point, np.int32)
        scale_view = typed_view(scale, self._math)
        device_id = x.device_id
        if self._strategy == "segments":
            self._run_segments(x, q, scale_view, zp_view, handle, device_id)
        else:
            partials = typed_view(ws, self._math, self._workspace // np.dtype(self._math).itemsize)
            if self._strategy == "tensor":
                self._run_tensor(x, partials, scale_view, zp_view, handle, device_id)
                quantize_args = QuantizePerTokenArgs(x, scale, self._quantizer_zero_point(zero_point, zp_view, x), q)
            else:
                self._run_columns(x, partials, scale_view, zp_view, handle, device_id)
                quantize_args = QuantizePerChannelArgs(x, scale, self._quantizer_zero_point(zero_point, zp_view, x),
                                                       q)
            self._quantizer.run(quantize_args, stream=handle)
        if any(op is not None and op.on_host for op in (x, q, scale, zero_point)):
            synchronize(handle)
            for op in (q, scale, zero_point):
                if op is not None:
                    finish(op)

    def _quantizer_zero_point(self, zero_point: Operand | None, view: ArrayArg, like: Operand) -> Operand | None:
        """The zero points for the second-pass quantize plan (none for FP8)."""
        return None if self.desc.output_element.is_fp8 else _zp_operand(zero_point, view, like)

    def _run_segments(self, x, q, scale_view, zp_view, handle, device_id) -> None:
        nseg, seg_len = self._segments
        G = self._kernels.chunk
        aligned = seg_len % G == 0 and _address(x) % min(G * x.element.itemsize, 16) == 0 and \
            _address(q) % min(G * q.element.itemsize, 16) == 0
        cps = seg_len // G if aligned else 0
        nchunks = nseg * cps
        arrays = (*chunk_views(x, self._n, nchunks, G), *chunk_views(q, self._n, nchunks, G), scale_view, zp_view)
        self._launchers["segment"].launch(self._segment_blocks, self._threads, handle, arrays,
                                          (nseg, seg_len, cps, self._tps, *self._q_scalars), device_id)

    def _run_tensor(self, x, partials, scale_view, zp_view, handle, device_id) -> None:
        G = self._kernels.chunk
        aligned = _address(x) % min(G * x.element.itemsize, 16) == 0
        nchunks = self._n // G if aligned else 0
        blocks = self._partial_blocks
        self._launchers["partial"].launch(blocks, self._threads, handle,
                                          (*chunk_views(x, self._n, nchunks, G), partials), (self._n, nchunks),
                                          device_id)
        self._launchers["finalize"].launch(1, self._threads, handle, (partials, scale_view, zp_view),
                                           (blocks * (self._threads // WARP), *self._q_scalars), device_id)

    def _run_columns(self, x, partials, scale_view, zp_view, handle, device_id) -> None:
        outer, channels, inner, width, parts, rows_per_part = self._columns
        _, elements = chunk_views(x, self._n, 0, 1)
        tpb = self._threads
        blocks = max(1, min(-(-(parts * width) // tpb), 32 * sm_count(device_id)))
        self._launchers["column_partial"].launch(blocks, tpb, handle, (elements, partials),
                                                 (outer, width, parts, rows_per_part), device_id)
        self._launchers["channel_finalize"].launch(max(1, min(-(-channels // tpb), 1024)), tpb, handle,
                                                   (partials, scale_view, zp_view),
                                                   (parts, channels, inner, *self._q_scalars), device_id)


def _address(op: Operand) -> int:
    return op.host.ctypes.data if SIMULATOR else op.ptr


def _offset(view: ArrayArg, offset: int, dtype: Any, count: int) -> ArrayArg:
    """``count`` items of ``dtype`` starting ``offset`` bytes into a byte view."""
    ptr, _, _, host = view
    dtype = np.dtype(dtype)
    host_view = None if host is None else host[offset: offset + count * dtype.itemsize].view(dtype)
    return ArrayArg(ptr + offset if ptr else 0, count, dtype.itemsize, host_view)


def _zp_operand(zero_point: Operand | None, view: ArrayArg, like: Operand) -> Operand:
    """The zero points as an operand for the quantize plans (the scratch view when none was given)."""
    if zero_point is not None:
        return zero_point
    ptr, nitems, _, host = view
    return Operand(host, "numpy" if SIMULATOR else "cai", ElementKind.I32, (nitems,), ptr, True,
                   host=host, device_id=like.device_id)
