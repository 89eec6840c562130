"""Calibration for W8A8: observe a model on calibration batches, fold SmoothQuant scales into it, and choose
the static activation scales.

- :func:`calibrate` records each ``nn.Linear``'s per-channel input ``max |x|``, which norm feeds which
  linears, and (for the searches below) a sample of each linear's input rows.
- :func:`smooth` folds SmoothQuant scales ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` into every
  smoothing group: a LayerNorm / RMSNorm and the linears that read its output (the norm's weight divided
  by ``s``), and a producer linear and the linear that reads its output channel for channel
  (``QuantizeConfig.smooth_pairs``, e.g. Llama's ``up_proj`` -> ``down_proj``, whose input is
  ``act(gate_proj(x)) * up_proj(x)``: the producer's output rows divided by ``s``). The consumers'
  weights are multiplied by ``s`` along their input axis, so the model computes the same function.
  With ``QuantizeConfig.alpha=None`` each group's ``alpha`` is the one of ``alpha_grid`` whose W8A8
  outputs on the sampled inputs are closest to the float outputs (:func:`layer_error`, summed over the
  group's linears).
- :func:`static_scales` gives each static layer ``act_scale = c * max|X| / 127`` with ``c = 1``
  (``act_clip="minmax"``) or the ``c`` of ``clip_grid`` with the smallest output error on the samples
  (``act_clip="search"``): clipping the rare largest activations buys resolution for all the others.

The searches estimate the error with the W8A8 recipe in float32 (:mod:`.emulate`'s quantizers, the
product in float32): cheap, and close enough to rank the candidates. ``docs``: the measured effect of
each lever on SmolLM2-135M is in :mod:`baracuda_numba.torch.evaluate`'s docstring.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import InvalidProblem, problem_message
from ..ops.linear import activation_absmax, smoothing_scales, weight_absmax
from .emulate import quantize_activation, quantize_weight

if TYPE_CHECKING:
    from .convert import QuantizeConfig

__all__ = ["Calibration", "SmoothGroup", "calibrate", "smooth", "smoothing_groups", "static_scales",
           "layer_error"]

_TINY = torch.finfo(torch.float32).tiny


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or type(module).__name__.lower().endswith("rmsnorm")


@dataclass
class Calibration:
    """What :func:`calibrate` observed.

    act_absmax : per-channel ``max |x|`` of each linear's input (``[in_features]``, float32).
    norm_consumers : which linears read each norm's output unchanged (the SmoothQuant folding pairs).
    samples : rows of each linear's input (``[tokens, in_features]``, float32) for the searches;
        linears that read the same tensor share one sample tensor.
    """

    act_absmax: dict[str, torch.Tensor]
    norm_consumers: dict[str, list[str]]
    samples: dict[str, torch.Tensor] = field(default_factory=dict)


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
    RMSNorm output is consumed unchanged by which linears (the SmoothQuant folding pairs); and when
    ``config`` searches (``alpha=None`` or ``act_clip="search"``), up to ``config.search_tokens`` rows
    of each linear's input, evenly spaced within each batch.

    Every linear is observed (smoothing a norm must account for all of its consumers, selected or
    not); ``config`` (progress, and at least one selected layer) applies as in :func:`quantize_model`.
    A batch is passed as ``model(**batch)`` (dict), ``model(*batch)`` (tuple / list) or ``model(batch)``.
    """
    from .convert import QuantizeConfig

    config = config or QuantizeConfig()
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    if not any(config.selects(name) for name in linears):
        raise InvalidProblem(problem_message("calibrate", "config.include",
                                             "patterns matching at least one nn.Linear", config.include))
    total = len(batches) if hasattr(batches, "__len__") else None
    budget = config.search_tokens if config.searches() else 0
    per_batch = math.ceil(budget / total) if budget and total else budget
    absmax: dict[str, torch.Tensor] = {}
    chunks: dict[str, list[torch.Tensor]] = {}
    # id -> (norm name, output): the output is kept alive for the batch so that its id is not reused.
    norm_outputs: dict[int, tuple[str, torch.Tensor]] = {}
    batch_rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(x) -> (x, its sampled rows)
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
            if per_batch and sum(len(c) for c in chunks.get(name, ())) < budget:
                seen = batch_rows.get(id(x))
                if seen is None or seen[0] is not x:
                    rows = x.detach().reshape(-1, x.shape[-1])
                    take = torch.linspace(0, rows.shape[0] - 1, min(per_batch, rows.shape[0]), device=rows.device)
                    seen = batch_rows[id(x)] = (x, rows[take.round().long()].float())
                chunks.setdefault(name, []).append(seen[1])
        return hook

    for name, module in model.named_modules():
        if _is_norm(module):
            handles.append(module.register_forward_hook(norm_hook(name)))
    for name, module in linears.items():
        handles.append(module.register_forward_pre_hook(linear_hook(name)))
    try:
        for batch in _progress(batches, total, config.progress):
            norm_outputs.clear()
            batch_rows.clear()
            _run(model, batch)
    finally:
        norm_outputs.clear()
        batch_rows.clear()
        for handle in handles:
            handle.remove()
    if not absmax:
        raise InvalidProblem(problem_message("calibrate", "batches", "at least one batch reaching a linear",
                                             "no calibration data"))
    samples, shared = {}, {}
    for name, parts in chunks.items():
        key = tuple(id(p) for p in parts)  # linears that read the same tensors share one sample
        if key not in shared:
            shared[key] = torch.cat(parts)[:budget]
        samples[name] = shared[key]
    return Calibration(absmax, {n: c for n, c in consumers.items() if c}, samples)


@dataclass(frozen=True)
class SmoothGroup:
    """Linears whose inputs are one tensor that ``source`` produces channel for channel.

    kind : ``"norm"`` (the source's weight and bias are divided by ``s``) or ``"linear"`` (the source
        linear's output rows and bias are divided by ``s``).
    """

    source: str
    kind: str
    consumers: tuple[str, ...]


def smoothing_groups(model: nn.Module, calibration: Calibration, config: QuantizeConfig | None = None
                     ) -> list[SmoothGroup]:
    """The norm groups found by :func:`calibrate` (skipped when the norm has no weight or, with ``config``,
    when one of its linears is not selected), then the linear pairs of ``config.smooth_pairs``: for each
    selected linear named ``P.consumer`` with a sibling ``nn.Linear`` ``P.producer`` whose output size is
    the consumer's input size."""
    modules = dict(model.named_modules())
    groups = []
    for norm_name, names in calibration.norm_consumers.items():
        if getattr(modules[norm_name], "weight", None) is None:
            continue  # an affine-free norm has nothing to fold the scales into
        if config is not None and not all(config.selects(n) for n in names):
            continue
        groups.append(SmoothGroup(norm_name, "norm", tuple(names)))
    for producer_suffix, consumer_suffix in (config.smooth_pairs if config is not None else ()):
        for name, consumer in modules.items():
            if not (isinstance(consumer, nn.Linear) and name.rpartition(".")[2] == consumer_suffix
                    and config.selects(name) and name in calibration.act_absmax):
                continue
            producer_name = name.rpartition(".")[0] + "." + producer_suffix if "." in name else producer_suffix
            producer = modules.get(producer_name)
            if isinstance(producer, nn.Linear) and producer.out_features == consumer.in_features:
                groups.append(SmoothGroup(producer_name, "linear", (name,)))
    return groups


def _fake_w8a8(x: torch.Tensor, weight: torch.Tensor, act_scale: float | None) -> torch.Tensor:
    """The W8A8 output of ``x @ weight.T`` (per-channel weights, per-token or static activations), float32."""
    wq, ws = quantize_weight(weight)
    xq, sx = quantize_activation(x, act_scale)
    return (xq * sx) @ (wq.float() * ws[:, None]).T


def _relative_error(y: torch.Tensor, reference: torch.Tensor) -> float:
    # per token, then averaged: a few tokens of a much larger range (LLMs' "massive activations") would
    # otherwise outweigh all the others, and a scale that crushes every other token would look fine
    error = (y - reference).square().sum(dim=-1) / reference.square().sum(dim=-1).clamp(min=_TINY)
    return float(error.mean())


def layer_error(x: torch.Tensor, weight: torch.Tensor, act_scale: float | None = None) -> float:
    """``mean_t ||W8A8(x)_t - (x @ W.T)_t||^2 / ||(x @ W.T)_t||^2``: the relative squared output error of each
    row of ``x``, averaged (per-token activations when ``act_scale`` is None)."""
    w = weight.detach().float().to(x.device)
    return _relative_error(_fake_w8a8(x, w, act_scale), x @ w.T)


def _best_clip(x: torch.Tensor, weight: torch.Tensor, reference: torch.Tensor, high: float,
               grid: tuple[float, ...]) -> tuple[float, float]:
    """``(scale, error)``: the static scale ``c * high / 127`` of ``grid`` with the smallest output error."""
    wq, ws = quantize_weight(weight)
    w = wq.float() * ws[:, None]
    best = (max(high / 127.0, _TINY), math.inf)
    for c in grid:
        scale = max(c * high / 127.0, _TINY)
        xq, sx = quantize_activation(x, scale)
        error = _relative_error((xq * sx) @ w.T, reference)
        if error < best[1]:
            best = (scale, error)
    return best


def _group_error(x: torch.Tensor, weights: list[torch.Tensor], references: list[torch.Tensor], s: torch.Tensor,
                 absmax: torch.Tensor, modes: list[str], config: QuantizeConfig) -> float:
    xs = x / s
    high = float((absmax / s).max())
    grid = config.clip_grid if config.act_clip == "search" else (1.0,)
    error = 0.0
    for weight, reference, mode in zip(weights, references, modes, strict=True):
        smoothed = weight * s[None, :]
        if mode == "static":
            error += _best_clip(xs, smoothed, reference, high, grid)[1]
        else:
            error += _relative_error(_fake_w8a8(xs, smoothed, None), reference)
    return error


def _choose_alpha(group: SmoothGroup, modules: dict[str, nn.Module], calibration: Calibration,
                  config: QuantizeConfig, weight_max: torch.Tensor, act: torch.Tensor) -> float:
    x = calibration.samples.get(group.consumers[0])
    if x is None or x.shape[0] == 0:
        raise InvalidProblem(problem_message("smooth", f"calibration.samples[{group.consumers[0]!r}]",
                                             "sampled inputs (calibrate with a config that searches)", "none"))
    weights = [modules[n].weight.detach().float().to(x.device) for n in group.consumers]
    references = [x @ w.T for w in weights]
    modes = [config.mode_of(n) for n in group.consumers]
    act, weight_max = act.to(x.device), weight_max.to(x.device)
    errors = {alpha: _group_error(x, weights, references, smoothing_scales(act, weight_max, alpha), act, modes,
                                  config) for alpha in config.alpha_grid}
    return min(errors, key=errors.get)


@torch.no_grad()
def smooth(model: nn.Module, calibration: Calibration, alpha: float | None = 0.5,
           config: QuantizeConfig | None = None) -> dict[str, torch.Tensor]:
    """Fold SmoothQuant scales into every smoothing group (:func:`smoothing_groups`), in place.

    For a group whose source feeds linears ``L_1..L_r``: ``s = smoothing_scales(max|X|, max_i max|W_i|,
    alpha)`` (``alpha=None``: chosen per group from ``config.alpha_grid``, module docstring); the norm's
    weight and bias, or the producer linear's output rows and bias, are divided by ``s``, each ``W_i``
    multiplied by ``s`` along its input axis, so the model's function is unchanged up to rounding while
    activation outliers move into the weights. ``calibration.act_absmax`` and ``calibration.samples`` of
    the consumers are divided by ``s`` too (the smoothed activations). Returns the scales by source name.
    """
    if alpha is None and config is None:
        raise InvalidProblem(problem_message("smooth", "alpha", "a value in [0, 1], or a config to search with",
                                             None))
    modules = dict(model.named_modules())
    scales_by_source = {}
    for group in smoothing_groups(model, calibration, config):
        linears = [modules[n] for n in group.consumers]
        act = calibration.act_absmax[group.consumers[0]]
        weight_max = torch.stack([weight_absmax(linear.weight) for linear in linears]).amax(dim=0)
        chosen = alpha if alpha is not None else _choose_alpha(group, modules, calibration, config, weight_max, act)
        s = smoothing_scales(act.to(weight_max.device), weight_max, chosen)
        source = modules[group.source]
        if group.kind == "norm":
            source.weight.div_(s.to(source.weight.dtype))
        else:
            source.weight.div_(s.to(source.weight.dtype)[:, None])
        if getattr(source, "bias", None) is not None:
            source.bias.div_(s.to(source.bias.dtype))
        sample = calibration.samples.get(group.consumers[0])
        smoothed_sample = None if sample is None else sample / s.to(sample.device)
        for name, linear in zip(group.consumers, linears, strict=True):
            linear.weight.mul_(s.to(linear.weight.dtype)[None, :])
            calibration.act_absmax[name] = calibration.act_absmax[name] / s.to(calibration.act_absmax[name].device)
            if smoothed_sample is not None:
                calibration.samples[name] = smoothed_sample
        scales_by_source[group.source] = s
    return scales_by_source


@torch.no_grad()
def static_scales(model: nn.Module, calibration: Calibration, config: QuantizeConfig,
                  names: Iterable[str]) -> dict[str, float | None]:
    """``{name: act_scale}`` of the static layers ``names`` (module docstring: ``act_clip``); ``None`` for a
    layer that falls back to per-token activations: with ``config.static_fallback``, one whose output error on
    the sampled inputs exceeds ``static_fallback`` times its error with per-token scales (a layer fed a few
    tokens of a much larger range than the rest, which no single scale serves)."""
    modules = dict(model.named_modules())
    scales: dict[str, float | None] = {}
    for name in names:
        if name not in calibration.act_absmax:
            raise InvalidProblem(problem_message("quantize_model", f"layer {name!r}",
                                                 "inputs seen during calibration", "none"))
        high = float(calibration.act_absmax[name].max())
        x = calibration.samples.get(name)
        if x is None or not (config.act_clip == "search" or config.static_fallback is not None):
            scales[name] = max(high / 127.0, _TINY)
            continue
        weight = modules[name].weight.detach().float().to(x.device)
        reference = x @ weight.T
        grid = config.clip_grid if config.act_clip == "search" else (1.0,)
        scale, error = _best_clip(x, weight, reference, high, grid)
        fallback = config.static_fallback is not None and error > config.static_fallback * _relative_error(
            _fake_w8a8(x, weight, None), reference)
        scales[name] = None if fallback else scale
    return scales
