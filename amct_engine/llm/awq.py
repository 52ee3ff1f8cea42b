"""AWQ: activation-aware per-input-channel scales, then per-group clipping (docs/spec/llm.md §3.3;
Lin et al. 2023, "AWQ", section 3.2: scale search and the auto-clip step of its reference code).

Salient input channels (large mean |x|) are scaled up before rounding, ``W' = W diag(s)``, and the
input is scaled down by the same amount, ``x' = x / s``, so the float product is unchanged and the
rounding error falls on the channels that matter less. ``s = mean|x|^alpha`` with ``alpha`` searched on a
grid; then each group's range is shrunk by a searched ratio (clipping outliers). Both searches
minimise the layer-output error ``tr(dW H dW^T)`` with ``H = E[x x^T]`` from the calibration forward,
which is exactly the mean squared output error over the calibration tokens, so no input samples are
kept. ``alpha = 0`` and ratio 1 are on the grids: AWQ never does worse than RTN on that error.

Our scales stay on the Linear (its converted module multiplies the input by ``1/s``; the ONNX file has
that Mul before the MatMulNBits) instead of being folded into the previous norm or Linear.
"""

from __future__ import annotations

import torch

from amct_engine.llm.config import WeightSpec
from amct_engine.llm.group_quant import (
    GroupCodes,
    effective_group_size,
    group_ranges,
    quantize_with_ranges,
    rtn,
    to_groups,
)


def output_error(delta: torch.Tensor, hessian: torch.Tensor) -> torch.Tensor:
    """Mean squared layer-output error of a weight error ``delta`` (out, in): ``tr(delta H delta^T)``."""
    return torch.einsum("oi,oi->", delta @ hessian, delta)


def _search_scale(weight: torch.Tensor, hessian: torch.Tensor, abs_mean: torch.Tensor, spec: WeightSpec, grids: int):
    best, best_err = torch.ones_like(abs_mean), float("inf")
    for step in range(grids):
        alpha = step / grids
        s = abs_mean.clamp(min=1e-4).pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        deq = rtn(weight * s, spec).dequantize() / s
        err = output_error(deq - weight, hessian).item()
        if err < best_err:
            best, best_err = s, err
    return best


def _group_errors(delta: torch.Tensor, hessian: torch.Tensor, group: int) -> torch.Tensor:
    """Output error of each (row, group) alone, with the group's diagonal block of H: (out, groups)."""
    cols = hessian.shape[0]
    pad = -cols % group
    h = torch.nn.functional.pad(hessian, (0, pad, 0, pad))
    n = h.shape[0] // group
    blocks = torch.stack([h[g * group : (g + 1) * group, g * group : (g + 1) * group] for g in range(n)])
    d = to_groups(delta, group)  # (out, groups, group)
    return torch.einsum("ogi,gij,ogj->og", d, blocks, d)


def _search_clip(weight: torch.Tensor, hessian: torch.Tensor, spec: WeightSpec, grids: int) -> GroupCodes:
    """Per (row, group), the range shrink ratio in {1, 1 - 1/2g, ..., 0.5} with the least output error."""
    group = effective_group_size(spec, weight.shape[1])
    per_tensor = spec.strategy == "tensor"
    wmin, wmax = group_ranges(weight, group, per_tensor=per_tensor)
    best_min, best_max = wmin.clone(), wmax.clone()
    best_err = torch.full_like(wmin, float("inf"))
    for step in range(grids):
        ratio = 1.0 - 0.5 * step / grids
        codes = quantize_with_ranges(weight, wmin * ratio, wmax * ratio, spec, group)
        err = _group_errors(codes.dequantize() - weight, hessian, group)
        if per_tensor:
            err = torch.full_like(err, err.sum().item())
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_min, best_max = torch.where(better, wmin * ratio, best_min), torch.where(better, wmax * ratio, best_max)
    return quantize_with_ranges(weight, best_min, best_max, spec, group)


@torch.no_grad()
def awq_quantize(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    abs_mean: torch.Tensor,
    spec: WeightSpec,
    grids_num: int = 20,
    clip_grids: int = 10,
) -> tuple[GroupCodes, torch.Tensor]:
    """AWQ codes of ``weight * s`` and the input multiplier ``1 / s`` (in,)."""
    weight = weight.detach().float()
    s = _search_scale(weight, hessian, abs_mean, spec, grids_num)
    # The scaled layer sees x / s: its Hessian is diag(1/s) H diag(1/s).
    scaled_h = hessian / s.unsqueeze(0) / s.unsqueeze(1)
    return _search_clip(weight * s, scaled_h, spec, clip_grids), 1.0 / s
