"""Model-level conversion: calibrate, smooth (SmoothQuant) and swap ``nn.Linear`` for :class:`W8A8Linear`."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from ..errors import InvalidProblem, problem_message
from .calibration import Calibration, calibrate, smooth, static_scales
from .groups import PROJECTION_GROUPS, group_projections
from .modules import W8A8Linear

__all__ = ["QuantizeConfig", "Calibration", "calibrate", "smooth", "quantize_model"]


@dataclass(frozen=True)
class QuantizeConfig:
    """What :func:`quantize_model` does.

    include / exclude : ``fnmatch`` patterns on qualified module names; an ``nn.Linear`` is converted
        when it matches one ``include`` pattern and no ``exclude`` pattern (default: every linear but
        ``lm_head``, whose logits are the most sensitive layer).
    activation : ``"dynamic"`` (per-token scales in every call) or ``"static"`` (one calibrated
        per-tensor scale per layer, SmoothQuant's W8A8 "per-tensor static").
    dynamic_layers : in a static model, patterns of layers kept dynamic (their inputs have a range no
        single scale serves; see :mod:`.evaluate` for the layers that need it on SmolLM2).
    smooth : fold SmoothQuant scales into each LayerNorm / RMSNorm and the linears it feeds, and into the
        linear pairs of ``smooth_pairs`` (:mod:`.calibration`).
    alpha : SmoothQuant migration strength, ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``; ``None`` (the
        default): chosen per smoothing group from ``alpha_grid`` by the error of the group's W8A8 outputs on
        the calibration inputs (on SmolLM2-135M static + SmoothQuant 1.26x bf16 perplexity at 0.5, 1.10x
        searched: :mod:`.evaluate`).
    smooth_pairs : ``(producer, consumer)`` sibling-name pairs where the consumer reads the producer's output
        channel for channel through a positively homogeneous or multiplicative function (Llama's MLP:
        ``down_proj(act(gate_proj(x)) * up_proj(x))``).
    act_clip : static scales ``max|X| / 127`` (``"minmax"``) or ``c * max|X| / 127`` with the ``c`` of
        ``clip_grid`` that gives the smallest output error on the sampled inputs (``"search"``).
    static_fallback : in a static model, keep per-token activations for a layer whose static output error on
        the sampled inputs exceeds this many times its per-token error (``None``: never; :mod:`.calibration`).
    search_tokens : input rows kept per linear for the searches (``alpha=None``, ``act_clip="search"``,
        ``static_fallback``).
    progress : show calibration progress (``tqdm`` if installed, else a line on stderr).
    backend : ``"kernels"`` (:class:`W8A8Linear`, the project's GEMM) or ``"emulation"``
        (:class:`~baracuda_numba.torch.emulate.EmulatedW8A8Linear`: the same bits in pure PyTorch, for a CPU).
    projection_groups : sibling names of layers that read one input (default: an attention's q / k / v, an MLP's
        gate / up), each group then computed as one GEMM with the same bits (:mod:`.groups`); ``()`` for none.
    """

    include: list[str] = field(default_factory=lambda: ["*"])
    exclude: list[str] = field(default_factory=lambda: ["lm_head", "*.lm_head"])
    activation: Literal["dynamic", "static"] = "dynamic"
    dynamic_layers: list[str] = field(default_factory=list)
    smooth: bool = False
    alpha: float | None = None
    alpha_grid: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    smooth_pairs: tuple[tuple[str, str], ...] = (("up_proj", "down_proj"),)
    act_clip: Literal["minmax", "search"] = "minmax"
    clip_grid: tuple[float, ...] = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)
    static_fallback: float | None = None
    search_tokens: int = 512
    progress: bool = True
    backend: Literal["kernels", "emulation"] = "kernels"
    projection_groups: tuple[tuple[str, ...], ...] = PROJECTION_GROUPS

    def selects(self, name: str) -> bool:
        return (any(fnmatch.fnmatchcase(name, p) for p in self.include)
                and not any(fnmatch.fnmatchcase(name, p) for p in self.exclude))

    def mode_of(self, name: str) -> str:
        """The activation mode of layer ``name``: ``activation``, or dynamic where ``dynamic_layers`` says."""
        if self.activation == "static" and any(fnmatch.fnmatchcase(name, p) for p in self.dynamic_layers):
            return "dynamic"
        return self.activation

    def searches(self) -> bool:
        """Whether calibration keeps input samples (a per-group alpha or a clip search)."""
        return (self.smooth and self.alpha is None) or (self.activation == "static" and (
            self.act_clip == "search" or self.static_fallback is not None))

    def validate(self, where: str = "quantize_model") -> None:
        """Raise :class:`InvalidProblem` naming the first field with a value outside its domain."""
        checks = [
            ("activation", self.activation in ("dynamic", "static"), "'dynamic' or 'static'", repr(self.activation)),
            ("alpha", self.alpha is None or 0.0 <= self.alpha <= 1.0, "None or a value in [0, 1]", self.alpha),
            ("alpha_grid", bool(self.alpha_grid) and all(0.0 <= a <= 1.0 for a in self.alpha_grid),
             "values in [0, 1]", self.alpha_grid),
            ("act_clip", self.act_clip in ("minmax", "search"), "'minmax' or 'search'", repr(self.act_clip)),
            ("clip_grid", bool(self.clip_grid) and all(0.0 < c <= 1.0 for c in self.clip_grid),
             "values in (0, 1]", self.clip_grid),
            ("static_fallback", self.static_fallback is None or self.static_fallback >= 1.0, "None or >= 1",
             self.static_fallback),
            ("search_tokens", self.search_tokens > 0, "> 0", self.search_tokens),
            ("backend", self.backend in ("kernels", "emulation"), "'kernels' or 'emulation'", repr(self.backend)),
        ]
        for argument, ok, expected, given in checks:
            if not ok:
                raise InvalidProblem(problem_message(where, f"config.{argument}", expected, given))


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _layer_class(config: QuantizeConfig) -> type[W8A8Linear]:
    if config.backend == "emulation":
        from .emulate import EmulatedW8A8Linear

        return EmulatedW8A8Linear
    return W8A8Linear


def quantize_model(model: nn.Module, batches: Iterable[Any] | Calibration | None = None,
                   config: QuantizeConfig | None = None,
                   on_layer: Callable[[str, W8A8Linear], None] | None = None) -> nn.Module:
    """Calibrate (when needed), smooth (``config.smooth``) and swap the selected ``nn.Linear`` layers
    for :class:`W8A8Linear`, in place; returns ``model``.

    ``batches`` (or a :class:`Calibration` of this model from :func:`calibrate`, which this call then
    updates) are needed for smoothing or static activations: each static layer's scale comes from its
    calibrated, smoothed inputs (``config.act_clip``). A transformers model also gets its
    ``quantization_config`` (:mod:`.hf`), so that ``save_pretrained`` / ``from_pretrained`` round-trip it.
    """
    config = config or QuantizeConfig()
    config.validate()
    selected = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and config.selects(n)]
    if not selected:
        raise InvalidProblem(problem_message("quantize_model", "config.include",
                                             "patterns matching at least one nn.Linear", config.include))
    modes = {name: config.mode_of(name) for name, _ in selected}
    needs_data = config.smooth or "static" in modes.values()
    if needs_data and batches is None:
        raise InvalidProblem(problem_message("quantize_model", "batches",
                                             "calibration batches (smoothing or static activations)", None))
    calibration = None
    if needs_data:
        calibration = batches if isinstance(batches, Calibration) else calibrate(model, batches, config)
    if config.smooth:
        smooth(model, calibration, config.alpha, config)
    act_scales = {} if calibration is None else static_scales(
        model, calibration, config, [n for n, mode in modes.items() if mode == "static"])
    modes.update({name: "dynamic" for name, scale in act_scales.items() if scale is None})  # static_fallback
    for name, linear in selected:
        quantized = _layer_class(config).from_float(linear, activation=modes[name], act_scale=act_scales.get(name),
                                                    name=name)
        _set_module(model, name, quantized)
        if on_layer is not None:
            on_layer(name, quantized)
    if config.backend == "kernels" and config.projection_groups:
        group_projections(model, config.projection_groups)
    from . import hf

    if hf.is_transformers_model(model):  # save_pretrained then writes the quantization_config
        hf.attach(model, modes, config)
    return model
