"""Quantization-aware training: ``nn.Linear`` with fake-quantized weights and inputs, and the swap."""

from __future__ import annotations

import torch
from torch import nn

from .convert import QuantizeConfig, _set_module
from .modules import FakeQuantize

__all__ = ["FakeQuantLinear", "prepare_qat", "compare_logits"]


class FakeQuantLinear(nn.Linear):
    """``nn.Linear`` whose weight (per output channel, symmetric int8 [-127, 127], min-max) and input
    (per tensor, symmetric int8, moving average) pass through :class:`FakeQuantize` in ``forward``:
    the W8A8 numerics seen during training, with straight-through gradients. Each fake quantize is one
    kernel forward and one backward (:func:`baracuda_numba.fake_quantize_per_channel`, the whole input
    as one channel), after a one-pass range reduction when observing."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.weight_fake_quant = FakeQuantize(granularity="per_channel", ch_axis=0, observer="minmax",
                                              q_min=-127, q_max=127, num_channels=out_features).to(device)
        self.input_fake_quant = FakeQuantize(observer="moving_average", q_min=-127, q_max=127).to(device)

    @classmethod
    def from_float(cls, linear: nn.Linear) -> FakeQuantLinear:
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, device=linear.weight.device,
                     dtype=linear.weight.dtype)
        module.load_state_dict(linear.state_dict(), strict=False)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.input_fake_quant(x), self.weight_fake_quant(self.weight), self.bias)


def prepare_qat(model: nn.Module, config: QuantizeConfig | None = None) -> nn.Module:
    """Swap the selected ``nn.Linear`` layers (``config.include`` / ``exclude``) for
    :class:`FakeQuantLinear`, in place; returns ``model``."""
    config = config or QuantizeConfig()
    for name, module in [(n, m) for n, m in model.named_modules()
                         if type(m) is nn.Linear and config.selects(n)]:
        _set_module(model, name, FakeQuantLinear.from_float(module))
    return model


@torch.no_grad()
def compare_logits(reference: torch.Tensor, quantized: torch.Tensor) -> dict[str, float]:
    """``{"rel_error": ||q - r|| / ||r||, "top1_agreement": mean(argmax q == argmax r)}`` over the last axis."""
    reference, quantized = reference.float(), quantized.float()
    return {"rel_error": float((quantized - reference).norm() / reference.norm()),
            "top1_agreement": float((quantized.argmax(-1) == reference.argmax(-1)).float().mean())}
