"""The W8A8 recipe in pure PyTorch: the independent reference of :class:`W8A8Linear`, and a stand-in for it
where the kernels cannot run (a CPU, or the simulator at model size).

It computes what the kernels compute (README "Semantics", "W8A8 linear"), bit for bit on finite inputs:

- weights, per output channel: ``s[n] = max(max_k |W[n, k]| / 127, tiny)`` (float32),
  ``wq = clamp(round(W * (1/s)), -127, 127)``;
- activations per token (dynamic): ``s_x[m] = max|x[m]| / 127`` in float32 (1 for an all-zero row,
  at least the smallest normal float; the range ignores NaN and +-inf), or one static ``act_scale``;
  ``xq = clamp(round(x * (1/s_x)), -127, 127)`` (NaN -> 0, +-inf saturate);
- ``acc = xq @ wq.T`` exactly (float64 holds every int32 sum exactly), then the float32 epilogue
  ``(float32(acc) * s_x[m]) * s[n] + bias[n]``, stored in ``x``'s dtype.

The reciprocal and every product are float32 (round half to even), as in the kernels; float64 data is
outside this module (the kernels compute it in float64).
"""

from __future__ import annotations

import torch

from .modules import W8A8Linear, true_quotient

__all__ = ["quantize_weight", "quantize_activation", "w8a8_linear", "EmulatedW8A8Linear"]

_TINY = torch.finfo(torch.float32).tiny


def _quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``clamp(round(x * (1/scale)), -127, 127)`` in float32 (values, not int8: exact in float)."""
    t = torch.round(x * (1.0 / scale))
    return torch.nan_to_num(t, nan=0.0).clamp(-127, 127)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(wq int8 [N, K], s float32 [N])``: per-output-channel symmetric int8 in [-127, 127]."""
    w = weight.detach().float()
    scale = true_quotient(w.abs().amax(dim=1), 127.0).clamp(min=_TINY)
    return _quantize(w, scale[:, None]).to(torch.int8), scale


def quantize_activation(x: torch.Tensor, act_scale: float | torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(xq, s_x)`` for ``x [M, K]``: ``xq`` float32 integer values in [-127, 127]; ``s_x`` ``[M, 1]``
    per token, or the static ``act_scale`` as a float32 scalar tensor."""
    x = x.float()
    if act_scale is None:
        finite = torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype, device=x.device))
        high = finite.abs().amax(dim=-1, keepdim=True) if x.shape[-1] else x.new_zeros(x.shape[0], 1)
        scale = torch.where(high > 0, true_quotient(high, 127.0), torch.ones_like(high)).clamp(min=_TINY)
    else:
        scale = torch.as_tensor(act_scale, dtype=torch.float32, device=x.device)
    return _quantize(x, scale), scale


def w8a8_linear(x: torch.Tensor, weight_q: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None,
                act_scale: float | torch.Tensor | None = None) -> torch.Tensor:
    """``[..., K] -> [..., N]`` in ``x``'s dtype, the W8A8 linear's bits (module docstring)."""
    rows = x.reshape(-1, x.shape[-1])
    xq, scale = quantize_activation(rows, act_scale)
    acc = (xq.double() @ weight_q.double().T).float()
    y = (acc * scale) * weight_scale.float()[None, :]
    if bias is not None:
        y = y + bias.float()[None, :]
    return y.to(x.dtype).reshape(*x.shape[:-1], weight_q.shape[0])


class EmulatedW8A8Linear(W8A8Linear):
    """:class:`W8A8Linear` computed by :func:`w8a8_linear` (same buffers, state dict and checks; no kernel)."""

    @staticmethod
    def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_weight(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return w8a8_linear(x, self.weight_q, self.weight_scale, self.bias, self._act_scale)
