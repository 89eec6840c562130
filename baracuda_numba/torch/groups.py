"""Projection groups: sibling :class:`~baracuda_numba.torch.W8A8Linear` layers that read one input (an attention's
q / k / v projections, an MLP's gate and up projections) computed as one GEMM over their weights.

:func:`group_projections` lays each group's weights, weight scales and biases out end to end in one allocation,
each layer's buffer its own tensor over its rows (a tensor of its own storage, through DLPack: state dicts,
``torch.save``, safetensors and ``save_pretrained`` see separate tensors). A member's forward then asks its group
(:meth:`ProjectionGroup.output`): the first member called with an ``x`` runs the GEMM of all of them,
``[..., K] -> [..., N_1 + ... + N_g]`` (one activation quantization, one launch path:
:func:`~baracuda_numba.ops.linear_bound.launch_grouped`), and returns its columns, a view; the next members called
with the same ``x`` object, unchanged (its version counter), take theirs from that output. An attention's three
projections are then one call instead of three, for the host (every layer call costs host time at decode:
``docs/performance.md``, "The PyTorch layer on a model") and for the GPU (one quantizer launch).

Each output element is ``(f32(sum_k xq[m, k] wq[n, k]) * scale_x[m]) * weight_scale[n] + bias[n]`` with an exact
int32 sum and the activations quantized per token (or with the static scale) whatever ``N`` is, so a member's
columns are the bits of its own call (``tests/test_torch_groups.py``). A group is active while its members are on
one CUDA device (a moved model's copies are laid out again: :meth:`ProjectionGroup.update_layout`). Where the
buffers no longer lie end to end (a buffer replaced by assignment) or the call is not one the group takes (the CPU,
autograd, more than :data:`MAX_GROUPED_TOKENS` tokens, the simulator), each layer runs alone, with the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.dlpack import from_dlpack

from ..ops.linear_bound import launch_grouped
from . import ops as _ops
from .modules import W8A8Linear

__all__ = ["ProjectionGroup", "group_projections", "PROJECTION_GROUPS", "MAX_GROUPED_TOKENS"]

PROJECTION_GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""The sibling names that read one input in Llama-style models (Llama, Mistral, Qwen2, Gemma, SmolLM)."""

MAX_GROUPED_TOKENS = 64
"""The most input rows (tokens) a group takes in one call; past it each member runs alone. Grouping saves host time
and quantizer launches, which decide a call while its GEMM is short: on an H200 the 56 projections of 8 layers in one
CUDA graph ran 1.68 / 1.57 / 1.35x bf16 grouped against 1.57 / 1.39 / 1.10x alone at 1 / 16 / 64 tokens, while a
4 x 512-token eager prefill ran 1.5% slower grouped (``docs/performance.md``, "Bound weights and projection
groups"); between 64 and 2048 tokens it is not measured."""


class ProjectionGroup:
    """Sibling layers computed by one GEMM (see the module doc). ``members`` in column order; member ``i``'s
    columns are ``columns[i]`` of the group's output."""

    def __init__(self, members: Sequence[W8A8Linear]) -> None:
        self.members = list(members)
        self.columns: list[tuple[int, int]] = []
        start = 0
        for member in self.members:
            self.columns.append((start, start + member.out_features))
            start += member.out_features
        self.out_features = start
        self.active = False  # the members' buffers on one CUDA device, end to end (update_layout)
        self._pending: tuple | None = None  # (x, its version, the group's output, members still to take theirs)

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor | None:
        """Member ``index``'s output for ``x``: its columns of the group's output for this ``x`` (computed by the
        first member called with it), or None where the group does not take the call (the member runs alone)."""
        if not self.active:
            return None
        compiling = torch.compiler.is_compiling()
        pending = self._pending
        if pending is not None and pending[0] is x and (compiling or pending[1] == x._version):
            out, left = pending[2], pending[3] - 1
        else:
            out = self._run(x, compiling)
            if out is None:
                return None
            left = len(self.members) - 1
        # the last member to take its columns lets the output go (a member called twice only lets it go early)
        self._pending = (x, 0 if compiling else x._version, out, left) if left > 0 else None
        start, end = self.columns[index]
        return out[..., start:end]

    def _run(self, x: torch.Tensor, compiling: bool) -> torch.Tensor | None:
        """The group's output for ``x``, or None where the group does not take the call."""
        first = self.members[0]
        act_scale = first._act_scale
        if (x.dtype == torch.float64 or x.dim() == 0 or x.shape[-1] != first.in_features
                or not 0 < x.numel() // first.in_features <= MAX_GROUPED_TOKENS
                or (x.requires_grad and torch.is_grad_enabled())):
            return None
        for member in self.members:  # a loop, not a generator: torch.compile traces it
            if member._act_scale != act_scale:
                return None
        if compiling:  # one op into a buffer of the compiled code's (ops.py: the W8A8 linear ops)
            out = x.new_empty((*x.shape[:-1], self.out_features))
            biases = [m.bias for m in self.members] if first.bias is not None else []
            _ops.quantized_linear_group_out(x, [m.weight_q for m in self.members],
                                            [m.weight_scale for m in self.members], biases, True, act_scale, out)
            return out
        if type(x) is not torch.Tensor:
            return None
        buffers = [m._buffers for m in self.members]
        biases = [b["bias"] for b in buffers] if first.bias is not None else None
        return launch_grouped(x, [b["weight_q"] for b in buffers], [b["weight_scale"] for b in buffers], biases,
                              True, act_scale)

    @torch.no_grad()
    def update_layout(self) -> None:
        """Make the group active where every member's buffers are on one CUDA device, laying them out end to end
        again where they are not (a model moved there: its buffers are copies); inactive elsewhere (the members
        then run alone). ``W8A8Linear._apply`` calls it after ``.to()`` / ``.cuda()`` / ``.cpu()``."""
        buffers = [t for m in self.members for t in (m.weight_q, m.weight_scale, m.bias) if t is not None]
        device = buffers[0].get_device()
        self.active = device >= 0 and all(t.get_device() == device for t in buffers)
        self._pending = None
        if self.active and not self._end_to_end():
            _lay_out(self.members)

    def _end_to_end(self) -> bool:
        """Whether each buffer kind of the members lies end to end in member order."""
        for buffer in ("weight_q", "weight_scale", "bias"):
            tensors = [getattr(m, buffer) for m in self.members]
            if tensors[0] is None:
                continue
            at = tensors[0].data_ptr()
            for tensor in tensors:
                if not tensor.is_contiguous() or tensor.data_ptr() != at:
                    return False
                at += tensor.numel() * tensor.element_size()
        return True


def _groupable(members: list) -> bool:
    """Whether ``members`` may form a group: W8A8 layers (not the emulation's subclass) of one input size,
    activation mode and static scale, all with or all without a bias, not in a group yet."""
    first = members[0]
    return all(
        type(m) is W8A8Linear and m._group is None and m.in_features == first.in_features
        and m.activation == first.activation and m._act_scale == first._act_scale
        and (m.bias is None) == (first.bias is None) for m in members)


def _lay_out(members: list[W8A8Linear]) -> None:
    """Copy each buffer kind of ``members`` into one allocation, end to end, and give each member a tensor of its own
    storage over its rows (DLPack keeps the allocation alive while any member's tensor is)."""
    for buffer in ("weight_q", "weight_scale", "bias"):
        if getattr(members[0], buffer) is None:
            continue
        whole = torch.cat([getattr(m, buffer).detach() for m in members])
        start = 0
        for member in members:
            rows = member.out_features
            setattr(member, buffer, from_dlpack(whole[start:start + rows]))
            start += rows
    for member in members:
        member.refresh()


@torch.no_grad()
def group_projections(model: nn.Module, groups: Sequence[Sequence[str]] = PROJECTION_GROUPS) -> int:
    """Group the sibling W8A8 layers of ``model`` named in ``groups`` (children of one module, e.g. an attention's
    ``q_proj``, ``k_proj``, ``v_proj``) that may run as one GEMM (see the module doc); returns the number of groups
    made. :func:`~baracuda_numba.torch.quantize_model` calls it (``QuantizeConfig.projection_groups``), and so does
    loading a saved model with ``from_pretrained``. A group is active while its members are on one CUDA device:
    moving the model (``.to()``, ``.cuda()``) lays the moved copies out end to end again; on the CPU the layers run
    alone. A buffer replaced by assignment is not end to end: the layers then run alone (in eager mode) or each
    into its columns (compiled). Layers that share an input in the model's forward are what ``groups`` must name:
    a group computes every member's output from the input of the first member called."""
    made = 0
    for parent in model.modules():
        children = parent._modules
        for names in groups:
            members = [children.get(name) for name in names]
            if len(members) < 2 or any(m is None for m in members) or not _groupable(members):
                continue
            group = ProjectionGroup(members)
            for index, member in enumerate(members):
                member._group, member._group_index = group, index
            group.update_layout()
            made += 1
    return made
