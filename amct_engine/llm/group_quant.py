"""Round-to-nearest integer weights per tensor, per output channel or per group (docs/spec/llm.md §3.1).

Layout: a Linear weight ``W`` is ``(out, in)``; a group is ``group_size`` consecutive input columns of
one output row, the layout ONNX Runtime's MatMulNBits reads (one block per output column of ``B = W.T``).
Codes are unsigned, ``[0, 2**bits - 1]``, with a zero point per group: symmetric weights use the fixed
zero point ``2**(bits-1)`` (MatMulNBits' default when the file stores none), so one dequantisation
``(code - zero_point) * scale`` serves both kinds and the export copies the codes as they are.

Ranges always include 0 (``min <= 0 <= max``): an exact zero survives, and the zero padding of a partial
last group (``in % group_size != 0``) changes no group's scale. With float zero points (asymmetric only, the
form of ORT's HQQ files) a group's codes span exactly ``[min, max]`` and its zero point ``-min / scale`` is not
rounded: weights that already lie on such a grid (a Q4_1 GGUF model's) come back exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from amct_engine.llm.config import WeightSpec

EPS = 1e-10


@dataclass
class GroupCodes:
    """A quantised weight: ``codes`` (out, in) uint8, ``scales`` (out, groups) float32, ``zero_points``
    (out, groups) uint8 (float32 for float zero points), groups of ``group_size`` input columns (the last one
    may be partial)."""

    codes: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor
    group_size: int
    bits: int
    symmetric: bool

    def dequantize(self) -> torch.Tensor:
        return dequantize(self.codes, self.scales, self.zero_points, self.group_size)


def effective_group_size(spec: WeightSpec, in_features: int) -> int:
    """Columns per group: the configured size, or the whole row for 'channel' and 'tensor'."""
    return spec.group_size if spec.strategy == "group" and spec.group_size else in_features


def to_groups(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """``(out, in)`` -> ``(out, groups, group_size)``, the last group padded with zeros."""
    out, cols = weight.shape
    pad = -cols % group_size
    if pad:
        weight = torch.nn.functional.pad(weight, (0, pad))
    return weight.reshape(out, -1, group_size)


def expand(per_group: torch.Tensor, group_size: int, cols: int) -> torch.Tensor:
    """``(out, groups)`` -> ``(out, cols)``: each group's value repeated over its columns."""
    return per_group.repeat_interleave(group_size, dim=1)[:, :cols]


def qparams(
    wmin: torch.Tensor, wmax: torch.Tensor, bits: int, symmetric: bool, float_zero: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and unsigned zero point for ranges ``[wmin, wmax]`` (any shape, zero included).

    Symmetric: ``scale = absmax / (2**(bits-1) - 1)``, codes ``zero_point ± (2**(bits-1) - 1)`` (the
    lowest code stays unused, so the grid is symmetric). Asymmetric: the ``2**bits`` codes span
    ``[wmin, wmax]`` and the zero point is the code of 0; ``float_zero``: the range as given (0 need not be
    in it) and the zero point ``-wmin / scale`` unrounded."""
    if float_zero:
        scale = (wmax - wmin).clamp(min=EPS) / (2**bits - 1)
        return scale, -wmin / scale
    wmin = torch.clamp(wmin, max=0.0)
    wmax = torch.clamp(wmax, min=0.0)
    half = 2 ** (bits - 1)
    if symmetric:
        scale = torch.maximum(-wmin, wmax).clamp(min=EPS) / (half - 1)
        return scale, torch.full_like(scale, float(half))
    scale = (wmax - wmin).clamp(min=EPS) / (2**bits - 1)
    zero = torch.clamp(torch.round(-wmin / scale), 0, 2**bits - 1)
    return scale, zero


def quantize_codes(
    weight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int, float_zero: bool = False
) -> torch.Tensor:
    """Unsigned codes of ``weight`` on the grid ``(code - zero) * scale`` (broadcast shapes), as float;
    ``float_zero``: the zero points are not integers, so they are added before rounding."""
    if float_zero:
        return torch.clamp(torch.round(weight / scale + zero), 0, 2**bits - 1)
    return torch.clamp(torch.round(weight / scale) + zero, 0, 2**bits - 1)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor, group_size: int) -> torch.Tensor:
    """``(codes - zero_point) * scale`` per group, ``(out, in)`` float32."""
    cols = codes.shape[1]
    zero = expand(zero_points.float(), group_size, cols)
    return (codes.float() - zero) * expand(scales, group_size, cols)


def group_ranges(weight: torch.Tensor, group_size: int, per_tensor: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-(row, group) min and max of ``weight`` ``(out, groups)``; one range for all with ``per_tensor``."""
    grouped = to_groups(weight, group_size)
    wmin, wmax = grouped.amin(dim=2), grouped.amax(dim=2)
    if per_tensor:
        wmin, wmax = torch.full_like(wmin, wmin.min().item()), torch.full_like(wmax, wmax.max().item())
    return wmin, wmax


def quantize_with_ranges(
    weight: torch.Tensor, wmin: torch.Tensor, wmax: torch.Tensor, spec: WeightSpec, group_size: int
) -> GroupCodes:
    """Codes of ``weight`` with the given per-group ranges (clipping: ranges narrower than the weight's)."""
    scale, zero = qparams(wmin, wmax, spec.bits, spec.symmetric, spec.float_zero_point)
    cols = weight.shape[1]
    zeros = expand(zero, group_size, cols)
    codes = quantize_codes(weight, expand(scale, group_size, cols), zeros, spec.bits, spec.float_zero_point)
    return GroupCodes(
        codes.to(torch.uint8), scale.float(), zero_point_storage(zero, spec), group_size, spec.bits, spec.symmetric
    )


def zero_point_storage(zero: torch.Tensor, spec: WeightSpec) -> torch.Tensor:
    """Zero points as stored: uint8 codes, or float32 with ``float_zero_point``."""
    return zero.float() if spec.float_zero_point else zero.to(torch.uint8)


def rtn(weight: torch.Tensor, spec: WeightSpec) -> GroupCodes:
    """Round-to-nearest with min-max ranges (AMCT's 'minmax' weights)."""
    weight = weight.detach().float()
    group_size = effective_group_size(spec, weight.shape[1])
    wmin, wmax = group_ranges(weight, group_size, per_tensor=spec.strategy == "tensor")
    return quantize_with_ranges(weight, wmin, wmax, spec, group_size)
