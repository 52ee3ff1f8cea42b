"""The one interface every weight quantiser implements (docs/spec/engine.md §4.2).

`QuantRetrainLayer` and its record entry use nothing else: the layer calls `forward` with the
layer's weight, builds its eval (= deploy) layer from `weight_to_quantize`, and records
`scale_offset()`, `bits` and `channel_wise`. The classes named in `amct_engine.quant.registry`
(`WEIGHT_QUANTIZERS`) subclass it and take ``(bits=, channel_wise=, num_channels=)``.
"""

from __future__ import annotations

import abc
import math

import torch
from torch import nn

from amct_engine.quant.primitives import match_state_shapes, quant_range


class WeightQuantizer(nn.Module, abc.ABC):
    """Fake-quantises a layer's weight; its factors go to the record (docs/spec/engine.md §4.6)."""

    @abc.abstractmethod
    def forward(self, weight: torch.Tensor, transpose_groups: int | None = None) -> torch.Tensor:
        """Fake-quantised `weight`; `transpose_groups` is the module's `groups` for ConvTranspose
        (its weight is [Cin, Cout/groups, k...], so output channels are not axis 0)."""

    @abc.abstractmethod
    def scale_offset(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The factors of the last forward: (scale float32, offset int32), [Cout] or [1]."""

    @property
    @abc.abstractmethod
    def bits(self) -> int:
        """Weight bit width (4, 8 or 16)."""

    @property
    @abc.abstractmethod
    def channel_wise(self) -> bool:
        """One scale per output channel (True) or one per tensor."""

    def weight_to_quantize(self, weight: torch.Tensor) -> torch.Tensor:
        """The float weight `forward` quantises, without side effects: the deployed layer is built
        from it. The layer's own weight, unless a wrapper changes it first (the 4:2 mask)."""
        return weight


class SymmetricWeightQuantizer(WeightQuantizer):
    """State shared by ARQ and ULQ: symmetric scales `wts_scales` (float32) and zero offsets
    `wts_offsets` (int32), AMCT's attribute names, shaped [Cout] when channel-wise, else [1].

    Without `num_channels` the factors are sized by the first forward (or by `load_state_dict`).
    `learnable_scale` makes `wts_scales` a Parameter (ULQ) instead of a buffer (ARQ).
    """

    learnable_scale = False

    def __init__(self, bits: int = 8, channel_wise: bool = True, num_channels: int | None = None) -> None:
        super().__init__()
        quant_range(bits)  # rejects unsupported widths here, not at the first forward
        self._bits = bits
        self._channel_wise = channel_wise
        count = num_channels if channel_wise and num_channels else 1
        scales = torch.full((count,), math.nan)
        if self.learnable_scale:
            self.wts_scales = nn.Parameter(scales)
        else:
            self.register_buffer("wts_scales", scales)
        self.register_buffer("wts_offsets", torch.zeros(count, dtype=torch.int32))

    @property
    def bits(self) -> int:
        return self._bits

    @property
    def channel_wise(self) -> bool:
        return self._channel_wise

    def extra_repr(self) -> str:
        return f"bits={self.bits}, channel_wise={self.channel_wise}"

    @torch.no_grad()
    def _set_scale(self, scale: torch.Tensor) -> None:
        """Store `scale` (and zero offsets), resizing both when the channel count was unknown."""
        if self.wts_scales.shape != scale.shape:
            self.wts_scales.data = torch.empty_like(scale, dtype=self.wts_scales.dtype)
            self.wts_offsets.data = torch.zeros(scale.shape, dtype=torch.int32, device=scale.device)
        self.wts_scales.copy_(scale)
        self.wts_offsets.zero_()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        match_state_shapes(self, state_dict, prefix, ("wts_scales", "wts_offsets"))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
