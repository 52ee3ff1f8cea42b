"""The activation quantiser of a PTQ calibration model (docs/spec/engine.md §1.6, §4.3, §4.10).

Until its observer (IFMR or HFMG) has seen ``batch_num`` batches the input passes through
unquantised; then the factors are fixed and the input is fake-quantised with them. It offers
what ``QuantRetrainLayer`` asks of an activation quantiser (``bits``, ``calibrated``,
``scale_offset()``), so the calibration model reuses the QAT layer, its record writing and its
export, and the PyTorch model computes what the deploy model computes.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .primitives import fake_quantize


class CalibrationActQuantizer(nn.Module):
    def __init__(self, observer: nn.Module, bits: int) -> None:
        super().__init__()
        self.observer = observer
        self.bits = bits
        self.register_buffer("acts_scale", torch.tensor(math.nan))
        self.register_buffer("acts_offset", torch.tensor(0, dtype=torch.int32))

    @property
    def calibrated(self) -> bool:
        return bool(torch.isfinite(self.acts_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.calibrated:
            if not self.observer(x):
                return x
            with torch.no_grad():
                self.acts_scale.copy_(self.observer.result.scale)
                self.acts_offset.copy_(self.observer.result.offset)
        return fake_quantize(x, self.acts_scale, self.acts_offset, self.bits)

    def scale_offset(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.calibrated:
            raise RuntimeError("the activation has not been calibrated: run batch_num forward batches first")
        return self.acts_scale.detach().float().clone(), self.acts_offset.detach().clone()

    def extra_repr(self) -> str:
        return f"bits={self.bits}, observer={type(self.observer).__name__}"
