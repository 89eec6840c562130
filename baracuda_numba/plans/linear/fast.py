"""The one fast launch path of the W8A8 plans (``docs/design-linear.md``, "The launch path").

A plan builds it once (:func:`fast_path`) over everything fixed at selection: the aligned variant's
launcher with its parameter block packed, the quantizer's, the workspace layout. Every fast call ends in
its ``launch(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, device, ws_ptr, act_scale)``, whoever made it:

- ``checked(args, workspace)``: ``plan.run`` on plain CUDA ``torch.Tensor`` operands (each tensor's exact
  type, dtype, size, contiguity, device and alignment tested in one flattened frame: the call is host-bound
  at decode);
- ``found(pointers, device, workspace, act_scale)``: ``plan.run`` on operands adapted from torch tensors
  (what the op functions pass on a first call), after :func:`~baracuda_numba.plans.base.fast_pointers`;
- ``trusted(args, device)``: the op functions' remembered calls (:meth:`Plan.run_trusted`), which vouch
  for everything but the alignment; the PyTorch layer calls the op functions.

Each returns False, having launched nothing, where the checked path must decide (an operand off its
alignment, a workspace that does not qualify, the fused kernel under graph capture where the two launches
are the faster). The launches go on PyTorch's current stream; the quantizer and the GEMM are one compiled
call once both kernels are loaded (:func:`~baracuda_numba._launch_jit.linear_pair_launch`).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

from ...launch import LaunchPair
from ...platform import SIMULATOR
from ...vocabulary import ElementKind

__all__ = ["FastPath", "fast_path", "capturing"]

_ZERO_F32 = np.float32(0.0)


def capturing(stream: int) -> bool:
    """Whether a launch on ``stream`` (a raw handle) is being captured into a graph, as far as PyTorch's
    current stream tells (False without torch, or without its CUDA build). The legacy default stream
    (0) cannot be captured: eager calls there ask nothing (the query is a runtime call)."""
    torch = sys.modules.get("torch")
    return stream != 0 and torch is not None and _capture_query(torch)()


@functools.cache
def _capture_query(torch: Any) -> Any:
    if SIMULATOR or not torch.cuda.is_available():
        return lambda: False
    return getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)


class FastPath:
    """The three entries of a plan's fast path over its one ``launch`` (see the module doc)."""

    def __init__(self, launch: Any, checked: Any, found: Any, trusted: Any) -> None:
        self.launch, self.checked, self.found, self.trusted = launch, checked, found, trusted


def _launch_function(plan: Any, launching: Any, stream_of: Any) -> Any:
    """``launch(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, device, ws_ptr, act_scale) -> bool`` of ``plan``'s aligned
    variant (``ws_ptr`` None: the plan's own workspace for the stream)."""
    spec, d = plan.spec, plan.desc
    launcher = plan._launchers[spec.aligned]
    blocks, threads = spec.variant(spec.aligned).blocks(d.m, d.n), spec.variant(spec.aligned).threads
    if plan.smoothquant:

        def launch_gemm(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, device, ws_ptr, act_scale) -> bool:
            launcher.launch_patched(blocks, threads, stream_of(device), (x_ptr, x_ptr, w_ptr, w_ptr, s_ptr, s_ptr,
                                                                         b_ptr, o_ptr), (act_scale,), device)
            return True

        return launch_gemm
    if spec.fused:
        capture_unfused = spec.capture_unfused

        def launch_fused(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, device, ws_ptr, act_scale) -> bool:
            stream = stream_of(device)
            if capture_unfused and capturing(stream):
                return False  # the checked path launches the two kernels
            launcher.launch_patched(blocks, threads, stream, (x_ptr, x_ptr, w_ptr, w_ptr, 0, s_ptr, b_ptr, o_ptr),
                                    (act_scale,), device)
            return True

        return launch_fused
    scale_offset, zero_point_offset = plan._scale_offset, plan._quantizer_offset
    gemm_floats = (_ZERO_F32,)
    if d.static_activation:  # the static quantizer, then the GEMM: one LaunchPair call
        static = spec.static_quantizer
        static_pair = LaunchPair(plan._static_quantizer, launcher)

        def launch_static(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, device, ws_ptr, act_scale) -> bool:
            stream = stream_of(device)
            ws_ptr = plan._stream_workspace(device, stream) if ws_ptr is None else ws_ptr
            scale_ptr = ws_ptr + scale_offset
            static_pair.launch(stream, device, static.blocks, static.threads, (x_ptr, ws_ptr, scale_ptr), (act_scale,),
                               blocks, threads, (ws_ptr, ws_ptr, w_ptr, w_ptr, scale_ptr, s_ptr, b_ptr, o_ptr),
                               gemm_floats)
            return True

        return launch_static
    q_launcher, q_blocks, q_threads, _ = plan._quantizer.segment_launch_fast(0, 0, 0, 0, spec.quantizer_dependent)
    pair = LaunchPair(q_launcher, launcher)
    q_functions, q_params, functions, params = (q_launcher._functions, q_launcher.params, launcher._functions,
                                                launcher.params)
    layouts: dict[int, np.ndarray] = {}  # per device: linear_pair_launch's layout, once both kernels are loaded
    compiled: list = [None, None]  # linear_pair_launch's entry point, and the driver whose entry points it takes

    def launch_pair(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, device, ws_ptr, act_scale) -> bool:
        stream = stream_of(device)
        ws_ptr = plan._stream_workspace(device, stream) if ws_ptr is None else ws_ptr
        layout = layouts.get(device)
        if layout is not None:
            driver = launching._driver()
            if compiled[1] is not driver:
                compiled[0] = launching.compiled_entry(launching._jit().linear_pair_launch, (
                    driver.entry_points, device, stream, x_ptr, ws_ptr, w_ptr, s_ptr, b_ptr, o_ptr, layout,
                    q_params.record, params.record))
                compiled[1] = driver
            status = compiled[0](driver.entry_points, device, stream, x_ptr, ws_ptr, w_ptr, s_ptr, b_ptr, o_ptr,
                                 layout, q_params.record, params.record)
            if status == 0:
                return True
            if status > 0:
                raise launching._launch_error(status)
        scale_ptr = ws_ptr + scale_offset
        q_ints = (x_ptr, x_ptr, ws_ptr, ws_ptr, scale_ptr, ws_ptr + zero_point_offset)
        ints = (ws_ptr, ws_ptr, w_ptr, w_ptr, scale_ptr, s_ptr, b_ptr, o_ptr)
        pair.launch(stream, device, q_blocks, q_threads, q_ints, (), blocks, threads, ints, gemm_floats)
        q_function, function = q_functions.get(device), functions.get(device)
        if q_function is not None and function is not None:  # loaded: the next call is one compiled call
            layouts[device] = np.array((q_function, q_blocks, q_threads, function, blocks, threads,
                                        scale_offset, zero_point_offset), np.int64)
        return True

    return launch_pair


def fast_path(plan: Any) -> FastPath | None:
    """``plan``'s fast path (None off the GPU, before PyTorch is imported (every entry takes torch tensors and
    launches on PyTorch's stream), where the aligned variant has no packed template, or where a static
    activation scale has no static quantizer)."""
    d, spec = plan.desc, plan.spec
    if (SIMULATOR or "torch" not in sys.modules or plan._fast_specs is None
            or (not plan.smoothquant and d.static_activation and not spec.fused and spec.static_quantizer is None)):
        return None
    from ... import launch as launching  # its stream getter now (the recording tests replace it)

    launch = _launch_function(plan, launching, launching._torch_stream_getter())
    scale_of, workspace_pointer, has_bias = plan._fast_scale, plan._workspace_pointer, d.has_bias
    out_align = d.output_element.itemsize

    def found(pointers: list[int], device: int, workspace: Any, act_scale: Any) -> bool:
        """A launch on checked ``pointers`` (input, weight, weight_scale, [bias,] output)."""
        ws_ptr = None
        if workspace is not None:
            ws_ptr = workspace_pointer(workspace, device)
            if ws_ptr is None:
                return False
        if has_bias:
            x_ptr, w_ptr, s_ptr, b_ptr, o_ptr = pointers
        else:
            (x_ptr, w_ptr, s_ptr, o_ptr), b_ptr = pointers, pointers[2]  # the unused bias slot: weight_scale
        return launch(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, device, ws_ptr, act_scale)

    def trusted(args: Any, device: int) -> bool:
        x_ptr, w_ptr, s_ptr, o_ptr = (args.input.data_ptr(), args.weight.data_ptr(), args.weight_scale.data_ptr(),
                                      args.output.data_ptr())
        b_ptr = args.bias.data_ptr() if has_bias else s_ptr
        act_scale = scale_of(args)
        if (x_ptr | w_ptr) & 15 or (s_ptr | b_ptr) & 3 or o_ptr % out_align or act_scale is None:
            return False
        return launch(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, device, None, act_scale)

    return FastPath(launch, _tensor_check(plan, launch), found, trusted)


def _tensor_check(plan: Any, launch: Any) -> Any:
    """``checked(args, workspace)``: every tensor of ``args`` tested in one frame, then ``launch``; a function that
    declines everything before torch is imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return lambda args, workspace: False
    from ..base import _TORCH_DTYPES, _torch_tensor_type

    _torch_tensor_type()
    d = plan.desc
    dtypes = {element: dtype for dtype, element in _TORCH_DTYPES.items()}
    x_element = ElementKind.S8 if plan.smoothquant else d.input_element
    tensor, x_dtype, out_dtype = torch.Tensor, dtypes[x_element], dtypes[d.output_element]
    int8, float32 = torch.int8, torch.float32
    x_count, w_count, o_count, n = d.m * d.k, d.n * d.k, d.m * d.n, d.n
    out_align, has_bias = d.output_element.itemsize, d.has_bias
    scale_of, workspace_pointer = plan._fast_scale, plan._workspace_pointer

    def checked(args: Any, workspace: Any) -> bool:
        x, w, s, o, b = args.input, args.weight, args.weight_scale, args.output, args.bias
        if (type(x) is not tensor or type(w) is not tensor or type(s) is not tensor or type(o) is not tensor
                or x.dtype is not x_dtype or w.dtype is not int8 or s.dtype is not float32
                or o.dtype is not out_dtype or not x.is_cuda or not w.is_cuda or not s.is_cuda or not o.is_cuda
                or x.numel() != x_count or w.numel() != w_count or s.numel() != n or o.numel() != o_count
                or not x.is_contiguous() or not w.is_contiguous() or not s.is_contiguous()
                or not o.is_contiguous()):
            return False
        device = x.get_device()
        if w.get_device() != device or s.get_device() != device or o.get_device() != device:
            return False
        if has_bias:
            if (type(b) is not tensor or b.dtype is not float32 or not b.is_cuda or b.numel() != n
                    or not b.is_contiguous() or b.get_device() != device):
                return False
            b_ptr = b.data_ptr()
        elif b is None:
            b_ptr = 0
        else:
            return False
        x_ptr, w_ptr, s_ptr, o_ptr = x.data_ptr(), w.data_ptr(), s.data_ptr(), o.data_ptr()
        if not has_bias:
            b_ptr = s_ptr  # the unused bias slot points at weight_scale
        act_scale = scale_of(args)
        if (x_ptr | w_ptr) & 15 or (s_ptr | b_ptr) & 3 or o_ptr % out_align or act_scale is None:
            return False
        ws_ptr = None
        if workspace is not None:
            ws_ptr = workspace_pointer(workspace, device)
            if ws_ptr is None:
                return False
        return launch(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, device, ws_ptr, act_scale)

    return checked
