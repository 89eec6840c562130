"""``DynamicRangeQuantizePlan``: scales and zero points from the run-time range, then quantize.

Both modes (symmetric, asymmetric after torchao's ASYMMETRIC mapping), four scopes (tensor,
channel(axis), token, group(group_size)), f16 / bf16 / f32 / f64 in, s8 / u8 out, any number of
rows, 64-bit sizes, deterministic. The math is in :mod:`baracuda_numba.kernels.dynamic`; the
quantization step is exactly the per-token / per-channel / per-group / per-tensor quantize of the
same scales, so the results can be dequantized with those plans.

Strategies: contiguous segments (token, group, and channel when nothing precedes the channel axis)
run in one fused kernel (the segment resident in registers when it fits ``keep * threads`` chunks,
else streamed; a few aligned segments of exactly one block's chunks, the W8A8 decode's rows, in the
resident kernel compiled for that length); the tensor scope reduces one partial per block, then
quantizes in a second launch whose blocks combine the partials; other channel axes reduce 16-byte column chunks of the
``[outer, C, inner]`` view over slices of rows, finalize per channel, then quantize the same
column decomposition. Launch shapes: the plan's tuning value (:class:`~.tuning.DynamicTuning`, a card's).
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
from ..kernels.elementwise import chunk_view_itemsize
from ..launch import ArrayArg, KernelLauncher, array_values, stream_handle, synchronize
from ..platform import SIMULATOR
from ..vocabulary import ElementKind, QuantizeKind
from .base import (
    Plan,
    check_fp8_bounds,
    check_no_zero_point,
    checked_operand,
    chunk_views,
    l2_bytes,
    sm_count,
    typed_view,
)

__all__ = ["DynamicRangeMode", "DynamicRangeScope", "ScopeKind", "DynamicRangeQuantizeDescriptor",
           "DynamicRangeQuantizeArgs", "DynamicRangeQuantizePlan", "default_dynamic_q_range"]


REGISTERS_PER_SM = 65536  # every architecture since sm_50
MAX_THREADS = 1024  # per block


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


ZERO_POINT_ARRAY = object()  # DynamicRangeQuantizePlan.fast_outputs: the zero points are an array


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
        tuning = self.tuning.dynamic
        compiled = tuning.kernel
        self._symmetric = desc.mode is DynamicRangeMode.SYMMETRIC
        self._n = math.prod(desc.shape)
        streaming = tuning.segment_streaming_stores
        if streaming is None:
            streaming = self._n * (desc.input_element.itemsize + desc.output_element.itemsize) > l2_bytes(0)
        self._streaming = streaming
        self._kernels = kernels = entry.kernels(self._symmetric, tuning.keep, tuning.threads, streaming=streaming,
                                                tuning=compiled)
        self._threads = tpb = kernels.threads
        M = self._math = math_type(entry.sku.precision_guarantee.math_precision)
        self._scale_element = ElementKind.F64 if M is np.float64 else ElementKind.F32
        self._zp_sym = symmetric_zero_point(desc.q_min, desc.q_max) if self._symmetric else 0
        self._zero_point_scratch: dict[Any, Any] = {}
        self._fast_outputs: tuple | None = None
        self._q_scalars = (M(desc.q_min), M(desc.q_max), M(self._zp_sym))
        shape, scope = desc.shape, desc.scope
        sms = sm_count(0)
        if scope.kind is ScopeKind.TENSOR:
            self._strategy = "tensor"
            self._count = 1
            per_block = tpb * kernels.chunk * kernels.keep
            self._partial_blocks = max(1, min(-(-self._n // per_block), tuning.tensor_partial_blocks_per_sm * sms))
            self._quantize_blocks = max(1, min(-(-self._n // per_block), tuning.tensor_quantize_blocks_per_sm * sms))
            self._workspace = 2 * self._partial_blocks * np.dtype(M).itemsize
        elif scope.kind is ScopeKind.CHANNEL and math.prod(shape[:scope.axis]) > 1:
            self._strategy = "columns"
            outer, channels = math.prod(shape[:scope.axis]), shape[scope.axis]
            inner = math.prod(shape[scope.axis + 1:])
            width = channels * inner
            target = tuning.column_threads_per_sm * sms

            def slices(per_part: int) -> tuple[int, int]:
                """(parts, rows_per_part) for ``per_part`` threads per row slice."""
                parts = max(1, min(outer, -(-target // max(per_part, 1))))
                rows_per_part = -(-outer // parts)
                return -(-outer // rows_per_part), rows_per_part

            G = kernels.chunk
            self._columns = (outer, channels, inner, width)
            self._column_slices = {True: slices(width // G) if width % G == 0 else None, False: slices(width)}
            self._count = channels
            most_parts = max(s[0] for s in self._column_slices.values() if s is not None)
            self._workspace = 2 * most_parts * width * np.dtype(M).itemsize
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
            units = -(-seg_len // G)
            min_blocks = tuning.resident_min_blocks
            resident = entry.kernels(self._symmetric, tuning.resident_keep, tuning.resident_threads, min_blocks,
                                     streaming, tuning=compiled)
            if nseg <= sms and units > resident.keep * resident.threads:
                keep, wide = resident.keep, resident.threads
                while wide * keep < units and wide < min(tuning.wide_segment_base_threads, tuning.wide_segment_threads):
                    wide *= 2
                while wide * keep < units and keep < tuning.wide_segment_keep:
                    keep *= 2
                while wide * keep < units and wide < tuning.wide_segment_threads:
                    wide *= 2
                if wide * keep >= units:
                    min_blocks = 1  # registers for `wide`
                    resident = entry.kernels(self._symmetric, keep, wide, min_blocks, streaming, tuning=compiled)
            split, fixed_grid = 1, False
            if units <= resident.keep * resident.threads:
                # lanes per segment: every chunk in registers, at least four lanes where there is work for them
                self._threads = resident.threads
                # aligned segments (cps > 0) / the element path
                self._segment_kernels = (resident.staged if tuning.resident_staged else resident.resident,
                                         resident.resident)
                tps = 1
                while tps * resident.keep < units or tps < min(units, 4):
                    tps *= 2
                blocks_per_sm = tuning.resident_blocks_per_sm
                fixed_keep = tuning.fixed_keep or resident.keep
                fixed_threads = units // fixed_keep
                if (tuning.fixed_segments and nseg <= sms and seg_len % G == 0 and units % fixed_keep == 0
                        and (fixed_threads % WARP == 0 or fixed_threads == resident.threads)
                        and fixed_threads <= MAX_THREADS
                        and (tuning.fixed_keep or fixed_threads == resident.threads)):
                    # few segments of exactly keep * threads chunks: one per block (or per `split` blocks)
                    split = segment_split(nseg, fixed_keep, tuning.segment_split, sms)
                    bound = 0
                    if split > 1 and tuning.segment_split_registers:
                        bound = max(1, REGISTERS_PER_SM // (fixed_threads * tuning.segment_split_registers))
                    fixed = entry.kernels(self._symmetric, fixed_keep, fixed_threads, bound, streaming, split,
                                          tuning=compiled).fixed
                    self._segment_kernels = (fixed, resident.resident)
                    fixed_grid = True
            else:
                self._segment_kernels = (kernels.segment, kernels.segment)
                tps = 1  # lanes per segment: at most a warp, the rest streamed
                while (tps < WARP and tps * kernels.keep < units) or tps < min(units, 4):
                    tps *= 2
                tps = min(tps, WARP)
                blocks_per_sm = tuning.segment_blocks_per_sm
            self._tps = tps
            per_block = self._threads // tps
            self._unaligned_blocks = max(1, min(-(-nseg // per_block), blocks_per_sm * sms))
            self._segment_blocks = nseg * split if fixed_grid else self._unaligned_blocks
            self._segment_threads = fixed_threads if fixed_grid else self._threads
        launcher = {
            "segments": lambda: self._segment_launchers(M),
            "tensor": lambda: (KernelLauncher(kernels.partial.compiled, 3, (np.int64,) * 2),
                               KernelLauncher(kernels.tensor_quantize.compiled, 7, (np.int64,) * 3 + (M,) * 3)),
            "columns": lambda: (KernelLauncher(kernels.column_partial.compiled, 3, (np.int64,) * 5),
                                KernelLauncher(kernels.channel_finalize.compiled, 3, (np.int64,) * 3 + (M,) * 3),
                                KernelLauncher(kernels.column_quantize.compiled, 6, (np.int64,) * 6 + (M,) * 2)),
        }[self._strategy]
        self._launchers = launcher()
        used = {"segments": lambda: set(self._segment_kernels),
                "tensor": lambda: (kernels.partial, kernels.tensor_quantize),
                "columns": lambda: (kernels.column_partial, kernels.channel_finalize, kernels.column_quantize),
                }[self._strategy]()
        self._fast_segments = False
        if not SIMULATOR:  # compile now, not inside the first (timed, captured) call
            for kernel in used:
                kernel.compiled()
            self._install_segment_template()

    def _install_segment_template(self) -> None:
        """Pre-pack the aligned segment kernel's parameters for :meth:`launch_segments_fast` (whole
        16-byte chunks per segment only), so that a launch patches six pointers and goes."""
        if self._strategy != "segments":
            return
        nseg, seg_len = self._segments
        G = self._kernels.chunk
        if self._n == 0 or seg_len % G:
            return
        cps, n = seg_len // G, self._n
        x_size = self.desc.input_element.itemsize
        x_word, q_word = chunk_view_itemsize(G * x_size), chunk_view_itemsize(G)
        values = [*array_values(0, n * x_size // x_word, x_word), *array_values(0, n, x_size),
                  *array_values(0, n // q_word, q_word), *array_values(0, n, 1),
                  *array_values(0, nseg, np.dtype(self._math).itemsize), *array_values(0, nseg, 4),
                  nseg, seg_len, cps, self._tps, *self._q_scalars]
        no_scalars = range(7 * 6 + 4, 7 * 6 + 4)  # the scalars stay as packed
        for name in ("segment", "segment_dependent"):
            self._launchers[name].set_template(values, (slice(4, 42, 7),), no_scalars, self._math)
        self._fast_segments = True

    def fast_alignment(self) -> int | None:
        """Byte alignment :meth:`launch_segments_fast` needs of ``x`` (``q``'s is at most the same), or
        None when this plan has no pre-packed launch (GPU, per-token / per-group / per-channel
        scopes over whole 16-byte chunks)."""
        if not self._fast_segments:
            return None
        return min(self._kernels.chunk * self.desc.input_element.itemsize, 16)

    def launch_segments_fast(self, x_ptr: int, q_ptr: int, scale_ptr: int, zp_ptr: int, stream: int,
                             device: int, dependent: bool = False) -> None:
        """Run on raw device addresses, unchecked: ``x`` (aligned to :meth:`fast_alignment`), ``q``,
        ``scale`` and an int32 ``zero_point`` array (scratch in symmetric mode), of this plan's sizes
        on ``device``. For callers that have checked them (the op's and the W8A8 linear's fast paths).
        ``dependent``: launched as a programmatic dependent of the kernel before whatever the tuning's
        ``dependent_segments_max`` says (else as it says)."""
        launcher, blocks, threads, ints = self.segment_launch_fast(x_ptr, q_ptr, scale_ptr, zp_ptr, dependent)
        launcher.launch_patched(blocks, threads, stream, ints, (), device)

    def segment_launch_fast(self, x_ptr: int, q_ptr: int, scale_ptr: int, zp_ptr: int,
                            dependent: bool = False) -> tuple[KernelLauncher, int, int, tuple[int, ...]]:
        """``(launcher, blocks, threads, ints)``: what :meth:`launch_segments_fast` patches and launches (no
        floats), for a caller that launches it next to its own kernel (:class:`~baracuda_numba.launch.LaunchPair`)."""
        return (self._launchers["segment_dependent" if dependent else "segment"], self._segment_blocks,
                self._segment_threads,
                (x_ptr, x_ptr, q_ptr, q_ptr, scale_ptr, zp_ptr))

    def _segment_launchers(self, M: Any) -> dict[str, KernelLauncher]:
        """``"segment"``: the kernel of aligned segments (the chunk path, which the linear plan's fast
        path also launches, ``_segment_blocks`` of ``_segment_threads``); ``"unaligned"``: the element path's
        (``_unaligned_blocks`` of ``_threads``);
        ``"segment_dependent"``: the aligned one always launched as a programmatic dependent."""
        dependent = 0 < self._segments[0] <= self.tuning.dynamic.dependent_segments_max
        aligned, unaligned = (KernelLauncher(kernel.compiled, 6, (np.int64,) * 4 + (M,) * 3, dependent=dependent)
                              for kernel in self._segment_kernels)
        always = KernelLauncher(self._segment_kernels[0].compiled, 6, (np.int64,) * 4 + (M,) * 3, dependent=True)
        return {"segment": aligned, "unaligned": unaligned, "segment_dependent": always}

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

    def fast_outputs(self) -> tuple:
        """``(fast_alignment(), scale_shape(), the scales' torch dtype, zero point)`` for a caller that
        allocates the outputs itself (memoised): the zero point returned is :data:`ZERO_POINT_ARRAY` in
        asymmetric mode (an int32 array of ``scale_shape()`` is written), else the symmetric constant
        (None for 0), written to :meth:`zero_point_scratch`."""
        found = self._fast_outputs
        if found is None:
            import torch

            zero_point: Any = ZERO_POINT_ARRAY
            if self._symmetric:
                zero_point = self._zp_sym or None
            scale_dtype = torch.float64 if self._math is np.float64 else torch.float32
            found = self._fast_outputs = (self.fast_alignment(), self.scale_shape(), scale_dtype, zero_point)
        return found

    def zero_point_scratch(self, device: Any) -> Any:
        """An int32 torch tensor of :meth:`scale_count` elements on ``device`` (a ``torch.device``), kept by
        the plan: where a symmetric launch whose caller wants no zero points writes them. Every such
        launch writes the same constant and nothing reads it, so launches on any stream may share it."""
        scratch = self._zero_point_scratch.get(device)
        if scratch is None:
            import torch

            scratch = self._zero_point_scratch[device] = torch.empty(max(self._count, 1), dtype=torch.int32,
                                                                     device=device)
        return scratch

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
                self._run_tensor(x, q, partials, scale_view, zp_view, handle, device_id)
            else:
                self._run_columns(x, q, partials, scale_view, zp_view, handle, device_id)
        if any(op is not None and op.on_host for op in (x, q, scale, zero_point)):
            synchronize(handle)
            for op in (q, scale, zero_point):
                if op is not None:
                    finish(op)

    def _run_segments(self, x, q, scale_view, zp_view, handle, device_id) -> None:
        nseg, seg_len = self._segments
        G = self._kernels.chunk
        aligned = seg_len % G == 0 and _aligned(x, G) and _aligned(q, G)
        cps = seg_len // G if aligned else 0
        nchunks = nseg * cps
        arrays = (*chunk_views(x, self._n, nchunks, G), *chunk_views(q, self._n, nchunks, G), scale_view, zp_view)
        launcher = self._launchers["segment" if cps > 0 else "unaligned"]
        blocks, threads = (self._segment_blocks, self._segment_threads) if cps > 0 else (self._unaligned_blocks,
                                                                                         self._threads)
        launcher.launch(blocks, threads, handle, arrays, (nseg, seg_len, cps, self._tps, *self._q_scalars), device_id)

    def _run_tensor(self, x, q, partials, scale_view, zp_view, handle, device_id) -> None:
        G = self._kernels.chunk
        aligned = _aligned(x, G) and _aligned(q, G)
        nchunks = self._n // G if aligned else 0
        x_views = chunk_views(x, self._n, nchunks, G)
        partial, quantize = self._launchers
        partial.launch(self._partial_blocks, self._threads, handle, (*x_views, partials), (self._n, nchunks),
                       device_id)
        quantize.launch(self._quantize_blocks, self._threads, handle,
                        (*x_views, *chunk_views(q, self._n, nchunks, G), partials, scale_view, zp_view),
                        (self._n, nchunks, self._partial_blocks, *self._q_scalars), device_id)

    def _run_columns(self, x, q, partials, scale_view, zp_view, handle, device_id) -> None:
        outer, channels, inner, width = self._columns
        G = self._kernels.chunk
        chunked = self._column_slices[True] is not None and _aligned(x, G) and _aligned(q, G)
        parts, rows_per_part = self._column_slices[chunked]
        cwidth = width // G if chunked else 0
        nchunks = outer * cwidth
        x_views = chunk_views(x, self._n, nchunks, G)
        q_views = chunk_views(q, self._n, nchunks, G)
        tpb = self._threads
        blocks = max(1, -(-(parts * (cwidth or width)) // tpb))
        partial, finalize, quantize = self._launchers
        partial.launch(blocks, tpb, handle, (*x_views, partials), (outer, width, cwidth, parts, rows_per_part),
                       device_id)
        finalize.launch(max(1, min(-(-channels // WARP), 65535)), tpb, handle, (partials, scale_view, zp_view),
                        (parts, channels, inner, *self._q_scalars), device_id)
        quantize.launch(blocks, tpb, handle, (*x_views, *q_views, scale_view, zp_view),
                        (outer, width, cwidth, inner, parts, rows_per_part, *self._q_scalars[:2]), device_id)


def segment_split(nseg: int, keep: int, most: int, sms: int) -> int:
    """Blocks per segment of the fixed resident kernel: the largest power of two dividing ``keep``, at
    most ``most``, that keeps ``nseg`` segments within one block per SM."""
    split = 1
    while split * 2 <= most and keep % (split * 2) == 0 and nseg * split * 2 <= sms:
        split *= 2
    return split


def _aligned(op: Operand, G: int) -> bool:
    """``op`` starts on a chunk boundary (16 bytes, or ``G`` elements when a chunk is narrower)."""
    return _address(op) % min(G * op.element.itemsize, 16) == 0


def _address(op: Operand) -> int:
    return op.host.ctypes.data if SIMULATOR else op.ptr


def _offset(view: ArrayArg, offset: int, dtype: Any, count: int) -> ArrayArg:
    """``count`` items of ``dtype`` starting ``offset`` bytes into a byte view."""
    ptr, _, _, host = view
    dtype = np.dtype(dtype)
    host_view = None if host is None else host[offset: offset + count * dtype.itemsize].view(dtype)
    return ArrayArg(ptr + offset if ptr else 0, count, dtype.itemsize, host_view)
