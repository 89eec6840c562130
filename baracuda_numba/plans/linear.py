"""W8A8 linear layers on tensor cores: ``QuantizedLinearPlan`` (activations quantized per token in the
same call) and ``SmoothQuantLinearPlan`` (pre-quantized activations with a static per-tensor scale).

``y[m, n] = scale_x[m] * weight_scale[n] * sum_k xq[m, k] * wq[n, k] (+ bias[n])``: int8 operands,
exact int32 accumulation (``k <= MAX_EXACT_K``), the epilogue in float32 as
``(f32(acc) * scale_x[m]) * weight_scale[n] + bias[n]``, stored in the output element. The weight
is ``[N, K]`` int8 row-major (``nn.Linear.weight``), ``weight_scale`` ``[N]`` float32, ``bias``
``[N]`` float32. Activations are quantized symmetric int8 in [-127, 127] per row
(:class:`~baracuda_numba.plans.dynamic.DynamicRangeQuantizePlan`) into the plan's workspace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arrays import Operand, adapt, allocate_like, finish, sub_operand
from ..errors import InvalidProblem, problem_message
from ..kernels import linear as gemm
from ..kernels.linear import (
    MAX_EXACT_K,
    SKINNY_M,
    SKINNY_MAX_M,
    SKINNY_N,
    SKINNY_THREADS,
    TILE_M,
    TILE_N,
    TILE_THREADS,
    linear_kernel,
)
from ..launch import ArrayArg, KernelLauncher, stream_handle, synchronize
from ..platform import SIMULATOR
from ..vocabulary import ElementKind, QuantizeKind
from .base import Plan, checked_operand, checked_scale
from .dynamic import (
    DynamicRangeMode,
    DynamicRangeQuantizeArgs,
    DynamicRangeQuantizeDescriptor,
    DynamicRangeQuantizePlan,
    DynamicRangeScope,
)

__all__ = ["QuantizedLinearDescriptor", "QuantizedLinearArgs", "QuantizedLinearPlan",
           "SmoothQuantLinearDescriptor", "SmoothQuantLinearArgs", "SmoothQuantLinearPlan"]


@dataclass(frozen=True)
class QuantizedLinearDescriptor:
    """``x [m, k]`` float, ``weight [n, k]`` int8; the output has ``x``'s element."""

    m: int
    n: int
    k: int
    input_element: ElementKind
    output_element: ElementKind
    has_bias: bool = False


@dataclass
class QuantizedLinearArgs:
    input: Any  # [m, k] float
    weight: Any  # [n, k] int8
    weight_scale: Any  # [n] float32
    output: Any  # [m, n]
    bias: Any = None  # [n] float32


@dataclass(frozen=True)
class SmoothQuantLinearDescriptor:
    """``act_q [m, k]`` int8 with one static scale, ``weight [n, k]`` int8."""

    m: int
    n: int
    k: int
    output_element: ElementKind
    has_bias: bool = False


@dataclass
class SmoothQuantLinearArgs:
    input: Any  # [m, k] int8 (already smoothed and quantized)
    weight: Any  # [n, k] int8 (smoothed weight)
    weight_scale: Any  # [n] float32
    act_scale: float  # the static per-tensor activation scale
    output: Any  # [m, n]
    bias: Any = None  # [n] float32


def _align(n: int) -> int:
    return -(-n // 256) * 256


class _LinearPlan(Plan):
    KIND = QuantizeKind.QUANTIZED_LINEAR

    @classmethod
    def _validate(cls, desc: Any) -> None:
        name = cls.__name__
        for field in ("m", "n", "k"):
            if getattr(desc, field) < 0:
                raise InvalidProblem(problem_message(name, field, ">= 0", getattr(desc, field)))
        if desc.k > MAX_EXACT_K:
            raise InvalidProblem(problem_message(
                name, "k", f"<= {MAX_EXACT_K} (|int8 x int8| sums stay exact in int32)", desc.k))
        if not isinstance(desc.has_bias, bool):
            raise InvalidProblem(problem_message(name, "has_bias", "a bool", repr(desc.has_bias)))

    def _prepare(self) -> None:
        desc = self.desc
        out, per_tensor_rows = self.entry.output_element, self.entry.input_element is ElementKind.S8
        # the kernel variants this plan may launch: (launcher, row tiles, blocks, threads)
        self._variants: dict[str, tuple[KernelLauncher, int, int, int]] = {}
        compiles: dict[str, Any] = {}

        def variant(name: str, kernel: Any, rows: int, cols: int, threads: int, shared_bytes: int = 0) -> None:
            tiles_m = -(-desc.m // rows)
            launcher = KernelLauncher(kernel.compiled, 8, _SCALARS, shared_bytes)
            self._variants[name] = (launcher, tiles_m, tiles_m * -(-desc.n // cols), threads)
            compiles[name] = kernel.compiled

        if desc.m <= SKINNY_MAX_M:
            # decode-like shapes stream the weight once through the skinny kernel (any alignment)
            tiles = gemm.skinny_tiles(desc.k)
            kernel = linear_kernel(out, desc.has_bias, per_tensor_rows, True, None, gemm.SKINNY_CHUNKS, tiles)
            variant("skinny", kernel, SKINNY_M, SKINNY_N * tiles, SKINNY_THREADS)
            self._aligned_variant = self._other_variant = "skinny"
        else:
            # 16-byte aligned operands with K % 16 == 0 go through the cp.async pipeline; others
            # through the register-staged tiled kernel, which assembles unaligned chunks from bytes
            shape = gemm.pipeline_shape(desc.m, desc.n, _multiprocessors())
            variant("pipelined", linear_kernel(out, desc.has_bias, per_tensor_rows, False, shape),
                    shape.tile_m, shape.tile_n, shape.threads, shape.shared_bytes)
            variant("tiled", linear_kernel(out, desc.has_bias, per_tensor_rows), TILE_M, TILE_N, TILE_THREADS)
            self._aligned_variant = "pipelined" if desc.k % 16 == 0 else "tiled"
            self._other_variant = "tiled"
        if not SIMULATOR:
            compiles[self._aligned_variant]()  # compile now rather than in the first run

    def _common(self, args: Any) -> tuple[Operand, Operand, Operand | None, Operand]:
        d, name = self.desc, self.name
        weight = checked_operand(name, args.weight, "weight", ElementKind.S8, d.n * d.k)
        weight_scale = checked_operand(name, args.weight_scale, "weight_scale", ElementKind.F32, d.n)
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
              bias: Operand | None, output: Operand, tensor_scale: float, handle: int) -> None:
        d = self.desc
        aligned = d.k % 16 == 0 and _address(a) % 16 == 0 and _address(weight) % 16 == 0
        name = self._aligned_variant if aligned else self._other_variant
        launcher, tiles_m, blocks, threads = self._variants[name]
        arrays = (*_byte_views(a, d.m * d.k), *_byte_views(weight, d.n * d.k),
                  _vector(row_scale if row_scale is not None else weight_scale),
                  _vector(weight_scale), _vector(bias if bias is not None else weight_scale),
                  ArrayArg(output.ptr, d.m * d.n, output.element.itemsize,
                           None if output.host is None else output.host.view(f"u{output.element.itemsize}")))
        launcher.launch(blocks, threads, handle, arrays, (d.m, d.n, d.k, tiles_m, aligned, tensor_scale),
                        a.device_id)

    def kernel_variant(self, args: Any) -> str:
        """Which GEMM kernel ``run(args)`` launches: ``skinny``, ``pipelined`` or ``tiled``."""
        operands = self._bind(args)
        aligned = self.desc.k % 16 == 0 and _address(operands[1]) % 16 == 0
        if isinstance(self, QuantizedLinearPlan):
            return self._aligned_variant if aligned else self._other_variant  # xq lives in the workspace
        return self._aligned_variant if aligned and _address(operands[0]) % 16 == 0 else self._other_variant


_SCALARS = (np.int64,) * 4 + (np.bool_, np.float32)


def _multiprocessors() -> int:
    """Multiprocessors of the current device (an H100's 132 under the simulator)."""
    if SIMULATOR:
        return 132
    from numba import cuda

    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def _address(op: Operand) -> int:
    return op.host.ctypes.data if SIMULATOR else op.ptr


def _byte_views(op: Operand, nbytes: int) -> tuple[ArrayArg, ArrayArg]:
    if SIMULATOR:
        raw = op.host.view(np.uint8)
        return ArrayArg(0, nbytes, 1, raw), ArrayArg(0, nbytes // 8, 8, raw[: nbytes // 8 * 8].view(np.uint64))
    return ArrayArg(op.ptr, nbytes, 1), ArrayArg(op.ptr, nbytes // 8, 8)


def _vector(op: Operand) -> ArrayArg:
    return ArrayArg(op.ptr, op.size, op.element.itemsize, op.host)


class QuantizedLinearPlan(_LinearPlan):
    """``y = (quantize_per_token(x) @ weight.T) * scale_x * weight_scale (+ bias)`` in ``x``'s dtype."""

    Descriptor = QuantizedLinearDescriptor
    Args = QuantizedLinearArgs

    def _prepare(self) -> None:
        super()._prepare()
        d = self.desc
        self._quantizer = DynamicRangeQuantizePlan.select(DynamicRangeQuantizeDescriptor(
            (d.m, d.k), DynamicRangeMode.SYMMETRIC, DynamicRangeScope.token(), -127, 127, d.input_element,
            ElementKind.S8))
        self._scale_element = ElementKind.F64 if d.input_element is ElementKind.F64 else ElementKind.F32
        self._scale_offset = _align(d.m * d.k)
        self._quantizer_offset = self._scale_offset + _align(self._scale_element.itemsize * d.m)

    def workspace_size(self) -> int:
        """Quantized activations ``[m, k]`` int8, their scales ``[m]`` (float32; float64 for f64 input),
        the quantizer's scratch."""
        return self._quantizer_offset + self._quantizer.workspace_size()

    def _bind(self, args: Any) -> tuple:
        if not isinstance(args, self.Args):
            raise InvalidProblem(problem_message(self.name, "args", self.Args.__name__, type(args).__name__))
        d = self.desc
        x = checked_operand(self.name, args.input, "input", d.input_element, d.m * d.k)
        return (x, *self._common(args))

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        """Quantize ``args.input`` per token into the workspace, then the int8 GEMM and epilogue.

        ``workspace``: at least ``workspace_size()`` bytes, or None to let the plan allocate it.
        """
        x, weight, weight_scale, bias, output = self._bind(args)
        d = self.desc
        if d.m == 0 or d.n == 0:
            return
        if workspace is None:
            workspace = allocate_like(x, (self.workspace_size(),), ElementKind.U8)
        else:
            self._check_workspace(workspace)
        ws = adapt(workspace, self.name, "workspace")
        handle = stream_handle(stream, (x, output), self.name)
        xq = sub_operand(ws, 0, ElementKind.S8, (d.m, d.k))
        scale_x = sub_operand(ws, self._scale_offset, self._scale_element, (d.m,))
        scratch = sub_operand(ws, self._quantizer_offset, ElementKind.U8, (self._quantizer.workspace_size(),))
        if d.k:
            self._quantizer.run(DynamicRangeQuantizeArgs(x, xq, scale_x, None), workspace=scratch, stream=handle)
        self._gemm(xq, weight, scale_x, weight_scale, bias, output, 0.0, handle)
        if output.on_host or x.on_host:
            synchronize(handle)
            finish(output)


class SmoothQuantLinearPlan(_LinearPlan):
    """``y = (act_q @ weight.T) * act_scale * weight_scale (+ bias)`` with a static activation scale."""

    Descriptor = SmoothQuantLinearDescriptor
    Args = SmoothQuantLinearArgs

    @classmethod
    def _registry_elements(cls, desc: Any) -> tuple[ElementKind, ElementKind]:
        return ElementKind.S8, desc.output_element

    def _bind(self, args: Any) -> tuple:
        if not isinstance(args, self.Args):
            raise InvalidProblem(problem_message(self.name, "args", self.Args.__name__, type(args).__name__))
        d = self.desc
        act = checked_operand(self.name, args.input, "input", ElementKind.S8, d.m * d.k)
        _, act_scale = checked_scale(self.name, args.act_scale, np.float32, "act_scale")
        return (act, *self._common(args), act_scale)

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        """The int8 GEMM and epilogue on pre-quantized activations (no workspace)."""
        act, weight, weight_scale, bias, output, act_scale = self._bind(args)
        d = self.desc
        if d.m == 0 or d.n == 0:
            return
        handle = stream_handle(stream, (act, output), self.name)
        self._gemm(act, weight, None, weight_scale, bias, output, act_scale, handle)
        if output.on_host or act.on_host:
            synchronize(handle)
            finish(output)
