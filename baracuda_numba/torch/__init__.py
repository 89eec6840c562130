"""PyTorch layer: custom ops, autograd, quantization modules and model conversion.

Importing this subpackage imports torch (``pip install baracuda-numba[torch]``); ``import
baracuda_numba`` alone never does. ``import torch`` inside it is absolute and resolves to PyTorch.

- :mod:`.ops`: every dispatch function as ``torch.ops.baracuda.<name>`` with fake implementations
  (``torch.compile(fullgraph=True)``) and autograd for the fake-quantize ops.
- :mod:`.modules`: :class:`FakeQuantize` (QAT, min-max / moving-average observers) and
  :class:`W8A8Linear` (``from_float(nn.Linear)``; dynamic per-token or static SmoothQuant activations).
- :mod:`.convert`: :func:`calibrate`, :func:`smooth`, :func:`quantize_model` (calibrate, smooth
  and swap ``nn.Linear`` for ``W8A8Linear`` in one call with a :class:`QuantizeConfig`).
- :mod:`.hf`: :class:`BaracudaConfig`, registered with transformers on import: quantize on load
  (``from_pretrained(..., quantization_config=BaracudaConfig())``), ``save_pretrained`` / ``from_pretrained``
  of quantized models.
- :mod:`.groups`: :func:`group_projections`: sibling W8A8 layers that read one input (q / k / v, gate / up)
  computed as one GEMM (:func:`quantize_model` groups them).
- :mod:`.emulate`: the W8A8 recipe in pure PyTorch (the reference; :class:`EmulatedW8A8Linear` for CPUs).
- :mod:`.qat`: :class:`FakeQuantLinear` and :func:`prepare_qat` for quantization-aware training;
  :func:`compare_logits` (relative error, top-1 agreement).
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError("baracuda_numba.torch needs PyTorch: pip install 'baracuda-numba[torch]'") from error

from . import hf, ops
from .convert import QuantizeConfig, calibrate, quantize_model, smooth
from .emulate import EmulatedW8A8Linear
from .groups import ProjectionGroup, group_projections
from .hf import BaracudaConfig
from .modules import FakeQuantize, StateDictMismatch, W8A8Linear
from .qat import FakeQuantLinear, compare_logits, prepare_qat

hf.register()  # transformers (if installed) knows quant_method "baracuda" from here on

__all__ = ["ops", "FakeQuantize", "W8A8Linear", "EmulatedW8A8Linear", "StateDictMismatch", "QuantizeConfig",
           "calibrate", "smooth", "quantize_model", "FakeQuantLinear", "prepare_qat", "compare_logits",
           "BaracudaConfig", "ProjectionGroup", "group_projections"]
