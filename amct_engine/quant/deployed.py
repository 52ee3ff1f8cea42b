"""What a quantised layer computes once deployed: BN folded, integer weight codes, int32 bias.

The integer-domain math shared by the QAT layer's eval forward (`QuantRetrainLayer`) and every
export back end (`amct_engine.export`), derived from the record's factors (docs/spec/engine.md
docs/spec/engine.md §4.0, §5). Export imports this module; nothing here imports export.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from amct_engine.layers import behaviour_of
from amct_engine.quant.primitives import quant_range
from amct_engine.record import LayerQuantRecord

INT32_MAX = 2**31 - 1


def fold_batch_norm(layer: nn.Module, bn: nn.Module | None, weight: torch.Tensor | None = None) -> nn.Module:
    """A copy of `layer` with the eval-mode BN that follows it folded into weight and bias.

    `weight` replaces the layer's own weight first (the weight its quantiser reads, e.g. 4:2-masked).
    """
    folded = copy.deepcopy(layer)
    if weight is not None:
        with torch.no_grad():
            folded.weight.copy_(weight)
    if bn is None:
        return folded
    factor = bn.running_var.new_ones(bn.running_var.shape) if bn.weight is None else bn.weight.detach()
    factor = factor / torch.sqrt(bn.running_var + bn.eps)
    beta = bn.bias.detach() if bn.bias is not None else torch.zeros_like(factor)
    bias = folded.bias.detach() if folded.bias is not None else torch.zeros_like(factor)
    with torch.no_grad():
        weight = folded.weight.detach() * behaviour_of(folded).per_out_channel(factor, folded)
        folded.weight = nn.Parameter(weight)
        folded.bias = nn.Parameter((bias - bn.running_mean) * factor + beta)
    return folded


@dataclass(frozen=True)
class QuantFactors:
    """What a deployed layer computes with, derived once from the record (docs/spec/engine.md §4.0, §5)."""

    scale_d: float
    offset_d: int
    act_bits: int
    wts_bits: int
    scale_w: torch.Tensor  # [Cout] or [1], float32
    weight_q: torch.Tensor  # integer codes of the (BN-folded) weight, int8
    bias_q: torch.Tensor | None  # int32 bias of the integer kernels, or None


def narrowed(scale_w: torch.Tensor, record_bits: int, bits: int) -> torch.Tensor:
    """The weight scale that maps the record's clip range onto `bits`-bit codes: the largest code of
    `record_bits` (127) and of `bits` (63 for 7) stand for the same weight (docs/spec/engine.md §5, "Weight
    codes of the deploy model": 7-bit codes keep AVX2's u8s8 pair sums in int16)."""
    return scale_w * (((1 << (record_bits - 1)) - 1) / ((1 << (bits - 1)) - 1))


def compute_factors(name: str, layer: nn.Module, record: LayerQuantRecord, max_wts_bits: int = 8) -> QuantFactors:
    """Integer weight and bias of a BN-folded layer under the record's factors; weight codes of more than
    `max_wts_bits` bits (a deploy target's `weight_bits`) are narrowed to that width (`narrowed`)."""
    weight = layer.weight.detach().float()
    scale_w = torch.tensor(record.scale_w, dtype=torch.float32, device=weight.device)
    wts_bits = min(record.wts_bits, max_wts_bits)
    if wts_bits < record.wts_bits:
        scale_w = narrowed(scale_w, record.wts_bits, wts_bits)
    qn, qp = -(1 << (wts_bits - 1)), (1 << (wts_bits - 1)) - 1
    weight_scale = behaviour_of(layer).per_out_channel(scale_w, layer)
    weight_q = torch.clamp(torch.round(weight / weight_scale), qn, qp)
    bias_q = None
    if layer.bias is not None:
        # docs/spec/engine.md §5 InsertBiasQuant: q_b = round(b / (scale_w * scale_d)), must fit int32.
        bias_q = torch.round(layer.bias.detach().double() / (scale_w.double() * record.scale_d))
        if bias_q.abs().max() > INT32_MAX:
            raise RuntimeError(
                f"layer {name}: quantised bias overflows int32 (scale_w*scale_d too small); add it to quant_skip_layers"
            )
        bias_q = bias_q.to(torch.int32)
    return QuantFactors(
        scale_d=record.scale_d,
        offset_d=record.offset_d,
        act_bits=record.act_bits,
        wts_bits=wts_bits,
        scale_w=scale_w,
        weight_q=weight_q.to(torch.int8),
        bias_q=bias_q,
    )


def quantized_input(x: torch.Tensor, f: QuantFactors) -> torch.Tensor:
    """Integer-valued floats q - offset_d, with q = clamp(round(x / scale_d) + offset_d): the same
    division and rounding as ONNX QuantizeLinear (checked against onnxruntime)."""
    qn, qp = quant_range(f.act_bits)
    return torch.clamp(torch.round(x / f.scale_d) + f.offset_d, qn, qp) - f.offset_d


def deployed_forward(layer: nn.Module, f: QuantFactors, x: torch.Tensor) -> torch.Tensor:
    """What the deployed layer computes, in the integer domain: quantised input codes, integer
    weight codes, int32 bias, then one rescale by scale_w * scale_d (AscendDequant, docs/spec/engine.md §5).

    Sums of integer-valued float32 products are exact (below 2**24), so the QAT model's eval forward,
    the fake-quant ONNX and the Ascend reference compute bit-identical outputs, not just close ones.
    """
    behaviour = behaviour_of(layer)
    bias = None if f.bias_q is None else f.bias_q.float()
    acc = behaviour.call(layer, quantized_input(x, f), f.weight_q.float(), bias)
    deq = (f.scale_w * f.scale_d).float()
    return acc * deq.reshape(behaviour.output_channel_shape(deq.numel(), acc.dim()))
