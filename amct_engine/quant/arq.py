"""ARQ weight quantiser: symmetric scale recomputed from the current weights every step (docs/spec/engine.md §4.2)."""

from __future__ import annotations

import torch

from .primitives import (
    check_quantizable,
    fake_quantize,
    from_cout_major,
    process_scale,
    symmetric_scale,
    to_cout_major,
)
from .weight_quantizer import SymmetricWeightQuantizer


def arq_scale(weight_cm: torch.Tensor, bits: int, channel_wise: bool) -> torch.Tensor:
    """Symmetric scale per row of W reshaped to [Cout, -1], or per tensor ([1]) (docs/spec/engine.md §4.0, §4.2)."""
    rows = weight_cm.shape[0] if channel_wise else 1
    w_min, w_max = torch.aminmax(weight_cm.detach().reshape(rows, -1).to(torch.float32), dim=1)
    scale = symmetric_scale(w_max, w_min, bits)
    scale, _ = process_scale(scale, torch.zeros_like(scale), bits, asymmetric=False)
    return scale


class ArqWeightFunction(torch.autograd.Function):
    """Fake quantisation (offset 0) with the straight-through estimator dL/dW = g (docs/spec/engine.md §4.2)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, scale: torch.Tensor, bits: int):
        return fake_quantize(weight, scale, torch.zeros_like(scale), bits)

    @staticmethod
    def backward(ctx, grad_output):
        # The scale is recomputed from the weights each step and gets no gradient.
        return grad_output, None, None


class ArqWeightQuantizer(SymmetricWeightQuantizer):
    """`arq_retrain` / `arq_distill` weight quantiser (docs/spec/engine.md §4.2).

    `wts_scales` (float32 buffer) / `wts_offsets` (int32 zeros) hold the factors of the last forward.
    """

    def forward(self, weight: torch.Tensor, transpose_groups: int | None = None) -> torch.Tensor:
        """Fake-quantised `weight`; pass the module's `groups` as `transpose_groups` for ConvTranspose."""
        check_quantizable(weight, "weight")
        weight_cm = to_cout_major(weight, transpose_groups)
        scale = arq_scale(weight_cm, self.bits, self.channel_wise)
        self._set_scale(scale)
        quantized = ArqWeightFunction.apply(weight_cm, scale, self.bits)
        return from_cout_major(quantized, transpose_groups, weight.shape)

    def scale_offset(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Factors of the last forward: (scale float32, offset int32)."""
        if not bool(torch.isfinite(self.wts_scales).all()):
            raise RuntimeError("the weight quantiser has no scale yet: run a forward pass first")
        return self.wts_scales.detach().float().clone(), self.wts_offsets.detach().clone()
