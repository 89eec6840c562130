"""Model-level conversion: calibrate, smooth (SmoothQuant) and swap ``nn.Linear`` for :class:`W8A8Linear`."""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from ..errors import InvalidProblem, problem_message
from ..ops.linear import activation_absmax, smoothing_scales, weight_absmax
from .modules import W8A8Linear

__all__ = ["QuantizeConfig", "Calibration", "calibrate", "smooth", "quantize_model"]


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or type(module).__name__.lower().endswith("rmsnorm")


@dataclass
class QuantizeConfig:
    """What :func:`quantize_model` does.

    include / exclude : ``fnmatch`` patterns on qualified module names; an ``nn.Linear`` is converted
        when it matches one ``include`` pattern and no ``exclude`` pattern (default: every linear but
        ``lm_head``, whose logits are the most sensitive layer).
    activation : ``"dynamic"`` (per-token scales in every call) or ``"static"`` (one calibrated
        per-tensor scale per layer, SmoothQuant's W8A8 "per-tensor static").
    smooth : fold SmoothQuant scales into the preceding LayerNorm / RMSNorm and the linears it feeds.
    alpha : SmoothQuant migration strength, ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``.
    progress : show calibration progress (``tqdm`` if installed, else a line on stderr).
    backend : ``"kernels"`` (:class:`W8A8Linear`, the project's GEMM) or ``"emulation"``
        (:class:`~baracuda_numba.torch.emulate.EmulatedW8A8Linear`: the same bits in pure PyTorch, for a CPU).
    """

    include: list[str] = field(default_factory=lambda: ["*"])
    exclude: list[str] = field(default_factory=lambda: ["lm_head", "*.lm_head"])
    activation: Literal["dynamic", "static"] = "dynamic"
    smooth: bool = False
    alpha: float = 0.5
    progress: bool = True
    backend: Literal["kernels", "emulation"] = "kernels"

    def selects(self, name: str) -> bool:
        return (any(fnmatch.fnmatchcase(name, p) for p in self.include)
                and not any(fnmatch.fnmatchcase(name, p) for p in self.exclude))


@dataclass
class Calibration:
    """Per-channel input absmax of each selected linear, and which norm feeds which linears."""

    act_absmax: dict[str, torch.Tensor]
    norm_consumers: dict[str, list[str]]


def _progress(iterable: Iterable, total: int | None, enabled: bool) -> Iterable:
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _stderr_progress(iterable, total)
    return tqdm(iterable, total=total, desc="calibrating", unit="batch")


def _stderr_progress(iterable: Iterable, total: int | None) -> Iterable:
    for index, item in enumerate(iterable, 1):
        yield item
        print(f"\rcalibrating: batch {index}" + (f"/{total}" if total else ""), end="", file=sys.stderr)
    print(file=sys.stderr)


def _run(model: nn.Module, batch: Any) -> None:
    if isinstance(batch, dict):
        model(**batch)
    elif isinstance(batch, (tuple, list)):
        model(*batch)
    else:
        model(batch)


@torch.no_grad()
def calibrate(model: nn.Module, batches: Iterable[Any], config: QuantizeConfig | None = None) -> Calibration:
    """Run ``batches`` through ``model`` and record, for every ``nn.Linear``, the per-channel
    ``max |x|`` of its input (``[in_features]``, float32) via forward hooks; also which LayerNorm /
    RMSNorm output is consumed unchanged by which linears (the SmoothQuant folding pairs).

    Every linear is observed (smoothing a norm must account for all of its consumers, selected or
    not); ``config`` (progress, and at least one selected layer) applies as in :func:`quantize_model`.
    A batch is passed as ``model(**batch)`` (dict), ``model(*batch)`` (tuple / list) or ``model(batch)``.
    """
    config = config or QuantizeConfig()
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    if not any(config.selects(name) for name in linears):
        raise InvalidProblem(problem_message("calibrate", "config.include",
                                             "patterns matching at least one nn.Linear", config.include))
    absmax: dict[str, torch.Tensor] = {}
    # id -> (norm name, output): the output is kept alive for the batch so that its id is not reused.
    norm_outputs: dict[int, tuple[str, torch.Tensor]] = {}
    consumers: dict[str, list[str]] = {}
    handles = []

    def norm_hook(name):
        def hook(module, inputs, output):
            norm_outputs[id(output)] = (name, output)
        return hook

    def linear_hook(name):
        def hook(module, inputs):
            x = inputs[0]
            absmax[name] = activation_absmax(x, absmax.get(name))
            entry = norm_outputs.get(id(x))
            if entry is not None and entry[1] is x and name not in consumers.setdefault(entry[0], []):
                consumers[entry[0]].append(name)
        return hook

    for name, module in model.named_modules():
        if _is_norm(module):
            handles.append(module.register_forward_hook(norm_hook(name)))
    for name, module in linears.items():
        handles.append(module.register_forward_pre_hook(linear_hook(name)))
    total = len(batches) if hasattr(batches, "__len__") else None
    try:
        for batch in _progress(batches, total, config.progress):
            norm_outputs.clear()
            _run(model, batch)
    finally:
        norm_outputs.clear()
        for handle in handles:
            handle.remove()
    if not absmax:
        raise InvalidProblem(problem_message("calibrate", "batches", "at least one batch reaching a linear",
                                             "no calibration data"))
    return Calibration(absmax, {n: c for n, c in consumers.items() if c})


@torch.no_grad()
def smooth(model: nn.Module, calibration: Calibration, alpha: float = 0.5,
           config: QuantizeConfig | None = None) -> dict[str, torch.Tensor]:
    """Fold SmoothQuant scales into each norm and the linears it feeds, in place.

    With ``config``, only norms whose consumers are all selected by it are smoothed (the others'
    linears stay in floating point and gain nothing from the migration).

    For a norm feeding linears ``L_1..L_r``: ``s = smoothing_scales(max|X|, max_i max|W_i|, alpha)``;
    the norm's weight (and bias) are divided by ``s``, each ``W_i`` multiplied by ``s`` along its input
    axis, so the model's function is unchanged up to rounding while activation outliers move into the
    weights. ``calibration.act_absmax`` is divided by ``s`` too (the smoothed activations' range).
    Returns the scales by norm name.
    """
    modules = dict(model.named_modules())
    scales_by_norm = {}
    for norm_name, linear_names in calibration.norm_consumers.items():
        norm = modules[norm_name]
        if getattr(norm, "weight", None) is None:
            continue  # an affine-free norm has nothing to fold the scales into
        if config is not None and not all(config.selects(n) for n in linear_names):
            continue
        linears = [modules[n] for n in linear_names]
        act = calibration.act_absmax[linear_names[0]]
        weight_max = torch.stack([weight_absmax(linear.weight) for linear in linears]).amax(dim=0)
        s = smoothing_scales(act.to(weight_max.device), weight_max, alpha)
        norm.weight.div_(s.to(norm.weight.dtype))
        if getattr(norm, "bias", None) is not None:
            norm.bias.div_(s.to(norm.bias.dtype))
        for name, linear in zip(linear_names, linears, strict=True):
            linear.weight.mul_(s.to(linear.weight.dtype)[None, :])
            calibration.act_absmax[name] = calibration.act_absmax[name] / s.to(calibration.act_absmax[name].device)
        scales_by_norm[norm_name] = s
    return scales_by_norm


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _layer_class(config: QuantizeConfig) -> type[W8A8Linear]:
    if config.backend == "emulation":
        from .emulate import EmulatedW8A8Linear

        return EmulatedW8A8Linear
    if config.backend != "kernels":
        raise InvalidProblem(problem_message("quantize_model", "config.backend", "'kernels' or 'emulation'",
                                             repr(config.backend)))
    return W8A8Linear


def quantize_model(model: nn.Module, batches: Iterable[Any] | None = None, config: QuantizeConfig | None = None,
                   on_layer: Callable[[str, W8A8Linear], None] | None = None) -> nn.Module:
    """Calibrate (when needed), smooth (``config.smooth``) and swap the selected ``nn.Linear`` layers
    for :class:`W8A8Linear`, in place; returns ``model``.

    ``batches`` are needed for smoothing or static activations (``config.activation == "static"``:
    each layer's scale is ``max_j max|X_j| / 127`` of its calibrated, smoothed inputs).
    """
    config = config or QuantizeConfig()
    if config.activation not in ("dynamic", "static"):
        raise InvalidProblem(problem_message("quantize_model", "config.activation", "'dynamic' or 'static'",
                                             repr(config.activation)))
    needs_data = config.smooth or config.activation == "static"
    if needs_data and batches is None:
        raise InvalidProblem(problem_message("quantize_model", "batches",
                                             "calibration batches (smoothing or static activations)", None))
    calibration = calibrate(model, batches, config) if needs_data else None
    if config.smooth:
        smooth(model, calibration, config.alpha, config)
    selected = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and config.selects(n)]
    if not selected:
        raise InvalidProblem(problem_message("quantize_model", "config.include",
                                             "patterns matching at least one nn.Linear", config.include))
    for name, linear in selected:
        act_scale = None
        if config.activation == "static":
            if name not in calibration.act_absmax:
                raise InvalidProblem(problem_message("quantize_model", f"layer {name!r}",
                                                     "inputs seen during calibration", "none"))
            act_scale = max(float(calibration.act_absmax[name].max()) / 127.0, torch.finfo(torch.float32).tiny)
        quantized = _layer_class(config).from_float(linear, activation=config.activation, act_scale=act_scale,
                                                    name=name)
        _set_module(model, name, quantized)
        if on_layer is not None:
            on_layer(name, quantized)
    from . import hf

    if hf.is_transformers_model(model):  # save_pretrained then writes the quantization_config
        hf.attach(model, config, {name: config.activation for name, _ in selected})
    return model
