"""compressed-tensors checkpoints (llm-compressor's format, the one vLLM loads for W8A8 int8), both ways.

The format (``config.json``'s ``quantization_config`` with ``quant_method: compressed-tensors``,
``format: int-quantized``): for every quantized ``Linear`` the safetensors hold ``{name}.weight`` int8
``[N, K]``, ``{name}.weight_scale`` ``[N, 1]`` (per output channel) and, for static activations,
``{name}.input_scale`` ``[1]``; ``config_groups`` say which modules (``targets``: class names, module
names or ``re:`` patterns; ``ignore`` likewise) use which scheme.

What :class:`~baracuda_numba.torch.W8A8Linear` runs, and so what :func:`load_compressed_tensors` accepts:
8-bit ``int`` symmetric weights per output channel (``strategy: channel``), and 8-bit ``int`` symmetric
input activations either per token at run time (``dynamic: true``, ``strategy: token``) or with one
static per-tensor scale (``dynamic: false``, ``strategy: tensor``). Anything else (asymmetric, group or
block scales, other bit widths, float types, output or KV-cache quantization, sparsity, transforms)
raises :class:`~baracuda_numba.Unsupported` naming the first tensor it concerns; a tensor of the wrong
shape or dtype raises :class:`~baracuda_numba.torch.StateDictMismatch` naming it.

Numerics: the int8 weights and their scales are used as stored (scales widened to float32, exactly). For
activations llm-compressor's ``scale = max|x| / 127.5`` with the range [-128, 127]; here the kernels'
``max|x| / 127`` and [-127, 127] (README "Semantics"): per token the scales differ by 0.4%, and a static
``input_scale`` is used as stored, an activation that llm-compressor rounds to -128 becoming -127. The
tests measure the logits against llm-compressor's own (``tests/test_torch_compressed_tensors.py``).

:func:`save_compressed_tensors` writes a model quantized here in that format: weights and scales as they
are (float32 scales, which vLLM's int8 scheme keeps in float32), so vLLM and transformers'
compressed-tensors support load it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InvalidProblem, Unsupported, problem_message
from .modules import StateDictMismatch, W8A8Linear, check_w8a8_scales

__all__ = ["load_compressed_tensors", "save_compressed_tensors", "compressed_tensors_config", "layer_modes"]

_WHERE = "load_compressed_tensors"
_WEIGHTS = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
_ACTIVATIONS = {"dynamic": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
                "static": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "tensor", "dynamic": False}}
_ABSENT = ("group_size", "block_structure", "actorder")  # set: group / block scales or reordering


def _matches(name: str, module: nn.Module, target: str) -> bool:
    """compressed-tensors' rule: an exact module name, an ``re:`` pattern matched at the start of the
    name, or the name of a class in the module's MRO (``Linear``)."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name or any(cls.__name__ == target for cls in type(module).__mro__)


def _check_args(args: dict | None, expected: dict, role: str, group: str, tensor: str) -> None:
    if args is None:
        raise Unsupported(problem_message(_WHERE, tensor, f"{role} quantized as {expected}", f"none ({group})"))
    for field, value in expected.items():
        if args.get(field, value) != value:
            raise Unsupported(problem_message(_WHERE, tensor, f"{field}={value!r} ({role}: {expected})",
                                              f"{field}={args.get(field)!r} ({group}.{role})"))
    for field in _ABSENT:
        if args.get(field):
            raise Unsupported(problem_message(_WHERE, tensor, f"no {field} ({role}: {expected})",
                                              f"{field}={args[field]!r} ({group}.{role})"))


def layer_modes(model: nn.Module, quantization_config: dict) -> dict[str, str]:
    """``{linear name: "dynamic" | "static"}`` of the modules the compressed-tensors config quantizes,
    after checking that every scheme is one this package runs (module docstring)."""
    qc = quantization_config
    if qc.get("quant_method") != "compressed-tensors":
        raise InvalidProblem(problem_message(_WHERE, "quantization_config.quant_method", "'compressed-tensors'",
                                             repr(qc.get("quant_method"))))
    for field, ok in (("format", qc.get("format") in (None, "int-quantized")),
                      ("quantization_status", qc.get("quantization_status") in (None, "compressed")),
                      ("kv_cache_scheme", not qc.get("kv_cache_scheme")),
                      ("sparsity_config", not qc.get("sparsity_config")),
                      ("transform_config", not qc.get("transform_config"))):
        if not ok:
            raise Unsupported(problem_message(_WHERE, f"quantization_config.{field}",
                                              "int-quantized, compressed, no KV-cache scheme, sparsity or transform",
                                              repr(qc.get(field))))
    ignore = qc.get("ignore") or []
    modes: dict[str, str] = {}
    for group_name, group in (qc.get("config_groups") or {}).items():
        where = f"config_groups.{group_name}"
        matched = [(n, m) for n, m in model.named_modules()
                   if any(_matches(n, m, t) for t in group.get("targets", []))
                   and not any(_matches(n, m, t) for t in ignore)]
        for name, module in matched:
            if not isinstance(module, nn.Linear):
                raise Unsupported(problem_message(_WHERE, f"{name}.weight", "a quantized nn.Linear",
                                                  f"a {type(module).__name__} ({where}.targets)"))
        if not matched:
            continue
        first = matched[0][0]
        if group.get("format") not in (None, "int-quantized"):
            raise Unsupported(problem_message(_WHERE, f"{first}.weight", "format 'int-quantized'",
                                              f"{group['format']!r} ({where})"))
        _check_args(group.get("weights"), _WEIGHTS, "weights", where, f"{first}.weight")
        if group.get("output_activations"):
            raise Unsupported(problem_message(_WHERE, f"{first}.weight", "no output_activations",
                                              f"{group['output_activations']} ({where})"))
        activations = group.get("input_activations")
        mode = "dynamic" if activations is not None and activations.get("dynamic", False) else "static"
        _check_args(activations, _ACTIVATIONS[mode], "input_activations", where,
                    f"{first}.input_scale" if mode == "static" else f"{first} input")
        for name, _ in matched:
            if modes.setdefault(name, mode) != mode:
                raise Unsupported(problem_message(_WHERE, f"{name}.weight", "one scheme per module",
                                                  f"two ({where} and another group)"))
    if not modes:
        raise InvalidProblem(problem_message(_WHERE, "quantization_config.config_groups",
                                             "groups whose targets match linears of the model", "none"))
    return modes


def _checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        return sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
    single = path / "model.safetensors"
    if not single.exists():
        raise InvalidProblem(problem_message(_WHERE, "path", "a directory with model.safetensors", str(path)))
    return [single]


def _read(files: list[Path], names: set[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    tensors = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118  (a safetensors handle is not iterable)
                if key.rpartition(".")[0] in names:
                    tensors[key] = handle.get_tensor(key)
    return tensors


def _expect(tensors: dict[str, torch.Tensor], key: str, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...],
            alt_shapes: tuple[tuple[int, ...], ...] = ()) -> torch.Tensor:
    value = tensors.get(key)
    names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
    if value is None:
        raise StateDictMismatch(problem_message(_WHERE, key, f"{shape} {names}", "no such tensor"))
    if (tuple(value.shape) != shape and tuple(value.shape) not in alt_shapes) or value.dtype not in dtypes:
        raise StateDictMismatch(problem_message(_WHERE, key, f"{shape} {names}",
                                                f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"))
    return value


_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _w8a8_layer(name: str, linear: nn.Linear, mode: str, tensors: dict[str, torch.Tensor],
                layer_class: type[W8A8Linear]) -> W8A8Linear:
    n, k = linear.out_features, linear.in_features
    weight = _expect(tensors, f"{name}.weight", (n, k), (torch.int8,))
    scale = _expect(tensors, f"{name}.weight_scale", (n, 1), _FLOATS, ((n,),))
    for zero in (f"{name}.weight_zero_point", f"{name}.input_zero_point"):
        if zero in tensors and bool(tensors[zero].ne(0).any()):
            raise Unsupported(problem_message(_WHERE, zero, "zero points of 0 (symmetric)", "nonzero values"))
    state = {"weight_q": weight, "weight_scale": scale.float().reshape(n)}
    if linear.bias is not None:
        state["bias"] = linear.bias.detach().float().cpu()
    if mode == "static":
        input_scale = _expect(tensors, f"{name}.input_scale", (1,), _FLOATS, ((),))
        state["act_scale"] = input_scale.float().reshape(())
    elif f"{name}.input_scale" in tensors:
        raise StateDictMismatch(problem_message(_WHERE, f"{name}.input_scale", "none (dynamic activations)",
                                                "a static input scale"))
    check_w8a8_scales(_WHERE, f"{name}.", weight, state["weight_scale"], state.get("act_scale"),
                      ("weight_scale", "input_scale"))
    # a placeholder static scale: load_state_dict replaces it and checks it (and the rest) by key
    layer = layer_class(k, n, linear.bias is not None, activation=mode, act_scale=1.0 if mode == "static" else None,
                        name=name)
    layer.load_state_dict(state)
    return layer.to(linear.weight.device)


@contextlib.contextmanager
def _quiet_transformers():
    """transformers reports the scales as keys the float model does not have: expected here."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def load_compressed_tensors(path: str | Path, *, dtype: Any = "auto", device: Any = None,
                            backend: str = "kernels") -> nn.Module:
    """Load a compressed-tensors W8A8 int8 checkpoint (a directory with ``config.json`` and safetensors)
    as a transformers causal LM whose quantized linears are :class:`W8A8Linear` (``backend="emulation"``:
    :class:`~baracuda_numba.torch.emulate.EmulatedW8A8Linear`).

    The float parts (embeddings, norms, unquantized linears) load through ``from_pretrained``; each
    quantized linear's int8 weight, scales and input scale are read from the files and checked (module
    docstring). The model gets a :class:`~baracuda_numba.torch.BaracudaConfig`, so ``save_pretrained``
    writes this package's format and :func:`save_compressed_tensors` the compressed-tensors one.
    """
    import transformers

    from . import hf
    from .convert import _set_module
    from .emulate import EmulatedW8A8Linear

    if backend not in ("kernels", "emulation"):
        raise InvalidProblem(problem_message(_WHERE, "backend", "'kernels' or 'emulation'", repr(backend)))
    path = Path(path)
    config = transformers.AutoConfig.from_pretrained(path)
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        raise InvalidProblem(problem_message(_WHERE, "config.json", "a quantization_config", "none"))
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    del config.quantization_config  # loaded as a float model; the quantized layers are swapped in below
    with _quiet_transformers():
        model = transformers.AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype)
    if device is not None:
        model.to(device)
    modes = layer_modes(model, qc)
    tensors = _read(_checkpoint_files(path), set(modes))
    layer_class = EmulatedW8A8Linear if backend == "emulation" else W8A8Linear
    for name, mode in modes.items():
        _set_module(model, name, _w8a8_layer(name, model.get_submodule(name), mode, tensors, layer_class))
    hf.attach(model, modes)
    return model.eval()


def compressed_tensors_config(model: nn.Module) -> dict:
    """The ``quantization_config`` block describing ``model``'s :class:`W8A8Linear` layers: one group
    targeting ``Linear`` (the other linears ignored) when they share an activation mode, else one group
    per mode naming its modules."""
    layers = {n: m for n, m in model.named_modules() if isinstance(m, W8A8Linear)}
    if not layers:
        raise InvalidProblem(problem_message("save_compressed_tensors", "model", "W8A8Linear layers", "none"))
    floats = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    by_mode: dict[str, list[str]] = {}
    for name, layer in layers.items():
        by_mode.setdefault(layer.activation, []).append(name)
    weights = {**_WEIGHTS, "group_size": None, "observer": "minmax"}
    groups = {}
    for index, (mode, names) in enumerate(sorted(by_mode.items())):
        groups[f"group_{index}"] = {"targets": ["Linear"] if len(by_mode) == 1 else names, "weights": weights,
                                    "input_activations": {**_ACTIVATIONS[mode], "group_size": None},
                                    "output_activations": None, "format": "int-quantized"}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "config_groups": groups, "ignore": floats, "kv_cache_scheme": None, "sparsity_config": {},
            "transform_config": {}, "global_compression_ratio": None}


def save_compressed_tensors(model: nn.Module, path: str | Path) -> None:
    """Write ``model`` (a transformers model with :class:`W8A8Linear` layers) as a compressed-tensors
    checkpoint: ``config.json`` with :func:`compressed_tensors_config`, ``model.safetensors`` with each
    quantized layer's int8 ``weight``, float32 ``weight_scale [N, 1]``, ``input_scale [1]`` (static) and
    bias, and the model's other tensors as they are (a tensor tied to an earlier one written once)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, W8A8Linear)}
    qc = compressed_tensors_config(model)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, value in model.state_dict().items():
        if key.rpartition(".")[0] in layers or value.data_ptr() in seen:
            continue
        seen.add(value.data_ptr())
        tensors[key] = value
    for name, layer in layers.items():
        tensors[f"{name}.weight"] = layer.weight_q
        tensors[f"{name}.weight_scale"] = layer.weight_scale.reshape(-1, 1)
        if layer.bias is not None:
            tensors[f"{name}.bias"] = layer.bias.to(dtype)
        if layer.act_scale is not None:
            tensors[f"{name}.input_scale"] = layer.act_scale.reshape(1)
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    config = copy.deepcopy(model.config)
    config.quantization_config = qc
    config.save_pretrained(path)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(path)
