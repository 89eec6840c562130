"""Hugging Face transformers integration: :class:`BaracudaConfig` and :class:`BaracudaHfQuantizer`.

Importing :mod:`baracuda_numba.torch` registers both under the quantization method ``"baracuda"``
(``transformers.quantizers.register_quantization_config`` / ``register_quantizer``; transformers 5.x), so:

- ``AutoModelForCausalLM.from_pretrained(name, quantization_config=BaracudaConfig())`` loads the float
  checkpoint and swaps the selected ``nn.Linear`` layers for :class:`~baracuda_numba.torch.W8A8Linear`
  with dynamic (per-token) activations, which need no data;
- a model quantized with :func:`~baracuda_numba.torch.quantize_model` (any recipe: dynamic or static,
  smoothed or not) carries a :class:`BaracudaConfig` naming each quantized layer and its activation mode,
  so ``model.save_pretrained(d)`` writes it into ``config.json`` next to the int8 state dict, and
  ``AutoModelForCausalLM.from_pretrained(d)`` (in any process that imported ``baracuda_numba.torch``)
  rebuilds the same modules and loads the same bits. SmoothQuant's scales are already folded into the
  saved norm and linear weights.

A checkpoint that does not fit its config (a layer's key missing, of the other activation mode, of
another shape or dtype, or scales that are not finite and positive) raises
:class:`~baracuda_numba.torch.StateDictMismatch` naming the key, before any weight is loaded.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from ..errors import InvalidProblem, problem_message
from .modules import StateDictMismatch, W8A8Linear, check_w8a8_entries, check_w8a8_scales

__all__ = ["QUANT_METHOD", "BaracudaConfig", "BaracudaHfQuantizer", "attach", "register", "checkpoint_entries",
           "is_transformers_model"]

QUANT_METHOD = "baracuda"
FORMAT_VERSION = 1

# safetensors' dtype names (the header's "dtype" field)
_SAFETENSORS_DTYPES = {"I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32,
                       "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
                       "F64": torch.float64, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
                       "F8_E5M2": torch.float8_e5m2}

try:
    from transformers.quantizers import HfQuantizer, register_quantization_config, register_quantizer
    from transformers.utils.quantization_config import QuantizationConfigMixin
except ImportError:  # pragma: no cover - exercised only without transformers
    HfQuantizer = QuantizationConfigMixin = None


def checkpoint_entries(files: list[str]) -> dict[str, tuple[tuple[int, ...], Any]]:
    """``{key: (shape, dtype)}`` of every tensor in ``files`` (safetensors), read from the headers only."""
    from safetensors import safe_open

    entries = {}
    for path in files:
        if not str(path).endswith(".safetensors"):
            raise InvalidProblem(problem_message("BaracudaHfQuantizer", "checkpoint", "safetensors files", path))
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118  (a safetensors handle is not iterable)
                piece = handle.get_slice(key)
                dtype = piece.get_dtype()
                entries[key] = (tuple(piece.get_shape()), _SAFETENSORS_DTYPES.get(dtype, dtype))
    return entries


if QuantizationConfigMixin is not None:

    class BaracudaConfig(QuantizationConfigMixin):
        """The ``quantization_config`` of a baracuda W8A8 model (``config.json``).

        Parameters
        ----------
        activation : ``"dynamic"`` for quantization on load (the only mode that needs no data); a
            saved model names each layer's mode in ``layers``.
        include, exclude : ``fnmatch`` patterns choosing the linears quantized on load, as in
            :class:`~baracuda_numba.torch.QuantizeConfig` (default: all but ``lm_head``).
        layers : ``{qualified name: "dynamic" | "static"}`` of the quantized layers; written when a model
            is quantized, read when a saved one is loaded.
        """

        def __init__(self, activation: str = "dynamic", include: list[str] | None = None,
                     exclude: list[str] | None = None, layers: dict[str, str] | None = None,
                     format_version: int = FORMAT_VERSION, **kwargs: Any) -> None:
            self.quant_method = QUANT_METHOD
            self.activation = activation
            self.include = list(include) if include is not None else ["*"]
            self.exclude = list(exclude) if exclude is not None else ["lm_head", "*.lm_head"]
            self.layers = dict(layers or {})
            self.format_version = format_version
            where = "BaracudaConfig"
            if activation not in ("dynamic", "static"):
                raise InvalidProblem(problem_message(where, "activation", "'dynamic' or 'static'", repr(activation)))
            if format_version != FORMAT_VERSION:
                raise InvalidProblem(problem_message(where, "format_version", FORMAT_VERSION, format_version))
            for name, mode in self.layers.items():
                if mode not in ("dynamic", "static"):
                    raise InvalidProblem(problem_message(where, f"layers[{name!r}]", "'dynamic' or 'static'",
                                                         repr(mode)))

        def quantize_config(self):
            from .convert import QuantizeConfig

            return QuantizeConfig(include=self.include, exclude=self.exclude, activation=self.activation,
                                  progress=False)

    class BaracudaHfQuantizer(HfQuantizer):
        """The ``HfQuantizer`` of :class:`BaracudaConfig` (see the module docstring)."""

        requires_calibration = False

        def validate_environment(self, *args: Any, **kwargs: Any) -> None:
            config = self.quantization_config
            if not self.pre_quantized and config.activation != "dynamic":
                raise InvalidProblem(problem_message(
                    "BaracudaHfQuantizer", "quantization_config.activation",
                    "'dynamic' when quantizing on load (static scales need calibration batches: quantize_model("
                    "model, batches, QuantizeConfig(activation='static', ...)), then save_pretrained)",
                    repr(config.activation)))
            if self.pre_quantized and not config.layers:
                raise InvalidProblem(problem_message("BaracudaHfQuantizer", "quantization_config.layers",
                                                     "the quantized layers of a saved model", "none"))

        def _process_model_before_weight_loading(self, model: nn.Module, checkpoint_files: list[str] | None = None,
                                                 **kwargs: Any) -> nn.Module:
            if not self.pre_quantized:
                return model
            for name, mode in self.quantization_config.layers.items():
                try:
                    linear = model.get_submodule(name)
                except AttributeError:
                    raise StateDictMismatch(problem_message("BaracudaHfQuantizer", f"layers[{name!r}]",
                                                            "a module of the model", "no such module")) from None
                if not isinstance(linear, nn.Linear):
                    raise StateDictMismatch(problem_message("BaracudaHfQuantizer", f"layers[{name!r}]",
                                                            "an nn.Linear", type(linear).__name__))
                # a placeholder act_scale: the checkpoint's replaces it (checked below)
                layer = W8A8Linear(linear.in_features, linear.out_features, linear.bias is not None,
                                   activation=mode, act_scale=1.0 if mode == "static" else None, name=name)
                _set_module(model, name, layer)
            if checkpoint_files:
                _check_checkpoint(model, checkpoint_entries(checkpoint_files))
            return model

        def _process_model_after_weight_loading(self, model: nn.Module, **kwargs: Any) -> nn.Module:
            if self.pre_quantized:
                for name, layer in model.named_modules():
                    if isinstance(layer, W8A8Linear):
                        check_w8a8_scales(name, name + ".", layer.weight_q, layer.weight_scale, layer.act_scale)
                        layer.refresh()
                from .groups import group_projections

                group_projections(model)  # as quantize_model does: the loaded buffers are each their own
                return model
            from .convert import quantize_model

            quantize_model(model, None, self.quantization_config.quantize_config())  # attaches the layers map
            return model

        def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
            return True

        @property
        def is_trainable(self) -> bool:
            return False

        @property
        def is_compileable(self) -> bool:
            return True

else:  # pragma: no cover
    BaracudaConfig = BaracudaHfQuantizer = None


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _check_checkpoint(model: nn.Module, entries: dict[str, tuple[tuple[int, ...], Any]]) -> None:
    """Every W8A8 layer's keys, shapes and dtypes against the checkpoint's headers; no quantized key
    (``weight_q``, ``act_scale``) left for a layer the config does not name."""
    prefix = getattr(model, "base_model_prefix", "")

    def resolve(key: str) -> str:
        for candidate in (key, f"{prefix}.{key}", key.removeprefix(f"{prefix}.")):
            if candidate in entries:
                return candidate
        return key

    claimed = set()
    for name, layer in model.named_modules():
        if not isinstance(layer, W8A8Linear):
            continue
        spec = layer.state_dict_spec()
        found = {}
        for key in (*spec, "weight", "bias", "act_scale"):
            resolved = resolve(f"{name}.{key}")
            if resolved in entries:
                found[key] = entries[resolved]
                claimed.add(resolved)
        check_w8a8_entries(name, f"{name}.", spec, found, layer.activation)
    for key in entries:
        if key not in claimed and key.rpartition(".")[2] in ("weight_q", "act_scale"):
            raise StateDictMismatch(problem_message("BaracudaHfQuantizer", key,
                                                    "a layer named in quantization_config.layers", "none"))


def attach(model: nn.Module, layers: dict[str, str], config: Any = None) -> None:
    """Give a transformers model with :class:`W8A8Linear` layers (``layers``: name -> activation mode) its
    :class:`BaracudaConfig` and quantizer, so that ``save_pretrained`` writes ``quantization_config``.
    ``config``: the :class:`~baracuda_numba.torch.QuantizeConfig` it was quantized with (recorded), if any."""
    if BaracudaConfig is None:
        return
    current = getattr(model, "hf_quantizer", None)
    known = dict(current.quantization_config.layers) if isinstance(current, BaracudaHfQuantizer) else {}
    recipe = {} if config is None else {"include": list(config.include), "exclude": list(config.exclude)}
    activation = "static" if "static" in layers.values() else "dynamic"
    hf_config = BaracudaConfig(activation=activation, layers={**known, **layers}, **recipe)
    model.hf_quantizer = BaracudaHfQuantizer(hf_config, pre_quantized=True)
    model.config.quantization_config = hf_config
    model.is_quantized = True
    model.quantization_method = QUANT_METHOD


def is_transformers_model(model: nn.Module) -> bool:
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def register() -> bool:
    """Register :class:`BaracudaConfig` and :class:`BaracudaHfQuantizer` with transformers (once);
    False when transformers is not installed."""
    if BaracudaConfig is None:
        return False
    from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING

    if AUTO_QUANTIZATION_CONFIG_MAPPING.get(QUANT_METHOD) is not BaracudaConfig:
        AUTO_QUANTIZATION_CONFIG_MAPPING.pop(QUANT_METHOD, None)
        register_quantization_config(QUANT_METHOD)(BaracudaConfig)
    if AUTO_QUANTIZER_MAPPING.get(QUANT_METHOD) is not BaracudaHfQuantizer:
        AUTO_QUANTIZER_MAPPING.pop(QUANT_METHOD, None)
        register_quantizer(QUANT_METHOD)(BaracudaHfQuantizer)
    return True
