"""ARQ weight quantiser: symmetric scale recomputed from the current weights every step (spec §4.2)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .primitives import (
    check_quantizable,
    fake_quantize,
    from_cout_major,
    match_state_shapes,
    process_scale,
    quant_range,
    symmetric_scale,
    to_cout_major,
)


def arq_scale(weight_cm: torch.Tensor, bits: int, channel_wise: bool) -> torch.Tensor:
    """Symmetric scale per row of W reshaped to [Cout, -1], or per tensor ([1]) (spec §4.0, §4.2)."""
    rows = weight_cm.shape[0] if channel_wise else 1
    w_min, w_max = torch.aminmax(weight_cm.detach().reshape(rows, -1).to(torch.float32), dim=1)
    scale = symmetric_scale(w_max, w_min, bits)
    scale, _ = process_scale(scale, torch.zeros_like(scale), bits, asymmetric=False)
    return scale


class ArqWeightFunction(torch.autograd.Function):
    """Fake quantisation (offset 0) with the straight-through estimator dL/dW = g (spec §4.2)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, scale: torch.Tensor, bits: int):
        return fake_quantize(weight, scale, torch.zeros_like(scale), bits)

    @staticmethod
    def backward(ctx, grad_output):
        # The scale is recomputed from the weights each step and gets no gradient.
        return grad_output, None, None


class ArqWeightQuantizer(nn.Module):
    """`arq_retrain` / `arq_distill` weight quantiser (spec §4.2).

    `wts_scales` (float32) / `wts_offsets` (int32 zeros) hold the factors of the last forward, shape
    [Cout] when channel-wise, else [1]. Without `num_channels` they are sized by the first forward
    (or by `load_state_dict`).
    """

    def __init__(self, bits: int = 8, channel_wise: bool = True, num_channels: int | None = None) -> None:
        super().__init__()
        quant_range(bits)
        self.bits = bits
        self.channel_wise = channel_wise
        count = num_channels if channel_wise and num_channels else 1
        self.register_buffer("wts_scales", torch.full((count,), math.nan))
        self.register_buffer("wts_offsets", torch.zeros(count, dtype=torch.int32))

    def forward(self, weight: torch.Tensor, transpose_groups: int | None = None) -> torch.Tensor:
        """Fake-quantised `weight`; pass the module's `groups` as `transpose_groups` for ConvTranspose."""
        check_quantizable(weight, "weight")
        weight_cm = to_cout_major(weight, transpose_groups)
        scale = arq_scale(weight_cm, self.bits, self.channel_wise)
        self._store(scale)
        quantized = ArqWeightFunction.apply(weight_cm, scale, self.bits)
        return from_cout_major(quantized, transpose_groups, weight.shape)

    def scale_offset(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Factors of the last forward: (scale float32, offset int32)."""
        if not bool(torch.isfinite(self.wts_scales).all()):
            raise RuntimeError("the weight quantiser has no scale yet: run a forward pass first")
        return self.wts_scales.detach().float().clone(), self.wts_offsets.detach().clone()

    def extra_repr(self) -> str:
        return f"bits={self.bits}, channel_wise={self.channel_wise}"

    @torch.no_grad()
    def _store(self, scale: torch.Tensor) -> None:
        if self.wts_scales.shape != scale.shape:
            self.wts_scales.data = torch.empty_like(scale, dtype=self.wts_scales.dtype)
            self.wts_offsets.data = torch.zeros(scale.shape, dtype=torch.int32, device=scale.device)
        self.wts_scales.copy_(scale)
        self.wts_offsets.zero_()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        match_state_shapes(self, state_dict, prefix, ("wts_scales", "wts_offsets"))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
