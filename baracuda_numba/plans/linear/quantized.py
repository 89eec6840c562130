""":class:`QuantizedLinearPlan`: ``x`` quantized per token (or with one static scale) in the same call, then
the int8 GEMM."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ...arrays import Operand, adapt, allocate_like, sub_operand
from ...errors import InvalidProblem, MisalignedOperand, problem_message
from ...kernels.linear import gemm_kernel
from ...launch import ArrayArg, KernelLauncher, array_values, fill_words, stream_handle, zero_words
from ...platform import SIMULATOR
from ...vocabulary import ElementKind
from ...workspace import stream_workspaces
from ..base import _torch_tensor_type, checked_operand, checked_scale
from ..dynamic import (
    DynamicRangeMode,
    DynamicRangeQuantizeArgs,
    DynamicRangeQuantizeDescriptor,
    DynamicRangeQuantizePlan,
    DynamicRangeScope,
)
from ..per_tensor import QuantizePerTensorArgs, QuantizePerTensorDescriptor, QuantizePerTensorPlan
from .chooser import workspace_layout
from .fast import capturing
from .plan import LinearPlan, _pointer_slots, _scalar_slot, address, pair_view, vector, word_view
from .problem import QuantizedLinearArgs, QuantizedLinearDescriptor

__all__ = ["QuantizedLinearPlan"]

_ZERO_F32 = np.float32(0.0)


class QuantizedLinearPlan(LinearPlan):
    """``y = (quantize_per_token(x) @ weight.T) * scale_x * weight_scale (+ bias)`` in ``x``'s dtype; with
    ``static_activation``, ``quantize_per_tensor(x, act_scale)`` and ``scale_x = act_scale``."""

    Descriptor = QuantizedLinearDescriptor
    Args = QuantizedLinearArgs

    def _prepare(self) -> None:
        d = self.desc
        self._quantizer = DynamicRangeQuantizePlan.select(DynamicRangeQuantizeDescriptor(
            (d.m, d.k), DynamicRangeMode.SYMMETRIC, DynamicRangeScope.token(), -127, 127, d.input_element,
            ElementKind.S8))
        self.spec = self._choose(self._quantizer.workspace_size())
        self._scale_element = ElementKind.F64 if d.input_element is ElementKind.F64 else ElementKind.F32
        self._scale_offset, self._quantizer_offset, _ = workspace_layout(d.m, d.k, d.input_element)
        # static_activation, where the fused kernel does not run: x quantized with the given scale by the static
        # quantizer (x as whole 16-byte pieces), the GEMM its programmatic dependent as after the per-token one;
        # else by the per-tensor plan, then a fill of the row scales
        self._tensor_quantizer = QuantizePerTensorPlan.select(QuantizePerTensorDescriptor(
            d.m * d.k, -127, 127, d.input_element, ElementKind.S8)) if d.static_activation else None
        static = self.spec.static_quantizer
        self._static_quantizer: KernelLauncher | None = None
        self._static_pieces = d.m * d.k * d.input_element.itemsize // 16
        if static is not None:
            self._static_quantizer = KernelLauncher(gemm_kernel(static.config).compiled, 3,
                                                    (np.int64, np.int64, np.float32), dependent=static.dependent)
        self._build_launchers()
        if self.spec.capture_unfused and not SIMULATOR:
            # a captured call launches the two kernels (the checked path's quantizer, static or per token, then the
            # GEMM): loaded now, not while a graph is captured, though eager calls only ever ran the fused kernel
            from numba import cuda

            device = cuda.get_current_device().id
            self._launchers["skinny_vector"]._function(device)
            if not d.static_activation:
                quantizer = self._quantizer.segment_launch_fast(0, 0, 0, 0)[0]
            elif self._static_quantizer is not None:
                quantizer = self._static_quantizer
            else:  # the per-tensor plan's kernel
                quantizer = getattr(self._tensor_quantizer, "_launcher", None)
            if quantizer is not None:
                quantizer._function(device)

    def _install_fast_template(self) -> None:
        super()._install_fast_template()
        if self._static_quantizer is not None and self._fast_specs is not None:
            d, per_pair = self.desc, 16 // self.desc.input_element.itemsize
            pieces = self._static_pieces
            values = [*array_values(0, 2 * pieces, 8), *array_values(0, pieces, per_pair), *array_values(0, d.m, 4),
                      pieces, d.m, 0.0]
            self._static_quantizer.set_template(values, (_pointer_slots(3),), _scalar_slot(3, 2), np.float32)

    def _fast_row_vector(self) -> ArrayArg:
        return ArrayArg(0, self.desc.m, self._scale_element.itemsize)

    def _fast_scale(self, args: Any) -> Any:
        if self.desc.static_activation:
            return self._activation_scale(args)  # InvalidProblem, as the checked path, unless finite and > 0
        return None if args.act_scale is not None else _ZERO_F32

    def _activation_scale(self, args: Any) -> np.float32:
        """The static activation scale of ``args`` as float32 (0 without ``static_activation``, where
        ``args.act_scale`` must be None); :class:`InvalidProblem` unless finite, > 0 and invertible."""
        if not self.desc.static_activation:
            if args.act_scale is not None:
                raise InvalidProblem(problem_message(self.name, "act_scale", "None (static_activation=False)",
                                                     repr(args.act_scale)))
            return _ZERO_F32
        return checked_scale(self.name, args.act_scale, np.float32, "act_scale")[1]

    def _workspace_pointer(self, workspace: Any, device: int) -> int | None:
        """The address of a workspace the fast path takes unchecked (a contiguous, 16-byte aligned CUDA
        tensor, or an operand adapted from one, of at least ``workspace_size()`` bytes on ``device``),
        else None."""
        kind = type(workspace)
        if kind is _torch_tensor_type():
            if (not workspace.is_cuda or workspace.get_device() != device or not workspace.is_contiguous()
                    or workspace.numel() * workspace.element_size() < self.workspace_size()):
                return None
            ptr = workspace.data_ptr()
        elif kind is Operand:
            if (workspace.origin != "torch" or workspace.device_id != device or not workspace.contiguous
                    or workspace.size * workspace.element.itemsize < self.workspace_size()):
                return None
            ptr = workspace.ptr
        else:
            return None
        return None if ptr % 16 else ptr

    def _stream_workspace(self, device: int, stream: int) -> int:
        """The address of a workspace for an eager call on ``stream`` of ``device``: the stream's buffer in
        :func:`~baracuda_numba.workspace.stream_workspaces` (driver memory every plan on the stream shares:
        launches on one stream run in order). A call being captured into a CUDA graph gets bytes of the graph's
        own pool instead, dropped at once: the caching allocator keeps a block allocated during a capture for the
        graph's replays (a graph may replay on another stream, next to eager calls on this one), and a buffer
        kept past the call would be a block of that pool no graph output owns, which
        ``torch.compile(mode="reduce-overhead")`` refuses (``docs/design-linear.md``, "Graph capture")."""
        if capturing(stream):
            torch = sys.modules["torch"]
            return torch.empty(self.workspace_size(), dtype=torch.uint8, device=torch.device("cuda", device)).data_ptr()
        return stream_workspaces().pointer(device, stream, self.workspace_size())

    def _bind(self, args: Any) -> tuple:
        if not isinstance(args, self.Args):
            raise InvalidProblem(problem_message(self.name, "args", self.Args.__name__, type(args).__name__))
        d = self.desc
        x = checked_operand(self.name, args.input, "input", d.input_element, d.m * d.k)
        bound = (x, *self._common(args))
        if self.spec.other is None and d.m and d.n and d.k:  # only the fused kernel runs: no workspace
            for field, op in (("input", x), ("weight", bound[1])):
                if address(op) % 16:
                    raise MisalignedOperand(problem_message(self.name, field, "a 16-byte aligned address (the fused "
                                                            "kernel alone fits pref.max_workspace_bytes)",
                                                            f"{address(op) % 16} bytes past one"))
        return bound

    def _static_quantize(self, x: Operand, workspace: Operand, scale_x: Operand, act_scale: np.float32,
                         handle: int) -> bool:
        """The checked path's launch of the static quantizer (``x`` into the workspace's rows, ``act_scale`` into
        ``scale_x``); False (nothing launched) where ``x`` is not whole 16-byte pieces at a 16-byte address."""
        d, static = self.desc, self.spec.static_quantizer
        if static is None or address(x) % 16 or d.m * d.k * d.input_element.itemsize % 16:
            return False
        per_pair = 16 // d.input_element.itemsize
        arrays = (pair_view(x, 16 * self._static_pieces), word_view(workspace, 0, d.m * d.k, per_pair),
                  vector(scale_x))
        self._static_quantizer.launch(static.blocks, static.threads, handle, arrays,
                                      (self._static_pieces, d.m, act_scale), x.device_id)
        return True

    def _quantize(self, args: Any, x: Operand, ws: Operand, act_scale: np.float32,
                  handle: int) -> tuple[Operand, Operand]:
        """``x`` quantized into the workspace (per token, or with the static scale), its row scales after them;
        returns the quantized rows."""
        d = self.desc
        scale_x = sub_operand(ws, self._scale_offset, self._scale_element, (d.m,))
        xq = sub_operand(ws, 0, ElementKind.S8, (d.m, d.k))
        if d.static_activation:  # x per tensor, every row's scale the given one
            if not (d.k and self._static_quantize(x, ws, scale_x, act_scale, handle)):
                if d.k:
                    self._tensor_quantizer.run(QuantizePerTensorArgs(x, args.act_scale, 0, xq), stream=handle)
                if SIMULATOR:
                    scale_x.host[...] = act_scale
                else:
                    fill_words(scale_x.ptr, int(act_scale.view(np.uint32)), d.m, handle)
        elif d.k:
            scratch = sub_operand(ws, self._quantizer_offset, ElementKind.U8, (self._quantizer.workspace_size(),))
            self._quantizer.run(DynamicRangeQuantizeArgs(x, xq, scale_x, None), workspace=scratch, stream=handle)
        elif SIMULATOR:  # K = 0: no quantizer runs, and the epilogue's (0 * scale) must not read a stale NaN
            scale_x.host[...] = 0
        else:
            zero_words(scale_x.ptr, d.m * self._scale_element.itemsize // 4, handle)
        return xq, scale_x

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        """Quantize ``args.input`` per token into the workspace, then the int8 GEMM and epilogue.

        ``workspace``: at least ``workspace_size()`` bytes, or None to let the plan allocate it (the fused kernel
        needs none; the fast path keeps one per stream). Which kernels run is :func:`~.chooser.choose`'s choice
        (``docs/design-linear.md``): at decode the fused kernel for a few tokens, else the quantizer and the skinny
        GEMM as its programmatic dependent; for prefill the warpgroup kernel on sm_90a, else the pipelined one.
        Contiguous CUDA ``torch.Tensor`` operands of the expected dtypes on one device, aligned, with ``stream=None``
        take the fast path (:mod:`.fast`): their pointers patched into a pre-packed parameter block."""
        if self._fast_specs is not None and stream is None and type(args) is QuantizedLinearArgs \
                and self._run_fast(args, workspace):
            return
        x, weight, weight_scale, bias, output = self._bind(args)
        act_scale = self._activation_scale(args)
        d = self.desc
        if d.m == 0 or d.n == 0:
            return
        handle = stream_handle(stream, (x, output), self.name)
        one_launch = d.k and address(x) % 16 == 0 and address(weight) % 16 == 0
        if self.spec.fused and one_launch and not (self.spec.capture_unfused and capturing(handle)):
            if workspace is not None:
                self._check_workspace(workspace)
            self._gemm(x, weight, None, weight_scale, bias, output, act_scale, handle)
            self._finish(output, x, handle)
            return
        if workspace is None:
            workspace = allocate_like(x, (self.workspace_size(),), ElementKind.U8)
        else:
            self._check_workspace(workspace)
        ws = adapt(workspace, self.name, "workspace")
        xq, scale_x = self._quantize(args, x, ws, act_scale, handle)
        self._gemm(xq, weight, scale_x, weight_scale, bias, output, 0.0, handle, unfused=True)
        self._finish(output, x, handle)
