"""ULQ weight quantiser: learnable symmetric scale with LSQ gradient scaling (docs/spec/engine.md §4.2)."""

from __future__ import annotations

import math

import torch

from .primitives import (
    FLT_EPSILON,
    broadcast_along_axis0,
    check_quantizable,
    from_cout_major,
    process_scale,
    quant_range,
    to_cout_major,
)
from .weight_quantizer import SymmetricWeightQuantizer


def _scale_view(scale: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return broadcast_along_axis0(scale, weight.dim(), weight.shape[0])


def ulq_weight_scale_grad(weight, grad_output, scale, bits: int) -> torch.Tensor:
    """dL/ds of docs/spec/engine.md §4.2, shaped like `scale` ([Cout] or [1]).

    dW^/ds is round(w~)-w~ inside the range, Qn below, Qp above; it is scaled by 1/sqrt(N*Qp), N =
    elements sharing one scale (a channel, or the whole tensor), and summed with g.
    """
    qn, qp = quant_range(bits)
    w = weight.to(torch.float32)
    s = _scale_view(scale, weight)
    ratio = w / s
    inside = torch.round(ratio) - ratio
    dq_ds = torch.where(w > s * qp, float(qp), torch.where(w < s * qn, float(qn), inside))
    shared = weight.numel() // scale.numel()
    terms = dq_ds * grad_output.to(torch.float32) / math.sqrt(shared * qp)
    return terms.reshape(scale.numel(), -1).sum(dim=1).reshape(scale.shape)


def effective_scale(scale: torch.Tensor) -> torch.Tensor:
    """|s|, at least FLT_EPSILON: the scale the forward quantises with and the record holds (docs/spec/engine.md §4.6).

    A learnt scale can step through zero (Adam moves it by ~lr per step; a conv followed by BN does
    not care about its channel's magnitude, so nothing pulls the scale back). The record always held
    |s|; the forward must use the same value, or eval (= deploy) computes a different layer than
    training did: clamping a negative scale to epsilon instead zeroed the channel during training
    while the record kept |s|, and one such channel in conv1 took an A8W4 model from 0.89 to 0.44.
    """
    return scale.detach().to(torch.float32).abs().clamp_min(FLT_EPSILON)


class UlqWeightFunction(torch.autograd.Function):
    """W^ = clamp(round(W/|s|), Qn, Qp)*|s|; dL/dW = g (plain STE), dL/ds per `ulq_weight_scale_grad`."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, scale: torch.Tensor, bits: int):
        qn, qp = quant_range(bits)
        s = effective_scale(scale)
        s_view = _scale_view(s, weight)
        quantized = torch.clamp(torch.round(weight.to(torch.float32) / s_view), qn, qp) * s_view
        ctx.save_for_backward(weight, s, scale.detach())
        ctx.bits = bits
        return quantized.to(weight.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        weight, s, scale = ctx.saved_tensors
        grad_abs = ulq_weight_scale_grad(weight, grad_output, s, ctx.bits)
        # d|s|/ds = sign(s); a scale of exactly 0 counts as positive.
        sign = torch.where(scale < 0, -1.0, 1.0).to(grad_abs.dtype)
        return grad_output, (grad_abs * sign).to(scale.dtype), None


class UlqWeightQuantizer(SymmetricWeightQuantizer):
    """`ulq_retrain` weight quantiser (docs/spec/engine.md §4.2): learnable `wts_scales`, `wts_offsets` zeros.

    The scale is initialised on the first forward (s = max|W|/Qp per channel or per tensor); a
    loaded checkpoint with finite scales counts as initialised.
    """

    learnable_scale = True

    def __init__(self, bits: int = 8, channel_wise: bool = True, num_channels: int | None = None) -> None:
        super().__init__(bits, channel_wise, num_channels)
        self._initialized = False

    @property
    def initialized(self) -> bool:
        return self._initialized

    def forward(self, weight: torch.Tensor, transpose_groups: int | None = None) -> torch.Tensor:
        """Fake-quantised `weight`; pass the module's `groups` as `transpose_groups` for ConvTranspose."""
        check_quantizable(weight, "weight")
        weight_cm = to_cout_major(weight, transpose_groups)
        if not self._initialized:
            self._arq_init(weight_cm)
        quantized = UlqWeightFunction.apply(weight_cm, self.wts_scales, self.bits)
        return from_cout_major(quantized, transpose_groups, weight.shape)

    def scale_offset(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The scale the forward uses (clamped positive, float32) and the int32 zero offsets."""
        if not self._initialized:
            raise RuntimeError("the weight quantiser has no scale yet: run a forward pass first")
        return effective_scale(self.wts_scales).clone(), self.wts_offsets.detach().clone()

    @torch.no_grad()
    def _arq_init(self, weight_cm: torch.Tensor) -> None:
        # docs/spec/engine.md §4.2: ARQ initialisation s = max|W|/Qp; an all-zero channel gets s = 1 (process_scale).
        _, qp = quant_range(self.bits)
        rows = weight_cm.shape[0] if self.channel_wise else 1
        abs_max = weight_cm.detach().reshape(rows, -1).abs().amax(dim=1).to(torch.float32)
        scale, _ = process_scale(abs_max / qp, torch.zeros_like(abs_max), self.bits, asymmetric=False)
        self._set_scale(scale)
        self._initialized = True

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if prefix + "wts_scales" in state_dict:
            self._initialized = bool(torch.isfinite(self.wts_scales).all())
