"""What both W8A8 plans share (the selection through :func:`~.chooser.choose`, the launchers of the chosen
variants, the checked launch of the GEMM), and :class:`SmoothQuantLinearPlan`."""

from __future__ import annotations

import sys
from typing import Any, ClassVar

import numpy as np

from ... import registry
from ...arrays import Operand, finish
from ...errors import InvalidProblem, Unsupported, problem_message
from ...kernels.linear import MAX_EXACT_K, gemm_kernel
from ...launch import ArrayArg, KernelLauncher, stream_handle, synchronize
from ...platform import SIMULATOR
from ...vocabulary import ElementKind, KernelSku, PlanPreference, PrecisionGuarantee, QuantizeKind
from ..base import DEFAULT_PREFERENCE, Plan, checked_operand, checked_scale, fast_pointers
from .chooser import LaunchSpec, choose
from .fast import FastPath, fast_path
from .problem import SmoothQuantLinearArgs, SmoothQuantLinearDescriptor
from .tuning import DeviceProperties, LinearTuning, device_properties, tuning_for

__all__ = ["LinearPlan", "SmoothQuantLinearPlan"]

SCALARS = (np.int64,) * 4 + (np.bool_, np.float32)  # M, N, K, tiles_m, aligned, tensor_scale


def _pointer_slots(arrays: int) -> slice:
    """The parameter slots a fast launch rewrites: the data pointer of each of ``arrays`` array structs."""
    return slice(4, 7 * arrays, 7)


def _scalar_slot(arrays: int, index: int) -> range:
    """... and the float32 scalar ``index`` after the arrays (tensor_scale: 5, after M, N, K, tiles_m, aligned)."""
    return range(7 * arrays + index, 7 * arrays + index + 1)


def address(op: Operand) -> int:
    """Where ``op``'s bytes start (the host copy's under the simulator)."""
    return op.host.ctypes.data if SIMULATOR else op.ptr


def pair_view(op: Operand, nbytes: int) -> ArrayArg:
    """``nbytes`` of ``op`` as uint64 (16-byte aligned: read as pairs)."""
    if SIMULATOR:
        return ArrayArg(0, nbytes // 8, 8, op.host.view(np.uint8)[: nbytes // 8 * 8].view(np.uint64))
    return ArrayArg(op.ptr, nbytes // 8, 8)


def byte_views(op: Operand, nbytes: int) -> tuple[ArrayArg, ArrayArg]:
    if SIMULATOR:
        return ArrayArg(0, nbytes, 1, op.host.view(np.uint8)), pair_view(op, nbytes)
    return ArrayArg(op.ptr, nbytes, 1), ArrayArg(op.ptr, nbytes // 8, 8)


def vector(op: Operand) -> ArrayArg:
    return ArrayArg(op.ptr, op.size, op.element.itemsize, op.host)


def element_view(op: Operand, count: int) -> ArrayArg:
    itemsize = op.element.itemsize
    return ArrayArg(op.ptr, count, itemsize, None if op.host is None else op.host.view(f"u{itemsize}"))


def word_view(op: Operand, offset: int, nbytes: int, itemsize: int) -> ArrayArg:
    """``nbytes`` of ``op`` from byte ``offset`` as unsigned integers of ``itemsize`` bytes."""
    if SIMULATOR:
        return ArrayArg(0, nbytes // itemsize, itemsize,
                        op.host.view(np.uint8)[offset: offset + nbytes].view(f"u{itemsize}"))
    return ArrayArg(op.ptr + offset, nbytes // itemsize, itemsize)


def check_weight_scale(plan: str, weight_scale: Operand) -> None:
    """:class:`InvalidProblem` naming the first element of a host ``weight_scale`` that is not finite and > 0.
    Device arrays are not read (a host sync per call): the PyTorch layer checks its scales where it prepares the
    weight."""
    if not weight_scale.on_host or weight_scale.host is None or weight_scale.size == 0:
        return
    values = weight_scale.host.view(np.float32)
    bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidProblem(problem_message(plan, "weight_scale", "finite values > 0", f"{values[i]} at index {i}"))


class LinearPlan(Plan):
    """The W8A8 plans' common part: ``select`` takes the tuning value (part of the plan: the op functions' cache
    keys hold it) and the device's properties, and resolves everything through :func:`~.chooser.choose`."""

    KIND = QuantizeKind.QUANTIZED_LINEAR
    ENTRY = registry.LinearEntry
    smoothquant: ClassVar[bool] = False
    spec: LaunchSpec
    tuning: LinearTuning
    device: DeviceProperties

    @classmethod
    def select(cls, desc: Any, pref: PlanPreference = DEFAULT_PREFERENCE, tuning: LinearTuning | None = None,
               device: DeviceProperties | None = None) -> LinearPlan:
        """Validate ``desc`` and choose its kernels (:func:`~.chooser.choose`) for ``device`` (default: the current
        device's properties) with ``tuning`` (default: that card's, :func:`~.tuning.tuning_for`) under ``pref``.

        Raises :class:`InvalidProblem` for a bad descriptor and :class:`Unsupported` when the registry has no
        kernel for its elements or ``pref`` rules out every variant."""
        entry = cls._resolve(desc)
        plan = cls(desc, entry, pref)
        plan.device = device_properties() if device is None else device
        plan.tuning = tuning_for(plan.device) if tuning is None else tuning
        plan._prepare()
        return plan

    @classmethod
    def _validate(cls, desc: Any) -> None:
        name = cls.__name__
        for field in ("m", "n", "k"):
            if getattr(desc, field) < 0:
                raise InvalidProblem(problem_message(name, field, ">= 0", getattr(desc, field)))
        if desc.k > MAX_EXACT_K:
            raise InvalidProblem(problem_message(
                name, "k", f"<= {MAX_EXACT_K} (|int8 x int8| sums stay exact in int32)", desc.k))
        for flag in ("has_bias", "static_weight", "static_activation"):
            if not isinstance(getattr(desc, flag, False), bool):
                raise InvalidProblem(problem_message(name, flag, "a bool", repr(getattr(desc, flag))))
        if getattr(desc, "static_activation", False) and desc.input_element is ElementKind.F64:
            raise Unsupported(problem_message(name, "input_element", "f16, bf16 or f32 with a static activation "
                                              "scale (float64 quantizes in float64 math)", "f64"))

    def _choose(self, quantizer_workspace: int = 0) -> LaunchSpec:
        return choose(self.desc, self.device, self.tuning, self.pref, quantizer_workspace, self.name)

    def _build_launchers(self) -> None:
        """A launcher per chosen variant; on a GPU the aligned one loaded now (so that the first, timed or
        captured, call does not compile) and its parameter block packed for the fast path."""
        self._launchers: dict[str, KernelLauncher] = {
            name: KernelLauncher(gemm_kernel(launch.config).compiled, 8, SCALARS, launch.shared_bytes,
                                 launch.dependent)
            for name, launch in self.spec.variants}
        self._fast_specs: tuple | None = None
        self._fast: FastPath | None = None
        self._fast_built = False
        if not SIMULATOR:
            from numba import cuda

            # loaded now (from the disk cache, or compiled), so that the first, timed or captured, call does not
            self._launchers[self.spec.aligned]._function(cuda.get_current_device().id)
            self._install_fast_template()

    def sku(self) -> KernelSku:
        """The SKU of the variant that runs on 16-byte aligned operands (:meth:`kernel_variant` names the one a
        given call runs): its architecture is sm_90a for the warpgroup kernel."""
        return self.entry.variant_sku(self.spec.aligned)

    def precision_guarantee(self) -> PrecisionGuarantee:
        return self.sku().precision_guarantee

    def workspace_size(self) -> int:
        return self.spec.workspace_bytes

    def __repr__(self) -> str:
        return f"{self.name}({self.desc}, sku={self.sku()}, tuning={self.tuning.card})"

    # -- the fast path: plain CUDA torch tensors, pointers patched into a pre-packed parameter block --

    def _fast_input_element(self) -> ElementKind:
        return ElementKind.S8 if self.smoothquant else self.desc.input_element

    def _fast_arrays(self) -> tuple[ArrayArg, ...]:
        """The aligned variant's kernel arrays with null pointers (their sizes are what the template packs)."""
        d, spec = self.desc, self.spec
        if spec.fused:
            itemsize = d.input_element.itemsize
            a_views = (ArrayArg(0, d.m * d.k, itemsize), ArrayArg(0, d.m * d.k * itemsize // 8, 8))
            row = ArrayArg(0, 0, 8 if d.input_element is ElementKind.F64 else 4)
        else:
            a_views = (ArrayArg(0, d.m * d.k, 1), ArrayArg(0, d.m * d.k // 8, 8))
            row = self._fast_row_vector()
        return (*a_views, ArrayArg(0, d.n * d.k, 1), ArrayArg(0, d.n * d.k // 8, 8), row, ArrayArg(0, d.n, 4),
                ArrayArg(0, d.n, 4), ArrayArg(0, d.m * d.n, d.output_element.itemsize))

    def _fast_row_vector(self) -> ArrayArg:
        """The unfused GEMM's row-scale array (SmoothQuant: the weight scales, unread)."""
        return ArrayArg(0, self.desc.n, 4)

    def _install_fast_template(self) -> None:
        """Pack the aligned variant's parameter block once; the fast path patches the 8 pointers and the tensor
        scale."""
        d, spec = self.desc, self.spec
        self._fast, self._fast_built = None, False  # rebuilt on the next fast call, over this template's launchers
        if d.m == 0 or d.n == 0 or d.k == 0 or d.k % 16:
            return
        launch = spec.variant(spec.aligned)
        values: list = []
        arrays = self._fast_arrays()
        for ptr, nitems, itemsize, _ in arrays:
            values += (0, 0, nitems, itemsize, ptr, nitems, itemsize)
        values += (d.m, d.n, d.k, launch.tiles_m(d.m), True, 0.0)
        self._launchers[spec.aligned].set_template(values, (_pointer_slots(len(arrays)),),
                                                   _scalar_slot(len(arrays), 5), np.float32)
        specs = [("input", self._fast_input_element(), d.m * d.k, 16), ("weight", ElementKind.S8, d.n * d.k, 16),
                 ("weight_scale", ElementKind.F32, d.n, 4)]
        if d.has_bias:
            specs.append(("bias", ElementKind.F32, d.n, 4))
        specs.append(("output", d.output_element, d.m * d.n, d.output_element.itemsize))
        self._fast_specs = tuple(specs)

    def _fast_path(self) -> FastPath | None:
        if not self._fast_built:
            self._fast = fast_path(self)
            # a plan selected before torch is imported builds its fast path again once it is
            # (tests/test_linear_fast.py, the plan of a NumPy call)
            self._fast_built = self._fast is not None or "torch" in sys.modules
        return self._fast

    def _fast_pointers(self, args: Any) -> tuple[list[int], int] | None:
        """Pointers and device of ``args`` for the aligned variant (see :func:`.base.fast_pointers`)."""
        return fast_pointers(self._fast_specs, args)

    def _run_fast(self, args: Any, workspace: Any) -> bool:
        """``run``'s fast path: tensors through the fast path's ``checked``, operands adapted from torch tensors
        through ``found``; False where the checked path must decide."""
        fast = self._fast_path()
        if fast is None:
            return False
        if fast.checked(args, workspace):
            return True
        found = self._fast_pointers(args)
        if found is None:
            return False
        act_scale = self._fast_scale(args)
        return act_scale is not None and fast.found(found[0], found[1], workspace, act_scale)

    def run_trusted(self, args: Any, device: int) -> bool:
        fast = self._fast_path()
        return fast is not None and fast.trusted(args, device)

    def _fast_scale(self, args: Any) -> Any:
        """The tensor scale a fast launch patches (float32), or None where the checked path decides."""
        raise NotImplementedError

    def _workspace_pointer(self, workspace: Any, device: int) -> int | None:
        """The address of a workspace the fast path takes unchecked, else None."""
        return None

    def _stream_workspace(self, device: int, stream: int) -> int:
        raise NotImplementedError

    # -- the checked path -------------------------------------------------------------------------------

    def _common(self, args: Any) -> tuple[Operand, Operand | None, Operand | None, Operand]:
        d, name = self.desc, self.name
        weight = checked_operand(name, args.weight, "weight", ElementKind.S8, d.n * d.k)
        weight_scale = checked_operand(name, args.weight_scale, "weight_scale", ElementKind.F32, d.n)
        check_weight_scale(name, weight_scale)
        if d.has_bias:
            if args.bias is None:
                raise InvalidProblem(problem_message(name, "bias", "an [n] float32 array (has_bias=True)", None))
            bias = checked_operand(name, args.bias, "bias", ElementKind.F32, d.n)
        elif args.bias is not None:
            raise InvalidProblem(problem_message(name, "bias", "None (has_bias=False)", type(args.bias).__name__))
        else:
            bias = None
        output = checked_operand(name, args.output, "output", d.output_element, d.m * d.n)
        return weight, weight_scale, bias, output

    def _gemm(self, a: Operand, weight: Operand, row_scale: Operand | None, weight_scale: Operand,
              bias: Operand | None, output: Operand, tensor_scale: float, handle: int, unfused: bool = False) -> None:
        """Launch the GEMM variant ``a``'s and the weight's alignment select (``unfused``: ``a`` is already
        quantized; the fused variant takes ``x`` itself as ``a``)."""
        d, spec = self.desc, self.spec
        aligned = d.k % 16 == 0 and address(a) % 16 == 0 and address(weight) % 16 == 0
        name = spec.aligned if aligned else spec.other
        if unfused and name == "fused":
            name = "skinny_vector"  # `a` is already quantized (and aligned: this is the aligned variant)
        launch = spec.variant(name)
        if name == "fused":  # `a` is x itself; the scales stay in the kernel's shared memory
            a_views = (element_view(a, d.m * d.k), pair_view(a, d.m * d.k * a.element.itemsize))
            row_vector = ArrayArg(0, 0, a.element.itemsize if a.element is ElementKind.F64 else 4,
                                  None if not SIMULATOR else np.zeros(0, np.float64 if a.element is ElementKind.F64
                                                                      else np.float32))
        else:
            a_views = byte_views(a, d.m * d.k)
            row_vector = vector(row_scale if row_scale is not None else weight_scale)
        arrays = (*a_views, *byte_views(weight, d.n * d.k), row_vector,
                  vector(weight_scale), vector(bias if bias is not None else weight_scale),
                  element_view(output, d.m * d.n))
        tiles_m = launch.tiles_m(d.m)
        self._launchers[name].launch(launch.blocks(d.m, d.n), launch.threads, handle, arrays,
                                     (d.m, d.n, d.k, tiles_m, aligned, tensor_scale), a.device_id)

    def kernel_variant(self, args: Any) -> str:
        """Which GEMM kernel ``run(args)`` launches: ``fused`` (the decode kernel quantizing ``x`` itself),
        ``skinny_vector`` (the decode kernel on aligned operands), ``skinny`` (its byte path), ``wgmma`` (prefill
        on sm_90a), ``pipelined`` or ``tiled``."""
        operands = self._bind(args)
        spec = self.spec
        aligned = self.desc.k % 16 == 0 and address(operands[1]) % 16 == 0
        if not self.smoothquant and not spec.fused:
            return spec.aligned if aligned else spec.other  # xq lives in the workspace
        if aligned and spec.fused:
            # x unaligned: quantized into the (aligned) workspace first
            return spec.aligned if address(operands[0]) % 16 == 0 else "skinny_vector"
        return spec.aligned if aligned and address(operands[0]) % 16 == 0 else spec.other

    def _finish(self, output: Operand, primary: Operand, handle: int) -> None:
        if output.on_host or primary.on_host:
            synchronize(handle)
            finish(output)


class SmoothQuantLinearPlan(LinearPlan):
    """``y = (act_q @ weight.T) * act_scale * weight_scale (+ bias)`` with a static activation scale: the int8 GEMM
    and epilogue on pre-quantized activations (no workspace)."""

    Descriptor = SmoothQuantLinearDescriptor
    Args = SmoothQuantLinearArgs
    smoothquant = True

    @classmethod
    def _registry_elements(cls, desc: Any) -> tuple[ElementKind, ElementKind]:
        return ElementKind.S8, desc.output_element

    def _prepare(self) -> None:
        self.spec = self._choose()
        self._build_launchers()

    def _fast_scale(self, args: Any) -> Any:
        return checked_scale(self.name, args.act_scale, np.float32, "act_scale")[1]

    def _bind(self, args: Any) -> tuple:
        if not isinstance(args, self.Args):
            raise InvalidProblem(problem_message(self.name, "args", self.Args.__name__, type(args).__name__))
        d = self.desc
        act = checked_operand(self.name, args.input, "input", ElementKind.S8, d.m * d.k)
        _, act_scale = checked_scale(self.name, args.act_scale, np.float32, "act_scale")
        return (act, *self._common(args), act_scale)

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        """The int8 GEMM and epilogue on pre-quantized activations (no workspace).

        Contiguous CUDA ``torch.Tensor`` arrays of the expected dtypes on one device, 16-byte aligned
        ``act`` and weight, ``K % 16 == 0`` and ``stream=None`` take the fast path (:mod:`.fast`)."""
        if self._fast_specs is not None and stream is None and type(args) is SmoothQuantLinearArgs \
                and self._run_fast(args, None):
            return
        act, weight, weight_scale, bias, output, act_scale = self._bind(args)
        d = self.desc
        if d.m == 0 or d.n == 0:
            return
        handle = stream_handle(stream, (act, output), self.name)
        self._gemm(act, weight, None, weight_scale, bias, output, act_scale, handle)
        self._finish(output, act, handle)
