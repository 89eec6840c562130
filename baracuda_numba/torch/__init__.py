"""PyTorch layer: custom ops, autograd, quantization modules and model conversion.

Importing this subpackage imports torch (``pip install baracuda-numba[torch]``); ``import
baracuda_numba`` alone never does. ``import torch`` inside it is absolute and resolves to PyTorch.

- :mod:`.ops`: every dispatch function as ``torch.ops.baracuda.<name>`` with fake implementations
  (``torch.compile(fullgraph=True)``) and autograd for the fake-quantize ops.
- :mod:`.modules`: :class:`FakeQuantize` (QAT, min-max / moving-average observers) and
  :class:`W8A8Linear` (``from_float(nn.Linear)``; dynamic per-token or static SmoothQuant activations).
- :mod:`.convert`: :func:`calibrate`, :func:`smooth`, :func:`quantize_model` (calibrate, smooth
  and swap ``nn.Linear`` for ``W8A8Linear`` in one call with a :class:`QuantizeConfig`).
- :mod:`.qat`: :class:`FakeQuantLinear` and :func:`prepare_qat` for quantization-aware training;
  :func:`compare_logits` (relative error, top-1 agreement).
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError("baracuda_numba.torch needs PyTorch: pip install 'baracuda-numba[torch]'") from error

from . import ops
from .convert import QuantizeConfig, calibrate, quantize_model, smooth
from .modules import FakeQuantize, W8A8Linear
from .qat import FakeQuantLinear, compare_logits, prepare_qat

__all__ = ["ops", "FakeQuantize", "W8A8Linear", "QuantizeConfig", "calibrate", "smooth", "quantize_model",
           "FakeQuantLinear", "prepare_qat", "compare_logits"]
