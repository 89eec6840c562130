"""Model-level benchmark: a Llama with the Llama-2-7B layer shapes, random weights, in bf16 against the
same model quantized W8A8, measured in one run, the way users run a Hugging Face model.

    baracuda-numba bench --only model [--out DIR]      (rows in bench.json / bench.md)
    python -m baracuda_numba.torch.benchmark_model [--layers 4] [--batches 1 16] [--out DIR]

The model: ``transformers.LlamaConfig`` with hidden 4096, intermediate 11008, 32 heads, vocabulary 32000
and :attr:`ModelBenchConfig.layers` layers (4 by default), random weights (Hugging Face's
initialisation), bf16. The quantized models are deep copies of it: ``quantize_model(model, None,
QuantizeConfig(activation="dynamic"))``, and static activations with SmoothQuant
(``QuantizeConfig(activation="static", smooth=True)``) calibrated on a few batches of random tokens;
``lm_head`` stays bf16 in both.

Rows (each a dict with ``section``):

- ``decode``: one new token per step against a ``StaticCache`` filled by an eager prefill of
  ``prompt`` tokens, eagerly, under ``torch.compile`` (default mode) and under
  ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), at each batch size: ms per step (CUDA events
  around ``steps`` steps after ``warmup``), tokens/s, the speed against bf16 in the same mode and batch,
  and for the compiled modes the first calls' wall time (compile, warm-up, graph capture). The modes run one
  after the other, each over every model (eager first, before anything is compiled in the process). Eager and
  default-mode compiled decode are bound by the host, whose speed drifts: there every model is prepared first,
  then timed in ``rounds`` rounds of ``steps`` steps, the models taking turns, and the row is the median round
  (:func:`decode_rows`). A mode that raises is a row with ``status: failed`` and its error, not the end of the run.
- ``prefill``: an eager forward of ``prefill`` = (batch, tokens), logits of the last token only (as
  ``generate``'s prefill), tokens/s.
- ``projections``: the seven projections of ``projection_layers`` layers (q, k, v, o, gate, up, down:
  56 for 8 layers) captured in one CUDA graph, GPU time per replay at ``projection_tokens`` tokens,
  ``F.linear`` on bf16 weights against :class:`W8A8Linear` (dynamic and static), alone and with each layer's
  q / k / v and gate / up grouped as :func:`quantize_model` groups them (:mod:`.groups`).
- ``host``: host microseconds per layer call at each projection shape, timed behind a GPU busy wait
  (:func:`baracuda_numba.bench.host_us`): ``nn.Linear`` against :class:`W8A8Linear` (dynamic, static) in eager
  mode, and the call compiled code makes for each layer (``F.linear``, the ``baracuda::quantized_linear`` op).
- ``fidelity``: the relative difference of the logits of a ``torch.compile``'d forward against the eager
  one (``||compiled - eager|| / ||eager||``, top-1 agreement) for the bf16 model, our W8A8 dynamic model
  and a pure-PyTorch emulation of the same W8A8 numerics (:class:`EmulatedW8A8Linear`); and the same
  difference with Inductor rounding every bf16 intermediate as eager does (``emulate_precision_casts``).

On a machine without CUDA only the eager decode, prefill and fidelity sections run (the tests run a tiny
configuration so, on the simulator); the device is printed first.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .convert import QuantizeConfig, _set_module, quantize_model
from .groups import group_projections
from .modules import W8A8Linear, true_quotient
from .qat import compare_logits

__all__ = ["ModelBenchConfig", "EmulatedW8A8Linear", "build_llama", "decode_logits", "run", "markdown", "main"]

BF16, DYNAMIC, STATIC, EMULATED = "bf16", "W8A8 dynamic", "W8A8 static + SmoothQuant", "W8A8 emulated (PyTorch)"
# decode mode -> torch.compile's keywords (None: eager)
MODES: dict[str, dict | None] = {"eager": None, "compile": {}, "reduce-overhead": {"mode": "reduce-overhead"}}
GPU_SECTIONS = ("projections", "host")
INTERLEAVED = ("eager", "compile")  # host-bound decode modes, timed in interleaved rounds (decode_rows)


@dataclass(frozen=True)
class ModelBenchConfig:
    """What :func:`run` builds and measures (the defaults: the Llama-2-7B layer shapes on a GPU)."""

    hidden: int = 4096
    intermediate: int = 11008
    heads: int = 32
    layers: int = 4
    vocab: int = 32000
    dtype: str = "bfloat16"
    device: str = "cuda"
    models: tuple[str, ...] = (BF16, DYNAMIC, STATIC)
    sections: tuple[str, ...] = ("decode", "prefill", "projections", "host", "fidelity")
    modes: tuple[str, ...] = ("eager", "compile", "reduce-overhead")
    batches: tuple[int, ...] = (1, 16)
    prompt: int = 32  # tokens prefilled eagerly into the cache before decoding
    warmup: int = 3  # decode steps before the timed ones (compile and graph capture happen here)
    steps: int = 32  # timed decode steps (per round, in the interleaved modes)
    rounds: int = 5  # rounds of the interleaved modes: every model times `steps` steps per round
    prefill: tuple[int, int] = (4, 512)  # (batch, tokens)
    prefill_repeats: int = 5
    calibration: tuple[int, int, int] = (4, 1, 512)  # (batches, batch size, tokens) of random tokens
    include: tuple[str, ...] = ("*",)  # QuantizeConfig.include: the linears quantized
    projection_layers: int = 8
    projection_tokens: tuple[int, ...] = (1, 16, 64)
    host_tokens: tuple[int, ...] = (1, 16)
    host_calls: int = 2000
    fidelity_models: tuple[str, ...] = (BF16, DYNAMIC, EMULATED)
    fidelity_tokens: tuple[int, int] = (1, 128)  # (batch, tokens)
    compile_backend: str | Callable = "inductor"  # torch.compile's backend (a name or a callable)
    fullgraph: bool = True
    seed: int = 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


# -- models ----------------------------------------------------------------------------------------


def build_llama(config: ModelBenchConfig) -> nn.Module:
    """A ``LlamaForCausalLM`` of ``config``'s shapes with random weights, in ``config.dtype``, eval mode."""
    import transformers

    torch.manual_seed(config.seed)
    llama = transformers.LlamaConfig(vocab_size=config.vocab, hidden_size=config.hidden,
                                     intermediate_size=config.intermediate, num_hidden_layers=config.layers,
                                     num_attention_heads=config.heads, num_key_value_heads=config.heads,
                                     max_position_embeddings=4096)
    with torch.device(config.device):  # initialised where it runs (seconds on a GPU, minutes on a CPU)
        model = transformers.LlamaForCausalLM(llama)
    return model.to(config.torch_dtype).eval()


def _tokens(config: ModelBenchConfig, batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab, (batch, length), generator=g).to(config.device)


def quantized_model(base: nn.Module, name: str, config: ModelBenchConfig) -> nn.Module:
    """A deep copy of ``base`` quantized by the recipe ``name`` (:data:`DYNAMIC` or :data:`STATIC`)."""
    model = copy.deepcopy(base)
    include = list(config.include)
    if name == DYNAMIC:
        return quantize_model(model, None, QuantizeConfig(include=include, activation="dynamic", progress=False))
    count, batch, length = config.calibration
    batches = [{"input_ids": _tokens(config, batch, length, 1000 + i)} for i in range(count)]
    return quantize_model(model, batches, QuantizeConfig(include=include, activation="static", smooth=True,
                                                         alpha=0.5, progress=False))


class EmulatedW8A8Linear(nn.Module):
    """:class:`W8A8Linear`'s dynamic numerics in plain PyTorch, for compiled-against-eager comparisons:
    per-token ``s_x = max|x| / 127`` (1 for an all-zero row, at least the smallest normal float32),
    ``q = clamp(round(x * (1 / s_x)), -127, 127)``, exact integer products summed in float64, then
    ``(acc * s_x) * weight_scale + bias`` in float32, in ``x``'s dtype. Shares the layer's buffers."""

    def __init__(self, layer: W8A8Linear) -> None:
        super().__init__()
        self.weight_q, self.weight_scale, self.bias = layer.weight_q, layer.weight_scale, layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        amax = xf.abs().amax(dim=-1, keepdim=True)
        scale = torch.where(amax == 0, torch.ones_like(amax), true_quotient(amax, 127.0)).clamp(
            min=torch.finfo(torch.float32).tiny)
        q = torch.clamp(torch.round(xf * (1.0 / scale)), -127, 127)
        acc = (q.double() @ self.weight_q.double().T).float()
        y = (acc * scale) * self.weight_scale
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


def emulated_model(quantized: nn.Module) -> nn.Module:
    """A copy of a dynamic W8A8 model whose :class:`W8A8Linear` layers are :class:`EmulatedW8A8Linear`."""
    model = copy.deepcopy(quantized)
    for name, module in list(model.named_modules()):
        if isinstance(module, W8A8Linear):
            _set_module(model, name, EmulatedW8A8Linear(module))
    return model


# -- timing ----------------------------------------------------------------------------------------


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed_ms(fn: Callable[[], Any], count: int, device: str) -> float:
    """Milliseconds per call of ``count`` back-to-back calls: CUDA events on a GPU (host gaps count), the
    wall clock elsewhere."""
    if device.startswith("cuda"):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(count):
            fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / count
    start = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - start) * 1e3 / count


def _error(exc: BaseException) -> str:
    """The exception in one line: its type and the first line of its message, then its cause's (dynamo
    wraps a backend's error in its own)."""
    parts = []
    while exc is not None and len(parts) < 3:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        head = " ".join(lines[:2]) if lines and lines[0].endswith(":") else (lines[0] if lines else "")
        parts.append(f"{type(exc).__name__}: {head}")
        exc = exc.__cause__ or getattr(exc, "inner_exception", None)
    return " <- ".join(parts)[:400]


def _reset_compiled() -> None:
    """Forget compiled graphs and CUDA-graph pools between measurements (each starts cold, within
    dynamo's recompile limits)."""
    torch._dynamo.reset()


# -- decode and prefill -----------------------------------------------------------------------------


def static_cache(model: nn.Module, max_len: int) -> Any:
    """A ``StaticCache`` of ``max_len`` tokens for ``model``: ``StaticCache(config=, max_cache_len=)``, the
    constructor of transformers 4.56 onwards (5.17 and 5.23 alike), whose layers take their batch size,
    device and dtype from the first keys written (the eager prefill, outside any compiled region)."""
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_len)


def _accepts(model: nn.Module, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


class _Decoder:
    """One model decoding one batch in one mode, ready to time: built, prefilled and warmed up (compiled and
    captured, in a compiled mode) by :meth:`prepare`; ``row`` holds what is known so far, or the error."""

    def __init__(self, model: nn.Module, name: str, mode: str, batch: int, config: ModelBenchConfig,
                 timed_steps: int) -> None:
        self.model, self.mode, self.batch, self.config = model, mode, batch, config
        self.timed_steps = timed_steps  # every step :meth:`time` will take (the cache is sized for them)
        self.row: dict = {"section": "decode", "model": name, "mode": mode, "batch": batch, "status": "ok"}
        self.step: Callable[[], None] | None = None

    def prepare(self) -> None:
        model, mode, config = self.model, self.mode, self.config
        try:
            step_forward = model.forward
            if MODES[mode] is not None:
                step_forward = torch.compile(model.forward, fullgraph=config.fullgraph,
                                             backend=config.compile_backend, dynamic=False, **MODES[mode])
            # a compiled mode's cache is always built by an eager call (lazy initialisation inside a compiled
            # region would leave its tensors without static addresses, which CUDA graphs need)
            prompt = config.prompt or (0 if MODES[mode] is None else 1)
            cache = static_cache(model, prompt + config.warmup + self.timed_steps + 1)
            positional = _accepts(model, "cache_position")  # transformers versions that still take it
            state = {"token": _tokens(config, self.batch, 1, 7), "position": 0}

            def call(forward: Callable, ids: torch.Tensor) -> torch.Tensor:
                kwargs = {}
                if positional:
                    kwargs["cache_position"] = torch.arange(state["position"], state["position"] + ids.shape[1],
                                                            device=config.device)
                state["position"] += ids.shape[1]
                return forward(input_ids=ids, past_key_values=cache, use_cache=True,
                               **kwargs).logits[:, -1:].argmax(-1)

            def step() -> None:
                if mode == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                state["token"] = call(step_forward, state["token"])

            with torch.no_grad():
                if prompt:  # eager: the cache is built outside any compiled region
                    state["token"] = call(model.forward, _tokens(config, self.batch, prompt, 5))
                _synchronize(config.device)
                start = time.perf_counter()
                for _ in range(config.warmup):
                    step()
                _synchronize(config.device)
            if MODES[mode] is not None:
                self.row["first_calls_s"] = time.perf_counter() - start
            self.step = step
        except Exception as exc:  # reported in the table: a mode that fails must not end the run
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        self.row.update({"status": "failed", "error": _error(exc)})
        self.step = None
        traceback.print_exc(limit=3)

    def time(self, steps: int) -> float | None:
        """Milliseconds per step over ``steps`` back-to-back steps (None once failed)."""
        if self.step is None:
            return None
        try:
            with torch.no_grad():
                return _timed_ms(self.step, steps, self.config.device)
        except Exception as exc:
            self.fail(exc)
            return None

    def finish(self, samples: list[float]) -> dict:
        """The row: the median of ``samples`` (ms per step), tokens/s, and the spread of the samples."""
        if self.row["status"] == "ok" and samples:
            ms = statistics.median(samples)
            self.row.update({"ms": ms, "tokens_per_s": 1e3 * self.batch / ms, "rounds": len(samples),
                             "spread": (max(samples) - min(samples)) / ms, "round_ms": list(samples)})
        return self.row


def decode_row(model: nn.Module, name: str, mode: str, batch: int, config: ModelBenchConfig) -> dict:
    """One decode measurement on its own (see the module docstring); a failure is a row with its error."""
    decoder = _Decoder(model, name, mode, batch, config, config.steps)
    try:
        decoder.prepare()
        ms = decoder.time(config.steps)
        return decoder.finish([] if ms is None else [ms])
    finally:
        _reset_compiled()


def decode_rows(models: dict[str, nn.Module], mode: str, config: ModelBenchConfig) -> list[dict]:
    """Every model at every batch size in one mode. A host-bound mode (:data:`INTERLEAVED`: eager, compile
    default) prepares every model first, then times ``rounds`` rounds, each ``steps`` steps of every model in
    turn, and reports the median round: the host's speed drifts by tens of percent within a minute (other
    processes, clocks), and interleaving gives each model the same moments. CUDA graph replay is GPU-bound:
    one model after the other, each compiled graph freed before the next."""
    if mode not in INTERLEAVED:
        return [decode_row(model, name, mode, batch, config) for name, model in models.items()
                for batch in config.batches]
    rounds = max(1, config.rounds)
    decoders = [_Decoder(model, name, mode, batch, config, rounds * config.steps)
                for name, model in models.items() for batch in config.batches]
    samples: dict[int, list[float]] = {id(d): [] for d in decoders}
    try:
        # each graph its own dynamo cache entry (a model and batch size each): room for all of them at once
        limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
        with torch._dynamo.config.patch(**{limit: max(8, 2 * len(decoders))}):
            for decoder in decoders:
                decoder.prepare()
            for _ in range(rounds):
                for decoder in decoders:
                    ms = decoder.time(config.steps)
                    if ms is not None:
                        samples[id(decoder)].append(ms)
    finally:
        _reset_compiled()
    return [d.finish(samples[id(d)]) for d in decoders]


def decode_logits(model: nn.Module, mode: str, tokens: torch.Tensor, config: ModelBenchConfig,
                  prompt: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The logits of each decode step of ``model`` in ``mode`` (:data:`MODES`), fed the columns of ``tokens``
    (``[batch, steps]``, teacher forcing: every mode sees the same inputs) after an eager prefill of ``prompt``
    into a fresh ``StaticCache``, as :func:`decode_row` runs them (copies, float32)."""
    forward = model.forward
    if MODES[mode] is not None:
        forward = torch.compile(model.forward, fullgraph=config.fullgraph, backend=config.compile_backend,
                                dynamic=False, **MODES[mode])
    length = (0 if prompt is None else prompt.shape[1]) + tokens.shape[1] + 1
    cache = static_cache(model, length)
    logits = []
    try:
        with torch.no_grad():
            if prompt is not None:
                model(input_ids=prompt, past_key_values=cache, use_cache=True)
            for step in range(tokens.shape[1]):
                if mode == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                out = forward(input_ids=tokens[:, step:step + 1], past_key_values=cache, use_cache=True).logits
                logits.append(out[:, -1].float().clone())
    finally:
        _reset_compiled()
    return logits


def prefill_row(model: nn.Module, name: str, config: ModelBenchConfig) -> dict:
    batch, length = config.prefill
    row = {"section": "prefill", "model": name, "batch": batch, "tokens": length, "status": "ok"}
    try:
        ids = _tokens(config, batch, length, 11)
        kwargs = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
        with torch.no_grad():
            def forward() -> None:
                model(input_ids=ids, use_cache=False, **kwargs)

            if config.prefill_repeats > 1:
                forward()  # warm-up (kernel compilation, allocator)
            _synchronize(config.device)
            ms = statistics.median(_timed_ms(forward, 1, config.device) for _ in range(config.prefill_repeats))
        row.update({"ms": ms, "tokens_per_s": 1e3 * batch * length / ms})
    except Exception as exc:
        row.update({"status": "failed", "error": _error(exc)})
        traceback.print_exc(limit=3)
    return row


def fidelity_row(model: nn.Module, name: str, config: ModelBenchConfig) -> dict:
    """Logits of a compiled forward (default mode) against the eager ones on the same tokens; then again with
    Inductor told to round each bf16 / f16 intermediate as eager does (``emulate_precision_casts``): where the
    first figure comes from Inductor keeping fused intermediates in float32, the second is far smaller."""
    row = {"section": "fidelity", "model": name, "status": "ok"}
    try:
        ids = _tokens(config, *config.fidelity_tokens, 13)
        with torch.no_grad():
            eager = model(input_ids=ids, use_cache=False).logits
            compiled = torch.compile(model.forward, fullgraph=config.fullgraph, backend=config.compile_backend,
                                     dynamic=False)
            got = compiled(input_ids=ids, use_cache=False).logits
            row.update(compare_logits(eager, got))
            _reset_compiled()
            from torch._inductor import config as inductor_config

            with inductor_config.patch(emulate_precision_casts=True):
                compiled = torch.compile(model.forward, fullgraph=config.fullgraph, backend=config.compile_backend,
                                         dynamic=False)
                got = compiled(input_ids=ids, use_cache=False).logits
            row["rel_error_emulated_casts"] = compare_logits(eager, got)["rel_error"]
    except Exception as exc:
        row.update({"status": "failed", "error": _error(exc)})
        traceback.print_exc(limit=3)
    finally:
        _reset_compiled()
    return row


# -- projections and host time (GPU) ----------------------------------------------------------------


def _projection_shapes(config: ModelBenchConfig) -> list[tuple[int, int]]:
    """``(out, in)`` of q, k, v, o, gate, up, down."""
    h, i = config.hidden, config.intermediate
    return [(h, h)] * 4 + [(i, h), (i, h), (h, i)]


def projection_rows(config: ModelBenchConfig) -> list[dict]:
    """The seven projections of ``projection_layers`` layers in one CUDA graph, bf16 against W8A8."""
    from .. import bench

    bench._import_torch()

    torch.manual_seed(config.seed)
    dtype, device = config.torch_dtype, config.device
    linears = [nn.Linear(k, n, bias=False, device=device, dtype=dtype) for _ in range(config.projection_layers)
               for n, k in _projection_shapes(config)]
    variants = {BF16: linears}
    for name, activation in ((DYNAMIC, "dynamic"), (STATIC, "static")):
        variants[name] = [W8A8Linear.from_float(layer, activation=activation, act_scale=0.02) for layer in linears]
        variants[f"{name}, grouped"] = _grouped([W8A8Linear.from_float(layer, activation=activation, act_scale=0.02)
                                                 for layer in linears])
    rows = []
    for tokens in config.projection_tokens:
        inputs = {k: torch.randn(tokens, k, device=device, dtype=dtype) for k in {config.hidden, config.intermediate}}
        times = {}
        for name, layers in variants.items():
            try:
                with torch.no_grad():
                    times[name] = bench.graph_ms(_projections_call(layers, inputs), calls=1)
            except Exception as exc:
                rows.append({"section": "projections", "model": name, "tokens": tokens, "status": "failed",
                             "error": _error(exc)})
        for name, ms in times.items():
            row = {"section": "projections", "model": name, "tokens": tokens, "layers": config.projection_layers,
                   "projections": len(variants[name]), "ms": ms, "status": "ok"}
            if BF16 in times:
                row["speedup_vs_bf16"] = times[BF16] / ms
            rows.append(row)
    return rows


def _grouped(layers: list[W8A8Linear]) -> list[W8A8Linear]:
    """``layers`` (q, k, v, o, gate, up, down of each model layer) grouped as in a model (:func:`group_projections`:
    the projections that read one input, called in turn with the same tensor, as a model's forward does)."""
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for start in range(0, len(layers), len(names)):
        parent = nn.Module()
        for name, layer in zip(names, layers[start:start + len(names)], strict=True):
            parent.add_module(name, layer)
        group_projections(parent)
    return layers


def _projections_call(layers: list[nn.Module], inputs: dict[int, torch.Tensor]) -> Callable[[], None]:
    def call() -> None:
        for layer in layers:
            layer(inputs[layer.in_features])

    return call


def host_rows(config: ModelBenchConfig) -> list[dict]:
    """Host microseconds per eager call of each projection shape (attention, gate / up, down): ``nn.Linear``
    against :class:`W8A8Linear` (dynamic, static) as eager mode calls them, and the calls Inductor's code makes for
    each in default-mode ``torch.compile``: ``torch.mm`` of the transposed weight into a buffer it allocated
    (``extern_kernels.mm(..., out=buf)``), and the ``baracuda::quantized_linear_out`` op into such a buffer."""
    from .. import bench
    from . import ops

    bench._import_torch()

    torch.manual_seed(config.seed)
    rows = []
    for n, k in sorted(set(_projection_shapes(config))):
        linear = nn.Linear(k, n, bias=False, device=config.device, dtype=config.torch_dtype)
        dynamic = W8A8Linear.from_float(linear)
        static = W8A8Linear.from_float(linear, activation="static", act_scale=0.02)
        weight_t = linear.weight.t()
        for tokens in config.host_tokens:
            x = torch.randn(tokens, k, device=config.device, dtype=config.torch_dtype)
            buffer = torch.empty(tokens, n, device=config.device, dtype=config.torch_dtype)
            calls = {"nn.Linear": linear, f"W8A8Linear ({DYNAMIC})": dynamic, f"W8A8Linear ({STATIC})": static,
                     "torch.mm into a buffer (compiled code's call)":
                         lambda x, w=weight_t, o=buffer: torch.mm(x, w, out=o),
                     "baracuda::quantized_linear_out (compiled code's call)":
                         lambda x, m=dynamic, o=buffer: ops.quantized_linear_out(x, m.weight_q, m.weight_scale, None,
                                                                                 True, None, o)}
            for name, layer in calls.items():
                row = {"section": "host", "layer": name, "shape": f"{n}x{k}", "tokens": tokens, "status": "ok"}
                try:
                    with torch.no_grad():
                        row["us"] = bench.host_us(_layer_call(layer, x), calls=config.host_calls)
                except Exception as exc:
                    row.update({"status": "failed", "error": _error(exc)})
                rows.append(row)
    return rows


def _layer_call(layer: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], None]:
    def call() -> None:
        layer(x)

    return call


# -- the run ---------------------------------------------------------------------------------------


def _with_ratios(rows: list[dict]) -> list[dict]:
    """``speedup_vs_bf16`` on decode and prefill rows, against bf16's row of the same section, mode and batch: the
    median of the rounds' ratios where both were timed in the same interleaved rounds (each ratio compares times
    taken moments apart, so the host's drift over the run cancels), else bf16's ms over the row's."""
    reference = {(r["section"], r.get("mode"), r.get("batch")): r for r in rows
                 if r.get("model") == BF16 and r["status"] == "ok" and r["section"] in ("decode", "prefill")}
    for r in rows:
        key = (r["section"], r.get("mode"), r.get("batch"))
        if r["section"] in ("decode", "prefill") and r["status"] == "ok" and key in reference:
            base = reference[key]
            paired = r.get("round_ms"), base.get("round_ms")
            if paired[0] and paired[1] and len(paired[0]) == len(paired[1]) > 1:
                r["speedup_vs_bf16"] = statistics.median([b / m for m, b in zip(*paired, strict=True)])
            else:
                r["speedup_vs_bf16"] = base["ms"] / r["ms"]
    return rows


def device_name(config: ModelBenchConfig) -> str:
    if config.device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(config.device))
    from .. import platform

    return f"{config.device} ({platform.backend_name()})"


def run(config: ModelBenchConfig = ModelBenchConfig()) -> list[dict]:
    """Every row of the sections in ``config.sections`` (see the module docstring); prints the device first."""
    described = {"section": "config", "device": device_name(config), "layers": config.layers,
                 "hidden": config.hidden, "intermediate": config.intermediate, "heads": config.heads,
                 "vocab": config.vocab, "dtype": config.dtype, "quantized": list(config.include)}
    print(f"model benchmark on {described['device']}: Llama, {config.layers} layers, hidden {config.hidden}, "
          f"intermediate {config.intermediate}, {config.heads} heads, vocabulary {config.vocab}, {config.dtype}",
          flush=True)
    cuda = config.device.startswith("cuda")
    sections = [s for s in config.sections if cuda or s not in GPU_SECTIONS]
    modes = [m for m in config.modes if cuda or MODES[m] is None] if "decode" in sections else []
    rows: list[dict] = [described]
    base = build_llama(config)
    fidelity = set(config.fidelity_models) if "fidelity" in sections else set()
    wanted = set(config.models) | fidelity | ({DYNAMIC} if EMULATED in fidelity else set())
    models = {name: base if name == BF16 else quantized_model(base, name, config)
              for name in (BF16, DYNAMIC, STATIC) if name in wanted}
    measured = [name for name in models if name in config.models]
    # decode mode by mode, every model in turn: each mode's rows see one process state (the eager rows come
    # before any torch.compile in the process), so a ratio against bf16 compares like with like
    for mode in modes:
        rows += [_print(r) for r in decode_rows({name: models[name] for name in measured}, mode, config)]
    if "prefill" in sections:
        rows += [_print(prefill_row(models[name], name, config)) for name in measured]
    for name in (BF16, DYNAMIC, STATIC):
        if name in fidelity:
            rows.append(_print(fidelity_row(models[name], name, config)))
        if name == DYNAMIC and EMULATED in fidelity:
            rows.append(_print(fidelity_row(emulated_model(models[name]), EMULATED, config)))
    del base, models
    if cuda:
        torch.cuda.empty_cache()
    if "projections" in sections:
        rows += [_print(r) for r in projection_rows(config)]
    if "host" in sections:
        rows += [_print(r) for r in host_rows(config)]
    return _with_ratios(rows)


def _print(row: dict) -> dict:
    fields = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
    print(fields, flush=True)
    return row


# -- report ----------------------------------------------------------------------------------------


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    return "" if value is None else format(value, fmt)


def markdown(rows: list[dict]) -> str:
    """The rows as tables (decode, prefill, projections, host, fidelity), in that order, under the run's
    configuration (its ``config`` row)."""
    c = next((r for r in rows if r["section"] == "config"), None)
    lines = []
    if c is not None:
        lines += [f"Model benchmark on {c['device']}: a Llama of {c['layers']} layers, hidden {c['hidden']}, "
                  f"intermediate {c['intermediate']}, {c['heads']} heads, vocabulary {c['vocab']} (random weights), "
                  f"{c['dtype']}, against W8A8 copies (dynamic; static + SmoothQuant) of the linears matching "
                  f"{c['quantized']} (lm_head stays {c['dtype']}).", ""]
    by = {section: [r for r in rows if r["section"] == section]
          for section in ("decode", "prefill", "projections", "host", "fidelity")}
    if by["decode"]:
        lines += ["Decode, one token per step after an eager prefill into a StaticCache (ms per step on the GPU "
                  "timeline, the median of the rounds where the models took turns; x bf16: there, the median of the "
                  "rounds' ratios; spread: (max - min) / median of the rounds; first calls: compile + warm-up + "
                  "capture, wall clock):", "",
                  "| model | mode | batch | ms / step | tokens / s | x bf16 | rounds | spread | first calls s "
                  "| status |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        lines += [f"| {r['model']} | {r['mode']} | {r['batch']} | {_cell(r, 'ms', '.3f')} | "
                  f"{_cell(r, 'tokens_per_s', '.0f')} | {_cell(r, 'speedup_vs_bf16', '.2f')} | "
                  f"{_cell(r, 'rounds', 'd')} | {_cell(r, 'spread', '.0%')} | "
                  f"{_cell(r, 'first_calls_s', '.1f')} | {_status(r)} |" for r in by["decode"]]
    if by["prefill"]:
        lines += ["", "Prefill, eager, logits of the last token:", "",
                  "| model | batch x tokens | ms | tokens / s | x bf16 | status |", "|---|---|---:|---:|---:|---|"]
        lines += [f"| {r['model']} | {r['batch']} x {r['tokens']} | {_cell(r, 'ms', '.2f')} | "
                  f"{_cell(r, 'tokens_per_s', '.0f')} | {_cell(r, 'speedup_vs_bf16', '.2f')} | {_status(r)} |"
                  for r in by["prefill"]]
    if by["projections"]:
        lines += ["", "The seven projections of each layer, all layers in one CUDA graph (GPU ms per replay):", "",
                  "| model | tokens | projections | ms | x bf16 | status |", "|---|---:|---:|---:|---:|---|"]
        lines += [f"| {r['model']} | {r['tokens']} | {r.get('projections', '')} | {_cell(r, 'ms', '.3f')} | "
                  f"{_cell(r, 'speedup_vs_bf16', '.2f')} | {_status(r)} |" for r in by["projections"]]
    if by["host"]:
        lines += ["", "Host time per layer call (behind a GPU busy wait):", "",
                  "| layer | out x in | tokens | us / call | status |", "|---|---|---:|---:|---|"]
        lines += [f"| {r['layer']} | {r.get('shape', '')} | {r['tokens']} | {_cell(r, 'us', '.1f')} | {_status(r)} |"
                  for r in by["host"]]
    if by["fidelity"]:
        lines += ["", "Compiled (torch.compile, default mode) against eager logits, same tokens; then with Inductor "
                  "rounding bf16 intermediates as eager does (emulate_precision_casts):", "",
                  "| model | relative difference | top-1 agreement | relative difference, casts emulated | status |",
                  "|---|---:|---:|---:|---|"]
        lines += [f"| {r['model']} | {_cell(r, 'rel_error', '.3e')} | {_cell(r, 'top1_agreement', '.4f')} | "
                  f"{_cell(r, 'rel_error_emulated_casts', '.3e')} | {_status(r)} |" for r in by["fidelity"]]
    return "\n".join(lines) + "\n"


def _status(row: dict) -> str:
    return row["status"] if row["status"] == "ok" else f"**failed**: {row.get('error', '')}".replace("|", "/")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baracuda_numba.torch.benchmark_model",
                                     description=__doc__.splitlines()[0])
    default = ModelBenchConfig()
    parser.add_argument("--layers", type=int, default=default.layers)
    parser.add_argument("--batches", type=int, nargs="+", default=list(default.batches))
    parser.add_argument("--modes", nargs="+", default=list(default.modes), choices=sorted(MODES))
    parser.add_argument("--sections", nargs="+", default=list(default.sections),
                        choices=["decode", "prefill", "projections", "host", "fidelity"])
    parser.add_argument("--models", nargs="+", default=list(default.models), choices=[BF16, DYNAMIC, STATIC],
                        help="the models of the decode and prefill sections")
    parser.add_argument("--steps", type=int, default=default.steps)
    parser.add_argument("--rounds", type=int, default=default.rounds,
                        help="rounds of the interleaved (host-bound) modes; a row is the median round")
    parser.add_argument("--out", default=None, help="directory for model.json / model.md")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmark_model: needs a CUDA GPU (the tests run a tiny configuration on the CPU)", file=sys.stderr)
        return 2
    config = replace(default, layers=args.layers, batches=tuple(args.batches), modes=tuple(args.modes),
                     sections=tuple(args.sections), models=tuple(args.models), steps=args.steps,
                     rounds=args.rounds)
    rows = run(config)
    device = rows[0]["device"]
    text = markdown(rows)
    print("\n" + text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.md").write_text(text)
        (out / "model.json").write_text(json.dumps({"device": device, "config": repr(config), "rows": rows},
                                                   indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
