"""The modules ``amct.convert`` puts in place of each calibrated Linear (docs/spec/llm.md §5).

- ``WeightOnlyLinear``: int4/int8 codes (one uint8 per code), per-group scales and zero points, an optional
  per-input-channel multiplier (AWQ's ``1/s``). Forward: dequantise, then a float Linear: exactly what
  MatMulNBits computes at accuracy level 0/1 (docs/spec/llm.md §6.2).
- ``W8A8Linear``: int8 weights per output channel, int8 activations (a static scale or one per token),
  an optional SmoothQuant multiplier. Forward: integer codes multiplied in float32 (exact integers up to
  2^24 per partial sum), then rescaled, as ORT's int8 MatMul kernels do.
"""

from __future__ import annotations

import torch
from torch import nn

from amct_engine.llm.group_quant import GroupCodes, dequantize
from amct_engine.llm.smoothquant import QMAX, W8A8Params

ACT_QMIN, ACT_QMAX = -128.0, 127.0  # ONNX QuantizeLinear's int8 range (round half to even, as torch.round)


class WeightOnlyLinear(nn.Module):
    def __init__(self, codes: GroupCodes, bias: torch.Tensor | None, input_multiplier: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.codes.shape
        self.bits, self.group_size, self.symmetric = codes.bits, codes.group_size, codes.symmetric
        self.register_buffer("codes", codes.codes.contiguous())
        self.register_buffer("scales", codes.scales.contiguous())
        self.register_buffer("zero_points", codes.zero_points.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.register_buffer("input_multiplier", None if input_multiplier is None else input_multiplier.float())

    def dequantized_weight(self) -> torch.Tensor:
        return dequantize(self.codes, self.scales, self.zero_points, self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_multiplier is not None:
            x = x * self.input_multiplier
        return nn.functional.linear(x, self.dequantized_weight().to(x.dtype), self.bias)

    def extra_repr(self) -> str:
        kind = "sym" if self.symmetric else "asym"
        return f"in={self.in_features}, out={self.out_features}, int{self.bits} {kind}, group={self.group_size}"


class W8A8Linear(nn.Module):
    def __init__(self, params: W8A8Params, bias: torch.Tensor | None) -> None:
        super().__init__()
        w = params.weight
        self.out_features, self.in_features = w.codes.shape
        # signed int8 codes, (out, in), and one scale per output channel
        self.register_buffer("weight_codes", (w.codes.to(torch.int16) - w.zero_points.to(torch.int16)).to(torch.int8))
        self.register_buffer("weight_scale", w.scales[:, 0].contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.register_buffer("input_multiplier", params.input_multiplier)
        self.input_scale = params.input_scale  # None: per token

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Int8 codes of the (smoothed) input as float, and their scale (scalar or per token)."""
        if self.input_multiplier is not None:
            x = x * self.input_multiplier
        if self.input_scale is not None:
            scale = torch.tensor(self.input_scale, dtype=x.dtype)
        else:
            scale = (x.abs().amax(dim=-1, keepdim=True) / QMAX).clamp(min=1e-8)
        return torch.clamp(torch.round(x / scale), ACT_QMIN, ACT_QMAX), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        q, scale = self.quantize_input(x.float())
        y = nn.functional.linear(q, self.weight_codes.float()) * scale * self.weight_scale
        if self.bias is not None:
            y = y + self.bias
        return y.to(dtype)

    def extra_repr(self) -> str:
        act = "per-token" if self.input_scale is None else f"static {self.input_scale:.3g}"
        return f"in={self.in_features}, out={self.out_features}, W8A8 ({act})"
