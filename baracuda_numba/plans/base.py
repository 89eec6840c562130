"""The Plan surface shared by every plan: ``select`` / ``can_implement`` / ``workspace_size`` /
``sku`` / ``precision_guarantee`` / ``run``, and the machinery of the elementwise family.

``select`` validates the descriptor, resolves the registry entry and compiles the kernel; ``run``
only adapts the arrays, checks them against the cached descriptor and launches.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, fields
from operator import itemgetter
from typing import Any, ClassVar

import numpy as np

from .. import registry
from ..arrays import Operand, adapt, finish, require_contiguous, scalar_value
from ..errors import BaracudaError, InvalidProblem, Unsupported, WorkspaceTooSmall, problem_message
from ..kernels.codecs import math_type
from ..kernels.elementwise import ElementwiseOp, ScaleMode, chunk_elements, chunk_view_itemsize
from ..launch import ArrayArg, KernelLauncher, array_values, stream_handle, synchronize, torch_current_stream
from ..platform import SIMULATOR, require_device
from ..vocabulary import ElementKind, KernelSku, PlanPreference, PrecisionGuarantee, QuantizeKind, element_kind
from .tuning import MemoryTuning, current_tuning

__all__ = ["Verdict", "Plan", "ElementwisePlan", "ArrayScalePlan", "normalise_descriptor"]

DEFAULT_PREFERENCE = PlanPreference()
# The fewest threads sharing a segment in a tiled shift kernel: eight 16-byte chunks, so that a warp's loads are
# whole 128-byte lines (shorter segments keep the untiled kernel).
MIN_TILE_LANES = 8


@dataclass(frozen=True)
class Verdict:
    """Answer of ``can_implement``: truthy when the arguments can run; else the reason and error type."""

    ok: bool
    reason: str = ""
    error: type[BaracudaError] | None = None

    def __bool__(self) -> bool:
        return self.ok


def normalise_descriptor(desc: Any, plan: str) -> None:
    """Coerce element fields to :class:`ElementKind` and check integer fields, in place (frozen ok)."""
    for f in fields(desc):
        value = getattr(desc, f.name)
        if value is None and f.default is None:
            continue  # an optional field left out
        if f.name.endswith("_element"):
            try:
                object.__setattr__(desc, f.name, element_kind(value))
            except TypeError as exc:
                raise InvalidProblem(problem_message(plan, f.name, "an element kind", repr(value))) from exc
        elif f.type in ("int", int):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InvalidProblem(problem_message(plan, f.name, "an integer", repr(value)))
            object.__setattr__(desc, f.name, int(value))


_DEVICE_ATTRIBUTES: dict[tuple[int, str], int] = {}
# What the simulator reports: one SM, and an L2 of 4 KiB, so that tests of a few thousand elements
# also run the kernels chosen for tensors past L2.
_SIMULATED_ATTRIBUTES = {"MULTIPROCESSOR_COUNT": 1, "L2_CACHE_SIZE": 4096}


def _device_attribute(device_id: int, name: str) -> int:
    value = _DEVICE_ATTRIBUTES.get((device_id, name))
    if value is None:
        if SIMULATOR:
            value = _SIMULATED_ATTRIBUTES[name]
        else:
            from numba import cuda

            value = int(getattr(cuda.gpus[device_id], name))
        _DEVICE_ATTRIBUTES[(device_id, name)] = value
    return value


def sm_count(device_id: int) -> int:
    return _device_attribute(device_id, "MULTIPROCESSOR_COUNT")


def l2_bytes(device_id: int) -> int:
    """The L2 cache size of ``device_id`` in bytes."""
    return _device_attribute(device_id, "L2_CACHE_SIZE")


class Plan:
    """Base of every plan. Subclasses set ``KIND``, ``Descriptor`` and ``Args``."""

    KIND: ClassVar[QuantizeKind]
    Descriptor: ClassVar[type]
    Args: ClassVar[type]
    ENTRY: ClassVar[type] = registry.Entry  # the entry type this plan runs

    tuning: Any = None  # the tuning value the plan was selected with (a card's MemoryTuning; LinearPlan's own)

    def __init__(self, desc: Any, entry: registry.RegistryEntry, pref: PlanPreference) -> None:
        self.desc = desc
        self.entry = entry
        self.pref = pref

    @property
    def name(self) -> str:
        return type(self).__name__

    @classmethod
    def select(cls, desc: Any, pref: PlanPreference = DEFAULT_PREFERENCE, tuning: MemoryTuning | None = None) -> Plan:
        """Validate ``desc``, find the kernel and return a reusable plan, launched as a card's ``tuning`` value
        says (default: the current device's, :func:`~baracuda_numba.plans.tuning.current_tuning`; under the
        simulator pass :func:`~baracuda_numba.plans.tuning.launchable` of a card's value).

        Raises :class:`InvalidProblem` for a bad descriptor and :class:`Unsupported` when the
        registry has no kernel for its elements.
        """
        name = cls.__name__
        entry = cls._resolve(desc)
        plan = cls(desc, entry, pref)
        plan.tuning = current_tuning() if tuning is None else tuning
        if pref.max_workspace_bytes is not None and plan.workspace_size() > pref.max_workspace_bytes:
            raise Unsupported(problem_message(name, "pref.max_workspace_bytes",
                                              f">= {plan.workspace_size()}", pref.max_workspace_bytes))
        plan._prepare()
        return plan

    @classmethod
    def _resolve(cls, desc: Any) -> registry.Entry:
        """Check that a device (or the simulator) is there and that ``desc`` is valid, and return its registry
        entry (:class:`InvalidProblem` / :class:`Unsupported` otherwise)."""
        name = cls.__name__
        require_device(name)
        if type(desc) is not cls.Descriptor:
            raise InvalidProblem(problem_message(name, "desc", cls.Descriptor.__name__, type(desc).__name__))
        normalise_descriptor(desc, name)
        cls._validate(desc)
        entry = registry.lookup(cls.KIND, *cls._registry_elements(desc), where=name)
        if not isinstance(entry, cls.ENTRY):  # e.g. packed int4, which has plans of its own
            raise Unsupported(problem_message(name, "output_element", f"an element {name} handles",
                                              f"{entry.output_element.short} (see {entry.kernel_name})"))
        return entry

    @classmethod
    def _validate(cls, desc: Any) -> None:
        """Descriptor checks beyond the types (raise :class:`InvalidProblem`)."""

    @classmethod
    def _registry_elements(cls, desc: Any) -> tuple[ElementKind, ElementKind]:
        return desc.input_element, desc.output_element

    def _prepare(self) -> None:
        """Resolve and compile what ``run`` needs."""

    def workspace_size(self) -> int:
        """Bytes of device workspace ``run`` needs (0: none)."""
        return 0

    def sku(self) -> KernelSku:
        """Identity of the selected kernel."""
        return self.entry.sku

    def precision_guarantee(self) -> PrecisionGuarantee:
        """Numerical contract of the selected kernel."""
        return self.entry.sku.precision_guarantee

    def can_implement(self, args: Any) -> Verdict:
        """Whether ``run(args)`` can run; the verdict carries the reason ``run`` would raise."""
        try:
            self._bind(args)
        except BaracudaError as exc:
            return Verdict(False, str(exc), type(exc))
        return Verdict(True)

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        """Launch on ``stream`` (see :func:`baracuda_numba.launch.stream_handle`). Asynchronous on
        device arrays; host (NumPy) outputs are complete when it returns."""
        bound = self._bind(args)
        if self.workspace_size():
            self._check_workspace(workspace)
        self._launch(bound, stream)

    def run_trusted(self, args: Any, device: int) -> bool:
        """Launch ``args`` on the current PyTorch stream of ``device`` when the caller vouches that
        every operand is a C-contiguous CUDA ``torch.Tensor`` of this plan's dtypes and sizes on
        ``device`` (the op functions' remembered calls, whose key records all of that). Returns False,
        having launched nothing, when the plan has no such path or an operand is off its alignment:
        the caller then runs :meth:`run`."""
        return False

    def _check_workspace(self, workspace: Any) -> None:
        got = 0 if workspace is None else adapt(workspace, self.name, "workspace")
        got_bytes = 0 if got == 0 else got.size * got.element.itemsize
        if got_bytes < self.workspace_size():
            raise WorkspaceTooSmall(self.name, self.workspace_size(), got_bytes)

    def _bind(self, args: Any) -> Any:
        raise NotImplementedError

    def _launch(self, bound: Any, stream: Any) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{self.name}({self.desc}, sku={self.entry.sku}, tuning={getattr(self.tuning, 'card', None)})"


@dataclass(slots=True)
class _Bound:
    a: Operand
    b: Operand | None
    out: Operand
    scalars: tuple
    scale_operands: tuple[Operand, Operand | None] | None


# The parameter slots an elementwise launch rewrites: the data pointers of the chunk and element views
# of a, b and out, of scales and zero points (slot 4 of each 7-slot array struct), then step_q, step_r.
_PATCHED_INT_SLOTS = (slice(4, 60, 7), slice(60, 62))


def fast_pointers(specs: tuple, args: Any) -> tuple[list[int], int] | None:
    """Data pointers and device of ``args``'s arrays named in ``specs`` (``(field, element, count,
    alignment)`` each) when every one is a contiguous CUDA ``torch.Tensor`` (or an operand adapted
    from one) of that element and size, aligned, all on one device; else None (the checked path
    decides)."""
    tensor_type = _torch_tensor_type()
    pointers: list[int] = []
    device = -1
    for field, element, count, alignment in specs:
        value = getattr(args, field)
        kind = type(value)
        if kind is tensor_type:
            if (_TORCH_DTYPES.get(value.dtype) is not element or not value.is_cuda or value.numel() != count
                    or not value.is_contiguous()):
                return None
            ptr, value_device = value.data_ptr(), value.get_device()
        elif kind is Operand:
            if value.origin != "torch" or value.element is not element or value.size != count \
                    or not value.contiguous:
                return None
            ptr, value_device = value.ptr, value.device_id
        else:
            return None
        if ptr % alignment or (device != value_device and device != -1):
            return None
        device = value_device
        pointers.append(ptr)
    return pointers, device


def trusted_pointers(specs: tuple | None, args: Any) -> list[int] | None:
    """Data pointers of ``args``'s tensors named in ``specs`` (as in :func:`fast_pointers`), which the
    caller vouches for (:meth:`Plan.run_trusted`) but for their alignment; None when one is off its
    alignment or ``specs`` is None."""
    if specs is None:
        return None
    pointers = []
    for field, _, _, alignment in specs:
        ptr = getattr(args, field).data_ptr()
        if ptr % alignment:
            return None
        pointers.append(ptr)
    return pointers


class ElementwisePlan(Plan):
    """Plans whose kernel is :mod:`baracuda_numba.kernels.elementwise`.

    Subclasses name the ``Args`` fields the kernel reads (``A_FIELD``, ``B_FIELD``) and writes
    (``OUT_FIELD``), and provide the scalar parameters through ``_scalars``.
    """

    ENTRY = registry.RegistryEntry
    A_FIELD: ClassVar[str]
    B_FIELD: ClassVar[str | None] = None
    OUT_FIELD: ClassVar[str]
    HAS_Q_RANGE: ClassVar[bool] = True  # the descriptor carries q_min / q_max

    @classmethod
    def _validate(cls, desc: Any) -> None:
        cls._validate_shape(desc)
        # An element pair the registry lacks is reported by the lookup, not as a range error.
        grid = cls._grid(desc)
        if cls.HAS_Q_RANGE and (grid is not None or getattr(desc, "output_element", ElementKind.S8).is_integer):
            check_q_range(cls.__name__, desc.q_min, desc.q_max, *cls._q_limits(desc))
            if grid is not None:
                check_fp8_bounds(cls.__name__, desc.q_min, desc.q_max, grid)

    @classmethod
    def _grid(cls, desc: Any) -> ElementKind | None:
        """The FP8 element whose grid the op rounds to (None: an integer grid)."""
        element = getattr(desc, "output_element", None)
        return element if element is not None and element.is_fp8 else None

    @classmethod
    def _validate_shape(cls, desc: Any) -> None:
        """Shape checks of the descriptor (raise :class:`InvalidProblem`)."""

    @classmethod
    def _q_limits(cls, desc: Any) -> tuple[int, int]:
        return desc.output_element.q_range

    def _prepare(self) -> None:
        entry, tuning = self.entry, self.tuning.elementwise
        self._uniform = self._uniform_chunk()
        vectors = self._channel_vectors()
        self._policy = tuning.policy(registry.LaunchRole.CHANNEL_VECTOR if vectors else entry.launch)
        pow2 = self._pow2_segments()
        # tiles: each segment's chunks shared by its threads, their parameters loaded and inverted once a round
        # (kernels/elementwise.py, ``tiled``)
        self._tiled = self._tiles(pow2, chunk_elements(entry.a, entry.b, entry.out), tuning.pow2_tiled_unroll)
        kernel = entry.kernel(tuning.kernel, self._uniform, self._kernel_op(), pow2, channel_vectors=vectors,
                              unroll=self._policy.unroll, tiled=self._tiled)
        self._grid_element = entry.grid
        G = self._chunk = kernel.chunk
        self._unroll = kernel.unroll
        M = self._math = math_type(kernel.precision)
        self._n = self._numel()
        self._elements = (entry.a, entry.b or entry.a, entry.out)
        self._alignments = tuple(min(G * e.itemsize, 16) for e in self._elements)
        # scales and zero points read as vectors of G: their pointers aligned as a vector (else, as the
        # data off its chunk alignment, every element through the element path)
        self._param_alignments = (min(G * np.dtype(M).itemsize, 16), min(G * 4, 16)) if vectors else (1, 1)
        self._launcher = KernelLauncher(kernel.compiled, 8, (np.int64,) * 6 + (M,) * 5)
        # Channel scales with chunks spanning channels: a grid whose stride is a whole number of channel
        # periods launches the thread-stationary kernel (same parameters) in place of the general one.
        self._stationary_launcher: KernelLauncher | None = None
        self._resident_blocks = 0
        if entry.mode is ScaleMode.CHANNELS and not self._uniform and not vectors:
            stationary = entry.kernel(tuning.kernel, False, self._kernel_op(), stationary=True,
                                      unroll=self._policy.unroll)
            self._stationary_launcher = KernelLauncher(stationary.compiled, 8, (np.int64,) * 6 + (M,) * 5)
            self._resident_blocks = stationary.resident_blocks
            if not SIMULATOR:
                stationary.compiled()
        self._geometry_cache: dict[tuple[int, int], tuple[int, int, int, KernelLauncher]] = {}
        self._empty_scales = ArrayArg(0, 0, np.dtype(M).itemsize, np.zeros(0, M))
        self._empty_zero_points = ArrayArg(0, 0, 4, np.zeros(0, np.int32))
        self._fast: tuple | None = None
        self._fast_launches: dict[int, tuple[int, int, tuple[int, int, int], KernelLauncher]] = {}
        if not SIMULATOR:
            kernel.compiled()
            self._install_fast()

    def _tiles(self, pow2: bool, chunk: int, unroll: int) -> bool:
        """Whether the tiled shift kernel of ``unroll`` chunks a thread (a power of two) runs: segments of a
        power-of-two number of chunks, at least ``MIN_TILE_LANES`` threads' worth."""
        if not (pow2 and self._uniform and unroll > 1 and unroll & (unroll - 1) == 0):
            return False
        return self._segments()[0] // chunk >= MIN_TILE_LANES * unroll

    def _install_fast(self) -> None:
        """The parameter template and what :meth:`run`'s fast path reads (GPU only)."""
        self._install_template()
        self._fast_launches.clear()
        if self._n:
            self._fast = self._fast_fields()
            self._fast_ints = itemgetter(*self._fast_int_order())

    def _fast_fields(self) -> tuple:
        """``(field, element, count, alignment)`` of every array the kernel reads or writes, in the
        order of the patched pointers (a, b, out, then scales and zero points), for :meth:`run`'s
        fast path; the alignment is the chunk's so that a fast launch always takes the chunk path."""
        entry, n = self.entry, self._n
        al_a, al_b, al_o = self._alignments
        specs = [(self.A_FIELD, entry.a, n, al_a)]
        if self.B_FIELD:
            specs.append((self.B_FIELD, entry.b, n, al_b))
        specs.append((self.OUT_FIELD, entry.out, n, al_o))
        return tuple(specs)

    def _fast_int_order(self) -> tuple[int, ...]:
        """Where each patched int of the template comes from in ``fast_pointers``' list extended by
        ``(0, step_q, step_r)``: a, a, b, b, out, out, scales, zero points (0 when absent), the steps."""
        count = len(self._fast)
        a, b = 0, (1 if self.B_FIELD else 0)
        out = b + 1
        scale = out + 1 if count > out + 1 else count
        zero_point = out + 2 if count > out + 2 else count
        return a, a, b, b, out, out, scale, zero_point, count + 1, count + 2

    def _install_template(self) -> None:
        """Pack the parameter block once: every call patches only the operand pointers (slots 4, 11,
        ... of the array structs), the grid steps and the scalars."""
        template = self._values((0, 0, 0, 0, 0), self._n // self._chunk, (0, 0), (0,) * 5)
        for launcher in (self._launcher, self._stationary_launcher):
            if launcher is not None:
                launcher.set_template(template, _PATCHED_INT_SLOTS, range(62, 67), self._math)

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        """Launch on ``stream`` (see :func:`baracuda_numba.launch.stream_handle`). Asynchronous on
        device arrays; host (NumPy) outputs are complete when it returns.

        Plain CUDA ``torch.Tensor`` operands (or operands already adapted from them) of the expected
        dtype, size, contiguity and chunk alignment, on one device and the current stream, take a
        fast path: their pointers are patched into the parameter block without building operands.
        Anything else goes through the full checks, with the same results and errors.
        """
        if self._fast is not None and stream is None and type(args) is self.Args:
            found = fast_pointers(self._fast, args)
            if found is not None:
                self._launch_found(args, *found)
                return
        super().run(args, workspace, stream)

    def run_trusted(self, args: Any, device: int) -> bool:
        pointers = trusted_pointers(self._fast, args)
        if pointers is None:
            return False
        self._launch_found(args, pointers, device)
        return True

    def _launch_found(self, args: Any, pointers: list[int], device: int) -> None:
        """The chunk-path launch on ``pointers`` (in :meth:`_fast_fields` order) on ``device``'s current
        PyTorch stream."""
        launch = self._fast_launches.get(device)
        if launch is None:
            launch = self._fast_launch(device)
        blocks, threads, tail, launcher = launch
        pointers += tail
        launcher.launch_patched(blocks, threads, torch_current_stream(device), self._fast_ints(pointers),
                                self._scalars(args), device)

    def _fast_launch(self, device: int) -> tuple[int, int, tuple[int, int, int], KernelLauncher]:
        """``(blocks, threads, (0, step_q, step_r), launcher)`` of a chunk-path launch on ``device``
        (memoised)."""
        blocks, step_q, step_r, launcher = self._geometry(self._n // self._chunk, device)
        launch = self._fast_launches[device] = (blocks, self._policy.threads_per_block, (0, step_q, step_r),
                                                launcher)
        return launch

    def _fast_pointers(self, args: Any) -> tuple[list[int], int] | None:
        return fast_pointers(self._fast, args)

    def _uniform_chunk(self) -> bool:
        return True

    def _pow2_segments(self) -> bool:
        """Whether each scale segment is a power-of-two number of chunks (its index a shift), in row
        mode or with the channel axis outermost (no modulo)."""
        seg_len, channels = self._segments()
        mode = self.entry.mode
        if mode is ScaleMode.SCALAR or (mode is ScaleMode.CHANNELS and self._numel() != seg_len * channels):
            return False
        chunks, rest = divmod(seg_len, chunk_elements(self.entry.a, self.entry.b, self.entry.out))
        return rest == 0 and chunks > 0 and chunks & (chunks - 1) == 0

    def _channel_vectors(self) -> bool:
        """Whether the kernel reads each chunk's channel parameters as vectors: channels along the last
        axis, an op in ``registry.CHANNEL_VECTOR_OPS``, chunks of at most
        ``registry.CHANNEL_VECTOR_MAX_CHUNK`` elements that divide the channel count."""
        entry = self.entry
        if entry.mode is not ScaleMode.CHANNELS or self._uniform or entry.op not in registry.CHANNEL_VECTOR_OPS:
            return False
        seg_len, channels = self._segments()
        chunk = chunk_elements(entry.a, entry.b, entry.out)
        return seg_len == 1 and chunk <= registry.CHANNEL_VECTOR_MAX_CHUNK and channels % chunk == 0

    def _kernel_op(self) -> ElementwiseOp | None:
        """A variant of the entry's op to compile instead (None: the entry's own)."""
        return None

    def _numel(self) -> int:
        return self.desc.numel

    def _operand(self, args: Any, field: str, element: ElementKind, numel: int) -> Operand:
        return checked_operand(self.name, getattr(args, field), field, element, numel)

    def _bind(self, args: Any) -> _Bound:
        if not isinstance(args, self.Args):
            raise InvalidProblem(problem_message(self.name, "args", self.Args.__name__, type(args).__name__))
        entry, n = self.entry, self._n
        a = self._operand(args, self.A_FIELD, entry.a, n)
        b = self._operand(args, self.B_FIELD, entry.b, n) if self.B_FIELD else None
        out = self._operand(args, self.OUT_FIELD, entry.out, n)
        return _Bound(a, b, out, self._scalars(args), self._scale_operands(args))

    def _scalars(self, args: Any) -> tuple:
        """``(inv, scale, zero_point, q_min, q_max)`` in the math precision (the scalar scale's, or
        only the q range when scales are arrays)."""
        raise NotImplementedError

    def _scale_operands(self, args: Any) -> tuple[Operand, Operand | None] | None:
        """Array ``scale`` and ``zero_point`` operands (None for a scalar scale)."""
        return None

    def _segments(self) -> tuple[int, int]:
        """``(seg_len, channels)`` of the scale indexing (unused for a scalar scale)."""
        return 1, 1

    def _values(self, pointers: tuple[int, ...], nchunks: int, steps: tuple[int, int], scalars: tuple) -> list:
        """Every kernel parameter value, in order, for operands at ``pointers`` (a, b, out, scales,
        zero_points) on a GPU."""
        G, n = self._chunk, self._n
        values: list = []
        for ptr, element in zip(pointers, self._elements, strict=False):
            word = chunk_view_itemsize(G * element.itemsize)
            values += array_values(ptr, nchunks * G * element.itemsize // word, word)
            values += array_values(ptr, n, element.itemsize)
        n_segments = self._segment_count()
        values += array_values(pointers[3], n_segments, np.dtype(self._math).itemsize)
        values += array_values(pointers[4], n_segments, 4)
        values += (n, nchunks, *self._segments(), *steps, *scalars)
        return values

    def _segment_count(self) -> int:
        return 0

    def _geometry(self, nchunks: int, device_id: int) -> tuple[int, int, int, KernelLauncher]:
        """``(blocks, step_q, step_r, launcher)``: the grid, how far one grid stride moves in segments,
        and the kernel to launch (the thread-stationary one where the stride is a whole number of
        channel periods)."""
        geometry = self._geometry_cache.get((device_id, nchunks))
        if geometry is None:
            policy = self._policy
            work = max(-(-nchunks // self._unroll), self._n - nchunks * self._chunk)
            blocks = policy.blocks(work, sm_count(device_id))
            seg_len, channels = self._segments()
            if nchunks and self._stationary_launcher is not None:
                # One wave of resident threads, each looping over many chunks: a stationary thread
                # loads G parameter triples once, which a 16-wave grid would repeat for ~4 chunks.
                waves = self.tuning.elementwise.waves(max(e.itemsize for e in self._elements))
                resident = self._resident_blocks * sm_count(device_id) * waves
                blocks = stationary_blocks(min(blocks, resident), policy.threads_per_block * self._chunk,
                                           seg_len * channels, policy.blocks_per_sm * sm_count(device_id))
            step_q, step_r = divmod(blocks * policy.threads_per_block * self._chunk, seg_len)
            if self.entry.mode is ScaleMode.CHANNELS:
                step_q %= channels
            launcher = self._launcher
            if nchunks and self._stationary_launcher is not None and step_q == 0 and step_r == 0:
                launcher = self._stationary_launcher
            geometry = self._geometry_cache[(device_id, nchunks)] = (blocks, step_q, step_r, launcher)
        return geometry

    def _launch(self, bound: _Bound, stream: Any) -> None:
        if self._n == 0:
            return
        a, out = bound.a, bound.out
        b = bound.b if bound.b is not None else a
        handle = stream_handle(stream, (a, out), self.name)
        threads = self._policy.threads_per_block
        if SIMULATOR:
            self._launch_simulated(a, b, out, bound, threads)
        else:
            scale, zero_point = bound.scale_operands or (None, None)
            s_ptr = 0 if scale is None else scale.ptr
            z_ptr = 0 if zero_point is None else zero_point.ptr
            al_a, al_b, al_o = self._alignments
            al_s, al_z = self._param_alignments
            if (a.ptr % al_a == 0 and b.ptr % al_b == 0 and out.ptr % al_o == 0 and s_ptr % al_s == 0
                    and z_ptr % al_z == 0):
                nchunks = self._n // self._chunk
                blocks, step_q, step_r, launcher = self._geometry(nchunks, a.device_id)
                pointers = (a.ptr, a.ptr, b.ptr, b.ptr, out.ptr, out.ptr, s_ptr, z_ptr)
                launcher.launch_patched(blocks, threads, handle, (*pointers, step_q, step_r), bound.scalars,
                                        a.device_id)
            else:  # an operand off its chunk alignment: every element through the element path
                blocks, step_q, step_r, _ = self._geometry(0, a.device_id)
                values = self._values((a.ptr, b.ptr, out.ptr, s_ptr, z_ptr), 0, (step_q, step_r), bound.scalars)
                self._launcher.launch_values(blocks, threads, handle, values, a.device_id)
        if a.on_host or b.on_host or out.on_host:
            synchronize(handle)
            finish(out)

    def _launch_simulated(self, a: Operand, b: Operand, out: Operand, bound: _Bound, threads: int) -> None:
        G, n = self._chunk, self._n
        scale, zero_point = bound.scale_operands or (None, None)
        params = [(op, al) for op, al in zip((scale, zero_point), self._param_alignments, strict=True)
                  if op is not None]
        aligned = all(op.host.ctypes.data % al == 0
                      for op, al in [*zip((a, b, out), self._alignments, strict=True), *params])
        nchunks = n // G if aligned else 0
        scales = (self._empty_scales if scale is None else ArrayArg(0, scale.size, scale.element.itemsize, scale.host),
                  self._empty_zero_points if zero_point is None else ArrayArg(0, zero_point.size, 4, zero_point.host))
        arrays = (*chunk_views(a, n, nchunks, G), *chunk_views(b, n, nchunks, G), *chunk_views(out, n, nchunks, G),
                  *scales)
        blocks, step_q, step_r, launcher = self._geometry(nchunks, 0)
        launcher.launch(blocks, threads, 0, arrays, (n, nchunks, *self._segments(), step_q, step_r, *bound.scalars))


class ArrayScalePlan(ElementwisePlan):
    """Plans whose ``scale`` / ``zero_point`` are arrays, one pair per segment of the flat tensor.

    Scales are in the math precision (float32, or float64 for f64 data) and zero points int32, any
    shape with ``segment count`` elements, C-contiguous. An element scale of 0 quantizes its
    segment to ``clamp(zero_point)`` with zero gradient. Array zero points are not range-checked
    (that would need a device reduction): the clamp bounds the result either way.
    """

    READS_ZERO_POINT: ClassVar[bool] = True

    def _prepare(self) -> None:
        super()._prepare()
        M = self._math
        q_range = (self.desc.q_min, self.desc.q_max) if self.HAS_Q_RANGE else (0, 0)
        self._fixed_scalars = (M(0), M(0), M(0), M(q_range[0]), M(q_range[1]))
        self._scale_element = ElementKind.F64 if M is np.float64 else ElementKind.F32
        self._default_zero_points: dict[Any, Any] = {}

    def _uniform_chunk(self) -> bool:
        return self._segments()[0] % chunk_elements(self.entry.a, self.entry.b, self.entry.out) == 0

    def _reads_zero_points(self) -> bool:
        return self.READS_ZERO_POINT and self._grid_element is None  # FP8 takes none

    def _fast_fields(self) -> tuple:
        count = self._segment_count()
        al_s, al_z = self._param_alignments
        specs = (("scale", ElementKind.F64 if self._math is np.float64 else ElementKind.F32, count,
                  max(np.dtype(self._math).itemsize, al_s)),)
        if self._reads_zero_points():
            specs += (("zero_point", ElementKind.I32, count, max(4, al_z)),)
        return super()._fast_fields() + specs

    def default_zero_points(self, device: Any) -> Any:
        """What a call without zero points passes: an int32 torch zeros tensor of the segment count on
        ``device`` (a ``torch.device``), kept by the plan and never written; None when the plan reads
        none (FP8)."""
        if not self._reads_zero_points():
            return None
        zeros = self._default_zero_points.get(device)
        if zeros is None:
            import torch

            zeros = torch.zeros(self._segment_count(), dtype=torch.int32, device=device)
            torch.cuda.synchronize(device)  # filled before a launch on any stream reads it
            self._default_zero_points[device] = zeros
        return zeros

    def _scalars(self, args: Any) -> tuple:
        return self._fixed_scalars

    def _scale_operands(self, args: Any) -> tuple[Operand, Operand | None]:
        count = self._segment_count()
        scale = self._operand(args, "scale", self._scale_element, count)
        if self._grid_element is not None:
            check_no_zero_point(self.name, getattr(args, "zero_point", None), self._grid_element)
            return scale, None
        zero_point = self._operand(args, "zero_point", ElementKind.I32, count) if self.READS_ZERO_POINT else None
        return scale, zero_point


def stationary_blocks(blocks: int, chunk_elements_per_block: int, period: int, cap: int) -> int:
    """``blocks`` rounded up so that one grid stride (``blocks * chunk_elements_per_block``
    elements) is a whole number of channel periods (``seg_len * channels`` elements), which lets
    each thread of the channel kernel load its chunk's parameters once (``step_q == step_r == 0``);
    unchanged when that would take more than ``cap`` blocks."""
    multiple = period // math.gcd(period, chunk_elements_per_block)
    rounded = -(-blocks // multiple) * multiple
    return rounded if rounded <= cap else blocks


_TORCH_DTYPES: dict[Any, ElementKind] = {}


def _torch_tensor_type() -> type | None:
    """``torch.Tensor`` once torch is imported (never imports it), and its dtype table."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({torch.float16: ElementKind.F16, torch.bfloat16: ElementKind.BF16,
                              torch.float32: ElementKind.F32, torch.float64: ElementKind.F64,
                              torch.int8: ElementKind.S8, torch.uint8: ElementKind.U8, torch.int32: ElementKind.I32})
    return torch.Tensor


def chunk_views(op: Operand, n: int, nchunks: int, G: int) -> tuple[ArrayArg, ArrayArg]:
    """A flat operand as kernel arguments: its chunks (``nchunks`` of ``G`` elements) and its elements."""
    itemsize = op.element.itemsize
    word = chunk_view_itemsize(G * itemsize)
    words = nchunks * G * itemsize // word
    if not SIMULATOR:
        return ArrayArg(op.ptr, words, word), ArrayArg(op.ptr, n, itemsize)
    host = op.host
    return (ArrayArg(0, words, word, host[: nchunks * G].view(f"u{word}")),
            ArrayArg(0, n, itemsize, host.view(f"u{itemsize}")))


def typed_view(op: Operand, dtype: Any, count: int | None = None) -> ArrayArg:
    """``op``'s memory as a flat array of ``dtype`` (``count`` items, default: all that fit)."""
    dtype = np.dtype(dtype)
    if count is None:
        count = op.size * op.element.itemsize // dtype.itemsize
    host = None if not SIMULATOR else op.host.view(np.uint8)[: count * dtype.itemsize].view(dtype)
    return ArrayArg(op.ptr, count, dtype.itemsize, host)


def checked_operand(plan: str, value: Any, field: str, element: ElementKind, count: int) -> Operand:
    """``value`` adapted, with ``count`` elements of ``element``, C-contiguous; else the typed error."""
    op = adapt(value, plan, field)
    if op.element is not element:
        raise InvalidProblem(problem_message(plan, field, f"elements of {element.short}", op.element.short))
    if op.size != count:
        raise InvalidProblem(problem_message(plan, field, f"{count} elements", f"{op.size} (shape {op.shape})"))
    require_contiguous(op, plan, field)
    return op


# (math type, scale) -> (inv, scale) for scales seen recently: a training or serving loop passes the
# same few scales every step, and NumPy scalar arithmetic and errstate cost ~3 us a call.
_VALID_SCALES: dict[tuple[type, Any], tuple[Any, Any]] = {}
_VALID_SCALES_LIMIT = 1024


def checked_scale(plan: str, scale: Any, M: type, argument: str = "scale") -> tuple[Any, Any]:
    """``(inv, scale)`` in the math type; :class:`InvalidProblem` unless finite, > 0 and invertible."""
    if type(scale) is float:
        known = _VALID_SCALES.get((M, scale))
        if known is not None:
            return known
    value = scalar_value(scale, plan, argument)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # overflow is reported below
        try:
            s = M(value)
        except (TypeError, ValueError, OverflowError):
            s = M(math.nan)
        inv = M(1.0) / s
    if not (np.isfinite(s) and s > 0 and np.isfinite(inv)):
        precision = np.dtype(M).name
        raise InvalidProblem(problem_message(
            plan, argument, f"a finite value > 0 with a finite reciprocal in {precision}", value))
    if type(scale) is float:
        if len(_VALID_SCALES) >= _VALID_SCALES_LIMIT:
            _VALID_SCALES.clear()
        _VALID_SCALES[(M, scale)] = (inv, s)
    return inv, s


def checked_zero_point(plan: str, zero_point: Any, low: int, high: int) -> int:
    """The integer zero point in ``[low, high]`` (None means 0); else :class:`InvalidProblem`."""
    if zero_point is None:
        zero_point = 0
    value = scalar_value(zero_point, plan, "zero_point")
    if isinstance(value, (float, np.floating)):
        if not float(value).is_integer():
            raise InvalidProblem(problem_message(plan, "zero_point", "an integer", value))
        value = int(value)
    if not low <= value <= high:
        raise InvalidProblem(problem_message(plan, "zero_point", f"an integer in [{low}, {high}]", value))
    return int(value)


def check_q_range(plan: str, q_min: int, q_max: int, low: int, high: int) -> None:
    if q_min > q_max:
        raise InvalidProblem(problem_message(plan, "q_min", f"<= q_max ({q_max})", q_min))
    if q_min < low or q_max > high:
        raise InvalidProblem(problem_message(plan, "(q_min, q_max)", f"within [{low}, {high}]", f"[{q_min}, {q_max}]"))


def check_no_zero_point(plan: str, zero_point: Any, grid: ElementKind) -> None:
    """FP8 has no zero point: :class:`InvalidProblem` unless ``zero_point`` is None."""
    if zero_point is not None:
        given = type(zero_point).__name__ if hasattr(zero_point, "shape") else repr(zero_point)
        raise InvalidProblem(problem_message(plan, "zero_point", f"None ({grid.short} has no zero point)", given))


def check_fp8_bounds(plan: str, q_min: int, q_max: int, grid: ElementKind) -> None:
    """FP8 clamp bounds must be values of the format, so that clamping then rounding stays within them."""
    for name, bound in (("q_min", q_min), ("q_max", q_max)):
        if float(np.float32(bound).astype(grid.numpy_dtype)) != bound:
            raise InvalidProblem(problem_message(plan, name, f"a value representable in {grid.short}", bound))


def check_numel(plan: str, numel: int) -> None:
    if numel < 0:
        raise InvalidProblem(problem_message(plan, "numel", ">= 0", numel))
