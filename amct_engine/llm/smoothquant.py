"""SmoothQuant W8A8: move activation outliers into the weights, then int8 both (docs/spec/llm.md §3.4;
Xiao et al. 2023, "SmoothQuant", section 4, eq. 4).

Per input channel ``j``: ``s_j = max|X_j|^a / max|W_j|^(1-a)`` with the smoothing strength ``a``;
``x' = x / s`` and ``W' = W diag(s)`` keep the float product. Weights: int8 symmetric per output channel
(or per tensor); activations: int8 symmetric, one static scale ``max|x'| / 127`` from the calibration
forward ('tensor') or one scale per token at run time ('token'). With 'minmax' W8A8 ``s = 1``.

The per-tensor maximum of ``x'`` is ``max_j(max|X_j| / s_j)``, so the per-channel maxima are enough.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from amct_engine.llm.config import LlmQuantConfig
from amct_engine.llm.group_quant import GroupCodes, rtn

QMAX = 127.0


@dataclass
class W8A8Params:
    weight: GroupCodes  # int8 symmetric, one group per row
    input_multiplier: torch.Tensor | None  # 1 / s, (in,); None without smoothing
    input_scale: float | None  # static activation scale; None for per-token


@torch.no_grad()
def smoothquant_params(weight: torch.Tensor, abs_max: torch.Tensor, cfg: LlmQuantConfig) -> W8A8Params:
    weight = weight.detach().float()
    if cfg.algorithm == "smoothquant":
        strength = float(cfg.params["smooth_strength"])
        w_max = weight.abs().amax(dim=0).clamp(min=1e-5)
        s = (abs_max.clamp(min=1e-5).pow(strength) / w_max.pow(1 - strength)).clamp(min=1e-5)
    else:
        s = torch.ones_like(abs_max)
    codes = rtn(weight * s, cfg.weights)
    assert cfg.inputs is not None
    static = None
    if cfg.inputs.strategy == "tensor":
        static = max(float((abs_max / s).max()), 1e-8) / QMAX
    return W8A8Params(codes, None if cfg.algorithm != "smoothquant" else 1.0 / s, static)
