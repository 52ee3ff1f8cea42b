"""The calibration module ``amct.quantize`` puts in place of each target Linear (docs/spec/llm.md §4).

It runs the float Linear unchanged and, for the first ``batch_num`` forwards, gathers what its
algorithm needs about the Linear's input ``x`` (all leading dims flattened into tokens):

- GPTQ and AWQ: the input's second moment ``H = sum(x x^T)`` (in x in float32: one Hessian per
  Linear, the only memory that grows with the model) and the token count;
- AWQ also the mean absolute value of each input channel (its activation-aware scale);
- SmoothQuant and W8A8: the maximum absolute value of each input channel.
Min-max weights need nothing but the weight.
"""

from __future__ import annotations

import torch
from torch import nn

from amct_engine.llm.config import LlmQuantConfig


class CalibrationLinear(nn.Module):
    """A target Linear during calibration: ``linear`` is the original module, untouched."""

    def __init__(self, linear: nn.Linear, cfg: LlmQuantConfig, name: str) -> None:
        super().__init__()
        self.linear = linear
        self.cfg = cfg
        self.layer_name = name
        self.batches = 0
        self.tokens = 0
        self.hessian: torch.Tensor | None = None
        self.abs_mean: torch.Tensor | None = None
        self.abs_max: torch.Tensor | None = None

    @property
    def in_features(self) -> int:
        return self.linear.in_features

    @property
    def out_features(self) -> int:
        return self.linear.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batches < self.cfg.batch_num:
            self._observe(x.detach().reshape(-1, x.shape[-1]))
            self.batches += 1
        return self.linear(x)

    @torch.no_grad()
    def _observe(self, x: torch.Tensor) -> None:
        algorithm = self.cfg.algorithm
        if algorithm in ("gptq", "awq"):
            xd = x.float()
            moment = xd.T @ xd
            self.hessian = moment if self.hessian is None else self.hessian + moment
            if algorithm == "awq":
                total = xd.abs().sum(dim=0)
                self.abs_mean = total if self.abs_mean is None else self.abs_mean + total
        if self.cfg.inputs is not None:
            peak = x.abs().amax(dim=0).float()
            self.abs_max = peak if self.abs_max is None else torch.maximum(self.abs_max, peak)
        self.tokens += x.shape[0]

    def mean_hessian(self) -> torch.Tensor:
        """``E[x x^T]`` over the calibration tokens (float32): the layer-output error weight."""
        if self.hessian is None or self.tokens == 0:
            raise RuntimeError(f"{self.layer_name}: no calibration data; run the calibration forward before convert")
        return self.hessian / self.tokens

    def channel_abs_mean(self) -> torch.Tensor:
        if self.abs_mean is None:
            raise RuntimeError(f"{self.layer_name}: no calibration data; run the calibration forward before convert")
        return self.abs_mean / self.tokens

    def channel_abs_max(self) -> torch.Tensor:
        if self.abs_max is None:
            raise RuntimeError(f"{self.layer_name}: no calibration data; run the calibration forward before convert")
        return self.abs_max

    def release(self) -> None:
        """Drop the statistics once the Linear is converted (the memory bound: docs/spec/llm.md §4)."""
        self.hessian = self.abs_mean = self.abs_max = None
